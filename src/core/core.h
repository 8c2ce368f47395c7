/*
 * core.h — the manager's internal structures, shared by the files of src/core/.
 *
 * Locking: one mutex per manager (ferry.lock) protects every field below that is not marked
 * otherwise: tensor states, reference counts, budgets, pools, the schedule and the job queue.
 * Loader threads drop it while they move bytes; a tensor in state LOADING belongs to the loader
 * that runs its job, and nobody else touches its copies until the state changes (then `cond` is
 * broadcast). Device and I/O calls are never made with the lock held, except frees of memory that
 * no job can reach. ferry_open parses a file's headers without it and takes it only to commit
 * the parsed model into the catalog, which changes only under the lock. mlock of a mapping
 * (policy.lock) is I/O too: a job does it (FILL_LOCK).
 *
 * Lock order: ferry.lock, then ferry.trace.lock (read side: appending to the trace), then the
 * trace's own mutex. An arena load's m (core.h, ferry__arena_load) and a read's wait mutex
 * (transfer.c) are leaves, taken without ferry.lock: the I/O pool's completion callbacks take
 * only them, never ferry.lock.
 */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ferry.h"
#include "ferry_device.h"
#include "formats/catalog.h"
#include "formats/formats.h"
#include "io/io.h"
#include "lora/lora.h"
#include "sched/evict.h"
#include "sched/prefetch.h"
#include "sched/sched.h"
#include "util/util.h"

#define FERRY__HOST 0 /* device id of the host (cpu) */
/* FERRY_LOAD_AUTO serves a tensor from the mapping when at least this fraction of its pages is in
 * the page cache when it is bound; else it reads a private copy */
#define FERRY__AUTO_MAP_CACHED 0.5
/* most blocks the first pass's streamed copies are faulted into ahead (memory.c) */
#define FERRY__WARM_MAX 256

typedef struct ferry__trace ferry__trace;
typedef struct ferry__arena ferry__arena; /* arena.c: one mapping for a group load's host copies */

typedef struct ferry__group {
    char *name;
    ferry_policy policy;
    int removed;
    int removing;             /* ferry_group_remove is waiting for its loads: prepares refused */
} ferry__group;

typedef struct ferry__rule {
    char *pattern;
    int group; /* index into groups */
} ferry__rule;

/* A block of memory on one device: allocated by it, or a slice of a group load's arena. */
typedef struct ferry__mem {
    void *base;       /* what the device allocated (NULL: none) */
    uint64_t size;    /* bytes accounted to the device */
    ferry__arena *arena; /* base lies in this arena (a reference), not allocated by the device */
    int moved;        /* host pages moved here by a stitch, or fresh: touched before use */
    int small_pages;  /* fresh host memory for a copy the budget keeps: small pages asked for
                         (memory.c, "the first pass where fresh huge pages are dear"); given
                         back to the device, not pooled */
} ferry__mem;

typedef enum ferry__state {
    FERRY__EMPTY = 0, /* no valid copy */
    FERRY__LOADING,   /* a job is filling it */
    FERRY__READY,     /* valid */
} ferry__state;

/* One copy of a tensor's bytes on a device. */
typedef struct ferry__copy {
    ferry__state state;
    int dev;          /* device id */
    ferry__mem mem;   /* owned memory, or mem.base NULL for a pointer into the mapping */
    void *ptr;        /* where the tensor's first byte is */
    int permanent;    /* a home copy: never evicted */
    int mapped;       /* ptr points into the file mapping (zero-copy or lazy) */
    uint64_t locked;  /* bytes mlock'd from ptr (0: none) */
    uint64_t last_use;/* LRU clock */
    uint64_t epoch;   /* LoRA epoch it was staged in */
    int merged;       /* LoRA terms were added to it */
    int status;       /* the last job's result when it failed */
    int ahead;        /* filled by a prefetch and not used since: it holds a window's bytes */
    /* A host copy copied to an accelerator at each use: the page-aligned part of its bytes
     * registered with device reg_dev (host_register), undone when the copy is dropped. */
    void *reg;        /* NULL: none */
    uint64_t reg_len;
    int reg_dev;
    int reg_refused;  /* the device refused: not asked again for this copy */
} ferry__copy;

/* One adapter's term on one weight. */
typedef struct ferry__lora_term {
    int slot;                 /* index into ferry.lora.adapters */
    ferry__lora_pair *pair;   /* owned by the adapter */
} ferry__lora_term;

typedef struct ferry__adapter_slot {
    ferry__adapter *a;        /* NULL once freed */
    int id;
    int removed;              /* out of the set; freed when no job can use it */
    float multiplier;
    int required;
    char *base_prefix, *target_prefix;
    uint32_t skipped;
    ferry__mem factors;       /* host budget held by its cached factors */
    const char *unmatched[4];
    uint32_t n_unmatched;
} ferry__adapter_slot;

typedef struct ferry__expect_rec {
    ferry_dtype dtype;
    uint32_t ndim;
    int64_t shape[FERRY_MAX_DIMS];
} ferry__expect_rec;

struct ferry_tensor {
    ferry *owner;
    uint32_t id;              /* index in the catalog and in ferry.tensors (a part: its parent's) */
    uint32_t uid;             /* index in ferry.all: the schedule's and eviction's numbering */
    ferry_tensor_info info;   /* from the catalog; strings owned by the catalog */
    const ferry__iofile *file;
    int group;                /* index into ferry.place.groups; -1 before binding */
    int ignored;
    int optional;
    int bound;                /* placement decided (group fixed) */
    int used;                 /* ever loaded or prepared: its group may no longer change */
    int removed;              /* its group was removed: the handle is dead */

    /* placement (decided by ferry__decide, the same function the dry run uses) */
    int lazy;
    int zero_copy;            /* the host copy is the mapping */
    int auto_private;         /* not zero_copy only because load AUTO found it uncached */
    int map_eligible;         /* its policy lets comp be the mapping in some cache state (lazy,
                                 or zero-copy on the host before AUTO looks at the cache) */
    int compute_dev;
    ferry_dtype out_dtype;    /* dtype at the data pointer */
    uint64_t out_bytes;       /* bytes at the data pointer */

    /* copies: host (home host on a non-host compute device), comp (what the user gets) */
    ferry__copy host;
    ferry__copy comp;

    /* LoRA: the current set's terms on this weight; merge: the staged copy carries them */
    ferry__lora_term *terms;
    size_t n_terms;
    int merge;
    int stale;                /* comp is from an older epoch but in use: drop at last release */
    int failed_prefetch;      /* comp's last job, which failed, was a prefetch */
    uint64_t skip_epoch;      /* epoch in which its skipped merges were counted */

    int populating;           /* a job is reading its mapped range into the page cache */
    int populated;            /* that was done once */
    ferry__arena *arena;      /* a group load placed its file copy here (not yet queued) */
    int arena_copy;           /* which copy that is: FERRY__ARENA_COMP or FERRY__ARENA_HOST */

    int refs;                 /* prepares minus releases */
    /* memory.c's evictable set of comp's device: linked while comp may be evicted */
    ferry_tensor *ev_prev, *ev_next;
    int ev_dev;               /* the set it is in (valid while ev_in) */
    int ev_in;
    int fenced;               /* of refs: releases waiting on an engine event (fence.c) */
    int canceling;            /* a cancelled load is dropping its queued jobs (prepare.c) */
    uint64_t load_gen;        /* bumped each time a job is queued for it */
    char *fail_msg;           /* the last failed demand load's message (owned; NULL: none), for
                                 the prepare that waits on it to report */

    /* split placement: a parent has parts (its own copies stay empty); a part has a parent,
     * its rows start at row_base, and it is computed on dev_override */
    ferry_tensor **parts;
    int n_parts;
    ferry_tensor *parent;
    uint64_t row_base;
    int dev_override;         /* -1: the policy's compute device */
    char *own_name;           /* a part's or a slice's name, owned */

    /* slices (slice.c): a tensor keeps the slices made of it (SLICES owned, the handles registered
     * in ferry.all); a slice has PARENT, is_slice, and holds the parent's outermost rows
     * [slice_first, slice_first + slice_count). It is a unit of its own, never one of parts. */
    ferry_tensor **slices;
    size_t n_slices, cap_slices;
    int is_slice;
    uint64_t slice_first, slice_count;
    int moe_held;             /* memory.c: counted as holding memory by the expert policy */
    /* ferry_prefetch_guess: named by a guess at its layer's use clock GUESS_AT (kept from other
     * loads' evictions while that clock has not moved); GUESS_LOADED: its copy a guess's load,
     * not used since */
    int guessed, guess_loaded;
    uint64_t guess_at;
    uint64_t moe_prep;        /* slice.c: its layer's prepare count (moe.group_prep) at its last use */

    /* expectation */
    int has_expect;
    ferry_dtype expect_dtype;
    uint32_t expect_ndim;
    int64_t expect_shape[FERRY_MAX_DIMS];
};

typedef struct ferry__pool_buf {
    void *base;
    uint64_t size;
    uint32_t segs; /* > 0: a mapped cpu block of exactly SIZE bytes, stitchable (ferry__cpu_stitch) */
} ferry__pool_buf;

typedef struct ferry__dev {
    ferry_device *d;
    ferry_device_props p;     /* D's properties, read once when it was added */
    uint64_t budget;          /* 0: unlimited */
    uint64_t used;            /* live + in flight + pooled + reserved */
    uint64_t reserved;        /* the engine's own memory (ferry_reserve), counted in used */
    uint64_t peak;
    uint64_t pooled;          /* free buffers kept for reuse (host only) */
    ferry__pool_buf *pool;
    size_t n_pool, cap_pool;
    int no_stitch;            /* the kernel cannot move pages (not Linux): pool by size only */
    int default_budget;       /* the host under its default budget: no pool, freed buffers go
                                 back to the system (a pool would hold them from the rest) */
    ferry_tensor *evictable;  /* the tensors whose comp copy here may be evicted (memory.c) */
    uint64_t reg_mapped;      /* host: bytes of file mappings registered with devices, which
                                 page-locks them; kept within the budget's room (jobs.c) */
} ferry__dev;

typedef struct ferry__job {
    ferry_tensor *t;
    struct ferry__job *next;
    int prefetch;
    int guess;                /* a prefetch in file order before a schedule (counted in
                                 ferry.prefetch.inflight_guess) */
    int hint;                 /* queued by ferry_prefetch_guess */
    int fill;                 /* FILL_HOST | FILL_COMP */
    uint64_t epoch;           /* LoRA epoch when queued */
    /* The placement the job works to, fixed when it is queued: a loader never reads policies or
     * the tensor's decision fields, which other threads may change under the lock meanwhile. */
    ferry_dtype out_dtype;
    uint64_t out_bytes;
    int transformed;
    ferry_load load;
    int lock;
    ferry__lora_term *terms;  /* snapshot of t->terms with their scales (merge only), owned */
    float *scales;
    size_t n_terms;
    /* FILL_LOCK's outcome, set by the loader without the lock, read under it by finish_job */
    uint64_t mlocked;         /* bytes it locked from the mapping (0: none) */
    int mlock_refused;        /* the kernel refused (RLIMIT_MEMLOCK): counted, no error */
    /* The host copy as a registered copy source (FILL_COMP to an accelerator from a host home):
     * reg_src and [reg_lo, reg_hi) (offsets in the tensor) name the bytes the copy engine reads
     * directly, set when queued for a range registered before, or by the loader when reg is
     * FERRY__REG_ASK (set when queued) and it registers them. The loader leaves reg at NEW or
     * REFUSED, which finish_job reads under the lock to record or undo. */
    enum { FERRY__REG_NONE, FERRY__REG_ASK, FERRY__REG_NEW, FERRY__REG_REFUSED } reg;
    uint64_t reg_reserved;    /* bytes of a mapping counted in the host's reg_mapped meanwhile */
    const unsigned char *reg_src;
    uint64_t reg_lo, reg_hi;
} ferry__job;

/* An event of the public API (stream.c). Engine events have one device handle; a prepare event
 * has one per device its set is staged on, recorded on their copy queues once the set is ready.
 * Fields under the manager's lock, except handles, which are set before the event is shared. */
struct ferry_event {
    ferry *f;
    int dev;                      /* the device of an engine event; -1 for a prepare event */
    void *h[FERRY_MAX_DEVICES];   /* device event handles (NULL: none, complete) */
    int refs;                     /* the caller's (until destroy) + one per fence */
    /* prepare events: the held set until it settles */
    int prepare;
    int pending;                  /* loads may still run; the set is held */
    int status;                   /* once settled: 0, or the failure (the set then released) */
    ferry_tensor **ts, **u;       /* the caller's set and its residency units (owned copies) */
    char *fail_msg;               /* once settled with a failure: its message (owned) */
    size_t n, nu;
};

/* A release waiting on an engine event: T keeps the reference until EV completes. */
typedef struct ferry__fence {
    ferry_event *ev;
    ferry_tensor *t;
    struct ferry__fence *next;
} ferry__fence;

/* Each group of fields says which file writes it; everything is under `lock` unless marked. */
struct ferry {
    pthread_mutex_t lock;
    pthread_cond_t cond;      /* a tensor changed state, a job finished */
    pthread_cond_t work;      /* a job was queued, or closing */
    uint64_t serial;          /* unique among all managers ever created: keys each thread's
                                 last failure (fail.c), never reused */
    ferry_options opt;        /* manager.c, at create (jobs.c reads it) */

    /* manager.c's ferry_open fills cat and tensors; policy.c's ferry__register appends to all */
    ferry_catalog *cat;
    ferry_tensor **tensors;   /* by id (catalog index) */
    size_t n_tensors;
    ferry_tensor **all;       /* by uid: catalog tensors and split parts */
    size_t n_all, cap_all;

    struct {                  /* expect.c's; ferry_open takes the entries of tensors it opens */
        ferry__hmap expected_missing; /* names expected but absent: key owned by missing_names */
        char **missing_names; /* owned; expectations of tensors not (yet) opened */
        ferry__expect_rec *missing_expect;
        size_t n_missing;
    } expect;

    struct {                  /* manager.c's group, rule and pattern calls; policy.c reads them */
        ferry__group *groups;
        size_t n_groups;
        ferry__rule *rules;
        size_t n_rules;
        char **ignore;
        size_t n_ignore;
        char **optional;
        size_t n_optional;
    } place;

    ferry__dev devs[FERRY_MAX_DEVICES]; /* manager.c adds devices and budgets; memory.c accounts */
    int n_devs;

    ferry__io *io;            /* manager.c, at create */
    struct {                  /* jobs.c's; prepare.c unlinks a cancelled load's queued jobs */
        pthread_t *loaders;
        unsigned n_loaders, cap_loaders; /* started; room in loaders (set at create) */
        ferry__job *queue_head, *queue_tail;
        ferry__job *free_jobs;
        unsigned running;     /* jobs being executed */
        int closing;
    } jobs;

    struct {                  /* lora_glue.c's */
        ferry__adapter_slot *adapters;
        size_t n_adapters;
        int next_adapter_id;
        ferry_lora_mode lora_mode;
        uint64_t lora_epoch;
    } lora;

    /* the schedule: prepare.c records accesses, policy.c sizes it, manager.c resets it */
    ferry__sched sched;
    ferry__evictor evictor;   /* the eviction policy, over sched (sched/evict.h) */
    struct {                  /* memory.c's: the expert policy, governing slices (ferry.h,
                                 ferry_slice), sharing each budget with evictor's units */
        int on;               /* 0: slices go by evictor as any tensor (FERRY_SLICE_EVICT_CYCLIC) */
        ferry__moe_policy p;  /* over uids; a slice's group is its parent's layer */
        ferry__evictor ev;
        uint32_t *group;      /* per uid (0 for a tensor that is no slice), n_ids of them */
        int64_t *layer;       /* per group: its layer ("blk.N." in the parent's name; -1: none) */
        size_t n_ids, n_groups;
        uint64_t dense_set;   /* the most bytes of units that are no slices in one prepare */
        uint64_t expert_set;  /* the most bytes of slices in one prepare */
        uint64_t *group_prep; /* per group: prepares that used slices of it (n_groups) */
        const ferry_tensor *loading; /* jobs.c: the unit whose copies are being reserved */
        const ferry_tensor *guess;   /* prepare.c: the same, for ferry_prefetch_guess (memory.c
                                        evicts only what the expert policy ranks below it) */
    } moe;
    uint64_t clock;           /* LRU clock: jobs.c and prepare.c tick it */
    struct {                  /* memory.c's: the first pass where fresh huge pages are dear */
        int on;               /* FERRY_KEPT_PAGES, else ferry__host_huge_pages_dear(), read
                                 when F was created */
        uint32_t *rank;       /* a pass's copies in file order, by rank: their ranks, */
        uint64_t *upto;       /* and the bytes of each with those ranked before it */
        size_t n;             /* entries (0: not summed) */
        size_t n_tensors;     /* prefetch.follow_tensors when they were summed */
        uint64_t set_max;     /* the largest prepared set's bytes seen */
        /* The streamed copies' first blocks, faulted in ahead (memory.c, ferry__first_warm): the
         * thread writes warm_base and warm_done; they are read after it is joined. */
        pthread_t warm_thread;
        int warming;          /* warm_thread was started and is not joined yet */
        int warmed;           /* a warm was started once: never again */
        atomic_int warm_stop; /* the thread stops at its next huge page */
        size_t warm_n;        /* blocks planned, of warm_size bytes each */
        size_t warm_done;     /* blocks allocated (written by the thread) */
        uint64_t warm_faulted; /* of their bytes, faulted in (written by the thread) */
        atomic_int warm_exited; /* the thread has returned (the fields above are final) */
        uint64_t warm_total;  /* the bytes planned, counted in the host's used from the start */
        uint64_t warm_size[FERRY__WARM_MAX];
        void *warm_base[FERRY__WARM_MAX];
        /* The kept reserve (memory.c): one block of small pages for the copies predicted kept,
         * faulted in by the same thread after the streamed blocks, counted in warm_total. */
        uint64_t kept_plan;   /* its bytes planned */
        void *kept_made;      /* its block (written by the thread) */
        uint64_t kept_faulted; /* of its bytes, faulted in (written by the thread) */
        void *kept_base;      /* once joined: what is left of it, cut from its front */
        uint64_t kept_size;   /* and its bytes, counted in the host's used */
    } first;
    struct {                  /* jobs.c's; prepare.c sets last_set_bytes and resets follow */
        unsigned inflight_prefetch;
        unsigned inflight_guess; /* of them, queued by the file-order prefetch (job.guess) */
        uint64_t last_set_bytes; /* bytes of the last prepared set: the prefetch window */
        ferry__pf_follow follow; /* prefetch in file order before a schedule (sched/prefetch.h) */
        size_t follow_tensors;   /* n_tensors when follow's file order was set */
    } prefetch;

    struct {                  /* trace.c's; manager.c writes out and frees the last at destroy */
        ferry__trace *tr;     /* NULL unless tracing; set and cleared under lock's write side,
                                 appended to under its read side */
        pthread_rwlock_t lock; /* after ferry.lock in the lock order (see the top of this file) */
    } trace;
    struct {                  /* fence.c's: releases waiting on events, oldest first */
        ferry__fence *head, *tail;
    } fences;
    struct {                  /* prepare.c's (ferry_set_progress) */
        ferry_progress_fn fn;
        void *ud;
    } progress;
    struct {                  /* coldload.c's: how load AUTO reads what the page cache lacks */
        int decided, map, forced, dear;
        double map_gbps, private_gbps, fault_gbps, read_gbps;
    } cold;
    int relay;                /* large direct reads into host memory are relayed (io.h, `relay`),
                                 decided at create (manager.c) */
    ferry_stats stats;        /* counters (prepare.c, memory.c); resident/peak filled from devs
                                 on read */
    /* Counters updated without the lock (atomics) by jobs.c, prepare.c and tensor.c, merged into
     * stats on read. */
    uint64_t a_bytes_read, a_bytes_copied, a_locked_bytes, a_lock_failures;
};

/* memory.c: FERRY_KEPT_PAGES=small|huge, else whether fresh huge pages are dear here, read when F
 * is created: whether the first pass gives the copies its budget keeps small pages and streams
 * the others through their own blocks (memory.c, "the first pass where fresh huge pages are
 * dear"). */
void ferry__first_init(ferry *f);
/* Where the first pass's placement will stream copies on the host (memory.c, "the first pass
 * where fresh huge pages are dear"), faults their first blocks in on a thread of its own, so that
 * an engine's set-up before its first prepare covers them; once per manager, and only while the
 * host holds nothing. Lock held. */
void ferry__first_warm(ferry *f);
/* Stops that thread at its next huge page and waits for it; what it faulted in joins the pool,
 * the rest of its bytes leave the budget. No-op when none runs. Lock held (the thread never
 * takes it). */
void ferry__first_warm_join(ferry *f);
/* Gives back what is left of the kept reserve (memory.c), as a new budget or the manager's end
 * does. Lock held. */
void ferry__first_kept_drop(ferry *f);
/* N of "blk.N." in NAME, or -1 when it has none (slice.c). */
int64_t ferry__layer_of(const char *name);

/* coldload.c */
/* FERRY_AUTO_COLD=map|private, read when F is created: decided for the manager's life. */
void ferry__cold_init(ferry *f);

/* Decides, once per manager, how load AUTO brings in the bytes the page cache does not hold, from
 * the tensors SET[0..N) of a group load or a prepare bound to AUTO private copies: when they, or
 * the file holding the largest of them, make at least FERRY__COLD_PROBE_MIN bytes (or
 * FERRY_AUTO_COLD=probe), a probe measures both ways on that file. When the mapping wins, those
 * tensors are switched to it (and bind maps every uncached AUTO tensor from then on). Lock
 * held. */
#define FERRY__COLD_PROBE_MIN (UINT64_C(512) << 20)
void ferry__cold_decide(ferry *f, ferry_tensor *const *set, size_t n);
/* The rate, bytes per second, at which a load faults in fresh memory, from the seconds SECS[0..N)
 * that the probe's N steps of STEP bytes each took: where the slowest step took at least
 * FERRY__COLD_STEP_SPREAD times the median one, some steps were served by pages freed a moment
 * ago and the others by memory the host backs again on first touch (a VM that reports free pages
 * to its host): a load far larger than the probe meets mostly the latter, and the rate is the
 * slowest step's; else the steps' own rate (their bytes over their sum). 0 when N is 0 or above
 * FERRY__COLD_STEPS_MAX, or a time is not positive. */
#define FERRY__COLD_STEP_SPREAD 4.0
/* Where fresh huge pages are dear, private copies win when fresh memory faults in at least this
 * many times as fast as the mapping fills (coldload.c, probe). */
#define FERRY__COLD_FAULT_OVER_FILL 1.5
#define FERRY__COLD_STEPS_MAX 64
double ferry__cold_fault_rate(const double *secs, size_t n, uint64_t step);
/* The rate, bytes per second, that the FERRY__COLD_SLOW_STEPS slowest of the N steps of STEP bytes
 * that took SECS[0..N) did not reach: 16 MiB of a long probe's memory came in at it or slower,
 * which is what a whole model's load meets beyond the pages freed a moment ago; the slowest
 * step's where there are no more steps than that. 0 when N is 0 or above FERRY__COLD_STEPS_MAX,
 * or a time is not positive. */
#define FERRY__COLD_SLOW_STEPS 8
double ferry__cold_slow_rate(const double *secs, size_t n, uint64_t step);

/* 1 when T's staged bytes differ from the file's (converted or merged). */
static inline int ferry__transformed(const ferry_tensor *t)
{
    return t->out_dtype != t->info.dtype || t->merge;
}

/* lora_glue.c */
/* Sets t->merge from the adapter set, mode and dtype; FERRY_ELORA when a required adapter cannot
 * be merged into T. Lock held. */
int ferry__lora_decide(ferry *f, ferry_tensor *t, ferry__err *e);
/* Snapshots T's terms into J (merge mode). Lock held. */
int ferry__lora_snapshot(ferry *f, ferry_tensor *t, ferry__job *j);
/* Frees adapters that were removed once no job runs. Lock held. */
void ferry__lora_sweep(ferry *f);
void ferry__lora_free_all(ferry *f);

/* trace.c: no-ops unless tracing */
void ferry__trace_add(ferry *f, const char *name, const char *cat, double t0, double t1);
/* NAME is FMT with one %s replaced by ARG (copied). */
void ferry__trace_addf(ferry *f, const char *cat, double t0, double t1, const char *fmt,
                       const char *arg);
int ferry__trace_write(ferry__trace *tr, ferry__err *e);
void ferry__trace_free(ferry__trace *tr);
static inline int ferry__tracing(const ferry *f)
{
    return __atomic_load_n(&f->trace.tr, __ATOMIC_RELAXED) != NULL;
}

/* The tensor whose binding decides T's: a split part's parent (it binds its parts); T itself
 * otherwise (a slice binds its parent first). */
static inline ferry_tensor *ferry__bind_root(ferry_tensor *t)
{
    return t->parent && !t->is_slice ? t->parent : t;
}

/* slice.c */
/* The slice of T's outermost rows [FIRST, FIRST + COUNT) into *OUT: the one made before, or a
 * new one registered in ferry.all. FERRY_EINVAL for a range or a row that cannot be cut. Lock
 * held; no check of T's usability (ferry_slice does that). */
int ferry__slice_get(ferry *f, ferry_tensor *t, uint64_t first, uint64_t count,
                     ferry_tensor **out, ferry__err *e);
/* The number of T's outermost rows (its last GGUF dimension, its first safetensors one). */
uint64_t ferry__outer_rows(const ferry_tensor *t);

/* policy.c */
const ferry_policy *ferry__policy_of(const ferry *f, const ferry_tensor *t);
/* The policy T has or, not bound yet, will have at its first use: its group's by the rules as
 * they stand now. */
const ferry_policy *ferry__policy_ahead(const ferry *f, const ferry_tensor *t);
/* Appends T to ferry.all, giving it its uid. */
int ferry__register(ferry *f, ferry_tensor *t);
/* Decides the placement of T from its policy and size alone (never from the load mode for
 * laziness, never from whether this is a dry run). Fills t->lazy, zero_copy, compute_dev,
 * out_dtype, out_bytes. */
int ferry__decide(ferry *f, ferry_tensor *t, ferry__err *e);
/* Bytes a host buffer for T's data takes (headroom for direct I/O included). */
uint64_t ferry__host_alloc_size(const ferry_tensor *t, int converted);
/* Bytes a device (non-host) copy of T takes. */
uint64_t ferry__dev_alloc_size(const ferry_tensor *t);
ferry_home ferry__effective_home(const ferry *f, const ferry_tensor *t);
/* The device T is computed on (a split part's own device). */
int ferry__compute_device_of(const ferry *f, const ferry_tensor *t);
/* Whether T is ignored by the patterns (without deciding its placement). */
int ferry__is_ignored(const ferry *f, const ferry_tensor *t);
/* Fixes T's group, ignore/optional flags and placement (no-op when already bound). */
int ferry__bind(ferry *f, ferry_tensor *t, ferry__err *e);
/* After a rule change: unbinds every unused tensor; with CHECK_ONLY, fails with FERRY_EBUSY
 * when a used tensor would change group. */
int ferry__rebind_all(ferry *f, int check_only, ferry__err *e);

/* memory.c — budgets and pools; called with the lock held */
int ferry__reserve(ferry *f, int dev, uint64_t size, uint64_t for_distance, ferry__mem *out,
                  ferry__err *e);
/* Counts SIZE bytes against DEV's budget without memory behind them (cached LoRA factors). */
int ferry__reserve_bytes(ferry *f, int dev, uint64_t size, ferry__mem *out, ferry__err *e);

/* arena.c — a group load's private host copies of neighbouring tensors of one file share one
 * mapping, laid out as in the file, read as whole ranges of the file while a toucher thread
 * faults the mapping in ahead of the reads. */
enum { FERRY__ARENA_COMP = 1, FERRY__ARENA_HOST = 2 };
/* arena.claimed[i], decided under the lock when the copy is claimed, read without it by the
 * load while it reads (the policy may change meanwhile) */
enum { FERRY__CLAIMED = 1, FERRY__CLAIMED_HOST = 2 /* the host copy, not comp */,
       FERRY__CLAIMED_LOCK = 4 /* mlock it (policy.lock) */ };
typedef struct ferry__arena_read {
    ferry__ioreq req;
    size_t first, end;    /* it fills the copies of ts[first..end) (those claimed) */
    int status;
    int done;             /* its callback ran (under the load's m) */
    uint64_t bytes;       /* bytes of the claimed tensors it fills (progress) */
    uint64_t chunk_bytes; /* bytes of its chunks read so far */
    struct ferry__arena_load *load;
} ferry__arena_read;
struct ferry__arena {
    const ferry__iofile *file;
    ferry_load mode;      /* of the run's tensors' policies */
    uint64_t file_start;  /* file offset of base (page-aligned) */
    uint64_t len;         /* bytes from base that copies use */
    unsigned char *map;   /* the mapping, map_len bytes; base is its first 2 MiB boundary */
    size_t map_len;
    unsigned char *base;
    uint32_t refs;        /* copies placed in it, plus one while its load runs */
    ferry_tensor **ts;    /* the tensors placed in it, in file order (n); the load's */
    unsigned char *claimed; /* FERRY__CLAIMED...: ts[i]'s copy is LOADING from its reads */
    uint64_t epoch;       /* the LoRA epoch when the copies were claimed */
    size_t n;
    uint64_t *ends;       /* file offset where ts[i]'s copy ends (its page-aligned start + size) */
    ferry__arena_read *reads; /* one per range of claimed neighbours (n_reads, at most n) */
    size_t n_reads;
    ferry__arena *next;   /* the load's list */
};
typedef struct ferry__arena_load {
    ferry__arena *list;
    pthread_t toucher;
    atomic_int stop;
    int started;
    pthread_mutex_t m;    /* reads_left, and the wake-up when it reaches 0 */
    pthread_cond_t c;
    size_t reads_left;
    uint64_t done_bytes;  /* bytes of the reads done (progress), under m */
    int each_chunk;       /* the waiter reports progress: woken at every chunk, not only at the
                             end of a read */
} ferry__arena_load;
/* The load mode and host copy size of T (its policy's), for ferry__arena_plan. */
typedef void (*ferry__arena_span_fn)(const ferry_tensor *t, ferry_load *mode, uint64_t *bytes);
/* Places each tensor of TS with arena_copy set in an arena, for runs of neighbouring tensors of
 * one file and one load mode (SPAN) large enough to be worth it; *OUT is the list made (NULL:
 * none). Never fails: without memory for an arena the tensors get buffers of their own. */
void ferry__arena_plan(ferry_tensor *const *ts, size_t n, ferry__arena_span_fn span,
                       ferry__arena **out);
/* Points *M, already reserved against the host budget, at ts[i]'s place in A and marks the copy
 * claimed; the copy then holds a reference to the arena. */
void ferry__arena_place(ferry__arena *a, size_t i, ferry__mem *m);
/* Makes A's reads: one per range of claimed tensors whose pages touch; with HUGE, the 2 MiB
 * blocks they fill whole are advised huge pages; with RELAY the reads are relayed (io.h,
 * `relay`). */
void ferry__arena_ranges(ferry__arena *a, int huge, int relay);
/* Makes LIST the load's arenas; with TOUCH, starts the toucher over their reads' destinations
 * (none when the thread cannot start). */
void ferry__arena_begin(ferry__arena_load *L, ferry__arena *list, int touch);
/* Stops and joins the toucher (the reads are done: what it has not faulted in is not needed). */
void ferry__arena_stop(ferry__arena_load *L);
/* Stops the toucher if still running, forgets the places of tensors never claimed, drops the
 * load's references. */
void ferry__arena_end(ferry__arena_load *L);
/* Drops one reference; the last unmaps the arena. */
void ferry__arena_release(ferry__arena *a);
/* Unlocks the pages that hold only bytes of [PTR, PTR+N): the pages a copy shares with its
 * neighbours stay locked until the arena goes (mlock does not count, and a neighbour may hold
 * them locked). */
void ferry__arena_unlock(void *ptr, uint64_t n);
/* Returns the pages that hold only bytes of [PTR, PTR+N) to the system (and keeps khugepaged
 * from filling them again). */
void ferry__arena_trim(const void *ptr, uint64_t n);
void ferry__unreserve(ferry *f, int dev, ferry__mem *m);
void ferry__drop_copy(ferry *f, ferry_tensor *t, ferry__copy *c);
void ferry__pool_trim(ferry *f, int dev, uint64_t want_free);
/* The longest tail of small pages a stitched host block of 2 MiB or more ends with (the rest takes
 * one more 2 MiB page): FERRY_STITCH_TAIL where set, else ferry__stitch_tail_for the measured cost
 * of moving a page (ferry__cpu_move_cost); decided once per process. */
uint64_t ferry__stitch_tail_max(void);
/* The rule: tails whose pages cost at most 0.25 ms to move, in steps of 16 KiB from 16 KiB to
 * 1 MiB (1 MiB where a move costs nothing); MOVE_COST in seconds a page. */
uint64_t ferry__stitch_tail_for(double move_cost);
/* Puts T in its comp device's evictable set or takes it out, as its comp copy now qualifies: call
 * after a change of T's references or of comp's state. O(1). */
void ferry__evictable_note(ferry *f, ferry_tensor *t);
/* Whether T is governed by the expert policy (a slice, unless the manager was made with
 * FERRY_SLICE_EVICT_CYCLIC). */
static inline int ferry__expert_unit(const ferry *f, const ferry_tensor *t)
{
    return t->is_slice && f->moe.on;
}
/* Gives slice T (registered) its group in the expert policy: 0 or FERRY_ENOMEM. */
int ferry__moe_add(ferry *f, ferry_tensor *t, ferry__err *e);
/* Tells the expert policy of the uses of the expert units among U (a prepare's), and raises the
 * floor and the largest sets from them. */
void ferry__moe_used(ferry *f, ferry_tensor *const *u, size_t nu);
/* Whether T is kept from eviction by a guess (ferry_prefetch_guess): named since its layer's
 * last use. */
int ferry__guess_kept(const ferry *f, const ferry_tensor *t);
/* Evicts cached copies until DEV is within its budget (after a budget change). */
void ferry__shrink(ferry *f, int dev);
/* The budget test of a load against device DEV, lock held: KEPT bytes that are never evicted
 * (home copies) and the largest single copy staged beside them, STAGED bytes (tensor NAME, may be
 * NULL), must fit its budget, since reserve can evict only cached copies. 0, or FERRY_EBUDGET with
 * the device, the budget, both sizes and the shortfall in the message. */
int ferry__budget_check(ferry *f, int dev, uint64_t kept, uint64_t staged, const char *name,
                        ferry__err *e);

/* expect.c */
/* Checks T's expectation, writing the problems into E; 0 when it fits (E untouched). */
int ferry__check_expect(const ferry_tensor *t, ferry__err *e);

/* fail.c — each thread's last failure per manager. Internal functions fail into a ferry__err
 * out-parameter (NULL: nobody's error, as for hints); the public call publishes it to the calling
 * thread's slot for F. No lock needed. */
/* Gives a new manager its serial; FERRY_ENOMEM when it cannot be registered. */
int ferry__serial_register(uint64_t *serial);
/* The manager SERIAL is gone: its serial is no longer live, the calling thread's slot is freed. */
void ferry__serial_unregister(uint64_t serial);
/* With CODE < 0: makes E (NULL, or no message: ferry_strerror(CODE)) the calling thread's last
 * failure on F. Returns CODE; CODE 0 publishes nothing. */
int ferry__publish(const ferry *f, int code, const ferry__err *e);
/* ferry__publish with a whole report LONG_MSG (owned, freed here; may be NULL) of which e->msg
 * holds what fits. */
int ferry__publish_long(const ferry *f, int code, const ferry__err *e, char *long_msg,
                        size_t long_len);
/* Formats a message and publishes it as the calling thread's failure on F; returns CODE. */
int ferry__fail_thread(const ferry *f, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* changes.c */
/* Checks the files of TS (each once) against what was opened (PATH_TOO, FERRY__PATH_*: and what
 * their paths name now); FERRY_ECHANGED in E naming the file when one changed. Lock not
 * held. */
int ferry__check_tensors(ferry_tensor *const *ts, size_t n, int path_too, ferry__err *e);
/* After a load of TS failed with FERRY_EIO: FERRY_ECHANGED, with what changed appended to the
 * failure's message in E, when one of their files changed; else FERRY_EIO (E untouched). */
int ferry__check_after_eio(ferry_tensor *const *ts, size_t n, ferry__err *e);

/* prepare.c */
/* The first half of a prepare: checks TS, takes the references, records the access. *OUT: the
 * residency units (TS itself unless something is split; else malloc'd). Lock held. */
int ferry__prepare_begin(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor ***out,
                         size_t *nout, ferry__err *e);
/* Drops what prepare_begin took (a failed prepare). Lock held. */
void ferry__prepare_undo(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                         size_t nu);
/* The second half: waits until every unit is READY (undoing the references on failure). */
int ferry__prepare_finish(ferry *f, ferry_tensor *const *ts, size_t n, ferry_tensor *const *u,
                          size_t nu, ferry__err *e);
/* Queues the loads of units not loading yet, without waiting; failures are left for the wait. */
void ferry__prepare_queue(ferry *f, ferry_tensor *const *u, size_t nu);
/* 1 when every unit is READY, 0 while some load runs (and none needs queuing), -1 when one needs
 * a load queued again (or has failed). Lock held. */
int ferry__units_state(const ferry *f, ferry_tensor *const *u, size_t nu);
/* jobs.c: drops one reference of T (and its parts), as ferry_release does. Lock held. */
void ferry__release_tensor(ferry *f, ferry_tensor *t);

/* copy.c — a copy's state changes, lock held by all */
/* C is the file mapping at PTR: READY, permanent. */
void ferry__copy_map(ferry *f, ferry_tensor *t, ferry__copy *c, void *ptr);
/* C is being filled into M (reserved): LOADING. */
void ferry__copy_loading(ferry *f, ferry_tensor *t, ferry__copy *c, ferry__mem m);
/* C's load is done: READY. */
void ferry__copy_ready(ferry *f, ferry_tensor *t, ferry__copy *c);
/* C's load failed with RC: its memory given back, EMPTY on its device with the status. */
void ferry__copy_failed(ferry *f, ferry_tensor *t, ferry__copy *c, int rc);
/* SRC's bytes become DST (the other copy of T), SRC EMPTY. */
void ferry__copy_move(ferry *f, ferry_tensor *t, ferry__copy *dst, ferry__copy *src);

/* fence.c — lock held by all */
/* Drops one reference of EV; the last frees its device handles. */
void ferry__event_unref(ferry_event *ev);
/* T's reference stays until EV completes (EV and T each count the fence); FERRY_ENOMEM when it
 * cannot be remembered (nothing changed). */
int ferry__fence_add(ferry *f, ferry_event *ev, ferry_tensor *t);
/* Ends the fences whose events have completed (queries, never waits). */
void ferry__fences_reap(ferry *f);
/* Waits for the oldest fence's event (dropping the lock meanwhile) and ends it. */
void ferry__fences_wait_oldest(ferry *f);
/* Waits for every fence. */
void ferry__fences_wait_all(ferry *f);

/* jobs.c */
int ferry__loaders_start(ferry *f);
void ferry__loaders_stop(ferry *f);
/* Raises the loaders to the number a device the host cannot read wants (jobs.c). Lock held. */
void ferry__loaders_for_device(ferry *f);

#endif
