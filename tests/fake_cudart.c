/*
 * fake_cudart.c — a stand-in for the CUDA runtime (libcudart), built as libfake_cudart.so, so that
 * ferry's cuda device (src/devices/cuda.c, which dlopens the runtime; FERRY_CUDART=PATH picks
 * this file) runs in the tests of a machine without a GPU. It exports the runtime functions
 * cuda.c loads, with the runtime's C ABI and error numbers, and models what a careless caller
 * would get wrong on a real GPU:
 *
 *  - device memory is not host memory: cudaMalloc returns the address of a host buffer plus
 *    DEV_TAG (2^55), an address no process maps (non-canonical on x86-64, beyond the VA range on
 *    arm64, below the top byte arm64 ignores), so a host load or store through a device pointer
 *    crashes; copies translate it. A copy whose device side is not inside one live allocation,
 *    whose host side is a device address, or whose direction is wrong is refused with
 *    cudaErrorInvalidValue (or cudaErrorInvalidMemcpyDirection) and queues nothing;
 *  - streams are asynchronous: cudaMemcpyAsync only queues; one worker thread per stream copies
 *    later (after FAKE_CUDA_DELAY_US), in order; an event completes when the worker reaches its
 *    record; cudaEventQuery says cudaErrorNotReady until then; the synchronize calls block;
 *    cudaStreamWaitEvent holds a stream's later work until the event's latest record completes
 *    (on any stream); fakecuda_launch queues a late "kernel" that reads device memory. The
 *    host side of every copy is read or written late, whatever memory it is (stricter than CUDA
 *    for pageable memory, which it copies through staging; ferry's device contract already
 *    forbids touching copy memory before the wait);
 *  - cudaFree synchronizes the device first, as the real one does (and counts a free of memory a
 *    queued copy still used); memory per device is FAKE_CUDA_MEM, and cudaMemGetInfo reports it;
 *  - memory pools (cudaMemPoolCreate; FAKE_CUDA_NO_POOL=1 refuses them as not supported):
 *    cudaMallocFromPoolAsync allocates at once, cudaFreeAsync frees when its stream reaches it
 *    and synchronizes nothing; a copy that names memory whose free is queued is refused. The
 *    freed bytes leave the device's `used` at the call: the pool gives them to the allocations
 *    that follow on the same stream (one stream per device is what ferry uses); with a lost
 *    context the memory goes at once, as with cudaFree;
 *  - the current device is per thread (default 0), as is the last error; allocations, streams and
 *    events belong to the device current when they were made; recording an event on another
 *    device's stream is cudaErrorInvalidResourceHandle;
 *  - pinned memory (cudaHostAlloc) is page-aligned host memory, tracked, so freeing anything else
 *    with cudaFreeHost is cudaErrorInvalidValue;
 *  - registered host memory (cudaHostRegister) counts as pinned until unregistered; ranges that
 *    overlap a registered one, and unregistering what is not registered, are refused as the
 *    runtime does (cudaErrorHostMemoryAlreadyRegistered, cudaErrorHostMemoryNotRegistered);
 *  - faults on demand (environment or fakecuda_set_faults): the N-th cudaMalloc, cudaHostAlloc
 *    or copy fails; a copy fails synchronously, asynchronously, or stickily (the context is lost).
 * Everything is guarded by one lock; copies run outside it. See fake_cudart.h for the knobs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cudart.h"

#define API __attribute__((visibility("default")))

/* cudaError_t values (the runtime's numbering) */
enum {
    E_SUCCESS = 0,
    E_INVALID_VALUE = 1,
    E_MEMORY_ALLOCATION = 2,
    E_INVALID_MEMCPY_DIRECTION = 21,
    E_NO_DEVICE = 100,
    E_INVALID_DEVICE = 101,
    E_INVALID_RESOURCE_HANDLE = 400,
    E_HOST_MEMORY_ALREADY_REGISTERED = 712,
    E_HOST_MEMORY_NOT_REGISTERED = 713,
    E_NOT_SUPPORTED = 801,
    E_NOT_READY = 600,
    E_ILLEGAL_ADDRESS = 700,
    E_UNKNOWN = 999,
};

/* cudaMemcpyKind */
enum { K_H2H = 0, K_H2D = 1, K_D2H = 2, K_D2D = 3, K_DEFAULT = 4 };

#define MAX_DEVICES 16
#define DEV_TAG (UINT64_C(1) << 55)
#define DEV_ALIGN 256

typedef struct alloc_rec {
    uintptr_t dev;   /* the address handed out */
    uint64_t size;   /* as asked (at least 1): copies must stay inside it */
    uint64_t rounded;
    unsigned char *host;
    int device;
    uint64_t queued; /* queued copies that use it */
    int pooled;      /* from cudaMallocFromPoolAsync */
    int freeing;     /* its cudaFreeAsync is queued: its bytes no longer count in `used` */
    int orphan;      /* that free ran while another stream's copy still used it: it goes when
                        the last such copy is done */
} alloc_rec;

typedef struct fpool {
    int device;
} fpool;

typedef struct fevent {
    int device;
    uint64_t recorded, done; /* records queued / completed; done when done >= recorded */
    int err;                 /* status of the last completed record */
    int refs;                /* queued records that point here */
    int destroyed;
} fevent;

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_KERNEL, OP_FREE };

typedef struct op {
    struct op *next;
    int kind;
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
    int fail;          /* injected failure: 0 or the error the copy completes with */
    int dir;           /* K_* */
    alloc_rec *rec[2]; /* device allocations it uses (NULL where host) */
    fevent *ev;
    uint64_t seq;      /* OP_RECORD: the record it completes; OP_WAIT: the record it waits for */
    unsigned delay_us; /* OP_KERNEL: how late it runs */
    fakecuda_kernel_fn fn;
    void *ud;
} op;

typedef struct fstream {
    int device;
    pthread_t thread;
    pthread_cond_t work;
    op *head, *tail;
    int busy, stop;
    int pending_err; /* a failed copy not yet reported to an event */
    int sync_err;    /* a failed copy not yet reported by cudaStreamSynchronize */
} fstream;

typedef struct pinned_rec {
    void *p;
    uint64_t size;
} pinned_rec;

/* ---- state, all under g_lock (g_delay_us atomically) ----------------------------------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER; /* broadcast when any queued op ends */

static int g_ndev = 1;
static uint64_t g_mem = UINT64_C(2) << 30;
static unsigned g_delay_us;
static int g_poison = 1, g_report;
static uint64_t g_fail_malloc, g_fail_copy, g_fail_host, g_n_malloc, g_n_copy, g_n_host;
static uint64_t g_fail_record, g_n_record;
static int g_fail_mode;
static int g_sticky; /* 0, or the error every call returns after a sticky failure */

static alloc_rec **g_recs; /* sorted by dev */
static size_t g_nrecs, g_caprecs;
static pinned_rec *g_pinned;
static size_t g_npinned, g_cappinned;
static pinned_rec *g_reg; /* registered host ranges */
static size_t g_nreg, g_capreg;
static int g_register_refused;        /* every cudaHostRegister fails with cudaErrorNotSupported */
static fpool **g_pools;
static size_t g_npools, g_cappools;
static uint64_t g_fail_register, g_n_register; /* the N-th fails with cudaErrorMemoryAllocation */
static fstream **g_streams;
static size_t g_nstreams, g_capstreams;
static fevent **g_events;
static size_t g_nevents, g_capevents;
static uint64_t g_queued[MAX_DEVICES]; /* queued or running copies per device */

static fakecuda_stats g_st[MAX_DEVICES]; /* device counters */
static fakecuda_stats g_gl;              /* pinned memory, streams, events, handles */

static __thread int t_dev;
static __thread int t_err;

/* ---- helpers --------------------------------------------------------------------------------- */

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    uint64_t mul = 1;
    if (!strcmp(end, "") || !strcmp(end, "B"))
        mul = 1;
    else if (!strcmp(end, "K") || !strcmp(end, "KiB") || !strcmp(end, "k"))
        mul = UINT64_C(1) << 10;
    else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
        mul = UINT64_C(1) << 20;
    else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
        mul = UINT64_C(1) << 30;
    else
        return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    uint64_t x;
    return v && *v && parse_size(v, &x) == 0 ? x : dflt;
}

static void init(void)
{
    uint64_t n = env_u64("FAKE_CUDA_DEVICES", 1);
    g_ndev = n > MAX_DEVICES ? MAX_DEVICES : (int)n;
    g_mem = env_u64("FAKE_CUDA_MEM", g_mem);
    __atomic_store_n(&g_delay_us, (unsigned)env_u64("FAKE_CUDA_DELAY_US", 0), __ATOMIC_RELAXED);
    g_fail_malloc = env_u64("FAKE_CUDA_FAIL_MALLOC", 0);
    g_fail_host = env_u64("FAKE_CUDA_FAIL_HOST_ALLOC", 0);
    g_register_refused = env_u64("FAKE_CUDA_NO_REGISTER", 0) != 0;
    g_poison = env_u64("FAKE_CUDA_POISON", 1) != 0;
    g_report = env_u64("FAKE_CUDA_REPORT", 0) != 0;
    const char *fc = getenv("FAKE_CUDA_FAIL_COPY");
    if (fc && *fc) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", fc);
        char *colon = strchr(buf, ':');
        g_fail_mode = FAKECUDA_FAIL_ASYNC;
        if (colon) {
            *colon++ = 0;
            if (!strcmp(colon, "sync"))
                g_fail_mode = FAKECUDA_FAIL_SYNC;
            else if (!strcmp(colon, "sticky"))
                g_fail_mode = FAKECUDA_FAIL_STICKY;
        }
        uint64_t nth;
        g_fail_copy = parse_size(buf, &nth) == 0 ? nth : 0;
    }
}

static int fail(int e)
{
    t_err = e;
    return e;
}

/* Common entry of the device calls: initialised, a device exists, the context is not lost. */
static int enter(void)
{
    pthread_once(&g_once, init);
    if (g_ndev <= 0)
        return fail(E_NO_DEVICE);
    int sticky = __atomic_load_n(&g_sticky, __ATOMIC_ACQUIRE);
    return sticky ? fail(sticky) : 0;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* Index of the first record whose dev is greater than A. Lock held. */
static size_t rec_upper(uintptr_t a)
{
    size_t lo = 0, hi = g_nrecs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_recs[mid]->dev <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The live allocation holding [A, A+N) whole (N 0: holding A), or NULL. Lock held. */
static alloc_rec *rec_find(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = rec_upper(a);
    if (!i)
        return NULL;
    alloc_rec *r = g_recs[i - 1];
    uint64_t off = a - r->dev;
    if (off >= r->size || (uint64_t)n > r->size - off)
        return NULL;
    return r;
}

static int looks_device(const void *p)
{
    return (uintptr_t)p >= DEV_TAG;
}

static int in_recs(const pinned_rec *r, size_t nr, uintptr_t a, size_t n)
{
    for (size_t i = 0; i < nr; i++) {
        uintptr_t b = (uintptr_t)r[i].p;
        if (a >= b && a - b <= r[i].size && n <= r[i].size - (a - b))
            return 1;
    }
    return 0;
}

/* [P, P+N) lies within one cudaHostAlloc buffer or one registered range. Lock held. */
static int is_pinned(const void *p, size_t n)
{
    return in_recs(g_pinned, g_npinned, (uintptr_t)p, n) || in_recs(g_reg, g_nreg, (uintptr_t)p, n);
}

static int stream_live(const fstream *s)
{
    for (size_t i = 0; i < g_nstreams; i++)
        if (g_streams[i] == s)
            return 1;
    return 0;
}

static int event_live(const fevent *e)
{
    for (size_t i = 0; i < g_nevents; i++)
        if (g_events[i] == e)
            return 1;
    return 0;
}

static void sleep_us(unsigned us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Takes allocation R out of the live ones (its memory is the caller's to free). Lock held. */
static void rec_drop(alloc_rec *r)
{
    fakecuda_stats *st = &g_st[r->device];
    size_t at = rec_upper(r->dev) - 1;
    memmove(g_recs + at, g_recs + at + 1, (g_nrecs - at - 1) * sizeof *g_recs);
    g_nrecs--;
    if (!r->freeing)
        st->used -= r->rounded;
    st->live_allocs--;
    st->frees++;
}

/* One queued use of R is done; R goes if it was freed meanwhile (an orphan). Lock held. */
static void rec_unqueue(alloc_rec *r)
{
    if (--r->queued || !r->orphan)
        return;
    rec_drop(r);
    g_st[r->device].async_frees++;
    free(r->host);
    free(r);
}

/* ---- the stream worker ----------------------------------------------------------------------- */

static void *stream_main(void *arg)
{
    fstream *s = arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work, &g_lock);
        op *o = s->head;
        if (!o)
            break; /* stopping and drained */
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 1;
        int lost = g_sticky != 0;
        pthread_mutex_unlock(&g_lock);
        if (o->kind == OP_COPY) {
            unsigned d = __atomic_load_n(&g_delay_us, __ATOMIC_RELAXED);
            if (d)
                sleep_us(d);
            if (!o->fail && !lost)
                memcpy(o->dst, o->src, o->n);
        } else if (o->kind == OP_KERNEL) {
            if (o->delay_us)
                sleep_us(o->delay_us);
            if (!lost)
                o->fn(o->ud, o->src, o->n);
        }
        pthread_mutex_lock(&g_lock);
        if (o->kind == OP_WAIT) {
            /* cudaStreamWaitEvent: later work on this stream waits for that record */
            while (o->ev->done < o->seq)
                pthread_cond_wait(&g_done, &g_lock);
            if (--o->ev->refs == 0 && o->ev->destroyed)
                free(o->ev);
        } else if (o->kind == OP_KERNEL) {
            rec_unqueue(o->rec[1]);
        } else if (o->kind == OP_FREE) {
            alloc_rec *r = o->rec[0];
            if (r->queued) {
                /* another stream's copy still uses it: undefined on a GPU; here it is counted,
                 * and the memory stays until that copy is done (waiting for it could wait on
                 * this very stream) */
                g_st[r->device].free_while_queued++;
                r->orphan = 1;
            } else {
                rec_drop(r);
                g_st[r->device].async_frees++;
                pthread_mutex_unlock(&g_lock);
                free(r->host);
                free(r);
                pthread_mutex_lock(&g_lock);
            }
        } else if (o->kind == OP_COPY) {
            for (int k = 0; k < 2; k++)
                if (o->rec[k])
                    rec_unqueue(o->rec[k]);
            g_queued[s->device]--;
            fakecuda_stats *st = &g_st[s->device];
            st->copies_done++;
            if (o->fail || lost) {
                int e = o->fail ? o->fail : g_sticky;
                if (!s->pending_err)
                    s->pending_err = e;
                if (!s->sync_err)
                    s->sync_err = e;
                if (o->fail == E_ILLEGAL_ADDRESS)
                    __atomic_store_n(&g_sticky, E_ILLEGAL_ADDRESS, __ATOMIC_RELEASE);
            } else if (o->dir == K_H2D) {
                st->bytes_h2d += o->n;
            } else if (o->dir == K_D2H) {
                st->bytes_d2h += o->n;
            }
        } else {
            fevent *e = o->ev;
            e->err = s->pending_err;
            if (s->pending_err)
                s->sync_err = 0; /* reported once: by this event */
            s->pending_err = 0;
            if (o->seq > e->done)
                e->done = o->seq;
            if (--e->refs == 0 && e->destroyed)
                free(e);
        }
        s->busy = 0;
        free(o);
        pthread_cond_broadcast(&g_done);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

static void enqueue(fstream *s, op *o)
{
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_signal(&s->work);
}

/* Waits until every stream of DEVICE is idle. Lock held. */
static void device_idle(int device)
{
    for (;;) {
        int busy = 0;
        for (size_t i = 0; i < g_nstreams && !busy; i++)
            busy = g_streams[i]->device == device && (g_streams[i]->head || g_streams[i]->busy);
        if (!busy && !g_queued[device])
            return;
        pthread_cond_wait(&g_done, &g_lock);
    }
}

/* ---- the runtime API ------------------------------------------------------------------------- */

API int cudaGetDeviceCount(int *count)
{
    pthread_once(&g_once, init);
    if (!count)
        return fail(E_INVALID_VALUE);
    *count = g_ndev;
    return g_ndev > 0 ? E_SUCCESS : fail(E_NO_DEVICE);
}

API int cudaSetDevice(int device)
{
    pthread_once(&g_once, init);
    if (g_ndev <= 0)
        return fail(E_NO_DEVICE);
    if (device < 0 || device >= g_ndev)
        return fail(E_INVALID_DEVICE);
    t_dev = device;
    return E_SUCCESS;
}

static int dev_malloc(int dev, void **ptr, size_t size, int pooled);

API int cudaMalloc(void **ptr, size_t size)
{
    int e = enter();
    if (e)
        return e;
    if (!ptr)
        return fail(E_INVALID_VALUE);
    if (!size) {
        *ptr = NULL;
        return E_SUCCESS;
    }
    return dev_malloc(t_dev, ptr, size, 0);
}

/* Allocates SIZE (> 0) bytes of device DEV. */
static int dev_malloc(int dev, void **ptr, size_t size, int pooled)
{
    uint64_t rounded = ((uint64_t)size + DEV_ALIGN - 1) & ~(uint64_t)(DEV_ALIGN - 1);
    pthread_mutex_lock(&g_lock);
    fakecuda_stats *st = &g_st[dev];
    g_n_malloc++;
    int refuse = (g_fail_malloc && g_n_malloc == g_fail_malloc) || rounded < size ||
                 st->used + rounded > g_mem || st->used + rounded < st->used;
    int reserved = !refuse;
    if (reserved)
        st->used += rounded; /* reserved now, so that racing calls see it; given back on failure */
    pthread_mutex_unlock(&g_lock);
    void *host = NULL;
    alloc_rec *r = NULL;
    if (!refuse) {
        r = calloc(1, sizeof *r);
        if (!r || posix_memalign(&host, DEV_ALIGN, (size_t)rounded) || (uintptr_t)host >= DEV_TAG)
            refuse = 1;
    }
    if (!refuse && g_poison)
        memset(host, 0xA5, (size_t)rounded);
    pthread_mutex_lock(&g_lock);
    if (!refuse && grow((void **)&g_recs, &g_caprecs, g_nrecs + 1, sizeof *g_recs))
        refuse = 1;
    if (refuse) {
        if (reserved)
            st->used -= rounded;
        st->malloc_failures++;
        pthread_mutex_unlock(&g_lock);
        free(host);
        free(r);
        return fail(E_MEMORY_ALLOCATION);
    }
    r->host = host;
    r->dev = (uintptr_t)host + DEV_TAG;
    r->size = size;
    r->rounded = rounded;
    r->device = dev;
    r->pooled = pooled;
    size_t at = rec_upper(r->dev);
    memmove(g_recs + at + 1, g_recs + at, (g_nrecs - at) * sizeof *g_recs);
    g_recs[at] = r;
    g_nrecs++;
    st->mallocs++;
    st->live_allocs++;
    if (st->used > st->peak_used)
        st->peak_used = st->used;
    pthread_mutex_unlock(&g_lock);
    *ptr = (void *)r->dev;
    return E_SUCCESS;
}

API int cudaFree(void *ptr)
{
    pthread_once(&g_once, init);
    if (!ptr)
        return E_SUCCESS;
    pthread_mutex_lock(&g_lock);
    alloc_rec *r = rec_find(ptr, 0);
    if (!r || r->dev != (uintptr_t)ptr) {
        g_st[t_dev].bad_frees++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_VALUE);
    }
    fakecuda_stats *st = &g_st[r->device];
    if (r->queued)
        st->free_while_queued++;
    if (r->freeing) {
        g_st[t_dev].bad_frees++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_VALUE);
    }
    device_idle(r->device); /* cudaFree synchronizes the device */
    rec_drop(r);
    st->synced_frees++;
    int sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    free(r->host);
    free(r);
    return sticky ? fail(sticky) : E_SUCCESS; /* a lost context still releases the memory */
}

/* cudaMemPoolProps as the runtime lays it out (88 bytes on 64-bit hosts). */
typedef struct pool_props {
    int alloc_type, handle_types;
    int location_type, location_id;
    void *win32;
    unsigned char rest[64]; /* maxSize, usage, reserved: zero is the default */
} pool_props;

static int pool_live(const fpool *p)
{
    for (size_t i = 0; i < g_npools; i++)
        if (g_pools[i] == p)
            return 1;
    return 0;
}

API int cudaMemPoolCreate(void **pool, const void *props)
{
    int e = enter();
    if (e)
        return e;
    if (env_u64("FAKE_CUDA_NO_POOL", 0)) /* read at each call: tests switch it */
        return fail(E_NOT_SUPPORTED);
    const pool_props *pp = props;
    if (!pool || !pp || pp->alloc_type != 1 || pp->handle_types != 0 || pp->location_type != 1 ||
        pp->location_id < 0 || pp->location_id >= g_ndev || pp->win32)
        return fail(E_INVALID_VALUE);
    fpool *p = calloc(1, sizeof *p);
    if (!p)
        return fail(E_MEMORY_ALLOCATION);
    p->device = pp->location_id;
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_pools, &g_cappools, g_npools + 1, sizeof *g_pools)) {
        pthread_mutex_unlock(&g_lock);
        free(p);
        return fail(E_MEMORY_ALLOCATION);
    }
    g_pools[g_npools++] = p;
    g_gl.live_pools++;
    pthread_mutex_unlock(&g_lock);
    *pool = p;
    return E_SUCCESS;
}

API int cudaMemPoolDestroy(void *pool)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_npools && g_pools[i] != pool)
        i++;
    if (i == g_npools) {
        g_gl.bad_handles++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_VALUE);
    }
    g_pools[i] = g_pools[--g_npools];
    g_gl.live_pools--;
    pthread_mutex_unlock(&g_lock);
    free(pool); /* its allocations stay valid until freed, as with the real call */
    return E_SUCCESS;
}

API int cudaMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream)
{
    int e = enter();
    if (e)
        return e;
    if (!ptr)
        return fail(E_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    fpool *p = pool;
    int ok = pool_live(p) && stream && stream_live(stream);
    int dev = ok ? p->device : 0;
    if (!ok)
        g_gl.bad_handles++;
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return fail(E_INVALID_VALUE);
    if (!size) {
        *ptr = NULL;
        return E_SUCCESS;
    }
    return dev_malloc(dev, ptr, size, 1);
}

API int cudaFreeAsync(void *ptr, void *stream)
{
    pthread_once(&g_once, init);
    if (!ptr)
        return E_SUCCESS;
    int sticky = __atomic_load_n(&g_sticky, __ATOMIC_ACQUIRE);
    if (sticky) {
        /* the context is lost: nothing runs on its streams, the memory goes with it */
        pthread_mutex_lock(&g_lock);
        alloc_rec *r = rec_find(ptr, 0);
        int mine = r && r->dev == (uintptr_t)ptr && r->pooled && !r->freeing;
        if (mine)
            rec_drop(r);
        pthread_mutex_unlock(&g_lock);
        if (mine) {
            free(r->host);
            free(r);
        }
        return fail(sticky);
    }
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    if (!s || !stream_live(s)) {
        g_gl.bad_handles++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_RESOURCE_HANDLE);
    }
    alloc_rec *r = rec_find(ptr, 0);
    op *o = r && r->dev == (uintptr_t)ptr && r->pooled && !r->freeing ? calloc(1, sizeof *o) : NULL;
    if (!o) {
        g_st[t_dev].bad_frees++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_VALUE);
    }
    r->freeing = 1;
    g_st[r->device].used -= r->rounded;
    o->kind = OP_FREE;
    o->rec[0] = r;
    enqueue(s, o);
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API int cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, void *stream)
{
    int e = enter();
    if (e)
        return e;
    if (!count)
        return E_SUCCESS;
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    if (s && !stream_live(s)) {
        g_gl.bad_handles++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_RESOURCE_HANDLE);
    }
    int sdev = s ? s->device : t_dev;
    fakecuda_stats *st = &g_st[sdev];
    alloc_rec *rd = NULL, *rs = NULL;
    int err = 0;
    if (!dst || !src)
        err = E_INVALID_VALUE;
    if (!err && kind == K_DEFAULT)
        kind = looks_device(dst) ? (looks_device(src) ? K_D2D : K_H2D)
                                 : (looks_device(src) ? K_D2H : K_H2H);
    if (!err && (kind < K_H2H || kind > K_D2D))
        err = E_INVALID_MEMCPY_DIRECTION;
    if (!err) {
        int dst_dev = kind == K_H2D || kind == K_D2D, src_dev = kind == K_D2H || kind == K_D2D;
        if (dst_dev ? !(rd = rec_find(dst, count)) || rd->freeing : looks_device(dst))
            err = E_INVALID_VALUE;
        if (!err && (src_dev ? !(rs = rec_find(src, count)) || rs->freeing : looks_device(src)))
            err = E_INVALID_VALUE;
    }
    if (err) {
        st->copies_refused++;
        pthread_mutex_unlock(&g_lock);
        return fail(err);
    }
    g_n_copy++;
    int injected = g_fail_copy && g_n_copy == g_fail_copy;
    if (injected) {
        st->copies_failed++;
        if (g_fail_mode == FAKECUDA_FAIL_SYNC) {
            pthread_mutex_unlock(&g_lock);
            return fail(E_UNKNOWN);
        }
    }
    op *o = calloc(1, sizeof *o);
    if (!o) {
        pthread_mutex_unlock(&g_lock);
        return fail(E_MEMORY_ALLOCATION);
    }
    o->kind = OP_COPY;
    o->dir = kind;
    o->n = count;
    o->dst = rd ? rd->host + ((uintptr_t)dst - rd->dev) : dst;
    o->src = rs ? rs->host + ((uintptr_t)src - rs->dev) : src;
    o->rec[0] = rd;
    o->rec[1] = rs;
    o->fail = injected ? (g_fail_mode == FAKECUDA_FAIL_STICKY ? E_ILLEGAL_ADDRESS : E_UNKNOWN) : 0;
    st->copies++;
    if ((kind == K_H2D && !is_pinned(src, count)) || (kind == K_D2H && !is_pinned(dst, count))) {
        st->pageable_copies++;
        if (kind == K_H2D)
            st->pageable_h2d_bytes += count;
    }
    if ((rd && rd->device != sdev) || (rs && rs->device != sdev))
        st->foreign_copies++;
    if (rd)
        rd->queued++;
    if (rs)
        rs->queued++;
    g_queued[sdev]++;
    if (s) {
        enqueue(s, o);
        pthread_mutex_unlock(&g_lock);
        return E_SUCCESS;
    }
    /* the legacy default stream: done before the call returns */
    pthread_mutex_unlock(&g_lock);
    if (!o->fail)
        memcpy(o->dst, o->src, o->n);
    pthread_mutex_lock(&g_lock);
    if (rd)
        rec_unqueue(rd);
    if (rs)
        rec_unqueue(rs);
    g_queued[sdev]--;
    st->copies_done++;
    pthread_cond_broadcast(&g_done);
    pthread_mutex_unlock(&g_lock);
    int f = o->fail;
    free(o);
    return f ? fail(f) : E_SUCCESS;
}

API int cudaStreamCreateWithFlags(void **stream, unsigned flags)
{
    int e = enter();
    if (e)
        return e;
    if (!stream || flags > 1u)
        return fail(E_INVALID_VALUE);
    fstream *s = calloc(1, sizeof *s);
    if (!s)
        return fail(E_MEMORY_ALLOCATION);
    s->device = t_dev;
    pthread_cond_init(&s->work, NULL);
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_streams, &g_capstreams, g_nstreams + 1, sizeof *g_streams) ||
        pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        pthread_mutex_unlock(&g_lock);
        pthread_cond_destroy(&s->work);
        free(s);
        return fail(E_MEMORY_ALLOCATION);
    }
    g_streams[g_nstreams++] = s;
    g_gl.live_streams++;
    pthread_mutex_unlock(&g_lock);
    *stream = s;
    return E_SUCCESS;
}

API int cudaStreamDestroy(void *stream)
{
    pthread_once(&g_once, init);
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_nstreams && g_streams[i] != s)
        i++;
    if (!s || i == g_nstreams) {
        g_gl.bad_handles++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_RESOURCE_HANDLE);
    }
    g_streams[i] = g_streams[--g_nstreams];
    g_gl.live_streams--;
    s->stop = 1; /* queued work still completes, as with the real call */
    pthread_cond_signal(&s->work);
    int sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->work);
    free(s);
    return sticky ? fail(sticky) : E_SUCCESS;
}

API int cudaStreamSynchronize(void *stream)
{
    pthread_once(&g_once, init);
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    int err = 0;
    if (!s) {
        device_idle(t_dev);
    } else if (!stream_live(s)) {
        g_gl.bad_handles++;
        err = E_INVALID_RESOURCE_HANDLE;
    } else {
        while (s->head || s->busy)
            pthread_cond_wait(&g_done, &g_lock);
        err = s->sync_err;
        s->sync_err = 0;
    }
    if (g_sticky)
        err = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return err ? fail(err) : E_SUCCESS;
}

API int cudaEventCreateWithFlags(void **event, unsigned flags)
{
    int e = enter();
    if (e)
        return e;
    if (!event || flags > 0xFu)
        return fail(E_INVALID_VALUE);
    fevent *ev = calloc(1, sizeof *ev);
    if (!ev)
        return fail(E_MEMORY_ALLOCATION);
    ev->device = t_dev;
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_events, &g_capevents, g_nevents + 1, sizeof *g_events)) {
        pthread_mutex_unlock(&g_lock);
        free(ev);
        return fail(E_MEMORY_ALLOCATION);
    }
    g_events[g_nevents++] = ev;
    g_gl.live_events++;
    pthread_mutex_unlock(&g_lock);
    *event = ev;
    return E_SUCCESS;
}

API int cudaEventRecord(void *event, void *stream)
{
    int e = enter();
    if (e)
        return e;
    fevent *ev = event;
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    int err = 0;
    if (!ev || !event_live(ev) || (s && !stream_live(s))) {
        g_gl.bad_handles++;
        err = E_INVALID_RESOURCE_HANDLE;
    } else if (s && s->device != ev->device) {
        err = E_INVALID_RESOURCE_HANDLE; /* event and stream on different devices */
    } else if (g_fail_record && ++g_n_record == g_fail_record) {
        err = E_UNKNOWN;
    }
    op *o = err || !s ? NULL : calloc(1, sizeof *o);
    if (!err && s && !o)
        err = E_MEMORY_ALLOCATION;
    if (err) {
        pthread_mutex_unlock(&g_lock);
        return fail(err);
    }
    ev->recorded++;
    if (!s) {
        ev->done = ev->recorded; /* nothing queued on the default stream here */
        ev->err = 0;
    } else {
        o->kind = OP_RECORD;
        o->ev = ev;
        o->seq = ev->recorded;
        ev->refs++;
        enqueue(s, o);
    }
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API int cudaStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    int e = enter();
    if (e)
        return e;
    fevent *ev = event;
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    int err = 0;
    if (!ev || !event_live(ev) || (s && !stream_live(s))) {
        g_gl.bad_handles++;
        err = E_INVALID_RESOURCE_HANDLE;
    } else if (flags) {
        err = E_INVALID_VALUE;
    }
    /* waits for the event's latest record; none yet, or already done: nothing to wait for */
    int needed = !err && ev->recorded > ev->done;
    op *o = needed ? calloc(1, sizeof *o) : NULL;
    if (needed && !o)
        err = E_MEMORY_ALLOCATION;
    if (err) {
        pthread_mutex_unlock(&g_lock);
        return fail(err);
    }
    if (o) {
        if (!s) {
            /* the legacy default stream: the host waits here (nothing else is queued on it) */
            while (ev->done < ev->recorded)
                pthread_cond_wait(&g_done, &g_lock);
            free(o);
        } else {
            o->kind = OP_WAIT;
            o->ev = ev;
            o->seq = ev->recorded;
            ev->refs++;
            enqueue(s, o);
        }
    }
    g_gl.stream_waits++;
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API int cudaEventQuery(void *event)
{
    int e = enter();
    if (e)
        return e;
    fevent *ev = event;
    pthread_mutex_lock(&g_lock);
    int err;
    if (!ev || !event_live(ev)) {
        g_gl.bad_handles++;
        err = fail(E_INVALID_RESOURCE_HANDLE);
    } else if (ev->done < ev->recorded) {
        err = E_NOT_READY; /* not an error: the last error is left alone */
    } else {
        err = ev->err ? fail(ev->err) : E_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return err;
}

API int cudaEventSynchronize(void *event)
{
    pthread_once(&g_once, init);
    fevent *ev = event;
    pthread_mutex_lock(&g_lock);
    int err = 0;
    if (!ev || !event_live(ev)) {
        g_gl.bad_handles++;
        err = E_INVALID_RESOURCE_HANDLE;
    } else {
        while (ev->done < ev->recorded)
            pthread_cond_wait(&g_done, &g_lock);
        err = ev->err;
    }
    if (g_sticky)
        err = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return err ? fail(err) : E_SUCCESS;
}

API int cudaEventDestroy(void *event)
{
    pthread_once(&g_once, init);
    fevent *ev = event;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_nevents && g_events[i] != ev)
        i++;
    if (!ev || i == g_nevents) {
        g_gl.bad_handles++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_RESOURCE_HANDLE);
    }
    g_events[i] = g_events[--g_nevents];
    g_gl.live_events--;
    ev->destroyed = 1; /* a queued record still completes; the last one frees it */
    if (!ev->refs)
        free(ev);
    int sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return sticky ? fail(sticky) : E_SUCCESS;
}

API int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    int e = enter();
    if (e)
        return e;
    if (!free_bytes || !total_bytes)
        return fail(E_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    *total_bytes = (size_t)g_mem;
    *free_bytes = (size_t)(g_mem - g_st[t_dev].used);
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API int cudaHostAlloc(void **ptr, size_t size, unsigned flags)
{
    int e = enter();
    if (e)
        return e;
    if (!ptr || flags > 0xFu)
        return fail(E_INVALID_VALUE);
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    pthread_mutex_lock(&g_lock);
    g_n_host++;
    int refuse = g_fail_host && g_n_host == g_fail_host;
    pthread_mutex_unlock(&g_lock);
    void *p = NULL;
    if (refuse || posix_memalign(&p, page, size ? size : 1)) {
        pthread_mutex_lock(&g_lock);
        g_gl.malloc_failures++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_MEMORY_ALLOCATION);
    }
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_pinned, &g_cappinned, g_npinned + 1, sizeof *g_pinned)) {
        pthread_mutex_unlock(&g_lock);
        free(p);
        return fail(E_MEMORY_ALLOCATION);
    }
    g_pinned[g_npinned++] = (pinned_rec){p, size ? size : 1};
    g_gl.host_allocs++;
    g_gl.live_host_allocs++;
    g_gl.live_host_bytes += size;
    pthread_mutex_unlock(&g_lock);
    *ptr = p;
    return E_SUCCESS;
}

API int cudaFreeHost(void *ptr)
{
    pthread_once(&g_once, init);
    if (!ptr)
        return E_SUCCESS;
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_npinned && g_pinned[i].p != ptr)
        i++;
    if (i == g_npinned) {
        g_gl.bad_host_frees++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_INVALID_VALUE);
    }
    g_gl.live_host_bytes -= g_pinned[i].size;
    g_pinned[i] = g_pinned[--g_npinned];
    g_gl.host_frees++;
    g_gl.live_host_allocs--;
    int sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    free(ptr);
    return sticky ? fail(sticky) : E_SUCCESS;
}

API int cudaHostRegister(void *ptr, size_t size, unsigned flags)
{
    int e = enter();
    if (e)
        return e;
    if (!ptr || !size || flags > 0xFu)
        return fail(E_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    g_n_register++;
    int refuse = g_register_refused ? E_NOT_SUPPORTED
                 : g_fail_register && g_n_register == g_fail_register ? E_MEMORY_ALLOCATION : 0;
    uintptr_t a = (uintptr_t)ptr;
    for (size_t i = 0; i < g_nreg && !refuse; i++) {
        uintptr_t b = (uintptr_t)g_reg[i].p;
        if (a < b + g_reg[i].size && b < a + size)
            refuse = E_HOST_MEMORY_ALREADY_REGISTERED;
    }
    for (size_t i = 0; i < g_npinned && !refuse; i++) {
        uintptr_t b = (uintptr_t)g_pinned[i].p;
        if (a < b + g_pinned[i].size && b < a + size)
            refuse = E_HOST_MEMORY_ALREADY_REGISTERED;
    }
    if (!refuse && grow((void **)&g_reg, &g_capreg, g_nreg + 1, sizeof *g_reg))
        refuse = E_MEMORY_ALLOCATION;
    if (refuse) {
        g_gl.register_refusals++;
        pthread_mutex_unlock(&g_lock);
        return fail(refuse);
    }
    /* the runtime faults every page in and locks it: read each, as it would */
    volatile const unsigned char *q = ptr;
    for (size_t off = 0; off < size; off += 4096)
        (void)q[off];
    (void)q[size - 1];
    g_reg[g_nreg++] = (pinned_rec){ptr, size};
    g_gl.host_registers++;
    g_gl.live_registered++;
    g_gl.live_registered_bytes += size;
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API int cudaHostUnregister(void *ptr)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    size_t i = 0;
    while (i < g_nreg && g_reg[i].p != ptr)
        i++;
    if (i == g_nreg) {
        g_gl.bad_unregisters++;
        pthread_mutex_unlock(&g_lock);
        return fail(E_HOST_MEMORY_NOT_REGISTERED);
    }
    g_gl.live_registered--;
    g_gl.live_registered_bytes -= g_reg[i].size;
    g_reg[i] = g_reg[--g_nreg];
    int sticky = g_sticky;
    pthread_mutex_unlock(&g_lock);
    return sticky ? fail(sticky) : E_SUCCESS;
}

API void fakecuda_set_register(int refuse_all, uint64_t fail_nth)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    g_register_refused = refuse_all;
    g_fail_register = fail_nth;
    g_n_register = 0;
    pthread_mutex_unlock(&g_lock);
}

API const char *cudaGetErrorString(int error)
{
    switch (error) {
    case E_SUCCESS: return "no error";
    case E_INVALID_VALUE: return "invalid argument";
    case E_MEMORY_ALLOCATION: return "out of memory";
    case E_INVALID_MEMCPY_DIRECTION: return "invalid copy direction for memcpy";
    case E_NO_DEVICE: return "no CUDA-capable device is detected";
    case E_INVALID_DEVICE: return "invalid device ordinal";
    case E_INVALID_RESOURCE_HANDLE: return "invalid resource handle";
    case E_HOST_MEMORY_ALREADY_REGISTERED:
        return "part or all of the requested memory range is already mapped";
    case E_HOST_MEMORY_NOT_REGISTERED: return "pointer does not correspond to a registered memory region";
    case E_NOT_SUPPORTED: return "operation not supported";
    case E_NOT_READY: return "device not ready";
    case E_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case E_UNKNOWN: return "unknown error";
    default: return "unrecognized error code";
    }
}

API int cudaGetLastError(void)
{
    int sticky = __atomic_load_n(&g_sticky, __ATOMIC_ACQUIRE);
    if (sticky)
        return sticky; /* a lost context is never cleared */
    int e = t_err;
    t_err = 0;
    return e;
}

/* ---- test hooks (fake_cudart.h) -------------------------------------------------------------- */

static void add_stats(fakecuda_stats *a, const fakecuda_stats *b)
{
    const uint64_t *src = (const uint64_t *)b;
    uint64_t *dst = (uint64_t *)a;
    for (size_t i = 0; i < sizeof *a / sizeof(uint64_t); i++)
        dst[i] += src[i];
}

API int fakecuda_get_stats(int dev, fakecuda_stats *out)
{
    pthread_once(&g_once, init);
    if (!out || dev < -1 || dev >= g_ndev)
        return -1;
    pthread_mutex_lock(&g_lock);
    if (dev >= 0) {
        *out = g_st[dev];
    } else {
        memset(out, 0, sizeof *out);
        for (int d = 0; d < g_ndev; d++)
            add_stats(out, &g_st[d]);
        add_stats(out, &g_gl);
        uint64_t peak = 0;
        for (int d = 0; d < g_ndev; d++)
            peak = g_st[d].peak_used > peak ? g_st[d].peak_used : peak;
        out->peak_used = peak; /* the highest of one device */
    }
    pthread_mutex_unlock(&g_lock);
    return 0;
}

API void fakecuda_set_faults(uint64_t malloc_nth, uint64_t copy_nth, int mode, uint64_t host_nth)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    g_fail_malloc = malloc_nth;
    g_fail_copy = copy_nth;
    g_fail_mode = mode;
    g_fail_host = host_nth;
    g_n_malloc = g_n_copy = g_n_host = 0;
    pthread_mutex_unlock(&g_lock);
}

API int fakecuda_launch(void *stream, const void *dev, size_t n, unsigned delay_us,
                        fakecuda_kernel_fn fn, void *ud)
{
    int e = enter();
    if (e)
        return e;
    fstream *s = stream;
    pthread_mutex_lock(&g_lock);
    alloc_rec *r = s && stream_live(s) && fn ? rec_find(dev, n) : NULL;
    op *o = r ? calloc(1, sizeof *o) : NULL;
    if (!o) {
        pthread_mutex_unlock(&g_lock);
        return fail(r ? E_MEMORY_ALLOCATION : E_INVALID_VALUE);
    }
    o->kind = OP_KERNEL;
    o->src = r->host + ((uintptr_t)dev - r->dev);
    o->n = n;
    o->rec[1] = r;
    o->delay_us = delay_us;
    o->fn = fn;
    o->ud = ud;
    r->queued++;
    g_gl.kernels++;
    enqueue(s, o);
    pthread_mutex_unlock(&g_lock);
    return E_SUCCESS;
}

API void fakecuda_set_record_fault(uint64_t record_nth)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    g_fail_record = record_nth;
    g_n_record = 0;
    pthread_mutex_unlock(&g_lock);
}

API void fakecuda_reset_peak(void)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    for (int d = 0; d < MAX_DEVICES; d++)
        g_st[d].peak_used = g_st[d].used;
    pthread_mutex_unlock(&g_lock);
}

API void fakecuda_set_delay_us(unsigned us)
{
    pthread_once(&g_once, init);
    __atomic_store_n(&g_delay_us, us, __ATOMIC_RELAXED);
}

API void fakecuda_clear_sticky(void)
{
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    device_idle(t_dev);
    __atomic_store_n(&g_sticky, 0, __ATOMIC_RELEASE);
    for (size_t i = 0; i < g_nstreams; i++)
        g_streams[i]->pending_err = g_streams[i]->sync_err = 0;
    pthread_mutex_unlock(&g_lock);
}

/* FAKE_CUDA_REPORT=1: what the process leaves behind, one line at exit. */
__attribute__((destructor)) static void report_at_exit(void)
{
    if (!g_report)
        return;
    fakecuda_stats t;
    if (fakecuda_get_stats(-1, &t))
        return;
    fprintf(stderr,
            "fake_cudart: exit: live_allocs=%llu live_host_allocs=%llu live_streams=%llu "
            "live_events=%llu mallocs=%llu copies=%llu copies_done=%llu copies_refused=%llu "
            "copies_failed=%llu pageable_copies=%llu foreign_copies=%llu free_while_queued=%llu "
            "bad_frees=%llu bad_host_frees=%llu bad_handles=%llu peak_used=%llu "
            "host_registers=%llu live_registered=%llu bad_unregisters=%llu\n",
            (unsigned long long)t.live_allocs, (unsigned long long)t.live_host_allocs,
            (unsigned long long)t.live_streams, (unsigned long long)t.live_events,
            (unsigned long long)t.mallocs, (unsigned long long)t.copies,
            (unsigned long long)t.copies_done, (unsigned long long)t.copies_refused,
            (unsigned long long)t.copies_failed, (unsigned long long)t.pageable_copies,
            (unsigned long long)t.foreign_copies, (unsigned long long)t.free_while_queued,
            (unsigned long long)t.bad_frees, (unsigned long long)t.bad_host_frees,
            (unsigned long long)t.bad_handles, (unsigned long long)t.peak_used,
            (unsigned long long)t.host_registers, (unsigned long long)t.live_registered,
            (unsigned long long)t.bad_unregisters);
}
