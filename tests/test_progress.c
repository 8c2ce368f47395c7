/*
 * test_progress.c — progress and cancellation of long loads (ferry_set_progress):
 *  - ferry_load_group reports DONE of TOTAL from 0, never backwards, ending at TOTAL, where TOTAL
 *    is the sum of the tensors' bytes in the catalog; through loader jobs (load read) and through
 *    a group load's arenas (load direct);
 *  - a callback that returns nonzero mid-load cancels it: FERRY_ECANCELED, the manager usable, a
 *    second load brings what is missing (with jobs, at most what the first had not reported),
 *    and every tensor then holds its file's bytes (plain pread): nothing partly loaded was
 *    marked valid;
 *  - a prepare on a slow sim link reports and cancels the same way, holding nothing afterwards
 *    and leaving the loads it took off the queue to the next prepare; a load or prepare with
 *    nothing to load never calls the callback.
 */
#include <pthread.h>

#include "check.h"
#include "model_fixture.h"

static char g_path[1200];

typedef struct recorder {
    int calls;
    int cancel_at;          /* return 1 at this call (1-based); 0: never */
    uint64_t first_done, last_done, total, cancel_done;
    int backwards, total_changed;
} recorder;

static int record(void *user, uint64_t done, uint64_t total)
{
    recorder *r = user;
    r->calls++;
    if (r->calls == 1) {
        r->first_done = done;
        r->total = total;
    } else {
        r->backwards |= done < r->last_done;
        r->total_changed |= total != r->total;
    }
    r->last_done = done;
    if (r->cancel_at && r->calls == r->cancel_at) {
        r->cancel_done = done;
        return 1;
    }
    return 0;
}

static uint64_t catalog_bytes(void)
{
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, g_path, NULL), 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        sum += info.nbytes;
    }
    ferry_catalog_destroy(c);
    return sum;
}

static void check_ok_run(const recorder *r, uint64_t total)
{
    CHECK(r->calls >= 2);
    CHECK_EQ_INT(r->first_done, 0);
    CHECK_EQ_INT(r->total, total);
    CHECK_EQ_INT(r->last_done, total);
    CHECK_EQ_INT(r->backwards, 0);
    CHECK_EQ_INT(r->total_changed, 0);
}

static void test_load_group(ferry_load load)
{
    uint64_t total = catalog_bytes();
    CHECK_EQ_INT(fixture_drop_cache(g_path), 0);
    ferry *f = ferry_create(NULL);
    ferry_policy p = {0};
    p.load = load;
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
    recorder r = {0};
    CHECK_EQ_INT(ferry_set_progress(f, record, &r), 0);
    CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
    check_ok_run(&r, total);
    /* loaded: another load has nothing to bring, and says nothing */
    recorder again = {0};
    CHECK_EQ_INT(ferry_set_progress(f, record, &again), 0);
    CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
    CHECK_EQ_INT(again.calls, 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    CHECK_EQ_INT(again.calls, 0);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    free(ts);
    ferry_destroy(f);
}

static void test_cancel_load(ferry_load load)
{
    uint64_t total = catalog_bytes();
    CHECK_EQ_INT(fixture_drop_cache(g_path), 0);
    /* one I/O worker: a group load's reads are still partly queued at the first report */
    ferry_options o = {.io_threads = 1};
    ferry *f = ferry_create(&o);
    ferry_policy p = {0};
    p.load = load;
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, g_path, &p, &n);
    recorder r = {.cancel_at = 2};
    CHECK_EQ_INT(ferry_set_progress(f, record, &r), 0);
    CHECK_EQ_INT(ferry_load_group(f, NULL), FERRY_ECANCELED);
    CHECK(strstr(ferry_errmsg(f), "cancelled") != NULL);
    CHECK_EQ_INT(r.calls, 2); /* nothing reported after the cancel */
    CHECK(r.cancel_done < total);
    /* the manager goes on: a second load brings what is missing. Tensors loaded whole by jobs
     * stay; a group load's range read is read again whole when its read was cut short. */
    recorder second = {0};
    CHECK_EQ_INT(ferry_set_progress(f, record, &second), 0);
    CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
    CHECK(second.calls >= 1);
    if (load == FERRY_LOAD_READ)
        CHECK(second.total <= total - r.cancel_done);
    else
        CHECK(second.total <= total);
    CHECK_EQ_INT(second.last_done, second.total);
    CHECK_EQ_INT(ferry_set_progress(f, NULL, NULL), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    int same = 1;
    for (size_t i = 0; i < n; i++)
        same &= fixture_same_as_file(f, ts[i]);
    CHECK(same);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    free(ts);
    ferry_destroy(f);
}

static void test_prepare(void)
{
    ferry *f = ferry_create(NULL);
    int dev = -1;
    /* 100 MB/s: one layer's 6 MiB takes about 60 ms on the link */
    CHECK_EQ_INT(ferry_add_device(f, "sim:256MiB@100MB/s", &dev), 0);
    ferry_policy p = {0};
    p.compute_device = dev;
    p.load = FERRY_LOAD_MMAP;
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    /* more tensors than loaders, so that some are still queued at the cancel */
    enum { N = 12 };
    const char *kinds[] = {"attn_q", "attn_k", "ffn_up", "ffn_down"};
    ferry_tensor *ts[N];
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s.weight", 2 + i / 4, kinds[i % 4]);
        ts[i] = ferry_find(f, name);
        ferry_tensor_info info;
        CHECK_EQ_INT(ferry_tensor_get_info(ts[i], &info), 0);
        total += info.nbytes;
    }
    recorder r = {.cancel_at = 2};
    CHECK_EQ_INT(ferry_set_progress(f, record, &r), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, N), FERRY_ECANCELED);
    CHECK_EQ_INT(r.total, total);
    CHECK(r.cancel_done < total);
    CHECK_EQ_INT(ferry_release(f, ts, 1), FERRY_EINVAL); /* a cancelled prepare holds nothing */
    recorder ok = {0};
    CHECK_EQ_INT(ferry_set_progress(f, record, &ok), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, N), 0);
    CHECK(ok.calls >= 1); /* the loads the cancel took off the queue */
    CHECK_EQ_INT(ok.last_done, ok.total);
    CHECK(ok.total <= total - r.cancel_done);
    for (int i = 0; i < N; i++)
        CHECK(fixture_same_as_file(f, ts[i]));
    CHECK_EQ_INT(ferry_release(f, ts, N), 0);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("progress");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    if (fixture_write_llama(g_path, 16, 512, 1024, 2048, FERRY_DTYPE_F32))
        return 1;
    test_load_group(FERRY_LOAD_READ);
    test_load_group(FERRY_LOAD_DIRECT);
    test_cancel_load(FERRY_LOAD_READ);
    /* io_uring keeps up to 8 chunks of 16 MiB in flight per worker: all of this model's chunks at
     * once, leaving a cancel nothing to drop. The thread backend reads one chunk per worker. */
    setenv("FERRY_IO_BACKEND", "threads", 1);
    test_cancel_load(FERRY_LOAD_DIRECT);
    unsetenv("FERRY_IO_BACKEND");
    test_prepare();
    check_rmdir(dir);
    return check_finish();
}
