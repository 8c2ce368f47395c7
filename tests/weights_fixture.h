/*
 * weights_fixture.h — random weights of any ferry dtype for the product tests: quantized from
 * random floats where ferry quantizes to the type, random blocks with weight-sized f16 scales for
 * the k-quants (which ferry does not quantize to).
 */
#ifndef FERRY_TEST_WEIGHTS_FIXTURE_H
#define FERRY_TEST_WEIGHTS_FIXTURE_H

#include <string.h>

#include "check.h"
#include "dtype/dtype.h"
#include "xorshift.h"

/* N elements of type T at W, drawn from *RNG; TMP holds N floats. OUTLIERS: every 29th value
 * four times larger. */
static inline void fixture_fill_weights(ferry_dtype t, uint8_t *w, uint64_t n, float *tmp,
                                        uint64_t *rng, int outliers)
{
    for (uint64_t i = 0; i < n; i++)
        tmp[i] = 0.05f * xorshift_unit(rng) * (outliers && i % 29 == 0 ? 4.0f : 1.0f);
    if (t != FERRY_DTYPE_Q4_K && t != FERRY_DTYPE_Q5_K && t != FERRY_DTYPE_Q6_K) {
        CHECK_EQ_INT(ferry_dtype_convert(FERRY_DTYPE_F32, tmp, t, w, n), 0);
        return;
    }
    uint64_t bb = ferry_dtype_block_bytes(t), nb = n / 256;
    for (uint64_t i = 0; i < nb * bb; i++)
        w[i] = (uint8_t)xorshift_u32(rng);
    for (uint64_t b = 0; b < nb; b++) {
        /* d (and dmin) at the block's start; q6_K's d after its 208 bytes of quants and scales */
        uint16_t h = ferry__f32_to_f16(1e-4f * (1 + (float)(xorshift_u32(rng) % 8)));
        if (t == FERRY_DTYPE_Q6_K) {
            memcpy(w + b * bb + 208, &h, 2);
        } else {
            memcpy(w + b * bb, &h, 2);
            memcpy(w + b * bb + 2, &h, 2);
        }
    }
}

#endif
