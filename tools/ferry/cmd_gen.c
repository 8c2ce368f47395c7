/*
 * cmd_gen.c — `ferry gen`: writes a synthetic model (synth.c) with the real tensor names and shapes
 * of a llama LLM (dense, or a Mixtral-style mixture of experts) or a diffusers UNet, sized by --size or by explicit dimensions, deterministic from
 * --seed. Used by tests, demos and benchmarks to get models of any size without downloading one.
 * With --lora BASE it writes a LoRA adapter for an existing model instead (gen_lora.c).
 */
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "commands.h"
#include "gen_lora.h"
#include "synth.h"

static const char *HELP =
    "usage: ferry gen -o FILE [options]\n"
    "       ferry gen --lora BASE -o ADAPTER [--rank R] [--scheme peft|kohya|gguf] [--seed N]\n"
    "\n"
    "Writes a synthetic model with the real tensor names and shapes of an architecture, filled\n"
    "with values shaped like trained weights. The same options and seed give the same bytes.\n"
    "The file appears only when complete.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE      where to write (required unless --dry-run)\n"
    "  --format gguf|safetensors\n"
    "                         file format (default: safetensors for a *.safetensors FILE,\n"
    "                         gguf otherwise)\n"
    "  --arch llama|moe|unet  architecture (default llama); moe: a Mixtral-style llama whose\n"
    "                         feed-forward is a mixture of experts (ffn_gate_inp, the\n"
    "                         router, N(0, 1) and f32 in GGUF; ffn_{gate,up,down}_exps)\n"
    "  --size SIZE            aim at this many bytes of tensors, within about 10% (default\n"
    "                         256MiB when no dimension is given): 1GiB, 500MB, ...\n"
    "  --dtype TYPE           f32, f16 (default), bf16; q8_0, q4_0 in GGUF only. GGUF keeps\n"
    "                         norms and biases in f32; quantized rows that are no whole number\n"
    "                         of 32-element blocks stay f16.\n"
    "  --seed N               seed of the values (default 0)\n"
    "  llama dimensions (each one given overrides what --size would pick):\n"
    "  --layers N             transformer blocks\n"
    "  --dim D                embedding width\n"
    "  --ff F                 feed-forward width (default 8/3 of D, rounded)\n"
    "  --vocab V              vocabulary (default 32000, less for small sizes)\n"
    "  --heads H              attention heads (default D/128 or D/64)\n"
    "  --kv-heads K           key/value heads (default H)\n"
    "  --experts N            moe: experts per layer (default 8)\n"
    "  --experts-used K       moe: experts each token uses (default 2)\n"
    "  unet dimensions:\n"
    "  --layers N             resnets per down block (default 2)\n"
    "  --dim C                base channels (block widths C, 2C, 4C, 4C)\n"
    "  --heads H              attention heads (metadata only)\n"
    "\n"
    "  --dry-run              print what would be written, write nothing\n"
    "  --json                 print the summary as JSON\n"
    "  -q, --quiet            no progress bar, no summary\n"
    "  -h, --help             this text\n"
    "\n"
    "LoRA adapters (--lora): writes ADAPTER, a LoRA for the model BASE (any file ferry opens):\n"
    "factors for every attention and feed-forward matrix and every conv kernel, f16, alpha =\n"
    "2 * rank, deterministic from --seed. The adapter is checked against BASE before the\n"
    "command succeeds.\n"
    "  --lora BASE            the model to write an adapter for\n"
    "  --rank R               rank of the factors, 1..65536 (default 8)\n"
    "  --scheme peft|kohya|gguf\n"
    "                         naming scheme and format (default: gguf for a *.gguf ADAPTER,\n"
    "                         peft otherwise): peft and kohya write safetensors\n"
    "                         (...lora_A/lora_B.weight; lora_unet_...lora_down/lora_up.weight\n"
    "                         and .alpha), gguf writes GGUF (....lora_a/lora_b)\n"
    "  for example:\n"
    "    ferry gen -o base.gguf --size 64MiB\n"
    "    ferry gen --lora base.gguf -o lora.safetensors --rank 16\n"
    "    ferry run base.gguf -a lora.safetensors --verify\n";

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

#define DEFAULT_LORA_RANK 8

/* `ferry gen --lora BASE`: only -o, --rank, --scheme, --seed and --quiet apply. */
static int gen_lora(const char *base, const char *out, const char *rank, const char *scheme,
                    const char *seed, int quiet, const char *stray)
{
    if (stray)
        return cli_usage_error("gen", "%s does not apply to --lora (an adapter takes its shapes "
                               "from BASE)", stray);
    if (!out)
        return cli_usage_error("gen", "no output file: give -o ADAPTER");
    uint64_t r = DEFAULT_LORA_RANK, sd = 0;
    int rc;
    if (rank && (rc = cli_arg_u64("gen", "rank", rank, 1, 65536, &r)) != 0)
        return rc;
    if (seed && (rc = cli_arg_u64("gen", "seed", seed, 0, UINT64_MAX, &sd)) != 0)
        return rc;
    if (scheme && strcmp(scheme, "peft") != 0 && strcmp(scheme, "kohya") != 0 &&
        strcmp(scheme, "gguf") != 0)
        return cli_usage_error("gen", "--scheme: '%s' is not peft, kohya or gguf", scheme);
    if (!scheme)
        scheme = ends_with(out, ".gguf") ? "gguf" : "peft";
    /* the adapter may replace none of the base's files (all shards of an index) */
    ferry_catalog *c = ferry_catalog_create();
    if (c && ferry_catalog_add(c, base, NULL) != 0) {
        ferry_catalog_destroy(c);
        c = NULL; /* ferry_gen_lora reports why BASE does not open */
    }
    char *real = NULL;
    rc = cli_check_output("gen", "-o", out, &base, 1, "base model", c, "base model",
                          &real);
    ferry_catalog_destroy(c);
    if (rc == 0)
        rc = ferry_gen_lora(base, real, (unsigned)r, scheme, sd, quiet);
    free(real);
    return rc;
}

static int dim_arg(const char *opt, const char *s, uint32_t max, uint32_t *out)
{
    uint64_t v = 0;
    if (!s)
        return 0;
    int rc = cli_arg_u64("gen", opt, s, 1, max, &v);
    *out = (uint32_t)v;
    return rc;
}

static void print_summary_json(const synth_model *m, const char *path, int dry, double secs)
{
    const synth_config *c = &m->cfg;
    cli_json j;
    cli_json_init(&j, stdout);
    cli_json_begin_object(&j, 0);
    cli_json_key(&j, "path");
    if (path)
        cli_json_string(&j, path);
    else
        cli_json_null(&j);
    cli_json_key(&j, "written");
    cli_json_bool(&j, !dry);
    cli_json_key(&j, "format");
    cli_json_string(&j, ferry_format_name(c->format));
    cli_json_key(&j, "arch");
    cli_json_string(&j, synth_arch_name(c->arch));
    cli_json_key(&j, "dtype");
    cli_json_string(&j, ferry_dtype_name(c->dtype));
    cli_json_key(&j, "seed");
    cli_json_u64(&j, c->seed);
    cli_json_key(&j, "layers");
    cli_json_u64(&j, c->layers);
    cli_json_key(&j, "dim");
    cli_json_u64(&j, c->dim);
    if (c->arch == SYNTH_LLAMA) {
        cli_json_key(&j, "ff");
        cli_json_u64(&j, c->ff);
        cli_json_key(&j, "vocab");
        cli_json_u64(&j, c->vocab);
        cli_json_key(&j, "heads");
        cli_json_u64(&j, c->heads);
        cli_json_key(&j, "kv_heads");
        cli_json_u64(&j, c->kv_heads);
        if (c->experts) {
            cli_json_key(&j, "experts");
            cli_json_u64(&j, c->experts);
            cli_json_key(&j, "experts_used");
            cli_json_u64(&j, c->experts_used);
        }
    } else {
        cli_json_key(&j, "cross_attention_dim");
        cli_json_u64(&j, m->cross_dim);
        cli_json_key(&j, "heads");
        cli_json_u64(&j, c->heads);
    }
    cli_json_key(&j, "n_tensors");
    cli_json_u64(&j, m->n);
    cli_json_key(&j, "total_bytes");
    cli_json_u64(&j, m->total_bytes);
    if (!dry) {
        cli_json_key(&j, "seconds");
        cli_json_f64(&j, secs);
    }
    cli_json_end_object(&j);
    cli_json_finish(&j);
}

static void describe(const synth_model *m, char *buf, size_t len)
{
    const synth_config *c = &m->cfg;
    if (c->arch == SYNTH_LLAMA && c->experts)
        snprintf(buf, len, "llama, %u layers, dim %u, ff %u, vocab %u, heads %u/%u, %u experts "
                 "(%u used)", c->layers, c->dim, c->ff, c->vocab, c->heads, c->kv_heads,
                 c->experts, c->experts_used);
    else if (c->arch == SYNTH_LLAMA)
        snprintf(buf, len, "llama, %u layers, dim %u, ff %u, vocab %u, heads %u/%u", c->layers,
                 c->dim, c->ff, c->vocab, c->heads, c->kv_heads);
    else
        snprintf(buf, len, "unet, %u resnets per block, channels %u/%u/%u/%u", c->layers, c->dim,
                 2 * c->dim, 4 * c->dim, 4 * c->dim);
}

int cmd_gen(int argc, char **argv)
{
    const char *out = NULL, *format = NULL, *arch = "llama", *size = NULL, *dtype = "f16";
    const char *seed = NULL, *layers = NULL, *dim = NULL, *ff = NULL, *vocab = NULL;
    const char *heads = NULL, *kv_heads = NULL, *lora = NULL, *rank = NULL, *scheme = NULL;
    const char *arch_opt = NULL, *dtype_opt = NULL, *experts = NULL, *experts_used = NULL;
    int quiet = 0, json = 0, dry = 0, npos = 0;
    cli_opt opts[] = {
        {"output", 'o', CLI_OPT_STRING, &out},      {"format", 0, CLI_OPT_STRING, &format},
        {"arch", 0, CLI_OPT_STRING, &arch_opt},     {"size", 0, CLI_OPT_STRING, &size},
        {"dtype", 0, CLI_OPT_STRING, &dtype_opt},   {"seed", 0, CLI_OPT_STRING, &seed},
        {"layers", 0, CLI_OPT_STRING, &layers},     {"dim", 0, CLI_OPT_STRING, &dim},
        {"ff", 0, CLI_OPT_STRING, &ff},             {"vocab", 0, CLI_OPT_STRING, &vocab},
        {"heads", 0, CLI_OPT_STRING, &heads},       {"kv-heads", 0, CLI_OPT_STRING, &kv_heads},
        {"quiet", 'q', CLI_OPT_FLAG, &quiet},       {"json", 0, CLI_OPT_FLAG, &json},
        {"dry-run", 0, CLI_OPT_FLAG, &dry},         {"lora", 0, CLI_OPT_STRING, &lora},
        {"rank", 0, CLI_OPT_STRING, &rank},         {"scheme", 0, CLI_OPT_STRING, &scheme},
        {"experts", 0, CLI_OPT_STRING, &experts},
        {"experts-used", 0, CLI_OPT_STRING, &experts_used},
    };
    int rc = cli_parse("gen", argc, argv, opts, sizeof opts / sizeof opts[0], &npos);
    if (rc == CLI_HELP) {
        fputs(HELP, stdout);
        return CLI_EXIT_OK;
    }
    if (rc)
        return rc;
    if (npos > 0)
        return cli_usage_error("gen", "unexpected argument '%s' (the output goes after -o)",
                               argv[1]);
    if (lora) {
        const char *stray = format ? "--format" : arch_opt ? "--arch" : size ? "--size"
                          : dtype_opt ? "--dtype" : layers ? "--layers" : dim ? "--dim"
                          : ff ? "--ff" : vocab ? "--vocab" : heads ? "--heads"
                          : kv_heads ? "--kv-heads" : experts ? "--experts"
                          : experts_used ? "--experts-used" : dry ? "--dry-run"
                          : json ? "--json" : NULL;
        return gen_lora(lora, out, rank, scheme, seed, quiet, stray);
    }
    if (rank || scheme)
        return cli_usage_error("gen", "%s needs --lora BASE", rank ? "--rank" : "--scheme");
    if (arch_opt)
        arch = arch_opt;
    if (dtype_opt)
        dtype = dtype_opt;
    if (!out && !dry)
        return cli_usage_error("gen", "no output file: give -o FILE");

    synth_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int moe = strcmp(arch, "moe") == 0;
    if (strcmp(arch, "llama") == 0 || moe)
        cfg.arch = SYNTH_LLAMA;
    else if (strcmp(arch, "unet") == 0)
        cfg.arch = SYNTH_UNET;
    else
        return cli_usage_error("gen", "--arch: '%s' is not llama, moe or unet", arch);
    if ((experts || experts_used) && !moe)
        return cli_usage_error("gen", "%s needs --arch moe",
                               experts ? "--experts" : "--experts-used");
    if (moe) {
        cfg.experts = 8;
        cfg.experts_used = 2;
        if ((rc = dim_arg("experts", experts, 512, &cfg.experts)) != 0 ||
            (rc = dim_arg("experts-used", experts_used, 512, &cfg.experts_used)) != 0)
            return rc;
    }
    if (format) {
        if (strcmp(format, "gguf") == 0)
            cfg.format = FERRY_FORMAT_GGUF;
        else if (strcmp(format, "safetensors") == 0)
            cfg.format = FERRY_FORMAT_SAFETENSORS;
        else
            return cli_usage_error("gen", "--format: '%s' is not gguf or safetensors", format);
    } else {
        cfg.format = out && ends_with(out, ".safetensors") ? FERRY_FORMAT_SAFETENSORS
                                                           : FERRY_FORMAT_GGUF;
    }
    cfg.dtype = ferry_dtype_from_name(dtype);
    if (cfg.dtype != FERRY_DTYPE_F32 && cfg.dtype != FERRY_DTYPE_F16 &&
        cfg.dtype != FERRY_DTYPE_BF16 && cfg.dtype != FERRY_DTYPE_Q8_0 &&
        cfg.dtype != FERRY_DTYPE_Q4_0)
        return cli_usage_error("gen", "--dtype: '%s' is not f32, f16, bf16, q8_0 or q4_0", dtype);
    if (size && (rc = cli_arg_size("gen", "size", size, &cfg.target_bytes)) != 0)
        return rc;
    if (size && cfg.target_bytes == 0)
        return cli_usage_error("gen", "--size: must be more than 0");
    if (seed && (rc = cli_arg_u64("gen", "seed", seed, 0, UINT64_MAX, &cfg.seed)) != 0)
        return rc;
    if ((rc = dim_arg("layers", layers, 4096, &cfg.layers)) != 0 ||
        (rc = dim_arg("dim", dim, 65536, &cfg.dim)) != 0 ||
        (rc = dim_arg("ff", ff, 262144, &cfg.ff)) != 0 ||
        (rc = dim_arg("vocab", vocab, 1u << 24, &cfg.vocab)) != 0 ||
        (rc = dim_arg("heads", heads, 4096, &cfg.heads)) != 0 ||
        (rc = dim_arg("kv-heads", kv_heads, 4096, &cfg.kv_heads)) != 0)
        return rc;

    synth_model m;
    char err[256];
    rc = synth_plan(&cfg, &m, err, sizeof err);
    if (rc != 0) {
        synth_free(&m);
        return rc == CLI_EXIT_USAGE ? cli_usage_error("gen", "%s", err) : cli_error("%s", err);
    }
    char what[160], a[32], b[32];
    describe(&m, what, sizeof what);
    if (cfg.target_bytes && !quiet &&
        fabs((double)m.total_bytes - (double)cfg.target_bytes) > 0.1 * (double)cfg.target_bytes)
        fprintf(stderr, "ferry gen: note: %s comes to %s, not the %s asked for\n", what,
                cli_size(m.total_bytes, a), cli_size(cfg.target_bytes, b));

    if (dry) {
        if (json)
            print_summary_json(&m, out, 1, 0.0);
        else
            printf("%s %s %s: %zu tensors, %s (%llu bytes); %s\n", out ? out : "(dry run)",
                   ferry_format_name(cfg.format), ferry_dtype_name(cfg.dtype), m.n,
                   cli_size(m.total_bytes, a), (unsigned long long)m.total_bytes, what);
        synth_free(&m);
        return CLI_EXIT_OK;
    }

    char *real = NULL;
    if ((rc = cli_check_output("gen", "-o", out, NULL, 0, NULL, NULL, NULL, &real)) != 0) {
        synth_free(&m);
        return rc;
    }
    double t0 = cli_now();
    rc = synth_write(&m, real, !quiet && !json);
    free(real);
    double secs = cli_now() - t0;
    if (rc == 0) {
        if (json)
            print_summary_json(&m, out, 0, secs);
        else if (!quiet)
            printf("wrote %s: %s %s, %zu tensors, %s in %.2f s (%.0f MB/s); %s\n", out,
                   ferry_format_name(cfg.format), ferry_dtype_name(cfg.dtype), m.n,
                   cli_size(m.total_bytes, a), secs,
                   secs > 0 ? (double)m.total_bytes / secs / 1e6 : 0.0, what);
    }
    synth_free(&m);
    return rc;
}
