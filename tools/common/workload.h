/*
 * workload.h — the decode-shaped workload of `ferry run`: passes over a model's layers in file
 * order, each layer prepared, y = W.x taken for every weight of two or more dimensions, checked
 * (--verify) and released. Uses only the public header ferry.h; part of ferry_tools.
 */
#ifndef FERRY_WORKLOAD_H
#define FERRY_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "layers.h"

/* One pass: its time, the bytes ferry read from the files, the time prepares waited. */
typedef struct workload_pass {
    double seconds, stall;
    uint64_t bytes_read;
} workload_pass;

typedef struct workload {
    ferry *f;
    layer_set *sets;     /* the layers, as build_sets made them (not owned) */
    size_t nsets;
    int compute;         /* take the products (the tensors are on a device the host reads) */
    int verify;          /* check every prepared tensor (verify_prepared) */
    int merge_mode;      /* adapters are merged at staging (what verify expects) */
    int cold;            /* drop the files from the page cache before each pass */
    float *x, *y;        /* the vector and the result: the longest row, the most rows */
    double checksum;     /* of the results, so that the products are not optimised away */
    int verify_failed;   /* a tensor failed the check (each printed on stderr) */
} workload;

/* Sets up W over the NSETS layers SETS of F; zero options, to set after. 0, or CLI_EXIT_FAIL
 * after printing why. Free with workload_free either way. */
int workload_init(workload *w, ferry *f, layer_set *sets, size_t nsets);
/* Runs PASSES passes into PS[0..PASSES), a progress bar when PROGRESS. 0 (CLI_EXIT_OK), or
 * CLI_EXIT_FAIL after printing why; a failed check is not a failure here (w->verify_failed). */
int workload_run(workload *w, uint64_t passes, workload_pass *ps, int progress);
void workload_free(workload *w);

#endif
