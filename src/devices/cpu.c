/*
 * cpu.c — the "cpu" device: host RAM. Device memory is host memory (host_accessible = 1, so the
 * core may hand out pointers into a file mapping instead of copying). Copies are memcpy done in
 * the calling thread: a ticket is complete when it is returned, and wait only checks it was issued.
 * Allocations are page-aligned, so O_DIRECT reads may land in them.
 *
 * Large blocks (the weights) are mapped with mmap and unmapped on free, never taken from the
 * malloc heap: freed heap memory stays in the process, so a budget of B bytes would not bound the
 * resident set. The device remembers the size of each mapped block (free gets only the pointer).
 *
 * Stitching (Linux). Fresh anonymous memory is slow to use the first time (the kernel zeroes and
 * charges every page: 1.4-4 GB/s on these machines, as slow as the disk), so the core keeps freed
 * blocks in a pool. A streamed model asks for other sizes than it frees, though; ferry__cpu_stitch
 * makes one block of any size out of pooled blocks by moving their pages with mremap — page-table
 * moves, no copy and no fault — into one fresh range, and cuts a block in two without any system
 * call. A block may so span several kernel mappings (VMAs), and mremap moves only within one:
 * each block records the offsets where one of its mappings may end ("cuts"), and its pages are
 * moved one segment at a time.
 */
#include "devices/devices.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>

#define CPU_ALIGN 4096
/* Largest single allocation: what a pointer difference can hold; the OS refuses sooner. */
#define CPU_MAX_ALLOC ((uint64_t)PTRDIFF_MAX - CPU_ALIGN)

#define CPU_MMAP_MIN FERRY__CPU_MAP_MIN

/* Mapped blocks: open addressing on the address, deletion by backward shift. */
typedef struct cpu_block {
    uintptr_t addr; /* 0: empty slot */
    uint64_t size;  /* a multiple of CPU_ALIGN */
    uint64_t *cuts; /* ascending offsets in (0, size) where a mapping may end; NULL when none */
    uint32_t ncuts;
} cpu_block;

typedef struct cpu_device {
    ferry__devbase base;  /* first: a cpu_device * is a ferry_device * */
    _Atomic uint64_t last_ticket; /* tickets issued so far; ticket T is valid when 1 <= T <= this */
    pthread_mutex_t lock;         /* guards blocks, cap, n */
    cpu_block *blocks;
    size_t cap, n;
    _Atomic int huge;             /* ferry__cpu_set_reuse: map blocks with huge pages */
} cpu_device;

/* Asks for transparent huge pages on the mapped block [P, P+LEN) (a hint: without THP, or where
 * the kernel finds no free 2 MiB page, it maps small pages as before). */
static void huge_pages(void *p, uint64_t len)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (len >= FERRY__HUGE_PAGE)
        (void)madvise(p, (size_t)len, MADV_HUGEPAGE);
#else
    (void)p, (void)len;
#endif
}

/* An anonymous mapping of LEN bytes (a multiple of 4 KiB); from 2 MiB up it starts on a 2 MiB
 * boundary, so that huge pages can back all of it. MAP_FAILED when the kernel refuses. */
static void *map_block(uint64_t len)
{
    const uint64_t huge = FERRY__HUGE_PAGE;
    if (len < huge || len > SIZE_MAX - huge)
        return mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                    0);
    void *p = ferry__map_aligned(len, huge, mmap, munmap);
    return p ? p : MAP_FAILED;
}

void ferry__cpu_set_reuse(ferry_device *d, int reuse)
{
    if (ferry__cpu_is(d))
        atomic_store(&((cpu_device *)d)->huge, reuse != 0);
}

static size_t slot_of(uintptr_t a, size_t cap)
{
    return (size_t)((a >> 12) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

/* Makes room for EXTRA more entries, so that the next EXTRA puts cannot fail. */
static int blocks_reserve(cpu_device *c, size_t extra)
{
    if ((c->n + extra) * 4 > c->cap * 3) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        while ((c->n + extra) * 4 > cap * 3)
            cap *= 2;
        cpu_block *nb = calloc(cap, sizeof *nb);
        if (!nb)
            return -1;
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->blocks[i].addr)
                continue;
            size_t j = slot_of(c->blocks[i].addr, cap);
            while (nb[j].addr)
                j = (j + 1) & (cap - 1);
            nb[j] = c->blocks[i];
        }
        free(c->blocks);
        c->blocks = nb;
        c->cap = cap;
    }
    return 0;
}

static int blocks_put(cpu_device *c, cpu_block b)
{
    if (blocks_reserve(c, 1))
        return -1;
    size_t j = slot_of(b.addr, c->cap);
    while (c->blocks[j].addr)
        j = (j + 1) & (c->cap - 1);
    c->blocks[j] = b;
    c->n++;
    return 0;
}

static size_t blocks_find(const cpu_device *c, uintptr_t a)
{
    if (!c->cap)
        return SIZE_MAX;
    size_t mask = c->cap - 1, i = slot_of(a, c->cap);
    while (c->blocks[i].addr && c->blocks[i].addr != a)
        i = (i + 1) & mask;
    return c->blocks[i].addr ? i : SIZE_MAX;
}

/* Removes A into *OUT; returns 0, or -1 when A is not a mapped block. */
static int blocks_take(cpu_device *c, uintptr_t a, cpu_block *out)
{
    size_t i = blocks_find(c, a);
    if (i == SIZE_MAX)
        return -1;
    size_t mask = c->cap - 1;
    *out = c->blocks[i];
    for (size_t k = i;;) {
        c->blocks[i].addr = 0;
        for (;;) {
            k = (k + 1) & mask;
            if (!c->blocks[k].addr) {
                c->n--;
                return 0;
            }
            size_t home = slot_of(c->blocks[k].addr, c->cap);
            if (i <= k ? (home <= i || home > k) : (home <= i && home > k))
                break;
        }
        c->blocks[i] = c->blocks[k];
        i = k;
    }
}

static void cpu_destroy(ferry_device *d)
{
    cpu_device *c = (cpu_device *)d;
    for (size_t i = 0; i < c->cap; i++)
        if (c->blocks[i].addr) {
            munmap((void *)c->blocks[i].addr, c->blocks[i].size);
            free(c->blocks[i].cuts);
        }
    free(c->blocks);
    pthread_mutex_destroy(&c->lock);
    free(d);
}

static int cpu_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    char a[32];
    *ptr = NULL;
    if (size > FERRY__DP(d).max_alloc)
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: allocation of %" PRIu64 " bytes exceeds max_alloc %" PRIu64,
                                  FERRY__DP(d).name, size, FERRY__DP(d).max_alloc);
    cpu_device *c = (cpu_device *)d;
    void *p = NULL;
    if (size >= CPU_MMAP_MIN && size <= SIZE_MAX - CPU_ALIGN) {
        uint64_t len = (size + CPU_ALIGN - 1) & ~(uint64_t)(CPU_ALIGN - 1);
        p = map_block(len);
        if (p == MAP_FAILED) {
            p = NULL;
        } else {
            if (atomic_load(&c->huge))
                huge_pages(p, len);
            pthread_mutex_lock(&c->lock);
            int rc = blocks_put(c, (cpu_block){.addr = (uintptr_t)p, .size = len});
            pthread_mutex_unlock(&c->lock);
            if (rc) {
                munmap(p, (size_t)len);
                p = NULL;
            }
        }
    } else {
        p = ferry__host_aligned_alloc(size, CPU_ALIGN);
    }
    if (!p)
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: out of host memory allocating %s",
                                  FERRY__DP(d).name, ferry__fmt_size(size, a));
    *ptr = p;
    return 0;
}

static void cpu_free(ferry_device *d, void *ptr)
{
    if (!ptr)
        return;
    cpu_device *c = (cpu_device *)d;
    cpu_block b;
    pthread_mutex_lock(&c->lock);
    int mapped = blocks_take(c, (uintptr_t)ptr, &b) == 0;
    pthread_mutex_unlock(&c->lock);
    if (mapped) {
        munmap(ptr, (size_t)b.size);
        free(b.cuts);
    } else {
        ferry__host_free(ptr);
    }
}

static int cpu_copy(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket,
                    const char *what)
{
    if (n && (!dst || !src))
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes with a NULL pointer",
                                  FERRY__DP(d).name, what, n);
    if (n > SIZE_MAX)
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes is too large",
                                  FERRY__DP(d).name, what, n);
    if (n)
        memmove(dst, src, (size_t)n);
    if (ticket)
        *ticket = atomic_fetch_add(&((cpu_device *)d)->last_ticket, 1) + 1;
    return 0;
}

static int cpu_copy_h2d(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return cpu_copy(d, dst, src, n, ticket, "copy_h2d");
}

static int cpu_copy_d2h(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket)
{
    return cpu_copy(d, dst, src, n, ticket, "copy_d2h");
}

static int cpu_wait(ferry_device *d, uint64_t ticket)
{
    uint64_t last = atomic_load(&((cpu_device *)d)->last_ticket);
    if (ticket == 0 || ticket > last)
        return ferry__device_fail(d, FERRY_EINVAL,
                                  "%s: wait on ticket %" PRIu64 ", which was never issued (last %" PRIu64 ")",
                                  FERRY__DP(d).name, ticket, last);
    return 0;
}

static int cpu_synchronize(ferry_device *d)
{
    (void)d;
    return 0;
}

static int cpu_mem_info(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes)
{
    uint64_t a, t;
    if (ferry__host_mem_info(&a, &t))
        return ferry__device_fail(d, FERRY_EUNSUPPORTED, "%s: cannot read the host's memory size",
                                  FERRY__DP(d).name);
    if (free_bytes)
        *free_bytes = a;
    if (total_bytes)
        *total_bytes = t;
    return 0;
}

static int cpu_read_sync(ferry_device *d, void *dst, const void *src, uint64_t n)
{
    return cpu_copy(d, dst, src, n, NULL, "read_sync");
}

/* Events: the cpu's copies are done when they return and the engine's work is the host's own, so
 * every event is complete; one shared marker serves as all of them. */
static char cpu_event_marker;

static int cpu_event_create(ferry_device *d, void **ev)
{
    (void)d;
    *ev = &cpu_event_marker;
    return 0;
}

static void cpu_event_destroy(ferry_device *d, void *ev)
{
    (void)d, (void)ev;
}

static int cpu_event_record(ferry_device *d, void *ev, void *stream)
{
    (void)d, (void)ev, (void)stream;
    return 0;
}

static int cpu_event_wait(ferry_device *d, void *ev, void *stream)
{
    (void)d, (void)ev, (void)stream;
    return 0;
}

static int cpu_event_query(ferry_device *d, void *ev)
{
    (void)d, (void)ev;
    return 1;
}

static const ferry_device_ops cpu_ops = {
    .version = FERRY_DEVICE_OPS_VERSION,
    .size = sizeof(ferry_device_ops),
    .props = ferry__device_props_op,
    .errmsg = ferry__device_errmsg_op,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_h2d = cpu_copy_h2d,
    .copy_d2h = cpu_copy_d2h,
    .wait = cpu_wait,
    .synchronize = cpu_synchronize,
    .mem_info = cpu_mem_info,
    .host_alloc = NULL, /* any host memory will do: the core's aligned malloc */
    .host_free = NULL,
    .read_sync = cpu_read_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_query = cpu_event_query,
    .set_reuse = ferry__cpu_set_reuse,
    .block = ferry__cpu_block,
    .stitch = ferry__cpu_stitch,
};

int ferry__cpu_open(const char *spec, ferry_device **out, char *err, size_t errlen)
{
    cpu_device *c = calloc(1, sizeof *c);
    if (!c) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", spec);
        return FERRY_ENOMEM;
    }
    ferry__device_init(&c->base, &cpu_ops, spec, "cpu", CPU_ALIGN, CPU_MAX_ALLOC, 1);
    pthread_mutex_init(&c->lock, NULL);
    atomic_init(&c->last_ticket, 0);
    *out = &c->base.pub;
    return 0;
}

/* ---- stitching -------------------------------------------------------------------------------- */

/* A rest smaller than this is not cut off a block: it stays with it (a pool of slivers would cost
 * one mremap each to reuse), unless the cut lies on a 2 MiB boundary, where it splits no huge page
 * and the rest is small pages the caller may give back. */
#define CPU_MIN_REST (UINT64_C(64) << 10)

int ferry__cpu_is(const ferry_device *d)
{
    return d && d->ops == &cpu_ops;
}

int ferry__cpu_block(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments)
{
    if (!ferry__cpu_is(d) || !p)
        return 0;
    cpu_device *c = (cpu_device *)d;
    pthread_mutex_lock(&c->lock);
    size_t i = blocks_find(c, (uintptr_t)p);
    if (i != SIZE_MAX) {
        if (size)
            *size = c->blocks[i].size;
        if (segments)
            *segments = c->blocks[i].ncuts + 1;
    }
    pthread_mutex_unlock(&c->lock);
    return i != SIZE_MAX;
}

/* Bytes [FROM, TO) of B as a block of their own at B.addr + FROM, its cuts shifted. */
static int carve(const cpu_block *b, uint64_t from, uint64_t to, cpu_block *out)
{
    *out = (cpu_block){.addr = b->addr + from, .size = to - from};
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->ncuts; i++)
        k += b->cuts[i] > from && b->cuts[i] < to;
    if (!k)
        return 0;
    if (!(out->cuts = malloc(k * sizeof *out->cuts)))
        return -1;
    for (uint32_t i = 0; i < b->ncuts; i++)
        if (b->cuts[i] > from && b->cuts[i] < to)
            out->cuts[out->ncuts++] = b->cuts[i] - from;
    return 0;
}

#ifdef __linux__
/* Moves bytes [0, LEN) of B to DST, one segment (one mapping at most) per mremap; *DONE gets the
 * bytes moved (all of LEN, or up to the segment the kernel refused). */
static int move_front(const cpu_block *b, uint64_t len, uintptr_t dst, uint64_t *done)
{
    uint64_t start = 0;
    for (uint32_t i = 0; start < len; i++) {
        uint64_t end = i < b->ncuts ? b->cuts[i] : b->size;
        if (end > len)
            end = len;
        if (mremap((void *)(b->addr + start), (size_t)(end - start), (size_t)(end - start),
                   MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(dst + start)) == MAP_FAILED) {
            *done = start;
            return -1;
        }
        start = end;
    }
    *done = len;
    return 0;
}
#endif

static double move_cost_s;
static pthread_once_t move_cost_once = PTHREAD_ONCE_INIT;

/* The time reading a byte of each of N pages at P takes. */
static double read_pages(const unsigned char *p, size_t n)
{
    double t0 = ferry__now();
    ferry__read_pages(p, (uint64_t)n * 4096);
    return ferry__now() - t0;
}

static void move_cost_measure(void)
{
#ifdef __linux__
    enum { PAGES = 64 };
    const size_t len = PAGES * 4096;
    double best = -1;
    for (int rep = 0; rep < 3; rep++) {
        unsigned char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                -1, 0);
        unsigned char *b = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED || b == MAP_FAILED) {
            if (a != MAP_FAILED)
                munmap(a, len);
            if (b != MAP_FAILED)
                munmap(b, len);
            break;
        }
#ifdef MADV_NOHUGEPAGE
        (void)madvise(a, len, MADV_NOHUGEPAGE);
#endif
        memset(a, 1, len);
        double plain = read_pages(a, PAGES);
        if (mremap(a, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, b) == MAP_FAILED) {
            munmap(a, len);
            munmap(b, len);
            break;
        }
        double moved = read_pages(b, PAGES);
        munmap(b, len);
        double c = moved > plain ? (moved - plain) / PAGES : 0;
        if (best < 0 || c < best)
            best = c;
    }
    move_cost_s = best > 0 ? best : 0;
#endif
}

double ferry__cpu_move_cost(void)
{
    pthread_once(&move_cost_once, move_cost_measure);
    return move_cost_s;
}

int ferry__cpu_stitch(ferry_device *d, void *const *parts, size_t n, uint64_t need, void **out,
                      uint64_t *out_size, void **rest, uint64_t *rest_size, int *gone)
{
    *out = *rest = NULL;
    *out_size = *rest_size = 0;
    *gone = 0;
    if (!ferry__cpu_is(d) || !n || n > 64 || !need || need > SIZE_MAX - CPU_ALIGN)
        return FERRY_EINVAL;
    need = (need + CPU_ALIGN - 1) & ~(uint64_t)(CPU_ALIGN - 1);
    cpu_device *c = (cpu_device *)d;
    cpu_block b[64];
    uint64_t sum = 0;
    pthread_mutex_lock(&c->lock);
    /* Every part must be a mapped block, and only the last may reach past NEED. */
    for (size_t i = 0; i < n; i++) {
        size_t k = blocks_find(c, (uintptr_t)parts[i]);
        if (k == SIZE_MAX || (i && sum >= need)) {
            pthread_mutex_unlock(&c->lock);
            return FERRY_EINVAL;
        }
        b[i] = c->blocks[k];
        sum += b[i].size;
    }
    if (sum >= need && blocks_reserve(c, 2)) {
        pthread_mutex_unlock(&c->lock);
        return FERRY_ENOMEM;
    }
    int rc = 0;
    cpu_block whole = {0}, tail = {0};
    if (n == 1 && b[0].size >= need) {
        /* a cut in two: no system call, the pages stay where they are */
        if (b[0].size == need ||
            (b[0].size - need < CPU_MIN_REST && (b[0].addr + need) % FERRY__HUGE_PAGE != 0)) {
            pthread_mutex_unlock(&c->lock);
            *out = parts[0];
            *out_size = b[0].size;
            return 0;
        }
        if (carve(&b[0], 0, need, &whole) || carve(&b[0], need, b[0].size, &tail)) {
            free(whole.cuts);
            pthread_mutex_unlock(&c->lock);
            return FERRY_ENOMEM;
        }
        cpu_block gone;
        blocks_take(c, b[0].addr, &gone);
        free(gone.cuts);
        blocks_put(c, whole); /* room reserved above */
        blocks_put(c, tail);
        pthread_mutex_unlock(&c->lock);
        *out = (void *)whole.addr;
        *out_size = whole.size;
        *rest = (void *)tail.addr;
        *rest_size = tail.size;
        return 0;
    }
#ifdef __linux__
    /* Cuts of the new block: each part's start and inner cuts, and where fresh pages begin. */
    uint32_t ncuts = 0;
    for (size_t i = 0; i < n; i++)
        ncuts += 1 + b[i].ncuts;
    whole.cuts = malloc(ncuts * sizeof *whole.cuts);
    /* 2 MiB-aligned like every mapped block: pages moved between 2 MiB-aligned offsets keep
     * their huge pages (mremap moves the whole page-table entry) */
    void *reg = whole.cuts ? map_block(need) : MAP_FAILED;
    if (reg == MAP_FAILED || blocks_reserve(c, 2)) {
        if (reg != MAP_FAILED)
            munmap(reg, (size_t)need);
        free(whole.cuts);
        pthread_mutex_unlock(&c->lock);
        return FERRY_ENOMEM; /* nothing moved: the parts are as they were */
    }
    whole.addr = (uintptr_t)reg;
    whole.size = need;
    if (atomic_load(&c->huge))
        huge_pages(reg, need);
    uint64_t off = 0, part_done = 0;
    size_t moved = 0; /* parts whose bytes up to NEED have all moved */
    for (; moved < n; moved++) {
        uint64_t len = b[moved].size < need - off ? b[moved].size : need - off;
        if (off)
            whole.cuts[whole.ncuts++] = off;
        for (uint32_t k = 0; k < b[moved].ncuts && b[moved].cuts[k] < len; k++)
            whole.cuts[whole.ncuts++] = off + b[moved].cuts[k];
        if (len < b[moved].size && carve(&b[moved], len, b[moved].size, &tail)) {
            rc = FERRY_ENOMEM;
            break;
        }
        if (move_front(&b[moved], len, whole.addr + off, &part_done)) {
            rc = errno == ENOMEM ? FERRY_ENOMEM : FERRY_EIO;
            break;
        }
        off += len;
    }
    if (rc) {
        free(tail.cuts);
        free(whole.cuts);
        if (!moved && !part_done) {
            /* nothing moved: the parts stay as they were, in the table */
            munmap(reg, (size_t)need);
            pthread_mutex_unlock(&c->lock);
            return rc;
        }
        /* Some pages moved into REG, which goes with them. The ranges they left are holes that
         * another thread's mmap may have taken meanwhile: only what never moved is unmapped. */
        for (size_t i = 0; i < n; i++) {
            cpu_block left;
            blocks_take(c, b[i].addr, &left);
            uint64_t from = i < moved ? left.size : i == moved ? part_done : 0;
            if (from < left.size)
                munmap((void *)(left.addr + from), (size_t)(left.size - from));
            free(left.cuts);
        }
        munmap(reg, (size_t)need);
        pthread_mutex_unlock(&c->lock);
        *gone = 1;
        return rc;
    }
    if (off < need)
        whole.cuts[whole.ncuts++] = off;
    /* The parts leave the table: their pages now belong to REG (and the rest to TAIL). */
    for (size_t i = 0; i < n; i++) {
        cpu_block left;
        blocks_take(c, b[i].addr, &left);
        free(left.cuts);
    }
    if (!whole.ncuts) {
        free(whole.cuts);
        whole.cuts = NULL;
    }
    blocks_put(c, whole);
    if (tail.addr)
        blocks_put(c, tail);
    pthread_mutex_unlock(&c->lock);
    *out = reg;
    *out_size = need;
    if (tail.addr) {
        *rest = (void *)tail.addr;
        *rest_size = tail.size;
    }
    return 0;
#else
    (void)rc;
    (void)tail;
    pthread_mutex_unlock(&c->lock);
    return FERRY_EUNSUPPORTED;
#endif
}
