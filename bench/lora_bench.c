/*
 * lora_bench.c — the cost of merging LoRA adapters while staging, against the GEMMs the merge
 * cannot avoid, measured in the same run.
 *
 * Target: merging a rank-64 adapter into every 2-D weight of a ~1 GiB f16 model takes at most
 * 2x the time of the GEMMs alone.
 *
 *   gemm   for every 2-D weight, ferry__sgemm(rows, cols, rank) of the adapter's B . A (the f32
 *          factors ferry cached, scale included) into a scratch f32 buffer of the weight's size:
 *          the arithmetic every merge must do, nothing else (the scratch is zeroed once, untimed)
 *   merge  ferry's merged staging: a manager with home host, already loaded (so no I/O: the bench
 *          checks that bytes_read does not move), the adapter added; after a change of the
 *          multiplier (a new epoch) every 2-D weight is prepared and released once, one at a time.
 *          That is: f16 -> f32 of the pristine home copy, the same GEMM, f32 -> f16 into a fresh
 *          staged copy, and the manager's bookkeeping.
 * The two alternate, run after run (drift on a shared machine hits both alike); medians over
 * the runs are quoted with their ratio. One warm-up pass of each comes first, untimed (it also
 * faults in the scratch and reads the home copies).
 *
 * The model and adapter are written with the public writer when absent: a llama-shaped f16 GGUF
 * (dim 2048, ff 5632, vocab 32000, layers to reach --size) and a GGUF LoRA adapter of --rank for
 * every 2-D weight (f16 factors, alpha = rank). A merged weight is checked against an independent
 * float64 merge (one f16 rounding step) so that the bench cannot time a merge that does nothing.
 *
 * usage: lora_bench [--dir DIR] [--size SIZE] [--rank R] [--runs N] [--budget SIZE]
 *                   [--load read|mmap] [--clean]
 *   --dir DIR      where the model and adapter live (default /tmp/ferry-lora-bench); reused
 *   --size SIZE    model size to aim at (default 1GiB)
 *   --rank R       adapter rank (default 64)
 *   --runs N       timed runs (default 3)
 *   --budget SIZE  host budget of the manager (default: none; with one, freed staged copies are
 *                  pooled and reused instead of coming fresh from the system)
 *   --load MODE    how the home copy was loaded: read (default: a private host copy) or mmap
 *                  (zero-copy: the home copy is the page-cached mapping)
 *   --clean        delete the model and adapter afterwards
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype/dtype.h"
#include "ferry.h"

#include "bench_util.h"

#define MAX_RUNS 32
#define DIM 2048
#define FF 5632
#define VOCAB 32000

typedef struct weight {
    char name[64];
    uint64_t rows, cols; /* the LoRA matrix view: rows = outermost dimension */
} weight;

typedef struct model {
    weight *w;
    size_t n;
    int layers;
    uint64_t bytes;
} model;

static int add_weight(model *m, const char *name, uint64_t rows, uint64_t cols)
{
    weight *nw = realloc(m->w, (m->n + 1) * sizeof *nw);
    if (!nw)
        return -1;
    m->w = nw;
    snprintf(m->w[m->n].name, sizeof m->w[m->n].name, "%s", name);
    m->w[m->n].rows = rows;
    m->w[m->n].cols = cols;
    m->n++;
    m->bytes += rows * cols * 2;
    return 0;
}

/* The 2-D weights of a llama with LAYERS blocks, in file order. */
static int plan_model(model *m, int layers)
{
    static const struct {
        const char *name;
        uint64_t rows, cols;
    } blk[] = {{"attn_q", DIM, DIM},   {"attn_k", DIM, DIM},  {"attn_v", DIM, DIM},
               {"attn_output", DIM, DIM}, {"ffn_gate", FF, DIM}, {"ffn_up", FF, DIM},
               {"ffn_down", DIM, FF}};
    memset(m, 0, sizeof *m);
    m->layers = layers;
    char nm[64];
    int rc = add_weight(m, "token_embd.weight", VOCAB, DIM);
    for (int l = 0; l < layers && !rc; l++)
        for (size_t k = 0; k < sizeof blk / sizeof blk[0] && !rc; k++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, blk[k].name);
            rc = add_weight(m, nm, blk[k].rows, blk[k].cols);
        }
    if (!rc)
        rc = add_weight(m, "output.weight", VOCAB, DIM);
    return rc;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float rnd(float amp)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((float)(rng >> 40) / 16777216.0f - 0.5f) * 2.0f * amp;
}

/* Writes N f16 values of amplitude AMP, generated in chunks. */
static int write_f16(ferry_writer *w, uint64_t n, float amp)
{
    enum { CHUNK = 1 << 20 };
    static float f[CHUNK];
    static uint16_t h[CHUNK];
    for (uint64_t done = 0; done < n;) {
        uint64_t c = n - done < CHUNK ? n - done : CHUNK;
        for (uint64_t i = 0; i < c; i++)
            f[i] = rnd(amp);
        if (ferry_dtype_convert(FERRY_DTYPE_F32, f, FERRY_DTYPE_F16, h, c) ||
            ferry_writer_write(w, h, c * 2))
            return -1;
        done += c;
    }
    return 0;
}

static int write_base(const model *m, const char *path)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int rc = w ? ferry_writer_set_meta_str(w, "general.architecture", "llama") : -1;
    for (size_t i = 0; i < m->n && !rc; i++) {
        int64_t shape[2] = {(int64_t)m->w[i].cols, (int64_t)m->w[i].rows};
        rc = ferry_writer_add_tensor(w, m->w[i].name, FERRY_DTYPE_F16, 2, shape);
    }
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t i = 0; i < m->n && !rc; i++)
        rc = write_f16(w, m->w[i].rows * m->w[i].cols, 0.05f);
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "lora_bench: %s: %s\n", path, w ? ferry_writer_errmsg(w) : "no memory");
    ferry_writer_destroy(w);
    return rc;
}

static int write_adapter(const model *m, const char *path, unsigned rank)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int rc = w ? ferry_writer_set_meta_str(w, "adapter.type", "lora") : -1;
    ferry_value alpha;
    memset(&alpha, 0, sizeof alpha);
    alpha.type = FERRY_VALUE_F32;
    alpha.v.f = rank;
    if (!rc)
        rc = ferry_writer_set_meta(w, "adapter.lora.alpha", &alpha);
    char nm[96];
    for (size_t i = 0; i < m->n && !rc; i++) {
        int64_t sa[2] = {(int64_t)m->w[i].cols, rank}, sb[2] = {rank, (int64_t)m->w[i].rows};
        snprintf(nm, sizeof nm, "%s.lora_a", m->w[i].name);
        rc = ferry_writer_add_tensor(w, nm, FERRY_DTYPE_F16, 2, sa);
        snprintf(nm, sizeof nm, "%s.lora_b", m->w[i].name);
        if (!rc)
            rc = ferry_writer_add_tensor(w, nm, FERRY_DTYPE_F16, 2, sb);
    }
    if (!rc)
        rc = ferry_writer_begin(w, path);
    /* A ~ 1/sqrt(cols), B ~ 0.01: deltas of a trained adapter's size. */
    for (size_t i = 0; i < m->n && !rc; i++) {
        rc = write_f16(w, rank * m->w[i].cols, 1.7f / sqrtf((float)m->w[i].cols));
        if (!rc)
            rc = write_f16(w, m->w[i].rows * rank, 0.017f);
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "lora_bench: %s: %s\n", path, w ? ferry_writer_errmsg(w) : "no memory");
    ferry_writer_destroy(w);
    return rc;
}

/* ---- the two measurements ------------------------------------------------------------------- */

typedef struct bench {
    model m;
    ferry *f;
    ferry_tensor **t;
    ferry_lora_factor *fac;
    float *scratch;
    int id;
    float mult;
} bench;

static double run_gemm(bench *b)
{
    double t0 = bench_now();
    for (size_t i = 0; i < b->m.n; i++) {
        const ferry_lora_factor *k = &b->fac[i];
        ferry__sgemm(k->rows, k->cols, k->rank, k->scale, k->b, k->rank, k->a, k->cols,
                     b->scratch, k->cols);
    }
    return bench_now() - t0;
}

static double run_merge(bench *b)
{
    /* A new epoch: every staged copy is made again from the home copy. */
    b->mult = b->mult == 1.0f ? 0.5f : 1.0f;
    if (ferry_lora_set_multiplier(b->f, b->id, b->mult)) {
        fprintf(stderr, "lora_bench: %s\n", ferry_errmsg(b->f));
        return -1;
    }
    double t0 = bench_now();
    for (size_t i = 0; i < b->m.n; i++) {
        if (ferry_prepare(b->f, &b->t[i], 1) || ferry_release(b->f, &b->t[i], 1)) {
            fprintf(stderr, "lora_bench: %s: %s\n", b->m.w[i].name, ferry_errmsg(b->f));
            return -1;
        }
    }
    return bench_now() - t0;
}

/* Weight I merged at the current multiplier against a float64 merge of the home bytes: every
 * element within one f16 rounding step. Returns the number of elements outside. */
static uint64_t verify(bench *b, size_t i, const char *model_path)
{
    ferry_tensor_info in;
    ferry_tensor_get_info(b->t[i], &in);
    uint64_t n = in.n_elems, bad = 0;
    uint16_t *file = malloc(n * 2), *got = malloc(n * 2);
    float *w = malloc(n * 4), *g = malloc(n * 4);
    FILE *fp = fopen(model_path, "rb");
    int ok = fp && file && got && w && g && fseeko(fp, (off_t)in.offset, SEEK_SET) == 0 &&
             fread(file, 2, n, fp) == n;
    if (fp)
        fclose(fp);
    if (ok && !ferry_prepare(b->f, &b->t[i], 1)) {
        ok = !ferry_tensor_read(b->f, b->t[i], 0, n * 2, got);
        ferry_release(b->f, &b->t[i], 1);
    } else {
        ok = 0;
    }
    if (ok) {
        ferry_dtype_convert(FERRY_DTYPE_F16, file, FERRY_DTYPE_F32, w, n);
        ferry_dtype_convert(FERRY_DTYPE_F16, got, FERRY_DTYPE_F32, g, n);
        const ferry_lora_factor *k = &b->fac[i];
        double scale = k->scale; /* at the current multiplier: refresh_factors ran last */
        for (uint64_t r = 0; r < k->rows; r++)
            for (uint64_t c = 0; c < k->cols; c++) {
                double s = 0, mag = fabs(w[r * k->cols + c]);
                for (uint32_t j = 0; j < k->rank; j++) {
                    double x = (double)k->b[r * k->rank + j] * k->a[j * k->cols + c];
                    s += x;
                    mag += fabs(scale * x);
                }
                double ref = w[r * k->cols + c] + scale * s, got_v = g[r * k->cols + c];
                int e;
                frexp(fabs(got_v), &e);
                double ulp = got_v == 0 ? 0 : ldexp(1.0, e - 11);
                ulp = ulp > ldexp(1.0, -24) ? ulp : ldexp(1.0, -24); /* subnormal spacing */
                if (!(fabs(got_v - ref) <= 0.5 * ulp + 1e-6 * mag) && bad++ < 3)
                    fprintf(stderr, "  %s [%llu, %llu]: %.8g, expected %.8g\n", in.name,
                            (unsigned long long)r, (unsigned long long)c, got_v, ref);
            }
        if (!memcmp(file, got, n * 2))
            bad = n; /* a merge that changed nothing */
    } else {
        bad = n ? n : 1;
    }
    free(file);
    free(got);
    free(w);
    free(g);
    return bad;
}

static int refresh_factors(bench *b)
{
    for (size_t i = 0; i < b->m.n; i++)
        if (ferry_lora_factors(b->f, b->t[i], 0, &b->fac[i])) {
            fprintf(stderr, "lora_bench: %s: no adapter term\n", b->m.w[i].name);
            return -1;
        }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: lora_bench [--dir DIR] [--size SIZE] [--rank R] [--runs N] "
                    "[--budget SIZE] [--load read|mmap] [--clean]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dir = "/tmp/ferry-lora-bench";
    uint64_t size = UINT64_C(1) << 30, budget = 0;
    unsigned rank = 64, runs = 3;
    int clean = 0;
    ferry_load load = FERRY_LOAD_READ;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--clean")) {
            clean = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--size") && !ferry_parse_size(v, &size) && size)
            ;
        else if (!strcmp(a, "--budget") && !ferry_parse_size(v, &budget))
            ;
        else if (!strcmp(a, "--rank") && (rank = (unsigned)atoi(v)) >= 1 && rank <= 4096)
            ;
        else if (!strcmp(a, "--runs") && (runs = (unsigned)atoi(v)) >= 1 && runs <= MAX_RUNS)
            ;
        else if (!strcmp(a, "--load") && (!strcmp(v, "read") || !strcmp(v, "mmap")))
            load = !strcmp(v, "read") ? FERRY_LOAD_READ : FERRY_LOAD_MMAP;
        else
            return usage();
    }
    bench b;
    memset(&b, 0, sizeof b);
    /* Layers to reach SIZE: embeddings and output, then whole blocks. */
    model probe;
    if (plan_model(&probe, 1))
        return 1;
    uint64_t fixed = 2 * (uint64_t)VOCAB * DIM * 2, per_layer = probe.bytes - fixed;
    free(probe.w);
    int layers = size > fixed ? (int)((size - fixed + per_layer / 2) / per_layer) : 1;
    if (layers < 1)
        layers = 1;
    if (plan_model(&b.m, layers))
        return 1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "lora_bench: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char base[4096], adapter[4096];
    snprintf(base, sizeof base, "%s/llama-f16-%dl.gguf", dir, layers);
    snprintf(adapter, sizeof adapter, "%s/lora-r%u-%dl.gguf", dir, rank, layers);
    if (access(base, R_OK) != 0) {
        printf("writing %s (%d layers, %.2f GiB f16) ...\n", base, layers,
               (double)b.m.bytes / (1 << 30));
        fflush(stdout);
        if (write_base(&b.m, base))
            return 1;
    }
    if (access(adapter, R_OK) != 0) {
        printf("writing %s (rank %u on %zu weights) ...\n", adapter, rank, b.m.n);
        fflush(stdout);
        if (write_adapter(&b.m, adapter, rank))
            return 1;
    }

    ferry_options o;
    memset(&o, 0, sizeof o);
    o.host_budget = budget;
    b.f = ferry_create(&o);
    ferry_policy p;
    memset(&p, 0, sizeof p);
    p.home = FERRY_HOME_HOST;
    p.load = load;
    p.lazy = FERRY_LAZY_OFF;
    if (!b.f || ferry_open(b.f, base, NULL) || ferry_group_add(b.f, "all", "*", &p) ||
        ferry_load_group(b.f, NULL)) {
        fprintf(stderr, "lora_bench: %s: %s\n", base, b.f ? ferry_errmsg(b.f) : "no memory");
        return 1;
    }
    b.t = calloc(b.m.n, sizeof *b.t);
    b.fac = calloc(b.m.n, sizeof *b.fac);
    uint64_t max_elems = 0, flops = 0;
    for (size_t i = 0; i < b.m.n; i++) {
        if (!(b.t[i] = ferry_find(b.f, b.m.w[i].name))) {
            fprintf(stderr, "lora_bench: %s: %s\n", base, ferry_errmsg(b.f));
            return 1;
        }
        uint64_t e = b.m.w[i].rows * b.m.w[i].cols;
        max_elems = e > max_elems ? e : max_elems;
        flops += 2 * e * rank;
    }
    b.mult = 1.0f;
    if (ferry_lora_add(b.f, adapter, b.mult, NULL, &b.id) || refresh_factors(&b)) {
        fprintf(stderr, "lora_bench: %s: %s\n", adapter, ferry_errmsg(b.f));
        return 1;
    }
    b.scratch = calloc(max_elems, sizeof(float));
    if (!b.scratch) {
        fprintf(stderr, "lora_bench: out of memory (%llu floats of scratch)\n",
                (unsigned long long)max_elems);
        return 1;
    }
    printf("model %s: %zu weights, %.2f GiB f16; adapter rank %u; sgemm %s; load %s; budget %s\n",
           base, b.m.n, (double)b.m.bytes / (1 << 30), rank, ferry__sgemm_backend(),
           load == FERRY_LOAD_READ ? "read" : "mmap",
           budget ? "set" : "none");

    /* Warm-up (untimed): faults the scratch in, stages every merged copy once. */
    run_gemm(&b);
    if (run_merge(&b) < 0)
        return 1;
    ferry_stats st0, st1;
    ferry_get_stats(b.f, &st0);
    double tg[MAX_RUNS], tm[MAX_RUNS];
    for (unsigned r = 0; r < runs; r++) {
        tg[r] = run_gemm(&b);
        tm[r] = run_merge(&b);
        if (tm[r] < 0)
            return 1;
        printf("  run %u: gemm %.3f s  merge %.3f s  ratio %.2f\n", r + 1, tg[r], tm[r],
               tm[r] / tg[r]);
        fflush(stdout);
    }
    ferry_get_stats(b.f, &st1);
    if (refresh_factors(&b))
        return 1;
    uint64_t bad = verify(&b, 1, base); /* blk.0.attn_q */
    double tr[MAX_RUNS];
    for (unsigned r = 0; r < runs; r++)
        tr[r] = tm[r] / tg[r];
    bench_stat sg = bench_summarize(tg, runs), sm = bench_summarize(tm, runs);
    bench_stat sr = bench_summarize(tr, runs);
    double ratio = sm.median / sg.median;
    printf("gemm alone     median %.3f s (min %.3f, max %.3f)  %.1f GFLOP/s\n", sg.median, sg.min,
           sg.max, (double)flops / sg.median / 1e9);
    printf("merged staging median %.3f s (min %.3f, max %.3f)  %.2f GB/s of weights\n", sm.median,
           sm.min, sm.max, (double)b.m.bytes / sm.median / 1e9);
    printf("ratio merge/gemm %.2f (target <= 2.00): %s; per run: median %.2f, max %.2f\n",
           ratio, ratio <= 2.0 ? "met" : "MISSED", sr.median, sr.max);
    printf("bytes read during the timed runs: %llu (must be 0)\n",
           (unsigned long long)(st1.bytes_read - st0.bytes_read));
    printf("check of %s against a float64 merge: %s\n", b.m.w[1].name,
           bad ? "FAILED" : "within one f16 rounding step");
    ferry_destroy(b.f);
    free(b.scratch);
    free(b.t);
    free(b.fac);
    free(b.m.w);
    if (clean) {
        unlink(base);
        unlink(adapter);
    }
    return bad || st1.bytes_read != st0.bytes_read ? 1 : 0;
}
