/*
 * quant_x86.h — private to src/dtype/: the AVX2 quantizers of quant_x86.c (f32 -> q4_0, q8_0,
 * q8_1, bf16). Each gives exactly the bytes of its portable counterpart in convert.c, which stays
 * the reference; convert.c calls these only when ferry__dtype_use_avx2() says yes.
 */
#ifndef FERRY_QUANT_X86_H
#define FERRY_QUANT_X86_H

#include <float.h>
#include <stdint.h>

/* Only on x86-64 with a compiler that takes target attributes, and only where float arithmetic
 * is done in float (FLT_EVAL_METHOD 0): with wider intermediates the portable quantizers would
 * round differently and the two could not agree byte for byte. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define FERRY_QUANT_X86 1

/* NB whole blocks of 32 floats at X into NB q4_0 blocks (18 bytes each) at P. */
void ferry__quant_q4_0_avx2(const float *x, uint8_t *p, uint64_t nb);
/* NB blocks into q8_0 (34 bytes each) or, with WITH_SUM, q8_1 (36 bytes each). */
void ferry__quant_q8_avx2(const float *x, uint8_t *p, uint64_t nb, int with_sum);
/* The first elements of IN[0..N) into bf16 at P, in whole groups of 16; returns how many were
 * done (the caller finishes the tail). */
uint64_t ferry__f32_to_bf16_avx2(const float *in, uint8_t *p, uint64_t n);
#endif

#endif
