/*
 * util.h — small pieces every module uses: the per-handle error buffer, checked arithmetic,
 * a string hash map, size parsing and printing, glob matching, a monotonic clock, loading optional
 * libraries at run time.
 * Internal: symbols are ferry__*, never part of the public interface.
 */
#ifndef FERRY_UTIL_H
#define FERRY_UTIL_H

#include <sys/types.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define FERRY__ERRMSG_MAX 2048

/* The detail of the last failure on a handle. code 0 and msg "" when none. */
typedef struct ferry__err {
    int code;
    char msg[FERRY__ERRMSG_MAX];
} ferry__err;

/* Sets E (may be NULL) to CODE and the printf-formatted message; returns CODE, so that
 * `return ferry__fail(e, FERRY_ETRUNC, "%s: ...", path)` is the idiom. */
int ferry__fail(ferry__err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends a line to E's message (for reports of several problems); keeps the first code. */
void ferry__fail_append(ferry__err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Puts FMT... in front of E's message (truncating its end when it does not fit). */
void ferry__fail_prefix(ferry__err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears E. */
void ferry__err_clear(ferry__err *e);

/* Checked arithmetic: return 1 on overflow (and leave *out unspecified), 0 otherwise. */
static inline int ferry__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline int ferry__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out);
}
/* Rounds X up to a multiple of the power of two A; 1 on overflow. */
static inline int ferry__align_up(uint64_t x, uint64_t a, uint64_t *out)
{
    if (__builtin_add_overflow(x, a - 1, out))
        return 1;
    *out &= ~(a - 1);
    return 0;
}

/* malloc/calloc/realloc wrappers that never abort; strdup that tolerates NULL (returns NULL). */
char *ferry__strdup(const char *s);
char *ferry__strndup(const char *s, size_t n);
/* printf into a fresh malloc'd string; NULL when memory is exhausted. */
char *ferry__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A hash map from NUL-terminated strings (not copied: the caller keeps them alive) to uint64_t.
 * Open addressing; all operations O(1) on average. Zero-initialised is an empty map. */
typedef struct ferry__hmap {
    const char **keys;
    uint64_t *vals;
    uint32_t *hashes;
    size_t cap; /* power of two or 0 */
    size_t len;
} ferry__hmap;

/* Inserts KEY -> VAL. Returns 0, FERRY_EDUP when KEY is present (its value left unchanged and
 * written to *existing when not NULL), FERRY_ENOMEM. */
int ferry__hmap_put(ferry__hmap *m, const char *key, uint64_t val, uint64_t *existing);
/* 1 and *val when KEY is present, 0 otherwise. */
int ferry__hmap_get(const ferry__hmap *m, const char *key, uint64_t *val);
/* Removes KEY when present; returns 1 if it was. */
int ferry__hmap_del(ferry__hmap *m, const char *key);
/* Reserves room for N keys without rehashing. */
int ferry__hmap_reserve(ferry__hmap *m, size_t n);
void ferry__hmap_free(ferry__hmap *m);
uint32_t ferry__hash_str(const char *s);

/* Parses a byte size: a decimal number (fraction allowed) with an optional unit K, M, G, T
 * (powers of 1000, also KB, MB...) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, an
 * optional trailing "B". "0" is allowed. Returns 0 or FERRY_EINVAL (garbage, overflow). */
int ferry__parse_size(const char *s, uint64_t *out);
/* Parses a bandwidth "25GB/s", "800MiB/s" into bytes per second. */
int ferry__parse_rate(const char *s, uint64_t *out);
/* Formats N bytes for people: "512 B", "1.50 KiB", "3.20 GiB". Returns BUF. */
char *ferry__fmt_size(uint64_t n, char buf[32]);

/* Glob match: '*' any run, '?' one character, '[abc]' / '[a-z]' / '[!a]' a class, '\\' escapes.
 * Returns 1 on match. No path semantics ('*' crosses '.' and '/'). */
int ferry__glob(const char *pattern, const char *s);

/* Monotonic clock in seconds. */
double ferry__now(void);

/* Reads one byte of each 4 KiB page of [P, P+LEN): makes the process's own access to every page
 * happen now (see ferry__cpu_move_cost). */
void ferry__read_pages(const void *p, uint64_t len);

/* dlopen (RTLD_NOW | RTLD_LOCAL) of the first of the N library NAMES that loads: its handle, and
 * its name in *WHICH (may be NULL); NULL when none loads. Loaded libraries are never closed. */
void *ferry__dlopen_first(const char *const *names, size_t n, const char **which);
/* Stores the address of symbol NAME of the dlopen'd LIB into the function pointer at FP (SIZE,
 * the pointer's sizeof): 0, or -1 when LIB lacks NAME (*FP untouched). */
int ferry__dlsym_fn(void *lib, const char *name, void *fp, size_t size);

/* Little-endian loads from unaligned memory. */
static inline uint16_t ferry__le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ferry__le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ferry__le64(const unsigned char *p)
{
    return (uint64_t)ferry__le32(p) | (uint64_t)ferry__le32(p + 4) << 32;
}

#define FERRY__MIN(a, b) ((a) < (b) ? (a) : (b))
#define FERRY__MAX(a, b) ((a) > (b) ? (a) : (b))
#define FERRY__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* An anonymous read-write mapping of LEN bytes starting on an ALIGN boundary (a power of two, a
 * multiple of the page size): LEN + ALIGN mapped through MMAP, the ends beyond [start, start +
 * LEN) given back through MUNMAP, so that munmap(start, LEN) frees it all. MMAP and MUNMAP are
 * mmap and munmap, or a seam standing for them (io's ferry__sys_mmap). NULL when MMAP fails. */
void *ferry__map_aligned(uint64_t len, uint64_t align,
                         void *(*mmap_fn)(void *, size_t, int, int, int, off_t),
                         int (*munmap_fn)(void *, size_t));

/* The allocation seam (alloc.c, ferry_fail_alloc): the library's own code allocates through
 * these. Building the library (FERRY__ALLOC_SEAM), the C library's names are redirected to them,
 * so that every call site is covered without naming the seam; the headers declaring the real
 * ones are included first, so their declarations stay as they are. */
void *ferry__malloc(size_t n);
void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *p, size_t n);
int ferry__posix_memalign(void **p, size_t align, size_t n);
void *ferry__aligned_alloc(size_t align, size_t n);
#ifdef FERRY__ALLOC_SEAM
#include <stdlib.h>
#include <string.h>
#define malloc(n) ferry__malloc(n)
#define calloc(n, size) ferry__calloc(n, size)
#define realloc(p, n) ferry__realloc(p, n)
#define posix_memalign(p, align, n) ferry__posix_memalign(p, align, n)
#define aligned_alloc(align, n) ferry__aligned_alloc(align, n)
#endif

#endif
