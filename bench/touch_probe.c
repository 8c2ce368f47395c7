/*
 * touch_probe.c — how fast fresh anonymous memory can be made usable on this machine, by the
 * ways a loader could get it: one thread writing a byte per page (what limits_fresh_memory in
 * tools/common/limits.c measures with one thread; the limit takes the best of 1 and 2), several
 * threads doing that on disjoint slices, MAP_POPULATE, MADV_HUGEPAGE before the
 * touches (transparent huge pages are "madvise" on these machines), and glibc malloc + memset.
 * Also a buffer reused after a first touch (what a pool gives) for comparison.
 *
 * The cold-load target is min(direct read, first touch): when a loader beats the one-thread
 * first-touch number, this shows whether the limit or the loader is the odd one out, and which
 * allocation strategy ferry's host buffers should use.
 *
 * --rest SECONDS sleeps before each measurement, holding no memory: a VM that reports free memory
 * to its host (free page reporting) takes back what the measurement before freed, and a fresh
 * huge page is then one the host must give again; without it, each way reuses the pages the one
 * before freed.
 *
 * usage: touch_probe [--size SIZE] [--runs N] [--rest SECONDS]   (default 1GiB, 3, 0; medians)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#include "bench_util.h"

static volatile unsigned char sink;

typedef struct slice {
    unsigned char *p;
    size_t n;
    long page;
} slice;

static void *touch_slice(void *arg)
{
    slice *s = arg;
    for (size_t off = 0; off < s->n; off += (size_t)s->page)
        s->p[off] = 1;
    return NULL;
}

static void touch_threads(unsigned char *p, size_t n, unsigned threads, long page)
{
    pthread_t th[16];
    slice sl[16];
    size_t per = (n / threads + (size_t)page - 1) / (size_t)page * (size_t)page;
    unsigned started = 0;
    for (unsigned i = 0; i < threads; i++) {
        size_t off = (size_t)i * per;
        sl[i].p = p + (off < n ? off : n);
        sl[i].n = off < n ? (n - off < per ? n - off : per) : 0;
        sl[i].page = page;
        if (i == 0 || pthread_create(&th[i], NULL, touch_slice, &sl[i]) != 0)
            continue;
        started |= 1u << i;
    }
    touch_slice(&sl[0]);
    for (unsigned i = 1; i < threads; i++)
        if (started & (1u << i))
            pthread_join(th[i], NULL);
        else
            touch_slice(&sl[i]);
}

enum { T_ONE, T_TWO, T_FOUR, T_HUGE, T_HUGE_TWO, T_POPULATE, T_MALLOC_MEMSET, T_REUSED, T_COUNT };
static const char *tname[T_COUNT] = {"1 thread", "2 threads", "4 threads", "MADV_HUGEPAGE 1 thr",
                                     "MADV_HUGEPAGE 2 thr", "MAP_POPULATE", "malloc+memset",
                                     "reused (pool)"};

static double one(int how, size_t n, long page)
{
    if (how == T_MALLOC_MEMSET) {
        double t0 = bench_now();
        unsigned char *p = malloc(n);
        if (!p)
            return -1;
        memset(p, 1, n);
        double t = bench_now() - t0;
        sink ^= ((volatile unsigned char *)p)[n / 2]; /* keeps the memset */
        free(p);
        return (double)n / t / 1e9;
    }
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (how == T_POPULATE ? MAP_POPULATE : 0);
    double t0 = bench_now();
    unsigned char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    if (how == T_HUGE || how == T_HUGE_TWO)
        (void)madvise(p, n, MADV_HUGEPAGE);
    if (how == T_REUSED) {
        touch_threads(p, n, 1, page); /* the pool's first use, untimed */
        t0 = bench_now();
    }
    unsigned threads = how == T_TWO || how == T_HUGE_TWO ? 2 : how == T_FOUR ? 4 : 1;
    if (how != T_POPULATE)
        touch_threads(p, n, threads, page);
    double t = bench_now() - t0;
    munmap(p, n);
    return (double)n / t / 1e9;
}

int main(int argc, char **argv)
{
    uint64_t size = UINT64_C(1) << 30;
    unsigned runs = 3, rest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            if (ferry_parse_size(argv[++i], &size) || size == 0)
                return 2;
        } else if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--rest") && i + 1 < argc) {
            rest = (unsigned)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: touch_probe [--size SIZE] [--runs N] [--rest SECONDS]\n");
            return 2;
        }
    }
    if (runs == 0 || runs > 32)
        runs = 3;
    long page = sysconf(_SC_PAGESIZE);
    double v[T_COUNT][32];
    /* the ways alternate within each run */
    for (unsigned r = 0; r < runs; r++)
        for (int k = 0; k < T_COUNT; k++) {
            if (rest) {
                struct timespec ts = {(time_t)(rest > 60 ? 60 : rest), 0};
                nanosleep(&ts, NULL);
            }
            if ((v[k][r] = one(k, (size_t)size, page)) < 0) {
                fprintf(stderr, "touch_probe: %s failed\n", tname[k]);
                return 2;
            }
        }
    char sz[32];
    printf("touch_probe: %s of fresh anonymous memory, %u run(s), %u s of rest before each\n",
           ferry_format_size(size, sz), runs, rest);
    for (int k = 0; k < T_COUNT; k++) {
        bench_stat s = bench_summarize(v[k], runs);
        printf("  %-22s median %7.3f GB/s   min %7.3f   max %7.3f\n", tname[k], s.median, s.min,
               s.max);
    }
    return 0;
}
