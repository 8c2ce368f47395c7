/*
 * test_memory_accounting.c — memory accounting and error paths of the
 * manager — what stays resident after a failed prepare, after the host budget is lifted, after
 * every cached copy is evicted; fault injection (allocation and copy) across conversion, split
 * and merge with no leak and the right bytes afterwards; the message of a copy that fails in the
 * middle of a multi-chunk transfer and of a prepare that waited on a failed prefetch; a lazy
 * tensor's part description; ferry_read_rows edge cases; close with work queued.
 */
#include <math.h>

#include "check.h"
#include "core/core.h"
#include "devices/devices.h"
#include "model_fixture.h"

static char g_model[1200], g_huge[1200], g_slow[1200], g_three[1200];
static fixture_tensor g_ts[64];
static size_t g_n;

static uint64_t resident(ferry *f, int dev)
{
    ferry_stats st;
    ferry_get_stats(f, &st);
    return st.resident_bytes[dev];
}

/* The prepared bytes of T equal the file's (no conversion). */
/* ---- what stays resident ---------------------------------------------------------------------- */

/* Under the default host budget a home-disk copy on the host stays cached after its last release.
 * A prepare that fails must leave no more: nothing of the set held, at most that cached. */
static void test_failed_prepare_keeps_nothing(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
    ferry_policy host = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    ferry_policy dev = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "h", "blk.0.*", &host), 0);
    CHECK_EQ_INT(ferry_group_add(f, "d", "blk.1.*", &dev), 0);
    ferry_tensor *set[2] = {ferry_find(f, "blk.0.ffn_up.weight"),
                            ferry_find(f, "blk.1.ffn_up.weight")};
    /* the reference: prepare and release hold nothing on the host, and keep what is cached */
    CHECK_EQ_INT(ferry_prepare(f, set, 2), 0);
    CHECK_EQ_INT(ferry_release(f, set, 2), 0);
    uint64_t kept = resident(f, 0);
    ferry_set_budget(f, 0, 1);
    ferry_set_budget(f, 0, 0);
    CHECK_EQ_INT(resident(f, 0), 0);
    /* the same set, the device allocation failing */
    ferry_set_budget(f, sim, 1);
    ferry_set_budget(f, sim, 0);
    ferry__sim_set_faults(f->devs[sim].d, 1, 0);
    CHECK_EQ_INT(ferry_prepare(f, set, 2), FERRY_ENOMEM);
    ferry__sim_set_faults(f->devs[sim].d, 0, 0);
    CHECK(ferry_tensor_data(set[0]) == NULL);
    /* let any job of the failed prepare finish */
    pthread_mutex_lock(&f->lock);
    while (f->jobs.queue_head || f->jobs.running)
        pthread_cond_wait(&f->cond, &f->lock);
    pthread_mutex_unlock(&f->lock);
    uint64_t r = resident(f, 0);
    if (r > kept)
        fprintf(stderr, "failed prepare: %llu bytes stay on the host, %llu after a success\n",
                (unsigned long long)r, (unsigned long long)kept);
    CHECK(r <= kept);
    ferry_destroy(f);
}

/* A host budget, then the default: cached home-disk copies and pooled buffers were kept because
 * of the budget; with the budget lifted the pool goes and the cached copies stay (and `used` is
 * what ferry holds). */
static void test_budget_lifted(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    CHECK_EQ_INT(ferry_set_budget(f, 0, model / 2), 0);
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
            ferry_release(f, &ts[i], 1);
        }
    CHECK(resident(f, 0) > 0);
    CHECK(resident(f, 0) <= model / 2);
    /* evict everything: nothing held */
    CHECK_EQ_INT(ferry_set_budget(f, 0, 1), 0);
    CHECK_EQ_INT(resident(f, 0), 0);
    /* stream again under the budget, then lift it */
    CHECK_EQ_INT(ferry_set_budget(f, 0, model / 2), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
        ferry_release(f, &ts[i], 1);
    }
    CHECK_EQ_INT(ferry_set_budget(f, 0, 0), 0);
    CHECK_EQ_INT(ferry_release_all(f), 0);
    uint64_t r = resident(f, 0);
    pthread_mutex_lock(&f->lock);
    uint64_t pooled = f->devs[0].pooled;
    pthread_mutex_unlock(&f->lock);
    if (pooled)
        fprintf(stderr, "host budget lifted: %llu bytes still held (%llu of them pooled)\n",
                (unsigned long long)r, (unsigned long long)pooled);
    CHECK_EQ_INT(pooled, 0);
    CHECK(r > 0 && r <= model / 2);
    free(ts);
    ferry_destroy(f);
}

/* Every home and device: after release_all and a budget of one byte, only home copies remain,
 * and exactly as many bytes as the dry run says they take. */
static void test_used_back_to_homes(void)
{
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    for (int h = 0; h < 3; h++) {
        ferry *f = ferry_create(NULL);
        int sim;
        CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
        CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
        ferry_policy p = {.home = homes[h], .load = FERRY_LOAD_READ, .compute_device = sim,
                          .convert = 1, .compute_dtype = FERRY_DTYPE_F16};
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        size_t n;
        ferry_tensor **ts = fixture_all_tensors(f, &n);
        for (int k = 0; k < 2; k++) {
            CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
            CHECK_EQ_INT(ferry_prepare(f, ts, n / 2), 0); /* some twice */
            CHECK_EQ_INT(ferry_release(f, ts, n), 0);
            CHECK_EQ_INT(ferry_release(f, ts, n / 2), 0);
        }
        CHECK_EQ_INT(ferry_release(f, ts, 1), FERRY_EINVAL);
        ferry_set_budget(f, sim, 1);
        ferry_plan_totals tot;
        CHECK_EQ_INT(ferry_plan(f, NULL, NULL, &tot), 0);
        CHECK_EQ_INT(resident(f, sim), tot.device_bytes[sim]);
        CHECK_EQ_INT(resident(f, 0), tot.host_bytes);
        ferry__sim_stats ss;
        ferry__sim_get_stats(f->devs[sim].d, &ss);
        CHECK_EQ_INT(ss.used, tot.device_bytes[sim]);
        free(ts);
        ferry_destroy(f);
    }
}

/* ferry_set_budget(dev, 0) means "what the device reports free, minus a margin". What ferry itself
 * holds there is not free, so the default computed while ferry holds memory comes out smaller by
 * that much, and the held bytes then count against it a second time. */
static void test_default_budget_while_holding(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:4MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_three, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DEVICE, .load = FERRY_LOAD_READ, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t[3] = {ferry_find(f, "t.0"), ferry_find(f, "t.1"), ferry_find(f, "t.2")};
    CHECK_EQ_INT(ferry_prepare(f, t, 2), 0); /* 2 MiB held on the 4 MiB device, kept (home) */
    ferry_release(f, t, 2);
    ferry_device_info di;
    ferry_get_device_info(f, sim, &di);
    uint64_t before = di.budget;
    CHECK_EQ_INT(ferry_set_budget(f, sim, 0), 0); /* back to the default */
    ferry_get_device_info(f, sim, &di);
    if (di.budget != before)
        fprintf(stderr, "default budget: %llu at creation, %llu when reset while holding %llu\n",
                (unsigned long long)before, (unsigned long long)di.budget,
                (unsigned long long)di.used_bytes);
    CHECK_EQ_INT(di.budget, before);
    /* the third MiB fits on the device */
    CHECK_EQ_INT(ferry_prepare(f, &t[2], 1), 0);
    ferry_release(f, &t[2], 1);
    ferry_destroy(f);
}

/* ---- fault injection across conversion and split ---------------------------------------------- */

static void test_faults_split_convert(void)
{
    ferry *f = ferry_create(NULL);
    int a, b;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &a), 0);
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &b), 0);
    CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ, .n_split = 2,
                      .split_devices = {a, b}, .convert = 1, .compute_dtype = FERRY_DTYPE_F32};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    size_t n;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    /* reference: every tensor's f32 bytes */
    float **want = calloc(n, sizeof *want);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = ferry_tensor_nbytes(ts[i]);
        want[i] = malloc(nb);
        CHECK_EQ_INT(ferry_tensor_read(f, ts[i], 0, nb, want[i]), 0);
    }
    ferry_release(f, ts, n);
    int failures = 0;
    for (uint64_t k = 1; k <= 2 * n + 2; k += 3) {
        for (int which = 0; which < 4; which++) {
            ferry_device *d = f->devs[which & 1 ? b : a].d;
            ferry_set_budget(f, a, 1);
            ferry_set_budget(f, b, 1);
            ferry_set_budget(f, a, 0);
            ferry_set_budget(f, b, 0);
            CHECK_EQ_INT(resident(f, a), 0);
            CHECK_EQ_INT(resident(f, b), 0);
            ferry__sim_set_faults(d, which < 2 ? k : 0, which >= 2 ? k : 0);
            int rc = ferry_prepare(f, ts, n);
            ferry__sim_set_faults(d, 0, 0);
            if (rc) {
                failures++;
                CHECK(rc == FERRY_ENOMEM || rc == FERRY_EDEVICE);
                for (size_t i = 0; i < n; i++)
                    CHECK_EQ_INT(ts[i]->refs, 0);
            } else {
                ferry_release(f, ts, n);
            }
            CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
            int ok = 1;
            for (size_t i = 0; i < n; i++) {
                uint64_t nb = ferry_tensor_nbytes(ts[i]);
                float *got = malloc(nb);
                ok &= ferry_tensor_read(f, ts[i], 0, nb, got) == 0 && !memcmp(got, want[i], nb);
                free(got);
            }
            CHECK(ok);
            ferry_release(f, ts, n);
        }
    }
    CHECK(failures > 0);
    for (size_t i = 0; i < n; i++)
        free(want[i]);
    free(want);
    free(ts);
    ferry_destroy(f);
}

/* ---- error messages --------------------------------------------------------------------------- */

/* A copy that fails while later chunks of the same tensor are queued (a tensor of more than two
 * 16 MiB chunks): the failure is found by the wait before reusing the slot, and that path breaks
 * out without writing the job's message — prepare returns FERRY_EDEVICE with an empty message. */
static void test_copy_failure_mid_transfer_message(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:128MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_huge, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, "huge");
    CHECK(t != NULL);
    ferry__sim_set_faults(f->devs[sim].d, 0, 1);
    int rc = ferry_prepare(f, &t, 1);
    CHECK_EQ_INT(rc, FERRY_EDEVICE);
    const char *msg = ferry_errmsg(f);
    if (!strstr(msg, "huge"))
        fprintf(stderr, "copy failure mid-transfer: message \"%s\"\n", msg);
    CHECK(strstr(msg, "huge") != NULL);
    ferry__sim_set_faults(f->devs[sim].d, 0, 0);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(fixture_same_as_file(f, t));
    ferry_release(f, &t, 1);
    ferry_destroy(f);
}

/* A prepare that finds its tensor being prefetched waits for that job. When the job fails, the
 * prepare fails with its code, but the job's message was not recorded (a prefetch failure only
 * writes the message when none is set), so the engine reads an unrelated old message. */
static void test_prepare_after_failed_prefetch(void)
{
    ferry_options o = {.io_threads = 2};
    ferry *f = ferry_create(&o);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB@2MB/s", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_slow, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    CHECK(ferry_find(f, "no.such.tensor") == NULL); /* an old message */
    ferry_tensor *s[4] = {ferry_find(f, "slow.0"), ferry_find(f, "slow.1"), ferry_find(f, "slow.2"),
                          ferry_find(f, "slow.3")};
    ferry_tensor *x = ferry_find(f, "x");
    CHECK_EQ_INT(f->jobs.n_loaders, 4);
    CHECK_EQ_INT(ferry_prefetch(f, s, 4), 0);
    /* every loader (4 once a sim device is added) holds its allocation and copies slowly */
    for (int i = 0; i < 2000; i++) {
        uint64_t allocs = 0;
        ferry__sim_counters(f->devs[sim].d, &allocs, NULL, NULL);
        if (allocs >= 4)
            break;
        usleep(500);
    }
    ferry__sim_set_faults(f->devs[sim].d, 1, 0); /* the next allocation fails: x's */
    CHECK_EQ_INT(ferry_prefetch(f, &x, 1), 0);
    pthread_mutex_lock(&f->lock);
    int queued = x->comp.state == FERRY__LOADING;
    pthread_mutex_unlock(&f->lock);
    CHECK(queued);
    int rc = ferry_prepare(f, &x, 1);
    const char *msg = ferry_errmsg(f);
    if (rc && !strstr(msg, "x"))
        fprintf(stderr, "prepare after a failed prefetch: rc %d, message \"%s\"\n", rc, msg);
    /* a prefetch is a hint: its failure should not fail the demand load; if it does, the
     * message must at least be about this tensor */
    CHECK(rc == 0 || strstr(msg, "'x'") != NULL);
    CHECK(rc == 0);
    if (!rc)
        ferry_release(f, &x, 1);
    ferry__sim_set_faults(f->devs[sim].d, 0, 0);
    ferry_destroy(f);
}

/* ---- parts, rows ------------------------------------------------------------------------------ */

/* A lazy tensor is host memory behind the mapping whatever its compute device: its part must say
 * device 0 (the data pointer is a host address), not the compute device. */
static void test_lazy_part_device(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
    ferry_policy p = {.lazy = FERRY_LAZY_ON, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "emb", "token_embd.*", &p), 0);
    ferry_tensor *t = ferry_find(f, "token_embd.weight");
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    ferry_tensor_part part;
    CHECK_EQ_INT(ferry_tensor_get_part(t, 0, &part), 0);
    CHECK(part.data == ferry_tensor_data(t));
    CHECK((unsigned char *)part.data >= t->file->map &&
          (unsigned char *)part.data < t->file->map + t->file->size);
    if (part.device != 0)
        fprintf(stderr, "lazy tensor on sim: part says device %d for a host pointer\n",
                part.device);
    CHECK_EQ_INT(part.device, 0);
    CHECK(fixture_same_as_file(f, t));
    ferry_release(f, &t, 1);
    ferry_destroy(f);
}

static void test_read_rows_edges(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
    /* converted, on a device, split: rows are still the file's bytes */
    ferry_policy p = {.compute_device = sim, .convert = 1, .compute_dtype = FERRY_DTYPE_F32,
                      .n_split = 2, .split_devices = {sim, 0}};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    CHECK_EQ_INT(ferry_ignore(f, "blk.2.*"), 0);
    ferry_tensor *t = ferry_find(f, "output.weight");
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    uint64_t rb = info.nbytes / info.n_rows;
    unsigned char *file = fixture_pread(info.file, info.offset, info.nbytes);
    unsigned char *buf = malloc(rb * 16);
    /* n = 0: nothing read, no error, DST may be NULL */
    CHECK_EQ_INT(ferry_read_rows(f, t, NULL, 0, NULL), 0);
    /* the last row, duplicates, unsorted, neighbours */
    uint64_t last = info.n_rows - 1;
    uint64_t rows[] = {last, 0, last, 1, 2, 2, 5, 4, 3, last - 1};
    size_t nr = sizeof rows / sizeof rows[0];
    CHECK_EQ_INT(ferry_read_rows(f, t, rows, nr, buf), 0);
    int ok = 1;
    for (size_t i = 0; i < nr; i++)
        ok &= memcmp(buf + i * rb, file + rows[i] * rb, rb) == 0;
    CHECK(ok);
    /* row == n_rows and beyond: refused, naming the tensor, DST untouched past what was valid */
    uint64_t bad[] = {0, info.n_rows};
    CHECK_EQ_INT(ferry_read_rows(f, t, bad, 2, buf), FERRY_EINVAL);
    CHECK(strstr(ferry_errmsg(f), "output.weight") != NULL);
    uint64_t huge = UINT64_MAX;
    CHECK_EQ_INT(ferry_read_rows(f, t, &huge, 1, buf), FERRY_EINVAL);
    /* NULL rows with n > 0 */
    CHECK_EQ_INT(ferry_read_rows(f, t, NULL, 1, buf), FERRY_EINVAL);
    /* an ignored tensor */
    CHECK(ferry_find(f, "blk.2.ffn_up.weight") == NULL);
    ferry_tensor *ign = f->tensors[ferry_catalog_find(f->cat, "blk.2.ffn_up.weight")];
    CHECK_EQ_INT(ferry_read_rows(f, ign, rows, 1, buf), FERRY_ENOENT);
    /* a 1-D tensor: one row */
    ferry_tensor *norm = ferry_find(f, "output_norm.weight");
    ferry_tensor_info ni;
    ferry_tensor_get_info(norm, &ni);
    uint64_t zero = 0, one = 1;
    CHECK_EQ_INT(ferry_read_rows(f, norm, &zero, 1, buf), 0);
    unsigned char *nf = fixture_pread(ni.file, ni.offset, ni.nbytes);
    CHECK(nf && memcmp(buf, nf, ni.nbytes) == 0);
    CHECK_EQ_INT(ferry_read_rows(f, norm, &one, 1, buf), FERRY_EINVAL);
    free(nf);
    free(buf);
    free(file);
    ferry_destroy(f);

    /* rows longer runs than one 16 MiB read: the huge tensor, every row in reverse order */
    f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, g_huge, NULL), 0);
    t = ferry_find(f, "huge");
    ferry_tensor_get_info(t, &info);
    rb = info.nbytes / info.n_rows;
    uint64_t *all = malloc(info.n_rows * sizeof *all);
    for (uint64_t r = 0; r < info.n_rows; r++)
        all[r] = info.n_rows - 1 - r;
    unsigned char *out = malloc(info.nbytes);
    file = fixture_pread(info.file, info.offset, info.nbytes);
    CHECK_EQ_INT(ferry_read_rows(f, t, all, info.n_rows, out), 0);
    ok = 1;
    for (uint64_t r = 0; r < info.n_rows && ok; r++)
        ok &= memcmp(out + r * rb, file + all[r] * rb, rb) == 0;
    CHECK(ok);
    free(all), free(out), free(file);
    ferry_destroy(f);
}

/* ---- close with work queued ------------------------------------------------------------------- */

static void test_close_with_queue(void)
{
    for (int k = 0; k < 3; k++) {
        ferry_options o = {.io_threads = 2};
        ferry *f = ferry_create(&o);
        int sim;
        CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB@50MB/s", &sim), 0);
        CHECK_EQ_INT(ferry_open(f, g_model, NULL), 0);
        ferry_policy p = {.home = k == 0 ? FERRY_HOME_HOST : FERRY_HOME_DISK,
                          .load = k == 2 ? FERRY_LOAD_MMAP : FERRY_LOAD_READ,
                          .compute_device = k == 2 ? 0 : sim, .convert = k == 1,
                          .compute_dtype = FERRY_DTYPE_F16};
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        size_t n;
        ferry_tensor **ts = fixture_all_tensors(f, &n);
        CHECK_EQ_INT(ferry_prefetch(f, ts, n), 0);
        if (k == 0) {
            /* queued home-only jobs too */
            pthread_mutex_lock(&f->lock);
            int any = f->jobs.queue_head != NULL;
            pthread_mutex_unlock(&f->lock);
            CHECK(any);
        }
        free(ts);
        ferry_destroy(f); /* ASan: nothing leaked, nothing used after free */
    }
}

int main(void)
{
    const char *dir = check_tmpdir("memory_accounting");
    snprintf(g_model, sizeof g_model, "%s/model.gguf", dir);
    snprintf(g_huge, sizeof g_huge, "%s/huge.gguf", dir);
    snprintf(g_slow, sizeof g_slow, "%s/slow.gguf", dir);
    snprintf(g_three, sizeof g_three, "%s/three.gguf", dir);
    g_n = fixture_layout(g_ts, 3, 64, 128, 100, FERRY_DTYPE_Q8_0, 0);
    if (fixture_write(g_model, FERRY_FORMAT_GGUF, g_ts, g_n))
        return 2;
    /* 34 MiB f32: three 16 MiB chunks on the way to a device */
    fixture_tensor huge = {"huge", FERRY_DTYPE_F32, 2, {4096, 2176, 0, 0}};
    if (fixture_write(g_huge, FERRY_FORMAT_GGUF, &huge, 1))
        return 2;
    fixture_tensor slow[5] = {{"slow.0", FERRY_DTYPE_F32, 2, {1024, 256, 0, 0}},
                              {"slow.1", FERRY_DTYPE_F32, 2, {1024, 256, 0, 0}},
                              {"slow.2", FERRY_DTYPE_F32, 2, {1024, 256, 0, 0}},
                              {"slow.3", FERRY_DTYPE_F32, 2, {1024, 256, 0, 0}},
                              {"x", FERRY_DTYPE_F32, 2, {64, 64, 0, 0}}};
    if (fixture_write(g_slow, FERRY_FORMAT_GGUF, slow, 5))
        return 2;
    /* three tensors of 1020 KiB: two held leave room for the third on a 4 MiB device */
    fixture_tensor three[3] = {{"t.0", FERRY_DTYPE_F32, 2, {1024, 255, 0, 0}},
                               {"t.1", FERRY_DTYPE_F32, 2, {1024, 255, 0, 0}},
                               {"t.2", FERRY_DTYPE_F32, 2, {1024, 255, 0, 0}}};
    if (fixture_write(g_three, FERRY_FORMAT_GGUF, three, 3))
        return 2;
    test_failed_prepare_keeps_nothing();
    test_default_budget_while_holding();
    test_budget_lifted();
    test_used_back_to_homes();
    test_faults_split_convert();
    test_copy_failure_mid_transfer_message();
    test_prepare_after_failed_prefetch();
    test_lazy_part_device();
    test_read_rows_edges();
    test_close_with_queue();
    check_rmdir(dir);
    return check_finish();
}
