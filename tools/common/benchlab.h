/*
 * benchlab.h — the measuring protocol of `ferry bench`: ferry's loads and streamed passes over a
 * model, each beside the machine's own limit (limits.h) measured in the same run, alternating
 * limit and ferry runs, medians over runs, and each stream judged against its bound. The caller
 * fills the options, then benchlab_open, benchlab_measure, reads the figures, benchlab_close.
 * Uses only the public header ferry.h; part of ferry_tools.
 */
#ifndef FERRY_BENCHLAB_H
#define FERRY_BENCHLAB_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "limits.h"
#include "runopts.h"

#define BENCHLAB_MAX_RUNS 32
#define BENCHLAB_MAX_PASSES 100
#define BENCHLAB_MAX_THREADS 64

/* The figures of one run; their medians over the runs are benchlab.med[]. */
enum {
    BENCHLAB_DIRECT,        /* limit: GB/s, the best pair, right before each cold load */
    BENCHLAB_DIRECT_SWEEP,  /* limit: GB/s, the best of the sweep over readers x request sizes */
    BENCHLAB_COLD_DIRECT,   /* ferry: GB/s */
    BENCHLAB_FRESH,         /* limit: GB/s */
    BENCHLAB_COLD_AUTO,     /* ferry: GB/s */
    BENCHLAB_BUFFERED,      /* limit: GB/s */
    BENCHLAB_MMAP_FAULT,    /* reference: GB/s */
    BENCHLAB_MMAP_POPULATE, /* reference: GB/s */
    BENCHLAB_MEMCPY,        /* limit: GB/s */
    BENCHLAB_WARM_READ,     /* ferry: GB/s */
    BENCHLAB_COMPUTE,       /* limit: seconds per decode pass over resident weights */
    BENCHLAB_READ,          /* limit: GB/s, reading resident memory (best thread count) */
    BENCHLAB_WARM_AUTO,     /* ferry: seconds to resident (no copy) */
    BENCHLAB_OVERLAP_READ,  /* limit: the O_DIRECT read while the compute runs / alone */
    BENCHLAB_OVERLAP_COMPUTE, /* limit: the compute's speed while the O_DIRECT read runs / alone */
    BENCHLAB_FRESH_HUGE,    /* limit: GB/s, fresh memory in 2 MiB pages (M / 4 of it) */
    BENCHLAB_DIRECT_RELAY,  /* limit: GB/s, O_DIRECT through relay slots (limits_relayed_read) */
    BENCHLAB_RELAY_GAIN,    /* limit: that read / the O_DIRECT read right before it */
    BENCHLAB_COLD_LIMIT,    /* limit: GB/s, a plain program's cold load (limits_first_pass, all
                               of M kept), the faster of small and huge pages */
    BENCHLAB_DISK,          /* limit: GB/s, the disk right before each cold load: the faster of
                               BENCHLAB_DIRECT and, where it was faster at the run's start, the
                               read through relay slots, measured then too; every bound
                               of the bench reads the disk as measured so */
    BENCHLAB_COUNT
};

/* One device of a split stream (--split). */
typedef struct benchlab_split_dev {
    char name[64];        /* its spec ("cpu" for the host) */
    int id;               /* in the manager, as runopts_split adds them */
    double weight;        /* as given (equal shares: 1) */
    uint64_t share;       /* M_i: bytes staged on it (0 on the cpu: read in place) */
    uint64_t budget;      /* B_i = M_i / 4, raised to W_i */
    int raised;
    uint64_t working_set; /* W_i: its bytes of the two largest consecutive layers */
    uint64_t optimal;     /* min(M_i, M_i - B_i + W_i) */
    double bw;            /* bytes per second of its link (0 on the cpu) */
    double transfer_s;    /* optimal / bw */
} benchlab_split_dev;

/* The streamed passes under one budget, and how they were judged. */
typedef struct benchlab_stream {
    const char *device;   /* NULL: cpu; "split" for the split stream */
    int split;            /* over benchlab.split_devs */
    uint64_t budget;
    int raised;           /* the budget was raised to the working set */
    int computes;
    uint32_t passes;
    double seconds[BENCHLAB_MAX_PASSES];
    uint64_t bytes[BENCHLAB_MAX_PASSES];
    double limit[BENCHLAB_MAX_PASSES]; /* O_DIRECT read (GB/s) measured right before pass p (cpu) */
    double limit_med;     /* their median over passes 2..N */
    double disk[BENCHLAB_MAX_PASSES]; /* the disk (GB/s) right before pass p, as BENCHLAB_DISK */
    double disk_med;      /* their median over passes 2..N: the rate the bound uses */
    double seconds_med;   /* passes 2..N */
    uint64_t bytes_med;
    uint64_t optimal;
    double compute_s;     /* compute time in the bound (0: none) */
    double transfer_s;
    double bound;
    double efficiency;
    double overlap_bound; /* the bound with the CPUs shared as measured (BENCHLAB_OVERLAP_*): the
                             read and the compute at once, each at its rate while the other runs,
                             until one is done, then the other alone (0: not measured) */
    double overlap_efficiency; /* overlap_bound / seconds_med */
    uint32_t readers;     /* the manager's I/O workers (ferry_options.io_threads) */
    uint64_t request;     /* bytes of one worker read (ferry_options.io_request_bytes) */
    double first_seconds; /* pass 1: recorded while prefetching in file order */
    uint64_t first_ahead; /* of its buffers, faulted in by ferry during the rest before it, as
                             during an engine's set-up (ferry_stats.faulted_ahead_bytes) */
    double first_bound;   /* max(M / O_DIRECT read before it, resident compute) */
    double first_efficiency;
    double first_fault_s; /* min(B, M) / fresh memory: the kept memory faulted in for the first
                             time as the pass fills it (0: fresh memory not measured, or a device) */
    double first_limit_s; /* limits_first_pass after the stream, B kept: the same read by a plain
                             program, its kept bytes into fresh memory; the fastest of huge pages
                             faulted by the readers or by two threads ahead, and small pages
                             faulted by the readers (0: not measured) */
    unsigned first_limit_faulters; /* which: 0 or 2 */
    limits_pages first_limit_pages; /* and in which pages */
    double first_machine_efficiency; /* max(first_bound, first_limit_s) / first_seconds */
    int capped;           /* ran inside a memory cgroup of benchlab.cap bytes */
    uint64_t working_set; /* W of this stream's sets (the capped stream cuts layers larger than
                             B/32 into tensors, and tensors larger than it into row ranges); 0: benchlab.working_set */
    size_t sets;          /* prepares per pass */
    double passes_per_second;  /* 1 / seconds_med */
    double target_passes_per_second; /* capped: 0.8 x O_DIRECT / (M - B) */
} benchlab_stream;

/* One point of the sweep of the stream's own I/O settings (at budget M/4, two passes). */
typedef struct benchlab_io_point {
    uint32_t readers;
    uint64_t request;
    double seconds;       /* the second pass */
    uint64_t bytes;
} benchlab_io_point;

#define BENCHLAB_MAX_IO_POINTS 12

typedef struct benchlab {
    /* options, set by the caller before benchlab_open (zero: none) */
    const char *path;          /* the model */
    int quick;                 /* a shorter O_DIRECT sweep (1 and 4 readers x 16 MiB) */
    double settle;             /* seconds of rest before each load, the fresh-memory test and
                                  each stream's first pass (0: none) */
    size_t runs;               /* 1 .. BENCHLAB_MAX_RUNS */
    uint32_t passes;           /* 3 .. BENCHLAB_MAX_PASSES */
    const char *device;        /* --device spec or NULL */
    double device_bw;          /* bytes per second of --device: its spec's (benchlab_spec_bandwidth)
                                  or measured (benchlab_link_bandwidth) */
    int device_bw_measured;    /* device_bw was measured, not given by the spec */
    const char *split;         /* --split value or NULL */
    runopts groups;            /* --group: placements of the streamed passes (cmd "bench") */
    uint64_t cap;              /* --cap: also a stream inside a memory cgroup of this size */
    int streams_only;          /* --streams: no loads; the limits the streams need only */
    int cap_only;              /* --cap-only: the O_DIRECT limit and the capped stream only */
    uint32_t stream_readers;   /* --stream-io: fixed I/O settings of the streams, no sweep */
    uint64_t stream_request;
    int sweeping;              /* (internal) the streams' I/O sweep runs */
    int split_large;           /* (internal) the capped stream: layers above B/32 cut into tensors,
                                  tensors above it into row ranges (slices),
                                  no O_DIRECT limit reads inside the cgroup */
    unsigned threads;          /* threads of the compute passes (0: the online CPUs) */

    /* the model, from benchlab_open */
    char **files;
    uint64_t *file_sizes;
    size_t n_files;
    uint64_t file_bytes;
    uint64_t model;            /* M: bytes of all tensors */
    size_t n_tensors, n_layers;
    uint64_t working_set;      /* W */
    uint64_t max_cols, max_rows;
    benchlab_split_dev split_devs[FERRY_MAX_SPLIT];
    int n_split;

    /* the figures, from benchlab_measure */
    double v[BENCHLAB_COUNT][BENCHLAB_MAX_RUNS];
    size_t n[BENCHLAB_COUNT];
    double med[BENCHLAB_COUNT];
    unsigned direct_readers, fresh_threads, fresh_huge_threads;
    unsigned read_threads;     /* the best thread count of BENCHLAB_READ */
    limits_pages cold_limit_pages; /* the pages of BENCHLAB_COLD_LIMIT's fastest run */
    int cold_limit_relayed;        /* and 1 when the fastest read through relay slots */
    unsigned relay_readers;        /* the faster count of readers through relay slots */
    int no_direct;             /* the filesystem refuses O_DIRECT: BENCHLAB_DIRECT is buffered */
    uint64_t direct_request;
    double direct_best;
    double worst_cached;       /* highest fraction still cached before a cold run */
    int auto_copies;           /* a warm AUTO load made a copy of some tensor (not zero-copy) */
    ferry_cold_load cold;      /* the last cold AUTO load's choice (ferry_get_cold_load) */
    benchlab_stream streams[5];
    size_t n_streams;
    benchlab_io_point io_points[BENCHLAB_MAX_IO_POINTS];
    size_t n_io_points;
    char cap_why[768];         /* --cap: why no capped stream ran ("" when it did) */
    char cap_where[600];       /* --cap: the cgroup it ran in */

    /* scratch of the measurements */
    float *x, *y;
    struct compute_unit *units; /* the pieces of a compute pass, reused */
    size_t units_cap;
    struct compute_vec *vecs;   /* x prepared for each (type, cols) the pass meets */
    size_t n_vecs;
    double checksum;
    uint64_t page;
    cli_progress bar;
    uint64_t done;
} benchlab;

/* Describes B->path (files, sizes, tensor bytes, layers, working set) and, with B->split, the
 * split devices (each one's share, budget, working set and link bandwidth from ferry_plan).
 * Returns 0, or CLI_EXIT_FAIL / CLI_EXIT_USAGE after printing why; benchlab_close either way. */
int benchlab_open(benchlab *b);

/* Runs the protocol: B->runs runs of the limits and loads, their medians, then the streamed
 * passes (host budgets M/4 and M/2; with B->device and B->split their streams too), each judged.
 * A progress bar on stderr when PROGRESS. Returns 0, or CLI_EXIT_FAIL after printing why. */
int benchlab_measure(benchlab *b, int progress);

/* Frees what benchlab_open and benchlab_measure allocated (B->groups included). */
void benchlab_close(benchlab *b);

/* The bandwidth of a device spec "...@25GB/s" into *BW, bytes per second (0 when it has none):
 * 0, or -1 when the bandwidth does not parse. */
int benchlab_spec_bandwidth(const char *spec, double *bw);
/* Measures the link of device SPEC into *BW, bytes per second: 16 copies of 64 MiB (a quarter of
 * the device's free memory where that is less) from pinned host memory (the device's host_alloc;
 * plain memory where it has none), two in flight, the best of 3. 0, or -1 with WHY filled when the device cannot be opened or the copies fail. */
int benchlab_link_bandwidth(const char *spec, double *bw, char *why, size_t why_len);

/* The 1-minute load average ("0.42", "?" when unknown) into BUF. */
void benchlab_load_average(char *buf, size_t cap);

#endif
