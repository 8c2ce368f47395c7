/*
 * memory.c — budgets, eviction and the host buffer pool. Every function here runs with the
 * manager's lock held.
 *
 * A device's `used` counts every byte ferry holds there: copies in use, cached copies, copies
 * being loaded (reserved before the job runs, so in-flight bytes count against the budget) and,
 * on the host, free buffers kept in the pool. A reservation that does not fit first returns pooled
 * buffers to the system, then evicts cached copies: the eviction policy (sched/evict.h) picks one
 * from the device's evictable set, which ferry__evictable_note keeps up to date in O(1) as copies
 * become cached or taken. Copies in use (refs > 0), copies being loaded and home copies are never
 * in it. Two kinds of units share a budget (ferry__evict_share_pick): slices, by the expert
 * policy (ferry.moe), and the rest, by the cyclic policy (ferry.evictor). ferry never goes over a
 * budget: when nothing more can be evicted the reservation fails with FERRY_EBUDGET. A guess
 * (ferry_prefetch_guess) takes only free room or what the expert policy values below its unit.
 * Where fresh huge pages are dear, the first pass gives the copies the budget will keep small
 * pages and streams the others through few blocks (below, "the first pass where ...").
 *
 * The pool (per device, while a budget bounds it; on the host, a budget given, not the default)
 * exists because fresh memory is expensive: first touch of anonymous host memory is slow on
 * virtual machines (0.6-4 GB/s), cudaMalloc/cudaFree synchronize the device, and a streamed
 * model reuses the same few buffer sizes layer after layer.
 * On other devices a pooled buffer serves a request of about its size. On the cpu device a request
 * of any size is served from pooled pages whatever their sizes: a pooled block of its size where
 * it lies (no page moved: where a moved page costs its next access, as under a hypervisor that
 * shadows page tables, that access is the engine's), else ferry__cpu_stitch cuts a larger block
 * or joins smaller ones (moving pages, not bytes), so a streamed pass faults in no fresh page once
 * the budget's worth has been touched.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/load.h"
#include "devices/devices.h"

/* A pooled buffer of SIZE serves a request of NEED when it is at most 1/8 (+8 KiB) larger. */
static int pool_fits(uint64_t size, uint64_t need)
{
    return size >= need && size - need <= need / 8 + 8192;
}

/* The longest tail of small pages a block of 2 MiB or more ends with (stitched_size): a longer
 * rest takes one more whole 2 MiB page. A tail saves budget (what the 2 MiB page would hold beyond
 * it, read again every pass that budget could have kept) and costs what its pages cost when they
 * move: a stitch moves them, and where moving a page costs its first access later
 * (ferry__cpu_move_cost), the tail's pages together may cost at most STITCH_TAIL_COST, about the
 * time 2 MiB takes to read at 8 GB/s. Up to 1 MiB (where moves cost nothing, the budget a tail
 * saves is then at least the fresh memory it may cost), at least 16 KiB (a tensor's data off a
 * 4 KiB boundary reads one page more than its bytes, and that page is a tail). */
#define STITCH_TAIL_MAX (UINT64_C(1) << 20)
#define STITCH_TAIL_MIN (UINT64_C(16) << 10)
#define STITCH_TAIL_COST 0.25e-3

uint64_t ferry__stitch_tail_for(double move_cost)
{
    if (!(move_cost > 0))
        return STITCH_TAIL_MAX;
    double pages = STITCH_TAIL_COST / move_cost;
    if (pages >= (double)(STITCH_TAIL_MAX / 4096))
        return STITCH_TAIL_MAX;
    uint64_t tail = (uint64_t)pages * 4096 & ~(STITCH_TAIL_MIN - 1); /* steady from run to run */
    return tail < STITCH_TAIL_MIN ? STITCH_TAIL_MIN : tail;
}

static uint64_t tail_max_v;
static pthread_once_t tail_max_once = PTHREAD_ONCE_INIT;

static void tail_max_init(void)
{
    /* FERRY_STITCH_TAIL=SIZE: the rule's result, for tuning and tests (0 to 1 MiB) */
    const char *env = getenv("FERRY_STITCH_TAIL");
    uint64_t v;
    if (env && *env && ferry__parse_size(env, &v) == 0 && v <= STITCH_TAIL_MAX)
        tail_max_v = v & ~(uint64_t)4095;
    else
        tail_max_v = ferry__stitch_tail_for(ferry__cpu_move_cost());
}

uint64_t ferry__stitch_tail_max(void)
{
    pthread_once(&tail_max_once, tail_max_init);
    return tail_max_v;
}

static uint64_t round_up_4k(uint64_t size)
{
    return (size + 4095) & ~(uint64_t)4095;
}

/* The size of a block reserve stitches from pooled pages for a request of SIZE (below 2^64 - 4
 * KiB): what the cpu device maps anyway (4 KiB pages); from 2 MiB up whole 2 MiB pages (the body)
 * and a tail of small pages where the rest is at most ferry__stitch_tail_max(), else one more 2 MiB
 * page.
 * The parts of a stitch of 2 MiB and more are whole 2 MiB pages (cut_tails gives their tails back
 * first) so that stitching moves huge pages whole instead of splitting them; a tensor whose data
 * does not start on a 4 KiB boundary reads one page more than its bytes, and that page is a
 * tail. */
static uint64_t stitched_size(uint64_t size)
{
    if (size < FERRY__HUGE_PAGE || size > UINT64_MAX - FERRY__HUGE_PAGE)
        return round_up_4k(size);
    uint64_t body = size & ~(FERRY__HUGE_PAGE - 1), tail = round_up_4k(size - body);
    return tail <= ferry__stitch_tail_max() ? body + tail : body + FERRY__HUGE_PAGE;
}

/* The bytes a reservation of SIZE takes where reserve stitches it (an upper bound where not). */
static uint64_t block_bytes(uint64_t size)
{
    return size >= FERRY__CPU_MAP_MIN && size <= UINT64_MAX - 4096 ? stitched_size(size) : size;
}

/* The whole 2 MiB pages of a block of SIZE (SIZE itself below 2 MiB). */
static uint64_t body_of(uint64_t size)
{
    return size < FERRY__HUGE_PAGE ? size : size & ~(FERRY__HUGE_PAGE - 1);
}

static void dev_free(ferry *f, int dev, void *base)
{
    ferry_device *d = f->devs[dev].d;
    double t0 = ferry__tracing(f) ? ferry__now() : 0;
    d->ops->free(d, base);
    if (t0)
        ferry__trace_addf(f, "memory", t0, ferry__now(), "free on %s", f->devs[dev].p.name);
}

/* Frees pooled buffers, largest first (fewest frees for the room asked), until WANT_FREE bytes
 * are freed or none is left; only unstitchable ones when KEEP_STITCHABLE. Returns bytes freed. */
static uint64_t pool_trim(ferry *f, int dev, uint64_t want_free, int keep_stitchable)
{
    ferry__dev *D = &f->devs[dev];
    uint64_t freed = 0;
    while (freed < want_free) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < D->n_pool; i++)
            if (!(keep_stitchable && D->pool[i].segs) &&
                (best == SIZE_MAX || D->pool[i].size > D->pool[best].size))
                best = i;
        if (best == SIZE_MAX)
            break;
        ferry__pool_buf b = D->pool[best];
        D->pool[best] = D->pool[--D->n_pool];
        dev_free(f, dev, b.base);
        D->pooled -= b.size;
        D->used -= b.size;
        freed += b.size;
    }
    return freed;
}

void ferry__pool_trim(ferry *f, int dev, uint64_t want_free)
{
    pool_trim(f, dev, want_free, 0);
}

static int pool_take(ferry *f, int dev, uint64_t need, ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < D->n_pool; i++)
        if (pool_fits(D->pool[i].size, need) &&
            (best == SIZE_MAX || D->pool[i].size < D->pool[best].size))
            best = i;
    if (best == SIZE_MAX)
        return 0;
    out->base = D->pool[best].base;
    out->size = D->pool[best].size;
    D->pool[best] = D->pool[--D->n_pool];
    D->pooled -= out->size;
    return 1;
}

/* Cuts stitchable block BASE at KEEP bytes, on a 2 MiB boundary (no huge page is split there),
 * with the device's stitch and no system call: 1 with the rest, a block of its own, in *REST and
 * *REST_SIZE and the kept part's mappings in *SEGS (0 when the device cannot tell); 0 when the
 * device refused (nothing changed). */
static int cut_block(ferry *f, int dev, void *base, uint64_t keep, void **rest,
                     uint64_t *rest_size, uint32_t *segs)
{
    ferry__dev *D = &f->devs[dev];
    void *parts[1] = {base}, *out;
    uint64_t got, bsize;
    int gone = 0;
    if (D->d->ops->stitch(D->d, parts, 1, keep, &out, &got, rest, rest_size, &gone) ||
        out != base || got != keep || !*rest)
        return 0;
    if (!ferry__device_block(D->d, base, &bsize, segs) || bsize != keep)
        *segs = 0;
    return 1;
}

/* Gives back the tail of stitchable block BASE of *SIZE bytes (2 MiB or more, on a 2 MiB
 * boundary): the small pages past its last whole 2 MiB page. A stitched block's parts are laid
 * end to end, and a part with a tail would put every page after it off its 2 MiB boundary.
 * *SIZE and *SEGS become the body's; 0 when the device refused (nothing changed). */
static int cut_tail(ferry *f, int dev, void *base, uint64_t *size, uint32_t *segs)
{
    ferry__dev *D = &f->devs[dev];
    void *rest;
    uint64_t rest_size, body = body_of(*size);
    if (!cut_block(f, dev, base, body, &rest, &rest_size, segs))
        return 0;
    dev_free(f, dev, rest);
    D->used -= rest_size;
    *size = body;
    return 1;
}

/* Keeps the buffer BASE of SIZE bytes in DEV's pool (still counted in used); 0 when the pool
 * cannot grow. A stitchable block keeps its tail past its whole 2 MiB pages: a request of its size
 * takes it where it lies (pool_stitch), and a stitch of several parts gives the tails back first
 * (cut_tails). */
static int pool_put(ferry *f, int dev, void *base, uint64_t size)
{
    ferry__dev *D = &f->devs[dev];
    if (D->n_pool == D->cap_pool) {
        size_t cap = D->cap_pool ? D->cap_pool * 2 : 64;
        ferry__pool_buf *p = realloc(D->pool, cap * sizeof *p);
        if (!p)
            return 0;
        D->pool = p;
        D->cap_pool = cap;
    }
    uint64_t bsize = 0;
    uint32_t segs = 0;
    if (!ferry__device_block(D->d, base, &bsize, &segs) || bsize != size)
        segs = 0;
    D->pool[D->n_pool++] = (ferry__pool_buf){.base = base, .size = size, .segs = segs};
    D->pooled += size;
    return 1;
}

/* Gives memory back: into the pool when a budget bounds the device, else to the device. A block
 * of small pages for a kept copy goes back to the device: pooled, it would serve streamed copies,
 * read into every pass, slower than into the huge pages a fresh block takes. */
static void give_back(ferry *f, int dev, ferry__mem *m)
{
    ferry__dev *D = &f->devs[dev];
    if (!m->size && !m->base)
        return;
    if (m->arena) {
        D->used -= m->size;
        ferry__arena_release(m->arena);
    } else if (!(m->base && D->budget && !D->default_budget && !m->small_pages &&
                 pool_put(f, dev, m->base, m->size))) {
        if (m->base)
            dev_free(f, dev, m->base);
        D->used -= m->size;
    }
    m->base = NULL;
    m->size = 0;
    m->arena = NULL;
    m->moved = 0;
    m->small_pages = 0;
}

void ferry__unreserve(ferry *f, int dev, ferry__mem *m)
{
    give_back(f, dev, m);
}

static void ev_unlink(ferry *f, ferry_tensor *t);

/* Keeps the expert policy's residency in step with expert unit T's comp copy: held while it has
 * budgeted memory (loading or ready; a mapping has none). mem.size, not mem.base: a loader sets
 * the base of a LOADING copy without the lock. */
static void moe_sync(ferry *f, ferry_tensor *t)
{
    int want = ferry__expert_unit(f, t) && t->comp.state != FERRY__EMPTY && t->comp.mem.size;
    if (want != t->moe_held) {
        ferry__moe_policy_hold(&f->moe.p, t->uid, want);
        t->moe_held = want;
    }
}

void ferry__drop_copy(ferry *f, ferry_tensor *t, ferry__copy *c)
{
    if (c == &t->comp && t->guess_loaded) {
        f->stats.guess_unused_bytes += t->out_bytes; /* a guess's load that no prepare used */
        t->guess_loaded = 0;
    }
    if (c->reg) {
        ferry_device *d = f->devs[c->reg_dev].d;
        d->ops->host_unregister(d, c->reg);
        if (c->mapped)
            f->devs[FERRY__HOST].reg_mapped -= c->reg_len;
    }
    if (c->locked && c->ptr && c->mem.arena)
        ferry__arena_unlock(c->ptr, c->locked);
    else if (c->locked && c->ptr)
        ferry__host_unlock(c->ptr, c->locked);
    if (c->mem.arena)
        ferry__arena_trim(c->ptr, t->info.nbytes); /* its neighbours may stay: free its pages now */
    if (c->mem.base || c->mem.size)
        give_back(f, c->dev, &c->mem);
    memset(c, 0, sizeof *c);
    if (c == &t->comp) {
        ev_unlink(f, t);
        moe_sync(f, t);
    }
}

/* Whether T's comp copy may be evicted: cached (READY), not in use, not a home copy, not the
 * mapping, memory of its own. */
static int evictable(const ferry_tensor *t)
{
    const ferry__copy *c = &t->comp;
    return c->state == FERRY__READY && !c->permanent && !c->mapped && t->refs <= 0 && c->mem.base;
}

static void ev_unlink(ferry *f, ferry_tensor *t)
{
    if (!t->ev_in)
        return;
    if (t->ev_prev)
        t->ev_prev->ev_next = t->ev_next;
    else
        f->devs[t->ev_dev].evictable = t->ev_next;
    if (t->ev_next)
        t->ev_next->ev_prev = t->ev_prev;
    t->ev_prev = t->ev_next = NULL;
    t->ev_in = 0;
}

void ferry__evictable_note(ferry *f, ferry_tensor *t)
{
    moe_sync(f, t);
    int want = evictable(t);
    if (t->ev_in && (!want || t->ev_dev != t->comp.dev))
        ev_unlink(f, t);
    if (want && !t->ev_in) {
        ferry__dev *D = &f->devs[t->comp.dev];
        t->ev_prev = NULL;
        t->ev_next = D->evictable;
        if (D->evictable)
            D->evictable->ev_prev = t;
        D->evictable = t;
        t->ev_dev = t->comp.dev;
        t->ev_in = 1;
    }
}

typedef struct ev_iter {
    ferry *f;
    ferry_tensor *next;
    int kind;             /* -1: every candidate; 1: expert units only; 0: the others */
    int skip_kept;        /* pass over the copies a guess keeps (ferry__guess_kept) */
    int guess;            /* for a guess: only expert units not of their layer's latest choice
                             that the expert policy ranks to go before ... */
    uint64_t guess_order; /* ... the guessed unit itself (this is its order) */
} ev_iter;

int ferry__guess_kept(const ferry *f, const ferry_tensor *t)
{
    return t->guessed && ferry__expert_unit(f, t) && t->uid < f->moe.n_ids &&
           f->moe.p.group_clock[f->moe.group[t->uid]] == t->guess_at;
}

/* Whether expert unit T was among its layer's latest choice (the last prepare of its layer). */
static int moe_recent(const ferry *f, const ferry_tensor *t)
{
    uint32_t g = f->moe.group[t->uid];
    return t->moe_prep && t->moe_prep == f->moe.group_prep[g];
}

static ferry__evict_cand cand_of(const ferry *f, const ferry_tensor *t)
{
    return (ferry__evict_cand){.id = t->uid,
                               .bytes = t->comp.mem.size,
                               .age = f->clock - t->comp.last_use,
                               .ahead = t->comp.ahead};
}

static int ev_next(void *ctx, ferry__evict_cand *c)
{
    ev_iter *it = ctx;
    for (ferry_tensor *t = it->next; t; t = it->next) {
        it->next = t->ev_next;
        int expert = ferry__expert_unit(it->f, t);
        if ((it->kind >= 0 && expert != it->kind) || (it->skip_kept && ferry__guess_kept(it->f, t)))
            continue;
        *c = cand_of(it->f, t);
        uint64_t order;
        if (it->guess && (!expert || moe_recent(it->f, t) ||
                          !it->f->moe.ev.ops->order(it->f->moe.ev.state, c, 0, &order) ||
                          order <= it->guess_order))
            continue;
        return 1;
    }
    return 0;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* The bytes of DEV's budget a copy of T takes: its block's size while it holds one, else what a
 * load reserves for it, sized as reserve stitches it (an upper bound where it does not stitch).
 * Measured as the kinds' used bytes are, so that a dense kind holding its whole pass is not over
 * its share. */
static uint64_t copy_bytes(const ferry *f, const ferry_tensor *t, int dev)
{
    if (t->comp.state != FERRY__EMPTY && t->comp.mem.size)
        return t->comp.mem.size;
    return block_bytes(ferry__host_side(f, dev) ? ferry__host_alloc_size(t, ferry__transformed(t))
                                                : ferry__dev_alloc_size(t));
}

/* The bytes of DEV's budget the recorded pass's tensors (none of them slices) take: the dense
 * kind's working set as the schedule knows it (while recording, the part recorded so far). */
static uint64_t dense_pass_bytes(const ferry *f, int dev)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < f->sched.len; i++) {
        uint32_t id = f->sched.order[i];
        const ferry_tensor *t = id < f->n_all ? f->all[id] : NULL;
        if (t && !ferry__expert_unit(f, t) && t->comp.dev == dev && !t->comp.mapped &&
            !t->zero_copy && !t->lazy)
            sum += copy_bytes(f, t, dev);
    }
    return sum;
}

/* The victim on DEV when slices hold some of it or one is loading: two kinds under one budget
 * (ferry__evict_share_pick), the dense kind by the cyclic policy with the floor and share of its
 * working set, the expert kind by the expert policy with its floor's bytes and the rest. */
static uint32_t pick_shared(ferry *f, int dev, uint64_t min_dist, int skip_kept)
{
    ferry__dev *D = &f->devs[dev];
    uint64_t used[2] = {0, 0};
    for (size_t i = 0; i < f->n_all; i++) {
        const ferry_tensor *t = f->all[i];
        if (t->comp.dev == dev && t->comp.state != FERRY__EMPTY && t->comp.mem.size)
            used[ferry__expert_unit(f, t)] += t->comp.mem.size;
    }
    int loading = f->moe.loading && ferry__expert_unit(f, f->moe.loading);
    if (!used[1] && !loading)
        return FERRY__SCHED_NONE - 1; /* no slices in play: the cyclic policy alone */
    /* the budget less what neither kind holds (pool, home copies, the engine's reservations) */
    uint64_t other = D->used > used[0] + used[1] ? D->used - used[0] - used[1] : 0;
    uint64_t avail = D->budget > other ? D->budget - other : 0;
    uint64_t dense_floor = dense_pass_bytes(f, dev);
    if (dense_floor < f->moe.dense_set)
        dense_floor = f->moe.dense_set;
    dense_floor = min_u64(dense_floor, avail > f->moe.expert_set ? avail - f->moe.expert_set : 0);
    /* the expert policy's floor (units per layer, shrunk as it shrinks it) in bytes */
    const ferry__moe_policy *p = &f->moe.p;
    uint64_t per_unit = p->resident ? used[1] / p->resident : 0;
    uint64_t units = min_u64(p->floor, p->resident / p->n_groups) * p->n_groups;
    uint64_t expert_floor = min_u64(units * per_unit, avail - dense_floor);
    expert_floor = min_u64(expert_floor, avail > f->moe.dense_set ? avail - f->moe.dense_set : 0);
    ev_iter it[2] = {{.f = f, .next = D->evictable, .kind = 0, .skip_kept = skip_kept},
                     {.f = f, .next = D->evictable, .kind = 1, .skip_kept = skip_kept}};
    ferry__evict_kind k[2] = {
        {.policy = f->evictor, .next = ev_next, .ctx = &it[0], .floor = dense_floor,
         .share = dense_floor, .used = used[0]},
        {.policy = f->moe.ev, .next = ev_next, .ctx = &it[1], .floor = expert_floor,
         .share = avail - dense_floor, .used = used[1]},
    };
    return ferry__evict_share_pick(k, 2, (size_t)loading, min_dist, NULL);
}

/* The cached copy on DEV to evict, or NULL when none: the policy's pick of DEV's evictable set
 * (for a load needed MIN_DIST prepares from now; 0: a demand load). With slices in play the
 * shared rule first; when it finds nothing (floors too tight for the loads at hand) the cyclic
 * policy over every candidate, so a load fails only when nothing at all can go. Before all, a
 * guess's load that its layer's prepare did not use (a wrong guess); then each rule first without
 * the slices a guess keeps (ferry_prefetch_guess). For a guess's own load (moe.guess) only the
 * expert policy's units ranked to go before the guessed unit, never what a guess keeps. */
static ferry_tensor *pick_victim(ferry *f, int dev, uint64_t min_dist)
{
#ifndef NDEBUG
    /* the set is exactly the evictable copies on DEV */
    for (size_t i = 0; i < f->n_all; i++) {
        const ferry_tensor *t = f->all[i];
        int in = t->ev_in && t->ev_dev == dev;
        if (in != (evictable(t) && t->comp.dev == dev)) {
            fprintf(stderr, "ferry: evictable set of device %d wrong for tensor '%s'\n", dev,
                    t->info.name);
            abort();
        }
    }
#endif
    /* a guess's load that its layer's prepare did not use was a wrong guess: it goes first */
    for (ferry_tensor *t = f->devs[dev].evictable; t; t = t->ev_next)
        if (t->guess_loaded && ferry__expert_unit(f, t) && !ferry__guess_kept(f, t))
            return t;
    const ferry_tensor *g = f->moe.guess;
    if (g) {
        /* a guess: only expert units the expert policy would give up before the guessed one */
        if (!ferry__expert_unit(f, g) || !f->moe.ev.ops)
            return NULL;
        ev_iter it = {.f = f, .next = f->devs[dev].evictable, .kind = 1, .skip_kept = 1,
                      .guess = 1};
        ferry__evict_cand c = cand_of(f, g);
        if (!f->moe.ev.ops->order(f->moe.ev.state, &c, 0, &it.guess_order))
            return NULL;
        uint32_t id = ferry__evict_pick(&f->moe.ev, ev_next, &it, 0);
        return id < f->n_all ? f->all[id] : NULL;
    }
    /* what a guess keeps goes only when nothing else can */
    for (int skip_kept = 1; skip_kept >= 0 && f->moe.on; skip_kept--) {
        uint32_t id = pick_shared(f, dev, min_dist, skip_kept);
        if (id < f->n_all)
            return f->all[id];
    }
    for (int skip_kept = 1; skip_kept >= 0; skip_kept--) {
        ev_iter it = {.f = f, .next = f->devs[dev].evictable, .kind = -1, .skip_kept = skip_kept};
        uint32_t id = ferry__evict_pick(&f->evictor, ev_next, &it, min_dist);
        if (id != FERRY__SCHED_NONE)
            return f->all[id];
    }
    return NULL;
}

static void evict(ferry *f, ferry_tensor *t)
{
    if (t->moe_held) {
        ferry__evict_evicted(&f->moe.ev, t->uid, t->comp.mem.size);
        t->moe_held = 0;
    }

    ferry__drop_copy(f, t, &t->comp);
    f->stats.evictions++;
}

static int reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, int use_pool,
                   ferry__mem *out, ferry__err *e);

/* ---- the first pass where fresh huge pages are dear -------------------------------------------
 *
 * A budget keeps the copies of lowest rank (ferry__sched_rank: the recorded position, bits
 * reversed) that fit, pass after pass, and streams the others through the blocks they leave.
 * Where the host backs a fresh huge page slowly (ferry__host_huge_pages_dear: 0.35-0.75 GB/s on
 * the VMs measured, against 2-5 GB/s for small pages) a first pass that faults its whole budget
 * in huge pages takes twice its read. A kept copy is never read into again: small pages cost it
 * only its compute's TLB misses, which did not show in the passes measured; a streamed block is
 * read into every pass, and O_DIRECT into small pages is slower (bench/README.md, "Kept copies
 * in small pages"). So while the first schedule is recorded:
 *  - a fresh block for a copy predicted kept asks for small pages;
 *  - a copy predicted streamed takes the block of a streamed copy cached before it, not fresh
 *    memory, once the streamed copies hold the budget less the kept share.
 * The prediction: the copy's position (recorded, or where the file order puts it) with its bits
 * reversed, as the rank is, below the rank up to which the copies of the file's home-disk
 * tensors, taken in rank order at their file-order positions, fit in B - R, R room for a pass's
 * copies in use and fetched ahead: twice the largest prepared set (the W of a stream) and a
 * sixteenth of B (blocks' tails, the spread of sizes). Wrong either way it costs time, not
 * bytes: a kept copy in huge pages cost its fault, a streamed one in small pages reads slower. */
#define FIRST_ROOM_SETS 2
#define FIRST_SLACK 16

void ferry__first_init(ferry *f)
{
    const char *env = getenv("FERRY_KEPT_PAGES");
    f->first.on = env && !strcmp(env, "small") ? 1
                  : env && !strcmp(env, "huge") ? 0
                                                : ferry__host_huge_pages_dear();
}

static uint32_t bits_reversed(uint32_t p)
{
    uint32_t r = 0;
    for (int b = 0; b < 32; b++)
        r |= (p >> b & 1u) << (31 - b);
    return r;
}

/* Whether a reservation on DEV falls in the first pass's placement (above). */
static int first_pass_pages(const ferry *f, int dev)
{
    const ferry__dev *D = &f->devs[dev];
    const ferry__sched *s = &f->sched;
    return f->first.on && dev == FERRY__HOST && D->budget && !D->default_budget &&
           s->enabled && !s->complete && !s->passes && !s->irregular;
}

/* Whether T is a tensor whose host copy comes and goes under the budget of DEV. */
static int streams_on(const ferry *f, const ferry_tensor *t, int dev)
{
    return !ferry__expert_unit(f, t) && !t->removed && !t->ignored && !t->lazy && !t->n_parts &&
           !t->n_slices && ferry__effective_home(f, t) == FERRY_HOME_DISK &&
           ferry__compute_device_of(f, t) == dev;
}

typedef struct rank_bytes {
    uint32_t rank;
    uint64_t bytes;
} rank_bytes;

static int rank_bytes_cmp(const void *a, const void *b)
{
    uint32_t x = ((const rank_bytes *)a)->rank, y = ((const rank_bytes *)b)->rank;
    return x < y ? -1 : x > y;
}

/* The copies of a pass on DEV in the order the budget keeps them: each tensor in file order that
 * streams there (a tensor not bound yet has no group: counted as the one loading, whose group is
 * most often every tensor's) at its index as position, ranked as ferry__sched_rank ranks it, and
 * the bytes of its copy (of the file's bytes: not bound, it has no decided size) with those of
 * all ranked before it. Built once per file order the follower was given; 0 entries when it has
 * none or memory is short. */
static void first_pass_order(ferry *f, int dev)
{
    const ferry__pf_follow *fo = &f->prefetch.follow;
    if (f->first.n_tensors == f->prefetch.follow_tensors && f->first.n)
        return;
    free(f->first.rank);
    free(f->first.upto);
    f->first.rank = NULL;
    f->first.upto = NULL;
    f->first.n = 0;
    f->first.n_tensors = f->prefetch.follow_tensors;
    rank_bytes *rb = fo->n ? malloc(fo->n * sizeof *rb) : NULL;
    size_t n = 0;
    for (size_t i = 0; rb && i < fo->n && i <= UINT32_MAX; i++) {
        const ferry_tensor *t = fo->order[i] < f->n_all ? f->all[fo->order[i]] : NULL;
        if (!t || (t->bound && !streams_on(f, t, dev)))
            continue;
        uint64_t b = block_bytes(ferry__host_alloc_size(t, 0));
        rb[n++] = (rank_bytes){.rank = bits_reversed((uint32_t)i), .bytes = b};
    }
    uint32_t *rank = n ? malloc(n * sizeof *rank) : NULL;
    uint64_t *upto = n ? malloc(n * sizeof *upto) : NULL;
    if (rank && upto) {
        qsort(rb, n, sizeof *rb, rank_bytes_cmp);
        uint64_t sum = 0;
        for (size_t k = 0; k < n; k++) {
            sum += rb[k].bytes;
            rank[k] = rb[k].rank;
            upto[k] = sum;
        }
        f->first.rank = rank;
        f->first.upto = upto;
        f->first.n = n;
    } else {
        free(rank);
        free(upto);
    }
    free(rb);
}

/* The kept share of DEV's budget: *BELOW, the rank under which a copy is predicted kept (the
 * ranks of the copies whose bytes, with those ranked before them, fit in the budget less room
 * for a pass's copies in use and fetched ahead), and *KEPT, their bytes; 0 when unknown (no
 * file order yet). */
static int first_pass_share(ferry *f, int dev, uint64_t *below, uint64_t *kept)
{
    first_pass_order(f, dev);
    size_t n = f->first.n;
    if (f->first.set_max < f->prefetch.last_set_bytes)
        f->first.set_max = f->prefetch.last_set_bytes;
    uint64_t b = f->devs[dev].budget, r = f->first.set_max * FIRST_ROOM_SETS + b / FIRST_SLACK;
    if (!n)
        return 0;
    uint64_t room = b > r ? b - r : 0;
    /* the entries whose running bytes fit in ROOM: [0, lo) */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->first.upto[mid] <= room)
            lo = mid + 1;
        else
            hi = mid;
    }
    *below = lo == n ? UINT64_C(1) << 32 : f->first.rank[lo];
    *kept = lo ? f->first.upto[lo - 1] : 0;
    return 1;
}

/* 1 when T's copy is predicted kept, 0 streamed, -1 unknown (no position). */
static int first_pass_kept(const ferry *f, const ferry_tensor *t, uint64_t below)
{
    const ferry__sched *s = &f->sched;
    const ferry__pf_follow *fo = &f->prefetch.follow;
    uint32_t pos;
    if (t->uid < s->n_ids && s->pos[t->uid] != FERRY__SCHED_NONE) {
        pos = s->pos[t->uid];
    } else if (fo->started && !fo->stopped && t->uid < fo->n_ids &&
               fo->index[t->uid] != FERRY__SCHED_NONE) {
        size_t i = fo->index[t->uid];
        size_t p = s->len + (i > fo->next ? i - fo->next : 0);
        pos = p < UINT32_MAX ? (uint32_t)p : UINT32_MAX;
    } else {
        return -1;
    }
    return bits_reversed(pos) < below;
}

/* The bytes DEV holds in copies predicted streamed. */
static uint64_t streamed_held(const ferry *f, int dev, uint64_t below)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < f->n_all; i++) {
        const ferry_tensor *t = f->all[i];
        if (t->comp.dev == dev && t->comp.state != FERRY__EMPTY && t->comp.mem.size &&
            !t->comp.permanent && streams_on(f, t, dev) && first_pass_kept(f, t, below) == 0)
            sum += t->comp.mem.size;
    }
    return sum;
}

/* The cached copy on DEV predicted streamed, not fetched ahead, that the cyclic policy gives up
 * first (the highest rank, as the first pass evicts), or NULL. */
static ferry_tensor *streamed_victim(const ferry *f, int dev, uint64_t below)
{
    ferry_tensor *best = NULL;
    uint64_t best_rank = 0;
    for (ferry_tensor *t = f->devs[dev].evictable; t; t = t->ev_next) {
        if (t->comp.ahead || !streams_on(f, t, dev) || first_pass_kept(f, t, below) != 0)
            continue;
        uint64_t r = ferry__sched_rank(&f->sched, t->uid);
        if (!best || r > best_rank || (r == best_rank && t->comp.last_use < best->comp.last_use)) {
            best = t;
            best_rank = r;
        }
    }
    return best;
}

static int pool_stitch(ferry *f, int dev, uint64_t need, uint64_t room, ferry__mem *out);

/* A streamed copy's reservation of SIZE on DEV in the first pass: while the streamed copies hold
 * the budget less the kept share, a streamed copy cached before goes and its block serves. 1 when
 * *OUT holds a block, 0 when the caller goes on as for any reservation. */
static int first_pass_stream(ferry *f, int dev, uint64_t size, uint64_t below, uint64_t kept,
                             ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    uint64_t cap = D->budget > kept ? D->budget - kept : 0;
    uint64_t held = streamed_held(f, dev, below);
    while (held + size > cap) {
        ferry_tensor *v = streamed_victim(f, dev, below);
        if (!v)
            return 0;
        held -= v->comp.mem.size < held ? v->comp.mem.size : held;
        evict(f, v);
        int r = pool_stitch(f, dev, size, 0, out);
        if (r > 0)
            return 1;
        if (r == -2)
            return 0;
    }
    return 0;
}

/* ---- the streamed copies' first blocks, faulted in ahead ----------------------------------------
 *
 * The placement above keeps about B - R in small pages, which fault in fast, and streams the rest
 * through R bytes of blocks in huge pages, which every later pass reads into. Those R bytes of
 * fresh huge pages are most of what the first pass faults in at the slow rate, and they can be
 * told before the first prepare: R from the largest run of the file's streamed tensors in one
 * layer (the sets an engine prepares are most often its layers; a tensor of no layer is a run of
 * its own), as first_pass_share sizes it from the sets it sees, and the blocks themselves from the
 * prediction of first_pass_order and first_pass_share applied to the file order: the first
 * streamed copies' blocks, of their sizes, up to R. So once a host budget is given and the groups'
 * rules say which tensors stream, a thread of the manager's allocates and faults those blocks in
 * while the engine sets itself up. Of each copy's own size, a pooled block serves it where it lies
 * (pool_fit) in the first pass and in every pass after, as the fresh block it stands for would.
 * The first reservation on the host stops the thread at its next huge page: the blocks it made
 * join the pool, which the streamed copies take (a copy predicted kept takes a fresh block of
 * small pages, not the pool). An engine that prepares at once gets the few pages faulted by then;
 * one that sets up for longer than R takes to fault in gets all of it. A guess wrong either way
 * costs time, not bytes: blocks no copy takes stay pooled until a reservation short of room frees
 * them.
 * The copies predicted kept fault in their small pages on the readers' path (0.5-0.8 thread-seconds
 * for 550-700 MiB in a first pass of 1.1-1.7 s on the VM measured). So after the streamed blocks
 * the thread faults one more block, the kept reserve, in small pages, of the bytes of the copies
 * predicted kept that are blocks of their own; each such copy is cut from its front (a cut in two
 * moves no page), and what is left of it goes back at the first reservation short of room. */

/* Whether T, not bound yet (its first use binds it), will stream on the host by the policy its
 * group's rules give it now (streams_on, as far as the policy tells). */
static int streams_ahead(const ferry *f, const ferry_tensor *t)
{
    const ferry_policy *p = ferry__policy_ahead(f, t);
    uint64_t lazy_at = p->lazy_threshold ? p->lazy_threshold : FERRY_LAZY_DEFAULT_THRESHOLD;
    return !t->removed && p->home == FERRY_HOME_DISK && p->compute_device == FERRY__HOST &&
           p->n_split < 2 && !p->experts && p->lazy != FERRY_LAZY_ON &&
           !(p->lazy == FERRY_LAZY_AUTO && t->info.nbytes >= lazy_at);
}

/* The bytes of T's block when it streams on the host (as first_pass_order counts them), or 0 when
 * it does not. */
static uint64_t warm_bytes(const ferry *f, const ferry_tensor *t)
{
    if (t->bound ? !streams_on(f, t, FERRY__HOST) : !streams_ahead(f, t))
        return 0;
    return block_bytes(ferry__host_alloc_size(t, 0));
}

/* The bytes of the largest run of consecutive tensors of the file that stream on the host and lie
 * in one layer (ferry__layer_of), each tensor of no layer a run of its own. */
static uint64_t first_set_guess(const ferry *f)
{
    uint64_t best = 0, run = 0;
    int64_t run_layer = -1;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ferry_tensor *t = f->tensors[i];
        uint64_t b = warm_bytes(f, t);
        if (!b)
            continue;
        int64_t layer = ferry__layer_of(t->info.name);
        if (layer < 0 || layer != run_layer)
            run = 0;
        run_layer = layer;
        run = run > UINT64_MAX - b ? UINT64_MAX : run + b;
        if (run > best)
            best = run;
    }
    return best;
}

/* Plans the blocks of the first copies predicted streamed, in file order (the tensors at their
 * indices as positions), up to R bytes: f->first.warm_size, warm_n and warm_total. 0 when there is
 * nothing to plan (or no memory to plan it). */
static int warm_plan(ferry *f, uint64_t r)
{
    size_t m = f->n_tensors < UINT32_MAX ? f->n_tensors : UINT32_MAX;
    rank_bytes *rb = m ? malloc(m * sizeof *rb) : NULL;
    if (!rb)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < m; i++) {
        uint64_t b = warm_bytes(f, f->tensors[i]);
        if (b)
            rb[n++] = (rank_bytes){.rank = bits_reversed((uint32_t)i), .bytes = b};
    }
    /* the rank below which copies are kept: those that fit in B - R, taken in rank order */
    qsort(rb, n, sizeof *rb, rank_bytes_cmp);
    uint64_t room = f->devs[FERRY__HOST].budget - r, sum = 0, below = UINT64_C(1) << 32;
    f->first.kept_plan = 0;
    for (size_t k = 0; k < n; k++) {
        sum += rb[k].bytes;
        if (sum > room) {
            below = rb[k].rank;
            break;
        }
        if (rb[k].bytes >= FERRY__CPU_MAP_MIN) /* a block of its own: the reserve's to serve */
            f->first.kept_plan += rb[k].bytes;
    }
    free(rb);
    f->first.warm_n = 0;
    f->first.warm_total = 0;
    for (size_t i = 0; i < m && f->first.warm_n < FERRY__WARM_MAX; i++) {
        uint64_t b = warm_bytes(f, f->tensors[i]);
        if (!b || bits_reversed((uint32_t)i) < below || b < FERRY__CPU_MAP_MIN)
            continue; /* kept, or not a block of its own */
        if (f->first.warm_total + b > r)
            break;
        f->first.warm_size[f->first.warm_n++] = b;
        f->first.warm_total += b;
    }
    return f->first.warm_n > 0;
}

/* Writes a byte to each page of the SIZE bytes at P, a huge page at a time, until the thread is
 * told to stop: the bytes faulted in. */
static uint64_t warm_fault(ferry *f, void *p, uint64_t size)
{
    volatile unsigned char *q = p;
    uint64_t off = 0;
    for (; off < size && !atomic_load(&f->first.warm_stop); off += FERRY__HUGE_PAGE)
        for (uint64_t o = off; o < off + FERRY__HUGE_PAGE && o < size; o += 4096)
            q[o] = 0;
    return off < size ? off : size;
}

static void *warm_main(void *arg)
{
    ferry *f = arg;
    ferry_device *d = f->devs[FERRY__HOST].d; /* the host's device is never replaced */
    char b[32];
    for (size_t i = 0; i < f->first.warm_n && !atomic_load(&f->first.warm_stop); i++) {
        uint64_t size = f->first.warm_size[i];
        double t0 = ferry__now();
        void *p = NULL;
        if (d->ops->alloc(d, size, &p) || !p)
            break; /* short of memory: the streamed copies fault their own blocks in */
        f->first.warm_base[i] = p;
        f->first.warm_done = i + 1;
        f->first.warm_faulted += warm_fault(f, p, size);
        ferry__trace_addf(f, "memory", t0, ferry__now(), "fault in ahead %s",
                          ferry__fmt_size(size, b));
    }
    /* then the kept reserve, in small pages, as a fresh block for a kept copy asks */
    uint64_t size = f->first.kept_plan;
    void *p = NULL;
    if (size && !atomic_load(&f->first.warm_stop) && !d->ops->alloc(d, size, &p) && p) {
        double t0 = ferry__now();
        ferry__host_small_pages(p, size);
        f->first.kept_made = p;
        f->first.kept_faulted = warm_fault(f, p, size);
        ferry__trace_addf(f, "memory", t0, ferry__now(), "fault in ahead %s for the kept copies",
                          ferry__fmt_size(f->first.kept_faulted, b));
    }
    atomic_store(&f->first.warm_exited, 1);
    return NULL;
}

void ferry__first_warm(ferry *f)
{
    ferry__dev *D = &f->devs[FERRY__HOST];
    if (f->first.warmed || f->first.warming || !first_pass_pages(f, FERRY__HOST) || D->used ||
        D->n_pool || D->no_stitch || !ferry__device_has_reuse(D->d) || f->jobs.closing)
        return;
    uint64_t b = D->budget, set = first_set_guess(f);
    if (!set || set > b)
        return;
    uint64_t r = set * FIRST_ROOM_SETS + b / FIRST_SLACK;
    if (r >= b || !warm_plan(f, r))
        return; /* nothing predicted kept (the placement does nothing), or nothing streamed */
    f->first.warm_done = 0;
    f->first.warm_faulted = 0;
    f->first.kept_made = NULL;
    f->first.kept_faulted = 0;
    f->first.warm_total += f->first.kept_plan;
    atomic_store(&f->first.warm_exited, 0);
    atomic_store(&f->first.warm_stop, 0);
    f->first.warmed = 1;
    /* the budget holds the blocks from the start: no reservation races them */
    D->used += f->first.warm_total;
    if (pthread_create(&f->first.warm_thread, NULL, warm_main, f)) {
        D->used -= f->first.warm_total;
        return;
    }
    if (D->used > D->peak)
        D->peak = D->used;
    f->first.warming = 1;
}

void ferry__first_warm_join(ferry *f)
{
    if (!f->first.warming)
        return;
    atomic_store(&f->first.warm_stop, 1);
    pthread_join(f->first.warm_thread, NULL);
    f->first.warming = 0;
    ferry__dev *D = &f->devs[FERRY__HOST];
    uint64_t made = 0;
    for (size_t i = 0; i < f->first.warm_done; i++) {
        uint64_t size = f->first.warm_size[i];
        made += size;
        if (!pool_put(f, FERRY__HOST, f->first.warm_base[i], size)) {
            dev_free(f, FERRY__HOST, f->first.warm_base[i]);
            D->used -= size;
        }
    }
    /* the kept reserve: its pages faulted in (whole 2 MiB steps), the rest given back */
    void *kept = f->first.kept_made, *rest = NULL;
    uint64_t keep = f->first.kept_faulted, rest_size = 0;
    uint32_t segs;
    if (kept && keep < f->first.kept_plan &&
        (!keep || !cut_block(f, FERRY__HOST, kept, keep, &rest, &rest_size, &segs))) {
        dev_free(f, FERRY__HOST, kept);
        kept = NULL;
    } else if (rest) {
        dev_free(f, FERRY__HOST, rest);
    }
    f->first.kept_base = kept;
    f->first.kept_size = kept ? keep : 0;
    made += f->first.kept_size;
    D->used -= f->first.warm_total - made;
    f->stats.faulted_ahead_bytes += f->first.warm_faulted + f->first.kept_size;
    f->first.kept_made = NULL;
}

void ferry__first_kept_drop(ferry *f)
{
    if (!f->first.kept_size)
        return;
    dev_free(f, FERRY__HOST, f->first.kept_base);
    f->devs[FERRY__HOST].used -= f->first.kept_size;
    f->first.kept_base = NULL;
    f->first.kept_size = 0;
}

/* The smallest rest of the kept reserve worth keeping after a cut: the cpu device cuts a block
 * only where the rest is at least this (or the cut lies on a 2 MiB boundary). */
#define KEPT_REST_MIN (UINT64_C(64) << 10)

/* A block of SIZE bytes for a copy predicted kept, cut from the front of the kept reserve, its
 * pages faulted in: 1 when *OUT holds it (the reserve's bytes, already counted in used, are the
 * copy's now), 0 when the reserve cannot serve it. */
static int kept_take(ferry *f, uint64_t size, ferry__mem *out)
{
    uint64_t have = f->first.kept_size;
    void *base = f->first.kept_base, *rest = NULL;
    uint64_t rest_size = 0;
    uint32_t segs;
    if (!have || size > have)
        return 0;
    if (have - size >= KEPT_REST_MIN) {
        if (!cut_block(f, FERRY__HOST, base, size, &rest, &rest_size, &segs))
            return 0;
    } else {
        size = have; /* too little would be left: the copy takes it all */
    }
    f->first.kept_base = rest;
    f->first.kept_size = rest ? rest_size : 0;
    out->base = base;
    out->size = size;
    out->small_pages = 1;
    out->moved = 0;
    return 1;
}

int ferry__reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, ferry__mem *out,
                  ferry__err *e)
{
    return reserve(f, dev, size, min_dist, 1, out, e);
}

int ferry__reserve_bytes(ferry *f, int dev, uint64_t size, ferry__mem *out, ferry__err *e)
{
    return reserve(f, dev, size, 0, 0, out, e);
}

/* Most parts and kernel mappings one stitched block may have: each mapping costs a VMA, of which a
 * process has about 65,000. */
#define STITCH_MAX_PARTS 16
#define STITCH_MAX_SEGS 32

/* Cuts pooled block I (a run of whole 2 MiB pages) to its first KEEP bytes, a whole number of
 * 2 MiB pages, and pools the rest as a block of its own. 0 when the device refused (unchanged). */
static int pool_cut(ferry *f, int dev, size_t i, uint64_t keep)
{
    ferry__dev *D = &f->devs[dev];
    void *rest;
    uint64_t rest_size;
    uint32_t segs;
    if (!cut_block(f, dev, D->pool[i].base, keep, &rest, &rest_size, &segs))
        return 0;
    D->pool[i].size = keep;
    D->pool[i].segs = segs;
    D->pooled -= rest_size;
    if (!pool_put(f, dev, rest, rest_size)) {
        dev_free(f, dev, rest);
        D->used -= rest_size;
    }
    return 1;
}

/* 1 when pooled block I is among the N picked in PICK. */
static int picked(const size_t *pick, size_t n, size_t i)
{
    for (size_t k = 0; k < n; k++)
        if (pick[k] == i)
            return 1;
    return 0;
}

/* The pooled block that serves NEED bytes where it lies, with no page moved: the smallest of NEED's
 * whole 2 MiB pages and at least its tail (from 2 MiB), or of about its size (below: at most
 * 1/8 + 8 KiB more, as pool_fits). SIZE_MAX when none. */
static size_t pool_fit(const ferry__dev *D, uint64_t need)
{
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < D->n_pool; i++) {
        const ferry__pool_buf *b = &D->pool[i];
        int fits = need >= FERRY__HUGE_PAGE
                       ? b->size >= need && body_of(b->size) == body_of(need) &&
                             (uintptr_t)b->base % FERRY__HUGE_PAGE == 0
                       : b->size < FERRY__HUGE_PAGE && pool_fits(b->size, need);
        if (b->segs && fits && (best == SIZE_MAX || b->size < D->pool[best].size))
            best = i;
    }
    return best;
}

/* Hands out pooled block I for NEED bytes (pool_fit's): cut at NEED where the device cuts it (the
 * rest, small pages, back into the pool), its pages where they are. Returns as pool_stitch. */
static int pool_serve(ferry *f, int dev, size_t i, uint64_t need, ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    ferry__pool_buf b = D->pool[i];
    void *parts[1] = {b.base}, *base, *rest;
    uint64_t got, rest_size;
    int gone = 0;
    int rc = D->d->ops->stitch(D->d, parts, 1, need, &base, &got, &rest, &rest_size, &gone);
    if (rc || base != b.base || got > b.size)
        return 0; /* a cut refused (no memory for its record): nothing changed */
    D->pool[i] = D->pool[--D->n_pool];
    D->pooled -= b.size;
    if (rest && !pool_put(f, dev, rest, rest_size)) {
        dev_free(f, dev, rest);
        D->used -= rest_size;
    }
    out->base = base;
    out->size = got;
    out->moved = 0;
    return 1;
}

/* Gives back the tails of the pooled blocks of 2 MiB and more (cut_tail) before a stitch of
 * several parts: a part with a tail would put every page after it off its 2 MiB boundary. */
static void cut_tails(ferry *f, int dev)
{
    ferry__dev *D = &f->devs[dev];
    for (size_t i = 0; i < D->n_pool; i++) {
        ferry__pool_buf *b = &D->pool[i];
        if (!b->segs || b->size < FERRY__HUGE_PAGE || body_of(b->size) == b->size ||
            (uintptr_t)b->base % FERRY__HUGE_PAGE != 0)
            continue;
        uint64_t size = b->size;
        uint32_t segs = b->segs;
        if (cut_tail(f, dev, b->base, &size, &segs)) {
            D->pooled -= b->size - size;
            b->size = size;
            b->segs = segs;
        } else {
            b->segs = 0; /* whole pages and a tail it could not give back: by size only */
        }
    }
}

/* Serves NEED bytes on the cpu device from pooled mapped blocks plus at most ROOM fresh bytes: a
 * block that fits (pool_fit) where it lies; else the pooled blocks' tails are given back
 * (cut_tails) and the parts fill NEED's whole 2 MiB pages (its body) with whole pooled runs of
 * them, the last cut at a 2 MiB boundary; a tail of small pages after the body comes from a pooled
 * block under 2 MiB, or fresh. Returns 1 when *OUT holds the block (accounted), 0 when the pool
 * cannot serve it (the caller evicts or takes fresh memory; a pooled block may have been cut in
 * two), -1 when the kernel refused to move pages after moving some: the parts tried are gone
 * (accounted as freed), the caller tries again; -2 when memory ran short before anything moved:
 * nothing changed, and the caller goes on without stitching (trimming the pool gives memory back,
 * where stitching needs some more). */
static int pool_stitch(ferry *f, int dev, uint64_t need, uint64_t room, ferry__mem *out)
{
    ferry__dev *D = &f->devs[dev];
    uint64_t body = body_of(need);
    size_t fit = pool_fit(D, need);
    if (fit != SIZE_MAX)
        return pool_serve(f, dev, fit, need, out);
    cut_tails(f, dev);
    uint64_t avail = 0;
    size_t single = SIZE_MAX;
    for (size_t i = 0; i < D->n_pool; i++) {
        if (!D->pool[i].segs)
            continue;
        avail += D->pool[i].size;
        if (D->pool[i].size >= body &&
            (single == SIZE_MAX || D->pool[i].size < D->pool[single].size))
            single = i;
    }
    if (!avail || (avail < need && need - avail > room))
        return 0;
    /* the parts: the smallest block that holds the body, else the largest blocks first */
    size_t pick[STITCH_MAX_PARTS];
    size_t n = 0;
    uint64_t sum = 0;
    uint32_t segs = 0;
    if (single != SIZE_MAX) {
        pick[n++] = single;
        sum = D->pool[single].size;
        segs = D->pool[single].segs;
    }
    while (sum < body && n < STITCH_MAX_PARTS) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < D->n_pool; i++) {
            if (D->pool[i].segs && !picked(pick, n, i) &&
                segs + D->pool[i].segs <= STITCH_MAX_SEGS &&
                (best == SIZE_MAX || D->pool[i].size > D->pool[best].size))
                best = i;
        }
        if (best == SIZE_MAX)
            break;
        pick[n++] = best;
        sum += D->pool[best].size;
        segs += D->pool[best].segs;
    }
    if (body < need && sum > body) {
        /* a run of 2 MiB pages reaching past the body: cut at the body's end, not at NEED
         * (inside a huge page). A part under 2 MiB holds small pages and is cut anywhere. */
        size_t last = pick[n - 1];
        uint64_t off = sum - D->pool[last].size;
        if (D->pool[last].size >= FERRY__HUGE_PAGE && off % FERRY__HUGE_PAGE == 0 &&
            (uintptr_t)D->pool[last].base % FERRY__HUGE_PAGE == 0) {
            if (!pool_cut(f, dev, last, body - off))
                return 0;
            sum = body;
        }
    }
    if (body < need && sum == body && n < STITCH_MAX_PARTS) {
        /* the tail: the smallest pooled block of small pages that holds it */
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < D->n_pool; i++) {
            if (D->pool[i].segs && !picked(pick, n, i) && D->pool[i].size < FERRY__HUGE_PAGE &&
                D->pool[i].size >= need - body && segs + D->pool[i].segs <= STITCH_MAX_SEGS &&
                (best == SIZE_MAX || D->pool[i].size < D->pool[best].size))
                best = i;
        }
        if (best != SIZE_MAX) {
            pick[n++] = best;
            sum += D->pool[best].size;
        }
    }
    if (sum < need && need - sum > room) {
        /* capped: free pooled blocks not picked until the fresh rest fits */
        uint64_t want = need - sum - room;
        for (size_t i = 0; i < D->n_pool && want; i++) {
            if (picked(pick, n, i))
                continue;
            ferry__pool_buf b = D->pool[i];
            dev_free(f, dev, b.base);
            D->pooled -= b.size;
            D->used -= b.size;
            want = b.size >= want ? 0 : want - b.size;
            /* keep the picked indices valid: the last entry moves into slot i */
            size_t last = --D->n_pool;
            for (size_t k = 0; k < n; k++)
                if (pick[k] == last)
                    pick[k] = i;
            D->pool[i] = D->pool[last];
            i--;
        }
        if (want)
            return 0; /* cannot happen: avail + room >= need */
    }
    if (!ferry__device_has_reuse(D->d)) {
        D->no_stitch = 1;
        return 0;
    }
    void *parts[STITCH_MAX_PARTS];
    for (size_t k = 0; k < n; k++)
        parts[k] = D->pool[pick[k]].base;
    void *base, *rest;
    uint64_t got, rest_size;
    int gone = 0;
    int rc = D->d->ops->stitch(D->d, parts, n, need, &base, &got, &rest, &rest_size, &gone);
    if (rc == FERRY_EINVAL || rc == FERRY_EUNSUPPORTED) {
        D->no_stitch = 1; /* the pool goes on by size alone */
        return 0;
    }
    if (rc && !gone)
        return -2; /* short of memory, nothing moved: the parts stay pooled */
    /* the parts leave the pool (highest index first, so the others stay where they are) */
    for (size_t a = 0; a < n; a++)
        for (size_t b = a + 1; b < n; b++)
            if (pick[b] > pick[a]) {
                size_t x = pick[a];
                pick[a] = pick[b];
                pick[b] = x;
            }
    for (size_t k = 0; k < n; k++)
        D->pool[pick[k]] = D->pool[--D->n_pool];
    D->pooled -= sum;
    if (rc) {
        D->used -= sum; /* unmapped by the failed stitch */
        return -1;
    }
    uint64_t kept = 0;
    if (rest) {
        if (pool_put(f, dev, rest, rest_size))
            kept = rest_size;
        else
            dev_free(f, dev, rest);
    }
    D->used = D->used + got + kept - sum;
    if (D->used > D->peak)
        D->peak = D->used;
    out->base = base;
    out->size = got;
    out->moved = n > 1 || sum < need; /* else a cut of one block, its pages where they were */
    return 1;
}

static int reserve(ferry *f, int dev, uint64_t size, uint64_t min_dist, int use_pool,
                   ferry__mem *out, ferry__err *e)
{
    ferry__dev *D = &f->devs[dev];
    if (dev == FERRY__HOST && f->first.warming)
        ferry__first_warm_join(f);
    out->base = NULL;
    out->size = 0;
    out->moved = 0;
    int stitch = use_pool && D->budget && !D->default_budget && !D->no_stitch &&
                 ferry__device_has_reuse(D->d) && size >= FERRY__CPU_MAP_MIN && size <= UINT64_MAX - 4096;
    out->small_pages = 0;
    if (stitch) /* whole huge pages: 4 KiB-granular blocks cut and joined would split them */
        size = stitched_size(size);
    else if (use_pool && pool_take(f, dev, size, out))
        return 0;
    const ferry_tensor *lt = f->moe.loading;
    uint64_t below, kept;
    int small = 0; /* a fresh block, when it comes to that, asks for small pages */
    if (stitch && lt && !f->moe.guess && first_pass_pages(f, dev) && streams_on(f, lt, dev) &&
        size <= D->budget && first_pass_share(f, dev, &below, &kept)) {
        int k = kept ? first_pass_kept(f, lt, below) : -1; /* nothing kept: as before */
        if (k == 0 && first_pass_stream(f, dev, size, below, kept, out))
            return 0;
        small = k == 1;
        if (small && kept_take(f, size, out))
            return 0;
    }
    if (D->budget && size > D->budget)
        return ferry__budget_check(f, dev, 0, size, NULL, e); /* never fits: evict nothing */
    if (f->moe.loading && ferry__expert_unit(f, f->moe.loading))
        ferry__evict_loading(&f->moe.ev, f->moe.loading->uid);
    for (;;) {
        uint64_t room = !D->budget ? UINT64_MAX
                        : D->used <= D->budget ? D->budget - D->used
                                               : 0;
        /* a copy predicted kept takes a fresh block of small pages: the pool's huge pages are
         * for the streamed copies */
        if (stitch && !D->no_stitch && !small) {
            int r = pool_stitch(f, dev, size, room, out);
            if (r > 0)
                return 0;
            if (r == -1)
                continue;
            if (r == -2)
                stitch = 0;
        }
        if (size <= room)
            break;
        if (dev == FERRY__HOST && f->first.kept_size) {
            ferry__first_kept_drop(f); /* room before any copy goes */
            continue;
        }
        if (D->pooled && pool_trim(f, dev, size - room, stitch && !small && !D->no_stitch))
            continue;
        ferry_tensor *v = pick_victim(f, dev, min_dist);
        if (!v) {
            char b1[32], b2[32], b3[32];
            return ferry__fail(e, FERRY_EBUDGET,
                               "%s: budget %s%s: cannot fit %s more (%s held, nothing evictable)",
                               D->p.name, ferry__fmt_size(D->budget, b1),
                               D->default_budget ? " (the default: what the host's RAM and memory "
                                                   "cgroup can give, less a margin)"
                                                 : "",
                               ferry__fmt_size(size, b2), ferry__fmt_size(D->used, b3));
        }
        evict(f, v);
        if (!stitch && use_pool && pool_take(f, dev, size, out))
            return 0;
    }
    D->used += size;
    if (D->used > D->peak)
        D->peak = D->used;
    out->size = size;
    out->small_pages = small;
    return 0;
}

int ferry__budget_check(ferry *f, int dev, uint64_t kept, uint64_t staged, const char *name,
                        ferry__err *e)
{
    ferry__dev *D = &f->devs[dev];
    if (!D->budget || (kept <= D->budget && staged <= D->budget - kept))
        return 0;
    uint64_t need = kept + staged < kept ? UINT64_MAX : kept + staged;
    char b1[32], b2[32], b3[32], b4[32], b5[32], who[160] = "";
    const char *dflt = D->default_budget ? " (the default: what the host's RAM and memory cgroup "
                                           "can give, less a margin)"
                                         : "";
    if (name)
        snprintf(who, sizeof who, " (tensor '%.120s')", name);
    if (!kept)
        return ferry__fail(e, FERRY_EBUDGET,
                           "%s: %s%s do not fit in a budget of %s%s (%s short)", D->p.name,
                           ferry__fmt_size(staged, b1), who, ferry__fmt_size(D->budget, b2), dflt,
                           ferry__fmt_size(need - D->budget, b3));
    if (!staged)
        return ferry__fail(e, FERRY_EBUDGET, "%s: budget %s%s: %s kept (home copies, never "
                           "evicted), %s short", D->p.name, ferry__fmt_size(D->budget, b1), dflt,
                           ferry__fmt_size(kept, b2), ferry__fmt_size(need - D->budget, b3));
    return ferry__fail(e, FERRY_EBUDGET, "%s: budget %s%s: %s kept (home copies, never "
                       "evicted) + %s staged beside them%s = %s, %s short", D->p.name,
                       ferry__fmt_size(D->budget, b1), dflt, ferry__fmt_size(kept, b2),
                       ferry__fmt_size(staged, b3), who, ferry__fmt_size(need, b4),
                       ferry__fmt_size(need - D->budget, b5));
}

void ferry__shrink(ferry *f, int dev)
{
    ferry__dev *D = &f->devs[dev];
    if (D->pooled && D->used > D->budget)
        ferry__pool_trim(f, dev, D->used - D->budget);
    while (D->used > D->budget) {
        ferry_tensor *v = pick_victim(f, dev, 0);
        if (!v)
            break;
        evict(f, v);
        if (D->pooled)
            ferry__pool_trim(f, dev, UINT64_MAX);
    }
}
