/*
 * busy_read.c — whether the disk reads as fast while the CPUs compute: the O_DIRECT read of a
 * file (limits_direct_read, the limit `ferry bench` uses) alone, then while THREADS threads keep
 * the CPUs busy, alternating, RUNS times each. The busy threads either spin on arithmetic (no
 * memory traffic) or sum a resident buffer of 256 MiB over and over (a decode pass's load). On a
 * machine whose disk is served by other cores the two reads agree; on a virtual machine whose
 * disk is emulated on the cores its CPUs run on, the busy read is slower, and a stream whose
 * compute overlaps its reads cannot reach the read alone. The other side is measured too: the
 * busy threads' own rate (bytes summed, or steps spun) while the read runs, against their rate
 * alone over a window as long as the read alone took.
 *
 * usage: busy_read FILE [--readers R] [--request SIZE] [--threads T] [--runs N] [--memory]
 *        (defaults 2, 16MiB, the online CPUs, 3; --memory: the threads read memory)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry.h"
#include "limits.h"

#include "bench_util.h"

#define MAX_BUSY 64
#define BUSY_WORDS ((UINT64_C(256) << 20) / 8)

typedef struct busy {
    atomic_int *stop;
    const uint64_t *w; /* NULL: spin */
    uint64_t from, to;
    uint64_t sink;
    _Atomic uint64_t done; /* bytes summed, or 64 Ki steps spun */
} busy;

static void *busy_main(void *arg)
{
    busy *b = arg;
    uint64_t acc = 1;
    while (!atomic_load_explicit(b->stop, memory_order_relaxed)) {
        if (b->w) {
            /* in steps of 1 MiB, so that the work done in a window can be read */
            for (uint64_t i = b->from; i < b->to; i += 1 << 17) {
                uint64_t end = i + (1 << 17) < b->to ? i + (1 << 17) : b->to;
                for (uint64_t k = i; k < end; k++)
                    acc += b->w[k];
                atomic_fetch_add_explicit(&b->done, (end - i) * 8, memory_order_relaxed);
            }
        } else {
            for (int i = 0; i < 1 << 16; i++)
                acc = acc * 6364136223846793005u + 1442695040888963407u;
            atomic_fetch_add_explicit(&b->done, 1, memory_order_relaxed);
        }
    }
    b->sink = acc;
    return NULL;
}

static int parse_u(const char *s, unsigned *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end || v == 0 || v > 1024)
        return -1;
    *out = (unsigned)v;
    return 0;
}

static uint64_t busy_done(busy *b, unsigned n)
{
    uint64_t d = 0;
    for (unsigned i = 0; i < n; i++)
        d += atomic_load_explicit(&b[i].done, memory_order_relaxed);
    return d;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0 ? (uint64_t)st.st_size : 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    unsigned readers = 2, runs = 3, threads = 0;
    uint64_t request = UINT64_C(16) << 20;
    int memory = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--readers") == 0 && v)
            bad = parse_u(v, &readers), i++;
        else if (strcmp(a, "--runs") == 0 && v)
            bad = parse_u(v, &runs), i++;
        else if (strcmp(a, "--threads") == 0 && v)
            bad = parse_u(v, &threads), i++;
        else if (strcmp(a, "--request") == 0 && v)
            bad = ferry_parse_size(v, &request) != 0 || request == 0, i++;
        else if (strcmp(a, "--memory") == 0)
            memory = 1;
        else if (a[0] != '-' && !path)
            path = a;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "usage: busy_read FILE [--readers R] [--request SIZE] [--threads T] "
                            "[--runs N] [--memory]\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "busy_read: no file given\n");
        return 2;
    }
    if (!threads) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (unsigned)c : 1;
    }
    if (threads > MAX_BUSY)
        threads = MAX_BUSY;
    if (runs > 100)
        runs = 100;
    uint64_t *w = NULL;
    if (memory) {
        w = malloc(BUSY_WORDS * 8);
        if (!w) {
            fprintf(stderr, "busy_read: out of memory\n");
            return 1;
        }
        for (uint64_t i = 0; i < BUSY_WORDS; i++)
            w[i] = i;
    }
    double alone[100], busy_gbps[100], work_alone[100], work_busy[100];
    uint64_t size = file_size(path);
    int rc = 0;
    for (unsigned r = 0; r < runs && !rc; r++) {
        alone[r] = limits_direct_read(path, readers, request);
        atomic_int stop;
        atomic_init(&stop, 0);
        busy b[MAX_BUSY];
        pthread_t th[MAX_BUSY];
        unsigned started = 0;
        for (; started < threads; started++) {
            b[started] = (busy){&stop, w, BUSY_WORDS * started / threads,
                                BUSY_WORDS * (started + 1) / threads, 0, 0};
            if (pthread_create(&th[started], NULL, busy_main, &b[started]) != 0)
                break;
        }
        /* the threads' own rate, alone for about as long as the read took, then during a read */
        double w0 = bench_now(), window = alone[r] > 0 ? (double)size / (alone[r] * 1e9) : 0.5;
        uint64_t d0 = busy_done(b, started);
        while (bench_now() - w0 < window)
            usleep(1000);
        double w1 = bench_now();
        uint64_t d1 = busy_done(b, started);
        busy_gbps[r] = started == threads ? limits_direct_read(path, readers, request) : -1;
        double w2 = bench_now();
        uint64_t d2 = busy_done(b, started);
        work_alone[r] = (double)(d1 - d0) / (w1 - w0);
        work_busy[r] = (double)(d2 - d1) / (w2 - w1);
        atomic_store(&stop, 1);
        for (unsigned i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        if (alone[r] <= 0 || busy_gbps[r] <= 0) {
            fprintf(stderr, "busy_read: %s: O_DIRECT read failed (%s)\n", path,
                    alone[r] <= 0 ? ferry_strerror((int)alone[r]) : "threads or read");
            rc = 1;
        } else {
            printf("run %u: alone %.2f GB/s, with %u %s thread%s %.2f GB/s (%.2f); the threads "
                   "during the read at %.2f of their rate alone\n", r + 1, alone[r], threads,
                   memory ? "memory-reading" : "spinning", threads == 1 ? "" : "s",
                   busy_gbps[r], busy_gbps[r] / alone[r],
                   work_alone[r] > 0 ? work_busy[r] / work_alone[r] : 0.0);
        }
    }
    if (!rc) {
        bench_stat a = bench_summarize(alone, runs), b = bench_summarize(busy_gbps, runs);
        double ratio[100];
        for (unsigned r = 0; r < runs; r++)
            ratio[r] = work_alone[r] > 0 ? work_busy[r] / work_alone[r] : 0;
        bench_stat c = bench_summarize(ratio, runs);
        printf("median: alone %.2f GB/s, busy %.2f GB/s: %.2f (%u reader%s x %llu MiB); the "
               "threads' rate while reading: %.2f of alone%s\n",
               a.median, b.median, a.median > 0 ? b.median / a.median : 0.0, readers,
               readers == 1 ? "" : "s", (unsigned long long)(request >> 20), c.median,
               memory ? "" : " (spinning)");
    }
    free(w);
    return rc;
}
