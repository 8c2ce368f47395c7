/*
 * moelab.h — `ferry bench --moe`: routing traces of mixture-of-experts layers (synthetic, or read
 * from a file) replayed through ferry's expert policies and the offline optimum (Belady), a pure
 * simulation over ids and bytes. Uses only ferry.h; part of ferry_tools.
 *
 * The trace file (`ferry generate --trace-routing FILE` writes it): text, one line per token; on
 * it, per MoE layer, a field "L<layer>:<expert>,<expert>,..." (decimal, fields separated by
 * spaces or tabs; the experts that layer's router chose for that token, in any order). A layer
 * may be absent from a line (no expert of it used for that token). Blank lines and lines starting
 * with '#' are skipped. Example, 2 layers, 2 of 8 experts each:
 *     # ferry routing trace
 *     L0:3,7 L1:0,5
 *     L0:3,1 L1:5,2
 */
#ifndef FERRY_MOELAB_H
#define FERRY_MOELAB_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define MOELAB_MAX_LAYERS 4096
#define MOELAB_MAX_EXPERTS 65536
#define MOELAB_MAX_SIZES 4
#define MOELAB_MAX_UNITS (1u << 24) /* layers x experts */

/* A routing trace: for each token and layer, the experts used (one step). Unit ids are global:
 * layer * experts + expert. */
typedef struct moelab_trace {
    uint32_t layers, experts; /* L; n per layer */
    uint32_t used;            /* k: the most experts one step uses */
    size_t tokens;
    size_t n_steps;           /* steps with at least one expert (token-major, layer order) */
    size_t *step_start;       /* n_steps + 1 offsets into IDS */
    uint32_t *ids;            /* global unit ids */
    size_t n_ids, cap_ids, cap_steps;
    /* a synthetic trace's generating model (NULL / 0 for a file): per unit the probability of
     * one Zipf draw of its layer choosing it, and the probability of keeping a slot's expert */
    double *draw_p;
    double locality;
} moelab_trace;

/* A synthetic trace: T tokens over L layers of N experts, K per token and layer. Each layer ranks
 * its experts in its own random order with Zipf(S) popularity (S = 0: uniform); each of the K
 * slots keeps the previous token's expert with probability P (temporal locality), else draws
 * from the Zipf law (never an expert already chosen for that step). SEED makes it repeatable.
 * Returns 0, or -1 when out of memory or K > N. */
int moelab_synth(moelab_trace *t, uint32_t layers, uint32_t experts, uint32_t k, size_t tokens,
                 double zipf, double locality, uint64_t seed);
/* Reads a trace file PATH (format above); EXPERTS 0: one more than the largest expert id seen.
 * Returns 0, or CLI_EXIT_FAIL / CLI_EXIT_USAGE after printing the file, line and what is wrong. */
int moelab_read(moelab_trace *t, const char *path, uint32_t experts);
void moelab_trace_free(moelab_trace *t);

/* What one policy did on a trace under one capacity. */
typedef struct moelab_result {
    uint64_t uses, hits, bytes_read;
    double hit_rate;          /* hits / uses */
    double bytes_per_token;   /* bytes_read / tokens */
} moelab_result;

/* Belady's furthest-next-use over T (units of BYTES[id] bytes; capacity CAP): the offline optimum
 * for units of one size, an approximation (not the optimum) when sizes differ. Never evicts a unit
 * of the step being served. Returns 0, or -1 when out of memory or a step does not fit. */
int moelab_belady(const moelab_trace *t, const uint64_t *bytes, uint64_t cap, moelab_result *r);
/* The same trace through ferry_cache_sim with POLICY (FLOOR units per layer kept). 0, or the
 * ferry_cache_sim error code. */
int moelab_replay(const moelab_trace *t, const uint64_t *bytes, uint64_t cap,
                  ferry_cache_policy policy, uint32_t floor, moelab_result *r);

/* The online bound over a synthetic trace T (its generating model known): on a miss, evicts the
 * unit of the lowest value per byte, the value its model probability of a first next use given
 * its layer's last step, discounted by half per HORIZON tokens until that use. 0, or -1 when T
 * has no model, out of memory, or a step does not fit. See moelab.c for the probabilities. */
int moelab_online_bound(const moelab_trace *t, const uint64_t *bytes, uint64_t cap,
                        double horizon, moelab_result *r);
/* The bound's half-life in the bench, in tokens (0.25 to 1 measured within 0.01 of each other in
 * hit rate; longer ones lose where the cache holds about one token's experts per layer). */
#define MOELAB_BOUND_HORIZON 1.0

/* ---- the bench ----------------------------------------------------------------------------- */

enum { MOELAB_BELADY = FERRY_CACHE_POLICY_COUNT, MOELAB_N_COLS };

typedef struct moelab_size {
    uint64_t slots;           /* units the cache holds (of the mean size) */
    uint64_t capacity;        /* bytes */
    moelab_result r[MOELAB_N_COLS]; /* per ferry_cache_policy, then Belady */
    moelab_result bound;      /* the online bound (a synthetic trace only: HAS_BOUND) */
} moelab_size;

typedef struct moelab {
    /* options, set by the caller (zero: default) */
    const char *trace_path;   /* NULL: synthetic */
    uint32_t layers, experts, used; /* synthetic: L (8), N (64), K (2); EXPERTS also for a file */
    size_t tokens;            /* synthetic: 4000 */
    double zipf, locality;    /* synthetic: 1.0, 0.5 (negative: the default) */
    uint64_t seed;            /* synthetic: 1 */
    uint64_t expert_bytes;    /* bytes of one expert (default 1 MiB, or from MODEL) */
    const char *model;        /* a model file: expert bytes per layer from its tensors */
    uint64_t cache_slots;     /* --cache N: one more size, in experts (0: none) */
    uint32_t floor;           /* experts per layer kept by ferry's policies (0: none) */

    /* results, from moelab_run */
    moelab_trace trace;
    uint64_t *bytes;          /* per unit */
    uint64_t total_bytes;     /* of all units */
    int sizes_differ;         /* Belady is then an approximation */
    int has_bound;            /* sizes[].bound holds the online bound (a synthetic trace) */
    const char *ferry_kind;   /* the policy FERRY_CACHE_FERRY is */
    moelab_size sizes[MOELAB_MAX_SIZES];
    size_t n_sizes;
} moelab;

/* Reads or makes the trace, sizes the units, and replays it through every policy and Belady (and
 * for a synthetic trace the online bound, half-life MOELAB_BOUND_HORIZON) at caches of 1/8, 1/4
 * and 1/2 of the units (and M->cache_slots). Returns 0, or CLI_EXIT_FAIL /
 * CLI_EXIT_USAGE after printing why. moelab_free either way. */
int moelab_run(moelab *m);
void moelab_free(moelab *m);

#endif
