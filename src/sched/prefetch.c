/*
 * prefetch.c — which ids to prefetch next, in the recorded order, within the window; and before
 * a schedule exists, in file order while the prepares follow it (see prefetch.h).
 */
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "sched/prefetch.h"

size_t ferry__prefetch_plan(const ferry__sched *s, ferry__pf_limits lim, ferry__pf_probe_fn probe,
                            ferry__pf_queue_fn queue, void *ctx)
{
    size_t queued = 0;
    if (!s->complete)
        return 0;
    uint64_t ahead = 0;
    for (size_t k = 1; k < s->len && k <= lim.scan && lim.slots > 0; k++) {
        uint32_t id = ferry__sched_ahead(s, k);
        if (id == FERRY__SCHED_NONE)
            break;
        uint64_t bytes = 0;
        ferry__pf_state st = probe(ctx, id, &bytes);
        if (st == FERRY__PF_STOP)
            break;
        if (st == FERRY__PF_SKIP || st == FERRY__PF_KEPT)
            continue;
        if (ahead >= lim.window)
            break;
        ahead += bytes;
        if (st == FERRY__PF_AHEAD)
            continue;
        int r = queue(ctx, id, k);
        if (r < 0)
            break;
        if (r > 0) {
            queued++;
            lim.slots--;
        }
    }
    return queued;
}

/* ---- before a schedule: following the file order --------------------------------------------- */

void ferry__pf_follow_init(ferry__pf_follow *fo)
{
    memset(fo, 0, sizeof *fo);
}

void ferry__pf_follow_free(ferry__pf_follow *fo)
{
    free(fo->order);
    free(fo->index);
    free(fo->flag);
    memset(fo, 0, sizeof *fo);
}

void ferry__pf_follow_reset(ferry__pf_follow *fo)
{
    if (fo->flag && fo->started)
        memset(fo->flag, 0, fo->n);
    fo->next = fo->frontier = 0;
    fo->started = fo->stopped = 0;
}

int ferry__pf_follow_set_order(ferry__pf_follow *fo, const uint32_t *ids, size_t n, size_t n_ids)
{
    ferry__pf_follow_free(fo);
    if (!n)
        return 0;
    fo->order = malloc(n * sizeof *fo->order);
    fo->index = malloc(n_ids * sizeof *fo->index);
    fo->flag = calloc(n, 1);
    if (!fo->order || !fo->index || !fo->flag) {
        ferry__pf_follow_free(fo);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < n_ids; i++)
        fo->index[i] = FERRY__SCHED_NONE;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= n_ids || fo->index[ids[i]] != FERRY__SCHED_NONE) {
            ferry__pf_follow_free(fo);
            return FERRY_EINVAL;
        }
        fo->index[ids[i]] = (uint32_t)i;
        fo->order[i] = ids[i];
    }
    fo->n = n;
    fo->n_ids = n_ids;
    return 0;
}

static uint32_t entry_of(const ferry__pf_follow *fo, uint32_t id)
{
    return id < fo->n_ids ? fo->index[id] : FERRY__SCHED_NONE;
}

void ferry__pf_follow_touch(ferry__pf_follow *fo, const ferry__sched *s, const uint32_t *ids,
                            size_t n)
{
    if (!s->enabled || s->complete) {
        if (fo->started || fo->stopped)
            ferry__pf_follow_reset(fo);
        return;
    }
    if (fo->stopped || !fo->n)
        return;
    size_t known = 0, lo = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = entry_of(fo, ids[i]);
        if (e == FERRY__SCHED_NONE)
            continue;
        known++;
        lo = e < lo ? e : lo;
    }
    if (!known)
        return;
    if (!fo->started) {
        fo->started = 1;
        fo->next = fo->frontier = lo;
    }
    /* a set may be prepared in any order within itself, and reach as far as it is long */
    size_t limit = fo->frontier > fo->next + known ? fo->frontier : fo->next + known;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = entry_of(fo, ids[i]);
        if (e == FERRY__SCHED_NONE)
            continue;
        if ((fo->flag[e] & FERRY__PF_PREPARED) || e >= limit ||
            (e < fo->next && !(fo->flag[e] & FERRY__PF_PASSED))) {
            fo->stopped = 1;
            return;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = entry_of(fo, ids[i]);
        if (e != FERRY__SCHED_NONE)
            fo->flag[e] |= FERRY__PF_PREPARED;
    }
    while (fo->next < fo->n && fo->flag[fo->next])
        fo->next++;
    if (fo->frontier < fo->next)
        fo->frontier = fo->next;
}

size_t ferry__prefetch_plan_follow(ferry__pf_follow *fo, const ferry__sched *s,
                                   ferry__pf_limits lim, ferry__pf_probe_fn probe,
                                   ferry__pf_queue_fn queue, void *ctx)
{
    size_t queued = 0;
    if (!s->enabled || s->complete || !fo->started || fo->stopped)
        return 0;
    uint64_t ahead = 0;
    size_t k = 0;
    for (size_t e = fo->next; e < fo->n && k < lim.scan && lim.slots > 0; e++) {
        if (fo->flag[e])
            continue; /* prepared already, or passed */
        k++;
        uint32_t id = fo->order[e];
        uint64_t bytes = 0;
        ferry__pf_state st = probe(ctx, id, &bytes);
        if (st == FERRY__PF_STOP)
            break;
        if (st == FERRY__PF_SKIP)
            fo->flag[e] |= FERRY__PF_PASSED;
        if (st != FERRY__PF_KEPT && st != FERRY__PF_SKIP) {
            if (ahead >= lim.window)
                break;
            ahead += bytes;
            if (st == FERRY__PF_ABSENT) {
                int r = queue(ctx, id, k);
                if (r < 0)
                    break;
                if (r > 0) {
                    queued++;
                    lim.slots--;
                }
            }
        }
        if (fo->frontier < e + 1)
            fo->frontier = e + 1;
    }
    while (fo->next < fo->n && fo->flag[fo->next])
        fo->next++;
    if (fo->frontier < fo->next)
        fo->frontier = fo->next;
    return queued;
}
