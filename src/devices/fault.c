/*
 * fault.c — the "fault:" device: wraps any other device and fails its N-th allocation or copy,
 * once or every N-th (as SQLite's test VFS wraps a parent VFS), so that every error path of the
 * core can be driven on cpu and cuda as well as on sim.
 *
 * "fault:SPEC[,fail_alloc=N[/every]][,fail_copy=M[/every]]": the trailing fail_ options are the
 * wrapper's, the rest is the wrapped device's spec. An injected allocation failure is FERRY_ENOMEM
 * and allocates nothing; an injected copy failure lets the copy run and makes its wait return
 * FERRY_EDEVICE, as a device whose transfer broke would. Everything else is passed through, with
 * the same tickets, properties (the name is the whole spec) and optional members.
 */
#include "devices/devices.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_MAX_DOOMED 64 /* injected copy failures not yet waited on */

typedef struct fault_device {
    ferry__devbase base; /* first: a fault_device * is a ferry_device * */
    ferry_device *inner;
    ferry_device_ops ops; /* the inner table's optional members, mirrored */
    uint64_t fail_alloc, fail_copy;
    int alloc_every, copy_every;
    pthread_mutex_t lock; /* guards the counters and doomed[] */
    uint64_t alloc_calls, copy_calls;
    uint64_t doomed[FAULT_MAX_DOOMED]; /* tickets whose wait reports the injected failure */
    size_t n_doomed;
} fault_device;

#define INNER(d) (((fault_device *)(d))->inner)

static int nth(uint64_t count, uint64_t n, int every)
{
    return n && (every ? count % n == 0 : count == n);
}

static void fault_destroy(ferry_device *d)
{
    fault_device *f = (fault_device *)d;
    ferry_device_close(f->inner);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static char *fault_errmsg(ferry_device *d, char *buf, size_t len)
{
    ferry__device_errmsg_op(d, buf, len);
    if (buf && len && !buf[0])
        ferry__device_errmsg(INNER(d), buf, len);
    return buf;
}

static int fault_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    fault_device *f = (fault_device *)d;
    pthread_mutex_lock(&f->lock);
    uint64_t call = ++f->alloc_calls;
    int fail = nth(call, f->fail_alloc, f->alloc_every);
    pthread_mutex_unlock(&f->lock);
    if (fail) {
        *ptr = NULL;
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: allocation %llu of %llu bytes failed (injected)",
                                  FERRY__DP(d).name, (unsigned long long)call,
                                  (unsigned long long)size);
    }
    return f->inner->ops->alloc(f->inner, size, ptr);
}

static void fault_free(ferry_device *d, void *ptr)
{
    INNER(d)->ops->free(INNER(d), ptr);
}

/* Runs the copy on the inner device; the injected one is remembered by its ticket. */
static int fault_copy(ferry_device *d, int h2d, void *dst, const void *src, uint64_t n,
                      uint64_t *ticket)
{
    fault_device *f = (fault_device *)d;
    int rc = h2d ? f->inner->ops->copy_h2d(f->inner, dst, src, n, ticket)
                 : f->inner->ops->copy_d2h(f->inner, dst, src, n, ticket);
    if (rc)
        return rc;
    pthread_mutex_lock(&f->lock);
    uint64_t call = ++f->copy_calls;
    if (nth(call, f->fail_copy, f->copy_every) && f->n_doomed < FAULT_MAX_DOOMED)
        f->doomed[f->n_doomed++] = *ticket;
    pthread_mutex_unlock(&f->lock);
    return 0;
}

static int fault_copy_h2d(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *t)
{
    return fault_copy(d, 1, dst, src, n, t);
}

static int fault_copy_d2h(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *t)
{
    return fault_copy(d, 0, dst, src, n, t);
}

static int fault_wait(ferry_device *d, uint64_t ticket)
{
    fault_device *f = (fault_device *)d;
    int rc = f->inner->ops->wait(f->inner, ticket);
    int doomed = 0;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_doomed; i++) {
        if (f->doomed[i] == ticket) {
            f->doomed[i] = f->doomed[--f->n_doomed];
            doomed = 1;
            break;
        }
    }
    pthread_mutex_unlock(&f->lock);
    if (doomed && !rc)
        return ferry__device_fail(d, FERRY_EDEVICE, "%s: copy (ticket %llu) failed (injected)",
                                  FERRY__DP(d).name, (unsigned long long)ticket);
    return rc;
}

static int fault_synchronize(ferry_device *d)
{
    return INNER(d)->ops->synchronize(INNER(d));
}

static int fault_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    return INNER(d)->ops->mem_info(INNER(d), free_bytes, total_bytes);
}

static int fault_host_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    return INNER(d)->ops->host_alloc(INNER(d), size, ptr);
}

static void fault_host_free(ferry_device *d, void *ptr)
{
    INNER(d)->ops->host_free(INNER(d), ptr);
}

static int fault_host_register(ferry_device *d, void *ptr, uint64_t n)
{
    return INNER(d)->ops->host_register(INNER(d), ptr, n);
}

static void fault_host_unregister(ferry_device *d, void *ptr)
{
    INNER(d)->ops->host_unregister(INNER(d), ptr);
}

static int fault_read_sync(ferry_device *d, void *dst, const void *src, uint64_t n)
{
    return INNER(d)->ops->read_sync(INNER(d), dst, src, n);
}

static int fault_event_create(ferry_device *d, void **ev)
{
    return INNER(d)->ops->event_create(INNER(d), ev);
}

static void fault_event_destroy(ferry_device *d, void *ev)
{
    INNER(d)->ops->event_destroy(INNER(d), ev);
}

static int fault_event_record(ferry_device *d, void *ev, void *stream)
{
    return INNER(d)->ops->event_record(INNER(d), ev, stream);
}

static int fault_event_wait(ferry_device *d, void *ev, void *stream)
{
    return INNER(d)->ops->event_wait(INNER(d), ev, stream);
}

static int fault_event_query(ferry_device *d, void *ev)
{
    return INNER(d)->ops->event_query(INNER(d), ev);
}

static void fault_set_reuse(ferry_device *d, int reuse)
{
    INNER(d)->ops->set_reuse(INNER(d), reuse);
}

static int fault_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments)
{
    return INNER(d)->ops->block(INNER(d), p, size, segments);
}

static int fault_stitch(ferry_device *d, void *const *parts, size_t n, uint64_t need, void **out,
                        uint64_t *out_size, void **rest, uint64_t *rest_size, int *gone)
{
    return INNER(d)->ops->stitch(INNER(d), parts, n, need, out, out_size, rest, rest_size, gone);
}

/* "N" or "N/every", N >= 1. */
static int parse_nth(const char *s, uint64_t *n, int *every)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (v == 0 || v == ULLONG_MAX)
        return -1;
    *every = 0;
    if (strcmp(end, "/every") == 0)
        *every = 1;
    else if (*end)
        return -1;
    *n = v;
    return 0;
}

int ferry__fault_open(const char *spec, ferry__device_opener open_inner, char *err, size_t errlen,
                      ferry_device **out)
{
    *out = NULL;
    size_t len = strlen(spec);
    char *buf = malloc(len + 1);
    fault_device *f = calloc(1, sizeof *f);
    if (!buf || !f) {
        free(buf);
        free(f);
        return ferry__device_seterr(err, errlen, FERRY_ENOMEM, "%s: out of memory", spec);
    }
    memcpy(buf, spec, len + 1);
    char *inner = buf + 6; /* after "fault:" */
    /* trailing fail_alloc= / fail_copy= options are the wrapper's */
    for (;;) {
        char *comma = strrchr(inner, ',');
        if (!comma)
            break;
        char *opt = comma + 1;
        uint64_t *n;
        int *every;
        const char *val;
        if (strncmp(opt, "fail_alloc=", 11) == 0) {
            n = &f->fail_alloc, every = &f->alloc_every, val = opt + 11;
        } else if (strncmp(opt, "fail_copy=", 10) == 0) {
            n = &f->fail_copy, every = &f->copy_every, val = opt + 10;
        } else {
            break;
        }
        if (parse_nth(val, n, every)) {
            int rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                  "%s: bad option '%s' (expected N or N/every, N >= 1)", spec, opt);
            free(buf);
            free(f);
            return rc;
        }
        *comma = 0;
    }
    if (!*inner || strncmp(inner, "fault:", 6) == 0) {
        int rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                              "%s: expected fault:DEVICE[,fail_alloc=N][,fail_copy=M] with DEVICE "
                              "cpu, sim... or cuda:N", spec);
        free(buf);
        free(f);
        return rc;
    }
    char ierr[256] = "";
    int rc = open_inner(inner, &f->inner, ierr, sizeof ierr);
    if (rc) {
        ferry__device_seterr(err, errlen, rc, "%s: %s", spec, ierr[0] ? ierr : ferry_strerror(rc));
        free(buf);
        free(f);
        return rc;
    }
    free(buf);
    ferry_device_props ip;
    ferry_device_props_get(f->inner, &ip);
    const ferry_device_ops *io = f->inner->ops;
    ferry_device_ops *o = &f->ops;
    o->version = FERRY_DEVICE_OPS_VERSION;
    o->size = sizeof *o;
    o->destroy = fault_destroy;
    o->props = ferry__device_props_op;
    o->alloc = fault_alloc;
    o->free = fault_free;
    o->copy_h2d = fault_copy_h2d;
    o->wait = fault_wait;
    o->errmsg = fault_errmsg;
    /* the optional members are the inner device's: what it lacks, the wrapper lacks */
    o->copy_d2h = FERRY_DEVICE_HAS(io, copy_d2h) ? fault_copy_d2h : NULL;
    o->synchronize = FERRY_DEVICE_HAS(io, synchronize) ? fault_synchronize : NULL;
    o->mem_info = FERRY_DEVICE_HAS(io, mem_info) ? fault_mem_info : NULL;
    if (FERRY_DEVICE_HAS(io, host_alloc) && FERRY_DEVICE_HAS(io, host_free)) {
        o->host_alloc = fault_host_alloc;
        o->host_free = fault_host_free;
    }
    if (FERRY_DEVICE_HAS(io, host_register) && FERRY_DEVICE_HAS(io, host_unregister)) {
        o->host_register = fault_host_register;
        o->host_unregister = fault_host_unregister;
    }
    o->read_sync = FERRY_DEVICE_HAS(io, read_sync) ? fault_read_sync : NULL;
    if (ferry__device_has_events(f->inner)) {
        o->event_create = fault_event_create;
        o->event_destroy = fault_event_destroy;
        o->event_record = fault_event_record;
        o->event_wait = fault_event_wait;
        o->event_query = fault_event_query;
    }
    if (ferry__device_has_reuse(f->inner)) {
        o->set_reuse = fault_set_reuse;
        o->block = fault_block;
        o->stitch = fault_stitch;
    }
    ferry__device_init(&f->base, o, spec, ip.kind, ip.alignment, ip.max_alloc,
                       ip.host_accessible);
    pthread_mutex_init(&f->lock, NULL);
    *out = &f->base.pub;
    return 0;
}
