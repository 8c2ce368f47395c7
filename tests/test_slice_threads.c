/*
 * test_slice_threads.c — several threads make, prepare, check and release random slices of the
 * same expert tensors under a budget that holds a few experts (the rest is evicted and read
 * again), some holding a whole tensor meanwhile, on the host and on a sim device; every slice's
 * bytes are its range of the file, and every thread's handle for a range is the same.
 */
#include <pthread.h>

#include "check.h"
#include "slice_fixture.h"

#define THREADS 4
#define ROUNDS 120

static char g_gguf[1200];

typedef struct worker {
    ferry *f;
    ferry_tensor *ts[SLICE_N_GGUF_EXPERT_TS];
    ferry_tensor *first[SLICE_N_GGUF_EXPERT_TS][SLICE_EXPERTS]; /* made by main, for identity */
    unsigned seed;
    int bad;
    int refused; /* prepares refused for the budget (a set larger than what is free) */
} worker;

static unsigned next(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 16;
}

static void *work(void *arg)
{
    worker *w = arg;
    for (int r = 0; r < ROUNDS; r++) {
        ferry_tensor *set[3];
        int n = 1 + (int)(next(&w->seed) % 2);
        uint64_t first[3], count[3];
        int ti[3];
        for (int k = 0; k < n; k++) {
            ti[k] = (int)(next(&w->seed) % SLICE_N_GGUF_EXPERT_TS);
            count[k] = next(&w->seed) % 4 == 0 ? 2 : 1;
            first[k] = next(&w->seed) % (SLICE_EXPERTS - count[k] + 1);
            if (ferry_slice(w->f, w->ts[ti[k]], first[k], count[k], &set[k]) != 0) {
                fprintf(stderr, "slice: %s\n", ferry_errmsg(w->f));
                w->bad++;
                return NULL;
            }
            if (count[k] == 1 && set[k] != w->first[ti[k]][first[k]])
                w->bad++;
        }
        /* now and then the whole of a small tensor beside the slices */
        if (r % 10 == 3)
            set[n++] = w->ts[(unsigned)r % 4];
        int rc = ferry_prepare(w->f, set, (size_t)n);
        if (rc == FERRY_EBUDGET) {
            w->refused++;
            continue;
        }
        if (rc) {
            fprintf(stderr, "prepare: %s\n", ferry_errmsg(w->f));
            w->bad++;
            continue;
        }
        for (int k = 0; k < n; k++)
            if (!fixture_same_as_file(w->f, set[k])) {
                fprintf(stderr, "wrong bytes\n");
                w->bad++;
            }
        if (ferry_release(w->f, set, (size_t)n) != 0)
            w->bad++;
        if (r % 7 == 0) {
            ferry_tensor *pf = NULL;
            if (ferry_slice(w->f, w->ts[ti[0]], (first[0] + 1) % SLICE_EXPERTS, 1, &pf) == 0)
                ferry_prefetch(w->f, &pf, 1);
        }
    }
    return NULL;
}

static void run(const char *dev_spec, ferry_home home, ferry_load load)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    if (dev_spec)
        CHECK_EQ_INT(ferry_add_device(f, dev_spec, &dev), 0);
    ferry_policy p = {.home = home, .load = load, .compute_device = dev};
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    worker w[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < SLICE_N_GGUF_EXPERT_TS; i++) {
        w[0].ts[i] = ferry_find(f, slice_gguf_ts[i].name);
        CHECK(w[0].ts[i] != NULL);
        for (uint64_t e = 0; e < SLICE_EXPERTS; e++)
            CHECK_EQ_INT(ferry_slice(f, w[0].ts[i], e, 1, &w[0].first[i][e]), 0);
    }
    /* room for about five experts of the largest tensor (64 KiB each), and the small ones */
    CHECK_EQ_INT(ferry_set_budget(f, dev, 6 * 72 * 1024), 0);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        if (i) {
            memcpy(w[i].ts, w[0].ts, sizeof w[0].ts);
            memcpy(w[i].first, w[0].first, sizeof w[0].first);
        }
        w[i].f = f;
        w[i].seed = 17u + (unsigned)i * 7919u;
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    int bad = 0, refused = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += w[i].bad;
        refused += w[i].refused;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(refused < THREADS * ROUNDS / 4);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.evictions > 0);
    CHECK(st.peak_bytes[dev] <= 6 * 72 * 1024);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("slice_threads");
    snprintf(g_gguf, sizeof g_gguf, "%s/exps.gguf", dir);
    if (fixture_write(g_gguf, FERRY_FORMAT_GGUF, slice_gguf_ts,
                    sizeof slice_gguf_ts / sizeof slice_gguf_ts[0]))
        return 2;
    run(NULL, FERRY_HOME_DISK, FERRY_LOAD_READ);
    run(NULL, FERRY_HOME_DISK, FERRY_LOAD_DIRECT);
    run("sim:64MiB", FERRY_HOME_DISK, FERRY_LOAD_AUTO);
    run("sim:64MiB", FERRY_HOME_HOST, FERRY_LOAD_MMAP);
    check_rmdir(dir);
    return check_finish();
}
