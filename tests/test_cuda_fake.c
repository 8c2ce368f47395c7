/*
 * test_cuda_fake.c — ferry's cuda device run against the fake CUDA runtime (tests/fake_cudart.c,
 * FERRY_CUDART points at it): two fake GPUs of 64 MiB whose memory the host cannot read, copies
 * done late by a worker per stream. Checks, through the device ops, the manager and the CLI:
 *  - the device: fields, budgets from cudaMemGetInfo, refused copies queue nothing, an
 *    asynchronous copy failure reported by its own ticket, sticky failures, every operation on
 *    the device it names whatever the calling thread's current device;
 *  - models streamed through a device budget smaller than the model (several homes, load modes,
 *    a conversion, GGUF and safetensors, four threads at once): every tensor's bytes against the
 *    file, read back through copies (a host read of a device address would crash);
 *  - split placement over cuda:0 + cpu and cuda:0 + cuda:1 (1:3): every part's rows and device;
 *  - injected cudaMalloc / cudaHostAlloc / copy failures at every N: a clear error, nothing held,
 *    the manager usable, the bytes right afterwards;
 *  - nothing left behind: after each manager, no live allocation, pinned buffer, stream or event;
 *    no copy refused, none into another device's memory, no free under a queued copy;
 *  - `ferry devices`, `ferry run --device cuda:0 --verify` and `--split cuda:0,cuda:1:3 --verify`
 *    with the fake's exit report.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>

#include "check.h"
#include "cli_harness.h"
#include "devices/devices.h"
#include "fake_cudart.h"
#include "ferry_device.h"
#include "model_fixture.h"

#define MiB (UINT64_C(1) << 20)
#define FAKE_MEM (64 * MiB)

static fakecuda_get_stats_fn fc_stats;
static fakecuda_set_faults_fn fc_faults;
static fakecuda_set_delay_fn fc_delay;
static fakecuda_clear_sticky_fn fc_clear_sticky;
static fakecuda_set_record_fault_fn fc_record_fault;
static fakecuda_reset_peak_fn fc_reset_peak;
static fakecuda_set_register_fn fc_register;

static char g_gguf[1200], g_st[1200], g_q8[1200], g_big[1200];
static uint64_t g_refused;        /* copies the tests had refused on purpose */
static uint64_t g_bad_host_frees; /* and pinned frees of what is not pinned memory */

static fakecuda_stats stats(int dev)
{
    fakecuda_stats s;
    memset(&s, 0, sizeof s);
    CHECK_EQ_INT(fc_stats(dev, &s), 0);
    return s;
}

/* Nothing of the fake is held, and nothing was misused. Call with no device open. */
static void check_clean(const char *when)
{
    fakecuda_stats s = stats(-1);
    int ok = s.live_allocs == 0 && s.used == 0 && s.live_host_allocs == 0 &&
             s.live_streams == 0 && s.live_events == 0 && s.copies_refused == g_refused &&
             s.foreign_copies == 0 && s.free_while_queued == 0 && s.bad_frees == 0 &&
             s.bad_host_frees == g_bad_host_frees && s.bad_handles == 0 && s.copies_done == s.copies &&
             s.live_registered == 0 && s.bad_unregisters == 0 && s.live_pools == 0;
    if (!ok)
        fprintf(stderr,
                "%s: live allocs %" PRIu64 " (%" PRIu64 " bytes), pinned %" PRIu64
                ", streams %" PRIu64 ", events %" PRIu64 ", refused %" PRIu64 ", foreign %" PRIu64
                ", free while queued %" PRIu64 ", bad frees %" PRIu64 "/%" PRIu64
                ", bad handles %" PRIu64 ", copies %" PRIu64 " done %" PRIu64
                ", registered %" PRIu64 ", bad unregisters %" PRIu64 "\n",
                when, s.live_allocs, s.used, s.live_host_allocs, s.live_streams, s.live_events,
                s.copies_refused, s.foreign_copies, s.free_while_queued, s.bad_frees,
                s.bad_host_frees, s.bad_handles, s.copies, s.copies_done, s.live_registered,
                s.bad_unregisters);
    CHECK(ok);
}

static const char *devmsg(ferry_device *d)
{
    static char buf[256];
    return ferry__device_errmsg(d, buf, sizeof buf);
}

static ferry_device *open_dev(const char *spec)
{
    ferry_device *d = NULL;
    char err[256] = "";
    int rc = ferry_device_open(spec, &d, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s: %s\n", spec, err);
    CHECK_EQ_INT(rc, 0);
    return d;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 9));
}

/* ---- the device ----------------------------------------------------------------------------- */

static void device_basics(void)
{
    ferry_device *d = open_dev("cuda:0");
    if (!d)
        return;
    CHECK_STR(FERRY__DP(d).kind, "cuda");
    CHECK_EQ_INT(FERRY__DP(d).host_accessible, 0);
    CHECK_EQ_INT(FERRY__DP(d).alignment, 256);
    CHECK_EQ_INT(FERRY__DP(d).max_alloc, FAKE_MEM);
    uint64_t fr = 0, tot = 0, fr2 = 0;
    CHECK_EQ_INT(d->ops->mem_info(d, &fr, &tot), 0);
    CHECK_EQ_INT(tot, FAKE_MEM);
    CHECK_EQ_INT(fr, FAKE_MEM);
    void *p = NULL, *q = NULL;
    CHECK_EQ_INT(d->ops->alloc(d, MiB, &p), 0);
    CHECK_EQ_INT(d->ops->mem_info(d, &fr2, NULL), 0);
    CHECK_EQ_INT(fr - fr2, MiB);
    /* the fake hands out addresses no process maps: a host access would crash */
    CHECK((uintptr_t)p >= (UINT64_C(1) << 55));

    /* more than the device holds: cudaMalloc's out of memory, as FERRY_ENOMEM */
    CHECK_EQ_INT(d->ops->alloc(d, FAKE_MEM - MiB / 2, &q), FERRY_ENOMEM);
    CHECK(q == NULL);
    CHECK(strstr(devmsg(d), "cudaMalloc") && strstr(devmsg(d), "out of memory"));

    /* copies the runtime refuses (past the allocation, a device address as the host side) are
     * FERRY_EINVAL and queue nothing: the next ticket follows the last good one */
    unsigned char buf[4096];
    fill(buf, sizeof buf, 1);
    uint64_t t0 = 0, t = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, p, buf, sizeof buf, &t0), 0);
    CHECK_EQ_INT(d->ops->wait(d, t0), 0);
    CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)p + MiB - 100, buf, 200, &t), FERRY_EINVAL);
    CHECK(strstr(devmsg(d), "invalid argument") != NULL);
    CHECK_EQ_INT(d->ops->copy_d2h(d, p, p, 16, &t), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, buf, buf + 64, 16, &t), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)p + MiB - 100, buf, 100, &t), 0);
    CHECK_EQ_INT(t, t0 + 1);
    CHECK_EQ_INT(d->ops->wait(d, t), 0);
    fakecuda_stats s = stats(0);
    CHECK_EQ_INT(s.copies_refused, 3);
    g_refused += 3;

    /* a wait returns only when the bytes are there: the copy is done late, by the worker */
    fc_delay(3000);
    unsigned char back[4096];
    memset(back, 0, sizeof back);
    uint64_t ta, tb;
    CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)p + 8192, buf, sizeof buf, &ta), 0);
    CHECK_EQ_INT(d->ops->copy_d2h(d, back, (char *)p + 8192, sizeof back, &tb), 0);
    CHECK_EQ_INT(d->ops->wait(d, tb), 0);
    CHECK(memcmp(back, buf, sizeof buf) == 0);
    CHECK_EQ_INT(d->ops->wait(d, ta), 0);
    fc_delay(20);

    /* pinned staging memory: page-aligned, returned */
    void *h = NULL;
    CHECK_EQ_INT(d->ops->host_alloc(d, 3 * MiB + 1, &h), 0);
    CHECK(h && ((uintptr_t)h & 4095) == 0);
    d->ops->host_free(d, h);
    /* freed pinned memory is kept for reuse while a cuda device is open (portable: any device) */
    void *h2 = NULL;
    CHECK_EQ_INT(d->ops->host_alloc(d, 3 * MiB, &h2), 0);
    CHECK(h2 == h);
    d->ops->host_free(d, h2);
    /* freeing what is not pinned memory: refused by the runtime, said, not crashed on */
    d->ops->host_free(d, buf);
    CHECK(strstr(devmsg(d), "cudaFreeHost") && strstr(devmsg(d), "invalid argument"));
    g_bad_host_frees++;
    d->ops->free(d, p);
    ferry_device_close(d);

    /* the ordinals the fake has, and a clear refusal past them */
    char err[256];
    ferry_device *x = NULL;
    CHECK_EQ_INT(ferry_device_open("cuda:2", &x, err, sizeof err), FERRY_EDEVICE);
    CHECK(x == NULL && strstr(err, "only 2 CUDA devices") != NULL);
    check_clean("device basics");
}

/* Copy failures: the asynchronous one is reported by its own ticket, not its neighbours'; the
 * synchronous one queues nothing; both leave the device working. */
static void device_copy_faults(void)
{
    enum { N = 64 * 1024 };
    ferry_device *d = open_dev("cuda:0");
    if (!d)
        return;
    unsigned char *src = malloc(4 * N), *dst = malloc(4 * N);
    void *dev = NULL;
    CHECK_EQ_INT(d->ops->alloc(d, 4 * N, &dev), 0);
    fill(src, 4 * N, 9);
    unsigned char *zero = calloc(1, 4 * N);
    for (int nth = 1; nth <= 4; nth++) {
        CHECK_EQ_INT(ferry__device_write(d, dev, zero, 4 * N), 0);
        fc_faults(0, (uint64_t)nth, FAKECUDA_FAIL_ASYNC, 0);
        uint64_t t[4];
        for (int i = 0; i < 4; i++)
            CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)dev + i * N, src + i * N, N, &t[i]), 0);
        for (int i = 3; i >= 0; i--) {
            int rc = d->ops->wait(d, t[i]);
            CHECK_EQ_INT(rc, i + 1 == nth ? FERRY_EDEVICE : 0);
            if (rc)
                CHECK(strstr(devmsg(d), "unknown error") != NULL);
        }
        fc_faults(0, 0, 0, 0);
        CHECK_EQ_INT(ferry__device_read(d, dst, dev, 4 * N), 0);
        for (int i = 0; i < 4; i++) {
            int same = memcmp(dst + i * N, src + i * N, N) == 0;
            CHECK(i + 1 == nth ? !same : same); /* the failed one copied nothing */
        }
        CHECK_EQ_INT(d->ops->synchronize(d), 0);
        memset(dst, 0, 4 * N);
        CHECK_EQ_INT(ferry__device_write(d, dev, src, 4 * N), 0);
        CHECK_EQ_INT(ferry__device_read(d, dst, dev, 4 * N), 0);
        CHECK(memcmp(dst, src, 4 * N) == 0);
    }
    /* synchronous: the call fails, the ticket is not spent */
    uint64_t a = 0, b = 0, c = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &a), 0);
    CHECK_EQ_INT(d->ops->wait(d, a), 0);
    fc_faults(0, 1, FAKECUDA_FAIL_SYNC, 0);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &b), FERRY_EDEVICE);
    CHECK(strstr(devmsg(d), "cudaMemcpyAsync") != NULL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &c), 0);
    CHECK_EQ_INT(c, a + 1);
    CHECK_EQ_INT(d->ops->wait(d, c), 0);
    /* cudaEventRecord fails after the copy was queued: the call fails and leaves nothing in
     * flight on the caller's memory (the copy is slow here, so it would still be queued) */
    fc_delay(3000);
    fc_record_fault(1);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &b), FERRY_EDEVICE);
    CHECK(strstr(devmsg(d), "cudaEventRecord") != NULL);
    fakecuda_stats s = stats(0);
    CHECK_EQ_INT(s.copies_done, s.copies);
    fc_record_fault(0);
    fc_delay(20);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &b), 0);
    CHECK_EQ_INT(b, c + 1);
    CHECK_EQ_INT(d->ops->wait(d, b), 0);
    /* an injected cudaMalloc failure, then allocations work again */
    void *p = NULL;
    fc_faults(1, 0, 0, 0);
    CHECK_EQ_INT(d->ops->alloc(d, 4096, &p), FERRY_ENOMEM);
    CHECK_EQ_INT(d->ops->alloc(d, 4096, &p), 0);
    d->ops->free(d, p);
    fc_faults(0, 0, 0, 0);
    d->ops->free(d, dev);
    ferry_device_close(d);
    free(src);
    free(dst);
    free(zero);
    check_clean("device copy faults");
}

/* A lost context (a sticky failure): every later call fails plainly, closing does not hang; a
 * fresh start works. */
static void device_sticky(void)
{
    ferry_device *d = open_dev("cuda:0");
    if (!d)
        return;
    unsigned char buf[4096] = {1};
    void *dev = NULL, *p = NULL;
    CHECK_EQ_INT(d->ops->alloc(d, sizeof buf, &dev), 0);
    fc_faults(0, 1, FAKECUDA_FAIL_STICKY, 0);
    uint64_t t;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, buf, sizeof buf, &t), 0);
    CHECK_EQ_INT(d->ops->wait(d, t), FERRY_EDEVICE);
    CHECK(strstr(devmsg(d), "illegal memory access") != NULL);
    CHECK_EQ_INT(d->ops->alloc(d, 64, &p), FERRY_EDEVICE);
    CHECK(strstr(devmsg(d), "illegal memory access") != NULL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, buf, 16, &t), FERRY_EDEVICE);
    CHECK_EQ_INT(d->ops->synchronize(d), FERRY_EDEVICE);
    d->ops->free(d, dev);
    ferry_device_close(d);
    fc_faults(0, 0, 0, 0);
    fc_clear_sticky();
    d = open_dev("cuda:0");
    if (d) {
        CHECK_EQ_INT(d->ops->alloc(d, 64, &p), 0);
        CHECK_EQ_INT(ferry__device_write(d, p, buf, 64), 0);
        d->ops->free(d, p);
        ferry_device_close(d);
    }
    check_clean("device sticky");
}

/* Operations on cuda:1 from a thread whose current device is 0 (every new thread's): the memory
 * and copies land on device 1. */
typedef struct cross_arg {
    ferry_device *d;
    int errors;
} cross_arg;

static void *cross_thread(void *p)
{
    cross_arg *a = p;
    ferry_device *d = a->d;
    unsigned char src[8192], dst[8192];
    fill(src, sizeof src, 4);
    void *dev = NULL;
    uint64_t fr = 0, tot = 0;
    if (d->ops->alloc(d, sizeof src, &dev) || ferry__device_write(d, dev, src, sizeof src) ||
        ferry__device_read(d, dst, dev, sizeof dst) || memcmp(src, dst, sizeof src) ||
        d->ops->mem_info(d, &fr, &tot) || tot - fr != sizeof src)
        a->errors++;
    void *h = NULL;
    if (d->ops->host_alloc(d, 4096, &h))
        a->errors++;
    d->ops->host_free(d, h);
    d->ops->free(d, dev);
    return NULL;
}

static void device_ordinals(void)
{
    ferry_device *d1 = open_dev("cuda:1");
    if (!d1)
        return;
    fakecuda_stats s0 = stats(0), s1 = stats(1);
    cross_arg a = {d1, 0};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, cross_thread, &a), 0);
    pthread_join(th, NULL);
    CHECK_EQ_INT(a.errors, 0);
    fakecuda_stats e0 = stats(0), e1 = stats(1);
    CHECK_EQ_INT(e0.mallocs, s0.mallocs);
    CHECK_EQ_INT(e0.copies, s0.copies);
    CHECK_EQ_INT(e1.mallocs - s1.mallocs, 1);
    CHECK_EQ_INT(e1.copies - s1.copies, 2);
    ferry_device_close(d1);
    check_clean("device ordinals");
}

/* ---- the manager ------------------------------------------------------------------------------ */

/* Layers as `ferry run` makes them: "blk.N.*" together, every other tensor alone. */
typedef struct layers {
    ferry_tensor **t;
    size_t n;
    size_t start[256];
    size_t count;
} layers;

static void layers_of(ferry *f, layers *L)
{
    L->t = fixture_all_tensors(f, &L->n);
    L->count = 0;
    char prev[64] = "";
    for (size_t i = 0; i < L->n && L->count < 255; i++) {
        ferry_tensor_info info;
        ferry_tensor_get_info(L->t[i], &info);
        char key[64];
        const char *dot = strncmp(info.name, "blk.", 4) == 0 ? strchr(info.name + 4, '.') : NULL;
        snprintf(key, sizeof key, "%.*s", dot ? (int)(dot - info.name) : (int)strlen(info.name),
                 info.name);
        if (!i || strcmp(key, prev) != 0)
            L->start[L->count++] = i;
        snprintf(prev, sizeof prev, "%s", key);
    }
    L->start[L->count] = L->n;
}

/* T's staged bytes equal the file's (converted to its staged dtype when that differs). */
static int tensor_ok(ferry *f, ferry_tensor *t)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    uint64_t n = ferry_tensor_nbytes(t);
    unsigned char *want = fixture_pread(info.file, info.offset, info.nbytes);
    unsigned char *got = malloc(n ? n : 1), *conv = NULL;
    int ok = want && got && ferry_tensor_read(f, t, 0, n, got) == 0;
    if (ok && ferry_tensor_dtype(t) != info.dtype) {
        conv = malloc(n ? n : 1);
        ok = conv && ferry_dtype_convert(info.dtype, want, ferry_tensor_dtype(t), conv,
                                         info.n_elems) == 0 &&
             memcmp(conv, got, n) == 0;
    } else if (ok) {
        ok = n == info.nbytes && memcmp(want, got, n) == 0;
    }
    if (!ok)
        fprintf(stderr, "tensor '%s': staged bytes differ from the file (%s)\n", info.name,
                ferry_errmsg(f));
    free(want);
    free(got);
    free(conv);
    return ok;
}

/* Layer by layer: prepare, check every tensor, release. Returns the number of bad tensors, or
 * -1 when a prepare failed. */
static int pass_layers(ferry *f, layers *L)
{
    int bad = 0;
    for (size_t k = 0; k < L->count; k++) {
        ferry_tensor **ts = L->t + L->start[k];
        size_t n = L->start[k + 1] - L->start[k];
        if (ferry_prepare(f, ts, n)) {
            fprintf(stderr, "prepare: %s\n", ferry_errmsg(f));
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            bad += !tensor_ok(f, ts[i]);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    }
    return bad;
}

/* A manager of a test on cuda:0: the model, every tensor's placement, the budgets. */
typedef struct cuda_setup {
    const char *model;
    ferry_home home;
    ferry_load load;
    uint64_t budget;      /* the device's; 0: the default (from cudaMemGetInfo) */
    ferry_dtype convert;  /* staged as this type; 0: as stored */
    uint64_t host_budget; /* 0: the default */
    int no_schedule;      /* no prefetch, not even in file order before a schedule */
    int no_pool;          /* the runtime refuses memory pools: cudaMalloc and cudaFree */
} cuda_setup;

/* A manager set up as S with every tensor in one group, its device's index in *DEV and its
 * layers in *L (the caller frees L->t). */
static ferry *cuda_manager(const cuda_setup *s, int *dev, layers *L)
{
    ferry_options o = {.no_schedule = s->no_schedule};
    ferry *f = ferry_create(&o);
    CHECK(f != NULL);
    *dev = -1;
    CHECK_EQ_INT(ferry_add_device(f, "cuda:0", dev), 0);
    if (s->budget)
        CHECK_EQ_INT(ferry_set_budget(f, *dev, s->budget), 0);
    if (s->host_budget)
        CHECK_EQ_INT(ferry_set_budget(f, 0, s->host_budget), 0);
    CHECK_EQ_INT(ferry_open(f, s->model, NULL), 0);
    ferry_policy p = {.home = s->home, .load = s->load, .compute_device = *dev};
    if (s->convert) {
        p.convert = 1;
        p.compute_dtype = s->convert;
    }
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    layers_of(f, L);
    return f;
}

static void stream_one(const cuda_setup *c)
{
    int dev;
    layers L;
    if (c->no_pool)
        setenv("FAKE_CUDA_NO_POOL", "1", 1);
    fakecuda_stats s0 = stats(0);
    ferry *f = cuda_manager(c, &dev, &L);
    ferry_device_info di;
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &di), 0);
    CHECK_EQ_INT(di.total_bytes, FAKE_MEM);
    CHECK(di.budget > 0 && di.budget <= FAKE_MEM); /* from cudaMemGetInfo, or the one set */
    fc_reset_peak();
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    for (int pass = 0; pass < 2; pass++)
        CHECK_EQ_INT(pass_layers(f, &L), 0);
    /* all at once, when the budget allows it */
    if (!c->budget) {
        CHECK_EQ_INT(ferry_prepare(f, L.t, L.n), 0);
        int bad = 0;
        for (size_t i = 0; i < L.n; i++) {
            bad += !tensor_ok(f, L.t[i]);
            CHECK(ferry_tensor_data(L.t[i]) != NULL); /* a device address, not for the host */
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(ferry_release(f, L.t, L.n), 0);
    }
    ferry_stats st;
    ferry_get_stats(f, &st);
    fakecuda_stats s = stats(0);
    if (c->budget && c->budget < model) {
        CHECK(st.evictions > 0);
        CHECK(s.peak_used <= c->budget); /* what the device saw stays within ferry's budget */
    }
    CHECK(st.bytes_copied >= model);
    CHECK(s.bytes_h2d >= model);
    free(L.t);
    ferry_destroy(f);
    unsetenv("FAKE_CUDA_NO_POOL");
    /* Device memory is freed in the copy stream's order, never by cudaFree, which would wait
     * for the whole device; without memory pools, by cudaFree. */
    s = stats(0);
    uint64_t synced = s.synced_frees - s0.synced_frees, async = s.async_frees - s0.async_frees;
    CHECK(s.frees > s0.frees);
    CHECK_EQ_INT(synced + async, s.frees - s0.frees);
    CHECK_EQ_INT(c->no_pool ? async : synced, 0);
    check_clean("stream");
}

static void manager_stream(void)
{
    static const cuda_setup cases[] = {
        {.model = g_gguf, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .budget = 2 * MiB},
        {.model = g_gguf, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP, .budget = 2 * MiB},
        {.model = g_gguf, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_DIRECT, .budget = 2 * MiB},
        {.model = g_gguf, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_AUTO},
        {.model = g_gguf, .home = FERRY_HOME_DEVICE, .load = FERRY_LOAD_READ},
        {.model = g_gguf, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .budget = 4 * MiB,
         .convert = FERRY_DTYPE_F32},
        {.model = g_st, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_AUTO, .budget = 2 * MiB},
        {.model = g_q8, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ,
         .convert = FERRY_DTYPE_F16},
        {.model = g_gguf, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .budget = 2 * MiB,
         .no_pool = 1},
        {.model = g_gguf, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_DIRECT, .budget = 2 * MiB,
         .no_pool = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        stream_one(&cases[i]);
}

/* The process's mapping of PATH is read-only and shared ("r--s" in /proc/self/maps). */
static int mapping_shared(const char *path)
{
    FILE *m = fopen("/proc/self/maps", "r");
    char line[1600];
    int found = 0, shared = 1;
    while (m && fgets(line, sizeof line, m)) {
        line[strcspn(line, "\n")] = 0;
        size_t n = strlen(line), k = strlen(path);
        if (n < k || strcmp(line + n - k, path) != 0)
            continue;
        char perms[8] = "";
        if (sscanf(line, "%*s %7s", perms) == 1) {
            found = 1;
            shared &= strcmp(perms, "r--s") == 0;
        }
    }
    if (m)
        fclose(m);
    return found && shared;
}

/* A host home copied to the device at every use is registered with it (its page-aligned part,
 * tensors of at least 1 MiB): later passes copy it with no pageable copy but the parts before and
 * after, under a page each (a private copy's; the mapping's go through staging). Refused, ferry
 * copies through staging as before, and does not ask again. Either way the bytes are the file's,
 * and nothing stays registered after ferry_destroy (check_clean). */
static void registered_case(ferry_load load, int refuse)
{
    fc_register(refuse, 0);
    /* a layer is 10 MiB, the model 20 */
    const cuda_setup c = {.model = g_big, .home = FERRY_HOME_HOST, .load = load, .budget = 12 * MiB};
    int dev;
    layers L;
    ferry *f = cuda_manager(&c, &dev, &L);
    uint64_t big = 0, model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    for (size_t i = 0; i < L.n; i++) {
        ferry_tensor_info info;
        ferry_tensor_get_info(L.t[i], &info);
        big += info.nbytes >= 2 * MiB;
    }
    CHECK_EQ_INT(big, 8);
    fakecuda_stats s0 = stats(-1);
    CHECK_EQ_INT(pass_layers(f, &L), 0);
    fakecuda_stats s1 = stats(-1);
    CHECK_EQ_INT(pass_layers(f, &L), 0);
    fakecuda_stats s2 = stats(-1);
    uint64_t regs = s2.host_registers - s0.host_registers;
    uint64_t refusals = s2.register_refusals - s0.register_refusals;
    uint64_t pageable = s2.pageable_h2d_bytes - s1.pageable_h2d_bytes; /* pass 2 */
    if (load == FERRY_LOAD_MMAP)
        CHECK(mapping_shared(g_big)); /* else pinning it would copy each page (see iofile.c) */
    if (refuse) {
        CHECK_EQ_INT(regs, 0);
        /* each asked once (read-only, then without), not at every pass */
        CHECK(refusals >= big && refusals <= 2 * big);
        CHECK_EQ_INT(s2.live_registered, 0);
        if (load == FERRY_LOAD_READ)
            CHECK(pageable >= model - model / 8); /* the private copies, as they are */
    } else {
        CHECK_EQ_INT(refusals, 0);
        CHECK(regs >= big && regs <= L.n);
        CHECK_EQ_INT(s1.host_registers - s0.host_registers, regs); /* all in pass 1 */
        CHECK(s2.live_registered == regs);
        CHECK(pageable <= 2 * 4096 * regs + (model - big * 2 * MiB));
        if (load == FERRY_LOAD_MMAP)
            CHECK(pageable <= model - big * 2 * MiB); /* none from the registered tensors */
    }
    free(L.t);
    ferry_destroy(f);
    fc_register(0, 0);
    check_clean(refuse ? "registration refused" : "registered");
}

/* A mapping registered is page-locked: ferry registers no more of it than the host budget's
 * room, and the bytes are right either way. */
static void registered_capped(void)
{
    const cuda_setup c = {.model = g_big, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP,
                          .budget = 12 * MiB, .host_budget = 7 * MiB};
    int dev;
    layers L;
    ferry *f = cuda_manager(&c, &dev, &L);
    for (int pass = 0; pass < 2; pass++)
        CHECK_EQ_INT(pass_layers(f, &L), 0);
    fakecuda_stats s = stats(-1);
    CHECK(s.live_registered >= 2 && s.live_registered <= 3); /* 2 and 3 MiB tensors */
    CHECK(s.live_registered_bytes <= 7 * MiB);
    free(L.t);
    ferry_destroy(f);
    check_clean("registered within the host budget");
}

/* A copy out of a registered home copy that fails (the COPY_NTH-th after the first pass, as
 * MODE) fails its prepare with the device named, leaves the manager streaming right, and nothing
 * registered after ferry_destroy. */
static void registered_fault(uint64_t copy_nth, int mode)
{
    const cuda_setup c = {.model = g_big, .home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP,
                          .budget = 12 * MiB, .no_schedule = 1};
    int dev;
    layers L;
    ferry *f = cuda_manager(&c, &dev, &L);
    CHECK_EQ_INT(pass_layers(f, &L), 0);
    CHECK(stats(-1).live_registered >= 8);
    /* blk.0's weights were evicted for blk.1's: staged again, from the registered mapping */
    ferry_tensor *t = ferry_find(f, "blk.0.ffn_up.weight");
    CHECK(t != NULL);
    fc_faults(0, copy_nth, mode, 0);
    int rc = ferry_prepare(f, &t, 1);
    fc_faults(0, 0, 0, 0);
    CHECK_EQ_INT(rc, FERRY_EDEVICE);
    if (!strstr(ferry_errmsg(f), "cuda:0") || !strstr(ferry_errmsg(f), "blk.0.ffn_up.weight"))
        fprintf(stderr, "registered fault: '%s'\n", ferry_errmsg(f));
    CHECK(strstr(ferry_errmsg(f), "cuda:0") != NULL);
    CHECK(strstr(ferry_errmsg(f), "blk.0.ffn_up.weight") != NULL);
    CHECK_EQ_INT(pass_layers(f, &L), 0);
    free(L.t);
    ferry_destroy(f);
    check_clean("registered copy failed");
}

static void manager_registered(void)
{
    registered_fault(1, FAKECUDA_FAIL_ASYNC); /* the registered part's copy */
    registered_fault(1, FAKECUDA_FAIL_SYNC);
    registered_fault(2, FAKECUDA_FAIL_ASYNC); /* the head's, with the registered part in flight */
    registered_capped();
    registered_case(FERRY_LOAD_READ, 0);
    registered_case(FERRY_LOAD_MMAP, 0);
    registered_case(FERRY_LOAD_READ, 1);
    registered_case(FERRY_LOAD_MMAP, 1);
}

/* Four threads stream their own layers through one budget at once. */
typedef struct thr_arg {
    ferry *f;
    layers *L;
    int which, errors;
} thr_arg;

static void *stream_thread(void *p)
{
    thr_arg *a = p;
    for (int pass = 0; pass < 3; pass++)
        for (size_t k = (size_t)a->which; k < a->L->count; k += 4) {
            ferry_tensor **ts = a->L->t + a->L->start[k];
            size_t n = a->L->start[k + 1] - a->L->start[k];
            if (ferry_prepare(a->f, ts, n)) {
                a->errors++;
                continue;
            }
            for (size_t i = 0; i < n; i++)
                a->errors += !tensor_ok(a->f, ts[i]);
            ferry_release(a->f, ts, n);
        }
    return NULL;
}

static void manager_threads(void)
{
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device(f, "cuda:0", &dev), 0);
    CHECK_EQ_INT(ferry_set_budget(f, dev, 4 * MiB), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .compute_device = dev};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    layers L;
    layers_of(f, &L);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){f, &L, i, 0};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, stream_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].errors, 0);
    }
    free(L.t);
    ferry_destroy(f);
    check_clean("threads");
}

/* ---- split placement -------------------------------------------------------------------------- */

static void split_case(const char *second, float w0, float w1, ferry_home home)
{
    ferry *f = ferry_create(NULL);
    int a = -1, b = 0;
    CHECK_EQ_INT(ferry_add_device(f, "cuda:0", &a), 0);
    if (strcmp(second, "cpu") != 0)
        CHECK_EQ_INT(ferry_add_device(f, second, &b), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.home = home, .load = FERRY_LOAD_READ, .n_split = 2,
                      .split_devices = {a, b}, .split_weights = {w0, w1}};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    size_t n;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    fakecuda_stats s0 = stats(0), s1 = stats(1), sa = stats(-1);
    for (int pass = 0; pass < 2; pass++) {
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(ts[i], &info);
            int parts = ferry_tensor_part_count(ts[i]);
            CHECK_EQ_INT(parts, info.ndim == 2 ? 2 : 1);
            uint64_t row_bytes = info.n_rows ? info.nbytes / info.n_rows : 0, off = 0;
            for (int k = 0; k < parts; k++) {
                ferry_tensor_part pt;
                CHECK_EQ_INT(ferry_tensor_get_part(ts[i], k, &pt), 0);
                CHECK_EQ_INT(pt.device, parts == 1 ? a : (k ? b : a));
                CHECK(pt.data != NULL);
                if (parts == 2 && k == 0) /* the first device's share of the rows */
                    CHECK(fabs((double)pt.n_rows / (double)info.n_rows - w0 / (w0 + w1)) < 0.05);
                /* each block's bytes are the file's rows row0 .. row0 + n_rows */
                unsigned char *want =
                    fixture_pread(info.file, info.offset + pt.row0 * row_bytes, pt.nbytes);
                unsigned char *got = malloc(pt.nbytes ? pt.nbytes : 1);
                int ok = want && got && pt.nbytes == pt.n_rows * row_bytes &&
                         ferry_tensor_read(f, ts[i], off, pt.nbytes, got) == 0 &&
                         memcmp(want, got, pt.nbytes) == 0;
                if (!ok)
                    fprintf(stderr, "split %s: tensor '%s' part %d differs\n", second, info.name,
                            k);
                bad += !ok;
                off += pt.nbytes;
                free(want);
                free(got);
            }
            CHECK_EQ_INT(off, info.nbytes);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    }
    fakecuda_stats e0 = stats(0), e1 = stats(1), all = stats(-1);
    printf("split cuda:0 + %s: %" PRIu64 " pinned allocations\n", second,
           all.host_allocs - sa.host_allocs);
    uint64_t c0 = e0.bytes_h2d - s0.bytes_h2d, c1 = e1.bytes_h2d - s1.bytes_h2d;
    CHECK(c0 > 0);
    /* staging buffers are not given back and pinned anew at each switch between the devices:
     * at most each loader's four (stage and conversion, two each) */
    CHECK(all.host_allocs - sa.host_allocs <= 16);
    if (b) /* cuda:1 holds three quarters of the rows */
        CHECK(c1 > 2 * c0);
    else
        CHECK_EQ_INT(c1, 0);
    free(ts);
    ferry_destroy(f);
    check_clean("split");
}

/* ---- faults through the manager -------------------------------------------------------------- */

/* A fresh manager (so that every allocation and staging buffer is new) on cuda:0, budget 2 MiB,
 * home disk; the first layer prepared with the fault armed must fail with CODE and a message
 * holding WHAT, hold nothing, and the manager must then stream the model right. Returns whether
 * the fault fired. */
static int fault_case(uint64_t malloc_nth, uint64_t copy_nth, int mode, uint64_t host_nth,
                      int code, const char *what)
{
    /* no prefetch (not even in file order before a schedule): the N-th allocation and copy are
     * the layer's own, whatever the timing */
    const cuda_setup c = {.model = g_gguf, .home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ,
                          .budget = 2 * MiB, .no_schedule = 1};
    int dev;
    layers L;
    ferry *f = cuda_manager(&c, &dev, &L);
    /* layer 1 (blk.0): five tensors, several copies each with chunked transfers off */
    ferry_tensor **ts = L.t + L.start[1];
    size_t n = L.start[2] - L.start[1];
    fakecuda_stats before = stats(0);
    fc_delay(1000); /* slow copies: the layer's other loads are still in flight at the failure */
    fc_faults(malloc_nth, copy_nth, mode, host_nth);
    int rc = ferry_prepare(f, ts, n);
    fakecuda_stats after = stats(0);
    fc_faults(0, 0, 0, 0);
    fc_delay(20);
    int fired = rc != 0;
    if (rc) {
        if (rc != code)
            fprintf(stderr, "fault case malloc %llu copy %llu mode %d host %llu: rc %d '%s'\n",
                    (unsigned long long)malloc_nth, (unsigned long long)copy_nth, mode,
                    (unsigned long long)host_nth, rc, ferry_errmsg(f));
        CHECK_EQ_INT(rc, code);
        /* a failed prepare returns once its loads have settled: none writes its message later */
        CHECK_EQ_INT(after.copies_done, after.copies);
        if (!strstr(ferry_errmsg(f), what) || !strstr(ferry_errmsg(f), "cuda:0"))
            fprintf(stderr, "fault: '%s' lacks '%s'\n", ferry_errmsg(f), what);
        CHECK(strstr(ferry_errmsg(f), what) != NULL);
        CHECK(strstr(ferry_errmsg(f), "cuda:0") != NULL);
        CHECK(ferry_tensor_data(ts[0]) == NULL); /* a failed prepare holds nothing */
        CHECK_EQ_INT(ferry_release(f, ts, 1), FERRY_EINVAL);
    } else {
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        /* a fault past what the layer needed does not fire */
        CHECK(after.mallocs - before.mallocs < malloc_nth || !malloc_nth);
    }
    if (mode == FAKECUDA_FAIL_STICKY && copy_nth) {
        /* the context is lost: every prepare fails plainly; closing must not hang */
        if (fired) {
            CHECK(ferry_prepare(f, ts, n) != 0);
            CHECK(strstr(ferry_errmsg(f), "illegal memory access") != NULL);
        }
        free(L.t);
        ferry_destroy(f);
        fc_clear_sticky();
        check_clean("sticky fault");
        return fired;
    }
    /* usable: the model streams with every byte right (the failed tensor staged anew) */
    CHECK_EQ_INT(pass_layers(f, &L), 0);
    free(L.t);
    ferry_destroy(f);
    check_clean("fault");
    return fired;
}

static void manager_faults(void)
{
    int fired = 0;
    for (uint64_t k = 1; k <= 5; k++)
        fired += fault_case(k, 0, 0, 0, FERRY_ENOMEM, "cudaMalloc");
    CHECK_EQ_INT(fired, 5); /* the layer's five tensors each allocate */
    fired = 0;
    for (uint64_t k = 1; k <= 5; k++)
        fired += fault_case(0, k, FAKECUDA_FAIL_ASYNC, 0, FERRY_EDEVICE, "copy to device failed");
    CHECK_EQ_INT(fired, 5);
    fired = 0;
    for (uint64_t k = 1; k <= 5; k++)
        fired += fault_case(0, k, FAKECUDA_FAIL_SYNC, 0, FERRY_EDEVICE, "cudaMemcpyAsync");
    CHECK_EQ_INT(fired, 5);
    CHECK(fault_case(0, 0, 0, 1, FERRY_ENOMEM, "staging buffers (cuda:0: cudaHostAlloc"));
    CHECK(fault_case(0, 2, FAKECUDA_FAIL_STICKY, 0, FERRY_EDEVICE, "illegal memory access"));
}

/* ---- the CLI --------------------------------------------------------------------------------- */

/* The fake's exit line says the process left nothing and misused nothing. */
static void check_report(const char *what)
{
    static const char *want[] = {"live_allocs=0 ",  "live_host_allocs=0 ", "live_streams=0 ",
                                 "live_events=0 ",  "copies_refused=0 ",   "foreign_copies=0 ",
                                 "free_while_queued=0 ", "bad_frees=0 ", "bad_host_frees=0 ",
                                 "bad_handles=0 "};
    const char *line = strstr(err_text, "fake_cudart: exit:");
    CHECK(line != NULL);
    for (size_t i = 0; line && i < sizeof want / sizeof want[0]; i++)
        if (!strstr(line, want[i])) {
            fprintf(stderr, "%s: the fake's report lacks '%s': %s\n", what, want[i], line);
            CHECK(0);
        }
}

static void cli_run_ok(int passes, const char *args)
{
    int rc = run("run '%s' --verify --json --passes %d --quiet %s", g_gguf, passes, args);
    int ok = rc == 0 && strstr(out_text, "\"verify\": \"ok\"") != NULL;
    if (!ok)
        fprintf(stderr, "ferry run %s: exit %d\n%s\n%s\n", args, rc, out_text, err_text);
    CHECK(ok);
    check_report(args);
}

static void cli(void)
{
    setenv("FAKE_CUDA_REPORT", "1", 1); /* for the children: this process's fake started before */
    CHECK_EQ_INT(run("devices"), 0);
    CHECK(strstr(out_text, "cuda:0") != NULL && strstr(out_text, "cuda:1") != NULL);
    cli_run_ok(1, "--device cuda:0");
    cli_run_ok(2, "--device cuda:0 --home disk --budget device=2MiB");
    cli_run_ok(1, "--device cuda:0 --home device --load direct");
    cli_run_ok(1, "--device cuda:0 --compute-dtype f32 --budget device=4MiB");
    cli_run_ok(2, "--split cuda:0,cuda:1:3");
    cli_run_ok(1, "--split cuda:0,cpu --home disk");
    /* LoRA merged at staging (f32 on the host, through pinned buffers) */
    char adapter[1300];
    snprintf(adapter, sizeof adapter, "%s/lora.gguf", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --rank 4 -q", g_gguf, adapter), 0);
    char args[1500];
    snprintf(args, sizeof args, "-a '%s' --device cuda:0 --home disk --budget device=2MiB",
             adapter);
    cli_run_ok(1, args);
    snprintf(args, sizeof args, "-a '%s' --split cuda:0,cuda:1:3 --compute-dtype f16", adapter);
    cli_run_ok(1, args);
    /* a copy failing on the way: exit 1, the device and the tensor named, nothing left */
    setenv("FAKE_CUDA_FAIL_COPY", "3", 1);
    int rc = run("run '%s' --device cuda:0 --passes 1 --quiet", g_gguf);
    unsetenv("FAKE_CUDA_FAIL_COPY");
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err_text, "cuda:0") && strstr(err_text, "copy to device failed") &&
          strstr(err_text, "tensor '"));
    check_report("copy failure");
    setenv("FAKE_CUDA_FAIL_MALLOC", "2", 1);
    rc = run("run '%s' --device cuda:0 --passes 1 --quiet", g_gguf);
    unsetenv("FAKE_CUDA_FAIL_MALLOC");
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err_text, "cudaMallocFromPoolAsync of ") && strstr(err_text, "out of memory"));
    check_report("malloc failure");
    setenv("FAKE_CUDA_FAIL_MALLOC", "2", 1);
    setenv("FAKE_CUDA_NO_POOL", "1", 1);
    rc = run("run '%s' --device cuda:0 --passes 1 --quiet", g_gguf);
    unsetenv("FAKE_CUDA_NO_POOL");
    unsetenv("FAKE_CUDA_FAIL_MALLOC");
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err_text, "cudaMalloc of ") && strstr(err_text, "out of memory"));
    check_report("malloc failure without pools");
    /* no device at all: a plain refusal */
    setenv("FAKE_CUDA_DEVICES", "0", 1);
    rc = run("run '%s' --device cuda:0 --quiet", g_gguf);
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err_text, "cuda:0 unavailable: no CUDA device") != NULL);
    unsetenv("FAKE_CUDA_REPORT");
    /* FERRY_CUDART names the runtime: a wrong path is said so, not replaced by another one */
    setenv("FERRY_CUDART", "/nonexistent/libcudart.so", 1);
    rc = run("run '%s' --device cuda:0 --quiet", g_gguf);
    setenv("FERRY_CUDART", FAKE_CUDART, 1);
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err_text, "cuda:0 unavailable: FERRY_CUDART=/nonexistent/libcudart.so cannot "
                           "be loaded") != NULL);
}

/* The fake runtime itself: a stream-ordered free that its stream reaches while another stream's
 * copy still uses the memory is counted, and the memory stays until that copy is done; nothing
 * waits (that stream's copy may wait on this one). Last: it leaves free_while_queued at 1. */
static void fake_free_across_streams(void *lib)
{
    int (*stream_create)(void **, unsigned);
    int (*stream_sync)(void *), (*stream_destroy)(void *);
    int (*pool_create)(void **, const void *), (*pool_destroy)(void *);
    int (*pool_malloc)(void **, size_t, void *, void *), (*free_async)(void *, void *);
    int (*copy)(void *, const void *, size_t, int, void *);
    *(void **)&stream_create = dlsym(lib, "cudaStreamCreateWithFlags");
    *(void **)&stream_sync = dlsym(lib, "cudaStreamSynchronize");
    *(void **)&stream_destroy = dlsym(lib, "cudaStreamDestroy");
    *(void **)&pool_create = dlsym(lib, "cudaMemPoolCreate");
    *(void **)&pool_destroy = dlsym(lib, "cudaMemPoolDestroy");
    *(void **)&pool_malloc = dlsym(lib, "cudaMallocFromPoolAsync");
    *(void **)&free_async = dlsym(lib, "cudaFreeAsync");
    *(void **)&copy = dlsym(lib, "cudaMemcpyAsync");
    CHECK(stream_create && stream_sync && stream_destroy && pool_create && pool_destroy &&
          pool_malloc && free_async && copy);
    if (!(stream_create && stream_sync && stream_destroy && pool_create && pool_destroy &&
          pool_malloc && free_async && copy))
        return;
    struct {
        int alloc_type, handle_types, location_type, location_id;
        void *win32;
        unsigned char rest[64];
    } props = {.alloc_type = 1, .location_type = 1};
    void *a = NULL, *b = NULL, *pool = NULL, *p = NULL;
    static unsigned char host[64 << 10];
    fakecuda_stats s0 = stats(0);
    CHECK_EQ_INT(stream_create(&a, 1), 0);
    CHECK_EQ_INT(stream_create(&b, 1), 0);
    CHECK_EQ_INT(pool_create(&pool, &props), 0);
    CHECK_EQ_INT(pool_malloc(&p, sizeof host, pool, a), 0);
    fc_delay(200000); /* the copy on B is still queued when A reaches the free */
    CHECK_EQ_INT(copy(p, host, sizeof host, 1, b), 0);
    CHECK_EQ_INT(free_async(p, a), 0);
    CHECK(copy(p, host, sizeof host, 1, b) != 0); /* its free is queued: refused */
    CHECK_EQ_INT(stream_sync(a), 0);
    fakecuda_stats s1 = stats(0);
    CHECK_EQ_INT(s1.free_while_queued - s0.free_while_queued, 1);
    CHECK_EQ_INT(s1.live_allocs, s0.live_allocs + 1); /* kept for B's copy */
    CHECK_EQ_INT(stream_sync(b), 0);
    fc_delay(20);
    s1 = stats(0);
    CHECK_EQ_INT(s1.live_allocs, s0.live_allocs);
    CHECK_EQ_INT(s1.async_frees - s0.async_frees, 1);
    CHECK_EQ_INT(pool_destroy(pool), 0);
    CHECK_EQ_INT(stream_destroy(a), 0);
    CHECK_EQ_INT(stream_destroy(b), 0);
    g_refused++;
}

int main(void)
{
    /* before anything loads the runtime: this process and its children see the fake */
    setenv("FERRY_CUDART", FAKE_CUDART, 1);
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    setenv("FAKE_CUDA_MEM", "64MiB", 1);
    setenv("FAKE_CUDA_DELAY_US", "20", 1);
    unsetenv("FAKE_CUDA_FAIL_COPY");
    unsetenv("FAKE_CUDA_FAIL_MALLOC");
    unsetenv("FAKE_CUDA_FAIL_HOST_ALLOC");
    unsetenv("FAKE_CUDA_REPORT");
    void *lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load %s: %s\n", FAKE_CUDART, dlerror());
        return 1;
    }
    *(void **)&fc_stats = dlsym(lib, "fakecuda_get_stats");
    *(void **)&fc_faults = dlsym(lib, "fakecuda_set_faults");
    *(void **)&fc_delay = dlsym(lib, "fakecuda_set_delay_us");
    *(void **)&fc_clear_sticky = dlsym(lib, "fakecuda_clear_sticky");
    *(void **)&fc_record_fault = dlsym(lib, "fakecuda_set_record_fault");
    *(void **)&fc_reset_peak = dlsym(lib, "fakecuda_reset_peak");
    *(void **)&fc_register = dlsym(lib, "fakecuda_set_register");
    if (!fc_stats || !fc_faults || !fc_delay || !fc_clear_sticky || !fc_record_fault ||
        !fc_reset_peak || !fc_register) {
        fprintf(stderr, "%s lacks the test hooks\n", FAKE_CUDART);
        return 1;
    }
    const char *dir = check_tmpdir("cuda_fake");
    tmp = dir;
    snprintf(g_gguf, sizeof g_gguf, "%s/m.gguf", dir);
    snprintf(g_st, sizeof g_st, "%s/m.safetensors", dir);
    snprintf(g_q8, sizeof g_q8, "%s/q8.gguf", dir);
    snprintf(g_big, sizeof g_big, "%s/big.gguf", dir);
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, 6, 256, 512, 512, FERRY_DTYPE_F16, 0);
    if (fixture_write(g_gguf, FERRY_FORMAT_GGUF, ts, n))
        return 2;
    n = fixture_layout(ts, 3, 128, 256, 300, FERRY_DTYPE_BF16, 1);
    if (fixture_write(g_st, FERRY_FORMAT_SAFETENSORS, ts, n))
        return 2;
    n = fixture_layout(ts, 3, 128, 256, 300, FERRY_DTYPE_Q8_0, 0);
    if (fixture_write(g_q8, FERRY_FORMAT_GGUF, ts, n))
        return 2;
    n = fixture_layout(ts, 2, 1024, 1536, 256, FERRY_DTYPE_F16, 0);
    if (fixture_write(g_big, FERRY_FORMAT_GGUF, ts, n))
        return 2;

    device_basics();
    device_copy_faults();
    device_sticky();
    device_ordinals();
    manager_stream();
    manager_registered();
    manager_threads();
    split_case("cpu", 1, 1, FERRY_HOME_HOST);
    split_case("cuda:1", 1, 3, FERRY_HOME_HOST);
    split_case("cpu", 1, 1, FERRY_HOME_DISK);
    split_case("cuda:1", 1, 3, FERRY_HOME_DISK);
    manager_faults();
    cli();
    fake_free_across_streams(lib);
    check_rmdir(dir);
    free(out_text);
    free(err_text);
    dlclose(lib);
    return check_finish();
}
