/*
 * limits.c — measures the machine's own limits for the benchmark: O_DIRECT sequential read
 * bandwidth of a file (what a cold load can reach), memcpy bandwidth (what a warm load can reach)
 * and the first-touch speed of fresh anonymous memory (what allocating a destination costs).
 *
 * Each measurement keeps setup (allocation, faulting buffers in, thread start) outside the timed
 * part, so the numbers are bounds for the code that is judged against them.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io.h"
#include "io/io_internal.h"
#include "io/limits.h"

#define LIMIT_BUF (UINT64_C(64) << 20)

typedef struct direct_job {
    int fd;
    uint64_t size;
    uint64_t piece;             /* bytes per read, a multiple of FERRY__IO_ALIGN */
    _Atomic uint64_t next;      /* offset of the next piece to read */
    pthread_barrier_t start;
    _Atomic int error;          /* first FERRY_E code of any reader */
} direct_job;

typedef struct direct_reader {
    direct_job *job;
    uint64_t bytes;
    double t0, t1;
} direct_reader;

static void set_error(direct_job *job, int code)
{
    int zero = 0;
    atomic_compare_exchange_strong(&job->error, &zero, code);
}

static void *direct_reader_main(void *arg)
{
    direct_reader *rd = arg;
    direct_job *job = rd->job;
    uint64_t cap = FERRY__MAX(LIMIT_BUF, job->piece);
    void *buf = NULL;
    if (posix_memalign(&buf, FERRY__IO_ALIGN, (size_t)cap) != 0) {
        buf = NULL;
        set_error(job, FERRY_ENOMEM);
    } else {
        memset(buf, 0, (size_t)cap); /* fault it in before the clock starts */
    }
    pthread_barrier_wait(&job->start);
    rd->t0 = ferry__now();
    while (buf && atomic_load(&job->error) == 0) {
        uint64_t off = atomic_fetch_add(&job->next, job->piece);
        if (off >= job->size)
            break;
        /* the last piece asks for whole blocks; the read comes back short at the end of file */
        uint64_t want = FERRY__MIN(job->piece, job->size - off);
        if (want % FERRY__IO_ALIGN)
            want += FERRY__IO_ALIGN - want % FERRY__IO_ALIGN;
        uint64_t got = 0;
        while (got < want) {
            ssize_t n = pread(job->fd, (unsigned char *)buf + got, (size_t)(want - got),
                              (off_t)(off + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                set_error(job, errno == EINVAL ? FERRY_EUNSUPPORTED : FERRY_EIO);
                break;
            }
            got += (uint64_t)n;
            if (n == 0 || (uint64_t)n % FERRY__IO_ALIGN)
                break; /* end of file */
        }
        rd->bytes += got;
    }
    rd->t1 = ferry__now();
    free(buf);
    return NULL;
}

double ferry__limit_direct_read(const char *path, unsigned readers, uint64_t request_bytes)
{
    if (!path)
        return FERRY_EINVAL;
    if (readers == 0)
        readers = 4;
    if (readers > 256)
        readers = 256;
    if (request_bytes == 0)
        request_bytes = FERRY__IO_CHUNK;
    if (request_bytes > (UINT64_C(1) << 30))
        request_bytes = UINT64_C(1) << 30;
    if (request_bytes % FERRY__IO_ALIGN)
        request_bytes += FERRY__IO_ALIGN - request_bytes % FERRY__IO_ALIGN;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? FERRY_ENOENT : FERRY_EIO;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return FERRY_EIO;
    }
    if (st.st_size == 0) {
        close(fd);
        return FERRY_EINVAL;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0)
        return errno == EINVAL ? FERRY_EUNSUPPORTED : FERRY_EIO;

    direct_job job;
    memset(&job, 0, sizeof job);
    job.fd = fd;
    job.size = (uint64_t)st.st_size;
    job.piece = request_bytes;
    atomic_init(&job.next, 0);
    atomic_init(&job.error, 0);
    direct_reader *rd = calloc(readers, sizeof *rd);
    pthread_t *th = calloc(readers, sizeof *th);
    if (!rd || !th || pthread_barrier_init(&job.start, NULL, readers) != 0) {
        free(rd);
        free(th);
        close(fd);
        return FERRY_ENOMEM;
    }
    unsigned started = 0;
    for (; started < readers; started++) {
        rd[started].job = &job;
        if (pthread_create(&th[started], NULL, direct_reader_main, &rd[started]) != 0)
            break;
    }
    if (started < readers) {
        /* the barrier counts READERS threads: stand in for the missing ones, then stop at once */
        set_error(&job, FERRY_ENOMEM);
        for (unsigned i = started; i < readers; i++)
            pthread_barrier_wait(&job.start);
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&job.start);
    close(fd);

    double t0 = 0, t1 = 0;
    uint64_t bytes = 0;
    for (unsigned i = 0; i < started; i++) {
        if (i == 0 || rd[i].t0 < t0)
            t0 = rd[i].t0;
        if (i == 0 || rd[i].t1 > t1)
            t1 = rd[i].t1;
        bytes += rd[i].bytes;
    }
    free(rd);
    free(th);
    int err = atomic_load(&job.error);
    if (err)
        return err;
    if (bytes != job.size)
        return FERRY_EIO;
    if (t1 <= t0)
        return FERRY_EIO;
    return (double)bytes / (t1 - t0) / 1e9;
}

double ferry__limit_memcpy(uint64_t bytes)
{
    if (bytes == 0)
        bytes = UINT64_C(256) << 20;
    if (bytes > SIZE_MAX / 2)
        return FERRY_EINVAL;
    unsigned char *a = malloc((size_t)bytes), *b = malloc((size_t)bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return FERRY_ENOMEM;
    }
    memset(a, 1, (size_t)bytes);
    memset(b, 2, (size_t)bytes);
    double best = 0;
    for (int run = 0; run < 3; run++) {
        double t = ferry__now();
        memcpy(b, a, (size_t)bytes);
        t = ferry__now() - t;
        /* keep the copy from being optimised away */
        if (b[bytes - 1] != a[bytes - 1]) {
            best = FERRY_EIO;
            break;
        }
        a[bytes - 1] ^= 1;
        if (t > 0 && (double)bytes / t / 1e9 > best)
            best = (double)bytes / t / 1e9;
    }
    free(a);
    free(b);
    return best > 0 ? best : FERRY_EIO;
}

double ferry__limit_first_touch(uint64_t bytes)
{
    if (bytes == 0)
        bytes = UINT64_C(256) << 20;
    if (bytes > SIZE_MAX)
        return FERRY_EINVAL;
    uint64_t pg = ferry__io_page_size();
    void *m = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return FERRY_ENOMEM;
    volatile unsigned char *p = m;
    double t = ferry__now();
    for (uint64_t off = 0; off < bytes; off += pg)
        p[off] = 1;
    t = ferry__now() - t;
    munmap(m, (size_t)bytes);
    return t > 0 ? (double)bytes / t / 1e9 : FERRY_EIO;
}
