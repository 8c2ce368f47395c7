/*
 * iofile.c — files opened for reading by the I/O engine: a buffered descriptor, an O_DIRECT
 * descriptor when the filesystem allows one, and a read-only shared mapping of the whole file;
 * plus the page-cache probes (mincore residency, dropping the file's pages).
 *
 * ferry never writes a model file, so the mapping is PROT_READ of a read-only descriptor: no page
 * of it is ever dirty, no mprotect can make it writable, and dropping its pages from the page
 * cache only costs a re-read. MAP_SHARED, not MAP_PRIVATE: a device that page-locks the mapping
 * for its copy engine (cudaHostRegister) would copy every page of a private one into anonymous
 * memory, a second copy of the model, where a shared one stays the page cache. Someone else may:
 * the file's identity at open (device, inode, size, modification time) is kept, and
 * ferry__iofile_check compares the descriptor and the path against it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/io_internal.h"

uint64_t ferry__io_page_size(void)
{
    static _Atomic uint64_t cached;
    uint64_t p = cached;
    if (!p) {
        long s = sysconf(_SC_PAGESIZE);
        p = s > 0 ? (uint64_t)s : 4096;
        cached = p;
    }
    return p;
}

static int errno_code(int err)
{
    switch (err) {
    case ENOENT:
    case ENOTDIR: return FERRY_ENOENT;
    case ENOMEM: return FERRY_ENOMEM;
    default: return FERRY_EIO;
    }
}

/* PATH made absolute against the working directory of now (no links resolved: a link retargeted
 * later is a change), or NULL when it already is or the directory is unknown. */
static char *absolute(const char *path)
{
    if (path[0] == '/')
        return NULL;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    size_t a = strlen(cwd), b = strlen(path);
    char *s = malloc(a + b + 2);
    if (s) {
        memcpy(s, cwd, a);
        s[a] = '/';
        memcpy(s + a + 1, path, b + 1);
    }
    return s;
}

int ferry__iofile_open(const char *path, ferry__iofile *f, ferry__err *e)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->fd_direct = -1;
    f->guard_slot = -1;
    if (!path || !*path)
        return ferry__fail(e, FERRY_EINVAL, "open: empty path");

    /* O_NONBLOCK so that opening a FIFO by mistake cannot hang; it is cleared below and means
     * nothing for a regular file anyway. */
    int fd = ferry__sys_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        return ferry__fail(e, errno_code(err), "%s: cannot open: %s", path, strerror(err));
    }
    struct stat st;
    if (ferry__sys_fstat(fd, &st) != 0) {
        int err = errno;
        ferry__sys_close(fd);
        return ferry__fail(e, FERRY_EIO, "%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ferry__sys_close(fd);
        return ferry__fail(e, FERRY_EFORMAT, "%s: is not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (st.st_size < 0 || (uint64_t)st.st_size > SIZE_MAX) {
        ferry__sys_close(fd);
        return ferry__fail(e, FERRY_EOVERFLOW, "%s: size %lld cannot be mapped", path,
                           (long long)st.st_size);
    }
    uint64_t size = (uint64_t)st.st_size;

    char *copy = ferry__strdup(path);
    if (!copy) {
        ferry__sys_close(fd);
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    }

    const unsigned char *map = NULL;
    if (size > 0) {
        void *m = ferry__sys_mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            int err = errno;
            ferry__sys_close(fd);
            free(copy);
            return ferry__fail(e, err == ENOMEM ? FERRY_ENOMEM : FERRY_EIO,
                               "%s: cannot map %llu bytes: %s", path, (unsigned long long)size,
                               strerror(err));
        }
        map = m;
    }

    /* Opened by path a second time: a descriptor's O_DIRECT flag is shared by every dup of it.
     * EINVAL (tmpfs, some FUSE and overlay setups) means no direct I/O; reads fall back to the
     * buffered descriptor. A file replaced between the two opens is caught by comparing inodes. */
    int fdd = ferry__sys_open(path, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
    if (fdd >= 0) {
        struct stat sd;
        if (ferry__sys_fstat(fdd, &sd) != 0 || sd.st_dev != st.st_dev || sd.st_ino != st.st_ino) {
            ferry__sys_close(fdd);
            fdd = -1;
        } else {
            fl = fcntl(fdd, F_GETFL);
            if (fl >= 0)
                (void)fcntl(fdd, F_SETFL, fl & ~O_NONBLOCK);
        }
    }

    f->path = copy;
    f->fd = fd;
    f->fd_direct = fdd;
    f->size = size;
    f->map = map;
    f->dev = (uint64_t)st.st_dev;
    f->ino = (uint64_t)st.st_ino;
    f->mtime_s = (int64_t)st.st_mtim.tv_sec;
    f->mtime_ns = (int64_t)st.st_mtim.tv_nsec;
    f->changed = 0;
    f->where = absolute(path);
    f->guard_slot = map ? ferry__guard_register(f) : -1;
    return 0;
}

/* Appends ", " (when BUF is not empty) and TEXT to BUF of N bytes, NUL-terminated. */
static void add_what(char *buf, size_t n, const char *text)
{
    size_t used = strlen(buf);
    snprintf(buf + used, n - used, "%s%s", used ? ", " : "", text);
}

int ferry__iofile_check(const ferry__iofile *f, int path_too, ferry__err *e)
{
    if (!f || f->fd < 0)
        return 0;
    ferry__iofile *w = (ferry__iofile *)f; /* only the atomic fields are written */
    char what[384] = "", t[128];
    struct stat st;
    if (ferry__sys_fstat(f->fd, &st) == 0) {
        if ((uint64_t)st.st_size != f->size) {
            snprintf(t, sizeof t, "size %llu -> %llu bytes", (unsigned long long)f->size,
                     (unsigned long long)st.st_size);
            add_what(what, sizeof what, t);
        }
        if ((int64_t)st.st_mtim.tv_sec != f->mtime_s ||
            (int64_t)st.st_mtim.tv_nsec != f->mtime_ns) {
            snprintf(t, sizeof t, "modification time %lld.%09lld -> %lld.%09lld",
                     (long long)f->mtime_s, (long long)f->mtime_ns, (long long)st.st_mtim.tv_sec,
                     (long long)st.st_mtim.tv_nsec);
            add_what(what, sizeof what, t);
        }
    }
    /* A path that is gone is no change: the descriptor still reads the bytes that were opened.
     * One that names another file is (the model at that path is no longer this one). A lookup
     * costs a few fstats (bench/README.md): FERRY__PATH_RATE looks at most every
     * FERRY__PATH_INTERVAL_NS and otherwise reuses what the last lookup found. */
    if (path_too) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        uint64_t last = atomic_load(&w->path_checked_ns);
        uint64_t other = atomic_load(&w->path_other_ino);
        if (path_too == FERRY__PATH_ALWAYS || !last || now - last >= FERRY__PATH_INTERVAL_NS) {
            struct stat sp;
            other = stat(f->where ? f->where : f->path, &sp) == 0 &&
                            ((uint64_t)sp.st_dev != f->dev || (uint64_t)sp.st_ino != f->ino)
                        ? (uint64_t)sp.st_ino | UINT64_C(1) << 63
                        : 0;
            atomic_store(&w->path_other_ino, other);
            atomic_store(&w->path_checked_ns, now ? now : 1);
        }
        if (other) {
            snprintf(t, sizeof t, "the path now names another file: inode %llu -> %llu",
                     (unsigned long long)f->ino,
                     (unsigned long long)(other & ~(UINT64_C(1) << 63)));
            add_what(what, sizeof what, t);
        }
    }
    if (atomic_load(&w->changed) & FERRY__CHANGED_LOST)
        add_what(what, sizeof what, "pages of its mapping could no longer be read");
    if (!what[0])
        return 0;
    return ferry__fail(e, FERRY_ECHANGED, "%s: the file changed since it was opened (%s)",
                       f->path, what);
}

void ferry__iofile_close(ferry__iofile *f)
{
    if (!f)
        return;
    if (f->map && f->guard_slot >= 0)
        ferry__guard_unregister(f->guard_slot);
    if (f->map)
        ferry__sys_munmap((void *)f->map, (size_t)f->size);
    if (f->fd >= 0)
        ferry__sys_close(f->fd);
    if (f->fd_direct >= 0)
        ferry__sys_close(f->fd_direct);
    free(f->path);
    free(f->where);
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->fd_direct = -1;
    f->guard_slot = -1;
}

/* Clips [off, off+len) to the file and rounds it out to pages: *start and *n are the page-aligned
 * offset into the mapping and its length. 0 when nothing of the range is inside the mapping. */
static int page_range(const ferry__iofile *f, uint64_t off, uint64_t len, uint64_t *start,
                      uint64_t *n)
{
    if (!f || !f->map || off >= f->size || len == 0)
        return 0;
    uint64_t end = len > f->size - off ? f->size : off + len;
    uint64_t pg = ferry__io_page_size();
    uint64_t s = off - off % pg;
    uint64_t t = end % pg ? end + (pg - end % pg) : end;
    *start = s;
    *n = t - s;
    return 1;
}

double ferry__iofile_cached(const ferry__iofile *f, uint64_t off, uint64_t len)
{
    uint64_t s, n;
    if (!page_range(f, off, len, &s, &n))
        return len == 0 ? 1.0 : 0.0;
    uint64_t pg = ferry__io_page_size();
    uint64_t pages = n / pg, resident = 0;
    /* One mincore per 4096 pages: the vector stays on the stack whatever the range. */
    unsigned char vec[4096];
    for (uint64_t done = 0; done < pages;) {
        uint64_t k = FERRY__MIN(pages - done, (uint64_t)sizeof vec);
        if (mincore((void *)(f->map + s + done * pg), (size_t)(k * pg), vec) != 0)
            return 0.0; /* unknown: say "not cached", which is always a safe answer */
        for (uint64_t i = 0; i < k; i++)
            resident += vec[i] & 1;
        done += k;
    }
    return (double)resident / (double)pages;
}

int ferry__iofile_drop_cache(const ferry__iofile *f)
{
    if (!f || f->fd < 0)
        return FERRY_EINVAL;
    /* Pages mapped into this process are skipped by DONTNEED: unmap them from our page tables
     * first. The mapping is private and never written, so the next touch re-reads the file. */
    if (f->map)
        (void)madvise((void *)f->map, (size_t)f->size, MADV_DONTNEED);
    int r = posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
    return r == 0 ? 0 : FERRY_EIO;
}
