/*
 * vecdot.c — matrix-vector products computed the way llama.cpp's CPU back end computes them
 * (ferry_matvec_q in ferry.h): the vector is first rounded to the type the weight's dot product
 * takes — q8_0 blocks for q4_0 / q8_0 weights, q8_K blocks for q4_K / q5_K / q6_K, f16 or bf16
 * precision for f16 / bf16 weights — and quantized weights then meet it in integer dot products.
 * Sums within a block are exact integers, and every kernel sums them over blocks in one order:
 * per block (a k-quant's super-block) the exact integer sum meets the f32 product of the
 * weight's and the vector's scales in one fma into a single accumulator, blocks in order (the
 * min term of q4_K and q5_K a second fma, subtracting, into the same accumulator). That is the
 * order of llama.cpp's x86 kernels for CPUs with AVX-512 VNNI and AMX-INT8 (which its native
 * builds use for q4_0, q8_0, q4_K, q5_K and q6_K weights) and of its repacked q4_0 kernel; the
 * portable and the AVX2 path give the same bits.
 *
 * The activation quantizers follow llama.cpp's x86 code: q8_0 with d = amax / 127 and
 * q = round-half-even(x * (127 / amax)); q8_K (float d, 256 int8, 16 int16 block sums) with
 * iscale = -127 / max (max: the signed element of largest magnitude), q = min(127,
 * round-half-even(iscale * x)), d = 1 / iscale.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define VD_X86 1
#include <immintrin.h>
#define VD_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

enum { Q8K_BYTES = 4 + 256 + 32 }; /* float d, int8 qs[256], int16 bsums[16] */

static int has_vec_kernel(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_F16: case FERRY_DTYPE_BF16: case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q4_0:
    case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K: case FERRY_DTYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

uint64_t ferry_matvec_vec_bytes(ferry_dtype t, uint64_t cols)
{
    uint64_t be = ferry_dtype_block_elems(t);
    if (!ferry__dtype_readable(t) || be == 0 || cols % be != 0 || cols > (UINT64_C(1) << 40))
        return 0;
    switch (t) {
    case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q4_0: return cols / 32 * 34;
    case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K: case FERRY_DTYPE_Q6_K:
        return cols / 256 * Q8K_BYTES;
    default: return cols * sizeof(float);
    }
}

/* ---- the vector's quantizers ------------------------------------------------------------------ */

static void quant_x_q8_0(const float *x, uint8_t *p, uint64_t nb)
{
    for (uint64_t b = 0; b < nb; b++, x += 32, p += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        uint16_t hd = ferry__f2h(d);
        memcpy(p, &hd, 2);
        for (int j = 0; j < 32; j++) {
            float v = nearbyintf(x[j] * id);
            p[2 + j] = (uint8_t)(int8_t)(v == v ? v : 0.0f);
        }
    }
}

static void quant_x_q8_k(const float *x, uint8_t *p, uint64_t nb)
{
    for (uint64_t b = 0; b < nb; b++, x += 256, p += Q8K_BYTES) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 256; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        int8_t *q = (int8_t *)(p + 4);
        int16_t bs[16];
        float d = 0.0f;
        if (amax == 0.0f) {
            memset(q, 0, 256);
            memset(bs, 0, sizeof bs);
        } else {
            float iscale = -127.0f / max;
            for (int j = 0; j < 256; j++) {
                float v = nearbyintf(iscale * x[j]);
                q[j] = (int8_t)(v > 127.0f ? 127 : v < -128.0f ? -128 : (int)v);
            }
            for (int g = 0; g < 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++)
                    s += q[16 * g + j];
                bs[g] = (int16_t)s;
            }
            d = 1.0f / iscale;
        }
        memcpy(p, &d, 4);
        memcpy(p + 4 + 256, bs, sizeof bs);
    }
}

int ferry_matvec_vec_quantize(ferry_dtype t, const float *x, uint64_t cols, void *out)
{
    if (!x || !out)
        return FERRY_EINVAL;
    if (!ferry__dtype_readable(t))
        return FERRY_EDTYPE;
    if (ferry_matvec_vec_bytes(t, cols) == 0 && cols != 0)
        return FERRY_ESHAPE;
    float *f = out;
    switch (t) {
    case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q4_0: quant_x_q8_0(x, out, cols / 32); break;
    case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K: case FERRY_DTYPE_Q6_K:
        quant_x_q8_k(x, out, cols / 256);
        break;
    case FERRY_DTYPE_F16:
        for (uint64_t i = 0; i < cols; i++)
            f[i] = ferry__h2f(ferry__f2h(x[i]));
        break;
    case FERRY_DTYPE_BF16:
        for (uint64_t i = 0; i < cols; i++)
            f[i] = ferry__bf2f(ferry__f2bf(x[i]));
        break;
    default: memmove(out, x, cols * sizeof *x); break;
    }
    return 0;
}

/* ---- portable kernels: one row of N elements against the prepared vector ------------------- */

typedef float (*vec_kernel)(const uint8_t *w, const uint8_t *xq, uint64_t n);

static float q8_0_generic(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++, w += 34, xq += 34) {
        const int8_t *a = (const int8_t *)(w + 2), *c = (const int8_t *)(xq + 2);
        int32_t sum = 0;
        for (int j = 0; j < 32; j++)
            sum += a[j] * c[j];
        s = fmaf((float)sum, ferry__h2f(ferry__ld16(w)) * ferry__h2f(ferry__ld16(xq)), s);
    }
    return s;
}

static float q4_0_generic(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++, w += 18, xq += 34) {
        const int8_t *c = (const int8_t *)(xq + 2);
        int32_t sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((w[2 + j] & 15) - 8) * c[j] + ((w[2 + j] >> 4) - 8) * c[j + 16];
        s = fmaf((float)sum, ferry__h2f(ferry__ld16(w)) * ferry__h2f(ferry__ld16(xq)), s);
    }
    return s;
}

static float q8k_d(const uint8_t *xq)
{
    float d;
    memcpy(&d, xq, 4);
    return d;
}

static int16_t q8k_bsum(const uint8_t *xq, int g)
{
    int16_t v;
    memcpy(&v, xq + 4 + 256 + 2 * g, 2);
    return v;
}

static float q4_k_generic(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 144, xq += Q8K_BYTES) {
        const int8_t *q8 = (const int8_t *)(xq + 4);
        const uint8_t *q4 = w + 16;
        int32_t sumi = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            ferry__k4_scale_min(w + 4, j, &sc, &m);
            summs += m * (q8k_bsum(xq, 2 * j) + q8k_bsum(xq, 2 * j + 1));
            /* sub-block j: elements 32j.., the low nibbles of bytes 32(j/2).. for even j */
            const uint8_t *qb = q4 + 32 * (j / 2);
            int shift = (j & 1) * 4, sum = 0;
            for (int l = 0; l < 32; l++)
                sum += ((qb[l] >> shift) & 15) * q8[32 * j + l];
            sumi += sc * sum;
        }
        float d = ferry__h2f(ferry__ld16(w)) * q8k_d(xq);
        float dmin = ferry__h2f(ferry__ld16(w + 2)) * q8k_d(xq);
        s = fmaf((float)sumi, d, s);
        s = fmaf(-(float)summs, dmin, s);
    }
    return s;
}

/* q5_K (176 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins as q4_K's, 32 bytes of
 * fifth bits, 128 of nibbles): element 64g + l (l < 32) is the low nibble of qs[32g + l] plus 16
 * times bit 2g of qh[l], element 64g + 32 + l the high nibble plus bit 2g + 1. */
static float q5_k_generic(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 176, xq += Q8K_BYTES) {
        const int8_t *q8 = (const int8_t *)(xq + 4);
        const uint8_t *qh = w + 16, *qs = w + 48;
        int32_t sumi = 0, summs = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            ferry__k4_scale_min(w + 4, j, &sc, &m);
            summs += m * (q8k_bsum(xq, 2 * j) + q8k_bsum(xq, 2 * j + 1));
            const uint8_t *qb = qs + 32 * (j / 2);
            int shift = (j & 1) * 4, sum = 0;
            for (int l = 0; l < 32; l++)
                sum += (((qb[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)) * q8[32 * j + l];
            sumi += sc * sum;
        }
        float dx = q8k_d(xq);
        s = fmaf((float)sumi, ferry__h2f(ferry__ld16(w)) * dx, s);
        s = fmaf(-(float)summs, ferry__h2f(ferry__ld16(w + 2)) * dx, s);
    }
    return s;
}

static float q6_k_generic(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 210, xq += Q8K_BYTES) {
        const int8_t *q8 = (const int8_t *)(xq + 4), *sc = (const int8_t *)(w + 192);
        int32_t sumi = 0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            for (int g = 0; g < 4; g++) {
                for (int half = 0; half < 2; half++) {
                    int sum = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        int lo = g & 1 ? ql[l + 32] : ql[l];
                        lo = g & 2 ? lo >> 4 : lo & 15;
                        int q = (lo | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
                        sum += q * q8[128 * h + 32 * g + l];
                    }
                    sumi += sc[8 * h + 2 * g + half] * sum;
                }
            }
        }
        s = fmaf((float)sumi, ferry__h2f(ferry__ld16(w + 208)) * q8k_d(xq), s);
    }
    return s;
}

/* ---- AVX2 kernels -------------------------------------------------------------------------- */

#ifdef VD_X86
/* The exact integer sum of the eight int32 lanes of V. */
VD_AVX2 static inline int32_t hsum_i32(__m256i v)
{
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

VD_AVX2 static float q8_0_avx2(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++, w += 34, xq += 34) {
        float d = _cvtsh_ss(ferry__ld16(w)) * _cvtsh_ss(ferry__ld16(xq));
        __m256i a = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i c = _mm256_loadu_si256((const __m256i *)(xq + 2));
        __m256i ax = _mm256_sign_epi8(a, a), sc = _mm256_sign_epi8(c, a);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sc), _mm256_set1_epi16(1));
        s = fmaf((float)hsum_i32(p), d, s);
    }
    return s;
}

/* The order of llama.cpp's repacked q4_0 kernel (q4_0_8x8, which its x86 CPU back end uses for
 * every q4_0 weight of a multiple of 8 rows): each block's exact integer sum, then one f32 fma per
 * block into a single accumulator, blocks in order. */
VD_AVX2 static float q4_0_avx2(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float s = 0.0f;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i e8 = _mm256_set1_epi8(8);
    for (uint64_t b = 0; b < n / 32; b++, w += 18, xq += 34) {
        float d = _cvtsh_ss(ferry__ld16(w)) * _cvtsh_ss(ferry__ld16(xq));
        __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
        __m256i a = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
        a = _mm256_sub_epi8(a, e8);
        __m256i c = _mm256_loadu_si256((const __m256i *)(xq + 2));
        __m256i ax = _mm256_sign_epi8(a, a), sc = _mm256_sign_epi8(c, a);
        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sc), _mm256_set1_epi16(1));
        s = fmaf((float)hsum_i32(p), d, s);
    }
    return s;
}

/* The order of llama.cpp's repacked q4_K kernel (q4_K_8x8, used on x86 for every q4_K weight of a
 * multiple of 8 rows): per super-block the exact integer sums of scaled and of min terms, each
 * meeting its f32 scale in one fma into its own accumulator. */
/* The eight 6-bit scales and then the eight 6-bit mins of a q4_K super-block's 12 packed bytes S,
 * as bytes (the GGUF layout: sub-blocks 0..3 in the low six bits of bytes 0..3 and 4..7, 4..7
 * in the nibbles of bytes 8..11 and the top two bits of bytes 0..7). */
static inline void k4_unpack(const uint8_t *s, uint8_t out[16])
{
    uint32_t u[4], r[4];
    memcpy(u, s, 12);
    r[0] = u[0] & 0x3f3f3f3fu;
    r[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    r[2] = u[1] & 0x3f3f3f3fu;
    r[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    memcpy(out, r, 16);
}

/* The q8_K block XQ's sums over each 32-element sub-block (pairs of its 16-element sums). */
VD_AVX2 static inline __m128i q8k_pairs(const uint8_t *xq)
{
    __m256i bs = _mm256_loadu_si256((const __m256i *)(xq + 4 + 256));
    return _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
}

/* One q4_K super-block at W against the q8_K block XQ (PAIRS its q8k_pairs): eight int32 lanes
 * whose sum is the exact sum of the scaled products, and the exact sum of the min terms in
 * *SUMMS. */
VD_AVX2 static inline __attribute__((always_inline)) __m256i q4_k_lanes(const uint8_t *w, const uint8_t *xq, __m128i pairs,
                                         int32_t *summs)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *q8 = xq + 4;
    uint8_t sm[16];
    k4_unpack(w + 4, sm);
    __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(sm + 8)));
    __m128i mm = _mm_madd_epi16(mins, pairs);
    mm = _mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0x4e));
    mm = _mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0xb1));
    *summs = _mm_cvtsi128_si32(mm);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        __m256i xl = _mm256_loadu_si256((const __m256i *)(q8 + 64 * c));
        __m256i xh = _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32));
        __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(sm[2 * c]));
        __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(sm[2 * c + 1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
    }
    return sumi;
}

VD_AVX2 static float q4_k_avx2(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 144, xq += Q8K_BYTES) {
        int32_t summs;
        __m256i sumi = q4_k_lanes(w, xq, q8k_pairs(xq), &summs);
        float dx = q8k_d(xq);
        acc = fmaf((float)hsum_i32(sumi), _cvtsh_ss(ferry__ld16(w)) * dx, acc);
        acc = fmaf(-(float)summs, _cvtsh_ss(ferry__ld16(w + 2)) * dx, acc);
    }
    return acc;
}

/* One q6_K super-block at W against the q8_K block XQ: eight int32 lanes whose sum is the exact
 * sum of the scaled products of (q - 32) and x. */
VD_AVX2 static inline __attribute__((always_inline)) __m256i q6_k_lanes(const uint8_t *w, const uint8_t *xq)
{
    const uint8_t *q8 = xq + 4;
    const int8_t *sc = (const int8_t *)(w + 192);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        ferry__q6k_quants_avx2(w, h, q);
        for (int g = 0; g < 4; g++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(q8 + 128 * h + 32 * g));
            __m256i p = _mm256_maddubs_epi16(q[g], x); /* q in 0..63 as unsigned bytes */
            __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * g + 1]),
                                         _mm_set1_epi16(sc[8 * h + 2 * g]));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
        }
    }
    /* (q - 32) . x = q . x - 32 * (bsum . scale) */
    __m256i bs = _mm256_loadu_si256((const __m256i *)(xq + 4 + 256));
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
    return _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
}

VD_AVX2 static float q6_k_avx2(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 210, xq += Q8K_BYTES)
        acc = fmaf((float)hsum_i32(q6_k_lanes(w, xq)), _cvtsh_ss(ferry__ld16(w + 208)) * q8k_d(xq),
                   acc);
    return acc;
}
#endif

#ifdef VD_X86
/* Eight rows at a time with AVX-512 VNNI: each row's exact integer sums of a block as vpdpbusd
 * forms them, the eight rows' sums gathered into the lanes of one vector, then one fma per block
 * into lane r's accumulator: row r gets the same bits as the one-row kernels above. */
#define VD_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

/* Lane r of the result: the sum of the eight int32 lanes of S[r]. */
VD_VNNI static inline __m256i sum8x8(const __m256i s[8])
{
    __m256i t0 = _mm256_hadd_epi32(s[0], s[1]), t1 = _mm256_hadd_epi32(s[2], s[3]);
    __m256i t2 = _mm256_hadd_epi32(s[4], s[5]), t3 = _mm256_hadd_epi32(s[6], s[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The byte offsets of eight rows RB apart (RB * 7 fits an int32: pick_rows8 checks). */
VD_VNNI static inline __m256i row_offsets(uint64_t rb)
{
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
}

/* The f16 scales at byte OFF of eight rows RB apart from W, as floats. */
VD_VNNI static inline __m256 scales8(const uint8_t *w, __m256i rows, uint64_t off)
{
    __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(w + off), rows, 1);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g));
}

/* The exact int32 sums of eight rows from four products, P[k] holding row 2k's eight partial sums
 * in its low 256 bits and row 2k + 1's in its high: lane i of the result is row PERM8[i]'s sum
 * (the order the reduction leaves them in, which the callers keep to until they store). */
static const int32_t PERM8[8] = {0, 2, 4, 6, 1, 3, 5, 7};

VD_VNNI static inline __m256i sum4x16(const __m512i p[4])
{
    /* each 128-bit lane of T0 (T1): two sums of two of its rows from P0 and P1 (P2 and P3),
     * rows 0 and 2 (4 and 6) in lanes 0 and 1, rows 1 and 3 (5 and 7) in lanes 2 and 3 */
    __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]),
                                  _mm512_unpackhi_epi32(p[0], p[1]));
    __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]),
                                  _mm512_unpackhi_epi32(p[2], p[3]));
    /* each lane: a half of each of its four rows, rows 0, 2, 4, 6 in lanes 0 and 1, rows 1, 3,
     * 5, 7 in lanes 2 and 3; then lane 0 + lane 1 and lane 2 + lane 3, side by side */
    __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
    u = _mm512_add_epi32(u, _mm512_shuffle_i64x2(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castsi512_si256(
        _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 0, 1, 4, 5), u));
}

/* Eight q8_0 rows against the q8_0 vector XQ, two rows a 512-bit product: the weights made
 * unsigned by adding 128 (what dpbusd multiplies), each lane's sum started at -128 times the sum
 * of its four x (exact in int32 either way). */
VD_VNNI static void q8_0_rows8(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                               float *y)
{
    const __m256i perm = _mm256_loadu_si256((const __m256i *)(const void *)PERM8);
    const __m256i rows = _mm256_mullo_epi32(perm, _mm256_set1_epi32((int)rb));
    const __m512i bias = _mm512_set1_epi8((char)0x80), ones = _mm512_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, xq += 34) {
        __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + 2)));
        __m512i sx = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x);
        __m512i x0 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sx, 7));
        __m512i s[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const uint8_t *p = w + 2 * k * rb + 34 * b + 2;
            _mm_prefetch((const char *)(p + 8 * rb), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 9 * rb), _MM_HINT_T1);
            __m512i a = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                _mm256_loadu_si256((const __m256i *)(p + rb)), 1);
            s[k] = _mm512_dpbusd_epi32(x0, _mm512_xor_si512(a, bias), x);
        }
        __m256 d = _mm256_mul_ps(scales8(w, rows, 34 * b), _mm256_set1_ps(_cvtsh_ss(ferry__ld16(xq))));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum4x16(s)), d, acc);
    }
    /* lane i holds row PERM8[i] */
    _mm256_storeu_ps(y, _mm256_permutevar8x32_ps(acc, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* One q4_0 block B of eight rows RB apart from W (ROWS their offsets) against the q8_0 block XQ:
 * ACC plus, in lane r, the block's exact integer sum for row r times its scale product. */
VD_VNNI static inline __attribute__((always_inline)) __m256 q4_0_block8(
    const uint8_t *w, uint64_t rb, __m256i rows, const uint8_t *xq, uint64_t b, __m256 acc)
{
    const __m256i m4 = _mm256_set1_epi8(15), nib = _mm256_setr_epi64x(0, 0, 4, 4);
    __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 2)), s[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        _mm_prefetch((const char *)(w + (8 + r) * rb + 18 * b), _MM_HINT_T1);
        /* the 16 bytes in both halves: the low nibbles (elements 0..15) below, the high
         * (16..31) above */
        __m256i q = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(w + r * rb + 18 * b + 2)));
        s[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                   _mm256_and_si256(_mm256_srlv_epi64(q, nib), m4), x);
    }
    /* (q - 8) . x = q . x - 8 * sum(x), q the unsigned nibbles: exact int32 either way */
    __m256i sx = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), x);
    __m256i sx8 = _mm256_set1_epi32(8 * hsum_i32(sx));
    __m256 d = _mm256_mul_ps(scales8(w, rows, 18 * b), _mm256_set1_ps(_cvtsh_ss(ferry__ld16(xq))));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum8x8(s), sx8)), d, acc);
}

VD_VNNI static void q4_0_rows8(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                               float *y)
{
    const __m256i rows = row_offsets(rb);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 32; b++, xq += 34)
        acc = q4_0_block8(w, rb, rows, xq, b, acc);
    _mm256_storeu_ps(y, acc);
}

/* With AVX-512 VBMI and GFNI as well (FERRY__ISA_AVX512_VBMI): q4_0, q4_K and q6_K 512 bits a
 * step, the same bits as the eight-row kernels above. */
#define VD_VBMI                                                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,"          \
                          "avx512vbmi,gfni")))

/* Each byte of Q shifted right by four (its high nibble): one GF(2) affine map, whose 8x8 bit
 * matrix takes bits 4..7 to 0..3. */
VD_VBMI static inline __m512i hi_nibbles(__m512i q)
{
    return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(0x1020408000000000LL), 0);
}

/* Within each 128-bit lane, A's and B's adjacent int32 pairs added: lanes 4k.. of the result
 * hold a0 + a1, b0 + b1, a2 + a3, b2 + b3 of lanes 4k.. of A and B (blends move what the one
 * shuffle need not). */
VD_VNNI static inline __m512i pairs_i32(__m512i a, __m512i b)
{
    __m512i x = _mm512_mask_blend_epi32(0xaaaa, a, b), y = _mm512_mask_blend_epi32(0xaaaa, b, a);
    return _mm512_add_epi32(x, _mm512_shuffle_epi32(y, _MM_PERM_CDAB));
}

/* The same with int64 halves: lanes 4k.. hold (a0, a1) + (a2, a3), (b0, b1) + (b2, b3). */
VD_VNNI static inline __m512i pairs_i64(__m512i a, __m512i b)
{
    __m512i x = _mm512_mask_blend_epi64(0xaa, a, b), y = _mm512_mask_blend_epi64(0xaa, b, a);
    return _mm512_add_epi32(x, _mm512_shuffle_epi32(y, _MM_PERM_BADC));
}

/* Lane 4k + i of the result: the sum of the int32 lanes 4k..4k+3 of S[i] (i < 4). */
VD_VNNI static inline __m512i sum4x4(const __m512i s[4])
{
    return pairs_i64(pairs_i32(s[0], s[1]), pairs_i32(s[2], s[3]));
}

/* sum4x4 for lanes in [-8192, 8192]: vpackssdw then never saturates, on the lanes nor on their
 * pairs' sums, and vpmaddwd adds the pairs that it packs side by side. */
VD_VNNI static inline __m512i sum4x4_small(const __m512i s[4])
{
    const __m512i one = _mm512_set1_epi16(1);
    __m512i a = _mm512_madd_epi16(_mm512_packs_epi32(s[0], s[1]), one);
    __m512i b = _mm512_madd_epi16(_mm512_packs_epi32(s[2], s[3]), one);
    return _mm512_madd_epi16(_mm512_packs_epi32(a, b), one);
}

/* Lane i of the result: the sum of the sixteen int32 lanes of S[i]. */
VD_VBMI static inline __m256i sum16x8(const __m512i s[8])
{
    /* lane 4k + i of U0 (U1): a quarter of row i's (4 + i's) sum */
    __m512i u0 = sum4x4(s), u1 = sum4x4(s + 4);
    __m512i c = _mm512_add_epi32(_mm512_shuffle_i64x2(u0, u1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_i64x2(u0, u1, _MM_SHUFFLE(3, 2, 3, 2)));
    c = _mm512_shuffle_i64x2(c, c, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_epi32(_mm512_castsi512_si256(c), _mm512_extracti64x4_epi64(c, 1));
}

/* vpermb / vpermt2b indices of q4_0_rows8_vbmi, all byte offsets from the start of the data they
 * permute (a row's 72 bytes of four blocks, x's 136). NIB: the nibble bytes of block k (18k +
 * 2..) into bytes 16k.. (bytes 56..63 are then replaced by 64..71, which a 64-byte load lacks).
 * XLO, XHI: x's elements 0..15 and 16..31 of block k (34k + 2.., 34k + 18..; XHI from x's bytes
 * 16.. and 72..) into bytes 16k... XD: x's f16 scale of block k (34k) into words 8k..8k+7. */
static const uint8_t q4_0_nib[64] = {
    2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17,
    20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
    38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
    56, 57, 58, 59, 60, 61, 62, 63, 0,  0,  0,  0,  0,  0,  0,  0};
static const uint8_t q4_0_xlo[64] = {
    2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,  16,  17,
    36,  37,  38,  39,  40,  41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51,
    70,  71,  72,  73,  74,  75,  76,  77,  78,  79,  80,  81,  82,  83,  84,  85,
    104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119};
static const uint8_t q4_0_xhi[64] = {
    2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,  16,  17,
    36,  37,  38,  39,  40,  41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51,
    78,  79,  80,  81,  82,  83,  84,  85,  86,  87,  88,  89,  90,  91,  92,  93,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127};
static const uint8_t q4_0_xd[64] = {
    0,   1,   0,   1,   0,   1,   0,   1,   0,   1,   0,   1,   0,   1,   0,   1,
    34,  35,  34,  35,  34,  35,  34,  35,  34,  35,  34,  35,  34,  35,  34,  35,
    68,  69,  68,  69,  68,  69,  68,  69,  68,  69,  68,  69,  68,  69,  68,  69,
    102, 103, 102, 103, 102, 103, 102, 103, 102, 103, 102, 103, 102, 103, 102, 103};

/* The q8_0 vector as q4_0_rows8_vbmi takes it, for each step of four blocks: its low and high
 * halves in the order of the unpacked nibbles, -8 * its sums (where each row's sums start), and
 * its four scales as floats, each in eight lanes (blocks 0 and 1 in D01, 2 and 3 in D23). */
typedef struct q4_0_xstep {
    __m512i lo, hi, c8;
    __m512 d01, d23;
} q4_0_xstep;

VD_VBMI static inline q4_0_xstep q4_0_x4(const uint8_t *xq)
{
    const __m512i ixlo = _mm512_loadu_si512(q4_0_xlo), ixhi = _mm512_loadu_si512(q4_0_xhi);
    const __m512i ixd = _mm512_loadu_si512(q4_0_xd), one = _mm512_set1_epi8(1);
    q4_0_xstep v;
    __m512i x0 = _mm512_loadu_si512(xq), x1 = _mm512_loadu_si512(xq + 64);
    v.lo = _mm512_permutex2var_epi8(x0, ixlo, x1);
    v.hi = _mm512_permutex2var_epi8(_mm512_loadu_si512(xq + 16), ixhi,
                                    _mm512_loadu_si512(xq + 72));
    __m512i d = _mm512_permutex2var_epi8(x0, ixd, x1);
    v.d01 = _mm512_cvtph_ps(_mm512_castsi512_si256(d));
    v.d23 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(d, 1));
    /* (q - 8) . x = q . x - 8 * sum(x): each row's sums start from -8 * x's, spread over the
     * four lanes that the reduction adds */
    __m512i sx = _mm512_dpbusd_epi32(_mm512_setzero_si512(), one, v.lo);
    sx = _mm512_dpbusd_epi32(sx, one, v.hi);
    v.c8 = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sx, 3));
    return v;
}

/* The steps of four blocks of the N-element vector XQ into XS (N / 128 of them), once for all
 * the row groups of a product. */
VD_VBMI static void q4_0_prepare_x(const uint8_t *xq, uint64_t n, q4_0_xstep *xs)
{
    for (uint64_t i = 0; i < n / 128; i++)
        xs[i] = q4_0_x4(xq + i * 4 * 34);
}

/* Four q4_0 blocks of eight rows a step. Each row's 72 bytes come in with one 64-byte load and
 * one 8-byte broadcast; vpermb moves the four blocks' nibble bytes together, and x is permuted
 * to match (q4_0_x4): bytes 16k.. pair block k's low nibbles with its elements 0..15 and its
 * high nibbles (shifted down by a GF(2) affine map) with 16..31. So one pair of vpdpbusd forms
 * four blocks' sums of a row, four int32 lanes per block, and sum4x4_small reduces four rows
 * at once. Blocks past the last multiple of four go through q4_0_block8. XS: the vector's steps
 * from q4_0_prepare_x, or NULL to form them here. */
VD_VBMI static void q4_0_rows8_vbmi_x(const uint8_t *w, uint64_t rb, const uint8_t *xq,
                                      uint64_t n, float *y, const q4_0_xstep *xs)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i top8 = _mm512_setr_epi64(0, 0, 0, 0, 0, 0, 0, -1);
    const __m512i nib = _mm512_loadu_si512(q4_0_nib);
    /* the scales' offsets: lane i, row i % 8's block i / 8 (of two) */
    const __m512i sc01 = _mm512_add_epi32(
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                           _mm512_set1_epi32((int)rb)),
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 18, 18, 18, 18, 18, 18, 18, 18));
    const __m512i sc23 = _mm512_add_epi32(sc01, _mm512_set1_epi32(36));
    /* the low words of two vectors of int32 */
    const __m512i low16 = _mm512_setr_epi64(
        0x0006000400020000, 0x000e000c000a0008, 0x0016001400120010, 0x001e001c001a0018,
        0x0026002400220020, 0x002e002c002a0028, 0x0036003400320030, 0x003e003c003a0038);
    const __m512i blk01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i blk23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const uint64_t nb = n / 32;
    __m256 acc = _mm256_setzero_ps();
    uint64_t b = 0;
    for (; b + 4 <= nb; b += 4, xq += 4 * 34) {
        const q4_0_xstep v = xs ? xs[b / 4] : q4_0_x4(xq);
        const __m512i xlo = v.lo, xhi = v.hi, c8 = v.c8;
        __m512i s[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint8_t *p = w + r * rb + 18 * b;
            _mm_prefetch((const char *)(p + 8 * rb), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 64), _MM_HINT_T1);
            uint64_t last;
            memcpy(&last, p + 64, 8);
            __m512i q = _mm512_permutexvar_epi8(nib, _mm512_loadu_si512(p));
            /* top8 ? last : q, a blend that the compiler does not turn into a (slower) masked
             * load */
            q = _mm512_ternarylogic_epi64(top8, _mm512_set1_epi64((long long)last), q, 0xca);
            s[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c8, _mm512_and_si512(q, m4), xlo),
                                       hi_nibbles(q), xhi);
        }
        /* lane 4k + i: block k's sum of row i (U0) and of row 4 + i (U1); then block k's eight
         * rows in the 256-bit half k % 2 of V01 (k < 2) or V23. Each lane of S sums eight
         * (q - 8) * x, q - 8 in [-8, 7] and x in [-128, 127]. */
        __m512i u0 = sum4x4_small(s), u1 = sum4x4_small(s + 4);
        __m512 v01 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi64(u0, blk01, u1));
        __m512 v23 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi64(u0, blk23, u1));
        /* the scale products in the same places */
        __m512i g01 = _mm512_i32gather_epi32(sc01, (const void *)(w + 18 * b), 1);
        __m512i g23 = _mm512_i32gather_epi32(sc23, (const void *)(w + 18 * b), 1);
        __m512i wd = _mm512_permutex2var_epi16(g01, low16, g23);
        __m512 d01 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(wd)), v.d01);
        __m512 d23 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(wd, 1)), v.d23);
        acc = _mm256_fmadd_ps(_mm512_castps512_ps256(v01), _mm512_castps512_ps256(d01), acc);
        acc = _mm256_fmadd_ps(_mm512_extractf32x8_ps(v01, 1), _mm512_extractf32x8_ps(d01, 1), acc);
        acc = _mm256_fmadd_ps(_mm512_castps512_ps256(v23), _mm512_castps512_ps256(d23), acc);
        acc = _mm256_fmadd_ps(_mm512_extractf32x8_ps(v23, 1), _mm512_extractf32x8_ps(d23, 1), acc);
    }
    const __m256i rows = row_offsets(rb);
    for (; b < nb; b++, xq += 34)
        acc = q4_0_block8(w, rb, rows, xq, b, acc);
    _mm256_storeu_ps(y, acc);
}

VD_VBMI static void q4_0_rows8_vbmi(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                                    float *y)
{
    q4_0_rows8_vbmi_x(w, rb, xq, n, y, NULL);
}

/* The rows of a q4_0 product in groups of eight, the vector's steps formed once on
 * the stack (rows of up to Q4_0_XSTEPS_MAX * 128 elements); returns the rows done. */
#define Q4_0_XSTEPS_MAX 128
VD_VBMI static uint64_t q4_0_rows_vbmi(const uint8_t *w, uint64_t rb, uint64_t rows,
                                       const uint8_t *xq, uint64_t n, float *y)
{
    if (rows < 8 || n / 128 > Q4_0_XSTEPS_MAX)
        return 0;
    q4_0_xstep xs[Q4_0_XSTEPS_MAX];
    q4_0_prepare_x(xq, n, xs);
    uint64_t r = 0;
    for (; r + 8 <= rows; r += 8)
        q4_0_rows8_vbmi_x(w + r * rb, rb, xq, n, y + r, xs);
    return r;
}

VD_VNNI static void q4_k_rows8(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                               float *y)
{
    const __m256i rows = row_offsets(rb);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, xq += Q8K_BYTES) {
        __m256i s[8];
        int32_t mins[8];
        __m128i pairs = q8k_pairs(xq);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            _mm_prefetch((const char *)(w + (8 + r) * rb + 144 * b), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (8 + r) * rb + 144 * b + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (8 + r) * rb + 144 * b + 128), _MM_HINT_T1);
            s[r] = q4_k_lanes(w + r * rb + 144 * b, xq, pairs, &mins[r]);
        }
        /* d and dmin, the first four bytes of each row's block */
        __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(w + 144 * b), rows, 1);
        __m256 dx = _mm256_set1_ps(q8k_d(xq));
        __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)), dx);
        __m256 dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16))), dx);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum8x8(s)), d, acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)mins)), dmin, acc);
    }
    _mm256_storeu_ps(y, acc);
}

VD_VNNI static void q6_k_rows8(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                               float *y)
{
    const __m256i rows = row_offsets(rb);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, xq += Q8K_BYTES) {
        __m256i s[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            _mm_prefetch((const char *)(w + (8 + r) * rb + 210 * b), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (8 + r) * rb + 210 * b + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (8 + r) * rb + 210 * b + 128), _MM_HINT_T1);
            _mm_prefetch((const char *)(w + (8 + r) * rb + 210 * b + 192), _MM_HINT_T1);
            s[r] = q6_k_lanes(w + r * rb + 210 * b, xq);
        }
        /* d, the last two bytes of each row's block (read as the high half of bytes 206..209) */
        __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(w + 210 * b + 206), rows, 1);
        __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16))),
                                 _mm256_set1_ps(q8k_d(xq)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum8x8(s)), d, acc);
    }
    _mm256_storeu_ps(y, acc);
}

/* vpermb index of q4_k_rows8_vbmi: bytes 2i, 2i + 1 of the lower and of the upper 32 bytes to
 * bytes 4i.. and 4i + 2.. */
static const uint8_t k4_ilv[64] = {
    0,  1,  32, 33, 2,  3,  34, 35, 4,  5,  36, 37, 6,  7,  38, 39,
    8,  9,  40, 41, 10, 11, 42, 43, 12, 13, 44, 45, 14, 15, 46, 47,
    16, 17, 48, 49, 18, 19, 50, 51, 20, 21, 52, 53, 22, 23, 54, 55,
    24, 25, 56, 57, 26, 27, 58, 59, 28, 29, 60, 61, 30, 31, 62, 63};

/* x's elements 32A..32A + 31 and 32B..32B + 31 interleaved as k4_ilv interleaves. */
VD_VBMI static inline __m512i k4_x_pair(const int8_t *x, int a, int b, __m512i ilv)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)(x + 32 * a));
    __m256i hi = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
    return _mm512_permutexvar_epi8(ilv, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
}

/* k4_unpack for four rows RB apart from S (their 12 bytes of packed scales and mins), row j in
 * the 128-bit lane j: bytes 0..7 the scales, 8..15 the mins. */
VD_VBMI static inline __m512i k4_sm_lanes(const uint8_t *s, uint64_t rb)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)s));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s + rb)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s + 2 * rb)), 2);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(s + 3 * rb)), 3);
    /* dwords u0, u1, u2 of each lane: r0 = u0 & 0x3f.., r2 = u1 & 0x3f.. (scales and mins 0..3);
     * r1, r3 (4..7): the nibbles of u2 (low, high) with the top two bits of u0, u1 above */
    __m512i lo = _mm512_and_si512(v, _mm512_set1_epi8(0x3f));
    __m512i u22 = _mm512_srlv_epi32(_mm512_shuffle_epi32(v, _MM_PERM_CCCC),
                                    _mm512_setr4_epi32(0, 4, 0, 4)); /* dwords 0, 1: u2, u2 >> 4 */
    __m512i top = _mm512_and_si512(_mm512_srli_epi32(v, 2), _mm512_set1_epi8(0x30));
    /* (u22 & 0x0f..) | top */
    __m512i hi = _mm512_ternarylogic_epi32(u22, _mm512_set1_epi8(0x0f), top, 0xea);
    return _mm512_unpacklo_epi32(lo, hi);
}

/* q4_K, one super-block of eight rows a step. A 64-byte load holds two 32-byte chunks of nibbles
 * (chunk c: sub-block 2c in the low nibbles, 2c + 1 in the high). vpermb interleaves the two
 * chunks in 2-byte units, and x likewise, so each int32 lane of vpdpwssd meets one int16 that
 * vpmaddubsw formed from sub-block j and one from sub-block j + 2: the two scales, broadcast as
 * an int16 pair, weigh both in one instruction. The eight rows' min terms take two vpdpwssd
 * against x's 32-element sums. */
VD_VBMI static void q4_k_rows8_vbmi(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                                    float *y)
{
    const __m256i rows = row_offsets(rb);
    const __m512i m4 = _mm512_set1_epi8(15), ilv = _mm512_loadu_si512(k4_ilv);
    /* lanes 0, 4, 8, 12 of two vectors */
    const __m512i lane0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, xq += Q8K_BYTES) {
        const int8_t *x = (const int8_t *)(xq + 4);
        /* sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) */
        __m512i x02 = k4_x_pair(x, 0, 2, ilv), x13 = k4_x_pair(x, 1, 3, ilv);
        __m512i x46 = k4_x_pair(x, 4, 6, ilv), x57 = k4_x_pair(x, 5, 7, ilv);
        /* the scales and mins of rows 4i..4i + 3, one row a 128-bit lane (k4_sm_lanes); the
         * scales as int16 pairs (0, 2), (4, 6) in SP[i][0] and (1, 3), (5, 7) in SP[i][1], row
         * 4i + j's at dwords 4j, 4j + 1 */
        __m512i sm[2];
        uint32_t sp[2][2][16];
        for (int i = 0; i < 2; i++) {
            sm[i] = k4_sm_lanes(w + 4 * i * rb + 144 * b + 4, rb);
            _mm512_storeu_si512(sp[i][0], _mm512_and_si512(sm[i], _mm512_set1_epi32(0x00ff00ff)));
            _mm512_storeu_si512(sp[i][1], _mm512_and_si512(_mm512_srli_epi32(sm[i], 8),
                                                           _mm512_set1_epi32(0x00ff00ff)));
        }
        __m512i s[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint8_t *p = w + r * rb + 144 * b;
            _mm_prefetch((const char *)(p + 8 * rb), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 128), _MM_HINT_T1);
            __m512i qa = _mm512_permutexvar_epi8(ilv, _mm512_loadu_si512(p + 16));
            __m512i qb = _mm512_permutexvar_epi8(ilv, _mm512_loadu_si512(p + 80));
            const uint32_t *s02 = sp[r / 4][0] + 4 * (r % 4), *s13 = sp[r / 4][1] + 4 * (r % 4);
            __m512i v = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                            _mm512_maddubs_epi16(_mm512_and_si512(qa, m4), x02),
                                            _mm512_set1_epi32((int)s02[0]));
            v = _mm512_dpwssd_epi32(v, _mm512_maddubs_epi16(hi_nibbles(qa), x13),
                                    _mm512_set1_epi32((int)s13[0]));
            v = _mm512_dpwssd_epi32(v, _mm512_maddubs_epi16(_mm512_and_si512(qb, m4), x46),
                                    _mm512_set1_epi32((int)s02[1]));
            s[r] = _mm512_dpwssd_epi32(v, _mm512_maddubs_epi16(hi_nibbles(qb), x57),
                                       _mm512_set1_epi32((int)s13[1]));
        }
        __m256i sumi = sum16x8(s);
        /* the min terms: row i's eight mins (int16) against the eight 32-element sums of x */
        const __m512i zero = _mm512_setzero_si512();
        __m512i pairs = _mm512_broadcast_i32x4(q8k_pairs(xq));
        __m512i m03 = _mm512_dpwssd_epi32(zero, _mm512_unpackhi_epi8(sm[0], zero), pairs);
        __m512i m47 = _mm512_dpwssd_epi32(zero, _mm512_unpackhi_epi8(sm[1], zero), pairs);
        m03 = _mm512_add_epi32(m03, _mm512_shuffle_epi32(m03, _MM_PERM_BADC));
        m03 = _mm512_add_epi32(m03, _mm512_shuffle_epi32(m03, _MM_PERM_CDAB));
        m47 = _mm512_add_epi32(m47, _mm512_shuffle_epi32(m47, _MM_PERM_BADC));
        m47 = _mm512_add_epi32(m47, _mm512_shuffle_epi32(m47, _MM_PERM_CDAB));
        __m256i summs = _mm512_castsi512_si256(_mm512_permutex2var_epi32(m03, lane0, m47));
        /* d and dmin, the first four bytes of each row's block */
        __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(w + 144 * b), rows, 1);
        __m256 dx = _mm256_set1_ps(q8k_d(xq));
        __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)), dx);
        __m128i gmin = _mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16));
        __m256 dmin = _mm256_mul_ps(_mm256_cvtph_ps(gmin), dx);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summs), dmin, acc);
    }
    _mm256_storeu_ps(y, acc);
}

/* q6_K, one super-block of eight rows a step. Each 512-bit step takes 64 elements in their own
 * order (four groups of 16, group k in the 128-bit lane k): ql's nibbles with qh's two bits
 * rotated into place above them. x enters vpdpbusd with -32 times its sums as the start, so each
 * int32 lane holds (q - 32) . x of four elements, which fits an int16, and vpdpwssd weighs the
 * lanes by their group's scale (an int16 in the low half of each int32, the high half zero). */
VD_VBMI static void q6_k_rows8_vbmi(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                                    float *y)
{
    const __m256i rows = row_offsets(rb);
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i one = _mm512_set1_epi8(1);
    /* qh's bits 2g, 2g + 1 to bits 4, 5: rotations of each 64 bits, g = 0, 1 (below) and 2, 3 */
    const __m512i rot01 = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
    const __m512i rot23 = _mm512_setr_epi64(0, 0, 0, 0, 62, 62, 62, 62);
    __m512i grp[4];
    for (int t = 0; t < 4; t++)
        grp[t] = _mm512_setr_epi32(4 * t, 4 * t, 4 * t, 4 * t, 4 * t + 1, 4 * t + 1, 4 * t + 1,
                                   4 * t + 1, 4 * t + 2, 4 * t + 2, 4 * t + 2, 4 * t + 2,
                                   4 * t + 3, 4 * t + 3, 4 * t + 3, 4 * t + 3);
    __m256 acc = _mm256_setzero_ps();
    for (uint64_t b = 0; b < n / 256; b++, xq += Q8K_BYTES) {
        __m512i x[4], x32[4];
        for (int t = 0; t < 4; t++) {
            x[t] = _mm512_loadu_si512(xq + 4 + 64 * t);
            x32[t] = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), one, x[t]), 5);
            x32[t] = _mm512_sub_epi32(_mm512_setzero_si512(), x32[t]);
        }
        __m512i s[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint8_t *p = w + r * rb + 210 * b;
            _mm_prefetch((const char *)(p + 8 * rb), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 128), _MM_HINT_T1);
            _mm_prefetch((const char *)(p + 8 * rb + 192), _MM_HINT_T1);
            __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 192)));
            sc = _mm512_and_si512(sc, _mm512_set1_epi32(0xffff));
            __m512i v = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i l = _mm512_loadu_si512(p + 64 * h);
                __m512i qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)));
                /* elements 128h.. (groups 8h..8h + 3) and 128h + 64.. */
                __m512i q0 = _mm512_ternarylogic_epi64(_mm512_rolv_epi64(qh, rot01), m30,
                                                       _mm512_and_si512(l, m4), 0xea);
                __m512i q1 = _mm512_ternarylogic_epi64(_mm512_rolv_epi64(qh, rot23), m30,
                                                       hi_nibbles(l), 0xea);
                v = _mm512_dpwssd_epi32(v, _mm512_dpbusd_epi32(x32[2 * h], q0, x[2 * h]),
                                        _mm512_permutexvar_epi32(grp[2 * h], sc));
                v = _mm512_dpwssd_epi32(v, _mm512_dpbusd_epi32(x32[2 * h + 1], q1, x[2 * h + 1]),
                                        _mm512_permutexvar_epi32(grp[2 * h + 1], sc));
            }
            s[r] = v;
        }
        /* d, the last two bytes of each row's block (read as the high half of bytes 206..209) */
        __m256i g = _mm256_i32gather_epi32((const int *)(const void *)(w + 210 * b + 206), rows, 1);
        __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16))),
                                 _mm256_set1_ps(q8k_d(xq)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum16x8(s)), d, acc);
    }
    _mm256_storeu_ps(y, acc);
}

/* ---- several vectors at once (ferry_matvec_q_n), with AVX-512 VNNI -------------------------- */

/* Four rows of q8_0 or q4_0 against up to sixteen vectors, four vectors to a 512-bit register
 * (vector k of four in the 128-bit lane k). Each row's block is unpacked once into 32 unsigned
 * bytes, its first and its last 16 each broadcast to a whole register, and meets each four
 * vectors in two vpdpbusd, against their elements 0..15 and 16..31: lane 4k + j then holds eight
 * products of vector k. The four lanes of a vector, plus minus the offset's share (q8_0: the
 * byte a + 128 for the weight a, so 128 * sum(x); q4_0: the nibble q, so 8 * sum(x)), add up to
 * the block's exact integer sum for that row and vector, which meets the scale product in the
 * fma of ferry_matvec_q, blocks in order: every row and vector gets the bits of the one-vector
 * kernels. */
enum { MULTI_QUADS = 4, MULTI_CHUNK = 32 }; /* vectors four to a step; blocks prepared at a time */

/* One block of four vectors as multi_rows4 takes it, vector k in the 128-bit lane k: their
 * elements 0..15 (LO) and 16..31 (HI) as int8, and in the four lanes of each vector minus the
 * offset's share of its sum (C) and its scale (D). */
typedef struct multi_x {
    __m512i lo, hi, c;
    __m512 d;
} multi_x;

/* Blocks B0..B0 + NB of the NV prepared vectors XQ (STRIDE bytes apart) into XS[b][quad] (at
 * b * MULTI_QUADS + quad); OFF is the weights' offset (128 or 8). A last quad of fewer than four
 * vectors repeats its last one. */
VD_VNNI static void multi_prepare(const uint8_t *xq, uint64_t stride, int nv, uint64_t b0,
                                  uint64_t nb, int off, multi_x *xs)
{
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (uint64_t b = 0; b < nb; b++) {
        for (int g = 0; g < (nv + 3) / 4; g++) {
            __m512i lo = _mm512_setzero_si512(), hi = lo;
            uint16_t h[8] = {0};
            for (int k = 0; k < 4; k++) {
                int v = 4 * g + k < nv ? 4 * g + k : nv - 1;
                const uint8_t *p = xq + (uint64_t)v * stride + 34 * (b0 + b);
                __mmask16 lane = (__mmask16)(0xfu << (4 * k));
                __m128i l = _mm_loadu_si128((const __m128i *)(p + 2));
                __m128i u = _mm_loadu_si128((const __m128i *)(p + 18));
                lo = _mm512_mask_broadcast_i32x4(lo, lane, l);
                hi = _mm512_mask_broadcast_i32x4(hi, lane, u);
                h[k] = ferry__ld16(p);
            }
            multi_x *m = &xs[b * MULTI_QUADS + (uint64_t)g];
            m->lo = lo;
            m->hi = hi;
            /* each vector's sum in its four lanes */
            __m512i sx = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), one, lo),
                                             one, hi);
            sx = _mm512_add_epi32(sx, _mm512_shuffle_epi32(sx, _MM_PERM_BADC));
            sx = _mm512_add_epi32(sx, _mm512_shuffle_epi32(sx, _MM_PERM_CDAB));
            m->c = _mm512_mullo_epi32(sx, _mm512_set1_epi32(-off));
            __m128 d4 = _mm_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h));
            m->d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
        }
    }
}

/* Blocks B0..B0 + NB of four rows RB apart from W (Q4: q4_0, else q8_0) against NQ quads of
 * vectors XS (multi_prepare's), into ACC[g]: lane 4k + i row i's sum for vector 4g + k. */
VD_VNNI static inline __attribute__((always_inline)) void
multi_rows4(const uint8_t *w, uint64_t rb, const multi_x *xs, uint64_t b0, uint64_t nb,
            const int q4, const int nq, __m512 acc[MULTI_QUADS])
{
    const uint64_t bs = q4 ? 18 : 34;
    const __m128i rows = _mm_mullo_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32((int)rb));
    const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    __m512 a[MULTI_QUADS]; /* ACC in registers: XS's loads may alias it */
    for (int g = 0; g < nq; g++)
        a[g] = acc[g];
    for (uint64_t b = 0; b < nb; b++) {
        const uint64_t off = bs * (b0 + b);
        __m512i wl[4], wh[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *p = w + r * rb + off;
            _mm_prefetch((const char *)(p + 4 * rb), _MM_HINT_T1);
            __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 2)));
            if (q4) { /* low nibbles: elements 0..15; high: 16..31 */
                wl[r] = _mm512_and_si512(v, m4);
                wh[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            } else {
                wl[r] = _mm512_xor_si512(v, flip);
                wh[r] = _mm512_xor_si512(
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 18))), flip);
            }
        }
        /* the four rows' scales, row i in lane 4k + i */
        __m128i g4 = _mm_i32gather_epi32((const int *)(const void *)(w + off), rows, 1);
        __m512 dw = _mm512_broadcast_f32x4(_mm_cvtph_ps(_mm_packus_epi32(
            _mm_and_si128(g4, _mm_set1_epi32(0xffff)), _mm_setzero_si128())));
#pragma GCC unroll 4
        for (int g = 0; g < nq; g++) {
            const multi_x *m = &xs[b * MULTI_QUADS + (uint64_t)g];
            __m512i s[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                s[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl[r], m->lo);
                s[r] = _mm512_dpbusd_epi32(s[r], wh[r], m->hi);
            }
            /* lane 4k + i: row i's sum for vector k. q4_0's lanes, eight products of a nibble
             * and an int8 each, lie in [-15360, 15360]: their pairs' sums fit an int16, so
             * sum4x4_small's packs do not saturate */
            __m512i u = _mm512_add_epi32(q4 ? sum4x4_small(s) : sum4x4(s), m->c);
            a[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), _mm512_mul_ps(dw, m->d), a[g]);
        }
    }
    for (int g = 0; g < nq; g++)
        acc[g] = a[g];
}

/* multi_rows4 with Q4 and NQ (1..MULTI_QUADS) as constants. */
VD_VNNI static void multi_group(const uint8_t *w, uint64_t rb, const multi_x *xs, uint64_t b0,
                                uint64_t nb, int q4, int nq, __m512 acc[MULTI_QUADS])
{
#define MULTI_CASE(Q, G)                                                                           \
    case 2 * (G) + (Q): multi_rows4(w, rb, xs, b0, nb, (Q), (G), acc); break;
    switch (2 * nq + q4) {
        MULTI_CASE(0, 1) MULTI_CASE(1, 1) MULTI_CASE(0, 2) MULTI_CASE(1, 2)
        MULTI_CASE(0, 3) MULTI_CASE(1, 3) MULTI_CASE(0, 4) MULTI_CASE(1, 4)
    default: break;
    }
#undef MULTI_CASE
}

/* ferry_matvec_q_n's rows in groups of four for q8_0 or q4_0 (Q4) weights of N elements, RB
 * bytes a row: vectors sixteen at a time, blocks MULTI_CHUNK at a time, each row's accumulators
 * kept in Y between chunks. Returns the rows done (ROWS rounded down to a multiple of 4). */
VD_VNNI static uint64_t multi_rows(int q4, const uint8_t *w, uint64_t rb, uint64_t rows,
                                   uint64_t n, const uint8_t *xq, uint64_t xq_stride,
                                   uint64_t nvec, float *y, uint64_t y_stride)
{
    const uint64_t nb = n / 32, groups = rows / 4;
    multi_x xs[MULTI_CHUNK * MULTI_QUADS];
    for (uint64_t v0 = 0; v0 < nvec; v0 += 4 * MULTI_QUADS) {
        const int nv = (int)(nvec - v0 < 4 * MULTI_QUADS ? nvec - v0 : 4 * MULTI_QUADS);
        const int nq = (nv + 3) / 4;
        const uint8_t *xv = xq + v0 * xq_stride;
        float *yv = y + v0 * y_stride;
        for (uint64_t b0 = 0; b0 < nb; b0 += MULTI_CHUNK) {
            const uint64_t cb = nb - b0 < MULTI_CHUNK ? nb - b0 : MULTI_CHUNK;
            multi_prepare(xv, xq_stride, nv, b0, cb, q4 ? 8 : 128, xs);
            for (uint64_t r0 = 0; r0 < 4 * groups; r0 += 4) {
                __m512 acc[MULTI_QUADS];
                for (int g = 0; g < MULTI_QUADS; g++) /* all: gcc 13 cannot see that nq suffice */
                    acc[g] = _mm512_setzero_ps();
                for (int g = 0; g < nq; g++) {
                    for (int k = 0; k < 4 && b0 > 0; k++) {
                        int v = 4 * g + k < nv ? 4 * g + k : nv - 1;
                        acc[g] = _mm512_mask_broadcast_f32x4(
                            acc[g], (__mmask16)(0xfu << (4 * k)),
                            _mm_loadu_ps(yv + (uint64_t)v * y_stride + r0));
                    }
                }
                multi_group(w + r0 * rb, rb, xs, b0, cb, q4, nq, acc);
                for (int g = 0; g < nq; g++) {
                    __m512 t = acc[g];
                    float *y0 = yv + (uint64_t)(4 * g) * y_stride + r0;
                    _mm_storeu_ps(y0, _mm512_castps512_ps128(t));
                    if (4 * g + 1 < nv)
                        _mm_storeu_ps(y0 + y_stride, _mm512_extractf32x4_ps(t, 1));
                    if (4 * g + 2 < nv)
                        _mm_storeu_ps(y0 + 2 * y_stride, _mm512_extractf32x4_ps(t, 2));
                    if (4 * g + 3 < nv)
                        _mm_storeu_ps(y0 + 3 * y_stride, _mm512_extractf32x4_ps(t, 3));
                }
            }
        }
    }
    return 4 * groups;
}

/* ---- several vectors at once (ferry_matvec_q_n), with AVX2 ----------------------------------- */

/* Four rows of q8_0 or q4_0 against up to eight vectors, two to a 256-bit register (vector k of
 * two in the 128-bit lane k). Each row's block is unpacked once (q8_0: the int8 a and |a|; q4_0:
 * the nibbles q, 0..15) and meets each vector's 32 int8 in one vpmaddubsw: q8_0 as |a| times x
 * with a's sign (then widened to int32 by vpmaddwd), q4_0 as q times x, whose sum less 8 * sum(x)
 * is the sum of (q - 8) x. Eight such registers of sums, four rows of two vectors, reduce to one
 * whose lane 4k + i holds the block's exact integer sum for row i and vector k, which meets the
 * scale product in the fma of ferry_matvec_q, blocks in order: every row and vector gets the bits
 * of the AVX2 one-vector kernels. */
enum { AVX2_PAIRS = 4, AVX2_GROUP = 32 }; /* pairs of vectors a step; vectors prepared at a time */

/* One block of a pair of vectors as avx2_rows4 takes it, vector k in the 128-bit lane k: each
 * vector's scale (D) and, for q4_0, minus 8 times the sum of its elements (C). */
typedef struct avx2_x {
    __m256 d;
    __m256i c;
} avx2_x;

/* Blocks B0..B0 + NB of the NV prepared vectors at XP[0..NV-1] into XS[b][pair] (at
 * b * AVX2_GROUP / 2 + pair). A last pair of one vector repeats it. */
VD_AVX2 static void avx2_prepare(const uint8_t *const *xp, int nv, uint64_t b0, uint64_t nb,
                                 avx2_x *xs)
{
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    for (uint64_t b = 0; b < nb; b++) {
        for (int g = 0; g < (nv + 1) / 2; g++) {
            const uint8_t *p0 = xp[2 * g] + 34 * (b0 + b);
            const uint8_t *p1 = xp[2 * g + 1 < nv ? 2 * g + 1 : 2 * g] + 34 * (b0 + b);
            avx2_x *m = &xs[b * (AVX2_GROUP / 2) + (uint64_t)g];
            m->d = _mm256_set_m128(_mm_set1_ps(_cvtsh_ss(ferry__ld16(p1))),
                                   _mm_set1_ps(_cvtsh_ss(ferry__ld16(p0))));
            __m256i s0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(one8, _mm256_loadu_si256((const __m256i *)(p0 + 2))), one16);
            __m256i s1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(one8, _mm256_loadu_si256((const __m256i *)(p1 + 2))), one16);
            m->c = _mm256_set_m128i(_mm_set1_epi32(-8 * hsum_i32(s1)),
                                    _mm_set1_epi32(-8 * hsum_i32(s0)));
        }
    }
}

/* The exact sums of the eight int32 lanes of each of S[0..7], S[j] in lane j. */
VD_AVX2 static inline __m256i sum8x8_avx2(const __m256i s[8])
{
    __m256i t0 = _mm256_hadd_epi32(s[0], s[1]), t1 = _mm256_hadd_epi32(s[2], s[3]);
    __m256i t2 = _mm256_hadd_epi32(s[4], s[5]), t3 = _mm256_hadd_epi32(s[6], s[7]);
    __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_blend_epi32(u0, u1, 0xf0),
                            _mm256_permute2x128_si256(u0, u1, 0x21));
}

/* The sums of the sixteen int16 lanes of each of S[0..7], S[j] in the int32 lane j; each
 * eight-lane half of an S must sum into an int16. */
VD_AVX2 static inline __m256i sum8x16_small(const __m256i s[8])
{
    __m256i t0 = _mm256_hadd_epi16(s[0], s[1]), t1 = _mm256_hadd_epi16(s[2], s[3]);
    __m256i t2 = _mm256_hadd_epi16(s[4], s[5]), t3 = _mm256_hadd_epi16(s[6], s[7]);
    __m256i v = _mm256_hadd_epi16(_mm256_hadd_epi16(t0, t1), _mm256_hadd_epi16(t2, t3));
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1)));
}

/* Blocks B0..B0 + NB of four rows RB apart from W (Q4: q4_0, else q8_0) against NP pairs of the
 * vectors at XP (their blocks' scales and sums in XS, avx2_prepare's), into ACC[g]: lane 4k + i
 * row i's sum for vector 2g + k. */
VD_AVX2 static inline __attribute__((always_inline)) void
avx2_rows4(const uint8_t *w, uint64_t rb, const uint8_t *const *xp, const avx2_x *xs,
           uint64_t b0, uint64_t nb, const int q4, const int np, __m256 acc[AVX2_PAIRS])
{
    const uint64_t bs = q4 ? 18 : 34;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i one16 = _mm256_set1_epi16(1);
    __m256 a[AVX2_PAIRS];
    for (int g = 0; g < np; g++)
        a[g] = acc[g];
    for (uint64_t b = 0; b < nb; b++) {
        const uint64_t off = bs * (b0 + b), xoff = 34 * (b0 + b) + 2;
        __m256i wq[4], wa[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *p = w + r * rb + off;
            if (q4) { /* low nibbles: elements 0..15; high: 16..31 */
                __m128i q = _mm_loadu_si128((const __m128i *)(p + 2));
                wq[r] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4),
                                         _mm_and_si128(q, m4));
            } else {
                wq[r] = _mm256_loadu_si256((const __m256i *)(p + 2));
                wa[r] = _mm256_sign_epi8(wq[r], wq[r]);
            }
        }
        /* the four rows' scales in both 128-bit lanes */
        __m128 d4 = _mm_cvtph_ps(_mm_setr_epi16((short)ferry__ld16(w + off),
                                                (short)ferry__ld16(w + rb + off),
                                                (short)ferry__ld16(w + 2 * rb + off),
                                                (short)ferry__ld16(w + 3 * rb + off), 0, 0, 0, 0));
        __m256 dw = _mm256_set_m128(d4, d4);
#pragma GCC unroll 4
        for (int g = 0; g < np; g++) {
            const avx2_x *m = &xs[b * (AVX2_GROUP / 2) + (uint64_t)g];
            __m256i s[8];
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xp[2 * g + k] + xoff));
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    s[4 * k + r] =
                        q4 ? _mm256_maddubs_epi16(wq[r], x)
                           : _mm256_madd_epi16(
                                 _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(x, wq[r])), one16);
            }
            /* q4_0's int16 lanes, two products of a nibble and an int8 each, lie in
             * [-3810, 3810]: eight of them sum into an int16 */
            __m256i u = q4 ? _mm256_add_epi32(sum8x16_small(s), m->c) : sum8x8_avx2(s);
            a[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_mul_ps(dw, m->d), a[g]);
        }
    }
    for (int g = 0; g < np; g++)
        acc[g] = a[g];
}

/* avx2_rows4 with Q4 and NP (1..AVX2_PAIRS) as constants. */
VD_AVX2 static void avx2_group(const uint8_t *w, uint64_t rb, const uint8_t *const *xp,
                               const avx2_x *xs, uint64_t b0, uint64_t nb, int q4, int np,
                               __m256 acc[AVX2_PAIRS])
{
#define AVX2_CASE(Q, G)                                                                            \
    case 2 * (G) + (Q): avx2_rows4(w, rb, xp, xs, b0, nb, (Q), (G), acc); break;
    switch (2 * np + q4) {
        AVX2_CASE(0, 1) AVX2_CASE(1, 1) AVX2_CASE(0, 2) AVX2_CASE(1, 2)
        AVX2_CASE(0, 3) AVX2_CASE(1, 3) AVX2_CASE(0, 4) AVX2_CASE(1, 4)
    default: break;
    }
#undef AVX2_CASE
}

/* ferry_matvec_q_n's rows in groups of four for q8_0 or q4_0 (Q4) weights of N elements, RB
 * bytes a row, with AVX2: vectors AVX2_GROUP at a time, blocks MULTI_CHUNK at a time, and for
 * each chunk of four rows every eight of those vectors in turn, so that the chunk's weights are
 * read from memory once; each row's accumulators kept in Y between chunks. Returns the rows done
 * (ROWS rounded down to a multiple of 4). */
VD_AVX2 static uint64_t avx2_rows(int q4, const uint8_t *w, uint64_t rb, uint64_t rows,
                                  uint64_t n, const uint8_t *xq, uint64_t xq_stride,
                                  uint64_t nvec, float *y, uint64_t y_stride)
{
    const uint64_t nb = n / 32, groups = rows / 4;
    avx2_x xs[MULTI_CHUNK * (AVX2_GROUP / 2)];
    const uint8_t *xp[AVX2_GROUP];
    for (uint64_t v0 = 0; v0 < nvec; v0 += AVX2_GROUP) {
        const int nv = (int)(nvec - v0 < AVX2_GROUP ? nvec - v0 : AVX2_GROUP);
        for (int v = 0; v < AVX2_GROUP; v++)
            xp[v] = xq + (v0 + (uint64_t)(v < nv ? v : nv - 1)) * xq_stride;
        float *yv = y + v0 * y_stride;
        for (uint64_t b0 = 0; b0 < nb; b0 += MULTI_CHUNK) {
            const uint64_t cb = nb - b0 < MULTI_CHUNK ? nb - b0 : MULTI_CHUNK;
            avx2_prepare(xp, nv, b0, cb, xs);
            for (uint64_t r0 = 0; r0 < 4 * groups; r0 += 4) {
                for (int s0 = 0; s0 < nv; s0 += 2 * AVX2_PAIRS) {
                    const int sn = nv - s0 < 2 * AVX2_PAIRS ? nv - s0 : 2 * AVX2_PAIRS;
                    const int np = (sn + 1) / 2;
                    __m256 acc[AVX2_PAIRS];
                    for (int g = 0; g < np; g++) {
                        const int v = s0 + 2 * g, v1 = 2 * g + 1 < sn ? v + 1 : v;
                        acc[g] = b0 == 0 ? _mm256_setzero_ps()
                                         : _mm256_set_m128(
                                               _mm_loadu_ps(yv + (uint64_t)v1 * y_stride + r0),
                                               _mm_loadu_ps(yv + (uint64_t)v * y_stride + r0));
                    }
                    avx2_group(w + r0 * rb, rb, xp + s0, xs + s0 / 2, b0, cb, q4, np, acc);
                    for (int g = 0; g < np; g++) {
                        float *y0 = yv + (uint64_t)(s0 + 2 * g) * y_stride + r0;
                        _mm_storeu_ps(y0, _mm256_castps256_ps128(acc[g]));
                        if (2 * g + 1 < sn)
                            _mm_storeu_ps(y0 + y_stride, _mm256_extractf128_ps(acc[g], 1));
                    }
                }
            }
        }
    }
    return 4 * groups;
}

typedef void (*rows8_kernel)(const uint8_t *w, uint64_t rb, const uint8_t *xq, uint64_t n,
                             float *y);

/* The eight-row kernel for T on this CPU, or NULL. */
/* Whether the AVX-512 VNNI kernels run here for rows of ROW_BYTES (their offsets are 32-bit). */
static int use_vnni(uint64_t row_bytes)
{
    return ferry__dtype_isa() >= FERRY__ISA_AVX512 && __builtin_cpu_supports("avx512vnni") &&
           row_bytes <= INT32_MAX / 8;
}

static rows8_kernel pick_rows8(ferry_dtype t, uint64_t row_bytes)
{
    if (!use_vnni(row_bytes))
        return NULL;
    switch (t) {
    case FERRY_DTYPE_Q8_0: return q8_0_rows8;
    case FERRY_DTYPE_Q4_0:
        return ferry__dtype_isa() >= FERRY__ISA_AVX512_VBMI ? q4_0_rows8_vbmi : q4_0_rows8;
    case FERRY_DTYPE_Q4_K:
        return ferry__dtype_isa() >= FERRY__ISA_AVX512_VBMI ? q4_k_rows8_vbmi : q4_k_rows8;
    case FERRY_DTYPE_Q6_K:
        return ferry__dtype_isa() >= FERRY__ISA_AVX512_VBMI ? q6_k_rows8_vbmi : q6_k_rows8;
    default: return NULL;
    }
}
#endif

static vec_kernel pick(ferry_dtype t)
{
#ifdef VD_X86
    if (ferry__dtype_use_avx2()) {
        switch (t) {
        case FERRY_DTYPE_Q8_0: return q8_0_avx2;
        case FERRY_DTYPE_Q4_0: return q4_0_avx2;
        case FERRY_DTYPE_Q4_K: return q4_k_avx2;
        case FERRY_DTYPE_Q6_K: return q6_k_avx2;
        default: break;
        }
    }
#endif
    switch (t) {
    case FERRY_DTYPE_Q8_0: return q8_0_generic;
    case FERRY_DTYPE_Q4_0: return q4_0_generic;
    case FERRY_DTYPE_Q4_K: return q4_k_generic;
    case FERRY_DTYPE_Q5_K: return q5_k_generic;
    case FERRY_DTYPE_Q6_K: return q6_k_generic;
    default: return NULL;
    }
}

/* The checks ferry_matvec_q and ferry_matvec_q_n share; *ROW_BYTES: a row's bytes. */
static int check_args(ferry_dtype t, const void *w, uint64_t cols, const void *xq, const float *y,
                      uint64_t *row_bytes)
{
    if (!w || !xq || !y)
        return FERRY_EINVAL;
    int rc = ferry_dtype_nbytes(t, cols, row_bytes);
    if (rc)
        return rc;
    return ferry__dtype_readable(t) ? 0 : FERRY_EDTYPE;
}

int ferry_matvec_q(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols, const void *xq,
                   float *y)
{
    uint64_t row_bytes;
    int rc = check_args(t, w, cols, xq, y, &row_bytes);
    if (rc)
        return rc;
    vec_kernel k = has_vec_kernel(t) ? pick(t) : NULL;
    if (!k) /* f32, f16, bf16 and the rest: the f32 kernels on the rounded vector */
        return ferry__matvec(t, w, rows, cols, row_bytes, xq, y);
    const uint8_t *p = w;
    uint64_t r = 0;
#ifdef VD_X86
    rows8_kernel k8 = pick_rows8(t, row_bytes);
    if (k8 == q4_0_rows8_vbmi) /* its vector's steps formed once for every group of rows */
        r = q4_0_rows_vbmi(p, row_bytes, rows, xq, cols, y);
    for (; k8 && r + 8 <= rows; r += 8)
        k8(p + r * row_bytes, row_bytes, xq, cols, y + r);
#endif
    for (; r < rows; r++)
        y[r] = k(p + r * row_bytes, xq, cols);
    return 0;
}

int ferry_matvec_q_n(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols, const void *xq,
                     uint64_t n_vec, uint64_t xq_stride, float *y, uint64_t y_stride)
{
    uint64_t row_bytes;
    int rc = check_args(t, w, cols, xq, y, &row_bytes);
    if (rc)
        return rc;
    if (n_vec > 1 && (xq_stride < ferry_matvec_vec_bytes(t, cols) || y_stride < rows))
        return FERRY_EINVAL;
    /* the first NM vectors' first R rows together; the rest (every type, every kernel set) one
     * vector at a time, which gives the same bits */
    uint64_t nm = 0, r = 0;
#ifdef VD_X86
    if (rows >= 4 && cols > 0 && (t == FERRY_DTYPE_Q8_0 || t == FERRY_DTYPE_Q4_0) &&
        use_vnni(row_bytes)) {
        /* whole steps of four vectors, and a last step of three: fewer leave too much of a
         * step unused */
        nm = n_vec % 4 == 3 ? n_vec : n_vec - n_vec % 4;
        if (nm)
            r = multi_rows(t == FERRY_DTYPE_Q4_0, w, row_bytes, rows, cols, xq, xq_stride, nm, y,
                           y_stride);
    } else if (rows >= 4 && cols > 0 && n_vec > 1 &&
               (t == FERRY_DTYPE_Q8_0 || t == FERRY_DTYPE_Q4_0) && ferry__dtype_use_avx2()) {
        nm = n_vec;
        r = avx2_rows(t == FERRY_DTYPE_Q4_0, w, row_bytes, rows, cols, xq, xq_stride, nm, y,
                      y_stride);
    }
#endif
    for (uint64_t v = 0; v < n_vec; v++) {
        uint64_t r0 = v < nm ? r : 0;
        if (r0 == rows)
            continue;
        rc = ferry_matvec_q(t, (const uint8_t *)w + r0 * row_bytes, rows - r0, cols,
                            (const uint8_t *)xq + v * xq_stride, y + v * y_stride + r0);
        if (rc)
            return rc;
    }
    return 0;
}
