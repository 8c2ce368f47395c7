/*
 * ferry_device.h — the header for device authors.
 *
 * A device is a memory space plus a copy engine, behind a versioned table of operations (in the
 * manner of sqlite3_io_methods). An implementation embeds struct ferry_device as the FIRST member
 * of its own struct and points ops at a static table. New members are only ever appended to the
 * table; a NULL member means "not supported" and the core falls back (e.g. to malloc'd staging
 * memory when host_alloc is NULL).
 *
 * Asynchronous contract (as libuv's): a copy call that returns an error queued nothing; one that
 * returns 0 completes exactly once, and its result is read with wait(ticket). Memory passed to a
 * copy must not be freed or changed until its ticket has been waited on.
 * Thread safety: every operation may be called from any thread concurrently.
 */
#ifndef FERRY_DEVICE_H
#define FERRY_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1: up to read_sync. 2: the event members. The core reads a table's version before it uses a
 * member newer than version 1, so a table written against an older header keeps working. */
#define FERRY_DEVICE_OPS_VERSION 2

typedef struct ferry_device ferry_device;

typedef struct ferry_device_ops {
    uint32_t version; /* FERRY_DEVICE_OPS_VERSION the table was written against */

    /* Frees the device; every allocation must have been freed and every ticket waited on. */
    void (*destroy)(ferry_device *d);

    /* Device memory. alloc: *ptr receives an address aligned to d->alignment; sizes above
     * d->max_alloc are refused with FERRY_ENOMEM, as is going over capacity. free(NULL) no-op. */
    int (*alloc)(ferry_device *d, uint64_t size, void **ptr);
    void (*free)(ferry_device *d, void *ptr);

    /* Asynchronous copies; *ticket receives a number to wait on (tickets grow monotonically per
     * device). SRC/DST host memory may be any host memory; pinned memory from host_alloc is
     * faster where the device distinguishes. */
    int (*copy_h2d)(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket);
    int (*copy_d2h)(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket);
    /* Blocks until copy TICKET is done; returns that copy's status (0 or a FERRY_E code). A ticket
     * may be waited on once. */
    int (*wait)(ferry_device *d, uint64_t ticket);
    /* Blocks until every queued copy is done. */
    int (*synchronize)(ferry_device *d);

    /* Free and total bytes of device memory. */
    int (*mem_info)(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes);

    /* Pinned (page-locked) host memory for staging; NULL members: the core uses aligned malloc. */
    int (*host_alloc)(ferry_device *d, uint64_t size, void **ptr);
    void (*host_free)(ferry_device *d, void *ptr);

    /* Reads BYTES of device memory at SRC into host DST synchronously (verification, tests). NULL:
     * the core uses copy_d2h + wait. */
    int (*read_sync)(ferry_device *d, void *dst, const void *src, uint64_t n);

    /* ---- version 2: events, the stream-ordered hand-off between ferry's copies and the engine's
     * work (as cudaEvent_t). An event marks a point in a queue of the device's work; a STREAM is
     * a queue of the engine's (a cudaStream_t on cuda), NULL meaning the device's own copy queue
     * in record and the calling thread in wait. All five members or none: with none (or a table
     * of version 1) the core treats every event of the device as complete once the host has
     * waited for its copies, as on the cpu. */
    /* *EV receives a new event, complete until first recorded. */
    int (*event_create)(ferry_device *d, void **ev);
    /* Frees EV; a record still queued completes first, unobserved. */
    void (*event_destroy)(ferry_device *d, void *ev);
    /* Records EV after all the work queued on STREAM so far; it completes when that work has. */
    int (*event_record)(ferry_device *d, void *ev, void *stream);
    /* Makes STREAM's later work wait for EV's latest record, without blocking the caller; with
     * STREAM NULL, blocks the caller until it completes. Returns 0 or the failure of the work the
     * record covers (FERRY_EDEVICE). */
    int (*event_wait)(ferry_device *d, void *ev, void *stream);
    /* 1 when EV's latest record has completed (or it was never recorded), 0 while pending, a
     * negative FERRY_E code when the work before it failed. Never blocks. */
    int (*event_query)(ferry_device *d, void *ev);
} ferry_device_ops;

struct ferry_device {
    const ferry_device_ops *ops;
    char name[64];          /* the spec it was opened with, e.g. "sim:8GiB@25GB/s" */
    char kind[16];          /* "cpu", "sim", "cuda" */
    uint64_t alignment;     /* of allocations; a power of two */
    uint64_t max_alloc;     /* largest single allocation */
    int host_accessible;    /* the CPU can read device addresses directly (zero-copy possible) */
    char errmsg[256];       /* detail of the last failure, set by the implementation */
};

/* Opens a device from its spec ("cpu", "sim:8GiB", "sim:8GiB@25GB/s,fail_alloc=3", "cuda:0").
 * On failure *out is NULL and ERRMSG (ERRLEN bytes) says why (for cuda: library or GPU missing). */
FERRY_API int ferry_device_open(const char *spec, ferry_device **out, char *errmsg, size_t errlen);
/* Hands a device of the caller's own implementation to manager F (declared in ferry.h as
 * `struct ferry`): F owns it from then on and destroys it in ferry_destroy. alloc, free, copy_h2d
 * and wait are required; the other members may be NULL. ops->version must be 1 or more: members
 * newer than it are never read (a version 1 table may end at read_sync). *ID receives its id. */
FERRY_API int ferry_add_device_custom(struct ferry *f, ferry_device *d, int *id);
/* d->ops->destroy(d); NULL is a no-op. */
FERRY_API void ferry_device_close(ferry_device *d);

#ifdef __cplusplus
}
#endif
#endif
