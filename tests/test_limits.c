/*
 * test_limits.c — the machine-limit probes of `ferry bench` and `ferry demo` (tools/common/
 * limits.c, in ferry_tools): each returns a positive rate on a real file and memory, and
 * a negative error code on a missing file or a folder.
 */
#include <math.h>

#include "check.h"
#include "ferry.h"
#include "ferry_tools.h"

int main(void)
{
    const char *dir = check_tmpdir("limits");
    char path[1200], missing[1200];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    snprintf(missing, sizeof missing, "%s/missing.bin", dir);
    size_t n = 24u << 20;
    unsigned char *buf = malloc(n);
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)(i * 31 + 7);
    CHECK(check_write_file(path, buf, n) == 0);
    free(buf);
    double g = limits_memcpy(8u << 20);
    fprintf(stderr, "memcpy %.2f GB/s\n", g);
    CHECK(g > 0);
    g = limits_fresh_memory(8u << 20, 2);
    fprintf(stderr, "fresh memory %.2f GB/s\n", g);
    CHECK(g > 0);
    g = limits_fresh_huge_memory((3u << 20) + 1, 2); /* two 2 MiB pages, one a thread */
    fprintf(stderr, "fresh memory in 2 MiB pages %.2f GB/s\n", g);
    CHECK(g > 0);
    CHECK(limits_fresh_huge_memory(8u << 20, 0) == FERRY_EINVAL);
    g = limits_read_bandwidth((8u << 20) + 24, 3); /* shares not a whole number of lines */
    fprintf(stderr, "memory read %.2f GB/s\n", g);
    CHECK(g > 0);
    unsigned best = 0;
    g = limits_read_bandwidth_best(8u << 20, 2, &best);
    CHECK(g > 0 && best >= 1 && best <= 2);
    CHECK(limits_read_bandwidth(8u << 20, 0) == FERRY_EINVAL);
    CHECK(limits_read_bandwidth(8, 1) == FERRY_EINVAL);
    g = limits_direct_read(path, 2, 4u << 20);
    fprintf(stderr, "direct read %.2f GB/s\n", g);
    CHECK(g > 0 || g == FERRY_EUNSUPPORTED);
    /* requests that do not divide the file, more readers than pieces some of them get */
    g = limits_direct_read(path, 3, 5u << 20);
    CHECK(g > 0 || g == FERRY_EUNSUPPORTED);
    /* the first pass: the first KEEP bytes into fresh memory of either kind of page, by the
     * readers or by faulters ahead of them; KEEP not a whole number of requests or 2 MiB units,
     * or the whole file */
    const uint64_t keeps[] = {(9u << 20) + 4096, n, 2 * (uint64_t)n};
    const limits_pages kinds[] = {LIMITS_PAGES_HUGE, LIMITS_PAGES_SMALL};
    for (size_t k = 0; k < 3; k++)
        for (unsigned w = 0; w < 6; w++) {
            unsigned faulters = w % 3;
            double secs = -1;
            g = limits_first_pass(path, keeps[k], 3, 5u << 20, faulters, kinds[w / 3], &secs);
            CHECK(g > 0 || g == FERRY_EUNSUPPORTED);
            if (g > 0) /* the rate is the file's bytes over the time it reports */
                CHECK(fabs((double)n / (g * 1e9) - secs) <= 1e-9 * secs + 1e-12);
            else
                CHECK(secs == 0);
        }
    g = limits_first_pass(path, n / 2, 2, 0, 2, LIMITS_PAGES_HUGE, NULL);
    fprintf(stderr, "first pass, half kept %.2f GB/s\n", g);
    CHECK(limits_first_pass(path, n / 2, 2, 0, 65, LIMITS_PAGES_HUGE, NULL) == FERRY_EINVAL);
    CHECK(limits_first_pass(path, n / 2, 0, 0, 1, LIMITS_PAGES_SMALL, NULL) == FERRY_EINVAL);
    CHECK(limits_first_pass(path, n / 2, 2, 0, 1, (limits_pages)7, NULL) == FERRY_EINVAL);
    CHECK(limits_first_pass(missing, n / 2, 2, 0, 1, LIMITS_PAGES_SMALL, NULL) < 0);
    g = limits_buffered_read(path, 4u << 20);
    fprintf(stderr, "buffered read %.2f GB/s\n", g);
    CHECK(g > 0);
    CHECK(limits_direct_read(missing, 2, 0) < 0);
    CHECK(limits_direct_read(dir, 2, 0) < 0);
    CHECK(limits_buffered_read(missing, 0) < 0);
    CHECK(limits_drop_cache(path) == 0);
    CHECK(limits_warm_file(path) == 0);
    double frac = limits_cached_fraction(path);
    CHECK(frac > 0.5);
    check_rmdir(dir);
    return check_finish();
}
