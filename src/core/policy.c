/*
 * policy.c — from a tensor's group policy and size to its placement: lazy or not, zero-copy or
 * not, which device computes it, in which dtype, how many bytes each copy takes.
 *
 * ferry__decide is the one place these decisions are made; the real load and the dry run
 * (ferry_plan) both call it, so they cannot disagree. Laziness depends only on the policy and the
 * tensor's size — never on the load mode and never on whether this is a dry run (seed 002).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

static const ferry_policy default_policy = {0};

const ferry_policy *ferry__policy_of(const ferry *f, const ferry_tensor *t)
{
    if (t->group < 0 || (size_t)t->group >= f->place.n_groups)
        return &default_policy;
    return &f->place.groups[t->group].policy;
}

/* The group a tensor name falls in: the first rule that matches, or -1 (default). */
static int match_group(const ferry *f, const char *name)
{
    for (size_t i = 0; i < f->place.n_rules; i++) {
        const ferry__rule *r = &f->place.rules[i];
        if (!f->place.groups[r->group].removed && ferry__glob(r->pattern, name))
            return r->group;
    }
    return -1;
}

const ferry_policy *ferry__policy_ahead(const ferry *f, const ferry_tensor *t)
{
    if (t->bound || t->parent)
        return ferry__policy_of(f, t);
    int g = match_group(f, t->info.name);
    return g < 0 ? &default_policy : &f->place.groups[g].policy;
}

static int matches_any(char **patterns, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (ferry__glob(patterns[i], name))
            return 1;
    return 0;
}

int ferry__is_ignored(const ferry *f, const ferry_tensor *t)
{
    return t->bound ? t->ignored : matches_any(f->place.ignore, f->place.n_ignore, t->info.name);
}

uint64_t ferry__host_alloc_size(const ferry_tensor *t, int converted)
{
    /* Data read straight from the file is placed at offset % FERRY__IO_ALIGN inside a buffer
     * aligned to FERRY__IO_ALIGN, so that O_DIRECT can read into it. */
    uint64_t head = converted ? 0 : t->info.offset % FERRY__IO_ALIGN;
    uint64_t bytes = converted ? t->out_bytes : t->info.nbytes;
    uint64_t size;
    if (ferry__align_up(head + bytes, FERRY__IO_ALIGN, &size))
        return UINT64_MAX;
    return size ? size : FERRY__IO_ALIGN;
}

int ferry__decide(ferry *f, ferry_tensor *t, ferry__err *e)
{
    const ferry_policy *p = ferry__policy_of(f, t);
    uint64_t threshold = p->lazy_threshold ? p->lazy_threshold : FERRY_LAZY_DEFAULT_THRESHOLD;
    int dev = ferry__compute_device_of(f, t);
    if (dev < 0 || dev >= f->n_devs)
        return ferry__fail(e, FERRY_EINVAL,
                           "tensor '%s': group policy names device %d, but only %d devices exist",
                           t->info.name, dev, f->n_devs);
    /* A part's laziness is its parent's: the decision depends on the whole tensor's size. */
    uint64_t size = t->parent ? t->parent->info.nbytes : t->info.nbytes;
    t->lazy = !p->writable &&
              (p->lazy == FERRY_LAZY_ON || (p->lazy == FERRY_LAZY_AUTO && size >= threshold));
    t->compute_dev = dev;
    t->out_dtype = t->info.dtype;
    t->out_bytes = t->info.nbytes;
    if (p->convert && !t->lazy && p->compute_dtype != t->info.dtype) {
        if (!ferry_dtype_can_convert(t->info.dtype, p->compute_dtype))
            return ferry__fail(e, FERRY_EDTYPE,
                               "%s: tensor '%s': cannot convert %s to %s", t->info.file,
                               t->info.name, ferry_dtype_name(t->info.dtype),
                               ferry_dtype_name(p->compute_dtype));
        int rc = ferry_dtype_nbytes(p->compute_dtype, t->info.n_elems, &t->out_bytes);
        if (rc)
            return ferry__fail(e, rc,
                               "%s: tensor '%s': %llu elements are not whole blocks of %s",
                               t->info.file, t->info.name, (unsigned long long)t->info.n_elems,
                               ferry_dtype_name(p->compute_dtype));
        t->out_dtype = p->compute_dtype;
    }
    int rc = ferry__lora_decide(f, t, e);
    if (rc)
        return rc;
    /* zero-copy: the home copy is the mapping. On the host without a transform the engine gets
     * that pointer; otherwise it is the pristine source the staged copy is made from. */
    ferry_home home = ferry__effective_home(f, t);
    int staged = !f->devs[t->compute_dev].p.host_accessible || t->merge;
    t->zero_copy = !t->lazy && home == FERRY_HOME_HOST && (staged || !ferry__transformed(t)) &&
                   (p->load == FERRY_LOAD_MMAP || p->load == FERRY_LOAD_AUTO) && t->file->map;
    /* writable: the engine's copy is private; a staged copy already is, and its source may stay
     * the mapping (the engine never sees that) */
    if (p->writable && !staged)
        t->zero_copy = 0;
    /* decided before the cache is looked at, so that ferry_tensor_writable never depends on it */
    t->map_eligible = t->lazy || (t->zero_copy && !staged);
    /* AUTO maps what the page cache holds and reads the rest into private memory with O_DIRECT
     * (filling the cache through the mapping ran at readahead's pace, 1.1-1.35 GB/s on a virtio
     * disk that reads 1.6 GB/s with O_DIRECT, a direct read into a group load's arena at the
     * disk's), unless the manager measured the mapping faster on this machine (coldload.c) */
    t->auto_private = 0;
    if (t->zero_copy && p->load == FERRY_LOAD_AUTO && t->info.nbytes) {
        if (t->comp.state != FERRY__EMPTY || t->host.state != FERRY__EMPTY)
            t->zero_copy = t->comp.mapped || t->host.mapped; /* decided when it was loaded */
        else
            t->zero_copy = (f->cold.decided && f->cold.map) ||
                           ferry__iofile_cached(t->file, t->info.offset, t->info.nbytes) >=
                               FERRY__AUTO_MAP_CACHED;
        /* a private copy the host budget has no room for falls back to the mapping (enqueue) */
        t->auto_private = !t->zero_copy;
    }
    return 0;
}

int ferry__compute_device_of(const ferry *f, const ferry_tensor *t)
{
    const ferry_policy *p = ferry__policy_of(f, t);
    if (t->dev_override >= 0)
        return t->dev_override;
    return p->n_split >= 2 ? p->split_devices[0] : p->compute_device;
}

ferry_home ferry__effective_home(const ferry *f, const ferry_tensor *t)
{
    const ferry_policy *p = ferry__policy_of(f, t);
    int dev = ferry__compute_device_of(f, t);
    int host_side = dev < 0 || dev >= f->n_devs || f->devs[dev].p.host_accessible;
    if (p->home == FERRY_HOME_DEVICE && host_side)
        return FERRY_HOME_HOST;
    return p->home;
}

int ferry__register(ferry *f, ferry_tensor *t)
{
    if (f->n_all == f->cap_all) {
        size_t cap = f->cap_all ? f->cap_all * 2 : 256;
        ferry_tensor **all = realloc(f->all, cap * sizeof *all);
        if (!all)
            return FERRY_ENOMEM;
        f->all = all;
        f->cap_all = cap;
    }
    if (ferry__sched_resize(&f->sched, f->n_all + 1))
        return FERRY_ENOMEM;
    t->uid = (uint32_t)f->n_all;
    f->all[f->n_all++] = t;
    return 0;
}

/* Splits T's rows over the policy's devices: contiguous blocks of whole rows, sizes in
 * proportion to the weights (rounded so that they add up). Parts are made once and kept. */
static int make_parts(ferry *f, ferry_tensor *t, const ferry_policy *p, ferry__err *e)
{
    int k = p->n_split > FERRY_MAX_SPLIT ? FERRY_MAX_SPLIT : p->n_split;
    double total = 0;
    for (int i = 0; i < k; i++) {
        int d = p->split_devices[i];
        if (d < 0 || d >= f->n_devs)
            return ferry__fail(e, FERRY_EINVAL, "tensor '%s': split names device %d of %d",
                               t->info.name, d, f->n_devs);
        total += p->split_weights[i] > 0 ? p->split_weights[i] : 1.0;
    }
    uint64_t rows = t->info.n_rows, row_bytes = t->info.nbytes / (rows ? rows : 1);
    ferry_tensor **parts = calloc((size_t)k, sizeof *parts);
    if (!parts)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    double acc = 0;
    uint64_t r0 = 0;
    for (int i = 0; i < k; i++) {
        acc += p->split_weights[i] > 0 ? p->split_weights[i] : 1.0;
        uint64_t r1 = i == k - 1 ? rows : (uint64_t)((double)rows * acc / total + 0.5);
        if (r1 < r0)
            r1 = r0;
        ferry_tensor *c = calloc(1, sizeof *c);
        char *name = c ? ferry__asprintf("%s[%llu:%llu]", t->info.name, (unsigned long long)r0,
                                         (unsigned long long)r1)
                       : NULL;
        if (!c || !name || ferry__register(f, c)) {
            free(c), free(name);
            for (int j = 0; j < i; j++)
                parts[j]->removed = 1; /* registered: freed with the manager */
            free(parts);
            return ferry__fail(e, FERRY_ENOMEM, "out of memory");
        }
        c->owner = f;
        c->id = t->id;
        c->info = t->info;
        c->info.name = c->own_name = name;
        c->info.offset = t->info.offset + r0 * row_bytes;
        c->info.nbytes = (r1 - r0) * row_bytes;
        c->info.n_rows = r1 - r0;
        c->info.n_elems = (r1 - r0) * t->info.row_elems;
        /* 2-D only: the outer dimension is the rows */
        c->info.shape[t->info.format == FERRY_FORMAT_GGUF ? 1 : 0] = (int64_t)(r1 - r0);
        c->file = t->file;
        c->group = t->group;
        c->parent = t;
        c->row_base = r0;
        c->dev_override = p->split_devices[i];
        parts[i] = c;
        /* the parent's LoRA terms apply to each part's own rows; a part without them would be
         * staged without an adapter the parent requires */
        if (t->n_terms) {
            if (!(c->terms = malloc(t->n_terms * sizeof *c->terms))) {
                for (int j = 0; j <= i; j++)
                    parts[j]->removed = 1; /* registered: freed with the manager */
                free(parts);
                return ferry__fail(e, FERRY_ENOMEM,
                                   "tensor '%s': out of memory for its parts' LoRA terms",
                                   t->info.name);
            }
            memcpy(c->terms, t->terms, t->n_terms * sizeof *c->terms);
            c->n_terms = t->n_terms;
        }
        r0 = r1;
    }
    t->parts = parts;
    t->n_parts = k;
    return 0;
}

int ferry__bind(ferry *f, ferry_tensor *t, ferry__err *e)
{
    if (t->bound) {
        /* parts are unbound on their own (an adapter change while the parent was held) */
        for (int i = 0; i < t->n_parts; i++) {
            int rc = ferry__bind(f, t->parts[i], e);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (t->parent) {
        /* a slice takes its parent's placement, decided first (a part's parent binds it) */
        int rc = t->is_slice ? ferry__bind(f, t->parent, e) : 0;
        if (rc)
            return rc;
        t->group = t->parent->group;
        t->ignored = t->parent->ignored;
        t->optional = t->parent->optional;
    } else {
        t->group = match_group(f, t->info.name);
        t->ignored = matches_any(f->place.ignore, f->place.n_ignore, t->info.name);
        t->optional = matches_any(f->place.optional, f->place.n_optional, t->info.name);
    }
    int rc = ferry__decide(f, t, e);
    if (rc)
        return rc;
    const ferry_policy *p = ferry__policy_of(f, t);
    if (!t->parent && !t->parts && p->n_split >= 2 && t->info.ndim == 2 && !t->lazy &&
        t->info.n_rows >= (uint64_t)p->n_split && (rc = make_parts(f, t, p, e)) != 0)
        return rc;
    for (int i = 0; i < t->n_parts; i++)
        if ((rc = ferry__bind(f, t->parts[i], e)) != 0)
            return rc;
    t->bound = 1;
    return 0;
}

/* Re-evaluates group membership of every tensor not yet used (after a rule changed). Returns
 * FERRY_EBUSY naming the tensor when one that has been used would change group. */
int ferry__rebind_all(ferry *f, int check_only, ferry__err *e)
{
    for (size_t i = 0; i < f->n_tensors; i++) {
        ferry_tensor *t = f->tensors[i];
        int g = match_group(f, t->info.name);
        int ign = matches_any(f->place.ignore, f->place.n_ignore, t->info.name);
        int used = t->used;
        for (size_t k = 0; k < t->n_slices; k++)
            used |= t->slices[k]->used;
        if (used && (g != t->group || ign != t->ignored)) {
            if (check_only)
                return ferry__fail(e, FERRY_EBUSY,
                                   "tensor '%s' is already loaded in group '%s'; define groups "
                                   "before loading",
                                   t->info.name,
                                   t->group >= 0 ? f->place.groups[t->group].name : "default");
            continue;
        }
        if (!check_only && !used) {
            t->bound = 0;
            for (int k = 0; k < t->n_parts; k++)
                t->parts[k]->bound = 0;
            for (size_t k = 0; k < t->n_slices; k++)
                t->slices[k]->bound = 0;
        }
    }
    return 0;
}

uint64_t ferry__dev_alloc_size(const ferry_tensor *t)
{
    uint64_t n = t->out_bytes ? t->out_bytes : 1;
    uint64_t size;
    return ferry__align_up(n, 256, &size) ? UINT64_MAX : size;
}
