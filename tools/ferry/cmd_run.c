/*
 * cmd_run.c — `ferry run`: streams a model through a decode-shaped workload under the given
 * placement: for each layer in file order, prepare its tensors, compute y = W.x for every 2-D (or
 * higher) weight, release. Reports time per pass, stalls, bytes read, peak memory; --verify checks
 * every prepared tensor's bytes against an independent read (and conversion / merge) of the file.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "layers.h"
#include "runopts.h"
#include "workload.h"

int cmd_run(int argc, char **argv)
{
    static const char *help =
        "usage: ferry run FILE... [options]\n"
        "\n"
        "Streams the model through a decode-shaped workload: for each layer in file order,\n"
        "prepare its tensors, compute y = W.x for every 2-D weight, release.\n"
        "\n"
        "options:\n"
        "%s"
        "  --passes N             passes over the model (default 3)\n"
        "  --cold                 drop the files from the page cache before each pass\n"
        "  --setup SECONDS        wait this long after setting up, before the first pass, as an\n"
        "                         engine's own set-up would (where ferry faults in its\n"
        "                         streaming buffers meanwhile, faulted_ahead_bytes says how much)\n"
        "  --verify               check every prepared tensor against an independent read\n"
        "  --trace FILE           write a Chrome-trace timeline (Perfetto, chrome://tracing)\n"
        "  --json                 one JSON object on stdout\n"
        "  --quiet                no progress bar\n";
    runopts r;
    memset(&r, 0, sizeof r);
    const char *passes_s = NULL, *trace = NULL, *setup_s = NULL;
    int verify = 0, json = 0, cold = 0, quiet = 0;
    const cli_opt opts[] = {
        {"passes", 0, CLI_OPT_STRING, &passes_s}, {"cold", 0, CLI_OPT_FLAG, &cold},
        {"verify", 0, CLI_OPT_FLAG, &verify},     {"trace", 0, CLI_OPT_STRING, &trace},
        {"json", 0, CLI_OPT_FLAG, &json},         {"quiet", 'q', CLI_OPT_FLAG, &quiet},
        {"setup", 0, CLI_OPT_STRING, &setup_s},
    };
    int npos = 0;
    int prc = runopts_parse_args("run", &r, &argc, argv, opts, sizeof opts / sizeof opts[0],
                                 &npos);
    if (prc == CLI_HELP) {
        printf(help, runopts_help);
        runopts_free(&r);
        return CLI_EXIT_OK;
    }
    if (!prc && npos < 1)
        prc = cli_usage_error("run", "no model file given");
    uint64_t passes = 3;
    if (!prc && passes_s && cli_arg_u64("run", "passes", passes_s, 1, 1000000, &passes))
        prc = CLI_EXIT_USAGE;
    uint64_t setup = 0;
    if (!prc && setup_s && cli_arg_u64("run", "setup", setup_s, 0, 3600, &setup))
        prc = CLI_EXIT_USAGE;
    ferry *f = NULL;
    if (!prc)
        prc = runopts_open(&r, argv + 1, npos, &f);
    runopts_free(&r);
    if (prc)
        return prc;
    int rc = CLI_EXIT_OK;
    layer_set *sets = NULL;
    size_t nsets = 0;
    workload w;
    memset(&w, 0, sizeof w);
    char *trace_real = NULL; /* the trace file written: TRACE, or the target of the link TRACE */
    workload_pass *ps = calloc(passes, sizeof *ps);
    if (!ps || build_sets(f, &sets, &nsets)) {
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    if (ferry_validate(f) || ferry_plan_check(f)) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto out;
    }
    if (trace) {
        rc = runopts_check_output(&r, "run", "--trace", trace, f, &trace_real);
        if (rc)
            goto out;
        if (ferry_trace_start(f, trace_real)) {
            rc = cli_error("%s", ferry_errmsg(f));
            goto out;
        }
    }
    if ((rc = workload_init(&w, f, sets, nsets)) != 0)
        goto out;
    int compute = w.compute = (!r.device || strcmp(r.device, "cpu") == 0) && !r.split;
    w.merge_mode = !r.lora_mode || strcmp(r.lora_mode, "merge") == 0;
    w.verify = verify;
    w.cold = cold;
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    if (setup) {
        struct timespec ts = {(time_t)setup, 0};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    rc = workload_run(&w, passes, ps, !json && !quiet);
    if (trace)
        ferry_trace_stop(f);
    /* the last layers' compute may have read a file that changed after their prepare */
    if (!rc && ferry_check_files(f))
        rc = cli_error("%s", ferry_errmsg(f));
    if (rc)
        goto out;
    ferry_stats st;
    ferry_get_stats(f, &st);
    uint64_t rss = cli_peak_rss();
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "model_bytes");
        cli_json_u64(&j, model);
        cli_json_key(&j, "passes");
        cli_json_begin_array(&j, 0);
        for (uint64_t p = 0; p < passes; p++) {
            cli_json_begin_object(&j, 1);
            cli_json_key(&j, "seconds");
            cli_json_f64(&j, ps[p].seconds);
            cli_json_key(&j, "bytes_read");
            cli_json_u64(&j, ps[p].bytes_read);
            cli_json_key(&j, "stall_seconds");
            cli_json_f64(&j, ps[p].stall);
            cli_json_end_object(&j);
        }
        cli_json_end_array(&j);
        cli_json_key(&j, "peak_rss_bytes");
        cli_json_u64(&j, rss);
        /* at the end: private memory versus file pages mapped (zero-copy, page cache) */
        cli_json_key(&j, "rss_anon_bytes");
        cli_json_u64(&j, cli_status_bytes("RssAnon"));
        cli_json_key(&j, "rss_file_bytes");
        cli_json_u64(&j, cli_status_bytes("RssFile"));
        cli_json_key(&j, "host_peak_bytes");
        cli_json_u64(&j, st.peak_bytes[0]);
        cli_json_key(&j, "device_peak_bytes");
        cli_json_begin_object(&j, 1);
        for (int d = 1; d < ferry_device_count(f); d++) {
            char key[16];
            snprintf(key, sizeof key, "%d", d);
            cli_json_key(&j, key);
            cli_json_u64(&j, st.peak_bytes[d]);
        }
        cli_json_end_object(&j);
        cli_json_key(&j, "prefetch_hits");
        cli_json_u64(&j, st.prefetch_hits);
        cli_json_key(&j, "prefetch_misses");
        cli_json_u64(&j, st.prefetch_misses);
        cli_json_key(&j, "evictions");
        cli_json_u64(&j, st.evictions);
        cli_json_key(&j, "faulted_ahead_bytes");
        cli_json_u64(&j, st.faulted_ahead_bytes);
        cli_json_key(&j, "verify");
        cli_json_string(&j, !verify ? "off" : w.verify_failed ? "failed" : "ok");
        cli_json_end_object(&j);
        cli_json_finish(&j);
    } else {
        char b1[32], b2[32], b3[32];
        printf("model %s in %zu layers, %llu passes%s\n", cli_size(model, b1), nsets,
               (unsigned long long)passes, compute ? "" : " (no compute on this device)");
        for (uint64_t p = 0; p < passes; p++)
            printf("  pass %llu: %.3f s, read %s (%.2f GB/s), stalled %.3f s\n",
                   (unsigned long long)p + 1, ps[p].seconds, cli_size(ps[p].bytes_read, b1),
                   ps[p].seconds > 0 ? ps[p].bytes_read / ps[p].seconds / 1e9 : 0.0,
                   ps[p].stall);
        printf("peak RSS %s (now: private %s, mapped file %s), ferry's host peak %s",
               cli_size(rss, b2), cli_size(cli_status_bytes("RssAnon"), b1),
               cli_size(cli_status_bytes("RssFile"), (char[32]){0}), cli_size(st.peak_bytes[0], b3));
        for (int d = 1; d < ferry_device_count(f); d++)
            printf(", device %d peak %s", d, cli_size(st.peak_bytes[d], b1));
        printf("\nprefetch hits %llu, misses %llu, evictions %llu\n",
               (unsigned long long)st.prefetch_hits, (unsigned long long)st.prefetch_misses,
               (unsigned long long)st.evictions);
        if (verify)
            printf("verify: %s\n", w.verify_failed ? "FAILED" : "ok");
    }
    if (w.verify_failed)
        rc = CLI_EXIT_FAIL;
out:
    free_sets(sets);
    free(trace_real);
    free(ps);
    workload_free(&w);
    ferry_destroy(f);
    return rc;
}
