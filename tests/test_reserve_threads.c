/*
 * test_reserve_threads.c — ferry_reserve while other threads stream a model through the same
 * device: the budget holds whatever the interleaving (the reservation, copies in use, cached and
 * in flight together never above it), a prepare that finds no room fails with FERRY_EBUDGET and
 * leaves the manager usable, every prepared tensor holds the file's bytes, and giving the
 * reservation back returns exactly its bytes.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

#define THREADS 3
#define ROUNDS 6

static char g_model[1200];

typedef struct worker {
    ferry *f;
    ferry_tensor **ts;
    size_t n;
    int seed;
    int ok, refused, wrong, other;
} worker;

static void *stream(void *arg)
{
    worker *w = arg;
    for (int r = 0; r < ROUNDS; r++)
        for (size_t k = 0; k < w->n; k++) {
            ferry_tensor *t = w->ts[(k + (size_t)w->seed * 3) % w->n];
            int rc = ferry_prepare(w->f, &t, 1);
            if (rc == FERRY_EBUDGET) {
                w->refused++;
                continue;
            }
            if (rc) {
                w->other++;
                continue;
            }
            w->ok++;
            if ((k + (size_t)r) % 5 == 0 && !fixture_same_as_file(w->f, t))
                w->wrong++;
            ferry_release(w->f, &t, 1);
        }
    return NULL;
}

typedef struct reserver {
    ferry *f;
    int dev;
    uint64_t budget;
    atomic_int done;          /* the streamers have finished */
    int ok, refused, other;
} reserver;

/* Reserves 0, 1/8, ... 7/8 of the budget in turn until the streamers finish. */
static void *reserve_loop(void *arg)
{
    reserver *r = arg;
    for (int i = 0; !atomic_load(&r->done) || i < 16; i++) {
        uint64_t want = r->budget / 8 * (uint64_t)(i % 8);
        int rc = ferry_reserve(r->f, r->dev, want);
        if (rc == 0)
            r->ok++;
        else if (rc == FERRY_EBUDGET)
            r->refused++;
        else
            r->other++;
        ferry_device_info di;
        if (ferry_get_device_info(r->f, r->dev, &di) == 0 && di.used_bytes > r->budget)
            r->other++;
    }
    return NULL;
}

static void run_on(const char *spec, ferry_home home)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    if (strcmp(spec, "cpu") != 0)
        CHECK_EQ_INT(ferry_add_device(f, spec, &dev), 0);
    ferry_policy p = {.home = home, .load = FERRY_LOAD_READ, .compute_device = dev};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    if (!ts) {
        ferry_destroy(f);
        return;
    }
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    uint64_t budget = model / 2;
    CHECK_EQ_INT(ferry_set_budget(f, dev, budget), 0);
    ferry_device_info di;

    worker w[THREADS];
    pthread_t th[THREADS + 1];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.f = f, .ts = ts, .n = n, .seed = i};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, stream, &w[i]), 0);
    }
    reserver r = {.f = f, .dev = dev, .budget = budget};
    atomic_init(&r.done, 0);
    CHECK_EQ_INT(pthread_create(&th[THREADS], NULL, reserve_loop, &r), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&r.done, 1);
    pthread_join(th[THREADS], NULL);

    int ok = 0, wrong = 0, other = 0;
    for (int i = 0; i < THREADS; i++) {
        ok += w[i].ok;
        wrong += w[i].wrong;
        other += w[i].other;
    }
    fprintf(stderr, "%s: prepares ok %d, refused %d/%d/%d; reserves ok %d, refused %d\n", spec,
            ok, w[0].refused, w[1].refused, w[2].refused, r.ok, r.refused);
    CHECK(ok > 0);
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(other, 0);
    CHECK_EQ_INT(r.other, 0);
    CHECK(r.ok > 0);
    ferry_stats st;
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    CHECK(st.peak_bytes[dev] <= budget);

    /* nothing in use now: a reservation replaced and given back returns exactly its bytes */
    CHECK_EQ_INT(ferry_reserve(f, dev, budget / 4), 0);
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &di), 0);
    uint64_t with = di.used_bytes;
    CHECK_EQ_INT(ferry_reserve(f, dev, 0), 0);
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &di), 0);
    CHECK_EQ_INT(di.used_bytes, with - budget / 4);
    /* and the manager still streams */
    for (size_t k = 0; k < n; k++) {
        CHECK_EQ_INT(ferry_prepare(f, &ts[k], 1), 0);
        ferry_release(f, &ts[k], 1);
    }
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("reserve_threads");
    snprintf(g_model, sizeof g_model, "%s/model.gguf", dir);
    if (fixture_write_llama(g_model, 6, 128, 256, 500, FERRY_DTYPE_F32))
        return 2;
    run_on("sim:64MiB", FERRY_HOME_HOST);
    run_on("cpu", FERRY_HOME_DISK);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
