/*
 * test_plan_check.c — ferry_plan_check against the load it predicts, through the public API: on a
 * simulated device with a budget, the plan fails with FERRY_EBUDGET exactly when preparing every
 * tensor in file order (one at a time, released after use) fails with FERRY_EBUDGET — home copies
 * kept on the device beyond the budget, one staged copy larger than the budget, kept copies plus
 * the largest staged one a byte over — and passes when that load succeeds; the same on the host
 * with a host budget; no budget, no failure. The sizes come from the fixture's shapes, not from
 * ferry.
 */
#include <string.h>

#include "check.h"
#include "model_fixture.h"

#define LAYERS 4
#define DIM 64
#define FF 128
#define VOCAB 256

static char g_model[1200];
static uint64_t g_blocks, g_embd; /* bytes of all blocks; of token_embd (= output) */

/* A manager on sim:64MiB with device budget BUDGET (0: none) and host budget HOST_BUDGET:
 * blocks placed at BLOCK_HOME, everything else at home disk, computed on the sim device (or on
 * the cpu when ON_HOST). */
static ferry *open_model(uint64_t budget, uint64_t host_budget, ferry_home block_home,
                         int on_host)
{
    ferry_options o;
    memset(&o, 0, sizeof o);
    o.host_budget = host_budget;
    ferry *f = ferry_create(&o);
    int dev = 0;
    if (!f || (!on_host && ferry_add_device(f, "sim:64MiB", &dev)) ||
        (budget && ferry_set_budget(f, dev, budget)) || ferry_open(f, g_model, NULL)) {
        fprintf(stderr, "open: %s\n", f ? ferry_errmsg(f) : "out of memory");
        ferry_destroy(f);
        return NULL;
    }
    ferry_policy blocks = {.home = block_home, .compute_device = dev, .load = FERRY_LOAD_READ};
    ferry_policy rest = {.home = FERRY_HOME_DISK, .compute_device = dev, .load = FERRY_LOAD_READ};
    if (ferry_group_add(f, "blocks", "blk.*", &blocks) || ferry_group_add(f, "rest", "*", &rest)) {
        fprintf(stderr, "groups: %s\n", ferry_errmsg(f));
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

/* Prepares and releases every tensor in file order; 0 or the first failure's code. */
static int load_all(ferry *f)
{
    size_t n = 0;
    ferry_tensor **ts = fixture_all_tensors(f, &n);
    int rc = ts ? 0 : FERRY_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = ferry_prepare(f, &ts[i], 1);
        if (!rc)
            ferry_release(f, &ts[i], 1);
    }
    free(ts);
    return rc;
}

/* The plan's verdict and the load's agree for this placement; returns the plan's code. */
static int agree(uint64_t budget, uint64_t host_budget, ferry_home block_home, int on_host,
                 const char *want_in_msg)
{
    ferry *f = open_model(budget, host_budget, block_home, on_host);
    CHECK(f != NULL);
    if (!f)
        return -1;
    int plan = ferry_plan_check(f);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ferry_errmsg(f));
    if (want_in_msg) {
        CHECK(strstr(msg, want_in_msg) != NULL);
        if (!strstr(msg, want_in_msg))
            fprintf(stderr, "plan message '%s' lacks '%s'\n", msg, want_in_msg);
    }
    int load = load_all(f);
    CHECK(plan == 0 || plan == FERRY_EBUDGET);
    CHECK(load == 0 || load == FERRY_EBUDGET);
    CHECK_EQ_INT(plan, load);
    if (plan != load)
        fprintf(stderr, "budget %llu/%llu: plan %d (%s), load %d (%s)\n",
                (unsigned long long)budget, (unsigned long long)host_budget, plan, msg, load,
                ferry_errmsg(f));
    /* the manager stays usable: the same plan again gives the same verdict */
    CHECK_EQ_INT(ferry_plan_check(f), plan);
    ferry_destroy(f);
    return plan;
}

int main(void)
{
    const char *dir = check_tmpdir("plan_check");
    snprintf(g_model, sizeof g_model, "%s/m.gguf", dir);
    fixture_tensor ts[64];
    size_t n = fixture_layout(ts, LAYERS, DIM, FF, VOCAB, FERRY_DTYPE_F32, 0);
    if (fixture_write(g_model, FERRY_FORMAT_GGUF, ts, n))
        return 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t bytes = fixture_elems(&ts[i]) * 4;
        if (!strncmp(ts[i].name, "blk.", 4))
            g_blocks += bytes;
        else if (!strcmp(ts[i].name, "token_embd.weight"))
            g_embd = bytes;
    }
    CHECK(g_blocks > 0 && g_embd == (uint64_t)DIM * VOCAB * 4);

    /* no budget: nothing to fall short of */
    CHECK_EQ_INT(agree(0, 0, FERRY_HOME_DEVICE, 0, NULL), 0);
    /* blocks kept on the device, the budget below them */
    CHECK_EQ_INT(agree(g_blocks / 2, 0, FERRY_HOME_DEVICE, 0, "short"), FERRY_EBUDGET);
    /* everything streamed, but one staged copy (the embedding) larger than the budget */
    CHECK_EQ_INT(agree(g_embd - 1, 0, FERRY_HOME_DISK, 0, "token_embd.weight"), FERRY_EBUDGET);
    CHECK_EQ_INT(agree(g_embd, 0, FERRY_HOME_DISK, 0, NULL), 0);
    /* kept blocks plus the largest staged copy beside them: exactly enough, and a byte short */
    CHECK_EQ_INT(agree(g_blocks + g_embd, 0, FERRY_HOME_DEVICE, 0, NULL), 0);
    CHECK_EQ_INT(agree(g_blocks + g_embd - 1, 0, FERRY_HOME_DEVICE, 0, "1 B short"),
                 FERRY_EBUDGET);
    /* on the host: private host copies of the blocks under a host budget */
    CHECK_EQ_INT(agree(0, g_blocks / 2, FERRY_HOME_HOST, 1, "cpu: budget"), FERRY_EBUDGET);
    check_rmdir(dir);
    return check_finish();
}
