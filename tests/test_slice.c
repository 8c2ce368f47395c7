/*
 * test_slice.c — slices (ferry_slice) as residency units: each slice's bytes are exactly its
 * range of the file for f32/f16/q8_0/q4_K GGUF and f32/f16/bf16 safetensors expert tensors, under
 * every home x load mode on cpu and sim; handles are stable; a slice and its tensor held at once;
 * prefetch; a host budget that fits a few experts streams all of them with eviction; conversion;
 * statistics; a device that fails a slice's load; LoRA refusal; the errors; the dry run per expert.
 */
#include "check.h"
#include "slice_fixture.h"

static char g_gguf[1200], g_st[1200], g_lora[1200];

static ferry_tensor *find(ferry *f, const char *name)
{
    ferry_tensor *t = ferry_find(f, name);
    if (!t)
        fprintf(stderr, "no tensor '%s': %s\n", name, ferry_errmsg(f));
    return t;
}

/* Prepares slice [FIRST, FIRST+COUNT) of T, checks its info and bytes, releases it. */
static int check_slice(ferry *f, ferry_tensor *t, uint64_t first, uint64_t count)
{
    ferry_tensor *s = NULL;
    if (ferry_slice(f, t, first, count, &s) != 0 || !s) {
        fprintf(stderr, "slice [%llu+%llu]: %s\n", (unsigned long long)first,
                (unsigned long long)count, ferry_errmsg(f));
        return 0;
    }
    ferry_tensor_info pi, si;
    ferry_tensor_get_info(t, &pi);
    ferry_tensor_get_info(s, &si);
    uint64_t off, n;
    slice_range_of(t, first, count, &off, &n);
    uint32_t od = pi.format == FERRY_FORMAT_GGUF ? pi.ndim - 1 : 0;
    int ok = si.ndim == pi.ndim && si.dtype == pi.dtype && si.offset == off && si.nbytes == n &&
             si.shape[od] == (int64_t)count && !strcmp(si.file, pi.file);
    for (uint32_t d = 0; d < pi.ndim; d++)
        ok = ok && (d == od || si.shape[d] == pi.shape[d]);
    char want_name[256];
    snprintf(want_name, sizeof want_name, "%s[%llu:%llu]", pi.name, (unsigned long long)first,
             (unsigned long long)(first + count));
    ok = ok && !strcmp(si.name, want_name);
    if (ferry_prepare(f, &s, 1) != 0) {
        fprintf(stderr, "prepare %s: %s\n", si.name, ferry_errmsg(f));
        return 0;
    }
    ok = ok && slice_bytes_are(f, s, pi.file, off, n);
    if (!ok)
        fprintf(stderr, "slice %s: wrong info or bytes\n", si.name);
    ok = ferry_release(f, &s, 1) == 0 && ok;
    return ok;
}

/* Every expert of every expert tensor, and a range of several, under one policy. */
static void check_all(ferry *f, const fixture_tensor *ts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ferry_tensor *t = find(f, ts[i].name);
        CHECK(t != NULL);
        if (!t)
            continue;
        for (uint64_t e = 0; e < SLICE_EXPERTS; e++)
            CHECK(check_slice(f, t, e, 1));
        CHECK(check_slice(f, t, 2, 3));
        CHECK(check_slice(f, t, 0, SLICE_EXPERTS));
    }
}

static void test_bytes_every_mode(void)
{
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    static const ferry_load loads[] = {FERRY_LOAD_AUTO, FERRY_LOAD_MMAP, FERRY_LOAD_READ,
                                       FERRY_LOAD_DIRECT};
    static const char *devs[] = {"cpu", "sim:64MiB"};
    for (int fmt = 0; fmt < 2; fmt++)
        for (size_t d = 0; d < 2; d++)
            for (size_t h = 0; h < 3; h++)
                for (size_t l = 0; l < 4; l++) {
                    ferry *f = ferry_create(NULL);
                    int dev = 0;
                    if (d)
                        CHECK_EQ_INT(ferry_add_device(f, devs[d], &dev), 0);
                    ferry_policy p = {.home = homes[h], .compute_device = dev, .load = loads[l]};
                    CHECK_EQ_INT(ferry_open(f, fmt ? g_st : g_gguf, NULL), 0);
                    CHECK_EQ_INT(ferry_group_add(f, "experts", "*", &p), 0);
                    if (fmt)
                        check_all(f, slice_st_ts, SLICE_N_ST_EXPERT_TS);
                    else
                        check_all(f, slice_gguf_ts, SLICE_N_GGUF_EXPERT_TS);
                    ferry_destroy(f);
                }
}

static void test_same_handle(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.q8_0");
    ferry_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 3, 1, &a), 0);
    CHECK_EQ_INT(ferry_slice(f, t, 3, 1, &b), 0);
    CHECK(a && a == b);
    CHECK_EQ_INT(ferry_slice(f, t, 2, 4, &c), 0);
    CHECK(c && c != a);
    /* a slice of a slice is the slice of the tensor it covers */
    CHECK_EQ_INT(ferry_slice(f, c, 1, 1, &d), 0);
    CHECK(d == a);
    CHECK_EQ_INT(ferry_slice(f, c, 3, 2, &d), FERRY_EINVAL);
    CHECK(d == NULL);
    /* the tensor's own lookups know nothing of slices */
    CHECK(ferry_find(f, "blk.0.ffn_up_exps.q8_0[3:4]") == NULL);
    CHECK_EQ_INT(ferry_tensor_part_count(a), 1);
    ferry_tensor_part part;
    CHECK_EQ_INT(ferry_tensor_get_part(a, 0, &part), 0);
    CHECK_EQ_INT(part.row0, 0);
    ferry_destroy(f);
}

/* The slice and its tensor prepared at once, in one call and in two: each holds its bytes; zero
 * copy, the slice's pointer is the tensor's at the expert's offset. */
static void test_with_parent(void)
{
    static const ferry_load loads[] = {FERRY_LOAD_MMAP, FERRY_LOAD_READ, FERRY_LOAD_DIRECT};
    for (size_t l = 0; l < 3; l++) {
        ferry *f = ferry_create(NULL);
        ferry_policy p = {.load = loads[l]};
        CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        ferry_tensor *t = find(f, "blk.0.ffn_up_exps.f16"), *s = NULL;
        CHECK_EQ_INT(ferry_slice(f, t, 5, 1, &s), 0);
        ferry_tensor *both[2] = {t, s};
        CHECK_EQ_INT(ferry_prepare(f, both, 2), 0);
        CHECK(fixture_same_as_file(f, t));
        CHECK(fixture_same_as_file(f, s));
        uint64_t off, n;
        slice_range_of(t, 5, 1, &off, &n);
        unsigned char *pt = ferry_tensor_data(t), *ps = ferry_tensor_data(s);
        CHECK(pt && ps);
        if (loads[l] == FERRY_LOAD_MMAP)
            CHECK(ps == pt + 5 * n);
        else
            CHECK(ps < pt || ps >= pt + ferry_tensor_nbytes(t)); /* a copy of its own */
        CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
        CHECK(fixture_same_as_file(f, s));
        CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
        CHECK_EQ_INT(ferry_release(f, both, 2), 0);
        CHECK(ferry_tensor_data(s) == NULL);
        ferry_destroy(f);
    }
}

/* Home disk with a host budget that holds three experts of "big": every expert of three passes in
 * a shuffled order comes right, with evictions, and the host never holds more than its budget. */
static void test_budget_streams_experts(const char *dev_spec)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    if (dev_spec)
        CHECK_EQ_INT(ferry_add_device(f, dev_spec, &dev), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = dev};
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = find(f, "blk.1.ffn_down_exps.big");
    uint64_t off, n;
    slice_range_of(t, 0, 1, &off, &n);
    uint64_t budget = 3 * (n + 8192);
    CHECK_EQ_INT(ferry_set_budget(f, dev, budget), 0);
    ferry_tensor *s[SLICE_EXPERTS];
    for (uint64_t e = 0; e < SLICE_EXPERTS; e++)
        CHECK_EQ_INT(ferry_slice(f, t, e, 1, &s[e]), 0);
    unsigned seed = 7;
    int ok = 1;
    for (int pass = 0; pass < 3; pass++) {
        int order[SLICE_EXPERTS];
        for (int e = 0; e < SLICE_EXPERTS; e++)
            order[e] = e;
        for (int e = SLICE_EXPERTS - 1; e > 0; e--) {
            seed = seed * 1103515245u + 12345u;
            int k = (int)((seed >> 16) % (unsigned)(e + 1)), x = order[e];
            order[e] = order[k], order[k] = x;
        }
        for (int i = 0; i < SLICE_EXPERTS; i++) {
            /* two experts at once, as a token routed to k = 2 */
            ferry_tensor *pair[2] = {s[order[i]], s[order[(i + 1) % SLICE_EXPERTS]]};
            if (ferry_prepare(f, pair, 2) != 0) {
                fprintf(stderr, "prepare: %s\n", ferry_errmsg(f));
                ok = 0;
                continue;
            }
            ok &= fixture_same_as_file(f, pair[0]) && fixture_same_as_file(f, pair[1]);
            ferry_stats st;
            ferry_get_stats(f, &st);
            ok &= st.resident_bytes[dev] <= budget;
            ferry_release(f, pair, 2);
        }
    }
    CHECK(ok);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.evictions > 0);
    CHECK(st.peak_bytes[dev] <= budget);
    CHECK(st.bytes_read >= 3 * n * (SLICE_EXPERTS - 3));
    /* a budget below one expert: the slice's load is refused, naming it */
    CHECK_EQ_INT(ferry_release_all(f), 0);
    CHECK_EQ_INT(ferry_set_budget(f, dev, n / 2), 0);
    CHECK_EQ_INT(ferry_prepare(f, &s[0], 1), FERRY_EBUDGET);
    CHECK(strstr(ferry_errmsg(f), "big[0:1]") != NULL);
    ferry_destroy(f);
}

/* Prefetched slices are ready (or in flight) when prepared: hits, and the right bytes. */
static void test_prefetch(void)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_DIRECT, .compute_device = dev};
    ferry_options o = {.no_schedule = 1};
    ferry_destroy(f);
    f = ferry_create(&o);
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
    p.compute_device = dev;
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.q4_K"), *s[3];
    for (int e = 0; e < 3; e++)
        CHECK_EQ_INT(ferry_slice(f, t, (uint64_t)(2 * e + 1), 1, &s[e]), 0);
    CHECK_EQ_INT(ferry_prefetch(f, s, 3), 0);
    CHECK_EQ_INT(ferry_prepare(f, s, 3), 0);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK_EQ_INT(st.prefetch_hits, 3);
    CHECK_EQ_INT(st.prefetch_misses, 0);
    for (int e = 0; e < 3; e++)
        CHECK(fixture_same_as_file(f, s[e]));
    CHECK_EQ_INT(ferry_release(f, s, 3), 0);
    ferry_destroy(f);
}

/* Statistics count a slice as a tensor of its own size: one prepare, its bytes read. */
static void test_stats(void)
{
    ferry_options o = {.no_schedule = 1};
    ferry *f = ferry_create(&o);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.q8_0"), *s = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 6, 2, &s), 0);
    ferry_stats a, b;
    ferry_get_stats(f, &a);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), 0);
    ferry_get_stats(f, &b);
    uint64_t off, n;
    slice_range_of(t, 6, 2, &off, &n);
    CHECK_EQ_INT(b.prepares - a.prepares, 1);
    CHECK_EQ_INT(b.bytes_read - a.bytes_read, n);
    CHECK(b.resident_bytes[0] - a.resident_bytes[0] >= n);
    CHECK(b.resident_bytes[0] - a.resident_bytes[0] < ferry_tensor_nbytes(t));
    CHECK_EQ_INT(ferry_release(f, &s, 1), 0);
    ferry_get_stats(f, &b);
    CHECK(b.cached_bytes >= n);
    ferry_destroy(f);
}

/* Conversion is the group's: a f16 expert staged as f32 holds its own values converted. */
static void test_convert(void)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .compute_device = dev,
                      .convert = 1, .compute_dtype = FERRY_DTYPE_F32};
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.f16"), *s = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 4, 1, &s), 0);
    CHECK_EQ_INT(ferry_tensor_dtype(s), FERRY_DTYPE_F32);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), 0);
    uint64_t off, n;
    slice_range_of(t, 4, 1, &off, &n);
    uint64_t ne = n / 2;
    CHECK_EQ_INT(ferry_tensor_nbytes(s), ne * 4);
    void *raw = fixture_pread(g_gguf, off, n);
    float *want = malloc(ne * 4), *got = malloc(ne * 4);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F16, raw, FERRY_DTYPE_F32, want, ne), 0);
    CHECK_EQ_INT(ferry_tensor_read(f, s, 0, ne * 4, got), 0);
    CHECK(memcmp(want, got, ne * 4) == 0);
    free(raw), free(want), free(got);
    CHECK_EQ_INT(ferry_release(f, &s, 1), 0);
    ferry_destroy(f);
}

/* A device that fails a slice's allocation, then its copy: each prepare fails naming the slice,
 * holds nothing, and the next prepare of the same slice succeeds. */
static void test_device_fault(void)
{
    static const char *specs[] = {"sim:64MiB,fail_alloc=1", "fault:sim:64MiB,fail_copy=1",
                                  "fault:sim:64MiB,fail_alloc=2"};
    for (size_t k = 0; k < 3; k++) {
        ferry *f = ferry_create(NULL);
        int dev = 0;
        CHECK_EQ_INT(ferry_add_device(f, specs[k], &dev), 0);
        ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = dev};
        CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        ferry_tensor *t = find(f, "blk.0.ffn_up_exps.f32"), *s[2];
        CHECK_EQ_INT(ferry_slice(f, t, 1, 1, &s[0]), 0);
        CHECK_EQ_INT(ferry_slice(f, t, 7, 1, &s[1]), 0);
        int rc = ferry_prepare(f, s, 2);
        CHECK(rc != 0);
        CHECK(strstr(ferry_errmsg(f), "ffn_up_exps.f32[") != NULL);
        CHECK(ferry_tensor_data(s[0]) == NULL && ferry_tensor_data(s[1]) == NULL);
        CHECK_EQ_INT(ferry_release(f, s, 1), FERRY_EINVAL); /* nothing is held */
        CHECK_EQ_INT(ferry_prepare(f, s, 2), 0);
        CHECK(fixture_same_as_file(f, s[0]));
        CHECK(fixture_same_as_file(f, s[1]));
        CHECK_EQ_INT(ferry_release(f, s, 2), 0);
        ferry_destroy(f);
    }
}

static void test_errors(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_open(f, g_st, "st."), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.q4_K"), *s = (ferry_tensor *)1;
    CHECK_EQ_INT(ferry_slice(NULL, t, 0, 1, &s), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_slice(f, NULL, 0, 1, &s), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_slice(f, t, 0, 1, NULL), FERRY_EINVAL);
    static const uint64_t bad[][2] = {{0, 0}, {8, 1}, {7, 2}, {0, 9}, {UINT64_MAX, 1},
                                      {1, UINT64_MAX}, {UINT64_MAX, UINT64_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s = (ferry_tensor *)1;
        CHECK_EQ_INT(ferry_slice(f, t, bad[i][0], bad[i][1], &s), FERRY_EINVAL);
        CHECK(s == NULL);
        CHECK(strstr(ferry_errmsg(f), "blk.0.ffn_up_exps.q4_K") != NULL);
        CHECK(strstr(ferry_errmsg(f), "outside") != NULL);
    }
    /* 1-D: elements of a dtype without blocks can be cut, q8_0's 32-element blocks cannot */
    ferry_tensor *v = find(f, "vec.f32"), *vq = find(f, "vec.q8_0");
    CHECK_EQ_INT(ferry_slice(f, v, 10, 5, &s), 0);
    ferry_tensor_info si;
    ferry_tensor_get_info(s, &si);
    CHECK_EQ_INT(si.ndim, 1);
    CHECK_EQ_INT(si.shape[0], 5);
    CHECK_EQ_INT(si.n_elems, 5);
    CHECK_EQ_INT(si.row_elems, 5);
    CHECK_EQ_INT(si.n_rows, 1);
    CHECK(check_slice(f, v, 10, 5));
    CHECK_EQ_INT(ferry_slice(f, vq, 0, 1, &s), FERRY_EINVAL);
    CHECK(strstr(ferry_errmsg(f), "whole blocks") != NULL);
    /* a scalar has no rows */
    ferry_tensor *sc = find(f, "st.scalar");
    CHECK(sc != NULL);
    CHECK_EQ_INT(ferry_slice(f, sc, 0, 1, &s), FERRY_EINVAL);
    CHECK(strstr(ferry_errmsg(f), "scalar") != NULL);
    /* 2-D: a range of rows; safetensors' outermost is its first dimension */
    ferry_tensor *tok = find(f, "tok.weight");
    CHECK(check_slice(f, tok, 3, 4));
    ferry_tensor *st = find(f, "st.blk.0.ffn_up_exps.f32");
    CHECK_EQ_INT(ferry_slice(f, st, 1, 1, &s), 0);
    ferry_tensor_get_info(s, &si);
    CHECK_EQ_INT(si.shape[0], 1);
    CHECK_EQ_INT(si.shape[2], 64);
    /* a tensor of another manager */
    ferry *g = ferry_create(NULL);
    CHECK_EQ_INT(ferry_slice(g, t, 0, 1, &s), FERRY_EINVAL);
    ferry_destroy(g);
    ferry_destroy(f);
}

/* The slice of a tensor split over two devices is one unit on the split's first device. */
static void test_split_parent(void)
{
    ferry *f = ferry_create(NULL);
    int d1 = 0, d2 = 0;
    CHECK_EQ_INT(ferry_add_device(f, "sim:16MiB", &d1), 0);
    CHECK_EQ_INT(ferry_add_device(f, "sim:16MiB", &d2), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .n_split = 2,
                      .split_devices = {d1, d2}};
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = find(f, "tok.weight"), *s = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 10, 6, &s), 0);
    ferry_tensor *both[2] = {t, s};
    CHECK_EQ_INT(ferry_prepare(f, both, 2), 0);
    CHECK_EQ_INT(ferry_tensor_part_count(t), 2);
    CHECK_EQ_INT(ferry_tensor_part_count(s), 1);
    ferry_tensor_part part;
    CHECK_EQ_INT(ferry_tensor_get_part(s, 0, &part), 0);
    CHECK_EQ_INT(part.device, d1);
    CHECK_EQ_INT(part.n_rows, 6);
    CHECK(fixture_same_as_file(f, s));
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, both, 2), 0);
    ferry_destroy(f);
}

/* Removing the group: refused while a slice is held; afterwards the slice is dead. */
static void test_group_remove(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_group_add(f, "exps", "*_exps.*", &p), 0);
    ferry_tensor *t = find(f, "blk.0.ffn_up_exps.f32"), *s = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 0, 1, &s), 0);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "exps"), FERRY_EBUSY);
    CHECK(strstr(ferry_errmsg(f), "[0:1]") != NULL);
    CHECK_EQ_INT(ferry_release(f, &s, 1), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "exps"), 0);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), FERRY_ENOENT);
    ferry_destroy(f);
}

/* A GGUF adapter on tok.weight [32 cols, 16 rows], rank 4. */
static int write_lora(const char *path)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int64_t sa[2] = {32, 4}, sb[2] = {4, 16};
    int rc = ferry_writer_set_meta_str(w, "general.architecture", "llama");
    if (!rc)
        rc = ferry_writer_set_meta_str(w, "adapter.type", "lora");
    if (!rc)
        rc = ferry_writer_add_tensor(w, "tok.weight.lora_a", FERRY_DTYPE_F32, 2, sa);
    if (!rc)
        rc = ferry_writer_add_tensor(w, "tok.weight.lora_b", FERRY_DTYPE_F32, 2, sb);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    float v[128];
    for (int i = 0; i < 128; i++)
        v[i] = fixture_value(99, (uint64_t)i);
    if (!rc)
        rc = ferry_writer_write(w, v, sizeof v);
    if (!rc)
        rc = ferry_writer_write(w, v, 64 * sizeof(float));
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "write_lora: %s\n", ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

/* Slices take no merged adapter: refused while one is merged into their tensor, fine in runtime
 * mode and once the adapter is gone. */
static void test_lora_refused(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_tensor *t = find(f, "tok.weight"), *s = NULL, *s2 = NULL;
    CHECK_EQ_INT(ferry_slice(f, t, 0, 4, &s), 0); /* made before the adapter */
    int id = -1;
    CHECK_EQ_INT(ferry_lora_add(f, g_lora, 1.0f, NULL, &id), 0);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), FERRY_EUNSUPPORTED);
    CHECK(strstr(ferry_errmsg(f), "tok.weight[0:4]") != NULL);
    CHECK(strstr(ferry_errmsg(f), "LoRA") != NULL);
    CHECK_EQ_INT(ferry_slice(f, t, 4, 4, &s2), FERRY_EUNSUPPORTED);
    CHECK(s2 == NULL);
    /* other tensors' slices are untouched */
    CHECK(check_slice(f, find(f, "blk.0.ffn_up_exps.f32"), 1, 1));
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_RUNTIME), 0);
    CHECK(check_slice(f, t, 0, 4));
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_MERGE), 0);
    CHECK_EQ_INT(ferry_prepare(f, &s, 1), FERRY_EUNSUPPORTED);
    CHECK_EQ_INT(ferry_lora_remove(f, id), 0);
    CHECK(check_slice(f, t, 0, 4));
    ferry_destroy(f);
}

/* The dry run with `experts` set: one row per expert slice of each tensor with 2 or more dims. */
static void test_plan_per_expert(void)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy pe = {.home = FERRY_HOME_DISK, .compute_device = dev, .experts = 1};
    ferry_policy pd = {.home = FERRY_HOME_HOST, .compute_device = dev};
    CHECK_EQ_INT(ferry_group_add(f, "exps", "*_exps.*", &pe), 0);
    CHECK_EQ_INT(ferry_group_add(f, "rest", "*", &pd), 0);
    ferry_placement *pl = NULL;
    size_t n = 0;
    ferry_plan_totals tot;
    CHECK_EQ_INT(ferry_plan(f, &pl, &n, &tot), 0);
    size_t n_ts = sizeof slice_gguf_ts / sizeof slice_gguf_ts[0];
    CHECK_EQ_INT(n, n_ts - SLICE_N_GGUF_EXPERT_TS + SLICE_N_GGUF_EXPERT_TS * SLICE_EXPERTS);
    size_t k = 0;
    for (size_t i = 0; i < SLICE_N_GGUF_EXPERT_TS && pl; i++) {
        ferry_tensor *t = find(f, slice_gguf_ts[i].name);
        uint64_t off, bytes;
        slice_range_of(t, 0, 1, &off, &bytes);
        for (uint64_t e = 0; e < SLICE_EXPERTS; e++, k++) {
            char want[256];
            snprintf(want, sizeof want, "%s[%llu:%llu]", slice_gguf_ts[i].name,
                     (unsigned long long)e, (unsigned long long)e + 1);
            CHECK_STR(pl[k].name, want);
            CHECK_STR(pl[k].group, "exps");
            CHECK_EQ_INT(pl[k].home, FERRY_HOME_DISK);
            CHECK_EQ_INT(pl[k].compute_device, dev);
            CHECK(pl[k].compute_bytes >= bytes && pl[k].compute_bytes < bytes + 256);
        }
    }
    CHECK_STR(pl[k].name, "vec.f32");
    free(pl);
    /* the check needs room for one expert beside what is kept, not for a whole tensor */
    ferry_tensor *big = find(f, "blk.1.ffn_down_exps.big");
    uint64_t off, bytes;
    slice_range_of(big, 0, 1, &off, &bytes);
    CHECK_EQ_INT(ferry_set_budget(f, dev, 2 * bytes), 0);
    CHECK_EQ_INT(ferry_plan_check(f), 0);
    /* a slice the plan listed is the handle ferry_slice gives */
    ferry_tensor *s = NULL;
    CHECK_EQ_INT(ferry_slice(f, big, 2, 1, &s), 0);
    CHECK(check_slice(f, big, 2, 1));
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("slice");
    snprintf(g_gguf, sizeof g_gguf, "%s/exps.gguf", dir);
    snprintf(g_st, sizeof g_st, "%s/exps.safetensors", dir);
    snprintf(g_lora, sizeof g_lora, "%s/lora.gguf", dir);
    if (fixture_write(g_gguf, FERRY_FORMAT_GGUF, slice_gguf_ts,
                    sizeof slice_gguf_ts / sizeof slice_gguf_ts[0]) ||
        fixture_write(g_st, FERRY_FORMAT_SAFETENSORS, slice_st_ts,
                    sizeof slice_st_ts / sizeof slice_st_ts[0]) ||
        write_lora(g_lora))
        return 2;
    test_bytes_every_mode();
    test_same_handle();
    test_with_parent();
    test_budget_streams_experts(NULL);
    test_budget_streams_experts("sim:64MiB");
    test_prefetch();
    test_stats();
    test_convert();
    test_device_fault();
    test_errors();
    test_split_parent();
    test_group_remove();
    test_lora_refused();
    test_plan_per_expert();
    check_rmdir(dir);
    return check_finish();
}
