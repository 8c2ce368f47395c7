/*
 * tensor.c — what the engine reads of a tensor: its data pointer and parts, its bytes read back
 * from wherever its copy lives, and rows gathered from the file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/load.h"
#include "devices/devices.h"
#include "dtype/dtype.h"
#include "sched/prefetch.h"


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
            return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s': bytes past its end",
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
        return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s' is not prepared", t->info.name);
    if (off > size || n > size - off)
        return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s': bytes [%llu, %llu) of %llu",
                           t->info.name, (unsigned long long)off,
                           (unsigned long long)(off + n), (unsigned long long)size);
    if (mapped) /* the mapping's bytes, read without touching it (ferry_tensor_read_file) */
        return ferry_tensor_read_file(f, t, off, n, dst);
    ferry_device *d = f->devs[dev].d;
    if (f->devs[dev].p.host_accessible) {
        memcpy(dst, p + off, n);
        return 0;
    }
    int rc = ferry__device_read(d, dst, p + off, n);
    if (rc) {
        char msg[256];
        ferry__fail_thread(f, rc, "%s: tensor '%s': read back failed: %s", f->devs[dev].p.name,
                           t->info.name,
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
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = ferry__usable(f, t, e);
    pthread_mutex_unlock(&f->lock);
    if (rc)
        return ferry__publish(f, rc, e);
    ferry_tensor *const one[1] = {t};
    if (ferry__check_tensors(one, 1, FERRY__PATH_RATE, e))
        return ferry__publish(f, FERRY_ECHANGED, e);
    uint64_t row_bytes;
    if (ferry_dtype_nbytes(t->info.dtype, t->info.row_elems, &row_bytes) || !row_bytes)
        return ferry__fail_thread(f, FERRY_ESHAPE, "tensor '%s': rows are not whole blocks",
                           t->info.name);
    /* (row, position in the request) sorted by row, so neighbouring rows become one read. */
    uint64_t *order = malloc((n ? n : 1) * 2 * sizeof *order);
    if (!order)
        return ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (rows[i] >= t->info.n_rows) {
            free(order);
            return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s': row %llu of %llu",
                               t->info.name, (unsigned long long)rows[i],
                               (unsigned long long)t->info.n_rows);
        }
        order[2 * i] = rows[i];
        order[2 * i + 1] = i;
    }
    qsort(order, n, 2 * sizeof *order, cmp_u64_pair);
    uint64_t max_run = FERRY__MAX(1, FERRY__XFER_CHUNK / row_bytes);
    unsigned char *tmp = NULL;
    for (size_t i = 0; i < n && !rc;) {
        /* A run of consecutive (or repeated) rows, at most max_run rows long. */
        size_t j = i + 1;
        while (j < n && order[2 * j] <= order[2 * (j - 1)] + 1 &&
               order[2 * j] - order[2 * i] < max_run)
            j++;
        uint64_t first = order[2 * i], count = order[2 * (j - 1)] - first + 1;
        if (!tmp && !(tmp = malloc(max_run * row_bytes))) {
            rc = ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
            break;
        }
        rc = ferry__io_read(t->file, t->info.offset + first * row_bytes, count * row_bytes, tmp,
                            FERRY_LOAD_READ, e);
        if (rc) {
            ferry__publish(f, rc, e);
            break;
        }
        ferry__add_stat(&f->a_bytes_read, count * row_bytes);
        for (size_t k = i; k < j; k++)
            memcpy((unsigned char *)dst + order[2 * k + 1] * row_bytes,
                   tmp + (order[2 * k] - first) * row_bytes, row_bytes);
        i = j;
    }
    free(tmp);
    free(order);
    return rc;
}

