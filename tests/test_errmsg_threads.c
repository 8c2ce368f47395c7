/*
 * test_errmsg_threads.c — ferry_errmsg is the calling thread's own: threads failing different
 * calls on one manager in a loop each read their own message after each failure (a lookup of a
 * missing tensor, a budget for a missing device, an open of a missing file, a prepare against a
 * wrong expectation, a prepare whose load fails on a loader thread), and still read it after
 * calls that succeed; a thread that never failed reads ""; a manager destroyed and another
 * created (often at the same address) has no message left, on any thread; one thread's messages
 * on many managers stay apart.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

#define ROUNDS 200

static char g_dir[1024], g_model[1200];
static const char *g_bad;  /* a tensor whose expectation is wrong */
static const char *g_dev;  /* a tensor computed on a device whose every copy fails */
static const char *g_good; /* a tensor that prepares */

typedef struct worker {
    ferry *f;
    int kind;
    int id;
    pthread_barrier_t *start;
    int failures, wrong, unexpected;
    char last[512]; /* the first wrong message, for the report */
} worker;

static void note_wrong(worker *w, const char *msg)
{
    if (!w->wrong++)
        snprintf(w->last, sizeof w->last, "%s", msg);
}

/* MSG is what this worker's failure of round R says. */
static int mine(const worker *w, int r, const char *msg)
{
    char want[1400];
    switch (w->kind) {
    case 0:
        snprintf(want, sizeof want, "no tensor 'missing.%d.%d'", w->id, r);
        return strcmp(msg, want) == 0;
    case 1:
        snprintf(want, sizeof want, "no device %d (2 devices)", 100 + w->id * 1000 + r);
        return strcmp(msg, want) == 0;
    case 2:
        snprintf(want, sizeof want, "%s/absent.%d.%d.gguf", g_dir, w->id, r);
        return strstr(msg, want) != NULL;
    case 3:
        return strstr(msg, g_bad) && strstr(msg, "expected dtype f16, found f32");
    default:
        return strstr(msg, g_dev) && !strstr(msg, "expected") && !strstr(msg, "missing.") &&
               !strstr(msg, "absent.");
    }
}

static int fail_once(worker *w, int r, ferry_tensor *bad, ferry_tensor *dev)
{
    char name[1400];
    switch (w->kind) {
    case 0:
        snprintf(name, sizeof name, "missing.%d.%d", w->id, r);
        return ferry_find(w->f, name) ? 0 : FERRY_ENOENT;
    case 1:
        return ferry_set_budget(w->f, 100 + w->id * 1000 + r, 1 << 20);
    case 2:
        snprintf(name, sizeof name, "%s/absent.%d.%d.gguf", g_dir, w->id, r);
        return ferry_open(w->f, name, NULL);
    case 3:
        return ferry_prepare(w->f, &bad, 1);
    default:
        return ferry_prepare(w->f, &dev, 1);
    }
}

static void *work(void *arg)
{
    worker *w = arg;
    ferry_tensor *bad = ferry_find(w->f, g_bad), *dev = ferry_find(w->f, g_dev);
    ferry_tensor *good = ferry_find(w->f, g_good);
    if (strcmp(ferry_errmsg(w->f), "") != 0)
        note_wrong(w, ferry_errmsg(w->f));
    pthread_barrier_wait(w->start);
    for (int r = 0; r < ROUNDS; r++) {
        int rc = fail_once(w, r, bad, dev);
        if (rc == 0) {
            w->unexpected++;
            continue;
        }
        w->failures++;
        const char *msg = ferry_errmsg(w->f);
        if (!mine(w, r, msg))
            note_wrong(w, msg);
        /* a call that succeeds leaves the message as it was */
        if (r % 4 == 0 && good && ferry_prepare(w->f, &good, 1) == 0) {
            ferry_release(w->f, &good, 1);
            if (!mine(w, r, ferry_errmsg(w->f)))
                note_wrong(w, ferry_errmsg(w->f));
        }
    }
    return NULL;
}

static void test_one_manager(void)
{
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device(f, "fault:sim:64MiB,fail_copy=1/every", &dev), 0);
    ferry_policy p = {0};
    p.home = FERRY_HOME_DISK;
    p.compute_device = dev;
    CHECK_EQ_INT(ferry_group_add(f, "failing", g_dev, &p), 0);
    CHECK_EQ_INT(ferry_expect(f, g_bad, FERRY_DTYPE_F16, 0, NULL), 0);
    CHECK_STR(ferry_errmsg(f), ""); /* nothing failed on this thread yet */

    enum { KINDS = 5, PER = 2, N = KINDS * PER };
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N);
    worker w[N];
    pthread_t th[N];
    memset(w, 0, sizeof w);
    for (int i = 0; i < N; i++) {
        w[i].f = f;
        w[i].kind = i % KINDS;
        w[i].id = i;
        w[i].start = &start;
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(w[i].failures, ROUNDS);
        CHECK_EQ_INT(w[i].unexpected, 0);
        CHECK_EQ_INT(w[i].wrong, 0);
        if (w[i].wrong)
            fprintf(stderr, "worker %d (kind %d) read: %s\n", i, w[i].kind, w[i].last);
    }
    pthread_barrier_destroy(&start);
    CHECK_STR(ferry_errmsg(f), ""); /* the main thread itself never failed */
    ferry_destroy(f);
}

/* A thread that failed on a manager, alive while it is destroyed and another is created. */
typedef struct survivor {
    ferry *f;
    pthread_barrier_t *step;
    int ok;
} survivor;

static void *survive(void *arg)
{
    survivor *s = arg;
    int ok = ferry_find(s->f, "gone") == NULL && strcmp(ferry_errmsg(s->f), "no tensor 'gone'") == 0;
    pthread_barrier_wait(s->step); /* failed on the first manager */
    pthread_barrier_wait(s->step); /* the main thread made the second one: s->f */
    ok &= strcmp(ferry_errmsg(s->f), "") == 0;
    ok &= ferry_find(s->f, "again") == NULL &&
          strcmp(ferry_errmsg(s->f), "no tensor 'again'") == 0;
    s->ok = ok;
    return NULL;
}

static void test_recreated(void)
{
    int same_address = 0;
    for (int i = 0; i < 20; i++) {
        ferry *a = ferry_create(NULL);
        CHECK(a != NULL);
        if (!a)
            return;
        CHECK(ferry_find(a, "stale") == NULL);
        CHECK_STR(ferry_errmsg(a), "no tensor 'stale'");
        void *was = a;
        ferry_destroy(a);
        ferry *b = ferry_create(NULL);
        CHECK(b != NULL);
        if (!b)
            return;
        same_address += (void *)b == was;
        CHECK_STR(ferry_errmsg(b), "");
        ferry_destroy(b);
    }
    printf("recreated at the same address %d of 20 times\n", same_address);

    /* another thread's message on the destroyed manager does not show on the new one */
    pthread_barrier_t step;
    pthread_barrier_init(&step, NULL, 2);
    survivor s = {.f = ferry_create(NULL), .step = &step};
    CHECK(s.f != NULL);
    pthread_t th;
    pthread_create(&th, NULL, survive, &s);
    pthread_barrier_wait(&step);
    ferry_destroy(s.f);
    s.f = ferry_create(NULL);
    CHECK(s.f != NULL);
    pthread_barrier_wait(&step);
    pthread_join(th, NULL);
    CHECK(s.ok);
    CHECK_STR(ferry_errmsg(s.f), "");
    ferry_destroy(s.f);
    pthread_barrier_destroy(&step);
}

/* One thread, many managers, some destroyed on the way: each keeps its own message. */
static void test_many_managers(void)
{
    enum { M = 24 };
    ferry *m[M];
    char want[64];
    for (int k = 0; k < M; k++) {
        m[k] = ferry_create(NULL);
        CHECK(m[k] != NULL);
        if (!m[k])
            return;
        snprintf(want, sizeof want, "m%d", k);
        CHECK(ferry_find(m[k], want) == NULL);
    }
    for (int k = 0; k < M; k += 2) {
        ferry_destroy(m[k]);
        m[k] = ferry_create(NULL);
        CHECK(m[k] != NULL);
        if (!m[k])
            return;
        snprintf(want, sizeof want, "n%d", k);
        if (k % 4 == 0)
            CHECK(ferry_find(m[k], want) == NULL);
    }
    for (int k = 0; k < M; k++) {
        if (k % 4 == 0)
            snprintf(want, sizeof want, "no tensor 'n%d'", k);
        else if (k % 2 == 0)
            snprintf(want, sizeof want, "%s", "");
        else
            snprintf(want, sizeof want, "no tensor 'm%d'", k);
        CHECK_STR(ferry_errmsg(m[k]), want);
    }
    for (int k = 0; k < M; k++)
        ferry_destroy(m[k]);
    CHECK_STR(ferry_errmsg(NULL), "no manager");
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", check_tmpdir("errmsg_threads"));
    snprintf(g_model, sizeof g_model, "%s/model.gguf", g_dir);
    if (fixture_write_llama(g_model, 2, 64, 128, 100, FERRY_DTYPE_F32))
        return 2;
    g_bad = "blk.0.attn_q.weight";
    g_dev = "blk.1.ffn_up.weight";
    g_good = "blk.0.attn_norm.weight";
    test_one_manager();
    test_recreated();
    test_many_managers();
    check_rmdir(g_dir);
    return check_finish();
}
