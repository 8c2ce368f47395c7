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
