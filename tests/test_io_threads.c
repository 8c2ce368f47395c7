/*
 * test_io_threads.c — the I/O worker pool: many requests of mixed sizes and modes in flight at
 * once, every byte checked; done called exactly once per request, on a worker thread; progress;
 * bytes_read; cancellation (deterministic with one worker, racing with four); destroy with work
 * queued; the same with half the requests relayed (the relay readers' queue beside the
 * workers'); requests refused at submit; read errors reported through done, with their detail in
 * errmsg. Everything runs once per backend (FERRY_IO_BACKEND=threads, then uring: io_uring where
 * the build and the kernel allow it, else the same threads again).
 * Runs under TSan too ("thread" in the name).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* check.h's check_tmpdir trips -Wformat-truncation at -O2 when inlined here */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "check.h"
#include "xorshift.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include "io/io.h"
#include "io/io_internal.h"

#define MIB (UINT64_C(1) << 20)
#define FILE_SIZE (40 * MIB + 777)

static unsigned char pattern_at(uint64_t i)
{
    uint64_t x = (i + 1) * UINT64_C(0x9E3779B97F4A7C15);
    return (unsigned char)(x >> 56 ^ x >> 29);
}

static unsigned char *pattern;
static pthread_t main_thread;

/* The test's own completion bookkeeping, under its own lock. */
typedef struct tracker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int completed;
    /* progress */
    uint64_t last_done, last_total;
    int progress_calls, progress_backwards;
} tracker;

typedef struct job {
    ferry__ioreq req;
    tracker *t;
    void *base;      /* allocation holding dst */
    int calls;       /* done calls seen (must end at 1) */
    int status;
    int on_main;     /* done ran on the submitting thread (must not) */
} job;

static void job_done(void *ud, int status)
{
    job *j = ud;
    pthread_mutex_lock(&j->t->mu);
    j->calls++;
    j->status = status;
    j->on_main |= pthread_equal(pthread_self(), main_thread);
    j->t->completed++;
    pthread_cond_broadcast(&j->t->cv);
    pthread_mutex_unlock(&j->t->mu);
}

static void on_progress(void *ud, uint64_t done, uint64_t total)
{
    tracker *t = ud;
    pthread_mutex_lock(&t->mu);
    if (done < t->last_done || done > total)
        t->progress_backwards++;
    t->last_done = done;
    t->last_total = total;
    t->progress_calls++;
    pthread_mutex_unlock(&t->mu);
}

static void tracker_init(tracker *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}

static void tracker_wait(tracker *t, int n)
{
    pthread_mutex_lock(&t->mu);
    while (t->completed < n)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

static void tracker_free(tracker *t)
{
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

static uint64_t rng_state = 0x1234567;
static uint64_t rnd(uint64_t n)
{
    return n ? xorshift_next(&rng_state) % n : 0;
}

/* Fills J for [off, off+len) in MODE, with dst congruent to the offset (direct path) or not. */
static int job_init(job *j, tracker *t, const ferry__iofile *f, uint64_t off, uint64_t len,
                    ferry_load mode, int congruent)
{
    memset(j, 0, sizeof *j);
    uint64_t shift = off % FERRY__IO_ALIGN;
    if (!congruent)
        shift = (shift + 3) % FERRY__IO_ALIGN;
    if (posix_memalign(&j->base, FERRY__IO_ALIGN, (size_t)(len + shift + 1)) != 0)
        return -1;
    memset(j->base, 0x5A, (size_t)(len + shift + 1));
    j->t = t;
    j->status = 1; /* not a status: proves done wrote it */
    j->req.file = f;
    j->req.offset = off;
    j->req.len = len;
    j->req.dst = (unsigned char *)j->base + shift;
    j->req.mode = mode;
    j->req.done = job_done;
    j->req.ud = j;
    return 0;
}

static int job_data_ok(const job *j)
{
    const unsigned char *d = j->req.dst;
    return memcmp(d, pattern + j->req.offset, (size_t)j->req.len) == 0 && d[j->req.len] == 0x5A;
}

/* ~50 requests of mixed sizes and modes on 4 workers, with RELAY every other one relayed (the
 * relay readers' queue and the workers' served at once); every byte checked. */
static void test_mixed(const ferry__iofile *f, int relay)
{
    enum { N = 50 };
    job *jobs = calloc(N, sizeof *jobs);
    tracker t;
    tracker_init(&t);
    ferry__io *io = ferry__io_create(4);
    CHECK(io != NULL);
    ferry__io_set_progress(io, on_progress, &t);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        static const uint64_t sizes[] = {0,       1,           4095,   4096,
                                         100000,  MIB + 7,     2 * MIB + 1, 5 * MIB,
                                         17 * MIB + 3};
        uint64_t len = sizes[rnd(FERRY__ARRAY_LEN(sizes))];
        if (i == 0)
            len = FILE_SIZE; /* the whole file, several chunks in parallel */
        uint64_t off = rnd(FILE_SIZE - len + 1);
        if (i % 5 == 0)
            off -= off % FERRY__IO_ALIGN;
        if (i == 1) {
            len = 3 * MIB + 5;
            off = FILE_SIZE - len; /* ending exactly at the end */
        }
        CHECK(job_init(&jobs[i], &t, f, off, len, (ferry_load)(i % 4), i % 3 != 0) == 0);
        jobs[i].req.relay = relay && i % 2;
        total += len;
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(ferry__io_submit(io, &jobs[i].req), 0);
    tracker_wait(&t, N);
    /* the relay readers' slots exist exactly when a request was relayed (a direct one, of a
     * file that allows O_DIRECT) */
    CHECK_EQ_INT(ferry__io_relay_bytes(io),
                 relay && f->fd_direct >= 0 ? FERRY__IO_RELAY_READERS * FERRY__IO_RELAY_PIECE : 0);
    int bad = 0, calls = 0, on_main = 0;
    pthread_mutex_lock(&t.mu);
    for (int i = 0; i < N; i++) {
        calls += jobs[i].calls == 1;
        bad += jobs[i].status != 0 || !job_data_ok(&jobs[i]);
        on_main += jobs[i].on_main;
    }
    pthread_mutex_unlock(&t.mu);
    CHECK_EQ_INT(calls, N);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(on_main, 0);
    CHECK_EQ_INT(ferry__io_bytes_read(io), total);
    ferry__io_destroy(io);
    /* after destroy no worker runs: the tracker can be read without racing */
    CHECK(t.progress_calls > N / 2);
    CHECK_EQ_INT(t.progress_backwards, 0);
    CHECK_EQ_INT(t.last_done, total);
    CHECK_EQ_INT(t.last_total, total);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(jobs[i].calls, 1); /* still exactly once after destroy */
        free(jobs[i].base);
    }
    tracker_free(&t);
    free(jobs);
}

/* Deterministic cancellation on one worker: the first request's done callback holds the worker
 * until everything else is queued; the first progress report after that cancels from inside the
 * pool. By then the worker has taken exactly ferry__io_depth chunks in queue order (1 with
 * threads, the ring depth with io_uring): those are read to the end, everything after them is
 * dropped, and a request with a dropped chunk completes with FERRY_ECANCELED. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
    ferry__io *io;
    uint64_t cancel_after; /* progress beyond this many bytes cancels everything */
    int cancelled;
} gate;

static gate g;

static void gate_done(void *ud, int status)
{
    pthread_mutex_lock(&g.mu);
    g.entered = 1;
    pthread_cond_broadcast(&g.cv);
    while (!g.open)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    job_done(ud, status);
}

static void gate_progress(void *ud, uint64_t done, uint64_t total)
{
    (void)ud;
    (void)total;
    if (done > g.cancel_after && !g.cancelled) {
        g.cancelled = 1; /* progress calls are serialised */
        ferry__io_cancel_all(g.io); /* from a worker: cancels without waiting */
    }
}

static void test_cancel_deterministic(const ferry__iofile *f)
{
    enum { N = 12 };
    job jobs[N];
    tracker t;
    tracker_init(&t);
    memset(&g, 0, sizeof g);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    ferry__io *io = ferry__io_create(1);
    CHECK(io != NULL);
    g.io = io;
    g.cancel_after = 1;
    ferry__io_set_progress(io, gate_progress, NULL);
    const unsigned depth = ferry__io_depth(io);

    CHECK(job_init(&jobs[0], &t, f, 7, 1, FERRY_LOAD_READ, 1) == 0);
    jobs[0].req.done = gate_done;
    CHECK(job_init(&jobs[1], &t, f, 0, 40 * MIB, FERRY_LOAD_DIRECT, 1) == 0);
    /* READ and DIRECT only: a copy chunk (mmap, auto on cached data) finishes as soon as it is
     * taken, so the cancel would come before the worker has taken DEPTH chunks */
    for (int i = 2; i < N; i++)
        CHECK(job_init(&jobs[i], &t, f, (uint64_t)i * MIB + (uint64_t)i, 2 * MIB,
                       i % 2 ? FERRY_LOAD_READ : FERRY_LOAD_DIRECT, i % 3 != 0) == 0);
    /* the worker is held in job 0's callback before anything else is queued */
    CHECK_EQ_INT(ferry__io_submit(io, &jobs[0].req), 0);
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    for (int i = 1; i < N; i++)
        CHECK_EQ_INT(ferry__io_submit(io, &jobs[i].req), 0);
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    tracker_wait(&t, N);

    /* the chunks of jobs 1..N-1 in queue order: job 1 has three (16, 16, 8 MiB), the rest one */
    uint64_t taken_bytes[N] = {0}, expect_read = 1;
    for (unsigned k = 0; k < depth && k < 3 + (N - 2); k++) {
        int j = k < 3 ? 1 : 2 + (int)(k - 3);
        uint64_t len = k < 3 ? (k < 2 ? 16 * MIB : 8 * MIB) : 2 * MIB;
        taken_bytes[j] += len;
        expect_read += len;
    }
    fprintf(stderr, "deterministic cancel (%s, depth %u): %llu bytes read\n",
            ferry__io_backend(io), depth, (unsigned long long)expect_read);

    pthread_mutex_lock(&t.mu);
    CHECK_EQ_INT(jobs[0].status, 0);
    CHECK(job_data_ok(&jobs[0]));
    int bad = 0, calls = 0, on_main = 0;
    for (int i = 1; i < N; i++) {
        const job *j = &jobs[i];
        const unsigned char *d = j->req.dst;
        int bad0 = bad;
        if (taken_bytes[i] == j->req.len) { /* every chunk taken: read in full */
            bad += j->status != 0 || !job_data_ok(j) || j->req.errmsg[0] != 0;
        } else {
            /* what was taken is there, the first byte not taken is untouched */
            bad += j->status != FERRY_ECANCELED;
            bad += memcmp(d, pattern + j->req.offset, (size_t)taken_bytes[i]) != 0;
            bad += d[taken_bytes[i]] != 0x5A;
            bad += strstr(j->req.errmsg, "cancelled") == NULL;
            bad += strstr(j->req.errmsg, f->path) == NULL;
        }
        if (bad > bad0)
            fprintf(stderr, "job %d: status %d, %llu bytes taken, errmsg '%s'\n", i, j->status,
                    (unsigned long long)taken_bytes[i], j->req.errmsg);
    }
    for (int i = 0; i < N; i++) {
        calls += jobs[i].calls == 1;
        on_main += jobs[i].on_main;
    }
    pthread_mutex_unlock(&t.mu);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(calls, N);
    CHECK_EQ_INT(on_main, 0);
    CHECK_EQ_INT(ferry__io_bytes_read(io), expect_read);
    if (depth == 1) /* the thread backend: one 16 MiB chunk of job 1 and nothing else */
        CHECK_EQ_INT(expect_read, 1 + 16 * MIB);

    /* the pool still works after a cancel */
    job again;
    CHECK(job_init(&again, &t, f, 123, 3 * MIB, FERRY_LOAD_AUTO, 1) == 0);
    CHECK_EQ_INT(ferry__io_submit(io, &again.req), 0);
    tracker_wait(&t, N + 1);
    ferry__io_destroy(io);
    CHECK_EQ_INT(again.calls, 1);
    CHECK_EQ_INT(again.status, 0);
    CHECK(job_data_ok(&again));
    free(again.base);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(jobs[i].calls, 1);
        free(jobs[i].base);
    }
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    tracker_free(&t);
}

/* cancel_all (from the test thread) and destroy while requests are in flight on 4 workers, with
 * RELAY every other one relayed (and those cancelled one by one first, ferry__io_cancel_req, when
 * not destroying): each request completes exactly once, with 0 (and its data right) or
 * FERRY_ECANCELED, by the time the call returns. */
static void test_cancel_racing(const ferry__iofile *f, int destroy, int relay)
{
    enum { N = 24 };
    job *jobs = calloc(N, sizeof *jobs);
    tracker t;
    tracker_init(&t);
    ferry__io *io = ferry__io_create(4);
    CHECK(io != NULL);
    for (int i = 0; i < N; i++) {
        uint64_t len = (i % 4 == 0) ? 17 * MIB + 11 : MIB + (uint64_t)i * 1000;
        uint64_t off = rnd(FILE_SIZE - len + 1);
        CHECK(job_init(&jobs[i], &t, f, off, len, (ferry_load)(i % 4), i % 2) == 0);
        jobs[i].req.relay = relay && i % 2;
    }
    /* cold reads take long enough for the cancel to find work queued (when the drop works) */
    ferry__iofile_drop_cache(f);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(ferry__io_submit(io, &jobs[i].req), 0);
    if (destroy) {
        ferry__io_destroy(io);
        io = NULL;
    } else {
        for (int i = 1; relay && i < N; i += 2)
            ferry__io_cancel_req(io, &jobs[i].req);
        ferry__io_cancel_all(io);
    }
    /* no waiting: everything must be complete already */
    int once = 0, ok = 0, cancelled = 0;
    pthread_mutex_lock(&t.mu);
    CHECK_EQ_INT(t.completed, N);
    for (int i = 0; i < N; i++) {
        once += jobs[i].calls == 1;
        if (jobs[i].status == 0)
            ok += job_data_ok(&jobs[i]);
        else
            cancelled += jobs[i].status == FERRY_ECANCELED;
    }
    pthread_mutex_unlock(&t.mu);
    fprintf(stderr, "%s while in flight%s: %d completed, %d cancelled\n",
            destroy ? "destroy" : "cancel_all", relay ? " (half relayed)" : "", ok, cancelled);
    CHECK_EQ_INT(once, N);
    CHECK_EQ_INT(ok + cancelled, N);
    if (io) {
        /* and the pool is usable afterwards */
        job again;
        CHECK(job_init(&again, &t, f, 0, 2 * MIB, FERRY_LOAD_MMAP, 1) == 0);
        CHECK_EQ_INT(ferry__io_submit(io, &again.req), 0);
        tracker_wait(&t, N + 1);
        ferry__io_destroy(io);
        CHECK_EQ_INT(again.status, 0);
        CHECK(job_data_ok(&again));
        free(again.base);
    }
    for (int i = 0; i < N; i++)
        free(jobs[i].base);
    tracker_free(&t);
    free(jobs);
}

/* Refused at submit (no callback), empty requests, read errors through done. */
static void test_submit_errors(const ferry__iofile *f, const char *dir)
{
    tracker t;
    tracker_init(&t);
    ferry__io *io = ferry__io_create(0);
    CHECK(io != NULL);
    job j;
    CHECK(job_init(&j, &t, f, FILE_SIZE - 10, 11, FERRY_LOAD_READ, 1) == 0);
    CHECK_EQ_INT(ferry__io_submit(io, &j.req), FERRY_EIO);
    CHECK(strstr(j.req.errmsg, f->path) != NULL);
    CHECK(strstr(j.req.errmsg, "past the end") != NULL);
    j.req.offset = UINT64_MAX;
    CHECK_EQ_INT(ferry__io_submit(io, &j.req), FERRY_EIO);
    j.req.offset = 0;
    j.req.done = NULL;
    CHECK_EQ_INT(ferry__io_submit(io, &j.req), FERRY_EINVAL);
    j.req.done = job_done;
    j.req.mode = (ferry_load)9;
    CHECK_EQ_INT(ferry__io_submit(io, &j.req), FERRY_EINVAL);
    CHECK_EQ_INT(ferry__io_submit(NULL, &j.req), FERRY_EINVAL);
    usleep(1000);
    pthread_mutex_lock(&t.mu);
    CHECK_EQ_INT(j.calls, 0);
    pthread_mutex_unlock(&t.mu);
    free(j.base);

    /* empty request: done(0) on a worker */
    CHECK(job_init(&j, &t, f, FILE_SIZE, 0, FERRY_LOAD_DIRECT, 1) == 0);
    CHECK_EQ_INT(ferry__io_submit(io, &j.req), 0);
    tracker_wait(&t, 1);
    pthread_mutex_lock(&t.mu);
    CHECK_EQ_INT(j.calls, 1);
    CHECK_EQ_INT(j.status, 0);
    CHECK_EQ_INT(j.on_main, 0);
    pthread_mutex_unlock(&t.mu);
    free(j.base);

    /* a file that shrinks after open: READ and DIRECT report FERRY_EIO through done */
    char path[4200];
    snprintf(path, sizeof path, "%s/shrink.bin", dir);
    CHECK(check_write_file(path, pattern, 20 * MIB) == 0);
    ferry__iofile s;
    ferry__err e = {0};
    CHECK_EQ_INT(ferry__iofile_open(path, &s, &e), 0);
    CHECK(truncate(path, 2 * MIB) == 0);
    job k[2];
    CHECK(job_init(&k[0], &t, &s, 0, 20 * MIB, FERRY_LOAD_READ, 1) == 0);
    CHECK(job_init(&k[1], &t, &s, 4096, 19 * MIB, FERRY_LOAD_DIRECT, 1) == 0);
    CHECK_EQ_INT(ferry__io_submit(io, &k[0].req), 0);
    CHECK_EQ_INT(ferry__io_submit(io, &k[1].req), 0);
    tracker_wait(&t, 3);
    ferry__io_destroy(io);
    CHECK_EQ_INT(k[0].calls, 1);
    CHECK_EQ_INT(k[0].status, FERRY_EIO);
    CHECK_EQ_INT(k[1].calls, 1);
    CHECK_EQ_INT(k[1].status, FERRY_EIO);
    CHECK(memcmp(k[0].req.dst, pattern, 2 * MIB) == 0); /* what was there was read */
    /* the detail of the chunk that failed first (either one: both meet the new end) */
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "shrunk, %s: %s\n", i ? "direct" : "read", k[i].req.errmsg);
        CHECK(strstr(k[i].req.errmsg, path) != NULL);
        CHECK(strstr(k[i].req.errmsg, "end of file at offset ") != NULL);
    }
    free(k[0].base);
    free(k[1].base);
    ferry__iofile_close(&s);

    /* a read that fails with an errno: the descriptors replaced by a directory's (EISDIR) */
    io = ferry__io_create(2);
    CHECK(io != NULL);
    ferry__iofile bad = *f;
    bad.fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    bad.fd_direct = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(bad.fd >= 0 && bad.fd_direct >= 0);
    const ferry_load modes[] = {FERRY_LOAD_READ, FERRY_LOAD_DIRECT};
    for (int i = 0; i < 2; i++) {
        /* one chunk, so that the message is known exactly */
        CHECK(job_init(&k[i], &t, &bad, 4096, 3 * MIB, modes[i], 1) == 0);
        CHECK_EQ_INT(ferry__io_submit(io, &k[i].req), 0);
    }
    tracker_wait(&t, 5);
    ferry__io_destroy(io);
    char want[2][4400];
    for (int i = 0; i < 2; i++)
        snprintf(want[i], sizeof want[i], "%s: %sread of %llu bytes at offset 4096 failed: %s",
                 f->path, i ? "direct " : "", (unsigned long long)(3 * MIB), strerror(EISDIR));
    for (int i = 0; i < 2; i++) {
        fprintf(stderr, "EISDIR, %s: %s\n", i ? "direct" : "read", k[i].req.errmsg);
        CHECK_EQ_INT(k[i].calls, 1);
        CHECK_EQ_INT(k[i].status, FERRY_EIO);
        CHECK_STR(k[i].req.errmsg, want[i]);
        free(k[i].base);
    }
    close(bad.fd);
    close(bad.fd_direct);
    tracker_free(&t);

    ferry__io_destroy(NULL);
    ferry__io_cancel_all(NULL);
}

int main(void)
{
    main_thread = pthread_self();
    const char *dir = check_tmpdir("io_threads");
    char path[4200];
    snprintf(path, sizeof path, "%s/pattern.bin", dir);
    pattern = malloc(FILE_SIZE);
    if (!pattern)
        return 2;
    for (uint64_t i = 0; i < FILE_SIZE; i++)
        pattern[i] = pattern_at(i);
    CHECK(check_write_file(path, pattern, FILE_SIZE) == 0);
    ferry__iofile f;
    ferry__err e = {0};
    CHECK_EQ_INT(ferry__iofile_open(path, &f, &e), 0);

    /* the default: io_uring where it works */
    unsetenv("FERRY_IO_BACKEND");
    ferry__io *io = ferry__io_create(2);
    CHECK(io != NULL);
    const char *uring = ferry__io_uring_usable() ? "uring" : "threads";
    CHECK_STR(ferry__io_backend(io), uring);
    ferry__io_destroy(io);
    if (!ferry__io_uring_usable())
        fprintf(stderr, "note: no io_uring here (not built with liburing, or refused by the "
                        "kernel): both passes use threads\n");

    const char *backends[][2] = {{"threads", "threads"}, {"uring", uring}};
    for (size_t b = 0; b < FERRY__ARRAY_LEN(backends); b++) {
        setenv("FERRY_IO_BACKEND", backends[b][0], 1);
        io = ferry__io_create(3);
        CHECK(io != NULL);
        CHECK_STR(ferry__io_backend(io), backends[b][1]);
        CHECK_EQ_INT(ferry__io_depth(io), strcmp(backends[b][1], "uring") ? 1
                                                                        : FERRY__IO_URING_DEPTH);
        ferry__io_destroy(io);
        fprintf(stderr, "---- FERRY_IO_BACKEND=%s: %s\n", backends[b][0], backends[b][1]);
        for (int relay = 0; relay < 2; relay++) {
            test_mixed(&f, relay);
            test_cancel_racing(&f, 0, relay);
            test_cancel_racing(&f, 1, relay);
        }
        test_cancel_deterministic(&f);
        test_submit_errors(&f, dir);
    }
    unsetenv("FERRY_IO_BACKEND");

    ferry__iofile_close(&f);
    free(pattern);
    check_rmdir(dir);
    return check_finish();
}
