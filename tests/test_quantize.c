/*
 * test_quantize.c — the fast quantizers (src/dtype/quant_x86.c: AVX2 f32 -> q4_0, q8_0, q8_1, bf16;
 * F16C f32 -> f16) give exactly the bytes of the portable loops of convert.c, and both give
 * exactly the bytes of a reference written here from the formulas (so that neither path can drift
 * with the other). Inputs: random blocks at every scale from subnormal to near FLT_MAX, and the
 * blocks where an implementation could slip: all zeros, all negative zeros, +a and -a both at the
 * largest magnitude (in both orders), the largest magnitude repeated, quotients exactly halfway
 * between two integers, scales whose reciprocal overflows, infinities; NaN-free first (the
 * contract), then with NaNs sprinkled in (which the fast paths handle like the portable ones).
 * Block counts 1..17 and a large one exercise the eight-block groups and their padded tail.
 * On a CPU without AVX2 both runs take the portable path and the test says so.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"
#include "ferry.h"

static uint64_t rng_state = 0x0123456789abcdefull;
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float frand(void) { return (float)((double)(rng() >> 11) * 0x1p-53 * 2.0 - 1.0); }
static int irand(int n) { return (int)(rng() % (uint64_t)n); }

/* ---- references, from the formulas ---------------------------------------------------------- */

/* q4_0: m = the first element of largest magnitude (0 when none is above 0), d = m / -8,
 * q = clamp(trunc(x * (1/d) + 8.5), 0, 15) with NaN -> 0; byte j holds q[j] | q[j+16] << 4. */
static void ref_q4_0(const float *x, uint8_t *p, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32, p += 18) {
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                m = x[j];
            }
        float d = m / -8.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        int q[32];
        for (int j = 0; j < 32; j++) {
            float v = x[j] * id;
            v = v + 8.5f;
            q[j] = isnan(v) || v < 0.0f ? 0 : v >= 15.0f ? 15 : (int)v;
        }
        uint16_t h = ferry__f2h(d);
        p[0] = (uint8_t)(h & 0xff);
        p[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 16; j++)
            p[2 + j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
}

/* q8_0 / q8_1: d = amax / 127, q = clamp(roundf(x * (1/d)), -127, 127) with NaN -> 0; q8_1 also
 * stores f16(d * sum q). */
static void ref_q8(const float *x, uint8_t *p, size_t nb, int q8_1)
{
    size_t bsize = q8_1 ? 36 : 34;
    for (size_t i = 0; i < nb; i++, x += 32, p += bsize) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        float d = amax / 127.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            float v = roundf(x[j] * id);
            int q = isnan(v) ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int)v;
            p[bsize - 32 + (size_t)j] = (uint8_t)(int8_t)q;
            sum += q;
        }
        uint16_t h = ferry__f2h(d);
        p[0] = (uint8_t)(h & 0xff);
        p[1] = (uint8_t)(h >> 8);
        if (q8_1) {
            uint16_t s = ferry__f2h((float)sum * d);
            p[2] = (uint8_t)(s & 0xff);
            p[3] = (uint8_t)(s >> 8);
        }
    }
}

static void ref_half(ferry_dtype t, const float *x, uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = t == FERRY_DTYPE_F16 ? ferry__f2h(x[i]) : ferry__f2bf(x[i]);
        p[2 * i] = (uint8_t)(h & 0xff);
        p[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

static void reference(ferry_dtype t, const float *x, uint8_t *p, size_t n)
{
    switch (t) {
    case FERRY_DTYPE_Q4_0: ref_q4_0(x, p, n / 32); break;
    case FERRY_DTYPE_Q8_0: ref_q8(x, p, n / 32, 0); break;
    case FERRY_DTYPE_Q8_1: ref_q8(x, p, n / 32, 1); break;
    default: ref_half(t, x, p, n); break;
    }
}

/* ---- inputs --------------------------------------------------------------------------------- */

enum { KINDS = 13 };

/* One block of 32 floats of kind K; INF_OK allows infinities. */
static void make_block(float *x, int k, int inf_ok)
{
    static const float scales[] = {1e-6f, 1e-3f, 0.02f, 1.0f, 37.0f, 1e4f, 1e12f};
    switch (k) {
    case 0: /* random at one scale */
    default: {
        float s = scales[irand(7)];
        for (int j = 0; j < 32; j++)
            x[j] = frand() * s;
        break;
    }
    case 1: /* subnormal and near-subnormal: 1/d overflows to Inf */
        for (int j = 0; j < 32; j++)
            x[j] = frand() * (irand(2) ? 1e-40f : 1e-37f);
        x[irand(32)] = 0.0f;
        break;
    case 2: /* huge: d beyond the range of f16 */
        for (int j = 0; j < 32; j++)
            x[j] = frand() * 3e38f;
        break;
    case 3:
        for (int j = 0; j < 32; j++)
            x[j] = 0.0f;
        break;
    case 4:
        for (int j = 0; j < 32; j++)
            x[j] = -0.0f;
        break;
    case 5: /* zeros of both signs, one value */
        for (int j = 0; j < 32; j++)
            x[j] = irand(2) ? 0.0f : -0.0f;
        x[irand(32)] = frand();
        break;
    case 6: { /* +a and -a both at the largest magnitude, either first */
        float a = 0.5f + 0.5f * fabsf(frand());
        for (int j = 0; j < 32; j++)
            x[j] = frand() * a * 0.99f;
        int i = irand(32), k2 = (i + 1 + irand(31)) % 32;
        x[i] = a;
        x[k2] = -a;
        break;
    }
    case 7: { /* the largest magnitude repeated with one sign */
        float a = frand();
        for (int j = 0; j < 32; j++)
            x[j] = frand() * fabsf(a) * 0.5f;
        for (int r = 0; r < 3; r++)
            x[irand(32)] = a;
        break;
    }
    case 8: /* q8: amax 127 gives d = 1, and x = n + 0.5 sits halfway */
        for (int j = 0; j < 32; j++)
            x[j] = (float)(irand(253) - 126) + (irand(2) ? 0.5f : 0.0f);
        x[irand(32)] = irand(2) ? 127.0f : -127.0f;
        break;
    case 9: /* q4_0: max -8 gives d = 1; x = n - 0.5 lands on integers after + 8.5 */
        for (int j = 0; j < 32; j++)
            x[j] = (float)(irand(15) - 7) - (irand(2) ? 0.5f : 0.0f);
        x[irand(32)] = -8.0f;
        break;
    case 10: /* q4_0: max +16 gives d = -2: quotients at halves */
        for (int j = 0; j < 32; j++)
            x[j] = (float)(irand(31) - 15);
        x[irand(32)] = 16.0f;
        break;
    case 11: /* values near the f16 limits of d and a mix of magnitudes */
        for (int j = 0; j < 32; j++)
            x[j] = frand() * scales[irand(7)] * (irand(4) ? 1.0f : 65504.0f * 8.0f);
        break;
    case 12: /* infinities, of both signs or one */
        for (int j = 0; j < 32; j++)
            x[j] = frand();
        if (inf_ok) {
            x[irand(32)] = INFINITY;
            if (irand(2))
                x[irand(32)] = -INFINITY;
        }
        break;
    }
}

static void make_input(float *x, size_t nb, int nan_ok)
{
    for (size_t b = 0; b < nb; b++) {
        make_block(x + 32 * b, irand(KINDS), 1);
        if (nan_ok && irand(3) == 0) {
            int n = 1 + irand(irand(8) == 0 ? 32 : 3);
            for (int r = 0; r < n; r++)
                x[32 * b + (size_t)irand(32)] = irand(2) ? NAN : -NAN;
        }
    }
}

/* ---- comparisons ---------------------------------------------------------------------------- */

static int fast_available;

/* Converts N floats at X to T with the portable path, the fast path and the reference, and
 * checks that all three agree byte for byte. */
static void compare(ferry_dtype t, const float *x, size_t n, const char *what)
{
    uint64_t nbytes;
    CHECK_EQ_INT(ferry_dtype_nbytes(t, n, &nbytes), 0);
    uint8_t *slow = malloc(nbytes + 1), *fast = malloc(nbytes + 1), *ref = malloc(nbytes + 1);
    CHECK(slow && fast && ref);
    if (!slow || !fast || !ref)
        goto out;
    memset(slow, 0xa5, nbytes + 1);
    memset(fast, 0x5a, nbytes + 1);
    ferry__dtype_force_generic(1);
    CHECK_EQ_INT(ferry__from_f32(t, x, slow, n), 0);
    ferry__dtype_force_generic(0);
    CHECK_EQ_INT(ferry__from_f32(t, x, fast, n), 0);
    reference(t, x, ref, n);
    CHECK(slow[nbytes] == 0xa5 && fast[nbytes] == 0x5a); /* nothing written past the end */
    int same_slow = memcmp(slow, ref, nbytes) == 0, same_fast = memcmp(fast, ref, nbytes) == 0;
    CHECK(same_slow);
    CHECK(same_fast);
    if (!same_slow || !same_fast) {
        uint64_t bb = ferry_dtype_block_bytes(t), be = ferry_dtype_block_elems(t);
        for (uint64_t i = 0; i < nbytes; i++) {
            if (slow[i] == ref[i] && fast[i] == ref[i])
                continue;
            uint64_t b = i / bb;
            fprintf(stderr, "%s %s: block %llu byte %llu: portable %02x fast %02x reference %02x\n",
                    ferry_dtype_name(t), what, (unsigned long long)b,
                    (unsigned long long)(i % bb), slow[i], fast[i], ref[i]);
            for (uint64_t j = 0; j < be; j++)
                fprintf(stderr, " %a", (double)x[b * be + j]);
            fprintf(stderr, "\n");
            break;
        }
    }
out:
    free(slow);
    free(fast);
    free(ref);
}

static const ferry_dtype quant_types[] = {FERRY_DTYPE_Q4_0, FERRY_DTYPE_Q8_0, FERRY_DTYPE_Q8_1};

static void test_blocks(int nan_ok)
{
    enum { BIG = 4099 };
    float *x = malloc(32 * BIG * sizeof *x);
    CHECK(x != NULL);
    if (!x)
        return;
    for (size_t ti = 0; ti < sizeof quant_types / sizeof quant_types[0]; ti++) {
        ferry_dtype t = quant_types[ti];
        for (size_t nb = 1; nb <= 17; nb++) {
            make_input(x, nb, nan_ok);
            compare(t, x, 32 * nb, nan_ok ? "with NaN" : "small");
        }
        make_input(x, BIG, nan_ok);
        compare(t, x, 32 * BIG, nan_ok ? "large, with NaN" : "large");
        /* every kind on its own, many times: the rare ones are not left to chance */
        for (int k = 0; k < KINDS; k++) {
            for (size_t b = 0; b < 64; b++)
                make_block(x + 32 * b, k, 1);
            compare(t, x, 32 * 64, "one kind");
        }
    }
    free(x);
}

/* bf16 and f16 from every kind of float bit pattern, lengths around the 8- and 16-wide steps. */
static void test_halves(void)
{
    enum { N = 8192 };
    float *x = malloc(N * sizeof *x);
    CHECK(x != NULL);
    if (!x)
        return;
    for (size_t i = 0; i < N; i++) {
        uint32_t u = (uint32_t)rng();
        switch (irand(4)) {
        case 0: break;                                     /* any pattern: NaN payloads too */
        case 1: u = (u & 0x807fffffu) | 0x7f800000u; break; /* Inf and NaN */
        case 2: u &= 0x807fffffu; break;                    /* zero and subnormal */
        default: u = (u & 0xffff0000u) | 0x8000u; break;     /* exactly halfway for bf16 */
        }
        memcpy(&x[i], &u, sizeof u);
    }
    for (int h = 0; h < 2; h++) {
        ferry_dtype t = h ? FERRY_DTYPE_F16 : FERRY_DTYPE_BF16;
        for (size_t n = 0; n <= 40; n++)
            compare(t, x + irand(64), n, "short");
        compare(t, x, N, "long");
    }
    free(x);
}

/* The public conversion on unaligned f32 input (staged through its chunk buffer) gives the same
 * bytes as the reference, on both paths. */
static void test_public_convert(void)
{
    enum { NB = 300 };
    float *x = malloc(32 * NB * sizeof *x);
    unsigned char *raw = malloc(32 * NB * sizeof(float) + 1);
    uint8_t *out = malloc(36 * NB), *ref = malloc(36 * NB);
    CHECK(x && raw && out && ref);
    if (x && raw && out && ref) {
        make_input(x, NB, 0);
        memcpy(raw + 1, x, 32 * NB * sizeof(float));
        for (size_t ti = 0; ti < sizeof quant_types / sizeof quant_types[0]; ti++) {
            ferry_dtype t = quant_types[ti];
            uint64_t nbytes;
            CHECK_EQ_INT(ferry_dtype_nbytes(t, 32 * NB, &nbytes), 0);
            reference(t, x, ref, 32 * NB);
            for (int generic = 0; generic < 2; generic++) {
                ferry__dtype_force_generic(generic);
                CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, raw + 1, t, out, 32 * NB), 0);
                CHECK(memcmp(out, ref, nbytes) == 0);
                CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, x, t, out, 32 * NB), 0);
                CHECK(memcmp(out, ref, nbytes) == 0);
            }
            ferry__dtype_force_generic(0);
        }
    }
    free(x);
    free(raw);
    free(out);
    free(ref);
}

/* Quantizing in place (the output over the start of the input, as a caller converting a buffer
 * in place does) gives the same bytes: every block is read before its own bytes are written and
 * lands before any later block's input. */
static void test_in_place(void)
{
    enum { NB = 77 };
    float *x = malloc(32 * NB * sizeof *x), *buf = malloc(32 * NB * sizeof *buf);
    uint8_t *ref = malloc(64 * NB); /* the largest: f16 and bf16 */
    CHECK(x && buf && ref);
    if (x && buf && ref) {
        make_input(x, NB, 0);
        static const ferry_dtype types[] = {FERRY_DTYPE_Q4_0, FERRY_DTYPE_Q8_0, FERRY_DTYPE_Q8_1,
                                            FERRY_DTYPE_BF16, FERRY_DTYPE_F16};
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            uint64_t nbytes;
            CHECK_EQ_INT(ferry_dtype_nbytes(types[ti], 32 * NB, &nbytes), 0);
            reference(types[ti], x, ref, 32 * NB);
            for (int generic = 0; generic < 2; generic++) {
                ferry__dtype_force_generic(generic);
                memcpy(buf, x, 32 * NB * sizeof *x);
                CHECK_EQ_INT(ferry__from_f32(types[ti], buf, buf, 32 * NB), 0);
                CHECK(memcmp(buf, ref, nbytes) == 0);
            }
        }
        ferry__dtype_force_generic(0);
    }
    free(x);
    free(buf);
    free(ref);
}

/* A hand-made block per type, for a failure that names the rule broken. */
static void test_hand_made(void)
{
    float x[32] = {0};
    x[2] = 4.0f;   /* the largest magnitude, positive, but after -4 */
    x[1] = -4.0f;  /* first: m = -4, d = 0.5, id = 2 */
    x[3] = 1.25f;  /* 2.5 + 8.5 = 11 */
    x[4] = -0.25f; /* -0.5 + 8.5 = 8 */
    x[20] = 3.0f;  /* 6 + 8.5 = 14.5 -> 14 */
    for (int generic = 1; generic >= 0; generic--) {
        ferry__dtype_force_generic(generic);
        uint8_t b[36];
        CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q4_0, x, b, 32), 0);
        CHECK(b[0] == 0x00 && b[1] == 0x38); /* f16 0.5 */
        CHECK_EQ_INT(b[2 + 1], 0 | 8 << 4);
        CHECK_EQ_INT(b[2 + 2], 15 | 8 << 4); /* 8 + 8.5 -> clamped */
        CHECK_EQ_INT(b[2 + 3], 11 | 8 << 4);
        CHECK_EQ_INT(b[2 + 4], 8 | 14 << 4);
        /* q8_0: amax 4, d = 4/127; 1.25 * 31.75 = 39.6875 -> 40; -0.25 * 31.75 -> -8 (-7.9375) */
        CHECK_EQ_INT(ferry__from_f32(FERRY_DTYPE_Q8_0, x, b, 32), 0);
        CHECK_EQ_INT((int8_t)b[2 + 1], -127);
        CHECK_EQ_INT((int8_t)b[2 + 2], 127);
        CHECK_EQ_INT((int8_t)b[2 + 3], 40);
        CHECK_EQ_INT((int8_t)b[2 + 4], -8);
        CHECK_EQ_INT((int8_t)b[2 + 20], 95); /* 95.25 */
        CHECK_EQ_INT((int8_t)b[2 + 0], 0);
    }
    ferry__dtype_force_generic(0);
}

int main(void)
{
    ferry__dtype_force_generic(0);
    fast_available = ferry__dtype_use_avx2();
    if (!fast_available)
        fprintf(stderr, "note: no AVX2 here: the fast and portable paths are the same code\n");
    test_hand_made();
    test_blocks(0);
    test_blocks(1);
    test_halves();
    test_public_convert();
    test_in_place();
    printf("test_quantize (%s): %d passed, %d failed\n", fast_available ? "avx2" : "generic",
           check_passed, check_failed);
    return check_failed ? 1 : 0;
}
