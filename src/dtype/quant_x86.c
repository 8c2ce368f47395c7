/*
 * quant_x86.c — AVX2 quantizers for the writes `ferry gen`, conversion on load and LoRA merges
 * spend their time in: f32 -> q4_0, q8_0, q8_1 and bf16, several times faster than the portable
 * loops of convert.c, and byte-for-byte equal to them for every input, NaN and Inf included.
 *
 * Equality rests on doing the same IEEE operations in the same order, one rounding each: the
 * block's scale d and its reciprocal id are the same divisions convert.c does (eight blocks at a
 * time); x * id and the + 8.5 offset are separate multiply and add instructions (this file is
 * compiled without FMA, so they cannot be fused); truncation, clamping and round-half-away-from-
 * zero are built from exact operations; F16C's conversion of d rounds to nearest even like
 * ferry__f2h, and d is never NaN (the one case where the two could differ).
 *
 * NaN: the portable loops skip a NaN when they look for the largest magnitude, and turn a NaN
 * quotient into 0. Here the searches are chains acc = max(x, acc): maxps and minps return their
 * second operand when either is NaN, so a NaN element leaves acc alone; a NaN quotient is masked
 * or clamped to 0 the same way.
 *
 * Blocks go eight at a time (a "group"): their maxima are reduced into one vector, so that the
 * scale arithmetic, the f16 conversion of the scales and the reductions' shuffles are shared. A
 * last partial group is padded with zeros in a local buffer. q4_0 needs the signed element of
 * largest magnitude (the first one on ties): it is the block's maximum or its minimum, whichever
 * is larger in magnitude; only a block where +amax and -amax both occur looks at positions.
 */
#include "dtype/quant_x86.h"

#ifdef FERRY_QUANT_X86

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "dtype/dtype_kern.h"

#define AVX2 __attribute__((target("avx2,f16c")))

/* Loops over the four vectors of a block are written out: GCC at -O2 keeps a 4-trip loop and
 * sends the vectors through the stack. */

/* Lane b of the result is the maximum (MIN: the minimum) of the eight lanes of V[b]. V holds no
 * NaN. */
AVX2 static inline __m256 reduce8(const __m256 v[8], int min)
{
#define OP(a, b) (min ? _mm256_min_ps((a), (b)) : _mm256_max_ps((a), (b)))
    __m256 s[4], u[2];
    for (int k = 0; k < 4; k++) /* per 128-bit half: v2k.02, v2k+1.02, v2k.13, v2k+1.13 */
        s[k] = OP(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                  _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 2; k++) /* per half: the half's reduction of v4k .. v4k+3 */
        u[k] = OP(_mm256_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                  _mm256_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return OP(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
#undef OP
}

/* What convert.c's signed_amax gives for the 32 floats at X: the first element of largest
 * magnitude, with its sign (0 when every magnitude is 0 or NaN). Used for the rare blocks whose
 * largest magnitude appears with both signs. */
static float signed_amax_scalar(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

/* q4_0 for the eight blocks (256 floats) at X into P (8 * 18 bytes; BSIZE is 18). */
AVX2 static void q4_0_group(const float *x, uint8_t *p, unsigned bsize)
{
    const __m256 zero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff()), pinf = _mm256_set1_ps(__builtin_inff());
    __m256 hi[8], lo[8];
    for (int b = 0; b < 8; b++) {
        const float *xb = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
        __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
        hi[b] = _mm256_max_ps(v3, _mm256_max_ps(v2, _mm256_max_ps(v1, _mm256_max_ps(v0, ninf))));
        lo[b] = _mm256_min_ps(v3, _mm256_min_ps(v2, _mm256_min_ps(v1, _mm256_min_ps(v0, pinf))));
    }
    /* per block: the largest and the smallest element (-inf / +inf when all are NaN) */
    __m256 mx = reduce8(hi, 0), mn = reduce8(lo, 1);
    __m256 nmn = _mm256_xor_ps(mn, sign);
    __m256 amax = _mm256_max_ps(mx, nmn);
    __m256 pos = _mm256_cmp_ps(mx, amax, _CMP_EQ_OQ), neg = _mm256_cmp_ps(nmn, amax, _CMP_EQ_OQ);
    __m256 some = _mm256_cmp_ps(amax, zero, _CMP_GT_OQ);
    /* the signed maximum: the largest element when it has the largest magnitude, else the
     * smallest; 0 when all magnitudes are 0 (or NaN) */
    __m256 smax = _mm256_and_ps(_mm256_blendv_ps(mn, mx, pos), some);
    int ties = _mm256_movemask_ps(_mm256_and_ps(_mm256_and_ps(pos, neg), some));
    if (ties) { /* +amax and -amax both occur: which comes first decides */
        float s[8];
        _mm256_storeu_ps(s, smax);
        for (int b = 0; b < 8; b++)
            if (ties >> b & 1)
                s[b] = signed_amax_scalar(x + 32 * b);
        smax = _mm256_loadu_ps(s);
    }
    __m256 d = _mm256_div_ps(smax, _mm256_set1_ps(-8.0f));
    __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
                              _mm256_cmp_ps(d, zero, _CMP_NEQ_UQ));
    uint16_t hd[8];
    float ids[8];
    _mm_storeu_si128((__m128i *)(void *)hd, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_ps(ids, id);

    const __m256 offset = _mm256_set1_ps(8.5f), top = _mm256_set1_ps(15.0f);
    for (int b = 0; b < 8; b++, p += bsize) {
        const float *xb = x + 32 * b;
        const __m256 idv = _mm256_set1_ps(ids[b]);
        /* x * id + 8.5 clamped to [0, 15] and truncated; max first: it turns NaN into 0 */
#define Q4(k)                                                                                      \
    _mm256_cvttps_epi32(_mm256_min_ps(                                                             \
        _mm256_max_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * (k)), idv), offset),    \
                      zero),                                                                       \
        top))
        __m256i q0 = Q4(0), q1 = Q4(1), q2 = Q4(2), q3 = Q4(3);
#undef Q4
        /* byte j = element j | element j+16 << 4 */
        __m256i l = _mm256_or_si256(q0, _mm256_slli_epi32(q2, 4)); /* bytes 0..7 */
        __m256i h = _mm256_or_si256(q1, _mm256_slli_epi32(q3, 4)); /* bytes 8..15 */
        __m256i w = _mm256_packs_epi32(l, h); /* per half: 4 of l, 4 of h */
        w = _mm256_permute4x64_epi64(w, 0xd8); /* l 0..7, h 0..7 */
        __m128i bytes =
            _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        memcpy(p, &hd[b], 2);
        _mm_storeu_si128((__m128i *)(void *)(p + 2), bytes);
    }
}

/* roundf(x * id) clamped to [-127, 127], NaN -> 0, for the 8 floats at X. Clamping first keeps
 * Inf out of the rounding and changes nothing else (roundf of a value in [-127, 127] stays there).
 * roundf rounds half away from zero: trunc(v) plus trunc(2 * (v - trunc(v))), which is -1, 0 or
 * 1; every step is exact. */
AVX2 static inline __m256i q8_quant(const float *x, __m256 idv)
{
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), idv);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(v, t);
    f = _mm256_round_ps(_mm256_add_ps(f, f), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_add_ps(t, f)); /* integral: exact */
}

/* q8_0 (BSIZE 34) or q8_1 (36) for the eight blocks at X into P. */
AVX2 static void q8_group(const float *x, uint8_t *p, unsigned bsize)
{
    const __m256 zero = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m[8];
    for (int b = 0; b < 8; b++) {
        const float *xb = x + 32 * b;
        __m256 a0 = _mm256_and_ps(_mm256_loadu_ps(xb), abs_mask);
        __m256 a1 = _mm256_and_ps(_mm256_loadu_ps(xb + 8), abs_mask);
        __m256 a2 = _mm256_and_ps(_mm256_loadu_ps(xb + 16), abs_mask);
        __m256 a3 = _mm256_and_ps(_mm256_loadu_ps(xb + 24), abs_mask);
        m[b] = _mm256_max_ps(a3, _mm256_max_ps(a2, _mm256_max_ps(a1, _mm256_max_ps(a0, zero))));
    }
    __m256 d = _mm256_div_ps(reduce8(m, 0), _mm256_set1_ps(127.0f));
    __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
                              _mm256_cmp_ps(d, zero, _CMP_NEQ_UQ));
    uint16_t hd[8];
    float ds[8], ids[8];
    _mm_storeu_si128((__m128i *)(void *)hd, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    _mm256_storeu_ps(ds, d);
    _mm256_storeu_ps(ids, id);

    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < 8; b++, p += bsize) {
        const float *xb = x + 32 * b;
        const __m256 idv = _mm256_set1_ps(ids[b]);
        __m256i q0 = q8_quant(xb, idv), q1 = q8_quant(xb + 8, idv);
        __m256i q2 = q8_quant(xb + 16, idv), q3 = q8_quant(xb + 24, idv);
        /* per half: 4 each of q0, q1, q2, q3; the permutation restores element order */
        __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        _mm256_storeu_si256((__m256i *)(void *)(p + bsize - 32),
                            _mm256_permutevar8x32_epi32(w, order));
        memcpy(p, &hd[b], 2);
        if (bsize == 36) { /* q8_1: s = d * sum(q), converted like convert.c does */
            __m256i s = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
            __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
            h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
            uint16_t hs = ferry__f2h((float)_mm_cvtsi128_si32(h) * ds[b]);
            memcpy(p + 2, &hs, 2);
        }
    }
}

typedef void group_fn(const float *x, uint8_t *p, unsigned bsize);

/* Runs GROUP over NB blocks of 32 floats at X into P (BSIZE bytes a block); the last partial
 * group goes through zero-padded local buffers. */
static void run_groups(group_fn *group, const float *x, uint8_t *p, uint64_t nb, unsigned bsize)
{
    uint64_t i = 0;
    for (; i + 8 <= nb; i += 8)
        group(x + 32 * i, p + bsize * i, bsize);
    if (i < nb) {
        float xin[32 * 8] = {0};
        uint8_t pout[36 * 8];
        size_t rest = (size_t)(nb - i);
        memcpy(xin, x + 32 * i, rest * 32 * sizeof(float));
        group(xin, pout, bsize);
        memcpy(p + bsize * i, pout, rest * bsize);
    }
}

void ferry__quant_q4_0_avx2(const float *x, uint8_t *p, uint64_t nb)
{
    run_groups(q4_0_group, x, p, nb, 18);
}

void ferry__quant_q8_avx2(const float *x, uint8_t *p, uint64_t nb, int with_sum)
{
    run_groups(q8_group, x, p, nb, with_sum ? 36 : 34);
}

AVX2 uint64_t ferry__f32_to_bf16_avx2(const float *in, uint8_t *p, uint64_t n)
{
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h[2];
        for (int k = 0; k < 2; k++) {
            /* as ferry__f2bf: round to nearest even, or the quieted upper half of a NaN */
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(in + i + 8 * k));
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), odd), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
            h[k] = _mm256_blendv_epi8(r, qn, nan);
        }
        __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(void *)(p + 2 * i), w);
    }
    return i;
}

#else
typedef int ferry__quant_x86_unused; /* ISO C wants a translation unit to declare something */
#endif
