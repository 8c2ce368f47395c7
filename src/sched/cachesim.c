/*
 * cachesim.c — the expert cache simulation of ferry.h: a budget of bytes over units with ids,
 * sizes and groups, served by one of the expert policies of evict_moe.c through the evictor
 * interface, as the manager would serve them, counting hits and bytes read.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "sched/evict.h"

struct ferry_cache_sim {
    size_t n;
    uint64_t *bytes;
    uint32_t *group;
    uint64_t capacity;
    unsigned char *resident;
    unsigned char *pinned;   /* in the set being used: not evictable */
    uint32_t *res_ids;       /* the resident ids, RES_N of them, in no order */
    uint32_t *res_pos;       /* per id: its index in RES_IDS */
    size_t res_n;
    ferry__moe_policy policy;
    ferry__evictor evictor;
    int auto_floor;          /* the floor follows the largest set used together */
    ferry_cache_sim_stats st;
    char err[160];
};

const char *ferry_cache_policy_name(ferry_cache_policy policy)
{
    switch (policy) {
    case FERRY_CACHE_FERRY:
        return "ferry";
    case FERRY_CACHE_LRU:
        return "lru";
    case FERRY_CACHE_LFU:
        return "lfu";
    case FERRY_CACHE_LRFU:
        return "lrfu";
    case FERRY_CACHE_LFU_FLOOR:
        return "lfu-floor";
    default:
        return "?";
    }
}

static ferry__moe_kind kind_of(ferry_cache_policy p)
{
    switch (p) {
    case FERRY_CACHE_LRU:
        return FERRY__MOE_LRU;
    case FERRY_CACHE_LFU:
        return FERRY__MOE_LFU;
    case FERRY_CACHE_LRFU:
        return FERRY__MOE_LRFU;
    case FERRY_CACHE_LFU_FLOOR:
        return FERRY__MOE_LFU;
    default:
        return FERRY__MOE_DEFAULT;
    }
}

void ferry_cache_sim_destroy(ferry_cache_sim *s)
{
    if (!s)
        return;
    ferry__moe_policy_free(&s->policy);
    free(s->bytes);
    free(s->group);
    free(s->resident);
    free(s->pinned);
    free(s->res_ids);
    free(s->res_pos);
    free(s);
}

int ferry_cache_sim_create(ferry_cache_sim **out, ferry_cache_policy policy, size_t n,
                           const uint64_t *bytes, const uint32_t *group, size_t n_groups,
                           uint64_t capacity, uint32_t floor_per_group)
{
    if (!out)
        return FERRY_EINVAL;
    *out = NULL;
    if ((unsigned)policy >= FERRY_CACHE_POLICY_COUNT || n == 0 || n >= UINT32_MAX || !bytes ||
        (group && n_groups == 0))
        return FERRY_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (group && group[i] >= n_groups)
            return FERRY_EINVAL;
    ferry_cache_sim *s = calloc(1, sizeof *s);
    if (!s)
        return FERRY_ENOMEM;
    s->n = n;
    s->capacity = capacity;
    s->bytes = malloc(n * sizeof *s->bytes);
    s->group = group ? malloc(n * sizeof *s->group) : NULL;
    s->resident = calloc(n, 1);
    s->pinned = calloc(n, 1);
    s->res_ids = malloc(n * sizeof *s->res_ids);
    s->res_pos = malloc(n * sizeof *s->res_pos);
    if (!s->bytes || (group && !s->group) || !s->resident || !s->pinned || !s->res_ids ||
        !s->res_pos) {
        ferry_cache_sim_destroy(s);
        return FERRY_ENOMEM;
    }
    memcpy(s->bytes, bytes, n * sizeof *s->bytes);
    if (group)
        memcpy(s->group, group, n * sizeof *s->group);
    if (ferry__moe_policy_init(&s->policy, kind_of(policy), n, s->group, group ? n_groups : 1,
                               floor_per_group, 0)) {
        ferry_cache_sim_destroy(s);
        return FERRY_ENOMEM;
    }
    s->evictor = ferry__evict_moe(&s->policy);
    s->auto_floor =
        (policy == FERRY_CACHE_FERRY || policy == FERRY_CACHE_LFU_FLOOR) && floor_per_group == 0;
    *out = s;
    return 0;
}

static int fail(ferry_cache_sim *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return code;
}

typedef struct res_iter {
    const ferry_cache_sim *s;
    size_t i;
} res_iter;

static int res_next(void *ctx, ferry__evict_cand *c)
{
    res_iter *it = ctx;
    const ferry_cache_sim *s = it->s;
    while (it->i < s->res_n) {
        uint32_t id = s->res_ids[it->i++];
        if (s->pinned[id])
            continue;
        *c = (ferry__evict_cand){.id = id, .bytes = s->bytes[id]};
        return 1;
    }
    return 0;
}

static void unpin(ferry_cache_sim *s, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < s->n)
            s->pinned[ids[i]] = 0;
}

int ferry_cache_sim_use(ferry_cache_sim *s, const uint32_t *ids, size_t n)
{
    if (!s || (n && !ids))
        return FERRY_EINVAL;
    s->err[0] = 0;
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= s->n) {
            unpin(s, ids, i);
            return fail(s, FERRY_EINVAL, "unit %u of use %zu: out of range (%zu units)",
                        (unsigned)ids[i], i, s->n);
        }
        if (!s->pinned[ids[i]])
            need = s->bytes[ids[i]] > UINT64_MAX - need ? UINT64_MAX : need + s->bytes[ids[i]];
        s->pinned[ids[i]] = 1;
    }
    if (need > s->capacity) {
        unpin(s, ids, n);
        return fail(s, FERRY_EBUDGET, "%zu units used together need %llu bytes, the cache holds "
                    "%llu", n, (unsigned long long)need, (unsigned long long)s->capacity);
    }
    if (s->auto_floor && n > s->policy.floor)
        s->policy.floor = (uint32_t)(n < UINT32_MAX ? n : UINT32_MAX);
    uint64_t used = s->st.resident_bytes;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (s->pinned[id] == 2)
            continue; /* a repeat within IDS */
        s->pinned[id] = 2;
        s->st.uses++;
        if (s->resident[id]) {
            s->st.hits++;
            ferry__evict_used(&s->evictor, id, s->bytes[id], 0);
            continue;
        }
        /* used <= capacity and bytes[id] <= need <= capacity: no overflow below */
        if (s->bytes[id] > s->capacity - used)
            ferry__evict_loading(&s->evictor, id);
        while (s->bytes[id] > s->capacity - used) {
            res_iter it = {.s = s};
            uint32_t v = ferry__evict_pick(&s->evictor, res_next, &it, 0);
            if (v == FERRY__SCHED_NONE)
                break; /* cannot happen: the pinned set fits */
            s->resident[v] = 0;
            uint32_t at = s->res_pos[v];
            s->res_ids[at] = s->res_ids[--s->res_n];
            s->res_pos[s->res_ids[at]] = at;
            used -= s->bytes[v];
            s->st.evictions++;
            ferry__evict_evicted(&s->evictor, v, s->bytes[v]);
        }
        s->resident[id] = 1;
        s->res_pos[id] = (uint32_t)s->res_n;
        s->res_ids[s->res_n++] = id;
        used += s->bytes[id];
        s->st.bytes_read += s->bytes[id];
        ferry__evict_used(&s->evictor, id, s->bytes[id], 1);
    }
    for (size_t i = 0; i < n; i++)
        s->pinned[ids[i]] = 0;
    s->st.resident_bytes = used;
    return 0;
}

void ferry_cache_sim_get_stats(const ferry_cache_sim *s, ferry_cache_sim_stats *out)
{
    if (out)
        *out = s ? s->st : (ferry_cache_sim_stats){0};
}

int ferry_cache_sim_resident(const ferry_cache_sim *s, uint32_t id)
{
    return s && id < s->n && s->resident[id];
}

const char *ferry_cache_sim_errmsg(const ferry_cache_sim *s)
{
    return s ? s->err : "";
}
