/*
 * synth.h — synthetic models (synth.c) for `ferry gen` and `ferry demo`: plan the tensors of an
 * architecture at a size, then write them with deterministic, weight-like values.
 */
#ifndef FERRY_SYNTH_H
#define FERRY_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef enum synth_arch { SYNTH_LLAMA = 0, SYNTH_UNET = 1 } synth_arch;

/* What to generate. Zero dimensions are chosen: to fit TARGET_BYTES when it is nonzero,
 * otherwise from defaults. */
typedef struct synth_config {
    synth_arch arch;
    ferry_format format;     /* FERRY_FORMAT_GGUF or FERRY_FORMAT_SAFETENSORS */
    ferry_dtype dtype;       /* f32, f16, bf16, q8_0, q4_0 */
    uint64_t seed;
    uint64_t target_bytes;   /* tensor bytes to aim at; 0: no target */
    /* llama: blocks, embedding width, feed-forward width, vocabulary, attention heads.
     * unet: layers = resnets per down block, dim = base channels, heads = attention heads. */
    uint32_t layers, dim, ff, vocab, heads, kv_heads;
    /* llama: a Mixtral-style mixture of experts when EXPERTS is nonzero, EXPERTS_USED per token */
    uint32_t experts, experts_used;
} synth_config;

typedef struct synth_tensor {
    char *name;              /* owned */
    ferry_dtype dtype;
    uint32_t ndim;
    int64_t shape[4];        /* the format's own order */
    uint64_t n_elems;
    uint64_t nbytes;
    int kind;                /* SYNTH_WEIGHT, SYNTH_NORM, SYNTH_BIAS, SYNTH_ROUTER */
    float scale;             /* standard deviation of the values (around 1.0 for norms) */
} synth_tensor;

/* SYNTH_ROUTER: a mixture of experts' router, N(0, 1) so that routing is decisive, f32 in GGUF
 * (as llama.cpp's converter keeps it) */
enum { SYNTH_WEIGHT = 0, SYNTH_NORM = 1, SYNTH_BIAS = 2, SYNTH_ROUTER = 3 };

typedef struct synth_model {
    synth_config cfg;        /* with every dimension resolved */
    uint32_t cross_dim;      /* unet: cross-attention width */
    synth_tensor *t;
    size_t n, cap;
    uint64_t total_bytes;
} synth_model;

/* Resolves CFG into the full list of tensors. Returns 0, or CLI_EXIT_USAGE / CLI_EXIT_FAIL with
 * the reason in ERR (ERRLEN bytes). Free with synth_free (also after a failure). */
int synth_plan(const synth_config *cfg, synth_model *m, char *err, size_t errlen);
void synth_free(synth_model *m);
/* Writes the model to PATH atomically (nothing under PATH until it is complete), values
 * determined by the seed alone, with a progress bar when PROGRESS is nonzero. Returns 0, or
 * CLI_EXIT_FAIL after printing the error. */
int synth_write(const synth_model *m, const char *path, int progress);
/* "llama" / "unet". */
const char *synth_arch_name(synth_arch a);

/* The value generator, for tests that compare its AVX2 and portable paths. The table of 65536
 * unit-variance values synth_fill_values draws from (malloc'd; NULL when out of memory). */
float *synth_normal_table(void);
/* Fills OUT[0..N) with the values of tensor T's chunk CHUNK_NO (tensor TENSOR_NO of the model)
 * under SEED, drawn from TAB: the bytes synth_write writes, before conversion. */
void synth_fill_values(const synth_tensor *t, const float *tab, uint64_t seed,
                       uint64_t tensor_no, uint64_t chunk_no, float *out, uint64_t n);
/* Nonzero: synth_fill_values takes its portable loop even where AVX2 is present. */
extern int synth_force_portable;

#endif
