/*
 * cuda.c — the "cuda:N" device: the CUDA runtime (libcudart) loaded with dlopen at run time, so
 * that one ferry binary runs with or without CUDA and needs no CUDA headers or libraries to build.
 * Without the library or a GPU, opening fails with FERRY_EDEVICE and says which is missing.
 *
 * Each device has one non-blocking copy stream. A copy is cudaMemcpyAsync on that stream followed
 * by an event recorded after it; its ticket maps to that event, and wait synchronizes the event.
 * The event ops hand work over between that stream and the engine's streams: a record on the copy
 * stream (NULL) that the engine's stream waits on (cudaStreamWaitEvent), and the engine's records
 * that ferry queries before it reuses memory the engine's kernels read.
 * Events come from a per-device pool. Copies are issued one at a time (the submit lock), so tickets
 * grow in stream order. Device memory comes from a memory pool of the device's own, allocated and
 * freed in the copy stream's order (cudaMallocFromPoolAsync, cudaFreeAsync; CUDA 11.2): cudaFree
 * waits until the whole device is idle, and a stream whose budget keeps memory changing hands
 * would drain the copy engine at every free. The pool keeps no memory freed beyond the next
 * synchronization (its release threshold is 0), so what ferry holds on the device is what its
 * budget counts. Without the pool functions, or where the pool cannot be made, cudaMalloc and
 * cudaFree. The runtime's "current device" is per thread: every operation sets it first.
 * Pinned staging memory is portable and cached across devices (see "pinned host memory").
 * Tested without a GPU against tests/fake_cudart.c (test_cuda_fake), which models the runtime's
 * asynchrony and its device addresses that the host cannot read.
 *
 * The few declarations below restate the runtime's documented C ABI (cudaError_t is an int enum,
 * streams and events are opaque pointers).
 */
#include "devices/devices.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cuda_err;               /* cudaError_t; 0 is cudaSuccess */
#define CUDA_ERR_INVALID_VALUE 1     /* cudaErrorInvalidValue */
#define CUDA_ERR_MEMORY_ALLOCATION 2 /* cudaErrorMemoryAllocation */
#define CUDA_ERR_MEMCPY_DIRECTION 21 /* cudaErrorInvalidMemcpyDirection */
#define CUDA_MEMCPY_H2D 1            /* cudaMemcpyHostToDevice */
#define CUDA_MEMCPY_D2H 2            /* cudaMemcpyDeviceToHost */
#define CUDA_STREAM_NON_BLOCKING 1u  /* cudaStreamNonBlocking */
#define CUDA_EVENT_DISABLE_TIMING 2u /* cudaEventDisableTiming */
#define CUDA_HOST_ALLOC_PORTABLE 1u  /* cudaHostAllocPortable */
#define CUDA_HOST_REGISTER_PORTABLE 1u  /* cudaHostRegisterPortable */
#define CUDA_HOST_REGISTER_READ_ONLY 8u /* cudaHostRegisterReadOnly (CUDA 11.1) */
#define CUDA_ALIGN 256               /* cudaMalloc returns at least 256-byte aligned memory */
#define CUDA_MEM_ALLOCATION_PINNED 1 /* cudaMemAllocationTypePinned */
#define CUDA_MEM_LOCATION_DEVICE 1   /* cudaMemLocationTypeDevice */

/* cudaMemPoolProps: the fields ferry sets, then what the runtime reserves (zero); the same 88
 * bytes from CUDA 11.2 (reserved[64]) to 13 (maxSize, usage, reserved[54]). */
typedef struct cuda_pool_props {
    int alloc_type;
    int handle_types;
    struct {
        int type;
        int id;
    } location;
    void *win32_security_attributes;
    unsigned char reserved[64];
} cuda_pool_props;

typedef struct cudart {
    cuda_err (*GetDeviceCount)(int *);
    cuda_err (*SetDevice)(int);
    cuda_err (*Malloc)(void **, size_t);
    cuda_err (*Free)(void *);
    cuda_err (*MemcpyAsync)(void *, const void *, size_t, int, void *);
    cuda_err (*StreamCreateWithFlags)(void **, unsigned);
    cuda_err (*StreamDestroy)(void *);
    cuda_err (*StreamSynchronize)(void *);
    cuda_err (*EventCreateWithFlags)(void **, unsigned);
    cuda_err (*EventRecord)(void *, void *);
    cuda_err (*EventSynchronize)(void *);
    cuda_err (*EventQuery)(void *);
    cuda_err (*StreamWaitEvent)(void *, void *, unsigned); /* optional: NULL waits on the host */
    cuda_err (*EventDestroy)(void *);
    cuda_err (*MemGetInfo)(size_t *, size_t *);
    cuda_err (*HostAlloc)(void **, size_t, unsigned);
    cuda_err (*FreeHost)(void *);
    cuda_err (*HostRegister)(void *, size_t, unsigned);   /* optional, with HostUnregister */
    cuda_err (*HostUnregister)(void *);
    const char *(*GetErrorString)(cuda_err);
    cuda_err (*GetLastError)(void);
    /* optional, all four or none: the stream-ordered allocator */
    cuda_err (*MemPoolCreate)(void **, const cuda_pool_props *);
    cuda_err (*MemPoolDestroy)(void *);
    cuda_err (*MallocFromPoolAsync)(void **, size_t, void *, void *);
    cuda_err (*FreeAsync)(void *, void *);
} cudart;

/* Loaded once per process and never unloaded (the runtime does not survive dlclose well). */
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
static cudart rt;
static int rt_ok;
static char rt_why[200];

static const char *const lib_names[] = {"libcudart.so",    "libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so.11.0", "libcudart.so.11"};

static int load_sym(void *lib, const char *path, const char *name, void *fp, size_t size)
{
    if (ferry__dlsym_fn(lib, name, fp, size)) {
        snprintf(rt_why, sizeof rt_why, "%s lacks %s", path, name);
        return -1;
    }
    return 0;
}

static void rt_load(void)
{
    void *lib = NULL;
    const char *path = "libcudart";
    const char *env = getenv("FERRY_CUDART");
    if (env && *env) {
        /* Asked for by path: that library or none (a typo must not pick another runtime). */
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *why = dlerror();
            snprintf(rt_why, sizeof rt_why, "FERRY_CUDART=%s cannot be loaded (%s)", env,
                     why ? why : "dlopen failed");
            return;
        }
        path = env;
    }
    if (!lib)
        lib = ferry__dlopen_first(lib_names, FERRY__ARRAY_LEN(lib_names), NULL);
    if (!lib) {
        snprintf(rt_why, sizeof rt_why,
                 "libcudart.so not found (tried libcudart.so, .so.13, .so.12, .so.11; set "
                 "FERRY_CUDART to its path)");
        return;
    }
#define LOAD(f) \
    if (load_sym(lib, path, "cuda" #f, &rt.f, sizeof rt.f)) \
        return;
    LOAD(GetDeviceCount)
    LOAD(SetDevice)
    LOAD(Malloc)
    LOAD(Free)
    LOAD(MemcpyAsync)
    LOAD(StreamCreateWithFlags)
    LOAD(StreamDestroy)
    LOAD(StreamSynchronize)
    LOAD(EventCreateWithFlags)
    LOAD(EventRecord)
    LOAD(EventSynchronize)
    LOAD(EventQuery)
    LOAD(EventDestroy)
    LOAD(MemGetInfo)
    LOAD(HostAlloc)
    LOAD(FreeHost)
    LOAD(GetErrorString)
    LOAD(GetLastError)
#undef LOAD
    ferry__dlsym_fn(lib, "cudaStreamWaitEvent", &rt.StreamWaitEvent, sizeof rt.StreamWaitEvent);
    if (ferry__dlsym_fn(lib, "cudaHostRegister", &rt.HostRegister, sizeof rt.HostRegister) ||
        ferry__dlsym_fn(lib, "cudaHostUnregister", &rt.HostUnregister, sizeof rt.HostUnregister))
        rt.HostRegister = NULL, rt.HostUnregister = NULL;
    if (ferry__dlsym_fn(lib, "cudaMemPoolCreate", &rt.MemPoolCreate, sizeof rt.MemPoolCreate) ||
        ferry__dlsym_fn(lib, "cudaMemPoolDestroy", &rt.MemPoolDestroy, sizeof rt.MemPoolDestroy) ||
        ferry__dlsym_fn(lib, "cudaMallocFromPoolAsync", &rt.MallocFromPoolAsync,
                        sizeof rt.MallocFromPoolAsync) ||
        ferry__dlsym_fn(lib, "cudaFreeAsync", &rt.FreeAsync, sizeof rt.FreeAsync))
        rt.MemPoolCreate = NULL;
    rt_ok = 1;
}

static const char *cuda_str(cuda_err e)
{
    const char *s = rt.GetErrorString ? rt.GetErrorString(e) : NULL;
    return s ? s : "unknown CUDA error";
}

typedef struct cuda_pending {
    uint64_t ticket;
    void *event;
} cuda_pending;

typedef struct cuda_device {
    ferry__devbase base; /* first: a cuda_device * is a ferry_device * */
    int ordinal;
    void *stream;
    void *pool; /* the device memory pool (stream-ordered), or NULL: cudaMalloc and cudaFree */
    /* Held while a copy and its event are put on the stream, so that tickets follow the stream's
     * order. Not held by wait: cudaMemcpyAsync from pageable memory returns only once the
     * runtime has staged the bytes, and a wait must not queue behind that. Order: submit, lock. */
    pthread_mutex_t submit;
    pthread_mutex_t lock;
    /* --- guarded by lock --- */
    uint64_t last_ticket;
    cuda_pending *pending; /* copies issued and not yet waited on */
    size_t npending, cap_pending;
    void **events; /* idle events, ready to record */
    size_t nevents, cap_events;
} cuda_device;

static void pin_track_open(int delta);

static cuda_err set_dev(cuda_device *c)
{
    return rt.SetDevice(c->ordinal);
}

static void cuda_destroy(ferry_device *d)
{
    cuda_device *c = (cuda_device *)d;
    set_dev(c);
    rt.StreamSynchronize(c->stream);
    for (size_t i = 0; i < c->npending; i++)
        rt.EventDestroy(c->pending[i].event);
    for (size_t i = 0; i < c->nevents; i++)
        rt.EventDestroy(c->events[i]);
    if (c->pool)
        rt.MemPoolDestroy(c->pool); /* after the stream's frees: nothing of it is left */
    rt.StreamDestroy(c->stream);
    free(c->pending);
    free(c->events);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->submit);
    free(c);
    pin_track_open(-1);
}

static int cuda_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    cuda_device *c = (cuda_device *)d;
    *ptr = NULL;
    if (size > FERRY__DP(d).max_alloc)
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: allocation of %" PRIu64 " bytes exceeds max_alloc %" PRIu64,
                                  FERRY__DP(d).name, size, FERRY__DP(d).max_alloc);
    cuda_err e = set_dev(c);
    void *p = NULL;
    /* In the copy stream's order: the copies that fill it are queued after it on that stream,
     * and the engine's streams see it through the events that hand those copies over. */
    if (!e && c->pool)
        e = rt.MallocFromPoolAsync(&p, (size_t)(size ? size : 1), c->pool, c->stream);
    else if (!e)
        e = rt.Malloc(&p, (size_t)(size ? size : 1));
    if (e) {
        rt.GetLastError(); /* clear it, so later calls do not report it */
        char a[32];
        return ferry__device_fail(d, e == CUDA_ERR_MEMORY_ALLOCATION ? FERRY_ENOMEM : FERRY_EDEVICE,
                                  "%s: %s of %s failed: %s", FERRY__DP(d).name,
                                  c->pool ? "cudaMallocFromPoolAsync" : "cudaMalloc",
                                  ferry__fmt_size(size, a), cuda_str(e));
    }
    *ptr = p;
    return 0;
}

static void cuda_free(ferry_device *d, void *ptr)
{
    cuda_device *c = (cuda_device *)d;
    if (!ptr)
        return;
    cuda_err e = set_dev(c);
    /* After the copies queued before it; the engine is done with it (a release, or a fence whose
     * event completed), so no other stream still reads it. */
    if (!e)
        e = c->pool ? rt.FreeAsync(ptr, c->stream) : rt.Free(ptr);
    if (e) {
        rt.GetLastError();
        ferry__device_fail(d, FERRY_EDEVICE, "%s: %s(%p) failed: %s", FERRY__DP(d).name,
                           c->pool ? "cudaFreeAsync" : "cudaFree", ptr, cuda_str(e));
    }
}

static int cuda_copy(ferry_device *d, int kind, void *dst, const void *src, uint64_t n,
                     uint64_t *ticket)
{
    cuda_device *c = (cuda_device *)d;
    const char *what = kind == CUDA_MEMCPY_H2D ? "copy_h2d" : "copy_d2h";
    if (n && (!dst || !src))
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes with a NULL pointer",
                                  FERRY__DP(d).name, what, n);
    cuda_err e = set_dev(c);
    if (e)
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: cudaSetDevice: %s", FERRY__DP(d).name, cuda_str(e));

    pthread_mutex_lock(&c->submit);
    pthread_mutex_lock(&c->lock);
    /* Room first: after the copy is issued nothing may fail. Only copies (under submit) add
     * pending entries, so the room stays until this one is added. */
    if (c->npending == c->cap_pending) {
        size_t cap = c->cap_pending ? c->cap_pending * 2 : 32;
        cuda_pending *np = realloc(c->pending, cap * sizeof *np);
        if (!np) {
            pthread_mutex_unlock(&c->lock);
            pthread_mutex_unlock(&c->submit);
            return ferry__device_fail(d, FERRY_ENOMEM, "%s: %s: out of memory", FERRY__DP(d).name, what);
        }
        c->pending = np;
        c->cap_pending = cap;
    }
    void *ev = NULL;
    if (c->nevents)
        ev = c->events[--c->nevents];
    pthread_mutex_unlock(&c->lock);
    if (!ev)
        e = rt.EventCreateWithFlags(&ev, CUDA_EVENT_DISABLE_TIMING);
    const char *call = "cudaEventCreateWithFlags";
    int queued = 0;
    if (!e) {
        call = "cudaMemcpyAsync";
        e = rt.MemcpyAsync(dst, src, (size_t)n, kind, c->stream);
        queued = !e;
    }
    if (!e) {
        call = "cudaEventRecord";
        e = rt.EventRecord(ev, c->stream);
    }
    if (e) {
        rt.GetLastError();
        if (queued) {
            /* The copy is on the stream with no event behind it: let it finish, so that a call
             * that fails leaves nothing in flight on the caller's memory. */
            rt.StreamSynchronize(c->stream);
            rt.GetLastError();
        }
        pthread_mutex_lock(&c->lock);
        if (ev && !queued && c->nevents < c->cap_events)
            c->events[c->nevents++] = ev; /* never recorded: still good */
        else if (ev)
            rt.EventDestroy(ev);
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_unlock(&c->submit);
        /* The runtime refuses pointers outside its allocations (or the wrong way round) with
         * cudaErrorInvalidValue: a caller's mistake, as on the other devices. */
        int code = queued || (e != CUDA_ERR_INVALID_VALUE && e != CUDA_ERR_MEMCPY_DIRECTION)
                       ? FERRY_EDEVICE : FERRY_EINVAL;
        return ferry__device_fail(d, code, "%s: %s of %" PRIu64 " bytes: %s failed: %s",
                                  FERRY__DP(d).name, what, n, call, cuda_str(e));
    }
    pthread_mutex_lock(&c->lock);
    uint64_t t = ++c->last_ticket;
    c->pending[c->npending++] = (cuda_pending){t, ev};
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->submit);
    *ticket = t;
    return 0;
}

static int cuda_copy_h2d(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return cuda_copy(d, CUDA_MEMCPY_H2D, dst, src, n, ticket);
}

static int cuda_copy_d2h(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return cuda_copy(d, CUDA_MEMCPY_D2H, dst, src, n, ticket);
}

static int cuda_wait(ferry_device *d, uint64_t ticket)
{
    cuda_device *c = (cuda_device *)d;
    pthread_mutex_lock(&c->lock);
    void *ev = NULL;
    for (size_t i = 0; i < c->npending; i++) {
        if (c->pending[i].ticket == ticket) {
            ev = c->pending[i].event;
            c->pending[i] = c->pending[--c->npending];
            break;
        }
    }
    uint64_t last = c->last_ticket;
    pthread_mutex_unlock(&c->lock);
    if (!ev)
        return ferry__device_fail(d, FERRY_EINVAL,
                                  "%s: wait on ticket %" PRIu64 ", which is not in flight "
                                  "(never issued or already waited on; last %" PRIu64 ")",
                                  FERRY__DP(d).name, ticket, last);
    cuda_err e = set_dev(c);
    if (!e)
        e = rt.EventSynchronize(ev);
    pthread_mutex_lock(&c->lock);
    int pooled = 0;
    if (!e && c->nevents < c->cap_events) {
        c->events[c->nevents++] = ev;
        pooled = 1;
    } else if (!e) {
        size_t cap = c->cap_events ? c->cap_events * 2 : 32;
        void **ne = realloc(c->events, cap * sizeof *ne);
        if (ne) {
            c->events = ne;
            c->cap_events = cap;
            c->events[c->nevents++] = ev;
            pooled = 1;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (!pooled)
        rt.EventDestroy(ev);
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: copy ticket %" PRIu64 " failed: %s",
                                  FERRY__DP(d).name, ticket, cuda_str(e));
    }
    return 0;
}

static int cuda_synchronize(ferry_device *d)
{
    cuda_device *c = (cuda_device *)d;
    cuda_err e = set_dev(c);
    if (!e)
        e = rt.StreamSynchronize(c->stream);
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: cudaStreamSynchronize failed: %s",
                                  FERRY__DP(d).name, cuda_str(e));
    }
    return 0;
}

static int cuda_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    cuda_device *c = (cuda_device *)d;
    size_t fr = 0, tot = 0;
    cuda_err e = set_dev(c);
    if (!e)
        e = rt.MemGetInfo(&fr, &tot);
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: cudaMemGetInfo failed: %s", FERRY__DP(d).name,
                                  cuda_str(e));
    }
    if (free_bytes)
        *free_bytes = fr;
    if (total_bytes)
        *total_bytes = tot;
    return 0;
}

/* ---- pinned host memory ------------------------------------------------------------------------
 * Allocated portable, so any CUDA device may copy from it. cudaHostAlloc and cudaFreeHost cost
 * milliseconds for buffers of the size staging uses (pinning pages; cudaFreeHost synchronizes), and
 * a loader that feeds several devices in turn (split placement) gives its staging buffers back and
 * asks again at each switch: freed buffers go to a small process-wide cache, handed to the next
 * host_alloc of any cuda device that they fit, and released when the last cuda device closes. */

#define PIN_CACHE_MAX 16
#define PIN_CACHE_BYTES (UINT64_C(256) << 20)

typedef struct pin_buf {
    void *p;
    uint64_t size;
} pin_buf;

static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;
/* --- guarded by pin_lock --- */
static pin_buf *pin_live; /* every pinned buffer handed out, with its size */
static size_t pin_nlive, pin_caplive;
static pin_buf pin_cache[PIN_CACHE_MAX]; /* freed, kept for reuse */
static size_t pin_ncache;
static uint64_t pin_cache_bytes;
static int cuda_open_count; /* cuda devices open; the cache is emptied when it drops to 0 */

/* A cached buffer of SIZE serves a request of NEED when it is at most 1/8 (+8 KiB) larger. */
static int pin_fits(uint64_t size, uint64_t need)
{
    return size >= need && size - need <= need / 8 + 8192;
}

static int cuda_host_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    cuda_device *c = (cuda_device *)d;
    *ptr = NULL;
    if (size > SIZE_MAX)
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: pinned allocation of %" PRIu64
                                  " bytes is too large", FERRY__DP(d).name, size);
    uint64_t need = size ? size : 1;
    pthread_mutex_lock(&pin_lock);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < pin_ncache; i++)
        if (pin_fits(pin_cache[i].size, need) &&
            (best == SIZE_MAX || pin_cache[i].size < pin_cache[best].size))
            best = i;
    int room = pin_nlive < pin_caplive;
    if (!room) {
        size_t cap = pin_caplive ? pin_caplive * 2 : 32;
        pin_buf *nl = realloc(pin_live, cap * sizeof *nl);
        if (nl) {
            pin_live = nl;
            pin_caplive = cap;
            room = 1;
        }
    }
    if (!room) {
        pthread_mutex_unlock(&pin_lock);
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: pinned allocation: out of memory",
                                  FERRY__DP(d).name);
    }
    if (best != SIZE_MAX) {
        pin_buf b = pin_cache[best];
        pin_cache[best] = pin_cache[--pin_ncache];
        pin_cache_bytes -= b.size;
        pin_live[pin_nlive++] = b;
        pthread_mutex_unlock(&pin_lock);
        *ptr = b.p;
        return 0;
    }
    pthread_mutex_unlock(&pin_lock);
    cuda_err e = set_dev(c);
    void *p = NULL;
    if (!e)
        e = rt.HostAlloc(&p, (size_t)need, CUDA_HOST_ALLOC_PORTABLE);
    if (e) {
        rt.GetLastError();
        char a[32];
        /* a lost context (a sticky error from any earlier call) is the device's failure, not a
         * lack of memory */
        return ferry__device_fail(d, e == CUDA_ERR_MEMORY_ALLOCATION ? FERRY_ENOMEM : FERRY_EDEVICE,
                                  "%s: cudaHostAlloc of %s failed: %s", FERRY__DP(d).name,
                                  ferry__fmt_size(size, a), cuda_str(e));
    }
    pthread_mutex_lock(&pin_lock);
    room = pin_nlive < pin_caplive; /* another thread may have filled the room found above */
    if (room)
        pin_live[pin_nlive++] = (pin_buf){p, need};
    pthread_mutex_unlock(&pin_lock);
    if (!room) {
        if (rt.FreeHost(p))
            rt.GetLastError();
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: pinned allocation: out of memory",
                                  FERRY__DP(d).name);
    }
    *ptr = p;
    return 0;
}

static void cuda_host_free(ferry_device *d, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&pin_lock);
    size_t i = 0;
    while (i < pin_nlive && pin_live[i].p != ptr)
        i++;
    int cached = 0;
    if (i < pin_nlive) {
        pin_buf b = pin_live[i];
        pin_live[i] = pin_live[--pin_nlive];
        if (cuda_open_count > 0 && pin_ncache < PIN_CACHE_MAX &&
            pin_cache_bytes + b.size <= PIN_CACHE_BYTES) {
            pin_cache[pin_ncache++] = b;
            pin_cache_bytes += b.size;
            cached = 1;
        }
    }
    pthread_mutex_unlock(&pin_lock);
    cuda_err e = cached ? 0 : rt.FreeHost(ptr);
    if (e) {
        rt.GetLastError();
        ferry__device_fail(d, FERRY_EINVAL, "%s: cudaFreeHost(%p) failed: %s", FERRY__DP(d).name, ptr,
                           cuda_str(e));
    }
}

/* Called with a device opened (+1) or closed (-1); the last close empties the cache. */
static void pin_track_open(int delta)
{
    pin_buf drop[PIN_CACHE_MAX];
    size_t ndrop = 0;
    pthread_mutex_lock(&pin_lock);
    cuda_open_count += delta;
    if (cuda_open_count == 0) {
        memcpy(drop, pin_cache, pin_ncache * sizeof *drop);
        ndrop = pin_ncache;
        pin_ncache = 0;
        pin_cache_bytes = 0;
    }
    pthread_mutex_unlock(&pin_lock);
    for (size_t i = 0; i < ndrop; i++)
        if (rt.FreeHost(drop[i].p))
            rt.GetLastError();
}

/* ---- events: the engine's hand-off with the copy stream ---------------------------------------- */

#define CUDA_ERR_NOT_READY 600 /* cudaErrorNotReady */

static int cuda_event_create(ferry_device *d, void **ev)
{
    cuda_device *c = (cuda_device *)d;
    *ev = NULL;
    cuda_err e = set_dev(c);
    if (!e)
        e = rt.EventCreateWithFlags(ev, CUDA_EVENT_DISABLE_TIMING);
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, e == CUDA_ERR_MEMORY_ALLOCATION ? FERRY_ENOMEM : FERRY_EDEVICE,
                                  "%s: cudaEventCreateWithFlags failed: %s", FERRY__DP(d).name, cuda_str(e));
    }
    return 0;
}

static void cuda_event_destroy(ferry_device *d, void *ev)
{
    cuda_device *c = (cuda_device *)d;
    if (!ev)
        return;
    set_dev(c);
    if (rt.EventDestroy(ev))
        rt.GetLastError();
}

static int cuda_event_record(ferry_device *d, void *ev, void *stream)
{
    cuda_device *c = (cuda_device *)d;
    cuda_err e = set_dev(c);
    if (!e) {
        /* under submit, so that it lands behind every copy already issued on the copy stream */
        if (!stream)
            pthread_mutex_lock(&c->submit);
        e = rt.EventRecord(ev, stream ? stream : c->stream);
        if (!stream)
            pthread_mutex_unlock(&c->submit);
    }
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, e == CUDA_ERR_INVALID_VALUE ? FERRY_EINVAL : FERRY_EDEVICE,
                                  "%s: cudaEventRecord failed: %s", FERRY__DP(d).name, cuda_str(e));
    }
    return 0;
}

static int cuda_event_wait(ferry_device *d, void *ev, void *stream)
{
    cuda_device *c = (cuda_device *)d;
    cuda_err e = set_dev(c);
    const char *call = "cudaEventSynchronize";
    if (!e && stream && rt.StreamWaitEvent) {
        call = "cudaStreamWaitEvent";
        e = rt.StreamWaitEvent(stream, ev, 0);
    } else if (!e) {
        e = rt.EventSynchronize(ev); /* no stream given, or a runtime without the stream wait */
    }
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: %s failed: %s", FERRY__DP(d).name, call,
                                  cuda_str(e));
    }
    return 0;
}

static int cuda_event_query(ferry_device *d, void *ev)
{
    cuda_device *c = (cuda_device *)d;
    cuda_err e = set_dev(c);
    if (!e)
        e = rt.EventQuery(ev);
    if (e == CUDA_ERR_NOT_READY)
        return 0;
    if (e) {
        rt.GetLastError();
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: cudaEventQuery failed: %s", FERRY__DP(d).name,
                                  cuda_str(e));
    }
    return 1;
}

/* ---- registered host memory --------------------------------------------------------------------
 * A home copy in host RAM, page-locked where it lies so that the copy engine reads it directly:
 * copies from pageable memory go through the runtime's own staging at a fraction of the link's
 * rate. Portable, so every cuda device may copy from it. Read-only first, which a read-only file
 * mapping needs; memory the runtime refuses that way (runtimes before 11.1) is asked for again
 * without the flag. */
static int cuda_host_register(ferry_device *d, void *ptr, uint64_t n)
{
    cuda_device *c = (cuda_device *)d;
    if (!rt.HostRegister)
        return ferry__device_fail(d, FERRY_EUNSUPPORTED, "%s: the CUDA runtime lacks "
                                  "cudaHostRegister", FERRY__DP(d).name);
    if (!ptr || !n || n > SIZE_MAX)
        return ferry__device_fail(d, FERRY_EINVAL, "%s: host_register of %" PRIu64 " bytes at %p",
                                  FERRY__DP(d).name, n, ptr);
    cuda_err e = set_dev(c);
    if (!e) {
        e = rt.HostRegister(ptr, (size_t)n, CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_READ_ONLY);
        if (e) {
            rt.GetLastError();
            e = rt.HostRegister(ptr, (size_t)n, CUDA_HOST_REGISTER_PORTABLE);
        }
    }
    if (e) {
        rt.GetLastError();
        char a[32];
        return ferry__device_fail(d, e == CUDA_ERR_MEMORY_ALLOCATION ? FERRY_ENOMEM : FERRY_EDEVICE,
                                  "%s: cudaHostRegister of %s at %p failed: %s", FERRY__DP(d).name,
                                  ferry__fmt_size(n, a), ptr, cuda_str(e));
    }
    return 0;
}

static void cuda_host_unregister(ferry_device *d, void *ptr)
{
    cuda_device *c = (cuda_device *)d;
    cuda_err e = rt.HostUnregister ? set_dev(c) : 0;
    if (!e && rt.HostUnregister)
        e = rt.HostUnregister(ptr);
    if (e) {
        rt.GetLastError();
        ferry__device_fail(d, FERRY_EDEVICE, "%s: cudaHostUnregister(%p) failed: %s",
                           FERRY__DP(d).name, ptr, cuda_str(e));
    }
}

static const ferry_device_ops cuda_ops = {
    .version = FERRY_DEVICE_OPS_VERSION,
    .size = sizeof(ferry_device_ops),
    .props = ferry__device_props_op,
    .errmsg = ferry__device_errmsg_op,
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .wait = cuda_wait,
    .synchronize = cuda_synchronize,
    .mem_info = cuda_mem_info,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .read_sync = NULL, /* the core's copy_d2h + wait */
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_query = cuda_event_query,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
};

int ferry__cuda_open(const char *spec, int ordinal, ferry_device **out, char *err, size_t errlen)
{
#define FAIL(code, ...) \
    do { \
        if (err && errlen) \
            snprintf(err, errlen, __VA_ARGS__); \
        return code; \
    } while (0)
    pthread_once(&rt_once, rt_load);
    if (!rt_ok)
        FAIL(FERRY_EDEVICE, "%s unavailable: %s", spec, rt_why);
    int count = 0;
    cuda_err e = rt.GetDeviceCount(&count);
    if (e) {
        rt.GetLastError();
        FAIL(FERRY_EDEVICE, "%s unavailable: no CUDA device (cudaGetDeviceCount: %s)", spec,
             cuda_str(e));
    }
    if (count <= 0)
        FAIL(FERRY_EDEVICE, "%s unavailable: no CUDA device", spec);
    if (ordinal >= count)
        FAIL(FERRY_EDEVICE, "%s unavailable: there %s only %d CUDA device%s", spec,
             count == 1 ? "is" : "are", count, count == 1 ? "" : "s");
    e = rt.SetDevice(ordinal);
    size_t fr = 0, tot = 0;
    if (!e)
        e = rt.MemGetInfo(&fr, &tot);
    if (e) {
        rt.GetLastError();
        FAIL(FERRY_EDEVICE, "%s unavailable: %s", spec, cuda_str(e));
    }
    cuda_device *c = calloc(1, sizeof *c);
    if (!c)
        FAIL(FERRY_ENOMEM, "%s: out of memory", spec);
    c->ordinal = ordinal;
    e = rt.StreamCreateWithFlags(&c->stream, CUDA_STREAM_NON_BLOCKING);
    if (e) {
        rt.GetLastError();
        free(c);
        FAIL(FERRY_EDEVICE, "%s unavailable: cudaStreamCreateWithFlags: %s", spec, cuda_str(e));
    }
    if (rt.MemPoolCreate) {
        cuda_pool_props props;
        memset(&props, 0, sizeof props);
        props.alloc_type = CUDA_MEM_ALLOCATION_PINNED;
        props.location.type = CUDA_MEM_LOCATION_DEVICE;
        props.location.id = ordinal;
        if (rt.MemPoolCreate(&c->pool, &props)) {
            rt.GetLastError(); /* cudaMalloc and cudaFree then */
            c->pool = NULL;
        }
    }
    pthread_mutex_init(&c->submit, NULL);
    pthread_mutex_init(&c->lock, NULL);
    ferry__device_init(&c->base, &cuda_ops, spec, "cuda", CUDA_ALIGN, (uint64_t)tot, 0);
    pin_track_open(+1);
    *out = &c->base.pub;
    return 0;
#undef FAIL
}
