/*
 * json_priv.h — helpers of json.c that the other format modules (safetensors.c, index.c) share
 * but that are not part of the formats interface in formats.h.
 */
#ifndef FERRY_JSON_PRIV_H
#define FERRY_JSON_PRIV_H

#include <stddef.h>

/* Limits of ferry__json_parse beyond FERRY__MAX_JSON_DEPTH (formats.h). Exceeding any of them is
 * FERRY_ELIMIT. Keys are also limited to FERRY__MAX_NAME bytes (they become tensor names). */
#define FERRY__JSON_MAX_TEXT (UINT64_C(256) << 20) /* bytes of the whole document */
#define FERRY__JSON_MAX_STRING (UINT64_C(64) << 20) /* decoded bytes of one string value */
#define FERRY__JSON_MAX_NUMBER 64                 /* characters of one number */
#define FERRY__JSON_MAX_VALUES (UINT64_C(1) << 22) /* values in one document (bounds the DOM) */

/* 1 when the N bytes at S are valid UTF-8 (no overlongs, no surrogates, nothing above
 * U+10FFFF), 0 otherwise. */
int ferry__utf8_valid(const char *s, size_t n);

#endif
