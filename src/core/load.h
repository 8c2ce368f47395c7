/*
 * load.h — what the files that load tensors share: prepare.c (the public calls and group loads),
 * jobs.c (the queue and the loader threads), transfer.c (file -> host -> device), tensor.c
 * (reading tensors back). Locking as core.h says.
 */
#ifndef FERRY_LOAD_H
#define FERRY_LOAD_H

#include "core/core.h"

#define FERRY__XFER_CHUNK (UINT64_C(16) << 20)
#define FERRY__MAX_PREFETCH 4
#define FERRY__PREFETCH_SCAN 256
#define FERRY__PARALLEL_READ (UINT64_C(4) << 20) /* reads this large go to the I/O pool */

/* A loader's staging buffers, each allocated the first time a transfer needs it (host RSS is
 * budgeted: a loader that only ever reads into destinations holds none). */
typedef struct ferry__loader_ctx {
    unsigned char *stage[2]; /* file bytes, FERRY__IO_ALIGN-aligned, cap + 2 pages */
    unsigned char *conv[2];  /* transformed bytes bound for a device */
    float *f32;              /* a chunk as f32, for merges */
    uint64_t cap;            /* bytes each of stage/conv/f32 holds when allocated */
    ferry_device *pinned;    /* the device whose host_alloc made stage/conv, or NULL */
    ferry_device *pin_failed; /* the device whose host_alloc failed in the last ctx_buffers */
    uint64_t ticket[2];
    int pending[2];
} ferry__loader_ctx;

/* What a queued job fills (decided under the lock when it is queued). */
enum {
    FILL_HOST = 1,     /* read the pristine host copy */
    FILL_COMP = 2,     /* stage the copy the engine gets */
    FILL_POPULATE = 4, /* bring a zero-copy tensor's pages into the page cache, in bulk */
    FILL_LOCK = 8,     /* mlock the copy that is the mapping (policy.lock): I/O, so in the job */
};

static inline int ferry__host_side(const ferry *f, int dev)
{
    return f->devs[dev].p.host_accessible;
}

static inline void ferry__add_stat(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* transfer.c — lock not held */
/* What a transfer needs besides its job and tensor: no manager. ferry__xfer_env_of fills it from
 * one (fields fixed while a job runs). */
typedef struct ferry__xfer_env {
    ferry__io *io;                        /* the pool large reads go to */
    ferry_device *dev;                    /* the destination copy's device */
    const char *dev_name;                 /* its name, for messages */
    int dev_host_accessible;              /* its memory is the host's */
    uint64_t *bytes_read, *bytes_copied;  /* counters, added to atomically */
    int relay;                            /* large direct reads are relayed (ferry->relay) */
    /* NULL unless tracing: records a span named FMT with its %s replaced by ARG */
    void (*trace)(void *ud, const char *cat, double t0, double t1, const char *fmt,
                  const char *arg);
    void *trace_ud;
} ferry__xfer_env;
/* Reads [ABS, ABS+LEN) of FILE into DST, large reads in parallel through IO's workers (RELAY:
 * through their relay slots, io.h). */
int ferry__read_at(ferry__io *io, const ferry__iofile *file, uint64_t abs, uint64_t len, void *dst,
                   ferry_load mode, int relay, ferry__err *e);
/* Reads [off, off+len) of T's file (OFF relative to the tensor) into DST; large reads go to the
 * I/O pool. COUNT: the bytes count as read from the file. */
int ferry__read_file(const ferry__xfer_env *env, const ferry_tensor *t, uint64_t off,
                     uint64_t len, void *dst, ferry_load mode, int count, ferry__err *e);
/* Brings [OFF, OFF+LEN) of FILE (OFF a multiple of the page size) into the page cache and maps it:
 * in pieces of FERRY__XFER_CHUNK, each asked of the kernel's readahead (POSIX_FADV_WILLNEED) while
 * the one before is populated (MADV_POPULATE_READ). 0, or -1 with errno from the populate. */
int ferry__populate_range(const ferry__iofile *file, uint64_t off, uint64_t len);
/* Moves T's bytes as job J describes (dtype out, LoRA terms) into DST on ENV's device, from
 * SRC_HOST (the host home copy) or else the file, converting and merging on the way. */
int ferry__transfer(const ferry__xfer_env *env, ferry__loader_ctx *lc, const ferry_tensor *t,
                    const ferry__job *j, const unsigned char *src_host, int home_mapped,
                    ferry_load mode, ferry__copy *dst, ferry__err *e);
void ferry__loader_ctx_free(ferry__loader_ctx *lc);

/* jobs.c — lock held by all but the first two */
/* F's I/O pool, counters and trace, and device DEV (-1: none), for transfer.c. */
ferry__xfer_env ferry__xfer_env_of(ferry *f, int dev);
/* ferry__read_file with F's environment. */
int ferry__read_range(ferry *f, const ferry_tensor *t, uint64_t off, uint64_t len, void *dst,
                      ferry_load mode, int count, ferry__err *e);
/* What T lacks to be used (FILL_*); copies that are the mapping are made READY on the way. */
int ferry__needs(ferry *f, ferry_tensor *t, int home_only);
/* Queues a job bringing T to where it is used (or, with HOME_ONLY, to its home). MIN_DIST: only
 * cached copies used later than this may be evicted for it (prefetch); 0 for demand loads.
 * Returns 0 (queued or nothing to do) or FERRY_EBUDGET / FERRY_ENOMEM, the detail in E (may be
 * NULL: a hint's failure is nobody's error). */
int ferry__enqueue(ferry *f, ferry_tensor *t, int home_only, int prefetch, uint64_t min_dist,
                   ferry__err *e);
/* Queues prefetches of what the schedule says comes next, or before one exists what follows in
 * file order (sched/prefetch.h). */
void ferry__prefetch_ahead(ferry *f);
/* Tells the file-order prefetch (sched/prefetch.h, ferry__pf_follow) that the units U were
 * prepared, after the schedule recorded them. Lock held. */
void ferry__prefetch_note(ferry *f, ferry_tensor *const *u, size_t nu);
void ferry__job_recycle(ferry *f, ferry__job *j);
/* Settles job J's copies after it ran: READY, or EMPTY with RC, E's message kept in the tensor
 * (fail_msg) for the prepare that waits on it. */
void ferry__finish_job(ferry *f, ferry__job *j, int fill, int rc, const ferry__err *e);
/* With LOCK, mlocks LEN bytes of C (policy.lock), counting what it could not. */
void ferry__lock_copy(ferry *f, int lock, ferry__copy *c, uint64_t len);
/* After the last release: a copy of an old LoRA epoch goes; any other stays cached. */
void ferry__drop_if_unkept(ferry *f, ferry_tensor *t);
/* Drops one reference of the unit T. */
void ferry__release_one(ferry *f, ferry_tensor *t);

/* prepare.c — lock held */
/* 0 when T may be prepared or read; else the error, in E (may be NULL). */
int ferry__usable(ferry *f, ferry_tensor *t, ferry__err *e);

#endif
