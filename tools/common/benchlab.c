/*
 * cmd_bench.c — `ferry bench FILE`: how fast ferry loads and streams a model, each figure beside
 * the machine's own limit measured in the same run (limits.c), with the ratio.
 *
 * One run measures, alternating a limit and a ferry load so that drift (other processes, the
 * host's page reporting) hits both alike:
 *   limit  O_DIRECT sweep of the file (1/2/4/8 readers x 64/16 MiB requests, into reused buffers
 *          backed by huge pages: see limits.h); the best pair is used from then on
 *   four cold loads, in an order that rotates from run to run, each right after an O_DIRECT read
 *   with the best pair (the limit the cold loads are judged against: the median of these reads):
 *     ferry  cold load, home host, load DIRECT (a private copy)
 *     ferry  cold load, load AUTO (ferry's choice: a private copy read with O_DIRECT, the file
 *            being out of the page cache)
 *     ref    mmap + one read per page (page faults); mmap with MAP_POPULATE (what llama.cpp does)
 *   limit  cold buffered read (page cache readahead into one reused buffer)
 *   limit  first touch of fresh anonymous memory of the model's size (best of 1 and 2 threads)
 *   limit  memcpy (file in the page cache from here on)
 *   ferry  warm load, load READ (a private copy); then one decode pass over the resident weights:
 *          the resident compute limit
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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "layers.h"
#include "limits.h"
#include "runopts.h"

#define MAX_RUNS 32
#define MAX_PASSES 100

enum {
    M_DIRECT,        /* limit: GB/s, the best pair, right before each cold load */
    M_DIRECT_SWEEP,  /* limit: GB/s, the best of the sweep over readers x request sizes */
    M_COLD_DIRECT,   /* ferry: GB/s */
    M_FRESH,         /* limit: GB/s */
    M_COLD_AUTO,     /* ferry: GB/s */
    M_BUFFERED,      /* limit: GB/s */
    M_MMAP_FAULT,    /* reference: GB/s */
    M_MMAP_POPULATE, /* reference: GB/s */
    M_MEMCPY,        /* limit: GB/s */
    M_WARM_READ,     /* ferry: GB/s */
    M_COMPUTE,       /* limit: seconds per decode pass over resident weights */
    M_WARM_AUTO,     /* ferry: seconds to resident (no copy) */
    M_COUNT
};


/* One device of a split stream (--split). */
typedef struct split_dev {
    char name[64];        /* its spec ("cpu" for the host) */
    int id;               /* in the manager, as runopts_split adds them */
    double weight;        /* as given (equal shares: 1) */
    uint64_t share;       /* M_i: bytes staged on it (0 on the cpu: read in place) */
    uint64_t budget;      /* B_i = M_i / 4, raised to W_i */
    int raised;
    uint64_t working_set; /* W_i: its bytes of the two largest consecutive layers */
    uint64_t optimal;     /* min(M_i, M_i - B_i + W_i) */
    double bw;            /* bytes per second of its link (0 on the cpu) */
    double transfer_s;    /* optimal / bw */
} split_dev;

typedef struct stream_res {
    const char *device;   /* NULL: cpu; "split" for the split stream */
    int split;            /* over b->split_devs */
    uint64_t budget;
    int raised;           /* the budget was raised to the working set */
    int computes;
    uint32_t passes;
    double seconds[MAX_PASSES];
    uint64_t bytes[MAX_PASSES];
    double limit[MAX_PASSES]; /* O_DIRECT read (GB/s) measured right before pass p (cpu) */
    double limit_med;     /* their median over passes 2..N: the rate the bound uses */
    double seconds_med;   /* passes 2..N */
    uint64_t bytes_med;
    uint64_t optimal;
    double compute_s;     /* compute time in the bound (0: none) */
    double transfer_s;
    double bound;
    double efficiency;
} stream_res;

typedef struct bench {
    const char *path;
    char **files;
    uint64_t *file_sizes;
    size_t n_files;
    uint64_t file_bytes;
    uint64_t model;            /* M: bytes of all tensors */
    size_t n_tensors, n_layers;
    uint64_t working_set;      /* W */
    uint64_t max_cols, max_rows;
    float *x, *y;
    int quick, json;
    size_t runs;
    uint32_t passes;
    double v[M_COUNT][MAX_RUNS];
    size_t n[M_COUNT];
    double med[M_COUNT];
    unsigned direct_readers, fresh_threads;
    int no_direct;             /* the filesystem refuses O_DIRECT: M_DIRECT is a buffered read */
    uint64_t direct_request;
    double direct_best;
    double worst_cached;       /* highest fraction still cached before a cold run */
    int auto_copies;           /* a warm AUTO load made a copy of some tensor (not zero-copy) */
    double checksum;
    uint64_t page;
    cli_progress bar;
    uint64_t done;
    const char *device;        /* --device spec or NULL */
    double device_bw;          /* bytes per second of --device */
    const char *split;         /* --split value or NULL */
    split_dev split_devs[FERRY_MAX_SPLIT];
    int n_split;
    stream_res streams[4];
    runopts groups;            /* --group: placements of the streamed passes */
    size_t n_streams;
} bench;

static volatile unsigned char sink;

static void step_done(bench *b)
{
    b->done += b->model;
    cli_progress_update(&b->bar, b->done);
}

/* ---- the model -------------------------------------------------------------------------------- */

/* Files, sizes, tensor bytes, layers and the working set, from a catalog of PATH. */
static int describe_model(bench *b)
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
    b->y = malloc(b->max_rows * sizeof *b->y);
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
    double tmp[MAX_PASSES > MAX_RUNS ? MAX_PASSES : MAX_RUNS];
    memcpy(tmp, v, n * sizeof *v);
    qsort(tmp, n, sizeof *tmp, cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

static uint64_t median_u64(const uint64_t *v, size_t n)
{
    double d[MAX_PASSES];
    for (size_t i = 0; i < n; i++)
        d[i] = (double)v[i];
    return (uint64_t)llround(median(d, n));
}

static void put(bench *b, int m, double v)
{
    if (b->n[m] < MAX_RUNS)
        b->v[m][b->n[m]++] = v;
}

/* Drops every file of the model from the page cache and notes how much stayed. */
static int drop_files(bench *b)
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

static int warm_files(bench *b)
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

/* One decode pass over the tensors of SETS (already prepared on the cpu): y = W.x for every
 * weight of two or more dimensions whose type ferry_matvec reads. */
static void compute_sets(bench *b, layer_set *sets, size_t from, size_t to)
{
    for (size_t s = from; s < to; s++)
        for (size_t i = 0; i < sets[s].n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(sets[s].t[i], &info);
            if (info.ndim < 2 || !info.n_rows || !info.row_elems)
                continue; /* a vector, or an empty weight: no product to take */
            if (ferry_matvec(ferry_tensor_dtype(sets[s].t[i]), ferry_tensor_data(sets[s].t[i]),
                             info.n_rows, info.row_elems, b->x, b->y) == 0)
                b->checksum += b->y[0] + b->y[info.n_rows - 1];
        }
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
static int run_buffered(bench *b, int m)
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
static double direct_best_read(bench *b)
{
    double secs = 0;
    for (size_t i = 0; i < b->n_files && secs >= 0; i++) {
        double g = limits_direct_read(b->files[i], b->direct_readers, b->direct_request);
        secs = g > 0 ? secs + (double)b->file_sizes[i] / (g * 1e9) : -1;
    }
    return secs > 0 ? (double)b->file_bytes / secs / 1e9 : 0;
}

/* The O_DIRECT limit right before a cold load: limit, load, limit, load, as the disk drifts. */
static int run_direct_before(bench *b)
{
    if (b->no_direct)
        return run_buffered(b, M_DIRECT);
    double g = direct_best_read(b);
    if (g <= 0)
        return cli_error("%s: O_DIRECT read failed", b->path);
    put(b, M_DIRECT, g);
    return 0;
}

/* The O_DIRECT sweep: for each (readers, request) pair the model's files read in turn, the
 * throughput of them all; the best pair is what the other O_DIRECT reads use. Its best figure is
 * reported but not the limit: the largest of eight samples of a disk that varies 10-30% from read
 * to read sits above what one read gives, and a load is one read (measured on the development
 * VM, 14 runs of a 2 or 4 GiB model: the best of eight 3-32% above the median of the single reads
 * with the best pair in the same run, median 10%). */
static int run_direct(bench *b)
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
                    return run_buffered(b, M_DIRECT_SWEEP);
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
    put(b, M_DIRECT_SWEEP, best);
    return 0;
}

static int run_fresh(bench *b)
{
    unsigned th = 1;
    double g = limits_fresh_memory_best(b->model, &th);
    if (g < 0)
        return cli_error("fresh memory of %llu bytes: %s", (unsigned long long)b->model,
                         ferry_strerror((int)g));
    b->fresh_threads = th;
    put(b, M_FRESH, g);
    return 0;
}

static int run_memcpy(bench *b)
{
    uint64_t n = b->model < (UINT64_C(1) << 30) ? b->model : (UINT64_C(1) << 30);
    double g = limits_memcpy(n);
    if (g < 0)
        return cli_error("memcpy of %llu bytes: %s", (unsigned long long)n,
                         ferry_strerror((int)g));
    put(b, M_MEMCPY, g);
    return 0;
}

/* mmap of every file (POPULATE: with MAP_POPULATE), one read per page; cold. */
static int run_mmap(bench *b, int populate)
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
    put(b, populate ? M_MMAP_POPULATE : M_MMAP_FAULT, (double)b->file_bytes / t / 1e9);
    return 0;
}

/* One load by ferry into host memory (home host, load MODE), to ready; cold when COLD. Puts GB/s
 * into slot M (seconds for M_WARM_AUTO); with COMPUTE also times one decode pass over the
 * resident weights into M_COMPUTE. */
static int run_load(bench *b, ferry_load mode, int cold, int m, int compute)
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
    put(b, m, m == M_WARM_AUTO ? t : (double)b->model / t / 1e9);
    if (compute) {
        double c0 = ferry_now();
        compute_sets(b, sets, 0, nsets);
        put(b, M_COMPUTE, ferry_now() - c0);
    }
    if (m == M_WARM_AUTO) {
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
static int run_stream(bench *b, uint64_t budget, const char *device, int split, stream_res *r)
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
    ferry *f = ferry_create(&o);
    if (!f)
        return cli_error("out of memory");
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
    for (uint32_t p = 0; p < r->passes && !rc; p++) {
        /* limit, pass, limit, pass: the disk drifts, so each judged pass gets its own limit,
         * measured with the best readers/request size found earlier */
        if (!device && p > 0 && !b->no_direct)
            r->limit[p] = direct_best_read(b);
        if (!device && (rc = drop_files(b)))
            break;
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
        /* What came into the compute device's memory from outside it: read from the file on the
         * cpu, copied to the device otherwise. */
        r->bytes[p] = device ? s1.bytes_copied - s0.bytes_copied : s1.bytes_read - s0.bytes_read;
        step_done(b);
    }
out:
    free_sets(sets);
    ferry_destroy(f);
    return rc;
}

/* Median of passes 2..N and the bound. */
static void judge_stream(bench *b, stream_res *r)
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
    opt += b->working_set;
    r->optimal = opt < b->model ? opt : b->model;
    r->limit_med = r->device ? 0 : median(r->limit + 1, r->passes - 1);
    double rate = r->device ? b->device_bw : (r->limit_med > 0 ? r->limit_med : b->med[M_DIRECT]) * 1e9;
    r->transfer_s = rate > 0 ? (double)r->optimal / rate : 0;
    r->compute_s = r->computes ? b->med[M_COMPUTE] : 0;
    r->bound = r->transfer_s > r->compute_s ? r->transfer_s : r->compute_s;
    r->efficiency = r->seconds_med > 0 ? r->bound / r->seconds_med : 0;
}

/* ---- one run ----------------------------------------------------------------------------- */

/* The order within a run. The O_DIRECT limit comes first; then the four cold loads from the disk
 * (ferry's private copy, mmap page faults, ferry's choice, mmap + populate), each after a drop of
 * the files, in an order that rotates from run to run: on these virtual machines a measurement is
 * swayed by the one before it (memory freed in bulk goes back to the host and is slow to get back:
 * with a fixed order, ferry's zero-copy load read at 0.82 of mmap page faults when it followed the
 * fresh-memory test and page faults at 0.64 of ferry when they followed ferry's private copy), so
 * no figure always follows the same neighbour. Then the limits and loads that need the files
 * cached or fresh memory. */
static int run_cold(bench *b, int which)
{
    switch (which) {
    case 0: return run_load(b, FERRY_LOAD_DIRECT, 1, M_COLD_DIRECT, 0);
    case 1: return run_mmap(b, 0);
    case 2: return run_load(b, FERRY_LOAD_AUTO, 1, M_COLD_AUTO, 0);
    default: return run_mmap(b, 1);
    }
}

static int run_once(bench *b, size_t run)
{
    int rc;
    if ((rc = run_direct(b)))
        return rc;
    step_done(b);
    for (int k = 0; k < 4; k++) {
        if ((rc = run_direct_before(b)) || (rc = run_cold(b, (int)((k + run) % 4))))
            return rc;
        step_done(b);
    }
    if ((rc = run_buffered(b, M_BUFFERED)))
        return rc;
    step_done(b);
    if ((rc = run_fresh(b)))
        return rc;
    step_done(b);
    if ((rc = warm_files(b)) || (rc = run_memcpy(b)))
        return rc;
    step_done(b);
    if ((rc = run_load(b, FERRY_LOAD_READ, 0, M_WARM_READ, 1)))
        return rc;
    step_done(b);
    if ((rc = run_load(b, FERRY_LOAD_AUTO, 0, M_WARM_AUTO, 0)))
        return rc;
    step_done(b);
    return 0;
}

#define STEPS_PER_RUN 10

/* ---- report ------------------------------------------------------------------------------ */

static double min2(double a, double b) { return a < b ? a : b; }

static double ratio(double num, double den) { return den > 0 ? num / den : 0; }

/* One figure beside its limit; returns 1 when the ratio is above 1 (marked with '!'). */
static int print_row(const char *what, double gbs, const char *limit_name, double limit)
{
    double r = ratio(gbs, limit);
    printf("  %-38s %8.3f   %-28s %8.3f   %6.2f%s\n", what, gbs, limit_name, limit, r,
           r > 1.0 ? " !" : "");
    return r > 1.0;
}

static void report_text(bench *b, const char *load_before, const char *load_after)
{
    char s1[32], s2[32], s3[32];
    double *v = b->med;
    double cold_lim = min2(v[M_DIRECT], v[M_FRESH]), warm_lim = min2(v[M_MEMCPY], v[M_FRESH]);
    printf("ferry bench %s: %s of tensors in %zu file(s), %zu tensors in %zu layers; "
           "working set %s\n",
           b->path, cli_size(b->model, s1), b->n_files, b->n_tensors, b->n_layers,
           cli_size(b->working_set, s2));
    printf("%zu run(s), medians; load average %s before, %s after\n\n", b->runs, load_before,
           load_after);
    printf("  %-38s %8s\n", "limits", "GB/s");
    if (b->no_direct) {
        printf("  %-38s %8.3f   (O_DIRECT refused here: a cold buffered read)\n", "disk read",
               v[M_DIRECT]);
    } else {
        printf("  %-38s %8.3f   (%u reader(s) x %s requests, before each cold load)\n",
               "O_DIRECT read", v[M_DIRECT], b->direct_readers, cli_size(b->direct_request, s3));
        printf("  %-38s %8.3f   (best of the sweep over 1-8 readers x 16/64 MiB)\n",
               "O_DIRECT read, sweep", v[M_DIRECT_SWEEP]);
    }
    printf("  %-38s %8.3f\n", "cold buffered read (one thread)", v[M_BUFFERED]);
    printf("  %-38s %8.3f\n", "memcpy", v[M_MEMCPY]);
    printf("  %-38s %8.3f   (best with %u thread(s))\n", "fresh memory, first touch",
           v[M_FRESH], b->fresh_threads);
    printf("  %-38s %8.3f   (%.3f s per pass)\n", "resident compute (matvec every weight)",
           v[M_COMPUTE] > 0 ? (double)b->model / v[M_COMPUTE] / 1e9 : 0.0, v[M_COMPUTE]);
    printf("\n  %-38s %8s   %-28s %8s   %6s\n", "loads (to ready)", "GB/s", "limit", "GB/s",
           "ratio");
    int above = 0;
    above |= print_row("cold, auto (ferry's choice)", v[M_COLD_AUTO],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("cold, direct (private copy)", v[M_COLD_DIRECT],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("cold, mmap page faults", v[M_MMAP_FAULT], "min(O_DIRECT, fresh memory)",
                       cold_lim);
    above |= print_row("cold, mmap + populate (llama.cpp)", v[M_MMAP_POPULATE],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("warm, read (private copy)", v[M_WARM_READ], "min(memcpy, fresh memory)",
                       warm_lim);
    if (!b->auto_copies)
        printf("  %-38s  no copy: resident in %.3f s\n", "warm, auto (zero-copy)",
               v[M_WARM_AUTO]);
    else
        above |= print_row("warm, auto (copies some tensors)",
                           v[M_WARM_AUTO] > 0 ? (double)b->model / v[M_WARM_AUTO] / 1e9 : 0,
                           "min(memcpy, fresh memory)", warm_lim);
    if (b->worst_cached > 0.01)
        printf("  (warning: up to %.1f%% of the file stayed in the page cache before a cold "
               "run)\n",
               b->worst_cached * 100);
    for (size_t i = 0; i < b->n_streams; i++) {
        stream_res *r = &b->streams[i];
        if (i == 0 || (r->device != NULL) != (b->streams[i - 1].device != NULL) ||
            r->split != b->streams[i - 1].split) {
            if (r->split) {
                printf("\n  streams: split over");
                for (int k = 0; k < b->n_split; k++)
                    printf("%s %s (weight %g)", k ? "," : "", b->split_devs[k].name,
                           b->split_devs[k].weight);
                printf("; home host, load auto, each device's budget 1/4 of its share; passes "
                       "2..%u\n",
                       r->passes);
            } else if (r->device)
                printf("\n  streams: compute %s, home host, load auto, device budget; passes "
                       "2..%u\n",
                       r->device, r->passes);
            else
                printf("\n  streams: home disk, compute cpu, load auto, host budget, file dropped "
                       "before each pass; passes 2..%u\n",
                       r->passes);
            printf("  %-12s %12s %12s %10s %10s %10s\n", "budget", "read/pass", "optimal",
                   "s/pass", "bound s", "efficiency");
        }
        char bud[40];
        snprintf(bud, sizeof bud, "%s%s", cli_size(r->budget, s1), r->raised ? "*" : "");
        printf("  %-12s %12s %12s %10.3f %10.3f %10.2f%s\n", bud, cli_size(r->bytes_med, s2),
               cli_size(r->optimal, s3), r->seconds_med, r->bound, r->efficiency,
               r->efficiency > 1.0 ? " !" : "");
        above |= r->efficiency > 1.0;
        for (int k = 0; r->split && k < b->n_split; k++) {
            const split_dev *sd = &b->split_devs[k];
            char s4[32];
            if (sd->bw <= 0) {
                printf("    %-22s read in place from the host copy: no transfer\n", sd->name);
                continue;
            }
            printf("    %-22s share %s, budget %s%s, W %s, optimal %s at %.2f GB/s: %.3f s\n",
                   sd->name, cli_size(sd->share, s1), cli_size(sd->budget, s2),
                   sd->raised ? "*" : "", cli_size(sd->working_set, s3),
                   cli_size(sd->optimal, s4), sd->bw / 1e9, sd->transfer_s);
        }
    }
    for (size_t i = 0; i < b->n_streams; i++)
        if (b->streams[i].raised) {
            printf("  * raised to the working set, the least budget a pass can run in\n");
            break;
        }
    printf("\n  bound = max(resident compute, (M - B + W) / O_DIRECT read measured between the "
           "passes)%s;\n  efficiency = bound / measured\n",
           b->device ? " on the cpu, (M - B + W) / link bandwidth on the device" : "");
    if (b->split)
        printf("  split: bound = max over its devices of (M_i - B_i + W_i) / BW_i, the slowest "
               "device's share\n    through its own link (the devices copy in parallel): M_i "
               "the bytes placed on device i,\n    B_i = M_i/4 its budget, W_i its part of the "
               "two largest consecutive layers\n");
    if (above)
        printf("  ! above 1: the limit did not bound that run (noise between runs, or a path it "
               "does not cover:\n    the page cache's readahead can beat O_DIRECT, a warm copy "
               "can reuse memory)\n");
}

static void json_stream(cli_json *j, const stream_res *r, const bench *b)
{
    cli_json_begin_object(j, 1);
    cli_json_key(j, "device");
    cli_json_string(j, r->device ? r->device : "cpu");
    cli_json_key(j, "budget_bytes");
    cli_json_u64(j, r->budget);
    cli_json_key(j, "budget_raised_to_working_set");
    cli_json_bool(j, r->raised);
    cli_json_key(j, "bytes_read_per_pass");
    cli_json_u64(j, r->bytes_med);
    cli_json_key(j, "optimal_bytes_per_pass");
    cli_json_u64(j, r->optimal);
    cli_json_key(j, "working_set_bytes");
    cli_json_u64(j, b->working_set);
    cli_json_key(j, "seconds_per_pass");
    cli_json_f64(j, r->seconds_med);
    cli_json_key(j, "bound_seconds_per_pass");
    cli_json_f64(j, r->bound);
    cli_json_key(j, "compute_seconds_per_pass");
    cli_json_f64(j, r->compute_s);
    cli_json_key(j, "transfer_seconds_per_pass");
    cli_json_f64(j, r->transfer_s);
    cli_json_key(j, "efficiency");
    cli_json_f64(j, r->efficiency);
    if (!r->device) {
        cli_json_key(j, "direct_read_gbps_between_passes");
        cli_json_f64(j, r->limit_med);
    }
    if (r->split) {
        cli_json_key(j, "bound_definition");
        cli_json_string(j, "max over split devices of (M_i - B_i + W_i) / BW_i");
        cli_json_key(j, "split_devices");
        cli_json_begin_array(j, 1);
        for (int k = 0; k < b->n_split; k++) {
            const split_dev *sd = &b->split_devs[k];
            cli_json_begin_object(j, 1);
            cli_json_key(j, "device");
            cli_json_string(j, sd->name);
            cli_json_key(j, "weight");
            cli_json_f64(j, sd->weight);
            cli_json_key(j, "share_bytes");
            cli_json_u64(j, sd->share);
            cli_json_key(j, "budget_bytes");
            cli_json_u64(j, sd->budget);
            cli_json_key(j, "budget_raised_to_working_set");
            cli_json_bool(j, sd->raised);
            cli_json_key(j, "working_set_bytes");
            cli_json_u64(j, sd->working_set);
            cli_json_key(j, "optimal_bytes_per_pass");
            cli_json_u64(j, sd->optimal);
            cli_json_key(j, "bandwidth_bytes_per_second");
            cli_json_f64(j, sd->bw);
            cli_json_key(j, "transfer_seconds_per_pass");
            cli_json_f64(j, sd->transfer_s);
            cli_json_end_object(j);
        }
        cli_json_end_array(j);
    }
    cli_json_key(j, "passes");
    cli_json_u64(j, r->passes);
    cli_json_key(j, "pass_seconds");
    cli_json_begin_array(j, 1);
    for (uint32_t p = 0; p < r->passes; p++)
        cli_json_f64(j, r->seconds[p]);
    cli_json_end_array(j);
    cli_json_key(j, "pass_bytes_read");
    cli_json_begin_array(j, 1);
    for (uint32_t p = 0; p < r->passes; p++)
        cli_json_u64(j, r->bytes[p]);
    cli_json_end_array(j);
    cli_json_end_object(j);
}

static void report_json(bench *b)
{
    double *v = b->med;
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
#define NUM(k, x)                                                                                  \
    do {                                                                                           \
        cli_json_key(&j, k);                                                                       \
        cli_json_f64(&j, x);                                                                       \
    } while (0)
#define U64(k, x)                                                                                  \
    do {                                                                                           \
        cli_json_key(&j, k);                                                                       \
        cli_json_u64(&j, x);                                                                       \
    } while (0)
    cli_json_key(&j, "file");
    cli_json_string(&j, b->path);
    U64("model_bytes", b->model);
    U64("file_bytes", b->file_bytes);
    U64("tensors", b->n_tensors);
    U64("layers", b->n_layers);
    U64("runs", b->runs);
    NUM("direct_read_gbps", v[M_DIRECT]);
    NUM("direct_read_sweep_gbps", v[M_DIRECT_SWEEP]);
    U64("direct_read_readers", b->direct_readers);
    U64("direct_read_request_bytes", b->direct_request);
    cli_json_key(&j, "direct_read_supported");
    cli_json_bool(&j, !b->no_direct);
    NUM("buffered_read_gbps", v[M_BUFFERED]);
    NUM("memcpy_gbps", v[M_MEMCPY]);
    NUM("fresh_memory_gbps", v[M_FRESH]);
    U64("fresh_memory_threads", b->fresh_threads);
    NUM("resident_compute_seconds", v[M_COMPUTE]);
    NUM("resident_compute_gbps", v[M_COMPUTE] > 0 ? (double)b->model / v[M_COMPUTE] / 1e9 : 0);
    NUM("cold_load_gbps", v[M_COLD_AUTO]);
    NUM("cold_load_direct_gbps", v[M_COLD_DIRECT]);
    NUM("warm_load_gbps", v[M_WARM_READ]);
    NUM("warm_auto_seconds", v[M_WARM_AUTO]);
    cli_json_key(&j, "warm_auto_zero_copy");
    cli_json_bool(&j, !b->auto_copies);
    NUM("mmap_fault_load_gbps", v[M_MMAP_FAULT]);
    NUM("mmap_populate_load_gbps", v[M_MMAP_POPULATE]);
    NUM("cold_load_ratio", ratio(v[M_COLD_AUTO], min2(v[M_DIRECT], v[M_FRESH])));
    NUM("cold_load_direct_ratio", ratio(v[M_COLD_DIRECT], min2(v[M_DIRECT], v[M_FRESH])));
    NUM("cold_load_ratio_vs_sweep", ratio(v[M_COLD_AUTO], min2(v[M_DIRECT_SWEEP], v[M_FRESH])));
    NUM("warm_load_ratio", ratio(v[M_WARM_READ], min2(v[M_MEMCPY], v[M_FRESH])));
    NUM("cold_cached_fraction_max", b->worst_cached);
#undef NUM
#undef U64
    cli_json_key(&j, "stream");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < b->n_streams; i++)
        if (!b->streams[i].device)
            json_stream(&j, &b->streams[i], b);
    cli_json_end_array(&j);
    if (b->device || b->split) {
        cli_json_key(&j, "device_stream");
        cli_json_begin_array(&j, 0);
        for (size_t i = 0; i < b->n_streams; i++)
            if (b->streams[i].device)
                json_stream(&j, &b->streams[i], b);
        cli_json_end_array(&j);
    }
    cli_json_end_object(&j);
    cli_json_finish(&j);
}

static void load_average(char *buf, size_t cap)
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

/* The bandwidth of a device spec "...@25GB/s" in bytes per second; 0 when it has none. */
static int spec_bandwidth(const char *spec, double *bw)
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
static int split_prepare(bench *b)
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
        split_dev *sd = &b->split_devs[i];
        ferry_device_info di;
        memset(sd, 0, sizeof *sd);
        sd->id = pol.split_devices[i];
        sd->weight = pol.split_weights[i] > 0 ? pol.split_weights[i] : 1;
        if (ferry_get_device_info(f, sd->id, &di)) {
            rc = cli_error("%s", ferry_errmsg(f));
            break;
        }
        snprintf(sd->name, sizeof sd->name, "%s", di.name);
        if (!di.host_accessible && (spec_bandwidth(di.name, &sd->bw) || sd->bw <= 0))
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
        split_dev *sd = &b->split_devs[k];
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

static void free_bench(bench *b)
{
    for (size_t i = 0; i < b->n_files; i++)
        free(b->files ? b->files[i] : NULL);
    free(b->files);
    free(b->file_sizes);
    free(b->x);
    free(b->y);
    runopts_free(&b->groups);
}

int cmd_bench(int argc, char **argv)
{
    static const char *help =
        "usage: ferry bench FILE [options]\n"
        "\n"
        "Measures how fast ferry loads and streams FILE against this machine's own limits,\n"
        "measured in the same run, alternating limit and ferry runs: O_DIRECT and cold buffered\n"
        "reads, memcpy, first touch of fresh memory, resident compute; ferry's cold loads (load\n"
        "auto and direct, file dropped from the page cache), warm loads (read; auto is zero-copy),\n"
        "plain mmap and mmap with populate; then streamed passes (home disk, compute cpu, load\n"
        "auto) under host budgets of 1/4 and 1/2 of the model, judged against\n"
        "max(resident compute, (M - B + W) / O_DIRECT read), W the two largest consecutive\n"
        "layers. Needs a filesystem that allows O_DIRECT, and rights to drop the file from the\n"
        "page cache (its owner can). Reads the file from the disk about 15 times per run.\n"
        "\n"
        "options:\n"
        "  --runs N               runs of the load measurements, medians quoted (default 3)\n"
        "  --passes N             streamed passes per budget, at least 3 (default 3); the median\n"
        "                         of passes 2..N is judged\n"
        "  --quick                one run, fewer reader counts: a quick look, not a measurement\n"
        "  --device SPEC          also stream with compute on SPEC (sim:SIZE@BW), home host,\n"
        "                         device budget 1/4 of the model: bound (M - B + W) / BW\n"
        "  --split SPEC,SPEC[:WEIGHT]  also stream with the 2-D tensors' rows split over these\n"
        "                         devices (as ferry run --split; each sim:SIZE@BW or cpu), home\n"
        "                         host, each device's budget 1/4 of its share M_i: bound =\n"
        "                         max over devices of (M_i - B_i + W_i) / BW_i\n"
        "  --json                 one JSON object on stdout\n"
        "  -q, --quiet            no progress bar\n"
        "streamed passes only (the bounds still count every tensor as streamed):\n"
        "%s";
    const char *runs_s = NULL, *passes_s = NULL, *device = NULL, *split = NULL;
    int json = 0, quick = 0, quiet = 0;
    cli_opt opts[] = {
        {"runs", 0, CLI_OPT_STRING, &runs_s},     {"passes", 0, CLI_OPT_STRING, &passes_s},
        {"quick", 0, CLI_OPT_FLAG, &quick},       {"device", 0, CLI_OPT_STRING, &device},
        {"json", 0, CLI_OPT_FLAG, &json},         {"quiet", 'q', CLI_OPT_FLAG, &quiet},
        {"split", 0, CLI_OPT_STRING, &split},
    };
    static bench b; /* large: the samples */
    memset(&b, 0, sizeof b);
    b.groups.cmd = "bench";
    if (runopts_collect_groups("bench", &b.groups, &argc, argv))
        return CLI_EXIT_USAGE;
    int npos = 0;
    int prc = cli_parse("bench", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (prc == CLI_HELP) {
        printf(help, runopts_group_help);
        return CLI_EXIT_OK;
    }
    if (prc)
        return prc;
    if (npos < 1)
        return cli_usage_error("bench", "no model file given");
    if (npos > 1)
        return cli_usage_error("bench", "one model file at a time");
    ferry_policy base;
    memset(&base, 0, sizeof base);
    prc = runopts_parse_groups("bench", &b.groups, &base); /* checked now, applied per stream */
    runopts_free(&b.groups);
    if (prc)
        return prc;
    b.path = argv[1];
    b.json = json;
    b.quick = quick;
    uint64_t runs = quick ? 1 : 3, passes = 3;
    if (runs_s && cli_arg_u64("bench", "runs", runs_s, 1, MAX_RUNS, &runs))
        return CLI_EXIT_USAGE;
    if (passes_s && cli_arg_u64("bench", "passes", passes_s, 3, MAX_PASSES, &passes))
        return CLI_EXIT_USAGE;
    b.runs = (size_t)runs;
    b.passes = (uint32_t)passes;
    if (device) {
        if ((prc = runopts_check_device(device)))
            return prc;
        if (spec_bandwidth(device, &b.device_bw))
            return cli_usage_error("bench", "--device: bad bandwidth in '%s'", device);
        if (b.device_bw <= 0)
            return cli_usage_error("bench", "--device: '%s' gives no bandwidth to judge against "
                                   "(sim:SIZE@BW)", device);
        b.device = device;
    }
    long pg = sysconf(_SC_PAGESIZE);
    b.page = pg > 0 ? (uint64_t)pg : 4096;
    int rc = describe_model(&b);
    if (rc) {
        free_bench(&b);
        return CLI_EXIT_FAIL;
    }
    b.split = split;
    if (split && (rc = split_prepare(&b)) != 0) {
        free_bench(&b);
        return rc;
    }
    char before[16], after[16];
    load_average(before, sizeof before);
    uint64_t total_steps =
        b.runs * STEPS_PER_RUN + (uint64_t)b.passes * (2 + (b.device ? 1 : 0) + (b.split ? 1 : 0));
    cli_progress_start(&b.bar, "bench", total_steps * b.model, !json && !quiet);
    for (size_t r = 0; r < b.runs && !rc; r++)
        rc = run_once(&b, r);
    for (int m = 0; m < M_COUNT && !rc; m++)
        b.med[m] = median(b.v[m], b.n[m]);
    static const unsigned den[2] = {4, 2};
    for (int i = 0; i < 2 && !rc; i++) {
        rc = run_stream(&b, b.model / den[i], NULL, 0, &b.streams[b.n_streams]);
        if (!rc)
            judge_stream(&b, &b.streams[b.n_streams++]);
    }
    if (b.device && !rc) {
        rc = run_stream(&b, b.model / 4, b.device, 0, &b.streams[b.n_streams]);
        if (!rc)
            judge_stream(&b, &b.streams[b.n_streams++]);
    }
    if (b.split && !rc) {
        rc = run_stream(&b, 0, NULL, 1, &b.streams[b.n_streams]);
        if (!rc)
            judge_stream(&b, &b.streams[b.n_streams++]);
    }
    cli_progress_end(&b.bar);
    load_average(after, sizeof after);
    if (!rc) {
        if (json)
            report_json(&b);
        else
            report_text(&b, before, after);
    }
    free_bench(&b);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
