/*
 * test_cli_file_changes.c — `ferry run` while its model file changes under it, as a user sees
 * it: the file truncated in every load mode (zero-copy mmap, auto on a cached file, read, direct,
 * home disk copying out of the file), overwritten in place with the same size, or renamed over
 * under --verify. Every time the run exits 1 with a message naming the file and what changed;
 * it never dies of a signal, and --verify never reports differences with a file it did not open.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"

static char g_dir[1024], g_src[1200], g_other[1200];

static char *slurp_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return calloc(1, 1);
    char *buf = calloc(1, 1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (buf)
        buf[n] = 0;
    fclose(f);
    return buf;
}

static int sh(const char *fmt, const char *a, const char *b)
{
    char cmd[4000];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* 1 once process PID has PATH mapped (it opened the model). */
static int has_mapped(pid_t pid, const char *path)
{
    char maps[64];
    snprintf(maps, sizeof maps, "/proc/%d/maps", (int)pid);
    char *m = slurp_file(maps);
    int yes = m && strstr(m, path) != NULL;
    free(m);
    return yes;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef enum { TRUNCATE, OVERWRITE, RENAME } change_kind;

/* Starts `ferry run PATH ARGS --passes 1000000 -q`, waits until it has the file mapped and runs,
 * changes the file, and waits for it to end (at most 120 s, then it is killed). Returns the exit
 * status, or 128 + the signal; *ERR gets its stderr (free it). */
static int run_and_change(const char *path, const char *args, change_kind kind, char **err)
{
    char errp[1200], cmd[4000];
    snprintf(errp, sizeof errp, "%s/stderr.txt", g_dir);
    snprintf(cmd, sizeof cmd, "exec '%s' run '%s' %s --passes 1000000 -q >/dev/null 2>'%s'",
             FERRY_CLI, path, args, errp);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    for (int i = 0; i < 3000 && !has_mapped(pid, path); i++)
        sleep_ms(10);
    sleep_ms(300); /* passes are running */
    if (kind == TRUNCATE) {
        CHECK_EQ_INT(truncate(path, 1000), 0);
    } else if (kind == OVERWRITE) {
        /* `dd conv=notrunc`: other bytes in the middle, the same size */
        struct stat st;
        CHECK_EQ_INT(stat(path, &st), 0);
        int fd = open(path, O_WRONLY);
        CHECK(fd >= 0);
        static unsigned char junk[1 << 16];
        memset(junk, 0x5A, sizeof junk);
        CHECK_EQ_INT(pwrite(fd, junk, sizeof junk, st.st_size / 2), (long long)sizeof junk);
        close(fd);
    } else {
        CHECK_EQ_INT(rename(g_other, path), 0);
    }
    int st = 0;
    pid_t w = 0;
    for (int i = 0; i < 12000 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++)
        sleep_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fprintf(stderr, "  still running 120 s after the change: killed\n");
    }
    *err = slurp_file(errp);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* A fresh copy of the model at PATH, with its modification time an hour back, in the page
 * cache. */
static void fresh_copy(const char *path)
{
    CHECK_EQ_INT(sh("cp '%s' '%s'", g_src, path), 0);
    CHECK_EQ_INT(sh("cat '%s' >/dev/null%s", path, ""), 0);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    CHECK_EQ_INT(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void expect_changed(const char *what, int rc, const char *err, const char *path,
                           const char *detail)
{
    CHECK_EQ_INT(rc, 1);
    CHECK(strstr(err, path) != NULL);
    CHECK(strstr(err, "the file changed since it was opened") != NULL);
    CHECK(strstr(err, detail) != NULL);
    if (rc != 1 || !strstr(err, path) || !strstr(err, detail))
        fprintf(stderr, "  %s: exit %d (%s), stderr: %s\n", what, rc,
                rc > 128 ? strsignal(rc - 128) : "status", err);
}

static void test_truncated(void)
{
    static const struct {
        const char *args, *what;
    } modes[] = {
        {"--load mmap", "zero-copy from the mapping"},
        {"--load auto", "auto on a cached file (zero-copy)"},
        {"--load read", "private copies by read"},
        {"--load direct", "private copies by O_DIRECT"},
        {"--load mmap --home disk", "home disk: copies at each prepare"},
        {"--load mmap --device sim:64MiB", "staged to a device from the mapping"},
    };
    char path[1200];
    snprintf(path, sizeof path, "%s/trunc.gguf", g_dir);
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        fresh_copy(path);
        char *err = NULL;
        int rc = run_and_change(path, modes[i].args, TRUNCATE, &err);
        expect_changed(modes[i].what, rc, err, path, "-> 1000 bytes");
        free(err);
    }
}

static void test_overwritten(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/overwrite.gguf", g_dir);
    const char *modes[] = {"--load mmap", "--load read"};
    for (size_t i = 0; i < 2; i++) {
        fresh_copy(path);
        char *err = NULL;
        int rc = run_and_change(path, modes[i], OVERWRITE, &err);
        expect_changed(modes[i], rc, err, path, "modification time");
        free(err);
    }
}

static void test_verify_renamed(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/verify.gguf", g_dir);
    fresh_copy(path);
    CHECK_EQ_INT(sh("'%s' gen -o '%s' --size 16MiB --seed 7 >/dev/null", FERRY_CLI, g_other), 0);
    char *err = NULL;
    int rc = run_and_change(path, "--verify --load read", RENAME, &err);
    expect_changed("verify, renamed over", rc, err, path, "the path now names another file");
    /* what was verified was checked against the file ferry opened: no false differences */
    CHECK(strstr(err, "verify:") == NULL);
    free(err);
}

int main(void)
{
    const char *dir = check_tmpdir("cli_file_changes");
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    snprintf(g_src, sizeof g_src, "%s/model.gguf", dir);
    snprintf(g_other, sizeof g_other, "%s/other.gguf", dir);
    if (sh("'%s' gen -o '%s' --size 16MiB >/dev/null", FERRY_CLI, g_src) != 0)
        return 2;
    test_truncated();
    test_overwritten();
    test_verify_renamed();
    int rc = check_finish();
    if (!rc)
        check_rmdir(dir);
    return rc;
}
