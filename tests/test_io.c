/*
 * test_io.c — the synchronous side of the I/O engine: opening files (regular, missing, directory,
 * empty), reads in every load mode over many (offset, length, destination alignment) combinations
 * checked byte for byte against a known pattern, reads past the end, a file that shrinks after
 * open, page-cache probes. The read matrix and the
 * page-cache effects of each mode are checked again through the worker pool, once per backend
 * (FERRY_IO_BACKEND=threads, then uring where the build and kernel allow it).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* check.h's check_tmpdir trips -Wformat-truncation at -O2 when inlined here */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "check.h"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include "io/io.h"
#include "io/io_internal.h"

#define MIB (UINT64_C(1) << 20)
#define FILE_SIZE (40 * MIB + 1234) /* three chunks and an odd tail */

/* The byte at file offset I: a mix of all of I's bits, so that data from a wrong offset (even one
 * off by a whole chunk) differs. */
static unsigned char pattern_at(uint64_t i)
{
    uint64_t x = (i + 1) * UINT64_C(0x9E3779B97F4A7C15);
    return (unsigned char)(x >> 56 ^ x >> 29);
}

static unsigned char *pattern; /* the whole file, FILE_SIZE bytes */

static const char *mode_name(ferry_load m)
{
    static const char *names[] = {"auto", "mmap", "read", "direct"};
    return names[m];
}

/* DST buffer with room for LEN bytes placed at a chosen alignment: CONGRUENT puts the data at
 * offset % FERRY__IO_ALIGN inside an aligned block (the direct path), otherwise one byte further
 * (the buffered fallback). */
typedef struct placed {
    unsigned char *base;
    unsigned char *dst;
} placed;

static int place(placed *p, uint64_t off, uint64_t len, int congruent)
{
    uint64_t shift = off % FERRY__IO_ALIGN;
    if (!congruent)
        shift = (shift + 1 + off % 7) % FERRY__IO_ALIGN;
    if (!congruent && shift == off % FERRY__IO_ALIGN)
        shift = (shift + 1) % FERRY__IO_ALIGN;
    void *b = NULL;
    if (posix_memalign(&b, FERRY__IO_ALIGN, (size_t)(len + shift + 1)) != 0)
        return -1;
    p->base = b;
    p->dst = p->base + shift;
    /* a guard byte after the data must survive the read */
    memset(p->base, 0xA5, (size_t)(len + shift + 1));
    return 0;
}

/* When set, reads go through this pool instead of ferry__io_read; with via_relay set too, as
 * relayed requests (through the pool's relay readers). */
static ferry__io *via_pool;
static int via_relay;

typedef struct waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    int calls, status;
} waiter;

static void waiter_done(void *ud, int status)
{
    waiter *w = ud;
    pthread_mutex_lock(&w->m);
    w->calls++;
    w->status = status;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

/* One request through IO, waited for; its errmsg goes to E. */
static int pool_read(ferry__io *io, const ferry__iofile *f, uint64_t off, uint64_t len,
                     void *dst, ferry_load mode, ferry__err *e)
{
    waiter w = {.calls = 0, .status = 0};
    pthread_mutex_init(&w.m, NULL);
    pthread_cond_init(&w.c, NULL);
    ferry__ioreq req = {.file = f, .offset = off, .len = len, .dst = dst, .mode = mode,
                        .done = waiter_done, .ud = &w, .relay = via_relay};
    int r = ferry__io_submit(io, &req);
    if (r == 0) {
        pthread_mutex_lock(&w.m);
        while (!w.calls)
            pthread_cond_wait(&w.c, &w.m);
        r = w.status;
        pthread_mutex_unlock(&w.m);
    }
    snprintf(e->msg, sizeof e->msg, "%s", req.errmsg);
    e->code = r;
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
    return r;
}

static int read_one(const ferry__iofile *f, uint64_t off, uint64_t len, ferry_load mode,
                    int congruent)
{
    placed p;
    if (place(&p, off, len, congruent) != 0)
        return -1;
    ferry__err e = {0};
    int r = via_pool ? pool_read(via_pool, f, off, len, p.dst, mode, &e)
                     : ferry__io_read(f, off, len, p.dst, mode, &e);
    int ok = r == 0 && memcmp(p.dst, pattern + off, (size_t)len) == 0 && p.dst[len] == 0xA5;
    if (!ok)
        fprintf(stderr, "read %s off=%llu len=%llu %s: r=%d %s\n", mode_name(mode),
                (unsigned long long)off, (unsigned long long)len,
                congruent ? "congruent" : "incongruent", r, e.msg);
    free(p.base);
    return ok;
}

static void test_modes(const ferry__iofile *f)
{
    const uint64_t S = FILE_SIZE;
    const uint64_t offs[] = {0,        1,           4095,         4096,        4097,
                             8191,     12345,       16 * MIB - 1, 16 * MIB,    16 * MIB + 123,
                             32 * MIB - 4096, S - 4096 - 1234, S - 5000, S - 1234, S - 1};
    const uint64_t lens[] = {0, 1, 2, 100, 4095, 4096, 4097, 8192 + 17, MIB + 3};
    for (int m = FERRY_LOAD_AUTO; m <= FERRY_LOAD_DIRECT; m++) {
        int bad = 0, n = 0;
        for (size_t i = 0; i < FERRY__ARRAY_LEN(offs); i++) {
            for (size_t j = 0; j < FERRY__ARRAY_LEN(lens); j++) {
                if (lens[j] > S - offs[i])
                    continue;
                for (int c = 0; c < 2; c++, n++)
                    bad += !read_one(f, offs[i], lens[j], (ferry_load)m, c);
            }
            /* exactly to the end of the file (the long ones only from offset 1: the big
             * reads below cover the rest) */
            if (offs[i] == 1 || S - offs[i] <= 17 * MIB)
                for (int c = 0; c < 2; c++, n++)
                    bad += !read_one(f, offs[i], S - offs[i], (ferry_load)m, c);
        }
        /* large reads crossing chunk boundaries, aligned and not */
        const uint64_t big[][2] = {{0, S},           {4096, 17 * MIB},   {777, 17 * MIB + 5},
                                   {15 * MIB, 2 * MIB}, {16 * MIB, 16 * MIB}};
        for (size_t i = 0; i < FERRY__ARRAY_LEN(big); i++)
            for (int c = 0; c < 2; c++, n++)
                bad += !read_one(f, big[i][0], big[i][1], (ferry_load)m, c);
        fprintf(stderr, "mode %s%s: %d reads, %d bad\n", mode_name((ferry_load)m),
                via_relay ? " (pool, relayed)" : via_pool ? " (pool)" : "", n, bad);
        CHECK_EQ_INT(bad, 0);
    }

    /* DIRECT without an O_DIRECT descriptor falls back to buffered reads */
    ferry__iofile nodirect = *f;
    nodirect.fd_direct = -1;
    CHECK(read_one(&nodirect, 4096, 3 * MIB, FERRY_LOAD_DIRECT, 1));
    CHECK(read_one(&nodirect, 5, S - 5, FERRY_LOAD_AUTO, 1));
}

static void test_errors(const ferry__iofile *f, const char *dir)
{
    ferry__err e = {0};
    unsigned char buf[64];
    for (int m = FERRY_LOAD_AUTO; m <= FERRY_LOAD_DIRECT; m++) {
        e.msg[0] = 0;
        CHECK_EQ_INT(ferry__io_read(f, FILE_SIZE - 10, 11, buf, (ferry_load)m, &e), FERRY_EIO);
        CHECK(strstr(e.msg, f->path) != NULL);
        char offs[32];
        snprintf(offs, sizeof offs, "%llu", (unsigned long long)(FILE_SIZE - 10));
        CHECK(strstr(e.msg, offs) != NULL);
        CHECK_EQ_INT(ferry__io_read(f, FILE_SIZE + 1, 0, buf, (ferry_load)m, &e), FERRY_EIO);
        CHECK_EQ_INT(ferry__io_read(f, UINT64_MAX, 2, buf, (ferry_load)m, &e), FERRY_EIO);
    }
    CHECK_EQ_INT(ferry__io_read(f, 0, 1, buf, (ferry_load)99, &e), FERRY_EINVAL);
    CHECK_EQ_INT(ferry__io_read(f, FILE_SIZE, 0, buf, FERRY_LOAD_READ, &e), 0);

    /* missing file, directory */
    ferry__iofile g;
    char path[4200];
    snprintf(path, sizeof path, "%s/missing.bin", dir);
    CHECK_EQ_INT(ferry__iofile_open(path, &g, &e), FERRY_ENOENT);
    CHECK(strstr(e.msg, path) != NULL);
    CHECK_EQ_INT(g.fd, -1);
    ferry__iofile_close(&g); /* a failed open leaves nothing to close */
    CHECK_EQ_INT(ferry__iofile_open(dir, &g, &e), FERRY_EFORMAT);
    CHECK(strstr(e.msg, "is not a regular file") != NULL);
    CHECK(strstr(e.msg, dir) != NULL);
    CHECK_EQ_INT(ferry__iofile_open("", &g, &e), FERRY_EINVAL);

    /* a FIFO is refused without blocking on open */
    snprintf(path, sizeof path, "%s/fifo", dir);
    if (mkfifo(path, 0600) == 0)
        CHECK_EQ_INT(ferry__iofile_open(path, &g, &e), FERRY_EFORMAT);

    /* empty file */
    snprintf(path, sizeof path, "%s/empty.bin", dir);
    CHECK(check_write_file(path, "", 0) == 0);
    CHECK_EQ_INT(ferry__iofile_open(path, &g, &e), 0);
    CHECK_EQ_INT(g.size, 0);
    CHECK(g.map == NULL);
    for (int m = FERRY_LOAD_AUTO; m <= FERRY_LOAD_DIRECT; m++) {
        CHECK_EQ_INT(ferry__io_read(&g, 0, 0, buf, (ferry_load)m, &e), 0);
        CHECK_EQ_INT(ferry__io_read(&g, 0, 1, buf, (ferry_load)m, &e), FERRY_EIO);
    }
    CHECK(ferry__iofile_cached(&g, 0, 100) == 0.0);
    CHECK_EQ_INT(ferry__iofile_drop_cache(&g), 0);
    ferry__iofile_close(&g);
    ferry__iofile_close(&g); /* twice is harmless */
}

/* A file that shrinks after open: buffered and direct reads of the lost part are FERRY_EIO
 * naming the file (the mapping is not read: touching it past the end would raise SIGBUS). */
static void test_shrunk(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/shrink.bin", dir);
    CHECK(check_write_file(path, pattern, 3 * MIB) == 0);
    ferry__iofile f;
    ferry__err e = {0};
    CHECK_EQ_INT(ferry__iofile_open(path, &f, &e), 0);
    CHECK(truncate(path, MIB + 100) == 0);
    void *b = NULL;
    CHECK(posix_memalign(&b, FERRY__IO_ALIGN, 3 * MIB) == 0);
    CHECK_EQ_INT(ferry__io_read(&f, 0, 3 * MIB, b, FERRY_LOAD_READ, &e), FERRY_EIO);
    CHECK(strstr(e.msg, path) != NULL);
    CHECK_EQ_INT(ferry__io_read(&f, 0, 3 * MIB, b, FERRY_LOAD_DIRECT, &e), FERRY_EIO);
    CHECK(strstr(e.msg, path) != NULL);
    CHECK_EQ_INT(ferry__io_read(&f, 4096, 2 * MIB, (unsigned char *)b + 4096, FERRY_LOAD_DIRECT,
                                &e), FERRY_EIO);
    /* what is still there reads fine, including the new partial last block */
    CHECK_EQ_INT(ferry__io_read(&f, 1, MIB + 99, (unsigned char *)b + 1, FERRY_LOAD_DIRECT, &e), 0);
    CHECK(memcmp((unsigned char *)b + 1, pattern + 1, MIB + 99) == 0);
    free(b);
    ferry__iofile_close(&f);
}

/* Page-cache probes. Dropping pages may not work in every container, so what depends on it is
 * asserted only when the drop visibly worked. */
static void test_cache(const ferry__iofile *f)
{
    const uint64_t S = FILE_SIZE;
    ferry__err e = {0};
    unsigned char *b = NULL;
    CHECK(posix_memalign((void **)&b, FERRY__IO_ALIGN, S) == 0);

    CHECK_EQ_INT(ferry__io_read(f, 0, S, b, FERRY_LOAD_READ, &e), 0);
    double warm = ferry__iofile_cached(f, 0, S);
    fprintf(stderr, "cached after buffered read: %.3f\n", warm);
    CHECK(warm >= 0.9);
    CHECK(ferry__iofile_cached(f, 0, 0) == 1.0);
    CHECK(ferry__iofile_cached(f, S, 10) == 0.0);
    double part = ferry__iofile_cached(f, 5, 3 * MIB + 1);
    CHECK(part >= 0.9 && part <= 1.0);

    CHECK_EQ_INT(ferry__iofile_drop_cache(f), 0);
    double cold = ferry__iofile_cached(f, 0, S);
    fprintf(stderr, "cached after drop: %.3f\n", cold);
    CHECK(cold >= 0.0 && cold <= warm);
    if (cold < 0.1) {
        /* direct reads leave the page cache alone; AUTO on cold data reads direct */
        memset(b, 0, S);
        CHECK_EQ_INT(ferry__io_read(f, 0, S, b, FERRY_LOAD_DIRECT, &e), 0);
        CHECK(memcmp(b, pattern, S) == 0);
        CHECK(ferry__iofile_cached(f, 0, S) < 0.1);
        memset(b, 0, S);
        CHECK_EQ_INT(ferry__io_read(f, 0, S, b, FERRY_LOAD_AUTO, &e), 0);
        CHECK(memcmp(b, pattern, S) == 0);
        CHECK(ferry__iofile_cached(f, 0, S) < 0.1);
        /* a mapping copy fills it */
        CHECK_EQ_INT(ferry__io_read(f, 16 * MIB, 8 * MIB, b, FERRY_LOAD_MMAP, &e), 0);
        CHECK(ferry__iofile_cached(f, 16 * MIB, 8 * MIB) >= 0.9);
        CHECK(memcmp(b, pattern + 16 * MIB, 8 * MIB) == 0);
    } else {
        fprintf(stderr, "note: drop_cache left %.0f%% cached; skipping cold checks\n",
                cold * 100);
    }
    free(b);
}

/* The read matrix and the page-cache effect of each mode through a pool of the backend
 * FERRY_IO_BACKEND selects (WANT: the backend that must result). */
static void test_pool(const ferry__iofile *f, const char *backend, const char *want)
{
    setenv("FERRY_IO_BACKEND", backend, 1);
    ferry__io *io = ferry__io_create(3);
    unsetenv("FERRY_IO_BACKEND");
    CHECK(io != NULL);
    if (!io)
        return;
    fprintf(stderr, "---- pool, FERRY_IO_BACKEND=%s: %s\n", backend, ferry__io_backend(io));
    CHECK_STR(ferry__io_backend(io), want);
    via_pool = io;
    test_modes(f);
    /* the same matrix with the smallest reads a pool may issue: many chunks per request */
    CHECK_EQ_INT(ferry__io_set_chunk(io, FERRY__IO_CHUNK_MIN), FERRY__IO_CHUNK_MIN);
    CHECK_EQ_INT(ferry__io_chunk(io), FERRY__IO_CHUNK_MIN);
    test_modes(f);
    ferry__io_set_chunk(io, 0);
    /* relayed: every request in chunks of FERRY__IO_RELAY_PIECE, whatever the pool's chunk */
    via_relay = 1;
    test_modes(f);
    via_relay = 0;
    via_pool = NULL;

    const uint64_t S = FILE_SIZE;
    ferry__err e = {0};
    unsigned char *b = NULL;
    CHECK(posix_memalign((void **)&b, FERRY__IO_ALIGN, S) == 0);
    CHECK_EQ_INT(ferry__iofile_drop_cache(f), 0);
    if (ferry__iofile_cached(f, 0, S) < 0.1) {
        /* DIRECT and AUTO on cold data bypass the page cache, READ fills it */
        const ferry_load modes[] = {FERRY_LOAD_DIRECT, FERRY_LOAD_AUTO, FERRY_LOAD_READ};
        for (size_t i = 0; i < FERRY__ARRAY_LEN(modes); i++) {
            CHECK_EQ_INT(ferry__iofile_drop_cache(f), 0);
            memset(b, 0, S);
            CHECK_EQ_INT(pool_read(io, f, 0, S, b, modes[i], &e), 0);
            CHECK(memcmp(b, pattern, S) == 0);
            double c = ferry__iofile_cached(f, 0, S);
            fprintf(stderr, "cached after a cold %s-mode read through the pool: %.3f\n",
                    mode_name(modes[i]), c);
            CHECK(modes[i] == FERRY_LOAD_READ ? c >= 0.9 : c < 0.1);
        }
    } else {
        fprintf(stderr, "note: drop_cache did not empty the cache; skipping cold pool checks\n");
    }
    /* errors through the pool carry their detail */
    CHECK_EQ_INT(pool_read(io, f, S - 10, 11, b, FERRY_LOAD_DIRECT, &e), FERRY_EIO);
    CHECK(strstr(e.msg, f->path) != NULL);
    free(b);
    ferry__io_destroy(io);
}

/* Anonymous mappings refused (the relay slots' allocation): relayed reads go straight into
 * their destination and still bring the file's bytes. */
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
static mmap_fn real_mmap;
static _Atomic int anon_refused;

static void *no_anon_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (flags & MAP_ANONYMOUS) {
        atomic_fetch_add(&anon_refused, 1);
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return real_mmap(addr, len, prot, flags, fd, off);
}

static void test_relay_nomem(const ferry__iofile *f, const char *backend)
{
    real_mmap = (mmap_fn)ferry_get_syscall("mmap");
    CHECK_EQ_INT(ferry_set_syscall("mmap", (ferry_syscall_ptr)no_anon_mmap), 0);
    atomic_store(&anon_refused, 0);
    setenv("FERRY_IO_BACKEND", backend, 1);
    ferry__io *io = ferry__io_create(2);
    unsetenv("FERRY_IO_BACKEND");
    unsigned char *b = NULL;
    CHECK(io && posix_memalign((void **)&b, FERRY__IO_ALIGN, FILE_SIZE) == 0);
    if (io && b) {
        ferry__err e = {0};
        via_relay = 1;
        memset(b, 0, FILE_SIZE);
        CHECK_EQ_INT(pool_read(io, f, 0, FILE_SIZE, b, FERRY_LOAD_DIRECT, &e), 0);
        CHECK(memcmp(b, pattern, FILE_SIZE) == 0);
        /* the relay readers' slots asked for once (where the file allows O_DIRECT), and never
         * again */
        CHECK_EQ_INT(atomic_load(&anon_refused), f->fd_direct >= 0);
        CHECK_EQ_INT(pool_read(io, f, 0, FILE_SIZE, b, FERRY_LOAD_DIRECT, &e), 0);
        CHECK(memcmp(b, pattern, FILE_SIZE) == 0);
        CHECK_EQ_INT(atomic_load(&anon_refused), f->fd_direct >= 0);
        CHECK_EQ_INT(ferry__io_relay_bytes(io), 0);
        via_relay = 0;
    }
    CHECK_EQ_INT(ferry_set_syscall("mmap", NULL), 0);
    free(b);
    ferry__io_destroy(io);
}

/* A relayed read of a file that shrank after open: FERRY_EIO naming the file and the offset
 * where the bytes ran out, nothing past what the file still holds copied to the destination;
 * the pool reads what is there afterwards. */
static void test_relay_shrunk(const char *dir, const char *backend)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/shrink_relayed.bin", dir);
    CHECK(check_write_file(path, pattern, 3 * MIB) == 0);
    ferry__iofile f;
    ferry__err e = {0};
    CHECK_EQ_INT(ferry__iofile_open(path, &f, &e), 0);
    CHECK(truncate(path, MIB + 100) == 0);
    setenv("FERRY_IO_BACKEND", backend, 1);
    ferry__io *io = ferry__io_create(2);
    unsetenv("FERRY_IO_BACKEND");
    unsigned char *b = NULL;
    CHECK(io && posix_memalign((void **)&b, FERRY__IO_ALIGN, 3 * MIB) == 0);
    if (io && b) {
        memset(b, 0x5A, 3 * MIB);
        via_relay = 1;
        CHECK_EQ_INT(pool_read(io, &f, 0, 3 * MIB, b, FERRY_LOAD_DIRECT, &e), FERRY_EIO);
        CHECK(strstr(e.msg, path) != NULL);
        /* the chunks wholly past the new end left their bytes alone */
        int untouched = 1;
        for (uint64_t i = 2 * MIB; i < 3 * MIB; i++)
            untouched &= b[i] == 0x5A;
        CHECK(untouched);
        CHECK_EQ_INT(pool_read(io, &f, 4096, MIB + 100 - 4096, b + 4096, FERRY_LOAD_DIRECT, &e),
                     0);
        CHECK(memcmp(b + 4096, pattern + 4096, MIB + 100 - 4096) == 0);
        via_relay = 0;
    }
    free(b);
    ferry__io_destroy(io);
    ferry__iofile_close(&f);
}

static void test_chunks(void)
{
    /* chunk boundaries: consecutive, covering the range, every one but the first aligned, for the
     * default chunk and others a pool may be set to */
    const uint64_t sizes[] = {FERRY__IO_CHUNK, FERRY__IO_CHUNK_MIN, 4 * MIB + 4096};
    for (size_t z = 0; z < FERRY__ARRAY_LEN(sizes); z++) {
        uint64_t ch = sizes[z];
        const uint64_t cases[][2] = {{0, 1}, {0, ch}, {1, ch}, {4095, 3 * ch + 7}, {ch - 1, 2},
                                     {12345, 0}};
        for (size_t i = 0; i < FERRY__ARRAY_LEN(cases); i++) {
            uint64_t off = cases[i][0], end = off + cases[i][1], n = 0;
            int ok = 1;
            for (uint64_t pos = off; pos < end; n++) {
                uint64_t next = ferry__io_chunk_end(off, end, pos, ch);
                ok &= next > pos && next - pos <= ch;
                ok &= next == end || next % FERRY__IO_ALIGN == 0;
                pos = next;
            }
            CHECK(ok);
            CHECK_EQ_INT(n, ferry__io_chunk_count(off, cases[i][1], ch));
        }
    }
    /* what a pool may be set to: 0 is the default, the rest clamped and block-aligned */
    CHECK_EQ_INT(ferry__io_set_chunk(NULL, 0), FERRY__IO_CHUNK);
    CHECK_EQ_INT(ferry__io_set_chunk(NULL, 1), FERRY__IO_CHUNK_MIN);
    CHECK_EQ_INT(ferry__io_set_chunk(NULL, UINT64_MAX), FERRY__IO_CHUNK_MAX);
    CHECK_EQ_INT(ferry__io_set_chunk(NULL, 4 * MIB + 100), 4 * MIB);
}

/* the streaming copy of the warm path: every head/body/tail split, against memcpy */
static void test_copy(void)
{
    const size_t sizes[] = {0, 1, 4095, FERRY__IO_STREAM_MIN - 1, FERRY__IO_STREAM_MIN,
                            FERRY__IO_STREAM_MIN + 1, FERRY__IO_STREAM_MIN + 16384 + 63,
                            3 * MIB + 4096 * 3 + 17};
    const size_t shifts[] = {0, 1, 15, 16, 64, 4095};
    size_t cap = 3 * MIB + 4096 * 3 + 17 + 8192;
    unsigned char *out = malloc(cap);
    int bad = 0;
    for (size_t i = 0; i < FERRY__ARRAY_LEN(sizes); i++)
        for (size_t a = 0; a < FERRY__ARRAY_LEN(shifts); a++)
            for (size_t b = 0; b < FERRY__ARRAY_LEN(shifts); b += 2) {
                memset(out, 0xEE, cap);
                ferry__io_copy(out + shifts[a], pattern + shifts[b], sizes[i]);
                bad += memcmp(out + shifts[a], pattern + shifts[b], sizes[i]) != 0;
                bad += out[shifts[a] + sizes[i]] != 0xEE;
                bad += shifts[a] && out[shifts[a] - 1] != 0xEE;
            }
    CHECK_EQ_INT(bad, 0);
    free(out);
}

int main(void)
{
    const char *dir = check_tmpdir("io");
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
    CHECK_EQ_INT(f.size, FILE_SIZE);
    CHECK(f.map != NULL && f.fd >= 0);
    CHECK_STR(f.path, path);
    if (f.fd_direct < 0)
        fprintf(stderr, "note: %s refuses O_DIRECT; direct reads are buffered\n", dir);

    test_chunks();
    test_copy();
    test_modes(&f);
    test_errors(&f, dir);
    test_cache(&f);
    test_shrunk(dir);
    test_pool(&f, "threads", "threads");
    test_pool(&f, "uring", ferry__io_uring_usable() ? "uring" : "threads");
    test_relay_shrunk(dir, "threads");
    test_relay_shrunk(dir, "uring");
    test_relay_nomem(&f, "threads");
    test_relay_nomem(&f, "uring");

    ferry__iofile_close(&f);
    CHECK_EQ_INT(f.fd, -1);
    CHECK(f.map == NULL && f.path == NULL);
    free(pattern);
    check_rmdir(dir);
    return check_finish();
}
