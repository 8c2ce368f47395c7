/*
 * iopool.c — the I/O worker pool: requests (file range -> destination) are cut into chunks of
 * about FERRY__IO_CHUNK bytes that the workers take in queue order, so one large request is read
 * by every worker at once and several requests are in flight. When the last chunk of a request
 * finishes, a worker calls its done callback, exactly once, with the first error of any chunk.
 *
 * Locking. One mutex, io->mu, guards:
 *   - the run queues (q[i].head/tail): requests that still have chunks not handed out, in order;
 *   - the completion list (fin_head/fin_tail): requests whose done callback is due (every chunk
 *     finished or cancelled) and that no worker has picked up yet;
 *   - in every queued or running request: next_chunk, chunks_left, status, errmsg, next;
 *   - inflight (requests submitted whose done callback has not yet returned), stopping,
 *     done_bytes, total_bytes, progress_fn, progress_ud.
 * A second mutex, io->progress_mu, serialises calls of the progress callback and guards
 * progress_last, so the callback sees DONE only growing. Lock order: progress_mu before mu (a
 * progress callback may submit). No callback is ever called with mu held.
 * bytes_read is atomic and needs no lock. The request fields the caller filled in (file, offset,
 * len, dst, mode, done, ud) are read by the workers without the lock: they are written before
 * submit and never changed while queued.
 *
 * Done callbacks always run on a worker thread, also for requests cancelled before any chunk ran
 * and for empty requests: cancel_all moves those to the completion list, which workers serve
 * before taking more chunks. A done or progress callback may submit and may call cancel_all
 * (which then cancels without waiting: it cannot wait for its own callback); it must not call
 * destroy.
 *
 * Backends. The pool's side (queue, completion list, cancellation, progress, done callbacks) is
 * ferry__io_take and ferry__io_chunk_done; a worker loop takes chunks and reports them finished.
 * With threads (thread_loop) a worker reads one chunk at a time with ferry__io_read_range; with
 * io_uring (iouring.c) a worker keeps up to FERRY__IO_URING_DEPTH chunk reads in flight on its own
 * ring. Chunks handed to a ring are "started": cancel_all lets them finish like a running chunk.
 * The backend is chosen once, at create.
 *
 * Relay readers. A relayed request (io.h, `relay`) whose reads may go direct queues apart, in
 * q[1] under the same mu, and only the relay readers take its chunks (relay_main): threads
 * started with their slots at the first such request (relay_start, under crew_mu), woken through
 * relay_cv. They report chunks, serve the completion list and run done callbacks exactly as the
 * workers do; cancellation walks both queues; destroy stops and joins them after the workers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io/io_internal.h"

struct ferry__io {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: queue or completion list non-empty, or stopping */
    pthread_cond_t idle_cv; /* cancel_all: inflight dropped to 0 */
    /* the run queues: requests with chunks not handed out, in submit order; [0] the workers',
     * [1] the relay readers' (relayed requests whose reads may go direct) */
    struct {
        ferry__ioreq *head, *tail;
    } q[2];
    ferry__ioreq *fin_head, *fin_tail;
    uint64_t inflight;
    int stopping;
    uint64_t done_bytes, total_bytes;
    ferry__io_progress_fn progress_fn;
    void *progress_ud;

    pthread_mutex_t progress_mu;
    uint64_t progress_last;

    _Atomic uint64_t bytes_read;

    unsigned nthreads;
    pthread_t *threads;
    unsigned char *bounce; /* nthreads blocks of FERRY__IO_ALIGN bytes, one per worker */
    ferry__uring **rings;  /* one ring per worker, or NULL: the thread backend */
    unsigned ring_count;   /* rings created (the nthreads asked for) */
    _Atomic uint64_t chunk; /* bytes per worker read; a request takes it at submit */

    /* The relay readers (relay_start), who serve q[1]. crew_mu guards starting them, before mu in lock order; crew_state (-1 could not
     * start, 0 not tried, 1 running) is written under both and read under either. */
    pthread_cond_t relay_cv; /* relay readers: their queue or the completion list non-empty, or
                                stopping */
    pthread_mutex_t crew_mu;
    int crew_state;
    unsigned crew_n;              /* relay readers started */
    pthread_t crew[FERRY__IO_RELAY_READERS];
    unsigned char *slots;         /* FERRY__IO_RELAY_READERS slots of FERRY__IO_RELAY_PIECE
                                     bytes: one mapping of slots_len bytes */
    size_t slots_len;
    unsigned char *crew_bounce;   /* a FERRY__IO_ALIGN block per relay reader */
    _Atomic uint64_t relay_bytes; /* slots_len while the relay readers run */
};

/* The pool whose worker this thread is, so that cancel_all from a done callback does not wait on
 * itself. */
static _Thread_local ferry__io *current_pool;

/* Appends REQ to the completion list. mu held. */
static void finish_locked(ferry__io *io, ferry__ioreq *req)
{
    req->next = NULL;
    if (io->fin_tail)
        io->fin_tail->next = req;
    else
        io->fin_head = req;
    io->fin_tail = req;
    pthread_cond_signal(&io->work_cv);
}

/* Calls the progress callback with a snapshot taken under mu. Neither lock held on entry. */
static void report_progress(ferry__io *io, ferry__io_progress_fn fn, void *ud, uint64_t done,
                            uint64_t total)
{
    if (!fn)
        return;
    pthread_mutex_lock(&io->progress_mu);
    if (done > io->progress_last) {
        io->progress_last = done;
        fn(ud, done, total);
    }
    pthread_mutex_unlock(&io->progress_mu);
}

/* Runs REQ's done callback and retires it. Nothing held on entry. */
static void complete(ferry__io *io, ferry__ioreq *req, int status)
{
    req->done(req->ud, status); /* REQ may be freed from here on */
    pthread_mutex_lock(&io->mu);
    if (--io->inflight == 0)
        pthread_cond_broadcast(&io->idle_cv);
    pthread_mutex_unlock(&io->mu);
}

/* Writes the detail of REQ's first failure, chunk C failing with STATUS. mu held. */
static void set_errmsg_locked(ferry__ioreq *req, const ferry__iochunk *c, int status,
                              const char *msg)
{
    req->err_offset = c->pos;
    if (msg && *msg)
        snprintf(req->errmsg, sizeof req->errmsg, "%s", msg);
    else
        snprintf(req->errmsg, sizeof req->errmsg, "%s: read of %llu bytes at offset %llu failed: %s",
                 req->file->path, (unsigned long long)(c->end - c->pos),
                 (unsigned long long)c->pos, ferry_strerror(status));
}

/* ferry__io_take from the workers' queue, or with RELAY from the relay readers'. */
static int take_from(ferry__io *io, int relay, ferry__iochunk *c, int wait)
{
    ferry__ioreq **head = &io->q[relay].head, **tail = &io->q[relay].tail;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        if (io->fin_head) {
            ferry__ioreq *req = io->fin_head;
            io->fin_head = req->next;
            if (!io->fin_head)
                io->fin_tail = NULL;
            int status = req->status;
            pthread_mutex_unlock(&io->mu);
            complete(io, req, status);
            pthread_mutex_lock(&io->mu);
            continue;
        }
        if (*head)
            break;
        if (!wait) {
            pthread_mutex_unlock(&io->mu);
            return 0;
        }
        if (io->stopping) {
            pthread_mutex_unlock(&io->mu);
            return -1;
        }
        pthread_cond_wait(relay ? &io->relay_cv : &io->work_cv, &io->mu);
    }
    /* the next chunk of the oldest request */
    ferry__ioreq *req = *head;
    uint64_t end = req->offset + req->len;
    c->req = req;
    c->pos = req->next_chunk;
    c->end = ferry__io_chunk_end(req->offset, end, c->pos, req->chunk);
    req->next_chunk = c->end;
    if (c->end == end) {
        *head = req->next;
        if (!*head)
            *tail = NULL;
    }
    pthread_mutex_unlock(&io->mu);
    return 1;
}

int ferry__io_take(ferry__io *io, ferry__iochunk *c, int wait)
{
    return take_from(io, 0, c, wait);
}

void ferry__io_chunk_done(ferry__io *io, const ferry__iochunk *c, int status, const char *msg)
{
    ferry__ioreq *req = c->req;
    uint64_t n = c->end - c->pos, end = req->offset + req->len;
    if (status == 0)
        atomic_fetch_add_explicit(&io->bytes_read, n, memory_order_relaxed);
    /* before this chunk is counted off: once it is, another worker may finish REQ and its owner
     * free it (and UD) */
    if (status == 0 && req->chunk_read)
        req->chunk_read(req->ud, n);
    pthread_mutex_lock(&io->mu);
    if (status && req->status == 0) {
        req->status = status;
        set_errmsg_locked(req, c, status, msg);
    }
    io->done_bytes += n;
    uint64_t done = io->done_bytes, total = io->total_bytes;
    ferry__io_progress_fn pfn = io->progress_fn;
    void *pud = io->progress_ud;
    int last = --req->chunks_left == 0 && req->next_chunk == end;
    int st = req->status;
    pthread_mutex_unlock(&io->mu);

    report_progress(io, pfn, pud, done, total);
    if (last)
        complete(io, req, st);
}

/* The thread backend: one chunk at a time, read on this thread. */
static void thread_loop(ferry__io *io, unsigned char *bounce)
{
    ferry__iochunk c;
    ferry__err err;
    while (ferry__io_take(io, &c, 1) == 1) {
        err.code = 0;
        err.msg[0] = 0;
        ferry__ioreq *req = c.req;
        unsigned char *dst = (unsigned char *)req->dst + (c.pos - req->offset);
        int r = ferry__io_read_range(req->file, c.pos, c.end - c.pos, dst, req->mode, bounce, &err);
        ferry__io_chunk_done(io, &c, r, err.msg);
    }
}

/* A relay reader: one relayed chunk at a time, its direct read into the reader's own slot (at
 * the chunk's offset within a block, as the read needs: relayed chunks never cross a slot's end,
 * ferry__io_chunk_end) and copied to its place once whole; a chunk AUTO reads buffered (mostly
 * cached), or one of a file without O_DIRECT, is read straight to its place. Either way the
 * place's pages are faulted in by one call first: relayed destinations need no toucher. */
typedef struct relay_reader {
    ferry__io *io;
    unsigned index;
} relay_reader;

static void *relay_main(void *arg)
{
    relay_reader *rr = arg;
    ferry__io *io = rr->io;
    current_pool = io;
    unsigned char *slot = io->slots + (size_t)rr->index * FERRY__IO_RELAY_PIECE;
    unsigned char *bounce = io->crew_bounce + (size_t)rr->index * FERRY__IO_ALIGN;
    free(rr);
    memset(slot, 0, FERRY__IO_RELAY_PIECE); /* faulted in here, not on the first read's path */
    ferry__iochunk c;
    ferry__err err;
    while (take_from(io, 1, &c, 1) == 1) {
        err.code = 0;
        err.msg[0] = 0;
        ferry__ioreq *req = c.req;
        const ferry__iofile *f = req->file;
        uint64_t n = c.end - c.pos;
        unsigned char *dst = (unsigned char *)req->dst + (c.pos - req->offset);
        ferry_load mode = req->mode == FERRY_LOAD_AUTO ? ferry__io_auto_mode(f, c.pos, n)
                                                       : req->mode;
        unsigned char *via = mode == FERRY_LOAD_DIRECT && f->fd_direct >= 0
                                 ? slot + c.pos % FERRY__IO_ALIGN
                                 : NULL;
        if (!via)
            ferry__io_populate(dst, (size_t)n);
        int r = ferry__io_read_range(f, c.pos, n, via ? via : dst, mode, bounce, &err);
        if (r == 0 && via) {
            ferry__io_populate(dst, (size_t)n);
            memcpy(dst, via, (size_t)n);
        }
        ferry__io_chunk_done(io, &c, r, err.msg);
    }
    return NULL;
}

static void *worker(void *arg)
{
    ferry__io *io = arg;
    current_pool = io;
    /* the worker's own bounce block and ring: the index is its position among the threads */
    unsigned idx = 0;
    pthread_mutex_lock(&io->mu);
    for (unsigned i = 0; i < io->nthreads; i++)
        if (pthread_equal(io->threads[i], pthread_self()))
            idx = i;
    pthread_mutex_unlock(&io->mu);
    unsigned char *bounce = io->bounce + (size_t)idx * FERRY__IO_ALIGN;
    /* a ring that stopped taking submissions hands its worker over to the thread loop */
    const ferry__ioqueue q = {.pool = io, .take = ferry__io_take, .done = ferry__io_chunk_done};
    if (io->rings && ferry__uring_run(&q, io->rings[idx], bounce) == 0)
        return NULL;
    thread_loop(io, bounce);
    return NULL;
}

/* Rings for NTHREADS workers when io_uring is wanted and works, else NULL. */
static ferry__uring **make_rings(unsigned nthreads)
{
    const char *want = getenv("FERRY_IO_BACKEND");
    if (want && strcmp(want, "threads") == 0)
        return NULL;
    ferry__uring **r = calloc(nthreads, sizeof *r);
    if (!r)
        return NULL;
    for (unsigned i = 0; i < nthreads; i++) {
        if (!(r[i] = ferry__uring_create(FERRY__IO_URING_DEPTH))) {
            for (unsigned j = 0; j < i; j++)
                ferry__uring_destroy(r[j]);
            free(r);
            return NULL;
        }
    }
    return r;
}

static void free_rings(ferry__uring **r, unsigned n)
{
    if (!r)
        return;
    for (unsigned i = 0; i < n; i++)
        ferry__uring_destroy(r[i]);
    free(r);
}

/* Starts the relay readers at the first call: their slots (one mapping, 2 MiB-aligned and advised
 * huge pages: a device request into 4 KiB pages is slower per byte on a VM's disk even into memory
 * that is there, bench/README.md), then the threads, each of which faults its own slot in. 1 when
 * they run, 0 when they could not start (then never tried again: relayed requests go to the
 * workers and read straight). Takes crew_mu, then mu. */
static int relay_start(ferry__io *io)
{
    pthread_mutex_lock(&io->crew_mu);
    if (io->crew_state == 0) {
        size_t n = FERRY__IO_RELAY_READERS, len = n * FERRY__IO_RELAY_PIECE;
        void *b = NULL;
        unsigned char *m = ferry__map_aligned(len, FERRY__IO_RELAY_ALIGN, ferry__sys_mmap,
                                              ferry__sys_munmap);
        unsigned started = 0;
        if (m && posix_memalign(&b, FERRY__IO_ALIGN, n * FERRY__IO_ALIGN) == 0) {
            io->crew_bounce = b;
#ifdef MADV_HUGEPAGE
            (void)madvise(m, len, MADV_HUGEPAGE);
#endif
            io->slots = m;
            io->slots_len = len;
            for (; started < n; started++) {
                relay_reader *rr = malloc(sizeof *rr);
                if (rr)
                    *rr = (relay_reader){.io = io, .index = started};
                if (!rr || pthread_create(&io->crew[started], NULL, relay_main, rr) != 0) {
                    free(rr);
                    break;
                }
            }
        }
        pthread_mutex_lock(&io->mu);
        if (started == 0) {
            io->crew_state = -1;
        } else {
            /* fewer than asked (threads refused): the slots of the others stay unused */
            io->crew_state = 1;
            io->crew_n = started;
            atomic_store(&io->relay_bytes, (uint64_t)len);
        }
        pthread_mutex_unlock(&io->mu);
        if (started == 0) {
            if (m)
                ferry__sys_munmap(m, len);
            free(b);
            io->slots = NULL;
            io->crew_bounce = NULL;
        }
    }
    int up = io->crew_state > 0;
    pthread_mutex_unlock(&io->crew_mu);
    return up;
}

ferry__io *ferry__io_create(unsigned nthreads)
{
    if (nthreads == 0)
        nthreads = 4;
    if (nthreads > 1024)
        nthreads = 1024;
    ferry__io *io = calloc(1, sizeof *io);
    if (!io)
        return NULL;
    io->nthreads = nthreads;
    atomic_init(&io->chunk, FERRY__IO_CHUNK);
    io->threads = calloc(nthreads, sizeof *io->threads);
    void *b = NULL;
    if (!io->threads ||
        posix_memalign(&b, FERRY__IO_ALIGN, (size_t)nthreads * FERRY__IO_ALIGN) != 0) {
        free(io->threads);
        free(io);
        return NULL;
    }
    io->bounce = b;
    atomic_init(&io->relay_bytes, 0);
    io->rings = make_rings(nthreads);
    io->ring_count = io->rings ? nthreads : 0;
    atomic_init(&io->bytes_read, 0);
    pthread_mutex_init(&io->mu, NULL);
    pthread_mutex_init(&io->progress_mu, NULL);
    pthread_cond_init(&io->work_cv, NULL);
    pthread_cond_init(&io->idle_cv, NULL);
    pthread_cond_init(&io->relay_cv, NULL);
    pthread_mutex_init(&io->crew_mu, NULL);

    /* Workers look themselves up in io->threads under mu: hold it while starting them. */
    pthread_mutex_lock(&io->mu);
    unsigned started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&io->threads[started], NULL, worker, io) != 0)
            break;
    if (started < nthreads) {
        io->nthreads = started;
        io->stopping = 1;
        pthread_cond_broadcast(&io->work_cv);
        pthread_mutex_unlock(&io->mu);
        for (unsigned i = 0; i < started; i++)
            pthread_join(io->threads[i], NULL);
        io->nthreads = 0;
        ferry__io_destroy(io);
        return NULL;
    }
    pthread_mutex_unlock(&io->mu);
    return io;
}

uint64_t ferry__io_set_chunk(ferry__io *io, uint64_t bytes)
{
    if (!bytes)
        bytes = FERRY__IO_CHUNK;
    if (bytes < FERRY__IO_CHUNK_MIN)
        bytes = FERRY__IO_CHUNK_MIN;
    if (bytes > FERRY__IO_CHUNK_MAX)
        bytes = FERRY__IO_CHUNK_MAX;
    bytes -= bytes % FERRY__IO_ALIGN;
    if (io)
        atomic_store(&io->chunk, bytes);
    return bytes;
}

uint64_t ferry__io_chunk(const ferry__io *io)
{
    return io ? atomic_load(&io->chunk) : FERRY__IO_CHUNK;
}

unsigned ferry__io_threads(const ferry__io *io)
{
    return io ? io->nthreads : 0;
}

int ferry__io_submit(ferry__io *io, ferry__ioreq *req)
{
    if (!io || !req || !req->file || !req->done || (!req->dst && req->len > 0))
        return FERRY_EINVAL;
    if ((unsigned)req->mode > FERRY_LOAD_DIRECT)
        return FERRY_EINVAL;
    uint64_t end;
    req->errmsg[0] = 0;
    req->err_offset = req->offset;
    if (ferry__add_u64(req->offset, req->len, &end) || end > req->file->size) {
        snprintf(req->errmsg, sizeof req->errmsg,
                 "%s: read of %llu bytes at offset %llu goes past the end of the file "
                 "(%llu bytes)",
                 req->file->path, (unsigned long long)req->len, (unsigned long long)req->offset,
                 (unsigned long long)req->file->size);
        return FERRY_EIO;
    }
    /* a relayed request goes to the relay readers (started now if need be), where its reads
     * may go direct: none of a file without O_DIRECT, or in READ or MMAP mode */
    int relayed = req->relay && req->len > 0 && req->file->fd_direct >= 0 &&
                  (req->mode == FERRY_LOAD_DIRECT || req->mode == FERRY_LOAD_AUTO) &&
                  relay_start(io);
    req->next_chunk = req->offset;
    req->chunk = relayed ? FERRY__IO_RELAY_PIECE : atomic_load(&io->chunk);
    req->chunks_left = ferry__io_chunk_count(req->offset, req->len, req->chunk);
    req->status = 0;
    req->next = NULL;

    pthread_mutex_lock(&io->mu);
    if (io->stopping) {
        pthread_mutex_unlock(&io->mu);
        return FERRY_ECANCELED;
    }
    io->inflight++;
    io->total_bytes += req->len;
    if (req->len == 0) {
        finish_locked(io, req);
    } else {
        ferry__ioreq **head = &io->q[relayed].head, **tail = &io->q[relayed].tail;
        if (*tail)
            (*tail)->next = req;
        else
            *head = req;
        *tail = req;
        /* one wake-up per chunk, up to the number of threads that serve the queue */
        pthread_cond_t *cv = relayed ? &io->relay_cv : &io->work_cv;
        if (req->chunks_left >= (relayed ? io->crew_n : io->nthreads))
            pthread_cond_broadcast(cv);
        else
            for (uint64_t i = 0; i < req->chunks_left; i++)
                pthread_cond_signal(cv);
    }
    pthread_mutex_unlock(&io->mu);
    return 0;
}

/* Drops the chunks of REQ (already out of the queue) not handed out. mu held. */
static void drop_chunks_locked(ferry__io *io, ferry__ioreq *req)
{
    uint64_t end = req->offset + req->len;
    /* chunks not handed out: those from next_chunk to the end */
    uint64_t dropped = 0;
    for (uint64_t pos = req->next_chunk; pos < end;
         pos = ferry__io_chunk_end(req->offset, end, pos, req->chunk))
        dropped++;
    req->chunks_left -= dropped;
    req->next_chunk = end;
    if (req->status == 0) {
        req->status = FERRY_ECANCELED;
        snprintf(req->errmsg, sizeof req->errmsg,
                 "%s: read of %llu bytes at offset %llu cancelled", req->file->path,
                 (unsigned long long)req->len, (unsigned long long)req->offset);
    }
    /* with no chunk running, nobody else will finish it */
    if (req->chunks_left == 0)
        finish_locked(io, req);
}

/* Drops every chunk not handed out. mu held. */
static void cancel_queued_locked(ferry__io *io)
{
    for (int relay = 0; relay < 2; relay++) {
        ferry__ioreq *req = io->q[relay].head;
        io->q[relay].head = io->q[relay].tail = NULL;
        while (req) {
            ferry__ioreq *next = req->next;
            drop_chunks_locked(io, req);
            req = next;
        }
    }
}

void ferry__io_cancel_req(ferry__io *io, ferry__ioreq *req)
{
    if (!io || !req)
        return;
    pthread_mutex_lock(&io->mu);
    for (int relay = 0; relay < 2; relay++) {
        ferry__ioreq **head = &io->q[relay].head, **tail = &io->q[relay].tail;
        ferry__ioreq *prev = NULL, *r = *head;
        while (r && r != req) {
            prev = r;
            r = r->next;
        }
        if (r) {
            if (prev)
                prev->next = r->next;
            else
                *head = r->next;
            if (*tail == r)
                *tail = prev;
            drop_chunks_locked(io, r);
            break;
        }
    }
    pthread_mutex_unlock(&io->mu);
}

void ferry__io_cancel_all(ferry__io *io)
{
    if (!io)
        return;
    pthread_mutex_lock(&io->mu);
    cancel_queued_locked(io);
    /* A done callback calling this cannot wait for itself: it only cancels. */
    if (current_pool != io) {
        while (io->inflight > 0) {
            pthread_cond_wait(&io->idle_cv, &io->mu);
            cancel_queued_locked(io); /* anything submitted meanwhile, e.g. from a callback */
        }
    }
    pthread_mutex_unlock(&io->mu);
}

void ferry__io_destroy(ferry__io *io)
{
    if (!io)
        return;
    ferry__io_cancel_all(io);
    pthread_mutex_lock(&io->crew_mu); /* no relay reader starts from here on */
    pthread_mutex_lock(&io->mu);
    io->stopping = 1;
    if (io->crew_state == 0)
        io->crew_state = -1;
    pthread_cond_broadcast(&io->work_cv);
    pthread_cond_broadcast(&io->relay_cv);
    pthread_mutex_unlock(&io->mu);
    pthread_mutex_unlock(&io->crew_mu);
    for (unsigned i = 0; i < io->nthreads; i++)
        pthread_join(io->threads[i], NULL);
    for (unsigned i = 0; i < io->crew_n; i++)
        pthread_join(io->crew[i], NULL);
    if (io->slots)
        ferry__sys_munmap(io->slots, io->slots_len);
    free(io->crew_bounce);
    pthread_cond_destroy(&io->work_cv);
    pthread_cond_destroy(&io->idle_cv);
    pthread_cond_destroy(&io->relay_cv);
    pthread_mutex_destroy(&io->crew_mu);
    pthread_mutex_destroy(&io->mu);
    pthread_mutex_destroy(&io->progress_mu);
    free_rings(io->rings, io->ring_count);
    free(io->bounce);
    free(io->threads);
    free(io);
}

void ferry__io_set_progress(ferry__io *io, ferry__io_progress_fn fn, void *ud)
{
    if (!io)
        return;
    pthread_mutex_lock(&io->mu);
    io->progress_fn = fn;
    io->progress_ud = ud;
    pthread_mutex_unlock(&io->mu);
}

uint64_t ferry__io_bytes_read(const ferry__io *io)
{
    if (!io)
        return 0;
    return atomic_load_explicit(&((ferry__io *)io)->bytes_read, memory_order_relaxed);
}

uint64_t ferry__io_relay_bytes(const ferry__io *io)
{
    return io ? atomic_load(&((ferry__io *)io)->relay_bytes) : 0;
}

const char *ferry__io_backend(const ferry__io *io)
{
    return io && io->rings ? "uring" : "threads";
}

unsigned ferry__io_depth(const ferry__io *io)
{
    return io && io->rings ? FERRY__IO_URING_DEPTH : 1;
}
