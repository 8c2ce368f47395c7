/*
 * bench_util.h — small helpers shared by the benchmark programs in bench/: a monotonic clock,
 * sample statistics (median, min, max) and page-cache control of a file. Header-only so each
 * bench program stays a single translation unit linked against the static library.
 *
 * The bench programs are run by hand (see bench/README.md); they are not ctest tests.
 */
#ifndef FERRY_BENCH_UTIL_H
#define FERRY_BENCH_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median / min / max of the N samples of V (V is reordered). N == 0 gives zeros. */
typedef struct bench_stat {
    double median, min, max;
    size_t n;
} bench_stat;

static inline bench_stat bench_summarize(double *v, size_t n)
{
    bench_stat s = {0, 0, 0, n};
    if (!n)
        return s;
    qsort(v, n, sizeof *v, bench_cmp_double);
    s.min = v[0];
    s.max = v[n - 1];
    s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return s;
}

/* Drops PATH's pages from the page cache (posix_fadvise DONTNEED on a fresh descriptor). Pages
 * mapped by live mappings of this process stay; callers unmap first. 0 or -1. */
static inline int bench_drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return r == 0 ? 0 : -1;
}

/* Fraction (0..1) of PATH's pages resident in the page cache (mincore over a mapping), or -1. */
static inline double bench_cached_fraction(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    long pg = sysconf(_SC_PAGESIZE);
    size_t pages = (size + (size_t)pg - 1) / (size_t)pg, resident = 0;
    unsigned char vec[4096];
    for (size_t done = 0; done < pages;) {
        size_t k = pages - done < sizeof vec ? pages - done : sizeof vec;
        if (mincore((unsigned char *)m + done * (size_t)pg, k * (size_t)pg, vec) != 0) {
            munmap(m, size);
            return -1;
        }
        for (size_t i = 0; i < k; i++)
            resident += vec[i] & 1;
        done += k;
    }
    munmap(m, size);
    return (double)resident / (double)pages;
}

/* Brings PATH fully into the page cache by reading it (buffered, 8 MiB at a time). 0 or -1. */
static inline int bench_warm_file(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t cap = (size_t)8 << 20;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return -1;
    }
    ssize_t n;
    while ((n = read(fd, buf, cap)) > 0)
        ;
    free(buf);
    close(fd);
    return n == 0 ? 0 : -1;
}

#endif
