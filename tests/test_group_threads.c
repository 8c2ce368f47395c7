/*
 * test_group_threads.c — concurrency: a group removed while another
 * thread prepares one of its tensors; groups added while loaders run jobs (the loaders read the
 * group's policy without the lock); tracing restarted and stopped while loaders and engine threads
 * add events. Meant for the TSan and ASan builds as much as the plain one.
 */
#include <pthread.h>

#include "check.h"
#include "core/core.h"
#include "devices/devices.h"
#include "model_fixture.h"

static char g_model[1200], g_slow[1200], g_trace[1200];

/* ---- group removed while one of its tensors is being prepared ---------------------------------- */

typedef struct remove_arg {
    ferry *f;
    int rc;
} remove_arg;

static void *remove_thread(void *arg)
{
    remove_arg *ra = arg;
    ra->rc = ferry_group_remove(ra->f, "g");
    return NULL;
}

/* ferry_group_remove checks that no tensor is prepared, then waits (dropping the lock) for the
 * group's loads in flight. A prepare of a cached tensor of the group during that wait succeeds;
 * when the wait ends the group is removed anyway and the prepared tensor's memory freed under the
 * engine. */
static void test_remove_while_preparing(void)
{
    ferry_options o = {.io_threads = 2};
    ferry *f = ferry_create(&o);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB@1MB/s", &sim), 0);
    CHECK_EQ_INT(ferry_open(f, g_slow, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = sim};
    CHECK_EQ_INT(ferry_group_add(f, "g", "*", &p), 0);
    ferry_tensor *y = ferry_find(f, "x"), *big = ferry_find(f, "slow.0");
    CHECK_EQ_INT(ferry_prepare(f, &y, 1), 0); /* cached on the sim after release */
    CHECK_EQ_INT(ferry_release(f, &y, 1), 0);
    CHECK_EQ_INT(ferry_prefetch(f, &big, 1), 0); /* about half a second in flight */
    remove_arg ra = {f, 1};
    pthread_t th;
    pthread_create(&th, NULL, remove_thread, &ra);
    usleep(100 * 1000); /* the remover waits for the prefetch */
    int rc = ferry_prepare(f, &y, 1);
    void *ptr = rc == 0 ? ferry_tensor_data(y) : NULL;
    pthread_join(th, NULL);
    if (rc == 0 && ra.rc == 0)
        fprintf(stderr, "group removed (rc 0) while a prepare of its tensor succeeded: data now "
                        "%p (was %p)\n", ferry_tensor_data(y), ptr);
    /* one of them must lose: the remove with EBUSY, or the prepare with ENOENT (group gone) or
     * EBUSY (group being removed) */
    CHECK(!(rc == 0 && ra.rc == 0));
    if (rc == 0) {
        CHECK(ptr != NULL);
        CHECK(ferry_tensor_data(y) == ptr);
        ferry_release(f, &y, 1);
    } else {
        CHECK(rc == FERRY_ENOENT || rc == FERRY_EBUSY);
    }
    ferry_destroy(f);
}

/* ---- groups added while loaders run -------------------------------------------------------- */

typedef struct stream_arg {
    ferry *f;
    ferry_tensor **ts;
    size_t n;
    int reps; /* 0: until stop */
    int failures;
    int stop;
} stream_arg;

static void *stream_thread(void *arg)
{
    stream_arg *sa = arg;
    for (int r = 0; sa->reps ? r < sa->reps : !__atomic_load_n(&sa->stop, __ATOMIC_ACQUIRE);
         r++)
        for (size_t i = 0; i < sa->n; i++) {
            if (ferry_prepare(sa->f, &sa->ts[i], 1)) {
                sa->failures++;
                continue;
            }
            ferry_release(sa->f, &sa->ts[i], 1);
        }
    return NULL;
}

/* Loader threads read the tensor's group policy (ferry__policy_of: &f->place.groups[g].policy)
 * without the lock, while ferry_group_add reallocates f->place.groups under it. TSan reports the
 * race; ASan may report a use after free when realloc moves the array. */
static void test_group_add_while_loading(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    stream_arg sa = {f, ts, n, 0, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, stream_thread, &sa);
    char name[32], pat[32];
    for (int k = 0; k < 300; k++) {
        snprintf(name, sizeof name, "g%d", k);
        snprintf(pat, sizeof pat, "nothing.%d.*", k);
        CHECK_EQ_INT(ferry_group_add(f, name, pat, &p), 0);
        usleep(300);
    }
    __atomic_store_n(&sa.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK_EQ_INT(sa.failures, 0);
    free(ts);
    ferry_destroy(f);
}

/* ---- tracing restarted / stopped while events are added --------------------------------------- */

typedef struct event_arg {
    ferry *f;
    volatile int stop;
} event_arg;

static void *event_thread(void *arg)
{
    event_arg *ea = arg;
    while (!__atomic_load_n(&ea->stop, __ATOMIC_ACQUIRE)) {
        double t = ferry_now();
        ferry_trace_event(ea->f, "engine step", "engine", t, t + 1e-6);
    }
    return NULL;
}

/* ferry_trace_start frees the trace it replaces at once, and ferry_trace_stop frees its trace once
 * no loader job runs — but an engine thread inside ferry_trace_event (or a loader that loaded the
 * pointer before the swap) may still be appending to it. */
static void test_trace_restart(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    stream_arg sa = {f, ts, n, 20, 0, 0};
    event_arg ea = {f, 0};
    pthread_t th, te;
    CHECK_EQ_INT(ferry_trace_start(f, g_trace), 0);
    pthread_create(&th, NULL, stream_thread, &sa);
    pthread_create(&te, NULL, event_thread, &ea);
    for (int k = 0; k < 100; k++) {
        if (k % 2)
            CHECK_EQ_INT(ferry_trace_start(f, g_trace), 0);
        else
            CHECK_EQ_INT(ferry_trace_stop(f), 0);
    }
    pthread_join(th, NULL);
    __atomic_store_n(&ea.stop, 1, __ATOMIC_RELEASE);
    pthread_join(te, NULL);
    CHECK_EQ_INT(ferry_trace_stop(f), 0);
    CHECK_EQ_INT(sa.failures, 0);
    free(ts);
    ferry_destroy(f);
}

/* The first touch of a fresh host buffer is its own span (category "memory") before the read
 * that fills it: on a virtual machine it can take as long as the read. */
static void test_trace_fault_in(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    CHECK_EQ_INT(ferry_open(f, g_slow, NULL), 0);
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    ferry_tensor *t = ferry_find(f, "slow.0"); /* 512 KiB: a mapped block */
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_trace_start(f, g_trace), 0);
    CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
    ferry_release(f, &t, 1);
    CHECK_EQ_INT(ferry_trace_stop(f), 0);
    ferry_destroy(f);
    FILE *fp = fopen(g_trace, "r");
    CHECK(fp != NULL);
    static char buf[1 << 16];
    size_t got = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    buf[got] = 0;
    if (fp)
        fclose(fp);
    const char *ev = strstr(buf, "fault in slow.0");
    CHECK(ev != NULL);
    /* the event names its category: "memory" comes before the next event */
    const char *next = ev ? strstr(ev, "\"name\"") : NULL;
    const char *cat = ev ? strstr(ev, "memory") : NULL;
    CHECK(cat != NULL && (!next || cat < next));
    CHECK(strstr(buf, "read slow.0") != NULL);
}

int main(void)
{
    const char *dir = check_tmpdir("group_threads");
    snprintf(g_model, sizeof g_model, "%s/model.gguf", dir);
    snprintf(g_slow, sizeof g_slow, "%s/slow.gguf", dir);
    snprintf(g_trace, sizeof g_trace, "%s/trace.json", dir);
    if (fixture_write_llama(g_model, 3, 64, 128, 100, FERRY_DTYPE_Q8_0))
        return 2;
    fixture_tensor slow[2] = {{"slow.0", FERRY_DTYPE_F32, 2, {1024, 128, 0, 0}},
                              {"x", FERRY_DTYPE_F32, 2, {64, 64, 0, 0}}};
    if (fixture_write(g_slow, FERRY_FORMAT_GGUF, slow, 2))
        return 2;
    test_remove_while_preparing();
    test_group_add_while_loading();
    test_trace_restart();
    test_trace_fault_in();
    check_rmdir(dir);
    return check_finish();
}
