/*
 * dtype.c — the type table: for every ferry_dtype its lower-case name, its safetensors spelling
 * (when safetensors has the type) and its block geometry (elements and bytes per block), plus the
 * lookups built on it (GGUF ids, safetensors strings, names, byte sizes, which types ferry can read
 * and write as numbers).
 *
 * Block geometry follows ggml's type table for GGUF types and the safetensors spec for the rest;
 * sub-byte safetensors types are described as small blocks (F4: 2 values in 1 byte, F6: 4 values
 * in 3 bytes) so that every type has a whole number of bytes per block.
 */
#include <string.h>
#include <strings.h>

#include "dtype/dtype.h"
#include "util/util.h"

typedef struct dtype_info {
    const char *name;    /* lower-case name; NULL: the value is no type (retired or unused id) */
    const char *st_name; /* safetensors spelling, NULL when safetensors has no such type */
    uint32_t blck;       /* elements per block */
    uint32_t bytes;      /* bytes per block */
} dtype_info;

/* Indexed by ferry_dtype value; holes (retired GGUF ids, 40..63) have name == NULL. */
static const dtype_info table[FERRY_DTYPE_COUNT] = {
    [FERRY_DTYPE_F32] = {"f32", "F32", 1, 4},
    [FERRY_DTYPE_F16] = {"f16", "F16", 1, 2},
    [FERRY_DTYPE_Q4_0] = {"q4_0", NULL, 32, 18},
    [FERRY_DTYPE_Q4_1] = {"q4_1", NULL, 32, 20},
    [FERRY_DTYPE_Q5_0] = {"q5_0", NULL, 32, 22},
    [FERRY_DTYPE_Q5_1] = {"q5_1", NULL, 32, 24},
    [FERRY_DTYPE_Q8_0] = {"q8_0", NULL, 32, 34},
    [FERRY_DTYPE_Q8_1] = {"q8_1", NULL, 32, 36},
    [FERRY_DTYPE_Q2_K] = {"q2_k", NULL, 256, 84},
    [FERRY_DTYPE_Q3_K] = {"q3_k", NULL, 256, 110},
    [FERRY_DTYPE_Q4_K] = {"q4_k", NULL, 256, 144},
    [FERRY_DTYPE_Q5_K] = {"q5_k", NULL, 256, 176},
    [FERRY_DTYPE_Q6_K] = {"q6_k", NULL, 256, 210},
    [FERRY_DTYPE_Q8_K] = {"q8_k", NULL, 256, 292},
    [FERRY_DTYPE_IQ2_XXS] = {"iq2_xxs", NULL, 256, 66},
    [FERRY_DTYPE_IQ2_XS] = {"iq2_xs", NULL, 256, 74},
    [FERRY_DTYPE_IQ3_XXS] = {"iq3_xxs", NULL, 256, 98},
    [FERRY_DTYPE_IQ1_S] = {"iq1_s", NULL, 256, 50},
    [FERRY_DTYPE_IQ4_NL] = {"iq4_nl", NULL, 32, 18},
    [FERRY_DTYPE_IQ3_S] = {"iq3_s", NULL, 256, 110},
    [FERRY_DTYPE_IQ2_S] = {"iq2_s", NULL, 256, 82},
    [FERRY_DTYPE_IQ4_XS] = {"iq4_xs", NULL, 256, 136},
    [FERRY_DTYPE_I8] = {"i8", "I8", 1, 1},
    [FERRY_DTYPE_I16] = {"i16", "I16", 1, 2},
    [FERRY_DTYPE_I32] = {"i32", "I32", 1, 4},
    [FERRY_DTYPE_I64] = {"i64", "I64", 1, 8},
    [FERRY_DTYPE_F64] = {"f64", "F64", 1, 8},
    [FERRY_DTYPE_IQ1_M] = {"iq1_m", NULL, 256, 56},
    [FERRY_DTYPE_BF16] = {"bf16", "BF16", 1, 2},
    [FERRY_DTYPE_TQ1_0] = {"tq1_0", NULL, 256, 54},
    [FERRY_DTYPE_TQ2_0] = {"tq2_0", NULL, 256, 66},
    [FERRY_DTYPE_MXFP4] = {"mxfp4", NULL, 32, 17},
    [FERRY_DTYPE_BOOL] = {"bool", "BOOL", 1, 1},
    [FERRY_DTYPE_U8] = {"u8", "U8", 1, 1},
    [FERRY_DTYPE_U16] = {"u16", "U16", 1, 2},
    [FERRY_DTYPE_U32] = {"u32", "U32", 1, 4},
    [FERRY_DTYPE_U64] = {"u64", "U64", 1, 8},
    [FERRY_DTYPE_F8_E4M3] = {"f8_e4m3", "F8_E4M3", 1, 1},
    [FERRY_DTYPE_F8_E5M2] = {"f8_e5m2", "F8_E5M2", 1, 1},
    [FERRY_DTYPE_F8_E8M0] = {"f8_e8m0", "F8_E8M0", 1, 1},
    [FERRY_DTYPE_F6_E2M3] = {"f6_e2m3", "F6_E2M3", 4, 3},
    [FERRY_DTYPE_F6_E3M2] = {"f6_e3m2", "F6_E3M2", 4, 3},
    [FERRY_DTYPE_F4] = {"f4", "F4", 2, 1},
    [FERRY_DTYPE_C64] = {"c64", "C64", 1, 8},
};

static const dtype_info *info(ferry_dtype t)
{
    if ((int)t < 0 || (int)t >= FERRY_DTYPE_COUNT || !table[t].name)
        return NULL;
    return &table[t];
}

int ferry__dtype_valid(ferry_dtype t) { return info(t) != NULL; }

int ferry__dtype_in_gguf(ferry_dtype t)
{
    return (int)t >= 0 && (int)t < FERRY_DTYPE_GGUF_COUNT && info(t) != NULL;
}

int ferry__dtype_from_gguf(uint32_t id, ferry_dtype *out)
{
    if (id >= FERRY_DTYPE_GGUF_COUNT || !table[id].name)
        return FERRY_EDTYPE;
    if (out)
        *out = (ferry_dtype)id;
    return 0;
}

int ferry__dtype_from_st(const char *s, size_t len, ferry_dtype *out)
{
    if (!s)
        return FERRY_EDTYPE;
    for (int t = 0; t < FERRY_DTYPE_COUNT; t++) {
        const char *st = table[t].st_name;
        if (st && strlen(st) == len && memcmp(st, s, len) == 0) {
            if (out)
                *out = (ferry_dtype)t;
            return 0;
        }
    }
    return FERRY_EDTYPE;
}

const char *ferry__dtype_st_name(ferry_dtype t)
{
    const dtype_info *d = info(t);
    return d ? d->st_name : NULL;
}

const char *ferry_dtype_name(ferry_dtype t)
{
    const dtype_info *d = info(t);
    return d ? d->name : "?";
}

ferry_dtype ferry_dtype_from_name(const char *name)
{
    if (!name || !*name)
        return FERRY_DTYPE_NONE;
    /* Safetensors' upper-case names are the lower-case names in another case, so one
     * case-insensitive comparison covers both spellings. */
    for (int t = 0; t < FERRY_DTYPE_COUNT; t++)
        if (table[t].name && strcasecmp(table[t].name, name) == 0)
            return (ferry_dtype)t;
    return FERRY_DTYPE_NONE;
}

uint32_t ferry_dtype_block_elems(ferry_dtype t)
{
    const dtype_info *d = info(t);
    return d ? d->blck : 0;
}

uint32_t ferry_dtype_block_bytes(ferry_dtype t)
{
    const dtype_info *d = info(t);
    return d ? d->bytes : 0;
}

int ferry_dtype_nbytes(ferry_dtype t, uint64_t n, uint64_t *out)
{
    const dtype_info *d = info(t);
    if (!d)
        return FERRY_EDTYPE;
    if (n % d->blck != 0)
        return FERRY_ESHAPE;
    uint64_t bytes;
    if (ferry__mul_u64(n / d->blck, d->bytes, &bytes))
        return FERRY_EOVERFLOW;
    if (out)
        *out = bytes;
    return 0;
}

int ferry__dtype_readable(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_F32: case FERRY_DTYPE_F16: case FERRY_DTYPE_BF16: case FERRY_DTYPE_F64:
    case FERRY_DTYPE_I8: case FERRY_DTYPE_I16: case FERRY_DTYPE_I32: case FERRY_DTYPE_I64:
    case FERRY_DTYPE_U8: case FERRY_DTYPE_U16: case FERRY_DTYPE_U32: case FERRY_DTYPE_U64:
    case FERRY_DTYPE_BOOL:
    case FERRY_DTYPE_Q4_0: case FERRY_DTYPE_Q4_1: case FERRY_DTYPE_Q5_0: case FERRY_DTYPE_Q5_1:
    case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q8_1:
    case FERRY_DTYPE_Q2_K: case FERRY_DTYPE_Q3_K: case FERRY_DTYPE_Q4_K: case FERRY_DTYPE_Q5_K:
    case FERRY_DTYPE_Q6_K: case FERRY_DTYPE_Q8_K:
    case FERRY_DTYPE_IQ4_NL: case FERRY_DTYPE_IQ4_XS: case FERRY_DTYPE_MXFP4:
    case FERRY_DTYPE_F8_E4M3: case FERRY_DTYPE_F8_E5M2: case FERRY_DTYPE_F8_E8M0:
        return 1;
    default:
        return 0;
    }
}

int ferry__dtype_writable(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_F32: case FERRY_DTYPE_F16: case FERRY_DTYPE_BF16: case FERRY_DTYPE_F64:
    case FERRY_DTYPE_Q4_0: case FERRY_DTYPE_Q4_1: case FERRY_DTYPE_Q5_0: case FERRY_DTYPE_Q5_1:
    case FERRY_DTYPE_Q8_0: case FERRY_DTYPE_Q8_1:
        return 1;
    default:
        return 0;
    }
}
