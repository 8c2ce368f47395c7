/*
 * test_lora.c — LoRA adapters (src/lora): scheme detection and pairing for PEFT, kohya and GGUF
 * adapters written with the public writer; mapping to a GGUF llama-named base (HF names -> GGUF
 * names) and a safetensors diffusers-named base with conv kernels (kohya names with underscores
 * inside the base names); unmatched pairs; base and target prefixes; alpha rules (per module,
 * metadata, PEFT's adapter_config.json, absent); hostile adapters refused with FERRY_ELORA and
 * names in the message; factors read back in every dtype and orientation; the merge against a
 * float64 reference on odd sizes and row chunks; and the synthetic adapter generator of
 * `ferry gen --lora` (tools/common/gen_lora.c, in ferry_tools), whose every adapter must map fully.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "lora_fixture.h"
#include "dtype/dtype.h"
#include "ferry.h"
#include "lora/lora.h"

#include "ferry_tools.h"


/* ---- writing model and adapter files ------------------------------------------------------------ */

typedef struct tspec {
    const char *name;
    ferry_dtype dt;
    uint32_t ndim;
    int64_t shape[4]; /* the file's own order */
    int poison;       /* nonzero: element 1 is NaN */
    float fill;       /* nonzero: every element is this (for alpha tensors) */
} tspec;

typedef struct mspec {
    const char *key;
    const char *str; /* NULL: an f32 value (GGUF) */
    double f;
} mspec;

static int write_file(const char *path, ferry_format fmt, const tspec *ts, size_t n,
                      const mspec *ms, size_t nm)
{
    ferry_writer *w = ferry_writer_create(fmt);
    int rc = 0;
    for (size_t k = 0; k < nm && !rc; k++) {
        if (ms[k].str) {
            rc = ferry_writer_set_meta_str(w, ms[k].key, ms[k].str);
        } else {
            ferry_value v;
            memset(&v, 0, sizeof v);
            v.type = FERRY_VALUE_F32;
            v.v.f = ms[k].f;
            rc = ferry_writer_set_meta(w, ms[k].key, &v);
        }
    }
    for (size_t k = 0; k < n && !rc; k++)
        rc = ferry_writer_add_tensor(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t k = 0; k < n && !rc; k++)
        rc = write_values(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape, ts[k].fill,
                          ts[k].poison);
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "write_file %s: %s\n", path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

#define T2(nm, dt, a, b) {nm, dt, 2, {a, b, 0, 0}, 0, 0.0f}
#define T1(nm, dt, a) {nm, dt, 1, {a, 0, 0, 0}, 0, 0.0f}
#define T4(nm, dt, a, b, c, d) {nm, dt, 4, {a, b, c, d}, 0, 0.0f}
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The llama base: GGUF names, ne order (innermost first). dim 16, kv 8, ff 24, vocab 20. */
static const char *llama_base(void)
{
    static char path[4096];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s/llama.gguf", dir);
    tspec ts[32];
    size_t n = 0;
    ts[n++] = (tspec)T2("token_embd.weight", FERRY_DTYPE_F16, 16, 20);
    static char names[2][8][64];
    for (int l = 0; l < 2; l++) {
        const char *mods[8] = {"attn_norm", "attn_q", "attn_k", "attn_v",
                               "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
        const int64_t in[8] = {16, 16, 16, 16, 16, 16, 16, 24};
        const int64_t out[8] = {0, 16, 8, 8, 16, 24, 24, 16};
        for (int m = 0; m < 8; m++) {
            snprintf(names[l][m], 64, "blk.%d.%s.weight", l, mods[m]);
            if (m == 0)
                ts[n++] = (tspec)T1(names[l][m], FERRY_DTYPE_F32, 16);
            else
                ts[n++] = (tspec)T2(names[l][m], FERRY_DTYPE_F32, in[m], out[m]);
        }
    }
    ts[n++] = (tspec)T1("output_norm.weight", FERRY_DTYPE_F32, 16);
    ts[n++] = (tspec)T2("output.weight", FERRY_DTYPE_F16, 16, 20);
    mspec ms[] = {{"general.architecture", "llama", 0}};
    if (write_file(path, FERRY_FORMAT_GGUF, ts, n, ms, 1))
        path[0] = 0;
    return path;
}

#define ATT "down_blocks.0.attentions.0.transformer_blocks.0."

/* The diffusers base: safetensors names and order, with conv kernels. */
static const char *unet_base(void)
{
    static char path[4096];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s/unet.safetensors", dir);
    tspec ts[] = {
        T4("conv_in.weight", FERRY_DTYPE_F16, 4, 4, 3, 3),
        T4("down_blocks.0.resnets.0.conv1.weight", FERRY_DTYPE_F16, 8, 4, 3, 3),
        T1("down_blocks.0.resnets.0.conv1.bias", FERRY_DTYPE_F16, 8),
        T4("down_blocks.0.resnets.0.conv_shortcut.weight", FERRY_DTYPE_F16, 8, 4, 1, 1),
        T2(ATT "attn1.to_q.weight", FERRY_DTYPE_F16, 16, 16),
        T2(ATT "attn1.to_k.weight", FERRY_DTYPE_F16, 16, 16),
        T2(ATT "attn1.to_v.weight", FERRY_DTYPE_F16, 16, 16),
        T2(ATT "attn1.to_out.0.weight", FERRY_DTYPE_F16, 16, 16),
        T1(ATT "attn1.to_out.0.bias", FERRY_DTYPE_F16, 16),
        T2(ATT "attn2.to_k.weight", FERRY_DTYPE_F16, 16, 12),
        T2(ATT "ff.net.0.proj.weight", FERRY_DTYPE_F16, 64, 16),
        T2(ATT "ff.net.2.weight", FERRY_DTYPE_F16, 16, 32),
        T2("mid_block.attentions.0.proj_in.weight", FERRY_DTYPE_F16, 16, 16),
        T1("mid_block.attentions.0.norm.weight", FERRY_DTYPE_F16, 16),
    };
    if (write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), NULL, 0))
        path[0] = 0;
    return path;
}

/* A text encoder (CLIP names), meant to be opened under "text_encoder.". */
static const char *te_base(void)
{
    static char path[4096];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s/te.safetensors", dir);
    tspec ts[] = {
        T2("text_model.encoder.layers.0.self_attn.q_proj.weight", FERRY_DTYPE_F16, 12, 12),
        T2("text_model.encoder.layers.0.mlp.fc1.weight", FERRY_DTYPE_F16, 24, 12),
    };
    if (write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), NULL, 0))
        path[0] = 0;
    return path;
}

static ferry_catalog *open_base(const char *path, const char *prefix)
{
    ferry_catalog *c = ferry_catalog_create();
    if (ferry_catalog_add(c, path, prefix) != 0)
        fprintf(stderr, "open_base %s: %s\n", path, ferry_catalog_errmsg(c));
    return c;
}

static ferry__lora_pair *pair_named(ferry__adapter *a, const char *stem)
{
    for (size_t k = 0; a && k < a->n_pairs; k++)
        if (strcmp(a->pairs[k].stem, stem) == 0)
            return &a->pairs[k];
    return NULL;
}

static ferry__adapter *open_ok(const char *path, ferry__err *e)
{
    ferry__adapter *a = NULL;
    int rc = ferry__adapter_open(path, &a, e);
    if (rc)
        fprintf(stderr, "open %s: %s\n", path, e->msg);
    CHECK_EQ_INT(rc, 0);
    return a;
}

/* Checks that pair P's loaded factors hold the values written under A_NAME / B_NAME (in the file
 * order of their elements, which is A and B row-major). */
static void check_factors(ferry__lora_pair *p, const char *a_name, const char *b_name,
                          ferry_dtype dt)
{
    int ok = p && p->a && p->b;
    CHECK(ok);
    if (!ok)
        return;
    int bad = 0;
    for (uint64_t i = 0; i < (uint64_t)p->rank * p->cols; i++)
        bad += p->a[i] != round_trip(dt, val_of(a_name, i));
    for (uint64_t i = 0; i < p->rows * (uint64_t)p->rank; i++)
        bad += p->b[i] != round_trip(dt, val_of(b_name, i));
    CHECK_EQ_INT(bad, 0);
}

/* ---- the matrix view ---------------------------------------------------------------------- */

static void test_matrix_view(void)
{
    ferry_catalog *c = open_base(llama_base(), NULL);
    ferry_tensor_info t;
    uint64_t r, k;
    CHECK_EQ_INT(ferry_catalog_tensor(c, (size_t)ferry_catalog_find(c, "blk.0.attn_k.weight"), &t),
                 0);
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 8);
    CHECK_EQ_INT(k, 16);
    ferry_catalog_tensor(c, (size_t)ferry_catalog_find(c, "blk.0.ffn_down.weight"), &t);
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 16);
    CHECK_EQ_INT(k, 24);
    ferry_catalog_tensor(c, (size_t)ferry_catalog_find(c, "blk.0.attn_norm.weight"), &t);
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 16);
    CHECK_EQ_INT(k, 1);
    ferry_catalog_destroy(c);

    c = open_base(unet_base(), NULL);
    ferry_catalog_tensor(c, (size_t)ferry_catalog_find(c, "down_blocks.0.resnets.0.conv1.weight"),
                         &t);
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 8);
    CHECK_EQ_INT(k, 36);
    ferry_catalog_tensor(c, (size_t)ferry_catalog_find(c, ATT "ff.net.2.weight"), &t);
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 16);
    CHECK_EQ_INT(k, 32);
    ferry_catalog_destroy(c);

    memset(&t, 0, sizeof t);
    t.ndim = 0;
    t.n_elems = 1;
    ferry__lora_matrix_view(&t, &r, &k);
    CHECK_EQ_INT(r, 1);
    CHECK_EQ_INT(k, 1);
}

/* ---- PEFT ---------------------------------------------------------------------------------- */

#define HF0 "base_model.model.model.layers.0."

static void test_peft_llama(void)
{
    ferry__err e = {0};
    const char *path = path_of("peft_llama.safetensors");
    tspec ts[] = {
        T2(HF0 "self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
        T2(HF0 "self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 16, 4),
        T2(HF0 "self_attn.k_proj.lora_A.weight", FERRY_DTYPE_BF16, 4, 16),
        T2(HF0 "self_attn.k_proj.lora_B.weight", FERRY_DTYPE_BF16, 8, 4),
        T2("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", FERRY_DTYPE_F32, 4, 24),
        T2("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", FERRY_DTYPE_F32, 16, 4),
        T2("base_model.model.lm_head.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
        T2("base_model.model.lm_head.lora_B.weight", FERRY_DTYPE_F16, 20, 4),
        T2("base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4,
           16),
        T2("base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 16,
           4),
    };
    mspec ms[] = {{"format", "pt", 0}, {"lora_alpha", "8", 0}};
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), ms, N_OF(ms)), 0);
    ferry__adapter *a = open_ok(path, &e);
    if (!a)
        return;
    CHECK_STR(a->scheme, "peft");
    CHECK_EQ_INT(a->n_pairs, 5);
    CHECK(a->default_alpha == 8.0f);
    ferry__lora_pair *q = pair_named(a, HF0 "self_attn.q_proj");
    ferry__lora_pair *k = pair_named(a, HF0 "self_attn.k_proj");
    ferry__lora_pair *d = pair_named(a, "base_model.model.model.layers.1.mlp.down_proj");
    ferry__lora_pair *h = pair_named(a, "base_model.model.lm_head");
    CHECK(q && k && d && h);
    if (!q || !k || !d || !h)
        goto out;
    CHECK_EQ_INT(q->rank, 4);
    CHECK_EQ_INT(k->rows, 8);
    CHECK_EQ_INT(k->cols, 16);
    CHECK_EQ_INT(d->rows, 16);
    CHECK_EQ_INT(d->cols, 24);
    CHECK(q->alpha == 8.0f);
    CHECK(fabsf(ferry__lora_scale(q, 1.5f) - 3.0f) < 1e-6f);
    CHECK(q->base_name == NULL);

    ferry_catalog *base = open_base(llama_base(), NULL);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 4);
    CHECK_STR(q->base_name, "blk.0.attn_q.weight");
    CHECK_STR(k->base_name, "blk.0.attn_k.weight");
    CHECK_STR(d->base_name, "blk.1.ffn_down.weight");
    CHECK_STR(h->base_name, "output.weight");
    ferry__lora_pair *u = pair_named(a, "base_model.model.model.layers.7.self_attn.q_proj");
    CHECK(u && u->base_name == NULL);
    /* mapping again gives the same answer (nothing stale) */
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 4);

    CHECK_EQ_INT(ferry__adapter_load(a, q, &e), 0);
    CHECK_EQ_INT(ferry__adapter_load(a, q, &e), 0); /* cached: a second load is a no-op */
    check_factors(q, HF0 "self_attn.q_proj.lora_A.weight", HF0 "self_attn.q_proj.lora_B.weight",
                  FERRY_DTYPE_F16);
    CHECK_EQ_INT(ferry__adapter_load(a, k, &e), 0);
    check_factors(k, HF0 "self_attn.k_proj.lora_A.weight", HF0 "self_attn.k_proj.lora_B.weight",
                  FERRY_DTYPE_BF16);
    CHECK_EQ_INT(ferry__adapter_load(a, d, &e), 0);
    check_factors(d, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight",
                  "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", FERRY_DTYPE_F32);
    CHECK_EQ_INT(ferry__lora_pair_bytes(d), (4 * 24 + 16 * 4) * 4);
    ferry_catalog_destroy(base);
out:
    ferry__adapter_close(a);
}

static void test_peft_default_and_unet(void)
{
    ferry__err e = {0};
    /* PEFT names with the adapter name ("default") left in, diffusers module names under "unet."
     * and "base_model.model.", a conv LoRA, and no alpha anywhere */
    const char *path = path_of("peft_unet.safetensors");
    tspec ts[] = {
        T2("unet." ATT "attn1.to_q.lora_A.default.weight", FERRY_DTYPE_F16, 2, 16),
        T2("unet." ATT "attn1.to_q.lora_B.default.weight", FERRY_DTYPE_F16, 16, 2),
        T2("base_model.model." ATT "attn2.to_k.lora_A.weight", FERRY_DTYPE_F16, 2, 12),
        T2("base_model.model." ATT "attn2.to_k.lora_B.weight", FERRY_DTYPE_F16, 16, 2),
        T4("unet.down_blocks.0.resnets.0.conv1.lora_A.weight", FERRY_DTYPE_F16, 2, 4, 3, 3),
        T4("unet.down_blocks.0.resnets.0.conv1.lora_B.weight", FERRY_DTYPE_F16, 8, 2, 1, 1),
        T2(ATT "ff.net.0.proj.lora_A.weight", FERRY_DTYPE_F16, 2, 16),
        T2(ATT "ff.net.0.proj.lora_B.weight", FERRY_DTYPE_F16, 64, 2),
    };
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), NULL, 0), 0);
    ferry__adapter *a = open_ok(path, &e);
    if (!a)
        return;
    CHECK_STR(a->scheme, "peft");
    CHECK_EQ_INT(a->n_pairs, 4);
    CHECK(isnan(a->default_alpha));
    ferry__lora_pair *cv = pair_named(a, "unet.down_blocks.0.resnets.0.conv1");
    CHECK(cv != NULL);
    if (cv) {
        CHECK_EQ_INT(cv->rank, 2);
        CHECK_EQ_INT(cv->rows, 8);
        CHECK_EQ_INT(cv->cols, 36);
        CHECK(isnan(cv->alpha));
        /* alpha absent: alpha = rank, scale = multiplier */
        CHECK(ferry__lora_scale(cv, 0.75f) == 0.75f);
    }
    CHECK(pair_named(a, "unet." ATT "attn1.to_q") != NULL);
    ferry_catalog *base = open_base(unet_base(), NULL);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 4);
    CHECK_STR(pair_named(a, "unet." ATT "attn1.to_q")->base_name, ATT "attn1.to_q.weight");
    CHECK_STR(pair_named(a, "base_model.model." ATT "attn2.to_k")->base_name,
              ATT "attn2.to_k.weight");
    CHECK_STR(cv ? cv->base_name : NULL, "down_blocks.0.resnets.0.conv1.weight");
    CHECK_STR(pair_named(a, ATT "ff.net.0.proj")->base_name, ATT "ff.net.0.proj.weight");
    if (cv) {
        CHECK_EQ_INT(ferry__adapter_load(a, cv, &e), 0);
        check_factors(cv, "unet.down_blocks.0.resnets.0.conv1.lora_A.weight",
                      "unet.down_blocks.0.resnets.0.conv1.lora_B.weight", FERRY_DTYPE_F16);
    }
    ferry_catalog_destroy(base);

    /* the same adapter against the base opened under "unet.": the name matches as it is */
    base = open_base(unet_base(), "unet.");
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_STR(pair_named(a, "unet." ATT "attn1.to_q")->base_name, "unet." ATT "attn1.to_q.weight");
    CHECK_EQ_INT(a->n_matched, 2); /* the two names without "unet." find nothing */
    ferry_catalog_destroy(base);
    ferry__adapter_close(a);
}

/* PEFT's own folder layout: adapter_model.safetensors without alpha, adapter_config.json beside */
static void test_peft_config(void)
{
    ferry__err e = {0};
    char sub[4096], path[4200], cfg[4200];
    snprintf(sub, sizeof sub, "%s/peftdir", dir);
    mkdir(sub, 0755);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", sub);
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", sub);
    tspec ts[] = {
        T2(HF0 "self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
        T2(HF0 "self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 16, 4),
        T2(HF0 "self_attn.k_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
        T2(HF0 "self_attn.k_proj.lora_B.weight", FERRY_DTYPE_F16, 8, 4),
    };
    mspec ms[] = {{"format", "pt", 0}};
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), ms, 1), 0);

    /* no config: alpha absent */
    ferry__adapter *a = open_ok(path, &e);
    if (a)
        CHECK(isnan(pair_named(a, HF0 "self_attn.q_proj")->alpha));
    ferry__adapter_close(a);

    const char *j1 = "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 16, \"use_rslora\": false,"
                     " \"alpha_pattern\": {\"k_proj\": 2}, \"target_modules\": [\"q_proj\"]}";
    CHECK_EQ_INT(check_write_file(cfg, j1, strlen(j1)), 0);
    a = open_ok(path, &e);
    if (a) {
        CHECK(pair_named(a, HF0 "self_attn.q_proj")->alpha == 16.0f);
        CHECK(pair_named(a, HF0 "self_attn.k_proj")->alpha == 2.0f);
        CHECK(ferry__lora_scale(pair_named(a, HF0 "self_attn.q_proj"), 1.0f) == 4.0f);
    }
    ferry__adapter_close(a);

    /* rsLoRA: scale = alpha / sqrt(r) = 16 / 2 */
    const char *j2 = "{\"r\": 4, \"lora_alpha\": 16, \"use_rslora\": true}";
    CHECK_EQ_INT(check_write_file(cfg, j2, strlen(j2)), 0);
    a = open_ok(path, &e);
    if (a)
        CHECK(fabsf(ferry__lora_scale(pair_named(a, HF0 "self_attn.q_proj"), 1.0f) - 8.0f) < 1e-5f);
    ferry__adapter_close(a);

    /* a broken config decides nothing silently */
    const char *j3 = "{\"r\": 4, \"lora_alpha\": \"sixteen\"}";
    CHECK_EQ_INT(check_write_file(cfg, j3, strlen(j3)), 0);
    a = NULL;
    CHECK_EQ_INT(ferry__adapter_open(path, &a, &e), FERRY_ELORA);
    CHECK(a == NULL);
    CHECK(strstr(e.msg, "adapter_config.json") && strstr(e.msg, "lora_alpha"));
    const char *j4 = "{\"r\": 4, \"lora_alpha\": 16";
    CHECK_EQ_INT(check_write_file(cfg, j4, strlen(j4)), 0);
    CHECK(ferry__adapter_open(path, &a, &e) != 0);
    CHECK(strstr(e.msg, "adapter_config.json") != NULL);

    /* metadata alpha wins: the (broken) config is not even read */
    mspec ms2[] = {{"lora_alpha", "12", 0}};
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), ms2, 1), 0);
    a = open_ok(path, &e);
    if (a)
        CHECK(pair_named(a, HF0 "self_attn.k_proj")->alpha == 12.0f);
    ferry__adapter_close(a);
}

/* ---- kohya ------------------------------------------------------------------------------------ */

#define KU "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_"

static void test_kohya(void)
{
    ferry__err e = {0};
    const char *path = path_of("kohya.safetensors");
    tspec ts[] = {
        T2(KU "attn1_to_q.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
        T2(KU "attn1_to_q.lora_up.weight", FERRY_DTYPE_F16, 16, 4),
        {KU "attn1_to_q.alpha", FERRY_DTYPE_F16, 0, {0}, 0, 2.0f},
        T2(KU "attn1_to_out_0.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
        T2(KU "attn1_to_out_0.lora_up.weight", FERRY_DTYPE_F16, 16, 4),
        {KU "attn1_to_out_0.alpha", FERRY_DTYPE_F32, 1, {1}, 0, 3.0f},
        T2(KU "ff_net_0_proj.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
        T2(KU "ff_net_0_proj.lora_up.weight", FERRY_DTYPE_F16, 64, 4),
        {KU "ff_net_0_proj.alpha", FERRY_DTYPE_BF16, 0, {0}, 0, 1.0f},
        T4("lora_unet_down_blocks_0_resnets_0_conv1.lora_down.weight", FERRY_DTYPE_F16, 4, 4, 3,
           3),
        T4("lora_unet_down_blocks_0_resnets_0_conv1.lora_up.weight", FERRY_DTYPE_F16, 8, 4, 1, 1),
        T2("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",
           FERRY_DTYPE_F16, 4, 12),
        T2("lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", FERRY_DTYPE_F16,
           12, 4),
        T2("lora_unet_up_blocks_9_attentions_0_proj_in.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
        T2("lora_unet_up_blocks_9_attentions_0_proj_in.lora_up.weight", FERRY_DTYPE_F16, 16, 4),
        /* an alpha for factors the file does not hold changes nothing */
        {"lora_unet_nothing.alpha", FERRY_DTYPE_F32, 0, {0}, 0, 5.0f},
    };
    mspec ms[] = {{"ss_network_alpha", "Dynamic", 0}, {"ss_network_dim", "4", 0}};
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_SAFETENSORS, ts, N_OF(ts), ms, N_OF(ms)), 0);
    ferry__adapter *a = open_ok(path, &e);
    if (!a)
        return;
    CHECK_STR(a->scheme, "kohya");
    CHECK_EQ_INT(a->n_pairs, 6);
    CHECK(isnan(a->default_alpha)); /* "Dynamic" is no number and is ignored */
    ferry__lora_pair *q = pair_named(a, KU "attn1_to_q");
    ferry__lora_pair *o = pair_named(a, KU "attn1_to_out_0");
    ferry__lora_pair *f = pair_named(a, KU "ff_net_0_proj");
    ferry__lora_pair *c = pair_named(a, "lora_unet_down_blocks_0_resnets_0_conv1");
    ferry__lora_pair *t = pair_named(a, "lora_te_text_model_encoder_layers_0_self_attn_q_proj");
    CHECK(q && o && f && c && t);
    if (!q || !o || !f || !c || !t)
        goto out;
    CHECK(q->alpha == 2.0f);
    CHECK(o->alpha == 3.0f);
    CHECK(f->alpha == 1.0f);
    CHECK(isnan(c->alpha));
    CHECK(fabsf(ferry__lora_scale(q, 1.0f) - 0.5f) < 1e-7f);
    CHECK_EQ_INT(c->cols, 36);

    /* unet without prefix, text encoder under "text_encoder." */
    ferry_catalog *base = open_base(unet_base(), NULL);
    CHECK_EQ_INT(ferry_catalog_add(base, te_base(), "text_encoder."), 0);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 5);
    CHECK_STR(q->base_name, ATT "attn1.to_q.weight");
    CHECK_STR(o->base_name, ATT "attn1.to_out.0.weight");
    CHECK_STR(f->base_name, ATT "ff.net.0.proj.weight");
    CHECK_STR(c->base_name, "down_blocks.0.resnets.0.conv1.weight");
    CHECK_STR(t->base_name, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.weight");
    CHECK(pair_named(a, "lora_unet_up_blocks_9_attentions_0_proj_in")->base_name == NULL);
    CHECK_EQ_INT(ferry__adapter_load(a, c, &e), 0);
    check_factors(c, "lora_unet_down_blocks_0_resnets_0_conv1.lora_down.weight",
                  "lora_unet_down_blocks_0_resnets_0_conv1.lora_up.weight", FERRY_DTYPE_F16);

    /* base_prefix: only the text encoder qualifies */
    CHECK_EQ_INT(ferry__adapter_map(a, base, "text_encoder.", NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 1);
    CHECK(q->base_name == NULL);
    CHECK_STR(t->base_name, "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.weight");
    ferry_catalog_destroy(base);

    /* target prefix: the unet opened a second time under "copy." */
    base = open_base(unet_base(), "copy.");
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 0);
    CHECK_EQ_INT(ferry_catalog_add(base, unet_base(), NULL), 0);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, "copy.", &e), 0);
    CHECK_EQ_INT(a->n_matched, 4);
    CHECK_STR(q->base_name, "copy." ATT "attn1.to_q.weight");
    CHECK_STR(c->base_name, "copy.down_blocks.0.resnets.0.conv1.weight");
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_STR(q->base_name, ATT "attn1.to_q.weight");
    ferry_catalog_destroy(base);

    /* kohya names whose underscores fit two base names are refused, naming both */
    const char *amb = path_of("ambiguous.safetensors");
    tspec tb[] = {T2("a.b_c.weight", FERRY_DTYPE_F16, 4, 4), T2("a_b.c.weight", FERRY_DTYPE_F16, 4, 4)};
    CHECK_EQ_INT(write_file(amb, FERRY_FORMAT_SAFETENSORS, tb, 2, NULL, 0), 0);
    const char *ka = path_of("kohya_amb.safetensors");
    tspec tk[] = {T2("lora_unet_a_b_c.lora_down.weight", FERRY_DTYPE_F16, 1, 4),
                  T2("lora_unet_a_b_c.lora_up.weight", FERRY_DTYPE_F16, 4, 1)};
    CHECK_EQ_INT(write_file(ka, FERRY_FORMAT_SAFETENSORS, tk, 2, NULL, 0), 0);
    ferry__adapter *a2 = open_ok(ka, &e);
    base = open_base(amb, NULL);
    CHECK_EQ_INT(ferry__adapter_map(a2, base, NULL, NULL, &e), FERRY_ELORA);
    CHECK(strstr(e.msg, "a.b_c.weight") && strstr(e.msg, "a_b.c.weight"));
    ferry_catalog_destroy(base);
    ferry__adapter_close(a2);
out:
    ferry__adapter_close(a);
}

/* ---- GGUF LoRA ------------------------------------------------------------------------------ */

static void test_gguf_lora(void)
{
    ferry__err e = {0};
    const char *path = path_of("lora.gguf");
    tspec ts[] = {
        T2("blk.0.attn_q.weight.lora_a", FERRY_DTYPE_F16, 16, 3),
        T2("blk.0.attn_q.weight.lora_b", FERRY_DTYPE_F16, 3, 16),
        T2("blk.0.attn_k.weight.lora_a", FERRY_DTYPE_F32, 16, 3),
        T2("blk.0.attn_k.weight.lora_b", FERRY_DTYPE_F32, 3, 8),
        T2("blk.1.ffn_down.weight.lora_a", FERRY_DTYPE_F16, 24, 3),
        T2("blk.1.ffn_down.weight.lora_b", FERRY_DTYPE_F16, 3, 16),
        T2("blk.5.ffn_up.weight.lora_a", FERRY_DTYPE_F16, 16, 3),
        T2("blk.5.ffn_up.weight.lora_b", FERRY_DTYPE_F16, 3, 24),
    };
    mspec ms[] = {{"general.type", "adapter", 0},
                  {"adapter.type", "lora", 0},
                  {"adapter.lora.alpha", NULL, 6.0}};
    CHECK_EQ_INT(write_file(path, FERRY_FORMAT_GGUF, ts, N_OF(ts), ms, N_OF(ms)), 0);
    ferry__adapter *a = open_ok(path, &e);
    if (!a)
        return;
    CHECK_STR(a->scheme, "gguf");
    CHECK_EQ_INT(a->n_pairs, 4);
    CHECK(a->default_alpha == 6.0f);
    ferry__lora_pair *k = pair_named(a, "blk.0.attn_k.weight");
    ferry__lora_pair *d = pair_named(a, "blk.1.ffn_down.weight");
    CHECK(k && d);
    if (!k || !d)
        goto out;
    CHECK_EQ_INT(k->rank, 3);
    CHECK_EQ_INT(k->rows, 8);
    CHECK_EQ_INT(k->cols, 16);
    CHECK_EQ_INT(d->rows, 16);
    CHECK_EQ_INT(d->cols, 24);
    CHECK(fabsf(ferry__lora_scale(k, 1.0f) - 2.0f) < 1e-6f);

    ferry_catalog *base = open_base(llama_base(), NULL);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 3);
    CHECK_STR(k->base_name, "blk.0.attn_k.weight");
    CHECK_STR(d->base_name, "blk.1.ffn_down.weight");
    CHECK(pair_named(a, "blk.5.ffn_up.weight")->base_name == NULL);
    /* lora_a ne = [in, rank]: its bytes are A row-major (rank rows of in); lora_b likewise B */
    CHECK_EQ_INT(ferry__adapter_load(a, k, &e), 0);
    check_factors(k, "blk.0.attn_k.weight.lora_a", "blk.0.attn_k.weight.lora_b", FERRY_DTYPE_F32);
    CHECK_EQ_INT(ferry__adapter_load(a, d, &e), 0);
    check_factors(d, "blk.1.ffn_down.weight.lora_a", "blk.1.ffn_down.weight.lora_b",
                  FERRY_DTYPE_F16);
    ferry_catalog_destroy(base);

    /* target and base prefixes: the base opened twice, under "a." and "b." */
    base = open_base(llama_base(), "a.");
    CHECK_EQ_INT(ferry_catalog_add(base, llama_base(), "b."), 0);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), 0);
    CHECK_EQ_INT(a->n_matched, 0);
    CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, "b.", &e), 0);
    CHECK_EQ_INT(a->n_matched, 3);
    CHECK_STR(k->base_name, "b.blk.0.attn_k.weight");
    CHECK_EQ_INT(ferry__adapter_map(a, base, "b.", "a.", &e), 0);
    CHECK_EQ_INT(a->n_matched, 0);
    CHECK_EQ_INT(ferry__adapter_map(a, base, "a.", "a.", &e), 0);
    CHECK_EQ_INT(a->n_matched, 3);
    ferry_catalog_destroy(base);

    /* PEFT-named factors on the same base under a prefix: HF names translated after it */
    base = open_base(llama_base(), "m.");
    const char *pp = path_of("peft_pref.safetensors");
    tspec tp[] = {T2(HF0 "mlp.gate_proj.lora_A.weight", FERRY_DTYPE_F16, 2, 16),
                  T2(HF0 "mlp.gate_proj.lora_B.weight", FERRY_DTYPE_F16, 24, 2)};
    CHECK_EQ_INT(write_file(pp, FERRY_FORMAT_SAFETENSORS, tp, 2, NULL, 0), 0);
    ferry__adapter *a2 = open_ok(pp, &e);
    if (a2) {
        CHECK_EQ_INT(ferry__adapter_map(a2, base, NULL, "m.", &e), 0);
        CHECK_EQ_INT(a2->n_matched, 1);
        CHECK_STR(a2->pairs[0].base_name, "m.blk.0.ffn_gate.weight");
    }
    ferry__adapter_close(a2);
    ferry_catalog_destroy(base);
out:
    ferry__adapter_close(a);
}

/* ---- hostile adapters ----------------------------------------------------------------------- */

/* Writes TS as a safetensors (or GGUF) adapter and expects open to fail with CODE and a message
 * holding NEED (and NEED2 when not NULL). */
static void expect_refused(const char *file, ferry_format fmt, const tspec *ts, size_t n,
                           const mspec *ms, size_t nm, int code, const char *need,
                           const char *need2)
{
    ferry__err e = {0};
    const char *path = path_of(file);
    CHECK_EQ_INT(write_file(path, fmt, ts, n, ms, nm), 0);
    ferry__adapter *a = (ferry__adapter *)1;
    int rc = ferry__adapter_open(path, &a, &e);
    CHECK_EQ_INT(rc, code);
    CHECK(a == NULL);
    int ok = strstr(e.msg, path) && strstr(e.msg, need) && (!need2 || strstr(e.msg, need2));
    if (!ok)
        fprintf(stderr, "  %s: message was: %s\n", file, e.msg);
    CHECK(ok);
    if (a && a != (ferry__adapter *)1)
        ferry__adapter_close(a);
}

static void test_hostile(void)
{
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("y.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("y.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("lone_a.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0,
                       FERRY_ELORA, "x.lora_A.weight", NULL);
    }
    {
        tspec ts[] = {T2("lora_unet_x.lora_up.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("lone_b.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 1, NULL, 0,
                       FERRY_ELORA, "lora_unet_x.lora_up.weight", NULL);
    }
    {
        tspec ts[] = {T2("blk.0.attn_q.weight.lora_b", FERRY_DTYPE_F16, 4, 16)};
        expect_refused("lone_b.gguf", FERRY_FORMAT_GGUF, ts, 1, NULL, 0, FERRY_ELORA,
                       "blk.0.attn_q.weight.lora_b", NULL);
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 0, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 0)};
        expect_refused("rank0.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0,
                       FERRY_ELORA, "rank 0", "x.lora_A.weight");
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 3)};
        expect_refused("ranks.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0,
                       FERRY_ELORA, "x.lora_B.weight", "rank");
    }
    {
        tspec ts[] = {T4("lora_unet_c.lora_down.weight", FERRY_DTYPE_F16, 4, 4, 3, 3),
                      T4("lora_unet_c.lora_up.weight", FERRY_DTYPE_F16, 8, 4, 3, 3)};
        expect_refused("kernel.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0,
                       FERRY_ELORA, "lora_unet_c.lora_up.weight", "1x1");
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_I32, 4, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("int.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0, FERRY_ELORA,
                       "x.lora_A.weight", "i32");
    }
    {
        tspec ts[] = {T1("x.lora_A.weight", FERRY_DTYPE_F16, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("onedim.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0,
                       FERRY_ELORA, "x.lora_A.weight", NULL);
    }
    {
        tspec ts[] = {T2("lora_unet_x.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("lora_unet_x.lora_up.weight", FERRY_DTYPE_F16, 16, 4),
                      {"lora_unet_x.alpha", FERRY_DTYPE_F32, 1, {2}, 0, 1.0f}};
        expect_refused("alpha2.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0,
                       FERRY_ELORA, "lora_unet_x.alpha", NULL);
    }
    {
        tspec ts[] = {T2("lora_unet_x.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("lora_unet_x.lora_up.weight", FERRY_DTYPE_F16, 16, 4),
                      {"lora_unet_x.alpha", FERRY_DTYPE_F32, 0, {0}, 0, INFINITY}};
        expect_refused("alphainf.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0,
                       FERRY_ELORA, "lora_unet_x.alpha", NULL);
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        mspec ms[] = {{"lora_alpha", "abc", 0}};
        expect_refused("alphameta.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 2, ms, 1,
                       FERRY_ELORA, "lora_alpha", "abc");
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 4),
                      T2("lora_unet_y.lora_down.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("lora_unet_y.lora_up.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("mixed.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 4, NULL, 0,
                       FERRY_ELORA, "x.lora_A.weight", "lora_unet_y.lora_down.weight");
    }
    {
        tspec ts[] = {T2("x.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("x.lora_A.default.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("x.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        expect_refused("dup.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0, FERRY_ELORA,
                       "x.lora_A.weight", "x.lora_A.default.weight");
    }
    {
        tspec ts[] = {T2("model.weight", FERRY_DTYPE_F16, 4, 16)};
        expect_refused("nolora.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 1, NULL, 0,
                       FERRY_ELORA, "no LoRA factors", NULL);
    }
    {
        tspec ts[] = {T4("lora_unet_c.lora_down.weight", FERRY_DTYPE_F16, 4, 4, 1, 1),
                      T4("lora_unet_c.lora_mid.weight", FERRY_DTYPE_F16, 4, 4, 3, 3),
                      T4("lora_unet_c.lora_up.weight", FERRY_DTYPE_F16, 8, 4, 1, 1)};
        expect_refused("locon_mid.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0,
                       FERRY_ELORA, "lora_unet_c.lora_mid.weight", NULL);
    }
    {
        /* PEFT modules_to_save beside ordinary factors: refused, never half-applied */
        tspec ts[] = {T2("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                         FERRY_DTYPE_F16, 4, 16),
                      T2("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                         FERRY_DTYPE_F16, 16, 4),
                      T2("base_model.model.lm_head.modules_to_save.default.weight",
                         FERRY_DTYPE_F16, 32, 16)};
        expect_refused("mts.safetensors", FERRY_FORMAT_SAFETENSORS, ts, 3, NULL, 0, FERRY_ELORA,
                       "lm_head.modules_to_save.default.weight", "modules_to_save");
    }
    {
        tspec ts[] = {T2("blk.0.attn_q.weight.lora_a", FERRY_DTYPE_F16, 16, 3),
                      T2("blk.0.attn_q.weight.lora_b", FERRY_DTYPE_F16, 3, 16)};
        mspec ms[] = {{"adapter.type", "control_vector", 0}};
        expect_refused("cvec.gguf", FERRY_FORMAT_GGUF, ts, 2, ms, 1, FERRY_ELORA,
                       "control_vector", NULL);
    }
    {
        /* not a model file at all: the file's own error, naming it */
        const char *p = path_of("garbage.safetensors");
        CHECK_EQ_INT(check_write_file(p, "this is no model", 16), 0);
        ferry__err e = {0};
        ferry__adapter *a = NULL;
        CHECK(ferry__adapter_open(p, &a, &e) < 0);
        CHECK(a == NULL && strstr(e.msg, p) != NULL);
        CHECK(ferry__adapter_open(path_of("missing.safetensors"), &a, &e) < 0);
        CHECK(a == NULL);
    }

    /* factors that do not fit the base they name: refused at map, naming both and both shapes */
    ferry__err e = {0};
    ferry_catalog *base = open_base(llama_base(), NULL);
    {
        const char *p = path_of("misfit.safetensors");
        tspec ts[] = {T2(HF0 "self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 17),
                      T2(HF0 "self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        CHECK_EQ_INT(write_file(p, FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0), 0);
        ferry__adapter *a = open_ok(p, &e);
        if (a) {
            CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), FERRY_ELORA);
            CHECK(strstr(e.msg, p) && strstr(e.msg, HF0 "self_attn.q_proj.lora_A.weight") &&
                  strstr(e.msg, "blk.0.attn_q.weight") && strstr(e.msg, "16 x 17") &&
                  strstr(e.msg, "16 x 16") && strstr(e.msg, "[4, 17]"));
            CHECK_EQ_INT(a->n_matched, 0);
            CHECK(a->pairs[0].base_name == NULL);
        }
        ferry__adapter_close(a);
    }
    {
        /* two pairs naming one base weight */
        const char *p = path_of("twice.safetensors");
        tspec ts[] = {T2(HF0 "self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2(HF0 "self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 16, 4),
                      T2("blk.0.attn_q.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      T2("blk.0.attn_q.lora_B.weight", FERRY_DTYPE_F16, 16, 4)};
        CHECK_EQ_INT(write_file(p, FERRY_FORMAT_SAFETENSORS, ts, 4, NULL, 0), 0);
        ferry__adapter *a = open_ok(p, &e);
        if (a) {
            CHECK_EQ_INT(ferry__adapter_map(a, base, NULL, NULL, &e), FERRY_ELORA);
            CHECK(strstr(e.msg, "blk.0.attn_q.weight") && strstr(e.msg, HF0 "self_attn.q_proj"));
        }
        ferry__adapter_close(a);
    }
    {
        /* a NaN inside a factor is found at load */
        const char *p = path_of("nan.safetensors");
        tspec ts[] = {T2(HF0 "self_attn.q_proj.lora_A.weight", FERRY_DTYPE_F16, 4, 16),
                      {HF0 "self_attn.q_proj.lora_B.weight", FERRY_DTYPE_F16, 2, {16, 4}, 1, 0}};
        CHECK_EQ_INT(write_file(p, FERRY_FORMAT_SAFETENSORS, ts, 2, NULL, 0), 0);
        ferry__adapter *a = open_ok(p, &e);
        if (a) {
            CHECK_EQ_INT(ferry__adapter_load(a, &a->pairs[0], &e), FERRY_ELORA);
            CHECK(strstr(e.msg, HF0 "self_attn.q_proj.lora_B.weight") != NULL);
            CHECK(a->pairs[0].a == NULL && a->pairs[0].b == NULL);
        }
        ferry__adapter_close(a);
    }
    ferry_catalog_destroy(base);
    ferry__adapter_close(NULL);
}

/* ---- the merge ------------------------------------------------------------------------------- */

static uint64_t rng_state = 12345;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / 16777216.0 - 0.5);
}

/* W += scale B.A in chunks of CHUNK rows, against a float64 reference; the bound is relative to
 * the magnitudes summed (|w| + |scale| sum |b a|), 1e-6. */
static int merge_case(uint64_t rows, uint64_t cols, uint32_t rank, float scale, uint64_t chunk)
{
    ferry__lora_pair p;
    memset(&p, 0, sizeof p);
    p.rank = rank;
    p.rows = rows;
    p.cols = cols;
    p.alpha = NAN;
    p.a = malloc(rank * cols * sizeof(float));
    p.b = malloc(rows * rank * sizeof(float));
    float *w = malloc(rows * cols * sizeof(float));
    float *w0 = malloc(rows * cols * sizeof(float));
    for (uint64_t i = 0; i < rank * cols; i++)
        p.a[i] = rnd();
    for (uint64_t i = 0; i < rows * rank; i++)
        p.b[i] = rnd();
    for (uint64_t i = 0; i < rows * cols; i++)
        w0[i] = w[i] = rnd();
    for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
        uint64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        ferry__lora_apply_rows(&p, scale, r0, n, w + r0 * cols);
    }
    int bad = 0;
    for (uint64_t i = 0; i < rows && bad < 5; i++)
        for (uint64_t j = 0; j < cols; j++) {
            double ref = w0[i * cols + j], mag = fabs(ref);
            for (uint32_t k = 0; k < rank; k++) {
                double t = (double)scale * p.b[i * rank + k] * p.a[k * cols + j];
                ref += t;
                mag += fabs(t);
            }
            if (fabs((double)w[i * cols + j] - ref) > 1e-6 * mag + 1e-30) {
                if (bad++ < 3)
                    fprintf(stderr, "merge %llux%llu r%u chunk %llu: [%llu,%llu] %.9g vs %.9g\n",
                            (unsigned long long)rows, (unsigned long long)cols, rank,
                            (unsigned long long)chunk, (unsigned long long)i,
                            (unsigned long long)j, (double)w[i * cols + j], ref);
            }
        }
    free(p.a);
    free(p.b);
    free(w);
    free(w0);
    return bad;
}

static void test_merge(void)
{
    static const struct {
        uint64_t rows, cols;
        uint32_t rank;
    } sizes[] = {{37, 29, 5}, {1, 1, 1}, {13, 67, 3}, {64, 96, 8}, {129, 33, 7}, {5, 301, 13}};
    static const uint64_t chunks[] = {1, 3, 7, 16, 1000};
    for (size_t s = 0; s < N_OF(sizes); s++)
        for (size_t c = 0; c < N_OF(chunks); c++)
            CHECK_EQ_INT(merge_case(sizes[s].rows, sizes[s].cols, sizes[s].rank,
                                    c % 2 ? -0.625f : 1.75f, chunks[c]),
                         0);

    /* calls outside the pair's rows, or with nothing loaded, change nothing */
    ferry__lora_pair p;
    memset(&p, 0, sizeof p);
    p.rank = 1;
    p.rows = 2;
    p.cols = 2;
    float a[2] = {1, 1}, b[2] = {1, 1}, w[4] = {0, 0, 0, 0};
    ferry__lora_apply_rows(&p, 1.0f, 0, 2, w);
    CHECK(w[0] == 0 && w[3] == 0);
    p.a = a;
    p.b = b;
    ferry__lora_apply_rows(&p, 1.0f, 1, 2, w);
    ferry__lora_apply_rows(&p, 1.0f, 3, 1, w);
    CHECK(w[0] == 0 && w[3] == 0);
    ferry__lora_apply_rows(&p, 1.0f, 1, 1, w + 2);
    CHECK(w[0] == 0 && w[1] == 0 && w[2] == 1 && w[3] == 1);

    /* scale rules */
    p.rank = 4;
    p.alpha = NAN;
    CHECK(ferry__lora_scale(&p, 0.5f) == 0.5f);
    p.alpha = 8.0f;
    CHECK(ferry__lora_scale(&p, 0.5f) == 1.0f);
    p.alpha = 1.0f;
    CHECK(ferry__lora_scale(&p, -2.0f) == -0.5f);
    p.rows = 10;
    p.cols = 30;
    CHECK_EQ_INT(ferry__lora_pair_bytes(&p), (4 * 30 + 10 * 4) * 4);

    /* a loaded GGUF adapter merged into a copy of its base weight, against float64 */
    ferry__err e = {0};
    ferry__adapter *ad = open_ok(path_of("lora.gguf"), &e);
    ferry__lora_pair *d = ad ? pair_named(ad, "blk.1.ffn_down.weight") : NULL;
    if (d && ferry__adapter_load(ad, d, &e) == 0) {
        float scale = ferry__lora_scale(d, 0.8f);
        CHECK(fabsf(scale - 0.8f * 6.0f / 3.0f) < 1e-6f);
        float *wm = malloc(d->rows * d->cols * sizeof *wm);
        for (uint64_t i = 0; i < d->rows * d->cols; i++)
            wm[i] = val_of("blk.1.ffn_down.weight", i);
        ferry__lora_apply_rows(d, scale, 0, 5, wm);
        ferry__lora_apply_rows(d, scale, 5, d->rows - 5, wm + 5 * d->cols);
        int bad = 0;
        for (uint64_t i = 0; i < d->rows; i++)
            for (uint64_t j = 0; j < d->cols; j++) {
                double ref = val_of("blk.1.ffn_down.weight", i * d->cols + j), mag = fabs(ref);
                for (uint32_t k = 0; k < d->rank; k++) {
                    /* B (o, r) is element o*rank + r of lora_b; A (r, c) element r*in + c */
                    double t = (double)scale *
                               round_trip(FERRY_DTYPE_F16,
                                          val_of("blk.1.ffn_down.weight.lora_b", i * 3 + k)) *
                               round_trip(FERRY_DTYPE_F16,
                                          val_of("blk.1.ffn_down.weight.lora_a", k * 24 + j));
                    ref += t;
                    mag += fabs(t);
                }
                bad += fabs(wm[i * d->cols + j] - ref) > 1e-6 * mag;
            }
        CHECK_EQ_INT(bad, 0);
        free(wm);
    } else {
        CHECK(0);
    }
    ferry__adapter_close(ad);
}

/* ---- the generator (ferry gen --lora) ---------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(len > 0 ? (size_t)len : 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return p;
}

static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *pa = slurp(a, &na), *pb = slurp(b, &nb);
    int same = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return same;
}

/* Generates an adapter of every scheme for BASE and checks it maps fully with N_EXPECT pairs
 * (N_CONV of them conv kernels), loads, and is deterministic. */
static void gen_case(const char *tag, const char *base_path, size_t n_expect, size_t n_conv)
{
    static const char *const schemes[] = {"peft", "kohya", "gguf"};
    for (size_t s = 0; s < N_OF(schemes); s++) {
        char out[4096], out2[4200], out3[4200];
        snprintf(out, sizeof out, "%s/gen_%s_%s.%s", dir, tag, schemes[s],
                 s == 2 ? "gguf" : "safetensors");
        snprintf(out2, sizeof out2, "%s.again", out);
        snprintf(out3, sizeof out3, "%s.seed2", out);
        CHECK_EQ_INT(ferry_gen_lora(base_path, out, 4, schemes[s], 7, 1), 0);
        CHECK_EQ_INT(ferry_gen_lora(base_path, out2, 4, schemes[s], 7, 1), 0);
        CHECK_EQ_INT(ferry_gen_lora(base_path, out3, 4, schemes[s], 8, 1), 0);
        CHECK(same_file(out, out2));
        CHECK(!same_file(out, out3));

        ferry__err e = {0};
        ferry__adapter *a = open_ok(out, &e);
        if (!a)
            continue;
        CHECK_STR(a->scheme, schemes[s]);
        CHECK_EQ_INT(a->n_pairs, n_expect);
        ferry_catalog *base = open_base(base_path, NULL);
        int rc = ferry__adapter_map(a, base, NULL, NULL, &e);
        if (rc)
            fprintf(stderr, "gen %s %s: %s\n", tag, schemes[s], e.msg);
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(a->n_matched, n_expect);
        size_t convs = 0, nonzero_b = 0;
        for (size_t k = 0; k < a->n_pairs; k++) {
            ferry__lora_pair *p = &a->pairs[k];
            CHECK_EQ_INT(p->rank, 4);
            CHECK(p->alpha == 8.0f);
            if (p->base_name) {
                ferry_tensor_info t;
                ferry_catalog_tensor(base, (size_t)ferry_catalog_find(base, p->base_name), &t);
                convs += t.ndim == 4;
            }
            if (ferry__adapter_load(a, p, &e) != 0) {
                CHECK(0);
                continue;
            }
            for (uint64_t i = 0; i < p->rows * p->rank; i++)
                if (p->b[i] != 0.0f) {
                    nonzero_b++;
                    break;
                }
        }
        CHECK_EQ_INT(convs, n_conv);
        CHECK_EQ_INT(nonzero_b, n_expect);
        ferry_catalog_destroy(base);
        ferry__adapter_close(a);
    }
}

static void test_gen(void)
{
    /* llama base: 2 layers x 7 matrices; unet base: to_q/k/v/out, attn2.to_k, ff x2, 3 convs */
    gen_case("llama", llama_base(), 14, 0);
    gen_case("unet", unet_base(), 10, 3);

    const char *out = path_of("gen_bad.safetensors");
    CHECK_EQ_INT(ferry_gen_lora(llama_base(), out, 4, "lycoris", 1, 1), 2);
    CHECK_EQ_INT(ferry_gen_lora(llama_base(), out, 0, "peft", 1, 1), 2);
    CHECK_EQ_INT(ferry_gen_lora(te_base(), out, 4, "peft", 1, 1), 0); /* q_proj only */
    CHECK_EQ_INT(ferry_gen_lora(path_of("missing.gguf"), out, 4, "peft", 1, 1), 1);
    const char *nothing = path_of("norms.safetensors");
    tspec ts[] = {T1("norm.weight", FERRY_DTYPE_F32, 8)};
    CHECK_EQ_INT(write_file(nothing, FERRY_FORMAT_SAFETENSORS, ts, 1, NULL, 0), 0);
    CHECK_EQ_INT(ferry_gen_lora(nothing, path_of("gen_none.safetensors"), 4, "peft", 1, 1), 1);
    struct stat st;
    CHECK(stat(path_of("gen_none.safetensors"), &st) != 0);

#ifdef FERRY_CLI
    /* the CLI's synthetic models, with every real name of their architectures */
    if (access(FERRY_CLI, X_OK) == 0) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "%s gen --arch llama --layers 2 --dim 64 --vocab 256 -q -o '%s/synth_llama.gguf' && "
                 "%s gen --arch unet --layers 1 --dim 32 -q -o '%s/synth_unet.safetensors'",
                 FERRY_CLI, dir, FERRY_CLI, dir);
        if (system(cmd) == 0) {
            gen_case("synth_llama", path_of("synth_llama.gguf"), 14, 0);
            /* unet: count targets by name to compare */
            ferry_catalog *c = open_base(path_of("synth_unet.safetensors"), NULL);
            size_t n = 0, nc = 0;
            for (size_t i = 0; i < ferry_catalog_count(c); i++) {
                ferry_tensor_info t;
                ferry_catalog_tensor(c, i, &t);
                n += ferry_gen_lora_is_target(&t);
                nc += ferry_gen_lora_is_target(&t) && t.ndim == 4;
            }
            ferry_catalog_destroy(c);
            CHECK(n > 40 && nc > 10);
            gen_case("synth_unet", path_of("synth_unet.safetensors"), n, nc);
        } else {
            CHECK(0);
        }
    }
#endif
}

int main(void)
{
    dir = check_tmpdir("lora");
    if (!llama_base()[0] || !unet_base()[0] || !te_base()[0]) {
        fprintf(stderr, "cannot write the base models\n");
        return 1;
    }
    test_matrix_view();
    test_peft_llama();
    test_peft_default_and_unet();
    test_peft_config();
    test_kohya();
    test_gguf_lora();
    test_hostile();
    test_merge();
    test_gen();
    int rc = check_finish();
    if (rc == 0)
        check_rmdir(dir);
    return rc;
}
