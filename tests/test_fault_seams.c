/*
 * test_fault_seams.c — the test seams of ferry.h: the system calls of file reading replaced
 * through ferry_set_syscall to fail (open, fstat, mmap, pread), and ferry's own allocations failed
 * one at a time through ferry_fail_alloc, once and for good. Each failure must be an error with a
 * message (never a crash), and the manager must go on: the step retried works and the bytes are
 * the file's (a plain pread of the file, the seams off, is the reference).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

static char g_path[1100];

/* ---- system calls ------------------------------------------------------------------------------ */

typedef int (*open_fn)(const char *, int);
typedef int (*fstat_fn)(int, struct stat *);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static open_fn real_open;
static fstat_fn real_fstat;
static pread_fn real_pread;
static mmap_fn real_mmap;
static atomic_int g_calls, g_fail_at; /* the g_fail_at-th call fails (1-based); 0: none */

static int failing(void)
{
    int n = atomic_fetch_add(&g_calls, 1) + 1;
    return atomic_load(&g_fail_at) == n;
}

static int fake_open(const char *path, int flags)
{
    if (failing())
        return errno = EACCES, -1;
    return real_open(path, flags);
}

static int fake_fstat(int fd, struct stat *st)
{
    if (failing())
        return errno = EIO, -1;
    return real_fstat(fd, st);
}

static ssize_t fake_pread(int fd, void *buf, size_t n, off_t off)
{
    if (failing())
        return errno = EIO, -1;
    return real_pread(fd, buf, n, off);
}

static void *fake_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (failing())
        return errno = ENOMEM, MAP_FAILED;
    return real_mmap(addr, len, prot, flags, fd, off);
}

static void arm(int nth)
{
    atomic_store(&g_calls, 0);
    atomic_store(&g_fail_at, nth);
}

/* ferry_open fails with CODE and a message naming the file and WHY when the first call of NAME
 * fails; the same manager then opens the file. */
static void open_fails(const char *name, ferry_syscall_ptr fake, int code, const char *why)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_set_syscall(name, fake), 0);
    arm(1);
    int rc = ferry_open(f, g_path, NULL);
    CHECK_EQ_INT(ferry_set_syscall(name, NULL), 0);
    CHECK_EQ_INT(rc, code);
    const char *m = ferry_errmsg(f);
    if (!strstr(m, g_path) || !strstr(m, why))
        fprintf(stderr, "%s: '%s'\n", name, m);
    CHECK(strstr(m, g_path) != NULL);
    CHECK(strstr(m, why) != NULL);
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    ferry_tensor *t = ferry_find(f, "output.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_destroy(f);
}

static void test_syscalls(void)
{
    CHECK_EQ_INT(ferry_set_syscall("bogus", NULL), FERRY_ENOENT);
    CHECK(ferry_get_syscall("bogus") == NULL);
    CHECK(ferry_get_syscall(NULL) == NULL);
    real_open = (open_fn)ferry_get_syscall("open");
    real_fstat = (fstat_fn)ferry_get_syscall("fstat");
    real_pread = (pread_fn)ferry_get_syscall("pread");
    real_mmap = (mmap_fn)ferry_get_syscall("mmap");
    CHECK(real_open && real_fstat && real_pread && real_mmap);
    CHECK(ferry_get_syscall("close") && ferry_get_syscall("munmap"));

    open_fails("open", (ferry_syscall_ptr)fake_open, FERRY_EIO, "cannot open");
    open_fails("fstat", (ferry_syscall_ptr)fake_fstat, FERRY_EIO, "cannot stat");
    open_fails("mmap", (ferry_syscall_ptr)fake_mmap, FERRY_ENOMEM, "cannot map");

    /* a read that fails: prepare reports it naming the file, and the next prepare reads again */
    ferry *f = ferry_create(NULL);
    ferry_policy p = {0};
    p.load = FERRY_LOAD_READ;
    p.writable = 1;
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, "blk.1.ffn_down.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_set_syscall("pread", (ferry_syscall_ptr)fake_pread), 0);
    arm(1);
    int rc = ferry_prepare(f, &t, 1);
    CHECK_EQ_INT(rc, FERRY_EIO);
    const char *m = ferry_errmsg(f);
    if (!strstr(m, g_path) || !strstr(m, "blk.1.ffn_down.weight"))
        fprintf(stderr, "pread: '%s'\n", m);
    CHECK(strstr(m, g_path) != NULL);
    CHECK(strstr(m, "blk.1.ffn_down.weight") != NULL);
    CHECK(atomic_load(&g_calls) >= 1);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0); /* the fault was once: this read works */
    CHECK_EQ_INT(ferry_set_syscall("pread", NULL), 0);
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_destroy(f);
    CHECK(ferry_get_syscall("pread") == (ferry_syscall_ptr)real_pread);
}

/* ---- allocations ---------------------------------------------------------------------------- */

static uint64_t g_counted; /* allocations counted by the seam over the calls below */

static void seam(uint64_t nth, int persistent)
{
    g_counted += ferry_fail_alloc(nth, persistent);
}

/* STEP, retried once when it fails: a failure must be FERRY_ENOMEM with a message. Returns the
 * number of failures (0 or 1; a second failure is a defect unless PERSISTENT). */
#define STEP(expr)                                                                                \
    do {                                                                                          \
        int rc_ = (expr);                                                                         \
        if (rc_) {                                                                                \
            fails++;                                                                              \
            if (rc_ != FERRY_ENOMEM)                                                              \
                fprintf(stderr, "alloc %llu: %s: %s\n", (unsigned long long)nth, #expr,           \
                        ferry_errmsg(f));                                                         \
            CHECK_EQ_INT(rc_, FERRY_ENOMEM);                                                      \
            CHECK(ferry_errmsg(f)[0] != 0);                                                       \
            if (persistent)                                                                       \
                seam(0, 0);                                                           \
            rc_ = (expr);                                                                         \
            if (rc_)                                                                              \
                fprintf(stderr, "alloc %llu: %s again: %s\n", (unsigned long long)nth, #expr,     \
                        ferry_errmsg(f));                                                         \
            CHECK_EQ_INT(rc_, 0);                                                                 \
        }                                                                                         \
    } while (0)

/* Opens the model, prepares three tensors (host copies, read), checks their bytes, closes. With
 * an allocation failing at NTH. Returns the failures seen. */
static const char *g_device; /* compute device of the scenario's tensors; NULL: the host */

static int scenario(uint64_t nth, int persistent)
{
    seam(nth, persistent);
    int fails = 0;
    ferry *f = ferry_create(NULL);
    if (!f) { /* out of memory at creation is NULL: then it works once memory is back */
        fails++;
        seam(0, 0);
        f = ferry_create(NULL);
        CHECK(f != NULL);
        if (!f)
            return fails;
    }
    ferry_policy p = {0};
    p.load = FERRY_LOAD_READ;
    p.writable = 1;
    if (g_device)
        STEP(ferry_add_device(f, g_device, &p.compute_device));
    int rc = ferry_open(f, g_path, NULL);
    if (rc) {
        /* an open that ran out of memory half-way leaves its manager refusing further opens
         * (the catalog cannot take the half back): a new manager opens the file */
        fails++;
        CHECK_EQ_INT(rc, FERRY_ENOMEM);
        CHECK(ferry_errmsg(f)[0] != 0);
        ferry_destroy(f);
        if (persistent)
            seam(0, 0);
        f = ferry_create(NULL);
        CHECK(f != NULL);
        if (!f)
            return fails;
        if (g_device)
            CHECK_EQ_INT(ferry_add_device(f, g_device, &p.compute_device), 0);
        CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    }
    STEP(ferry_group_add(f, "all", "*", &p));
    static const char *names[] = {"token_embd.weight", "blk.0.attn_q.weight", "output.weight"};
    ferry_tensor *ts[3];
    for (int i = 0; i < 3; i++) {
        ts[i] = ferry_find(f, names[i]);
        CHECK(ts[i] != NULL);
        if (!ts[i])
            break;
        STEP(ferry_prepare(f, &ts[i], 1));
    }
    seam(0, 0); /* the check itself reads through ferry_tensor_read */
    for (int i = 0; i < 3; i++) {
        if (ts[i]) {
            CHECK(fixture_same_as_file(f, ts[i]));
            CHECK_EQ_INT(ferry_release(f, &ts[i], 1), 0);
        }
    }
    ferry_destroy(f);
    return fails;
}

static void test_allocations(const char *device)
{
    g_device = device;
    printf("allocations, compute on %s\n", device ? device : "the host");
    seam(0, 0);
    g_counted = 0;
    CHECK_EQ_INT(scenario(0, 0), 0);
    seam(0, 0);
    uint64_t count = g_counted;
    printf("scenario: %llu allocations\n", (unsigned long long)count);
    CHECK(count > 10);
    int failed_runs = 0;
    for (uint64_t nth = 1; nth <= count; nth++)
        failed_runs += scenario(nth, 0) > 0;
    for (uint64_t nth = 1; nth <= count; nth += 7)
        failed_runs += scenario(nth, 1) > 0;
    seam(0, 0);
    printf("runs with an allocation failure reported: %d\n", failed_runs);
    CHECK(failed_runs > 0);
}

int main(void)
{
    setenv("FERRY_IO_BACKEND", "threads", 1); /* reads through pread, where the seam is */
    const char *dir = check_tmpdir("fault_seams");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, 2, 256, 512, 512, FERRY_DTYPE_F16, 0);
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, ts, n)) {
        fprintf(stderr, "cannot write %s\n", g_path);
        return 1;
    }
    test_syscalls();
    test_allocations(NULL);
    test_allocations("sim:64MiB");
    if (getenv("FERRY_CUDART"))
        test_allocations("cuda:0"); /* the fake runtime in the test suite */
    else
        printf("cuda: skipped (no FERRY_CUDART)\n");
    check_rmdir(dir);
    return check_finish();
}
