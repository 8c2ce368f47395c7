/*
 * runopts.c — parsing the placement options shared by run, plan and bench, and opening a manager
 * with them (see runopts.h).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runopts.h"

#define GROUP_HELP \
    "  --group NAME=GLOB:KEY=VALUE,...  tensors matching GLOB get the placement of the other\n" \
    "                         options with these keys replaced: home=, lazy=, load=,\n" \
    "                         compute-dtype=, lock=on|off, device=N (0 the cpu, 1 --device),\n" \
    "                         experts=on|off (the outermost dimension counts experts: plan\n" \
    "                         lists one unit per expert, each a slice NAME[E:E+1]);\n" \
    "                         repeatable, the first match wins; the other options place\n" \
    "                         every tensor no --group matches. E.g. --home disk\n" \
    "                         --group embd=token_embd.*:lazy=on --group head=output*:home=host\n"

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
    "                         (e.g. sim:4GiB,sim:4GiB:3 puts a quarter on the first)\n"
    GROUP_HELP;

const char runopts_group_help[] = GROUP_HELP;

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

/* Moves every LNG VALUE and LNG=VALUE (with SHRT also SHRT VALUE and SHRTVALUE) out of argv into
 * VALS, *NVALS of at most MAX (WHAT names them when there are more); argv keeps the other
 * arguments in order, and every argument from "--" on. */
static int collect_repeated(const char *cmd, int *argc, char **argv, const char *lng,
                            const char *shrt, const char **vals, int *nvals, int max,
                            const char *what)
{
    size_t ll = strlen(lng), sl = shrt ? strlen(shrt) : 0;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "--") == 0) {
            while (i < *argc)
                argv[out++] = argv[i++];
            break;
        }
        if (strcmp(a, lng) == 0 || (shrt && strcmp(a, shrt) == 0)) {
            if (i + 1 >= *argc)
                return cli_usage_error(cmd, "%s needs a value", a);
            val = argv[++i];
        } else if (strncmp(a, lng, ll) == 0 && a[ll] == '=') {
            val = a + ll + 1;
        } else if (shrt && strncmp(a, shrt, sl) == 0 && a[sl]) {
            val = a + sl;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (*nvals >= max)
            return cli_usage_error(cmd, "at most %d %s", max, what);
        vals[(*nvals)++] = val;
    }
    *argc = out;
    argv[out] = NULL;
    return 0;
}

int runopts_collect_adapters(const char *cmd, runopts *r, int *argc, char **argv)
{
    return collect_repeated(cmd, argc, argv, "--adapter", "-a", r->adapters, &r->n_adapters,
                            RUNOPTS_MAX_ADAPTERS, "adapters");
}

static int parse_budget(const char *cmd, runopts *r)
{
    char *copy = strdup(r->budget), *save = NULL;
    if (!copy)
        return cli_error("out of memory");
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

/* Sets field KEY of P from VAL: home, load, lazy, compute-dtype, lock, experts. WHERE prefixes messages
 * ("--home", "--group 'head': home"). Returns 0, CLI_EXIT_USAGE, or 1 when KEY is none of them. */
static int set_field(const char *cmd, const char *where, const char *key, const char *val,
                     ferry_policy *p)
{
    if (!strcmp(key, "home")) {
        if (!strcmp(val, "host"))
            p->home = FERRY_HOME_HOST;
        else if (!strcmp(val, "disk"))
            p->home = FERRY_HOME_DISK;
        else if (!strcmp(val, "device"))
            p->home = FERRY_HOME_DEVICE;
        else
            return cli_usage_error(cmd, "%s: '%s' is not disk, host or device", where, val);
    } else if (!strcmp(key, "load")) {
        static const char *names[] = {"auto", "mmap", "read", "direct"};
        int k = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(val, names[i]))
                k = i;
        if (k < 0)
            return cli_usage_error(cmd, "%s: '%s' is not auto, mmap, read or direct", where, val);
        p->load = (ferry_load)k;
    } else if (!strcmp(key, "lazy")) {
        if (!strcmp(val, "off")) {
            p->lazy = FERRY_LAZY_OFF;
        } else if (!strcmp(val, "on")) {
            p->lazy = FERRY_LAZY_ON;
        } else if (!strncmp(val, "auto", 4) && (!val[4] || val[4] == '=')) {
            p->lazy = FERRY_LAZY_AUTO;
            p->lazy_threshold = 0;
            if (val[4] && ferry_parse_size(val + 5, &p->lazy_threshold))
                return cli_usage_error(cmd, "%s: bad size '%s'", where, val + 5);
        } else {
            return cli_usage_error(cmd, "%s: '%s' is not off, on or auto[=SIZE]", where, val);
        }
    } else if (!strcmp(key, "compute-dtype")) {
        ferry_dtype t = ferry_dtype_from_name(val);
        if (t == FERRY_DTYPE_NONE)
            return cli_usage_error(cmd, "%s: unknown type '%s'", where, val);
        /* one message for a type nothing converts to, not one per tensor at load */
        if (!ferry_dtype_can_convert(FERRY_DTYPE_F32, t))
            return cli_usage_error(cmd, "%s: ferry cannot convert weights to %s (it converts to "
                                   "f32, f16, bf16, q8_0 and q4_0)", where, val);
        p->convert = 1;
        p->compute_dtype = t;
    } else if (!strcmp(key, "lock") || !strcmp(key, "experts")) {
        if (strcmp(val, "on") && strcmp(val, "off"))
            return cli_usage_error(cmd, "%s: '%s' is not on or off", where, val);
        *(key[0] == 'l' ? &p->lock : &p->experts) = !strcmp(val, "on");
    } else {
        return 1;
    }
    return 0;
}

/* One --group value: NAME=GLOB[:KEY=VALUE,...]. The policy starts from BASE. */
static int parse_group(const char *cmd, const char *arg, const ferry_policy *base,
                       runopts_group *g)
{
    memset(g, 0, sizeof *g);
    g->device = -1;
    g->policy = *base;
    if (!(g->spec = strdup(arg)))
        return cli_error("out of memory");
    char *eq = strchr(g->spec, '=');
    if (!eq || eq == g->spec || !eq[1] || eq[1] == ':')
        return cli_usage_error(cmd, "--group '%s': expected NAME=GLOB[:KEY=VALUE,...]", arg);
    *eq = 0;
    g->name = g->spec;
    g->glob = eq + 1;
    if (!strcmp(g->name, "all") || !strcmp(g->name, "default"))
        return cli_usage_error(cmd, "--group '%s': the name '%s' is taken (every other tensor)",
                               arg, g->name);
    char *keys = strchr(eq + 1, ':');
    if (!keys)
        return 0;
    *keys++ = 0;
    char *save = NULL;
    for (char *tok = strtok_r(keys, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *val = strchr(tok, '=');
        if (!val || val == tok)
            return cli_usage_error(cmd, "--group '%s': '%s' is not KEY=VALUE", g->name, tok);
        *val++ = 0;
        char where[160];
        snprintf(where, sizeof where, "--group '%s': %s", g->name, tok);
        if (!strcmp(tok, "device")) {
            char *end;
            long d = strtol(val, &end, 10);
            if (!*val || *end || d < 0 || d >= FERRY_MAX_DEVICES)
                return cli_usage_error(cmd, "%s: '%s' is not a device id (0 the cpu, 1 --device)",
                                       where, val);
            g->device = (int)d;
            continue;
        }
        int rc = set_field(cmd, where, tok, val, &g->policy);
        if (rc == 1)
            return cli_usage_error(cmd, "--group '%s': unknown key '%s' (home, lazy, load, "
                                   "device, compute-dtype, lock, experts)", g->name, tok);
        if (rc)
            return rc;
    }
    return 0;
}

int runopts_collect_groups(const char *cmd, runopts *r, int *argc, char **argv)
{
    return collect_repeated(cmd, argc, argv, "--group", NULL, r->group_args, &r->n_groups,
                            RUNOPTS_MAX_GROUPS, "--group options");
}

int runopts_parse_groups(const char *cmd, runopts *r, const ferry_policy *base)
{
    for (int i = 0; i < r->n_groups; i++) {
        int rc = parse_group(cmd, r->group_args[i], base, &r->groups[i]);
        if (rc)
            return rc;
        for (int k = 0; k < i; k++)
            if (!strcmp(r->groups[k].name, r->groups[i].name))
                return cli_usage_error(cmd, "--group '%s' given twice", r->groups[i].name);
    }
    return 0;
}

int runopts_parse(const char *cmd, runopts *r)
{
    ferry_policy *p = &r->policy;
    memset(p, 0, sizeof *p);
    r->cmd = cmd;
    static const char *const keys[] = {"home", "load", "lazy", "compute-dtype"};
    const char *vals[] = {r->home, r->load, r->lazy, r->compute_dtype};
    for (int i = 0; i < 4; i++) {
        char where[32];
        snprintf(where, sizeof where, "--%s", keys[i]);
        if (vals[i] && set_field(cmd, where, keys[i], vals[i], p))
            return CLI_EXIT_USAGE;
    }
    if (r->lora_mode && strcmp(r->lora_mode, "merge") && strcmp(r->lora_mode, "runtime"))
        return cli_usage_error(cmd, "--lora-mode: '%s' is not merge or runtime", r->lora_mode);
    if (r->budget && parse_budget(cmd, r))
        return CLI_EXIT_USAGE;
    /* groups start from the plain options; the compute device and split are filled at open */
    return runopts_parse_groups(cmd, r, p) ? CLI_EXIT_USAGE : 0;
}

int runopts_parse_args(const char *cmd, runopts *r, int *argc, char **argv,
                       const cli_opt *extra, size_t n_extra, int *npos)
{
    cli_opt opts[32];
    size_t no = 0;
    if (n_extra > sizeof opts / sizeof opts[0] - 8)
        return cli_usage_error(cmd, "too many options");
    runopts_add(r, opts, &no);
    for (size_t i = 0; i < n_extra; i++)
        opts[no++] = extra[i];
    if (runopts_collect_adapters(cmd, r, argc, argv) || runopts_collect_groups(cmd, r, argc, argv))
        return CLI_EXIT_USAGE;
    int prc = cli_parse(cmd, *argc, argv, opts, no, npos);
    if (prc)
        return prc;
    return runopts_parse(cmd, r);
}

void runopts_free(runopts *r)
{
    for (int i = 0; i < RUNOPTS_MAX_GROUPS; i++) {
        free(r->groups[i].spec);
        r->groups[i].spec = NULL;
    }
}

/* The exit status of ferry_add_device's RC on F for option OPT: a spec that does not parse is a
 * usage error (2); a device that is not there, or fails, is a failure (1). Prints the message. */
static int device_error(ferry *f, int rc, const char *opt)
{
    if (!rc)
        return 0;
    fprintf(stderr, "ferry: %s: %s\n", opt, ferry_errmsg(f));
    return rc == FERRY_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
}

int runopts_check_device(const char *spec)
{
    if (!spec || !strcmp(spec, "cpu"))
        return 0;
    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    int rc = device_error(f, ferry_add_device(f, spec, NULL), "--device");
    ferry_destroy(f);
    return rc;
}

/* Adds the devices of --split and fills the policy's split. A trailing ":WEIGHT" is a number after
 * the spec's own colons: cpu:W, sim:CAP:W, cuda:N:W. */
int runopts_split(const char *cmd, const char *split, ferry *f, ferry_policy *policy)
{
    char *copy = strdup(split), *save = NULL;
    if (!copy)
        return cli_error("out of memory");
    int rc = 0, k = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        if (k >= FERRY_MAX_SPLIT) {
            rc = cli_usage_error(cmd, "--split: at most %d devices", FERRY_MAX_SPLIT);
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
                rc = cli_usage_error(cmd, "--split: bad weight '%s' in '%s'", last + 1, tok);
                break;
            }
            w = (float)v;
            *last = 0;
        }
        int dev = 0;
        if (strcmp(tok, "cpu") != 0 &&
            (rc = device_error(f, ferry_add_device(f, tok, &dev), "--split")))
            break;
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
    return runopts_split(r->cmd, r->split, f, &r->policy);
}

int runopts_add_groups(runopts *r, ferry *f)
{
    for (int i = 0; i < r->n_groups; i++) {
        runopts_group *g = &r->groups[i];
        ferry_policy p = g->policy;
        if (g->device >= 0) {
            if (g->device >= ferry_device_count(f))
                return cli_usage_error(r->cmd, "--group '%s': device=%d, but there %s only %d "
                                       "device%s (0 the cpu, then --device, --split)", g->name,
                                       g->device, ferry_device_count(f) == 1 ? "is" : "are",
                                       ferry_device_count(f),
                                       ferry_device_count(f) == 1 ? "" : "s");
            p.compute_device = g->device;
            p.n_split = 0; /* one device named: not split */
        } else {
            p.compute_device = r->policy.compute_device;
            p.n_split = r->policy.n_split;
            memcpy(p.split_devices, r->policy.split_devices, sizeof p.split_devices);
            memcpy(p.split_weights, r->policy.split_weights, sizeof p.split_weights);
        }
        if (ferry_group_add(f, g->name, g->glob, &p))
            return cli_error("--group '%s': %s", g->name, ferry_errmsg(f));
    }
    return 0;
}

int runopts_adapter(const char *cmd, const char *spec, char **path, float *mult)
{
    struct stat st;
    const char *colon = strrchr(spec, ':');
    *mult = 1.0f;
    *path = NULL;
    if (!colon || stat(spec, &st) == 0) {
        *path = strdup(spec); /* a name that exists as given is taken whole */
    } else {
        char *end;
        errno = 0;
        double m = strtod(colon + 1, &end);
        if (!colon[1] || *end || errno == ERANGE || !isfinite(m) || fabs(m) > FLT_MAX)
            return cli_usage_error(cmd, "-a %s: bad multiplier '%s' (expected PATH[:NUMBER])",
                                   spec, colon + 1);
        *mult = (float)m;
        *path = strndup(spec, (size_t)(colon - spec));
    }
    if (!*path)
        return cli_error("out of memory");
    if (!**path) {
        free(*path);
        *path = NULL;
        return cli_usage_error(cmd, "-a: no path in '%s'", spec);
    }
    return 0;
}

int runopts_open(runopts *r, char **files, int nfiles, ferry **out)
{
    /* the adapters' multipliers are checked before any file is opened */
    for (int i = 0; i < r->n_adapters; i++) {
        char *path;
        float mult;
        if (runopts_adapter(r->cmd, r->adapters[i], &path, &mult))
            return CLI_EXIT_USAGE;
        free(path);
    }
    ferry *f = ferry_create(NULL);
    if (!f)
        return cli_error("out of memory");
    /* set after creation, so that a budget the host cannot hold is refused with the reason */
    if (r->host_budget && ferry_set_budget(f, 0, r->host_budget)) {
        cli_error("%s", ferry_errmsg(f));
        ferry_destroy(f);
        return CLI_EXIT_FAIL;
    }
    int dev = 0, rc;
    if (r->device && strcmp(r->device, "cpu") != 0 &&
        (rc = device_error(f, ferry_add_device(f, r->device, &dev), "--device"))) {
        ferry_destroy(f);
        return rc;
    }
    r->policy.compute_device = dev;
    if (r->split && (rc = add_split(r, f))) {
        ferry_destroy(f);
        return rc;
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
    if ((rc = runopts_add_groups(r, f))) {
        ferry_destroy(f);
        return rc;
    }
    if (r->own_groups && r->own_groups(f, &r->policy, r->groups_arg)) {
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
        char *path;
        float mult;
        if (runopts_adapter(r->cmd, r->adapters[i], &path, &mult)) {
            ferry_destroy(f);
            return CLI_EXIT_USAGE;
        }
        rc = ferry_lora_add(f, path, mult, NULL, NULL);
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

int runopts_check_output(const runopts *r, const char *cmd, const char *what, const char *out,
                         ferry *f, char **real)
{
    /* an adapter argument may be "PATH:MULT": both spellings are candidates for the input */
    char *ins[2 * RUNOPTS_MAX_ADAPTERS];
    size_t nin = 0;
    for (int i = 0; i < r->n_adapters; i++) {
        const char *colon = strrchr(r->adapters[i], ':');
        if ((ins[nin] = strdup(r->adapters[i])) != NULL)
            nin++;
        if (colon && (ins[nin] = strdup(r->adapters[i])) != NULL)
            ins[nin++][colon - r->adapters[i]] = 0;
    }
    int rc = cli_check_output(cmd, what, out, (const char *const *)ins, nin, "adapter",
                              ferry_catalog_of(f), "model", real);
    for (size_t i = 0; i < nin; i++)
        free(ins[i]);
    return rc;
}
