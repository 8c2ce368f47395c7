/*
 * test_cli_run.c — `ferry run --verify` over every home x load mode x device on GGUF and
 * safetensors models, with budgets and conversion; `ferry plan`'s totals against run's peaks;
 * usage errors.
 */
#include <sys/wait.h>

#include "check.h"

static char g_dir[1024];

static int sh(const char *cmd, char *out, size_t outlen)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = 0;
    if (out) {
        n = fread(out, 1, outlen - 1, p);
        out[n] = 0;
    } else {
        char buf[4096];
        while (fread(buf, 1, sizeof buf, p) > 0) {
        }
    }
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void run_ok(const char *model, const char *args)
{
    char cmd[4096], out[8192];
    snprintf(cmd, sizeof cmd, "%s run '%s' --verify --json --passes 2 --quiet %s 2>&1", FERRY_CLI,
             model, args);
    int rc = sh(cmd, out, sizeof out);
    int ok = rc == 0 && strstr(out, "\"verify\": \"ok\"") != NULL;
    if (!ok)
        fprintf(stderr, "FAILED (%d): %s\n%s\n", rc, cmd, out);
    CHECK(ok);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", check_tmpdir("cli_run"));
    char gguf[1200], st[1200], q4[1200], cmd[4096];
    snprintf(gguf, sizeof gguf, "%s/m.gguf", g_dir);
    snprintf(st, sizeof st, "%s/m.safetensors", g_dir);
    snprintf(q4, sizeof q4, "%s/q4.gguf", g_dir);
    snprintf(cmd, sizeof cmd,
             "%s gen -o '%s' --layers 2 --dim 128 --ff 256 --vocab 300 --dtype q8_0 --quiet && "
             "%s gen -o '%s' --format safetensors --layers 2 --dim 128 --ff 256 --vocab 300 "
             "--dtype bf16 --quiet && "
             "%s gen -o '%s' --layers 2 --dim 128 --ff 256 --vocab 300 --dtype q4_0 --quiet",
             FERRY_CLI, gguf, FERRY_CLI, st, FERRY_CLI, q4);
    if (sh(cmd, NULL, 0) != 0) {
        fprintf(stderr, "cannot generate models\n");
        return 1;
    }
    static const char *devices[] = {"", "--device sim:256MiB@8GB/s"};
    static const char *homes[] = {"host", "disk", "device"};
    static const char *loads[] = {"auto", "mmap", "read", "direct"};
    const char *models[] = {gguf, st};
    for (int m = 0; m < 2; m++)
        for (int d = 0; d < 2; d++)
            for (int h = 0; h < 3; h++)
                for (int l = 0; l < 4; l++) {
                    char args[256];
                    snprintf(args, sizeof args, "%s --home %s --load %s", devices[d], homes[h],
                             loads[l]);
                    run_ok(models[m], args);
                }
    /* budgets, lazy, conversion */
    run_ok(gguf, "--home disk --budget host=300KiB");
    run_ok(gguf, "--device sim:64MiB --budget device=400KiB");
    run_ok(gguf, "--lazy on");
    run_ok(st, "--compute-dtype f32");
    run_ok(st, "--device sim:64MiB --compute-dtype f16 --home disk");
    run_ok(q4, "--compute-dtype f16");
    run_ok(gguf, "--compute-dtype q4_0 --home disk --load direct");

    /* split: --budget device= bounds each split device (it was silently ignored with --split) */
    char out[8192];
    snprintf(cmd, sizeof cmd,
             "%s run '%s' --split sim:64MiB,sim:64MiB:3 --budget device=200KiB --passes 2 "
             "--verify --json --quiet 2>&1",
             FERRY_CLI, gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 0);
    {
        long long p1 = -1, p2 = -1, ev = -1;
        const char *dp = strstr(out, "\"device_peak_bytes\"");
        const char *e = strstr(out, "\"evictions\"");
        if (dp)
            sscanf(dp, "\"device_peak_bytes\": {\"1\": %lld, \"2\": %lld", &p1, &p2);
        if (e)
            sscanf(e, "\"evictions\": %lld", &ev);
        CHECK(strstr(out, "\"verify\": \"ok\"") != NULL);
        CHECK(p1 > 0 && p1 <= 200 * 1024 && p2 > 0 && p2 <= 200 * 1024);
        CHECK(ev > 0); /* the 3/4 share (about 315 KiB) does not fit: the budget was applied */
        if (!(p1 > 0 && p1 <= 200 * 1024 && p2 > 0 && p2 <= 200 * 1024 && ev > 0))
            fprintf(stderr, "split budget: %s\n", out);
    }
    /* --setup: the streaming buffers faulted in while the engine would set itself up, within the
     * budget, every copy as in the file (FERRY_KEPT_PAGES=small places the first pass as where
     * fresh huge pages are dear; =huge never) */
    {
        char big[1200];
        snprintf(big, sizeof big, "%s/big.gguf", g_dir);
        snprintf(cmd, sizeof cmd, "%s gen -o '%s' --layers 4 --dim 512 --ff 1408 --vocab 1000 "
                 "--dtype f32 --quiet", FERRY_CLI, big);
        CHECK_EQ_INT(sh(cmd, NULL, 0), 0);
        for (int pages = 0; pages < 2; pages++) {
            snprintf(cmd, sizeof cmd,
                     "FERRY_KEPT_PAGES=%s %s run '%s' --home disk --budget host=40MiB --setup 1 "
                     "--passes 2 --verify --json --quiet 2>&1",
                     pages ? "huge" : "small", FERRY_CLI, big);
            CHECK_EQ_INT(sh(cmd, out, sizeof out), 0);
            long long ahead = -1, peak = -1;
            const char *a = strstr(out, "\"faulted_ahead_bytes\"");
            const char *hp = strstr(out, "\"host_peak_bytes\"");
            if (a)
                sscanf(a, "\"faulted_ahead_bytes\": %lld", &ahead);
            if (hp)
                sscanf(hp, "\"host_peak_bytes\": %lld", &peak);
            CHECK(strstr(out, "\"verify\": \"ok\"") != NULL);
            CHECK(peak > 0 && peak <= 40 << 20);
            if (pages == 0)
                CHECK(ahead >= 2 << 20 && ahead <= peak);
            else
                CHECK_EQ_INT(ahead, 0);
            if (!(ahead >= 0 && peak > 0))
                fprintf(stderr, "setup: %s\n", out);
        }
        snprintf(cmd, sizeof cmd, "%s run '%s' --setup soon 2>&1", FERRY_CLI, big);
        CHECK_EQ_INT(sh(cmd, out, sizeof out), 2);
    }
    /* a budget too small for one layer: a clear error, exit 1 */
    snprintf(cmd, sizeof cmd, "%s run '%s' --home disk --budget host=4KiB --quiet 2>&1",
             FERRY_CLI, gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 1);
    CHECK(strstr(out, "budget") != NULL);
    /* usage errors: exit 2 */
    snprintf(cmd, sizeof cmd, "%s run '%s' --home attic 2>&1", FERRY_CLI, gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s run 2>&1", FERRY_CLI);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "%s run '%s' --device sim:lots 2>&1", FERRY_CLI, gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 2);
    CHECK(strstr(out, "sim:lots") != NULL);
    /* plan: JSON totals */
    snprintf(cmd, sizeof cmd, "%s plan '%s' --home disk --device sim:64MiB --json", FERRY_CLI,
             gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "\"staged_bytes\"") != NULL);
    snprintf(cmd, sizeof cmd, "%s plan '%s' --lazy on", FERRY_CLI, gguf);
    CHECK_EQ_INT(sh(cmd, out, sizeof out), 0);
    CHECK(strstr(out, "yes") != NULL);
    /* trace: a Chrome trace file */
    char trace[1200];
    snprintf(trace, sizeof trace, "%s/t.json", g_dir);
    snprintf(cmd, sizeof cmd, "%s run '%s' --home disk --quiet --trace '%s' >/dev/null", FERRY_CLI,
             gguf, trace);
    CHECK_EQ_INT(sh(cmd, NULL, 0), 0);
    FILE *tf = fopen(trace, "r");
    char head[256] = "";
    CHECK(tf && fread(head, 1, sizeof head - 1, tf) > 0);
    if (tf)
        fclose(tf);
    CHECK(strstr(head, "traceEvents") != NULL);
    check_rmdir(g_dir);
    return check_finish();
}
