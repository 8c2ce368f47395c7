/*
 * lora_fixture.h — what the LoRA tests (test_lora.c, test_lora_manager.c) share: deterministic
 * tensor values from a tensor's name, the round trip of a value through a dtype, paths in the
 * test's folder, and writing one tensor's values in its dtype.
 */
#ifndef FERRY_LORA_FIXTURE_H
#define FERRY_LORA_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

static const char *dir; /* the test's folder, set by main */

/* Deterministic values in [-0.25, 0.25), from the tensor's name and the index. */
static float val_of(const char *name, uint64_t i)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ h;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return ((float)(x & 0xFFFFFF) / 16777216.0f - 0.5f) * 0.5f;
}

/* V as stored in DT and read back. */
static float round_trip(ferry_dtype dt, float v)
{
    unsigned char buf[16];
    float out = v;
    if (dt != FERRY_DTYPE_F32 && ferry_dtype_convert(FERRY_DTYPE_F32, &v, dt, buf, 1) == 0)
        ferry_dtype_convert(dt, buf, FERRY_DTYPE_F32, &out, 1);
    return out;
}

/* NAME in the test's folder; the last 16 results stay valid. */
static char *path_of(const char *name)
{
    static char buf[16][4096];
    static int k;
    char *p = buf[k++ % 16];
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static uint64_t shape_elems(uint32_t ndim, const int64_t *shape)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++)
        n *= (uint64_t)shape[d];
    return n;
}

/* Writes the next tensor's bytes to W: val_of(NAME, i) (or FILL when nonzero) stored in DT, with
 * element 1 NaN when POISON; zeros for dtypes nothing converts f32 to (k-quants). */
static int write_values(ferry_writer *w, const char *name, ferry_dtype dt, uint32_t ndim,
                        const int64_t *shape, float fill, int poison)
{
    uint64_t ne = shape_elems(ndim, shape), nb = 0;
    ferry_dtype_nbytes(dt, ne, &nb);
    float *f = malloc((ne ? ne : 1) * sizeof *f);
    unsigned char *raw = calloc(nb ? nb : 1, 1);
    int rc = f && raw ? 0 : FERRY_ENOMEM;
    for (uint64_t i = 0; i < ne && !rc; i++)
        f[i] = fill != 0.0f ? fill : val_of(name, i);
    if (!rc && poison && ne > 1)
        f[1] = NAN;
    if (!rc && ferry_dtype_can_convert(FERRY_DTYPE_F32, dt))
        ferry_dtype_convert(FERRY_DTYPE_F32, f, dt, raw, ne);
    if (!rc)
        rc = ferry_writer_write(w, raw, nb);
    free(f);
    free(raw);
    return rc;
}

#endif
