/*
 * gguf.c — the GGUF reader (versions 2 and 3) and header writer.
 *
 * The reader walks the file's bytes with a bounds-checked cursor; nothing is read before the bytes
 * are known to be there, and nothing is allocated before its count is known to fit in the file.
 * The bytes are in memory from the start (a buffer of the whole file) or arrive as the cursor asks
 * for them (ferry__src: the catalog's pread buffer, grown as the header turns out longer), so that
 * one pass reads a header of unknown size. Bounds are checked against the file's size; only then
 * does the cursor fetch what is not yet in memory. It never trusts a number from the file: counts are bounded by the bytes they
 * would need, products and sums are checked, types are looked up in the dtype table. The error
 * codes follow the table in formats.h; every message starts with the path and names the key or
 * tensor and the numbers involved.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv key/values (key:
 * u64 length + bytes; u32 value type; value), n_tensors infos (name; u32 n_dims; n_dims x u64 ne;
 * u32 type; u64 offset relative to the data section), padding to general.alignment, data.
 *
 * Work is linear in the header size: one pass, one hash map for duplicate keys. Memory is
 * proportional to what the file really holds, not to the counts it declares.
 */
#include <stdlib.h>
#include <string.h>

#include "dtype/dtype.h"
#include "formats/formats.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_ALIGNMENT (UINT64_C(1) << 20)
/* Smallest encodings, used to bound counts before allocating: a key/value is a key length (8), a
 * value type (4) and a one-byte value; a tensor info is a name length (8), n_dims (4), a type (4)
 * and an offset (8). */
#define GGUF_MIN_KV 13u
#define GGUF_MIN_INFO 24u
/* Array items in all metadata of one file. Each becomes a ferry_value (32 bytes) whatever its
 * encoded size, so a file of N bytes could otherwise make the reader allocate 32 N; real files
 * hold a few million at most (vocabularies, merges). */
#define GGUF_MAX_ITEMS (UINT64_C(1) << 25)
/* Entries reserved up front; beyond that the arrays grow as entries actually arrive, so that a
 * file declaring a huge count costs memory only for what it really holds. */
#define GGUF_PREALLOC 4096u

typedef struct cursor {
    const unsigned char *d; /* the file's first AVAIL bytes (moves when the source grows) */
    uint64_t avail, size, pos;
    ferry__src *src;
    const char *path;
    ferry__err *e;
    uint64_t items; /* array items read so far (<= GGUF_MAX_ITEMS) */
} cursor;

/* Bytes of the file after the cursor (whether in memory or not). */
static uint64_t left(const cursor *c) { return c->size - c->pos; }

/* Makes the N bytes at the cursor (N <= left(c), checked by the caller) be in memory, asking the
 * source for more when they are not. Pointers into c->d do not survive a call. */
static int fetch(cursor *c, uint64_t n)
{
    if (n <= c->avail - c->pos)
        return 0;
    int rc = ferry__src_fetch(c->src, c->pos + n, c->path, c->e);
    c->d = c->src->data;
    c->avail = FERRY__MIN(c->src->avail, c->size);
    return rc;
}

/* ETRUNC unless N more bytes are there. WHAT names the structure being read. */
static int need(cursor *c, uint64_t n, const char *what)
{
    if (n <= left(c))
        return fetch(c, n);
    return ferry__fail(c->e, FERRY_ETRUNC,
                       "%s: file ends at %llu bytes inside %s at offset %llu (%llu bytes needed, "
                       "%llu left)",
                       c->path, (unsigned long long)c->size, what, (unsigned long long)c->pos,
                       (unsigned long long)n, (unsigned long long)left(c));
}

static int rd_u32(cursor *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    *v = ferry__le32(c->d + c->pos);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    *v = ferry__le64(c->d + c->pos);
    c->pos += 8;
    return 0;
}

/* A declared amount of bytes (COUNT items of at least UNIT bytes each) that must fit in what is
 * left: larger than the whole file could ever hold is ELIMIT; plausible for the file but beyond
 * its end is ETRUNC (the file was cut). */
static int bound(cursor *c, uint64_t count, uint64_t unit, const char *what, const char *name)
{
    uint64_t total;
    if (ferry__mul_u64(count, unit, &total) || total > c->size)
        return ferry__fail(c->e, FERRY_ELIMIT,
                           "%s: %s%s%s%s at offset %llu declares %llu items/bytes, more than "
                           "the %llu-byte file could hold",
                           c->path, what, name ? " '" : "", name ? name : "", name ? "'" : "",
                           (unsigned long long)c->pos, (unsigned long long)count,
                           (unsigned long long)c->size);
    if (total > left(c))
        return ferry__fail(c->e, FERRY_ETRUNC,
                           "%s: file ends inside %s%s%s%s at offset %llu (%llu bytes needed, "
                           "%llu left)",
                           c->path, what, name ? " '" : "", name ? name : "", name ? "'" : "",
                           (unsigned long long)c->pos, (unsigned long long)total,
                           (unsigned long long)left(c));
    return fetch(c, total);
}

/* A key or tensor name: u64 length (<= FERRY__MAX_NAME, no NUL inside, not empty), bytes.
 * *OUT is a fresh NUL-terminated copy. */
static int rd_name(cursor *c, const char *what, char **out)
{
    uint64_t len;
    uint64_t at = c->pos;
    int rc = rd_u64(c, &len, what);
    if (rc)
        return rc;
    if (len > FERRY__MAX_NAME)
        return ferry__fail(c->e, FERRY_ELIMIT, "%s: %s at offset %llu is %llu bytes long (limit %u)",
                           c->path, what, (unsigned long long)at, (unsigned long long)len,
                           FERRY__MAX_NAME);
    if ((rc = bound(c, len, 1, what, NULL)))
        return rc;
    const unsigned char *s = c->d + c->pos;
    if (len == 0)
        return ferry__fail(c->e, FERRY_EFORMAT, "%s: empty %s at offset %llu", c->path, what,
                           (unsigned long long)at);
    if (memchr(s, 0, (size_t)len))
        return ferry__fail(c->e, FERRY_EFORMAT, "%s: %s at offset %llu contains a NUL byte",
                           c->path, what, (unsigned long long)at);
    char *p = ferry__strndup((const char *)s, (size_t)len);
    if (!p)
        return ferry__fail(c->e, FERRY_ENOMEM, "%s: out of memory reading %s", c->path, what);
    c->pos += len;
    *out = p;
    return 0;
}

static const char *vtype_name(uint32_t t)
{
    static const char *n[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                              "bool", "string", "array", "u64", "i64", "f64"};
    return t < FERRY__ARRAY_LEN(n) ? n[t] : "?";
}

/* Encoded size of a scalar value type; 0 for string/array/unknown. */
static unsigned scalar_size(uint32_t t)
{
    switch (t) {
    case FERRY_VALUE_U8: case FERRY_VALUE_I8: case FERRY_VALUE_BOOL: return 1;
    case FERRY_VALUE_U16: case FERRY_VALUE_I16: return 2;
    case FERRY_VALUE_U32: case FERRY_VALUE_I32: case FERRY_VALUE_F32: return 4;
    case FERRY_VALUE_U64: case FERRY_VALUE_I64: case FERRY_VALUE_F64: return 8;
    default: return 0;
    }
}

/* Smallest encoding of one item of an array of T: a string is at least its length, an array at
 * least its element type and count. */
static unsigned min_item_size(uint32_t t)
{
    if (t == FERRY_VALUE_STRING)
        return 8;
    if (t == FERRY_VALUE_ARRAY)
        return 12;
    return scalar_size(t);
}

static int valid_vtype(uint32_t t) { return t <= FERRY_VALUE_F64; }

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double f64_from_bits(uint64_t u)
{
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Decodes a scalar of type T at P (known to be in bounds). */
static int decode_scalar(cursor *c, uint32_t t, const unsigned char *p, ferry_value *out,
                         const char *key)
{
    out->type = (ferry_value_type)t;
    switch (t) {
    case FERRY_VALUE_U8: out->v.u = p[0]; break;
    case FERRY_VALUE_I8: out->v.i = (int8_t)p[0]; break;
    case FERRY_VALUE_U16: out->v.u = ferry__le16(p); break;
    case FERRY_VALUE_I16: out->v.i = (int16_t)ferry__le16(p); break;
    case FERRY_VALUE_U32: out->v.u = ferry__le32(p); break;
    case FERRY_VALUE_I32: out->v.i = (int32_t)ferry__le32(p); break;
    case FERRY_VALUE_F32: out->v.f = f32_from_bits(ferry__le32(p)); break;
    case FERRY_VALUE_U64: out->v.u = ferry__le64(p); break;
    case FERRY_VALUE_I64: out->v.i = (int64_t)ferry__le64(p); break;
    case FERRY_VALUE_F64: out->v.f = f64_from_bits(ferry__le64(p)); break;
    case FERRY_VALUE_BOOL:
        if (p[0] > 1)
            return ferry__fail(c->e, FERRY_EFORMAT,
                               "%s: key '%s': bool value %u at offset %llu is neither 0 nor 1",
                               c->path, key, p[0], (unsigned long long)(p - c->d));
        out->v.u = p[0];
        break;
    default:
        return FERRY_EINVAL; /* not reached: callers pass scalar types only */
    }
    return 0;
}

/* ---- arrays ------------------------------------------------------------------------------------
 * An array value is ONE allocation (the rule is in formats.h, at ferry__kv): its items, then the
 * items of every array nested in it, then the bytes of every string in it, each NUL-terminated.
 * The block's size is known only once the encoded array has been walked, so an array is read in
 * two passes over the same bytes: measure_items checks everything (bounds, types, nesting, the
 * item limit, bool values) and counts items and string bytes; fill_items then decodes what was
 * checked into the block and cannot fail. A vocabulary of 128k tokens thus costs one malloc and
 * one free instead of 128k of each. */

/* Where fill_items puts the next nested items and the next string bytes of a block. */
typedef struct blockfill {
    ferry_value *items;
    char *str;
} blockfill;

/* Reads the head of an array at DEPTH (0: a key's own value): its item type and count. Checks
 * the nesting, the type, that the items could fit in what is left of the file, and the file's
 * limit on array items (which it charges). */
static int rd_array_head(cursor *c, unsigned depth, const char *key, uint32_t *elem, uint64_t *n)
{
    if (depth + 1 > FERRY__MAX_NESTING)
        return ferry__fail(c->e, FERRY_ELIMIT,
                           "%s: key '%s': arrays nested more than %u deep at offset %llu", c->path,
                           key, FERRY__MAX_NESTING, (unsigned long long)c->pos);
    int rc = rd_u32(c, elem, "an array type");
    if (!rc)
        rc = rd_u64(c, n, "an array length");
    if (rc)
        return rc;
    if (!valid_vtype(*elem))
        return ferry__fail(c->e, FERRY_EFORMAT,
                           "%s: key '%s': unknown array item type %u at offset %llu", c->path, key,
                           *elem, (unsigned long long)(c->pos - 12));
    if ((rc = bound(c, *n, min_item_size(*elem), "the array of key", key)))
        return rc;
    if (*n > GGUF_MAX_ITEMS - c->items)
        return ferry__fail(c->e, FERRY_ELIMIT,
                           "%s: key '%s': array of %llu items at offset %llu exceeds the limit of "
                           "%llu metadata array items per file",
                           c->path, key, (unsigned long long)*n, (unsigned long long)(c->pos - 12),
                           (unsigned long long)GGUF_MAX_ITEMS);
    c->items += *n;
    return 0;
}

/* First pass over the N items of type ELEM of an array at DEPTH, from c->pos: checks them and
 * adds the items of nested arrays to *ITEMS and the bytes of strings (NULs included) to *BYTES.
 * Both stay below the file's size plus GGUF_MAX_ITEMS, so they cannot overflow. Leaves c->pos
 * after the array. */
static int measure_items(cursor *c, uint32_t elem, uint64_t n, unsigned depth, uint64_t *items,
                         uint64_t *bytes, const char *key)
{
    unsigned sz = scalar_size(elem);
    if (sz) {
        /* rd_array_head's bound() proved n * sz bytes are there. */
        const unsigned char *p = c->d + c->pos;
        if (elem == FERRY_VALUE_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (p[i] > 1)
                    return ferry__fail(c->e, FERRY_EFORMAT,
                                       "%s: key '%s': bool value %u at offset %llu is neither 0 "
                                       "nor 1",
                                       c->path, key, p[i], (unsigned long long)(c->pos + i));
        c->pos += n * sz;
        return 0;
    }
    if (elem == FERRY_VALUE_STRING) {
        /* The hot loop of a vocabulary: lengths only, within what is in memory. A string that
         * runs past that goes through rd_u64 and bound(), which fetch more or write the
         * message. */
        uint64_t pos = c->pos, sum = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            if (c->avail - pos < 8 || (len = ferry__le64(c->d + pos)) > c->avail - pos - 8) {
                c->pos = pos;
                int rc = rd_u64(c, &len, "a string length");
                if (!rc)
                    rc = bound(c, len, 1, "the string value of key", key);
                if (rc)
                    return rc;
                pos = c->pos + len;
                sum += len + 1;
                continue;
            }
            pos += 8 + len;
            sum += len + 1;
        }
        c->pos = pos;
        *bytes += sum;
        return 0;
    }
    /* FERRY_VALUE_ARRAY: rd_array_head accepts no other non-scalar type. */
    for (uint64_t i = 0; i < n; i++) {
        uint32_t e2 = 0;
        uint64_t n2 = 0;
        int rc = rd_array_head(c, depth + 1, key, &e2, &n2);
        if (rc)
            return rc;
        *items += n2;
        if ((rc = measure_items(c, e2, n2, depth + 1, items, bytes, key)))
            return rc;
    }
    return 0;
}

/* Second pass: decodes the N items of type ELEM at c->pos (checked by measure_items) into OUT,
 * taking nested items and string bytes from BF. Leaves c->pos after the array. */
static void fill_items(cursor *c, uint32_t elem, uint64_t n, ferry_value *out, blockfill *bf)
{
    const unsigned char *p = c->d + c->pos;
    unsigned sz = scalar_size(elem);
    /* One loop per type, so that the type is not decided again for every item. */
    switch (elem) {
#define FILL(VT, FIELD, EXPR)                                                                    \
    for (uint64_t i = 0; i < n; i++, p += sz) {                                                  \
        out[i].type = VT;                                                                        \
        out[i].v.FIELD = (EXPR);                                                                 \
    }                                                                                            \
    break;
    case FERRY_VALUE_U8: FILL(FERRY_VALUE_U8, u, p[0])
    case FERRY_VALUE_BOOL: FILL(FERRY_VALUE_BOOL, u, p[0])
    case FERRY_VALUE_I8: FILL(FERRY_VALUE_I8, i, (int8_t)p[0])
    case FERRY_VALUE_U16: FILL(FERRY_VALUE_U16, u, ferry__le16(p))
    case FERRY_VALUE_I16: FILL(FERRY_VALUE_I16, i, (int16_t)ferry__le16(p))
    case FERRY_VALUE_U32: FILL(FERRY_VALUE_U32, u, ferry__le32(p))
    case FERRY_VALUE_I32: FILL(FERRY_VALUE_I32, i, (int32_t)ferry__le32(p))
    case FERRY_VALUE_F32: FILL(FERRY_VALUE_F32, f, f32_from_bits(ferry__le32(p)))
    case FERRY_VALUE_U64: FILL(FERRY_VALUE_U64, u, ferry__le64(p))
    case FERRY_VALUE_I64: FILL(FERRY_VALUE_I64, i, (int64_t)ferry__le64(p))
    case FERRY_VALUE_F64: FILL(FERRY_VALUE_F64, f, f64_from_bits(ferry__le64(p)))
#undef FILL
    case FERRY_VALUE_STRING:
        for (uint64_t i = 0; i < n; i++) {
            size_t len = (size_t)ferry__le64(p);
            p += 8;
            memcpy(bf->str, p, len);
            bf->str[len] = 0;
            out[i].type = FERRY_VALUE_STRING;
            out[i].v.str.ptr = bf->str;
            out[i].v.str.len = len;
            bf->str += len + 1;
            p += len;
        }
        break;
    case FERRY_VALUE_ARRAY:
        for (uint64_t i = 0; i < n; i++) {
            uint32_t e2 = ferry__le32(p);
            uint64_t n2 = ferry__le64(p + 4);
            out[i].type = FERRY_VALUE_ARRAY;
            out[i].v.arr.elem = (ferry_value_type)e2;
            out[i].v.arr.n = n2;
            out[i].v.arr.items = n2 ? bf->items : NULL;
            bf->items += n2;
            c->pos = (uint64_t)(p + 12 - c->d);
            fill_items(c, e2, n2, (ferry_value *)out[i].v.arr.items, bf);
            p = c->d + c->pos;
        }
        break;
    }
    c->pos = (uint64_t)(p - c->d);
}

/* Reads a value of type T into *OUT (zeroed by the caller): a key's own value. On failure *OUT
 * holds only what ferry__value_free releases. */
static int rd_value(cursor *c, uint32_t t, ferry_value *out, const char *key)
{
    if (!valid_vtype(t))
        return ferry__fail(c->e, FERRY_EFORMAT, "%s: key '%s': unknown value type %u at offset %llu",
                           c->path, key, t, (unsigned long long)c->pos);
    if (t == FERRY_VALUE_STRING) {
        uint64_t len;
        int rc = rd_u64(c, &len, "a string length");
        if (rc)
            return rc;
        if ((rc = bound(c, len, 1, "the string value of key", key)))
            return rc;
        char *s = malloc((size_t)len + 1);
        if (!s)
            return ferry__fail(c->e, FERRY_ENOMEM, "%s: key '%s': out of memory for a %llu-byte "
                               "string", c->path, key, (unsigned long long)len);
        memcpy(s, c->d + c->pos, (size_t)len);
        s[len] = 0;
        c->pos += len;
        out->type = FERRY_VALUE_STRING;
        out->v.str.ptr = s;
        out->v.str.len = len;
        return 0;
    }
    if (t != FERRY_VALUE_ARRAY) {
        unsigned n = scalar_size(t);
        int rc = need(c, n, "a metadata value");
        if (rc)
            return rc;
        if ((rc = decode_scalar(c, t, c->d + c->pos, out, key)))
            return rc;
        c->pos += n;
        return 0;
    }

    uint32_t elem;
    uint64_t n;
    int rc = rd_array_head(c, 0, key, &elem, &n);
    if (rc)
        return rc;
    out->type = FERRY_VALUE_ARRAY;
    out->v.arr.elem = (ferry_value_type)elem;
    out->v.arr.n = 0;
    out->v.arr.items = NULL;
    if (n == 0)
        return 0;
    uint64_t body = c->pos, n_items = n, n_bytes = 0, size;
    if ((rc = measure_items(c, elem, n, 0, &n_items, &n_bytes, key)))
        return rc;
    uint64_t end = c->pos;
    if (ferry__mul_u64(n_items, sizeof(ferry_value), &size) ||
        ferry__add_u64(size, n_bytes, &size) || size > SIZE_MAX)
        return ferry__fail(c->e, FERRY_EOVERFLOW, "%s: key '%s': array of %llu items and %llu "
                           "string bytes is too large", c->path, key,
                           (unsigned long long)n_items, (unsigned long long)n_bytes);
    ferry_value *block = malloc((size_t)size);
    if (!block)
        return ferry__fail(c->e, FERRY_ENOMEM, "%s: key '%s': out of memory for %llu array items "
                           "(%llu bytes)", c->path, key, (unsigned long long)n_items,
                           (unsigned long long)size);
    blockfill bf = {block + n, (char *)(block + n_items)};
    c->pos = body;
    fill_items(c, elem, n, block, &bf);
    if (c->pos != end || bf.items != block + n_items || bf.str != (char *)block + size)
        abort(); /* the two passes disagree: a bug here, not a bad file */
    out->v.arr.n = n;
    out->v.arr.items = block;
    return 0;
}

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

int ferry__gguf_parse(const unsigned char *data, uint64_t size, const char *path,
                      ferry__parsed *out, ferry__err *e)
{
    ferry__src src = {data, size, size, NULL, NULL};
    return ferry__gguf_read(&src, path, out, e);
}

int ferry__gguf_read(ferry__src *src, const char *path, ferry__parsed *out, ferry__err *e)
{
    memset(out, 0, sizeof *out);
    uint64_t size = src->size;
    cursor cur = {src->data, FERRY__MIN(src->avail, size), size, 0, src, path, e, 0}, *c = &cur;
    ferry__hmap keys = {0};
    int rc;

    if (size < 4)
        return ferry__fail(e, FERRY_EFORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", path);
    if ((rc = fetch(c, 4)))
        return rc;
    if (memcmp(c->d, "GGUF", 4) != 0)
        return ferry__fail(e, FERRY_EFORMAT, "%s: not a GGUF file (no \"GGUF\" magic)", path);
    c->pos = 4;
    uint32_t version;
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u32(c, &version, "the header")))
        return rc;
    if (version != 2 && version != 3) {
        uint32_t swapped = __builtin_bswap32(version);
        if (swapped == 2 || swapped == 3)
            return ferry__fail(e, FERRY_EFORMAT,
                               "%s: big-endian GGUF (version %u byte-swapped) is not supported",
                               path, swapped);
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: GGUF version %u is not supported (only versions 2 and 3)", path,
                           version);
    }
    if ((rc = rd_u64(c, &n_tensors, "the header")) || (rc = rd_u64(c, &n_kv, "the header")))
        return rc;
    out->format = FERRY_FORMAT_GGUF;
    out->gguf_version = version;
    out->alignment = GGUF_DEFAULT_ALIGNMENT;

    /* Both sections must fit in what is left, at their smallest encodings. */
    uint64_t need_kv, need_info, need_all;
    if (ferry__mul_u64(n_kv, GGUF_MIN_KV, &need_kv) || ferry__mul_u64(n_tensors, GGUF_MIN_INFO,
                                                                      &need_info) ||
        ferry__add_u64(need_kv, need_info, &need_all) || need_all > size)
        return ferry__fail(e, FERRY_ELIMIT,
                           "%s: header declares %llu key/values and %llu tensors, more than the "
                           "%llu-byte file could hold",
                           path, (unsigned long long)n_kv, (unsigned long long)n_tensors,
                           (unsigned long long)size);
    if (need_all > left(c))
        return ferry__fail(e, FERRY_ETRUNC,
                           "%s: file ends at %llu bytes; %llu key/values and %llu tensors need at "
                           "least %llu bytes after the header",
                           path, (unsigned long long)size, (unsigned long long)n_kv,
                           (unsigned long long)n_tensors, (unsigned long long)need_all);

    if (n_kv) {
        size_t pre = (size_t)FERRY__MIN(n_kv, GGUF_PREALLOC);
        out->meta = malloc(pre * sizeof *out->meta);
        if (!out->meta || ferry__hmap_reserve(&keys, pre)) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for %llu key/values", path,
                             (unsigned long long)n_kv);
            goto fail;
        }
        out->cap_meta = pre;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        char *key = NULL;
        if ((rc = rd_name(c, "metadata key", &key)))
            goto fail;
        uint64_t first;
        if (ferry__hmap_get(&keys, key, &first)) {
            rc = ferry__fail(e, FERRY_EDUP, "%s: metadata key '%s' appears twice (entries %llu "
                             "and %llu)", path, key, (unsigned long long)first,
                             (unsigned long long)i);
            free(key);
            goto fail;
        }
        uint32_t t;
        ferry_value v;
        memset(&v, 0, sizeof v);
        if ((rc = rd_u32(c, &t, "a value type")) || (rc = rd_value(c, t, &v, key))) {
            ferry__value_free(&v);
            free(key);
            goto fail;
        }
        if (ferry__parsed_add_meta(out, key, &v)) {
            ferry__value_free(&v);
            free(key);
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for key/values", path);
            goto fail;
        }
        /* KEY now belongs to OUT; the map only points at it. */
        if (ferry__hmap_put(&keys, key, i, NULL)) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for key/values", path);
            goto fail;
        }
    }

    uint64_t ai;
    if (ferry__hmap_get(&keys, "general.alignment", &ai)) {
        const ferry_value *v = &out->meta[ai].val;
        if (v->type != FERRY_VALUE_U32) {
            rc = ferry__fail(e, FERRY_ETYPE, "%s: general.alignment is a %s, not a u32", path,
                             vtype_name(v->type));
            goto fail;
        }
        if (!is_pow2(v->v.u) || v->v.u > GGUF_MAX_ALIGNMENT) {
            rc = ferry__fail(e, FERRY_EALIGN,
                             "%s: general.alignment %llu is not a power of two between 1 and %llu",
                             path, (unsigned long long)v->v.u,
                             (unsigned long long)GGUF_MAX_ALIGNMENT);
            goto fail;
        }
        out->alignment = v->v.u;
    }
    ferry__hmap_free(&keys);

    if (n_tensors) {
        size_t pre = (size_t)FERRY__MIN(n_tensors, 16 * GGUF_PREALLOC);
        out->tensors = malloc(pre * sizeof *out->tensors);
        if (!out->tensors) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for %llu tensors", path,
                             (unsigned long long)n_tensors);
            goto fail;
        }
        out->cap_tensors = pre;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        ferry__tdesc t;
        memset(&t, 0, sizeof t);
        if ((rc = rd_name(c, "tensor name", &t.name)))
            goto fail;
        uint32_t nd, type;
        uint64_t ne[FERRY_MAX_DIMS], rel;
        if ((rc = rd_u32(c, &nd, "a tensor info")))
            goto fail_t;
        if (nd > FERRY_MAX_DIMS) {
            rc = ferry__fail(e, FERRY_ELIMIT, "%s: tensor '%s' has %u dimensions (limit %d)", path,
                             t.name, nd, FERRY_MAX_DIMS);
            goto fail_t;
        }
        if ((rc = need(c, (uint64_t)nd * 8 + 12, "a tensor info")))
            goto fail_t;
        for (uint32_t d = 0; d < nd; d++)
            ne[d] = ferry__le64(c->d + c->pos + 8 * d);
        c->pos += (uint64_t)nd * 8;
        type = ferry__le32(c->d + c->pos);
        rel = ferry__le64(c->d + c->pos + 4);
        c->pos += 12;

        uint64_t n_elems = 1;
        for (uint32_t d = 0; d < nd; d++) {
            if (ne[d] > (uint64_t)INT64_MAX) {
                rc = ferry__fail(e, FERRY_ESHAPE, "%s: tensor '%s': dimension %u is negative "
                                 "(%lld)", path, t.name, d, (long long)(int64_t)ne[d]);
                goto fail_t;
            }
            if (ferry__mul_u64(n_elems, ne[d], &n_elems)) {
                rc = ferry__fail(e, FERRY_EOVERFLOW,
                                 "%s: tensor '%s': element count overflows at dimension %u (%llu)",
                                 path, t.name, d, (unsigned long long)ne[d]);
                goto fail_t;
            }
            t.shape[d] = (int64_t)ne[d];
        }
        t.ndim = nd;
        if ((rc = ferry__dtype_from_gguf(type, &t.dtype))) {
            rc = ferry__fail(e, FERRY_EDTYPE, "%s: tensor '%s': unknown or retired GGUF type %u",
                             path, t.name, type);
            goto fail_t;
        }
        uint64_t row = nd ? ne[0] : 1;
        uint32_t blk = ferry_dtype_block_elems(t.dtype);
        if (blk > 1 && row % blk) {
            rc = ferry__fail(e, FERRY_ESHAPE,
                             "%s: tensor '%s': row of %llu elements is not a whole number of %s "
                             "blocks of %u",
                             path, t.name, (unsigned long long)row, ferry_dtype_name(t.dtype), blk);
            goto fail_t;
        }
        if ((rc = ferry_dtype_nbytes(t.dtype, n_elems, &t.nbytes))) {
            rc = ferry__fail(e, rc,
                             "%s: tensor '%s': %llu elements of %s %s", path, t.name,
                             (unsigned long long)n_elems, ferry_dtype_name(t.dtype),
                             rc == FERRY_EOVERFLOW ? "overflow 64 bits in bytes"
                                                   : "are not a whole number of blocks");
            goto fail_t;
        }
        if (rel % out->alignment) {
            rc = ferry__fail(e, FERRY_EALIGN,
                             "%s: tensor '%s': data offset %llu is not a multiple of the "
                             "alignment %llu",
                             path, t.name, (unsigned long long)rel,
                             (unsigned long long)out->alignment);
            goto fail_t;
        }
        t.offset = rel; /* made absolute below, once the data section's start is known */
        if (ferry__parsed_add_tensor(out, &t)) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for %llu tensors", path,
                             (unsigned long long)n_tensors);
            goto fail_t;
        }
        continue;
    fail_t:
        free(t.name);
        goto fail;
    }

    /* pos <= size < 2^64 and alignment <= 1 MiB: rounding up cannot overflow past 2^64 unless the
     * file is absurd; check anyway. */
    if (ferry__align_up(c->pos, out->alignment, &out->data_offset)) {
        rc = ferry__fail(e, FERRY_EOVERFLOW, "%s: data section start overflows", path);
        goto fail;
    }
    for (size_t i = 0; i < out->n_tensors; i++) {
        ferry__tdesc *t = &out->tensors[i];
        uint64_t rel = t->offset;
        if (ferry__add_u64(out->data_offset, rel, &t->offset)) {
            rc = ferry__fail(e, FERRY_EOVERFLOW,
                             "%s: tensor '%s': data offset %llu + data section %llu overflows",
                             path, t->name, (unsigned long long)rel,
                             (unsigned long long)out->data_offset);
            goto fail;
        }
    }
    if ((rc = ferry__parsed_check(out, path, size, e)))
        goto fail;
    return 0;

fail:
    ferry__hmap_free(&keys);
    ferry__parsed_free(out);
    return rc;
}

/* ---- split files ---------------------------------------------------------------------------- */

static int split_value(const ferry__parsed *p, const char *path, const char *key, int *found,
                       uint32_t *out, ferry__err *e)
{
    *found = 0;
    for (size_t i = 0; i < p->n_meta; i++) {
        if (strcmp(p->meta[i].key, key) != 0)
            continue;
        const ferry_value *v = &p->meta[i].val;
        uint64_t u;
        switch (v->type) {
        case FERRY_VALUE_U8: case FERRY_VALUE_U16: case FERRY_VALUE_U32: case FERRY_VALUE_U64:
            u = v->v.u;
            break;
        case FERRY_VALUE_I8: case FERRY_VALUE_I16: case FERRY_VALUE_I32: case FERRY_VALUE_I64:
            if (v->v.i < 0)
                return ferry__fail(e, FERRY_EFORMAT, "%s: %s is negative (%lld)", path, key,
                                   (long long)v->v.i);
            u = (uint64_t)v->v.i;
            break;
        default:
            return ferry__fail(e, FERRY_ETYPE, "%s: %s is a %s, not an integer", path, key,
                               vtype_name(v->type));
        }
        if (u > UINT32_MAX)
            return ferry__fail(e, FERRY_ELIMIT, "%s: %s is %llu (limit %u)", path, key,
                               (unsigned long long)u, UINT32_MAX);
        *out = (uint32_t)u;
        *found = 1;
        return 0;
    }
    return 0;
}

int ferry__gguf_split_info(const ferry__parsed *p, const char *path, uint32_t *split_no,
                           uint32_t *split_count, ferry__err *e)
{
    uint32_t no = 0, count = 1;
    int has_no, has_count, rc;
    if ((rc = split_value(p, path, "split.no", &has_no, &no, e)) ||
        (rc = split_value(p, path, "split.count", &has_count, &count, e)))
        return rc;
    if (has_count && count == 0)
        return ferry__fail(e, FERRY_EFORMAT, "%s: split.count is 0", path);
    if (no >= count)
        return ferry__fail(e, FERRY_EFORMAT, "%s: split.no %u is not below split.count %u", path,
                           no, count);
    *split_no = no;
    *split_count = count;
    return 0;
}

/* ---- writing -------------------------------------------------------------------------------- */

typedef struct obuf {
    unsigned char *p;
    size_t len, cap;
    int oom;
} obuf;

static void ob_put(obuf *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (n > b->cap - b->len) {
        size_t ncap = b->cap ? b->cap : 4096;
        while (ncap - b->len < n) {
            if (ncap > SIZE_MAX / 2) {
                b->oom = 1;
                return;
            }
            ncap *= 2;
        }
        unsigned char *q = realloc(b->p, ncap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = ncap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void ob_u32(obuf *b, uint32_t v)
{
    unsigned char q[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    ob_put(b, q, 4);
}

static void ob_u64(obuf *b, uint64_t v)
{
    ob_u32(b, (uint32_t)v);
    ob_u32(b, (uint32_t)(v >> 32));
}

static void ob_str(obuf *b, const char *s, uint64_t n)
{
    ob_u64(b, n);
    ob_put(b, s, (size_t)n);
}

/* Whether V's number fits its declared integer type (ferry_value holds them in 64 bits). */
static int int_fits(const ferry_value *v)
{
    switch (v->type) {
    case FERRY_VALUE_U8: return v->v.u <= UINT8_MAX;
    case FERRY_VALUE_U16: return v->v.u <= UINT16_MAX;
    case FERRY_VALUE_U32: return v->v.u <= UINT32_MAX;
    case FERRY_VALUE_I8: return v->v.i >= INT8_MIN && v->v.i <= INT8_MAX;
    case FERRY_VALUE_I16: return v->v.i >= INT16_MIN && v->v.i <= INT16_MAX;
    case FERRY_VALUE_I32: return v->v.i >= INT32_MIN && v->v.i <= INT32_MAX;
    case FERRY_VALUE_BOOL: return v->v.u <= 1;
    default: return 1;
    }
}

/* Writes V's payload (not its type). DEPTH counts the arrays around it. */
static int put_value(obuf *b, const ferry_value *v, unsigned depth, const char *key,
                     ferry__err *e)
{
    unsigned char q[8];
    if (!int_fits(v))
        return ferry__fail(e, FERRY_EINVAL, "key '%s': value %lld does not fit a %s", key,
                           (long long)v->v.i, vtype_name(v->type));
    switch (v->type) {
    case FERRY_VALUE_U8: case FERRY_VALUE_I8: case FERRY_VALUE_BOOL:
        q[0] = (unsigned char)v->v.u;
        ob_put(b, q, 1);
        return 0;
    case FERRY_VALUE_U16: case FERRY_VALUE_I16:
        q[0] = (unsigned char)v->v.u, q[1] = (unsigned char)(v->v.u >> 8);
        ob_put(b, q, 2);
        return 0;
    case FERRY_VALUE_U32: case FERRY_VALUE_I32:
        ob_u32(b, (uint32_t)v->v.u);
        return 0;
    case FERRY_VALUE_U64: case FERRY_VALUE_I64:
        ob_u64(b, v->v.u);
        return 0;
    case FERRY_VALUE_F32: {
        float f = (float)v->v.f;
        uint32_t u;
        memcpy(&u, &f, 4);
        ob_u32(b, u);
        return 0;
    }
    case FERRY_VALUE_F64: {
        uint64_t u;
        memcpy(&u, &v->v.f, 8);
        ob_u64(b, u);
        return 0;
    }
    case FERRY_VALUE_STRING:
        if (v->v.str.len && !v->v.str.ptr)
            return ferry__fail(e, FERRY_EINVAL, "key '%s': string without data", key);
        ob_str(b, v->v.str.len ? v->v.str.ptr : "", v->v.str.len);
        return 0;
    case FERRY_VALUE_ARRAY: {
        if (depth + 1 > FERRY__MAX_NESTING)
            return ferry__fail(e, FERRY_ELIMIT, "key '%s': arrays nested more than %u deep", key,
                               FERRY__MAX_NESTING);
        if (!valid_vtype(v->v.arr.elem))
            return ferry__fail(e, FERRY_EINVAL, "key '%s': unknown array item type %d", key,
                               (int)v->v.arr.elem);
        if (v->v.arr.n && !v->v.arr.items)
            return ferry__fail(e, FERRY_EINVAL, "key '%s': array without items", key);
        ob_u32(b, (uint32_t)v->v.arr.elem);
        ob_u64(b, v->v.arr.n);
        for (uint64_t i = 0; i < v->v.arr.n; i++) {
            const ferry_value *it = &v->v.arr.items[i];
            if (it->type != v->v.arr.elem)
                return ferry__fail(e, FERRY_EINVAL,
                                   "key '%s': array item %llu is a %s in an array of %s", key,
                                   (unsigned long long)i, vtype_name(it->type),
                                   vtype_name(v->v.arr.elem));
            int rc = put_value(b, it, depth + 1, key, e);
            if (rc)
                return rc;
        }
        return 0;
    }
    }
    return ferry__fail(e, FERRY_EINVAL, "key '%s': unknown value type %d", key, (int)v->type);
}

int ferry__gguf_serialize(ferry__parsed *p, unsigned char **out, size_t *len, ferry__err *e)
{
    *out = NULL;
    *len = 0;
    uint64_t align = p->alignment;
    const ferry_value *akey = NULL;
    for (size_t i = 0; i < p->n_meta; i++) {
        if (strcmp(p->meta[i].key, "general.alignment") != 0)
            continue;
        akey = &p->meta[i].val;
        if (akey->type != FERRY_VALUE_U32)
            return ferry__fail(e, FERRY_ETYPE, "general.alignment is a %s, not a u32",
                               vtype_name(akey->type));
        if (align == 0)
            align = akey->v.u;
        else if (akey->v.u != align)
            return ferry__fail(e, FERRY_EINVAL,
                               "general.alignment %llu differs from the alignment %llu asked for",
                               (unsigned long long)akey->v.u, (unsigned long long)align);
    }
    if (align == 0)
        align = GGUF_DEFAULT_ALIGNMENT;
    if (!is_pow2(align) || align > GGUF_MAX_ALIGNMENT)
        return ferry__fail(e, FERRY_EALIGN,
                           "alignment %llu is not a power of two between 1 and %llu",
                           (unsigned long long)align, (unsigned long long)GGUF_MAX_ALIGNMENT);
    /* A non-default alignment must be recorded in the file, or readers would assume 32. */
    int add_akey = !akey && align != GGUF_DEFAULT_ALIGNMENT;

    obuf b = {0};
    int rc = 0;
    ob_put(&b, "GGUF", 4);
    ob_u32(&b, 3);
    ob_u64(&b, p->n_tensors);
    ob_u64(&b, (uint64_t)p->n_meta + (uint64_t)add_akey);
    for (size_t i = 0; i < p->n_meta; i++) {
        const ferry__kv *kv = &p->meta[i];
        size_t kl = strlen(kv->key);
        if (kl == 0 || kl > FERRY__MAX_NAME) {
            rc = ferry__fail(e, kl ? FERRY_ELIMIT : FERRY_EINVAL,
                             "metadata key of %zu bytes (must be 1 to %u)", kl, FERRY__MAX_NAME);
            goto fail;
        }
        ob_str(&b, kv->key, kl);
        ob_u32(&b, (uint32_t)kv->val.type);
        if ((rc = put_value(&b, &kv->val, 0, kv->key, e)))
            goto fail;
    }
    if (add_akey) {
        ob_str(&b, "general.alignment", strlen("general.alignment"));
        ob_u32(&b, FERRY_VALUE_U32);
        ob_u32(&b, (uint32_t)align);
    }
    uint64_t rel = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        ferry__tdesc *t = &p->tensors[i];
        size_t nl = strlen(t->name);
        if (nl == 0 || nl > FERRY__MAX_NAME) {
            rc = ferry__fail(e, nl ? FERRY_ELIMIT : FERRY_EINVAL,
                             "tensor name of %zu bytes (must be 1 to %u)", nl, FERRY__MAX_NAME);
            goto fail;
        }
        if (!ferry__dtype_in_gguf(t->dtype)) {
            rc = ferry__fail(e, FERRY_EDTYPE, "tensor '%s': type %s does not exist in GGUF",
                             t->name, ferry_dtype_name(t->dtype));
            goto fail;
        }
        if (t->ndim > FERRY_MAX_DIMS) {
            rc = ferry__fail(e, FERRY_ELIMIT, "tensor '%s': %u dimensions (limit %d)", t->name,
                             t->ndim, FERRY_MAX_DIMS);
            goto fail;
        }
        if (ferry__align_up(rel, align, &rel)) {
            rc = ferry__fail(e, FERRY_EOVERFLOW, "tensor '%s': offset overflows", t->name);
            goto fail;
        }
        ob_str(&b, t->name, nl);
        ob_u32(&b, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) {
                rc = ferry__fail(e, FERRY_ESHAPE, "tensor '%s': dimension %u is negative (%lld)",
                                 t->name, d, (long long)t->shape[d]);
                goto fail;
            }
            ob_u64(&b, (uint64_t)t->shape[d]);
        }
        ob_u32(&b, (uint32_t)t->dtype);
        ob_u64(&b, rel);
        t->offset = rel; /* relative for now */
        if (ferry__add_u64(rel, t->nbytes, &rel)) {
            rc = ferry__fail(e, FERRY_EOVERFLOW, "tensor '%s': offset overflows", t->name);
            goto fail;
        }
    }
    size_t hdr = b.len;
    uint64_t padded;
    if (ferry__align_up(hdr, align, &padded)) {
        rc = ferry__fail(e, FERRY_EOVERFLOW, "header size overflows");
        goto fail;
    }
    static const unsigned char zeros[64];
    while (!b.oom && b.len < padded) {
        size_t n = FERRY__MIN((size_t)(padded - b.len), sizeof zeros);
        ob_put(&b, zeros, n);
    }
    if (b.oom) {
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory writing a GGUF header");
        goto fail;
    }
    for (size_t i = 0; i < p->n_tensors; i++) {
        if (ferry__add_u64(p->tensors[i].offset, b.len, &p->tensors[i].offset)) {
            rc = ferry__fail(e, FERRY_EOVERFLOW, "tensor '%s': offset overflows",
                             p->tensors[i].name);
            goto fail;
        }
    }
    p->data_offset = b.len;
    p->alignment = align;
    p->format = FERRY_FORMAT_GGUF;
    p->gguf_version = 3;
    *out = b.p;
    *len = b.len;
    return 0;

fail:
    free(b.p);
    return rc;
}
