/*
 * iouring.c — the io_uring backend of the I/O pool: each worker owns one ring and keeps up to
 * FERRY__IO_URING_DEPTH chunk reads in flight on it, instead of blocking in one pread per chunk.
 * Deep queues are what a fast NVMe device needs to reach its bandwidth, and a ring gets them
 * without a thread per outstanding read.
 *
 * Per chunk, by load mode (AUTO decides per chunk, as in ioread.c):
 *  - READ, MMAP and AUTO on a mostly cached chunk: one buffered IORING_OP_READ on the file's
 *    descriptor (never a copy out of the mapping, which a truncated file turns into SIGBUS).
 *  - DIRECT (and AUTO on a cold chunk): with an O_DIRECT descriptor and a destination congruent to
 *    the offset, one IORING_OP_READ on the O_DIRECT descriptor for the chunk's block-aligned middle;
 *    the unaligned head or tail (only a request's first and last chunk have one) is read at once
 *    through the worker's bounce block by ioread.c. Otherwise as READ.
 * A completion that is short is resubmitted for the rest; a direct read the filesystem refuses
 * (EINVAL) or that comes back short of a whole block goes on buffered; a read that meets the end
 * of the file (it shrank) or fails is FERRY_EIO with the path, length, offset and strerror.
 *
 * Invariants: a ring is used by its worker only. Every slot in use has exactly one read prepared
 * or in the kernel, so the submission queue (DEPTH entries) never overflows and the completion
 * queue (2 * DEPTH) never drops a completion. PENDING lists, in preparation order, the slots whose
 * reads are prepared but not yet handed to the kernel (the kernel consumes the submission queue
 * in order). Nothing from the ring is ever freed while the kernel may still write to it.
 *
 * Without FERRY_HAVE_URING only the stubs at the end are built and the pool uses threads.
 */
#include "io/io_internal.h"

#ifdef FERRY_HAVE_URING

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct slot {
    ferry__iochunk c;
    int fd;             /* the descriptor read: the file's fd_direct or fd */
    unsigned char *dst; /* where the next byte read goes */
    uint64_t off, left; /* file offset of the next byte, bytes still to read */
} slot;

struct ferry__uring {
    struct io_uring ring;
    unsigned depth;
    slot *slots;      /* DEPTH slots */
    slot **free_list; /* slots not in use: nfree of them */
    unsigned nfree;
    slot **pending;   /* prepared, not yet submitted: npending of them, oldest first */
    unsigned npending;
    unsigned used;    /* slots in use: depth - nfree */
    int broken;       /* the ring refused submissions: no read is ever prepared on it again */
};

ferry__uring *ferry__uring_create(unsigned depth)
{
    if (depth == 0)
        return NULL;
    ferry__uring *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->depth = depth;
    u->slots = calloc(depth, sizeof *u->slots);
    u->free_list = calloc(depth, sizeof *u->free_list);
    u->pending = calloc(depth, sizeof *u->pending);
    if (!u->slots || !u->free_list || !u->pending || io_uring_queue_init(depth, &u->ring, 0) < 0) {
        free(u->slots);
        free(u->free_list);
        free(u->pending);
        free(u);
        return NULL;
    }
    /* IORING_OP_READ needs Linux 5.6; the probe itself fails on older kernels */
    struct io_uring_probe *p = io_uring_get_probe_ring(&u->ring);
    int ok = p && io_uring_opcode_supported(p, IORING_OP_READ);
    if (p)
        io_uring_free_probe(p);
    if (!ok) {
        io_uring_queue_exit(&u->ring);
        u->depth = 0; /* nothing to free but the arrays */
        ferry__uring_destroy(u);
        return NULL;
    }
    for (unsigned i = 0; i < depth; i++)
        u->free_list[i] = &u->slots[i];
    u->nfree = depth;
    return u;
}

void ferry__uring_destroy(ferry__uring *u)
{
    if (!u)
        return;
    /* the pool destroys rings only after its workers ended, with nothing in flight */
    if (u->depth)
        io_uring_queue_exit(&u->ring);
    free(u->slots);
    free(u->free_list);
    free(u->pending);
    free(u);
}

int ferry__io_uring_usable(void)
{
    ferry__uring *u = ferry__uring_create(2);
    ferry__uring_destroy(u);
    return u != NULL;
}

static void pause_1ms(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* Prepares S's next read. A submission entry is always free (see the invariants). */
static void prep(ferry__uring *u, slot *s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    /* left <= FERRY__IO_CHUNK_MAX, below the 32-bit length limit */
    io_uring_prep_read(sqe, s->fd, s->dst, (unsigned)s->left, s->off);
    io_uring_sqe_set_data(sqe, s);
    u->pending[u->npending++] = s;
}

static void release(ferry__uring *u, slot *s)
{
    u->free_list[u->nfree++] = s;
    u->used--;
}

/* S's chunk is finished with STATUS: the slot is free again, then the pool is told (which may run
 * the request's done callback). */
static void finish(const ferry__ioqueue *q, ferry__uring *u, slot *s, int status, const char *msg)
{
    ferry__iochunk c = s->c;
    release(u, s);
    q->done(q->pool, &c, status, msg);
}

/* Reads what is left of S on this thread (the ring refused it) and finishes it. */
static void read_sync(const ferry__ioqueue *q, ferry__uring *u, slot *s, unsigned char *bounce)
{
    const ferry__iofile *f = s->c.req->file;
    ferry__err e = {0};
    /* an O_DIRECT slot's range is block-aligned: DIRECT reads it straight */
    int r = ferry__io_read_range(f, s->off, s->left, s->dst,
                                 s->fd == f->fd_direct ? FERRY_LOAD_DIRECT : FERRY_LOAD_READ,
                                 bounce, &e);
    finish(q, u, s, r, e.msg);
}

/* Hands the prepared reads to the kernel. 0 when done or worth retrying after a completion;
 * -1 when the ring refuses submissions for good: it is then marked broken and the reads it did
 * not take are done synchronously. */
static int submit_pending(const ferry__ioqueue *q, ferry__uring *u, unsigned char *bounce)
{
    unsigned refusals = 0;
    while (u->npending > 0) {
        int n = io_uring_submit(&u->ring);
        if (n > 0) {
            unsigned k = (unsigned)n < u->npending ? (unsigned)n : u->npending;
            memmove(u->pending, u->pending + k, (u->npending - k) * sizeof *u->pending);
            u->npending -= k;
            refusals = 0;
            continue;
        }
        if ((n == 0 || n == -EINTR || n == -EAGAIN || n == -EBUSY) && ++refusals < 1000) {
            if (u->used > u->npending)
                return 0; /* a completion will free kernel resources: reap first */
            pause_1ms();
            continue;
        }
        /* The entries stay in the ring's local queue; as nothing is ever submitted on a broken
         * ring again, the kernel never sees them. */
        u->broken = 1;
        while (u->npending > 0)
            read_sync(q, u, u->pending[--u->npending], bounce);
        return -1;
    }
    return 0;
}

/* A completion RES of S's read. */
static void on_complete(const ferry__ioqueue *q, ferry__uring *u, slot *s, int res)
{
    const ferry__iofile *f = s->c.req->file;
    int direct = s->fd == f->fd_direct;
    char msg[FERRY__ERRMSG_MAX];
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
            prep(u, s);
            return;
        }
        if (res == -EINVAL && direct) { /* the filesystem refused the alignment */
            s->fd = f->fd;
            prep(u, s);
            return;
        }
        snprintf(msg, sizeof msg, "%s: %sread of %llu bytes at offset %llu failed: %s", f->path,
                 direct ? "direct " : "", (unsigned long long)s->left,
                 (unsigned long long)s->off, strerror(-res));
        finish(q, u, s, FERRY_EIO, msg);
        return;
    }
    if (res == 0) {
        snprintf(msg, sizeof msg,
                 "%s: end of file at offset %llu with %llu bytes still to read (the file shrank?)",
                 f->path, (unsigned long long)s->off, (unsigned long long)s->left);
        finish(q, u, s, FERRY_EIO, msg);
        return;
    }
    uint64_t n = (uint64_t)res < s->left ? (uint64_t)res : s->left;
    s->dst += n;
    s->off += n;
    s->left -= n;
    if (s->left == 0) {
        finish(q, u, s, 0, NULL);
        return;
    }
    if (direct && n % FERRY__IO_ALIGN) /* no longer block-aligned: the rest goes buffered */
        s->fd = f->fd;
    prep(u, s);
}

/* Submits what is prepared, waits for at least one completion and handles every one there. */
static void reap(const ferry__ioqueue *q, ferry__uring *u, unsigned char *bounce)
{
    if (submit_pending(q, u, bounce) < 0 && u->used == 0)
        return;
    if (u->used == u->npending) /* nothing in the kernel to wait for */
        return;
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&u->ring, &cqe);
    if (r < 0) {
        if (r != -EINTR && r != -EAGAIN && r != -ETIME)
            pause_1ms(); /* never seen; reads in flight must still be reaped, so retry */
        return;
    }
    /* collect first, so that the completion queue is free again before any callback runs */
    struct {
        slot *s;
        int res;
    } got[2 * FERRY__IO_URING_DEPTH];
    unsigned head, n = 0;
    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        if (n == sizeof got / sizeof got[0])
            break;
        got[n].s = io_uring_cqe_get_data(cqe);
        got[n].res = cqe->res;
        n++;
    }
    io_uring_cq_advance(&u->ring, n);
    for (unsigned i = 0; i < n; i++)
        on_complete(q, u, got[i].s, got[i].res);
}

/* Starts chunk C: copies and the bounce-buffered ends are done here and now, the rest is
 * prepared as one read on a free slot. */
static void start(const ferry__ioqueue *q, ferry__uring *u, const ferry__iochunk *c, unsigned char *bounce)
{
    ferry__ioreq *req = c->req;
    const ferry__iofile *f = req->file;
    const uint64_t A = FERRY__IO_ALIGN;
    uint64_t pos = c->pos, end = c->end;
    unsigned char *dst = (unsigned char *)req->dst + (pos - req->offset);
    ferry__err e = {0};
    int r;

    ferry_load mode = req->mode;
    /* AUTO: cached data through a buffered read (a memcpy from the mapping would fault every
     * page into this process and keep it in its resident set), the rest with O_DIRECT. */
    if (mode == FERRY_LOAD_AUTO)
        mode = ferry__io_auto_mode(f, pos, end - pos);
    if (mode == FERRY_LOAD_MMAP)
        mode = FERRY_LOAD_READ; /* ioread.c says why: never a copy out of the mapping */

    int fd = f->fd;
    uint64_t off = pos, len = end - pos;
    if (mode == FERRY_LOAD_DIRECT && f->fd_direct >= 0 && bounce &&
        (uintptr_t)dst % A == pos % A) {
        uint64_t a0 = pos % A ? pos + (A - pos % A) : pos; /* first block boundary >= pos */
        uint64_t a1 = end - end % A;                       /* last block boundary <= end */
        if (a1 <= a0) { /* no whole block: the bounce path reads it all */
            r = ferry__io_read_range(f, pos, end - pos, dst, FERRY_LOAD_DIRECT, bounce, &e);
            q->done(q->pool, c, r, e.msg);
            return;
        }
        if ((pos < a0 &&
             (r = ferry__io_read_range(f, pos, a0 - pos, dst, FERRY_LOAD_DIRECT, bounce, &e))) ||
            (end > a1 && (r = ferry__io_read_range(f, a1, end - a1, dst + (a1 - pos),
                                                   FERRY_LOAD_DIRECT, bounce, &e)))) {
            q->done(q->pool, c, r, e.msg);
            return;
        }
        fd = f->fd_direct;
        off = a0;
        len = a1 - a0;
        dst += a0 - pos;
    }
    slot *s = u->free_list[--u->nfree];
    u->used++;
    s->c = *c;
    s->fd = fd;
    s->dst = dst;
    s->off = off;
    s->left = len;
    prep(u, s);
    submit_pending(q, u, bounce); /* one system call per 16 MiB: start the device at once */
}

int ferry__uring_run(const ferry__ioqueue *q, ferry__uring *u, unsigned char *bounce)
{
    for (;;) {
        if (u->broken && u->used == 0)
            return -1;
        if (!u->broken && u->used < u->depth) {
            ferry__iochunk c;
            /* sleep for work only with nothing in flight; else reap when the queue is empty */
            int t = q->take(q->pool, &c, u->used == 0);
            if (t < 0)
                return 0;
            if (t == 1) {
                start(q, u, &c, bounce);
                continue;
            }
        }
        reap(q, u, bounce);
    }
}

#else /* !FERRY_HAVE_URING */

ferry__uring *ferry__uring_create(unsigned depth)
{
    (void)depth;
    return NULL;
}

void ferry__uring_destroy(ferry__uring *u) { (void)u; }

int ferry__io_uring_usable(void) { return 0; }

int ferry__uring_run(const ferry__ioqueue *q, ferry__uring *u, unsigned char *bounce)
{
    (void)q;
    (void)u;
    (void)bounce;
    return -1;
}

#endif
