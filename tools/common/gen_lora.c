/*
 * gen_lora.c — `ferry gen --lora BASE`: a synthetic LoRA adapter for a base model, so that merges,
 * runtime factors and `lora merge` can be tried and benchmarked without downloading an adapter.
 *
 * The base is read with the public catalog only; the adapter is written with the public writer.
 * Llama names go between their HF and GGUF spellings through the library's own table
 * (ferry_lora_hf_name, ferry_lora_gguf_name), so an adapter is named as ferry_lora_add maps it.
 * Each factor's values come from a generator seeded by (seed, factor name), so the bytes depend on
 * the seed and the names alone, and a value is a sum of four uniforms (Irwin-Hall), which needs no
 * libm and is the same on every machine. The adapter is checked after writing by adding it to a
 * manager over the base: every pair must find its base weight.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "gen_lora.h"

enum { GL_OK = 0, GL_FAIL = 1, GL_USAGE = 2 };
enum { GL_PEFT, GL_KOHYA, GL_GGUF };

#define GL_MAX_RANK 65536u
#define GL_B_STD 0.01

typedef struct gl_target {
    char *a_name, *b_name, *alpha_name; /* alpha_name only for kohya */
    uint32_t ndim_a, ndim_b;
    int64_t shape_a[4], shape_b[4];     /* in the adapter file's own order */
    uint64_t rows, cols;
    int conv;
} gl_target;

static int gl_ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int gl_starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether G, a GGUF name from ferry_lora_gguf_name's table, is a layer weight that gets a LoRA:
 * the attention and feed-forward matrices, not the norms (vectors) nor the top-level weights. */
static int gl_llama_module(const char *g)
{
    return gl_starts(g, "blk.") && gl_ends(g, ".weight") && !gl_ends(g, "_norm.weight");
}

/* Whether base tensor T gets a LoRA: llama attention / feed-forward matrices (GGUF or HF names,
 * the HF ones under any prefix ending in "layers.N."), diffusers attention / feed-forward
 * matrices, conv kernels. */
int ferry_gen_lora_is_target(const ferry_tensor_info *t)
{
    const char *n = t->name;
    char gg[128];
    if (!gl_ends(n, ".weight"))
        return 0;
    if (t->ndim == 4)
        return 1;
    if (t->ndim != 2)
        return 0;
    if (gl_llama_module(n) && ferry_lora_hf_name(n, NULL, 0) > 0)
        return 1;
    for (const char *l = strstr(n, "layers."); l; l = strstr(l + 1, "layers.")) {
        size_t k = ferry_lora_gguf_name(l, gg, sizeof gg);
        if (k > 0 && k < sizeof gg && gl_llama_module(gg))
            return 1;
    }
    static const char *const dif[] = {".to_q.weight", ".to_k.weight", ".to_v.weight",
                                      ".to_out.0.weight"};
    for (size_t k = 0; k < sizeof dif / sizeof dif[0]; k++)
        if (gl_ends(n, dif[k]))
            return 1;
    return strstr(n, ".ff.net.") != NULL;
}

static char *gl_printf(const char *fmt, const char *a, const char *b)
{
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, fmt, a, b);
    return s;
}

/* Fills TG's names and shapes for base tensor T. */
static int gl_describe(int scheme, const ferry_tensor_info *t, unsigned rank, gl_target *tg)
{
    memset(tg, 0, sizeof *tg);
    /* outermost-first dims of the base */
    uint64_t d[4] = {1, 1, 1, 1};
    for (uint32_t i = 0; i < t->ndim; i++)
        d[i] = (uint64_t)(t->format == FERRY_FORMAT_GGUF ? t->shape[t->ndim - 1 - i] : t->shape[i]);
    tg->rows = d[0];
    tg->cols = t->n_elems / (d[0] ? d[0] : 1);
    tg->conv = t->ndim == 4;

    size_t len = strlen(t->name) - strlen(".weight");
    char *module = malloc(len + 64);
    if (!module)
        return -1;
    /* PEFT adapters name llama layers in HF spelling: module = the HF name without ".weight" */
    size_t hf = scheme == GL_PEFT && gl_llama_module(t->name)
                    ? ferry_lora_hf_name(t->name, module, len + 64)
                    : 0;
    if (hf > 7 && hf < len + 64)
        module[hf - 7] = 0;
    else
        snprintf(module, len + 64, "%.*s", (int)len, t->name);

    if (scheme == GL_PEFT) {
        tg->a_name = gl_printf("base_model.model.%s%s", module, ".lora_A.weight");
        tg->b_name = gl_printf("base_model.model.%s%s", module, ".lora_B.weight");
    } else if (scheme == GL_KOHYA) {
        for (char *p = module; *p; p++)
            if (*p == '.')
                *p = '_';
        tg->a_name = gl_printf("lora_unet_%s%s", module, ".lora_down.weight");
        tg->b_name = gl_printf("lora_unet_%s%s", module, ".lora_up.weight");
        tg->alpha_name = gl_printf("lora_unet_%s%s", module, ".alpha");
    } else {
        tg->a_name = gl_printf("%s%s", t->name, ".lora_a");
        tg->b_name = gl_printf("%s%s", t->name, ".lora_b");
    }
    free(module);
    if (!tg->a_name || !tg->b_name || (scheme == GL_KOHYA && !tg->alpha_name))
        return -1;

    if (scheme == GL_GGUF) {
        /* ne order: lora_a [in, rank] (rank rows of in), lora_b [rank, out] */
        tg->ndim_a = tg->ndim_b = 2;
        tg->shape_a[0] = (int64_t)tg->cols;
        tg->shape_a[1] = rank;
        tg->shape_b[0] = rank;
        tg->shape_b[1] = (int64_t)tg->rows;
    } else if (tg->conv) {
        tg->ndim_a = tg->ndim_b = 4;
        tg->shape_a[0] = rank;
        tg->shape_a[1] = (int64_t)d[1];
        tg->shape_a[2] = (int64_t)d[2];
        tg->shape_a[3] = (int64_t)d[3];
        tg->shape_b[0] = (int64_t)tg->rows;
        tg->shape_b[1] = rank;
        tg->shape_b[2] = 1;
        tg->shape_b[3] = 1;
    } else {
        tg->ndim_a = tg->ndim_b = 2;
        tg->shape_a[0] = rank;
        tg->shape_a[1] = (int64_t)tg->cols;
        tg->shape_b[0] = (int64_t)tg->rows;
        tg->shape_b[1] = rank;
    }
    return 0;
}

static void gl_target_free(gl_target *tg)
{
    free(tg->a_name);
    free(tg->b_name);
    free(tg->alpha_name);
}

/* ---- values ---------------------------------------------------------------------------------- */

static uint64_t gl_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t gl_seed(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    (void)gl_next(&s);
    return s;
}

/* N values of mean 0 and standard deviation STD: (sum of four uniforms - 2) * sqrt(3). */
static void gl_fill(float *v, uint64_t n, double std, uint64_t seed, const char *name)
{
    uint64_t s = gl_seed(seed, name);
    const double k = 1.7320508075688772 * std;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = gl_next(&s);
        double u = (double)(r & 0xFFFF) + (double)(r >> 16 & 0xFFFF) + (double)(r >> 32 & 0xFFFF) +
                   (double)(r >> 48);
        v[i] = (float)((u / 65536.0 - 2.0 + 2.0 / 65536.0) * k);
    }
}

static int gl_write_values(ferry_writer *w, uint64_t n, double std, uint64_t seed,
                           const char *name, float *f32, uint16_t *f16)
{
    gl_fill(f32, n, std, seed, name);
    if (ferry_dtype_convert(FERRY_DTYPE_F32, f32, FERRY_DTYPE_F16, f16, n) != 0)
        return -1;
    return ferry_writer_write(w, f16, (size_t)n * sizeof *f16);
}

/* ---- the self-check ---------------------------------------------------------------------------- */

static int gl_check(const char *base, const char *out, size_t n_pairs)
{
    ferry *f = ferry_create(NULL);
    if (!f) {
        fprintf(stderr, "ferry gen: out of memory\n");
        return GL_FAIL;
    }
    int id = -1, rc = ferry_open(f, base, NULL);
    if (!rc)
        rc = ferry_lora_add(f, out, 1.0f, NULL, &id);
    if (rc) {
        fprintf(stderr, "ferry gen: self-check of %s failed: %s\n", out, ferry_errmsg(f));
        ferry_destroy(f);
        return GL_FAIL;
    }
    ferry_lora_info info;
    rc = ferry_lora_get_info(f, id, &info);
    if (rc || info.n_pairs != n_pairs || info.n_matched != n_pairs) {
        fprintf(stderr,
                "ferry gen: self-check of %s failed: %u of %zu pairs read, %u mapped onto %s%s%s\n",
                out, rc ? 0 : info.n_pairs, n_pairs, rc ? 0 : info.n_matched, base,
                !rc && info.n_unmatched ? "; first unmatched: " : "",
                !rc && info.n_unmatched && info.unmatched[0] ? info.unmatched[0] : "");
        ferry_destroy(f);
        return GL_FAIL;
    }
    ferry_destroy(f);
    return GL_OK;
}

/* ---- writing ----------------------------------------------------------------------------------- */

int ferry_gen_lora(const char *base_path, const char *out_path, unsigned rank, const char *scheme,
                   uint64_t seed, int quiet)
{
    int sc;
    if (!scheme || strcmp(scheme, "peft") == 0)
        sc = GL_PEFT;
    else if (strcmp(scheme, "kohya") == 0)
        sc = GL_KOHYA;
    else if (strcmp(scheme, "gguf") == 0)
        sc = GL_GGUF;
    else {
        fprintf(stderr, "ferry gen: --scheme: '%s' is not peft, kohya or gguf\n", scheme);
        return GL_USAGE;
    }
    if (!base_path || !out_path) {
        fprintf(stderr, "ferry gen: --lora needs a base model and -o FILE\n");
        return GL_USAGE;
    }
    if (rank < 1 || rank > GL_MAX_RANK) {
        fprintf(stderr, "ferry gen: --rank: %u is not in 1..%u\n", rank, GL_MAX_RANK);
        return GL_USAGE;
    }
    const char *scheme_name = sc == GL_PEFT ? "peft" : sc == GL_KOHYA ? "kohya" : "gguf";

    int ret = GL_FAIL, rc = 0;
    ferry_catalog *cat = ferry_catalog_create();
    ferry_writer *w = NULL;
    gl_target *tg = NULL;
    size_t nt = 0, n_conv = 0;
    float *f32 = NULL;
    uint16_t *f16 = NULL;
    if (!cat) {
        fprintf(stderr, "ferry gen: out of memory\n");
        goto done;
    }
    if ((rc = ferry_catalog_add(cat, base_path, NULL)) != 0) {
        fprintf(stderr, "ferry gen: %s\n", ferry_catalog_errmsg(cat));
        goto done;
    }
    size_t n = ferry_catalog_count(cat);
    tg = calloc(n ? n : 1, sizeof *tg);
    if (!tg) {
        fprintf(stderr, "ferry gen: out of memory\n");
        goto done;
    }
    uint64_t max_elems = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info t;
        ferry_catalog_tensor(cat, i, &t);
        if (!ferry_gen_lora_is_target(&t) || t.n_elems == 0)
            continue;
        if (gl_describe(sc, &t, rank, &tg[nt]) != 0) {
            gl_target_free(&tg[nt]);
            fprintf(stderr, "ferry gen: out of memory\n");
            goto done;
        }
        const gl_target *g = &tg[nt++];
        n_conv += g->conv != 0;
        uint64_t ea = (uint64_t)rank * g->cols, eb = (uint64_t)rank * g->rows;
        if (g->cols > UINT64_MAX / rank || g->rows > UINT64_MAX / rank) {
            fprintf(stderr, "ferry gen: %s: too large for rank %u\n", t.name, rank);
            goto done;
        }
        max_elems = ea > max_elems ? ea : max_elems;
        max_elems = eb > max_elems ? eb : max_elems;
        total += 2 * (ea + eb);
    }
    if (nt == 0) {
        fprintf(stderr,
                "ferry gen: %s has no attention, feed-forward or conv weights to adapt\n",
                base_path);
        goto done;
    }
    if (max_elems > SIZE_MAX / sizeof(float) ||
        !(f32 = malloc((size_t)max_elems * sizeof *f32)) ||
        !(f16 = malloc((size_t)max_elems * sizeof *f16))) {
        fprintf(stderr, "ferry gen: out of memory\n");
        goto done;
    }

    w = ferry_writer_create(sc == GL_GGUF ? FERRY_FORMAT_GGUF : FERRY_FORMAT_SAFETENSORS);
    if (!w) {
        fprintf(stderr, "ferry gen: out of memory\n");
        goto done;
    }
    float alpha = 2.0f * (float)rank;
    char num[32];
    snprintf(num, sizeof num, "%g", (double)alpha);
    char rk[32];
    snprintf(rk, sizeof rk, "%u", rank);
    if (sc == GL_GGUF) {
        const char *arch = NULL;
        ferry_value v;
        memset(&v, 0, sizeof v);
        v.type = FERRY_VALUE_F32;
        v.v.f = alpha;
        if (ferry_catalog_get_str(cat, "general.architecture", &arch) == 0)
            rc = ferry_writer_set_meta_str(w, "general.architecture", arch);
        rc = rc ? rc : ferry_writer_set_meta_str(w, "general.type", "adapter");
        rc = rc ? rc : ferry_writer_set_meta_str(w, "adapter.type", "lora");
        rc = rc ? rc : ferry_writer_set_meta(w, "adapter.lora.alpha", &v);
    } else if (sc == GL_PEFT) {
        rc = ferry_writer_set_meta_str(w, "format", "pt");
        rc = rc ? rc : ferry_writer_set_meta_str(w, "lora_alpha", num);
        rc = rc ? rc : ferry_writer_set_meta_str(w, "r", rk);
    } else {
        rc = ferry_writer_set_meta_str(w, "ss_network_module", "networks.lora");
        rc = rc ? rc : ferry_writer_set_meta_str(w, "ss_network_dim", rk);
        rc = rc ? rc : ferry_writer_set_meta_str(w, "ss_network_alpha", num);
    }
    for (size_t k = 0; k < nt && !rc; k++) {
        rc = ferry_writer_add_tensor(w, tg[k].a_name, FERRY_DTYPE_F16, tg[k].ndim_a,
                                     tg[k].shape_a);
        rc = rc ? rc
                : ferry_writer_add_tensor(w, tg[k].b_name, FERRY_DTYPE_F16, tg[k].ndim_b,
                                          tg[k].shape_b);
        if (!rc && tg[k].alpha_name)
            rc = ferry_writer_add_tensor(w, tg[k].alpha_name, FERRY_DTYPE_F16, 0, NULL);
    }
    rc = rc ? rc : ferry_writer_begin(w, out_path);
    for (size_t k = 0; k < nt && !rc; k++) {
        const gl_target *g = &tg[k];
        rc = gl_write_values(w, (uint64_t)rank * g->cols, 1.0 / sqrt((double)g->cols),
                             seed, g->a_name, f32, f16);
        rc = rc ? rc
                : gl_write_values(w, (uint64_t)rank * g->rows, GL_B_STD, seed, g->b_name, f32,
                                  f16);
        if (!rc && g->alpha_name) {
            uint16_t h;
            rc = ferry_dtype_convert(FERRY_DTYPE_F32, &alpha, FERRY_DTYPE_F16, &h, 1);
            rc = rc ? rc : ferry_writer_write(w, &h, sizeof h);
        }
    }
    rc = rc ? rc : ferry_writer_finish(w);
    if (rc) {
        const char *msg = ferry_writer_errmsg(w);
        fprintf(stderr, "ferry gen: %s: %s\n", out_path, msg && *msg ? msg : ferry_strerror(rc));
        goto done;
    }
    if ((ret = gl_check(base_path, out_path, nt)) != GL_OK) {
        remove(out_path); /* an adapter that does not fit its base is no result */
        goto done;
    }
    if (!quiet) {
        char sz[32];
        printf("wrote %s: %s LoRA for %s, %zu pairs (%zu conv), rank %u, alpha %s, %s of f16 "
               "factors\n",
               out_path, scheme_name, base_path, nt, n_conv, rank, num,
               ferry_format_size(total, sz));
    }
    ret = GL_OK;
done:
    for (size_t k = 0; k < nt; k++)
        gl_target_free(&tg[k]);
    free(tg);
    free(f32);
    free(f16);
    ferry_writer_destroy(w);
    ferry_catalog_destroy(cat);
    return ret;
}
