/*
 * io_internal.h — pieces shared by the files of the I/O engine (iofile.c, ioread.c, iopool.c,
 * iouring.c) and nobody else. The public face of the engine is io.h.
 */
#ifndef FERRY_IO_INTERNAL_H
#define FERRY_IO_INTERNAL_H

#include "io/io.h"

#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/types.h>

/* The system calls of file reading, through the table of iosys.c (ferry_set_syscall). */
int ferry__sys_open(const char *path, int flags);
int ferry__sys_close(int fd);
int ferry__sys_fstat(int fd, struct stat *st);
ssize_t ferry__sys_pread(int fd, void *buf, size_t n, off_t off);
void *ferry__sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int ferry__sys_munmap(void *addr, size_t len);

/* AUTO copies a chunk from the mapping when at least this fraction of its pages is resident. */
#define FERRY__IO_AUTO_CACHED 0.5

/* How AUTO reads [OFF, OFF+LEN) of F: buffered (READ) when it is mostly in the page cache, else
 * DIRECT. */
static inline ferry_load ferry__io_auto_mode(const ferry__iofile *f, uint64_t off, uint64_t len)
{
    return ferry__iofile_cached(f, off, len) >= FERRY__IO_AUTO_CACHED ? FERRY_LOAD_READ
                                                                      : FERRY_LOAD_DIRECT;
}

/* The most bytes one pread asks for: a multiple of FERRY__IO_ALIGN below Linux's 2 GiB - 4 KiB
 * cap on a single read. */
#define FERRY__IO_MAX_SYSCALL (UINT64_C(1) << 30)

/* Reads [off, off+len) of F into DST with MODE. BOUNCE is a FERRY__IO_ALIGN-aligned buffer of
 * FERRY__IO_ALIGN bytes for the unaligned head and tail of direct reads; it may be NULL when MODE
 * is MMAP or READ. The range must already be known to lie inside the file (the caller checked);
 * a file that shrank since is FERRY_EIO. AUTO decides per FERRY__IO_CHUNK piece. */
int ferry__io_read_range(const ferry__iofile *f, uint64_t off, uint64_t len, unsigned char *dst,
                         ferry_load mode, unsigned char *bounce, ferry__err *e);

/* FERRY_EIO naming F's path and the offending range when [off, off+len) is not inside the file
 * (or overflows), else 0. */
int ferry__io_check_range(const ferry__iofile *f, uint64_t off, uint64_t len, ferry__err *e);

/* End of the chunk that starts at POS of a request covering [off, end), chunks of CHUNK bytes (a
 * multiple of FERRY__IO_ALIGN): chunk boundaries lie at align_down(off) + k * CHUNK, so that every
 * chunk but the first starts on a block boundary and direct reads of consecutive chunks never
 * share a block. */
static inline uint64_t ferry__io_chunk_end(uint64_t off, uint64_t end, uint64_t pos, uint64_t chunk)
{
    uint64_t base = off - off % FERRY__IO_ALIGN;
    uint64_t next = base + ((pos - base) / chunk + 1) * chunk;
    return next < end ? next : end;
}

/* Number of chunks of CHUNK bytes of a request covering [off, off+len); 0 when LEN is 0. */
static inline uint64_t ferry__io_chunk_count(uint64_t off, uint64_t len, uint64_t chunk)
{
    uint64_t base = off - off % FERRY__IO_ALIGN;
    uint64_t span = off - base + len;
    return len ? (span + chunk - 1) / chunk : 0;
}

/* Faults in the whole pages of [DST, DST+N) by one call (MADV_POPULATE_WRITE, which never changes
 * a byte; nothing where the kernel lacks it). */
void ferry__io_populate(void *dst, size_t n);
/* Copies N bytes like memcpy (no overlap), with streaming stores when N is at least
 * FERRY__IO_STREAM_MIN: the destination is not left in the cache. iocopy.c says why. */
#define FERRY__IO_STREAM_MIN (UINT64_C(1) << 20)
void ferry__io_copy(void *dst, const void *src, size_t n);


/* ---- the pool and its backends -------------------------------------------------------------
 * iopool.c owns the queue, the completion list, cancellation, progress and the done callbacks;
 * a backend's worker loop only takes chunks and reports them finished. */

/* One chunk handed out to a worker: [pos, end) of REQ. */
typedef struct ferry__iochunk {
    ferry__ioreq *req;
    uint64_t pos, end;
} ferry__iochunk;

/* Runs the done callbacks that are due, then hands out the next chunk in queue order into *C
 * (1). With WAIT, sleeps until there is one or the pool stops (-1); without, returns 0 when none
 * is queued. The caller must report every chunk it took through ferry__io_chunk_done. */
int ferry__io_take(ferry__io *io, ferry__iochunk *c, int wait);
/* Chunk C is finished with STATUS (0 or a FERRY_E code; MSG the detail of a failure, or NULL):
 * counts its bytes, reports progress, and calls the request's done callback when this was its
 * last chunk. Neither lock held. */
void ferry__io_chunk_done(ferry__io *io, const ferry__iochunk *c, int status, const char *msg);
/* Chunks one worker of IO keeps in flight at most: 1 with threads, the ring depth with io_uring.
 * For tests. */
unsigned ferry__io_depth(const ferry__io *io);

/* The io_uring backend (iouring.c): one ring per worker, at most FERRY__IO_URING_DEPTH chunk reads
 * in flight on it. Without FERRY_HAVE_URING, create returns NULL and usable returns 0. */
#define FERRY__IO_URING_DEPTH 8u
typedef struct ferry__uring ferry__uring;
/* Where a backend takes its chunks and reports them: the pool's queue (ferry__io_take and
 * ferry__io_chunk_done on POOL), passed in so that a backend never calls into the pool. */
typedef struct ferry__ioqueue {
    ferry__io *pool;
    int (*take)(ferry__io *io, ferry__iochunk *c, int wait);
    void (*done)(ferry__io *io, const ferry__iochunk *c, int status, const char *msg);
} ferry__ioqueue;
/* A ring with DEPTH slots, or NULL when the library was built without liburing, the kernel
 * refuses io_uring (ENOSYS, EPERM under seccomp, io_uring_disabled) or lacks IORING_OP_READ. */
ferry__uring *ferry__uring_create(unsigned depth);
void ferry__uring_destroy(ferry__uring *u);
/* 1 when a ring can be created here (the test of ferry__uring_create, then torn down). */
int ferry__io_uring_usable(void);
/* The worker loop of the uring backend on ring U (used by this thread only) with BOUNCE (one
 * FERRY__IO_ALIGN block). Returns 0 when the pool stops, or -1 when the ring stopped accepting
 * submissions (nothing of it is in flight any more): the caller goes on with the thread loop. */
int ferry__uring_run(const ferry__ioqueue *q, ferry__uring *u, unsigned char *bounce);

#endif
