/*
 * test_matvec_order.c — ferry_matvec_q gives llama.cpp's bits, not only its values: the float
 * sums of q8_0, q4_0, q4_K, q5_K and q6_K rows follow its x86 kernels for AVX-512 VNNI / AMX-INT8 CPUs
 * (and its repacked q4_0 kernel): per block (super-block for the k-quants) the exact integer sum
 * times the f32 product of the weight's and the vector's scales, one fma per block into one
 * accumulator, blocks in order; q4_K's and q5_K's min term a second fma per block, subtracting, into the
 * same accumulator. On the portable and the AVX2 path alike. The expected values are computed
 * here from the GGUF block layouts, element by element.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "xorshift.h"
#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng(void) { return xorshift_u32(&rng_state); }
static float frand(void) { return xorshift_unit(&rng_state); }

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return ferry__f16_to_f32(h);
}

/* q4_K's 6-bit scale and min of sub-block J from the 12 packed bytes S (GGUF layout) */
static void k4_sm(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* the prepared q8_K vector: float d, 256 int8, 16 int16 sums per block; the scale */
static float q8k_d(const uint8_t *b)
{
    float d;
    memcpy(&d, b, 4);
    return d;
}

static float want_q4_0(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++, w += 18, xq += 34) {
        const int8_t *x = (const int8_t *)(xq + 2);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++)
            isum += ((w[2 + j] & 15) - 8) * x[j] + ((w[2 + j] >> 4) - 8) * x[j + 16];
        acc = fmaf((float)isum, f16_at(w) * f16_at(xq), acc);
    }
    return acc;
}

static float want_q8_0(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++, w += 34, xq += 34) {
        const int8_t *a = (const int8_t *)(w + 2), *x = (const int8_t *)(xq + 2);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++)
            isum += a[j] * x[j];
        acc = fmaf((float)isum, f16_at(w) * f16_at(xq), acc);
    }
    return acc;
}

static float want_q4_k(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 144, xq += 4 + 256 + 32) {
        const int8_t *x = (const int8_t *)(xq + 4);
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, s = 0, xs = 0;
            k4_sm(w + 4, j, &sc, &m);
            for (int l = 0; l < 32; l++) {
                uint8_t byte = w[16 + 32 * (j / 2) + l];
                s += ((j & 1) ? byte >> 4 : byte & 15) * x[32 * j + l];
                xs += x[32 * j + l];
            }
            isum += sc * s;
            imin += m * xs;
        }
        float dx = q8k_d(xq);
        acc = fmaf((float)isum, f16_at(w) * dx, acc);
        acc = fmaf(-(float)imin, f16_at(w + 2) * dx, acc);
    }
    return acc;
}

static float want_q5_k(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 176, xq += 4 + 256 + 32) {
        const int8_t *x = (const int8_t *)(xq + 4);
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, s = 0, xs = 0;
            k4_sm(w + 4, j, &sc, &m);
            for (int l = 0; l < 32; l++) {
                uint8_t byte = w[48 + 32 * (j / 2) + l];
                int q = ((j & 1) ? byte >> 4 : byte & 15) | (((w[16 + l] >> j) & 1) << 4);
                s += q * x[32 * j + l];
                xs += x[32 * j + l];
            }
            isum += sc * s;
            imin += m * xs;
        }
        float dx = q8k_d(xq);
        acc = fmaf((float)isum, f16_at(w) * dx, acc);
        acc = fmaf(-(float)imin, f16_at(w + 2) * dx, acc);
    }
    return acc;
}

static float want_q6_k(const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    float acc = 0.0f;
    for (uint64_t b = 0; b < n / 256; b++, w += 210, xq += 4 + 256 + 32) {
        const int8_t *x = (const int8_t *)(xq + 4), *sc = (const int8_t *)(w + 192);
        int32_t isum = 0;
        for (int e = 0; e < 256; e++) {
            int h = e / 128, r = e % 128, g = r / 32, l = r % 32;
            uint8_t lo = w[64 * h + l + 32 * (g & 1)];
            int q = ((g & 2) ? lo >> 4 : lo & 15) | (((w[128 + 32 * h + l] >> (2 * g)) & 3) << 4);
            isum += sc[e / 16] * (q - 32) * x[e];
        }
        acc = fmaf((float)isum, f16_at(w + 208) * q8k_d(xq), acc);
    }
    return acc;
}

/* ROWS random rows of type T: q8_0 and q4_0 quantized from floats, the k-quants random bytes with
 * weight-sized f16 scales. */
static void fill(ferry_dtype t, uint8_t *w, uint64_t rows, uint64_t n, float *tmp)
{
    uint64_t rb = 0;
    CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &rb), 0);
    for (uint64_t r = 0; r < rows; r++) {
        uint8_t *p = w + r * rb;
        if (t == FERRY_DTYPE_Q4_0 || t == FERRY_DTYPE_Q8_0) {
            for (uint64_t i = 0; i < n; i++)
                tmp[i] = 0.02f * frand();
            CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, tmp, t, p, n), 0);
            continue;
        }
        uint64_t bb = ferry_dtype_block_bytes(t);
        for (uint64_t i = 0; i < rb; i++)
            p[i] = (uint8_t)rng();
        for (uint64_t b = 0; b < n / 256; b++) {
            uint16_t h = ferry__f32_to_f16(1e-4f * (float)(1 + rng() % 8));
            if (t == FERRY_DTYPE_Q4_K || t == FERRY_DTYPE_Q5_K) {
                memcpy(p + b * bb, &h, 2);
                memcpy(p + b * bb + 2, &h, 2);
            } else {
                memcpy(p + b * bb + 208, &h, 2);
            }
        }
    }
}

int main(void)
{
    enum { ROWS = 64, N = 2048, NMAX = N + 96 };
    static const ferry_dtype types[] = {FERRY_DTYPE_Q8_0, FERRY_DTYPE_Q4_0, FERRY_DTYPE_Q4_K,
                                        FERRY_DTYPE_Q5_K, FERRY_DTYPE_Q6_K};
    static uint8_t w[ROWS * (NMAX / 32) * 34], xq[NMAX * 2]; /* q8_0 is the widest row */
    static float x[NMAX], tmp[NMAX], y[ROWS];
    int avx2 = ferry__dtype_use_avx2();
    for (uint64_t i = 0; i < NMAX; i++)
        x[i] = frand() * (i % 13 == 0 ? 4.0f : 1.0f);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        ferry_dtype t = types[ti];
        /* 64 blocks of 32; for q8_0 and q4_0 also 67, which kernels taking several blocks a step
         * end with a partial step */
        int lens = t == FERRY_DTYPE_Q8_0 || t == FERRY_DTYPE_Q4_0 ? 2 : 1;
        for (int li = 0; li < lens; li++) {
            uint64_t n = li ? NMAX : N, rb = 0;
            CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &rb), 0);
            fill(t, w, ROWS, n, tmp);
            CHECK_EQ_INT(ferry_matvec_vec_quantize(t, x, n, xq), 0);
            /* the best kernel set this CPU has, AVX-512 without VBMI, AVX2, portable (a cap
             * above the CPU's is no cap) */
            const int caps[] = {-1, FERRY__ISA_AVX512, FERRY__ISA_AVX2, FERRY__ISA_GENERIC};
            for (int isa = 0; isa < 4; isa++) {
                int generic = isa == 3 || !avx2;
                ferry__dtype_force_isa(generic ? FERRY__ISA_GENERIC : caps[isa]);
                CHECK_EQ_INT(ferry_matvec_q(t, w, ROWS, n, xq, y), 0);
                int bad = 0;
                for (int r = 0; r < ROWS; r++) {
                    const uint8_t *row = w + r * rb;
                    float want = t == FERRY_DTYPE_Q8_0   ? want_q8_0(row, xq, n)
                                 : t == FERRY_DTYPE_Q4_0 ? want_q4_0(row, xq, n)
                                 : t == FERRY_DTYPE_Q4_K ? want_q4_k(row, xq, n)
                                 : t == FERRY_DTYPE_Q5_K ? want_q5_k(row, xq, n)
                                                         : want_q6_k(row, xq, n);
                    if (memcmp(&want, &y[r], sizeof want) != 0) {
                        if (!bad)
                            fprintf(stderr, "%s n=%llu row %d (%s): %.9g, expected %.9g\n",
                                    ferry_dtype_name(t), (unsigned long long)n, r,
                                    ferry__dot_isa(), (double)y[r], (double)want);
                        bad++;
                    }
                }
                CHECK_EQ_INT(bad, 0);
                ferry__dtype_force_isa(-1);
            }
        }
    }
    return check_finish();
}
