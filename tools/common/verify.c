/*
 * verify.c — `ferry run --verify`: each prepared tensor checked against an independent read of
 * the file, through the descriptor ferry holds, converted and merged here in double precision.
 * Uses only the public header ferry.h; part of ferry_tools.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

/* T's bytes as stored, read through the descriptor ferry holds: the file ferry opened, not
 * whatever stands at its path now. NULL when the read fails. */
static void *read_file(ferry *f, ferry_tensor *t, uint64_t n)
{
    unsigned char *buf = malloc(n ? n : 1);
    if (buf && ferry_tensor_read_file(f, t, 0, n, buf)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Tolerance of a stored value of type T near V: the rounding of T (a merge computed in another
 * order may round the other way). */
static double tolerance(ferry_dtype t, double v, double block_amax)
{
    switch (t) {
    case FERRY_DTYPE_F32: return 1e-5 * fabs(v) + 1e-6;
    case FERRY_DTYPE_F16: return fabs(v) / 1024.0 + 1e-7;
    case FERRY_DTYPE_BF16: return fabs(v) / 128.0 + 1e-7;
    case FERRY_DTYPE_Q8_0: return block_amax / 127.0 * 1.01 + 1e-7;
    case FERRY_DTYPE_Q4_0: return block_amax / 7.0 * 1.01 + 1e-7;
    default: return 1e-3 * fabs(v) + 1e-6;
    }
}

int verify_prepared(ferry *f, ferry_tensor *t, int merge_mode, char *why, size_t whylen)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    uint64_t out_bytes = ferry_tensor_nbytes(t);
    ferry_dtype out = ferry_tensor_dtype(t);
    unsigned char *raw = read_file(f, t, info.nbytes);
    unsigned char *got = malloc(out_bytes ? out_bytes : 1);
    int ok = 0;
    if (!raw || !got || ferry_tensor_read(f, t, 0, out_bytes, got)) {
        snprintf(why, whylen, "cannot read back: %s", ferry_errmsg(f));
        goto out;
    }
    ferry_lora_factor fac;
    int merged = merge_mode && ferry_lora_factors(f, t, 0, &fac) == 0;
    if (!merged && out == info.dtype) {
        ok = out_bytes == info.nbytes && memcmp(raw, got, info.nbytes) == 0;
        if (!ok)
            snprintf(why, whylen, "bytes differ from the file");
        goto out;
    }
    uint64_t n = info.n_elems;
    float *want = malloc(n * sizeof *want), *have = malloc(n * sizeof *have);
    double *acc = merged ? malloc(n * sizeof *acc) : NULL;
    if (!want || !have || (merged && !acc)) {
        snprintf(why, whylen, "out of memory");
        free(want), free(have), free(acc);
        goto out;
    }
    if (ferry_dtype_convert(info.dtype, raw, FERRY_DTYPE_F32, want, n) ||
        ferry_dtype_convert(out, got, FERRY_DTYPE_F32, have, n)) {
        snprintf(why, whylen, "cannot convert %s", ferry_dtype_name(info.dtype));
        free(want), free(have), free(acc);
        goto out;
    }
    if (merged) {
        for (uint64_t i = 0; i < n; i++)
            acc[i] = want[i];
        for (size_t k = 0; ferry_lora_factors(f, t, k, &fac) == 0; k++)
            for (uint64_t r = 0; r < fac.rows; r++)
                for (uint64_t c = 0; c < fac.cols; c++) {
                    double s = 0;
                    for (uint32_t q = 0; q < fac.rank; q++)
                        s += (double)fac.b[r * fac.rank + q] * fac.a[q * fac.cols + c];
                    acc[r * fac.cols + c] += fac.scale * s;
                }
        for (uint64_t i = 0; i < n; i++)
            want[i] = (float)acc[i];
    } else {
        /* the independent conversion, through the same public converter */
        unsigned char *conv = malloc(out_bytes ? out_bytes : 1);
        if (conv && !ferry_dtype_convert(info.dtype, raw, out, conv, n) &&
            memcmp(conv, got, out_bytes) == 0) {
            ok = 1;
        } else {
            snprintf(why, whylen, "converted values differ");
        }
        free(conv);
        free(want), free(have), free(acc);
        goto out;
    }
    uint32_t blk = ferry_dtype_block_elems(out);
    ok = 1;
    for (uint64_t b0 = 0; b0 < n && ok; b0 += blk) {
        double amax = 0;
        for (uint64_t i = b0; i < b0 + blk && i < n; i++)
            amax = fmax(amax, fabs((double)want[i]));
        for (uint64_t i = b0; i < b0 + blk && i < n; i++) {
            double d = fabs((double)have[i] - want[i]);
            if (!(d <= tolerance(out, want[i], amax))) {
                snprintf(why, whylen, "element %llu: %g, expected %g (merged)",
                         (unsigned long long)i, have[i], want[i]);
                ok = 0;
                break;
            }
        }
    }
    free(want), free(have), free(acc);
out:
    free(raw);
    free(got);
    return ok;
}
