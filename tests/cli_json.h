/*
 * cli_json.h — reading the tool's --json output in the CLI tests with the library's strict parser
 * (what parses is valid JSON): the last run's stdout into a document, members by key.
 */
#ifndef FERRY_CLI_JSON_H
#define FERRY_CLI_JSON_H

#include <string.h>

#include "cli_harness.h"
#include "formats/formats.h"

/* Member KEY of object O; NULL when O is absent or not an object, or has no such member. */
static inline const ferry__json *jget(const ferry__json *o, const char *key)
{
    return o && o->type == FERRY__JSON_OBJECT ? ferry__json_get(o, key) : NULL;
}

/* Parses the last command's stdout into DOC (free with ferry__json_free); 0, or the parser's
 * code after printing what did not parse. */
static inline int parse_stdout(ferry__json *doc)
{
    ferry__err e;
    ferry__err_clear(&e);
    memset(doc, 0, sizeof *doc);
    int rc = ferry__json_parse(out_text, out_len, "stdout", doc, &e);
    if (rc)
        fprintf(stderr, "JSON does not parse: %s\n%s\n%s\n", e.msg, out_text, err_text);
    return rc;
}

#endif
