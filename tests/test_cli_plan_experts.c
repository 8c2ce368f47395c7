/*
 * test_cli_plan_experts.c — `ferry plan` with a group whose outermost dimension counts experts
 * (--group NAME=GLOB:experts=on): one unit per expert in the table and in --json, the budget
 * check sized for one expert, a bad value refused.
 */
#include "cli_harness.h"
#include "cli_json.h"
#include "slice_fixture.h"

static void test_plan_lists_experts(const char *model)
{
    CHECK_EQ_INT(run("plan --tensors --home host --group 'exps=*_exps.*:experts=on,home=disk' "
                     "'%s'", model), 0);
    CHECK(strstr(out_text, "blk.0.ffn_up_exps.q4_K[0:1]") != NULL);
    CHECK(strstr(out_text, "blk.1.ffn_down_exps.big[7:8]") != NULL);
    CHECK(strstr(out_text, "blk.1.ffn_down_exps.big ") == NULL); /* not the whole tensor */
    CHECK(strstr(out_text, "tok.weight ") != NULL);
    /* the group table counts tensors and their units */
    CHECK_EQ_INT(run("plan --group 'exps=*_exps.*:experts=on,home=disk' '%s'", model), 0);
    CHECK(strstr(out_text, "exps (5 tensors, 40 units)") != NULL);

    CHECK_EQ_INT(run("plan --json --group 'exps=*_exps.*:experts=on,home=disk' '%s'", model), 0);
    ferry__json doc;
    if (parse_stdout(&doc)) {
        CHECK(0);
        return;
    }
    const ferry__json *ts = jget(&doc, "tensors");
    size_t experts = 0, others = 0;
    for (size_t i = 0; ts && i < ts->n; i++) {
        const ferry__json *name = jget(&ts->items[i], "name");
        const ferry__json *group = jget(&ts->items[i], "group");
        if (!name || !group || name->type != FERRY__JSON_STRING)
            continue;
        if (strchr(name->str, '['))
            experts += !strcmp(group->str, "exps");
        else
            others++;
    }
    CHECK_EQ_INT(experts, SLICE_N_GGUF_EXPERT_TS * SLICE_EXPERTS);
    CHECK_EQ_INT(others, sizeof slice_gguf_ts / sizeof slice_gguf_ts[0] - SLICE_N_GGUF_EXPERT_TS);
    ferry__json_free(&doc);

    expect_usage(run("plan --group 'exps=*_exps.*:experts=maybe' '%s'", model), "experts");
}

int main(void)
{
    tmp = check_tmpdir("cli_plan_experts");
    char model[1200];
    snprintf(model, sizeof model, "%s/exps.gguf", tmp);
    if (fixture_write(model, FERRY_FORMAT_GGUF, slice_gguf_ts,
                    sizeof slice_gguf_ts / sizeof slice_gguf_ts[0]))
        return 2;
    test_plan_lists_experts(model);
    free(out_text);
    free(err_text);
    check_rmdir(tmp);
    return check_finish();
}
