/*
 * cpu.c — the "cpu" device: host RAM. Device memory is host memory (host_accessible = 1, so the
 * core may hand out pointers into a file mapping instead of copying). Copies are memcpy done in
 * the calling thread: a ticket is complete when it is returned, and wait only checks it was issued.
 * Allocations are page-aligned, so O_DIRECT reads may land in them.
 */
#include "devices/devices.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPU_ALIGN 4096
/* Largest single allocation: what a pointer difference can hold; the OS refuses sooner. */
#define CPU_MAX_ALLOC ((uint64_t)PTRDIFF_MAX - CPU_ALIGN)

typedef struct cpu_device {
    ferry_device base;  /* first: a cpu_device * is a ferry_device * */
    _Atomic uint64_t last_ticket; /* tickets issued so far; ticket T is valid when 1 <= T <= this */
} cpu_device;

static void cpu_destroy(ferry_device *d)
{
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
    void *p = ferry__host_aligned_alloc(size, CPU_ALIGN);
    if (!p)
        return ferry__device_fail(d, FERRY_ENOMEM, "%s: out of host memory allocating %s",
                                  d->name, ferry__fmt_size(size, a));
    *ptr = p;
    return 0;
}

static void cpu_free(ferry_device *d, void *ptr)
{
    (void)d;
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
    atomic_init(&c->last_ticket, 0);
    *out = &c->base;
    return 0;
}
