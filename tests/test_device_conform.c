/*
 * test_device_conform.c — the device conformance suite. The same checks run against every device
 * (cpu, sim, sim with a bandwidth limit, cuda:0 when one opens); sim-only checks follow: capacity,
 * poison, range checks, fault injection at every N, bandwidth pacing. Bad specs are refused.
 * The name contains "conform", so it also runs under TSan.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "check.h"
#include "devices/devices.h"
#include "ferry_device.h"


#define MiB (UINT64_C(1) << 20)

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64* */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * UINT64_C(2685821657736338717);
}

/* A pseudo-random pattern, a word at a time (byte loops are slow under the sanitizers). */
static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15u + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(&s);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = rng_next(&s);
    for (; i < n; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
    unsigned char ref[4096];
    memset(ref, v, sizeof ref);
    for (size_t i = 0; i < n; i += sizeof ref)
        if (memcmp(p + i, ref, FERRY__MIN(sizeof ref, n - i)) != 0)
            return 0;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *msg(ferry_device *d)
{
    static char buf[256];
    return ferry__device_errmsg(d, buf, sizeof buf);
}

static ferry_device *open_ok(const char *spec)
{
    ferry_device *d = NULL;
    char err[256];
    int rc = ferry_device_open(spec, &d, err, sizeof err);
    if (rc)
        fprintf(stderr, "open %s: %s\n", spec, err);
    CHECK_EQ_INT(rc, 0);
    CHECK(d != NULL);
    return d;
}

/* ---- checks every device must pass ----------------------------------------------------------- */

static void conform_fields(ferry_device *d, const char *spec)
{
    CHECK(d->ops != NULL);
    CHECK_EQ_INT(d->ops->version, FERRY_DEVICE_OPS_VERSION);
    CHECK_STR(FERRY__DP(d).name, spec);
    CHECK(FERRY__DP(d).kind[0] != 0);
    CHECK(FERRY__DP(d).alignment > 0 && (FERRY__DP(d).alignment & (FERRY__DP(d).alignment - 1)) == 0);
    CHECK(FERRY__DP(d).max_alloc > 0);
    CHECK(d->ops->alloc && d->ops->free && d->ops->copy_h2d && d->ops->copy_d2h && d->ops->wait &&
          d->ops->synchronize && d->ops->mem_info && d->ops->destroy);
    CHECK_EQ_INT(FERRY__DP(d).host_accessible, strcmp(FERRY__DP(d).kind, "cpu") == 0);
}

static void conform_alloc(ferry_device *d)
{
    static const uint64_t sizes[] = {0, 1, 3, 255, 4096, 65537, MiB, 3 * MiB + 5};
    void *ptrs[FERRY__ARRAY_LEN(sizes)];
    for (size_t i = 0; i < FERRY__ARRAY_LEN(sizes); i++) {
        ptrs[i] = NULL;
        int rc = d->ops->alloc(d, sizes[i], &ptrs[i]);
        CHECK_EQ_INT(rc, 0);
        CHECK(ptrs[i] != NULL);
        CHECK_EQ_INT((uintptr_t)ptrs[i] & (FERRY__DP(d).alignment - 1), 0);
        for (size_t j = 0; j < i; j++)
            CHECK(ptrs[j] != ptrs[i]);
    }
    for (size_t i = 0; i < FERRY__ARRAY_LEN(sizes); i++)
        d->ops->free(d, ptrs[i]);
    d->ops->free(d, NULL); /* a no-op */

    /* an allocation no machine can back is refused, not aborted on */
    void *huge = (void *)1;
    CHECK_EQ_INT(d->ops->alloc(d, UINT64_C(1) << 52, &huge), FERRY_ENOMEM);
    CHECK(huge == NULL);

    /* max_alloc is refused, and *ptr is NULL */
    if (FERRY__DP(d).max_alloc < UINT64_MAX) {
        void *p = (void *)1;
        CHECK_EQ_INT(d->ops->alloc(d, FERRY__DP(d).max_alloc + 1, &p), FERRY_ENOMEM);
        CHECK(p == NULL);
        CHECK(strlen(msg(d)) > 0);
    }
}

static void conform_mem_info(ferry_device *d)
{
    uint64_t fr = 0, tot = 0;
    CHECK_EQ_INT(d->ops->mem_info(d, &fr, &tot), 0);
    CHECK(tot > 0);
    CHECK(fr <= tot);
    CHECK_EQ_INT(d->ops->mem_info(d, NULL, NULL), 0);
    if (strcmp(FERRY__DP(d).kind, "sim") == 0) {
        /* exact accounting: an allocation of a multiple of the alignment takes exactly its size */
        void *p;
        uint64_t fr2;
        CHECK_EQ_INT(d->ops->alloc(d, MiB, &p), 0);
        CHECK_EQ_INT(d->ops->mem_info(d, &fr2, NULL), 0);
        CHECK_EQ_INT(fr - fr2, MiB);
        d->ops->free(d, p);
        CHECK_EQ_INT(d->ops->mem_info(d, &fr2, NULL), 0);
        CHECK_EQ_INT(fr2, fr);
    }
}

/* h2d then d2h of N bytes at byte offset OFF of a fresh allocation equals the source, and the
 * host bytes around the destination are untouched. */
static void round_trip(ferry_device *d, uint64_t n, uint64_t off, uint64_t seed)
{
    unsigned char *src = malloc(n), *dst = malloc(n + 64);
    void *dev = NULL;
    CHECK(src && dst);
    if (!src || !dst)
        goto out;
    fill(src, n, seed);
    memset(dst, 0x3C, n + 64);
    CHECK_EQ_INT(d->ops->alloc(d, n + off, &dev), 0);
    if (!dev)
        goto out;
    char *at = (char *)dev + off;
    uint64_t t1 = 0, t2 = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, at, src, n, &t1), 0);
    CHECK_EQ_INT(d->ops->wait(d, t1), 0);
    CHECK_EQ_INT(d->ops->copy_d2h(d, dst + 32, at, n, &t2), 0);
    CHECK(t2 > t1);
    CHECK_EQ_INT(d->ops->wait(d, t2), 0);
    int same = memcmp(dst + 32, src, n) == 0;
    if (!same)
        fprintf(stderr, "%s: round trip of %" PRIu64 " bytes at offset %" PRIu64 " differs\n",
                FERRY__DP(d).name, n, off);
    CHECK(same);
    CHECK(all_bytes(dst, 32, 0x3C) && all_bytes(dst + 32 + n, 32, 0x3C));
    /* the synchronous read agrees */
    memset(dst, 0, n);
    CHECK_EQ_INT(ferry__device_read(d, dst, at, n), 0);
    CHECK(memcmp(dst, src, n) == 0);
out:
    if (dev)
        d->ops->free(d, dev);
    free(src);
    free(dst);
}

static void conform_round_trips(ferry_device *d)
{
    static const uint64_t sizes[] = {1, 3, 255, 4097, 65537, MiB + 7, 8 * MiB};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(sizes); i++) {
        round_trip(d, sizes[i], 0, i + 1);
        round_trip(d, sizes[i], 13, i + 100); /* unaligned device offset */
    }
}

/* Several copies in flight: tickets grow; waited out of order; FIFO between an h2d and a d2h of
 * the same memory issued without a wait between them; synchronize; bad tickets refused. */
static void conform_tickets(ferry_device *d)
{
    enum { K = 6, N = 256 * 1024 };
    unsigned char *src = malloc((size_t)K * N), *dst = malloc((size_t)K * N);
    void *dev = NULL;
    CHECK_EQ_INT(d->ops->alloc(d, (uint64_t)K * N, &dev), 0);
    if (!src || !dst || !dev)
        goto out;
    fill(src, (size_t)K * N, 7);
    memset(dst, 0, (size_t)K * N);
    uint64_t t[2 * K];
    for (int i = 0; i < K; i++) {
        CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)dev + (size_t)i * N, src + (size_t)i * N, N,
                                      &t[i]), 0);
        if (i)
            CHECK(t[i] > t[i - 1]);
    }
    /* issued before any h2d was waited on: the stream order makes them read the new bytes */
    for (int i = 0; i < K; i++) {
        CHECK_EQ_INT(d->ops->copy_d2h(d, dst + (size_t)i * N, (char *)dev + (size_t)i * N, N,
                                      &t[K + i]), 0);
        CHECK(t[K + i] > t[K + i - 1]);
    }
    static const int order[2 * K] = {4, 0, 11, 2, 7, 1, 9, 3, 5, 6, 10, 8};
    for (int i = 0; i < 2 * K; i++)
        CHECK_EQ_INT(d->ops->wait(d, t[order[i]]), 0);
    CHECK(memcmp(src, dst, (size_t)K * N) == 0);

    /* synchronize, then the waits of already finished copies */
    uint64_t a, b;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &a), 0);
    CHECK_EQ_INT(d->ops->copy_d2h(d, dst, dev, N, &b), 0);
    CHECK_EQ_INT(d->ops->synchronize(d), 0);
    CHECK_EQ_INT(d->ops->wait(d, b), 0);
    CHECK_EQ_INT(d->ops->wait(d, a), 0);
    CHECK_EQ_INT(d->ops->synchronize(d), 0); /* nothing in flight */

    /* a zero-byte copy is a copy */
    uint64_t z;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, 0, &z), 0);
    CHECK(z > b);
    CHECK_EQ_INT(d->ops->wait(d, z), 0);

    /* tickets never issued */
    CHECK_EQ_INT(d->ops->wait(d, 0), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->wait(d, z + 1000), FERRY_EINVAL);
    CHECK(strstr(msg(d), "ticket") != NULL);

    /* NULL pointers with bytes to copy are refused and queue nothing */
    uint64_t x = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, NULL, 16, &x), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->copy_d2h(d, NULL, dev, 16, &x), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, 1, &x), 0);
    CHECK_EQ_INT(x, z + 1);
    CHECK_EQ_INT(d->ops->wait(d, x), 0);
out:
    if (dev)
        d->ops->free(d, dev);
    free(src);
    free(dst);
}

/* Staging memory through the helper (host_alloc or the fallback) is usable host memory. */
static void conform_host_alloc(ferry_device *d)
{
    void *h = NULL;
    CHECK_EQ_INT(ferry__device_host_alloc(d, 3 * MiB, &h), 0);
    CHECK(h != NULL);
    if (h) {
        memset(h, 0x42, 3 * MiB);
        round_trip(d, 1, 0, 5); /* the device still works with staging memory held */
        ferry__device_host_free(d, h);
    }
}

/* ---- 8 threads doing alloc / copy / wait / free at once ------------------------------------------ */

typedef struct worker_arg {
    ferry_device *d;
    uint64_t seed;
    int iters;
    int errors; /* written by the thread only, read after join */
} worker_arg;

static void *worker(void *p)
{
    worker_arg *w = p;
    ferry_device *d = w->d;
    uint64_t s = w->seed;
    for (int it = 0; it < w->iters; it++) {
        size_t n = 1 + (size_t)(rng_next(&s) % (96 * 1024));
        unsigned char *src = malloc(n), *dst = malloc(n);
        void *dev = NULL;
        if (!src || !dst) {
            w->errors++;
            free(src);
            free(dst);
            continue;
        }
        fill(src, n, s);
        if (d->ops->alloc(d, n, &dev)) {
            w->errors++;
        } else {
            uint64_t t1, t2;
            int wait_between = (int)(rng_next(&s) & 1);
            if (d->ops->copy_h2d(d, dev, src, n, &t1))
                w->errors++;
            else if (wait_between && d->ops->wait(d, t1))
                w->errors++;
            else if (d->ops->copy_d2h(d, dst, dev, n, &t2))
                w->errors++;
            else {
                if (!wait_between && d->ops->wait(d, t1))
                    w->errors++;
                if (d->ops->wait(d, t2))
                    w->errors++;
                if (memcmp(src, dst, n) != 0)
                    w->errors++;
            }
            if (it % 7 == 0) {
                uint64_t fr, tot;
                if (d->ops->mem_info(d, &fr, &tot) || fr > tot)
                    w->errors++;
            }
            d->ops->free(d, dev);
        }
        free(src);
        free(dst);
    }
    return NULL;
}

static void conform_threads(ferry_device *d)
{
    enum { T = 8 };
    pthread_t th[T];
    worker_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (worker_arg){.d = d, .seed = (uint64_t)i * 977 + 3, .iters = 40};
        CHECK_EQ_INT(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].errors, 0);
    }
}

/* Events (ops version 2): complete until recorded; a record behind a copy completes after it; a
 * host wait on it returns once the copy is done. */
static void conform_events(ferry_device *d)
{
    CHECK(d->ops->version >= 2);
    CHECK(ferry__device_has_events(d));
    if (!ferry__device_has_events(d))
        return;
    void *ev = NULL, *buf = NULL;
    CHECK_EQ_INT(d->ops->event_create(d, &ev), 0);
    CHECK_EQ_INT(d->ops->event_query(d, ev), 1);
    CHECK_EQ_INT(d->ops->alloc(d, MiB, &buf), 0);
    unsigned char *src = malloc(MiB), *back = malloc(MiB);
    fill(src, MiB, 77);
    uint64_t t = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, buf, src, MiB, &t), 0);
    CHECK_EQ_INT(d->ops->event_record(d, ev, NULL), 0);
    CHECK_EQ_INT(d->ops->event_wait(d, ev, NULL), 0);
    CHECK_EQ_INT(d->ops->event_query(d, ev), 1);
    if (strcmp(FERRY__DP(d).kind, "sim") == 0 && strncmp(FERRY__DP(d).name, "fault:", 6) != 0) {
        ferry__sim_stats st;
        CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
        CHECK_EQ_INT(st.copies_pending, 0); /* the record came after the copy */
        CHECK_EQ_INT(d->ops->event_record(d, ev, (void *)&st), FERRY_EINVAL); /* no such stream */
    }
    CHECK_EQ_INT(d->ops->wait(d, t), 0);
    CHECK_EQ_INT(ferry__device_read(d, back, buf, MiB), 0);
    CHECK(memcmp(src, back, MiB) == 0);
    d->ops->free(d, buf);
    d->ops->event_destroy(d, ev);
    free(src), free(back);
}

static void run_conformance(ferry_device *d, const char *spec)
{
    printf("conformance: %s\n", spec);
    conform_fields(d, spec);
    conform_alloc(d);
    conform_mem_info(d);
    conform_round_trips(d);
    conform_tickets(d);
    conform_host_alloc(d);
    conform_threads(d);
    conform_events(d);
    if (strcmp(FERRY__DP(d).kind, "sim") == 0 && strncmp(spec, "fault:", 6) != 0) {
        ferry__sim_stats st;
        CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
        CHECK_EQ_INT(st.live_allocs, 0); /* everything the suite allocated was freed */
        CHECK_EQ_INT(st.used, 0);
        CHECK_EQ_INT(st.copies_pending, 0);
        CHECK_EQ_INT(st.misuse, 0);
        CHECK(st.peak_used <= 64 * MiB);
    }
}

/* ---- sim only ------------------------------------------------------------------------------------ */

static void sim_poison_and_ranges(void)
{
    ferry_device *d = open_ok("sim:64MiB");
    if (!d)
        return;
    CHECK_EQ_INT(FERRY__DP(d).host_accessible, 0);
    CHECK_EQ_INT(FERRY__DP(d).alignment, FERRY__SIM_DEFAULT_ALIGN);
    CHECK_EQ_INT(FERRY__DP(d).max_alloc, 64 * MiB);

    void *p = NULL, *q = NULL;
    unsigned char buf[8192];
    CHECK_EQ_INT(d->ops->alloc(d, 5000, &p), 0);
    CHECK_EQ_INT(d->ops->alloc(d, 4096, &q), 0);
    memset(buf, 0, sizeof buf);
    CHECK_EQ_INT(ferry__device_read(d, buf, p, 5000), 0);
    CHECK(all_bytes(buf, 5000, FERRY__SIM_POISON)); /* fresh memory is poisoned */

    uint64_t t = 0, t0 = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, p, buf, 1, &t0), 0);
    CHECK_EQ_INT(d->ops->wait(d, t0), 0);
    /* past the end of the allocation */
    CHECK_EQ_INT(d->ops->copy_h2d(d, p, buf, 5001, &t), FERRY_EINVAL);
    CHECK(strstr(msg(d), "not inside one live allocation") != NULL);
    CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)p + 4999, buf, 2, &t), FERRY_EINVAL);
    CHECK_EQ_INT(d->ops->copy_d2h(d, buf, (char *)p + 10, 4991, &t), FERRY_EINVAL);
    /* not device memory at all */
    CHECK_EQ_INT(d->ops->copy_h2d(d, buf, buf + 4096, 16, &t), FERRY_EINVAL);
    /* the host side is device memory */
    CHECK_EQ_INT(d->ops->copy_h2d(d, p, q, 16, &t), FERRY_EINVAL);
    CHECK(strstr(msg(d), "is device memory") != NULL);
    CHECK_EQ_INT(d->ops->copy_d2h(d, (char *)q + 100, p, 16, &t), FERRY_EINVAL);
    /* none of the refused copies was queued: the next ticket follows the last good one */
    CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)p + 4999, buf, 1, &t), 0);
    CHECK_EQ_INT(t, t0 + 1);
    CHECK_EQ_INT(d->ops->wait(d, t), 0);

    /* freeing what is not an allocation is counted, not crashed on */
    ferry__sim_stats st;
    d->ops->free(d, (char *)p + 8);
    d->ops->free(d, buf);
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK_EQ_INT(st.misuse, 2);
    CHECK_EQ_INT(st.live_allocs, 2);
    d->ops->free(d, p);
    d->ops->free(d, q);
    d->ops->free(d, q); /* double free: misuse, no crash */
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK_EQ_INT(st.misuse, 3);
    CHECK_EQ_INT(st.live_allocs, 0);

    /* the non-sim hooks refuse other devices */
    ferry_device *c = open_ok("cpu");
    if (c) {
        CHECK_EQ_INT(ferry__sim_set_faults(c, 1, 1), FERRY_EINVAL);
        CHECK_EQ_INT(ferry__sim_get_stats(c, &st), FERRY_EINVAL);
        ferry_device_close(c);
    }
    ferry_device_close(d);
}

static void sim_capacity(void)
{
    ferry_device *d = open_ok("sim:64MiB");
    if (!d)
        return;
    void *blk[32];
    int n = 0;
    while (n < 32 && d->ops->alloc(d, 5 * MiB, &blk[n]) == 0)
        n++;
    CHECK_EQ_INT(n, 12); /* 60 MiB of 64 */
    const char *m = msg(d);
    CHECK(strstr(m, "requested 5.00 MiB") != NULL);
    CHECK(strstr(m, "used 60.00 MiB of 64.00 MiB") != NULL);
    uint64_t fr, tot;
    CHECK_EQ_INT(d->ops->mem_info(d, &fr, &tot), 0);
    CHECK_EQ_INT(fr, 4 * MiB);
    CHECK_EQ_INT(tot, 64 * MiB);
    /* free one, and the same allocation fits again */
    d->ops->free(d, blk[3]);
    CHECK_EQ_INT(d->ops->alloc(d, 5 * MiB, &blk[3]), 0);
    void *x;
    CHECK_EQ_INT(d->ops->alloc(d, 5 * MiB, &x), FERRY_ENOMEM);
    /* free two: exactly the room left fits, then not one byte more */
    d->ops->free(d, blk[0]);
    d->ops->free(d, blk[1]);
    CHECK_EQ_INT(d->ops->alloc(d, 14 * MiB, &blk[0]), 0);
    CHECK_EQ_INT(d->ops->mem_info(d, &fr, NULL), 0);
    CHECK_EQ_INT(fr, 0);
    CHECK_EQ_INT(d->ops->alloc(d, 1, &x), FERRY_ENOMEM);
    CHECK_EQ_INT(d->ops->alloc(d, 0, &x), FERRY_ENOMEM);
    ferry__sim_stats st;
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK_EQ_INT(st.peak_used, 64 * MiB);
    CHECK_EQ_INT(st.used, 64 * MiB);
    d->ops->free(d, blk[0]);
    for (int i = 2; i < n; i++)
        d->ops->free(d, blk[i]);
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK_EQ_INT(st.used, 0);
    CHECK_EQ_INT(st.live_allocs, 0);
    ferry_device_close(d);
}

/* 8 threads race for 6 MiB blocks on a 64 MiB device: exactly 10 win, never more. */
typedef struct race_arg {
    ferry_device *d;
    void *got[16];
    int n;
} race_arg;

static void *race(void *p)
{
    race_arg *r = p;
    while (r->n < 16 && r->d->ops->alloc(r->d, 6 * MiB, &r->got[r->n]) == 0)
        r->n++;
    return NULL;
}

static void sim_capacity_threads(void)
{
    ferry_device *d = open_ok("sim:64MiB,poison=0");
    if (!d)
        return;
    enum { T = 8 };
    pthread_t th[T];
    race_arg r[T];
    for (int i = 0; i < T; i++) {
        r[i] = (race_arg){.d = d};
        pthread_create(&th[i], NULL, race, &r[i]);
    }
    int total = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        total += r[i].n;
    }
    CHECK_EQ_INT(total, 10);
    ferry__sim_stats st;
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK(st.peak_used <= 64 * MiB);
    CHECK_EQ_INT(st.used, 60 * MiB);
    for (int i = 0; i < T; i++)
        for (int j = 0; j < r[i].n; j++)
            d->ops->free(d, r[i].got[j]);
    ferry_device_close(d);
}

static void sim_options(void)
{
    ferry_device *d = open_ok("sim:64MiB,max_alloc=1MiB,align=4096");
    if (d) {
        void *p, *q;
        CHECK_EQ_INT(FERRY__DP(d).alignment, 4096);
        CHECK_EQ_INT(FERRY__DP(d).max_alloc, MiB);
        CHECK_EQ_INT(d->ops->alloc(d, MiB, &p), 0);
        CHECK_EQ_INT(d->ops->alloc(d, MiB + 1, &q), FERRY_ENOMEM);
        CHECK(strstr(msg(d), "max_alloc") != NULL);
        CHECK_EQ_INT(d->ops->alloc(d, 1, &q), 0);
        CHECK_EQ_INT((uintptr_t)q & 4095, 0);
        ferry__sim_stats st;
        CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
        CHECK_EQ_INT(st.used, MiB + 4096); /* charged in units of the alignment */
        d->ops->free(d, p);
        d->ops->free(d, q);
        ferry_device_close(d);
    }
    d = open_ok("sim:8GiB@25GB/s,fail_alloc=3,fail_copy=2/every,max_alloc=1GiB,align=4KiB,"
                "poison=0");
    if (d) {
        uint64_t fr, tot;
        CHECK_EQ_INT(d->ops->mem_info(d, &fr, &tot), 0);
        CHECK_EQ_INT(tot, UINT64_C(8) << 30);
        CHECK_EQ_INT(fr, tot);
        CHECK_EQ_INT(FERRY__DP(d).max_alloc, UINT64_C(1) << 30);
        CHECK_EQ_INT(FERRY__DP(d).alignment, 4096);
        CHECK_STR(FERRY__DP(d).kind, "sim");
        ferry_device_close(d);
    }
    static const char *ok_specs[] = {"sim", "sim@1GB/s", "sim:1.5GiB", "sim:512MB@800MiB/s",
                                     "sim,poison=1"};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(ok_specs); i++) {
        d = open_ok(ok_specs[i]);
        if (d) {
            CHECK_STR(FERRY__DP(d).name, ok_specs[i]);
            ferry_device_close(d);
        }
    }
    d = open_ok("sim");
    if (d) {
        uint64_t tot;
        CHECK_EQ_INT(d->ops->mem_info(d, NULL, &tot), 0);
        CHECK_EQ_INT(tot, FERRY__SIM_DEFAULT_CAPACITY);
        ferry_device_close(d);
    }
}

/* The N-th allocation fails (every N from 1 to 6), the others and the next one work, and nothing
 * leaks. */
static void sim_fault_alloc(void)
{
    ferry_device *d = open_ok("sim:64MiB");
    if (!d)
        return;
    for (uint64_t nth = 1; nth <= 6; nth++) {
        CHECK_EQ_INT(ferry__sim_set_faults(d, nth, 0), 0);
        void *p[8] = {0};
        for (uint64_t i = 1; i <= nth + 1; i++) {
            int rc = d->ops->alloc(d, 4096, &p[i - 1]);
            if (i == nth) {
                CHECK_EQ_INT(rc, FERRY_ENOMEM);
                CHECK(p[i - 1] == NULL);
                CHECK(strstr(msg(d), "injected") != NULL);
            } else {
                CHECK_EQ_INT(rc, 0);
            }
        }
        ferry__sim_stats st;
        CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
        CHECK_EQ_INT(st.live_allocs, nth);
        CHECK_EQ_INT(st.used, nth * 4096);
        for (int i = 0; i < 8; i++)
            d->ops->free(d, p[i]);
        CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
        CHECK_EQ_INT(st.used, 0);
        CHECK_EQ_INT(st.live_allocs, 0);
        /* one-shot: the fault is spent */
        void *x;
        CHECK_EQ_INT(d->ops->alloc(d, 4096, &x), 0);
        d->ops->free(d, x);
    }
    /* every third */
    CHECK_EQ_INT(ferry__sim_set_faults_every(d, 3, 1, 0, 0), 0);
    void *p[9];
    int failed_mask = 0;
    for (int i = 0; i < 9; i++)
        if (d->ops->alloc(d, 100, &p[i]))
            failed_mask |= 1 << i;
    CHECK_EQ_INT(failed_mask, (1 << 2) | (1 << 5) | (1 << 8));
    for (int i = 0; i < 9; i++)
        if (!(failed_mask & (1 << i)))
            d->ops->free(d, p[i]);
    CHECK_EQ_INT(ferry__sim_set_faults(d, 0, 0), 0);
    uint64_t allocs, copies, peak;
    CHECK_EQ_INT(ferry__sim_counters(d, &allocs, &copies, &peak), 0);
    CHECK_EQ_INT(allocs, (1 + 2 + 3 + 4 + 5 + 6) + 6 + 6);
    CHECK_EQ_INT(copies, 0);
    CHECK_EQ_INT(peak, 6 * 4096);
    ferry_device_close(d);

    /* from the spec */
    d = open_ok("sim:64MiB,fail_alloc=2");
    if (d) {
        void *a = NULL, *b = NULL, *c = NULL;
        CHECK_EQ_INT(d->ops->alloc(d, 10, &a), 0);
        CHECK_EQ_INT(d->ops->alloc(d, 10, &b), FERRY_ENOMEM);
        CHECK_EQ_INT(d->ops->alloc(d, 10, &c), 0);
        d->ops->free(d, a);
        d->ops->free(d, c);
        ferry_device_close(d);
    }
}

/* The N-th copy completes with FERRY_EDEVICE and copies nothing; the others and the next one
 * work. read_sync never fails. */
static void sim_fault_copy(void)
{
    enum { N = 4096 };
    ferry_device *d = open_ok("sim:64MiB");
    if (!d)
        return;
    unsigned char src[8 * N], dst[8 * N];
    fill(src, sizeof src, 11);
    for (uint64_t nth = 1; nth <= 6; nth++) {
        void *dev;
        CHECK_EQ_INT(d->ops->alloc(d, 8 * N, &dev), 0);
        ferry__sim_stats before, after;
        CHECK_EQ_INT(ferry__sim_get_stats(d, &before), 0);
        CHECK_EQ_INT(ferry__sim_set_faults(d, 0, nth), 0);
        uint64_t t[8];
        for (uint64_t i = 0; i <= nth; i++)
            CHECK_EQ_INT(d->ops->copy_h2d(d, (char *)dev + i * N, src + i * N, N, &t[i]), 0);
        for (uint64_t i = 0; i <= nth; i++) {
            int rc = d->ops->wait(d, t[i]);
            if (i + 1 == nth) {
                CHECK_EQ_INT(rc, FERRY_EDEVICE);
                CHECK(strstr(msg(d), "injected") != NULL);
            } else {
                CHECK_EQ_INT(rc, 0);
            }
        }
        CHECK_EQ_INT(ferry__device_read(d, dst, dev, 8 * N), 0);
        for (uint64_t i = 0; i <= nth; i++) {
            if (i + 1 == nth)
                CHECK(all_bytes(dst + i * N, N, FERRY__SIM_POISON)); /* nothing was copied */
            else
                CHECK(memcmp(dst + i * N, src + i * N, N) == 0);
        }
        CHECK_EQ_INT(ferry__sim_get_stats(d, &after), 0);
        CHECK_EQ_INT(after.copy_failures - before.copy_failures, 1);
        CHECK_EQ_INT(after.copies - before.copies, nth + 1);
        CHECK_EQ_INT(after.copies_pending, 0);
        /* the fault is spent: the next copy works */
        uint64_t x;
        CHECK_EQ_INT(d->ops->copy_d2h(d, dst, dev, N, &x), 0);
        CHECK_EQ_INT(d->ops->wait(d, x), 0);
        d->ops->free(d, dev);
    }
    /* read_sync is not counted as a copy for faults */
    void *dev;
    CHECK_EQ_INT(d->ops->alloc(d, N, &dev), 0);
    CHECK_EQ_INT(ferry__sim_set_faults(d, 0, 1), 0);
    CHECK_EQ_INT(ferry__device_read(d, dst, dev, N), 0);
    uint64_t x;
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &x), 0);
    CHECK_EQ_INT(d->ops->wait(d, x), FERRY_EDEVICE);
    d->ops->free(d, dev);
    ferry_device_close(d);

    /* every second copy, from the spec */
    d = open_ok("sim:64MiB,fail_copy=2/every");
    if (d) {
        CHECK_EQ_INT(d->ops->alloc(d, N, &dev), 0);
        int mask = 0;
        for (int i = 0; i < 6; i++) {
            uint64_t t;
            CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, N, &t), 0);
            if (d->ops->wait(d, t) == FERRY_EDEVICE)
                mask |= 1 << i;
        }
        CHECK_EQ_INT(mask, (1 << 1) | (1 << 3) | (1 << 5));
        d->ops->free(d, dev);
        ferry_device_close(d);
    }
}

/* Freeing memory under a queued copy breaks the contract; the sim waits for the copy and counts
 * it. Closing with copies queued drains them first. */
static void sim_misuse(void)
{
    /* the free must come while the copy is queued: a copy of about a second leaves room for a
     * loaded machine (or TSan) to stall this thread between the two calls */
    ferry_device *d = open_ok("sim:64MiB@1MB/s");
    if (!d)
        return;
    size_t n = MiB; /* ~1 s at 1 MB/s */
    unsigned char *src = malloc(n);
    fill(src, n, 3);
    void *dev;
    uint64_t t;
    CHECK_EQ_INT(d->ops->alloc(d, n, &dev), 0);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, n, &t), 0);
    d->ops->free(d, dev); /* waits for the copy */
    ferry__sim_stats st;
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK_EQ_INT(st.misuse, 1);
    CHECK_EQ_INT(st.live_allocs, 0);
    CHECK_EQ_INT(st.copies_pending, 0);
    CHECK_EQ_INT(d->ops->wait(d, t), 0);

    /* close with a copy in flight and memory still allocated: drained, then freed (ASan checks) */
    CHECK_EQ_INT(d->ops->alloc(d, n, &dev), 0);
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, n, &t), 0);
    ferry_device_close(d);
    free(src);
}

static int within(double v, double lo, double hi, const char *what)
{
    int ok = v >= lo && v <= hi;
    printf("  pacing %s: %.2f ms (expected %.2f..%.2f)%s\n", what, v * 1e3, lo * 1e3, hi * 1e3,
           ok ? "" : " - out of range");
    return ok;
}

/* Pacing: a copy takes bytes / rate, never less; back-to-back copies add up. Timing on a shared
 * machine can only be disturbed upwards, so the upper bound gets five tries; the lower bound must
 * always hold. Sanitizers slow memcpy down (TSan to a few hundred MB/s): there the upper bound is loose
 * and, under TSan, rates and sizes are scaled down so that memcpy stays well below the rate. */
static int paced_copy_ok(ferry_device *d, int h2d, char *dev, unsigned char *host, size_t chunk,
                         int count, double rate, const char *what)
{
    /* The upper bound only catches a pacer that sleeps far too long; a loaded CI machine (ctest
     * -j with other suites) stretches any timing, so it is loose. Benchmarks measure accuracy. */
    const double slack_hi = SANITIZED ? 4.0 : 2.0;
    double expect = (double)chunk * count / rate;
    int ok = 0;
    for (int attempt = 0; attempt < 5 && !ok; attempt++) {
        uint64_t tk[64];
        /* The sim copies, then sleeps until bytes / rate have passed: a copy lasts the longer of
         * the two. The same copies done here first tell what the machine's memcpy costs now
         * (on a loaded machine it can exceed bytes / rate), so that the upper bound is about the
         * pacer, not the machine. */
        double m0 = now_s();
        for (int i = 0; i < count; i++) {
            size_t off = (size_t)i * chunk;
            if (h2d)
                memcpy(dev + off, host + off, chunk);
            else
                memcpy(host + off, dev + off, chunk);
        }
        double copy = now_s() - m0;
        double t0 = now_s();
        for (int i = 0; i < count; i++) {
            size_t off = (size_t)i * chunk;
            int rc = h2d ? d->ops->copy_h2d(d, dev + off, host + off, chunk, &tk[i])
                         : d->ops->copy_d2h(d, host + off, dev + off, chunk, &tk[i]);
            CHECK_EQ_INT(rc, 0);
        }
        for (int i = 0; i < count; i++)
            CHECK_EQ_INT(d->ops->wait(d, tk[i]), 0);
        double el = now_s() - t0;
        /* never faster than the rate */
        CHECK(el >= expect * 0.999);
        ok = within(el, expect * 0.999, (expect > copy ? expect : copy) * slack_hi, what);
    }
    return ok;
}

static void sim_pacing(void)
{
#if defined(__SANITIZE_THREAD__)
    const size_t big = MiB, chunk = 32 * 1024, small = 512 * 1024;
    const double rate = 40e6, slow = 20e6;
#else
    const size_t big = 64 * MiB, chunk = MiB, small = 4 * MiB;
    const double rate = 2e9, slow = 200e6;
#endif
    ferry_device *d = open_ok("sim:128MiB,poison=0");
    if (!d)
        return;
    unsigned char *src = malloc(big);
    memset(src, 1, big);
    void *dev;
    CHECK_EQ_INT(d->ops->alloc(d, big, &dev), 0);
    uint64_t t;
    /* fault the memory in, outside the measurement */
    CHECK_EQ_INT(d->ops->copy_h2d(d, dev, src, big, &t), 0);
    CHECK_EQ_INT(d->ops->wait(d, t), 0);

    CHECK_EQ_INT(ferry__sim_set_rate(d, (uint64_t)rate), 0);
    char what[64];
    snprintf(what, sizeof what, "1 x %zu KiB at %.0f MB/s", big >> 10, rate / 1e6);
    CHECK(paced_copy_ok(d, 1, dev, src, big, 1, rate, what));
    snprintf(what, sizeof what, "32 x %zu KiB at %.0f MB/s", chunk >> 10, rate / 1e6);
    CHECK(paced_copy_ok(d, 1, dev, src, chunk, 32, rate, what));
    /* a rate changed at run time applies to the next copies */
    CHECK_EQ_INT(ferry__sim_set_rate(d, (uint64_t)slow), 0);
    snprintf(what, sizeof what, "d2h 1 x %zu KiB at %.0f MB/s", small >> 10, slow / 1e6);
    CHECK(paced_copy_ok(d, 0, dev, src, small, 1, slow, what));

    ferry__sim_stats st;
    CHECK_EQ_INT(ferry__sim_get_stats(d, &st), 0);
    CHECK(st.bytes_h2d >= 2 * big);
    d->ops->free(d, dev);
    free(src);
    ferry_device_close(d);
}

/* ---- specs ----------------------------------------------------------------------------------- */

static void bad_specs(void)
{
    static const char *bad[] = {
        "",          "gpu",       "cpu:0",       "cpux",         "sim:",
        "sim:8XB",   "sim:0",     "sim:-1GiB",   "sim:1GiB@",    "sim:1GiB@fast",
        "sim:1GiB@0GB/s",          "sim:1GiB,bogus=1",          "sim:1GiB,fail_alloc=x",
        "sim:1GiB,fail_alloc=3/sometimes",     "sim:1GiB,fail_copy=",  "sim:1GiB,align=3",
        "sim:1GiB,align=0",        "sim:1GiB,align=4MiB",       "sim:1GiB,max_alloc=2GiB",
        "sim:1GiB,max_alloc=0",    "sim:1GiB,",  "sim:1GiB,poison=2",   "sim:1GiB,=3",
        "sim:1GiB,noequals",       "simulator",  "cuda:x",      "cuda:-1", "cuda:",
        "cuda:0,opt=1",            "cuda0",
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(bad); i++) {
        ferry_device *d = (ferry_device *)1;
        char err[256] = "";
        int rc = ferry_device_open(bad[i], &d, err, sizeof err);
        if (rc != FERRY_EINVAL)
            fprintf(stderr, "spec '%s' gave %d (%s)\n", bad[i], rc, err);
        CHECK_EQ_INT(rc, FERRY_EINVAL);
        CHECK(d == NULL);
        CHECK(strlen(err) > 0);
        if (rc == 0 && d)
            ferry_device_close(d);
    }
    char err[256];
    ferry_device *d;
    CHECK_EQ_INT(ferry_device_open("sim:8XB", &d, err, sizeof err), FERRY_EINVAL);
    CHECK_STR(err, "sim:8XB: bad capacity '8XB'");
    CHECK_EQ_INT(ferry_device_open("sim:1GiB,frobnicate=1", &d, err, sizeof err), FERRY_EINVAL);
    CHECK(strstr(err, "unknown option 'frobnicate'") != NULL);
    CHECK_EQ_INT(ferry_device_open("sim:1GiB@fast", &d, err, sizeof err), FERRY_EINVAL);
    CHECK(strstr(err, "bad bandwidth 'fast'") != NULL);
    CHECK_EQ_INT(ferry_device_open(NULL, &d, err, sizeof err), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_device_open("cpu", NULL, err, sizeof err), FERRY_EINVAL);
    /* no message buffer is fine */
    CHECK_EQ_INT(ferry_device_open("sim:8XB", &d, NULL, 0), FERRY_EINVAL);
    /* a long spec is accepted; its name is cut to fit */
    d = open_ok("sim:64MiB,poison=1,poison=1,poison=1,poison=1,poison=1,poison=1,poison=1");
    if (d) {
        CHECK(strlen(FERRY__DP(d).name) == sizeof FERRY__DP(d).name - 1);
        ferry_device_close(d);
    }
    ferry_device_close(NULL); /* a no-op */
}

/* cuda:0 when it opens (FERRY_TEST_EXPECT_CUDA=N: N devices must open — the run against the fake
 * runtime, tests/fake_cudart.c — and each gets the suite). */
static void cuda_absent_or_present(void)
{
    ferry_device *d = NULL;
    char err[256] = "";
    const char *expect = getenv("FERRY_TEST_EXPECT_CUDA");
    int want = expect ? atoi(expect) : 0;
    int rc = ferry_device_open("cuda:0", &d, err, sizeof err);
    if (rc && want)
        fprintf(stderr, "FERRY_TEST_EXPECT_CUDA=%d but %s\n", want, err);
    CHECK(rc == 0 || !want);
    for (int k = 1; k < want && rc == 0; k++) {
        char spec[32];
        ferry_device *dk = NULL;
        snprintf(spec, sizeof spec, "cuda:%d", k);
        CHECK_EQ_INT(ferry_device_open(spec, &dk, err, sizeof err), 0);
        if (dk) {
            run_conformance(dk, spec);
            ferry_device_close(dk);
        }
    }
    if (rc) {
        /* without the library or a GPU: a clean, plain refusal */
        CHECK_EQ_INT(rc, FERRY_EDEVICE);
        CHECK(d == NULL);
        CHECK(strncmp(err, "cuda:0 unavailable: ", 20) == 0);
        printf("%s — skipped\n", err);
        /* the same for any ordinal */
        CHECK_EQ_INT(ferry_device_open("cuda:3", &d, err, sizeof err), FERRY_EDEVICE);
        CHECK(strncmp(err, "cuda:3 unavailable: ", 20) == 0);
        return;
    }
    run_conformance(d, "cuda:0");
    ferry_device_close(d);
    rc = ferry_device_open("cuda:1000", &d, err, sizeof err);
    CHECK_EQ_INT(rc, FERRY_EDEVICE);
    CHECK(strstr(err, "unavailable") != NULL);
}

/* Host memory helpers: page locking succeeds or is refused with the limit named; RAM sizes. */
static void host_memory(void)
{
    uint64_t avail = 0, total = 0;
    CHECK_EQ_INT(ferry__host_mem_info(&avail, &total), 0);
    CHECK(total > 0 && avail <= total);

    size_t n = 64 * 1024;
    void *p = ferry__host_aligned_alloc(n, 4096);
    CHECK(p != NULL && ((uintptr_t)p & 4095) == 0);
    ferry__err e = {0};
    int rc = ferry__host_lock(p, n, &e);
    CHECK(rc == 0 || (rc == FERRY_EUNSUPPORTED && strstr(e.msg, "RLIMIT_MEMLOCK")));
    if (rc == 0)
        ferry__host_unlock(p, n);
    ferry__host_free(p);

    /* more than RLIMIT_MEMLOCK: refused with the limit named, unless privileged */
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < 256 * MiB) {
        size_t big = (size_t)rl.rlim_cur + MiB;
        p = ferry__host_aligned_alloc(big, 4096);
        if (p) {
            memset(p, 0, big);
            rc = ferry__host_lock(p, big, &e);
            if (rc)
                printf("mlock beyond the limit: %s\n", e.msg);
            CHECK(rc == 0 || (rc == FERRY_EUNSUPPORTED && strstr(e.msg, "RLIMIT_MEMLOCK")));
            if (rc == 0)
                ferry__host_unlock(p, big);
            ferry__host_free(p);
        }
    }
    CHECK(ferry__host_aligned_alloc(UINT64_MAX, 4096) == NULL);
    CHECK(ferry__host_aligned_alloc(16, 3) == NULL);
}

int main(void)
{
    /* the fault: wrapper with no fault set must conform like the device it wraps */
    static const char *specs[] = {"cpu", "sim:64MiB", "sim:64MiB@2GB/s", "fault:cpu",
                                  "fault:sim:64MiB"};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(specs); i++) {
        ferry_device *d = open_ok(specs[i]);
        if (!d)
            continue;
        run_conformance(d, specs[i]);
        ferry_device_close(d);
    }
    cuda_absent_or_present();

    sim_poison_and_ranges();
    sim_capacity();
    sim_capacity_threads();
    sim_options();
    sim_fault_alloc();
    sim_fault_copy();
    sim_misuse();
    sim_pacing();
    bad_specs();
    host_memory();
    return check_finish();
}
