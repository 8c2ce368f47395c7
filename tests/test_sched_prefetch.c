/*
 * test_sched_prefetch.c — prefetch planning (src/sched/prefetch.c) on synthetic schedules, without
 * files: what it queues after the cursor, in the recorded order, within the window of bytes
 * fetched ahead, skipping kept copies, and where it stops. And before a schedule exists, the
 * follower of the file order: prepares in file order prefetch ahead; out of order, it stops.
 */
#include <string.h>

#include "check.h"
#include "ferry.h"
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

/* ---- before a schedule: the file-order follower ---- */

/* The file order of the tests below: ids in an order unlike their numbers (as catalog ids are
 * unlike data offsets). */
static const uint32_t g_file[N] = {5, 3, 0, 1, 4, 2, 11, 10, 6, 7, 9, 8};

typedef struct follow_case {
    ferry__sched s;
    ferry__pf_follow fo;
    world w;
    ferry__pf_limits lim;
} follow_case;

static void follow_init(follow_case *c, int enabled)
{
    CHECK_EQ_INT(ferry__sched_init(&c->s, N, enabled), 0);
    ferry__pf_follow_init(&c->fo);
    CHECK_EQ_INT(ferry__pf_follow_set_order(&c->fo, g_file, N, N), 0);
    init(&c->w);
    c->lim = (ferry__pf_limits){.window = 25, .scan = 256, .slots = 4};
}

static void follow_free(follow_case *c)
{
    ferry__pf_follow_free(&c->fo);
    ferry__sched_free(&c->s);
}

/* Prepares the set IDS (the schedule records it, then the follower sees it). */
static void prep(follow_case *c, const uint32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ferry__sched_touch(&c->s, ids[i]);
        if (c->w.st[ids[i]] == FERRY__PF_AHEAD)
            c->w.st[ids[i]] = FERRY__PF_KEPT; /* used: as the manager's probe then says */
    }
    ferry__pf_follow_touch(&c->fo, &c->s, ids, n);
}

static void prep1(follow_case *c, uint32_t id)
{
    prep(c, &id, 1);
}

static size_t plan(follow_case *c)
{
    c->w.n_queued = 0;
    return ferry__prefetch_plan_follow(&c->fo, &c->s, c->lim, probe, queue, &c->w);
}

static void test_follow_in_order(void)
{
    follow_case c;
    follow_init(&c, 1);
    /* nothing before the first prepare: no position yet */
    CHECK_EQ_INT(plan(&c), 0);
    /* the pass starts at the second tensor of the file: prefetch after it, in file order */
    prep1(&c, g_file[1]);
    CHECK_EQ_INT(plan(&c), 3); /* 10 + 10 + 10 bytes: the third starts under the window */
    CHECK_EQ_INT(c.w.queued[0], g_file[2]);
    CHECK_EQ_INT(c.w.queued[1], g_file[3]);
    CHECK_EQ_INT(c.w.queued[2], g_file[4]);
    CHECK_EQ_INT(c.w.k[0], 1);
    CHECK_EQ_INT(c.w.k[2], 3);
    /* the window is full of them: nothing more */
    CHECK_EQ_INT(plan(&c), 0);
    /* the predicted one comes: one more goes */
    prep1(&c, g_file[2]);
    CHECK_EQ_INT(plan(&c), 1);
    CHECK_EQ_INT(c.w.queued[0], g_file[5]);
    CHECK_EQ_INT(c.w.k[0], 3);
    /* one of those prefetched, past the predicted one: still the file order */
    prep1(&c, g_file[4]);
    CHECK(!c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 1);
    CHECK_EQ_INT(c.w.queued[0], g_file[6]);
    /* and the one left behind, still among the prefetched ones */
    prep1(&c, g_file[3]);
    CHECK(!c.fo.stopped);
    CHECK_EQ_INT(c.fo.next, 5);
    /* to the end of the file, never past it (no wrap: a pass may not come again) */
    for (size_t e = 5; e < N; e++) {
        plan(&c);
        prep1(&c, g_file[e]);
        CHECK(!c.fo.stopped);
    }
    CHECK_EQ_INT(plan(&c), 0);
    /* the first one again: the schedule is complete, the follower rests */
    prep1(&c, g_file[1]);
    CHECK(c.s.complete);
    CHECK(!c.fo.started);
    CHECK_EQ_INT(plan(&c), 0);
    follow_free(&c);
}

static void test_follow_sets(void)
{
    follow_case c;
    follow_init(&c, 1);
    /* a set in another order than the file's: it starts at its lowest entry */
    uint32_t a[] = {g_file[2], g_file[0], g_file[1]};
    prep(&c, a, 3);
    CHECK(!c.fo.stopped);
    CHECK_EQ_INT(c.fo.next, 3);
    /* the next set, as long as it is, within itself in any order, nothing prefetched yet */
    uint32_t b[] = {g_file[5], g_file[3], g_file[4]};
    prep(&c, b, 3);
    CHECK(!c.fo.stopped);
    CHECK_EQ_INT(c.fo.next, 6);
    /* ids the file order does not hold (split parts) neither follow nor break it */
    ferry__pf_follow_free(&c.fo);
    CHECK_EQ_INT(ferry__pf_follow_set_order(&c.fo, g_file, N - 1, N), 0); /* without id 8 */
    prep1(&c, g_file[0]);
    prep1(&c, 8);
    CHECK(c.fo.started && !c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 3);
    CHECK_EQ_INT(c.w.queued[0], g_file[1]);
    follow_free(&c);
}

static void test_follow_out_of_order(void)
{
    follow_case c;
    follow_init(&c, 1);
    prep1(&c, g_file[0]);
    CHECK_EQ_INT(plan(&c), 3); /* entries 1..3 */
    /* past what was prefetched: the accesses disagree with the file order */
    prep1(&c, g_file[6]);
    CHECK(c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 0);
    /* and it stays stopped, in order again or not, until the schedule exists */
    prep1(&c, g_file[7]);
    CHECK_EQ_INT(plan(&c), 0);
    follow_free(&c);

    /* the predicted one not prefetched yet, the next one instead: stops */
    follow_init(&c, 1);
    prep1(&c, g_file[0]);
    prep1(&c, g_file[2]);
    CHECK(c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 0);
    follow_free(&c);

    /* backwards: one prepared already (not the first: that would complete the schedule) */
    follow_init(&c, 1);
    prep1(&c, g_file[3]);
    plan(&c);
    prep1(&c, g_file[4]);
    prep1(&c, g_file[5]);
    CHECK(!c.fo.stopped);
    prep1(&c, g_file[4]);
    CHECK(!c.s.complete);
    CHECK(c.fo.stopped);
    follow_free(&c);

    /* backwards: before where the pass started */
    follow_init(&c, 1);
    prep1(&c, g_file[3]);
    plan(&c);
    prep1(&c, g_file[1]);
    CHECK(c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 0);
    follow_free(&c);

    /* stopped in one recording, following again in the next: a pass in id order (not the
     * file's) stops it, the schedule completes and the follower rests; a tensor the schedule
     * never saw starts a new recording, which the follower follows from there */
    follow_init(&c, 1);
    for (uint32_t id = 0; id < 6; id++)
        prep1(&c, id);
    CHECK(c.fo.stopped);
    prep1(&c, 0);
    CHECK(c.s.complete && !c.fo.started && !c.fo.stopped);
    prep1(&c, 1);
    CHECK_EQ_INT(plan(&c), 0);
    prep1(&c, g_file[6]);
    CHECK(!c.s.complete);
    CHECK(c.fo.started && !c.fo.stopped);
    CHECK_EQ_INT(plan(&c), 3);
    CHECK_EQ_INT(c.w.queued[0], g_file[7]);
    follow_free(&c);
}

static void test_follow_states(void)
{
    follow_case c;
    follow_init(&c, 1);
    /* kept copies do not count against the window; skipped ones are passed, and may still be
     * prepared (lazy) */
    c.w.st[g_file[1]] = FERRY__PF_KEPT;
    c.w.st[g_file[2]] = FERRY__PF_SKIP;
    prep1(&c, g_file[0]);
    CHECK_EQ_INT(plan(&c), 3);
    CHECK_EQ_INT(c.w.queued[0], g_file[3]);
    CHECK_EQ_INT(c.w.k[0], 3);
    prep1(&c, g_file[1]);
    prep1(&c, g_file[2]);
    prep1(&c, g_file[3]);
    CHECK(!c.fo.stopped);
    follow_free(&c);

    /* the budget refuses: the plan stops there, and what it did not reach is not predicted */
    follow_init(&c, 1);
    c.w.refuse_at = (int)g_file[2];
    prep1(&c, g_file[0]);
    CHECK_EQ_INT(plan(&c), 1);
    CHECK_EQ_INT(c.fo.frontier, 2);
    prep1(&c, g_file[1]);
    prep1(&c, g_file[2]); /* the predicted one, never prefetched: still in order */
    CHECK(!c.fo.stopped);
    prep1(&c, g_file[4]); /* past the prediction */
    CHECK(c.fo.stopped);
    follow_free(&c);

    /* slots and the scan bound the plan; an unknown id stops it */
    follow_init(&c, 1);
    c.lim.window = 1000;
    c.lim.slots = 2;
    prep1(&c, g_file[0]);
    CHECK_EQ_INT(plan(&c), 2);
    c.lim.slots = 100;
    c.lim.scan = 4;
    CHECK_EQ_INT(plan(&c), 2); /* entries 3, 4: 1, 2 are ahead */
    c.lim.scan = 256;
    c.w.st[g_file[7]] = FERRY__PF_STOP;
    CHECK_EQ_INT(plan(&c), 2); /* entries 5, 6 */
    follow_free(&c);

    /* no schedule (ferry_options.no_schedule): never follows, never plans */
    follow_init(&c, 0);
    prep1(&c, g_file[0]);
    CHECK(!c.fo.started);
    CHECK_EQ_INT(plan(&c), 0);
    follow_free(&c);

    /* a file order with an id twice or out of range is refused; an empty one plans nothing */
    ferry__pf_follow fo;
    ferry__pf_follow_init(&fo);
    uint32_t twice[] = {1, 2, 1};
    CHECK_EQ_INT(ferry__pf_follow_set_order(&fo, twice, 3, N), FERRY_EINVAL);
    uint32_t range[] = {1, N};
    CHECK_EQ_INT(ferry__pf_follow_set_order(&fo, range, 2, N), FERRY_EINVAL);
    CHECK_EQ_INT(fo.n, 0);
    CHECK_EQ_INT(ferry__pf_follow_set_order(&fo, twice, 0, N), 0);
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, N, 1), 0);
    uint32_t one = 1;
    ferry__pf_follow_touch(&fo, &s, &one, 1);
    world w;
    init(&w);
    ferry__pf_limits lim = {.window = 1000, .scan = 256, .slots = 4};
    CHECK_EQ_INT(ferry__prefetch_plan_follow(&fo, &s, lim, probe, queue, &w), 0);
    ferry__sched_free(&s);
    ferry__pf_follow_free(&fo);
}

int main(void)
{
    test_window();
    test_no_schedule();
    test_follow_in_order();
    test_follow_sets();
    test_follow_out_of_order();
    test_follow_states();
    return check_finish();
}
