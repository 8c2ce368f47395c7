/*
 * test_engine_f16.c — the engine's attention in f16 arithmetic (engine/f16.c): computed with the
 * CPU's AVX512-FP16 instructions, whose every operation IEEE 754 rounds once, it must give the bits
 * of the emulation in f32 / f64 that CPUs without them use, on random heads and on the edges of
 * f16 (subnormals, values near the largest half, exact halfway sums). Where the CPU has no
 * AVX512-FP16 the comparison cannot run and the test says so; the conversions are checked on
 * every CPU.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "f16.h"

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* A random finite f16 of magnitude about 2^E (E in -26..14), sometimes subnormal. */
static uint16_t rand_h(int e_lo, int e_hi)
{
    int e = e_lo + (int)(next() % (uint32_t)(e_hi - e_lo + 1));
    float f = ldexpf(1.0f + (float)(next() % 1024) / 1024.0f, e) * ((next() & 1) ? -1.0f : 1.0f);
    return f32_to_f16(f);
}

static int same_bits(const float *a, const float *b, uint32_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

static void conversions(void)
{
    CHECK(f32_to_f16(1.0f) == 0x3c00u);
    CHECK(f32_to_f16(65504.0f) == 0x7bffu);
    CHECK(f32_to_f16(65520.0f) == 0x7c00u);  /* halfway to the next binade rounds up: Inf */
    CHECK(f32_to_f16(0x1p-24f) == 0x0001u);  /* the smallest subnormal */
    CHECK(f32_to_f16(0x1p-25f) == 0x0000u);  /* halfway to zero: ties to even */
    CHECK(f32_to_f16(1.0f + 0x1p-11f) == 0x3c00u);
    CHECK(f32_to_f16(1.0f + 0x1.8p-11f) == 0x3c01u);
    int ok = 1;
    for (uint32_t h = 0; h < 0x7c00u; h++) /* every finite half round-trips */
        ok &= f32_to_f16(f16_to_f32((uint16_t)h)) == h && f32_to_f16(-f16_to_f32((uint16_t)h)) == (h | 0x8000u);
    CHECK(ok);
}

/* One head of N elements at magnitudes E_LO..E_HI through dot, scale and mad, both ways. */
static int one_head(uint32_t n, int e_lo, int e_hi)
{
    float q[512], out_e[512], out_n[512];
    uint16_t k[512], v[512];
    for (uint32_t i = 0; i < n; i++) {
        q[i] = f16_to_f32(rand_h(e_lo, e_hi));
        k[i] = rand_h(e_lo, e_hi);
        v[i] = rand_h(e_lo, e_hi);
        out_e[i] = out_n[i] = f16_to_f32(rand_h(e_lo, e_hi));
    }
    float de = attn_dot(F16_ARITH_EMULATED, q, k, n), dn = attn_dot(F16_ARITH_NATIVE, q, k, n);
    int ok = memcmp(&de, &dn, sizeof de) == 0;
    float s = (float)(next() % 4096) / 1024.0f;
    attn_mad(F16_ARITH_EMULATED, out_e, v, s, n);
    attn_mad(F16_ARITH_NATIVE, out_n, v, s, n);
    ok &= same_bits(out_e, out_n, n);
    attn_scale(F16_ARITH_EMULATED, out_e, s * 0.5f, n);
    attn_scale(F16_ARITH_NATIVE, out_n, s * 0.5f, n);
    ok &= same_bits(out_e, out_n, n);
    return ok;
}

int main(void)
{
    conversions();
    if (f16_arith_mode() != F16_ARITH_NATIVE) {
        printf("skip: this CPU has no AVX512-FP16; native f16 attention not compared\n");
    } else {
        static const uint32_t lens[] = {128, 256, 384, 512, 136, 200};
        int ok = 1;
        for (int r = 0; r < 2000; r++) {
            uint32_t n = lens[r % 6];
            ok &= one_head(n, -8, 4);   /* ordinary attention magnitudes */
            ok &= one_head(n, -26, -12); /* subnormal sums and products */
            ok &= one_head(n, 6, 7);     /* sums that overflow to Inf */
            ok &= one_head(n, -1, 0);    /* many exact halfway cases */
        }
        CHECK(ok);
    }
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
