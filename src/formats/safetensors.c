/*
 * safetensors.c — the safetensors reader and header writer.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (an object: an
 * optional "__metadata__" object of string -> string, and one member per tensor with "dtype",
 * "shape" and "data_offsets" [begin, end) relative to the data section), then the data section
 * starting at 8 + N. The reader trusts nothing: the header length is bounded, the JSON is parsed
 * strictly (json.c), every tensor's byte range must agree exactly with shape x dtype (products
 * checked for overflow) and lie inside the file, and no two ranges may overlap. Gaps between
 * tensors are allowed (real files have them).
 *
 * The writer (serialize) produces the header for tensors packed contiguously in the given order,
 * padded with spaces so that the data section starts at a multiple of 8.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype/dtype.h"
#include "formats/formats.h"
#include "formats/json_priv.h"

/* ---- reader ---------------------------------------------------------------------------------- */

/* Kinds of a JSON number for our purposes. */
enum { NUM_OK = 0, NUM_NOT_UINT = 1, NUM_TOO_BIG = 2 };

/* A non-negative integer written without sign, fraction or exponent, up to 2^64-1. */
static int json_uint(const ferry__json *j, uint64_t *out)
{
    if (!j || j->type != FERRY__JSON_NUMBER)
        return NUM_NOT_UINT;
    for (size_t i = 0; i < j->num_len; i++)
        if (j->num[i] < '0' || j->num[i] > '9')
            return NUM_NOT_UINT;
    return ferry__json_u64(j, out) ? NUM_TOO_BIG : NUM_OK;
}

/* A JSON value as a short text for messages. */
static const char *json_show(const ferry__json *j, char buf[80])
{
    switch (j->type) {
    case FERRY__JSON_NULL: return "null";
    case FERRY__JSON_BOOL: return j->b ? "true" : "false";
    case FERRY__JSON_NUMBER:
        snprintf(buf, 80, "%.*s", (int)FERRY__MIN(j->num_len, 70), j->num);
        return buf;
    case FERRY__JSON_STRING:
        snprintf(buf, 80, "\"%.60s\"", j->str);
        return buf;
    case FERRY__JSON_ARRAY: return "an array";
    case FERRY__JSON_OBJECT: return "an object";
    }
    return "?";
}

static int parse_metadata(ferry__json *m, const char *path, ferry__parsed *out, ferry__err *e)
{
    if (m->type != FERRY__JSON_OBJECT)
        return ferry__fail(e, FERRY_EFORMAT, "%s: safetensors: \"__metadata__\" is not an object",
                           path);
    for (size_t i = 0; i < m->n; i++) {
        ferry__json *v = &m->items[i];
        if (v->type != FERRY__JSON_STRING) {
            char b[80];
            return ferry__fail(e, FERRY_ETYPE,
                               "%s: safetensors: metadata key '%s' has value %s, not a string",
                               path, m->keys[i], json_show(v, b));
        }
        /* The strings move from the DOM into OUT. */
        ferry_value val = {.type = FERRY_VALUE_STRING};
        val.v.str.ptr = v->str;
        val.v.str.len = v->str_len;
        if (ferry__parsed_add_meta(out, m->keys[i], &val))
            return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        m->keys[i] = NULL;
        v->str = NULL;
        v->type = FERRY__JSON_NULL;
    }
    return 0;
}

static int parse_tensor(char *name, const ferry__json *t, const char *path, uint64_t data_off,
                        ferry__parsed *out, ferry__err *e)
{
    char b[80];
    if (t->type != FERRY__JSON_OBJECT)
        return ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': entry is %s, not an object", path,
                           name, json_show(t, b));
    const ferry__json *jd = NULL, *js = NULL, *jo = NULL;
    for (size_t i = 0; i < t->n; i++) {
        const char *k = t->keys[i];
        if (strcmp(k, "dtype") == 0)
            jd = &t->items[i];
        else if (strcmp(k, "shape") == 0)
            js = &t->items[i];
        else if (strcmp(k, "data_offsets") == 0)
            jo = &t->items[i];
        else
            return ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': unknown field \"%.100s\"",
                               path, name, k);
    }
    if (!jd || !js || !jo)
        return ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': missing field \"%s\"", path, name,
                           !jd ? "dtype" : !js ? "shape" : "data_offsets");

    ferry__tdesc td = {.name = name};
    if (jd->type != FERRY__JSON_STRING)
        return ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': dtype is %s, not a string", path,
                           name, json_show(jd, b));
    if (ferry__dtype_from_st(jd->str, jd->str_len, &td.dtype))
        return ferry__fail(e, FERRY_EDTYPE, "%s: tensor '%s': unknown dtype \"%.40s\"", path,
                           name, jd->str);

    if (js->type != FERRY__JSON_ARRAY)
        return ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': shape is %s, not an array", path,
                           name, json_show(js, b));
    if (js->n > FERRY_MAX_DIMS)
        return ferry__fail(e, FERRY_ELIMIT, "%s: tensor '%s': %zu dimensions (at most %d)", path,
                           name, js->n, FERRY_MAX_DIMS);
    uint64_t n_elems = 1;
    for (size_t i = 0; i < js->n; i++) {
        uint64_t d;
        int k = json_uint(&js->items[i], &d);
        if (k == NUM_OK && d > (uint64_t)INT64_MAX)
            k = NUM_TOO_BIG;
        if (k == NUM_NOT_UINT)
            return ferry__fail(e, FERRY_ESHAPE,
                               "%s: tensor '%s': dimension %zu is %s, not a non-negative integer",
                               path, name, i, json_show(&js->items[i], b));
        if (k == NUM_TOO_BIG)
            return ferry__fail(e, FERRY_EOVERFLOW,
                               "%s: tensor '%s': dimension %zu (%s) does not fit in 63 bits", path,
                               name, i, json_show(&js->items[i], b));
        td.shape[i] = (int64_t)d;
        if (ferry__mul_u64(n_elems, d, &n_elems))
            return ferry__fail(e, FERRY_EOVERFLOW,
                               "%s: tensor '%s': element count of the shape overflows 64 bits",
                               path, name);
    }
    td.ndim = (uint32_t)js->n;

    if (jo->type != FERRY__JSON_ARRAY || jo->n != 2)
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: tensor '%s': data_offsets is %s, not an array [begin, end]", path,
                           name, jo->type == FERRY__JSON_ARRAY ? "an array of another length"
                                                              : json_show(jo, b));
    uint64_t off[2];
    for (int i = 0; i < 2; i++) {
        int k = json_uint(&jo->items[i], &off[i]);
        if (k == NUM_NOT_UINT)
            return ferry__fail(e, FERRY_EFORMAT,
                               "%s: tensor '%s': data_offsets[%d] is %s, not a non-negative "
                               "integer",
                               path, name, i, json_show(&jo->items[i], b));
        if (k == NUM_TOO_BIG)
            return ferry__fail(e, FERRY_EOVERFLOW,
                               "%s: tensor '%s': data_offsets[%d] (%s) does not fit in 64 bits",
                               path, name, i, json_show(&jo->items[i], b));
    }
    if (off[0] > off[1])
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                           path, name, (unsigned long long)off[0], (unsigned long long)off[1]);

    uint64_t want;
    int rc = ferry_dtype_nbytes(td.dtype, n_elems, &want);
    if (rc == FERRY_EOVERFLOW)
        return ferry__fail(e, rc, "%s: tensor '%s': %llu elements of %s overflow 64 bits", path,
                           name, (unsigned long long)n_elems, jd->str);
    if (rc)
        return ferry__fail(e, rc == FERRY_EDTYPE ? rc : FERRY_ESHAPE,
                           "%s: tensor '%s': %llu elements are not a whole number of %s blocks",
                           path, name, (unsigned long long)n_elems, jd->str);
    td.nbytes = off[1] - off[0];
    if (td.nbytes != want)
        return ferry__fail(e, FERRY_ESHAPE,
                           "%s: tensor '%s': shape x %s needs %llu bytes, but data_offsets [%llu, "
                           "%llu] hold %llu",
                           path, name, jd->str, (unsigned long long)want,
                           (unsigned long long)off[0], (unsigned long long)off[1],
                           (unsigned long long)td.nbytes);
    if (ferry__add_u64(data_off, off[0], &td.offset))
        return ferry__fail(e, FERRY_EOVERFLOW,
                           "%s: tensor '%s': data offset %llu + %llu overflows 64 bits", path,
                           name, (unsigned long long)data_off, (unsigned long long)off[0]);
    if (ferry__parsed_add_tensor(out, &td))
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    return 0;
}

typedef struct st_member_ctx {
    const char *path;
    ferry__parsed *out;
    ferry__err *e;
    int have_meta;
} st_member_ctx;

/* A member only checked (ferry__json_member_fn). */
static int st_drop(char *key, ferry__json *v, size_t at, void *arg)
{
    (void)at, (void)arg;
    free(key);
    ferry__json_free(v);
    return 0;
}

/* One member of the header (ferry__json_member_fn): "__metadata__" or a tensor. */
static int st_member(char *key, ferry__json *v, size_t at, void *arg)
{
    st_member_ctx *c = arg;
    int rc;
    if (strcmp(key, "__metadata__") == 0) {
        rc = c->have_meta ? ferry__fail(c->e, FERRY_EDUP,
                                        "%s: JSON: duplicate key \"__metadata__\" at byte %zu",
                                        c->path, at)
                          : parse_metadata(v, c->path, c->out, c->e);
        c->have_meta = 1;
        free(key);
    } else if (!key[0]) {
        /* as in GGUF: a name no pattern or lookup can tell apart from "none" */
        rc = ferry__fail(c->e, FERRY_EFORMAT, "%s: safetensors: empty tensor name at byte %zu",
                         c->path, at);
        free(key);
    } else if ((rc = parse_tensor(key, v, c->path, c->out->data_offset, c->out, c->e)) != 0) {
        free(key); /* on success the name moved into OUT */
    }
    ferry__json_free(v);
    return rc;
}

int ferry__safetensors_parse(const unsigned char *data, uint64_t size, const char *path,
                             ferry__parsed *out, ferry__err *e)
{
    ferry__src src = {data, size, size, NULL, NULL};
    return ferry__safetensors_read(&src, path, out, e);
}

int ferry__safetensors_read(ferry__src *src, const char *path, ferry__parsed *out, ferry__err *e)
{
    memset(out, 0, sizeof *out);
    if (!path)
        path = "(safetensors)";
    uint64_t size = src->size;
    if (size < 8)
        return ferry__fail(e, FERRY_ETRUNC,
                           "%s: safetensors: file of %llu bytes is too short for the 8-byte "
                           "header length",
                           path, (unsigned long long)size);
    int rc = ferry__src_fetch(src, 8, path, e);
    if (rc)
        return rc;
    uint64_t n = ferry__le64(src->data);
    if (n > FERRY__MAX_ST_HEADER)
        return ferry__fail(e, FERRY_ELIMIT,
                           "%s: safetensors: header length %llu exceeds the limit of %llu bytes",
                           path, (unsigned long long)n, (unsigned long long)FERRY__MAX_ST_HEADER);
    if (n > size - 8)
        return ferry__fail(e, FERRY_ETRUNC,
                           "%s: safetensors: header of %llu bytes runs past the end of the file "
                           "(%llu bytes)",
                           path, (unsigned long long)n, (unsigned long long)size);
    /* The header, bounded above, is all the reader looks at: the data section stays unread. */
    if ((rc = ferry__src_fetch(src, 8 + n, path, e)))
        return rc;

    const char *text = (const char *)src->data + 8;
    size_t i = 0;
    while (i < n && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    if (i == n || text[i] != '{') {
        /* not an object: its JSON error, or what it is instead */
        ferry__json root;
        rc = ferry__json_parse(text, (size_t)n, path, &root, e);
        if (rc)
            return rc;
        char b[80];
        rc = ferry__fail(e, FERRY_EFORMAT, "%s: safetensors: header is %s, not a JSON object",
                         path, json_show(&root, b));
        ferry__json_free(&root);
        return rc;
    }
    out->format = FERRY_FORMAT_SAFETENSORS;
    out->data_offset = 8 + n;
    out->alignment = 1;
    /* Member by member, so that memory is the parsed tensors, never the header's whole DOM;
     * twice: the JSON is checked whole before any member is judged (a syntax error anywhere is
     * EJSON, as for a document parsed at once). */
    st_member_ctx ctx = {path, out, e, 0};
    rc = ferry__json_parse_members(text, (size_t)n, path, st_drop, NULL, e);
    if (!rc)
        rc = ferry__json_parse_members(text, (size_t)n, path, st_member, &ctx, e);
    if (!rc)
        rc = ferry__parsed_check(out, path, size, e);
    if (rc)
        ferry__parsed_free(out);
    return rc;
}

/* ---- writer ---------------------------------------------------------------------------------- */

int ferry__safetensors_serialize(ferry__parsed *p, unsigned char **out, size_t *len, ferry__err *e)
{
    *out = NULL;
    *len = 0;
    ferry__buf b = {0};
    ferry__hmap seen = {0};
    uint64_t *sizes = NULL;
    int rc = 0;

    if (ferry__hmap_reserve(&seen, p->n_meta) ||
        !(sizes = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *sizes))) {
        rc = ferry__fail(e, FERRY_ENOMEM, "safetensors: out of memory");
        goto fail;
    }

    /* 8 bytes for the header length, filled in at the end. */
    ferry__buf_put(&b, "\0\0\0\0\0\0\0\0", 8);
    ferry__buf_put(&b, "{", 1);
    int first = 1;
    if (p->n_meta) {
        ferry__buf_put(&b, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < p->n_meta; i++) {
            const ferry__kv *kv = &p->meta[i];
            if (kv->val.type != FERRY_VALUE_STRING) {
                rc = ferry__fail(e, FERRY_ETYPE,
                                 "safetensors: metadata key '%s' is not a string (safetensors "
                                 "metadata holds strings only)",
                                 kv->key);
                goto fail;
            }
            size_t klen = strlen(kv->key);
            const char *v = kv->val.v.str.ptr ? kv->val.v.str.ptr : "";
            size_t vlen = (size_t)kv->val.v.str.len;
            if (klen > FERRY__MAX_NAME || !ferry__utf8_valid(kv->key, klen) ||
                !ferry__utf8_valid(v, vlen)) {
                rc = ferry__fail(e, FERRY_EINVAL,
                                 "safetensors: metadata key '%.200s': key or value is not valid "
                                 "UTF-8 or too long",
                                 kv->key);
                goto fail;
            }
            if (ferry__hmap_put(&seen, kv->key, i, NULL) == FERRY_EDUP) {
                rc = ferry__fail(e, FERRY_EDUP, "safetensors: metadata key '%s' appears twice",
                                 kv->key);
                goto fail;
            }
            if (i)
                ferry__buf_put(&b, ",", 1);
            ferry__buf_json_str(&b, kv->key, klen);
            ferry__buf_put(&b, ":", 1);
            ferry__buf_json_str(&b, v, vlen);
        }
        ferry__buf_put(&b, "}", 1);
        first = 0;
    }
    ferry__hmap_free(&seen);
    if (ferry__hmap_reserve(&seen, p->n_tensors)) {
        rc = ferry__fail(e, FERRY_ENOMEM, "safetensors: out of memory");
        goto fail;
    }

    uint64_t rel = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        const ferry__tdesc *t = &p->tensors[i];
        size_t nlen = strlen(t->name);
        if (nlen > FERRY__MAX_NAME || !ferry__utf8_valid(t->name, nlen) ||
            strcmp(t->name, "__metadata__") == 0) {
            rc = ferry__fail(e, FERRY_EINVAL,
                             "safetensors: tensor name '%.200s' is reserved, too long or not "
                             "valid UTF-8",
                             t->name);
            goto fail;
        }
        if (ferry__hmap_put(&seen, t->name, i, NULL) == FERRY_EDUP) {
            rc = ferry__fail(e, FERRY_EDUP, "safetensors: tensor name '%s' appears twice",
                             t->name);
            goto fail;
        }
        const char *st = ferry__dtype_st_name(t->dtype);
        if (!st) {
            rc = ferry__fail(e, FERRY_EDTYPE,
                             "safetensors: tensor '%s': type %s cannot be stored in safetensors",
                             t->name, ferry_dtype_name(t->dtype));
            goto fail;
        }
        if (t->ndim > FERRY_MAX_DIMS) {
            rc = ferry__fail(e, FERRY_ELIMIT, "safetensors: tensor '%s': %u dimensions", t->name,
                             t->ndim);
            goto fail;
        }
        uint64_t n_elems = 1, want;
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) {
                rc = ferry__fail(e, FERRY_ESHAPE, "safetensors: tensor '%s': dimension %u is %lld",
                                 t->name, d, (long long)t->shape[d]);
                goto fail;
            }
            if (ferry__mul_u64(n_elems, (uint64_t)t->shape[d], &n_elems)) {
                rc = ferry__fail(e, FERRY_EOVERFLOW,
                                 "safetensors: tensor '%s': element count overflows", t->name);
                goto fail;
            }
        }
        if ((rc = ferry_dtype_nbytes(t->dtype, n_elems, &want))) {
            rc = ferry__fail(e, rc, "safetensors: tensor '%s': %llu elements of %s: %s", t->name,
                             (unsigned long long)n_elems, st, ferry_strerror(rc));
            goto fail;
        }
        if (want != t->nbytes) {
            rc = ferry__fail(e, FERRY_ESHAPE,
                             "safetensors: tensor '%s': shape x %s is %llu bytes, but the tensor "
                             "has %llu",
                             t->name, st, (unsigned long long)want,
                             (unsigned long long)t->nbytes);
            goto fail;
        }
        uint64_t end;
        if (ferry__add_u64(rel, want, &end)) {
            rc = ferry__fail(e, FERRY_EOVERFLOW, "safetensors: data section size overflows");
            goto fail;
        }
        sizes[i] = want;
        if (!first)
            ferry__buf_put(&b, ",", 1);
        first = 0;
        ferry__buf_json_str(&b, t->name, nlen);
        ferry__buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", st);
        for (uint32_t d = 0; d < t->ndim; d++)
            ferry__buf_printf(&b, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        ferry__buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)rel,
                          (unsigned long long)end);
        rel = end;
    }
    ferry__buf_put(&b, "}", 1);
    while (!b.oom && b.len % 8)
        ferry__buf_put(&b, " ", 1);
    if (b.oom) {
        rc = ferry__fail(e, FERRY_ENOMEM, "safetensors: out of memory building the header");
        goto fail;
    }
    uint64_t hdr = b.len - 8;
    if (hdr > FERRY__MAX_ST_HEADER) {
        rc = ferry__fail(e, FERRY_ELIMIT,
                         "safetensors: header of %llu bytes exceeds the limit of %llu bytes",
                         (unsigned long long)hdr, (unsigned long long)FERRY__MAX_ST_HEADER);
        goto fail;
    }
    uint64_t base = b.len, file_size;
    /* The data section's total (rel) fits in 64 bits; the file must too. */
    if (ferry__add_u64(base, rel, &file_size)) {
        rc = ferry__fail(e, FERRY_EOVERFLOW, "safetensors: file size overflows");
        goto fail;
    }
    for (int i = 0; i < 8; i++)
        b.p[i] = (char)(hdr >> (8 * i) & 0xFF);
    for (size_t i = 0; i < p->n_tensors; i++) {
        p->tensors[i].offset = base;
        base += sizes[i];
    }
    p->data_offset = b.len;
    ferry__hmap_free(&seen);
    free(sizes);
    *out = (unsigned char *)b.p;
    *len = b.len;
    return 0;

fail:
    ferry__hmap_free(&seen);
    free(sizes);
    free(b.p);
    return rc;
}
