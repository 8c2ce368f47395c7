/*
 * ferry_device.h — the header for device authors.
 *
 * A device is a memory space plus a copy engine, behind a versioned table of operations (in the
 * manner of sqlite3_io_methods). An implementation embeds struct ferry_device as the FIRST member
 * of its own struct and points ops at a static table that begins with its version and its size.
 * New members are only ever appended; an optional member that is NULL (or past the table's size)
 * means "not supported" and the core falls back (e.g. to malloc'd staging memory when host_alloc
 * is NULL).
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

/* The table layout this header describes. Version 3 put `version` and `size` first and moved a
 * device's properties and error messages behind operations; ferry refuses tables of any other
 * version (1 and 2 included: their devices carried properties in struct ferry_device, which
 * version 3 no longer has), with a message naming the version found. */
#define FERRY_DEVICE_OPS_VERSION 3

typedef struct ferry_device ferry_device;

/* What a device says about itself (the props operation). Constant for the device's life. */
typedef struct ferry_device_props {
    char name[64];        /* the spec it was opened with, e.g. "sim:8GiB@25GB/s" */
    char kind[16];        /* "cpu", "sim", "cuda", or the implementation's own */
    uint64_t alignment;   /* of allocations; a power of two */
    uint64_t max_alloc;   /* largest single allocation */
    int host_accessible;  /* the CPU can read device addresses directly (zero-copy possible) */
} ferry_device_props;

typedef struct ferry_device_ops {
    uint32_t version; /* FERRY_DEVICE_OPS_VERSION the table was written against */
    uint32_t size;    /* sizeof(ferry_device_ops) where the table was compiled: at least up to
                         wait (the required members); optional members that end past it are
                         never read, as if NULL, so later headers may append members */

    /* ---- required ---- */
    /* Frees the device; every allocation must have been freed and every ticket waited on. */
    void (*destroy)(ferry_device *d);
    /* Fills *OUT. Called once when the device is handed to a manager, and by ferry_device_props. */
    int (*props)(ferry_device *d, ferry_device_props *out);
    /* Device memory. alloc: *ptr receives an address aligned to props.alignment; sizes above
     * props.max_alloc are refused with FERRY_ENOMEM, as is going over capacity. free(NULL) no-op. */
    int (*alloc)(ferry_device *d, uint64_t size, void **ptr);
    void (*free)(ferry_device *d, void *ptr);
    /* Asynchronous copy host -> device; *ticket receives a number to wait on (tickets grow
     * monotonically per device). SRC may be any host memory; pinned memory from host_alloc is
     * faster where the device distinguishes. */
    int (*copy_h2d)(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket);
    /* Blocks until copy TICKET is done; returns that copy's status (0 or a FERRY_E code). A ticket
     * may be waited on once. */
    int (*wait)(ferry_device *d, uint64_t ticket);

    /* ---- optional: NULL means not supported; test with FERRY_DEVICE_HAS ---- */
    /* Formats the detail of the calling thread's latest failed operation on D into BUF (LEN bytes,
     * NUL-terminated), e.g. "sim:64MiB: out of capacity allocating 8 MiB". The implementation
     * keeps the message thread-safe; ferry never writes into the device. NULL: ferry names the
     * code only. Returns BUF. */
    char *(*errmsg)(ferry_device *d, char *buf, size_t len);
    /* Asynchronous copy device -> host, as copy_h2d. */
    int (*copy_d2h)(ferry_device *d, void *dst, const void *src, uint64_t n, uint64_t *ticket);
    /* Blocks until every queued copy is done. NULL: ferry waits on each ticket instead. */
    int (*synchronize)(ferry_device *d);
    /* Free and total bytes of device memory. NULL: no default budget (unlimited). */
    int (*mem_info)(ferry_device *d, uint64_t *free_bytes, uint64_t *total_bytes);
    /* Pinned (page-locked) host memory for staging. NULL: ferry uses aligned malloc. */
    int (*host_alloc)(ferry_device *d, uint64_t size, void **ptr);
    void (*host_free)(ferry_device *d, void *ptr);
    /* Reads N bytes of device memory at SRC into host DST synchronously (verification, tests).
     * NULL: ferry uses copy_d2h + wait; with neither, reads back are FERRY_EUNSUPPORTED. */
    int (*read_sync)(ferry_device *d, void *dst, const void *src, uint64_t n);

    /* Events: the stream-ordered hand-off between ferry's copies and the engine's work (as
     * cudaEvent_t). An event marks a point in a queue of the device's work; a STREAM is a queue of
     * the engine's (a cudaStream_t on cuda), NULL meaning the device's own copy queue in record
     * and the calling thread in wait. All five members or none: with none ferry treats every
     * event of the device as complete once the host has waited for its copies, as on the cpu. */
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

    /* Page reuse, for devices whose memory is host pages the kernel can move (the cpu device):
     * with block and stitch, ferry pools freed blocks and makes larger ones out of them without
     * copying. All three or none. */
    /* Says whether D's blocks will be reused (ferry pools them under a budget): D may then back
     * its blocks differently (huge pages on cpu). */
    void (*set_reuse)(ferry_device *d, int reuse);
    /* 1 when P is a block of D that stitch accepts; then *SIZE is its size (a multiple of 4 KiB)
     * and *SEGMENTS the number of kernel mappings it may span (either may be NULL). 0 otherwise. */
    int (*block)(ferry_device *d, const void *p, uint64_t *size, uint32_t *segments);
    /* Makes one block of NEED bytes (rounded up to 4 KiB) out of the blocks PARTS[0..N) (N <= 64),
     * without copying their bytes: their pages first, in order, then fresh pages when they hold
     * fewer than NEED bytes. Only the last part may reach past NEED; what it holds beyond stays a
     * block of its own, returned in *REST, *REST_SIZE (NULL, 0 if none). A single part of at least
     * NEED bytes is not cut when the rest would be under 64 KiB, unless the cut lies on a 2 MiB
     * boundary of the address space (where it splits no huge page): *OUT_SIZE is then its whole
     * size.
     * On success *OUT, *OUT_SIZE hold the new block (freed with free like any other) and the parts
     * are gone; returns 0. On failure *GONE says what became of the parts: 0, untouched (still
     * blocks of D); 1, their memory returned to the system. FERRY_EINVAL when a part is not a
     * block of D or the parts reach past NEED before the last (untouched); FERRY_ENOMEM when
     * memory or kernel mappings run short; FERRY_EIO for another refusal; FERRY_EUNSUPPORTED where
     * the system cannot move pages (untouched). */
    int (*stitch)(ferry_device *d, void *const *parts, size_t n, uint64_t need, void **out,
                  uint64_t *out_size, void **rest, uint64_t *rest_size, int *gone);

    /* Host memory ferry already holds, made as fast a copy source as host_alloc's: a home copy in
     * host RAM (a private copy, or the file's mapping) that is copied to D again at every use.
     * Both or none. ferry registers page-aligned ranges of at least 1 MiB that never overlap,
     * copies from them with copy_h2d as from any host memory, and unregisters each before that
     * memory is freed or unmapped (and before destroy). The memory may be a read-only mapping:
     * the device reads it and never writes it. host_register returns 0, or a FERRY_E code with
     * errmsg set; a refusal only costs speed (ferry copies through staging memory instead). */
    int (*host_register)(ferry_device *d, void *ptr, uint64_t n);
    void (*host_unregister)(ferry_device *d, void *ptr);
} ferry_device_ops;

/* 1 when table OPS has MEMBER (it lies inside the table's size) and it is set. */
#define FERRY_DEVICE_HAS(ops, member)                                                          \
    ((ops)->size >= offsetof(ferry_device_ops, member) + sizeof((ops)->member) &&             \
     (ops)->member != NULL)

/* The base of every device. An implementation embeds it as the FIRST member of its own struct
 * (or points USER at its state) and sets OPS to a static table. */
struct ferry_device {
    const ferry_device_ops *ops;
    void *user; /* the implementation's own; ferry never reads it */
};

/* Opens a device from its spec: "cpu", "sim:8GiB", "sim:8GiB@25GB/s,fail_alloc=3", "cuda:0", or
 * "fault:SPEC,fail_alloc=N,fail_copy=M" (SPEC any other spec; the wrapper fails the N-th
 * allocation and the M-th copy of the device it wraps, "N/every" for every N-th).
 * On failure *out is NULL and ERRMSG (ERRLEN bytes) says why (for cuda: library or GPU missing). */
FERRY_API int ferry_device_open(const char *spec, ferry_device **out, char *errmsg, size_t errlen);
/* Checks that D's table is one this ferry can use: FERRY_EINVAL with ERRMSG (ERRLEN bytes) naming
 * what is wrong when D or its table is NULL, the version is not FERRY_DEVICE_OPS_VERSION, the size
 * ends before the required members, a required member is NULL, or the event or page-reuse members
 * are only partly set. 0 otherwise. */
FERRY_API int ferry_device_check(const ferry_device *d, char *errmsg, size_t errlen);
/* D's properties (d->ops->props). FERRY_EINVAL when D is NULL. */
FERRY_API int ferry_device_props_get(ferry_device *d, ferry_device_props *out);
/* Hands a device of the caller's own implementation to manager F (declared in ferry.h as
 * `struct ferry`). *ID (may be NULL) receives its id. The table is checked as ferry_device_check
 * does, and its properties read.
 * Ownership: on success F owns D and destroys it in ferry_destroy. On ANY failure D stays the
 * caller's, untouched, whatever the code (FERRY_EINVAL for a bad table, FERRY_ELIMIT when F has
 * FERRY_MAX_DEVICES devices, the props operation's own error): close it with ferry_device_close.
 * ferry_errmsg(F) says why. */
FERRY_API int ferry_add_device_custom(struct ferry *f, ferry_device *d, int *id);
/* d->ops->destroy(d); NULL is a no-op. */
FERRY_API void ferry_device_close(ferry_device *d);

#ifdef __cplusplus
}
#endif
#endif
