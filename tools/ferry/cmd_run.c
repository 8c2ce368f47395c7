/*
 * cmd_run.c — `ferry run`: streams a model through a decode-shaped workload under the given
 * placement: for each layer in file order, prepare its tensors, compute y = W.x for every 2-D (or
 * higher) weight, release. Reports time per pass, stalls, bytes read, peak memory; --verify checks
 * every prepared tensor's bytes against an independent read (and conversion / merge) of the file.
 */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "layers.h"
#include "limits.h"
#include "runopts.h"
#include "verify.h"

typedef struct pass_stat {
    double seconds, stall;
    uint64_t bytes_read;
} pass_stat;

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
        "  --verify               check every prepared tensor against an independent read\n"
        "  --trace FILE           write a Chrome-trace timeline (Perfetto, chrome://tracing)\n"
        "  --json                 one JSON object on stdout\n"
        "  --quiet                no progress bar\n";
    runopts r;
    memset(&r, 0, sizeof r);
    const char *passes_s = NULL, *trace = NULL;
    int verify = 0, json = 0, cold = 0, quiet = 0;
    const cli_opt opts[] = {
        {"passes", 0, CLI_OPT_STRING, &passes_s}, {"cold", 0, CLI_OPT_FLAG, &cold},
        {"verify", 0, CLI_OPT_FLAG, &verify},     {"trace", 0, CLI_OPT_STRING, &trace},
        {"json", 0, CLI_OPT_FLAG, &json},         {"quiet", 'q', CLI_OPT_FLAG, &quiet},
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
    ferry *f = NULL;
    if (!prc)
        prc = runopts_open(&r, argv + 1, npos, &f);
    runopts_free(&r);
    if (prc)
        return prc;
    int rc = CLI_EXIT_OK;
    layer_set *sets = NULL;
    size_t nsets = 0;
    float *x = NULL, *y = NULL;
    char *trace_real = NULL; /* the trace file written: TRACE, or the target of the link TRACE */
    pass_stat *ps = calloc(passes, sizeof *ps);
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
    /* The vector and the result: as long as the longest row and the most rows. */
    uint64_t max_cols = 1, max_rows = 1;
    for (size_t s = 0; s < nsets; s++)
        for (size_t i = 0; i < sets[s].n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(sets[s].t[i], &info);
            max_cols = info.row_elems > max_cols ? info.row_elems : max_cols;
            max_rows = info.n_rows > max_rows ? info.n_rows : max_rows;
        }
    x = malloc(max_cols * sizeof *x);
    y = malloc(max_rows * sizeof *y);
    if (!x || !y) {
        rc = cli_error("out of memory");
        goto out;
    }
    for (uint64_t i = 0; i < max_cols; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    int compute = (!r.device || strcmp(r.device, "cpu") == 0) && !r.split;
    int merge_mode = !r.lora_mode || strcmp(r.lora_mode, "merge") == 0;
    const ferry_catalog *cat = ferry_catalog_of(f);
    uint64_t model = ferry_catalog_total_bytes(cat);
    int verify_failed = 0;
    double checksum = 0;
    cli_progress bar;
    cli_progress_start(&bar, "run", passes * nsets, !json && !quiet);
    for (uint64_t p = 0; p < passes && rc == CLI_EXIT_OK; p++) {
        for (size_t i = 0; cold && i < ferry_catalog_file_count(ferry_catalog_of(f)); i++)
            limits_drop_cache(ferry_catalog_file_path(ferry_catalog_of(f), i)); /* best effort */
        ferry_stats st0, st1;
        ferry_get_stats(f, &st0);
        double t0 = ferry_now();
        for (size_t s = 0; s < nsets && rc == CLI_EXIT_OK; s++) {
            layer_set *ls = &sets[s];
            if (ferry_prepare(f, ls->t, ls->n)) {
                rc = cli_error("%s", ferry_errmsg(f));
                break;
            }
            double c0 = ferry_now();
            for (size_t i = 0; i < ls->n && compute; i++) {
                ferry_tensor_info info;
                ferry_tensor_get_info(ls->t[i], &info);
                if (info.ndim < 2 || !info.n_rows || !info.row_elems)
                    continue; /* a vector, or an empty weight: no product to take */
                if (ferry_matvec(ferry_tensor_dtype(ls->t[i]), ferry_tensor_data(ls->t[i]),
                                 info.n_rows, info.row_elems, x, y) == 0)
                    checksum += y[0] + y[info.n_rows - 1];
            }
            if (compute)
                ferry_trace_event(f, "compute", "compute", c0, ferry_now());
            for (size_t i = 0; i < ls->n && verify; i++) {
                char why[256];
                if (!verify_prepared(f, ls->t[i], merge_mode, why, sizeof why)) {
                    ferry_tensor_info info;
                    ferry_tensor_get_info(ls->t[i], &info);
                    fprintf(stderr, "ferry: verify: %s: tensor '%s': %s\n", info.file, info.name,
                            why);
                    verify_failed = 1;
                }
            }
            ferry_release(f, ls->t, ls->n);
            cli_progress_update(&bar, p * nsets + s + 1);
        }
        ps[p].seconds = ferry_now() - t0;
        ferry_get_stats(f, &st1);
        ps[p].bytes_read = st1.bytes_read - st0.bytes_read;
        ps[p].stall = st1.wait_seconds - st0.wait_seconds;
    }
    cli_progress_end(&bar);
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
        cli_json_key(&j, "verify");
        cli_json_string(&j, !verify ? "off" : verify_failed ? "failed" : "ok");
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
            printf("verify: %s\n", verify_failed ? "FAILED" : "ok");
    }
    if (verify_failed)
        rc = CLI_EXIT_FAIL;
    (void)checksum;
out:
    free_sets(sets);
    free(trace_real);
    free(ps);
    free(x);
    free(y);
    ferry_destroy(f);
    return rc;
}
