/*
 * devices.h — internal interface of the device layer (src/devices/): the constructors behind
 * ferry_device_open, helpers the core uses on any device (falling back where an operation is NULL),
 * and the sim device's test hooks (fault injection, pacing, counters).
 *
 * Conventions beyond include/ferry_device.h that every in-tree device keeps:
 *  - alloc(size 0) succeeds with a unique, valid, aligned pointer (accounted as one byte, rounded
 *    up to the alignment on sim) so that empty tensors need no special case;
 *  - tickets start at 1 and grow by one per copy (0 is never a ticket); wait on a ticket that was
 *    never issued is FERRY_EINVAL;
 *  - synchronize returns 0 once every copy queued before the call is done; the status of each copy
 *    is still returned by its own wait;
 *  - each embeds ferry__devbase first (its properties, filled once at open); a failing operation
 *    records its message with ferry__device_fail in the calling thread's slot, which the errmsg
 *    operation reads back, so threads failing at once never see each other's messages.
 */
#ifndef FERRY_DEVICES_H
#define FERRY_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "ferry_device.h"
#include "util/util.h"

/* ---- shared by the implementations ----------------------------------------------------------- */

/* The first member of every in-tree device. */
typedef struct ferry__devbase {
    ferry_device pub; /* first: a ferry__devbase * is a ferry_device * */
    ferry_device_props props;
} ferry__devbase;

/* The properties of in-tree device D. */
#define FERRY__DP(d) (((ferry__devbase *)(d))->props)

/* Formats the message into ERR (ERRLEN bytes, may be NULL/0: nothing written); returns CODE. */
int ferry__device_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Records the printf-formatted message as the calling thread's latest failure on D; returns CODE. */
int ferry__device_fail(ferry_device *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The errmsg operation of every in-tree device: the calling thread's latest failure on D. */
char *ferry__device_errmsg_op(ferry_device *d, char *buf, size_t len);
/* The props operation of every in-tree device. */
int ferry__device_props_op(ferry_device *d, ferry_device_props *out);
/* Any device's latest failure on this thread (its errmsg op), or "" when it has none. */
char *ferry__device_errmsg(const ferry_device *d, char *buf, size_t len);
/* Fills the common fields of a freshly allocated in-tree device. */
void ferry__device_init(ferry__devbase *d, const ferry_device_ops *ops, const char *spec,
                        const char *kind, uint64_t alignment, uint64_t max_alloc,
                        int host_accessible);

/* Constructors, called by ferry_device_open with the spec already split. On failure they return a
 * FERRY_E code and write the reason into ERR (ERRLEN bytes). */
int ferry__cpu_open(const char *spec, ferry_device **out, char *err, size_t errlen);

/* ---- the cpu device's page reuse (cpu.c) ------------------------------------------------------ */

#define FERRY__CPU_MAP_MIN (UINT64_C(256) << 10) /* cpu blocks this large are mapped */
#define FERRY__HUGE_PAGE (UINT64_C(2) << 20)  /* a transparent huge page */

/* 1 when D is the built-in cpu device. */
int ferry__cpu_is(const ferry_device *d);
/* Says whether the cpu device D's blocks will be reused (a budget bounds it, so the manager pools
 * them). Reused blocks from then on are mapped with transparent huge pages: a huge page is 2 MiB
 * of physically contiguous memory, and an O_DIRECT read into such pages goes to the disk as a few
 * large requests instead of 4 KiB segments (a virtio disk takes at most 254 segments a request, so
 * small scattered pages cap requests at 1016 KiB; measured here: 1.0 GB/s into small pages,
 * 1.7-1.9 GB/s into huge pages). The first fault of a huge page costs compaction, which a block
 * used once does not pay back; a pooled one is reused every pass. Does nothing when D is not cpu. */
void ferry__cpu_set_reuse(ferry_device *d, int reuse);
/* 1 when P is a mapped block of the cpu device D (blocks of 256 KiB and more are mapped; smaller
 * ones come from the heap and cannot be stitched); then *SIZE is its size (a multiple of 4 KiB)
 * and *SEGMENTS the number of kernel mappings it may span. 0 otherwise, or when D is not cpu. */
int ferry__cpu_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments);
/* Seconds the first access to a 4 KiB page costs after mremap moved it, beyond what reading it
 * costs: measured once per process (64 pages, the best of 3), 0 where pages cannot be moved. On
 * most machines next to nothing (the page-table entries move with the page); on a virtual machine
 * whose hypervisor shadows the guest's page tables each moved page traps once (about 7 us). */
double ferry__cpu_move_cost(void);

/* Makes one block of NEED bytes (rounded up to 4 KiB) out of the mapped blocks PARTS[0..N) of the
 * cpu device D (N <= 64), without copying or faulting their pages: their pages first, in order,
 * then fresh pages when they hold fewer than NEED bytes. Only the last part may reach past NEED;
 * what it holds beyond stays a block of its own, returned in *REST, *REST_SIZE (NULL, 0 if none).
 * One part of at least NEED bytes is only cut in two, with no system call — and not cut when the
 * rest would be under 64 KiB, unless the cut lies on a 2 MiB boundary of the address space (it
 * splits no huge page there): then *OUT_SIZE is the part's whole size. On success *OUT, *OUT_SIZE
 * hold the new block (freed with D's free like any other) and the parts are gone; returns 0.
 * On failure *GONE says what became of the parts: 0, untouched (still blocks of D); 1, unmapped,
 * their bytes returned to the system (the kernel refused a move after others had been made).
 * FERRY_EINVAL when a part is not a mapped block of D or the parts reach past NEED before the last
 * (untouched); FERRY_ENOMEM when memory for the new range or the bookkeeping is short, or the
 * kernel refuses a move (too many mappings); FERRY_EIO for another refusal; FERRY_EUNSUPPORTED
 * off Linux (no mremap; untouched). */
int ferry__cpu_stitch(ferry_device *d, void *const *parts, size_t n, uint64_t need, void **out,
                      uint64_t *out_size, void **rest, uint64_t *rest_size, int *gone);

/* The sim device's configuration, parsed from "sim[:CAPACITY[@RATE]][,key=value...]". */
typedef struct ferry__sim_config {
    uint64_t capacity;      /* bytes; > 0 */
    uint64_t rate;          /* bytes per second; 0: unpaced */
    uint64_t max_alloc;     /* largest single allocation; <= capacity */
    uint64_t alignment;     /* power of two */
    uint64_t fail_alloc;    /* the N-th allocation call fails (1-based); 0: never */
    int fail_alloc_every;   /* and then every N-th after it */
    uint64_t fail_copy;     /* the N-th copy completes with FERRY_EDEVICE; 0: never */
    int fail_copy_every;
    int poison;             /* fill fresh allocations with FERRY__SIM_POISON */
} ferry__sim_config;

#define FERRY__SIM_DEFAULT_CAPACITY (UINT64_C(1) << 30) /* "sim" alone: 1 GiB */
#define FERRY__SIM_DEFAULT_ALIGN 256                    /* as cudaMalloc */
#define FERRY__SIM_POISON 0xA5                          /* fresh sim memory reads as this */

int ferry__sim_open(const char *spec, const ferry__sim_config *cfg, ferry_device **out, char *err,
                    size_t errlen);
/* ORDINAL: the N of "cuda:N". Fails with FERRY_EDEVICE ("cuda:0 unavailable: ...") without the
 * CUDA runtime library or a GPU. */
int ferry__cuda_open(const char *spec, int ordinal, ferry_device **out, char *err, size_t errlen);

/* ---- for the core: operations with the fallbacks ferry_device.h promises -------------------- */

/* Reads N bytes of device memory at SRC into host DST synchronously: read_sync when the device has
 * it, copy_d2h + wait otherwise. */
int ferry__device_read(ferry_device *d, void *dst, const void *src, uint64_t n);
/* Writes N bytes of host SRC to device DST synchronously (copy_h2d + wait). */
int ferry__device_write(ferry_device *d, void *dst, const void *src, uint64_t n);
/* Staging memory: host_alloc when the device has it, else page-aligned host memory. Free with
 * ferry__device_host_free on the same device. */
int ferry__device_host_alloc(ferry_device *d, uint64_t size, void **ptr);
void ferry__device_host_free(ferry_device *d, void *ptr);

/* 1 when D's table has the event members (all five set). */
int ferry__device_has_events(const ferry_device *d);
/* 1 when D's table has the page-reuse members (set_reuse, block, stitch). */
int ferry__device_has_reuse(const ferry_device *d);
/* D's set_reuse, when it has one. */
void ferry__device_set_reuse(ferry_device *d, int reuse);
/* D's block, or 0 when it has none. */
int ferry__device_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments);

/* Opens the device of a spec (ferry_device_open's signature). */
typedef int (*ferry__device_opener)(const char *spec, ferry_device **out, char *err, size_t errlen);
/* The "fault:SPEC[,fail_alloc=N[/every]][,fail_copy=M[/every]]" wrapper (fault.c): opens SPEC
 * with OPEN_INNER and wraps it. */
int ferry__fault_open(const char *spec, ferry__device_opener open_inner, char *err, size_t errlen,
                      ferry_device **out);

/* ---- host memory (hostmem.c) ----------------------------------------------------------------- */

/* Aligned host memory (ALIGN a power of two; page alignment for big blocks). NULL when exhausted
 * or SIZE does not fit size_t. Free with ferry__host_free. */
void *ferry__host_aligned_alloc(uint64_t size, uint64_t align);
void ferry__host_free(void *p);
/* Locks [P, P+N) in RAM (mlock). FERRY_EUNSUPPORTED when RLIMIT_MEMLOCK or privileges forbid it,
 * FERRY_ENOMEM when the kernel refuses for lack of memory; E (may be NULL) gets the detail with
 * the limit. ferry__host_unlock undoes it. */
int ferry__host_lock(void *p, uint64_t n, ferry__err *e);
void ferry__host_unlock(void *p, uint64_t n);
/* Host memory: total and available bytes (MemAvailable), capped by the cgroup's memory limit
 * when there is one. */
int ferry__host_mem_info(uint64_t *avail, uint64_t *total);
/* The same, with the cgroup's part on its own: TOTAL and AVAIL as ferry__host_mem_info gives them;
 * CG_LIMIT, the tightest memory cgroup limit on the way to the root, and CG_ROOM, what may still
 * be charged under it (UINT64_MAX both when no limit applies). $FERRY_CGROUP_ROOT replaces
 * /sys/fs/cgroup, and $FERRY_CGROUP_ROOT/proc_self_cgroup /proc/self/cgroup, for tests. */
typedef struct ferry__host_room {
    uint64_t total, avail;
    uint64_t cg_limit, cg_room;
} ferry__host_room;
int ferry__host_room_probe(ferry__host_room *out);
/* 1 when fresh 2 MiB pages fault in much slower than small ones here: the kernel reports free
 * blocks of at most a huge page's order to a hypervisor (free page reporting, and it has
 * reported some), so a huge page taken from the free lists is most often one the host took back.
 * 0 otherwise, and where it cannot tell. $FERRY_SYSFS_ROOT replaces /sys, for tests. */
int ferry__host_huge_pages_dear(void);
/* Asks that the mapped range [P, P+LEN) be backed by small pages only from now on
 * (MADV_NOHUGEPAGE: a hint, where the kernel takes it; pages already there stay as they are). */
void ferry__host_small_pages(void *p, uint64_t len);

/* ---- sim test hooks --------------------------------------------------------------------------- */

/* Fault injection from now on: the FAIL_ALLOC_NTH-th allocation call fails with FERRY_ENOMEM, the
 * FAIL_COPY_NTH-th copy (copy_h2d / copy_d2h; read_sync is never failed) completes with
 * FERRY_EDEVICE; 0 = off. Counting restarts at this call. FERRY_EINVAL when D is not a sim. */
int ferry__sim_set_faults(ferry_device *d, uint64_t fail_alloc_nth, uint64_t fail_copy_nth);
/* The same with the "every" variant: when EVERY is nonzero the N-th, 2N-th, 3N-th... fail. */
int ferry__sim_set_faults_every(ferry_device *d, uint64_t fail_alloc_nth, int alloc_every,
                                uint64_t fail_copy_nth, int copy_every);
/* Changes the bandwidth limit (bytes per second, 0: unpaced) for copies started from now on. */
int ferry__sim_set_rate(ferry_device *d, uint64_t bytes_per_s);

typedef struct ferry__sim_stats {
    uint64_t alloc_calls;     /* every call to alloc, successful or not */
    uint64_t allocs;          /* successful allocations since open */
    uint64_t alloc_failures;  /* refused allocations (capacity, max_alloc, injected, host) */
    uint64_t live_allocs;     /* allocations not yet freed */
    uint64_t used;            /* bytes of capacity in use (sizes rounded up to the alignment) */
    uint64_t peak_used;       /* highest value of used */
    uint64_t copies;          /* copies completed (h2d and d2h; not read_sync) */
    uint64_t copy_failures;   /* of which completed with an error */
    uint64_t copies_pending;  /* queued or running now */
    uint64_t bytes_h2d;       /* bytes copied successfully host -> device */
    uint64_t bytes_d2h;       /* and device -> host (read_sync included) */
    uint64_t misuse;          /* contract violations seen: a free while a copy of that memory was
                                 in flight (the free waited for it) */
} ferry__sim_stats;

/* The sim's compute queue, a stream for its event ops: a second worker thread, independent of
 * the copy queue (as an engine's stream is of ferry's non-blocking copy stream), started at the
 * first call. NULL when D is not a sim or the thread cannot start. */
void *ferry__sim_stream(ferry_device *d);
/* A "kernel" that reads device memory late: queued on STREAM (NULL: the copy queue) after the
 * work before it, it sleeps DELAY_US and then calls FN(UD, the bytes of [DEV, DEV+N), N) on that
 * queue's worker. [DEV, DEV+N) must lie in one live allocation, which counts as in use until
 * the kernel has run. FERRY_EINVAL when D is not a sim or the range is not device memory. */
typedef void (*ferry__sim_kernel_fn)(void *ud, const void *bytes, uint64_t n);
int ferry__sim_kernel(ferry_device *d, void *stream, const void *dev, uint64_t n,
                      uint64_t delay_us, ferry__sim_kernel_fn fn, void *ud);

/* A snapshot of D's counters. FERRY_EINVAL when D is not a sim. */
int ferry__sim_get_stats(ferry_device *d, ferry__sim_stats *out);
/* Shortcut: successful allocations since open, copies completed, peak bytes used (NULLs allowed). */
int ferry__sim_counters(ferry_device *d, uint64_t *allocs, uint64_t *copies, uint64_t *peak_used);

#endif
