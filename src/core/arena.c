/*
 * arena.c — one mapping for the private host copies of a group load.
 *
 * A group load that reads many tensors into private host memory pays for two things besides the
 * disk: faulting in fresh pages (on a VM, first touch runs at 1.4-4 GB/s, no faster than the disk)
 * and, with O_DIRECT, the size of each request, which on a device with few segments per request
 * depends on how physically contiguous the destination is (4 KiB pages cap a request at 1 MiB on
 * virtio with 254 segments). So the load lays the copies of each run of neighbouring tensors of a
 * file into one anonymous mapping, 2 MiB-aligned and advised MADV_HUGEPAGE, in file order, reads
 * each range of neighbours as one request to the I/O pool (which cuts it into 16 MiB chunks for
 * its workers, as a plain sequential reader would), and where they are not relayed a toucher
 * thread faults the mapping in (MADV_POPULATE_WRITE, which never changes a byte) ahead of them.
 * The reads then go into pages that are already there and mostly huge, and the disk sees one
 * sequential stream. Where fresh huge pages are dear (the host takes free 2 MiB blocks back) the
 * arena stays in 4 KiB pages, and there the manager relays its reads (f->relay; io.h, `relay`):
 * each 512 KiB lands in a relay reader's small reused huge-page slot and is copied to its place,
 * whose pages the reader faults in first (so no toucher). A cold 2 GiB model read that way at
 * 2.58-2.77 GB/s where the io_uring workers relaying through slots of their own, a toucher beside
 * them, read 2.27-2.48, alternating (Dec 5 2026, bench/README.md).
 *
 * Measured on a 2-core VM with a virtio disk (2026-11-29), 2 GiB model, load DIRECT from a cold
 * cache (bench/load_bench --only ferry-direct, alternating with a standalone reader and a plain
 * O_DIRECT read): 1.52-1.93 GB/s in 8 of 9 runs (one at 1.17) against 1.05-1.19 GB/s tensor by
 * tensor into buffers of their own; the O_DIRECT read into one reused huge-page buffer made
 * 1.59-2.31 GB/s. See bench/README.md.
 *
 * Lifetime: an arena holds one reference per copy that lives in it plus one for the load that made
 * it; the mapping goes when the last is released. A released copy gives its whole pages back at
 * once (MADV_DONTNEED on the pages that hold only its bytes), so the memory a dropped tensor held
 * is free whether or not its neighbours stay. Every function here except the toucher runs with the
 * manager's lock held; the toucher reads only the list it was given and its reads' destinations,
 * set before it starts, which stay alive until ferry__arena_end joins it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/core.h"
#include "devices/devices.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define ARENA_ALIGN FERRY__HUGE_PAGE
#define ARENA_STEP (UINT64_C(64) << 20)      /* bytes the toucher faults in per call */
#define ARENA_MAX_GAP (UINT64_C(2) << 20)    /* a larger hole between tensors starts a new arena */
#define ARENA_MIN_BYTES (UINT64_C(256) << 10) /* smaller runs keep one buffer per tensor */

typedef struct arena_span {
    ferry_tensor *t;
    ferry_load mode;
    uint64_t start, end; /* page-aligned file range of its copy */
} arena_span;

static int cmp_span(const void *a, const void *b)
{
    const arena_span *x = a, *y = b;
    if (x->t->file != y->t->file)
        return (uintptr_t)x->t->file < (uintptr_t)y->t->file ? -1 : 1;
    if (x->mode != y->mode)
        return x->mode < y->mode ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void arena_free(ferry__arena *a)
{
    if (a->map)
        munmap(a->map, a->map_len);
    free(a->ts);
    free(a->claimed);
    free(a->reads);
    free(a->ends);
    free(a);
}

void ferry__arena_release(ferry__arena *a)
{
    if (a && --a->refs == 0)
        arena_free(a);
}

/* The whole pages inside [PTR, PTR+N): those a copy in an arena shares with no neighbour. 0 when
 * there are none. */
static int own_pages(const void *ptr, uint64_t n, uintptr_t *lo, uintptr_t *hi)
{
    *lo = ((uintptr_t)ptr + 4095) & ~(uintptr_t)4095;
    *hi = ((uintptr_t)ptr + n) & ~(uintptr_t)4095;
    return ptr && *hi > *lo;
}

void ferry__arena_unlock(void *ptr, uint64_t n)
{
    uintptr_t lo, hi;
    if (own_pages(ptr, n, &lo, &hi))
        ferry__host_unlock((void *)lo, hi - lo);
}

void ferry__arena_trim(const void *ptr, uint64_t n)
{
    uintptr_t lo, hi;
    if (!own_pages(ptr, n, &lo, &hi))
        return;
    /* with max_ptes_none high, khugepaged would collapse a partly freed 2 MiB block back into a
     * whole huge page */
    ferry__host_small_pages((void *)lo, hi - lo);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static uint64_t span_start(const ferry_tensor *t)
{
    return t->info.offset & ~UINT64_C(4095);
}

static ferry__arena *arena_new(const arena_span *s, size_t n)
{
    uint64_t start = s[0].start, end = s[n - 1].end;
    for (size_t i = 0; i < n; i++)
        end = s[i].end > end ? s[i].end : end;
    uint64_t len = end - start;
    if (len > SIZE_MAX - ARENA_ALIGN * 2)
        return NULL;
    ferry__arena *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->ts = malloc(n * sizeof *a->ts);
    a->claimed = calloc(n, 1);
    a->reads = malloc(n * sizeof *a->reads);
    a->ends = malloc(n * sizeof *a->ends);
    a->map_len = (size_t)len + (size_t)ARENA_ALIGN;
    void *m = a->ts && a->claimed && a->reads && a->ends
                  ? mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0)
                  : MAP_FAILED;
    if (m == MAP_FAILED) {
        arena_free(a);
        return NULL;
    }
    a->map = m;
    a->base = (unsigned char *)(((uintptr_t)m + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1));
    /* huge pages only where ferry__arena_ranges asks (THP "always" would give them to blocks
     * that reach past the reads, holes and refused copies included) */
    ferry__host_small_pages(a->map, a->map_len);
    a->file = s[0].t->file;
    a->mode = s[0].mode;
    a->file_start = start;
    a->len = len;
    a->refs = 1;
    for (size_t i = 0; i < n; i++) {
        a->ts[i] = s[i].t;
        a->ends[i] = s[i].end;
        s[i].t->arena = a;
    }
    a->n = n;
    return a;
}

void ferry__arena_plan(ferry_tensor *const *ts, size_t n, ferry__arena_span_fn span,
                       ferry__arena **out)
{
    *out = NULL;
    arena_span *s = n ? malloc(n * sizeof *s) : NULL;
    if (!s)
        return; /* an optimisation: without memory for it, the tensors get buffers of their own */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor *t = ts[i];
        if (!t->arena_copy || t->arena)
            continue;
        ferry_load mode;
        uint64_t bytes;
        span(t, &mode, &bytes);
        s[k++] = (arena_span){t, mode, span_start(t), span_start(t) + bytes};
    }
    qsort(s, k, sizeof *s, cmp_span);
    ferry__arena *list = NULL, **tail = &list;
    for (size_t i = 0, j; i < k; i = j) {
        uint64_t end = s[i].end, bytes = s[i].end - s[i].start;
        for (j = i + 1; j < k && s[j].t->file == s[i].t->file && s[j].mode == s[i].mode &&
                        s[j].start <= end + ARENA_MAX_GAP;
             j++) {
            bytes += s[j].end - s[j].start;
            end = s[j].end > end ? s[j].end : end;
        }
        /* a run of one tensor, a small run, or a sparse one (tensors of other groups between)
         * keeps its own buffers */
        if (j - i < 2 || bytes < ARENA_MIN_BYTES || bytes < (end - s[i].start) / 8 * 7)
            continue;
        ferry__arena *a = arena_new(s + i, j - i);
        if (!a)
            continue;
        *tail = a;
        tail = &a->next;
    }
    free(s);
    *out = list;
}

void ferry__arena_place(ferry__arena *a, size_t i, ferry__mem *m)
{
    m->base = a->base + (span_start(a->ts[i]) - a->file_start);
    m->arena = a;
    a->refs++;
    a->claimed[i] = FERRY__CLAIMED;
}

void ferry__arena_ranges(ferry__arena *a, int huge, int relay)
{
    a->n_reads = 0;
    uint64_t end = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (!a->claimed[i])
            continue;
        const ferry_tensor *t = a->ts[i];
        uint64_t s = span_start(t), e = a->ends[i];
        ferry__arena_read *r = a->n_reads ? &a->reads[a->n_reads - 1] : NULL;
        if (r && r->end == i && s <= end) {
            /* shares or touches the previous copy's last page: one read */
            r->end = i + 1;
            end = e > end ? e : end;
        } else {
            if (r)
                r->req.len = end - r->req.offset;
            r = &a->reads[a->n_reads++];
            memset(r, 0, sizeof *r);
            r->first = i;
            r->end = i + 1;
            r->req.file = a->file;
            r->req.offset = s;
            r->req.dst = a->base + (s - a->file_start);
            r->req.mode = a->mode;
            r->req.relay = relay;
            end = e;
        }
    }
    if (a->n_reads) {
        ferry__arena_read *r = &a->reads[a->n_reads - 1];
        r->req.len = end - r->req.offset;
    }
    for (size_t k = 0; k < a->n_reads; k++) {
        ferry__ioreq *q = &a->reads[k].req;
        /* the last copy's page may reach past the end of the file; its bytes do not */
        if (q->offset + q->len > a->file->size)
            q->len = a->file->size - q->offset;
#ifdef MADV_HUGEPAGE
        /* huge pages only for the 2 MiB blocks a read fills whole: a block that reaches past it
         * would fault in bytes no copy accounts for; and none where fresh huge pages are dear
         * (the copies are read once: the reads' gain from fewer segments is smaller than the
         * faults' cost there) */
        if (!huge)
            continue;
        uintptr_t lo = ((uintptr_t)q->dst + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1);
        uintptr_t hi = ((uintptr_t)q->dst + q->len) & ~(uintptr_t)(ARENA_ALIGN - 1);
        if (hi > lo)
            (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#endif
    }
}

/* The toucher: faults the destinations of every read of the list in, in order, a step at a time,
 * until done or told to stop. MADV_POPULATE_WRITE (Linux 5.14) faults pages in writable without
 * writing them, so it can run while reads fill the same pages; without it there is no toucher
 * (writing a byte per page would race with the reads). */
static void *toucher_main(void *arg)
{
    ferry__arena_load *L = arg;
    for (ferry__arena *a = L->list; a; a = a->next)
        for (size_t k = 0; k < a->n_reads; k++) {
            unsigned char *p = a->reads[k].req.dst;
            uint64_t len = a->reads[k].req.len;
            for (uint64_t off = 0; off < len; off += ARENA_STEP) {
                if (atomic_load(&L->stop))
                    return NULL;
                uint64_t n = len - off < ARENA_STEP ? len - off : ARENA_STEP;
                if (madvise(p + off, (size_t)((n + 4095) & ~UINT64_C(4095)),
                            MADV_POPULATE_WRITE) != 0 &&
                    errno == EINVAL)
                    return NULL; /* not supported here */
            }
        }
    return NULL;
}

void ferry__arena_begin(ferry__arena_load *L, ferry__arena *list, int touch)
{
    L->list = list;
    atomic_store(&L->stop, 0);
    L->started = list && touch && pthread_create(&L->toucher, NULL, toucher_main, L) == 0;
}

void ferry__arena_stop(ferry__arena_load *L)
{
    if (L->started) {
        atomic_store(&L->stop, 1);
        pthread_join(L->toucher, NULL);
        L->started = 0;
    }
}

void ferry__arena_end(ferry__arena_load *L)
{
    ferry__arena_stop(L);
    for (ferry__arena *a = L->list, *next; a; a = next) {
        next = a->next;
        for (size_t i = 0; i < a->n; i++) {
            a->ts[i]->arena = NULL;
            a->ts[i]->arena_copy = 0;
        }
        a->next = NULL;
        ferry__arena_release(a);
    }
    L->list = NULL;
}
