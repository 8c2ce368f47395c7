/*
 * test_slice_guess.c — ferry_prefetch_guess, on the host and on a sim device: a guess fills free
 * room (counted in guess_bytes, a hit at its prepare, the right bytes); under a full budget it
 * evicts neither a dense tensor nor a layer's latest choice; a cached slice it names survives the
 * load that would have evicted it; a wrong guess is the first to go and is counted unused; a
 * device that fails its loads costs no error; it never loads a home copy; and several threads guessing, preparing and
 * releasing slices under a small budget always see the file's bytes within the budget.
 */
#include <pthread.h>

#include "check.h"
#include "slice_fixture.h"

#define LAYERS 2
#define UNIT (64u << 10) /* bytes of one expert slice and of one dense tensor */

static char g_path[1200];

/* Per layer: a dense tensor [256, 64] f32 and an expert tensor [256, 64, 8] f32. */
static fixture_tensor g_ts[LAYERS * 2];

static void set_tensor(fixture_tensor *t, const char *name, uint32_t ndim)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = FERRY_DTYPE_F32;
    t->ndim = ndim;
    t->shape[0] = 256;
    t->shape[1] = 64;
    t->shape[2] = ndim == 3 ? SLICE_EXPERTS : 0;
    t->shape[3] = 0;
}

typedef struct model {
    ferry *f;
    int dev;                                   /* the compute device */
    ferry_tensor *dense[LAYERS];
    ferry_tensor *exp[LAYERS][SLICE_EXPERTS];  /* expert e of layer l, a slice */
} model;

/* A manager over the model on DEVICE ("cpu" or a sim spec) with a budget of BUDGET bytes there. */
static int model_open(model *m, const char *device, uint64_t budget)
{
    memset(m, 0, sizeof *m);
    int cpu = strcmp(device, "cpu") == 0;
    ferry_options o = {.host_budget = cpu ? budget : 0, .no_schedule = 1};
    m->f = ferry_create(&o);
    CHECK(m->f != NULL);
    if (!m->f)
        return -1;
    if (!cpu) {
        CHECK_EQ_INT(ferry_add_device(m->f, device, &m->dev), 0);
        CHECK_EQ_INT(ferry_set_budget(m->f, m->dev, budget), 0);
    }
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .experts = 1,
                      .compute_device = m->dev};
    CHECK_EQ_INT(ferry_open(m->f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(m->f, "all", "*", &p), 0);
    for (int l = 0; l < LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        m->dense[l] = ferry_find(m->f, name);
        CHECK(m->dense[l] != NULL);
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
        ferry_tensor *t = ferry_find(m->f, name);
        CHECK(t != NULL);
        for (int e = 0; e < SLICE_EXPERTS; e++)
            CHECK_EQ_INT(ferry_slice(m->f, t, (uint64_t)e, 1, &m->exp[l][e]), 0);
    }
    return 0;
}

/* Prepares T alone, checks its bytes, releases it. */
static void use(model *m, ferry_tensor *t)
{
    CHECK_EQ_INT(ferry_prepare(m->f, &t, 1), 0);
    CHECK(fixture_same_as_file(m->f, t));
    CHECK_EQ_INT(ferry_release(m->f, &t, 1), 0);
}

/* 1 when T is still cached: its prepare finds it (no miss) and reads nothing. */
static int cached(model *m, ferry_tensor *t)
{
    ferry_stats a, b;
    ferry_get_stats(m->f, &a);
    use(m, t);
    ferry_get_stats(m->f, &b);
    return b.prefetch_misses == a.prefetch_misses && b.bytes_read == a.bytes_read;
}

static ferry_stats stats_idle(model *m)
{
    CHECK_EQ_INT(ferry_release_all(m->f), 0); /* waits for the guesses in flight */
    ferry_stats st;
    ferry_get_stats(m->f, &st);
    return st;
}

/* Free room: the guess loads, its prepare is a hit with the right bytes, nothing unused. */
static void test_free_room(const char *device)
{
    model m;
    if (model_open(&m, device, 8 * UNIT))
        return;
    ferry_tensor *g[2] = {m.exp[1][3], m.exp[1][5]};
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, g, 2), 0);
    ferry_stats st = stats_idle(&m);
    CHECK_EQ_INT(st.guess_bytes, 2 * UNIT);
    CHECK_EQ_INT(st.bytes_read, 2 * UNIT);
    CHECK_EQ_INT(ferry_prepare(m.f, g, 2), 0);
    CHECK(fixture_same_as_file(m.f, g[0]));
    CHECK(fixture_same_as_file(m.f, g[1]));
    CHECK_EQ_INT(ferry_release(m.f, g, 2), 0);
    ferry_get_stats(m.f, &st);
    CHECK_EQ_INT(st.prefetch_hits, 2);
    CHECK_EQ_INT(st.prefetch_misses, 0);
    CHECK_EQ_INT(st.bytes_read, 2 * UNIT);
    CHECK_EQ_INT(st.guess_unused_bytes, 0);
    ferry_destroy(m.f);
}

/* A full budget of a dense tensor and layer 0's latest choice: a guess evicts none of them. */
static void test_full_budget(const char *device)
{
    model m;
    if (model_open(&m, device, 3 * UNIT + UNIT / 2))
        return;
    use(&m, m.dense[0]);
    ferry_tensor *choice[2] = {m.exp[0][1], m.exp[0][2]};
    CHECK_EQ_INT(ferry_prepare(m.f, choice, 2), 0);
    CHECK_EQ_INT(ferry_release(m.f, choice, 2), 0);
    ferry_stats a = stats_idle(&m);
    ferry_tensor *g[3] = {m.exp[1][3], m.exp[1][4], m.exp[0][6]};
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, g, 3), 0);
    ferry_stats b = stats_idle(&m);
    CHECK_EQ_INT(b.guess_bytes, 0);
    CHECK_EQ_INT(b.bytes_read, a.bytes_read);
    CHECK(cached(&m, m.dense[0]));
    CHECK(cached(&m, choice[0]));
    CHECK(cached(&m, choice[1]));
    ferry_destroy(m.f);
}

/* Three slices cached (A, B of layer 1; X of layer 0, the latest), a budget for three, then a
 * load of Y (layer 0). With GUESSED >= 0 the cached slice of that index is guessed first. Returns
 * 1 when candidate PROBE is still cached after Y's load. */
static int survives(const char *device, int guessed, int probe)
{
    model m;
    if (model_open(&m, device, 3 * UNIT + UNIT / 2))
        return -1;
    ferry_tensor *c[3] = {m.exp[1][0], m.exp[1][1], m.exp[0][5]};
    for (int i = 0; i < 3; i++)
        use(&m, c[i]);
    if (guessed >= 0)
        CHECK_EQ_INT(ferry_prefetch_guess(m.f, &c[guessed], 1), 0);
    use(&m, m.exp[0][6]);
    int r = cached(&m, c[probe]);
    ferry_destroy(m.f);
    return r;
}

/* The slice a demand load would evict survives it when a guess names it; another goes instead. */
static void test_kept(const char *device)
{
    int victim = -1, gone = 0;
    for (int i = 0; i < 3; i++)
        if (!survives(device, -1, i)) {
            victim = i;
            gone++;
        }
    CHECK_EQ_INT(gone, 1);
    if (victim < 0)
        return;
    CHECK_EQ_INT(survives(device, victim, victim), 1);
    int others_gone = 0;
    for (int i = 0; i < 3; i++)
        if (i != victim)
            others_gone += !survives(device, victim, i);
    CHECK_EQ_INT(others_gone, 1);
}

/* A guess that its layer's prepare does not use goes first, and is counted unused. */
static void test_wrong_guess(const char *device)
{
    model m;
    if (model_open(&m, device, 4 * UNIT + UNIT / 2))
        return;
    ferry_tensor *g = m.exp[1][2];
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, &g, 1), 0);
    ferry_stats st = stats_idle(&m);
    CHECK_EQ_INT(st.guess_bytes, UNIT);
    use(&m, m.exp[1][3]); /* layer 1's choice was another: a wrong guess */
    use(&m, m.exp[0][0]);
    use(&m, m.exp[0][1]);
    st = stats_idle(&m);
    CHECK_EQ_INT(st.guess_unused_bytes, 0); /* four units fit: nothing evicted yet */
    use(&m, m.exp[0][2]);
    st = stats_idle(&m);
    CHECK_EQ_INT(st.guess_unused_bytes, UNIT);
    CHECK(cached(&m, m.exp[1][3]));
    CHECK(cached(&m, m.exp[0][0]));
    CHECK(cached(&m, m.exp[0][1]));
    ferry_destroy(m.f);
}

/* A device that fails allocations and copies: a guess's failed load is no error, and the prepare
 * after it loads the slice itself. */
static void test_faults(void)
{
    static const char *specs[] = {"sim:64MiB,fail_alloc=1", "fault:sim:64MiB,fail_copy=1",
                                  "fault:sim:64MiB,fail_alloc=2"};
    for (size_t k = 0; k < 3; k++) {
        model m;
        if (model_open(&m, specs[k], 8 * UNIT))
            continue;
        ferry_tensor *g[2] = {m.exp[0][1], m.exp[0][7]};
        CHECK_EQ_INT(ferry_prefetch_guess(m.f, g, 2), 0);
        stats_idle(&m);
        CHECK_EQ_INT(ferry_prepare(m.f, g, 2), 0);
        CHECK(fixture_same_as_file(m.f, g[0]));
        CHECK(fixture_same_as_file(m.f, g[1]));
        CHECK_EQ_INT(ferry_release(m.f, g, 2), 0);
        ferry_destroy(m.f);
    }
}

static void test_errors(void)
{
    model m;
    if (model_open(&m, "cpu", 2 * UNIT + UNIT / 2))
        return;
    ferry_tensor *s = m.exp[0][0];
    CHECK_EQ_INT(ferry_prefetch_guess(NULL, &s, 1), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, NULL, 1), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, NULL, 0), 0);
    /* a tensor that is no slice takes free room only */
    use(&m, m.exp[0][0]);
    use(&m, m.exp[0][1]);
    ferry_stats a = stats_idle(&m);
    CHECK_EQ_INT(ferry_prefetch_guess(m.f, &m.dense[1], 1), 0);
    ferry_stats b = stats_idle(&m);
    CHECK_EQ_INT(b.bytes_read, a.bytes_read);
    CHECK(cached(&m, m.exp[0][0]));
    CHECK(cached(&m, m.exp[0][1]));
    ferry_destroy(m.f);
}

/* A guess never loads a home copy, which would hold its room for good. */
static void test_home_copy(void)
{
    ferry_options o = {.host_budget = 8 * UNIT, .no_schedule = 1};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .experts = 1};
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, "blk.0.ffn_up_exps.weight"), *s = NULL;
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_slice(f, t, 3, 1, &s), 0);
    CHECK_EQ_INT(ferry_prefetch_guess(f, &s, 1), 0);
    CHECK_EQ_INT(ferry_release_all(f), 0);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK_EQ_INT(st.bytes_read, 0);
    CHECK_EQ_INT(st.guess_bytes, 0);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), 0);
    CHECK(fixture_same_as_file(f, s));
    CHECK_EQ_INT(ferry_release(f, &s, 1), 0);
    ferry_destroy(f);
}

#define THREADS 4
#define ROUNDS 150

typedef struct worker {
    model *m;
    unsigned seed;
    uint64_t budget;
    int bad;
} worker;

static unsigned next(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 16;
}

static void *work(void *arg)
{
    worker *w = arg;
    model *m = w->m;
    for (int r = 0; r < ROUNDS; r++) {
        int l = (int)(next(&w->seed) % LAYERS);
        ferry_tensor *g[2] = {m->exp[l][next(&w->seed) % SLICE_EXPERTS],
                              m->exp[(l + 1) % LAYERS][next(&w->seed) % SLICE_EXPERTS]};
        ferry_prefetch_guess(m->f, g, 2);
        ferry_tensor *set[2] = {m->exp[l][next(&w->seed) % SLICE_EXPERTS], m->dense[l]};
        int rc = ferry_prepare(m->f, set, 2);
        if (rc == FERRY_EBUDGET)
            continue; /* the other threads hold the room */
        if (rc) {
            w->bad++;
            continue;
        }
        w->bad += !fixture_same_as_file(m->f, set[0]) || !fixture_same_as_file(m->f, set[1]);
        ferry_stats st;
        ferry_get_stats(m->f, &st);
        w->bad += st.resident_bytes[m->dev] > w->budget;
        ferry_release(m->f, set, 2);
    }
    return NULL;
}

static void test_threads(const char *device)
{
    model m;
    uint64_t budget = 10 * UNIT + UNIT / 2;
    if (model_open(&m, device, budget))
        return;
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.m = &m, .seed = 7u + (unsigned)i, .budget = budget};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += w[i].bad;
    }
    CHECK_EQ_INT(bad, 0);
    ferry_stats st = stats_idle(&m);
    CHECK(st.peak_bytes[m.dev] <= budget);
    CHECK(st.guess_unused_bytes <= st.guess_bytes);
    ferry_destroy(m.f);
}

int main(void)
{
    const char *dir = check_tmpdir("slice_guess");
    snprintf(g_path, sizeof g_path, "%s/moe.gguf", dir);
    for (int l = 0; l < LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        set_tensor(&g_ts[2 * l], name, 2);
        snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", l);
        set_tensor(&g_ts[2 * l + 1], name, 3);
    }
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, g_ts, LAYERS * 2))
        return 2;
    static const char *devices[] = {"cpu", "sim:64MiB"};
    for (int d = 0; d < 2; d++) {
        test_free_room(devices[d]);
        test_full_budget(devices[d]);
        test_kept(devices[d]);
        test_wrong_guess(devices[d]);
        test_threads(devices[d]);
    }
    test_faults();
    test_home_copy();
    test_errors();
    check_rmdir(dir);
    return check_finish();
}
