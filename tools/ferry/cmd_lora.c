/*
 * cmd_lora.c — `ferry lora merge`: writes a copy of a model with LoRA adapters merged into its
 * weights, and `ferry lora info`: what an adapter holds and how it maps onto a base.
 *
 * merge goes through the manager, so the merged file holds exactly what an engine gets from
 * ferry_prepare with the same adapters (the same f32 arithmetic, the same rounding into each
 * weight's type). The base lives on disk (home disk, the default host budget): each tensor is
 * prepared, written and released in file order; what is written stays cached only as far as the
 * budget has room. Adapters are added as required: a weight they cover that cannot take a merge
 * (a k-quant, say) fails the command rather than being written unmerged. The output is written
 * atomically by ferry_writer (nothing appears under OUT unless complete) and keeps the base's
 * metadata; safetensors holds only string metadata, so other values are written as text there
 * (numbers in decimal, booleans as true/false, arrays as JSON).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "runopts.h"

static const char *HELP =
    "usage: ferry lora merge BASE -a ADAPTER[:MULT] [-a ...] -o OUT [options]\n"
    "       ferry lora info ADAPTER [--base BASE] [--json]\n"
    "\n"
    "merge  writes OUT: BASE with every adapter merged into the weights it covers,\n"
    "       W + MULT * alpha/rank * (B . A), computed in f32 and stored in each weight's own\n"
    "       type (f32, f16, bf16, q8_0, q4_0, ...). Metadata and tensor order are kept. The\n"
    "       file appears only when complete. Adapters: PEFT, kohya or GGUF LoRA, in\n"
    "       safetensors or GGUF.\n"
    "info   the adapter's naming scheme, factor pairs, ranks and alphas; with --base, which\n"
    "       pairs map to a tensor of BASE and the scales ferry applies.\n"
    "\n"
    "options of merge:\n"
    "  -a, --adapter PATH[:MULT]  an adapter and its multiplier (default 1; repeatable)\n"
    "  -o, --output FILE      where to write (not BASE itself)\n"
    "  --format gguf|safetensors\n"
    "                         output format (default: from OUT's extension, else BASE's)\n"
    "  -q, --quiet            no progress bar and no summary line\n"
    "options of info:\n"
    "  --base FILE            map the adapter onto this model\n"
    "  --json                 one JSON object on stdout\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n";

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

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

/* ---- merge ---------------------------------------------------------------------------------- */

typedef struct merge_adapter {
    char *path;
    float mult;
    int id;
} merge_adapter;

/* Adds the adapters to F (merge mode, required), warns about pairs that match nothing and fails
 * on an adapter that matches nothing at all. */
static int add_adapters(ferry *f, const char *base, merge_adapter *ad, int n)
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

static int lora_merge(int argc, char **argv)
{
    runopts ro;
    memset(&ro, 0, sizeof ro);
    if (runopts_collect_adapters("lora merge", &ro, &argc, argv))
        return CLI_EXIT_USAGE;
    const char *out = NULL, *format = NULL;
    int quiet = 0, npos = 0;
    cli_opt opts[] = {
        {"output", 'o', CLI_OPT_STRING, &out},
        {"format", 0, CLI_OPT_STRING, &format},
        {"quiet", 'q', CLI_OPT_FLAG, &quiet},
    };
    int rc = cli_parse("lora merge", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos < 1)
        return cli_usage_error("lora merge", "no base model given");
    if (npos > 1)
        return cli_usage_error("lora merge", "one base model only ('%s' is extra)", argv[2]);
    if (ro.n_adapters == 0)
        return cli_usage_error("lora merge", "no adapter given: -a ADAPTER[:MULT]");
    if (!out)
        return cli_usage_error("lora merge", "no output file: give -o FILE");
    ferry_format fmt = FERRY_FORMAT_UNKNOWN;
    if (format) {
        if (!strcmp(format, "gguf"))
            fmt = FERRY_FORMAT_GGUF;
        else if (!strcmp(format, "safetensors"))
            fmt = FERRY_FORMAT_SAFETENSORS;
        else
            return cli_usage_error("lora merge", "--format: '%s' is not gguf or safetensors",
                                   format);
    } else if (ends_with(out, ".safetensors")) {
        fmt = FERRY_FORMAT_SAFETENSORS;
    } else if (ends_with(out, ".gguf")) {
        fmt = FERRY_FORMAT_GGUF;
    }
    const char *base = argv[1];
    merge_adapter ad[RUNOPTS_MAX_ADAPTERS];
    memset(ad, 0, sizeof ad);
    int nad = 0;
    for (int i = 0; i < ro.n_adapters && !rc; i++) {
        rc = runopts_adapter("lora merge", ro.adapters[i], &ad[i].path, &ad[i].mult);
        nad = i + 1;
    }
    ferry *f = NULL;
    ferry_writer *w = NULL;
    ferry_tensor **ts = NULL;
    char *real = NULL; /* the file written: OUT, or the target of the link OUT */
    if (rc)
        goto done;
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
    size_t merged = 0;
    uint64_t bytes = 0;
    if ((rc = write_tensors(f, ts, w, out, quiet, &merged, &bytes)) != 0)
        goto done;
    if (ferry_writer_finish(w)) {
        rc = cli_fail(out, ferry_writer_errmsg(w), -1);
        goto done;
    }
    if (!quiet) {
        char sz[32];
        double secs = cli_now() - t0;
        printf("merged %d adapter%s into %zu of %zu tensors: wrote %s (%s, %s) in %.2f s\n", nad,
               nad == 1 ? "" : "s", merged, ferry_catalog_count(c), out, ferry_format_name(fmt),
               cli_size(bytes, sz), secs);
    }
done:
    ferry_writer_destroy(w); /* an unfinished temporary file goes with it */
    free(real);
    free(ts);
    ferry_destroy(f);
    for (int i = 0; i < nad; i++)
        free(ad[i].path);
    return rc;
}

/* ---- info ----------------------------------------------------------------------------------- */

static const char *const a_suffixes[] = {".lora_A.weight", ".lora_A.default.weight",
                                         ".lora_down.weight", ".lora_a"};

typedef struct range {
    double lo, hi;
    uint64_t n;
} range;

static void range_add(range *r, double v)
{
    if (!r->n || v < r->lo)
        r->lo = v;
    if (!r->n || v > r->hi)
        r->hi = v;
    r->n++;
}

static void range_print(FILE *o, const range *r)
{
    if (r->lo == r->hi)
        fprintf(o, "%g", r->lo);
    else
        fprintf(o, "%g .. %g", r->lo, r->hi);
}

static void range_json(cli_json *j, const char *key, const range *r)
{
    cli_json_key(j, key);
    if (!r->n) {
        cli_json_null(j);
        return;
    }
    cli_json_begin_object(j, 1);
    cli_json_key(j, "min");
    cli_json_f64(j, r->lo);
    cli_json_key(j, "max");
    cli_json_f64(j, r->hi);
    cli_json_end_object(j);
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

typedef struct adapter_scan {
    range rank, alpha_tensor;
    const char *alpha_key; /* metadata key of the adapter-wide alpha, or NULL */
    double alpha;
    ferry_dtype factor_dtype;
} adapter_scan;

static void scan_adapter(const ferry_catalog *c, adapter_scan *s)
{
    static const char *const alpha_keys[] = {"adapter.lora.alpha", "lora_alpha", "alpha",
                                             "ss_network_alpha"};
    memset(s, 0, sizeof *s);
    s->factor_dtype = FERRY_DTYPE_NONE;
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        for (size_t k = 0; k < sizeof a_suffixes / sizeof a_suffixes[0]; k++)
            if (ends_with(in.name, a_suffixes[k]) && in.ndim >= 2) {
                int64_t r = in.format == FERRY_FORMAT_GGUF ? in.shape[in.ndim - 1] : in.shape[0];
                range_add(&s->rank, (double)r);
                if (s->factor_dtype == FERRY_DTYPE_NONE)
                    s->factor_dtype = in.dtype;
            }
        double a;
        if (ends_with(in.name, ".alpha") && read_scalar(&in, &a) == 0)
            range_add(&s->alpha_tensor, a);
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

static int lora_info(int argc, char **argv)
{
    const char *base = NULL;
    int json = 0, npos = 0;
    cli_opt opts[] = {
        {"base", 0, CLI_OPT_STRING, &base},
        {"json", 0, CLI_OPT_FLAG, &json},
    };
    int rc = cli_parse("lora info", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos != 1)
        return cli_usage_error("lora info", npos ? "one adapter at a time" : "no adapter given");
    const char *path = argv[1];
    ferry_catalog *c = ferry_catalog_create();
    ferry *f = ferry_create(NULL);
    if (!c || !f) {
        ferry_catalog_destroy(c);
        ferry_destroy(f);
        return cli_error("out of memory");
    }
    if ((rc = ferry_catalog_add(c, path, NULL)) != 0) {
        rc = cli_fail(path, ferry_catalog_errmsg(c), rc);
        goto done;
    }
    if (base && (rc = ferry_open(f, base, NULL)) != 0) {
        rc = cli_fail(base, ferry_errmsg(f), rc);
        goto done;
    }
    /* Adding it checks it the way merge and run would (pairs, ranks, shapes against BASE). */
    int id = -1;
    if ((rc = ferry_lora_add(f, path, 1.0f, NULL, &id)) != 0) {
        rc = cli_fail(path, ferry_errmsg(f), rc);
        goto done;
    }
    ferry_lora_info info;
    if ((rc = ferry_lora_get_info(f, id, &info)) != 0) {
        rc = cli_error("%s", ferry_errmsg(f));
        goto done;
    }
    adapter_scan s;
    scan_adapter(c, &s);
    /* The scales ferry applies at multiplier 1 (alpha / rank, whatever gave alpha). */
    range scale = {0, 0, 0};
    if (base) {
        const ferry_catalog *bc = ferry_catalog_of(f);
        for (size_t i = 0; i < ferry_catalog_count(bc); i++) {
            ferry_tensor_info in;
            ferry_catalog_tensor(bc, i, &in);
            ferry_tensor *t = ferry_find(f, in.name);
            ferry_lora_factor fac;
            for (size_t k = 0; t && ferry_lora_factors(f, t, k, &fac) == 0; k++)
                range_add(&scale, fac.scale);
        }
    }
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_begin_object(&j, 0);
        cli_json_key(&j, "path");
        cli_json_string(&j, path);
        cli_json_key(&j, "format");
        cli_json_string(&j, ferry_format_name(ferry_catalog_file_format(c, 0)));
        cli_json_key(&j, "scheme");
        cli_json_string(&j, info.scheme);
        cli_json_key(&j, "pairs");
        cli_json_u64(&j, info.n_pairs);
        cli_json_key(&j, "factor_dtype");
        cli_json_string(&j, ferry_dtype_name(s.factor_dtype));
        range_json(&j, "rank", &s.rank);
        cli_json_key(&j, "alpha");
        if (s.alpha_key)
            cli_json_f64(&j, s.alpha);
        else
            cli_json_null(&j);
        cli_json_key(&j, "alpha_key");
        if (s.alpha_key)
            cli_json_string(&j, s.alpha_key);
        else
            cli_json_null(&j);
        range_json(&j, "alpha_tensors", &s.alpha_tensor);
        if (base) {
            cli_json_key(&j, "base");
            cli_json_string(&j, base);
            cli_json_key(&j, "matched");
            cli_json_u64(&j, info.n_matched);
            cli_json_key(&j, "unmatched");
            cli_json_u64(&j, info.n_unmatched);
            cli_json_key(&j, "unmatched_names");
            cli_json_begin_array(&j, 0);
            for (size_t k = 0; k < 4 && info.unmatched[k]; k++)
                cli_json_string(&j, info.unmatched[k]);
            cli_json_end_array(&j);
            cli_json_key(&j, "factor_bytes");
            cli_json_u64(&j, info.factor_bytes);
            range_json(&j, "scale", &scale);
        }
        cli_json_end_object(&j);
        cli_json_finish(&j);
        goto done;
    }
    printf("adapter    %s\n", path);
    printf("scheme     %s (%s, %s factors)\n", info.scheme,
           ferry_format_name(ferry_catalog_file_format(c, 0)), ferry_dtype_name(s.factor_dtype));
    printf("pairs      %u\n", info.n_pairs);
    if (s.rank.n) {
        printf("rank       ");
        range_print(stdout, &s.rank);
        putchar('\n');
    }
    printf("alpha      ");
    if (s.alpha_tensor.n) {
        range_print(stdout, &s.alpha_tensor);
        printf(" (per module, %llu of %u pairs)", (unsigned long long)s.alpha_tensor.n,
               info.n_pairs);
        if (s.alpha_tensor.n < info.n_pairs) {
            if (s.alpha_key)
                printf("; %g (metadata %s) for the others", s.alpha, s.alpha_key);
            else
                printf("; the others: alpha = rank");
        }
    } else if (s.alpha_key) {
        printf("%g (metadata %s)", s.alpha, s.alpha_key);
    } else {
        printf("not in the file (alpha = rank, unless a PEFT adapter_config.json beside it "
               "says otherwise)");
    }
    putchar('\n');
    if (base) {
        char sz[32];
        printf("base       %s: %u matched, %u unmatched\n", base, info.n_matched,
               info.n_unmatched);
        for (size_t k = 0; k < 4 && info.unmatched[k]; k++)
            printf("unmatched  %s\n", info.unmatched[k]);
        if (info.n_unmatched > 4)
            printf("           ... and %u more\n", info.n_unmatched - 4);
        if (scale.n) {
            printf("scale      ");
            range_print(stdout, &scale);
            printf(" (alpha/rank, at multiplier 1)\n");
        }
        printf("factors    %s as f32 (cached while the adapter is in use)\n",
               cli_size(info.factor_bytes, sz));
    }
done:
    ferry_destroy(f);
    ferry_catalog_destroy(c);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------------ */

int cmd_lora(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage_error("lora", "no subcommand: merge or info");
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(sub, "merge"))
        return lora_merge(argc - 1, argv + 1);
    if (!strcmp(sub, "info"))
        return lora_info(argc - 1, argv + 1);
    return cli_usage_error("lora", "unknown subcommand '%s' (merge or info)", sub);
}
