/*
 * fake_cudart.h — the test hooks of tests/fake_cudart.c, a stand-in for libcudart that lets
 * ferry's cuda device run on a machine without a GPU (FERRY_CUDART=.../libfake_cudart.so).
 *
 * Besides the runtime functions ferry's cuda.c loads, the library exports these, for tests that
 * dlopen the same path and dlsym them (the handle is the one ferry got: a library is loaded once
 * per process). Environment, read at the first call into the library:
 *   FAKE_CUDA_DEVICES=N      device count (default 1; 0: cudaGetDeviceCount fails, no device)
 *   FAKE_CUDA_MEM=SIZE       memory of each device (default 2GiB; suffixes K/M/G, KiB/MiB/GiB)
 *   FAKE_CUDA_DELAY_US=N     each copy waits N microseconds on its stream's worker first
 *   FAKE_CUDA_FAIL_MALLOC=N  the N-th cudaMalloc (or cudaMallocFromPoolAsync) fails with
 *                            cudaErrorMemoryAllocation
 *   FAKE_CUDA_FAIL_COPY=N[:async|:sync|:sticky]  the N-th cudaMemcpyAsync fails (see
 *                            FAKECUDA_FAIL_*; async by default)
 *   FAKE_CUDA_FAIL_HOST_ALLOC=N  the N-th cudaHostAlloc fails with cudaErrorMemoryAllocation
 *   FAKE_CUDA_NO_REGISTER=1  every cudaHostRegister fails with cudaErrorNotSupported
 *   FAKE_CUDA_NO_POOL=1      every cudaMemPoolCreate fails with cudaErrorNotSupported (ferry then
 *                            uses cudaMalloc and cudaFree); read at each call
 *   FAKE_CUDA_POISON=0|1     fill fresh device memory with 0xA5 (default 1)
 *   FAKE_CUDA_REPORT=1       print one line of counters to stderr at exit ("fake_cudart: exit:
 *                            live_allocs=0 ..."), so a CLI test can check what a process left
 */
#ifndef FERRY_FAKE_CUDART_H
#define FERRY_FAKE_CUDART_H

#include <stdint.h>

/* How an injected copy failure shows (FAKE_CUDA_FAIL_COPY, fakecuda_set_faults). */
enum {
    FAKECUDA_FAIL_ASYNC = 0,  /* the copy is queued, never done; the first event recorded after
                                 it on its stream completes with cudaErrorUnknown (999); when no
                                 event has reported it, the next cudaStreamSynchronize does (it
                                 is reported once); later work is unaffected */
    FAKECUDA_FAIL_SYNC = 1,   /* cudaMemcpyAsync itself returns cudaErrorUnknown, queues nothing */
    FAKECUDA_FAIL_STICKY = 2, /* as async, and when the worker reaches it the whole process's
                                 "context" is lost: every later call fails with
                                 cudaErrorIllegalAddress (700) until fakecuda_clear_sticky */
};

typedef struct fakecuda_stats {
    uint64_t mallocs;           /* successful cudaMalloc */
    uint64_t malloc_failures;   /* refused (capacity, injected, host memory) */
    uint64_t frees;             /* allocations freed (cudaFree, or a cudaFreeAsync its stream ran) */
    uint64_t synced_frees;      /* of which by cudaFree, which waited for the device to be idle */
    uint64_t async_frees;       /* of which by cudaFreeAsync, in stream order */
    uint64_t bad_frees;         /* cudaFree of what is not an allocation */
    uint64_t live_allocs;       /* allocations not yet freed */
    uint64_t used;              /* bytes allocated (sizes rounded up to 256) */
    uint64_t peak_used;
    uint64_t copies;            /* cudaMemcpyAsync calls accepted (count > 0) */
    uint64_t copies_done;       /* of which the stream's worker has finished */
    uint64_t copies_refused;    /* refused at the call: bad pointers, direction, range */
    uint64_t copies_failed;     /* injected failures (any mode) */
    uint64_t bytes_h2d, bytes_d2h;
    uint64_t pageable_copies;   /* accepted copies whose host side is neither cudaHostAlloc
                                   memory nor registered */
    uint64_t pageable_h2d_bytes; /* their bytes, of those host -> device */
    uint64_t foreign_copies;    /* device memory of another device than the stream's */
    uint64_t free_while_queued; /* cudaFree of memory a queued copy still used (cudaFree waited
                                   for it, as the real one synchronizes), or a cudaFreeAsync its
                                   stream ran while another stream's copy used the memory (kept
                                   until that copy is done) */
    uint64_t host_allocs, host_frees, bad_host_frees, live_host_allocs, live_host_bytes;
    uint64_t host_registers;    /* cudaHostRegister calls accepted */
    uint64_t register_refusals; /* refused: overlapping, injected, not supported */
    uint64_t bad_unregisters;   /* cudaHostUnregister of what is not registered */
    uint64_t live_registered, live_registered_bytes;
    uint64_t live_streams, live_events, live_pools;
    uint64_t bad_handles;       /* calls with a stream or event that is not live */
    uint64_t stream_waits;      /* cudaStreamWaitEvent calls accepted */
    uint64_t kernels;           /* fakecuda_launch calls accepted */
} fakecuda_stats;

/* A "kernel" of the tests: reads N bytes of device memory (seen at BYTES, host memory of the fake)
 * on its stream's worker. */
typedef void (*fakecuda_kernel_fn)(void *ud, const void *bytes, size_t n);

/* Counters of device DEV (0-based), or of all devices together when DEV is -1 (pinned memory,
 * streams and events are counted only in the total). Returns 0, or -1 for a bad DEV. */
typedef int (*fakecuda_get_stats_fn)(int dev, fakecuda_stats *out);
/* From now on: the MALLOC_NTH-th cudaMalloc, the COPY_NTH-th cudaMemcpyAsync (failing as MODE),
 * the HOST_NTH-th cudaHostAlloc fail; 0 = never. Counting restarts at this call. */
typedef void (*fakecuda_set_faults_fn)(uint64_t malloc_nth, uint64_t copy_nth, int mode,
                                       uint64_t host_nth);
/* Delay of each copy on its stream's worker, in microseconds. */
typedef void (*fakecuda_set_delay_fn)(unsigned us);
/* From now on the RECORD_NTH-th cudaEventRecord fails with cudaErrorUnknown (0 = never). */
typedef void (*fakecuda_set_record_fault_fn)(uint64_t record_nth);
/* Queues a kernel on STREAM (a stream of the fake, not NULL) that reads [DEV, DEV+N) of one live
 * allocation: after the work queued before it, the stream's worker sleeps DELAY_US and then calls
 * FN(UD, bytes, N). The allocation counts as in use until it has run (cudaFree waits for it).
 * Returns 0, or cudaErrorInvalidValue for a range outside every allocation. */
typedef int (*fakecuda_launch_fn)(void *stream, const void *dev, size_t n, unsigned delay_us,
                                  fakecuda_kernel_fn fn, void *ud);
/* Restarts every device's peak_used at its current use. */
typedef void (*fakecuda_reset_peak_fn)(void);
/* From now on every cudaHostRegister fails with cudaErrorNotSupported when REFUSE_ALL, else the
 * FAIL_NTH-th fails with cudaErrorMemoryAllocation (0 = never). Counting restarts at this call. */
typedef void (*fakecuda_set_register_fn)(int refuse_all, uint64_t fail_nth);
/* Ends the lost-context state of a sticky failure (as a fresh process would). */
typedef void (*fakecuda_clear_sticky_fn)(void);

#endif
