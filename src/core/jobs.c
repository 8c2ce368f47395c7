/*
 * jobs.c — the job queue and the loader threads that fill copies.
 *
 * A tensor has at most two copies: `host` (its home copy in host RAM when it is computed on an
 * accelerator) and `comp` (what the engine's data pointer points at). Copies that are the file
 * mapping (zero-copy, lazy) are READY as soon as they are needed. Others are filled by a job: the
 * enqueuing thread reserves the memory under the lock (so in-flight bytes count against the
 * budget), marks the copies LOADING and queues the job; a loader thread allocates, moves the bytes
 * without the lock (transfer.c), and marks the copies READY (or EMPTY with the error) under it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/load.h"
#include "devices/devices.h"
#include "dtype/dtype.h"
#include "sched/prefetch.h"

/* ---- transfer.c's environment from the manager ---- */

static void trace_span(void *ud, const char *cat, double t0, double t1, const char *fmt,
                       const char *arg)
{
    ferry__trace_addf(ud, cat, t0, t1, fmt, arg);
}

ferry__xfer_env ferry__xfer_env_of(ferry *f, int dev)
{
    return (ferry__xfer_env){.io = f->io,
                             .dev = dev >= 0 ? f->devs[dev].d : NULL,
                             .dev_name = dev >= 0 ? f->devs[dev].p.name : NULL,
                             .dev_host_accessible = dev >= 0 && f->devs[dev].p.host_accessible,
                             .bytes_read = &f->a_bytes_read,
                             .bytes_copied = &f->a_bytes_copied,
                             .relay = f->relay,
                             .trace = ferry__tracing(f) ? trace_span : NULL,
                             .trace_ud = f};
}

int ferry__read_range(ferry *f, const ferry_tensor *t, uint64_t off, uint64_t len, void *dst,
                      ferry_load mode, int count, ferry__err *e)
{
    ferry__xfer_env env = ferry__xfer_env_of(f, -1);
    return ferry__read_file(&env, t, off, len, dst, mode, count, e);
}

/* ---- jobs ------------------------------------------------------------------------------------- */

/* Reads a byte of every page of C's block, whose pages a stitch moved (or mapped fresh), where
 * moving a page costs its first access (ferry__cpu_move_cost above 1 us: a virtual machine whose
 * hypervisor shadows the guest's page tables traps once per moved page): that access had better
 * be the loader's, while the engine computes, than the engine's own in its products. */
#define FERRY__TOUCH_MOVE_COST 1e-6
static void touch_moved(ferry *f, const ferry__copy *c, const ferry_tensor *t)
{
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    ferry__read_pages(c->mem.base, c->mem.size);
    if (t0)
        ferry__trace_addf(f, "memory", t0, ferry__now(), "touch %s", t->info.name);
}

static int alloc_copy(ferry *f, ferry__copy *c, uint64_t head, ferry__err *e,
                      const ferry_tensor *t)
{
    if (c->mem.base) {
        c->ptr = (unsigned char *)c->mem.base + head;
        if (c->mem.moved && ferry__host_side(f, c->dev) &&
            ferry__cpu_move_cost() > FERRY__TOUCH_MOVE_COST)
            touch_moved(f, c, t);
        return 0;
    }
    ferry_device *d = f->devs[c->dev].d;
    void *p = NULL;
    double ta = ferry__tracing(f) ? ferry__now() : 0;
    int rc = d->ops->alloc(d, c->mem.size, &p);
    if (ta)
        ferry__trace_addf(f, "memory", ta, ferry__now(), "allocate %s", t->info.name);
    char msg[256];
    if (rc)
        return ferry__fail(e, rc, "%s: tensor '%s': cannot allocate %llu bytes: %s",
                           f->devs[c->dev].p.name,
                           t->info.name, (unsigned long long)c->mem.size,
                           ferry__device_errmsg(d, msg, sizeof msg));
    c->mem.base = p;
    c->ptr = (unsigned char *)p + head;
    if (c->mem.small_pages && ferry__host_side(f, c->dev) && c->mem.size >= FERRY__CPU_MAP_MIN)
        ferry__host_small_pages(p, c->mem.size); /* a copy the budget keeps (memory.c) */
    /* Fresh host memory is faulted in before the read fills it: O_DIRECT into pages not yet there
     * faults them one by one in the middle of the I/O. The pages are written, not populated with
     * madvise: MADV_POPULATE_WRITE holds the process's mmap lock for the whole range, and every
     * other loader's mmap, and the reads queued behind that, would wait for it, while a write
     * fault holds a lock for one page (on Linux 6.4 and later, only its own mapping's). Nothing
     * reads the block before the read fills it, so the zeros written cost nothing. */
    if (ferry__host_side(f, c->dev) && c->mem.size >= FERRY__CPU_MAP_MIN) {
        double t0 = ferry__now();
        volatile unsigned char *q = p;
        for (uint64_t off = 0; off < c->mem.size; off += 4096)
            q[off] = 0;
        ferry__trace_addf(f, "memory", t0, ferry__now(), "fault in %s", t->info.name);
    }
    return 0;
}

void ferry__lock_copy(ferry *f, int lock, ferry__copy *c, uint64_t len)
{
    if (!lock || !c->ptr || !ferry__host_side(f, c->dev) || !len)
        return;
    /* a refusal (RLIMIT_MEMLOCK) is counted, not an error: the copy works unlocked */
    if (ferry__host_lock(c->ptr, len, NULL) == 0) {
        c->locked = len;
        ferry__add_stat(&f->a_locked_bytes, len);
    } else {
        ferry__add_stat(&f->a_lock_failures, 1);
    }
}

/* The host copy as the copy source of job J (see ferry__job): a host home copied to an
 * accelerator unchanged, whose device can register host memory. Lock held. */
static void reg_plan(ferry *f, const ferry_tensor *t, ferry__job *j)
{
    const ferry__copy *h = &t->host;
    if (!(j->fill & FILL_COMP) || j->transformed || ferry__host_side(f, t->comp.dev) ||
        ferry__effective_home(f, t) != FERRY_HOME_HOST || h->state == FERRY__EMPTY)
        return;
    /* A mapping registered is page-locked, held in RAM as a private copy would be, though the
     * host budget does not count it: registered only while it fits in the budget's room. */
    const ferry__dev *H = &f->devs[FERRY__HOST];
    uint64_t room = !H->budget ? UINT64_MAX : H->budget > H->used ? H->budget - H->used : 0;
    if (h->mapped && !h->reg && H->reg_mapped + t->info.nbytes > room)
        return;
    if (h->reg) {
        j->reg_src = h->ptr;
        j->reg_lo = (uint64_t)((const unsigned char *)h->reg - (const unsigned char *)h->ptr);
        j->reg_hi = j->reg_lo + h->reg_len;
    } else if (!h->reg_refused && FERRY_DEVICE_HAS(f->devs[t->comp.dev].d->ops, host_register)) {
        j->reg = FERRY__REG_ASK;
        if (h->mapped) { /* counted from now, so that loaders at work at once stay within it */
            j->reg_reserved = t->info.nbytes;
            f->devs[FERRY__HOST].reg_mapped += j->reg_reserved;
        }
    }
}

/* Registers the page-aligned part of T's host bytes at BASE with the job's device (asked by
 * reg_plan); ranges under FERRY__REG_MIN are not worth a registration. Loader, without the
 * lock. */
#define FERRY__REG_MIN (UINT64_C(1) << 20)
static void reg_now(ferry_device *d, const ferry_tensor *t, const unsigned char *base, ferry__job *j)
{
    const uintptr_t page = 4096;
    uintptr_t b = (uintptr_t)base, lo = (b + page - 1) & ~(page - 1);
    uintptr_t hi = (b + (uintptr_t)t->info.nbytes) & ~(page - 1);
    if (hi <= lo || hi - lo < FERRY__REG_MIN)
        return;
    j->reg_src = base;
    if (d->ops->host_register(d, (void *)lo, (uint64_t)(hi - lo))) {
        j->reg = FERRY__REG_REFUSED;
        return;
    }
    j->reg = FERRY__REG_NEW;
    j->reg_lo = lo - b;
    j->reg_hi = hi - b;
}

/* Records job J's registration on T's host copy, or undoes it when that copy went meanwhile or
 * has one already. Lock held. */
static void reg_settle(ferry *f, ferry_tensor *t, const ferry__job *j)
{
    ferry__copy *h = &t->host;
    int same = h->state == FERRY__READY && h->ptr == j->reg_src;
    f->devs[FERRY__HOST].reg_mapped -= j->reg_reserved;
    if (j->reg == FERRY__REG_REFUSED && same)
        h->reg_refused = 1;
    if (j->reg != FERRY__REG_NEW)
        return;
    void *p = (void *)(j->reg_src + j->reg_lo);
    if (same && !h->reg) {
        h->reg = p;
        h->reg_len = j->reg_hi - j->reg_lo;
        h->reg_dev = t->comp.dev;
        if (h->mapped)
            f->devs[FERRY__HOST].reg_mapped += h->reg_len;
    } else {
        ferry_device *d = f->devs[t->comp.dev].d;
        d->ops->host_unregister(d, p);
    }
}

static int run_job_inner(ferry *f, ferry__loader_ctx *lc, ferry__job *j, ferry__err *e);

static int run_job(ferry *f, ferry__loader_ctx *lc, ferry__job *j, ferry__err *e)
{
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    int rc = run_job_inner(f, lc, j, e);
    if (t0)
        ferry__trace_addf(f, j->prefetch ? "prefetch" : "load", t0, ferry__now(), "stage %s",
                          j->t->info.name);
    return rc;
}

/* Brings a zero-copy tensor's pages into the page cache and maps them (ferry__populate_range: the
 * kernel's readahead asked for each 16 MiB piece while the one before is populated, which maps it
 * and makes pages whose file bytes are gone, a truncated file, an error instead of the SIGBUS a
 * touch would raise). Populating uncached pages alone, each fault reading around its page and
 * waiting, was slower (bench/README.md). Older kernels, without MADV_POPULATE_READ, get buffered
 * reads through a small buffer (the pages then fault into the mapping at first use). No
 * MADV_SEQUENTIAL: it lets the kernel drop pages right after they are read (it cost 30%). Skipped
 * when the range is already cached. */
static int populate(ferry *f, ferry__loader_ctx *lc, ferry_tensor *t, ferry__err *e)
{
    (void)lc;
    const ferry__iofile *file = t->file;
    if (!file->map || !t->info.nbytes ||
        ferry__iofile_cached(file, t->info.offset, t->info.nbytes) >= 0.98)
        return 0;
    uint64_t pg = ferry__io_page_size();
    uint64_t s = t->info.offset - t->info.offset % pg, end = t->info.offset + t->info.nbytes;
    int rc = 0;
    if (ferry__populate_range(file, s, end - s) == 0) {
        ferry__add_stat(&f->a_bytes_read, t->info.nbytes);
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
        rc = ferry__read_range(f, t, off, FERRY__MIN(step, t->info.nbytes - off), buf,
                               FERRY_LOAD_READ, 1, e);
    free(buf);
    return rc;
}

static int run_job_inner(ferry *f, ferry__loader_ctx *lc, ferry__job *j, ferry__err *e)
{
    ferry_tensor *t = j->t;
    int fill = j->fill;
    if (fill & FILL_POPULATE) {
        int rc = populate(f, lc, t, e);
        if (rc)
            return rc;
    }
    if ((fill & FILL_LOCK) && t->info.nbytes) {
        /* the mapping of T's bytes (fixed until ferry_destroy); finish_job records it */
        void *p = (unsigned char *)t->file->map + t->info.offset;
        if (ferry__host_lock(p, t->info.nbytes, NULL) == 0)
            j->mlocked = t->info.nbytes;
        else
            j->mlock_refused = 1;
    }
    if (!(fill & ~(FILL_POPULATE | FILL_LOCK)))
        return 0;
    int rc = 0;
    if (fill & FILL_HOST) {
        rc = alloc_copy(f, &t->host, t->info.offset % FERRY__IO_ALIGN, e, t);
        if (!rc)
            rc = ferry__read_range(f, t, 0, t->info.nbytes, t->host.ptr, j->load, 1, e);
        if (!rc)
            ferry__lock_copy(f, j->lock, &t->host, t->info.nbytes);
        if (rc)
            return rc;
    }
    if (fill & FILL_COMP) {
        uint64_t head = ferry__host_side(f, t->comp.dev) && !j->transformed
                            ? t->info.offset % FERRY__IO_ALIGN : 0;
        rc = alloc_copy(f, &t->comp, head, e, t);
        if (rc)
            return rc;
        /* The host copy is READY (permanent, or filled just above) or absent; a mapped one is
         * read through the descriptor. */
        int have = t->host.state == FERRY__READY || (fill & FILL_HOST);
        int mapped = have && t->host.mapped;
        const unsigned char *src = have && !mapped ? t->host.ptr : NULL;
        ferry__xfer_env env = ferry__xfer_env_of(f, t->comp.dev);
        if (j->reg == FERRY__REG_ASK && have)
            reg_now(env.dev, t, t->host.ptr, j);
        rc = ferry__transfer(&env, lc, t, j, src, mapped, j->load, &t->comp, e);
        if (!rc && t->comp.permanent)
            ferry__lock_copy(f, j->lock, &t->comp, j->out_bytes);
    }
    return rc;
}

/* Makes mapping-backed copies READY; decides which copies a job must fill. Lock held.
 *
 * On a host-side compute device an untransformed tensor has one copy, comp, which is its home
 * (host) or a cached copy (disk). Everywhere else — an accelerator, or a LoRA merge — comp is a
 * staged copy filled from the home copy (host: the pristine `host` copy or the mapping) or from the
 * file (disk, device). A merged copy is never permanent: a new epoch re-stages it. */
int ferry__needs(ferry *f, ferry_tensor *t, int home_only)
{
    int fill = 0;
    const ferry__iofile *file = t->file;
    unsigned char *mapped = file->map ? (unsigned char *)file->map + t->info.offset : NULL;
    ferry_home home = ferry__effective_home(f, t);
    int dev = t->compute_dev, hs = ferry__host_side(f, dev);
    if (t->lazy) {
        if (t->comp.state == FERRY__EMPTY) {
            t->comp.dev = FERRY__HOST;
            /* No advice: the kernel's read-around serves a product over the whole tensor at
             * the disk's pace, where MADV_RANDOM read it 4 KiB per fault (bench/README, lazy
             * tensors); a gather of a few rows is ferry_read_rows' job. */
            ferry__copy_map(f, t, &t->comp, mapped);
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
            ferry__copy_move(f, t, &t->comp, &t->host);
            return 0;
        }
        if (home == FERRY_HOME_HOST) {
            if (t->zero_copy) {
                ferry__copy_map(f, t, &t->comp, mapped);
                return (t->populated ? 0 : FILL_POPULATE) |
                       (ferry__policy_of(f, t)->lock ? FILL_LOCK : 0);
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
            ferry__copy_map(f, t, &t->host, mapped);
            if (!t->populated)
                fill |= FILL_POPULATE;
            if (ferry__policy_of(f, t)->lock)
                fill |= FILL_LOCK;
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
    ferry__job *j = f->jobs.free_jobs;
    if (j) {
        f->jobs.free_jobs = j->next;
        memset(j, 0, sizeof *j);
        return j;
    }
    return calloc(1, sizeof(ferry__job));
}

void ferry__job_recycle(ferry *f, ferry__job *j)
{
    free(j->terms);
    free(j->scales);
    j->terms = NULL;
    j->scales = NULL;
    j->n_terms = 0;
    j->next = f->jobs.free_jobs;
    f->jobs.free_jobs = j;
}

/* Queues a job bringing T to where it is used (or, with HOME_ONLY, to its home). MIN_DIST: only
 * cached copies used later than this may be evicted for it (prefetch); 0 for demand loads.
 * Lock held. Returns 0 (queued or nothing to do) or FERRY_EBUDGET / FERRY_ENOMEM. */
int ferry__enqueue(ferry *f, ferry_tensor *t, int home_only, int prefetch, uint64_t min_dist,
                   ferry__err *e)
{
    if (f->jobs.closing)
        return ferry__fail(e, FERRY_ECANCELED, "manager is closing");
    int fill = ferry__needs(f, t, home_only);
    if (t->populating)
        fill &= ~(FILL_POPULATE | FILL_LOCK); /* one populate or lock job at a time */
    if (!fill)
        return 0;
    ferry__mem hm = {0}, cm = {0};
    int rc = 0, host_refused = 0;
    f->moe.loading = t; /* the evictions below make room for T (its kind, memory.c) */
    if (fill & FILL_HOST) {
        rc = ferry__reserve(f, FERRY__HOST, ferry__host_alloc_size(t, 0), min_dist, &hm, e);
        host_refused = rc == FERRY_EBUDGET;
    }
    if (!rc && (fill & FILL_COMP)) {
        int dev = t->comp.dev;
        uint64_t size = ferry__host_side(f, dev) ? ferry__host_alloc_size(t, ferry__transformed(t))
                                          : ferry__dev_alloc_size(t);
        rc = ferry__reserve(f, dev, size, min_dist, &cm, e);
        host_refused = rc == FERRY_EBUDGET && ferry__host_side(f, dev);
    }
    f->moe.loading = NULL;
    ferry__job *j = rc ? NULL : job_new(f);
    if (j && (fill & FILL_COMP) && t->merge && ferry__lora_snapshot(f, t, j)) {
        ferry__job_recycle(f, j);
        j = NULL;
    }
    if (host_refused && t->auto_private) {
        /* load AUTO chose a private copy because the bytes are not cached, and the host budget
         * has no room for it: the mapping serves it as it would have, cached or not */
        ferry__err_clear(e);
        ferry__unreserve(f, FERRY__HOST, &hm);
        if (fill & FILL_HOST)
            t->host.permanent = 0;
        t->auto_private = 0;
        t->zero_copy = 1;
        return ferry__enqueue(f, t, home_only, prefetch, min_dist, e);
    }
    if (rc || !j) {
        if (!rc)
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory queuing a load");
        else if (!prefetch)
            ferry__fail_append(e, 0, "while loading tensor '%s' (%llu bytes)",
                               t->info.name, (unsigned long long)t->out_bytes);
        ferry__unreserve(f, FERRY__HOST, &hm);
        ferry__unreserve(f, t->comp.dev, &cm);
        if (fill & FILL_HOST)
            t->host.permanent = 0;
        return rc;
    }
    if (fill & FILL_HOST)
        ferry__copy_loading(f, t, &t->host, hm);
    if (fill & FILL_COMP)
        ferry__copy_loading(f, t, &t->comp, cm);
    if (fill & (FILL_POPULATE | FILL_LOCK))
        t->populating = 1;
    t->load_gen++;
    t->used = 1;
    t->failed_prefetch = 0;
    j->epoch = f->lora.lora_epoch;
    j->out_dtype = t->out_dtype;
    j->out_bytes = t->out_bytes;
    j->transformed = ferry__transformed(t);
    j->load = ferry__policy_of(f, t)->load;
    j->lock = ferry__policy_of(f, t)->lock && !t->lazy;
    j->t = t;
    j->prefetch = prefetch;
    j->hint = prefetch && f->moe.guess == t;
    j->fill = fill;
    j->next = NULL;
    reg_plan(f, t, j);
    /* a demand load goes before the prefetches not started: a prepare waits for it now, they
     * are for later */
    ferry__job **pp = &f->jobs.queue_head;
    while (!prefetch && *pp && !(*pp)->prefetch)
        pp = &(*pp)->next;
    if (prefetch || !*pp) {
        if (f->jobs.queue_tail)
            f->jobs.queue_tail->next = j;
        else
            f->jobs.queue_head = j;
        f->jobs.queue_tail = j;
    } else {
        j->next = *pp;
        *pp = j;
    }
    if (prefetch)
        f->prefetch.inflight_prefetch++;
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
        if (ferry__bind(f, ferry__bind_root(t), NULL))
            return FERRY__PF_SKIP;
    }
    /* an expert slice comes in when the engine asks (ferry_prefetch), and so does a tensor cut
     * into slices: its slices are what is used. Under FERRY_SLICE_EVICT_CYCLIC slices are in
     * the recorded order as tensors are, and come in by it. */
    if (ferry__expert_unit(f, t) || t->n_slices)
        return FERRY__PF_SKIP;
    if (t->removed || t->ignored || t->lazy || t->n_parts || (t->parent && t->parent->ignored) ||
        (t->group >= 0 && f->place.groups[t->group].removing))
        return FERRY__PF_SKIP;
    if (t->comp.state == FERRY__READY && !t->comp.ahead)
        return FERRY__PF_KEPT;
    *bytes = t->out_bytes;
    return t->comp.state == FERRY__EMPTY ? FERRY__PF_ABSENT : FERRY__PF_AHEAD;
}

/* As pf_probe, for the prefetch that follows the file order: a guess never loads a home copy
 * (held for good, it would take its room from the budget at the guess's risk), only copies that
 * come and go: a home-disk tensor's copy, or one staged from a home copy already loaded. */
static ferry__pf_state pf_probe_follow(void *ctx, uint32_t id, uint64_t *bytes)
{
    ferry *f = ctx;
    ferry__pf_state st = pf_probe(ctx, id, bytes);
    if (st != FERRY__PF_ABSENT)
        return st;
    const ferry_tensor *t = f->all[id];
    ferry_home home = ferry__effective_home(f, t);
    if (home == FERRY_HOME_DISK || (home == FERRY_HOME_HOST && t->host.state == FERRY__READY))
        return st;
    return FERRY__PF_SKIP;
}

/* Queues a prefetch of ID, evicting only copies used later than K prepares from now. */
static int pf_queue(void *ctx, uint32_t id, size_t k)
{
    ferry *f = ctx;
    unsigned before = f->prefetch.inflight_prefetch;
    /* a hint that does not fit is no error */
    int rc = ferry__enqueue(f, f->all[id], 0, 1, k, NULL);
    return rc ? -1 : f->prefetch.inflight_prefetch > before;
}

/* As pf_queue, for the prefetch that follows the file order: the job (the last queued) is marked
 * a guess, which a failed prepare waits for (prepare.c, bring_wait). */
static int pf_queue_follow(void *ctx, uint32_t id, size_t k)
{
    ferry *f = ctx;
    int r = pf_queue(ctx, id, k);
    ferry__job *tail = f->jobs.queue_tail;
    if (r > 0 && tail && tail->t == f->all[id] && !tail->guess) {
        tail->guess = 1;
        f->prefetch.inflight_guess++;
    }
    return r;
}

/* Queues prefetches of what the schedule says comes next, within a window of the last prepared
 * set's bytes (the W of "M - B + W": it hides the reads behind the compute of the current set);
 * before a schedule exists, of what comes next in file order while the prepares follow it. */
void ferry__prefetch_ahead(ferry *f)
{
    if (f->jobs.closing || f->prefetch.inflight_prefetch >= FERRY__MAX_PREFETCH)
        return;
    ferry__pf_limits lim = {.window = f->prefetch.last_set_bytes,
                            .scan = FERRY__PREFETCH_SCAN,
                            .slots = FERRY__MAX_PREFETCH - f->prefetch.inflight_prefetch};
    if (f->sched.complete)
        ferry__prefetch_plan(&f->sched, lim, pf_probe, pf_queue, f);
    else
        ferry__prefetch_plan_follow(&f->prefetch.follow, &f->sched, lim, pf_probe_follow,
                                    pf_queue_follow, f);
}

typedef struct file_key {
    size_t file;   /* the file's rank in the order files were opened */
    uint64_t offset;
    uint32_t uid;
} file_key;

static int file_key_cmp(const void *a, const void *b)
{
    const file_key *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->uid < y->uid ? -1 : x->uid > y->uid;
}

/* Gives the follower the catalog's tensors in file order (files in the order they were opened,
 * the tensors of each by data offset) when files were opened since it last got them. Without
 * memory for it the follower has no order and plans nothing. Lock held. */
static void follow_order(ferry *f)
{
    if (f->prefetch.follow_tensors == f->n_tensors || !f->sched.enabled)
        return;
    f->prefetch.follow_tensors = f->n_tensors;
    size_t n = f->n_tensors, n_files = 0;
    file_key *k = malloc((n ? n : 1) * sizeof *k);
    const ferry__iofile **files = malloc((n ? n : 1) * sizeof *files);
    uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (k && files && ids) {
        for (size_t i = 0; i < n; i++) {
            const ferry_tensor *t = f->tensors[i];
            size_t r = n_files;
            /* a file's tensors are neighbours in the catalog: look from the last file back */
            while (r > 0 && files[r - 1] != t->file)
                r--;
            if (r == 0) {
                files[n_files++] = t->file;
                r = n_files;
            }
            k[i] = (file_key){.file = r - 1, .offset = t->info.offset, .uid = t->uid};
        }
        qsort(k, n, sizeof *k, file_key_cmp);
        for (size_t i = 0; i < n; i++)
            ids[i] = k[i].uid;
        if (ferry__pf_follow_set_order(&f->prefetch.follow, ids, n, f->n_all))
            ferry__pf_follow_free(&f->prefetch.follow);
    } else {
        ferry__pf_follow_free(&f->prefetch.follow);
    }
    free(k);
    free(files);
    free(ids);
}

void ferry__prefetch_note(ferry *f, ferry_tensor *const *u, size_t nu)
{
    if (!f->sched.enabled)
        return;
    follow_order(f);
    uint32_t local[64];
    uint32_t *ids = nu <= 64 ? local : malloc(nu * sizeof *ids);
    if (!ids) {
        ferry__pf_follow_free(&f->prefetch.follow); /* cannot follow this set: follow nothing */
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < nu; i++)
        if (!ferry__expert_unit(f, u[i])) /* not in the file order the follower reads */
            ids[k++] = u[i]->uid;
    if (k)
        ferry__pf_follow_touch(&f->prefetch.follow, &f->sched, ids, k);
    if (ids != local)
        free(ids);
}

/* After the last release: a copy of an old LoRA epoch goes (re-staged at the next prepare);
 * any other stays cached until its device's budget needs the room. */
void ferry__drop_if_unkept(ferry *f, ferry_tensor *t)
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

void ferry__release_one(ferry *f, ferry_tensor *t)
{
    t->refs--;
    t->comp.last_use = ++f->clock;
    ferry__drop_if_unkept(f, t);
}

/* Records job J's mlock of its tensor's mapping on the copy that is the mapping, or undoes it
 * when that copy went meanwhile. Lock held. */
static void settle_lock(ferry *f, const ferry__job *j)
{
    ferry_tensor *t = j->t;
    if (j->mlock_refused)
        ferry__add_stat(&f->a_lock_failures, 1);
    if (!j->mlocked)
        return;
    ferry__copy *c = t->comp.state == FERRY__READY && t->comp.mapped   ? &t->comp
                     : t->host.state == FERRY__READY && t->host.mapped ? &t->host
                                                                       : NULL;
    if (!c) {
        ferry__host_unlock((unsigned char *)t->file->map + t->info.offset, j->mlocked);
    } else if (!c->locked) { /* else the same range is locked and recorded already */
        c->locked = j->mlocked;
        ferry__add_stat(&f->a_locked_bytes, j->mlocked);
    }
}

void ferry__finish_job(ferry *f, ferry__job *j, int fill, int rc, const ferry__err *e)
{
    ferry_tensor *t = j->t;
    if (j->prefetch)
        f->prefetch.inflight_prefetch--;
    if (j->guess)
        f->prefetch.inflight_guess--;
    if (fill & FILL_LOCK)
        settle_lock(f, j);
    if (fill & (FILL_POPULATE | FILL_LOCK)) {
        /* The mapping works without it: a failed populate leaves the pages to fault in. */
        t->populating = 0;
        if (fill & FILL_POPULATE)
            t->populated = 1;
        if (!(fill & ~(FILL_POPULATE | FILL_LOCK)))
            return;
    }
    if (rc) {
        reg_settle(f, t, j); /* before a host copy filled by this job is freed */
        if (fill & FILL_COMP) {
            ferry__copy_failed(f, t, &t->comp, rc);
            t->failed_prefetch = j->prefetch;
        }
        if (fill & FILL_HOST) {
            if (t->host.locked)
                ferry__host_unlock(t->host.ptr, t->host.locked);
            ferry__copy_failed(f, t, &t->host, rc);
        }
        /* A prefetch's failure is no one's error unless a prepare waits for it (then the
         * prepare retries it as its own load). */
        if (!j->prefetch) {
            free(t->fail_msg);
            t->fail_msg = ferry__strdup(e->msg);
        }
    } else {
        if (fill & FILL_HOST)
            ferry__copy_ready(f, t, &t->host);
        reg_settle(f, t, j);
        if (fill & FILL_COMP) {
            if (j->hint) {
                t->guess_loaded = 1;
                f->stats.guess_bytes += j->out_bytes;
            }
            t->comp.ahead = j->prefetch;
            t->comp.last_use = ++f->clock;
            t->comp.epoch = j->epoch;
            t->comp.merged = j->n_terms > 0;
            ferry__copy_ready(f, t, &t->comp);
            /* The adapter set changed while this ran: the copy is of the old epoch. */
            if (j->epoch != f->lora.lora_epoch && (t->comp.merged || t->merge || t->n_terms))
                t->stale = 1;
            /* On the host, an unmerged home copy made from the pristine host copy makes that
             * one redundant (it was kept for merges). */
            if (t->comp.permanent && !t->comp.merged && t->host.state == FERRY__READY &&
                ferry__host_side(f, t->comp.dev) && !t->stale)
                ferry__drop_copy(f, t, &t->host);
        }
    }
    /* Decided under an older adapter set, or loaded for a prepare that has since failed. A
     * prefetched copy waits for the prepare it was fetched for (dropping it here would let the
     * next prefetch fetch it again, forever). */
    ferry__evictable_note(f, t);
    if (!t->refs && (!j->prefetch || t->stale))
        ferry__drop_if_unkept(f, t);
}

static void *loader_main(void *arg)
{
    ferry *f = arg;
    ferry__loader_ctx lc = {0};
    ferry__err *e = malloc(sizeof *e);
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->jobs.queue_head && !f->jobs.closing)
            pthread_cond_wait(&f->work, &f->lock);
        ferry__job *j = f->jobs.queue_head;
        if (!j)
            break; /* closing and drained */
        f->jobs.queue_head = j->next;
        if (!f->jobs.queue_head)
            f->jobs.queue_tail = NULL;
        int fill = j->fill;
        int rc;
        if (!e) /* refused at the loader's start: asked again, or this job fails, not all */
            e = malloc(sizeof *e);
        if (f->jobs.closing || !e) {
            rc = f->jobs.closing ? FERRY_ECANCELED : FERRY_ENOMEM;
            if (e)
                ferry__fail(e, rc, "tensor '%s': load cancelled (closing)", j->t->info.name);
        } else {
            f->jobs.running++;
            pthread_mutex_unlock(&f->lock);
            ferry__err_clear(e);
            rc = run_job(f, &lc, j, e);
            pthread_mutex_lock(&f->lock);
            f->jobs.running--;
        }
        ferry__err fallback = {.code = FERRY_ENOMEM, .msg = "out of memory"};
        ferry__finish_job(f, j, fill, rc, e ? e : &fallback);
        int was_prefetch = j->prefetch;
        ferry__job_recycle(f, j);
        if (!f->jobs.running && f->lora.n_adapters)
            ferry__lora_sweep(f);
        pthread_cond_broadcast(&f->cond);
        if (was_prefetch && !rc)
            ferry__prefetch_ahead(f);
    }
    pthread_mutex_unlock(&f->lock);
    ferry__loader_ctx_free(&lc);
    free(e);
    return NULL;
}

/* Loaders: as many as I/O workers (at least 2), and at least FERRY__DEVICE_LOADERS once a device
 * the host cannot read is added (ferry__loaders_for_device). Each loader has one tensor in flight
 * and, copying to a device, waits for its last chunks before the next: with 2 the link idles at
 * every layer. */
#define FERRY__DEVICE_LOADERS 4u

static int loaders_add(ferry *f, unsigned want)
{
    for (unsigned i = f->jobs.n_loaders; i < want && i < f->jobs.cap_loaders; i++) {
        if (pthread_create(&f->jobs.loaders[i], NULL, loader_main, f) != 0)
            return FERRY_ENOMEM;
        f->jobs.n_loaders = i + 1;
    }
    return 0;
}

int ferry__loaders_start(ferry *f)
{
    unsigned n = f->opt.io_threads < 2 ? 2 : f->opt.io_threads;
    f->jobs.cap_loaders = n < FERRY__DEVICE_LOADERS ? FERRY__DEVICE_LOADERS : n;
    f->jobs.loaders = calloc(f->jobs.cap_loaders, sizeof *f->jobs.loaders);
    if (!f->jobs.loaders)
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
    if (!f->jobs.loaders)
        return;
    pthread_mutex_lock(&f->lock);
    f->jobs.closing = 1;
    pthread_cond_broadcast(&f->work);
    pthread_mutex_unlock(&f->lock);
    for (unsigned i = 0; i < f->jobs.n_loaders; i++)
        pthread_join(f->jobs.loaders[i], NULL);
    free(f->jobs.loaders);
    f->jobs.loaders = NULL;
    while (f->jobs.free_jobs) {
        ferry__job *j = f->jobs.free_jobs;
        f->jobs.free_jobs = j->next;
        free(j);
    }
}

void ferry__release_tensor(ferry *f, ferry_tensor *t)
{
    ferry__release_one(f, t);
    for (int k = 0; k < t->n_parts; k++)
        if (t->parts[k]->refs > 0)
            ferry__release_one(f, t->parts[k]);
}
