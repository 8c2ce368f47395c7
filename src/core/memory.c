/*
 * memory.c — budgets, eviction and the host buffer pool. Every function here runs with the
 * manager's lock held.
 *
 * A device's `used` counts every byte ferry holds there: copies in use, cached copies, copies
 * being loaded (reserved before the job runs, so in-flight bytes count against the budget) and,
 * on the host, free buffers kept in the pool. A reservation that does not fit first returns pooled
 * buffers to the system, then evicts cached copies — the one whose next use in the recorded
 * schedule is furthest away (Belady), or the least recently used before a schedule exists. Copies
 * in use (refs > 0), copies being loaded and home copies are never evicted. ferry never goes over
 * a budget: when nothing more can be evicted the reservation fails with FERRY_EBUDGET.
 *
 * The pool (per device, while a budget bounds it) exists because fresh memory is expensive: first
 * touch of anonymous host memory is slow on virtual machines (0.6-4 GB/s), cudaMalloc/cudaFree
 * synchronize the device, and a streamed model reuses the same few buffer sizes layer after layer.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "devices/devices.h"

/* A pooled buffer of SIZE serves a request of NEED when it is at most 1/8 (+8 KiB) larger. */
static int pool_fits(uint64_t size, uint64_t need)
{
    return size >= need && size - need <= need / 8 + 8192;
}

static void dev_free(ferry *f, int dev, void *base)
{
    ferry_device *d = f->devs[dev].d;
    d->ops->free(d, base);
}

void ferry__pool_trim(ferry *f, int dev, uint64_t want_free)
{
    ferry__dev *D = &f->devs[dev];
    uint64_t freed = 0;
    while (D->n_pool && freed < want_free) {
        /* Largest first: fewest frees for the room asked. */
        size_t best = 0;
        for (size_t i = 1; i < D->n_pool; i++)
            if (D->pool[i].size > D->pool[best].size)
                best = i;
        ferry__pool_buf b = D->pool[best];
        D->pool[best] = D->pool[--D->n_pool];
        dev_free(f, dev, b.base);
        D->pooled -= b.size;
        D->used -= b.size;
        freed += b.size;
    }
}

static int pool_take(ferry *f, int dev, uint64_t need, ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < D->n_pool; i++)
        if (pool_fits(D->pool[i].size, need) &&
            (best == SIZE_MAX || D->pool[i].size < D->pool[best].size))
            best = i;
    if (best == SIZE_MAX)
        return 0;
    out->base = D->pool[best].base;
    out->size = D->pool[best].size;
    D->pool[best] = D->pool[--D->n_pool];
    D->pooled -= out->size;
    return 1;
}

/* Gives memory back: into the host pool when a budget bounds it, else to the device. */
static void give_back(ferry *f, int dev, ferry__mem *m)
{
    ferry__dev *D = &f->devs[dev];
    if (!m->size && !m->base)
        return;
    if (m->base && D->budget) {
        if (D->n_pool == D->cap_pool) {
            size_t cap = D->cap_pool ? D->cap_pool * 2 : 64;
            ferry__pool_buf *p = realloc(D->pool, cap * sizeof *p);
            if (p) {
                D->pool = p;
                D->cap_pool = cap;
            }
        }
        if (D->n_pool < D->cap_pool) {
            D->pool[D->n_pool].base = m->base;
            D->pool[D->n_pool].size = m->size;
            D->n_pool++;
            D->pooled += m->size;
            m->base = NULL;
            m->size = 0;
            return;
        }
    }
    if (m->base)
        dev_free(f, dev, m->base);
    D->used -= m->size;
    m->base = NULL;
    m->size = 0;
}

void ferry__unreserve(ferry *f, int dev, ferry__mem *m)
{
    give_back(f, dev, m);
}

void ferry__drop_copy(ferry *f, ferry_tensor *t, ferry__copy *c)
{
    (void)t;
    if (c->locked && c->ptr)
        ferry__host_unlock(c->ptr, c->locked);
    if (c->mem.base || c->mem.size)
        give_back(f, c->dev, &c->mem);
    memset(c, 0, sizeof *c);
}

/* The cached copy on DEV to evict: furthest next use (schedule) or least recently used; only
 * copies used later than MIN_DIST qualify. NULL when none. */
static ferry_tensor *pick_victim(ferry *f, int dev, uint64_t min_dist)
{
    ferry_tensor *best = NULL;
    uint64_t best_score = 0;
    int sched = f->sched.complete;
    for (size_t i = 0; i < f->n_all; i++) {
        ferry_tensor *t = f->all[i];
        const ferry__copy *c = &t->comp;
        if (c->state != FERRY__READY || c->permanent || c->mapped || c->dev != dev ||
            t->refs > 0 || !c->mem.base)
            continue;
        uint64_t score;
        if (sched) {
            score = ferry__sched_distance(&f->sched, t->uid);
            if (score <= min_dist)
                continue;
        } else {
            score = f->clock - c->last_use + 1;
        }
        if (!best || score > best_score) {
            best = t;
            best_score = score;
        }
    }
    return best;
}

static void evict(ferry *f, ferry_tensor *t)
{
    ferry__drop_copy(f, t, &t->comp);
    f->stats.evictions++;
}

static int reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, int use_pool,
                   ferry__mem *out);

int ferry__reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, ferry__mem *out)
{
    return reserve(f, dev, size, min_dist, 1, out);
}

int ferry__reserve_bytes(ferry *f, int dev, uint64_t size, ferry__mem *out)
{
    return reserve(f, dev, size, 0, 0, out);
}

static int reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, int use_pool,
                   ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    out->base = NULL;
    out->size = 0;
    if (use_pool && pool_take(f, dev, size, out))
        return 0;
    if (D->budget && size > D->budget) {
        /* never fits: fail before evicting anything */
        char b1[32], b2[32];
        return ferry__fail(&f->err, FERRY_EBUDGET, "%s: %s do not fit in a budget of %s",
                           D->d->name, ferry__fmt_size(size, b1), ferry__fmt_size(D->budget, b2));
    }
    for (;;) {
        if (!D->budget || (D->used <= D->budget && size <= D->budget - D->used))
            break;
        if (D->pooled) {
            ferry__pool_trim(f, dev, size);
            continue;
        }
        ferry_tensor *v = pick_victim(f, dev, min_dist);
        if (!v) {
            char b1[32], b2[32], b3[32];
            return ferry__fail(&f->err, FERRY_EBUDGET,
                               "%s: budget %s: cannot fit %s more (%s held, nothing evictable)",
                               D->d->name, ferry__fmt_size(D->budget, b1),
                               ferry__fmt_size(size, b2), ferry__fmt_size(D->used, b3));
        }
        evict(f, v);
        if (use_pool && pool_take(f, dev, size, out))
            return 0;
    }
    D->used += size;
    if (D->used > D->peak)
        D->peak = D->used;
    out->size = size;
    return 0;
}

void ferry__shrink(ferry *f, int dev)
{
    ferry__dev *D = &f->devs[dev];
    if (D->pooled && D->used > D->budget)
        ferry__pool_trim(f, dev, D->used - D->budget);
    while (D->used > D->budget) {
        ferry_tensor *v = pick_victim(f, dev, 0);
        if (!v)
            break;
        evict(f, v);
        if (D->pooled)
            ferry__pool_trim(f, dev, UINT64_MAX);
    }
}
