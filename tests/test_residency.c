/*
 * test_residency.c — the manager end to end on cpu and sim: bytes delivered for every home x load
 * mode x device, reference counts and pointer stability, zero-copy, lazy tensors, expectations and
 * validation, ignore/optional, prefixes, groups, budgets and eviction, fault injection, conversion,
 * row gather, and the dry run against the real placement.
 */
#include "check.h"
#include "core/core.h"
#include "devices/devices.h"
#include "model_fixture.h"

static char g_gguf[1200], g_st[1200];
static fixture_tensor g_ts[64];
static size_t g_n;

/* Bytes of the prepared tensor T (on any device) into a fresh host buffer. */
static void *fetch(ferry *f, ferry_tensor *t)
{
    void *p = ferry_tensor_data(t);
    uint64_t n = ferry_tensor_nbytes(t);
    if (!p)
        return NULL;
    void *out = malloc(n ? n : 1);
    ferry_device *d = f->devs[t->comp.dev].d;
    if (f->devs[t->comp.dev].p.host_accessible)
        memcpy(out, p, n);
    else if (ferry__device_read(d, out, p, n) != 0)
        return free(out), NULL;
    return out;
}

static int same_as_file(ferry *f, ferry_tensor *t)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    void *want = fixture_pread(info.file, info.offset, info.nbytes);
    void *got = fetch(f, t);
    int ok = want && got && ferry_tensor_nbytes(t) == info.nbytes &&
             memcmp(want, got, info.nbytes) == 0;
    free(want), free(got);
    return ok;
}

static void test_every_mode(const char *path, const char *dev_spec)
{
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    static const ferry_load loads[] = {FERRY_LOAD_AUTO, FERRY_LOAD_MMAP, FERRY_LOAD_READ,
                                       FERRY_LOAD_DIRECT};
    for (size_t h = 0; h < 3; h++) {
        for (size_t l = 0; l < 4; l++) {
            ferry *f = ferry_create(NULL);
            int dev = 0;
            CHECK(f != NULL);
            if (strcmp(dev_spec, "cpu") != 0)
                CHECK_EQ_INT(ferry_add_device(f, dev_spec, &dev), 0);
            ferry_policy p = {.home = homes[h], .compute_device = dev, .load = loads[l]};
            size_t n;
            ferry_tensor **ts = fixture_open_all(f, path, &p, &n);
            CHECK(ts != NULL);
            CHECK_EQ_INT(n, g_n);
            for (int pass = 0; pass < 2; pass++) {
                int rc = ferry_prepare(f, ts, n);
                if (rc)
                    fprintf(stderr, "prepare %s home %d load %d: %s\n", dev_spec, (int)homes[h],
                            (int)loads[l], ferry_errmsg(f));
                CHECK_EQ_INT(rc, 0);
                int ok = 1;
                for (size_t i = 0; i < n && !rc; i++)
                    ok &= same_as_file(f, ts[i]);
                if (!ok)
                    fprintf(stderr, "bytes differ: %s home %d load %d\n", dev_spec,
                            (int)homes[h], (int)loads[l]);
                CHECK(ok);
                CHECK_EQ_INT(ferry_release(f, ts, n), 0);
            }
            ferry_stats st;
            ferry_get_stats(f, &st);
            CHECK_EQ_INT(st.prepares, 2 * n);
            free(ts);
            ferry_destroy(f);
        }
    }
}

static void test_refcount_and_zero_copy(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_MMAP};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, "blk.0.attn_q.weight");
    CHECK(t != NULL);
    CHECK(ferry_tensor_data(t) == NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    void *p1 = ferry_tensor_data(t);
    /* zero-copy: the pointer is inside the file mapping and nothing was allocated */
    const ferry__iofile *file = t->file;
    CHECK((unsigned char *)p1 >= file->map && (unsigned char *)p1 < file->map + file->size);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    CHECK(ferry_tensor_data(t) == p1);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    CHECK(ferry_tensor_data(t) == NULL);
    CHECK_EQ_INT(ferry_release(f, &t, 1), FERRY_EINVAL); /* not prepared */
    ferry_destroy(f);

    /* load=read: one copy in host RAM, counted */
    f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    p.load = FERRY_LOAD_READ;
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    t = ferry_find(f, "blk.0.attn_q.weight");
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    p1 = ferry_tensor_data(t);
    CHECK((unsigned char *)p1 < t->file->map || (unsigned char *)p1 >= t->file->map + t->file->size);
    ferry_get_stats(f, &st);
    CHECK(st.resident_bytes[0] >= t->info.nbytes);
    CHECK(same_as_file(f, t));
    ferry_release(f, &t, 1);
    ferry_destroy(f);
}

static void test_expectations(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    const ferry_tensor_info *ti = NULL;
    ferry_tensor *q = ferry_find(f, "blk.0.attn_q.weight");
    ferry_tensor_info info;
    ferry_tensor_get_info(q, &info);
    ti = &info;
    int64_t good[2] = {ti->shape[0], ti->shape[1]}, bad[2] = {ti->shape[0], ti->shape[1] + 1};
    CHECK_EQ_INT(ferry_expect(f, "blk.0.attn_q.weight", ti->dtype, 2, good), 0);
    CHECK_EQ_INT(ferry_validate(f), 0);
    CHECK_EQ_INT(ferry_expect(f, "blk.0.attn_q.weight", ti->dtype, 2, bad), 0);
    CHECK_EQ_INT(ferry_expect(f, "blk.1.attn_k.weight", FERRY_DTYPE_Q4_K, 0, NULL), 0);
    CHECK_EQ_INT(ferry_expect(f, "blk.9.missing.weight", FERRY_DTYPE_NONE, 0, NULL), 0);
    CHECK_EQ_INT(ferry_expect(f, "opt.missing", FERRY_DTYPE_NONE, 0, NULL), 0);
    CHECK_EQ_INT(ferry_optional(f, "opt.*"), 0);
    int rc = ferry_validate(f);
    const char *msg = ferry_errmsg(f);
    CHECK(rc != 0);
    /* every problem at once, each naming file, tensor, expected and found */
    CHECK(strstr(msg, "blk.0.attn_q.weight") && strstr(msg, "expected shape"));
    CHECK(strstr(msg, "blk.1.attn_k.weight") && strstr(msg, "expected dtype q4_k"));
    CHECK(strstr(msg, "blk.9.missing.weight") != NULL);
    CHECK(strstr(msg, "opt.missing") == NULL);
    CHECK(strstr(msg, g_gguf) != NULL);
    /* prepare refuses a tensor that does not meet its expectation */
    CHECK_EQ_INT(ferry_prepare(f, &q, 1), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_expect(f, "blk.0.attn_q.weight", ti->dtype, 2, good), 0);
    CHECK_EQ_INT(ferry_prepare(f, &q, 1), 0);
    ferry_release(f, &q, 1);
    /* ignore: not found, not required */
    CHECK_EQ_INT(ferry_ignore(f, "blk.9.*"), 0);
    ferry_expect(f, "blk.1.attn_k.weight", FERRY_DTYPE_NONE, 0, NULL);
    CHECK_EQ_INT(ferry_validate(f), 0);
    ferry_destroy(f);

    f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_ignore(f, "blk.1.*"), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK(ferry_find(f, "blk.1.attn_q.weight") == NULL);
    CHECK(ferry_find(f, "blk.0.attn_q.weight") != NULL);
    CHECK(ferry_find(f, "nope") == NULL);
    ferry_destroy(f);
}

static void test_prefix_and_groups(void)
{
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), FERRY_EDUP); /* same names again */
    CHECK(strstr(ferry_errmsg(f), g_gguf) != NULL);
    CHECK_EQ_INT(ferry_open(f, g_st, "high_noise."), 0); /* side by side */
    CHECK(ferry_find(f, "high_noise.blk.0.attn_q.weight") != NULL);
    CHECK(ferry_find(f, "blk.0.attn_q.weight") != NULL);

    ferry_policy disk = {.home = FERRY_HOME_DISK};
    CHECK_EQ_INT(ferry_group_add(f, "hn", "high_noise.*", &disk), 0);
    ferry_tensor *t = ferry_find(f, "high_noise.blk.0.ffn_up.weight");
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(same_as_file(f, t));
    /* an earlier rule keeps its tensors: a later one changes nothing */
    CHECK_EQ_INT(ferry_group_add(f, "other", "high_noise.blk.0.*", NULL), 0);
    /* the tensor is loaded: ignoring it now is refused */
    CHECK_EQ_INT(ferry_ignore(f, "high_noise.blk.0.ffn_up*"), FERRY_EBUSY);
    CHECK_EQ_INT(ferry_group_remove(f, "hn"), FERRY_EBUSY);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_group_remove(f, "hn"), 0);
    CHECK(ferry_find(f, "high_noise.blk.0.ffn_up.weight") == NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), FERRY_ENOENT); /* dead handle refused */
    CHECK_EQ_INT(ferry_group_remove(f, "hn"), FERRY_ENOENT);
    ferry_destroy(f);
}

/* policy.lock on a zero-copy tensor: the mapping is locked by the load, before the prepare (or
 * the group load) returns, on the host and as the home copy of a tensor computed on a device; a
 * refusal (RLIMIT_MEMLOCK) is counted, not an error. */
static void test_lock_zero_copy(const char *dev_spec)
{
    ferry *f = ferry_create(NULL);
    int dev = 0;
    if (strcmp(dev_spec, "cpu") != 0)
        CHECK_EQ_INT(ferry_add_device(f, dev_spec, &dev), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.lock = 1, .compute_device = dev, .load = FERRY_LOAD_MMAP,
                      .home = FERRY_HOME_HOST};
    CHECK_EQ_INT(ferry_group_add(f, "out", "output.weight", &p), 0);
    ferry_tensor *t = ferry_find(f, "output.weight");
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.locked_bytes == info.nbytes || (st.locked_bytes == 0 && st.lock_failures == 1));
    if (!dev)
        CHECK(ferry_tensor_data(t) == (void *)(t->file->map + info.offset));
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    CHECK_EQ_INT(ferry_load_group(f, "out"), 0); /* already home: nothing locked twice */
    ferry_stats again;
    ferry_get_stats(f, &again);
    CHECK_EQ_INT(again.locked_bytes, st.locked_bytes);
    CHECK_EQ_INT(again.lock_failures, st.lock_failures);
    ferry_destroy(f);
}

/* The VmFlags of the mapping that holds P, from /proc/self/smaps, into OUT; 0 when found. */
static int vma_flags(const void *p, char *out, size_t n)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp)
        return -1;
    char line[512];
    int inside = 0, found = -1;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "VmFlags:", 8)) {
            snprintf(out, n, "%.*s", (int)(n - 1), line + 8);
            found = 0;
            break;
        }
    }
    fclose(fp);
    return found;
}

static void test_lazy(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_tensor *emb = ferry_find(f, "token_embd.weight");
    ferry_tensor_info info;
    ferry_tensor_get_info(emb, &info);
    /* auto: lazy when at least the threshold, whatever the load mode and device */
    ferry_policy p = {.lazy = FERRY_LAZY_AUTO, .lazy_threshold = info.nbytes, .lock = 1,
                      .compute_device = sim, .load = FERRY_LOAD_DIRECT};
    CHECK_EQ_INT(ferry_group_add(f, "emb", "token_embd.*", &p), 0);
    p.lazy_threshold = info.nbytes + 1;
    CHECK_EQ_INT(ferry_group_add(f, "out", "output.weight", &p), 0);
    ferry_placement *pl;
    size_t n;
    CHECK_EQ_INT(ferry_plan(f, &pl, &n, NULL), 0);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(pl[i].name, "token_embd.weight"))
            CHECK(pl[i].lazy == 1);
        if (!strcmp(pl[i].name, "output.weight"))
            CHECK(pl[i].lazy == 0); /* same size, threshold one byte higher */
    }
    free(pl);
    CHECK_EQ_INT(ferry_prepare(f, &emb, 1), 0);
    unsigned char *d = ferry_tensor_data(emb);
    /* lazy stays on the host behind the mapping even with a sim compute device, never locked */
    CHECK(d == emb->file->map + info.offset);
    /* not advised random: a product over the whole tensor faults it in with the kernel's
     * read-around, not one page per fault ("rr" is MADV_RANDOM's flag) */
    char flags[512];
    if (vma_flags(d, flags, sizeof flags) == 0)
        CHECK(strstr(flags, " rr") == NULL);
    else
        fprintf(stderr, "note: /proc/self/smaps unreadable; lazy advice not checked\n");
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK_EQ_INT(st.locked_bytes, 0);
    CHECK_EQ_INT(st.resident_bytes[sim], 0);
    /* row gather: explicit reads of the requested rows, coalesced */
    uint64_t rows[] = {7, 3, 4, 5, 99, 3, 0};
    uint64_t rb = info.nbytes / info.n_rows;
    unsigned char *buf = malloc(rb * 7);
    CHECK_EQ_INT(ferry_read_rows(f, emb, rows, 7, buf), 0);
    int ok = 1;
    for (int i = 0; i < 7; i++)
        ok &= memcmp(buf + i * rb, d + rows[i] * rb, rb) == 0;
    CHECK(ok);
    uint64_t bad_row = info.n_rows;
    CHECK_EQ_INT(ferry_read_rows(f, emb, &bad_row, 1, buf), FERRY_EINVAL);
    free(buf);
    ferry_release(f, &emb, 1);
    ferry_destroy(f);
}

static char g_big[1200];

static void test_budget_and_eviction(void)
{
    /* home disk, host budget of half the model: passes after the first read about M - B + W */
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_big, &p, &n);
    CHECK(ts != NULL);
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    uint64_t budget = model / 2;
    CHECK_EQ_INT(ferry_set_budget(f, 0, budget), 0);
    uint64_t read_before = 0;
    uint64_t per_pass[6];
    for (int pass = 0; pass < 6; pass++) {
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
            CHECK(same_as_file(f, ts[i]));
            ferry_release(f, &ts[i], 1);
        }
        ferry_stats st;
        ferry_get_stats(f, &st);
        per_pass[pass] = st.bytes_read - read_before;
        read_before = st.bytes_read;
        CHECK(st.peak_bytes[0] <= budget);
    }
    CHECK(per_pass[0] >= model);
    /* eviction on the recorded order: M - B + W, W = the tensor in use + the one prefetched (and
     * the page of headroom each buffer has for direct I/O) */
    uint64_t w = 2 * 139264 + n * 8192;
    /* The second pass reads its own first tensors on demand (no schedule during the first pass,
     * so nothing was fetched ahead for it) and already fetches the third pass's: up to two
     * windows more than a pass in the steady state. */
    CHECK(per_pass[1] <= model - budget + w + 4 * 139264);
    for (int pass = 2; pass < 6; pass++)
        CHECK(per_pass[pass] <= model - budget + w);
    fprintf(stderr, "budget M/2: bytes per pass %llu %llu %llu %llu %llu %llu of M=%llu\n",
            (unsigned long long)per_pass[0], (unsigned long long)per_pass[1],
            (unsigned long long)per_pass[2], (unsigned long long)per_pass[3],
            (unsigned long long)per_pass[4], (unsigned long long)per_pass[5],
            (unsigned long long)model);

    /* a set that cannot fit even after evicting everything: a clear error, manager usable */
    CHECK_EQ_INT(ferry_set_budget(f, 0, 64 * 1024), 0);
    int rc = ferry_prepare(f, ts, n);
    CHECK_EQ_INT(rc, FERRY_EBUDGET);
    CHECK(strstr(ferry_errmsg(f), "budget") != NULL);
    for (size_t i = 0; i < n; i++)
        CHECK(ferry_tensor_data(ts[i]) == NULL);
    CHECK_EQ_INT(ferry_set_budget(f, 0, 0), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    ferry_release_all(f);
    free(ts);
    ferry_destroy(f);
}

static void test_sim_faults(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    ferry_policy p = {.home = FERRY_HOME_HOST, .compute_device = sim, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_gguf, &p, &n);
    CHECK(ts != NULL);
    ferry_device *d = f->devs[sim].d;
    int failures = 0;
    for (uint64_t k = 1; k <= n + 2; k++) {
        /* fail the k-th allocation, then the k-th copy */
        for (int which = 0; which < 2; which++) {
            ferry_release_all(f);
            ferry_set_budget(f, sim, 1); /* evict everything */
            ferry_set_budget(f, sim, 0);
            ferry__sim_set_faults(d, which == 0 ? k : 0, which == 1 ? k : 0);
            int rc = ferry_prepare(f, ts, n);
            if (rc) {
                failures++;
                CHECK(rc == FERRY_ENOMEM || rc == FERRY_EDEVICE);
                CHECK(ferry_errmsg(f)[0] != 0);
                for (size_t i = 0; i < n; i++)
                    CHECK(ferry_tensor_data(ts[i]) == NULL);
            }
            ferry__sim_set_faults(d, 0, 0);
            /* the next prepare works and delivers the right bytes */
            CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= same_as_file(f, ts[i]);
            CHECK(ok);
            ferry_release(f, ts, n);
        }
    }
    CHECK(failures >= (int)n);
    /* every refused prepare came from an injected fault */
    ferry__sim_stats ss;
    ferry__sim_get_stats(d, &ss);
    CHECK(ss.alloc_failures + ss.copy_failures >= (uint64_t)failures);
    free(ts);
    ferry_destroy(f);
}

static void test_sim_budget(void)
{
    /* a device budget of a third of the model: streamed layer by layer, never exceeded */
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB@4GB/s", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    ferry_policy p = {.home = FERRY_HOME_HOST, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    CHECK_EQ_INT(ferry_set_budget(f, sim, model / 3), 0);
    size_t n;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
            CHECK(same_as_file(f, ts[i]));
            ferry_release(f, &ts[i], 1);
        }
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.peak_bytes[sim] <= model / 3);
    CHECK(st.evictions > 0);
    ferry__sim_stats ss;
    ferry__sim_get_stats(f->devs[sim].d, &ss);
    CHECK(ss.peak_used <= model / 3 + 256 * n);
    free(ts);
    ferry_destroy(f);
}

static void test_conversion(void)
{
    for (int devk = 0; devk < 2; devk++) {
        ferry *f = ferry_create(NULL);
        int dev = 0;
        if (devk)
            CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
        CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
        ferry_policy p = {.home = FERRY_HOME_HOST, .compute_device = dev, .convert = 1,
                          .compute_dtype = FERRY_DTYPE_F32};
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        size_t n;
        ferry_tensor **ts = fixture_all_tensors(f, &n);
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(ts[i], &info);
            CHECK_EQ_INT(ferry_tensor_dtype(ts[i]), FERRY_DTYPE_F32);
            CHECK_EQ_INT(ferry_tensor_nbytes(ts[i]), info.n_elems * 4);
            void *raw = fixture_pread(info.file, info.offset, info.nbytes);
            float *want = malloc(info.n_elems * 4);
            ferry_dtype_convert(info.dtype, raw, FERRY_DTYPE_F32, want, info.n_elems);
            float *got = fetch(f, ts[i]);
            ok &= got && memcmp(got, want, info.n_elems * 4) == 0;
            free(raw), free(want), free(got);
        }
        CHECK(ok);
        /* the home copy is pristine: the file's bytes, in the file's dtype */
        for (size_t i = 0; i < n && devk; i++) {
            const ferry_tensor_info *in = &ts[i]->info;
            void *raw = fixture_pread(in->file, in->offset, in->nbytes);
            CHECK(ts[i]->host.ptr && raw && memcmp(ts[i]->host.ptr, raw, in->nbytes) == 0);
            free(raw);
        }
        ferry_release(f, ts, n);
        free(ts);
        ferry_destroy(f);
    }
}

static void test_dry_run(const char *dev_spec)
{
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    for (int h = 0; h < 3; h++)
        for (int conv = 0; conv < 2; conv++) {
            ferry *f = ferry_create(NULL);
            int dev = 0;
            if (strcmp(dev_spec, "cpu"))
                ferry_add_device(f, dev_spec, &dev);
            CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
            ferry_policy p = {.home = homes[h], .compute_device = dev,
                              .load = conv ? FERRY_LOAD_READ : FERRY_LOAD_AUTO, .convert = conv,
                              .compute_dtype = FERRY_DTYPE_F16};
            CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
            ferry_plan_totals tot;
            CHECK_EQ_INT(ferry_plan(f, NULL, NULL, &tot), 0);
            ferry_stats st0;
            ferry_get_stats(f, &st0);
            CHECK_EQ_INT(st0.bytes_read, 0); /* no I/O in the dry run */
            CHECK_EQ_INT(st0.resident_bytes[0], 0);
            CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
            size_t n;
            ferry_tensor **ts = fixture_all_tensors(f, &n);
            CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
            ferry_stats st;
            ferry_get_stats(f, &st);
            CHECK_EQ_INT(st.resident_bytes[0], tot.host_bytes + tot.staged_bytes[0]);
            if (dev)
                CHECK_EQ_INT(st.resident_bytes[dev], tot.device_bytes[dev] + tot.staged_bytes[dev]);
            ferry_release(f, ts, n);
            free(ts);
            ferry_destroy(f);
        }
}

static void test_split(void)
{
    ferry *f = ferry_create(NULL);
    int a, b;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &a), 0);
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB@4GB/s", &b), 0);
    CHECK_EQ_INT(ferry_open(f, g_gguf, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .n_split = 2,
                      .split_devices = {a, b}, .split_weights = {1, 3}};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    size_t n;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    for (int pass = 0; pass < 2; pass++) {
        CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
        int ok = 1;
        for (size_t i = 0; i < n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(ts[i], &info);
            int parts = ferry_tensor_part_count(ts[i]);
            if (info.ndim == 2) {
                CHECK_EQ_INT(parts, 2);
                ferry_tensor_part p0, p1;
                CHECK_EQ_INT(ferry_tensor_get_part(ts[i], 0, &p0), 0);
                CHECK_EQ_INT(ferry_tensor_get_part(ts[i], 1, &p1), 0);
                /* contiguous blocks of whole rows, a quarter on the first device */
                CHECK_EQ_INT(p0.row0, 0);
                CHECK_EQ_INT(p1.row0, p0.n_rows);
                CHECK_EQ_INT(p0.n_rows + p1.n_rows, info.n_rows);
                CHECK(p0.n_rows * 4 >= info.n_rows - 2 && p0.n_rows * 4 <= info.n_rows + 2);
                CHECK_EQ_INT(p0.device, a);
                CHECK_EQ_INT(p1.device, b);
                CHECK(p0.data != NULL && p1.data != NULL);
                CHECK_EQ_INT(p0.nbytes + p1.nbytes, info.nbytes);
                CHECK(ferry_tensor_data(ts[i]) == NULL); /* split: use the parts */
            } else {
                CHECK_EQ_INT(parts, 1);
            }
            /* every block's bytes equal the file's */
            void *want = fixture_pread(info.file, info.offset, info.nbytes);
            void *got = malloc(info.nbytes);
            ok &= want && got && ferry_tensor_read(f, ts[i], 0, info.nbytes, got) == 0 &&
                  memcmp(want, got, info.nbytes) == 0;
            free(want), free(got);
        }
        CHECK(ok);
        CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    }
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.peak_bytes[a] > 0 && st.peak_bytes[b] > 2 * st.peak_bytes[a]);
    /* the dry run lists the parts and agrees with the real placement */
    ferry_plan_totals tot;
    size_t np;
    ferry_placement *pl;
    CHECK_EQ_INT(ferry_plan(f, &pl, &np, &tot), 0);
    CHECK(np > n);
    free(pl);
    CHECK_EQ_INT(st.resident_bytes[a], tot.staged_bytes[a]);
    CHECK_EQ_INT(st.resident_bytes[b], tot.staged_bytes[b]);
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *dir = check_tmpdir("residency");
    snprintf(g_gguf, sizeof g_gguf, "%s/model.gguf", dir);
    snprintf(g_st, sizeof g_st, "%s/model.safetensors", dir);
    snprintf(g_big, sizeof g_big, "%s/big.gguf", dir);
    fixture_tensor big[64];
    size_t big_n = fixture_layout(big, 8, 256, 512, 256, FERRY_DTYPE_Q8_0, 0);
    if (fixture_write(g_big, FERRY_FORMAT_GGUF, big, big_n))
        return 2;
    g_n = fixture_layout(g_ts, 3, 64, 128, 100, FERRY_DTYPE_Q8_0, 0);
    if (fixture_write(g_gguf, FERRY_FORMAT_GGUF, g_ts, g_n))
        return 2;
    fixture_tensor st_ts[64];
    size_t st_n = fixture_layout(st_ts, 3, 64, 128, 100, FERRY_DTYPE_F16, 1);
    if (fixture_write(g_st, FERRY_FORMAT_SAFETENSORS, st_ts, st_n))
        return 2;

    test_every_mode(g_gguf, "cpu");
    test_every_mode(g_gguf, "sim:64MiB");
    test_every_mode(g_st, "cpu");
    test_every_mode(g_st, "sim:64MiB@8GB/s");
    test_refcount_and_zero_copy();
    test_expectations();
    test_prefix_and_groups();
    test_lazy();
    test_lock_zero_copy("cpu");
    test_lock_zero_copy("sim:64MiB");
    test_budget_and_eviction();
    test_sim_faults();
    test_sim_budget();
    test_conversion();
    test_dry_run("cpu");
    test_dry_run("sim:64MiB");
    test_split();
    check_rmdir(dir);
    return check_finish();
}
