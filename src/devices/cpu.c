/*
 * cpu.c — the "cpu" device: host RAM. Device memory is host memory (host_accessible = 1, so the
 * core may hand out pointers into a file mapping instead of copying). Copies are memcpy done in
 * the calling thread: a ticket is complete when it is returned, and wait only checks it was issued.
 * Allocations are page-aligned, so O_DIRECT reads may land in them.
 *
 * Large blocks (the weights) are mapped with mmap and unmapped on free, never taken from the
 * malloc heap: freed heap memory stays in the process, so a budget of B bytes would not bound the
 * resident set. The device remembers the size of each mapped block (free gets only the pointer).
 */
#include "devices/devices.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#define CPU_ALIGN 4096
/* Largest single allocation: what a pointer difference can hold; the OS refuses sooner. */
#define CPU_MAX_ALLOC ((uint64_t)PTRDIFF_MAX - CPU_ALIGN)

#define CPU_MMAP_MIN (UINT64_C(256) << 10) /* blocks this large are mapped */

/* Mapped blocks: open addressing on the address, deletion by backward shift. */
typedef struct cpu_block {
    uintptr_t addr; /* 0: empty slot */
    uint64_t size;
} cpu_block;

typedef struct cpu_device {
    ferry_device base;  /* first: a cpu_device * is a ferry_device * */
    _Atomic uint64_t last_ticket; /* tickets issued so far; ticket T is valid when 1 <= T <= this */
    pthread_mutex_t lock;         /* guards blocks, cap, n */
    cpu_block *blocks;
    size_t cap, n;
} cpu_device;

static size_t slot_of(uintptr_t a, size_t cap)
{
    return (size_t)((a >> 12) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

static int blocks_put(cpu_device *c, uintptr_t a, uint64_t size)
{
    if ((c->n + 1) * 4 > c->cap * 3) {
        size_t cap = c->cap ? c->cap * 2 : 64;
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
    size_t j = slot_of(a, c->cap);
    while (c->blocks[j].addr)
        j = (j + 1) & (c->cap - 1);
    c->blocks[j].addr = a;
    c->blocks[j].size = size;
    c->n++;
    return 0;
}

/* Removes A; returns its size, or 0 when A is not a mapped block. */
static uint64_t blocks_take(cpu_device *c, uintptr_t a)
{
    if (!c->cap)
        return 0;
    size_t mask = c->cap - 1, i = slot_of(a, c->cap);
    while (c->blocks[i].addr && c->blocks[i].addr != a)
        i = (i + 1) & mask;
    if (!c->blocks[i].addr)
        return 0;
    uint64_t size = c->blocks[i].size;
    for (size_t k = i;;) {
        c->blocks[i].addr = 0;
        for (;;) {
            k = (k + 1) & mask;
            if (!c->blocks[k].addr) {
                c->n--;
                return size;
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
        if (c->blocks[i].addr)
            munmap((void *)c->blocks[i].addr, c->blocks[i].size);
    free(c->blocks);
    pthread_mutex_destroy(&c->lock);
    free(d);
}

static int cpu_alloc(ferry_device *d, uint64_t size, void **ptr)
{
    char a[32];
    *ptr = NULL;
    if (size > d->max_alloc)
        return ferry__device_fail(d, FERRY_ENOMEM,
                                  "%s: allocation of %" PRIu64 " bytes exceeds max_alloc %" PRIu64,
                                  d->name, size, d->max_alloc);
    cpu_device *c = (cpu_device *)d;
    void *p = NULL;
    if (size >= CPU_MMAP_MIN && size <= SIZE_MAX) {
        p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            p = NULL;
        } else {
            pthread_mutex_lock(&c->lock);
            int rc = blocks_put(c, (uintptr_t)p, size);
            pthread_mutex_unlock(&c->lock);
            if (rc) {
                munmap(p, (size_t)size);
                p = NULL;
            }
        }
    } else {
        p = ferry__host_aligned_alloc(size, CPU_ALIGN);
    }
    if (!p)
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: out of host memory allocating %s",
                                  d->name, ferry__fmt_size(size, a));
    *ptr = p;
    return 0;
}

static void cpu_free(ferry_device *d, void *ptr)
{
    if (!ptr)
        return;
    cpu_device *c = (cpu_device *)d;
    pthread_mutex_lock(&c->lock);
    uint64_t size = blocks_take(c, (uintptr_t)ptr);
    pthread_mutex_unlock(&c->lock);
    if (size)
        munmap(ptr, (size_t)size);
    else
        ferry__host_free(ptr);
}

static int cpu_copy(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket,
                    const char *what)
{
    if (n && (!dst || !src))
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes with a NULL pointer",
                                  d->name, what, n);
    if (n > SIZE_MAX)
        return ferry__device_fail(d, FERRY_EINVAL, "%s: %s of %" PRIu64 " bytes is too large",
                                  d->name, what, n);
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
                                  d->name, ticket, last);
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
                                  d->name);
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

static const ferry_device_ops cpu_ops = {
    .version = FERRY_DEVICE_OPS_VERSION,
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
    *out = &c->base;
    return 0;
}
