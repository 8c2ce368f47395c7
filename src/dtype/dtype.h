/*
 * dtype.h — the internal side of the type table (dtype.c) and the numeric kernels that work on
 * weights in their stored types: conversion rows, dequantize/quantize, dot products for the
 * decode-shaped workload, and the f32 GEMM used by LoRA merge.
 * The public side (names, block sizes, ferry_dtype_convert) is declared in ferry.h.
 */
#ifndef FERRY_DTYPE_H
#define FERRY_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

/* GGUF type id -> ferry_dtype; FERRY_EDTYPE for unknown or retired ids. */
int ferry__dtype_from_gguf(uint32_t id, ferry_dtype *out);
/* 1 when T exists in GGUF (then its value is its GGUF id). */
int ferry__dtype_in_gguf(ferry_dtype t);
/* safetensors dtype string (exact, upper-case as in the spec: "F32", "BF16", "F8_E4M3", ...;
 * LEN bytes, not terminated) -> ferry_dtype; FERRY_EDTYPE when unknown. */
int ferry__dtype_from_st(const char *s, size_t len, ferry_dtype *out);
/* The safetensors spelling of T, or NULL when safetensors has no such type (quantized types). */
const char *ferry__dtype_st_name(ferry_dtype t);
/* 1 when T is a valid ferry_dtype value. */
int ferry__dtype_valid(ferry_dtype t);

/* Scalar conversions, round to nearest even, NaN/Inf preserved. */
float ferry__f16_to_f32(uint16_t h);
uint16_t ferry__f32_to_f16(float f);
float ferry__bf16_to_f32(uint16_t h);
uint16_t ferry__f32_to_bf16(float f);

/* Dequantizes/casts N elements of type T (whole blocks) to f32. FERRY_EDTYPE when T cannot be
 * read as numbers by ferry (then nothing is written). Supported: f32, f16, bf16, f64, i8, i16,
 * i32, i64, u8..u64, bool, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, f8_e4m3, f8_e5m2, and the k-quants
 * q2_k..q8_k. */
int ferry__to_f32(ferry_dtype t, const void *in, float *out, uint64_t n);
/* Quantizes/casts N f32 values (whole blocks) to T: f32, f16, bf16, q8_0, q4_0 (also q4_1,
 * q5_0, q5_1, q8_1 if implemented). FERRY_EDTYPE otherwise. */
int ferry__from_f32(ferry_dtype t, const float *in, void *out, uint64_t n);
/* 1 when ferry__to_f32 / ferry__from_f32 support T. */
int ferry__dtype_readable(ferry_dtype t);
int ferry__dtype_writable(ferry_dtype t);

/* Dot product of one row of N elements of type T with the f32 vector X (the decode workload's
 * y = W.x, one row at a time); dequantizes on the fly without a temporary for the common types.
 * *out receives the sum. FERRY_EDTYPE when T is not readable. */
int ferry__dot_row(ferry_dtype t, const void *row, const float *x, uint64_t n, float *out);
/* y[r] = dot(row r of W, x) for ROWS rows of COLS elements each, W of type T with row stride
 * ROW_BYTES. Multithreading is the caller's business. */
int ferry__matvec(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                  const float *x, float *y);

/* C[m x n] += alpha * A[m x k] * B[k x n], row-major f32, leading dimensions given. Uses
 * OpenBLAS's cblas_sgemm when ferry was built with FERRY_BLAS (not under TSan), FERRY_BLAS=0 is
 * not set and libopenblas.so.0 (or libopenblas.so) loads: dlopen'd on the first call, once, by
 * any thread. A blocked C loop otherwise, and for dimensions beyond int. */
void ferry__sgemm(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a, uint64_t lda,
                  const float *b, uint64_t ldb, float *c, uint64_t ldc);
/* The blocked C loop, always available (tests compare it with the BLAS path). */
void ferry__sgemm_ref(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a,
                      uint64_t lda, const float *b, uint64_t ldb, float *c, uint64_t ldc);
/* What ferry__sgemm uses for int-sized shapes: "openblas" or "builtin". Loads OpenBLAS as
 * ferry__sgemm's first call would. */
const char *ferry__sgemm_backend(void);

#endif
