/*
 * cmd_demo.c — `ferry demo`: with no arguments, shows ferry on a model it makes itself. For now it
 * generates a sample llama model (f16, 256 MiB) into the user's cache folder — reused on later
 * runs when it is still there and whole — and opens it into a catalog, timing the open.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "synth.h"

static const char *HELP =
    "usage: ferry demo [--dir DIR] [--size SIZE] [--seed N]\n"
    "\n"
    "Generates a sample llama model (f16) into the cache folder ($XDG_CACHE_HOME/ferry or\n"
    "~/.cache/ferry), reusing it when it is already there, and inspects it.\n"
    "\n"
    "options:\n"
    "  --dir DIR      folder for the model instead of the cache folder\n"
    "  --size SIZE    size of the sample model (default 256MiB)\n"
    "  --seed N       seed of the sample model (default 0)\n"
    "  -q, --quiet    no progress bar\n"
    "  -h, --help     this text\n";

/* mkdir -p DIR; 0 or -1 with errno. */
static int make_dirs(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int cache_dir(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(buf, len, "%s/ferry", xdg);
    else if (home && *home)
        snprintf(buf, len, "%s/.cache/ferry", home);
    else
        return -1;
    return 0;
}

/* 1 when PATH opens and holds exactly the planned tensors (names, dtypes, sizes) and seed. */
static int reusable(const char *path, const synth_model *m)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return 0;
    int ok = ferry_catalog_add(c, path, NULL) == 0 && ferry_catalog_count(c) == m->n &&
             ferry_catalog_total_bytes(c) == m->total_bytes;
    for (size_t i = 0; ok && i < m->n; i++) {
        ferry_tensor_info t;
        ok = ferry_catalog_tensor(c, i, &t) == 0 && strcmp(t.name, m->t[i].name) == 0 &&
             t.dtype == m->t[i].dtype && t.nbytes == m->t[i].nbytes;
    }
    uint64_t seed = 0;
    ok = ok && ferry_catalog_get_u64(c, "ferry.seed", &seed) == 0 && seed == m->cfg.seed;
    ferry_catalog_destroy(c);
    return ok;
}

int cmd_demo(int argc, char **argv)
{
    const char *dir = NULL, *size = NULL, *seed = NULL;
    int quiet = 0, npos = 0;
    cli_opt opts[] = {
        {"dir", 0, CLI_OPT_STRING, &dir},
        {"size", 0, CLI_OPT_STRING, &size},
        {"seed", 0, CLI_OPT_STRING, &seed},
        {"quiet", 'q', CLI_OPT_FLAG, &quiet},
    };
    int rc = cli_parse("demo", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos > 0)
        return cli_usage_error("demo", "unexpected argument '%s'", argv[1]);

    synth_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = SYNTH_LLAMA;
    cfg.format = FERRY_FORMAT_GGUF;
    cfg.dtype = FERRY_DTYPE_F16;
    cfg.target_bytes = UINT64_C(256) << 20;
    if (size && (rc = cli_arg_size("demo", "size", size, &cfg.target_bytes)) != 0)
        return rc;
    if (cfg.target_bytes == 0)
        return cli_usage_error("demo", "--size: must be more than 0");
    if (seed && (rc = cli_arg_u64("demo", "seed", seed, 0, UINT64_MAX, &cfg.seed)) != 0)
        return rc;

    char folder[4096], path[4200], a[32];
    if (dir)
        snprintf(folder, sizeof folder, "%s", dir);
    else if (cache_dir(folder, sizeof folder) != 0)
        return cli_error("no cache folder: set HOME or XDG_CACHE_HOME, or give --dir");
    if (make_dirs(folder) != 0)
        return cli_error("%s: cannot create the folder: %s", folder, strerror(errno));

    synth_model m;
    char err[256];
    rc = synth_plan(&cfg, &m, err, sizeof err);
    if (rc != 0) {
        synth_free(&m);
        return rc == CLI_EXIT_USAGE ? cli_usage_error("demo", "%s", err) : cli_error("%s", err);
    }
    char tag[32];
    if (cfg.target_bytes % (UINT64_C(1) << 20) == 0)
        snprintf(tag, sizeof tag, "%lluMiB", (unsigned long long)(cfg.target_bytes >> 20));
    else
        snprintf(tag, sizeof tag, "%llu", (unsigned long long)cfg.target_bytes);
    snprintf(path, sizeof path, "%s/demo-llama-%s-%s-seed%llu.gguf", folder,
             ferry_dtype_name(cfg.dtype), tag, (unsigned long long)cfg.seed);

    printf("ferry demo\n\n");
    printf("model     %s\n", path);
    printf("          llama, %u layers, dim %u, ff %u, vocab %u, f16, %zu tensors, %s\n",
           m.cfg.layers, m.cfg.dim, m.cfg.ff, m.cfg.vocab, m.n, cli_size(m.total_bytes, a));
    if (reusable(path, &m)) {
        printf("          reused from an earlier run\n");
    } else {
        fflush(stdout);
        double t0 = cli_now();
        rc = synth_write(&m, path, !quiet);
        double secs = cli_now() - t0;
        if (rc != 0) {
            synth_free(&m);
            return rc;
        }
        printf("          generated in %.2f s (%.0f MB/s)\n", secs,
               secs > 0 ? (double)m.total_bytes / secs / 1e6 : 0.0);
    }
    synth_free(&m);

    /* the catalog: what every later step starts from */
    ferry_catalog *c = ferry_catalog_create();
    if (!c)
        return cli_error("out of memory");
    double t0 = cli_now();
    int e = ferry_catalog_add(c, path, NULL);
    double secs = cli_now() - t0;
    if (e != 0) {
        rc = cli_fail(path, ferry_catalog_errmsg(c), e);
        ferry_catalog_destroy(c);
        return rc;
    }
    const char *arch = "?";
    ferry_catalog_get_str(c, "general.architecture", &arch);
    printf("\ncatalog   %zu tensors, %s, architecture %s, opened in %.2f ms\n",
           ferry_catalog_count(c), cli_size(ferry_catalog_total_bytes(c), a), arch,
           secs * 1e3);
    ferry_catalog_destroy(c);
    return CLI_EXIT_OK;
}
