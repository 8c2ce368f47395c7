/*
 * residency.c — prepare / release / prefetch, the loader threads that fill copies, and the
 * transfer pipeline that moves a tensor's bytes from the file (or its host home copy) to the
 * compute device, converting on the way.
 *
 * A tensor has at most two copies: `host` (its home copy in host RAM when it is computed on an
 * accelerator) and `comp` (what the engine's data pointer points at). Copies that are the file
 * mapping (zero-copy, lazy) are READY as soon as they are needed. Others are filled by a job: the
 * enqueuing thread reserves the memory under the lock (so in-flight bytes count against the
 * budget), marks the copies LOADING and queues the job; a loader thread allocates, moves the bytes
 * without the lock, and marks the copies READY (or EMPTY with the error) under the lock.
 *
 * Transfers go in chunks of whole blocks, at most FERRY__XFER_CHUNK bytes on either side, through
 * two staging buffers per loader, so that reading chunk i+1 overlaps copying chunk i to the device.
 * The home copy is never written: conversion writes only to the staged copy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "devices/devices.h"
#include "dtype/dtype.h"
#include "sched/prefetch.h"

#define FERRY__XFER_CHUNK (UINT64_C(16) << 20)
#define FERRY__MAX_PREFETCH 4
#define FERRY__PREFETCH_SCAN 256
#define FERRY__PARALLEL_READ (UINT64_C(4) << 20) /* reads this large go to the I/O pool */

/* A loader's staging buffers, each allocated the first time a transfer needs it (host RSS is
 * budgeted: a loader that only ever reads into destinations holds none). */
typedef struct loader_ctx {
    unsigned char *stage[2]; /* file bytes, FERRY__IO_ALIGN-aligned, cap + 2 pages */
    unsigned char *conv[2];  /* transformed bytes bound for a device */
    float *f32;              /* a chunk as f32, for merges */
    uint64_t cap;            /* bytes each of stage/conv/f32 holds when allocated */
    ferry_device *pinned;    /* the device whose host_alloc made stage/conv, or NULL */
    ferry_device *pin_failed; /* the device whose host_alloc failed in the last ctx_buffers */
    uint64_t ticket[2];
    int pending[2];
} loader_ctx;

/* ---- small helpers ---------------------------------------------------------------------------- */

static int host_side(const ferry *f, int dev)
{
    return f->devs[dev].d->host_accessible;
}

static void add_stat(uint64_t *counter, uint64_t n)
{
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

uint64_t ferry__dev_alloc_size(const ferry_tensor *t)
{
    uint64_t n = t->out_bytes ? t->out_bytes : 1;
    uint64_t size;
    return ferry__align_up(n, 256, &size) ? UINT64_MAX : size;
}

/* ---- reading file ranges ---------------------------------------------------------------------- */

typedef struct sync_wait {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done, status;
} sync_wait;

static void sync_done(void *ud, int status)
{
    sync_wait *w = ud;
    pthread_mutex_lock(&w->m);
    w->done = 1;
    w->status = status;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

/* Reads [off, off+len) of T's file (OFF relative to the tensor) into DST. Large reads go to the
 * I/O pool so that several workers read chunks of it in parallel. COUNT: the bytes count as read
 * from the file (not when they stand for a copy of the mapped home copy). */
static int read_range(ferry *f, const ferry_tensor *t, uint64_t off, uint64_t len, void *dst,
                      ferry_load mode, int count, ferry__err *e)
{
    uint64_t abs = t->info.offset + off;
    int rc;
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    if (len < FERRY__PARALLEL_READ) {
        rc = ferry__io_read(t->file, abs, len, dst, mode, e);
        if (rc)
            ferry__fail_prefix(e, "tensor '%s': ", t->info.name);
    } else {
        sync_wait w = {.done = 0, .status = 0};
        pthread_mutex_init(&w.m, NULL);
        pthread_cond_init(&w.c, NULL);
        ferry__ioreq req = {.file = t->file, .offset = abs, .len = len, .dst = dst,
                            .mode = mode, .done = sync_done, .ud = &w};
        rc = ferry__io_submit(f->io, &req);
        if (!rc) {
            pthread_mutex_lock(&w.m);
            while (!w.done)
                pthread_cond_wait(&w.c, &w.m);
            pthread_mutex_unlock(&w.m);
            rc = w.status;
            if (rc)
                ferry__fail(e, rc, "tensor '%s': %s", t->info.name,
                            req.errmsg[0] ? req.errmsg : ferry_strerror(rc));
        } else {
            ferry__fail(e, rc, "tensor '%s': %s", t->info.name,
                        req.errmsg[0] ? req.errmsg : "cannot queue the read");
        }
        pthread_cond_destroy(&w.c);
        pthread_mutex_destroy(&w.m);
    }
    if (!rc && count)
        add_stat(&f->a_bytes_read, len);
    if (t0)
        ferry__trace_addf(f, "io", t0, ferry__now(), "read %s", t->info.name);
    return rc;
}

/* ---- the transfer pipeline -------------------------------------------------------------------- */

static void ctx_release(loader_ctx *lc)
{
    for (int i = 0; i < 2; i++) {
        if (lc->pinned) {
            ferry__device_host_free(lc->pinned, lc->stage[i]);
            ferry__device_host_free(lc->pinned, lc->conv[i]);
        } else {
            free(lc->stage[i]);
            free(lc->conv[i]);
        }
        lc->stage[i] = lc->conv[i] = NULL;
    }
    free(lc->f32);
    lc->f32 = NULL;
    lc->cap = 0;
    lc->pinned = NULL;
}

enum { NEED_STAGE = 1, NEED_CONV = 2, NEED_F32 = 4 };

static int ctx_alloc(ferry_device *pin, unsigned char **p, uint64_t bytes)
{
    if (*p)
        return 0;
    if (pin) {
        /* the device's code: FERRY_ENOMEM, or FERRY_EDEVICE when it failed (a lost context) */
        int rc = ferry__device_host_alloc(pin, bytes, (void **)p);
        return rc < 0 ? rc : rc ? FERRY_ENOMEM : 0;
    }
    return posix_memalign((void **)p, FERRY__IO_ALIGN, bytes) ? FERRY_ENOMEM : 0;
}

/* Makes the buffers NEED asks for at least BYTES long, in pinned memory of DEV when the copies
 * go to a device that has it (DMA from pageable memory is slower and not asynchronous on CUDA). */
static int ctx_buffers(loader_ctx *lc, int need, uint64_t bytes, ferry_device *dev)
{
    if (bytes < FERRY__XFER_CHUNK)
        bytes = FERRY__XFER_CHUNK;
    ferry_device *pin = dev && !dev->host_accessible && dev->ops->host_alloc ? dev : NULL;
    if (lc->cap < bytes || (pin && lc->pinned != pin))
        ctx_release(lc);
    if (lc->cap < bytes)
        lc->cap = bytes;
    if (pin)
        lc->pinned = pin;
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        if (need & NEED_STAGE)
            rc = ctx_alloc(lc->pinned, &lc->stage[i], lc->cap + 2 * FERRY__IO_ALIGN);
        if (!rc && (need & NEED_CONV))
            rc = ctx_alloc(lc->pinned, &lc->conv[i], lc->cap);
    }
    lc->pin_failed = rc ? lc->pinned : NULL;
    if (!rc && (need & NEED_F32))
        rc = ctx_alloc(NULL, (unsigned char **)&lc->f32, lc->cap);
    return rc;
}

static void ctx_free(loader_ctx *lc)
{
    ctx_release(lc);
}

static int wait_slot(ferry_device *d, loader_ctx *lc, int slot)
{
    if (!lc->pending[slot])
        return 0;
    lc->pending[slot] = 0;
    return d->ops->wait(d, lc->ticket[slot]);
}

/* Elements per chunk: whole blocks of both types, at most FERRY__XFER_CHUNK bytes on each side. */
static uint64_t chunk_elems(ferry_dtype in, ferry_dtype out)
{
    uint64_t bi = ferry_dtype_block_elems(in), bo = ferry_dtype_block_elems(out);
    uint64_t unit = bi;
    while (unit % bo)
        unit += bi;
    uint64_t bytes_in = 0, bytes_out = 0;
    ferry_dtype_nbytes(in, unit, &bytes_in);
    ferry_dtype_nbytes(out, unit, &bytes_out);
    uint64_t per = FERRY__MAX(bytes_in, bytes_out);
    uint64_t units = per ? FERRY__XFER_CHUNK / per : 1;
    return (units ? units : 1) * unit;
}

/* Chunking for a merge: whole rows of the LoRA matrix view, at most FERRY__XFER_CHUNK bytes of
 * input, output and f32 each (at least one row). */
static uint64_t merge_chunk_elems(const ferry_tensor *t, ferry_dtype out, uint64_t *max_bytes)
{
    uint64_t rows, cols, in_row = 0, out_row = 0;
    ferry__lora_matrix_view(&t->info, &rows, &cols);
    ferry_dtype_nbytes(t->info.dtype, cols, &in_row);
    ferry_dtype_nbytes(out, cols, &out_row);
    uint64_t per_row = FERRY__MAX(FERRY__MAX(in_row, out_row), cols * 4);
    uint64_t nrows = per_row ? FERRY__XFER_CHUNK / per_row : 1;
    if (!nrows)
        nrows = 1;
    *max_bytes = nrows * per_row;
    return nrows * cols;
}

/* Fills DST (a copy of T on device DST->dev whose memory is allocated) from SRC_HOST (the home
 * copy, in the file's dtype) or, when NULL, from the file with MODE; converts to the staged dtype
 * and adds J's LoRA terms on the way. HOME_MAPPED: the home copy is the file mapping, whose bytes
 * are read through the descriptor instead (a copy out of a mapping of a truncated file dies of
 * SIGBUS) and count as copied, not read. */
static int transfer(ferry *f, loader_ctx *lc, ferry_tensor *t, const ferry__job *j,
                    const unsigned char *src_host, int home_mapped, ferry_load mode,
                    ferry__copy *dst, ferry__err *e)
{
    ferry_device *d = f->devs[dst->dev].d;
    int to_host = d->host_accessible;
    ferry_dtype in = t->info.dtype, out = j->out_dtype;
    int merging = j->n_terms > 0;
    int converted = in != out;
    unsigned char *dptr = dst->ptr;
    char msg[256];

    if (!converted && !merging && to_host) {
        if (src_host) {
            memcpy(dptr, src_host, t->info.nbytes);
            add_stat(&f->a_bytes_copied, t->info.nbytes);
            return 0;
        }
        int rc = read_range(f, t, 0, t->info.nbytes, dptr, mode, !home_mapped, e);
        if (!rc && home_mapped)
            add_stat(&f->a_bytes_copied, t->info.nbytes);
        return rc;
    }
    uint64_t n = t->info.n_elems, step, need = FERRY__XFER_CHUNK, cols = 1, rows = 1;
    if (merging) {
        step = merge_chunk_elems(t, out, &need);
        ferry__lora_matrix_view(&t->info, &rows, &cols);
    } else {
        step = chunk_elems(in, out);
    }
    int rc = ctx_buffers(lc, (src_host ? 0 : NEED_STAGE) |
                                 (!to_host && (converted || merging) ? NEED_CONV : 0) |
                                 (merging ? NEED_F32 : 0),
                         need, d);
    if (rc) {
        char why[256] = "host memory";
        if (lc->pin_failed)
            ferry__device_errmsg(lc->pin_failed, why, sizeof why);
        return ferry__fail(e, rc, "%s: tensor '%s': %s staging buffers (%s)", d->name,
                           t->info.name,
                           rc == FERRY_ENOMEM ? "out of memory for" : "cannot allocate", why);
    }
    int slot = 0;
    for (uint64_t el = 0; el < n && !rc; el += step, slot ^= 1) {
        uint64_t ce = FERRY__MIN(step, n - el);
        uint64_t in_off, in_len, out_off, out_len;
        ferry_dtype_nbytes(in, el, &in_off);
        ferry_dtype_nbytes(in, ce, &in_len);
        ferry_dtype_nbytes(out, el, &out_off);
        ferry_dtype_nbytes(out, ce, &out_len);
        if (!to_host && (rc = wait_slot(d, lc, slot)) != 0) {
            ferry__fail(e, rc, "%s: tensor '%s': copy to device failed: %s", d->name,
                        t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
            break;
        }
        const unsigned char *src;
        if (src_host) {
            src = src_host + in_off;
        } else {
            unsigned char *buf = lc->stage[slot] + (t->info.offset + in_off) % FERRY__IO_ALIGN;
            if ((rc = read_range(f, t, in_off, in_len, buf, mode, !home_mapped, e)) != 0)
                break;
            src = buf;
        }
        if (converted || merging) {
            double t0 = ferry__tracing(f) ? ferry__now() : 0;
            unsigned char *cdst = to_host ? dptr + out_off : lc->conv[slot];
            if (merging) {
                rc = ferry__to_f32(in, src, lc->f32, ce);
                for (size_t k = 0; k < j->n_terms && !rc; k++)
                    ferry__lora_apply_rows(j->terms[k].pair, j->scales[k],
                                           t->row_base + el / cols, ce / cols, lc->f32);
                if (!rc)
                    rc = ferry__from_f32(out, lc->f32, cdst, ce);
            } else {
                rc = ferry_dtype_convert(in, src, out, cdst, ce);
            }
            if (rc) {
                ferry__fail(e, rc, "tensor '%s': %s %s to %s failed", t->info.name,
                            merging ? "merging adapters into" : "converting",
                            ferry_dtype_name(in), ferry_dtype_name(out));
                break;
            }
            if (t0)
                ferry__trace_addf(f, "cpu", t0, ferry__now(), merging ? "merge %s" : "convert %s",
                                  t->info.name);
            src = cdst;
        }
        if (!to_host) {
            rc = d->ops->copy_h2d(d, dptr + out_off, src, out_len, &lc->ticket[slot]);
            if (rc) {
                ferry__fail(e, rc, "%s: tensor '%s': copy to device failed: %s", d->name,
                            t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
                break;
            }
            lc->pending[slot] = 1;
            add_stat(&f->a_bytes_copied, out_len);
        }
    }
    (void)rows;
    for (int s = 0; s < 2; s++) {
        int wrc = to_host ? 0 : wait_slot(d, lc, s);
        if (wrc && !rc)
            rc = ferry__fail(e, wrc, "%s: tensor '%s': copy to device failed: %s", d->name,
                             t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
    }
    return rc;
}

/* ---- jobs ------------------------------------------------------------------------------------- */

/* What a queued job fills (decided under the lock when it is queued). */
enum {
    FILL_HOST = 1,     /* read the pristine host copy */
    FILL_COMP = 2,     /* stage the copy the engine gets */
    FILL_POPULATE = 4, /* bring a zero-copy tensor's pages into the page cache, in bulk */
};


static int alloc_copy(ferry *f, ferry__copy *c, uint64_t head, ferry__err *e,
                      const ferry_tensor *t)
{
    if (c->mem.base) {
        c->ptr = (unsigned char *)c->mem.base + head;
        return 0;
    }
    ferry_device *d = f->devs[c->dev].d;
    void *p = NULL;
    int rc = d->ops->alloc(d, c->mem.size, &p);
    char msg[256];
    if (rc)
        return ferry__fail(e, rc, "%s: tensor '%s': cannot allocate %llu bytes: %s", d->name,
                           t->info.name, (unsigned long long)c->mem.size,
                           ferry__device_errmsg(d, msg, sizeof msg));
    c->mem.base = p;
    c->ptr = (unsigned char *)p + head;
    return 0;
}

static void lock_copy(ferry *f, int lock, ferry__copy *c, uint64_t len)
{
    if (!lock || !c->ptr || !host_side(f, c->dev) || !len)
        return;
    /* a refusal (RLIMIT_MEMLOCK) is counted, not an error: the copy works unlocked */
    if (ferry__host_lock(c->ptr, len, NULL) == 0) {
        c->locked = len;
        add_stat(&f->a_locked_bytes, len);
    } else {
        add_stat(&f->a_lock_failures, 1);
    }
}

static int run_job_inner(ferry *f, loader_ctx *lc, const ferry__job *j, ferry__err *e);

static int run_job(ferry *f, loader_ctx *lc, const ferry__job *j, ferry__err *e)
{
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    int rc = run_job_inner(f, lc, j, e);
    if (t0)
        ferry__trace_addf(f, j->prefetch ? "prefetch" : "load", t0, ferry__now(), "stage %s",
                          j->t->info.name);
    return rc;
}

/* Brings a zero-copy tensor's pages into the page cache and maps them, in order, with
 * MADV_POPULATE_READ (Linux 5.14): the kernel's readahead sees a sequential stream, as when each
 * page is touched once (which bench/load_bench measured faster than MAP_POPULATE, large preads or
 * O_DIRECT), and pages whose file bytes are gone (a truncated file) are an error instead of the
 * SIGBUS a touch would raise. Older kernels get buffered reads through a small buffer (the pages
 * then fault into the mapping at first use). No MADV_SEQUENTIAL: it lets the kernel drop pages
 * right after they are read (it cost 30%). Skipped when the range is already cached. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
static int populate(ferry *f, loader_ctx *lc, ferry_tensor *t, ferry__err *e)
{
    (void)lc;
    const ferry__iofile *file = t->file;
    if (!file->map || !t->info.nbytes ||
        ferry__iofile_cached(file, t->info.offset, t->info.nbytes) >= 0.98)
        return 0;
    uint64_t pg = ferry__io_page_size();
    uint64_t s = t->info.offset - t->info.offset % pg, end = t->info.offset + t->info.nbytes;
    int rc = 0;
    if (madvise((void *)(file->map + s), (size_t)(end - s), MADV_POPULATE_READ) == 0) {
        add_stat(&f->a_bytes_read, t->info.nbytes);
        return 0;
    }
    if (errno == EFAULT || errno == EIO) {
        rc = ferry__iofile_check(file, FERRY__PATH_NONE, e);
        return rc ? rc : ferry__fail(e, FERRY_EIO, "%s: tensor '%s': pages at offset %llu cannot "
                                     "be read", file->path, t->info.name,
                                     (unsigned long long)t->info.offset);
    }
    const uint64_t step = UINT64_C(1) << 20;
    unsigned char *buf = malloc(step);
    if (!buf)
        return 0; /* the pages fault in at first use */
    for (uint64_t off = 0; off < t->info.nbytes && !rc; off += step)
        rc = read_range(f, t, off, FERRY__MIN(step, t->info.nbytes - off), buf, FERRY_LOAD_READ,
                        1, e);
    free(buf);
    return rc;
}

static int run_job_inner(ferry *f, loader_ctx *lc, const ferry__job *j, ferry__err *e)
{
    ferry_tensor *t = j->t;
    int fill = j->fill;
    if (fill & FILL_POPULATE) {
        int rc = populate(f, lc, t, e);
        if (rc || fill == FILL_POPULATE)
            return rc;
    }
    int rc = 0;
    if (fill & FILL_HOST) {
        rc = alloc_copy(f, &t->host, t->info.offset % FERRY__IO_ALIGN, e, t);
        if (!rc)
            rc = read_range(f, t, 0, t->info.nbytes, t->host.ptr, j->load, 1, e);
        if (!rc)
            lock_copy(f, j->lock, &t->host, t->info.nbytes);
        if (rc)
            return rc;
    }
    if (fill & FILL_COMP) {
        uint64_t head = host_side(f, t->comp.dev) && !j->transformed
                            ? t->info.offset % FERRY__IO_ALIGN : 0;
        rc = alloc_copy(f, &t->comp, head, e, t);
        if (rc)
            return rc;
        /* The host copy is READY (permanent, or filled just above) or absent; a mapped one is
         * read through the descriptor. */
        int have = t->host.state == FERRY__READY || (fill & FILL_HOST);
        int mapped = have && t->host.mapped;
        const unsigned char *src = have && !mapped ? t->host.ptr : NULL;
        rc = transfer(f, lc, t, j, src, mapped, j->load, &t->comp, e);
        if (!rc && t->comp.permanent)
            lock_copy(f, j->lock, &t->comp, j->out_bytes);
    }
    return rc;
}

/* Makes mapping-backed copies READY; decides which copies a job must fill. Lock held.
 *
 * On a host-side compute device an untransformed tensor has one copy, comp, which is its home
 * (host) or a cached copy (disk). Everywhere else — an accelerator, or a LoRA merge — comp is a
 * staged copy filled from the home copy (host: the pristine `host` copy or the mapping) or from the
 * file (disk, device). A merged copy is never permanent: a new epoch re-stages it. */
static int needs(ferry *f, ferry_tensor *t, int home_only)
{
    int fill = 0;
    const ferry__iofile *file = t->file;
    unsigned char *mapped = file->map ? (unsigned char *)file->map + t->info.offset : NULL;
    ferry_home home = ferry__effective_home(f, t);
    int dev = t->compute_dev, hs = host_side(f, dev);
    if (t->lazy) {
        if (t->comp.state == FERRY__EMPTY) {
            t->comp.state = FERRY__READY;
            t->comp.ptr = mapped;
            t->comp.mapped = t->comp.permanent = 1;
            t->comp.dev = FERRY__HOST;
            ferry__iofile_advise(file, t->info.offset, t->info.nbytes, MADV_RANDOM);
        }
        return 0;
    }
    if (hs && !t->merge) {
        if (t->comp.state != FERRY__EMPTY)
            return 0;
        t->comp.dev = FERRY__HOST;
        if (home == FERRY_HOME_HOST && t->host.state == FERRY__READY && !t->host.mapped &&
            !ferry__transformed(t)) {
            /* No longer merged: the pristine host copy is the home again, no read needed. */
            t->comp = t->host;
            memset(&t->host, 0, sizeof t->host);
            return 0;
        }
        if (home == FERRY_HOME_HOST) {
            if (t->zero_copy) {
                t->comp.state = FERRY__READY;
                t->comp.ptr = mapped;
                t->comp.mapped = t->comp.permanent = 1;
                lock_copy(f, ferry__policy_of(f, t)->lock && !t->lazy, &t->comp, t->info.nbytes);
                return t->populated ? 0 : FILL_POPULATE;
            }
            t->comp.permanent = 1;
            return FILL_COMP;
        }
        return home_only ? 0 : FILL_COMP; /* home disk: a cached copy */
    }
    if (home == FERRY_HOME_HOST && t->host.state == FERRY__EMPTY) {
        t->host.dev = FERRY__HOST;
        t->host.permanent = 1;
        if (t->zero_copy) {
            t->host.state = FERRY__READY;
            t->host.ptr = mapped;
            t->host.mapped = 1;
            lock_copy(f, ferry__policy_of(f, t)->lock && !t->lazy, &t->host, t->info.nbytes);
            if (!t->populated)
                fill |= FILL_POPULATE;
        } else {
            fill |= FILL_HOST;
        }
    }
    if (t->comp.state == FERRY__EMPTY) {
        t->comp.dev = hs ? FERRY__HOST : dev;
        t->comp.permanent = home == FERRY_HOME_DEVICE && !t->merge;
        if (!home_only || t->comp.permanent)
            fill |= FILL_COMP;
    }
    return fill;
}

static ferry__job *job_new(ferry *f)
{
    ferry__job *j = f->free_jobs;
    if (j) {
        f->free_jobs = j->next;
        memset(j, 0, sizeof *j);
        return j;
    }
    return calloc(1, sizeof(ferry__job));
}

static void job_recycle(ferry *f, ferry__job *j)
{
    free(j->terms);
    free(j->scales);
    j->terms = NULL;
    j->scales = NULL;
    j->n_terms = 0;
    j->next = f->free_jobs;
    f->free_jobs = j;
}

/* Queues a job bringing T to where it is used (or, with HOME_ONLY, to its home). MIN_DIST: only
 * cached copies used later than this may be evicted for it (prefetch); 0 for demand loads.
 * Lock held. Returns 0 (queued or nothing to do) or FERRY_EBUDGET / FERRY_ENOMEM. */
static int enqueue(ferry *f, ferry_tensor *t, int home_only, int prefetch, uint64_t min_dist)
{
    if (f->closing)
        return ferry__fail(&f->err, FERRY_ECANCELED, "manager is closing");
    int fill = needs(f, t, home_only);
    if (t->populating)
        fill &= ~FILL_POPULATE; /* one populate job at a time */
    if (!fill)
        return 0;
    ferry__mem hm = {0}, cm = {0};
    int rc = 0, host_refused = 0;
    if (fill & FILL_HOST) {
        rc = ferry__reserve(f, FERRY__HOST, ferry__host_alloc_size(t, 0), min_dist, &hm);
        host_refused = rc == FERRY_EBUDGET;
    }
    if (!rc && (fill & FILL_COMP)) {
        int dev = t->comp.dev;
        uint64_t size = host_side(f, dev) ? ferry__host_alloc_size(t, ferry__transformed(t))
                                          : ferry__dev_alloc_size(t);
        rc = ferry__reserve(f, dev, size, min_dist, &cm);
        host_refused = rc == FERRY_EBUDGET && host_side(f, dev);
    }
    ferry__job *j = rc ? NULL : job_new(f);
    if (j && (fill & FILL_COMP) && t->merge && ferry__lora_snapshot(f, t, j)) {
        job_recycle(f, j);
        j = NULL;
    }
    if (host_refused && t->auto_private) {
        /* load AUTO chose a private copy because the bytes are not cached, and the host budget
         * has no room for it: the mapping serves it as it would have, cached or not */
        f->err.code = 0;
        f->err.msg[0] = 0;
        ferry__unreserve(f, FERRY__HOST, &hm);
        if (fill & FILL_HOST)
            t->host.permanent = 0;
        t->auto_private = 0;
        t->zero_copy = 1;
        return enqueue(f, t, home_only, prefetch, min_dist);
    }
    if (rc || !j) {
        if (!rc)
            rc = ferry__fail(&f->err, FERRY_ENOMEM, "out of memory queuing a load");
        else if (!prefetch)
            ferry__fail_append(&f->err, 0, "while loading tensor '%s' (%llu bytes)",
                               t->info.name, (unsigned long long)t->out_bytes);
        ferry__unreserve(f, FERRY__HOST, &hm);
        ferry__unreserve(f, t->comp.dev, &cm);
        if (fill & FILL_HOST)
            t->host.permanent = 0;
        return rc;
    }
    if (fill & FILL_HOST) {
        t->host.mem = hm;
        t->host.state = FERRY__LOADING;
    }
    if (fill & FILL_COMP) {
        t->comp.mem = cm;
        t->comp.state = FERRY__LOADING;
        t->comp.status = 0;
    }
    if (fill & FILL_POPULATE)
        t->populating = 1;
    t->load_gen++;
    t->used = 1;
    t->failed_prefetch = 0;
    j->epoch = f->lora_epoch;
    j->out_dtype = t->out_dtype;
    j->out_bytes = t->out_bytes;
    j->transformed = ferry__transformed(t);
    j->load = ferry__policy_of(f, t)->load;
    j->lock = ferry__policy_of(f, t)->lock && !t->lazy;
    j->t = t;
    j->prefetch = prefetch;
    j->fill = fill;
    j->next = NULL;
    if (f->queue_tail)
        f->queue_tail->next = j;
    else
        f->queue_head = j;
    f->queue_tail = j;
    if (prefetch)
        f->inflight_prefetch++;
    pthread_cond_signal(&f->work);
    return 0;
}

/* Where the tensor ID stands for the prefetch planner (sched/prefetch.h). */
static ferry__pf_state pf_probe(void *ctx, uint32_t id, uint64_t *bytes)
{
    ferry *f = ctx;
    if (id >= f->n_all)
        return FERRY__PF_STOP;
    ferry_tensor *t = f->all[id];
    if (!t->bound) {
        /* unbound since an adapter or rule change: decide before queuing anything */
        ferry__err saved = f->err;
        int brc = ferry__bind(f, t->parent ? t->parent : t);
        f->err = saved;
        if (brc)
            return FERRY__PF_SKIP;
    }
    if (t->removed || t->ignored || t->lazy || t->n_parts || (t->parent && t->parent->ignored) ||
        (t->group >= 0 && f->groups[t->group].removing))
        return FERRY__PF_SKIP;
    if (t->comp.state == FERRY__READY && !t->comp.ahead)
        return FERRY__PF_KEPT;
    *bytes = t->out_bytes;
    return t->comp.state == FERRY__EMPTY ? FERRY__PF_ABSENT : FERRY__PF_AHEAD;
}

/* Queues a prefetch of ID, evicting only copies used later than K prepares from now. */
static int pf_queue(void *ctx, uint32_t id, size_t k)
{
    ferry *f = ctx;
    unsigned before = f->inflight_prefetch;
    ferry__err saved = f->err;
    int rc = enqueue(f, f->all[id], 0, 1, k);
    f->err = saved; /* a hint that does not fit is no error */
    return rc ? -1 : f->inflight_prefetch > before;
}

/* Queues prefetches of what the schedule says comes next, within a window of the last prepared
 * set's bytes (the W of "M - B + W": it hides the reads behind the compute of the current set). */
static void prefetch_ahead(ferry *f)
{
    if (f->closing || f->inflight_prefetch >= FERRY__MAX_PREFETCH)
        return;
    ferry__pf_limits lim = {.window = f->last_set_bytes,
                            .scan = FERRY__PREFETCH_SCAN,
                            .slots = FERRY__MAX_PREFETCH - f->inflight_prefetch};
    ferry__prefetch_plan(&f->sched, lim, pf_probe, pf_queue, f);
}

static void drop_if_unkept(ferry *f, ferry_tensor *t);

static void release_one(ferry *f, ferry_tensor *t)
{
    t->refs--;
    t->comp.last_use = ++f->clock;
    drop_if_unkept(f, t);
}

static void finish_job(ferry *f, ferry__job *j, int fill, int rc, const ferry__err *e)
{
    ferry_tensor *t = j->t;
    if (j->prefetch)
        f->inflight_prefetch--;
    if (fill & FILL_POPULATE) {
        /* The mapping works without it: a failed populate leaves the pages to fault in. */
        t->populating = 0;
        t->populated = 1;
        if (fill == FILL_POPULATE) {
            if (rc && !f->err.code)
                f->err = *e;
            return;
        }
    }
    if (rc) {
        if (fill & FILL_COMP) {
            ferry__unreserve(f, t->comp.dev, &t->comp.mem);
            int dev = t->comp.dev;
            memset(&t->comp, 0, sizeof t->comp);
            t->comp.dev = dev;
            t->comp.status = rc;
            t->failed_prefetch = j->prefetch;
        }
        if (fill & FILL_HOST) {
            if (t->host.locked)
                ferry__host_unlock(t->host.ptr, t->host.locked);
            ferry__unreserve(f, FERRY__HOST, &t->host.mem);
            memset(&t->host, 0, sizeof t->host);
        }
        /* A prefetch's failure is no one's error unless a prepare waits for it (then the
         * prepare retries it as its own load). */
        if (!j->prefetch)
            f->err = *e;
    } else {
        if (fill & FILL_HOST)
            t->host.state = FERRY__READY;
        if (fill & FILL_COMP) {
            t->comp.state = FERRY__READY;
            t->comp.ahead = j->prefetch;
            t->comp.last_use = ++f->clock;
            t->comp.epoch = j->epoch;
            t->comp.merged = j->n_terms > 0;
            /* The adapter set changed while this ran: the copy is of the old epoch. */
            if (j->epoch != f->lora_epoch && (t->comp.merged || t->merge || t->n_terms))
                t->stale = 1;
            /* On the host, an unmerged home copy made from the pristine host copy makes that
             * one redundant (it was kept for merges). */
            if (t->comp.permanent && !t->comp.merged && t->host.state == FERRY__READY &&
                host_side(f, t->comp.dev) && !t->stale)
                ferry__drop_copy(f, t, &t->host);
        }
    }
    /* Decided under an older adapter set, or loaded for a prepare that has since failed. A
     * prefetched copy waits for the prepare it was fetched for (dropping it here would let the
     * next prefetch fetch it again, forever). */
    ferry__evictable_note(f, t);
    if (!t->refs && (!j->prefetch || t->stale))
        drop_if_unkept(f, t);
}

static void *loader_main(void *arg)
{
    ferry *f = arg;
    loader_ctx lc = {0};
    ferry__err *e = malloc(sizeof *e);
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->queue_head && !f->closing)
            pthread_cond_wait(&f->work, &f->lock);
        ferry__job *j = f->queue_head;
        if (!j)
            break; /* closing and drained */
        f->queue_head = j->next;
        if (!f->queue_head)
            f->queue_tail = NULL;
        int fill = j->fill;
        int rc;
        if (f->closing || !e) {
            rc = FERRY_ECANCELED;
            if (e)
                ferry__fail(e, rc, "tensor '%s': load cancelled (closing)", j->t->info.name);
        } else {
            f->running++;
            pthread_mutex_unlock(&f->lock);
            ferry__err_clear(e);
            rc = run_job(f, &lc, j, e);
            pthread_mutex_lock(&f->lock);
            f->running--;
        }
        ferry__err fallback = {.code = FERRY_ENOMEM, .msg = "out of memory"};
        finish_job(f, j, fill, rc, e ? e : &fallback);
        int was_prefetch = j->prefetch;
        job_recycle(f, j);
        if (!f->running && f->n_adapters)
            ferry__lora_sweep(f);
        pthread_cond_broadcast(&f->cond);
        if (was_prefetch && !rc)
            prefetch_ahead(f);
    }
    pthread_mutex_unlock(&f->lock);
    ctx_free(&lc);
    free(e);
    return NULL;
}

/* Loaders: as many as I/O workers (at least 2), and at least FERRY__DEVICE_LOADERS once a device
 * the host cannot read is added (ferry__loaders_for_device). Each loader has one tensor in flight
 * at a time and, copying to a device, waits for its last chunks before it takes the next tensor:
 * with 2 loaders a sim link at 2 GB/s idled 3-5 ms at every layer (2 GiB model, device budget
 * M/4: 1.02 s a pass with 2 loaders, 0.95 s with 4). Host-only managers keep fewer: with 4, a
 * warm private copy of the 2 GiB model ran at 0.78-0.99 of its limit against 0.79-0.98 with 2
 * (medians 0.80 and 0.88; the loaders' mmap and munmap contend with the page faults of the copies). */
#define FERRY__DEVICE_LOADERS 4u

static int loaders_add(ferry *f, unsigned want)
{
    for (unsigned i = f->n_loaders; i < want && i < f->cap_loaders; i++) {
        if (pthread_create(&f->loaders[i], NULL, loader_main, f) != 0)
            return FERRY_ENOMEM;
        f->n_loaders = i + 1;
    }
    return 0;
}

int ferry__loaders_start(ferry *f)
{
    unsigned n = f->opt.io_threads < 2 ? 2 : f->opt.io_threads;
    f->cap_loaders = n < FERRY__DEVICE_LOADERS ? FERRY__DEVICE_LOADERS : n;
    f->loaders = calloc(f->cap_loaders, sizeof *f->loaders);
    if (!f->loaders)
        return FERRY_ENOMEM;
    return loaders_add(f, n);
}

void ferry__loaders_for_device(ferry *f)
{
    /* a refusal only costs speed: the loaders already there do the work */
    (void)loaders_add(f, FERRY__DEVICE_LOADERS);
}

void ferry__loaders_stop(ferry *f)
{
    if (!f->loaders)
        return;
    pthread_mutex_lock(&f->lock);
    f->closing = 1;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->lock);
    for (unsigned i = 0; i < f->n_loaders; i++)
        pthread_join(f->loaders[i], NULL);
    free(f->loaders);
    f->loaders = NULL;
    while (f->free_jobs) {
        ferry__job *j = f->free_jobs;
        f->free_jobs = j->next;
        free(j);
    }
}

/* ---- the public residency calls ------------------------------------------------------------- */

/* Checks a tensor handle given by the engine. Lock held. */
static int usable(ferry *f, ferry_tensor *t)
{
    if (!t)
        return ferry__fail(&f->err, FERRY_EINVAL, "NULL tensor");
    if (t->removed)
        return ferry__fail(&f->err, FERRY_ENOENT, "tensor '%s': its group was removed",
                           t->info.name);
    int rc = ferry__bind(f, t);
    if (rc)
        return rc;
    if (t->ignored)
        return ferry__fail(&f->err, FERRY_ENOENT, "tensor '%s' is ignored by policy",
                           t->info.name);
    if (t->group >= 0 && f->groups[t->group].removing)
        return ferry__fail(&f->err, FERRY_EBUSY, "tensor '%s': its group '%s' is being removed",
                           t->info.name, f->groups[t->group].name);
    return ferry__check_expect(f, t);
}

/* ---- group loads through arenas (arena.c) ----------------------------------------------------- */

/* Which copy of T a load reads from its file, as it is, into private host memory (as needs()
 * decides): FERRY__ARENA_COMP, FERRY__ARENA_HOST, or 0 for none. Only for direct reads: a
 * buffered read copies out of the page cache faster than fresh huge pages fault in (measured:
 * ferry bench's warm private copy fell from 0.86 to 0.40 of its limit with an arena). */
static int file_copy(ferry *f, ferry_tensor *t)
{
    ferry_load load = ferry__policy_of(f, t)->load;
    if (t->lazy || t->zero_copy || t->parent || t->n_parts ||
        (load != FERRY_LOAD_DIRECT && load != FERRY_LOAD_AUTO) ||
        ferry__effective_home(f, t) != FERRY_HOME_HOST)
        return 0;
    if (host_side(f, t->compute_dev) && !t->merge)
        return t->comp.state == FERRY__EMPTY && t->host.state == FERRY__EMPTY &&
                       !ferry__transformed(t)
                   ? FERRY__ARENA_COMP
                   : 0;
    return t->host.state == FERRY__EMPTY ? FERRY__ARENA_HOST : 0;
}

static void arena_span(const ferry_tensor *t, ferry_load *mode, uint64_t *bytes)
{
    *mode = ferry__policy_of(t->owner, t)->load;
    *bytes = ferry__host_alloc_size(t, 0);
}

/* Marks the file copy of A's tensor I LOADING at its place, as enqueue does for a job (the same
 * reservation against the budget, the same states); 1 when claimed, 0 when the tensor needs
 * something else or does not fit (then bring_wait queues a job for it, which reports what). */
static int arena_claim(ferry *f, ferry__arena *a, size_t i)
{
    ferry_tensor *t = a->ts[i];
    int want = t->arena_copy == FERRY__ARENA_COMP ? FILL_COMP : FILL_HOST;
    if (f->closing || t->populating || needs(f, t, 1) != want)
        return 0;
    ferry__copy *c = want == FILL_COMP ? &t->comp : &t->host;
    ferry__mem m;
    ferry__err saved = f->err;
    if (ferry__reserve_bytes(f, FERRY__HOST, ferry__host_alloc_size(t, 0), &m)) {
        f->err = saved;
        return 0;
    }
    ferry__arena_place(a, i, &m);
    if (want == FILL_HOST)
        a->claimed[i] |= FERRY__CLAIMED_HOST;
    if (ferry__policy_of(f, t)->lock)
        a->claimed[i] |= FERRY__CLAIMED_LOCK;
    c->mem = m;
    c->ptr = (unsigned char *)m.base + t->info.offset % FERRY__IO_ALIGN;
    c->state = FERRY__LOADING;
    c->status = 0;
    t->load_gen++;
    t->used = 1;
    t->failed_prefetch = 0;
    return 1;
}

/* A chunk of a read arrived: progress in file bytes, at most the read's tensor bytes. */
static void arena_chunk_read(void *ud, uint64_t bytes)
{
    ferry__arena_read *r = ud;
    ferry__arena_load *L = r->load;
    pthread_mutex_lock(&L->m);
    uint64_t before = FERRY__MIN(r->chunk_bytes, r->bytes);
    r->chunk_bytes += bytes;
    L->done_bytes += FERRY__MIN(r->chunk_bytes, r->bytes) - before;
    pthread_cond_signal(&L->c);
    pthread_mutex_unlock(&L->m);
}

static void arena_read_done(void *ud, int status)
{
    ferry__arena_read *r = ud;
    ferry__arena_load *L = r->load;
    pthread_mutex_lock(&L->m);
    r->status = status;
    r->done = 1;
    if (!status)
        L->done_bytes += r->bytes - FERRY__MIN(r->chunk_bytes, r->bytes);
    L->reads_left--;
    pthread_cond_signal(&L->c); /* every one: the waiter reports progress */
    pthread_mutex_unlock(&L->m);
}

/* ---- progress and cancellation (ferry_set_progress) ------------------------------------------- */

/* One call's progress: which of its units had bytes to bring when it began, and how many. */
typedef struct load_progress {
    ferry_progress_fn fn;     /* NULL: nothing to report */
    void *ud;
    unsigned char *todo;      /* todo[i]: unit i counts */
    uint64_t total, reported;
    int calls;
    int canceled;
} load_progress;

static int unit_ready(const ferry_tensor *t, int home_only)
{
    const ferry__copy *c = home_only && t->host.permanent ? &t->host : &t->comp;
    return c->state == FERRY__READY && !t->populating;
}

/* Lock held. Leaves P->fn NULL when no callback is set or nothing is to be loaded. */
static void progress_begin(ferry *f, load_progress *p, ferry_tensor *const *ts, size_t n,
                           int home_only)
{
    memset(p, 0, sizeof *p);
    if (!f->progress || !n || !(p->todo = calloc(n, 1)))
        return;
    for (size_t i = 0; i < n; i++)
        if (!unit_ready(ts[i], home_only) && !ts[i]->lazy) {
            p->todo[i] = 1;
            p->total += ts[i]->out_bytes;
        }
    if (p->total) {
        p->fn = f->progress;
        p->ud = f->progress_ud;
    }
}

static void progress_end(load_progress *p)
{
    free(p->todo);
    p->todo = NULL;
}

/* Calls the callback with DONE (when it moved, or first), without the lock (dropped and taken
 * again when LOCKED); 1 when it asks to cancel. */
static int progress_report(ferry *f, load_progress *p, uint64_t done, int locked)
{
    if (!p->fn || p->canceled || (p->calls && done <= p->reported))
        return p->canceled;
    p->reported = done;
    p->calls++;
    if (locked)
        pthread_mutex_unlock(&f->lock);
    int stop = p->fn(p->ud, done, p->total) != 0;
    if (locked)
        pthread_mutex_lock(&f->lock);
    p->canceled = stop;
    return stop;
}

static uint64_t progress_done(const load_progress *p, ferry_tensor *const *ts, size_t n,
                              int home_only, const uint64_t *seen)
{
    uint64_t done = 0;
    for (size_t i = 0; i < n; i++)
        if (p->todo[i] && (unit_ready(ts[i], home_only) || seen[i] == UINT64_MAX))
            done += ts[i]->out_bytes;
    return done;
}

/* Takes the queued (not started) jobs of TS off the queue, as failed with FERRY_ECANCELED: their
 * copies go back to EMPTY and their memory to the budget. Lock held. */
static void cancel_queued(ferry *f, ferry_tensor *const *ts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ts[i]->canceling = 1;
    ferry__job **pp = &f->queue_head, *prev = NULL;
    ferry__err saved = f->err;
    while (*pp) {
        ferry__job *j = *pp;
        if (!j->t->canceling) {
            prev = j;
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (f->queue_tail == j)
            f->queue_tail = prev;
        ferry__err e;
        ferry__fail(&e, FERRY_ECANCELED, "tensor '%s': load cancelled", j->t->info.name);
        finish_job(f, j, j->fill, FERRY_ECANCELED, &e);
        job_recycle(f, j);
    }
    f->err = saved;
    for (size_t i = 0; i < n; i++)
        ts[i]->canceling = 0;
    pthread_cond_broadcast(&f->cond);
}

static int canceled_fail(ferry *f, const load_progress *p)
{
    char a[32], b[32];
    return ferry__fail(&f->err, FERRY_ECANCELED,
                       "load cancelled by the progress callback after %s of %s",
                       ferry__fmt_size(p->reported, a), ferry__fmt_size(p->total, b));
}

/* Issues every read of L's arenas at once on the I/O pool and waits for them; then locks the
 * copies whose policy asks for it. Lock not held: the claimed copies are LOADING, this load's. */
static void arena_read(ferry *f, ferry__arena_load *L, load_progress *p)
{
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    pthread_mutex_init(&L->m, NULL);
    pthread_cond_init(&L->c, NULL);
    L->reads_left = 0;
    L->done_bytes = 0;
    for (ferry__arena *a = L->list; a; a = a->next)
        for (size_t k = 0; k < a->n_reads; k++) {
            ferry__arena_read *r = &a->reads[k];
            r->req.done = arena_read_done;
            r->req.ud = r;
            r->load = L;
            r->req.chunk_read = arena_chunk_read;
            r->done = 0;
            r->bytes = 0;
            r->chunk_bytes = 0;
            for (size_t i = r->first; i < r->end; i++)
                if (a->claimed[i])
                    r->bytes += a->ts[i]->out_bytes;
            pthread_mutex_lock(&L->m);
            L->reads_left++;
            pthread_mutex_unlock(&L->m);
            /* a read may complete (and set its status) before submit returns */
            int refused = ferry__io_submit(f->io, &r->req);
            if (refused) {
                pthread_mutex_lock(&L->m);
                r->status = refused;
                L->reads_left--;
                pthread_mutex_unlock(&L->m);
            }
        }
    pthread_mutex_lock(&L->m);
    uint64_t shown = UINT64_MAX;
    while (L->reads_left) {
        uint64_t done = L->done_bytes;
        if (p && p->fn && !p->canceled && done != shown) {
            shown = done;
            pthread_mutex_unlock(&L->m);
            if (progress_report(f, p, done, 0)) {
                /* the reads not started are dropped; those running finish (and are valid) */
                for (ferry__arena *a = L->list; a; a = a->next)
                    for (size_t k = 0; k < a->n_reads; k++)
                        ferry__io_cancel_req(f->io, &a->reads[k].req);
            }
            pthread_mutex_lock(&L->m);
            continue;
        }
        pthread_cond_wait(&L->c, &L->m);
    }
    pthread_mutex_unlock(&L->m);
    pthread_cond_destroy(&L->c);
    pthread_mutex_destroy(&L->m);
    for (ferry__arena *a = L->list; a; a = a->next)
        for (size_t k = 0; k < a->n_reads; k++) {
            ferry__arena_read *r = &a->reads[k];
            if (r->status)
                continue;
            add_stat(&f->a_bytes_read, r->req.len);
            for (size_t i = r->first; i < r->end; i++) {
                ferry_tensor *t = a->ts[i];
                ferry__copy *c = a->claimed[i] & FERRY__CLAIMED_HOST ? &t->host : &t->comp;
                if (a->claimed[i])
                    lock_copy(f, a->claimed[i] & FERRY__CLAIMED_LOCK, c, t->info.nbytes);
            }
            if (t0)
                ferry__trace_addf(f, "io", t0, ferry__now(), "read %s and on",
                                  a->ts[r->first]->info.name);
        }
}

/* Makes the claimed copies READY, or EMPTY with the error when their read failed (their pages
 * given back); the first failure becomes the manager's message and the return value. As
 * finish_job does for a job's copy: a copy whose adapter set changed while it was read is stale,
 * and one nobody holds is dropped if its tensor no longer wants it. Lock held. */
static int arena_settle(ferry *f, ferry__arena_load *L)
{
    int rc = 0;
    for (ferry__arena *a = L->list; a; a = a->next)
        for (size_t k = 0; k < a->n_reads; k++) {
            const ferry__arena_read *r = &a->reads[k];
            for (size_t i = r->first; i < r->end; i++) {
                ferry_tensor *t = a->ts[i];
                if (!a->claimed[i])
                    continue;
                ferry__copy *c = a->claimed[i] & FERRY__CLAIMED_HOST ? &t->host : &t->comp;
                if (!r->status) {
                    c->state = FERRY__READY;
                    c->last_use = ++f->clock;
                    c->epoch = a->epoch;
                    ferry__evictable_note(f, t);
                    if (a->epoch != f->lora_epoch && (t->merge || t->n_terms))
                        t->stale = 1;
                    if (!t->refs)
                        drop_if_unkept(f, t);
                    continue;
                }
                ferry__arena_trim(c->ptr, t->info.nbytes); /* never locked: its read failed */
                ferry__unreserve(f, FERRY__HOST, &c->mem);
                memset(c, 0, sizeof *c);
                c->dev = FERRY__HOST;
                c->status = r->status;
                if (!rc) {
                    /* name the tensor whose bytes the failed read was to bring */
                    for (size_t j = r->first; j < r->end; j++)
                        if (a->claimed[j] && a->ts[j]->info.offset + a->ts[j]->info.nbytes >
                                                 r->req.err_offset) {
                            t = a->ts[j];
                            break;
                        }
                    rc = ferry__fail(&f->err, r->status, "tensor '%s': %s", t->info.name,
                                     r->req.errmsg[0] ? r->req.errmsg
                                                      : ferry_strerror(r->status));
                    ferry__fail_append(&f->err, 0, "(one read of %llu bytes for %zu tensors)",
                                       (unsigned long long)r->req.len, r->end - r->first);
                }
            }
        }
    pthread_cond_broadcast(&f->cond);
    return rc;
}

static int bring_wait(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                      int from_prepare, load_progress *p);

/* Waits until every tensor of TS has its comp copy READY, queuing loads as needed. Lock held.
 * Each tensor already holds a reference (so nothing of the set is evicted meanwhile). A group
 * load (HOME_ONLY, not FROM_PREPARE) first reads the private host copies of runs of neighbouring
 * tensors as whole ranges of their files into arenas, on the I/O pool, while the calling thread
 * waits without the lock; what is left goes through jobs as in any other load. */
static int bring_arena(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                       int from_prepare, load_progress *p);

static int bring(ferry *f, ferry_tensor *const *ts, size_t n, int home_only, int from_prepare)
{
    load_progress p;
    progress_begin(f, &p, ts, n, home_only);
    progress_report(f, &p, 0, 1);
    int rc = bring_arena(f, ts, n, home_only, from_prepare, &p);
    if (!rc && p.canceled)
        rc = canceled_fail(f, &p);
    progress_end(&p);
    return rc;
}

static int bring_arena(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                       int from_prepare, load_progress *p)
{
    if (!home_only || from_prepare || n < 2 || p->canceled)
        return p->canceled ? 0 : bring_wait(f, ts, n, home_only, from_prepare, p);
    ferry__arena *list = NULL;
    for (size_t i = 0; i < n; i++)
        if (!ts[i]->arena) /* else another group load is reading it */
            ts[i]->arena_copy = file_copy(f, ts[i]);
    ferry__arena_plan(ts, n, arena_span, &list);
    int reads = 0, rc = 0;
    for (ferry__arena *a = list; a; a = a->next) {
        a->epoch = f->lora_epoch;
        for (size_t i = 0; i < a->n; i++)
            arena_claim(f, a, i);
        ferry__arena_ranges(a);
        reads |= a->n_reads > 0;
    }
    ferry__arena_load L;
    ferry__arena_begin(&L, list, reads);
    if (reads) {
        pthread_mutex_unlock(&f->lock);
        arena_read(f, &L, p);
        ferry__arena_stop(&L);
        pthread_mutex_lock(&f->lock);
        rc = arena_settle(f, &L);
        if (p->canceled) {
            rc = 0; /* reported as the cancellation by bring */
            ferry__err_clear(&f->err);
        }
    }
    if (!rc && !p->canceled)
        rc = bring_wait(f, ts, n, home_only, from_prepare, p);
    ferry__arena_end(&L);
    return rc;
}

static int bring_wait(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                      int from_prepare, load_progress *p)
{
    uint64_t local[64];
    uint64_t *seen = n <= 64 ? local : calloc(n, sizeof *seen);
    if (!seen)
        return ferry__fail(&f->err, FERRY_ENOMEM, "out of memory");
    memset(seen, 0, FERRY__MIN(n, 64) * sizeof *seen);
    int rc = 0, prefetched = 0;
    double waited = 0;
    for (size_t i = 0; i < n && from_prepare; i++) {
        /* Only copies that come and go can hit or miss. */
        ferry_tensor *t = ts[i];
        int mapped = t->lazy || (t->zero_copy && host_side(f, t->compute_dev) && !t->merge);
        if (mapped || t->comp.permanent || t->comp.mapped)
            continue;
        if (t->comp.state == FERRY__EMPTY)
            f->stats.prefetch_misses++;
        else
            f->stats.prefetch_hits++;
    }
    for (;;) {
        int pending = 0, again = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            ferry_tensor *t = ts[i];
            ferry__copy *c = home_only && t->host.permanent ? &t->host : &t->comp;
            if (!home_only && t->stale && t->refs == 1 && t->comp.state == FERRY__READY) {
                /* Staged under an adapter set that has changed since, and held by no one else
                 * (the one reference is this prepare's): stage it again. */
                ferry__drop_copy(f, t, &t->comp);
                t->stale = 0;
                t->bound = 0;
                if ((rc = ferry__bind(f, t->parent ? t->parent : t)) != 0)
                    break;
                seen[i] = 0;
            }
            if ((c->state == FERRY__READY && !t->populating) || seen[i] == UINT64_MAX)
                continue;
            if (c->state == FERRY__LOADING || t->host.state == FERRY__LOADING || t->populating) {
                seen[i] = t->load_gen;
                pending = 1;
                continue;
            }
            if (seen[i] && seen[i] == t->load_gen && !t->failed_prefetch) {
                rc = t->comp.status ? t->comp.status : FERRY_EIO;
                break;
            }
            uint64_t gen = t->load_gen;
            rc = enqueue(f, t, home_only, 0, 0);
            if (rc == FERRY_EBUDGET && f->fences) {
                /* the room is held by releases waiting on the engine's events: wait for the
                 * oldest (without the lock), then try again */
                ferry__err_clear(&f->err);
                ferry__fences_wait_oldest(f);
                rc = 0;
                again = 1;
                break;
            }
            if (rc)
                break;
            if (t->load_gen == gen && home_only) {
                seen[i] = UINT64_MAX; /* nothing to load: lives on disk or in the mapping */
                continue;
            }
            seen[i] = t->load_gen;
            if (t->comp.state == FERRY__LOADING || t->host.state == FERRY__LOADING ||
                t->populating)
                pending = 1;
        }
        if (again)
            continue; /* the states may have changed while the lock was dropped */
        if (!rc && p->fn) {
            uint64_t before = p->reported;
            int calls = p->calls;
            if (progress_report(f, p, progress_done(p, ts, n, home_only, seen), 1)) {
                cancel_queued(f, ts, n);
                rc = canceled_fail(f, p);
                break;
            }
            if (p->calls != calls && p->reported != before)
                continue; /* the lock was dropped: look again before waiting */
        }
        if (rc || !pending)
            break;
        /* What this set needs is queued: the next set's prefetch goes behind it, so the copy
         * engine and the disk stay busy while this set's last bytes arrive. */
        if (from_prepare && !prefetched++)
            prefetch_ahead(f);
        double t0 = ferry__now();
        pthread_cond_wait(&f->cond, &f->lock);
        double t1 = ferry__now();
        waited += t1 - t0;
        ferry__trace_add(f, "wait", "wait", t0, t1);
    }
    if (rc) {
        /* The set's other loads still in flight settle before the failure is returned: one that
         * failed later would otherwise replace this call's message after it returned (a data
         * race with the caller reading ferry_errmsg). The message stays this failure's. */
        ferry__err first = f->err;
        for (int busy = 1; busy && !f->closing;) {
            busy = 0;
            for (size_t i = 0; i < n && !busy; i++)
                busy = ts[i]->comp.state == FERRY__LOADING ||
                       ts[i]->host.state == FERRY__LOADING || ts[i]->populating;
            if (busy)
                pthread_cond_wait(&f->cond, &f->lock);
        }
        f->err = first;
    }
    f->stats.wait_seconds += waited;
    if (seen != local)
        free(seen);
    return rc;
}

/* The residency units of TS: each split tensor's parts in its place. *OUT is TS itself when nothing
 * is split, else a malloc'd array the caller frees. Lock held; tensors bound. */
static int expand(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor ***out, size_t *nout)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += ts[i]->n_parts ? (size_t)ts[i]->n_parts : 1;
    if (total == n) {
        *out = (ferry_tensor **)ts;
        *nout = n;
        return 0;
    }
    ferry_tensor **u = malloc(total * sizeof *u);
    if (!u)
        return ferry__fail(&f->err, FERRY_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ts[i]->n_parts)
            u[k++] = ts[i];
        for (int p = 0; p < ts[i]->n_parts; p++)
            u[k++] = ts[i]->parts[p];
    }
    *out = u;
    *nout = total;
    return 0;
}

int ferry__prepare_begin(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor ***out,
                         size_t *nout)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = usable(f, ts[i]);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    if (!rc)
        rc = expand(f, ts, n, &u, &nu);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        ts[i]->used = 1;
        f->stats.prepares++;
        if (ts[i]->n_parts)
            ts[i]->refs++;
    }
    uint64_t set_bytes = 0;
    for (size_t i = 0; i < nu; i++) {
        u[i]->refs++;
        ferry__evictable_note(f, u[i]);
        u[i]->used = 1;
        ferry__sched_touch(&f->sched, u[i]->uid);
        set_bytes += u[i]->out_bytes;
    }
    f->last_set_bytes = set_bytes;
    *out = u;
    *nout = nu;
    return 0;
}

void ferry__prepare_undo(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                         size_t nu)
{
    for (size_t i = 0; i < nu; i++) {
        u[i]->refs--;
        drop_if_unkept(f, u[i]);
    }
    for (size_t i = 0; i < n; i++)
        if (ts[i]->n_parts) {
            ts[i]->refs--;
            drop_if_unkept(f, ts[i]);
        }
}

int ferry__prepare_finish(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                          size_t nu)
{
    int rc = bring(f, (ferry_tensor **)u, nu, 0, 1);
    if (rc == FERRY_EIO) {
        /* a read that failed because the file changed meanwhile: say so */
        pthread_mutex_unlock(&f->lock);
        rc = ferry__check_after_eio(f, u, nu);
        pthread_mutex_lock(&f->lock);
    }
    if (rc) {
        ferry__prepare_undo(f, ts, n, u, nu);
        return rc;
    }
    for (size_t i = 0; i < nu; i++) {
        u[i]->comp.last_use = ++f->clock;
        u[i]->comp.ahead = 0;
    }
    prefetch_ahead(f);
    return 0;
}

void ferry__prepare_queue(ferry *f, ferry_tensor *const *u, size_t nu)
{
    ferry__err saved = f->err;
    for (size_t i = 0; i < nu; i++)
        if (u[i]->comp.state == FERRY__EMPTY)
            (void)enqueue(f, u[i], 0, 0, 0); /* what cannot be queued now is retried at the wait */
    f->err = saved;
    prefetch_ahead(f);
}

int ferry__units_state(const ferry *f, ferry_tensor *const *u, size_t nu)
{
    (void)f;
    int loading = 0, missing = 0;
    for (size_t i = 0; i < nu; i++) {
        const ferry_tensor *t = u[i];
        if (t->comp.state == FERRY__READY && !t->populating && !t->stale)
            continue;
        if (t->comp.state == FERRY__LOADING || t->host.state == FERRY__LOADING || t->populating)
            loading = 1;
        else
            missing = 1;
    }
    return loading ? 0 : missing ? -1 : 1;
}

void ferry__release_tensor(ferry *f, ferry_tensor *t)
{
    release_one(f, t);
    for (int k = 0; k < t->n_parts; k++)
        if (t->parts[k]->refs > 0)
            release_one(f, t->parts[k]);
}

int ferry_prepare(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    /* a file that changed since it was opened fails before anything of it is used */
    if (ferry__check_tensors(f, ts, n, FERRY__PATH_RATE))
        return FERRY_ECHANGED;
    pthread_mutex_lock(&f->lock);
    ferry__fences_reap(f);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    int rc = ferry__prepare_begin(f, ts, n, &u, &nu);
    if (!rc)
        rc = ferry__prepare_finish(f, ts, n, u, nu);
    if (u && u != ts)
        free(u);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

/* After the last release: a copy of an old LoRA epoch goes (re-staged at the next prepare);
 * any other stays cached until its device's budget needs the room. */
static void drop_if_unkept(ferry *f, ferry_tensor *t)
{
    ferry__evictable_note(f, t);
    if (t->refs || t->comp.state == FERRY__LOADING || t->host.state == FERRY__LOADING)
        return;
    if (t->stale) {
        if (t->comp.state == FERRY__READY)
            ferry__drop_copy(f, t, &t->comp);
        t->stale = 0;
        t->bound = 0; /* the next use decides again (merge or not, zero-copy or not) */
        return;
    }
}


int ferry_release(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor *t = ts[i];
        if (!t || t->refs - t->fenced <= 0) {
            rc = ferry__fail(&f->err, FERRY_EINVAL, "release of tensor '%s' that is not prepared",
                             t ? t->info.name : "(null)");
            continue;
        }
        ferry__release_tensor(f, t);
    }
    ferry__fences_reap(f);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

int ferry_release_all(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    /* Memory a release waits on is the engine's until its event completes. */
    ferry__fences_wait_all(f);
    /* Prefetches in flight would land copies nobody holds: let them finish first, so that what
     * is not kept is gone when this returns. */
    while (f->inflight_prefetch && !f->closing)
        pthread_cond_wait(&f->cond, &f->lock);
    for (size_t i = 0; i < f->n_all; i++) {
        f->all[i]->refs = 0;
        drop_if_unkept(f, f->all[i]);
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_prefetch(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < n; i++) {
        ferry__err saved = f->err;
        if (usable(f, ts[i])) {
            f->err = saved;
            continue;
        }
        int nparts = ts[i]->n_parts ? ts[i]->n_parts : 1;
        int stop = 0;
        for (int k = 0; k < nparts && !stop; k++) {
            ferry_tensor *t = ts[i]->n_parts ? ts[i]->parts[k] : ts[i];
            if (t->lazy || t->comp.state != FERRY__EMPTY)
                continue;
            uint64_t dist = ferry__sched_distance(&f->sched, t->uid);
            stop = enqueue(f, t, 0, 1, dist == UINT64_MAX ? 0 : dist) != 0;
        }
        f->err = saved; /* a hint: what does not fit now is loaded at prepare */
        if (stop)
            break;
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_set_progress(ferry *f, ferry_progress_fn fn, void *user)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    f->progress = fn;
    f->progress_ud = user;
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_load_group(ferry *f, const char *group)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    int rc = 0, found = group == NULL;
    ferry_tensor **set = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *set);
    size_t n = 0;
    if (!set) {
        pthread_mutex_unlock(&f->lock);
        return ferry__fail(&f->err, FERRY_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < f->n_tensors && !rc; i++) {
        ferry_tensor *t = f->tensors[i];
        if (t->removed)
            continue;
        if ((rc = ferry__bind(f, t)) != 0)
            break;
        const char *g = t->group >= 0 ? f->groups[t->group].name : "default";
        if (group && strcmp(g, group) != 0)
            continue;
        found = 1;
        if (!t->ignored)
            set[n++] = t;
    }
    if (!rc && !found)
        rc = ferry__fail(&f->err, FERRY_ENOENT, "no group '%s'", group);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    if (!rc)
        rc = expand(f, set, n, &u, &nu);
    if (!rc)
        rc = bring(f, u, nu, 1, 0);
    pthread_mutex_unlock(&f->lock);
    if (rc == FERRY_EIO)
        rc = ferry__check_after_eio(f, u, nu);
    if (u && u != set)
        free(u);
    free(set);
    return rc;
}

void *ferry_tensor_data(const ferry_tensor *t)
{
    if (!t)
        return NULL;
    ferry *f = t->owner;
    pthread_mutex_lock(&f->lock);
    void *p = t->refs > 0 && t->comp.state == FERRY__READY ? t->comp.ptr : NULL;
    pthread_mutex_unlock(&f->lock);
    return p;
}

/* Lock held. */
static int unit_writable(const ferry_tensor *t)
{
    return t->refs > 0 && t->comp.state == FERRY__READY && t->comp.ptr && !t->comp.mapped &&
           !t->lazy && !t->map_eligible;
}

int ferry_tensor_writable(const ferry_tensor *t)
{
    if (!t)
        return 0;
    ferry *f = t->owner;
    pthread_mutex_lock(&f->lock);
    int w = t->n_parts ? t->refs > 0 : unit_writable(t);
    for (int i = 0; i < t->n_parts && w; i++)
        w = unit_writable(t->parts[i]);
    pthread_mutex_unlock(&f->lock);
    return w;
}

int ferry_tensor_part_count(const ferry_tensor *t)
{
    return t ? (t->n_parts ? t->n_parts : 1) : 0;
}

int ferry_tensor_get_part(const ferry_tensor *t, int i, ferry_tensor_part *out)
{
    if (!t || !out || i < 0 || i >= ferry_tensor_part_count(t))
        return FERRY_EINVAL;
    const ferry_tensor *u = t->n_parts ? t->parts[i] : t;
    ferry *f = t->owner;
    pthread_mutex_lock(&f->lock);
    out->device = u->comp.state == FERRY__READY ? u->comp.dev : u->compute_dev;
    out->row0 = u->row_base;
    out->n_rows = u->info.n_rows;
    out->data = u->refs > 0 && u->comp.state == FERRY__READY ? u->comp.ptr : NULL;
    out->nbytes = u->out_bytes;
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_tensor_read(ferry *f, ferry_tensor *t, uint64_t off, uint64_t n, void *dst)
{
    if (!f || !t || (n && !dst))
        return FERRY_EINVAL;
    if (t->n_parts) {
        /* Parts hold consecutive byte ranges of the staged tensor. */
        uint64_t base = 0;
        for (int k = 0; k < t->n_parts && n; k++) {
            ferry_tensor *c = t->parts[k];
            uint64_t end = base + c->out_bytes;
            if (off < end) {
                uint64_t take = FERRY__MIN(n, end - off);
                int rc = ferry_tensor_read(f, c, off - base, take, dst);
                if (rc)
                    return rc;
                dst = (unsigned char *)dst + take;
                off += take;
                n -= take;
            }
            base = end;
        }
        if (n)
            return ferry__fail_lock(f, FERRY_EINVAL, "tensor '%s': bytes past its end",
                                    t->info.name);
        return 0;
    }
    pthread_mutex_lock(&f->lock);
    int held = t->refs > 0 && t->comp.state == FERRY__READY;
    const unsigned char *p = held ? t->comp.ptr : NULL;
    int dev = t->comp.dev, mapped = t->comp.mapped;
    uint64_t size = t->out_bytes;
    pthread_mutex_unlock(&f->lock);
    if (!held)
        return ferry__fail_lock(f, FERRY_EINVAL, "tensor '%s' is not prepared", t->info.name);
    if (off > size || n > size - off)
        return ferry__fail_lock(f, FERRY_EINVAL, "tensor '%s': bytes [%llu, %llu) of %llu",
                           t->info.name, (unsigned long long)off,
                           (unsigned long long)(off + n), (unsigned long long)size);
    if (mapped) /* the mapping's bytes, read without touching it (ferry_tensor_read_file) */
        return ferry_tensor_read_file(f, t, off, n, dst);
    ferry_device *d = f->devs[dev].d;
    if (d->host_accessible) {
        memcpy(dst, p + off, n);
        return 0;
    }
    int rc = ferry__device_read(d, dst, p + off, n);
    if (rc) {
        char msg[256];
        ferry__fail_lock(f, rc, "%s: tensor '%s': read back failed: %s", d->name, t->info.name,
                         ferry__device_errmsg(d, msg, sizeof msg));
    }
    return rc;
}

uint64_t ferry_tensor_nbytes(const ferry_tensor *t)
{
    return t ? t->out_bytes : 0;
}

ferry_dtype ferry_tensor_dtype(const ferry_tensor *t)
{
    return t ? t->out_dtype : FERRY_DTYPE_NONE;
}

/* ---- row gather ------------------------------------------------------------------------------ */

static int cmp_u64_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

int ferry_read_rows(ferry *f, ferry_tensor *t, const uint64_t *rows, size_t n, void *dst)
{
    if (!f || !t || (n && (!rows || !dst)))
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    int rc = usable(f, t);
    pthread_mutex_unlock(&f->lock);
    if (rc)
        return rc;
    ferry_tensor *const one[1] = {t};
    if (ferry__check_tensors(f, one, 1, FERRY__PATH_RATE))
        return FERRY_ECHANGED;
    uint64_t row_bytes;
    if (ferry_dtype_nbytes(t->info.dtype, t->info.row_elems, &row_bytes) || !row_bytes)
        return ferry__fail_lock(f, FERRY_ESHAPE, "tensor '%s': rows are not whole blocks",
                           t->info.name);
    /* (row, position in the request) sorted by row, so neighbouring rows become one read. */
    uint64_t *order = malloc((n ? n : 1) * 2 * sizeof *order);
    if (!order)
        return ferry__fail_lock(f, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (rows[i] >= t->info.n_rows) {
            free(order);
            return ferry__fail_lock(f, FERRY_EINVAL, "tensor '%s': row %llu of %llu",
                               t->info.name, (unsigned long long)rows[i],
                               (unsigned long long)t->info.n_rows);
        }
        order[2 * i] = rows[i];
        order[2 * i + 1] = i;
    }
    qsort(order, n, 2 * sizeof *order, cmp_u64_pair);
    uint64_t max_run = FERRY__MAX(1, FERRY__XFER_CHUNK / row_bytes);
    unsigned char *tmp = NULL;
    ferry__err e = {0};
    for (size_t i = 0; i < n && !rc;) {
        /* A run of consecutive (or repeated) rows, at most max_run rows long. */
        size_t j = i + 1;
        while (j < n && order[2 * j] <= order[2 * (j - 1)] + 1 &&
               order[2 * j] - order[2 * i] < max_run)
            j++;
        uint64_t first = order[2 * i], count = order[2 * (j - 1)] - first + 1;
        if (!tmp && !(tmp = malloc(max_run * row_bytes))) {
            rc = ferry__fail_lock(f, FERRY_ENOMEM, "out of memory");
            break;
        }
        rc = ferry__io_read(t->file, t->info.offset + first * row_bytes, count * row_bytes, tmp,
                            FERRY_LOAD_READ, &e);
        if (rc) {
            pthread_mutex_lock(&f->lock);
            f->err = e;
            pthread_mutex_unlock(&f->lock);
            break;
        }
        add_stat(&f->a_bytes_read, count * row_bytes);
        for (size_t k = i; k < j; k++)
            memcpy((unsigned char *)dst + order[2 * k + 1] * row_bytes,
                   tmp + (order[2 * k] - first) * row_bytes, row_bytes);
        i = j;
    }
    free(tmp);
    free(order);
    return rc;
}
