/*
 * dtype_kern.h — private to src/dtype/: the scalar building blocks the conversion and dot-product
 * kernels share (unaligned little-endian loads, half-precision and bfloat16 conversions written so
 * that loops over them vectorize), the q6_K unpack of the AVX2 kernels, and the test hook that
 * pins the dot kernels to one ISA.
 */
#ifndef FERRY_DTYPE_KERN_H
#define FERRY_DTYPE_KERN_H

#include <stdint.h>
#include <string.h>

#include "dtype/dtype.h"

/* Weights are stored little-endian in every format ferry reads, and the kernels read them with
 * plain loads. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ferry's numeric kernels assume a little-endian host"
#endif

static inline uint16_t ferry__ld16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline uint32_t ferry__ld32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline float ferry__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t ferry__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* f16 -> f32, exact. Branch-free so that a loop over it vectorizes: subnormals (exponent 0) are
 * converted through an exact integer-to-float multiply, Inf/NaN (exponent 31) get the wider
 * exponent, NaN payloads are kept. */
static inline float ferry__h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t norm = (em << 13) + ((uint32_t)(127 - 15) << 23);
    norm += em >= 0x7c00u ? (uint32_t)(128 - 16) << 23 : 0u;
    uint32_t sub = ferry__f32_bits((float)(int32_t)em * 0x1p-24f);
    return ferry__bits_f32(sign | (em < 0x400u ? sub : norm));
}

/* f32 -> f16, round to nearest even; overflow gives Inf, NaN stays a (quiet) NaN. */
static inline uint16_t ferry__f2h(float f)
{
    uint32_t u = ferry__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
    if (a >= 0x47800000u) /* >= 65536: beyond even the rounding range of the largest half */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* Below 2^-14 the result is a subnormal half (or zero): adding 0.5 puts the unit of the
         * last place at 2^-24, so the FPU's own round-to-nearest-even does the rounding. */
        float r = ferry__bits_f32(a) + 0.5f;
        return (uint16_t)(sign | (ferry__f32_bits(r) - 0x3f000000u));
    }
    /* Normal: re-bias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest
     * even; a carry out of the mantissa correctly bumps the exponent, up to Inf. */
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

static inline float ferry__bf2f(uint16_t h) { return ferry__bits_f32((uint32_t)h << 16); }

/* f32 -> bf16, round to nearest even; a NaN keeps its sign and becomes a quiet NaN (its payload
 * may sit entirely in the dropped bits, which would otherwise turn it into Inf). */
static inline uint16_t ferry__f2bf(float f)
{
    uint32_t u = ferry__f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    /* a select, not a branch, so that loops over it vectorize */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* Scale and min J (0..7) of a q4_K / q5_K block, from its 12 packed scale bytes S: six bits
 * each; 0..3 in the low bits of bytes 0..3 (scales) and 4..7 (mins), 4..7 in the nibbles of bytes
 * 8..11 with their two high bits in the top bits of bytes 0..7. */
static inline void ferry__k4_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

/* q6_K, for the AVX2 kernels: the four groups of 32 six-bit quants of half H (0 or 1) of block W
 * into Q, as unsigned bytes 0..63: ql nibbles with qh bits 2g, 2g+1 moved to bits 4, 5 (the
 * shifts are per 16-bit lane, masked, so nothing carries across bytes). */
__attribute__((target("avx2"), always_inline)) static inline void
ferry__q6k_quants_avx2(const uint8_t *w, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h));
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
#define FERRY__Q6QH(sh) _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, (sh)), m3), 4)
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), FERRY__Q6QH(0));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), FERRY__Q6QH(2));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), FERRY__Q6QH(4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), FERRY__Q6QH(6));
#undef FERRY__Q6QH
}
#endif

/* The kernel sets of src/dtype/, in order: portable code, AVX2+FMA+F16C, AVX-512 (F/BW/VL/DQ
 * with FMA and F16C: the f32 / f16 / bf16 / q8_0 / q4_0 kernels of ferry__matvec), AVX-512 with
 * VNNI, VBMI and GFNI as well (the 512-bit q4_0, q4_K and q6_K kernels of ferry_matvec_q). */
enum {
    FERRY__ISA_GENERIC = 0,
    FERRY__ISA_AVX2 = 1,
    FERRY__ISA_AVX512 = 2,
    FERRY__ISA_AVX512_VBMI = 3
};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FERRY_DOT_AVX512 1
/* y = W.x over ROWS rows of COLS elements (ROW_BYTES apart) with the AVX-512 kernels; 0 when T
 * has none (the caller falls back), 1 when done. Arguments already checked. */
int ferry__matvec_avx512(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols,
                         uint64_t row_bytes, const float *x, float *y);
#endif

/* The kernel set in use: the best the CPU supports, capped by the environment variable FERRY_ISA
 * ("generic", "avx2", "avx512", "avx512vbmi"; read once) and by the test hook below. */
int ferry__dtype_isa(void);
/* Test hook: caps the kernel set at LEVEL (a FERRY__ISA_ value; -1: no cap). Tests set it
 * between runs, never while a kernel runs. Returns the previous cap. */
int ferry__dtype_force_isa(int level);
/* Test hook: whether the kernels of src/dtype/ (dot products, GEMM, f16 conversions) use the
 * portable code only (1) or the best the CPU supports (0, the default): ferry__dtype_force_isa
 * of FERRY__ISA_GENERIC or -1. Returns the previous value. */
int ferry__dtype_force_generic(int on);
/* 1 when the AVX2+FMA+F16C kernels may be used: an x86 CPU that has them, and no cap below. */
int ferry__dtype_use_avx2(void);
/* Name of the kernel set in use now ("avx512vbmi", "avx512", "avx2" or "generic"). */
const char *ferry__dot_isa(void);

#endif
