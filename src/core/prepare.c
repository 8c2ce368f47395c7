/*
 * prepare.c — the public residency calls: prepare / release / prefetch and group loads (through
 * arenas, arena.c), with progress and cancellation. Jobs and loader threads are in jobs.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/load.h"
#include "devices/devices.h"
#include "dtype/dtype.h"
#include "sched/prefetch.h"

/* ---- the public residency calls ------------------------------------------------------------- */

/* Checks a tensor handle given by the engine. Lock held. */
int ferry__usable(ferry *f, ferry_tensor *t, ferry__err *e)
{
    if (!t)
        return ferry__fail(e, FERRY_EINVAL, "NULL tensor");
    if (t->removed)
        return ferry__fail(e, FERRY_ENOENT, "tensor '%s': its group was removed",
                           t->info.name);
    int rc = ferry__bind(f, t, e);
    if (rc)
        return rc;
    if (t->ignored)
        return ferry__fail(e, FERRY_ENOENT, "tensor '%s' is ignored by policy",
                           t->info.name);
    if (t->is_slice && t->parent->merge)
        return ferry__fail(e, FERRY_EUNSUPPORTED,
                           "slice '%s': its tensor has LoRA adapters merged, which slices do not "
                           "take (prepare the whole tensor, or use lora mode runtime)",
                           t->info.name);
    if (t->group >= 0 && f->place.groups[t->group].removing)
        return ferry__fail(e, FERRY_EBUSY, "tensor '%s': its group '%s' is being removed",
                           t->info.name, f->place.groups[t->group].name);
    return ferry__check_expect(t, e);
}

/* ---- group loads through arenas (arena.c) ----------------------------------------------------- */

/* Which copy of T a load reads from its file, as it is, into private host memory (as ferry__needs()
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
    if (ferry__host_side(f, t->compute_dev) && !t->merge)
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
    if (f->jobs.closing || t->populating || ferry__needs(f, t, 1) != want)
        return 0;
    ferry__copy *c = want == FILL_COMP ? &t->comp : &t->host;
    ferry__mem m;
    if (ferry__reserve_bytes(f, FERRY__HOST, ferry__host_alloc_size(t, 0), &m, NULL))
        return 0;
    ferry__arena_place(a, i, &m);
    if (want == FILL_HOST)
        a->claimed[i] |= FERRY__CLAIMED_HOST;
    if (ferry__policy_of(f, t)->lock)
        a->claimed[i] |= FERRY__CLAIMED_LOCK;
    c->ptr = (unsigned char *)m.base + t->info.offset % FERRY__IO_ALIGN;
    ferry__copy_loading(f, t, c, m);
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
    if (L->each_chunk)
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
    pthread_cond_signal(&L->c); /* every one: the waiter counts them, and reports progress */
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
    if (!f->progress.fn || !n || !(p->todo = calloc(n, 1)))
        return;
    for (size_t i = 0; i < n; i++)
        if (!unit_ready(ts[i], home_only) && !ts[i]->lazy) {
            p->todo[i] = 1;
            p->total += ts[i]->out_bytes;
        }
    if (p->total) {
        p->fn = f->progress.fn;
        p->ud = f->progress.ud;
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
    ferry__job **pp = &f->jobs.queue_head, *prev = NULL;
    while (*pp) {
        ferry__job *j = *pp;
        if (!j->t->canceling) {
            prev = j;
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (f->jobs.queue_tail == j)
            f->jobs.queue_tail = prev;
        ferry__err e;
        ferry__fail(&e, FERRY_ECANCELED, "tensor '%s': load cancelled", j->t->info.name);
        ferry__finish_job(f, j, j->fill, FERRY_ECANCELED, &e);
        ferry__job_recycle(f, j);
    }
    for (size_t i = 0; i < n; i++)
        ts[i]->canceling = 0;
    pthread_cond_broadcast(&f->cond);
}

static int canceled_fail(const load_progress *p, ferry__err *e)
{
    char a[32], b[32];
    return ferry__fail(e, FERRY_ECANCELED,
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
    /* without a callback, no one to wake at each chunk (32 relay readers woke the waiter every
     * 512 KiB) */
    L->each_chunk = p && p->fn;
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
            ferry__add_stat(&f->a_bytes_read, r->req.len);
            for (size_t i = r->first; i < r->end; i++) {
                ferry_tensor *t = a->ts[i];
                ferry__copy *c = a->claimed[i] & FERRY__CLAIMED_HOST ? &t->host : &t->comp;
                if (a->claimed[i])
                    ferry__lock_copy(f, a->claimed[i] & FERRY__CLAIMED_LOCK, c, t->info.nbytes);
            }
            if (t0)
                ferry__trace_addf(f, "io", t0, ferry__now(), "read %s and on",
                                  a->ts[r->first]->info.name);
        }
}

/* Makes the claimed copies READY, or EMPTY with the error when their read failed (their pages
 * given back); the first failure goes into E and is the return value. As
 * finish_job does for a job's copy: a copy whose adapter set changed while it was read is stale,
 * and one nobody holds is dropped if its tensor no longer wants it. Lock held. */
static int arena_settle(ferry *f, ferry__arena_load *L, ferry__err *e)
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
                    c->last_use = ++f->clock;
                    c->epoch = a->epoch;
                    ferry__copy_ready(f, t, c);
                    if (a->epoch != f->lora.lora_epoch && (t->merge || t->n_terms))
                        t->stale = 1;
                    if (!t->refs)
                        ferry__drop_if_unkept(f, t);
                    continue;
                }
                ferry__arena_trim(c->ptr, t->info.nbytes); /* never locked: its read failed */
                ferry__copy_failed(f, t, c, r->status); /* a host copy: c->dev is the host */
                if (!rc) {
                    /* name the tensor whose bytes the failed read was to bring */
                    for (size_t j = r->first; j < r->end; j++)
                        if (a->claimed[j] && a->ts[j]->info.offset + a->ts[j]->info.nbytes >
                                                 r->req.err_offset) {
                            t = a->ts[j];
                            break;
                        }
                    rc = ferry__fail(e, r->status, "tensor '%s': %s", t->info.name,
                                     r->req.errmsg[0] ? r->req.errmsg
                                                      : ferry_strerror(r->status));
                    ferry__fail_append(e, 0, "(one read of %llu bytes for %zu tensors)",
                                       (unsigned long long)r->req.len, r->end - r->first);
                }
            }
        }
    pthread_cond_broadcast(&f->cond);
    return rc;
}

static int bring_wait(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                      int from_prepare, load_progress *p, ferry__err *e);

/* Waits until every tensor of TS has its comp copy READY, queuing loads as needed. Lock held.
 * Each tensor already holds a reference (so nothing of the set is evicted meanwhile). A group
 * load (HOME_ONLY, not FROM_PREPARE) first reads the private host copies of runs of neighbouring
 * tensors as whole ranges of their files into arenas, on the I/O pool, while the calling thread
 * waits without the lock; what is left goes through jobs as in any other load. */
static int bring_arena(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                       int from_prepare, load_progress *p, ferry__err *e);

static int bring(ferry *f, ferry_tensor *const *ts, size_t n, int home_only, int from_prepare,
                 ferry__err *e)
{
    load_progress p;
    progress_begin(f, &p, ts, n, home_only);
    progress_report(f, &p, 0, 1);
    int rc = bring_arena(f, ts, n, home_only, from_prepare, &p, e);
    if (!rc && p.canceled)
        rc = canceled_fail(&p, e);
    progress_end(&p);
    return rc;
}

static int bring_arena(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                       int from_prepare, load_progress *p, ferry__err *e)
{
    if (!home_only || from_prepare || n < 2 || p->canceled)
        return p->canceled ? 0 : bring_wait(f, ts, n, home_only, from_prepare, p, e);
    ferry__arena *list = NULL;
    for (size_t i = 0; i < n; i++)
        if (!ts[i]->arena) /* else another group load is reading it */
            ts[i]->arena_copy = file_copy(f, ts[i]);
    ferry__arena_plan(ts, n, arena_span, &list);
    int reads = 0, rc = 0, huge = list && !ferry__host_huge_pages_dear();
    for (ferry__arena *a = list; a; a = a->next) {
        a->epoch = f->lora.lora_epoch;
        for (size_t i = 0; i < a->n; i++)
            arena_claim(f, a, i);
        ferry__arena_ranges(a, huge, f->relay);
        reads |= a->n_reads > 0;
    }
    ferry__arena_load L;
    /* relayed reads fault their destinations in themselves (io.h, `relay`): a toucher racing
     * them only took the CPU and the pages' locks from them (a cold 2 GiB load read 2.0-2.2
     * GB/s with it, 2.6-2.8 without) */
    ferry__arena_begin(&L, list, reads && !f->relay);
    if (reads) {
        pthread_mutex_unlock(&f->lock);
        arena_read(f, &L, p);
        ferry__arena_stop(&L);
        pthread_mutex_lock(&f->lock);
        rc = arena_settle(f, &L, e);
        if (p->canceled) {
            rc = 0; /* reported as the cancellation by bring */
            ferry__err_clear(e);
        }
    }
    if (!rc && !p->canceled)
        rc = bring_wait(f, ts, n, home_only, from_prepare, p, e);
    ferry__arena_end(&L);
    return rc;
}

static int bring_wait(ferry *f, ferry_tensor *const *ts, size_t n, int home_only,
                      int from_prepare, load_progress *p, ferry__err *e)
{
    uint64_t local[64];
    uint64_t *seen = n <= 64 ? local : calloc(n, sizeof *seen);
    if (!seen)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    memset(seen, 0, FERRY__MIN(n, 64) * sizeof *seen);
    int rc = 0, prefetched = 0, prefetch_waits = 0;
    double waited = 0;
    for (size_t i = 0; i < n && from_prepare; i++) {
        /* Only copies that come and go can hit or miss. */
        ferry_tensor *t = ts[i];
        int mapped = t->lazy || (t->zero_copy && ferry__host_side(f, t->compute_dev) && !t->merge);
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
                if ((rc = ferry__bind(f, ferry__bind_root(t), e)) != 0)
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
                /* its load failed: the loader left the message in the tensor */
                rc = t->comp.status ? t->comp.status : FERRY_EIO;
                ferry__fail(e, rc, "%s", t->fail_msg ? t->fail_msg : ferry_strerror(rc));
                break;
            }
            uint64_t gen = t->load_gen;
            rc = ferry__enqueue(f, t, home_only, 0, 0, e);
            if (rc == FERRY_EBUDGET && f->fences.head) {
                /* the room is held by releases waiting on the engine's events: wait for the
                 * oldest (without the lock), then try again */
                ferry__err_clear(e);
                ferry__fences_wait_oldest(f);
                rc = 0;
                again = 1;
                break;
            }
            if (rc == FERRY_EBUDGET && f->prefetch.inflight_prefetch &&
                prefetch_waits++ < 4 * FERRY__MAX_PREFETCH) {
                /* the room is held by prefetches in flight: once one lands its copy may be
                 * evicted for this load (bounded: landing prefetches may queue others) */
                ferry__err_clear(e);
                pthread_cond_wait(&f->cond, &f->lock);
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
                rc = canceled_fail(p, e);
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
            ferry__prefetch_ahead(f);
        double t0 = ferry__now();
        pthread_cond_wait(&f->cond, &f->lock);
        double t1 = ferry__now();
        waited += t1 - t0;
        ferry__trace_add(f, "wait", "wait", t0, t1);
    }
    if (rc) {
        /* The set's other loads still in flight settle before the failure is returned, so that
         * a failed call leaves none of its set loading. Prefetches queued on a guess of the file
         * order (before a schedule) settle too, none is queued meanwhile, and the next prepare
         * follows the file order from where it is. */
        if (from_prepare && !f->prefetch.follow.stopped)
            ferry__pf_follow_reset(&f->prefetch.follow);
        for (int busy = 1; busy && !f->jobs.closing;) {
            busy = from_prepare && f->prefetch.inflight_guess;
            for (size_t i = 0; i < n && !busy; i++)
                busy = ts[i]->comp.state == FERRY__LOADING ||
                       ts[i]->host.state == FERRY__LOADING || ts[i]->populating;
            if (busy)
                pthread_cond_wait(&f->cond, &f->lock);
        }
    }
    f->stats.wait_seconds += waited;
    if (seen != local)
        free(seen);
    return rc;
}

/* The residency units of TS: each split tensor's parts in its place. *OUT is TS itself when nothing
 * is split, else a malloc'd array the caller frees. Lock held; tensors bound. */
static int expand(ferry_tensor *const *ts, size_t n, ferry_tensor ***out, size_t *nout,
                  ferry__err *e)
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
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
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
                         size_t *nout, ferry__err *e)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry__usable(f, ts[i], e);
    if (!rc)
        ferry__cold_decide(f, ts, n);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    if (!rc)
        rc = expand(ts, n, &u, &nu, e);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        ts[i]->used = 1;
        f->stats.prepares++;
        if (ts[i]->n_parts)
            ts[i]->refs++;
    }
    uint64_t set_bytes = 0;
    size_t dense = 0;
    for (size_t i = 0; i < nu; i++) {
        u[i]->refs++;
        ferry__evictable_note(f, u[i]);
        u[i]->used = 1;
        /* expert units stay out of the recorded order: their use depends on the data */
        if (ferry__expert_unit(f, u[i]))
            continue;
        ferry__sched_touch(&f->sched, u[i]->uid);
        set_bytes += u[i]->out_bytes;
        dense++;
    }
    ferry__prefetch_note(f, u, nu);
    if (dense) /* the window is the last set of scheduled tensors' bytes */
        f->prefetch.last_set_bytes = set_bytes;
    *out = u;
    *nout = nu;
    return 0;
}

void ferry__prepare_undo(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                         size_t nu)
{
    for (size_t i = 0; i < nu; i++) {
        u[i]->refs--;
        ferry__drop_if_unkept(f, u[i]);
    }
    for (size_t i = 0; i < n; i++)
        if (ts[i]->n_parts) {
            ts[i]->refs--;
            ferry__drop_if_unkept(f, ts[i]);
        }
}

int ferry__prepare_finish(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                          size_t nu, ferry__err *e)
{
    int rc = bring(f, (ferry_tensor **)u, nu, 0, 1, e);
    if (rc == FERRY_EIO) {
        /* a read that failed because the file changed meanwhile: say so */
        pthread_mutex_unlock(&f->lock);
        rc = ferry__check_after_eio(u, nu, e);
        pthread_mutex_lock(&f->lock);
    }
    if (rc) {
        ferry__prepare_undo(f, ts, n, u, nu);
        return rc;
    }
    for (size_t i = 0; i < nu; i++) {
        u[i]->comp.last_use = ++f->clock;
        u[i]->comp.ahead = 0;
        u[i]->guess_loaded = 0;
    }
    if (f->moe.on)
        ferry__moe_used(f, u, nu);
    ferry__prefetch_ahead(f);
    return 0;
}

void ferry__prepare_queue(ferry *f, ferry_tensor *const *u, size_t nu)
{
    /* what cannot be queued now is queued (and reported) by the wait */
    for (size_t i = 0; i < nu; i++)
        if (u[i]->comp.state == FERRY__EMPTY)
            (void)ferry__enqueue(f, u[i], 0, 0, 0, NULL);
    ferry__prefetch_ahead(f);
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

int ferry_prepare(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    /* a file that changed since it was opened fails before anything of it is used */
    ferry__err e[1];
    ferry__err_clear(e);
    if (ferry__check_tensors(ts, n, FERRY__PATH_RATE, e))
        return ferry__publish(f, FERRY_ECHANGED, e);
    pthread_mutex_lock(&f->lock);
    ferry__fences_reap(f);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    int rc = ferry__prepare_begin(f, ts, n, &u, &nu, e);
    if (!rc)
        rc = ferry__prepare_finish(f, ts, n, u, nu, e);
    if (u && u != ts)
        free(u);
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_release(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor *t = ts[i];
        if (!t || t->refs - t->fenced <= 0) {
            rc = ferry__fail(e, FERRY_EINVAL, "release of tensor '%s' that is not prepared",
                             t ? t->info.name : "(null)");
            continue;
        }
        ferry__release_tensor(f, t);
    }
    ferry__fences_reap(f);
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
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
    while (f->prefetch.inflight_prefetch && !f->jobs.closing)
        pthread_cond_wait(&f->cond, &f->lock);
    for (size_t i = 0; i < f->n_all; i++) {
        f->all[i]->refs = 0;
        ferry__drop_if_unkept(f, f->all[i]);
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
        if (ferry__usable(f, ts[i], NULL))
            continue;
        int nparts = ts[i]->n_parts ? ts[i]->n_parts : 1;
        int stop = 0;
        for (int k = 0; k < nparts && !stop; k++) {
            ferry_tensor *t = ts[i]->n_parts ? ts[i]->parts[k] : ts[i];
            if (t->lazy || t->comp.state != FERRY__EMPTY)
                continue;
            uint64_t dist = ferry__sched_distance(&f->sched, t->uid);
            /* a hint: what does not fit now is loaded at prepare */
            stop = ferry__enqueue(f, t, 0, 1, dist == UINT64_MAX ? 0 : dist, NULL) != 0;
        }
        if (stop)
            break;
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_prefetch_guess(ferry *f, ferry_tensor *const *ts, size_t n)
{
    if (!f || (n && !ts))
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < n; i++) {
        if (ferry__usable(f, ts[i], NULL))
            continue;
        int nparts = ts[i]->n_parts ? ts[i]->n_parts : 1;
        for (int k = 0; k < nparts; k++) {
            ferry_tensor *t = ts[i]->n_parts ? ts[i]->parts[k] : ts[i];
            if (ferry__expert_unit(f, t) && t->uid < f->moe.n_ids) {
                /* kept from other loads until its layer's next use */
                t->guessed = 1;
                t->guess_at = f->moe.p.group_clock[f->moe.group[t->uid]];
            }
            if (t->lazy || t->comp.state != FERRY__EMPTY)
                continue;
            /* only copies that come and go: a home copy would hold its room for good */
            ferry_home home = ferry__effective_home(f, t);
            if (!(home == FERRY_HOME_DISK ||
                  (home == FERRY_HOME_HOST && t->host.state == FERRY__READY)))
                continue;
            f->moe.guess = t;
            (void)ferry__enqueue(f, t, 0, 1, UINT64_MAX, NULL); /* no room: not loaded */
            f->moe.guess = NULL;
        }
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_set_progress(ferry *f, ferry_progress_fn fn, void *user)
{
    if (!f)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    f->progress.fn = fn;
    f->progress.ud = user;
    pthread_mutex_unlock(&f->lock);
    return 0;
}

int ferry_load_group(ferry *f, const char *group)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0, found = group == NULL;
    ferry_tensor **set = malloc((f->n_tensors ? f->n_tensors : 1) * sizeof *set);
    size_t n = 0;
    if (!set) {
        pthread_mutex_unlock(&f->lock);
        return ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < f->n_tensors && !rc; i++) {
        ferry_tensor *t = f->tensors[i];
        if (t->removed)
            continue;
        if ((rc = ferry__bind(f, t, e)) != 0)
            break;
        const char *g = t->group >= 0 ? f->place.groups[t->group].name : "default";
        if (group && strcmp(g, group) != 0)
            continue;
        found = 1;
        if (!t->ignored)
            set[n++] = t;
    }
    if (!rc && !found)
        rc = ferry__fail(e, FERRY_ENOENT, "no group '%s'", group);
    if (!rc)
        ferry__cold_decide(f, set, n);
    ferry_tensor **u = NULL;
    size_t nu = 0;
    if (!rc)
        rc = expand(set, n, &u, &nu, e);
    if (!rc)
        rc = bring(f, u, nu, 1, 0, e);
    pthread_mutex_unlock(&f->lock);
    if (rc == FERRY_EIO)
        rc = ferry__check_after_eio(u, nu, e);
    if (u && u != set)
        free(u);
    free(set);
    return ferry__publish(f, rc, e);
}
