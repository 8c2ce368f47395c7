/*
 * util.c — error buffers, strings, the hash map, sizes, glob, the clock and dlopen (see util.h).
 */
#include "util.h"

#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

void *ferry__map_aligned(uint64_t len, uint64_t align,
                         void *(*mmap_fn)(void *, size_t, int, int, int, off_t),
                         int (*munmap_fn)(void *, size_t))
{
    if (!len || len > SIZE_MAX - align)
        return NULL;
    unsigned char *m = mmap_fn(NULL, (size_t)(len + align), PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint64_t head = (align - (uintptr_t)m % align) % align;
    if (head)
        munmap_fn(m, (size_t)head);
    if (align - head)
        munmap_fn(m + head + len, (size_t)(align - head));
    return m + head;
}

int ferry__fail(ferry__err *e, int code, const char *fmt, ...)
{
    if (!e)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->code = code;
    return code;
}

void ferry__fail_append(ferry__err *e, int code, const char *fmt, ...)
{
    if (!e)
        return;
    size_t len = strlen(e->msg);
    if (len && len + 1 < sizeof e->msg)
        e->msg[len++] = '\n', e->msg[len] = 0;
    if (len + 1 < sizeof e->msg) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg + len, sizeof e->msg - len, fmt, ap);
        va_end(ap);
    }
    if (!e->code)
        e->code = code;
}

void ferry__fail_prefix(ferry__err *e, const char *fmt, ...)
{
    if (!e)
        return;
    char head[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    size_t h = (size_t)n < sizeof head ? (size_t)n : sizeof head - 1;
    size_t keep = strlen(e->msg);
    if (h + keep >= sizeof e->msg)
        keep = sizeof e->msg - 1 - h;
    memmove(e->msg + h, e->msg, keep);
    memcpy(e->msg, head, h);
    e->msg[h + keep] = 0;
}

void ferry__err_clear(ferry__err *e)
{
    if (e)
        e->code = 0, e->msg[0] = 0;
}

char *ferry__strdup(const char *s)
{
    return s ? ferry__strndup(s, strlen(s)) : NULL;
}

char *ferry__strndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

char *ferry__asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = malloc((size_t)n + 1);
    if (!p)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

/* FNV-1a, then a final mix so that low bits are usable as a table index. */
uint32_t ferry__hash_str(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    return h;
}

static int hmap_grow(ferry__hmap *m, size_t cap)
{
    const char **keys = calloc(cap, sizeof *keys);
    uint64_t *vals = calloc(cap, sizeof *vals);
    uint32_t *hashes = calloc(cap, sizeof *hashes);
    if (!keys || !vals || !hashes) {
        free(keys), free(vals), free(hashes);
        return FERRY_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = m->hashes[i] & (cap - 1);
        while (keys[j])
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i], vals[j] = m->vals[i], hashes[j] = m->hashes[i];
    }
    free(m->keys), free(m->vals), free(m->hashes);
    m->keys = keys, m->vals = vals, m->hashes = hashes, m->cap = cap;
    return 0;
}

int ferry__hmap_reserve(ferry__hmap *m, size_t n)
{
    size_t cap = m->cap ? m->cap : 16;
    while (cap / 4 * 3 < n) {
        if (cap > SIZE_MAX / 4)
            return FERRY_ENOMEM;
        cap *= 2;
    }
    return cap == m->cap ? 0 : hmap_grow(m, cap);
}

int ferry__hmap_put(ferry__hmap *m, const char *key, uint64_t val, uint64_t *existing)
{
    int rc = ferry__hmap_reserve(m, m->len + 1);
    if (rc)
        return rc;
    uint32_t h = ferry__hash_str(key);
    size_t j = h & (m->cap - 1);
    while (m->keys[j]) {
        if (m->hashes[j] == h && strcmp(m->keys[j], key) == 0) {
            if (existing)
                *existing = m->vals[j];
            return FERRY_EDUP;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key, m->vals[j] = val, m->hashes[j] = h;
    m->len++;
    return 0;
}

static size_t hmap_slot(const ferry__hmap *m, const char *key, int *found)
{
    *found = 0;
    if (!m->cap)
        return 0;
    uint32_t h = ferry__hash_str(key);
    size_t j = h & (m->cap - 1);
    while (m->keys[j]) {
        if (m->hashes[j] == h && strcmp(m->keys[j], key) == 0) {
            *found = 1;
            return j;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return j;
}

int ferry__hmap_get(const ferry__hmap *m, const char *key, uint64_t *val)
{
    int found;
    size_t j = hmap_slot(m, key, &found);
    if (found && val)
        *val = m->vals[j];
    return found;
}

int ferry__hmap_del(ferry__hmap *m, const char *key)
{
    int found;
    size_t j = hmap_slot(m, key, &found);
    if (!found)
        return 0;
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t mask = m->cap - 1;
    size_t i = j;
    for (;;) {
        m->keys[i] = NULL;
        size_t k = i;
        for (;;) {
            k = (k + 1) & mask;
            if (!m->keys[k]) {
                m->len--;
                return 1;
            }
            size_t home = m->hashes[k] & mask;
            /* Move k into the hole at i when its home is not in the cyclic range (i, k]. */
            if (i <= k ? (home <= i || home > k) : (home <= i && home > k))
                break;
        }
        m->keys[i] = m->keys[k], m->vals[i] = m->vals[k], m->hashes[i] = m->hashes[k];
        i = k;
    }
}

void ferry__hmap_free(ferry__hmap *m)
{
    free(m->keys), free(m->vals), free(m->hashes);
    memset(m, 0, sizeof *m);
}

static int parse_scaled(const char *s, uint64_t *out, const char **rest)
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s) && *s != '.')
        return FERRY_EINVAL;
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v))
        return FERRY_EINVAL;
    while (isspace((unsigned char)*end))
        end++;
    double mul = 1;
    const char *u = end;
    int binary = 0;
    char c = (char)toupper((unsigned char)*u);
    if (c && strchr("KMGTP", c)) {
        int p = (int)(strchr("KMGTP", c) - "KMGTP") + 1;
        u++;
        if (*u == 'i' || *u == 'I')
            binary = 1, u++;
        mul = pow(binary ? 1024.0 : 1000.0, p);
    }
    if (*u == 'B' || *u == 'b')
        u++;
    double r = v * mul;
    if (r >= 18446744073709551615.0)
        return FERRY_EINVAL;
    *out = (uint64_t)(r + 0.5);
    *rest = u;
    return 0;
}

int ferry__parse_size(const char *s, uint64_t *out)
{
    const char *rest;
    if (!s || parse_scaled(s, out, &rest))
        return FERRY_EINVAL;
    while (isspace((unsigned char)*rest))
        rest++;
    return *rest ? FERRY_EINVAL : 0;
}

int ferry__parse_rate(const char *s, uint64_t *out)
{
    const char *rest;
    if (!s || parse_scaled(s, out, &rest))
        return FERRY_EINVAL;
    if (strcasecmp(rest, "/s") && strcasecmp(rest, "ps") && *rest)
        return FERRY_EINVAL;
    return 0;
}

char *ferry__fmt_size(uint64_t n, char buf[32])
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) {
        snprintf(buf, 32, "%llu B", (unsigned long long)n);
        return buf;
    }
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 6)
        v /= 1024, u++;
    snprintf(buf, 32, "%.2f %s", v, units[u]);
    return buf;
}

int ferry__glob(const char *p, const char *s)
{
    /* Iterative with one backtrack point for '*': linear in practice, no recursion. */
    const char *star_p = NULL, *star_s = NULL;
    while (*s) {
        if (*p == '*') {
            star_p = ++p;
            star_s = s;
            continue;
        }
        int ok = 0;
        const char *next = p + 1;
        if (*p == '?') {
            ok = 1;
        } else if (*p == '[') {
            const char *q = p + 1;
            int neg = (*q == '!' || *q == '^');
            if (neg)
                q++;
            int hit = 0;
            const char *start = q;
            while (*q && (*q != ']' || q == start)) {
                if (q[1] == '-' && q[2] && q[2] != ']') {
                    if ((unsigned char)*s >= (unsigned char)q[0] &&
                        (unsigned char)*s <= (unsigned char)q[2])
                        hit = 1;
                    q += 3;
                } else {
                    if (*q == *s)
                        hit = 1;
                    q++;
                }
            }
            if (*q == ']') {
                ok = hit != neg;
                next = q + 1;
            } else {
                ok = (*s == '['); /* unterminated class: literal '[' */
            }
        } else if (*p == '\\' && p[1]) {
            ok = (p[1] == *s);
            next = p + 2;
        } else if (*p) {
            ok = (*p == *s);
        }
        if (ok) {
            p = next;
            s++;
        } else if (star_p) {
            p = star_p;
            s = ++star_s;
        } else {
            return 0;
        }
    }
    while (*p == '*')
        p++;
    return *p == 0;
}

void ferry__read_pages(const void *p, uint64_t len)
{
    const volatile unsigned char *q = p;
    unsigned char x = 0;
    for (uint64_t off = 0; off < len; off += 4096)
        x ^= q[off];
    (void)x;
}

double ferry__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *ferry__dlopen_first(const char *const *names, size_t n, const char **which)
{
    for (size_t i = 0; i < n; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            if (which)
                *which = names[i];
            return lib;
        }
    }
    return NULL;
}

int ferry__dlsym_fn(void *lib, const char *name, void *fp, size_t size)
{
    void *sym = dlsym(lib, name);
    if (!sym)
        return -1;
    memcpy(fp, &sym, size); /* object -> function pointer, as POSIX dlsym intends */
    return 0;
}

int ferry_parse_size(const char *s, uint64_t *out) { return ferry__parse_size(s, out); }

char *ferry_format_size(uint64_t n, char buf[32]) { return ferry__fmt_size(n, buf); }
