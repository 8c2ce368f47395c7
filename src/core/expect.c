/*
 * expect.c — expectations: the dtype and shape the engine states for a tensor, checked when it is
 * prepared (ferry__check_expect) and, with every other problem a model has, by ferry_validate.
 * An expectation of a tensor no file has yet waits in ferry.expect; a file opened later that
 * has it picks it up (manager.c, ferry_open).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static void fmt_shape(char *buf, size_t n, uint32_t ndim, const int64_t *shape)
{
    size_t len = 0;
    len += (size_t)snprintf(buf + len, n - len, "[");
    for (uint32_t i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

/* Checks T against its expectation; appends a line to the error report. 0 when it fits. */
static int check_expect(ferry__err *rep, const ferry_tensor *t, int append)
{
    if (!t->has_expect)
        return 0;
    int rc = 0;
    char want[200], got[200];
    if (t->expect_dtype != FERRY_DTYPE_NONE && t->expect_dtype != t->info.dtype) {
        rc = FERRY_EDTYPE;
        if (append)
            ferry__fail_append(rep, rc, "%s: tensor '%s': expected dtype %s, found %s",
                               t->info.file, t->info.name, ferry_dtype_name(t->expect_dtype),
                               ferry_dtype_name(t->info.dtype));
    }
    if (t->expect_ndim &&
        (t->expect_ndim != t->info.ndim ||
         memcmp(t->expect_shape, t->info.shape, t->info.ndim * sizeof(int64_t)) != 0)) {
        fmt_shape(want, sizeof want, t->expect_ndim, t->expect_shape);
        fmt_shape(got, sizeof got, t->info.ndim, t->info.shape);
        if (!rc)
            rc = FERRY_ESHAPE;
        if (append)
            ferry__fail_append(rep, FERRY_ESHAPE,
                               "%s: tensor '%s': expected shape %s, found %s", t->info.file,
                               t->info.name, want, got);
    }
    return rc;
}

int ferry__check_expect(const ferry_tensor *t, ferry__err *e)
{
    if (!t->has_expect || !check_expect(NULL, t, 0))
        return 0;
    ferry__err_clear(e);
    return check_expect(e, t, 1);
}

int ferry_expect(ferry *f, const char *name, ferry_dtype dtype, uint32_t ndim,
                 const int64_t *shape)
{
    if (!f || !name || ndim > FERRY_MAX_DIMS || (ndim && !shape))
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    int64_t i = ferry_catalog_find(f->cat, name);
    if (i >= 0 && (size_t)i < f->n_tensors) {
        ferry_tensor *t = f->tensors[i];
        t->has_expect = 1;
        t->expect_dtype = dtype;
        t->expect_ndim = ndim;
        memset(t->expect_shape, 0, sizeof t->expect_shape);
        if (ndim)
            memcpy(t->expect_shape, shape, ndim * sizeof *shape);
        goto out;
    }
    /* Not (yet) present: remember it; ferry_validate reports it unless optional, and a file
     * opened later that has it picks the expectation up. */
    uint64_t mi;
    if (!ferry__hmap_get(&f->expect.expected_missing, name, &mi)) {
        char **names = realloc(f->expect.missing_names, (f->expect.n_missing + 1) * sizeof *names);
        if (names)
            f->expect.missing_names = names;
        ferry__expect_rec *recs =
            realloc(f->expect.missing_expect, (f->expect.n_missing + 1) * sizeof *recs);
        if (recs)
            f->expect.missing_expect = recs;
        char *copy = ferry__strdup(name);
        if (!names || !recs || !copy) {
            free(copy);
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            goto out;
        }
        names[f->expect.n_missing] = copy;
        mi = f->expect.n_missing++;
        if (ferry__hmap_put(&f->expect.expected_missing, copy, mi, NULL)) {
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            goto out;
        }
    }
    ferry__expect_rec *x = &f->expect.missing_expect[mi];
    x->dtype = dtype;
    x->ndim = ndim;
    memset(x->shape, 0, sizeof x->shape);
    if (ndim)
        memcpy(x->shape, shape, ndim * sizeof *shape);
out:
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_validate(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err *rep = malloc(sizeof *rep);
    if (!rep)
        return ferry__fail_thread(f, FERRY_ENOMEM, "out of memory");
    pthread_mutex_lock(&f->lock);
    ferry__err_clear(rep);
    ferry__buf long_rep = {0};
    for (size_t i = 0; i < f->n_tensors; i++) {
        ferry_tensor *t = f->tensors[i];
        if (t->removed)
            continue;
        ferry__err one = {0};
        int rc = ferry__bind(f, t, &one);
        if (rc)
            one.code = rc;
        else if (!t->ignored)
            check_expect(&one, t, 1);
        if (one.code) {
            ferry__fail_append(rep, one.code, "%s", one.msg);
            ferry__buf_printf(&long_rep, "%s%s", long_rep.len ? "\n" : "", one.msg);
        }
    }
    for (size_t i = 0; i < f->expect.n_missing; i++) {
        const char *name = f->expect.missing_names[i];
        if (!ferry__hmap_get(&f->expect.expected_missing, name, NULL))
            continue; /* found in a file opened later */
        int ignored = 0, optional = 0;
        for (size_t k = 0; k < f->place.n_ignore; k++)
            ignored |= ferry__glob(f->place.ignore[k], name);
        for (size_t k = 0; k < f->place.n_optional; k++)
            optional |= ferry__glob(f->place.optional[k], name);
        if (!ignored && !optional) {
            ferry__fail_append(rep, FERRY_ENOENT,
                               "tensor '%s': required but not found in any opened file", name);
            ferry__buf_printf(&long_rep, "%stensor '%s': required but not found in any opened file",
                              long_rep.len ? "\n" : "", name);
        }
    }
    pthread_mutex_unlock(&f->lock);
    int rc = rep->code;
    /* the whole report goes with it, when it did not fit the error buffer */
    int fits = long_rep.len < sizeof rep->msg;
    if (fits)
        free(long_rep.p);
    ferry__publish_long(f, rc, rep, fits ? NULL : long_rep.p, long_rep.len);
    free(rep);
    return rc;
}
