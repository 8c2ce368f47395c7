/*
 * test_conform_threads.c — 8 engine threads preparing and releasing overlapping sets concurrently
 * on cpu and sim, with and without budgets, each checking the bytes it got while it holds them;
 * explicit prefetch hints racing with prepares; close while prefetches are in flight.
 * Runs under TSan in `make test-tsan`.
 */
#include <pthread.h>

#include "check.h"
#include "core/core.h"
#include "devices/devices.h"
#include "model_fixture.h"

#define THREADS 8
#define REPS 60

static char g_path[1200];

typedef struct worker {
    ferry *f;
    ferry_tensor **ts;
    size_t n;
    unsigned seed;
    int failures;
    int budget_errors;
    unsigned char **want; /* file bytes per tensor */
} worker;

static int check_bytes(ferry *f, ferry_tensor *t, const unsigned char *want)
{
    uint64_t n = ferry_tensor_nbytes(t);
    void *p = ferry_tensor_data(t);
    if (!p)
        return 0;
    unsigned char *got = malloc(n ? n : 1);
    int dev = t->comp.dev; /* stable while prepared */
    ferry_device *d = f->devs[dev].d;
    int ok;
    if (f->devs[dev].p.host_accessible)
        ok = memcmp(p, want, n) == 0;
    else
        ok = ferry__device_read(d, got, p, n) == 0 && memcmp(got, want, n) == 0;
    free(got);
    return ok;
}

static void *work(void *arg)
{
    worker *w = arg;
    for (int r = 0; r < REPS; r++) {
        ferry_tensor *set[4];
        size_t k = 1 + rand_r(&w->seed) % 4;
        for (size_t i = 0; i < k; i++)
            set[i] = w->ts[rand_r(&w->seed) % w->n];
        if (rand_r(&w->seed) % 4 == 0) {
            ferry_tensor *hint = w->ts[rand_r(&w->seed) % w->n];
            ferry_prefetch(w->f, &hint, 1);
        }
        int rc = ferry_prepare(w->f, set, k);
        if (rc == FERRY_EBUDGET) {
            w->budget_errors++;
            continue;
        }
        if (rc) {
            w->failures++;
            continue;
        }
        void *ptrs[4];
        for (size_t i = 0; i < k; i++)
            ptrs[i] = ferry_tensor_data(set[i]);
        for (size_t i = 0; i < k; i++) {
            size_t idx = (size_t)set[i]->id;
            if (!check_bytes(w->f, set[i], w->want[idx]))
                w->failures++;
            if (ferry_tensor_data(set[i]) != ptrs[i]) /* stable while held */
                w->failures++;
        }
        if (ferry_release(w->f, set, k))
            w->failures++;
    }
    return NULL;
}

static void run(const char *dev_spec, ferry_home home, uint64_t budget_div)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    if (strcmp(dev_spec, "cpu"))
        CHECK_EQ_INT(ferry_add_device(f, dev_spec, &dev), 0);
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    ferry_policy p = {.home = home, .compute_device = dev, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n, sizeof *ts);
    unsigned char **want = calloc(n, sizeof *want);
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        ts[i] = ferry_find(f, info.name);
        want[i] = fixture_pread(info.file, info.offset, info.nbytes);
    }
    uint64_t model = ferry_catalog_total_bytes(c);
    if (budget_div)
        CHECK_EQ_INT(ferry_set_budget(f, home == FERRY_HOME_DISK && !dev ? 0 : dev,
                                      model / budget_div),
                     0);
    worker w[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.f = f, .ts = ts, .n = n, .seed = 1234u + (unsigned)i, .want = want};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    int failures = 0, budget_errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        failures += w[i].failures;
        budget_errors += w[i].budget_errors;
    }
    CHECK_EQ_INT(failures, 0);
    ferry_stats st;
    ferry_get_stats(f, &st);
    if (budget_div) {
        int bdev = home == FERRY_HOME_DISK && !dev ? 0 : dev;
        CHECK(st.peak_bytes[bdev] <= model / budget_div);
    }
    /* every reference was dropped: a group can go */
    CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
    fprintf(stderr, "%s home %d budget 1/%llu: %llu prepares, %d budget refusals, %llu evictions\n",
            dev_spec, (int)home, (unsigned long long)budget_div,
            (unsigned long long)st.prepares, budget_errors, (unsigned long long)st.evictions);
    for (size_t i = 0; i < n; i++)
        free(want[i]);
    free(want);
    free(ts);
    ferry_destroy(f);
}

/* Close while loads are queued and running: everything drains, nothing leaks. */
static void close_in_flight(void)
{
    for (int i = 0; i < 5; i++) {
        ferry *f = ferry_create(NULL);
        int dev;
        ferry_add_device(f, "sim:64MiB@1GB/s", &dev);
        ferry_open(f, g_path, NULL);
        ferry_policy p = {.home = FERRY_HOME_DISK, .compute_device = dev};
        ferry_group_add(f, "all", "*", &p);
        const ferry_catalog *c = ferry_catalog_of(f);
        size_t n = ferry_catalog_count(c);
        for (size_t k = 0; k < n; k++) {
            ferry_tensor_info info;
            ferry_catalog_tensor(c, k, &info);
            ferry_tensor *t = ferry_find(f, info.name);
            CHECK_EQ_INT(ferry_prefetch(f, &t, 1), 0);
        }
        /* loads are queued or running: destroy cancels and drains them (ASan checks nothing
         * leaks and nothing is touched after it is freed) */
        ferry_stats st;
        CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
        CHECK(st.resident_bytes[dev] > 0); /* the prefetches did reserve device memory */
        ferry_destroy(f);
    }
}

int main(void)
{
    const char *dir = check_tmpdir("conform_threads");
    snprintf(g_path, sizeof g_path, "%s/model.gguf", dir);
    if (fixture_write_llama(g_path, 4, 128, 256, 128, FERRY_DTYPE_F16))
        return 2;
    run("cpu", FERRY_HOME_HOST, 0);
    run("cpu", FERRY_HOME_DISK, 0);
    run("cpu", FERRY_HOME_DISK, 2);
    run("sim:64MiB", FERRY_HOME_HOST, 0);
    run("sim:64MiB@8GB/s", FERRY_HOME_HOST, 3);
    run("sim:64MiB", FERRY_HOME_DISK, 2);
    run("sim:64MiB", FERRY_HOME_DEVICE, 0);
    close_in_flight();
    check_rmdir(dir);
    return check_finish();
}
