/*
 * transfer.c — moving a tensor's bytes from the file (or its host home copy) into the copy a job
 * fills, converting and merging on the way. Runs on loader threads, without the manager's lock.
 *
 * Transfers go in chunks of whole blocks, at most FERRY__XFER_CHUNK bytes on either side, through
 * two staging buffers per loader, so that reading chunk i+1 overlaps copying chunk i to the device.
 * The home copy is never written: conversion writes only to the staged copy.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/load.h"
#include "devices/devices.h"
#include "dtype/dtype.h"
#include "sched/prefetch.h"

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

/* Reads [ABS, ABS+LEN) of FILE into DST, reads of FERRY__PARALLEL_READ and more through the I/O
 * pool, whose workers read chunks of it in parallel; E's message, when it fails, names no tensor. */
int ferry__read_at(ferry__io *io, const ferry__iofile *file, uint64_t abs, uint64_t len, void *dst,
                   ferry_load mode, int relay, ferry__err *e)
{
    if (len < FERRY__PARALLEL_READ)
        return ferry__io_read(file, abs, len, dst, mode, e);
    sync_wait w = {.done = 0, .status = 0};
    pthread_mutex_init(&w.m, NULL);
    pthread_cond_init(&w.c, NULL);
    ferry__ioreq req = {.file = file, .offset = abs, .len = len, .dst = dst,
                        .mode = mode, .done = sync_done, .ud = &w, .relay = relay};
    int rc = ferry__io_submit(io, &req);
    if (!rc) {
        pthread_mutex_lock(&w.m);
        while (!w.done)
            pthread_cond_wait(&w.c, &w.m);
        pthread_mutex_unlock(&w.m);
        rc = w.status;
        if (rc)
            ferry__fail(e, rc, "%s", req.errmsg[0] ? req.errmsg : ferry_strerror(rc));
    } else {
        ferry__fail(e, rc, "%s", req.errmsg[0] ? req.errmsg : "cannot queue the read");
    }
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
    return rc;
}

/* Reads [off, off+len) of T's file (OFF relative to the tensor) into DST (ferry__read_at). COUNT:
 * the bytes count as read from the file (not when they stand for a copy of the mapped home copy). */
int ferry__read_file(const ferry__xfer_env *env, const ferry_tensor *t, uint64_t off,
                    uint64_t len, void *dst, ferry_load mode, int count, ferry__err *e)
{
    double t0 = env->trace ? ferry__now() : 0;
    int rc = ferry__read_at(env->io, t->file, t->info.offset + off, len, dst, mode, env->relay, e);
    if (rc)
        ferry__fail_prefix(e, "tensor '%s': ", t->info.name);
    if (!rc && count)
        ferry__add_stat(env->bytes_read, len);
    if (t0)
        env->trace(env->trace_ud, "io", t0, ferry__now(), "read %s", t->info.name);
    return rc;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

int ferry__populate_range(const ferry__iofile *file, uint64_t off, uint64_t len)
{
    const uint64_t step = FERRY__XFER_CHUNK;
    (void)posix_fadvise(file->fd, (off_t)off, (off_t)FERRY__MIN(step, len),
                        POSIX_FADV_WILLNEED);
    for (uint64_t at = 0; at < len; at += step) {
        uint64_t n = FERRY__MIN(step, len - at);
        if (at + n < len) /* the next piece is read while this one is populated */
            (void)posix_fadvise(file->fd, (off_t)(off + at + n),
                                (off_t)FERRY__MIN(step, len - at - n), POSIX_FADV_WILLNEED);
        if (madvise((void *)(file->map + off + at), (size_t)n, MADV_POPULATE_READ) != 0)
            return -1;
    }
    return 0;
}

/* ---- the transfer pipeline -------------------------------------------------------------------- */

static void ctx_release(ferry__loader_ctx *lc)
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
static int ctx_buffers(ferry__loader_ctx *lc, int need, uint64_t bytes, ferry_device *dev,
                       int dev_host_accessible)
{
    if (bytes < FERRY__XFER_CHUNK)
        bytes = FERRY__XFER_CHUNK;
    ferry_device *pin =
        dev && !dev_host_accessible && FERRY_DEVICE_HAS(dev->ops, host_alloc) ? dev : NULL;
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

void ferry__loader_ctx_free(ferry__loader_ctx *lc)
{
    ctx_release(lc);
}

static int wait_slot(ferry_device *d, ferry__loader_ctx *lc, int slot)
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
/* An unchanged copy from a registered host copy (J's reg_src, registered in [reg_lo, reg_hi)):
 * the copy engine reads the registered part where it lies, in one copy. The parts before and
 * after it, under a page each, are copied as they are from a private copy, or read through the
 * descriptor into staging memory from the mapping (which a changed file may no longer back). */
static int transfer_registered(const ferry__xfer_env *env, ferry__loader_ctx *lc,
                               const ferry_tensor *t, const ferry__job *j, ferry_load mode,
                               unsigned char *dptr, ferry__err *e)
{
    ferry_device *d = env->dev;
    uint64_t n = t->info.nbytes, lo = j->reg_lo, hi = j->reg_hi;
    int mapped = t->host.mapped; /* fixed while the host copy lives, which the job holds */
    uint64_t off[3] = {lo, 0, hi}, len[3] = {hi - lo, lo, n - hi}, ticket[3];
    char msg[256];
    int rc = 0, issued = 0;
    if (mapped && (lo || hi < n)) {
        rc = ctx_buffers(lc, NEED_STAGE, FERRY__XFER_CHUNK, d, 0);
        if (rc)
            return ferry__fail(e, rc, "%s: tensor '%s': out of memory for staging buffers",
                               env->dev_name, t->info.name);
    }
    double t_issue = env->trace ? ferry__now() : 0;
    for (int k = 0; k < 3 && !rc; k++) {
        if (!len[k])
            continue;
        const unsigned char *src = j->reg_src + off[k];
        if (k && mapped) {
            unsigned char *buf = lc->stage[k - 1] + (t->info.offset + off[k]) % FERRY__IO_ALIGN;
            if ((rc = ferry__read_file(env, t, off[k], len[k], buf, mode, 0, e)) != 0)
                break;
            src = buf;
        }
        rc = d->ops->copy_h2d(d, dptr + off[k], src, len[k], &ticket[issued]);
        if (rc) {
            ferry__fail(e, rc, "%s: tensor '%s': copy to device failed: %s", env->dev_name,
                        t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
            break;
        }
        issued++;
        ferry__add_stat(env->bytes_copied, len[k]);
    }
    double tw = env->trace ? ferry__now() : 0;
    if (tw)
        env->trace(env->trace_ud, "device", t_issue, tw, "issue %s", t->info.name);
    for (int k = 0; k < issued; k++) {
        int wrc = d->ops->wait(d, ticket[k]);
        if (wrc && !rc)
            rc = ferry__fail(e, wrc, "%s: tensor '%s': copy to device failed: %s", env->dev_name,
                             t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
    }
    if (tw)
        env->trace(env->trace_ud, "device", tw, ferry__now(), "wait %s", t->info.name);
    return rc;
}

int ferry__transfer(const ferry__xfer_env *env, ferry__loader_ctx *lc, const ferry_tensor *t,
                    const ferry__job *j, const unsigned char *src_host, int home_mapped,
                    ferry_load mode, ferry__copy *dst, ferry__err *e)
{
    ferry_device *d = env->dev;
    const char *dname = env->dev_name;
    int to_host = env->dev_host_accessible;
    ferry_dtype in = t->info.dtype, out = j->out_dtype;
    int merging = j->n_terms > 0;
    int converted = in != out;
    unsigned char *dptr = dst->ptr;
    char msg[256];

    if (!converted && !merging && to_host) {
        if (src_host) {
            memcpy(dptr, src_host, t->info.nbytes);
            ferry__add_stat(env->bytes_copied, t->info.nbytes);
            return 0;
        }
        int rc = ferry__read_file(env, t, 0, t->info.nbytes, dptr, mode, !home_mapped, e);
        if (!rc && home_mapped)
            ferry__add_stat(env->bytes_copied, t->info.nbytes);
        return rc;
    }
    if (j->reg_hi > j->reg_lo && !converted && !merging && !to_host)
        return transfer_registered(env, lc, t, j, mode, dptr, e);
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
                         need, d, to_host);
    if (rc) {
        char why[256] = "host memory";
        if (lc->pin_failed)
            ferry__device_errmsg(lc->pin_failed, why, sizeof why);
        return ferry__fail(e, rc, "%s: tensor '%s': %s staging buffers (%s)", dname,
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
            ferry__fail(e, rc, "%s: tensor '%s': copy to device failed: %s", dname,
                        t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
            break;
        }
        const unsigned char *src;
        if (src_host) {
            src = src_host + in_off;
        } else {
            unsigned char *buf = lc->stage[slot] + (t->info.offset + in_off) % FERRY__IO_ALIGN;
            if ((rc = ferry__read_file(env, t, in_off, in_len, buf, mode, !home_mapped, e)) != 0)
                break;
            src = buf;
        }
        if (converted || merging) {
            double t0 = env->trace ? ferry__now() : 0;
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
                env->trace(env->trace_ud, "cpu", t0, ferry__now(),
                           merging ? "merge %s" : "convert %s", t->info.name);
            src = cdst;
        }
        if (!to_host) {
            rc = d->ops->copy_h2d(d, dptr + out_off, src, out_len, &lc->ticket[slot]);
            if (rc) {
                ferry__fail(e, rc, "%s: tensor '%s': copy to device failed: %s", dname,
                            t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
                break;
            }
            lc->pending[slot] = 1;
            ferry__add_stat(env->bytes_copied, out_len);
        }
    }
    (void)rows;
    for (int s = 0; s < 2; s++) {
        int wrc = to_host ? 0 : wait_slot(d, lc, s);
        if (wrc && !rc)
            rc = ferry__fail(e, wrc, "%s: tensor '%s': copy to device failed: %s", dname,
                             t->info.name, ferry__device_errmsg(d, msg, sizeof msg));
    }
    return rc;
}

