/*
 * test_generate_cli.c — `ferry generate` as a user runs it, on models `ferry gen` writes: the
 * output it promises (the generated ids, the --json keys, the --logits file's size), the same
 * tokens and bit-identical logits whatever the placement (resident, home disk under a host
 * budget, lazy, direct reads), the thread count and the prompt batch, and a clear error with the right exit status
 * for every bad input; for a mixture of experts the routing trace and counts it promises, the
 * same bits whatever the batch and the placement; --trace writes a timeline of the reads and of
 * every evaluation, and never over the model. The numbers themselves are checked against
 * numpy by generate_numpy.py.
 */
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "cli_harness.h"

#define VOCAB 300

static char model[1200], unet[1200], st[1200];

static char *logits_of(const char *args, size_t *len, char *tokens, size_t tlen)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/l.f32", tmp);
    int rc = run("generate '%s' --tokens 1,7,42 -n 5 --json --logits '%s' %s", model, path, args);
    if (rc != 0)
        fprintf(stderr, "generate %s: exit %d: %s\n", args, rc, err_text);
    CHECK_EQ_INT(rc, 0);
    const char *t = strstr(out_text, "\"tokens\": [");
    const char *e = t ? strchr(t, ']') : NULL;
    CHECK(t && e);
    tokens[0] = 0;
    if (t && e && (size_t)(e - t) < tlen) {
        memcpy(tokens, t, (size_t)(e - t));
        tokens[e - t] = 0;
    }
    return slurp(path, len);
}

int main(void)
{
    tmp = check_tmpdir("generate_cli");
    snprintf(model, sizeof model, "%s/m.gguf", tmp);
    snprintf(unet, sizeof unet, "%s/u.gguf", tmp);
    snprintf(st, sizeof st, "%s/m.safetensors", tmp);
    CHECK_EQ_INT(run("gen -q -o '%s' --layers 3 --dim 128 --ff 256 --vocab %d --heads 4 "
                     "--kv-heads 2 --dtype q8_0", model, VOCAB), 0);
    CHECK_EQ_INT(run("gen -q -o '%s' --arch unet --dim 32 --layers 1", unet), 0);
    CHECK_EQ_INT(run("gen -q -o '%s' --layers 1 --dim 64 --ff 128 --vocab 50", st), 0);

    /* what it prints */
    CHECK_EQ_INT(run("generate '%s' --tokens 1,7,42 -n 4", model), 0);
    CHECK(strstr(out_text, "generated:") != NULL);
    CHECK(strstr(out_text, "tok/s") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1,7,42 -n 4 --json", model), 0);
    static const char *keys[] = {"\"tokens\"", "\"prompt_tokens\": [1, 7, 42]",
                                 "\"n_vocab\": 300", "\"first_token_seconds\"",
                                 "\"decode_tok_s\"", "\"bytes_read_per_token\"",
                                 "\"peak_rss_bytes\"", "\"prefetch_hits\"",
                                 "\"prefetch_misses\""};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (!strstr(out_text, keys[i]))
            fprintf(stderr, "--json lacks %s:\n%s\n", keys[i], out_text);
        CHECK(strstr(out_text, keys[i]) != NULL);
    }
    {
        /* four ids in the array */
        const char *t = strstr(out_text, "\"tokens\": [");
        int commas = 0;
        for (const char *p = t; p && *p && *p != ']'; p++)
            commas += *p == ',';
        CHECK_EQ_INT(commas, 3);
    }

    /* --logits: one row per prompt token and per generated token but the last; the same tokens
     * and the same bits wherever the weights live and however many threads compute */
    size_t n0 = 0;
    char tok0[256], tok[256];
    char *l0 = logits_of("--threads 1", &n0, tok0, sizeof tok0);
    CHECK(l0 != NULL);
    CHECK_EQ_INT((long long)n0, (long long)(3 + 5 - 1) * VOCAB * 4);
    static const char *placements[] = {
        "--threads 3",
        "--batch 1", /* the prompt one token at a time: each position computed as alone */
        "--batch 2 --threads 2",
        "--home disk --budget host=400KiB",
        "--home disk --load direct --threads 2",
        "--lazy on",
        "--load read",
    };
    for (size_t i = 0; i < sizeof placements / sizeof placements[0]; i++) {
        size_t n = 0;
        char *l = logits_of(placements[i], &n, tok, sizeof tok);
        int same = l && n == n0 && memcmp(l, l0, n0) == 0 && strcmp(tok, tok0) == 0;
        if (!same)
            fprintf(stderr, "%s: logits or tokens differ (%s vs %s)\n", placements[i], tok,
                    tok0);
        CHECK(same);
        free(l);
    }
    free(l0);
    /* a host budget below the model: layers are read again on every token */
    CHECK_EQ_INT(run("generate '%s' --tokens 1,2 -n 3 --json --home disk --budget host=400KiB",
                     model), 0);
    CHECK(strstr(out_text, "\"bytes_read_per_token\": 0,") == NULL);

    /* usage errors: exit 2 */
    CHECK_EQ_INT(run("generate '%s'", model), 2);
    CHECK(strstr(err_text, "--tokens or --prompt") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --prompt hi", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1,x", model), 2);
    CHECK(strstr(err_text, "not a list of token ids") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens ''", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 -n 0", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --threads 0", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --batch 0", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1,2,3 -n 4 --ctx 3", model), 2);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --device sim:64MiB", model), 2);
    CHECK(strstr(err_text, "cpu") != NULL);
    CHECK_EQ_INT(run("generate --tokens 1"), 2);

    /* failures: exit 1 with what and where */
    CHECK_EQ_INT(run("generate '%s' --tokens 1,300", model), 1);
    CHECK(strstr(err_text, "300") && strstr(err_text, "vocabulary"));
    CHECK_EQ_INT(run("generate '%s' --prompt hello", model), 1);
    CHECK(strstr(err_text, "no tokenizer") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1", unet), 1);
    CHECK(strstr(err_text, "not llama") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1", st), 1);
    CHECK(strstr(err_text, "llama.block_count") != NULL);
    CHECK_EQ_INT(run("generate '%s/missing.gguf' --tokens 1", tmp), 1);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --budget host=1KiB --home disk", model), 1);
    CHECK(strstr(err_text, "budget") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --logits '%s/no/such/dir/l.f32'", model, tmp), 1);
    /* the KV cache is reserved against the host budget: 100,000 positions (76.8 MB) do not fit */
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --ctx 100000 --budget host=400KiB", model), 1);
    CHECK(strstr(err_text, "budget") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --ctx 100000 --json", model), 0);
    CHECK(strstr(out_text, "\"engine_bytes\": 7") != NULL); /* 76.8 MB and a little */

    /* a mixture of experts: --json counts, --trace-routing one line per evaluated position */
    char moe[1200], trace[1300];
    snprintf(moe, sizeof moe, "%s/moe.gguf", tmp);
    snprintf(trace, sizeof trace, "%s/routing.txt", tmp);
    CHECK_EQ_INT(run("gen -q -o '%s' --arch moe --experts 4 --experts-used 2 --layers 3 --dim 128 "
                     "--ff 128 --vocab %d --heads 4 --dtype q8_0", moe, VOCAB), 0);
    char *t0 = NULL;
    static const char *moe_runs[] = {"", "--batch 1", "--home disk --budget host=600KiB",
                                     "--home disk --budget host=600KiB --lookahead on",
                                     "--home disk --budget host=600KiB --lookahead on "
                                     "--lookahead-min 0.5",
                                     "--home disk --budget host=600KiB --lookahead on "
                                     "--lookahead-depth 2"};
    for (size_t i = 0; i < sizeof moe_runs / sizeof moe_runs[0]; i++) {
        int rc = run("generate '%s' --tokens 1,7,42 -n 5 --json --trace-routing '%s' %s", moe,
                     trace, moe_runs[i]);
        if (rc != 0)
            fprintf(stderr, "generate %s: exit %d: %s\n", moe_runs[i], rc, err_text);
        CHECK_EQ_INT(rc, 0);
        CHECK(strstr(out_text, "\"routing_predicted_hits\"") != NULL);
        CHECK(strstr(out_text, "\"routing_predictions\": 28") != NULL); /* 7 rows x 2 layers x 2 */
        /* one rate per depth predicted: layers 1 and 2 one ahead, layer 2 also two ahead */
        const char *bd = strstr(out_text, "\"routing_predicted_hits_by_depth\": [");
        CHECK(bd != NULL);
        int depths = 0;
        for (const char *q = bd ? strchr(bd, '[') + 1 : NULL; q && *q && *q != ']'; q++)
            depths += *q == ',' || q[-1] == '[';
        CHECK_EQ_INT(depths, strstr(moe_runs[i], "--lookahead-depth 2") ? 2 : 1);
        size_t n = 0;
        char *t = slurp(trace, &n);
        int lines = 0, ok = t != NULL;
        for (char *p = t, *nl; ok && p < t + n; p = nl + 1, lines++) {
            nl = memchr(p, '\n', (size_t)(t + n - p));
            unsigned a0, b0, a1, b1, a2, b2;
            ok = nl && sscanf(p, "L0:%u,%u L1:%u,%u L2:%u,%u", &a0, &b0, &a1, &b1, &a2, &b2) == 6 &&
                 a0 < b0 && b0 < 4 && a1 < b1 && b1 < 4 && a2 < b2 && b2 < 4;
        }
        CHECK(ok);
        CHECK_EQ_INT(lines, 3 + 5 - 1);
        if (!t0)
            t0 = t;
        else {
            CHECK(t && strcmp(t, t0) == 0); /* the same experts whatever the batch or placement */
            free(t);
        }
    }
    free(t0);
    /* resident, the experts are read once, with their whole tensors: no slice reads them again */
    CHECK_EQ_INT(run("generate '%s' --tokens 1,7,42 -n 5 --json", moe), 0);
    const char *br = strstr(out_text, "\"bytes_read\": "), *mb = strstr(out_text, "\"model_bytes\": ");
    CHECK(br && mb);
    if (br && mb) {
        unsigned long long read = strtoull(br + 14, NULL, 10), model = strtoull(mb + 15, NULL, 10);
        CHECK(model > 0 && read > model / 2 && read < model + model / 10);
    }
    CHECK(strstr(out_text, "\"wait_seconds_per_token\"") != NULL);
    CHECK(strstr(out_text, "\"guess_bytes\"") != NULL);
    CHECK(strstr(out_text, "\"guess_unused_bytes\"") != NULL);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --lookahead maybe", moe), 2);
    CHECK(strstr(err_text, "--lookahead") != NULL);
    static const char *bad_min[] = {"1.5", "-0.1", "x", "0.5x", "nan"};
    for (size_t i = 0; i < sizeof bad_min / sizeof bad_min[0]; i++) {
        CHECK_EQ_INT(run("generate '%s' --tokens 1 --lookahead on --lookahead-min '%s'", moe,
                         bad_min[i]), 2);
        CHECK(strstr(err_text, "--lookahead-min") != NULL);
    }
    static const char *bad_depth[] = {"0", "5", "x", "-1", "2x"};
    for (size_t i = 0; i < sizeof bad_depth / sizeof bad_depth[0]; i++) {
        CHECK_EQ_INT(run("generate '%s' --tokens 1 --lookahead on --lookahead-depth '%s'", moe,
                         bad_depth[i]), 2);
        CHECK(strstr(err_text, "--lookahead-depth") != NULL);
    }
    /* --trace: a Chrome-trace timeline with the reads of a home-disk run and one event per
     * evaluation (the 3-token prompt in one batch, then 4 tokens); never over the model */
    char timeline[1300];
    snprintf(timeline, sizeof timeline, "%s/timeline.json", tmp);
    CHECK_EQ_INT(run("generate '%s' --tokens 1,7,42 -n 5 --home disk --trace '%s'", model,
                     timeline), 0);
    size_t tl_len = 0;
    char *tl = slurp(timeline, &tl_len);
    CHECK(tl && strstr(tl, "\"traceEvents\"") && strstr(tl, "\"read blk.0.attn_q.weight\""));
    int n_prompt = 0, n_token = 0;
    for (const char *q = tl; q && (q = strstr(q, "\"name\":\"")) != NULL; q++) {
        n_prompt += strncmp(q + 8, "prompt\"", 7) == 0;
        n_token += strncmp(q + 8, "token\"", 6) == 0;
    }
    CHECK_EQ_INT(n_prompt, 1);
    CHECK_EQ_INT(n_token, 4);
    free(tl);
    struct stat before, after;
    CHECK_EQ_INT(stat(model, &before), 0);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 -n 2 --trace '%s'", model, model), 2);
    CHECK(strstr(err_text, "--trace") != NULL);
    CHECK_EQ_INT(stat(model, &after), 0);
    CHECK(before.st_size == after.st_size && before.st_mtime == after.st_mtime);
    CHECK_EQ_INT(run("generate '%s' --tokens 1 --trace-routing '%s'", model, trace), 2);
    CHECK(strstr(err_text, "mixture of experts") != NULL);
    CHECK_EQ_INT(run("gen -q -o '%s/x.gguf' --experts 4", tmp), 2);
    CHECK_EQ_INT(run("gen -q -o '%s/x.gguf' --arch moe --experts 4 --experts-used 5", tmp), 2);
    return check_finish();
}
