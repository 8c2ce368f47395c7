/*
 * slice.c — slices: a contiguous range of a tensor's outermost rows (one expert of a MoE tensor,
 * a block of an embedding table) as a residency unit of its own.
 *
 * A slice is a ferry_tensor like a split part: its info is the parent's with the outermost
 * dimension cut to the range (offset and size its own bytes in the file), it is registered in
 * ferry.all (so the schedule, eviction and prefetch number it), has its own copies, and takes its
 * placement from the parent's group. Unlike a part, it is never staged as part of its parent: the
 * parent and its slices are independent units that may be held at the same time.
 */
#include <stdlib.h>
#include <string.h>

#include "core/load.h"

uint64_t ferry__outer_rows(const ferry_tensor *t)
{
    const ferry_tensor_info *in = &t->info;
    if (!in->ndim)
        return 0;
    return (uint64_t)in->shape[in->format == FERRY_FORMAT_GGUF ? in->ndim - 1 : 0];
}

/* Checks that T can be cut into outermost rows: *ROW_BYTES and *ROW_ELEMS of one. */
static int outer_row(const ferry_tensor *t, uint64_t *row_bytes, uint64_t *row_elems,
                     ferry__err *e)
{
    const ferry_tensor_info *in = &t->info;
    uint64_t outer = ferry__outer_rows(t);
    if (in->ndim == 0)
        return ferry__fail(e, FERRY_EINVAL, "tensor '%s': a scalar has no rows to slice",
                           in->name);
    if (outer == 0 || in->n_elems % outer)
        return ferry__fail(e, FERRY_EINVAL, "tensor '%s': its outermost dimension is empty",
                           in->name);
    *row_elems = in->n_elems / outer;
    /* a quantized row must be whole blocks, or the cut would fall inside one */
    if (ferry_dtype_nbytes(in->dtype, *row_elems, row_bytes) != 0 ||
        *row_bytes * outer != in->nbytes)
        return ferry__fail(e, FERRY_EINVAL,
                           "tensor '%s': a row of its outermost dimension (%llu elements) is not "
                           "whole blocks of %s, so it cannot be cut there",
                           in->name, (unsigned long long)*row_elems, ferry_dtype_name(in->dtype));
    return 0;
}

int64_t ferry__layer_of(const char *name)
{
    const char *b = strstr(name, "blk.");
    while (b) {
        const char *d = b + 4;
        int64_t n = 0;
        int digits = 0;
        while (*d >= '0' && *d <= '9' && digits < 9)
            n = n * 10 + (*d++ - '0'), digits++;
        if (digits && *d == '.')
            return n;
        b = strstr(b + 1, "blk.");
    }
    return -1;
}

int ferry__moe_add(ferry *f, ferry_tensor *t, ferry__err *e)
{
    int64_t layer = ferry__layer_of(t->parent->info.name);
    size_t g = 0;
    while (g < f->moe.n_groups && f->moe.layer[g] != layer)
        g++;
    if (g == f->moe.n_groups) {
        int64_t *l = realloc(f->moe.layer, (g + 1) * sizeof *l);
        if (l)
            f->moe.layer = l;
        uint64_t *gp = realloc(f->moe.group_prep, (g + 1) * sizeof *gp);
        if (gp)
            f->moe.group_prep = gp;
        if (!l || !gp)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory for a slice of '%s'",
                               t->parent->info.name);
        gp[g] = 0;
        l[g] = layer;
        f->moe.n_groups = g + 1;
    }
    if (t->uid >= f->moe.n_ids) {
        size_t n = f->moe.n_ids * 2 > t->uid + 1 ? f->moe.n_ids * 2 : (size_t)t->uid + 64;
        uint32_t *gr = realloc(f->moe.group, n * sizeof *gr);
        if (!gr)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory for a slice of '%s'",
                               t->parent->info.name);
        memset(gr + f->moe.n_ids, 0, (n - f->moe.n_ids) * sizeof *gr);
        f->moe.group = gr;
        f->moe.p.group = gr; /* the policy's ids are all below the old size */
        f->moe.n_ids = n;
    }
    f->moe.group[t->uid] = (uint32_t)g;
    if (ferry__moe_policy_grow(&f->moe.p, f->moe.n_ids, f->moe.group, f->moe.n_groups))
        return ferry__fail(e, FERRY_ENOMEM, "out of memory for a slice of '%s'",
                           t->parent->info.name);
    return 0;
}

void ferry__moe_used(ferry *f, ferry_tensor *const *u, size_t nu)
{
    uint64_t dense = 0, expert = 0;
    uint32_t most = 0;
    /* each layer this prepare uses counts one prepare more; its units are its latest choice */
    for (size_t i = 0; i < nu; i++)
        if (ferry__expert_unit(f, u[i]))
            u[i]->moe_prep = 0;
    for (size_t i = 0; i < nu; i++)
        if (ferry__expert_unit(f, u[i]) && !u[i]->moe_prep) {
            uint32_t g = f->moe.group[u[i]->uid];
            uint64_t now = ++f->moe.group_prep[g];
            for (size_t j = i; j < nu; j++)
                if (ferry__expert_unit(f, u[j]) && f->moe.group[u[j]->uid] == g)
                    u[j]->moe_prep = now;
        }
    for (size_t i = 0; i < nu; i++) {
        if (!ferry__expert_unit(f, u[i])) {
            dense += u[i]->out_bytes;
            continue;
        }
        expert += u[i]->out_bytes;
        ferry__evict_used(&f->moe.ev, u[i]->uid, u[i]->comp.mem.size, 0);
        /* the floor: the most units of one layer used together (one token's choice) */
        uint32_t g = f->moe.group[u[i]->uid], same = 0;
        for (size_t j = 0; j < nu; j++)
            same += ferry__expert_unit(f, u[j]) && f->moe.group[u[j]->uid] == g;
        if (same > most)
            most = same;
    }
    if (most > f->moe.p.floor)
        f->moe.p.floor = most;
    if (dense > f->moe.dense_set)
        f->moe.dense_set = dense;
    if (expert > f->moe.expert_set)
        f->moe.expert_set = expert;
}

int ferry__slice_get(ferry *f, ferry_tensor *t, uint64_t first, uint64_t count,
                     ferry_tensor **out, ferry__err *e)
{
    if (t->is_slice) {
        /* a slice of a slice is a slice of the parent */
        if (first > t->slice_count || count > t->slice_count - first || !count)
            return ferry__fail(e, FERRY_EINVAL, "slice [%llu:%llu] of '%s', which has %llu rows",
                               (unsigned long long)first, (unsigned long long)(first + count),
                               t->info.name, (unsigned long long)t->slice_count);
        return ferry__slice_get(f, t->parent, t->slice_first + first, count, out, e);
    }
    if (t->parent)
        return ferry__fail(e, FERRY_EINVAL, "'%s' is a part of a split tensor: slice '%s' instead",
                           t->info.name, t->parent->info.name);
    uint64_t row_bytes = 0, row_elems = 0;
    int rc = outer_row(t, &row_bytes, &row_elems, e);
    if (rc)
        return rc;
    uint64_t outer = ferry__outer_rows(t);
    if (!count || first >= outer || count > outer - first)
        return ferry__fail(e, FERRY_EINVAL,
                           "tensor '%s': slice [%llu:%llu] (%llu rows) is outside its outermost "
                           "dimension of %llu",
                           t->info.name, (unsigned long long)first,
                           (unsigned long long)first + count, (unsigned long long)count,
                           (unsigned long long)outer);
    for (size_t i = 0; i < t->n_slices; i++)
        if (t->slices[i]->slice_first == first && t->slices[i]->slice_count == count) {
            *out = t->slices[i];
            return 0;
        }
    if (t->n_slices == t->cap_slices) {
        size_t cap = t->cap_slices ? t->cap_slices * 2 : 8;
        ferry_tensor **s = realloc(t->slices, cap * sizeof *s);
        if (!s)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory");
        t->slices = s;
        t->cap_slices = cap;
    }
    ferry_tensor *c = calloc(1, sizeof *c);
    char *name = c ? ferry__asprintf("%s[%llu:%llu]", t->info.name, (unsigned long long)first,
                                     (unsigned long long)(first + count))
                   : NULL;
    if (!c || !name || ferry__register(f, c)) {
        free(c), free(name);
        return ferry__fail(e, FERRY_ENOMEM, "out of memory for a slice of '%s'", t->info.name);
    }
    c->owner = f;
    c->id = t->id;
    c->info = t->info;
    c->info.name = c->own_name = name;
    c->info.offset = t->info.offset + first * row_bytes;
    c->info.nbytes = count * row_bytes;
    c->info.n_elems = count * row_elems;
    c->info.shape[t->info.format == FERRY_FORMAT_GGUF ? t->info.ndim - 1 : 0] = (int64_t)count;
    if (t->info.ndim == 1)
        c->info.row_elems = count;
    c->info.n_rows = c->info.row_elems ? c->info.n_elems / c->info.row_elems : 0;
    c->file = t->file;
    c->group = -1;
    c->parent = t;
    c->is_slice = 1;
    c->slice_first = first;
    c->slice_count = count;
    c->dev_override = -1;
    int rc2 = ferry__moe_add(f, c, e);
    if (rc2) {
        c->removed = 1; /* registered: freed with the manager */
        return rc2;
    }
    t->slices[t->n_slices++] = c;
    *out = c;
    return 0;
}

int ferry_slice(ferry *f, ferry_tensor *t, uint64_t first, uint64_t count, ferry_tensor **out)
{
    if (!f || !t || !out)
        return FERRY_EINVAL;
    *out = NULL;
    if (t->owner != f)
        return ferry__fail_thread(f, FERRY_EINVAL, "tensor '%s' belongs to another manager",
                                  t->info.name);
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry_tensor *s = NULL;
    int rc = ferry__usable(f, t, e);
    if (!rc)
        rc = ferry__slice_get(f, t, first, count, &s, e);
    if (!rc)
        rc = ferry__usable(f, s, e); /* binds it: its info and placement are settled */
    pthread_mutex_unlock(&f->lock);
    if (!rc)
        *out = s;
    return ferry__publish(f, rc, e);
}
