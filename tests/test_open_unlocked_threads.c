/*
 * test_open_unlocked_threads.c — ferry_open reads headers without the manager's lock. An open is
 * held inside its header read (the catalog's read seam) while the main thread prepares, finds,
 * lists devices and opens another file on the same manager: none of these waits for the held
 * open. Then the held open, whose names clash with the file opened meanwhile, fails with
 * FERRY_EDUP naming both files, adding nothing; a held open that does not clash succeeds.
 */
#include <pthread.h>
#include <time.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

/* The catalog's read seam, as formats/catalog.h declares it (weak: see test_open_truncated.c). */
extern void (*ferry__catalog_read_hook)(const char *path, uint64_t offset, uint64_t len)
    __attribute__((weak));

static char g_dir[1024], g_base[1200], g_held[1200], g_other[1200];

/* The seam's state: the open of g_held stops at its first read until the main thread lets it go
 * (or a few seconds pass: then the main thread was blocked, and the check fails). */
static pthread_mutex_t g_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_inside, g_go, g_timed_out;

static void hold_hook(const char *path, uint64_t off, uint64_t len)
{
    (void)off, (void)len;
    if (strcmp(path, g_held) != 0)
        return;
    pthread_mutex_lock(&g_m);
    if (g_inside++) {
        pthread_mutex_unlock(&g_m);
        return; /* only the first read is held */
    }
    pthread_cond_broadcast(&g_cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    while (!g_go && !g_timed_out)
        if (pthread_cond_timedwait(&g_cv, &g_m, &until) != 0)
            g_timed_out = 1;
    pthread_mutex_unlock(&g_m);
}

typedef struct held_open {
    ferry *f;
    const char *prefix;
    int rc;
    char msg[2048];
} held_open;

static void *do_open(void *arg)
{
    held_open *h = arg;
    h->rc = ferry_open(h->f, g_held, h->prefix);
    snprintf(h->msg, sizeof h->msg, "%s", ferry_errmsg(h->f));
    return NULL;
}

/* Opens g_held under PREFIX on another thread, held in its first read while the main thread
 * works on F (opening g_other under OTHER_PREFIX); the held open's code and message come back in
 * *H. */
static void held_round(ferry *f, const char *prefix, const char *other_prefix, held_open *h)
{
    g_inside = g_go = g_timed_out = 0;
    memset(h, 0, sizeof *h);
    h->f = f;
    h->prefix = prefix;
    ferry__catalog_read_hook = hold_hook;
    pthread_t th;
    pthread_create(&th, NULL, do_open, h);
    pthread_mutex_lock(&g_m);
    while (!g_inside)
        pthread_cond_wait(&g_cv, &g_m);
    pthread_mutex_unlock(&g_m);

    /* the open is inside its parse now: calls that take the manager's lock go through */
    ferry_tensor *t = ferry_find(f, "blk.0.attn_q.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_device_info di;
    CHECK_EQ_INT(ferry_get_device_info(f, 0, &di), 0);
    CHECK_EQ_INT(ferry_open(f, g_other, other_prefix), 0);

    pthread_mutex_lock(&g_m);
    CHECK(!g_timed_out);
    g_go = 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_m);
    pthread_join(th, NULL);
    ferry__catalog_read_hook = NULL;
}

static int has_file(ferry *f, const char *path)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    for (size_t i = 0; i < ferry_catalog_file_count(c); i++)
        if (strcmp(ferry_catalog_file_path(c, i), path) == 0)
            return 1;
    return 0;
}

static void test_clash_meanwhile(void)
{
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, g_base, NULL), 0);
    size_t before = ferry_catalog_count(ferry_catalog_of(f));
    held_open h;
    held_round(f, "x.", "x.", &h);
    /* the file opened meanwhile has the names: the held open loses */
    CHECK_EQ_INT(h.rc, FERRY_EDUP);
    CHECK(strstr(h.msg, g_held) != NULL);
    CHECK(strstr(h.msg, g_other) != NULL);
    CHECK(strstr(h.msg, "is already present from") != NULL);
    CHECK(!has_file(f, g_held));
    CHECK(has_file(f, g_other));
    CHECK_EQ_INT(ferry_catalog_count(ferry_catalog_of(f)), before + 8);
    CHECK_STR(ferry_errmsg(f), ""); /* the failure was the other thread's */
    ferry_destroy(f);
}

static void test_no_clash(void)
{
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, g_base, NULL), 0);
    size_t before = ferry_catalog_count(ferry_catalog_of(f));
    held_open h;
    held_round(f, "held.", "other.", &h);
    CHECK_EQ_INT(h.rc, 0);
    CHECK_STR(h.msg, "");
    CHECK_EQ_INT(ferry_catalog_count(ferry_catalog_of(f)), before + 8 + 18);
    ferry_tensor *t = ferry_find(f, "held.blk.2.ffn_down.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(fixture_same_as_file(f, t));
    ferry_release(f, &t, 1);
    ferry_destroy(f);
}

int main(void)
{
    if (!&ferry__catalog_read_hook) {
        fprintf(stderr, "the library has no catalog read seam\n");
        CHECK(&ferry__catalog_read_hook != NULL);
        return check_finish();
    }
    snprintf(g_dir, sizeof g_dir, "%s", check_tmpdir("open_unlocked_threads"));
    snprintf(g_base, sizeof g_base, "%s/base.gguf", g_dir);
    snprintf(g_held, sizeof g_held, "%s/held.gguf", g_dir);
    snprintf(g_other, sizeof g_other, "%s/other.gguf", g_dir);
    /* held: 3 blocks (18 tensors), other: 1 block (8): same names under one prefix */
    if (fixture_write_llama(g_base, 2, 64, 128, 100, FERRY_DTYPE_F32) ||
        fixture_write_llama(g_held, 3, 64, 128, 100, FERRY_DTYPE_F32) ||
        fixture_write_llama(g_other, 1, 64, 128, 100, FERRY_DTYPE_F32))
        return 2;
    test_clash_meanwhile();
    test_no_clash();
    check_rmdir(g_dir);
    return check_finish();
}
