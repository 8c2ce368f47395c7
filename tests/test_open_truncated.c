/*
 * test_open_truncated.c — a model file truncated while ferry opens it never kills the program
 * with SIGBUS, SIGBUS guard off: the open either succeeds or fails with an error naming the file.
 *
 * Deterministic cases cut the file at a chosen read of its header (the catalog's read seam): a
 * GGUF before its first read and at a later one (its header takes several), a safetensors file
 * at its JSON header, an index while it is read and its shard at its first read, each failing
 * with FERRY_ECHANGED; a GGUF cut inside its data section only opens, and ferry_check_files then
 * reports the change. A last case races a process that cuts and restores a GGUF against repeated
 * opens. Every open runs in a child, so that a signal is a failed check and not a dead test.
 * Files are written here from the format specifications.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "ferry.h"

/* The catalog's read seam, as formats/catalog.h declares it. Weak, so that this file also links
 * against a library without it (the race case still runs there; the seam cases fail). */
extern void (*ferry__catalog_read_hook)(const char *path, uint64_t offset, uint64_t len)
    __attribute__((weak));

static const char *g_dir;
static char g_gguf[1200], g_st[1200], g_index[1200], g_shard[1200];
static uint64_t g_gguf_size, g_gguf_header; /* bytes of the file; where its data section starts */

/* ---- files ----------------------------------------------------------------------------------- */

typedef struct obuf {
    unsigned char *p;
    size_t n, cap;
} obuf;

static void put(obuf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void put_u32(obuf *b, uint32_t v)
{
    unsigned char q[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(b, q, 4);
}

static void put_u64(obuf *b, uint64_t v)
{
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(obuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = fwrite(p, 1, n, fp) == n;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

/* A GGUF v3 file: a tokenizer of VOCAB strings (the header then needs several reads), general.
 * alignment 32, and 4 f32 tensors of ELEMS elements each, "w.0" .. "w.3". */
static int write_gguf(const char *path, unsigned vocab, uint64_t elems)
{
    obuf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 4); /* tensors */
    put_u64(&b, 2); /* key/values */
    put_str(&b, "general.alignment");
    put_u32(&b, 4); /* u32 */
    put_u32(&b, 32);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, 9); /* array */
    put_u32(&b, 8); /* of strings */
    put_u64(&b, vocab);
    for (unsigned i = 0; i < vocab; i++) {
        char tok[32];
        snprintf(tok, sizeof tok, "tok%07u", i);
        put_str(&b, tok);
    }
    for (int t = 0; t < 4; t++) {
        char name[16];
        snprintf(name, sizeof name, "w.%d", t);
        put_str(&b, name);
        put_u32(&b, 1);
        put_u64(&b, elems);
        put_u32(&b, 0); /* f32 */
        put_u64(&b, (uint64_t)t * elems * 4);
    }
    static const unsigned char zero[32];
    put(&b, zero, (32 - b.n % 32) % 32);
    g_gguf_header = b.n;
    uint64_t data = 4 * elems * 4;
    int rc = write_file(path, b.p, b.n);
    free(b.p);
    /* the data section, zeros: a hole */
    if (rc == 0 && truncate(path, (off_t)(g_gguf_header + data)) != 0)
        rc = -1;
    g_gguf_size = g_gguf_header + data;
    return rc;
}

/* A safetensors file of N one-byte U8 tensors "tNNNNNN" (a header of about 67 N bytes). */
static int write_st(const char *path, unsigned n)
{
    obuf b = {0};
    put(&b, "\0\0\0\0\0\0\0\0{", 9);
    for (unsigned i = 0; i < n; i++) {
        char m[128];
        int k = snprintf(m, sizeof m, "%s\"t%06u\":{\"dtype\":\"U8\",\"shape\":[1],"
                                      "\"data_offsets\":[%u,%u]}",
                         i ? "," : "", i, i, i + 1);
        put(&b, m, (size_t)k);
    }
    put(&b, "}", 1);
    while (b.n % 8)
        put(&b, " ", 1);
    uint64_t len = b.n - 8;
    for (int i = 0; i < 8; i++)
        b.p[i] = (unsigned char)(len >> (8 * i));
    for (unsigned i = 0; i < n; i++)
        put(&b, "\x01", 1);
    int rc = write_file(path, b.p, b.n);
    free(b.p);
    return rc;
}

/* An index naming the N tensors of write_st's shard SHARD (a bare file name). */
static int write_index(const char *path, const char *shard, unsigned n)
{
    obuf b = {0};
    const char *head = "{\"metadata\":{\"total_size\":1},\"weight_map\":{";
    put(&b, head, strlen(head));
    for (unsigned i = 0; i < n; i++) {
        char m[256];
        int k = snprintf(m, sizeof m, "%s\"t%06u\":\"%s\"", i ? "," : "", i, shard);
        put(&b, m, (size_t)k);
    }
    put(&b, "}}\n", 3);
    int rc = write_file(path, b.p, b.n);
    free(b.p);
    return rc;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- the seam: cut PATH at its AT-th header read ---------------------------------------------- */

enum { CUT_TO_OFFSET = -1 }; /* cut where the read starts: what was read stays */

static struct {
    const char *path;
    int at, calls;
    int64_t to;
    uint64_t off; /* where the read that was cut starts */
} g_cut;

static void cut_hook(const char *path, uint64_t off, uint64_t len)
{
    (void)len;
    if (strcmp(path, g_cut.path) != 0 || ++g_cut.calls != g_cut.at)
        return;
    g_cut.off = off;
    if (truncate(path, (off_t)(g_cut.to == CUT_TO_OFFSET ? (int64_t)off : g_cut.to)) != 0)
        perror("truncate");
}

/* ---- children --------------------------------------------------------------------------------- */

typedef struct outcome {
    int rc;             /* the open's status */
    int check;          /* ferry_check_files after a successful ferry_open; 1: not run */
    uint64_t cut_off;   /* where the cut read started; UINT64_MAX: no cut */
    unsigned opened, refused, bad; /* the race: opens that succeeded, failed cleanly, neither */
    char msg[600];
} outcome;

/* Runs BODY(ARG, OUT) in a child with SIGBUS at its default action and no guard. The result
 * comes back through a pipe; *SIG is the signal that ended the child (0: none). */
static void in_child(void (*body)(void *, outcome *), void *arg, outcome *out, int *sig)
{
    int fds[2];
    memset(out, 0, sizeof *out);
    out->rc = 1;
    *sig = 0;
    if (pipe(fds) != 0) {
        *sig = -1;
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        signal(SIGBUS, SIG_DFL);
        outcome o;
        memset(&o, 0, sizeof o);
        o.check = 1;
        o.cut_off = UINT64_MAX;
        body(arg, &o);
        ssize_t w = write(fds[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 3);
    }
    close(fds[1]);
    ssize_t r = pid > 0 ? read(fds[0], out, sizeof *out) : -1;
    close(fds[0]);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) {
        *sig = -1;
        return;
    }
    if (WIFSIGNALED(st))
        *sig = WTERMSIG(st);
    else if (r != (ssize_t)sizeof *out || WEXITSTATUS(st) != 0)
        *sig = -1;
}

typedef struct cut_case {
    const char *label;
    const char *open;   /* what is opened */
    const char *cut;    /* the file cut */
    int at;             /* at its AT-th header read */
    int64_t to;         /* to TO bytes, or CUT_TO_OFFSET */
    int manager;        /* through ferry_open (and then ferry_check_files) */
} cut_case;

static void cut_body(void *arg, outcome *o)
{
    const cut_case *k = arg;
    g_cut.path = k->cut;
    g_cut.at = k->at;
    g_cut.to = k->to;
    g_cut.calls = 0;
    if (&ferry__catalog_read_hook)
        ferry__catalog_read_hook = cut_hook;
    if (k->manager) {
        ferry *f = ferry_create(NULL);
        o->rc = f ? ferry_open(f, k->open, NULL) : FERRY_ENOMEM;
        snprintf(o->msg, sizeof o->msg, "%s", f ? ferry_errmsg(f) : "");
        if (f && o->rc == 0) {
            o->check = ferry_check_files(f);
            snprintf(o->msg, sizeof o->msg, "%s", ferry_errmsg(f));
        }
        ferry_destroy(f);
    } else {
        ferry_catalog *c = ferry_catalog_create();
        o->rc = c ? ferry_catalog_add(c, k->open, NULL) : FERRY_ENOMEM;
        snprintf(o->msg, sizeof o->msg, "%s", c ? ferry_catalog_errmsg(c) : "");
        ferry_catalog_destroy(c);
    }
    if (g_cut.calls >= g_cut.at)
        o->cut_off = g_cut.off;
}

/* Runs case K on fresh files; the outcome in *O. 0 when the child was not killed. */
static int run_cut(const cut_case *k, outcome *o)
{
    int sig;
    in_child(cut_body, (void *)k, o, &sig);
    printf("%-34s rc %d (%s)%s cut read at %llu: %s\n", k->label, o->rc, ferry_strerror(o->rc),
           sig > 0 ? ", KILLED BY A SIGNAL," : "", (unsigned long long)o->cut_off, o->msg);
    if (sig)
        fprintf(stderr, "%s: the child %s %d\n", k->label,
                sig > 0 ? "died of signal" : "failed to report, status", sig);
    return sig;
}

static void make_files(void)
{
    snprintf(g_gguf, sizeof g_gguf, "%s/vocab.gguf", g_dir);
    snprintf(g_st, sizeof g_st, "%s/many.safetensors", g_dir);
    snprintf(g_shard, sizeof g_shard, "%s/shard.safetensors", g_dir);
    snprintf(g_index, sizeof g_index, "%s/model.safetensors.index.json", g_dir);
    /* 200k tokens: a header of 3.8 MB, read in several growing pieces */
    CHECK_EQ_INT(write_gguf(g_gguf, 200000, UINT64_C(1) << 20), 0);
    CHECK_EQ_INT(write_st(g_st, 4000), 0);
    CHECK_EQ_INT(write_st(g_shard, 4000), 0);
    CHECK_EQ_INT(write_index(g_index, "shard.safetensors", 4000), 0);
}

static void test_cuts(void)
{
    if (!&ferry__catalog_read_hook) {
        fprintf(stderr, "this library has no header read seam: the cut cases cannot run\n");
        CHECK(&ferry__catalog_read_hook != NULL);
        return;
    }
    const cut_case cases[] = {
        {"gguf, cut before the first read", g_gguf, g_gguf, 1, 4096, 0},
        {"gguf, cut at the third read", g_gguf, g_gguf, 3, CUT_TO_OFFSET, 0},
        {"gguf through ferry_open, 2nd read", g_gguf, g_gguf, 2, CUT_TO_OFFSET, 1},
        {"safetensors, cut at its JSON", g_st, g_st, 2, 4096, 0},
        {"index, cut while it is read", g_index, g_index, 2, CUT_TO_OFFSET, 0},
        {"shard of an index, first read", g_index, g_shard, 1, 100, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        make_files();
        outcome o;
        int sig = run_cut(&cases[i], &o);
        CHECK_EQ_INT(sig, 0);
        CHECK_EQ_INT(o.rc, FERRY_ECHANGED);
        /* named: the file that was cut, and how */
        CHECK(strstr(o.msg, cases[i].cut) != NULL);
        CHECK(strstr(o.msg, "size ") != NULL);
        CHECK(o.cut_off != UINT64_MAX);
        if (cases[i].at > 1)
            CHECK(o.cut_off > 0 && o.cut_off != UINT64_MAX);
    }

    /* Cut in the data section only, at the first read: the header is whole, the open succeeds
     * (the data section is never read), and the change is reported by the check. */
    make_files();
    cut_case data = {"gguf, cut in its data section", g_gguf, g_gguf, 1,
                     (int64_t)(g_gguf_size - 4096), 1};
    CHECK(g_gguf_size - 4096 > 2 * g_gguf_header);
    outcome o;
    CHECK_EQ_INT(run_cut(&data, &o), 0);
    CHECK_EQ_INT(o.rc, 0);
    CHECK_EQ_INT(o.check, FERRY_ECHANGED);
    CHECK(strstr(o.msg, g_gguf) != NULL);
    CHECK_EQ_INT(o.cut_off, 0);
    CHECK_EQ_INT(file_size(g_gguf), g_gguf_size - 4096);
}

/* ---- the race: a process cuts and restores the file while another opens it --------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


static int race_code_ok(int rc)
{
    /* the file changed under a read, or the open found it cut: its header (ETRUNC, or ELIMIT for
     * a declared array larger than the cut file), or the data of its tensors (ERANGE) */
    return rc == FERRY_ECHANGED || rc == FERRY_EIO || rc == FERRY_ETRUNC || rc == FERRY_ELIMIT ||
           rc == FERRY_ERANGE;
}

/* Opens the GGUF again and again for at least *ARG seconds, and on until both a success and a
 * clean refusal were seen (at most 10 s: a loaded machine may be slow to see both). */
static void race_body(void *arg, outcome *o)
{
    double start = now_s(), least = *(const double *)arg;
    for (;;) {
        double t = now_s() - start;
        if (t >= 10 || (t >= least && o->opened && o->refused))
            break;
        ferry_catalog *c = ferry_catalog_create();
        int rc = c ? ferry_catalog_add(c, g_gguf, NULL) : FERRY_ENOMEM;
        if (rc == 0) {
            o->opened++;
        } else if (race_code_ok(rc) && strstr(ferry_catalog_errmsg(c), g_gguf)) {
            o->refused++;
        } else if (o->bad++ == 0) {
            o->rc = rc;
            snprintf(o->msg, sizeof o->msg, "%s", c ? ferry_catalog_errmsg(c) : "");
        }
        ferry_catalog_destroy(c);
    }
}

static void test_race(void)
{
    make_files();
    unsigned char *full = malloc((size_t)g_gguf_header);
    int fd = open(g_gguf, O_RDWR);
    CHECK(full && fd >= 0);
    if (!full || fd < 0 || pread(fd, full, (size_t)g_gguf_header, 0) != (ssize_t)g_gguf_header) {
        CHECK(0);
        free(full);
        return;
    }
    fflush(NULL);
    pid_t cutter = fork();
    if (cutter == 0) {
        /* cut inside the header for about a millisecond, then whole again for about twenty (an
         * open takes a few), so that opens find it whole, cut, and cut while they read it */
        const off_t at = 4096;
        for (unsigned i = 0;; i++) {
            if (ftruncate(fd, at) != 0)
                _exit(3);
            usleep(800 + 97 * (i % 5));
            size_t n = (size_t)(g_gguf_header - (uint64_t)at);
            if (pwrite(fd, full + at, n, at) != (ssize_t)n || ftruncate(fd, (off_t)g_gguf_size))
                _exit(3);
            usleep(18000 + 1301 * (i % 7));
        }
    }
    double seconds = 1.5;
    outcome o;
    int sig;
    in_child(race_body, &seconds, &o, &sig);
    if (cutter > 0) {
        kill(cutter, SIGKILL);
        waitpid(cutter, NULL, 0);
    }
    close(fd);
    free(full);
    if (sig > 0)
        fprintf(stderr, "race: the opener died of signal %d (%s)\n", sig, strsignal(sig));
    else
        printf("race for at least %.1f s: no signal; %u opens succeeded, %u refused cleanly, %u "
               "otherwise%s%s\n", seconds, o.opened, o.refused, o.bad, o.bad ? ": " : "",
               o.bad ? o.msg : "");
    CHECK(cutter > 0);
    CHECK_EQ_INT(sig, 0);
    CHECK_EQ_INT(o.bad, 0);
    /* both outcomes happened: the file was opened whole and caught cut */
    CHECK(o.opened > 0);
    CHECK(o.refused > 0);
}

int main(void)
{
    g_dir = check_tmpdir("open_truncated");
    test_race();
    test_cuts();
    int rc = check_finish();
    if (!rc)
        check_rmdir(g_dir);
    return rc;
}
