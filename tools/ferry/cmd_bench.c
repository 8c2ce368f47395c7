/*
 * cmd_bench.c — `ferry bench FILE`: how fast ferry loads and streams a model, each figure beside
 * the machine's own limit measured in the same run, with the ratio. The protocol (what is
 * measured, in which order, and the bounds the streams are judged against) is benchlab.c's;
 * this file parses the options and prints the figures as a table or one JSON object.
 */
#include <stdio.h>
#include <string.h>

#include "benchlab.h"
#include "commands.h"

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
    double cold_lim = min2(v[BENCHLAB_DIRECT], v[BENCHLAB_FRESH]), warm_lim = min2(v[BENCHLAB_MEMCPY], v[BENCHLAB_FRESH]);
    printf("ferry bench %s: %s of tensors in %zu file(s), %zu tensors in %zu layers; "
           "working set %s\n",
           b->path, cli_size(b->model, s1), b->n_files, b->n_tensors, b->n_layers,
           cli_size(b->working_set, s2));
    printf("%zu run(s), medians; load average %s before, %s after\n\n", b->runs, load_before,
           load_after);
    printf("  %-38s %8s\n", "limits", "GB/s");
    if (b->no_direct) {
        printf("  %-38s %8.3f   (O_DIRECT refused here: a cold buffered read)\n", "disk read",
               v[BENCHLAB_DIRECT]);
    } else {
        printf("  %-38s %8.3f   (%u reader(s) x %s requests, before each cold load)\n",
               "O_DIRECT read", v[BENCHLAB_DIRECT], b->direct_readers, cli_size(b->direct_request, s3));
        printf("  %-38s %8.3f   (best of the sweep over 1-8 readers x 16/64 MiB)\n",
               "O_DIRECT read, sweep", v[BENCHLAB_DIRECT_SWEEP]);
    }
    printf("  %-38s %8.3f\n", "cold buffered read (one thread)", v[BENCHLAB_BUFFERED]);
    printf("  %-38s %8.3f\n", "memcpy", v[BENCHLAB_MEMCPY]);
    printf("  %-38s %8.3f   (best with %u thread(s))\n", "fresh memory, first touch",
           v[BENCHLAB_FRESH], b->fresh_threads);
    printf("  %-38s %8.3f   (%.3f s per pass)\n", "resident compute (matvec every weight)",
           v[BENCHLAB_COMPUTE] > 0 ? (double)b->model / v[BENCHLAB_COMPUTE] / 1e9 : 0.0, v[BENCHLAB_COMPUTE]);
    printf("\n  %-38s %8s   %-28s %8s   %6s\n", "loads (to ready)", "GB/s", "limit", "GB/s",
           "ratio");
    int above = 0;
    above |= print_row("cold, auto (ferry's choice)", v[BENCHLAB_COLD_AUTO],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("cold, direct (private copy)", v[BENCHLAB_COLD_DIRECT],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("cold, mmap page faults", v[BENCHLAB_MMAP_FAULT], "min(O_DIRECT, fresh memory)",
                       cold_lim);
    above |= print_row("cold, mmap + populate (llama.cpp)", v[BENCHLAB_MMAP_POPULATE],
                       "min(O_DIRECT, fresh memory)", cold_lim);
    above |= print_row("warm, read (private copy)", v[BENCHLAB_WARM_READ], "min(memcpy, fresh memory)",
                       warm_lim);
    if (!b->auto_copies)
        printf("  %-38s  no copy: resident in %.3f s\n", "warm, auto (zero-copy)",
               v[BENCHLAB_WARM_AUTO]);
    else
        above |= print_row("warm, auto (copies some tensors)",
                           v[BENCHLAB_WARM_AUTO] > 0 ? (double)b->model / v[BENCHLAB_WARM_AUTO] / 1e9 : 0,
                           "min(memcpy, fresh memory)", warm_lim);
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
                       "2..%u\n",
                       r->device, r->passes);
            else
                printf("\n  streams: home disk, compute cpu, load auto, host budget, file dropped "
                       "before each pass; passes 2..%u\n",
                       r->passes);
            printf("  %-12s %12s %12s %10s %10s %10s\n", "budget", "read/pass", "optimal",
                   "s/pass", "bound s", "efficiency");
        }
        char bud[40];
        snprintf(bud, sizeof bud, "%s%s", cli_size(r->budget, s1), r->raised ? "*" : "");
        printf("  %-12s %12s %12s %10.3f %10.3f %10.2f%s\n", bud, cli_size(r->bytes_med, s2),
               cli_size(r->optimal, s3), r->seconds_med, r->bound, r->efficiency,
               r->efficiency > 1.0 ? " !" : "");
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
    for (size_t i = 0; i < b->n_streams; i++)
        if (b->streams[i].raised) {
            printf("  * raised to the working set, the least budget a pass can run in\n");
            break;
        }
    printf("\n  bound = max(resident compute, (M - B + W) / O_DIRECT read measured between the "
           "passes)%s;\n  efficiency = bound / measured\n",
           b->device ? " on the cpu, (M - B + W) / link bandwidth on the device" : "");
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
    cli_json_u64(j, b->working_set);
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
    if (!r->device) {
        cli_json_key(j, "direct_read_gbps_between_passes");
        cli_json_f64(j, r->limit_med);
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
    NUM("direct_read_gbps", v[BENCHLAB_DIRECT]);
    NUM("direct_read_sweep_gbps", v[BENCHLAB_DIRECT_SWEEP]);
    U64("direct_read_readers", b->direct_readers);
    U64("direct_read_request_bytes", b->direct_request);
    cli_json_key(&j, "direct_read_supported");
    cli_json_bool(&j, !b->no_direct);
    NUM("buffered_read_gbps", v[BENCHLAB_BUFFERED]);
    NUM("memcpy_gbps", v[BENCHLAB_MEMCPY]);
    NUM("fresh_memory_gbps", v[BENCHLAB_FRESH]);
    U64("fresh_memory_threads", b->fresh_threads);
    NUM("resident_compute_seconds", v[BENCHLAB_COMPUTE]);
    NUM("resident_compute_gbps", v[BENCHLAB_COMPUTE] > 0 ? (double)b->model / v[BENCHLAB_COMPUTE] / 1e9 : 0);
    NUM("cold_load_gbps", v[BENCHLAB_COLD_AUTO]);
    NUM("cold_load_direct_gbps", v[BENCHLAB_COLD_DIRECT]);
    NUM("warm_load_gbps", v[BENCHLAB_WARM_READ]);
    NUM("warm_auto_seconds", v[BENCHLAB_WARM_AUTO]);
    cli_json_key(&j, "warm_auto_zero_copy");
    cli_json_bool(&j, !b->auto_copies);
    NUM("mmap_fault_load_gbps", v[BENCHLAB_MMAP_FAULT]);
    NUM("mmap_populate_load_gbps", v[BENCHLAB_MMAP_POPULATE]);
    NUM("cold_load_ratio", ratio(v[BENCHLAB_COLD_AUTO], min2(v[BENCHLAB_DIRECT], v[BENCHLAB_FRESH])));
    NUM("cold_load_direct_ratio", ratio(v[BENCHLAB_COLD_DIRECT], min2(v[BENCHLAB_DIRECT], v[BENCHLAB_FRESH])));
    NUM("cold_load_ratio_vs_sweep", ratio(v[BENCHLAB_COLD_AUTO], min2(v[BENCHLAB_DIRECT_SWEEP], v[BENCHLAB_FRESH])));
    NUM("warm_load_ratio", ratio(v[BENCHLAB_WARM_READ], min2(v[BENCHLAB_MEMCPY], v[BENCHLAB_FRESH])));
    NUM("cold_cached_fraction_max", b->worst_cached);
#undef NUM
#undef U64
    cli_json_key(&j, "stream");
    cli_json_begin_array(&j, 0);
    for (size_t i = 0; i < b->n_streams; i++)
        if (!b->streams[i].device)
            json_stream(&j, &b->streams[i], b);
    cli_json_end_array(&j);
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
        "\n"
        "Measures how fast ferry loads and streams FILE against this machine's own limits,\n"
        "measured in the same run, alternating limit and ferry runs: O_DIRECT and cold buffered\n"
        "reads, memcpy, first touch of fresh memory, resident compute; ferry's cold loads (load\n"
        "auto and direct, file dropped from the page cache), warm loads (read; auto is zero-copy),\n"
        "plain mmap and mmap with populate; then streamed passes (home disk, compute cpu, load\n"
        "auto) under host budgets of 1/4 and 1/2 of the model, judged against\n"
        "max(resident compute, (M - B + W) / O_DIRECT read), W the two largest consecutive\n"
        "layers. Needs a filesystem that allows O_DIRECT, and rights to drop the file from the\n"
        "page cache (its owner can). Reads the file from the disk about 15 times per run.\n"
        "\n"
        "options:\n"
        "  --runs N               runs of the load measurements, medians quoted (default 3)\n"
        "  --passes N             streamed passes per budget, at least 3 (default 3); the median\n"
        "                         of passes 2..N is judged\n"
        "  --quick                one run, fewer reader counts: a quick look, not a measurement\n"
        "  --device SPEC          also stream with compute on SPEC (sim:SIZE@BW), home host,\n"
        "                         device budget 1/4 of the model: bound (M - B + W) / BW\n"
        "  --split SPEC,SPEC[:WEIGHT]  also stream with the 2-D tensors' rows split over these\n"
        "                         devices (as ferry run --split; each sim:SIZE@BW or cpu), home\n"
        "                         host, each device's budget 1/4 of its share M_i: bound =\n"
        "                         max over devices of (M_i - B_i + W_i) / BW_i\n"
        "  --json                 one JSON object on stdout\n"
        "  -q, --quiet            no progress bar\n"
        "streamed passes only (the bounds still count every tensor as streamed):\n"
        "%s";
    const char *runs_s = NULL, *passes_s = NULL, *device = NULL, *split = NULL;
    int json = 0, quick = 0, quiet = 0;
    cli_opt opts[] = {
        {"runs", 0, CLI_OPT_STRING, &runs_s},     {"passes", 0, CLI_OPT_STRING, &passes_s},
        {"quick", 0, CLI_OPT_FLAG, &quick},       {"device", 0, CLI_OPT_STRING, &device},
        {"json", 0, CLI_OPT_FLAG, &json},         {"quiet", 'q', CLI_OPT_FLAG, &quiet},
        {"split", 0, CLI_OPT_STRING, &split},
    };
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
    b.runs = (size_t)runs;
    b.passes = (uint32_t)passes;
    if (device) {
        if ((prc = runopts_check_device(device)))
            return prc;
        if (benchlab_spec_bandwidth(device, &b.device_bw))
            return cli_usage_error("bench", "--device: bad bandwidth in '%s'", device);
        if (b.device_bw <= 0)
            return cli_usage_error("bench", "--device: '%s' gives no bandwidth to judge against "
                                   "(sim:SIZE@BW)", device);
        b.device = device;
    }
    b.split = split;
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

