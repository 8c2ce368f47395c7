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
