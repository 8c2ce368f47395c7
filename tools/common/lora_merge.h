/*
 * lora_merge.h — writing a model with LoRA adapters merged into its weights (`ferry lora merge`).
 * Uses only the public header ferry.h; part of ferry_tools.
 */
#ifndef FERRY_LORA_MERGE_H
#define FERRY_LORA_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"

/* One adapter of a merge: its path, its multiplier, and the id ferry_lora_add gave it. */
typedef struct lora_merge_adapter {
    char *path;
    float mult;
    int id;
} lora_merge_adapter;

typedef struct lora_merge_result {
    ferry_format format;  /* the format written */
    size_t merged;        /* tensors an adapter changed */
    size_t n_tensors;     /* tensors written */
    uint64_t bytes;       /* tensor bytes written */
    double seconds;       /* from the start of the write to its finish */
} lora_merge_result;

/* Writes OUT: BASE with the NAD (1 .. RUNOPTS_MAX_ADAPTERS) adapters AD merged (merge mode,
 * required: a covered weight that cannot take a merge fails), in FMT (FERRY_FORMAT_UNKNOWN: the
 * format of BASE's first file), metadata and tensor order kept, atomically; OUT may be neither
 * BASE nor an adapter (cli_check_output). A pair that matches nothing is a warning on stderr; an
 * adapter matching nothing fails. A progress bar unless QUIET. Fills *RES; returns 0, or the
 * exit status after printing why. */
int lora_merge_write(const char *base, lora_merge_adapter *ad, int nad, const char *out,
                     ferry_format fmt, int quiet, lora_merge_result *res);

#endif
