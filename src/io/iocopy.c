/*
 * iocopy.c — the memory copy of the engine's warm path (page cache -> destination through the
 * mapping). Workers copy one chunk (about 16 MiB) at a time, which is below the size where the C
 * library's memcpy switches to non-temporal stores on machines with large caches; it then pays a
 * read-for-ownership of every destination line and ends up about 1.4x slower per byte than one
 * large memcpy. This copy streams: non-temporal 16-byte stores, walking four destination pages
 * at once line by line so that several DRAM pages are open together. SSE2 is part of x86-64, so no
 * run-time dispatch is needed; other machines use memcpy.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels refuse it and the copy faults */
#endif

#include "io/io_internal.h"

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>

#define PAGE 4096u
#define GROUP (4u * PAGE)

void ferry__io_copy(void *dst, const void *src, size_t n)
{
    if (n < FERRY__IO_STREAM_MIN) {
        memcpy(dst, src, n);
        return;
    }
    unsigned char *d = dst;
    const unsigned char *s = src;
    /* Invariant below: d is page-aligned. n is large here, so the head is shorter than n. */
    size_t head = (PAGE - (uintptr_t)d % PAGE) % PAGE;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= GROUP; d += GROUP, s += GROUP, n -= GROUP) {
        for (size_t line = 0; line < PAGE; line += 64) {
            for (size_t p = 0; p < GROUP; p += PAGE) {
                const unsigned char *sp = s + p + line;
                unsigned char *dp = d + p + line;
                __m128i a = _mm_loadu_si128((const __m128i *)sp);
                __m128i b = _mm_loadu_si128((const __m128i *)(sp + 16));
                __m128i c = _mm_loadu_si128((const __m128i *)(sp + 32));
                __m128i e = _mm_loadu_si128((const __m128i *)(sp + 48));
                _mm_stream_si128((__m128i *)dp, a);
                _mm_stream_si128((__m128i *)(dp + 16), b);
                _mm_stream_si128((__m128i *)(dp + 32), c);
                _mm_stream_si128((__m128i *)(dp + 48), e);
            }
        }
    }
    /* streamed stores are weakly ordered: fence before anyone is told the data is there */
    _mm_sfence();
    memcpy(d, s, n);
}

#else

void ferry__io_copy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

#endif

void ferry__io_populate(void *dst, size_t n)
{
    /* one call faults the pages in, where a copy or a read would fault each on its own (several
     * times slower); on pages already there it only walks the page table */
    uint64_t page = ferry__io_page_size();
    uintptr_t lo = ((uintptr_t)dst + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)dst + n) & ~(uintptr_t)(page - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
}
