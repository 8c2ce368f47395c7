/*
 * test_sigbus_guard.c — ferry_guard_sigbus: an engine reading a zero-copy tensor whose file was
 * truncated dies of SIGBUS without the guard, and with it reads zeros over the lost pages (the
 * bytes still in the file unchanged) while the file is reported changed; a SIGBUS outside
 * ferry's mappings goes to the handler installed before (SA_SIGINFO, plain, SIG_IGN for a sent
 * signal, SIG_DFL); turning the guard off puts that handler back. Each case runs in a child.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "check.h"
#include "model_fixture.h"

static char g_dir[1024];
static fixture_tensor g_ts[64];
static size_t g_n;

enum { EXIT_FAILED = 3 };

/* Runs BODY in a child: its exit status, or 128 + the signal that ended it. */
static int child(int (*body)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(body());
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

static void default_sigbus(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* ---- ferry's own mapping: a zero-copy tensor of a truncated file -------------------------------- */

static char g_model[1200];
static const uint64_t KEEP_PAGES = 2; /* pages of the largest tensor left in the file */

typedef struct zc {
    ferry *f;
    ferry_tensor *t;
    const unsigned char *p;
    uint64_t n, keep; /* tensor bytes; bytes of it still in the file after the truncation */
    unsigned char *want;
} zc;

/* Opens the model zero-copy, prepares its largest tensor, truncates the file inside it (at a
 * page boundary KEEP_PAGES pages past the tensor's first full page) and drops the page cache. */
static int zc_open(zc *z)
{
    memset(z, 0, sizeof *z);
    if (fixture_write(g_model, FERRY_FORMAT_GGUF, g_ts, g_n))
        return -1;
    z->f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP};
    size_t n = 0;
    ferry_tensor **ts = z->f ? fixture_open_all(z->f, g_model, &p, &n) : NULL;
    if (!ts)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!z->t || ferry_tensor_nbytes(ts[i]) > ferry_tensor_nbytes(z->t))
            z->t = ts[i];
    free(ts);
    if (ferry_prepare(z->f, &z->t, 1))
        return -1;
    ferry_tensor_info info;
    ferry_tensor_get_info(z->t, &info);
    z->p = ferry_tensor_data(z->t);
    z->n = info.nbytes;
    z->want = fixture_pread(g_model, info.offset, info.nbytes);
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t cut = (info.offset + pg - 1) / pg * pg + KEEP_PAGES * pg;
    if (!z->p || !z->want || cut >= info.offset + info.nbytes)
        return -1;
    z->keep = cut - info.offset;
    if (truncate(g_model, (off_t)cut))
        return -1;
    int fd = open(g_model, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    return 0;
}

/* Reads every byte of the tensor; 0 when those still in the file are the file's and the others
 * zeros. */
static int zc_read_all(const zc *z)
{
    const volatile unsigned char *p = z->p;
    int bad = 0;
    for (uint64_t i = 0; i < z->n; i++) {
        unsigned char b = p[i];
        if (i < z->keep ? b != z->want[i] : b != 0)
            bad = 1;
    }
    return bad;
}

static int body_no_guard(void)
{
    default_sigbus();
    zc z;
    if (zc_open(&z))
        return EXIT_FAILED;
    zc_read_all(&z); /* dies here */
    return 0;
}

static int body_guarded(void)
{
    default_sigbus();
    if (ferry_guard_sigbus(1) || ferry_guard_sigbus(1)) /* twice: idempotent */
        return EXIT_FAILED;
    zc z;
    if (zc_open(&z))
        return EXIT_FAILED;
    if (zc_read_all(&z) || zc_read_all(&z))
        return 10;
    if (ferry_check_files(z.f) != FERRY_ECHANGED)
        return 11;
    const char *msg = ferry_errmsg(z.f);
    if (!strstr(msg, g_model) || !strstr(msg, "pages of its mapping could no longer be read"))
        return 12;
    if (ferry_release(z.f, &z.t, 1) || ferry_prepare(z.f, &z.t, 1) != FERRY_ECHANGED)
        return 13;
    ferry_destroy(z.f);
    free(z.want);
    return 0;
}

/* ---- faults outside ferry's mappings go to the handler installed before ----------------------- */

/* A mapping of a file of its own, 4 pages, truncated to 1: *PAGE is the first lost byte. */
static const volatile unsigned char *own_lost_page(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/own.%d", g_dir, (int)getpid());
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)(4 * pg)))
        return NULL;
    unsigned char *m = mmap(NULL, 4 * pg, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, (off_t)pg))
        return NULL;
    close(fd);
    unlink(path);
    return m + 2 * pg;
}

static sigjmp_buf g_jump;
static volatile void *g_addr;

static void own_siginfo(int sig, siginfo_t *info, void *uctx)
{
    (void)sig, (void)uctx;
    g_addr = info->si_addr;
    siglongjmp(g_jump, 1);
}

static void own_plain(int sig)
{
    (void)sig;
    _exit(42);
}

static int body_chain_siginfo(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_siginfo;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) || ferry_guard_sigbus(1))
        return EXIT_FAILED;
    const volatile unsigned char *lost = own_lost_page();
    if (!lost)
        return EXIT_FAILED;
    if (sigsetjmp(g_jump, 1) == 0) {
        (void)*lost;
        return 20; /* no signal at all */
    }
    if (g_addr != (volatile void *)lost)
        return 21;
    /* ferry's own mappings are still guarded beside the engine's handler */
    zc z;
    if (zc_open(&z) || zc_read_all(&z))
        return 22;
    ferry_destroy(z.f);
    free(z.want);
    return 0;
}

static int body_chain_plain(void)
{
    signal(SIGBUS, own_plain);
    if (ferry_guard_sigbus(1))
        return EXIT_FAILED;
    const volatile unsigned char *lost = own_lost_page();
    if (!lost)
        return EXIT_FAILED;
    (void)*lost; /* own_plain exits 42 */
    return 0;
}

static int body_chain_default(void)
{
    default_sigbus();
    if (ferry_guard_sigbus(1))
        return EXIT_FAILED;
    const volatile unsigned char *lost = own_lost_page();
    if (!lost)
        return EXIT_FAILED;
    (void)*lost; /* the default action: killed by SIGBUS */
    return 0;
}

static int body_chain_default_raised(void)
{
    default_sigbus();
    if (ferry_guard_sigbus(1))
        return EXIT_FAILED;
    raise(SIGBUS);
    return 0;
}

static int body_chain_ignored(void)
{
    signal(SIGBUS, SIG_IGN);
    if (ferry_guard_sigbus(1))
        return EXIT_FAILED;
    raise(SIGBUS); /* sent, and ignored as asked */
    const volatile unsigned char *lost = own_lost_page();
    if (!lost)
        return EXIT_FAILED;
    (void)*lost; /* a fault cannot be ignored: the default action */
    return 0;
}

static int body_off_restores(void)
{
    struct sigaction sa, before, after;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = own_siginfo;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) || sigaction(SIGBUS, NULL, &before))
        return EXIT_FAILED;
    if (ferry_guard_sigbus(1))
        return 30;
    if (sigaction(SIGBUS, NULL, &after) || after.sa_sigaction == own_siginfo)
        return 31;
    if (ferry_guard_sigbus(0) || ferry_guard_sigbus(0))
        return 32;
    if (sigaction(SIGBUS, NULL, &after) || after.sa_sigaction != own_siginfo ||
        !(after.sa_flags & SA_SIGINFO))
        return 33;
    /* replaced by someone else after ferry's: off leaves it */
    if (ferry_guard_sigbus(1) || sigaction(SIGBUS, &sa, NULL))
        return 34;
    if (ferry_guard_sigbus(0) != FERRY_EBUSY)
        return 35;
    if (sigaction(SIGBUS, NULL, &after) || after.sa_sigaction != own_siginfo)
        return 36;
    return 0;
}

int main(void)
{
    const char *dir = check_tmpdir("sigbus_guard");
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    snprintf(g_model, sizeof g_model, "%s/model.gguf", dir);
    g_n = fixture_layout(g_ts, 2, 256, 512, 64, FERRY_DTYPE_F32, 0);

    /* Under ASan the default action of a fault may be the sanitizer's report and abort. */
    int dies = 128 + SIGBUS, rc;
    rc = child(body_no_guard);
    CHECK(rc == dies || (SANITIZED && rc > 128));
    CHECK_EQ_INT(child(body_guarded), 0);
    CHECK_EQ_INT(child(body_chain_siginfo), 0);
    CHECK_EQ_INT(child(body_chain_plain), 42);
    rc = child(body_chain_default);
    CHECK(rc == dies || (SANITIZED && rc > 128));
    CHECK_EQ_INT(child(body_chain_default_raised), dies);
    rc = child(body_chain_ignored);
    CHECK(rc == dies || (SANITIZED && rc > 128));
    CHECK_EQ_INT(child(body_off_restores), 0);
    rc = check_finish();
    if (!rc)
        check_rmdir(dir);
    return rc;
}
