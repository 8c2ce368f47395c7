/*
 * test_sched_prefetch.c — prefetch planning (src/sched/prefetch.c) on synthetic schedules, without
 * files: what it queues after the cursor, in the recorded order, within the window of bytes
 * fetched ahead, skipping kept copies, and where it stops.
 */
#include <string.h>

#include "check.h"
#include "sched/prefetch.h"
#include "sched/sched.h"

#define N 12

typedef struct world {
    ferry__pf_state st[N];
    uint64_t bytes[N];
    uint32_t queued[N];
    size_t k[N];
    size_t n_queued;
    int refuse_at; /* queue refuses this id (-1: none) */
    int no_op_at;  /* queue needs nothing for this id (-1: none) */
} world;

static ferry__pf_state probe(void *ctx, uint32_t id, uint64_t *bytes)
{
    world *w = ctx;
    *bytes = w->bytes[id];
    return w->st[id];
}

static int queue(void *ctx, uint32_t id, size_t k)
{
    world *w = ctx;
    if ((int)id == w->refuse_at)
        return -1;
    if ((int)id == w->no_op_at)
        return 0;
    w->queued[w->n_queued] = id;
    w->k[w->n_queued++] = k;
    w->st[id] = FERRY__PF_AHEAD;
    return 1;
}

static void init(world *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < N; i++) {
        w->st[i] = FERRY__PF_ABSENT;
        w->bytes[i] = 10;
    }
    w->refuse_at = w->no_op_at = -1;
}

/* a complete schedule 0..N-1 with the cursor on CUR */
static void sched_at(ferry__sched *s, uint32_t cur)
{
    CHECK_EQ_INT(ferry__sched_init(s, N, 1), 0);
    for (uint32_t i = 0; i < N; i++)
        ferry__sched_touch(s, i);
    for (uint32_t i = 0; i <= cur; i++)
        ferry__sched_touch(s, i);
    CHECK(s->complete);
    CHECK_EQ_INT(s->cursor, cur);
}

static void test_window(void)
{
    ferry__sched s;
    sched_at(&s, 3);
    world w;
    init(&w);
    ferry__pf_limits lim = {.window = 25, .scan = 256, .slots = 4};
    /* 10 + 10 + 10 bytes: the third starts under the window (20 < 25) */
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 3);
    CHECK_EQ_INT(w.queued[0], 4);
    CHECK_EQ_INT(w.queued[1], 5);
    CHECK_EQ_INT(w.queued[2], 6);
    CHECK_EQ_INT(w.k[0], 1);
    CHECK_EQ_INT(w.k[2], 3);
    /* again: they are fetched ahead now and fill the window, nothing more goes */
    w.n_queued = 0;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 0);

    /* kept copies do not count, skipped ones neither: the window reaches past them */
    init(&w);
    w.st[4] = FERRY__PF_KEPT;
    w.st[5] = FERRY__PF_SKIP;
    w.st[6] = FERRY__PF_KEPT;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 3);
    CHECK_EQ_INT(w.queued[0], 7);
    CHECK_EQ_INT(w.queued[2], 9);
    CHECK_EQ_INT(w.k[0], 4);

    /* slots bound what is queued; a copy that needs nothing takes none */
    init(&w);
    w.no_op_at = 4;
    lim.window = 1000;
    lim.slots = 2;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 2);
    CHECK_EQ_INT(w.queued[0], 5);
    CHECK_EQ_INT(w.queued[1], 6);

    /* a refusal (no room) stops the plan; so does an unknown id */
    init(&w);
    w.refuse_at = 5;
    lim.slots = 8;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 1);
    init(&w);
    w.st[6] = FERRY__PF_STOP;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 2);

    /* never past a pass: at most N-1 ids ahead, never the current one */
    init(&w);
    lim.slots = 100;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), N - 1);
    for (size_t i = 0; i < w.n_queued; i++)
        CHECK(w.queued[i] != 3);
    CHECK_EQ_INT(w.queued[N - 2], 2); /* wrapped around the order */

    /* the scan limit */
    init(&w);
    lim.scan = 2;
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 2);
    ferry__sched_free(&s);
}

static void test_no_schedule(void)
{
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, N, 1), 0);
    for (uint32_t i = 0; i < N; i++)
        ferry__sched_touch(&s, i); /* recorded, not complete */
    world w;
    init(&w);
    ferry__pf_limits lim = {.window = 1000, .scan = 256, .slots = 4};
    CHECK_EQ_INT(ferry__prefetch_plan(&s, lim, probe, queue, &w), 0);
    ferry__sched_free(&s);
}

int main(void)
{
    test_window();
    test_no_schedule();
    return check_finish();
}
