/*
 * fuzz_index.c — libFuzzer target for the sharded-safetensors index reader (ferry__index_parse).
 *
 * A refusal must be a known code with a message naming the path; a success must name only shard
 * paths that stay inside the index's folder (not absolute, no ".." component), map every tensor
 * to one of its shards, and hold unique shard names. Everything is freed. Also run over
 * tests/fuzz/corpus/index by replay.c in ordinary test runs.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 1 when PATH is absolute or has a ".." component. */
static int leaves_folder(const char *path)
{
    if (path[0] == '/')
        return 1;
    for (const char *s = path; *s;) {
        const char *end = strchr(s, '/');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if (n == 2 && s[0] == '.' && s[1] == '.')
            return 1;
        s += n;
        if (*s == '/')
            s++;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char path[] = "fuzz/model.safetensors.index.json";
    ferry__index ix;
    ferry__err e;
    memset(&ix, 0, sizeof ix);
    memset(&e, 0, sizeof e);
    int rc = ferry__index_parse(data, size, path, &ix, &e);
    if (rc) {
        FUZZ_REQUIRE(rc < 0 && rc >= FERRY_EMISMATCH);
        FUZZ_REQUIRE(e.msg[0] != 0 && strstr(e.msg, path) != NULL);
        ferry__index_free(&ix);
        return 0;
    }
    ferry__hmap shards = {0}, names = {0};
    FUZZ_REQUIRE(ix.n_shards == 0 || ix.shards != NULL);
    for (size_t i = 0; i < ix.n_shards; i++) {
        FUZZ_REQUIRE(ix.shards[i] != NULL && ix.shards[i][0] != 0);
        FUZZ_REQUIRE(!leaves_folder(ix.shards[i]));
        FUZZ_REQUIRE(ferry__hmap_put(&shards, ix.shards[i], i, NULL) == 0);
    }
    FUZZ_REQUIRE(ix.n_names == 0 || (ix.names != NULL && ix.shard_of != NULL));
    for (size_t i = 0; i < ix.n_names; i++) {
        FUZZ_REQUIRE(ix.names[i] != NULL);
        FUZZ_REQUIRE(ix.shard_of[i] < ix.n_shards);
        FUZZ_REQUIRE(ferry__hmap_put(&names, ix.names[i], i, NULL) == 0);
    }
    for (size_t i = 0; i < ix.n_meta; i++) {
        FUZZ_REQUIRE(ix.meta[i].key != NULL);
        fuzz_walk_value(&ix.meta[i].val, 0);
    }
    ferry__hmap_free(&shards);
    ferry__hmap_free(&names);
    ferry__index_free(&ix);
    return 0;
}
