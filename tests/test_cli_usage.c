/*
 * test_cli_usage.c — the placement options' usage errors, as a user meets them (the binary
 * FERRY_CLI through the shell): each exits 2 (1 is for failures of the work itself) with one
 * message naming the option and the value: a --device or --split spec that does not parse, an
 * adapter's multiplier that is no number (run, plan and lora merge), a --compute-dtype nothing
 * converts to (one line, not one per tensor), and every malformed --group.
 */
#include <string.h>

#include "check.h"
#include "ferry.h"

#include "cli_harness.h"

int main(void)
{
    tmp = check_tmpdir("cli_usage");
    char model[1200];
    snprintf(model, sizeof model, "%s/m.gguf", tmp);
    if (run("gen -q -o '%s' --layers 4 --dim 128 --ff 256 --vocab 300", model) != 0) {
        fprintf(stderr, "cannot generate the model: %s\n", err_text);
        return 1;
    }
    static const char *cmds[] = {"plan", "run -q --passes 1"};
    for (int c = 0; c < 2; c++) {
        const char *cmd = cmds[c];
        /* device specs that do not parse */
        expect_usage(run("%s --device bogus '%s'", cmd, model), "unknown device");
        expect_usage(run("%s --device sim:abc '%s'", cmd, model), "bad capacity 'abc'");
        expect_usage(run("%s --device sim:1GiB@fast '%s'", cmd, model), "bad bandwidth");
        expect_usage(run("%s --device cuda:x '%s'", cmd, model), "cuda:x");
        expect_usage(run("%s --split sim:64MiB,nope '%s'", cmd, model), "unknown device");
        expect_usage(run("%s --split sim:64MiB,sim:64MiB:zero '%s'", cmd, model), "bad weight");
        /* an adapter's multiplier: named as such, not as a file that cannot be opened */
        expect_usage(run("%s -a '%s:abc' '%s'", cmd, model, model), "bad multiplier 'abc'");
        CHECK(strstr(err_text, "cannot open") == NULL);
        expect_usage(run("%s --adapter='%s:1.5x' '%s'", cmd, model, model),
                     "bad multiplier '1.5x'");
        /* a type ferry cannot convert to: one message, before any tensor is looked at */
        expect_usage(run("%s --compute-dtype q4_k '%s'", cmd, model),
                     "cannot convert weights to q4_k");
        expect_usage(run("%s --compute-dtype nonesuch '%s'", cmd, model),
                     "unknown type 'nonesuch'");
        /* malformed groups */
        expect_usage(run("%s --group embd '%s'", cmd, model), "expected NAME=GLOB");
        expect_usage(run("%s --group =x '%s'", cmd, model), "expected NAME=GLOB");
        expect_usage(run("%s --group e=token*:colour=red '%s'", cmd, model),
                     "unknown key 'colour'");
        expect_usage(run("%s --group e=token*:home=attic '%s'", cmd, model), "'attic' is not disk");
        expect_usage(run("%s --group e=token*:lazy '%s'", cmd, model), "'lazy' is not KEY=VALUE");
        expect_usage(run("%s --group e=token*:device=7 '%s'", cmd, model), "device=7");
        expect_usage(run("%s --group e=token*:device=-1 '%s'", cmd, model), "not a device id");
        expect_usage(run("%s --group e=a* --group e=b* '%s'", cmd, model), "given twice");
        expect_usage(run("%s --group all=a* '%s'", cmd, model), "is taken");
        expect_usage(run("%s --group", cmd), "--group needs a value");
    }
    /* lora merge reads -a the same way */
    expect_usage(run("lora merge '%s' -a '%s:abc' -o '%s/o.gguf'", model, model, tmp),
          "bad multiplier 'abc'");
    expect_usage(run("lora merge '%s' -a ':2' -o '%s/o.gguf'", model, tmp), "no path");
    /* bench checks its device before measuring anything */
    expect_usage(run("bench --quick --device sim:abc '%s'", model), "bad capacity 'abc'");
    expect_usage(run("bench --quick --group e '%s'", model), "expected NAME=GLOB");
    /* a device that parses but is not there is a failure, not a usage error */
    int rc = run("plan --device cuda:99 '%s'", model);
    CHECK_EQ_INT(rc, 1);
    /* a well-formed multiplier still works: no adapter tensors match, so it fails on the file,
     * not the number */
    rc = run("plan -a '%s:0.5' '%s'", model, model);
    CHECK(strstr(err_text, "multiplier") == NULL);
    free(out_text);
    free(err_text);
    check_rmdir(tmp);
    return check_finish();
}
