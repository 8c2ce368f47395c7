/*
 * test_hostile.c — malformed model files, written byte by byte, opened with ferry_catalog_add.
 *
 * Each must be refused with exactly the error code that the table in src/formats/formats.h names,
 * with a message that names the file, and the catalog left as it was: the count of tensors, files
 * and metadata unchanged by the failure, and a valid file still opening in the same catalog
 * afterwards. Then every truncation of a valid GGUF and a valid safetensors file, through the
 * catalog and through the in-memory readers on heap buffers of the exact size (so that ASan sees
 * any read past the end).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "ferry.h"
#include "formats/formats.h"

/* ---- a growing byte buffer and the little-endian pieces of both formats ---------------------- */

typedef struct bb {
    unsigned char *p;
    size_t len, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "test_hostile: out of memory\n");
            exit(2);
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u16(bb *b, uint16_t v)
{
    unsigned char x[2] = {(unsigned char)v, (unsigned char)(v >> 8)};
    bb_put(b, x, 2);
}
static void bb_u32(bb *b, uint32_t v)
{
    unsigned char x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    bb_put(b, x, 4);
}
static void bb_u64(bb *b, uint64_t v)
{
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    bb_put(b, x, 8);
}
static void bb_f32(bb *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    bb_u32(b, u);
}
static void bb_f64(bb *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    bb_u64(b, u);
}
static void bb_zeros(bb *b, size_t n)
{
    while (n--)
        bb_u8(b, 0);
}
static void bb_pad(bb *b, size_t align)
{
    while (b->len % align)
        bb_u8(b, 0);
}
static void bb_cat(bb *b, const bb *o) { bb_put(b, o->p, o->len); }
static void bb_free(bb *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
/* GGUF string: u64 length, then the bytes. */
static void bb_gstr(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

/* GGUF metadata value types. */
enum { GV_U8, GV_I8, GV_U16, GV_I16, GV_U32, GV_I32, GV_F32, GV_BOOL, GV_STR, GV_ARR, GV_U64,
       GV_I64, GV_F64 };
/* GGUF tensor type ids used here. */
enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q8_0 = 8, GT_Q4_K = 12, GT_BF16 = 30 };

/* A GGUF file under construction: header counts, the kv and tensor-info sections, the alignment
 * the data section starts at, and the bytes of data (zeros) after it. The counts follow what was
 * added; hostile cases overwrite them afterwards. */
typedef struct gg {
    uint32_t version;
    uint64_t n_tensors, n_kv;
    bb kv, ti;
    uint64_t align;
    uint64_t data;
} gg;

static void gg_init(gg *g)
{
    memset(g, 0, sizeof *g);
    g->version = 3;
    g->align = 32;
}
static void gg_free(gg *g)
{
    bb_free(&g->kv);
    bb_free(&g->ti);
}
static void g_key(gg *g, const char *k, uint32_t type)
{
    bb_gstr(&g->kv, k);
    bb_u32(&g->kv, type);
    g->n_kv++;
}
static void g_kv_u32(gg *g, const char *k, uint32_t v)
{
    g_key(g, k, GV_U32);
    bb_u32(&g->kv, v);
}
static void g_kv_str(gg *g, const char *k, const char *v)
{
    g_key(g, k, GV_STR);
    bb_gstr(&g->kv, v);
}
static void g_tensor(gg *g, const char *name, uint32_t ndim, const int64_t *ne, uint32_t type,
                     uint64_t off)
{
    bb_gstr(&g->ti, name);
    bb_u32(&g->ti, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        bb_u64(&g->ti, (uint64_t)ne[i]);
    bb_u32(&g->ti, type);
    bb_u64(&g->ti, off);
    g->n_tensors++;
}
/* Header, kvs, tensor infos, padding to the alignment, data. *HDR (may be NULL) receives the
 * length of the part before the padding. */
static void gg_build(const gg *g, bb *out, size_t *hdr)
{
    memset(out, 0, sizeof *out);
    bb_put(out, "GGUF", 4);
    bb_u32(out, g->version);
    bb_u64(out, g->n_tensors);
    bb_u64(out, g->n_kv);
    bb_cat(out, &g->kv);
    bb_cat(out, &g->ti);
    if (hdr)
        *hdr = out->len;
    if (g->align && g->align <= 4096 && (g->align & (g->align - 1)) == 0)
        bb_pad(out, (size_t)g->align);
    bb_zeros(out, (size_t)g->data);
}

/* The reference valid GGUF: a name, an f32 vector "w" of 8 (32 bytes at 0) and a q8_0 matrix "q"
 * of 32 x 2 (2 blocks of 34 bytes at 32): 100 bytes of data. */
static void gg_valid(gg *g)
{
    gg_init(g);
    g_kv_str(g, "general.name", "tiny");
    int64_t ne_w[1] = {8}, ne_q[2] = {32, 2};
    g_tensor(g, "w", 1, ne_w, GT_F32, 0);
    g_tensor(g, "q", 2, ne_q, GT_Q8_0, 32);
    g->data = 100;
}

/* safetensors: u64 header length (DECLARED), the JSON text, DATA zero bytes. */
static void st_build_len(bb *out, uint64_t declared, const char *json, size_t json_len,
                         size_t data)
{
    memset(out, 0, sizeof *out);
    bb_u64(out, declared);
    bb_put(out, json, json_len);
    bb_zeros(out, data);
}
static void st_build(bb *out, const char *json, size_t data)
{
    st_build_len(out, strlen(json), json, strlen(json), data);
}

/* ---- the harness: write, open, check code, message and the catalog's state ------------------- */

static const char *g_dir;
static ferry_catalog *g_cat;
static char g_good_gguf[4200], g_good_st[4200];
static int g_recoveries;
static int g_cases;

static void write_or_die(const char *path, const void *data, size_t n)
{
    if (check_write_file(path, data, n) != 0) {
        fprintf(stderr, "test_hostile: cannot write %s\n", path);
        exit(2);
    }
}

/* After a refusal: a valid file still opens in the same catalog and adds exactly its tensors. */
static void recover(const char *what)
{
    char prefix[64];
    size_t before = ferry_catalog_count(g_cat);
    int use_st = g_recoveries % 2;
    const char *good = use_st ? g_good_st : g_good_gguf;
    snprintf(prefix, sizeof prefix, "ok%d.", g_recoveries++);
    int rc = ferry_catalog_add(g_cat, good, prefix);
    if (rc != 0)
        fprintf(stderr, "case %s: valid file %s refused afterwards: %s (%s)\n", what, good,
                ferry_strerror(rc), ferry_catalog_errmsg(g_cat));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_catalog_count(g_cat), before + 2);
    char name[96];
    snprintf(name, sizeof name, "%s%s", prefix, use_st ? "a" : "w");
    CHECK(ferry_catalog_find(g_cat, name) >= 0);
}

/* Opens PATH in the shared catalog; it must fail with CODE, a message naming MUST_NAME (PATH
 * when NULL) and nothing added. */
static void expect_path(const char *what, const char *path, int code, const char *must_name)
{
    size_t n = ferry_catalog_count(g_cat), nf = ferry_catalog_file_count(g_cat),
           nm = ferry_catalog_meta_count(g_cat);
    g_cases++;
    int rc = ferry_catalog_add(g_cat, path, NULL);
    const char *msg = ferry_catalog_errmsg(g_cat);
    if (rc != code)
        fprintf(stderr, "case %s: expected %d (%s), got %d (%s): %s\n", what, code,
                ferry_strerror(code), rc, ferry_strerror(rc), msg ? msg : "(null)");
    CHECK_EQ_INT(rc, code);
    CHECK(msg != NULL && msg[0] != 0);
    if (!must_name)
        must_name = path;
    if (msg && !strstr(msg, must_name)) {
        fprintf(stderr, "case %s: message does not name %s: %s\n", what, must_name, msg);
        CHECK(0);
    }
    CHECK_EQ_INT(ferry_catalog_count(g_cat), n);
    CHECK_EQ_INT(ferry_catalog_file_count(g_cat), nf);
    CHECK_EQ_INT(ferry_catalog_meta_count(g_cat), nm);
    recover(what);
}

/* Writes DATA to a file named after the case (FNAME) and expects CODE. */
static void expect_bytes(const char *fname, const void *data, size_t n, int code)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", g_dir, fname);
    write_or_die(path, data, n);
    expect_path(fname, path, code, NULL);
}

static void expect_bb(const char *fname, bb *b, int code)
{
    expect_bytes(fname, b->p, b->len, code);
    bb_free(b);
}

static void expect_gg(const char *fname, gg *g, int code)
{
    bb b;
    gg_build(g, &b, NULL);
    gg_free(g);
    expect_bb(fname, &b, code);
}

static void expect_st(const char *fname, const char *json, size_t data, int code)
{
    bb b;
    st_build(&b, json, data);
    expect_bb(fname, &b, code);
}

/* ---- GGUF ------------------------------------------------------------------------------------ */

static void gguf_cases(void)
{
    gg g;
    bb b;
    size_t hdr;

    expect_bytes("empty.gguf", "", 0, FERRY_EFORMAT);
    {
        gg_valid(&g);
        gg_build(&g, &b, NULL);
        gg_free(&g);
        memcpy(b.p, "GGUG", 4);
        expect_bb("bad_magic.gguf", &b, FERRY_EFORMAT);
    }
    static const uint32_t versions[] = {1, 4, 0xFFFFFFFFu, 0};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(versions); i++) {
        char name[64];
        snprintf(name, sizeof name, "version_%u.gguf", (unsigned)versions[i]);
        gg_valid(&g);
        g.version = versions[i];
        expect_gg(name, &g, FERRY_EFORMAT);
    }

    /* Truncated in each section. */
    expect_bytes("trunc_magic_only.gguf", "GGUF", 4, FERRY_ETRUNC);
    {
        gg_valid(&g);
        gg_build(&g, &b, NULL);
        gg_free(&g);
        b.len = 4 + 4 + 8 + 3; /* inside n_kv */
        expect_bb("trunc_header.gguf", &b, FERRY_ETRUNC);
    }
    /* The truncated cases below declare no more than the whole file could hold at the smallest
     * encodings (else the header's counts are refused first, with ELIMIT). */
    {
        gg_init(&g);
        g_kv_str(&g, "general.name", "tiny");
        gg_build(&g, &b, NULL);
        gg_free(&g);
        b.len = 24 + 8 + 5; /* inside "general.name" */
        expect_bb("trunc_kv_key.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_init(&g);
        g_kv_str(&g, "general.name", "tiny");
        gg_build(&g, &b, NULL);
        gg_free(&g);
        b.len = 24 + 8 + 12 + 2; /* inside the value type */
        expect_bb("trunc_kv_type.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_init(&g);
        g_key(&g, "k", GV_U64);
        bb_u32(&g.kv, 7); /* half a u64 */
        gg_build(&g, &b, &hdr);
        gg_free(&g);
        b.len = hdr;
        expect_bb("trunc_kv_value.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_init(&g);
        g_key(&g, "k", GV_STR);
        bb_u64(&g.kv, 10);
        bb_put(&g.kv, "abc", 3); /* 7 bytes short */
        gg_build(&g, &b, &hdr);
        gg_free(&g);
        b.len = hdr;
        expect_bb("trunc_string.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_init(&g);
        g_key(&g, "k", GV_ARR);
        bb_u32(&g.kv, GV_U32);
        bb_u64(&g.kv, 10);
        for (int i = 0; i < 3; i++) /* 7 items short */
            bb_u32(&g.kv, (uint32_t)i);
        gg_build(&g, &b, &hdr);
        gg_free(&g);
        b.len = hdr;
        expect_bb("trunc_array.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_valid(&g);
        gg_build(&g, &b, &hdr);
        gg_free(&g);
        b.len = hdr - 6; /* inside the last tensor's offset */
        expect_bb("trunc_tensor_info.gguf", &b, FERRY_ETRUNC);
    }
    {
        gg_valid(&g);
        gg_build(&g, &b, NULL);
        gg_free(&g);
        b.len -= 10; /* the last tensor loses 10 bytes */
        expect_bb("trunc_data.gguf", &b, FERRY_ERANGE);
    }

    /* Counts and lengths no file could hold. */
    gg_valid(&g);
    g.n_kv = UINT64_C(1) << 63;
    expect_gg("n_kv_2e63.gguf", &g, FERRY_ELIMIT);
    gg_valid(&g);
    g.n_tensors = UINT64_C(1) << 40;
    expect_gg("n_tensors_2e40.gguf", &g, FERRY_ELIMIT);
    {
        gg_init(&g);
        g_key(&g, "k", GV_STR);
        bb_u64(&g.kv, UINT64_C(1) << 62);
        bb_put(&g.kv, "abcdefgh", 8);
        expect_gg("string_len_2e62.gguf", &g, FERRY_ELIMIT);
    }
    {
        gg_init(&g);
        bb_u64(&g.kv, UINT64_C(1) << 62); /* the key's own length */
        bb_put(&g.kv, "abcdefgh", 8);
        g.n_kv = 1;
        expect_gg("key_len_2e62.gguf", &g, FERRY_ELIMIT);
    }
    {
        gg_init(&g);
        g_key(&g, "k", GV_ARR);
        bb_u32(&g.kv, GV_U8);
        bb_u64(&g.kv, UINT64_C(1) << 61);
        bb_zeros(&g.kv, 16);
        expect_gg("array_len_2e61.gguf", &g, FERRY_ELIMIT);
    }
    {
        /* A key longer than FERRY__MAX_NAME, wholly present in the file. */
        size_t n = FERRY__MAX_NAME + 1;
        char *k = malloc(n + 1);
        memset(k, 'k', n);
        k[n] = 0;
        gg_init(&g);
        g_kv_u32(&g, k, 1);
        free(k);
        expect_gg("key_over_max_name.gguf", &g, FERRY_ELIMIT);
    }
    {
        /* 1000 arrays, each holding one array: far past FERRY__MAX_NESTING, and deep enough that a
         * reader recursing without a limit would still survive (the point is the code). */
        gg_init(&g);
        g_key(&g, "deep", GV_ARR);
        for (int i = 0; i < 1000; i++) {
            bb_u32(&g.kv, GV_ARR);
            bb_u64(&g.kv, 1);
        }
        bb_u32(&g.kv, GV_U8);
        bb_u64(&g.kv, 0);
        expect_gg("array_nesting_1000.gguf", &g, FERRY_ELIMIT);
    }
    {
        gg_init(&g);
        g_key(&g, "deep", GV_ARR);
        for (int i = 0; i < FERRY__MAX_NESTING + 1; i++) {
            bb_u32(&g.kv, GV_ARR);
            bb_u64(&g.kv, 1);
        }
        bb_u32(&g.kv, GV_U8);
        bb_u64(&g.kv, 0);
        expect_gg("array_nesting_max_plus_2.gguf", &g, FERRY_ELIMIT);
    }

    /* Types. */
    gg_valid(&g);
    g_key(&g, "odd", 13);
    bb_u32(&g.kv, 0);
    expect_gg("unknown_value_type.gguf", &g, FERRY_EFORMAT);
    gg_valid(&g);
    g_key(&g, "odd", GV_ARR);
    bb_u32(&g.kv, 0xFFFF);
    bb_u64(&g.kv, 0);
    expect_gg("unknown_array_elem_type.gguf", &g, FERRY_EFORMAT);
    {
        static const struct { uint32_t type; const char *name; } bad[] = {
            {4, "retired_type_4.gguf"},   {5, "retired_type_5.gguf"},
            {31, "retired_type_31.gguf"}, {36, "retired_type_36.gguf"},
            {40, "unknown_type_40.gguf"}, {0x7FFFFFFF, "unknown_type_huge.gguf"},
        };
        for (size_t i = 0; i < FERRY__ARRAY_LEN(bad); i++) {
            gg_init(&g);
            int64_t ne[1] = {32};
            g_tensor(&g, "t", 1, ne, bad[i].type, 0);
            g.data = 64;
            expect_gg(bad[i].name, &g, FERRY_EDTYPE);
        }
    }

    /* Shapes. */
    {
        gg_init(&g);
        int64_t ne[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        g_tensor(&g, "t", 9, ne, GT_F32, 0);
        g.data = 32;
        expect_gg("n_dims_9.gguf", &g, FERRY_ELIMIT);
    }
    {
        gg_init(&g);
        int64_t ne[2] = {4, -1};
        g_tensor(&g, "t", 2, ne, GT_F32, 0);
        g.data = 32;
        expect_gg("negative_ne.gguf", &g, FERRY_ESHAPE);
    }
    {
        gg_init(&g);
        int64_t ne[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 2};
        g_tensor(&g, "t", 3, ne, GT_F32, 0);
        g.data = 32;
        expect_gg("ne_product_overflow.gguf", &g, FERRY_EOVERFLOW);
    }
    {
        /* Elements fit in 64 bits, bytes do not: 2^62 f32. */
        gg_init(&g);
        int64_t ne[1] = {INT64_C(1) << 62};
        g_tensor(&g, "t", 1, ne, GT_F32, 0);
        g.data = 32;
        expect_gg("ne_bytes_overflow.gguf", &g, FERRY_EOVERFLOW);
    }
    {
        gg_init(&g);
        int64_t ne[2] = {33, 1};
        g_tensor(&g, "t", 2, ne, GT_Q4_0, 0);
        g.data = 64;
        expect_gg("q4_0_33_columns.gguf", &g, FERRY_ESHAPE);
    }
    {
        gg_init(&g);
        int64_t ne[2] = {128, 2};
        g_tensor(&g, "t", 2, ne, GT_Q4_K, 0);
        g.data = 512;
        expect_gg("q4_k_128_columns.gguf", &g, FERRY_ESHAPE);
    }

    /* Placement of data. */
    {
        gg_init(&g);
        int64_t ne[1] = {8};
        g_tensor(&g, "t", 1, ne, GT_F32, 4096);
        g.data = 64;
        expect_gg("data_past_eof.gguf", &g, FERRY_ERANGE);
    }
    {
        gg_init(&g);
        int64_t ne[1] = {16};
        g_tensor(&g, "a", 1, ne, GT_F32, 0);
        g_tensor(&g, "b", 1, ne, GT_F32, 32);
        g.data = 96;
        expect_gg("overlapping_tensors.gguf", &g, FERRY_EOVERLAP);
    }
    {
        gg_init(&g);
        int64_t ne[1] = {8};
        g_tensor(&g, "t", 1, ne, GT_F32, 4);
        g.data = 64;
        expect_gg("offset_not_aligned.gguf", &g, FERRY_EALIGN);
    }
    {
        gg_init(&g);
        g_kv_u32(&g, "general.alignment", 64);
        int64_t ne[1] = {8};
        g_tensor(&g, "t", 1, ne, GT_F32, 32); /* aligned to the default, not to 64 */
        g.align = 64;
        g.data = 128;
        expect_gg("offset_not_aligned_64.gguf", &g, FERRY_EALIGN);
    }
    {
        gg_init(&g);
        int64_t ne[1] = {8};
        /* Aligned to 32, so only the sum with the data section's start overflows. */
        g_tensor(&g, "t", 1, ne, GT_F32, UINT64_MAX - 31);
        g.data = 64;
        expect_gg("offset_plus_size_overflow.gguf", &g, FERRY_EOVERFLOW);
    }
    static const struct { uint32_t align; const char *name; } aligns[] = {
        {0, "alignment_0.gguf"}, {3, "alignment_3.gguf"}, {48, "alignment_48.gguf"},
        {UINT32_C(1) << 31, "alignment_2e31.gguf"},
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(aligns); i++) {
        gg_valid(&g);
        g_kv_u32(&g, "general.alignment", aligns[i].align);
        expect_gg(aligns[i].name, &g, FERRY_EALIGN);
    }
    gg_valid(&g);
    g_key(&g, "general.alignment", GV_U64);
    bb_u64(&g.kv, 32);
    expect_gg("alignment_u64.gguf", &g, FERRY_ETYPE);
    gg_valid(&g);
    g_kv_str(&g, "general.alignment", "32");
    expect_gg("alignment_string.gguf", &g, FERRY_ETYPE);

    /* Names and values the format's grammar allows but ferry refuses. */
    gg_valid(&g);
    g_kv_u32(&g, "", 1);
    expect_gg("empty_key.gguf", &g, FERRY_EFORMAT);
    {
        /* The tensor info written by hand: g_tensor takes C strings. */
        gg_init(&g);
        bb_u64(&g.ti, 3);
        bb_put(&g.ti, "a\0b", 3);
        bb_u32(&g.ti, 1);
        bb_u64(&g.ti, 8);
        bb_u32(&g.ti, GT_F32);
        bb_u64(&g.ti, 0);
        g.n_tensors = 1;
        g.data = 32;
        expect_gg("nul_in_tensor_name.gguf", &g, FERRY_EFORMAT);
    }
    gg_valid(&g);
    g_key(&g, "flag", GV_BOOL);
    bb_u8(&g.kv, 2);
    expect_gg("bool_2.gguf", &g, FERRY_EFORMAT);

    /* Duplicates. */
    {
        gg_init(&g);
        int64_t ne[1] = {8};
        g_tensor(&g, "t", 1, ne, GT_F32, 0);
        g_tensor(&g, "t", 1, ne, GT_F32, 32);
        g.data = 64;
        expect_gg("duplicate_tensor.gguf", &g, FERRY_EDUP);
    }
    gg_valid(&g);
    g_kv_str(&g, "general.name", "again");
    expect_gg("duplicate_key.gguf", &g, FERRY_EDUP);
}

/* ---- safetensors ----------------------------------------------------------------------------- */

#define ST_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"

static void st_cases(void)
{
    bb b;
    expect_bytes("short.safetensors", "\x10\0\0\0\0", 5, FERRY_EFORMAT);
    {
        st_build_len(&b, 200, "{" ST_A "}", strlen("{" ST_A "}"), 24);
        expect_bb("header_past_eof.safetensors", &b, FERRY_ETRUNC);
    }
    {
        st_build_len(&b, UINT64_C(1) << 63, "{" ST_A "}", strlen("{" ST_A "}"), 24);
        expect_bb("header_len_2e63.safetensors", &b, FERRY_ELIMIT);
    }
    expect_st("not_json.safetensors", "{\"a\" 1}", 0, FERRY_EJSON);
    expect_st("not_object.safetensors", "[{\"a\":1}]", 0, FERRY_EFORMAT);
    expect_st("trailing_garbage.safetensors", "{" ST_A "} x", 24, FERRY_EJSON);
    expect_st("bad_utf8_name.safetensors",
              "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              FERRY_EJSON);
    expect_st("overlong_utf8.safetensors",
              "{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              FERRY_EJSON);
    expect_st("lone_surrogate.safetensors",
              "{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              FERRY_EJSON);
    expect_st("nul_escape_in_name.safetensors",
              "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              FERRY_EJSON);
    {
        /* 10,000 nested arrays inside a metadata value: refused by depth, not by the stack. */
        bb j = {0};
        bb_put(&j, "{\"__metadata__\":", 16);
        for (int i = 0; i < 10000; i++)
            bb_u8(&j, '[');
        for (int i = 0; i < 10000; i++)
            bb_u8(&j, ']');
        bb_u8(&j, '}');
        st_build_len(&b, j.len, (const char *)j.p, j.len, 0);
        bb_free(&j);
        expect_bb("depth_bomb.safetensors", &b, FERRY_ELIMIT);
    }
    expect_st("duplicate_tensor.safetensors", "{" ST_A "," ST_A "}", 24, FERRY_EDUP);
    expect_st("duplicate_field.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              4, FERRY_EDUP);
    expect_st("unknown_dtype.safetensors",
              "{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FERRY_EDTYPE);
    expect_st("shape_negative.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, FERRY_ESHAPE);
    expect_st("shape_fraction.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
              FERRY_ESHAPE);
    expect_st("shape_huge.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],"
              "\"data_offsets\":[0,4]}}",
              4, FERRY_EOVERFLOW);
    expect_st("shape_product_overflow.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
              "\"data_offsets\":[0,4]}}",
              4, FERRY_EOVERFLOW);
    expect_st("shape_9_dims.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
              4, FERRY_ELIMIT);
    /* Reversed offsets are a wrong structure (EFORMAT), not data past the end. */
    expect_st("offsets_reversed.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, FERRY_EFORMAT);
    expect_st("end_past_file.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, FERRY_ERANGE);
    expect_st("size_mismatch.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
              FERRY_ESHAPE);
    expect_st("overlapping.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
              24, FERRY_EOVERLAP);
    expect_st("metadata_not_string.safetensors",
              "{\"__metadata__\":{\"epochs\":3}," ST_A "}", 24, FERRY_ETYPE);
    expect_st("metadata_not_object.safetensors", "{\"__metadata__\":\"x\"," ST_A "}", 24,
              FERRY_EFORMAT);
    expect_st("entry_not_object.safetensors", "{\"a\":[1,2,3]}", 0, FERRY_EFORMAT);
    expect_st("missing_dtype.safetensors", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
              FERRY_EFORMAT);
    expect_st("missing_offsets.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
              FERRY_EFORMAT);
    expect_st("offsets_three.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
              FERRY_EFORMAT);
    expect_st("unknown_field.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
              FERRY_EFORMAT);
    expect_st("offset_negative.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
              FERRY_EFORMAT);
    expect_st("offset_over_64_bits.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
              "\"data_offsets\":[18446744073709551616,18446744073709551620]}}",
              4, FERRY_EOVERFLOW);
    expect_st("offset_plus_header_overflow.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
              "\"data_offsets\":[18446744073709551600,18446744073709551604]}}",
              4, FERRY_EOVERFLOW);
    {
        st_build_len(&b, 1, "{}", 2, 0);
        expect_bb("header_len_1.safetensors", &b, FERRY_EFORMAT);
    }
    expect_st("dtype_not_string.safetensors",
              "{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FERRY_EFORMAT);
}

/* ---- sharded safetensors index --------------------------------------------------------------- */

static const char SHARD1[] =
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
static const char SHARD2[] =
    "{\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}";

/* A folder dir/NAME holding the index text INDEX, and shards s1.safetensors / s2.safetensors
 * (tensor "a" / "b") when WITH_SHARDS. Returns the index path (static storage). */
static const char *make_index(const char *name, const char *index, int with_shards)
{
    static char path[4400];
    char sub[4300], shard[4400];
    bb b;
    snprintf(sub, sizeof sub, "%s/%s", g_dir, name);
    mkdir(sub, 0755);
    if (with_shards) {
        st_build(&b, SHARD1, 8);
        snprintf(shard, sizeof shard, "%s/s1.safetensors", sub);
        write_or_die(shard, b.p, b.len);
        bb_free(&b);
        st_build(&b, SHARD2, 8);
        snprintf(shard, sizeof shard, "%s/s2.safetensors", sub);
        write_or_die(shard, b.p, b.len);
        bb_free(&b);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", sub);
    write_or_die(path, index, strlen(index));
    return path;
}

static void index_cases(void)
{
    char what[64], path[4400];
    const char *p;

    /* First a valid one, so that a refusal below is about what each case breaks. */
    p = make_index("ix_valid",
                   "{\"metadata\":{\"total_size\":16},\"weight_map\":{\"ixv.a\":\"s1.safetensors\","
                   "\"ixv.b\":\"s2.safetensors\"}}",
                   0);
    {
        char sub[4300];
        snprintf(sub, sizeof sub, "%s/ix_valid", g_dir);
        bb b;
        st_build(&b, "{\"ixv.a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
        snprintf(path, sizeof path, "%s/s1.safetensors", sub);
        write_or_die(path, b.p, b.len);
        bb_free(&b);
        st_build(&b, "{\"ixv.b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
        snprintf(path, sizeof path, "%s/s2.safetensors", sub);
        write_or_die(path, b.p, b.len);
        bb_free(&b);
        size_t n = ferry_catalog_count(g_cat), nf = ferry_catalog_file_count(g_cat);
        int rc = ferry_catalog_add(g_cat, p, NULL);
        if (rc)
            fprintf(stderr, "valid index refused: %s\n", ferry_catalog_errmsg(g_cat));
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(ferry_catalog_count(g_cat), n + 2);
        CHECK_EQ_INT(ferry_catalog_file_count(g_cat), nf + 2);
        CHECK(ferry_catalog_find(g_cat, "ixv.b") >= 0);
    }

    p = make_index("ix_absolute", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", 1);
    expect_path("index_absolute", p, FERRY_EPATH, NULL);
    p = make_index("ix_dotdot", "{\"weight_map\":{\"a\":\"../ix_valid/s1.safetensors\"}}", 1);
    expect_path("index_dotdot", p, FERRY_EPATH, NULL);
    p = make_index("ix_dotdot_inner",
                   "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"x/../../s2.safetensors\"}}",
                   1);
    expect_path("index_dotdot_inner", p, FERRY_EPATH, NULL);
    p = make_index("ix_missing",
                   "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s3.safetensors\"}}", 1);
    snprintf(what, sizeof what, "s3.safetensors");
    expect_path("index_missing_shard", p, FERRY_ENOENT, what);
    p = make_index("ix_wm_array", "{\"weight_map\":[\"s1.safetensors\"]}", 1);
    expect_path("index_weight_map_array", p, FERRY_EFORMAT, NULL);
    p = make_index("ix_wm_absent", "{\"metadata\":{}}", 1);
    expect_path("index_weight_map_absent", p, FERRY_EFORMAT, NULL);
    p = make_index("ix_shard_not_string", "{\"weight_map\":{\"a\":1}}", 1);
    expect_path("index_shard_not_string", p, FERRY_EFORMAT, NULL);
    p = make_index("ix_not_json", "{\"weight_map\":{\"a\":\"s1.safetensors\"", 1);
    expect_path("index_not_json", p, FERRY_EJSON, NULL);
    /* The index and its shard disagree: a wrong structure (EFORMAT); ENOENT is kept for files. */
    p = make_index("ix_tensor_not_in_shard",
                   "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
                   "\"c\":\"s2.safetensors\"}}",
                   1);
    expect_path("index_tensor_not_in_shard", p, FERRY_EFORMAT, NULL);
    p = make_index("ix_same_tensor_two_shards",
                   "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", 1);
    {
        /* s2 also holds "a". */
        bb b;
        snprintf(path, sizeof path, "%s/ix_same_tensor_two_shards/s2.safetensors", g_dir);
        st_build(&b, "{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]}}",
                 16);
        write_or_die(path, b.p, b.len);
        bb_free(&b);
    }
    expect_path("index_same_tensor_two_shards", p, FERRY_EDUP, NULL);
    {
        /* A GGUF file where a safetensors shard belongs. */
        p = make_index("ix_gguf_shard", "{\"weight_map\":{\"w\":\"s1.safetensors\"}}", 0);
        snprintf(path, sizeof path, "%s/ix_gguf_shard/s1.safetensors", g_dir);
        gg g;
        bb b;
        gg_valid(&g);
        gg_build(&g, &b, NULL);
        gg_free(&g);
        write_or_die(path, b.p, b.len);
        bb_free(&b);
        expect_path("index_gguf_shard", p, FERRY_EFORMAT, "s1.safetensors");
    }
    p = make_index("ix_shard_is_index", "{\"weight_map\":{\"a\":\"model.safetensors.index.json\"}}",
                   1);
    expect_path("index_shard_is_itself", p, FERRY_EFORMAT, NULL);
    {
        p = make_index("ix_hostile_shard",
                       "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}", 1);
        /* Overwrite s2 with a shard whose header runs past its end. */
        bb b;
        snprintf(path, sizeof path, "%s/ix_hostile_shard/s2.safetensors", g_dir);
        st_build_len(&b, 500, SHARD2, strlen(SHARD2), 8);
        write_or_die(path, b.p, b.len);
        bb_free(&b);
        expect_path("index_hostile_shard", p, FERRY_ETRUNC, "s2.safetensors");
    }
}

/* ---- split GGUF ------------------------------------------------------------------------------ */

/* Writes dir/NAME: a GGUF with split.no NO and split.count COUNT (u16, as llama.cpp writes them;
 * COUNT 0xFFFF: a string instead) and one f32 tensor TENSOR of 8. Returns the path (static). */
static const char *write_part(const char *name, unsigned no, unsigned count, const char *tensor)
{
    static char path[4400];
    gg g;
    bb b;
    gg_init(&g);
    g_key(&g, "split.no", GV_U16);
    bb_u16(&g.kv, (uint16_t)no);
    if (count == 0xFFFF) {
        g_kv_str(&g, "split.count", "2");
    } else {
        g_key(&g, "split.count", GV_U16);
        bb_u16(&g.kv, (uint16_t)count);
    }
    int64_t ne[1] = {8};
    g_tensor(&g, tensor, 1, ne, GT_F32, 0);
    g.data = 32;
    gg_build(&g, &b, NULL);
    gg_free(&g);
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    write_or_die(path, b.p, b.len);
    bb_free(&b);
    return path;
}

static void split_cases(void)
{
    char first[4400];
    const char *p;

    /* A valid set of two opens as one model, from either part. */
    snprintf(first, sizeof first, "%s", write_part("sv-00001-of-00002.gguf", 0, 2, "sv.a"));
    write_part("sv-00002-of-00002.gguf", 1, 2, "sv.b");
    size_t n = ferry_catalog_count(g_cat), nf = ferry_catalog_file_count(g_cat);
    CHECK_EQ_INT(ferry_catalog_add(g_cat, first, NULL), 0);
    CHECK_EQ_INT(ferry_catalog_count(g_cat), n + 2);
    CHECK_EQ_INT(ferry_catalog_file_count(g_cat), nf + 2);

    snprintf(first, sizeof first, "%s", write_part("sm-00001-of-00002.gguf", 0, 2, "sm.a"));
    expect_path("split_missing_part", first, FERRY_ENOENT, "sm-00002-of-00002.gguf");

    snprintf(first, sizeof first, "%s", write_part("sc-00001-of-00003.gguf", 0, 2, "sc.a"));
    write_part("sc-00002-of-00003.gguf", 1, 2, "sc.b");
    write_part("sc-00003-of-00003.gguf", 2, 2, "sc.c");
    expect_path("split_count_differs_from_name", first, FERRY_EFORMAT, NULL);

    snprintf(first, sizeof first, "%s", write_part("sn-00001-of-00002.gguf", 0, 2, "sn.a"));
    write_part("sn-00002-of-00002.gguf", 0, 2, "sn.b");
    expect_path("split_part_wrong_no", first, FERRY_EFORMAT, "sn-00002-of-00002.gguf");

    p = write_part("sno-00001-of-00002.gguf", 2, 2, "sno.a");
    expect_path("split_no_not_below_count", p, FERRY_EFORMAT, NULL);

    p = write_part("st-00001-of-00002.gguf", 0, 0xFFFF, "st.a");
    expect_path("split_count_string", p, FERRY_ETYPE, NULL);

    snprintf(first, sizeof first, "%s", write_part("sd-00001-of-00002.gguf", 0, 2, "sd.same"));
    write_part("sd-00002-of-00002.gguf", 1, 2, "sd.same");
    expect_path("split_same_tensor_in_two_parts", first, FERRY_EDUP, "sd-00002-of-00002.gguf");

    {
        /* Part 2 is cut inside its tensor data. */
        snprintf(first, sizeof first, "%s", write_part("sh-00001-of-00002.gguf", 0, 2, "sh.a"));
        p = write_part("sh-00002-of-00002.gguf", 1, 2, "sh.b");
        struct stat st;
        CHECK(stat(p, &st) == 0);
        CHECK(truncate(p, st.st_size - 4) == 0);
        expect_path("split_hostile_part", first, FERRY_ERANGE, "sh-00002-of-00002.gguf");
    }
}

/* ---- files that are not files, and collisions across files ----------------------------------- */

static void misc_cases(void)
{
    char path[4400], other[4400];
    snprintf(path, sizeof path, "%s/a_directory.gguf", g_dir);
    mkdir(path, 0755);
    /* Not a regular file, so not a model file: EFORMAT (it opens; nothing failed to read). */
    expect_path("directory", path, FERRY_EFORMAT, NULL);
    snprintf(path, sizeof path, "%s/does_not_exist.gguf", g_dir);
    expect_path("nonexistent", path, FERRY_ENOENT, NULL);

    /* "clash" in a GGUF, then again in a safetensors file: EDUP naming both files. */
    gg g;
    bb b;
    gg_init(&g);
    int64_t ne[1] = {8};
    g_tensor(&g, "clash", 1, ne, GT_F32, 0);
    g.data = 32;
    gg_build(&g, &b, NULL);
    gg_free(&g);
    snprintf(other, sizeof other, "%s/clash_first.gguf", g_dir);
    write_or_die(other, b.p, b.len);
    bb_free(&b);
    CHECK_EQ_INT(ferry_catalog_add(g_cat, other, NULL), 0);
    st_build(&b, "{\"clash\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}", 32);
    snprintf(path, sizeof path, "%s/clash_second.safetensors", g_dir);
    write_or_die(path, b.p, b.len);
    bb_free(&b);
    expect_path("name_collision", path, FERRY_EDUP, NULL);
    /* The recovery in expect_path replaced the message: fail again to read both names. */
    CHECK_EQ_INT(ferry_catalog_add(g_cat, path, NULL), FERRY_EDUP);
    const char *msg = ferry_catalog_errmsg(g_cat);
    CHECK(strstr(msg, path) != NULL);
    CHECK(strstr(msg, other) != NULL);
    CHECK(strstr(msg, "clash") != NULL);
    /* The same file under a prefix does not collide. */
    CHECK_EQ_INT(ferry_catalog_add(g_cat, path, "second."), 0);
    CHECK(ferry_catalog_find(g_cat, "second.clash") >= 0);
}

/* ---- every truncation of a valid file -------------------------------------------------------- */

/* A valid GGUF with one value of every metadata type, nested arrays, the alignment key and
 * tensors of several types; the file ends exactly where the last tensor does. */
static void rich_gguf(bb *out, size_t *n_tensors, size_t *n_kv)
{
    gg g;
    gg_init(&g);
    g_key(&g, "u8", GV_U8);
    bb_u8(&g.kv, 200);
    g_key(&g, "i8", GV_I8);
    bb_u8(&g.kv, 0x80);
    g_key(&g, "u16", GV_U16);
    bb_u16(&g.kv, 60000);
    g_key(&g, "i16", GV_I16);
    bb_u16(&g.kv, 0x8000);
    g_kv_u32(&g, "u32", 4000000000u);
    g_key(&g, "i32", GV_I32);
    bb_u32(&g.kv, 0x80000000u);
    g_key(&g, "f32", GV_F32);
    bb_f32(&g.kv, 1.5f);
    g_key(&g, "bool", GV_BOOL);
    bb_u8(&g.kv, 1);
    g_kv_str(&g, "str", "h\xc3\xa9llo");
    g_key(&g, "u64", GV_U64);
    bb_u64(&g.kv, UINT64_MAX);
    g_key(&g, "i64", GV_I64);
    bb_u64(&g.kv, UINT64_C(1) << 63);
    g_key(&g, "f64", GV_F64);
    bb_f64(&g.kv, -2.25);
    g_key(&g, "strs", GV_ARR);
    bb_u32(&g.kv, GV_STR);
    bb_u64(&g.kv, 2);
    bb_gstr(&g.kv, "a");
    bb_gstr(&g.kv, "");
    g_key(&g, "nested", GV_ARR); /* [[1, 2], [3]] of u32 */
    bb_u32(&g.kv, GV_ARR);
    bb_u64(&g.kv, 2);
    bb_u32(&g.kv, GV_U32);
    bb_u64(&g.kv, 2);
    bb_u32(&g.kv, 1);
    bb_u32(&g.kv, 2);
    bb_u32(&g.kv, GV_U32);
    bb_u64(&g.kv, 1);
    bb_u32(&g.kv, 3);
    g_kv_u32(&g, "general.alignment", 16);
    g.align = 16;
    int64_t ne_w[1] = {4}, ne_h[2] = {2, 2}, ne_q[2] = {32, 1};
    g_tensor(&g, "w", 1, ne_w, GT_F32, 0);   /* 16 bytes at 0 */
    g_tensor(&g, "h", 2, ne_h, GT_F16, 16);  /* 8 bytes at 16 */
    g_tensor(&g, "q", 2, ne_q, GT_Q8_0, 32); /* 34 bytes at 32 */
    g.data = 66;
    *n_tensors = (size_t)g.n_tensors;
    *n_kv = (size_t)g.n_kv;
    gg_build(&g, out, NULL);
    gg_free(&g);
}

static const char RICH_ST[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9 \\\"q\\\"\"},"
    "\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
    "\"s\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[16,18]},"
    "\"e\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[18,18]},"
    "\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[18,21]}}  ";

typedef int (*parse_fn)(const unsigned char *, uint64_t, const char *, ferry__parsed *,
                        ferry__err *);

static int refused_code_ok(int rc)
{
    return rc == FERRY_EFORMAT || rc == FERRY_ETRUNC || rc == FERRY_ERANGE || rc == FERRY_ELIMIT;
}

static void truncate_all(const char *fname, const bb *file, parse_fn parse, size_t n_tensors,
                         size_t n_meta)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", g_dir, fname);
    ferry_catalog *c = ferry_catalog_create();
    CHECK(c != NULL);
    if (!c)
        return;
    /* The whole file is valid, through both paths. */
    write_or_die(path, file->p, file->len);
    int rc = ferry_catalog_add(c, path, NULL);
    if (rc)
        fprintf(stderr, "%s: valid file refused: %s\n", fname, ferry_catalog_errmsg(c));
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(ferry_catalog_count(c), n_tensors);
    CHECK_EQ_INT(ferry_catalog_meta_count(c), n_meta);
    ferry__parsed p;
    ferry__err e;
    memset(&p, 0, sizeof p);
    unsigned char *buf = malloc(file->len);
    memcpy(buf, file->p, file->len);
    CHECK_EQ_INT(parse(buf, file->len, path, &p, &e), 0);
    CHECK_EQ_INT(p.n_tensors, n_tensors);
    CHECK_EQ_INT(p.n_meta, n_meta);
    ferry__parsed_free(&p);
    free(buf);

    int bad = 0;
    for (size_t cut = 0; cut < file->len; cut++) {
        /* In memory: a heap block of exactly CUT bytes. */
        buf = malloc(cut ? cut : 1);
        memcpy(buf, file->p, cut);
        memset(&p, 0, sizeof p);
        e.code = 0;
        e.msg[0] = 0;
        rc = parse(buf, cut, path, &p, &e);
        free(buf);
        if (rc == 0 || !refused_code_ok(rc) || p.n_tensors || p.n_meta || p.tensors || p.meta ||
            !strstr(e.msg, path)) {
            if (bad++ < 5)
                fprintf(stderr, "%s cut at %zu (parser): rc %d (%s), %zu tensors left: %s\n",
                        fname, cut, rc, ferry_strerror(rc), p.n_tensors, e.msg);
        }
        ferry__parsed_free(&p);

        /* Through the catalog, on a file. */
        write_or_die(path, file->p, cut);
        rc = ferry_catalog_add(c, path, "cut.");
        const char *msg = ferry_catalog_errmsg(c);
        if (rc == 0 || !refused_code_ok(rc) || ferry_catalog_count(c) != n_tensors ||
            !strstr(msg, path)) {
            if (bad++ < 5)
                fprintf(stderr, "%s cut at %zu (catalog): rc %d (%s): %s\n", fname, cut, rc,
                        ferry_strerror(rc), msg);
        }
    }
    CHECK_EQ_INT(bad, 0);
    ferry_catalog_destroy(c);
}

static void truncation_cases(void)
{
    bb b;
    size_t nt, nkv;
    rich_gguf(&b, &nt, &nkv);
    truncate_all("rich.gguf", &b, ferry__gguf_parse, nt, nkv);
    bb_free(&b);
    st_build(&b, RICH_ST, 21);
    truncate_all("rich.safetensors", &b, ferry__safetensors_parse, 4, 2);
    bb_free(&b);
}

int main(void)
{
    g_dir = check_tmpdir("test_hostile");
    bb b;
    gg g;
    gg_valid(&g);
    gg_build(&g, &b, NULL);
    gg_free(&g);
    snprintf(g_good_gguf, sizeof g_good_gguf, "%s/good.gguf", g_dir);
    write_or_die(g_good_gguf, b.p, b.len);
    bb_free(&b);
    /* The valid safetensors file: "a" (f32 2x3) and "b" (f16 4). */
    st_build(&b,
             "{\"__metadata__\":{\"k\":\"v\"}," ST_A
             ",\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]}}",
             32);
    snprintf(g_good_st, sizeof g_good_st, "%s/good.safetensors", g_dir);
    write_or_die(g_good_st, b.p, b.len);
    bb_free(&b);

    g_cat = ferry_catalog_create();
    CHECK(g_cat != NULL);
    if (!g_cat)
        return check_finish();
    gguf_cases();
    st_cases();
    index_cases();
    split_cases();
    misc_cases();
    printf("%d hostile files refused\n", g_cases);
    CHECK(g_cases >= 50);
    ferry_catalog_destroy(g_cat);

    truncation_cases();

    if (!check_failed)
        check_rmdir(g_dir);
    return check_finish();
}
