/*
 * test_lora_manager.c — LoRA through the manager: adapters added with ferry_lora_add and merged
 * while weights are staged (src/core/lora_glue.c, residency.c's transfer), checked only through
 * what an engine sees (ferry_prepare -> ferry_tensor_read).
 *
 * Base models and adapters are written here with the public writer: a llama GGUF base with f32,
 * f16, bf16, q8_0 and q4_0 weights (one of them large enough to be merged in two chunks), a
 * diffusers-style safetensors base with a 4-D conv kernel, and adapters in PEFT, kohya and GGUF
 * LoRA naming. Merged values are compared with a float64 reference W + m*alpha/rank*(B.A):
 * within 1e-6 of the terms' magnitude for f32, one rounding step for f16/bf16, and the
 * quantization error per block for q8_0/q4_0 (against the reference requantized) — on cpu, on
 * sim:64MiB (and cuda:0 when one is present), for every home and two load modes.
 *
 * Also: epochs (what bumps them, what the next prepare returns, a tensor held across a change
 * keeps its bytes until released); no base byte read again across adapter switches with home
 * host; the model file and its mapping never modified; runtime mode's factors; several adapters
 * with different multipliers; base and target prefixes; required vs optional adapters on weights
 * that cannot take a merge; unmatched pairs reported; hostile adapters refused with names in the
 * message and the manager still usable; and `ferry lora merge` / `ferry lora info` end to end.
 */
#include <math.h>
#include <stdint.h>
#include <sys/wait.h>

#include "check.h"
#include "lora_fixture.h"
#include "ferry.h"
#include "model_fixture.h"

#ifndef FERRY_CLI
#define FERRY_CLI "ferry"
#endif

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))


static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* ---- values and files --------------------------------------------------------------------------- */

typedef struct wspec {
    const char *name;
    ferry_dtype dt;
    uint32_t ndim;
    int64_t shape[4]; /* the file's own order */
    float fill;       /* nonzero: every element is this (kohya alpha tensors) */
} wspec;

typedef struct meta {
    const char *key;
    ferry_value v;
} meta;

/* Writes a model or adapter file: every tensor holds val_of(name, i) in its dtype (zeros for
 * types ferry cannot quantize to, e.g. q4_k), or FILL. */
static int write_tensors(const char *path, ferry_format fmt, const wspec *ts, size_t n,
                         const meta *ms, size_t nm)
{
    ferry_writer *w = ferry_writer_create(fmt);
    int rc = w ? 0 : FERRY_ENOMEM;
    for (size_t k = 0; k < nm && !rc; k++)
        rc = ferry_writer_set_meta(w, ms[k].key, &ms[k].v);
    for (size_t k = 0; k < n && !rc; k++)
        rc = ferry_writer_add_tensor(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t k = 0; k < n && !rc; k++)
        rc = write_values(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape, ts[k].fill, 0);
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "write_tensors %s: %s\n", path, w ? ferry_writer_errmsg(w) : "no memory");
    ferry_writer_destroy(w);
    return rc;
}

static meta meta_str(const char *key, const char *s)
{
    meta m;
    memset(&m, 0, sizeof m);
    m.key = key;
    m.v.type = FERRY_VALUE_STRING;
    m.v.v.str.ptr = s;
    m.v.v.str.len = strlen(s);
    return m;
}

static meta meta_num(const char *key, ferry_value_type t, double x)
{
    meta m;
    memset(&m, 0, sizeof m);
    m.key = key;
    m.v.type = t;
    if (t == FERRY_VALUE_F32 || t == FERRY_VALUE_F64)
        m.v.v.f = x;
    else if (t == FERRY_VALUE_I8 || t == FERRY_VALUE_I16 || t == FERRY_VALUE_I32 ||
             t == FERRY_VALUE_I64)
        m.v.v.i = (int64_t)x;
    else
        m.v.v.u = (uint64_t)x;
    return m;
}

/* FNV-1a of a whole file: the "never modified" check. */
static uint64_t file_hash(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint64_t h = 0xcbf29ce484222325ull;
    if (!f)
        return 0;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++)
            h = (h ^ buf[i]) * 0x100000001b3ull;
    fclose(f);
    return h;
}

/* ---- the bases ---------------------------------------------------------------------------------- */

#define BIG_ROWS 4160 /* output.weight: 4160 x 1024 f16 = more than one 16 MiB f32 merge chunk */
#define BIG_COLS 1024

static const wspec llama_ts[] = {
    {"token_embd.weight", FERRY_DTYPE_F16, 2, {64, 50}, 0},
    {"blk.0.attn_norm.weight", FERRY_DTYPE_F32, 1, {64}, 0},
    {"blk.0.attn_q.weight", FERRY_DTYPE_F32, 2, {64, 64}, 0},
    {"blk.0.attn_k.weight", FERRY_DTYPE_F16, 2, {64, 32}, 0},
    {"blk.0.attn_v.weight", FERRY_DTYPE_BF16, 2, {64, 32}, 0},
    {"blk.0.attn_output.weight", FERRY_DTYPE_Q8_0, 2, {64, 64}, 0},
    {"blk.0.ffn_gate.weight", FERRY_DTYPE_Q4_0, 2, {64, 96}, 0},
    {"blk.0.ffn_up.weight", FERRY_DTYPE_Q8_0, 2, {64, 96}, 0},
    {"blk.0.ffn_down.weight", FERRY_DTYPE_Q4_0, 2, {96, 64}, 0},
    {"blk.1.attn_q.weight", FERRY_DTYPE_F16, 2, {64, 64}, 0},
    {"blk.1.attn_k.weight", FERRY_DTYPE_BF16, 2, {64, 32}, 0},
    {"output_norm.weight", FERRY_DTYPE_F32, 1, {64}, 0},
    {"output.weight", FERRY_DTYPE_F16, 2, {BIG_COLS, BIG_ROWS}, 0},
};

#define UNET_ATTN "down_blocks.0.attentions.0.transformer_blocks.0."
static const wspec unet_ts[] = {
    {"conv_in.weight", FERRY_DTYPE_F32, 4, {32, 4, 3, 3}, 0},
    {"down_blocks.0.resnets.0.conv1.weight", FERRY_DTYPE_F16, 4, {32, 32, 3, 3}, 0},
    {"down_blocks.0.resnets.0.conv1.bias", FERRY_DTYPE_F32, 1, {32}, 0},
    {UNET_ATTN "attn1.to_q.weight", FERRY_DTYPE_F32, 2, {32, 32}, 0},
    {UNET_ATTN "attn1.to_k.weight", FERRY_DTYPE_BF16, 2, {32, 32}, 0},
    {UNET_ATTN "ff.net.2.weight", FERRY_DTYPE_F32, 2, {32, 128}, 0},
    {"mid_block.resnets.0.conv2.weight", FERRY_DTYPE_F32, 4, {32, 32, 3, 3}, 0},
};

/* A base whose weights cannot all take a merge: a q4_k weight, and one made lazy by policy. */
static const wspec odd_ts[] = {
    {"blk.0.attn_q.weight", FERRY_DTYPE_F32, 2, {64, 64}, 0},
    {"blk.0.attn_k.weight", FERRY_DTYPE_F16, 2, {64, 32}, 0},
    {"blk.0.attn_v.weight", FERRY_DTYPE_Q4_K, 2, {256, 32}, 0},
    {"blk.0.ffn_gate.weight", FERRY_DTYPE_F32, 2, {64, 96}, 0},
};

static const char *tokens_items[] = {"<s>", "</s>", "hello"};

static int write_bases(void)
{
    ferry_value toks[3];
    for (int i = 0; i < 3; i++) {
        memset(&toks[i], 0, sizeof toks[i]);
        toks[i].type = FERRY_VALUE_STRING;
        toks[i].v.str.ptr = tokens_items[i];
        toks[i].v.str.len = strlen(tokens_items[i]);
    }
    meta lm[6];
    lm[0] = meta_str("general.architecture", "llama");
    lm[1] = meta_num("llama.block_count", FERRY_VALUE_U32, 2);
    lm[2] = meta_num("llama.rope.freq_base", FERRY_VALUE_F32, 10000.5);
    lm[3] = meta_num("general.file_type", FERRY_VALUE_I32, -7);
    lm[4] = meta_num("general.quantized", FERRY_VALUE_BOOL, 1);
    memset(&lm[5], 0, sizeof lm[5]);
    lm[5].key = "tokenizer.ggml.tokens";
    lm[5].v.type = FERRY_VALUE_ARRAY;
    lm[5].v.v.arr.elem = FERRY_VALUE_STRING;
    lm[5].v.v.arr.n = 3;
    lm[5].v.v.arr.items = toks;
    meta um[2] = {meta_str("format", "pt"), meta_str("modelspec.title", "unet test")};
    meta om[1] = {meta_str("general.architecture", "llama")};
    if (write_tensors(path_of("llama.gguf"), FERRY_FORMAT_GGUF, llama_ts, N_OF(llama_ts), lm, 6))
        return -1;
    if (write_tensors(path_of("unet.safetensors"), FERRY_FORMAT_SAFETENSORS, unet_ts,
                      N_OF(unet_ts), um, 2))
        return -1;
    if (write_tensors(path_of("odd.gguf"), FERRY_FORMAT_GGUF, odd_ts, N_OF(odd_ts), om, 1))
        return -1;
    /* The llama base without quantized weights, for safetensors output of `ferry lora merge`. */
    wspec plain[N_OF(llama_ts)];
    memcpy(plain, llama_ts, sizeof plain);
    for (size_t i = 0; i < N_OF(plain); i++)
        if (plain[i].dt == FERRY_DTYPE_Q8_0 || plain[i].dt == FERRY_DTYPE_Q4_0)
            plain[i].dt = FERRY_DTYPE_F16;
    return write_tensors(path_of("llama_plain.gguf"), FERRY_FORMAT_GGUF, plain, N_OF(plain), lm,
                         6);
}

/* ---- adapters ----------------------------------------------------------------------------------- */

typedef struct lpair {
    const char *stem;  /* the adapter's name of the module (key without the factor suffix) */
    const char *base;  /* the base tensor it must map to (without any target prefix); NULL: none */
    uint64_t rows;
    uint32_t rank;
    uint32_t cin, kh, kw; /* A is [rank, cin] or, with kh, [rank, cin, kh, kw] */
    float alpha;       /* kohya per-module alpha tensor; 0: none */
    float *a, *b;      /* the factors as stored (rounded to the factor dtype), row-major */
} lpair;

typedef struct lspec {
    const char *file;
    const char *scheme; /* "peft", "kohya", "gguf" */
    ferry_dtype fdt;    /* factor dtype */
    float alpha;        /* adapter-wide alpha in the metadata; 0: none */
    lpair *p;
    size_t n;
} lspec;

static uint64_t pair_cols(const lpair *p)
{
    return (uint64_t)p->cin * (p->kh ? (uint64_t)p->kh * p->kw : 1);
}

#define HF "base_model.model.model.layers."
static lpair peft_pairs[] = {
    {HF "0.self_attn.q_proj", "blk.0.attn_q.weight", 64, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.self_attn.k_proj", "blk.0.attn_k.weight", 32, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.self_attn.v_proj", "blk.0.attn_v.weight", 32, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.self_attn.o_proj", "blk.0.attn_output.weight", 64, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.mlp.gate_proj", "blk.0.ffn_gate.weight", 96, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.mlp.up_proj", "blk.0.ffn_up.weight", 96, 8, 64, 0, 0, 0, 0, 0},
    {HF "0.mlp.down_proj", "blk.0.ffn_down.weight", 64, 8, 96, 0, 0, 0, 0, 0},
    {HF "1.self_attn.q_proj", "blk.1.attn_q.weight", 64, 8, 64, 0, 0, 0, 0, 0},
    {"base_model.model.lm_head", "output.weight", BIG_ROWS, 2, BIG_COLS, 0, 0, 0, 0, 0},
    {HF "0.self_attn.zz_proj", NULL, 64, 8, 64, 0, 0, 0, 0, 0},
};
static lspec peft = {"peft.safetensors", "peft", FERRY_DTYPE_F32, 16.0f, peft_pairs,
                     N_OF(peft_pairs)};

static lpair gguf_pairs[] = {
    {"blk.0.attn_q.weight", "blk.0.attn_q.weight", 64, 4, 64, 0, 0, 0, 0, 0},
    {"blk.1.attn_k.weight", "blk.1.attn_k.weight", 32, 4, 64, 0, 0, 0, 0, 0},
    {"blk.0.ffn_down.weight", "blk.0.ffn_down.weight", 64, 4, 96, 0, 0, 0, 0, 0},
};
static lspec gguf_ad = {"gguf_lora.gguf", "gguf", FERRY_DTYPE_F16, 6.0f, gguf_pairs,
                        N_OF(gguf_pairs)};

#define KA "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_"
static lpair kohya_pairs[] = {
    {"lora_unet_down_blocks_0_resnets_0_conv1", "down_blocks.0.resnets.0.conv1.weight", 32, 4, 32,
     3, 3, 2.0f, 0, 0},
    {KA "attn1_to_q", UNET_ATTN "attn1.to_q.weight", 32, 8, 32, 0, 0, 4.0f, 0, 0},
    {KA "attn1_to_k", UNET_ATTN "attn1.to_k.weight", 32, 8, 32, 0, 0, 12.0f, 0, 0},
    {KA "ff_net_2", UNET_ATTN "ff.net.2.weight", 32, 4, 128, 0, 0, 0, 0, 0},
};
static lspec kohya = {"kohya.safetensors", "kohya", FERRY_DTYPE_F16, 0, kohya_pairs,
                      N_OF(kohya_pairs)};

/* A second PEFT adapter (for switching): other modules, other rank, no alpha (alpha = rank). */
static lpair peft2_pairs[] = {
    {HF "0.self_attn.q_proj", "blk.0.attn_q.weight", 64, 2, 64, 0, 0, 0, 0, 0},
    {HF "0.mlp.up_proj", "blk.0.ffn_up.weight", 96, 2, 64, 0, 0, 0, 0, 0},
    {HF "1.self_attn.k_proj", "blk.1.attn_k.weight", 32, 2, 64, 0, 0, 0, 0, 0},
};
static lspec peft2 = {"peft2.safetensors", "peft", FERRY_DTYPE_BF16, 0, peft2_pairs,
                      N_OF(peft2_pairs)};

/* For the base that cannot take every merge. */
static lpair odd_pairs[] = {
    {HF "0.self_attn.q_proj", "blk.0.attn_q.weight", 64, 4, 64, 0, 0, 0, 0, 0},
    {HF "0.self_attn.k_proj", "blk.0.attn_k.weight", 32, 4, 64, 0, 0, 0, 0, 0},
    {HF "0.self_attn.v_proj", "blk.0.attn_v.weight", 32, 4, 256, 0, 0, 0, 0, 0},
    {HF "0.mlp.gate_proj", "blk.0.ffn_gate.weight", 96, 4, 64, 0, 0, 0, 0, 0},
};
static lspec odd_ad = {"odd_peft.safetensors", "peft", FERRY_DTYPE_F32, 0, odd_pairs,
                       N_OF(odd_pairs)};

static const char *suffix_a(const lspec *s)
{
    return !strcmp(s->scheme, "peft") ? ".lora_A.weight"
           : !strcmp(s->scheme, "kohya") ? ".lora_down.weight" : ".lora_a";
}

static const char *suffix_b(const lspec *s)
{
    return !strcmp(s->scheme, "peft") ? ".lora_B.weight"
           : !strcmp(s->scheme, "kohya") ? ".lora_up.weight" : ".lora_b";
}

/* Writes S and fills its pairs' reference factors (the values as stored). */
static int write_adapter(lspec *s)
{
    int gguf = !strcmp(s->scheme, "gguf");
    ferry_format fmt = gguf ? FERRY_FORMAT_GGUF : FERRY_FORMAT_SAFETENSORS;
    size_t nt = 0, cap = 3 * s->n;
    wspec *ts = calloc(cap, sizeof *ts);
    char (*names)[256] = calloc(cap, sizeof *names);
    for (size_t k = 0; k < s->n; k++) {
        lpair *p = &s->p[k];
        uint64_t cols = pair_cols(p);
        snprintf(names[nt], 256, "%s%s", p->stem, suffix_a(s));
        wspec *a = &ts[nt];
        a->name = names[nt++];
        a->dt = s->fdt;
        if (gguf) { /* ne: [cols, rank] */
            a->ndim = 2;
            a->shape[0] = (int64_t)cols;
            a->shape[1] = p->rank;
        } else if (p->kh) {
            a->ndim = 4;
            a->shape[0] = p->rank;
            a->shape[1] = p->cin;
            a->shape[2] = p->kh;
            a->shape[3] = p->kw;
        } else {
            a->ndim = 2;
            a->shape[0] = p->rank;
            a->shape[1] = (int64_t)cols;
        }
        snprintf(names[nt], 256, "%s%s", p->stem, suffix_b(s));
        wspec *b = &ts[nt];
        b->name = names[nt++];
        b->dt = s->fdt;
        b->ndim = p->kh && !gguf ? 4 : 2;
        b->shape[0] = gguf ? p->rank : (int64_t)p->rows;
        b->shape[1] = gguf ? (int64_t)p->rows : p->rank;
        b->shape[2] = b->shape[3] = 1;
        if (p->alpha != 0.0f) {
            snprintf(names[nt], 256, "%s.alpha", p->stem);
            wspec *al = &ts[nt];
            al->name = names[nt++];
            al->dt = FERRY_DTYPE_F32;
            al->ndim = 1;
            al->shape[0] = 1;
            al->fill = p->alpha;
        }
        free(p->a);
        free(p->b);
        p->a = malloc(p->rank * cols * sizeof(float));
        p->b = malloc(p->rows * p->rank * sizeof(float));
        for (uint64_t i = 0; i < p->rank * cols; i++)
            p->a[i] = round_trip(s->fdt, val_of(a->name, i));
        for (uint64_t i = 0; i < p->rows * p->rank; i++)
            p->b[i] = round_trip(s->fdt, val_of(b->name, i));
    }
    meta ms[2];
    size_t nm = 0;
    char alpha[32];
    if (gguf) {
        ms[nm++] = meta_str("adapter.type", "lora");
        if (s->alpha != 0.0f)
            ms[nm++] = meta_num("adapter.lora.alpha", FERRY_VALUE_F32, s->alpha);
    } else if (s->alpha != 0.0f) {
        snprintf(alpha, sizeof alpha, "%g", (double)s->alpha);
        ms[nm++] = meta_str("lora_alpha", alpha);
    }
    int rc = write_tensors(path_of(s->file), fmt, ts, nt, ms, nm);
    free(ts);
    free(names);
    return rc;
}

static void free_adapter(lspec *s)
{
    for (size_t k = 0; k < s->n; k++) {
        free(s->p[k].a);
        free(s->p[k].b);
        s->p[k].a = s->p[k].b = NULL;
    }
}

static double pair_alpha(const lspec *s, const lpair *p)
{
    return p->alpha != 0.0f ? p->alpha : s->alpha != 0.0f ? s->alpha : (double)p->rank;
}

/* ---- the reference merge and the comparison ----------------------------------------------------- */

/* One adapter as it is active on a manager. */
typedef struct active {
    const lspec *s;
    float mult;
    const char *tp; /* target prefix, NULL: none */
    const char *bp; /* base prefix, NULL: all */
} active;

typedef struct term {
    const lpair *p;
    double scale;
} term;

/* The terms that apply to the base tensor called NAME on the manager. */
static size_t collect_terms(const char *name, const active *act, size_t nact, term *out)
{
    size_t n = 0;
    for (size_t a = 0; a < nact; a++)
        for (size_t k = 0; k < act[a].s->n; k++) {
            const lpair *p = &act[a].s->p[k];
            if (!p->base)
                continue;
            char full[512];
            snprintf(full, sizeof full, "%s%s", act[a].tp ? act[a].tp : "", p->base);
            if (strcmp(full, name) != 0 || (act[a].bp && !starts_with(full, act[a].bp)))
                continue;
            out[n].p = p;
            out[n].scale = (double)act[a].mult * pair_alpha(act[a].s, p) / p->rank;
            n++;
        }
    return n;
}

static void matrix_view(const ferry_tensor_info *in, uint64_t *rows, uint64_t *cols)
{
    uint64_t outer = (uint64_t)(in->format == FERRY_FORMAT_GGUF ? in->shape[in->ndim - 1]
                                                                : in->shape[0]);
    *rows = outer;
    *cols = in->n_elems / outer;
}

static double ulp_of(ferry_dtype dt, double g)
{
    int e;
    double m = frexp(fabs(g), &e);
    int bits = dt == FERRY_DTYPE_F16 ? 10 : 7;
    double u = m == 0 ? 0 : ldexp(1.0, e - 1 - bits);
    double minu = dt == FERRY_DTYPE_F16 ? ldexp(1.0, -24) : ldexp(1.0, -133);
    return u > minu ? u : minu;
}

static int reported;

static void report(const char *what, uint64_t i, double got, double ref, double tol)
{
    if (reported++ < 8)
        fprintf(stderr, "  %s: element %llu is %.9g, expected %.9g (tolerance %.3g)\n", what,
                (unsigned long long)i, got, ref, tol);
}

/* Compares GOT (N elements of DT) with the reference REF, MAG being the magnitude of the terms
 * that made each element; returns the number of elements out of tolerance. */
static uint64_t compare(const char *what, ferry_dtype dt, const unsigned char *got,
                        const double *ref, const double *mag, uint64_t n)
{
    uint64_t bad = 0;
    float *g = malloc(n * sizeof *g);
    ferry_dtype_convert(dt, got, FERRY_DTYPE_F32, g, n);
    if (dt == FERRY_DTYPE_F32) {
        for (uint64_t i = 0; i < n; i++) {
            double tol = 1e-6 * mag[i] + 1e-30;
            if (!(fabs(g[i] - ref[i]) <= tol))
                bad++, report(what, i, g[i], ref[i], tol);
        }
    } else if (dt == FERRY_DTYPE_F16 || dt == FERRY_DTYPE_BF16) {
        for (uint64_t i = 0; i < n; i++) {
            double tol = 0.5 * ulp_of(dt, g[i]) + 1e-6 * mag[i];
            if (!(fabs(g[i] - ref[i]) <= tol))
                bad++, report(what, i, g[i], ref[i], tol);
        }
    } else { /* q8_0, q4_0: against the reference quantized the same way, block by block */
        uint64_t nb = 0;
        ferry_dtype_nbytes(dt, n, &nb);
        float *rf = malloc(n * sizeof *rf), *rq = malloc(n * sizeof *rq);
        unsigned char *q = malloc(nb);
        for (uint64_t i = 0; i < n; i++)
            rf[i] = (float)ref[i];
        ferry_dtype_convert(FERRY_DTYPE_F32, rf, dt, q, n);
        ferry_dtype_convert(dt, q, FERRY_DTYPE_F32, rq, n);
        uint32_t be = ferry_dtype_block_elems(dt), bb = ferry_dtype_block_bytes(dt);
        /* Half a step (q8_0; a whole one for q4_0's clamped top level), plus the f16 rounding
         * of the block scale times the largest level (127 or 8): d16 - d32 <= d * 2^-11. */
        double qerr = dt == FERRY_DTYPE_Q8_0 ? 0.5 + 127.0 / 2048 : 1.0 + 8.0 / 2048;
        for (uint64_t blk = 0; blk < n / be; blk++) {
            float dg, dr;
            ferry_dtype_convert(FERRY_DTYPE_F16, got + blk * bb, FERRY_DTYPE_F32, &dg, 1);
            ferry_dtype_convert(FERRY_DTYPE_F16, q + blk * bb, FERRY_DTYPE_F32, &dr, 1);
            double d = fabs(dr);
            if (!(fabs(dg - dr) <= d * ldexp(1.0, -9) + 1e-12)) {
                bad++;
                report("block scale", blk, dg, dr, d * ldexp(1.0, -9));
            }
            for (uint64_t i = blk * be; i < (blk + 1) * be; i++) {
                double tq = d * 1.001 + 1e-7, tr = qerr * d * 1.001 + 1e-6 * mag[i];
                if (!(fabs(g[i] - rq[i]) <= tq))
                    bad++, report(what, i, g[i], rq[i], tq);
                else if (!(fabs(g[i] - ref[i]) <= tr))
                    bad++, report(what, i, g[i], ref[i], tr);
            }
        }
        free(rf);
        free(rq);
        free(q);
    }
    free(g);
    return bad;
}

/* Checks GOT (NB bytes of DT) as the bytes of the base tensor IN: the reference merge of the
 * active adapters that apply to it, or exactly the file's bytes when none does. Returns the
 * number of bad elements (1 when it could not be checked at all). */
static uint64_t check_bytes(const ferry_tensor_info *in, const unsigned char *got, uint64_t nb,
                            ferry_dtype dt, const active *act, size_t nact)
{
    unsigned char *file = fixture_pread(in->file, in->offset, in->nbytes);
    uint64_t bad = 0;
    term terms[8];
    size_t nt = collect_terms(in->name, act, nact, terms);
    if (!file) {
        fprintf(stderr, "  %s: cannot read %s\n", in->name, in->file);
        bad = 1;
    } else if (nb != in->nbytes || dt != in->dtype) {
        fprintf(stderr, "  %s: %llu bytes of %s, file has %llu of %s\n", in->name,
                (unsigned long long)nb, ferry_dtype_name(dt), (unsigned long long)in->nbytes,
                ferry_dtype_name(in->dtype));
        bad = 1;
    } else if (!nt) {
        bad = memcmp(got, file, nb) != 0;
        if (bad)
            fprintf(stderr, "  %s: no adapter applies, but its bytes differ from the file\n",
                    in->name);
    } else {
        uint64_t rows, cols, n = in->n_elems;
        matrix_view(in, &rows, &cols);
        float *w = malloc(n * sizeof *w);
        double *ref = malloc(n * sizeof *ref), *mag = malloc(n * sizeof *mag);
        ferry_dtype_convert(in->dtype, file, FERRY_DTYPE_F32, w, n);
        for (uint64_t i = 0; i < n; i++) {
            ref[i] = w[i];
            mag[i] = fabs(w[i]);
        }
        for (size_t k = 0; k < nt; k++) {
            const lpair *p = terms[k].p;
            if (p->rows != rows || pair_cols(p) != cols) {
                fprintf(stderr, "  %s: test bug: pair %s is %llu x %llu\n", in->name, p->stem,
                        (unsigned long long)p->rows, (unsigned long long)pair_cols(p));
                bad = 1;
                continue;
            }
            for (uint64_t r = 0; r < rows; r++)
                for (uint64_t c = 0; c < cols; c++) {
                    double s = 0, m = 0;
                    for (uint32_t j = 0; j < p->rank; j++) {
                        double x = (double)p->b[r * p->rank + j] * p->a[j * cols + c];
                        s += x;
                        m += fabs(x);
                    }
                    ref[r * cols + c] += terms[k].scale * s;
                    mag[r * cols + c] += fabs(terms[k].scale) * m;
                }
        }
        if (!bad) {
            reported = 0;
            bad = compare(in->name, in->dtype, got, ref, mag, n);
            /* A merge that changed nothing would pass a loose comparison by accident. */
            if (!bad && !memcmp(got, file, nb)) {
                fprintf(stderr, "  %s: adapters apply, but the bytes equal the file's\n",
                        in->name);
                bad = 1;
            }
        }
        free(w);
        free(ref);
        free(mag);
    }
    free(file);
    return bad;
}

/* check_bytes of prepared tensor T. */
static uint64_t check_prepared(ferry *f, ferry_tensor *t, const active *act, size_t nact)
{
    ferry_tensor_info in;
    if (ferry_tensor_get_info(t, &in))
        return 1;
    uint64_t nb = ferry_tensor_nbytes(t), bad;
    unsigned char *got = malloc(nb ? nb : 1);
    if (ferry_tensor_read(f, t, 0, nb, got)) {
        fprintf(stderr, "  %s: cannot read: %s\n", in.name, ferry_errmsg(f));
        bad = 1;
    } else {
        bad = check_bytes(&in, got, nb, ferry_tensor_dtype(t), act, nact);
    }
    free(got);
    return bad;
}

/* Prepares NAME, checks it, releases it. */
static uint64_t check_named(ferry *f, const char *name, const active *act, size_t nact)
{
    ferry_tensor *t = ferry_find(f, name);
    if (!t) {
        fprintf(stderr, "  no tensor '%s'\n", name);
        return 1;
    }
    if (ferry_prepare(f, &t, 1)) {
        fprintf(stderr, "  prepare %s: %s\n", name, ferry_errmsg(f));
        return 1;
    }
    uint64_t bad = check_prepared(f, t, act, nact);
    ferry_release(f, &t, 1);
    if (bad)
        fprintf(stderr, "  ^ %s\n", name);
    return bad;
}

/* Every tensor of the manager (but ignored ones), prepared all at once, checked, released. */
static uint64_t check_all(ferry *f, const active *act, size_t nact)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n, sizeof *ts);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        if ((ts[m] = ferry_find(f, in.name)) != NULL) /* NULL: ignored */
            m++;
    }
    n = m;
    uint64_t bad = 0;
    if (ferry_prepare(f, ts, n)) {
        fprintf(stderr, "  prepare of %zu tensors: %s\n", n, ferry_errmsg(f));
        bad = 1;
    } else {
        for (size_t i = 0; i < n; i++) {
            uint64_t b = check_prepared(f, ts[i], act, nact);
            if (b) {
                ferry_tensor_info in;
                ferry_tensor_get_info(ts[i], &in);
                fprintf(stderr, "  ^ %s\n", in.name);
            }
            bad += b;
        }
        ferry_release(f, ts, n);
    }
    free(ts);
    return bad;
}

/* ---- managers ----------------------------------------------------------------------------------- */

/* A manager with DEV ("cpu", "sim:64MiB", "cuda:0") and one policy for every tensor; NULL when
 * the device cannot be added (*skip set). */
static ferry *make(const char *dev, ferry_home home, ferry_load load, int *skip)
{
    ferry *f = ferry_create(NULL);
    if (!f)
        return NULL;
    int id = 0;
    if (strcmp(dev, "cpu") != 0 && ferry_add_device(f, dev, &id) != 0) {
        if (skip)
            *skip = 1;
        ferry_destroy(f);
        return NULL;
    }
    ferry_policy p;
    memset(&p, 0, sizeof p);
    p.home = home;
    p.load = load;
    p.compute_device = id;
    if (ferry_group_add(f, "all", "*", &p) != 0) {
        ferry_destroy(f);
        return NULL;
    }
    return f;
}

static int add(ferry *f, const lspec *s, float mult, const char *bp, const char *tp, int required,
               int *id)
{
    ferry_lora_options o;
    memset(&o, 0, sizeof o);
    o.base_prefix = bp;
    o.target_prefix = tp;
    o.required = required;
    int rc = ferry_lora_add(f, path_of(s->file), mult, &o, id);
    if (rc)
        fprintf(stderr, "  lora_add %s: %s\n", s->file, ferry_errmsg(f));
    return rc;
}

/* f32 bytes of the factors of S's pairs that map (to a tensor starting with BP). */
static uint64_t factor_bytes(const lspec *s, const char *bp)
{
    uint64_t n = 0;
    for (size_t k = 0; k < s->n; k++)
        if (s->p[k].base && (!bp || starts_with(s->p[k].base, bp)))
            n += 4 * (uint64_t)s->p[k].rank * (s->p[k].rows + pair_cols(&s->p[k]));
    return n;
}

static uint32_t matched(const lspec *s, const char *bp)
{
    uint32_t n = 0;
    for (size_t k = 0; k < s->n; k++)
        n += s->p[k].base && (!bp || starts_with(s->p[k].base, bp));
    return n;
}

/* ---- 1. merged values on every device, home and load mode --------------------------------------- */

static void test_values(void)
{
    static const char *devs[] = {"cpu", "sim:64MiB", "cuda:0"};
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    static const ferry_load loads[] = {FERRY_LOAD_MMAP, FERRY_LOAD_READ};
    for (size_t d = 0; d < N_OF(devs); d++)
        for (size_t h = 0; h < N_OF(homes); h++)
            for (size_t l = 0; l < N_OF(loads); l++) {
                int skip = 0;
                ferry *f = make(devs[d], homes[h], loads[l], &skip);
                if (skip) {
                    if (h == 0 && l == 0)
                        printf("values: %s not available, skipped\n", devs[d]);
                    continue;
                }
                CHECK(f != NULL);
                if (!f)
                    continue;
                /* The large weight (merged in two chunks) costs most of the time, under
                 * ASan especially: it is checked in two configurations per device. */
                int big = (homes[h] == FERRY_HOME_HOST && loads[l] == FERRY_LOAD_MMAP) ||
                          (homes[h] == FERRY_HOME_DEVICE && loads[l] == FERRY_LOAD_READ);
                fprintf(stderr, "values: %s home %d load %d%s\n", devs[d], (int)homes[h],
                        (int)loads[l], big ? " (with the large weight)" : "");
                if (!big)
                    CHECK_EQ_INT(ferry_ignore(f, "output.weight"), 0);
                CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
                CHECK_EQ_INT(ferry_open(f, path_of("unet.safetensors"), NULL), 0);
                /* Home copies loaded before any adapter: the switch to merged staging. */
                CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
                CHECK_EQ_INT(check_all(f, NULL, 0), 0);
                int ip = -1, ig = -1, ik = -1;
                CHECK_EQ_INT(add(f, &peft, 1.0f, NULL, NULL, 0, &ip), 0);
                CHECK_EQ_INT(add(f, &gguf_ad, 0.5f, NULL, NULL, 0, &ig), 0);
                CHECK_EQ_INT(add(f, &kohya, -0.75f, NULL, NULL, 0, &ik), 0);
                active act[] = {{&peft, 1.0f, NULL, NULL},
                                {&gguf_ad, 0.5f, NULL, NULL},
                                {&kohya, -0.75f, NULL, NULL}};
                CHECK_EQ_INT(check_all(f, act, 3), 0);
                /* Again, one at a time: cached merged copies (or re-staged ones) are the same. */
                for (size_t i = 0; i < N_OF(llama_ts) && loads[l] == FERRY_LOAD_MMAP; i++)
                    if (big || strcmp(llama_ts[i].name, "output.weight") != 0)
                        CHECK_EQ_INT(check_named(f, llama_ts[i].name, act, 3), 0);
                if (h == 0 && l == 0) {
                    ferry_lora_info info;
                    CHECK_EQ_INT(ferry_lora_get_info(f, ip, &info), 0);
                    CHECK_STR(info.scheme, "peft");
                    CHECK_EQ_INT(info.n_pairs, N_OF(peft_pairs));
                    CHECK_EQ_INT(info.n_matched, N_OF(peft_pairs) - 1);
                    CHECK_EQ_INT(info.n_unmatched, 1);
                    CHECK_STR(info.unmatched[0], HF "0.self_attn.zz_proj");
                    CHECK(info.unmatched[1] == NULL);
                    CHECK_EQ_INT(info.skipped, 0);
                    CHECK(info.multiplier == 1.0f);
                    CHECK_EQ_INT(info.factor_bytes, factor_bytes(&peft, NULL));
                    CHECK_EQ_INT(ferry_lora_get_info(f, ig, &info), 0);
                    CHECK_STR(info.scheme, "gguf");
                    CHECK_EQ_INT(info.n_matched, N_OF(gguf_pairs));
                    CHECK_EQ_INT(info.n_unmatched, 0);
                    CHECK(info.multiplier == 0.5f);
                    CHECK_EQ_INT(ferry_lora_get_info(f, ik, &info), 0);
                    CHECK_STR(info.scheme, "kohya");
                    CHECK_EQ_INT(info.n_pairs, N_OF(kohya_pairs));
                    CHECK_EQ_INT(info.n_matched, N_OF(kohya_pairs));
                    CHECK_EQ_INT(info.factor_bytes, factor_bytes(&kohya, NULL));
                }
                /* Back to no adapter: every tensor is the file's again. */
                CHECK_EQ_INT(ferry_lora_clear(f), 0);
                CHECK_EQ_INT(check_all(f, NULL, 0), 0);
                ferry_destroy(f);
            }
}

/* ---- 2. epochs ---------------------------------------------------------------------------------- */

static void test_epochs(const char *dev)
{
    int skip = 0;
    ferry *f = make(dev, FERRY_HOME_HOST, FERRY_LOAD_MMAP, &skip);
    if (skip)
        return;
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    uint64_t e = ferry_lora_epoch(f);
    CHECK_EQ_INT(e, 0);
    int ip = -1, ig = -1;
    CHECK_EQ_INT(add(f, &peft, 1.0f, NULL, NULL, 0, &ip), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    active a1[] = {{&peft, 1.0f, NULL, NULL}};
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", a1, 1), 0);

    /* A held tensor keeps its bytes (and pointer) across a change until it is released. */
    ferry_tensor *q = ferry_find(f, "blk.0.attn_q.weight");
    ferry_tensor *o = ferry_find(f, "blk.0.attn_output.weight");
    CHECK_EQ_INT(ferry_prepare(f, &q, 1), 0);
    void *qp = ferry_tensor_data(q);
    uint64_t qn = ferry_tensor_nbytes(q);
    unsigned char *before = malloc(qn), *during = malloc(qn);
    CHECK_EQ_INT(ferry_tensor_read(f, q, 0, qn, before), 0);
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, 2.0f), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    active a2[] = {{&peft, 2.0f, NULL, NULL}};
    CHECK(ferry_tensor_data(q) == qp);
    CHECK_EQ_INT(ferry_tensor_read(f, q, 0, qn, during), 0);
    CHECK(memcmp(before, during, qn) == 0);
    CHECK_EQ_INT(check_prepared(f, q, a1, 1), 0); /* still the old merge */
    CHECK_EQ_INT(check_named(f, "blk.0.attn_output.weight", a2, 1), 0); /* not held: new */
    CHECK_EQ_INT(ferry_release(f, &q, 1), 0);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", a2, 1), 0);

    /* The same multiplier again changes nothing. */
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, 2.0f), 0);
    CHECK_EQ_INT(ferry_lora_epoch(f), e);

    /* Add: new epoch, both adapters. Held across the add: old bytes until released. */
    CHECK_EQ_INT(ferry_prepare(f, &q, 1), 0);
    CHECK_EQ_INT(add(f, &gguf_ad, -1.5f, NULL, NULL, 0, &ig), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    active a3[] = {{&peft, 2.0f, NULL, NULL}, {&gguf_ad, -1.5f, NULL, NULL}};
    CHECK_EQ_INT(check_prepared(f, q, a2, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &q, 1), 0);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", a3, 2), 0);
    CHECK_EQ_INT(check_named(f, "blk.1.attn_k.weight", a3, 2), 0);

    /* Mode: runtime leaves weights unmerged; back to merge merges again. */
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_RUNTIME), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", NULL, 0), 0);
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_RUNTIME), 0);
    CHECK_EQ_INT(ferry_lora_epoch(f), e);
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_MERGE), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", a3, 2), 0);

    /* Remove one, held across the removal. */
    CHECK_EQ_INT(ferry_prepare(f, &o, 1), 0);
    CHECK_EQ_INT(ferry_lora_remove(f, ip), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    active a4[] = {{&gguf_ad, -1.5f, NULL, NULL}};
    CHECK_EQ_INT(check_prepared(f, o, a3, 2), 0);
    CHECK_EQ_INT(ferry_release(f, &o, 1), 0);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_output.weight", a4, 1), 0); /* back to the file */
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", a4, 1), 0);
    ferry_lora_info info;
    CHECK_EQ_INT(ferry_lora_get_info(f, ip, &info), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_remove(f, ip), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, 1.0f), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_epoch(f), e);

    /* Clear: new epoch; a clear with nothing left changes nothing. */
    CHECK_EQ_INT(ferry_lora_clear(f), 0);
    CHECK(ferry_lora_epoch(f) > e);
    e = ferry_lora_epoch(f);
    CHECK_EQ_INT(ferry_lora_clear(f), 0);
    CHECK_EQ_INT(ferry_lora_epoch(f), e);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", NULL, 0), 0);
    CHECK_EQ_INT(check_named(f, "blk.1.attn_k.weight", NULL, 0), 0);
    free(before);
    free(during);
    ferry_destroy(f);
}

/* ---- 3. switching adapters reads no base byte again (home host) --------------------------------- */

static void test_no_reread(const char *dev, ferry_load load)
{
    int skip = 0;
    ferry *f = make(dev, FERRY_HOME_HOST, load, &skip);
    if (skip)
        return;
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_ignore(f, "output.weight"), 0); /* time, not coverage */
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    CHECK_EQ_INT(ferry_load_group(f, NULL), 0);
    CHECK_EQ_INT(check_all(f, NULL, 0), 0);
    ferry_stats st;
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    uint64_t r0 = st.bytes_read;
    if (load == FERRY_LOAD_READ) /* everything but output.weight */
        CHECK(r0 >= ferry_catalog_total_bytes(ferry_catalog_of(f)) - 2 * BIG_ROWS * BIG_COLS);
    int ip = -1, i2 = -1;
    struct {
        const char *what;
        int rc;
        uint64_t read;
    } steps[6];
    size_t ns = 0;
    /* 1: the first adapter */
    CHECK_EQ_INT(add(f, &peft, 1.0f, NULL, NULL, 0, &ip), 0);
    active a1[] = {{&peft, 1.0f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, a1, 1), 0);
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    steps[ns].what = "first adapter added";
    steps[ns].read = st.bytes_read;
    steps[ns++].rc = st.bytes_read == r0;
    /* 2: its multiplier */
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, 0.25f), 0);
    active a2[] = {{&peft, 0.25f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, a2, 1), 0);
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    steps[ns].what = "multiplier changed";
    steps[ns].read = st.bytes_read;
    steps[ns++].rc = st.bytes_read == r0;
    /* 3: switched to another adapter */
    CHECK_EQ_INT(ferry_lora_remove(f, ip), 0);
    CHECK_EQ_INT(add(f, &peft2, 1.25f, NULL, NULL, 0, &i2), 0);
    active a3[] = {{&peft2, 1.25f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, a3, 1), 0);
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    steps[ns].what = "switched to another adapter";
    steps[ns].read = st.bytes_read;
    steps[ns++].rc = st.bytes_read == r0;
    /* 4: none */
    CHECK_EQ_INT(ferry_lora_clear(f), 0);
    CHECK_EQ_INT(check_all(f, NULL, 0), 0);
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    steps[ns].what = "adapters cleared";
    steps[ns].read = st.bytes_read;
    steps[ns++].rc = st.bytes_read == r0;
    /* 5: one again */
    CHECK_EQ_INT(add(f, &peft2, -1.0f, NULL, NULL, 0, &i2), 0);
    active a5[] = {{&peft2, -1.0f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, a5, 1), 0);
    CHECK_EQ_INT(ferry_get_stats(f, &st), 0);
    steps[ns].what = "adapter added again";
    steps[ns].read = st.bytes_read;
    steps[ns++].rc = st.bytes_read == r0;
    for (size_t k = 0; k < ns; k++) {
        if (!steps[k].rc)
            fprintf(stderr, "no_reread %s load %d: base bytes read again after: %s (%llu bytes "
                    "read, %llu after the first load)\n", dev, (int)load, steps[k].what,
                    (unsigned long long)steps[k].read, (unsigned long long)r0);
        CHECK(steps[k].rc);
    }
    ferry_destroy(f);
}

/* ---- 4. the home copy and the file are never modified ------------------------------------------- */

static void test_pristine(void)
{
    uint64_t h0 = file_hash(path_of("llama.gguf")), u0 = file_hash(path_of("unet.safetensors"));
    ferry *f = make("cpu", FERRY_HOME_HOST, FERRY_LOAD_MMAP, NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    CHECK_EQ_INT(ferry_open(f, path_of("unet.safetensors"), NULL), 0);
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t n = ferry_catalog_count(c);
    ferry_tensor **ts = calloc(n, sizeof *ts);
    const unsigned char **mapped = calloc(n, sizeof *mapped);
    unsigned char **filebytes = calloc(n, sizeof *filebytes);
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info in;
        ferry_catalog_tensor(c, i, &in);
        ts[i] = ferry_find(f, in.name);
        filebytes[i] = fixture_pread(in.file, in.offset, in.nbytes);
    }
    /* Without adapters every tensor is zero-copy: the pointer is the mapping. */
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; i < n; i++)
        mapped[i] = ferry_tensor_data(ts[i]);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    ferry_placement *pl = NULL;
    size_t np = 0;
    CHECK_EQ_INT(ferry_plan(f, &pl, &np, NULL), 0);
    size_t zc = 0;
    for (size_t i = 0; i < np; i++)
        zc += pl[i].zero_copy;
    CHECK_EQ_INT(zc, n);
    free(pl);

    int ip, ik;
    CHECK_EQ_INT(add(f, &peft, 1.0f, NULL, NULL, 0, &ip), 0);
    CHECK_EQ_INT(add(f, &kohya, 3.0f, NULL, NULL, 0, &ik), 0);
    active act[] = {{&peft, 1.0f, NULL, NULL}, {&kohya, 3.0f, NULL, NULL}};
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    size_t merged = 0, same_ptr = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(check_prepared(f, ts[i], act, 2), 0);
        ferry_lora_factor fac;
        if (ferry_lora_factors(f, ts[i], 0, &fac) == 0) {
            merged++;
            /* A merged weight gets a staged copy; the mapping under it is untouched. */
            same_ptr += ferry_tensor_data(ts[i]) == mapped[i];
        }
        CHECK(memcmp(mapped[i], filebytes[i], ferry_tensor_nbytes(ts[i])) == 0);
    }
    CHECK_EQ_INT(merged, matched(&peft, NULL) + matched(&kohya, NULL));
    CHECK_EQ_INT(same_ptr, 0);
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, -2.0f), 0);
    active act2[] = {{&peft, -2.0f, NULL, NULL}, {&kohya, 3.0f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, act2, 2), 0);
    /* Cleared: zero-copy again, the same mapping, the file's bytes. */
    CHECK_EQ_INT(ferry_lora_clear(f), 0);
    CHECK_EQ_INT(ferry_prepare(f, ts, n), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK(ferry_tensor_data(ts[i]) == mapped[i]);
        CHECK(memcmp(mapped[i], filebytes[i], ferry_tensor_nbytes(ts[i])) == 0);
    }
    CHECK_EQ_INT(ferry_release(f, ts, n), 0);
    ferry_destroy(f);
    for (size_t i = 0; i < n; i++)
        free(filebytes[i]);
    free(filebytes);
    free(mapped);
    free(ts);
    CHECK(file_hash(path_of("llama.gguf")) == h0);
    CHECK(file_hash(path_of("unet.safetensors")) == u0);
}

/* ---- 5. runtime mode ---------------------------------------------------------------------------- */

static void check_factor(ferry *f, const char *name, size_t i, int id, const lspec *s,
                         const lpair *p, float mult)
{
    ferry_tensor *t = ferry_find(f, name);
    ferry_lora_factor fac;
    memset(&fac, 0, sizeof fac);
    CHECK(t != NULL);
    CHECK_EQ_INT(ferry_lora_factors(f, t, i, &fac), 0);
    CHECK_EQ_INT(fac.adapter, id);
    CHECK_EQ_INT(fac.rank, p->rank);
    CHECK_EQ_INT(fac.rows, p->rows);
    CHECK_EQ_INT(fac.cols, pair_cols(p));
    double scale = (double)mult * pair_alpha(s, p) / p->rank;
    CHECK(fabs(fac.scale - scale) <= 1e-6 * fabs(scale));
    if (fac.a && fac.b && fac.rows == p->rows && fac.cols == pair_cols(p)) {
        CHECK(memcmp(fac.a, p->a, (size_t)p->rank * pair_cols(p) * sizeof(float)) == 0);
        CHECK(memcmp(fac.b, p->b, (size_t)p->rows * p->rank * sizeof(float)) == 0);
    } else {
        CHECK(0);
    }
}

static void test_runtime(void)
{
    ferry *f = make("cpu", FERRY_HOME_HOST, FERRY_LOAD_READ, NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    CHECK_EQ_INT(ferry_open(f, path_of("unet.safetensors"), NULL), 0);
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_RUNTIME), 0);
    CHECK_EQ_INT(ferry_lora_epoch(f), 1);
    int ip, ig, ik;
    CHECK_EQ_INT(add(f, &peft, 0.6f, NULL, NULL, 0, &ip), 0);
    CHECK_EQ_INT(add(f, &gguf_ad, 1.5f, NULL, NULL, 0, &ig), 0);
    CHECK_EQ_INT(add(f, &kohya, 1.0f, NULL, NULL, 0, &ik), 0);
    /* Unmerged data. */
    CHECK_EQ_INT(check_all(f, NULL, 0), 0);
    /* The factors, in adapter order. */
    check_factor(f, "blk.0.attn_q.weight", 0, ip, &peft, &peft_pairs[0], 0.6f);
    check_factor(f, "blk.0.attn_q.weight", 1, ig, &gguf_ad, &gguf_pairs[0], 1.5f);
    check_factor(f, "blk.0.ffn_down.weight", 0, ip, &peft, &peft_pairs[6], 0.6f);
    check_factor(f, "blk.0.ffn_down.weight", 1, ig, &gguf_ad, &gguf_pairs[2], 1.5f);
    check_factor(f, "output.weight", 0, ip, &peft, &peft_pairs[8], 0.6f);
    check_factor(f, "blk.1.attn_k.weight", 0, ig, &gguf_ad, &gguf_pairs[1], 1.5f);
    check_factor(f, "down_blocks.0.resnets.0.conv1.weight", 0, ik, &kohya, &kohya_pairs[0], 1.0f);
    check_factor(f, UNET_ATTN "attn1.to_k.weight", 0, ik, &kohya, &kohya_pairs[2], 1.0f);
    check_factor(f, UNET_ATTN "ff.net.2.weight", 0, ik, &kohya, &kohya_pairs[3], 1.0f);
    ferry_lora_factor fac;
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "blk.0.attn_q.weight"), 2, &fac),
                 FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "output_norm.weight"), 0, &fac),
                 FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "token_embd.weight"), 0, &fac),
                 FERRY_ENOENT);
    /* A multiplier change shows in the scale. */
    CHECK_EQ_INT(ferry_lora_set_multiplier(f, ip, -3.0f), 0);
    check_factor(f, "blk.0.attn_q.weight", 0, ip, &peft, &peft_pairs[0], -3.0f);
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", NULL, 0), 0);
    /* Merge mode merges what runtime mode handed out. */
    CHECK_EQ_INT(ferry_lora_set_mode(f, FERRY_LORA_MERGE), 0);
    active act[] = {{&peft, -3.0f, NULL, NULL}, {&gguf_ad, 1.5f, NULL, NULL},
                    {&kohya, 1.0f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, act, 3), 0);
    check_factor(f, "blk.0.attn_q.weight", 1, ig, &gguf_ad, &gguf_pairs[0], 1.5f);
    ferry_destroy(f);
}

/* ---- 6. prefixes -------------------------------------------------------------------------------- */

static void test_prefixes(void)
{
    /* Base prefix: only blk.0's weights take the adapter; the rest is reported unmatched. */
    ferry *f = make("sim:64MiB", FERRY_HOME_HOST, FERRY_LOAD_MMAP, NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    int ip = -1;
    CHECK_EQ_INT(add(f, &peft, 1.0f, "blk.0.", NULL, 0, &ip), 0);
    active a1[] = {{&peft, 1.0f, NULL, "blk.0."}};
    CHECK_EQ_INT(check_all(f, a1, 1), 0);
    CHECK_EQ_INT(check_named(f, "blk.1.attn_q.weight", NULL, 0), 0);
    CHECK_EQ_INT(check_named(f, "output.weight", NULL, 0), 0);
    ferry_lora_info info;
    CHECK_EQ_INT(ferry_lora_get_info(f, ip, &info), 0);
    CHECK_EQ_INT(info.n_matched, matched(&peft, "blk.0."));
    CHECK_EQ_INT(info.n_unmatched, N_OF(peft_pairs) - matched(&peft, "blk.0."));
    CHECK_EQ_INT(info.factor_bytes, factor_bytes(&peft, "blk.0."));
    ferry_destroy(f);

    /* Target prefix: two copies of the base; the adapter aimed at "hn." touches only those,
     * another one without a target only the unprefixed copy. */
    f = make("cpu", FERRY_HOME_DISK, FERRY_LOAD_READ, NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), "hn."), 0);
    int ih = -1, ig = -1;
    CHECK_EQ_INT(add(f, &peft, 0.5f, NULL, "hn.", 0, &ih), 0);
    CHECK_EQ_INT(add(f, &gguf_ad, 2.0f, NULL, NULL, 0, &ig), 0);
    active a2[] = {{&peft, 0.5f, "hn.", NULL}, {&gguf_ad, 2.0f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, a2, 2), 0);
    CHECK_EQ_INT(ferry_lora_get_info(f, ih, &info), 0);
    CHECK_EQ_INT(info.n_matched, matched(&peft, NULL));
    CHECK_EQ_INT(ferry_lora_get_info(f, ig, &info), 0);
    CHECK_EQ_INT(info.n_matched, N_OF(gguf_pairs));
    /* Spot checks that the check above saw what it should: */
    ferry_lora_factor fac;
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "hn.blk.0.attn_k.weight"), 0, &fac), 0);
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "blk.0.attn_k.weight"), 0, &fac),
                 FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "hn.blk.1.attn_k.weight"), 0, &fac),
                 FERRY_ENOENT);
    CHECK_EQ_INT(ferry_lora_factors(f, ferry_find(f, "blk.1.attn_k.weight"), 0, &fac), 0);
    /* Base and target prefix together: only hn.blk.1. */
    int ib = -1;
    CHECK_EQ_INT(add(f, &peft2, 1.0f, "hn.blk.1.", "hn.", 0, &ib), 0);
    active a3[] = {{&peft, 0.5f, "hn.", NULL},
                   {&gguf_ad, 2.0f, NULL, NULL},
                   {&peft2, 1.0f, "hn.", "hn.blk.1."}};
    CHECK_EQ_INT(ferry_lora_get_info(f, ib, &info), 0);
    CHECK_EQ_INT(info.n_matched, 1);
    CHECK_EQ_INT(info.n_unmatched, 2);
    CHECK_EQ_INT(check_all(f, a3, 3), 0);
    ferry_destroy(f);
}

/* ---- 7. weights that cannot take a merge -------------------------------------------------------- */

static void test_required(void)
{
    for (int required = 1; required >= 0; required--) {
        ferry *f = ferry_create(NULL);
        CHECK(f != NULL);
        if (!f)
            return;
        ferry_policy lazy;
        memset(&lazy, 0, sizeof lazy);
        lazy.lazy = FERRY_LAZY_ON;
        CHECK_EQ_INT(ferry_group_add(f, "lazy", "blk.0.ffn_gate.weight", &lazy), 0);
        CHECK_EQ_INT(ferry_open(f, path_of("odd.gguf"), NULL), 0);
        /* Handles taken before the adapter exists (an engine looks its weights up once). */
        ferry_tensor *v = ferry_find(f, "blk.0.attn_v.weight");
        ferry_tensor *g = ferry_find(f, "blk.0.ffn_gate.weight");
        ferry_tensor *q = ferry_find(f, "blk.0.attn_q.weight");
        CHECK(v && g && q);
        int id = -1;
        CHECK_EQ_INT(add(f, &odd_ad, 1.0f, NULL, NULL, required, &id), 0);
        active act[] = {{&odd_ad, 1.0f, NULL, NULL}};
        /* Looking a weight up is no use of it: it is found whatever an adapter says. */
        CHECK(ferry_find(f, "blk.0.attn_v.weight") == v);
        CHECK(ferry_find(f, "blk.0.ffn_gate.weight") == g);
        if (!v || !g || !q) {
            ferry_destroy(f);
            continue;
        }
        if (required) {
            CHECK_EQ_INT(ferry_prepare(f, &v, 1), FERRY_ELORA);
            CHECK(strstr(ferry_errmsg(f), "blk.0.attn_v.weight") != NULL);
            CHECK(strstr(ferry_errmsg(f), "q4_k") != NULL);
            CHECK(strstr(ferry_errmsg(f), "odd_peft.safetensors") != NULL);
            CHECK_EQ_INT(ferry_prepare(f, &g, 1), FERRY_ELORA);
            CHECK(strstr(ferry_errmsg(f), "blk.0.ffn_gate.weight") != NULL);
            CHECK(strstr(ferry_errmsg(f), "lazy") != NULL);
            /* A set holding one of them fails whole: nothing of it is held. */
            ferry_tensor *set[2] = {q, v};
            CHECK_EQ_INT(ferry_prepare(f, set, 2), FERRY_ELORA);
            CHECK(ferry_tensor_data(q) == NULL);
            /* The rest works, merged. */
            CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", act, 1), 0);
            CHECK_EQ_INT(check_named(f, "blk.0.attn_k.weight", act, 1), 0);
            ferry_lora_info info;
            CHECK_EQ_INT(ferry_lora_get_info(f, id, &info), 0);
            CHECK_EQ_INT(info.skipped, 0);
            /* Without the adapter the weights prepare again. */
            CHECK_EQ_INT(ferry_lora_remove(f, id), 0);
            CHECK_EQ_INT(check_named(f, "blk.0.attn_v.weight", NULL, 0), 0);
            CHECK_EQ_INT(check_named(f, "blk.0.ffn_gate.weight", NULL, 0), 0);
        } else {
            /* Optional: staged unmerged (the file's bytes), counted once each. */
            for (int pass = 0; pass < 2; pass++) {
                CHECK_EQ_INT(check_named(f, "blk.0.attn_v.weight", NULL, 0), 0);
                CHECK_EQ_INT(check_named(f, "blk.0.ffn_gate.weight", NULL, 0), 0);
                CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", act, 1), 0);
            }
            ferry_lora_info info;
            CHECK_EQ_INT(ferry_lora_get_info(f, id, &info), 0);
            CHECK_EQ_INT(info.skipped, 2);
            CHECK_EQ_INT(info.n_matched, N_OF(odd_pairs));
        }
        ferry_destroy(f);
    }
}

/* ---- 8. hostile adapters ------------------------------------------------------------------------ */

static void refused(ferry *f, const char *file, const char *name1, const char *name2)
{
    uint64_t e = ferry_lora_epoch(f);
    int id = 12345;
    int rc = ferry_lora_add(f, path_of(file), 1.0f, NULL, &id);
    CHECK_EQ_INT(rc, FERRY_ELORA);
    const char *msg = ferry_errmsg(f);
    if (name1 && !strstr(msg, name1))
        fprintf(stderr, "%s: message lacks '%s': %s\n", file, name1, msg);
    if (name1)
        CHECK(strstr(msg, name1) != NULL);
    if (name2)
        CHECK(strstr(msg, name2) != NULL);
    CHECK_EQ_INT(id, 12345);
    CHECK_EQ_INT(ferry_lora_epoch(f), e);
}

static void test_hostile(void)
{
    const char *A = HF "0.self_attn.q_proj.lora_A.weight", *B = HF "0.self_attn.q_proj.lora_B.weight";
    wspec misfit[] = {{A, FERRY_DTYPE_F32, 2, {4, 65}, 0}, {B, FERRY_DTYPE_F32, 2, {64, 4}, 0}};
    wspec rankdiff[] = {{A, FERRY_DTYPE_F32, 2, {4, 64}, 0}, {B, FERRY_DTYPE_F32, 2, {64, 2}, 0}};
    wspec rank0[] = {{A, FERRY_DTYPE_F32, 2, {0, 64}, 0}, {B, FERRY_DTYPE_F32, 2, {64, 0}, 0}};
    wspec lone_a[] = {{A, FERRY_DTYPE_F32, 2, {4, 64}, 0}};
    wspec lone_b[] = {{"blk.0.attn_q.weight.lora_b", FERRY_DTYPE_F32, 2, {4, 64}, 0}};
    wspec rows[] = {{"blk.0.attn_k.weight.lora_a", FERRY_DTYPE_F32, 2, {64, 4}, 0},
                    {"blk.0.attn_k.weight.lora_b", FERRY_DTYPE_F32, 2, {4, 64}, 0}};
    meta gm[1] = {meta_str("adapter.type", "lora")};
    CHECK_EQ_INT(write_tensors(path_of("h_misfit.safetensors"), FERRY_FORMAT_SAFETENSORS, misfit, 2,
                               NULL, 0), 0);
    CHECK_EQ_INT(write_tensors(path_of("h_rankdiff.safetensors"), FERRY_FORMAT_SAFETENSORS,
                               rankdiff, 2, NULL, 0), 0);
    CHECK_EQ_INT(write_tensors(path_of("h_rank0.safetensors"), FERRY_FORMAT_SAFETENSORS, rank0, 2,
                               NULL, 0), 0);
    CHECK_EQ_INT(write_tensors(path_of("h_lone_a.safetensors"), FERRY_FORMAT_SAFETENSORS, lone_a,
                               1, NULL, 0), 0);
    CHECK_EQ_INT(write_tensors(path_of("h_lone_b.gguf"), FERRY_FORMAT_GGUF, lone_b, 1, gm, 1), 0);
    CHECK_EQ_INT(write_tensors(path_of("h_rows.gguf"), FERRY_FORMAT_GGUF, rows, 2, gm, 1), 0);
    CHECK_EQ_INT(check_write_file(path_of("h_garbage.safetensors"), "\x10\0\0\0\0\0\0\0{\"a\":", 13),
                 0);

    ferry *f = make("sim:64MiB", FERRY_HOME_DISK, FERRY_LOAD_READ, NULL);
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK_EQ_INT(ferry_open(f, path_of("llama.gguf"), NULL), 0);
    int ig = -1;
    CHECK_EQ_INT(add(f, &gguf_ad, 1.0f, NULL, NULL, 0, &ig), 0);
    active act[] = {{&gguf_ad, 1.0f, NULL, NULL}};
    CHECK_EQ_INT(check_named(f, "blk.0.attn_q.weight", act, 1), 0);
    /* Hold a merged tensor across the failures: nothing about it may change. */
    ferry_tensor *q = ferry_find(f, "blk.0.attn_q.weight");
    CHECK_EQ_INT(ferry_prepare(f, &q, 1), 0);

    refused(f, "h_misfit.safetensors", "q_proj.lora_A.weight", "blk.0.attn_q.weight");
    refused(f, "h_rankdiff.safetensors", "q_proj.lora_A.weight", "q_proj.lora_B.weight");
    refused(f, "h_rank0.safetensors", "q_proj.lora_", "rank 0");
    refused(f, "h_lone_a.safetensors", "q_proj.lora_A.weight", NULL);
    refused(f, "h_lone_b.gguf", "blk.0.attn_q.weight.lora_b", NULL);
    refused(f, "h_rows.gguf", "blk.0.attn_k.weight.lora_", "blk.0.attn_k.weight");
    int id = 777;
    CHECK(ferry_lora_add(f, path_of("h_garbage.safetensors"), 1.0f, NULL, &id) < 0);
    CHECK(strstr(ferry_errmsg(f), "h_garbage.safetensors") != NULL);
    CHECK(ferry_lora_add(f, path_of("missing.safetensors"), 1.0f, NULL, &id) < 0);
    CHECK(strstr(ferry_errmsg(f), "missing.safetensors") != NULL);
    CHECK_EQ_INT(ferry_lora_add(f, path_of("peft.safetensors"), NAN, NULL, &id), FERRY_EINVAL);
    CHECK_EQ_INT(id, 777);

    CHECK_EQ_INT(check_prepared(f, q, act, 1), 0);
    CHECK_EQ_INT(ferry_release(f, &q, 1), 0);
    /* Still usable: the earlier adapter applies, and new ones can be added. */
    CHECK_EQ_INT(check_all(f, act, 1), 0);
    int ip = -1;
    CHECK_EQ_INT(add(f, &peft, 0.5f, NULL, NULL, 0, &ip), 0);
    active act2[] = {{&gguf_ad, 1.0f, NULL, NULL}, {&peft, 0.5f, NULL, NULL}};
    CHECK_EQ_INT(check_all(f, act2, 2), 0);
    ferry_lora_info info;
    CHECK_EQ_INT(ferry_lora_get_info(f, ig, &info), 0);
    CHECK_EQ_INT(ferry_lora_get_info(f, ip, &info), 0);
    CHECK_EQ_INT(info.n_matched, matched(&peft, NULL));
    ferry_destroy(f);
}

/* ---- 9. `ferry lora merge` and `ferry lora info` ------------------------------------------------ */

/* Runs the CLI with ARGS (a shell fragment); stdout and stderr go to OUT_FILE. Exit status. */
static int run_cli(const char *args, const char *out_file)
{
    char cmd[28672];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>&1", FERRY_CLI, args, out_file);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return calloc(1, 1);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n)
        s[0] = 0;
    fclose(f);
    return s;
}

static int exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static int same_value(const ferry_value *a, const ferry_value *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case FERRY_VALUE_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    case FERRY_VALUE_F32:
    case FERRY_VALUE_F64: return a->v.f == b->v.f;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: return a->v.i == b->v.i;
    case FERRY_VALUE_ARRAY:
        if (a->v.arr.elem != b->v.arr.elem || a->v.arr.n != b->v.arr.n)
            return 0;
        for (uint64_t i = 0; i < a->v.arr.n; i++)
            if (!same_value(&a->v.arr.items[i], &b->v.arr.items[i]))
                return 0;
        return 1;
    default: return a->v.u == b->v.u;
    }
}

/* The merged file OUT against BASE merged at staging with the adapters ACT: same tensors in the
 * same order, shapes in OUT's own order, dtypes; values within the reference merge's tolerance;
 * bytes identical to what a manager stages (the CLI and this test come from one build, so they
 * use the same GEMM: a TSan build's builtin loop rounds differently from OpenBLAS). */
static void check_merged_file(const char *out, const char *base, const active *act, size_t nact,
                              int same_format)
{
    ferry_catalog *co = ferry_catalog_create(), *cb = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(co, out, NULL), 0);
    CHECK_EQ_INT(ferry_catalog_add(cb, base, NULL), 0);
    size_t n = ferry_catalog_count(cb);
    CHECK_EQ_INT(ferry_catalog_count(co), n);
    ferry *f = make("cpu", FERRY_HOME_HOST, FERRY_LOAD_READ, NULL);
    CHECK_EQ_INT(ferry_open(f, base, NULL), 0);
    for (size_t a = 0; a < nact; a++)
        CHECK_EQ_INT(add(f, act[a].s, act[a].mult, act[a].bp, act[a].tp, 0, NULL), 0);
    size_t differ = 0, merged = 0;
    for (size_t i = 0; i < n && ferry_catalog_count(co) == n; i++) {
        ferry_tensor_info ib, io;
        ferry_catalog_tensor(cb, i, &ib);
        ferry_catalog_tensor(co, i, &io);
        CHECK_STR(io.name, ib.name);
        CHECK_EQ_INT(io.dtype, ib.dtype);
        CHECK_EQ_INT(io.ndim, ib.ndim);
        for (uint32_t d = 0; d < ib.ndim && d < io.ndim; d++)
            CHECK_EQ_INT(io.shape[d], same_format ? ib.shape[d] : ib.shape[ib.ndim - 1 - d]);
        CHECK_EQ_INT(io.row_elems, ib.row_elems);
        ferry_tensor *t = ferry_find(f, ib.name);
        unsigned char *staged = malloc(ib.nbytes ? ib.nbytes : 1);
        unsigned char *written = fixture_pread(out, io.offset, io.nbytes);
        CHECK_EQ_INT(ferry_prepare(f, &t, 1), 0);
        CHECK_EQ_INT(ferry_tensor_read(f, t, 0, ib.nbytes, staged), 0);
        ferry_lora_factor fac;
        merged += ferry_lora_factors(f, t, 0, &fac) == 0;
        /* Staging and the file both hold the reference merge. */
        CHECK_EQ_INT(check_prepared(f, t, act, nact), 0);
        ferry_release(f, &t, 1);
        if (written && io.nbytes == ib.nbytes)
            CHECK_EQ_INT(check_bytes(&ib, written, io.nbytes, io.dtype, act, nact), 0);
        if (!written || io.nbytes != ib.nbytes || memcmp(written, staged, ib.nbytes) != 0) {
            fprintf(stderr, "  %s: %s differs from staging\n", out, ib.name);
            differ++;
        }
        free(staged);
        free(written);
    }
    CHECK_EQ_INT(differ, 0);
    size_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info ib;
        ferry_catalog_tensor(cb, i, &ib);
        term terms[8];
        expect += collect_terms(ib.name, act, nact, terms) > 0;
    }
    CHECK_EQ_INT(merged, expect);
    CHECK(merged > 0);
    ferry_destroy(f);
    ferry_catalog_destroy(co);
    ferry_catalog_destroy(cb);
}

static void test_cli(void)
{
    char args[20480], log[4096], out1[4096], out2[4096], out3[4096], bad[4096], bad2[4096];
    /* Kept in local buffers: path_of's are recycled after 16 calls. */
    snprintf(log, sizeof log, "%s", path_of("cli.log"));
    snprintf(out1, sizeof out1, "%s", path_of("merged.gguf"));
    snprintf(out2, sizeof out2, "%s", path_of("merged_unet.gguf"));
    snprintf(out3, sizeof out3, "%s", path_of("merged_plain.safetensors"));
    snprintf(bad, sizeof bad, "%s", path_of("bad.safetensors"));
    snprintf(bad2, sizeof bad2, "%s", path_of("bad.gguf"));
    uint64_t h0 = file_hash(path_of("llama.gguf"));

    /* GGUF -> GGUF, two adapters, metadata kept with its types. */
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -a '%s:0.5' -o '%s' --quiet",
             path_of("llama.gguf"), path_of("peft.safetensors"), path_of("gguf_lora.gguf"), out1);
    int rc = run_cli(args, log);
    CHECK_EQ_INT(rc, 0);
    char *text = slurp(log);
    if (rc)
        fprintf(stderr, "ferry lora merge: %s\n", text);
    CHECK(strcmp(text, "") == 0 || strstr(text, "zz_proj") != NULL); /* quiet: warnings only */
    free(text);
    active act1[] = {{&peft, 1.0f, NULL, NULL}, {&gguf_ad, 0.5f, NULL, NULL}};
    check_merged_file(out1, path_of("llama.gguf"), act1, 2, 1);
    ferry_catalog *cb = ferry_catalog_create(), *co = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(cb, path_of("llama.gguf"), NULL), 0);
    CHECK_EQ_INT(ferry_catalog_add(co, out1, NULL), 0);
    size_t same = 0;
    for (size_t i = 0; i < ferry_catalog_meta_count(cb); i++) {
        const ferry_value *v = ferry_catalog_meta_find(co, ferry_catalog_meta_key(cb, i));
        same += v && same_value(v, ferry_catalog_meta_value(cb, i));
    }
    CHECK_EQ_INT(same, ferry_catalog_meta_count(cb));
    ferry_catalog_destroy(cb);
    ferry_catalog_destroy(co);
    CHECK(file_hash(path_of("llama.gguf")) == h0);

    /* safetensors (conv kernels) -> GGUF: shapes turned into GGUF's order. */
    snprintf(args, sizeof args, "lora merge '%s' -a '%s:-0.75' -o '%s' --format gguf --quiet",
             path_of("unet.safetensors"), path_of("kohya.safetensors"), out2);
    CHECK_EQ_INT(run_cli(args, log), 0);
    active act2[] = {{&kohya, -0.75f, NULL, NULL}};
    check_merged_file(out2, path_of("unet.safetensors"), act2, 1, 0);

    /* GGUF -> safetensors (format from the extension): numbers become strings. */
    snprintf(args, sizeof args, "lora merge '%s' --adapter '%s:2' -o '%s'",
             path_of("llama_plain.gguf"), path_of("peft2.safetensors"), out3);
    rc = run_cli(args, log);
    CHECK_EQ_INT(rc, 0);
    text = slurp(log);
    CHECK(strstr(text, "merged") != NULL); /* the summary line */
    CHECK(strstr(text, "merged_plain.safetensors") != NULL);
    if (rc)
        fprintf(stderr, "ferry lora merge: %s\n", text);
    free(text);
    active act3[] = {{&peft2, 2.0f, NULL, NULL}};
    check_merged_file(out3, path_of("llama_plain.gguf"), act3, 1, 0);
    co = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(co, out3, NULL), 0);
    const char *s = NULL;
    CHECK_EQ_INT(ferry_catalog_get_str(co, "llama.block_count", &s), 0);
    CHECK_STR(s, "2");
    CHECK_EQ_INT(ferry_catalog_get_str(co, "general.file_type", &s), 0);
    CHECK_STR(s, "-7");
    CHECK_EQ_INT(ferry_catalog_get_str(co, "llama.rope.freq_base", &s), 0);
    CHECK(s && strtod(s, NULL) == 10000.5);
    CHECK_EQ_INT(ferry_catalog_get_str(co, "general.quantized", &s), 0);
    CHECK_STR(s, "true");
    CHECK_EQ_INT(ferry_catalog_get_str(co, "tokenizer.ggml.tokens", &s), 0);
    CHECK(s && strstr(s, "\"hello\"") != NULL);
    CHECK_EQ_INT(ferry_catalog_get_str(co, "general.architecture", &s), 0);
    CHECK_STR(s, "llama");
    ferry_catalog_destroy(co);

    /* Failures: no output file appears. */
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("llama.gguf"),
             path_of("peft.safetensors"), bad); /* q8_0 has no safetensors type */
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!exists(bad));
    text = slurp(log);
    CHECK(strstr(text, "q8_0") != NULL || strstr(text, "q4_0") != NULL);
    free(text);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("llama.gguf"),
             path_of("h_misfit.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!exists(bad2));
    text = slurp(log);
    CHECK(strstr(text, "blk.0.attn_q.weight") != NULL);
    free(text);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("llama.gguf"),
             path_of("nothing.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!exists(bad2));
    /* An adapter that matches nothing of the base is a mistake, not a no-op. */
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("llama.gguf"),
             path_of("kohya.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!exists(bad2));
    /* A weight that cannot take the merge fails the merge (it would be written unmerged). */
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("odd.gguf"),
             path_of("odd_peft.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK(!exists(bad2));
    text = slurp(log);
    CHECK(strstr(text, "blk.0.attn_v.weight") != NULL);
    free(text);

    /* Usage errors. */
    snprintf(args, sizeof args, "lora merge '%s' -o '%s'", path_of("llama.gguf"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 2);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s'", path_of("llama.gguf"),
             path_of("peft.safetensors"));
    CHECK_EQ_INT(run_cli(args, log), 2);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s' --format onnx",
             path_of("llama.gguf"), path_of("peft.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 2);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s:x2' -o '%s'", path_of("llama.gguf"),
             path_of("peft.safetensors"), bad2);
    CHECK_EQ_INT(run_cli(args, log), 2);
    snprintf(args, sizeof args, "lora merge '%s' -a '%s' -o '%s'", path_of("llama.gguf"),
             path_of("peft.safetensors"), path_of("llama.gguf"));
    CHECK_EQ_INT(run_cli(args, log), 2);
    CHECK(file_hash(path_of("llama.gguf")) == h0);
    CHECK(!exists(bad2));
    CHECK_EQ_INT(run_cli("lora", log), 2);
    CHECK_EQ_INT(run_cli("lora frobnicate", log), 2);
    CHECK_EQ_INT(run_cli("lora --help", log), 0);
    text = slurp(log);
    CHECK(strstr(text, "merge") != NULL && strstr(text, "info") != NULL);
    free(text);
    CHECK_EQ_INT(run_cli("lora merge --help", log), 0);

    /* info */
    snprintf(args, sizeof args, "lora info '%s'", path_of("kohya.safetensors"));
    CHECK_EQ_INT(run_cli(args, log), 0);
    text = slurp(log);
    CHECK(strstr(text, "kohya") != NULL);
    CHECK(strstr(text, "pairs") != NULL);
    free(text);
    snprintf(args, sizeof args, "lora info '%s' --base '%s'", path_of("peft.safetensors"),
             path_of("llama.gguf"));
    CHECK_EQ_INT(run_cli(args, log), 0);
    text = slurp(log);
    CHECK(strstr(text, "peft") != NULL);
    CHECK(strstr(text, "9 matched") != NULL);
    CHECK(strstr(text, "1 unmatched") != NULL);
    CHECK(strstr(text, "zz_proj") != NULL);
    CHECK(strstr(text, "16") != NULL); /* alpha */
    free(text);
    snprintf(args, sizeof args, "lora info '%s' --base '%s' --json", path_of("gguf_lora.gguf"),
             path_of("llama.gguf"));
    CHECK_EQ_INT(run_cli(args, log), 0);
    text = slurp(log);
    CHECK(strstr(text, "\"scheme\": \"gguf\"") != NULL);
    CHECK(strstr(text, "\"matched\": 3") != NULL);
    free(text);
    snprintf(args, sizeof args, "lora info '%s'", path_of("h_lone_a.safetensors"));
    CHECK_EQ_INT(run_cli(args, log), 1);
    CHECK_EQ_INT(run_cli("lora info", log), 2);
}

int main(void)
{
    dir = check_tmpdir("lora_manager");
    if (write_bases() || write_adapter(&peft) || write_adapter(&gguf_ad) ||
        write_adapter(&kohya) || write_adapter(&peft2) || write_adapter(&odd_ad)) {
        fprintf(stderr, "cannot write the test files\n");
        return 1;
    }
    uint64_t h_llama = file_hash(path_of("llama.gguf"));
    uint64_t h_unet = file_hash(path_of("unet.safetensors"));
    double t0 = ferry_now();
#define TIMED(call)                                                                               \
    do {                                                                                          \
        call;                                                                                     \
        double t1_ = ferry_now();                                                                 \
        printf("%-40s %6.2f s\n", #call, t1_ - t0);                                                \
        t0 = t1_;                                                                                 \
    } while (0)
    TIMED(test_values());
    TIMED(test_epochs("cpu"));
    TIMED(test_epochs("sim:64MiB"));
    TIMED(test_no_reread("cpu", FERRY_LOAD_READ));
    TIMED(test_no_reread("sim:64MiB", FERRY_LOAD_READ));
    TIMED(test_no_reread("cpu", FERRY_LOAD_MMAP));
    TIMED(test_pristine());
    TIMED(test_runtime());
    TIMED(test_prefixes());
    TIMED(test_required());
    TIMED(test_hostile());
    TIMED(test_cli());
#undef TIMED
    CHECK(file_hash(path_of("llama.gguf")) == h_llama);
    CHECK(file_hash(path_of("unet.safetensors")) == h_unet);
    lspec *all[] = {&peft, &gguf_ad, &kohya, &peft2, &odd_ad};
    for (size_t i = 0; i < N_OF(all); i++)
        free_adapter(all[i]);
    int rc = check_finish();
    if (!rc)
        check_rmdir(dir);
    return rc;
}
