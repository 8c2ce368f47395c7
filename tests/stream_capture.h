/*
 * stream_capture.h — what the stream-ordering tests share: a late "kernel" callback that copies
 * the device bytes it reads into a capture, a check of a capture against the tensor's bytes in
 * the file (plain pread), the manager they stream through, a monotonic clock, and TSAN (1 under
 * ThreadSanitizer).
 */
#ifndef FERRY_STREAM_CAPTURE_H
#define FERRY_STREAM_CAPTURE_H

#include <pthread.h>
#include <time.h>

#include "check.h"
#include "model_fixture.h"

#if defined(__SANITIZE_THREAD__)
#define TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN 1
#endif
#endif
#ifndef TSAN
#define TSAN 0
#endif

/* What the last kernel run read; m guards every field (kernels run on a device's own thread). */
typedef struct capture {
    pthread_mutex_t m;
    unsigned char *bytes; /* owned: free() it */
    uint64_t n;
    int runs;
} capture;

/* A kernel callback: UD is a capture, BYTES..BYTES+N what the kernel reads. */
static inline void capture_kernel(void *ud, const void *bytes, uint64_t n)
{
    capture *c = ud;
    pthread_mutex_lock(&c->m);
    free(c->bytes);
    c->bytes = malloc(n ? n : 1);
    if (c->bytes)
        memcpy(c->bytes, bytes, n);
    c->n = n;
    c->runs++;
    pthread_mutex_unlock(&c->m);
}

/* 1 when C captured exactly T's bytes in the file. */
static inline int captured_is(capture *c, ferry_tensor *t)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    unsigned char *want = fixture_pread(info.file, info.offset, info.nbytes);
    pthread_mutex_lock(&c->m);
    int ok = want && c->bytes && c->n == info.nbytes && !memcmp(want, c->bytes, info.nbytes);
    pthread_mutex_unlock(&c->m);
    free(want);
    return ok;
}

/* Opens PATH in F (a device DEV added) with every tensor in one group "all", computed on DEV and
 * loaded by mmap, under BUDGET bytes on DEV when nonzero; each step checked. Returns F. */
static inline ferry *capture_manager(ferry *f, int dev, uint64_t budget, const char *path)
{
    if (budget)
        CHECK_EQ_INT(ferry_set_budget(f, dev, budget), 0);
    ferry_policy p = {0};
    p.compute_device = dev;
    p.load = FERRY_LOAD_MMAP;
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    return f;
}

/* A new event of device DEV recorded on STREAM, both steps checked. */
static inline ferry_event *capture_record(ferry *f, int dev, void *stream)
{
    ferry_event *ev = NULL;
    CHECK_EQ_INT(ferry_event_create(f, dev, &ev), 0);
    CHECK_EQ_INT(ferry_event_record(ev, stream), 0);
    return ev;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
