/*
 * sched.h — the recorded access order (the schedule) and the next-use distances that eviction and
 * prefetch read from it.
 *
 * Inference touches weights in the same order every pass (layer by layer, step by step). The first
 * pass is recorded: each tensor gets the position of its first prepare. When a recorded tensor is
 * prepared again, the pass is complete and the schedule is cyclic; from then on a cursor follows the
 * prepares, and the distance from the cursor to a tensor's position (modulo the pass length) is its
 * next use. When the prepares stop following the recorded order (more than a quarter of a pass's
 * worth of prepares out of order) the schedule is dropped and recorded again. Recording ends
 * when the first recorded tensor comes again; a tensor used several times per pass keeps the
 * position of its first use.
 *
 * Not thread-safe: the manager calls it under its lock. Tensors are numbered 0..n-1.
 */
#ifndef FERRY_SCHED_H
#define FERRY_SCHED_H

#include <stddef.h>
#include <stdint.h>

#define FERRY__SCHED_NONE UINT32_MAX

typedef struct ferry__sched {
    uint32_t *order;     /* tensor ids in recorded order */
    uint32_t *pos;       /* per tensor id: its position in order, or FERRY__SCHED_NONE */
    size_t n_ids;        /* size of pos */
    size_t len;          /* recorded positions */
    int complete;        /* the pass repeated: distances are meaningful */
    size_t cursor;       /* position of the last prepared tensor (complete schedules) */
    uint64_t passes;     /* completed passes (cursor wraps) */
    int irregular;       /* while recording: a tensor other than the first came again */
    size_t misses;       /* out-of-order prepares in the last `seen` prepares */
    size_t seen;         /* prepares counted towards the current pass-length window */
    int enabled;
} ferry__sched;

int ferry__sched_init(ferry__sched *s, size_t n_ids, int enabled);
void ferry__sched_free(ferry__sched *s);
/* Grows the id space (more files opened). */
int ferry__sched_resize(ferry__sched *s, size_t n_ids);
/* Records a prepare of tensor ID. Returns 1 when this prepare started a new pass (the cursor
 * wrapped or recording just completed), 0 otherwise. */
int ferry__sched_touch(ferry__sched *s, uint32_t id);
/* Prepares until tensor ID is used next: 1..len for scheduled tensors (the current one is len, a
 * full cycle away), UINT64_MAX for tensors not in a complete schedule. */
uint64_t ferry__sched_distance(const ferry__sched *s, uint32_t id);
/* The tensor K steps ahead of the cursor (K >= 1), or FERRY__SCHED_NONE without a complete
 * schedule. */
uint32_t ferry__sched_ahead(const ferry__sched *s, size_t k);
/* The order in which the budget gives up ID's cached copy, lowest kept longest: its recorded
 * position with the bits reversed, so that the copies a budget keeps are spread evenly over the
 * order. Defined in a complete schedule and while the first one is being recorded, as long as
 * no tensor but the first has come again; else (and for IDs not recorded) UINT64_MAX. */
uint64_t ferry__sched_rank(const ferry__sched *s, uint32_t id);
/* Forgets the recording (e.g. after a group was removed). */
void ferry__sched_reset(ferry__sched *s);

#endif
