/*
 * layers.h — how the tool cuts a model into layers, the unit `run`, `bench` and `demo` prepare
 * at once: consecutive tensors (file order) whose names share the part up to the first all-digit
 * component ("blk.3", "down_blocks.1"); a tensor with no such component is a layer of its own
 * (its name without the last component: "output_norm").
 */
#ifndef FERRY_CLI_LAYERS_H
#define FERRY_CLI_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

typedef struct layer_set {
    ferry_tensor **t; /* points into one array shared by all sets (owned by set 0) */
    size_t n;
    uint64_t bytes;   /* bytes of its tensors in the file */
} layer_set;

/* Length of the layer key of NAME. */
size_t layer_key_len(const char *name);
/* The layers of every tensor F finds (ignored ones left out), in file order. 0, or
 * CLI_EXIT_FAIL after printing why. Free with free_sets. */
int build_sets(ferry *f, layer_set **out, size_t *n_out);
void free_sets(layer_set *sets);
/* Cuts every set of more than MAX_BYTES into one set per tensor (the tensors stay in order; set 0
 * still owns the array), so that a pass over a model whose layers are large beside its budget
 * holds a tensor in use and one in flight, not two layers. 0, or CLI_EXIT_FAIL (out of memory:
 * the sets unchanged) after printing why. */
int split_large_sets(layer_set **sets, size_t *n, uint64_t max_bytes);
/* Cuts the lone tensor of every set of more than MAX_BYTES (of 2 or more dims) into row ranges of
 * its outermost dimension (ferry_slice), each a set of its own of at most MAX_BYTES (one row at
 * least), in order: a tensor in use and one in flight then hold two ranges, not two whole tensors
 * (an embedding table and an output head next to each other across a pass's wrap). The sets are
 * rebuilt into a new array that set 0 owns. 0, or CLI_EXIT_FAIL after printing why (the sets
 * unchanged). The manager must govern slices by the recorded order
 * (FERRY_SLICE_EVICT_CYCLIC) for them to be prefetched as the tensors they replace. */
int split_large_tensors(ferry *f, layer_set **sets, size_t *n, uint64_t max_bytes);
/* W: the most bytes two consecutive layers hold together (the last and the first included: a
 * pass wraps around), or the one layer's bytes when there is only one. */
uint64_t sets_working_set(const layer_set *sets, size_t n);

#endif
