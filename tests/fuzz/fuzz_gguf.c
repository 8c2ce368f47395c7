/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader (ferry__gguf_parse), in memory.
 *
 * Every input is parsed, whole and again in growing pieces (as the catalog reads a header), with
 * the same result; a refusal must be clean (fuzz_check.h), a success must keep the reader's
 * promises, open the same way through the public catalog, survive a round trip through the header
 * serializer, and free without a leak. Also run over tests/fuzz/corpus/gguf by replay.c in
 * ordinary test runs.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char path[] = "fuzz.gguf";
    ferry__parsed p;
    ferry__err e;
    memset(&p, 0, sizeof p);
    memset(&e, 0, sizeof e);
    int rc = ferry__gguf_parse(data, size, path, &p, &e);
    fuzz_incremental(data, size, ferry__gguf_read, path, rc, e.msg, &p);
    if (rc) {
        fuzz_refused(rc, &e, path, &p);
        ferry__parsed_free(&p);
        return 0;
    }
    fuzz_check_parsed(&p, size, FERRY_FORMAT_GGUF);
    /* What a split set's first file reads; must not fail in any other way than the contract. */
    uint32_t no = 0, count = 0;
    rc = ferry__gguf_split_info(&p, path, &no, &count, &e);
    FUZZ_REQUIRE(rc == 0 || rc == FERRY_ETYPE || rc == FERRY_EFORMAT || rc == FERRY_ELIMIT);
    fuzz_catalog(data, size, &p, rc != 0 || count > 1);
    fuzz_roundtrip(&p, ferry__gguf_parse, ferry__gguf_serialize, path);
    ferry__parsed_free(&p);
    return 0;
}
