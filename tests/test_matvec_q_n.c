/*
 * test_matvec_q_n.c — ferry_matvec_q_n, the product of a weight with several prepared vectors:
 * every vector's every row has the bits of ferry_matvec_q for that row and vector, on every
 * kernel set this CPU runs, for every type it takes (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K,
 * q6_K), row counts that are and are not multiples of four, 1 to 9 vectors and more, rows of one
 * block to more than one chunk of blocks, and strides wider than a vector. For q8_0 and q4_0 the
 * value is also the definition computed here from the formats (per block the exact integer sum,
 * one fma with the product of the two f16 scales, blocks in order), and close to the product of
 * the dequantized values summed in double. The counts of vectors cover the multi-vector kernels'
 * steps (AVX-512 VNNI: four to a register, sixteen a pass; AVX2: two to a register, eight a
 * step, thirty-two a pass) whole, partial and with one vector left over. Bad arguments give
 * ferry_matvec_q's errors.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "xorshift.h"
#include "weights_fixture.h"
#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { return xorshift_unit(&rng_state); }

/* f16 -> f32 from the IEEE definition (sign, five exponent bits, ten mantissa bits). */
static float half_value(const uint8_t *p)
{
    unsigned h = (unsigned)p[0] | (unsigned)p[1] << 8;
    int e = (int)(h >> 10 & 31);
    double m = (double)(h & 1023);
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024.0 + m, e - 25);
    return (float)(h & 0x8000 ? -v : v);
}

/* The weight element J (0..31) of the q8_0 (q4_0) block P: int8 q, or low / high nibble - 8. */
static int weight_q(ferry_dtype t, const uint8_t *p, int j)
{
    if (t == FERRY_DTYPE_Q8_0)
        return (int8_t)p[2 + j];
    return j < 16 ? (p[2 + j] & 15) - 8 : (p[2 + j - 16] >> 4) - 8;
}

/* The definition for a q8_0 or q4_0 row of N elements against the q8_0 vector XQ. */
static float want_row(ferry_dtype t, const uint8_t *w, const uint8_t *xq, uint64_t n)
{
    uint64_t bs = t == FERRY_DTYPE_Q8_0 ? 34 : 18;
    float s = 0.0f;
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *p = w + bs * b, *x = xq + 34 * b;
        long sum = 0;
        for (int j = 0; j < 32; j++)
            sum += (long)weight_q(t, p, j) * (int8_t)x[2 + j];
        s = fmaf((float)sum, half_value(p) * half_value(x), s);
    }
    return s;
}

/* The same row and vector dequantized and summed in double; *MAG the sum of magnitudes. */
static double want_double(ferry_dtype t, const uint8_t *w, const uint8_t *xq, uint64_t n,
                          double *mag)
{
    uint64_t bs = t == FERRY_DTYPE_Q8_0 ? 34 : 18;
    double s = 0, m = 0;
    for (uint64_t b = 0; b < n / 32; b++) {
        const uint8_t *p = w + bs * b, *x = xq + 34 * b;
        for (int j = 0; j < 32; j++) {
            double v = (double)half_value(p) * weight_q(t, p, j) * half_value(x) * (int8_t)x[2 + j];
            s += v;
            m += fabs(v);
        }
    }
    *mag = m;
    return s;
}

enum { ROWS = 27, MAXC = 4096 + 256, MAXV = 33, YPAD = 5 };

static uint8_t w[ROWS * (MAXC / 32) * 128], xq[MAXV * (MAXC * 4 + 64)];
static float x[MAXC], tmp[MAXC], y[MAXV * (ROWS + YPAD)], y1v[ROWS];

int main(void)
{
    static const ferry_dtype types[] = {FERRY_DTYPE_Q8_0, FERRY_DTYPE_Q4_0, FERRY_DTYPE_F32,
                                        FERRY_DTYPE_F16,  FERRY_DTYPE_BF16, FERRY_DTYPE_Q4_K,
                                        FERRY_DTYPE_Q5_K, FERRY_DTYPE_Q6_K};
    /* one block; a partial step of four blocks; more than one chunk of 32 blocks, and a chunk
     * and a bit; the longest */
    static const uint64_t lens[] = {32, 96, 256, 1056, 2048 + 256, 4096 + 256};
    static const uint64_t row_counts[] = {1, 7, 8, 11, 16, 27};
    static const uint64_t nvecs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 33};
    /* the best kernel set this CPU has, AVX-512 without VBMI, AVX2, portable (a cap above the
     * CPU's is no cap) */
    static const int caps[] = {-1, FERRY__ISA_AVX512, FERRY__ISA_AVX2, FERRY__ISA_GENERIC};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        ferry_dtype t = types[ti];
        int q80 = t == FERRY_DTYPE_Q8_0 || t == FERRY_DTYPE_Q4_0;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            uint64_t n = lens[li], rb = 0;
            if (n % ferry_dtype_block_elems(t) != 0)
                continue;
            CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &rb), 0);
            for (int r = 0; r < ROWS; r++)
                fixture_fill_weights(t, w + r * rb, n, tmp, &rng_state, 1);
            /* the vectors, with a stride wider than one, the gap filled with junk */
            uint64_t vb = ferry_matvec_vec_bytes(t, n), xs = vb + 40;
            CHECK(vb > 0 && MAXV * xs <= sizeof xq);
            memset(xq, 0xa5, sizeof xq);
            for (int v = 0; v < MAXV; v++) {
                for (uint64_t i = 0; i < n; i++)
                    x[i] = frand() * (i % 17 == (uint64_t)v % 17 ? 3.0f : 1.0f);
                CHECK_EQ_INT(ferry_matvec_vec_quantize(t, x, n, xq + v * xs), 0);
            }
            for (int isa = 0; isa < 4; isa++) {
                ferry__dtype_force_isa(caps[isa]);
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
                /* the AVX2 cap runs the AVX2 kernels where the CPU has them */
                if (caps[isa] == FERRY__ISA_AVX2 && __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma")
#if !defined(__clang__)
                    && __builtin_cpu_supports("f16c")
#endif
                )
                    CHECK(strcmp(ferry__dot_isa(), "avx2") == 0);
#endif
                for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
                    uint64_t rows = row_counts[ri], ys = rows + YPAD;
                    for (size_t vi = 0; vi < sizeof nvecs / sizeof nvecs[0]; vi++) {
                        uint64_t nv = nvecs[vi];
                        for (size_t i = 0; i < sizeof y / sizeof y[0]; i++)
                            y[i] = -12345.0f;
                        /* the first rows skipped: a block of rows that starts anywhere */
                        uint64_t skip = ROWS - rows;
                        CHECK_EQ_INT(ferry_matvec_q_n(t, w + skip * rb, rows, n, xq, nv, xs, y, ys),
                                     0);
                        int bad = 0, padbad = 0;
                        for (uint64_t v = 0; v < nv; v++) {
                            CHECK_EQ_INT(ferry_matvec_q(t, w + skip * rb, rows, n, xq + v * xs, y1v),
                                         0);
                            for (uint64_t r = 0; r < rows; r++) {
                                const float got = y[v * ys + r];
                                if (memcmp(&got, &y1v[r], sizeof got) != 0) {
                                    if (!bad)
                                        fprintf(stderr,
                                                "%s n=%llu rows=%llu nv=%llu v=%llu r=%llu (%s): "
                                                "%.9g, one at a time %.9g\n",
                                                ferry_dtype_name(t), (unsigned long long)n,
                                                (unsigned long long)rows, (unsigned long long)nv,
                                                (unsigned long long)v, (unsigned long long)r,
                                                ferry__dot_isa(), (double)got, (double)y1v[r]);
                                    bad++;
                                }
                                if (!q80)
                                    continue;
                                const uint8_t *row = w + (skip + r) * rb, *xv = xq + v * xs;
                                float def = want_row(t, row, xv, n);
                                if (memcmp(&def, &got, sizeof def) != 0)
                                    bad++;
                                double mag, ref = want_double(t, row, xv, n, &mag);
                                if (!(fabs(got - ref) <= 1e-5 * mag + 1e-9))
                                    bad++;
                            }
                            for (uint64_t r = rows; r < ys; r++)
                                padbad += y[v * ys + r] != -12345.0f;
                        }
                        for (uint64_t i = nv * ys; i < sizeof y / sizeof y[0]; i++)
                            padbad += y[i] != -12345.0f;
                        CHECK_EQ_INT(bad, 0);
                        CHECK_EQ_INT(padbad, 0);
                    }
                }
            }
            ferry__dtype_force_isa(-1);
        }
    }

    /* bad arguments: ferry_matvec_q's errors, and strides too small */
    uint64_t vb = ferry_matvec_vec_bytes(FERRY_DTYPE_Q4_0, 64);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 48, xq, 2, vb, y, 8), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, NULL, 8, 64, xq, 2, vb, y, 8), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, NULL, 2, vb, y, 8), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, xq, 2, vb, NULL, 8), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, xq, 2, vb - 1, y, 8), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, xq, 2, vb, y, 7), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_MXFP4 + 1, w, 8, 64, xq, 2, vb, y, 8),
                 ferry_matvec_q(FERRY_DTYPE_MXFP4 + 1, w, 8, 64, xq, y));
    /* one vector needs no strides; none computes nothing */
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, xq, 1, 0, y, 0), 0);
    y[0] = 7.0f;
    CHECK_EQ_INT(ferry_matvec_q_n(FERRY_DTYPE_Q4_0, w, 8, 64, xq, 0, 0, y, 0), 0);
    CHECK(y[0] == 7.0f);
    return check_finish();
}
