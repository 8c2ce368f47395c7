/*
 * evict.h — eviction policies: which cached copy a budget gives up next.
 *
 * A policy is a table of operations over tensor ids and bytes; it never sees a tensor, a file or
 * the manager. memory.c keeps, per device, the set of copies that may be evicted (cached, not in
 * use, not a home copy, not loading) and asks the policy to pick one of them. The cyclic policy
 * (ferry__evict_cyclic) is the one the manager uses for dense tensors; the policies for units
 * whose use depends on the data (experts, ferry__evict_moe) fill the same table, and one budget
 * is shared between the two kinds by ferry__evict_share_pick.
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
    int version;       /* 1, or 2 with the hooks after ORDER */
    const char *name;
    /* Where candidate C stands in the eviction order: 1 with *ORDER set (the highest order goes
     * first), or 0 when C must not be evicted for a load needed MIN_DIST prepares from now
     * (0: a demand load). */
    int (*order)(void *state, const ferry__evict_cand *c, uint64_t min_dist, uint64_t *order);
    /* version 2, each may be NULL. USED: unit ID (BYTES) was used, LOADED when it was read in for
     * this use; EVICTED: it was given up. A policy that keeps history (frequencies) learns here. */
    void (*used)(void *state, uint32_t id, uint64_t bytes, int loaded);
    void (*evicted)(void *state, uint32_t id, uint64_t bytes);
    /* LOADING: the picks that follow make room for unit ID (until the next LOADING). */
    void (*loading)(void *state, uint32_t id);
} ferry__evict_ops;

typedef struct ferry__evictor {
    const ferry__evict_ops *ops;
    void *state;
} ferry__evictor;

/* The id of the candidate of highest order (of equal orders, the lowest id), or
 * FERRY__SCHED_NONE when no candidate qualifies. */
uint32_t ferry__evict_pick(const ferry__evictor *e, ferry__evict_next_fn next, void *ctx,
                           uint64_t min_dist);

/* Tell E's policy of a use or an eviction (nothing for a version 1 table or a NULL hook). */
void ferry__evict_used(const ferry__evictor *e, uint32_t id, uint64_t bytes, int loaded);
void ferry__evict_evicted(const ferry__evictor *e, uint32_t id, uint64_t bytes);
void ferry__evict_loading(const ferry__evictor *e, uint32_t id);

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

/* ---- policies for units whose use depends on the data (experts) --------------------------- */

typedef enum ferry__moe_kind {
    FERRY__MOE_LRU,  /* least recently used first */
    FERRY__MOE_LFU,  /* least frequently used first, with dynamic aging (LFU-DA): a unit's value
                      * is its use count plus, at its last use, the value of the last unit
                      * evicted, so old counts do not pin a unit that is no longer chosen */
    FERRY__MOE_LRFU, /* lowest combined recency-frequency first: the sum over past uses of
                      * 2^(-LAMBDA x uses of its group since), LAMBDA -> 0 being LFU, large
                      * LAMBDA LRU within each group */
    FERRY__MOE_NEXT, /* lowest estimated value of the next use first: a group steps (a run of
                      * uses of its units) once a period (learned); each step chooses a unit
                      * afresh with G (its uses that were no reuse, over the steps it was not
                      * in the one before), and one of the last step again with R (its rate of
                      * reuse, drawn towards its group's); counts decay by LAMBDA per step.
                      * Value: the probability of its first next use, halved per period until
                      * that use comes (evict_moe.c) */
    FERRY__MOE_COUNT
} ferry__moe_kind;

/* The kind ferry uses for experts, its floor the experts one layer uses for one token, which
 * ends a step and which the shared budget keeps (bench/README.md, "MoE eviction policies on
 * routing traces"). */
#define FERRY__MOE_DEFAULT FERRY__MOE_NEXT
/* LRFU's LAMBDA when given 0, per use of a unit of the same group (a layer's own clock, so that
 * the decay does not depend on how many layers there are) */
#define FERRY__MOE_LAMBDA 0.08
/* NEXT's LAMBDA when given 0, per step of the unit's group */
#define FERRY__MOE_NEXT_LAMBDA (1.0 / 1024)

/* The state of one expert policy over ids 0..n-1, each in a group (its layer). Its clock counts
 * uses (ferry__evict_used); it learns nothing else about the units. */
/* What the NEXT kind learns of one group. */
typedef struct ferry__moe_group {
    uint64_t steps;          /* runs of uses of the group */
    uint64_t start;          /* the policy clock at its last step's first use */
    double period;           /* uses of any unit between two of its steps (decayed mean) */
    double decayed_steps;    /* steps, decayed by LAMBDA per step */
    double reuse, chances;   /* units of a step used in the next one, and units of steps */
    uint32_t n_step;         /* units of its last step */
} ferry__moe_group;

typedef struct ferry__moe_policy {
    ferry__moe_kind kind;
    size_t n, n_groups;
    const uint32_t *group;   /* per id, < n_groups (the caller's, valid while the policy is) */
    uint32_t floor;          /* units of a group kept while any group holds more than this */
    uint32_t *in_group;      /* per group: units resident (loads minus evictions) */
    uint64_t resident;       /* their sum */
    uint64_t *group_clock;   /* per group: uses of its units */
    uint64_t clock;          /* uses of any unit */
    uint64_t *last;          /* per id: clock of its last use (0: never) */
    uint64_t *group_last;    /* per id: its group's clock at its last use */
    uint32_t loading_group;  /* the group of the unit being loaded (UINT32_MAX: none) */
    double *value;           /* per id: LFU count + aging, or LRFU log2 CRF at LAST */
    uint64_t *uses;          /* per id: uses (LFU), kept over evictions */
    double age;              /* LFU-DA: the value of the last unit evicted */
    double lambda;           /* LRFU: decay per use of a unit of the same group; NEXT: per step */
    uint64_t *step;          /* NEXT, per id: its group's step at its last use */
    double *count;           /* NEXT, per id: uses, decayed to STEP (VALUE: those not reuses) */
    ferry__moe_group *groups; /* NEXT, per group */
    uint32_t last_group;     /* NEXT: the group of the last use (UINT32_MAX: none) */
} ferry__moe_policy;

/* Sets up P for N ids in N_GROUPS groups (GROUP per id; NULL: all in group 0), keeping FLOOR
 * units per group before others (see ferry__evict_moe), LAMBDA for LRFU (0: FERRY__MOE_LAMBDA).
 * Returns 0, or -1 when out of memory or a group is out of range. */
int ferry__moe_policy_init(ferry__moe_policy *p, ferry__moe_kind kind, size_t n,
                           const uint32_t *group, size_t n_groups, uint32_t floor, double lambda);
void ferry__moe_policy_free(ferry__moe_policy *p);
/* Grows P to N ids in N_GROUPS groups (GROUP per id, replacing P's; the new ids unused, the new
 * groups empty); never shrinks. Returns 0, or -1 when out of memory (P unchanged). */
int ferry__moe_policy_grow(ferry__moe_policy *p, size_t n, const uint32_t *group, size_t n_groups);
/* Unit ID holds memory (HELD 1: a load began) or no longer does (0: dropped other than by an
 * eviction, which ferry__evict_evicted reports): the residency per group that the floor reads,
 * for a caller whose loads are not all followed by a use (prefetches). */
void ferry__moe_policy_hold(ferry__moe_policy *p, uint32_t id, int held);
/* The name of KIND ("lru", "lfu", "lrfu", "next"). */
const char *ferry__moe_kind_name(ferry__moe_kind kind);

/* The evictor over P (a version 2 table: the caller reports uses, evictions and loads). Order
 * for NEXT: by its value (lowest first, per byte; of equal values, the lowest id), the floor only
 * ending a step. For the others:
 * first the units of the loading unit's group and of groups holding more than the floor, then
 * the others (a group at its floor gives up units only when no group above it has one left).
 * The floor is P's, or the resident units / groups when that is less (a cache too small to give
 * every group its floor gives each an even part of it). Within each, the units among their
 * group's last FLOOR uses (P's floor: the last token's choice) go after the others, and then by
 * the kind's value (lowest first; of equal values, the lowest id). MIN_DIST is ignored: the
 * future use of an expert is not known. */
ferry__evictor ferry__evict_moe(ferry__moe_policy *p);

/* ---- one budget, two kinds of units ------------------------------------------------------- */

/* One kind of unit under a shared budget: its policy, its candidates, and its bytes. */
typedef struct ferry__evict_kind {
    ferry__evictor policy;
    ferry__evict_next_fn next; /* the kind's evictable units */
    void *ctx;
    uint64_t floor;            /* bytes the kind keeps against the other kind's loads */
    uint64_t share;            /* bytes it holds by right; the shares sum to the budget */
    uint64_t used;             /* bytes it holds now (resident, evictable or not) */
} ferry__evict_kind;

/* The victim for a load of kind LOADING among the N kinds K, and its kind in *FROM. The rule:
 *  - the kinds are tried in order of how far each is over its share (USED - SHARE, most first;
 *    of equal, the loading kind first): a kind that borrowed room another left unused gives it
 *    back when that one needs it, and a kind at or under its share evicts its own units;
 *  - the loading kind may give up any of its candidates; another kind only those whose eviction
 *    leaves it at or above its FLOOR, so neither kind is ever pushed under its floor by the other
 *    (the dense working set; a minimum of expert slots);
 *  - within a kind its own policy chooses (ferry__evict_pick, MIN_DIST passed on).
 * Returns the id, or FERRY__SCHED_NONE when no kind has a candidate that qualifies. At most 8
 * kinds are considered. */
uint32_t ferry__evict_share_pick(const ferry__evict_kind *k, size_t n, size_t loading,
                                 uint64_t min_dist, size_t *from);

#endif
