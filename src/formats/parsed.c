/*
 * parsed.c — the in-memory result of parsing one model file (ferry__parsed), shared by the GGUF
 * and safetensors readers: growing arrays of tensors and metadata, deep value copies (an array
 * into one block, the ownership rule of formats.h), the one-file consistency check (unique names,
 * no overlap, inside the file), content sniffing, and fetching more of a file a reader reads as
 * it goes (ferry__src).
 */
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

void ferry__value_free(ferry_value *v)
{
    if (!v)
        return;
    /* The ownership rule of formats.h (ferry__kv): a string is its own block; an array is one
     * block at items that holds everything inside it, nested arrays and strings included, none of
     * which is ever freed on its own. */
    if (v->type == FERRY_VALUE_STRING)
        free((char *)v->v.str.ptr);
    else if (v->type == FERRY_VALUE_ARRAY)
        free((ferry_value *)v->v.arr.items);
    memset(v, 0, sizeof *v);
}

/* Adds to *ITEMS the items of the arrays inside array V (at every depth) and to *BYTES the bytes
 * of the strings inside it, NULs included. FERRY_EOVERFLOW when a sum overflows, FERRY_EINVAL for
 * an array of n > 0 items without items. */
static int inner_size(const ferry_value *v, uint64_t *items, uint64_t *bytes)
{
    if (v->v.arr.n && !v->v.arr.items)
        return FERRY_EINVAL;
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        const ferry_value *it = &v->v.arr.items[i];
        if (it->type == FERRY_VALUE_STRING) {
            if (ferry__add_u64(*bytes, it->v.str.len, bytes) || ferry__add_u64(*bytes, 1, bytes))
                return FERRY_EOVERFLOW;
        } else if (it->type == FERRY_VALUE_ARRAY) {
            if (ferry__add_u64(*items, it->v.arr.n, items))
                return FERRY_EOVERFLOW;
            int rc = inner_size(it, items, bytes);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Copies the N items of SRC to DST, taking nested items and string bytes from *NEXT / *STR. */
static void copy_items(ferry_value *dst, const ferry_value *src, uint64_t n, ferry_value **next,
                       char **str)
{
    for (uint64_t i = 0; i < n; i++) {
        dst[i] = src[i];
        if (src[i].type == FERRY_VALUE_STRING) {
            uint64_t len = src[i].v.str.len;
            if (len)
                memcpy(*str, src[i].v.str.ptr, (size_t)len);
            (*str)[len] = 0;
            dst[i].v.str.ptr = *str;
            *str += len + 1;
        } else if (src[i].type == FERRY_VALUE_ARRAY) {
            uint64_t m = src[i].v.arr.n;
            ferry_value *items = m ? *next : NULL;
            *next += m;
            dst[i].v.arr.items = items;
            copy_items(items, src[i].v.arr.items, m, next, str);
        }
    }
}

int ferry__value_copy(ferry_value *dst, const ferry_value *src)
{
    *dst = *src;
    if (src->type == FERRY_VALUE_STRING) {
        char *s = malloc(src->v.str.len + 1);
        dst->v.str.ptr = s;
        if (!s)
            return FERRY_ENOMEM;
        if (src->v.str.len)
            memcpy(s, src->v.str.ptr, src->v.str.len);
        s[src->v.str.len] = 0;
        dst->v.str.ptr = s;
    } else if (src->type == FERRY_VALUE_ARRAY) {
        /* One block, as ferry__value_free expects: every item of every depth, then the strings. */
        uint64_t n_items = src->v.arr.n, n_bytes = 0, size;
        dst->v.arr.items = NULL;
        int rc = inner_size(src, &n_items, &n_bytes);
        if (rc)
            return rc;
        if (ferry__mul_u64(n_items, sizeof(ferry_value), &size) ||
            ferry__add_u64(size, n_bytes, &size) || size > SIZE_MAX)
            return FERRY_EOVERFLOW;
        if (!size)
            return 0;
        ferry_value *block = malloc((size_t)size);
        if (!block)
            return FERRY_ENOMEM;
        ferry_value *next = block + src->v.arr.n;
        char *str = (char *)(block + n_items);
        copy_items(block, src->v.arr.items, src->v.arr.n, &next, &str);
        dst->v.arr.items = block;
    }
    return 0;
}

static int grow(void **arr, size_t *cap, size_t len, size_t elem)
{
    if (len < *cap)
        return 0;
    size_t ncap = *cap ? *cap * 2 : 16;
    if (ncap > SIZE_MAX / elem)
        return FERRY_ENOMEM;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return FERRY_ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

int ferry__parsed_add_tensor(ferry__parsed *p, const ferry__tdesc *t)
{
    if (grow((void **)&p->tensors, &p->cap_tensors, p->n_tensors, sizeof *p->tensors))
        return FERRY_ENOMEM;
    p->tensors[p->n_tensors++] = *t;
    return 0;
}

int ferry__parsed_add_meta(ferry__parsed *p, char *key, const ferry_value *v)
{
    if (grow((void **)&p->meta, &p->cap_meta, p->n_meta, sizeof *p->meta))
        return FERRY_ENOMEM;
    p->meta[p->n_meta].key = key;
    p->meta[p->n_meta].val = *v;
    p->n_meta++;
    return 0;
}

void ferry__parsed_free(ferry__parsed *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_tensors; i++)
        free(p->tensors[i].name);
    for (size_t i = 0; i < p->n_meta; i++) {
        free(p->meta[i].key);
        ferry__value_free(&p->meta[i].val);
    }
    free(p->tensors);
    free(p->meta);
    memset(p, 0, sizeof *p);
}

static int by_offset(const void *a, const void *b)
{
    const ferry__tdesc *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

int ferry__parsed_check(ferry__parsed *p, const char *path, uint64_t file_size, ferry__err *e)
{
    ferry__hmap names = {0};
    int rc = ferry__hmap_reserve(&names, p->n_tensors);
    if (rc)
        return ferry__fail(e, rc, "%s: out of memory indexing %zu tensors", path, p->n_tensors);
    for (size_t i = 0; i < p->n_tensors; i++) {
        const ferry__tdesc *t = &p->tensors[i];
        uint64_t end;
        if (ferry__add_u64(t->offset, t->nbytes, &end)) {
            ferry__hmap_free(&names);
            return ferry__fail(e, FERRY_EOVERFLOW,
                               "%s: tensor '%s': offset %llu + size %llu overflows", path, t->name,
                               (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        }
        if (t->offset < p->data_offset || end > file_size) {
            ferry__hmap_free(&names);
            return ferry__fail(e, FERRY_ERANGE,
                               "%s: tensor '%s': data [%llu, %llu) lies outside the data section "
                               "[%llu, %llu)",
                               path, t->name, (unsigned long long)t->offset,
                               (unsigned long long)end, (unsigned long long)p->data_offset,
                               (unsigned long long)file_size);
        }
        uint64_t other;
        rc = ferry__hmap_put(&names, t->name, i, &other);
        if (rc) {
            ferry__hmap_free(&names);
            if (rc == FERRY_EDUP)
                return ferry__fail(e, FERRY_EDUP, "%s: tensor name '%s' appears twice", path,
                                   t->name);
            return ferry__fail(e, rc, "%s: out of memory", path);
        }
    }
    ferry__hmap_free(&names);
    if (p->n_tensors > 1)
        qsort(p->tensors, p->n_tensors, sizeof *p->tensors, by_offset);
    /* In offset order, each non-empty tensor starts at or after the furthest end of those before
     * it: the end of the last non-empty one, as long as none overlapped. Zero-byte tensors occupy
     * nothing and overlap nothing, so they neither advance nor hide that end. */
    const ferry__tdesc *far = NULL;
    for (size_t i = 0; i < p->n_tensors; i++) {
        const ferry__tdesc *a = far, *b = &p->tensors[i];
        if (!b->nbytes)
            continue;
        if (a && a->offset + a->nbytes > b->offset)
            return ferry__fail(e, FERRY_EOVERLAP,
                               "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", path,
                               a->name, (unsigned long long)a->offset,
                               (unsigned long long)(a->offset + a->nbytes), b->name,
                               (unsigned long long)b->offset,
                               (unsigned long long)(b->offset + b->nbytes));
        far = b;
    }
    return 0;
}

int ferry__src_fetch(ferry__src *src, uint64_t want, const char *path, ferry__err *e)
{
    if (want <= src->avail)
        return 0;
    int rc = src->more ? src->more(src, want, e)
                       : ferry__fail(e, FERRY_EINVAL, "%s: bytes [%llu, %llu) are not in memory",
                                     path, (unsigned long long)src->avail,
                                     (unsigned long long)want);
    if (!rc && want > src->avail)
        rc = ferry__fail(e, FERRY_EIO, "%s: bytes [%llu, %llu) of the header could not be read",
                         path, (unsigned long long)src->avail, (unsigned long long)want);
    return rc;
}

ferry_format ferry__detect(const unsigned char *buf, size_t n)
{
    if (n >= 4 && memcmp(buf, "GGUF", 4) == 0)
        return FERRY_FORMAT_GGUF;
    /* safetensors: u64 little-endian header length, then a JSON object starting with '{' (after
     * optional spaces, which writers use for padding only at the end). */
    if (n >= 9) {
        uint64_t len = ferry__le64(buf);
        size_t i = 8;
        while (i < n && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r'))
            i++;
        if (len >= 2 && i < n && buf[i] == '{')
            return FERRY_FORMAT_SAFETENSORS;
    }
    return FERRY_FORMAT_UNKNOWN;
}
