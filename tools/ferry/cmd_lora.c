/*
 * cmd_lora.c — `ferry lora merge`: writes a copy of a model with LoRA adapters merged into its
 * weights (the writing is lora_merge.c's), and `ferry lora info`: what an adapter holds and how
 * it maps onto a base.
 */
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "lora_merge.h"
#include "lora_scan.h"
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

/* ---- merge ---------------------------------------------------------------------------------- */

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
    lora_merge_adapter ad[RUNOPTS_MAX_ADAPTERS];
    memset(ad, 0, sizeof ad);
    int nad = 0;
    for (int i = 0; i < ro.n_adapters && !rc; i++) {
        rc = runopts_adapter("lora merge", ro.adapters[i], &ad[i].path, &ad[i].mult);
        nad = i + 1;
    }
    lora_merge_result res;
    if (!rc)
        rc = lora_merge_write(base, ad, nad, out, fmt, quiet, &res);
    if (!rc && !quiet) {
        char sz[32];
        printf("merged %d adapter%s into %zu of %zu tensors: wrote %s (%s, %s) in %.2f s\n", nad,
               nad == 1 ? "" : "s", res.merged, res.n_tensors, out, ferry_format_name(res.format),
               cli_size(res.bytes, sz), res.seconds);
    }
    for (int i = 0; i < nad; i++)
        free(ad[i].path);
    return rc;
}

/* ---- info ----------------------------------------------------------------------------------- */

static void range_print(FILE *o, const lora_range *r)
{
    if (r->lo == r->hi)
        fprintf(o, "%g", r->lo);
    else
        fprintf(o, "%g .. %g", r->lo, r->hi);
}

static void range_json(cli_json *j, const char *key, const lora_range *r)
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
    lora_scan s;
    lora_scan_adapter(c, &s);
    /* The scales ferry applies at multiplier 1 (alpha / rank, whatever gave alpha). */
    lora_range scale = {0, 0, 0};
    if (base)
        lora_scan_scales(f, &scale);
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
