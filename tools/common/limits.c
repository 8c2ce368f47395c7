/*
 * limits.c — measures the machine's own limits (see limits.h): O_DIRECT and cold buffered reads
 * of a file, memcpy bandwidth, and the first-touch speed of fresh anonymous memory; and the page
 * cache control the cold measurements need.
 *
 * Each measurement allocates and faults in what it reuses before the clock starts, and starts its
 * threads behind a start gate, so that only the work being bounded is timed.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"
#include "limits.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; refused before, and the copy faults the pages */
#endif

#define ALIGN UINT64_C(4096) /* O_DIRECT buffer, offset and length alignment */
#define MAX_THREADS 64u

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The size of regular file PATH into *SIZE; 0 or a negative FERRY_E code. */
static int file_size(const char *path, uint64_t *size)
{
    struct stat st;
    if (!path)
        return FERRY_EINVAL;
    if (stat(path, &st) != 0)
        return errno == ENOENT ? FERRY_ENOENT : FERRY_EIO;
    if (!S_ISREG(st.st_mode))
        return FERRY_EIO;
    *size = (uint64_t)st.st_size;
    return 0;
}

/* ---- page cache ------------------------------------------------------------------------------ */

int limits_drop_cache(const char *path)
{
    if (!path)
        return FERRY_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? FERRY_ENOENT : FERRY_EIO;
    int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return r == 0 ? 0 : FERRY_EIO;
}

double limits_cached_fraction(const char *path)
{
    uint64_t size;
    int rc = file_size(path, &size);
    if (rc)
        return rc;
    if (size == 0 || size > SIZE_MAX)
        return FERRY_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return FERRY_EIO;
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return FERRY_ENOMEM;
    uint64_t pg = page_size(), pages = (size + pg - 1) / pg, resident = 0;
    unsigned char vec[4096];
    for (uint64_t done = 0; done < pages;) {
        uint64_t k = pages - done < sizeof vec ? pages - done : sizeof vec;
        if (mincore((unsigned char *)m + done * pg, (size_t)(k * pg), vec) != 0) {
            munmap(m, (size_t)size);
            return FERRY_EIO;
        }
        for (uint64_t i = 0; i < k; i++)
            resident += vec[i] & 1;
        done += k;
    }
    munmap(m, (size_t)size);
    return (double)resident / (double)pages;
}

int limits_warm_file(const char *path)
{
    if (!path)
        return FERRY_EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? FERRY_ENOENT : FERRY_EIO;
    size_t cap = (size_t)8 << 20;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return FERRY_ENOMEM;
    }
    ssize_t n;
    while ((n = read(fd, buf, cap)) > 0 || (n < 0 && errno == EINTR))
        ;
    free(buf);
    close(fd);
    return n == 0 ? 0 : FERRY_EIO;
}

/* ---- O_DIRECT reads ------------------------------------------------------------------------ */

static void set_error(_Atomic int *slot, int code)
{
    int zero = 0;
    atomic_compare_exchange_strong(slot, &zero, code);
}

/* A start line: workers arrive (gate_arrive blocks until the gate opens), the caller waits until
 * all it started have arrived (gate_await), then starts the clock and opens it. Unlike a barrier,
 * it needs no count fixed before the threads are created, so a failed pthread_create cannot
 * leave anyone waiting forever. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned arrived;
    int open;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->arrived = 0;
    g->open = 0;
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void gate_arrive(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->arrived++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_await(gate *g, unsigned n)
{
    pthread_mutex_lock(&g->mu);
    while (g->arrived < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

typedef struct direct_job {
    int fd;
    uint64_t size;            /* of the file */
    uint64_t piece;           /* bytes per request, a multiple of ALIGN */
    uint64_t slots;           /* pieces in each reader's buffer, used in turn */
    _Atomic uint64_t next;    /* offset of the next piece */
    _Atomic int error;        /* first FERRY_E code of any reader */
    gate start;               /* readers arrive with their buffers faulted in */
    /* limits_first_pass: the file's first KEEP bytes go to their own place in FRESH (mapped,
     * never touched before the clock); with faulters, readers wait until FAULTED covers a piece */
    unsigned char *fresh;
    uint64_t keep;            /* 0: every piece into the readers' reused buffers */
    unsigned faulters;
    _Atomic uint64_t faulted; /* bytes of FRESH from 0 that the faulters have touched */
    _Atomic uint64_t fault_next;
    pthread_mutex_t fault_mu; /* guards done and the advance of faulted */
    unsigned char *done;      /* per 2 MiB unit of FRESH: touched, not yet counted in faulted */
} direct_job;

#define FIRST_UNIT (UINT64_C(2) << 20)

typedef struct direct_reader {
    direct_job *job;
    uint64_t bytes;
    double t0, t1;
} direct_reader;

static void nap(void)
{
    struct timespec ts = {0, 100 * 1000};
    nanosleep(&ts, NULL);
}

/* The place of the piece [OFF, OFF + WANT) of the kept bytes in job->fresh, made ready: touched
 * by the reader itself (one byte a page, as ferry's loaders fault a fresh block in), or, with
 * faulters, once they have touched all of it. 1 when the job failed meanwhile. */
static int fresh_place(direct_job *job, uint64_t off, uint64_t want, unsigned char **dst)
{
    *dst = job->fresh + off;
    uint64_t end = off + want;
    if (!job->faulters) {
        volatile unsigned char *p = *dst;
        for (uint64_t at = 0; at < want; at += ALIGN)
            p[at] = 0;
        return 0;
    }
    uint64_t need = round_up(end < job->keep ? end : job->keep, FIRST_UNIT);
    while (atomic_load(&job->faulted) < need)
        if (atomic_load(&job->error))
            return 1;
        else
            nap();
    return 0;
}

/* A faulter of limits_first_pass: touches the 2 MiB units of job->fresh in file order, each by
 * whichever faulter takes it, and advances job->faulted over the units done from the start. */
static void *fault_main(void *arg)
{
    direct_job *job = arg;
    uint64_t len = round_up(job->keep, FIRST_UNIT);
    gate_arrive(&job->start);
    for (;;) {
        uint64_t at = atomic_fetch_add(&job->fault_next, FIRST_UNIT);
        if (at >= len || atomic_load(&job->error))
            break;
        volatile unsigned char *p = job->fresh + at;
        for (uint64_t o = 0; o < FIRST_UNIT; o += ALIGN)
            p[o] = 0;
        pthread_mutex_lock(&job->fault_mu);
        job->done[at / FIRST_UNIT] = 1;
        uint64_t f = atomic_load(&job->faulted);
        while (f < len && job->done[f / FIRST_UNIT])
            f += FIRST_UNIT;
        atomic_store(&job->faulted, f);
        pthread_mutex_unlock(&job->fault_mu);
    }
    return NULL;
}

static void *direct_main(void *arg)
{
    direct_reader *rd = arg;
    direct_job *job = rd->job;
    /* The buffer asks for transparent huge pages, 2 MiB-aligned: physically contiguous pages let
     * the block layer send large requests (a virtio disk takes at most 254 segments a request, so
     * scattered 4 KiB pages cap a request at 1016 KiB). Measured on this VM: 1.7-1.9 GB/s into
     * huge pages, 1.0 GB/s into small ones. Where THP is off it is small pages as before. It holds
     * job->slots pieces, filled in turn (see LIMITS_DIRECT_DEST). */
    const size_t huge = (size_t)2 << 20;
    size_t buf_len = (size_t)(job->piece * job->slots), map_len = buf_len + huge;
    unsigned char *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
    unsigned char *buf = NULL;
    if (map == MAP_FAILED) {
        map = NULL;
        set_error(&job->error, FERRY_ENOMEM);
    } else {
        buf = map + ((huge - (uintptr_t)map % huge) % huge);
#ifdef MADV_HUGEPAGE
        (void)madvise(buf, buf_len, MADV_HUGEPAGE);
#endif
        memset(buf, 0, buf_len); /* reused: faulted in before the clock */
    }
    gate_arrive(&job->start);
    rd->t0 = ferry_now();
    for (uint64_t k = 0; buf && atomic_load(&job->error) == 0; k++) {
        unsigned char *dst = buf + (size_t)(k % job->slots * job->piece);
        uint64_t off = atomic_fetch_add(&job->next, job->piece);
        if (off >= job->size)
            break;
        /* The last piece asks for whole blocks; the read comes back short at the end. */
        uint64_t want = round_up(job->size - off < job->piece ? job->size - off : job->piece,
                                 ALIGN);
        if (off < job->keep && fresh_place(job, off, want, &dst))
            break;
        uint64_t got = 0;
        while (got < want) {
            ssize_t n = pread(job->fd, dst + got, (size_t)(want - got),
                              (off_t)(off + got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                set_error(&job->error, errno == EINVAL ? FERRY_EUNSUPPORTED : FERRY_EIO);
                break;
            }
            got += (uint64_t)n;
            if (n == 0 || (uint64_t)n % ALIGN)
                break; /* end of file */
        }
        rd->bytes += got;
    }
    rd->t1 = ferry_now();
    if (map)
        munmap(map, map_len);
    return NULL;
}

static double direct_run(const char *path, unsigned readers, uint64_t request, uint64_t keep,
                         unsigned faulters, limits_pages pages, double *seconds);

double limits_direct_read(const char *path, unsigned readers, uint64_t request)
{
    return direct_run(path, readers, request, 0, 0, LIMITS_PAGES_HUGE, NULL);
}

double limits_first_pass(const char *path, uint64_t keep, unsigned readers, uint64_t request,
                         unsigned faulters, limits_pages pages, double *seconds)
{
    if (seconds)
        *seconds = 0;
    if (faulters > MAX_THREADS || (pages != LIMITS_PAGES_HUGE && pages != LIMITS_PAGES_SMALL))
        return FERRY_EINVAL;
    return direct_run(path, readers, request, keep, faulters, pages, seconds);
}

/* limits_direct_read, and limits_first_pass where KEEP > 0. */
static double direct_run(const char *path, unsigned readers, uint64_t request, uint64_t keep,
                         unsigned faulters, limits_pages pages, double *seconds)
{
    uint64_t size;
    int rc = file_size(path, &size);
    if (rc)
        return rc;
    if (size == 0)
        return FERRY_EINVAL;
    if (readers == 0 || readers > MAX_THREADS)
        return FERRY_EINVAL;
    if (request == 0)
        request = UINT64_C(16) << 20;
    if (request > (UINT64_C(1) << 30))
        request = UINT64_C(1) << 30;
    request = round_up(request, ALIGN);
    if ((rc = limits_drop_cache(path)))
        return rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0)
        return errno == EINVAL ? FERRY_EUNSUPPORTED : FERRY_EIO;

    direct_job job;
    memset(&job, 0, sizeof job);
    job.fd = fd;
    job.size = size;
    job.piece = request;
    /* Enough pieces a reader that all readers' buffers hold LIMITS_DIRECT_DEST bytes, but no more
     * than a reader can fill: the file's pieces shared out (a small file needs no more). */
    uint64_t pieces = (size + request - 1) / request, per_reader = (pieces + readers - 1) / readers;
    uint64_t all = (uint64_t)readers * request;
    job.slots = (LIMITS_DIRECT_DEST + all - 1) / all;
    if (job.slots > per_reader) /* both at least 1: the file is not empty */
        job.slots = per_reader;
    atomic_init(&job.next, 0);
    atomic_init(&job.error, 0);
    atomic_init(&job.faulted, 0);
    atomic_init(&job.fault_next, 0);
    /* The kept bytes' fresh memory: 2 MiB-aligned, advised huge pages (as a stream's host
     * buffers are) or small pages only; mapped before the clock (a mapping costs nothing until
     * touched). */
    size_t fresh_len = 0, fresh_map_len = 0;
    unsigned char *fresh_map = NULL;
    job.keep = keep < size ? keep : size;
    if (job.keep) {
        /* room for the whole of the last piece that starts below KEEP */
        fresh_len = (size_t)round_up(job.keep + job.piece, FIRST_UNIT);
        fresh_map_len = fresh_len + (size_t)FIRST_UNIT;
        fresh_map = mmap(NULL, fresh_map_len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        job.done = calloc(fresh_len / FIRST_UNIT, 1);
        if (fresh_map == MAP_FAILED || !job.done) {
            if (fresh_map != MAP_FAILED)
                munmap(fresh_map, fresh_map_len);
            free(job.done);
            close(fd);
            return FERRY_ENOMEM;
        }
        job.fresh = fresh_map + (FIRST_UNIT - (uintptr_t)fresh_map % FIRST_UNIT) % FIRST_UNIT;
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
        (void)madvise(job.fresh, fresh_len,
                      pages == LIMITS_PAGES_SMALL ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
#endif
        job.faulters = faulters;
    }
    pthread_mutex_init(&job.fault_mu, NULL);
    direct_reader rd[MAX_THREADS];
    pthread_t th[MAX_THREADS], fth[MAX_THREADS];
    memset(rd, 0, sizeof rd);
    gate_init(&job.start);
    unsigned started = 0, fstarted = 0;
    for (; started < readers; started++) {
        rd[started].job = &job;
        if (pthread_create(&th[started], NULL, direct_main, &rd[started]) != 0)
            break;
    }
    for (; started == readers && fstarted < job.faulters; fstarted++)
        if (pthread_create(&fth[fstarted], NULL, fault_main, &job) != 0)
            break;
    if (started < readers || fstarted < job.faulters)
        set_error(&job.error, FERRY_ENOMEM); /* the threads that started stop at once */
    gate_await(&job.start, started + fstarted);
    double t_open = ferry_now();
    gate_open(&job.start);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    for (unsigned i = 0; i < fstarted; i++)
        pthread_join(fth[i], NULL);
    gate_destroy(&job.start);
    pthread_mutex_destroy(&job.fault_mu);
    close(fd);
    if (fresh_map)
        munmap(fresh_map, fresh_map_len);
    free(job.done);

    double t0 = 0, t1 = 0;
    uint64_t bytes = 0;
    for (unsigned i = 0; i < started; i++) {
        if (i == 0 || rd[i].t0 < t0)
            t0 = rd[i].t0;
        if (i == 0 || rd[i].t1 > t1)
            t1 = rd[i].t1;
        bytes += rd[i].bytes;
    }
    int err = atomic_load(&job.error);
    if (err)
        return err;
    if (job.keep)
        t0 = t_open; /* the faulters' work before the first read counts */
    if (bytes != size || t1 <= t0)
        return FERRY_EIO;
    if (seconds)
        *seconds = t1 - t0;
    return (double)bytes / (t1 - t0) / 1e9;
}

/* ---- a cold load through relay slots -------------------------------------------------------- */

typedef struct relay_job {
    int fd;
    uint64_t size, piece;
    unsigned char *dst;      /* fresh memory of the file's size in small pages, or DST_LEN
                                bytes of reused huge pages faulted in before the clock */
    uint64_t dst_len;
    int fresh;
    unsigned char *slots;    /* one slot of PIECE bytes a reader */
    _Atomic uint64_t next;   /* the next piece's offset */
    _Atomic int error;
    gate start;
} relay_job;

typedef struct relay_reader {
    relay_job *job;
    unsigned index;
    double t1;
} relay_reader;

static void *relay_main(void *arg)
{
    relay_reader *r = arg;
    relay_job *j = r->job;
    unsigned char *slot = j->slots + (size_t)r->index * j->piece;
    gate_arrive(&j->start);
    for (;;) {
        uint64_t off = atomic_fetch_add(&j->next, j->piece);
        if (off >= j->size || atomic_load(&j->error))
            break;
        uint64_t n = j->size - off < j->piece ? j->size - off : j->piece;
        uint64_t want = round_up(n, ALIGN), got = 0;
        while (got < n) {
            ssize_t k = pread(j->fd, slot + got, (size_t)(want - got), (off_t)(off + got));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                set_error(&j->error, FERRY_EIO);
                return NULL;
            }
            got += (uint64_t)k;
        }
        uint64_t at = j->fresh ? off : off % j->dst_len;
        uint64_t lo = round_up(at, ALIGN), hi = (at + n) / ALIGN * ALIGN;
        if (j->fresh && hi > lo)
            (void)madvise(j->dst + lo, (size_t)(hi - lo), MADV_POPULATE_WRITE);
        memcpy(j->dst + at, slot, (size_t)n);
    }
    r->t1 = ferry_now();
    return NULL;
}

/* limits_relayed_load (FRESH) and limits_relayed_read. */
static double relay_run(const char *path, unsigned readers, uint64_t piece, int fresh,
                        double *seconds)
{
    if (seconds)
        *seconds = 0;
    uint64_t size;
    int rc = file_size(path, &size);
    if (rc)
        return rc;
    if (size == 0 || readers == 0 || readers > MAX_THREADS)
        return FERRY_EINVAL;
    piece = round_up(piece ? piece : UINT64_C(512) << 10, ALIGN);
    if ((rc = limits_drop_cache(path)))
        return rc;
    relay_job job;
    memset(&job, 0, sizeof job);
    job.fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (job.fd < 0)
        return errno == EINVAL ? FERRY_EUNSUPPORTED : FERRY_EIO;
    job.size = size;
    job.piece = piece;
    const size_t huge = (size_t)2 << 20;
    size_t slots_len = (size_t)round_up((uint64_t)readers * piece, huge);
    /* the reused destination: LIMITS_DIRECT_DEST bytes, whole pieces, or the file's size */
    uint64_t reuse = round_up(LIMITS_DIRECT_DEST, piece);
    size_t dst_len = (size_t)round_up(fresh || size < reuse ? size : reuse, ALIGN);
    unsigned char *sm = mmap(NULL, slots_len + huge, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *dm = mmap(NULL, dst_len + huge, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sm == MAP_FAILED || dm == MAP_FAILED) {
        if (sm != MAP_FAILED)
            munmap(sm, slots_len + huge);
        if (dm != MAP_FAILED)
            munmap(dm, dst_len + huge);
        close(job.fd);
        return FERRY_ENOMEM;
    }
    job.slots = sm + (huge - (uintptr_t)sm % huge) % huge;
    job.dst = dm + (huge - (uintptr_t)dm % huge) % huge;
    job.dst_len = dst_len;
    job.fresh = fresh;
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    (void)madvise(job.slots, slots_len, MADV_HUGEPAGE);
    (void)madvise(job.dst, dst_len, fresh ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
#endif
    memset(job.slots, 0, slots_len);
    if (!fresh)
        memset(job.dst, 0, dst_len);
    atomic_init(&job.next, 0);
    atomic_init(&job.error, 0);
    gate_init(&job.start);
    relay_reader rd[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    unsigned started = 0;
    for (; started < readers; started++) {
        rd[started] = (relay_reader){.job = &job, .index = started};
        if (pthread_create(&th[started], NULL, relay_main, &rd[started]) != 0)
            break;
    }
    if (started < readers)
        set_error(&job.error, FERRY_ENOMEM); /* the threads that started stop at once */
    gate_await(&job.start, started);
    double t0 = ferry_now(), t1 = t0;
    gate_open(&job.start);
    for (unsigned i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        t1 = rd[i].t1 > t1 ? rd[i].t1 : t1;
    }
    gate_destroy(&job.start);
    close(job.fd);
    munmap(sm, slots_len + huge);
    munmap(dm, dst_len + huge);
    int err = atomic_load(&job.error);
    if (err)
        return err;
    if (t1 <= t0)
        return FERRY_EIO;
    if (seconds)
        *seconds = t1 - t0;
    return (double)size / (t1 - t0) / 1e9;
}

double limits_relayed_load(const char *path, unsigned readers, uint64_t piece, double *seconds)
{
    return relay_run(path, readers, piece, 1, seconds);
}

double limits_relayed_read(const char *path, unsigned readers, uint64_t piece)
{
    return relay_run(path, readers, piece, 0, NULL);
}

double limits_direct_read_best(const char *path, const unsigned *readers, size_t nr,
                               const uint64_t *requests, size_t nq, unsigned *best_readers,
                               uint64_t *best_request)
{
    static const unsigned def_readers[] = {1, 2, 4, 8};
    static const uint64_t def_requests[] = {UINT64_C(64) << 20, UINT64_C(16) << 20};
    if (!readers || !nr) {
        readers = def_readers;
        nr = sizeof def_readers / sizeof def_readers[0];
    }
    if (!requests || !nq) {
        requests = def_requests;
        nq = sizeof def_requests / sizeof def_requests[0];
    }
    double best = 0;
    for (size_t q = 0; q < nq; q++)
        for (size_t r = 0; r < nr; r++) {
            double g = limits_direct_read(path, readers[r], requests[q]);
            if (g < 0)
                return g;
            if (g > best) {
                best = g;
                if (best_readers)
                    *best_readers = readers[r];
                if (best_request)
                    *best_request = requests[q];
            }
        }
    return best;
}

/* ---- buffered reads ------------------------------------------------------------------------ */

double limits_buffered_read(const char *path, uint64_t request)
{
    uint64_t size;
    int rc = file_size(path, &size);
    if (rc)
        return rc;
    if (size == 0)
        return FERRY_EINVAL;
    if (request == 0)
        request = UINT64_C(64) << 20;
    if (request > (UINT64_C(1) << 30))
        request = UINT64_C(1) << 30;
    unsigned char *buf = malloc((size_t)request);
    if (!buf)
        return FERRY_ENOMEM;
    memset(buf, 0, (size_t)request); /* reused: faulted in before the clock */
    if ((rc = limits_drop_cache(path))) {
        free(buf);
        return rc;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        free(buf);
        return FERRY_EIO;
    }
    double t0 = ferry_now();
    uint64_t total = 0;
    while (total < size) {
        ssize_t n = pread(fd, buf, (size_t)request, (off_t)total);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        total += (uint64_t)n;
    }
    double t = ferry_now() - t0;
    close(fd);
    free(buf);
    if (total != size || t <= 0)
        return FERRY_EIO;
    return (double)total / t / 1e9;
}

/* ---- memory ---------------------------------------------------------------------------------- */

double limits_memcpy(uint64_t bytes)
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
        double t = ferry_now();
        memcpy(b, a, (size_t)bytes);
        t = ferry_now() - t;
        /* the copy is used, so it cannot be optimised away */
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

typedef struct touch_job {
    volatile unsigned char *base; /* set before the gate opens */
    uint64_t from, to, page;
    gate *start;                  /* NULL for the caller's own share */
    double t1;
} touch_job;

static void *touch_main(void *arg)
{
    touch_job *j = arg;
    if (j->start)
        gate_arrive(j->start);
    for (uint64_t off = j->from; j->base && off < j->to; off += j->page)
        j->base[off] = 1;
    j->t1 = ferry_now();
    return NULL;
}

/* As limits_fresh_memory; HUGE: the mapping starts on a 2 MiB boundary and asks for transparent
 * huge pages (each thread's share a whole number of them), as ferry's host buffers do. */
static double fresh_memory(uint64_t bytes, unsigned threads, int huge)
{
    if (bytes == 0)
        bytes = UINT64_C(256) << 20;
    if (bytes > SIZE_MAX || threads == 0 || threads > MAX_THREADS)
        return FERRY_EINVAL;
    const uint64_t huge_page = UINT64_C(2) << 20;
    uint64_t pg = page_size(), unit = huge ? huge_page : pg, units = (bytes + unit - 1) / unit;
    size_t len = (size_t)(units * unit), extra = huge ? (size_t)huge_page : 0;
    touch_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    gate start;
    gate_init(&start);
    memset(jobs, 0, sizeof jobs);
    for (unsigned i = 0; i < threads; i++) {
        jobs[i].from = units * i / threads * unit;
        jobs[i].to = units * (i + 1) / threads * unit;
        jobs[i].page = pg;
        jobs[i].start = i ? &start : NULL;
    }
    /* Threads 1.. are started before the clock and wait at the gate; the caller is thread 0. */
    unsigned started = 1;
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, touch_main, &jobs[started]) != 0)
            break;
    gate_await(&start, started - 1);
    double t0 = ferry_now();
    unsigned char *m = started == threads ? mmap(NULL, len + extra, PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                                          : MAP_FAILED;
    unsigned char *base = m;
    if (m != MAP_FAILED && huge) {
        base = m + (huge_page - (uintptr_t)m % huge_page) % huge_page;
#ifdef MADV_HUGEPAGE
        (void)madvise(base, len, MADV_HUGEPAGE);
#endif
    }
    for (unsigned i = 0; i < threads; i++)
        jobs[i].base = m == MAP_FAILED ? NULL : base; /* NULL: nothing to touch */
    gate_open(&start);
    touch_main(&jobs[0]);
    double t1 = jobs[0].t1;
    for (unsigned i = 1; i < started; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].t1 > t1)
            t1 = jobs[i].t1;
    }
    gate_destroy(&start);
    if (m == MAP_FAILED)
        return FERRY_ENOMEM;
    munmap(m, len + extra);
    return t1 > t0 ? (double)len / (t1 - t0) / 1e9 : FERRY_EIO;
}

double limits_fresh_memory(uint64_t bytes, unsigned threads)
{
    return fresh_memory(bytes, threads, 0);
}

double limits_fresh_huge_memory(uint64_t bytes, unsigned threads)
{
    return fresh_memory(bytes, threads, 1);
}

double limits_fresh_memory_best(uint64_t bytes, unsigned *best_threads)
{
    double best = 0;
    for (unsigned t = 1; t <= 2; t++) {
        double g = limits_fresh_memory(bytes, t);
        if (g < 0)
            return g;
        if (g > best) {
            best = g;
            if (best_threads)
                *best_threads = t;
        }
    }
    return best;
}

/* ---- resident read bandwidth ------------------------------------------------------------- */

typedef struct read_job {
    const uint64_t *w;
    uint64_t from, to;            /* words */
    gate *start;                  /* NULL for the caller's own share */
    uint64_t sum;
    double t1;
} read_job;

/* Pairs of words as GNU C vectors: SSE2's loads on x86-64 (a wider vector type than the base
 * ISA has would be split and sent through the stack). */
typedef uint64_t read_vec __attribute__((vector_size(16)));

static void *read_main(void *arg)
{
    read_job *j = arg;
    if (j->start)
        gate_arrive(j->start);
    /* eight independent sums of 2 words: the loop is bound by loads, not by an add's latency */
    read_vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
    uint64_t i = j->from;
    for (; i + 16 <= j->to; i += 16) {
        /* 4 KiB ahead (a no-op past the end): without it one thread's misses, not the memory,
         * bound the loop, and kernels that prefetch beat the "limit" */
        __builtin_prefetch(j->w + i + 512);
        __builtin_prefetch(j->w + i + 520);
        read_vec v0, v1, v2, v3, v4, v5, v6, v7;
        memcpy(&v0, j->w + i, 16);
        memcpy(&v1, j->w + i + 2, 16);
        memcpy(&v2, j->w + i + 4, 16);
        memcpy(&v3, j->w + i + 6, 16);
        memcpy(&v4, j->w + i + 8, 16);
        memcpy(&v5, j->w + i + 10, 16);
        memcpy(&v6, j->w + i + 12, 16);
        memcpy(&v7, j->w + i + 14, 16);
        s0 += v0;
        s1 += v1;
        s2 += v2;
        s3 += v3;
        s4 += v4;
        s5 += v5;
        s6 += v6;
        s7 += v7;
    }
    s0 += s1 + s2 + s3 + s4 + s5 + s6 + s7;
    uint64_t sum = s0[0] + s0[1];
    for (; i < j->to; i++)
        sum += j->w[i];
    j->sum = sum;
    j->t1 = ferry_now();
    return NULL;
}

static uint64_t default_read_bytes(void)
{
    long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    uint64_t b = llc > 0 ? 4 * (uint64_t)llc : 0;
    return b > (UINT64_C(256) << 20) ? b : UINT64_C(256) << 20;
}

/* A buffer of BYTES (0: the default) of words 0, 1, 2...: *WORDS receives their count. */
static uint64_t *read_buffer(uint64_t bytes, uint64_t *words)
{
    if (bytes == 0)
        bytes = default_read_bytes();
    if (bytes < 64 || bytes > SIZE_MAX)
        return NULL;
    *words = bytes / 8;
    uint64_t *w = malloc((size_t)(*words * 8));
    for (uint64_t i = 0; w && i < *words; i++)
        w[i] = i;
    return w;
}

/* The best of 3 timed passes of THREADS readers over W[0..WORDS). */
static double read_passes(const uint64_t *w, uint64_t words, unsigned threads)
{
    uint64_t want = words % 2 ? (words - 1) / 2 * words : words / 2 * (words - 1); /* mod 2^64 */
    double best = 0;
    for (int run = 0; run < 3 && best >= 0; run++) {
        read_job jobs[MAX_THREADS];
        pthread_t th[MAX_THREADS];
        gate start;
        gate_init(&start);
        memset(jobs, 0, sizeof jobs);
        for (unsigned i = 0; i < threads; i++) {
            /* shares of whole cache lines */
            jobs[i].w = w;
            jobs[i].from = words / 8 * i / threads * 8;
            jobs[i].to = i + 1 == threads ? words : words / 8 * (i + 1) / threads * 8;
            jobs[i].start = i ? &start : NULL;
        }
        unsigned started = 1;
        for (; started < threads; started++)
            if (pthread_create(&th[started], NULL, read_main, &jobs[started]) != 0)
                break;
        gate_await(&start, started - 1);
        double t0 = ferry_now();
        gate_open(&start);
        if (started == threads)
            read_main(&jobs[0]);
        double t1 = jobs[0].t1;
        uint64_t sum = jobs[0].sum;
        for (unsigned i = 1; i < started; i++) {
            pthread_join(th[i], NULL);
            t1 = jobs[i].t1 > t1 ? jobs[i].t1 : t1;
            sum += jobs[i].sum;
        }
        gate_destroy(&start);
        if (started != threads)
            best = FERRY_ENOMEM; /* a thread could not start */
        else if (sum != want)
            best = FERRY_EIO; /* the sums are checked, so the reads cannot be optimised away */
        else if (t1 > t0 && (double)(words * 8) / (t1 - t0) / 1e9 > best)
            best = (double)(words * 8) / (t1 - t0) / 1e9;
    }
    return best != 0 ? best : FERRY_EIO;
}

double limits_read_bandwidth(uint64_t bytes, unsigned threads)
{
    if (threads == 0 || threads > MAX_THREADS)
        return FERRY_EINVAL;
    uint64_t words = 0;
    uint64_t *w = read_buffer(bytes, &words);
    if (!w)
        return words ? FERRY_ENOMEM : FERRY_EINVAL;
    double g = read_passes(w, words, threads);
    free(w);
    return g;
}

double limits_read_bandwidth_best(uint64_t bytes, unsigned max_threads, unsigned *best_threads)
{
    if (max_threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        max_threads = c > 0 ? (unsigned)c : 1;
    }
    if (max_threads > MAX_THREADS)
        max_threads = MAX_THREADS;
    uint64_t words = 0;
    uint64_t *w = read_buffer(bytes, &words);
    if (!w)
        return words ? FERRY_ENOMEM : FERRY_EINVAL;
    double best = 0;
    for (unsigned t = 1; t <= max_threads; t++) {
        double g = read_passes(w, words, t);
        if (g < 0) {
            best = g;
            break;
        }
        if (g > best) {
            best = g;
            if (best_threads)
                *best_threads = t;
        }
    }
    free(w);
    return best;
}
