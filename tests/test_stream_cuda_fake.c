/*
 * test_stream_cuda_fake.c — stream-ordered prepare and release on the cuda device against the fake
 * CUDA runtime (tests/fake_cudart.c): ferry's copy stream is non-blocking, and the engine's own
 * stream runs deliberately late "kernels" (fakecuda_launch) that read device memory:
 *  - the device's event ops: record on the copy stream and on the engine's stream, a stream wait
 *    (cudaStreamWaitEvent) that holds the engine's later work, query, host wait;
 *  - a buffer released after the engine's event is not overwritten until the event fires: the
 *    late kernel reads the tensor's own bytes (against a plain pread) while the budget makes the
 *    next prepare reuse its memory; with a plain release it reads other bytes;
 *  - ferry_prepare_async + ferry_event_wait(ready, stream): a kernel behind the wait reads the
 *    file's bytes;
 *  - ferry_destroy with a release still waiting on its event frees nothing under the queued
 *    kernel (the fake counts frees of memory queued work uses), and leaves no event behind.
 */
#include <dlfcn.h>

#include "check.h"
#include "devices/devices.h"
#include "fake_cudart.h"
#include "ferry_device.h"
#include "stream_capture.h"

static char g_path[1200];
static fakecuda_get_stats_fn fc_stats;
static fakecuda_launch_fn fc_launch;
static int (*cuda_stream_create)(void **, unsigned);
static int (*cuda_stream_destroy)(void *);
static int (*cuda_stream_sync)(void *);

static fakecuda_stats stats(void)
{
    fakecuda_stats s;
    memset(&s, 0, sizeof s);
    CHECK_EQ_INT(fc_stats(-1, &s), 0);
    return s;
}

/* capture_kernel with the fake's kernel signature */
static void capture_kernel_sz(void *ud, const void *bytes, size_t n)
{
    capture_kernel(ud, bytes, n);
}

static ferry *make(int *dev, uint64_t budget)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_add_device(f, "cuda:0", dev), 0);
    return capture_manager(f, *dev, budget, g_path);
}

/* The device's event ops, directly. */
static void test_device_events(void *stream)
{
    char msg[256];
    ferry_device *d = NULL;
    CHECK_EQ_INT(ferry_device_open("cuda:0", &d, msg, sizeof msg), 0);
    if (!d)
        return;
    CHECK(ferry__device_has_events(d));
    void *buf = NULL, *ev = NULL, *ev2 = NULL;
    CHECK_EQ_INT(d->ops->alloc(d, 4096, &buf), 0);
    CHECK_EQ_INT(d->ops->event_create(d, &ev), 0);
    CHECK_EQ_INT(d->ops->event_create(d, &ev2), 0);
    CHECK_EQ_INT(d->ops->event_query(d, ev), 1); /* never recorded */
    capture cap = {.m = PTHREAD_MUTEX_INITIALIZER};
    uint64_t before = stats().stream_waits;
    /* a late kernel on the engine's stream, then a record behind it */
    CHECK_EQ_INT(fc_launch(stream, buf, 4096, 200000, capture_kernel_sz, &cap), 0);
    CHECK_EQ_INT(d->ops->event_record(d, ev, stream), 0);
    CHECK_EQ_INT(d->ops->event_query(d, ev), 0);
    /* the host waits for it: the kernel has run */
    CHECK_EQ_INT(d->ops->event_wait(d, ev, NULL), 0);
    pthread_mutex_lock(&cap.m);
    CHECK_EQ_INT(cap.runs, 1);
    pthread_mutex_unlock(&cap.m);
    CHECK_EQ_INT(d->ops->event_query(d, ev), 1);
    /* record on the copy stream, make the engine's stream wait, a kernel behind the wait */
    unsigned char host[4096];
    memset(host, 0x3C, sizeof host);
    uint64_t tk = 0;
    CHECK_EQ_INT(d->ops->copy_h2d(d, buf, host, sizeof host, &tk), 0);
    CHECK_EQ_INT(d->ops->event_record(d, ev2, NULL), 0);
    CHECK_EQ_INT(d->ops->event_wait(d, ev2, stream), 0);
    CHECK_EQ_INT(fc_launch(stream, buf, 4096, 0, capture_kernel_sz, &cap), 0);
    CHECK_EQ_INT(d->ops->event_record(d, ev, stream), 0);
    CHECK_EQ_INT(d->ops->event_wait(d, ev, NULL), 0);
    CHECK_EQ_INT(d->ops->wait(d, tk), 0);
    pthread_mutex_lock(&cap.m);
    CHECK(cap.runs == 2 && cap.n == 4096 && cap.bytes && memcmp(cap.bytes, host, 4096) == 0);
    pthread_mutex_unlock(&cap.m);
    CHECK(stats().stream_waits > before);
    d->ops->event_destroy(d, ev);
    d->ops->event_destroy(d, ev2);
    d->ops->free(d, buf);
    ferry_device_close(d);
    free(cap.bytes);
}

static void run_pressure(int after, capture *cap, void *stream)
{
    int dev = -1;
    ferry *f = make(&dev, 300000); /* room for one 256 KiB tensor */
    ferry_tensor *a = ferry_find(f, "blk.0.attn_q.weight");
    ferry_tensor *b = ferry_find(f, "blk.0.attn_k.weight");
    CHECK_EQ_INT(ferry_prepare(f, &a, 1), 0);
    CHECK_EQ_INT(fc_launch(stream, ferry_tensor_data(a), (size_t)ferry_tensor_nbytes(a), 300000,
                           capture_kernel_sz, cap),
                 0);
    double t0 = now_s();
    if (after) {
        ferry_event *done = capture_record(f, dev, stream);
        CHECK_EQ_INT(ferry_release_after(f, &a, 1, done), 0);
        ferry_event_destroy(done);
    } else {
        CHECK_EQ_INT(ferry_release(f, &a, 1), 0);
    }
    CHECK_EQ_INT(ferry_prepare(f, &b, 1), 0);
    if (after)
        CHECK(now_s() - t0 >= 0.25);
    CHECK(fixture_same_as_file(f, b));
    CHECK_EQ_INT(ferry_release(f, &b, 1), 0);
    ferry_destroy(f);
}

static void test_release_after(void *stream)
{
    capture fenced = {.m = PTHREAD_MUTEX_INITIALIZER}, plain = {.m = PTHREAD_MUTEX_INITIALIZER};
    ferry *ref = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(ref, g_path, NULL), 0);
    ferry_tensor *a = ferry_find(ref, "blk.0.attn_q.weight");
    run_pressure(1, &fenced, stream);
    CHECK(captured_is(&fenced, a));
    /* a plain release: the kernel runs over memory that is reused (other bytes) or freed under
     * it — a data race by design (the hazard the event closes), which TSan reports: not under it */
    if (!TSAN) {
        uint64_t misuse = stats().free_while_queued;
        run_pressure(0, &plain, stream);
        /* the late kernel has run (ferry's frees, in its copy stream's order, do not wait for
         * the engine's stream, whose work a plain release says is done) */
        CHECK_EQ_INT(cuda_stream_sync(stream), 0);
        CHECK(!captured_is(&plain, a) || stats().free_while_queued > misuse);
    }
    free(fenced.bytes), free(plain.bytes);
    ferry_destroy(ref);
}

static void test_prepare_async(void *stream)
{
    int dev = -1;
    ferry *f = make(&dev, 0);
    ferry_tensor *ts[2] = {ferry_find(f, "blk.1.attn_q.weight"),
                           ferry_find(f, "blk.1.ffn_up.weight")};
    ferry_event *ready = NULL;
    uint64_t waits = stats().stream_waits;
    CHECK_EQ_INT(ferry_prepare_async(f, ts, 2, &ready), 0);
    CHECK_EQ_INT(ferry_event_wait(ready, stream), 0);
    CHECK(stats().stream_waits > waits);
    capture cap = {.m = PTHREAD_MUTEX_INITIALIZER};
    CHECK_EQ_INT(fc_launch(stream, ferry_tensor_data(ts[1]), (size_t)ferry_tensor_nbytes(ts[1]),
                           0, capture_kernel_sz, &cap),
                 0);
    ferry_event *done = capture_record(f, dev, stream);
    CHECK_EQ_INT(ferry_release_after(f, ts, 2, done), 0);
    CHECK_EQ_INT(ferry_event_synchronize(done), 0);
    CHECK(captured_is(&cap, ts[1]));
    ferry_event_destroy(done);
    ferry_event_destroy(ready);
    free(cap.bytes);
    ferry_destroy(f);
}

static void test_destroy_waits(void *stream)
{
    int dev = -1;
    ferry *f = make(&dev, 0);
    ferry_tensor *t = ferry_find(f, "blk.1.ffn_down.weight");
    capture cap = {.m = PTHREAD_MUTEX_INITIALIZER};
    uint64_t misuse = stats().free_while_queued;
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK_EQ_INT(fc_launch(stream, ferry_tensor_data(t), (size_t)ferry_tensor_nbytes(t), 200000,
                           capture_kernel_sz, &cap),
                 0);
    ferry_event *done = capture_record(f, dev, stream);
    CHECK_EQ_INT(ferry_release_after(f, &t, 1, done), 0);
    ferry_event_destroy(done);
    ferry_destroy(f);
    CHECK_EQ_INT(stats().free_while_queued, misuse);
    pthread_mutex_lock(&cap.m);
    CHECK_EQ_INT(cap.runs, 1);
    pthread_mutex_unlock(&cap.m);
    free(cap.bytes);
}

int main(void)
{
    setenv("FERRY_CUDART", FAKE_CUDART, 1);
    setenv("FAKE_CUDA_DEVICES", "1", 1);
    setenv("FAKE_CUDA_MEM", "64MiB", 1);
    setenv("FAKE_CUDA_DELAY_US", "20", 1);
    void *lib = dlopen(FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load %s: %s\n", FAKE_CUDART, dlerror());
        return 1;
    }
    *(void **)&fc_stats = dlsym(lib, "fakecuda_get_stats");
    *(void **)&fc_launch = dlsym(lib, "fakecuda_launch");
    *(void **)&cuda_stream_create = dlsym(lib, "cudaStreamCreateWithFlags");
    *(void **)&cuda_stream_destroy = dlsym(lib, "cudaStreamDestroy");
    *(void **)&cuda_stream_sync = dlsym(lib, "cudaStreamSynchronize");
    if (!fc_stats || !fc_launch || !cuda_stream_create || !cuda_stream_destroy ||
        !cuda_stream_sync) {
        fprintf(stderr, "%s lacks the test hooks\n", FAKE_CUDART);
        return 1;
    }
    const char *dir = check_tmpdir("stream_cuda_fake");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    if (fixture_write_llama(g_path, 2, 256, 512, 512, FERRY_DTYPE_F32))
        return 2;
    void *stream = NULL;
    CHECK_EQ_INT(cuda_stream_create(&stream, 1), 0); /* the engine's, non-blocking */
    test_device_events(stream);
    test_release_after(stream);
    test_prepare_async(stream);
    test_destroy_waits(stream);
    CHECK_EQ_INT(cuda_stream_destroy(stream), 0);
    fakecuda_stats s = stats();
    CHECK_EQ_INT(s.live_events, 0);
    CHECK_EQ_INT(s.live_allocs, 0);
    CHECK_EQ_INT(s.bad_handles, 0);
    check_rmdir(dir);
    return check_finish();
}
