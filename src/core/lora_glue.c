/*
 * lora_glue.c — the manager's side of LoRA: the adapter set, epochs, which weights each adapter
 * touches, and what a change of the set does to staged copies.
 *
 * Every change of the set (add, remove, multiplier, mode) starts a new epoch and recomputes each
 * weight's terms. A staged copy of an affected weight that nobody holds is dropped at once and
 * re-staged from the pristine home copy at its next prepare; one that is in use is marked stale
 * and dropped at its last release. Copies are never unmerged by subtraction.
 *
 * Factors are read at ferry_lora_add, converted to f32 once, and their bytes held against the host
 * budget until the adapter is removed. Jobs snapshot the terms they apply, so a removed adapter is
 * freed only when no job is queued or running.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "dtype/dtype.h"

static ferry__adapter_slot *slot_by_id(ferry *f, int id)
{
    for (size_t i = 0; i < f->lora.n_adapters; i++)
        if (f->lora.adapters[i].id == id && !f->lora.adapters[i].removed)
            return &f->lora.adapters[i];
    return NULL;
}

/* Recomputes every weight's terms from the active adapters and deals with stale copies. */
static int apply_set_change(ferry *f, ferry__err *e)
{
    f->lora.lora_epoch++;
    uint8_t *had = calloc(f->n_tensors ? f->n_tensors : 1, 1);
    if (!had)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < f->n_tensors; i++) {
        ferry_tensor *t = f->tensors[i];
        had[i] = t->n_terms > 0 || t->comp.merged || t->merge;
        free(t->terms);
        t->terms = NULL;
        t->n_terms = 0;
    }
    int rc = 0;
    for (size_t s = 0; s < f->lora.n_adapters && !rc; s++) {
        ferry__adapter_slot *sl = &f->lora.adapters[s];
        if (sl->removed || !sl->a)
            continue;
        for (size_t k = 0; k < sl->a->n_pairs; k++) {
            ferry__lora_pair *p = &sl->a->pairs[k];
            if (!p->base_name)
                continue;
            int64_t ti = ferry_catalog_find(f->cat, p->base_name);
            if (ti < 0 || (size_t)ti >= f->n_tensors)
                continue;
            ferry_tensor *t = f->tensors[ti];
            ferry__lora_term *terms = realloc(t->terms, (t->n_terms + 1) * sizeof *terms);
            if (!terms) {
                rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
                break;
            }
            t->terms = terms;
            terms[t->n_terms].slot = (int)s;
            terms[t->n_terms].pair = p;
            t->n_terms++;
        }
    }
    /* Parts apply their parent's terms to their own rows. */
    for (size_t i = 0; i < f->n_tensors && !rc; i++) {
        ferry_tensor *t = f->tensors[i];
        for (int k = 0; k < t->n_parts; k++) {
            ferry_tensor *c = t->parts[k];
            free(c->terms);
            c->terms = NULL;
            c->n_terms = 0;
            if (!t->n_terms)
                continue;
            c->terms = malloc(t->n_terms * sizeof *c->terms);
            if (!c->terms) {
                rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
                break;
            }
            memcpy(c->terms, t->terms, t->n_terms * sizeof *c->terms);
            c->n_terms = t->n_terms;
        }
    }
    for (size_t i = 0; i < f->n_all; i++) {
        ferry_tensor *t = f->all[i];
        /* a slice takes no terms: its parent's say whether the adapter set touches it */
        int had_terms = t->parent ? had[t->parent->id] || (t->is_slice && t->parent->n_terms)
                                  : had[t->id];
        if (!had_terms && !t->n_terms)
            continue;
        if (t->refs > 0 || t->comp.state == FERRY__LOADING || t->host.state == FERRY__LOADING) {
            t->stale = 1; /* dropped at its last release or when its job finishes */
            continue;
        }
        if (t->comp.state == FERRY__READY) {
            /* On the host an unmerged, unconverted home copy is the pristine source merges are
             * staged from: it becomes the host copy instead of being read again. */
            int pristine = t->comp.permanent && !t->comp.merged && !t->comp.mapped &&
                           t->comp.dev == FERRY__HOST && t->out_dtype == t->info.dtype &&
                           t->host.state == FERRY__EMPTY;
            if (pristine) {
                ferry__copy_move(f, t, &t->host, &t->comp);
            } else {
                ferry__drop_copy(f, t, &t->comp);
            }
        }
        t->stale = 0;
        t->bound = 0; /* merge or not, zero-copy or not: decided again at the next use */
    }
    free(had);
    return rc;
}

int ferry__lora_decide(ferry *f, ferry_tensor *t, ferry__err *e)
{
    t->merge = 0;
    if (!t->n_terms || f->lora.lora_mode != FERRY_LORA_MERGE)
        return 0;
    if (!t->lazy && ferry__dtype_readable(t->info.dtype) && ferry__dtype_writable(t->out_dtype)) {
        t->merge = 1;
        return 0;
    }
    for (size_t k = 0; k < t->n_terms; k++) {
        ferry__adapter_slot *sl = &f->lora.adapters[t->terms[k].slot];
        if (sl->required)
            return ferry__fail(e, FERRY_ELORA,
                               "%s: tensor '%s' (%s%s) cannot take a merge of required adapter %s",
                               t->info.file, t->info.name, ferry_dtype_name(t->out_dtype),
                               t->lazy ? ", lazy" : "", sl->a->path);
    }
    if (t->skip_epoch != f->lora.lora_epoch) {
        t->skip_epoch = f->lora.lora_epoch;
        for (size_t k = 0; k < t->n_terms; k++)
            f->lora.adapters[t->terms[k].slot].skipped++;
    }
    return 0;
}

int ferry__lora_snapshot(ferry *f, ferry_tensor *t, ferry__job *j)
{
    j->n_terms = 0;
    if (!t->n_terms)
        return 0;
    j->terms = malloc(t->n_terms * sizeof *j->terms);
    j->scales = malloc(t->n_terms * sizeof *j->scales);
    if (!j->terms || !j->scales)
        return FERRY_ENOMEM;
    for (size_t k = 0; k < t->n_terms; k++) {
        j->terms[k] = t->terms[k];
        j->scales[k] = ferry__lora_scale(t->terms[k].pair,
                                         f->lora.adapters[t->terms[k].slot].multiplier);
    }
    j->n_terms = t->n_terms;
    return 0;
}

static void slot_free(ferry *f, ferry__adapter_slot *sl)
{
    ferry__adapter_close(sl->a);
    sl->a = NULL;
    free(sl->base_prefix);
    free(sl->target_prefix);
    sl->base_prefix = sl->target_prefix = NULL;
    (void)f;
}

void ferry__lora_sweep(ferry *f)
{
    if (f->jobs.running || f->jobs.queue_head)
        return;
    for (size_t s = 0; s < f->lora.n_adapters; s++)
        if (f->lora.adapters[s].removed && f->lora.adapters[s].a)
            slot_free(f, &f->lora.adapters[s]);
}

void ferry__lora_free_all(ferry *f)
{
    for (size_t s = 0; s < f->lora.n_adapters; s++)
        slot_free(f, &f->lora.adapters[s]);
    free(f->lora.adapters);
    f->lora.adapters = NULL;
    f->lora.n_adapters = 0;
    for (size_t i = 0; i < f->n_all; i++) {
        free(f->all[i]->terms);
        f->all[i]->terms = NULL;
        f->all[i]->n_terms = 0;
    }
}

int ferry_lora_add(ferry *f, const char *path, float multiplier, const ferry_lora_options *opt,
                   int *id)
{
    if (!f || !path || !isfinite(multiplier))
        return FERRY_EINVAL;
    ferry_lora_options o = {0};
    if (opt)
        o = *opt;
    ferry__err *e = calloc(1, sizeof *e);
    if (!e)
        return ferry__publish(f, FERRY_ENOMEM, NULL);
    ferry__adapter *a = NULL;
    int rc = ferry__adapter_open(path, &a, e);
    if (!rc) {
        pthread_mutex_lock(&f->lock);
        rc = ferry__adapter_map(a, f->cat, o.base_prefix, o.target_prefix, e);
        pthread_mutex_unlock(&f->lock);
    }
    /* Factors are read once, here, without the lock. */
    uint64_t bytes = 0;
    for (size_t k = 0; !rc && k < a->n_pairs; k++) {
        if (!a->pairs[k].base_name)
            continue;
        rc = ferry__adapter_load(a, &a->pairs[k], e);
        bytes += ferry__lora_pair_bytes(&a->pairs[k]);
    }
    pthread_mutex_lock(&f->lock);
    if (rc)
        goto fail;
    ferry__mem held = {0};
    if ((rc = ferry__reserve_bytes(f, FERRY__HOST, bytes, &held, e)) != 0) {
        ferry__fail_append(e, 0, "while caching the factors of adapter %s", path);
        goto fail;
    }
    ferry__adapter_slot *slots =
        realloc(f->lora.adapters, (f->lora.n_adapters + 1) * sizeof *slots);
    if (!slots) {
        ferry__unreserve(f, FERRY__HOST, &held);
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto fail;
    }
    f->lora.adapters = slots;
    ferry__adapter_slot *sl = &slots[f->lora.n_adapters];
    memset(sl, 0, sizeof *sl);
    sl->a = a;
    sl->id = f->lora.next_adapter_id++;
    sl->multiplier = multiplier;
    sl->required = o.required;
    sl->base_prefix = ferry__strdup(o.base_prefix);
    sl->target_prefix = ferry__strdup(o.target_prefix);
    sl->factors = held;
    for (size_t k = 0; k < a->n_pairs; k++) {
        if (a->pairs[k].base_name)
            continue;
        if (sl->n_unmatched < FERRY__ARRAY_LEN(sl->unmatched))
            sl->unmatched[sl->n_unmatched] = a->pairs[k].stem;
        sl->n_unmatched++;
    }
    f->lora.n_adapters++;
    if (id)
        *id = sl->id;
    rc = apply_set_change(f, e);
    pthread_mutex_unlock(&f->lock);
    ferry__publish(f, rc, e);
    free(e);
    return rc;
fail:
    pthread_mutex_unlock(&f->lock);
    ferry__adapter_close(a);
    ferry__publish(f, rc, e);
    free(e);
    return rc;
}

int ferry_lora_set_multiplier(ferry *f, int id, float multiplier)
{
    if (!f || !isfinite(multiplier))
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry__adapter_slot *sl = slot_by_id(f, id);
    int rc;
    if (!sl) {
        rc = ferry__fail(e, FERRY_ENOENT, "no adapter %d", id);
    } else if (sl->multiplier == multiplier) {
        rc = 0;
    } else {
        sl->multiplier = multiplier;
        rc = apply_set_change(f, e);
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

static void remove_slot(ferry *f, ferry__adapter_slot *sl)
{
    sl->removed = 1;
    ferry__unreserve(f, FERRY__HOST, &sl->factors);
}

int ferry_lora_remove(ferry *f, int id)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry__adapter_slot *sl = slot_by_id(f, id);
    int rc;
    if (!sl) {
        rc = ferry__fail(e, FERRY_ENOENT, "no adapter %d", id);
    } else {
        remove_slot(f, sl);
        rc = apply_set_change(f, e);
        ferry__lora_sweep(f);
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_lora_clear(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int any = 0;
    for (size_t s = 0; s < f->lora.n_adapters; s++)
        if (!f->lora.adapters[s].removed) {
            remove_slot(f, &f->lora.adapters[s]);
            any = 1;
        }
    int rc = any ? apply_set_change(f, e) : 0;
    ferry__lora_sweep(f);
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

int ferry_lora_set_mode(ferry *f, ferry_lora_mode mode)
{
    if (!f || (mode != FERRY_LORA_MERGE && mode != FERRY_LORA_RUNTIME))
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    if (f->lora.lora_mode != mode) {
        f->lora.lora_mode = mode;
        rc = apply_set_change(f, e);
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}

uint64_t ferry_lora_epoch(const ferry *f)
{
    if (!f)
        return 0;
    ferry *m = (ferry *)f;
    pthread_mutex_lock(&m->lock);
    uint64_t e = f->lora.lora_epoch;
    pthread_mutex_unlock(&m->lock);
    return e;
}

int ferry_lora_get_info(const ferry *f, int id, ferry_lora_info *out)
{
    if (!f || !out)
        return FERRY_EINVAL;
    ferry *m = (ferry *)f;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&m->lock);
    ferry__adapter_slot *sl = slot_by_id(m, id);
    int rc = 0;
    if (!sl) {
        rc = ferry__fail(e, FERRY_ENOENT, "no adapter %d", id);
    } else {
        memset(out, 0, sizeof *out);
        out->path = sl->a->path;
        out->scheme = sl->a->scheme;
        out->multiplier = sl->multiplier;
        out->n_pairs = (uint32_t)sl->a->n_pairs;
        out->n_matched = (uint32_t)sl->a->n_matched;
        out->n_unmatched = sl->n_unmatched;
        for (size_t k = 0; k < FERRY__ARRAY_LEN(out->unmatched); k++)
            out->unmatched[k] = k < sl->n_unmatched ? sl->unmatched[k] : NULL;
        out->skipped = sl->skipped;
        out->factor_bytes = sl->factors.size;
    }
    pthread_mutex_unlock(&m->lock);
    return ferry__publish(f, rc, e);
}

int ferry_lora_factors(ferry *f, ferry_tensor *t, size_t i, ferry_lora_factor *out)
{
    if (!f || !t || !out)
        return FERRY_EINVAL;
    pthread_mutex_lock(&f->lock);
    int rc = 0;
    if (i >= t->n_terms) {
        rc = FERRY_ENOENT;
    } else {
        const ferry__lora_term *term = &t->terms[i];
        const ferry__adapter_slot *sl = &f->lora.adapters[term->slot];
        out->a = term->pair->a;
        out->b = term->pair->b;
        out->rank = term->pair->rank;
        out->rows = term->pair->rows;
        out->cols = term->pair->cols;
        out->scale = ferry__lora_scale(term->pair, sl->multiplier);
        out->adapter = sl->id;
    }
    pthread_mutex_unlock(&f->lock);
    return rc;
}
