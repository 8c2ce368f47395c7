/*
 * manager.c — the ferry handle: creation and close, devices and budgets, opening model files,
 * groups and their rules, finding tensors, statistics. Expectations and validation are in
 * expect.c.
 * Residency is in prepare.c (the public calls), jobs.c (queue and loaders), transfer.c (moving
 * bytes) and tensor.c (reading tensors back); memory accounting in memory.c, placement decisions
 * in policy.c, the dry run in plan.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "devices/devices.h"

/* I/O workers, and so loaders, where neither the options nor the environment say: four loaders
 * fault in fresh blocks and keep reads in flight while others copy, which on two CPUs made
 * streamed passes and page-cache copies faster than two (bench/README.md, "Four I/O workers"). */
#define FERRY__IO_THREADS 4u

#define FERRY__DEVICE_MARGIN (UINT64_C(256) << 20)
/* The host's margin: an eighth of what it can give, within these bounds (ferry.h). It covers
 * what ferry and the engine allocate outside the budget: I/O buffers, threads, metadata. */
#define FERRY__HOST_MARGIN_MIN (UINT64_C(32) << 20)
#define FERRY__HOST_MARGIN_MAX (UINT64_C(1) << 30)

/* The default host budget: what the host can give now (MemAvailable and the cgroup's room, the
 * smaller) plus HELD, what ferry already holds there (its own to budget), less the margin, and
 * never above the host's capacity. 0 (no limit) only when host memory cannot be probed. */
static uint64_t host_default_budget(uint64_t held)
{
    ferry__host_room r;
    if (ferry__host_room_probe(&r) || !r.total)
        return 0;
    uint64_t give = r.avail > UINT64_MAX - held ? UINT64_MAX : r.avail + held;
    if (give > r.total)
        give = r.total;
    uint64_t margin = give / 8;
    margin = margin < FERRY__HOST_MARGIN_MIN   ? FERRY__HOST_MARGIN_MIN
             : margin > FERRY__HOST_MARGIN_MAX ? FERRY__HOST_MARGIN_MAX
                                               : margin;
    uint64_t b = give > 2 * margin ? give - margin : give / 2;
    return b ? b : 1;
}

/* FERRY_EBUDGET when BYTES is above what device DEV can ever hold (its capacity; on the host, its
 * RAM or the memory cgroup's limit), naming both; 0 otherwise or when the device cannot say. */
static int check_capacity(ferry *f, int dev, uint64_t bytes, ferry__err *e)
{
    ferry_device *d = f->devs[dev].d;
    const char *dname = f->devs[dev].p.name;
    char b1[32], b2[32];
    if (dev == FERRY__HOST) {
        ferry__host_room r;
        if (ferry__host_room_probe(&r) || !r.total || bytes <= r.total)
            return 0;
        if (r.cg_limit == r.total)
            return ferry__fail(e, FERRY_EBUDGET,
                               "%s: a host budget of %s is above the memory cgroup's limit of %s",
                               dname, ferry__fmt_size(bytes, b1), ferry__fmt_size(r.total, b2));
        return ferry__fail(e, FERRY_EBUDGET,
                           "%s: a host budget of %s is above the host's memory of %s", dname,
                           ferry__fmt_size(bytes, b1), ferry__fmt_size(r.total, b2));
    }
    uint64_t free_b = 0, total = 0;
    if (!FERRY_DEVICE_HAS(d->ops, mem_info) || d->ops->mem_info(d, &free_b, &total) || !total ||
        bytes <= total)
        return 0;
    return ferry__fail(e, FERRY_EBUDGET,
                       "%s: a budget of %s is above the device's capacity of %s", dname,
                       ferry__fmt_size(bytes, b1), ferry__fmt_size(total, b2));
}

ferry *ferry_create(const ferry_options *opt)
{
    ferry *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    if (opt)
        f->opt = *opt;
    if (!f->opt.io_threads) {
        /* FERRY_IO_THREADS: the default for managers that do not set it (tuning, benchmarks) */
        const char *env = getenv("FERRY_IO_THREADS");
        long v = env ? strtol(env, NULL, 10) : 0;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        f->opt.io_threads = v > 0 && v <= 64 ? (uint32_t)v : cpus < 2 ? 2 : FERRY__IO_THREADS;
    }
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    pthread_cond_init(&f->work, NULL);
    pthread_rwlock_init(&f->trace.lock, NULL);
    if (ferry__serial_register(&f->serial))
        goto fail;
    char msg[256];
    ferry_device *cpu = NULL;
    f->cat = ferry_catalog_create();
    if (!f->cat || ferry_device_open("cpu", &cpu, msg, sizeof msg) != 0)
        goto fail;
    f->devs[0].d = cpu;
    ferry_device_props_get(cpu, &f->devs[0].p);
    f->n_devs = 1;
    if (f->opt.host_budget && check_capacity(f, FERRY__HOST, f->opt.host_budget, NULL))
        goto fail;
    f->devs[0].budget = f->opt.host_budget ? f->opt.host_budget : host_default_budget(0);
    /* pool and huge pages only under a budget given: a default run most often loads its copies
     * once, and a pool would keep what it frees from the rest of the host */
    f->devs[0].default_budget = !f->opt.host_budget;
    ferry__device_set_reuse(cpu, f->opt.host_budget != 0);
    f->evictor = ferry__evict_cyclic(&f->sched);
    if (f->opt.slice_evict == FERRY_SLICE_EVICT_DEFAULT) {
        /* FERRY_SLICE_EVICT: the default for managers that do not set it (comparisons) */
        const char *env = getenv("FERRY_SLICE_EVICT");
        f->opt.slice_evict = env && strcmp(env, "cyclic") == 0 ? FERRY_SLICE_EVICT_CYCLIC
                                                               : FERRY_SLICE_EVICT_EXPERT;
    }
    f->moe.on = f->opt.slice_evict != FERRY_SLICE_EVICT_CYCLIC;
    if (ferry__moe_policy_init(&f->moe.p, FERRY__MOE_DEFAULT, 0, NULL, 1, 0, 0))
        goto fail;
    f->moe.ev = ferry__evict_moe(&f->moe.p);
    if (ferry__sched_init(&f->sched, 0, !f->opt.no_schedule))
        goto fail;
    ferry__pf_follow_init(&f->prefetch.follow);
    f->io = ferry__io_create(f->opt.io_threads);
    ferry__cold_init(f);
    /* Relayed reads: FERRY_IO_RELAY=0 or 1 where set, else where fresh huge pages are dear (a VM
     * reporting free memory to its host, whose disk its host emulates: relayed reads measured
     * 1.1-1.5 times the straight ones there, into small pages and huge ones alike,
     * bench/README.md); no other machine was measured. */
    const char *relay = getenv("FERRY_IO_RELAY");
    f->relay = relay && *relay ? strcmp(relay, "0") != 0 : ferry__host_huge_pages_dear();
    ferry__first_init(f);
    if (!f->io)
        goto fail;
    if (!f->opt.io_request_bytes) {
        /* FERRY_IO_REQUEST: the default for managers that do not set it (tuning, benchmarks) */
        const char *env = getenv("FERRY_IO_REQUEST");
        uint64_t v = 0;
        if (env && ferry_parse_size(env, &v) == 0)
            f->opt.io_request_bytes = v;
    }
    f->opt.io_request_bytes = ferry__io_set_chunk(f->io, f->opt.io_request_bytes);
    if (ferry__loaders_start(f))
        goto fail;
    return f;
fail:
    ferry_destroy(f);
    return NULL;
}

int ferry_get_io_settings(const ferry *f, ferry_io_settings *out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    out->io_threads = ferry__io_threads(f->io);
    out->request_bytes = ferry__io_chunk(f->io);
    out->backend = ferry__io_backend(f->io);
    out->relay_bytes = ferry__io_relay_bytes(f->io);
    return 0;
}

int ferry_get_cold_load(ferry *f, ferry_cold_load *out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    *out = (ferry_cold_load){.decided = f->cold.decided, .map = f->cold.decided && f->cold.map,
                             .forced = f->cold.forced, .map_gbps = f->cold.map_gbps,
                             .private_gbps = f->cold.private_gbps,
                             .fault_gbps = f->cold.fault_gbps, .dear = f->cold.dear,
                             .read_gbps = f->cold.read_gbps};
    pthread_mutex_unlock(&f->lock);
    return 0;
}

void ferry_destroy(ferry *f)
{
    if (!f)
        return;
    /* Memory the engine's queued work still reads (releases waiting on events) is waited for
     * first. Then cancel and drain: the loaders finish what they run, drop the queue and exit;
     * only then is memory freed. */
    pthread_mutex_lock(&f->lock);
    ferry__first_warm_join(f);
    ferry__first_kept_drop(f);
    if (f->jobs.loaders)
        ferry__fences_wait_all(f);
    pthread_mutex_unlock(&f->lock);
    ferry__loaders_stop(f);
    if (f->trace.tr) {
        ferry__trace_write(f->trace.tr, NULL);
        ferry__trace_free(f->trace.tr);
        f->trace.tr = NULL;
    }
    if (f->io)
        ferry__io_destroy(f->io);
    ferry__lora_free_all(f);
    for (size_t i = 0; i < f->n_all; i++) {
        ferry_tensor *t = f->all[i];
        ferry__drop_copy(f, t, &t->comp);
        ferry__drop_copy(f, t, &t->host);
        free(t->parts);
        free(t->slices);
        free(t->own_name);
        free(t->fail_msg);
        free(t);
    }
    free(f->all);
    free(f->tensors);
    for (int d = 0; d < f->n_devs; d++) {
        ferry__pool_trim(f, d, UINT64_MAX);
        free(f->devs[d].pool);
        ferry_device_close(f->devs[d].d);
    }
    for (size_t i = 0; i < f->place.n_groups; i++)
        free(f->place.groups[i].name);
    free(f->place.groups);
    for (size_t i = 0; i < f->place.n_rules; i++)
        free(f->place.rules[i].pattern);
    free(f->place.rules);
    for (size_t i = 0; i < f->place.n_ignore; i++)
        free(f->place.ignore[i]);
    free(f->place.ignore);
    for (size_t i = 0; i < f->place.n_optional; i++)
        free(f->place.optional[i]);
    free(f->place.optional);
    ferry__hmap_free(&f->expect.expected_missing);
    for (size_t i = 0; i < f->expect.n_missing; i++)
        free(f->expect.missing_names[i]);
    free(f->expect.missing_names);
    free(f->expect.missing_expect);
    ferry__sched_free(&f->sched);
    ferry__pf_follow_free(&f->prefetch.follow);
    free(f->first.rank);
    free(f->first.upto);
    ferry__moe_policy_free(&f->moe.p);
    free(f->moe.group);
    free(f->moe.layer);
    free(f->moe.group_prep);
    ferry_catalog_destroy(f->cat);
    pthread_cond_destroy(&f->work);
    pthread_rwlock_destroy(&f->trace.lock);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    ferry__serial_unregister(f->serial);
    free(f);
}

/* Adds D (its table checked, its properties P read) to F. OWNED: D was opened here, so it is
 * closed on failure; a caller's device stays the caller's (ferry_device.h's rule). */
static int add_device(ferry *f, ferry_device *d, const ferry_device_props *p, int owned, int *id)
{
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    if (f->n_devs >= FERRY_MAX_DEVICES) {
        rc = ferry__fail(e, FERRY_ELIMIT, "%s: at most %d devices", p->name,
                         FERRY_MAX_DEVICES);
    } else {
        int n = f->n_devs;
        f->devs[n].d = d;
        f->devs[n].p = *p;
        uint64_t free_b = 0, total = 0;
        if (FERRY_DEVICE_HAS(d->ops, mem_info) && d->ops->mem_info(d, &free_b, &total) == 0)
            f->devs[n].budget = free_b > FERRY__DEVICE_MARGIN * 2 ? free_b - FERRY__DEVICE_MARGIN
                                                                  : free_b;
        f->n_devs = n + 1;
        if (id)
            *id = n;
        if (!p->host_accessible)
            ferry__loaders_for_device(f);
    }
    pthread_mutex_unlock(&f->lock);
    if (rc && owned)
        ferry_device_close(d);
    return ferry__publish(f, rc, e);
}

/* Opens the device of SPEC into *D with its properties in *P; a failure is the calling thread's
 * message on F. */
static int open_spec(ferry *f, const char *spec, ferry_device **d, ferry_device_props *p)
{
    char msg[256] = "";
    *d = NULL;
    int rc = ferry_device_open(spec, d, msg, sizeof msg);
    if (rc)
        return ferry__fail_thread(f, rc, "%s", msg[0] ? msg : ferry_strerror(rc));
    ferry_device_props_get(*d, p);
    return 0;
}

int ferry_add_device(ferry *f, const char *spec, int *id)
{
    if (!f || !spec)
        return FERRY_EINVAL;
    ferry_device *d;
    ferry_device_props p;
    int rc = open_spec(f, spec, &d, &p);
    return rc ? rc : add_device(f, d, &p, 1, id);
}

int ferry_set_host_device(ferry *f, const char *spec)
{
    if (!f || !spec)
        return FERRY_EINVAL;
    ferry_device *d;
    ferry_device_props p;
    int rc = open_spec(f, spec, &d, &p);
    if (rc)
        return rc;
    if (!p.host_accessible) {
        ferry_device_close(d);
        return ferry__fail_thread(f, FERRY_EINVAL, "%s: the host device must be host-accessible",
                                  spec);
    }
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry__dev *H = &f->devs[FERRY__HOST];
    ferry_device *old = NULL;
    if (f->n_devs != 1 || ferry_catalog_count(f->cat) != 0 || H->used != 0 || H->n_pool != 0) {
        rc = ferry__fail(e, FERRY_EBUSY,
                         "%s: the host device can only be replaced on a fresh manager (no file "
                         "opened, no other device, nothing held)", spec);
    } else {
        old = H->d;
        H->d = d;
        H->p = p;
        ferry__device_set_reuse(d, !H->default_budget);
    }
    pthread_mutex_unlock(&f->lock);
    ferry_device_close(rc ? d : old);
    return ferry__publish(f, rc, e);
}

int ferry_add_device_custom(ferry *f, ferry_device *d, int *id)
{
    if (!f)
        return FERRY_EINVAL;
    char msg[256];
    int rc = ferry_device_check(d, msg, sizeof msg);
    if (rc)
        return ferry__fail_thread(f, rc, "ferry_add_device_custom: %s", msg);
    ferry_device_props p;
    rc = ferry_device_props_get(d, &p);
    if (rc) {
        char why[256];
        return ferry__fail_thread(f, rc, "ferry_add_device_custom: the device's props failed: %s",
                                  ferry__device_errmsg(d, why, sizeof why)[0] ? why
                                                                            : ferry_strerror(rc));
    }
    if (!p.alignment || (p.alignment & (p.alignment - 1)))
        return ferry__fail_thread(f, FERRY_EINVAL,
                                  "ferry_add_device_custom: %s: alignment %llu is not a power of "
                                  "two",
                                  p.name, (unsigned long long)p.alignment);
    if (!p.max_alloc)
        return ferry__fail_thread(f, FERRY_EINVAL,
                                  "ferry_add_device_custom: %s: max_alloc is 0", p.name);
    return add_device(f, d, &p, 0, id);
}

int ferry_device_count(const ferry *f)
{
    return f ? f->n_devs : 0;
}

int ferry_get_device_info(const ferry *f, int id, ferry_device_info *out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    ferry *m = (ferry *)f;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&m->lock);
    int rc = 0;
    if (id < 0 || id >= f->n_devs) {
        rc = ferry__fail(e, FERRY_ENOENT, "no device %d (%d devices)", id, f->n_devs);
    } else {
        ferry_device *d = f->devs[id].d;
        memset(out, 0, sizeof *out);
        out->name = f->devs[id].p.name;
        out->kind = f->devs[id].p.kind;
        out->budget = f->devs[id].budget;
        out->used_bytes = f->devs[id].used;
        out->host_accessible = f->devs[id].p.host_accessible;
        if (FERRY_DEVICE_HAS(d->ops, mem_info))
            d->ops->mem_info(d, &out->free_bytes, &out->total_bytes);
    }
    pthread_mutex_unlock(&m->lock);
    return ferry__publish(f, rc, e);
}

int ferry_set_budget(ferry *f, int device, uint64_t bytes)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    const uint64_t given = bytes;
    if (device < 0 || device >= f->n_devs) {
        rc = ferry__fail(e, FERRY_ENOENT, "no device %d (%d devices)", device, f->n_devs);
    } else {
        ferry_device *d = f->devs[device].d;
        uint64_t free_b = 0, total = 0;
        if (bytes) {
            rc = check_capacity(f, device, bytes, e);
        } else if (device == FERRY__HOST) {
            bytes = host_default_budget(f->devs[device].used);
        } else if (FERRY_DEVICE_HAS(d->ops, mem_info) &&
                   d->ops->mem_info(d, &free_b, &total) == 0) {
            free_b += f->devs[device].used; /* what ferry holds there is ferry's to budget */
            bytes = free_b > FERRY__DEVICE_MARGIN * 2 ? free_b - FERRY__DEVICE_MARGIN : free_b;
        }
    }
    if (!rc) {
        if (device == FERRY__HOST) {
            ferry__first_warm_join(f); /* its blocks were counted against the budget before */
            ferry__first_kept_drop(f);
        }
        f->devs[device].budget = bytes;
        /* pool and huge pages only under a host budget given (a no-op where
         * the device has no set_reuse); a pool left from before is trimmed by the shrink below */
        ferry__device_set_reuse(f->devs[device].d, given != 0);
        if (device == FERRY__HOST)
            f->devs[device].default_budget = !given;
        /* A smaller budget takes effect now for what is cached; what is in use stays. Prefetches
         * in flight hold reservations that cannot be evicted yet: they land first. */
        if (bytes) {
            while (f->prefetch.inflight_prefetch && !f->jobs.closing)
                pthread_cond_wait(&f->cond, &f->lock);
            ferry__shrink(f, device);
        }
        if (f->devs[device].default_budget)
            ferry__pool_trim(f, device, UINT64_MAX);
        if (device == FERRY__HOST)
            ferry__first_warm(f);
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_reserve(ferry *f, int device, uint64_t bytes)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    if (device < 0 || device >= f->n_devs) {
        rc = ferry__fail(e, FERRY_ENOENT, "no device %d (%d devices)", device, f->n_devs);
        pthread_mutex_unlock(&f->lock);
        return ferry__publish(f, rc, e);
    }
    ferry__dev *D = &f->devs[device];
    if (bytes <= D->reserved) {
        D->used -= D->reserved - bytes;
        D->reserved = bytes;
        pthread_mutex_unlock(&f->lock);
        return 0;
    }
    uint64_t more = bytes - D->reserved;
    for (;;) {
        ferry__mem m;
        rc = D->budget && bytes > D->budget ? FERRY_EBUDGET
                                            : ferry__reserve_bytes(f, device, more, &m, e);
        /* prefetches in flight hold reservations that become evictable once they land */
        if (rc != FERRY_EBUDGET || !f->prefetch.inflight_prefetch || f->jobs.closing ||
            bytes > D->budget)
            break;
        pthread_cond_wait(&f->cond, &f->lock);
    }
    if (rc == 0) {
        D->reserved = bytes;
    } else if (rc == FERRY_EBUDGET) {
        char b1[32], b2[32], b3[32], b4[32];
        ferry__fail(e, rc,
                    "%s: cannot reserve %s for the engine: budget %s, %s in use (%s of it "
                    "reserved), nothing more evictable",
                    D->p.name, ferry__fmt_size(bytes, b1), ferry__fmt_size(D->budget, b2),
                    ferry__fmt_size(D->used, b3), ferry__fmt_size(D->reserved, b4));
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

/* Whether F takes another open, lock held: not while closing, nor after an open that ran out of
 * memory half-way (the catalog then holds tensors the manager does not, and a later file's
 * tensors would not line up). */
static int open_allowed(ferry *f, const char *path, ferry__err *e)
{
    if (f->jobs.closing)
        return ferry__fail(e, FERRY_ECANCELED, "%s: the manager is closing", path);
    if (ferry_catalog_count(f->cat) != f->n_tensors)
        return ferry__fail(e, FERRY_ENOMEM,
                           "%s: an earlier open of this manager ran out of memory; create a new "
                           "manager", path);
    return 0;
}

/* Commits P into F's catalog and makes the manager's tensors for it, lock held. */
static int open_commit(ferry *f, ferry__catalog_pending *p, const char *path, ferry__err *e)
{
    size_t before = ferry_catalog_count(f->cat);
    int rc = ferry__catalog_commit(f->cat, p, e);
    if (rc)
        return rc;
    size_t after = ferry_catalog_count(f->cat);
    ferry_tensor **ts = realloc(f->tensors, (after ? after : 1) * sizeof *ts);
    if (!ts)
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    f->tensors = ts;
    for (size_t i = before; i < after; i++) {
        ferry_tensor *t = calloc(1, sizeof *t);
        if (!t) {
            /* The catalog keeps the file; tensors beyond n_tensors stay unreachable (every lookup
             * checks n_tensors), and later opens are refused. */
            return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        }
        t->id = (uint32_t)i;
        t->owner = f;
        t->dev_override = -1;
        if (ferry__register(f, t)) {
            free(t);
            return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        }
        ferry_catalog_tensor(f->cat, i, &t->info);
        t->file = ferry__catalog_file(f->cat, ferry__catalog_tensor_file(f->cat, i));
        t->group = -1;
        f->tensors[i] = t;
        f->n_tensors = i + 1;
        /* An expectation stated before the file was opened applies now. */
        uint64_t mi;
        if (ferry__hmap_get(&f->expect.expected_missing, t->info.name, &mi)) {
            const ferry__expect_rec *x = &f->expect.missing_expect[mi];
            t->has_expect = 1;
            t->expect_dtype = x->dtype;
            t->expect_ndim = x->ndim;
            memcpy(t->expect_shape, x->shape, sizeof t->expect_shape);
            ferry__hmap_del(&f->expect.expected_missing, t->info.name);
        }
    }
    return 0;
}

/* The files are opened and their headers read without the lock, so other threads keep preparing
 * and other opens parse at the same time; the state is checked again when the lock is retaken,
 * and the commit (names checked against what is open by then) is all or nothing. */
int ferry_open(ferry *f, const char *path, const char *prefix)
{
    if (!f || !path)
        return FERRY_EINVAL;
    if (!*path)
        return ferry__fail_thread(f, FERRY_EINVAL, "ferry_open: no path");
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = open_allowed(f, path, e);
    pthread_mutex_unlock(&f->lock);
    ferry__catalog_pending *p = NULL;
    if (!rc)
        rc = ferry__catalog_parse(path, prefix, &p, e);
    if (!rc) {
        pthread_mutex_lock(&f->lock);
        rc = open_allowed(f, path, e);
        if (!rc)
            rc = open_commit(f, p, path, e);
        pthread_mutex_unlock(&f->lock);
    }
    ferry__catalog_pending_free(p); /* closes what no commit took: I/O, so without the lock */
    return ferry__publish(f, rc, e);
}

const ferry_catalog *ferry_catalog_of(const ferry *f)
{
    return f ? f->cat : NULL;
}

static int find_group(const ferry *f, const char *name)
{
    for (size_t i = 0; i < f->place.n_groups; i++)
        if (!f->place.groups[i].removed && strcmp(f->place.groups[i].name, name) == 0)
            return (int)i;
    return -1;
}

int ferry_group_add(ferry *f, const char *name, const char *pattern, const ferry_policy *policy)
{
    if (!f || !name || !pattern)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    int g = find_group(f, name);
    if (g < 0) {
        ferry__group *gs = realloc(f->place.groups, (f->place.n_groups + 1) * sizeof *gs);
        if (!gs) {
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            goto out;
        }
        f->place.groups = gs;
        ferry__group *ng = &gs[f->place.n_groups];
        memset(ng, 0, sizeof *ng);
        ng->name = ferry__strdup(name);
        if (!ng->name) {
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            goto out;
        }
        if (policy)
            ng->policy = *policy;
        if (ng->policy.compute_device < 0 || ng->policy.compute_device >= f->n_devs) {
            rc = ferry__fail(e, FERRY_EINVAL,
                             "group '%s': compute device %d does not exist (%d devices)", name,
                             ng->policy.compute_device, f->n_devs);
            free(ng->name);
            goto out;
        }
        g = (int)f->place.n_groups++;
    }
    ferry__rule *rs = realloc(f->place.rules, (f->place.n_rules + 1) * sizeof *rs);
    if (!rs) {
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto out;
    }
    f->place.rules = rs;
    rs[f->place.n_rules].pattern = ferry__strdup(pattern);
    rs[f->place.n_rules].group = g;
    if (!rs[f->place.n_rules].pattern) {
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto out;
    }
    f->place.n_rules++;
    rc = ferry__rebind_all(f, 1, e);
    if (rc) {
        f->place.n_rules--;
        free(rs[f->place.n_rules].pattern);
        goto out;
    }
    ferry__rebind_all(f, 0, NULL);
    ferry__first_warm(f);
out:
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

static int add_pattern(ferry *f, char ***list, size_t *n, const char *pattern)
{
    if (!f || !pattern)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    char **l = realloc(*list, (*n + 1) * sizeof *l);
    char *p = ferry__strdup(pattern);
    if (l)
        *list = l;
    if (!l || !p) {
        free(p);
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto out;
    }
    l[(*n)++] = p;
    rc = ferry__rebind_all(f, 1, e);
    if (rc) {
        free(l[--(*n)]);
        goto out;
    }
    ferry__rebind_all(f, 0, NULL);
    ferry__first_warm(f);
out:
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_ignore(ferry *f, const char *pattern)
{
    return f ? add_pattern(f, &f->place.ignore, &f->place.n_ignore, pattern) : FERRY_EINVAL;
}

int ferry_optional(ferry *f, const char *pattern)
{
    return f ? add_pattern(f, &f->place.optional, &f->place.n_optional, pattern) : FERRY_EINVAL;
}

int ferry_group_remove(ferry *f, const char *name)
{
    if (!f || !name)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int g = find_group(f, name);
    int rc = 0;
    if (g < 0) {
        rc = ferry__fail(e, FERRY_ENOENT, "no group '%s'", name);
        goto out;
    }
    ferry__fences_reap(f); /* releases whose events have completed count as done */
    /* From here on prepares of its tensors are refused, so none can start while this waits. */
    f->place.groups[g].removing = 1;
    for (size_t i = 0; i < f->n_all; i++) { /* slices are held on their own */
        ferry_tensor *t = f->all[i];
        if (t->group == g && t->refs > 0) {
            f->place.groups[g].removing = 0;
            rc = ferry__fail(e, FERRY_EBUSY,
                             "group '%s': tensor '%s' is prepared (%d references)", name,
                             t->info.name, t->refs);
            goto out;
        }
    }
    /* Wait for jobs on its tensors to finish; a job never outlives its tensor's memory. */
    for (;;) {
        int busy = 0;
        for (size_t i = 0; i < f->n_all && !busy; i++) {
            ferry_tensor *t = f->all[i];
            busy = t->group == g && (t->comp.state == FERRY__LOADING ||
                                     t->host.state == FERRY__LOADING || t->populating);
        }
        if (!busy)
            break;
        pthread_cond_wait(&f->cond, &f->lock);
    }
    for (size_t i = 0; i < f->n_all; i++) {
        ferry_tensor *t = f->all[i];
        if (t->group != g)
            continue;
        ferry__drop_copy(f, t, &t->comp);
        ferry__drop_copy(f, t, &t->host);
        t->removed = 1;
    }
    f->place.groups[g].removed = 1;
    ferry__sched_reset(&f->sched);
out:
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

ferry_tensor *ferry_find(ferry *f, const char *name)
{
    if (!f || !name)
        return NULL;
    pthread_mutex_lock(&f->lock);
    ferry_tensor *t = NULL;
    int64_t i = ferry_catalog_find(f->cat, name);
    if (i >= 0 && (size_t)i < f->n_tensors) {
        /* Looking a tensor up is no use of it: only whether it is ignored matters here, not
         * whether its placement works out (that is prepare's business). */
        t = f->tensors[i];
        if (t->removed || ferry__is_ignored(f, t))
            t = NULL;
    }
    int missing = !t && (i < 0 || (size_t)i >= f->n_tensors);
    pthread_mutex_unlock(&f->lock);
    if (missing)
        ferry__fail_thread(f, FERRY_ENOENT, "no tensor '%s'", name);
    return t;
}

int ferry_tensor_get_info(const ferry_tensor *t, ferry_tensor_info *out)
{
    if (!t || !out)
        return FERRY_EINVAL;
    *out = t->info;
    return 0;
}

int ferry_get_stats(const ferry *f, ferry_stats *out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    ferry *m = (ferry *)f;
    pthread_mutex_lock(&m->lock);
    *out = f->stats;
    for (int d = 0; d < f->n_devs; d++) {
        out->resident_bytes[d] = f->devs[d].used;
        out->peak_bytes[d] = f->devs[d].peak;
    }
    out->home_host_bytes = out->home_device_bytes = out->cached_bytes = 0;
    for (size_t i = 0; i < f->n_all; i++) {
        const ferry_tensor *t = f->all[i];
        if (t->host.state == FERRY__READY && !t->host.mapped)
            out->home_host_bytes += t->host.mem.size;
        const ferry__copy *c = &t->comp;
        if (c->state != FERRY__READY || c->mapped)
            continue;
        if (c->permanent && c->dev == FERRY__HOST)
            out->home_host_bytes += c->mem.size;
        else if (c->permanent)
            out->home_device_bytes += c->mem.size;
        else if (!t->refs)
            out->cached_bytes += c->mem.size;
    }
    out->bytes_read = __atomic_load_n(&f->a_bytes_read, __ATOMIC_RELAXED);
    out->bytes_copied = __atomic_load_n(&f->a_bytes_copied, __ATOMIC_RELAXED);
    out->locked_bytes = __atomic_load_n(&f->a_locked_bytes, __ATOMIC_RELAXED);
    out->lock_failures = __atomic_load_n(&f->a_lock_failures, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&m->lock);
    return 0;
}
