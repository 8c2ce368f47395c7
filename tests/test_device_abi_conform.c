/*
 * test_device_abi_conform.c — a device written only against include/ferry_device.h (no header of
 * src/), run through the public API: ferry_device_check, ferry_add_device_custom, a model staged
 * onto it under a budget and read back against the file, and tables ferry must refuse (unknown
 * versions, short tables, missing required members, half-set optional groups), each leaving the
 * device with its caller. Its errors reach ferry_errmsg through the errmsg operation only.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry.h"
#include "ferry_device.h"
#include "model_fixture.h"

static char g_path[1100];

/* ---- the device: host memory that ferry must treat as device memory ------------------------- */

typedef struct ext_dev {
    ferry_device base; /* first */
    pthread_mutex_t lock;
    uint64_t capacity, used;
    uint64_t next_ticket;
    uint64_t alloc_calls;
    uint64_t fail_alloc;    /* the N-th allocation is refused; 0: never */
    int destroyed;          /* set by destroy, read by the test after it */
    int live;               /* allocations not yet freed */
} ext_dev;

typedef struct ext_block {
    uint64_t size;
    uint64_t pad[7]; /* keeps the bytes 64-aligned after the header */
} ext_block;

#define EXT_ALIGN 64

static _Thread_local char t_msg[256]; /* the calling thread's latest failure */
static int g_destroyed;               /* destroy calls over the whole run */

static int ext_fail(int code, const char *what)
{
    snprintf(t_msg, sizeof t_msg, "ext: %s", what);
    return code;
}

static void ext_destroy(ferry_device *d)
{
    ext_dev *e = (ext_dev *)d;
    g_destroyed++;
    CHECK_EQ_INT(e->live, 0);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static int ext_props(ferry_device *d, ferry_device_props *out)
{
    (void)d;
    snprintf(out->name, sizeof out->name, "ext:0");
    snprintf(out->kind, sizeof out->kind, "ext");
    out->alignment = EXT_ALIGN;
    out->max_alloc = UINT64_C(1) << 30;
    out->host_accessible = 0;
    return 0;
}

static char *ext_errmsg(ferry_device *d, char *buf, size_t len)
{
    (void)d;
    snprintf(buf, len, "%s", t_msg);
    return buf;
}

static int ext_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    ext_dev *e = (ext_dev *)d;
    pthread_mutex_lock(&e->lock);
    uint64_t call = ++e->alloc_calls;
    int over = e->used + size > e->capacity;
    int refuse = e->fail_alloc && call == e->fail_alloc;
    if (!over && !refuse)
        e->used += size;
    pthread_mutex_unlock(&e->lock);
    if (refuse)
        return ext_fail(FERRY_ENOMEM, "allocation refused by the test");
    if (over)
        return ext_fail(FERRY_ENOMEM, "out of capacity");
    ext_block *b = aligned_alloc(EXT_ALIGN, sizeof *b + ((size + EXT_ALIGN - 1) & ~(uint64_t)63));
    if (!b) {
        pthread_mutex_lock(&e->lock);
        e->used -= size;
        pthread_mutex_unlock(&e->lock);
        return ext_fail(FERRY_ENOMEM, "out of host memory");
    }
    b->size = size;
    memset(b + 1, 0x5A, size); /* fresh memory is not the file's bytes */
    pthread_mutex_lock(&e->lock);
    e->live++;
    pthread_mutex_unlock(&e->lock);
    *ptr = b + 1;
    return 0;
}

static void ext_free(ferry_device *d, void *ptr)
{
    if (!ptr)
        return;
    ext_dev *e = (ext_dev *)d;
    ext_block *b = (ext_block *)ptr - 1;
    pthread_mutex_lock(&e->lock);
    e->used -= b->size;
    e->live--;
    pthread_mutex_unlock(&e->lock);
    free(b);
}

/* Copies run at once; the ticket only orders them. */
static int ext_copy(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    ext_dev *e = (ext_dev *)d;
    if (!dst || !src)
        return ext_fail(FERRY_EINVAL, "copy with a NULL pointer");
    memcpy(dst, src, n);
    pthread_mutex_lock(&e->lock);
    *ticket = ++e->next_ticket;
    pthread_mutex_unlock(&e->lock);
    return 0;
}

static int ext_wait(ferry_device *d, uint64_t ticket)
{
    ext_dev *e = (ext_dev *)d;
    pthread_mutex_lock(&e->lock);
    int bad = ticket == 0 || ticket > e->next_ticket;
    pthread_mutex_unlock(&e->lock);
    return bad ? ext_fail(FERRY_EINVAL, "wait on a ticket never issued") : 0;
}

static int ext_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    ext_dev *e = (ext_dev *)d;
    pthread_mutex_lock(&e->lock);
    *free_bytes = e->capacity - e->used;
    *total_bytes = e->capacity;
    pthread_mutex_unlock(&e->lock);
    return 0;
}

/* Required members, errmsg, copy_d2h and mem_info: no events, no pinned memory, no read_sync. */
static const ferry_device_ops ext_ops = {
    .version = FERRY_DEVICE_OPS_VERSION,
    .size = sizeof(ferry_device_ops),
    .destroy = ext_destroy,
    .props = ext_props,
    .alloc = ext_alloc,
    .free = ext_free,
    .copy_h2d = ext_copy,
    .wait = ext_wait,
    .errmsg = ext_errmsg,
    .copy_d2h = ext_copy,
    .mem_info = ext_mem_info,
};

static ext_dev *ext_new(const ferry_device_ops *ops, uint64_t capacity)
{
    ext_dev *e = calloc(1, sizeof *e);
    e->base.ops = ops;
    e->base.user = e;
    e->capacity = capacity;
    pthread_mutex_init(&e->lock, NULL);
    return e;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static ferry *open_model(ferry *f, int dev)
{
    ferry_policy p = {0};
    p.compute_device = dev;
    p.load = FERRY_LOAD_READ;
    CHECK_EQ_INT(ferry_open(f, g_path, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    return f;
}

/* Every tensor staged onto the device under a budget of a third of the model, bytes as the file,
 * twice over (the second pass evicts and re-stages). */
static void test_stream_through(void)
{
    ext_dev *e = ext_new(&ext_ops, UINT64_C(64) << 20);
    char msg[256];
    CHECK_EQ_INT(ferry_device_check(&e->base, msg, sizeof msg), 0);
    CHECK_STR(msg, "");
    ferry_device_props pr;
    CHECK_EQ_INT(ferry_device_props_get(&e->base, &pr), 0);
    CHECK_STR(pr.kind, "ext");

    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &dev), 0);
    CHECK_EQ_INT(dev, 1);
    ferry_device_info info;
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &info), 0);
    CHECK_STR(info.name, "ext:0");
    CHECK_STR(info.kind, "ext");
    CHECK_EQ_INT(info.host_accessible, 0);
    CHECK_EQ_INT(info.total_bytes, UINT64_C(64) << 20);

    open_model(f, dev);
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    uint64_t model = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info ti;
        CHECK_EQ_INT(ferry_tensor_get_info(ts[i], &ti), 0);
        model += ti.nbytes;
    }
    CHECK(n >= 10 && model > 0);
    CHECK_EQ_INT(ferry_set_budget(f, dev, model / 3), 0);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
            CHECK(fixture_same_as_file(f, ts[i]));
            CHECK_EQ_INT(ferry_release(f, &ts[i], 1), 0);
        }
    }
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &info), 0);
    if (info.used_bytes > model / 3)
        fprintf(stderr, "used %llu, budget %llu\n", (unsigned long long)info.used_bytes,
                (unsigned long long)info.budget);
    CHECK(info.used_bytes <= model / 3);
    free(ts);
    int before = g_destroyed;
    ferry_destroy(f); /* the manager owns the device now: it is destroyed here */
    CHECK_EQ_INT(g_destroyed, before + 1);
}

/* A refused allocation: prepare fails with the device's own message through errmsg, and the
 * manager goes on (the next prepare works, the bytes are the file's). */
static void test_device_error(void)
{
    ext_dev *e = ext_new(&ext_ops, UINT64_C(64) << 20);
    e->fail_alloc = 1;
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &dev), 0);
    open_model(f, dev);
    ferry_tensor *t = ferry_find(f, "blk.0.ffn_up.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), FERRY_ENOMEM);
    const char *m = ferry_errmsg(f);
    CHECK(strstr(m, "ext: allocation refused by the test") != NULL);
    CHECK(strstr(m, "blk.0.ffn_up.weight") != NULL);
    CHECK(strstr(m, "ext:0") != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    CHECK(fixture_same_as_file(f, t));
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_destroy(f);
}

/* A device without copy_d2h nor read_sync: tensors stage, reading back is refused cleanly. */
static void test_no_read_back(void)
{
    static ferry_device_ops ops;
    ops = ext_ops;
    ops.copy_d2h = NULL;
    ext_dev *e = ext_new(&ops, UINT64_C(64) << 20);
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &dev), 0);
    open_model(f, dev);
    ferry_tensor *t = ferry_find(f, "output_norm.weight");
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    char b[16];
    CHECK_EQ_INT(ferry_tensor_read(f, t, 0, sizeof b, b), FERRY_EUNSUPPORTED);
    CHECK_EQ_INT(ferry_release(f, &t, 1), 0);
    ferry_destroy(f);
}

/* Members set alone, where ferry wants their whole group: never called. */
static int lone_event_create(ferry_device *d, void **ev)
{
    (void)d, (void)ev;
    CHECK(0);
    return FERRY_EUNSUPPORTED;
}

static int lone_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments)
{
    (void)d, (void)p, (void)size, (void)segments;
    CHECK(0);
    return 0;
}

static int lone_register(ferry_device *d, void *p, uint64_t n)
{
    (void)d, (void)p, (void)n;
    return 0;
}

/* Tables ferry must refuse, each with a message naming the cause; the device stays the caller's. */
static void test_refused_tables(void)
{
    ferry *f = ferry_create(NULL);
    static ferry_device_ops bad;
    ext_dev *e = ext_new(&bad, UINT64_C(1) << 20);
    struct {
        const char *what; /* in the message */
        int version;
        uint32_t size;
        int drop; /* 1: props NULL, 2: wait NULL, 3: one event member, 4: block alone,
                     5: host_alloc without host_free, 6: host_register alone */
    } cases[] = {
        {"version 0", 0, sizeof(ferry_device_ops), 0},
        {"version 1", 1, sizeof(ferry_device_ops), 0},
        {"version 2", 2, sizeof(ferry_device_ops), 0},
        {"version 4", 4, sizeof(ferry_device_ops), 0},
        {"ends before its required members", FERRY_DEVICE_OPS_VERSION,
         (uint32_t)offsetof(ferry_device_ops, wait), 0},
        {"props is NULL", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 1},
        {"wait is NULL", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 2},
        {"1 of the 5 event members", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 3},
        {"1 of set_reuse, block, stitch", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 4},
        {"host_alloc and host_free", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 5},
        {"host_register and host_unregister", FERRY_DEVICE_OPS_VERSION, sizeof(ferry_device_ops), 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bad = ext_ops;
        bad.version = (uint32_t)cases[i].version;
        bad.size = cases[i].size;
        if (cases[i].drop == 1)
            bad.props = NULL;
        if (cases[i].drop == 2)
            bad.wait = NULL;
        if (cases[i].drop == 3)
            bad.event_create = lone_event_create;
        if (cases[i].drop == 4)
            bad.block = lone_block;
        if (cases[i].drop == 5)
            bad.host_alloc = ext_alloc;
        if (cases[i].drop == 6)
            bad.host_register = lone_register;
        char msg[256];
        CHECK_EQ_INT(ferry_device_check(&e->base, msg, sizeof msg), FERRY_EINVAL);
        if (!strstr(msg, cases[i].what))
            fprintf(stderr, "case %zu: message '%s' lacks '%s'\n", i, msg, cases[i].what);
        CHECK(strstr(msg, cases[i].what) != NULL);
        int before = g_destroyed;
        int id = -7;
        CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &id), FERRY_EINVAL);
        CHECK(strstr(ferry_errmsg(f), cases[i].what) != NULL);
        CHECK_EQ_INT(id, -7);
        CHECK_EQ_INT(g_destroyed, before); /* still the caller's */
    }
    CHECK_EQ_INT(ferry_device_count(f), 1);
    /* the manager is unharmed: a good table goes in after the refusals */
    bad = ext_ops;
    int id = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &id), 0);
    CHECK_EQ_INT(id, 1);
    CHECK_EQ_INT(ferry_add_device_custom(NULL, &e->base, &id), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_add_device_custom(f, NULL, &id), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_device_check(NULL, NULL, 0), FERRY_EINVAL);

    /* FERRY_ELIMIT leaves the device with the caller too */
    while (ferry_device_count(f) < FERRY_MAX_DEVICES) {
        ext_dev *x = ext_new(&ext_ops, UINT64_C(1) << 20);
        CHECK_EQ_INT(ferry_add_device_custom(f, &x->base, NULL), 0);
    }
    ext_dev *over = ext_new(&ext_ops, UINT64_C(1) << 20);
    int before = g_destroyed;
    CHECK_EQ_INT(ferry_add_device_custom(f, &over->base, NULL), FERRY_ELIMIT);
    CHECK(strstr(ferry_errmsg(f), "at most") != NULL);
    CHECK_EQ_INT(g_destroyed, before);
    ferry_device_close(&over->base);
    CHECK_EQ_INT(g_destroyed, before + 1);
    ferry_destroy(f);
    CHECK_EQ_INT(g_destroyed, before + 1 + FERRY_MAX_DEVICES - 1);
}

/* FERRY_DEVICE_HAS: a member past the table's size reads as absent, even when set. */
static void test_has_macro(void)
{
    static ferry_device_ops t;
    t = ext_ops;
    CHECK(FERRY_DEVICE_HAS(&t, copy_d2h));
    CHECK(FERRY_DEVICE_HAS(&t, mem_info));
    CHECK(!FERRY_DEVICE_HAS(&t, read_sync));
    t.size = (uint32_t)offsetof(ferry_device_ops, mem_info);
    CHECK(FERRY_DEVICE_HAS(&t, copy_d2h));
    CHECK(!FERRY_DEVICE_HAS(&t, mem_info));
    /* such a short table is accepted, and mem_info is not called: no default budget */
    ext_dev *e = ext_new(&t, UINT64_C(1) << 20);
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &dev), 0);
    ferry_device_info info;
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &info), 0);
    CHECK_EQ_INT(info.total_bytes, 0);
    CHECK_EQ_INT(info.budget, 0);
    ferry_destroy(f);
}

/* Two threads staging onto the device at once, each checking its bytes. */
typedef struct worker {
    ferry *f;
    ferry_tensor **ts;
    size_t n, first;
    int bad;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    for (int round = 0; round < 3; round++) {
        for (size_t i = w->first; i < w->n; i += 2) {
            if (ferry_prepare(w->f, &w->ts[i], 1) != 0 || !fixture_same_as_file(w->f, w->ts[i]))
                w->bad++;
            ferry_release(w->f, &w->ts[i], 1);
        }
    }
    return NULL;
}

static void test_threads(void)
{
    ext_dev *e = ext_new(&ext_ops, UINT64_C(64) << 20);
    ferry *f = ferry_create(NULL);
    int dev = -1;
    CHECK_EQ_INT(ferry_add_device_custom(f, &e->base, &dev), 0);
    open_model(f, dev);
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    worker w[2] = {{f, ts, n, 0, 0}, {f, ts, n, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, work, &w[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(w[0].bad + w[1].bad, 0);
    free(ts);
    ferry_destroy(f);
}

/* The built-in devices' errmsg: two threads failing different operations on one device at once
 * each read their own message. */
typedef struct failer {
    ferry_device *d;
    int kind; /* 0: allocations over max_alloc, 1: waits on tickets never issued */
    int wrong;
} failer;

static void *fail_loop(void *arg)
{
    failer *w = arg;
    char buf[256];
    for (int i = 0; i < 2000; i++) {
        void *p = NULL;
        int rc = w->kind == 0 ? w->d->ops->alloc(w->d, UINT64_C(1) << 40, &p)
                              : w->d->ops->wait(w->d, UINT64_C(1) << 40);
        w->d->ops->errmsg(w->d, buf, sizeof buf);
        const char *want = w->kind == 0 ? "exceeds max_alloc" : "never issued";
        if (rc == 0 || !strstr(buf, want))
            w->wrong++;
    }
    return NULL;
}

static void test_errmsg_per_thread(void)
{
    char msg[256];
    ferry_device *d = NULL;
    CHECK_EQ_INT(ferry_device_open("sim:64MiB", &d, msg, sizeof msg), 0);
    if (!d)
        return;
    CHECK(FERRY_DEVICE_HAS(d->ops, errmsg));
    failer w[2] = {{d, 0, 0}, {d, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, fail_loop, &w[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(w[0].wrong, 0);
    CHECK_EQ_INT(w[1].wrong, 0);
    ferry_device_close(d);
}

int main(void)
{
    const char *dir = check_tmpdir("device_abi");
    snprintf(g_path, sizeof g_path, "%s/m.gguf", dir);
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, 2, 256, 512, 512, FERRY_DTYPE_F16, 0);
    if (fixture_write(g_path, FERRY_FORMAT_GGUF, ts, n)) {
        fprintf(stderr, "cannot write %s\n", g_path);
        return 1;
    }
    test_stream_through();
    test_device_error();
    test_no_read_back();
    test_refused_tables();
    test_has_macro();
    test_threads();
    test_errmsg_per_thread();
    check_rmdir(dir);
    return check_finish();
}
