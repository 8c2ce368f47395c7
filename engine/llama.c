/*
 * llama.c — the llama decoder of llama.h, one function per step of the forward pass.
 *
 * Weights are matrices of rows x cols in their stored type (GGUF's ne[1] x ne[0]: each row is one
 * output feature, contiguous); the shape comments below are (rows, cols). Activations are f32.
 * Every matrix-vector product is ferry_matvec_q (ferry_matvec_q_n for a batch's vectors) over
 * chunks of rows the threads share, its input prepared once the way llama.cpp's CPU back end
 * takes it (q8_0 / q8_K blocks for quantized weights, f16 / bf16 precision for f16 / bf16
 * ones); in runtime LoRA mode each adapter term scale * B.(A.x) is added to the product here,
 * in f32.
 *
 * A mixture-of-experts layer keeps its experts in 3-D tensors (n_expert, rows, cols), expert e
 * the e-th block of rows, and each expert is a slice of its own (ferry_slice): the experts a
 * batch routes to are brought in by prepare_experts and let go by release_experts, and with
 * look-ahead the ones predicted for the next layer are guessed (ferry_prefetch_guess) while this
 * layer computes. Where a tensor cannot be
 * sliced (an adapter merged into it), the whole tensor is used.
 */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "llama.h"
#include "pool.h"

/* The tensors of one transformer block, in the order the forward pass uses them. */
typedef struct layer_weights {
    ferry_tensor *attn_norm; /* (dim) */
    ferry_tensor *wq;        /* (q_dim, dim)   q_dim = n_head * head_dim */
    ferry_tensor *wk;        /* (kv_dim, dim)  kv_dim = n_head_kv * head_dim */
    ferry_tensor *wv;        /* (kv_dim, dim) */
    ferry_tensor *wo;        /* (dim, q_dim) */
    ferry_tensor *q_norm;    /* (head_dim) qwen3moe: each head of Q's RMSNorm weight */
    ferry_tensor *k_norm;    /* (head_dim) and K's */
    ferry_tensor *ffn_norm;  /* (dim) */
    ferry_tensor *w_gate;    /* (ff, dim) */
    ferry_tensor *w_up;      /* (ff, dim) */
    ferry_tensor *w_down;    /* (dim, ff) */
    /* a mixture of experts instead of w_gate / w_up / w_down */
    ferry_tensor *router;    /* (n_expert, dim)      ffn_gate_inp */
    ferry_tensor *gate_exps; /* (n_expert, ff, dim)  ffn_gate_exps */
    ferry_tensor *up_exps;   /* (n_expert, ff, dim)  ffn_up_exps */
    ferry_tensor *down_exps; /* (n_expert, dim, ff)  ffn_down_exps */
    ferry_tensor **exp;      /* (EXP_KINDS, n_expert) expert e of each as a slice (rows, cols);
                                NULL: the whole tensors */
} layer_weights;
/* the most tensors step_list gives: a mixture-of-experts layer's own (without its experts)
 * and the router and ffn_norm of each layer look-ahead predicts, which predict_experts reads */
#define LAYER_TENSORS (10 + 2 * LLAMA_LOOKAHEAD_MAX)

/* The three tensors of each expert: W_gate, W_up, W_down. */
enum { EXP_GATE, EXP_UP, EXP_DOWN, EXP_KINDS };

struct llama {
    ferry *f;
    llama_config c;
    uint32_t n_ctx;
    pool *pool;
    int lora_runtime;          /* apply adapter factors here (ferry merges them otherwise) */
    int lookahead;             /* prefetch the next layer's predicted experts (a guess) */
    float lookahead_min;       /* ... those of router probability at least this */
    uint32_t lookahead_depth;  /* ... of the next this many layers (predicted for all of them) */
    int f16_arith;             /* F16_ARITH_*: how attention's f16 steps round (f16.h) */

    /* weights */
    ferry_tensor *token_embd;  /* (vocab, dim), lazy: only the rows of tokens seen are read */
    ferry_dtype embd_dtype;    /* its type in the file (lazy tensors are never converted) */
    uint64_t embd_row_bytes;
    layer_weights *layers;     /* (n_layer) */
    ferry_tensor *output_norm; /* (dim) */
    ferry_tensor *output;      /* (vocab, dim); token_embd when the file has no output.weight */

    /* state of the current position */
    float *x;                  /* (dim) the residual stream */
    float *xb;                 /* (dim) normed input of a sub-layer */
    float *q;                  /* (q_dim) */
    float *att_out;            /* (q_dim) attention output, heads concatenated */
    float *proj;               /* (dim) output of wo / w_down before the residual */
    float *hb, *hb2;           /* (ff) gate and up */
    float *logits;             /* (vocab) */
    void *embd_row;            /* (embd_row_bytes) one row of token_embd as stored */
    void *xq[3];               /* (xq_cap, xq_stride) the inputs of a job's products, prepared */
    uint64_t vec_bytes;
    uint64_t xq_stride;        /* vec_bytes rounded up to 64 */
    uint32_t xq_cap;           /* vectors each xq[k] holds */
    float *lora_tmp;           /* (max_rank) A.x of a runtime adapter */
    float *xs;                 /* (batch_cap, dim) the residual streams of a batch */
    uint32_t batch_cap;
    /* (batch_cap rows each) a batch's vectors between products: bx, by of the widest of dim,
     * q_dim and ff; bh, bh2 of ff; bproj of n_expert_used * dim (each token's experts' outputs) */
    float *bx, *by, *bh, *bh2, *bproj;
    float *bk, *bv;            /* (batch_cap, kv_dim) a batch's keys and values */
    uint32_t *bslot;           /* (batch_cap * n_expert_used) the slots one expert computes */
    uint32_t max_rank;
    float *k, *v;              /* (kv_dim) this position's key and value */
    /* mixture of experts */
    float *router_logits;      /* (n_expert) */
    uint32_t *sel;             /* (batch_cap, n_expert_used) each token's experts, best first */
    float *sel_w;              /* (batch_cap, n_expert_used) their renormalised weights */
    uint32_t *pred;            /* (batch_cap, n_layer, LLAMA_LOOKAHEAD_MAX, n_expert_used) the
                                  experts predicted for a layer D + 1 layers before it, ascending */
    float *pred_p;             /* the same shape: their router probabilities */
    uint32_t *routes;          /* (batch_cap, n_layer, n_expert_used) ascending, for the caller */
    uint32_t routes_n;         /* tokens of the last batch in routes */
    uint64_t pred_hits[LLAMA_LOOKAHEAD_MAX], pred_total[LLAMA_LOOKAHEAD_MAX]; /* by depth */
    ferry_tensor *held[EXP_KINDS * LLAMA_MAX_EXPERTS]; /* what prepare_experts holds */
    size_t n_held;
    /* the KV cache, positions 0..n_ctx of each layer, in f16 as llama.cpp keeps it */
    uint16_t *key_cache;       /* (n_layer, n_ctx, kv_dim) */
    uint16_t *value_cache;     /* (n_layer, n_ctx, kv_dim) */
};

static void say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- configuration ------------------------------------------------------------------------ */

static int meta_u32(const ferry_catalog *cat, const char *key, uint32_t def, int required,
                    uint32_t *out, char *err, size_t errlen)
{
    uint64_t v;
    int rc = ferry_catalog_get_u64(cat, key, &v);
    if (rc == FERRY_ENOENT && !required) {
        *out = def;
        return 0;
    }
    if (rc) {
        say(err, errlen, "metadata %s: %s", key, rc == FERRY_ENOENT ? "missing" : "not an integer");
        return rc == FERRY_ENOENT ? FERRY_ENOENT : FERRY_EFORMAT;
    }
    if (v == 0 || v > (UINT64_C(1) << 24)) {
        say(err, errlen, "metadata %s: %llu is out of range", key, (unsigned long long)v);
        return FERRY_EFORMAT;
    }
    *out = (uint32_t)v;
    return 0;
}

int llama_read_config(ferry *f, llama_config *c, char *err, size_t errlen)
{
    const ferry_catalog *cat = ferry_catalog_of(f);
    memset(c, 0, sizeof *c);
    const char *arch = NULL;
    if (ferry_catalog_get_str(cat, "general.architecture", &arch) ||
        (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen3moe") != 0)) {
        say(err, errlen, "general.architecture is %s%s%s, not llama or qwen3moe",
            arch ? "'" : "", arch ? arch : "missing", arch ? "'" : "");
        return FERRY_EUNSUPPORTED;
    }
    c->arch = strcmp(arch, "llama") == 0 ? LLAMA_ARCH_LLAMA : LLAMA_ARCH_QWEN3MOE;
    c->qk_norm = c->rope_neox = c->arch == LLAMA_ARCH_QWEN3MOE;
    char k[96]; /* ARCH.key */
#define KEY(name) (snprintf(k, sizeof k, "%s.%s", arch, name), k)
    int rc = 0;
    rc = rc ? rc : meta_u32(cat, KEY("block_count"), 0, 1, &c->n_layer, err, errlen);
    rc = rc ? rc : meta_u32(cat, KEY("embedding_length"), 0, 1, &c->dim, err, errlen);
    rc = rc ? rc : meta_u32(cat, KEY("feed_forward_length"), 0, 1, &c->ff, err, errlen);
    rc = rc ? rc : meta_u32(cat, KEY("attention.head_count"), 0, 1, &c->n_head, err, errlen);
    if (rc)
        return rc;
    rc = meta_u32(cat, KEY("attention.head_count_kv"), c->n_head, 0, &c->n_head_kv, err, errlen);
    rc = rc ? rc
            : meta_u32(cat, KEY("attention.key_length"), c->dim / c->n_head, 0, &c->head_dim,
                       err, errlen);
    if (rc)
        return rc;
    if (c->head_dim == 0 || c->n_head % c->n_head_kv != 0 || c->head_dim % 2 != 0) {
        say(err, errlen, "attention: %u heads, %u kv heads, head size %u do not fit together",
            c->n_head, c->n_head_kv, c->head_dim);
        return FERRY_EFORMAT;
    }
    rc = meta_u32(cat, KEY("rope.dimension_count"), c->head_dim, 0, &c->rope_dim, err, errlen);
    if (rc)
        return rc;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2 != 0) {
        say(err, errlen, "%s.rope.dimension_count %u does not fit head size %u", arch, c->rope_dim,
            c->head_dim);
        return FERRY_EFORMAT;
    }
    double base = 10000.0, eps = 1e-5;
    if (ferry_catalog_get_f64(cat, KEY("rope.freq_base"), &base) == FERRY_ETYPE ||
        ferry_catalog_get_f64(cat, KEY("attention.layer_norm_rms_epsilon"), &eps) ==
            FERRY_ETYPE) {
        say(err, errlen, "%s.rope.freq_base or layer_norm_rms_epsilon is not a number", arch);
        return FERRY_EFORMAT;
    }
    if (!(base > 0) || !(eps >= 0) || !(eps < 1)) {
        say(err, errlen, "rope base %g or rms epsilon %g out of range", base, eps);
        return FERRY_EFORMAT;
    }
    c->rope_base = (float)base;
    c->eps = (float)eps;
    uint64_t ctx = 0;
    if (ferry_catalog_get_u64(cat, KEY("context_length"), &ctx) == 0 && ctx <= UINT32_MAX)
        c->ctx_train = (uint32_t)ctx;
    c->q_dim = c->n_head * c->head_dim;
    c->kv_dim = c->n_head_kv * c->head_dim;
    int64_t e = ferry_catalog_find(cat, "token_embd.weight");
    ferry_tensor_info ti;
    if (e < 0 || ferry_catalog_tensor(cat, (size_t)e, &ti) || ti.ndim != 2) {
        say(err, errlen, "token_embd.weight: %s", e < 0 ? "missing" : "not a matrix");
        return e < 0 ? FERRY_ENOENT : FERRY_ESHAPE;
    }
    if (ti.shape[1] <= 0 || ti.shape[1] > (INT64_C(1) << 24)) {
        say(err, errlen, "token_embd.weight: %lld rows is out of range", (long long)ti.shape[1]);
        return FERRY_ESHAPE;
    }
    c->vocab = (uint32_t)ti.shape[1];
    c->tied_output = ferry_catalog_find(cat, "output.weight") < 0;
    rc = meta_u32(cat, KEY("expert_count"), 0, c->arch == LLAMA_ARCH_QWEN3MOE, &c->n_expert, err,
                  errlen);
    if (rc)
        return rc;
    if (c->n_expert) {
        rc = meta_u32(cat, KEY("expert_used_count"), 0, 1, &c->n_expert_used, err, errlen);
        if (rc)
            return rc;
        if (c->n_expert > LLAMA_MAX_EXPERTS || c->n_expert_used > c->n_expert) {
            say(err, errlen, "%s.expert_count %u, expert_used_count %u: at most %u experts, "
                "and no more used than there are", arch, c->n_expert, c->n_expert_used,
                LLAMA_MAX_EXPERTS);
            return FERRY_EFORMAT;
        }
    }
    if (c->arch == LLAMA_ARCH_QWEN3MOE) /* the experts' width; the dense one is unused */
        rc = meta_u32(cat, KEY("expert_feed_forward_length"), c->ff / c->n_expert_used, 0, &c->ff,
                      err, errlen);
#undef KEY
    return rc;
}

uint64_t llama_memory_bytes(const llama_config *c, uint32_t n_ctx, uint32_t n_batch,
                            int n_threads)
{
    (void)n_threads; /* the kernels use only their stack */
    uint64_t kv = 2ull * c->n_layer * n_ctx * c->kv_dim * sizeof(uint16_t);
    uint64_t act = (3ull * c->dim + 2ull * c->q_dim + 2ull * c->kv_dim + 2ull * c->ff +
                    c->vocab) * sizeof(float);
    uint64_t row = (uint64_t)c->dim * 8 + 256; /* one embedding row in any stored type */
    uint32_t widest = c->dim > c->ff ? c->dim : c->ff;
    widest = widest > c->q_dim ? widest : c->q_dim;
    uint64_t vec = 3ull * widest * sizeof(float); /* the prepared inputs of one job */
    /* router logits, the experts' sum, one token's selection, prediction and routes */
    uint64_t moe = c->n_expert ? (uint64_t)c->n_expert * sizeof(float) +
                                     (uint64_t)c->dim * sizeof(float) +
                                     (3ull + c->n_layer) * c->n_expert_used * sizeof(uint32_t)
                               : 0;
    /* each token of a batch (batch_reserve): its residual stream, bx, by, bh, bh2, bk, bv, its
     * prepared inputs, and for experts its selection, weights, prediction, routes and outputs */
    uint64_t per = (c->dim + 2ull * widest + 2ull * c->ff + 2ull * c->kv_dim) * sizeof(float) +
                   3 * ((vec / 3 + 63) / 64 * 64);
    if (c->n_expert)
        per += (uint64_t)c->n_expert_used *
               ((5ull + c->n_layer) * sizeof(uint32_t) + (uint64_t)c->dim * sizeof(float));
    return kv + act + row + vec + moe + (n_batch ? n_batch : 1) * per;
}

/* ---- the weights ---------------------------------------------------------------------------- */

/* Finds NAME and states its shape (GGUF order: cols first; rows 0: a vector, experts 0: a
 * matrix, else EXPERTS matrices of rows x cols); any dtype. */
static ferry_tensor *want_experts(ferry *f, const char *name, uint64_t cols, uint64_t rows,
                                  uint64_t experts, char *err, size_t errlen)
{
    ferry_tensor *t = ferry_find(f, name);
    if (!t) {
        say(err, errlen, "tensor %s: missing", name);
        return NULL;
    }
    int64_t shape[3] = {(int64_t)cols, (int64_t)rows, (int64_t)experts};
    if (ferry_expect(f, name, FERRY_DTYPE_NONE, experts ? 3 : rows ? 2 : 1, shape)) {
        say(err, errlen, "%s", ferry_errmsg(f));
        return NULL;
    }
    return t;
}

static ferry_tensor *want(ferry *f, const char *name, uint64_t cols, uint64_t rows, char *err,
                          size_t errlen)
{
    return want_experts(f, name, cols, rows, 0, err, errlen);
}

static int slice_experts(llama *m, uint32_t l, char *err, size_t errlen);

static int find_weights(llama *m, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    ferry *f = m->f;
    m->token_embd = want(f, "token_embd.weight", c->dim, c->vocab, err, errlen);
    if (!m->token_embd)
        return FERRY_ENOENT;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        layer_weights *w = &m->layers[l];
        char n[96];
#define W(field, part, cols, rows)                                                                 \
    snprintf(n, sizeof n, "blk.%u.%s.weight", l, part);                                          \
    if (!(w->field = want(f, n, cols, rows, err, errlen)))                                         \
        return FERRY_ENOENT;
        W(attn_norm, "attn_norm", c->dim, 0);
        W(wq, "attn_q", c->dim, c->q_dim);
        W(wk, "attn_k", c->dim, c->kv_dim);
        W(wv, "attn_v", c->dim, c->kv_dim);
        W(wo, "attn_output", c->q_dim, c->dim);
        if (c->qk_norm) {
            W(q_norm, "attn_q_norm", c->head_dim, 0);
            W(k_norm, "attn_k_norm", c->head_dim, 0);
        }
        W(ffn_norm, "ffn_norm", c->dim, 0);
        if (c->n_expert) {
            W(router, "ffn_gate_inp", c->dim, c->n_expert);
#define X(field, part, cols, rows)                                                                 \
    snprintf(n, sizeof n, "blk.%u.%s.weight", l, part);                                          \
    if (!(w->field = want_experts(f, n, cols, rows, c->n_expert, err, errlen)))                    \
        return FERRY_ENOENT;
            X(gate_exps, "ffn_gate_exps", c->dim, c->ff);
            X(up_exps, "ffn_up_exps", c->dim, c->ff);
            X(down_exps, "ffn_down_exps", c->ff, c->dim);
#undef X
        } else {
            W(w_gate, "ffn_gate", c->dim, c->ff);
            W(w_up, "ffn_up", c->dim, c->ff);
            W(w_down, "ffn_down", c->ff, c->dim);
        }
#undef W
    }
    m->output_norm = want(f, "output_norm.weight", c->dim, 0, err, errlen);
    if (!m->output_norm)
        return FERRY_ENOENT;
    m->output = c->tied_output ? m->token_embd : want(f, "output.weight", c->dim, c->vocab, err,
                                                      errlen);
    if (!m->output)
        return FERRY_ENOENT;
    int rc = ferry_validate(f);
    if (rc) {
        say(err, errlen, "%s", ferry_errmsg(f));
        return rc;
    }
    for (uint32_t l = 0; l < c->n_layer && c->n_expert; l++)
        if ((rc = slice_experts(m, l, err, errlen)))
            return rc;
    ferry_tensor_info ti;
    ferry_tensor_get_info(m->token_embd, &ti);
    m->embd_dtype = ti.dtype;
    if (ferry_dtype_nbytes(ti.dtype, c->dim, &m->embd_row_bytes) ||
        !ferry_dtype_can_convert(ti.dtype, FERRY_DTYPE_F32)) {
        say(err, errlen, "token_embd.weight: type %s cannot be read as numbers",
            ferry_dtype_name(ti.dtype));
        return FERRY_EDTYPE;
    }
    return 0;
}

/* ---- create / destroy ------------------------------------------------------------------------ */

static void *alloc_floats(uint64_t n, int *failed)
{
    void *p = calloc(n ? n : 1, sizeof(float));
    if (!p)
        *failed = 1;
    return p;
}

int llama_create(ferry *f, uint32_t n_ctx, int n_threads, llama **out, char *err, size_t errlen)
{
    *out = NULL;
    llama *m = calloc(1, sizeof *m);
    if (!m) {
        say(err, errlen, "out of memory");
        return FERRY_ENOMEM;
    }
    m->f = f;
    m->f16_arith = f16_arith_mode();
    m->lookahead_depth = 1;
    int rc = llama_read_config(f, &m->c, err, errlen);
    if (rc) {
        free(m);
        return rc;
    }
    const llama_config *c = &m->c;
    if (n_ctx == 0 || n_ctx > (1u << 20)) {
        say(err, errlen, "context of %u positions is out of range", n_ctx);
        free(m);
        return FERRY_EINVAL;
    }
    m->n_ctx = n_ctx;
    m->layers = calloc(c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        say(err, errlen, "out of memory");
        return FERRY_ENOMEM;
    }
    rc = find_weights(m, err, errlen);
    if (rc) {
        llama_destroy(m);
        return rc;
    }
    int failed = 0;
    m->x = alloc_floats(c->dim, &failed);
    m->xb = alloc_floats(c->dim, &failed);
    m->proj = alloc_floats(c->dim, &failed);
    m->q = alloc_floats(c->q_dim, &failed);
    m->att_out = alloc_floats(c->q_dim, &failed);
    m->hb = alloc_floats(c->ff, &failed);
    m->hb2 = alloc_floats(c->ff, &failed);
    m->logits = alloc_floats(c->vocab, &failed);
    uint32_t widest = c->dim > c->ff ? c->dim : c->ff;
    widest = widest > c->q_dim ? widest : c->q_dim;
    m->vec_bytes = (uint64_t)widest * sizeof(float); /* f32 is the largest prepared form */
    m->xq_stride = (m->vec_bytes + 63) / 64 * 64;
    for (int k = 0; k < 3; k++) {
        m->xq[k] = malloc(m->xq_stride);
        failed |= !m->xq[k];
    }
    m->xq_cap = 1;
    m->embd_row = malloc(m->embd_row_bytes);
    failed |= !m->embd_row;
    m->k = alloc_floats(c->kv_dim, &failed);
    m->v = alloc_floats(c->kv_dim, &failed);
    uint64_t cache = (uint64_t)c->n_layer * n_ctx * c->kv_dim;
    m->key_cache = calloc(cache, sizeof *m->key_cache);
    m->value_cache = calloc(cache, sizeof *m->value_cache);
    failed |= !m->key_cache || !m->value_cache;
    if (c->n_expert) {
        m->router_logits = alloc_floats(c->n_expert, &failed);
    }
    if (failed) {
        say(err, errlen, "out of memory for a context of %u positions", n_ctx);
        llama_destroy(m);
        return FERRY_ENOMEM;
    }
    m->pool = pool_create(n_threads);
    if (!m->pool) {
        say(err, errlen, "cannot start %d compute threads", n_threads);
        llama_destroy(m);
        return FERRY_ENOMEM;
    }
    *out = m;
    return 0;
}

void llama_destroy(llama *m)
{
    if (!m)
        return;
    pool_destroy(m->pool);
    for (uint32_t l = 0; m->layers && l < m->c.n_layer; l++)
        free(m->layers[l].exp);
    free(m->layers);
    free(m->x);
    free(m->xb);
    free(m->proj);
    free(m->q);
    free(m->att_out);
    free(m->hb);
    free(m->hb2);
    free(m->logits);
    free(m->embd_row);
    free(m->lora_tmp);
    free(m->xs);
    free(m->bx);
    free(m->by);
    free(m->bh);
    free(m->bh2);
    free(m->bproj);
    free(m->bk);
    free(m->bv);
    free(m->bslot);
    for (int k = 0; k < 3; k++)
        free(m->xq[k]);
    free(m->k);
    free(m->v);
    free(m->key_cache);
    free(m->value_cache);
    free(m->router_logits);
    free(m->sel);
    free(m->sel_w);
    free(m->pred);
    free(m->pred_p);
    free(m->routes);
    free(m);
}

const llama_config *llama_get_config(const llama *m) { return &m->c; }

void llama_set_lora_runtime(llama *m, int on) { m->lora_runtime = on; }

void llama_set_lookahead(llama *m, int on) { m->lookahead = on; }

void llama_set_lookahead_min(llama *m, float p) { m->lookahead_min = p; }

void llama_drop_expert_slices(llama *m)
{
    for (uint32_t l = 0; l < m->c.n_layer && m->c.n_expert; l++) {
        free(m->layers[l].exp);
        m->layers[l].exp = NULL;
    }
}

int llama_set_lookahead_depth(llama *m, uint32_t depth)
{
    if (depth < 1 || depth > LLAMA_LOOKAHEAD_MAX)
        return FERRY_EINVAL;
    m->lookahead_depth = depth;
    return 0;
}

/* Where the K experts predicted for token T at layer L, D + 1 layers ahead, are in pred and
 * pred_p. */
static uint64_t pred_at(const llama *m, uint32_t t, uint32_t l, uint32_t d)
{
    return (((uint64_t)t * m->c.n_layer + l) * LLAMA_LOOKAHEAD_MAX + d) * m->c.n_expert_used;
}

/* ---- matrix-vector products over the pool -------------------------------------------------- */

typedef struct matvec_op {
    ferry_dtype t;
    const uint8_t *w;  /* rows x cols, row_bytes each */
    uint64_t rows, cols, row_bytes;
    uint32_t nv;       /* vectors: W.x_v -> y_v for v < nv */
    const float *x;    /* x_v at x + v * x_stride, (cols) each */
    const void *xq;    /* x_v prepared for W's type (ferry_matvec_vec_quantize), at xq + v *
                          xq_stride bytes */
    float *y;          /* y_v at y + v * y_stride, (rows) each */
    uint64_t x_stride, xq_stride, y_stride;
} matvec_op;

/* A job's rows go in chunks of about MATVEC_CHUNK_BYTES of weights (a multiple of 8 rows, the
 * eight-row kernels' step). Each thread first takes the chunks of its own contiguous share in
 * order, then helps finish the others' shares: a thread the host slows down holds up no fixed
 * part of the job, and a quiet machine sees each thread stream one range. A row's value is the
 * same in any chunk. A chunk meets all of an op's vectors while it is in the cache, so a batch
 * reads each weight from memory once. */
#define MATVEC_CHUNK_BYTES (UINT64_C(256) << 10)
#define MATVEC_MAX_SHARES 64

typedef struct matvec_job {
    matvec_op op[3];   /* products that share the same input run in one job */
    int n;
    /* set by matvec_run: op k's chunks of chunk_rows[k] rows; share i of n_shares is chunks
     * [end[k][i - 1] (0 for i = 0), end[k][i]), next[k][i] the next of them to take */
    uint64_t chunk_rows[3];
    int n_shares;
    uint64_t end[3][MATVEC_MAX_SHARES];
    atomic_uint_fast64_t next[3][MATVEC_MAX_SHARES];
} matvec_job;

/* Runs the chunks of share I of op K not yet taken. */
static void matvec_share(matvec_job *j, int k, int i)
{
    const matvec_op *o = &j->op[k];
    for (uint64_t c; (c = atomic_fetch_add(&j->next[k][i], 1)) < j->end[k][i];) {
        uint64_t r0 = c * j->chunk_rows[k];
        uint64_t r1 = r0 + j->chunk_rows[k] < o->rows ? r0 + j->chunk_rows[k] : o->rows;
        /* types and shapes checked by matvec_add_batch before the job started; the vectors
         * together, so that each block of weights is unpacked once for several of them */
        (void)ferry_matvec_q_n(o->t, o->w + r0 * o->row_bytes, r1 - r0, o->cols, o->xq, o->nv,
                               o->xq_stride, o->y + r0, o->y_stride);
    }
}

static void matvec_work(void *arg, int ith, int nth)
{
    (void)nth;
    matvec_job *j = arg;
    for (int k = 0; k < j->n; k++) {
        if (ith < j->n_shares)
            matvec_share(j, k, ith);
        for (int i = 1; i < j->n_shares; i++)
            matvec_share(j, k, (ith + i) % j->n_shares);
    }
}

/* Adds W[first .. first + rows).x_v -> y_v for the NV vectors x_v = X + v * X_STRIDE, y_v = Y +
 * v * Y_STRIDE (W prepared; all its rows when ROWS is 0; NV at most m->xq_cap) to the job, after
 * checking ferry can compute with W's type. */
static int matvec_add_batch(llama *m, matvec_job *j, ferry_tensor *w, uint64_t first,
                            uint64_t rows, const float *x, uint64_t x_stride, uint32_t nv,
                            float *y, uint64_t y_stride, char *err, size_t errlen)
{
    ferry_tensor_info ti;
    ferry_tensor_get_info(w, &ti);
    matvec_op *o = &j->op[j->n];
    o->t = ferry_tensor_dtype(w);
    o->w = ferry_tensor_data(w);
    o->rows = rows ? rows : ti.n_rows;
    o->cols = ti.row_elems;
    o->nv = nv;
    o->x = x;
    o->y = y;
    o->x_stride = x_stride;
    o->y_stride = y_stride;
    o->xq_stride = m->xq_stride;
    int rc = nv > m->xq_cap ? FERRY_EINVAL : ferry_dtype_nbytes(o->t, o->cols, &o->row_bytes);
    if (!rc && !o->w)
        rc = FERRY_EUNSUPPORTED;
    if (!rc && (first > ti.n_rows || o->rows > ti.n_rows - first))
        rc = FERRY_ESHAPE;
    if (!rc)
        o->w += first * o->row_bytes;
    /* the vector in the form W's dot product takes, as llama.cpp rounds it */
    if (!rc && ferry_matvec_vec_bytes(o->t, o->cols) > m->vec_bytes)
        rc = FERRY_ESHAPE;
    for (uint32_t v = 0; v < nv && !rc; v++)
        rc = ferry_matvec_vec_quantize(o->t, x + v * x_stride, o->cols,
                                       (uint8_t *)m->xq[j->n] + v * m->xq_stride);
    o->xq = m->xq[j->n];
    if (rc) {
        say(err, errlen, "%s: %s", ti.name,
            !o->w ? "no host data (split over devices?)"
                  : rc == FERRY_EDTYPE ? "ferry_matvec cannot compute with this type"
                                       : ferry_strerror(rc));
        return rc;
    }
    j->n++;
    return 0;
}

/* Adds W[first .. first + rows).x -> y (W prepared; all its rows when ROWS is 0) to the job. */
static int matvec_add_rows(llama *m, matvec_job *j, ferry_tensor *w, uint64_t first,
                           uint64_t rows, const float *x, float *y, char *err, size_t errlen)
{
    return matvec_add_batch(m, j, w, first, rows, x, 0, 1, y, 0, err, errlen);
}

/* Adds W.x -> y (W prepared) to the job. */
static int matvec_add(llama *m, matvec_job *j, ferry_tensor *w, const float *x, float *y,
                      char *err, size_t errlen)
{
    return matvec_add_rows(m, j, w, 0, 0, x, y, err, errlen);
}

/* Runtime LoRA: y += scale * B.(A.x) for every adapter term of W. */
static int lora_apply(llama *m, ferry_tensor *w, const float *x, float *y, char *err,
                      size_t errlen)
{
    ferry_lora_factor fac;
    for (size_t i = 0; m->lora_runtime && w && ferry_lora_factors(m->f, w, i, &fac) == 0; i++) {
        if (fac.rank > m->max_rank) {
            float *t = realloc(m->lora_tmp, fac.rank * sizeof *t);
            if (!t) {
                say(err, errlen, "out of memory for an adapter of rank %u", fac.rank);
                return FERRY_ENOMEM;
            }
            m->lora_tmp = t;
            m->max_rank = fac.rank;
        }
        ferry_matvec(FERRY_DTYPE_F32, fac.a, fac.rank, fac.cols, x, m->lora_tmp);
        for (uint64_t r = 0; r < fac.rows; r++) {
            const float *b = fac.b + r * fac.rank;
            float s = 0;
            for (uint32_t q = 0; q < fac.rank; q++)
                s += b[q] * m->lora_tmp[q];
            y[r] += fac.scale * s;
        }
    }
    return 0;
}

/* Runs the job, then the runtime adapter terms of its weights. */
static int matvec_run(llama *m, matvec_job *j, ferry_tensor *const *ws, char *err, size_t errlen)
{
    int nth = pool_size(m->pool);
    j->n_shares = nth < MATVEC_MAX_SHARES ? nth : MATVEC_MAX_SHARES;
    for (int k = 0; k < j->n; k++) {
        const matvec_op *o = &j->op[k];
        uint64_t per = 8;
        if (o->row_bytes < MATVEC_CHUNK_BYTES / 8)
            per = MATVEC_CHUNK_BYTES / o->row_bytes / 8 * 8;
        uint64_t chunks = (o->rows + per - 1) / per;
        j->chunk_rows[k] = per;
        for (int i = 0; i < j->n_shares; i++) {
            j->end[k][i] = chunks * (uint64_t)(i + 1) / (uint64_t)j->n_shares;
            atomic_init(&j->next[k][i], chunks * (uint64_t)i / (uint64_t)j->n_shares);
        }
    }
    pool_run(m->pool, matvec_work, j);
    for (int k = 0; k < j->n; k++) {
        const matvec_op *o = &j->op[k];
        for (uint32_t v = 0; v < o->nv; v++) {
            int rc = lora_apply(m, ws[k], o->x + v * o->x_stride, o->y + v * o->y_stride, err,
                                errlen);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* y = W.x on the pool. */
static int matvec(llama *m, ferry_tensor *w, const float *x, float *y, char *err, size_t errlen)
{
    matvec_job j = {.n = 0};
    int rc = matvec_add(m, &j, w, x, y, err, errlen);
    return rc ? rc : matvec_run(m, &j, &w, err, errlen);
}

/* e^x as ggml's vector code computes it in llama.cpp's x86 builds (the polynomial of ARM's
 * optimized-routines expf: x = n ln2 + b, e^b by a degree-5 polynomial, scaled by 2^n), each
 * step one rounding (fmaf), so that silu rounds as llama.cpp's does; within 2 ulp of expf. */
static float vexpf(float x)
{
    const float shift = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, shift), n = z - shift;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    float u = b * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                        fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                   u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192.0f)
        return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

/* ---- the steps ---------------------------------------------------------------------------- */

/* g = silu(g) * u over N elements. */
static void swiglu(float *g, const float *u, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + vexpf(-g[i])) * u[i];
}

/* Reads row TOKEN of the lazy embedding into x. */
static int embed(llama *m, uint32_t token, char *err, size_t errlen)
{
    if (token >= m->c.vocab) {
        say(err, errlen, "token %u is outside the vocabulary of %u", token, m->c.vocab);
        return FERRY_EINVAL;
    }
    uint64_t row = token;
    int rc = ferry_read_rows(m->f, m->token_embd, &row, 1, m->embd_row);
    if (!rc)
        rc = ferry_dtype_convert(m->embd_dtype, m->embd_row, FERRY_DTYPE_F32, m->x, m->c.dim);
    if (rc)
        say(err, errlen, "token_embd.weight row %u: %s", token, ferry_errmsg(m->f));
    return rc;
}

/* out = x / rms(x) * weight over N elements, weight (n) f32 (GGUF keeps norms in f32). */
static int rmsnorm_n(llama *m, float *out, const float *x, uint32_t n, ferry_tensor *weight,
                     char *err, size_t errlen)
{
    const float *w = ferry_tensor_data(weight);
    if (ferry_tensor_dtype(weight) != FERRY_DTYPE_F32 || !w) {
        say(err, errlen, "norm weight of type %s: only f32 norms are read",
            ferry_dtype_name(ferry_tensor_dtype(weight)));
        return FERRY_EDTYPE;
    }
    double ss = 0; /* squares in f32, summed in f64, as ggml */
    for (uint32_t i = 0; i < n; i++)
        ss += (double)(x[i] * x[i]);
    float mean = (float)(ss / n);
    float scale = 1.0f / sqrtf(mean + m->c.eps);
    for (uint32_t i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
    return 0;
}

/* The model-wide RMSNorm: over dim elements. */
static int rmsnorm(llama *m, float *out, const float *x, ferry_tensor *weight, char *err,
                   size_t errlen)
{
    return rmsnorm_n(m, out, x, m->c.dim, weight, err, errlen);
}

/* RMSNorm of each of the N_HEADS heads of V in place (qwen3moe's attn_q_norm / attn_k_norm). */
static int head_norm(llama *m, float *v, uint32_t n_heads, ferry_tensor *weight, char *err,
                     size_t errlen)
{
    int rc = 0;
    for (uint32_t h = 0; h < n_heads && !rc; h++) {
        float *p = v + (uint64_t)h * m->c.head_dim;
        rc = rmsnorm_n(m, p, p, m->c.head_dim, weight, err, errlen);
    }
    return rc;
}

/* Rotates the first rope_dim elements of each head of V (n_heads heads) by position POS: pair
 * j turns by pos * base^(-2j / rope_dim), a pair being elements 2j and 2j + 1 (llama.cpp's
 * normal mode) or j and j + rope_dim / 2 (NeoX). */
static void rope(const llama_config *c, float *v, uint32_t n_heads, uint32_t pos)
{
    float theta_scale = powf(c->rope_base, -2.0f / (float)c->rope_dim);
    uint32_t half = c->rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = v + (uint64_t)h * c->head_dim;
        float theta = (float)pos;
        for (uint32_t j = 0; j < half; j++) {
            float cs = cosf(theta), sn = sinf(theta);
            uint32_t i0 = c->rope_neox ? j : 2 * j, i1 = c->rope_neox ? j + half : 2 * j + 1;
            float x0 = p[i0], x1 = p[i1];
            p[i0] = fmaf(x0, cs, -(x1 * sn));
            p[i1] = fmaf(x0, sn, x1 * cs);
            theta *= theta_scale;
        }
    }
}

typedef struct attention_job {
    llama *m;
    uint32_t layer, pos;
} attention_job;

/* Heads [n_head * ith / nth, n_head * (ith + 1) / nth): softmax(q.K / sqrt(head_dim)) . V over
 * positions 0..pos, each query head reading the kv head its group shares. As llama.cpp's CPU
 * flash attention: q rounded to f16 (the cache is f16), one pass with a running maximum, and
 * the weighted sum of V kept in f16, rounded after every step. */
static void attention_work(void *arg, int ith, int nth)
{
    attention_job *j = arg;
    llama *m = j->m;
    const llama_config *c = &m->c;
    uint32_t h0 = c->n_head * (uint32_t)ith / (uint32_t)nth;
    uint32_t h1 = c->n_head * (uint32_t)(ith + 1) / (uint32_t)nth;
    uint32_t group = c->n_head / c->n_head_kv, n = j->pos + 1, hd = c->head_dim;
    const uint16_t *kc = m->key_cache + (uint64_t)j->layer * m->n_ctx * c->kv_dim;
    const uint16_t *vc = m->value_cache + (uint64_t)j->layer * m->n_ctx * c->kv_dim;
    float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = h0; h < h1; h++) {
        const float *q = m->q + (uint64_t)h * hd; /* already rounded to f16 */
        float *out = m->att_out + (uint64_t)h * hd;
        uint64_t kv_off = (uint64_t)(h / group) * hd;
        float sum = 0.0f, max = -INFINITY;
        memset(out, 0, hd * sizeof *out);
        for (uint32_t t = 0; t < n; t++) {
            const uint16_t *k = kc + (uint64_t)t * c->kv_dim + kv_off;
            const uint16_t *v = vc + (uint64_t)t * c->kv_dim + kv_off;
            float s = attn_dot(m->f16_arith, q, k, hd) * scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > max) { /* a new maximum: what was summed shrinks by exp(old - new) */
                ms = expf(max - s);
                max = s;
                attn_scale(m->f16_arith, out, ms, hd);
            } else {
                vs = expf(s - max);
            }
            attn_mad(m->f16_arith, out, v, vs, hd);
            sum = fmaf(sum, ms, vs);
        }
        float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (uint32_t i = 0; i < hd; i++)
            out[i] *= inv;
    }
}

static int attend(llama *m, uint32_t l, uint32_t pos, char *err, size_t errlen);

/* att_out = attention(RoPE(Wq.xb), KV cache with RoPE(Wk.xb), Wv.xb), xb = rmsnorm(x): the
 * keys and values of position POS go into the cache. */
static int attention_heads(llama *m, uint32_t l, uint32_t pos, char *err, size_t errlen)
{
    layer_weights *w = &m->layers[l];
    int rc = rmsnorm(m, m->xb, m->x, w->attn_norm, err, errlen);
    if (rc)
        return rc;
    float *k = m->k, *v = m->v;
    matvec_job j = {.n = 0};
    ferry_tensor *ws[3] = {w->wq, w->wk, w->wv};
    if ((rc = matvec_add(m, &j, w->wq, m->xb, m->q, err, errlen)) ||
        (rc = matvec_add(m, &j, w->wk, m->xb, k, err, errlen)) ||
        (rc = matvec_add(m, &j, w->wv, m->xb, v, err, errlen)) ||
        (rc = matvec_run(m, &j, ws, err, errlen)))
        return rc;
    return attend(m, l, pos, err, errlen);
}

/* att_out = attention of q, k and v (Wq.xb, Wk.xb, Wv.xb of position POS) with the KV cache: RoPE
 * (after the per-head norms where the model has them), and k and v into the cache. */
static int attend(llama *m, uint32_t l, uint32_t pos, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    layer_weights *w = &m->layers[l];
    float *k = m->k, *v = m->v;
    int rc;
    if (c->qk_norm && ((rc = head_norm(m, m->q, c->n_head, w->q_norm, err, errlen)) ||
                       (rc = head_norm(m, k, c->n_head_kv, w->k_norm, err, errlen))))
        return rc;
    rope(c, m->q, c->n_head, pos);
    rope(c, k, c->n_head_kv, pos);
    /* the cache keeps f16, and q meets it in f16 */
    uint16_t *kc = m->key_cache + ((uint64_t)l * m->n_ctx + pos) * c->kv_dim;
    uint16_t *vc = m->value_cache + ((uint64_t)l * m->n_ctx + pos) * c->kv_dim;
    for (uint32_t i = 0; i < c->kv_dim; i++) {
        kc[i] = f32_to_f16(k[i]);
        vc[i] = f32_to_f16(v[i]);
    }
    for (uint32_t i = 0; i < c->q_dim; i++)
        m->q[i] = round_f16(m->q[i]);
    attention_job aj = {m, l, pos};
    pool_run(m->pool, attention_work, &aj);
    return 0;
}

/* x += W.v: the projection of a block's output back into the residual stream. */
static int residual_add(llama *m, ferry_tensor *w, const float *v, char *err, size_t errlen)
{
    int rc = matvec(m, w, v, m->proj, err, errlen);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < m->c.dim; i++)
        m->x[i] += m->proj[i];
    return 0;
}

/* hb = silu(W_gate.xb) * W_up.xb, xb = rmsnorm(x). */
static int ffn_hidden(llama *m, uint32_t l, char *err, size_t errlen)
{
    layer_weights *w = &m->layers[l];
    int rc = rmsnorm(m, m->xb, m->x, w->ffn_norm, err, errlen);
    if (rc)
        return rc;
    matvec_job j = {.n = 0};
    ferry_tensor *ws[2] = {w->w_gate, w->w_up};
    if ((rc = matvec_add(m, &j, w->w_gate, m->xb, m->hb, err, errlen)) ||
        (rc = matvec_add(m, &j, w->w_up, m->xb, m->hb2, err, errlen)) ||
        (rc = matvec_run(m, &j, ws, err, errlen)))
        return rc;
    swiglu(m->hb, m->hb2, m->c.ff);
    return 0;
}

/* The parts of a dense layer's pass, in order: each block's first products, then its output
 * projection. A step of the layer (step_list) covers one part or a run of them. */
enum { PART_QKV, PART_WO, PART_GATE_UP, PART_DOWN, PARTS };

/* Parts [*P0, *P1] are step S of a layer done in STEPS steps (1, 2 or 4). */
static void step_parts(int steps, int s, int *p0, int *p1)
{
    *p0 = s * (PARTS / steps);
    *p1 = *p0 + PARTS / steps - 1;
}

/* Parts P0..P1 of dense layer L for the token in x at position POS: x += Wo . attention, x +=
 * W_down . hb, the vector between a block's two products kept in att_out or hb. */
static int dense_parts(llama *m, uint32_t l, int p0, int p1, uint32_t pos, char *err,
                       size_t errlen)
{
    layer_weights *w = &m->layers[l];
    int rc = 0;
    for (int p = p0; p <= p1 && !rc; p++) {
        if (p == PART_QKV)
            rc = attention_heads(m, l, pos, err, errlen);
        else if (p == PART_WO)
            rc = residual_add(m, w->wo, m->att_out, err, errlen);
        else if (p == PART_GATE_UP)
            rc = ffn_hidden(m, l, err, errlen);
        else
            rc = residual_add(m, w->w_down, m->hb, err, errlen);
    }
    return rc;
}

/* xs[t] += by[t] for the batch's N tokens. */
static void batch_residual(llama *m, uint32_t n)
{
    const uint32_t dim = m->c.dim;
    for (uint64_t i = 0; i < (uint64_t)n * dim; i++)
        m->xs[i] += m->by[i];
}

/* by[t] = rmsnorm(xs[t]) for the batch's N tokens. */
static int batch_norm(llama *m, uint32_t n, ferry_tensor *weight, char *err, size_t errlen)
{
    const uint32_t dim = m->c.dim;
    int rc = 0;
    for (uint32_t t = 0; t < n && !rc; t++)
        rc = rmsnorm(m, m->by + (uint64_t)t * dim, m->xs + (uint64_t)t * dim, weight, err,
                     errlen);
    return rc;
}

/* Parts P0..P1 of dense layer L for the N tokens of the batch in xs, at positions POS0, POS0 + 1,
 * ...: each product is one job over all N vectors, so that each chunk of a weight's rows is read
 * from memory once a batch and meets every token in the cache; attention goes token by token in
 * order. A token's arithmetic is dense_parts': the same bits. Between the parts, the batch's
 * queries and then attention outputs are in bx (a token's output replaces its query once read),
 * its keys and values in bk and bv, the feed-forward hidden vectors in bh. */
static int dense_parts_batch(llama *m, uint32_t l, int p0, int p1, uint32_t n, uint32_t pos0,
                             char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    layer_weights *w = &m->layers[l];
    int rc = 0;
    for (int p = p0; p <= p1 && !rc; p++) {
        matvec_job j = {.n = 0};
        if (p == PART_QKV) {
            ferry_tensor *ws[3] = {w->wq, w->wk, w->wv};
            if ((rc = batch_norm(m, n, w->attn_norm, err, errlen)) ||
                (rc = matvec_add_batch(m, &j, w->wq, 0, 0, m->by, c->dim, n, m->bx, c->q_dim,
                                       err, errlen)) ||
                (rc = matvec_add_batch(m, &j, w->wk, 0, 0, m->by, c->dim, n, m->bk, c->kv_dim,
                                       err, errlen)) ||
                (rc = matvec_add_batch(m, &j, w->wv, 0, 0, m->by, c->dim, n, m->bv, c->kv_dim,
                                       err, errlen)) ||
                (rc = matvec_run(m, &j, ws, err, errlen)))
                return rc;
            for (uint32_t t = 0; t < n && !rc; t++) {
                float *qt = m->bx + (uint64_t)t * c->q_dim;
                memcpy(m->q, qt, c->q_dim * sizeof *m->q);
                memcpy(m->k, m->bk + (uint64_t)t * c->kv_dim, c->kv_dim * sizeof *m->k);
                memcpy(m->v, m->bv + (uint64_t)t * c->kv_dim, c->kv_dim * sizeof *m->v);
                rc = attend(m, l, pos0 + t, err, errlen);
                memcpy(qt, m->att_out, c->q_dim * sizeof *qt);
            }
        } else if (p == PART_WO) {
            ferry_tensor *ws[1] = {w->wo};
            if ((rc = matvec_add_batch(m, &j, w->wo, 0, 0, m->bx, c->q_dim, n, m->by, c->dim,
                                       err, errlen)) ||
                (rc = matvec_run(m, &j, ws, err, errlen)))
                return rc;
            batch_residual(m, n);
        } else if (p == PART_GATE_UP) {
            ferry_tensor *ws[2] = {w->w_gate, w->w_up};
            if ((rc = batch_norm(m, n, w->ffn_norm, err, errlen)) ||
                (rc = matvec_add_batch(m, &j, w->w_gate, 0, 0, m->by, c->dim, n, m->bh, c->ff,
                                       err, errlen)) ||
                (rc = matvec_add_batch(m, &j, w->w_up, 0, 0, m->by, c->dim, n, m->bh2, c->ff,
                                       err, errlen)) ||
                (rc = matvec_run(m, &j, ws, err, errlen)))
                return rc;
            for (uint32_t t = 0; t < n; t++)
                swiglu(m->bh + (uint64_t)t * c->ff, m->bh2 + (uint64_t)t * c->ff, c->ff);
        } else {
            ferry_tensor *ws[1] = {w->w_down};
            if ((rc = matvec_add_batch(m, &j, w->w_down, 0, 0, m->bh, c->ff, n, m->by, c->dim,
                                       err, errlen)) ||
                (rc = matvec_run(m, &j, ws, err, errlen)))
                return rc;
            batch_residual(m, n);
        }
    }
    return rc;
}

/* ---- mixture of experts ---------------------------------------------------------------------- */

/* Where expert E of layer L's tensor KIND is: *T, rows [*FIRST, *FIRST + *ROWS) of it: its slice,
 * or expert e's block of rows in the whole 3-D tensor (n_expert is the outermost dimension). */
static void expert_tensor(llama *m, uint32_t l, int kind, uint32_t e, ferry_tensor **t,
                          uint64_t *first, uint64_t *rows)
{
    layer_weights *w = &m->layers[l];
    *rows = kind == EXP_DOWN ? m->c.dim : m->c.ff;
    if (w->exp) {
        *t = w->exp[(uint64_t)kind * m->c.n_expert + e];
        *first = 0;
        return;
    }
    *t = kind == EXP_GATE ? w->gate_exps : kind == EXP_UP ? w->up_exps : w->down_exps;
    *first = (uint64_t)e * *rows;
}

/* The handles to prepare for experts IDS (K of them) of layer L, into TS; returns how many: three
 * slices an expert, in the order of IDS, W_gate, W_up, W_down each, or the three whole tensors. */
static size_t experts_list(llama *m, uint32_t l, const uint32_t *ids, uint32_t k,
                           ferry_tensor **ts)
{
    layer_weights *w = &m->layers[l];
    if (!w->exp) {
        ts[EXP_GATE] = w->gate_exps;
        ts[EXP_UP] = w->up_exps;
        ts[EXP_DOWN] = w->down_exps;
        return EXP_KINDS;
    }
    size_t n = 0;
    for (uint32_t i = 0; i < k; i++)
        for (int kind = 0; kind < EXP_KINDS; kind++)
            ts[n++] = w->exp[(uint64_t)kind * m->c.n_expert + ids[i]];
    return n;
}

/* Makes layer L's experts slices of their own (w->exp); leaves the whole tensors when a tensor
 * cannot be sliced. */
static int slice_experts(llama *m, uint32_t l, char *err, size_t errlen)
{
    layer_weights *w = &m->layers[l];
    uint32_t ne = m->c.n_expert;
    ferry_tensor **exp = malloc((size_t)EXP_KINDS * ne * sizeof *exp);
    if (!exp) {
        say(err, errlen, "out of memory for the expert slices");
        return FERRY_ENOMEM;
    }
    ferry_tensor *whole[EXP_KINDS] = {w->gate_exps, w->up_exps, w->down_exps};
    for (int kind = 0; kind < EXP_KINDS; kind++)
        for (uint32_t e = 0; e < ne; e++)
            if (ferry_slice(m->f, whole[kind], e, 1, &exp[(uint64_t)kind * ne + e]) != 0) {
                free(exp);
                return 0;
            }
    w->exp = exp;
    return 0;
}

/* Brings in experts IDS (K, ascending) of layer L: their weights stay valid until
 * release_experts. */
static int prepare_experts(llama *m, uint32_t l, const uint32_t *ids, uint32_t k, char *err,
                           size_t errlen)
{
    size_t n = experts_list(m, l, ids, k, m->held);
    int rc = ferry_prepare(m->f, m->held, n);
    if (rc) {
        say(err, errlen, "%s", ferry_errmsg(m->f));
        return rc;
    }
    m->n_held = n;
    return 0;
}

static void release_experts(llama *m)
{
    if (m->n_held)
        ferry_release(m->f, m->held, m->n_held);
    m->n_held = 0;
}

/* The K largest of V (N), best first (the lower index first among equals). */
static void top_k(const float *v, uint32_t n, uint32_t k, uint32_t *ids)
{
    for (uint32_t i = 0; i < k; i++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t e = 0; e < n; e++) {
            int taken = 0;
            for (uint32_t q = 0; q < i && !taken; q++)
                taken = ids[q] == e;
            if (!taken && (best == UINT32_MAX || v[e] > v[best]))
                best = e;
        }
        ids[i] = best;
    }
}

static void sort_ids(uint32_t *ids, uint32_t k)
{
    for (uint32_t i = 1; i < k; i++)
        for (uint32_t q = i; q > 0 && ids[q - 1] > ids[q]; q--) {
            uint32_t t = ids[q];
            ids[q] = ids[q - 1];
            ids[q - 1] = t;
        }
}

/* Token T's experts at layer L (x its residual stream after attention): softmax over
 * router . rmsnorm(x), the n_expert_used most probable (best first) and their probabilities
 * divided by their sum, as llama.cpp's build_moe_ffn does for llama. Counts how many the
 * previous layer predicted. */
static int route(llama *m, uint32_t l, uint32_t t, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    layer_weights *w = &m->layers[l];
    uint32_t k = c->n_expert_used, *sel = m->sel + (uint64_t)t * k;
    float *p = m->router_logits, *sw = m->sel_w + (uint64_t)t * k;
    int rc = rmsnorm(m, m->xb, m->x, w->ffn_norm, err, errlen);
    if (!rc)
        rc = matvec(m, w->router, m->xb, p, err, errlen);
    if (rc)
        return rc;
    float max = -INFINITY;
    for (uint32_t e = 0; e < c->n_expert; e++)
        max = p[e] > max ? p[e] : max;
    double sum = 0; /* as ggml's soft_max: exp(x - max), summed in f64, scaled by 1 / sum */
    for (uint32_t e = 0; e < c->n_expert; e++) {
        p[e] = vexpf(p[e] - max);
        sum += p[e];
    }
    float inv = (float)(1.0 / sum);
    for (uint32_t e = 0; e < c->n_expert; e++)
        p[e] *= inv;
    top_k(p, c->n_expert, k, sel);
    double wsum = 0;
    for (uint32_t i = 0; i < k; i++)
        wsum += sw[i] = p[sel[i]];
    float ws = (float)wsum < 6.103515625e-5f ? 6.103515625e-5f : (float)wsum; /* f16's least */
    for (uint32_t i = 0; i < k; i++)
        sw[i] /= ws;
    uint32_t *r = m->routes + ((uint64_t)t * c->n_layer + l) * k;
    memcpy(r, sel, k * sizeof *r);
    sort_ids(r, k);
    for (uint32_t d = 0; d < m->lookahead_depth && d < l; d++) {
        const uint32_t *pr = m->pred + pred_at(m, t, l, d);
        for (uint32_t i = 0; i < k; i++)
            for (uint32_t q = 0; q < k; q++)
                m->pred_hits[d] += r[i] == pr[q];
        m->pred_total[d] += k;
    }
    return 0;
}

/* Predicts token T's experts at layers L + 1 .. L + lookahead_depth from its residual stream
 * after layer L's attention: each layer's router applied to x normalised by its ffn_norm. */
static int predict_experts(llama *m, uint32_t l, uint32_t t, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    uint32_t k = c->n_expert_used;
    for (uint32_t d = 0; d < m->lookahead_depth && l + 1 + d < c->n_layer; d++) {
        layer_weights *w = &m->layers[l + 1 + d];
        uint64_t at = pred_at(m, t, l + 1 + d, d);
        uint32_t *pr = m->pred + at;
        int rc = rmsnorm(m, m->xb, m->x, w->ffn_norm, err, errlen);
        if (!rc)
            rc = matvec(m, w->router, m->xb, m->router_logits, err, errlen);
        if (rc)
            return rc;
        float *p = m->router_logits, max = -INFINITY;
        for (uint32_t e = 0; e < c->n_expert; e++)
            max = p[e] > max ? p[e] : max;
        double sum = 0;
        for (uint32_t e = 0; e < c->n_expert; e++)
            sum += p[e] = vexpf(p[e] - max);
        top_k(p, c->n_expert, k, pr);
        sort_ids(pr, k);
        for (uint32_t i = 0; i < k; i++)
            m->pred_p[at + i] = (float)(p[pr[i]] / sum);
    }
    return 0;
}

static void guess_next(llama *m, uint32_t l, uint32_t n);

/* Set Q of the asynchronous expert prepares of moe_experts: expert Q / 2's W_gate and W_up (Q
 * even) or its W_down (Q odd), at m->held[set_first(Q)], set_len(Q) slices. */
static size_t set_first(uint32_t q)
{
    return (size_t)EXP_KINDS * (q / 2) + (q % 2 ? EXP_DOWN : EXP_GATE);
}

static size_t set_len(uint32_t q)
{
    return q % 2 ? 1 : 2;
}

/* Waits for set *WAITED of EV (NULL: nothing to wait for) and counts it when it came in; a set
 * whose load failed is not held. */
static int wait_set(llama *m, ferry_event **ev, uint32_t *waited, uint32_t l, uint32_t e,
                    char *err, size_t errlen)
{
    if (!ev)
        return 0;
    int rc = ferry_event_synchronize(ev[*waited]);
    if (rc) {
        say(err, errlen, "layer %u, expert %u: %s", l, e, ferry_errmsg(m->f));
        return rc;
    }
    ++*waited;
    return 0;
}

/* Expert E of layer L for the NV tokens whose experts' slots (token * n_expert_used + i) are
 * SLOT: bproj[slot] = W_down_e . (silu(W_gate_e.xb) * W_up_e.xb), xb the token's normed input in
 * by. Each product is one job over all NV vectors, so each chunk of the expert's rows is read from
 * memory once. With EV, W_gate + W_up and then W_down are waited for just before they compute. */
static int expert_run(llama *m, uint32_t l, uint32_t e, const uint32_t *slot, uint32_t nv,
                      ferry_event **ev, uint32_t *waited, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    const uint32_t k = c->n_expert_used;
    ferry_tensor *tg, *tu, *td, *none[2] = {NULL, NULL};
    uint64_t fg, fu, fd, rg, ru, rd;
    expert_tensor(m, l, EXP_GATE, e, &tg, &fg, &rg);
    expert_tensor(m, l, EXP_UP, e, &tu, &fu, &ru);
    expert_tensor(m, l, EXP_DOWN, e, &td, &fd, &rd);
    for (uint32_t v = 0; v < nv; v++)
        memcpy(m->bx + (uint64_t)v * c->dim, m->by + (uint64_t)(slot[v] / k) * c->dim,
               c->dim * sizeof *m->bx);
    matvec_job j = {.n = 0};
    int rc;
    if ((rc = wait_set(m, ev, waited, l, e, err, errlen)) ||
        (rc = matvec_add_batch(m, &j, tg, fg, rg, m->bx, c->dim, nv, m->bh, c->ff, err,
                               errlen)) ||
        (rc = matvec_add_batch(m, &j, tu, fu, ru, m->bx, c->dim, nv, m->bh2, c->ff, err,
                               errlen)) ||
        (rc = matvec_run(m, &j, none, err, errlen)))
        return rc;
    for (uint32_t v = 0; v < nv; v++)
        swiglu(m->bh + (uint64_t)v * c->ff, m->bh2 + (uint64_t)v * c->ff, c->ff);
    j.n = 0;
    if ((rc = wait_set(m, ev, waited, l, e, err, errlen)) ||
        (rc = matvec_add_batch(m, &j, td, fd, rd, m->bh, c->ff, nv, m->bx, c->dim, err,
                               errlen)) ||
        (rc = matvec_run(m, &j, none, err, errlen)))
        return rc;
    for (uint32_t v = 0; v < nv; v++)
        memcpy(m->bproj + (uint64_t)slot[v] * c->dim, m->bx + (uint64_t)v * c->dim,
               c->dim * sizeof *m->bx);
    return 0;
}

/* Layer L's experts over the batch's N tokens (their residual streams after attention in xs,
 * their experts in sel): x += sum over the token's experts e of weight_e * W_down_e .
 * (silu(W_gate_e.xb) * W_up_e.xb), xb = rmsnorm(x). The K experts IDS the batch chose compute in
 * the order of IDS, each for all the tokens that chose it; each token then sums its experts'
 * outputs in its own order, best first, as ggml does: the same arithmetic for a token whatever
 * else is in its batch. With slices, each expert's W_gate + W_up and its W_down are prepared
 * asynchronously, all issued at once in the order of IDS, and an expert computes while the ones
 * after it are still read; the references are taken at once, as one prepare takes them. */
static int moe_experts(llama *m, uint32_t l, uint32_t n, const uint32_t *ids, uint32_t k,
                       char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    const uint32_t ku = c->n_expert_used;
    int rc = 0;
    for (uint32_t t = 0; t < n && !rc; t++)
        rc = rmsnorm(m, m->by + (uint64_t)t * c->dim, m->xs + (uint64_t)t * c->dim,
                     m->layers[l].ffn_norm, err, errlen);
    if (rc)
        return rc;
    ferry_event *ev[2 * LLAMA_MAX_EXPERTS];
    uint32_t sets = m->layers[l].exp ? 2 * k : 0, issued = 0, waited = 0;
    if (sets) {
        experts_list(m, l, ids, k, m->held);
        for (; issued < sets && !rc; issued++)
            if ((rc = ferry_prepare_async(m->f, m->held + set_first(issued), set_len(issued),
                                          &ev[issued])) != 0) {
                say(err, errlen, "%s", ferry_errmsg(m->f));
                break;
            }
    } else {
        rc = prepare_experts(m, l, ids, k, err, errlen);
    }
    /* the experts predicted for the next layer are read while these compute, not before these
     * are held (guessed before, they would take no fewer reads: measured) */
    if (!rc)
        guess_next(m, l, n);
    for (uint32_t i = 0; i < k && !rc; i++) {
        uint32_t nv = 0;
        for (uint32_t s = 0; s < n * ku; s++)
            if (m->sel[s] == ids[i])
                m->bslot[nv++] = s;
        rc = expert_run(m, l, ids[i], m->bslot, nv, sets ? ev : NULL, &waited, err, errlen);
    }
    for (uint32_t t = 0; t < n && !rc; t++) {
        float *x = m->xs + (uint64_t)t * c->dim;
        const float *sw = m->sel_w + (uint64_t)t * ku;
        for (uint32_t d = 0; d < c->dim; d++) {
            float acc = 0;
            for (uint32_t i = 0; i < ku; i++) {
                float y = m->bproj[((uint64_t)t * ku + i) * c->dim + d] * sw[i];
                acc = i == 0 ? y : acc + y;
            }
            x[d] += acc;
        }
    }
    if (!sets) {
        release_experts(m);
        return rc;
    }
    /* every set whose load succeeded is held: released here; a failed one is not (a failed
     * wait stops before it is counted) */
    for (uint32_t q = 0; q < issued; q++) {
        if (q < waited || ferry_event_synchronize(ev[q]) == 0)
            ferry_release(m->f, m->held + set_first(q), set_len(q));
        ferry_event_destroy(ev[q]);
    }
    return rc;
}

/* logits = output . rmsnorm(x). */
static int head(llama *m, char *err, size_t errlen)
{
    int rc = rmsnorm(m, m->xb, m->x, m->output_norm, err, errlen);
    return rc ? rc : matvec(m, m->output, m->xb, m->logits, err, errlen);
}

/* ---- residency around the steps ------------------------------------------------------------ */

/* What step S of the STEPS of layer L computes with into TS, in the order it uses them; returns
 * how many. A dense layer is prepared in steps, so that streaming holds one step and reads the
 * next one ahead, not whole layers: a batch in two, the attention block and the feed-forward
 * block (all the batch's tokens through one before the other: a layer's keys and values depend
 * only on its input); one token in four, one part each (PART_QKV ...). A mixture-of-experts
 * layer is one step, its attention and router (its experts are routed in moe_layer) and the
 * next layer's router and ffn_norm, which predict_experts reads. */
static size_t step_list(llama *m, uint32_t l, int steps, int s, ferry_tensor *ts[LAYER_TENSORS])
{
    layer_weights *w = &m->layers[l];
    size_t n = 0;
    int p0, p1;
    step_parts(steps, s, &p0, &p1);
    if (p0 <= PART_QKV) {
        ts[n++] = w->attn_norm;
        ts[n++] = w->wq;
        ts[n++] = w->wk;
        ts[n++] = w->wv;
    }
    if (p0 <= PART_WO && p1 >= PART_WO)
        ts[n++] = w->wo;
    if (p0 <= PART_QKV && m->c.qk_norm) {
        ts[n++] = w->q_norm;
        ts[n++] = w->k_norm;
    }
    if (p0 <= PART_GATE_UP && p1 >= PART_GATE_UP)
        ts[n++] = w->ffn_norm;
    if (m->c.n_expert) {
        ts[n++] = w->router;
        for (uint32_t d = 0; d < m->lookahead_depth && l + 1 + d < m->c.n_layer; d++) {
            ts[n++] = m->layers[l + 1 + d].ffn_norm;
            ts[n++] = m->layers[l + 1 + d].router;
        }
        return n;
    }
    if (p0 <= PART_GATE_UP && p1 >= PART_GATE_UP) {
        ts[n++] = w->w_gate;
        ts[n++] = w->w_up;
    }
    if (p1 >= PART_DOWN)
        ts[n++] = w->w_down;
    return n;
}

/* The steps of each layer for a batch of N tokens (see step_list). */
static int layer_steps(const llama *m, uint32_t n)
{
    return m->c.n_expert ? 1 : n == 1 ? 4 : 2;
}

/* Reads ahead what comes after step S of the STEPS of layer L: the layer's next step, the next
 * layer's first, or the head after the last layer (a layer's experts are guessed in
 * moe_layer). */
static void prefetch_after(llama *m, uint32_t l, int steps, int s)
{
    ferry_tensor *ts[LAYER_TENSORS];
    if (s + 1 < steps)
        ferry_prefetch(m->f, ts, step_list(m, l, steps, s + 1, ts));
    else if (l + 1 < m->c.n_layer)
        ferry_prefetch(m->f, ts, step_list(m, l + 1, steps, 0, ts));
    else {
        ferry_tensor *hd[2] = {m->output_norm, m->output};
        ferry_prefetch(m->f, hd, 2);
    }
}

/* Reallocates *P to BYTES; nonzero (and *P as it was) when that fails. */
static int grow(void *p, uint64_t bytes)
{
    void *q = bytes <= SIZE_MAX ? realloc(*(void **)p, (size_t)bytes) : NULL;
    if (!q)
        return 1;
    *(void **)p = q;
    return 0;
}

/* Grows the per-token buffers of a batch to N tokens. */
static int batch_reserve(llama *m, uint32_t n, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    if (n <= m->batch_cap)
        return 0;
    float *xs = realloc(m->xs, (uint64_t)n * c->dim * sizeof *xs);
    if (xs)
        m->xs = xs;
    int failed = !xs;
    uint64_t widest = c->dim > c->ff ? c->dim : c->ff;
    widest = widest > c->q_dim ? widest : c->q_dim;
    failed |= grow(&m->bx, n * widest * sizeof(float));
    failed |= grow(&m->by, n * widest * sizeof(float));
    failed |= grow(&m->bh, (uint64_t)n * c->ff * sizeof(float));
    failed |= grow(&m->bh2, (uint64_t)n * c->ff * sizeof(float));
    failed |= grow(&m->bk, (uint64_t)n * c->kv_dim * sizeof(float));
    failed |= grow(&m->bv, (uint64_t)n * c->kv_dim * sizeof(float));
    int xq_failed = 0;
    for (int k = 0; k < 3; k++)
        xq_failed |= grow(&m->xq[k], n * m->xq_stride);
    if (!xq_failed)
        m->xq_cap = n;
    failed |= xq_failed;
    if (c->n_expert) {
        failed |= grow(&m->bproj, (uint64_t)n * c->n_expert_used * c->dim * sizeof(float));
        failed |= grow(&m->bslot, (uint64_t)n * c->n_expert_used * sizeof(uint32_t));
        uint64_t k = (uint64_t)n * c->n_expert_used;
        uint32_t *sel = realloc(m->sel, k * sizeof *sel);
        m->sel = sel ? sel : m->sel;
        float *sw = realloc(m->sel_w, k * sizeof *sw);
        m->sel_w = sw ? sw : m->sel_w;
        uint64_t kp = k * c->n_layer * LLAMA_LOOKAHEAD_MAX;
        uint32_t *pred = realloc(m->pred, kp * sizeof *pred);
        m->pred = pred ? pred : m->pred;
        float *pred_p = realloc(m->pred_p, kp * sizeof *pred_p);
        m->pred_p = pred_p ? pred_p : m->pred_p;
        uint32_t *routes = realloc(m->routes, k * c->n_layer * sizeof *routes);
        m->routes = routes ? routes : m->routes;
        failed |= !sel || !sw || !pred || !pred_p || !routes;
    }
    if (failed) {
        say(err, errlen, "out of memory for a batch of %u tokens", n);
        return FERRY_ENOMEM;
    }
    m->batch_cap = n;
    return 0;
}

/* Guesses (ferry_prefetch_guess) the experts predicted for layers L + 1 .. L + lookahead_depth
 * by the batch's N tokens, nearest layer first: a wrong guess costs its read, never an expert the
 * policy would have kept. */
static void guess_next(llama *m, uint32_t l, uint32_t n)
{
    const llama_config *c = &m->c;
    for (uint32_t d = 0; m->lookahead && d < m->lookahead_depth && l + 1 + d < c->n_layer; d++) {
        uint8_t want[LLAMA_MAX_EXPERTS] = {0};
        for (uint32_t t = 0; t < n; t++) {
            uint64_t at = pred_at(m, t, l + 1 + d, d);
            for (uint32_t i = 0; i < c->n_expert_used; i++)
                want[m->pred[at + i]] |= m->pred_p[at + i] >= m->lookahead_min;
        }
        uint32_t next[LLAMA_MAX_EXPERTS], kn = 0;
        for (uint32_t e = 0; e < c->n_expert; e++)
            if (want[e])
                next[kn++] = e;
        ferry_tensor *ex[EXP_KINDS * LLAMA_MAX_EXPERTS];
        ferry_prefetch_guess(m->f, ex, experts_list(m, l + 1 + d, next, kn, ex));
    }
}

/* Layer L of a mixture-of-experts model over the N tokens of the batch: attention and routing
 * for each in order, then the experts the batch chose brought in once (moe_experts). */
static int moe_layer(llama *m, uint32_t l, uint32_t n, uint32_t pos0, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    int rc = 0;
    uint8_t used[LLAMA_MAX_EXPERTS] = {0};
    if (n > 1)
        rc = dense_parts_batch(m, l, PART_QKV, PART_WO, n, pos0, err, errlen);
    for (uint32_t t = 0; t < n && !rc; t++) {
        float *xt = m->xs + (uint64_t)t * c->dim;
        memcpy(m->x, xt, c->dim * sizeof *m->x);
        if (n == 1)
            rc = dense_parts(m, l, PART_QKV, PART_WO, pos0 + t, err, errlen);
        if (!rc)
            rc = route(m, l, t, err, errlen);
        if (!rc)
            rc = predict_experts(m, l, t, err, errlen);
        for (uint32_t i = 0; !rc && i < c->n_expert_used; i++)
            used[m->sel[(uint64_t)t * c->n_expert_used + i]] = 1;
        memcpy(xt, m->x, c->dim * sizeof *m->x);
    }
    if (rc)
        return rc;
    /* one token's experts in its own order, best first, so that the best comes in first; a
     * batch's in ascending order */
    uint32_t ids[LLAMA_MAX_EXPERTS] = {0}, k = 0;
    if (n == 1)
        for (; k < c->n_expert_used; k++)
            ids[k] = m->sel[k];
    else
        for (uint32_t e = 0; e < c->n_expert; e++)
            if (used[e])
                ids[k++] = e;
    return moe_experts(m, l, n, ids, k, err, errlen);
}

static int prepare(llama *m, ferry_tensor *const *ts, size_t n, char *err, size_t errlen)
{
    int rc = ferry_prepare(m->f, ts, n);
    if (rc)
        say(err, errlen, "%s", ferry_errmsg(m->f));
    return rc;
}

int llama_forward_batch(llama *m, const uint32_t *tokens, uint32_t n, uint32_t pos0,
                        float *logits, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
    if (n == 0 || pos0 >= m->n_ctx || n > m->n_ctx - pos0) {
        say(err, errlen, "positions %u..%u are outside the context of %u", pos0, pos0 + n,
            m->n_ctx);
        return FERRY_EINVAL;
    }
    int rc = batch_reserve(m, n, err, errlen);
    if (rc)
        return rc;
    m->routes_n = c->n_expert ? n : 0;
    for (uint32_t t = 0; t < n && !rc; t++) {
        rc = embed(m, tokens[t], err, errlen);
        memcpy(m->xs + (uint64_t)t * c->dim, m->x, c->dim * sizeof *m->x);
    }
    if (rc)
        return rc;
    ferry_tensor *cur[LAYER_TENSORS];
    ferry_tensor *hd[2] = {m->output_norm, m->output};
    const int steps = layer_steps(m, n);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        for (int s = 0; s < steps; s++) {
            size_t n_cur = step_list(m, l, steps, s, cur);
            int p0, p1;
            step_parts(steps, s, &p0, &p1);
            if ((rc = prepare(m, cur, n_cur, err, errlen)))
                return rc;
            /* while this step computes, the next one (or the head) is read */
            prefetch_after(m, l, steps, s);
            if (c->n_expert)
                rc = moe_layer(m, l, n, pos0, err, errlen);
            /* each token of the batch in order: the same arithmetic as one call per token (a
             * layer's keys and values depend only on its input, so all the batch's attention
             * may come before its feed-forward) */
            if (n > 1 && !c->n_expert)
                rc = dense_parts_batch(m, l, p0, p1, n, pos0, err, errlen);
            for (uint32_t t = 0; n == 1 && t < n && !rc && !c->n_expert; t++) {
                float *xt = m->xs + (uint64_t)t * c->dim;
                memcpy(m->x, xt, c->dim * sizeof *m->x);
                rc = dense_parts(m, l, p0, p1, pos0 + t, err, errlen);
                memcpy(xt, m->x, c->dim * sizeof *m->x);
            }
            ferry_release(m->f, cur, n_cur);
            if (rc)
                return rc;
        }
    }
    if ((rc = prepare(m, hd, 2, err, errlen)))
        return rc;
    ferry_prefetch(m->f, cur, step_list(m, 0, steps, 0, cur));
    if (n == 1) {
        memcpy(m->x, m->xs, c->dim * sizeof *m->x);
        rc = head(m, err, errlen);
        if (!rc && logits != m->logits)
            memcpy(logits, m->logits, c->vocab * sizeof *logits);
    } else if (!(rc = batch_norm(m, n, m->output_norm, err, errlen))) {
        /* every token's logits from one pass over the head's rows, as head computes each */
        matvec_job j = {.n = 0};
        rc = matvec_add_batch(m, &j, m->output, 0, 0, m->by, c->dim, n, logits, c->vocab, err,
                              errlen);
        if (!rc)
            rc = matvec_run(m, &j, &m->output, err, errlen);
    }
    ferry_release(m->f, hd, 2);
    return rc;
}

const uint32_t *llama_routing(const llama *m, uint32_t t)
{
    if (!m->c.n_expert || t >= m->routes_n)
        return NULL;
    return m->routes + (uint64_t)t * m->c.n_layer * m->c.n_expert_used;
}

void llama_routing_stats(const llama *m, uint64_t *hits, uint64_t *predictions)
{
    llama_routing_stats_depth(m, 0, hits, predictions);
}

void llama_routing_stats_depth(const llama *m, uint32_t d, uint64_t *hits, uint64_t *predictions)
{
    *hits = d < LLAMA_LOOKAHEAD_MAX ? m->pred_hits[d] : 0;
    *predictions = d < LLAMA_LOOKAHEAD_MAX ? m->pred_total[d] : 0;
}

int llama_forward(llama *m, uint32_t token, uint32_t pos, const float **logits, char *err,
                  size_t errlen)
{
    int rc = llama_forward_batch(m, &token, 1, pos, m->logits, err, errlen);
    if (!rc)
        *logits = m->logits;
    return rc;
}
