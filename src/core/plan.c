/*
 * plan.c — the dry run: where every tensor would live and how many bytes each device would hold,
 * computed by the same decisions (ferry__decide, ferry__effective_home, the same allocation sizes)
 * that the real load uses, with no allocation and no I/O.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

/* The placement of one residency unit (a tensor, one part of a split tensor, or a slice). */
static ferry_placement place(ferry *f, ferry_tensor *t, ferry_plan_totals *tot)
{
    ferry_placement p;
    memset(&p, 0, sizeof p);
    p.name = t->info.name;
    p.group = t->group >= 0 ? f->place.groups[t->group].name : "default";
    p.home = ferry__effective_home(f, t);
    p.compute_device = t->compute_dev;
    p.lazy = t->lazy;
    p.zero_copy = t->zero_copy;
    int host_compute = f->devs[t->compute_dev].p.host_accessible;
    int converted = ferry__transformed(t);
    if (t->lazy) {
        tot->mapped_bytes += t->info.nbytes;
    } else if (host_compute && t->merge) {
        p.compute_bytes = ferry__host_alloc_size(t, 1);
        tot->staged_bytes[FERRY__HOST] += p.compute_bytes;
        if (p.home == FERRY_HOME_HOST && !t->zero_copy) {
            p.home_bytes = ferry__host_alloc_size(t, 0);
            tot->host_bytes += p.home_bytes;
        } else if (p.home == FERRY_HOME_HOST) {
            tot->mapped_bytes += t->info.nbytes;
        } else {
            tot->disk_bytes += t->info.nbytes;
        }
    } else if (host_compute) {
        if (p.home == FERRY_HOME_HOST) {
            if (t->zero_copy) {
                tot->mapped_bytes += t->info.nbytes;
            } else {
                p.home_bytes = ferry__host_alloc_size(t, converted);
                tot->host_bytes += p.home_bytes;
            }
        } else {
            p.compute_bytes = ferry__host_alloc_size(t, converted);
            tot->disk_bytes += t->info.nbytes;
            tot->staged_bytes[FERRY__HOST] += p.compute_bytes;
        }
    } else {
        p.compute_bytes = ferry__dev_alloc_size(t);
        if (p.home == FERRY_HOME_HOST) {
            if (t->zero_copy) {
                tot->mapped_bytes += t->info.nbytes;
            } else {
                p.home_bytes = ferry__host_alloc_size(t, 0);
                tot->host_bytes += p.home_bytes;
            }
            tot->staged_bytes[t->compute_dev] += p.compute_bytes;
        } else if (p.home == FERRY_HOME_DEVICE && !t->merge) {
            p.home_bytes = p.compute_bytes;
            p.compute_bytes = 0;
            tot->device_bytes[t->compute_dev] += p.home_bytes;
        } else {
            tot->disk_bytes += t->info.nbytes;
            tot->staged_bytes[t->compute_dev] += p.compute_bytes;
        }
    }
    return p;
}

/* The largest single staged copy on each device, and the tensor it belongs to. */
typedef struct plan_peaks {
    uint64_t staged[FERRY_MAX_DEVICES];
    const char *name[FERRY_MAX_DEVICES];
} plan_peaks;

/* The plan, lock held: placements into *PL_OUT (malloc'd; PL_OUT may be NULL), totals, peaks. */
static int plan_locked(ferry *f, ferry_placement **pl_out, size_t *n_out, ferry_plan_totals *tot,
                       plan_peaks *pk, ferry__err *e)
{
    /* Bind first: binding may split tensors into parts, which the loop below then lists. */
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!f->tensors[i]->removed) {
            int rc = ferry__bind(f, f->tensors[i], e);
            if (rc)
                return rc;
        }
    ferry_placement *pl = NULL;
    size_t cap = f->n_all ? f->n_all : 1;
    if (pl_out && !(pl = calloc(cap, sizeof *pl)))
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    memset(tot, 0, sizeof *tot);
    memset(pk, 0, sizeof *pk);
    size_t n = 0;
    /* File order; a split tensor's parts, or a sliced one's experts, in its place. */
    for (size_t i = 0; i < f->n_tensors; i++) {
        ferry_tensor *t = f->tensors[i];
        if (t->removed || t->ignored)
            continue;
        /* experts: one unit per expert, the slices ferry_slice gives (made here if need be) */
        uint64_t n_exp = 0;
        if (ferry__policy_of(f, t)->experts && t->info.ndim >= 2 && !t->n_parts)
            n_exp = ferry__outer_rows(t);
        ferry_tensor *sl = NULL;
        for (uint64_t x = 0; x < n_exp; x++) {
            int rc = ferry__slice_get(f, t, x, 1, &sl, e);
            if (!rc)
                rc = ferry__bind(f, sl, e);
            if (rc == FERRY_ENOMEM) {
                free(pl);
                return rc;
            }
            if (rc) { /* rows that cannot be cut: the whole tensor is the unit */
                ferry__err_clear(e);
                n_exp = 0;
            }
        }
        if (pl && f->n_all > cap) {
            /* the slices made above grew ferry.all: every unit listed is one of it */
            ferry_placement *g = realloc(pl, f->n_all * sizeof *pl);
            if (!g) {
                free(pl);
                return ferry__fail(e, FERRY_ENOMEM, "out of memory");
            }
            pl = g;
            cap = f->n_all;
        }
        uint64_t n_units = n_exp ? n_exp : t->n_parts ? (uint64_t)t->n_parts : 1;
        for (uint64_t k = 0; k < n_units; k++) {
            ferry_tensor *u = t;
            if (n_exp)
                (void)ferry__slice_get(f, t, k, 1, &u, NULL);
            else if (t->n_parts)
                u = t->parts[k];
            ferry_placement p = place(f, u, tot);
            int dev = f->devs[u->compute_dev].p.host_accessible ? FERRY__HOST : u->compute_dev;
            if (dev < FERRY_MAX_DEVICES && p.compute_bytes > pk->staged[dev]) {
                pk->staged[dev] = p.compute_bytes;
                pk->name[dev] = p.name;
            }
            if (pl)
                pl[n] = p;
            n++;
        }
    }
    if (pl_out)
        *pl_out = pl;
    *n_out = n;
    return 0;
}

int ferry_plan(ferry *f, ferry_placement **out, size_t *n_out, ferry_plan_totals *totals)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry_placement *pl = NULL;
    ferry_plan_totals tot;
    plan_peaks pk;
    size_t n = 0;
    int rc = plan_locked(f, out ? &pl : NULL, &n, &tot, &pk, e);
    pthread_mutex_unlock(&f->lock);
    if (rc)
        return ferry__publish(f, rc, e);
    if (out)
        *out = pl;
    if (n_out)
        *n_out = n;
    if (totals)
        *totals = tot;
    return 0;
}

int ferry_plan_check(ferry *f)
{
    if (!f)
        return FERRY_EINVAL;
    ferry__err e[1];
    ferry__err_clear(e);
    pthread_mutex_lock(&f->lock);
    ferry_plan_totals tot;
    plan_peaks pk;
    size_t n = 0;
    int rc = plan_locked(f, NULL, &n, &tot, &pk, e);
    for (int d = 0; !rc && d < f->n_devs && d < FERRY_MAX_DEVICES; d++) {
        uint64_t kept = d == FERRY__HOST ? tot.host_bytes : tot.device_bytes[d];
        rc = ferry__budget_check(f, d, kept, pk.staged[d], pk.name[d], e);
    }
    pthread_mutex_unlock(&f->lock);
    return ferry__publish(f, rc, e);
}
