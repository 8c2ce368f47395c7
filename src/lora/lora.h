/*
 * lora.h — adapters: opening an adapter file, recognising its naming scheme, pairing its factors,
 * mapping them to base tensor names, reading and caching the factors as f32, and the merge
 * arithmetic. Knows nothing of devices or of the manager's residency: the manager (src/core)
 * decides when to load factors and calls ferry__lora_apply_rows on chunks of rows while staging.
 *
 * Orientation: a base weight is a matrix of `rows` = its outermost dimension (GGUF: the last ne,
 * safetensors: shape[0]) by `cols` = all other elements (conv kernels [out, in, kh, kw] become
 * out x in*kh*kw). A is rank x cols, B is rows x rank, both row-major f32 once loaded.
 */
#ifndef FERRY_LORA_H
#define FERRY_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "util/util.h"

typedef struct ferry__lora_pair {
    char *stem;          /* the adapter's own name for the weight (key without the A/B suffix) */
    char *base_name;     /* mapped base tensor name (target prefix included), NULL if unmatched */
    uint32_t rank;
    uint64_t rows, cols; /* of the base weight, from the factor shapes */
    float alpha;         /* NAN when the adapter gives none */
    size_t a_index;      /* tensor indices in the adapter's catalog */
    size_t b_index;
    float *a;            /* cached factors (rank x cols, rows x rank), NULL until loaded */
    float *b;
} ferry__lora_pair;

typedef struct ferry__adapter {
    char *path;
    const char *scheme;  /* "peft", "kohya", "gguf" */
    ferry_catalog *cat;  /* the adapter file */
    ferry__lora_pair *pairs;
    size_t n_pairs;
    size_t n_matched;
    float default_alpha; /* from metadata, NAN when absent */
} ferry__adapter;

/* Opens PATH, detects the scheme, pairs A with B (a lone A or B, rank 0, or A/B ranks that
 * disagree: FERRY_ELORA naming the tensor), reads alphas. */
int ferry__adapter_open(const char *path, ferry__adapter **out, ferry__err *e);
void ferry__adapter_close(ferry__adapter *a);

/* Maps every pair to a base tensor of BASE: exact names, known prefixes stripped, HF llama names
 * to GGUF names, kohya underscored names (matched against the base names so that underscores
 * inside names are no problem). Only base names starting with BASE_PREFIX qualify (NULL: all);
 * TARGET_PREFIX is prepended to the adapter's names before matching (NULL: none). A matched
 * pair whose rows x cols do not fit the base tensor's is FERRY_ELORA naming both. Unmatched pairs
 * keep base_name NULL. */
int ferry__adapter_map(ferry__adapter *a, const ferry_catalog *base, const char *base_prefix,
                       const char *target_prefix, ferry__err *e);

/* Reads pair P's factors (any float dtype the file uses) into its f32 cache, once. */
int ferry__adapter_load(ferry__adapter *a, ferry__lora_pair *p, ferry__err *e);
/* Bytes the f32 factors of P take. */
uint64_t ferry__lora_pair_bytes(const ferry__lora_pair *p);
/* scale = multiplier * alpha / rank; alpha = rank when absent. */
float ferry__lora_scale(const ferry__lora_pair *p, float multiplier);

/* W[nrows x cols] (row-major f32, rows ROW0..ROW0+NROWS of the weight) += SCALE * B[rows] . A,
 * through ferry__sgemm. */
void ferry__lora_apply_rows(const ferry__lora_pair *p, float scale, uint64_t row0, uint64_t nrows,
                            float *w);

/* The rows and cols of a base tensor as the LoRA view sees them. */
void ferry__lora_matrix_view(const ferry_tensor_info *info, uint64_t *rows, uint64_t *cols);

#endif
