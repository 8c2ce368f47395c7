/*
 * test_matvec_q.c — ferry_matvec_vec_quantize / ferry_matvec_q, the llama.cpp-shaped products:
 * the prepared vector is what its format says (q8_0: d = amax / 127; q8_K: d = -max / 127 with the
 * 16 block sums of its quants; f16 / bf16 precision), and every product, portable and AVX2, equals
 * dequantize-then-multiply (weights and prepared vector dequantized to f32, summed in double) for
 * f32, f16, bf16, q8_0, q4_0, q4_K and q6_K, on rows of several lengths and row blocks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "xorshift.h"
#include "weights_fixture.h"
#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { return xorshift_unit(&rng_state); }

static ferry_dtype vec_type(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q4_0: return FERRY_DTYPE_Q8_0;
    case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K: case FERRY_DTYPE_Q6_K: return FERRY_DTYPE_Q8_K;
    default: return FERRY_DTYPE_F32;
    }
}

/* The prepared vector is what its type says about X. */
static void check_vector(ferry_dtype t, const float *x, const uint8_t *xq, uint64_t n)
{
    ferry_dtype vt = vec_type(t);
    if (vt == FERRY_DTYPE_Q8_0) {
        for (uint64_t b = 0; b < n / 32; b++) {
            const uint8_t *p = xq + 34 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[32 * b + j]));
            float d = ferry__f16_to_f32(ferry__ld16(p));
            CHECK(fabsf(d - amax / 127.0f) <= amax / 127.0f / 1024.0f + 1e-12f);
            for (int j = 0; j < 32; j++) {
                float want = d > 0 ? roundf(x[32 * b + j] * 127.0f / amax) : 0.0f;
                CHECK(fabsf((float)(int8_t)p[2 + j] - want) <= 1.0f);
            }
        }
    } else if (vt == FERRY_DTYPE_Q8_K) {
        for (uint64_t b = 0; b < n / 256; b++) {
            const uint8_t *p = xq + 292 * b;
            const int8_t *q = (const int8_t *)(p + 4);
            float d, amax = 0;
            memcpy(&d, p, 4);
            for (int j = 0; j < 256; j++)
                amax = fmaxf(amax, fabsf(x[256 * b + j]));
            CHECK(fabsf(fabsf(d) - amax / 127.0f) <= amax * 1e-6f);
            for (int j = 0; j < 256; j++)
                CHECK(fabsf((float)q[j] * d - x[256 * b + j]) <= fabsf(d) * 0.5001f);
            for (int g = 0; g < 16; g++) {
                int s = 0;
                int16_t bs;
                for (int j = 0; j < 16; j++)
                    s += q[16 * g + j];
                memcpy(&bs, p + 260 + 2 * g, 2);
                CHECK_EQ_INT(bs, s);
            }
        }
    } else {
        const float *f = (const float *)xq;
        for (uint64_t i = 0; i < n; i++) {
            float want = t == FERRY_DTYPE_F16    ? ferry__f16_to_f32(ferry__f32_to_f16(x[i]))
                         : t == FERRY_DTYPE_BF16 ? ferry__bf16_to_f32(ferry__f32_to_bf16(x[i]))
                                                 : x[i];
            CHECK(f[i] == want);
        }
    }
}

int main(void)
{
    enum { ROWS = 11, MAXC = 16384 + 256 }; /* eight rows at a time, then three alone */
    static const ferry_dtype types[] = {FERRY_DTYPE_F32,  FERRY_DTYPE_F16,  FERRY_DTYPE_BF16,
                                        FERRY_DTYPE_Q8_0, FERRY_DTYPE_Q4_0, FERRY_DTYPE_Q4_K,
                                        FERRY_DTYPE_Q5_K, FERRY_DTYPE_Q6_K};
    static uint8_t w[ROWS * MAXC * 4], xq[MAXC * 4 + 64];
    static float x[MAXC], tmp[MAXC], wd[MAXC], xd[MAXC], y[ROWS], y2[ROWS];
    /* the longest beyond what the q4_0 kernel prepares its vector for on the stack */
    const uint64_t lens[] = {256, 512, 2048 + 256, 16384 + 256};
    /* the kernel sets: the best this CPU has, AVX-512 without VBMI, AVX2, portable (a cap above
     * the CPU's is no cap) */
    const int caps[] = {-1, FERRY__ISA_AVX512, FERRY__ISA_AVX2, FERRY__ISA_GENERIC};
    int isas = 4;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        ferry_dtype t = types[ti];
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            uint64_t n = lens[li], rb = 0;
            CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &rb), 0);
            for (uint64_t i = 0; i < n; i++)
                x[i] = frand() * (i % 17 == 0 ? 3.0f : 1.0f);
            for (int r = 0; r < ROWS; r++)
                fixture_fill_weights(t, w + r * rb, n, tmp, &rng_state, 0);
            uint64_t vb = ferry_matvec_vec_bytes(t, n);
            CHECK(vb > 0 && vb <= sizeof xq);
            CHECK_EQ_INT(ferry_matvec_vec_quantize(t, x, n, xq), 0);
            check_vector(t, x, xq, n);
            /* the reference: both sides dequantized, summed in double */
            ferry_dtype vt = vec_type(t);
            if (vt == FERRY_DTYPE_F32)
                memcpy(xd, xq, n * sizeof *xd);
            else
                CHECK_EQ_INT(ferry_dtype_convert(vt, xq, FERRY_DTYPE_F32, xd, n), 0);
            for (int isa = 0; isa < isas; isa++) {
                ferry__dtype_force_isa(caps[isa]);
                CHECK_EQ_INT(ferry_matvec_q(t, w, ROWS, n, xq, y), 0);
                /* a block of rows gives the same values as the whole */
                CHECK_EQ_INT(ferry_matvec_q(t, w + 2 * rb, 3, n, xq, y2), 0);
                for (int r = 0; r < 3; r++)
                    CHECK(y2[r] == y[2 + r]);
                for (int r = 0; r < ROWS; r++) {
                    CHECK_EQ_INT(ferry_dtype_convert(t, w + r * rb, FERRY_DTYPE_F32, wd, n), 0);
                    double ref = 0, mag = 0;
                    for (uint64_t i = 0; i < n; i++) {
                        ref += (double)wd[i] * xd[i];
                        mag += fabs((double)wd[i] * xd[i]);
                    }
                    if (!(fabs(y[r] - ref) <= 2e-6 * mag + 1e-9)) {
                        fprintf(stderr, "%s n=%llu row %d (%s): %.9g vs %.9g (mag %g)\n",
                                ferry_dtype_name(t), (unsigned long long)n, r, ferry__dot_isa(),
                                (double)y[r], ref, mag);
                        CHECK(0);
                    }
                }
            }
            ferry__dtype_force_generic(0);
        }
    }
    /* bad arguments */
    CHECK_EQ_INT((int)ferry_matvec_vec_bytes(FERRY_DTYPE_Q4_K, 128), 0);
    CHECK_EQ_INT((int)ferry_matvec_vec_bytes(FERRY_DTYPE_IQ2_XXS, 256), 0);
    CHECK_EQ_INT(ferry_matvec_vec_quantize(FERRY_DTYPE_Q8_0, x, 48, xq), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_matvec_vec_quantize(FERRY_DTYPE_MXFP4 + 1, x, 32, xq), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_matvec_vec_quantize(FERRY_DTYPE_Q8_0, NULL, 32, xq), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_matvec_q(FERRY_DTYPE_Q4_0, w, 1, 48, xq, y), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_matvec_q(FERRY_DTYPE_Q4_0, NULL, 1, 32, xq, y), FERRY_EINVAL);
    /* an all-zero vector quantizes to zeros and gives zero products */
    memset(x, 0, sizeof x);
    CHECK_EQ_INT(ferry_matvec_vec_quantize(FERRY_DTYPE_Q6_K, x, 256, xq), 0);
    CHECK_EQ_INT(ferry_matvec_q(FERRY_DTYPE_Q6_K, w, 1, 256, xq, y), 0);
    CHECK(y[0] == 0.0f);
    return check_finish();
}
