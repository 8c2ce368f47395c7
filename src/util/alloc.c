/*
 * alloc.c — the allocation seam: every heap allocation of the library's own code goes through
 * these (util.h redirects malloc, calloc, realloc, posix_memalign and aligned_alloc to them while
 * building the library), so that a test can fail the N-th one, once or for good, as SQLite's
 * test allocator does, and check that each failure is an error and never a crash.
 * The names in parentheses below are the C library's: the parentheses stop the redirection.
 */
#include "util/util.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

static atomic_uint_fast64_t counted;  /* allocations since the last ferry_fail_alloc */
static atomic_uint_fast64_t fail_at;  /* the count that fails; 0: none */
static atomic_int fail_after;         /* and every one after it */

/* 1 when this allocation is to fail. */
static int injected(void)
{
    uint64_t at = atomic_load_explicit(&fail_at, memory_order_relaxed);
    uint64_t n = atomic_fetch_add_explicit(&counted, 1, memory_order_relaxed) + 1;
    if (!at)
        return 0;
    return n == at || (n > at && atomic_load_explicit(&fail_after, memory_order_relaxed));
}

FERRY_API uint64_t ferry_fail_alloc(uint64_t n, int persistent)
{
    atomic_store(&fail_at, 0);
    uint64_t before = atomic_exchange(&counted, 0);
    atomic_store(&fail_after, persistent != 0);
    atomic_store(&fail_at, n);
    return before;
}

void *ferry__malloc(size_t n)
{
    return injected() ? NULL : (malloc)(n);
}

void *ferry__calloc(size_t n, size_t size)
{
    return injected() ? NULL : (calloc)(n, size);
}

void *ferry__realloc(void *p, size_t n)
{
    return injected() ? NULL : (realloc)(p, n);
}

int ferry__posix_memalign(void **p, size_t align, size_t n)
{
    return injected() ? ENOMEM : (posix_memalign)(p, align, n);
}

void *ferry__aligned_alloc(size_t align, size_t n)
{
    return injected() ? NULL : (aligned_alloc)(align, n);
}
