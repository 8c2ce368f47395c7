/*
 * sched.c — recording the access order of one pass and measuring next-use distances in it
 * (see sched.h). With a cyclic pattern the future is known after one pass: eviction (evict.c)
 * keeps a set spread evenly over the recorded order and never takes a copy needed before the
 * load, and prefetch (prefetch.c) reads ahead in that order.
 */
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "sched/sched.h"

int ferry__sched_init(ferry__sched *s, size_t n_ids, int enabled)
{
    memset(s, 0, sizeof *s);
    s->enabled = enabled;
    return ferry__sched_resize(s, n_ids);
}

void ferry__sched_free(ferry__sched *s)
{
    free(s->order);
    free(s->pos);
    memset(s, 0, sizeof *s);
}

int ferry__sched_resize(ferry__sched *s, size_t n_ids)
{
    if (n_ids <= s->n_ids)
        return 0;
    uint32_t *pos = realloc(s->pos, n_ids * sizeof *pos);
    uint32_t *order = realloc(s->order, n_ids * sizeof *order);
    if (pos)
        s->pos = pos;
    if (order)
        s->order = order;
    if (!pos || !order)
        return FERRY_ENOMEM;
    for (size_t i = s->n_ids; i < n_ids; i++)
        s->pos[i] = FERRY__SCHED_NONE;
    s->n_ids = n_ids;
    return 0;
}

void ferry__sched_reset(ferry__sched *s)
{
    for (size_t i = 0; i < s->len; i++)
        s->pos[s->order[i]] = FERRY__SCHED_NONE;
    s->len = 0;
    s->complete = 0;
    s->irregular = 0;
    s->cursor = 0;
    s->misses = 0;
}

/* Starts recording again, from ID. */
static void rerecord(ferry__sched *s, uint32_t id)
{
    ferry__sched_reset(s);
    s->pos[id] = 0;
    s->order[s->len++] = id;
}

int ferry__sched_touch(ferry__sched *s, uint32_t id)
{
    if (!s->enabled || id >= s->n_ids)
        return 0;
    uint32_t p = s->pos[id];
    if (!s->complete) {
        if (p == FERRY__SCHED_NONE) {
            s->pos[id] = (uint32_t)s->len;
            s->order[s->len++] = id;
            return 0;
        }
        /* The pass repeats when its first tensor comes again. Another recorded tensor coming
         * again (a weight shared by several layers) keeps its first position; it also means the
         * order may not be a plain cycle, so the ranks of the recording stop being used. */
        if (p != 0) {
            s->irregular = 1;
            return 0;
        }
        if (s->len < 2) {
            rerecord(s, id);
            return 0;
        }
        s->complete = 1;
        s->cursor = 0;
        s->misses = 0;
        s->seen = 1;
        s->passes++;
        return 1;
    }
    if (p == FERRY__SCHED_NONE) {
        /* A tensor the recorded pass never used: the pattern changed. */
        rerecord(s, id);
        return 0;
    }
    if (p == s->cursor)
        return 0;
    size_t len = s->len, q = len / 4;
    size_t fwd = (p + len - s->cursor) % len; /* steps forward from the cursor */
    /* From the last quarter to the first: a new pass. */
    int wrap = p < s->cursor && s->cursor + q + 1 >= len && p <= q;
    /* Forward within a few steps is the recorded order (a set may be prepared in another order
     * than it was recorded); anything else is a miss. */
    if (!wrap && fwd > 8) {
        s->misses++;
    } else if (!wrap && p < s->cursor) {
        s->misses++;
    }
    if (++s->seen >= len) {
        /* A pass worth of prepares: more than a quarter out of order means the order changed. */
        int changed = s->misses > q;
        s->seen = 0;
        s->misses = 0;
        if (changed) {
            rerecord(s, id);
            return 0;
        }
    }
    s->cursor = p;
    if (wrap) {
        s->passes++;
        return 1;
    }
    return 0;
}

uint64_t ferry__sched_distance(const ferry__sched *s, uint32_t id)
{
    if (!s->complete || id >= s->n_ids || s->pos[id] == FERRY__SCHED_NONE)
        return UINT64_MAX;
    size_t d = (s->pos[id] + s->len - s->cursor) % s->len;
    return d ? d : s->len;
}

uint32_t ferry__sched_ahead(const ferry__sched *s, size_t k)
{
    if (!s->complete || k == 0 || k >= s->len)
        return FERRY__SCHED_NONE;
    return s->order[(s->cursor + k) % s->len];
}

uint64_t ferry__sched_rank(const ferry__sched *s, uint32_t id)
{
    if (!s->enabled || id >= s->n_ids || s->pos[id] == FERRY__SCHED_NONE ||
        (!s->complete && (s->passes || s->irregular)))
        return UINT64_MAX;
    /* the position with its 32 bits reversed: for any count, the positions with the lowest
     * values are spread evenly over the order (0, then 1/2 of the way, then 1/4 and 3/4, ...),
     * whatever its length turns out to be */
    uint32_t p = s->pos[id], r = 0;
    for (int b = 0; b < 32; b++)
        r |= (p >> b & 1u) << (31 - b);
    return r;
}
