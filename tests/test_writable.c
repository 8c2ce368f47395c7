/*
 * test_writable.c — which memory at ferry_tensor_data the engine may write, in every cache state:
 *  - memory served from the file mapping (load mmap, load auto on a cached file, lazy tensors)
 *    faults on a write (checked in a child process: SIGSEGV), whether the pages were cached or not;
 *  - ferry_tensor_writable says 0 for every tensor whose policy lets it be the mapping, under load
 *    auto whether the cold file gave it a private copy or the warm file the mapping;
 *  - a policy with `writable` gives every tensor a private copy (never the mapping, never lazy) in
 *    every load mode and cache state: writable says 1, the bytes are the file's (plain pread), a
 *    write lands in the copy and leaves the file and the other tensors alone;
 *  - a staged copy on an accelerator (sim) is private: writable says 1.
 */
#include <signal.h>
#include <sys/wait.h>

#include "check.h"
#include "model_fixture.h"

static char g_path[1200];

static int warm(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    unsigned char buf[65536];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
    return 0;
}

/* Writes one byte at P in a child process; returns the signal that ended it (0: the write worked). */
static int write_in_child(void *p)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* the fault itself, not a sanitizer's report of it */
        *(volatile unsigned char *)p ^= 0x5A;
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

/* The placement ferry_plan gives NAME (zero_copy, lazy); 0 when found. */
static int placement(ferry *f, const char *name, int *zero_copy, int *lazy)
{
    ferry_placement *pl = NULL;
    size_t n = 0;
    if (ferry_plan(f, &pl, &n, NULL))
        return -1;
    int rc = -1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(pl[i].name, name)) {
            *zero_copy = pl[i].zero_copy;
            *lazy = pl[i].lazy;
            rc = 0;
        }
    free(pl);
    return rc;
}

/* A manager over the model with every tensor under LOAD, LAZY and WRITABLE, the file dropped from
 * the page cache first when COLD, read through when not; *TS its tensors (free() it), *N how many. */
static ferry *open_in_state(ferry_load load, ferry_lazy lazy, int writable, int cold,
                            ferry_tensor ***ts, size_t *n)
{
    CHECK_EQ_INT(cold ? fixture_drop_cache(g_path) : warm(g_path), 0);
    ferry *f = ferry_create(NULL);
    ferry_policy p = {0};
    p.load = load;
    p.lazy = lazy;
    p.writable = writable;
    *n = 0;
    *ts = fixture_open_all(f, g_path, &p, n);
    return f;
}

/* Default policy but LOAD and LAZY: nothing is writable; what the plan serves from the mapping
 * faults on a write. Returns how many tensors were zero-copy or lazy. */
static int check_read_only(ferry_load load, ferry_lazy lazy, int cold)
{
    ferry_tensor **ts;
    size_t n;
    ferry *f = open_in_state(load, lazy, 0, cold, &ts, &n);
    CHECK(ts && n > 0);
    int mapped = 0;
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; ts && i < n; i++) {
        ferry_tensor_info info;
        ferry_tensor_get_info(ts[i], &info);
        CHECK(fixture_same_as_file(f, ts[i]));
        CHECK_EQ_INT(ferry_tensor_writable(ts[i]), 0);
        int zc = -1, lz = -1;
        CHECK_EQ_INT(placement(f, info.name, &zc, &lz), 0);
        if (zc || lz) {
            mapped++;
            CHECK_EQ_INT(write_in_child(ferry_tensor_data(ts[i])), SIGSEGV);
        }
    }
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    free(ts);
    ferry_destroy(f);
    return mapped;
}

static void test_read_only(void)
{
    size_t n_tensors = 0;
    {
        ferry_catalog *c = ferry_catalog_create();
        CHECK_EQ_INT(ferry_catalog_add(c, g_path, NULL), 0);
        n_tensors = ferry_catalog_count(c);
        ferry_catalog_destroy(c);
    }
    for (int cold = 0; cold < 2; cold++) {
        /* mmap: every tensor is the mapping, cached or not */
        CHECK_EQ_INT(check_read_only(FERRY_LOAD_MMAP, FERRY_LAZY_OFF, cold), (int)n_tensors);
        /* lazy: behind the mapping whatever the load mode */
        CHECK_EQ_INT(check_read_only(FERRY_LOAD_READ, FERRY_LAZY_ON, cold), (int)n_tensors);
    }
    /* auto: the warm file is served from the mapping; the cold one with private copies (where the
     * kernel honours DONTNEED), and writable still says 0 for them */
    CHECK_EQ_INT(check_read_only(FERRY_LOAD_AUTO, FERRY_LAZY_OFF, 0), (int)n_tensors);
    int cold_mapped = check_read_only(FERRY_LOAD_AUTO, FERRY_LAZY_OFF, 1);
    if (cold_mapped == (int)n_tensors)
        printf("test_read_only: auto's cold part saw a cached file (DONTNEED not honoured)\n");
    else
        CHECK(cold_mapped < (int)n_tensors);
}

/* policy.writable under LOAD / LAZY in one cache state: private copies with the file's bytes,
 * written in place without touching the file or another tensor. */
static void check_writable(ferry_load load, ferry_lazy lazy, int cold)
{
    ferry_tensor **ts;
    size_t n;
    ferry *f = open_in_state(load, lazy, 1, cold, &ts, &n);
    CHECK(ts && n >= 2);
    if (!ts || n < 2) {
        ferry_destroy(f);
        free(ts);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info info;
        ferry_tensor_get_info(ts[i], &info);
        int zc = -1, lz = -1;
        CHECK_EQ_INT(placement(f, info.name, &zc, &lz), 0);
        CHECK_EQ_INT(zc, 0);
        CHECK_EQ_INT(lz, 0);
        CHECK_EQ_INT(ferry_tensor_writable(ts[i]), 0); /* not prepared */
    }
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK(fixture_same_as_file(f, ts[i]));
        CHECK_EQ_INT(ferry_tensor_writable(ts[i]), 1);
        CHECK_EQ_INT(write_in_child(ferry_tensor_data(ts[i])), 0);
    }
    /* write the first tensor whole; the file and the second tensor keep their bytes */
    ferry_tensor_info a, b;
    ferry_tensor_get_info(ts[0], &a);
    ferry_tensor_get_info(ts[1], &b);
    unsigned char *before = fixture_pread(g_path, a.offset, a.nbytes);
    memset(ferry_tensor_data(ts[0]), 0xC3, a.nbytes);
    unsigned char *after = fixture_pread(g_path, a.offset, a.nbytes);
    unsigned char *got = malloc(a.nbytes);
    CHECK(before && after && got && memcmp(before, after, a.nbytes) == 0);
    CHECK_EQ_INT(ferry_tensor_read(f, ts[0], 0, a.nbytes, got), 0);
    int all = 1;
    for (uint64_t k = 0; got && k < a.nbytes; k++)
        all &= got[k] == 0xC3;
    CHECK(all);
    CHECK(fixture_same_as_file(f, ts[1]));
    free(before), free(after), free(got);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    CHECK_EQ_INT(ferry_tensor_writable(ts[0]), 0);
    free(ts);
    ferry_destroy(f);
    (void)b;
}

static void test_writable_policy(void)
{
    const ferry_load loads[] = {FERRY_LOAD_AUTO, FERRY_LOAD_MMAP, FERRY_LOAD_READ,
                                FERRY_LOAD_DIRECT};
    for (int cold = 0; cold < 2; cold++)
        for (size_t i = 0; i < sizeof loads / sizeof loads[0]; i++)
            check_writable(loads[i], FERRY_LAZY_OFF, cold);
    check_writable(FERRY_LOAD_MMAP, FERRY_LAZY_ON, 0);
    check_writable(FERRY_LOAD_AUTO, FERRY_LAZY_ON, 1);
}

/* On an accelerator the engine's copy is a staged device copy: private. */
static void test_staged(void)
{
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
    ferry_policy p = {0};
    p.compute_device = dev;
    p.load = FERRY_LOAD_MMAP;
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
    CHECK(ts && n > 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_INT(ferry_tensor_writable(ts[i]), 1);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("writable");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    if (fixture_write_llama(g_path, 2, 256, 512, 512, FERRY_DTYPE_F32))
        return 1;
    test_read_only();
    test_writable_policy();
    test_staged();
    check_rmdir(dir);
    return check_finish();
}
