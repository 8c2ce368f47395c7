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
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/core.h"
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
    for (int round = 0; round < 2; round++) {
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
        if (round == 1)
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
    CHECK_EQ_INT(truncate(g_trunc, (off_t)(size / 2)), 0);

    int rc = ferry_load_group(f, "all");
    CHECK(rc < 0);
    CHECK(rc == FERRY_EIO || rc == FERRY_ETRUNC || rc == FERRY_ERANGE);
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

    /* per tensor: the last one lies past the new end and fails naming itself; the first one is
     * still whole and loads */
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
    CHECK_EQ_INT(ferry_prepare(f, &firstt, 1), 0);
    CHECK(fixture_same_as_file(f, firstt));
    CHECK_EQ_INT(ferry_release(f, &firstt, 1), 0);
    st = stats_of(f);
    CHECK(st.resident_bytes[0] >= info_of(firstt).nbytes);
    CHECK_EQ_INT(st.resident_bytes[0], st.home_host_bytes);

    /* the same file (same inode) whole again: the same manager loads the rest */
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
    rc = ferry_load_group(f, "all");
    if (rc)
        fprintf(stderr, "load_group after the rewrite: %s\n", ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(count_same(f, ts, n), n);
    /* the first tensor kept its own buffer; the others form the new arena */
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

/* Joins TH, waiting at most a generous while; a thread still waiting then is stuck for good (a
 * deadlock): the manager's tensor states are printed and the run ends as failed, as nothing
 * stuck can be cleaned up. */
static int join_within(pthread_t th, ferry *f, int round)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += SANITIZED ? 30 : 10;
    int rc = pthread_timedjoin_np(th, NULL, &until);
    if (rc == 0)
        return 0;
    fprintf(stderr, "test_concurrent round %d: a thread is stuck (%s); tensor states:\n", round,
            strerror(rc));
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ferry_tensor *t = f->tensors[i];
        fprintf(stderr, "  %s: comp %d host %d arena_copy %d\n", t->info.name, (int)t->comp.state,
                (int)t->host.state, t->arena_copy);
    }
    pthread_mutex_unlock(&f->lock);
    CHECK(!"deadlock");
    int status = check_finish();
    fflush(stdout);
    fflush(stderr);
    _exit(status);
}

static void test_concurrent(void)
{
    static const unsigned delays[] = {0, 300, 1500, 0, 200, 3000};
    for (int round = 0; round < 6; round++) {
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
        /* rounds 0-2: a load against prepares (which start a little later or not);
         * rounds 3-5: two group loads of the same group */
        race_arg a = {.f = f, .go = &go, .mode = 0};
        race_arg b = {.f = f, .go = &go, .mode = round < 3 ? 1 : 0, .delay_us = delays[round],
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
        } else if (join_within(ta, f, round) || join_within(tb, f, round)) {
            return; /* not reached: join_within ends the run */
        }
        pthread_barrier_destroy(&go);
        if (a.rc || b.rc)
            fprintf(stderr, "round %d: load %d, other %d: %s\n", round, a.rc, b.rc,
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

int main(int argc, char **argv)
{
    alarm(SANITIZED ? 240 : 60); /* a deadlock ends the run instead of hanging it */
    const char *dir = check_tmpdir("arena");
    snprintf(g_path, sizeof g_path, "%s/model.gguf", dir);
    snprintf(g_trunc, sizeof g_trunc, "%s/trunc.gguf", dir);
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
                 {"sparse", test_sparse},        {"concurrent", test_concurrent}};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc < 2 || strstr(tests[i].name, argv[1]))
            tests[i].fn();
    check_rmdir(dir);
    return check_finish();
}
