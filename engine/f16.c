/*
 * f16.c — half precision for the KV cache and attention, rounded as llama.cpp rounds it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && __GNUC__ >= 12
#define F16_NATIVE 1
#include <immintrin.h>
#endif

static int cpu_has_avx512fp16(void)
{
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7)
        return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    return (d >> 23) & 1;
#else
    return 0;
#endif
}

int f16_arith_mode(void)
{
    const char *e = getenv("FERRY_F16_ARITH");
    int native = cpu_has_avx512fp16();
    int want = e && (*e == '0' || *e == '1') ? *e == '1' : native;
    return !want ? F16_ARITH_NONE : native ? F16_ARITH_NATIVE : F16_ARITH_EMULATED;
}


/* f32 -> f16 bits, round to nearest even; beyond the range gives Inf, NaN stays NaN. */
uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x47800000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* a subnormal half: 0.5 + |f| puts the last place at 2^-24 */
        float r = fabsf(f) + 0.5f;
        uint32_t rb;
        memcpy(&rb, &r, sizeof rb);
        return (uint16_t)(sign | (rb - 0x3f000000u));
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    float f;
    if (em >= 0x7c00u) {
        u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
    } else if (em >= 0x400u) {
        u = sign | ((em << 13) + ((127u - 15u) << 23));
    } else {
        f = (float)em * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

/* D rounded once to the nearest f16 (ties to even), as a float; beyond the range gives Inf.
 * Integer arithmetic on D's bits: the mantissa's bits below the f16 quantum are dropped with
 * round-half-even. */
static float f16_round(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    uint64_t a = u & ~(UINT64_C(1) << 63);
    if (a == 0 || a >= UINT64_C(0x7ff0000000000000))
        return (float)d;
    int e = (int)(a >> 52) - 1023; /* |d| in [2^e, 2^(e+1)) */
    if (e < -25)                   /* below half the smallest subnormal */
        return (float)(d * 0.0);
    if (e > 15)
        return (float)copysign(INFINITY, d);
    int q = e < -14 ? -24 : e - 10; /* the f16 quantum at that magnitude: 2^q */
    int shift = 52 - (e - q);       /* 42 for normal halves, up to 53 */
    uint64_t m = (a & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52);
    uint64_t k = m >> shift, rem = m & ((UINT64_C(1) << shift) - 1), half = UINT64_C(1) << (shift - 1);
    if (rem > half || (rem == half && (k & 1)))
        k++;
    uint64_t pb = (uint64_t)(q + 1023) << 52; /* 2^q */
    double p2;
    memcpy(&p2, &pb, sizeof p2);
    double r = (double)k * p2;
    if (r >= 65520.0)
        return (float)copysign(INFINITY, d);
    return (float)copysign(r, d);
}

/* f16 operations on f16 values, the exact result rounded once. The product of two f16 values is
 * exact in f32, and a sum of two f16 values rounded to f32 and then to f16 rounds as the exact
 * sum would (f32 has 2 x 11 + 2 bits). A fused multiply-add rounded to f32 first rounds as the
 * exact value would unless the f32 result lies exactly halfway between two f16 values: then the
 * exact value, formed in f64, is rounded once. */
static float fma_h(float a, float b, float c)
{
    float r = fmaf(a, b, c);
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    uint32_t ex = (u >> 23) & 0xffu;
    /* the bits of r's significand below the f16 quantum: 13 for normal halves, more below */
    int n = ex >= 113 ? 13 : 126 - (int)ex;
    uint32_t sig = (u & 0x7fffffu) | (ex ? 0x800000u : 0u);
    if (ex != 0xffu && n <= 24 && (sig & ((1u << n) - 1u)) == 1u << (n - 1))
        return f16_round((double)a * b + c);
    return round_f16(r);
}
static float add_h(float a, float b) { return round_f16(a + b); }

#ifdef F16_NATIVE
/* The same steps in the CPU's own f16 arithmetic (AVX512-FP16), where each operation rounds once
 * as fma_h and add_h do. Q and OUT hold f16 values as floats: converting them is exact. */
#define F16_TARGET __attribute__((target("avx512fp16,avx512f,avx512bw,avx512vl,avx512dq,f16c")))

/* 32 floats at P (f16 values) as 32 f16 lanes. */
F16_TARGET static inline __m512h load32_h(const float *p)
{
    __m256i lo = _mm512_cvtps_ph(_mm512_loadu_ps(p), _MM_FROUND_TO_NEAREST_INT);
    __m256i hi = _mm512_cvtps_ph(_mm512_loadu_ps(p + 16), _MM_FROUND_TO_NEAREST_INT);
    return _mm512_castsi512_ph(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

F16_TARGET static inline void store32_h(float *p, __m512h h)
{
    __m512i b = _mm512_castph_si512(h);
    _mm512_storeu_ps(p, _mm512_cvtph_ps(_mm512_castsi512_si256(b)));
    _mm512_storeu_ps(p + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(b, 1)));
}

/* The f16 part of dot_qk over NP elements (a multiple of 128), combined in dot_qk's order. */
F16_TARGET static float dot_h_native(const float *q, const uint16_t *k, uint32_t np)
{
    __m512h a[4] = {_mm512_setzero_ph(), _mm512_setzero_ph(), _mm512_setzero_ph(), _mm512_setzero_ph()};
    for (uint32_t i = 0; i < np; i += 128)
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_fmadd_ph(_mm512_castsi512_ph(_mm512_loadu_si512(k + i + 32 * j)),
                                   load32_h(q + i + 32 * j), a[j]);
    __m512h x = _mm512_add_ph(_mm512_add_ph(a[0], a[2]), _mm512_add_ph(a[1], a[3]));
    __m512i xb = _mm512_castph_si512(x);
    __m256h t = _mm256_add_ph(_mm256_castsi256_ph(_mm512_castsi512_si256(xb)),
                              _mm256_castsi256_ph(_mm512_extracti64x4_epi64(xb, 1)));
    __m256i tb = _mm256_castph_si256(t);
    __m128h u = _mm_add_ph(_mm_castsi128_ph(_mm256_castsi256_si128(tb)),
                           _mm_castsi128_ph(_mm256_extracti128_si256(tb, 1)));
    /* lanes 0..3 + lanes 4..7, then (0 + 2) and (1 + 3), then their sum */
    u = _mm_add_ph(u, _mm_castsi128_ph(_mm_srli_si128(_mm_castph_si128(u), 8)));
    u = _mm_add_ph(u, _mm_castsi128_ph(_mm_srli_si128(_mm_castph_si128(u), 4)));
    u = _mm_add_ph(u, _mm_castsi128_ph(_mm_srli_si128(_mm_castph_si128(u), 2)));
    return (float)_mm_cvtsh_h(u);
}

F16_TARGET static void scale_h_native(float *out, float sh, uint32_t np)
{
    __m512h s = _mm512_set1_ph((_Float16)sh);
    for (uint32_t i = 0; i < np; i += 32)
        store32_h(out + i, _mm512_mul_ph(load32_h(out + i), s));
}

F16_TARGET static void mad_h_native(float *out, const uint16_t *v, float sh, uint32_t np)
{
    __m512h s = _mm512_set1_ph((_Float16)sh);
    for (uint32_t i = 0; i < np; i += 32)
        store32_h(out + i, _mm512_fmadd_ph(_mm512_castsi512_ph(_mm512_loadu_si512(v + i)), s,
                                           load32_h(out + i)));
}
#endif

/* q . k for f16 K as ggml's f16 dot product in llama.cpp's AVX-512 builds. With f16 arithmetic:
 * four 32-lane f16 accumulators over steps of 128 elements, combined pairwise and across lanes
 * in f16 as _mm512_reduce_add_ph does, the rest added in f64. Without: four 16-lane f32 fma
 * accumulators over steps of 64, combined as _mm512_reduce_add_ps does, the rest in f64.
 * Attention is where a last bit decides later roundings (the f16 sum, then q8 vectors), so the
 * order matters for matching. */
float attn_dot(int mode, const float *q, const uint16_t *k, uint32_t n)
{
    double sum = 0.0;
    uint32_t np;
#ifdef F16_NATIVE
    if (mode == F16_ARITH_NATIVE) {
        np = n & ~127u;
        if (np)
            sum = dot_h_native(q, k, np);
    } else
#endif
    if (mode != F16_ARITH_NONE) {
        float lane[4][32] = {{0}};
        np = n & ~127u;
        for (uint32_t i = 0; i < np; i += 128)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    lane[j][l] = fma_h(f16_to_f32(k[i + 32 * j + l]), q[i + 32 * j + l], lane[j][l]);
        if (np) {
            float x[32], t[16];
            for (int l = 0; l < 32; l++)
                x[l] = add_h(add_h(lane[0][l], lane[2][l]), add_h(lane[1][l], lane[3][l]));
            for (int l = 0; l < 16; l++)
                t[l] = add_h(x[l], x[l + 16]);
            for (int l = 0; l < 8; l++)
                t[l] = add_h(t[l], t[l + 8]);
            for (int l = 0; l < 4; l++)
                t[l] = add_h(t[l], t[l + 4]);
            sum = add_h(add_h(t[0], t[2]), add_h(t[1], t[3]));
        }
    } else {
        float lane[4][16] = {{0}};
        np = n & ~63u;
        for (uint32_t i = 0; i < np; i += 64)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 16; l++)
                    lane[j][l] = fmaf(f16_to_f32(k[i + 16 * j + l]), q[i + 16 * j + l], lane[j][l]);
        float x[16], t[8];
        for (int l = 0; l < 16; l++)
            x[l] = (lane[0][l] + lane[2][l]) + (lane[1][l] + lane[3][l]);
        for (int l = 0; l < 8; l++)
            t[l] = x[l] + x[l + 8];
        for (int l = 0; l < 4; l++)
            t[l] = t[l] + t[l + 4];
        sum = (t[0] + t[2]) + (t[1] + t[3]);
    }
    for (uint32_t i = np; i < n; i++)
        sum += (double)(f16_to_f32(k[i]) * q[i]);
    return (float)sum;
}

/* out = f16(out * s) and out = f16(out + v * s) over a head's N elements, V f16: as ggml's
 * ggml_vec_scale_f16 / ggml_vec_mad_f16, whose 128-element steps, with f16 arithmetic, take S
 * rounded to f16 and round the product once; the rest is computed in f32 (a fused multiply-add
 * for mad). */
void attn_scale(int mode, float *out, float s, uint32_t n)
{
    uint32_t np = mode != F16_ARITH_NONE ? n & ~127u : 0;
    float sh = round_f16(s);
    uint32_t i = 0;
#ifdef F16_NATIVE
    if (mode == F16_ARITH_NATIVE) {
        scale_h_native(out, sh, np);
        i = np;
    }
#endif
    for (; i < np; i++)
        out[i] = round_f16(out[i] * sh); /* exact in f32 */
    for (i = np; i < n; i++)
        out[i] = round_f16(out[i] * s);
}

void attn_mad(int mode, float *out, const uint16_t *v, float s, uint32_t n)
{
    uint32_t np = mode != F16_ARITH_NONE ? n & ~127u : 0;
    float sh = round_f16(s);
    uint32_t i = 0;
#ifdef F16_NATIVE
    if (mode == F16_ARITH_NATIVE) {
        mad_h_native(out, v, sh, np);
        i = np;
    }
#endif
    for (; i < np; i++)
        out[i] = fma_h(f16_to_f32(v[i]), sh, out[i]);
    for (i = np; i < n; i++)
        out[i] = round_f16(fmaf(f16_to_f32(v[i]), s, out[i]));
}


