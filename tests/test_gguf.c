/*
 * test_gguf.c — the GGUF reader and header writer on buffers built byte by byte: every metadata
 * value type, nested arrays, the alignment key, tensor infos; the parse results; serialize ->
 * parse round trips; every error class of formats.h's table with its exact code; and truncation at
 * every cut point of a valid file, which must always be a clean error.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "formats/formats.h"

/* ---- a byte builder ------------------------------------------------------------------------- */

typedef struct bb {
    unsigned char *p;
    size_t n, cap;
} bb;

static void b_put(bb *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n)
            c *= 2;
        b->p = realloc(b->p, c);
        if (!b->p)
            exit(2);
        b->cap = c;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void b_u8(bb *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u16(bb *b, uint16_t v) { b_u8(b, (uint8_t)v), b_u8(b, (uint8_t)(v >> 8)); }
static void b_u32(bb *b, uint32_t v) { b_u16(b, (uint16_t)v), b_u16(b, (uint16_t)(v >> 16)); }
static void b_u64(bb *b, uint64_t v) { b_u32(b, (uint32_t)v), b_u32(b, (uint32_t)(v >> 32)); }
static void b_str(bb *b, const char *s) { b_u64(b, strlen(s)), b_put(b, s, strlen(s)); }
static void b_f32(bb *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    b_u32(b, u);
}
static void b_f64(bb *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    b_u64(b, u);
}
static void b_free(bb *b) { free(b->p), memset(b, 0, sizeof *b); }

static void hdr(bb *b, uint32_t version, uint64_t nt, uint64_t nkv)
{
    b_put(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, nt);
    b_u64(b, nkv);
}
static void key(bb *b, const char *k, uint32_t type) { b_str(b, k), b_u32(b, type); }
static void kv_u32(bb *b, const char *k, uint32_t v) { key(b, k, FERRY_VALUE_U32), b_u32(b, v); }
static void info(bb *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                 uint64_t off)
{
    b_str(b, name);
    b_u32(b, nd);
    for (uint32_t i = 0; i < nd; i++)
        b_u64(b, ne[i]);
    b_u32(b, type);
    b_u64(b, off);
}
/* Pads to ALIGN, then N data bytes with a pattern. */
static void data(bb *b, size_t align, size_t n)
{
    while (b->n % align)
        b_u8(b, 0);
    for (size_t i = 0; i < n; i++)
        b_u8(b, (uint8_t)(i * 7 + 1));
}

static ferry__err err;

static int parse(const bb *b, ferry__parsed *p)
{
    /* A private copy of exactly n bytes, so that ASan sees any read past the end. */
    unsigned char *copy = malloc(b->n ? b->n : 1);
    if (b->n)
        memcpy(copy, b->p, b->n);
    ferry__err_clear(&err);
    int rc = ferry__gguf_parse(copy, b->n, "t.gguf", p, &err);
    free(copy);
    return rc;
}

static const ferry__kv *meta(const ferry__parsed *p, const char *k)
{
    for (size_t i = 0; i < p->n_meta; i++)
        if (strcmp(p->meta[i].key, k) == 0)
            return &p->meta[i];
    return NULL;
}

/* ---- a full v3 file -------------------------------------------------------------------------- */

/* Metadata of every type, nested arrays, alignment 64; three tensors whose infos are not in offset
 * order. */
static void build_full(bb *b, uint32_t version)
{
    hdr(b, version, 3, 17);
    key(b, "t.u8", FERRY_VALUE_U8), b_u8(b, 200);
    key(b, "t.i8", FERRY_VALUE_I8), b_u8(b, (uint8_t)-5);
    key(b, "t.u16", FERRY_VALUE_U16), b_u16(b, 60000);
    key(b, "t.i16", FERRY_VALUE_I16), b_u16(b, (uint16_t)-30000);
    key(b, "t.u32", FERRY_VALUE_U32), b_u32(b, 4000000000u);
    key(b, "t.i32", FERRY_VALUE_I32), b_u32(b, (uint32_t)-2000000000);
    key(b, "t.f32", FERRY_VALUE_F32), b_f32(b, 1.5f);
    key(b, "t.bool", FERRY_VALUE_BOOL), b_u8(b, 1);
    key(b, "t.str", FERRY_VALUE_STRING), b_str(b, "hello");
    key(b, "t.u64", FERRY_VALUE_U64), b_u64(b, (UINT64_C(1) << 63) + 5);
    key(b, "t.i64", FERRY_VALUE_I64), b_u64(b, (uint64_t)-(INT64_C(1) << 62));
    key(b, "t.f64", FERRY_VALUE_F64), b_f64(b, 3.25);
    key(b, "t.arr", FERRY_VALUE_ARRAY), b_u32(b, FERRY_VALUE_I32), b_u64(b, 3);
    b_u32(b, 1), b_u32(b, (uint32_t)-2), b_u32(b, 3);
    key(b, "t.sarr", FERRY_VALUE_ARRAY), b_u32(b, FERRY_VALUE_STRING), b_u64(b, 3);
    b_str(b, "a"), b_str(b, "bc"), b_str(b, "");
    /* [[u16 7, u16 8], ["x"], []] : an array of arrays of different item types */
    key(b, "t.nested", FERRY_VALUE_ARRAY), b_u32(b, FERRY_VALUE_ARRAY), b_u64(b, 3);
    b_u32(b, FERRY_VALUE_U16), b_u64(b, 2), b_u16(b, 7), b_u16(b, 8);
    b_u32(b, FERRY_VALUE_STRING), b_u64(b, 1), b_str(b, "x");
    b_u32(b, FERRY_VALUE_F64), b_u64(b, 0);
    key(b, "t.empty", FERRY_VALUE_ARRAY), b_u32(b, FERRY_VALUE_U8), b_u64(b, 0);
    kv_u32(b, "general.alignment", 64);
    uint64_t ne_q[2] = {32, 2}, ne_w[2] = {4, 2};
    info(b, "q", 2, ne_q, FERRY_DTYPE_Q8_0, 64);  /* 2 blocks of 34 bytes = 68 */
    info(b, "w", 2, ne_w, FERRY_DTYPE_F32, 0);    /* 32 bytes */
    info(b, "e", 0, NULL, FERRY_DTYPE_F16, 192);  /* a scalar: 2 bytes */
    data(b, 64, 194);
}

static void test_full(uint32_t version)
{
    bb b = {0};
    build_full(&b, version);
    ferry__parsed p;
    CHECK_EQ_INT(parse(&b, &p), 0);
    CHECK_EQ_INT(p.format, FERRY_FORMAT_GGUF);
    CHECK_EQ_INT(p.gguf_version, version);
    CHECK_EQ_INT(p.alignment, 64);
    CHECK_EQ_INT(p.data_offset % 64, 0);
    CHECK_EQ_INT(p.data_offset + 194, b.n);
    CHECK_EQ_INT(p.n_meta, 17);
    const ferry__kv *kv;
    CHECK((kv = meta(&p, "t.u8")) && kv->val.type == FERRY_VALUE_U8 && kv->val.v.u == 200);
    CHECK((kv = meta(&p, "t.i8")) && kv->val.type == FERRY_VALUE_I8 && kv->val.v.i == -5);
    CHECK((kv = meta(&p, "t.u16")) && kv->val.type == FERRY_VALUE_U16 && kv->val.v.u == 60000);
    CHECK((kv = meta(&p, "t.i16")) && kv->val.type == FERRY_VALUE_I16 && kv->val.v.i == -30000);
    CHECK((kv = meta(&p, "t.u32")) && kv->val.type == FERRY_VALUE_U32 &&
          kv->val.v.u == 4000000000u);
    CHECK((kv = meta(&p, "t.i32")) && kv->val.type == FERRY_VALUE_I32 &&
          kv->val.v.i == -2000000000);
    CHECK((kv = meta(&p, "t.f32")) && kv->val.type == FERRY_VALUE_F32 && kv->val.v.f == 1.5);
    CHECK((kv = meta(&p, "t.bool")) && kv->val.type == FERRY_VALUE_BOOL && kv->val.v.u == 1);
    CHECK((kv = meta(&p, "t.str")) && kv->val.type == FERRY_VALUE_STRING &&
          kv->val.v.str.len == 5 && strcmp(kv->val.v.str.ptr, "hello") == 0);
    CHECK((kv = meta(&p, "t.u64")) && kv->val.type == FERRY_VALUE_U64 &&
          kv->val.v.u == (UINT64_C(1) << 63) + 5);
    CHECK((kv = meta(&p, "t.i64")) && kv->val.type == FERRY_VALUE_I64 &&
          kv->val.v.i == -(INT64_C(1) << 62));
    CHECK((kv = meta(&p, "t.f64")) && kv->val.type == FERRY_VALUE_F64 && kv->val.v.f == 3.25);
    kv = meta(&p, "t.arr");
    CHECK(kv && kv->val.type == FERRY_VALUE_ARRAY && kv->val.v.arr.elem == FERRY_VALUE_I32 &&
          kv->val.v.arr.n == 3);
    if (kv && kv->val.v.arr.n == 3) {
        CHECK_EQ_INT(kv->val.v.arr.items[0].v.i, 1);
        CHECK_EQ_INT(kv->val.v.arr.items[1].v.i, -2);
        CHECK_EQ_INT(kv->val.v.arr.items[2].type, FERRY_VALUE_I32);
    }
    kv = meta(&p, "t.sarr");
    CHECK(kv && kv->val.v.arr.elem == FERRY_VALUE_STRING && kv->val.v.arr.n == 3);
    if (kv && kv->val.v.arr.n == 3) {
        CHECK_STR(kv->val.v.arr.items[1].v.str.ptr, "bc");
        CHECK_EQ_INT(kv->val.v.arr.items[2].v.str.len, 0);
        CHECK_STR(kv->val.v.arr.items[2].v.str.ptr, "");
    }
    kv = meta(&p, "t.nested");
    CHECK(kv && kv->val.v.arr.elem == FERRY_VALUE_ARRAY && kv->val.v.arr.n == 3);
    if (kv && kv->val.v.arr.n == 3) {
        const ferry_value *it = kv->val.v.arr.items;
        CHECK(it[0].type == FERRY_VALUE_ARRAY && it[0].v.arr.elem == FERRY_VALUE_U16 &&
              it[0].v.arr.n == 2 && it[0].v.arr.items[1].v.u == 8);
        CHECK(it[1].v.arr.elem == FERRY_VALUE_STRING && it[1].v.arr.n == 1 &&
              strcmp(it[1].v.arr.items[0].v.str.ptr, "x") == 0);
        CHECK(it[2].v.arr.elem == FERRY_VALUE_F64 && it[2].v.arr.n == 0);
    }
    CHECK((kv = meta(&p, "t.empty")) && kv->val.v.arr.n == 0);

    CHECK_EQ_INT(p.n_tensors, 3);
    if (p.n_tensors == 3) {
        /* sorted by offset, offsets absolute */
        CHECK_STR(p.tensors[0].name, "w");
        CHECK_STR(p.tensors[1].name, "q");
        CHECK_STR(p.tensors[2].name, "e");
        CHECK_EQ_INT(p.tensors[0].offset, p.data_offset);
        CHECK_EQ_INT(p.tensors[1].offset, p.data_offset + 64);
        CHECK_EQ_INT(p.tensors[2].offset, p.data_offset + 192);
        CHECK_EQ_INT(p.tensors[0].nbytes, 32);
        CHECK_EQ_INT(p.tensors[1].nbytes, 68);
        CHECK_EQ_INT(p.tensors[2].nbytes, 2);
        CHECK_EQ_INT(p.tensors[1].dtype, FERRY_DTYPE_Q8_0);
        CHECK_EQ_INT(p.tensors[1].ndim, 2);
        CHECK_EQ_INT(p.tensors[1].shape[0], 32); /* GGUF order: ne[0] first */
        CHECK_EQ_INT(p.tensors[1].shape[1], 2);
        CHECK_EQ_INT(p.tensors[2].ndim, 0);
    }
    ferry__parsed_free(&p);
    b_free(&b);
}

/* serialize(parse(file)) + the same data parses to the same thing. */
static void test_roundtrip(void)
{
    bb b = {0};
    build_full(&b, 3);
    ferry__parsed p, q;
    CHECK_EQ_INT(parse(&b, &p), 0);
    uint64_t old_off[3];
    for (size_t i = 0; i < p.n_tensors; i++)
        old_off[i] = p.tensors[i].offset;
    unsigned char *h = NULL;
    size_t hl = 0;
    CHECK_EQ_INT(ferry__gguf_serialize(&p, &h, &hl, &err), 0);
    CHECK_EQ_INT(hl % 64, 0);
    CHECK_EQ_INT(p.data_offset, hl);
    bb f = {0};
    b_put(&f, h, hl);
    for (size_t i = 0; i < p.n_tensors; i++) {
        CHECK_EQ_INT(p.tensors[i].offset % 64, 0);
        while (f.n < p.tensors[i].offset)
            b_u8(&f, 0);
        b_put(&f, b.p + old_off[i], (size_t)p.tensors[i].nbytes);
    }
    CHECK_EQ_INT(parse(&f, &q), 0);
    CHECK_EQ_INT(q.gguf_version, 3);
    CHECK_EQ_INT(q.alignment, 64);
    CHECK_EQ_INT(q.n_meta, p.n_meta);
    CHECK_EQ_INT(q.n_tensors, p.n_tensors);
    for (size_t i = 0; i < q.n_meta && i < p.n_meta; i++) {
        CHECK_STR(q.meta[i].key, p.meta[i].key);
        CHECK_EQ_INT(q.meta[i].val.type, p.meta[i].val.type);
    }
    const ferry__kv *kv = meta(&q, "t.nested");
    CHECK(kv && kv->val.v.arr.n == 3 && kv->val.v.arr.items[1].v.arr.n == 1 &&
          strcmp(kv->val.v.arr.items[1].v.arr.items[0].v.str.ptr, "x") == 0);
    CHECK((kv = meta(&q, "t.f32")) && kv->val.v.f == 1.5);
    CHECK((kv = meta(&q, "t.i64")) && kv->val.v.i == -(INT64_C(1) << 62));
    for (size_t i = 0; i < q.n_tensors && i < p.n_tensors; i++) {
        CHECK_STR(q.tensors[i].name, p.tensors[i].name);
        CHECK_EQ_INT(q.tensors[i].offset, p.tensors[i].offset);
        CHECK_EQ_INT(q.tensors[i].nbytes, p.tensors[i].nbytes);
        CHECK_EQ_INT(q.tensors[i].dtype, p.tensors[i].dtype);
        CHECK_EQ_INT(q.tensors[i].ndim, p.tensors[i].ndim);
        CHECK(memcmp(q.tensors[i].shape, p.tensors[i].shape, sizeof q.tensors[i].shape) == 0);
        CHECK(memcmp(f.p + q.tensors[i].offset, b.p + old_off[i], (size_t)q.tensors[i].nbytes) ==
              0);
    }
    ferry__parsed_free(&q);
    ferry__parsed_free(&p);
    free(h);
    b_free(&f);
    b_free(&b);
}

/* A non-default alignment without the key: the serializer records it. Default when 0. */
static void test_serialize_alignment(void)
{
    for (int rep = 0; rep < 2; rep++) {
        ferry__parsed p;
        memset(&p, 0, sizeof p);
        p.alignment = rep ? 128 : 0;
        ferry__tdesc t;
        memset(&t, 0, sizeof t);
        t.name = strdup("a");
        t.dtype = FERRY_DTYPE_F32;
        t.ndim = 1;
        t.shape[0] = 3;
        t.nbytes = 12;
        ferry__parsed_add_tensor(&p, &t);
        t.name = strdup("b");
        ferry__parsed_add_tensor(&p, &t);
        unsigned char *h;
        size_t hl;
        CHECK_EQ_INT(ferry__gguf_serialize(&p, &h, &hl, &err), 0);
        uint64_t al = rep ? 128 : 32;
        CHECK_EQ_INT(hl % al, 0);
        CHECK_EQ_INT(p.tensors[0].offset, hl);
        CHECK_EQ_INT(p.tensors[1].offset, hl + al); /* 12 bytes rounded up to the alignment */
        bb f = {0};
        b_put(&f, h, hl);
        data(&f, 1, (size_t)al + 12);
        ferry__parsed q;
        CHECK_EQ_INT(parse(&f, &q), 0);
        CHECK_EQ_INT(q.alignment, al);
        CHECK_EQ_INT(q.n_meta, rep ? 1 : 0);
        CHECK_EQ_INT(q.n_tensors, 2);
        if (q.n_tensors == 2)
            CHECK_EQ_INT(q.tensors[1].offset, hl + al);
        ferry__parsed_free(&q);
        b_free(&f);
        free(h);
        /* refusals */
        p.tensors[0].dtype = FERRY_DTYPE_BOOL;
        CHECK_EQ_INT(ferry__gguf_serialize(&p, &h, &hl, &err), FERRY_EDTYPE);
        p.tensors[0].dtype = FERRY_DTYPE_F32;
        p.alignment = 48;
        CHECK_EQ_INT(ferry__gguf_serialize(&p, &h, &hl, &err), FERRY_EALIGN);
        ferry__parsed_free(&p);
    }
}

/* ---- errors ------------------------------------------------------------------------------------ */

/* One f32 tensor "w" [ne0] at relative offset OFF, with an optional alignment key. */
static void one_tensor(bb *b, uint64_t ne0, uint32_t type, uint64_t off, size_t ndata)
{
    hdr(b, 3, 1, 0);
    info(b, "w", 1, &ne0, type, off);
    data(b, 32, ndata);
}

static int expect(bb *b, int code, const char *needle)
{
    ferry__parsed p;
    int rc = parse(b, &p);
    if (rc != code)
        fprintf(stderr, "  expected %d, got %d: %s\n", code, rc, err.msg);
    if (rc == 0)
        ferry__parsed_free(&p);
    else
        CHECK(p.n_tensors == 0 && p.n_meta == 0 && p.tensors == NULL && p.meta == NULL);
    if (needle && !strstr(err.msg, needle)) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", err.msg, needle);
        rc = 1;
    }
    CHECK(strncmp(err.msg, "t.gguf", 6) == 0 || rc == 0);
    b_free(b);
    return rc;
}

static void test_errors(void)
{
    bb b = {0};
    /* EFORMAT */
    b_put(&b, "GGUX", 4), b_u32(&b, 3), b_u64(&b, 0), b_u64(&b, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "not a GGUF"), FERRY_EFORMAT);
    hdr(&b, 1, 0, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "version 1"), FERRY_EFORMAT);
    hdr(&b, 4, 0, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "version 4"), FERRY_EFORMAT);
    hdr(&b, 0x03000000u, 0, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "big-endian"), FERRY_EFORMAT);
    hdr(&b, 3, 0, 1), key(&b, "k", 13), b_u32(&b, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "'k'"), FERRY_EFORMAT);
    hdr(&b, 3, 0, 1), key(&b, "k", FERRY_VALUE_ARRAY), b_u32(&b, 99), b_u64(&b, 0);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "99"), FERRY_EFORMAT);
    hdr(&b, 3, 0, 1), key(&b, "k", FERRY_VALUE_BOOL), b_u8(&b, 2);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "bool"), FERRY_EFORMAT);
    hdr(&b, 3, 0, 1), b_u64(&b, 2), b_put(&b, "a\0", 2), b_u32(&b, FERRY_VALUE_U8), b_u8(&b, 1);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, "NUL"), FERRY_EFORMAT);
    b_put(&b, "GG", 2);
    CHECK_EQ_INT(expect(&b, FERRY_EFORMAT, NULL), FERRY_EFORMAT);

    /* ETRUNC */
    b_put(&b, "GGUF", 4), b_u32(&b, 3), b_u32(&b, 0);
    CHECK_EQ_INT(expect(&b, FERRY_ETRUNC, "header"), FERRY_ETRUNC);
    hdr(&b, 3, 0, 1), key(&b, "k", FERRY_VALUE_U64), b_u32(&b, 7);
    CHECK_EQ_INT(expect(&b, FERRY_ETRUNC, NULL), FERRY_ETRUNC);
    hdr(&b, 3, 0, 2), key(&b, "key", FERRY_VALUE_STRING), b_u64(&b, 30), b_put(&b, "abcdefghij", 10);
    CHECK_EQ_INT(expect(&b, FERRY_ETRUNC, "'key'"), FERRY_ETRUNC);

    /* ELIMIT */
    hdr(&b, 3, UINT64_C(1) << 40, 0);
    data(&b, 1, 100);
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "tensors"), FERRY_ELIMIT);
    hdr(&b, 3, 0, UINT64_C(1) << 62); /* n_kv * 13 overflows */
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, NULL), FERRY_ELIMIT);
    {
        uint64_t ne[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        hdr(&b, 3, 1, 0), info(&b, "w", 9, ne, 0, 0), data(&b, 32, 4);
        CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "9 dimensions"), FERRY_ELIMIT);
        hdr(&b, 3, 1, 0), info(&b, "w", 8, ne, 0, 0), data(&b, 32, 4);
        CHECK_EQ_INT(expect(&b, 0, NULL), 0);
    }
    for (int depth = 8; depth <= 9; depth++) {
        hdr(&b, 3, 0, 1), key(&b, "deep", FERRY_VALUE_ARRAY);
        for (int i = 1; i < depth; i++)
            b_u32(&b, FERRY_VALUE_ARRAY), b_u64(&b, 1);
        b_u32(&b, FERRY_VALUE_U8), b_u64(&b, 1), b_u8(&b, 42);
        CHECK_EQ_INT(expect(&b, depth == 8 ? 0 : FERRY_ELIMIT, depth == 8 ? NULL : "'deep'"),
                     depth == 8 ? 0 : FERRY_ELIMIT);
    }
    hdr(&b, 3, 0, 1), b_u64(&b, FERRY__MAX_NAME + 1);
    for (unsigned i = 0; i <= FERRY__MAX_NAME; i++)
        b_u8(&b, 'k');
    b_u32(&b, FERRY_VALUE_U8), b_u8(&b, 0);
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "65536"), FERRY_ELIMIT);
    hdr(&b, 3, 0, 1), key(&b, "s", FERRY_VALUE_STRING), b_u64(&b, UINT64_C(1) << 62);
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "'s'"), FERRY_ELIMIT);
    hdr(&b, 3, 0, 1), key(&b, "a", FERRY_VALUE_ARRAY), b_u32(&b, FERRY_VALUE_U64),
        b_u64(&b, UINT64_C(1) << 61);
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "'a'"), FERRY_ELIMIT);
    hdr(&b, 3, 0, 1), key(&b, "a", FERRY_VALUE_ARRAY), b_u32(&b, FERRY_VALUE_STRING),
        b_u64(&b, 1000);
    CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, NULL), FERRY_ELIMIT);

    /* more metadata array items than ferry holds per file, though the file is big enough */
    {
        const size_t n = ((size_t)1 << 25) + 1;
        hdr(&b, 3, 0, 1), key(&b, "big", FERRY_VALUE_ARRAY), b_u32(&b, FERRY_VALUE_U8),
            b_u64(&b, n);
        static unsigned char ones[1 << 16];
        memset(ones, 1, sizeof ones);
        for (size_t left = n; left; left -= FERRY__MIN(left, sizeof ones))
            b_put(&b, ones, FERRY__MIN(left, sizeof ones));
        CHECK_EQ_INT(expect(&b, FERRY_ELIMIT, "'big'"), FERRY_ELIMIT);
    }

    /* EOVERFLOW */
    {
        uint64_t ne[3] = {UINT64_C(1) << 32, UINT64_C(1) << 32, UINT64_C(1) << 32};
        hdr(&b, 3, 1, 0), info(&b, "big", 3, ne, 0, 0), data(&b, 32, 4);
        CHECK_EQ_INT(expect(&b, FERRY_EOVERFLOW, "'big'"), FERRY_EOVERFLOW);
    }
    one_tensor(&b, UINT64_C(1) << 62, FERRY_DTYPE_F32, 0, 4);
    CHECK_EQ_INT(expect(&b, FERRY_EOVERFLOW, "'w'"), FERRY_EOVERFLOW);

    /* ERANGE */
    one_tensor(&b, 8, FERRY_DTYPE_F32, 0, 31);
    CHECK_EQ_INT(expect(&b, FERRY_ERANGE, "'w'"), FERRY_ERANGE);
    one_tensor(&b, 8, FERRY_DTYPE_F32, 1024, 64);
    CHECK_EQ_INT(expect(&b, FERRY_ERANGE, NULL), FERRY_ERANGE);
    one_tensor(&b, 8, FERRY_DTYPE_F32, UINT64_MAX - 31, 64); /* offset sum overflows */
    CHECK(expect(&b, FERRY_EOVERFLOW, NULL) == FERRY_EOVERFLOW);

    /* EOVERLAP */
    {
        uint64_t ne = 16;
        hdr(&b, 3, 2, 0), info(&b, "a", 1, &ne, 0, 0), info(&b, "b", 1, &ne, 0, 32);
        data(&b, 32, 128);
        CHECK_EQ_INT(expect(&b, FERRY_EOVERLAP, "'a'"), FERRY_EOVERLAP);
        hdr(&b, 3, 2, 0), info(&b, "a", 1, &ne, 0, 0), info(&b, "b", 1, &ne, 0, 64);
        data(&b, 32, 128);
        CHECK_EQ_INT(expect(&b, 0, NULL), 0);
    }

    /* EALIGN */
    uint32_t bad_align[] = {0, 3, 48, 1u << 21};
    for (size_t i = 0; i < 4; i++) {
        hdr(&b, 3, 0, 1), kv_u32(&b, "general.alignment", bad_align[i]);
        CHECK_EQ_INT(expect(&b, FERRY_EALIGN, "general.alignment"), FERRY_EALIGN);
    }
    one_tensor(&b, 8, FERRY_DTYPE_F32, 16, 64);
    CHECK_EQ_INT(expect(&b, FERRY_EALIGN, "16"), FERRY_EALIGN);
    {
        uint64_t ne = 4;
        hdr(&b, 3, 1, 1), kv_u32(&b, "general.alignment", 8), info(&b, "w", 1, &ne, 0, 8);
        data(&b, 8, 24);
        CHECK_EQ_INT(expect(&b, 0, NULL), 0); /* 8 is fine with alignment 8 */
    }

    /* EDUP */
    hdr(&b, 3, 0, 2), kv_u32(&b, "k", 1), kv_u32(&b, "k", 2);
    CHECK_EQ_INT(expect(&b, FERRY_EDUP, "'k'"), FERRY_EDUP);
    {
        uint64_t ne = 8;
        hdr(&b, 3, 2, 0), info(&b, "w", 1, &ne, 0, 0), info(&b, "w", 1, &ne, 0, 32);
        data(&b, 32, 64);
        CHECK_EQ_INT(expect(&b, FERRY_EDUP, "'w'"), FERRY_EDUP);
    }

    /* EDTYPE */
    uint32_t bad_types[] = {4, 5, 31, 36, 40, 99, 0xffffffffu};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(bad_types); i++) {
        one_tensor(&b, 32, bad_types[i], 0, 256);
        CHECK_EQ_INT(expect(&b, FERRY_EDTYPE, "'w'"), FERRY_EDTYPE);
    }

    /* ESHAPE */
    one_tensor(&b, UINT64_C(1) << 63, FERRY_DTYPE_F32, 0, 4);
    CHECK_EQ_INT(expect(&b, FERRY_ESHAPE, "negative"), FERRY_ESHAPE);
    one_tensor(&b, 48, FERRY_DTYPE_Q8_0, 0, 256);
    CHECK_EQ_INT(expect(&b, FERRY_ESHAPE, "48"), FERRY_ESHAPE);
    {
        uint64_t ne[2] = {16, 2}; /* 32 elements but the row is half a block */
        hdr(&b, 3, 1, 0), info(&b, "w", 2, ne, FERRY_DTYPE_Q4_0, 0), data(&b, 32, 64);
        CHECK_EQ_INT(expect(&b, FERRY_ESHAPE, NULL), FERRY_ESHAPE);
        hdr(&b, 3, 1, 0), info(&b, "s", 0, ne, FERRY_DTYPE_Q4_0, 0), data(&b, 32, 64);
        CHECK_EQ_INT(expect(&b, FERRY_ESHAPE, "'s'"), FERRY_ESHAPE);
    }

    /* ETYPE */
    hdr(&b, 3, 0, 1), key(&b, "general.alignment", FERRY_VALUE_U64), b_u64(&b, 32);
    CHECK_EQ_INT(expect(&b, FERRY_ETYPE, "general.alignment"), FERRY_ETYPE);
    hdr(&b, 3, 0, 1), key(&b, "general.alignment", FERRY_VALUE_STRING), b_str(&b, "32");
    CHECK_EQ_INT(expect(&b, FERRY_ETYPE, NULL), FERRY_ETYPE);

    /* zero-size tensors are fine anywhere in the data section, and empty files have no data */
    {
        uint64_t ne[2] = {0, 5};
        hdr(&b, 3, 1, 0), info(&b, "z", 2, ne, FERRY_DTYPE_Q4_0, 0), data(&b, 32, 0);
        CHECK_EQ_INT(expect(&b, 0, NULL), 0);
        hdr(&b, 2, 0, 0);
        CHECK_EQ_INT(expect(&b, 0, NULL), 0);
    }
}

/* Every prefix of a valid file is refused cleanly: a cut in the data section is ERANGE, a cut in
 * the header ETRUNC, except that early cuts leave a file too small for the declared counts
 * (ELIMIT). A bit flip anywhere never crashes nor leaks. */
static void test_truncation(void)
{
    bb b = {0};
    build_full(&b, 3);
    ferry__parsed full;
    CHECK_EQ_INT(parse(&b, &full), 0);
    uint64_t data_start = full.data_offset;
    ferry__parsed_free(&full);
    const size_t counts_need = 17 * 13 + 3 * 24; /* smallest kvs and infos vs. the file size */
    int bad = 0, clean = 1;
    for (size_t cut = 0; cut < b.n; cut++) {
        bb c = {0};
        b_put(&c, b.p, cut);
        ferry__parsed p;
        int rc = parse(&c, &p);
        int want = cut < 4                ? FERRY_EFORMAT
                   : cut >= data_start    ? FERRY_ERANGE
                   : cut < counts_need && cut >= 24 ? FERRY_ELIMIT
                                          : FERRY_ETRUNC;
        if (rc == 0)
            ferry__parsed_free(&p);
        else if (p.tensors || p.meta || p.n_tensors || p.n_meta || !err.msg[0])
            clean = 0;
        /* a cut inside the padding before the data section may also read as ERANGE */
        if (rc != want && !(want == FERRY_ETRUNC && rc == FERRY_ERANGE)) {
            if (bad++ < 5)
                fprintf(stderr, "  cut at %zu: %d, expected %d (%s)\n", cut, rc, want, err.msg);
        }
        b_free(&c);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(clean);
    for (size_t i = 0; i < b.n; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            b.p[i] ^= (unsigned char)(1u << bit);
            ferry__parsed p;
            if (parse(&b, &p) == 0)
                ferry__parsed_free(&p);
            b.p[i] ^= (unsigned char)(1u << bit);
        }
    }
    b_free(&b);
}

static void test_split_info(void)
{
    bb b = {0};
    ferry__parsed p;
    uint32_t no = 9, count = 9;
    hdr(&b, 3, 0, 0);
    CHECK_EQ_INT(parse(&b, &p), 0);
    CHECK_EQ_INT(ferry__gguf_split_info(&p, "t.gguf", &no, &count, &err), 0);
    CHECK(no == 0 && count == 1);
    ferry__parsed_free(&p);
    b_free(&b);

    hdr(&b, 3, 0, 2);
    key(&b, "split.no", FERRY_VALUE_U16), b_u16(&b, 1);
    key(&b, "split.count", FERRY_VALUE_U32), b_u32(&b, 3);
    CHECK_EQ_INT(parse(&b, &p), 0);
    CHECK_EQ_INT(ferry__gguf_split_info(&p, "t.gguf", &no, &count, &err), 0);
    CHECK(no == 1 && count == 3);
    ferry__parsed_free(&p);
    b_free(&b);

    hdr(&b, 3, 0, 1);
    key(&b, "split.count", FERRY_VALUE_STRING), b_str(&b, "3");
    CHECK_EQ_INT(parse(&b, &p), 0);
    CHECK_EQ_INT(ferry__gguf_split_info(&p, "t.gguf", &no, &count, &err), FERRY_ETYPE);
    ferry__parsed_free(&p);
    b_free(&b);

    hdr(&b, 3, 0, 2);
    key(&b, "split.no", FERRY_VALUE_U8), b_u8(&b, 3);
    key(&b, "split.count", FERRY_VALUE_U64), b_u64(&b, 3);
    CHECK_EQ_INT(parse(&b, &p), 0);
    CHECK_EQ_INT(ferry__gguf_split_info(&p, "t.gguf", &no, &count, &err), FERRY_EFORMAT);
    ferry__parsed_free(&p);
    b_free(&b);
}

/* 10,000 tensors parse in well under 50 ms (printed; checked against a loose bound so that
 * sanitizer builds pass). */
static void test_speed(void)
{
    bb b = {0};
    const int n = 10000;
    hdr(&b, 3, (uint64_t)n, 1);
    key(&b, "tokens", FERRY_VALUE_ARRAY), b_u32(&b, FERRY_VALUE_STRING), b_u64(&b, 30000);
    for (int i = 0; i < 30000; i++) {
        char s[32];
        snprintf(s, sizeof s, "tok%d", i);
        b_str(&b, s);
    }
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", i);
        uint64_t ne[2] = {32, 2};
        info(&b, name, 2, ne, FERRY_DTYPE_Q8_0, (uint64_t)(n - 1 - i) * 96); /* reversed order */
    }
    data(&b, 32, (size_t)n * 96);
    ferry__parsed p;
    double t0 = ferry__now();
    int rc = ferry__gguf_parse(b.p, b.n, "speed.gguf", &p, &err);
    double dt = ferry__now() - t0;
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(p.n_tensors, n);
    if (rc == 0)
        CHECK_STR(p.tensors[0].name, "blk.9999.ffn_down.weight");
    printf("parse of %d tensors + 30000 tokens: %.2f ms\n", n, dt * 1e3);
    CHECK(dt < 1.0);
    ferry__parsed_free(&p);
    b_free(&b);
}

int main(void)
{
    test_full(3);
    test_full(2);
    test_roundtrip();
    test_serialize_alignment();
    test_errors();
    test_truncation();
    test_split_info();
    test_speed();
    return check_finish();
}
