/*
 * test_slice_evict.c — slices under a host budget shared with dense tensors: on a routing trace
 * with locality (per layer a skewed choice of 2 of 8 experts, often the last token's again) over
 * the slices of 3-D expert tensors, with each layer's dense tensor prepared every token, the
 * expert policy (FERRY_SLICE_EVICT_EXPERT) reads fewer bytes per token than the cyclic one
 * (FERRY_SLICE_EVICT_CYCLIC) on the same trace; every prepare works under the budget (dense
 * tensors never starved), bytes are right and the budget is never exceeded, with either policy,
 * also under a budget that barely holds one layer's sets. And where the budget holds every dense
 * tensor in the 2 MiB pages their copies take, beside some of the experts, no dense tensor is
 * read twice: the dense kind's share counts its copies as the budget does.
 */
#include "check.h"
#include "slice_fixture.h"

#define LAYERS 4
#define KINDS 2 /* expert tensors per layer */
#define K 2     /* experts per token */
#define TOKENS 160

static char g_path[1200];

/* Per layer: two expert tensors [256, 64, 8] f32 (64 KiB per expert) and one dense tensor
 * [256, 64] f32 (64 KiB); and the output. */
static fixture_tensor g_ts[LAYERS * (KINDS + 1) + 1];

static void set_tensor(fixture_tensor *t, const char *name, uint32_t ndim, int64_t outer)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = FERRY_DTYPE_F32;
    t->ndim = ndim;
    t->shape[0] = 256;
    t->shape[1] = 64;
    t->shape[2] = outer;
    t->shape[3] = 0;
}

static size_t make_tensors(void)
{
    size_t n = 0;
    for (int l = 0; l < LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        set_tensor(&g_ts[n++], name, 2, 0);
        for (int k = 0; k < KINDS; k++) {
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, k ? "down" : "up");
            set_tensor(&g_ts[n++], name, 3, SLICE_EXPERTS);
        }
    }
    set_tensor(&g_ts[n++], "output.weight", 2, 0);
    return n;
}

static unsigned rnd(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 16) & 0x7fff;
}

/* The trace: per token and layer K distinct experts; half the time the last token's choice of
 * that layer, else drawn with weight 1/(rank+1) over a per-layer ranking of the experts. */
static void make_trace(uint32_t trace[TOKENS][LAYERS][K])
{
    unsigned seed = 11;
    uint32_t rank[LAYERS][SLICE_EXPERTS];
    for (int l = 0; l < LAYERS; l++) {
        for (int e = 0; e < SLICE_EXPERTS; e++)
            rank[l][e] = (uint32_t)e;
        for (int e = SLICE_EXPERTS - 1; e > 0; e--) {
            int j = (int)(rnd(&seed) % (unsigned)(e + 1));
            uint32_t x = rank[l][e];
            rank[l][e] = rank[l][j], rank[l][j] = x;
        }
    }
    double total = 0;
    for (int r = 0; r < SLICE_EXPERTS; r++)
        total += 1.0 / (r + 1);
    for (int t = 0; t < TOKENS; t++)
        for (int l = 0; l < LAYERS; l++) {
            if (t > 0 && rnd(&seed) % 2 == 0) {
                for (int k = 0; k < K; k++)
                    trace[t][l][k] = trace[t - 1][l][k];
                continue;
            }
            for (int k = 0; k < K; k++) {
                uint32_t e;
                int again;
                do {
                    double u = (rnd(&seed) / 32768.0) * total, acc = 0;
                    int r = 0;
                    while (r < SLICE_EXPERTS - 1 && (acc += 1.0 / (r + 1)) < u)
                        r++;
                    e = rank[l][r];
                    again = 0;
                    for (int j = 0; j < k; j++)
                        again |= trace[t][l][j] == e;
                } while (again);
                trace[t][l][k] = e;
            }
        }
}

typedef struct run_result {
    int ok;                 /* every prepare worked, bytes right, within the budget */
    uint64_t bytes_read;    /* per token, after the first */
    uint64_t dense_fail;    /* dense prepares that failed */
} run_result;

/* Runs the trace under a host budget of BUDGET with slice eviction MODE. */
static run_result run(ferry_slice_evict mode, uint64_t budget,
                      const uint32_t trace[TOKENS][LAYERS][K])
{
    run_result r = {.ok = 1};
    ferry_options o = {.host_budget = budget, .slice_evict = mode};
    ferry *f = ferry_create(&o);
    CHECK(f != NULL);
    if (!f) {
        r.ok = 0;
        return r;
    }
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .experts = 1};
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *dense[LAYERS + 1], *exps[LAYERS][KINDS][SLICE_EXPERTS];
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        dense[l] = ferry_find(f, name);
        CHECK(dense[l] != NULL);
        for (int k = 0; k < KINDS; k++) {
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, k ? "down" : "up");
            ferry_tensor *t = ferry_find(f, name);
            CHECK(t != NULL);
            for (int e = 0; e < SLICE_EXPERTS; e++)
                CHECK_EQ_INT(ferry_slice(f, t, (uint64_t)e, 1, &exps[l][k][e]), 0);
        }
    }
    dense[LAYERS] = ferry_find(f, "output.weight");
    CHECK(dense[LAYERS] != NULL);
    uint64_t first = 0;
    for (int t = 0; t < TOKENS; t++) {
        for (int l = 0; l <= LAYERS; l++) {
            if (ferry_prepare(f, &dense[l], 1) != 0) {
                fprintf(stderr, "token %d: dense prepare of layer %d: %s\n", t, l,
                        ferry_errmsg(f));
                r.dense_fail++;
                r.ok = 0;
            } else {
                if (t % 40 == 0)
                    r.ok &= fixture_same_as_file(f, dense[l]);
                ferry_release(f, &dense[l], 1);
            }
            if (l == LAYERS)
                break;
            ferry_tensor *set[KINDS * K];
            size_t n = 0;
            for (int k = 0; k < KINDS; k++)
                for (int j = 0; j < K; j++)
                    set[n++] = exps[l][k][trace[t][l][j]];
            if (ferry_prepare(f, set, n) != 0) {
                fprintf(stderr, "token %d: experts of layer %d: %s\n", t, l, ferry_errmsg(f));
                r.ok = 0;
                continue;
            }
            if (t % 40 == 1)
                for (size_t i = 0; i < n; i++)
                    r.ok &= fixture_same_as_file(f, set[i]);
            ferry_stats st;
            ferry_get_stats(f, &st);
            r.ok &= st.resident_bytes[0] <= budget;
            ferry_release(f, set, n);
        }
        if (t == 0) {
            ferry_stats st;
            ferry_get_stats(f, &st);
            first = st.bytes_read;
        }
    }
    ferry_stats st;
    ferry_get_stats(f, &st);
    r.ok &= st.peak_bytes[0] <= budget;
    r.bytes_read = (st.bytes_read - first) / (TOKENS - 1);
    ferry_destroy(f);
    return r;
}

static void test_expert_reads_less(const uint32_t trace[TOKENS][LAYERS][K])
{
    /* the dense tensors (320 KiB) and about 40% of the experts' 4 MiB */
    uint64_t budget = 2u << 20;
    run_result cyc = run(FERRY_SLICE_EVICT_CYCLIC, budget, trace);
    run_result exp = run(FERRY_SLICE_EVICT_EXPERT, budget, trace);
    CHECK(cyc.ok);
    CHECK(exp.ok);
    CHECK_EQ_INT((int)exp.dense_fail, 0);
    fprintf(stderr, "bytes read per token: cyclic %llu, expert %llu\n",
            (unsigned long long)cyc.bytes_read, (unsigned long long)exp.bytes_read);
    CHECK(exp.bytes_read < cyc.bytes_read);
}

/* A budget that barely holds one dense tensor and one layer's experts beside the cached rest:
 * every prepare still works with either policy. */
static void test_tight_budget(const uint32_t trace[TOKENS][LAYERS][K])
{
    uint64_t unit = 64u << 10, slack = 64u << 10;
    uint64_t budget = unit + KINDS * K * unit + slack;
    for (int m = FERRY_SLICE_EVICT_EXPERT; m <= FERRY_SLICE_EVICT_CYCLIC; m++) {
        run_result r = run((ferry_slice_evict)m, budget, trace);
        CHECK(r.ok);
        CHECK_EQ_INT((int)r.dense_fail, 0);
    }
}

/* Dense tensors whose copies take more than their bytes (2.3 MiB rows, each copy in two 2 MiB
 * pages) and experts: with a budget of the dense copies' pages and about a third of the experts,
 * after the first tokens no token reads a dense tensor again (a token's experts are 16 x 64 KiB
 * at most, a dense tensor 2.3 MiB). */
static void test_dense_kept_in_pages(const uint32_t trace[TOKENS][LAYERS][K], const char *dir)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/pages.gguf", dir);
    fixture_tensor ts[LAYERS * (KINDS + 1) + 1];
    size_t n = 0;
    for (int l = 0; l < LAYERS; l++) {
        snprintf(ts[n].name, sizeof ts[n].name, "blk.%d.attn_q.weight", l);
        ts[n].dtype = FERRY_DTYPE_F32;
        ts[n].ndim = 2;
        ts[n].shape[0] = 600; /* 600 x 1000 f32: 2.29 MiB */
        ts[n].shape[1] = 1000;
        ts[n].shape[2] = ts[n].shape[3] = 0;
        n++;
        for (int k = 0; k < KINDS; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, k ? "down" : "up");
            set_tensor(&ts[n++], name, 3, SLICE_EXPERTS);
        }
    }
    ts[n] = ts[0];
    snprintf(ts[n].name, sizeof ts[n].name, "output.weight");
    n++;
    CHECK_EQ_INT(fixture_write(path, FERRY_FORMAT_GGUF, ts, n), 0);
    const uint64_t dense_bytes = 600u * 1000u * 4u, page = 2u << 20, expert = 64u << 10;
    uint64_t budget = (LAYERS + 1) * 2 * page + LAYERS * KINDS * SLICE_EXPERTS * expert / 3;
    ferry_options o = {.host_budget = budget};
    ferry *f = ferry_create(&o);
    CHECK(f != NULL);
    if (!f)
        return;
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .experts = 1};
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *dense[LAYERS + 1], *exps[LAYERS][KINDS][SLICE_EXPERTS];
    for (int l = 0; l < LAYERS; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        CHECK((dense[l] = ferry_find(f, name)) != NULL);
        for (int k = 0; k < KINDS; k++) {
            snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", l, k ? "down" : "up");
            ferry_tensor *t = ferry_find(f, name);
            CHECK(t != NULL);
            for (int e = 0; e < SLICE_EXPERTS && t; e++)
                CHECK_EQ_INT(ferry_slice(f, t, (uint64_t)e, 1, &exps[l][k][e]), 0);
        }
    }
    CHECK((dense[LAYERS] = ferry_find(f, "output.weight")) != NULL);
    uint64_t most = 0;
    for (int t = 0; t < TOKENS && check_failed == 0; t++) {
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        for (int l = 0; l <= LAYERS; l++) {
            CHECK_EQ_INT(ferry_prepare(f, &dense[l], 1), 0);
            ferry_release(f, &dense[l], 1);
            if (l == LAYERS)
                break;
            ferry_tensor *set[KINDS * K];
            size_t m = 0;
            for (int k = 0; k < KINDS; k++)
                for (int j = 0; j < K; j++)
                    set[m++] = exps[l][k][trace[t][l][j]];
            CHECK_EQ_INT(ferry_prepare(f, set, m), 0);
            ferry_release(f, set, m);
        }
        ferry_get_stats(f, &s1);
        uint64_t read = s1.bytes_read - s0.bytes_read;
        if (t >= 2 && read > most)
            most = read;
    }
    fprintf(stderr, "dense in pages: most bytes a token reads after the first two %llu (a dense "
            "tensor %llu)\n", (unsigned long long)most, (unsigned long long)dense_bytes);
    CHECK(most < dense_bytes);
    ferry_destroy(f);
    remove(path);
}

/* Row ranges of 2-D tensors streamed in a fixed order (FERRY_SLICE_EVICT_CYCLIC), as a stream
 * cuts a tensor too large for its window: once the order is recorded, the slices come in by it
 * ahead of their prepares as tensors do. A budget of about half the slices: each pass reads the
 * streamed half, and every prepare of passes 3-5 finds its slice ready or in flight (prefetch
 * misses stay where the second pass left them), the bytes those of the file. */
static void test_cyclic_slices_prefetched(const char *dir)
{
    enum { TENSORS = 4, RANGES = 4, PASSES = 5 };
    char path[1300];
    snprintf(path, sizeof path, "%s/rows.gguf", dir);
    fixture_tensor ts[TENSORS];
    for (int i = 0; i < TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        set_tensor(&ts[i], name, 2, 0);
        ts[i].shape[1] = 256; /* 256 x 256 f32: 256 KiB, 64 KiB a range */
    }
    CHECK_EQ_INT(fixture_write(path, FERRY_FORMAT_GGUF, ts, TENSORS), 0);
    const uint64_t range = 64u << 10;
    ferry_options o = {.host_budget = TENSORS * RANGES * range / 2,
                       .slice_evict = FERRY_SLICE_EVICT_CYCLIC};
    ferry *f = ferry_create(&o);
    CHECK(f != NULL);
    if (!f)
        return;
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *sl[TENSORS * RANGES];
    for (int i = 0; i < TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        ferry_tensor *t = ferry_find(f, name);
        CHECK(t != NULL);
        for (int r = 0; r < RANGES && t; r++)
            CHECK_EQ_INT(ferry_slice(f, t, (uint64_t)r * 64, 64, &sl[i * RANGES + r]), 0);
    }
    uint64_t misses_after2 = 0, read_late = 0;
    int same = 1;
    for (int pass = 0; pass < PASSES && check_failed == 0; pass++) {
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        for (int k = 0; k < TENSORS * RANGES; k++) {
            CHECK_EQ_INT(ferry_prepare(f, &sl[k], 1), 0);
            if (pass == PASSES - 1)
                same &= fixture_same_as_file(f, sl[k]);
            ferry_release(f, &sl[k], 1);
        }
        ferry_get_stats(f, &s1);
        if (pass == 1)
            misses_after2 = s1.prefetch_misses;
        if (pass >= 2)
            read_late += s1.bytes_read - s0.bytes_read;
        if (pass == PASSES - 1) {
            fprintf(stderr, "cyclic slices: prefetch misses %llu after two passes, %llu after "
                    "%d; %llu bytes read in passes 3-%d\n", (unsigned long long)misses_after2,
                    (unsigned long long)s1.prefetch_misses, PASSES, (unsigned long long)read_late,
                    PASSES);
            CHECK(s1.prefetch_misses == misses_after2);
            CHECK(s1.peak_bytes[0] <= o.host_budget);
        }
    }
    CHECK(same);
    CHECK(read_late >= (PASSES - 2) * range); /* it streams: not all of it stays cached */
    ferry_destroy(f);
    remove(path);
}

int main(void)
{
    const char *dir = check_tmpdir("slice_evict");
    snprintf(g_path, sizeof g_path, "%s/moe.gguf", dir);
    size_t n = make_tensors();
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, g_ts, n))
        return 2;
    static uint32_t trace[TOKENS][LAYERS][K];
    make_trace(trace);
    test_expert_reads_less(trace);
    test_tight_budget(trace);
    test_dense_kept_in_pages(trace, dir);
    test_cyclic_slices_prefetched(dir);
    check_rmdir(dir);
    return check_finish();
}
