/*
 * test_budget_default.c — the default host budget and the engine's reservations: a manager made
 * with no budget gets what the host can give (MemAvailable and the memory cgroup's room, v1 and
 * v2, less the margin ferry.h states), 0 restores it, a budget above the host's RAM or the
 * cgroup's limit is refused naming both; under the default, released copies (merged LoRA copies
 * included) stay cached and a second pass reads nothing; a model that cannot fit fails with
 * FERRY_EBUDGET instead of being killed by the kernel — in a simulated cgroup ($FERRY_CGROUP_ROOT)
 * and, where this process may create one, in a real 128 MiB memory cgroup; ferry_reserve counts
 * the engine's own memory against a budget.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>

#include "check.h"
#include "cli_harness.h"
#include "ferry.h"
#include "model_fixture.h"

#define MIB (UINT64_C(1) << 20)

static char g_model[1200], g_big[1200], g_lora_base[1200], g_lora[1200];

static ferry_device_info info_of(ferry *f, int dev)
{
    ferry_device_info di;
    memset(&di, 0, sizeof di);
    CHECK_EQ_INT(ferry_get_device_info(f, dev, &di), 0);
    return di;
}

static uint64_t meminfo_kb(const char *key)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t v = 0, kb;
    size_t kl = strlen(key);
    while (fp && fgets(line, sizeof line, fp))
        if (!strncmp(line, key, kl) && line[kl] == ':' &&
            sscanf(line + kl + 1, "%" SCNu64, &kb) == 1)
            v = kb;
    if (fp)
        fclose(fp);
    return v * 1024;
}

/* The default budget as ferry.h states it, from what the host can give (GIVE bytes). */
static uint64_t documented_default(uint64_t give)
{
    uint64_t margin = give / 8;
    if (margin < 32 * MIB)
        margin = 32 * MIB;
    if (margin > 1024 * MIB)
        margin = 1024 * MIB;
    return give > 2 * margin ? give - margin : give / 2;
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[1400];
    int n = snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK(n > 0 && (size_t)n < sizeof p);
    FILE *fp = n > 0 && (size_t)n < sizeof p ? fopen(p, "w") : NULL;
    CHECK(fp != NULL);
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
}

/* A cgroup tree under DIR/cg/ that puts this process in /box, limited to LIMIT with USAGE
 * charged, as cgroup v2 (V2) or v1 lays it out; $FERRY_CGROUP_ROOT points at it. */
static void fake_cgroup(const char *dir, int v2, uint64_t limit, uint64_t usage)
{
    char root[1300], box[1400], num[64], cmd[3000];
    snprintf(root, sizeof root, "%s/cg%d", dir, v2 ? 2 : 1);
    snprintf(box, sizeof box, "%s%s/box", root, v2 ? "" : "/memory");
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", root, box);
    CHECK_EQ_INT(system(cmd), 0);
    write_file(root, "proc_self_cgroup", v2 ? "0::/box\n" : "9:pids:/\n4:memory:/box\n0::/\n");
    snprintf(num, sizeof num, "%" PRIu64 "\n", limit);
    write_file(box, v2 ? "memory.max" : "memory.limit_in_bytes", num);
    snprintf(num, sizeof num, "%" PRIu64 "\n", usage);
    write_file(box, v2 ? "memory.current" : "memory.usage_in_bytes", num);
    write_file(box, "memory.stat", v2 ? "anon 0\ninactive_file 0\n" : "total_inactive_file 0\n");
    setenv("FERRY_CGROUP_ROOT", root, 1);
}

/* ---- the default and its limits -------------------------------------------------------------- */

static void test_default_is_what_the_host_gives(void)
{
    unsetenv("FERRY_CGROUP_ROOT");
    uint64_t before = meminfo_kb("MemAvailable");
    ferry *f = ferry_create(NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    uint64_t after = meminfo_kb("MemAvailable");
    ferry_device_info di = info_of(f, 0);
    /* never more than what the host gives, nor less than that minus the largest margin */
    uint64_t hi = before > after ? before : after, lo = before < after ? before : after;
    CHECK(di.budget > 0);
    CHECK(di.budget <= di.total_bytes);
    if (di.total_bytes == meminfo_kb("MemTotal")) { /* no cgroup limit below the RAM */
        CHECK(di.budget <= documented_default(hi) + 64 * MIB);
        CHECK(di.budget + 64 * MIB >= documented_default(lo));
    }
    fprintf(stderr, "default host budget %.1f MiB (MemAvailable %.1f MiB)\n",
            (double)di.budget / MIB, (double)lo / MIB);
    /* 0 restores the default; a budget above the host's memory is refused naming both */
    CHECK_EQ_INT(ferry_set_budget(f, 0, 64 * MIB), 0);
    CHECK_EQ_INT(info_of(f, 0).budget, 64 * MIB);
    CHECK_EQ_INT(ferry_set_budget(f, 0, 0), 0);
    CHECK(info_of(f, 0).budget > 64 * MIB || di.budget <= 64 * MIB);
    uint64_t total = di.total_bytes;
    CHECK_EQ_INT(ferry_set_budget(f, 0, total + 4096), FERRY_EBUDGET);
    char want[32];
    ferry_format_size(total, want);
    CHECK(strstr(ferry_errmsg(f), want) != NULL);
    ferry_format_size(total + 4096, want);
    CHECK(strstr(ferry_errmsg(f), want) != NULL || total >= (UINT64_C(1) << 40));
    CHECK(info_of(f, 0).budget != total + 4096);
    /* a device's capacity, the same */
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    CHECK_EQ_INT(ferry_set_budget(f, sim, 65 * MIB), FERRY_EBUDGET);
    CHECK(strstr(ferry_errmsg(f), "65.00 MiB") && strstr(ferry_errmsg(f), "64.00 MiB"));
    CHECK_EQ_INT(ferry_set_budget(f, sim, 64 * MIB), 0);
    ferry_destroy(f);
    /* at creation: refused, no manager */
    ferry_options o = {.host_budget = total + 4096};
    ferry *g = ferry_create(&o);
    CHECK(g == NULL);
    ferry_destroy(g);
}

static void test_simulated_cgroup(const char *dir)
{
    for (int v2 = 0; v2 <= 1; v2++) {
        fake_cgroup(dir, v2, 128 * MIB, 8 * MIB);
        ferry *f = ferry_create(NULL);
        CHECK(f != NULL);
        if (!f)
            continue;
        ferry_device_info di = info_of(f, 0);
        CHECK_EQ_INT(di.total_bytes, 128 * MIB);
        uint64_t give = 120 * MIB; /* limit - usage */
        if (meminfo_kb("MemAvailable") < give)
            give = meminfo_kb("MemAvailable");
        CHECK_EQ_INT(di.budget, documented_default(give)); /* 88 MiB */
        CHECK_EQ_INT(ferry_set_budget(f, 0, 256 * MIB), FERRY_EBUDGET);
        const char *m = ferry_errmsg(f);
        CHECK(strstr(m, "256.00 MiB") && strstr(m, "128.00 MiB") && strstr(m, "cgroup"));
        CHECK_EQ_INT(info_of(f, 0).budget, documented_default(give));
        CHECK_EQ_INT(ferry_set_budget(f, 0, 100 * MIB), 0); /* under the limit, over the room */
        CHECK_EQ_INT(ferry_set_budget(f, 0, 0), 0);
        CHECK_EQ_INT(info_of(f, 0).budget, documented_default(give));

        /* a model of 250 MiB at home on the host: a clear FERRY_EBUDGET, the manager usable */
        ferry_policy p = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ};
        CHECK_EQ_INT(ferry_open(f, g_big, NULL), 0);
        CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
        size_t n;
        ferry_tensor **ts = fixture_all_tensors(f, &n);
        int rc = ferry_load_group(f, "all");
        CHECK_EQ_INT(rc, FERRY_EBUDGET);
        CHECK(strstr(ferry_errmsg(f), "budget") && strstr(ferry_errmsg(f), "the default"));
        CHECK(info_of(f, 0).used_bytes <= info_of(f, 0).budget);
        free(ts);
        ferry_destroy(f);

        /* the same through the tool: exit status 1 and the message, never a kill */
        rc = run("run '%s' --home host --load read --passes 1 --quiet", g_big);
        CHECK_EQ_INT(rc, 1);
        CHECK(strstr(err_text, "budget") && strstr(err_text, "memory cgroup"));
        rc = run("devices --json");
        CHECK_EQ_INT(rc, 0);
        CHECK(strstr(out_text, "\"total_bytes\": 134217728") ||
              strstr(out_text, "\"total_bytes\":134217728"));
        /* a budget the cgroup cannot hold, refused by the tool with both numbers */
        rc = run("run '%s' --home disk --budget host=1GiB --passes 1 --quiet", g_model);
        CHECK_EQ_INT(rc, 1);
        CHECK(strstr(err_text, "1.00 GiB") && strstr(err_text, "128.00 MiB"));
        /* a model larger than the budget streams through it (home disk) */
        rc = run("run '%s' --home disk --load read --passes 2 --quiet", g_big);
        CHECK_EQ_INT(rc, 0);
        if (rc)
            fprintf(stderr, "%s%s\n", out_text, err_text);
    }
    unsetenv("FERRY_CGROUP_ROOT");
}

/* ---- a real memory cgroup -------------------------------------------------------------------- */

/* Makes a child memory cgroup limited to LIMIT under this process's own; its folder in CG (and
 * the file to write a pid into in PROCS). 0 when it cannot be made (not root, no controller). */
static int make_cgroup(uint64_t limit, char *cg, size_t len, char *procs, size_t plen)
{
    FILE *fp = fopen("/proc/self/cgroup", "r");
    if (!fp)
        return 0;
    char line[1024], v1[800] = "", v2[800] = "";
    int have_v1 = 0, have_v2 = 0;
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b)
            continue;
        *b = 0;
        char ctl[300];
        snprintf(ctl, sizeof ctl, ",%s,", a + 1);
        if (strstr(ctl, ",memory,")) {
            snprintf(v1, sizeof v1, "%s", strcmp(b + 1, "/") ? b + 1 : "");
            have_v1 = 1;
        } else if (!strncmp(line, "0", 2) && !a[1]) {
            snprintf(v2, sizeof v2, "%s", strcmp(b + 1, "/") ? b + 1 : "");
            have_v2 = 1;
        }
    }
    fclose(fp);
    char lim[64], file[2000];
    snprintf(lim, sizeof lim, "%" PRIu64, limit);
    for (int pass = 0; pass < 2; pass++) {
        int v = pass == 0 ? 1 : 2;
        if ((v == 1 && !have_v1) || (v == 2 && !have_v2))
            continue;
        snprintf(cg, len, "%s%s/ferry-budget-test.%d",
                 v == 1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup", v == 1 ? v1 : v2,
                 (int)getpid());
        if (mkdir(cg, 0755) != 0) {
            fprintf(stderr, "cgroup v%d: mkdir %s: %s\n", v, cg, strerror(errno));
            continue;
        }
        snprintf(file, sizeof file, "%s/%s", cg, v == 1 ? "memory.limit_in_bytes" : "memory.max");
        FILE *w = fopen(file, "w");
        int ok = w && fputs(lim, w) >= 0;
        if (w && fclose(w) != 0)
            ok = 0;
        if (!ok) {
            fprintf(stderr, "cgroup v%d: cannot write %s\n", v, file);
            rmdir(cg);
            continue;
        }
        snprintf(procs, plen, "%s/cgroup.procs", cg);
        return v;
    }
    return 0;
}

/* Runs CMD (a shell command) as a child process inside the cgroup whose procs file is PROCS;
 * returns its wait status, or -1. */
static int run_in_cgroup(const char *procs, const char *cmd)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        FILE *w = fopen(procs, "w");
        if (!w || fprintf(w, "%d\n", (int)getpid()) < 0 || fclose(w) != 0)
            _exit(99);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(98);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

static void test_real_cgroup(const char *dir)
{
    char cg[1100], procs[1200];
    int v = make_cgroup(128 * MIB, cg, sizeof cg, procs, sizeof procs);
    if (!v) {
        fprintf(stderr, "SKIP real cgroup test: no memory cgroup can be created here\n");
        return;
    }
    char cmd[4000], out[1300], err[1300];
    snprintf(out, sizeof out, "%s/cg_out.txt", dir);
    snprintf(err, sizeof err, "%s/cg_err.txt", dir);
    /* 1. the 250 MiB model at home on the host: refused, not killed */
    snprintf(cmd, sizeof cmd, "%s run '%s' --home host --load read --passes 1 --quiet >'%s' 2>'%s'",
             FERRY_CLI, g_big, out, err);
    int st = run_in_cgroup(procs, cmd);
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 99 || WEXITSTATUS(st) == 98)) {
        fprintf(stderr, "SKIP real cgroup test: cannot join %s\n", cg);
        rmdir(cg);
        return;
    }
    char *e = slurp(err, NULL);
    CHECK(WIFEXITED(st));
    CHECK(!WIFSIGNALED(st));
    CHECK_EQ_INT(WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), 1);
    CHECK(e && strstr(e, "budget") != NULL);
    fprintf(stderr, "in a real 128 MiB cgroup (v%d), home host: status %d: %s", v,
            WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), e ? e : "");
    free(e);
    /* 2. the device list there shows the cgroup's limit */
    snprintf(cmd, sizeof cmd, "%s devices --json >'%s' 2>'%s'", FERRY_CLI, out, err);
    st = run_in_cgroup(procs, cmd);
    char *o = slurp(out, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(o && (strstr(o, "\"total_bytes\": 134217728") || strstr(o, "\"total_bytes\":134217728")));
    free(o);
    /* 3. the same model streamed from the disk under the default budget: it runs */
    snprintf(cmd, sizeof cmd, "%s run '%s' --home disk --load read --passes 2 --quiet >'%s' 2>'%s'",
             FERRY_CLI, g_big, out, err);
    st = run_in_cgroup(procs, cmd);
    e = slurp(err, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        fprintf(stderr, "home disk in the cgroup: status %d: %s\n",
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), e ? e : "");
    free(e);
    if (rmdir(cg) != 0)
        fprintf(stderr, "rmdir %s: %s\n", cg, strerror(errno));
}

/* ---- caching by default ---------------------------------------------------------------------- */

static uint64_t bytes_read(ferry *f)
{
    ferry_stats st;
    ferry_get_stats(f, &st);
    return st.bytes_read;
}

/* Prepares and releases every tensor of TS one by one; returns the bytes read from the file. */
static uint64_t one_pass(ferry *f, ferry_tensor **ts, size_t n)
{
    uint64_t r0 = bytes_read(f);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(ferry_prepare(f, &ts[i], 1), 0);
        CHECK_EQ_INT(ferry_release(f, &ts[i], 1), 0);
    }
    return bytes_read(f) - r0;
}

static void test_cached_by_default(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    uint64_t first = one_pass(f, ts, n), second = one_pass(f, ts, n);
    CHECK(first >= model);
    CHECK_EQ_INT(second, 0);
    ferry_stats st;
    ferry_get_stats(f, &st);
    CHECK(st.resident_bytes[0] >= model);
    CHECK_EQ_INT(st.evictions, 0);
    /* ferry_release_all keeps them too; a budget that needs the room evicts them */
    CHECK_EQ_INT(ferry_release_all(f), 0);
    CHECK_EQ_INT(one_pass(f, ts, n), 0);
    CHECK_EQ_INT(ferry_set_budget(f, 0, 1), 0);
    ferry_get_stats(f, &st);
    CHECK_EQ_INT(st.resident_bytes[0], 0);
    free(ts);
    ferry_destroy(f);
}

/* A LoRA-merged copy of a home-disk weight is merged (and read) once, not at every pass. */
static void test_merged_cached_by_default(void)
{
    ferry *f = ferry_create(NULL);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_lora_base, &p, &n);
    CHECK(ts != NULL);
    CHECK_EQ_INT(ferry_lora_add(f, g_lora, 1.0f, NULL, NULL), 0);
    uint64_t first = one_pass(f, ts, n), second = one_pass(f, ts, n);
    CHECK(first > 0);
    CHECK_EQ_INT(second, 0);
    /* a new epoch still re-stages from the file */
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, 0, 0.5f), 0);
    CHECK(one_pass(f, ts, n) > 0);
    free(ts);
    ferry_destroy(f);
}

/* ---- reservations ---------------------------------------------------------------------------- */

static void test_reserve(void)
{
    ferry *f = ferry_create(NULL);
    int sim;
    CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &sim), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK, .load = FERRY_LOAD_READ, .compute_device = sim};
    size_t n;
    ferry_tensor **ts = fixture_open_all(f, g_model, &p, &n);
    CHECK(ts != NULL);
    uint64_t model = ferry_catalog_total_bytes(ferry_catalog_of(f));
    uint64_t budget = 3 * model / 4;
    CHECK_EQ_INT(ferry_set_budget(f, sim, budget), 0);
    one_pass(f, ts, n);
    ferry_device_info di = info_of(f, sim);
    uint64_t cached = di.used_bytes;
    CHECK(cached > model / 2 && cached <= budget);

    /* a reservation evicts cached copies to make room and counts as used */
    uint64_t want = budget / 2;
    uint64_t ev0;
    ferry_stats st;
    ferry_get_stats(f, &st);
    ev0 = st.evictions;
    CHECK_EQ_INT(ferry_reserve(f, sim, want), 0);
    di = info_of(f, sim);
    CHECK(di.used_bytes <= budget);
    CHECK(di.used_bytes >= want);
    ferry_get_stats(f, &st);
    CHECK(st.evictions > ev0);
    CHECK_EQ_INT(st.resident_bytes[sim], di.used_bytes);
    /* passes go on in what is left, never over the budget */
    one_pass(f, ts, n);
    ferry_get_stats(f, &st);
    CHECK(st.peak_bytes[sim] <= budget);
    CHECK(info_of(f, sim).used_bytes >= want);

    /* a request above the budget fails at once, naming budget, use and request; the old stays */
    uint64_t used = info_of(f, sim).used_bytes;
    CHECK_EQ_INT(ferry_reserve(f, sim, budget + 1), FERRY_EBUDGET);
    const char *m = ferry_errmsg(f);
    char b1[32], b2[32], b3[32];
    ferry_format_size(budget, b1);
    ferry_format_size(used, b2);
    ferry_format_size(budget + 1, b3);
    CHECK(strstr(m, b1) && strstr(m, b2) && strstr(m, b3));
    CHECK_EQ_INT(info_of(f, sim).used_bytes, used);

    /* a reservation with a tensor in use that cannot move: FERRY_EBUDGET */
    ferry_tensor *big = ts[n - 1];
    CHECK_EQ_INT(ferry_reserve(f, sim, 0), 0);
    CHECK_EQ_INT(ferry_prepare(f, &big, 1), 0);
    uint64_t held = ferry_tensor_nbytes(big);
    CHECK_EQ_INT(ferry_reserve(f, sim, budget - held / 2), FERRY_EBUDGET);
    CHECK(strstr(ferry_errmsg(f), "reserve") != NULL);
    CHECK_EQ_INT(ferry_reserve(f, sim, budget - held - 4096), 0);
    /* what the reservation leaves is too little for another weight: prepare says so */
    ferry_tensor *other = ts[n - 3];
    CHECK_EQ_INT(ferry_prepare(f, &other, 1), FERRY_EBUDGET);
    CHECK_EQ_INT(ferry_release(f, &big, 1), 0);

    /* giving it back: used drops by the reservation */
    used = info_of(f, sim).used_bytes;
    CHECK_EQ_INT(ferry_reserve(f, sim, 0), 0);
    CHECK_EQ_INT(info_of(f, sim).used_bytes, used - (budget - held - 4096));
    /* the host, under its default budget */
    uint64_t h0 = info_of(f, 0).used_bytes;
    CHECK_EQ_INT(ferry_reserve(f, 0, 16 * MIB), 0);
    CHECK_EQ_INT(info_of(f, 0).used_bytes, h0 + 16 * MIB);
    CHECK_EQ_INT(ferry_reserve(f, 0, 0), 0);
    CHECK_EQ_INT(info_of(f, 0).used_bytes, h0);
    CHECK_EQ_INT(ferry_reserve(f, 7, 1), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_reserve(NULL, 0, 1), FERRY_EINVAL);
    free(ts);
    ferry_destroy(f);
}

int main(void)
{
    const char *d = check_tmpdir("budget_default");
    tmp = d;
    snprintf(g_model, sizeof g_model, "%s/model.gguf", d);
    snprintf(g_big, sizeof g_big, "%s/big.gguf", d);
    snprintf(g_lora_base, sizeof g_lora_base, "%s/q4.gguf", d);
    snprintf(g_lora, sizeof g_lora, "%s/lora.safetensors", d);
    if (fixture_write_llama(g_model, 4, 256, 512, 1000, FERRY_DTYPE_F32))
        return 2;
    if (run("gen -o '%s' --size 250MiB --layers 8", g_big) ||
        run("gen -o '%s' --dtype q4_0 --size 8MiB", g_lora_base) ||
        run("gen --lora '%s' -o '%s'", g_lora_base, g_lora)) {
        fprintf(stderr, "ferry gen: %s%s\n", out_text, err_text);
        return 2;
    }
    test_default_is_what_the_host_gives();
    test_simulated_cgroup(d);
    test_real_cgroup(d);
    test_cached_by_default();
    test_merged_cached_by_default();
    test_reserve();
    free(out_text);
    free(err_text);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}
