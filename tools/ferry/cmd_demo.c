/*
 * cmd_demo.c — `ferry demo`: with no arguments, shows ferry's job on a model it makes itself. It
 * generates a sample llama model (f16, 256 MiB) into the user's cache folder — reused on later
 * runs when it is still there and whole — then opens it, loads it cold and warm beside the
 * machine's own limits, streams it through a host budget of a quarter of its size with the
 * bytes read against the optimum, merges a generated LoRA adapter and switches it, and prints a
 * short summary with what to try next. Under a minute on a 2-core machine.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "demolab.h"
#include "limits.h"
#include "llama.h"
#include "synth.h"

static const char *HELP =
    "usage: ferry demo [--dir DIR] [--size SIZE] [--seed N]\n"
    "\n"
    "Generates a sample llama model (f16) into the cache folder ($XDG_CACHE_HOME/ferry or\n"
    "~/.cache/ferry), reusing it when it is already there, then shows what ferry does with it:\n"
    "cold and warm loads beside the machine's limits, streaming through a budget of a quarter\n"
    "of the model, and a LoRA adapter merged at staging and switched.\n"
    "\n"
    "options:\n"
    "  --dir DIR      folder for the model instead of the cache folder\n"
    "  --size SIZE    size of the sample model (default 256MiB)\n"
    "  --seed N       seed of the sample model (default 0)\n"
    "  -q, --quiet    no progress bar\n"
    "  -h, --help     this text\n";

/* ---- the steps ------------------------------------------------------------------------------- */

static demolab_figures fig;

static int demo_load(const char *path, uint64_t model)
{
    printf("\nload      into host RAM; each figure beside the machine's own limit, median of 3\n");
    fflush(stdout);
    if (demolab_load(path, model, &fig))
        return CLI_EXIT_FAIL;
    double cold_bound = fig.direct < fig.fresh ? fig.direct : fig.fresh;
    double warm_bound = fig.memcpy_bw < fig.fresh ? fig.memcpy_bw : fig.fresh;
    printf("  cold (O_DIRECT into fresh memory)  %6.2f GB/s   limit %5.2f = min(disk %.2f, "
           "fresh memory %.2f)   ratio %.2f\n",
           fig.cold, cold_bound, fig.direct, fig.fresh, fig.cold / cold_bound);
    printf("  warm (page cache to host copy)     %6.2f GB/s   limit %5.2f = min(memcpy %.2f, "
           "fresh memory %.2f)   ratio %.2f\n",
           fig.warm, warm_bound, fig.memcpy_bw, fig.fresh, fig.warm / warm_bound);
    printf("  warm, zero-copy (--load auto)      %6.1f ms     nothing copied: pointers into the "
           "file mapping\n",
           fig.zero_copy_s * 1e3);
    return CLI_EXIT_OK;
}

static int demo_stream(const char *path, uint64_t model, int quiet)
{
    demolab_stream ds;
    if (demolab_stream_open(path, model, &ds)) {
        demolab_stream_close(&ds);
        return CLI_EXIT_FAIL;
    }
    printf("\nstream    home disk, host budget %s (%s), 4 passes, cold file; each pass prepares\n"
           "          %zu blocks and %zu other layers (embedding, head) in turn\n",
           cli_size(ds.budget, (char[32]){0}), ds.why, ds.blocks, ds.nsets - ds.blocks);
    fflush(stdout);
    int rc = demolab_stream_run(&ds, path, model, quiet, &fig);
    if (!rc) {
        const ferry_stats *st = &ds.stats;
        char b1[32], b2[32], b3[32];
        for (int p = 0; p < 4; p++)
            printf("  pass %d   %6.3f s   read %10s%s\n", p + 1, ds.pass_s[p],
                   cli_size(ds.pass_read[p], b1), p ? "" : "   (first pass: everything, recording the order)");
        printf("  later passes read %s; the optimum M - B + W is %s, M the model, B the budget,\n"
               "  W the two largest consecutive layers (the one in use and the one read ahead):\n"
               "  what a pass must re-read when the budget keeps all it can (LRU and the page\n"
               "  cache re-read all %s)\n",
               cli_size(ds.pass_read[3], b1), cli_size(fig.stream_opt, b2), cli_size(model, b3));
        printf("  ferry's host memory peaked at %s of the %s budget; prefetch hits %llu, misses "
               "%llu\n"
               "  (a miss: a prepare that found its tensor neither ready nor being read, and\n"
               "  waited for the read)\n",
               cli_size(st->peak_bytes[0], b1), cli_size(ds.budget, b2),
               (unsigned long long)st->prefetch_hits, (unsigned long long)st->prefetch_misses);
    }
    demolab_stream_close(&ds);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* The llama engine of `ferry generate` on the model, streamed from disk through the same host
 * budget: decode speed beside its bound, the disk's direct read over what a token must read
 * (M - B). */
static int demo_generate(const char *path, uint64_t model)
{
    uint64_t budget = fig.budget ? fig.budget : model / 4;
    ferry_options o = {0};
    o.host_budget = budget;
    ferry *f = ferry_create(&o);
    if (!f)
        return cli_error("out of memory");
    ferry_policy embd = {.home = FERRY_HOME_DISK, .lazy = FERRY_LAZY_ON};
    ferry_policy blocks = {.home = FERRY_HOME_DISK};
    char err[512] = "";
    llama *m = NULL;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)cpus : 1, rc = CLI_EXIT_OK;
    enum { N_GEN = 8 };
    if (ferry_open(f, path, NULL) || ferry_group_add(f, "embedding", "token_embd.weight", &embd) ||
        ferry_group_add(f, "all", "*", &blocks)) {
        rc = cli_fail(path, ferry_errmsg(f), -1);
        goto out;
    }
    llama_config cfg;
    if (llama_read_config(f, &cfg, err, sizeof err) ||
        ferry_reserve(f, 0, llama_memory_bytes(&cfg, N_GEN + 1, 1, threads))) {
        rc = cli_fail(path, err[0] ? err : ferry_errmsg(f), -1);
        goto out;
    }
    if (llama_create(f, N_GEN + 1, threads, &m, err, sizeof err)) {
        rc = cli_fail(path, err, -1);
        goto out;
    }
    printf("\ngenerate  the llama engine of `ferry generate`: home disk, host budget %s, %d "
           "threads\n", cli_size(budget, (char[32]){0}), threads);
    limits_drop_cache(path);
    uint32_t tok = 1;
    double t_dec = 0;
    uint64_t read0 = 0;
    printf("  tokens  ");
    for (uint32_t pos = 0; pos < N_GEN; pos++) {
        const float *logits;
        if (pos == 1) {
            ferry_stats st;
            ferry_get_stats(f, &st);
            read0 = st.bytes_read;
            t_dec = cli_now();
        }
        if (llama_forward(m, tok, pos, &logits, err, sizeof err)) {
            rc = cli_fail(path, err, -1);
            goto out;
        }
        uint32_t best = 0;
        for (uint32_t i = 1; i < llama_get_config(m)->vocab; i++)
            best = logits[i] > logits[best] ? i : best;
        tok = best;
        printf(" %u", tok);
        fflush(stdout);
    }
    t_dec = cli_now() - t_dec;
    ferry_stats st;
    ferry_get_stats(f, &st);
    uint64_t per_token = (st.bytes_read - read0) / (N_GEN - 1);
    fig.gen_tok_s = t_dec > 0 ? (N_GEN - 1) / t_dec : 0;
    fig.gen_bound = model > budget ? fig.direct * 1e9 / (double)(model - budget) : 0;
    printf("\n  decode  %.2f tok/s, read %s per token (M - B = %s); bound direct read / (M - B) "
           "= %.2f tok/s, ratio %.2f\n",
           fig.gen_tok_s, cli_size(per_token, (char[32]){0}),
           cli_size(model - budget, (char[32]){0}), fig.gen_bound,
           fig.gen_bound > 0 ? fig.gen_tok_s / fig.gen_bound : 0.0);
out:
    llama_destroy(m);
    ferry_destroy(f);
    return rc;
}

static int demo_lora(const char *path, const char *folder, int quiet)
{
    char adapter[4300];
    /* named after the model it was made for */
    const char *base = strrchr(path, '/');
    snprintf(adapter, sizeof adapter, "%s/%.*s.lora-r16.safetensors", folder,
             (int)(strlen(base ? base + 1 : path) - 5), base ? base + 1 : path);
    if (demolab_lora_make(path, adapter))
        return CLI_EXIT_FAIL;
    printf("\nlora      %s (PEFT, rank 16), merged at staging; home host\n", adapter);
    ferry_lora_info info;
    int rc = demolab_lora(path, adapter, &info, &fig);
    if (!rc) {
        char b1[32];
        printf("  %u factor pairs matched %u weights (%s of f32 factors cached once)\n",
               info.n_pairs, info.n_matched, cli_size(info.factor_bytes, b1));
        printf("  every weight staged with the adapter merged   %.3f s\n", fig.merge_s);
        printf("  multiplier 1.0 -> 0.5 (new epoch), restaged   %.3f s, base bytes read from the "
               "file again: %s\n",
               fig.switch_s, cli_size(fig.switch_read, b1));
    }
    (void)quiet;
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

static void demo_summary(const char *path)
{
    char b1[32], b2[32];
    double cold_bound = fig.direct < fig.fresh ? fig.direct : fig.fresh;
    printf("\nsummary\n");
    printf("  cold load %.2f GB/s = %.2f of the machine's limit; warm load %.2f GB/s; zero-copy "
           "needs no copy at all\n",
           fig.cold, fig.cold / cold_bound, fig.warm);
    printf("  streaming through a quarter of the model read %s per pass (optimum %s), ferry's "
           "host peak %s\n",
           cli_size(fig.stream_read, b1), cli_size(fig.stream_opt, b2),
           cli_size(fig.host_peak, (char[32]){0}));
    printf("  switching an adapter re-read %s of the base\n", cli_size(fig.switch_read, b1));
    printf("  generate decoded %.2f tok/s under the quarter budget, %.2f of its bound\n",
           fig.gen_tok_s, fig.gen_bound > 0 ? fig.gen_tok_s / fig.gen_bound : 0.0);
    printf("\nnext\n");
    printf("  ferry bench %s                 every target, with the machine's limits\n", path);
    printf("  ferry run %s --device sim:64MiB@8GB/s --budget device=32MiB --verify\n", path);
    printf("  ferry plan %s --home disk --group 'embd=token_embd.*:lazy=on'   where each "
           "tensor would live\n",
           path);
    printf("  ferry run %s --trace trace.json          open it in Perfetto\n", path);
}

int cmd_demo(int argc, char **argv)
{
    const char *dir = NULL, *size = NULL, *seed = NULL;
    int quiet = 0, npos = 0;
    cli_opt opts[] = {
        {"dir", 0, CLI_OPT_STRING, &dir},
        {"size", 0, CLI_OPT_STRING, &size},
        {"seed", 0, CLI_OPT_STRING, &seed},
        {"quiet", 'q', CLI_OPT_FLAG, &quiet},
    };
    int rc = cli_parse("demo", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos > 0)
        return cli_usage_error("demo", "unexpected argument '%s'", argv[1]);

    synth_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = SYNTH_LLAMA;
    cfg.format = FERRY_FORMAT_GGUF;
    cfg.dtype = FERRY_DTYPE_F16;
    /* Many layers and a small vocabulary: with a budget of a quarter of the model, the working
     * set (two layers) must be well below the budget for caching to show. About 254 MiB. */
    cfg.layers = 24;
    cfg.dim = 640;
    cfg.ff = 1792;
    cfg.vocab = 8192;
    if (size) {
        if ((rc = cli_arg_size("demo", "size", size, &cfg.target_bytes)) != 0)
            return rc;
        if (cfg.target_bytes == 0)
            return cli_usage_error("demo", "--size: must be more than 0");
        cfg.layers = cfg.dim = cfg.ff = cfg.vocab = 0;
    }
    if (seed && (rc = cli_arg_u64("demo", "seed", seed, 0, UINT64_MAX, &cfg.seed)) != 0)
        return rc;

    char folder[4096], path[4200], a[32];
    if (dir)
        snprintf(folder, sizeof folder, "%s", dir);
    else if (demolab_cache_dir(folder, sizeof folder) != 0)
        return cli_error("no cache folder: set HOME or XDG_CACHE_HOME, or give --dir");
    if (demolab_make_dirs(folder) != 0)
        return cli_error("%s: cannot create the folder: %s", folder, strerror(errno));

    synth_model m;
    char err[256];
    rc = synth_plan(&cfg, &m, err, sizeof err);
    if (rc != 0) {
        synth_free(&m);
        return rc == CLI_EXIT_USAGE ? cli_usage_error("demo", "%s", err) : cli_error("%s", err);
    }
    char tag[32];
    if (!cfg.target_bytes)
        snprintf(tag, sizeof tag, "24x640");
    else if (cfg.target_bytes % (UINT64_C(1) << 20) == 0)
        snprintf(tag, sizeof tag, "%lluMiB", (unsigned long long)(cfg.target_bytes >> 20));
    else
        snprintf(tag, sizeof tag, "%llu", (unsigned long long)cfg.target_bytes);
    snprintf(path, sizeof path, "%s/demo-llama-%s-%s-seed%llu.gguf", folder,
             ferry_dtype_name(cfg.dtype), tag, (unsigned long long)cfg.seed);

    printf("ferry demo\n\n");
    printf("model     %s\n", path);
    printf("          llama, %u layers, dim %u, ff %u, vocab %u, f16, %zu tensors, %s\n",
           m.cfg.layers, m.cfg.dim, m.cfg.ff, m.cfg.vocab, m.n, cli_size(m.total_bytes, a));
    if (demolab_reusable(path, &m)) {
        printf("          reused from an earlier run\n");
    } else {
        fflush(stdout);
        double t0 = cli_now();
        rc = synth_write(&m, path, !quiet);
        double secs = cli_now() - t0;
        if (rc != 0) {
            synth_free(&m);
            return rc;
        }
        printf("          generated in %.2f s (%.0f MB/s)\n", secs,
               secs > 0 ? (double)m.total_bytes / secs / 1e6 : 0.0);
    }
    synth_free(&m);

    /* the catalog: what every later step starts from */
    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return cli_error("out of memory");
    double t0 = cli_now();
    int e = ferry_catalog_add(c, path, NULL);
    double secs = cli_now() - t0;
    if (e != 0) {
        rc = cli_fail(path, ferry_catalog_errmsg(c), e);
        ferry_catalog_destroy(c);
        return rc;
    }
    const char *arch = "?";
    ferry_catalog_get_str(c, "general.architecture", &arch);
    uint64_t model = ferry_catalog_total_bytes(c);
    printf("\ncatalog   %zu tensors, %s, architecture %s, opened in %.2f ms\n",
           ferry_catalog_count(c), cli_size(model, a), arch, secs * 1e3);
    ferry_catalog_destroy(c);
    rc = demo_load(path, model);
    if (!rc)
        rc = demo_stream(path, model, quiet);
    if (!rc)
        rc = demo_generate(path, model);
    if (!rc)
        rc = demo_lora(path, folder, quiet);
    if (!rc)
        demo_summary(path);
    return rc;
}
