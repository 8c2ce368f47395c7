/*
 * limits.h — the machine's own limits, measured in the same run as what is judged against them
 * (`ferry bench`, bench/load_bench): how fast the disk delivers a file with O_DIRECT and through
 * the page cache, how fast memory copies, and how fast fresh anonymous memory becomes usable.
 *
 * Plain POSIX and the public ferry.h (for its error codes and clock) only, so that the tool, which
 * sees nothing of src/, and the benchmark programs can both link it. Not thread-safe against
 * itself: run one measurement at a time.
 *
 * Every measurement returns GB/s (10^9 bytes per second), or a negative FERRY_E... code as a
 * double: FERRY_EINVAL (no path, empty file, size 0), FERRY_ENOENT / FERRY_EIO (open, read),
 * FERRY_ENOMEM, FERRY_EUNSUPPORTED (the filesystem refuses O_DIRECT). Setup (allocating and
 * faulting in reused buffers, starting threads) is kept out of the timed part, so each number
 * bounds the code it is compared with. Within a measurement, "reused" buffers are faulted in
 * before the clock starts; "fresh" memory is the opposite: its faulting is what is timed.
 */
#ifndef FERRY_CLI_LIMITS_H
#define FERRY_CLI_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes the O_DIRECT limit reads into before it writes over any of them: at least this much
 * destination memory (or the file's size, where that is less), shared by the readers. A load puts
 * every byte of a model in a place of its own and a stream reads into the memory its budget keeps;
 * into a few reused buffers of 16 MiB the same disk read faster than any load could
 * (bench/README.md, "The O_DIRECT limit into memory of a load's size"). */
#define LIMITS_DIRECT_DEST (UINT64_C(256) << 20)

/* O_DIRECT sequential read of the whole of PATH, after dropping it from the page cache: READERS
 * threads (1..64) take consecutive REQUEST-byte pieces of the file in turn (REQUEST rounded up to
 * 4096; 0: 16 MiB), each into the next piece of its own reused buffer, which holds enough pieces
 * that all the buffers together are LIMITS_DIRECT_DEST bytes (or more, for READERS x REQUEST
 * above it). Timed from the moment all readers are ready (their buffers faulted in) to the last
 * one's end. The buffers are 2 MiB-aligned and ask for transparent huge pages: into physically
 * contiguous memory a virtio disk takes requests of up to max_sectors_kb, into scattered 4 KiB
 * pages of at most 254 pages (measured here: 1.7-1.9 GB/s against 1.0 GB/s), and the limit is the
 * best the hardware gives. */
double limits_direct_read(const char *path, unsigned readers, uint64_t request);

/* The best limits_direct_read over every pair of READERS[0..NR) and REQUESTS[0..NQ) (NULL/0:
 * 1, 2, 4, 8 readers with 64 MiB and 16 MiB requests). *BEST_READERS and *BEST_REQUEST (either
 * may be NULL) receive the winning pair. Fails with the first error of any pair. */
double limits_direct_read_best(const char *path, const unsigned *readers, size_t nr,
                               const uint64_t *requests, size_t nq, unsigned *best_readers,
                               uint64_t *best_request);

/* What a stream's first pass asks of the machine, done by a plain program: the O_DIRECT read of
 * limits_direct_read (READERS, REQUEST as there), except that the file's first KEEP bytes each go
 * to a place of their own in fresh memory (mapped 2 MiB-aligned; touched only once the clock
 * runs), where a budget of KEEP bytes keeps them. PAGES says what backs that memory: huge pages
 * asked for (LIMITS_PAGES_HUGE, as a stream's host buffers are), or small pages only
 * (LIMITS_PAGES_SMALL: where the host backs a fresh huge page slowly, small ones fault in several
 * times faster, bench/README.md). With FAULTERS = 0 each reader touches a piece's fresh place
 * (one byte a page) just before reading into it; with FAULTERS > 0 that many threads touch the
 * fresh memory 2 MiB at a time in file order, and a reader waits until they have covered its
 * piece. Timed from the moment every thread is ready to the last read's end; returns GB/s of the
 * file, and *SECONDS (may be NULL) the time. KEEP = 0 is limits_direct_read. */
typedef enum limits_pages { LIMITS_PAGES_HUGE, LIMITS_PAGES_SMALL } limits_pages;
double limits_first_pass(const char *path, uint64_t keep, unsigned readers, uint64_t request,
                         unsigned faulters, limits_pages pages, double *seconds);

/* A cold load done by a plain program through relay slots: PATH dropped from the page cache,
 * then READERS threads (1..64) each read PIECE bytes at a time (0: 512 KiB) with O_DIRECT into
 * a slot of their own (the slots one mapping in 2 MiB pages, faulted in before the clock) and
 * copy them to their place in fresh memory of the file's size, in small pages, each piece's
 * pages faulted in by one MADV_POPULATE_WRITE first. Timed from the moment every thread is
 * ready to the last copy's end; returns GB/s of the file, and *SECONDS (may be NULL) the time. */
double limits_relayed_load(const char *path, unsigned readers, uint64_t piece, double *seconds);

/* The disk's other O_DIRECT limit: as limits_relayed_load, but each piece copied to its place in
 * a reused destination of LIMITS_DIRECT_DEST bytes (the file's size where that is less), in 2 MiB
 * pages faulted in before the clock, as a stream's buffers are; GB/s of the file. On a VM whose
 * disk the host emulates this read faster than any straight O_DIRECT read (bench/README.md). */
double limits_relayed_read(const char *path, unsigned readers, uint64_t piece);

/* Cold buffered read of the whole of PATH: dropped from the page cache (POSIX_FADV_DONTNEED),
 * then pread on one thread into one reused buffer of REQUEST bytes (0: 64 MiB). What the page
 * cache's own readahead delivers with no destination cost: the other disk limit. */
double limits_buffered_read(const char *path, uint64_t request);

/* memcpy between two reused buffers of BYTES each (0: 256 MiB) on one thread; best of 3. */
double limits_memcpy(uint64_t bytes);

/* First touch of BYTES (0: 256 MiB) of fresh anonymous memory: mmap, then THREADS threads
 * (1..64) each write one byte per page of their own contiguous share. Timed from the mmap to the
 * last thread's end; the munmap is not timed. */
double limits_fresh_memory(uint64_t bytes, unsigned threads);

/* The best limits_fresh_memory of 1 and 2 threads; *BEST_THREADS (may be NULL) receives which. */
double limits_fresh_memory_best(uint64_t bytes, unsigned *best_threads);

/* As limits_fresh_memory, the mapping 2 MiB-aligned and advised MADV_HUGEPAGE, BYTES rounded up to
 * whole 2 MiB pages and each thread's share whole ones: the memory of ferry's host buffers of
 * 2 MiB and up (a stream's budget). Where the host takes free 2 MiB blocks back (free page
 * reporting in a VM), these come back slower than small pages, which the guest's free memory may
 * still hold in pieces (bench/README.md). */
double limits_fresh_huge_memory(uint64_t bytes, unsigned threads);

/* Read bandwidth of resident memory: a reused buffer of BYTES (0: four times the last-level
 * cache, at least 256 MiB), written before the clock, then THREADS threads (1..64) each sum the
 * 64-bit words of their own contiguous share, several sums at a time (the compiler's widest
 * vector loads); best of 3 passes. What a pass over resident weights can read at most. */
double limits_read_bandwidth(uint64_t bytes, unsigned threads);

/* The best limits_read_bandwidth over 1..MAX_THREADS threads (0: the online CPUs);
 * *BEST_THREADS (may be NULL) receives which. */
double limits_read_bandwidth_best(uint64_t bytes, unsigned max_threads, unsigned *best_threads);

/* ---- page cache control ------------------------------------------------------------------- */

/* Drops PATH from the page cache (POSIX_FADV_DONTNEED). Pages that a live mapping of this
 * process has mapped stay: unmap first. 0 or a negative FERRY_E code. */
int limits_drop_cache(const char *path);

/* The fraction (0..1) of PATH's pages in the page cache (mincore), or a negative FERRY_E code. */
double limits_cached_fraction(const char *path);

/* Reads the whole of PATH (buffered) so that it is in the page cache. 0 or a negative code. */
int limits_warm_file(const char *path);

#endif
