/*
 * lora_scan.c — what `ferry lora info` reads out of an adapter beyond ferry_lora_get_info: the
 * ranks of its factors, its alpha (metadata or per-module tensors), and the scales ferry applies.
 * Uses only the public header ferry.h; part of ferry_tools.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora_scan.h"

static int lsc_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static const char *const a_suffixes[] = {".lora_A.weight", ".lora_A.default.weight",
                                         ".lora_down.weight", ".lora_a"};

void lora_range_add(lora_range *r, double v)
{
    if (!r->n || v < r->lo)
        r->lo = v;
    if (!r->n || v > r->hi)
        r->hi = v;
    r->n++;
}

/* Reads the one-element float tensor IN (a kohya per-module alpha). 0 or -1. */
static int read_scalar(const ferry_tensor_info *in, double *out)
{
    unsigned char buf[8];
    float v;
    if (in->n_elems != 1 || in->nbytes > sizeof buf || !ferry_dtype_can_convert(in->dtype, FERRY_DTYPE_F32))
        return -1;
    FILE *fp = fopen(in->file, "rb");
    if (!fp)
        return -1;
    int ok = fseeko(fp, (off_t)in->offset, SEEK_SET) == 0 &&
             fread(buf, 1, (size_t)in->nbytes, fp) == in->nbytes;
    fclose(fp);
    if (!ok || ferry_dtype_convert(in->dtype, buf, FERRY_DTYPE_F32, &v, 1) || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

void lora_scan_adapter(const ferry_catalog *c, lora_scan *s)
{
    static const char *const alpha_keys[] = {"adapter.lora.alpha", "lora_alpha", "alpha",
                                             "ss_network_alpha"};
    memset(s, 0, sizeof *s);
    s->factor_dtype = FERRY_DTYPE_NONE;
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        for (size_t k = 0; k < sizeof a_suffixes / sizeof a_suffixes[0]; k++)
            if (lsc_ends_with(in.name, a_suffixes[k]) && in.ndim >= 2) {
                int64_t r = in.format == FERRY_FORMAT_GGUF ? in.shape[in.ndim - 1] : in.shape[0];
                lora_range_add(&s->rank, (double)r);
                if (s->factor_dtype == FERRY_DTYPE_NONE)
                    s->factor_dtype = in.dtype;
            }
        double a;
        if (lsc_ends_with(in.name, ".alpha") && read_scalar(&in, &a) == 0)
            lora_range_add(&s->alpha_tensor, a);
    }
    for (size_t k = 0; k < sizeof alpha_keys / sizeof alpha_keys[0] && !s->alpha_key; k++) {
        double a;
        const char *str;
        if (ferry_catalog_get_f64(c, alpha_keys[k], &a) == 0) {
            s->alpha_key = alpha_keys[k];
            s->alpha = a;
        } else if (ferry_catalog_get_str(c, alpha_keys[k], &str) == 0) {
            char *end;
            a = strtod(str, &end);
            if (end != str && !*end && isfinite(a)) {
                s->alpha_key = alpha_keys[k];
                s->alpha = a;
            }
        }
    }
}


void lora_scan_scales(ferry *f, lora_range *scale)
{
    const ferry_catalog *bc = ferry_catalog_of(f);
    for (size_t i = 0; i < ferry_catalog_count(bc); i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(bc, i, &in);
        ferry_tensor *t = ferry_find(f, in.name);
        ferry_lora_factor fac;
        for (size_t k = 0; t && ferry_lora_factors(f, t, k, &fac) == 0; k++)
            lora_range_add(scale, fac.scale);
    }
}
