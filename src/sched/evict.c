/*
 * evict.c — choosing the copy to evict (see evict.h), and the cyclic policy.
 *
 * Why a spread kept set rather than furthest-next-use: a pass then alternates cached and
 * streamed tensors, so the disk reads the streamed ones back to back while the cached ones are
 * computed; and with tensors of several sizes and a prefetch window the set Belady keeps drifts
 * from pass to pass (bench/README.md, "eviction").
 */
#include "sched/evict.h"

uint32_t ferry__evict_pick(const ferry__evictor *e, ferry__evict_next_fn next, void *ctx,
                           uint64_t min_dist)
{
    uint32_t best = FERRY__SCHED_NONE;
    uint64_t best_order = 0;
    ferry__evict_cand c;
    while (next(ctx, &c)) {
        uint64_t o;
        if (!e->ops->order(e->state, &c, min_dist, &o))
            continue;
        if (best == FERRY__SCHED_NONE || o > best_order || (o == best_order && c.id < best)) {
            best = c.id;
            best_order = o;
        }
    }
    return best;
}

static int cyclic_order(void *state, const ferry__evict_cand *c, uint64_t min_dist,
                        uint64_t *order)
{
    const ferry__sched *s = state;
    if (s->complete) {
        uint64_t d = ferry__sched_distance(s, c->id);
        if (d <= min_dist)
            return 0;
        if (c->ahead) {
            *order = d;
            return 1;
        }
        /* above every distance; ids the schedule does not hold (rank UINT64_MAX) above all */
        uint64_t r = ferry__sched_rank(s, c->id);
        *order = r == UINT64_MAX ? UINT64_MAX : UINT64_MAX / 2 + r;
        return 1;
    }
    /* Before a schedule, a prefetch (MIN_DIST > 0: one that follows the file order) leaves the
     * copies fetched ahead of it: they come first, and evicting them would read them twice. */
    if (min_dist && c->ahead)
        return 0;
    if (s->enabled && !s->passes && !s->irregular) {
        /* the first pass keeps what the first complete schedule will keep, not the tail it used
         * last: else the second pass reads a quarter of the model more to trade one set for
         * the other */
        uint64_t r = ferry__sched_rank(s, c->id);
        *order = c->ahead            ? 0
                 : r == UINT64_MAX ? UINT64_MAX / 2 + c->age
                                   : r + 1;
        return 1;
    }
    *order = c->age + 1;
    return 1;
}

static const ferry__evict_ops cyclic_ops = {.version = 1, .name = "cyclic", .order = cyclic_order};

ferry__evictor ferry__evict_cyclic(const ferry__sched *s)
{
    return (ferry__evictor){.ops = &cyclic_ops, .state = (void *)s};
}

void ferry__evict_used(const ferry__evictor *e, uint32_t id, uint64_t bytes, int loaded)
{
    if (e->ops->version >= 2 && e->ops->used)
        e->ops->used(e->state, id, bytes, loaded);
}

void ferry__evict_evicted(const ferry__evictor *e, uint32_t id, uint64_t bytes)
{
    if (e->ops->version >= 2 && e->ops->evicted)
        e->ops->evicted(e->state, id, bytes);
}

void ferry__evict_loading(const ferry__evictor *e, uint32_t id)
{
    if (e->ops->version >= 2 && e->ops->loading)
        e->ops->loading(e->state, id);
}

/* ---- one budget, two kinds ------------------------------------------------------------------ */

/* The candidates of another kind whose eviction leaves it at or above its floor. */
typedef struct floor_iter {
    const ferry__evict_kind *k;
} floor_iter;

static int floor_next(void *ctx, ferry__evict_cand *c)
{
    floor_iter *it = ctx;
    uint64_t spare = it->k->used > it->k->floor ? it->k->used - it->k->floor : 0;
    while (it->k->next(it->k->ctx, c))
        if (c->bytes <= spare)
            return 1;
    return 0;
}

/* Signed bytes over the share, as a comparison key (used and share are below 2^63). */
static int64_t over_share(const ferry__evict_kind *k)
{
    return (int64_t)k->used - (int64_t)k->share;
}

uint32_t ferry__evict_share_pick(const ferry__evict_kind *k, size_t n, size_t loading,
                                 uint64_t min_dist, size_t *from)
{
    int tried[8] = {0};
    if (n > 8)
        n = 8;
    for (size_t round = 0; round < n; round++) {
        size_t best = n;
        for (size_t i = 0; i < n; i++) {
            if (tried[i])
                continue;
            if (best == n || over_share(&k[i]) > over_share(&k[best]) ||
                (over_share(&k[i]) == over_share(&k[best]) && i == loading))
                best = i;
        }
        tried[best] = 1;
        uint32_t v;
        if (best == loading) {
            v = ferry__evict_pick(&k[best].policy, k[best].next, k[best].ctx, min_dist);
        } else {
            floor_iter it = {.k = &k[best]};
            v = ferry__evict_pick(&k[best].policy, floor_next, &it, min_dist);
        }
        if (v != FERRY__SCHED_NONE) {
            if (from)
                *from = best;
            return v;
        }
    }
    return FERRY__SCHED_NONE;
}
