/*
 * prefetch.c — which ids to prefetch next, in the recorded order, within the window
 * (see prefetch.h).
 */
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
