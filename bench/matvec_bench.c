/*
 * matvec_bench.c — the decode-shaped product's speed against the memory's read speed, per
 * weight type, in the same run.
 *
 * For each type: one resident matrix of about --mib MiB (rows of --cols elements) in 2 MiB-aligned
 * memory advised huge pages, its values finite (f32 / f16 / bf16 / q8_0 / q4_0 converted from
 * random floats by ferry_dtype_convert; q4_K / q6_K random quants with small f16 scales). Then
 * --runs times, alternating: the memory's read limit on the same threads (limits_read_bandwidth,
 * what `ferry bench` reports as read_bandwidth_gbps: a resident buffer as large as the matrix,
 * each thread summing its own share) and ferry_matvec_q over the matrix, its rows split in
 * contiguous shares over the threads, x prepared once with ferry_matvec_vec_quantize. Prints the
 * medians (GB/s of weights) and their ratio. With --repeat K each thread multiplies its share K
 * times a pass: a matrix that fits the caches (--mib 1) then measures the kernels' own speed,
 * not the memory's.
 *
 *   build/bench/matvec_bench [--threads N (online CPUs)] [--mib M (512)] [--cols C (4096)]
 *                            [--runs R (5)] [--repeat K (1)] [TYPE ...]
 *                            (default types: f32 f16 bf16 q8_0 q4_0 q4_K q6_K)
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ferry.h"
#include "ferry_tools.h" /* limits_read_bandwidth */

#define MAX_THREADS 64

typedef struct share {
    ferry_dtype t;
    const uint8_t *w;
    uint64_t rows, cols, row_bytes;
    const void *xq;
    float *y;
    int repeat;
} share;

static void *run_share(void *arg)
{
    share *s = arg;
    for (int k = 0; k < s->repeat; k++)
        ferry_matvec_q(s->t, s->w, s->rows, s->cols, s->xq, s->y);
    return NULL;
}

/* Seconds for one pass over ROWS rows at W on N threads. */
static double pass(share *sh, unsigned n, ferry_dtype t, const uint8_t *w, uint64_t rows,
                   uint64_t cols, uint64_t rb, const void *xq, float *y, int repeat)
{
    pthread_t th[MAX_THREADS];
    for (unsigned i = 0; i < n; i++) {
        uint64_t r0 = rows * i / n, r1 = rows * (i + 1) / n;
        sh[i] = (share){t, w + r0 * rb, r1 - r0, cols, rb, xq, y + r0, repeat};
    }
    double t0 = ferry_now();
    unsigned started = 1;
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, run_share, &sh[started]))
            break;
    run_share(&sh[0]);
    for (unsigned i = 1; i < started; i++)
        pthread_join(th[i], NULL);
    for (unsigned i = started; i < n; i++) /* a thread that did not start: its share here */
        run_share(&sh[i]);
    return ferry_now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Fills ROWS rows of type T with finite values. 0, or -1 when T cannot be made. */
static int fill(ferry_dtype t, uint8_t *w, uint64_t rows, uint64_t cols, uint64_t rb)
{
    if (t == FERRY_DTYPE_Q4_K || t == FERRY_DTYPE_Q6_K) {
        for (uint64_t i = 0; i < rows * rb; i++)
            w[i] = (uint8_t)next_rand();
        uint32_t bb = ferry_dtype_block_bytes(t);
        for (uint64_t off = 0; off + bb <= rows * rb; off += bb) {
            uint8_t *blk = w + off;
            uint8_t *d = t == FERRY_DTYPE_Q4_K ? blk : blk + bb - 2; /* q4_K: d, dmin first */
            d[0] = 0x00, d[1] = 0x20;                                /* 2^-7 as f16 */
            if (t == FERRY_DTYPE_Q4_K)
                d[2] = 0x00, d[3] = 0x20;
        }
        return 0;
    }
    if (!ferry_dtype_can_convert(FERRY_DTYPE_F32, t))
        return -1;
    float *row = malloc(cols * sizeof *row);
    if (!row)
        return -1;
    int rc = 0;
    for (uint64_t r = 0; r < rows && !rc; r++) {
        for (uint64_t c = 0; c < cols; c++)
            row[c] = (float)((int64_t)(next_rand() % 2001) - 1000) / 50000.0f;
        rc = ferry_dtype_convert(FERRY_DTYPE_F32, row, t, w + r * rb, cols);
    }
    free(row);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = nc > 0 ? (unsigned)nc : 1;
    uint64_t mib = 512, cols = 4096;
    int runs = 5, repeat = 1, first = argc;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--mib") == 0)
            mib = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--cols") == 0)
            cols = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[++i]);
        else {
            first = i;
            break;
        }
    }
    if (threads < 1 || threads > MAX_THREADS || mib < 1 || cols < 256 || cols % 256 ||
        runs < 1 || runs > 99 || repeat < 1 || repeat > 100000) {
        fprintf(stderr, "matvec_bench: --threads 1..%d, --mib >= 1, --cols a multiple of 256, "
                        "--runs 1..99, --repeat 1..100000\n", MAX_THREADS);
        return 2;
    }
    static const char *all[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K"};
    const char **types = first < argc ? (const char **)argv + first : all;
    int n_types = first < argc ? argc - first : (int)(sizeof all / sizeof *all);
    printf("%u threads, %llu MiB matrices of %llu columns, each product %d time%s a pass, medians "
           "of %d alternating runs\n", threads, (unsigned long long)mib, (unsigned long long)cols,
           repeat, repeat == 1 ? "" : "s", runs);
    printf("%-6s %12s %12s %7s\n", "type", "read_GB/s", "matvec_GB/s", "ratio");
    float *x = malloc(cols * sizeof *x);
    if (!x)
        return 1;
    for (uint64_t c = 0; c < cols; c++)
        x[c] = (float)((int64_t)(next_rand() % 2001) - 1000) / 1000.0f;
    int rc = 0;
    for (int k = 0; k < n_types; k++) {
        ferry_dtype t = ferry_dtype_from_name(types[k]);
        uint64_t rb;
        if (t == FERRY_DTYPE_NONE || ferry_dtype_nbytes(t, cols, &rb)) {
            fprintf(stderr, "matvec_bench: %s: no such type for %llu columns\n", types[k],
                    (unsigned long long)cols);
            rc = 2;
            continue;
        }
        uint64_t rows = (mib << 20) / rb, bytes = rows * rb;
        size_t map = (size_t)((bytes + (UINT64_C(2) << 20) - 1) & ~((UINT64_C(2) << 20) - 1));
        uint8_t *w = aligned_alloc((size_t)2 << 20, map);
        uint64_t xqb = ferry_matvec_vec_bytes(t, cols);
        void *xq = xqb ? malloc((size_t)xqb) : NULL;
        float *y = malloc(rows * sizeof *y);
        share *sh = calloc(threads, sizeof *sh);
        if (!w || !xq || !y || !sh) {
            fprintf(stderr, "matvec_bench: %s: out of memory or no product for this type\n",
                    types[k]);
            free(w), free(xq), free(y), free(sh);
            rc = 1;
            continue;
        }
#ifdef MADV_HUGEPAGE
        (void)madvise(w, map, MADV_HUGEPAGE);
#endif
        if (fill(t, w, rows, cols, rb) || ferry_matvec_vec_quantize(t, x, cols, xq)) {
            fprintf(stderr, "matvec_bench: %s: cannot make a matrix of this type\n", types[k]);
            rc = 1;
        } else {
            double rd[99], mv[99];
            pass(sh, threads, t, w, rows, cols, rb, xq, y, 1); /* warm: caches, first faults */
            for (int r = 0; r < runs; r++) {
                rd[r] = limits_read_bandwidth(bytes, threads);
                mv[r] = (double)bytes * repeat /
                        pass(sh, threads, t, w, rows, cols, rb, xq, y, repeat) / 1e9;
            }
            double a = median(rd, runs), b = median(mv, runs);
            printf("%-6s %12.2f %12.2f %7.2f\n", types[k], a, b, a > 0 ? b / a : 0);
        }
        free(w), free(xq), free(y), free(sh);
    }
    free(x);
    return rc;
}
