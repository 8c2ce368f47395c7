/*
 * cmd_generate.c — `ferry generate`: greedy decoding with the llama engine (engine/llama.c) on the
 * weights ferry places: evaluates the prompt (each position computed as alone, --batch of them per
 * pass over the layers, so a prompt reads the model once), then generates N tokens, and
 * reports them with their text, the time to the first token, decode speed, bytes read per token
 * and peak memory. --logits writes every evaluated position's logits (raw little-endian f32);
 * --trace-routing, for a mixture-of-experts model, the experts each evaluated position used.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "llama.h"
#include "runopts.h"
#include "tokenizer.h"

#define MAX_PROMPT 65536

/* The token embedding gets a group of its own ahead of "all": lazy whatever the placement, its
 * rows read with ferry_read_rows; in the resident placement (*ARG nonzero) through the page cache
 * (load auto), a row at a time. */
static int embedding_group(ferry *f, const ferry_policy *policy, void *arg)
{
    ferry_policy p = *policy;
    p.lazy = FERRY_LAZY_ON;
    if (*(const int *)arg)
        p.load = FERRY_LOAD_AUTO;
    if (ferry_group_add(f, "embedding", "token_embd.weight", &p))
        return cli_error("%s", ferry_errmsg(f));
    return 0;
}

/* The resident placement (home host, the cpu, no --load or --group given): decode reads every
 * weight once per token, and reads private copies in huge pages faster than the page cache's
 * mapping of the file (bench/README.md), so the weights are read once, up front, with O_DIRECT
 * into ferry's huge-page host copies, as llama.cpp copies them into buffers of its own. Skipped,
 * the weights then coming as each layer is prepared, when the home copies would not fit the host
 * budget (ferry_plan_check). *ALL: every weight was read. Returns 0 or CLI_EXIT_FAIL after
 * saying why. */
static int load_resident(ferry *f, int *all)
{
    *all = 0;
    if (ferry_plan_check(f) != 0)
        return 0;
    int rc = ferry_load_group(f, "all");
    if (rc == FERRY_EBUDGET)
        return 0; /* what loaded stays; the rest comes when prepared */
    *all = rc == 0;
    return rc ? cli_error("%s", ferry_errmsg(f)) : 0;
}

static long parse_tokens(const char *s, uint32_t *out, size_t max)
{
    size_t n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || v > UINT32_MAX || n == max || (*end && *end != ','))
            return -1;
        out[n++] = (uint32_t)v;
        p = *end ? end + 1 : end;
    }
    return (long)n;
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

/* One line per token of the last batch of N: "L0:3,7 L1:0,5 ..." (each layer's experts). */
static int write_routing(FILE *tf, const llama *m, uint32_t n)
{
    const llama_config *c = llama_get_config(m);
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t *r = llama_routing(m, t);
        for (uint32_t l = 0; r && l < c->n_layer; l++) {
            fprintf(tf, "%sL%u:", l ? " " : "", l);
            for (uint32_t i = 0; i < c->n_expert_used; i++)
                fprintf(tf, "%s%u", i ? "," : "", r[(uint64_t)l * c->n_expert_used + i]);
        }
        fputc('\n', tf);
    }
    return ferror(tf) ? -1 : 0;
}

/* Reserves the engine's own memory (KV cache, activations, scratch) against the host budget. */
static int reserve_engine_memory(ferry *f, const llama_config *c, uint32_t n_ctx,
                                 uint32_t batch, int threads)
{
    uint64_t bytes = llama_memory_bytes(c, n_ctx, batch, threads);
    if (ferry_reserve(f, 0, bytes))
        return cli_error("%s", ferry_errmsg(f));
    return 0;
}

static int generate_cmd(runopts *rp, int argc, char **argv)
{
    static const char *help =
        "usage: ferry generate MODEL (--tokens ID,ID,... | --prompt TEXT) [options]\n"
        "\n"
        "Greedy decoding of a llama or Qwen3-MoE model (GGUF, general.architecture = llama or\n"
        "qwen3moe) on the cpu, its weights placed and moved by ferry: each layer prepared\n"
        "before use, the next one prefetched, the token embedding lazy. Resident (home host,\n"
        "no --load or --group given, the model within the host budget), the weights are read\n"
        "once up front with O_DIRECT into ferry's huge-page host copies, which decode reads\n"
        "faster than the page cache's mapping of the file; --load auto keeps the mapping.\n"
        "\n"
        "options:\n"
        "  --tokens ID,ID,...     the prompt as token ids\n"
        "  --prompt TEXT          the prompt as text (the file's SentencePiece vocabulary)\n"
        "  -n N                   tokens to generate (default 16)\n"
        "  --threads T            compute threads (default: the online CPUs)\n"
        "  --ctx N                context positions (default: prompt + N)\n"
        "  --batch B              prompt tokens per pass over the layers (default 32): each\n"
        "                         position computed exactly as alone, the model read once per B\n"
        "  --logits FILE          every evaluated position's logits, raw little-endian f32,\n"
        "                         n_vocab per row: one row per prompt token, then one per\n"
        "                         generated token but the last\n"
        "  --trace-routing FILE   mixture-of-experts models: one line per evaluated position\n"
        "                         (the prompt's, then each generated token's but the last),\n"
        "                         the experts each layer used, ascending: L0:3,7 L1:0,5 ...\n"
        "  --trace FILE           write a Chrome-trace timeline (Perfetto, chrome://tracing) of\n"
        "                         the reads, copies and waits, and of each evaluation\n"
        "  --lookahead on|off     mixture-of-experts models: prefetch the experts predicted for\n"
        "                         the next layer while a layer computes, as guesses that evict\n"
        "                         only experts the expert policy values less (default off)\n"
        "  --lookahead-min P      with --lookahead on: only predictions of router probability\n"
        "                         at least P, 0 to 1 (default 0: all)\n"
        "  --lookahead-depth D    with --lookahead on: predict and guess the experts of the\n"
        "                         next D layers, 1 to 4 (default 1), nearest first\n"
        "  --json                 one JSON object on stdout (with routing_predicted_hits and\n"
        "                         routing_predictions for a mixture of experts: how many of\n"
        "                         the experts predicted for each next layer it then chose;\n"
        "                         routing_predicted_hits_by_depth: the same for each depth\n"
        "                         of --lookahead-depth, 1 layer ahead first;\n"
        "                         prompt_tok_s: prompt tokens per second of their passes;\n"
        "                         wait_seconds_per_token: the time prepares waited for bytes;\n"
        "                         bytes_read: every byte read from the files, an up-front\n"
        "                         load included;\n"
        "                         guess_bytes, guess_unused_bytes: what look-ahead read, and\n"
        "                         of it what was dropped unused)\n"
        "%s";
    const char *tokens_s = NULL, *prompt = NULL, *n_s = NULL, *threads_s = NULL, *ctx_s = NULL,
               *logits_path = NULL, *batch_s = NULL, *trace_path = NULL, *lookahead_s = NULL,
               *lookahead_min_s = NULL, *lookahead_depth_s = NULL, *timeline = NULL;
    int json = 0;
    cli_opt opts[17];
    size_t no = 0;
    opts[no++] = (cli_opt){"tokens", 0, CLI_OPT_STRING, &tokens_s};
    opts[no++] = (cli_opt){"prompt", 'p', CLI_OPT_STRING, &prompt};
    opts[no++] = (cli_opt){"n", 'n', CLI_OPT_STRING, &n_s};
    opts[no++] = (cli_opt){"threads", 't', CLI_OPT_STRING, &threads_s};
    opts[no++] = (cli_opt){"ctx", 0, CLI_OPT_STRING, &ctx_s};
    opts[no++] = (cli_opt){"batch", 0, CLI_OPT_STRING, &batch_s};
    opts[no++] = (cli_opt){"logits", 0, CLI_OPT_STRING, &logits_path};
    opts[no++] = (cli_opt){"trace-routing", 0, CLI_OPT_STRING, &trace_path};
    opts[no++] = (cli_opt){"trace", 0, CLI_OPT_STRING, &timeline};
    opts[no++] = (cli_opt){"lookahead", 0, CLI_OPT_STRING, &lookahead_s};
    opts[no++] = (cli_opt){"lookahead-min", 0, CLI_OPT_STRING, &lookahead_min_s};
    opts[no++] = (cli_opt){"lookahead-depth", 0, CLI_OPT_STRING, &lookahead_depth_s};
    opts[no++] = (cli_opt){"json", 0, CLI_OPT_FLAG, &json};
    int npos = 0;
    int prc = runopts_parse_args("generate", rp, &argc, argv, opts, no, &npos);
    if (prc == CLI_HELP) {
        printf(help, runopts_help);
        return CLI_EXIT_OK;
    }
    if (prc)
        return prc;
    if (npos < 1)
        return cli_usage_error("generate", "no model file given");
    if (!tokens_s == !prompt)
        return cli_usage_error("generate", "give the prompt with one of --tokens or --prompt");
    uint64_t n_gen = 16, threads = 0, n_ctx = 0, batch = 32, depth = 1;
    if (n_s && cli_arg_u64("generate", "n", n_s, 1, 1u << 20, &n_gen))
        return CLI_EXIT_USAGE;
    if (threads_s && cli_arg_u64("generate", "threads", threads_s, 1, 1024, &threads))
        return CLI_EXIT_USAGE;
    if (ctx_s && cli_arg_u64("generate", "ctx", ctx_s, 1, 1u << 20, &n_ctx))
        return CLI_EXIT_USAGE;
    if (batch_s && cli_arg_u64("generate", "batch", batch_s, 1, 4096, &batch))
        return CLI_EXIT_USAGE;
    if (lookahead_depth_s && cli_arg_u64("generate", "lookahead-depth", lookahead_depth_s, 1,
                                         LLAMA_LOOKAHEAD_MAX, &depth))
        return CLI_EXIT_USAGE;
    if (!threads) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (uint64_t)c : 1;
    }
    if ((rp->device && strcmp(rp->device, "cpu") != 0) || rp->split)
        return cli_usage_error("generate", "the engine computes on the cpu: --device and --split "
                                           "are for run and bench");
    uint32_t *prompt_ids = malloc(MAX_PROMPT * sizeof *prompt_ids);
    if (!prompt_ids)
        return cli_error("out of memory");
    long np = 0;
    if (tokens_s) {
        np = parse_tokens(tokens_s, prompt_ids, MAX_PROMPT);
        if (np <= 0) {
            free(prompt_ids);
            return cli_usage_error("generate", "--tokens: '%s' is not a list of token ids",
                                   tokens_s);
        }
    }

    int resident = !rp->load && rp->n_groups == 0 && rp->policy.home == FERRY_HOME_HOST;
    if (resident)
        rp->policy.load = FERRY_LOAD_DIRECT;
    double t_start = cli_now();
    rp->own_groups = embedding_group;
    rp->groups_arg = &resident;
    ferry *f;
    if (runopts_open(rp, argv + 1, npos, &f)) {
        free(prompt_ids);
        return CLI_EXIT_FAIL;
    }
    int rc = CLI_EXIT_OK;
    char err[512] = "";
    llama *m = NULL;
    FILE *lf = NULL, *tf = NULL;
    char *logits_real = NULL; /* the file --logits writes: the path, or the target of its link */
    char *trace_real = NULL;
    char *timeline_real = NULL; /* the file --trace writes */
    int tracing = 0;
    uint32_t *gen = NULL;
    float *rows = NULL;
    tokenizer *tok = tokenizer_create(ferry_catalog_of(f), err, sizeof err);
    if (prompt) {
        if (!tok) {
            rc = cli_fail(argv[1], err, -1);
            goto out;
        }
        np = tokenizer_encode(tok, prompt, prompt_ids, MAX_PROMPT);
        if (np <= 0) {
            rc = cli_error("--prompt: no tokens (or more than %d)", MAX_PROMPT);
            goto out;
        }
    }
    if (!n_ctx)
        n_ctx = (uint64_t)np + n_gen;
    if (n_ctx < (uint64_t)np + n_gen - 1) {
        rc = cli_usage_error("generate", "--ctx %llu is shorter than the prompt and -n need",
                             (unsigned long long)n_ctx);
        goto out;
    }
    /* the engine's own memory is counted against the host budget before it is allocated */
    llama_config cfg;
    if (llama_read_config(f, &cfg, err, sizeof err)) {
        rc = cli_fail(argv[1], err, -1);
        goto out;
    }
    /* the largest batch the prompt is evaluated in */
    uint32_t eval_batch = (uint32_t)((uint64_t)np < batch ? (uint64_t)np : batch);
    if (reserve_engine_memory(f, &cfg, (uint32_t)n_ctx, eval_batch, (int)threads)) {
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    if (llama_create(f, (uint32_t)n_ctx, (int)threads, &m, err, sizeof err)) {
        rc = cli_fail(argv[1], err, -1);
        goto out;
    }
    int all_resident = 0;
    if (resident && (rc = load_resident(f, &all_resident)))
        goto out;
    if (all_resident) /* the experts' whole tensors are in memory: no second copy of their rows */
        llama_drop_expert_slices(m);
    if (rp->lora_mode && strcmp(rp->lora_mode, "runtime") == 0)
        llama_set_lora_runtime(m, 1);
    if (lookahead_s && strcmp(lookahead_s, "on") != 0 && strcmp(lookahead_s, "off") != 0) {
        rc = cli_usage_error("generate", "--lookahead: '%s' (expected on or off)", lookahead_s);
        goto out;
    }
    if (lookahead_s)
        llama_set_lookahead(m, strcmp(lookahead_s, "on") == 0);
    if (lookahead_min_s) {
        char *end = NULL;
        double p = strtod(lookahead_min_s, &end);
        if (end == lookahead_min_s || *end || !(p >= 0 && p <= 1)) {
            rc = cli_usage_error("generate", "--lookahead-min: '%s' (expected a probability, "
                                 "0 to 1)", lookahead_min_s);
            goto out;
        }
        llama_set_lookahead_min(m, (float)p);
    }
    llama_set_lookahead_depth(m, (uint32_t)depth); /* in range: checked with the options */
    const llama_config *c = llama_get_config(m);
    for (long i = 0; i < np; i++)
        if (prompt_ids[i] >= c->vocab) {
            rc = cli_error("token %u is outside the vocabulary of %u", prompt_ids[i], c->vocab);
            goto out;
        }
    if (logits_path && (rc = runopts_check_output(rp, "generate", "--logits", logits_path, f,
                                                  &logits_real)) != 0)
        goto out;
    if (logits_path && !(lf = fopen(logits_real, "wb"))) {
        rc = cli_error("%s: cannot create", logits_path);
        goto out;
    }
    if (trace_path && !c->n_expert) {
        rc = cli_usage_error("generate", "--trace-routing: %s is not a mixture of experts "
                             "(no llama.expert_count)", argv[1]);
        goto out;
    }
    if (trace_path && (rc = runopts_check_output(rp, "generate", "--trace-routing", trace_path,
                                                 f, &trace_real)) != 0)
        goto out;
    if (trace_path && !(tf = fopen(trace_real, "w"))) {
        rc = cli_error("%s: cannot create", trace_path);
        goto out;
    }
    if (timeline && (rc = runopts_check_output(rp, "generate", "--trace", timeline, f,
                                               &timeline_real)) != 0)
        goto out;
    if (timeline) {
        if (ferry_trace_start(f, timeline_real)) {
            rc = cli_error("%s", ferry_errmsg(f));
            goto out;
        }
        tracing = 1;
    }
    gen = malloc(n_gen * sizeof *gen);
    if (!gen) {
        rc = cli_error("out of memory");
        goto out;
    }
    double t_first = 0, dec_seconds = 0, prompt_seconds = 0;
    uint64_t n_dec = 0, dec_bytes = 0, all_bytes = 0;
    size_t n_out = 0;
    uint32_t next = 0;
    rows = malloc(batch * c->vocab * sizeof *rows);
    if (!rows) {
        rc = cli_error("out of memory for %llu rows of logits", (unsigned long long)batch);
        goto out;
    }
    /* the prompt, BATCH tokens per pass over the layers; then one token at a time */
    for (uint64_t i = 0; i < (uint64_t)np + n_gen - 1;) {
        uint32_t k = i < (uint64_t)np ? (uint32_t)(np - i < batch ? np - i : batch) : 1;
        uint32_t one = i < (uint64_t)np ? 0 : next;
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        double t0 = cli_now(), f0 = ferry_now();
        if (llama_forward_batch(m, i < (uint64_t)np ? prompt_ids + i : &one, k, (uint32_t)i, rows,
                                err, sizeof err)) {
            rc = cli_fail(argv[1], err, -1);
            goto out;
        }
        double t1 = cli_now();
        if (tracing)
            ferry_trace_event(f, i < (uint64_t)np ? "prompt" : "token", "compute", f0, ferry_now());
        ferry_get_stats(f, &s1);
        all_bytes += s1.bytes_read - s0.bytes_read;
        if (i < (uint64_t)np)
            prompt_seconds += t1 - t0;
        if (i >= (uint64_t)np) {
            dec_seconds += t1 - t0;
            dec_bytes += s1.bytes_read - s0.bytes_read;
            n_dec++;
        }
        if (lf && fwrite(rows, sizeof *rows, (size_t)k * c->vocab, lf) != (size_t)k * c->vocab) {
            rc = cli_error("%s: write error", logits_path);
            goto out;
        }
        if (tf && write_routing(tf, m, k) != 0) {
            rc = cli_error("%s: write error", trace_path);
            goto out;
        }
        i += k;
        if (i >= (uint64_t)np) {
            next = argmax(rows + (uint64_t)(k - 1) * c->vocab, c->vocab);
            gen[n_out++] = next;
            if (n_out == 1)
                t_first = cli_now() - t_start;
        }
    }
    if (lf) {
        int bad = fclose(lf) != 0;
        lf = NULL;
        if (bad) {
            rc = cli_error("%s: write error", logits_path);
            goto out;
        }
    }
    if (tf) {
        int bad = fclose(tf) != 0;
        tf = NULL;
        if (bad) {
            rc = cli_error("%s: write error", trace_path);
            goto out;
        }
    }
    uint64_t route_hits = 0, route_preds = 0;
    llama_routing_stats(m, &route_hits, &route_preds);
    ferry_stats st;
    ferry_get_stats(f, &st);
    uint64_t evals = (uint64_t)np + n_gen - 1;
    uint64_t per_token = n_dec ? dec_bytes / n_dec : evals ? all_bytes / evals : 0;
    double tok_s = dec_seconds > 0 ? (double)n_dec / dec_seconds : 0;
    double prompt_tok_s = prompt_seconds > 0 ? (double)np / prompt_seconds : 0;
    char piece[256];
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "tokens");
        cli_json_begin_array(&j, 1);
        for (size_t i = 0; i < n_out; i++)
            cli_json_u64(&j, gen[i]);
        cli_json_end_array(&j);
        if (tok) {
            cli_json_key(&j, "pieces");
            cli_json_begin_array(&j, 1);
            for (size_t i = 0; i < n_out; i++) {
                size_t k = tokenizer_piece(tok, gen[i], piece, sizeof piece);
                cli_json_string_n(&j, piece, k);
            }
            cli_json_end_array(&j);
        }
        cli_json_key(&j, "prompt_tokens");
        cli_json_begin_array(&j, 1);
        for (long i = 0; i < np; i++)
            cli_json_u64(&j, prompt_ids[i]);
        cli_json_end_array(&j);
        cli_json_key(&j, "n_vocab");
        cli_json_u64(&j, c->vocab);
        cli_json_key(&j, "threads");
        cli_json_u64(&j, threads);
        cli_json_key(&j, "first_token_seconds");
        cli_json_f64(&j, t_first);
        cli_json_key(&j, "decode_tok_s");
        cli_json_f64(&j, tok_s);
        cli_json_key(&j, "prompt_tok_s");
        cli_json_f64(&j, prompt_tok_s);
        cli_json_key(&j, "bytes_read_per_token");
        cli_json_u64(&j, per_token);
        cli_json_key(&j, "bytes_read");
        cli_json_u64(&j, st.bytes_read);
        cli_json_key(&j, "model_bytes");
        cli_json_u64(&j, ferry_catalog_total_bytes(ferry_catalog_of(f)));
        cli_json_key(&j, "engine_bytes");
        cli_json_u64(&j, llama_memory_bytes(c, (uint32_t)n_ctx, eval_batch, (int)threads));
        cli_json_key(&j, "peak_rss_bytes");
        cli_json_u64(&j, cli_peak_rss());
        cli_json_key(&j, "prefetch_hits");
        cli_json_u64(&j, st.prefetch_hits);
        cli_json_key(&j, "prefetch_misses");
        cli_json_u64(&j, st.prefetch_misses);
        cli_json_key(&j, "wait_seconds_per_token");
        cli_json_f64(&j, evals ? st.wait_seconds / (double)evals : 0);
        cli_json_key(&j, "guess_bytes");
        cli_json_u64(&j, st.guess_bytes);
        cli_json_key(&j, "guess_unused_bytes");
        cli_json_u64(&j, st.guess_unused_bytes);
        if (c->n_expert) {
            cli_json_key(&j, "routing_predicted_hits");
            cli_json_u64(&j, route_hits);
            cli_json_key(&j, "routing_predictions");
            cli_json_u64(&j, route_preds);
            cli_json_key(&j, "routing_predicted_hits_by_depth");
            cli_json_begin_array(&j, 1);
            for (uint32_t d = 0; d < LLAMA_LOOKAHEAD_MAX; d++) {
                uint64_t h, np_d;
                llama_routing_stats_depth(m, d, &h, &np_d);
                if (!np_d)
                    break;
                cli_json_f64(&j, (double)h / (double)np_d);
            }
            cli_json_end_array(&j);
        }
        cli_json_end_object(&j);
        cli_json_finish(&j);
    } else {
        char b1[32], b2[32];
        printf("prompt: %ld tokens\ngenerated:", np);
        for (size_t i = 0; i < n_out; i++)
            printf(" %u", gen[i]);
        printf("\n");
        if (tok) {
            printf("text: ");
            for (long i = 0; prompt && i < np; i++) {
                size_t k = tokenizer_piece(tok, prompt_ids[i], piece, sizeof piece);
                cli_print_text(stdout, piece, k, sizeof piece);
            }
            printf("|");
            for (size_t i = 0; i < n_out; i++) {
                size_t k = tokenizer_piece(tok, gen[i], piece, sizeof piece);
                cli_print_text(stdout, piece, k, sizeof piece);
            }
            printf("\n");
        }
        printf("first token %.3f s, prompt %.2f tok/s, decode %.2f tok/s (%llu threads), read %s "
               "per token, peak RSS %s\nprefetch hits %llu, misses %llu\n",
               t_first, prompt_tok_s, tok_s, (unsigned long long)threads, cli_size(per_token, b1),
               cli_size(cli_peak_rss(), b2), (unsigned long long)st.prefetch_hits,
               (unsigned long long)st.prefetch_misses);
        if (c->n_expert)
            printf("experts predicted for the next layer: %llu of %llu chosen\n",
                   (unsigned long long)route_hits, (unsigned long long)route_preds);
    }
out:
    if (tracing && ferry_trace_stop(f) && rc == CLI_EXIT_OK)
        rc = cli_error("%s", ferry_errmsg(f));
    if (lf)
        fclose(lf);
    if (tf)
        fclose(tf);
    free(timeline_real);
    free(logits_real);
    free(trace_real);
    free(gen);
    free(rows);
    llama_destroy(m);
    tokenizer_destroy(tok);
    ferry_destroy(f);
    free(prompt_ids);
    return rc;
}

int cmd_generate(int argc, char **argv)
{
    runopts r;
    memset(&r, 0, sizeof r);
    int rc = generate_cmd(&r, argc, argv);
    runopts_free(&r);
    return rc;
}
