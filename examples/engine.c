/*
 * engine.c — how an inference engine integrates ferry, as a small program that decodes a few
 * tokens through a llama-shaped model layer by layer, using only the public header <ferry.h>.
 *
 * It does what a real engine does around its kernels:
 *   1. creates a manager, optionally with an accelerator (--device) and budgets;
 *   2. opens the model (GGUF or safetensors, the format is detected from the content);
 *   3. places tensors with groups: the token embedding is lazy (only the rows of the tokens seen
 *      are ever read, with ferry_read_rows), the blocks are streamed from disk (or kept in host
 *      RAM / on the device with --home), the output head is kept;
 *   4. reads the model's dimensions from its metadata and states what it expects of every tensor
 *      it will use (ferry_expect), then lets ferry_validate report every mismatch at once;
 *   5. per token, per layer: prepare the layer's tensors (blocks until their data pointers are
 *      valid), hint the next layer with ferry_prefetch, compute, release;
 *   6. prints ferry's statistics: bytes read, prefetch hits and misses, time spent waiting, peaks.
 *
 * The arithmetic is a real llama block for a context of one token (no KV cache: attention over a
 * single position returns V, expanded over the heads that share it): RMS norms, the q/k/v/o
 * projections, the SwiGLU feed-forward and the output head, as mat-vecs (ferry_matvec). It runs
 * only when the weights are computed on the cpu, where ferry_tensor_data is host memory. On
 * another device (sim, cuda) the data pointers are device addresses that only that device's
 * kernels could read, so this program moves the weights exactly as an engine would but computes
 * nothing.
 *
 *   usage: ferry_example_engine MODEL [--device SPEC] [--budget SIZE] [--host-budget SIZE]
 *                               [--home disk|host|device] [--f32] [--tokens N] [--dim N]
 *
 * Exit status: 0 success, 1 a ferry call failed (its message is printed), 2 usage error.
 */
#include <ferry.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tensors of one transformer block, in the order the engine uses them. */
enum {
    ATTN_NORM,
    ATTN_Q,
    ATTN_K,
    ATTN_V,
    ATTN_OUT,
    FFN_NORM,
    FFN_GATE,
    FFN_UP,
    FFN_DOWN,
    N_PARTS
};
static const char *const part_names[N_PARTS] = {
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_norm",  "ffn_gate", "ffn_up", "ffn_down",
};

typedef struct options {
    const char *model;
    const char *device;       /* NULL: compute on the cpu */
    uint64_t budget;          /* budget of the compute device, 0: its default */
    uint64_t host_budget;     /* 0: the default host budget */
    ferry_home home;          /* home of the blocks */
    int f32;                  /* stage weights converted to f32 */
    unsigned tokens;
    uint64_t force_dim;       /* nonzero: expect this width instead of the metadata's */
} options;

/* The model's dimensions. Weights are matrices of `rows` (output features, the outermost
 * dimension) by `cols` (input features, the innermost dimension, contiguous in memory). */
typedef struct dims {
    uint64_t layers, dim, ff, vocab, heads, kv_heads, kv_dim;
    double eps;
} dims;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ferry_example_engine MODEL [options]\n"
            "  --device SPEC       compute the blocks and the head there: cpu (default),\n"
            "                      sim:1GiB@20GB/s, cuda:0\n"
            "  --budget SIZE       byte budget of that device (e.g. 64MiB)\n"
            "  --host-budget SIZE  host RAM ferry may hold (default: what the host can give,\n"
            "                      less a margin)\n"
            "  --home disk|host|device\n"
            "                      where the blocks live between uses (default disk: streamed)\n"
            "  --f32               stage the weights converted to f32\n"
            "  --tokens N          tokens to decode (default 4)\n"
            "  --dim N             expect width N instead of the metadata's (shows how\n"
            "                      ferry_validate reports every mismatch)\n");
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->home = FERRY_HOME_DISK;
    o->tokens = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes_value = strcmp(a, "--device") == 0 || strcmp(a, "--budget") == 0 ||
                          strcmp(a, "--host-budget") == 0 || strcmp(a, "--home") == 0 ||
                          strcmp(a, "--tokens") == 0 || strcmp(a, "--dim") == 0;
        if (takes_value && !v) {
            fprintf(stderr, "engine: %s needs a value\n", a);
            return -1;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--device") == 0) {
            o->device = v;
        } else if (strcmp(a, "--budget") == 0 || strcmp(a, "--host-budget") == 0) {
            uint64_t *dst = a[2] == 'b' ? &o->budget : &o->host_budget;
            if (ferry_parse_size(v, dst) != 0) {
                fprintf(stderr, "engine: %s: bad size '%s'\n", a, v);
                return -1;
            }
        } else if (strcmp(a, "--home") == 0) {
            if (strcmp(v, "disk") == 0)
                o->home = FERRY_HOME_DISK;
            else if (strcmp(v, "host") == 0)
                o->home = FERRY_HOME_HOST;
            else if (strcmp(v, "device") == 0)
                o->home = FERRY_HOME_DEVICE;
            else {
                fprintf(stderr, "engine: --home: expected disk, host or device, not '%s'\n", v);
                return -1;
            }
        } else if (strcmp(a, "--tokens") == 0 || strcmp(a, "--dim") == 0) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(v, &end, 10);
            if (v[0] < '0' || v[0] > '9' || *end || errno || n == 0 || n > 1000000) {
                fprintf(stderr, "engine: %s: bad number '%s'\n", a, v);
                return -1;
            }
            if (a[2] == 't')
                o->tokens = (unsigned)n;
            else
                o->force_dim = n;
        } else if (strcmp(a, "--f32") == 0) {
            o->f32 = 1;
        } else if (a[0] == '-') {
            fprintf(stderr, "engine: unknown option '%s'\n", a);
            return -1;
        } else if (!o->model) {
            o->model = a;
        } else {
            fprintf(stderr, "engine: more than one model given ('%s')\n", a);
            return -1;
        }
        if (takes_value)
            i++;
    }
    if (!o->model) {
        fprintf(stderr, "engine: no model given\n");
        return -1;
    }
    return 0;
}

/* Prints what failed with ferry's own message (which names the file, tensor and numbers). */
static int fail(ferry *f, const char *what, int rc)
{
    fprintf(stderr, "engine: %s: %s\n%s\n", what, ferry_strerror(rc), f ? ferry_errmsg(f) : "");
    return 1;
}

/* ---- dimensions, from metadata with the tensors as fallback ------------------------------- */

/* ARCH.KEY as an unsigned number. GGUF stores numbers; safetensors' __metadata__ holds only
 * strings, so a decimal string is accepted too. 1 when found. */
static int meta_u64(const ferry_catalog *c, const char *arch, const char *key, uint64_t *out)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (ferry_catalog_get_u64(c, full, out) == 0)
        return 1;
    const char *s;
    if (ferry_catalog_get_str(c, full, &s) == 0 && s[0] >= '0' && s[0] <= '9') {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (!*end && !errno) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

static int meta_f64(const ferry_catalog *c, const char *arch, const char *key, double *out)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (ferry_catalog_get_f64(c, full, out) == 0)
        return 1;
    const char *s;
    if (ferry_catalog_get_str(c, full, &s) == 0) {
        char *end;
        double v = strtod(s, &end);
        if (end != s && !*end && isfinite(v)) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* The row view of tensor NAME in the catalog (the same for GGUF and safetensors). */
static int tensor_rows(const ferry_catalog *c, const char *name, uint64_t *rows, uint64_t *cols)
{
    int64_t i = ferry_catalog_find(c, name);
    ferry_tensor_info info;
    if (i < 0 || ferry_catalog_tensor(c, (size_t)i, &info) != 0)
        return 0;
    *rows = info.n_rows;
    *cols = info.row_elems;
    return 1;
}

static int read_dims(const ferry_catalog *c, dims *d)
{
    memset(d, 0, sizeof *d);
    const char *arch = "llama";
    ferry_catalog_get_str(c, "general.architecture", &arch); /* unchanged when absent */
    uint64_t emb_rows = 0, emb_cols = 0, rows, cols;
    tensor_rows(c, "token_embd.weight", &emb_rows, &emb_cols);

    if (!meta_u64(c, arch, "embedding_length", &d->dim))
        d->dim = emb_cols;
    if (!meta_u64(c, arch, "vocab_size", &d->vocab))
        d->vocab = emb_rows; /* real GGUF files often give the vocabulary only as tokens */
    if (!meta_u64(c, arch, "feed_forward_length", &d->ff) &&
        tensor_rows(c, "blk.0.ffn_up.weight", &rows, &cols))
        d->ff = rows;
    if (!meta_u64(c, arch, "block_count", &d->layers)) {
        char name[64];
        for (;; d->layers++) {
            snprintf(name, sizeof name, "blk.%llu.attn_q.weight", (unsigned long long)d->layers);
            if (ferry_catalog_find(c, name) < 0)
                break;
        }
    }
    if (!meta_u64(c, arch, "attention.head_count", &d->heads))
        d->heads = 1;
    if (!meta_u64(c, arch, "attention.head_count_kv", &d->kv_heads))
        d->kv_heads = d->heads;
    if (!meta_f64(c, arch, "attention.layer_norm_rms_epsilon", &d->eps))
        d->eps = 1e-5;
    if (!d->dim || !d->vocab || !d->ff || !d->layers || !d->heads || !d->kv_heads ||
        d->dim % d->heads || d->heads % d->kv_heads) {
        fprintf(stderr,
                "engine: not a llama-shaped model (dim %llu, vocab %llu, ff %llu, layers %llu, "
                "heads %llu/%llu)\n",
                (unsigned long long)d->dim, (unsigned long long)d->vocab,
                (unsigned long long)d->ff, (unsigned long long)d->layers,
                (unsigned long long)d->heads, (unsigned long long)d->kv_heads);
        return -1;
    }
    d->kv_dim = d->dim / d->heads * d->kv_heads;
    return 0;
}

/* ---- expectations --------------------------------------------------------------------------- */

/* States that NAME is a ROWS x COLS matrix (COLS == 0: a vector of ROWS), of any dtype. Shapes
 * are given in the file's own order: GGUF lists the innermost dimension first, safetensors the
 * outermost first. */
static int expect(ferry *f, ferry_format fmt, const char *name, uint64_t rows, uint64_t cols)
{
    int64_t shape[2];
    if (!cols) {
        shape[0] = (int64_t)rows;
        return ferry_expect(f, name, FERRY_DTYPE_NONE, 1, shape);
    }
    shape[0] = (int64_t)(fmt == FERRY_FORMAT_GGUF ? cols : rows);
    shape[1] = (int64_t)(fmt == FERRY_FORMAT_GGUF ? rows : cols);
    return ferry_expect(f, name, FERRY_DTYPE_NONE, 2, shape);
}

static int expect_all(ferry *f, ferry_format fmt, const dims *d)
{
    int rc = expect(f, fmt, "token_embd.weight", d->vocab, d->dim);
    if (!rc)
        rc = expect(f, fmt, "output_norm.weight", d->dim, 0);
    if (!rc)
        rc = expect(f, fmt, "output.weight", d->vocab, d->dim);
    const uint64_t rows[N_PARTS] = {d->dim, d->dim, d->kv_dim, d->kv_dim, d->dim,
                                    d->dim, d->ff,  d->ff,     d->dim};
    const uint64_t cols[N_PARTS] = {0, d->dim, d->dim, d->dim, d->dim, 0, d->dim, d->dim, d->ff};
    for (uint64_t l = 0; l < d->layers && !rc; l++) {
        for (int p = 0; p < N_PARTS && !rc; p++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%llu.%s.weight", (unsigned long long)l,
                     part_names[p]);
            rc = expect(f, fmt, name, rows[p], cols[p]);
        }
    }
    return rc;
}

/* ---- the arithmetic (host memory only) ------------------------------------------------------ */

/* Y = W . X for the prepared weight T: W has n_rows rows of row_elems elements, in the dtype ferry
 * staged it in (ferry_tensor_dtype: the file's, or f32 with --f32). ferry_matvec dequantizes on
 * the fly, as a decode kernel does. */
static int matvec(ferry_tensor *t, const float *x, float *y)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    return ferry_matvec(ferry_tensor_dtype(t), ferry_tensor_data(t), info.n_rows, info.row_elems,
                        x, y);
}

/* OUT = X / rms(X) * weight (a vector tensor). */
static int rmsnorm(ferry_tensor *weight, const float *x, float *out, uint64_t n, double eps,
                   float *row)
{
    int rc = ferry_dtype_convert(ferry_tensor_dtype(weight), ferry_tensor_data(weight),
                                 FERRY_DTYPE_F32, row, n);
    if (rc)
        return rc;
    double ss = 0;
    for (uint64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (uint64_t i = 0; i < n; i++)
        out[i] = x[i] * scale * row[i];
    return 0;
}

/* The activations: every vector is max(dim, ff, vocab) floats. */
typedef struct scratch {
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *tmp, *logits, *row;
} scratch;

static int scratch_alloc(scratch *s, uint64_t n)
{
    float **all[] = {&s->x,  &s->xn, &s->q,   &s->k,      &s->v,  &s->att,
                     &s->gate, &s->up, &s->tmp, &s->logits, &s->row};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!(*all[i] = calloc(n, sizeof(float))))
            return -1;
    return 0;
}

static void scratch_free(scratch *s)
{
    float *all[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->gate, s->up, s->tmp, s->logits,
                    s->row};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* One llama block on X (in place), for a context of one token. */
static int block_forward(ferry_tensor *const *w, const dims *d, scratch *s)
{
    int rc = rmsnorm(w[ATTN_NORM], s->x, s->xn, d->dim, d->eps, s->row);
    if (!rc)
        rc = matvec(w[ATTN_Q], s->xn, s->q);
    if (!rc)
        rc = matvec(w[ATTN_K], s->xn, s->k);
    if (!rc)
        rc = matvec(w[ATTN_V], s->xn, s->v);
    if (rc)
        return rc;
    /* Softmax over one position is 1: each head's output is the V of its key/value head. */
    uint64_t head_dim = d->dim / d->heads, group = d->heads / d->kv_heads;
    for (uint64_t i = 0; i < d->dim; i++) {
        uint64_t h = i / head_dim;
        s->att[i] = s->v[(h / group) * head_dim + i % head_dim];
    }
    if ((rc = matvec(w[ATTN_OUT], s->att, s->tmp)) != 0)
        return rc;
    for (uint64_t i = 0; i < d->dim; i++)
        s->x[i] += s->tmp[i];
    rc = rmsnorm(w[FFN_NORM], s->x, s->xn, d->dim, d->eps, s->row);
    if (!rc)
        rc = matvec(w[FFN_GATE], s->xn, s->gate);
    if (!rc)
        rc = matvec(w[FFN_UP], s->xn, s->up);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < d->ff; i++)
        s->gate[i] = s->gate[i] / (1.0f + expf(-s->gate[i])) * s->up[i]; /* SiLU(gate) * up */
    if ((rc = matvec(w[FFN_DOWN], s->gate, s->tmp)) != 0)
        return rc;
    for (uint64_t i = 0; i < d->dim; i++)
        s->x[i] += s->tmp[i];
    return 0;
}

/* FNV-1a over the bits of the logits: equal runs give equal checksums, whatever the placement. */
static uint64_t checksum(uint64_t h, const float *v, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        for (int b = 0; b < 4; b++) {
            h ^= (bits >> (8 * b)) & 0xffu;
            h *= UINT64_C(0x100000001b3);
        }
    }
    return h;
}

static void print_stats(ferry *f, int dev, const char *dev_name)
{
    ferry_stats st;
    char a[32], b[32];
    ferry_get_stats(f, &st);
    printf("stats: prepares %llu, prefetch hits %llu, misses %llu, evictions %llu\n",
           (unsigned long long)st.prepares, (unsigned long long)st.prefetch_hits,
           (unsigned long long)st.prefetch_misses, (unsigned long long)st.evictions);
    printf("stats: bytes_read=%llu (%s), bytes_copied=%llu (%s), wait %.3f ms\n",
           (unsigned long long)st.bytes_read, ferry_format_size(st.bytes_read, a),
           (unsigned long long)st.bytes_copied, ferry_format_size(st.bytes_copied, b),
           st.wait_seconds * 1e3);
    printf("stats: peak host %s", ferry_format_size(st.peak_bytes[0], a));
    if (dev)
        printf(", peak %s %s", dev_name, ferry_format_size(st.peak_bytes[dev], b));
    printf(" (resident now: host %s)\n", ferry_format_size(st.resident_bytes[0], a));
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }

    /* 1. The manager. The cpu is device 0; an accelerator gets the next id. */
    ferry *f = ferry_create(NULL);
    if (!f) {
        fprintf(stderr, "engine: out of memory\n");
        return 1;
    }
    int status = 1, rc, dev = 0;
    ferry_tensor **blocks = NULL;
    scratch s = {0};
    if (o.device && strcmp(o.device, "cpu") != 0 &&
        (rc = ferry_add_device(f, o.device, &dev)) != 0) {
        fail(f, o.device, rc);
        goto out;
    }
    if (o.budget && (rc = ferry_set_budget(f, dev, o.budget)) != 0) {
        fail(f, "budget", rc);
        goto out;
    }
    /* 0 keeps the default host budget: what the host can give, less a margin (ferry.h) */
    if (o.host_budget && (rc = ferry_set_budget(f, 0, o.host_budget)) != 0) {
        fail(f, "host budget", rc);
        goto out;
    }
    int host_compute = dev == 0; /* ferry_tensor_data is host memory only on the cpu */

    /* 2. The model. */
    if ((rc = ferry_open(f, o.model, NULL)) != 0) {
        fail(f, o.model, rc);
        goto out;
    }
    const ferry_catalog *cat = ferry_catalog_of(f);
    ferry_format fmt = ferry_catalog_file_format(cat, 0);

    /* 3. Placement, before any tensor is used (a used tensor cannot change group). The embedding
     * is lazy: it stays behind the file mapping and only the rows of the tokens seen are read.
     * The blocks are streamed (home disk) unless --home says otherwise, and computed on the chosen
     * device, converted to f32 on the way with --f32; the head is kept. */
    ferry_policy emb = {0};
    emb.lazy = FERRY_LAZY_ON;
    ferry_policy blk = {0};
    blk.home = o.home;
    blk.compute_device = dev;
    blk.convert = o.f32;
    blk.compute_dtype = FERRY_DTYPE_F32;
    ferry_policy head = blk;
    head.home = FERRY_HOME_HOST;
    if ((rc = ferry_group_add(f, "embedding", "token_embd.*", &emb)) != 0 ||
        (rc = ferry_group_add(f, "blocks", "blk.*", &blk)) != 0 ||
        (rc = ferry_group_add(f, "head", "output*", &head)) != 0) {
        fail(f, "groups", rc);
        goto out;
    }

    /* 4. What the engine expects, from the metadata; validate checks it (and every tensor's
     * placement) and reports every problem at once. */
    dims d;
    if (read_dims(cat, &d))
        goto out;
    if (o.force_dim)
        d.dim = o.force_dim, d.kv_dim = o.force_dim / d.heads * d.kv_heads;
    /* Many models tie the output head to the embedding and have no output.weight. */
    if ((rc = ferry_optional(f, "output.weight")) != 0 || (rc = expect_all(f, fmt, &d)) != 0) {
        fail(f, "expectations", rc);
        goto out;
    }
    if ((rc = ferry_validate(f)) != 0) {
        fprintf(stderr, "engine: the model does not match what the engine expects:\n%s\n",
                ferry_errmsg(f));
        goto out;
    }
    printf("model %s: %s, %llu layers, dim %llu, ff %llu, vocab %llu, heads %llu/%llu\n",
           o.model, ferry_format_name(fmt), (unsigned long long)d.layers,
           (unsigned long long)d.dim, (unsigned long long)d.ff, (unsigned long long)d.vocab,
           (unsigned long long)d.heads, (unsigned long long)d.kv_heads);

    /* The dry run: what the placement will hold where, before anything is loaded. */
    ferry_plan_totals plan;
    if ((rc = ferry_plan(f, NULL, NULL, &plan)) != 0) {
        fail(f, "plan", rc);
        goto out;
    }
    char p1[32], p2[32], p3[32], p4[32], p5[32];
    printf("plan: host %s, mapped %s, streamed from disk %s; on %s: kept %s, staged %s\n",
           ferry_format_size(plan.host_bytes, p1), ferry_format_size(plan.mapped_bytes, p2),
           ferry_format_size(plan.disk_bytes, p3), o.device ? o.device : "cpu",
           ferry_format_size(plan.device_bytes[dev], p4),
           ferry_format_size(plan.staged_bytes[dev], p5));

    /* The handles, found once. */
    ferry_tensor *embd = ferry_find(f, "token_embd.weight");
    ferry_tensor *head_set[2] = {ferry_find(f, "output_norm.weight"),
                                 ferry_find(f, "output.weight")};
    if (!head_set[1])
        head_set[1] = embd; /* tied embeddings */
    blocks = calloc(d.layers * N_PARTS, sizeof *blocks);
    if (!blocks) {
        fprintf(stderr, "engine: out of memory\n");
        goto out;
    }
    for (uint64_t l = 0; l < d.layers; l++) {
        for (int p = 0; p < N_PARTS; p++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%llu.%s.weight", (unsigned long long)l,
                     part_names[p]);
            if (!(blocks[l * N_PARTS + p] = ferry_find(f, name))) {
                fail(f, name, FERRY_ENOENT);
                goto out;
            }
        }
    }
    if (!embd || !head_set[0]) {
        fail(f, "token_embd.weight / output_norm.weight", FERRY_ENOENT);
        goto out;
    }

    /* Scratch vectors, and one row of the embedding in the file's dtype. */
    ferry_tensor_info einfo;
    ferry_tensor_get_info(embd, &einfo);
    uint64_t emb_row_bytes;
    if ((rc = ferry_dtype_nbytes(einfo.dtype, einfo.row_elems, &emb_row_bytes)) != 0) {
        fail(f, "token_embd.weight", rc);
        goto out;
    }
    uint64_t wide = d.ff > d.dim ? d.ff : d.dim;
    if (d.vocab > wide)
        wide = d.vocab;
    void *emb_row = NULL;
    if (scratch_alloc(&s, wide) || !(emb_row = malloc(emb_row_bytes))) {
        fprintf(stderr, "engine: out of memory\n");
        goto out;
    }

    /* 5. Decode. Token ids are fed back greedily (argmax), starting from token 1. */
    uint64_t token = 1 % d.vocab, sum = UINT64_C(0xcbf29ce484222325);
    for (unsigned step = 0; step < o.tokens; step++) {
        ferry_stats before, after;
        ferry_get_stats(f, &before);

        /* The embedding row, read from the file on demand: the table is never loaded whole. */
        if ((rc = ferry_read_rows(f, embd, &token, 1, emb_row)) != 0 ||
            (rc = ferry_dtype_convert(einfo.dtype, emb_row, FERRY_DTYPE_F32, s.x, d.dim)) != 0) {
            fail(f, "token_embd.weight", rc);
            break;
        }
        for (uint64_t l = 0; l < d.layers && !rc; l++) {
            ferry_tensor *const *set = &blocks[l * N_PARTS];
            /* Blocks until every pointer of the set is valid on the compute device; each stays
             * valid and unchanged until the matching release. */
            if ((rc = ferry_prepare(f, set, N_PARTS)) != 0) {
                fail(f, "prepare", rc);
                break;
            }
            /* A hint: start moving the next layer (or the head) while this one computes. */
            if (l + 1 < d.layers)
                ferry_prefetch(f, &blocks[(l + 1) * N_PARTS], N_PARTS);
            else
                ferry_prefetch(f, head_set, 2);
            if (host_compute && (rc = block_forward(set, &d, &s)) != 0)
                fail(f, "compute", rc);
            /* Released weights stay cached while the budget has room (and the schedule ferry
             * recorded during the first token says they are needed soon). */
            ferry_release(f, set, N_PARTS);
        }
        if (rc)
            break;
        if ((rc = ferry_prepare(f, head_set, 2)) != 0) {
            fail(f, "prepare head", rc);
            break;
        }
        uint64_t next = token;
        if (host_compute) {
            rc = rmsnorm(head_set[0], s.x, s.xn, d.dim, d.eps, s.row);
            if (!rc)
                rc = matvec(head_set[1], s.xn, s.logits);
            if (!rc) {
                next = 0;
                for (uint64_t i = 1; i < d.vocab; i++)
                    if (s.logits[i] > s.logits[next])
                        next = i;
                sum = checksum(sum, s.logits, d.vocab);
            }
        }
        ferry_release(f, head_set, 2);
        if (rc) {
            fail(f, "compute", rc);
            break;
        }
        ferry_get_stats(f, &after);
        char out_id[24] = "?";
        if (host_compute)
            snprintf(out_id, sizeof out_id, "%llu", (unsigned long long)next);
        printf("token %u: in %llu -> out %s  read=%llu B  hits=%llu misses=%llu  wait %.3f ms\n",
               step, (unsigned long long)token, out_id,
               (unsigned long long)(after.bytes_read - before.bytes_read),
               (unsigned long long)(after.prefetch_hits - before.prefetch_hits),
               (unsigned long long)(after.prefetch_misses - before.prefetch_misses),
               (after.wait_seconds - before.wait_seconds) * 1e3);
        token = next;
    }
    free(emb_row);
    if (rc)
        goto out;

    /* 6. What it cost. */
    if (host_compute)
        printf("checksum %016llx\n", (unsigned long long)sum);
    else
        printf("no host compute on %s: weights were staged on the device, not computed\n",
               o.device);
    print_stats(f, dev, o.device ? o.device : "cpu");
    status = 0;
out:
    scratch_free(&s);
    free(blocks);
    ferry_destroy(f);
    return status;
}
