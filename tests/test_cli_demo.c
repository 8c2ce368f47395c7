/*
 * test_cli_demo.c — what `ferry demo` tells a user, on a small model (--size 2MiB): the stream's
 * block count is the model's own (llama.block_count, read back with `ferry inspect --json`), not
 * the number of layer sets; M - B + W and the prefetch misses are said what they are; and each
 * command it suggests under "next" runs.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"

#include "cli_harness.h"

/* The integer after "\"KEY\": " in the last stdout, or -1. */
static long json_int(const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(out_text, pat);
    return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

int main(void)
{
    tmp = check_tmpdir("cli_demo");
    char cache[1200];
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    setenv("XDG_CACHE_HOME", cache, 1);
    if (chdir(tmp) != 0) /* --trace trace.json writes here */
        return 1;
    CHECK_EQ_INT(run("demo --size 2MiB -q"), 0);
    char *demo = strdup(out_text);
    /* the model it generated: the path on the "model" line */
    char model[1400] = "";
    const char *m = strstr(demo, "model     ");
    if (m)
        sscanf(m + 10, "%1399s", model);
    CHECK(model[0] != 0);
    CHECK_EQ_INT(run("inspect --json '%s'", model), 0);
    long blocks = json_int("llama.block_count");
    CHECK(blocks > 0);
    char want[128];
    snprintf(want, sizeof want, "%ld blocks and 3 other layers (embedding, head)", blocks);
    CHECK(strstr(demo, want) != NULL);
    if (!strstr(demo, want))
        fprintf(stderr, "demo lacks '%s':\n%s\n", want, demo);
    CHECK(strstr(demo, "M the model, B the budget") != NULL);
    CHECK(strstr(demo, "W the two largest consecutive layers") != NULL);
    CHECK(strstr(demo, "(a miss: a prepare that found its tensor neither ready nor being read") !=
          NULL);
    /* every "next" suggestion runs as printed (bench needs O_DIRECT: run with --quick) */
    const char *next = strstr(demo, "\nnext\n");
    CHECK(next != NULL);
    int n_cmds = 0;
    for (const char *line = next ? next + 6 : NULL; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char cmd[2000];
        snprintf(cmd, sizeof cmd, "%.*s", (int)len, line);
        line = end ? end + 1 : NULL;
        if (strncmp(cmd, "  ferry ", 8) != 0)
            continue;
        /* the command is up to the first run of three spaces (then its explanation) */
        char *gap = strstr(cmd + 8, "   ");
        if (gap)
            *gap = 0;
        char args[2100];
        snprintf(args, sizeof args, "%s%s", cmd + 8,
                 strncmp(cmd + 8, "bench", 5) == 0 ? " --quick -q" : " -q");
        if (strncmp(cmd + 8, "plan", 4) == 0)
            snprintf(args, sizeof args, "%s", cmd + 8);
        int rc = run("%s", args);
        CHECK_EQ_INT(rc, 0);
        if (rc)
            fprintf(stderr, "'ferry %s' exited %d:\n%s\n", args, rc, err_text);
        n_cmds++;
    }
    CHECK_EQ_INT(n_cmds, 4);
    free(demo);
    free(out_text);
    free(err_text);
    check_rmdir(tmp);
    return check_finish();
}
