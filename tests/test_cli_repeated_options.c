/*
 * test_cli_repeated_options.c — the repeatable placement options of plan and run, as a user
 * types them (the binary FERRY_CLI through the shell): -a PATH, -aPATH, --adapter PATH and
 * --adapter=PATH name the same adapter; --group VALUE and --group=VALUE the same group; an option
 * with no value, a ninth adapter and a seventeenth group are usage errors (exit 2) naming the
 * option or the limit; 16 groups are accepted; and what follows "--" is a file name, never an
 * option.
 */
#include <string.h>

#include "check.h"
#include "ferry.h"

#include "cli_harness.h"

int main(void)
{
    tmp = check_tmpdir("cli_repeated_options");
    char model[1200], many[8192];
    snprintf(model, sizeof model, "%s/m.gguf", tmp);
    if (run("gen -q -o '%s' --layers 2 --dim 64 --ff 128 --vocab 100", model) != 0) {
        fprintf(stderr, "cannot generate the model: %s\n", err_text);
        return 1;
    }
    static const char *cmds[] = {"plan", "run -q --passes 1"};
    for (int c = 0; c < 2; c++) {
        const char *cmd = cmds[c];
        /* every spelling of an adapter reaches its parser (a multiplier that is no number) */
        expect_usage(run("%s -a '%s:abc' '%s'", cmd, model, model), "bad multiplier 'abc'");
        expect_usage(run("%s '-a%s:abc' '%s'", cmd, model, model), "bad multiplier 'abc'");
        expect_usage(run("%s --adapter '%s:abc' '%s'", cmd, model, model), "bad multiplier 'abc'");
        expect_usage(run("%s '--adapter=%s:abc' '%s'", cmd, model, model), "bad multiplier 'abc'");
        expect_usage(run("%s '%s' -a", cmd, model), "-a needs a value");
        expect_usage(run("%s '%s' --adapter", cmd, model), "--adapter needs a value");
        /* both spellings of a group reach its parser */
        expect_usage(run("%s --group 'e=token*:colour=red' '%s'", cmd, model),
                     "unknown key 'colour'");
        expect_usage(run("%s '--group=e=token*:colour=red' '%s'", cmd, model),
                     "unknown key 'colour'");
        expect_usage(run("%s '%s' --group", cmd, model), "--group needs a value");
        /* the limits: 8 adapters, 16 groups */
        int len = snprintf(many, sizeof many, "%s", cmd);
        for (int i = 0; i < 9; i++)
            len += snprintf(many + len, sizeof many - (size_t)len, " -a '%s'", model);
        expect_usage(run("%s '%s'", many, model), "at most 8 adapters");
        len = snprintf(many, sizeof many, "%s", cmd);
        for (int i = 0; i < 16; i++)
            len += snprintf(many + len, sizeof many - (size_t)len, " --group 'g%d=blk.%d.*'", i, i);
        CHECK_EQ_INT(run("%s '%s'", many, model), 0);
        snprintf(many + len, sizeof many - (size_t)len, " --group 'g16=output*'");
        expect_usage(run("%s '%s'", many, model), "at most 16 --group options");
        /* after "--" an argument that looks like an option is a file that is not there */
        CHECK_EQ_INT(run("%s '%s' -- '-a%s:abc'", cmd, model, model), 1);
        CHECK(strstr(err_text, "bad multiplier") == NULL);
        CHECK(strstr(err_text, "cannot open") != NULL);
    }
    free(out_text);
    free(err_text);
    check_rmdir(tmp);
    return check_finish();
}
