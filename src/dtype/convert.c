/*
 * convert.c — numbers in and out of stored types: the scalar half/bfloat16 conversions, the
 * dequantizers (every type ferry can read -> f32), the quantizers (f32 -> the types ferry can
 * write, byte-for-byte as GGUF's reference quantizers lay them out) and ferry_dtype_convert, which
 * goes from any readable type to any writable one through f32 in stack-sized chunks.
 *
 * Block layouts (ggml's): a block's scales come first unless noted; "nibbles" hold element j in
 * the low half of byte j and element j+16 in the high half (32-element blocks). Loops over a block
 * are elementwise with fixed trip counts, which leaves the compiler free to vectorize them. On x86
 * with AVX2, q4_0 / q8_0 / q8_1 / bf16 writes go through quant_x86.c, which gives the same bytes.
 */
#include <math.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FERRY_CONVERT_X86 1
#include <immintrin.h>
#endif

#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"
#include "dtype/quant_x86.h"
#include "util/util.h"

float ferry__f16_to_f32(uint16_t h) { return ferry__h2f(h); }
uint16_t ferry__f32_to_f16(float f) { return ferry__f2h(f); }
float ferry__bf16_to_f32(uint16_t h) { return ferry__bf2f(h); }
uint16_t ferry__f32_to_bf16(float f) { return ferry__f2bf(f); }

/* ---- rows of halves and bfloat16 ------------------------------------------------------------ */

/* The portable loops run in fixed groups of 16 so that the compiler vectorizes them at -O2; on
 * x86 the F16C instructions (round to nearest even, like ferry__f2h) do the halves. */
#define GROUP 16

#ifdef FERRY_CONVERT_X86
__attribute__((target("avx2,f16c"))) static uint64_t f16_to_f32_f16c(const uint8_t *p,
                                                                      float *out, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h;
        memcpy(&h, p + 2 * i, 16);
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
}

__attribute__((target("avx2,f16c"))) static uint64_t f32_to_f16_f16c(const float *in,
                                                                      uint8_t *p, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        memcpy(p + 2 * i, &h, 16);
    }
    return i;
}
#endif

static void f16_row_to_f32(const uint8_t *p, float *out, uint64_t n)
{
    uint64_t i = 0;
#ifdef FERRY_CONVERT_X86
    if (ferry__dtype_use_avx2())
        i = f16_to_f32_f16c(p, out, n);
#endif
    for (; i + GROUP <= n; i += GROUP) {
        uint16_t h[GROUP];
        memcpy(h, p + 2 * i, sizeof h);
        for (int k = 0; k < GROUP; k++)
            out[i + k] = ferry__h2f(h[k]);
    }
    for (; i < n; i++)
        out[i] = ferry__h2f(ferry__ld16(p + 2 * i));
}

static void f32_row_to_f16(const float *in, uint8_t *p, uint64_t n)
{
    uint64_t i = 0;
#ifdef FERRY_CONVERT_X86
    if (ferry__dtype_use_avx2())
        i = f32_to_f16_f16c(in, p, n);
#endif
    for (; i < n; i++) {
        uint16_t h = ferry__f2h(in[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

static void bf16_row_to_f32(const uint8_t *p, float *out, uint64_t n)
{
    uint64_t i = 0;
    for (; i + GROUP <= n; i += GROUP) {
        uint16_t h[GROUP];
        memcpy(h, p + 2 * i, sizeof h);
        for (int k = 0; k < GROUP; k++)
            out[i + k] = ferry__bf2f(h[k]);
    }
    for (; i < n; i++)
        out[i] = ferry__bf2f(ferry__ld16(p + 2 * i));
}

static void f32_row_to_bf16(const float *in, uint8_t *p, uint64_t n)
{
    uint64_t i = 0;
#ifdef FERRY_QUANT_X86
    if (ferry__dtype_use_avx2())
        i = ferry__f32_to_bf16_avx2(in, p, n);
#endif
    for (; i + GROUP <= n; i += GROUP) {
        uint16_t h[GROUP];
        for (int k = 0; k < GROUP; k++)
            h[k] = ferry__f2bf(in[i + k]);
        memcpy(p + 2 * i, h, sizeof h);
    }
    for (; i < n; i++) {
        uint16_t h = ferry__f2bf(in[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* ---- 8-bit floats ------------------------------------------------------------------------- */

/* OCP E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN, max 448. */
static float f8_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 15 && m == 7)
        return ferry__bits_f32(sign | 0x7fc00000u);
    if (e == 0)
        return ferry__bits_f32(sign | ferry__f32_bits((float)m * 0x1p-9f));
    return ferry__bits_f32(sign | ((e - 7 + 127) << 23) | (m << 20));
}

/* E5M2 is the upper byte of an IEEE half (Inf and NaN included). */
static float f8_e5m2_to_f32(uint8_t b) { return ferry__h2f((uint16_t)(b << 8)); }

/* E8M0: an unsigned power of two 2^(b-127); 0xff is NaN. */
static float f8_e8m0_to_f32(uint8_t b)
{
    if (b == 0xff)
        return ferry__bits_f32(0x7fc00000u);
    if (b == 0)
        return ferry__bits_f32(0x00400000u); /* 2^-127, a float subnormal */
    return ferry__bits_f32((uint32_t)b << 23);
}

/* ---- dequantizers: NB whole blocks from P to Y ----------------------------------------------- */

/* q4_0 (18 bytes): f16 d, 16 nibble bytes; x = (q - 8) * d. */
static void deq_q4_0(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 18, y += 32) {
        float d = ferry__h2f(ferry__ld16(p));
        const uint8_t *q = p + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((q[j] & 15) - 8) * d;
            y[j + 16] = (float)((q[j] >> 4) - 8) * d;
        }
    }
}

/* q4_1 (20 bytes): f16 d, f16 m, 16 nibble bytes; x = q * d + m. */
static void deq_q4_1(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 20, y += 32) {
        float d = ferry__h2f(ferry__ld16(p)), m = ferry__h2f(ferry__ld16(p + 2));
        const uint8_t *q = p + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(q[j] & 15) * d + m;
            y[j + 16] = (float)(q[j] >> 4) * d + m;
        }
    }
}

/* q5_0 (22 bytes): f16 d, u32 qh (bit j = 5th bit of element j), 16 nibble bytes;
 * x = (q - 16) * d. */
static void deq_q5_0(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 22, y += 32) {
        float d = ferry__h2f(ferry__ld16(p));
        uint32_t qh = ferry__ld32(p + 2);
        const uint8_t *q = p + 6;
        for (int j = 0; j < 16; j++) {
            int lo = (q[j] & 15) | (int)(((qh >> j) & 1u) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

/* q5_1 (24 bytes): f16 d, f16 m, u32 qh, 16 nibble bytes; x = q * d + m. */
static void deq_q5_1(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 24, y += 32) {
        float d = ferry__h2f(ferry__ld16(p)), m = ferry__h2f(ferry__ld16(p + 2));
        uint32_t qh = ferry__ld32(p + 4);
        const uint8_t *q = p + 8;
        for (int j = 0; j < 16; j++) {
            int lo = (q[j] & 15) | (int)(((qh >> j) & 1u) << 4);
            int hi = (q[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        }
    }
}

/* q8_0 (34 bytes): f16 d, 32 int8; q8_1 (36 bytes): f16 d, f16 s (= d * sum q), 32 int8. */
static void deq_q8(const uint8_t *p, float *y, uint64_t nb, unsigned bsize)
{
    for (uint64_t i = 0; i < nb; i++, p += bsize, y += 32) {
        float d = ferry__h2f(ferry__ld16(p));
        const int8_t *q = (const int8_t *)(p + bsize - 32);
        for (int j = 0; j < 32; j++)
            y[j] = (float)q[j] * d;
    }
}

/* q2_K (84 bytes): 16 scale bytes (low nibble: scale, high: min, per 16 elements), 64 bytes of
 * 2-bit quants, f16 d, f16 dmin. Each 128-element half uses 32 quant bytes; shift 2s selects the
 * 32 elements 32s..32s+31 of that half. x = d * sc * q - dmin * m. */
static void deq_q2_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 84) {
        const uint8_t *sc = p, *qs = p + 16;
        float d = ferry__h2f(ferry__ld16(p + 80)), dmin = ferry__h2f(ferry__ld16(p + 82));
        for (int half = 0; half < 2; half++, qs += 32) {
            for (int s = 0; s < 4; s++) {
                for (int g = 0; g < 2; g++, y += 16) {
                    uint8_t b = *sc++;
                    float dl = d * (float)(b & 15), ml = dmin * (float)(b >> 4);
                    const uint8_t *q = qs + 16 * g;
                    for (int l = 0; l < 16; l++)
                        y[l] = dl * (float)((q[l] >> (2 * s)) & 3) - ml;
                }
            }
        }
    }
}

/* The 16 six-bit scales of q3_K, packed in 12 bytes: low nibbles of scales 0..7 in bytes 0..7,
 * of scales 8..15 in the high nibbles of bytes 0..7; the two high bits of scale i are bits
 * 2*(i/4) of byte 8 + i%4. Stored with an offset of 32. */
static void q3_k_scales(const uint8_t *s, int sc[16])
{
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
        int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (lo | hi << 4) - 32;
    }
}

/* q3_K (110 bytes): 32 bytes hmask (bit b of byte l: high bit of element 32b + l), 64 bytes of
 * 2-bit quants (laid out as in q2_K), 12 scale bytes, f16 d. x = d * sc * (q - 4 * !high). */
static void deq_q3_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 110) {
        const uint8_t *hm = p, *qs = p + 32;
        float d = ferry__h2f(ferry__ld16(p + 108));
        int sc[16];
        q3_k_scales(p + 96, sc);
        int is = 0, bit = 0;
        for (int half = 0; half < 2; half++, qs += 32) {
            for (int s = 0; s < 4; s++, bit++) {
                for (int g = 0; g < 2; g++, y += 16) {
                    float dl = d * (float)sc[is++];
                    const uint8_t *q = qs + 16 * g, *h = hm + 16 * g;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[l] >> (2 * s)) & 3) - (((h[l] >> bit) & 1) ? 0 : 4);
                        y[l] = dl * (float)v;
                    }
                }
            }
        }
    }
}

/* q4_K (144 bytes): f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes. Each 64 elements use 32
 * bytes: low nibbles are the first 32, high nibbles the next 32. x = d * sc * q - dmin * m. */
static void deq_q4_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 144) {
        float d = ferry__h2f(ferry__ld16(p)), dmin = ferry__h2f(ferry__ld16(p + 2));
        const uint8_t *scales = p + 4, *q = p + 16;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int sc1, m1, sc2, m2;
            ferry__k4_scale_min(scales, 2 * c, &sc1, &m1);
            ferry__k4_scale_min(scales, 2 * c + 1, &sc2, &m2);
            float d1 = d * (float)sc1, o1 = dmin * (float)m1;
            float d2 = d * (float)sc2, o2 = dmin * (float)m2;
            for (int l = 0; l < 32; l++) {
                y[l] = d1 * (float)(q[l] & 15) - o1;
                y[l + 32] = d2 * (float)(q[l] >> 4) - o2;
            }
        }
    }
}

/* q5_K (176 bytes): as q4_K plus 32 bytes qh before the nibbles: bit 2c of qh[l] is the 5th bit
 * of element 64c + l, bit 2c+1 that of element 64c + 32 + l. */
static void deq_q5_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 176) {
        float d = ferry__h2f(ferry__ld16(p)), dmin = ferry__h2f(ferry__ld16(p + 2));
        const uint8_t *scales = p + 4, *qh = p + 16, *q = p + 48;
        for (int c = 0; c < 4; c++, q += 32, y += 64) {
            int sc1, m1, sc2, m2;
            ferry__k4_scale_min(scales, 2 * c, &sc1, &m1);
            ferry__k4_scale_min(scales, 2 * c + 1, &sc2, &m2);
            float d1 = d * (float)sc1, o1 = dmin * (float)m1;
            float d2 = d * (float)sc2, o2 = dmin * (float)m2;
            for (int l = 0; l < 32; l++) {
                int lo = (q[l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
                int hi = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                y[l] = d1 * (float)lo - o1;
                y[l + 32] = d2 * (float)hi - o2;
            }
        }
    }
}

/* q6_K (210 bytes): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales,
 * f16 d. Each 128-element half uses 64 ql bytes, 32 qh bytes and 8 scales (one per 16).
 * x = d * sc * (q - 32). */
static void deq_q6_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 210) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = ferry__h2f(ferry__ld16(p + 208));
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

/* q8_K (292 bytes): f32 d, 256 int8, 16 int16 group sums (not needed here). */
static void deq_q8_k(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 292, y += 256) {
        float d = ferry__bits_f32(ferry__ld32(p));
        const int8_t *q = (const int8_t *)(p + 4);
        for (int j = 0; j < 256; j++)
            y[j] = (float)q[j] * d;
    }
}

/* The 16 levels of the non-linear 4-bit types. */
static const int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

/* iq4_nl (18 bytes): f16 d, 16 nibble bytes; x = d * level[q]. */
static void deq_iq4_nl(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 18, y += 32) {
        float d = ferry__h2f(ferry__ld16(p));
        const uint8_t *q = p + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)iq4_levels[q[j] & 15];
            y[j + 16] = d * (float)iq4_levels[q[j] >> 4];
        }
    }
}

/* iq4_xs (136 bytes): f16 d, u16 scales_h, 4 bytes scales_l, 128 nibble bytes; eight 32-element
 * groups with six-bit scales (low 4 bits in scales_l nibbles, high 2 in scales_h), offset 32. */
static void deq_iq4_xs(const uint8_t *p, float *y, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, p += 136) {
        float d = ferry__h2f(ferry__ld16(p));
        unsigned sh = ferry__ld16(p + 2);
        const uint8_t *sl = p + 4, *q = p + 8;
        for (int g = 0; g < 8; g++, q += 16, y += 32) {
            int ls = ((sl[g / 2] >> (4 * (g % 2))) & 15) | (int)(((sh >> (2 * g)) & 3u) << 4);
            float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)iq4_levels[q[j] & 15];
                y[j + 16] = dl * (float)iq4_levels[q[j] >> 4];
            }
        }
    }
}

/* mxfp4 (17 bytes): E8M0 scale byte, 16 nibble bytes of E2M1 values. */
static void deq_mxfp4(const uint8_t *p, float *y, uint64_t nb)
{
    static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (uint64_t i = 0; i < nb; i++, p += 17, y += 32) {
        float d = f8_e8m0_to_f32(p[0]);
        const uint8_t *q = p + 1;
        for (int j = 0; j < 16; j++) {
            y[j] = d * e2m1[q[j] & 15];
            y[j + 16] = d * e2m1[q[j] >> 4];
        }
    }
}

int ferry__to_f32(ferry_dtype t, const void *in, float *out, uint64_t n)
{
    if (!ferry__dtype_readable(t))
        return FERRY_EDTYPE;
    uint64_t blck = ferry_dtype_block_elems(t);
    if (n % blck != 0)
        return FERRY_ESHAPE;
    if (n == 0)
        return 0;
    const uint8_t *p = in;
    uint64_t nb = n / blck;
    switch (t) {
    case FERRY_DTYPE_F32:
        if ((const void *)out != in)
            memmove(out, in, n * sizeof(float));
        break;
    case FERRY_DTYPE_F16:
        f16_row_to_f32(p, out, n);
        break;
    case FERRY_DTYPE_BF16:
        bf16_row_to_f32(p, out, n);
        break;
    case FERRY_DTYPE_F64:
        for (uint64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, sizeof v);
            out[i] = (float)v;
        }
        break;
#define INT_CASE(T, CT)                                                                            \
    case T:                                                                                        \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            CT v;                                                                                  \
            memcpy(&v, p + sizeof(CT) * i, sizeof v);                                              \
            out[i] = (float)v;                                                                     \
        }                                                                                          \
        break;
        INT_CASE(FERRY_DTYPE_I8, int8_t)
        INT_CASE(FERRY_DTYPE_I16, int16_t)
        INT_CASE(FERRY_DTYPE_I32, int32_t)
        INT_CASE(FERRY_DTYPE_I64, int64_t)
        INT_CASE(FERRY_DTYPE_U8, uint8_t)
        INT_CASE(FERRY_DTYPE_U16, uint16_t)
        INT_CASE(FERRY_DTYPE_U32, uint32_t)
        INT_CASE(FERRY_DTYPE_U64, uint64_t)
#undef INT_CASE
    case FERRY_DTYPE_BOOL:
        for (uint64_t i = 0; i < n; i++)
            out[i] = p[i] ? 1.0f : 0.0f;
        break;
    case FERRY_DTYPE_F8_E4M3:
        for (uint64_t i = 0; i < n; i++)
            out[i] = f8_e4m3_to_f32(p[i]);
        break;
    case FERRY_DTYPE_F8_E5M2:
        for (uint64_t i = 0; i < n; i++)
            out[i] = f8_e5m2_to_f32(p[i]);
        break;
    case FERRY_DTYPE_F8_E8M0:
        for (uint64_t i = 0; i < n; i++)
            out[i] = f8_e8m0_to_f32(p[i]);
        break;
    case FERRY_DTYPE_Q4_0: deq_q4_0(p, out, nb); break;
    case FERRY_DTYPE_Q4_1: deq_q4_1(p, out, nb); break;
    case FERRY_DTYPE_Q5_0: deq_q5_0(p, out, nb); break;
    case FERRY_DTYPE_Q5_1: deq_q5_1(p, out, nb); break;
    case FERRY_DTYPE_Q8_0: deq_q8(p, out, nb, 34); break;
    case FERRY_DTYPE_Q8_1: deq_q8(p, out, nb, 36); break;
    case FERRY_DTYPE_Q2_K: deq_q2_k(p, out, nb); break;
    case FERRY_DTYPE_Q3_K: deq_q3_k(p, out, nb); break;
    case FERRY_DTYPE_Q4_K: deq_q4_k(p, out, nb); break;
    case FERRY_DTYPE_Q5_K: deq_q5_k(p, out, nb); break;
    case FERRY_DTYPE_Q6_K: deq_q6_k(p, out, nb); break;
    case FERRY_DTYPE_Q8_K: deq_q8_k(p, out, nb); break;
    case FERRY_DTYPE_IQ4_NL: deq_iq4_nl(p, out, nb); break;
    case FERRY_DTYPE_IQ4_XS: deq_iq4_xs(p, out, nb); break;
    case FERRY_DTYPE_MXFP4: deq_mxfp4(p, out, nb); break;
    default:
        return FERRY_EDTYPE; /* unreachable: ferry__dtype_readable said yes */
    }
    return 0;
}

/* ---- quantizers: NB whole blocks of 32 from X to P ------------------------------------------- */

/* These portable loops are the reference: quant_x86.c has AVX2 versions of q4_0, q8_0 and q8_1
 * (and of bf16 above) that must give the same bytes for every input; a change here is a change
 * there (tests/test_quantize.c compares the two). */

/* The integer part of V clamped to [0, HI]; NaN gives 0. V is already offset and rounded by
 * the caller's +0.5 the way GGUF's reference quantizers do it (truncation of a value >= 0). */
static inline int trunc_clamp(float v, int hi)
{
    if (!(v >= 0.0f))
        return 0;
    if (v >= (float)hi)
        return hi;
    return (int)v;
}

/* q8_0 / q8_1: d = amax / 127, q = round(x / d); q8_1 also stores s = d * sum(q). */
static void quant_q8(const float *x, uint8_t *p, uint64_t nb, int with_sum)
{
    unsigned bsize = with_sum ? 36 : 34;
    for (uint64_t i = 0; i < nb; i++, x += 32, p += bsize) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t *q = (int8_t *)(p + bsize - 32);
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            float v = roundf(x[j] * id);
            int iv = !(v == v) ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v;
            q[j] = (int8_t)iv;
            sum += iv;
        }
        uint16_t hd = ferry__f2h(d);
        memcpy(p, &hd, 2);
        if (with_sum) {
            uint16_t hs = ferry__f2h((float)sum * d);
            memcpy(p + 2, &hs, 2);
        }
    }
}

/* The element of largest magnitude (the first one when several tie), keeping its sign. */
static float signed_amax(const float *x)
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

/* q4_0: d = max / -8 (max: the element of largest magnitude), q = clamp(round(x/d) + 8, 0, 15);
 * q5_0 alike with 16 levels each side. */
static void quant_q4_0(const float *x, uint8_t *p, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 32, p += 18) {
        float d = signed_amax(x) / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = ferry__f2h(d);
        memcpy(p, &hd, 2);
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(x[j] * id + 8.5f, 15);
            int hi = trunc_clamp(x[j + 16] * id + 8.5f, 15);
            p[2 + j] = (uint8_t)(lo | hi << 4);
        }
    }
}

static void quant_q5_0(const float *x, uint8_t *p, uint64_t nb)
{
    for (uint64_t i = 0; i < nb; i++, x += 32, p += 22) {
        float d = signed_amax(x) / -16.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = ferry__f2h(d);
        memcpy(p, &hd, 2);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp(x[j] * id + 16.5f, 31);
            int hi = trunc_clamp(x[j + 16] * id + 16.5f, 31);
            p[6 + j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        memcpy(p + 2, &qh, 4);
    }
}

/* q4_1 / q5_1: d = (max - min) / levels, m = min, q = clamp(round((x - min) / d)). */
static void quant_q_1(const float *x, uint8_t *p, uint64_t nb, int five)
{
    unsigned bsize = five ? 24 : 20, qoff = five ? 8 : 4;
    int top = five ? 31 : 15;
    for (uint64_t i = 0; i < nb; i++, x += 32, p += bsize) {
        float mn = x[0], mx = x[0];
        for (int j = 1; j < 32; j++) {
            mn = x[j] < mn ? x[j] : mn;
            mx = x[j] > mx ? x[j] : mx;
        }
        float d = (mx - mn) / (float)top;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = ferry__f2h(d), hm = ferry__f2h(mn);
        memcpy(p, &hd, 2);
        memcpy(p + 2, &hm, 2);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = trunc_clamp((x[j] - mn) * id + 0.5f, top);
            int hi = trunc_clamp((x[j + 16] - mn) * id + 0.5f, top);
            p[qoff + j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        if (five)
            memcpy(p + 4, &qh, 4);
    }
}

int ferry__from_f32(ferry_dtype t, const float *in, void *out, uint64_t n)
{
    if (!ferry__dtype_writable(t))
        return FERRY_EDTYPE;
    uint64_t blck = ferry_dtype_block_elems(t);
    if (n % blck != 0)
        return FERRY_ESHAPE;
    if (n == 0)
        return 0;
    uint8_t *p = out;
    uint64_t nb = n / blck;
    switch (t) {
    case FERRY_DTYPE_F32:
        if (out != (const void *)in)
            memmove(out, in, n * sizeof(float));
        break;
    case FERRY_DTYPE_F16:
        f32_row_to_f16(in, p, n);
        break;
    case FERRY_DTYPE_BF16:
        f32_row_to_bf16(in, p, n);
        break;
    case FERRY_DTYPE_F64:
        for (uint64_t i = 0; i < n; i++) {
            double v = in[i];
            memcpy(p + 8 * i, &v, sizeof v);
        }
        break;
    case FERRY_DTYPE_Q8_0:
    case FERRY_DTYPE_Q8_1:
#ifdef FERRY_QUANT_X86
        if (ferry__dtype_use_avx2()) {
            ferry__quant_q8_avx2(in, p, nb, t == FERRY_DTYPE_Q8_1);
            break;
        }
#endif
        quant_q8(in, p, nb, t == FERRY_DTYPE_Q8_1);
        break;
    case FERRY_DTYPE_Q4_0:
#ifdef FERRY_QUANT_X86
        if (ferry__dtype_use_avx2()) {
            ferry__quant_q4_0_avx2(in, p, nb);
            break;
        }
#endif
        quant_q4_0(in, p, nb);
        break;
    case FERRY_DTYPE_Q5_0: quant_q5_0(in, p, nb); break;
    case FERRY_DTYPE_Q4_1: quant_q_1(in, p, nb, 0); break;
    case FERRY_DTYPE_Q5_1: quant_q_1(in, p, nb, 1); break;
    default:
        return FERRY_EDTYPE; /* unreachable: ferry__dtype_writable said yes */
    }
    return 0;
}

/* ---- the public conversion ------------------------------------------------------------------- */

int ferry_dtype_can_convert(ferry_dtype src, ferry_dtype dst)
{
    if (!ferry__dtype_valid(src) || !ferry__dtype_valid(dst))
        return 0;
    if (src == dst)
        return 1;
    return ferry__dtype_readable(src) && ferry__dtype_writable(dst);
}

/* Elements per chunk of the f32 staging buffer: a multiple of every block size (32, 256), small
 * enough for the stack (16 KiB). */
#define CONVERT_CHUNK 4096

int ferry_dtype_convert(ferry_dtype src, const void *in, ferry_dtype dst, void *out, uint64_t n)
{
    if (!ferry__dtype_valid(src) || !ferry__dtype_valid(dst))
        return FERRY_EDTYPE;
    uint64_t in_bytes, out_bytes;
    int rc = ferry_dtype_nbytes(src, n, &in_bytes);
    if (rc == 0)
        rc = ferry_dtype_nbytes(dst, n, &out_bytes);
    if (rc != 0)
        return rc;
    if (!ferry_dtype_can_convert(src, dst))
        return FERRY_EDTYPE;
    if (n == 0)
        return 0;
    if (!in || !out)
        return FERRY_EINVAL;
    if (in_bytes > SIZE_MAX || out_bytes > SIZE_MAX)
        return FERRY_EOVERFLOW;
    if (src == dst) {
        memmove(out, in, (size_t)in_bytes);
        return 0;
    }
    /* f32 at either end is used in place when it is aligned (data inside a safetensors file
     * need not be); otherwise it is staged through the buffer with memcpy. */
    if (src == FERRY_DTYPE_F32 && (uintptr_t)in % _Alignof(float) == 0)
        return ferry__from_f32(dst, in, out, n);
    if (dst == FERRY_DTYPE_F32 && (uintptr_t)out % _Alignof(float) == 0)
        return ferry__to_f32(src, in, out, n);

    /* Through f32, one chunk at a time. CONVERT_CHUNK is a whole number of blocks of both
     * types, so every chunk starts on a block boundary of both; the last one is whole blocks
     * too because n is (checked above). */
    float buf[CONVERT_CHUNK];
    uint64_t ib = ferry_dtype_block_bytes(src), ie = ferry_dtype_block_elems(src);
    uint64_t ob = ferry_dtype_block_bytes(dst), oe = ferry_dtype_block_elems(dst);
    const uint8_t *ip = in;
    uint8_t *op = out;
    for (uint64_t done = 0; done < n;) {
        uint64_t c = FERRY__MIN(n - done, (uint64_t)CONVERT_CHUNK);
        if (src == FERRY_DTYPE_F32)
            memcpy(buf, ip, c * sizeof(float));
        else if ((rc = ferry__to_f32(src, ip, buf, c)) != 0)
            return rc;
        if (dst == FERRY_DTYPE_F32)
            memcpy(op, buf, c * sizeof(float));
        else if ((rc = ferry__from_f32(dst, buf, op, c)) != 0)
            return rc;
        ip += c / ie * ib;
        op += c / oe * ob;
        done += c;
    }
    return 0;
}
