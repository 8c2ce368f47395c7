/*
 * test_stream_threads.c — stream-ordered prepare and release on the sim device, whose compute
 * queue runs deliberately late "kernels" that read device memory independently of its copy queue:
 *  - a buffer released after an engine event is not overwritten until the event fires: a kernel
 *    queued before the release, 300 ms late, still reads the tensor's own bytes (against a plain
 *    pread of the file) while the budget forces the next prepare to reuse its memory; with a plain
 *    release the same kernel reads other bytes (the hazard the event closes);
 *  - ferry_prepare_async returns before the loads land (a slow link), its event completes once
 *    they have, and a kernel queued behind ferry_event_wait(ready, stream) reads the file's bytes;
 *  - a failed asynchronous prepare reports its error at the wait, holds nothing, and the manager
 *    stays usable;
 *  - on the cpu events are complete at once; a device table of version 1 never has its event
 *    members called; ferry_release_all waits for a release's pending event.
 */
#include "check.h"
#include "devices/devices.h"
#include "ferry_device.h"
#include "stream_capture.h"

static char g_path[1200];


/* A manager with SPEC as device *DEV (its device pointer in *SIM), every tensor computed there. */
static ferry *make(const char *spec, ferry_device **sim, int *dev, uint64_t budget)
{
    ferry *f = ferry_create(NULL);
    char msg[256];
    CHECK_EQ_INT(ferry_device_open(spec, sim, msg, sizeof msg), 0);
    CHECK_EQ_INT(ferry_add_device_custom(f, *sim, dev), 0);
    return capture_manager(f, *dev, budget, g_path);
}

/* A is prepared, a late kernel reads it on the compute queue, A is released (after an event
 * recorded behind the kernel when AFTER, plainly otherwise), then B, as large, needs A's room. */
static void run_pressure(int after, capture *cap)
{
    ferry_device *sim = NULL;
    int dev = -1;
    /* room for one 256 KiB tensor */
    ferry *f = make("sim:64MiB", &sim, &dev, 300000);
    ferry_tensor *a = ferry_find(f, "blk.0.attn_q.weight");
    ferry_tensor *b = ferry_find(f, "blk.0.attn_k.weight");
    CHECK(a && b);
    void *stream = ferry__sim_stream(sim);
    CHECK(stream != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &a, 1), 0);
    void *pa = ferry_tensor_data(a);
    CHECK(pa != NULL);
    CHECK_EQ_INT(ferry__sim_kernel(sim, stream, pa, ferry_tensor_nbytes(a), 300000,
                                   capture_kernel, cap),
                 0);
    double t0 = now_s();
    if (after) {
        ferry_event *done = capture_record(f, dev, stream);
        CHECK_EQ_INT(ferry_event_query(done), 0); /* the kernel is still to run */
        CHECK_EQ_INT(ferry_release_after(f, &a, 1, done), 0);
        ferry_event_destroy(done); /* ferry keeps what the release needs */
        /* the reference is held until the event: a second release is one too many */
        CHECK_EQ_INT(ferry_release(f, &a, 1), FERRY_EINVAL);
    } else {
        CHECK_EQ_INT(ferry_release(f, &a, 1), 0);
    }
    CHECK_EQ_INT(ferry_prepare(f, &b, 1), 0);
    double waited = now_s() - t0;
    if (after) {
        /* B could only take A's room once the kernel had run */
        CHECK(waited >= 0.25);
        pthread_mutex_lock(&cap->m);
        CHECK_EQ_INT(cap->runs, 1);
        pthread_mutex_unlock(&cap->m);
    }
    CHECK(fixture_same_as_file(f, b));
    CHECK_EQ_INT(ferry_release(f, &b, 1), 0);
    /* the kernel has run by now (a sync on the compute queue) */
    ferry_event *sync = capture_record(f, dev, stream);
    CHECK_EQ_INT(ferry_event_synchronize(sync), 0);
    CHECK_EQ_INT(ferry_event_query(sync), 1);
    ferry_event_destroy(sync);
    ferry__sim_stats st;
    CHECK_EQ_INT(ferry__sim_get_stats(sim, &st), 0);
    CHECK_EQ_INT((long long)st.misuse, 0);
    ferry_destroy(f);
}

static void test_release_after(void)
{
    capture fenced = {.m = PTHREAD_MUTEX_INITIALIZER}, plain = {.m = PTHREAD_MUTEX_INITIALIZER};
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    ferry_tensor *a = ferry_find(f, "blk.0.attn_q.weight");

    run_pressure(1, &fenced);
    CHECK(captured_is(&fenced, a));
    /* the same sequence with a plain release: the late kernel reads B's bytes in A's memory. That
     * is a data race by design (the hazard the event closes), which TSan reports: not under it. */
    if (!TSAN) {
        run_pressure(0, &plain);
        pthread_mutex_lock(&plain.m);
        CHECK_EQ_INT(plain.runs, 1);
        pthread_mutex_unlock(&plain.m);
        CHECK(!captured_is(&plain, a));
    }
    free(fenced.bytes), free(plain.bytes);
    ferry_destroy(f);
}

static void test_prepare_async(void)
{
    ferry_device *sim = NULL;
    int dev = -1;
    /* 1 MB/s: each 256 KiB tensor takes a quarter of a second on the link */
    ferry *f = make("sim:64MiB@1MB/s", &sim, &dev, 0);
    ferry_tensor *ts[2] = {ferry_find(f, "blk.1.attn_q.weight"),
                           ferry_find(f, "blk.1.attn_k.weight")};
    CHECK(ts[0] && ts[1]);
    void *stream = ferry__sim_stream(sim);
    ferry_event *ready = NULL;
    double t0 = now_s();
    CHECK_EQ_INT(ferry_prepare_async(f, ts, 2, &ready), 0);
    double call = now_s() - t0;
    CHECK(ready != NULL);
    CHECK(call < 0.2);
    CHECK_EQ_INT(ferry_event_query(ready), 0);
    CHECK_EQ_INT(ferry_event_wait(ready, stream), 0);
    CHECK(now_s() - t0 >= 0.4);
    CHECK_EQ_INT(ferry_event_synchronize(ready), 0);
    CHECK_EQ_INT(ferry_event_query(ready), 1);
    capture cap = {.m = PTHREAD_MUTEX_INITIALIZER};
    CHECK(ferry_tensor_data(ts[0]) != NULL);
    CHECK_EQ_INT(ferry__sim_kernel(sim, stream, ferry_tensor_data(ts[0]),
                                   ferry_tensor_nbytes(ts[0]), 0, capture_kernel, &cap),
                 0);
    ferry_event *done = capture_record(f, dev, stream);
    CHECK_EQ_INT(ferry_release_after(f, ts, 2, done), 0);
    CHECK_EQ_INT(ferry_event_synchronize(done), 0);
    CHECK(captured_is(&cap, ts[0]));
    CHECK_EQ_INT(ferry_event_record(ready, stream), FERRY_EINVAL);
    ferry_event_destroy(done);
    ferry_event_destroy(ready);

    /* cached now: an asynchronous prepare is ready at once */
    CHECK_EQ_INT(ferry_prepare_async(f, ts, 2, &ready), 0);
    CHECK(ferry_event_query(ready) >= 0);
    CHECK_EQ_INT(ferry_event_synchronize(ready), 0);
    CHECK_EQ_INT(ferry_event_query(ready), 1);
    CHECK(fixture_same_as_file(f, ts[0]) && fixture_same_as_file(f, ts[1]));
    ferry_event_destroy(ready);
    CHECK_EQ_INT(ferry_release(f, ts, 2), 0);
    free(cap.bytes);
    ferry_destroy(f);
}

static void test_async_failure(void)
{
    ferry_device *sim = NULL;
    int dev = -1;
    ferry *f = make("sim:64MiB,fail_copy=1/every", &sim, &dev, 0);
    ferry_tensor *t = ferry_find(f, "blk.0.ffn_up.weight");
    ferry_event *ready = NULL;
    CHECK_EQ_INT(ferry_prepare_async(f, &t, 1, &ready), 0);
    CHECK_EQ_INT(ferry_event_synchronize(ready), FERRY_EDEVICE);
    CHECK(strstr(ferry_errmsg(f), "blk.0.ffn_up.weight") != NULL);
    CHECK_EQ_INT(ferry_event_query(ready), FERRY_EDEVICE);
    ferry_event_destroy(ready);
    CHECK_EQ_INT(ferry_release(f, &t, 1), FERRY_EINVAL); /* not held */
    CHECK_EQ_INT(ferry__sim_set_faults(sim, 0, 0), 0);
    CHECK_EQ_INT(ferry_prepare_async(f, &t, 1, &ready), 0);
    CHECK_EQ_INT(ferry_event_synchronize(ready), 0);
    CHECK(fixture_same_as_file(f, t));
    ferry_event_destroy(ready);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_destroy(f);
}

/* Event members past the end of a table (its size) are never read. */
static int g_v1_called;
static int v1_create(ferry_device *d, void **ev)
{
    (void)d, (void)ev;
    g_v1_called++;
    return FERRY_EDEVICE;
}

static void test_cpu_and_v1(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    ferry_tensor *t = ferry_find(f, "output_norm.weight");
    ferry_event *ev = NULL;
    CHECK_EQ_INT(ferry_event_create(f, 0, &ev), 0);
    CHECK_EQ_INT(ferry_event_record(ev, NULL), 0);
    CHECK_EQ_INT(ferry_event_query(ev), 1);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_release_after(f, &t, 1, ev), 0);
    CHECK_EQ_INT(ferry_release(f, &t, 1), FERRY_EINVAL); /* released already */
    ferry_event_destroy(ev);
    CHECK_EQ_INT(ferry_event_create(f, 7, &ev), FERRY_ENOENT);
    CHECK(ev == NULL);

    char msg[256];
    ferry_device *sim = NULL;
    CHECK_EQ_INT(ferry_device_open("sim:16MiB", &sim, msg, sizeof msg), 0);
    static ferry_device_ops v1;
    v1 = *sim->ops;
    v1.size = offsetof(ferry_device_ops, event_create); /* a table that ends before the events */
    v1.event_create = v1_create; /* past its end: never read */
    sim->ops = &v1;
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, sim, &dev), 0);
    CHECK_EQ_INT(ferry_event_create(f, dev, &ev), 0);
    CHECK_EQ_INT(ferry_event_record(ev, NULL), 0);
    CHECK_EQ_INT(ferry_event_query(ev), 1);
    ferry_event_destroy(ev);
    CHECK_EQ_INT(g_v1_called, 0);
    static ferry_device_ops v0;
    v0 = v1;
    v0.version = 0;
    ferry_device *bad = NULL;
    CHECK_EQ_INT(ferry_device_open("sim:16MiB", &bad, msg, sizeof msg), 0);
    const ferry_device_ops *real = bad->ops;
    bad->ops = &v0;
    CHECK_EQ_INT(ferry_add_device_custom(f, bad, NULL), FERRY_EINVAL);
    v0.version = 2; /* the layout before version 3 */
    CHECK_EQ_INT(ferry_add_device_custom(f, bad, NULL), FERRY_EINVAL);
    bad->ops = real;
    ferry_device_close(bad);
    ferry_destroy(f);
}

/* ferry_release_all with a release still waiting on its event returns only after the kernel ran. */
static void test_release_all_waits(void)
{
    ferry_device *sim = NULL;
    int dev = -1;
    ferry *f = make("sim:64MiB", &sim, &dev, 0);
    ferry_tensor *t = ferry_find(f, "blk.1.ffn_down.weight");
    void *stream = ferry__sim_stream(sim);
    capture cap = {.m = PTHREAD_MUTEX_INITIALIZER};
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK_EQ_INT(ferry__sim_kernel(sim, stream, ferry_tensor_data(t), ferry_tensor_nbytes(t),
                                   200000, capture_kernel, &cap),
                 0);
    ferry_event *done = capture_record(f, dev, stream);
    CHECK_EQ_INT(ferry_release_after(f, &t, 1, done), 0);
    ferry_event_destroy(done);
    CHECK_EQ_INT(ferry_release_all(f), 0);
    pthread_mutex_lock(&cap.m);
    CHECK_EQ_INT(cap.runs, 1);
    pthread_mutex_unlock(&cap.m);
    CHECK(captured_is(&cap, t));
    free(cap.bytes);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("stream");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    if (fixture_write_llama(g_path, 2, 256, 512, 512, FERRY_DTYPE_F32))
        return 1;
    test_release_after();
    test_prepare_async();
    test_async_failure();
    test_cpu_and_v1();
    test_release_all_waits();
    check_rmdir(dir);
    return check_finish();
}
