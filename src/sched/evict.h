/*
 * evict.h — eviction policies: which cached copy a budget gives up next.
 *
 * A policy is a table of operations over tensor ids and bytes; it never sees a tensor, a file or
 * the manager. memory.c keeps, per device, the set of copies that may be evicted (cached, not in
 * use, not a home copy, not loading) and asks the policy to pick one of them. The cyclic policy
 * (ferry__evict_cyclic) is the one the manager uses; another (e.g. for expert routing) plugs in
 * beside it by filling the same table.
 *
 * Not thread-safe: called under the manager's lock.
 */
#ifndef FERRY_EVICT_H
#define FERRY_EVICT_H

#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"

/* One evictable copy, as the policy sees it. */
typedef struct ferry__evict_cand {
    uint32_t id;       /* tensor id (the schedule's numbering) */
    uint64_t bytes;    /* bytes its eviction frees */
    uint64_t age;      /* releases and loads since it was last used (LRU clock distance) */
    int ahead;         /* fetched by a prefetch and not used since */
} ferry__evict_cand;

/* Yields the candidates one by one: fills *C and returns 1, or returns 0 when there are no more. */
typedef int (*ferry__evict_next_fn)(void *ctx, ferry__evict_cand *c);

typedef struct ferry__evict_ops {
    int version;       /* 1 */
    const char *name;
    /* Where candidate C stands in the eviction order: 1 with *ORDER set (the highest order goes
     * first), or 0 when C must not be evicted for a load needed MIN_DIST prepares from now
     * (0: a demand load). */
    int (*order)(void *state, const ferry__evict_cand *c, uint64_t min_dist, uint64_t *order);
} ferry__evict_ops;

typedef struct ferry__evictor {
    const ferry__evict_ops *ops;
    void *state;
} ferry__evictor;

/* The id of the candidate of highest order (of equal orders, the lowest id), or
 * FERRY__SCHED_NONE when no candidate qualifies. */
uint32_t ferry__evict_pick(const ferry__evictor *e, ferry__evict_next_fn next, void *ctx,
                           uint64_t min_dist);

/* The policy for passes that repeat, reading the recorded order S (kept by the caller):
 *  - with a complete schedule, only copies used later than MIN_DIST prepares from now qualify;
 *    copies fetched ahead and not used yet go last, furthest next use first; of the others the
 *    highest ferry__sched_rank goes first (ids the schedule does not hold before all), so the
 *    copies kept are spread evenly over the order;
 *  - while the first schedule is recorded, the same ranks of the positions recorded so far, so
 *    the first pass leaves the set later passes keep (ids not recorded first, least recently
 *    used of them first; copies fetched ahead last);
 *  - otherwise (recording again after the order changed, or no schedule) least recently used;
 *  - in both of these, a prefetch (MIN_DIST > 0) never takes a copy fetched ahead. */
ferry__evictor ferry__evict_cyclic(const ferry__sched *s);

#endif
