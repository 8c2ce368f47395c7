/*
 * load_bench.c — cold and warm loads of a model into host RAM, against the machine's own limits
 * measured in the same run, alternating limit and ferry runs so that drift (other processes on a
 * shared machine, the host's page reporting) hits both alike.
 *
 * Targets (1) and (2) of bench/README.md:
 *   cold: ferry load >= 0.9 x min(O_DIRECT read of the file, best of 1/2/4 readers with 64 MiB
 *         requests into reused buffers ; first touch of fresh memory of the same size), and no
 *         slower than a plain mmap with populate / will-need;
 *   warm: ferry load >= 0.8 x min(memcpy bandwidth ; first touch).
 * A ratio above 1.0 against a limit means the limit was measured wrong.
 *
 * What is measured (GB/s = 10^9 bytes of tensor data, or of file for the limits, per second):
 *   direct        limits_direct_read (tools/common/limits.c; drops the cache itself), best of
 *                 --readers
 *   first-touch   limits_fresh_memory_best of the file's size (best of 1 and 2 threads)
 *   ferry-direct  cold: ferry_create, ferry_open, ferry_group_add("*", home host, load DIRECT),
 *                 ferry_load_group(NULL), then ferry_prepare of every tensor and a read of one
 *                 byte per page of every data pointer ("ready": the bytes are in RAM and usable);
 *                 ferry_destroy is timed separately and not counted
 *   ferry-auto    the same with load AUTO (zero-copy from the mapping on the cpu device: the load
 *                 only advises WILLNEED, the page touches wait for the reads)
 *   ferry-read    the same with load READ (cold; informational)
 *   mmap-fault    mmap the file, read one byte per page
 *   mmap-populate mmap with MAP_POPULATE, then the same reads
 *   mmap-willneed mmap, madvise(MADV_WILLNEED) over the file, then the same reads
 *   mmap-seq      mmap, madvise(MADV_SEQUENTIAL), then the same reads (informational, off by
 *                 default)
 *   buffered      pread of the file into one reused 64 MiB buffer, one thread: the page cache's
 *                 own cold throughput with no destination cost (informational, off by default)
 *   direct-fresh  O_DIRECT read of the whole file into ONE fresh anonymous mapping of its size,
 *                 4 threads taking 16 MiB pieces in turn: ferry's DIRECT structure (chunk size,
 *                 threads, fresh destination) without its manager (informational, off by default)
 *   direct-huge   the same with madvise(MADV_HUGEPAGE) on the destination first (transparent huge
 *                 pages are "madvise" on these machines) (informational, off by default)
 *   memcpy        limits_memcpy of min(file, 1 GiB)
 *   warm-read     ferry with load READ, file in the page cache
 *   warm-auto     ferry with load AUTO, file in the page cache (zero-copy: page-table cost only)
 *   warm-direct   ferry with load DIRECT, file in the page cache (informational)
 * Before every cold run the file is dropped from the page cache (posix_fadvise DONTNEED) and the
 * bench checks with mincore that less than 1% of it stayed resident.
 *
 * usage: load_bench [options] MODEL
 *   --gen SIZE        when MODEL does not exist, write a llama-shaped f16 GGUF of about SIZE
 *                     (width 2048, vocab 32000: never smaller than about 350 MiB)
 *   --runs N          runs (default 3); medians over runs are quoted
 *   --only LIST       comma-separated subset of the names above
 *   --readers LIST    reader counts for the direct limit (default 1,2,4,8)
 *   --request SIZE    request size of the direct limit (default 64MiB)
 *   --io-threads N    ferry_options.io_threads (default: ferry's default)
 *   --no-verify       skip the check of each tensor's first and last bytes after ferry runs
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry.h"
#include "ferry_tools.h" /* the limits `ferry bench` measures (limits.h); plain POSIX */

#include "bench_util.h"

#define MAX_RUNS 32
#define MAX_READERS 8

enum {
    M_DIRECT, M_FIRST_TOUCH, M_FERRY_DIRECT, M_FERRY_AUTO, M_FERRY_READ, M_MMAP_FAULT,
    M_MMAP_POPULATE, M_MMAP_WILLNEED, M_MEMCPY, M_WARM_READ, M_WARM_AUTO, M_WARM_DIRECT,
    M_MMAP_SEQ, M_BUFFERED, M_DIRECT_FRESH, M_DIRECT_HUGE, M_COUNT
};

static const char *mname[M_COUNT] = {
    "direct", "first-touch", "ferry-direct", "ferry-auto", "ferry-read", "mmap-fault",
    "mmap-populate", "mmap-willneed", "memcpy", "warm-read", "warm-auto", "warm-direct",
    "mmap-seq", "buffered", "direct-fresh", "direct-huge"};

/* ferry-read is off by default: a cold buffered read is no target and costs a full read. */
static const int on_by_default[M_COUNT] = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0};

typedef struct sample {
    double gbs[MAX_RUNS];       /* headline: GB/s (ferry: to ready) */
    double load_gbs[MAX_RUNS];  /* ferry: to load_group's return */
    double destroy_s[MAX_RUNS]; /* ferry: ferry_destroy */
    size_t n;
} sample;

typedef struct bench {
    const char *path;
    uint64_t file_bytes;
    uint64_t tensor_bytes;
    unsigned readers[MAX_READERS];
    size_t n_readers;
    uint64_t request;
    uint32_t io_threads;
    int verify;
    size_t runs_done;
    int enabled[M_COUNT];
    sample s[M_COUNT];
    double direct_by_readers[MAX_READERS][MAX_RUNS];
    long page;
} bench;

static volatile unsigned char sink;

/* Reads one byte per page of [p, p+n). */
static void touch_read(const unsigned char *p, uint64_t n, long page)
{
    unsigned char acc = 0;
    for (uint64_t off = 0; off < n; off += (uint64_t)page)
        acc ^= ((const volatile unsigned char *)p)[off];
    if (n)
        acc ^= ((const volatile unsigned char *)p)[n - 1];
    sink ^= acc;
}

static int drop_and_check(const bench *b)
{
    if (bench_drop_cache(b->path) != 0) {
        fprintf(stderr, "load_bench: cannot drop %s from the page cache\n", b->path);
        return -1;
    }
    double frac = bench_cached_fraction(b->path);
    if (frac < 0 || frac > 0.01) {
        fprintf(stderr,
                "load_bench: %s still %.1f%% in the page cache after POSIX_FADV_DONTNEED; cold "
                "numbers would be wrong\n",
                b->path, frac * 100);
        return -1;
    }
    return 0;
}

/* ---- generating a model --------------------------------------------------------------------- */

static uint64_t xs_state = 0x9e3779b97f4a7c15ull;
static uint64_t xs_next(void)
{
    uint64_t x = xs_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return xs_state = x;
}

/* A llama-shaped f16 GGUF: embedding, N blocks of 9 tensors, norm, output; width 2048, ff 5632,
 * vocab 32000; N chosen so the file is about SIZE. Non-zero data (nothing sparse). */
static int generate(const char *path, uint64_t size)
{
    const int64_t D = 2048, FF = 5632, V = 32000;
    const uint64_t per_block = (uint64_t)(4 * D * D + 3 * D * FF) * 2 + 2 * (uint64_t)D * 4;
    const uint64_t fixed = (uint64_t)(2 * V * D) * 2 + (uint64_t)D * 4;
    uint64_t blocks = size > fixed ? (size - fixed + per_block / 2) / per_block : 1;
    if (blocks == 0)
        blocks = 1;
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    if (!w)
        return FERRY_ENOMEM;
    typedef struct td {
        char name[64];
        uint32_t ndim;
        int64_t shape[2];
        ferry_dtype dt;
    } td;
    size_t n = 0, cap = (size_t)blocks * 9 + 3;
    td *t = calloc(cap, sizeof *t);
    if (!t) {
        ferry_writer_destroy(w);
        return FERRY_ENOMEM;
    }
#define ADD(nm, nd, s0, s1, type)                                                                  \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                           \
        t[n].ndim = nd;                                                                            \
        t[n].shape[0] = s0;                                                                        \
        t[n].shape[1] = s1;                                                                        \
        t[n].dt = type;                                                                            \
        n++;                                                                                       \
    } while (0)
    char nm[64];
    ADD("token_embd.weight", 2, D, V, FERRY_DTYPE_F16);
    for (uint64_t bi = 0; bi < blocks; bi++) {
        static const char *names[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                      "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"};
        for (int k = 0; k < 9; k++) {
            snprintf(nm, sizeof nm, "blk.%llu.%s.weight", (unsigned long long)bi, names[k]);
            if (k == 0 || k == 5)
                ADD(nm, 1, D, 1, FERRY_DTYPE_F32);
            else if (k <= 4)
                ADD(nm, 2, D, D, FERRY_DTYPE_F16);
            else if (k == 8)
                ADD(nm, 2, FF, D, FERRY_DTYPE_F16);
            else
                ADD(nm, 2, D, FF, FERRY_DTYPE_F16);
        }
    }
    ADD("output_norm.weight", 1, D, 1, FERRY_DTYPE_F32);
    ADD("output.weight", 2, D, V, FERRY_DTYPE_F16);
#undef ADD
    int rc = ferry_writer_set_meta_str(w, "general.architecture", "llama");
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry_writer_add_tensor(w, t[i].name, t[i].dt, t[i].ndim, t[i].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    const size_t chunk = (size_t)8 << 20;
    uint64_t *buf = malloc(chunk);
    if (!buf && !rc)
        rc = FERRY_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t elems = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].ndim > 1 ? t[i].shape[1] : 1);
        uint64_t bytes = elems * (t[i].dt == FERRY_DTYPE_F32 ? 4 : 2);
        while (bytes && !rc) {
            size_t k = bytes < chunk ? (size_t)bytes : chunk;
            for (size_t j = 0; j < k / 8; j++)
                buf[j] = xs_next() & 0x3bff3bff3bff3bffull; /* finite f16 / f32 values */
            rc = ferry_writer_write(w, buf, k);
            bytes -= k;
        }
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "load_bench: writing %s: %s\n", path, ferry_writer_errmsg(w));
    free(buf);
    free(t);
    ferry_writer_destroy(w);
    return rc;
}

/* ---- the limits ----------------------------------------------------------------------------- */

static int run_direct(bench *b, size_t run, double *best)
{
    *best = 0;
    for (size_t i = 0; i < b->n_readers; i++) {
        double g = limits_direct_read(b->path, b->readers[i], b->request);
        if (g < 0) {
            fprintf(stderr, "load_bench: direct limit with %u readers: %s\n", b->readers[i],
                    ferry_strerror((int)g));
            return -1;
        }
        b->direct_by_readers[i][run] = g;
        if (g > *best)
            *best = g;
    }
    return 0;
}

enum { MAP_PLAIN, MAP_POP, MAP_WILL, MAP_SEQ };

static int run_mmap(bench *b, int how, double *gbs)
{
    if (drop_and_check(b))
        return -1;
    int fd = open(b->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t size = (size_t)b->file_bytes;
    double t0 = bench_now();
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE | (how == MAP_POP ? MAP_POPULATE : 0), fd,
                   0);
    if (m == MAP_FAILED) {
        close(fd);
        return -1;
    }
    if (how == MAP_WILL)
        (void)madvise(m, size, MADV_WILLNEED);
    if (how == MAP_SEQ)
        (void)madvise(m, size, MADV_SEQUENTIAL);
    touch_read(m, size, b->page);
    double t = bench_now() - t0;
    munmap(m, size);
    close(fd);
    *gbs = (double)b->file_bytes / t / 1e9;
    return 0;
}

/* Buffered pread of the whole file into one reused 64 MiB buffer, one thread: what the page
 * cache's own readahead reaches cold, without any destination cost. */
static int run_buffered(bench *b, double *gbs)
{
    if (drop_and_check(b))
        return -1;
    size_t cap = (size_t)64 << 20;
    unsigned char *buf = malloc(cap);
    int fd = open(b->path, O_RDONLY | O_CLOEXEC);
    if (!buf || fd < 0) {
        free(buf);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    memset(buf, 0, cap); /* faulted in before the clock starts */
    double t0 = bench_now();
    uint64_t total = 0;
    ssize_t n;
    while ((n = read(fd, buf, cap)) > 0)
        total += (uint64_t)n;
    double t = bench_now() - t0;
    close(fd);
    free(buf);
    if (n < 0 || total != b->file_bytes)
        return -1;
    *gbs = (double)total / t / 1e9;
    return 0;
}

typedef struct fresh_job {
    int fd;
    unsigned char *dst;
    uint64_t size;
    _Atomic uint64_t next;
    _Atomic int error;
} fresh_job;

static void *fresh_reader(void *arg)
{
    fresh_job *j = arg;
    const uint64_t piece = UINT64_C(16) << 20;
    for (;;) {
        uint64_t off = atomic_fetch_add(&j->next, piece);
        if (off >= j->size)
            break;
        uint64_t want = j->size - off < piece ? j->size - off : piece;
        want = (want + 4095) & ~UINT64_C(4095); /* the mapping is rounded up to pages */
        uint64_t got = 0;
        while (got < want) {
            ssize_t n = pread(j->fd, j->dst + off + got, (size_t)(want - got), (off_t)(off + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                atomic_store(&j->error, errno);
                return NULL;
            }
            if (n == 0 || n % 4096)
                break;
            got += (uint64_t)n;
        }
    }
    return NULL;
}

/* O_DIRECT into one fresh mapping, 4 threads, 16 MiB pieces; HUGE: MADV_HUGEPAGE first. */
static int run_direct_fresh(bench *b, int huge, double *gbs)
{
    if (drop_and_check(b))
        return -1;
    int fd = open(b->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0)
        return -1;
    size_t len = (size_t)((b->file_bytes + 4095) & ~UINT64_C(4095));
    fresh_job j = {.fd = fd, .size = b->file_bytes};
    atomic_init(&j.next, 0);
    atomic_init(&j.error, 0);
    double t0 = bench_now();
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return -1;
    }
    if (huge)
        (void)madvise(m, len, MADV_HUGEPAGE);
    j.dst = m;
    pthread_t th[4];
    int started = 0;
    for (; started < 4; started++)
        if (pthread_create(&th[started], NULL, fresh_reader, &j) != 0)
            break;
    fresh_reader(&j);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double t = bench_now() - t0;
    munmap(m, len);
    close(fd);
    if (atomic_load(&j.error))
        return -1;
    *gbs = (double)b->file_bytes / t / 1e9;
    return 0;
}

/* ---- ferry ---------------------------------------------------------------------------------- */

/* Compares the first and last bytes of tensor T's data with the file (after the timed part). */
static int verify_tensor(int fd, const ferry_tensor_info *in, const unsigned char *data)
{
    unsigned char buf[256];
    uint64_t n = in->nbytes < 128 ? in->nbytes : 128;
    uint64_t offs[2] = {0, in->nbytes - n};
    for (int k = 0; k < 2; k++) {
        if (pread(fd, buf, (size_t)n, (off_t)(in->offset + offs[k])) != (ssize_t)n)
            return -1;
        if (memcmp(buf, data + offs[k], (size_t)n) != 0) {
            fprintf(stderr, "load_bench: tensor '%s': bytes at +%llu differ from the file\n",
                    in->name, (unsigned long long)offs[k]);
            return -1;
        }
    }
    return 0;
}

static int run_ferry(bench *b, ferry_load mode, int cold, double *ready_gbs, double *load_gbs,
                     double *destroy_s)
{
    if (cold && drop_and_check(b))
        return -1;
    ferry_options opt;
    memset(&opt, 0, sizeof opt);
    opt.io_threads = b->io_threads;
    ferry_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.home = FERRY_HOME_HOST;
    pol.compute_device = 0;
    pol.load = mode;

    double t0 = bench_now();
    ferry *f = ferry_create(&opt);
    if (!f)
        return -1;
    int rc = ferry_open(f, b->path, NULL);
    if (!rc)
        rc = ferry_group_add(f, "all", "*", &pol);
    if (!rc)
        rc = ferry_load_group(f, NULL);
    double t1 = bench_now();
    const ferry_catalog *cat = ferry_catalog_of(f);
    size_t n = rc ? 0 : ferry_catalog_count(cat);
    ferry_tensor **ts = calloc(n ? n : 1, sizeof *ts);
    uint64_t bytes = 0;
    if (!ts)
        rc = FERRY_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        ferry_tensor_info in;
        rc = ferry_catalog_tensor(cat, i, &in);
        if (!rc && !(ts[i] = ferry_find(f, in.name)))
            rc = FERRY_ENOENT;
        bytes += in.nbytes;
    }
    if (!rc)
        rc = ferry_prepare(f, ts, n);
    for (size_t i = 0; i < n && !rc; i++) {
        const unsigned char *p = ferry_tensor_data(ts[i]);
        if (!p)
            rc = FERRY_EIO;
        else
            touch_read(p, ferry_tensor_nbytes(ts[i]), b->page);
    }
    double t2 = bench_now();
    if (rc) {
        fprintf(stderr, "load_bench: ferry (%s): %s: %s\n",
                mode == FERRY_LOAD_DIRECT ? "direct" : mode == FERRY_LOAD_AUTO ? "auto" : "read",
                ferry_strerror(rc), ferry_errmsg(f));
    }
    if (!rc && b->verify) {
        int fd = open(b->path, O_RDONLY | O_CLOEXEC);
        for (size_t i = 0; i < n && !rc && fd >= 0; i++) {
            ferry_tensor_info in;
            ferry_catalog_tensor(cat, i, &in);
            if (verify_tensor(fd, &in, ferry_tensor_data(ts[i])) != 0)
                rc = FERRY_EMISMATCH;
        }
        if (fd < 0)
            rc = FERRY_EIO;
        else
            close(fd);
    }
    if (!rc)
        ferry_release_all(f);
    double t3 = bench_now();
    ferry_destroy(f);
    *destroy_s = bench_now() - t3;
    free(ts);
    if (rc)
        return -1;
    b->tensor_bytes = bytes;
    *ready_gbs = (double)bytes / (t2 - t0) / 1e9;
    *load_gbs = (double)bytes / (t1 - t0) / 1e9;
    return 0;
}

/* ---- one run -------------------------------------------------------------------------------- */

static void put(bench *b, int m, double gbs, double load_gbs, double destroy_s)
{
    sample *s = &b->s[m];
    if (s->n >= MAX_RUNS)
        return;
    s->gbs[s->n] = gbs;
    s->load_gbs[s->n] = load_gbs;
    s->destroy_s[s->n] = destroy_s;
    s->n++;
}

static int ferry_step(bench *b, int m, ferry_load mode, int cold)
{
    double g, lg, ds;
    if (run_ferry(b, mode, cold, &g, &lg, &ds))
        return -1;
    put(b, m, g, lg, ds);
    printf("  %-14s %7.3f GB/s ready   (load_group returned at %7.3f GB/s; destroy %.3f s)\n",
           mname[m], g, lg, ds);
    return 0;
}

static int limit_step(bench *b, int m, double g)
{
    if (g < 0) {
        fprintf(stderr, "load_bench: %s limit failed: %s\n", mname[m], ferry_strerror((int)g));
        return -1;
    }
    put(b, m, g, 0, 0);
    printf("  %-14s %7.3f GB/s\n", mname[m], g);
    return 0;
}

static int run_once(bench *b, size_t run)
{
    double g;
    printf("run %zu\n", run + 1);
    fflush(stdout);
    /* cold: limit, ferry, limit, ferry, ... */
    if (b->enabled[M_DIRECT]) {
        if (run_direct(b, run, &g) || limit_step(b, M_DIRECT, g))
            return -1;
    }
    if (b->enabled[M_FERRY_DIRECT] && ferry_step(b, M_FERRY_DIRECT, FERRY_LOAD_DIRECT, 1))
        return -1;
    if (b->enabled[M_FIRST_TOUCH] &&
        limit_step(b, M_FIRST_TOUCH, limits_fresh_memory_best(b->file_bytes, NULL)))
        return -1;
    if (b->enabled[M_FERRY_AUTO] && ferry_step(b, M_FERRY_AUTO, FERRY_LOAD_AUTO, 1))
        return -1;
    if (b->enabled[M_MMAP_POPULATE]) {
        if (run_mmap(b, MAP_POP, &g) || limit_step(b, M_MMAP_POPULATE, g))
            return -1;
    }
    if (b->enabled[M_FERRY_READ] && ferry_step(b, M_FERRY_READ, FERRY_LOAD_READ, 1))
        return -1;
    if (b->enabled[M_MMAP_WILLNEED]) {
        if (run_mmap(b, MAP_WILL, &g) || limit_step(b, M_MMAP_WILLNEED, g))
            return -1;
    }
    if (b->enabled[M_MMAP_FAULT]) {
        if (run_mmap(b, MAP_PLAIN, &g) || limit_step(b, M_MMAP_FAULT, g))
            return -1;
    }
    if (b->enabled[M_MMAP_SEQ]) {
        if (run_mmap(b, MAP_SEQ, &g) || limit_step(b, M_MMAP_SEQ, g))
            return -1;
    }
    if (b->enabled[M_BUFFERED]) {
        if (run_buffered(b, &g) || limit_step(b, M_BUFFERED, g))
            return -1;
    }
    if (b->enabled[M_DIRECT_FRESH]) {
        if (run_direct_fresh(b, 0, &g) || limit_step(b, M_DIRECT_FRESH, g))
            return -1;
    }
    if (b->enabled[M_DIRECT_HUGE]) {
        if (run_direct_fresh(b, 1, &g) || limit_step(b, M_DIRECT_HUGE, g))
            return -1;
    }
    /* warm */
    int any_warm = b->enabled[M_WARM_READ] || b->enabled[M_WARM_AUTO] || b->enabled[M_WARM_DIRECT];
    if (any_warm && bench_warm_file(b->path) != 0)
        return -1;
    if (any_warm && bench_cached_fraction(b->path) < 0.99)
        fprintf(stderr, "load_bench: warning: %s is not fully in the page cache for the warm runs\n",
                b->path);
    uint64_t mc = b->file_bytes < (UINT64_C(1) << 30) ? b->file_bytes : (UINT64_C(1) << 30);
    if (b->enabled[M_MEMCPY] && limit_step(b, M_MEMCPY, limits_memcpy(mc)))
        return -1;
    if (b->enabled[M_WARM_READ] && ferry_step(b, M_WARM_READ, FERRY_LOAD_READ, 0))
        return -1;
    if (b->enabled[M_WARM_AUTO] && ferry_step(b, M_WARM_AUTO, FERRY_LOAD_AUTO, 0))
        return -1;
    if (b->enabled[M_WARM_DIRECT] && ferry_step(b, M_WARM_DIRECT, FERRY_LOAD_DIRECT, 0))
        return -1;
    fflush(stdout);
    return 0;
}

/* ---- report --------------------------------------------------------------------------------- */

static double med(const double *v, size_t n)
{
    double tmp[MAX_RUNS];
    memcpy(tmp, v, n * sizeof *v);
    return bench_summarize(tmp, n).median;
}

static double report_row(const bench *b, int m)
{
    const sample *s = &b->s[m];
    if (!s->n)
        return 0;
    double tmp[MAX_RUNS];
    memcpy(tmp, s->gbs, s->n * sizeof *tmp);
    bench_stat st = bench_summarize(tmp, s->n);
    printf("%-14s median %7.3f GB/s   min %7.3f   max %7.3f   (n=%zu)", mname[m], st.median,
           st.min, st.max, st.n);
    if (m == M_FERRY_DIRECT || m == M_FERRY_AUTO || m == M_FERRY_READ || m == M_WARM_READ ||
        m == M_WARM_AUTO || m == M_WARM_DIRECT)
        printf("   load_group %7.3f GB/s, destroy %.3f s", med(s->load_gbs, s->n),
               med(s->destroy_s, s->n));
    printf("\n");
    return st.median;
}

/* Prints NUM / DEN against TARGET. ZERO_COPY: NUM is a zero-copy load (the mapping), which no
 * copy limit bounds, so a ratio above 1 says nothing about the limit. */
static void ratio(const char *what, double num, double den, double target, int zero_copy)
{
    if (num <= 0 || den <= 0)
        return;
    double r = num / den;
    printf("  %-52s %7.3f  (target >= %.2f)  %s%s\n", what, r, target,
           r >= target ? "PASS" : "FAIL",
           r <= 1.0 || target >= 1.0 ? ""
           : zero_copy ? "  [zero-copy: not bounded by this limit]"
                       : "  [ratio > 1: the limit was measured wrong]");
}

static void report(const bench *b)
{
    char sz[32], tz[32];
    printf("\nsummary: %s, file %s, tensors %s, medians of %zu run(s)\n", b->path,
           ferry_format_size(b->file_bytes, sz), ferry_format_size(b->tensor_bytes, tz),
           b->runs_done);
    double v[M_COUNT] = {0};
    for (int m = 0; m < M_COUNT; m++)
        v[m] = report_row(b, m);
    if (b->s[M_DIRECT].n) {
        printf("direct by readers:");
        for (size_t i = 0; i < b->n_readers; i++)
            printf("  %u: %.3f GB/s", b->readers[i],
                   med(b->direct_by_readers[i], b->s[M_DIRECT].n));
        printf("   (request %llu MiB)\n", (unsigned long long)(b->request >> 20));
    }
    double cold_lim = v[M_DIRECT] > 0 && v[M_FIRST_TOUCH] > 0
                          ? (v[M_DIRECT] < v[M_FIRST_TOUCH] ? v[M_DIRECT] : v[M_FIRST_TOUCH])
                          : 0;
    double map_best = v[M_MMAP_POPULATE] > v[M_MMAP_WILLNEED] ? v[M_MMAP_POPULATE]
                                                               : v[M_MMAP_WILLNEED];
    double warm_lim = v[M_MEMCPY] > 0 && v[M_FIRST_TOUCH] > 0
                          ? (v[M_MEMCPY] < v[M_FIRST_TOUCH] ? v[M_MEMCPY] : v[M_FIRST_TOUCH])
                          : 0;
    printf("\ntargets (ratios of medians):\n");
    if (cold_lim > 0)
        printf("  cold limit = min(direct %.3f, first-touch %.3f) = %.3f GB/s\n", v[M_DIRECT],
               v[M_FIRST_TOUCH], cold_lim);
    ratio("(1) ferry-direct / cold limit", v[M_FERRY_DIRECT], cold_lim, 0.9, 0);
    ratio("(1) ferry-auto   / cold limit", v[M_FERRY_AUTO], cold_lim, 0.9, 1);
    ratio("(1) ferry-read   / cold limit", v[M_FERRY_READ], cold_lim, 0.9, 0);
    if (map_best > 0)
        printf("  best mmap populate/will-need = %.3f GB/s\n", map_best);
    ratio("(1) ferry-direct / best mmap populate|will-need", v[M_FERRY_DIRECT], map_best, 1.0, 0);
    ratio("(1) ferry-auto   / best mmap populate|will-need", v[M_FERRY_AUTO], map_best, 1.0, 1);
    if (warm_lim > 0)
        printf("  warm limit = min(memcpy %.3f, first-touch %.3f) = %.3f GB/s\n", v[M_MEMCPY],
               v[M_FIRST_TOUCH], warm_lim);
    ratio("(2) warm-read / warm limit", v[M_WARM_READ], warm_lim, 0.8, 0);
    ratio("(2) warm-auto / warm limit", v[M_WARM_AUTO], warm_lim, 0.8, 1);
    ratio("(2) warm-direct / warm limit", v[M_WARM_DIRECT], warm_lim, 0.8, 0);
}

/* The machine is shared: the load average says how much the numbers can be trusted. */
static void print_load(const char *when)
{
    char buf[128] = "";
    FILE *fp = fopen("/proc/loadavg", "r");
    if (fp) {
        if (!fgets(buf, sizeof buf, fp))
            buf[0] = 0;
        fclose(fp);
    }
    buf[strcspn(buf, "\n")] = 0;
    printf("load average %s: %s (%ld CPUs)\n", when, buf, sysconf(_SC_NPROCESSORS_ONLN));
}

/* ---- options -------------------------------------------------------------------------------- */

static int parse_list(const char *s, bench *b)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    memset(b->enabled, 0, sizeof b->enabled);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int found = 0;
        for (int m = 0; m < M_COUNT; m++)
            if (!strcmp(tok, mname[m]))
                b->enabled[m] = found = 1;
        if (!found) {
            fprintf(stderr, "load_bench: unknown measurement '%s'\n", tok);
            return -1;
        }
    }
    return 0;
}

static int parse_readers(const char *s, bench *b)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    b->n_readers = 0;
    for (char *tok = strtok(buf, ","); tok && b->n_readers < MAX_READERS; tok = strtok(NULL, ",")) {
        unsigned long v = strtoul(tok, NULL, 10);
        if (v == 0 || v > 64)
            return -1;
        b->readers[b->n_readers++] = (unsigned)v;
    }
    return b->n_readers ? 0 : -1;
}

int main(int argc, char **argv)
{
    static bench b;
    b.readers[0] = 1;
    b.readers[1] = 2;
    b.readers[2] = 4;
    b.readers[3] = 8;
    b.n_readers = 4;
    b.request = UINT64_C(64) << 20;
    b.verify = 1;
    b.page = sysconf(_SC_PAGESIZE);
    memcpy(b.enabled, on_by_default, sizeof b.enabled);
    size_t runs = 3;
    uint64_t gen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--runs") && v) {
            runs = strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--gen") && v) {
            if (ferry_parse_size(v, &gen) != 0)
                goto usage;
            i++;
        } else if (!strcmp(a, "--only") && v) {
            if (parse_list(v, &b))
                return 2;
            i++;
        } else if (!strcmp(a, "--readers") && v) {
            if (parse_readers(v, &b))
                goto usage;
            i++;
        } else if (!strcmp(a, "--request") && v) {
            if (ferry_parse_size(v, &b.request) != 0 || b.request == 0)
                goto usage;
            i++;
        } else if (!strcmp(a, "--io-threads") && v) {
            b.io_threads = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--no-verify")) {
            b.verify = 0;
        } else if (a[0] == '-') {
            goto usage;
        } else if (!b.path) {
            b.path = a;
        } else {
            goto usage;
        }
    }
    if (!b.path || runs == 0 || runs > MAX_RUNS)
        goto usage;
    struct stat st;
    if (stat(b.path, &st) != 0) {
        if (!gen) {
            fprintf(stderr, "load_bench: %s: %s (use --gen SIZE to write one)\n", b.path,
                    strerror(errno));
            return 2;
        }
        printf("load_bench: writing %s (about %llu MiB)...\n", b.path,
               (unsigned long long)(gen >> 20));
        fflush(stdout);
        if (generate(b.path, gen) != 0)
            return 2;
        if (stat(b.path, &st) != 0)
            return 2;
    }
    b.file_bytes = (uint64_t)st.st_size;
    {
        char sz[32];
        printf("load_bench: %s, %s, %zu run(s); io_threads %u (0 = default)\n", b.path,
               ferry_format_size(b.file_bytes, sz), runs, b.io_threads);
    }
    print_load("before");
    for (size_t r = 0; r < runs; r++) {
        if (run_once(&b, r) != 0)
            return 2;
        b.runs_done = r + 1;
    }
    print_load("after");
    report(&b);
    return 0;
usage:
    fprintf(stderr,
            "usage: load_bench [--gen SIZE] [--runs N] [--only LIST] [--readers 1,2,4,8]\n"
            "                  [--request SIZE] [--io-threads N] [--no-verify] MODEL\n"
            "measurements: direct first-touch ferry-direct ferry-auto ferry-read mmap-fault\n"
            "              mmap-populate mmap-willneed memcpy warm-read warm-auto warm-direct\n"
            "              mmap-seq buffered direct-fresh direct-huge\n");
    return 2;
}
