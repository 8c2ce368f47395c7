/*
 * benchlab.c — the measuring protocol of `ferry bench FILE`: how fast ferry loads and streams a
 * model, each figure beside the machine's own limit measured in the same run (limits.c).
 *
 * One run measures, alternating a limit and a ferry load so that drift (other processes, the
 * host's page reporting) hits both alike:
 *   limit  O_DIRECT sweep of the file (1/2/4/8 readers x 64/16 MiB requests, into reused buffers
 *          backed by huge pages, 256 MiB of them or more: see limits.h); the best pair is used
 *          from then on
 *   four cold loads and a limit, in an order that rotates from run to run, each right after an
 *   O_DIRECT read with the best pair (the limit the cold loads are judged against: the median of
 *   these reads):
 *     ferry  cold load, home host, load DIRECT (a private copy)
 *     ferry  cold load, load AUTO (ferry's choice: a private copy read with O_DIRECT, the file
 *            being out of the page cache)
 *     ref    mmap + one read per page (page faults); mmap with MAP_POPULATE (what llama.cpp does)
 *     limit  a plain program's cold load: that O_DIRECT read into fresh memory of the model's
 *            size, small pages and (after the same read and rest again) huge ones, the faster
 *   limit  cold buffered read (page cache readahead into one reused buffer)
 *   limit  first touch of fresh anonymous memory of the model's size (best of 1 and 2 threads),
 *          then of M / 4 in 2 MiB pages (what a stream's first pass fills), each after a rest
 *   limit  memcpy (file in the page cache from here on)
 *   limit  read bandwidth of resident memory (a buffer beyond the last-level cache; best of 1 ..
 *          online CPUs threads)
 *   ferry  warm load, load READ (a private copy); then one decode pass over the resident weights
 *          (ferry_matvec_q, as an engine decodes), rows split over --threads threads: the
 *          resident compute limit
 *   ferry  warm load, load AUTO (zero-copy: no copy, only the time to make it resident)
 * A load is "ready" when ferry_prepare of every tensor has returned and one byte of every page of
 * every data pointer has been read; cold loads start with the files dropped from the page cache.
 * Figures are medians over --runs. Then streamed passes: for each layer in file order (grouped as
 * `ferry run` groups them) prepare, matvec every weight, release; home disk, compute cpu, load
 * auto, host budget B = M/4 and M/2, the files dropped from the page cache before every pass so
 * that what ferry does not keep comes from the disk, and an O_DIRECT read of the file (the best
 * readers and request size found earlier) right before each pass: limit, pass, limit, pass, as
 * the disk drifts. The median of passes 2..N is judged against
 *   bound = max(resident compute time, (M - B + W) / median O_DIRECT read before those passes),
 * M the model's bytes, W the working set (the largest sum of two consecutive layers: the one in
 * use and the one prefetched). With --device sim:SIZE@BW the same runs with compute on that device
 * (home host, device budget M/4): bound = (M - B + W) / BW — ferry run computes nothing on a
 * device the host cannot read, so no compute time enters it. With --split SPEC,SPEC[:WEIGHT] the
 * model's 2-D tensors are split by rows over those devices (as `ferry run --split`), home host:
 * device i holds a share M_i of the model (ferry_plan's placement), gets the budget B_i = M_i / 4
 * and has a working set W_i (its part of the two largest consecutive layers); the devices copy in
 * parallel, each over its own link, so bound = max over devices of (M_i - B_i + W_i) / BW_i, the
 * slowest device's share through its link; the cpu's part is read in place (no transfer).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchlab.h"
#include "ferry_device.h"
#include "layers.h"
#include "limits.h"
#include "memcap.h"

static volatile unsigned char sink;

static void step_done(benchlab *b)
{
    b->done += b->model;
    cli_progress_update(&b->bar, b->done);
}

/* ---- the model -------------------------------------------------------------------------------- */

/* Files, sizes, tensor bytes, layers and the working set, from a catalog of PATH. */
static int describe_model(benchlab *b)
{
    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return cli_error("out of memory");
    if (ferry_catalog_add(c, b->path, NULL)) {
        int rc = cli_fail(b->path, ferry_catalog_errmsg(c), -1);
        ferry_catalog_destroy(c);
        return rc;
    }
    b->n_files = ferry_catalog_file_count(c);
    b->files = calloc(b->n_files ? b->n_files : 1, sizeof *b->files);
    b->file_sizes = calloc(b->n_files ? b->n_files : 1, sizeof *b->file_sizes);
    b->n_tensors = ferry_catalog_count(c);
    b->model = ferry_catalog_total_bytes(c);
    uint64_t *layer = calloc(b->n_tensors ? b->n_tensors : 1, sizeof *layer);
    int rc = (!b->files || !b->file_sizes || !layer) ? cli_error("out of memory") : 0;
    for (size_t i = 0; i < b->n_files && !rc; i++) {
        struct stat st;
        b->files[i] = strdup(ferry_catalog_file_path(c, i));
        if (!b->files[i])
            rc = cli_error("out of memory");
        else if (stat(b->files[i], &st) != 0)
            rc = cli_error("%s: %s", b->files[i], strerror(errno));
        else
            b->file_bytes += b->file_sizes[i] = (uint64_t)st.st_size;
    }
    size_t nl = 0, prev_len = 0;
    char *prev = NULL;
    b->max_cols = b->max_rows = 1;
    for (size_t i = 0; i < b->n_tensors && !rc; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        size_t len = layer_key_len(info.name);
        if (!prev || len != prev_len || strncmp(prev, info.name, len) != 0) {
            nl++;
            free(prev);
            prev = strdup(info.name);
            prev_len = len;
            if (!prev)
                rc = cli_error("out of memory");
        }
        layer[nl - 1] += info.nbytes;
        if (info.ndim >= 2) {
            b->max_cols = info.row_elems > b->max_cols ? info.row_elems : b->max_cols;
            b->max_rows = info.n_rows > b->max_rows ? info.n_rows : b->max_rows;
        }
    }
    free(prev);
    b->n_layers = nl;
    /* W: the largest pair of consecutive layers (the last one is followed by the first). */
    b->working_set = nl == 1 ? layer[0] : 0;
    for (size_t i = 0; nl > 1 && i < nl; i++) {
        uint64_t w = layer[i] + layer[(i + 1) % nl];
        b->working_set = w > b->working_set ? w : b->working_set;
    }
    free(layer);
    ferry_catalog_destroy(c);
    if (rc)
        return rc;
    if (b->model == 0)
        return cli_error("%s: the model has no tensor data to load", b->path);
    b->x = malloc(b->max_cols * sizeof *b->x);
    if (b->threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        b->threads = c > 0 ? (unsigned)c : 1;
    }
    if (b->threads > BENCHLAB_MAX_THREADS)
        b->threads = BENCHLAB_MAX_THREADS;
    b->y = malloc(b->max_rows * b->threads * sizeof *b->y); /* one share per compute thread */
    if (!b->x || !b->y)
        return cli_error("out of memory");
    for (uint64_t i = 0; i < b->max_cols; i++)
        b->x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, size_t n)
{
    if (!n)
        return 0;
    double tmp[BENCHLAB_MAX_PASSES > BENCHLAB_MAX_RUNS ? BENCHLAB_MAX_PASSES : BENCHLAB_MAX_RUNS];
    memcpy(tmp, v, n * sizeof *v);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

static uint64_t median_u64(const uint64_t *v, size_t n)
{
    double d[BENCHLAB_MAX_PASSES];
    for (size_t i = 0; i < n; i++)
        d[i] = (double)v[i];
    return (uint64_t)llround(median(d, n));
}

static void put(benchlab *b, int m, double v)
{
    if (b->n[m] < BENCHLAB_MAX_RUNS)
        b->v[m][b->n[m]++] = v;
}

/* Drops every file of the model from the page cache and notes how much stayed. */
static int drop_files(benchlab *b)
{
    for (size_t i = 0; i < b->n_files; i++) {
        int rc = limits_drop_cache(b->files[i]);
        if (rc)
            return cli_error("%s: cannot drop it from the page cache (%s)", b->files[i],
                             ferry_strerror(rc));
        double frac = limits_cached_fraction(b->files[i]);
        if (frac > b->worst_cached)
            b->worst_cached = frac;
    }
    return 0;
}

static int warm_files(benchlab *b)
{
    for (size_t i = 0; i < b->n_files; i++) {
        int rc = limits_warm_file(b->files[i]);
        if (rc)
            return cli_error("%s: cannot read it (%s)", b->files[i], ferry_strerror(rc));
    }
    return 0;
}

/* Reads one byte per page of [p, p + n). */
static void touch_pages(const unsigned char *p, uint64_t n, uint64_t page)
{
    unsigned char acc = 0;
    for (uint64_t off = 0; off < n; off += page)
        acc ^= ((const volatile unsigned char *)p)[off];
    if (n)
        acc ^= ((const volatile unsigned char *)p)[n - 1];
    sink ^= acc;
}

/* One piece of a compute pass: rows [r0, r1) of one weight. */
typedef struct compute_unit {
    ferry_dtype t;
    const void *w;   /* the weight's first row */
    uint64_t rows, cols, row_bytes, r0, r1;
    const void *xq;  /* x prepared for the weight's type (ferry_matvec_vec_quantize) */
} compute_unit;

/* x prepared once for weights of type T and COLS columns. */
typedef struct compute_vec {
    ferry_dtype t;
    uint64_t cols;
    void *xq;
} compute_vec;

/* B->x prepared for type T and COLS columns (made on first use), or NULL when ferry_matvec_q
 * cannot take that type or shape, or memory is exhausted. */
static const void *compute_vec_for(benchlab *b, ferry_dtype t, uint64_t cols)
{
    for (size_t i = 0; i < b->n_vecs; i++)
        if (b->vecs[i].t == t && b->vecs[i].cols == cols)
            return b->vecs[i].xq;
    uint64_t n = ferry_matvec_vec_bytes(t, cols);
    compute_vec *v = n ? realloc(b->vecs, (b->n_vecs + 1) * sizeof *v) : NULL;
    if (!v)
        return NULL;
    b->vecs = v;
    void *xq = malloc((size_t)n);
    if (!xq || ferry_matvec_vec_quantize(t, b->x, cols, xq)) {
        free(xq);
        return NULL;
    }
    b->vecs[b->n_vecs++] = (compute_vec){t, cols, xq};
    return xq;
}

/* The pieces of a pass in N_SHARES contiguous shares, one a thread: share I is pieces [end[I -
 * 1] (0 for I = 0), end[I]), next[I] the next of them to take. Each thread takes the pieces of its
 * own share in order, then helps finish the others' (a thread the host deschedules holds up no
 * share of its own), each into its own Y: each thread streams one range of the weights, as an
 * engine splits a product's rows (engine/llama.c, matvec_run). */
typedef struct compute_pass {
    const compute_unit *u;
    size_t n;
    unsigned n_shares;
    size_t end[BENCHLAB_MAX_THREADS];
    _Atomic size_t next[BENCHLAB_MAX_THREADS];
    const float *x;
} compute_pass;

typedef struct compute_share {
    compute_pass *pass;
    unsigned index;
    float *y;
    double checksum;
} compute_share;

static void compute_take(compute_share *c, unsigned i)
{
    compute_pass *p = c->pass;
    for (size_t k; (k = atomic_fetch_add(&p->next[i], 1)) < p->end[i];) {
        const compute_unit *o = &p->u[k];
        if (ferry_matvec_q(o->t, (const unsigned char *)o->w + o->r0 * o->row_bytes,
                           o->r1 - o->r0, o->cols, o->xq, c->y) == 0)
            c->checksum += (o->r0 == 0 ? c->y[0] : 0.0f) +
                           (o->r1 == o->rows ? c->y[o->r1 - o->r0 - 1] : 0.0f);
    }
}

static void *compute_main(void *arg)
{
    compute_share *c = arg;
    unsigned n = c->pass->n_shares;
    for (unsigned i = 0; i < n; i++)
        compute_take(c, (c->index + i) % n);
    return NULL;
}

/* Rows of a piece: about 256 KiB of weights, in whole groups of 8 rows. */
#define COMPUTE_PIECE_BYTES (UINT64_C(256) << 10)

/* One decode pass over the tensors of SETS (already prepared on the cpu): y = W.x for every
 * weight of two or more dimensions whose type ferry_matvec_q reads, x prepared once for each
 * type as an engine decoding with it prepares it (q8_0 / q8_K blocks, f16 / bf16 rounding), in
 * pieces of rows shared by b->threads threads (fewer when a thread cannot start). */
static void compute_sets(benchlab *b, layer_set *sets, size_t from, size_t to)
{
    size_t n_units = 0, k = 0;
    for (int count = 1; count >= 0; count--) {
        for (size_t s = from; s < to; s++)
            for (size_t i = 0; i < sets[s].n; i++) {
                ferry_tensor_info info;
                ferry_tensor_get_info(sets[s].t[i], &info);
                ferry_dtype t = ferry_tensor_dtype(sets[s].t[i]);
                uint64_t rb;
                const void *xq = NULL;
                if (info.ndim < 2 || !info.n_rows || !info.row_elems ||
                    ferry_dtype_nbytes(t, info.row_elems, &rb) ||
                    !(xq = compute_vec_for(b, t, info.row_elems)))
                    continue; /* a vector, an empty weight or an unreadable type: no product */
                /* a multiple of 8 rows, as an engine cuts its chunks: the eight-row kernels
                 * take every row of a piece but a weight's last few */
                uint64_t step = rb >= COMPUTE_PIECE_BYTES / 8 ? 8 : COMPUTE_PIECE_BYTES / rb / 8 * 8;
                for (uint64_t r = 0; r < info.n_rows; r += step, k++)
                    if (!count)
                        b->units[k] = (compute_unit){
                            t, ferry_tensor_data(sets[s].t[i]), info.n_rows, info.row_elems, rb, r,
                            info.n_rows - r < step ? info.n_rows : r + step, xq};
            }
        if (count) {
            n_units = k;
            k = 0;
            if (n_units > b->units_cap) {
                compute_unit *u = realloc(b->units, n_units * sizeof *u);
                if (!u)
                    return;
                b->units = u;
                b->units_cap = n_units;
            }
        }
    }
    unsigned n = b->threads, started = 1;
    compute_pass pass = {.u = b->units, .n = n_units, .n_shares = n, .x = b->x};
    for (unsigned i = 0; i < n; i++) {
        pass.end[i] = n_units * (i + 1) / n;
        atomic_init(&pass.next[i], n_units * i / n);
    }
    compute_share sh[BENCHLAB_MAX_THREADS];
    pthread_t th[BENCHLAB_MAX_THREADS];
    for (unsigned i = 0; i < n; i++)
        sh[i] = (compute_share){&pass, i, b->y + (size_t)i * b->max_rows, 0};
    for (; started < n; started++)
        if (pthread_create(&th[started], NULL, compute_main, &sh[started]) != 0)
            break;
    compute_main(&sh[0]);
    for (unsigned i = 1; i < started; i++)
        pthread_join(th[i], NULL);
    for (unsigned i = 0; i < started; i++)
        b->checksum += sh[i].checksum;
}

/* The first and last bytes of every prepared tensor against the file (after the clock). */
static int verify_loaded(layer_set *sets, size_t nsets)
{
    for (size_t s = 0; s < nsets; s++)
        for (size_t i = 0; i < sets[s].n; i++) {
            ferry_tensor_info in;
            ferry_tensor_get_info(sets[s].t[i], &in);
            const unsigned char *p = ferry_tensor_data(sets[s].t[i]);
            if (!in.nbytes)
                continue;
            if (!p)
                return cli_error("%s: tensor '%s' has no data after prepare", in.file, in.name);
            int fd = open(in.file, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                return cli_error("%s: %s", in.file, strerror(errno));
            unsigned char buf[64];
            uint64_t k = in.nbytes < sizeof buf ? in.nbytes : sizeof buf;
            uint64_t at[2] = {0, in.nbytes - k};
            int bad = 0;
            for (int j = 0; j < 2 && !bad; j++)
                bad = pread(fd, buf, (size_t)k, (off_t)(in.offset + at[j])) != (ssize_t)k ||
                      memcmp(buf, p + at[j], (size_t)k) != 0;
            close(fd);
            if (bad)
                return cli_error("%s: tensor '%s': loaded bytes differ from the file", in.file,
                                 in.name);
        }
    return 0;
}

/* ---- the measurements ---------------------------------------------------------------------- */

/* The cold buffered read of every file, into slot M. */
static int run_buffered(benchlab *b, int m)
{
    double secs = 0;
    for (size_t i = 0; i < b->n_files; i++) {
        double g = limits_buffered_read(b->files[i], 0);
        if (g < 0)
            return cli_error("%s: buffered read: %s", b->files[i], ferry_strerror((int)g));
        secs += (double)b->file_sizes[i] / (g * 1e9);
    }
    put(b, m, (double)b->file_bytes / secs / 1e9);
    return 0;
}

/* One O_DIRECT read of the model's files with the best readers/request size found so far: GB/s,
 * or 0 when a read failed. */
static double direct_best_read(benchlab *b)
{
    double secs = 0;
    for (size_t i = 0; i < b->n_files && secs >= 0; i++) {
        double g = limits_direct_read(b->files[i], b->direct_readers, b->direct_request);
        secs = g > 0 ? secs + (double)b->file_sizes[i] / (g * 1e9) : -1;
    }
    return secs > 0 ? (double)b->file_bytes / secs / 1e9 : 0;
}

/* Rest before a measurement that takes fresh memory (the loads, the fresh-memory test, a stream's
 * first pass), holding none: a virtual machine that
 * reports free memory to its host (free page reporting) hands what the previous step freed back
 * within seconds, and a program that loads a model at its start finds memory in that state, not
 * the warm pages a step just freed. */
static void settle(const benchlab *b)
{
    if (b->settle <= 0)
        return;
    struct timespec ts = {(time_t)b->settle,
                          (long)((b->settle - (double)(time_t)b->settle) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Four rests: before a stream's first pass and each run of its limit, which fault in up to the
 * model's size of fresh memory after a step that freed as much. A VM that reports free memory
 * takes a freed gigabyte back over seconds, not at once (bench/README.md, "The first pass against
 * its own limit"): one rest leaves the next step some of what the step before freed, and the
 * first pass and its limit follow steps that free different sizes. */
static void rest_long(const benchlab *b)
{
    for (int i = 0; i < 4; i++)
        settle(b);
}

/* A way of limits_first_pass: who faults the fresh memory in, and in which pages. */
typedef struct fresh_way {
    unsigned faulters;
    limits_pages pages;
} fresh_way;

/* limits_first_pass over the model's files in turn, the first KEEP bytes of them all kept, with
 * the O_DIRECT limit's readers and request size: the seconds, or the error of the first read
 * that failed (below 0). */
static double first_pass_files(const benchlab *b, uint64_t keep, fresh_way way)
{
    double secs = 0;
    uint64_t before = 0;
    for (size_t i = 0; i < b->n_files; i++) {
        uint64_t k = keep > before ? keep - before : 0;
        double t = 0;
        double g = limits_first_pass(b->files[i], k, b->direct_readers, b->direct_request,
                                     way.faulters, way.pages, &t);
        if (g <= 0)
            return g < 0 ? g : FERRY_EIO;
        secs += t;
        before += b->file_sizes[i];
    }
    return secs;
}

/* The first-pass limit: the fewest seconds of first_pass_files in three ways, each after the long
 * rest the first pass had: the kept bytes in huge pages, faulted by the readers or by two threads
 * ahead, and in small pages faulted by the readers. 0 where a read fails. *BEST_FAULTERS and
 * *BEST_PAGES get the winner's. */
static double first_pass_limit(benchlab *b, uint64_t keep, unsigned *best_faulters,
                               limits_pages *best_pages)
{
    static const fresh_way ways[] = {
        {0, LIMITS_PAGES_HUGE}, {2, LIMITS_PAGES_HUGE}, {0, LIMITS_PAGES_SMALL}};
    double best = 0;
    *best_faulters = 0;
    *best_pages = LIMITS_PAGES_HUGE;
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        rest_long(b);
        double secs = first_pass_files(b, keep, ways[w]);
        if (secs > 0 && (best == 0 || secs < best)) {
            best = secs;
            *best_faulters = ways[w].faulters;
            *best_pages = ways[w].pages;
        }
    }
    return best;
}

/* limits_relayed_read of every file of the model in turn with READERS readers: GB/s of them
 * all, 0 where a read failed. */
static double relayed_read_files(benchlab *b, unsigned readers)
{
    double secs = 0;
    for (size_t i = 0; i < b->n_files; i++) {
        double g = limits_relayed_read(b->files[i], readers, 0);
        if (g <= 0)
            return 0;
        secs += (double)b->file_sizes[i] / (g * 1e9);
    }
    return secs > 0 ? (double)b->file_bytes / secs / 1e9 : 0;
}

/* The disk's rate now (GB/s; 0 where a read failed): the O_DIRECT read with the best pair, into
 * *DIRECT, and where the read through relay slots was the faster at the start of this run
 * (run_relay), that read too, with the readers found faster there: the faster of the two. The
 * ratio of the two moved between 1.13 and 1.51 within an hour on the VM measured, so the relayed
 * read is measured each time rather than scaled from the O_DIRECT one. */
static double disk_now(benchlab *b, double *direct)
{
    double d = direct_best_read(b);
    *direct = d;
    size_t n = b->n[BENCHLAB_RELAY_GAIN];
    if (d <= 0 || !n || !(b->v[BENCHLAB_RELAY_GAIN][n - 1] > 1) || !b->relay_readers)
        return d;
    double g = relayed_read_files(b, b->relay_readers);
    return g > d ? g : d;
}

/* The limits right before a cold load: limit, load, limit, load, as the disk drifts. */
static int run_direct_before(benchlab *b)
{
    if (b->no_direct) {
        int rc = run_buffered(b, BENCHLAB_DIRECT);
        if (!rc && b->n[BENCHLAB_DIRECT])
            put(b, BENCHLAB_DISK, b->v[BENCHLAB_DIRECT][b->n[BENCHLAB_DIRECT] - 1]);
        return rc;
    }
    double d, g = disk_now(b, &d);
    if (g <= 0)
        return cli_error("%s: O_DIRECT read failed", b->path);
    put(b, BENCHLAB_DIRECT, d);
    put(b, BENCHLAB_DISK, g);
    return 0;
}

/* Readers of the plain programs that read through relay slots, 512 KiB each: 16 to 32 of them
 * read fastest of 4 to 48 on a 2-core VM whose disk its host emulates (bench/README.md, Dec 5
 * 2026); the relayed read is measured with each, and the relayed load uses the faster. */
static const unsigned relay_readers[] = {16, 32};

/* The disk's other limit: O_DIRECT through relay slots into a reused destination
 * (limits_relayed_read, with each of relay_readers, the faster kept), right after an O_DIRECT
 * read with the best pair. Where it gained, every later limit of the run measures it again beside
 * the O_DIRECT read (disk_now). */
static int run_relay(benchlab *b)
{
    if (b->no_direct)
        return 0;
    double d = direct_best_read(b);
    if (d <= 0)
        return cli_error("%s: O_DIRECT read failed", b->path);
    double best = 0;
    for (size_t k = 0; k < sizeof relay_readers / sizeof relay_readers[0]; k++) {
        double g = relayed_read_files(b, relay_readers[k]);
        if (g <= 0)
            return cli_error("%s: O_DIRECT read through relay slots failed", b->path);
        if (g > best) {
            best = g;
            b->relay_readers = relay_readers[k];
        }
    }
    put(b, BENCHLAB_DIRECT_RELAY, best);
    put(b, BENCHLAB_RELAY_GAIN, best / d);
    return 0;
}

/* What a cold load asks of the machine, done by a plain program: the O_DIRECT read of every file
 * into fresh memory of the model's size (limits_first_pass, all of it kept), once in small pages
 * faulted by the readers, once in huge pages faulted by two threads ahead, and once through relay
 * slots into small pages (limits_relayed_load, the relayed read's faster count of readers), each but the
 * first after the same O_DIRECT read and rest as every cold load: the fastest into
 * BENCHLAB_COLD_LIMIT. */
static int run_cold_limit(benchlab *b)
{
    static const fresh_way ways[] = {{0, LIMITS_PAGES_SMALL}, {2, LIMITS_PAGES_HUGE}};
    double best = 0;
    for (size_t w = 0; w < sizeof ways / sizeof ways[0] && !b->no_direct; w++) {
        int rc;
        if (w > 0) {
            if ((rc = run_direct_before(b)))
                return rc;
            settle(b);
        }
        double secs = first_pass_files(b, UINT64_MAX, ways[w]);
        if (secs <= 0)
            return cli_error("%s: O_DIRECT read into fresh memory: %s", b->path,
                             ferry_strerror(secs < 0 ? (int)secs : FERRY_EIO));
        if (best == 0 || (double)b->model / secs / 1e9 > best) {
            best = (double)b->model / secs / 1e9;
            b->cold_limit_pages = ways[w].pages;
            b->cold_limit_relayed = 0;
        }
    }
    /* and through relay slots, as ferry's arena is read where fresh huge pages are dear */
    if (!b->no_direct) {
        int rc = run_direct_before(b);
        if (rc)
            return rc;
        settle(b);
        double secs = 0;
        for (size_t i = 0; i < b->n_files; i++) {
            unsigned readers = b->relay_readers ? b->relay_readers : relay_readers[0];
            double one = 0, g = limits_relayed_load(b->files[i], readers, 0, &one);
            if (g < 0)
                return cli_error("%s: O_DIRECT read through relay slots: %s", b->files[i],
                                 ferry_strerror((int)g));
            secs += one;
        }
        if (secs > 0 && (double)b->model / secs / 1e9 > best) {
            best = (double)b->model / secs / 1e9;
            b->cold_limit_relayed = 1;
        }
    }
    if (best > 0)
        put(b, BENCHLAB_COLD_LIMIT, best);
    return 0;
}

/* The O_DIRECT sweep: for each (readers, request) pair the model's files read in turn, the
 * throughput of them all; the best pair is what the other O_DIRECT reads use. Its best figure is
 * reported but not the limit: the largest of eight samples of a disk that varies 10-30% from read
 * to read sits above what one read gives, and a load is one read (measured on the development
 * VM, 14 runs of a 2 or 4 GiB model: the best of eight 3-32% above the median of the single reads
 * with the best pair in the same run, median 10%). */
static int run_direct(benchlab *b)
{
    static const unsigned readers_all[] = {1, 2, 4, 8}, readers_quick[] = {1, 4};
    static const uint64_t req_all[] = {UINT64_C(64) << 20, UINT64_C(16) << 20},
                          req_quick[] = {UINT64_C(16) << 20};
    const unsigned *readers = b->quick ? readers_quick : readers_all;
    const uint64_t *reqs = b->quick ? req_quick : req_all;
    size_t nr = b->quick ? 2 : 4, nq = b->quick ? 1 : 2;
    double best = 0;
    for (size_t q = 0; q < nq; q++)
        for (size_t r = 0; r < nr; r++) {
            double secs = 0;
            for (size_t i = 0; i < b->n_files; i++) {
                double g = limits_direct_read(b->files[i], readers[r], reqs[q]);
                if (g == FERRY_EUNSUPPORTED) {
                    /* tmpfs, some overlay and FUSE setups: ferry's own reads fall back to the
                     * buffered descriptor there, and so does the limit. */
                    b->no_direct = 1;
                    return run_buffered(b, BENCHLAB_DIRECT_SWEEP);
                }
                if (g < 0)
                    return cli_error("%s: O_DIRECT read: %s", b->files[i],
                                     ferry_strerror((int)g));
                secs += (double)b->file_sizes[i] / (g * 1e9);
            }
            double g = secs > 0 ? (double)b->file_bytes / secs / 1e9 : 0;
            if (g > best) {
                best = g;
                if (g > b->direct_best) {
                    b->direct_best = g;
                    b->direct_readers = readers[r];
                    b->direct_request = reqs[q];
                }
            }
        }
    put(b, BENCHLAB_DIRECT_SWEEP, best);
    return 0;
}

/* The best of 1 and 2 threads touching BYTES of fresh memory (HUGE: in 2 MiB pages), a rest
 * before the second: memory a measurement has just freed is not yet back with the host, and the
 * next one would fault it in much faster than a program that starts (bench/README.md). */
static double fresh_best(benchlab *b, int huge, uint64_t bytes, unsigned *threads)
{
    double best = 0;
    for (unsigned t = 1; t <= 2; t++) {
        if (t > 1)
            settle(b);
        double g = huge ? limits_fresh_huge_memory(bytes, t) : limits_fresh_memory(bytes, t);
        if (g < 0)
            return g;
        if (g > best) {
            best = g;
            *threads = t;
        }
    }
    return best;
}

/* Fresh memory of the model's size, then in 2 MiB pages a quarter of it: the memory a stream's
 * first pass fills, its budget's buffers (at M / 4, the smaller budget a run streams with). Each
 * after a rest, as every first pass is. */
static int run_fresh(benchlab *b)
{
    unsigned th = 1;
    double g = fresh_best(b, 0, b->model, &th);
    if (g < 0)
        return cli_error("fresh memory of %llu bytes: %s", (unsigned long long)b->model,
                         ferry_strerror((int)g));
    b->fresh_threads = th;
    put(b, BENCHLAB_FRESH, g);
    uint64_t kept = b->model / 4 > (UINT64_C(2) << 20) ? b->model / 4 : UINT64_C(2) << 20;
    settle(b);
    g = fresh_best(b, 1, kept, &th);
    if (g < 0)
        return cli_error("fresh memory of %llu bytes in 2 MiB pages: %s",
                         (unsigned long long)kept, ferry_strerror((int)g));
    b->fresh_huge_threads = th;
    put(b, BENCHLAB_FRESH_HUGE, g);
    return 0;
}

/* Resident memory read, best of 1 .. online CPUs threads (limits.c's default buffer: beyond the
 * last-level cache). */
static int run_read(benchlab *b)
{
    unsigned th = 1;
    double g = limits_read_bandwidth_best(0, 0, &th);
    if (g < 0)
        return cli_error("memory read: %s", ferry_strerror((int)g));
    b->read_threads = th;
    put(b, BENCHLAB_READ, g);
    return 0;
}

static int run_memcpy(benchlab *b)
{
    uint64_t n = b->model < (UINT64_C(1) << 30) ? b->model : (UINT64_C(1) << 30);
    double g = limits_memcpy(n);
    if (g < 0)
        return cli_error("memcpy of %llu bytes: %s", (unsigned long long)n,
                         ferry_strerror((int)g));
    put(b, BENCHLAB_MEMCPY, g);
    return 0;
}

/* mmap of every file (POPULATE: with MAP_POPULATE), one read per page; cold. */
static int run_mmap(benchlab *b, int populate)
{
    if (drop_files(b))
        return CLI_EXIT_FAIL;
    double t0 = ferry_now();
    for (size_t i = 0; i < b->n_files; i++) {
        size_t len = (size_t)b->file_sizes[i];
        if (!len)
            continue;
        int fd = open(b->files[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return cli_error("%s: %s", b->files[i], strerror(errno));
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return cli_error("%s: mmap: %s", b->files[i], strerror(errno));
        touch_pages(m, len, b->page);
        munmap(m, len);
    }
    double t = ferry_now() - t0;
    put(b, populate ? BENCHLAB_MMAP_POPULATE : BENCHLAB_MMAP_FAULT, (double)b->file_bytes / t / 1e9);
    return 0;
}

/* Decode passes a compute measurement times; the fastest counts, as the memory-read limit keeps
 * the best of its reads. */
#define COMPUTE_PASSES 3

/* ---- the read and the compute at once ---- */

typedef struct overlap_read {
    benchlab *b;
    double gbps;
    atomic_int done;
} overlap_read;

static void *overlap_read_main(void *arg)
{
    overlap_read *o = arg;
    o->gbps = direct_best_read(o->b);
    atomic_store(&o->done, 1);
    return NULL;
}

#define OVERLAP_ROUNDS 3

/* How much the O_DIRECT read and the compute slow each other when they run at once: a machine
 * whose disk is served on the cores its CPUs run on (a virtual machine's emulated disk) shares
 * them, and a stream that overlaps its reads with its compute cannot reach the larger of the two
 * alone. OVERLAP_ROUNDS times: the compute alone (median of three passes over the resident
 * weights of SETS), the read alone (the best readers and request size), then the read again
 * while passes run back to back; a sample of each ratio per round: the read's rate busy / alone,
 * and the compute's, as the mean of the passes that ended while the read ran (the first pass
 * where none did) against alone. Drops the files from the page cache (the reads), and warms them
 * again. Returns 0, or CLI_EXIT_FAIL after printing why. */
static int run_overlap(benchlab *b, layer_set *sets, size_t nsets)
{
    if (b->no_direct)
        return 0;
    for (int k = 0; k < OVERLAP_ROUNDS; k++) {
        double c[3];
        for (int i = 0; i < 3; i++) {
            double c0 = ferry_now();
            compute_sets(b, sets, 0, nsets);
            c[i] = ferry_now() - c0;
        }
        double alone_c = median(c, 3), alone_r = direct_best_read(b);
        if (alone_r <= 0)
            return cli_error("%s: O_DIRECT read failed", b->path);
        overlap_read o = {.b = b, .gbps = 0};
        atomic_init(&o.done, 0);
        pthread_t th;
        if (pthread_create(&th, NULL, overlap_read_main, &o) != 0)
            return cli_error("cannot start a thread");
        double busy = 0, first = 0;
        int n = 0;
        while (!atomic_load(&o.done)) {
            double c0 = ferry_now();
            compute_sets(b, sets, 0, nsets);
            double t = ferry_now() - c0;
            if (!atomic_load(&o.done)) {
                busy += t;
                n++;
            } else if (!n) {
                first = t;
            }
        }
        pthread_join(th, NULL);
        if (o.gbps <= 0)
            return cli_error("%s: O_DIRECT read failed", b->path);
        double busy_c = n ? busy / n : first;
        put(b, BENCHLAB_OVERLAP_READ, o.gbps / alone_r);
        if (busy_c > 0)
            put(b, BENCHLAB_OVERLAP_COMPUTE, alone_c / busy_c);
    }
    return warm_files(b);
}

/* One load by ferry into host memory (home host, load MODE), to ready; cold when COLD. Puts GB/s
 * into slot M (seconds for BENCHLAB_WARM_AUTO); with COMPUTE also times COMPUTE_PASSES decode
 * passes over the resident weights and puts the fastest into BENCHLAB_COMPUTE. */
static int run_load(benchlab *b, ferry_load mode, int cold, int m, int compute)
{
    if (cold && drop_files(b))
        return CLI_EXIT_FAIL;
    ferry_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.home = FERRY_HOME_HOST;
    pol.load = mode;
    /* A private copy means every tensor, however large; AUTO is ferry's choice, lazy included. */
    pol.lazy = mode == FERRY_LOAD_AUTO ? FERRY_LAZY_AUTO : FERRY_LAZY_OFF;
    layer_set *sets = NULL;
    size_t nsets = 0;
    int rc = 0;
    double t0 = ferry_now();
    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    if (ferry_open(f, b->path, NULL)) {
        rc = cli_fail(b->path, ferry_errmsg(f), -1);
        goto out;
    }
    if (ferry_group_add(f, "all", "*", &pol) || ferry_load_group(f, NULL)) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto out;
    }
    if (m == BENCHLAB_COLD_AUTO)
        ferry_get_cold_load(f, &b->cold);
    if ((rc = build_sets(f, &sets, &nsets)))
        goto out;
    ferry_tensor **all = nsets ? sets[0].t : NULL;
    size_t n_all = 0;
    for (size_t s = 0; s < nsets; s++)
        n_all += sets[s].n;
    if (n_all && ferry_prepare(f, all, n_all)) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto out;
    }
    for (size_t i = 0; i < n_all; i++)
        touch_pages(ferry_tensor_data(all[i]), ferry_tensor_nbytes(all[i]), b->page);
    double t = ferry_now() - t0;
    put(b, m, m == BENCHLAB_WARM_AUTO ? t : (double)b->model / t / 1e9);
    if (compute) {
        double best = 0;
        for (int k = 0; k < COMPUTE_PASSES; k++) {
            double c0 = ferry_now();
            compute_sets(b, sets, 0, nsets);
            double c = ferry_now() - c0;
            best = k == 0 || c < best ? c : best;
        }
        put(b, BENCHLAB_COMPUTE, best);
        if ((rc = run_overlap(b, sets, nsets)))
            goto out;
    }
    if (m == BENCHLAB_WARM_AUTO) {
        /* "no copy" only when ferry's plan says every tensor is served from the mapping */
        ferry_placement *pl = NULL;
        size_t np = 0;
        if (ferry_plan(f, &pl, &np, NULL) == 0)
            for (size_t i = 0; i < np; i++)
                b->auto_copies |= !pl[i].zero_copy && !pl[i].lazy;
        free(pl);
    }
    rc = verify_loaded(sets, nsets);
    ferry_release_all(f);
out:
    free_sets(sets);
    ferry_destroy(f);
    return rc;
}

/* Streamed passes under BUDGET: on the cpu (home disk, host budget), on DEVICE (home host,
 * device budget), or split over b->split_devs (home host, each its budget B_i) when SPLIT. */
static int run_stream(benchlab *b, uint64_t budget, const char *device, int split, benchlab_stream *r)
{
    memset(r, 0, sizeof *r);
    r->device = split ? "split" : device;
    r->split = split;
    r->passes = b->passes;
    if (split) {
        budget = 0;
        for (int i = 0; i < b->n_split; i++) {
            budget += b->split_devs[i].budget;
            r->raised |= b->split_devs[i].raised;
        }
        device = r->device;
    } else if (budget < b->working_set) {
        budget = b->working_set; /* the least budget a layer-by-layer pass can run in */
        r->raised = 1;
    }
    r->budget = budget;
    ferry_options o;
    memset(&o, 0, sizeof o);
    if (!device)
        o.host_budget = budget;
    o.io_threads = b->stream_readers;
    o.io_request_bytes = b->stream_request;
    if (b->split_large) /* the row ranges of split_large_tensors stream as the tensors they cut */
        o.slice_evict = FERRY_SLICE_EVICT_CYCLIC;
    ferry *f = ferry_create(&o);
    if (!f)
        return cli_error("cannot make a manager with a host budget of %llu bytes (out of memory, "
                         "or above what the host can hold)", (unsigned long long)o.host_budget);
    ferry_io_settings ios;
    if (ferry_get_io_settings(f, &ios) == 0) {
        r->readers = ios.io_threads;
        r->request = ios.request_bytes;
    }
    ferry_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.load = FERRY_LOAD_AUTO;
    pol.home = device ? FERRY_HOME_HOST : FERRY_HOME_DISK;
    layer_set *sets = NULL;
    size_t nsets = 0;
    int rc = 0, dev = 0;
    if (split) {
        if ((rc = runopts_split("bench", b->split, f, &pol)))
            goto out;
        for (int i = 0; i < b->n_split && !rc; i++)
            if (b->split_devs[i].id && b->split_devs[i].budget &&
                ferry_set_budget(f, b->split_devs[i].id, b->split_devs[i].budget))
                rc = cli_error("%s", ferry_errmsg(f));
        if (rc)
            goto out;
        dev = pol.compute_device;
    } else if (device && (ferry_add_device(f, device, &dev) || ferry_set_budget(f, dev, budget))) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto out;
    }
    pol.compute_device = dev;
    ferry_device_info di;
    r->computes = !split && ferry_get_device_info(f, dev, &di) == 0 && di.host_accessible;
    if (ferry_open(f, b->path, NULL)) {
        rc = cli_fail(b->path, ferry_errmsg(f), -1);
        goto out;
    }
    if (b->groups.n_groups) {
        /* each group starts from this stream's policy */
        runopts_free(&b->groups);
        b->groups.policy = pol;
        if ((rc = runopts_parse_groups("bench", &b->groups, &pol)) ||
            (rc = runopts_add_groups(&b->groups, f)))
            goto out;
    }
    if (ferry_group_add(f, "all", "*", &pol)) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto out;
    }
    if ((rc = build_sets(f, &sets, &nsets)))
        goto out;
    /* W is what is in use plus what is in flight: where a layer is above 1/32 of the budget
     * (two layers would take a sixteenth of it from the kept set), tensors are those units, and
     * a tensor above it is cut into row ranges */
    if (b->split_large && budget &&
        ((rc = split_large_sets(&sets, &nsets, budget / 32)) ||
         (rc = split_large_tensors(f, &sets, &nsets, budget / 32))))
        goto out;
    r->sets = nsets;
    r->working_set = b->split_large ? sets_working_set(sets, nsets) : 0;
    for (uint32_t p = 0; p < r->passes && !rc; p++) {
        /* limit, pass, limit, pass: the disk drifts, so each judged pass gets its own limit,
         * measured with the best readers/request size found earlier */
        if (!device && !b->no_direct && !b->split_large)
            r->disk[p] = disk_now(b, &r->limit[p]);
        if (!device && (rc = drop_files(b)))
            break;
        if (p == 0 && b->sweeping)
            settle(b);
        else if (p == 0)
            rest_long(b);
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        double t0 = ferry_now();
        for (size_t s = 0; s < nsets; s++) {
            if (ferry_prepare(f, sets[s].t, sets[s].n)) {
                rc = cli_error("%s", ferry_errmsg(f));
                break;
            }
            if (r->computes)
                compute_sets(b, sets, s, s + 1);
            ferry_release(f, sets[s].t, sets[s].n);
        }
        r->seconds[p] = ferry_now() - t0;
        ferry_get_stats(f, &s1);
        if (p == 0)
            r->first_ahead = s1.faulted_ahead_bytes;
        /* What came into the compute device's memory from outside it: read from the file on the
         * cpu, copied to the device otherwise. */
        r->bytes[p] = device ? s1.bytes_copied - s0.bytes_copied : s1.bytes_read - s0.bytes_read;
        step_done(b);
    }
out:
    free_sets(sets);
    ferry_destroy(f);
    /* the first pass's own limit: the same read, the kept bytes into fresh memory; after the
     * stream and a long rest, so that the memory it frees cannot be the first pass's */
    if (!rc && !device && !b->no_direct && !b->split_large && !b->sweeping)
        r->first_limit_s = first_pass_limit(b, r->budget < b->model ? r->budget : b->model,
                                            &r->first_limit_faulters, &r->first_limit_pages);
    return rc;
}

/* Median of passes 2..N and the bound. */
static void judge_stream(benchlab *b, benchlab_stream *r)
{
    r->seconds_med = median(r->seconds + 1, r->passes - 1);
    r->bytes_med = median_u64(r->bytes + 1, r->passes - 1);
    if (r->split) {
        /* the devices copy in parallel: the slowest one's share through its own link */
        r->optimal = 0;
        r->transfer_s = 0;
        for (int i = 0; i < b->n_split; i++) {
            r->optimal += b->split_devs[i].optimal;
            if (b->split_devs[i].transfer_s > r->transfer_s)
                r->transfer_s = b->split_devs[i].transfer_s;
        }
        r->compute_s = 0;
        r->bound = r->transfer_s;
        r->efficiency = r->seconds_med > 0 ? r->bound / r->seconds_med : 0;
        return;
    }
    uint64_t opt = b->model > r->budget ? b->model - r->budget : 0;
    opt += r->working_set ? r->working_set : b->working_set;
    r->optimal = opt < b->model ? opt : b->model;
    r->limit_med = r->device ? 0 : median(r->limit + 1, r->passes - 1);
    r->disk_med = r->device ? 0 : median(r->disk + 1, r->passes - 1);
    /* the disk's rate: as measured between the passes (disk_now), else before the cold loads */
    double rate = r->device ? b->device_bw
                            : (r->disk_med > 0 ? r->disk_med : b->med[BENCHLAB_DISK]) * 1e9;
    r->transfer_s = rate > 0 ? (double)r->optimal / rate : 0;
    r->compute_s = r->computes ? b->med[BENCHLAB_COMPUTE] : 0;
    r->bound = r->transfer_s > r->compute_s ? r->transfer_s : r->compute_s;
    r->efficiency = r->seconds_med > 0 ? r->bound / r->seconds_med : 0;
    /* The same with the CPUs shared as measured: the read and the compute at once, each at its
     * rate while the other runs, until one is done, then the other alone; or one after the other
     * where that is sooner. A ratio above 1 (noise) counts as 1, so that this bound is never
     * below the first. */
    double orr = fmin(b->med[BENCHLAB_OVERLAP_READ], 1),
           orc = fmin(b->med[BENCHLAB_OVERLAP_COMPUTE], 1);
    r->overlap_bound = r->overlap_efficiency = 0;
    if (!r->device && r->compute_s > 0 && rate > 0 && orr > 0 && orc > 0) {
        double rb = rate * orr, cb = r->compute_s / orc, tr = (double)r->optimal / rb;
        r->overlap_bound = tr <= cb ? tr + (1 - tr / cb) * r->compute_s
                                    : cb + ((double)r->optimal - cb * rb) / rate;
        /* never worse than one after the other, which a stream may always do */
        r->overlap_bound = fmin(r->overlap_bound, r->transfer_s + r->compute_s);
        r->overlap_efficiency = r->seconds_med > 0 ? r->overlap_bound / r->seconds_med : 0;
    }
    r->passes_per_second = r->seconds_med > 0 ? 1 / r->seconds_med : 0;
    /* the first pass reads all of M (nothing is cached yet), in file order */
    double rate0 = r->device ? b->device_bw
                             : (r->disk[0] > 0 ? r->disk[0] : b->med[BENCHLAB_DISK]) * 1e9;
    double t0 = rate0 > 0 ? (double)b->model / rate0 : 0;
    r->first_seconds = r->seconds[0];
    r->first_bound = t0 > r->compute_s ? t0 : r->compute_s;
    r->first_efficiency = r->first_seconds > 0 ? r->first_bound / r->first_seconds : 0;

    /* It also fills the memory the budget keeps, which no pass before it faulted in: at the
     * rate of fresh memory in 2 MiB pages (the host buffers of a stream take them), where that
     * was measured. */
    double fresh = r->device ? 0 : b->med[BENCHLAB_FRESH_HUGE] * 1e9;
    uint64_t kept = r->budget < b->model ? r->budget : b->model;
    r->first_fault_s = fresh > 0 ? (double)kept / fresh : 0;
    double machine = r->first_bound > r->first_limit_s ? r->first_bound : r->first_limit_s;
    r->first_machine_efficiency = r->first_seconds > 0 ? machine / r->first_seconds : 0;
    if (r->capped && !r->device) {
        double rate = (r->disk_med > 0 ? r->disk_med : b->med[BENCHLAB_DISK]) * 1e9;
        uint64_t streamed = b->model > r->budget ? b->model - r->budget : 0;
        r->target_passes_per_second = streamed ? 0.8 * rate / (double)streamed : 0;
    }
}

/* ---- one run ----------------------------------------------------------------------------- */

/* The order within a run. The O_DIRECT limit comes first; then the four cold loads from the disk
 * (ferry's private copy, mmap page faults, ferry's choice, mmap + populate) and a plain
 * program's (run_cold_limit), each after a drop of the files, in an order that rotates from run
 * to run: on these virtual machines a measurement is swayed by the one before it (memory freed
 * in bulk goes back to the host and is slow to get back: with a fixed order, ferry's zero-copy
 * load read at 0.82 of mmap page faults when it followed the fresh-memory test and page faults at
 * 0.64 of ferry when they followed ferry's private copy), so no figure always follows the same
 * neighbour. Then the limits and loads that need the files cached or fresh memory. */
static int run_cold(benchlab *b, int which)
{
    switch (which) {
    case 0: return run_load(b, FERRY_LOAD_DIRECT, 1, BENCHLAB_COLD_DIRECT, 0);
    case 1: return run_mmap(b, 0);
    case 2: return run_load(b, FERRY_LOAD_AUTO, 1, BENCHLAB_COLD_AUTO, 0);
    case 3: return run_mmap(b, 1);
    default: return run_cold_limit(b);
    }
}

static int run_once(benchlab *b, size_t run)
{
    int rc;
    if ((rc = run_direct(b)) || (rc = run_relay(b)))
        return rc;
    step_done(b);
    for (int k = 0; k < 5; k++) {
        if ((rc = run_direct_before(b)))
            return rc;
        settle(b);
        if ((rc = run_cold(b, (int)((k + run) % 5))))
            return rc;
        step_done(b);
    }
    if ((rc = run_buffered(b, BENCHLAB_BUFFERED)))
        return rc;
    step_done(b);
    settle(b);
    if ((rc = run_fresh(b)))
        return rc;
    step_done(b);
    if ((rc = warm_files(b)) || (rc = run_memcpy(b)) || (rc = run_read(b)))
        return rc;
    step_done(b);
    settle(b);
    if ((rc = run_load(b, FERRY_LOAD_READ, 0, BENCHLAB_WARM_READ, 1)))
        return rc;
    step_done(b);
    settle(b);
    if ((rc = run_load(b, FERRY_LOAD_AUTO, 0, BENCHLAB_WARM_AUTO, 0)))
        return rc;
    step_done(b);
    return 0;
}

#define STEPS_PER_RUN 11

void benchlab_load_average(char *buf, size_t cap)
{
    snprintf(buf, cap, "?");
    FILE *fp = fopen("/proc/loadavg", "r");
    if (!fp)
        return;
    double a;
    if (fscanf(fp, "%lf", &a) == 1)
        snprintf(buf, cap, "%.2f", a);
    fclose(fp);
}

/* Whether OPS has MEMBER (a device built against an older table ends before it). */
#define OPS_HAS(ops, member) \
    ((ops)->size >= offsetof(ferry_device_ops, member) + sizeof((ops)->member) && (ops)->member)

int benchlab_link_bandwidth(const char *spec, double *bw, char *why, size_t why_len)
{
    uint64_t chunk = UINT64_C(64) << 20;
    const int count = 16;
    ferry_device *d = NULL;
    void *host[2] = {NULL, NULL}, *dev = NULL;
    int pinned = 0, rc = -1;
    *bw = 0;
    if (ferry_device_open(spec, &d, why, why_len))
        return -1;
    const ferry_device_ops *ops = d->ops;
    uint64_t free_bytes = 0, total = 0; /* a small device: copies of a quarter of what is free */
    if (OPS_HAS(ops, mem_info) && ops->mem_info(d, &free_bytes, &total) == 0 &&
        free_bytes / 4 < chunk)
        chunk = free_bytes / 4 & ~((UINT64_C(1) << 20) - 1);
    if (!chunk) {
        snprintf(why, why_len, "%s: under 4 MiB free on the device", spec);
        ferry_device_close(d);
        return -1;
    }
    pinned = OPS_HAS(ops, host_alloc) && OPS_HAS(ops, host_free);
    for (int s = 0; s < 2; s++)
        if (pinned ? ops->host_alloc(d, chunk, &host[s]) != 0
                   : !(host[s] = malloc((size_t)chunk))) {
            snprintf(why, why_len, "%s: cannot allocate %llu MiB of %shost memory", spec,
                     (unsigned long long)(chunk >> 20), pinned ? "pinned " : "");
            goto out;
        }
    if (ops->alloc(d, 2 * chunk, &dev)) {
        snprintf(why, why_len, "%s: cannot allocate %llu MiB on the device", spec,
                 (unsigned long long)(2 * chunk >> 20));
        goto out;
    }
    memset(host[0], 1, (size_t)chunk);
    memset(host[1], 2, (size_t)chunk);
    for (int rep = 0; rep < 3; rep++) {
        uint64_t tk[2] = {0, 0};
        int live[2] = {0, 0}, failed = 0;
        double t0 = ferry_now();
        for (int i = 0; i < count + 2 && !failed; i++) {
            int s = i & 1;
            if (live[s]) { /* a ticket is waited on once, failed or not */
                live[s] = 0;
                failed = ops->wait(d, tk[s]) != 0;
            }
            if (i < count && !failed) {
                failed = ops->copy_h2d(d, (char *)dev + s * chunk, host[s], chunk, &tk[s]) != 0;
                live[s] = !failed;
            }
        }
        if (failed) {
            for (int s = 0; s < 2; s++) /* nothing in flight on the buffers freed below */
                if (live[s])
                    (void)ops->wait(d, tk[s]);
            snprintf(why, why_len, "%s: a copy to the device failed", spec);
            *bw = 0;
            goto out;
        }
        double rate = (double)chunk * count / (ferry_now() - t0);
        if (rate > *bw)
            *bw = rate;
    }
    rc = 0;
out:
    if (dev)
        ops->free(d, dev);
    for (int s = 0; s < 2; s++)
        if (host[s]) {
            if (pinned)
                ops->host_free(d, host[s]);
            else
                free(host[s]);
        }
    ferry_device_close(d);
    return rc;
}

int benchlab_spec_bandwidth(const char *spec, double *bw)
{
    const char *at = strchr(spec, '@');
    *bw = 0;
    if (!at)
        return 0;
    char buf[64];
    size_t n = strcspn(at + 1, ",");
    if (n >= sizeof buf)
        return -1;
    memcpy(buf, at + 1, n);
    buf[n] = 0;
    size_t len = strlen(buf);
    if (len > 2 && strcmp(buf + len - 2, "/s") == 0)
        buf[len - 2] = 0;
    uint64_t v;
    if (ferry_parse_size(buf, &v) || v == 0)
        return -1;
    *bw = (double)v;
    return 0;
}

/* The split stream's devices, added to a scratch manager as the stream adds them (runopts_split,
 * the same ids): each one's share of the model and working set from the dry run (ferry_plan of
 * the same policy), its budget, optimal bytes and link bandwidth. Returns 0, CLI_EXIT_USAGE or
 * CLI_EXIT_FAIL after printing why. */
static int split_prepare(benchlab *b)
{
    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    ferry_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.home = FERRY_HOME_HOST;
    pol.load = FERRY_LOAD_AUTO;
    ferry_placement *pl = NULL;
    size_t np = 0;
    uint64_t *lay = NULL;
    int rc = runopts_split("bench", b->split, f, &pol);
    if (!rc && pol.n_split < 2)
        rc = cli_usage_error("bench", "--split: two devices or more (SPEC,SPEC[:WEIGHT])");
    for (int i = 0; i < pol.n_split && !rc; i++) {
        benchlab_split_dev *sd = &b->split_devs[i];
        ferry_device_info di;
        memset(sd, 0, sizeof *sd);
        sd->id = pol.split_devices[i];
        sd->weight = pol.split_weights[i] > 0 ? pol.split_weights[i] : 1;
        if (ferry_get_device_info(f, sd->id, &di)) {
            rc = cli_error("%s", ferry_errmsg(f));
            break;
        }
        snprintf(sd->name, sizeof sd->name, "%s", di.name);
        if (!di.host_accessible && (benchlab_spec_bandwidth(di.name, &sd->bw) || sd->bw <= 0))
            rc = cli_usage_error("bench", "--split: '%s' gives no bandwidth to judge against "
                                 "(sim:SIZE@BW)", di.name);
    }
    if (!rc)
        b->n_split = pol.n_split;
    if (!rc && ferry_open(f, b->path, NULL))
        rc = cli_fail(b->path, ferry_errmsg(f), -1);
    if (!rc && (ferry_group_add(f, "all", "*", &pol) || ferry_plan(f, &pl, &np, NULL)))
        rc = cli_error("%s", ferry_errmsg(f));
    /* bytes per (layer, device): consecutive placements whose names share a layer key */
    size_t nl = 0;
    if (!rc && !(lay = calloc((np ? np : 1) * (size_t)b->n_split, sizeof *lay)))
        rc = cli_error("out of memory");
    for (size_t i = 0; i < np && !rc; i++) {
        size_t len = layer_key_len(pl[i].name);
        if (!i || len != layer_key_len(pl[i - 1].name) ||
            strncmp(pl[i].name, pl[i - 1].name, len) != 0)
            nl++;
        for (int k = 0; k < b->n_split; k++)
            if (b->split_devs[k].id == pl[i].compute_device)
                lay[(nl - 1) * (size_t)b->n_split + (size_t)k] += pl[i].compute_bytes;
    }
    for (int k = 0; k < b->n_split && !rc; k++) {
        benchlab_split_dev *sd = &b->split_devs[k];
        for (size_t l = 0; l < nl; l++) {
            uint64_t here = lay[l * (size_t)b->n_split + (size_t)k];
            uint64_t next = nl > 1 ? lay[((l + 1) % nl) * (size_t)b->n_split + (size_t)k] : 0;
            sd->share += here;
            if (here + next > sd->working_set)
                sd->working_set = here + next;
        }
        if (sd->bw <= 0) {
            sd->working_set = 0; /* read in place: nothing staged, no budget, no transfer */
            continue;
        }
        sd->budget = sd->share / 4;
        if (sd->share && sd->budget < sd->working_set) {
            sd->budget = sd->working_set;
            sd->raised = 1;
        }
        uint64_t opt = sd->share - (sd->budget < sd->share ? sd->budget : sd->share) +
                       sd->working_set;
        sd->optimal = opt < sd->share ? opt : sd->share;
        sd->transfer_s = (double)sd->optimal / sd->bw;
    }
    free(lay);
    free(pl);
    ferry_destroy(f);
    return rc;
}

void benchlab_close(benchlab *b)
{
    for (size_t i = 0; i < b->n_files; i++)
        free(b->files ? b->files[i] : NULL);
    free(b->files);
    free(b->file_sizes);
    free(b->x);
    free(b->y);
    free(b->units);
    for (size_t i = 0; i < b->n_vecs; i++)
        free(b->vecs[i].xq);
    free(b->vecs);
    runopts_free(&b->groups);
}


int benchlab_open(benchlab *b)
{
    long pg = sysconf(_SC_PAGESIZE);
    b->page = pg > 0 ? (uint64_t)pg : 4096;
    if (describe_model(b))
        return CLI_EXIT_FAIL;
    return b->split ? split_prepare(b) : 0;
}

/* The sweep of the streams' own I/O settings, as the O_DIRECT limit is swept: for each (readers,
 * request) pair two passes at budget M/4 (the first records the order), the second timed; the
 * fastest pair is what the judged streams use. Skipped when --stream-io fixed them. */
static int sweep_stream_io(benchlab *b)
{
    static const uint32_t readers_all[] = {1, 2, 4, 8}, readers_quick[] = {2, 4};
    static const uint64_t req_all[] = {UINT64_C(4) << 20, UINT64_C(16) << 20, UINT64_C(64) << 20},
                          req_quick[] = {UINT64_C(16) << 20};
    const uint32_t *readers = b->quick ? readers_quick : readers_all;
    const uint64_t *reqs = b->quick ? req_quick : req_all;
    size_t nr = b->quick ? 2 : 4, nq = b->quick ? 1 : 3;
    uint32_t saved_passes = b->passes;
    double best = 0;
    uint32_t best_r = 0;
    uint64_t best_q = 0;
    int rc = 0;
    static benchlab_stream r; /* large: the samples */
    b->passes = 2;
    b->sweeping = 1; /* judged by the second pass: no long rest, no first-pass limit */
    for (size_t q = 0; q < nq && !rc; q++)
        for (size_t i = 0; i < nr && !rc; i++) {
            b->stream_readers = readers[i];
            b->stream_request = reqs[q];
            rc = run_stream(b, b->model / 4, NULL, 0, &r);
            if (rc || b->n_io_points >= BENCHLAB_MAX_IO_POINTS)
                break;
            benchlab_io_point *pt = &b->io_points[b->n_io_points++];
            pt->readers = r.readers;
            pt->request = r.request;
            pt->seconds = r.seconds[1];
            pt->bytes = r.bytes[1];
            if (pt->seconds > 0 && (best <= 0 || pt->seconds < best)) {
                best = pt->seconds;
                best_r = pt->readers;
                best_q = pt->request;
            }
        }
    b->passes = saved_passes;
    b->sweeping = 0;
    b->stream_readers = best_r;
    b->stream_request = best_q;
    return rc;
}

/* The stream under budget C - 256 MiB in a child process inside a memory cgroup of C bytes: the
 * kernel enforces the cap (ferry's default budget and its own accounting see the cgroup's limit).
 * 0 with R filled, 0 with b->cap_why set when it could not run (not root, no controller, the
 * child killed), or CLI_EXIT_FAIL when the stream itself failed. */
static int run_capped(benchlab *b, benchlab_stream *r)
{
    const uint64_t margin = UINT64_C(256) << 20;
    if (b->cap <= margin + b->working_set) {
        snprintf(b->cap_why, sizeof b->cap_why, "--cap %llu bytes leaves no budget above the "
                 "working set (%llu bytes) after its 256 MiB margin",
                 (unsigned long long)b->cap, (unsigned long long)b->working_set);
        return 0;
    }
    memcap m;
    char name[64];
    snprintf(name, sizeof name, "ferry-bench-%ld", (long)getpid());
    const char *root = getenv("FERRY_BENCH_CGROUP_ROOT"); /* tests: a fake hierarchy */
    if (memcap_create(root, name, b->cap, &m, b->cap_why, sizeof b->cap_why))
        return 0;
    snprintf(b->cap_where, sizeof b->cap_where, "%s (cgroup %s)", m.dir, m.v2 ? "v2" : "v1");
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(b->cap_why, sizeof b->cap_why, "pipe: %s", strerror(errno));
        memcap_remove(&m);
        return 0;
    }
    /* the O_DIRECT limit around the child, out of the cgroup: its buffers (readers x request,
     * up to 512 MiB) would be charged to the cap beside ferry's budget */
    double lim0 = 0, disk0 = b->no_direct ? 0 : disk_now(b, &lim0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(b->cap_why, sizeof b->cap_why, "fork: %s", strerror(errno));
        close(fds[0]), close(fds[1]);
        memcap_remove(&m);
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        char why[512];
        int crc = 2;
        if (memcap_join(&m, 0, why, sizeof why) == 0) {
            b->bar.on = 0;
            b->split_large = 1;
            crc = run_stream(b, b->cap - margin, NULL, 0, r) ? 1 : 0;
        } else {
            fprintf(stderr, "ferry bench: %s\n", why);
        }
        if (!crc) {
            const char *p = (const char *)r;
            size_t left = sizeof *r;
            while (left) {
                ssize_t w = write(fds[1], p, left);
                if (w <= 0)
                    break;
                p += w, left -= (size_t)w;
            }
        }
        close(fds[1]);
        _exit(crc);
    }
    close(fds[1]);
    benchlab_stream got;
    size_t have = 0;
    while (have < sizeof got) {
        ssize_t n = read(fds[0], (char *)&got + have, sizeof got - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    long kills = -1, fails = memcap_failures(&m, &kills);
    memcap_remove(&m);
    if (WIFSIGNALED(st)) {
        snprintf(b->cap_why, sizeof b->cap_why, "the capped stream was killed by signal %d "
                 "(memory refused %ld time(s), OOM kills %ld)", WTERMSIG(st), fails, kills);
        return 0;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) == 2) {
        snprintf(b->cap_why, sizeof b->cap_why, "the child could not join the cgroup %s",
                 b->cap_where);
        return 0;
    }
    if (WEXITSTATUS(st) != 0 || have != sizeof got)
        return CLI_EXIT_FAIL; /* the child printed why */
    *r = got;
    r->device = NULL;
    r->capped = 1;
    double lim1 = 0, disk1 = b->no_direct ? 0 : disk_now(b, &lim1);
    for (uint32_t p = 0; p < r->passes; p++) {
        r->limit[p] = lim0 > 0 && lim1 > 0 ? (lim0 + lim1) / 2 : lim0 > 0 ? lim0 : lim1;
        r->disk[p] = disk0 > 0 && disk1 > 0 ? (disk0 + disk1) / 2 : disk0 > 0 ? disk0 : disk1;
    }
    for (uint32_t p = 0; p < r->passes; p++)
        step_done(b);
    return 0;
}

int benchlab_measure(benchlab *b, int progress)
{
    int rc = 0;
    int sweep = !b->stream_readers && !b->stream_request;
    size_t points = sweep ? (b->quick ? 2 : 12) : 0;
    if (b->cap_only) {
        b->streams_only = 1;
        sweep = 0;
        points = 0;
    }
    uint64_t total_steps = (b->streams_only ? 1 : b->runs * STEPS_PER_RUN) + 2 * points +
                           (uint64_t)b->passes * ((b->cap_only ? 0 : 2) + (b->device ? 1 : 0) +
                                                  (b->split ? 1 : 0) + (b->cap ? 1 : 0));
    cli_progress_start(&b->bar, "bench", total_steps * b->model, progress);
    if (b->streams_only) {
        /* the limit the streams are judged against, nothing else: no loads, no compute */
        rc = run_direct(b);
        if (!rc)
            rc = run_relay(b);
        if (!rc)
            rc = run_direct_before(b);
        step_done(b);
        /* the capped stream alone is bound by the disk: without a sweep of its own it reads as
         * the fastest O_DIRECT readers and request size of the limit */
        if (b->cap_only && !b->stream_readers && !b->stream_request) {
            b->stream_readers = b->direct_readers;
            b->stream_request = b->direct_request;
        }
    }
    for (size_t r = 0; r < b->runs && !rc && !b->streams_only; r++)
        rc = run_once(b, r);
    for (int m = 0; m < BENCHLAB_COUNT && !rc; m++)
        b->med[m] = median(b->v[m], b->n[m]);
    if (sweep && !rc)
        rc = sweep_stream_io(b);
    static const unsigned den[2] = {4, 2};
    for (int i = 0; i < 2 && !rc && !b->cap_only; i++) {
        rc = run_stream(b, b->model / den[i], NULL, 0, &b->streams[b->n_streams]);
        if (!rc)
            judge_stream(b, &b->streams[b->n_streams++]);
    }
    if (b->device && !rc) {
        rc = run_stream(b, b->model / 4, b->device, 0, &b->streams[b->n_streams]);
        if (!rc)
            judge_stream(b, &b->streams[b->n_streams++]);
    }
    if (b->split && !rc) {
        rc = run_stream(b, 0, NULL, 1, &b->streams[b->n_streams]);
        if (!rc)
            judge_stream(b, &b->streams[b->n_streams++]);
    }
    if (b->cap && !rc) {
        benchlab_stream *r = &b->streams[b->n_streams];
        memset(r, 0, sizeof *r);
        rc = run_capped(b, r);
        if (!rc && r->capped)
            judge_stream(b, &b->streams[b->n_streams++]);
    }
    cli_progress_end(&b->bar);
    return rc ? CLI_EXIT_FAIL : 0;
}
