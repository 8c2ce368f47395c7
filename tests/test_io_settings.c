/*
 * test_io_settings.c — ferry_options.io_threads and io_request_bytes as a manager resolves them
 * (ferry_get_io_settings): given values kept, clamped and block-aligned, $FERRY_IO_REQUEST and
 * $FERRY_IO_THREADS as defaults, and a model read correctly with the smallest requests, and
 * with large direct reads relayed or not ($FERRY_IO_RELAY).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"
#include "model_fixture.h"

static ferry_io_settings settings(uint32_t threads, uint64_t request)
{
    ferry_options o;
    memset(&o, 0, sizeof o);
    o.io_threads = threads;
    o.io_request_bytes = request;
    ferry_io_settings s;
    memset(&s, 0, sizeof s);
    ferry *f = ferry_create(&o);
    CHECK(f != NULL);
    CHECK_EQ_INT(ferry_get_io_settings(f, &s), 0);
    ferry_destroy(f);
    return s;
}

/* PASSES passes over TS[0..N), each tensor prepared, compared with the file and released: 1
 * when every one held the file's bytes (TS NULL: 0). */
static int same_in_passes(ferry *f, ferry_tensor **ts, size_t n, int passes)
{
    int ok = ts != NULL;
    for (int pass = 0; pass < passes && ts; pass++)
        for (size_t i = 0; i < n; i++) {
            ok &= ferry_prepare(f, &ts[i], 1) == 0;
            ok &= fixture_same_as_file(f, ts[i]);
            ferry_release(f, &ts[i], 1);
        }
    return ok;
}

/* Bytes of relay slots F's I/O workers hold. */
static uint64_t relay_slots(const ferry *f)
{
    ferry_io_settings s;
    CHECK_EQ_INT(ferry_get_io_settings(f, &s), 0);
    return s.relay_bytes;
}

/* With FERRY_IO_RELAY=RELAY: the model at PATH (tensors of several MiB) streamed from home disk
 * under a small host budget, twice, then loaded as a group to home host, reads the file's bytes;
 * relay slots exist exactly when reads are relayed and the file takes O_DIRECT. */
static void relayed_reads(const char *path, const char *relay)
{
    setenv("FERRY_IO_RELAY", relay, 1);
    int fd = open(path, O_RDONLY | O_DIRECT);
    int direct = fd >= 0;
    if (fd >= 0)
        close(fd);
    ferry_options o = {.host_budget = 24u << 20};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, path, &p, &n);
    CHECK(ts != NULL && n > 0);
    int relayed = strcmp(relay, "1") == 0 && direct;
    CHECK(same_in_passes(f, ts, n, 2));
    CHECK_EQ_INT(relay_slots(f) > 0, relayed);
    free(ts);
    ferry_destroy(f);

    f = ferry_create(NULL);
    p.home = FERRY_HOME_HOST;
    ts = fixture_open_all(f, path, &p, &n);
    CHECK(ts != NULL && n > 0);
    CHECK_EQ_INT(ferry_load_group(f, "all"), 0);
    CHECK(same_in_passes(f, ts, n, 1));
    CHECK_EQ_INT(relay_slots(f) > 0, relayed);
    free(ts);
    ferry_destroy(f);
    unsetenv("FERRY_IO_RELAY");
}

int main(void)
{
    unsetenv("FERRY_IO_REQUEST");
    unsetenv("FERRY_IO_THREADS");
    ferry_io_settings s = settings(3, 4u << 20);
    CHECK_EQ_INT(s.io_threads, 3);
    CHECK_EQ_INT(s.request_bytes, 4u << 20);
    CHECK(s.backend && (!strcmp(s.backend, "threads") || !strcmp(s.backend, "uring")));
    CHECK_EQ_INT(settings(0, 0).request_bytes, 16u << 20); /* the default */
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1)
        CHECK_EQ_INT(settings(0, 0).io_threads, 4); /* the default */
    CHECK_EQ_INT(settings(0, 1).request_bytes, 64u << 10); /* clamped up */
    CHECK_EQ_INT(settings(0, UINT64_MAX).request_bytes, 1u << 30);
    CHECK_EQ_INT(settings(0, (1u << 20) + 123).request_bytes, 1u << 20); /* block-aligned */
    setenv("FERRY_IO_REQUEST", "2MiB", 1);
    setenv("FERRY_IO_THREADS", "5", 1);
    s = settings(0, 0);
    CHECK_EQ_INT(s.request_bytes, 2u << 20);
    CHECK_EQ_INT(s.io_threads, 5);
    CHECK_EQ_INT(settings(2, 8u << 20).request_bytes, 8u << 20); /* options win */
    setenv("FERRY_IO_REQUEST", "lots", 1);
    CHECK_EQ_INT(settings(0, 0).request_bytes, 16u << 20); /* unparsable: the default */
    unsetenv("FERRY_IO_REQUEST");
    unsetenv("FERRY_IO_THREADS");
    CHECK_EQ_INT(ferry_get_io_settings(NULL, &s), FERRY_EINVAL);

    /* a model streamed with 64 KiB requests reads the same bytes as the file */
    const char *dir = check_tmpdir("io_settings");
    char path[1200];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    if (fixture_write_llama(path, 2, 256, 512, 300, FERRY_DTYPE_F32))
        return 1;
    ferry_options o = {.io_threads = 3, .io_request_bytes = 64u << 10, .host_budget = 8u << 20};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_DIRECT};
    size_t n = 0;
    ferry_tensor **ts = fixture_open_all(f, path, &p, &n);
    CHECK(ts != NULL && n > 0);
    CHECK(same_in_passes(f, ts, n, 2));
    free(ts);
    ferry_destroy(f);

    /* tensors of 6 MiB: read through the I/O pool, relayed or not */
    snprintf(path, sizeof path, "%s/big.gguf", dir);
    if (fixture_write_llama(path, 2, 768, 2048, 300, FERRY_DTYPE_F32))
        return 1;
    relayed_reads(path, "1");
    relayed_reads(path, "0");
    if (!check_failed)
        check_rmdir(dir);
    return check_finish();
}
