/*
 * test_fault_device.c — the "fault:" device wraps cpu, sim and (with the fake CUDA runtime) cuda
 * and fails the N-th allocation or copy, once or every N-th. Each injected failure must reach the
 * caller as a clear error (the code, the device, the tensor) and leave the manager usable: the
 * next prepare works and its bytes are the file's (checked against a plain pread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry.h"
#include "ferry_device.h"
#include "model_fixture.h"

static char g_path[1100];

/* A manager with SPEC as the compute device of every tensor matching PATTERN (the rest on the
 * host), its id in *DEV. A fault:cpu spec replaces the host itself (device 0): copies for
 * host-accessible devices live on the host. */
static ferry *make(const char *spec, const char *pattern, int *dev)
{
    ferry *f = ferry_create(NULL);
    *dev = -1;
    int rc;
    if (strncmp(spec, "fault:cpu", 9) == 0) {
        rc = ferry_set_host_device(f, spec);
        *dev = 0;
    } else {
        rc = ferry_add_device(f, spec, dev);
    }
    if (rc)
        fprintf(stderr, "%s: %s\n", spec, ferry_errmsg(f));
    CHECK_EQ_INT(rc, 0);
    ferry_policy p = {0};
    p.compute_device = *dev;
    p.load = FERRY_LOAD_READ;
    p.writable = 1; /* a private copy on the device even where it is host memory (cpu) */
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "dev", pattern, &p), 0);
    ferry_policy h = {0};
    CHECK_EQ_INT(ferry_group_add(f, "host", "*", &h), 0);
    return f;
}

/* Prepares T and checks its bytes against the file, once more after an injected failure of
 * either (the read back copies too). Returns the number of failures seen (each with CODE and a
 * message naming the device, T and WHAT). */
static int prepare_check(ferry *f, ferry_tensor *t, int code, const char *what)
{
    ferry_tensor_info ti;
    ferry_tensor_get_info(t, &ti);
    int failures = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        int rc = ferry_prepare(f, &t, 1);
        int prepared = rc == 0;
        if (prepared) { /* read back (a copy the fault may hit), compared with a plain pread */
            unsigned char *want = fixture_pread(ti.file, ti.offset, ti.nbytes);
            unsigned char *got = malloc(ti.nbytes ? ti.nbytes : 1);
            CHECK(want && got);
            rc = ferry_tensor_read(f, t, 0, ti.nbytes, got);
            if (!rc)
                CHECK(memcmp(want, got, ti.nbytes) == 0);
            free(want), free(got);
        }
        if (prepared)
            CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
        if (!rc)
            return failures;
        failures++;
        CHECK_EQ_INT(rc, code);
        const char *m = ferry_errmsg(f);
        if (!strstr(m, what) || !strstr(m, ti.name) || !strstr(m, "fault:"))
            fprintf(stderr, "message '%s'\n", m);
        CHECK(strstr(m, what) != NULL);
        CHECK(strstr(m, ti.name) != NULL);
        CHECK(strstr(m, "fault:") != NULL);
    }
    CHECK(0); /* three failures in a row of a once-only fault */
    return failures;
}

/* The spec's own checks: bad options are refused with a message quoting them. */
static void test_specs(void)
{
    static const struct {
        const char *spec, *what;
    } bad[] = {
        {"fault:", "expected fault:DEVICE"},
        {"fault:fault:cpu", "expected fault:DEVICE"},
        {"fault:sim:64MiB,fail_alloc=x", "bad option 'fail_alloc=x'"},
        {"fault:sim:64MiB,fail_copy=0", "bad option 'fail_copy=0'"},
        {"fault:sim:64MiB,fail_copy=3/often", "bad option 'fail_copy=3/often'"},
        {"fault:sim:8XB", "bad capacity '8XB'"},
        {"fault:tpu", "unknown device"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry_device *d = (ferry_device *)&d;
        char msg[256];
        CHECK_EQ_INT(ferry_device_open(bad[i].spec, &d, msg, sizeof msg), FERRY_EINVAL);
        CHECK(d == NULL);
        if (!strstr(msg, bad[i].what))
            fprintf(stderr, "%s: '%s' lacks '%s'\n", bad[i].spec, msg, bad[i].what);
        CHECK(strstr(msg, bad[i].what) != NULL);
        CHECK(strstr(msg, bad[i].spec) != NULL);
    }
    /* the wrapped device keeps its own options; the trailing fail_ ones are the wrapper's */
    ferry *f = ferry_create(NULL);
    int dev = -1;
    /* the host can be replaced by a host-accessible device, on a fresh manager only */
    CHECK_EQ_INT(ferry_set_host_device(f, "sim:1MiB"), FERRY_EINVAL);
    CHECK(strstr(ferry_errmsg(f), "host-accessible") != NULL);
    CHECK_EQ_INT(ferry_set_host_device(f, "fault:cpu,fail_alloc=1"), 0);
    CHECK_EQ_INT(ferry_add_device(f, "fault:sim:32MiB,poison=0,fail_copy=2/every", &dev), 0);
    ferry_device_info info;
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &info), 0);
    CHECK_STR(info.name, "fault:sim:32MiB,poison=0,fail_copy=2/every");
    CHECK_STR(info.kind, "sim");
    CHECK_EQ_INT(info.host_accessible, 0);
    CHECK_EQ_INT(info.total_bytes, UINT64_C(32) << 20);
    CHECK_EQ_INT(ferry_add_device(f, "fault:cpu", &dev), 0);
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &info), 0);
    CHECK_STR(info.kind, "cpu");
    CHECK_EQ_INT(info.host_accessible, 1);
    CHECK_EQ_INT(ferry_get_device_info(f, 0, &info), 0);
    CHECK_STR(info.name, "fault:cpu,fail_alloc=1");
    CHECK_EQ_INT(ferry_set_host_device(f, "cpu"), FERRY_EBUSY); /* other devices now */
    CHECK(strstr(ferry_errmsg(f), "fresh manager") != NULL);
    CHECK_EQ_INT(ferry_get_device_info(f, 0, &info), 0);
    CHECK_STR(info.name, "fault:cpu,fail_alloc=1");
    ferry_destroy(f);
}

/* One injected failure in two passes over every tensor: it is reported once, with CODE and a
 * message naming the device, the tensor and WHAT, and everything then prepares with the file's
 * bytes. */
static void run_once(const char *spec, int code, const char *what)
{
    printf("%s\n", spec);
    int dev;
    ferry *f = make(spec, "*", &dev);
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    CHECK(n >= 10);
    int failures = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++)
            failures += prepare_check(f, ts[i], code, what);
        /* the second pass re-stages everything: a budget of one byte evicts what is cached */
        CHECK_EQ_INT(ferry_set_budget(f, dev, 1), 0);
        CHECK_EQ_INT(ferry_set_budget(f, dev, 0), 0);
    }
    CHECK_EQ_INT(failures, 1);
    free(ts);
    ferry_destroy(f);
}

/* Every N-th failing: the failing prepares report it and the others work. A device that always
 * fails leaves the rest of the manager working: tensors of another group prepare on the host. */
static void run_every(const char *spec_every, const char *spec_always, int code)
{
    printf("%s, %s\n", spec_every, spec_always);
    int dev;
    ferry *f = make(spec_every, "*", &dev);
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    int ok = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = ferry_prepare(f, &ts[i], 1);
        if (rc == 0) {
            ok++;
            CHECK_EQ_INT(ferry_release(f, &ts[i], 1), 0);
        } else {
            failed++;
            CHECK_EQ_INT(rc, code);
            CHECK(strstr(ferry_errmsg(f), "(injected)") != NULL);
        }
    }
    CHECK(ok > 0 && failed > 0);
    free(ts);
    ferry_destroy(f);

    if (!strncmp(spec_always, "fault:cpu", 9))
        return; /* a host that never allocates has no rest of the manager */
    f = make(spec_always, "blk.*", &dev);
    ferry_tensor *on_dev = ferry_find(f, "blk.0.ffn_up.weight");
    ferry_tensor *on_host = ferry_find(f, "output.weight");
    CHECK(on_dev && on_host);
    CHECK_EQ_INT(ferry_prepare(f, &on_dev, 1), code);
    CHECK_EQ_INT(ferry_prepare(f, &on_dev, 1), code);
    CHECK_EQ_INT(ferry_prepare(f, &on_host, 1), 0);
    CHECK(fixture_same_as_file(f, on_host));
    CHECK_EQ_INT(ferry_release(f, &on_host, 1), 0);
    ferry_destroy(f);
}

static void on_device(const char *base)
{
    char a[128], b[128];
    snprintf(a, sizeof a, "fault:%s,fail_alloc=3", base);
    run_once(a, FERRY_ENOMEM, "allocation 3");
    snprintf(a, sizeof a, "fault:%s,fail_alloc=2/every", base);
    snprintf(b, sizeof b, "fault:%s,fail_alloc=1/every", base);
    run_every(a, b, FERRY_ENOMEM);
}

static void on_staged_device(const char *base)
{
    on_device(base);
    char a[128], b[128];
    snprintf(a, sizeof a, "fault:%s,fail_copy=4", base);
    run_once(a, FERRY_EDEVICE, "(injected)");
    snprintf(a, sizeof a, "fault:%s,fail_copy=3/every", base);
    snprintf(b, sizeof b, "fault:%s,fail_copy=1/every", base);
    run_every(a, b, FERRY_EDEVICE);
}

int main(void)
{
    const char *dir = check_tmpdir("fault_device");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, 2, 256, 512, 512, FERRY_DTYPE_F16, 0);
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, ts, n)) {
        fprintf(stderr, "cannot write %s\n", g_path);
        return 1;
    }
    test_specs();
    on_device("cpu");
    on_staged_device("sim:64MiB");
    if (getenv("FERRY_CUDART")) {
        on_staged_device("cuda:0");
    } else {
        printf("cuda: skipped (no FERRY_CUDART)\n");
    }
    check_rmdir(dir);
    return check_finish();
}
