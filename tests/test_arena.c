/*
 * test_arena.c — group load arenas (src/core/arena.c; file_copy, arena_claim, arena_read,
 * arena_settle and bring in residency.c; FERRY_LOAD_AUTO's page-cache rule in policy.c).
 *
 * A group load with load DIRECT (or AUTO on data not in the page cache) lays the private host
 * copies of each dense run of neighbouring tensors of a file into one mapping, in file order, and
 * reads the run as one range. What is observable from outside: the bytes equal the file; the data
 * pointers of tensors in one arena differ exactly by their file offsets; two tensors that share a
 * file page can only keep that relation when they share an arena (separate buffers would overlap),
 * which tells a sparse run (no arena) from a dense one; the host accounting returns to what it was
 * when the copies go, and the last copy's release unmaps the arena. Also: AUTO maps what the page
 * cache holds (>= FERRY__AUTO_MAP_CACHED of a tensor's pages) and reads the rest, a file truncated
 * under an open manager, budgets, and a group load racing prepares and another group load.
 *
 * Section 7: regression tests, each of which fails on e39a4c2 and earlier: AUTO over
 * a host budget on a cold file falls back to the mapping; a failed read gives its copies' pages
 * back; budget holes do not fault in huge pages beyond what the budget counts; a one-shot phase
 * before a loop does not keep dead copies; an adapter added during an arena read is applied.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/core.h"
#include "devices/devices.h"
#include "model_fixture.h"

#define MIB (UINT64_C(1) << 20)

static char g_path[1200], g_trunc[1200];
static fixture_tensor g_ts[64];
static size_t g_n;
static uint64_t g_bytes; /* sum of the tensors' bytes */

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

static ferry_tensor_info info_of(const ferry_tensor *t)
{
    ferry_tensor_info info;
    memset(&info, 0, sizeof info);
    ferry_tensor_get_info(t, &info);
    return info;
}

static ferry_stats stats_of(const ferry *f)
{
    ferry_stats st;
    memset(&st, 0, sizeof st);
    ferry_get_stats(f, &st);
    return st;
}

/* How many of TS (prepared) hold exactly their bytes in the file. */
static size_t count_same(ferry *f, ferry_tensor *const *ts, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (fixture_same_as_file(f, ts[i]))
            k++;
        else
            fprintf(stderr, "  bytes differ from the file: %s\n", info_of(ts[i]).name);
    }
    return k;
}

/* 1 when the data pointers of prepared A and B differ by exactly their file offsets. */
static int keeps_offsets(const ferry_tensor *a, const ferry_tensor *b)
{
    const unsigned char *pa = ferry_tensor_data(a), *pb = ferry_tensor_data(b);
    ferry_tensor_info ia = info_of(a), ib = info_of(b);
    if (!pa || !pb)
        return 0;
    return (uintptr_t)pb - (uintptr_t)pa == ib.offset - ia.offset && ib.offset >= ia.offset;
}

/* Consecutive pairs of TS (prepared, in file order) whose pointers keep their file offsets. */
static size_t pairs_keeping_offsets(ferry_tensor *const *ts, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i + 1 < n; i++)
        k += keeps_offsets(ts[i], ts[i + 1]);
    return k;
}

/* Consecutive pairs of TS (prepared, in file order) whose bytes share a file page: *SHARED of
 * them, *KEEPING of those with pointers that keep the file offsets. Two private copies that share
 * a page keep the offsets only inside one arena: separate buffers, each holding its data at
 * offset % page, would overlap. */
static void page_sharing_pairs(ferry_tensor *const *ts, size_t n, size_t *shared, size_t *keeping)
{
    uint64_t pg = page_size();
    *shared = *keeping = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        ferry_tensor_info a = info_of(ts[i]), b = info_of(ts[i + 1]);
        if (!a.nbytes || !b.nbytes || (a.offset + a.nbytes - 1) / pg != b.offset / pg)
            continue;
        (*shared)++;
        *keeping += keeps_offsets(ts[i], ts[i + 1]);
    }
}

/* 1 when the page holding P is mapped in this process (mincore fails with ENOMEM otherwise). */
static int is_mapped(const void *p)
{
    uint64_t pg = page_size();
    unsigned char v;
    void *page = (void *)((uintptr_t)p & ~(uintptr_t)(pg - 1));
    if (mincore(page, (size_t)pg, &v) == 0)
        return 1;
    return errno == ENOMEM ? 0 : -1;
}

/* 1 when P lies in the file mapping of tensor T (zero-copy). */
static int in_file_map(const ferry_tensor *t, const void *p)
{
    const ferry__iofile *file = t->file;
    return p && file->map && (const unsigned char *)p >= file->map &&
           (const unsigned char *)p < file->map + file->size;
}

/* Fraction of each tensor's pages of PATH that are in the page cache, measured with our own
 * mapping (untouched, so measuring brings nothing in): FRAC[i] for TS[i]. -1 when unknown. */
static int cached_fractions(const char *path, ferry_tensor *const *ts, size_t n, double *frac)
{
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    uint64_t pg = page_size();
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        ferry_tensor_info info = info_of(ts[i]);
        uint64_t s = info.offset / pg * pg, e = (info.offset + info.nbytes + pg - 1) / pg * pg;
        size_t pages = (size_t)((e - s) / pg);
        unsigned char *vec = malloc(pages ? pages : 1);
        if (!vec || mincore((unsigned char *)m + s, (size_t)(e - s), vec) != 0) {
            rc = -1;
        } else {
            size_t in = 0;
            for (size_t k = 0; k < pages; k++)
                in += vec[k] & 1;
            frac[i] = pages ? (double)in / (double)pages : 1.0;
        }
        free(vec);
    }
    munmap(m, (size_t)sb.st_size);
    return rc;
}

/* Flushes PATH and asks the kernel to drop its pages from the page cache. */
static int drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 ? 0 : -1;
    close(fd);
    return rc;
}

/* Reads [off, off+len) of PATH with plain reads, readahead off (so only that range is cached). */
static int warm_range(const char *path, uint64_t off, uint64_t len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    unsigned char buf[65536];
    int rc = 0;
    for (uint64_t done = 0; done < len && !rc;) {
        size_t want = (size_t)(len - done < sizeof buf ? len - done : sizeof buf);
        ssize_t r = pread(fd, buf, want, (off_t)(off + done));
        if (r <= 0)
            rc = -1;
        else
            done += (uint64_t)r;
    }
    close(fd);
    return rc;
}

/* Gives PATH the times of ST again: a file rewritten whole is then what a manager opened (ferry
 * compares size, modification time and inode with what it opened). */
static int restore_times(const char *path, const struct stat *st)
{
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    return utimensat(AT_FDCWD, path, ts, 0);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* The tensors of TS whose names contain (WANT nonzero) or do not contain (WANT 0) NEEDLE, in
 * order, into OUT; their number. */
static size_t select_by_name(ferry_tensor *const *ts, size_t n, const char *needle, int want,
                             ferry_tensor **out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if ((strstr(info_of(ts[i]).name, needle) != NULL) == (want != 0))
            out[k++] = ts[i];
    return k;
}

/* The name between the first "tensor '" and the next quote of MSG, into NAME. */
static int named_tensor(const char *msg, char *name, size_t cap)
{
    const char *q = strstr(msg, "tensor '");
    if (!q)
        return 0;
    q += strlen("tensor '");
    const char *e = strchr(q, '\'');
    if (!e || (size_t)(e - q) >= cap)
        return 0;
    memcpy(name, q, (size_t)(e - q));
    name[e - q] = 0;
    return 1;
}

/* ---- 1. DIRECT: one arena for the whole (dense) model --------------------------------------- */

static void test_direct_arena(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts != NULL);
    CHECK_EQ_INT(n, g_n);
    if (!ts || n != g_n) {
        free(ts);
        ferry_destroy(f);
        return;
    }
    ferry_stats st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    int rc = ferry_load_group(f, "all");
    if (rc)
        fprintf(stderr, "load_group: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    st = stats_of(f);
    CHECK(st.bytes_read >= g_bytes);
    CHECK(st.resident_bytes[0] >= g_bytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK(st.peak_bytes[0] >= st.resident_bytes[0]);
    const uint64_t loaded = st.resident_bytes[0], read = st.bytes_read;

    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(count_same(f, ts, n), n);
    /* every tensor in one mapping at its file offset: the arena was used */
    CHECK_EQ_INT(pairs_keeping_offsets(ts, n), n - 1);
    size_t shared, keeping;
    page_sharing_pairs(ts, n, &shared, &keeping);
    CHECK(shared > 0);
    CHECK_EQ_INT(keeping, shared);
    for (size_t i = 0; i < n; i++)
        CHECK(!in_file_map(ts[i], ferry_tensor_data(ts[i])));
    /* prepare of home copies reads and allocates nothing */
    st = stats_of(f);
    CHECK_EQ_INT(st.bytes_read, read);
    CHECK_EQ_INT(st.resident_bytes[0], loaded);
    const unsigned char *first = ferry_tensor_data(ts[0]), *last = ferry_tensor_data(ts[n - 1]);
    CHECK_EQ_INT(is_mapped(first), 1);
    CHECK_EQ_INT(is_mapped(last), 1);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);

    /* loading again finds everything home */
    CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
    st = stats_of(f);
    CHECK_EQ_INT(st.bytes_read, read);
    CHECK_EQ_INT(st.resident_bytes[0], loaded);

    /* the copies go back through the arena's references: accounting to zero, mapping gone */
    CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
    st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    CHECK_EQ_INT(st.home_host_bytes, 0);
    CHECK_EQ_INT(is_mapped(first), 0);
    CHECK_EQ_INT(is_mapped(last), 0);
    free(ts);
    ferry_destroy(f);

    /* destroy with arena copies held (and prepared): everything freed (ASan), and a fresh
     * manager's group load (group NULL: all groups) is the same again */
    for (int rep = 0; rep < 2; rep++) {
        f = ferry_create(NULL);
        ts = fixture_open_all(f, g_path, &p, &n);
        CHECK(ts != NULL && n == g_n);
        if (!ts) {
            ferry_destroy(f);
            return;
        }
        CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
        st = stats_of(f);
        CHECK_EQ_INT(st.resident_bytes[0], loaded);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        CHECK_EQ_INT(pairs_keeping_offsets(ts, n), n - 1);
        if (rep == 1)
            CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        free(ts);
        ferry_destroy(f);
    }
}

/* ---- 2. AUTO: private copies (an arena) for what is not cached, the mapping for what is ----- */

static void test_auto(void)
{
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_AUTO};
    double *frac = calloc(g_n, sizeof *frac);
    CHECK(frac != NULL);
    if (!frac)
        return;

    /* cold: every tensor mostly out of the page cache */
    ferry *f = ferry_create(NULL);
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts != NULL && n == g_n);
    CHECK_EQ_INT(drop_cache(g_path), 0);
    double hi = 1.0;
    if (ts && cached_fractions(g_path, ts, n, frac) == 0) {
        hi = 0;
        for (size_t i = 0; i < n; i++)
            hi = frac[i] > hi ? frac[i] : hi;
    }
    if (!ts || hi >= FERRY__AUTO_MAP_CACHED) {
        printf("test_auto: cold part skipped: after POSIX_FADV_DONTNEED the kernel still caches "
               "%.0f%% of a tensor's pages\n", hi * 100);
    } else {
        ferry_placement *pl = NULL;
        size_t np = 0;
        ferry_plan_totals tot;
        CHECK_EQ_INT(ferry_plan(f, &pl, &np, &tot), 0);
        CHECK_EQ_INT(np, n);
        size_t zc = 0;
        for (size_t i = 0; pl && i < np; i++) {
            zc += pl[i].zero_copy != 0;
            CHECK(pl[i].home_bytes >= info_of(ts[i]).nbytes);
        }
        free(pl);
        CHECK_EQ_INT(zc, 0);
        CHECK_EQ_INT(tot.mapped_bytes, 0);
        CHECK(tot.host_bytes >= g_bytes);
        int rc = ferry_load_group(f, "all");
        if (rc)
            fprintf(stderr, "load_group (auto, cold): %s\n", ferry_errmsg(f));
        CHECK_EQ_INT(rc, 0);
        ferry_stats st = stats_of(f);
        CHECK(st.bytes_read >= g_bytes);
        CHECK(st.resident_bytes[0] >= g_bytes);
        CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        CHECK_EQ_INT(pairs_keeping_offsets(ts, n), n - 1); /* one arena */
        size_t in_map = 0;
        for (size_t i = 0; i < n; i++)
            in_map += (size_t)in_file_map(ts[i], ferry_tensor_data(ts[i]));
        CHECK_EQ_INT(in_map, 0);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
        CHECK_EQ_INT(stats_of(f).resident_bytes[0], 0);
    }
    free(ts);
    ferry_destroy(f);

    /* warm: the whole file read first; a fresh manager maps everything */
    CHECK_EQ_INT(warm_range(g_path, 0, file_size(g_path)), 0);
    f = ferry_create(NULL);
    ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts != NULL && n == g_n);
    double lo = 0;
    if (ts && cached_fractions(g_path, ts, n, frac) == 0) {
        lo = 1;
        for (size_t i = 0; i < n; i++)
            lo = frac[i] < lo ? frac[i] : lo;
    }
    if (!ts || lo < FERRY__AUTO_MAP_CACHED) {
        printf("test_auto: warm part skipped: after reading the file only %.0f%% of a tensor's "
               "pages are cached\n", lo * 100);
    } else {
        ferry_placement *pl = NULL;
        size_t np = 0;
        ferry_plan_totals tot;
        CHECK_EQ_INT(ferry_plan(f, &pl, &np, &tot), 0);
        CHECK_EQ_INT(np, n);
        size_t zc = 0;
        for (size_t i = 0; pl && i < np; i++)
            zc += pl[i].zero_copy != 0;
        free(pl);
        CHECK_EQ_INT(zc, n);
        CHECK_EQ_INT(tot.mapped_bytes, g_bytes);
        CHECK_EQ_INT(tot.host_bytes, 0);
        CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        CHECK_EQ_INT(pairs_keeping_offsets(ts, n), n - 1); /* the mapping keeps them too */
        size_t in_map = 0;
        for (size_t i = 0; i < n; i++)
            in_map += (size_t)(ferry_tensor_data(ts[i]) ==
                               (const void *)(ts[i]->file->map + info_of(ts[i]).offset));
        CHECK_EQ_INT(in_map, n);
        ferry_stats st = stats_of(f);
        CHECK_EQ_INT(st.resident_bytes[0], 0);
        CHECK_EQ_INT(st.home_host_bytes, 0);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    }
    free(ts);
    ferry_destroy(f);

    /* mixed: every other layer cached. Each tensor is mapped exactly when at least half its
     * pages are cached (measured here, before binding), the rest read into arenas. */
    f = ferry_create(NULL);
    ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts != NULL && n == g_n);
    int ok = ts && drop_cache(g_path) == 0;
    for (size_t i = 0; ok && i < n; i++) {
        ferry_tensor_info info = info_of(ts[i]);
        if (strncmp(info.name, "blk.1.", 6) == 0 || strncmp(info.name, "output", 6) == 0)
            ok = warm_range(g_path, info.offset, info.nbytes) == 0;
    }
    ok = ok && cached_fractions(g_path, ts, n, frac) == 0;
    size_t want_mapped = 0, want_private = 0;
    for (size_t i = 0; ok && i < n; i++) {
        want_mapped += frac[i] >= FERRY__AUTO_MAP_CACHED;
        want_private += frac[i] < FERRY__AUTO_MAP_CACHED;
    }
    if (!ok || !want_mapped || !want_private) {
        printf("test_auto: mixed part skipped: the page cache did not keep a mix (%zu cached, "
               "%zu not)\n", want_mapped, want_private);
    } else {
        ferry_placement *pl = NULL;
        size_t np = 0;
        CHECK_EQ_INT(ferry_plan(f, &pl, &np, NULL), 0);
        CHECK_EQ_INT(np, n);
        size_t agree = 0;
        for (size_t i = 0; pl && i < np && i < n; i++)
            agree += (pl[i].zero_copy != 0) == (frac[i] >= FERRY__AUTO_MAP_CACHED);
        free(pl);
        CHECK_EQ_INT(agree, n);
        CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        size_t placed_right = 0;
        uint64_t private_bytes = 0;
        for (size_t i = 0; i < n; i++) {
            int mapped = in_file_map(ts[i], ferry_tensor_data(ts[i]));
            placed_right += mapped == (frac[i] >= FERRY__AUTO_MAP_CACHED);
            if (!mapped)
                private_bytes += info_of(ts[i]).nbytes;
        }
        CHECK_EQ_INT(placed_right, n);
        ferry_stats st = stats_of(f);
        CHECK(st.resident_bytes[0] >= private_bytes);
        CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
        CHECK_EQ_INT(stats_of(f).resident_bytes[0], 0);
    }
    free(ts);
    ferry_destroy(f);
    free(frac);
}

/* ---- 3. a file truncated under an open manager (DIRECT only: a mapping would SIGBUS) -------- */

static void test_truncated(void)
{
    uint64_t size = file_size(g_trunc);
    unsigned char *orig = fixture_pread(g_trunc, 0, size);
    CHECK(size > 0 && orig != NULL);
    if (!orig)
        return;
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_trunc, &p, &n);
    CHECK(ts != NULL && n == g_n);
    if (!ts) {
        free(orig);
        ferry_destroy(f);
        return;
    }
    struct stat opened;
    CHECK_EQ_INT(stat(g_trunc, &opened), 0);
    CHECK_EQ_INT(truncate(g_trunc, (off_t)(size / 2)), 0);

    int rc = ferry_load_group(f, "all");
    CHECK(rc < 0);
    CHECK(rc == FERRY_ECHANGED || rc == FERRY_EIO || rc == FERRY_ETRUNC || rc == FERRY_ERANGE);
    char msg[1024]; /* a copy: the lookups below may replace the manager's message */
    snprintf(msg, sizeof msg, "%s", ferry_errmsg(f));
    char name[256] = "";
    CHECK(strstr(msg, g_trunc) != NULL);
    CHECK(named_tensor(msg, name, sizeof name));
    CHECK(ferry_find(f, name) != NULL);
    if (!strstr(msg, g_trunc) || !ferry_find(f, name))
        fprintf(stderr, "message: %s\n", msg);
    /* the whole run failed as one read: nothing is held, nothing counted */
    ferry_stats st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    CHECK_EQ_INT(st.home_host_bytes, 0);
    for (size_t i = 0; i < n; i++)
        CHECK(ferry_tensor_data(ts[i]) == NULL);

    /* per tensor: the last one lies past the new end and fails naming itself; so does the first
     * one, still whole: its file is no longer the one opened */
    ferry_tensor *lastt = ts[n - 1], *firstt = ts[0];
    rc = ferry_prepare(f, &lastt, 1);
    CHECK(rc < 0);
    if (rc == 0) {
        ferry_release(f, &lastt, 1);
    } else {
        snprintf(msg, sizeof msg, "%s", ferry_errmsg(f));
        CHECK(strstr(msg, g_trunc) != NULL);
        CHECK(strstr(msg, info_of(lastt).name) != NULL);
        if (!strstr(msg, info_of(lastt).name))
            fprintf(stderr, "prepare of %s past the end: \"%s\"\n", info_of(lastt).name, msg);
    }
    CHECK(ferry_tensor_data(lastt) == NULL);
    CHECK_EQ_INT(ferry_prepare(f, &firstt, 1), FERRY_ECHANGED);
    st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);

    /* the same file (same inode, size and times) whole again: the same manager loads it */
    int fd = open(g_trunc, O_WRONLY);
    int wrote = 0;
    if (fd >= 0) {
        uint64_t done = 0;
        while (done < size) {
            ssize_t w = pwrite(fd, orig + done, (size_t)(size - done), (off_t)done);
            if (w <= 0)
                break;
            done += (uint64_t)w;
        }
        wrote = done == size && fsync(fd) == 0;
        close(fd);
    }
    CHECK(wrote);
    CHECK_EQ_INT(restore_times(g_trunc, &opened), 0);
    rc = ferry_load_group(f, "all");
    if (rc)
        fprintf(stderr, "load_group after the rewrite: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(count_same(f, ts, n), n);
    /* the others form the new arena */
    CHECK_EQ_INT(pairs_keeping_offsets(ts + 1, n - 1), n - 2);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] >= g_bytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
    CHECK_EQ_INT(stats_of(f).resident_bytes[0], 0);
    free(ts);
    ferry_destroy(f);
    free(orig);
}

/* ---- 4. budgets -------------------------------------------------------------------------- */

/* Two groups, each a contiguous half of the file: "front" (token_embd, blk.0) and "back". */
static ferry *open_halves(const ferry_options *o)
{
    ferry *f = ferry_create(o);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    if (!f || ferry_open(f, g_path, NULL) || ferry_group_add(f, "back", "blk.1.*", &p) ||
        ferry_group_add(f, "back", "output*", &p) || ferry_group_add(f, "front", "*", &p)) {
        fprintf(stderr, "open_halves: %s\n", f ? ferry_errmsg(f) : "no manager");
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

static int in_back(const ferry_tensor *t)
{
    const char *nm = info_of(t).name;
    return strncmp(nm, "blk.1.", 6) == 0 || strncmp(nm, "output", 6) == 0;
}

static void test_budget(void)
{
    const uint64_t budget = 3 * MIB;
    ferry_options o = {.host_budget = budget};
    ferry *f = open_halves(&o);
    CHECK(f != NULL);
    if (!f)
        return;
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    ferry_tensor **front = calloc(n ? n : 1, sizeof *front), **back = calloc(n ? n : 1, sizeof *back);
    size_t nf = 0, nb = 0;
    uint64_t front_bytes = 0, back_bytes = 0;
    for (size_t i = 0; ts && front && back && i < n; i++) {
        if (in_back(ts[i])) {
            back[nb++] = ts[i];
            back_bytes += info_of(ts[i]).nbytes;
        } else {
            front[nf++] = ts[i];
            front_bytes += info_of(ts[i]).nbytes;
        }
    }
    /* each half fits (with page headroom), the model does not */
    CHECK(front_bytes + 64 * 4096 < budget && back_bytes + 64 * 4096 < budget);
    CHECK(g_bytes > budget);

    /* the whole model: EBUDGET with a message; never over the budget; accounting consistent */
    int rc = ferry_load_group(f, NULL);
    CHECK_EQ_INT(rc, FERRY_EBUDGET);
    char msg[1024]; /* a copy: the lookup below may replace the manager's message */
    snprintf(msg, sizeof msg, "%s", ferry_errmsg(f));
    CHECK(strstr(msg, "budget") != NULL);
    char name[256] = "";
    CHECK(named_tensor(msg, name, sizeof name) && ferry_find(f, name) != NULL);
    if (rc != FERRY_EBUDGET || !strstr(msg, "budget"))
        fprintf(stderr, "load_group over budget: %d %s\n", rc, msg);
    ferry_stats st = stats_of(f);
    CHECK(st.resident_bytes[0] <= budget);
    CHECK(st.peak_bytes[0] <= budget);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    /* removing both groups gives back every copy the failed load made */
    CHECK_EQ_INT(ferry_group_remove(f, "back"), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "front"), 0);
    st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    CHECK_EQ_INT(st.home_host_bytes, 0);
    ferry_destroy(f);
    free(ts), free(front), free(back);

    /* half by half: front fits in one arena; back does not fit beside it; without front it does */
    f = open_halves(&o);
    CHECK(f != NULL);
    if (!f)
        return;
    ts = fixture_all_tensors(f, &n);
    front = calloc(n ? n : 1, sizeof *front);
    back = calloc(n ? n : 1, sizeof *back);
    nf = nb = 0;
    for (size_t i = 0; ts && front && back && i < n; i++) {
        if (in_back(ts[i]))
            back[nb++] = ts[i];
        else
            front[nf++] = ts[i];
    }
    CHECK(nf >= 2 && nb >= 2);
    rc = ferry_load_group(f, "front");
    if (rc)
        fprintf(stderr, "load_group front: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_prepare(f, front, nf), 0);
    CHECK_EQ_INT(count_same(f, front, nf), nf);
    CHECK_EQ_INT(pairs_keeping_offsets(front, nf), nf - 1);
    CHECK_EQ_INT(ferry_release(f, front, nf), 0);
    CHECK(stats_of(f).resident_bytes[0] <= budget);

    CHECK_EQ_INT(ferry_load_group(f, "back"), FERRY_EBUDGET);
    CHECK(strstr(ferry_errmsg(f), "budget") != NULL);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] <= budget);
    CHECK(st.peak_bytes[0] <= budget);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);

    CHECK_EQ_INT(ferry_group_remove(f, "front"), 0);
    rc = ferry_load_group(f, "back");
    if (rc)
        fprintf(stderr, "load_group back: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_prepare(f, back, nb), 0);
    CHECK_EQ_INT(count_same(f, back, nb), nb);
    CHECK_EQ_INT(ferry_release(f, back, nb), 0);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] <= budget);
    CHECK(st.peak_bytes[0] <= budget);
    CHECK(st.resident_bytes[0] >= back_bytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK_EQ_INT(ferry_group_remove(f, "back"), 0);
    CHECK_EQ_INT(stats_of(f).resident_bytes[0], 0);
    ferry_destroy(f);
    free(ts), free(front), free(back);
}

/* ---- 5. sparse runs: groups whose tensors alternate in the file ------------------------------ */

static void test_sparse(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "attn", "*attn*", &p), 0);
    CHECK_EQ_INT(ferry_group_add(f, "rest", "*", &p), 0);
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    ferry_tensor **attn = calloc(n ? n : 1, sizeof *attn), **rest = calloc(n ? n : 1, sizeof *rest);
    CHECK(ts && attn && rest && n == g_n);
    if (!ts || !attn || !rest) {
        free(ts), free(attn), free(rest);
        ferry_destroy(f);
        return;
    }
    size_t na = select_by_name(ts, n, "attn", 1, attn);
    size_t nr = select_by_name(ts, n, "attn", 0, rest);
    CHECK(na >= 4 && nr >= 4);

    /* attn tensors cover about a third of their span: no arena, a buffer each */
    int rc = ferry_load_group(f, "attn");
    if (rc)
        fprintf(stderr, "load_group attn: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    ferry_stats st = stats_of(f);
    uint64_t attn_bytes = 0;
    for (size_t i = 0; i < na; i++)
        attn_bytes += info_of(attn[i]).nbytes;
    CHECK(st.bytes_read >= attn_bytes);
    CHECK(st.bytes_read < g_bytes); /* the other group's bytes in between were not read */
    CHECK(st.resident_bytes[0] >= attn_bytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK_EQ_INT(ferry_prepare(f, attn, na), 0);
    CHECK_EQ_INT(count_same(f, attn, na), na);
    size_t shared, keeping;
    page_sharing_pairs(attn, na, &shared, &keeping);
    CHECK(shared > 0);       /* attn_norm shares a page with attn_q */
    CHECK_EQ_INT(keeping, 0); /* ... but they are in separate buffers */
    /* the other group is untouched */
    for (size_t i = 0; i < nr; i++)
        CHECK_EQ_INT(rest[i]->comp.state, FERRY__EMPTY);
    CHECK_EQ_INT(ferry_release(f, attn, na), 0);

    /* the rest (also sparse: the attn tensors lie between) loads beside it */
    CHECK_EQ_INT(ferry_load_group(f, "rest"), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(count_same(f, ts, n), n);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] >= g_bytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK_EQ_INT(ferry_group_remove(f, "attn"), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "rest"), 0);
    CHECK_EQ_INT(stats_of(f).resident_bytes[0], 0);
    ferry_destroy(f);

    /* the dense counterpart: one layer's tensors, contiguous in the file, share an arena */
    f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "blk0", "blk.0.*", &p), 0);
    ferry_tensor **all = fixture_all_tensors(f, &n);
    size_t nl = all ? select_by_name(all, n, "blk.0.", 1, attn) : 0;
    CHECK_EQ_INT(nl, 5);
    CHECK_EQ_INT(ferry_load_group(f, "blk0"), 0);
    CHECK_EQ_INT(ferry_prepare(f, attn, nl), 0);
    CHECK_EQ_INT(count_same(f, attn, nl), nl);
    CHECK_EQ_INT(pairs_keeping_offsets(attn, nl), nl - 1);
    page_sharing_pairs(attn, nl, &shared, &keeping);
    CHECK(shared > 0);
    CHECK_EQ_INT(keeping, shared);
    CHECK_EQ_INT(ferry_release(f, attn, nl), 0);
    free(all);
    ferry_destroy(f);
    free(ts), free(attn), free(rest);
}

/* ---- 6. a group load racing prepares of its tensors, and another group load ---------------- */

typedef struct race_arg {
    ferry *f;
    pthread_barrier_t *go;
    int mode;               /* 0: load the group; 1: prepare SOME, check, release */
    unsigned delay_us;
    ferry_tensor *some[3];
    int rc, rc_release;
    int same;               /* prepared tensors that matched the file */
    int data_null;          /* prepared tensors without a data pointer */
} race_arg;

static void *race_main(void *arg)
{
    race_arg *a = arg;
    pthread_barrier_wait(a->go);
    if (a->delay_us)
        usleep(a->delay_us);
    if (a->mode == 0) {
        a->rc = ferry_load_group(a->f, "all");
        return NULL;
    }
    a->rc = ferry_prepare(a->f, a->some, 3);
    if (a->rc == 0) {
        for (int i = 0; i < 3; i++) {
            a->data_null += ferry_tensor_data(a->some[i]) == NULL;
            a->same += fixture_same_as_file(a->f, a->some[i]);
        }
        a->rc_release = ferry_release(a->f, a->some, 3);
    }
    return NULL;
}

/* Joins TH, waiting at most SECONDS (three times that under sanitizers); a thread still running
 * then is stuck for good (a deadlock): the manager's tensor states are printed and the run ends
 * as failed, as nothing stuck can be cleaned up. */
static void join_or_die(pthread_t th, ferry *f, int seconds, const char *what)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += SANITIZED ? 3 * seconds : seconds;
    int rc = pthread_timedjoin_np(th, NULL, &until);
    if (rc == 0)
        return;
    fprintf(stderr, "%s: a thread is stuck (%s)\n", what, strerror(rc));
    if (pthread_mutex_trylock(&f->lock) == 0) { /* a thread stuck holding it would hang us */
        fprintf(stderr, "  last error: %s\n  tensor states:\n", ferry_errmsg(f));
        for (size_t i = 0; i < f->n_tensors; i++) {
            const ferry_tensor *t = f->tensors[i];
            fprintf(stderr, "  %s: comp %d host %d arena_copy %d\n", t->info.name,
                    (int)t->comp.state, (int)t->host.state, t->arena_copy);
        }
        pthread_mutex_unlock(&f->lock);
    } else {
        fprintf(stderr, "  (the manager's lock is held)\n");
    }
    CHECK(!"deadlock");
    int status = check_finish();
    fflush(stdout);
    fflush(stderr);
    _exit(status);
}

static void test_concurrent(void)
{
    static const unsigned delays[] = {0, 300, 1500, 0, 200, 3000};
    for (int rep = 0; rep < 6; rep++) {
        ferry *f = ferry_create(NULL);
        ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
        size_t n = 0;
        ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
        CHECK(ts != NULL && n == g_n);
        if (!ts) {
            ferry_destroy(f);
            return;
        }
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, 2);
        /* reps 0-2: a load against prepares (which start a little later or not);
         * reps 3-5: two group loads of the same group */
        race_arg a = {.f = f, .go = &go, .mode = 0};
        race_arg b = {.f = f, .go = &go, .mode = rep < 3 ? 1 : 0, .delay_us = delays[rep],
                      .some = {ts[1], ts[n / 2], ts[n - 1]}};
        pthread_t ta, tb;
        int started_a = pthread_create(&ta, NULL, race_main, &a) == 0;
        int started_b = started_a && pthread_create(&tb, NULL, race_main, &b) == 0;
        CHECK(started_a && started_b);
        if (!started_b) {
            /* the barrier would never open: run the other side here */
            if (started_a) {
                race_arg c = b;
                c.mode = 1;
                c.delay_us = 0;
                race_main(&c);
                pthread_join(ta, NULL);
            }
        } else {
            join_or_die(ta, f, 10, "test_concurrent");
            join_or_die(tb, f, 10, "test_concurrent");
        }
        pthread_barrier_destroy(&go);
        if (a.rc || b.rc)
            fprintf(stderr, "rep %d: load %d, other %d: %s\n", rep, a.rc, b.rc,
                    ferry_errmsg(f));
        CHECK_EQ_INT(a.rc, 0);
        CHECK_EQ_INT(b.rc, 0);
        if (b.mode == 1) {
            CHECK_EQ_INT(b.same, 3);
            CHECK_EQ_INT(b.data_null, 0);
            CHECK_EQ_INT(b.rc_release, 0);
        }
        /* whatever the interleaving: every tensor home, once, with the right bytes */
        ferry_stats st = stats_of(f);
        CHECK(st.resident_bytes[0] >= g_bytes);
        CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        CHECK_EQ_INT(ferry_group_remove(f, "all"), 0);
        st = stats_of(f);
        CHECK_EQ_INT(st.resident_bytes[0], 0);
        CHECK_EQ_INT(st.home_host_bytes, 0);
        free(ts);
        ferry_destroy(f);
    }
}

/* ---- 7. regressions (each fails on e39a4c2 and earlier) ------------------------------------ */

static char g_big[1200], g_lora[1200];
static int g_big_ok = -1; /* g_big written: 1, failed: 0, not yet: -1 */

/* A larger model for the tests that measure resident memory: about 28 MiB of f32, one dense
 * run: token_embd 2 MB, four layers of 6 MiB (attn_norm 2 KiB, attn_q and attn_k 1 MiB each,
 * ffn_up and ffn_down 2 MiB each), output_norm 2 KiB, output 2 MB. Written on first use. */
static int big_model(void)
{
    if (g_big_ok < 0) {
        fixture_tensor ts[64];
        size_t n = fixture_layout(ts, 4, 512, 1024, 1000, FERRY_DTYPE_F32, 0);
        g_big_ok = fixture_write(g_big, FERRY_FORMAT_GGUF, ts, n) == 0;
    }
    CHECK(g_big_ok == 1);
    return g_big_ok == 1;
}

/* The address ranges of the large anonymous mappings that exist before the first test runs: in a
 * sanitizer build, the runtime's shadow memory and allocator space (terabytes, reserved at start
 * and faulted in as the program touches its own memory); in a plain build, none. */
#define RESERVED_MAX 64
static uintptr_t g_reserved[RESERVED_MAX][2];
static size_t g_nreserved;

/* Calls FN(lo, hi, anon_kib, arg) for each mapping in /proc/self/smaps (anon_kib: its
 * "Anonymous:" line, in KiB; pathless: 1 when the mapping names no file). -1 when unreadable. */
static int smaps_each(void (*fn)(uintptr_t, uintptr_t, int, long long, void *), void *arg)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp)
        return -1;
    char line[1200];
    uintptr_t lo = 0, hi = 0;
    int have = 0, pathless = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long a, b;
        long long kib;
        char path[1024] = "";
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %1023s", &a, &b, path) >= 2 &&
            strchr(line, '-') < strchr(line, ' ')) {
            lo = (uintptr_t)a, hi = (uintptr_t)b, have = 1;
            pathless = path[0] == 0 || path[0] == '[';
        } else if (have && sscanf(line, "Anonymous: %lld kB", &kib) == 1) {
            fn(lo, hi, pathless, kib, arg);
        }
    }
    fclose(fp);
    return 0;
}

static void note_reserved(uintptr_t lo, uintptr_t hi, int pathless, long long kib, void *arg)
{
    (void)kib, (void)arg;
    if (pathless && hi - lo >= (UINT64_C(1) << 30) && g_nreserved < RESERVED_MAX) {
        g_reserved[g_nreserved][0] = lo;
        g_reserved[g_nreserved][1] = hi;
        g_nreserved++;
    }
}

static void add_unreserved(uintptr_t lo, uintptr_t hi, int pathless, long long kib, void *arg)
{
    (void)pathless;
    for (size_t i = 0; i < g_nreserved; i++)
        if (lo < g_reserved[i][1] && hi > g_reserved[i][0])
            return;
    *(long long *)arg += kib;
}

/* Records the sanitizer runtime's reservations; called first thing in main. */
static void reserved_init(void)
{
    if (smaps_each(note_reserved, NULL) == 0 && SANITIZED)
        fprintf(stderr, "anonymous memory is measured outside the %zu large mappings the "
                        "sanitizer runtime made before main (its shadow and heap)\n",
                g_nreserved);
}

/* Bytes of anonymous memory resident in this process outside the ranges reserved_init found: the
 * sum of /proc/self/smaps' "Anonymous" (in a plain build, what smaps_rollup says); -1 when it
 * cannot be read. Memory the sanitizer's allocator hands out is not counted, but ferry maps its
 * host copies and arenas itself, so those are. */
/* Bytes of relay slots F's relay readers hold (ferry_get_io_settings). */
static uint64_t relay_bytes(const ferry *f)
{
    ferry_io_settings io;
    return ferry_get_io_settings(f, &io) == 0 ? io.relay_bytes : 0;
}

static int64_t anon_resident(void)
{
    long long kib = 0;
    if (smaps_each(add_unreserved, &kib) < 0)
        return -1;
    return (int64_t)kib * 1024;
}

/* Resident bytes of the whole pages inside [P, P+N) (mincore: the range must be mapped);
 * UINT64_MAX when mincore fails. */
static uint64_t resident_in(const void *p, uint64_t n)
{
    uint64_t pg = page_size();
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (!p || hi <= lo)
        return 0;
    size_t pages = (size_t)((hi - lo) / pg);
    unsigned char *v = malloc(pages);
    uint64_t k = UINT64_MAX;
    if (v && mincore((void *)lo, hi - lo, v) == 0) {
        k = 0;
        for (size_t i = 0; i < pages; i++)
            k += (uint64_t)(v[i] & 1) * pg;
    }
    free(v);
    return k;
}

/* Writes N bytes of DATA over PATH from offset 0 (same inode) and syncs; 0 on success. */
static int rewrite_file(const char *path, const unsigned char *data, uint64_t n)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        return -1;
    uint64_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(fd, data + done, (size_t)(n - done), (off_t)done);
        if (w <= 0)
            break;
        done += (uint64_t)w;
    }
    int ok = done == n && fsync(fd) == 0;
    close(fd);
    return ok ? 0 : -1;
}

/* Load AUTO on a cold file, host budget smaller than the model. AUTO reads a private copy
 * only because the bytes are not cached; one the budget has no room for is served by the
 * mapping, as it would have been were the bytes cached. So the group load and the prepare
 * succeed (not FERRY_EBUDGET), the private copies stay within the budget, and the
 * successful call leaves no budget message behind. Part 0 is a group load then a prepare; part 1
 * a prepare alone (jobs, no arena). */
static void test_auto_over_budget(void)
{
    const uint64_t budget = 2 * MIB;
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_AUTO};
    double *frac = calloc(g_n, sizeof *frac);
    CHECK(frac != NULL);
    CHECK(g_bytes > 2 * budget);
    for (int part = 0; frac && part < 2; part++) {
        ferry_options o = {.host_budget = budget};
        ferry *f = ferry_create(&o);
        size_t n = 0;
        ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
        CHECK(ts != NULL && n == g_n);
        double hi = 1.0;
        if (ts && n == g_n && drop_cache(g_path) == 0 &&
            cached_fractions(g_path, ts, n, frac) == 0) {
            hi = 0;
            for (size_t i = 0; i < n; i++)
                hi = frac[i] > hi ? frac[i] : hi;
        }
        if (!ts || n != g_n || hi >= FERRY__AUTO_MAP_CACHED) {
            printf("test_auto_over_budget: part %d skipped: after POSIX_FADV_DONTNEED the kernel "
                   "still caches %.0f%% of a tensor's pages\n", part, hi * 100);
            free(ts);
            ferry_destroy(f);
            continue;
        }
        int rc = 0;
        if (part == 0) {
            rc = ferry_load_group(f, "all");
            if (rc)
                fprintf(stderr, "load_group (auto, cold, over budget): %s\n", ferry_errmsg(f));
            CHECK_EQ_INT(rc, 0);
            CHECK(strstr(ferry_errmsg(f), "budget") == NULL);
        }
        rc = ferry_prepare(f, ts, n);
        if (rc)
            fprintf(stderr, "prepare (auto, cold, over budget, part %d): %s\n", part,
                    ferry_errmsg(f));
        CHECK_EQ_INT(rc, 0);
        CHECK(strstr(ferry_errmsg(f), "budget") == NULL);
        if (rc == 0) {
            CHECK_EQ_INT(count_same(f, ts, n), n);
            size_t mapped = 0;
            uint64_t private_bytes = 0;
            for (size_t i = 0; i < n; i++) {
                if (in_file_map(ts[i], ferry_tensor_data(ts[i])))
                    mapped++;
                else
                    private_bytes += info_of(ts[i]).nbytes;
            }
            CHECK(mapped > 0);
            CHECK(private_bytes <= budget);
            /* the plan says what happened: zero-copy exactly for the tensors in the mapping */
            ferry_placement *pl = NULL;
            size_t np = 0;
            CHECK_EQ_INT(ferry_plan(f, &pl, &np, NULL), 0);
            CHECK_EQ_INT(np, n);
            size_t agree = 0;
            for (size_t i = 0; pl && i < np && i < n; i++)
                agree += (pl[i].zero_copy != 0) ==
                         (in_file_map(ts[i], ferry_tensor_data(ts[i])) != 0);
            free(pl);
            CHECK_EQ_INT(agree, n);
            ferry_stats st = stats_of(f);
            CHECK(st.resident_bytes[0] <= budget);
            CHECK(st.peak_bytes[0] <= budget);
            CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
            CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        }
        free(ts);
        ferry_destroy(f);
    }
    free(frac);
}

/* A read that fails in the middle of a group load (the file shrank after open) while the
 * arena's other read succeeds. The copies the failed read was to fill are given back with their
 * pages, including those its successful chunks had written (and the toucher had faulted in),
 * which would otherwise stay resident as long as the other read's copies keep the arena: memory
 * no budget counts. Afterwards, with the file whole again, the same manager loads everything. */
static void test_failed_read_pages(void)
{
    if (!big_model())
        return;
    uint64_t size = file_size(g_big);
    unsigned char *orig = fixture_pread(g_big, 0, size);
    CHECK(size > 0 && orig != NULL);
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = orig ? fixture_open_all(f, g_big, &p, &n) : NULL;
    ferry_tensor *emb = ferry_find(f, "token_embd.weight"), *q = ferry_find(f, "blk.0.attn_q.weight");
    ferry_tensor *hole = ferry_find(f, "blk.0.attn_k.weight");
    ferry_tensor *up = ferry_find(f, "blk.0.ffn_up.weight"), *out = ferry_find(f, "output.weight");
    CHECK(ts && emb && q && hole && up && out);
    if (!ts || !emb || !q || !hole || !up || !out) {
        free(ts), free(orig);
        ferry_destroy(f);
        return;
    }
    /* blk.0.attn_k loaded first, into a buffer of its own: the group load's arena then has two
     * reads, token_embd..blk.0.attn_q and blk.0.ffn_up..output */
    CHECK_EQ_INT(ferry_prepare(f, &hole, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &hole, 1), 0);
    ferry_tensor_info ie = info_of(emb), ih = info_of(hole), iu = info_of(up), io = info_of(out);
    /* the file now ends 1 MiB into output.weight: the second read fails after most of its
     * 24 MiB have been read */
    struct stat opened;
    CHECK_EQ_INT(stat(g_big, &opened), 0);
    CHECK_EQ_INT(truncate(g_big, (off_t)((io.offset + MIB) & ~UINT64_C(4095))), 0);
    uint64_t relayed = relay_bytes(f);
    int64_t before = anon_resident();
    int rc = ferry_load_group(f, "all");
    /* less the relay readers' slots, mapped by the load's first relayed read */
    int64_t after = anon_resident() - (int64_t)(relay_bytes(f) - relayed);
    int crew = relay_bytes(f) > relayed;
    CHECK(rc < 0);
    if (rc >= 0)
        fprintf(stderr, "load_group of a truncated file: %d\n", rc);
    /* whole again and as opened (same inode, size, times), so the copies can be looked at */
    CHECK_EQ_INT(rewrite_file(g_big, orig, size), 0);
    CHECK_EQ_INT(restore_times(g_big, &opened), 0);
    /* the first read's copies are there, in one arena (pointers keep the file offsets) */
    ferry_tensor *first[2] = {emb, q};
    rc = ferry_prepare(f, first, 2);
    CHECK_EQ_INT(rc, 0);
    int arena = rc == 0 && keeps_offsets(emb, q) && !in_file_map(emb, ferry_tensor_data(emb));
    CHECK(arena);
    if (arena) {
        CHECK_EQ_INT(count_same(f, first, 2), 2);
        /* the failed copies' places in the arena (they keep the file offsets) hold none of
         * their own pages; a page two of them share may stay until the arena goes */
        const unsigned char *pe = ferry_tensor_data(emb);
        uint64_t kept = 0, failed = 0;
        for (size_t i = 0; i < n; i++) {
            ferry_tensor_info it = info_of(ts[i]);
            if (it.offset < iu.offset)
                continue;
            uint64_t r = resident_in(pe + (it.offset - ie.offset), it.nbytes);
            kept = r == UINT64_MAX || kept == UINT64_MAX ? UINT64_MAX : kept + r;
            failed += it.nbytes;
        }
        CHECK(failed >= 20 * MIB);
        if (kept)
            fprintf(stderr, "failed read: %.2f MiB of its copies' pages still resident\n",
                    (double)kept / (double)MIB);
        CHECK_EQ_INT(kept, 0);
    }
    if (rc == 0)
        CHECK_EQ_INT(ferry_release(f, first, 2), 0);
    /* and the process grew by the first read's copies (3 MiB), not the failed ones (24 MiB) */
    CHECK(before >= 0 && after >= 0);
    if (before >= 0 && after >= 0) {
        /* (sanitizer runtimes keep per-thread state in anonymous memory too: the relay
         * readers', where they started in the load, about 0.6 MiB a thread under TSan) */
        int64_t grew = after - before,
                allowed = (int64_t)(ih.offset - ie.offset + 4 * MIB + (SANITIZED ? 2 * MIB : 0) +
                                    (SANITIZED && crew ? FERRY__IO_RELAY_READERS * MIB : 0));
        if (grew > allowed)
            fprintf(stderr, "failed read: anonymous memory grew by %.2f MiB (allowed %.2f)\n",
                    (double)grew / (double)MIB, (double)allowed / (double)MIB);
        CHECK(grew <= allowed);
    }
    ferry_stats st = stats_of(f);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);

    /* the same manager loads the rest */
    rc = ferry_load_group(f, "all");
    if (rc)
        fprintf(stderr, "load_group after the rewrite: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(count_same(f, ts, n), n);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] >= size / 2);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    free(ts);
    ferry_destroy(f);
    free(orig);
}

/* Load DIRECT, host budget B smaller than the model. The copies the budget refuses leave
 * holes in the arena, and the small copies claimed between them (each layer's attn_norm) are
 * reads of a page or two. Resident memory stays what the budget counts: were the whole arena
 * advised MADV_HUGEPAGE, each such page would fault in a 2 MiB huge page (20 MiB resident under
 * a 13 MiB budget). */
static void test_budget_holes_resident(void)
{
    if (!big_model())
        return;
    const uint64_t budget = 4 * MIB + MIB / 2;
    ferry_options o = {.host_budget = budget};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_big, &p, &n);
    ferry_tensor *emb = ferry_find(f, "token_embd.weight");
    ferry_tensor *warm = ferry_find(f, "output_norm.weight");
    CHECK(ts && emb && warm);
    if (!ts || !emb || !warm) {
        free(ts);
        ferry_destroy(f);
        return;
    }
    /* one small load first: the loader threads and the I/O pool run before the measurement */
    CHECK_EQ_INT(ferry_prepare(f, &warm, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &warm, 1), 0);
    uint64_t relayed = relay_bytes(f);
    int64_t before = anon_resident();
    int rc = ferry_load_group(f, "all");
    /* less the relay readers' slots, mapped by the load's first relayed read */
    int64_t after = anon_resident() - (int64_t)(relay_bytes(f) - relayed);
    int crew = relay_bytes(f) > relayed;
    CHECK_EQ_INT(rc, FERRY_EBUDGET);
    ferry_stats st = stats_of(f);
    CHECK(st.resident_bytes[0] <= budget);
    CHECK(st.peak_bytes[0] <= budget);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);
    CHECK(st.resident_bytes[0] >= 3 * MIB); /* token_embd and blk.0's attention fit */
    /* the arena's resident pages are those of the copies the budget counts */
    const ferry__arena *a = emb->comp.mem.arena;
    CHECK(a != NULL);
    if (a) {
        uint64_t res = resident_in(a->base, a->len);
        if (res > st.resident_bytes[0])
            fprintf(stderr, "arena: %.2f MiB resident, %.2f MiB counted\n",
                    (double)res / (double)MIB, (double)st.resident_bytes[0] / (double)MIB);
        CHECK(res <= st.resident_bytes[0]);
    }
    CHECK(before >= 0 && after >= 0);
    if (before >= 0 && after >= 0) {
        /* (sanitizer runtimes keep per-thread state, the toucher's and the relay readers' too,
         * in anonymous memory) */
        int64_t grew = after - before,
                allowed = (int64_t)(budget + 2 * MIB + (SANITIZED ? 2 * MIB : 0) +
                                    (SANITIZED && crew ? FERRY__IO_RELAY_READERS * MIB : 0));
        if (grew > allowed)
            fprintf(stderr, "budget %.2f MiB: anonymous memory grew by %.2f MiB\n",
                    (double)budget / (double)MIB, (double)grew / (double)MIB);
        CHECK(grew <= allowed);
    }
    free(ts);
    ferry_destroy(f);
}

/* Home disk, load READ, a one-shot phase (token_embd and blk.0, prepared once) and then a
 * loop over the rest, with a host budget of the loop's copies + 1 MiB. The first tensor never
 * comes again, so the schedule never completes; eviction that kept ranking copies by their
 * (bit-reversed) first-use position for good would keep the dead one-shot token_embd and re-read
 * part of the loop every pass. Once warm, a loop pass reads nothing. */
static void test_one_shot_then_loop(void)
{
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    /* the loop's copy sizes, from the plan of a manager without a budget */
    ferry *probe = ferry_create(NULL);
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(probe, g_path, &p, &n);
    ferry_placement *pl = NULL;
    size_t np = 0;
    CHECK(ts != NULL && n == g_n);
    CHECK_EQ_INT(ts ? ferry_plan(probe, &pl, &np, NULL) : -1, 0);
    size_t first_loop = n;
    for (size_t i = 0; ts && i < n; i++)
        if (strcmp(info_of(ts[i]).name, "blk.1.attn_norm.weight") == 0)
            first_loop = i;
    CHECK(first_loop >= 2 && first_loop + 2 < n);
    uint64_t loop_bytes = 0, loop_nbytes = 0;
    for (size_t i = first_loop; pl && i < np && i < n; i++) {
        loop_bytes += pl[i].compute_bytes;
        loop_nbytes += info_of(ts[i]).nbytes;
    }
    CHECK(np == n && loop_bytes >= loop_nbytes && loop_nbytes > 0);
    free(pl);
    free(ts);
    ferry_destroy(probe);
    if (np != n || first_loop + 2 >= n || !loop_nbytes)
        return;

    ferry_options o = {.host_budget = loop_bytes + MIB};
    ferry *f = ferry_create(&o);
    ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts != NULL && n == g_n);
    if (!ts || n != g_n) {
        free(ts);
        ferry_destroy(f);
        return;
    }
    int ok = 1;
    /* the first loop pass counts from before the one-shot phase: the loop's first tensors may
     * be prefetched in file order during it */
    uint64_t start = stats_of(f).bytes_read;
    for (size_t i = 0; ok && i < first_loop; i++) {
        ok = ferry_prepare(f, &ts[i], 1) == 0;
        if (ok)
            ok = ferry_release(f, &ts[i], 1) == 0;
    }
    uint64_t read[5] = {0};
    for (int pass = 0; ok && pass < 5; pass++) {
        uint64_t r0 = pass ? stats_of(f).bytes_read : start;
        for (size_t i = first_loop; ok && i < n; i++) {
            int prepared = ferry_prepare(f, &ts[i], 1) == 0;
            ok = prepared && fixture_same_as_file(f, ts[i]);
            if (prepared)
                ok = ferry_release(f, &ts[i], 1) == 0 && ok;
        }
        read[pass] = stats_of(f).bytes_read - r0;
    }
    if (!ok)
        fprintf(stderr, "one-shot then loop: %s\n", ferry_errmsg(f));
    CHECK(ok);
    CHECK(read[0] >= loop_nbytes);
    for (int pass = 2; pass < 5; pass++) {
        if (read[pass])
            fprintf(stderr, "loop pass %d read %llu bytes (loop %llu, budget %llu)\n", pass,
                    (unsigned long long)read[pass], (unsigned long long)loop_bytes,
                    (unsigned long long)o.host_budget);
        CHECK_EQ_INT(read[pass], 0);
    }
    ferry_stats st = stats_of(f);
    CHECK(st.resident_bytes[0] <= o.host_budget);
    CHECK(st.peak_bytes[0] <= o.host_budget);
    free(ts);
    ferry_destroy(f);
}

/* ---- an adapter added while a group load's arena read is in flight --------------------- *
 * The read is held at a gate: this binary's pread (which ferry's thread I/O backend calls,
 * FERRY_IO_BACKEND=threads) stops the first large read of an armed gate until the test opens it,
 * so the adapter is added while the copy is LOADING, every time, with no sleeps. */

static ssize_t (*g_real_pread)(int, void *, size_t, off_t);
static atomic_int g_gate_armed;        /* the next pread of >= 64 KiB stops at the gate */
static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_held, g_gate_open;   /* g_gate_mu */

static void gate_stop(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += SANITIZED ? 60 : 20; /* a test that never opens it fails, it does not hang */
    pthread_mutex_lock(&g_gate_mu);
    g_gate_held = 1;
    pthread_cond_broadcast(&g_gate_cv);
    while (!g_gate_open)
        if (pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &until) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&g_gate_mu);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    if (n >= 65536 && atomic_load(&g_gate_armed) && atomic_exchange(&g_gate_armed, 0))
        gate_stop();
    if (g_real_pread)
        return g_real_pread(fd, buf, n, off);
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, (long)off);
}

/* Waits until the gate holds a read (1), or a generous while (0). */
static int gate_wait_held(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += SANITIZED ? 60 : 20;
    pthread_mutex_lock(&g_gate_mu);
    while (!g_gate_held)
        if (pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &until) == ETIMEDOUT)
            break;
    int held = g_gate_held;
    pthread_mutex_unlock(&g_gate_mu);
    return held;
}

static void gate_release(void)
{
    atomic_store(&g_gate_armed, 0);
    pthread_mutex_lock(&g_gate_mu);
    g_gate_open = 1;
    pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

/* A rank-4 LoRA adapter for blk.0.attn_q.weight (256 x 256), every factor 0.5. */
static int write_adapter(const char *path)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    if (!w)
        return -1;
    int64_t sa[2] = {256, 4}, sb[2] = {4, 256};
    float v[1024];
    for (int i = 0; i < 1024; i++)
        v[i] = 0.5f;
    int rc = ferry_writer_set_meta_str(w, "adapter.type", "lora");
    if (!rc)
        rc = ferry_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", FERRY_DTYPE_F32, 2, sa);
    if (!rc)
        rc = ferry_writer_add_tensor(w, "blk.0.attn_q.weight.lora_b", FERRY_DTYPE_F32, 2, sb);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    if (!rc)
        rc = ferry_writer_write(w, v, sizeof v);
    if (!rc)
        rc = ferry_writer_write(w, v, sizeof v);
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "adapter %s: %s\n", path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

/* A manager with a sim device as every tensor's compute device, home host, load DIRECT (so a
 * group load reads the host copies into an arena and a prepare stages from them). */
static ferry *open_on_sim(void)
{
    ferry *f = ferry_create(NULL);
    int dev = -1;
    if (!f || ferry_add_device(f, "sim:256MiB", &dev)) {
        fprintf(stderr, "sim device: %s\n", f ? ferry_errmsg(f) : "no manager");
        ferry_destroy(f);
        return NULL;
    }
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT, .compute_device = dev};
    if (ferry_open(f, g_path, NULL) || ferry_group_add(f, "all", "*", &p)) {
        fprintf(stderr, "%s: %s\n", g_path, ferry_errmsg(f));
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

/* The staged bytes of T (NB of them) after a prepare with two references, as two engine threads
 * would hold it; NULL when the prepare or the read fails. */
static float *staged_bytes(ferry *f, ferry_tensor *t, uint64_t nb)
{
    ferry_tensor *tt[2] = {t, t};
    float *v = malloc(nb);
    int rc = v ? ferry_prepare(f, tt, 2) : FERRY_ENOMEM;
    if (rc == 0) {
        if (ferry_tensor_read(f, t, 0, nb, v) != 0) {
            free(v);
            v = NULL;
        }
        CHECK_EQ_INT(ferry_release(f, tt, 2), 0);
    } else {
        fprintf(stderr, "prepare %s: %s\n", info_of(t).name, ferry_errmsg(f));
        free(v);
        v = NULL;
    }
    return v;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
    }
    return m;
}

typedef struct load_arg {
    ferry *f;
    int rc;
} load_arg;

static void *load_main(void *arg)
{
    load_arg *a = arg;
    a->rc = ferry_load_group(a->f, "all");
    return NULL;
}

/* A copy read while the adapter comes must not stay bound with the old decision (no merge),
 * marked stale only for a job's end that never comes, or the next prepares would stage
 * blk.0.attn_q without the adapter: each prepare stages what a manager that had the adapter from
 * the start stages. */
static void test_adapter_during_arena_read(void)
{
    CHECK_EQ_INT(write_adapter(g_lora), 0);
    /* the reference: the adapter added before the group load */
    ferry *f = open_on_sim();
    CHECK(f != NULL);
    if (!f)
        return;
    ferry_tensor *q = ferry_find(f, "blk.0.attn_q.weight");
    CHECK(q != NULL);
    const uint64_t nb = q ? info_of(q).nbytes : 0;
    const size_t ne = (size_t)(nb / sizeof(float));
    float *file = q ? fixture_pread(g_path, info_of(q).offset, nb) : NULL;
    float *ref = NULL;
    CHECK(file != NULL && ne == 256 * 256);
    if (file && ne) {
        CHECK_EQ_INT(ferry_lora_add(f, g_lora, 1.0f, NULL, NULL), 0);
        CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
        ref = staged_bytes(f, q, nb);
    }
    ferry_destroy(f);
    CHECK(ref != NULL);
    if (!ref) {
        free(file);
        return;
    }
    CHECK(max_diff(ref, file, ne) > 0.5); /* the adapter moves every weight by 1.0 */

    /* the adapter added while the group load's arena read is held at the gate */
    setenv("FERRY_IO_BACKEND", "threads", 1);
    f = open_on_sim();
    unsetenv("FERRY_IO_BACKEND");
    CHECK(f != NULL);
    if (!f) {
        free(file), free(ref);
        return;
    }
    q = ferry_find(f, "blk.0.attn_q.weight");
    g_gate_held = g_gate_open = 0;
    atomic_store(&g_gate_armed, 1);
    load_arg la = {.f = f, .rc = -1};
    pthread_t th;
    int started = pthread_create(&th, NULL, load_main, &la) == 0;
    CHECK(started);
    int held = started && gate_wait_held();
    CHECK(held); /* the load's read reached the gate */
    int lrc = ferry_lora_add(f, g_lora, 1.0f, NULL, NULL);
    if (lrc)
        fprintf(stderr, "lora_add during the group load: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(lrc, 0);
    gate_release();
    if (started)
        join_or_die(th, f, 20, "test_adapter_during_arena_read");
    if (la.rc)
        fprintf(stderr, "group load with an adapter added meanwhile: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(la.rc, 0);
    for (int k = 0; k < 2; k++) {
        float *got = staged_bytes(f, q, nb);
        CHECK(got != NULL);
        if (got) {
            double d = max_diff(got, ref, ne);
            if (d > 1e-3)
                fprintf(stderr, "prepare %d: staged blk.0.attn_q differs from the reference by "
                        "%g (from the file by %g)\n", k + 1, d, max_diff(got, file, ne));
            CHECK(d <= 1e-3);
        }
        free(got);
    }
    ferry_destroy(f);
    free(file), free(ref);
}

/* Writes the two page-reporting parameters under ROOT (NULL values: the files are removed). */
static void fake_reporting(const char *root, const char *order, const char *reported)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/module", root);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/module/page_reporting", root);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/module/page_reporting/parameters", root);
    mkdir(path, 0700);
    const char *names[2] = {"page_reporting_order", "reported_kib"}, *values[2] = {order, reported};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/module/page_reporting/parameters/%s", root, names[i]);
        if (!values[i]) {
            unlink(path);
            continue;
        }
        FILE *fp = fopen(path, "w");
        CHECK(fp != NULL);
        if (fp) {
            fprintf(fp, "%s\n", values[i]);
            fclose(fp);
        }
    }
}

/* Removes the folders fake_reporting made under ROOT (its files first: fake_reporting(ROOT, NULL,
 * NULL)), and ROOT. */
static void fake_root_remove(const char *root)
{
    fake_reporting(root, NULL, NULL);
    char path[1400];
    snprintf(path, sizeof path, "%s/module/page_reporting/parameters", root);
    rmdir(path);
    snprintf(path, sizeof path, "%s/module/page_reporting", root);
    rmdir(path);
    snprintf(path, sizeof path, "%s/module", root);
    rmdir(path);
    rmdir(root);
}

/* Whether a mapping overlapping [LO, HI) in /proc/self/smaps has VmFlags FLAG ("hg": advised
 * MADV_HUGEPAGE). -1 when smaps cannot be read. */
static int vmflag_in(uintptr_t lo, uintptr_t hi, const char *flag)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp)
        return -1;
    char line[1200];
    int inside = 0, found = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a < hi && b > lo;
            continue;
        }
        if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            char want[8];
            snprintf(want, sizeof want, " %s", flag);
            for (char *q = strstr(line, want); q; q = strstr(q + 1, want))
                if (q[3] == ' ' || q[3] == '\n')
                    found = 1;
        }
    }
    fclose(fp);
    return found;
}

/* Where the kernel reports free huge-page-sized blocks to a hypervisor (free page reporting), a
 * fresh huge page is one the host took back, and faults in several times slower than small
 * pages: a group load's arena then asks for no huge pages. The platform's answer comes from
 * /sys/module/page_reporting ($FERRY_SYSFS_ROOT in this test); the arena's advice shows in the
 * VmFlags of its mapping. */
static void test_huge_pages_dear(void)
{
    if (!big_model())
        return;
    char root[1300];
    snprintf(root, sizeof root, "%s.sys", g_big);
    mkdir(root, 0700);
    setenv("FERRY_SYSFS_ROOT", root, 1);
    CHECK_EQ_INT(ferry__host_huge_pages_dear(), 0); /* no page_reporting module */
    fake_reporting(root, "9", "0");
    CHECK_EQ_INT(ferry__host_huge_pages_dear(), 0); /* nothing reported yet */
    fake_reporting(root, "10", "123456");
    CHECK_EQ_INT(ferry__host_huge_pages_dear(), 0); /* only blocks larger than a huge page */
    fake_reporting(root, "9", "123456");
    int dear = ferry__host_huge_pages_dear();
    CHECK_EQ_INT(dear, sysconf(_SC_PAGESIZE) == 4096 ? 1 : dear);

    for (int want_huge = 0; want_huge <= 1; want_huge++) {
        if (want_huge)
            fake_reporting(root, NULL, NULL);
        ferry *f = ferry_create(NULL);
        ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
        size_t n = 0;
        ferry_tensor **ts = fixture_open_all(f, g_big, &p, &n);
        ferry_tensor *emb = ferry_find(f, "token_embd.weight");
        CHECK(ts && emb);
        CHECK_EQ_INT(ts ? ferry_load_group(f, "all") : -1, 0);
        const ferry__arena *a = emb ? emb->comp.mem.arena : NULL;
        CHECK(a != NULL);
        if (a && (dear || want_huge)) {
            int hg = vmflag_in((uintptr_t)a->base, (uintptr_t)a->base + a->len, "hg");
            if (hg != want_huge)
                fprintf(stderr, "arena of %.2f MiB, huge pages %s: advised MADV_HUGEPAGE: %d\n",
                        (double)a->len / (double)MIB, want_huge ? "cheap" : "dear", hg);
            CHECK_EQ_INT(hg, want_huge);
        }
        /* the bytes are the file's either way */
        CHECK_EQ_INT(ts ? ferry_prepare(f, ts, n) : -1, 0);
        CHECK_EQ_INT(ts ? count_same(f, ts, n) : 0, n);
        if (ts)
            CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        free(ts);
        ferry_destroy(f);
    }
    unsetenv("FERRY_SYSFS_ROOT");
    fake_root_remove(root);
}

/* ---- AUTO's way for uncached bytes: FERRY_AUTO_COLD, or measured by the probe ------------- */

/* The probe's fault rate from its steps' times, against its definition: the steps' bytes over
 * their sum where they agree; the slowest step's rate where it took four times the median or
 * more (pages freed a moment ago served the fast steps, memory the host backs again the slow
 * ones, and a load far larger than the probe meets mostly the latter). */
static void test_cold_fault_rate(void)
{
    const uint64_t step = UINT64_C(2) << 20;
    double even[16], warm[16], mild[16];
    for (int i = 0; i < 16; i++) {
        even[i] = 1e-3;
        warm[i] = 0.1e-3;
        mild[i] = 1e-3;
    }
    warm[5] = 4e-3; /* one step of 16 forty times the others */
    mild[9] = 3e-3; /* three times the median: noise, not two kinds of memory */
    double r = ferry__cold_fault_rate(even, 16, step);
    CHECK(fabs(r - (double)step / 1e-3) <= 1e-6 * r);
    r = ferry__cold_fault_rate(warm, 16, step);
    CHECK(fabs(r - (double)step / 4e-3) <= 1e-6 * r);
    r = ferry__cold_fault_rate(mild, 16, step);
    CHECK(fabs(r - 16.0 * (double)step / 18e-3) <= 1e-6 * r);
    /* the threshold itself counts as two kinds: 4 x the median exactly */
    mild[9] = 4e-3;
    r = ferry__cold_fault_rate(mild, 16, step);
    CHECK(fabs(r - (double)step / 4e-3) <= 1e-6 * r);
    /* one step: its own rate (it is its own median) */
    r = ferry__cold_fault_rate(even, 1, 1u << 20);
    CHECK(fabs(r - (double)(1u << 20) / 1e-3) <= 1e-6 * r);
    /* nothing to rate */
    CHECK(ferry__cold_fault_rate(even, 0, step) == 0);
    double many[FERRY__COLD_STEPS_MAX + 1];
    for (int i = 0; i <= FERRY__COLD_STEPS_MAX; i++)
        many[i] = 1e-3;
    CHECK(ferry__cold_fault_rate(many, FERRY__COLD_STEPS_MAX + 1, step) == 0);
    CHECK(ferry__cold_fault_rate(even, 16, 0) == 0);
    even[3] = 0;
    CHECK(ferry__cold_fault_rate(even, 16, step) == 0);
}

/* The long probe's rate in small pages, against its definition: the step's bytes over the time
 * that the 8 slowest steps (16 MiB) took at least, so that a few slow steps among many are noise
 * and a run of them is the memory a whole load meets; the slowest step's for 8 steps or fewer. */
static void test_cold_slow_rate(void)
{
    const uint64_t step = UINT64_C(2) << 20;
    double t[64];
    for (int i = 0; i < 64; i++)
        t[i] = 0.5e-3 + 1e-6 * i; /* all alike: the 8th slowest is t[56] */
    double r = ferry__cold_slow_rate(t, 64, step);
    CHECK(fabs(r - (double)step / t[56]) <= 1e-9 * r);
    t[3] = 20e-3; /* one hiccup of 64: the rate hardly moves (t[57] becomes the 8th slowest) */
    r = ferry__cold_slow_rate(t, 64, step);
    CHECK(fabs(r - (double)step / t[57]) <= 1e-9 * r);
    /* warm pages first, then 10 steps of memory the host backs again: the latter's rate (the 8th
     * slowest of the ten 4 ms steps) */
    for (int i = 0; i < 20; i++)
        t[i] = i < 10 ? 0.4e-3 : 4e-3 + 1e-6 * i;
    r = ferry__cold_slow_rate(t, 20, step);
    CHECK(fabs(r - (double)step / t[12]) <= 1e-9 * r);
    /* eight steps or fewer: the slowest */
    r = ferry__cold_slow_rate(t + 8, 5, step);
    CHECK(fabs(r - (double)step / t[12]) <= 1e-9 * r);
    /* nothing to rate */
    CHECK(ferry__cold_slow_rate(t, 0, step) == 0);
    CHECK(ferry__cold_slow_rate(t, 64, 0) == 0);
    t[2] = -1;
    CHECK(ferry__cold_slow_rate(t, 20, step) == 0);
    double many[FERRY__COLD_STEPS_MAX + 1];
    for (int i = 0; i <= FERRY__COLD_STEPS_MAX; i++)
        many[i] = 1e-3;
    CHECK(ferry__cold_slow_rate(many, FERRY__COLD_STEPS_MAX + 1, step) == 0);
}

/* The choice the probe's figures call for, from ferry.h's rule: the mapping when it measured at
 * least 0.8 of the private copies' rate; where the host takes free 2 MiB blocks back, private
 * copies when fresh memory faulted in at least 1.5 times as fast as the mapping filled and their
 * read is at least 0.8 of the mapping's rate. */
static int cold_rule(const ferry_cold_load *c)
{
    if (c->dear && c->map_gbps == 0) {
        /* the mapping not probed: fresh memory outran the relayed read enough */
        CHECK(c->read_gbps > 0 && c->fault_gbps >= 1.5 * c->read_gbps);
        return 0;
    }
    if (c->dear)
        return !(c->fault_gbps >= 1.5 * c->map_gbps && c->private_gbps >= 0.8 * c->map_gbps);
    return c->map_gbps >= 0.8 * c->private_gbps;
}

/* With FERRY_AUTO_COLD=ENV (read by ferry_create), a manager with every tensor of g_path in one
 * AUTO home-host group (*TS, *N), the file then dropped from the page cache: returns the largest
 * fraction of a tensor still cached (1 when it could not tell). */
static double open_cold(const char *env, ferry **f, ferry_tensor ***ts, size_t *n)
{
    setenv("FERRY_AUTO_COLD", env, 1);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_AUTO};
    *f = ferry_create(NULL);
    *ts = fixture_open_all(*f, g_path, &p, n);
    CHECK(*ts != NULL && *n == g_n);
    double *frac = calloc(g_n, sizeof *frac), hi = 1.0;
    if (*ts && frac && drop_cache(g_path) == 0 && cached_fractions(g_path, *ts, *n, frac) == 0) {
        hi = 0;
        for (size_t i = 0; i < *n; i++)
            hi = frac[i] > hi ? frac[i] : hi;
    }
    free(frac);
    return hi;
}

/* A cold group load with FERRY_AUTO_COLD=ENV: WANT_MAP 1 or 0 as ENV forces, -1 as the probe
 * measured (the faster of the two it reports). Either way the bytes are the file's, and the
 * tensors are in the mapping exactly when the choice is the mapping. */
static void cold_case(const char *env, int want_map)
{
    ferry *f;
    ferry_tensor **ts;
    size_t n = 0;
    double hi = open_cold(env, &f, &ts, &n);
    ferry_cold_load c;
    CHECK_EQ_INT(ferry_get_cold_load(f, &c), 0);
    CHECK_EQ_INT(c.decided, want_map >= 0); /* forced from the start, else at the load */
    CHECK_EQ_INT(c.forced, want_map >= 0);
    CHECK_EQ_INT(ferry_get_cold_load(NULL, &c), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_get_cold_load(f, NULL), FERRY_EINVAL);
    if (!ts || hi > 0.05) {
        printf("test_cold_choice (%s) skipped: after POSIX_FADV_DONTNEED the kernel still caches "
               "%.0f%% of a tensor's pages\n", env, hi * 100);
    } else {
        CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
        CHECK_EQ_INT(ferry_get_cold_load(f, &c), 0);
        CHECK_EQ_INT(c.decided, 1);
        if (want_map >= 0) {
            CHECK_EQ_INT(c.forced, 1);
            CHECK_EQ_INT(c.map, want_map);
        }
        if (want_map == 1) {
            /* the load brought every tensor's pages into the page cache and mapped them, and
             * counted no byte twice (a tensor the reads before it cached, by readahead, is
             * skipped, not counted) */
            double *frac = calloc(n, sizeof *frac);
            CHECK(frac && cached_fractions(g_path, ts, n, frac) == 0);
            uint64_t sum = 0;
            for (size_t i = 0; frac && i < n; i++) {
                CHECK(frac[i] >= 0.99);
                sum += info_of(ts[i]).nbytes;
            }
            free(frac);
            CHECK(stats_of(f).bytes_read > 0 && stats_of(f).bytes_read <= sum);
        } else if (want_map < 0) {
            CHECK_EQ_INT(c.forced, 0);
            /* the rule, with the host's way with free 2 MiB blocks as ferry reads it (free page
             * reporting: FERRY_SYSFS_ROOT may stand for /sys) */
            CHECK_EQ_INT(c.dear, ferry__host_huge_pages_dear());
            CHECK((c.map_gbps > 0 || c.dear) && c.private_gbps > 0 && c.fault_gbps >= c.private_gbps);
            CHECK_EQ_INT(c.map, cold_rule(&c));
            printf("test_cold_choice: probe: mapping %.2f GB/s, private copies %.2f GB/s, fresh "
                   "memory %.2f GB/s, free 2 MiB blocks %s: %s\n", c.map_gbps, c.private_gbps,
                   c.fault_gbps, c.dear ? "handed back to the host" : "kept",
                   c.map ? "the mapping" : "private copies");
        }
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        size_t in_map = 0;
        for (size_t i = 0; i < n; i++)
            in_map += (size_t)in_file_map(ts[i], ferry_tensor_data(ts[i]));
        CHECK_EQ_INT(in_map, c.map ? n : 0);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
        ferry_stats st = stats_of(f);
        CHECK_EQ_INT(st.resident_bytes[0], c.map ? 0 : st.home_host_bytes);
    }
    free(ts);
    ferry_destroy(f);
    unsetenv("FERRY_AUTO_COLD");
}

/* The same decided by a prepare (FERRY_AUTO_COLD=probe): the first tensor's prepare probes, and
 * every tensor not loaded yet, the prefetch's included, follows the choice. */
static void cold_case_prepare(void)
{
    ferry *f;
    ferry_tensor **ts;
    size_t n = 0;
    double hi = open_cold("probe", &f, &ts, &n);
    if (!ts || hi > 0.05) {
        printf("test_cold_choice (prepare) skipped: the kernel still caches %.0f%% of a "
               "tensor's pages\n", hi * 100);
    } else {
        CHECK_EQ_INT(ferry_prepare(f, ts, 1), 0);
        ferry_cold_load c;
        CHECK_EQ_INT(ferry_get_cold_load(f, &c), 0);
        CHECK_EQ_INT(c.decided, 1);
        CHECK_EQ_INT(c.map, cold_rule(&c));
        CHECK_EQ_INT(in_file_map(ts[0], ferry_tensor_data(ts[0])), c.map);
        CHECK_EQ_INT(ferry_prepare(f, ts + 1, n - 1), 0);
        CHECK_EQ_INT(count_same(f, ts, n), n);
        size_t in_map = 0;
        for (size_t i = 1; i < n; i++)
            in_map += (size_t)in_file_map(ts[i], ferry_tensor_data(ts[i]));
        if (c.map)
            CHECK_EQ_INT(in_map, n - 1);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    }
    free(ts);
    ferry_destroy(f);
    unsetenv("FERRY_AUTO_COLD");
}

/* The probe under a /sys of this test's own: free 2 MiB blocks reported to the host (the mapping
 * whatever the rates), then no reporting (the rates decide). */
static void cold_case_reporting(void)
{
    char root[1300];
    snprintf(root, sizeof root, "%s.cold.sys", g_path);
    mkdir(root, 0700);
    setenv("FERRY_SYSFS_ROOT", root, 1);
    fake_reporting(root, "9", "123456");
    if (sysconf(_SC_PAGESIZE) == 4096)
        CHECK_EQ_INT(ferry__host_huge_pages_dear(), 1);
    cold_case("probe", -1);
    fake_reporting(root, NULL, NULL);
    CHECK_EQ_INT(ferry__host_huge_pages_dear(), 0);
    cold_case("probe", -1);
    unsetenv("FERRY_SYSFS_ROOT");
    fake_root_remove(root);
}

static void test_cold_choice(void)
{
    cold_case("map", 1);
    cold_case("private", 0);
    cold_case("probe", -1);
    cold_case_reporting();
    cold_case_prepare();
}

int main(int argc, char **argv)
{
    reserved_init();
    alarm(SANITIZED ? 240 : 60); /* a deadlock ends the run instead of hanging it */
    const char *dir = check_tmpdir("arena");
    snprintf(g_path, sizeof g_path, "%s/model.gguf", dir);
    snprintf(g_trunc, sizeof g_trunc, "%s/trunc.gguf", dir);
    snprintf(g_big, sizeof g_big, "%s/big.gguf", dir);
    snprintf(g_lora, sizeof g_lora, "%s/lora.gguf", dir);
    /* the pread this binary defines (test_adapter_during_arena_read's gate) calls on to the next
     * one, the sanitizer's or libc's, found before any thread runs */
    g_real_pread = (ssize_t(*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
    /* about 5 MiB of f32, one dense run: token_embd 1 MiB, two layers of 1.5 MiB (attn 0.5 MiB,
     * ffn 1 MiB, so attn tensors cover a third of their span), output 1 MiB */
    g_n = fixture_layout(g_ts, 2, 256, 512, 1024, FERRY_DTYPE_F32, 0);
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, g_ts, g_n) ||
        fixture_write(g_trunc, FERRY_FORMAT_GGUF, g_ts, g_n))
        return 2;
    for (size_t i = 0; i < g_n; i++) {
        uint64_t nb = 0;
        ferry_dtype_nbytes(g_ts[i].dtype, fixture_elems(&g_ts[i]), &nb);
        g_bytes += nb;
    }

    /* an argument runs only the tests whose names contain it (for debugging) */
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"direct", test_direct_arena}, {"auto", test_auto},
                 {"truncated", test_truncated}, {"budget", test_budget},
                 {"sparse", test_sparse},        {"concurrent", test_concurrent},
                 {"auto_over_budget", test_auto_over_budget},
                 {"failed_read_pages", test_failed_read_pages},
                 {"budget_holes_resident", test_budget_holes_resident},
                 {"one_shot_then_loop", test_one_shot_then_loop},
                 {"adapter_during_arena_read", test_adapter_during_arena_read},
                 {"huge_pages_dear", test_huge_pages_dear},
                 {"cold_choice", test_cold_choice},
                 {"cold_fault_rate", test_cold_fault_rate},
                 {"cold_slow_rate", test_cold_slow_rate}};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc < 2 || strstr(tests[i].name, argv[1]))
            tests[i].fn();
    check_rmdir(dir);
    return check_finish();
}
