/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader (ferry__safetensors_parse),
 * in memory, with the JSON parser underneath it.
 *
 * Every input is parsed, whole and again in growing pieces (as the catalog reads a header), with
 * the same result; a refusal must be clean (fuzz_check.h), a success must keep the reader's
 * promises, open the same way through the public catalog, survive a round trip through the header
 * serializer, and free without a leak. The JSON text after the length prefix also goes through
 * ferry__json_parse on its own, so the DOM is built and freed for inputs the reader refuses for
 * other reasons. Also run over tests/fuzz/corpus/safetensors by replay.c in ordinary test runs.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads every node of J (depth-first, bounded by the parser's own depth limit). */
static void walk_json(const ferry__json *j, int depth)
{
    FUZZ_REQUIRE(depth <= FERRY__MAX_JSON_DEPTH + 1);
    switch (j->type) {
    case FERRY__JSON_NULL:
    case FERRY__JSON_BOOL: break;
    case FERRY__JSON_NUMBER:
        FUZZ_REQUIRE(j->num != NULL && j->num_len > 0);
        fuzz_sink = (unsigned char)j->num[j->num_len - 1];
        break;
    case FERRY__JSON_STRING:
        FUZZ_REQUIRE(j->str != NULL && j->str[j->str_len] == 0);
        break;
    case FERRY__JSON_OBJECT:
        for (size_t i = 0; i < j->n; i++)
            FUZZ_REQUIRE(j->keys[i] != NULL);
        /* fall through */
    case FERRY__JSON_ARRAY:
        FUZZ_REQUIRE(j->n == 0 || j->items != NULL);
        for (size_t i = 0; i < j->n; i++)
            walk_json(&j->items[i], depth + 1);
        break;
    default: FUZZ_REQUIRE(!"unknown JSON type");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char path[] = "fuzz.safetensors";
    ferry__parsed p;
    ferry__err e;
    memset(&p, 0, sizeof p);
    memset(&e, 0, sizeof e);
    int rc = ferry__safetensors_parse(data, size, path, &p, &e);
    fuzz_incremental(data, size, ferry__safetensors_read, path, rc, e.msg, &p);
    if (rc) {
        fuzz_refused(rc, &e, path, &p);
    } else {
        fuzz_check_parsed(&p, size, FERRY_FORMAT_SAFETENSORS);
        FUZZ_REQUIRE(p.alignment == 1);
        FUZZ_REQUIRE(size >= 8 && p.data_offset == 8 + ferry__le64(data));
        fuzz_catalog(data, size, &p, 0);
        fuzz_roundtrip(&p, ferry__safetensors_parse, ferry__safetensors_serialize, path);
    }
    ferry__parsed_free(&p);

    if (size > 8) {
        ferry__json j;
        memset(&j, 0, sizeof j);
        rc = ferry__json_parse((const char *)data + 8, size - 8, path, &j, &e);
        if (rc == 0)
            walk_json(&j, 0);
        else
            FUZZ_REQUIRE(rc < 0 && e.msg[0] != 0);
        ferry__json_free(&j);
    }
    return 0;
}
