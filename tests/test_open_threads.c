/*
 * test_open_threads.c — ferry_open from several threads at once on one manager: threads opening
 * different files (GGUF and safetensors, each under its own prefix) all succeed while another
 * thread keeps preparing, checking and releasing tensors of a file already open; every tensor is
 * then found and reads back as the file holds it. Two threads opening files whose names clash:
 * exactly one wins, the other fails with FERRY_EDUP naming both files in its own ferry_errmsg,
 * and nothing of the loser's file is added; an open that clashes with the file already open fails
 * the same way.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

#define OPENERS 6
#define ROUNDS 3

static char g_dir[1024];
static char g_base[1200];                 /* open before the threads start */
static char g_files[OPENERS][1200];       /* one per opener, each under prefix "mK." */
static char g_clash[2][1200];             /* both opened under prefix "clash." */
static size_t g_count[OPENERS], g_clash_count[2], g_base_count;

/* The tensor count of the fixture_layout model with LAYERS blocks. */
static size_t layout_count(int layers) { return (size_t)layers * 5 + 3; }

static int write_model(const char *path, int layers, int safetensors)
{
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, layers, 64, 128, 100, FERRY_DTYPE_F32, safetensors);
    return fixture_write(path, safetensors ? FERRY_FORMAT_SAFETENSORS : FERRY_FORMAT_GGUF, ts, n);
}

typedef struct opener {
    ferry *f;
    const char *path, *prefix;
    pthread_barrier_t *start;
    int rc;
    char msg[2048]; /* this thread's ferry_errmsg after the open */
} opener;

static void *do_open(void *arg)
{
    opener *o = arg;
    pthread_barrier_wait(o->start);
    o->rc = ferry_open(o->f, o->path, o->prefix);
    snprintf(o->msg, sizeof o->msg, "%s", ferry_errmsg(o->f));
    return NULL;
}

typedef struct preparer {
    ferry *f;
    ferry_tensor **ts; /* the base file's tensors, found before any other open starts */
    size_t n;
    atomic_int *stop;
    int rounds, failures, wrong;
    char first[512];
} preparer;

/* Prepares, checks and releases every tensor of the base file, one at a time, until told to
 * stop (and at least a few times). */
static void *do_prepare(void *arg)
{
    preparer *p = arg;
    ferry_tensor **ts = p->ts;
    size_t n = p->n;
    for (int r = 0; !atomic_load(p->stop) || r < 3; r++, p->rounds++) {
        for (size_t i = 0; i < n; i++) {
            if (ferry_prepare(p->f, &ts[i], 1) != 0) {
                if (!p->failures++)
                    snprintf(p->first, sizeof p->first, "%s", ferry_errmsg(p->f));
                continue;
            }
            if (r % 2 == 0 && !fixture_same_as_file(p->f, ts[i]))
                p->wrong++;
            ferry_release(p->f, &ts[i], 1);
        }
    }
    return NULL;
}

/* Names starting with PREFIX in F's catalog. */
static size_t count_prefixed(ferry *f, const char *prefix)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = 0, len = strlen(prefix);
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info info;
        if (ferry_catalog_tensor(c, i, &info) == 0 && strncmp(info.name, prefix, len) == 0)
            n++;
    }
    return n;
}

static int has_file(ferry *f, const char *path)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    for (size_t i = 0; i < ferry_catalog_file_count(c); i++)
        if (strcmp(ferry_catalog_file_path(c, i), path) == 0)
            return 1;
    return 0;
}

static void one_round(int round)
{
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, g_base, NULL), 0);

    enum { N = OPENERS + 3 };
    opener o[N];
    char prefixes[OPENERS][16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N);
    memset(o, 0, sizeof o);
    for (int k = 0; k < OPENERS; k++) {
        snprintf(prefixes[k], sizeof prefixes[k], "m%d.", k);
        o[k].path = g_files[k];
        o[k].prefix = prefixes[k];
    }
    /* the clashing pair, in either order from round to round */
    o[OPENERS].path = g_clash[round % 2];
    o[OPENERS + 1].path = g_clash[1 - round % 2];
    o[OPENERS].prefix = o[OPENERS + 1].prefix = "clash.";
    /* the file already open, again without a prefix */
    o[OPENERS + 2].path = g_base;
    o[OPENERS + 2].prefix = NULL;

    atomic_int stop = 0;
    /* the catalog is read without the manager's lock: listed before the opens start */
    preparer p = {.f = f, .stop = &stop};
    p.ts = fixture_all_tensors(f, &p.n);
    CHECK_EQ_INT(p.n, g_base_count);
    pthread_t pt, th[N];
    pthread_create(&pt, NULL, do_prepare, &p);
    for (int i = 0; i < N; i++) {
        o[i].f = f;
        o[i].start = &start;
        pthread_create(&th[i], NULL, do_open, &o[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(pt, NULL);
    pthread_barrier_destroy(&start);
    free(p.ts);

    CHECK_EQ_INT(p.failures, 0);
    CHECK_EQ_INT(p.wrong, 0);
    CHECK(p.rounds >= 3);
    if (p.failures)
        fprintf(stderr, "round %d: a prepare failed: %s\n", round, p.first);

    /* different files: all opened, each thread's message empty */
    size_t want = g_base_count;
    for (int k = 0; k < OPENERS; k++) {
        CHECK_EQ_INT(o[k].rc, 0);
        CHECK_STR(o[k].msg, "");
        if (o[k].rc)
            fprintf(stderr, "round %d: open of %s: %s\n", round, o[k].path, o[k].msg);
        CHECK_EQ_INT(count_prefixed(f, prefixes[k]), g_count[k]);
        want += g_count[k];
    }

    /* the clash: one wins, the other fails naming its file and the winner's, adding nothing */
    opener *a = &o[OPENERS], *b = &o[OPENERS + 1];
    CHECK_EQ_INT((a->rc == 0) + (b->rc == 0), 1);
    opener *win = a->rc == 0 ? a : b, *lose = a->rc == 0 ? b : a;
    CHECK_EQ_INT(lose->rc, FERRY_EDUP);
    CHECK_STR(win->msg, "");
    CHECK(strstr(lose->msg, lose->path) != NULL);
    CHECK(strstr(lose->msg, "is already present from") != NULL);
    CHECK(strstr(lose->msg, win->path) != NULL);
    CHECK(strstr(lose->msg, "'clash.") != NULL);
    CHECK(has_file(f, win->path));
    CHECK(!has_file(f, lose->path));
    size_t win_count = g_clash_count[win->path == g_clash[0] ? 0 : 1];
    CHECK_EQ_INT(count_prefixed(f, "clash."), win_count);
    want += win_count;

    /* the base file again: refused the same way */
    opener *again = &o[OPENERS + 2];
    CHECK_EQ_INT(again->rc, FERRY_EDUP);
    CHECK(strstr(again->msg, "is already present from") != NULL);
    CHECK(strstr(again->msg, g_base) != NULL);

    /* every tensor is there and reads back as the file holds it */
    const ferry_catalog *c = ferry_catalog_of(f);
    CHECK_EQ_INT(ferry_catalog_count(c), want);
    CHECK_EQ_INT(ferry_catalog_file_count(c), 1 + OPENERS + 1);
    size_t n;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    CHECK_EQ_INT(n, want);
    int bad = 0;
    for (size_t i = 0; ts && i < n; i++) {
        if (ferry_prepare(f, &ts[i], 1) != 0) {
            fprintf(stderr, "round %d: prepare: %s\n", round, ferry_errmsg(f));
            bad++;
            continue;
        }
        bad += !fixture_same_as_file(f, ts[i]);
        ferry_release(f, &ts[i], 1);
    }
    CHECK_EQ_INT(bad, 0);
    free(ts);
    /* the main thread itself failed nothing */
    CHECK_STR(ferry_errmsg(f), "");
    ferry_destroy(f);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", check_tmpdir("open_threads"));
    snprintf(g_base, sizeof g_base, "%s/base.gguf", g_dir);
    if (write_model(g_base, 2, 0))
        return 2;
    g_base_count = layout_count(2);
    for (int k = 0; k < OPENERS; k++) {
        int layers = 1 + k % 3, st = k % 2;
        snprintf(g_files[k], sizeof g_files[k], "%s/m%d.%s", g_dir, k,
                 st ? "safetensors" : "gguf");
        if (write_model(g_files[k], layers, st))
            return 2;
        g_count[k] = layout_count(layers);
    }
    /* different sizes, so that a partial commit of the loser would show in the count */
    for (int k = 0; k < 2; k++) {
        snprintf(g_clash[k], sizeof g_clash[k], "%s/clash%d.gguf", g_dir, k);
        if (write_model(g_clash[k], 1 + 2 * k, 0))
            return 2;
        g_clash_count[k] = layout_count(1 + 2 * k);
    }
    for (int r = 0; r < ROUNDS; r++)
        one_round(r);
    check_rmdir(g_dir);
    return check_finish();
}
