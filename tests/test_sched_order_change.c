/*
 * test_sched_order_change.c — the recorded schedule (src/sched/sched.c) when
 * the access order changes for good, and when a tensor is used more than once per pass; and the
 * effect on streaming under a budget through the manager (bytes read per pass approach M - B + W
 * once the new order has been learnt).
 */
#include "check.h"
#include "core/core.h"
#include "model_fixture.h"
#include "sched/sched.h"

#define N 40

/* Six passes over positions N_POS-1 down to 0 of S; returns how often, in the last three, the
 * schedule's next position was the one that followed (*TOTAL: how often it was asked). */
static int reversed_passes(ferry__sched *s, uint32_t n_pos, int *total)
{
    int right = 0;
    for (int pass = 0; pass < 6; pass++)
        for (uint32_t k = 0; k < n_pos; k++) {
            uint32_t id = n_pos - 1 - k;
            ferry__sched_touch(s, id);
            if (pass >= 3) {
                uint32_t want = k + 1 < n_pos ? id - 1 : n_pos - 1;
                right += ferry__sched_ahead(s, 1) == want;
                (*total)++;
            }
        }
    return right;
}

/* After the order changes for good (here: reversed), the schedule must follow the new order
 * within a couple of passes: either re-recorded, or at least predicting the next tensor. */
static void test_reversed_order(void)
{
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, N, 1), 0);
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t i = 0; i < N; i++)
            ferry__sched_touch(&s, i);
    CHECK(s.complete);
    CHECK_EQ_INT(ferry__sched_ahead(&s, 1), 0); /* after N-1 comes 0 */
    int total = 0, right = reversed_passes(&s, N, &total);
    if (right < total * 9 / 10)
        fprintf(stderr, "reversed order: the schedule predicts the next tensor %d times of %d "
                        "after 3 passes in the new order (complete %d, passes %llu, len %zu)\n",
                right, total, s.complete, (unsigned long long)s.passes, s.len);
    CHECK(right >= total * 9 / 10);
    ferry__sched_free(&s);
}

/* The same with a small model (fewer than 17 positions): every backward step counts as a new
 * pass and as no miss, so the schedule is never dropped either. */
static void test_reversed_order_small(void)
{
    enum { M = 8 };
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, M, 1), 0);
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t i = 0; i < M; i++)
            ferry__sched_touch(&s, i);
    uint64_t passes0 = s.passes;
    int total = 0, right = reversed_passes(&s, M, &total);
    if (right < total * 9 / 10)
        fprintf(stderr, "reversed order (8 tensors): %d right of %d, %llu passes counted for 6\n",
                right, total, (unsigned long long)(s.passes - passes0));
    CHECK(right >= total * 9 / 10);
    CHECK(s.passes - passes0 <= 7);
    ferry__sched_free(&s);
}

/* A tensor used at every layer (a shared weight: S L0 S L1 S L2 ...). The first repeat of S must
 * not end the recording: the pass is S L0 .. S L(n-1), and every layer gets a position. */
static void test_shared_tensor(void)
{
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, N, 1), 0);
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t l = 1; l < N; l++) {
            ferry__sched_touch(&s, 0);
            ferry__sched_touch(&s, l);
        }
    int known = 0;
    for (uint32_t l = 1; l < N; l++)
        known += ferry__sched_distance(&s, l) != UINT64_MAX;
    if (known != N - 1)
        fprintf(stderr, "shared tensor: %d of %d layers have a next use in the schedule "
                        "(len %zu)\n", known, N - 1, s.len);
    CHECK_EQ_INT(known, N - 1);
    ferry__sched_free(&s);
}

/* Recording and distances, plain (regression): positions, cursor, distances modulo the pass. */
static void test_plain_cycle(void)
{
    ferry__sched s;
    CHECK_EQ_INT(ferry__sched_init(&s, 4, 1), 0);
    for (uint32_t i = 0; i < 4; i++)
        CHECK_EQ_INT(ferry__sched_touch(&s, i), 0);
    CHECK(!s.complete);
    CHECK_EQ_INT(ferry__sched_distance(&s, 2), UINT64_MAX);
    CHECK_EQ_INT(ferry__sched_touch(&s, 0), 1);
    CHECK(s.complete);
    CHECK_EQ_INT(ferry__sched_distance(&s, 0), 4);
    CHECK_EQ_INT(ferry__sched_distance(&s, 1), 1);
    CHECK_EQ_INT(ferry__sched_distance(&s, 3), 3);
    CHECK_EQ_INT(ferry__sched_ahead(&s, 1), 1);
    CHECK_EQ_INT(ferry__sched_ahead(&s, 4), FERRY__SCHED_NONE);
    CHECK_EQ_INT(ferry__sched_ahead(&s, 0), FERRY__SCHED_NONE);
    /* a tensor outside the recording: the pattern changed, recorded again from it */
    CHECK_EQ_INT(ferry__sched_resize(&s, 6), 0);
    ferry__sched_touch(&s, 5);
    CHECK(!s.complete);
    CHECK_EQ_INT(s.len, 1);
    /* disabled: nothing recorded */
    ferry__sched_free(&s);
    CHECK_EQ_INT(ferry__sched_init(&s, 4, 0), 0);
    ferry__sched_touch(&s, 1);
    CHECK_EQ_INT(s.len, 0);
    ferry__sched_free(&s);
}

/* Through the manager: home disk on the host, budget half the model, passes in file order, then
 * passes in reverse order for good. Once the new order is learnt a pass should read about
 * M - B + W again (Belady on the new order), not the whole model. */
static void test_stream_reversed(const char *path)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n, sizeof *ts);
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        ts[i] = ferry_find(f, info.name);
    }
    uint64_t model = ferry_catalog_total_bytes(c), budget = model / 2;
    CHECK_EQ_INT(ferry_set_budget(f, 0, budget), 0);
    uint64_t before = 0, per_pass[8], miss_before = 0, misses[8];
    for (int pass = 0; pass < 8; pass++) {
        for (size_t k = 0; k < n; k++) {
            size_t i = pass < 3 ? k : n - 1 - k;
            CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
            ferry_release(f, &ts[i], 1);
        }
        ferry_stats st;
        ferry_get_stats(f, &st);
        per_pass[pass] = st.bytes_read - before;
        before = st.bytes_read;
        misses[pass] = st.prefetch_misses - miss_before;
        miss_before = st.prefetch_misses;
    }
    /* M - B + W, with W generous: two of the largest tensors and the direct-I/O headroom */
    uint64_t w = 4 * (model / n) + n * 8192;
    fprintf(stderr, "stream, reversed after 3 passes: bytes per pass");
    for (int k = 0; k < 8; k++)
        fprintf(stderr, " %llu", (unsigned long long)per_pass[k]);
    fprintf(stderr, " (M %llu, M-B %llu)\n", (unsigned long long)model,
            (unsigned long long)(model - budget));
    fprintf(stderr, "prefetch misses per pass");
    for (int k = 0; k < 8; k++)
        fprintf(stderr, " %llu", (unsigned long long)misses[k]);
    fprintf(stderr, "\n");
    /* the prefetch follows the new order as well as it followed the old one */
    CHECK(misses[7] <= misses[2] + 2);
    CHECK(per_pass[2] <= model - budget + w);
    CHECK(per_pass[6] <= model - budget + w);
    CHECK(per_pass[7] <= model - budget + w);
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("sched_order_change");
    char path[1200];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    fixture_tensor ts[64];
    /* equal-sized tensors: 8 layers of 4 weights 128 x 128 f32, no 1-D tensors */
    size_t n = 0;
    for (int l = 0; l < 8; l++)
        for (int k = 0; k < 4; k++) {
            snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.w%d", l, k);
            ts[n].dtype = FERRY_DTYPE_F32;
            ts[n].ndim = 2;
            ts[n].shape[0] = 128;
            ts[n].shape[1] = 128;
            n++;
        }
    if (fixture_write(path, FERRY_FORMAT_GGUF, ts, n))
        return 2;
    test_plain_cycle();
    test_reversed_order();
    test_reversed_order_small();
    test_shared_tensor();
    test_stream_reversed(path);
    check_rmdir(dir);
    return check_finish();
}
