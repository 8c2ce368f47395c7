/*
 * synth.c — synthetic models for `ferry gen` and `ferry demo`: the real tensor names and shapes of
 * a llama-style LLM or a diffusers-style UNet, sized to a requested number of bytes, filled with
 * values shaped like trained weights (roughly normal, scaled 1/sqrt(fan_in); norms near 1.0).
 *
 * Values depend on the seed alone: every chunk of CHUNK elements of a tensor draws from its own
 * generator seeded by (seed, tensor, chunk), so the bytes are the same whatever the number of
 * threads. Worker threads fill and convert chunks into a ring of slots; the calling thread writes
 * the slots in order through the atomic writer.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SYNTH_X86 1
#endif

#include "cli.h"
#include "synth.h"

#define CHUNK (UINT64_C(1) << 20) /* elements per chunk: a multiple of every block size */
#define NSLOTS 6
#define MAX_WORKERS 4
#define QBLOCK 32 /* q8_0 / q4_0 block: quantized rows must be multiples of it */
#define CLAMP(x, lo, hi) ((x) < (lo) ? (lo) : (x) > (hi) ? (hi) : (x))

const char *synth_arch_name(synth_arch a) { return a == SYNTH_UNET ? "unet" : "llama"; }

void synth_free(synth_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++)
        free(m->t[i].name);
    free(m->t);
    m->t = NULL;
    m->n = m->cap = 0;
    m->total_bytes = 0;
}

static int is_quant(ferry_dtype t) { return t == FERRY_DTYPE_Q8_0 || t == FERRY_DTYPE_Q4_0; }

/* ---- building the tensor list -------------------------------------------------------------
 * A builder either records tensors or, while sizes are being fitted, only adds up their bytes
 * (count_only). Shapes are given outermost first, as PyTorch writes them ([out, in, kh, kw]);
 * GGUF gets them reversed (ne[0] innermost). */

typedef struct builder {
    synth_model *m;
    int count_only;
    int failed; /* out of memory or an impossible size */
} builder;

static void add(builder *b, int kind, uint32_t ndim, const int64_t *dims, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void add(builder *b, int kind, uint32_t ndim, const int64_t *dims, const char *fmt, ...)
{
    synth_model *m = b->m;
    if (b->failed)
        return;
    ferry_dtype dt = m->cfg.dtype;
    int gguf = m->cfg.format == FERRY_FORMAT_GGUF;
    uint64_t n = 1, fan_in = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        n *= (uint64_t)dims[d];
        if (d > 0)
            fan_in *= (uint64_t)dims[d];
    }
    if (kind != SYNTH_WEIGHT) {
        if (gguf)
            dt = FERRY_DTYPE_F32; /* GGUF keeps norms and biases in f32, whatever the weights */
    } else if (is_quant(dt) && (ndim < 2 || dims[ndim - 1] % QBLOCK != 0)) {
        dt = FERRY_DTYPE_F16; /* a row that is no whole number of blocks stays f16 */
    }
    uint64_t nbytes;
    if (ferry_dtype_nbytes(dt, n, &nbytes) != 0) {
        b->failed = 1;
        return;
    }
    m->total_bytes += nbytes;
    if (b->count_only)
        return;
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        synth_tensor *t = realloc(m->t, cap * sizeof *t);
        if (!t) {
            b->failed = 1;
            return;
        }
        m->t = t;
        m->cap = cap;
    }
    synth_tensor *t = &m->t[m->n];
    memset(t, 0, sizeof *t);
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    t->name = strdup(name);
    if (!t->name) {
        b->failed = 1;
        return;
    }
    t->dtype = dt;
    t->ndim = ndim;
    for (uint32_t d = 0; d < ndim; d++)
        t->shape[d] = gguf ? dims[ndim - 1 - d] : dims[d];
    t->n_elems = n;
    t->nbytes = nbytes;
    t->kind = kind;
    /* a 3-D weight is a stack of matrices (experts): its fan-in is one matrix's columns */
    if (kind == SYNTH_WEIGHT && ndim == 3)
        fan_in = (uint64_t)dims[2];
    t->scale = kind == SYNTH_NORM     ? 0.02f
               : kind == SYNTH_BIAS   ? 0.01f
               : kind == SYNTH_ROUTER ? 1.0f
                                      : (float)(1.0 / sqrt((double)(fan_in ? fan_in : 1)));
    m->n++;
}

#define V(...) ((const int64_t[]){__VA_ARGS__})

static void build_llama(builder *b)
{
    const synth_config *c = &b->m->cfg;
    int64_t dim = c->dim, ff = c->ff, vocab = c->vocab, ne = c->experts;
    int64_t kv = (int64_t)c->dim / c->heads * c->kv_heads;
    char p[64];
    add(b, SYNTH_WEIGHT, 2, V(vocab, dim), "token_embd.weight");
    for (uint32_t l = 0; l < c->layers; l++) {
        snprintf(p, sizeof p, "blk.%u.", l);
        add(b, SYNTH_NORM, 1, V(dim), "%sattn_norm.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(dim, dim), "%sattn_q.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(kv, dim), "%sattn_k.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(kv, dim), "%sattn_v.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(dim, dim), "%sattn_output.weight", p);
        add(b, SYNTH_NORM, 1, V(dim), "%sffn_norm.weight", p);
        if (ne) { /* Mixtral: the router, then each FFN matrix stacked over the experts */
            add(b, SYNTH_ROUTER, 2, V(ne, dim), "%sffn_gate_inp.weight", p);
            add(b, SYNTH_WEIGHT, 3, V(ne, ff, dim), "%sffn_gate_exps.weight", p);
            add(b, SYNTH_WEIGHT, 3, V(ne, ff, dim), "%sffn_up_exps.weight", p);
            add(b, SYNTH_WEIGHT, 3, V(ne, dim, ff), "%sffn_down_exps.weight", p);
            continue;
        }
        add(b, SYNTH_WEIGHT, 2, V(ff, dim), "%sffn_gate.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(ff, dim), "%sffn_up.weight", p);
        add(b, SYNTH_WEIGHT, 2, V(dim, ff), "%sffn_down.weight", p);
    }
    add(b, SYNTH_NORM, 1, V(dim), "output_norm.weight");
    add(b, SYNTH_WEIGHT, 2, V(vocab, dim), "output.weight");
}

/* diffusers' ResnetBlock2D */
static void unet_resnet(builder *b, const char *p, int64_t in, int64_t out, int64_t temb)
{
    add(b, SYNTH_NORM, 1, V(in), "%s.norm1.weight", p);
    add(b, SYNTH_BIAS, 1, V(in), "%s.norm1.bias", p);
    add(b, SYNTH_WEIGHT, 4, V(out, in, 3, 3), "%s.conv1.weight", p);
    add(b, SYNTH_BIAS, 1, V(out), "%s.conv1.bias", p);
    add(b, SYNTH_WEIGHT, 2, V(out, temb), "%s.time_emb_proj.weight", p);
    add(b, SYNTH_BIAS, 1, V(out), "%s.time_emb_proj.bias", p);
    add(b, SYNTH_NORM, 1, V(out), "%s.norm2.weight", p);
    add(b, SYNTH_BIAS, 1, V(out), "%s.norm2.bias", p);
    add(b, SYNTH_WEIGHT, 4, V(out, out, 3, 3), "%s.conv2.weight", p);
    add(b, SYNTH_BIAS, 1, V(out), "%s.conv2.bias", p);
    if (in != out) {
        add(b, SYNTH_WEIGHT, 4, V(out, in, 1, 1), "%s.conv_shortcut.weight", p);
        add(b, SYNTH_BIAS, 1, V(out), "%s.conv_shortcut.bias", p);
    }
}

/* diffusers' Transformer2DModel with one BasicTransformerBlock (self-attention, cross-attention,
 * GEGLU feed-forward), linear projections in and out */
static void unet_attention(builder *b, const char *p, int64_t ch, int64_t cross)
{
    add(b, SYNTH_NORM, 1, V(ch), "%s.norm.weight", p);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.norm.bias", p);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.proj_in.weight", p);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.proj_in.bias", p);
    const char *tb = "transformer_blocks.0";
    add(b, SYNTH_NORM, 1, V(ch), "%s.%s.norm1.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.norm1.bias", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn1.to_q.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn1.to_k.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn1.to_v.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn1.to_out.0.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.attn1.to_out.0.bias", p, tb);
    add(b, SYNTH_NORM, 1, V(ch), "%s.%s.norm2.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.norm2.bias", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn2.to_q.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, cross), "%s.%s.attn2.to_k.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, cross), "%s.%s.attn2.to_v.weight", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.%s.attn2.to_out.0.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.attn2.to_out.0.bias", p, tb);
    add(b, SYNTH_NORM, 1, V(ch), "%s.%s.norm3.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.norm3.bias", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(8 * ch, ch), "%s.%s.ff.net.0.proj.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(8 * ch), "%s.%s.ff.net.0.proj.bias", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, 4 * ch), "%s.%s.ff.net.2.weight", p, tb);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.%s.ff.net.2.bias", p, tb);
    add(b, SYNTH_WEIGHT, 2, V(ch, ch), "%s.proj_out.weight", p);
    add(b, SYNTH_BIAS, 1, V(ch), "%s.proj_out.bias", p);
}

#define UNET_LEVELS 4
static const int unet_mult[UNET_LEVELS] = {1, 2, 4, 4};

/* diffusers' UNet2DConditionModel: CrossAttnDownBlock2D x3 + DownBlock2D, a cross-attention mid
 * block, UpBlock2D + CrossAttnUpBlock2D x3; the skip connections decide the up blocks' input
 * widths exactly as diffusers wires them. */
static void build_unet(builder *b)
{
    const synth_config *c = &b->m->cfg;
    int64_t c0 = c->dim, temb = 4 * c0, cross = b->m->cross_dim, lpb = c->layers;
    int64_t ch[UNET_LEVELS];
    char p[96];
    for (int i = 0; i < UNET_LEVELS; i++)
        ch[i] = c0 * unet_mult[i];

    add(b, SYNTH_WEIGHT, 4, V(c0, 4, 3, 3), "conv_in.weight");
    add(b, SYNTH_BIAS, 1, V(c0), "conv_in.bias");
    add(b, SYNTH_WEIGHT, 2, V(temb, c0), "time_embedding.linear_1.weight");
    add(b, SYNTH_BIAS, 1, V(temb), "time_embedding.linear_1.bias");
    add(b, SYNTH_WEIGHT, 2, V(temb, temb), "time_embedding.linear_2.weight");
    add(b, SYNTH_BIAS, 1, V(temb), "time_embedding.linear_2.bias");

    int64_t in = c0;
    for (int i = 0; i < UNET_LEVELS; i++) {
        int64_t out = ch[i];
        for (int64_t j = 0; j < lpb; j++) {
            snprintf(p, sizeof p, "down_blocks.%d.resnets.%lld", i, (long long)j);
            unet_resnet(b, p, j == 0 ? in : out, out, temb);
            if (i < UNET_LEVELS - 1) {
                snprintf(p, sizeof p, "down_blocks.%d.attentions.%lld", i, (long long)j);
                unet_attention(b, p, out, cross);
            }
        }
        if (i < UNET_LEVELS - 1) {
            add(b, SYNTH_WEIGHT, 4, V(out, out, 3, 3), "down_blocks.%d.downsamplers.0.conv.weight",
                i);
            add(b, SYNTH_BIAS, 1, V(out), "down_blocks.%d.downsamplers.0.conv.bias", i);
        }
        in = out;
    }

    int64_t top = ch[UNET_LEVELS - 1];
    unet_resnet(b, "mid_block.resnets.0", top, top, temb);
    unet_attention(b, "mid_block.attentions.0", top, cross);
    unet_resnet(b, "mid_block.resnets.1", top, top, temb);

    int64_t out = ch[UNET_LEVELS - 1];
    for (int i = 0; i < UNET_LEVELS; i++) {
        int64_t prev = out;
        out = ch[UNET_LEVELS - 1 - i];
        int64_t skip_in = ch[UNET_LEVELS - 1 - (i + 1 < UNET_LEVELS ? i + 1 : UNET_LEVELS - 1)];
        for (int64_t j = 0; j <= lpb; j++) {
            int64_t skip = j == lpb ? skip_in : out;
            int64_t rin = j == 0 ? prev : out;
            snprintf(p, sizeof p, "up_blocks.%d.resnets.%lld", i, (long long)j);
            unet_resnet(b, p, rin + skip, out, temb);
            if (i > 0) {
                snprintf(p, sizeof p, "up_blocks.%d.attentions.%lld", i, (long long)j);
                unet_attention(b, p, out, cross);
            }
        }
        if (i < UNET_LEVELS - 1) {
            add(b, SYNTH_WEIGHT, 4, V(out, out, 3, 3), "up_blocks.%d.upsamplers.0.conv.weight", i);
            add(b, SYNTH_BIAS, 1, V(out), "up_blocks.%d.upsamplers.0.conv.bias", i);
        }
    }

    add(b, SYNTH_NORM, 1, V(c0), "conv_norm_out.weight");
    add(b, SYNTH_BIAS, 1, V(c0), "conv_norm_out.bias");
    add(b, SYNTH_WEIGHT, 4, V(4, c0, 3, 3), "conv_out.weight");
    add(b, SYNTH_BIAS, 1, V(4), "conv_out.bias");
}

/* Total bytes of M's configuration, nothing recorded; UINT64_MAX when a size is impossible. */
static uint64_t count_bytes(synth_model *m)
{
    builder b = {m, 1, 0};
    m->total_bytes = 0;
    if (m->cfg.arch == SYNTH_UNET)
        build_unet(&b);
    else
        build_llama(&b);
    return b.failed ? UINT64_MAX : m->total_bytes;
}

static double rel_err(uint64_t got, uint64_t want)
{
    return fabs((double)got - (double)want) / (double)want;
}

/* ---- resolving dimensions -------------------------------------------------------------------- */

static uint32_t round_up(uint64_t x, uint32_t m) { return (uint32_t)((x + m - 1) / m * m); }

static uint32_t default_ff(uint32_t dim)
{
    /* llama's SwiGLU width: 8/3 of dim, rounded up (to 256 for big models, as llama does) */
    return round_up((uint64_t)dim * 8 / 3, dim >= 1024 ? 256 : 32);
}

static uint32_t default_heads(uint32_t dim)
{
    /* head width 128 for big models, 64 for most, 32 for the smallest (as released models do) */
    uint32_t hd = dim >= 4096 ? 128 : dim >= 256 ? 64 : 32;
    for (; hd >= 8; hd /= 2)
        if (dim % hd == 0)
            return dim / hd;
    return 1;
}

#define DEFAULT_TARGET (UINT64_C(256) << 20)
#define MAX_VOCAB 262144u
#define MAX_LAYERS 4096u

/* A vocabulary of at most V tokens: 32000 (llama's) when that fits, else a multiple of 64. */
static uint32_t fit_vocab(uint64_t v)
{
    return v >= 32000 ? 32000 : v < 256 ? 256 : (uint32_t)(v / 64 * 64);
}

static int fit_llama(synth_model *m, const synth_config *in, uint64_t target)
{
    synth_config *c = &m->cfg;
    int free_dim = !in->dim, free_layers = !in->layers, free_vocab = !in->vocab;
    /* with free heads the search sizes k/v at full width; heads are chosen afterwards */
    c->heads = in->heads ? in->heads : 1;
    c->kv_heads = in->kv_heads ? in->kv_heads : c->heads;
#define SET_DIMS(d)                                                                            \
    do {                                                                                       \
        c->dim = (d);                                                                          \
        c->ff = in->ff ? in->ff : default_ff(c->dim);                                          \
        if (!in->heads)                                                                        \
            c->heads = c->kv_heads = 1;                                                        \
    } while (0)

    if (target) {
        /* a vocabulary of 32000 unless that would be most of a small model */
        uint64_t unit = c->dtype == FERRY_DTYPE_F32 ? 4 : 2;
        uint64_t cap_elems = target / unit * 2 / 5; /* embedding + output: at most 40% */
        if (free_dim) {
            uint32_t d;
            for (d = 64; d < 16384; d += 64) {
                SET_DIMS(d);
                c->layers = free_layers ? (d / 128 > 2 ? d / 128 : 2) : in->layers;
                c->vocab = free_vocab ? fit_vocab(cap_elems / 2 / d) : in->vocab;
                if (count_bytes(m) >= target)
                    break;
            }
            SET_DIMS(d);
        } else {
            SET_DIMS(in->dim);
        }
        if (free_vocab)
            c->vocab = fit_vocab(cap_elems / 2 / c->dim);
        if (free_layers) {
            c->layers = 1;
            uint64_t t1 = count_bytes(m);
            c->layers = 2;
            uint64_t t2 = count_bytes(m);
            if (t1 == UINT64_MAX || t2 == UINT64_MAX)
                return -1;
            uint64_t per = t2 - t1, fixed = t1 - per;
            uint64_t l = target > fixed ? (target - fixed + per / 2) / per : 1;
            c->layers = (uint32_t)CLAMP(l, 1, MAX_LAYERS);
        }
        if (free_vocab) {
            uint64_t t = count_bytes(m);
            if (t != UINT64_MAX && rel_err(t, target) > 0.03) {
                /* fine-tune with the vocabulary: embedding and output grow by 2*dim per token */
                uint64_t v0 = c->vocab, v1 = v0 + 64;
                c->vocab = (uint32_t)v1;
                uint64_t t1 = count_bytes(m);
                double per_token = (double)(t1 - t) / 64.0;
                double v = (double)v0 + ((double)target - (double)t) / per_token;
                c->vocab = (uint32_t)CLAMP(v < 256 ? 256 : (uint64_t)v / 64 * 64, 256, MAX_VOCAB);
            }
        }
    } else {
        SET_DIMS(in->dim ? in->dim : 256);
        c->layers = in->layers ? in->layers : 4;
        c->vocab = in->vocab ? in->vocab : 32000;
    }
#undef SET_DIMS
    if (!in->heads) {
        c->heads = default_heads(c->dim);
        c->kv_heads = in->kv_heads ? in->kv_heads : c->heads;
    }
    return 0;
}

static int fit_unet(synth_model *m, const synth_config *in, uint64_t target)
{
    synth_config *c = &m->cfg;
    c->heads = in->heads ? in->heads : 8;
    c->kv_heads = c->heads;
    m->cross_dim = 768;
    if (!target || (in->dim && in->layers)) {
        c->dim = in->dim ? in->dim : 64;
        c->layers = in->layers ? in->layers : 2;
        return 0;
    }
    /* Fits base channels, resnets per level and the cross-attention width. The usual shape
     * (two resnets, 768-wide cross-attention as in SD 1.x) is kept when it comes within 5%;
     * otherwise the closest of all. */
    static const uint32_t lpbs[] = {2, 1, 3};
    static const uint32_t crosses[] = {768, 1024, 2048, 512, 256, 128, 64};
    uint32_t best_dim = 0, best_lpb = 0, best_cross = 0;
    double best = INFINITY;
    for (size_t k = 0; k < sizeof lpbs / sizeof lpbs[0]; k++) {
        if (in->layers && k > 0)
            break;
        for (size_t x = 0; x < sizeof crosses / sizeof crosses[0]; x++) {
            c->layers = in->layers ? in->layers : lpbs[k];
            m->cross_dim = crosses[x];
            for (uint32_t d = 8; d <= 4096; d += d < 256 ? 8 : 32) {
                if (in->dim && d != in->dim)
                    continue;
                c->dim = d;
                uint64_t t = count_bytes(m);
                if (t == UINT64_MAX)
                    continue;
                double e = rel_err(t, target);
                if (e < best) {
                    best = e;
                    best_dim = d;
                    best_lpb = c->layers;
                    best_cross = m->cross_dim;
                }
                if (t > target)
                    break;
            }
            if (k == 0 && x == 0 && best <= 0.05)
                goto done;
        }
    }
done:
    if (!best_dim)
        return -1;
    c->dim = best_dim;
    c->layers = best_lpb;
    m->cross_dim = best_cross;
    return 0;
}

int synth_plan(const synth_config *cfg, synth_model *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    synth_config *c = &m->cfg;
    if (c->format == FERRY_FORMAT_SAFETENSORS && is_quant(c->dtype)) {
        snprintf(err, errlen, "--dtype %s is a GGUF type: safetensors has no quantized types",
                 ferry_dtype_name(c->dtype));
        return CLI_EXIT_USAGE;
    }
    if (c->dtype != FERRY_DTYPE_F32 && c->dtype != FERRY_DTYPE_F16 &&
        c->dtype != FERRY_DTYPE_BF16 && !is_quant(c->dtype)) {
        snprintf(err, errlen, "--dtype %s: gen writes f32, f16, bf16, q8_0 or q4_0",
                 ferry_dtype_name(c->dtype));
        return CLI_EXIT_USAGE;
    }
    if (c->arch == SYNTH_UNET && (cfg->experts || cfg->experts_used)) {
        snprintf(err, errlen, "--experts and --experts-used are for --arch moe");
        return CLI_EXIT_USAGE;
    }
    if (c->experts && (!c->experts_used || c->experts_used > c->experts)) {
        snprintf(err, errlen, "--experts-used %u: between 1 and --experts %u", c->experts_used,
                 c->experts);
        return CLI_EXIT_USAGE;
    }
    if (c->arch == SYNTH_UNET && (cfg->ff || cfg->vocab || cfg->kv_heads)) {
        snprintf(err, errlen, "--ff, --vocab and --kv-heads are llama options, not unet ones");
        return CLI_EXIT_USAGE;
    }
    /* no size and no dimension: the default size; dimensions without a size: defaults for the
     * others */
    uint64_t target = cfg->target_bytes;
    if (!target && !cfg->layers && !cfg->dim && !cfg->ff && !cfg->vocab)
        target = DEFAULT_TARGET;
    int rc = c->arch == SYNTH_UNET ? fit_unet(m, cfg, target) : fit_llama(m, cfg, target);
    if (rc != 0) {
        snprintf(err, errlen, "cannot size a %s model to %llu bytes", synth_arch_name(c->arch),
                 (unsigned long long)target);
        return CLI_EXIT_USAGE;
    }
    if (c->arch == SYNTH_LLAMA) {
        if (c->heads == 0 || c->dim % c->heads != 0) {
            snprintf(err, errlen, "--heads %u does not divide --dim %u", c->heads, c->dim);
            return CLI_EXIT_USAGE;
        }
        if (c->kv_heads == 0 || c->heads % c->kv_heads != 0) {
            snprintf(err, errlen, "--kv-heads %u does not divide --heads %u", c->kv_heads,
                     c->heads);
            return CLI_EXIT_USAGE;
        }
    }
    builder b = {m, 0, 0};
    m->total_bytes = 0;
    if (c->arch == SYNTH_UNET)
        build_unet(&b);
    else
        build_llama(&b);
    if (b.failed) {
        snprintf(err, errlen, "cannot lay out the model (out of memory or a size past 64 bits)");
        return CLI_EXIT_FAIL;
    }
    return 0;
}

/* ---- values ---------------------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15)); /* SM_GAMMA */
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9); /* SM_MUL1 */
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB); /* SM_MUL2 */
    return z ^ (z >> 31);
}

/* Unit-variance, roughly normal values: each the centred sum of twelve uniform 16-bit draws (the
 * classic approximation, tails to 6 sigma), computed in integers so that the table is the same
 * on every machine. Random 16-bit indexes into it are four times cheaper than summing draws
 * per value. */
#define NORMAL_TABLE 65536

float *synth_normal_table(void)
{
    float *tab = malloc(NORMAL_TABLE * sizeof *tab);
    if (!tab)
        return NULL;
    uint64_t s = UINT64_C(0x243F6A8885A308D3);
    for (size_t i = 0; i < NORMAL_TABLE; i++) {
        int64_t sum = 0;
        for (int k = 0; k < 3; k++) {
            uint64_t r = splitmix64(&s);
            sum += (int64_t)(r & 0xffff) + (int64_t)((r >> 16) & 0xffff) +
                   (int64_t)((r >> 32) & 0xffff) + (int64_t)(r >> 48);
        }
        /* twelve draws: mean 12 * 32767.5, standard deviation ~65536 */
        tab[i] = (float)(sum - 393210) * (1.0f / 65536.0f);
    }
    return tab;
}

#define SM_GAMMA UINT64_C(0x9E3779B97F4A7C15)
#define SM_MUL1 UINT64_C(0xBF58476D1CE4E5B9)
#define SM_MUL2 UINT64_C(0x94D049BB133111EB)

/* Set by tests only: 1 keeps synth_fill_values on its portable loop. */
int synth_force_portable;

#ifdef SYNTH_X86
/* X * C mod 2^64 in each 64-bit lane (AVX2 has no 64-bit multiply):
 * lo*lo + (hi*lo + lo*hi) << 32. */
__attribute__((target("avx2"))) static inline __m256i mul64(__m256i x, uint64_t c)
{
    const __m256i clo = _mm256_set1_epi64x((long long)(c & 0xffffffffu));
    const __m256i chi = _mm256_set1_epi64x((long long)(c >> 32));
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(x, 32), clo),
                                     _mm256_mul_epu32(x, chi));
    return _mm256_add_epi64(_mm256_mul_epu32(x, clo), _mm256_slli_epi64(cross, 32));
}

/* The portable loop of synth_fill_values, 16 values at a time: the same four splitmix64 draws
 * (draw k of the stream mixes *S + (k+1) * gamma), the same 16-bit table indexes in the same
 * order, the same float multiply and add, so the same bits. Returns how many values were done;
 * *S is advanced past the draws used. */
__attribute__((target("avx2"))) static uint64_t fill_avx2(const float *tab, uint64_t *s, float k,
                                                          float base, float *out, uint64_t n)
{
    const __m256i step = _mm256_set1_epi64x((long long)(4 * SM_GAMMA));
    const __m256 kv = _mm256_set1_ps(k), bv = _mm256_set1_ps(base);
    __m256i z0 = _mm256_add_epi64(_mm256_set1_epi64x((long long)*s),
                                  _mm256_setr_epi64x((long long)SM_GAMMA, (long long)(2 * SM_GAMMA),
                                                     (long long)(3 * SM_GAMMA),
                                                     (long long)(4 * SM_GAMMA)));
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i z = z0;
        z0 = _mm256_add_epi64(z0, step);
        z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), SM_MUL1);
        z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), SM_MUL2);
        z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
        /* the sixteen 16-bit pieces in memory order are the indexes of out[i .. i+16) */
        __m256i i0 = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(z));
        __m256i i1 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(z, 1));
        __m256 v0 = _mm256_i32gather_ps(tab, i0, 4), v1 = _mm256_i32gather_ps(tab, i1, 4);
        _mm256_storeu_ps(out + i, _mm256_add_ps(bv, _mm256_mul_ps(kv, v0)));
        _mm256_storeu_ps(out + i + 8, _mm256_add_ps(bv, _mm256_mul_ps(kv, v1)));
    }
    *s += i / 4 * SM_GAMMA;
    return i;
}

static int synth_use_avx2(void)
{
    return !synth_force_portable && __builtin_cpu_supports("avx2");
}
#endif

/* Fills OUT[0..n) with values of tensor T, chunk CHUNK_NO, under SEED: table values scaled to
 * T's spread (around 1.0 for norms, 0 otherwise). */
void synth_fill_values(const synth_tensor *t, const float *tab, uint64_t seed,
                       uint64_t tensor_no, uint64_t chunk_no, float *out, uint64_t n)
{
    uint64_t s = seed ^ UINT64_C(0x6A09E667F3BCC909);
    uint64_t a = tensor_no + 1, bb = chunk_no + 1;
    s ^= splitmix64(&a) * 3;
    s ^= splitmix64(&bb) * 5;
    (void)splitmix64(&s);
    const float k = t->scale;
    const float base = t->kind == SYNTH_NORM ? 1.0f : 0.0f;
    uint64_t i = 0;
#ifdef SYNTH_X86
    if (synth_use_avx2())
        i = fill_avx2(tab, &s, k, base, out, n);
#endif
    for (; i + 4 <= n; i += 4) {
        uint64_t r = splitmix64(&s);
        out[i] = base + k * tab[r & 0xffff];
        out[i + 1] = base + k * tab[(r >> 16) & 0xffff];
        out[i + 2] = base + k * tab[(r >> 32) & 0xffff];
        out[i + 3] = base + k * tab[r >> 48];
    }
    uint64_t r = splitmix64(&s);
    for (; i < n; i++, r >>= 16)
        out[i] = base + k * tab[r & 0xffff];
}

/* ---- writing ----------------------------------------------------------------------------------- */

typedef struct job {
    uint32_t tensor;
    uint64_t start, count; /* elements */
} job;

enum { SLOT_FREE, SLOT_FILLING, SLOT_FILLED };

typedef struct slot {
    unsigned char *buf;
    size_t len;
    size_t job;
    int state;
    int rc;
} slot;

/* Shared between the writing thread and the workers; every field below mu is guarded by it. */
typedef struct gen_ctx {
    const synth_model *m;
    const float *normal; /* NORMAL_TABLE values, read-only while workers run */
    const job *jobs;
    size_t n_jobs;
    pthread_mutex_t mu;
    pthread_cond_t filled, freed;
    size_t next_job;
    int stop;
    slot slots[NSLOTS];
} gen_ctx;

typedef struct worker {
    gen_ctx *g;
    float *tmp; /* CHUNK floats, this worker's own */
    pthread_t th;
} worker;

static int fill_job(const gen_ctx *g, const job *jb, float *tmp, unsigned char *out, size_t *len)
{
    const synth_tensor *t = &g->m->t[jb->tensor];
    uint64_t nbytes;
    int rc = ferry_dtype_nbytes(t->dtype, jb->count, &nbytes);
    if (rc != 0)
        return rc;
    if (t->dtype == FERRY_DTYPE_F32) {
        synth_fill_values(t, g->normal, g->m->cfg.seed, jb->tensor, jb->start / CHUNK,
                    (float *)(void *)out, jb->count);
    } else {
        synth_fill_values(t, g->normal, g->m->cfg.seed, jb->tensor, jb->start / CHUNK, tmp,
                    jb->count);
        rc = ferry_dtype_convert(FERRY_DTYPE_F32, tmp, t->dtype, out, jb->count);
        if (rc != 0)
            return rc;
    }
    *len = (size_t)nbytes;
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    gen_ctx *g = w->g;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->stop || g->next_job >= g->n_jobs)
            break;
        size_t j = g->next_job;
        slot *s = &g->slots[j % NSLOTS];
        if (s->state != SLOT_FREE) {
            pthread_cond_wait(&g->freed, &g->mu);
            continue;
        }
        g->next_job++;
        s->state = SLOT_FILLING;
        s->job = j;
        unsigned char *buf = s->buf;
        pthread_mutex_unlock(&g->mu);

        size_t len = 0;
        int rc = fill_job(g, &g->jobs[j], w->tmp, buf, &len);

        pthread_mutex_lock(&g->mu);
        s->len = len;
        s->rc = rc;
        s->state = SLOT_FILLED;
        pthread_cond_broadcast(&g->filled);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

static int n_workers(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > MAX_WORKERS ? MAX_WORKERS : (int)n;
}

static int make_jobs(const synth_model *m, job **out, size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++)
        n += (size_t)((m->t[i].n_elems + CHUNK - 1) / CHUNK);
    job *jobs = malloc((n ? n : 1) * sizeof *jobs);
    if (!jobs)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++)
        for (uint64_t s = 0; s < m->t[i].n_elems; s += CHUNK) {
            jobs[k].tensor = (uint32_t)i;
            jobs[k].start = s;
            jobs[k].count = m->t[i].n_elems - s < CHUNK ? m->t[i].n_elems - s : CHUNK;
            k++;
        }
    *out = jobs;
    *n_out = n;
    return 0;
}

static int set_meta_u64(ferry_writer *w, int gguf, const char *key, ferry_value_type type,
                        uint64_t v)
{
    if (!gguf) {
        char buf[32];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
        return ferry_writer_set_meta_str(w, key, buf);
    }
    ferry_value val;
    memset(&val, 0, sizeof val);
    val.type = type;
    val.v.u = v;
    return ferry_writer_set_meta(w, key, &val);
}

static int set_meta_f32(ferry_writer *w, int gguf, const char *key, double v)
{
    if (!gguf) {
        char buf[32];
        snprintf(buf, sizeof buf, "%g", v);
        return ferry_writer_set_meta_str(w, key, buf);
    }
    ferry_value val;
    memset(&val, 0, sizeof val);
    val.type = FERRY_VALUE_F32;
    val.v.f = v;
    return ferry_writer_set_meta(w, key, &val);
}

static int set_meta_u32_array(ferry_writer *w, int gguf, const char *key, const uint32_t *v,
                              size_t n)
{
    if (!gguf) {
        char buf[256];
        size_t k = 0;
        k += (size_t)snprintf(buf + k, sizeof buf - k, "[");
        for (size_t i = 0; i < n && k < sizeof buf; i++)
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%u", i ? ", " : "", v[i]);
        if (k < sizeof buf)
            snprintf(buf + k, sizeof buf - k, "]");
        return ferry_writer_set_meta_str(w, key, buf);
    }
    ferry_value items[16], val;
    memset(items, 0, sizeof items);
    memset(&val, 0, sizeof val);
    for (size_t i = 0; i < n && i < 16; i++) {
        items[i].type = FERRY_VALUE_U32;
        items[i].v.u = v[i];
    }
    val.type = FERRY_VALUE_ARRAY;
    val.v.arr.elem = FERRY_VALUE_U32;
    val.v.arr.n = n < 16 ? n : 16;
    val.v.arr.items = items;
    return ferry_writer_set_meta(w, key, &val);
}

static int write_meta(ferry_writer *w, const synth_model *m)
{
    const synth_config *c = &m->cfg;
    int g = c->format == FERRY_FORMAT_GGUF, rc = 0;
    char name[128];
    const ferry_value_type U32 = FERRY_VALUE_U32;
    if (!g)
        rc = rc ? rc : ferry_writer_set_meta_str(w, "format", "pt");
    rc = rc ? rc : ferry_writer_set_meta_str(w, "general.architecture", synth_arch_name(c->arch));
    if (c->arch == SYNTH_LLAMA) {
        snprintf(name, sizeof name, "ferry synthetic llama %uL-%ud-%s", c->layers, c->dim,
                 ferry_dtype_name(c->dtype));
        rc = rc ? rc : ferry_writer_set_meta_str(w, "general.name", name);
        rc = rc ? rc : set_meta_u64(w, g, "llama.block_count", U32, c->layers);
        rc = rc ? rc : set_meta_u64(w, g, "llama.context_length", U32, 4096);
        rc = rc ? rc : set_meta_u64(w, g, "llama.embedding_length", U32, c->dim);
        rc = rc ? rc : set_meta_u64(w, g, "llama.feed_forward_length", U32, c->ff);
        rc = rc ? rc : set_meta_u64(w, g, "llama.attention.head_count", U32, c->heads);
        rc = rc ? rc : set_meta_u64(w, g, "llama.attention.head_count_kv", U32, c->kv_heads);
        rc = rc ? rc : set_meta_u64(w, g, "llama.rope.dimension_count", U32, c->dim / c->heads);
        rc = rc ? rc : set_meta_f32(w, g, "llama.attention.layer_norm_rms_epsilon", 1e-5);
        rc = rc ? rc : set_meta_f32(w, g, "llama.rope.freq_base", 10000.0);
        rc = rc ? rc : set_meta_u64(w, g, "llama.vocab_size", U32, c->vocab);
        if (c->experts) {
            rc = rc ? rc : set_meta_u64(w, g, "llama.expert_count", U32, c->experts);
            rc = rc ? rc : set_meta_u64(w, g, "llama.expert_used_count", U32, c->experts_used);
        }
        /* no vocabulary: llama.cpp then makes vocab_size placeholder tokens, and runs the file */
        if (g)
            rc = rc ? rc : ferry_writer_set_meta_str(w, "tokenizer.ggml.model", "none");
    } else {
        uint32_t chans[UNET_LEVELS];
        for (int i = 0; i < UNET_LEVELS; i++)
            chans[i] = c->dim * (uint32_t)unet_mult[i];
        uint32_t groups = 32;
        while (c->dim % groups)
            groups /= 2;
        snprintf(name, sizeof name, "ferry synthetic unet %uch-%ul-%s", c->dim, c->layers,
                 ferry_dtype_name(c->dtype));
        rc = rc ? rc : ferry_writer_set_meta_str(w, "general.name", name);
        rc = rc ? rc : set_meta_u32_array(w, g, "unet.block_out_channels", chans, UNET_LEVELS);
        rc = rc ? rc : set_meta_u64(w, g, "unet.layers_per_block", U32, c->layers);
        rc = rc ? rc : set_meta_u64(w, g, "unet.cross_attention_dim", U32, m->cross_dim);
        rc = rc ? rc : set_meta_u64(w, g, "unet.attention_head_count", U32, c->heads);
        rc = rc ? rc : set_meta_u64(w, g, "unet.in_channels", U32, 4);
        rc = rc ? rc : set_meta_u64(w, g, "unet.out_channels", U32, 4);
        rc = rc ? rc : set_meta_u64(w, g, "unet.norm_num_groups", U32, groups);
    }
    if (g && is_quant(c->dtype))
        rc = rc ? rc : set_meta_u64(w, g, "general.quantization_version", U32, 2);
    rc = rc ? rc : set_meta_u64(w, g, "ferry.seed", FERRY_VALUE_U64, c->seed);
    snprintf(name, sizeof name, "ferry %s", ferry_version());
    rc = rc ? rc : ferry_writer_set_meta_str(w, "ferry.generator", name);
    return rc;
}

/* Runs the workers and writes every slot in job order. */
static int stream(ferry_writer *w, const synth_model *m, const job *jobs, size_t n_jobs,
                  int progress, int *writer_failed)
{
    gen_ctx g;
    worker ws[MAX_WORKERS];
    int nw = n_workers(), started = 0, rc = 0;
    memset(&g, 0, sizeof g);
    memset(ws, 0, sizeof ws);
    g.m = m;
    g.jobs = jobs;
    g.n_jobs = n_jobs;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.filled, NULL);
    pthread_cond_init(&g.freed, NULL);

    float *normal = synth_normal_table();
    g.normal = normal;
    if (!normal)
        rc = FERRY_ENOMEM;
    /* a chunk of f32 is the largest output of any type gen writes */
    for (int i = 0; i < NSLOTS && rc == 0; i++)
        if (!(g.slots[i].buf = malloc(CHUNK * sizeof(float))))
            rc = FERRY_ENOMEM;
    for (int i = 0; i < nw && rc == 0; i++) {
        ws[i].g = &g;
        if (!(ws[i].tmp = malloc(CHUNK * sizeof(float))))
            rc = FERRY_ENOMEM;
        else if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
            rc = FERRY_ENOMEM;
        else
            started++;
    }

    cli_progress bar;
    cli_progress_start(&bar, "writing", m->total_bytes, progress);
    uint64_t done = 0;
    for (size_t j = 0; j < n_jobs && rc == 0 && started > 0; j++) {
        slot *s = &g.slots[j % NSLOTS];
        pthread_mutex_lock(&g.mu);
        while (!(s->state == SLOT_FILLED && s->job == j))
            pthread_cond_wait(&g.filled, &g.mu);
        int fill_rc = s->rc;
        size_t len = s->len;
        pthread_mutex_unlock(&g.mu);
        if (fill_rc != 0) {
            rc = fill_rc;
            break;
        }
        int e = ferry_writer_write(w, s->buf, len);
        if (e != 0) {
            *writer_failed = 1;
            rc = e;
            break;
        }
        done += len;
        cli_progress_update(&bar, done);
        pthread_mutex_lock(&g.mu);
        s->state = SLOT_FREE;
        pthread_cond_broadcast(&g.freed);
        pthread_mutex_unlock(&g.mu);
    }
    cli_progress_end(&bar);

    pthread_mutex_lock(&g.mu);
    g.stop = 1;
    pthread_cond_broadcast(&g.freed);
    pthread_mutex_unlock(&g.mu);
    for (int i = 0; i < nw; i++) {
        if (i < started)
            pthread_join(ws[i].th, NULL);
        free(ws[i].tmp);
    }
    for (int i = 0; i < NSLOTS; i++)
        free(g.slots[i].buf);
    free(normal);
    pthread_cond_destroy(&g.filled);
    pthread_cond_destroy(&g.freed);
    pthread_mutex_destroy(&g.mu);
    if (rc == 0 && started == 0 && n_jobs > 0)
        rc = FERRY_ENOMEM;
    return rc;
}

int synth_write(const synth_model *m, const char *path, int progress)
{
    ferry_writer *w = ferry_writer_create(m->cfg.format);
    if (!w)
        return cli_error("out of memory");
    int rc = write_meta(w, m);
    for (size_t i = 0; i < m->n && rc == 0; i++)
        rc = ferry_writer_add_tensor(w, m->t[i].name, m->t[i].dtype, m->t[i].ndim,
                                     m->t[i].shape);
    if (rc == 0)
        rc = ferry_writer_begin(w, path);
    if (rc != 0) {
        int r = cli_fail(path, ferry_writer_errmsg(w), rc);
        ferry_writer_destroy(w);
        return r;
    }
    job *jobs = NULL;
    size_t n_jobs = 0;
    if (make_jobs(m, &jobs, &n_jobs) != 0) {
        ferry_writer_destroy(w);
        return cli_error("out of memory");
    }
    int writer_failed = 0;
    rc = stream(w, m, jobs, n_jobs, progress, &writer_failed);
    free(jobs);
    if (rc == 0) {
        rc = ferry_writer_finish(w);
        writer_failed = 1;
    }
    if (rc != 0) {
        int r = writer_failed ? cli_fail(path, ferry_writer_errmsg(w), rc)
                              : cli_fail(path, "", rc);
        ferry_writer_destroy(w); /* removes the unfinished temporary file */
        return r;
    }
    ferry_writer_destroy(w);
    return 0;
}
