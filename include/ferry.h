/*
 * ferry.h — the one header a user of ferry includes.
 *
 * ferry keeps a neural network's weights where they are cheapest to hold (the model file on disk,
 * host RAM, accelerator memory) and moves them to where they are computed just in time, under
 * memory budgets, with LoRA adapters merged on the way.
 *
 * This header is the manual: every function is documented where it is declared.
 *
 * Conventions
 *  - Functions that can fail return int: 0 on success, a negative FERRY_E... code on failure. The
 *    handle they were called on keeps a message with the detail (file, tensor, offset, expected,
 *    found); read it with the handle's *_errmsg function. ferry_strerror(code) names a code.
 *  - Handles are opaque and come in create/destroy pairs; destroy(NULL) is a no-op.
 *  - Sizes and offsets are uint64_t; nothing ferry does is limited to 2 GiB.
 *  - Shapes are given in the file's own order: GGUF lists the innermost (fastest-varying) dimension
 *    first, safetensors lists the outermost first. ferry_tensor_info also gives the row view
 *    (n_rows x row_elems) that is the same for both.
 *  - Nothing ferry does ever writes to a model file it reads.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FERRY_API
#else
#define FERRY_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 3
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.3.0"
/* One number that grows with every release: major*10000 + minor*100 + patch. */
#define FERRY_VERSION_NUMBER \
    (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)

/* The version of the library actually linked, as "MAJOR.MINOR.PATCH". Static storage. */
FERRY_API const char *ferry_version(void);
/* FERRY_VERSION_NUMBER of the library actually linked. */
FERRY_API unsigned ferry_version_number(void);

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

enum {
    FERRY_OK = 0,
    FERRY_EINVAL = -1,       /* a bad argument from the caller */
    FERRY_ENOMEM = -2,       /* an allocation failed (host or device) */
    FERRY_EIO = -3,          /* a read, write, open or stat failed */
    FERRY_ENOENT = -4,       /* no such file, tensor, group, key or device */
    FERRY_EFORMAT = -5,      /* the file is not a model file ferry reads, or its structure is wrong */
    FERRY_ETRUNC = -6,       /* the file ends before a structure it declares */
    FERRY_EOVERFLOW = -7,    /* a size, count or product from the file overflows */
    FERRY_ERANGE = -8,       /* tensor data lies (partly) past the end of the file or data section */
    FERRY_EOVERLAP = -9,     /* two tensors' data overlap */
    FERRY_EALIGN = -10,      /* a bad alignment value, or an offset that does not honour it */
    FERRY_EDUP = -11,        /* a duplicate tensor name, metadata key or JSON key */
    FERRY_EDTYPE = -12,      /* an unknown, retired or unsupported data type */
    FERRY_ESHAPE = -13,      /* a shape that is invalid or disagrees with what was expected */
    FERRY_ELIMIT = -14,      /* a count, length, depth or dimension beyond ferry's limits */
    FERRY_EJSON = -15,       /* malformed JSON (syntax, UTF-8, number) */
    FERRY_EPATH = -16,       /* a shard path that leaves its index's folder */
    FERRY_ETYPE = -17,       /* a metadata value of another type than asked for */
    FERRY_EBUDGET = -18,     /* the request cannot fit in the budget even after evicting */
    FERRY_EBUSY = -19,       /* the object is in use (prepared tensors, queued work) */
    FERRY_EDEVICE = -20,     /* a device failed or is unavailable */
    FERRY_ECANCELED = -21,   /* the work was cancelled (close while in flight, progress callback) */
    FERRY_EUNSUPPORTED = -22,/* the operation is not supported in this configuration */
    FERRY_ELORA = -23,       /* an adapter does not fit its base tensors */
    FERRY_EMISMATCH = -24,   /* data differs from what was expected (reserved for verification) */
    FERRY_ECHANGED = -25,    /* the model file changed since it was opened */
};

/* A short static description of an error code ("truncated file"). Never NULL. */
FERRY_API const char *ferry_strerror(int code);

/* Parses a byte size: "4096", "512M" / "12MB" (powers of 1000), "1.5KiB" / "8GiB" (powers of 1024),
 * case-insensitive. Returns 0 or FERRY_EINVAL. */
FERRY_API int ferry_parse_size(const char *s, uint64_t *out);
/* Formats N bytes for people ("512 B", "1.50 GiB") into BUF; returns BUF. */
FERRY_API char *ferry_format_size(uint64_t n, char buf[32]);

/* ---------------------------------------------------------------------------------------------
 * Data types
 *
 * The values of GGUF's types are GGUF's own type ids, so a GGUF type id is a ferry_dtype. Types
 * only safetensors has are numbered from 64 up. Retired GGUF ids (4, 5, 31-33, 36-38) are not
 * types: a file using one is refused with FERRY_EDTYPE.
 * ------------------------------------------------------------------------------------------- */

typedef enum ferry_dtype {
    FERRY_DTYPE_F32 = 0,
    FERRY_DTYPE_F16 = 1,
    FERRY_DTYPE_Q4_0 = 2,
    FERRY_DTYPE_Q4_1 = 3,
    FERRY_DTYPE_Q5_0 = 6,
    FERRY_DTYPE_Q5_1 = 7,
    FERRY_DTYPE_Q8_0 = 8,
    FERRY_DTYPE_Q8_1 = 9,
    FERRY_DTYPE_Q2_K = 10,
    FERRY_DTYPE_Q3_K = 11,
    FERRY_DTYPE_Q4_K = 12,
    FERRY_DTYPE_Q5_K = 13,
    FERRY_DTYPE_Q6_K = 14,
    FERRY_DTYPE_Q8_K = 15,
    FERRY_DTYPE_IQ2_XXS = 16,
    FERRY_DTYPE_IQ2_XS = 17,
    FERRY_DTYPE_IQ3_XXS = 18,
    FERRY_DTYPE_IQ1_S = 19,
    FERRY_DTYPE_IQ4_NL = 20,
    FERRY_DTYPE_IQ3_S = 21,
    FERRY_DTYPE_IQ2_S = 22,
    FERRY_DTYPE_IQ4_XS = 23,
    FERRY_DTYPE_I8 = 24,
    FERRY_DTYPE_I16 = 25,
    FERRY_DTYPE_I32 = 26,
    FERRY_DTYPE_I64 = 27,
    FERRY_DTYPE_F64 = 28,
    FERRY_DTYPE_IQ1_M = 29,
    FERRY_DTYPE_BF16 = 30,
    FERRY_DTYPE_TQ1_0 = 34,
    FERRY_DTYPE_TQ2_0 = 35,
    FERRY_DTYPE_MXFP4 = 39,
    FERRY_DTYPE_GGUF_COUNT = 40, /* one past the highest GGUF id ferry knows */

    /* safetensors-only types */
    FERRY_DTYPE_BOOL = 64,
    FERRY_DTYPE_U8 = 65,
    FERRY_DTYPE_U16 = 66,
    FERRY_DTYPE_U32 = 67,
    FERRY_DTYPE_U64 = 68,
    FERRY_DTYPE_F8_E4M3 = 69,
    FERRY_DTYPE_F8_E5M2 = 70,
    FERRY_DTYPE_F8_E8M0 = 71,
    FERRY_DTYPE_F6_E2M3 = 72,   /* packed: 4 values in 3 bytes */
    FERRY_DTYPE_F6_E3M2 = 73,   /* packed: 4 values in 3 bytes */
    FERRY_DTYPE_F4 = 74,        /* float4_e2m1, packed two per byte */
    FERRY_DTYPE_C64 = 75,       /* complex64: two f32 */
    FERRY_DTYPE_COUNT = 76,

    FERRY_DTYPE_NONE = -1       /* "no type given": keep the file's type, or no expectation */
} ferry_dtype;

/* Lower-case name of a type ("f32", "q8_0", "bf16", "f8_e4m3"); "?" for a value that is no type. */
FERRY_API const char *ferry_dtype_name(ferry_dtype t);
/* The type with that name (case-insensitive; safetensors' upper-case names also accepted), or
 * FERRY_DTYPE_NONE. */
FERRY_API ferry_dtype ferry_dtype_from_name(const char *name);
/* Elements per block (1 for plain types, 32 or 256 for quantized ones); 0 for a value that is no
 * type. */
FERRY_API uint32_t ferry_dtype_block_elems(ferry_dtype t);
/* Bytes per block; 0 for a value that is no type. */
FERRY_API uint32_t ferry_dtype_block_bytes(ferry_dtype t);
/* Bytes of n elements of type t into *out. Fails with FERRY_ESHAPE when n is not a whole number of
 * blocks, FERRY_EOVERFLOW when the size does not fit in 64 bits, FERRY_EDTYPE for no type. */
FERRY_API int ferry_dtype_nbytes(ferry_dtype t, uint64_t n, uint64_t *out);
/* Whether ferry can convert between src and dst (dequantize, quantize, cast): f32, f16, bf16,
 * q8_0 and q4_0 in any direction, and every other type that ferry dequantizes to f32. */
FERRY_API int ferry_dtype_can_convert(ferry_dtype src, ferry_dtype dst);
/* Converts n elements (a whole number of blocks of both types) from src to dst. Values are
 * rounded to nearest-even; quantization follows GGUF's reference layout. Returns FERRY_EDTYPE for
 * a pair ferry cannot convert, FERRY_ESHAPE for a partial block. */
FERRY_API int ferry_dtype_convert(ferry_dtype src, const void *in, ferry_dtype dst, void *out,
                                  uint64_t n);

/* y[r] = sum_c W[r][c] * x[c] for ROWS rows of COLS elements of type T stored contiguously at W
 * (each row COLS elements, a whole number of blocks): the decode-shaped product of a weight with
 * a vector, dequantizing on the fly. FERRY_EDTYPE for a type ferry cannot read as numbers.
 * Thread-safe: threads may each take a block of rows. The kernels are picked at run time from what
 * the CPU has (portable, AVX2, AVX-512, AVX-512 with VBMI); the environment variable FERRY_ISA
 * ("generic", "avx2", "avx512"), read once, caps them. Sets differ only in float rounding (the
 * order of the sums); a row gives the same value whatever block of rows it is computed in. */
FERRY_API int ferry_matvec(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols,
                           const float *x, float *y);

/* The same product computed the way llama.cpp's CPU back end computes it, for engines that must
 * match it (and for its speed on quantized weights): the vector is first prepared for weights of
 * type T with ferry_matvec_vec_quantize — quantized to q8_0 blocks for q4_0 and q8_0 weights, to
 * q8_K blocks (f32 scale, 256 int8, 16 int16 sums) for q4_K, q5_K and q6_K, rounded to f16 or bf16
 * precision (kept as f32) for f16 and bf16 weights, copied for the others — and quantized
 * weights then meet it in integer dot products (exact within a block). Prepare once, then call
 * ferry_matvec_q on any number of row blocks. */
/* Bytes of the prepared vector of COLS elements for weights of type T; 0 when T cannot be read as
 * numbers or COLS is no whole number of its blocks. */
FERRY_API uint64_t ferry_matvec_vec_bytes(ferry_dtype t, uint64_t cols);
/* Prepares the COLS floats X for weights of type T into OUT (ferry_matvec_vec_bytes(t, cols)
 * bytes, any alignment). FERRY_EDTYPE, FERRY_ESHAPE (a partial block) or FERRY_EINVAL. */
FERRY_API int ferry_matvec_vec_quantize(ferry_dtype t, const float *x, uint64_t cols, void *out);
/* y[r] = W[r] . XQ for ROWS rows of COLS elements of type T at W, XQ from
 * ferry_matvec_vec_quantize(T, ..., COLS, ...). Errors as ferry_matvec. For q8_0, q4_0, q4_K,
 * q5_K and q6_K the float sum is that of llama.cpp's x86 kernels for AVX-512 VNNI / AMX-INT8
 * CPUs (and of its repacked q4_0 kernel), on every machine: per block (super-block) its exact
 * integer sum meets the f32 product of the weight's and the vector's scales in one fma into one
 * row accumulator, blocks in order; the min term of q4_K and q5_K is a second fma per
 * super-block, subtracting, into the same accumulator. */
FERRY_API int ferry_matvec_q(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols,
                             const void *xq, float *y);
/* ferry_matvec_q for N_VEC prepared vectors at once, for an engine's batch of positions: for
 * v < N_VEC, y_v[r] = W[r] . XQ_v with XQ_v at XQ + v * XQ_STRIDE bytes (each from
 * ferry_matvec_vec_quantize(T, ..., COLS, ...); XQ_STRIDE at least ferry_matvec_vec_bytes(T,
 * COLS)) and y_v at Y + v * Y_STRIDE floats (Y_STRIDE at least ROWS; the y_v must not overlap
 * each other or the inputs). Every y_v[r] has the bits that ferry_matvec_q gives for row r and
 * XQ_v, on every kernel set: the same per-block integer sums and the same fmas, blocks in order.
 * For q8_0 and q4_0 weights on a CPU with AVX-512 VNNI, each weight block is unpacked once for
 * up to sixteen vectors (the last one or two taken one at a time when N_VEC is one or two above a
 * multiple of four); with the AVX2 kernel set, once for up to eight vectors (N_VEC above 1);
 * other types and the portable kernels take the vectors one at a time. Errors as ferry_matvec_q,
 * and FERRY_EINVAL for a stride too small (N_VEC above 1); N_VEC 0 computes nothing.
 * Thread-safe as ferry_matvec_q: threads may each take a block of rows. */
FERRY_API int ferry_matvec_q_n(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols,
                               const void *xq, uint64_t n_vec, uint64_t xq_stride, float *y,
                               uint64_t y_stride);

/* ---------------------------------------------------------------------------------------------
 * Metadata values (GGUF key/values, safetensors __metadata__)
 * ------------------------------------------------------------------------------------------- */

typedef enum ferry_value_type {
    FERRY_VALUE_U8 = 0,
    FERRY_VALUE_I8 = 1,
    FERRY_VALUE_U16 = 2,
    FERRY_VALUE_I16 = 3,
    FERRY_VALUE_U32 = 4,
    FERRY_VALUE_I32 = 5,
    FERRY_VALUE_F32 = 6,
    FERRY_VALUE_BOOL = 7,
    FERRY_VALUE_STRING = 8,
    FERRY_VALUE_ARRAY = 9,
    FERRY_VALUE_U64 = 10,
    FERRY_VALUE_I64 = 11,
    FERRY_VALUE_F64 = 12,
} ferry_value_type;

/* A metadata value. The numbering of types is GGUF's. Read-only for the user; the memory belongs
 * to the catalog (or manager) it came from and stays valid until that is destroyed. */
typedef struct ferry_value {
    ferry_value_type type;
    union {
        uint64_t u;   /* U8, U16, U32, U64, and BOOL (0 or 1) */
        int64_t i;    /* I8, I16, I32, I64 */
        double f;     /* F32, F64 */
        struct {
            const char *ptr; /* NUL-terminated; may also contain NULs: use len */
            uint64_t len;
        } str;
        struct {
            ferry_value_type elem; /* type of every item */
            uint64_t n;
            const struct ferry_value *items;
        } arr;
    } v;
} ferry_value;

/* ---------------------------------------------------------------------------------------------
 * Tensor descriptions
 * ------------------------------------------------------------------------------------------- */

#define FERRY_MAX_DIMS 8

typedef enum ferry_format {
    FERRY_FORMAT_UNKNOWN = 0,
    FERRY_FORMAT_GGUF = 1,
    FERRY_FORMAT_SAFETENSORS = 2,
} ferry_format;

/* "gguf", "safetensors" or "unknown". */
FERRY_API const char *ferry_format_name(ferry_format f);

typedef struct ferry_tensor_info {
    const char *name;       /* full name, with the prefix it was opened under */
    const char *file;       /* path of the file holding its bytes */
    ferry_format format;    /* that file's format */
    ferry_dtype dtype;      /* type in the file */
    uint32_t ndim;          /* 0 .. FERRY_MAX_DIMS */
    int64_t shape[FERRY_MAX_DIMS]; /* in the file's own order (GGUF innermost first) */
    uint64_t n_elems;       /* product of the shape (1 for ndim 0) */
    uint64_t row_elems;     /* elements of the innermost dimension (1 for ndim 0) */
    uint64_t n_rows;        /* n_elems / row_elems */
    uint64_t offset;        /* absolute byte offset in its file */
    uint64_t nbytes;        /* bytes in the file */
} ferry_tensor_info;

/* ---------------------------------------------------------------------------------------------
 * Catalog: what a set of model files holds. Reading files and listing their contents with no
 * memory management at all (what `ferry inspect` does). The manager below builds one internally.
 * ------------------------------------------------------------------------------------------- */

typedef struct ferry_catalog ferry_catalog;

/* An empty catalog, or NULL when memory is exhausted. Free with ferry_catalog_destroy. */
FERRY_API ferry_catalog *ferry_catalog_create(void);
/* Frees the catalog and closes its files. NULL is a no-op. */
FERRY_API void ferry_catalog_destroy(ferry_catalog *c);
/* Opens a model and adds its tensors. PATH may be a GGUF file, a safetensors file, a sharded
 * safetensors index (*.index.json, its shards resolved in its folder), or the first file of a split
 * GGUF (NAME-00001-of-0000N.gguf, the others found beside it). The format is detected from the
 * content. Every name gets PREFIX (NULL or "" for none) in front. Every number in the file is
 * checked before use. On failure nothing is added, and the message names file, tensor and the
 * offending numbers. A tensor name that collides with one already present is FERRY_EDUP naming
 * both files.
 * Headers are read through the file's descriptor into memory of their own, freed before the add
 * returns (the file's first bytes, up to twice the header or 64 KiB, whichever is more), never
 * out of the mapping: a file truncated while it is added makes the add fail with FERRY_ECHANGED
 * naming the file and what changed (FERRY_EIO when a read came back short but the file looks as
 * it was at open), never with SIGBUS, guard or not. Names and metadata are copies. */
FERRY_API int ferry_catalog_add(ferry_catalog *c, const char *path, const char *prefix);
/* The message of the last failure on C ("" when none). Valid until the next call on C. */
FERRY_API const char *ferry_catalog_errmsg(const ferry_catalog *c);

/* Number of tensors. */
FERRY_API size_t ferry_catalog_count(const ferry_catalog *c);
/* Tensor I, in file order (files in the order they were added, tensors in the order of their
 * data in the file). FERRY_ENOENT when I is out of range. Strings stay valid until destroy. */
FERRY_API int ferry_catalog_tensor(const ferry_catalog *c, size_t i, ferry_tensor_info *out);
/* Index of the tensor named NAME (O(1) on average), or -1. */
FERRY_API int64_t ferry_catalog_find(const ferry_catalog *c, const char *name);
/* Sum of all tensors' bytes. */
FERRY_API uint64_t ferry_catalog_total_bytes(const ferry_catalog *c);

/* Number of files opened (shards count one each). */
FERRY_API size_t ferry_catalog_file_count(const ferry_catalog *c);
/* Path of file I, or NULL. */
FERRY_API const char *ferry_catalog_file_path(const ferry_catalog *c, size_t i);
/* Format of file I. */
FERRY_API ferry_format ferry_catalog_file_format(const ferry_catalog *c, size_t i);

/* Metadata: the key/values of all files, in file order; where two files share a key, the first
 * one added wins (the shards of one model repeat some keys). GGUF values keep their type;
 * safetensors' __metadata__ values are strings. */
FERRY_API size_t ferry_catalog_meta_count(const ferry_catalog *c);
/* Key and value of entry I; NULL when out of range. */
FERRY_API const char *ferry_catalog_meta_key(const ferry_catalog *c, size_t i);
FERRY_API const ferry_value *ferry_catalog_meta_value(const ferry_catalog *c, size_t i);
/* The value of KEY, or NULL. */
FERRY_API const ferry_value *ferry_catalog_meta_find(const ferry_catalog *c, const char *key);
/* Typed getters: FERRY_ENOENT when the key is absent, FERRY_ETYPE when its value is of another
 * kind (any integer type reads as u64/i64 when its value fits; f32 and f64 read as f64), and then
 * *out is left unchanged. */
FERRY_API int ferry_catalog_get_u64(const ferry_catalog *c, const char *key, uint64_t *out);
FERRY_API int ferry_catalog_get_i64(const ferry_catalog *c, const char *key, int64_t *out);
FERRY_API int ferry_catalog_get_f64(const ferry_catalog *c, const char *key, double *out);
FERRY_API int ferry_catalog_get_bool(const ferry_catalog *c, const char *key, int *out);
/* *out points at the catalog's NUL-terminated copy, valid until destroy. */
FERRY_API int ferry_catalog_get_str(const ferry_catalog *c, const char *key, const char **out);

/* ---------------------------------------------------------------------------------------------
 * Writers: a model file written atomically (a temporary file in the same folder, fsync, rename).
 * Declare metadata and tensors, then begin, stream each tensor's bytes in declaration order, and
 * finish. Until finish succeeds no file exists under the final name.
 * ------------------------------------------------------------------------------------------- */

typedef struct ferry_writer ferry_writer;

/* A writer for FORMAT (GGUF v3 or safetensors), or NULL when memory is exhausted. */
FERRY_API ferry_writer *ferry_writer_create(ferry_format format);
/* Frees the writer; an unfinished temporary file is removed. NULL is a no-op. */
FERRY_API void ferry_writer_destroy(ferry_writer *w);
/* The message of the last failure on W. */
FERRY_API const char *ferry_writer_errmsg(const ferry_writer *w);
/* Adds a metadata key (copied). GGUF keeps the type; safetensors accepts only strings
 * (FERRY_ETYPE otherwise). A repeated key is FERRY_EDUP. */
FERRY_API int ferry_writer_set_meta(ferry_writer *w, const char *key, const ferry_value *v);
/* Shortcut for a string value. */
FERRY_API int ferry_writer_set_meta_str(ferry_writer *w, const char *key, const char *value);
/* Declares a tensor (name copied; shape in the format's own order). Before begin only. */
FERRY_API int ferry_writer_add_tensor(ferry_writer *w, const char *name, ferry_dtype dtype,
                                      uint32_t ndim, const int64_t *shape);
/* Creates the temporary file beside PATH and writes the header. */
FERRY_API int ferry_writer_begin(ferry_writer *w, const char *path);
/* Appends N bytes of tensor data; a tensor's bytes may come in any number of calls, tensors in
 * declaration order. Writing more than was declared is FERRY_EINVAL. */
FERRY_API int ferry_writer_write(ferry_writer *w, const void *data, size_t n);
/* Checks every declared byte was written, flushes, fsyncs and renames onto PATH. */
FERRY_API int ferry_writer_finish(ferry_writer *w);

/* ---------------------------------------------------------------------------------------------
 * The manager
 * ------------------------------------------------------------------------------------------- */

typedef struct ferry ferry;
typedef struct ferry_tensor ferry_tensor;

/* Where a tensor's bytes live between uses. */
typedef enum ferry_home {
    FERRY_HOME_HOST = 0,   /* loaded once into host RAM (or zero-copy from the mapping), kept */
    FERRY_HOME_DISK = 1,   /* nothing kept: bytes come from the file at each use (cache allowing) */
    FERRY_HOME_DEVICE = 2, /* loaded once onto the compute device, kept */
} ferry_home;

typedef enum ferry_load {
    FERRY_LOAD_AUTO = 0,   /* zero-copy where MMAP would be and the tensor is mostly in the page
                              cache when bound; else a private copy, read with O_DIRECT where
                              the bytes are not cached */
    FERRY_LOAD_MMAP = 1,   /* read-only shared mapping; zero-copy where possible */
    FERRY_LOAD_READ = 2,   /* buffered pread in large chunks */
    FERRY_LOAD_DIRECT = 3, /* O_DIRECT into aligned buffers */
} ferry_load;

typedef enum ferry_lazy {
    FERRY_LAZY_AUTO = 0,   /* lazy when the tensor is at least lazy_threshold bytes */
    FERRY_LAZY_OFF = 1,
    FERRY_LAZY_ON = 2,
} ferry_lazy;

/* Most devices one tensor's rows can be split over. */
#define FERRY_MAX_SPLIT 8

/* Default lazy_threshold: 4 GiB. */
#define FERRY_LAZY_DEFAULT_THRESHOLD (UINT64_C(4) << 30)

/* A placement policy. Zero-initialised means: home host, compute on the cpu device (id 0), load
 * auto, lazy auto at 4 GiB, no lock, file's dtype. */
typedef struct ferry_policy {
    ferry_home home;
    int compute_device;         /* device id from ferry_add_device; 0 is the cpu */
    ferry_load load;
    ferry_lazy lazy;
    uint64_t lazy_threshold;    /* 0: FERRY_LAZY_DEFAULT_THRESHOLD */
    int lock;                   /* mlock host copies (never lazy ones) */
    int convert;                /* nonzero: the staged copy is converted to compute_dtype */
    ferry_dtype compute_dtype;  /* used only when convert is nonzero */
    /* Split placement: with n_split >= 2, each 2-D tensor's rows are divided over
     * split_devices[0..n_split) in proportion to split_weights (0: equal), each device a
     * contiguous block of whole rows (so quantized blocks are never cut); the tensor's parts are
     * read with ferry_tensor_get_part. Other tensors of the group go to split_devices[0].
     * compute_device is ignored when splitting. */
    int n_split;
    int split_devices[FERRY_MAX_SPLIT];
    float split_weights[FERRY_MAX_SPLIT];
    /* Nonzero: every tensor of the group gets a private copy the engine may write (an engine that
     * repacks weights in place, as llama.cpp's CPU repack does), never the file mapping, whatever
     * the load mode and whatever the page cache holds; it overrides lazy (no tensor of the group is
     * lazy). ferry_tensor_writable then returns 1 for each prepared tensor. Costs the memory and
     * the read that zero-copy saves. */
    int writable;
    /* Nonzero: the outermost dimension of the group's tensors counts experts (a mixture-of-experts
     * tensor [n_embd, n_ff, n_expert] in GGUF's order), which the engine brings in one at a time
     * with ferry_slice. ferry_plan then lists each unsplit tensor of 2 or more dims as one placement
     * per expert (its slices "NAME[E:E+1]"), and ferry_plan_check needs room for one expert staged,
     * not for the whole tensor. Placement is otherwise unchanged (0: whole tensors). */
    int experts;
} ferry_policy;

/* How a budget gives up cached slices (ferry_slice), units whose use depends on the data. */
typedef enum ferry_slice_evict {
    FERRY_SLICE_EVICT_DEFAULT = 0,
    /* The expert policy (FERRY_CACHE_FERRY of ferry_cache_sim_create): per layer a floor of the
     * slices one prepare used together kept against the other tensors' loads, the lowest
     * estimated value of the next use first. Slices stay out of the recorded access order, and
     * the budget is shared with the other tensors (see ferry_slice). */
    FERRY_SLICE_EVICT_EXPERT,
    /* As any tensor: slices enter the recorded access order, which evicts and prefetches
     * slices and tensors alike (row ranges of a large tensor streamed in a fixed order). */
    FERRY_SLICE_EVICT_CYCLIC,
} ferry_slice_evict;

/* Options at creation. Zero-initialised means defaults. */
typedef struct ferry_options {
    uint32_t io_threads;        /* I/O workers; 0: $FERRY_IO_THREADS, else 4 (2 on a single
                                   CPU: copies out of the page cache are CPU work). Loader
                                   threads: as many, at least 2; at least 4 once a device the
                                   host cannot read is added. Each loader has one tensor in
                                   flight, faulting in its block, then reading into it.
                                   ($FERRY_IO_BACKEND=threads|uring picks the I/O backend.) */
    uint64_t host_budget;       /* bytes of host RAM ferry may hold; 0: the default host
                                   budget (see ferry_set_budget); above the host's RAM or the
                                   memory cgroup's limit, ferry_create fails */
    int no_schedule;            /* nonzero: never record an access order nor prefetch by it,
                                   nor prefetch in file order before one is recorded */
    ferry_slice_evict slice_evict; /* how cached slices are evicted (ferry_slice);
                                   FERRY_SLICE_EVICT_DEFAULT: $FERRY_SLICE_EVICT ("expert" or
                                   "cyclic"), else FERRY_SLICE_EVICT_EXPERT */
    uint64_t io_request_bytes;  /* bytes of one read an I/O worker issues (a tensor's range is
                                   cut into reads of this size, read by the workers in parallel);
                                   0: $FERRY_IO_REQUEST (a size, "4MiB"), else 16 MiB. Clamped to
                                   64 KiB .. 1 GiB, rounded down to 4 KiB. ferry_get_io_settings
                                   gives the value in use. */
} ferry_options;

/* The I/O settings a manager runs with, as ferry_create resolved them from ferry_options and the
 * environment. */
typedef struct ferry_io_settings {
    uint32_t io_threads;       /* I/O workers: reads in flight at once (io_uring: each up to 8) */
    uint64_t request_bytes;    /* bytes of one read */
    const char *backend;       /* "threads" or "uring" (a static string) */
    uint64_t relay_bytes;      /* memory the relay readers hold now for relayed reads (see
                                  FERRY_IO_RELAY in the guide): 0 until the first relayed read,
                                  then 16 MiB (32 readers, a 512 KiB slot each), kept until
                                  ferry_destroy; not counted against the host budget */
} ferry_io_settings;

/* A manager with the cpu device as device 0, or NULL when memory is exhausted or OPT's host_budget
 * is above what the host can ever hold (ferry_set_budget on a manager made without it says why).
 * OPT may be NULL. Destroy with ferry_destroy. */
FERRY_API ferry *ferry_create(const ferry_options *opt);
/* Closes the manager: cancels and drains everything in flight, then frees all memory and closes
 * the files. Tensor handles become invalid. NULL is a no-op. */
FERRY_API void ferry_destroy(ferry *f);
/* The message of the calling thread's last failure on F ("" when none): each thread reads its
 * own, never another's. Owned by ferry; valid until the same thread's next failing call on F or
 * until F is destroyed. A call refused with FERRY_EINVAL for a NULL argument leaves it unchanged.
 * A manager created later, even at the same address, starts with none. */
FERRY_API const char *ferry_errmsg(const ferry *f);

/* F's I/O settings into *OUT: 0, or FERRY_EINVAL when F or OUT is NULL. */
FERRY_API int ferry_get_io_settings(const ferry *f, ferry_io_settings *out);

/* How load AUTO reads the bytes of a tensor the page cache does not hold. By default into a
 * private copy with O_DIRECT; but a manager's first ferry_load_group or ferry_prepare of such
 * tensors, 512 MiB of them or from a file of 512 MiB or more, measures on that file both filling
 * the page cache through the mapping (64 MiB, in up to 4 shares at once, then read a byte a page)
 * and that (32 MiB read with O_DIRECT into fresh memory), and keeps the faster for them and every
 * later AUTO tensor not yet loaded: the mapping when it measured at least 0.8 of the other's rate
 * (its probe's bytes serve the load, and it holds no private memory). Where fresh memory faults
 * in slowly (some VMs), the mapping is several times faster.
 * Where the host takes free 2 MiB blocks of the guest back (a VM with free page reporting, as
 * /sys/module/page_reporting says: `dear` below), a probe's few MiB come from pages freed a
 * moment ago, while a whole model meets memory the host backs again, for private copies when they
 * are faulted in and for the mapping's pages at the engine's first touch. Private copies there lie
 * in small pages and are read through the I/O pool's relay readers. The private probe comes
 * first: 32 MiB read that way into fresh small pages, then up to 128 MiB more faulted in, rated
 * by its slowest 16 MiB. Where that fault rate is at least 1.5 times the read's, private copies
 * win and the mapping is not probed (map_gbps 0); else it is, and private copies win when the
 * fault rate is at least 1.5 times the mapping's and the slower of the two rates at least 0.8 of
 * it.
 * The environment variable FERRY_AUTO_COLD=map or =private decides instead of measuring; =probe
 * measures at any size. */
typedef struct ferry_cold_load {
    int decided;         /* 0: not yet (default: private copies) */
    int map;             /* 1: through the mapping; 0: private copies */
    int forced;          /* decided by FERRY_AUTO_COLD, not measured */
    double map_gbps;     /* measured (0 when not): populating uncached bytes of the mapping and
                            touching each page once */
    double private_gbps; /* measured: the slower of faulting in fresh memory and reading into it
                            with O_DIRECT */
    double fault_gbps;   /* measured: faulting in fresh memory, the private probe's own rate */
    int dear;            /* the host takes free 2 MiB blocks back: the rule above applied */
    double read_gbps;    /* measured where dear: the private probe's relayed O_DIRECT read */
} ferry_cold_load;

/* F's decision into *OUT: 0, or FERRY_EINVAL when F or OUT is NULL. */
FERRY_API int ferry_get_cold_load(ferry *f, ferry_cold_load *out);

/* Adds a device by spec: "cpu", "sim:8GiB", "sim:8GiB@25GB/s" (options after ',': "fail_alloc=N",
 * "fail_copy=N", "max_alloc=SIZE"), "cuda:0". *ID (may be NULL) receives its id.
 * "fault:SPEC,fail_alloc=N,fail_copy=M" wraps the device of SPEC and fails its N-th allocation
 * and its M-th copy ("N/every": every N-th), for testing error paths on any device. On failure
 * nothing is added and the device opened for it is closed. */
FERRY_API int ferry_add_device(ferry *f, const char *spec, int *id);
/* Replaces device 0, the host, with the device opened from SPEC, which must be host-accessible:
 * "cpu", or "fault:cpu,fail_alloc=N" to fail the host's N-th allocation (tests of an engine's
 * error paths). Only on a fresh manager: before any file is opened, any other device added or
 * anything held on the host (FERRY_EBUSY otherwise, the host unchanged). FERRY_EINVAL when SPEC
 * is malformed or names a device the CPU cannot read. The host's budget stays. */
FERRY_API int ferry_set_host_device(ferry *f, const char *spec);
/* Number of devices, including the cpu. */
FERRY_API int ferry_device_count(const ferry *f);
typedef struct ferry_device_info {
    const char *name;        /* the spec it was opened with ("cpu", "sim:8GiB@25GB/s", "cuda:0") */
    const char *kind;        /* "cpu", "sim", "cuda" */
    uint64_t total_bytes;    /* memory the device has */
    uint64_t free_bytes;     /* memory it reports free now */
    uint64_t budget;         /* ferry's budget on it (0: no limit, only where the device's
                                memory cannot be probed) */
    uint64_t used_bytes;     /* what ferry holds there now, ferry_reserve's bytes included */
    int host_accessible;     /* the CPU reads its memory directly */
} ferry_device_info;

/* Describes device ID (0 is the cpu). Strings valid until ferry_destroy. */
FERRY_API int ferry_get_device_info(const ferry *f, int id, ferry_device_info *out);
/* Sets device ID's budget in bytes (the cpu's budget is the host budget). 0: the default (what
 * the device reports free, minus a margin). A smaller budget takes effect before the call
 * returns for everything not in use: it waits for prefetches in flight, then evicts cached
 * copies and pooled buffers down to it; prepared tensors stay.
 *
 * The default host budget, which a manager starts with (ferry_options.host_budget 0) and 0 here
 * restores: what the host can give when it is computed, the smaller of MemAvailable and the
 * memory cgroup's room (its limit minus its usage, with reclaimable file pages counted as room:
 * v2 memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes, the tightest
 * cgroup on the way from the process's own to the root), so what the process already holds is
 * left out, plus what ferry itself holds on the host, minus a margin of an eighth of that,
 * at least 32 MiB and at most 1 GiB (half of it when that leaves less). The margin is for what
 * lives outside the budget: I/O buffers, threads, the engine's allocations it does not reserve.
 * It is computed at ferry_create and at each ferry_set_budget(f, 0, 0), not followed afterwards.
 * Under it freed host buffers go back to the system; a budget given pools them for reuse.
 * ($FERRY_CGROUP_ROOT, for tests, stands for /sys/fs/cgroup, and the file proc_self_cgroup in it
 * for /proc/self/cgroup.)
 * On devices other than the host the default is what the device reports free plus what ferry
 * holds there, minus 256 MiB.
 *
 * A budget above what the device can ever hold (its total memory; on the host, the RAM or the
 * memory cgroup's limit, the smaller) is refused with FERRY_EBUDGET, the message naming the
 * budget and that capacity; the budget stays as it was.
 *
 * Faulting in ahead: where fresh huge pages are dear (docs/guide.md, "Budgets, eviction and
 * prefetch"), a host budget given here or at ferry_create, once tensors of home disk are known
 * (ferry_group_add; ferry_ignore and ferry_optional look again) and before anything is held on
 * the host, starts a thread of the manager's that faults in, within the budget, the buffers the
 * first pass will stream through (those of the first copies it will stream, each of its copy's
 * size, up to twice the file's largest layer and a sixteenth of the budget), and then, in small
 * pages, one reserve for the copies the budget will keep, while the engine sets itself up. The
 * first reservation on the host (a prepare, a prefetch, ferry_reserve), a new budget and
 * ferry_destroy stop it within a huge page: the buffers it made are pooled for the streamed
 * copies, and the copies predicted kept are cut from the front of the reserve, whose rest is
 * given back when the budget needs room for anything else (and by a new budget);
 * ferry_stats.faulted_ahead_bytes says how much was made ready. Once per manager. */
FERRY_API int ferry_set_budget(ferry *f, int device, uint64_t bytes);
/* Reserves BYTES of DEVICE's budget for the engine's own memory (KV cache, activations, compute
 * buffers), replacing the manager's previous reservation on that device (0 gives it back).
 * Cached copies are evicted to make room; FERRY_EBUDGET (naming the budget, what is in use and
 * the request) when it cannot fit even then. */
FERRY_API int ferry_reserve(ferry *f, int device, uint64_t bytes);
/* ferry_reserve in detail: ferry allocates nothing; the bytes count as used from then on (in
 * ferry_get_device_info's used_bytes and ferry_get_stats' resident_bytes) and eviction and
 * prefetch treat them as held. It waits for prefetches in flight when only their landing can make
 * the room. A request above the budget itself fails at once. On failure the previous reservation
 * stays. FERRY_ENOENT for an unknown device. Thread-safe. */

/* Opens a model (as ferry_catalog_add) and adds its tensors under PREFIX; all or nothing. The
 * files are opened and their headers read without the manager's lock, so other threads keep
 * preparing meanwhile and several threads may open different files at once; the new names are
 * checked against what is open when the headers have been read. Of two opens whose names clash,
 * the first to finish reading wins and the other fails with FERRY_EDUP, naming both files, having
 * added nothing. FERRY_EINVAL for an empty PATH; FERRY_ECANCELED once ferry_destroy has begun;
 * FERRY_ENOMEM, for every later open too, after an open that ran out of memory half-way (the
 * manager stays usable for what it has, a new one is needed for more files). */
FERRY_API int ferry_open(ferry *f, const char *path, const char *prefix);
/* The manager's catalog, for listing; valid until ferry_destroy. It grows at each ferry_open and
 * is read without the manager's lock: list it while no other thread opens a file. */
FERRY_API const ferry_catalog *ferry_catalog_of(const ferry *f);

/* Defines or extends group NAME: tensors whose names match the glob PATTERN ('*', '?', '[...]')
 * and no earlier pattern belong to it and follow POLICY (copied; NULL: the defaults; ignored when
 * the group already exists). Rules are matched in the order they were added, first match wins;
 * tensors matched by none belong to group "default". FERRY_EBUSY when a tensor that would change
 * group has already been loaded or prepared. Under a host budget given, may start the faulting
 * in ahead that ferry_set_budget describes. */
FERRY_API int ferry_group_add(ferry *f, const char *name, const char *pattern,
                              const ferry_policy *policy);
/* Tensors whose names match PATTERN are ignored: not loaded, not found, not required. */
FERRY_API int ferry_ignore(ferry *f, const char *pattern);
/* Tensors whose names match PATTERN are optional: missing ones are not an error in validate. */
FERRY_API int ferry_optional(ferry *f, const char *pattern);
/* Removes group NAME: its tensors' memory is freed and their handles become invalid.
 * FERRY_EBUSY while any of them is prepared. */
FERRY_API int ferry_group_remove(ferry *f, const char *name);

/* The tensor named NAME, or NULL when absent or ignored. Finding is no use: whether its placement
 * works out (a conversion ferry cannot do, a required adapter it cannot merge) is checked by
 * ferry_validate and ferry_prepare. Valid until ferry_destroy or until its group is removed. */
FERRY_API ferry_tensor *ferry_find(ferry *f, const char *name);
/* Description of T (strings valid as long as T). */
FERRY_API int ferry_tensor_get_info(const ferry_tensor *t, ferry_tensor_info *out);

/* A slice: *OUT receives a handle for the rows [FIRST, FIRST + COUNT) of T's outermost dimension
 * (its last dimension in GGUF's order, ne[ndim-1]; its first in safetensors'): one expert of a
 * mixture-of-experts tensor [n_embd, n_ff, n_expert], a block of an embedding table. The slice is
 * a residency unit like any tensor: ferry_prepare, ferry_release, ferry_prefetch,
 * ferry_tensor_data, ferry_tensor_read and the rest take it, and it has its own copies, its own
 * place in the budgets and eviction, and counts in ferry_get_stats as any tensor.
 * It reads exactly its own bytes from the file (O_DIRECT with aligned edges, or zero-copy from
 * the mapping where the policy allows it). Its placement (home, load mode, compute device, lazy,
 * dtype conversion) is its tensor's group policy, laziness decided on the whole tensor's size;
 * the slice of a split tensor is one unit on the split's first device. A slice and its tensor
 * are independent: both may be prepared at the same time, each with its own copy (under home
 * host each keeps its own home copy, unless zero-copy).
 *
 * Eviction: every slice (whatever its group's `experts`) is governed by the expert policy
 * (ferry_options.slice_evict), everything else by the recorded access order. A slice's layer,
 * which the policy keeps a floor for, is N of "blk.N." in its tensor's name (slices of tensors
 * without one share a layer of their own). Slices never enter the recorded order: they are
 * prefetched only when ferry_prefetch names them. One budget serves both kinds: each keeps a
 * floor the other's loads cannot evict -- the other tensors the bytes of the recorded pass
 * (at least the largest set of them prepared at once), the slices their floor per layer -- and
 * a kind holding more than its share gives room back first.
 *
 * Its info (ferry_tensor_get_info): T's, with the outermost dimension COUNT, offset and nbytes
 * those of its bytes in the file, and the name "NAME[FIRST:FIRST+COUNT]". Owned by F, valid until
 * ferry_destroy or until T's group is removed; the same range of the same tensor always gives the
 * same handle (a slice of a slice is the slice of T it covers). Thread-safe.
 *
 * FERRY_EINVAL: COUNT 0 or the range outside the dimension; T a scalar (a 1-D tensor can be
 * sliced when its dtype has no blocks: a range of elements); an outermost row that is not whole
 * blocks of a quantized dtype (every GGUF tensor of 2 or more dims is whole blocks per row); T a
 * part of a split tensor (ferry_tensor_get_part). Errors of T's placement as ferry_prepare's
 * (ignored, removed group, unmet expectation). LoRA: a slice takes no merged adapter; preparing
 * (or making) a slice whose tensor has adapters merged fails with FERRY_EUNSUPPORTED (the lora
 * mode FERRY_LORA_RUNTIME, where the engine applies the factors, works on slices). */
FERRY_API int ferry_slice(ferry *f, ferry_tensor *t, uint64_t first, uint64_t count,
                          ferry_tensor **out);

/* States what the engine expects of tensor NAME: its dtype (FERRY_DTYPE_NONE: any) and shape
 * (NULL/0 dims: any), in the file's own order. Checked by ferry_validate and at prepare. */
FERRY_API int ferry_expect(ferry *f, const char *name, ferry_dtype dtype, uint32_t ndim,
                           const int64_t *shape);
/* Checks every expectation and reports every problem at once: the message holds one line per
 * problem (file, tensor, expected, found). Returns the code of the first problem, 0 when none. */
FERRY_API int ferry_validate(ferry *f);

/* Makes every tensor of TS valid on its compute device and holds it there: returns when all data
 * pointers are valid; each stays valid and unchanged until the matching ferry_release. Reference
 * counted: a tensor prepared twice must be released twice. On failure no tensor of TS is held.
 * FERRY_ECHANGED, naming the tensor, the file and what changed, when a file of TS is no longer
 * what was opened (see ferry_check_files). Thread-safe. Prepares are recorded (the schedule);
 * while none is complete, each prepare also prefetches what follows TS in file order, as long as
 * the prepares follow the file order (docs/guide.md, "The first pass: file order"). */
FERRY_API int ferry_prepare(ferry *f, ferry_tensor *const *ts, size_t n);
/* Drops one reference of each tensor of TS. Home copies (host, device) stay; any other copy (a
 * staged copy on an accelerator, a home-disk copy on the host, a copy with LoRA merged) stays
 * cached until its device's budget needs the room — the default budgets included (a copy of an
 * older LoRA epoch goes at its last release). */
FERRY_API int ferry_release(ferry *f, ferry_tensor *const *ts, size_t n);
/* Drops every reference of every tensor, after waiting for prefetches in flight (and for the
 * events of ferry_release_after); what no budget allows to keep is freed before it returns. */
FERRY_API int ferry_release_all(ferry *f);
/* Asynchronous hint: starts bringing TS towards their compute devices as far as the budget allows.
 * Never blocks on I/O. */
FERRY_API int ferry_prefetch(ferry *f, ferry_tensor *const *ts, size_t n);
/* Asynchronous guess: as ferry_prefetch, for slices (ferry_slice) the engine may use soon but may
 * not, such as the experts a router predicts for a later layer; it never costs the engine a unit
 * it would have kept. A slice of TS that is not in place is loaded only into room its budget has
 * free (pooled buffers included) or over cached slices that the expert policy would give up before
 * it (ranked to go first were it resident: never one of its layer's last token's choice, never
 * one the policy values more); never over a tensor that is no slice, a slice in use, or a slice a
 * guess keeps. Every slice of TS (cached, loading, or loaded by this call) is kept: other loads
 * evict it only when nothing else can go, until the next prepare of a slice of its layer (then
 * it was used or the guess was wrong). Where no room is found the slice is not loaded (no error);
 * a later prepare loads it. A guess never loads a home copy (home host not yet loaded, home
 * device): only copies that come and go. Under FERRY_SLICE_EVICT_CYCLIC, and for tensors that are no slices,
 * only free room is used and nothing is kept. ferry_get_stats counts the bytes guesses loaded and
 * those dropped unused. Never blocks on I/O. Returns 0, or FERRY_EINVAL (F NULL, or TS NULL with
 * N > 0); a tensor that cannot be used is passed over. Thread-safe. */
FERRY_API int ferry_prefetch_guess(ferry *f, ferry_tensor *const *ts, size_t n);
/* The data pointer of a prepared tensor on its compute device (a device address for accelerators),
 * NULL when T is not prepared or is split over several devices (see ferry_tensor_get_part).
 * A lazy tensor is always host memory behind the file mapping, whatever its compute device (as
 * llama.cpp's lazy tensors), and is never converted.
 *
 * A file that changes while it is open: a zero-copy or lazy pointer (load mmap, or auto on cached
 * bytes; home host, untransformed, on the cpu) is the file's mapping itself, so "unchanged until
 * the matching ferry_release" holds only while nobody else writes the file. Overwritten in place,
 * the bytes under the pointer change as the writer writes; truncated, reading a page past the new
 * end raises SIGBUS in the engine's thread, which kills the process unless the engine handles it
 * (ferry_guard_sigbus turns such reads into zeros). Either way the change is caught at the next
 * ferry_prepare of a tensor of that file, or by ferry_check_files, with FERRY_ECHANGED. A policy
 * with load FERRY_LOAD_READ or FERRY_LOAD_DIRECT gives private copies: their bytes never change
 * under the engine and they never fault; the file's change is still reported at the next
 * prepare. ferry's own copies, and its reading of the headers at open, never read the mapping
 * and never die of SIGBUS.
 *
 * Writing: the pointer is typed void * for the engine's convenience, but memory ferry serves from
 * the file mapping (zero-copy and lazy tensors) is mapped PROT_READ: any write faults (SIGSEGV),
 * whether or not its pages are in the page cache. Write only where ferry_tensor_writable says 1. */
FERRY_API void *ferry_tensor_data(const ferry_tensor *t);
/* 1 when the memory at ferry_tensor_data(T) may be written by the engine: a private copy that no
 * other tensor and no file shares (host memory ferry allocated, or a staged device copy); 0 when T
 * is not prepared, is lazy, or its policy lets it be served from the mapping. The answer depends on
 * the policy and the adapter set only, never on the page cache: under FERRY_LOAD_AUTO a tensor that
 * could be zero-copy reports 0 even when an uncached file gave it a private copy. A policy with
 * `writable` set makes it 1 for every tensor of its group. Writes last as long as the copy: a home
 * copy (home host or device) keeps them until ferry_destroy or its group's removal, unless a LoRA
 * epoch re-stages it; a cached copy (home disk, or a staged copy on an accelerator) may be dropped
 * after ferry_release and re-read from the file at the next prepare. For a split tensor: 1 when
 * every part is writable. */
FERRY_API int ferry_tensor_writable(const ferry_tensor *t);
/* Bytes at ferry_tensor_data (differs from the file's size when converted). */
FERRY_API uint64_t ferry_tensor_nbytes(const ferry_tensor *t);
/* dtype at ferry_tensor_data. */
FERRY_API ferry_dtype ferry_tensor_dtype(const ferry_tensor *t);

/* One device's block of a tensor: rows [row0, row0 + n_rows) of the row view, at DATA on DEVICE. */
typedef struct ferry_tensor_part {
    int device;
    uint64_t row0, n_rows;
    void *data;          /* NULL when not prepared */
    uint64_t nbytes;
} ferry_tensor_part;

/* Number of parts of T: 1 unless its group splits it over several devices. */
FERRY_API int ferry_tensor_part_count(const ferry_tensor *t);
/* Part I of T (0-based); for an unsplit tensor part 0 is the whole tensor. */
FERRY_API int ferry_tensor_get_part(const ferry_tensor *t, int i, ferry_tensor_part *out);

/* Copies N bytes at byte OFF of prepared tensor T's data (on whatever device it is) into host
 * memory DST: verification and debugging. FERRY_EINVAL when T is not prepared or the range is
 * outside its data. */
FERRY_API int ferry_tensor_read(ferry *f, ferry_tensor *t, uint64_t off, uint64_t n, void *dst);

/* Reads the rows ROWS[0..N) of a 2-D (or higher, rows = all but the innermost dimension) tensor
 * into DST (N * row bytes), with explicit reads that coalesce neighbouring rows. Meant for lazy
 * tensors (embedding tables); works for any tensor. */
FERRY_API int ferry_read_rows(ferry *f, ferry_tensor *t, const uint64_t *rows, size_t n, void *dst);

/* Copies N bytes at byte OFF of tensor T as stored in its file (its file dtype, no conversion, no
 * LoRA) into DST, read through the descriptor ferry opened: the bytes of the file ferry uses even
 * after the path was renamed over or removed. T need not be prepared. FERRY_EINVAL when the range
 * is outside the tensor, FERRY_ECHANGED when the file's own size or modification time changed
 * since it was opened (a file renamed over its path is no reason: the descriptor still reads the
 * opened file), FERRY_EIO when the read fails (the message names the file and the offset).
 * Thread-safe. */
FERRY_API int ferry_tensor_read_file(ferry *f, const ferry_tensor *t, uint64_t off, uint64_t n,
                                     void *dst);

/* Checks every file F has open against what was opened: FERRY_ECHANGED, with a message naming the
 * first changed file and what changed (size a -> b, modification time, the path now naming
 * another file, pages of its mapping found gone by the SIGBUS guard), else 0. ferry_prepare does
 * the same for the files of the tensors it prepares (one fstat per file per call; the path is
 * looked up at most every 100 ms per file, so a file renamed over is noticed within that); an
 * engine that computed on zero-copy pointers calls this after the compute to know its inputs
 * held. The check compares what the file is now with what was opened (a file made again exactly
 * what was opened passes), except that pages the guard found gone fail it for good. */
FERRY_API int ferry_check_files(ferry *f);

/* The opt-in SIGBUS guard, for engines that compute on zero-copy or lazy pointers (see
 * ferry_tensor_data). ON = 1 installs a process-wide SIGBUS handler (sigaction, SA_SIGINFO): a
 * fault whose address lies in one of ferry's file mappings (of any manager) maps zero pages over
 * the lost range (from the faulting page to the end of the mapping when the file now ends before
 * it, else that page), marks the file changed (its next check fails with FERRY_ECHANGED) and
 * returns, so the read sees zeros; every other SIGBUS goes to the handler installed before (its
 * SA_SIGINFO or plain function, SIG_IGN for a signal sent by kill, else the default action). ON = 0
 * puts the previous handler back (FERRY_EBUSY, leaving things as they are, when another handler
 * has replaced ferry's meanwhile). Returns 0, or FERRY_EIO when sigaction fails. Idempotent; call
 * it from one thread at start-up, before other code changes SIGBUS. At most 1024 mappings are
 * guarded at a time; faults in others chain. Off by default: a library does not take a signal
 * without being asked. */
FERRY_API int ferry_guard_sigbus(int on);

/* Eagerly loads every tensor of group NAME (NULL: all groups) to its home, and returns when all
 * are there. Private host copies of neighbouring tensors are read as one range of the file into
 * one mapping (huge pages, faulted in ahead of the reads by a thread of the call's own), so a
 * load runs at the disk's speed. Fails on the first error (FERRY_EIO naming the file, tensor and
 * range, FERRY_ECHANGED when the read failed because that file changed since it was opened;
 * FERRY_EBUDGET); what did load stays loaded and the manager stays usable. */
FERRY_API int ferry_load_group(ferry *f, const char *group);

/* Progress of a long load: DONE of TOTAL bytes that the call has to bring (bytes already in place
 * when it began are not counted). Return 0 to go on, nonzero to cancel — the opposite of
 * llama.cpp's progress_callback, whose false stops. */
typedef int (*ferry_progress_fn)(void *user, uint64_t done, uint64_t total);
/* Sets F's progress callback (NULL: none) and its USER pointer. ferry_load_group and every
 * ferry_prepare (or settling of a ferry_prepare_async) that has bytes to load call it on their
 * own thread, without any lock of F held (it may call ferry functions, on other tensors): first
 * with DONE 0, then as tensors (or ranges of a group load) arrive, last with DONE == TOTAL when
 * the call succeeds. Several threads may call it at once. When it returns nonzero the call stops
 * queuing work, cancels the reads and loads of its set not yet started, waits for those already
 * running, and returns FERRY_ECANCELED: tensors that arrived whole stay valid (a group load's
 * range of neighbouring tensors, read as one, only when the whole range arrived), nothing partly
 * loaded is ever marked valid, a cancelled prepare holds nothing, and the manager stays usable (a
 * later load of the same set brings what is missing). Reads already running finish first: a
 * group load stops within the 16 MiB chunks in flight (one per I/O worker, up to 8 per worker
 * with io_uring), other loads within the tensors being loaded. */
FERRY_API int ferry_set_progress(ferry *f, ferry_progress_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Stream-ordered use, for engines whose devices run work asynchronously (CUDA streams)
 *
 * ferry_prepare blocks the calling thread until the bytes are in place, and ferry_release lets
 * ferry reuse the memory at once: right for the cpu, wrong for a GPU engine whose kernels queued
 * before the release may still be reading. The forms below hand over through events instead:
 *   ferry_prepare_async(f, ts, n, &ready);     queues the loads, never waits for them
 *   ferry_event_wait(ready, stream);           the engine's stream waits (the host only while a
 *                                              load is still running: see ferry_event_wait)
 *   ... launch kernels on stream reading ferry_tensor_data(ts[i]) ...
 *   ferry_event_record(done, stream);          after the last kernel that reads them
 *   ferry_release_after(f, ts, n, done);       ferry reuses the memory only once DONE completes
 * A STREAM is the device's own queue handle (a cudaStream_t for cuda:N); on the cpu every event is
 * complete at once, and on the sim device events order its copy queue and its compute queue.
 * Events of a device whose table has no event operations are complete once recorded.
 * Every event must be destroyed before ferry_destroy of its manager, which waits for every event
 * a release is waiting on before it frees memory.
 * ------------------------------------------------------------------------------------------- */

typedef struct ferry_event ferry_event;

/* A new event of device DEVICE (a device id of F), complete until recorded. *OUT owned by the
 * caller: ferry_event_destroy. FERRY_ENOENT for no such device; the device's error otherwise. */
FERRY_API int ferry_event_create(ferry *f, int device, ferry_event **out);
/* Records EV after all work queued on STREAM so far (NULL: ferry's copy queue of the device); it
 * completes when that work has. FERRY_EINVAL for an event of ferry_prepare_async (already set). */
FERRY_API int ferry_event_record(ferry_event *ev, void *stream);
/* Makes STREAM's later work wait for EV without blocking the calling thread (NULL: the calling
 * thread waits, as ferry_event_synchronize). For an event of ferry_prepare_async whose loads still
 * run on ferry's threads, the calling thread first waits for them (a stream cannot wait for a
 * read from a file) and then hands the stream the wait for the copies to the device. Returns 0,
 * or the error of a failed prepare (its tensors are then not held: no release is due), or the
 * device's error. */
FERRY_API int ferry_event_wait(ferry_event *ev, void *stream);
/* Blocks until EV completes; returns as ferry_event_wait. */
FERRY_API int ferry_event_synchronize(ferry_event *ev);
/* 1 when EV has completed (for a prepare event: every load done and its tensors' data valid), 0
 * while pending, a negative FERRY_E code when what it marks failed (a failed prepare's set is then
 * released). Never waits for a load in flight; once none is, a prepare event is settled in the
 * call (loads the budget had no room for are queued then, and waited for). */
FERRY_API int ferry_event_query(ferry_event *ev);
/* Frees EV (ferry keeps what it needs of an event a release waits on). A prepare event still
 * pending is waited for first. NULL is a no-op. */
FERRY_API void ferry_event_destroy(ferry_event *ev);

/* Stream-ordered prepare: takes the references ferry_prepare takes and queues every load of TS,
 * but returns without waiting for any. *READY receives a new event (destroy it with
 * ferry_event_destroy) that completes when every data pointer of TS is valid and its bytes are on
 * its compute device; before that, ferry_tensor_data may return NULL. The engine waits for it with
 * ferry_event_wait (its stream) or ferry_event_synchronize (its thread). When a load fails, the
 * error comes from that wait, the set is no longer held (as a failed ferry_prepare) and no
 * release is due; on success release TS as after ferry_prepare (ferry_release or
 * ferry_release_after). The loads respect the budgets as a prepare's do. Thread-safe. */
FERRY_API int ferry_prepare_async(ferry *f, ferry_tensor *const *ts, size_t n,
                                  ferry_event **ready);
/* Stream-ordered release: as ferry_release, but the references are dropped only once DONE (an
 * event of F recorded by the engine after its last work that reads TS) completes; until then ferry
 * does not evict, free, reuse or overwrite the memory of TS, and a load that needs the room waits
 * for the event. The caller may destroy DONE at once. DONE NULL: ferry_release. The reference
 * counts as released at once: a further ferry_release of a tensor prepared once is FERRY_EINVAL. */
FERRY_API int ferry_release_after(ferry *f, ferry_tensor *const *ts, size_t n, ferry_event *done);

/* ---------------------------------------------------------------------------------------------
 * LoRA adapters
 *
 * An adapter file (safetensors or GGUF) holds low-rank factors for some base weights, in one of
 * the common naming schemes: PEFT (`...lora_A.weight` / `...lora_B.weight`, alpha from the
 * metadata key "lora_alpha" or "alpha" when present), kohya (`lora_unet_...` / `lora_te_...` with
 * `.lora_down.weight`, `.lora_up.weight`, `.alpha`), GGUF LoRA (`....lora_a` / `....lora_b`,
 * `adapter.lora.alpha`). Adapter names are mapped to base tensor names (HF llama names to GGUF
 * names, diffusers unet names, kohya's underscored names); factors that match no base tensor are
 * reported by ferry_lora_get_info, never dropped silently. Adapters that are not plain low-rank
 * terms are refused with FERRY_ELORA naming the tensor: LoCon mid factors, DoRA, LoHa/LoKr,
 * embedding LoRA, and PEFT `modules_to_save` weights (whole replacements of a base weight).
 *
 * For a base weight W (rows = its outermost dimension, columns = everything else, so conv kernels
 * are reshaped to matrices) and factors A (rank x columns) and B (rows x rank), the adapter adds
 *     scale * (B . A),   scale = multiplier * alpha / rank.
 * When an adapter gives no alpha, alpha = rank (scale = multiplier), as PEFT does without a config.
 *
 * Merge mode (the default): the staged copy of each affected weight gets W + sum of the adapters'
 * terms, computed in f32 and stored in the staged dtype (f32/f16/bf16 rounded to nearest; q8_0 and
 * q4_0 dequantized, added, requantized). B . A is OpenBLAS's cblas_sgemm when ferry was built with
 * FERRY_BLAS (the default) and libopenblas.so.0 is present, loaded with dlopen by the first merge
 * (a process that never merges never starts OpenBLAS's threads), else a builtin blocked loop; the
 * environment variable FERRY_BLAS=0, read at that first merge, forces the loop. The home copy and the file are never modified; affected
 * weights therefore stop being zero-copy and get a staged copy. Every change of the adapter set or
 * of a multiplier starts a new epoch: staged copies of the old epoch are dropped (at release, if in
 * use) and re-staged from the pristine home copy at the next prepare — never unmerged by
 * subtraction.
 * Runtime mode: weights are staged unmerged and the engine reads the factors with
 * ferry_lora_factors and applies them itself.
 * Factors are read once per adapter, converted to f32 and cached (counted against the host budget).
 * ------------------------------------------------------------------------------------------- */

typedef enum ferry_lora_mode {
    FERRY_LORA_MERGE = 0,
    FERRY_LORA_RUNTIME = 1,
} ferry_lora_mode;

typedef struct ferry_lora_options {
    const char *base_prefix;   /* only base tensors whose names start with this (NULL: all) */
    const char *target_prefix; /* prepended to mapped names: aims the adapter at a copy of the
                                  weights opened under that prefix (NULL: none) */
    int required;              /* nonzero: prepare fails when a weight it covers cannot take it;
                                  zero: such weights are staged without it and counted in
                                  ferry_lora_info.skipped */
} ferry_lora_options;

/* Opens the adapter at PATH, maps its factors to the base tensors opened so far, and adds it with
 * MULTIPLIER (OPT may be NULL: all tensors, no prefix, optional). Starts a new epoch. *ID (may be
 * NULL) receives its id. Errors: FERRY_ELORA for factors whose shapes do not fit their base tensor
 * (naming both), rank 0, or a lone A or B; the usual file errors. */
FERRY_API int ferry_lora_add(ferry *f, const char *path, float multiplier,
                             const ferry_lora_options *opt, int *id);
/* Changes an adapter's multiplier (starts a new epoch). */
FERRY_API int ferry_lora_set_multiplier(ferry *f, int id, float multiplier);
/* Removes one adapter, or all (starts a new epoch). */
FERRY_API int ferry_lora_remove(ferry *f, int id);
FERRY_API int ferry_lora_clear(ferry *f);
/* Merge (default) or runtime. Changing it starts a new epoch. */
FERRY_API int ferry_lora_set_mode(ferry *f, ferry_lora_mode mode);
/* The current epoch: 0 before any adapter, bumped by every change of the set. */
FERRY_API uint64_t ferry_lora_epoch(const ferry *f);

typedef struct ferry_lora_info {
    const char *path;
    const char *scheme;         /* "peft", "kohya", "gguf" */
    float multiplier;
    uint32_t n_pairs;           /* A/B pairs in the file */
    uint32_t n_matched;         /* pairs mapped to a base tensor */
    uint32_t n_unmatched;       /* pairs that match nothing */
    const char *unmatched[4];   /* the first unmatched names (NULL-padded) */
    uint32_t skipped;           /* optional adapter: weights staged without it (dtype cannot take
                                   a merge) */
    uint64_t factor_bytes;      /* f32 bytes of its cached factors */
} ferry_lora_info;

/* Describes adapter ID; strings valid until it is removed. */
FERRY_API int ferry_lora_get_info(const ferry *f, int id, ferry_lora_info *out);

/* One adapter's factors for a weight, for runtime mode: delta = scale * (B . A), row-major f32. */
typedef struct ferry_lora_factor {
    const float *a;             /* rank x cols */
    const float *b;             /* rows x rank */
    uint32_t rank;
    uint64_t rows, cols;
    float scale;                /* multiplier * alpha / rank */
    int adapter;                /* its id */
} ferry_lora_factor;

/* The I-th (0-based) adapter term that applies to T, in adapter order; FERRY_ENOENT past the last.
 * Pointers valid until the adapter set changes. Works in either mode. */
FERRY_API int ferry_lora_factors(ferry *f, ferry_tensor *t, size_t i, ferry_lora_factor *out);

/* The llama name table ferry_lora_add maps adapter names with, for engines and tools that meet
 * both spellings. ferry_lora_gguf_name gives the GGUF name of a Hugging Face name:
 * "model.layers.3.self_attn.q_proj" (or "layers.3.self_attn.q_proj") -> "blk.3.attn_q", and so
 * self_attn.k_proj/v_proj/o_proj -> attn_k/attn_v/attn_output, mlp.gate_proj/up_proj/down_proj ->
 * ffn_gate/ffn_up/ffn_down, input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm;
 * "model.embed_tokens" (or "embed_tokens") -> "token_embd", "lm_head" -> "output", "model.norm"
 * -> "output_norm". ferry_lora_hf_name goes the other way, to the "model."-prefixed spelling
 * ("blk.3.attn_q" -> "model.layers.3.self_attn.q_proj", "token_embd" -> "model.embed_tokens").
 * A trailing ".weight" is kept ("lm_head.weight" -> "output.weight"); a layer number has 1 to 9
 * digits. The name is written NUL-terminated into OUT (CAP bytes, cut to fit; OUT may be NULL
 * when CAP is 0). Returns its length without the NUL (as snprintf: CAP or more means it was cut),
 * or 0 when NAME (NULL included) has no entry in the table. Needs no manager; thread-safe. */
FERRY_API size_t ferry_lora_gguf_name(const char *name, char *out, size_t cap);
FERRY_API size_t ferry_lora_hf_name(const char *name, char *out, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * Plans (dry run) and statistics
 * ------------------------------------------------------------------------------------------- */

/* Where a tensor lives. */
typedef struct ferry_placement {
    const char *name;
    const char *group;
    ferry_home home;
    int compute_device;
    int lazy;               /* stays behind the mapping, paged in on demand */
    int zero_copy;          /* its data pointer points into the file mapping */
    uint64_t home_bytes;    /* bytes it holds at home (0 for disk, lazy, zero-copy) */
    uint64_t compute_bytes; /* bytes of its staged copy on the compute device (0 when none) */
} ferry_placement;

#define FERRY_MAX_DEVICES 16

typedef struct ferry_plan_totals {
    uint64_t host_bytes;                      /* kept in host RAM */
    uint64_t mapped_bytes;                    /* served from the mapping (zero-copy or lazy) */
    uint64_t disk_bytes;                      /* home disk */
    uint64_t device_bytes[FERRY_MAX_DEVICES]; /* kept on each device (home device) */
    uint64_t staged_bytes[FERRY_MAX_DEVICES]; /* staged copies on each device, all at once */
} ferry_plan_totals;

/* Dry run: the placement of every tensor and the byte totals the real load produces, with no
 * allocation and no I/O. OUT (may be NULL) receives one entry per placed tensor (a split tensor
 * gives one entry per part, named "NAME[ROW0:ROW1]"; a tensor of a group whose policy sets
 * `experts` one per expert, its slice "NAME[E:E+1]"; ignored tensors none), allocated with malloc:
 * free(*out) when done (strings belong to the manager); *N their number. */
FERRY_API int ferry_plan(ferry *f, ferry_placement **out, size_t *n, ferry_plan_totals *totals);
/* Checks the plan against the budgets as a load that prepares every tensor meets them: on each
 * device with a budget, the bytes kept there (home copies, never evicted) plus the largest single
 * copy staged beside them must fit, as the load's own reservation requires. Returns 0, or
 * FERRY_EBUDGET with ferry_errmsg naming the device, its budget, the bytes needed and the
 * shortfall; other codes as ferry_plan. Passing does not promise that every set an engine
 * prepares at once fits: the check knows single copies, not the engine's sets. */
FERRY_API int ferry_plan_check(ferry *f);

typedef struct ferry_stats {
    uint64_t resident_bytes[FERRY_MAX_DEVICES]; /* bytes ferry holds on each device (0: host) */
    uint64_t peak_bytes[FERRY_MAX_DEVICES];     /* highest value of resident_bytes */
    uint64_t home_host_bytes;     /* held because home = host */
    uint64_t home_device_bytes;   /* held because home = device */
    uint64_t cached_bytes;        /* released but still valid */
    uint64_t bytes_read;          /* from files */
    uint64_t bytes_copied;        /* host <-> device and memcpy out of mappings */
    uint64_t prepares;            /* tensors prepared */
    uint64_t prefetch_hits;       /* prepares that found their tensor ready or in flight */
    uint64_t prefetch_misses;
    uint64_t evictions;
    uint64_t locked_bytes;        /* mlock'd on policy request */
    uint64_t lock_failures;       /* mlock calls refused (RLIMIT_MEMLOCK) */
    double wait_seconds;          /* time prepare spent waiting */
    uint64_t guess_bytes;         /* loaded by ferry_prefetch_guess */
    uint64_t guess_unused_bytes;  /* of them, dropped before any prepare used them */
    uint64_t faulted_ahead_bytes; /* host memory for the first pass's copies (streamed, and the
                                     kept copies' reserve) faulted in by a thread of ferry's
                                     while the engine set itself up (ferry_group_add,
                                     ferry_set_budget), before the first reservation on the
                                     host */
} ferry_stats;

/* A snapshot of the counters. */
FERRY_API int ferry_get_stats(const ferry *f, ferry_stats *out);

/* ---------------------------------------------------------------------------------------------
 * Tracing: a timeline of reads, copies, conversions, first touches of fresh host buffers, waits
 * (and the engine's own events) in the Chrome trace format that Perfetto and chrome://tracing
 * open.
 * ------------------------------------------------------------------------------------------- */

/* Starts recording events; they are written to PATH by ferry_trace_stop (or ferry_destroy).
 * FERRY_EBUSY while another trace is being recorded (stop it first).
 * A regular file at PATH (or none yet) is replaced whole through a temporary file beside it and a
 * rename (through a symbolic link, its target is replaced); anything else (a FIFO, a terminal) is
 * written in place, never replaced. */
FERRY_API int ferry_trace_start(ferry *f, const char *path);
/* Adds an engine event NAME (category CAT) that ran from T0 to T1, seconds of ferry_now(). */
FERRY_API void ferry_trace_event(ferry *f, const char *name, const char *cat, double t0, double t1);
/* Writes the trace file and stops recording. */
FERRY_API int ferry_trace_stop(ferry *f);
/* The clock ferry's statistics and traces use: monotonic seconds. */
FERRY_API double ferry_now(void);

/* ---------------------------------------------------------------------------------------------
 * Expert cache simulation: ferry's eviction policies for units whose use depends on the data (the
 * experts of mixture-of-experts layers, chosen per token by a router), replayed over a sequence of
 * uses without files or devices, to compare them and size a budget. A unit is an id with a size in
 * bytes and a group (its layer); the cache holds at most CAPACITY bytes of units.
 * ------------------------------------------------------------------------------------------- */

typedef enum ferry_cache_policy {
    FERRY_CACHE_FERRY = 0, /* the policy ferry uses for experts: the lowest estimated value of
                            * the next use first. Per unit it learns how often its group's steps
                            * (runs of uses of one group, at most F units) choose it afresh and
                            * how often again right after a use; per group how often the group
                            * steps. The value: the probability of the unit's next use, halved
                            * per period of its group until that use comes, per byte; counts
                            * decay with a half-life of 1024 steps. F is FLOOR_PER_GROUP, or with
                            * 0 the most units one use has passed */
    FERRY_CACHE_LRU,       /* least recently used first */
    FERRY_CACHE_LFU,       /* least frequently used first, with dynamic aging (LFU-DA) */
    FERRY_CACHE_LRFU,      /* lowest combined recency and frequency first (LRFU) */
    FERRY_CACHE_LFU_FLOOR, /* ferry's earlier expert policy, for comparison: per group a floor of F units
                            * kept while other groups hold more (F as for FERRY_CACHE_FERRY),
                            * the units of the group's last F uses evicted after its others,
                            * LFU-DA among the rest */
    FERRY_CACHE_POLICY_COUNT
} ferry_cache_policy;

/* The name of POLICY ("ferry", "lru", "lfu", "lrfu", "lfu-floor"; "?" when out of range). Never
 * NULL. */
FERRY_API const char *ferry_cache_policy_name(ferry_cache_policy policy);

typedef struct ferry_cache_sim ferry_cache_sim;

typedef struct ferry_cache_sim_stats {
    uint64_t uses;        /* units used (ids passed to ferry_cache_sim_use) */
    uint64_t hits;        /* of those, already resident */
    uint64_t bytes_read;  /* bytes of the units read in (the misses) */
    uint64_t evictions;
    uint64_t resident_bytes;
} ferry_cache_sim_stats;

/* Creates a cache of CAPACITY bytes over N units, unit i of BYTES[i] bytes in group GROUP[i]
 * (< N_GROUPS; GROUP NULL: one group), evicting by POLICY. With FLOOR_PER_GROUP F > 0 (any
 * policy), F units of a group are kept while another group holds more, the cache allowing, and
 * the units of a group's last F uses go after its others; 0: none, except that FERRY_CACHE_FERRY
 * learns F. The arrays are copied. Returns 0 with *OUT set (free it with
 * ferry_cache_sim_destroy), FERRY_EINVAL for a bad argument, or FERRY_ENOMEM. */
FERRY_API int ferry_cache_sim_create(ferry_cache_sim **out, ferry_cache_policy policy, size_t n,
                                     const uint64_t *bytes, const uint32_t *group,
                                     size_t n_groups, uint64_t capacity,
                                     uint32_t floor_per_group);
/* Uses the N units IDS together (one layer's chosen experts for one token: all resident at
 * once): each absent one is read in, evicting others by the policy, never one of IDS; an id
 * repeated in IDS is used once. Returns 0; FERRY_EINVAL for an id out of range, or FERRY_EBUDGET
 * when IDS together do not fit in the capacity (nothing is used then), with ferry_cache_sim_errmsg
 * naming the id or the bytes. */
FERRY_API int ferry_cache_sim_use(ferry_cache_sim *s, const uint32_t *ids, size_t n);
/* The counters since creation into *OUT. */
FERRY_API void ferry_cache_sim_get_stats(const ferry_cache_sim *s, ferry_cache_sim_stats *out);
/* Whether unit ID is resident (0 for an id out of range). */
FERRY_API int ferry_cache_sim_resident(const ferry_cache_sim *s, uint32_t id);
/* The message of the last failed call on S ("" when none); valid until the next call on S. */
FERRY_API const char *ferry_cache_sim_errmsg(const ferry_cache_sim *s);
/* Frees S; NULL is a no-op. */
FERRY_API void ferry_cache_sim_destroy(ferry_cache_sim *s);

/* ---------------------------------------------------------------------------------------------
 * Fault seams for tests (as SQLite's): the system calls of file reading and ferry's own
 * allocations can be made to fail, to check that each failure is reported clearly and leaves the
 * manager usable. Process-wide; not for production use.
 * ------------------------------------------------------------------------------------------- */

/* Any function pointer; cast it to and from the signature of the call it stands for. */
typedef void (*ferry_syscall_ptr)(void);
/* Replaces system call NAME of ferry's file reading with FN (NULL: the system's again). The names
 * and the signatures FN must have, as the system calls':
 *   "open"   int (*)(const char *path, int flags)        (read-only opens: no mode)
 *   "close"  int (*)(int fd)
 *   "fstat"  int (*)(int fd, struct stat *st)
 *   "pread"  ssize_t (*)(int fd, void *buf, size_t n, off_t off)
 *   "mmap"   void *(*)(void *addr, size_t len, int prot, int flags, int fd, off_t off)
 *   "munmap" int (*)(void *addr, size_t len)
 * A replacement sets errno as the system call would. It may be installed while other threads
 * read; reads through io_uring (FERRY_IO_BACKEND=uring) do not go through "pread". Returns 0, or
 * FERRY_ENOENT for an unknown NAME. */
FERRY_API int ferry_set_syscall(const char *name, ferry_syscall_ptr fn);
/* The function now behind NAME (the system's when none was set), for a replacement that wraps
 * it; NULL for an unknown NAME. */
FERRY_API ferry_syscall_ptr ferry_get_syscall(const char *name);
/* From this call on, the N-th of ferry's own heap allocations (counted over the process, every
 * thread) fails as if memory were exhausted; with PERSISTENT, every one after it too. N = 0: none
 * fails. Returns how many were counted since the previous call, so a test can run a scenario once
 * with N = 0 to learn its count and then fail each allocation in turn. */
FERRY_API uint64_t ferry_fail_alloc(uint64_t n, int persistent);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_H */
