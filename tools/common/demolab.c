/*
 * demolab.c — what `ferry demo` measures on its sample model: loads beside the machine's limits
 * (limits.c), streaming through a quarter of the model, and a LoRA adapter merged and switched.
 * The figures go to the command, which prints them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demolab.h"
#include "gen_lora.h"
#include "limits.h"

int demolab_make_dirs(const char *dir)
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

int demolab_cache_dir(char *buf, size_t len)
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

int demolab_reusable(const char *path, const synth_model *m)
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

/* A manager on PATH with one policy for every tensor; NULL after printing why. */
static ferry *open_model(const char *path, const ferry_policy *p, uint64_t host_budget)
{
    ferry *f = ferry_create(NULL);
    if (!f) {
        cli_error("out of memory");
        return NULL;
    }
    if ((host_budget && ferry_set_budget(f, 0, host_budget)) || ferry_open(f, path, NULL) ||
        ferry_group_add(f, "all", "*", p)) {
        cli_fail(path, ferry_errmsg(f), -1);
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

double demolab_timed_load(const char *path, const ferry_policy *p, int cold)
{
    if (cold)
        limits_drop_cache(path);
    double t0 = cli_now();
    ferry *f = open_model(path, p, 0);
    if (!f)
        return -1;
    int rc = ferry_load_group(f, NULL);
    double s = cli_now() - t0;
    if (rc)
        cli_fail(path, ferry_errmsg(f), rc);
    ferry_destroy(f);
    return rc ? -1 : s;
}

static double median3(double a, double b, double c)
{
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

int demolab_load(const char *path, uint64_t model, demolab_figures *fig)
{
    ferry_policy direct = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_DIRECT};
    ferry_policy read = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ};
    ferry_policy zc = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_AUTO};
    double lim[3], fr[3], cold[3], mc[3], warm[3];
    /* the disk's best reader count first (ferry bench sweeps more: 1/2/4/8 x 16/64 MiB) */
    unsigned readers = 1;
    double best = 0;
    for (unsigned r = 1; r <= 4; r *= 2) {
        double g = limits_direct_read(path, r, UINT64_C(16) << 20);
        if (g > best)
            best = g, readers = r;
    }
    for (int i = 0; i < 3; i++) { /* limit, ferry, limit, ferry: a drifting disk shows in both */
        lim[i] = limits_direct_read(path, readers, UINT64_C(16) << 20);
        double s = demolab_timed_load(path, &direct, 1);
        cold[i] = s > 0 ? model / s / 1e9 : -1;
        fr[i] = limits_fresh_memory_best(model, NULL);
    }
    limits_warm_file(path);
    for (int i = 0; i < 3; i++) {
        mc[i] = limits_memcpy(model < (UINT64_C(256) << 20) ? model : UINT64_C(256) << 20);
        double s = demolab_timed_load(path, &read, 0);
        warm[i] = s > 0 ? model / s / 1e9 : -1;
    }
    fig->direct = median3(lim[0], lim[1], lim[2]);
    fig->fresh = median3(fr[0], fr[1], fr[2]);
    fig->cold = median3(cold[0], cold[1], cold[2]);
    fig->memcpy_bw = median3(mc[0], mc[1], mc[2]);
    fig->warm = median3(warm[0], warm[1], warm[2]);
    fig->zero_copy_s = demolab_timed_load(path, &zc, 0);
    if (fig->cold < 0 || fig->warm < 0 || fig->zero_copy_s < 0)
        return CLI_EXIT_FAIL;
    return CLI_EXIT_OK;
}

int demolab_stream_open(const char *path, uint64_t model, demolab_stream *s)
{
    memset(s, 0, sizeof *s);
    uint64_t budget = model / 4;
    ferry_policy disk = {.home = FERRY_HOME_DISK};
    if (!(s->f = open_model(path, &disk, 0)))
        return CLI_EXIT_FAIL;
    if (build_sets(s->f, &s->sets, &s->nsets))
        return CLI_EXIT_FAIL;
    layer_set *sets = s->sets;
    size_t nsets = s->nsets;
    uint64_t max_cols = 1, max_rows = 1, n = 0;
    for (size_t k = 0; k < nsets; k++)
        for (size_t i = 0; i < sets[k].n; i++, n++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(sets[k].t[i], &info);
            max_cols = info.row_elems > max_cols ? info.row_elems : max_cols;
            max_rows = info.n_rows > max_rows ? info.n_rows : max_rows;
        }
    /* W: the layer in use plus the one being prefetched, at their largest (wrapping around) */
    uint64_t w = sets_working_set(sets, nsets);
    s->x = calloc(max_cols, sizeof *s->x);
    s->y = calloc(max_rows, sizeof *s->y);
    for (uint64_t i = 0; s->x && i < max_cols; i++)
        s->x[i] = 0.001f * (float)(i % 97);
    /* A small model's quarter may not hold two layers at once: then the budget is the working
     * set plus the page of headroom each buffer has for direct I/O. */
    s->why = "a quarter";
    if (budget < w + n * 8192) {
        budget = w + n * 8192;
        s->why = "raised to the working set";
    }
    ferry_set_budget(s->f, 0, budget);
    s->budget = budget;
    s->working_set = w;
    for (size_t k = 0; k < nsets; k++) {
        ferry_tensor_info info;
        ferry_tensor_get_info(sets[k].t[0], &info);
        size_t len = layer_key_len(info.name);
        s->blocks += len > 0 && info.name[len - 1] >= '0' && info.name[len - 1] <= '9';
    }
    return 0;
}

int demolab_stream_run(demolab_stream *s, const char *path, uint64_t model, int quiet,
                       demolab_figures *fig)
{
    ferry *f = s->f;
    layer_set *sets = s->sets;
    size_t nsets = s->nsets;
    limits_drop_cache(path);
    cli_progress bar;
    cli_progress_start(&bar, "stream", 4 * nsets, !quiet);
    int rc = s->x && s->y ? 0 : cli_error("out of memory");
    for (int p = 0; p < 4 && !rc; p++) {
        ferry_stats s0, s1;
        ferry_get_stats(f, &s0);
        double t0 = cli_now();
        for (size_t k = 0; k < nsets && !rc; k++) {
            if ((rc = ferry_prepare(f, sets[k].t, sets[k].n)) != 0) {
                cli_fail(path, ferry_errmsg(f), rc);
                break;
            }
            for (size_t i = 0; i < sets[k].n; i++) {
                ferry_tensor_info info;
                ferry_tensor_get_info(sets[k].t[i], &info);
                if (info.ndim >= 2)
                    ferry_matvec(ferry_tensor_dtype(sets[k].t[i]),
                                 ferry_tensor_data(sets[k].t[i]), info.n_rows, info.row_elems,
                                 s->x, s->y);
            }
            ferry_release(f, sets[k].t, sets[k].n);
            cli_progress_update(&bar, (uint64_t)p * nsets + k + 1);
        }
        s->pass_s[p] = cli_now() - t0;
        ferry_get_stats(f, &s1);
        s->pass_read[p] = s1.bytes_read - s0.bytes_read;
    }
    cli_progress_end(&bar);
    if (rc)
        return CLI_EXIT_FAIL;
    ferry_get_stats(f, &s->stats);
    fig->stream_read = s->pass_read[3];
    fig->stream_s = s->pass_s[3];
    fig->stream_opt = model - s->budget + s->working_set;
    fig->budget = s->budget;
    fig->host_peak = s->stats.peak_bytes[0];
    return 0;
}

void demolab_stream_close(demolab_stream *s)
{
    free(s->x);
    free(s->y);
    free_sets(s->sets);
    ferry_destroy(s->f);
    memset(s, 0, sizeof *s);
}

int demolab_lora_make(const char *path, const char *adapter)
{
    struct stat sb;
    if (stat(adapter, &sb) != 0 && ferry_gen_lora(path, adapter, 16, "peft", 7, 1) != 0)
        return CLI_EXIT_FAIL;
    return 0;
}

int demolab_lora(const char *path, const char *adapter, ferry_lora_info *info,
                 demolab_figures *fig)
{
    ferry_policy host = {.home = FERRY_HOME_HOST, .load = FERRY_LOAD_READ};
    ferry *f = open_model(path, &host, 0);
    if (!f)
        return CLI_EXIT_FAIL;
    int rc = ferry_load_group(f, NULL), id = -1;
    if (!rc)
        rc = ferry_lora_add(f, adapter, 1.0f, NULL, &id);
    if (!rc)
        rc = ferry_lora_get_info(f, id, info);
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n ? n : 1, sizeof *ts);
    for (size_t i = 0; ts && i < n; i++) {
        ferry_tensor_info ti;
        ferry_catalog_tensor(c, i, &ti);
        ts[i] = ferry_find(f, ti.name);
    }
    double t0 = cli_now();
    for (size_t i = 0; !rc && ts && i < n; i++)
        if (!(rc = ferry_prepare(f, &ts[i], 1)))
            ferry_release(f, &ts[i], 1);
    fig->merge_s = cli_now() - t0;
    ferry_stats s0, s1;
    ferry_get_stats(f, &s0);
    if (!rc)
        rc = ferry_lora_set_multiplier(f, id, 0.5f);
    t0 = cli_now();
    for (size_t i = 0; !rc && ts && i < n; i++)
        if (!(rc = ferry_prepare(f, &ts[i], 1)))
            ferry_release(f, &ts[i], 1);
    fig->switch_s = cli_now() - t0;
    ferry_get_stats(f, &s1);
    fig->switch_read = s1.bytes_read - s0.bytes_read;
    if (rc)
        cli_fail(path, ferry_errmsg(f), rc);
    free(ts);
    ferry_destroy(f);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
