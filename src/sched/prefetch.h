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

#endif
