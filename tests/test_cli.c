/*
 * test_cli.c — the ferry command-line tool, run as a user runs it (the binary FERRY_CLI through
 * the shell): exit statuses and messages, gen -> inspect --json round trips for both formats and
 * every dtype gen writes (checked against the library's own catalog of the same file and against
 * the architecture's expected names and shapes), the values gen writes, determinism, sizing,
 * JSON escaping of hostile metadata, failures on missing and truncated files, demo, `gen --lora`
 * (each scheme's names and ranks, the library's mapping, `run -a --verify`) and `devices`.
 */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/wait.h>

#include "check.h"
#include "ferry.h"
#include "formats/formats.h"

#include "cli_harness.h"

static int contains(const char *hay, const char *needle) { return hay && strstr(hay, needle); }

static int starts_with(const char *s, const char *prefix)
{
    return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- JSON helpers (the library's strict parser: output that parses is valid JSON) -------- */

static int parse_json(const char *text, size_t len, ferry__json *out)
{
    ferry__err e;
    ferry__err_clear(&e);
    memset(out, 0, sizeof *out);
    int rc = ferry__json_parse(text, len, "stdout", out, &e);
    if (rc != 0)
        fprintf(stderr, "JSON does not parse: %s\n", e.msg);
    return rc;
}

static const ferry__json *jget(const ferry__json *o, const char *key)
{
    return o && o->type == FERRY__JSON_OBJECT ? ferry__json_get(o, key) : NULL;
}

static uint64_t jnum(const ferry__json *j)
{
    uint64_t v = UINT64_MAX;
    if (!j || j->type != FERRY__JSON_NUMBER || ferry__json_u64(j, &v) != 0)
        return UINT64_MAX;
    return v;
}

static const char *jstr(const ferry__json *j)
{
    return j && j->type == FERRY__JSON_STRING ? j->str : NULL;
}

/* ---- basics -------------------------------------------------------------------------------- */

static void test_usage(void)
{
    CHECK_EQ_INT(run("--version"), 0);
    CHECK_STR(out_text, "ferry " FERRY_VERSION_STRING "\n");
    CHECK_EQ_INT(run("--help"), 0);
    CHECK(contains(out_text, "inspect") && contains(out_text, "gen") &&
          contains(out_text, "demo"));
    CHECK_EQ_INT(run("gen --help"), 0);
    CHECK(contains(out_text, "--dtype") && contains(out_text, "--seed"));
    CHECK_EQ_INT(run("help inspect"), 0);
    CHECK(contains(out_text, "--json"));
    CHECK_EQ_INT(run("inspect -h"), 0);
    CHECK_EQ_INT(run("demo --help"), 0);

    CHECK_EQ_INT(run("%s", ""), 2);
    CHECK_EQ_INT(run("frobnicate"), 2);
    CHECK(starts_with(err_text, "ferry: unknown command 'frobnicate'"));
    CHECK_EQ_INT(run("--frobnicate"), 2);
    CHECK_EQ_INT(run("gen --frobnicate -o '%s/x.gguf'", tmp), 2);
    CHECK(contains(err_text, "--frobnicate"));
    CHECK_EQ_INT(run("inspect --json=yes x.gguf"), 2);
    CHECK_EQ_INT(run("inspect"), 2);
    CHECK_EQ_INT(run("gen --layers 2"), 2); /* no -o */
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --layers", tmp), 2); /* no value */
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --layers two", tmp), 2);
    CHECK(contains(err_text, "--layers"));
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --layers 0", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --size lots", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --dtype q5_k", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --arch gpt", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --format onnx", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' --dim 64 --heads 3", tmp), 2);
    CHECK_EQ_INT(run("gen -o '%s/x.gguf' stray", tmp), 2);
    CHECK_EQ_INT(run("demo stray"), 2);
    /* nothing was written by any of these */
    char p[4200];
    snprintf(p, sizeof p, "%s/x.gguf", tmp);
    CHECK(access(p, F_OK) != 0);

    CHECK_EQ_INT(run("gen --format safetensors --dtype q4_0 -o '%s/q.safetensors' --layers 1 "
                     "--dim 64",
                     tmp),
                 2);
    CHECK(contains(err_text, "safetensors"));
    CHECK_EQ_INT(run("gen --dtype q8_0 -o '%s/q.safetensors' --layers 1 --dim 64", tmp), 2);
    snprintf(p, sizeof p, "%s/q.safetensors", tmp);
    CHECK(access(p, F_OK) != 0);
}

/* ---- round trips --------------------------------------------------------------------------- */

/* The expected llama tensors of `--layers 2 --dim 64 --ff 128 --vocab 100`, shapes outermost
 * first (safetensors order; GGUF's is reversed). */
typedef struct expect_t {
    const char *name;
    int norm;
    uint32_t ndim;
    int64_t shape[2];
} expect_t;

static const expect_t llama_small[] = {
    {"token_embd.weight", 0, 2, {100, 64}},
    {"blk.0.attn_norm.weight", 1, 1, {64}},
    {"blk.0.attn_q.weight", 0, 2, {64, 64}},
    {"blk.0.attn_k.weight", 0, 2, {64, 64}},
    {"blk.0.attn_v.weight", 0, 2, {64, 64}},
    {"blk.0.attn_output.weight", 0, 2, {64, 64}},
    {"blk.0.ffn_norm.weight", 1, 1, {64}},
    {"blk.0.ffn_gate.weight", 0, 2, {128, 64}},
    {"blk.0.ffn_up.weight", 0, 2, {128, 64}},
    {"blk.0.ffn_down.weight", 0, 2, {64, 128}},
    {"blk.1.attn_norm.weight", 1, 1, {64}},
    {"blk.1.ffn_down.weight", 0, 2, {64, 128}},
    {"output_norm.weight", 1, 1, {64}},
    {"output.weight", 0, 2, {100, 64}},
};

/* Checks the JSON of `inspect --json` against the library's catalog of the same files: every
 * field of every tensor, the format, files, totals and metadata keys. Returns the catalog (the
 * caller destroys it) or NULL. */
static ferry_catalog *check_against_catalog(const ferry__json *doc, const char **paths, int n)
{
    ferry_catalog *c = ferry_catalog_create();
    for (int i = 0; i < n; i++)
        if (ferry_catalog_add(c, paths[i], NULL) != 0) {
            fprintf(stderr, "catalog: %s\n", ferry_catalog_errmsg(c));
            ferry_catalog_destroy(c);
            CHECK(0);
            return NULL;
        }
    CHECK(doc->type == FERRY__JSON_OBJECT);
    CHECK_EQ_INT(jnum(jget(doc, "n_tensors")), ferry_catalog_count(c));
    CHECK_EQ_INT(jnum(jget(doc, "total_bytes")), ferry_catalog_total_bytes(c));
    const ferry__json *files = jget(doc, "files");
    CHECK(files && files->type == FERRY__JSON_ARRAY &&
          files->n == ferry_catalog_file_count(c));
    for (size_t i = 0; files && i < files->n && i < ferry_catalog_file_count(c); i++)
        CHECK_STR(jstr(&files->items[i]), ferry_catalog_file_path(c, i));
    const ferry__json *meta = jget(doc, "metadata");
    CHECK(meta && meta->type == FERRY__JSON_OBJECT && meta->n == ferry_catalog_meta_count(c));
    for (size_t i = 0; meta && i < meta->n && i < ferry_catalog_meta_count(c); i++)
        CHECK_STR(meta->keys[i], ferry_catalog_meta_key(c, i));

    const ferry__json *ts = jget(doc, "tensors");
    CHECK(ts && ts->type == FERRY__JSON_ARRAY && ts->n == ferry_catalog_count(c));
    int bad = 0;
    for (size_t i = 0; ts && i < ts->n && i < ferry_catalog_count(c); i++) {
        ferry_tensor_info t;
        const ferry__json *o = &ts->items[i];
        if (ferry_catalog_tensor(c, i, &t) != 0) {
            bad++;
            continue;
        }
        const ferry__json *shape = jget(o, "shape");
        const char *name = jstr(jget(o, "name")), *dt = jstr(jget(o, "dtype"));
        const char *file = jstr(jget(o, "file"));
        if (!name || strcmp(name, t.name) != 0 || !dt || strcmp(dt, ferry_dtype_name(t.dtype)) ||
            !file || strcmp(file, t.file) != 0 || jnum(jget(o, "offset")) != t.offset ||
            jnum(jget(o, "nbytes")) != t.nbytes || !shape || shape->type != FERRY__JSON_ARRAY ||
            shape->n != t.ndim) {
            fprintf(stderr, "tensor %zu (%s) differs from the catalog\n", i, t.name);
            bad++;
            continue;
        }
        for (uint32_t d = 0; d < t.ndim; d++)
            if (jnum(&shape->items[d]) != (uint64_t)t.shape[d])
                bad++;
    }
    CHECK_EQ_INT(bad, 0);
    return c;
}

/* Reads tensor NAME of catalog C as f32 (converted by the library) into a malloc'd array. */
static float *tensor_values(const ferry_catalog *c, const char *name, uint64_t *n)
{
    int64_t i = ferry_catalog_find(c, name);
    ferry_tensor_info t;
    if (i < 0 || ferry_catalog_tensor(c, (size_t)i, &t) != 0)
        return NULL;
    FILE *f = fopen(t.file, "rb");
    unsigned char *raw = malloc(t.nbytes ? t.nbytes : 1);
    float *vals = malloc(t.n_elems * sizeof(float));
    int ok = f && raw && vals && fseeko(f, (off_t)t.offset, SEEK_SET) == 0 &&
             fread(raw, 1, t.nbytes, f) == t.nbytes &&
             ferry_dtype_convert(t.dtype, raw, FERRY_DTYPE_F32, vals, t.n_elems) == 0;
    if (f)
        fclose(f);
    free(raw);
    if (!ok) {
        free(vals);
        return NULL;
    }
    *n = t.n_elems;
    return vals;
}

static void mean_std(const float *v, uint64_t n, double *mean, double *sd)
{
    double s = 0, s2 = 0;
    for (uint64_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

static void round_trip(const char *format, const char *dtype)
{
    char path[4200];
    int gguf = strcmp(format, "gguf") == 0;
    snprintf(path, sizeof path, "%s/small-%s.%s", tmp, dtype, gguf ? "gguf" : "safetensors");
    int rc = run("gen -o '%s' --format %s --dtype %s --layers 2 --dim 64 --ff 128 --vocab 100 "
                 "--seed 7 --quiet",
                 path, format, dtype);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) {
        fprintf(stderr, "gen %s %s: %s", format, dtype, err_text);
        return;
    }
    CHECK_EQ_INT(out_len, 0); /* --quiet */
    CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) != 0) {
        CHECK(0);
        return;
    }
    CHECK_STR(jstr(jget(&doc, "format")), format);
    CHECK_EQ_INT(jnum(jget(&doc, "n_tensors")), 21);
    const char *paths[] = {path};
    ferry_catalog *c = check_against_catalog(&doc, paths, 1);

    /* names, dtypes and shapes as the architecture has them, in the format's order */
    const ferry__json *ts = jget(&doc, "tensors");
    ferry_dtype want = ferry_dtype_from_name(dtype);
    for (size_t k = 0; ts && k < sizeof llama_small / sizeof llama_small[0]; k++) {
        const expect_t *e = &llama_small[k];
        const ferry__json *o = NULL;
        for (size_t i = 0; i < ts->n; i++)
            if (jstr(jget(&ts->items[i], "name")) &&
                strcmp(jstr(jget(&ts->items[i], "name")), e->name) == 0)
                o = &ts->items[i];
        CHECK(o != NULL);
        if (!o)
            continue;
        const char *dt = jstr(jget(o, "dtype"));
        ferry_dtype expect_dt = e->norm && gguf ? FERRY_DTYPE_F32 : want;
        if (!dt || strcmp(dt, ferry_dtype_name(expect_dt)) != 0) {
            fprintf(stderr, "%s %s: %s is %s, expected %s\n", format, dtype, e->name,
                    dt ? dt : "?", ferry_dtype_name(expect_dt));
            CHECK(0);
        }
        const ferry__json *shape = jget(o, "shape");
        CHECK(shape && shape->n == e->ndim);
        for (uint32_t d = 0; shape && d < e->ndim && d < shape->n; d++)
            CHECK_EQ_INT(jnum(&shape->items[d]), e->shape[gguf ? e->ndim - 1 - d : d]);
    }

    /* metadata: typed in GGUF, strings in safetensors */
    const ferry__json *meta = jget(&doc, "metadata");
    CHECK_STR(jstr(jget(meta, "general.architecture")), "llama");
    if (gguf) {
        CHECK_EQ_INT(jnum(jget(meta, "llama.block_count")), 2);
        CHECK_EQ_INT(jnum(jget(meta, "llama.embedding_length")), 64);
        CHECK_EQ_INT(jnum(jget(meta, "llama.feed_forward_length")), 128);
        CHECK_EQ_INT(jnum(jget(meta, "ferry.seed")), 7);
        CHECK(jget(meta, "llama.attention.head_count") != NULL);
        CHECK(jget(meta, "llama.attention.head_count_kv") != NULL);
        CHECK(jget(meta, "llama.context_length") != NULL);
    } else {
        CHECK_STR(jstr(jget(meta, "llama.block_count")), "2");
        CHECK_STR(jstr(jget(meta, "ferry.seed")), "7");
    }
    CHECK(starts_with(jstr(jget(meta, "ferry.generator")), "ferry "));

    /* values like trained weights: centred, spread ~1/sqrt(fan_in); norms around 1 */
    if (c) {
        uint64_t n = 0;
        double mean, sd;
        float *v = tensor_values(c, "blk.1.ffn_down.weight", &n);
        CHECK(v != NULL);
        if (v) {
            mean_std(v, n, &mean, &sd);
            double want_sd = 1.0 / sqrt(128.0);
            /* q4_0 rounds coarsely; the spread still has to be in the right range */
            CHECK(fabs(mean) < 0.2 * want_sd);
            CHECK(sd > 0.7 * want_sd && sd < 1.3 * want_sd);
            free(v);
        }
        v = tensor_values(c, "output_norm.weight", &n);
        CHECK(v != NULL);
        if (v) {
            mean_std(v, n, &mean, &sd);
            CHECK(fabs(mean - 1.0) < 0.02);
            CHECK(sd > 0.001 && sd < 0.1);
            free(v);
        }
        ferry_catalog_destroy(c);
    }
    ferry__json_free(&doc);
}

/* grouped-query attention: k and v are kv_heads/heads as wide as q */
static void test_gqa(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/gqa.gguf", tmp);
    CHECK_EQ_INT(run("gen -o '%s' --layers 1 --dim 128 --ff 256 --vocab 100 --heads 4 "
                     "--kv-heads 2 -q",
                     path),
                 0);
    CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) != 0) {
        CHECK(0);
        return;
    }
    const ferry__json *meta = jget(&doc, "metadata");
    CHECK_EQ_INT(jnum(jget(meta, "llama.attention.head_count")), 4);
    CHECK_EQ_INT(jnum(jget(meta, "llama.attention.head_count_kv")), 2);
    const ferry__json *ts = jget(&doc, "tensors");
    int found = 0;
    for (size_t i = 0; ts && i < ts->n; i++) {
        const char *name = jstr(jget(&ts->items[i], "name"));
        const ferry__json *shape = jget(&ts->items[i], "shape");
        if (name && (strcmp(name, "blk.0.attn_k.weight") == 0 ||
                     strcmp(name, "blk.0.attn_v.weight") == 0)) {
            found++;
            CHECK(shape && shape->n == 2 && jnum(&shape->items[0]) == 128 &&
                  jnum(&shape->items[1]) == 64);
        }
        if (name && strcmp(name, "blk.0.attn_q.weight") == 0)
            CHECK(shape && shape->n == 2 && jnum(&shape->items[1]) == 128);
    }
    CHECK_EQ_INT(found, 2);
    ferry__json_free(&doc);
    CHECK_EQ_INT(run("gen -o '%s' --layers 1 --dim 128 --heads 4 --kv-heads 3 -q", path), 2);
    CHECK(contains(err_text, "--kv-heads"));
    /* a folder is no output file */
    CHECK_EQ_INT(run("gen -o '%s' --layers 1 --dim 64 -q", tmp), 1);
}

static void test_round_trips(void)
{
    static const char *const all[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    for (size_t i = 0; i < 5; i++)
        round_trip("gguf", all[i]);
    for (size_t i = 0; i < 3; i++)
        round_trip("safetensors", all[i]);
}

/* ---- unet --------------------------------------------------------------------------------- */

static const ferry__json *find_tensor(const ferry__json *doc, const char *name)
{
    const ferry__json *ts = jget(doc, "tensors");
    for (size_t i = 0; ts && i < ts->n; i++)
        if (jstr(jget(&ts->items[i], "name")) && strcmp(jstr(jget(&ts->items[i], "name")), name) == 0)
            return &ts->items[i];
    return NULL;
}

static int shape_is(const ferry__json *t, uint32_t ndim, const int64_t *want)
{
    const ferry__json *s = jget(t, "shape");
    if (!s || s->n != ndim)
        return 0;
    for (uint32_t d = 0; d < ndim; d++)
        if (jnum(&s->items[d]) != (uint64_t)want[d])
            return 0;
    return 1;
}

static void test_unet(void)
{
    static const char *const cases[][2] = {{"safetensors", "f16"}, {"gguf", "q8_0"}};
    for (int k = 0; k < 2; k++) {
        int gguf = k == 1;
        char path[4200];
        snprintf(path, sizeof path, "%s/unet.%s", tmp, cases[k][0]);
        CHECK_EQ_INT(run("gen --arch unet -o '%s' --format %s --dtype %s --dim 32 --layers 1 -q",
                         path, cases[k][0], cases[k][1]),
                     0);
        CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
        ferry__json doc;
        if (parse_json(out_text, out_len, &doc) != 0) {
            CHECK(0);
            continue;
        }
        const char *paths[] = {path};
        ferry_catalog_destroy(check_against_catalog(&doc, paths, 1));
        CHECK_STR(jstr(jget(jget(&doc, "metadata"), "general.architecture")), "unet");

        const ferry__json *t = find_tensor(&doc, "down_blocks.0.resnets.0.conv1.weight");
        CHECK(t && shape_is(t, 4, gguf ? (int64_t[]){3, 3, 32, 32} : (int64_t[]){32, 32, 3, 3}));
        /* a conv row (3 elements) is no whole q8_0 block: it stays f16 */
        CHECK(t && strcmp(jstr(jget(t, "dtype")), "f16") == 0);
        t = find_tensor(&doc, "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q.weight");
        CHECK(t && shape_is(t, 2, (int64_t[]){64, 64}));
        CHECK(t && strcmp(jstr(jget(t, "dtype")), cases[k][1]) == 0);
        t = find_tensor(&doc, "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight");
        CHECK(t && shape_is(t, 2, gguf ? (int64_t[]){768, 64} : (int64_t[]){64, 768}));
        t = find_tensor(&doc, "down_blocks.1.resnets.0.conv_shortcut.weight");
        CHECK(t && shape_is(t, 4, gguf ? (int64_t[]){1, 1, 32, 64} : (int64_t[]){64, 32, 1, 1}));
        t = find_tensor(&doc, "mid_block.attentions.0.transformer_blocks.0.ff.net.0.proj.weight");
        CHECK(t && shape_is(t, 2, gguf ? (int64_t[]){128, 1024} : (int64_t[]){1024, 128}));
        /* the first up block takes the top level's output and its skip: 128 + 128 channels */
        t = find_tensor(&doc, "up_blocks.0.resnets.0.conv1.weight");
        CHECK(t && shape_is(t, 4, gguf ? (int64_t[]){3, 3, 256, 128} : (int64_t[]){128, 256, 3, 3}));
        /* the last resnet of the last up block takes conv_in's 32-channel skip */
        t = find_tensor(&doc, "up_blocks.3.resnets.1.conv1.weight");
        CHECK(t && shape_is(t, 4, gguf ? (int64_t[]){3, 3, 64, 32} : (int64_t[]){32, 64, 3, 3}));
        t = find_tensor(&doc, "up_blocks.3.attentions.1.transformer_blocks.0.attn1.to_out.0.bias");
        CHECK(t && shape_is(t, 1, (int64_t[]){32}));
        CHECK(find_tensor(&doc, "conv_in.weight") && find_tensor(&doc, "conv_out.weight") &&
              find_tensor(&doc, "time_embedding.linear_1.weight") &&
              find_tensor(&doc, "time_embedding.linear_2.bias") &&
              find_tensor(&doc, "down_blocks.2.downsamplers.0.conv.weight") &&
              find_tensor(&doc, "up_blocks.2.upsamplers.0.conv.weight") &&
              find_tensor(&doc, "conv_norm_out.weight"));
        CHECK(!find_tensor(&doc, "down_blocks.3.attentions.0.norm.weight"));
        CHECK(!find_tensor(&doc, "up_blocks.0.attentions.0.norm.weight"));
        ferry__json_free(&doc);
    }
}

/* ---- determinism ---------------------------------------------------------------------------- */

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* 1 when the tensor data (everything from the first tensor on) of A and B is the same */
static int same_tensor_data(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    ferry_catalog *ca = ferry_catalog_create(), *cb = ferry_catalog_create();
    ferry_tensor_info ta, tb;
    int same = x && y && ferry_catalog_add(ca, a, NULL) == 0 &&
               ferry_catalog_add(cb, b, NULL) == 0 && ferry_catalog_tensor(ca, 0, &ta) == 0 &&
               ferry_catalog_tensor(cb, 0, &tb) == 0 && na - ta.offset == nb - tb.offset &&
               memcmp(x + ta.offset, y + tb.offset, na - ta.offset) == 0;
    ferry_catalog_destroy(ca);
    ferry_catalog_destroy(cb);
    free(x);
    free(y);
    return same;
}

static void test_determinism(void)
{
    static const char *const cases[][3] = {
        /* format, dtype, dims: the first has tensors of several chunks (over 1M elements) */
        {"gguf", "q4_0", "--layers 1 --dim 512 --ff 1024 --vocab 2100"},
        {"safetensors", "bf16", "--layers 2 --dim 64 --ff 128 --vocab 100"},
        {"gguf", "f16", "--arch unet --layers 1 --dim 32"},
    };
    for (int k = 0; k < 3; k++) {
        char a[4200], b[4200], c[4200];
        snprintf(a, sizeof a, "%s/det-a.%s", tmp, cases[k][0]);
        snprintf(b, sizeof b, "%s/det-b.%s", tmp, cases[k][0]);
        snprintf(c, sizeof c, "%s/det-c.%s", tmp, cases[k][0]);
        const char *fmt = "gen -o '%s' --format %s --dtype %s %s --seed %d -q";
        CHECK_EQ_INT(run(fmt, a, cases[k][0], cases[k][1], cases[k][2], 11), 0);
        CHECK_EQ_INT(run(fmt, b, cases[k][0], cases[k][1], cases[k][2], 11), 0);
        CHECK_EQ_INT(run(fmt, c, cases[k][0], cases[k][1], cases[k][2], 12), 0);
        CHECK(same_file(a, b));
        CHECK(!same_file(a, c));
        CHECK(same_tensor_data(a, b));
        CHECK(!same_tensor_data(a, c)); /* the values differ, not only the seed in the header */
        /* never all zeros */
        size_t n = 0, nonzero = 0;
        char *data = slurp(a, &n);
        for (size_t i = n / 2; data && i < n; i++)
            nonzero += data[i] != 0;
        CHECK(nonzero > n / 4);
        free(data);
        unlink(a);
        unlink(b);
        unlink(c);
    }
    /* no temporary files left behind */
    DIR *d = opendir(tmp);
    struct dirent *de;
    int leftovers = 0;
    while (d && (de = readdir(d)) != NULL)
        leftovers += strstr(de->d_name, ".tmp") != NULL;
    if (d)
        closedir(d);
    CHECK_EQ_INT(leftovers, 0);
}

/* ---- sizing ------------------------------------------------------------------------------- */

static void test_sizes(void)
{
    static const char *const sizes[] = {"4MiB", "30MiB", "256MiB", "1GiB", "7GB", "40GiB"};
    static const char *const kinds[][2] = {
        {"llama", "f16"}, {"llama", "q4_0"}, {"unet", "f16"}, {"unet", "f32"}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            uint64_t want = 0;
            CHECK(ferry_parse_size(sizes[s], &want) == 0);
            int rc = run("gen --dry-run --json --arch %s --dtype %s --size %s", kinds[k][0],
                         kinds[k][1], sizes[s]);
            CHECK_EQ_INT(rc, 0);
            ferry__json doc;
            if (rc != 0 || parse_json(out_text, out_len, &doc) != 0) {
                CHECK(0);
                continue;
            }
            uint64_t got = jnum(jget(&doc, "total_bytes"));
            double err = fabs((double)got - (double)want) / (double)want;
            if (err > 0.10)
                fprintf(stderr, "%s %s %s: %llu bytes (%.1f%% off)\n", kinds[k][0], kinds[k][1],
                        sizes[s], (unsigned long long)got, err * 100);
            CHECK(err <= 0.10);
            CHECK(jget(&doc, "written") && jget(&doc, "written")->type == FERRY__JSON_BOOL &&
                  !jget(&doc, "written")->b);
            ferry__json_free(&doc);
        }
    /* explicit dimensions override what --size would pick */
    CHECK_EQ_INT(run("gen --dry-run --json --size 1GiB --dim 512"), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) == 0) {
        CHECK_EQ_INT(jnum(jget(&doc, "dim")), 512);
        ferry__json_free(&doc);
    }
    /* and the written file has the size the dry run announced */
    char path[4200];
    snprintf(path, sizeof path, "%s/sized.gguf", tmp);
    CHECK_EQ_INT(run("gen -o '%s' --size 3MiB --dtype q8_0 --json", path), 0);
    if (parse_json(out_text, out_len, &doc) == 0) {
        uint64_t got = jnum(jget(&doc, "total_bytes"));
        CHECK(got > 2.7 * 1048576 && got < 3.3 * 1048576);
        CHECK(jget(&doc, "written")->b);
        ferry__json_free(&doc);
        ferry_catalog *c = ferry_catalog_create();
        CHECK(ferry_catalog_add(c, path, NULL) == 0 && ferry_catalog_total_bytes(c) == got);
        ferry_catalog_destroy(c);
    }
    unlink(path);
}

/* ---- failures ------------------------------------------------------------------------------ */

static void test_failures(void)
{
    char path[4200], trunc[4200], prefix[8500];
    snprintf(path, sizeof path, "%s/no/such/model.gguf", tmp);
    CHECK_EQ_INT(run("inspect '%s'", path), 1);
    snprintf(prefix, sizeof prefix, "ferry: %s:", path);
    CHECK(starts_with(err_text, prefix));
    CHECK_EQ_INT(out_len, 0);
    CHECK_EQ_INT(run("inspect --json '%s'", path), 1);
    CHECK(starts_with(err_text, prefix));

    /* a truncated file: the path named once, then what is wrong */
    snprintf(path, sizeof path, "%s/whole.gguf", tmp);
    snprintf(trunc, sizeof trunc, "%s/trunc.gguf", tmp);
    CHECK_EQ_INT(run("gen -o '%s' --layers 2 --dim 64 --ff 128 --vocab 100 -q", path), 0);
    size_t n = 0;
    char *data = slurp(path, &n);
    CHECK(data && n > 1000);
    if (data) {
        CHECK(check_write_file(trunc, data, n / 2) == 0);
        CHECK_EQ_INT(run("inspect '%s'", trunc), 1);
        snprintf(prefix, sizeof prefix, "ferry: %s:", trunc);
        CHECK(starts_with(err_text, prefix));
        snprintf(prefix, sizeof prefix, "%s: %s", trunc, trunc);
        CHECK(!contains(err_text, prefix));
        CHECK(strchr(err_text, '\n') && strlen(err_text) > strlen(trunc) + 12);
        /* the header alone, cut in the middle */
        CHECK(check_write_file(trunc, data, 40) == 0);
        CHECK_EQ_INT(run("inspect --json '%s'", trunc), 1);
        CHECK_EQ_INT(out_len, 0);
        free(data);
    }
    /* not a model at all */
    CHECK(check_write_file(trunc, "hello, world\n", 13) == 0);
    CHECK_EQ_INT(run("inspect '%s'", trunc), 1);
    CHECK(contains(err_text, trunc));
    /* a write that fails half-way (the file size limit): exit 1, no file, no temporary file */
    char cmd[9000], model[4200];
    snprintf(model, sizeof model, "%s/limited/m.gguf", tmp);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/limited' && trap '' XFSZ && ulimit -f 4000 && "
             "%s gen -o '%s' --size 8MiB -q 2>'%s/limited.txt'",
             tmp, FERRY_CLI, model, tmp);
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 1);
    snprintf(cmd, sizeof cmd, "%s/limited.txt", tmp);
    char *msg = slurp(cmd, NULL);
    snprintf(prefix, sizeof prefix, "ferry: %s:", model);
    CHECK(starts_with(msg, prefix));
    free(msg);
    snprintf(cmd, sizeof cmd, "%s/limited", tmp);
    DIR *d = opendir(cmd);
    int entries = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        entries += de->d_name[0] != '.';
    if (d)
        closedir(d);
    CHECK_EQ_INT(entries, 0);

    /* a folder that does not exist: gen fails, writes nothing */
    CHECK_EQ_INT(run("gen -o '%s/no/such/dir/m.gguf' --layers 1 --dim 64 -q", tmp), 1);
    snprintf(prefix, sizeof prefix, "ferry: %s/no/such/dir/m.gguf:", tmp);
    CHECK(starts_with(err_text, prefix));
}

/* ---- hostile metadata: escaping -------------------------------------------------------------- */

static void test_escaping(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/odd.gguf", tmp);
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    static const char odd[] = "line1\nline2\t\"quoted\" back\\slash \x01 caf\xc3\xa9 bad\xff end";
    ferry_value v;
    memset(&v, 0, sizeof v);
    v.type = FERRY_VALUE_STRING;
    v.v.str.ptr = odd;
    v.v.str.len = sizeof odd - 1;
    CHECK(ferry_writer_set_meta(w, "odd.string", &v) == 0);
    CHECK(ferry_writer_set_meta_str(w, "we\"ird\\key\n", "x") == 0);
    v.type = FERRY_VALUE_F32;
    v.v.f = NAN;
    CHECK(ferry_writer_set_meta(w, "odd.nan", &v) == 0);
    v.type = FERRY_VALUE_F64;
    v.v.f = -INFINITY;
    CHECK(ferry_writer_set_meta(w, "odd.inf", &v) == 0);
    v.v.f = 0.1;
    CHECK(ferry_writer_set_meta(w, "odd.tenth", &v) == 0);
    v.type = FERRY_VALUE_I32;
    v.v.i = -42;
    CHECK(ferry_writer_set_meta(w, "odd.neg", &v) == 0);
    v.type = FERRY_VALUE_U64;
    v.v.u = UINT64_MAX;
    CHECK(ferry_writer_set_meta(w, "odd.u64max", &v) == 0);
    v.type = FERRY_VALUE_BOOL;
    v.v.u = 1;
    CHECK(ferry_writer_set_meta(w, "odd.bool", &v) == 0);
    ferry_value items[100], inner[2][3];
    for (int i = 0; i < 100; i++) {
        memset(&items[i], 0, sizeof items[i]);
        items[i].type = FERRY_VALUE_STRING;
        items[i].v.str.ptr = i % 2 ? "tok\"en" : "<s>";
        items[i].v.str.len = strlen(items[i].v.str.ptr);
    }
    v.type = FERRY_VALUE_ARRAY;
    v.v.arr.elem = FERRY_VALUE_STRING;
    v.v.arr.n = 100;
    v.v.arr.items = items;
    CHECK(ferry_writer_set_meta(w, "odd.tokens", &v) == 0);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) {
            memset(&inner[i][k], 0, sizeof inner[i][k]);
            inner[i][k].type = FERRY_VALUE_I8;
            inner[i][k].v.i = -(i * 3 + k);
        }
        memset(&items[i], 0, sizeof items[i]);
        items[i].type = FERRY_VALUE_ARRAY;
        items[i].v.arr.elem = FERRY_VALUE_I8;
        items[i].v.arr.n = 3;
        items[i].v.arr.items = inner[i];
    }
    v.v.arr.elem = FERRY_VALUE_ARRAY;
    v.v.arr.n = 2;
    CHECK(ferry_writer_set_meta(w, "odd.nested", &v) == 0);
    v.v.arr.elem = FERRY_VALUE_U32;
    v.v.arr.n = 0;
    v.v.arr.items = NULL;
    CHECK(ferry_writer_set_meta(w, "odd.empty", &v) == 0);
    int64_t shape[1] = {32};
    CHECK(ferry_writer_add_tensor(w, "t\"en\\sor", FERRY_DTYPE_F32, 1, shape) == 0);
    float data[32] = {1.0f};
    CHECK(ferry_writer_begin(w, path) == 0);
    CHECK(ferry_writer_write(w, data, sizeof data) == 0);
    CHECK(ferry_writer_finish(w) == 0);
    ferry_writer_destroy(w);

    CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) != 0) {
        CHECK(0);
        fprintf(stderr, "%s", out_text);
        return;
    }
    const char *paths[] = {path};
    ferry_catalog_destroy(check_against_catalog(&doc, paths, 1));
    const ferry__json *m = jget(&doc, "metadata");
    const ferry__json *s = jget(m, "odd.string");
    /* every byte as it was, except the stray 0xff, which became U+FFFD */
    static const char want[] =
        "line1\nline2\t\"quoted\" back\\slash \x01 caf\xc3\xa9 bad\xef\xbf\xbd end";
    CHECK(s && s->str_len == sizeof want - 1 && memcmp(s->str, want, sizeof want - 1) == 0);
    CHECK_STR(jstr(jget(m, "we\"ird\\key\n")), "x");
    CHECK(jget(m, "odd.nan") && jget(m, "odd.nan")->type == FERRY__JSON_NULL);
    CHECK(jget(m, "odd.inf") && jget(m, "odd.inf")->type == FERRY__JSON_NULL);
    const ferry__json *tenth = jget(m, "odd.tenth");
    CHECK(tenth && tenth->type == FERRY__JSON_NUMBER && strtod(tenth->num, NULL) == 0.1);
    CHECK(jget(m, "odd.neg") && strncmp(jget(m, "odd.neg")->num, "-42", 3) == 0);
    CHECK_EQ_INT(jnum(jget(m, "odd.u64max")) == UINT64_MAX, 1);
    CHECK(jget(m, "odd.bool") && jget(m, "odd.bool")->type == FERRY__JSON_BOOL &&
          jget(m, "odd.bool")->b);
    const ferry__json *toks = jget(m, "odd.tokens");
    CHECK(toks && toks->type == FERRY__JSON_ARRAY && toks->n == 100); /* full in JSON */
    CHECK(toks && toks->n == 100 && strcmp(jstr(&toks->items[1]), "tok\"en") == 0);
    const ferry__json *nested = jget(m, "odd.nested");
    CHECK(nested && nested->n == 2 && nested->items[1].type == FERRY__JSON_ARRAY &&
          nested->items[1].n == 3 && strncmp(nested->items[1].items[2].num, "-5", 2) == 0);
    CHECK(jget(m, "odd.empty") && jget(m, "odd.empty")->n == 0);
    CHECK(find_tensor(&doc, "t\"en\\sor") != NULL);
    ferry__json_free(&doc);

    /* the table view abbreviates the long array and escapes what would break a line */
    CHECK_EQ_INT(run("inspect '%s'", path), 0);
    CHECK(contains(out_text, "\xE2\x80\xA6 (100 items)"));
    CHECK(contains(out_text, "line1\\nline2"));
    CHECK(!contains(out_text, "\x01"));
}

/* ---- several files, an index ------------------------------------------------------------------- */

static void test_multi(void)
{
    char a[4200], b[4200], ix[4200];
    snprintf(a, sizeof a, "%s/multi-llama.gguf", tmp);
    snprintf(b, sizeof b, "%s/multi-unet.safetensors", tmp);
    CHECK_EQ_INT(run("gen -o '%s' --layers 1 --dim 64 --ff 128 --vocab 100 -q", a), 0);
    CHECK_EQ_INT(run("gen -o '%s' --arch unet --dim 32 --layers 1 -q", b), 0);
    CHECK_EQ_INT(run("inspect --json '%s' '%s'", a, b), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) == 0) {
        CHECK_STR(jstr(jget(&doc, "format")), "mixed");
        const char *paths[] = {a, b};
        ferry_catalog_destroy(check_against_catalog(&doc, paths, 2));
        ferry__json_free(&doc);
    }
    CHECK_EQ_INT(run("inspect '%s' '%s'", a, b), 0);
    CHECK(contains(out_text, "multi-unet.safetensors"));
    /* the same model twice: its names collide */
    CHECK_EQ_INT(run("inspect '%s' '%s'", a, a), 1);
    CHECK(starts_with(err_text, "ferry: "));

    /* a sharded safetensors index naming one shard */
    snprintf(ix, sizeof ix, "%s/multi.safetensors.index.json", tmp);
    ferry_catalog *c = ferry_catalog_create();
    CHECK(ferry_catalog_add(c, b, NULL) == 0);
    FILE *f = fopen(ix, "w");
    CHECK(f != NULL);
    if (f) {
        fprintf(f, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {",
                (unsigned long long)ferry_catalog_total_bytes(c));
        for (size_t i = 0; i < ferry_catalog_count(c); i++) {
            ferry_tensor_info t;
            ferry_catalog_tensor(c, i, &t);
            fprintf(f, "%s\"%s\": \"multi-unet.safetensors\"", i ? ", " : "", t.name);
        }
        fprintf(f, "}}\n");
        fclose(f);
    }
    CHECK_EQ_INT(run("inspect --json '%s'", ix), 0);
    if (parse_json(out_text, out_len, &doc) == 0) {
        CHECK_STR(jstr(jget(&doc, "format")), "safetensors");
        CHECK_EQ_INT(jnum(jget(&doc, "n_tensors")), ferry_catalog_count(c));
        CHECK_EQ_INT(jnum(jget(&doc, "total_bytes")), ferry_catalog_total_bytes(c));
        ferry__json_free(&doc);
    }
    ferry_catalog_destroy(c);
}

/* ---- demo ------------------------------------------------------------------------------------ */

/* ---- LoRA adapters: gen --lora ----------------------------------------------------------- */

/* One scheme's names: the A and B suffixes (and kohya's alpha), the format it writes. */
typedef struct lora_scheme {
    const char *name, *a_suffix, *b_suffix, *alpha_suffix, *format;
} lora_scheme;

static const lora_scheme lora_schemes[] = {
    {"peft", ".lora_A.weight", ".lora_B.weight", NULL, "safetensors"},
    {"kohya", ".lora_down.weight", ".lora_up.weight", ".alpha", "safetensors"},
    {"gguf", ".lora_a", ".lora_b", NULL, "gguf"},
};

static int ends_with(const char *s, const char *suffix)
{
    size_t n = s ? strlen(s) : 0, k = strlen(suffix);
    return s && n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The adapter at PATH for BASE in scheme SC at RANK: inspect --json shows N_PAIRS pairs named
 * with the scheme's suffixes, every A has RANK rows and every B RANK columns (4-D conv factors:
 * down [rank, in, kh, kw], up [out, rank, 1, 1]), the library maps every pair onto BASE, and
 * `ferry run --verify` with it merged passes. */
static void check_adapter(const char *base, const char *path, const lora_scheme *sc,
                          int64_t rank, size_t n_pairs, size_t n_conv)
{
    CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) != 0) {
        CHECK(0);
        return;
    }
    CHECK_STR(jstr(jget(&doc, "format")), sc->format);
    const ferry__json *ts = jget(&doc, "tensors");
    size_t na = 0, nb = 0, nalpha = 0, conv = 0, other = 0, bad_shape = 0;
    int gguf = strcmp(sc->format, "gguf") == 0;
    for (size_t i = 0; ts && i < ts->n; i++) {
        const char *name = jstr(jget(&ts->items[i], "name"));
        const ferry__json *sh = jget(&ts->items[i], "shape");
        size_t nd = sh ? sh->n : 0;
        /* shapes outermost first (GGUF lists them innermost first) */
        int64_t d[4] = {0, 0, 0, 0};
        for (size_t k = 0; k < nd && k < 4; k++)
            d[k] = (int64_t)jnum(&sh->items[gguf ? nd - 1 - k : k]);
        if (ends_with(name, sc->a_suffix)) {
            na++;
            conv += nd == 4;
            bad_shape += !(nd == 2 || nd == 4) || d[0] != rank;
        } else if (ends_with(name, sc->b_suffix)) {
            nb++;
            bad_shape += nd == 4 ? d[1] != rank || d[2] != 1 || d[3] != 1 : nd != 2 || d[1] != rank;
        } else if (sc->alpha_suffix && ends_with(name, sc->alpha_suffix)) {
            nalpha++;
            bad_shape += nd != 0;
        } else {
            fprintf(stderr, "%s adapter: unexpected tensor %s\n", sc->name, name ? name : "?");
            other++;
        }
    }
    CHECK_EQ_INT(na, n_pairs);
    CHECK_EQ_INT(nb, n_pairs);
    CHECK_EQ_INT(nalpha, sc->alpha_suffix ? n_pairs : 0);
    CHECK_EQ_INT(conv, n_conv);
    CHECK_EQ_INT(other, 0);
    CHECK_EQ_INT(bad_shape, 0);
    const ferry__json *meta = jget(&doc, "metadata");
    char two_r[32];
    snprintf(two_r, sizeof two_r, "%lld", (long long)(2 * rank));
    if (strcmp(sc->name, "peft") == 0)
        CHECK_STR(jstr(jget(meta, "lora_alpha")), two_r);
    else if (strcmp(sc->name, "kohya") == 0)
        CHECK_STR(jstr(jget(meta, "ss_network_alpha")), two_r);
    else
        CHECK_EQ_INT(jnum(jget(meta, "adapter.lora.alpha")), 2 * rank);
    ferry__json_free(&doc);

    /* the library reads it in the scheme it was written in and maps every pair */
    ferry *f = ferry_create(NULL);
    int id = -1;
    CHECK(f && ferry_open(f, base, NULL) == 0);
    CHECK_EQ_INT(ferry_lora_add(f, path, 1.0f, NULL, &id), 0);
    ferry_lora_info info;
    memset(&info, 0, sizeof info);
    CHECK_EQ_INT(ferry_lora_get_info(f, id, &info), 0);
    CHECK_STR(info.scheme, sc->name);
    CHECK_EQ_INT(info.n_pairs, n_pairs);
    CHECK_EQ_INT(info.n_matched, n_pairs);
    CHECK_EQ_INT(info.n_unmatched, 0);
    ferry_destroy(f);

    /* streamed with the adapter merged, every tensor checks against an independent merge */
    int rc = run("run '%s' -a '%s' --verify --quiet --passes 1", base, path);
    CHECK_EQ_INT(rc, 0);
    CHECK(contains(out_text, "verify: ok"));
    if (rc != 0)
        fprintf(stderr, "run with %s adapter: %s", sc->name, err_text);
}

static void test_gen_lora(void)
{
    char base[4200], unet[4200], path[4300], again[4300];
    snprintf(base, sizeof base, "%s/lora-base.gguf", tmp);
    snprintf(unet, sizeof unet, "%s/lora-unet.safetensors", tmp);
    CHECK_EQ_INT(run("gen -o '%s' --layers 2 --dim 64 --ff 128 --vocab 100 --dtype f16 -q", base),
                 0);
    CHECK_EQ_INT(run("gen -o '%s' --arch unet --layers 1 --dim 32 -q", unet), 0);

    for (size_t k = 0; k < sizeof lora_schemes / sizeof lora_schemes[0]; k++) {
        const lora_scheme *sc = &lora_schemes[k];
        snprintf(path, sizeof path, "%s/lora-%s.%s", tmp, sc->name, sc->format);
        int rc = run("gen --lora '%s' -o '%s' --scheme %s --rank 4 --seed 5", base, path,
                     sc->name);
        CHECK_EQ_INT(rc, 0);
        if (rc != 0) {
            fprintf(stderr, "gen --lora --scheme %s: %s", sc->name, err_text);
            continue;
        }
        /* the summary names the file, the scheme and the pairs: 2 blocks x 7 matrices */
        CHECK(contains(out_text, path) && contains(out_text, sc->name) &&
              contains(out_text, "14 pairs"));
        check_adapter(base, path, sc, 4, 14, 0);

        /* the same seed gives the same bytes; another seed other values */
        snprintf(again, sizeof again, "%s/lora-again.%s", tmp, sc->format);
        CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --scheme %s --rank 4 --seed 5 -q", base, again,
                         sc->name),
                     0);
        CHECK_EQ_INT(out_len, 0);
        CHECK(same_file(path, again));
        CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --scheme %s --rank 4 --seed 6 -q", base, again,
                         sc->name),
                     0);
        CHECK(!same_file(path, again));
        unlink(again);
        unlink(path);
    }

    /* conv kernels of a UNet get 4-D factors (kohya, the usual scheme for them) */
    snprintf(path, sizeof path, "%s/lora-for-unet.safetensors", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --scheme kohya --rank 2 -q", unet, path), 0);
    check_adapter(unet, path, &lora_schemes[1], 2, 146, 46);

    /* without --scheme: gguf for a *.gguf output, peft otherwise; the default rank is 8 */
    snprintf(path, sizeof path, "%s/lora-default.gguf", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' -q", base, path), 0);
    check_adapter(base, path, &lora_schemes[2], 8, 14, 0);
    snprintf(path, sizeof path, "%s/lora-default.safetensors", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' -q", base, path), 0);
    check_adapter(base, path, &lora_schemes[0], 8, 14, 0);

    /* usage errors write nothing */
    snprintf(path, sizeof path, "%s/lora-bad.safetensors", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --scheme lycoris", base, path), 2);
    CHECK(contains(err_text, "--scheme") && contains(err_text, "lycoris"));
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --rank 0", base, path), 2);
    CHECK(contains(err_text, "--rank"));
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --rank 65537", base, path), 2);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --dtype q4_0", base, path), 2);
    CHECK(contains(err_text, "--dtype") && contains(err_text, "--lora"));
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s' --size 1GiB", base, path), 2);
    CHECK_EQ_INT(run("gen --lora '%s'", base), 2);
    CHECK(contains(err_text, "-o"));
    CHECK_EQ_INT(run("gen -o '%s' --rank 4", path), 2);
    CHECK(contains(err_text, "--lora"));
    CHECK_EQ_INT(run("gen -o '%s' --scheme kohya", path), 2);
    CHECK(access(path, F_OK) != 0);
    /* -o naming the base itself would replace the model with its adapter */
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s'", unet, unet), 2);
    CHECK(contains(err_text, "base model"));
    CHECK_EQ_INT(run("inspect '%s'", unet), 0);
    CHECK(contains(out_text, "safetensors"));
    /* a base that does not open: exit 1, the message names it */
    char missing[4300];
    snprintf(missing, sizeof missing, "%s/no-such-base.gguf", tmp);
    CHECK_EQ_INT(run("gen --lora '%s' -o '%s'", missing, path), 1);
    CHECK(contains(err_text, missing));
    CHECK(access(path, F_OK) != 0);
    CHECK_EQ_INT(run("gen --help"), 0);
    CHECK(contains(out_text, "--lora BASE") && contains(out_text, "--rank") &&
          contains(out_text, "--scheme"));
    unlink(base);
    unlink(unet);
}

/* ---- devices ------------------------------------------------------------------------------ */

static const ferry__json *find_device(const ferry__json *devs, const char *spec)
{
    for (size_t i = 0; devs && i < devs->n; i++)
        if (jstr(jget(&devs->items[i], "spec")) &&
            strcmp(jstr(jget(&devs->items[i], "spec")), spec) == 0)
            return &devs->items[i];
    return NULL;
}

static int jbool(const ferry__json *j) { return j && j->type == FERRY__JSON_BOOL && j->b; }

static void test_devices(void)
{
    /* what the library itself says of cuda:0 on this machine */
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    int cuda = f && ferry_add_device(f, "cuda:0", NULL) == 0;
    char lib_reason[1024] = "";
    if (f && !cuda)
        snprintf(lib_reason, sizeof lib_reason, "%s", ferry_errmsg(f));
    ferry_destroy(f);

    CHECK_EQ_INT(run("devices"), 0); /* with or without CUDA */
    CHECK(starts_with(out_text, "cpu "));
    CHECK(contains(out_text, "host RAM") && contains(out_text, "free of"));
    CHECK(contains(out_text, "sim:8GiB@25GB/s"));
    CHECK(contains(out_text, "cuda:0"));
    if (!cuda) {
        /* the reason, plainly: the library's message on its line */
        const char *line = strstr(out_text, "cuda:0");
        CHECK(line && contains(line, "unavailable: "));
        const char *why = line ? strstr(line, "unavailable: ") : NULL;
        if (why) {
            why += strlen("unavailable: ");
            size_t n = strcspn(why, "\n");
            CHECK(n > 5);
            char got[1024];
            snprintf(got, sizeof got, "%.*s", (int)n, why);
            CHECK(contains(lib_reason, got));
        }
        CHECK_EQ_INT(strlen(err_text), 0); /* not a failure */
    }

    CHECK_EQ_INT(run("devices --json"), 0);
    ferry__json doc;
    if (parse_json(out_text, out_len, &doc) != 0) {
        CHECK(0);
        return;
    }
    const ferry__json *devs = jget(&doc, "devices");
    CHECK(devs && devs->type == FERRY__JSON_ARRAY && devs->n >= 3);
    const ferry__json *cpu = devs && devs->n ? &devs->items[0] : NULL;
    CHECK_STR(jstr(jget(cpu, "spec")), "cpu");
    CHECK_STR(jstr(jget(cpu, "kind")), "cpu");
    CHECK(jbool(jget(cpu, "available")) && jbool(jget(cpu, "host_accessible")));
    uint64_t total = jnum(jget(cpu, "total_bytes")), avail = jnum(jget(cpu, "free_bytes"));
    CHECK(total > (64u << 20) && total != UINT64_MAX);
    CHECK(avail > 0 && avail <= total);
    /* the default host budget: what the host can give, less a margin of at most 1 GiB */
    uint64_t cpu_budget = jnum(jget(cpu, "budget"));
    CHECK(cpu_budget > 0 && cpu_budget <= total);
    CHECK(cpu_budget + (UINT64_C(1) << 30) + (UINT64_C(256) << 20) >= avail);

    const ferry__json *c0 = find_device(devs, "cuda:0");
    CHECK(c0 != NULL);
    CHECK_EQ_INT(jbool(jget(c0, "available")), cuda);
    if (cuda) {
        CHECK_STR(jstr(jget(c0, "kind")), "cuda");
        CHECK(jnum(jget(c0, "total_bytes")) > 0);
        CHECK(!jbool(jget(c0, "example")));
    } else {
        CHECK(jstr(jget(c0, "reason")) && contains(lib_reason, jstr(jget(c0, "reason"))));
        CHECK(find_device(devs, "cuda:1") == NULL); /* no second attempt after cuda:0 fails */
    }
    const ferry__json *sim = find_device(devs, "sim:8GiB@25GB/s");
    CHECK_STR(jstr(jget(sim, "kind")), "sim");
    CHECK(jbool(jget(sim, "example")) && !jbool(jget(sim, "host_accessible")));
    CHECK_EQ_INT(jnum(jget(sim, "total_bytes")), 8ull << 30);
    uint64_t budget = jnum(jget(sim, "budget"));
    CHECK(budget > 0 && budget <= 8ull << 30);
    ferry__json_free(&doc);

    /* specs from the command line: reported with their memory, or exit 1 with the reason */
    CHECK_EQ_INT(run("devices --json sim:3GiB"), 0);
    if (parse_json(out_text, out_len, &doc) == 0) {
        const ferry__json *s3 = find_device(jget(&doc, "devices"), "sim:3GiB");
        CHECK(jbool(jget(s3, "available")) && !jbool(jget(s3, "example")));
        CHECK_EQ_INT(jnum(jget(s3, "total_bytes")), 3ull << 30);
        ferry__json_free(&doc);
    } else {
        CHECK(0);
    }
    CHECK_EQ_INT(run("devices sim:1GiB tpu:0"), 1);
    CHECK(contains(out_text, "sim:1GiB") && contains(out_text, "tpu:0"));
    CHECK(starts_with(err_text, "ferry: tpu:0") && contains(err_text, "unknown device"));
    CHECK_EQ_INT(run("devices --frobnicate"), 2);
    CHECK_EQ_INT(run("devices --help"), 0);
    CHECK(contains(out_text, "--json"));
    CHECK_EQ_INT(run("--help"), 0);
    CHECK(contains(out_text, "devices"));
}

static void test_demo(void)
{
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    /* the cache folder from XDG_CACHE_HOME, created as needed */
    char env[4300];
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s'", cache);
    char cmd[12000];
    snprintf(cmd, sizeof cmd, "env %s %s demo --size 2MiB -q >'%s/demo1.txt' 2>&1", env,
             FERRY_CLI, tmp);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "env %s %s demo --size 2MiB -q >'%s/demo2.txt' 2>&1", env,
             FERRY_CLI, tmp);
    CHECK_EQ_INT(system(cmd), 0);
    char p[4300];
    snprintf(p, sizeof p, "%s/demo1.txt", tmp);
    char *first = slurp(p, NULL);
    snprintf(p, sizeof p, "%s/demo2.txt", tmp);
    char *second = slurp(p, NULL);
    CHECK(contains(first, "generated") && contains(first, "catalog"));
    CHECK(contains(second, "reused") && contains(second, "catalog"));
    snprintf(p, sizeof p, "%s/ferry", cache);
    CHECK(contains(first, p));
    free(first);
    free(second);
}

int main(void)
{
    tmp = check_tmpdir("cli");
    test_usage();
    test_round_trips();
    test_gqa();
    test_unet();
    test_determinism();
    test_sizes();
    test_failures();
    test_escaping();
    test_multi();
    test_gen_lora();
    test_devices();
    test_demo();
    free(out_text);
    free(err_text);
    int rc = check_finish();
    if (rc == 0)
        check_rmdir(tmp);
    return rc;
}
