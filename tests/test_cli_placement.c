/*
 * test_cli_placement.c — placing groups of tensors from the command line, as a user runs it (the
 * binary FERRY_CLI through the shell): repeated --group NAME=GLOB:KEY=VALUE,... in `plan`, `run`
 * and `bench` gives a mixed placement (lazy embedding, streamed blocks, kept head) that
 * `ferry plan --json` shows tensor by tensor, that `run --verify` streams correctly, and that
 * changes what bench's streamed passes read; and `plan` meets the budgets as the real load does:
 * a plan that cannot load exits 1 naming the shortfall, with the same message as `run`.
 */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "ferry.h"
#include "formats/formats.h"

#include "cli_json.h"

static const char *jstr(const ferry__json *o, const char *key)
{
    const ferry__json *v = jget(o, key);
    return v && v->type == FERRY__JSON_STRING ? v->str : NULL;
}

/* 1 true, 0 false, -1 absent or not a boolean. */
static int jbool(const ferry__json *o, const char *key)
{
    const ferry__json *v = jget(o, key);
    return v && v->type == FERRY__JSON_BOOL ? v->b : -1;
}

static uint64_t ju64(const ferry__json *o, const char *key)
{
    uint64_t v = UINT64_MAX;
    const ferry__json *j = jget(o, key);
    if (!j || ferry__json_u64(j, &v))
        return UINT64_MAX;
    return v;
}

/* The first line of the last command's stderr, into BUF. */
static const char *first_err_line(char *buf, size_t n)
{
    snprintf(buf, n, "%s", err_text);
    char *nl = strchr(buf, '\n');
    if (nl)
        *nl = 0;
    return buf;
}

/* The mixed placement: the embedding lazy, the blocks streamed from the disk, the head kept. */
#define MIXED                                                                                     \
    "--home disk --group 'embd=token_embd.*:lazy=on' --group 'head=output*:home=host,load=read'"

static void test_plan_json(const char *model)
{
    CHECK_EQ_INT(run("plan --json " MIXED " '%s'", model), 0);
    ferry__json doc;
    if (parse_stdout(&doc)) {
        CHECK(0);
        return;
    }
    const ferry__json *ts = jget(&doc, "tensors");
    CHECK(ts && ts->type == FERRY__JSON_ARRAY && ts->n > 10);
    int seen_embd = 0, seen_head = 0, seen_blk = 0, wrong = 0;
    for (size_t i = 0; ts && i < ts->n; i++) {
        const ferry__json *t = &ts->items[i];
        const char *name = jstr(t, "name"), *group = jstr(t, "group"), *home = jstr(t, "home");
        if (!name || !group || !home) {
            wrong++;
            continue;
        }
        int lazy = jbool(t, "lazy");
        if (!strncmp(name, "token_embd.", 11)) {
            seen_embd++;
            wrong += strcmp(group, "embd") != 0 || lazy != 1;
        } else if (!strncmp(name, "output", 6)) {
            seen_head++;
            /* kept: a private host copy (load read), not lazy */
            wrong += strcmp(group, "head") != 0 || strcmp(home, "host") != 0 || lazy != 0 ||
                     jbool(t, "zero_copy") != 0 || ju64(t, "home_bytes") == 0;
        } else if (!strncmp(name, "blk.", 4)) {
            seen_blk++;
            wrong += strcmp(group, "all") != 0 || strcmp(home, "disk") != 0 || lazy != 0;
        }
        if (wrong)
            fprintf(stderr, "plan --json: tensor %s: group %s, home %s, lazy %d\n", name, group,
                    home, lazy);
    }
    CHECK_EQ_INT(seen_embd, 1);
    CHECK_EQ_INT(seen_head, 2);
    CHECK(seen_blk >= 4 * 9);
    CHECK_EQ_INT(wrong, 0);
    ferry__json_free(&doc);

    /* the plain options alone apply to every tensor: --lazy on makes the blocks lazy too; a
     * --group for the blocks keeps them streamed while the rest stays lazy */
    CHECK_EQ_INT(run("plan --json --home disk --lazy on --group blk=blk.*:lazy=off '%s'", model),
                 0);
    if (parse_stdout(&doc) == 0) {
        ts = jget(&doc, "tensors");
        int bad = 0, n = 0;
        for (size_t i = 0; ts && i < ts->n; i++) {
            const ferry__json *t = &ts->items[i];
            const char *name = jstr(t, "name");
            int blk = name && !strncmp(name, "blk.", 4);
            bad += jbool(t, "lazy") != (blk ? 0 : 1);
            bad += !name || strcmp(jstr(t, "group") ? jstr(t, "group") : "", blk ? "blk" : "all");
            n++;
        }
        CHECK(n > 10);
        CHECK_EQ_INT(bad, 0);
        ferry__json_free(&doc);
    } else {
        CHECK(0);
    }

    /* the table names the groups */
    CHECK_EQ_INT(run("plan " MIXED " '%s'", model), 0);
    CHECK(strstr(out_text, "embd (1 tensors)") != NULL);
    CHECK(strstr(out_text, "head (2 tensors)") != NULL);
}

static void test_run_mixed(const char *model)
{
    /* streamed under a small host budget, every prepared tensor checked against the file */
    CHECK_EQ_INT(run("run -q --verify --passes 2 --budget host=4MiB " MIXED " '%s'", model), 0);
    CHECK(strstr(out_text, "verify: ok") != NULL);
    if (!strstr(out_text, "verify: ok"))
        fprintf(stderr, "run: %s\n%s\n", out_text, err_text);
    /* and on a simulated device, the head computed there from a kept host copy */
    CHECK_EQ_INT(run("run -q --verify --passes 2 --device sim:64MiB --budget device=8MiB " MIXED
                     " '%s'", model), 0);
    CHECK(strstr(out_text, "verify: ok") != NULL);
    /* a group naming the device by id: the head on the cpu while the rest goes to the sim */
    CHECK_EQ_INT(run("plan --json --device sim:64MiB --home host "
                     "--group head=output*:device=0 '%s'", model), 0);
    ferry__json doc;
    if (parse_stdout(&doc) == 0) {
        const ferry__json *ts = jget(&doc, "tensors");
        int bad = 0;
        for (size_t i = 0; ts && i < ts->n; i++) {
            const ferry__json *t = &ts->items[i];
            const char *name = jstr(t, "name");
            uint64_t dev = ju64(t, "compute_device");
            bad += dev != (name && !strncmp(name, "output", 6) ? 0u : 1u);
        }
        CHECK(ts && ts->n > 10);
        CHECK_EQ_INT(bad, 0);
        ferry__json_free(&doc);
    } else {
        CHECK(0);
    }
}

/* Bytes read by the streamed passes 2..N of bench's first stream (M/4), or UINT64_MAX. */
static uint64_t bench_later_bytes(void)
{
    ferry__json doc;
    if (parse_stdout(&doc))
        return UINT64_MAX;
    const ferry__json *st = jget(&doc, "stream");
    uint64_t sum = UINT64_MAX;
    if (st && st->type == FERRY__JSON_ARRAY && st->n > 0) {
        const ferry__json *pb = jget(&st->items[0], "pass_bytes_read");
        if (pb && pb->type == FERRY__JSON_ARRAY && pb->n >= 3) {
            sum = 0;
            for (size_t p = 1; p < pb->n; p++) {
                uint64_t v;
                if (ferry__json_u64(&pb->items[p], &v))
                    sum = UINT64_MAX;
                else if (sum != UINT64_MAX)
                    sum += v;
            }
        }
    }
    ferry__json_free(&doc);
    return sum;
}

static void test_bench_groups(const char *model)
{
    /* by default the streamed passes read from the disk after the first ... */
    CHECK_EQ_INT(run("bench --quick --json -q '%s'", model), 0);
    uint64_t plain = bench_later_bytes();
    CHECK(plain != UINT64_MAX && plain > 0);
    /* ... and with every tensor kept at home on the host (zero-copy), they read nothing */
    CHECK_EQ_INT(run("bench --quick --json -q --group keep=*:home=host '%s'", model), 0);
    uint64_t kept = bench_later_bytes();
    CHECK_EQ_INT(kept, 0);
    /* the mixed placement runs too, and streams: its two later passes (--quick runs three) read
     * something, and no more than the whole file each; how much less moves with the timing of
     * the prefetches by more than the head kept at home weighs, so it is not compared with the
     * plain run */
    CHECK_EQ_INT(run("bench --quick --json -q --group embd=token_embd.*:lazy=on "
                     "--group head=output*:home=host '%s'", model), 0);
    uint64_t mixed = bench_later_bytes();
    struct stat st;
    CHECK_EQ_INT(stat(model, &st), 0);
    CHECK(mixed != UINT64_MAX && mixed > 0 && mixed <= 2 * (uint64_t)st.st_size);
}

static void test_plan_budget(const char *big)
{
    char plan_err[512], run_err[512];
    /* home device: every weight kept on the device, 64.5 MiB against a 16 MiB budget */
    CHECK_EQ_INT(run("plan --device sim:1GiB --home device --budget device=16MiB '%s'", big), 1);
    first_err_line(plan_err, sizeof plan_err);
    CHECK(strstr(plan_err, "budget 16.00 MiB") != NULL);
    CHECK(strstr(plan_err, "short") != NULL);
    CHECK(strstr(out_text, "kept") != NULL); /* the plan is still shown */
    CHECK_EQ_INT(run("run -q --passes 1 --device sim:1GiB --home device --budget device=16MiB "
                     "'%s'", big), 1);
    first_err_line(run_err, sizeof run_err);
    CHECK_STR(plan_err, run_err);
    CHECK_EQ_INT(run("plan --json --device sim:1GiB --home device --budget device=16MiB '%s'",
                     big), 1);
    /* host copies under a host budget */
    CHECK_EQ_INT(run("plan --home host --load read --budget host=16MiB '%s'", big), 1);
    first_err_line(plan_err, sizeof plan_err);
    CHECK(strstr(plan_err, "cpu: budget 16.00 MiB") != NULL);
    CHECK_EQ_INT(run("run -q --passes 1 --home host --load read --budget host=16MiB '%s'", big),
                 1);
    first_err_line(run_err, sizeof run_err);
    CHECK_STR(plan_err, run_err);
    /* one staged copy larger than the budget: the embedding (12 MiB) against 8 MiB */
    CHECK_EQ_INT(run("plan --home disk --budget host=8MiB '%s'", big), 1);
    first_err_line(plan_err, sizeof plan_err);
    CHECK(strstr(plan_err, "token_embd.weight") != NULL);
    CHECK_EQ_INT(run("run -q --passes 1 --home disk --budget host=8MiB '%s'", big), 1);
    first_err_line(run_err, sizeof run_err);
    CHECK_STR(plan_err, run_err);
    /* budgets that hold it: both succeed */
    CHECK_EQ_INT(run("plan --device sim:1GiB --home device --budget device=80MiB '%s'", big), 0);
    CHECK_EQ_INT(run("run -q --passes 1 --device sim:1GiB --home device --budget device=80MiB "
                     "'%s'", big), 0);
    /* a group keeps what the rest does not: the head (12 MiB) kept on the device beside the
     * largest streamed copy (the embedding, 12 MiB) fits 32 MiB; the blocks (40.5 MiB) do not */
    CHECK_EQ_INT(run("plan --device sim:1GiB --home disk --budget device=32MiB "
                     "--group head=output.weight:home=device '%s'", big), 0);
    CHECK_EQ_INT(run("plan --device sim:1GiB --home disk --budget device=16MiB "
                     "--group head=output.weight:home=device '%s'", big), 1);
    CHECK(strstr(err_text, "12.00 MiB kept") != NULL);
    CHECK_EQ_INT(run("plan --device sim:1GiB --home disk --budget device=32MiB "
                     "--group keep=blk.*:home=device '%s'", big), 1);
}

int main(void)
{
    tmp = check_tmpdir("cli_placement");
    char model[1200], big[1200];
    snprintf(model, sizeof model, "%s/m.gguf", tmp);
    snprintf(big, sizeof big, "%s/big.gguf", tmp);
    if (run("gen -q -o '%s' --layers 4 --dim 256 --ff 512 --vocab 512", model) != 0 ||
        run("gen -q -o '%s' --layers 3 --dim 768 --ff 2048 --vocab 8192", big) != 0) {
        fprintf(stderr, "cannot generate models: %s\n", err_text);
        return 1;
    }
    test_plan_json(model);
    test_run_mixed(model);
    test_bench_groups(model);
    test_plan_budget(big);
    free(out_text);
    free(err_text);
    check_rmdir(tmp);
    return check_finish();
}
