/*
 * test_cli_bench_moe.c — `ferry bench --moe`, run as a user runs it (the binary FERRY_CLI through
 * the shell): on a synthetic trace the JSON report has every key, each cache holds 1/8, 1/4, 1/2
 * of the experts (and --cache N), the figures follow from their definitions (bytes read = misses
 * x expert size, bytes per token = bytes read / tokens, no policy above Belady); a trace file in
 * the documented format gives the counts it must; expert sizes come from a model's tensors with
 * --model; the table names every policy; bad traces and options are errors that say where.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "ferry.h"
#include "formats/formats.h"

#include "cli_json.h"
#include "model_fixture.h"

static double jnum(const ferry__json *j)
{
    if (!j || j->type != FERRY__JSON_NUMBER || j->num_len >= 64)
        return NAN;
    char buf[64];
    memcpy(buf, j->num, j->num_len);
    buf[j->num_len] = 0;
    return strtod(buf, NULL);
}

static const char *cols[] = {"ferry", "lru", "lfu", "lrfu", "lfu-floor", "belady"};

/* Checks one report: N_CACHES caches of the given expert counts, each column consistent with
 * EXPERT_BYTES (0: not checked) and TOKENS; the online bound one more column with BOUND (a
 * synthetic trace), else null. */
static void check_report(const ferry__json *doc, uint64_t tokens, uint64_t uses,
                         const uint64_t *slots, size_t n_caches, uint64_t expert_bytes, int bound)
{
    CHECK_EQ_INT(jnum(jget(doc, "tokens")), tokens);
    const ferry__json *cs = jget(doc, "caches");
    CHECK(cs && cs->type == FERRY__JSON_ARRAY && cs->n == n_caches);
    if (!cs || cs->type != FERRY__JSON_ARRAY || cs->n != n_caches)
        return;
    for (size_t i = 0; i < n_caches; i++) {
        const ferry__json *c = &cs->items[i];
        CHECK_EQ_INT(jnum(jget(c, "experts")), slots[i]);
        if (expert_bytes)
            CHECK_EQ_INT(jnum(jget(c, "bytes")), slots[i] * expert_bytes);
        double best_hits = jnum(jget(jget(c, "belady"), "hits"));
        const ferry__json *b = jget(c, "bound");
        CHECK(b && b->type == (bound ? FERRY__JSON_OBJECT : FERRY__JSON_NULL));
        for (size_t k = 0; k < sizeof cols / sizeof cols[0] + (size_t)bound; k++) {
            const ferry__json *r = k < sizeof cols / sizeof cols[0] ? jget(c, cols[k]) : b;
            CHECK(r && r->type == FERRY__JSON_OBJECT);
            double u = jnum(jget(r, "uses")), h = jnum(jget(r, "hits")),
                   b = jnum(jget(r, "bytes_read")), hr = jnum(jget(r, "hit_rate")),
                   bpt = jnum(jget(r, "bytes_per_token"));
            CHECK_EQ_INT(u, uses);
            CHECK(h >= 0 && h <= u && h <= best_hits);
            if (expert_bytes)
                CHECK_EQ_INT(b, (u - h) * expert_bytes);
            CHECK(fabs(hr - h / u) < 1e-9);
            CHECK(fabs(bpt - b / (double)tokens) < 1e-6 * (bpt + 1));
        }
    }
}

static void test_synthetic(void)
{
    int rc = run("bench --moe --layers 4 --experts 16 --experts-used 2 --tokens 300 --zipf 1.1 "
                 "--locality 0.7 --expert-bytes 4KiB --cache 5 --json");
    CHECK_EQ_INT(rc, 0);
    ferry__json doc;
    if (rc || parse_stdout(&doc)) {
        fprintf(stderr, "%s", err_text);
        return;
    }
    CHECK(jget(&doc, "trace") && jget(&doc, "trace")->type == FERRY__JSON_NULL);
    CHECK_EQ_INT(jnum(jget(&doc, "layers")), 4);
    CHECK_EQ_INT(jnum(jget(&doc, "experts")), 16);
    CHECK_EQ_INT(jnum(jget(&doc, "experts_used")), 2);
    CHECK_EQ_INT(jnum(jget(&doc, "expert_bytes_total")), 64 * 4096);
    const ferry__json *exact = jget(&doc, "belady_exact");
    CHECK(exact && exact->type == FERRY__JSON_BOOL && exact->b);
    uint64_t slots[4] = {8, 16, 32, 5};
    check_report(&doc, 300, 300 * 4 * 2, slots, 4, 4096, 1);
    /* more room, more hits: Belady's hit rate grows with the cache */
    const ferry__json *cs = jget(&doc, "caches");
    if (cs && cs->n == 4)
        CHECK(jnum(jget(jget(&cs->items[0], "belady"), "hits")) <
              jnum(jget(jget(&cs->items[2], "belady"), "hits")));
    ferry__json_free(&doc);

    /* the same seed, the same trace: the same figures */
    char *first = strdup(out_text);
    run("bench --moe --layers 4 --experts 16 --experts-used 2 --tokens 300 --zipf 1.1 "
        "--locality 0.7 --expert-bytes 4KiB --cache 5 --json");
    CHECK_STR(out_text, first);
    free(first);

    rc = run("bench --moe --layers 4 --experts 16 --tokens 200");
    CHECK_EQ_INT(rc, 0);
    for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++)
        CHECK(strstr(out_text, cols[k]) != NULL);
    CHECK(strstr(out_text, "bound") != NULL);
    CHECK(strstr(out_text, "hit rate") && strstr(out_text, "bytes/token"));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A trace of 2 layers x 4 experts that a cache of 2 experts serves exactly so: each token uses
 * expert 0 of layer 0 and expert 1 of layer 1 (6 uses in all; 2 reads, then hits), except the
 * third, which adds expert 3 of layer 1. */
static void test_trace_file(void)
{
    char path[2048], model[2048];
    snprintf(path, sizeof path, "%s/routing.txt", tmp);
    write_file(path, "# ferry routing trace\n"
                     "L0:0 L1:1\n"
                     "\n"
                     "L1:1 L0:0\n"
                     "L0:0\tL1:1,3\n"
                     "L0:0 L1:1\n");
    int rc = run("bench --moe --trace '%s' --experts 4 --cache 2 --expert-bytes 100 --json", path);
    CHECK_EQ_INT(rc, 0);
    ferry__json doc;
    if (rc || parse_stdout(&doc)) {
        fprintf(stderr, "%s", err_text);
        return;
    }
    CHECK_EQ_INT(jnum(jget(&doc, "layers")), 2);
    CHECK_EQ_INT(jnum(jget(&doc, "experts_used")), 2);
    uint64_t slots[3] = {2, 4, 2}; /* 1/8 of 8 holds less than one step of 2: left out */
    check_report(&doc, 4, 9, slots, 3, 100, 0);
    const ferry__json *cs = jget(&doc, "caches");
    if (cs && cs->n >= 1) {
        /* Belady in 2 slots: reads 0 and 1 (token 1), 3 over 0 (token 3, 1 in use), 0 again
         * over 3 (used never again): 4 reads of 9 uses */
        CHECK_EQ_INT(jnum(jget(jget(&cs->items[0], "belady"), "hits")), 5);
    }
    ferry__json_free(&doc);

    /* experts sized by a model's tensors: packed "_exps" tensors split over the experts */
    snprintf(model, sizeof model, "%s/moe.gguf", tmp);
    fixture_tensor ts[3] = {
        {"blk.0.ffn_up_exps.weight", FERRY_DTYPE_F32, 3, {8, 16, 4}},
        {"blk.1.ffn_up_exps.weight", FERRY_DTYPE_F32, 3, {8, 16, 4}},
        {"blk.0.attn_q.weight", FERRY_DTYPE_F32, 2, {8, 8}},
    };
    CHECK_EQ_INT(fixture_write(model, FERRY_FORMAT_GGUF, ts, 3), 0);
    rc = run("bench --moe --trace '%s' --model '%s' --cache 3 --json", path, model);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0 && parse_stdout(&doc) == 0) {
        CHECK_EQ_INT(jnum(jget(&doc, "experts")), 4); /* the largest id + 1 */
        CHECK_EQ_INT(jnum(jget(&doc, "expert_bytes_total")), 2 * 8 * 16 * 4 * 4);
        uint64_t s2[3] = {2, 4, 3};
        check_report(&doc, 4, 9, s2, 3, 8 * 16 * 4, 0);
        ferry__json_free(&doc);
    } else {
        fprintf(stderr, "%s", err_text);
    }
}

static void test_errors(void)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/bad.txt", tmp);
    write_file(path, "L0:1,2\nL0:1,x\n");
    expect_usage(run("bench --moe --trace '%s'", path), "bad.txt:2");
    write_file(path, "L0:1 L0:2\n");
    expect_usage(run("bench --moe --trace '%s'", path), "layer 0 appears twice");
    write_file(path, "L0:1,9\n");
    expect_usage(run("bench --moe --trace '%s' --experts 4", path), "expert 9");
    write_file(path, "L4000:60000\n");
    expect_usage(run("bench --moe --trace '%s'", path), "experts to simulate");
    write_file(path, "L0:1,\n");
    expect_usage(run("bench --moe --trace '%s'", path), "bad.txt:1");
    write_file(path, "L99999:1\n");
    expect_usage(run("bench --moe --trace '%s'", path), "layer number too large");
    write_file(path, "# nothing\n");
    expect_usage(run("bench --moe --trace '%s'", path), "no routing");
    CHECK_EQ_INT(run("bench --moe --trace '%s/missing.txt'", tmp), 1);
    CHECK(strstr(err_text, "missing.txt") != NULL);
    expect_usage(run("bench --moe --locality 2"), "--locality");
    expect_usage(run("bench --moe --zipf nan"), "--zipf");
    expect_usage(run("bench --moe --experts 4 --experts-used 5"), "--experts-used");
    expect_usage(run("bench --moe --trace '%s' --layers 3", path), "exclude");
    expect_usage(run("bench --moe --experts 8 --layers 2 --experts-used 4 --cache 1"), "--cache");
    expect_usage(run("bench --moe model.gguf"), "no model file");
    CHECK_EQ_INT(run("bench --moe --help"), 0);
    CHECK(strstr(out_text, "L<layer>:<e>") != NULL);
    CHECK_EQ_INT(run("bench --help"), 0);
    CHECK(strstr(out_text, "--moe") != NULL);
}

int main(void)
{
    tmp = check_tmpdir("cli_bench_moe");
    test_synthetic();
    test_trace_file();
    test_errors();
    free(out_text);
    free(err_text);
    if (!check_failed)
        check_rmdir(tmp);
    return check_finish();
}
