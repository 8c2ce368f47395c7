/*
 * formats.h — the internal interface between the format readers/writers and the catalog.
 *
 * A reader parses one file's header into a ferry__parsed: its tensors (absolute offsets), its
 * metadata, and nothing else. It reads from memory: a buffer of the whole file (the fuzzers, the
 * tests), or one that the catalog fills with pread as the reader asks for more (ferry__src): never
 * from the file's mapping, whose pages die of SIGBUS when the file is truncated under the parse.
 * A reader checks everything that can be checked inside one file; the catalog (catalog.c) checks
 * what crosses files (names unique across files, shards of one model) and owns the open files.
 *
 * Error codes, the same in every reader so the hostile-file tests can name them:
 *   not this format at all / wrong magic / bad version / wrong structure ........ FERRY_EFORMAT
 *   the file ends before a structure it declares (header, string, array, info) .. FERRY_ETRUNC
 *   a count or length larger than the file could hold, nesting too deep,
 *     more than FERRY_MAX_DIMS dimensions, a name or header over the limits .... FERRY_ELIMIT
 *   a product or sum of file numbers that overflows 64 bits ..................... FERRY_EOVERFLOW
 *   tensor data (partly) past the end of the file ................................ FERRY_ERANGE
 *   two tensors' data overlap ..................................................... FERRY_EOVERLAP
 *   alignment not a power of two (or 0, or absurd), offset not aligned ........... FERRY_EALIGN
 *   a duplicate tensor name, metadata key or JSON object key ..................... FERRY_EDUP
 *   an unknown or retired type id / dtype string .................................. FERRY_EDTYPE
 *   negative or zero-size-but-nonempty dims, row not a whole number of blocks,
 *     safetensors byte range that disagrees with shape x dtype ................... FERRY_ESHAPE
 *   JSON syntax, invalid UTF-8, bad number or escape .............................. FERRY_EJSON
 *   a metadata value of the wrong type (e.g. general.alignment not u32) ........... FERRY_ETYPE
 *   a shard path in an index that is absolute or contains ".." ................... FERRY_EPATH
 *   a shard named by an index or split set that does not exist ................... FERRY_ENOENT
 * Every message starts with the file path and names the tensor/key and the offending numbers.
 */
#ifndef FERRY_FORMATS_H
#define FERRY_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"
#include "util/util.h"

/* Limits on what a file may declare (beyond "fits in the file"). */
#define FERRY__MAX_NAME 65535u             /* bytes in a tensor name or metadata key */
#define FERRY__MAX_NESTING 8               /* GGUF arrays of arrays, JSON depth is separate */
#define FERRY__MAX_JSON_DEPTH 64
#define FERRY__MAX_ST_HEADER (UINT64_C(100) << 20) /* safetensors JSON header, bytes */

typedef struct ferry__tdesc {
    char *name;        /* owned */
    uint64_t offset;   /* absolute, in its file */
    uint64_t nbytes;
    ferry_dtype dtype;
    uint32_t ndim;
    int64_t shape[FERRY_MAX_DIMS]; /* the file's own order */
} ferry__tdesc;

/* Ownership of a metadata value (ferry__value_free releases exactly this; every producer of owned
 * values — the GGUF reader, ferry__value_copy, the safetensors and index readers — follows it):
 *  - a STRING value's ptr is its own malloc'd block (len + 1 bytes, NUL-terminated);
 *  - an ARRAY value is ONE malloc'd block starting at items (NULL when empty): its n items, then
 *    the items of every array nested in it (at any depth), then the bytes of every string inside
 *    it, each NUL-terminated. Strings and nested arrays inside an array point into that block and
 *    are never freed on their own: freeing items frees all of them. A huge vocabulary (128k
 *    tokens) thus costs one allocation, not one per token.
 *  - scalars own nothing. */
typedef struct ferry__kv {
    char *key;         /* owned */
    ferry_value val;   /* owned, as above */
} ferry__kv;

typedef struct ferry__parsed {
    ferry_format format;
    ferry__tdesc *tensors; /* sorted by offset after a successful parse */
    size_t n_tensors, cap_tensors;
    ferry__kv *meta;
    size_t n_meta, cap_meta;
    uint64_t data_offset;  /* start of the data section */
    uint64_t alignment;    /* GGUF general.alignment (default 32); 1 for safetensors */
    uint32_t gguf_version; /* 2 or 3 for GGUF */
} ferry__parsed;

void ferry__parsed_free(ferry__parsed *p);
void ferry__value_free(ferry_value *v);
/* Deep copy of a value (strings and arrays copied), owned by the rule above (an array copied into
 * one block). FERRY_ENOMEM, or FERRY_EINVAL / FERRY_EOVERFLOW for an array whose items are missing
 * or too large; on failure nothing is left to free in DST. */
int ferry__value_copy(ferry_value *dst, const ferry_value *src);
/* Appends to the arrays (growing them); the tdesc/kv are moved in (ownership taken on success). */
int ferry__parsed_add_tensor(ferry__parsed *p, const ferry__tdesc *t);
int ferry__parsed_add_meta(ferry__parsed *p, char *key, const ferry_value *v);
/* Checks tensors of one file: sorts by offset, then names unique (EDUP), no overlaps (EOVERLAP),
 * each range inside [data_offset, file_size) (ERANGE). Messages name PATH and the tensors. */
int ferry__parsed_check(ferry__parsed *p, const char *path, uint64_t file_size, ferry__err *e);

/* Content sniffing: which format BUF (the first N bytes of a file, N may be small) looks like. */
ferry_format ferry__detect(const unsigned char *buf, size_t n);

/* Readers. DATA holds the whole file (SIZE bytes). PATH is only for messages. On failure OUT is
 * left empty (freed). */
int ferry__gguf_parse(const unsigned char *data, uint64_t size, const char *path,
                      ferry__parsed *out, ferry__err *e);
int ferry__safetensors_parse(const unsigned char *data, uint64_t size, const char *path,
                             ferry__parsed *out, ferry__err *e);

/* The bytes a reader parses when only the start of the file is in memory: the first AVAIL of the
 * file's SIZE bytes are at DATA. A reader that needs bytes beyond AVAIL (but inside SIZE) calls
 * MORE(SRC, WANT, E), which must make at least WANT (<= SIZE) bytes available, updating DATA and
 * AVAIL (DATA may move: readers keep offsets, never pointers, across a call), or return a FERRY_E
 * code with its message in E (the file shrank: FERRY_ECHANGED; a failed read: FERRY_EIO). MORE
 * NULL means the whole file is there (AVAIL == SIZE). Limits and messages are those of the whole
 * file: a reader's result and error do not depend on how the bytes arrived. Nothing a reader
 * returns points into DATA. */
typedef struct ferry__src {
    const unsigned char *data;
    uint64_t avail, size;
    int (*more)(struct ferry__src *src, uint64_t want, ferry__err *e);
    void *arg; /* MORE's own */
} ferry__src;
/* Makes the file's first WANT bytes (WANT <= SRC->size) be in memory: 0 when they are already,
 * else SRC->more's answer (FERRY_EIO when it gives fewer, or there is no MORE). */
int ferry__src_fetch(ferry__src *src, uint64_t want, const char *path, ferry__err *e);
int ferry__gguf_read(ferry__src *src, const char *path, ferry__parsed *out, ferry__err *e);
int ferry__safetensors_read(ferry__src *src, const char *path, ferry__parsed *out, ferry__err *e);

/* A sharded safetensors index (*.safetensors.index.json). */
typedef struct ferry__index {
    char **shards;          /* unique shard file names, relative to the index folder, owned */
    size_t n_shards;
    char **names;           /* tensor names of weight_map, owned */
    uint32_t *shard_of;     /* per name: index into shards */
    size_t n_names;
    ferry__kv *meta;        /* "metadata" object members, as strings or numbers */
    size_t n_meta;
} ferry__index;
/* Parses an index held in DATA; refuses shard paths that are absolute or contain a ".." component
 * (FERRY_EPATH). */
int ferry__index_parse(const unsigned char *data, uint64_t size, const char *path,
                       ferry__index *out, ferry__err *e);
void ferry__index_free(ferry__index *ix);

/* Split GGUF: split.no / split.count read from P's metadata; 0 and 1 when absent. ETYPE on a
 * wrong type. */
int ferry__gguf_split_info(const ferry__parsed *p, const char *path, uint32_t *split_no,
                           uint32_t *split_count, ferry__err *e);

/* Header serializers used by the writer. They assign each tensor's absolute offset (tensors in
 * the order given; GGUF aligns each to p->alignment, safetensors packs them) and return the header
 * bytes, padding included, so that data begins right after: *out is malloc'd, *len its length,
 * p->data_offset set to *len. */
int ferry__gguf_serialize(ferry__parsed *p, unsigned char **out, size_t *len, ferry__err *e);
int ferry__safetensors_serialize(ferry__parsed *p, unsigned char **out, size_t *len, ferry__err *e);

/* JSON for untrusted input (json.c): a DOM with limits on depth, string length and number size,
 * UTF-8 validated, duplicate keys refused (FERRY_EDUP). */
typedef enum ferry__json_type {
    FERRY__JSON_NULL,
    FERRY__JSON_BOOL,
    FERRY__JSON_NUMBER,
    FERRY__JSON_STRING,
    FERRY__JSON_ARRAY,
    FERRY__JSON_OBJECT,
} ferry__json_type;

typedef struct ferry__json {
    ferry__json_type type;
    int b;                       /* BOOL */
    const char *num;             /* NUMBER: its text (not terminated), num_len bytes */
    size_t num_len;
    char *str;                   /* STRING: decoded, NUL-terminated, str_len bytes (no NUL inside
                                    for keys) */
    size_t str_len;
    struct ferry__json *items;   /* ARRAY items / OBJECT values */
    char **keys;                 /* OBJECT keys (decoded), parallel to items */
    size_t n;
} ferry__json;

/* Parses TEXT (LEN bytes) into *OUT. Messages start with PATH and give the byte offset. */
int ferry__json_parse(const char *text, size_t len, const char *path, ferry__json *out,
                      ferry__err *e);
void ferry__json_free(ferry__json *j);
/* Parses TEXT, which must be one JSON object (FERRY_EFORMAT otherwise), without building it
 * whole: each member goes to FN(KEY, VALUE, AT, ARG) as soon as its value is parsed (AT: the key's
 * byte offset), so that memory stays that of one member. FN owns KEY (malloc'd) and *VALUE (free
 * with ferry__json_free) whatever it returns; a nonzero return ends the parse and is returned.
 * The members' keys are not checked for duplicates (FN sees every one); everything else is as in
 * ferry__json_parse. */
typedef int (*ferry__json_member_fn)(char *key, ferry__json *value, size_t at, void *arg);
int ferry__json_parse_members(const char *text, size_t len, const char *path,
                              ferry__json_member_fn fn, void *arg, ferry__err *e);
/* Member KEY of object O, or NULL. Linear scan. */
const ferry__json *ferry__json_get(const ferry__json *o, const char *key);
/* A NUMBER that is a non-negative integer up to 2^64-1: 0 and *out, FERRY_EJSON otherwise. */
int ferry__json_u64(const ferry__json *j, uint64_t *out);
/* Appends S as a JSON string literal (quotes and escapes) to a growing buffer. */
typedef struct ferry__buf {
    char *p;
    size_t len, cap;
    int oom; /* set when a growth failed; later appends do nothing */
} ferry__buf;
void ferry__buf_put(ferry__buf *b, const char *s, size_t n);
void ferry__buf_printf(ferry__buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ferry__buf_json_str(ferry__buf *b, const char *s, size_t n);

#endif
