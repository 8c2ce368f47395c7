/*
 * f16.h — half precision for the KV cache and attention, rounded the way llama.cpp's CPU back end
 * rounds it, so that attention gives its bits.
 *
 * llama.cpp's native x86 builds on CPUs with AVX512-FP16 do attention's f16 arithmetic in f16 (32
 * lanes, every fused multiply-add and add rounded to f16) for the 128-element steps of a head, and
 * in f32 / f64 otherwise. A mode says which of the two to mimic, and how: with the CPU's own f16
 * instructions, or emulated in f32 / f64 with the same single roundings (for a CPU without them).
 */
#ifndef FERRY_ENGINE_F16_H
#define FERRY_ENGINE_F16_H

#include <stdint.h>

enum {
    F16_ARITH_NONE = 0,     /* f32 arithmetic, as on CPUs without AVX512-FP16 */
    F16_ARITH_EMULATED = 1, /* f16 arithmetic, each operation emulated */
    F16_ARITH_NATIVE = 2,   /* f16 arithmetic on the CPU's AVX512-FP16 */
};

/* The mode for this CPU: f16 arithmetic where it has AVX512-FP16 (native). FERRY_F16_ARITH = 0 or
 * 1 says whether to mimic f16 arithmetic regardless (1 on a CPU without it: emulated). */
int f16_arith_mode(void);

/* F to f16 bits, round to nearest even; beyond the range gives Inf, NaN stays NaN. */
uint16_t f32_to_f16(float f);
/* The f16 bits H as a float (exact). */
float f16_to_f32(uint16_t h);
/* F rounded to the nearest f16, as a float. */
float round_f16(float f);

/* q . k over a head's N elements, Q f16 values held as floats, K f16: ggml's f16 dot product. */
float attn_dot(int mode, const float *q, const uint16_t *k, uint32_t n);
/* OUT = f16(OUT * S) over N elements: ggml_vec_scale_f16. */
void attn_scale(int mode, float *out, float s, uint32_t n);
/* OUT = f16(OUT + V * S) over N elements, V f16: ggml_vec_mad_f16. */
void attn_mad(int mode, float *out, const uint16_t *v, float s, uint32_t n);

#endif
