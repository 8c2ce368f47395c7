/*
 * fuzz_check.h — what the fuzz targets assert about a reader's result, shared by fuzz_gguf.c and
 * fuzz_safetensors.c (and the round trip both do through the header serializers).
 *
 * A refusal must be a known negative code with a message naming the path, and must leave the
 * result empty. A success must keep every promise formats.h makes: tensors sorted by offset,
 * inside [data_offset, size), not overlapping, sizes equal to shape x dtype, names unique and
 * bounded; metadata keys present and values well formed (every byte of them is read, so that
 * ASan sees a dangling or short allocation). A violated promise aborts, which libFuzzer reports
 * and the corpus replay turns into a failed test.
 */
#ifndef FERRY_FUZZ_CHECK_H
#define FERRY_FUZZ_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "formats/formats.h"

#define FUZZ_REQUIRE(cond)                                                                   \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* Bytes of the round trip beyond which it is skipped (alignment padding can multiply sizes). */
#define FUZZ_ROUNDTRIP_MAX (UINT64_C(16) << 20)

static volatile unsigned fuzz_sink;

static inline void fuzz_refused(int rc, const ferry__err *e, const char *path,
                                const ferry__parsed *p)
{
    FUZZ_REQUIRE(rc < 0 && rc >= FERRY_EMISMATCH);
    FUZZ_REQUIRE(e->code == rc);
    FUZZ_REQUIRE(e->msg[0] != 0 && strstr(e->msg, path) != NULL);
    FUZZ_REQUIRE(p->n_tensors == 0 && p->n_meta == 0);
}

static inline void fuzz_walk_value(const ferry_value *v, int depth)
{
    FUZZ_REQUIRE(depth <= FERRY__MAX_NESTING + 1);
    switch (v->type) {
    case FERRY_VALUE_U8: FUZZ_REQUIRE(v->v.u <= UINT8_MAX); break;
    case FERRY_VALUE_U16: FUZZ_REQUIRE(v->v.u <= UINT16_MAX); break;
    case FERRY_VALUE_U32: FUZZ_REQUIRE(v->v.u <= UINT32_MAX); break;
    case FERRY_VALUE_BOOL: FUZZ_REQUIRE(v->v.u <= 1); break;
    case FERRY_VALUE_I8: FUZZ_REQUIRE(v->v.i >= INT8_MIN && v->v.i <= INT8_MAX); break;
    case FERRY_VALUE_I16: FUZZ_REQUIRE(v->v.i >= INT16_MIN && v->v.i <= INT16_MAX); break;
    case FERRY_VALUE_I32: FUZZ_REQUIRE(v->v.i >= INT32_MIN && v->v.i <= INT32_MAX); break;
    case FERRY_VALUE_U64:
    case FERRY_VALUE_I64:
    case FERRY_VALUE_F32:
    case FERRY_VALUE_F64: break;
    case FERRY_VALUE_STRING: {
        FUZZ_REQUIRE(v->v.str.ptr != NULL);
        unsigned x = 0;
        for (uint64_t i = 0; i < v->v.str.len; i++)
            x += (unsigned char)v->v.str.ptr[i];
        FUZZ_REQUIRE(v->v.str.ptr[v->v.str.len] == 0);
        fuzz_sink = x;
        break;
    }
    case FERRY_VALUE_ARRAY:
        FUZZ_REQUIRE(v->v.arr.n == 0 || v->v.arr.items != NULL);
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            FUZZ_REQUIRE(v->v.arr.items[i].type == v->v.arr.elem);
            fuzz_walk_value(&v->v.arr.items[i], depth + 1);
        }
        break;
    default: FUZZ_REQUIRE(!"unknown value type");
    }
}

static inline int fuzz_value_eq(const ferry_value *a, const ferry_value *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case FERRY_VALUE_STRING:
        return a->v.str.len == b->v.str.len &&
               memcmp(a->v.str.ptr, b->v.str.ptr, (size_t)a->v.str.len) == 0;
    case FERRY_VALUE_ARRAY:
        if (a->v.arr.elem != b->v.arr.elem || a->v.arr.n != b->v.arr.n)
            return 0;
        for (uint64_t i = 0; i < a->v.arr.n; i++)
            if (!fuzz_value_eq(&a->v.arr.items[i], &b->v.arr.items[i]))
                return 0;
        return 1;
    case FERRY_VALUE_F32:
    case FERRY_VALUE_F64: /* bit for bit: NaNs included */
        return memcmp(&a->v.f, &b->v.f, sizeof a->v.f) == 0;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: return a->v.i == b->v.i;
    default: return a->v.u == b->v.u;
    }
}

/* The promises of a successful parse of SIZE bytes. */
static inline void fuzz_check_parsed(const ferry__parsed *p, uint64_t size, ferry_format format)
{
    FUZZ_REQUIRE(p->format == format);
    /* A GGUF file without tensors may end before its (aligned) data section would begin. */
    FUZZ_REQUIRE(p->data_offset <= size ||
                 (format == FERRY_FORMAT_GGUF && p->n_tensors == 0 &&
                  p->data_offset - size < p->alignment));
    if (format == FERRY_FORMAT_GGUF) {
        FUZZ_REQUIRE(p->gguf_version == 2 || p->gguf_version == 3);
        FUZZ_REQUIRE(p->alignment && (p->alignment & (p->alignment - 1)) == 0);
        FUZZ_REQUIRE(p->data_offset % p->alignment == 0);
    }
    FUZZ_REQUIRE(p->n_tensors == 0 || p->tensors != NULL);
    ferry__hmap names = {0};
    uint64_t far_end = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        const ferry__tdesc *t = &p->tensors[i];
        FUZZ_REQUIRE(t->name != NULL && t->name[0] && strlen(t->name) <= FERRY__MAX_NAME);
        FUZZ_REQUIRE(t->ndim <= FERRY_MAX_DIMS);
        FUZZ_REQUIRE(ferry_dtype_block_elems(t->dtype) > 0);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->ndim; d++) {
            FUZZ_REQUIRE(t->shape[d] >= 0);
            FUZZ_REQUIRE(!ferry__mul_u64(n, (uint64_t)t->shape[d], &n));
        }
        uint64_t nbytes = 0;
        FUZZ_REQUIRE(ferry_dtype_nbytes(t->dtype, n, &nbytes) == 0);
        FUZZ_REQUIRE(nbytes == t->nbytes);
        FUZZ_REQUIRE(t->offset >= p->data_offset && t->offset <= size &&
                     t->nbytes <= size - t->offset);
        if (format == FERRY_FORMAT_GGUF)
            FUZZ_REQUIRE((t->offset - p->data_offset) % p->alignment == 0);
        if (i)
            FUZZ_REQUIRE(p->tensors[i - 1].offset <= t->offset);
        /* against the furthest end so far: an empty tensor between two others hides nothing */
        FUZZ_REQUIRE(!t->nbytes || far_end <= t->offset);
        if (t->nbytes && t->offset + t->nbytes > far_end)
            far_end = t->offset + t->nbytes;
        int rc = ferry__hmap_put(&names, t->name, i, NULL);
        FUZZ_REQUIRE(rc == 0 || rc == FERRY_ENOMEM);
    }
    ferry__hmap_free(&names);
    ferry__hmap keys = {0};
    FUZZ_REQUIRE(p->n_meta == 0 || p->meta != NULL);
    for (size_t i = 0; i < p->n_meta; i++) {
        FUZZ_REQUIRE(p->meta[i].key != NULL);
        int rc = ferry__hmap_put(&keys, p->meta[i].key, i, NULL);
        FUZZ_REQUIRE(rc == 0 || rc == FERRY_ENOMEM);
        fuzz_walk_value(&p->meta[i].val, 0);
        if (format == FERRY_FORMAT_SAFETENSORS)
            FUZZ_REQUIRE(p->meta[i].val.type == FERRY_VALUE_STRING);
    }
    ferry__hmap_free(&keys);
}

typedef int (*fuzz_parse_fn)(const unsigned char *, uint64_t, const char *, ferry__parsed *,
                             ferry__err *);
typedef int (*fuzz_serialize_fn)(ferry__parsed *, unsigned char **, size_t *, ferry__err *);

/* Serializes P's header (which moves its tensors to fresh offsets), appends zero data up to the
 * last tensor's end, reparses, and requires the same tensors (name, dtype, shape, size) and the
 * same metadata. P is consumed (its offsets changed); the caller still frees it. */
static inline void fuzz_roundtrip(ferry__parsed *p, fuzz_parse_fn parse, fuzz_serialize_fn ser,
                                  const char *path)
{
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        uint64_t pad = p->format == FERRY_FORMAT_GGUF ? p->alignment : 0;
        if (ferry__add_u64(total, p->tensors[i].nbytes, &total) ||
            ferry__add_u64(total, pad, &total) || total > FUZZ_ROUNDTRIP_MAX)
            return;
    }
    unsigned char *hdr = NULL;
    size_t len = 0;
    ferry__err e;
    if (ser(p, &hdr, &len, &e) != 0) {
        free(hdr);
        return;
    }
    FUZZ_REQUIRE(p->data_offset == len);
    uint64_t end = len;
    for (size_t i = 0; i < p->n_tensors; i++) {
        FUZZ_REQUIRE(p->tensors[i].offset >= len);
        if (p->tensors[i].offset + p->tensors[i].nbytes > end)
            end = p->tensors[i].offset + p->tensors[i].nbytes;
    }
    FUZZ_REQUIRE(end - len <= total); /* no gaps beyond the alignment padding */
    unsigned char *file = calloc(1, (size_t)end ? (size_t)end : 1);
    if (!file) {
        free(hdr);
        return;
    }
    memcpy(file, hdr, len);
    free(hdr);
    ferry__parsed q;
    memset(&q, 0, sizeof q);
    int rc = parse(file, end, path, &q, &e);
    if (rc)
        fprintf(stderr, "round trip refused: %s\n", e.msg);
    FUZZ_REQUIRE(rc == 0);
    fuzz_check_parsed(&q, end, p->format);
    FUZZ_REQUIRE(q.n_tensors == p->n_tensors);
    FUZZ_REQUIRE(q.n_meta == p->n_meta);
    ferry__hmap names = {0};
    for (size_t i = 0; i < p->n_tensors; i++)
        FUZZ_REQUIRE(ferry__hmap_put(&names, p->tensors[i].name, i, NULL) == 0);
    for (size_t i = 0; i < q.n_tensors; i++) {
        uint64_t j = 0;
        FUZZ_REQUIRE(ferry__hmap_get(&names, q.tensors[i].name, &j));
        const ferry__tdesc *a = &p->tensors[j], *b = &q.tensors[i];
        FUZZ_REQUIRE(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
        FUZZ_REQUIRE(a->offset == b->offset);
        for (uint32_t d = 0; d < a->ndim; d++)
            FUZZ_REQUIRE(a->shape[d] == b->shape[d]);
    }
    ferry__hmap_free(&names);
    /* Same keys and values; the serializer may reorder them, so look each up. */
    ferry__hmap keys = {0};
    for (size_t i = 0; i < p->n_meta; i++)
        FUZZ_REQUIRE(ferry__hmap_put(&keys, p->meta[i].key, i, NULL) == 0);
    for (size_t i = 0; i < q.n_meta; i++) {
        uint64_t j = 0;
        FUZZ_REQUIRE(ferry__hmap_get(&keys, q.meta[i].key, &j));
        FUZZ_REQUIRE(fuzz_value_eq(&p->meta[j].val, &q.meta[i].val));
    }
    ferry__hmap_free(&keys);
    ferry__parsed_free(&q);
    free(file);
}

/* A source (ferry__src) that hands the reader the input in growing pieces, each time in a fresh
 * buffer, so that a pointer the reader kept across a fetch reads freed memory (which ASan
 * reports): for inputs up to FUZZ_DRIP_EXACT bytes exactly what it asks for (every read that
 * crosses the end of what is there fetches), beyond that twice what it had when that is more
 * (each fetch copies all, so exact pieces would cost the square of the size). */
#define FUZZ_DRIP_EXACT (16u << 10)
typedef struct fuzz_drip {
    const uint8_t *data;
    unsigned char *buf;
    unsigned fetches;
} fuzz_drip;

static inline int fuzz_drip_more(ferry__src *s, uint64_t want, ferry__err *e)
{
    fuzz_drip *d = s->arg;
    FUZZ_REQUIRE(want > s->avail && want <= s->size);
    uint64_t n = s->size > FUZZ_DRIP_EXACT && 2 * s->avail > want ? 2 * s->avail : want;
    n = n < s->size ? n : s->size;
    unsigned char *q = malloc((size_t)n);
    if (!q)
        return ferry__fail(e, FERRY_ENOMEM, "fuzz: out of memory");
    memcpy(q, d->data, (size_t)n);
    free(d->buf);
    d->buf = q;
    d->fetches++;
    s->data = q;
    s->avail = n;
    return 0;
}

typedef int (*fuzz_read_fn)(ferry__src *, const char *, ferry__parsed *, ferry__err *);

/* Reads the SIZE bytes at DATA again through a fuzz_drip source and requires what the reader
 * gave for the whole buffer: status RC and message E_MSG, or, on success, P's tensors and
 * metadata, in the same order. */
static inline void fuzz_incremental(const uint8_t *data, size_t size, fuzz_read_fn read,
                                    const char *path, int rc, const char *e_msg,
                                    const ferry__parsed *p)
{
    fuzz_drip d = {data, NULL, 0};
    ferry__src src = {NULL, 0, size, fuzz_drip_more, &d};
    ferry__parsed q;
    ferry__err e;
    memset(&e, 0, sizeof e);
    int rq = read(&src, path, &q, &e);
    free(d.buf);
    if (rq == FERRY_ENOMEM && rc != FERRY_ENOMEM) {
        ferry__parsed_free(&q);
        return;
    }
    if (rq != rc || (rc && strcmp(e.msg, e_msg) != 0))
        fprintf(stderr, "read in %u pieces: %d \"%s\"; whole: %d \"%s\"\n", d.fetches, rq,
                e.msg, rc, e_msg);
    FUZZ_REQUIRE(rq == rc);
    FUZZ_REQUIRE(!rc || strcmp(e.msg, e_msg) == 0);
    if (!rc) {
        FUZZ_REQUIRE(q.n_tensors == p->n_tensors && q.n_meta == p->n_meta);
        FUZZ_REQUIRE(q.data_offset == p->data_offset && q.alignment == p->alignment);
        for (size_t i = 0; i < p->n_tensors; i++) {
            const ferry__tdesc *a = &p->tensors[i], *b = &q.tensors[i];
            FUZZ_REQUIRE(strcmp(a->name, b->name) == 0 && a->offset == b->offset &&
                         a->nbytes == b->nbytes && a->dtype == b->dtype && a->ndim == b->ndim);
            for (uint32_t k = 0; k < a->ndim; k++)
                FUZZ_REQUIRE(a->shape[k] == b->shape[k]);
        }
        for (size_t i = 0; i < p->n_meta; i++) {
            FUZZ_REQUIRE(strcmp(p->meta[i].key, q.meta[i].key) == 0);
            FUZZ_REQUIRE(fuzz_value_eq(&p->meta[i].val, &q.meta[i].val));
        }
    } else {
        FUZZ_REQUIRE(q.n_tensors == 0 && q.n_meta == 0);
    }
    ferry__parsed_free(&q);
}

/* Opens the same bytes (which P was parsed from) through the public catalog, from a memory file,
 * and requires the catalog to agree with P: every tensor found by name at its place, with the
 * row view consistent with its shape, and every metadata key readable through the getters.
 * MAY_REFUSE: the catalog may refuse the file (a GGUF that says it is one part of a split set,
 * whose other parts cannot be found from a memory file's name). */
static inline void fuzz_catalog(const uint8_t *data, size_t size, const ferry__parsed *p,
                                int may_refuse)
{
    int fd = memfd_create("fuzz", 0);
    if (fd < 0)
        return;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return;
        }
        done += (size_t)w;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ferry_catalog *c = ferry_catalog_create();
    if (!c) {
        close(fd);
        return;
    }
    int rc = ferry_catalog_add(c, path, "p.");
    if (rc) {
        if (!may_refuse)
            fprintf(stderr, "catalog refused what the reader took: %s\n", ferry_catalog_errmsg(c));
        FUZZ_REQUIRE(may_refuse && rc < 0);
        FUZZ_REQUIRE(ferry_catalog_count(c) == 0 && ferry_catalog_file_count(c) == 0);
    } else {
        FUZZ_REQUIRE(ferry_catalog_count(c) == p->n_tensors);
        FUZZ_REQUIRE(ferry_catalog_file_count(c) == 1);
        FUZZ_REQUIRE(ferry_catalog_file_format(c, 0) == p->format);
        FUZZ_REQUIRE(ferry_catalog_meta_count(c) == p->n_meta);
        uint64_t total = 0;
        for (size_t i = 0; i < p->n_tensors; i++) {
            ferry_tensor_info ti;
            FUZZ_REQUIRE(ferry_catalog_tensor(c, i, &ti) == 0);
            FUZZ_REQUIRE(strncmp(ti.name, "p.", 2) == 0 &&
                         strcmp(ti.name + 2, p->tensors[i].name) == 0);
            FUZZ_REQUIRE(ferry_catalog_find(c, ti.name) == (int64_t)i);
            FUZZ_REQUIRE(ti.offset == p->tensors[i].offset && ti.nbytes == p->tensors[i].nbytes);
            FUZZ_REQUIRE(ti.dtype == p->tensors[i].dtype && ti.ndim == p->tensors[i].ndim);
            if (ti.row_elems)
                FUZZ_REQUIRE(ti.row_elems * ti.n_rows == ti.n_elems);
            else
                FUZZ_REQUIRE(ti.n_elems == 0);
            total += ti.nbytes;
        }
        FUZZ_REQUIRE(ferry_catalog_tensor(c, p->n_tensors, &(ferry_tensor_info){0}) ==
                     FERRY_ENOENT);
        FUZZ_REQUIRE(ferry_catalog_total_bytes(c) == total);
        for (size_t i = 0; i < p->n_meta; i++) {
            const char *k = ferry_catalog_meta_key(c, i);
            FUZZ_REQUIRE(k != NULL &&
                         ferry_catalog_meta_find(c, k) == ferry_catalog_meta_value(c, i));
            uint64_t u;
            int64_t s;
            double f;
            int b;
            const char *str;
            int r[5] = {ferry_catalog_get_u64(c, k, &u), ferry_catalog_get_i64(c, k, &s),
                        ferry_catalog_get_f64(c, k, &f), ferry_catalog_get_bool(c, k, &b),
                        ferry_catalog_get_str(c, k, &str)};
            for (int j = 0; j < 5; j++)
                FUZZ_REQUIRE(r[j] == 0 || r[j] == FERRY_ETYPE);
        }
    }
    ferry_catalog_destroy(c);
    close(fd);
}

#endif
