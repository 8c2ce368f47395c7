/*
 * coldload.c — how load AUTO reads the bytes the page cache does not hold: into private copies
 * with O_DIRECT (group loads lay them in a huge-page arena), or through the file's mapping, the
 * page cache filled by readahead and MADV_POPULATE_READ. Which is faster depends on the machine:
 * where fresh anonymous memory faults in slowly (a VM whose host backs guest memory on first
 * touch: 0.6-0.7 GB/s here on some days against a disk that reads 5-12 GB/s), the page cache fills
 * 3 times faster; where first touch is fast, O_DIRECT into huge pages beats the page cache's
 * readahead (bench/README.md). So a manager's first group load of enough uncached AUTO bytes
 * measures both on the file it loads, and keeps the faster:
 *   map:     up to 64 MiB of uncached bytes brought into the page cache and mapped as a loader
 *            does it (ferry__populate_range), in as many shares at once as there are loaders (up
 *            to 4), as they populate tensors side by side, then a byte of each page read;
 *   private: up to 32 MiB of fresh memory faulted in (MADV_POPULATE_WRITE, huge pages advised, as
 *            the arena does where it is probed) in 2 MiB steps, each timed, and as many other
 *            uncached bytes read into it with O_DIRECT through the I/O pool; the arena overlaps the
 *            two, so its rate is the slower one's. Where some steps were fast and others four times
 *            slower or more, the pages freed a moment ago served the first, and memory the host
 *            backs again on first touch the others (a VM reporting free pages to its host: 32 MiB
 *            right after a rest faulted in at 1.4 GB/s, 128 MiB at 0.57): a whole model's load
 *            meets mostly the latter, so the slowest step rates it (ferry__cold_fault_rate).
 * The mapped bytes stay cached and serve the load either way (mapped, or copied from the cache);
 * the private ones cost their time and are read again by the load when private copies win.
 * Where the host takes free 2 MiB blocks back (ferry__host_huge_pages_dear), the arena lays copies
 * in small pages and relays their reads (io.h, `relay`); the private probe then runs first, reads
 * as the arena does and faults up to 128 MiB in small pages, and the rule changes, since the
 * mapping's first touch costs a whole load more than its probe shows (see probe).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "core/load.h"
#include "devices/devices.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PROBE_MAP_MAX (UINT64_C(64) << 20)     /* bytes populated (used by the load either way) */
#define PROBE_PRIVATE_MAX (UINT64_C(32) << 20) /* bytes read into private memory (lost if the
                                                  map wins) */
#define PROBE_FAULT_SMALL (UINT64_C(128) << 20) /* bytes faulted in small pages */
#define PROBE_PARTS 4
#define PROBE_MIN (UINT64_C(1) << 20)
#define PROBE_PAGE UINT64_C(4096)
#define PROBE_COLD 0.1 /* a probe range must be at most this fraction cached */
#define FERRY__COLD_MAP_TIE 0.8 /* the mapping wins from this fraction of the other's rate up */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ferry__cold_fault_rate(const double *secs, size_t n, uint64_t step)
{
    double sorted[FERRY__COLD_STEPS_MAX], sum = 0;
    if (!n || n > FERRY__COLD_STEPS_MAX || !step)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!(secs[i] > 0))
            return 0;
        sorted[i] = secs[i];
        sum += secs[i];
    }
    qsort(sorted, n, sizeof *sorted, cmp_double);
    double med = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    if (sorted[n - 1] >= FERRY__COLD_STEP_SPREAD * med)
        return (double)step / sorted[n - 1];
    return (double)step * (double)n / sum;
}

double ferry__cold_slow_rate(const double *secs, size_t n, uint64_t step)
{
    double sorted[FERRY__COLD_STEPS_MAX];
    if (!n || n > FERRY__COLD_STEPS_MAX || !step)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(secs[i] > 0))
            return 0;
    memcpy(sorted, secs, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_double);
    return (double)step / sorted[n > FERRY__COLD_SLOW_STEPS ? n - FERRY__COLD_SLOW_STEPS : n - 1];
}

/* Faults in the N bytes at P (MADV_POPULATE_WRITE, else a write of every byte): seconds. */
static double fault_step(unsigned char *p, size_t n)
{
    double s0 = ferry__now();
    if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
        memset(p, 0, n);
    return ferry__now() - s0;
}

/* The private probe where huge pages are cheap: faults in LEN fresh bytes in 2 MiB pages, in 2 MiB
 * steps, each timed (rated by ferry__cold_fault_rate), and reads [OFF, OFF+LEN) of FILE into them
 * with O_DIRECT, as the arena does there. The fault rate goes to *FAULT_GBPS; returns the slower
 * of it and the read's, GB/s, or 0 when it could not run. */
static double probe_private(ferry *f, const ferry__iofile *file, uint64_t off, uint64_t len,
                            double *fault_gbps)
{
    *fault_gbps = 0;
    unsigned char *buf = ferry__map_aligned(len, FERRY__HUGE_PAGE, mmap, munmap);
    if (!buf)
        return 0;
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, (size_t)len, MADV_HUGEPAGE);
#endif
    double steps[FERRY__COLD_STEPS_MAX];
    size_t n = 0;
    for (uint64_t at = 0; at < len && n < FERRY__COLD_STEPS_MAX; at += FERRY__HUGE_PAGE, n++) {
        size_t part = (size_t)(len - at < FERRY__HUGE_PAGE ? len - at : FERRY__HUGE_PAGE);
        steps[n] = fault_step(buf + at, part);
    }
    /* the last step may be short: rated by the whole steps only, where there are any */
    size_t whole = len % FERRY__HUGE_PAGE && n > 1 ? n - 1 : n;
    uint64_t step = whole < n || len >= FERRY__HUGE_PAGE ? FERRY__HUGE_PAGE : len;
    double rate = ferry__cold_fault_rate(steps, whole, step);
    double t1 = ferry__now();
    ferry__err e[1];
    ferry__err_clear(e);
    int rc = ferry__read_at(f->io, file, off, len, buf, FERRY_LOAD_DIRECT, 0, e);
    double t2 = ferry__now();
    munmap(buf, (size_t)len);
    double read = t2 > t1 ? (double)len / (t2 - t1) : 0;
    double slower = rate < read ? rate : read;
    if (rc || slower <= 0)
        return 0;
    *fault_gbps = rate / 1e9;
    return slower / 1e9;
}

typedef struct map_part {
    pthread_t th;
    const ferry__iofile *file;
    uint64_t off, len;
    int started, failed, touch;
} map_part;

static void *map_part_run(void *arg)
{
    map_part *m = arg;
    if (!m->touch) {
        m->failed = ferry__populate_range(m->file, m->off, m->len) != 0;
        return NULL;
    }
    const volatile unsigned char *p = m->file->map + m->off;
    unsigned char acc = 0;
    for (uint64_t at = 0; at < m->len; at += PROBE_PAGE)
        acc ^= p[at]; /* volatile: each page's first touch happens */
    (void)acc;
    return NULL;
}

/* Runs PARTS page-aligned shares of [OFF, OFF+LEN) of FILE at once (populating them, or with
 * TOUCH reading a byte of each page): seconds, or -1 when a share failed. */
static double map_parts(const ferry__iofile *file, uint64_t off, uint64_t len, unsigned parts,
                        int touch)
{
    map_part m[PROBE_PARTS];
    uint64_t share = len / parts & ~(PROBE_PAGE - 1);
    double t0 = ferry__now();
    for (unsigned i = 0; i < parts; i++) {
        uint64_t o = off + share * i, n = i + 1 < parts ? share : len - share * i;
        m[i] = (map_part){.file = file, .off = o, .len = n, .touch = touch};
        m[i].started = i > 0 && pthread_create(&m[i].th, NULL, map_part_run, &m[i]) == 0;
    }
    int failed = 0;
    for (unsigned i = 0; i < parts; i++) {
        if (m[i].started)
            pthread_join(m[i].th, NULL);
        else
            map_part_run(&m[i]); /* the first share here, and any a thread was refused for */
        failed |= m[i].failed;
    }
    return failed ? -1 : ferry__now() - t0;
}

/* [OFF, OFF+LEN) of FILE brought into the page cache and mapped as a loader populates a tensor,
 * in PARTS shares at once, as that many loaders populate tensors side by side, and then read a
 * byte a page as an engine's first pass does, in as many shares: GB/s for the two, 0 when it could
 * not run. The first read of a page is not free where the host backs the page the disk's data
 * went to only when the guest first touches it (a VM: 0.6-1.5 s for 2 GiB here, while the
 * populate took 1.2 s). */
static double probe_map(const ferry__iofile *file, uint64_t off, uint64_t len, unsigned parts)
{
    parts = parts < 1 ? 1 : parts > PROBE_PARTS ? PROBE_PARTS : parts;
    double fill = map_parts(file, off, len, parts, 0);
    double touch = fill < 0 ? -1 : map_parts(file, off, len, parts, 1);
    double t = fill + touch;
    return fill >= 0 && touch >= 0 && t > 0 ? (double)len / t / 1e9 : 0;
}


/* The private probe where the host takes free 2 MiB blocks back: reads [OFF, OFF+LEN) of FILE
 * with O_DIRECT into fresh small pages as the arena does there (relayed where F relays), then
 * faults up to PROBE_FAULT_SMALL more of them in 2 MiB steps, each timed, ending early once
 * FERRY__COLD_SLOW_STEPS steps ran below FERRY__COLD_FAULT_OVER_FILL times the read.
 * The read comes first: it takes the pages freed a moment ago, which fault in fastest, and the
 * steps rate the memory a whole load meets (ferry__cold_slow_rate). *READ_GBPS and *FAULT_GBPS
 * get the two rates; returns the slower, GB/s, or 0 when it could not run. */
static double probe_small(ferry *f, const ferry__iofile *file, uint64_t off, uint64_t len,
                          double *read_gbps, double *fault_gbps)
{
    *read_gbps = *fault_gbps = 0;
    uint64_t at0 = (len + FERRY__HUGE_PAGE - 1) & ~(FERRY__HUGE_PAGE - 1);
    uint64_t total = at0 + PROBE_FAULT_SMALL;
    unsigned char *buf = ferry__map_aligned(total, FERRY__HUGE_PAGE, mmap, munmap);
    if (!buf)
        return 0;
    ferry__host_small_pages(buf, total);
    ferry__err e[1];
    ferry__err_clear(e);
    double t0 = ferry__now();
    int rc = ferry__read_at(f->io, file, off, len, buf, FERRY_LOAD_DIRECT, f->relay, e);
    double t1 = ferry__now();
    double read = !rc && t1 > t0 ? (double)len / (t1 - t0) : 0;
    double below = FERRY__COLD_FAULT_OVER_FILL * read;
    double steps[FERRY__COLD_STEPS_MAX];
    size_t n = 0, slow = 0;
    for (uint64_t at = at0; read > 0 && at < total && n < FERRY__COLD_STEPS_MAX &&
                            slow < FERRY__COLD_SLOW_STEPS;
         at += FERRY__HUGE_PAGE, n++) {
        steps[n] = fault_step(buf + at, (size_t)FERRY__HUGE_PAGE);
        slow += steps[n] * below > (double)FERRY__HUGE_PAGE;
    }
    munmap(buf, (size_t)total);
    double rate = n ? ferry__cold_slow_rate(steps, n, FERRY__HUGE_PAGE) : 0;
    if (read <= 0 || rate <= 0)
        return 0;
    *read_gbps = read / 1e9;
    *fault_gbps = rate / 1e9;
    return (rate < read ? rate : read) / 1e9;
}

/* Measures both ways on two neighbouring uncached ranges in the middle of [LO, HI) of FILE;
 * 0 when there is no room for them or they are cached. */
static int probe(ferry *f, const ferry__iofile *file, uint64_t lo, uint64_t hi)
{
    lo = (lo + PROBE_PAGE - 1) & ~(PROBE_PAGE - 1);
    hi &= ~(PROBE_PAGE - 1);
    if (!file->map || hi <= lo)
        return 0;
    uint64_t len = (hi - lo) / 2 & ~(PROBE_PAGE - 1);
    uint64_t lm = len > PROBE_MAP_MAX ? PROBE_MAP_MAX : len;
    uint64_t lp = len > PROBE_PRIVATE_MAX ? PROBE_PRIVATE_MAX : len;
    if (len < PROBE_MIN)
        return 0;
    uint64_t mid = (lo + (hi - lo) / 2) & ~(PROBE_PAGE - 1);
    uint64_t a = mid - lm, b = mid;
    if (ferry__iofile_cached(file, a, lm) > PROBE_COLD ||
        ferry__iofile_cached(file, b, lp) > PROBE_COLD)
        return 0;
    unsigned parts = f->jobs.n_loaders < PROBE_PARTS ? f->jobs.n_loaders : PROBE_PARTS;
    /* Where the host takes free 2 MiB blocks back (free page reporting), private copies live in
     * small pages (the arena's rule), and two things a short probe cannot see decide the race:
     * - the first 32 MiB a probe faults come from pages freed a moment ago, not yet handed back,
     *   while a whole model's copies meet memory the host backs again on first touch (a 2 GiB
     *   load at 0.54-0.60 GB/s after a probe that read 3.9-6.1, where the mapping filled at
     *   1.3-1.6). So the private probe faults 128 MiB there, rated by its slow steps, and ends
     *   once they show the mapping will win.
     * - the page cache's pages beyond those freed a moment ago are backed by the host as the disk's
     *   data lands in them, and mapped into the guest only at the engine's first touch: a whole
     *   2 GiB load's pages took 0.4-1.9 s to touch after a 1.2 s populate, its probe's 64 MiB
     *   2 ms. So the mapping's probe, its touch included, rates little more than its fill, and
     *   private copies win where fresh memory faults in at least FERRY__COLD_FAULT_OVER_FILL
     *   times as fast as the mapping fills: the faults then overlap the reads (bench/README.md).
     * The mapping runs first, so that the page cache takes any pages freed a moment ago ahead of
     * the private probe. */
    int dear = ferry__host_huge_pages_dear();
    double pm = 0, pp = 0, fault = 0, read = 0;
    if (dear) {
        /* Private copies there read through the I/O pool's relay readers, at the disk's own
         * rate, which the mapping's fill does not beat (it reads the same disk into the page
         * cache): where fresh memory faults in FERRY__COLD_FAULT_OVER_FILL times faster than
         * that read, private copies win without the mapping's probe, whose pages cost the load
         * their first touch. */
        pp = probe_small(f, file, b, lp, &read, &fault);
        if (pp > 0 && fault >= FERRY__COLD_FAULT_OVER_FILL * read) {
            f->cold.private_gbps = pp;
            f->cold.fault_gbps = fault;
            f->cold.read_gbps = read;
            f->cold.dear = dear;
            f->cold.map = 0;
            return 1;
        }
        pm = pp > 0 ? probe_map(file, a, lm, parts) : 0;
    } else {
        pm = probe_map(file, a, lm, parts);
        pp = pm > 0 ? probe_private(f, file, b, lp, &fault) : 0;
    }
    if (pm <= 0 || pp <= 0)
        return 0;
    f->cold.map_gbps = pm;
    f->cold.private_gbps = pp;
    f->cold.fault_gbps = fault;
    f->cold.read_gbps = read;
    f->cold.dear = dear;
    /* Near a tie the mapping: its probe's bytes are cached and serve the load, it keeps no
     * private memory, and its probe is the one a moment's stall of the host misleads (after the
     * page cache was dropped, populate once ran at 0.73 GB/s against 1.7 in the load itself).
     * Where its first touch is left out of its rate (dear), private copies near a tie. */
    if (dear)
        f->cold.map = fault < FERRY__COLD_FAULT_OVER_FILL * pm || pp < FERRY__COLD_MAP_TIE * pm;
    else
        f->cold.map = pm >= FERRY__COLD_MAP_TIE * pp;
    return 1;
}

void ferry__cold_init(ferry *f)
{
    const char *env = getenv("FERRY_AUTO_COLD");
    if (env && (!strcmp(env, "map") || !strcmp(env, "private"))) {
        f->cold.map = !strcmp(env, "map");
        f->cold.forced = 1;
        f->cold.decided = 1;
    }
}

void ferry__cold_decide(ferry *f, ferry_tensor *const *set, size_t n)
{
    if (f->cold.decided)
        return;
    /* the bytes bound to private copies because they are not cached, and the file holding the
     * largest of them, with the span of that file's */
    uint64_t bytes = 0, big = 0, lo = UINT64_MAX, hi = 0;
    const ferry__iofile *file = NULL;
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *t = set[i];
        if (!t->auto_private)
            continue;
        bytes += t->info.nbytes;
        if (t->info.nbytes > big) {
            big = t->info.nbytes;
            file = t->file;
        }
    }
    if (!bytes)
        return;
    /* from the set's first uncached tensor in that file to the file's end: the middle of what a
     * load of the whole model reads, away from what a first layer's prefetch touches */
    for (size_t i = 0; i < n; i++) {
        const ferry_tensor *t = set[i];
        if (t->auto_private && t->file == file)
            lo = t->info.offset < lo ? t->info.offset : lo;
    }
    hi = file->size;
    const char *env = getenv("FERRY_AUTO_COLD");
    if (bytes >= FERRY__COLD_PROBE_MIN || file->size >= FERRY__COLD_PROBE_MIN ||
        (env && !strcmp(env, "probe")))
        f->cold.decided = probe(f, file, lo, hi);
    if (!f->cold.decided || !f->cold.map)
        return;
    /* the set, and every tensor bound to a private copy not begun (a prefetch may have bound
     * some ahead of the set) */
    for (size_t i = 0; i < n; i++)
        if (set[i]->auto_private) {
            set[i]->auto_private = 0;
            set[i]->zero_copy = 1;
        }
    for (size_t i = 0; i < f->n_tensors; i++) {
        ferry_tensor *t = f->tensors[i];
        if (t->auto_private && t->comp.state == FERRY__EMPTY && t->host.state == FERRY__EMPTY) {
            t->auto_private = 0;
            t->zero_copy = 1;
        }
    }
}
