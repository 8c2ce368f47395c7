/*
 * test_safetensors.c — the safetensors reader and header writer (safetensors.c) and the sharded
 * index reader (index.c). Files are built byte by byte in memory; every error case of the table in
 * formats.h that applies to safetensors is checked with its exact code, and that a failed parse
 * leaves nothing behind (the sanitizer builds check for leaks).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype/dtype.h"
#include "formats/formats.h"

static ferry__err err;
#define PATH "m.safetensors"

static void put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* A file: the 8-byte length of HDR (or HLEN when not ~0), HDR, DATA_LEN bytes of data. */
static unsigned char *st_file_len(const char *hdr, uint64_t hlen, size_t data_len, size_t *size)
{
    size_t n = strlen(hdr);
    *size = 8 + n + data_len;
    unsigned char *f = malloc(*size);
    put_le64(f, hlen == UINT64_MAX ? n : hlen);
    memcpy(f + 8, hdr, n);
    for (size_t i = 0; i < data_len; i++)
        f[8 + n + i] = (unsigned char)(i * 7 + 1);
    return f;
}

/* Parses a file made of HDR and DATA_LEN bytes of data into *P (left for the caller to free);
 * checks the failure contract (OUT empty, message starting with the path). */
static int st_parse_keep(const char *hdr, size_t data_len, ferry__parsed *p)
{
    size_t size;
    unsigned char *f = st_file_len(hdr, UINT64_MAX, data_len, &size);
    ferry__err_clear(&err);
    memset(p, 0xAB, sizeof *p); /* the parser must not rely on OUT being initialised */
    int rc = ferry__safetensors_parse(f, size, PATH, p, &err);
    free(f);
    if (rc) {
        CHECK(p->n_tensors == 0 && p->tensors == NULL && p->n_meta == 0 && p->meta == NULL);
        CHECK(err.code == rc && strncmp(err.msg, PATH ": ", strlen(PATH) + 2) == 0);
    }
    return rc;
}

static int st_parse(const char *hdr, size_t data_len)
{
    ferry__parsed p;
    int rc = st_parse_keep(hdr, data_len, &p);
    ferry__parsed_free(&p);
    return rc;
}

static const ferry__tdesc *find(const ferry__parsed *p, const char *name)
{
    for (size_t i = 0; i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0)
            return &p->tensors[i];
    return NULL;
}

static void test_basic(void)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a\\\"b\\u00e9\"},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
                      "\"b\":{\"data_offsets\":[0,8],\"shape\":[4],\"dtype\":\"F16\"}}  ";
    uint64_t n = strlen(hdr);
    ferry__parsed p;
    int rc = st_parse_keep(hdr, 32, &p);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK_EQ_INT(p.format, FERRY_FORMAT_SAFETENSORS);
    CHECK_EQ_INT(p.data_offset, 8 + n);
    CHECK_EQ_INT(p.alignment, 1);
    CHECK_EQ_INT(p.n_tensors, 2);
    /* Sorted by offset, offsets absolute. */
    CHECK_STR(p.tensors[0].name, "b");
    CHECK_EQ_INT(p.tensors[0].offset, 8 + n);
    CHECK_EQ_INT(p.tensors[0].nbytes, 8);
    CHECK_EQ_INT(p.tensors[0].dtype, FERRY_DTYPE_F16);
    CHECK_EQ_INT(p.tensors[0].ndim, 1);
    CHECK_EQ_INT(p.tensors[0].shape[0], 4);
    CHECK_STR(p.tensors[1].name, "w");
    CHECK_EQ_INT(p.tensors[1].offset, 8 + n + 8);
    CHECK_EQ_INT(p.tensors[1].nbytes, 24);
    CHECK_EQ_INT(p.tensors[1].dtype, FERRY_DTYPE_F32);
    CHECK_EQ_INT(p.tensors[1].ndim, 2);
    CHECK(p.tensors[1].shape[0] == 2 && p.tensors[1].shape[1] == 3);
    CHECK_EQ_INT(p.n_meta, 2);
    if (p.n_meta == 2) {
        CHECK_STR(p.meta[0].key, "format");
        CHECK_EQ_INT(p.meta[0].val.type, FERRY_VALUE_STRING);
        CHECK_STR(p.meta[0].val.v.str.ptr, "pt");
        CHECK_EQ_INT(p.meta[0].val.v.str.len, 2);
        CHECK_STR(p.meta[1].key, "note");
        CHECK_STR(p.meta[1].val.v.str.ptr, "a\"b\xc3\xa9");
        CHECK_EQ_INT(p.meta[1].val.v.str.len, 5);
    }
    ferry__parsed_free(&p);

    /* No tensors at all; no metadata. */
    CHECK_EQ_INT(st_parse_keep("{}", 0, &p), 0);
    CHECK_EQ_INT(p.n_tensors, 0);
    CHECK_EQ_INT(p.data_offset, 10);
    ferry__parsed_free(&p);
    CHECK_EQ_INT(st_parse("{\"__metadata__\":{}}", 0), 0);
    /* Padding after the object, and whitespace inside it. */
    CHECK_EQ_INT(st_parse("{ \"x\" : { \"dtype\" : \"U8\" , \"shape\" : [ 3 ] ,"
                          " \"data_offsets\" : [ 0 , 3 ] } }\n     ",
                          3),
                 0);
    /* Data after the last tensor, gaps between tensors: allowed. */
    CHECK_EQ_INT(st_parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                          "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,12]}}",
                          100),
                 0);
}

static void test_dtypes(void)
{
    static const struct {
        const char *st;
        ferry_dtype t;
        uint64_t bytes; /* of 4 elements */
    } types[] = {
        {"BOOL", FERRY_DTYPE_BOOL, 4},       {"U8", FERRY_DTYPE_U8, 4},
        {"I8", FERRY_DTYPE_I8, 4},           {"F8_E5M2", FERRY_DTYPE_F8_E5M2, 4},
        {"F8_E4M3", FERRY_DTYPE_F8_E4M3, 4}, {"F8_E8M0", FERRY_DTYPE_F8_E8M0, 4},
        {"I16", FERRY_DTYPE_I16, 8},         {"U16", FERRY_DTYPE_U16, 8},
        {"F16", FERRY_DTYPE_F16, 8},         {"BF16", FERRY_DTYPE_BF16, 8},
        {"I32", FERRY_DTYPE_I32, 16},        {"U32", FERRY_DTYPE_U32, 16},
        {"F32", FERRY_DTYPE_F32, 16},        {"F64", FERRY_DTYPE_F64, 32},
        {"I64", FERRY_DTYPE_I64, 32},        {"U64", FERRY_DTYPE_U64, 32},
        {"C64", FERRY_DTYPE_C64, 32},        {"F6_E2M3", FERRY_DTYPE_F6_E2M3, 3},
        {"F6_E3M2", FERRY_DTYPE_F6_E3M2, 3}, {"F4", FERRY_DTYPE_F4, 2},
    };
    ferry__buf b = {0};
    ferry__buf_put(&b, "{", 1);
    uint64_t off = 0;
    for (size_t i = 0; i < FERRY__ARRAY_LEN(types); i++) {
        ferry__buf_printf(&b,
                          "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[2,2],"
                          "\"data_offsets\":[%llu,%llu]}",
                          i ? "," : "", types[i].st, types[i].st, (unsigned long long)off,
                          (unsigned long long)(off + types[i].bytes));
        off += types[i].bytes;
    }
    ferry__buf_put(&b, "}", 1);
    ferry__parsed p;
    int rc = st_parse_keep(b.p, off, &p);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK_EQ_INT(p.n_tensors, FERRY__ARRAY_LEN(types));
    for (size_t i = 0; rc == 0 && i < FERRY__ARRAY_LEN(types); i++) {
        char name[32];
        snprintf(name, sizeof name, "t_%s", types[i].st);
        const ferry__tdesc *t = find(&p, name);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK_EQ_INT(t->dtype, types[i].t);
        CHECK_EQ_INT(t->nbytes, types[i].bytes);
        /* And the writer spells it the same way. */
        CHECK_STR(ferry__dtype_st_name(types[i].t), types[i].st);
    }
    ferry__parsed_free(&p);
    free(b.p);

    /* Packed types: a partial block is a shape error. */
    CHECK_EQ_INT(
        st_parse("{\"x\":{\"dtype\":\"F6_E2M3\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3),
        FERRY_ESHAPE);
    CHECK_EQ_INT(st_parse("{\"x\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
                 FERRY_ESHAPE);
}

static void test_shapes(void)
{
    ferry__parsed p;
    /* A 0-dim scalar holds one element. */
    const char *hdr = "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                      "\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                      "\"e2\":{\"dtype\":\"BF16\",\"shape\":[3,0,5],\"data_offsets\":[4,4]},"
                      "\"end\":{\"dtype\":\"F32\",\"shape\":[7,0],\"data_offsets\":[8,8]},"
                      "\"m\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],"
                      "\"data_offsets\":[8,10]}}";
    int rc = st_parse_keep(hdr, 10, &p);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        const ferry__tdesc *s = find(&p, "s"), *e2 = find(&p, "e2"), *m = find(&p, "m");
        CHECK(s && s->ndim == 0 && s->nbytes == 8);
        CHECK(e2 && e2->ndim == 3 && e2->nbytes == 0 && e2->shape[1] == 0 && e2->shape[2] == 5);
        CHECK(m && m->ndim == FERRY_MAX_DIMS && m->shape[7] == 2);
        /* Zero-byte tensors at the very end of the file are inside it. */
        CHECK(find(&p, "end") && find(&p, "end")->offset == p.data_offset + 8);
    }
    ferry__parsed_free(&p);
    /* Empty tensor whose offset lies at the end of the data section is fine; beyond is not. */
    CHECK_EQ_INT(st_parse("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[5,5]}}", 5), 0);
    CHECK_EQ_INT(st_parse("{\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[6,6]}}", 5),
                 FERRY_ERANGE);
    /* Big but consistent numbers. */
    CHECK_EQ_INT(st_parse("{\"x\":{\"dtype\":\"U8\",\"shape\":[4294967296,0],"
                          "\"data_offsets\":[0,0]}}",
                          0),
                 0);
}

static void test_errors(void)
{
    struct {
        const char *hdr;
        size_t data;
        int rc;
        const char *msg; /* a piece the message must contain, or NULL */
    } cases[] = {
        /* header */
        {"", 0, FERRY_EJSON, NULL},
        {"{", 0, FERRY_EJSON, NULL},
        {"{} x", 0, FERRY_EJSON, "at byte 3"},
        {"{\"a\":1,}", 0, FERRY_EJSON, NULL},
        {"{\"a\xff\":{}}", 0, FERRY_EJSON, "UTF-8"},
        {"[]", 0, FERRY_EFORMAT, "not a JSON object"},
        {"\"x\"", 0, FERRY_EFORMAT, NULL},
        /* metadata */
        {"{\"__metadata__\":[]}", 0, FERRY_EFORMAT, "__metadata__"},
        {"{\"__metadata__\":\"x\"}", 0, FERRY_EFORMAT, NULL},
        {"{\"__metadata__\":{\"k\":1}}", 0, FERRY_ETYPE, "'k'"},
        {"{\"__metadata__\":{\"a\":\"b\",\"k\":null}}", 0, FERRY_ETYPE, NULL},
        {"{\"__metadata__\":{\"k\":{}}}", 0, FERRY_ETYPE, NULL},
        {"{\"__metadata__\":{\"k\":[\"x\"]}}", 0, FERRY_ETYPE, NULL},
        {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, FERRY_EDUP, "\"k\""},
        /* tensor entries */
        {"{\"t\":1}", 0, FERRY_EFORMAT, "'t'"},
        {"{\"t\":[]}", 0, FERRY_EFORMAT, NULL},
        {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_EFORMAT, "dtype"},
        {"{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, FERRY_EFORMAT, "shape"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, FERRY_EFORMAT, "data_offsets"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":0}}", 1,
         FERRY_EFORMAT, "extra"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"dtype\":\"U8\"}}", 1,
         FERRY_EDUP, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         2, FERRY_EDUP, "'t'"},
        /* dtype */
        {"{\"t\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_EDTYPE,
         "F17"},
        {"{\"t\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FERRY_EDTYPE, NULL},
        {"{\"t\":{\"dtype\":\"Q8_0\",\"shape\":[32],\"data_offsets\":[0,34]}}", 34, FERRY_EDTYPE,
         NULL},
        {"{\"t\":{\"dtype\":\"\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_EDTYPE, NULL},
        {"{\"t\":{\"dtype\":\"F32\\u0000\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         FERRY_EDTYPE, NULL},
        {"{\"t\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, FERRY_EFORMAT, NULL},
        /* shape */
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, FERRY_EFORMAT, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         FERRY_ELIMIT, "9 dimensions"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         "-1"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[2,-0],\"data_offsets\":[0,0]}}", 0, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[null],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[[1]],\"data_offsets\":[0,1]}}", 1, FERRY_ESHAPE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[18446744073709551616],\"data_offsets\":[0,1]}}", 1,
         FERRY_EOVERFLOW, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,1]}}", 1,
         FERRY_EOVERFLOW, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,1]}}",
         1, FERRY_EOVERFLOW, NULL},
        {"{\"t\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", 8,
         FERRY_EOVERFLOW, NULL},
        /* data_offsets */
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":0}}", 1, FERRY_EFORMAT, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 1, FERRY_EFORMAT, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2, FERRY_EFORMAT,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, FERRY_EFORMAT,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1, FERRY_EFORMAT,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",1]}}", 1, FERRY_EFORMAT,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}", 2, FERRY_EFORMAT,
         "[2, 1]"},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,18446744073709551616]}}", 1,
         FERRY_EOVERFLOW, NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[18446744073709551615,"
         "18446744073709551615]}}",
         1, FERRY_EOVERFLOW, NULL},
        /* size disagreement: names expected and found bytes */
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, FERRY_ESHAPE,
         "needs 24 bytes"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,28]}}", 28, FERRY_ESHAPE,
         "hold 28"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}", 4, FERRY_ESHAPE, NULL},
        /* range and overlap */
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, FERRY_ERANGE,
         "'t'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[100,108]}}", 8, FERRY_ERANGE,
         NULL},
        {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],"
         "\"data_offsets\":[18446744073709551614,18446744073709551615]}}",
         8, FERRY_EOVERFLOW, NULL},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, FERRY_EOVERLAP, "'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, FERRY_EOVERLAP, NULL},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
         8, FERRY_EOVERLAP, NULL},
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(cases); i++) {
        int rc = st_parse(cases[i].hdr, cases[i].data);
        CHECK_EQ_INT(rc, cases[i].rc);
        if (rc == cases[i].rc && cases[i].msg)
            CHECK(strstr(err.msg, cases[i].msg) != NULL);
        if (rc != cases[i].rc || (cases[i].msg && !strstr(err.msg, cases[i].msg)))
            fprintf(stderr, "  case %zu: %s\n", i, err.msg);
    }
}

static void test_header_length(void)
{
    ferry__parsed p;
    size_t size;
    unsigned char *f;
    /* Shorter than the length field. */
    unsigned char tiny[7] = {2, 0, 0, 0, 0, 0, 0};
    for (size_t n = 0; n < 8; n++) {
        CHECK_EQ_INT(ferry__safetensors_parse(tiny, n, PATH, &p, &err), FERRY_ETRUNC);
        CHECK(p.n_tensors == 0 && p.tensors == NULL);
    }
    /* A header longer than the file. */
    f = st_file_len("{}", 3, 0, &size);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_ETRUNC);
    CHECK(strstr(err.msg, PATH) == err.msg);
    free(f);
    f = st_file_len("{}", 1000, 0, &size);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_ETRUNC);
    free(f);
    /* Over the limit, whether or not the file is that long. */
    f = st_file_len("{}", FERRY__MAX_ST_HEADER + 1, 0, &size);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_ELIMIT);
    free(f);
    f = st_file_len("{}", UINT64_MAX, 0, &size);
    put_le64(f, UINT64_MAX);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_ELIMIT);
    put_le64(f, UINT64_C(1) << 63);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_ELIMIT);
    free(f);
    /* A length shorter than the JSON cuts it: the JSON is then invalid. */
    f = st_file_len("{\"a\":{}}", 5, 0, &size);
    CHECK_EQ_INT(ferry__safetensors_parse(f, size, PATH, &p, &err), FERRY_EJSON);
    free(f);
    /* Exactly at the limit the length itself is accepted (the padding is all whitespace). */
    size_t big = (size_t)FERRY__MAX_ST_HEADER;
    f = malloc(8 + big);
    put_le64(f, big);
    memset(f + 8, ' ', big);
    memcpy(f + 8, "{}", 2);
    CHECK_EQ_INT(ferry__safetensors_parse(f, 8 + big, PATH, &p, &err), 0);
    CHECK_EQ_INT(p.data_offset, 8 + big);
    ferry__parsed_free(&p);
    free(f);
    /* Names: up to FERRY__MAX_NAME bytes. */
    ferry__buf b = {0};
    for (int over = 0; over < 2; over++) {
        b.len = 0;
        ferry__buf_put(&b, "{\"", 2);
        for (size_t i = 0; i < FERRY__MAX_NAME + (size_t)over; i++)
            ferry__buf_put(&b, "n", 1);
        ferry__buf_put(&b, "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 50);
        CHECK_EQ_INT(st_parse(b.p, 1), over ? FERRY_ELIMIT : 0);
    }
    free(b.p);
}

/* Builds a ferry__parsed by hand (what the writer gets). */
static void add(ferry__parsed *p, const char *name, ferry_dtype t, uint32_t ndim,
                const int64_t *shape, uint64_t nbytes)
{
    ferry__tdesc d = {.name = ferry__strdup(name), .dtype = t, .ndim = ndim, .nbytes = nbytes};
    for (uint32_t i = 0; i < ndim; i++)
        d.shape[i] = shape[i];
    CHECK_EQ_INT(ferry__parsed_add_tensor(p, &d), 0);
}

static void add_meta_str(ferry__parsed *p, const char *k, const char *v, size_t n)
{
    ferry_value val = {.type = FERRY_VALUE_STRING};
    val.v.str.ptr = ferry__strndup(v, n);
    val.v.str.len = n;
    CHECK_EQ_INT(ferry__parsed_add_meta(p, ferry__strdup(k), &val), 0);
}

static void test_roundtrip(void)
{
    ferry__parsed p = {0};
    add_meta_str(&p, "format", "pt", 2);
    static const char odd[] = "tab\there \\ \xe2\x82\xac \x01 nul\0end";
    add_meta_str(&p, "odd \"key\"\n", odd, sizeof odd - 1);
    int64_t s23[] = {2, 3}, s4[] = {4}, s0[] = {0, 5}, s6[] = {6}, big[] = {1, 1, 1, 1, 1, 1, 1, 3};
    add(&p, "z.weight", FERRY_DTYPE_F32, 2, s23, 24);
    add(&p, "scalar", FERRY_DTYPE_F64, 0, NULL, 8);
    add(&p, "empty", FERRY_DTYPE_BF16, 2, s0, 0);
    add(&p, "a.bias", FERRY_DTYPE_F16, 1, s4, 8);
    add(&p, "fp4", FERRY_DTYPE_F4, 1, s6, 3);
    add(&p, "caf\xc3\xa9/\"q\"", FERRY_DTYPE_I64, 8, big, 24);
    unsigned char *hdr = NULL;
    size_t len = 0;
    int rc = ferry__safetensors_serialize(&p, &hdr, &len, &err);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        ferry__parsed_free(&p);
        return;
    }
    CHECK_EQ_INT(len % 8, 0);
    CHECK_EQ_INT(p.data_offset, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | hdr[i];
    CHECK_EQ_INT(n + 8, len);
    CHECK(hdr[8] == '{');
    CHECK_EQ_INT(ferry__detect(hdr, len), FERRY_FORMAT_SAFETENSORS);
    /* Packed in the given order from the start of the data section. */
    uint64_t expect[] = {0, 24, 32, 32, 40, 43}, total = 67;
    for (size_t i = 0; i < p.n_tensors; i++)
        CHECK_EQ_INT(p.tensors[i].offset, len + expect[i]);

    size_t fsize = len + (size_t)total;
    unsigned char *file = calloc(1, fsize);
    memcpy(file, hdr, len);
    free(hdr);
    ferry__parsed q;
    rc = ferry__safetensors_parse(file, fsize, "rt.safetensors", &q, &err);
    CHECK_EQ_INT(rc, 0);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK_EQ_INT(q.n_tensors, p.n_tensors);
    CHECK_EQ_INT(q.data_offset, len);
    for (size_t i = 0; rc == 0 && i < p.n_tensors; i++) {
        const ferry__tdesc *a = &p.tensors[i], *b = find(&q, a->name);
        CHECK(b != NULL);
        if (!b)
            continue;
        CHECK_EQ_INT(b->dtype, a->dtype);
        CHECK_EQ_INT(b->ndim, a->ndim);
        CHECK(memcmp(b->shape, a->shape, a->ndim * sizeof a->shape[0]) == 0);
        CHECK_EQ_INT(b->offset, a->offset);
        CHECK_EQ_INT(b->nbytes, a->nbytes);
    }
    CHECK_EQ_INT(q.n_meta, 2);
    for (size_t i = 0; rc == 0 && i < 2 && i < q.n_meta; i++) {
        CHECK_STR(q.meta[i].key, p.meta[i].key);
        CHECK_EQ_INT(q.meta[i].val.type, FERRY_VALUE_STRING);
        CHECK_EQ_INT(q.meta[i].val.v.str.len, p.meta[i].val.v.str.len);
        CHECK(memcmp(q.meta[i].val.v.str.ptr, p.meta[i].val.v.str.ptr,
                     p.meta[i].val.v.str.len) == 0);
    }
    /* Serializing what was parsed gives the same header again (same order here: the parse
     * sorted by offset, which is the order written). */
    unsigned char *hdr2 = NULL;
    size_t len2 = 0;
    ferry__parsed r = {0};
    for (size_t i = 0; i < q.n_meta; i++)
        add_meta_str(&r, q.meta[i].key, q.meta[i].val.v.str.ptr, q.meta[i].val.v.str.len);
    for (size_t i = 0; i < q.n_tensors; i++)
        add(&r, q.tensors[i].name, q.tensors[i].dtype, q.tensors[i].ndim, q.tensors[i].shape,
            q.tensors[i].nbytes);
    CHECK_EQ_INT(ferry__safetensors_serialize(&r, &hdr2, &len2, &err), 0);
    CHECK(len2 == len && hdr2 && memcmp(hdr2, file, len) == 0);
    free(hdr2);
    ferry__parsed_free(&r);
    ferry__parsed_free(&q);
    ferry__parsed_free(&p);
    free(file);

    /* Nothing at all: "{}" padded to 8. */
    ferry__parsed e = {0};
    CHECK_EQ_INT(ferry__safetensors_serialize(&e, &hdr, &len, &err), 0);
    CHECK_EQ_INT(len, 16);
    CHECK(hdr && hdr[0] == 8 && memcmp(hdr + 8, "{}      ", 8) == 0);
    CHECK_EQ_INT(e.data_offset, 16);
    CHECK_EQ_INT(ferry__safetensors_parse(hdr, len, PATH, &e, &err), 0);
    ferry__parsed_free(&e);
    free(hdr);
}

static int ser(ferry__parsed *p)
{
    unsigned char *hdr = (unsigned char *)"x";
    size_t len = 5;
    ferry__err_clear(&err);
    int rc = ferry__safetensors_serialize(p, &hdr, &len, &err);
    if (rc) {
        CHECK(hdr == NULL && len == 0);
        CHECK(err.code == rc && err.msg[0]);
    }
    free(rc ? NULL : hdr);
    ferry__parsed_free(p);
    return rc;
}

static void test_serialize_errors(void)
{
    int64_t s32[] = {32}, s4[] = {4}, neg[] = {-4};
    ferry__parsed p = {0};
    add(&p, "ok", FERRY_DTYPE_F32, 1, s4, 16);
    add(&p, "q", FERRY_DTYPE_Q8_0, 1, s32, 34);
    CHECK_EQ_INT(ser(&p), FERRY_EDTYPE);
    CHECK(strstr(err.msg, "'q'"));

    add(&p, "w", FERRY_DTYPE_F32, 1, s4, 12);
    CHECK_EQ_INT(ser(&p), FERRY_ESHAPE);
    add(&p, "w", FERRY_DTYPE_F32, 1, neg, 0);
    CHECK_EQ_INT(ser(&p), FERRY_ESHAPE);
    add(&p, "w", FERRY_DTYPE_F32, 1, s4, 16);
    add(&p, "w", FERRY_DTYPE_F32, 1, s4, 16);
    CHECK_EQ_INT(ser(&p), FERRY_EDUP);
    add(&p, "__metadata__", FERRY_DTYPE_F32, 1, s4, 16);
    CHECK_EQ_INT(ser(&p), FERRY_EINVAL);
    add(&p, "bad\xff", FERRY_DTYPE_F32, 1, s4, 16);
    CHECK_EQ_INT(ser(&p), FERRY_EINVAL);

    add(&p, "w", FERRY_DTYPE_F32, 1, s4, 16);
    ferry_value v = {.type = FERRY_VALUE_U64};
    v.v.u = 3;
    CHECK_EQ_INT(ferry__parsed_add_meta(&p, ferry__strdup("n"), &v), 0);
    CHECK_EQ_INT(ser(&p), FERRY_ETYPE);
    CHECK(strstr(err.msg, "'n'"));
    add_meta_str(&p, "k", "a", 1);
    add_meta_str(&p, "k", "b", 1);
    CHECK_EQ_INT(ser(&p), FERRY_EDUP);
    /* The same key as a tensor name and a metadata key is fine. */
    add_meta_str(&p, "w", "x", 1);
    add(&p, "w", FERRY_DTYPE_F32, 1, s4, 16);
    CHECK_EQ_INT(ser(&p), 0);
}

/* ---- index ----------------------------------------------------------------------------------- */

static int ix_parse(const char *doc, ferry__index *ix)
{
    ferry__err_clear(&err);
    memset(ix, 0x5A, sizeof *ix);
    int rc = ferry__index_parse((const unsigned char *)doc, strlen(doc), "m.index.json", ix, &err);
    if (rc) {
        CHECK(ix->n_shards == 0 && ix->shards == NULL && ix->n_names == 0 && ix->names == NULL &&
              ix->n_meta == 0 && ix->meta == NULL);
        CHECK(err.code == rc && strncmp(err.msg, "m.index.json: ", 14) == 0);
    }
    return rc;
}

static void test_index(void)
{
    const char *doc =
        "{\"metadata\":{\"total_size\":123456789012,\"format\":\"pt\",\"ratio\":1.5,\"neg\":-3,"
        "\"flag\":true,\"nothing\":null,\"list\":[1]},"
        "\"weight_map\":{\"lm_head.weight\":\"model-00002-of-00002.safetensors\","
        "\"embed\":\"model-00001-of-00002.safetensors\","
        "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
        "\"layers.1.w\":\"model-00002-of-00002.safetensors\","
        "\"x\":\"sub/dir/./model-00003.safetensors\"},\"extra\":{\"ignored\":1}}";
    ferry__index ix;
    int rc = ix_parse(doc, &ix);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    CHECK_EQ_INT(ix.n_shards, 3);
    CHECK_STR(ix.shards[0], "model-00002-of-00002.safetensors");
    CHECK_STR(ix.shards[1], "model-00001-of-00002.safetensors");
    CHECK_STR(ix.shards[2], "sub/dir/./model-00003.safetensors");
    CHECK_EQ_INT(ix.n_names, 5);
    CHECK_STR(ix.names[0], "lm_head.weight");
    CHECK_STR(ix.names[2], "layers.0.w");
    uint32_t want[] = {0, 1, 1, 0, 2};
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(ix.shard_of[i], want[i]);
    CHECK_EQ_INT(ix.n_meta, 4);
    if (ix.n_meta == 4) {
        CHECK_STR(ix.meta[0].key, "total_size");
        CHECK_EQ_INT(ix.meta[0].val.type, FERRY_VALUE_U64);
        CHECK(ix.meta[0].val.v.u == UINT64_C(123456789012));
        CHECK_STR(ix.meta[1].key, "format");
        CHECK_EQ_INT(ix.meta[1].val.type, FERRY_VALUE_STRING);
        CHECK_STR(ix.meta[1].val.v.str.ptr, "pt");
        CHECK_STR(ix.meta[2].key, "ratio");
        CHECK_EQ_INT(ix.meta[2].val.type, FERRY_VALUE_STRING);
        CHECK_STR(ix.meta[2].val.v.str.ptr, "1.5");
        CHECK_EQ_INT(ix.meta[2].val.v.str.len, 3);
        CHECK_STR(ix.meta[3].key, "neg");
        CHECK_STR(ix.meta[3].val.v.str.ptr, "-3");
    }
    ferry__index_free(&ix);
    ferry__index_free(&ix); /* idempotent on a freed index */
    ferry__index_free(NULL);

    /* Without metadata; an empty map. */
    CHECK_EQ_INT(ix_parse("{\"weight_map\":{\"a\":\"s.safetensors\"}}", &ix), 0);
    CHECK(ix.n_shards == 1 && ix.n_names == 1 && ix.n_meta == 0);
    ferry__index_free(&ix);
    CHECK_EQ_INT(ix_parse("{\"weight_map\":{}}", &ix), 0);
    CHECK(ix.n_shards == 0 && ix.n_names == 0);
    ferry__index_free(&ix);
    /* Names that merely contain dots are fine. */
    CHECK_EQ_INT(ix_parse("{\"weight_map\":{\"a\":\"a..b\",\"b\":\"...\",\"c\":\"..x/y..\","
                          "\"d\":\".hidden\"}}",
                          &ix),
                 0);
    CHECK_EQ_INT(ix.n_shards, 4);
    ferry__index_free(&ix);

    struct {
        const char *doc;
        int rc;
    } bad[] = {
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"ok.safetensors\",\"b\":\"d/../../x\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"d/..\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"..\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"d/../x\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"d\\\\x\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"..\\\\x\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"x\\u0000.safetensors\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"dir/\"}}", FERRY_EPATH},
        {"{\"weight_map\":{\"a\":\"//x\"}}", FERRY_EPATH},
        {"{}", FERRY_EFORMAT},
        {"[]", FERRY_EFORMAT},
        {"{\"metadata\":{}}", FERRY_EFORMAT},
        {"{\"weight_map\":[]}", FERRY_EFORMAT},
        {"{\"weight_map\":{\"a\":1}}", FERRY_EFORMAT},
        {"{\"weight_map\":{\"a\":\"x\",\"b\":null}}", FERRY_EFORMAT},
        {"{\"weight_map\":{},\"metadata\":[]}", FERRY_EFORMAT},
        {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", FERRY_EDUP},
        {"{\"weight_map\":{\"a\":\"x\"},\"weight_map\":{}}", FERRY_EDUP},
        {"{\"weight_map\":{\"a\":\"x\",}}", FERRY_EJSON},
        {"", FERRY_EJSON},
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(bad); i++) {
        rc = ix_parse(bad[i].doc, &ix);
        CHECK_EQ_INT(rc, bad[i].rc);
        if (rc != bad[i].rc)
            fprintf(stderr, "  index case %zu: %s\n", i, err.msg);
        if (rc == FERRY_EPATH)
            CHECK(strstr(err.msg, "'a'") || strstr(err.msg, "'b'"));
        if (!rc)
            ferry__index_free(&ix);
    }
    /* Failures after metadata and shards were collected leave nothing behind. */
    CHECK_EQ_INT(ix_parse("{\"metadata\":{\"s\":\"x\",\"n\":1.5},\"weight_map\":{\"a\":\"x\","
                          "\"b\":\"y\",\"c\":\"../z\"}}",
                          &ix),
                 FERRY_EPATH);
}

/* Opening a 10,000-tensor header must be quick (the time is printed, not asserted). */
static void test_many(void)
{
    enum { N = 10000 };
    ferry__buf b = {0};
    ferry__buf_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < N; i++)
        ferry__buf_printf(&b, ",\"model.layers.%d.self_attn.q_proj.weight\":{\"dtype\":\"BF16\","
                              "\"shape\":[2,%d],\"data_offsets\":[%d,%d]}",
                          N - 1 - i, 4, (N - 1 - i) * 16, (N - i) * 16);
    ferry__buf_put(&b, "}", 1);
    size_t size;
    unsigned char *f = st_file_len(b.p, UINT64_MAX, (size_t)N * 16, &size);
    free(b.p);
    ferry__parsed p;
    double t0 = ferry__now();
    int rc = ferry__safetensors_parse(f, size, PATH, &p, &err);
    double t1 = ferry__now();
    ferry__parsed_free(&p);
    double t2 = ferry__now();
    printf("parsed a %d-tensor safetensors header in %.2f ms (+%.2f ms to free)\n", N,
           (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    CHECK_EQ_INT(rc, 0);
    rc = ferry__safetensors_parse(f, size, PATH, &p, &err);
    CHECK_EQ_INT(p.n_tensors, N);
    if (rc == 0 && p.n_tensors == N) {
        int sorted = 1;
        for (size_t i = 1; i < N; i++)
            sorted &= p.tensors[i].offset == p.tensors[i - 1].offset + 16;
        CHECK(sorted);
        CHECK_STR(p.tensors[0].name, "model.layers.0.self_attn.q_proj.weight");
    }
    ferry__parsed_free(&p);
    free(f);
}

int main(void)
{
    test_basic();
    test_dtypes();
    test_shapes();
    test_errors();
    test_header_length();
    test_roundtrip();
    test_serialize_errors();
    test_index();
    test_many();
    return check_finish();
}
