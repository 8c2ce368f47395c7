/*
 * slice_fixture.h — what the slice tests share: small model files with mixture-of-experts shaped
 * 3-D tensors (expert = outermost dimension), and a check of a prepared tensor's bytes against
 * the file read with plain pread.
 */
#ifndef FERRY_SLICE_FIXTURE_H
#define FERRY_SLICE_FIXTURE_H

#include "model_fixture.h"

#define SLICE_EXPERTS 8

/* The GGUF model: 3-D expert tensors [cols, rows, SLICE_EXPERTS] of every dtype under test, one
 * large enough for budget tests ("big", 64 KiB per expert), 1-D and 2-D tensors. */
static const fixture_tensor slice_gguf_ts[] = {
    {"blk.0.ffn_up_exps.f32", FERRY_DTYPE_F32, 3, {64, 16, SLICE_EXPERTS, 0}},
    {"blk.0.ffn_up_exps.f16", FERRY_DTYPE_F16, 3, {64, 16, SLICE_EXPERTS, 0}},
    {"blk.0.ffn_up_exps.q8_0", FERRY_DTYPE_Q8_0, 3, {64, 16, SLICE_EXPERTS, 0}},
    {"blk.0.ffn_up_exps.q4_K", FERRY_DTYPE_Q4_K, 3, {256, 4, SLICE_EXPERTS, 0}},
    {"blk.1.ffn_down_exps.big", FERRY_DTYPE_F32, 3, {256, 64, SLICE_EXPERTS, 0}},
    {"vec.f32", FERRY_DTYPE_F32, 1, {40, 0, 0, 0}},
    {"vec.q8_0", FERRY_DTYPE_Q8_0, 1, {64, 0, 0, 0}},
    {"tok.weight", FERRY_DTYPE_F32, 2, {32, 16, 0, 0}},
};
#define SLICE_N_GGUF_EXPERT_TS 5 /* the first five are 3-D expert tensors */

/* The safetensors model: the same in safetensors' order (outermost first). */
static const fixture_tensor slice_st_ts[] = {
    {"blk.0.ffn_up_exps.f32", FERRY_DTYPE_F32, 3, {SLICE_EXPERTS, 16, 64, 0}},
    {"blk.0.ffn_up_exps.f16", FERRY_DTYPE_F16, 3, {SLICE_EXPERTS, 16, 64, 0}},
    {"blk.0.ffn_up_exps.bf16", FERRY_DTYPE_BF16, 3, {SLICE_EXPERTS, 4, 32, 0}},
    {"blk.1.ffn_down_exps.big", FERRY_DTYPE_F32, 3, {SLICE_EXPERTS, 64, 256, 0}},
    {"scalar", FERRY_DTYPE_F32, 0, {0, 0, 0, 0}},
};
#define SLICE_N_ST_EXPERT_TS 4

/* Writes TS to PATH: f32-convertible dtypes hold fixture values, the others (k-quants) bytes of
 * a fixed pattern (the tests compare bytes, never values). 0, or -1 with a line on stderr. */
static inline int slice_write(const char *path, ferry_format fmt, const fixture_tensor *ts,
                              size_t n)
{
    ferry_writer *w = ferry_writer_create(fmt);
    if (!w)
        return -1;
    int rc = ferry_writer_set_meta_str(w, "general.architecture", "llama");
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t ne = fixture_elems(&ts[i]), nb = 0;
        ferry_dtype_nbytes(ts[i].dtype, ne, &nb);
        float *v = malloc((ne ? ne : 1) * sizeof *v);
        unsigned char *out = malloc(nb ? nb : 1);
        if (!v || !out) {
            free(v), free(out);
            rc = -1;
            break;
        }
        for (uint64_t k = 0; k < ne; k++)
            v[k] = fixture_value((uint32_t)i, k);
        if (ferry_dtype_can_convert(FERRY_DTYPE_F32, ts[i].dtype))
            rc = ferry_dtype_convert(FERRY_DTYPE_F32, v, ts[i].dtype, out, ne);
        else
            for (uint64_t k = 0; k < nb; k++)
                out[k] = (unsigned char)(k * 131 + i * 7 + (k >> 9));
        if (!rc)
            rc = ferry_writer_write(w, out, nb);
        free(v), free(out);
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "slice_write %s: %s\n", path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

/* 1 when prepared S holds exactly the bytes [OFF, OFF + N) of PATH. */
static inline int slice_bytes_are(ferry *f, ferry_tensor *s, const char *path, uint64_t off,
                                  uint64_t n)
{
    unsigned char *want = fixture_pread(path, off, n);
    unsigned char *got = malloc(n ? n : 1);
    int ok = want && got && ferry_tensor_nbytes(s) == n &&
             ferry_tensor_read(f, s, 0, n, got) == 0 && memcmp(want, got, n) == 0;
    free(want), free(got);
    return ok;
}

/* Where rows [FIRST, FIRST + COUNT) of T's outermost dimension lie in its file, from T's own
 * info: *OFF and *N. */
static inline void slice_range_of(ferry_tensor *t, uint64_t first, uint64_t count, uint64_t *off,
                                  uint64_t *n)
{
    ferry_tensor_info in;
    ferry_tensor_get_info(t, &in);
    uint64_t outer = (uint64_t)in.shape[in.format == FERRY_FORMAT_GGUF ? in.ndim - 1 : 0];
    uint64_t row = in.nbytes / outer;
    *off = in.offset + first * row;
    *n = count * row;
}

#endif
