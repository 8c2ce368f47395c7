/*
 * device.c — opening devices from their spec strings and checking a device's operation table.
 *
 * A spec is "cpu", "sim[:CAPACITY[@RATE]][,key=value...]" or "cuda[:N]". The spec is parsed
 * completely here, so a mistake is refused with FERRY_EINVAL and a message that quotes the bad
 * part ("sim:8XB: bad capacity '8XB'") before any device is built. The constructors live in
 * cpu.c, sim.c, cuda.c and fault.c; what they share, in devbase.c.
 */
#include "devices/devices.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checking a table ------------------------------------------------------------------------ */


FERRY_API int ferry_device_check(const ferry_device *d, char *errmsg, size_t errlen)
{
    if (errmsg && errlen)
        errmsg[0] = 0;
    if (!d)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL, "device is NULL");
    const ferry_device_ops *o = d->ops;
    if (!o)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL, "device has no operation table");
    if (o->version != FERRY_DEVICE_OPS_VERSION)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table of version %u: this ferry knows version %d only "
                      "(rebuild the device against this ferry_device.h)",
                      (unsigned)o->version, FERRY_DEVICE_OPS_VERSION);
    /* the required members come first and must lie inside the size; optional ones past it are
     * read as NULL (FERRY_DEVICE_HAS) */
    size_t need = offsetof(ferry_device_ops, wait) + sizeof o->wait;
    if (o->size < need)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table of %u bytes ends before its required members "
                      "(%zu bytes)", (unsigned)o->size, need);
    static const struct {
        size_t off;
        const char *name;
    } required[] = {
        {offsetof(ferry_device_ops, destroy), "destroy"},
        {offsetof(ferry_device_ops, props), "props"},
        {offsetof(ferry_device_ops, alloc), "alloc"},
        {offsetof(ferry_device_ops, free), "free"},
        {offsetof(ferry_device_ops, copy_h2d), "copy_h2d"},
        {offsetof(ferry_device_ops, wait), "wait"},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        void *fn;
        memcpy(&fn, (const char *)o + required[i].off, sizeof fn);
        if (!fn)
            return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                          "device operation table: required member %s is NULL", required[i].name);
    }
    int ev = FERRY_DEVICE_HAS(o, event_create) + FERRY_DEVICE_HAS(o, event_destroy) +
             FERRY_DEVICE_HAS(o, event_record) + FERRY_DEVICE_HAS(o, event_wait) +
             FERRY_DEVICE_HAS(o, event_query);
    if (ev != 0 && ev != 5)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table: %d of the 5 event members set (all or none)", ev);
    int ru = FERRY_DEVICE_HAS(o, set_reuse) + FERRY_DEVICE_HAS(o, block) +
             FERRY_DEVICE_HAS(o, stitch);
    if (ru != 0 && ru != 3)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table: %d of set_reuse, block, stitch set (all or none)",
                      ru);
    if (FERRY_DEVICE_HAS(o, host_alloc) != FERRY_DEVICE_HAS(o, host_free))
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table: host_alloc and host_free go together");
    if (FERRY_DEVICE_HAS(o, host_register) != FERRY_DEVICE_HAS(o, host_unregister))
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "device operation table: host_register and host_unregister go together");
    return 0;
}

/* ---- spec parsing ------------------------------------------------------------------------------ */

/* A plain decimal count: digits only, no sign, fits uint64_t. */
static int parse_count(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)*s))
        return FERRY_EINVAL;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s))
            return FERRY_EINVAL;
        if (ferry__mul_u64(v, 10, &v) || ferry__add_u64(v, (uint64_t)(*s - '0'), &v))
            return FERRY_EINVAL;
    }
    *out = v;
    return 0;
}

/* "N" or "N/every". */
static int parse_fault(const char *s, uint64_t *n, int *every)
{
    char buf[64];
    const char *slash = strchr(s, '/');
    size_t len = slash ? (size_t)(slash - s) : strlen(s);
    if (len == 0 || len >= sizeof buf)
        return FERRY_EINVAL;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (parse_count(buf, n))
        return FERRY_EINVAL;
    *every = 0;
    if (slash) {
        if (strcmp(slash + 1, "every") != 0)
            return FERRY_EINVAL;
        *every = 1;
    }
    return 0;
}

static int parse_sim(const char *spec, const char *rest, ferry__sim_config *cfg, char *err,
                     size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->capacity = FERRY__SIM_DEFAULT_CAPACITY;
    cfg->alignment = FERRY__SIM_DEFAULT_ALIGN;
    cfg->poison = 1;
    int max_alloc_set = 0;

    /* Work on a copy split at ',' (options) and '@' (rate). */
    size_t len = strlen(rest);
    char *buf = malloc(len + 1);
    if (!buf)
        return ferry__device_seterr(err, errlen, FERRY_ENOMEM, "%s: out of memory", spec);
    memcpy(buf, rest, len + 1);
    int rc = 0;
    char *opts = strchr(buf, ',');
    if (opts)
        *opts++ = 0;
    char *head = buf; /* "" or ":CAP" or ":CAP@RATE" or "@RATE" */
    char *at = strchr(head, '@');
    if (at)
        *at++ = 0;
    if (*head) {
        if (*head != ':') {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                        "%s: unknown device (expected cpu, sim[:CAPACITY[@RATE]][,OPTION...] or "
                        "cuda:N)", spec);
            goto out;
        }
        head++;
        if (!*head) {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                      "%s: missing capacity after ':'", spec);
            goto out;
        }
        if (ferry__parse_size(head, &cfg->capacity)) {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                      "%s: bad capacity '%s'", spec, head);
            goto out;
        }
        if (cfg->capacity == 0) {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                      "%s: capacity must be more than 0", spec);
            goto out;
        }
    }
    if (at) {
        if (ferry__parse_rate(at, &cfg->rate) || cfg->rate == 0) {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                        "%s: bad bandwidth '%s' (expected e.g. 25GB/s or 800MiB/s)", spec, at);
            goto out;
        }
    }
    while (opts) {
        char *next = strchr(opts, ',');
        if (next)
            *next++ = 0;
        char *eq = strchr(opts, '=');
        if (!eq || eq == opts) {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                      "%s: bad option '%s' (expected key=value)",
                        spec, opts);
            goto out;
        }
        *eq = 0;
        const char *key = opts, *val = eq + 1;
        if (strcmp(key, "fail_alloc") == 0) {
            if (parse_fault(val, &cfg->fail_alloc, &cfg->fail_alloc_every)) {
                rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                            "%s: bad fail_alloc '%s' (expected N or N/every)", spec, val);
                goto out;
            }
        } else if (strcmp(key, "fail_copy") == 0) {
            if (parse_fault(val, &cfg->fail_copy, &cfg->fail_copy_every)) {
                rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                            "%s: bad fail_copy '%s' (expected N or N/every)", spec, val);
                goto out;
            }
        } else if (strcmp(key, "max_alloc") == 0) {
            if (ferry__parse_size(val, &cfg->max_alloc) || cfg->max_alloc == 0) {
                rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                          "%s: bad max_alloc '%s'", spec, val);
                goto out;
            }
            max_alloc_set = 1;
        } else if (strcmp(key, "align") == 0) {
            uint64_t a;
            if (ferry__parse_size(val, &a) || a == 0 || (a & (a - 1)) || a > (UINT64_C(1) << 21)) {
                rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                            "%s: bad align '%s' (expected a power of two from 1 to 2MiB)", spec,
                            val);
                goto out;
            }
            cfg->alignment = a;
        } else if (strcmp(key, "poison") == 0) {
            if (strcmp(val, "0") && strcmp(val, "1")) {
                rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                          "%s: bad poison '%s' (expected 0 or 1)",
                            spec, val);
                goto out;
            }
            cfg->poison = val[0] == '1';
        } else {
            rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                        "%s: unknown option '%s' (known: fail_alloc, fail_copy, max_alloc, align, "
                        "poison)", spec, key);
            goto out;
        }
        opts = next;
    }
    if (!max_alloc_set) {
        cfg->max_alloc = cfg->capacity;
    } else if (cfg->max_alloc > cfg->capacity) {
        char a[32], b[32];
        rc = ferry__device_seterr(err, errlen, FERRY_EINVAL,
                                  "%s: max_alloc %s exceeds the capacity %s", spec,
                    ferry__fmt_size(cfg->max_alloc, a), ferry__fmt_size(cfg->capacity, b));
        goto out;
    }
out:
    free(buf);
    return rc;
}

FERRY_API int ferry_device_open(const char *spec, ferry_device **out, char *errmsg, size_t errlen)
{
    if (errmsg && errlen)
        errmsg[0] = 0;
    if (!out)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL, "ferry_device_open: OUT is NULL");
    *out = NULL;
    if (!spec || !*spec)
        return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                      "empty device spec (expected cpu, sim[:CAPACITY[@RATE]] or cuda:N)");

    if (strcmp(spec, "cpu") == 0)
        return ferry__cpu_open(spec, out, errmsg, errlen);

    if (strncmp(spec, "fault:", 6) == 0)
        return ferry__fault_open(spec, ferry_device_open, errmsg, errlen, out);

    if (strncmp(spec, "sim", 3) == 0 && strchr(":@,", spec[3])) {
        ferry__sim_config cfg;
        int rc = parse_sim(spec, spec + 3, &cfg, errmsg, errlen);
        if (rc)
            return rc;
        return ferry__sim_open(spec, &cfg, out, errmsg, errlen);
    }

    if (strncmp(spec, "cuda", 4) == 0 && (spec[4] == 0 || spec[4] == ':')) {
        uint64_t n = 0;
        if (spec[4] == ':' && (parse_count(spec + 5, &n) || n > 1024))
            return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                          "%s: bad CUDA device number '%s' (expected cuda:N, N >= 0)", spec,
                          spec + 5);
        return ferry__cuda_open(spec, (int)n, out, errmsg, errlen);
    }

    return ferry__device_seterr(errmsg, errlen, FERRY_EINVAL,
                  "%s: unknown device (expected cpu, sim[:CAPACITY[@RATE]][,OPTION...] or cuda:N)",
                  spec);
}
