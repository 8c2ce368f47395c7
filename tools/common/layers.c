/*
 * layers.c — cutting a model into layers (see layers.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "layers.h"

size_t layer_key_len(const char *name)
{
    const char *p = name;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        int digits = len > 0;
        for (size_t i = 0; i < len; i++)
            digits &= p[i] >= '0' && p[i] <= '9';
        if (digits)
            return (size_t)(p - name) + len;
        if (!dot)
            break;
        p = dot + 1;
    }
    const char *last = strrchr(name, '.');
    return last ? (size_t)(last - name) : strlen(name);
}

int build_sets(ferry *f, layer_set **out, size_t *n_out)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    layer_set *sets = calloc(n ? n : 1, sizeof *sets);
    ferry_tensor **all = calloc(n ? n : 1, sizeof *all);
    if (!sets || !all) {
        free(sets), free(all);
        return cli_error("out of memory");
    }
    size_t ns = 0, k = 0, prev_len = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        ferry_tensor *t = ferry_find(f, info.name);
        if (!t)
            continue;
        size_t len = layer_key_len(info.name);
        if (!prev || len != prev_len || strncmp(prev, info.name, len) != 0)
            sets[ns++].t = &all[k];
        all[k++] = t;
        sets[ns - 1].n++;
        sets[ns - 1].bytes += info.nbytes;
        prev = info.name;
        prev_len = len;
    }
    if (!ns)
        sets[0].t = all; /* so that free_sets frees it */
    *out = sets;
    *n_out = ns;
    return 0;
}

void free_sets(layer_set *sets)
{
    if (sets)
        free(sets[0].t);
    free(sets);
}

int split_large_sets(layer_set **sets, size_t *n, uint64_t max_bytes)
{
    size_t total = 0;
    for (size_t k = 0; k < *n; k++)
        total += (*sets)[k].bytes > max_bytes ? (*sets)[k].n : 1;
    if (total == *n)
        return 0;
    layer_set *out = calloc(total, sizeof *out);
    if (!out)
        return cli_error("out of memory");
    size_t m = 0;
    for (size_t k = 0; k < *n; k++) {
        const layer_set *s = &(*sets)[k];
        if (s->bytes <= max_bytes) {
            out[m++] = *s;
            continue;
        }
        for (size_t i = 0; i < s->n; i++) {
            ferry_tensor_info info;
            uint64_t nb = ferry_tensor_get_info(s->t[i], &info) == 0 ? info.nbytes : 0;
            out[m++] = (layer_set){.t = &s->t[i], .n = 1, .bytes = nb};
        }
    }
    free(*sets);
    *sets = out;
    *n = total;
    return 0;
}

uint64_t sets_working_set(const layer_set *sets, size_t n)
{
    if (n == 1)
        return sets[0].bytes;
    uint64_t w = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t pair = sets[k].bytes + sets[(k + 1) % n].bytes;
        w = pair > w ? pair : w;
    }
    return w;
}

/* Rows of the outermost dimension (ferry_slice's): GGUF lists dimensions innermost first. */
static uint64_t outer_rows(const ferry_tensor_info *info)
{
    return (uint64_t)(info->format == FERRY_FORMAT_GGUF ? info->shape[info->ndim - 1]
                                                        : info->shape[0]);
}

int split_large_tensors(ferry *f, layer_set **sets, size_t *n, uint64_t max_bytes)
{
    if (!max_bytes)
        return 0;
    /* pieces[k]: how many row ranges set k's lone tensor becomes (1: kept whole) */
    size_t *pieces = calloc(*n ? *n : 1, sizeof *pieces);
    if (!pieces)
        return cli_error("out of memory");
    size_t total = 0, entries = 0;
    for (size_t k = 0; k < *n; k++) {
        const layer_set *s = &(*sets)[k];
        pieces[k] = 1;
        ferry_tensor_info info;
        if (s->n == 1 && s->bytes > max_bytes && ferry_tensor_get_info(s->t[0], &info) == 0 &&
            info.ndim >= 2) {
            uint64_t outer = outer_rows(&info);
            uint64_t want = (s->bytes + max_bytes - 1) / max_bytes;
            pieces[k] = (size_t)(want < outer ? want : outer);
        }
        total += pieces[k];
        entries += pieces[k] > 1 ? pieces[k] : s->n;
    }
    if (total == *n) {
        free(pieces);
        return 0;
    }
    layer_set *out = calloc(total, sizeof *out);
    ferry_tensor **all = calloc(entries, sizeof *all);
    if (!out || !all) {
        free(out), free(all), free(pieces);
        return cli_error("out of memory");
    }
    size_t m = 0, e = 0;
    for (size_t k = 0; k < *n; k++) {
        const layer_set *s = &(*sets)[k];
        if (pieces[k] == 1) {
            out[m] = (layer_set){.t = &all[e], .n = s->n, .bytes = s->bytes};
            for (size_t i = 0; i < s->n; i++)
                all[e++] = s->t[i];
            m++;
            continue;
        }
        ferry_tensor_info info;
        ferry_tensor_get_info(s->t[0], &info);
        uint64_t outer = outer_rows(&info);
        for (size_t p = 0; p < pieces[k]; p++) {
            uint64_t r0 = outer * p / pieces[k], r1 = outer * (p + 1) / pieces[k];
            ferry_tensor *sl = NULL;
            if (ferry_slice(f, s->t[0], r0, r1 - r0, &sl)) {
                int rc = cli_error("%s", ferry_errmsg(f));
                free(out), free(all), free(pieces);
                return rc;
            }
            all[e] = sl;
            out[m++] = (layer_set){.t = &all[e++], .n = 1, .bytes = ferry_tensor_nbytes(sl)};
        }
    }
    free(pieces);
    free((*sets)[0].t);
    free(*sets);
    *sets = out;
    *n = total;
    return 0;
}
