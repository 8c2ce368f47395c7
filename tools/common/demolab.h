/*
 * demolab.h — the measurements of `ferry demo`: where its sample model lives (and whether one
 * already there can be reused), cold and warm loads beside the machine's limits, streaming
 * through a host budget, and a LoRA adapter merged at staging and switched. The command prints;
 * these measure and fill demolab_figures. Uses only the public header ferry.h; part of
 * ferry_tools.
 */
#ifndef FERRY_DEMOLAB_H
#define FERRY_DEMOLAB_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "layers.h"
#include "synth.h"

/* Everything the demo measured, for its summary: GB/s unless named _s (seconds) or bytes. */
typedef struct demolab_figures {
    double direct, fresh, memcpy_bw, cold, warm, zero_copy_s;
    double stream_s, stream_gbps;
    uint64_t stream_read, stream_opt, budget, host_peak;
    double merge_s, switch_s;
    uint64_t switch_read;
    double gen_tok_s, gen_bound;
} demolab_figures;

/* mkdir -p DIR; 0 or -1 with errno. */
int demolab_make_dirs(const char *dir);
/* $XDG_CACHE_HOME/ferry or ~/.cache/ferry into BUF; -1 when neither is set. */
int demolab_cache_dir(char *buf, size_t len);
/* 1 when PATH opens and holds exactly the planned tensors of M (names, dtypes, sizes) and seed. */
int demolab_reusable(const char *path, const synth_model *m);

/* Seconds ferry takes to load PATH to its home (host) with policy P, cold (the file dropped from
 * the page cache first) when COLD; a negative value after printing why. */
double demolab_timed_load(const char *path, const ferry_policy *p, int cold);

/* Cold loads (DIRECT) beside O_DIRECT reads and first touch of fresh memory, warm loads (READ)
 * beside memcpy, median of 3 each, alternating limit and load; then one zero-copy load. MODEL is
 * the tensor bytes of PATH. Fills direct, fresh, cold, memcpy_bw, warm, zero_copy_s; returns 0 or
 * CLI_EXIT_FAIL after printing why. */
int demolab_load(const char *path, uint64_t model, demolab_figures *fig);

/* The streaming step: a manager on PATH (home disk) whose host budget is a quarter of the model,
 * raised to the working set when a quarter cannot hold it. */
typedef struct demolab_stream {
    ferry *f;
    layer_set *sets;
    size_t nsets;
    size_t blocks;        /* layers whose key ends in a number ("blk.3"); the rest embed / head */
    uint64_t budget;
    const char *why;      /* "a quarter" or "raised to the working set" */
    uint64_t working_set; /* W: the layer in use plus the one prefetched, at their largest */
    float *x, *y;
    double pass_s[4];
    uint64_t pass_read[4];
    ferry_stats stats;    /* after the last pass */
} demolab_stream;

/* Opens the step (nothing measured yet); 0 or CLI_EXIT_FAIL after printing why. Close it either
 * way. */
int demolab_stream_open(const char *path, uint64_t model, demolab_stream *s);
/* Four passes from a cold file: each prepares every layer in turn, a matvec per weight, releases.
 * A progress bar unless QUIET. Fills s->pass_s, pass_read, stats and FIG's stream figures;
 * returns 0 or CLI_EXIT_FAIL after printing why. */
int demolab_stream_run(demolab_stream *s, const char *path, uint64_t model, int quiet,
                       demolab_figures *fig);
void demolab_stream_close(demolab_stream *s);

/* Makes ADAPTER for PATH (PEFT, rank 16, seed 7, through ferry_gen_lora) unless it exists;
 * 0 or CLI_EXIT_FAIL after printing why. */
int demolab_lora_make(const char *path, const char *adapter);
/* The LoRA step: ADAPTER merged at staging into every weight of PATH (home host), then its
 * multiplier switched to 0.5 and every weight restaged. Fills *INFO and FIG's merge_s, switch_s
 * and switch_read; returns 0 or CLI_EXIT_FAIL after printing why. */
int demolab_lora(const char *path, const char *adapter, ferry_lora_info *info,
                 demolab_figures *fig);

#endif
