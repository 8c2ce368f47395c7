/*
 * json.c — a strict JSON (RFC 8259) parser for untrusted input, and the small output buffer the
 * writers use to produce JSON.
 *
 * The parser reads safetensors headers and shard indexes, which come from files anyone can craft:
 * it bounds nesting depth, string, key and number lengths, the document size and the number of
 * values (so that the DOM cannot grow far beyond the text), validates UTF-8, decodes escapes
 * (surrogate pairs included, lone surrogates refused) and refuses duplicate keys.
 *
 * It is linear and allocation-light: children of open containers collect on one shared scratch
 * stack and are copied into an exactly-sized array when their container closes; strings are
 * decoded into one reusable scratch buffer and then copied once. Duplicate keys are found by
 * pairwise comparison in small objects and with a hash set in large ones (an index's weight map).
 * ferry__json_parse_members hands the root object's members to a callback one by one instead of
 * keeping them, so that a safetensors header of a million tensors never exists as one DOM.
 *
 * Ownership: a parsed DOM owns its strings, keys and arrays (ferry__json_free), but a NUMBER's
 * text points into the parsed document, which must outlive the DOM.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "formats/json_priv.h"

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

/* Length (2..4) of the valid multi-byte UTF-8 sequence at S (N bytes available, S[0] >= 0x80),
 * or 0 when it is not one: a bare continuation byte, an overlong form, a surrogate, a code point
 * above U+10FFFF, or a sequence cut short. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    size_t len;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* below: overlong */
        else if (c == 0xED)
            hi = 0x9F; /* above: U+D800..U+DFFF, surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90; /* below: overlong */
        else if (c == 0xF4)
            hi = 0x8F; /* above: beyond U+10FFFF */
    } else {
        return 0; /* 0x80..0xC1 (continuation, overlong lead), 0xF5..0xFF */
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

int ferry__utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

static size_t utf8_put(unsigned char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Bytes that may appear unescaped inside a JSON string: everything but '"', '\\', controls and
 * non-ASCII (which goes through UTF-8 validation). */
static int json_plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

/* ---- the parser ------------------------------------------------------------------------------ */

typedef struct jparser {
    const unsigned char *s;
    size_t len, pos;
    const char *path;
    ferry__err *e;
    uint64_t n_values;
    /* Children of the open containers, innermost last. Everything on these stacks is owned by
     * them until its container closes; on failure the whole stacks are freed. */
    ferry__json *vals;
    size_t n_vals, cap_vals;
    char **keys;
    size_t *key_pos; /* byte offset of each key, for messages */
    size_t n_keys, cap_keys;
    /* Scratch for decoding one string. */
    unsigned char *sb;
    size_t cap_sb;
    /* ferry__json_parse_members: the root object's members go to this callback, not the DOM */
    ferry__json_member_fn member_fn;
    void *member_arg;
} jparser;

static int jfail(jparser *p, int code, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int jfail(jparser *p, int code, size_t at, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ferry__fail(p->e, code, "%s: JSON: %s at byte %zu", p->path, what, at);
}

static int joom(jparser *p) { return jfail(p, FERRY_ENOMEM, p->pos, "out of memory"); }

/* A character for messages: itself when printable ASCII, else its hex value. */
static const char *show_char(unsigned char c, char buf[8])
{
    if (c > 0x20 && c < 0x7F)
        snprintf(buf, 8, "'%c'", c);
    else
        snprintf(buf, 8, "0x%02X", c);
    return buf;
}

static void skip_ws(jparser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t')
            break;
        p->pos++;
    }
}

static int count_value(jparser *p)
{
    if (++p->n_values > FERRY__JSON_MAX_VALUES)
        return jfail(p, FERRY_ELIMIT, p->pos, "more than %llu values",
                     (unsigned long long)FERRY__JSON_MAX_VALUES);
    return 0;
}

static int hex4(const unsigned char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        uint32_t d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* Parses the string literal at p->pos (a '"') into a fresh malloc'd NUL-terminated copy. MAX is
 * the limit on decoded bytes; IS_KEY refuses NUL characters. */
static int parse_string(jparser *p, size_t max, int is_key, char **out, size_t *out_len)
{
    size_t start = p->pos;
    size_t n = 0; /* decoded bytes in p->sb */
    p->pos++;
    for (;;) {
        /* A run of bytes that need no decoding, then at most one thing that does. */
        size_t run = p->pos;
        while (run < p->len && json_plain(p->s[run]))
            run++;
        run -= p->pos;
        if (n + run > max)
            return jfail(p, FERRY_ELIMIT, start, "%s longer than %zu bytes",
                         is_key ? "object key" : "string", max);
        /* Room for the run, the longest thing one step appends (4 bytes), the terminator. */
        if (n + run + 5 > p->cap_sb) {
            size_t ncap = p->cap_sb ? p->cap_sb : 256;
            while (ncap < n + run + 5)
                ncap *= 2;
            unsigned char *nb = realloc(p->sb, ncap);
            if (!nb)
                return joom(p);
            p->sb = nb, p->cap_sb = ncap;
        }
        memcpy(p->sb + n, p->s + p->pos, run);
        n += run;
        p->pos += run;
        if (p->pos >= p->len)
            return jfail(p, FERRY_EJSON, start, "unterminated string");
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20)
            return jfail(p, FERRY_EJSON, p->pos, "control character 0x%02X in string", c);
        if (c == '\\') {
            size_t esc = p->pos;
            if (p->pos + 1 >= p->len)
                return jfail(p, FERRY_EJSON, start, "unterminated string");
            unsigned char x = p->s[p->pos + 1];
            p->pos += 2;
            switch (x) {
            case '"': p->sb[n++] = '"'; break;
            case '\\': p->sb[n++] = '\\'; break;
            case '/': p->sb[n++] = '/'; break;
            case 'b': p->sb[n++] = '\b'; break;
            case 'f': p->sb[n++] = '\f'; break;
            case 'n': p->sb[n++] = '\n'; break;
            case 'r': p->sb[n++] = '\r'; break;
            case 't': p->sb[n++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (p->len - p->pos < 4 || hex4(p->s + p->pos, &cp))
                    return jfail(p, FERRY_EJSON, esc, "bad \\u escape");
                p->pos += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return jfail(p, FERRY_EJSON, esc, "lone low surrogate \\u%04X", cp);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                        hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return jfail(p, FERRY_EJSON, esc,
                                     "high surrogate \\u%04X not followed by a low surrogate", cp);
                    p->pos += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0 && is_key)
                    return jfail(p, FERRY_EJSON, esc, "NUL character in an object key");
                n += utf8_put(p->sb + n, cp);
                break;
            }
            default: {
                char cb[8];
                return jfail(p, FERRY_EJSON, esc, "bad escape \\%s", show_char(x, cb));
            }
            }
        } else {
            size_t k = utf8_seq(p->s + p->pos, p->len - p->pos);
            if (!k)
                return jfail(p, FERRY_EJSON, p->pos, "invalid UTF-8 in string");
            memcpy(p->sb + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
        }
        if (n > max)
            return jfail(p, FERRY_ELIMIT, start, "%s longer than %zu bytes",
                         is_key ? "object key" : "string", max);
    }
    char *s = malloc(n + 1);
    if (!s)
        return joom(p);
    memcpy(s, p->sb, n);
    s[n] = 0;
    *out = s;
    *out_len = n;
    return 0;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(jparser *p, ferry__json *out)
{
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    if (i < p->len && s[i] == '-')
        i++;
    if (i >= p->len || !is_digit(s[i]))
        return jfail(p, FERRY_EJSON, start, "bad number (no digit after '-')");
    if (s[i] == '0') {
        i++;
        if (i < p->len && is_digit(s[i]))
            return jfail(p, FERRY_EJSON, start, "bad number (leading zero)");
    } else {
        while (i < p->len && is_digit(s[i]))
            i++;
    }
    if (i < p->len && s[i] == '.') {
        i++;
        if (i >= p->len || !is_digit(s[i]))
            return jfail(p, FERRY_EJSON, start, "bad number (no digit after '.')");
        while (i < p->len && is_digit(s[i]))
            i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= p->len || !is_digit(s[i]))
            return jfail(p, FERRY_EJSON, start, "bad number (no digit in exponent)");
        while (i < p->len && is_digit(s[i]))
            i++;
    }
    if (i - start > FERRY__JSON_MAX_NUMBER)
        return jfail(p, FERRY_ELIMIT, start, "number of %zu characters (limit %d)", i - start,
                     FERRY__JSON_MAX_NUMBER);
    out->type = FERRY__JSON_NUMBER;
    out->num = (const char *)s + start;
    out->num_len = i - start;
    p->pos = i;
    return 0;
}

static int push_val(jparser *p, const ferry__json *v)
{
    if (p->n_vals == p->cap_vals) {
        size_t ncap = p->cap_vals ? p->cap_vals * 2 : 64;
        ferry__json *nv = realloc(p->vals, ncap * sizeof *nv);
        if (!nv)
            return joom(p);
        p->vals = nv, p->cap_vals = ncap;
    }
    p->vals[p->n_vals++] = *v;
    return 0;
}

static int push_key(jparser *p, char *k, size_t at)
{
    if (p->n_keys == p->cap_keys) {
        size_t ncap = p->cap_keys ? p->cap_keys * 2 : 64;
        char **nk = realloc(p->keys, ncap * sizeof *nk);
        if (!nk)
            return joom(p);
        p->keys = nk;
        size_t *np = realloc(p->key_pos, ncap * sizeof *np);
        if (!np)
            return joom(p);
        p->key_pos = np, p->cap_keys = ncap;
    }
    p->keys[p->n_keys] = k;
    p->key_pos[p->n_keys] = at;
    p->n_keys++;
    return 0;
}

/* The N keys at the top of the key stack (one object's) are distinct: FERRY_EDUP naming the
 * second occurrence otherwise. */
static int check_dups(jparser *p, size_t base, size_t n)
{
    char **k = p->keys + base;
    if (n <= 12) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (strcmp(k[i], k[j]) == 0)
                    return jfail(p, FERRY_EDUP, p->key_pos[base + i], "duplicate key \"%.200s\"",
                                 k[i]);
        return 0;
    }
    ferry__hmap set = {0};
    if (ferry__hmap_reserve(&set, n))
        return joom(p);
    for (size_t i = 0; i < n; i++) {
        int rc = ferry__hmap_put(&set, k[i], i, NULL);
        if (rc) {
            ferry__hmap_free(&set);
            if (rc == FERRY_EDUP)
                return jfail(p, FERRY_EDUP, p->key_pos[base + i], "duplicate key \"%.200s\"",
                             k[i]);
            return joom(p);
        }
    }
    ferry__hmap_free(&set);
    return 0;
}

static int parse_value(jparser *p, ferry__json *out, int depth);

/* Moves the values (and keys) above BASE off the stacks into OUT's own exactly-sized arrays. */
static int close_container(jparser *p, ferry__json *out, size_t vbase, size_t kbase, int is_obj)
{
    size_t n = p->n_vals - vbase;
    if (n) {
        out->items = malloc(n * sizeof *out->items);
        if (!out->items)
            return joom(p);
        if (is_obj) {
            out->keys = malloc(n * sizeof *out->keys);
            if (!out->keys) {
                free(out->items);
                out->items = NULL;
                return joom(p);
            }
            memcpy(out->keys, p->keys + kbase, n * sizeof *out->keys);
            p->n_keys = kbase;
        }
        memcpy(out->items, p->vals + vbase, n * sizeof *out->items);
        p->n_vals = vbase;
    }
    out->n = n;
    return 0;
}

static int parse_array(jparser *p, ferry__json *out, int depth)
{
    size_t vbase = p->n_vals;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        out->type = FERRY__JSON_ARRAY;
        return 0;
    }
    for (;;) {
        ferry__json v;
        int rc = parse_value(p, &v, depth + 1);
        if (rc)
            return rc;
        if ((rc = push_val(p, &v))) {
            ferry__json_free(&v);
            return rc;
        }
        skip_ws(p);
        if (p->pos >= p->len)
            return jfail(p, FERRY_EJSON, p->pos, "unexpected end of input in array");
        unsigned char c = p->s[p->pos];
        if (c == ']') {
            p->pos++;
            break;
        }
        if (c != ',') {
            char cb[8];
            return jfail(p, FERRY_EJSON, p->pos, "expected ',' or ']' but found %s",
                         show_char(c, cb));
        }
        p->pos++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ']')
            return jfail(p, FERRY_EJSON, p->pos, "trailing comma in array");
    }
    out->type = FERRY__JSON_ARRAY;
    return close_container(p, out, vbase, 0, 0);
}

/* A member of the root object in ferry__json_parse_members: its value parsed, then the key K
 * (at byte AT) and the value handed to the callback, which owns both from then on. */
static int stream_member(jparser *p, char *k, size_t at, int depth)
{
    skip_ws(p);
    if (p->pos >= p->len || p->s[p->pos] != ':') {
        int rc = jfail(p, FERRY_EJSON, p->pos, "expected ':' after key \"%.200s\"", k);
        free(k);
        return rc;
    }
    p->pos++;
    ferry__json v;
    int rc = parse_value(p, &v, depth + 1);
    if (rc) {
        free(k);
        return rc;
    }
    return p->member_fn(k, &v, at, p->member_arg);
}

static int parse_object(jparser *p, ferry__json *out, int depth)
{
    size_t vbase = p->n_vals, kbase = p->n_keys;
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        out->type = FERRY__JSON_OBJECT;
        return 0;
    }
    for (;;) {
        if (p->pos >= p->len)
            return jfail(p, FERRY_EJSON, p->pos, "unexpected end of input in object");
        if (p->s[p->pos] != '"') {
            char cb[8];
            return jfail(p, FERRY_EJSON, p->pos, "expected a string key but found %s",
                         show_char(p->s[p->pos], cb));
        }
        size_t at = p->pos, klen;
        char *k;
        int rc = parse_string(p, FERRY__MAX_NAME, 1, &k, &klen);
        if (rc)
            return rc;
        if (depth == 0 && p->member_fn) {
            if ((rc = stream_member(p, k, at, depth)))
                return rc;
        } else {
            if ((rc = push_key(p, k, at))) {
                free(k);
                return rc;
            }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return jfail(p, FERRY_EJSON, p->pos, "expected ':' after key \"%.200s\"", k);
            p->pos++;
            ferry__json v;
            if ((rc = parse_value(p, &v, depth + 1)))
                return rc;
            if ((rc = push_val(p, &v))) {
                ferry__json_free(&v);
                return rc;
            }
        }
        skip_ws(p);
        if (p->pos >= p->len)
            return jfail(p, FERRY_EJSON, p->pos, "unexpected end of input in object");
        unsigned char c = p->s[p->pos];
        if (c == '}') {
            p->pos++;
            break;
        }
        if (c != ',') {
            char cb[8];
            return jfail(p, FERRY_EJSON, p->pos, "expected ',' or '}' but found %s",
                         show_char(c, cb));
        }
        p->pos++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == '}')
            return jfail(p, FERRY_EJSON, p->pos, "trailing comma in object");
    }
    int rc = check_dups(p, kbase, p->n_keys - kbase);
    if (rc)
        return rc;
    out->type = FERRY__JSON_OBJECT;
    return close_container(p, out, vbase, kbase, 1);
}

static int literal(jparser *p, const char *word, size_t n)
{
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return jfail(p, FERRY_EJSON, p->pos, "invalid literal (expected %s)", word);
    p->pos += n;
    return 0;
}

/* On failure OUT owns nothing; whatever was built is on the stacks. */
static int parse_value(jparser *p, ferry__json *out, int depth)
{
    memset(out, 0, sizeof *out);
    skip_ws(p);
    if (p->pos >= p->len)
        return jfail(p, FERRY_EJSON, p->pos, "unexpected end of input");
    int rc = count_value(p);
    if (rc)
        return rc;
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[':
        if (depth >= FERRY__MAX_JSON_DEPTH)
            return jfail(p, FERRY_ELIMIT, p->pos, "nesting deeper than %d",
                         FERRY__MAX_JSON_DEPTH);
        return c == '{' ? parse_object(p, out, depth) : parse_array(p, out, depth);
    case '"':
        rc = parse_string(p, FERRY__JSON_MAX_STRING, 0, &out->str, &out->str_len);
        if (!rc)
            out->type = FERRY__JSON_STRING;
        return rc;
    case 't':
        out->type = FERRY__JSON_BOOL, out->b = 1;
        return literal(p, "true", 4);
    case 'f':
        out->type = FERRY__JSON_BOOL, out->b = 0;
        return literal(p, "false", 5);
    case 'n':
        out->type = FERRY__JSON_NULL;
        return literal(p, "null", 4);
    default:
        if (c == '-' || is_digit(c))
            return parse_number(p, out);
        char cb[8];
        return jfail(p, FERRY_EJSON, p->pos, "unexpected character %s", show_char(c, cb));
    }
}

static int json_parse(const char *text, size_t len, const char *path, ferry__json *out,
                      ferry__json_member_fn fn, void *arg, ferry__err *e)
{
    memset(out, 0, sizeof *out);
    if (!path)
        path = "(json)";
    jparser p = {.s = (const unsigned char *)text, .len = len, .path = path, .e = e,
                 .member_fn = fn, .member_arg = arg};
    if ((uint64_t)len > FERRY__JSON_MAX_TEXT)
        return jfail(&p, FERRY_ELIMIT, 0, "document of %zu bytes exceeds the limit of %llu",
                     len, (unsigned long long)FERRY__JSON_MAX_TEXT);
    ferry__json root;
    int rc = parse_value(&p, &root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos < p.len) {
            char cb[8];
            rc = jfail(&p, FERRY_EJSON, p.pos, "trailing %s after the value",
                       show_char(p.s[p.pos], cb));
            ferry__json_free(&root);
        }
    }
    /* On success the stacks are empty; on failure they own the partial tree. */
    for (size_t i = 0; i < p.n_vals; i++)
        ferry__json_free(&p.vals[i]);
    for (size_t i = 0; i < p.n_keys; i++)
        free(p.keys[i]);
    free(p.vals);
    free(p.keys);
    free(p.key_pos);
    free(p.sb);
    if (!rc)
        *out = root;
    return rc;
}

int ferry__json_parse(const char *text, size_t len, const char *path, ferry__json *out,
                      ferry__err *e)
{
    return json_parse(text, len, path, out, NULL, NULL, e);
}

int ferry__json_parse_members(const char *text, size_t len, const char *path,
                              ferry__json_member_fn fn, void *arg, ferry__err *e)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    if (i == len || text[i] != '{')
        return ferry__fail(e, FERRY_EFORMAT, "%s: JSON: the document is not an object",
                           path ? path : "(json)");
    ferry__json root;
    int rc = json_parse(text, len, path, &root, fn, arg, e);
    ferry__json_free(&root); /* an object without members: they all went to FN */
    return rc;
}

void ferry__json_free(ferry__json *j)
{
    if (!j)
        return;
    if (j->type == FERRY__JSON_STRING) {
        free(j->str);
    } else if (j->type == FERRY__JSON_ARRAY || j->type == FERRY__JSON_OBJECT) {
        for (size_t i = 0; i < j->n; i++) {
            ferry__json_free(&j->items[i]);
            if (j->keys)
                free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
    }
    memset(j, 0, sizeof *j);
}

const ferry__json *ferry__json_get(const ferry__json *o, const char *key)
{
    if (!o || o->type != FERRY__JSON_OBJECT || !key)
        return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (o->keys[i] && strcmp(o->keys[i], key) == 0)
            return &o->items[i];
    return NULL;
}

int ferry__json_u64(const ferry__json *j, uint64_t *out)
{
    if (!j || j->type != FERRY__JSON_NUMBER || !j->num_len)
        return FERRY_EJSON;
    uint64_t v = 0;
    for (size_t i = 0; i < j->num_len; i++) {
        unsigned char c = (unsigned char)j->num[i];
        if (!is_digit(c))
            return FERRY_EJSON; /* sign, fraction or exponent */
        if (ferry__mul_u64(v, 10, &v) || ferry__add_u64(v, c - '0', &v))
            return FERRY_EJSON;
    }
    *out = v;
    return 0;
}

/* ---- output buffer ----------------------------------------------------------------------------
 * Invariant: after any successful append, b->p is NUL-terminated at b->len (the terminator is not
 * counted). Once a growth fails, b->oom stays set and nothing more is appended. */

static int buf_reserve(ferry__buf *b, size_t extra)
{
    if (b->oom)
        return -1;
    if (extra >= SIZE_MAX - b->len) {
        b->oom = 1;
        return -1;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t ncap = b->cap ? b->cap : 256;
    while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    char *np = realloc(b->p, ncap);
    if (!np) {
        b->oom = 1;
        return -1;
    }
    b->p = np, b->cap = ncap;
    return 0;
}

void ferry__buf_put(ferry__buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n))
        return;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void ferry__buf_printf(ferry__buf *b, const char *fmt, ...)
{
    if (buf_reserve(b, 64))
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->p[b->len] = 0;
        return;
    }
    if ((size_t)n >= b->cap - b->len) {
        if (buf_reserve(b, (size_t)n))
            return;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}


void ferry__buf_json_str(ferry__buf *b, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    ferry__buf_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && json_plain(s[run]))
            run++;
        if (run > i) {
            ferry__buf_put(b, (const char *)s + i, run - i);
            i = run;
            continue;
        }
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            ferry__buf_put(b, esc, 2);
            i++;
        } else if (c < 0x20) {
            ferry__buf_printf(b, "\\u%04x", c);
            i++;
        } else {
            /* Valid UTF-8 passes through; a byte that starts no valid sequence becomes U+FFFD so
             * that the output is always valid JSON. */
            size_t k = utf8_seq(s + i, n - i);
            if (k) {
                ferry__buf_put(b, (const char *)s + i, k);
                i += k;
            } else {
                ferry__buf_put(b, "\\ufffd", 6);
                i++;
            }
        }
    }
    ferry__buf_put(b, "\"", 1);
}
