/*
 * prefetch.h — prefetch planning: which tensor ids to bring next, within the window.
 *
 * With a complete schedule the planner walks the recorded order from the cursor and asks the
 * caller, id by id, where that tensor stands; it counts the bytes fetched ahead (queued, loading,
 * or loaded by a prefetch and not used yet) against the window and asks the caller to queue the
 * absent ones. Copies the budget keeps from pass to pass do not count: over a stretch of kept
 * tensors the disk would otherwise idle until the prepares reach the next absent one.
 *
 * Why a window of about one set and not as deep as the budget allows: eviction keeps a fixed part
 * of a cyclic pass cached and streams the rest; a prefetcher running far ahead must evict that
 * part to make room and ends up reading everything every pass.
 *
 * Before a schedule exists (the first pass, or a pass recorded again), the follower
 * (ferry__pf_follow) prefetches in file order: model files store tensors in the order they are
 * computed. It follows the prepares through the ids in file order, as long as each prepared set
 * lies ahead of the last and within what was predicted, and plans as the scheduled planner does
 * from just after it; the first prepare that disagrees stops it until the next recording.
 *
 * Ids and bytes only; not thread-safe (called under the manager's lock).
 */
#ifndef FERRY_PREFETCH_H
#define FERRY_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"

typedef enum ferry__pf_state {
    FERRY__PF_STOP,    /* stop planning (an id the caller does not know) */
    FERRY__PF_SKIP,    /* never prefetched (lazy, ignored, split, removed, ...) */
    FERRY__PF_KEPT,    /* cached and used since it was loaded: outside the window */
    FERRY__PF_AHEAD,   /* fetched ahead or loading: counts against the window */
    FERRY__PF_ABSENT,  /* no copy: counts against the window, and is queued */
} ferry__pf_state;

/* Where ID stands; *BYTES: the bytes it takes (read for AHEAD and ABSENT). */
typedef ferry__pf_state (*ferry__pf_probe_fn)(void *ctx, uint32_t id, uint64_t *bytes);
/* Queues a prefetch of ID, K prepares ahead of the cursor: 1 when queued, 0 when it needed
 * nothing, -1 to stop (it did not fit). */
typedef int (*ferry__pf_queue_fn)(void *ctx, uint32_t id, size_t k);

typedef struct ferry__pf_limits {
    uint64_t window;   /* bytes fetched ahead at most (the last prepared set's bytes) */
    size_t scan;       /* ids looked at, at most */
    unsigned slots;    /* prefetches that may still be queued */
} ferry__pf_limits;

/* Plans the prefetches after the cursor of S (nothing without a complete schedule): queues,
 * in the recorded order, the absent ids while the bytes fetched ahead before them are under
 * the window. Returns the number queued. */
size_t ferry__prefetch_plan(const ferry__sched *s, ferry__pf_limits lim, ferry__pf_probe_fn probe,
                            ferry__pf_queue_fn queue, void *ctx);

/* Follows the prepares through the ids in file order while no schedule is complete. */
typedef struct ferry__pf_follow {
    uint32_t *order;     /* ids in file order (owned) */
    size_t n;            /* entries in order */
    uint32_t *index;     /* per id: its index in order, or FERRY__SCHED_NONE (owned) */
    size_t n_ids;        /* size of index */
    unsigned char *flag; /* per entry: FERRY__PF_PREPARED, FERRY__PF_PASSED (owned) */
    size_t next;         /* the lowest entry neither prepared nor passed: predicted next */
    size_t frontier;     /* one past the last entry the plan reached (queued, ahead, kept) */
    int started;         /* a set was prepared in this recording: next is meaningful */
    int stopped;         /* the prepares disagreed with file order: no plans until reset */
} ferry__pf_follow;

enum {
    FERRY__PF_PREPARED = 1, /* prepared in this recording */
    FERRY__PF_PASSED = 2,   /* never prefetched (FERRY__PF_SKIP): the prediction goes past it */
};

void ferry__pf_follow_init(ferry__pf_follow *fo);
void ferry__pf_follow_free(ferry__pf_follow *fo);
/* Sets the file order: IDS[0..N) (copied), each below N_IDS and none twice (else FERRY_EINVAL,
 * and the follower stays without an order). Resets the follower. 0 or FERRY_ENOMEM. */
int ferry__pf_follow_set_order(ferry__pf_follow *fo, const uint32_t *ids, size_t n, size_t n_ids);
/* Forgets where the prepares stood: the next set starts following again. */
void ferry__pf_follow_reset(ferry__pf_follow *fo);
/* Notes the prepare of the set IDS[0..N) after S recorded it. With S complete or disabled the
 * follower rests (reset). Else the first set of a recording starts it at the set's lowest entry;
 * each later set must lie at or after the predicted entry (or on entries the plan passed) and
 * before the end of what the plan reached (at least as many entries past the predicted one as
 * the set has), none of it prepared already, or the follower stops. Ids not in the file order
 * (split parts) are passed over. */
void ferry__pf_follow_touch(ferry__pf_follow *fo, const ferry__sched *s, const uint32_t *ids,
                            size_t n);
/* Plans prefetches in file order after the predicted entry, as ferry__prefetch_plan does after
 * the cursor (the same window, scan and slots; K counts the entries not yet prepared up to the
 * id). Nothing when S is complete or disabled, or the follower is not started or stopped.
 * Returns the number queued. */
size_t ferry__prefetch_plan_follow(ferry__pf_follow *fo, const ferry__sched *s,
                                   ferry__pf_limits lim, ferry__pf_probe_fn probe,
                                   ferry__pf_queue_fn queue, void *ctx);

#endif
