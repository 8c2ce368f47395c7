/*
 * test_file_changes.c — a model file that changes while ferry has it open, through the public
 * API: truncated, overwritten in place with the same size, given a new modification time, renamed
 * over or removed. The next prepare (or ferry_check_files, ferry_read_rows, ferry_load_group)
 * fails with FERRY_ECHANGED naming the file and what changed; ferry's own copies out of a file
 * that shrank (prefetch jobs of every mapped configuration, which no check precedes) end in an
 * error, never in SIGBUS; ferry_tensor_read_file reads the file ferry opened, not the path.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "model_fixture.h"

static char g_dir[1024];
static fixture_tensor g_ts[64];
static size_t g_n;

/* A fresh copy of the fixture model at PATH, with a modification time an hour in the past (so a
 * write after open gives it a new one even on coarse clocks). */
static int make_model(const char *path)
{
    if (fixture_write(path, FERRY_FORMAT_GGUF, g_ts, g_n))
        return -1;
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    return utimensat(AT_FDCWD, path, ts, 0);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The largest tensor of the set (its bytes lie deepest past a truncation). */
static ferry_tensor *largest(ferry_tensor **ts, size_t n)
{
    ferry_tensor *best = NULL;
    for (size_t i = 0; i < n; i++)
        if (!best || ferry_tensor_nbytes(ts[i]) > ferry_tensor_nbytes(best))
            best = ts[i];
    return best;
}

static int has(const char *s, const char *part)
{
    return s && part && strstr(s, part) != NULL;
}

static ferry *open_model(const char *dev, const char *path, ferry_home home, ferry_load load,
                         ferry_tensor ***ts, size_t *n)
{
    ferry *f = ferry_create(NULL);
    if (!f)
        return NULL;
    int d = 0;
    if (strcmp(dev, "cpu") != 0 && ferry_add_device(f, dev, &d)) {
        ferry_destroy(f);
        return NULL;
    }
    ferry_policy p = {.home = home, .compute_device = d, .load = load};
    *ts = fixture_open_all(f, path, &p, n);
    if (!*ts) {
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

/* A fresh fixture model NAME in the scratch folder (PATH, of 1200 bytes, gets its path), opened
 * on the cpu with HOME and LOAD (*TS, *N as open_model); both steps checked. NULL on failure. */
static ferry *fresh_model(const char *name, char *path, ferry_home home, ferry_load load,
                          ferry_tensor ***ts, size_t *n)
{
    snprintf(path, 1200, "%s/%s", g_dir, name);
    CHECK_EQ_INT(make_model(path), 0);
    *ts = NULL;
    *n = 0;
    ferry *f = open_model("cpu", path, home, load, ts, n);
    CHECK(f != NULL);
    return f;
}

/* ---- 1. truncation between prepares, every home, load mode and device -------------------------- */

static void test_truncate_between_prepares(void)
{
    static const char *devs[] = {"cpu", "sim:64MiB"};
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    static const ferry_load loads[] = {FERRY_LOAD_MMAP, FERRY_LOAD_AUTO, FERRY_LOAD_READ,
                                       FERRY_LOAD_DIRECT};
    char path[1200];
    snprintf(path, sizeof path, "%s/trunc.gguf", g_dir);
    for (size_t d = 0; d < 2; d++)
        for (size_t h = 0; h < 3; h++)
            for (size_t l = 0; l < 4; l++) {
                if (h == 2 && d == 0)
                    continue; /* home device on the cpu is home host */
                CHECK_EQ_INT(make_model(path), 0);
                uint64_t size = file_size(path);
                ferry_tensor **ts = NULL;
                size_t n = 0;
                ferry *f = open_model(devs[d], path, homes[h], loads[l], &ts, &n);
                CHECK(f != NULL);
                if (!f)
                    continue;
                CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
                for (size_t i = 0; i < n; i++)
                    CHECK(fixture_same_as_file(f, ts[i]));
                CHECK_EQ_INT(ferry_release(f, ts, n), 0);
                CHECK_EQ_INT(ferry_check_files(f), 0);
                CHECK_EQ_INT(truncate(path, 1000), 0);
                int rc = ferry_prepare(f, ts, n);
                CHECK_EQ_INT(rc, FERRY_ECHANGED);
                const char *msg = ferry_errmsg(f);
                CHECK(has(msg, path));
                char want[96];
                snprintf(want, sizeof want, "size %llu -> 1000 bytes", (unsigned long long)size);
                CHECK(has(msg, want));
                if (rc != FERRY_ECHANGED || !has(msg, want))
                    fprintf(stderr, "  %s home %d load %d: %d %s\n", devs[d], (int)homes[h],
                            (int)loads[l], rc, msg);
                /* one tensor at a time, too: each touches the file */
                CHECK_EQ_INT(ferry_prepare(f, &ts[n - 1], 1), FERRY_ECHANGED);
                CHECK_EQ_INT(ferry_check_files(f), FERRY_ECHANGED);
                CHECK(has(ferry_errmsg(f), path));
                /* nothing is held: every release is refused */
                CHECK_EQ_INT(ferry_release(f, &ts[0], 1), FERRY_EINVAL);
                free(ts);
                ferry_destroy(f);
            }
}

/* ---- 2. ferry's own copies from a file that shrank: prefetches, which no check precedes -------- */

/* Runs BODY in a child; 1 when it exited 0 (not killed by a signal). */
static int in_child(int (*body)(const char *, void *), const char *path, void *arg,
                    int *signal_out)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(body(path, arg) ? 1 : 0);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return 0;
    *signal_out = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

typedef struct shrink_case {
    const char *dev;
    ferry_home home;
    ferry_load load;
    const char *adapter; /* merged LoRA adapter, or NULL */
    const char *what;
} shrink_case;

/* Opens, truncates, prefetches everything (copies out of the mapping: staging, populate, merge,
 * home-disk copies), waits for the prefetches, then prepares: ECHANGED. Nonzero on a failure. */
static int shrink_body(const char *path, void *arg)
{
    const shrink_case *c = arg;
    ferry_tensor **ts = NULL;
    size_t n = 0;
    ferry *f = open_model(c->dev, path, c->home, c->load, &ts, &n);
    if (!f)
        return 1;
    int bad = 0;
    if (c->adapter && ferry_lora_add(f, c->adapter, 1.0f, NULL, NULL))
        bad = 1;
    /* drop the page cache, so that populate and copies must go to the file */
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (truncate(path, 4096))
        bad = 1;
    if (ferry_prefetch(f, ts, n) != 0)
        bad = 1;
    ferry_release_all(f); /* waits for the prefetches in flight */
    if (ferry_prepare(f, ts, n) != FERRY_ECHANGED || !has(ferry_errmsg(f), path))
        bad = 1;
    free(ts);
    ferry_destroy(f);
    return bad;
}

static void test_own_copies_never_fault(void)
{
    char path[1200], adapter[1200], cmd[4000];
    snprintf(path, sizeof path, "%s/shrink.gguf", g_dir);
    snprintf(adapter, sizeof adapter, "%s/adapter.safetensors", g_dir);
    CHECK_EQ_INT(make_model(path), 0);
    snprintf(cmd, sizeof cmd, "'%s' gen --lora '%s' -o '%s' --rank 4 >/dev/null 2>&1", FERRY_CLI,
             path, adapter);
    CHECK_EQ_INT(system(cmd), 0);
    const shrink_case cases[] = {
        {"cpu", FERRY_HOME_DISK, FERRY_LOAD_MMAP, NULL, "home disk, copies out of the mapping"},
        {"cpu", FERRY_HOME_HOST, FERRY_LOAD_MMAP, NULL, "zero-copy home, populate"},
        {"sim:64MiB", FERRY_HOME_HOST, FERRY_LOAD_MMAP, NULL, "staging from the mapped home"},
        {"sim:64MiB", FERRY_HOME_DISK, FERRY_LOAD_MMAP, NULL, "staging from the file, mmap mode"},
        {"cpu", FERRY_HOME_HOST, FERRY_LOAD_MMAP, adapter, "LoRA merge from the mapped home"},
        {"sim:64MiB", FERRY_HOME_HOST, FERRY_LOAD_AUTO, adapter, "merge staged to the sim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(make_model(path), 0);
        int sig = 0;
        int ok = in_child(shrink_body, path, (void *)&cases[i], &sig);
        CHECK(ok);
        CHECK_EQ_INT(sig, 0);
        if (!ok)
            fprintf(stderr, "  %s: %s\n", cases[i].what,
                    sig ? strsignal(sig) : "wrong result");
    }
}

/* ---- 3. overwritten in place (same size), new modification time, renamed over, removed --------- */

static void test_overwrite_in_place(void)
{
    char path[1200];
    ferry_tensor **ts;
    size_t n;
    ferry *f = fresh_model("overwrite.gguf", path, FERRY_HOME_HOST, FERRY_LOAD_MMAP, &ts, &n);
    if (!f)
        return;
    uint64_t size = file_size(path);
    ferry_tensor *big = largest(ts, n);
    ferry_tensor_info info;
    ferry_tensor_get_info(big, &info);
    CHECK_EQ_INT(ferry_prepare(f, &big, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &big, 1), 0);
    /* what `dd conv=notrunc` does: the same size, other bytes, a new modification time */
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    unsigned char junk[4096];
    memset(junk, 0xA5, sizeof junk);
    CHECK_EQ_INT(pwrite(fd, junk, sizeof junk, (off_t)info.offset), (long long)sizeof junk);
    close(fd);
    CHECK_EQ_INT(file_size(path), size);
    CHECK_EQ_INT(ferry_prepare(f, &big, 1), FERRY_ECHANGED);
    CHECK(has(ferry_errmsg(f), path));
    CHECK(has(ferry_errmsg(f), "modification time"));
    CHECK(!has(ferry_errmsg(f), "size"));
    CHECK_EQ_INT(ferry_check_files(f), FERRY_ECHANGED);
    CHECK(has(ferry_errmsg(f), "modification time"));
    free(ts);
    ferry_destroy(f);
}

static void test_mtime_only(void)
{
    char path[1200];
    ferry_tensor **ts;
    size_t n;
    ferry *f = fresh_model("mtime.gguf", path, FERRY_HOME_HOST, FERRY_LOAD_READ, &ts, &n);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    CHECK_EQ_INT(utimensat(AT_FDCWD, path, NULL, 0), 0); /* now */
    CHECK_EQ_INT(ferry_prepare(f, ts, n), FERRY_ECHANGED);
    CHECK(has(ferry_errmsg(f), "modification time"));
    CHECK(has(ferry_errmsg(f), g_ts[0].name)); /* the first tensor of the set is named */
    uint64_t row = 0;
    unsigned char buf[1 << 16];
    CHECK_EQ_INT(ferry_read_rows(f, ts[0], &row, 1, buf), FERRY_ECHANGED);
    CHECK(has(ferry_errmsg(f), path));
    free(ts);
    ferry_destroy(f);
}

static void test_renamed_over(void)
{
    char path[1200], other[1200], second[1200];
    snprintf(path, sizeof path, "%s/renamed.gguf", g_dir);
    snprintf(other, sizeof other, "%s/renamed.new", g_dir);
    snprintf(second, sizeof second, "%s/second.gguf", g_dir);
    CHECK_EQ_INT(make_model(path), 0);
    CHECK_EQ_INT(make_model(second), 0);
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP};
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    CHECK_EQ_INT(ferry_open(f, second, "b."), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, g_ts[1].name);
    char bname[128];
    snprintf(bname, sizeof bname, "b.%s", g_ts[1].name);
    ferry_tensor *tb = ferry_find(f, bname);
    CHECK(t != NULL && tb != NULL);
    if (!t || !tb) {
        ferry_destroy(f);
        return;
    }
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    unsigned char *before = fixture_pread(path, info.offset, info.nbytes);
    CHECK(before != NULL);
    /* a prepare looks the path up (at most every 100 ms per file) */
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    /* another model (other values) renamed over the path, as a download tool does */
    fixture_tensor alt[64];
    size_t alt_n = fixture_layout(alt, 3, 64, 128, 100, FERRY_DTYPE_F32, 0);
    CHECK_EQ_INT(fixture_write(other, FERRY_FORMAT_GGUF, alt, alt_n), 0);
    CHECK_EQ_INT(rename(other, path), 0);
    unsigned char *now = fixture_pread(path, info.offset, info.nbytes);
    CHECK(now != NULL && before != NULL && memcmp(now, before, info.nbytes) != 0);
    /* the descriptor ferry holds still reads the file it opened */
    unsigned char *got = malloc(info.nbytes);
    CHECK_EQ_INT(ferry_tensor_read_file(f, t, 0, info.nbytes, got), 0);
    CHECK(before != NULL && memcmp(got, before, info.nbytes) == 0);
    struct timespec pause = {0, 150 * 1000000L}; /* past the interval of path lookups */
    nanosleep(&pause, NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), FERRY_ECHANGED);
    CHECK(has(ferry_errmsg(f), path));
    CHECK(has(ferry_errmsg(f), "the path now names another file"));
    /* the other file's tensors are unaffected: the manager stays usable */
    CHECK_EQ_INT(ferry_prepare(f, &tb, 1), 0);
    CHECK(fixture_same_as_file(f, tb));
    CHECK_EQ_INT(ferry_release(f, &tb, 1), 0);
    CHECK_EQ_INT(ferry_check_files(f), FERRY_ECHANGED);
    free(before), free(now), free(got);
    ferry_destroy(f);
}

static void test_removed_is_no_change(void)
{
    char path[1200];
    ferry_tensor **ts;
    size_t n;
    ferry *f = fresh_model("removed.gguf", path, FERRY_HOME_DISK, FERRY_LOAD_READ, &ts, &n);
    if (!f)
        return;
    ferry_tensor *t = largest(ts, n);
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    unsigned char *want = fixture_pread(path, info.offset, info.nbytes);
    CHECK_EQ_INT(unlink(path), 0);
    /* the bytes ferry opened are still there, through its descriptor */
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    unsigned char *got = malloc(info.nbytes);
    CHECK_EQ_INT(ferry_tensor_read(f, t, 0, info.nbytes, got), 0);
    CHECK(want && memcmp(want, got, info.nbytes) == 0);
    CHECK_EQ_INT(ferry_tensor_read_file(f, t, 0, info.nbytes, got), 0);
    CHECK(want && memcmp(want, got, info.nbytes) == 0);
    CHECK_EQ_INT(ferry_tensor_read_file(f, t, 1, info.nbytes, got), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_check_files(f), 0);
    free(want), free(got), free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("file_changes");
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    g_n = fixture_layout(g_ts, 3, 64, 128, 100, FERRY_DTYPE_F16, 0);
    CHECK_STR(ferry_strerror(FERRY_ECHANGED), "the model file changed since it was opened");
    test_truncate_between_prepares();
    test_own_copies_never_fault();
    test_overwrite_in_place();
    test_mtime_only();
    test_renamed_over();
    test_removed_is_no_change();
    int rc = check_finish();
    if (!rc)
        check_rmdir(dir);
    return rc;
}
