/*
 * runopts.c — parsing the placement options shared by run, plan and bench, and opening a manager
 * with them (see runopts.h).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runopts.h"

const char runopts_help[] =
    "  --device SPEC          compute device: cpu (default), sim:8GiB, sim:8GiB@25GB/s, cuda:0\n"
    "  --home disk|host|device  where weights live between uses (default host)\n"
    "  --load auto|mmap|read|direct  how bytes come from the file (default auto)\n"
    "  --lazy off|on|auto[=SIZE]  lazy tensors: paged in on demand (default auto=4GiB)\n"
    "  --budget device=SIZE[,host=SIZE]  memory budgets (a bare SIZE is the device's;\n"
    "                         with --split, each split device's)\n"
    "  --compute-dtype T      stage weights converted to T (f32, f16, bf16, q8_0, q4_0)\n"
    "  -a, --adapter PATH[:MULT]  merge a LoRA adapter (repeatable)\n"
    "  --lora-mode merge|runtime  merge adapters at staging, or hand factors to the engine\n"
    "  --split SPEC,SPEC[:WEIGHT]  divide each 2-D weight's rows over several devices\n"
    "                         (e.g. sim:4GiB,sim:4GiB:3 puts a quarter on the first)\n";

void runopts_add(runopts *r, cli_opt *opts, size_t *n)
{
    opts[(*n)++] = (cli_opt){"device", 0, CLI_OPT_STRING, &r->device};
    opts[(*n)++] = (cli_opt){"home", 0, CLI_OPT_STRING, &r->home};
    opts[(*n)++] = (cli_opt){"load", 0, CLI_OPT_STRING, &r->load};
    opts[(*n)++] = (cli_opt){"lazy", 0, CLI_OPT_STRING, &r->lazy};
    opts[(*n)++] = (cli_opt){"budget", 0, CLI_OPT_STRING, &r->budget};
    opts[(*n)++] = (cli_opt){"compute-dtype", 0, CLI_OPT_STRING, &r->compute_dtype};
    opts[(*n)++] = (cli_opt){"lora-mode", 0, CLI_OPT_STRING, &r->lora_mode};
    opts[(*n)++] = (cli_opt){"split", 0, CLI_OPT_STRING, &r->split};
}

int runopts_collect_adapters(const char *cmd, runopts *r, int *argc, char **argv)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "--") == 0) {
            while (i < *argc)
                argv[out++] = argv[i++];
            break;
        }
        if (strcmp(a, "-a") == 0 || strcmp(a, "--adapter") == 0) {
            if (i + 1 >= *argc)
                return cli_usage_error(cmd, "%s needs a value", a);
            val = argv[++i];
        } else if (strncmp(a, "--adapter=", 10) == 0) {
            val = a + 10;
        } else if (strncmp(a, "-a", 2) == 0 && a[2]) {
            val = a + 2;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (r->n_adapters >= RUNOPTS_MAX_ADAPTERS)
            return cli_usage_error(cmd, "at most %d adapters", RUNOPTS_MAX_ADAPTERS);
        r->adapters[r->n_adapters++] = val;
    }
    *argc = out;
    argv[out] = NULL;
    return 0;
}

static int parse_budget(const char *cmd, runopts *r)
{
    char *copy = strdup(r->budget), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        const char *key = "device", *val = tok;
        if (eq) {
            *eq = 0;
            key = tok;
            val = eq + 1;
        }
        uint64_t v;
        if (ferry_parse_size(val, &v)) {
            rc = cli_usage_error(cmd, "--budget: bad size '%s'", val);
        } else if (strcmp(key, "device") == 0) {
            r->device_budget = v;
            r->have_device_budget = 1;
        } else if (strcmp(key, "host") == 0) {
            r->host_budget = v;
        } else {
            rc = cli_usage_error(cmd, "--budget: unknown key '%s' (device, host)", key);
        }
    }
    free(copy);
    return rc;
}

int runopts_parse(const char *cmd, runopts *r)
{
    ferry_policy *p = &r->policy;
    memset(p, 0, sizeof *p);
    if (r->home) {
        if (!strcmp(r->home, "host"))
            p->home = FERRY_HOME_HOST;
        else if (!strcmp(r->home, "disk"))
            p->home = FERRY_HOME_DISK;
        else if (!strcmp(r->home, "device"))
            p->home = FERRY_HOME_DEVICE;
        else
            return cli_usage_error(cmd, "--home: '%s' is not disk, host or device", r->home);
    }
    if (r->load) {
        static const char *names[] = {"auto", "mmap", "read", "direct"};
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(r->load, names[i]))
                k = i;
        if (k < 0)
            return cli_usage_error(cmd, "--load: '%s' is not auto, mmap, read or direct", r->load);
        p->load = (ferry_load)k;
    }
    if (r->lazy) {
        if (!strcmp(r->lazy, "off")) {
            p->lazy = FERRY_LAZY_OFF;
        } else if (!strcmp(r->lazy, "on")) {
            p->lazy = FERRY_LAZY_ON;
        } else if (!strncmp(r->lazy, "auto", 4) && (!r->lazy[4] || r->lazy[4] == '=')) {
            p->lazy = FERRY_LAZY_AUTO;
            if (r->lazy[4] && ferry_parse_size(r->lazy + 5, &p->lazy_threshold))
                return cli_usage_error(cmd, "--lazy: bad size '%s'", r->lazy + 5);
        } else {
            return cli_usage_error(cmd, "--lazy: '%s' is not off, on or auto[=SIZE]", r->lazy);
        }
    }
    if (r->compute_dtype) {
        ferry_dtype t = ferry_dtype_from_name(r->compute_dtype);
        if (t == FERRY_DTYPE_NONE)
            return cli_usage_error(cmd, "--compute-dtype: unknown type '%s'", r->compute_dtype);
        p->convert = 1;
        p->compute_dtype = t;
    }
    if (r->lora_mode && strcmp(r->lora_mode, "merge") && strcmp(r->lora_mode, "runtime"))
        return cli_usage_error(cmd, "--lora-mode: '%s' is not merge or runtime", r->lora_mode);
    if (r->budget && parse_budget(cmd, r))
        return CLI_EXIT_USAGE;
    return 0;
}

/* Adds the devices of --split and fills the policy's split. A trailing ":WEIGHT" is a number after
 * the spec's own colons: cpu:W, sim:CAP:W, cuda:N:W. */
int runopts_split(const char *split, ferry *f, ferry_policy *policy)
{
    char *copy = strdup(split), *save = NULL;
    if (!copy)
        return cli_error("out of memory");
    int rc = 0, k = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        if (k >= FERRY_MAX_SPLIT) {
            rc = cli_error("--split: at most %d devices", FERRY_MAX_SPLIT);
            break;
        }
        int colons = 0;
        for (char *c = tok; *c; c++)
            colons += *c == ':';
        int own = strncmp(tok, "cpu", 3) == 0 ? 0 : 1;
        float w = 0;
        char *last = strrchr(tok, ':');
        if (last && colons > own) {
            char *end;
            double v = strtod(last + 1, &end);
            if (*end || !(v > 0)) {
                rc = cli_error("--split: bad weight '%s' in '%s'", last + 1, tok);
                break;
            }
            w = (float)v;
            *last = 0;
        }
        int dev = 0;
        if (strcmp(tok, "cpu") != 0 && ferry_add_device(f, tok, &dev)) {
            rc = cli_error("%s", ferry_errmsg(f));
            break;
        }
        policy->split_devices[k] = dev;
        policy->split_weights[k] = w;
        k++;
    }
    policy->n_split = k;
    if (!rc && k)
        policy->compute_device = policy->split_devices[0];
    free(copy);
    return rc;
}

static int add_split(runopts *r, ferry *f)
{
    return runopts_split(r->split, f, &r->policy);
}

int runopts_open(runopts *r, char **files, int nfiles, ferry **out)
{
    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    /* set after creation, so that a budget the host cannot hold is refused with the reason */
    if (r->host_budget && ferry_set_budget(f, 0, r->host_budget)) {
        cli_error("%s", ferry_errmsg(f));
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    int dev = 0;
    if (r->device && strcmp(r->device, "cpu") != 0 && ferry_add_device(f, r->device, &dev)) {
        cli_error("%s", ferry_errmsg(f));
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    r->policy.compute_device = dev;
    if (r->split && add_split(r, f)) {
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    /* the device budget is the compute device's; with --split, each split device's */
    int bdev[FERRY_MAX_SPLIT + 1], nb = 0;
    if (dev)
        bdev[nb++] = dev;
    for (int k = 0; r->split && k < r->policy.n_split; k++)
        if (r->policy.split_devices[k] && r->policy.split_devices[k] != dev)
            bdev[nb++] = r->policy.split_devices[k];
    for (int k = 0; r->have_device_budget && k < nb; k++)
        if (ferry_set_budget(f, bdev[k], r->device_budget)) {
            cli_error("%s", ferry_errmsg(f));
            ferry_destroy(f);
            return CLI_EXIT_FAIL;
        }
    for (int i = 0; i < nfiles; i++) {
        if (ferry_open(f, files[i], NULL)) {
            cli_fail(files[i], ferry_errmsg(f), -1);
            ferry_destroy(f);
            return CLI_EXIT_FAIL;
        }
    }
    if (r->groups_first && r->groups_first(f, &r->policy, r->groups_arg)) {
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    if (ferry_group_add(f, "all", "*", &r->policy)) {
        cli_error("%s", ferry_errmsg(f));
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    if (r->lora_mode && !strcmp(r->lora_mode, "runtime"))
        ferry_lora_set_mode(f, FERRY_LORA_RUNTIME);
    for (int i = 0; i < r->n_adapters; i++) {
        char *path = strdup(r->adapters[i]);
        float mult = 1.0f;
        char *colon = strrchr(path, ':');
        if (colon && colon[1]) {
            char *end;
            double m = strtod(colon + 1, &end);
            if (!*end) {
                *colon = 0;
                mult = (float)m;
            }
        }
        int rc = ferry_lora_add(f, path, mult, NULL, NULL);
        if (rc) {
            cli_fail(path, ferry_errmsg(f), rc);
            free(path);
            ferry_destroy(f);
            return CLI_EXIT_FAIL;
        }
        free(path);
    }
    *out = f;
    return 0;
}
