/*
 * sim.c — the "sim" device: a simulated accelerator, so that everything ferry does with device
 * memory (budgets, staging, asynchronous copies, failures) runs and is tested without one.
 *
 * Its memory is host memory, but ferry must treat it as device memory (host_accessible = 0); to
 * catch code that does not, every block is filled with FERRY__SIM_POISON when allocated, a copy
 * must lie inside one live block, and the host side of a copy must not be sim memory. The
 * capacity is never exceeded. Copies go to ONE worker thread per device and complete in FIFO
 * order; with a bandwidth limit each copy occupies the simulated link for n / rate seconds, back
 * to back, so that bytes / elapsed never exceeds the rate. Fault injection fails the N-th
 * allocation (FERRY_ENOMEM) or makes the N-th copy complete with FERRY_EDEVICE.
 * Events are records in a queue: the copy queue, or a compute queue (a second worker, started by
 * ferry__sim_stream) that stands for an engine's stream, where tests queue late "kernels" that
 * read device memory and waits on events, independent of the copies as a CUDA engine's stream is
 * of ferry's non-blocking copy stream.
 *
 * Locking: one mutex per device guards everything below `lock`; the worker runs memcpy and its
 * pacing sleep without it. Lock order: device lock, then the errmsg lock (device.c); the
 * implementation formats messages after unlocking wherever it can.
 */
#include "devices/devices.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* Within a run of back-to-back copies the link keeps cumulative bytes / elapsed at the rate: a
 * copy that finished late (the worker was preempted, memcpy was slow) is made up by the next
 * ones, but by at most this much, so that a slow spell cannot buy a long burst above the rate. */
#define SLACK_NS INT64_C(10000000)
/* The pacing sleep ends with a short busy wait, as sleeping wakes tens of microseconds late. */
#define SPIN_NS INT64_C(60000)

typedef struct sim_block {
    char *base;
    uint64_t size;    /* as requested (at least 1) */
    uint64_t charge;  /* size rounded up to the alignment: what it takes from the capacity */
    uint32_t pending; /* copies queued or running that touch this block */
    int freeing;      /* a free is waiting for pending to drop to 0 */
} sim_block;

/* Copies (the first three) take tickets; the others are the event and test-kernel work. */
enum { JOB_H2D, JOB_D2H, JOB_READ, JOB_RECORD, JOB_WAIT_EVENT, JOB_KERNEL };

/* An event: its records complete in the order of their queue. */
typedef struct sim_event {
    uint64_t recorded, done; /* records made / completed; complete when done >= recorded */
    uint32_t refs;           /* queued jobs that point here */
    int destroyed;           /* freed by the last of them */
} sim_event;

typedef struct sim_job {
    uint64_t ticket;  /* copies only; 0 for the others */
    char *dst;
    const char *src;
    uint64_t n;
    sim_block *blk;
    int64_t enqueued_ns;
    int kind;
    int fail; /* complete with FERRY_EDEVICE without copying (injected) */
    sim_event *ev;     /* JOB_RECORD, JOB_WAIT_EVENT */
    uint64_t seq;      /* the record it completes, or waits for */
    uint64_t delay_us; /* JOB_KERNEL */
    ferry__sim_kernel_fn fn;
    void *ud;
} sim_job;

struct sim_device;
/* A queue of work with its worker: the copy queue, and the compute queue the tests' "kernels" use
 * (ferry__sim_stream). */
typedef struct sim_queue {
    struct sim_device *s;
    pthread_t thread;
    int started;
    pthread_cond_t work_cv; /* the worker waits here for jobs or stop */
    sim_job *q;             /* ring of queued jobs (not the one running) */
    size_t qcap, qhead, qlen;
} sim_queue;

typedef struct sim_failed {
    uint64_t ticket;
    uint64_t n;
    int kind;
    int status;
} sim_failed;

typedef struct sim_device {
    ferry__devbase base; /* first: a sim_device * is a ferry_device * */
    uint64_t capacity;
    int poison;

    pthread_mutex_t lock;
    pthread_cond_t done_cv; /* waiters: a job completed (done_ticket, pending counts, events) */
    /* --- guarded by lock --- */
    sim_block **blocks; /* live blocks sorted by base address */
    size_t nblocks, cap_blocks;
    sim_queue cq;       /* copies (and records on the NULL stream) */
    sim_queue kq;       /* the compute queue, started by ferry__sim_stream */
    uint64_t last_ticket; /* tickets issued: 1..last_ticket */
    uint64_t done_ticket; /* every ticket <= done_ticket has completed (FIFO, one worker) */
    sim_failed *failed;   /* completed with an error and not yet waited on */
    size_t nfailed, cap_failed;
    size_t fail_queued;   /* failing copies queued or running; cap_failed >= nfailed + this */
    int stop;
    uint64_t rate;
    uint64_t fa_nth, fa_count, fc_nth, fc_count;
    int fa_every, fc_every;
    ferry__sim_stats st;
} sim_device;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    int64_t now = now_ns();
    if (t - now > SPIN_NS) {
        int64_t wake = t - SPIN_NS;
        struct timespec ts = {.tv_sec = wake / 1000000000, .tv_nsec = wake % 1000000000};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    while (now_ns() < t)
        ;
}

/* ---- blocks (lock held) ---------------------------------------------------------------------- */

/* Index of the first block whose base is > P (0..nblocks). */
static size_t upper_bound(const sim_device *s, uintptr_t p)
{
    size_t lo = 0, hi = s->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)s->blocks[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The block holding [P, P+N), or NULL. */
static sim_block *find_range(const sim_device *s, const void *p, uint64_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = upper_bound(s, a);
    if (i == 0)
        return NULL;
    sim_block *b = s->blocks[i - 1];
    uintptr_t base = (uintptr_t)b->base;
    if (a - base > b->size || n > b->size - (a - base))
        return NULL;
    return b;
}

/* Whether host range [P, P+N) overlaps any block. */
static int overlaps_blocks(const sim_device *s, const void *p, uint64_t n)
{
    if (n == 0)
        return 0;
    uintptr_t a = (uintptr_t)p, last;
    if (__builtin_add_overflow(a, n - 1, &last))
        last = UINTPTR_MAX;
    size_t i = upper_bound(s, last);
    if (i == 0)
        return 0;
    sim_block *b = s->blocks[i - 1];
    return (uintptr_t)b->base + b->size > a;
}

static int insert_block(sim_device *s, sim_block *b)
{
    if (s->nblocks == s->cap_blocks) {
        size_t cap = s->cap_blocks ? s->cap_blocks * 2 : 64;
        sim_block **nb = realloc(s->blocks, cap * sizeof *nb);
        if (!nb)
            return FERRY_ENOMEM;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    size_t i = upper_bound(s, (uintptr_t)b->base);
    memmove(s->blocks + i + 1, s->blocks + i, (s->nblocks - i) * sizeof *s->blocks);
    s->blocks[i] = b;
    s->nblocks++;
    return 0;
}

static void remove_block(sim_device *s, sim_block *b)
{
    size_t i = upper_bound(s, (uintptr_t)b->base);
    /* b is present: it is the last block whose base is <= its own base */
    i--;
    memmove(s->blocks + i, s->blocks + i + 1, (s->nblocks - i - 1) * sizeof *s->blocks);
    s->nblocks--;
}

/* ---- the worker -------------------------------------------------------------------------------- */

/* Makes room for N entries in the failed list; lock held. */
static int reserve_failed(sim_device *s, size_t n)
{
    if (n <= s->cap_failed)
        return 0;
    size_t cap = s->cap_failed ? s->cap_failed : 16;
    while (cap < n)
        cap *= 2;
    sim_failed *nf = realloc(s->failed, cap * sizeof *nf);
    if (!nf)
        return FERRY_ENOMEM;
    s->failed = nf;
    s->cap_failed = cap;
    return 0;
}

static void event_unref(sim_event *ev)
{
    if (--ev->refs == 0 && ev->destroyed)
        free(ev);
}

static void *worker_main(void *arg)
{
    sim_queue *wq = arg;
    sim_device *s = wq->s;
    int64_t busy_until = 0; /* when the simulated link is free again */
    /* Precise pacing sleeps; failure only costs precision. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);

    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (wq->qlen == 0 && !s->stop)
            pthread_cond_wait(&wq->work_cv, &s->lock);
        if (wq->qlen == 0)
            break; /* stop, and the queue is drained */
        sim_job j = wq->q[wq->qhead];
        wq->qhead = (wq->qhead + 1) % wq->qcap;
        wq->qlen--;
        if (j.kind == JOB_RECORD) {
            if (j.seq > j.ev->done)
                j.ev->done = j.seq;
            event_unref(j.ev);
            pthread_cond_broadcast(&s->done_cv);
            continue;
        }
        if (j.kind == JOB_WAIT_EVENT) {
            while (j.ev->done < j.seq)
                pthread_cond_wait(&s->done_cv, &s->lock);
            event_unref(j.ev);
            continue;
        }
        uint64_t rate = s->rate;
        pthread_mutex_unlock(&s->lock);

        if (j.kind == JOB_KERNEL) {
            if (j.delay_us)
                sleep_until(now_ns() + (int64_t)j.delay_us * 1000);
            j.fn(j.ud, j.src, j.n);
            pthread_mutex_lock(&s->lock);
            j.blk->pending--;
            pthread_cond_broadcast(&s->done_cv);
            continue;
        }
        int64_t start = now_ns();
        if (!j.fail && j.n)
            memcpy(j.dst, j.src, (size_t)j.n);
        if (rate && !j.fail && j.kind != JOB_READ) {
            int64_t origin = j.enqueued_ns;
            if (origin < busy_until)
                origin = busy_until;
            if (origin < start - SLACK_NS)
                origin = start - SLACK_NS;
            int64_t end = origin + (int64_t)((double)j.n * 1e9 / (double)rate + 0.5);
            sleep_until(end);
            busy_until = end;
        }

        pthread_mutex_lock(&s->lock);
        if (j.fail) {
            /* room was reserved when the copy was queued */
            s->failed[s->nfailed++] = (sim_failed){j.ticket, j.n, j.kind, FERRY_EDEVICE};
            s->fail_queued--;
        }
        s->done_ticket = j.ticket;
        if (j.blk)
            j.blk->pending--;
        s->st.copies_pending--;
        if (j.kind != JOB_READ) {
            s->st.copies++;
            if (j.fail)
                s->st.copy_failures++;
        }
        if (!j.fail) {
            if (j.kind == JOB_H2D)
                s->st.bytes_h2d += j.n;
            else
                s->st.bytes_d2h += j.n;
        }
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- operations --------------------------------------------------------------------------------- */

static void sim_destroy(ferry_device *d)
{
    sim_device *s = (sim_device *)d;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cq.work_cv);
    pthread_cond_signal(&s->kq.work_cv);
    int kq = s->kq.started;
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->cq.thread, NULL);
    if (kq)
        pthread_join(s->kq.thread, NULL);
    /* Blocks still live break the contract; they are released all the same. */
    for (size_t i = 0; i < s->nblocks; i++) {
        ferry__host_free(s->blocks[i]->base);
        free(s->blocks[i]);
    }
    free(s->blocks);
    free(s->cq.q);
    free(s->kq.q);
    free(s->failed);
    pthread_cond_destroy(&s->cq.work_cv);
    pthread_cond_destroy(&s->kq.work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int sim_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    sim_device *s = (sim_device *)d;
    char a[32], b[32], c[32];
    *ptr = NULL;
    uint64_t want = size ? size : 1, charge;
    int overflow = ferry__align_up(want, FERRY__DP(d).alignment, &charge);

    pthread_mutex_lock(&s->lock);
    s->st.alloc_calls++;
    int injected = 0;
    if (s->fa_nth && ++s->fa_count == s->fa_nth) {
        injected = 1;
        if (s->fa_every)
            s->fa_count = 0;
        else
            s->fa_nth = 0;
    }
    uint64_t used = s->st.used;
    int too_big = size > FERRY__DP(d).max_alloc || overflow;
    int full = !too_big && charge > s->capacity - used;
    if (injected || too_big || full) {
        s->st.alloc_failures++;
        uint64_t calls = s->st.alloc_calls;
        pthread_mutex_unlock(&s->lock);
        if (injected)
            return ferry__device_fail(d, FERRY_ENOMEM,
                                      "%s: allocation of %" PRIu64 " bytes failed: injected fault "
                                      "(allocation call %" PRIu64 ")",
                                      FERRY__DP(d).name, size, calls);
        if (too_big)
            return ferry__device_fail(d, FERRY_ENOMEM,
                                      "%s: allocation of %" PRIu64 " bytes exceeds max_alloc %" PRIu64,
                                      FERRY__DP(d).name, size, FERRY__DP(d).max_alloc);
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: out of device memory: requested %s (%" PRIu64 " bytes), "
                                  "used %s of %s",
                                  FERRY__DP(d).name, ferry__fmt_size(charge, a), charge,
                                  ferry__fmt_size(used, b), ferry__fmt_size(s->capacity, c));
    }
    /* Reserve the capacity now, so that concurrent allocations can never exceed it. */
    s->st.used += charge;
    if (s->st.used > s->st.peak_used)
        s->st.peak_used = s->st.used;
    pthread_mutex_unlock(&s->lock);

    sim_block *blk = malloc(sizeof *blk);
    char *mem = blk ? ferry__host_aligned_alloc(want, FERRY__DP(d).alignment) : NULL;
    if (mem && s->poison)
        memset(mem, FERRY__SIM_POISON, (size_t)want);

    pthread_mutex_lock(&s->lock);
    int rc = mem ? 0 : FERRY_ENOMEM;
    if (mem) {
        *blk = (sim_block){.base = mem, .size = want, .charge = charge};
        rc = insert_block(s, blk);
    }
    if (rc) {
        s->st.used -= charge;
        s->st.alloc_failures++;
    } else {
        s->st.allocs++;
        s->st.live_allocs++;
    }
    pthread_mutex_unlock(&s->lock);
    if (rc) {
        ferry__host_free(mem);
        free(blk);
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: host memory exhausted backing an allocation of %s",
                                  FERRY__DP(d).name, ferry__fmt_size(size, a));
    }
    *ptr = mem;
    return 0;
}

static void sim_free(ferry_device *d, void *ptr)
{
    sim_device *s = (sim_device *)d;
    if (!ptr)
        return;
    pthread_mutex_lock(&s->lock);
    sim_block *b = find_range(s, ptr, 0);
    if (!b || b->base != (char *)ptr || b->freeing) {
        s->st.misuse++;
        pthread_mutex_unlock(&s->lock);
        ferry__device_fail(d, FERRY_EINVAL, "%s: free of %p, which is not a live allocation",
                           FERRY__DP(d).name, ptr);
        return;
    }
    int waited = 0;
    if (b->pending) {
        /* The contract was broken (memory freed under a queued copy); waiting keeps the worker
         * from touching freed memory. */
        s->st.misuse++;
        waited = 1;
        b->freeing = 1;
        while (b->pending)
            pthread_cond_wait(&s->done_cv, &s->lock);
    }
    remove_block(s, b);
    s->st.used -= b->charge;
    s->st.live_allocs--;
    pthread_mutex_unlock(&s->lock);
    if (waited)
        ferry__device_fail(d, FERRY_EBUSY,
                           "%s: free of %p while a copy of it was in flight (waited for it)",
                           FERRY__DP(d).name, ptr);
    ferry__host_free(b->base);
    free(b);
}

/* Queues a job on WQ; lock held. The ring grows as needed. Copies take the next ticket. */
static int enqueue_on(sim_device *s, sim_queue *wq, sim_job *j)
{
    if (wq->qlen == wq->qcap) {
        size_t cap = wq->qcap ? wq->qcap * 2 : 64;
        sim_job *nq = malloc(cap * sizeof *nq);
        if (!nq)
            return FERRY_ENOMEM;
        for (size_t i = 0; i < wq->qlen; i++)
            nq[i] = wq->q[(wq->qhead + i) % wq->qcap];
        free(wq->q);
        wq->q = nq;
        wq->qcap = cap;
        wq->qhead = 0;
    }
    int copy = j->kind <= JOB_READ;
    j->ticket = copy ? ++s->last_ticket : 0;
    wq->q[(wq->qhead + wq->qlen) % wq->qcap] = *j;
    wq->qlen++;
    if (j->blk)
        j->blk->pending++;
    if (j->ev)
        j->ev->refs++;
    if (copy)
        s->st.copies_pending++;
    pthread_cond_signal(&wq->work_cv);
    return 0;
}

static int enqueue(sim_device *s, sim_job *j)
{
    return enqueue_on(s, &s->cq, j);
}

static const char *kind_name(int kind)
{
    return kind == JOB_H2D ? "copy_h2d" : kind == JOB_D2H ? "copy_d2h" : "read_sync";
}

/* Validates and queues a copy; DEV is the device side, HOST the host side. */
static int sim_copy(sim_device *s, int kind, void *dst, const void *src, uint64_t n,
                    uint64_t *ticket)
{
    ferry_device *d = &s->base.pub;
    const void *dev = kind == JOB_H2D ? dst : src;
    const void *host = kind == JOB_H2D ? src : dst;
    if (n && (!dst || !src))
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes with a NULL pointer",
                                  FERRY__DP(d).name, kind_name(kind), n);
    if (n > SIZE_MAX)
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes is too large",
                                  FERRY__DP(d).name, kind_name(kind), n);
    sim_job j = {.dst = dst, .src = src, .n = n, .kind = kind, .enqueued_ns = now_ns()};

    pthread_mutex_lock(&s->lock);
    sim_block *b = NULL;
    if (n) {
        b = find_range(s, dev, n);
        if (!b || b->freeing) {
            pthread_mutex_unlock(&s->lock);
            return ferry__device_fail(d, FERRY_EINVAL,
                                      "%s: %s: device range %p + %" PRIu64 " is not inside one "
                                      "live allocation",
                                      FERRY__DP(d).name, kind_name(kind), dev, n);
        }
        if (overlaps_blocks(s, host, n)) {
            pthread_mutex_unlock(&s->lock);
            return ferry__device_fail(d, FERRY_EINVAL,
                                      "%s: %s: host range %p + %" PRIu64 " is device memory",
                                      FERRY__DP(d).name, kind_name(kind), host, n);
        }
    }
    j.blk = b;
    /* The fault count moves only when the copy is queued: a refused copy queued nothing. */
    if (kind != JOB_READ && s->fc_nth && s->fc_count + 1 == s->fc_nth)
        j.fail = 1;
    /* A failing copy reserves its entry in the failed list now, so that the worker can always
     * record the failure. */
    int rc = j.fail ? reserve_failed(s, s->nfailed + s->fail_queued + 1) : 0;
    if (rc == 0)
        rc = enqueue(s, &j);
    if (rc == 0 && j.fail)
        s->fail_queued++;
    if (rc == 0 && kind != JOB_READ && s->fc_nth) {
        if (++s->fc_count == s->fc_nth) {
            if (s->fc_every)
                s->fc_count = 0;
            else
                s->fc_nth = 0;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (rc)
        return ferry__device_fail(d, rc, "%s: %s: out of memory queueing the copy", FERRY__DP(d).name,
                                  kind_name(kind));
    *ticket = j.ticket;
    return 0;
}

static int sim_copy_h2d(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return sim_copy((sim_device *)d, JOB_H2D, dst, src, n, ticket);
}

static int sim_copy_d2h(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return sim_copy((sim_device *)d, JOB_D2H, dst, src, n, ticket);
}

static int sim_wait(ferry_device *d, uint64_t ticket)
{
    sim_device *s = (sim_device *)d;
    pthread_mutex_lock(&s->lock);
    uint64_t last = s->last_ticket;
    if (ticket == 0 || ticket > last) {
        pthread_mutex_unlock(&s->lock);
        return ferry__device_fail(d, FERRY_EINVAL,
                                  "%s: wait on ticket %" PRIu64 ", which was never issued "
                                  "(last %" PRIu64 ")",
                                  FERRY__DP(d).name, ticket, last);
    }
    while (s->done_ticket < ticket)
        pthread_cond_wait(&s->done_cv, &s->lock);
    sim_failed f = {0};
    for (size_t i = 0; i < s->nfailed; i++) {
        if (s->failed[i].ticket == ticket) {
            f = s->failed[i];
            s->failed[i] = s->failed[--s->nfailed];
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (f.status)
        return ferry__device_fail(d, f.status,
                                  "%s: %s ticket %" PRIu64 " (%" PRIu64 " bytes) failed: injected "
                                  "fault (fail_copy)",
                                  FERRY__DP(d).name, kind_name(f.kind), ticket, f.n);
    return 0;
}

static int sim_synchronize(ferry_device *d)
{
    sim_device *s = (sim_device *)d;
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->last_ticket;
    while (s->done_ticket < target)
        pthread_cond_wait(&s->done_cv, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static int sim_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    sim_device *s = (sim_device *)d;
    pthread_mutex_lock(&s->lock);
    uint64_t used = s->st.used;
    pthread_mutex_unlock(&s->lock);
    if (free_bytes)
        *free_bytes = s->capacity - used;
    if (total_bytes)
        *total_bytes = s->capacity;
    return 0;
}

static int sim_host_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    char a[32];
    *ptr = ferry__host_aligned_alloc(size, 4096);
    if (!*ptr)
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: cannot allocate %s of host memory",
                                  FERRY__DP(d).name, ferry__fmt_size(size, a));
    return 0;
}

static void sim_host_free(ferry_device *d, void *ptr)
{
    (void)d;
    ferry__host_free(ptr);
}

static int sim_read_sync(ferry_device *d, void *dst, const void *src, uint64_t n)
{
    uint64_t t;
    int rc = sim_copy((sim_device *)d, JOB_READ, dst, src, n, &t);
    return rc ? rc : sim_wait(d, t);
}

/* ---- events ---------------------------------------------------------------------------------- */

/* The queue STREAM names: NULL is the copy queue, the handle of ferry__sim_stream the compute
 * queue; NULL for anything else. Lock held. */
static sim_queue *queue_of(sim_device *s, void *stream)
{
    if (!stream)
        return &s->cq;
    return stream == &s->kq && s->kq.started ? &s->kq : NULL;
}

static int sim_event_create(ferry_device *d, void **ev)
{
    *ev = calloc(1, sizeof(sim_event));
    return *ev ? 0 : ferry__device_fail(d, FERRY_ENOMEM, "%s: out of memory for an event", FERRY__DP(d).name);
}

static void sim_event_destroy(ferry_device *d, void *ev)
{
    sim_device *s = (sim_device *)d;
    sim_event *e = ev;
    if (!e)
        return;
    pthread_mutex_lock(&s->lock);
    e->destroyed = 1;
    int free_now = e->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (free_now)
        free(e);
}

static int sim_event_record(ferry_device *d, void *ev, void *stream)
{
    sim_device *s = (sim_device *)d;
    sim_event *e = ev;
    pthread_mutex_lock(&s->lock);
    sim_queue *wq = e ? queue_of(s, stream) : NULL;
    int rc = FERRY_EINVAL;
    if (wq) {
        sim_job j = {.kind = JOB_RECORD, .ev = e, .seq = e->recorded + 1};
        rc = enqueue_on(s, wq, &j);
        if (!rc)
            e->recorded++;
    }
    pthread_mutex_unlock(&s->lock);
    if (rc)
        return ferry__device_fail(d, rc, "%s: event record: %s", FERRY__DP(d).name,
                                  rc == FERRY_EINVAL ? "no such event or stream" : "out of memory");
    return 0;
}

static int sim_event_wait(ferry_device *d, void *ev, void *stream)
{
    sim_device *s = (sim_device *)d;
    sim_event *e = ev;
    if (!e)
        return ferry__device_fail(d, FERRY_EINVAL, "%s: event wait: no event", FERRY__DP(d).name);
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (!stream) {
        uint64_t target = e->recorded;
        while (e->done < target)
            pthread_cond_wait(&s->done_cv, &s->lock);
    } else if (e->done < e->recorded) {
        sim_queue *wq = queue_of(s, stream);
        sim_job j = {.kind = JOB_WAIT_EVENT, .ev = e, .seq = e->recorded};
        rc = wq ? enqueue_on(s, wq, &j) : FERRY_EINVAL;
    }
    pthread_mutex_unlock(&s->lock);
    if (rc)
        return ferry__device_fail(d, rc, "%s: event wait: %s", FERRY__DP(d).name,
                                  rc == FERRY_EINVAL ? "no such stream" : "out of memory");
    return 0;
}

static int sim_event_query(ferry_device *d, void *ev)
{
    sim_device *s = (sim_device *)d;
    sim_event *e = ev;
    if (!e)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    int done = e->done >= e->recorded;
    pthread_mutex_unlock(&s->lock);
    return done;
}

static const ferry_device_ops sim_ops = {
    .version = FERRY_DEVICE_OPS_VERSION,
    .size = sizeof(ferry_device_ops),
    .props = ferry__device_props_op,
    .errmsg = ferry__device_errmsg_op,
    .destroy = sim_destroy,
    .alloc = sim_alloc,
    .free = sim_free,
    .copy_h2d = sim_copy_h2d,
    .copy_d2h = sim_copy_d2h,
    .wait = sim_wait,
    .synchronize = sim_synchronize,
    .mem_info = sim_mem_info,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .read_sync = sim_read_sync,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_wait = sim_event_wait,
    .event_query = sim_event_query,
};

int ferry__sim_open(const char *spec, const ferry__sim_config *cfg, ferry_device **out, char *err,
                    size_t errlen)
{
    sim_device *s = calloc(1, sizeof *s);
    if (!s) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", spec);
        return FERRY_ENOMEM;
    }
    ferry__device_init(&s->base, &sim_ops, spec, "sim", cfg->alignment, cfg->max_alloc, 0);
    s->capacity = cfg->capacity;
    s->poison = cfg->poison;
    s->rate = cfg->rate;
    s->fa_nth = cfg->fail_alloc;
    s->fa_every = cfg->fail_alloc_every;
    s->fc_nth = cfg->fail_copy;
    s->fc_every = cfg->fail_copy_every;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cq.work_cv, NULL);
    pthread_cond_init(&s->kq.work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->cq.s = s->kq.s = s;
    int e = pthread_create(&s->cq.thread, NULL, worker_main, &s->cq);
    if (e) {
        pthread_cond_destroy(&s->cq.work_cv);
        pthread_cond_destroy(&s->kq.work_cv);
        pthread_cond_destroy(&s->done_cv);
        pthread_mutex_destroy(&s->lock);
        free(s);
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot start the copy thread: %s", spec, strerror(e));
        return FERRY_EDEVICE;
    }
    *out = &s->base.pub;
    return 0;
}

/* ---- test hooks ---------------------------------------------------------------------------------- */

static sim_device *as_sim(ferry_device *d)
{
    return d && d->ops == &sim_ops ? (sim_device *)d : NULL;
}

int ferry__sim_set_faults_every(ferry_device *d, uint64_t fail_alloc_nth, int alloc_every,
                                uint64_t fail_copy_nth, int copy_every)
{
    sim_device *s = as_sim(d);
    if (!s)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    s->fa_nth = fail_alloc_nth;
    s->fa_every = alloc_every != 0;
    s->fa_count = 0;
    s->fc_nth = fail_copy_nth;
    s->fc_every = copy_every != 0;
    s->fc_count = 0;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

void *ferry__sim_stream(ferry_device *d)
{
    sim_device *s = as_sim(d);
    if (!s)
        return NULL;
    pthread_mutex_lock(&s->lock);
    if (!s->kq.started && !s->stop &&
        pthread_create(&s->kq.thread, NULL, worker_main, &s->kq) == 0)
        s->kq.started = 1;
    void *h = s->kq.started ? &s->kq : NULL;
    pthread_mutex_unlock(&s->lock);
    return h;
}

int ferry__sim_kernel(ferry_device *d, void *stream, const void *dev, uint64_t n,
                      uint64_t delay_us, ferry__sim_kernel_fn fn, void *ud)
{
    sim_device *s = as_sim(d);
    if (!s || !fn)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    sim_queue *wq = queue_of(s, stream);
    sim_block *b = wq ? find_range(s, dev, n) : NULL;
    int rc = FERRY_EINVAL;
    if (b && !b->freeing) {
        sim_job j = {.kind = JOB_KERNEL, .src = dev, .n = n, .blk = b, .delay_us = delay_us,
                     .fn = fn, .ud = ud};
        rc = enqueue_on(s, wq, &j);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int ferry__sim_set_faults(ferry_device *d, uint64_t fail_alloc_nth, uint64_t fail_copy_nth)
{
    return ferry__sim_set_faults_every(d, fail_alloc_nth, 0, fail_copy_nth, 0);
}

int ferry__sim_set_rate(ferry_device *d, uint64_t bytes_per_s)
{
    sim_device *s = as_sim(d);
    if (!s)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    s->rate = bytes_per_s;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int ferry__sim_get_stats(ferry_device *d, ferry__sim_stats *out)
{
    sim_device *s = as_sim(d);
    if (!s || !out)
        return FERRY_EINVAL;
    pthread_mutex_lock(&s->lock);
    *out = s->st;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int ferry__sim_counters(ferry_device *d, uint64_t *allocs, uint64_t *copies, uint64_t *peak_used)
{
    ferry__sim_stats st;
    int rc = ferry__sim_get_stats(d, &st);
    if (rc)
        return rc;
    if (allocs)
        *allocs = st.allocs;
    if (copies)
        *copies = st.copies;
    if (peak_used)
        *peak_used = st.peak_used;
    return 0;
}
