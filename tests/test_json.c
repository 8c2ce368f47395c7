/*
 * test_json.c — the strict JSON parser (json.c): valid documents, every class of invalid input
 * with its error code, the limits, duplicate keys, a 20,000-key object, and the output buffer's
 * escaping (checked by parsing its output back).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/formats.h"
#include "formats/json_priv.h"

static ferry__err err;

/* Parses the N bytes at S; returns the code, frees the DOM. */
static int parse_n(const char *s, size_t n)
{
    ferry__json j;
    ferry__err_clear(&err);
    int rc = ferry__json_parse(s, n, "doc.json", &j, &err);
    if (rc == 0)
        ferry__json_free(&j);
    else
        CHECK(err.code == rc && strncmp(err.msg, "doc.json: JSON: ", 16) == 0 &&
              strstr(err.msg, " at byte "));
    return rc;
}

static int parse_s(const char *s) { return parse_n(s, strlen(s)); }

static void test_scalars(void)
{
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse("true", 4, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_BOOL && j.b == 1);
    ferry__json_free(&j);
    CHECK_EQ_INT(ferry__json_parse(" \t\r\nfalse\n ", 11, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_BOOL && j.b == 0);
    ferry__json_free(&j);
    CHECK_EQ_INT(ferry__json_parse("null", 4, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_NULL);
    ferry__json_free(&j);
    const char *num = "  -12.5e+10 ";
    CHECK_EQ_INT(ferry__json_parse(num, strlen(num), "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_NUMBER && j.num_len == 9 && memcmp(j.num, "-12.5e+10", 9) == 0);
    ferry__json_free(&j);
    CHECK_EQ_INT(ferry__json_parse("\"hi\"", 4, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_STRING && j.str_len == 2);
    CHECK_STR(j.str, "hi");
    ferry__json_free(&j);
    /* Valid number forms. */
    const char *nums[] = {"0", "-0", "1", "-1", "0.0", "1e5", "1E5", "1e-5", "1E+05", "123.456e7",
                          "-0.0e0", "9007199254740993", "1e400"};
    for (size_t i = 0; i < FERRY__ARRAY_LEN(nums); i++) {
        int rc = parse_s(nums[i]);
        CHECK_EQ_INT(rc, 0);
        if (rc)
            fprintf(stderr, "  number %s: %s\n", nums[i], err.msg);
    }
}

static void test_nested(void)
{
    const char *doc = "{\"a\": [1, 2, {\"b\": null, \"c\": [[], {}]}], \"d\": {\"e\": true},"
                      " \"s\": \"x\"}";
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse(doc, strlen(doc), "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_OBJECT && j.n == 3);
    CHECK_STR(j.keys[0], "a");
    CHECK_STR(j.keys[2], "s");
    const ferry__json *a = ferry__json_get(&j, "a");
    CHECK(a && a->type == FERRY__JSON_ARRAY && a->n == 3);
    if (a && a->n == 3) {
        uint64_t v = 0;
        CHECK_EQ_INT(ferry__json_u64(&a->items[1], &v), 0);
        CHECK_EQ_INT(v, 2);
        const ferry__json *o = &a->items[2];
        CHECK(o->type == FERRY__JSON_OBJECT && o->n == 2);
        CHECK(ferry__json_get(o, "b") && ferry__json_get(o, "b")->type == FERRY__JSON_NULL);
        const ferry__json *c = ferry__json_get(o, "c");
        CHECK(c && c->type == FERRY__JSON_ARRAY && c->n == 2);
        if (c && c->n == 2) {
            CHECK(c->items[0].type == FERRY__JSON_ARRAY && c->items[0].n == 0);
            CHECK(c->items[1].type == FERRY__JSON_OBJECT && c->items[1].n == 0);
        }
    }
    const ferry__json *d = ferry__json_get(&j, "d");
    CHECK(d && ferry__json_get(d, "e") && ferry__json_get(d, "e")->b == 1);
    CHECK(ferry__json_get(&j, "missing") == NULL);
    CHECK(ferry__json_get(a, "x") == NULL); /* not an object */
    /* The same key in different objects is not a duplicate. */
    CHECK_EQ_INT(parse_s("{\"a\":{\"a\":1},\"b\":{\"a\":2},\"c\":[{\"a\":3},{\"a\":4}]}"), 0);
    ferry__json_free(&j);
}

static void test_escapes(void)
{
    const char *doc = "\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t e\\u00e9 E\\u20AC g\\ud83d\\ude00 "
                      "raw\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 z\\u0000z\"";
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse(doc, strlen(doc), "x", &j, &err), 0);
    const char want[] = "q\" b\\ s/ \b\f\n\r\t e\xc3\xa9 E\xe2\x82\xac g\xf0\x9f\x98\x80 "
                        "raw\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 z\0z";
    CHECK_EQ_INT(j.str_len, sizeof want - 1);
    CHECK(j.str && memcmp(j.str, want, sizeof want) == 0); /* includes the terminator */
    ferry__json_free(&j);
    /* The highest code point, U+10FFFF, both escaped and raw. */
    CHECK_EQ_INT(ferry__json_parse("\"\\udbff\\udfff\"", 14, "x", &j, &err), 0);
    CHECK(j.str_len == 4 && memcmp(j.str, "\xf4\x8f\xbf\xbf", 4) == 0);
    ferry__json_free(&j);
    CHECK_EQ_INT(parse_s("\"\xf4\x8f\xbf\xbf \xed\x9f\xbf \xee\x80\x80 \x7f\""), 0);
}

static void test_u64(void)
{
    struct {
        const char *text;
        int rc;
        uint64_t v;
    } cases[] = {
        {"0", 0, 0},
        {"7", 0, 7},
        {"4294967296", 0, UINT64_C(4294967296)},
        {"18446744073709551615", 0, UINT64_MAX},
        {"18446744073709551616", FERRY_EJSON, 0},
        {"99999999999999999999", FERRY_EJSON, 0},
        {"-1", FERRY_EJSON, 0},
        {"-0", FERRY_EJSON, 0},
        {"1.5", FERRY_EJSON, 0},
        {"1.0", FERRY_EJSON, 0},
        {"1e3", FERRY_EJSON, 0},
        {"\"5\"", FERRY_EJSON, 0},
        {"true", FERRY_EJSON, 0},
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(cases); i++) {
        ferry__json j;
        CHECK_EQ_INT(ferry__json_parse(cases[i].text, strlen(cases[i].text), "x", &j, &err), 0);
        uint64_t v = 12345;
        int rc = ferry__json_u64(&j, &v);
        CHECK_EQ_INT(rc, cases[i].rc);
        if (rc == 0)
            CHECK(v == cases[i].v);
        else
            CHECK(v == 12345); /* left unchanged */
        ferry__json_free(&j);
    }
    CHECK_EQ_INT(ferry__json_u64(NULL, NULL), FERRY_EJSON);
}

static void test_invalid(void)
{
    struct {
        const char *text;
        int rc;
    } cases[] = {
        /* syntax */
        {"", FERRY_EJSON},
        {"   ", FERRY_EJSON},
        {"{", FERRY_EJSON},
        {"[", FERRY_EJSON},
        {"[1", FERRY_EJSON},
        {"{\"a\"", FERRY_EJSON},
        {"{\"a\":", FERRY_EJSON},
        {"{\"a\":1", FERRY_EJSON},
        {"]", FERRY_EJSON},
        {"}", FERRY_EJSON},
        {"[1,]", FERRY_EJSON},
        {"[,1]", FERRY_EJSON},
        {"[1,,2]", FERRY_EJSON},
        {"{\"a\":1,}", FERRY_EJSON},
        {"{,}", FERRY_EJSON},
        {"[1 2]", FERRY_EJSON},
        {"{\"a\" 1}", FERRY_EJSON},
        {"{\"a\":1 \"b\":2}", FERRY_EJSON},
        {"{a:1}", FERRY_EJSON},
        {"{1:1}", FERRY_EJSON},
        {"{'a':1}", FERRY_EJSON},
        {"'a'", FERRY_EJSON},
        {"[1]x", FERRY_EJSON},
        {"{} {}", FERRY_EJSON},
        {"1 2", FERRY_EJSON},
        {"// c\n1", FERRY_EJSON},
        {"/* c */ 1", FERRY_EJSON},
        {"[1 /* c */]", FERRY_EJSON},
        {"\xef\xbb\xbf{}", FERRY_EJSON}, /* byte-order mark */
        {"\v1", FERRY_EJSON},
        {"\f1", FERRY_EJSON},
        /* literals */
        {"tru", FERRY_EJSON},
        {"nul", FERRY_EJSON},
        {"True", FERRY_EJSON},
        {"NULL", FERRY_EJSON},
        {"truex", FERRY_EJSON},
        {"NaN", FERRY_EJSON},
        {"[nan]", FERRY_EJSON},
        {"Infinity", FERRY_EJSON},
        {"-Infinity", FERRY_EJSON},
        {"undefined", FERRY_EJSON},
        /* numbers */
        {"01", FERRY_EJSON},
        {"[00]", FERRY_EJSON},
        {"-01", FERRY_EJSON},
        {"-", FERRY_EJSON},
        {"[-]", FERRY_EJSON},
        {"+1", FERRY_EJSON},
        {"1.", FERRY_EJSON},
        {".5", FERRY_EJSON},
        {"1.e5", FERRY_EJSON},
        {"1e", FERRY_EJSON},
        {"1e+", FERRY_EJSON},
        {"1E-x", FERRY_EJSON},
        {"0x10", FERRY_EJSON},
        {"1_000", FERRY_EJSON},
        {"- 1", FERRY_EJSON},
        /* strings and escapes */
        {"\"abc", FERRY_EJSON},
        {"\"abc\\", FERRY_EJSON},
        {"\"abc\\\"", FERRY_EJSON},
        {"\"\\x\"", FERRY_EJSON},
        {"\"\\a\"", FERRY_EJSON},
        {"\"\\'\"", FERRY_EJSON},
        {"\"\\u12\"", FERRY_EJSON},
        {"\"\\u12", FERRY_EJSON},
        {"\"\\uZZZZ\"", FERRY_EJSON},
        {"\"\\U0041\"", FERRY_EJSON},
        /* control characters raw inside strings */
        {"\"\t\"", FERRY_EJSON},
        {"\"a\nb\"", FERRY_EJSON},
        {"\"\x01\"", FERRY_EJSON},
        {"\"\x1f\"", FERRY_EJSON},
        /* surrogates through escapes */
        {"\"\\ud800\"", FERRY_EJSON},
        {"\"\\udbff\"", FERRY_EJSON},
        {"\"\\udc00\"", FERRY_EJSON},
        {"\"\\udfff\\ud800\"", FERRY_EJSON},
        {"\"\\ud800\\u0041\"", FERRY_EJSON},
        {"\"\\ud800\\ud800\"", FERRY_EJSON},
        {"\"\\ud800x\"", FERRY_EJSON},
        {"\"\\ud800\\n\"", FERRY_EJSON},
        /* invalid UTF-8 */
        {"\"\x80\"", FERRY_EJSON},                 /* bare continuation */
        {"\"\xbf\"", FERRY_EJSON},
        {"\"a\x80z\"", FERRY_EJSON},
        {"\"\xc0\x80\"", FERRY_EJSON},             /* overlong NUL */
        {"\"\xc1\xbf\"", FERRY_EJSON},             /* overlong */
        {"\"\xe0\x80\x80\"", FERRY_EJSON},         /* overlong 3-byte */
        {"\"\xe0\x9f\xbf\"", FERRY_EJSON},
        {"\"\xf0\x80\x80\x80\"", FERRY_EJSON},     /* overlong 4-byte */
        {"\"\xf0\x8f\xbf\xbf\"", FERRY_EJSON},
        {"\"\xed\xa0\x80\"", FERRY_EJSON},         /* U+D800 encoded */
        {"\"\xed\xbf\xbf\"", FERRY_EJSON},         /* U+DFFF encoded */
        {"\"\xf4\x90\x80\x80\"", FERRY_EJSON},     /* U+110000 */
        {"\"\xf5\x80\x80\x80\"", FERRY_EJSON},
        {"\"\xf8\x88\x80\x80\x80\"", FERRY_EJSON}, /* 5-byte form */
        {"\"\xfe\"", FERRY_EJSON},
        {"\"\xff\"", FERRY_EJSON},
        {"\"\xe2\x82\"", FERRY_EJSON},             /* cut short by the quote */
        {"\"\xc3\"", FERRY_EJSON},
        {"\"\xc3", FERRY_EJSON},                   /* cut short by the end */
        {"\"\xe2\x28\xa1\"", FERRY_EJSON},         /* bad continuation */
        {"\"\xf0\x9f\x98\"", FERRY_EJSON},
        {"{\"\xc0\xaf\":1}", FERRY_EJSON},         /* in a key */
        /* keys may not hold NUL */
        {"{\"a\\u0000b\":1}", FERRY_EJSON},
        /* duplicates */
        {"{\"a\":1,\"a\":2}", FERRY_EDUP},
        {"{\"a\":1,\"b\":2,\"a\":3}", FERRY_EDUP},
        {"{\"x\":{\"k\":1,\"k\":1}}", FERRY_EDUP},
        {"[{\"k\":1},{\"k\":1,\"k\":2}]", FERRY_EDUP},
        {"{\"\\u0061\":1,\"a\":2}", FERRY_EDUP}, /* equal after decoding */
        {"{\"\xc3\xa9\":1,\"\\u00e9\":2}", FERRY_EDUP},
    };
    for (size_t i = 0; i < FERRY__ARRAY_LEN(cases); i++) {
        int rc = parse_s(cases[i].text);
        CHECK_EQ_INT(rc, cases[i].rc);
        if (rc != cases[i].rc)
            fprintf(stderr, "  case %zu: %s\n", i, err.msg);
    }
    CHECK_EQ_INT(parse_n("[1]\0", 4), FERRY_EJSON);
    CHECK_EQ_INT(parse_n("\0", 1), FERRY_EJSON);
    CHECK_EQ_INT(parse_n("\"a\0b\"", 5), FERRY_EJSON);
}

static void test_messages(void)
{
    CHECK_EQ_INT(parse_s("[1,]"), FERRY_EJSON);
    CHECK(strstr(err.msg, "trailing comma") && strstr(err.msg, "at byte 3"));
    CHECK_EQ_INT(parse_s("{\"ab\":1,\"ab\":2}"), FERRY_EDUP);
    CHECK(strstr(err.msg, "\"ab\"") && strstr(err.msg, "at byte 8"));
    CHECK_EQ_INT(parse_s("  \"x\xc0\x80\""), FERRY_EJSON);
    CHECK(strstr(err.msg, "UTF-8") && strstr(err.msg, "at byte 4"));
    CHECK_EQ_INT(parse_s("[1] ]"), FERRY_EJSON);
    CHECK(strstr(err.msg, "at byte 4"));
    CHECK_STR(err.msg, "doc.json: JSON: trailing ']' after the value at byte 4");
    CHECK_EQ_INT(parse_s("\"\\ud800\""), FERRY_EJSON);
    CHECK(strstr(err.msg, "surrogate") && strstr(err.msg, "at byte 1"));
    /* NULL path is tolerated. */
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse("[", 1, NULL, &j, &err), FERRY_EJSON);
    CHECK(j.type == FERRY__JSON_NULL && j.items == NULL); /* OUT left empty */
}

static char *repeat(const char *head, const char *unit, size_t n, const char *tail)
{
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1), *p = s;
    memcpy(p, head, hl), p += hl;
    for (size_t i = 0; i < n; i++)
        memcpy(p, unit, ul), p += ul;
    memcpy(p, tail, tl), p += tl;
    *p = 0;
    return s;
}

static void test_limits(void)
{
    /* Depth: 64 nested containers are fine, 65 are not. */
    char buf[512];
    size_t d = FERRY__MAX_JSON_DEPTH;
    memset(buf, '[', d);
    memset(buf + d, ']', d);
    CHECK_EQ_INT(parse_n(buf, 2 * d), 0);
    memset(buf, '[', d + 1);
    memset(buf + d + 1, ']', d + 1);
    CHECK_EQ_INT(parse_n(buf, 2 * d + 2), FERRY_ELIMIT);
    CHECK(strstr(err.msg, "nesting"));
    char *deep = repeat("", "{\"a\":", d, "1");
    char *closed = repeat(deep, "}", d, "");
    CHECK_EQ_INT(parse_s(closed), 0);
    free(deep), free(closed);
    deep = repeat("", "{\"a\":[", d / 2 + 1, "1");
    CHECK_EQ_INT(parse_s(deep), FERRY_ELIMIT); /* refused before the end is even seen */
    free(deep);
    /* A hostile depth far beyond the limit does not recurse without bound. */
    deep = repeat("", "[", 1000000, "");
    CHECK_EQ_INT(parse_s(deep), FERRY_ELIMIT);
    free(deep);

    /* Numbers: up to 64 characters. */
    char *num = repeat("", "9", FERRY__JSON_MAX_NUMBER, "");
    CHECK_EQ_INT(parse_s(num), 0);
    free(num);
    num = repeat("[1.", "5", FERRY__JSON_MAX_NUMBER - 1, "]");
    CHECK_EQ_INT(parse_s(num), FERRY_ELIMIT);
    free(num);
    num = repeat("", "1", 100000, "");
    CHECK_EQ_INT(parse_s(num), FERRY_ELIMIT);
    free(num);

    /* Keys: up to FERRY__MAX_NAME bytes. */
    char *key = repeat("{\"", "k", FERRY__MAX_NAME, "\":1}");
    CHECK_EQ_INT(parse_s(key), 0);
    free(key);
    key = repeat("{\"", "k", FERRY__MAX_NAME + 1, "\":1}");
    CHECK_EQ_INT(parse_s(key), FERRY_ELIMIT);
    free(key);
    /* A string value may be longer than a key. */
    char *str = repeat("\"", "\\u00e9", 100000, "\"");
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse(str, strlen(str), "x", &j, &err), 0);
    CHECK_EQ_INT(j.str_len, 200000);
    ferry__json_free(&j);
    free(str);

    /* The number of values is bounded (the DOM cannot outgrow the text without limit). */
    char *many = repeat("[", "0,", FERRY__JSON_MAX_VALUES, "0]");
    CHECK_EQ_INT(parse_s(many), FERRY_ELIMIT);
    CHECK(strstr(err.msg, "values"));
    free(many);

    /* The document size is bounded before anything is read. */
    CHECK_EQ_INT(ferry__json_parse("[]", (size_t)FERRY__JSON_MAX_TEXT + 1, "x", &j, &err),
                 FERRY_ELIMIT);
}

static void test_big_object(void)
{
    enum { N = 20000 };
    ferry__buf b = {0};
    ferry__buf_put(&b, "{", 1);
    for (int i = 0; i < N; i++)
        ferry__buf_printf(&b, "%s\"model.layers.%d.mlp.weight\":{\"dtype\":\"F16\",\"shape\":[4096,"
                              "%d],\"data_offsets\":[%d,%d]}",
                          i ? "," : "", i, i, i * 10, i * 10 + 10);
    ferry__buf_put(&b, "}", 1);
    CHECK(!b.oom);
    ferry__json j;
    double t0 = ferry__now();
    int rc = ferry__json_parse(b.p, b.len, "big.json", &j, &err);
    double t1 = ferry__now();
    printf("parsed a %d-key object (%zu bytes) in %.2f ms\n", N, b.len, (t1 - t0) * 1e3);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(j.n, N);
    if (rc == 0 && j.n == N) {
        CHECK_STR(j.keys[12345], "model.layers.12345.mlp.weight");
        const ferry__json *sh = ferry__json_get(&j.items[N - 1], "shape");
        uint64_t v = 0;
        CHECK(sh && sh->n == 2 && ferry__json_u64(&sh->items[1], &v) == 0 && v == N - 1);
        CHECK(ferry__json_get(&j, "model.layers.19999.mlp.weight") == &j.items[N - 1]);
    }
    ferry__json_free(&j);

    /* The same object with the first key repeated at the end. */
    b.len--;
    ferry__buf_put(&b, ",\"model.layers.0.mlp.weight\":0}", 31);
    CHECK_EQ_INT(parse_n(b.p, b.len), FERRY_EDUP);
    CHECK(strstr(err.msg, "model.layers.0.mlp.weight"));
    free(b.p);
}

/* Every proper prefix of an object document is invalid; every byte flipped either parses or
 * fails cleanly (the sanitizer builds check for leaks and overruns on these error paths). */
static void test_prefixes_and_flips(void)
{
    const char *doc = "{\"a\":[1,-2.5e3,\"x\\u00e9\\ud83d\\ude00\"],\"b\":{\"c\":[true,false,null]"
                      ",\"d\":\"\xe2\x82\xac\"},\"e\":[[[]]],\"f\":{}}";
    size_t n = strlen(doc);
    CHECK_EQ_INT(parse_n(doc, n), 0);
    int bad = 0;
    for (size_t k = 0; k < n; k++)
        if (parse_n(doc, k) == 0)
            bad++;
    CHECK_EQ_INT(bad, 0);
    char *m = malloc(n);
    static const unsigned char subs[] = {0, '"', '\\', '{', '}', '[', ']', ',', ':', 0x80, 0xff,
                                         'u', '0', ' '};
    int ok = 0, failed = 0, unexpected = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t s = 0; s < sizeof subs; s++) {
            memcpy(m, doc, n);
            m[k] = (char)subs[s];
            int rc = parse_n(m, n);
            if (rc == 0)
                ok++;
            else if (rc == FERRY_EJSON || rc == FERRY_EDUP)
                failed++;
            else
                unexpected++;
        }
    free(m);
    CHECK(failed > 0);
    CHECK_EQ_INT(unexpected, 0);
}

static void test_buf(void)
{
    ferry__buf b = {0};
    ferry__buf_put(&b, "ab", 2);
    ferry__buf_printf(&b, "%d-%s", 42, "x");
    CHECK_EQ_INT(b.len, 6);
    CHECK_STR(b.p, "ab42-x");
    /* printf output longer than any initial capacity */
    char *big = repeat("", "z", 5000, "");
    ferry__buf_printf(&b, "[%s]", big);
    CHECK_EQ_INT(b.len, 6 + 5002);
    CHECK(b.p[b.len] == 0 && b.p[b.len - 1] == ']' && b.p[7] == 'z');
    free(big);
    free(b.p);

    /* Every byte 1..127, NUL, and multi-byte UTF-8 survive json_str -> parse. */
    char src[200];
    size_t n = 0;
    for (int c = 1; c < 128; c++)
        src[n++] = (char)c;
    src[n++] = 0;
    memcpy(src + n, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9);
    n += 9;
    ferry__buf o = {0};
    ferry__buf_json_str(&o, src, n);
    CHECK(!o.oom);
    CHECK(ferry__utf8_valid(o.p, o.len));
    for (size_t i = 0; i < o.len; i++)
        if ((unsigned char)o.p[i] < 0x20)
            CHECK(!"raw control character in output");
    CHECK(strstr(o.p, "\\u0001") && strstr(o.p, "\\u001f") && strstr(o.p, "\\\"") &&
          strstr(o.p, "\\\\") && strstr(o.p, "\\u0000"));
    ferry__json j;
    CHECK_EQ_INT(ferry__json_parse(o.p, o.len, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_STRING && j.str_len == n && memcmp(j.str, src, n) == 0);
    ferry__json_free(&j);
    free(o.p);

    /* Invalid UTF-8 in: valid JSON out (U+FFFD per bad byte), never the raw bytes. */
    const char bad[] = "a\xff" "b\xc0\x80" "c\xed\xa0\x80" "d\xe2\x82";
    ferry__buf q = {0};
    ferry__buf_json_str(&q, bad, sizeof bad - 1);
    CHECK_EQ_INT(ferry__json_parse(q.p, q.len, "x", &j, &err), 0);
    CHECK(j.type == FERRY__JSON_STRING && j.str[0] == 'a' &&
          memcmp(j.str + 1, "\xef\xbf\xbd" "b", 4) == 0);
    CHECK(ferry__utf8_valid(j.str, j.str_len));
    ferry__json_free(&j);
    free(q.p);

    /* Empty string. */
    ferry__buf z = {0};
    ferry__buf_json_str(&z, "", 0);
    CHECK_STR(z.p, "\"\"");
    free(z.p);

    /* After an allocation failure nothing more is appended. */
    ferry__buf f = {0};
    f.oom = 1;
    ferry__buf_put(&f, "x", 1);
    ferry__buf_printf(&f, "%d", 1);
    ferry__buf_json_str(&f, "x", 1);
    CHECK(f.p == NULL && f.len == 0);

    CHECK(ferry__utf8_valid("", 0));
    CHECK(!ferry__utf8_valid("\xc3", 1));
    CHECK(!ferry__utf8_valid("\xed\xa0\x80", 3));
    CHECK(ferry__utf8_valid("\xf4\x8f\xbf\xbf", 4));
}

int main(void)
{
    test_scalars();
    test_nested();
    test_escapes();
    test_u64();
    test_invalid();
    test_messages();
    test_limits();
    test_big_object();
    test_prefixes_and_flips();
    test_buf();
    return check_finish();
}
