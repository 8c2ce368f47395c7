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
