/*
 * io.h — the I/O engine: files opened for reading (descriptor, O_DIRECT descriptor, read-only
 * private mapping), and a pool of worker threads that move file bytes into memory in large chunks
 * with several requests in flight, by buffered pread or O_DIRECT (through io_uring where liburing
 * is present and the kernel allows it); never by a copy out of the mapping, which would die of
 * SIGBUS on a file truncated under it. The mapping serves zero-copy pointers; ioguard.c keeps the
 * registry of mappings the opt-in SIGBUS guard consults.
 *
 * Nothing here knows about tensors, groups or devices: a request is (file, offset, length,
 * destination, mode, completion callback).
 *
 * Direct I/O: O_DIRECT needs file offset, length and memory address aligned to the logical block
 * (FERRY__IO_ALIGN covers every device seen). A request whose destination satisfies
 *     (uintptr_t)dst % FERRY__IO_ALIGN == offset % FERRY__IO_ALIGN
 * is read directly for its aligned middle, with the unaligned head and tail through a small bounce
 * buffer; other requests fall back to buffered reads. Callers that want direct reads therefore
 * allocate FERRY__IO_ALIGN-aligned buffers and place the data at offset % FERRY__IO_ALIGN.
 */
#ifndef FERRY_IO_H
#define FERRY_IO_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "util/util.h"

#define FERRY__IO_ALIGN 4096u
#define FERRY__IO_CHUNK (UINT64_C(16) << 20) /* bytes per worker read, by default */
#define FERRY__IO_CHUNK_MIN (UINT64_C(64) << 10)
#define FERRY__IO_CHUNK_MAX (UINT64_C(1) << 30) /* io_uring's lengths are 32-bit */
/* A relayed request's chunk: the bytes of one read into a relay reader's slot (see `relay`). */
#define FERRY__IO_RELAY_PIECE (UINT64_C(512) << 10)
/* The relay readers of a pool, and the alignment of their slots' one mapping (a huge page). */
#define FERRY__IO_RELAY_READERS 32u
#define FERRY__IO_RELAY_ALIGN (UINT64_C(2) << 20)

/* A file open for reading. Never written: the mapping is PROT_READ, MAP_SHARED (iofile.c says why).
 * ferry itself never reads the mapping's bytes (every copy goes through pread on fd): a file
 * truncated under it is an error, not SIGBUS. Only zero-copy pointers handed to the engine read
 * the mapping (the catalog parses headers from pread buffers too). The struct must not move between open and close (the
 * SIGBUS guard's registry points at `changed`). */
typedef struct ferry__iofile {
    char *path;                 /* owned */
    char *where;                /* PATH made absolute at open (owned), or NULL: PATH is */
    int fd;                     /* O_RDONLY | O_CLOEXEC */
    int fd_direct;              /* O_RDONLY | O_DIRECT, or -1 when the filesystem refuses it */
    uint64_t size;
    const unsigned char *map;   /* whole-file mapping, or NULL for an empty file */
    /* identity at open (fstat of fd); ferry__iofile_check compares against it */
    uint64_t dev, ino;
    int64_t mtime_s, mtime_ns;
    int guard_slot;             /* slot in the SIGBUS guard's registry, or -1 */
    _Atomic int changed;        /* FERRY__CHANGED_LOST once the SIGBUS guard mapped zeros over
                                   lost pages of the mapping (for good: they stay zeros) */
    _Atomic uint64_t path_checked_ns; /* CLOCK_MONOTONIC of the last lookup of the path (0: none) */
    _Atomic uint64_t path_other_ino;  /* what it found: 0, or bit 63 | the other file's inode */
} ferry__iofile;
enum { FERRY__CHANGED_LOST = 1 };

/* Opens PATH (a regular file) and maps it. Errors name PATH (ENOENT, EIO, EFORMAT for a
 * directory or device). */
int ferry__iofile_open(const char *path, ferry__iofile *f, ferry__err *e);
void ferry__iofile_close(ferry__iofile *f);

/* FERRY_ECHANGED naming F's path and what changed (size a -> b, modification time, and with
 * PATH_TOO the path now naming another file) when the file differs from what was opened now, or
 * when the SIGBUS guard ever found pages of its mapping gone; else 0. A file made again exactly
 * what was opened (size, time, inode) passes. One fstat of the descriptor, and a stat of the path
 * (PATH_TOO = FERRY__PATH_ALWAYS: every call; FERRY__PATH_RATE: at most every
 * FERRY__PATH_INTERVAL_NS, else the last lookup's answer); safe from any thread. */
enum { FERRY__PATH_NONE = 0, FERRY__PATH_RATE = 1, FERRY__PATH_ALWAYS = 2 };
#define FERRY__PATH_INTERVAL_NS UINT64_C(100000000)
int ferry__iofile_check(const ferry__iofile *f, int path_too, ferry__err *e);

/* The SIGBUS guard (ioguard.c). Mappings are registered at open and removed at close, in a
 * fixed table the handler reads without locks. */
int ferry__guard_register(const ferry__iofile *f);
void ferry__guard_unregister(int slot);

/* The system page size (cached). */
uint64_t ferry__io_page_size(void);

/* Fraction (0..1) of the pages of [off, off+len) resident in the page cache (mincore on the
 * mapping). */
double ferry__iofile_cached(const ferry__iofile *f, uint64_t off, uint64_t len);
/* Drops the file's pages from the page cache (posix_fadvise DONTNEED; dirty pages are none:
 * ferry never writes). */
int ferry__iofile_drop_cache(const ferry__iofile *f);

/* Synchronous read of [off, off+len) into DST with mode MODE (AUTO chooses per chunk; MMAP reads
 * through the descriptor like READ: a copy out of the mapping would die of SIGBUS on a file that
 * shrank), on the calling thread. Short reads and EINTR are retried; a read past the end is FERRY_EIO naming
 * PATH and the offset. */
int ferry__io_read(const ferry__iofile *f, uint64_t off, uint64_t len, void *dst, ferry_load mode,
                   ferry__err *e);

typedef struct ferry__io ferry__io;

/* Called exactly once per submitted request, on a worker thread (or on the submitting thread for
 * requests refused before queuing: no, those return an error and never call back). STATUS is 0,
 * a FERRY_E code, or FERRY_ECANCELED. */
typedef void (*ferry__io_done_fn)(void *ud, int status);
/* Progress: bytes done of all requests so far, bytes submitted so far. Called from workers. */
typedef void (*ferry__io_progress_fn)(void *ud, uint64_t done, uint64_t total);

typedef struct ferry__ioreq {
    const ferry__iofile *file; /* must stay open until done is called */
    uint64_t offset;
    uint64_t len;
    void *dst;                 /* must stay valid until done is called */
    ferry_load mode;
    ferry__io_done_fn done;
    void *ud;
    /* Optional: called with UD and the bytes of each chunk read successfully, on a worker, before
     * done (a long request's own progress). */
    void (*chunk_read)(void *ud, uint64_t bytes);
    /* Optional: 1 hands the request to the pool's relay readers, started at the first relayed
     * request: FERRY__IO_RELAY_READERS threads, each reading one chunk of FERRY__IO_RELAY_PIECE
     * bytes at a time with a blocking pread into a slot of its own, used again and again, and
     * copying it to its place in DST (the place's pages faulted in first) once whole. The slots
     * are 16 MiB in all, in 2 MiB pages, kept until the pool is destroyed. On a VM whose disk its
     * host emulates (the host copies the data into guest memory), a read into a few small
     * buffers used again and again ran 1.1-1.5 times as fast as one straight into the
     * destination, whether that lay in fresh 4 KiB pages (where a direct read is also cut into
     * device requests of one segment per physically separate page, 254 a request on virtio) or
     * in huge pages used before; and 32 blocking readers each copying its own piece read fresh
     * memory 1.2 times as fast as the io_uring workers relaying through slots of their own
     * (bench/README.md has the figures). A chunk AUTO reads buffered, a file without O_DIRECT,
     * and every chunk where the readers could not start (slots or threads refused) read
     * straight into DST. */
    int relay;
    /* Written by the engine before done is called; read it in (or after) the done callback. On a
     * non-zero status: the detail of the chunk that failed first, e.g. "PATH: read of N bytes at
     * offset O failed: <strerror>", or "PATH: read of N bytes at offset O cancelled"; "" on
     * success. Also filled when submit refuses the request with FERRY_EIO (range past the end). */
    char errmsg[256];
    uint64_t err_offset;       /* on a non-zero status: the file offset where the failed read
                                  started (the request's offset when submit refused it) */
    /* private to the engine */
    uint64_t next_chunk;       /* byte position of the next chunk to hand out */
    uint64_t chunk;            /* the pool's chunk size when it was submitted */
    uint64_t chunks_left;
    int status;
    struct ferry__ioreq *next;
} ferry__ioreq;

/* A pool of NTHREADS workers (0: 4). NULL when memory or threads are exhausted.
 * Backend: with io_uring (built with liburing and allowed by the kernel; a refusal, e.g. by a
 * container's seccomp filter, silently means threads) each worker keeps several chunks in flight
 * on its own ring; otherwise each worker reads one chunk at a time with pread. The environment
 * variable FERRY_IO_BACKEND=threads|uring overrides the choice (uring still falls back to threads
 * where it is unavailable), for tests and benchmarks. Behaviour and callbacks are the same. */
ferry__io *ferry__io_create(unsigned nthreads);
/* Sets the bytes of one worker read (a request is cut into chunks of that size) to BYTES, 0 meaning
 * FERRY__IO_CHUNK, clamped to [FERRY__IO_CHUNK_MIN, FERRY__IO_CHUNK_MAX] and rounded down to
 * FERRY__IO_ALIGN; returns the size set. Requests submitted before keep theirs; safe from any
 * thread. IO NULL: only the clamping. */
uint64_t ferry__io_set_chunk(ferry__io *io, uint64_t bytes);
/* The chunk size set, and the number of workers. */
uint64_t ferry__io_chunk(const ferry__io *io);
unsigned ferry__io_threads(const ferry__io *io);
/* Bytes of relay slots IO's relay readers hold now (`relay`): 0 until a relayed request came. */
uint64_t ferry__io_relay_bytes(const ferry__io *io);
/* "uring" or "threads": the backend IO's workers use (a static string). */
const char *ferry__io_backend(const ferry__io *io);
/* Queues REQ (which must stay alive, unmoved, until its done callback returns). */
int ferry__io_submit(ferry__io *io, ferry__ioreq *req);
/* Cancels every queued chunk not yet started; their requests complete with FERRY_ECANCELED once
 * their running chunks finish. Waits until nothing is in flight. */
void ferry__io_cancel_all(ferry__io *io);
/* Cancels REQ's chunks not yet started (nothing when all are): it completes with FERRY_ECANCELED
 * once its running chunks finish, its done callback called as usual. Does not wait. */
void ferry__io_cancel_req(ferry__io *io, ferry__ioreq *req);
/* Cancels, drains and frees. NULL no-op. */
void ferry__io_destroy(ferry__io *io);
void ferry__io_set_progress(ferry__io *io, ferry__io_progress_fn fn, void *ud);
/* Bytes read from files by this engine (all modes), for stats. */
uint64_t ferry__io_bytes_read(const ferry__io *io);

#endif
