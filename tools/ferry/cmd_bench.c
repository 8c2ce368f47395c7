/*
 * cmd_bench.c — `ferry bench FILE`: how fast ferry loads and streams a model, each figure beside
 * the machine's own limit measured in the same run, with the ratio. The protocol (what is
 * measured, in which order, and the bounds the streams are judged against) is benchlab.c's;
 * this file parses the options and prints the figures as a table or one JSON object.
 * `ferry bench --moe` replays routing traces through the expert policies (moelab.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchlab.h"
#include "commands.h"
#include "moelab.h"

/* ---- ferry bench --moe -------------------------------------------------------------------- */

static const char *moe_col_name(int c)
{
    return c == MOELAB_BELADY ? "belady" : ferry_cache_policy_name((ferry_cache_policy)c);
}

static void moe_text(const moelab *m)
{
    const moelab_trace *t = &m->trace;
    char s1[32], s2[32];
    printf("ferry bench --moe: %s, %zu tokens, %u layers x %u experts, up to %u used per layer "
           "and token; %s of experts (%s each%s)\n",
           m->trace_path ? m->trace_path : "synthetic trace", t->tokens, t->layers, t->experts,
           t->used, cli_size(m->total_bytes, s1),
           cli_size(m->total_bytes / ((uint64_t)t->layers * t->experts), s2),
           m->sizes_differ ? " on average" : "");
    printf("ferry: the lowest estimated value of the next use first (learned per expert and "
           "layer); lfu-floor: ferry's before, a floor per layer, the last token's experts, LFU "
           "with dynamic aging; belady: furthest next use%s%s\n\n",
           m->sizes_differ ? " (sizes differ: an approximation of the optimum)" : " (the optimum)",
           m->has_bound ? "; bound: the lowest probability of a use soon, by the trace's "
                          "generating model" : "");
    printf("  %-8s %-10s %-9s %9s %9s %14s %9s\n", "cache", "bytes", "policy", "hit rate",
           "/ belady", "bytes/token", "/ belady");
    for (size_t i = 0; i < m->n_sizes; i++) {
        const moelab_size *z = &m->sizes[i];
        const moelab_result *b = &z->r[MOELAB_BELADY];
        for (int c = 0; c < MOELAB_N_COLS; c++) {
            const moelab_result *r = &z->r[c];
            char slots[24];
            snprintf(slots, sizeof slots, "%llu", (unsigned long long)z->slots);
            printf("  %-8s %-10s %-9s %9.4f %9.3f %14.0f %9.3f\n", c ? "" : slots,
                   c ? "" : cli_size(z->capacity, s1), moe_col_name(c), r->hit_rate,
                   b->hit_rate > 0 ? r->hit_rate / b->hit_rate : 0, r->bytes_per_token,
                   b->bytes_per_token > 0 ? r->bytes_per_token / b->bytes_per_token : 0);
        }
        if (m->has_bound) {
            const moelab_result *r = &z->bound;
            printf("  %-8s %-10s %-9s %9.4f %9.3f %14.0f %9.3f\n", "", "", "bound", r->hit_rate,
                   b->hit_rate > 0 ? r->hit_rate / b->hit_rate : 0, r->bytes_per_token,
                   b->bytes_per_token > 0 ? r->bytes_per_token / b->bytes_per_token : 0);
        }
    }
}

static void moe_json_result(cli_json *j, const moelab_result *r)
{
    cli_json_begin_object(j, 1);
    cli_json_key(j, "uses");
    cli_json_u64(j, r->uses);
    cli_json_key(j, "hits");
    cli_json_u64(j, r->hits);
    cli_json_key(j, "bytes_read");
    cli_json_u64(j, r->bytes_read);
    cli_json_key(j, "hit_rate");
    cli_json_f64(j, r->hit_rate);
    cli_json_key(j, "bytes_per_token");
    cli_json_f64(j, r->bytes_per_token);
    cli_json_end_object(j);
}

static void moe_json(const moelab *m)
{
    const moelab_trace *t = &m->trace;
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
    cli_json_key(&j, "trace");
    if (m->trace_path)
        cli_json_string(&j, m->trace_path);
    else
        cli_json_null(&j);
    cli_json_key(&j, "tokens");
    cli_json_u64(&j, t->tokens);
    cli_json_key(&j, "layers");
    cli_json_u64(&j, t->layers);
    cli_json_key(&j, "experts");
    cli_json_u64(&j, t->experts);
    cli_json_key(&j, "experts_used");
    cli_json_u64(&j, t->used);
    cli_json_key(&j, "expert_bytes_total");
    cli_json_u64(&j, m->total_bytes);
    cli_json_key(&j, "belady_exact");
    cli_json_bool(&j, !m->sizes_differ);
    cli_json_key(&j, "caches");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < m->n_sizes; i++) {
        const moelab_size *z = &m->sizes[i];
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "experts");
        cli_json_u64(&j, z->slots);
        cli_json_key(&j, "bytes");
        cli_json_u64(&j, z->capacity);
        for (int c = 0; c < MOELAB_N_COLS; c++) {
            cli_json_key(&j, moe_col_name(c));
            moe_json_result(&j, &z->r[c]);
        }
        cli_json_key(&j, "bound");
        if (m->has_bound)
            moe_json_result(&j, &z->bound);
        else
            cli_json_null(&j);
        cli_json_end_object(&j);
    }
    cli_json_end_array(&j);
    cli_json_end_object(&j);
    cli_json_finish(&j);
}

/* A number in [LO, HI] from --OPT's value S into *OUT: 0, or CLI_EXIT_USAGE. */
static int moe_arg_f64(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi))
        return cli_usage_error("bench", "--%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    *out = v;
    return 0;
}

static int bench_moe(int argc, char **argv)
{
    static const char *help =
        "usage: ferry bench --moe [--trace FILE | synthetic options] [options]\n"
        "\n"
        "Replays a routing trace of mixture-of-experts layers through ferry's expert eviction\n"
        "policy, LRU, LFU (with dynamic aging), LRFU and lfu-floor (the policy ferry used\n"
        "before), beside the offline optimum (Belady's furthest next use; an approximation when\n"
        "experts differ in size) and, for a synthetic trace, an online bound (evicting by the\n"
        "trace's generating model), at caches of 1/8, 1/4 and 1/2 of the experts: hit rate and\n"
        "bytes read per token. A simulation over expert ids and bytes: nothing is read, nothing\n"
        "timed.\n"
        "\n"
        "The trace file has one line per token; on it, per layer, a field L<layer>:<e>,<e>,...\n"
        "(the experts its router chose), fields separated by spaces; '#' starts a comment line.\n"
        "`ferry generate --trace-routing FILE` writes one.\n"
        "\n"
        "options:\n"
        "  --trace FILE           the trace (default: a synthetic one)\n"
        "  --experts N            experts per layer (synthetic: 64; a file: its largest id + 1)\n"
        "  --experts-used K       synthetic: experts each layer uses per token (default 2)\n"
        "  --layers L             synthetic: MoE layers (default 8)\n"
        "  --tokens T             synthetic: tokens (default 4000)\n"
        "  --zipf S               synthetic: Zipf exponent of expert popularity (default 1.0)\n"
        "  --locality P           synthetic: probability that a token keeps the previous\n"
        "                         token's expert in a slot (default 0.5)\n"
        "  --seed N               synthetic: random seed (default 1)\n"
        "  --expert-bytes SIZE    bytes of one expert (default 1MiB)\n"
        "  --model FILE           expert sizes from FILE's tensors (*_exps*, .experts.<n>.)\n"
        "  --cache N              also a cache of N experts\n"
        "  --json                 one JSON object on stdout\n";
    const char *trace = NULL, *experts = NULL, *used = NULL, *layers = NULL, *tokens = NULL,
               *zipf = NULL, *locality = NULL, *seed = NULL, *ebytes = NULL, *model = NULL,
               *cache = NULL;
    int json = 0, moe = 0;
    cli_opt opts[] = {
        {"moe", 0, CLI_OPT_FLAG, &moe},
        {"trace", 0, CLI_OPT_STRING, &trace},
        {"experts", 0, CLI_OPT_STRING, &experts},
        {"experts-used", 0, CLI_OPT_STRING, &used},
        {"layers", 0, CLI_OPT_STRING, &layers},
        {"tokens", 0, CLI_OPT_STRING, &tokens},
        {"zipf", 0, CLI_OPT_STRING, &zipf},
        {"locality", 0, CLI_OPT_STRING, &locality},
        {"seed", 0, CLI_OPT_STRING, &seed},
        {"expert-bytes", 0, CLI_OPT_STRING, &ebytes},
        {"model", 0, CLI_OPT_STRING, &model},
        {"cache", 0, CLI_OPT_STRING, &cache},
        {"json", 0, CLI_OPT_FLAG, &json},
    };
    int npos = 0;
    int prc = cli_parse("bench", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (prc == CLI_HELP) {
        printf("%s", help);
        return CLI_EXIT_OK;
    }
    if (prc)
        return prc;
    if (npos > 0)
        return cli_usage_error("bench", "--moe takes no model file ('%s'; --model FILE gives "
                               "expert sizes)", argv[1]);
    if (trace && (used || layers || tokens || zipf || locality || seed))
        return cli_usage_error("bench", "--trace FILE and the synthetic options (--layers, "
                               "--experts-used, --tokens, --zipf, --locality, --seed) exclude "
                               "each other");
    if (model && ebytes)
        return cli_usage_error("bench", "--model and --expert-bytes exclude each other");
    static moelab m;
    memset(&m, 0, sizeof m);
    m.trace_path = trace;
    m.model = model;
    m.zipf = m.locality = -1;
    uint64_t v;
    if (experts) {
        if (cli_arg_u64("bench", "experts", experts, 1, MOELAB_MAX_EXPERTS, &v))
            return CLI_EXIT_USAGE;
        m.experts = (uint32_t)v;
    }
    if (used) {
        if (cli_arg_u64("bench", "experts-used", used, 1, MOELAB_MAX_EXPERTS, &v))
            return CLI_EXIT_USAGE;
        m.used = (uint32_t)v;
    }
    if (layers) {
        if (cli_arg_u64("bench", "layers", layers, 1, MOELAB_MAX_LAYERS, &v))
            return CLI_EXIT_USAGE;
        m.layers = (uint32_t)v;
    }
    if (tokens) {
        if (cli_arg_u64("bench", "tokens", tokens, 1, 100000000, &v))
            return CLI_EXIT_USAGE;
        m.tokens = (size_t)v;
    }
    if (seed && cli_arg_u64("bench", "seed", seed, 1, UINT64_MAX, &m.seed))
        return CLI_EXIT_USAGE;
    if (zipf && moe_arg_f64("zipf", zipf, 0, 10, &m.zipf))
        return CLI_EXIT_USAGE;
    if (locality && moe_arg_f64("locality", locality, 0, 1, &m.locality))
        return CLI_EXIT_USAGE;
    if (ebytes) {
        if (cli_arg_size("bench", "expert-bytes", ebytes, &m.expert_bytes))
            return CLI_EXIT_USAGE;
        if (m.expert_bytes == 0 || m.expert_bytes > (1ull << 40))
            return cli_usage_error("bench", "--expert-bytes: '%s' is not in [1 B, 1 TiB]", ebytes);
    }
    if (cache && cli_arg_u64("bench", "cache", cache, 1, UINT32_MAX, &m.cache_slots))
        return CLI_EXIT_USAGE;
    if (!trace && (uint64_t)(m.layers ? m.layers : 8) * (m.experts ? m.experts : 64) >
                      MOELAB_MAX_UNITS)
        return cli_usage_error("bench", "--layers x --experts: too many experts to simulate");
    int rc = moelab_run(&m);
    if (!rc) {
        if (m.cache_slots && m.cache_slots > (uint64_t)m.trace.layers * m.trace.experts)
            fprintf(stderr, "ferry bench: --cache %llu holds every expert\n",
                    (unsigned long long)m.cache_slots);
        if (json)
            moe_json(&m);
        else
            moe_text(&m);
    }
    moelab_free(&m);
    return rc;
}

/* ---- report ------------------------------------------------------------------------------ */

static double min2(double a, double b) { return a < b ? a : b; }

static double ratio(double num, double den) { return den > 0 ? num / den : 0; }

/* One figure beside its limit; returns 1 when the ratio is above 1 (marked with '!'). */
static int print_row(const char *what, double gbs, const char *limit_name, double limit)
{
    double r = ratio(gbs, limit);
    printf("  %-38s %8.3f   %-28s %8.3f   %6.2f%s\n", what, gbs, limit_name, limit, r,
           r > 1.0 ? " !" : "");
    return r > 1.0;
}


static void report_text(benchlab *b, const char *load_before, const char *load_after)
{
    char s1[32], s2[32], s3[32];
    double *v = b->med;
    double cold_lim = min2(v[BENCHLAB_DISK], v[BENCHLAB_FRESH]), warm_lim = min2(v[BENCHLAB_MEMCPY], v[BENCHLAB_FRESH]);
    printf("ferry bench %s: %s of tensors in %zu file(s), %zu tensors in %zu layers; "
           "working set %s\n",
           b->path, cli_size(b->model, s1), b->n_files, b->n_tensors, b->n_layers,
           cli_size(b->working_set, s2));
    if (b->streams_only)
        printf("streams only; load average %s before, %s after\n\n", load_before, load_after);
    else
        printf("%zu run(s), medians; %.0f s of rest before each load, %.0f s before each first "
               "pass and its limit; load average %s before, %s after\n\n", b->runs, b->settle,
               4 * b->settle, load_before, load_after);
    printf("  %-38s %8s\n", "limits", "GB/s");
    if (b->no_direct) {
        printf("  %-38s %8.3f   (O_DIRECT refused here: a cold buffered read)\n", "disk read",
               v[BENCHLAB_DIRECT]);
    } else {
        printf("  %-38s %8.3f   (%u reader(s) x %s requests, before each cold load)\n",
               "O_DIRECT read", v[BENCHLAB_DIRECT], b->direct_readers, cli_size(b->direct_request, s3));
        printf("  %-38s %8.3f   (best of the sweep over 1-8 readers x 16/64 MiB)\n",
               "O_DIRECT read, sweep", v[BENCHLAB_DIRECT_SWEEP]);
        if (v[BENCHLAB_DIRECT_RELAY] > 0)
            printf("  %-38s %8.3f   (%u readers x 512 KiB, each through a slot of its own, the "
                   "faster of 16 and 32: %.2f x the O_DIRECT read before it)\n",
                   "O_DIRECT through relay slots", v[BENCHLAB_DIRECT_RELAY], b->relay_readers,
                   v[BENCHLAB_RELAY_GAIN]);
        printf("  %-38s %8.3f   (the faster of the two, both measured before each cold load and "
               "stream pass where relaying gained: every bound's)\n",
               "disk", v[BENCHLAB_DISK]);
    }
    if (!b->streams_only) {
        printf("  %-38s %8.3f\n", "cold buffered read (one thread)", v[BENCHLAB_BUFFERED]);
        printf("  %-38s %8.3f\n", "memcpy", v[BENCHLAB_MEMCPY]);
        printf("  %-38s %8.3f   (best with %u thread(s))\n", "fresh memory, first touch",
               v[BENCHLAB_FRESH], b->fresh_threads);
        printf("  %-38s %8.3f   (best with %u thread(s); M / 4 of it)\n",
               "fresh memory in 2 MiB pages", v[BENCHLAB_FRESH_HUGE], b->fresh_huge_threads);
        if (v[BENCHLAB_COLD_LIMIT] > 0)
            printf("  %-38s %8.3f   (the model into fresh memory, %s the fastest)\n",
                   "O_DIRECT into fresh memory", v[BENCHLAB_COLD_LIMIT],
                   b->cold_limit_relayed                         ? "small pages through relay slots"
                   : b->cold_limit_pages == LIMITS_PAGES_SMALL ? "small pages"
                                                                : "huge pages");
        char what[48];
        snprintf(what, sizeof what, "memory read (%u thread%s)", b->read_threads,
                 b->read_threads == 1 ? "" : "s");
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        printf("  %-38s %8.3f   (best of 1-%ld threads, resident buffer beyond the LLC)\n", what,
               v[BENCHLAB_READ], cpus > 0 ? cpus : 1L);
        double cgb = v[BENCHLAB_COMPUTE] > 0 ? (double)b->model / v[BENCHLAB_COMPUTE] / 1e9 : 0.0;
        printf("  %-38s %8.3f   (%.3f s per pass, %u thread%s; %.2f of memory read)\n",
               "resident compute (matvec every weight)", cgb, v[BENCHLAB_COMPUTE], b->threads,
               b->threads == 1 ? "" : "s", ratio(cgb, v[BENCHLAB_READ]));
        if (v[BENCHLAB_OVERLAP_READ] > 0)
            printf("  %-38s %8.2f   (the compute at %.2f of its speed alone)\n",
                   "O_DIRECT read while computing / alone", v[BENCHLAB_OVERLAP_READ],
                   v[BENCHLAB_OVERLAP_COMPUTE]);
    }
    int above = 0;
    if (b->streams_only)
        printf("\n  (--streams: no loads measured, no compute limit: the bounds are the disk's)\n");
    else
        printf("\n  %-38s %8s   %-28s %8s   %6s\n", "loads (to ready)", "GB/s", "limit", "GB/s",
               "ratio");
    if (!b->streams_only) {
        above |= print_row("cold, auto (ferry's choice)", v[BENCHLAB_COLD_AUTO],
                           "min(disk, fresh memory)", cold_lim);
        if (b->cold.decided) {
            char map[48] = "not measured", dear[96] = "";
            if (b->cold.map_gbps > 0)
                snprintf(map, sizeof map, "%.2f GB/s", b->cold.map_gbps);
            if (b->cold.dear)
                snprintf(dear, sizeof dear,
                         " in small pages, free 2 MiB blocks handed back; relayed read %.2f",
                         b->cold.read_gbps);
            printf("    auto read uncached bytes %s (%s: populating the mapping %s, private "
                   "copies %.2f, fresh memory %.2f%s); %.2f of mmap + populate\n",
                   b->cold.map ? "through the mapping" : "into private copies",
                   b->cold.forced ? "FERRY_AUTO_COLD" : "measured", map, b->cold.private_gbps,
                   b->cold.fault_gbps, dear,
                   ratio(v[BENCHLAB_COLD_AUTO], v[BENCHLAB_MMAP_POPULATE]));
        }
        if (v[BENCHLAB_COLD_LIMIT] > 0)
            printf("    %.2f of a plain program's O_DIRECT read into fresh memory\n",
                   ratio(v[BENCHLAB_COLD_AUTO], v[BENCHLAB_COLD_LIMIT]));
        above |= print_row("cold, direct (private copy)", v[BENCHLAB_COLD_DIRECT],
                           "min(disk, fresh memory)", cold_lim);
        above |= print_row("cold, mmap page faults", v[BENCHLAB_MMAP_FAULT], "min(disk, fresh memory)",
                           cold_lim);
        above |= print_row("cold, mmap + populate (llama.cpp)", v[BENCHLAB_MMAP_POPULATE],
                           "min(disk, fresh memory)", cold_lim);
        above |= print_row("warm, read (private copy)", v[BENCHLAB_WARM_READ], "min(memcpy, fresh memory)",
                           warm_lim);
        if (!b->auto_copies)
            printf("  %-38s  no copy: resident in %.3f s\n", "warm, auto (zero-copy)",
                   v[BENCHLAB_WARM_AUTO]);
        else
            above |= print_row("warm, auto (copies some tensors)",
                               v[BENCHLAB_WARM_AUTO] > 0 ? (double)b->model / v[BENCHLAB_WARM_AUTO] / 1e9 : 0,
                               "min(memcpy, fresh memory)", warm_lim);
    }
    if (b->worst_cached > 0.01)
        printf("  (warning: up to %.1f%% of the file stayed in the page cache before a cold "
               "run)\n",
               b->worst_cached * 100);
    for (size_t i = 0; i < b->n_streams; i++) {
        benchlab_stream *r = &b->streams[i];
        if (i == 0 || (r->device != NULL) != (b->streams[i - 1].device != NULL) ||
            r->split != b->streams[i - 1].split) {
            if (r->split) {
                printf("\n  streams: split over");
                for (int k = 0; k < b->n_split; k++)
                    printf("%s %s (weight %g)", k ? "," : "", b->split_devs[k].name,
                           b->split_devs[k].weight);
                printf("; home host, load auto, each device's budget 1/4 of its share; passes "
                       "2..%u\n",
                       r->passes);
            } else if (r->device)
                printf("\n  streams: compute %s, home host, load auto, device budget; passes "
                       "2..%u; link %.2f GB/s (%s)\n",
                       r->device, r->passes, b->device_bw / 1e9,
                       b->device_bw_measured ? "measured: pinned host -> device copies"
                                             : "the spec's");
            else
                printf("\n  streams: home disk, compute cpu, load auto, host budget, file dropped "
                       "before each pass; passes 2..%u\n",
                       r->passes);
            printf("  %-12s %12s %12s %10s %10s %10s   %s\n", "budget", "read/pass", "optimal",
                   "s/pass", "bound s", "efficiency",
                   "readers x request; first pass s, eff. (of its own limit, B kept fresh)");
        }
        if (r->capped && (i == 0 || !b->streams[i - 1].capped))
            printf("  capped: inside %s of %s, host budget C - 256 MiB, %zu prepares a pass "
                   "(layers above B/32 by tensor, tensors above it by row range), W %s\n",
                   b->cap_where, cli_size(b->cap, s1), r->sets,
                   cli_size(r->working_set, s2));
        char bud[40], io[96];
        snprintf(bud, sizeof bud, "%s%s", cli_size(r->budget, s1), r->raised ? "*" : "");
        snprintf(io, sizeof io, "%u x %s; %.3f, %.2f (%.2f)", r->readers, cli_size(r->request, s3),
                 r->first_seconds, r->first_efficiency, r->first_machine_efficiency);
        printf("  %-12s %12s %12s %10.3f %10.3f %10.2f%s   %s\n", bud, cli_size(r->bytes_med, s2),
               cli_size(r->optimal, s3), r->seconds_med, r->bound, r->efficiency,
               r->efficiency > 1.0 ? " !" : "  ", io);
        if (r->overlap_bound > 0)
            printf("  %-12s %12s %12s %10s %10.3f %10.2f     the CPUs shared as measured\n", "",
                   "", "", "", r->overlap_bound, r->overlap_efficiency);
        if (r->capped)
            printf("  %-12s passes per second %.3f beside 0.8 x disk / (M - B) = %.3f: %.2f\n",
                   "", r->passes_per_second, r->target_passes_per_second,
                   r->target_passes_per_second > 0
                       ? r->passes_per_second / r->target_passes_per_second
                       : 0.0);
        above |= r->efficiency > 1.0;
        for (int k = 0; r->split && k < b->n_split; k++) {
            const benchlab_split_dev *sd = &b->split_devs[k];
            char s4[32];
            if (sd->bw <= 0) {
                printf("    %-22s read in place from the host copy: no transfer\n", sd->name);
                continue;
            }
            printf("    %-22s share %s, budget %s%s, W %s, optimal %s at %.2f GB/s: %.3f s\n",
                   sd->name, cli_size(sd->share, s1), cli_size(sd->budget, s2),
                   sd->raised ? "*" : "", cli_size(sd->working_set, s3),
                   cli_size(sd->optimal, s4), sd->bw / 1e9, sd->transfer_s);
        }
    }
    if (b->cap && b->cap_why[0])
        printf("\n  capped stream (--cap %s): not run: %s\n", cli_size(b->cap, s1), b->cap_why);
    if (b->n_io_points) {
        printf("\n  the streams' I/O settings, swept at budget M/4 (the second of two passes):\n");
        printf("  %-8s %10s %10s %12s\n", "readers", "request", "s/pass", "read/pass");
        for (size_t k = 0; k < b->n_io_points; k++) {
            const benchlab_io_point *pt = &b->io_points[k];
            printf("  %-8u %10s %10.3f %12s%s\n", pt->readers, cli_size(pt->request, s1),
                   pt->seconds, cli_size(pt->bytes, s2),
                   pt->readers == b->stream_readers && pt->request == b->stream_request
                       ? "   <- used"
                       : "");
        }
    }
    for (size_t i = 0; i < b->n_streams; i++)
        if (b->streams[i].raised) {
            printf("  * raised to the working set, the least budget a pass can run in\n");
            break;
        }
    printf("\n  bound = max(resident compute, (M - B + W) / disk), disk the faster of the O_DIRECT "
           "read and the\n  relayed read (where it gained), both measured between the passes%s;\n"
           "  efficiency = bound / measured\n",
           b->device ? " on the cpu, (M - B + W) / link bandwidth on the device" : "");
    if (v[BENCHLAB_OVERLAP_READ] > 0)
        printf("  the CPUs shared: the read and the compute at once, each at the rate it keeps "
               "while the other\n    runs (measured above), until one is done, then the other "
               "alone\n");
    if (b->split)
        printf("  split: bound = max over its devices of (M_i - B_i + W_i) / BW_i, the slowest "
               "device's share\n    through its own link (the devices copy in parallel): M_i "
               "the bytes placed on device i,\n    B_i = M_i/4 its budget, W_i its part of the "
               "two largest consecutive layers\n");
    if (above)
        printf("  ! above 1: the limit did not bound that run (noise between runs, or a path it "
               "does not cover:\n    the page cache's readahead can beat O_DIRECT, a warm copy "
               "can reuse memory)\n");
}

static void json_stream(cli_json *j, const benchlab_stream *r, const benchlab *b)
{
    cli_json_begin_object(j, 1);
    cli_json_key(j, "device");
    cli_json_string(j, r->device ? r->device : "cpu");
    cli_json_key(j, "budget_bytes");
    cli_json_u64(j, r->budget);
    cli_json_key(j, "budget_raised_to_working_set");
    cli_json_bool(j, r->raised);
    cli_json_key(j, "bytes_read_per_pass");
    cli_json_u64(j, r->bytes_med);
    cli_json_key(j, "optimal_bytes_per_pass");
    cli_json_u64(j, r->optimal);
    cli_json_key(j, "working_set_bytes");
    cli_json_u64(j, r->working_set ? r->working_set : b->working_set);
    cli_json_key(j, "prepares_per_pass");
    cli_json_u64(j, r->sets);
    cli_json_key(j, "seconds_per_pass");
    cli_json_f64(j, r->seconds_med);
    cli_json_key(j, "bound_seconds_per_pass");
    cli_json_f64(j, r->bound);
    cli_json_key(j, "compute_seconds_per_pass");
    cli_json_f64(j, r->compute_s);
    cli_json_key(j, "transfer_seconds_per_pass");
    cli_json_f64(j, r->transfer_s);
    cli_json_key(j, "efficiency");
    cli_json_f64(j, r->efficiency);
    cli_json_key(j, "overlap_bound_seconds_per_pass");
    cli_json_f64(j, r->overlap_bound);
    cli_json_key(j, "overlap_efficiency");
    cli_json_f64(j, r->overlap_efficiency);
    cli_json_key(j, "request_bytes");
    cli_json_u64(j, r->request);
    cli_json_key(j, "readers");
    cli_json_u64(j, r->readers);
    cli_json_key(j, "first_pass_seconds");
    cli_json_f64(j, r->first_seconds);
    cli_json_key(j, "first_pass_faulted_ahead_bytes");
    cli_json_u64(j, r->first_ahead);
    cli_json_key(j, "first_pass_bound_seconds");
    cli_json_f64(j, r->first_bound);
    cli_json_key(j, "first_pass_efficiency");
    cli_json_f64(j, r->first_efficiency);
    cli_json_key(j, "first_pass_fault_seconds");
    cli_json_f64(j, r->first_fault_s);
    cli_json_key(j, "first_pass_limit_seconds");
    cli_json_f64(j, r->first_limit_s);
    cli_json_key(j, "first_pass_limit_faulters");
    cli_json_u64(j, r->first_limit_faulters);
    cli_json_key(j, "first_pass_limit_pages");
    cli_json_string(j, r->first_limit_pages == LIMITS_PAGES_SMALL ? "small" : "huge");
    cli_json_key(j, "first_pass_machine_efficiency");
    cli_json_f64(j, r->first_machine_efficiency);
    cli_json_key(j, "capped");
    cli_json_bool(j, r->capped);
    if (r->capped) {
        cli_json_key(j, "cap_bytes");
        cli_json_u64(j, b->cap);
        cli_json_key(j, "passes_per_second");
        cli_json_f64(j, r->passes_per_second);
        cli_json_key(j, "target_passes_per_second");
        cli_json_f64(j, r->target_passes_per_second);
    }
    if (!r->device) {
        cli_json_key(j, "direct_read_gbps_between_passes");
        cli_json_f64(j, r->limit_med);
        cli_json_key(j, "disk_read_gbps_between_passes");
        cli_json_f64(j, r->disk_med);
    } else if (!r->split) {
        cli_json_key(j, "link_gbps");
        cli_json_f64(j, b->device_bw / 1e9);
        cli_json_key(j, "link_measured");
        cli_json_bool(j, b->device_bw_measured);
    }
    if (r->split) {
        cli_json_key(j, "bound_definition");
        cli_json_string(j, "max over split devices of (M_i - B_i + W_i) / BW_i");
        cli_json_key(j, "split_devices");
        cli_json_begin_array(j, 1);
        for (int k = 0; k < b->n_split; k++) {
            const benchlab_split_dev *sd = &b->split_devs[k];
            cli_json_begin_object(j, 1);
            cli_json_key(j, "device");
            cli_json_string(j, sd->name);
            cli_json_key(j, "weight");
            cli_json_f64(j, sd->weight);
            cli_json_key(j, "share_bytes");
            cli_json_u64(j, sd->share);
            cli_json_key(j, "budget_bytes");
            cli_json_u64(j, sd->budget);
            cli_json_key(j, "budget_raised_to_working_set");
            cli_json_bool(j, sd->raised);
            cli_json_key(j, "working_set_bytes");
            cli_json_u64(j, sd->working_set);
            cli_json_key(j, "optimal_bytes_per_pass");
            cli_json_u64(j, sd->optimal);
            cli_json_key(j, "bandwidth_bytes_per_second");
            cli_json_f64(j, sd->bw);
            cli_json_key(j, "transfer_seconds_per_pass");
            cli_json_f64(j, sd->transfer_s);
            cli_json_end_object(j);
        }
        cli_json_end_array(j);
    }
    cli_json_key(j, "passes");
    cli_json_u64(j, r->passes);
    cli_json_key(j, "pass_seconds");
    cli_json_begin_array(j, 1);
    for (uint32_t p = 0; p < r->passes; p++)
        cli_json_f64(j, r->seconds[p]);
    cli_json_end_array(j);
    cli_json_key(j, "pass_bytes_read");
    cli_json_begin_array(j, 1);
    for (uint32_t p = 0; p < r->passes; p++)
        cli_json_u64(j, r->bytes[p]);
    cli_json_end_array(j);
    cli_json_end_object(j);
}

static void report_json(benchlab *b)
{
    double *v = b->med;
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
#define NUM(k, x)                                                                                  \
    do {                                                                                           \
        cli_json_key(&j, k);                                                                       \
        cli_json_f64(&j, x);                                                                       \
    } while (0)
#define U64(k, x)                                                                                  \
    do {                                                                                           \
        cli_json_key(&j, k);                                                                       \
        cli_json_u64(&j, x);                                                                       \
    } while (0)
    cli_json_key(&j, "file");
    cli_json_string(&j, b->path);
    U64("model_bytes", b->model);
    U64("file_bytes", b->file_bytes);
    U64("tensors", b->n_tensors);
    U64("layers", b->n_layers);
    U64("runs", b->runs);
    U64("settle_seconds", (uint64_t)b->settle);
    NUM("direct_read_gbps", v[BENCHLAB_DIRECT]);
    NUM("direct_relayed_read_gbps", v[BENCHLAB_DIRECT_RELAY]);
    NUM("direct_relayed_gain", v[BENCHLAB_RELAY_GAIN]);
    U64("direct_relayed_readers", b->relay_readers);
    NUM("disk_read_gbps", v[BENCHLAB_DISK]);
    NUM("direct_read_sweep_gbps", v[BENCHLAB_DIRECT_SWEEP]);
    U64("direct_read_readers", b->direct_readers);
    U64("direct_read_request_bytes", b->direct_request);
    cli_json_key(&j, "direct_read_supported");
    cli_json_bool(&j, !b->no_direct);
    NUM("buffered_read_gbps", v[BENCHLAB_BUFFERED]);
    NUM("memcpy_gbps", v[BENCHLAB_MEMCPY]);
    NUM("fresh_memory_gbps", v[BENCHLAB_FRESH]);
    U64("fresh_memory_threads", b->fresh_threads);
    NUM("fresh_huge_memory_gbps", v[BENCHLAB_FRESH_HUGE]);
    U64("fresh_huge_memory_threads", b->fresh_huge_threads);
    NUM("resident_compute_seconds", v[BENCHLAB_COMPUTE]);
    double cgb = v[BENCHLAB_COMPUTE] > 0 ? (double)b->model / v[BENCHLAB_COMPUTE] / 1e9 : 0;
    NUM("resident_compute_gbps", cgb);
    U64("resident_compute_threads", b->threads);
    NUM("read_bandwidth_gbps", v[BENCHLAB_READ]);
    U64("read_bandwidth_threads", b->read_threads);
    NUM("resident_compute_ratio", ratio(cgb, v[BENCHLAB_READ]));
    NUM("overlap_read_ratio", v[BENCHLAB_OVERLAP_READ]);
    NUM("overlap_compute_ratio", v[BENCHLAB_OVERLAP_COMPUTE]);
    NUM("cold_load_gbps", v[BENCHLAB_COLD_AUTO]);
    NUM("cold_load_direct_gbps", v[BENCHLAB_COLD_DIRECT]);
    NUM("cold_load_vs_populate", ratio(v[BENCHLAB_COLD_AUTO], v[BENCHLAB_MMAP_POPULATE]));
    cli_json_key(&j, "cold_auto_choice");
    cli_json_string(&j, !b->cold.decided ? "undecided" : b->cold.map ? "map" : "private");
    NUM("cold_probe_map_gbps", b->cold.map_gbps);
    NUM("cold_probe_private_gbps", b->cold.private_gbps);
    NUM("cold_probe_fault_gbps", b->cold.fault_gbps);
    NUM("cold_probe_read_gbps", b->cold.read_gbps);
    NUM("warm_load_gbps", v[BENCHLAB_WARM_READ]);
    NUM("warm_auto_seconds", v[BENCHLAB_WARM_AUTO]);
    cli_json_key(&j, "warm_auto_zero_copy");
    cli_json_bool(&j, !b->auto_copies);
    NUM("mmap_fault_load_gbps", v[BENCHLAB_MMAP_FAULT]);
    NUM("mmap_populate_load_gbps", v[BENCHLAB_MMAP_POPULATE]);
    NUM("cold_load_ratio", ratio(v[BENCHLAB_COLD_AUTO], min2(v[BENCHLAB_DISK], v[BENCHLAB_FRESH])));
    NUM("cold_load_direct_ratio", ratio(v[BENCHLAB_COLD_DIRECT], min2(v[BENCHLAB_DISK], v[BENCHLAB_FRESH])));
    NUM("cold_load_ratio_vs_sweep", ratio(v[BENCHLAB_COLD_AUTO], min2(v[BENCHLAB_DIRECT_SWEEP], v[BENCHLAB_FRESH])));
    NUM("warm_load_ratio", ratio(v[BENCHLAB_WARM_READ], min2(v[BENCHLAB_MEMCPY], v[BENCHLAB_FRESH])));
    NUM("cold_load_limit_gbps", v[BENCHLAB_COLD_LIMIT]);
    cli_json_key(&j, "cold_load_limit_pages");
    cli_json_string(&j, !(v[BENCHLAB_COLD_LIMIT] > 0)                    ? "none"
                        : b->cold_limit_relayed                         ? "relayed"
                        : b->cold_limit_pages == LIMITS_PAGES_SMALL ? "small"
                                                                     : "huge");
    double cold_model = min2(v[BENCHLAB_DISK], v[BENCHLAB_FRESH]);
    NUM("cold_load_machine_ratio",
        ratio(v[BENCHLAB_COLD_AUTO], v[BENCHLAB_COLD_LIMIT] > 0
                                         ? min2(cold_model, v[BENCHLAB_COLD_LIMIT])
                                         : cold_model));
    NUM("cold_cached_fraction_max", b->worst_cached);
#undef NUM
#undef U64
    cli_json_key(&j, "stream");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < b->n_streams; i++)
        if (!b->streams[i].device)
            json_stream(&j, &b->streams[i], b);
    cli_json_end_array(&j);
    cli_json_key(&j, "stream_io_sweep");
    cli_json_begin_array(&j, 0);
    for (size_t k = 0; k < b->n_io_points; k++) {
        cli_json_begin_object(&j, 1);
        cli_json_key(&j, "readers");
        cli_json_u64(&j, b->io_points[k].readers);
        cli_json_key(&j, "request_bytes");
        cli_json_u64(&j, b->io_points[k].request);
        cli_json_key(&j, "seconds_per_pass");
        cli_json_f64(&j, b->io_points[k].seconds);
        cli_json_key(&j, "bytes_read_per_pass");
        cli_json_u64(&j, b->io_points[k].bytes);
        cli_json_end_object(&j);
    }
    cli_json_end_array(&j);
    if (b->cap) {
        cli_json_key(&j, "cap");
        cli_json_begin_object(&j, 1);
        cli_json_key(&j, "bytes");
        cli_json_u64(&j, b->cap);
        cli_json_key(&j, "ran");
        cli_json_bool(&j, !b->cap_why[0]);
        cli_json_key(&j, "why_not");
        if (b->cap_why[0])
            cli_json_string(&j, b->cap_why);
        else
            cli_json_null(&j);
        cli_json_end_object(&j);
    }
    if (b->device || b->split) {
        cli_json_key(&j, "device_stream");
        cli_json_begin_array(&j, 0);
        for (size_t i = 0; i < b->n_streams; i++)
            if (b->streams[i].device)
                json_stream(&j, &b->streams[i], b);
        cli_json_end_array(&j);
    }
    cli_json_end_object(&j);
    cli_json_finish(&j);
}

int cmd_bench(int argc, char **argv)
{
    static const char *help =
        "usage: ferry bench FILE [options]\n"
        "       ferry bench --moe [options]  (expert eviction policies on routing traces:\n"
        "                                     ferry bench --moe --help)\n"
        "\n"
        "Measures how fast ferry loads and streams FILE against this machine's own limits,\n"
        "measured in the same run, alternating limit and ferry runs: O_DIRECT (into 256 MiB of\n"
        "buffers or more) and cold buffered reads, memcpy, first touch of fresh memory (small\n"
        "pages, and 2 MiB pages), resident memory read (the best of 1 to\n"
        "online-CPUs threads), resident compute (the fastest of 3 passes on --threads threads,\n"
        "each thread its own range of rows first) and its ratio to that read, the O_DIRECT\n"
        "read and the compute at once (how much each slows the other); ferry's cold\n"
        "loads (load auto and direct, file dropped from the page cache) beside a plain\n"
        "program's O_DIRECT read of the model into fresh memory (small or huge pages, or\n"
        "small ones through relay slots: the fastest), warm loads (read; auto is\n"
        "zero-copy), plain mmap and mmap with populate;\n"
        "then streamed passes (home disk, compute cpu, load auto) under host budgets of 1/4\n"
        "and 1/2 of the model, judged\n"
        "against max(resident compute, (M - B + W) / disk), disk the faster of the O_DIRECT\n"
        "read and, where it gained at the run's start, a read through relay slots (16 or\n"
        "32 readers of 512 KiB, each into a small reused buffer of its own, copied on; the\n"
        "faster), both measured right before each pass, W the two largest consecutive\n"
        "layers, and against the same with the CPUs shared as measured; each\n"
        "first pass also against the same O_DIRECT read by a plain program whose first B\n"
        "bytes go to fresh memory (huge pages, or small ones: the fastest way), as the budget\n"
        "keeps them, the rest into a buffer faulted in before its clock. A stream's rest\n"
        "before its first pass comes after its manager is set up, as an engine's own set-up\n"
        "would: where ferry faults in its streaming buffers meanwhile, the JSON says how much\n"
        "(first_pass_faulted_ahead_bytes). Needs a filesystem that allows O_DIRECT, and rights to drop the\n"
        "file from the page cache (its owner can). Reads the file from the disk about 23 times\n"
        "per run.\n"
        "\n"
        "options:\n"
        "  --runs N               runs of the load measurements, medians quoted (default 3)\n"
        "  --passes N             streamed passes per budget, at least 3 (default 3); the median\n"
        "                         of passes 2..N is judged\n"
        "  --quick                one run, fewer reader counts: a quick look, not a measurement\n"
        "  --settle SECONDS       rest before each load and the fresh-memory test, four times\n"
        "                         that before each stream's first pass and each run of its\n"
        "                         limit, holding no memory, as a program starts (default 4, 0\n"
        "                         with --quick): a VM that reports free memory to its host\n"
        "                         takes back what the step before freed\n"
        "  --device SPEC          also stream with compute on SPEC (sim:SIZE@BW, cuda:N), home\n"
        "                         host, device budget 1/4 of the model: bound (M - B + W) / BW,\n"
        "                         BW the spec's, else the link's measured (pinned copies)\n"
        "  --split SPEC,SPEC[:WEIGHT]  also stream with the 2-D tensors' rows split over these\n"
        "                         devices (as ferry run --split; each sim:SIZE@BW or cpu), home\n"
        "                         host, each device's budget 1/4 of its share M_i: bound =\n"
        "                         max over devices of (M_i - B_i + W_i) / BW_i\n"
        "  --cap SIZE             also a stream inside a memory cgroup of SIZE (root; cgroup v1\n"
        "                         or v2), home disk, host budget SIZE - 256 MiB: passes per\n"
        "                         second beside 0.8 x O_DIRECT / (M - B); says why where it\n"
        "                         cannot run\n"
        "  --streams              the streams only: no loads and no compute limit (the bounds\n"
        "                         are the disk's)\n"
        "  --cap-only             with --cap: the O_DIRECT limit and the capped stream only;\n"
        "                         the stream reads with the limit's fastest readers and request\n"
        "                         size unless --stream-io sets them\n"
        "  --stream-io RxSIZE     the streams' readers and request size (ferry_options\n"
        "                         io_threads, io_request_bytes); default: swept at M/4 over\n"
        "                         1/2/4/8 readers x 4/16/64 MiB, the fastest used\n"
        "  --threads N            threads of the compute passes, rows split among them\n"
        "                         (default: the online CPUs)\n"
        "  --json                 one JSON object on stdout\n"
        "  -q, --quiet            no progress bar\n"
        "streamed passes only (the bounds still count every tensor as streamed):\n"
        "%s";
    const char *runs_s = NULL, *passes_s = NULL, *device = NULL, *split = NULL, *cap = NULL,
               *stream_io = NULL, *threads_s = NULL, *settle_s = NULL;
    int json = 0, quick = 0, quiet = 0, streams_only = 0, cap_only = 0;
    cli_opt opts[] = {
        {"runs", 0, CLI_OPT_STRING, &runs_s},     {"passes", 0, CLI_OPT_STRING, &passes_s},
        {"quick", 0, CLI_OPT_FLAG, &quick},       {"device", 0, CLI_OPT_STRING, &device},
        {"json", 0, CLI_OPT_FLAG, &json},         {"quiet", 'q', CLI_OPT_FLAG, &quiet},
        {"split", 0, CLI_OPT_STRING, &split},     {"cap", 0, CLI_OPT_STRING, &cap},
        {"streams", 0, CLI_OPT_FLAG, &streams_only}, {"stream-io", 0, CLI_OPT_STRING, &stream_io},
        {"cap-only", 0, CLI_OPT_FLAG, &cap_only}, {"threads", 0, CLI_OPT_STRING, &threads_s},
        {"settle", 0, CLI_OPT_STRING, &settle_s},
    };
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (strcmp(argv[i], "--moe") == 0)
            return bench_moe(argc, argv);
    static benchlab b; /* large: the samples */
    memset(&b, 0, sizeof b);
    b.groups.cmd = "bench";
    if (runopts_collect_groups("bench", &b.groups, &argc, argv))
        return CLI_EXIT_USAGE;
    int npos = 0;
    int prc = cli_parse("bench", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (prc == CLI_HELP) {
        printf(help, runopts_group_help);
        return CLI_EXIT_OK;
    }
    if (prc)
        return prc;
    if (npos < 1)
        return cli_usage_error("bench", "no model file given");
    if (npos > 1)
        return cli_usage_error("bench", "one model file at a time");
    ferry_policy base;
    memset(&base, 0, sizeof base);
    prc = runopts_parse_groups("bench", &b.groups, &base); /* checked now, applied per stream */
    runopts_free(&b.groups);
    if (prc)
        return prc;
    b.path = argv[1];
    b.quick = quick;
    uint64_t runs = quick ? 1 : 3, passes = 3;
    if (runs_s && cli_arg_u64("bench", "runs", runs_s, 1, BENCHLAB_MAX_RUNS, &runs))
        return CLI_EXIT_USAGE;
    if (passes_s && cli_arg_u64("bench", "passes", passes_s, 3, BENCHLAB_MAX_PASSES, &passes))
        return CLI_EXIT_USAGE;
    uint64_t threads = 0;
    if (threads_s && cli_arg_u64("bench", "threads", threads_s, 1, BENCHLAB_MAX_THREADS, &threads))
        return CLI_EXIT_USAGE;
    b.threads = (unsigned)threads;
    uint64_t settle = quick ? 0 : 4;
    if (settle_s && cli_arg_u64("bench", "settle", settle_s, 0, 60, &settle))
        return CLI_EXIT_USAGE;
    b.settle = (double)settle;
    b.runs = (size_t)runs;
    b.passes = (uint32_t)passes;
    if (device) {
        if ((prc = runopts_check_device(device)))
            return prc;
        if (benchlab_spec_bandwidth(device, &b.device_bw))
            return cli_usage_error("bench", "--device: bad bandwidth in '%s'", device);
        if (b.device_bw <= 0) {
            /* no bandwidth in the spec (cuda:0): the link's, measured */
            char why[300] = "";
            if (benchlab_link_bandwidth(device, &b.device_bw, why, sizeof why) ||
                b.device_bw <= 0)
                return cli_fail(device, why[0] ? why : "cannot measure the link", -1);
            b.device_bw_measured = 1;
        }
        b.device = device;
    }
    b.split = split;
    b.streams_only = streams_only;
    b.cap_only = cap_only;
    if (cap_only && !cap)
        return cli_usage_error("bench", "--cap-only needs --cap SIZE");
    if (cap && (cli_arg_size("bench", "cap", cap, &b.cap) || b.cap == 0))
        return cli_usage_error("bench", "--cap: '%s' is not a size above 0", cap);
    if (stream_io) {
        char *x = strchr(stream_io, 'x');
        uint64_t rd = 0, rq = 0;
        char num[24];
        size_t n = x ? (size_t)(x - stream_io) : 0;
        if (n && n < sizeof num) {
            memcpy(num, stream_io, n);
            num[n] = 0;
        }
        if (!x || !n || n >= sizeof num || cli_arg_u64("bench", "stream-io", num, 1, 64, &rd) ||
            cli_arg_size("bench", "stream-io", x + 1, &rq) || !rq)
            return cli_usage_error("bench", "--stream-io: '%s' is not READERSxSIZE (e.g. 4x16MiB)",
                                   stream_io);
        b.stream_readers = (uint32_t)rd;
        b.stream_request = rq;
    }
    int rc = benchlab_open(&b);
    if (rc) {
        benchlab_close(&b);
        return rc;
    }
    char before[16], after[16];
    benchlab_load_average(before, sizeof before);
    rc = benchlab_measure(&b, !json && !quiet);
    benchlab_load_average(after, sizeof after);
    if (!rc) {
        if (json)
            report_json(&b);
        else
            report_text(&b, before, after);
    }
    benchlab_close(&b);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

