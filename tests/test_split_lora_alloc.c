/*
 * test_split_lora_alloc.c — a weight split over two devices, with a required LoRA adapter, when
 * an allocation fails while its parts are made: whichever allocation of ferry_prepare fails (the
 * N-th malloc of the calling thread, for every N until the prepare no longer reaches it), the
 * prepare either fails with an error and leaves the manager usable, or succeeds with the adapter
 * merged into every part — never with a part silently staged from the unmerged file bytes.
 *
 * The failures come from a malloc this program defines over the C library's (glibc's
 * __libc_malloc behind it), so the test runs only outside the sanitizers, whose runtimes own
 * malloc.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli_harness.h"
#include "ferry.h"

#if !SANITIZED && defined(__GLIBC__)
#define FAULTS 1
extern void *__libc_malloc(size_t n);
static _Thread_local long t_countdown; /* > 0: the malloc that brings it to 0 fails */
static _Thread_local int t_fired;

void *malloc(size_t n)
{
    if (t_countdown > 0 && --t_countdown == 0) {
        t_fired = 1;
        return NULL;
    }
    return __libc_malloc(n);
}
#else
#define FAULTS 0
#endif

static char g_base[1200], g_ad[1200];
static const char *g_name = "blk.0.attn_q.weight";

/* A manager with two simulated devices, the base open, the adapter added (required) and the
 * weight in a group split over both devices. NULL on a setup failure. */
static ferry *setup(ferry_tensor **t)
{
    ferry *f = ferry_create(NULL);
    int d1 = -1, d2 = -1;
    ferry_lora_options o;
    memset(&o, 0, sizeof o);
    o.required = 1;
    ferry_policy p;
    memset(&p, 0, sizeof p);
    p.home = FERRY_HOME_DISK;
    p.load = FERRY_LOAD_READ;
    if (!f || ferry_add_device(f, "sim:64MiB", &d1) || ferry_add_device(f, "sim:64MiB", &d2) ||
        ferry_open(f, g_base, NULL) || ferry_lora_add(f, g_ad, 1.0f, &o, NULL)) {
        fprintf(stderr, "setup: %s\n", f ? ferry_errmsg(f) : "out of memory");
        ferry_destroy(f);
        return NULL;
    }
    p.n_split = 2;
    p.split_devices[0] = d1;
    p.split_devices[1] = d2;
    if (ferry_group_add(f, "split", g_name, &p) || !(*t = ferry_find(f, g_name))) {
        fprintf(stderr, "setup: %s\n", ferry_errmsg(f));
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

/* The prepared weight's bytes (malloc'd, *N of them), or NULL. */
static unsigned char *read_all(ferry *f, ferry_tensor *t, uint64_t *n)
{
    *n = ferry_tensor_nbytes(t);
    unsigned char *b = malloc(*n ? *n : 1);
    if (b && ferry_tensor_read(f, t, 0, *n, b) != 0) {
        free(b);
        b = NULL;
    }
    return b;
}

int main(void)
{
    tmp = check_tmpdir("split_lora_alloc");
    snprintf(g_base, sizeof g_base, "%s/base.gguf", tmp);
    snprintf(g_ad, sizeof g_ad, "%s/ad.safetensors", tmp);
    if (run("gen -o '%s' --layers 1 --dim 64 --ff 128 --vocab 64 --dtype f32 -q", g_base) ||
        run("gen --lora '%s' -o '%s' --rank 4 -q", g_base, g_ad)) {
        fprintf(stderr, "cannot make the test files: %s\n", err_text);
        return 1;
    }
    /* the unmerged file bytes, and the merged weight without any failure */
    ferry_catalog *c = ferry_catalog_create();
    ferry_tensor_info in;
    int64_t k = ferry_catalog_add(c, g_base, NULL) ? -1 : ferry_catalog_find(c, g_name);
    CHECK(k >= 0 && ferry_catalog_tensor(c, (size_t)k, &in) == 0);
    unsigned char *raw = k >= 0 ? malloc(in.nbytes) : NULL;
    FILE *fp = fopen(g_base, "rb");
    CHECK(raw && fp && fseek(fp, (long)in.offset, SEEK_SET) == 0 &&
          fread(raw, 1, in.nbytes, fp) == in.nbytes);
    if (fp)
        fclose(fp);
    ferry_catalog_destroy(c);
    ferry_tensor *t = NULL;
    ferry *f = setup(&t);
    CHECK(f != NULL);
    uint64_t nb = 0;
    unsigned char *merged = NULL;
    if (f && ferry_prepare(f, &t, 1) == 0) {
        CHECK_EQ_INT(ferry_tensor_part_count(t), 2);
        merged = read_all(f, t, &nb);
        ferry_release(f, &t, 1);
    }
    CHECK(merged && raw && nb == in.nbytes && memcmp(merged, raw, nb) != 0);
    ferry_destroy(f);
    if (!FAULTS) {
        printf("allocation failures not injected: a sanitizer build owns malloc\n");
    } else if (merged && raw) {
#if FAULTS
        int failed = 0, succeeded = 0;
        for (long nth = 1; nth < 5000; nth++) {
            if (!(f = setup(&t)))
                break;
            t_fired = 0;
            t_countdown = nth;
            int rc = ferry_prepare(f, &t, 1);
            t_countdown = 0;
            if (!t_fired) { /* the prepare made fewer allocations: all of them have failed once */
                CHECK_EQ_INT(rc, 0);
                ferry_release(f, &t, 1);
                ferry_destroy(f);
                printf("each of the prepare's first %ld allocations failed once: %d refusals, "
                       "%d successes\n",
                       nth - 1, failed, succeeded);
                break;
            }
            if (rc == 0) {
                succeeded++;
                uint64_t n = 0;
                unsigned char *got = read_all(f, t, &n);
                int same = got && n == nb && memcmp(got, merged, nb) == 0;
                if (!same)
                    fprintf(stderr, "allocation %ld failed: prepare succeeded with %s\n", nth,
                            got && memcmp(got, raw, nb) == 0 ? "the unmerged weight"
                                                              : "other bytes");
                CHECK(same);
                free(got);
                ferry_release(f, &t, 1);
            } else {
                failed++;
                CHECK(*ferry_errmsg(f) != 0);
                /* usable: the next prepare stages the merged weight */
                rc = ferry_prepare(f, &t, 1);
                CHECK_EQ_INT(rc, 0);
                if (rc == 0) {
                    uint64_t n = 0;
                    unsigned char *got = read_all(f, t, &n);
                    CHECK(got && n == nb && memcmp(got, merged, nb) == 0);
                    free(got);
                    ferry_release(f, &t, 1);
                }
            }
            ferry_destroy(f);
        }
        CHECK(failed > 0);
#endif
    }
    free(merged);
    free(raw);
    int rc = check_finish();
    if (!rc)
        check_rmdir(tmp);
    return rc;
}
