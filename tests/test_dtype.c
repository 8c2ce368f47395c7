/*
 * test_dtype.c — the type table (sizes, names, GGUF ids, safetensors spellings), the scalar
 * half/bfloat16/f8 conversions at their edge cases, quantize/dequantize (exact bytes of hand-made
 * blocks, error bounds on random data), ferry_dtype_convert, the dot-product kernels of every
 * readable type against dequantize + double sums (portable and AVX2 kernels both), and the GEMM
 * against a naive double reference and the dispatching GEMM (OpenBLAS, loaded only by the first
 * GEMM, or the builtin loop under FERRY_BLAS=0) against the builtin loop. `test_dtype gemm` runs
 * only the GEMM test (ctest runs it once more with FERRY_BLAS=0).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"
#include "ferry.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [-1, 1). */
static float frand(void) { return (float)((double)(rng() >> 11) * 0x1p-53 * 2.0 - 1.0); }

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ---- the table ------------------------------------------------------------------------------- */

static const struct {
    ferry_dtype t;
    const char *name;
    uint32_t blck, bytes;
} expect_table[] = {
    {FERRY_DTYPE_F32, "f32", 1, 4},         {FERRY_DTYPE_F16, "f16", 1, 2},
    {FERRY_DTYPE_Q4_0, "q4_0", 32, 18},     {FERRY_DTYPE_Q4_1, "q4_1", 32, 20},
    {FERRY_DTYPE_Q5_0, "q5_0", 32, 22},     {FERRY_DTYPE_Q5_1, "q5_1", 32, 24},
    {FERRY_DTYPE_Q8_0, "q8_0", 32, 34},     {FERRY_DTYPE_Q8_1, "q8_1", 32, 36},
    {FERRY_DTYPE_Q2_K, "q2_k", 256, 84},    {FERRY_DTYPE_Q3_K, "q3_k", 256, 110},
    {FERRY_DTYPE_Q4_K, "q4_k", 256, 144},   {FERRY_DTYPE_Q5_K, "q5_k", 256, 176},
    {FERRY_DTYPE_Q6_K, "q6_k", 256, 210},   {FERRY_DTYPE_Q8_K, "q8_k", 256, 292},
    {FERRY_DTYPE_IQ2_XXS, "iq2_xxs", 256, 66}, {FERRY_DTYPE_IQ2_XS, "iq2_xs", 256, 74},
    {FERRY_DTYPE_IQ3_XXS, "iq3_xxs", 256, 98}, {FERRY_DTYPE_IQ1_S, "iq1_s", 256, 50},
    {FERRY_DTYPE_IQ4_NL, "iq4_nl", 32, 18}, {FERRY_DTYPE_IQ3_S, "iq3_s", 256, 110},
    {FERRY_DTYPE_IQ2_S, "iq2_s", 256, 82},  {FERRY_DTYPE_IQ4_XS, "iq4_xs", 256, 136},
    {FERRY_DTYPE_I8, "i8", 1, 1},           {FERRY_DTYPE_I16, "i16", 1, 2},
    {FERRY_DTYPE_I32, "i32", 1, 4},         {FERRY_DTYPE_I64, "i64", 1, 8},
    {FERRY_DTYPE_F64, "f64", 1, 8},         {FERRY_DTYPE_IQ1_M, "iq1_m", 256, 56},
    {FERRY_DTYPE_BF16, "bf16", 1, 2},       {FERRY_DTYPE_TQ1_0, "tq1_0", 256, 54},
    {FERRY_DTYPE_TQ2_0, "tq2_0", 256, 66},  {FERRY_DTYPE_MXFP4, "mxfp4", 32, 17},
    {FERRY_DTYPE_BOOL, "bool", 1, 1},       {FERRY_DTYPE_U8, "u8", 1, 1},
    {FERRY_DTYPE_U16, "u16", 1, 2},         {FERRY_DTYPE_U32, "u32", 1, 4},
    {FERRY_DTYPE_U64, "u64", 1, 8},         {FERRY_DTYPE_F8_E4M3, "f8_e4m3", 1, 1},
    {FERRY_DTYPE_F8_E5M2, "f8_e5m2", 1, 1}, {FERRY_DTYPE_F8_E8M0, "f8_e8m0", 1, 1},
    {FERRY_DTYPE_F6_E2M3, "f6_e2m3", 4, 3}, {FERRY_DTYPE_F6_E3M2, "f6_e3m2", 4, 3},
    {FERRY_DTYPE_F4, "f4", 2, 1},           {FERRY_DTYPE_C64, "c64", 1, 8},
};

static void test_table(void)
{
    size_t n = sizeof expect_table / sizeof expect_table[0];
    int valid = 0;
    for (int t = -1; t < 200; t++)
        valid += ferry__dtype_valid((ferry_dtype)t);
    CHECK_EQ_INT(valid, (int)n); /* nothing in the table that the test does not know */
    for (size_t i = 0; i < n; i++) {
        ferry_dtype t = expect_table[i].t;
        CHECK_STR(ferry_dtype_name(t), expect_table[i].name);
        CHECK_EQ_INT(ferry_dtype_block_elems(t), expect_table[i].blck);
        CHECK_EQ_INT(ferry_dtype_block_bytes(t), expect_table[i].bytes);
        CHECK_EQ_INT(ferry_dtype_from_name(expect_table[i].name), t);
        char up[32];
        size_t k = 0;
        for (; expect_table[i].name[k] && k < sizeof up - 1; k++)
            up[k] = (char)(expect_table[i].name[k] >= 'a' && expect_table[i].name[k] <= 'z'
                               ? expect_table[i].name[k] - 32
                               : expect_table[i].name[k]);
        up[k] = 0;
        CHECK_EQ_INT(ferry_dtype_from_name(up), t);
        CHECK(ferry__dtype_valid(t));
        CHECK_EQ_INT(ferry__dtype_in_gguf(t), (int)t < FERRY_DTYPE_GGUF_COUNT);
    }
    CHECK_EQ_INT(ferry_dtype_from_name("Q4_K"), FERRY_DTYPE_Q4_K);
    CHECK_EQ_INT(ferry_dtype_from_name("Bf16"), FERRY_DTYPE_BF16);
    CHECK_EQ_INT(ferry_dtype_from_name("q4"), FERRY_DTYPE_NONE);
    CHECK_EQ_INT(ferry_dtype_from_name("f32 "), FERRY_DTYPE_NONE);
    CHECK_EQ_INT(ferry_dtype_from_name(""), FERRY_DTYPE_NONE);
    CHECK_EQ_INT(ferry_dtype_from_name(NULL), FERRY_DTYPE_NONE);
    CHECK_EQ_INT(ferry_dtype_from_name("?"), FERRY_DTYPE_NONE);
    int bad[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, 40, 63, 76, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ferry_dtype t = (ferry_dtype)bad[i];
        CHECK_STR(ferry_dtype_name(t), "?");
        CHECK_EQ_INT(ferry_dtype_block_elems(t), 0);
        CHECK_EQ_INT(ferry_dtype_block_bytes(t), 0);
        CHECK(!ferry__dtype_valid(t));
        CHECK(!ferry__dtype_in_gguf(t));
        CHECK(ferry__dtype_st_name(t) == NULL);
    }
}

static void test_gguf_ids(void)
{
    for (uint32_t id = 0; id < 100; id++) {
        ferry_dtype t = FERRY_DTYPE_NONE;
        int rc = ferry__dtype_from_gguf(id, &t);
        int retired = id == 4 || id == 5 || (id >= 31 && id <= 33) || (id >= 36 && id <= 38);
        if (id >= 40 || retired) {
            CHECK_EQ_INT(rc, FERRY_EDTYPE);
        } else {
            CHECK_EQ_INT(rc, 0);
            CHECK_EQ_INT(t, id);
        }
    }
    CHECK_EQ_INT(ferry__dtype_from_gguf(UINT32_MAX, NULL), FERRY_EDTYPE);
    CHECK(!ferry__dtype_in_gguf(FERRY_DTYPE_BOOL));
    CHECK(!ferry__dtype_in_gguf(FERRY_DTYPE_F8_E4M3));
    CHECK(ferry__dtype_in_gguf(FERRY_DTYPE_MXFP4));
}

static void test_safetensors_names(void)
{
    static const struct {
        const char *s;
        ferry_dtype t;
    } st[] = {
        {"BOOL", FERRY_DTYPE_BOOL},       {"U8", FERRY_DTYPE_U8},
        {"I8", FERRY_DTYPE_I8},           {"U16", FERRY_DTYPE_U16},
        {"I16", FERRY_DTYPE_I16},         {"U32", FERRY_DTYPE_U32},
        {"I32", FERRY_DTYPE_I32},         {"U64", FERRY_DTYPE_U64},
        {"I64", FERRY_DTYPE_I64},         {"F16", FERRY_DTYPE_F16},
        {"BF16", FERRY_DTYPE_BF16},       {"F32", FERRY_DTYPE_F32},
        {"F64", FERRY_DTYPE_F64},         {"F8_E4M3", FERRY_DTYPE_F8_E4M3},
        {"F8_E5M2", FERRY_DTYPE_F8_E5M2}, {"F8_E8M0", FERRY_DTYPE_F8_E8M0},
        {"F6_E2M3", FERRY_DTYPE_F6_E2M3}, {"F6_E3M2", FERRY_DTYPE_F6_E3M2},
        {"F4", FERRY_DTYPE_F4},           {"C64", FERRY_DTYPE_C64},
    };
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        ferry_dtype t = FERRY_DTYPE_NONE;
        CHECK_EQ_INT(ferry__dtype_from_st(st[i].s, strlen(st[i].s), &t), 0);
        CHECK_EQ_INT(t, st[i].t);
        CHECK_STR(ferry__dtype_st_name(st[i].t), st[i].s);
    }
    ferry_dtype t = FERRY_DTYPE_NONE;
    CHECK_EQ_INT(ferry__dtype_from_st("f32", 3, &t), FERRY_EDTYPE); /* exact spelling only */
    CHECK_EQ_INT(ferry__dtype_from_st("F32X", 3, &t), 0);           /* LEN bytes, unterminated */
    CHECK_EQ_INT(t, FERRY_DTYPE_F32);
    CHECK_EQ_INT(ferry__dtype_from_st("F32", 2, &t), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__dtype_from_st("Q4_0", 4, &t), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__dtype_from_st("", 0, &t), FERRY_EDTYPE);
    CHECK(ferry__dtype_st_name(FERRY_DTYPE_Q4_0) == NULL);
    CHECK(ferry__dtype_st_name(FERRY_DTYPE_MXFP4) == NULL);
}

static void test_nbytes(void)
{
    uint64_t b = 0;
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_Q4_0, 64, &b), 0);
    CHECK_EQ_INT(b, 36);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_Q6_K, 4096, &b), 0);
    CHECK_EQ_INT(b, 16 * 210);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F32, 0, &b), 0);
    CHECK_EQ_INT(b, 0);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_Q4_0, 33, &b), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_Q4_K, 255, &b), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F4, 3, &b), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F4, 6, &b), 0);
    CHECK_EQ_INT(b, 3);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F6_E2M3, 8, &b), 0);
    CHECK_EQ_INT(b, 6);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F6_E3M2, 6, &b), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_C64, 3, &b), 0);
    CHECK_EQ_INT(b, 24);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F32, 1ull << 62, &b), FERRY_EOVERFLOW);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_F32, (1ull << 62) - 1, &b), 0);
    CHECK(b == UINT64_MAX - 3);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_U8, UINT64_MAX, &b), 0);
    CHECK(b == UINT64_MAX);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_Q8_0, UINT64_MAX / 32 * 32, &b), FERRY_EOVERFLOW);
    CHECK_EQ_INT(ferry_dtype_nbytes(FERRY_DTYPE_NONE, 32, &b), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_dtype_nbytes((ferry_dtype)4, 32, &b), FERRY_EDTYPE);
}

/* ---- scalar conversions ---------------------------------------------------------------------- */

static void test_f16(void)
{
    static const struct {
        float f;
        uint16_t h;
    } to16[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.1f, 0x2e66},
        {65504.0f, 0x7bff},          /* largest half */
        {65519.0f, 0x7bff},          /* below the midpoint to 65536 */
        {65520.0f, 0x7c00},          /* midpoint: ties to even = Inf */
        {1e9f, 0x7c00},              /* overflow */
        {-1e9f, 0xfc00},
        {0x1p-14f, 0x0400},          /* smallest normal */
        {0x1p-24f, 0x0001},          /* smallest subnormal */
        {0x1p-25f, 0x0000},          /* half of it: ties to even = 0 */
        {0x1.8p-25f, 0x0001},        /* above the midpoint */
        {0x1.8p-24f, 0x0002},        /* 1.5 ulp: ties to even = 2 */
        {0x1.4p-24f, 0x0001},        /* 1.25 ulp */
        {0x1.ffcp-15f, 0x0400},      /* largest subnormal + half ulp rounds up to normal */
        {0x1p-30f, 0x0000},
        {-0x1p-24f, 0x8001},
        {1.0f + 0x1p-11f, 0x3c00},   /* halfway between 1 and 1+2^-10: even (1) */
        {1.0f + 0x3p-11f, 0x3c02},   /* halfway between 0x3c01 and 0x3c02: even (0x3c02) */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},
        {2047.0f, 0x67ff},
        {2049.0f, 0x6800},           /* halfway between 2048 and 2050: even 2048 */
        {2051.0f, 0x6802},           /* halfway between 2050 and 2052: even 2052 */
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof to16 / sizeof to16[0]; i++) {
        uint16_t h = ferry__f32_to_f16(to16[i].f);
        if (h != to16[i].h)
            fprintf(stderr, "f32_to_f16(%a) = 0x%04x, want 0x%04x\n", (double)to16[i].f, h,
                    to16[i].h);
        CHECK_EQ_INT(h, to16[i].h);
    }
    /* NaN stays NaN (and quiet), including one whose payload is only in the low bits. */
    uint16_t hn = ferry__f32_to_f16(bits_f(0x7f800001u));
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    hn = ferry__f32_to_f16(bits_f(0xffc00000u));
    CHECK(hn & 0x8000);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);

    CHECK(ferry__f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(ferry__f16_to_f32(0x03ff) == 1023.0f * 0x1p-24f);
    CHECK(ferry__f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(ferry__f16_to_f32(0x7bff) == 65504.0f);
    CHECK(ferry__f16_to_f32(0x3555) == 0x1.554p-2f);
    CHECK(ferry__f16_to_f32(0xfc00) == -INFINITY);
    CHECK(ferry__f16_to_f32(0x7c00) == INFINITY);
    CHECK(isnan(ferry__f16_to_f32(0x7e00)));
    CHECK(isnan(ferry__f16_to_f32(0x7c01)));
    CHECK(signbit(ferry__f16_to_f32(0x8000)) && ferry__f16_to_f32(0x8000) == 0.0f);

    /* Every half survives the round trip; NaNs stay NaNs. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ferry__f16_to_f32((uint16_t)h);
        uint16_t back = ferry__f32_to_f16(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan ? !((back & 0x7c00) == 0x7c00 && (back & 0x3ff) && isnan(f)) : back != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);

    /* Random floats in the half range: the result is the nearest half, ties to even. */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng();
        /* exponents 2^-26 .. 2^16, random sign and mantissa */
        u = (u & 0x807fffffu) | ((uint32_t)(101 + (rng() % 42)) << 23);
        float f = bits_f(u);
        uint16_t h = ferry__f32_to_f16(f);
        double v = f, got = ferry__f16_to_f32(h);
        if (isinf(got) || fabs(v) >= 65520.0) {
            bad += !!isinf(got) != (fabs(v) >= 65520.0);
            continue;
        }
        /* neighbours of h away from and towards zero */
        double up = ferry__f16_to_f32((uint16_t)(h + 1)), dn = ferry__f16_to_f32((uint16_t)(h - 1));
        double e = fabs(got - v);
        if ((h & 0x7fff) != 0x7bff && e > fabs(up - v))
            bad++;
        if ((h & 0x7fff) != 0 && e > fabs(dn - v))
            bad++;
        int tie = e == fabs(dn - v) || ((h & 0x7fff) != 0x7bff && e == fabs(up - v));
        if ((h & 0x7fff) != 0 && tie && (h & 1))
            bad++; /* a tie went to the odd neighbour */
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16(void)
{
    CHECK_EQ_INT(ferry__f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(ferry__f32_to_bf16(-2.0f), 0xc000);
    CHECK_EQ_INT(ferry__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);            /* tie: even */
    CHECK_EQ_INT(ferry__f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);            /* tie: even */
    CHECK_EQ_INT(ferry__f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above the tie */
    CHECK_EQ_INT(ferry__f32_to_bf16(bits_f(0x7f7fffffu)), 0x7f80);       /* max float -> Inf */
    CHECK_EQ_INT(ferry__f32_to_bf16(bits_f(0x7f7f7fffu)), 0x7f7f);       /* just below the tie */
    CHECK_EQ_INT(ferry__f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(ferry__f32_to_bf16(-INFINITY), 0xff80);
    CHECK_EQ_INT(ferry__f32_to_bf16(bits_f(0x00000001u)), 0x0000); /* tiny subnormal */
    CHECK_EQ_INT(ferry__f32_to_bf16(bits_f(0x00018000u)), 0x0002); /* subnormal tie: even */
    uint16_t n1 = ferry__f32_to_bf16(bits_f(0x7f800001u)); /* payload only in dropped bits */
    CHECK((n1 & 0x7f80) == 0x7f80 && (n1 & 0x7f) != 0);
    uint16_t n2 = ferry__f32_to_bf16(bits_f(0xff800001u));
    CHECK((n2 & 0xff80) == 0xff80 && (n2 & 0x7f) != 0);
    CHECK(isnan(ferry__bf16_to_f32(n1)) && isnan(ferry__bf16_to_f32(n2)));
    CHECK(ferry__bf16_to_f32(0x3f80) == 1.0f);
    CHECK(ferry__bf16_to_f32(0x4049) == 3.140625f);
    CHECK(ferry__bf16_to_f32(0xff80) == -INFINITY);
    CHECK(f_bits(ferry__bf16_to_f32(0x8000)) == 0x80000000u);
    for (uint32_t h = 0; h < 65536; h++) /* exact round trip of every non-NaN bf16 */
        if (!((h & 0x7f80) == 0x7f80 && (h & 0x7f)) &&
            ferry__f32_to_bf16(ferry__bf16_to_f32((uint16_t)h)) != h) {
            CHECK(0);
            break;
        }
}

static void test_small_types(void)
{
    float out[16];
    uint8_t e4[] = {0x38, 0xb8, 0x7e, 0x7f, 0xff, 0x01, 0x08, 0x00, 0x80, 0x3c};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_F8_E4M3, e4, out, 10), 0);
    CHECK(out[0] == 1.0f && out[1] == -1.0f && out[2] == 448.0f);
    CHECK(isnan(out[3]) && isnan(out[4]));
    CHECK(out[5] == 0x1p-9f && out[6] == 0x1p-6f && out[7] == 0.0f);
    CHECK(out[8] == 0.0f && signbit(out[8]) && out[9] == 1.5f);

    uint8_t e5[] = {0x3c, 0x7c, 0xfc, 0x7f, 0x01, 0x7b, 0x3e};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_F8_E5M2, e5, out, 7), 0);
    CHECK(out[0] == 1.0f && out[1] == INFINITY && out[2] == -INFINITY && isnan(out[3]));
    CHECK(out[4] == 0x1p-16f && out[5] == 57344.0f && out[6] == 1.5f);

    uint8_t e8[] = {127, 0, 255, 130, 1, 254};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_F8_E8M0, e8, out, 6), 0);
    CHECK(out[0] == 1.0f && out[1] == 0x1p-127f && isnan(out[2]) && out[3] == 8.0f);
    CHECK(out[4] == 0x1p-126f && out[5] == 0x1p127f);

    int8_t i8[] = {-128, 127, 0, -1};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_I8, i8, out, 4), 0);
    CHECK(out[0] == -128.0f && out[1] == 127.0f && out[2] == 0.0f && out[3] == -1.0f);
    uint8_t u8[] = {0, 255};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_U8, u8, out, 2), 0);
    CHECK(out[0] == 0.0f && out[1] == 255.0f);
    uint16_t u16[] = {65535, 1};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_U16, u16, out, 2), 0);
    CHECK(out[0] == 65535.0f && out[1] == 1.0f);
    int16_t i16[] = {-32768, 300};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_I16, i16, out, 2), 0);
    CHECK(out[0] == -32768.0f && out[1] == 300.0f);
    int32_t i32[] = {-100000, 16777216};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_I32, i32, out, 2), 0);
    CHECK(out[0] == -100000.0f && out[1] == 16777216.0f);
    uint32_t u32[] = {4000000000u};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_U32, u32, out, 1), 0);
    CHECK(out[0] == 4000000000.0f);
    int64_t i64[] = {-5, (int64_t)1 << 40};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_I64, i64, out, 2), 0);
    CHECK(out[0] == -5.0f && out[1] == 0x1p40f);
    uint64_t u64[] = {UINT64_MAX};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_U64, u64, out, 1), 0);
    CHECK(out[0] == 0x1p64f);
    uint8_t bl[] = {0, 1, 2, 255};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_BOOL, bl, out, 4), 0);
    CHECK(out[0] == 0.0f && out[1] == 1.0f && out[2] == 1.0f && out[3] == 1.0f);
    double f64[] = {0.1, -1e300, 3.0};
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_F64, f64, out, 3), 0);
    CHECK(out[0] == 0.1f && out[1] == -INFINITY && out[2] == 3.0f);

    /* not readable: nothing written */
    out[0] = 42.0f;
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_IQ2_XXS, u8, out, 256), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_C64, u8, out, 1), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_NONE, u8, out, 1), FERRY_EDTYPE);
    CHECK(out[0] == 42.0f);
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_K, out, u8, 256), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_I8, out, u8, 1), FERRY_EDTYPE);
}

/* ---- quantization --------------------------------------------------------------------------- */

static void test_q8_0_exact(void)
{
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16);
    x[0] = 127.0f; /* amax 127: d = 1 exactly, so q = round(x) */
    x[1] = -100.0f;
    x[5] = 2.5f;   /* rounds away from zero */
    x[6] = -2.5f;
    x[7] = 0.49f;
    uint8_t blk[34];
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q8_0, x, blk, 32), 0);
    CHECK_EQ_INT(blk[0], 0x00); /* f16 1.0 = 0x3c00, little-endian */
    CHECK_EQ_INT(blk[1], 0x3c);
    int8_t want[32];
    for (int j = 0; j < 32; j++)
        want[j] = (int8_t)(j - 16);
    want[0] = 127;
    want[1] = -100;
    want[5] = 3;
    want[6] = -3;
    want[7] = 0;
    CHECK(memcmp(blk + 2, want, 32) == 0);
    float y[32];
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q8_0, blk, y, 32), 0);
    for (int j = 0; j < 32; j++)
        CHECK(y[j] == (float)want[j]);

    /* a block of zeros: d = 0, all q = 0 */
    memset(x, 0, sizeof x);
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q8_0, x, blk, 32), 0);
    uint8_t zero[34] = {0};
    CHECK(memcmp(blk, zero, 34) == 0);
}

static void test_q4_0_exact(void)
{
    /* Largest magnitude negative (-8): d = -8 / -8 = 1, q = x + 8. */
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)((j * 5) % 15 - 7); /* -7..7 */
    x[0] = -8.0f;
    uint8_t blk[18];
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_0, x, blk, 32), 0);
    CHECK_EQ_INT(blk[0], 0x00);
    CHECK_EQ_INT(blk[1], 0x3c);
    int ok = 1;
    for (int j = 0; j < 16; j++) {
        uint8_t want = (uint8_t)(((int)x[j] + 8) | (((int)x[j + 16] + 8) << 4));
        ok &= blk[2 + j] == want;
    }
    CHECK(ok);
    float y[32];
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q4_0, blk, y, 32), 0);
    for (int j = 0; j < 32; j++)
        CHECK(y[j] == x[j]);

    /* Largest magnitude positive (16): d = -2; q = trunc(x / -2 + 8.5), clamped to 15. */
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f;
    x[3] = 16.0f;   /* -8 + 8.5 -> 0 */
    x[4] = -14.0f;  /* 7 + 8.5 -> 15 */
    x[5] = -15.0f;  /* 7.5 + 8.5 = 16 -> clamped 15 */
    x[6] = 3.0f;    /* -1.5 + 8.5 = 7 */
    x[20] = 2.0f;   /* -1 + 8.5 -> 7 */
    x[21] = -1.0f;  /* 0.5 + 8.5 = 9 */
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_0, x, blk, 32), 0);
    CHECK_EQ_INT(blk[0], 0x00); /* f16 -2.0 = 0xc000 */
    CHECK_EQ_INT(blk[1], 0xc0);
    CHECK_EQ_INT(blk[2 + 3], 0x00 | (8 << 4));
    CHECK_EQ_INT(blk[2 + 4], 15 | (7 << 4));
    CHECK_EQ_INT(blk[2 + 5], 15 | (9 << 4));
    CHECK_EQ_INT(blk[2 + 6], 7 | (8 << 4));
    CHECK_EQ_INT(blk[2 + 0], 8 | (8 << 4));
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q4_0, blk, y, 32), 0);
    CHECK(y[3] == 16.0f && y[4] == -14.0f && y[5] == -14.0f && y[6] == 2.0f);
    CHECK(y[20] == 2.0f && y[21] == -2.0f && y[0] == 0.0f);
}

/* Dequantized values of the hand-made q4_1, q5_0, q5_1 blocks. */
static void test_other_legacy_exact(void)
{
    uint8_t b1[20] = {0};
    put16(b1, 0x3800);     /* d = 0.5 */
    put16(b1 + 2, 0xc000); /* m = -2 */
    b1[4] = 0x3f;          /* element 0: 15, element 16: 3 */
    float y[32];
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q4_1, b1, y, 32), 0);
    CHECK(y[0] == 5.5f && y[16] == -0.5f && y[1] == -2.0f);

    uint8_t b5[22] = {0};
    put16(b5, 0x4000);                    /* d = 2 */
    uint32_t qh = (1u << 0) | (1u << 17); /* 5th bit of elements 0 and 17 */
    memcpy(b5 + 2, &qh, 4);
    b5[6] = 0x21;  /* element 0: 1 | 16 = 17, element 16: 2 */
    b5[7] = 0x40;  /* element 1: 0, element 17: 4 | 16 = 20 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q5_0, b5, y, 32), 0);
    CHECK(y[0] == 2.0f && y[16] == -28.0f && y[1] == -32.0f && y[17] == 8.0f && y[2] == -32.0f);

    uint8_t b51[24] = {0};
    put16(b51, 0x3c00);     /* d = 1 */
    put16(b51 + 2, 0x3c00); /* m = 1 */
    qh = 1u << 31;          /* element 31 */
    memcpy(b51 + 4, &qh, 4);
    b51[8 + 15] = 0xf0;     /* element 31: 15 | 16 = 31 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q5_1, b51, y, 32), 0);
    CHECK(y[31] == 32.0f && y[15] == 1.0f && y[0] == 1.0f);

    uint8_t b81[36] = {0};
    put16(b81, 0x3800); /* d = 0.5 */
    put16(b81 + 2, 0x7c00); /* s is not used to dequantize */
    b81[4] = 0xfe;      /* -2 */
    b81[35] = 100;
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q8_1, b81, y, 32), 0);
    CHECK(y[0] == -1.0f && y[31] == 50.0f && y[1] == 0.0f);
}

/* Hand-made k-quant, iq4 and mxfp4 blocks with a few known elements. */
static void test_kquant_exact(void)
{
    float y[256];

    /* q8_K: f32 d, 256 int8. */
    uint8_t q8k[292] = {0};
    float d = 0.25f;
    memcpy(q8k, &d, 4);
    q8k[4 + 0] = 4;
    q8k[4 + 255] = (uint8_t)-8;
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q8_K, q8k, y, 256), 0);
    CHECK(y[0] == 1.0f && y[255] == -2.0f && y[100] == 0.0f);

    /* q4_K: sub-block 0 scale 3 min 1, sub-block 5 scale 0x25 min 0x31 (six-bit, split). */
    uint8_t q4k[144] = {0};
    put16(q4k, 0x3c00);     /* d = 1 */
    put16(q4k + 2, 0x3800); /* dmin = 0.5 */
    uint8_t *sc = q4k + 4;
    sc[0] = 3;              /* scale 0 */
    sc[4] = 1;              /* min 0 */
    /* j = 5: scale = (sc[9] & 15) | (sc[1] >> 6) << 4; min = (sc[9] >> 4) | (sc[5] >> 6) << 4 */
    sc[9] = 0x15;           /* scale low 5, min low 1 */
    sc[1] = 0x80;           /* scale high 2 -> 0x25 = 37 */
    sc[5] = 0xc0;           /* min high 3 -> 0x31 = 49 */
    q4k[16 + 0] = 0x07;     /* element 0: 7 (sub-block 0) */
    q4k[16 + 64 + 1] = 0x20;/* chunk 2: element 128 + 32 + 1 = 161 (sub-block 5): 2 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q4_K, q4k, y, 256), 0);
    CHECK(y[0] == 3.0f * 7.0f - 0.5f);
    CHECK(y[1] == -0.5f);
    CHECK(y[161] == 37.0f * 2.0f - 0.5f * 49.0f);
    CHECK(y[160] == -0.5f * 49.0f);

    /* q5_K: like q4_K, the fifth bit of element 64c + 32h + l is bit 2c + h of qh[l]. */
    uint8_t q5k[176] = {0};
    put16(q5k, 0x3c00);
    put16(q5k + 2, 0x0000);
    memset(q5k + 4, 0, 12);
    q5k[4 + 2] = 1;         /* scale of sub-block 2 = 1 */
    q5k[4 + 3] = 2;         /* scale of sub-block 3 = 2 */
    q5k[16 + 7] = 0x04 | 0x08; /* elements 64+7 and 96+7 get +16 */
    q5k[48 + 32 + 7] = 0x31;   /* chunk 1: element 71 low 1, element 103 low 3 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q5_K, q5k, y, 256), 0);
    CHECK(y[71] == 17.0f && y[103] == 2.0f * 19.0f && y[70] == 0.0f);

    /* q6_K: element 128h + 32g + l takes the nibble of ql[64h + l (+32 for g odd)] (low for
     * g < 2), bits 2g of qh[32h + l], scale 8h + l/16 + 2g; x = d * sc * (q - 32). */
    uint8_t q6k[210] = {0};
    put16(q6k + 208, 0x3800);      /* d = 0.5 */
    for (int i = 0; i < 16; i++)
        q6k[192 + i] = (uint8_t)(i + 1);
    q6k[64 + 32 + 5] = 0xa0;       /* h = 1, g = 3, l = 5: high nibble 10 */
    q6k[128 + 32 + 5] = 0xc0;      /* bits 6-7: 3 -> q = 10 | 48 = 58 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q6_K, q6k, y, 256), 0);
    CHECK(y[128 + 96 + 5] == 0.5f * (float)(8 + 0 + 6 + 1) * 26.0f);
    CHECK(y[0] == 0.5f * 1.0f * -32.0f);
    CHECK(y[16] == 0.5f * 2.0f * -32.0f);

    /* q2_K: 2-bit quants, scale/min nibbles per 16 elements. */
    uint8_t q2k[84] = {0};
    put16(q2k + 80, 0x3c00);  /* d = 1 */
    put16(q2k + 82, 0x4000);  /* dmin = 2 */
    q2k[0] = 0x13;            /* sub-block 0: scale 3, min 1 */
    q2k[5] = 0x05;            /* sub-block 5 (elements 80..95): scale 5, min 0 */
    q2k[16 + 0] = 0x02;       /* element 0: 2 */
    /* sub-block 5 = half 0, s = 2 (elements 64..95, bits 4-5), g = 1 (elements 80..95 from
     * quant bytes 16..31) */
    q2k[16 + 16 + 3] = 0x30;  /* element 83: 3 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q2_K, q2k, y, 256), 0);
    CHECK(y[0] == 3.0f * 2.0f - 2.0f);
    CHECK(y[1] == -2.0f);
    CHECK(y[83] == 15.0f && y[82] == 0.0f);

    /* q3_K: element 128h + 32s + 16g + l: bits 2s of qs[32h + 16g + l], high bit (4h + s) of
     * hmask[16g + l], scale 8h + 2s + g (six-bit, offset 32). */
    uint8_t q3k[110] = {0};
    put16(q3k + 108, 0x3c00); /* d = 1 */
    /* all scales 0 -> -32 except: scale 0 = 33 (low 1, high 2), scale 13 = 40 (low 8, high 2) */
    q3k[96 + 0] = 0x01;
    q3k[96 + 8] = 0x02;             /* high bits of scale 0: byte 8, bits 0-1 */
    q3k[96 + 5] = 0x80;             /* scale 13: low nibble in the high half of byte 5 */
    q3k[96 + 9] |= 0x02 << 6;       /* scale 13: high bits in byte 8 + 13 % 4 = 9, bits 6-7 */
    q3k[0] = 0x01;                  /* hmask: element 0 has its high bit */
    q3k[32 + 0] = 0x03;             /* element 0: 3 */
    /* scale 13 = h 1, s 2, g 1: element 128 + 64 + 16 + 2 = 210 */
    q3k[32 + 32 + 16 + 2] = 0x10;   /* bits 4-5: 1 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q3_K, q3k, y, 256), 0);
    CHECK(y[0] == 1.0f * 3.0f);      /* scale 33 - 32 = 1, high bit set: q = 3 */
    CHECK(y[1] == 1.0f * -4.0f);     /* no high bit: q - 4 */
    CHECK(y[210] == 8.0f * (1.0f - 4.0f));
    CHECK(y[16] == -32.0f * -4.0f);  /* scale 1 = 0 - 32 */

    /* iq4_nl and iq4_xs: non-linear levels. */
    uint8_t nl[18] = {0};
    put16(nl, 0x3c00);
    nl[2] = 0xf0;  /* element 0: level 0 = -127, element 16: level 15 = 113 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_IQ4_NL, nl, y, 32), 0);
    CHECK(y[0] == -127.0f && y[16] == 113.0f && y[1] == -127.0f);
    uint8_t xs[136] = {0};
    put16(xs, 0x3800);       /* d = 0.5 */
    put16(xs + 2, 0x3 << 2); /* group 1 high bits 3 */
    xs[4] = 0x20;            /* group 1 low bits 2 -> ls = 50, scale 18 */
    xs[8 + 16] = 0x08;       /* group 1 element 0 (32): level 8 = 1 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_IQ4_XS, xs, y, 256), 0);
    CHECK(y[32] == 0.5f * 18.0f * 1.0f);
    CHECK(y[0] == 0.5f * -32.0f * -127.0f);

    /* mxfp4: E8M0 scale, E2M1 nibbles. */
    uint8_t mx[17] = {0};
    mx[0] = 128;   /* 2 */
    mx[1] = 0xf7;  /* element 0: 6, element 16: -6 */
    mx[2] = 0x19;  /* element 1: -0.5, element 17: 0.5 */
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_MXFP4, mx, y, 32), 0);
    CHECK(y[0] == 12.0f && y[16] == -12.0f && y[1] == -1.0f && y[17] == 1.0f && y[2] == 0.0f);
}

/* Random data through quantize -> dequantize stays within the quantization step. */
static void test_quant_error(void)
{
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    for (int i = 0; i < N; i++)
        x[i] = frand() * (i % 64 < 32 ? 1.0f : 1000.0f);

    struct {
        ferry_dtype t;
        int levels; /* steps over the block's range */
        int minmax; /* range is max - min (else 2 * amax) */
    } cases[] = {
        {FERRY_DTYPE_Q8_0, 254, 0}, {FERRY_DTYPE_Q8_1, 254, 0}, {FERRY_DTYPE_Q4_0, 16, 0},
        {FERRY_DTYPE_Q5_0, 32, 0},  {FERRY_DTYPE_Q4_1, 15, 1},  {FERRY_DTYPE_Q5_1, 31, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ferry_dtype t = cases[c].t;
        CHECK_EQ_INT(ferry__from_f32(t, x, q, N), 0);
        CHECK_EQ_INT(ferry__to_f32(t, q, y, N), 0);
        int bad = 0;
        for (int b = 0; b < N / 32; b++) {
            float mn = x[32 * b], mx = x[32 * b], amax = 0.0f;
            for (int j = 0; j < 32; j++) {
                float v = x[32 * b + j];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
                amax = fabsf(v) > amax ? fabsf(v) : amax;
            }
            float range = cases[c].minmax ? mx - mn : 2.0f * amax;
            float step = range / (float)cases[c].levels;
            for (int j = 0; j < 32; j++) {
                float e = fabsf(x[32 * b + j] - y[32 * b + j]);
                /* half a step, plus the f16 rounding of the scale (and the min); q4_0/q5_0
                 * clamp the far end of the range, a whole step */
                float lim = 0.5f * step + range * 0x1p-10f;
                if (t == FERRY_DTYPE_Q4_0 || t == FERRY_DTYPE_Q5_0)
                    lim = step + range * 0x1p-10f;
                if (e > lim)
                    bad++;
            }
        }
        if (bad)
            fprintf(stderr, "%s: %d elements beyond the quantization step\n", ferry_dtype_name(t),
                    bad);
        CHECK_EQ_INT(bad, 0);
    }

    /* q8_1 stores s = d * sum(q) */
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q8_1, x, q, 32), 0);
    float d = ferry__f16_to_f32((uint16_t)(q[0] | q[1] << 8));
    float s = ferry__f16_to_f32((uint16_t)(q[2] | q[3] << 8));
    int sum = 0;
    for (int j = 0; j < 32; j++)
        sum += (int8_t)q[4 + j];
    CHECK(fabsf(s - d * (float)sum) <= fabsf(d * (float)sum) * 0x1p-9f + 1e-6f);

    /* q4_0: every element not at the clamped end is within half a step */
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_0, x, q, N), 0);
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q4_0, q, y, N), 0);
    int bad = 0;
    for (int b = 0; b < N / 32; b++) {
        float dd = ferry__f16_to_f32((uint16_t)(q[18 * b] | q[18 * b + 1] << 8));
        for (int j = 0; j < 32; j++) {
            int nib = j < 16 ? q[18 * b + 2 + j] & 15 : q[18 * b + 2 + j - 16] >> 4;
            if (nib != 15 && fabsf(x[32 * b + j] - y[32 * b + j]) > 0.5f * fabsf(dd) * 1.01f)
                bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);

    /* NaN and Inf in the input do not crash and give bytes (values unspecified) */
    float odd[32];
    for (int j = 0; j < 32; j++)
        odd[j] = j == 3 ? NAN : j == 9 ? INFINITY : (float)j;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        CHECK_EQ_INT(ferry__from_f32(cases[c].t, odd, q, 32), 0);
}

/* ---- ferry_dtype_convert ----------------------------------------------------------------- */

static void test_convert(void)
{
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_F32, FERRY_DTYPE_F16));
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_BF16, FERRY_DTYPE_Q8_0));
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_Q4_K, FERRY_DTYPE_F16));
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_Q6_K, FERRY_DTYPE_Q4_0));
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_F8_E4M3, FERRY_DTYPE_BF16));
    CHECK(ferry_dtype_can_convert(FERRY_DTYPE_IQ2_XXS, FERRY_DTYPE_IQ2_XXS)); /* a copy */
    CHECK(!ferry_dtype_can_convert(FERRY_DTYPE_IQ2_XXS, FERRY_DTYPE_F32));
    CHECK(!ferry_dtype_can_convert(FERRY_DTYPE_F32, FERRY_DTYPE_Q4_K));
    CHECK(!ferry_dtype_can_convert(FERRY_DTYPE_F32, FERRY_DTYPE_NONE));
    CHECK(!ferry_dtype_can_convert((ferry_dtype)4, (ferry_dtype)4));
    for (int s = 0; s < FERRY_DTYPE_COUNT; s++)
        for (int d = 0; d < FERRY_DTYPE_COUNT; d++)
            if (ferry__dtype_valid((ferry_dtype)s) && ferry__dtype_valid((ferry_dtype)d) && s != d)
                CHECK_EQ_INT(ferry_dtype_can_convert((ferry_dtype)s, (ferry_dtype)d),
                             ferry__dtype_readable((ferry_dtype)s) &&
                                 ferry__dtype_writable((ferry_dtype)d));

    enum { N = 10240 }; /* more than one staging chunk, not a multiple of it */
    static float x[N], y[N], z[N];
    static uint8_t a[N * 4 + 8], b[N * 4 + 8], c[N * 4 + 8];
    for (int i = 0; i < N; i++)
        x[i] = frand() * 10.0f;

    /* f32 -> f16 -> f32 equals the scalar conversions */
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_F16, a, N), 0);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F16, a, FERRY_DTYPE_F32, y, N), 0);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += y[i] != ferry__f16_to_f32(ferry__f32_to_f16(x[i]));
    CHECK_EQ_INT(bad, 0);

    /* bf16 -> f16 through the staging buffer equals the composition of the scalars */
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_BF16, a, N), 0);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_BF16, a, FERRY_DTYPE_F16, b, N), 0);
    bad = 0;
    for (int i = 0; i < N; i++) {
        uint16_t bf, h;
        memcpy(&bf, a + 2 * i, 2);
        memcpy(&h, b + 2 * i, 2);
        bad += bf != ferry__f32_to_bf16(x[i]);
        bad += h != ferry__f32_to_f16(ferry__bf16_to_f32(bf));
    }
    CHECK_EQ_INT(bad, 0);

    /* q8_0 -> q4_0 equals dequantize then quantize */
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_Q8_0, a, N), 0);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_Q8_0, a, FERRY_DTYPE_Q4_0, b, N), 0);
    CHECK_EQ_INT(ferry__to_f32(FERRY_DTYPE_Q8_0, a, z, N), 0);
    CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_0, z, c, N), 0);
    CHECK(memcmp(b, c, N / 32 * 18) == 0);

    /* same type: a copy */
    memset(c, 0, sizeof c);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_Q4_0, b, FERRY_DTYPE_Q4_0, c, N), 0);
    CHECK(memcmp(b, c, N / 32 * 18) == 0);

    /* f32 at an odd address (as inside a safetensors file), both directions */
    memcpy(a + 1, x, N * 4);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, a + 1, FERRY_DTYPE_BF16, b, N), 0);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_BF16, b, FERRY_DTYPE_F32, c + 3, N), 0);
    bad = 0;
    for (int i = 0; i < N; i++) {
        float v;
        memcpy(&v, c + 3 + 4 * i, 4);
        bad += v != ferry__bf16_to_f32(ferry__f32_to_bf16(x[i]));
    }
    CHECK_EQ_INT(bad, 0);

    /* The bulk conversions (F16C where the CPU has it, the portable loops otherwise) agree
     * bit for bit with the scalar ones, on every half and on floats around every rounding
     * case: random bit patterns over the whole range, NaN, Inf, subnormal results, ties. */
    for (int pass = 0; pass < 2; pass++) {
        ferry__dtype_force_generic(pass);
        static uint16_t all[65536];
        static float allf[65536];
        for (uint32_t h = 0; h < 65536; h++)
            all[h] = (uint16_t)h;
        CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F16, all, FERRY_DTYPE_F32, allf, 65536), 0);
        bad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            float want = ferry__f16_to_f32((uint16_t)h);
            bad += isnan(want) ? !isnan(allf[h]) : f_bits(allf[h]) != f_bits(want);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_BF16, all, FERRY_DTYPE_F32, allf, 65536), 0);
        bad = 0;
        for (uint32_t h = 0; h < 65536; h++)
            bad += f_bits(allf[h]) != (uint32_t)h << 16;
        CHECK_EQ_INT(bad, 0);

        for (int i = 0; i < N; i++) {
            uint32_t u = (uint32_t)rng();
            if (i % 3 == 0) /* exponents near the half's range, ties and subnormals included */
                u = (u & 0x807fffffu) | (uint32_t)(100 + rng() % 45) << 23;
            if (i % 5 == 0)
                u &= 0xffffe000u | (i % 2 ? 0x1000u : 0u); /* exact ties for f16 */
            if (i % 7 == 0)
                u &= 0xffff8000u | (i % 2 ? 0x8000u : 0u); /* exact ties for bf16 */
            z[i] = bits_f(u);
        }
        z[0] = NAN;
        z[1] = -INFINITY;
        z[2] = bits_f(0x7f800001u);
        z[3] = 65520.0f;
        z[4] = 0x1p-25f;
        z[5] = -0.0f;
        CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, z, FERRY_DTYPE_F16, a, N), 0);
        CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, z, FERRY_DTYPE_BF16, b, N), 0);
        int bad16 = 0, badbf = 0;
        for (int i = 0; i < N; i++) {
            uint16_t h, bf;
            memcpy(&h, a + 2 * i, 2);
            memcpy(&bf, b + 2 * i, 2);
            bad16 += h != ferry__f32_to_f16(z[i]);
            badbf += bf != ferry__f32_to_bf16(z[i]);
        }
        CHECK_EQ_INT(bad16, 0);
        CHECK_EQ_INT(badbf, 0);
    }
    ferry__dtype_force_generic(0);

    /* errors */
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_Q8_0, a, 33), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_Q4_0, a, FERRY_DTYPE_F32, y, 48), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_Q4_K, a, 256), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_IQ1_S, a, FERRY_DTYPE_F32, y, 256), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_NONE, a, FERRY_DTYPE_F32, y, 1), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, NULL, FERRY_DTYPE_F16, a, 4), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_F16, a, 0), 0);
    CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, FERRY_DTYPE_F64, a, 1ull << 62),
                 FERRY_EOVERFLOW);
}

/* ---- dot products ------------------------------------------------------------------------ */

/* Fills ROW with N random elements of type T whose scales are sane (no Inf/NaN). */
static void fill_row(ferry_dtype t, uint8_t *row, uint64_t n, float *tmp)
{
    for (uint64_t i = 0; i < n; i++)
        tmp[i] = frand() * 4.0f;
    if (t == FERRY_DTYPE_F16 || t == FERRY_DTYPE_BF16) {
        /* raw bit patterns: subnormals, zeros of both signs, the whole exponent range (no
         * Inf/NaN; bf16 kept to magnitudes whose sums stay finite) */
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)rng();
            if (t == FERRY_DTYPE_F16 && (h & 0x7c00) == 0x7c00)
                h &= 0xbfff;
            if (t == FERRY_DTYPE_BF16)
                h = (uint16_t)((h & 0x807f) | (uint16_t)((100 + rng() % 50) << 7));
            if (i % 7 == 0)
                h &= 0x83ff; /* a subnormal (or zero) */
            put16(row + 2 * i, h);
        }
        return;
    }
    if (ferry__dtype_writable(t)) {
        CHECK_EQ_INT(ferry__from_f32(t, tmp, row, n), 0);
        return;
    }
    uint64_t nbytes = 0;
    CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &nbytes), 0);
    for (uint64_t i = 0; i < nbytes; i++)
        row[i] = (uint8_t)rng();
    uint64_t bb = ferry_dtype_block_bytes(t), nb = nbytes / bb;
    for (uint64_t b = 0; b < nb; b++) {
        uint8_t *p = row + b * bb;
        uint16_t h = ferry__f32_to_f16(0.01f + 0.01f * (float)(rng() % 8));
        switch (t) {
        case FERRY_DTYPE_Q2_K: put16(p + 80, h); put16(p + 82, h); break;
        case FERRY_DTYPE_Q3_K: put16(p + 108, h); break;
        case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K: put16(p, h); put16(p + 2, h); break;
        case FERRY_DTYPE_Q6_K: put16(p + 208, h); break;
        case FERRY_DTYPE_IQ4_NL: case FERRY_DTYPE_IQ4_XS: put16(p, h); break;
        case FERRY_DTYPE_Q8_K: { float d = 0.02f; memcpy(p, &d, 4); break; }
        case FERRY_DTYPE_MXFP4: p[0] = (uint8_t)(120 + rng() % 10); break;
        case FERRY_DTYPE_F8_E4M3: if ((p[0] & 0x7f) == 0x7f) p[0] = 0x30; break;
        case FERRY_DTYPE_F8_E5M2: if ((p[0] & 0x7c) == 0x7c) p[0] = 0x30; break;
        case FERRY_DTYPE_F8_E8M0: p[0] = (uint8_t)(110 + p[0] % 30); break;
        default: break;
        }
    }
}

static void test_dot(void)
{
    enum { COLS = 2048 + 256, ROWS = 5 };
    static uint8_t w[ROWS][COLS * 8 + 64];
    static float x[COLS], deq[COLS], tmp[COLS], y[ROWS];
    for (int i = 0; i < COLS; i++)
        x[i] = frand();
    int checked = 0;
    /* every kernel set this CPU has: the best (AVX-512 with VBMI where it is there), AVX-512,
     * AVX2, portable */
    const int caps[] = {-1, FERRY__ISA_AVX512, FERRY__ISA_AVX2, FERRY__ISA_GENERIC};
    for (int pass = 0; pass < 4; pass++) {
        ferry__dtype_force_isa(caps[pass]);
        for (int t = 0; t < FERRY_DTYPE_COUNT; t++) {
            if (!ferry__dtype_readable((ferry_dtype)t))
                continue;
            uint64_t be = ferry_dtype_block_elems((ferry_dtype)t);
            /* several lengths: whole row, odd number of blocks, shorter than a vector */
            uint64_t lens[] = {COLS, be * 3, be == 1 ? 7 : be, be == 1 ? 37 : be * 5};
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                uint64_t n = lens[li];
                fill_row((ferry_dtype)t, w[0], n, tmp);
                CHECK_EQ_INT(ferry__to_f32((ferry_dtype)t, w[0], deq, n), 0);
                double ref = 0.0, mag = 0.0;
                for (uint64_t i = 0; i < n; i++) {
                    ref += (double)deq[i] * x[i];
                    mag += fabs((double)deq[i] * x[i]);
                }
                float got = NAN;
                CHECK_EQ_INT(ferry__dot_row((ferry_dtype)t, w[0], x, n, &got), 0);
                if (!(fabs(got - ref) <= 3e-5 * mag + 1e-6)) {
                    fprintf(stderr, "dot %s n=%llu (%s): %.9g vs %.9g\n",
                            ferry_dtype_name((ferry_dtype)t), (unsigned long long)n,
                            ferry__dot_isa(), (double)got, ref);
                    CHECK(0);
                }
                checked++;
            }
            /* one-hot x picks out each element exactly: catches a wrong element order or a
             * lane converted wrongly that a random sum would hide in its tolerance */
            {
                static float hot[3 * 256];
                uint64_t n = be == 1 ? 67 : 3 * be;
                fill_row((ferry_dtype)t, w[0], n, tmp);
                CHECK_EQ_INT(ferry__to_f32((ferry_dtype)t, w[0], deq, n), 0);
                memset(hot, 0, sizeof hot);
                int wrong = 0;
                for (uint64_t i = 0; i < n; i++) {
                    float got = NAN;
                    hot[i] = 1.0f;
                    ferry__dot_row((ferry_dtype)t, w[0], hot, n, &got);
                    hot[i] = 0.0f;
                    wrong += got != deq[i];
                }
                if (wrong)
                    fprintf(stderr, "dot %s (%s): %d elements wrong\n",
                            ferry_dtype_name((ferry_dtype)t), ferry__dot_isa(), wrong);
                CHECK_EQ_INT(wrong, 0);
            }
            /* matvec over rows with a stride beyond the row's size, from an odd address */
            uint64_t rb = 0;
            CHECK_EQ_INT(ferry_dtype_nbytes((ferry_dtype)t, COLS, &rb), 0);
            uint64_t stride = rb + 3;
            uint8_t *base = &w[0][0] + 1;
            for (int r = 0; r < ROWS; r++)
                fill_row((ferry_dtype)t, base + r * stride, COLS, tmp);
            CHECK_EQ_INT(ferry__matvec((ferry_dtype)t, base, ROWS, COLS, stride, x, y), 0);
            for (int r = 0; r < ROWS; r++) {
                float one = NAN;
                CHECK_EQ_INT(ferry__dot_row((ferry_dtype)t, base + r * stride, x, COLS, &one), 0);
                CHECK(one == y[r]);
            }
        }
    }
    ferry__dtype_force_isa(-1);
    CHECK(checked > 100);

    /* The two kernel sets agree on the fast types (bit-exactness is not promised). */
    float g = 0, v = 0;
    fill_row(FERRY_DTYPE_Q4_0, w[0], COLS, tmp);
    ferry__dtype_force_generic(1);
    CHECK_EQ_INT(ferry__dot_row(FERRY_DTYPE_Q4_0, w[0], x, COLS, &g), 0);
    CHECK_STR(ferry__dot_isa(), "generic");
    ferry__dtype_force_generic(0);
    CHECK_EQ_INT(ferry__dot_row(FERRY_DTYPE_Q4_0, w[0], x, COLS, &v), 0);
    CHECK(fabsf(g - v) <= 1e-3f * (fabsf(g) + 1.0f));
    printf("dot kernels: %s\n", ferry__dot_isa());

    /* errors */
    float out = 0;
    CHECK_EQ_INT(ferry__dot_row(FERRY_DTYPE_IQ2_XXS, w[0], x, 256, &out), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry__dot_row(FERRY_DTYPE_Q8_0, w[0], x, 40, &out), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry__dot_row(FERRY_DTYPE_F32, w[0], x, 0, &out), 0);
    CHECK(out == 0.0f);
    CHECK_EQ_INT(ferry__matvec(FERRY_DTYPE_Q8_0, w[0], 2, 64, 60, x, y), FERRY_EINVAL);
    CHECK_EQ_INT(ferry__matvec(FERRY_DTYPE_Q8_0, w[0], 2, 48, 68, x, y), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry__matvec(FERRY_DTYPE_IQ3_S, w[0], 2, 256, 110, x, y), FERRY_EDTYPE);
}

/* ---- GEMM ---------------------------------------------------------------------------------- */

/* Returns the number of elements of C (m x n inside ldc) that differ from C0 + alpha*A*B
 * (double reference) by more than the tolerance, plus those outside the m x n window that
 * changed at all. */
static int gemm_errors(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a,
                       uint64_t lda, const float *b, uint64_t ldb, const float *c0,
                       const float *c, uint64_t ldc)
{
    int bad = 0;
    for (uint64_t i = 0; i < m; i++) {
        for (uint64_t j = 0; j < ldc; j++) {
            if (j >= n) {
                bad += c[i * ldc + j] != c0[i * ldc + j];
                continue;
            }
            double s = 0.0, mag = 0.0;
            for (uint64_t p = 0; p < k; p++) {
                s += (double)a[i * lda + p] * b[p * ldb + j];
                mag += fabs((double)a[i * lda + p] * b[p * ldb + j]);
            }
            double want = c0[i * ldc + j] + alpha * s;
            double tol = 1e-5 * (fabs(alpha) * mag + fabs(c0[i * ldc + j])) + 1e-6;
            if (!(fabs(c[i * ldc + j] - want) <= tol))
                bad++;
        }
    }
    return bad;
}

/* Elements of C2 (ferry__sgemm) that differ from C (ferry__sgemm_ref, same inputs) by more than
 * float rounding of the sum allows; outside the m x n window they must be identical. */
static int gemm_disagree(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a,
                         uint64_t lda, const float *b, uint64_t ldb, const float *c0,
                         const float *c, const float *c2, uint64_t ldc)
{
    int bad = 0;
    for (uint64_t i = 0; i < m; i++) {
        for (uint64_t j = 0; j < ldc; j++) {
            if (j >= n) {
                bad += memcmp(&c[i * ldc + j], &c2[i * ldc + j], sizeof *c) != 0;
                continue;
            }
            double mag = 0.0;
            for (uint64_t p = 0; p < k; p++)
                mag += fabs((double)a[i * lda + p] * b[p * ldb + j]);
            double tol = 2e-5 * (fabs(alpha) * mag + fabs(c0[i * ldc + j])) + 2e-6;
            if (!(fabs((double)c[i * ldc + j] - c2[i * ldc + j]) <= tol))
                bad++;
        }
    }
    return bad;
}

#if defined(__SANITIZE_THREAD__)
#define GEMM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GEMM_TSAN 1
#endif
#endif

/* Whether OpenBLAS is in this process (without loading it). */
static int openblas_loaded(void)
{
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libopenblas.so", RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h); /* drops the reference NOLOAD took, not the library */
    return h != NULL;
}

static void test_gemm(void)
{
    /* ferry does not link OpenBLAS: nothing has loaded it before the first GEMM */
    CHECK(!openblas_loaded());
    const char *env = getenv("FERRY_BLAS");
    int forced_off = env && strcmp(env, "0") == 0;
    int identical = 1; /* ferry__sgemm gave ferry__sgemm_ref's bits in every case */
    struct {
        uint64_t m, n, k, lda, ldb, ldc;
        float alpha;
    } cases[] = {
        {1, 1, 1, 1, 1, 1, 1.0f},
        {5, 7, 3, 3, 7, 7, 0.5f},
        {4, 16, 8, 8, 16, 16, 1.0f},
        {37, 29, 300, 310, 33, 31, -1.5f},
        {130, 270, 520, 521, 275, 272, 0.25f}, /* crosses the 256-column and 256-k panels */
        {3, 530, 17, 20, 530, 531, 2.0f},
        {67, 9, 5, 5, 9, 9, 1.0f},
    };
    size_t na = 140 * 530, nb = 530 * 540, nc = 140 * 540;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
    float *c0 = malloc(nc * sizeof *c0), *c = malloc(nc * sizeof *c), *c2 = malloc(nc * sizeof *c2);
    CHECK(a && b && c0 && c && c2);
    if (!a || !b || !c0 || !c || !c2)
        goto out;
    for (size_t i = 0; i < na; i++)
        a[i] = frand();
    for (size_t i = 0; i < nb; i++)
        b[i] = frand();
    for (size_t i = 0; i < nc; i++)
        c0[i] = frand();
    for (int pass = 0; pass < 2; pass++) {
        ferry__dtype_force_generic(pass == 1);
        for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
            uint64_t m = cases[t].m, n = cases[t].n, k = cases[t].k;
            memcpy(c, c0, m * cases[t].ldc * sizeof *c);
            ferry__sgemm_ref(m, n, k, cases[t].alpha, a, cases[t].lda, b, cases[t].ldb, c,
                             cases[t].ldc);
            int bad = gemm_errors(m, n, k, cases[t].alpha, a, cases[t].lda, b, cases[t].ldb, c0, c,
                                  cases[t].ldc);
            if (bad)
                fprintf(stderr, "sgemm_ref %llux%llux%llu (pass %d): %d bad\n",
                        (unsigned long long)m, (unsigned long long)n, (unsigned long long)k, pass,
                        bad);
            CHECK_EQ_INT(bad, 0);
            /* the dispatching entry point (OpenBLAS when loaded) agrees with the loop */
            memcpy(c2, c0, m * cases[t].ldc * sizeof *c2);
            ferry__sgemm(m, n, k, cases[t].alpha, a, cases[t].lda, b, cases[t].ldb, c2,
                         cases[t].ldc);
            bad = gemm_errors(m, n, k, cases[t].alpha, a, cases[t].lda, b, cases[t].ldb, c0, c2,
                              cases[t].ldc);
            CHECK_EQ_INT(bad, 0);
            bad = gemm_disagree(m, n, k, cases[t].alpha, a, cases[t].lda, b, cases[t].ldb, c0, c,
                                c2, cases[t].ldc);
            if (bad)
                fprintf(stderr, "sgemm (%s) %llux%llux%llu (pass %d): %d differ from sgemm_ref\n",
                        ferry__sgemm_backend(), (unsigned long long)m, (unsigned long long)n,
                        (unsigned long long)k, pass, bad);
            CHECK_EQ_INT(bad, 0);
            identical &= memcmp(c, c2, m * cases[t].ldc * sizeof *c) == 0;
        }
    }
    ferry__dtype_force_generic(0);
    /* degenerate shapes leave C alone */
    memcpy(c, c0, 64 * sizeof *c);
    ferry__sgemm_ref(0, 4, 4, 1.0f, a, 4, b, 4, c, 4);
    ferry__sgemm_ref(4, 4, 0, 1.0f, a, 4, b, 4, c, 4);
    ferry__sgemm(4, 4, 4, 0.0f, a, 4, b, 4, c, 4);
    CHECK(memcmp(c, c0, 64 * sizeof *c) == 0);
    /* the backend's name is what ran: OpenBLAS is loaded exactly when it says "openblas", and the
     * builtin loop gives ferry__sgemm_ref's bits */
    const char *be = ferry__sgemm_backend();
    int loaded = openblas_loaded();
    printf("sgemm backend: %s%s\n", be, forced_off ? " (FERRY_BLAS=0)" : "");
    CHECK(strcmp(be, "openblas") == 0 || strcmp(be, "builtin") == 0);
    CHECK_EQ_INT(strcmp(be, "openblas") == 0, loaded);
    if (strcmp(be, "builtin") == 0)
        CHECK(identical);
#if defined(FERRY_BLAS_DLOPEN) && !defined(GEMM_TSAN)
    if (forced_off) {
        CHECK_STR(be, "builtin");
    } else if (!loaded) {
        /* ferry found no OpenBLAS: then none may be loadable */
        void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        if (!h)
            h = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
        CHECK(h == NULL || dlsym(h, "cblas_sgemm") == NULL);
        if (!h)
            printf("SKIP: libopenblas.so.0 not found, the OpenBLAS GEMM path is untested\n");
    }
#else
    /* built without FERRY_BLAS, or under TSan: never OpenBLAS */
    CHECK_STR(be, "builtin");
#endif
out:
    free(a);
    free(b);
    free(c0);
    free(c);
    free(c2);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "gemm") == 0) {
        test_gemm();
        return check_finish();
    }
    test_table();
    test_gguf_ids();
    test_safetensors_names();
    test_nbytes();
    test_f16();
    test_bf16();
    test_small_types();
    test_q8_0_exact();
    test_q4_0_exact();
    test_other_legacy_exact();
    test_kquant_exact();
    test_quant_error();
    test_convert();
    test_dot();
    test_gemm();
    return check_finish();
}
