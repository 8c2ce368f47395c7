/*
 * lora_merge.c — what `ferry lora merge` writes: a copy of a model with LoRA adapters merged into
 * its weights, through the manager, so that the file holds exactly what an engine gets from
 * ferry_prepare with the same adapters (the same f32 arithmetic, the same rounding into each
 * weight's type). The base lives on disk (home disk, the default host budget): each tensor is
 * prepared, written and released in file order; what is written stays cached only as far as the
 * budget has room. Adapters are added as required: a weight they cover that cannot take a merge
 * (a k-quant, say) fails the merge rather than being written unmerged. The output is written
 * atomically by ferry_writer (nothing appears under OUT unless complete) and keeps the base's
 * metadata; safetensors holds only string metadata, so other values are written as text there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora_merge.h"
#include "runopts.h"

/* V as text: numbers in decimal, booleans as true/false, arrays as compact JSON. */
static char *value_text(const ferry_value *v)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m)
        return NULL;
    switch (v->type) {
    case FERRY_VALUE_U8:
    case FERRY_VALUE_U16:
    case FERRY_VALUE_U32:
    case FERRY_VALUE_U64: fprintf(m, "%llu", (unsigned long long)v->v.u); break;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: fprintf(m, "%lld", (long long)v->v.i); break;
    case FERRY_VALUE_F32: fprintf(m, "%.9g", v->v.f); break;
    case FERRY_VALUE_F64: fprintf(m, "%.17g", v->v.f); break;
    case FERRY_VALUE_BOOL: fputs(v->v.u ? "true" : "false", m); break;
    case FERRY_VALUE_STRING: fwrite(v->v.str.ptr, 1, v->v.str.len, m); break;
    default: { /* arrays: compact JSON */
        cli_json j;
        cli_json_init(&j, m);
        cli_json_begin_array(&j, 1);
        for (uint64_t i = 0; i < v->v.arr.n; i++)
            cli_json_value(&j, &v->v.arr.items[i]);
        cli_json_end_array(&j);
        break;
    }
    }
    if (fclose(m) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Copies every metadata key of C into W (GGUF: with its type; safetensors: as text). */
static int copy_meta(const ferry_catalog *c, ferry_writer *w, ferry_format out)
{
    for (size_t i = 0; i < ferry_catalog_meta_count(c); i++) {
        const char *key = ferry_catalog_meta_key(c, i);
        const ferry_value *v = ferry_catalog_meta_value(c, i);
        int rc;
        if (out == FERRY_FORMAT_GGUF || v->type == FERRY_VALUE_STRING) {
            rc = ferry_writer_set_meta(w, key, v);
        } else {
            char *s = value_text(v);
            if (!s)
                return cli_error("out of memory");
            rc = ferry_writer_set_meta_str(w, key, s);
            free(s);
        }
        if (rc)
            return cli_error("metadata '%s': %s", key, ferry_writer_errmsg(w));
    }
    return 0;
}

/* Adds the adapters to F (merge mode, required), warns about pairs that match nothing and fails
 * on an adapter that matches nothing at all. */
static int add_adapters(ferry *f, const char *base, lora_merge_adapter *ad, int n)
{
    ferry_lora_options o;
    memset(&o, 0, sizeof o);
    o.required = 1;
    for (int i = 0; i < n; i++) {
        int rc = ferry_lora_add(f, ad[i].path, ad[i].mult, &o, &ad[i].id);
        if (rc)
            return cli_fail(ad[i].path, ferry_errmsg(f), rc);
        ferry_lora_info info;
        if (ferry_lora_get_info(f, ad[i].id, &info))
            return cli_error("%s", ferry_errmsg(f));
        if (info.n_matched == 0)
            return cli_error("%s: none of its %u %s pairs matches a tensor of %s%s%s%s",
                             ad[i].path, info.n_pairs, info.scheme, base,
                             info.unmatched[0] ? " (first: '" : "",
                             info.unmatched[0] ? info.unmatched[0] : "",
                             info.unmatched[0] ? "')" : "");
        if (info.n_unmatched)
            fprintf(stderr,
                    "ferry lora merge: warning: %s: %u of %u pairs match no tensor of %s and are "
                    "not merged (first: '%s')\n",
                    ad[i].path, info.n_unmatched, info.n_pairs, base, info.unmatched[0]);
    }
    return 0;
}

/* Declares every tensor of C in W, shapes turned into OUT's order. */
static int declare_tensors(const ferry_catalog *c, ferry_writer *w, ferry_format out)
{
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        int64_t shape[FERRY_MAX_DIMS];
        for (uint32_t d = 0; d < in.ndim; d++)
            shape[d] = in.format == out ? in.shape[d] : in.shape[in.ndim - 1 - d];
        if (ferry_writer_add_tensor(w, in.name, in.dtype, in.ndim, shape)) {
            const char *msg = ferry_writer_errmsg(w);
            return cli_error("%s%s", msg,
                             out == FERRY_FORMAT_SAFETENSORS && ferry_dtype_block_elems(in.dtype) > 1
                                 ? " (write GGUF with --format gguf)"
                                 : "");
        }
    }
    return 0;
}

/* Prepares, writes and releases every tensor TS[i] (catalog entry i of F) in file order. */
static int write_tensors(ferry *f, ferry_tensor **ts, ferry_writer *w, const char *out, int quiet,
                         size_t *merged, uint64_t *bytes)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    cli_progress bar;
    cli_progress_start(&bar, "merge", ferry_catalog_total_bytes(c), !quiet);
    int rc = 0;
    *merged = 0;
    *bytes = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        ferry_tensor *t = ts[i];
        if (ferry_prepare(f, &t, 1)) {
            rc = cli_fail(in.file, ferry_errmsg(f), -1);
            break;
        }
        if (i + 1 < n) /* read the next weight while this one is written */
            ferry_prefetch(f, &ts[i + 1], 1);
        const void *data = ferry_tensor_data(t);
        uint64_t nb = ferry_tensor_nbytes(t);
        ferry_lora_factor fac;
        if (ferry_lora_factors(f, t, 0, &fac) == 0)
            (*merged)++;
        if (!data || nb != in.nbytes || ferry_tensor_dtype(t) != in.dtype) {
            rc = cli_error("%s: tensor '%s': staged as %llu bytes of %s, expected %llu of %s",
                           in.file, in.name, (unsigned long long)nb,
                           ferry_dtype_name(ferry_tensor_dtype(t)),
                           (unsigned long long)in.nbytes, ferry_dtype_name(in.dtype));
        } else if (nb > SIZE_MAX) {
            rc = cli_error("%s: tensor '%s' of %llu bytes is too large here", in.file, in.name,
                           (unsigned long long)nb);
        } else if (ferry_writer_write(w, data, (size_t)nb)) {
            rc = cli_fail(out, ferry_writer_errmsg(w), -1);
        }
        ferry_release(f, &t, 1);
        *bytes += nb;
        cli_progress_update(&bar, *bytes);
    }
    cli_progress_end(&bar);
    return rc;
}

int lora_merge_write(const char *base, lora_merge_adapter *ad, int nad, const char *out,
                     ferry_format fmt, int quiet, lora_merge_result *res)
{
    ferry *f = NULL;
    ferry_writer *w = NULL;
    ferry_tensor **ts = NULL;
    char *real = NULL; /* the file written: OUT, or the target of the link OUT */
    int rc = 0;
    memset(res, 0, sizeof *res);
    if (nad < 1 || nad > RUNOPTS_MAX_ADAPTERS)
        return cli_error("lora merge: %d adapters; 1 to %d", nad, RUNOPTS_MAX_ADAPTERS);
    if (!(f = ferry_create(NULL))) {
        rc = cli_error("out of memory");
        goto done;
    }
    if ((rc = ferry_open(f, base, NULL)) != 0) {
        rc = cli_fail(base, ferry_errmsg(f), rc);
        goto done;
    }
    const ferry_catalog *c = ferry_catalog_of(f);
    /* neither the base (any of its files) nor an adapter may be replaced by the merge */
    const char *inputs[RUNOPTS_MAX_ADAPTERS];
    for (int i = 0; i < nad; i++)
        inputs[i] = ad[i].path;
    if ((rc = cli_check_output("lora merge", "-o", out, inputs, (size_t)nad, "adapter", c,
                                "base model", &real)) != 0)
        goto done;
    if (fmt == FERRY_FORMAT_UNKNOWN)
        fmt = ferry_catalog_file_format(c, 0);
    /* One weight at a time from the file, never lazy (a lazy weight cannot take a merge);
     * written weights stay cached only while the default host budget has room for them. */
    ferry_policy p;
    memset(&p, 0, sizeof p);
    p.home = FERRY_HOME_DISK;
    p.load = FERRY_LOAD_AUTO;
    p.lazy = FERRY_LAZY_OFF;
    if (ferry_group_add(f, "all", "*", &p)) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto done;
    }
    /* Every handle, looked up before the adapters exist: a lookup is no use of a weight. */
    size_t nt = ferry_catalog_count(c);
    if (!(ts = calloc(nt ? nt : 1, sizeof *ts))) {
        rc = cli_error("out of memory");
        goto done;
    }
    for (size_t i = 0; i < nt; i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        if (!(ts[i] = ferry_find(f, in.name))) {
            rc = cli_fail(in.file, ferry_errmsg(f), -1);
            goto done;
        }
    }
    if ((rc = add_adapters(f, base, ad, nad)) != 0)
        goto done;
    if (!(w = ferry_writer_create(fmt))) {
        rc = cli_error("out of memory");
        goto done;
    }
    if ((rc = copy_meta(c, w, fmt)) != 0 || (rc = declare_tensors(c, w, fmt)) != 0)
        goto done;
    double t0 = cli_now();
    if (ferry_writer_begin(w, real)) {
        rc = cli_fail(out, ferry_writer_errmsg(w), -1);
        goto done;
    }
    if ((rc = write_tensors(f, ts, w, out, quiet, &res->merged, &res->bytes)) != 0)
        goto done;
    if (ferry_writer_finish(w)) {
        rc = cli_fail(out, ferry_writer_errmsg(w), -1);
        goto done;
    }
    res->seconds = cli_now() - t0;
    res->format = fmt;
    res->n_tensors = ferry_catalog_count(c);
done:
    ferry_writer_destroy(w); /* an unfinished temporary file goes with it */
    free(real);
    free(ts);
    ferry_destroy(f);
    return rc;
}
