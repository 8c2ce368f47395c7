/*
 * limits.h — the machine's own limits, measured in the same run as a benchmark so that its
 * results can be judged against them: the O_DIRECT sequential read bandwidth of a file's device,
 * single-thread memcpy bandwidth, and the speed of first-touching fresh anonymous memory.
 *
 * Each returns GB/s (10^9 bytes per second), or a negative FERRY_E code (as a double) on error.
 */
#ifndef FERRY_IO_LIMITS_H
#define FERRY_IO_LIMITS_H

#include <stdint.h>

/* Reads the whole of PATH with O_DIRECT after dropping it from the page cache: READERS threads
 * (0: 4), each with one reused 64 MiB aligned buffer (larger when REQUEST_BYTES is), take
 * consecutive pieces of REQUEST_BYTES (0: 16 MiB; rounded up to 4096) in turn. Buffers are
 * allocated and faulted in before the clock starts. FERRY_EUNSUPPORTED when the filesystem refuses
 * O_DIRECT; FERRY_EINVAL for an empty file. */
double ferry__limit_direct_read(const char *path, unsigned readers, uint64_t request_bytes);

/* Single-thread memcpy between two faulted-in buffers of BYTES each (0: 256 MiB); the best of a
 * few runs. */
double ferry__limit_memcpy(uint64_t bytes);

/* Writing one byte per page into BYTES (0: 256 MiB) of freshly mmap'd anonymous memory, on one
 * thread, then munmap. */
double ferry__limit_first_touch(uint64_t bytes);

#endif
