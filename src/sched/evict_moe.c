/*
 * evict_moe.c — eviction policies for units whose use depends on the data (a MoE layer's experts,
 * chosen per token by the router): LRU, LFU with dynamic aging, LRFU and NEXT (see evict.h). Each
 * keeps per id the clock of its last use and a few counts, per group a few more; each use and
 * each candidate's order cost O(1); all speak ids and bytes only.
 *
 * LRFU keeps log2 of the combined recency-frequency at the last use, on its group's clock: the
 * value now is 2^(log2crf - LAMBDA (group clock - last)), computed when the unit is a candidate,
 * so no use touches any other unit. NEXT decays its counts the same way, on its group's steps.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/evict.h"

static const char *const kind_names[FERRY__MOE_COUNT] = {"lru", "lfu", "lrfu", "next"};

const char *ferry__moe_kind_name(ferry__moe_kind kind)
{
    return (unsigned)kind < FERRY__MOE_COUNT ? kind_names[kind] : "?";
}

int ferry__moe_policy_init(ferry__moe_policy *p, ferry__moe_kind kind, size_t n,
                           const uint32_t *group, size_t n_groups, uint32_t floor, double lambda)
{
    memset(p, 0, sizeof *p);
    if ((unsigned)kind >= FERRY__MOE_COUNT || !(lambda >= 0) || lambda > 1)
        return -1;
    if (!group || n_groups == 0)
        n_groups = 1;
    for (size_t i = 0; group && i < n; i++)
        if (group[i] >= n_groups)
            return -1;
    p->kind = kind;
    p->n = n;
    p->n_groups = n_groups;
    p->group = group;
    p->floor = floor;
    p->lambda = lambda > 0 ? lambda : kind == FERRY__MOE_NEXT ? FERRY__MOE_NEXT_LAMBDA
                                                              : FERRY__MOE_LAMBDA;
    p->last_group = UINT32_MAX;
    p->in_group = calloc(n_groups, sizeof *p->in_group);
    p->last = calloc(n ? n : 1, sizeof *p->last);
    p->value = calloc(n ? n : 1, sizeof *p->value);
    p->uses = calloc(n ? n : 1, sizeof *p->uses);
    p->group_clock = calloc(n_groups, sizeof *p->group_clock);
    p->group_last = calloc(n ? n : 1, sizeof *p->group_last);
    p->step = calloc(n ? n : 1, sizeof *p->step);
    p->count = calloc(n ? n : 1, sizeof *p->count);
    p->groups = calloc(n_groups, sizeof *p->groups);
    p->loading_group = UINT32_MAX;
    if (!p->in_group || !p->last || !p->value || !p->uses || !p->group_clock ||
        !p->group_last || !p->step || !p->count || !p->groups) {
        ferry__moe_policy_free(p);
        return -1;
    }
    return 0;
}

void ferry__moe_policy_free(ferry__moe_policy *p)
{
    free(p->in_group);
    free(p->last);
    free(p->value);
    free(p->uses);
    free(p->group_clock);
    free(p->group_last);
    free(p->step);
    free(p->count);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

/* realloc of *A from OLD to NEW elements of SIZE, the new ones zeroed; 0 or -1 (*A unchanged) */
static int grow_array(void **a, size_t old, size_t new, size_t size)
{
    void *q = realloc(*a, new * size);
    if (!q)
        return -1;
    memset((char *)q + old * size, 0, (new - old) * size);
    *a = q;
    return 0;
}

int ferry__moe_policy_grow(ferry__moe_policy *p, size_t n, const uint32_t *group, size_t n_groups)
{
    if (n < p->n)
        n = p->n;
    if (n_groups < p->n_groups)
        n_groups = p->n_groups;
    size_t on = p->n ? p->n : 1, nn = n ? n : 1, og = p->n_groups;
    /* each array grown on its own: one that grew and one that did not both stay valid */
    if (nn > on && (grow_array((void **)&p->last, on, nn, sizeof *p->last) ||
                    grow_array((void **)&p->value, on, nn, sizeof *p->value) ||
                    grow_array((void **)&p->uses, on, nn, sizeof *p->uses) ||
                    grow_array((void **)&p->group_last, on, nn, sizeof *p->group_last) ||
                    grow_array((void **)&p->step, on, nn, sizeof *p->step) ||
                    grow_array((void **)&p->count, on, nn, sizeof *p->count)))
        return -1;
    if (n_groups > og && (grow_array((void **)&p->in_group, og, n_groups, sizeof *p->in_group) ||
                          grow_array((void **)&p->group_clock, og, n_groups,
                                     sizeof *p->group_clock) ||
                          grow_array((void **)&p->groups, og, n_groups, sizeof *p->groups)))
        return -1;
    p->n = n;
    p->n_groups = n_groups;
    p->group = group;
    return 0;
}

static uint32_t group_of(const ferry__moe_policy *p, uint32_t id)
{
    return p->group ? p->group[id] : 0;
}

/* A unit's rate of reuse is drawn towards its group's with the weight of this many uses. */
#define NEXT_PRIOR 4.0

/* NEXT's value of unit ID (BYTES): the probability of its first next use, halved per period of
 * its group until then. Its group's next step is D uses away (at least 1); a step uses it with
 * P1 (R when it was in the group's last step, else G) and each step after with G, so the value
 * is 2^(-D / period) (P1 + (1 - P1) G / 2 / (1 - (1 - G) / 2)), per byte. */
static double next_value(const ferry__moe_policy *p, uint32_t id, uint64_t bytes)
{
    uint32_t gi = group_of(p, id);
    const ferry__moe_group *gr = &p->groups[gi];
    /* a load for a group other than the last one used begins that group's step: its last step
     * becomes the one before, and its next step is a period away */
    int begins = gi == p->loading_group && gi != p->last_group;
    double decay = exp2(-p->lambda * (double)(gr->steps - p->step[id]));
    double all = p->count[id] * decay, fresh = p->value[id] * decay;
    double absent = gr->decayed_steps - all; /* steps that did not follow one of its uses */
    double g = fresh / (absent > 1 ? absent : 1);
    g = g < 1 ? g : 1;
    double p1 = g;
    if (p->last[id] && p->step[id] == gr->steps && !begins) {
        double r = gr->chances > 0 ? gr->reuse / gr->chances : 0;
        p1 = (all - fresh + NEXT_PRIOR * r) / (all + NEXT_PRIOR);
        p1 = p1 > g ? p1 : g;
    }
    double period = gr->period >= 1 ? gr->period : 1;
    double d = begins ? period : (double)gr->start + period - (double)p->clock;
    d = d >= 1 ? d : 1;
    double v = exp2(-d / period) * (p1 + (1 - p1) * (g / 2) / (1 - (1 - g) / 2));
    return v / (double)(bytes ? bytes : 1);
}

/* The value eviction compares (lowest goes first), at any clock. */
static double key_of(const ferry__moe_policy *p, uint32_t id, uint64_t bytes)
{
    switch (p->kind) {
    case FERRY__MOE_NEXT:
        return next_value(p, id, bytes);
    case FERRY__MOE_LFU:
        return p->value[id];
    case FERRY__MOE_LRFU:
        return p->value[id] -
               p->lambda * (double)(p->group_clock[group_of(p, id)] - p->group_last[id]);
    default:
        return (double)p->last[id];
    }
}

/* A double mapped to 62 bits that sort as the doubles do (finite values; the two lowest bits
 * of the mantissa dropped). */
static uint64_t sortable(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    u = (u >> 63) ? ~u : u | (1ull << 63);
    return u >> 2;
}

static int moe_order(void *state, const ferry__evict_cand *c, uint64_t min_dist, uint64_t *order)
{
    (void)min_dist;
    ferry__moe_policy *p = state;
    if (c->id >= p->n)
        return 0;
    uint32_t g = group_of(p, c->id);
    /* a floor the cache cannot give every group shrinks to the share it can */
    uint64_t floor = p->resident / p->n_groups < p->floor ? p->resident / p->n_groups : p->floor;
    /* NEXT's value already weighs each group's next step: no band */
    uint64_t band = p->kind == FERRY__MOE_NEXT || g == p->loading_group || p->in_group[g] > floor
                        ? 1ull << 63
                        : 0;
    /* lowest key first: invert; of equal keys ferry__evict_pick takes the lowest id */
    /* the units of the group's last FLOOR uses (its last token's choice) go after the others */
    uint64_t older = p->kind == FERRY__MOE_NEXT ||
                             p->group_clock[g] - p->group_last[c->id] >= p->floor
                         ? 1ull << 62
                         : 0;
    *order = band | older | ((~sortable(key_of(p, c->id, c->bytes))) & ((1ull << 62) - 1));
    return 1;
}

/* NEXT learns from a use of ID (group G, P->clock already counting it): a use of another group
 * than the last, of a unit already used in this step, or past the floor's units begins a step. */
static void next_used(ferry__moe_policy *p, uint32_t id, uint32_t g)
{
    ferry__moe_group *gr = &p->groups[g];
    int used_here = p->last[id] && p->step[id] == gr->steps;
    if (g != p->last_group || used_here || (p->floor && gr->n_step >= p->floor) ||
        gr->steps == 0) {
        double k = exp2(-p->lambda);
        if (gr->steps) {
            double gap = (double)(p->clock - gr->start);
            gr->period = gr->period > 0 ? gr->period + (gap - gr->period) / 16 : gap;
        }
        gr->steps++;
        gr->start = p->clock;
        gr->decayed_steps = gr->decayed_steps * k + 1;
        gr->reuse *= k;
        gr->chances = gr->chances * k + gr->n_step;
        gr->n_step = 0;
    }
    p->last_group = g;
    int reuse = p->last[id] && p->step[id] + 1 == gr->steps;
    double decay = exp2(-p->lambda * (double)(gr->steps - p->step[id]));
    p->count[id] = p->count[id] * decay + 1;
    p->value[id] = p->value[id] * decay + (reuse ? 0 : 1);
    gr->reuse += reuse;
    gr->n_step++;
    p->step[id] = gr->steps;
}

static void moe_used(void *state, uint32_t id, uint64_t bytes, int loaded)
{
    (void)bytes;
    ferry__moe_policy *p = state;
    if (id >= p->n)
        return;
    uint32_t g = group_of(p, id);
    uint64_t now = ++p->clock, gnow = ++p->group_clock[g];
    if (loaded) {
        p->in_group[g]++;
        p->resident++;
    }
    p->loading_group = UINT32_MAX;
    switch (p->kind) {
    case FERRY__MOE_LFU:
        /* the count outlives an eviction: a popular expert read back in is known again */
        p->uses[id]++;
        p->value[id] = p->age + (double)p->uses[id];
        break;
    case FERRY__MOE_NEXT:
        next_used(p, id, g);
        break;
    case FERRY__MOE_LRFU:
        if (p->last[id] == 0) {
            p->value[id] = 0; /* log2(1) */
        } else {
            double decayed = p->value[id] - p->lambda * (double)(gnow - p->group_last[id]);
            p->value[id] = log2(exp2(decayed) + 1);
        }
        break;
    default:
        break;
    }
    p->last[id] = now;
    p->group_last[id] = gnow;
}

void ferry__moe_policy_hold(ferry__moe_policy *p, uint32_t id, int held)
{
    if (id >= p->n)
        return;
    uint32_t g = group_of(p, id);
    if (held) {
        p->in_group[g]++;
        p->resident++;
    } else if (p->in_group[g]) {
        p->in_group[g]--;
        p->resident--;
    }
}

static void moe_loading(void *state, uint32_t id)
{
    ferry__moe_policy *p = state;
    p->loading_group = id < p->n ? group_of(p, id) : UINT32_MAX;
}

static void moe_evicted(void *state, uint32_t id, uint64_t bytes)
{
    (void)bytes;
    ferry__moe_policy *p = state;
    if (id >= p->n)
        return;
    uint32_t g = group_of(p, id);
    if (p->in_group[g]) {
        p->in_group[g]--;
        p->resident--;
    }
    if (p->kind == FERRY__MOE_LFU)
        p->age = p->value[id];
}

static const ferry__evict_ops moe_ops = {.version = 2,
                                         .name = "moe",
                                         .order = moe_order,
                                         .used = moe_used,
                                         .evicted = moe_evicted,
                                         .loading = moe_loading};

ferry__evictor ferry__evict_moe(ferry__moe_policy *p)
{
    return (ferry__evictor){.ops = &moe_ops, .state = p};
}
