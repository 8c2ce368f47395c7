/*
 * dot_avx512.c — the AVX-512 kernels of ferry__matvec (x in f32) for f32, f16, bf16, q8_0 and
 * q4_0 rows: four rows at a time share each load of x, each row keeps its own independent
 * accumulators, and a row's sums are formed in the same order whether it is computed alone
 * (ferry__dot_row) or with three others, so the two give the same bits. The tail of a row that is
 * not a whole vector is read with masked loads: nothing past the row is touched.
 *
 * Picked at run time (dot.c) on a CPU with AVX-512 F/BW/VL/DQ, FMA and F16C, unless the kernels
 * are capped below it (FERRY_ISA, or the test hook of dtype_kern.h).
 */
#include "dtype/dtype_kern.h"

#ifdef FERRY_DOT_AVX512

#include <immintrin.h>

#define K512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define KINL __attribute__((always_inline)) inline

/* Lanes below N (0..16) of a 16-lane mask. */
K512 static KINL __mmask16 lanes(uint64_t n) { return (__mmask16)((1u << n) - 1u); }

/* y[r] = sum of the four accumulators of row r, in one fixed order. */
K512 static KINL float reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* Sixteen weights at P (a row of type T) as floats; only the lanes of M are read. */
#define W16_F32(p) _mm512_loadu_ps((const void *)(p))
#define W16_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define W16_BF16(p)                                                                                \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define W16M_F32(m, p) _mm512_maskz_loadu_ps((m), (const void *)(p))
#define W16M_F16(m, p) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((m), (const void *)(p)))
#define W16M_BF16(m, p)                                                                            \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((m), (p))), 16))

/* The dense kernels: R rows (1..4) of N elements, ES bytes each, row r at W + r * RB. Per row,
 * 64 elements an iteration into four accumulators; then 16 at a time into the first; then the
 * masked tail into the first. */
#define DENSE_KERNEL(name, ES, W16, W16M)                                                          \
    K512 static KINL void name(const uint8_t *w, uint64_t rb, const float *x, uint64_t n,         \
                               float *y, const int R)                                              \
    {                                                                                              \
        __m512 a[4][4];                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                        \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) a[r][k] = _mm512_setzero_ps();     \
        uint64_t i = 0;                                                                            \
        for (; i + 64 <= n; i += 64) {                                                             \
            __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);                 \
            __m512 x2 = _mm512_loadu_ps(x + i + 32), x3 = _mm512_loadu_ps(x + i + 48);            \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                  \
                const uint8_t *p = w + r * rb + (ES) * i;                                          \
                _Pragma("GCC unroll 4") for (int l = 0; l < (ES); l++)                             \
                    _mm_prefetch((const char *)(p + 4 * rb + 64 * l), _MM_HINT_T0);                \
                a[r][0] = _mm512_fmadd_ps(W16(p), x0, a[r][0]);                                    \
                a[r][1] = _mm512_fmadd_ps(W16(p + 16 * (ES)), x1, a[r][1]);                        \
                a[r][2] = _mm512_fmadd_ps(W16(p + 32 * (ES)), x2, a[r][2]);                        \
                a[r][3] = _mm512_fmadd_ps(W16(p + 48 * (ES)), x3, a[r][3]);                        \
            }                                                                                      \
        }                                                                                          \
        for (; i + 16 <= n; i += 16) {                                                             \
            __m512 x0 = _mm512_loadu_ps(x + i);                                                    \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a[r][0] =                          \
                _mm512_fmadd_ps(W16(w + r * rb + (ES) * i), x0, a[r][0]);                          \
        }                                                                                          \
        if (i < n) {                                                                               \
            __mmask16 m = lanes(n - i);                                                            \
            __m512 x0 = _mm512_maskz_loadu_ps(m, x + i);                                           \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) a[r][0] =                          \
                _mm512_fmadd_ps(W16M(m, w + r * rb + (ES) * i), x0, a[r][0]);                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] =                                 \
            reduce4(a[r][0], a[r][1], a[r][2], a[r][3]);                                           \
    }

DENSE_KERNEL(rows_f32, 4, W16_F32, W16M_F32)
DENSE_KERNEL(rows_f16, 2, W16_F16, W16M_F16)
DENSE_KERNEL(rows_bf16, 2, W16_BF16, W16M_BF16)

/* The block kernels: per block the 32 products q*x in a vector, then one fma with the block's
 * scale into one of two accumulators (even and odd blocks); BS bytes a block. The scales of up to
 * SC_CHUNK blocks of each row are first converted to f32 in a local array (scalar loads, one
 * vector conversion per 16), so that the block loop takes each as a broadcast memory operand. */
enum { SC_CHUNK = 64 };

K512 static KINL void block_scales(const uint8_t *p, uint64_t bs, uint64_t nb, float *out)
{
    uint16_t h[SC_CHUNK];
    for (uint64_t b = 0; b < nb; b++)
        h[b] = ferry__ld16(p + bs * b);
    for (uint64_t b = nb; b % 16; b++)
        h[b] = 0;
    for (uint64_t b = 0; b < nb; b += 16)
        _mm512_storeu_ps(out + b, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + b))));
}

/* One q8_0 block at P against x0, x1 (its 32 elements of x) into ACC, scaled by D. */
#define Q8_BLOCK(p, x0, x1, d, acc)                                                                \
    do {                                                                                           \
        __m512 q0_ = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((p) + 2))));  \
        __m512 q1_ = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((p) + 18)))); \
        (acc) = _mm512_fmadd_ps(_mm512_fmadd_ps(q1_, (x1), _mm512_mul_ps(q0_, (x0))), _mm512_set1_ps(d), (acc)); \
    } while (0)

/* q4_0: the 16 bytes of nibbles widened to 16 lanes; a lane's low nibble (element j) and high
 * nibble (element j + 16) pick their value - 8 out of a 16-float table (vpermps reads only the
 * index's low four bits). */
#define Q4_BLOCK(p, x0, x1, d, acc)                                                                \
    do {                                                                                           \
        __m512i v_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)((p) + 2)));           \
        __m512 lo_ = _mm512_permutexvar_ps(v_, tbl), hi_ = _mm512_permutexvar_ps(_mm512_srli_epi32(v_, 4), tbl); \
        (acc) = _mm512_fmadd_ps(_mm512_fmadd_ps(hi_, (x1), _mm512_mul_ps(lo_, (x0))), _mm512_set1_ps(d), (acc)); \
    } while (0)

#define BLOCK_KERNEL(name, BS, BLOCK)                                                              \
    K512 static KINL void name(const uint8_t *w, uint64_t rb, const float *x, uint64_t n,         \
                               float *y, const int R)                                              \
    {                                                                                              \
        const __m512 tbl = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7); \
        (void)tbl;                                                                                 \
        float sc[4][SC_CHUNK];                                                                     \
        __m512 a[4][2];                                                                            \
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm512_setzero_ps(); \
        uint64_t nb = n / 32;                                                                      \
        for (uint64_t c = 0; c < nb; c += SC_CHUNK) {                                              \
            uint64_t cn = nb - c < SC_CHUNK ? nb - c : SC_CHUNK, b = 0;                            \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                    \
                block_scales(w + r * rb + (BS) * c, (BS), cn, sc[r]);                              \
            for (; b + 2 <= cn; b += 2) {                                                          \
                const float *xb = x + 32 * (c + b);                                                \
                __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);                    \
                __m512 x2 = _mm512_loadu_ps(xb + 32), x3 = _mm512_loadu_ps(xb + 48);               \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                              \
                    const uint8_t *p = w + r * rb + (BS) * (c + b);                                \
                    _mm_prefetch((const char *)(p + 4 * rb), _MM_HINT_T1);                         \
                    _mm_prefetch((const char *)(p + 4 * rb + 2 * (BS) - 1), _MM_HINT_T1);          \
                    BLOCK(p, x0, x1, sc[r][b], a[r][0]);                                           \
                    BLOCK(p + (BS), x2, x3, sc[r][b + 1], a[r][1]);                                \
                }                                                                                  \
            }                                                                                      \
            if (b < cn) {                                                                          \
                const float *xb = x + 32 * (c + b);                                                \
                __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);                    \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                \
                    BLOCK(w + r * rb + (BS) * (c + b), x0, x1, sc[r][b], a[r][0]);                 \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[r] =                                 \
            _mm512_reduce_add_ps(_mm512_add_ps(a[r][0], a[r][1]));                                 \
    }

BLOCK_KERNEL(rows_q8_0, 34, Q8_BLOCK)
BLOCK_KERNEL(rows_q4_0, 18, Q4_BLOCK)

/* ROWS rows through KERNEL: four at a time, then one at a time. */
#define ROWS_OF(kernel)                                                                            \
    K512 static void kernel##_all(const uint8_t *w, uint64_t rows, uint64_t rb, const float *x,    \
                                  uint64_t n, float *y)                                            \
    {                                                                                              \
        uint64_t r = 0;                                                                            \
        for (; r + 4 <= rows; r += 4)                                                              \
            kernel(w + r * rb, rb, x, n, y + r, 4);                                                \
        for (; r < rows; r++)                                                                      \
            kernel(w + r * rb, rb, x, n, y + r, 1);                                                \
    }

ROWS_OF(rows_f32)
ROWS_OF(rows_f16)
ROWS_OF(rows_bf16)
ROWS_OF(rows_q8_0)
ROWS_OF(rows_q4_0)

int ferry__matvec_avx512(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols,
                         uint64_t row_bytes, const float *x, float *y)
{
    switch (t) {
    case FERRY_DTYPE_F32: rows_f32_all(w, rows, row_bytes, x, cols, y); return 1;
    case FERRY_DTYPE_F16: rows_f16_all(w, rows, row_bytes, x, cols, y); return 1;
    case FERRY_DTYPE_BF16: rows_bf16_all(w, rows, row_bytes, x, cols, y); return 1;
    case FERRY_DTYPE_Q8_0: rows_q8_0_all(w, rows, row_bytes, x, cols, y); return 1;
    case FERRY_DTYPE_Q4_0: rows_q4_0_all(w, rows, row_bytes, x, cols, y); return 1;
    default: return 0;
    }
}

#else
typedef int ferry__dot_avx512_unused; /* ISO C wants a translation unit to declare something */
#endif
