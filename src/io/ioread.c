/*
 * ioread.c — moving a byte range of a file into memory by one of the four load modes, on the
 * calling thread. The worker pool (iopool.c) calls ferry__io_read_range once per chunk; the
 * synchronous ferry__io_read calls it once for the whole range.
 *
 *  - MMAP: buffered pread, as READ. A private copy is never taken out of the mapping: a memcpy
 *    from pages whose file bytes are gone (the file was truncated under ferry) dies of SIGBUS,
 *    where pread reports the end of the file. The mapping serves zero-copy tensors only.
 *  - READ: buffered pread, up to FERRY__IO_MAX_SYSCALL bytes per call.
 *  - DIRECT: O_DIRECT straight into DST for the block-aligned middle (no copy), when DST and the
 *    file offset are congruent modulo FERRY__IO_ALIGN; the unaligned head and tail go through a
 *    one-block bounce buffer. Anything else (incongruent DST, no O_DIRECT descriptor, a
 *    filesystem that refuses the alignment) is read buffered.
 *  - AUTO: per FERRY__IO_CHUNK piece, a buffered read when the piece is mostly in the page cache
 *    (not a copy out of the mapping: that would fault every page into this process and keep it in
 *    its resident set, so a budget would not bound it), else DIRECT.
 *
 * Every loop retries EINTR and short reads; a read that finds the end of the file before the range
 * ends (the file shrank after open) is FERRY_EIO naming the path and the offset.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_internal.h"

int ferry__io_check_range(const ferry__iofile *f, uint64_t off, uint64_t len, ferry__err *e)
{
    uint64_t end;
    if (ferry__add_u64(off, len, &end) || end > f->size)
        return ferry__fail(e, FERRY_EIO,
                           "%s: read of %llu bytes at offset %llu goes past the end of the file "
                           "(%llu bytes)",
                           f->path, (unsigned long long)len, (unsigned long long)off,
                           (unsigned long long)f->size);
    return 0;
}

/* Buffered pread of exactly LEN bytes at OFF. */
static int pread_full(const ferry__iofile *f, int fd, unsigned char *dst, uint64_t len,
                      uint64_t off, ferry__err *e)
{
    while (len > 0) {
        size_t want = (size_t)FERRY__MIN(len, FERRY__IO_MAX_SYSCALL);
        ssize_t n = ferry__sys_pread(fd, dst, want, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int err = errno;
            return ferry__fail(e, FERRY_EIO, "%s: read of %zu bytes at offset %llu failed: %s",
                               f->path, want, (unsigned long long)off, strerror(err));
        }
        if (n == 0)
            return ferry__fail(e, FERRY_EIO,
                               "%s: end of file at offset %llu with %llu bytes still to read "
                               "(the file shrank?)",
                               f->path, (unsigned long long)off, (unsigned long long)len);
        dst += n;
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    return 0;
}

/* Result of one direct read attempt. */
enum { DIRECT_DONE = 0, DIRECT_FALLBACK = 1 };

/* O_DIRECT read of [off, off+len) into DST, all three block-aligned. Returns DIRECT_DONE,
 * DIRECT_FALLBACK with *got bytes read when the rest must be read buffered (the filesystem
 * refused the alignment, or a short read that is not a whole number of blocks), or a FERRY_E
 * code. */
static int direct_full(const ferry__iofile *f, unsigned char *dst, uint64_t len, uint64_t off,
                       uint64_t *got, ferry__err *e)
{
    uint64_t start = off;
    while (len > 0) {
        size_t want = (size_t)FERRY__MIN(len, FERRY__IO_MAX_SYSCALL);
        ssize_t n = ferry__sys_pread(f->fd_direct, dst, want, (off_t)off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EINVAL) {
                *got = off - start;
                return DIRECT_FALLBACK;
            }
            int err = errno;
            return ferry__fail(e, FERRY_EIO,
                               "%s: direct read of %zu bytes at offset %llu failed: %s", f->path,
                               want, (unsigned long long)off, strerror(err));
        }
        if (n == 0)
            return ferry__fail(e, FERRY_EIO,
                               "%s: end of file at offset %llu with %llu bytes still to read "
                               "(the file shrank?)",
                               f->path, (unsigned long long)off, (unsigned long long)len);
        dst += n;
        off += (uint64_t)n;
        len -= (uint64_t)n;
        if ((uint64_t)n % FERRY__IO_ALIGN && len > 0) {
            *got = off - start;
            return DIRECT_FALLBACK;
        }
    }
    *got = off - start;
    return DIRECT_DONE;
}

/* The NEED bytes at BLK + SKIP of the block at BLK (aligned), through BOUNCE, into DST. At the
 * end of the file the block read comes back short: only NEED + SKIP bytes must be there. */
static int bounce_read(const ferry__iofile *f, uint64_t blk, uint64_t skip, uint64_t need,
                       unsigned char *dst, unsigned char *bounce, ferry__err *e)
{
    for (;;) {
        ssize_t n = ferry__sys_pread(f->fd_direct, bounce, FERRY__IO_ALIGN, (off_t)blk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n >= 0 && (uint64_t)n >= skip + need) {
            memcpy(dst, bounce + skip, (size_t)need);
            return 0;
        }
        /* Refused or short: let the buffered descriptor read it and say what is wrong. */
        return pread_full(f, f->fd, dst, need, blk + skip, e);
    }
}

static int read_direct(const ferry__iofile *f, uint64_t off, uint64_t len, unsigned char *dst,
                       unsigned char *bounce, ferry__err *e)
{
    const uint64_t A = FERRY__IO_ALIGN;
    if (f->fd_direct < 0 || !bounce || (uintptr_t)dst % A != off % A)
        return pread_full(f, f->fd, dst, len, off, e);

    uint64_t end = off + len;
    uint64_t a0 = off % A ? off + (A - off % A) : off; /* first block boundary at or after off */
    uint64_t a1 = end - end % A;                       /* last block boundary at or before end */
    int r;
    if (a0 > a1) /* inside one block, touching neither boundary */
        return bounce_read(f, a1, off - a1, len, dst, bounce, e);
    if (off < a0 && (r = bounce_read(f, off - off % A, off % A, a0 - off, dst, bounce, e)) != 0)
        return r;
    if (a1 > a0) {
        uint64_t got = 0;
        r = direct_full(f, dst + (a0 - off), a1 - a0, a0, &got, e);
        if (r < 0)
            return r;
        if (r == DIRECT_FALLBACK &&
            (r = pread_full(f, f->fd, dst + (a0 - off) + got, a1 - a0 - got, a0 + got, e)) != 0)
            return r;
    }
    if (end > a1 && (r = bounce_read(f, a1, 0, end - a1, dst + (a1 - off), bounce, e)) != 0)
        return r;
    return 0;
}

int ferry__io_read_range(const ferry__iofile *f, uint64_t off, uint64_t len, unsigned char *dst,
                         ferry_load mode, unsigned char *bounce, ferry__err *e)
{
    if (len == 0)
        return 0;
    switch (mode) {
    case FERRY_LOAD_MMAP:
    case FERRY_LOAD_READ:
        return pread_full(f, f->fd, dst, len, off, e);
    case FERRY_LOAD_DIRECT:
        return read_direct(f, off, len, dst, bounce, e);
    case FERRY_LOAD_AUTO:
        break;
    default:
        return ferry__fail(e, FERRY_EINVAL, "%s: unknown load mode %d", f->path, (int)mode);
    }
    uint64_t end = off + len;
    for (uint64_t pos = off; pos < end;) {
        uint64_t next = ferry__io_chunk_end(off, end, pos, FERRY__IO_CHUNK);
        int r;
        if (ferry__io_auto_mode(f, pos, next - pos) == FERRY_LOAD_READ) {
            r = pread_full(f, f->fd, dst + (pos - off), next - pos, pos, e);
        } else {
            r = read_direct(f, pos, next - pos, dst + (pos - off), bounce, e);
        }
        if (r)
            return r;
        pos = next;
    }
    return 0;
}

int ferry__io_read(const ferry__iofile *f, uint64_t off, uint64_t len, void *dst, ferry_load mode,
                   ferry__err *e)
{
    if (!f || (!dst && len > 0))
        return ferry__fail(e, FERRY_EINVAL, "io_read: no file or no destination");
    int r = ferry__io_check_range(f, off, len, e);
    if (r || len == 0)
        return r;
    unsigned char *bounce = NULL;
    if ((mode == FERRY_LOAD_DIRECT || mode == FERRY_LOAD_AUTO) && f->fd_direct >= 0) {
        void *b = NULL;
        if (posix_memalign(&b, FERRY__IO_ALIGN, FERRY__IO_ALIGN) != 0)
            return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for a bounce buffer",
                               f->path);
        bounce = b;
    }
    r = ferry__io_read_range(f, off, len, dst, mode, bounce, e);
    free(bounce);
    return r;
}
