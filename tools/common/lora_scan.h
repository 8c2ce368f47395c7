/*
 * lora_scan.h — an adapter's ranks, alphas and applied scales for `ferry lora info`. Uses only
 * the public header ferry.h; part of ferry_tools.
 */
#ifndef FERRY_LORA_SCAN_H
#define FERRY_LORA_SCAN_H

#include <stdint.h>

#include "ferry.h"

/* The smallest and largest of N values (N 0: none yet). */
typedef struct lora_range {
    double lo, hi;
    uint64_t n;
} lora_range;

void lora_range_add(lora_range *r, double v);

typedef struct lora_scan {
    lora_range rank, alpha_tensor; /* factor ranks; per-module ".alpha" tensors (kohya) */
    const char *alpha_key; /* metadata key of the adapter-wide alpha, or NULL */
    double alpha;
    ferry_dtype factor_dtype; /* of the first A factor; FERRY_DTYPE_NONE when none */
} lora_scan;

/* Scans adapter catalog C: the rank of every A factor (PEFT, kohya, GGUF names), the finite
 * per-module alphas, and the first adapter-wide alpha among the metadata keys adapter tools use
 * (a number, or a string holding one). *S keeps pointers into C. */
void lora_scan_adapter(const ferry_catalog *c, lora_scan *s);

/* Adds to *SCALE the scale of every adapter term on every tensor of F (at the multipliers set). */
void lora_scan_scales(ferry *f, lora_range *scale);

#endif
