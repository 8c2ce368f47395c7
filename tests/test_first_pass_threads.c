/*
 * test_first_pass_threads.c — the first pass, before a schedule exists, through the manager:
 * prepares in file order are prefetched ahead (hits from the second prepare on, no byte read
 * twice, never over the budget, a held tensor never moved); prepares out of file order stop it
 * after one window; no_schedule and home copies get no guesses. The loader threads race the
 * prepares, hence the name (TSan runs it).
 */
#include "check.h"
#include "model_fixture.h"

#define LAYERS 8
#define PER_LAYER 4

typedef struct pass_stats {
    uint64_t read, hits, misses;
} pass_stats;

static ferry *open_model(const char *path, int no_schedule, ferry_home home, uint64_t budget,
                         ferry_tensor ***ts, size_t *n)
{
    ferry_options o = {.no_schedule = no_schedule, .host_budget = budget};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = home, .load = FERRY_LOAD_READ};
    *ts = f ? fixture_open_all(f, path, &p, n) : NULL;
    CHECK(*ts != NULL && *n == LAYERS * PER_LAYER);
    if (!*ts || *n != LAYERS * PER_LAYER) {
        free(*ts);
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

static ferry_stats stats_of(ferry *f)
{
    ferry_stats st;
    ferry_get_stats(f, &st);
    return st;
}

/* Prepares ORDER[0..n) one by one, each checked against the file and released. */
static pass_stats run_pass(ferry *f, ferry_tensor **ts, const size_t *order, size_t n)
{
    ferry_stats a = stats_of(f);
    int ok = 1;
    for (size_t k = 0; k < n && ok; k++) {
        ferry_tensor *t = ts[order[k]];
        ok = ferry_prepare(f, &t, 1) == 0;
        if (ok) {
            ok = fixture_same_as_file(f, t);
            ferry_release(f, &t, 1);
        }
    }
    if (!ok)
        fprintf(stderr, "first pass: %s\n", ferry_errmsg(f));
    CHECK(ok);
    ferry_stats b = stats_of(f);
    return (pass_stats){.read = b.bytes_read - a.bytes_read,
                        .hits = b.prefetch_hits - a.prefetch_hits,
                        .misses = b.prefetch_misses - a.prefetch_misses};
}

static void test_in_file_order(const char *path, uint64_t model)
{
    ferry_tensor **ts;
    size_t n;
    uint64_t budget = model / 2;
    ferry *f = open_model(path, 0, FERRY_HOME_DISK, budget, &ts, &n);
    if (!f)
        return;
    size_t order[LAYERS * PER_LAYER] = {0};
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    pass_stats p1 = run_pass(f, ts, order, n);
    /* the first prepare misses; every later one finds its tensor fetched or in flight */
    if (p1.hits + 1 < n)
        fprintf(stderr, "first pass in file order: %llu hits, %llu misses of %zu\n",
                (unsigned long long)p1.hits, (unsigned long long)p1.misses, n);
    CHECK(p1.hits + 1 >= n);
    CHECK_EQ_INT(p1.read, model); /* each tensor read once */
    ferry_stats st = stats_of(f);
    CHECK(st.peak_bytes[0] <= budget);
    /* the later passes as before: about M - B + W */
    pass_stats p2 = run_pass(f, ts, order, n), p3 = run_pass(f, ts, order, n);
    uint64_t w = 4 * (model / n) + n * 8192;
    CHECK(p2.read <= model - budget + w);
    CHECK(p3.read <= model - budget + w);
    CHECK(stats_of(f).peak_bytes[0] <= budget);
    free(ts);
    ferry_destroy(f);
}

static void test_out_of_order(const char *path, uint64_t model)
{
    ferry_tensor **ts;
    size_t n;
    uint64_t tensor = model / (LAYERS * PER_LAYER);
    ferry *f = open_model(path, 0, FERRY_HOME_DISK, model / 2, &ts, &n);
    if (!f)
        return;
    /* three in file order, then layers from the back: one window wasted at most, then no
     * guesses (no hits) for the rest of the pass */
    size_t order[LAYERS * PER_LAYER] = {0}, k = 0;
    for (size_t i = 0; i < 3; i++)
        order[k++] = i;
    for (size_t l = LAYERS; l-- > 1;)
        for (size_t j = 0; j < PER_LAYER; j++)
            order[k++] = l * PER_LAYER + j;
    order[k++] = 3;
    CHECK_EQ_INT(k, n);
    pass_stats p1 = run_pass(f, ts, order, n);
    CHECK_EQ_INT(p1.hits, 3); /* 1, 2, and 3 at the end: the last guess, still cached */
    CHECK(p1.read <= model + tensor);
    free(ts);
    ferry_destroy(f);

    /* backwards from the start: the second prepare stops it, nothing is fetched on a guess */
    f = open_model(path, 0, FERRY_HOME_DISK, model / 2, &ts, &n);
    if (!f)
        return;
    for (size_t i = 0; i < n; i++)
        order[i] = n - 1 - i;
    p1 = run_pass(f, ts, order, n);
    CHECK_EQ_INT(p1.hits, 0);
    CHECK_EQ_INT(p1.read, model);
    free(ts);
    ferry_destroy(f);
}

static void test_no_guesses(const char *path, uint64_t model)
{
    ferry_tensor **ts;
    size_t n;
    size_t order[LAYERS * PER_LAYER] = {0};
    for (size_t i = 0; i < LAYERS * PER_LAYER; i++)
        order[i] = i;
    /* no_schedule: no order recorded, none followed */
    ferry *f = open_model(path, 1, FERRY_HOME_DISK, model / 2, &ts, &n);
    if (!f)
        return;
    pass_stats p1 = run_pass(f, ts, order, n);
    CHECK_EQ_INT(p1.hits, 0);
    CHECK_EQ_INT(p1.read, model);
    free(ts);
    ferry_destroy(f);

    /* home host: a guess never loads a home copy (it would hold its memory for good) */
    f = open_model(path, 0, FERRY_HOME_HOST, 0, &ts, &n);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_prepare(f, &ts[0], 1), 0);
    ferry_release(f, &ts[0], 1);
    ferry_release_all(f); /* waits for prefetches in flight */
    ferry_stats st = stats_of(f);
    CHECK(st.home_host_bytes >= model / n && st.home_host_bytes < 2 * model / n);
    CHECK_EQ_INT(st.bytes_read, model / n);
    free(ts);
    ferry_destroy(f);
}

/* A tensor held through the whole first pass under a budget of a few tensors: prefetches in
 * file order go on around it, and it stays where it was, with its bytes. */
static void test_held(const char *path, uint64_t model)
{
    ferry_tensor **ts;
    size_t n;
    uint64_t tensor = model / (LAYERS * PER_LAYER);
    uint64_t budget = 3 * (tensor + 8192);
    ferry *f = open_model(path, 0, FERRY_HOME_DISK, budget, &ts, &n);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_prepare(f, &ts[0], 1), 0);
    const void *held = ferry_tensor_data(ts[0]);
    int ok = 1;
    for (size_t i = 1; i < n && ok; i++) {
        ok = ferry_prepare(f, &ts[i], 1) == 0;
        if (ok) {
            ok = fixture_same_as_file(f, ts[i]) && ferry_tensor_data(ts[0]) == held;
            ferry_release(f, &ts[i], 1);
        }
    }
    if (!ok)
        fprintf(stderr, "held through the first pass: %s\n", ferry_errmsg(f));
    CHECK(ok);
    CHECK(fixture_same_as_file(f, ts[0]));
    CHECK(stats_of(f).peak_bytes[0] <= budget);
    ferry_release(f, &ts[0], 1);
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("first_pass");
    char path[1200];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    fixture_tensor ts[LAYERS * PER_LAYER];
    /* equal-sized tensors: 8 layers of 4 weights 128 x 128 f32 */
    size_t n = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < PER_LAYER; k++) {
            snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.w%d", l, k);
            ts[n].dtype = FERRY_DTYPE_F32;
            ts[n].ndim = 2;
            ts[n].shape[0] = 128;
            ts[n].shape[1] = 128;
            n++;
        }
    if (fixture_write(path, FERRY_FORMAT_GGUF, ts, n))
        return 2;
    uint64_t model = (uint64_t)n * 128 * 128 * 4;
    test_in_file_order(path, model);
    test_out_of_order(path, model);
    test_no_guesses(path, model);
    test_held(path, model);
    check_rmdir(dir);
    return check_finish();
}
