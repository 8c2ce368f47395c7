/*
 * test_util.c — the hash map, size parsing and printing, glob matching, error buffers.
 */
#include "check.h"
#include "util/util.h"

static void test_hmap(void)
{
    ferry__hmap m = {0};
    static char keys[5000][16];
    for (int i = 0; i < 5000; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        CHECK_EQ_INT(ferry__hmap_put(&m, keys[i], (uint64_t)i, NULL), 0);
    }
    uint64_t v = 0, ex = 0;
    CHECK_EQ_INT(ferry__hmap_put(&m, "k17", 99, &ex), FERRY_EDUP);
    CHECK_EQ_INT(ex, 17);
    CHECK(ferry__hmap_get(&m, "k4999", &v) && v == 4999);
    CHECK(!ferry__hmap_get(&m, "k5000", &v));
    for (int i = 0; i < 5000; i += 2)
        CHECK(ferry__hmap_del(&m, keys[i]));
    int ok = 1;
    for (int i = 0; i < 5000; i++)
        ok &= (ferry__hmap_get(&m, keys[i], &v) == (i & 1)) && (!(i & 1) || v == (uint64_t)i);
    CHECK(ok);
    CHECK_EQ_INT(m.len, 2500);
    ferry__hmap_free(&m);
}

static void test_sizes(void)
{
    uint64_t v;
    CHECK(ferry__parse_size("1GiB", &v) == 0 && v == (UINT64_C(1) << 30));
    CHECK(ferry__parse_size("1G", &v) == 0 && v == 1000000000u);
    CHECK(ferry__parse_size("512", &v) == 0 && v == 512);
    CHECK(ferry__parse_size("1.5KiB", &v) == 0 && v == 1536);
    CHECK(ferry__parse_size("8gib", &v) == 0 && v == (UINT64_C(8) << 30));
    CHECK(ferry__parse_size("12MB", &v) == 0 && v == 12000000u);
    CHECK(ferry__parse_size("x", &v) == FERRY_EINVAL);
    CHECK(ferry__parse_size("-1", &v) == FERRY_EINVAL);
    CHECK(ferry__parse_size("1Q", &v) == FERRY_EINVAL);
    CHECK(ferry__parse_size("99999999999999999999999", &v) == FERRY_EINVAL);
    CHECK(ferry__parse_rate("25GB/s", &v) == 0 && v == 25000000000u);
    char buf[32];
    CHECK_STR(ferry__fmt_size(512, buf), "512 B");
    CHECK_STR(ferry__fmt_size(1536, buf), "1.50 KiB");
    CHECK_STR(ferry__fmt_size(UINT64_C(3) << 30, buf), "3.00 GiB");
}

static void test_glob(void)
{
    CHECK(ferry__glob("blk.*.attn_q.weight", "blk.12.attn_q.weight"));
    CHECK(!ferry__glob("blk.*.attn_q.weight", "blk.12.attn_k.weight"));
    CHECK(ferry__glob("*", ""));
    CHECK(ferry__glob("a?c", "abc"));
    CHECK(!ferry__glob("a?c", "ac"));
    CHECK(ferry__glob("blk.[0-3].*", "blk.2.ffn_up"));
    CHECK(!ferry__glob("blk.[!0-3].*", "blk.2.ffn_up"));
    CHECK(ferry__glob("a\\*b", "a*b"));
    CHECK(!ferry__glob("a\\*b", "axb"));
    CHECK(ferry__glob("*.weight", "model.layers.0.weight"));
    CHECK(ferry__glob("**a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaab"));
}

static void test_err(void)
{
    ferry__err e = {0};
    CHECK_EQ_INT(ferry__fail(&e, FERRY_ETRUNC, "%s: truncated at %d", "f.gguf", 12), FERRY_ETRUNC);
    CHECK_STR(e.msg, "f.gguf: truncated at 12");
    ferry__fail_append(&e, FERRY_ESHAPE, "second");
    CHECK_EQ_INT(e.code, FERRY_ETRUNC);
    CHECK(strstr(e.msg, "\nsecond") != NULL);
    CHECK_STR(ferry_strerror(FERRY_ETRUNC), "truncated file");
    CHECK_STR(ferry_version(), FERRY_VERSION_STRING);
}

int main(void)
{
    test_hmap();
    test_sizes();
    test_glob();
    test_err();
    return check_finish();
}
