/*
 * llama.c — the llama decoder of llama.h, one function per step of the forward pass.
 *
 * Weights are matrices of rows x cols in their stored type (GGUF's ne[1] x ne[0]: each row is one
 * output feature, contiguous); the shape comments below are (rows, cols). Activations are f32.
 * Every matrix-vector product is ferry_matvec_q over a block of rows per thread, its input
 * prepared once the way llama.cpp's CPU back end takes it (q8_0 / q8_K blocks for quantized
 * weights, f16 / bf16 precision for f16 / bf16 ones); in runtime LoRA mode each adapter term
 * scale * B.(A.x) is added to the product here, in f32.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "pool.h"

/* The tensors of one transformer block, in the order the forward pass uses them. */
typedef struct layer_weights {
    ferry_tensor *attn_norm; /* (dim) */
    ferry_tensor *wq;        /* (q_dim, dim)   q_dim = n_head * head_dim */
    ferry_tensor *wk;        /* (kv_dim, dim)  kv_dim = n_head_kv * head_dim */
    ferry_tensor *wv;        /* (kv_dim, dim) */
    ferry_tensor *wo;        /* (dim, q_dim) */
    ferry_tensor *ffn_norm;  /* (dim) */
    ferry_tensor *w_gate;    /* (ff, dim) */
    ferry_tensor *w_up;      /* (ff, dim) */
    ferry_tensor *w_down;    /* (dim, ff) */
} layer_weights;
#define LAYER_TENSORS 9

struct llama {
    ferry *f;
    llama_config c;
    uint32_t n_ctx;
    pool *pool;
    int lora_runtime;          /* apply adapter factors here (ferry merges them otherwise) */

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
    void *xq[3];               /* (vec_bytes) the inputs of a job's products, prepared */
    uint64_t vec_bytes;
    float *lora_tmp;           /* (max_rank) A.x of a runtime adapter */
    float *xs;                 /* (batch_cap, dim) the residual streams of a batch */
    uint32_t batch_cap;
    uint32_t max_rank;
    float *k, *v;              /* (kv_dim) this position's key and value */
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
    if (ferry_catalog_get_str(cat, "general.architecture", &arch) || strcmp(arch, "llama") != 0) {
        say(err, errlen, "general.architecture is %s%s%s, not llama", arch ? "'" : "",
            arch ? arch : "missing", arch ? "'" : "");
        return FERRY_EUNSUPPORTED;
    }
    int rc = 0;
    rc = rc ? rc : meta_u32(cat, "llama.block_count", 0, 1, &c->n_layer, err, errlen);
    rc = rc ? rc : meta_u32(cat, "llama.embedding_length", 0, 1, &c->dim, err, errlen);
    rc = rc ? rc : meta_u32(cat, "llama.feed_forward_length", 0, 1, &c->ff, err, errlen);
    rc = rc ? rc : meta_u32(cat, "llama.attention.head_count", 0, 1, &c->n_head, err, errlen);
    if (rc)
        return rc;
    rc = meta_u32(cat, "llama.attention.head_count_kv", c->n_head, 0, &c->n_head_kv, err, errlen);
    rc = rc ? rc
            : meta_u32(cat, "llama.attention.key_length", c->dim / c->n_head, 0, &c->head_dim,
                       err, errlen);
    if (rc)
        return rc;
    if (c->head_dim == 0 || c->n_head % c->n_head_kv != 0 || c->head_dim % 2 != 0) {
        say(err, errlen, "attention: %u heads, %u kv heads, head size %u do not fit together",
            c->n_head, c->n_head_kv, c->head_dim);
        return FERRY_EFORMAT;
    }
    rc = meta_u32(cat, "llama.rope.dimension_count", c->head_dim, 0, &c->rope_dim, err, errlen);
    if (rc)
        return rc;
    if (c->rope_dim > c->head_dim || c->rope_dim % 2 != 0) {
        say(err, errlen, "llama.rope.dimension_count %u does not fit head size %u", c->rope_dim,
            c->head_dim);
        return FERRY_EFORMAT;
    }
    double base = 10000.0, eps = 1e-5;
    if (ferry_catalog_get_f64(cat, "llama.rope.freq_base", &base) == FERRY_ETYPE ||
        ferry_catalog_get_f64(cat, "llama.attention.layer_norm_rms_epsilon", &eps) ==
            FERRY_ETYPE) {
        say(err, errlen, "llama.rope.freq_base or layer_norm_rms_epsilon is not a number");
        return FERRY_EFORMAT;
    }
    if (!(base > 0) || !(eps >= 0) || !(eps < 1)) {
        say(err, errlen, "rope base %g or rms epsilon %g out of range", base, eps);
        return FERRY_EFORMAT;
    }
    c->rope_base = (float)base;
    c->eps = (float)eps;
    uint64_t ctx = 0;
    if (ferry_catalog_get_u64(cat, "llama.context_length", &ctx) == 0 && ctx <= UINT32_MAX)
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
    return 0;
}

uint64_t llama_memory_bytes(const llama_config *c, uint32_t n_ctx, int n_threads)
{
    (void)n_threads; /* the kernels use only their stack */
    uint64_t kv = 2ull * c->n_layer * n_ctx * c->kv_dim * sizeof(uint16_t);
    uint64_t act = (3ull * c->dim + 2ull * c->q_dim + 2ull * c->kv_dim + 2ull * c->ff +
                    c->vocab) * sizeof(float);
    uint64_t row = (uint64_t)c->dim * 8 + 256; /* one embedding row in any stored type */
    uint32_t widest = c->dim > c->ff ? c->dim : c->ff;
    widest = widest > c->q_dim ? widest : c->q_dim;
    uint64_t vec = 3ull * widest * sizeof(float); /* the prepared inputs of one job */
    return kv + act + row + vec;
}

/* ---- the weights ---------------------------------------------------------------------------- */

/* Finds NAME and states its shape (GGUF order: cols first); any dtype. */
static ferry_tensor *want(ferry *f, const char *name, uint64_t cols, uint64_t rows, char *err,
                          size_t errlen)
{
    ferry_tensor *t = ferry_find(f, name);
    if (!t) {
        say(err, errlen, "tensor %s: missing", name);
        return NULL;
    }
    int64_t shape[2] = {(int64_t)cols, (int64_t)rows};
    if (ferry_expect(f, name, FERRY_DTYPE_NONE, rows ? 2 : 1, shape)) {
        say(err, errlen, "%s", ferry_errmsg(f));
        return NULL;
    }
    return t;
}

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
        W(ffn_norm, "ffn_norm", c->dim, 0);
        W(w_gate, "ffn_gate", c->dim, c->ff);
        W(w_up, "ffn_up", c->dim, c->ff);
        W(w_down, "ffn_down", c->ff, c->dim);
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
    for (int k = 0; k < 3; k++) {
        m->xq[k] = malloc(m->vec_bytes);
        failed |= !m->xq[k];
    }
    m->embd_row = malloc(m->embd_row_bytes);
    failed |= !m->embd_row;
    m->k = alloc_floats(c->kv_dim, &failed);
    m->v = alloc_floats(c->kv_dim, &failed);
    uint64_t cache = (uint64_t)c->n_layer * n_ctx * c->kv_dim;
    m->key_cache = calloc(cache, sizeof *m->key_cache);
    m->value_cache = calloc(cache, sizeof *m->value_cache);
    failed |= !m->key_cache || !m->value_cache;
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
    for (int k = 0; k < 3; k++)
        free(m->xq[k]);
    free(m->k);
    free(m->v);
    free(m->key_cache);
    free(m->value_cache);
    free(m);
}

const llama_config *llama_get_config(const llama *m) { return &m->c; }

void llama_set_lora_runtime(llama *m, int on) { m->lora_runtime = on; }

/* ---- matrix-vector products over the pool -------------------------------------------------- */

typedef struct matvec_op {
    ferry_dtype t;
    const uint8_t *w;  /* rows x cols, row_bytes each */
    uint64_t rows, cols, row_bytes;
    const float *x;    /* (cols) */
    const void *xq;    /* x prepared for W's type (ferry_matvec_vec_quantize) */
    float *y;          /* (rows) */
} matvec_op;

typedef struct matvec_job {
    matvec_op op[3];   /* products that share the same input run in one job */
    int n;
} matvec_job;

static void matvec_work(void *arg, int ith, int nth)
{
    matvec_job *j = arg;
    for (int k = 0; k < j->n; k++) {
        const matvec_op *o = &j->op[k];
        uint64_t r0 = o->rows * (uint64_t)ith / (uint64_t)nth;
        uint64_t r1 = o->rows * (uint64_t)(ith + 1) / (uint64_t)nth;
        if (r1 > r0) /* checked by matvec_add before the job started */
            (void)ferry_matvec_q(o->t, o->w + r0 * o->row_bytes, r1 - r0, o->cols, o->xq,
                                 o->y + r0);
    }
}

/* Adds W.x -> y (W prepared) to the job, after checking ferry can compute with W's type. */
static int matvec_add(llama *m, matvec_job *j, ferry_tensor *w, const float *x, float *y,
                      char *err, size_t errlen)
{
    ferry_tensor_info ti;
    ferry_tensor_get_info(w, &ti);
    matvec_op *o = &j->op[j->n];
    o->t = ferry_tensor_dtype(w);
    o->w = ferry_tensor_data(w);
    o->rows = ti.n_rows;
    o->cols = ti.row_elems;
    o->x = x;
    o->y = y;
    int rc = ferry_dtype_nbytes(o->t, o->cols, &o->row_bytes);
    if (!rc && !o->w)
        rc = FERRY_EUNSUPPORTED;
    /* the vector in the form W's dot product takes, as llama.cpp rounds it */
    if (!rc && ferry_matvec_vec_bytes(o->t, o->cols) > m->vec_bytes)
        rc = FERRY_ESHAPE;
    if (!rc)
        rc = ferry_matvec_vec_quantize(o->t, x, o->cols, m->xq[j->n]);
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

/* Runtime LoRA: y += scale * B.(A.x) for every adapter term of W. */
static int lora_apply(llama *m, ferry_tensor *w, const float *x, float *y, char *err,
                      size_t errlen)
{
    ferry_lora_factor fac;
    for (size_t i = 0; m->lora_runtime && ferry_lora_factors(m->f, w, i, &fac) == 0; i++) {
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
    pool_run(m->pool, matvec_work, j);
    for (int k = 0; k < j->n; k++) {
        int rc = lora_apply(m, ws[k], j->op[k].x, j->op[k].y, err, errlen);
        if (rc)
            return rc;
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

/* ---- half precision, for the KV cache and attention ------------------------------------------ */

/* f32 -> f16 bits, round to nearest even; beyond the range gives Inf, NaN stays NaN. */
static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x47800000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* a subnormal half: 0.5 + |f| puts the last place at 2^-24 */
        float r = fabsf(f) + 0.5f;
        uint32_t rb;
        memcpy(&rb, &r, sizeof rb);
        return (uint16_t)(sign | (rb - 0x3f000000u));
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    float f;
    if (em >= 0x7c00u) {
        u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
    } else if (em >= 0x400u) {
        u = sign | ((em << 13) + ((127u - 15u) << 23));
    } else {
        f = (float)em * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

static float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

/* q . k for f16 K, summed in the order of ggml's f16 dot product in llama.cpp's AVX-512 builds:
 * four 16-lane fused multiply-add accumulators over steps of 64 elements, combined pairwise and
 * across lanes as _mm512_reduce_add_ps does; the rest added in order. Attention is where a last
 * bit decides later roundings (the f16 sum, then q8 vectors), so the order matters for matching. */
static float dot_qk(const float *q, const uint16_t *k, uint32_t n)
{
    float lane[4][16] = {{0}};
    uint32_t np = n & ~63u;
    for (uint32_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++)
                lane[j][l] = fmaf(f16_to_f32(k[i + 16 * j + l]), q[i + 16 * j + l], lane[j][l]);
    float x[16], t[8];
    for (int l = 0; l < 16; l++)
        x[l] = (lane[0][l] + lane[2][l]) + (lane[1][l] + lane[3][l]);
    for (int l = 0; l < 8; l++)
        t[l] = x[l] + x[l + 8];
    for (int l = 0; l < 4; l++)
        t[l] = t[l] + t[l + 4];
    double sum = (t[0] + t[2]) + (t[1] + t[3]);
    for (uint32_t i = np; i < n; i++)
        sum += (double)(f16_to_f32(k[i]) * q[i]);
    return (float)sum;
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

/* out = x / rms(x) * weight, weight (n) f32 (GGUF keeps norms in f32). */
static int rmsnorm(llama *m, float *out, const float *x, ferry_tensor *weight, char *err,
                   size_t errlen)
{
    uint32_t n = m->c.dim;
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

/* Rotates the first rope_dim elements of each head of V (n_heads heads) by position POS, in
 * adjacent pairs (llama.cpp's normal mode): pair i turns by pos * base^(-2i / rope_dim). */
static void rope(const llama_config *c, float *v, uint32_t n_heads, uint32_t pos)
{
    float theta_scale = powf(c->rope_base, -2.0f / (float)c->rope_dim);
    for (uint32_t h = 0; h < n_heads; h++) {
        float *p = v + (uint64_t)h * c->head_dim;
        float theta = (float)pos;
        for (uint32_t i = 0; i < c->rope_dim; i += 2) {
            float cs = cosf(theta), sn = sinf(theta);
            float x0 = p[i], x1 = p[i + 1];
            p[i] = x0 * cs - x1 * sn;
            p[i + 1] = x0 * sn + x1 * cs;
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
            float s = dot_qk(q, k, hd) * scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > max) { /* a new maximum: what was summed shrinks by exp(old - new) */
                ms = expf(max - s);
                max = s;
                for (uint32_t i = 0; i < hd; i++)
                    out[i] = round_f16(out[i] * ms);
            } else {
                vs = expf(s - max);
            }
            for (uint32_t i = 0; i < hd; i++)
                out[i] = round_f16(out[i] + f16_to_f32(v[i]) * vs);
            sum = sum * ms + vs;
        }
        float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (uint32_t i = 0; i < hd; i++)
            out[i] *= inv;
    }
}

/* x += Wo . attention(RoPE(Wq.xb), KV cache with RoPE(Wk.xb), Wv.xb), xb = rmsnorm(x). */
static int attention_block(llama *m, uint32_t l, uint32_t pos, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
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
    rc = matvec(m, w->wo, m->att_out, m->proj, err, errlen);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < c->dim; i++)
        m->x[i] += m->proj[i];
    return 0;
}

/* x += W_down . (silu(W_gate.xb) * W_up.xb), xb = rmsnorm(x). */
static int ffn_block(llama *m, uint32_t l, char *err, size_t errlen)
{
    const llama_config *c = &m->c;
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
    for (uint32_t i = 0; i < c->ff; i++) {
        float g = m->hb[i];
        m->hb[i] = g / (1.0f + vexpf(-g)) * m->hb2[i];
    }
    rc = matvec(m, w->w_down, m->hb, m->proj, err, errlen);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < c->dim; i++)
        m->x[i] += m->proj[i];
    return 0;
}

/* logits = output . rmsnorm(x). */
static int head(llama *m, char *err, size_t errlen)
{
    int rc = rmsnorm(m, m->xb, m->x, m->output_norm, err, errlen);
    return rc ? rc : matvec(m, m->output, m->xb, m->logits, err, errlen);
}

/* ---- residency around the steps ------------------------------------------------------------ */

static void layer_list(llama *m, uint32_t l, ferry_tensor *ts[LAYER_TENSORS])
{
    layer_weights *w = &m->layers[l];
    ferry_tensor *all[LAYER_TENSORS] = {w->attn_norm, w->wq,     w->wk,   w->wv,    w->wo,
                                        w->ffn_norm,  w->w_gate, w->w_up, w->w_down};
    memcpy(ts, all, sizeof all);
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
    if (n > m->batch_cap) {
        float *xs = realloc(m->xs, (uint64_t)n * c->dim * sizeof *xs);
        if (!xs) {
            say(err, errlen, "out of memory for a batch of %u tokens", n);
            return FERRY_ENOMEM;
        }
        m->xs = xs;
        m->batch_cap = n;
    }
    int rc = 0;
    for (uint32_t t = 0; t < n && !rc; t++) {
        rc = embed(m, tokens[t], err, errlen);
        memcpy(m->xs + (uint64_t)t * c->dim, m->x, c->dim * sizeof *m->x);
    }
    if (rc)
        return rc;
    ferry_tensor *cur[LAYER_TENSORS], *next[LAYER_TENSORS];
    ferry_tensor *hd[2] = {m->output_norm, m->output};
    for (uint32_t l = 0; l < c->n_layer; l++) {
        layer_list(m, l, cur);
        if ((rc = prepare(m, cur, LAYER_TENSORS, err, errlen)))
            return rc;
        /* while this layer computes, the next one (or the head) is read */
        if (l + 1 < c->n_layer) {
            layer_list(m, l + 1, next);
            ferry_prefetch(m->f, next, LAYER_TENSORS);
        } else {
            ferry_prefetch(m->f, hd, 2);
        }
        /* each token of the batch in order: the same arithmetic as one call per token */
        for (uint32_t t = 0; t < n && !rc; t++) {
            float *xt = m->xs + (uint64_t)t * c->dim;
            memcpy(m->x, xt, c->dim * sizeof *m->x);
            rc = attention_block(m, l, pos0 + t, err, errlen);
            if (!rc)
                rc = ffn_block(m, l, err, errlen);
            memcpy(xt, m->x, c->dim * sizeof *m->x);
        }
        ferry_release(m->f, cur, LAYER_TENSORS);
        if (rc)
            return rc;
    }
    if ((rc = prepare(m, hd, 2, err, errlen)))
        return rc;
    layer_list(m, 0, next);
    ferry_prefetch(m->f, next, LAYER_TENSORS);
    for (uint32_t t = 0; t < n && !rc; t++) {
        memcpy(m->x, m->xs + (uint64_t)t * c->dim, c->dim * sizeof *m->x);
        rc = head(m, err, errlen);
        if (!rc && logits != m->logits)
            memcpy(logits + (uint64_t)t * c->vocab, m->logits, c->vocab * sizeof *logits);
    }
    ferry_release(m->f, hd, 2);
    return rc;
}

int llama_forward(llama *m, uint32_t token, uint32_t pos, const float **logits, char *err,
                  size_t errlen)
{
    int rc = llama_forward_batch(m, &token, 1, pos, m->logits, err, errlen);
    if (!rc)
        *logits = m->logits;
    return rc;
}
