/*
 * devbase.c — what every device shares: the calling thread's latest failure and its message, the
 * base struct's initialisation and properties, formatted errors, closing, and the operations
 * with fallbacks the core calls on any device (a missing optional op falls back or is refused).
 */
#include "devices/devices.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The calling thread's latest device failure: which device, and the message. */
static _Thread_local const ferry_device *fail_dev;
static _Thread_local char fail_msg[256];

int ferry__device_fail(ferry_device *d, int code, const char *fmt, ...)
{
    if (!d)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
    va_end(ap);
    fail_dev = d;
    return code;
}

char *ferry__device_errmsg_op(ferry_device *d, char *buf, size_t len)
{
    if (buf && len)
        snprintf(buf, len, "%s", d && fail_dev == d ? fail_msg : "");
    return buf;
}

int ferry__device_props_op(ferry_device *d, ferry_device_props *out)
{
    *out = FERRY__DP(d);
    return 0;
}

char *ferry__device_errmsg(const ferry_device *d, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    buf[0] = 0;
    if (d && d->ops && FERRY_DEVICE_HAS(d->ops, errmsg)) {
        d->ops->errmsg((ferry_device *)d, buf, len);
        buf[len - 1] = 0;
    }
    return buf;
}

void ferry__device_init(ferry__devbase *d, const ferry_device_ops *ops, const char *spec,
                        const char *kind, uint64_t alignment, uint64_t max_alloc,
                        int host_accessible)
{
    d->pub.ops = ops;
    d->pub.user = d;
    /* The name is for people; a long spec is cut, never refused for its length. */
    snprintf(d->props.name, sizeof d->props.name, "%s", spec);
    snprintf(d->props.kind, sizeof d->props.kind, "%s", kind);
    d->props.alignment = alignment;
    d->props.max_alloc = max_alloc;
    d->props.host_accessible = host_accessible;
}

int ferry__device_has_events(const ferry_device *d)
{
    const ferry_device_ops *o = d ? d->ops : NULL;
    return o && FERRY_DEVICE_HAS(o, event_create) && FERRY_DEVICE_HAS(o, event_destroy) &&
           FERRY_DEVICE_HAS(o, event_record) && FERRY_DEVICE_HAS(o, event_wait) &&
           FERRY_DEVICE_HAS(o, event_query);
}

int ferry__device_has_reuse(const ferry_device *d)
{
    const ferry_device_ops *o = d ? d->ops : NULL;
    return o && FERRY_DEVICE_HAS(o, set_reuse) && FERRY_DEVICE_HAS(o, block) &&
           FERRY_DEVICE_HAS(o, stitch);
}

void ferry__device_set_reuse(ferry_device *d, int reuse)
{
    if (ferry__device_has_reuse(d))
        d->ops->set_reuse(d, reuse);
}

int ferry__device_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments)
{
    return ferry__device_has_reuse(d) ? d->ops->block(d, p, size, segments) : 0;
}

FERRY_API int ferry_device_props_get(ferry_device *d, ferry_device_props *out)
{
    if (!d || !d->ops || !d->ops->props || !out)
        return FERRY_EINVAL;
    memset(out, 0, sizeof *out);
    int rc = d->ops->props(d, out);
    out->name[sizeof out->name - 1] = 0;
    out->kind[sizeof out->kind - 1] = 0;
    return rc;
}

int ferry__device_seterr(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

FERRY_API void ferry_device_close(ferry_device *d)
{
    if (d)
        d->ops->destroy(d);
}

/* ---- operations with fallbacks ----------------------------------------------------------------- */

int ferry__device_read(ferry_device *d, void *dst, const void *src, uint64_t n)
{
    if (FERRY_DEVICE_HAS(d->ops, read_sync))
        return d->ops->read_sync(d, dst, src, n);
    if (!FERRY_DEVICE_HAS(d->ops, copy_d2h))
        return FERRY_EUNSUPPORTED;
    uint64_t t;
    int rc = d->ops->copy_d2h(d, dst, src, n, &t);
    return rc ? rc : d->ops->wait(d, t);
}

int ferry__device_write(ferry_device *d, void *dst, const void *src, uint64_t n)
{
    uint64_t t;
    int rc = d->ops->copy_h2d(d, dst, src, n, &t);
    return rc ? rc : d->ops->wait(d, t);
}

int ferry__device_host_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    if (FERRY_DEVICE_HAS(d->ops, host_alloc))
        return d->ops->host_alloc(d, size, ptr);
    *ptr = ferry__host_aligned_alloc(size, 4096);
    return *ptr ? 0 : FERRY_ENOMEM;
}

void ferry__device_host_free(ferry_device *d, void *ptr)
{
    if (FERRY_DEVICE_HAS(d->ops, host_free))
        d->ops->host_free(d, ptr);
    else
        ferry__host_free(ptr);
}
