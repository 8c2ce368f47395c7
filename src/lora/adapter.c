/*
 * adapter.c — LoRA adapter files: opening one through the public catalog, recognising its naming
 * scheme (PEFT, kohya, GGUF LoRA) from the tensor names, pairing each A (down) factor with its B
 * (up) factor, reading alphas, mapping the pairs to base tensor names, and reading the factors
 * into f32 caches.
 *
 * Factor shapes are normalised to the outermost-first order before anything else, so that every
 * scheme reads the same: A is [rank, in, (kh, kw)], B is [out, rank, (1, 1)]. A GGUF lora_a with
 * ne = [in, rank] is then [rank, in] and its bytes are already A row-major; lora_b with
 * ne = [rank, out] is [out, rank], B row-major. Nothing is ever transposed.
 *
 * Everything an adapter file says is checked before use: a factor without its partner, rank 0,
 * ranks that disagree, a B whose kernel is not 1x1, a factor of an integer type, an alpha that is
 * no finite number, and variants whose merge is not W + s.B.A (LoCon mid factors, DoRA
 * magnitudes, LoHa/LoKr, embedding LoRA) are refused with FERRY_ELORA naming file and tensor —
 * merging them as plain LoRA would silently produce wrong weights.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype/dtype.h"
#include "formats/catalog.h"
#include "formats/formats.h"
#include "io/io.h"
#include "lora/lora.h"

#define NO_INDEX SIZE_MAX

enum { SCHEME_NONE = -1, SCHEME_PEFT = 0, SCHEME_KOHYA = 1, SCHEME_GGUF = 2 };
static const char *const scheme_names[] = {"peft", "kohya", "gguf"};

enum { KIND_A = 0, KIND_B = 1 };

typedef struct factor_rule {
    const char *suffix;
    int kind;
    int scheme;
} factor_rule;

static const factor_rule factor_rules[] = {
    {".lora_A.weight", KIND_A, SCHEME_PEFT},
    {".lora_B.weight", KIND_B, SCHEME_PEFT},
    {".lora_A.default.weight", KIND_A, SCHEME_PEFT},
    {".lora_B.default.weight", KIND_B, SCHEME_PEFT},
    {".lora_down.weight", KIND_A, SCHEME_KOHYA},
    {".lora_up.weight", KIND_B, SCHEME_KOHYA},
    {".lora_a", KIND_A, SCHEME_GGUF},
    {".lora_b", KIND_B, SCHEME_GGUF},
};

/* Name fragments of adapter variants that are not plain W + s.B.A. */
static const char *const unsupported_marks[] = {
    ".lora_mid.", ".dora_scale", "lora_magnitude_vector", "lora_embedding_A", "lora_embedding_B",
    ".hada_w", ".hada_t", ".lokr_w", ".lokr_t",
};

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

void ferry__adapter_close(ferry__adapter *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n_pairs; i++) {
        ferry__lora_pair *p = &a->pairs[i];
        free(p->stem);
        free(p->base_name);
        free(p->a);
        free(p->b);
    }
    free(a->pairs);
    ferry_catalog_destroy(a->cat);
    free(a->path);
    free(a);
}

/* ---- reading small things --------------------------------------------------------------------- */

static const ferry__iofile *tensor_file(const ferry_catalog *c, size_t i)
{
    return ferry__catalog_file(c, ferry__catalog_tensor_file(c, i));
}

/* A metadata value as a number: 1 and *out when it is one (strings are parsed whole), else 0. */
static int meta_number(const ferry_value *v, double *out)
{
    switch (v->type) {
    case FERRY_VALUE_F32:
    case FERRY_VALUE_F64: *out = v->v.f; break;
    case FERRY_VALUE_U8:
    case FERRY_VALUE_U16:
    case FERRY_VALUE_U32:
    case FERRY_VALUE_U64: *out = (double)v->v.u; break;
    case FERRY_VALUE_I8:
    case FERRY_VALUE_I16:
    case FERRY_VALUE_I32:
    case FERRY_VALUE_I64: *out = (double)v->v.i; break;
    case FERRY_VALUE_STRING: {
        const char *s = v->v.str.ptr;
        if (!s || strlen(s) != v->v.str.len)
            return 0;
        char *end;
        errno = 0;
        double d = strtod(s, &end);
        if (end == s || errno == ERANGE)
            return 0;
        while (isspace((unsigned char)*end))
            end++;
        if (*end)
            return 0;
        *out = d;
        break;
    }
    default: return 0;
    }
    return isfinite(*out);
}

/* The adapter-wide alpha from the file's metadata. Keys that only LoRA tools write must hold a
 * number; the generic ones ("alpha", kohya's "ss_network_alpha", which may say "Dynamic") are
 * used only when they do. */
static int metadata_alpha(ferry__adapter *a, ferry__err *e)
{
    static const struct {
        const char *key;
        int strict;
    } keys[] = {{"adapter.lora.alpha", 1}, {"lora_alpha", 1}, {"alpha", 0}, {"ss_network_alpha", 0}};
    for (size_t k = 0; k < FERRY__ARRAY_LEN(keys); k++) {
        const ferry_value *v = ferry_catalog_meta_find(a->cat, keys[k].key);
        if (!v)
            continue;
        double d;
        if (meta_number(v, &d)) {
            a->default_alpha = (float)d;
            if (!isfinite(a->default_alpha))
                return ferry__fail(e, FERRY_ELORA, "%s: metadata '%s' = %g does not fit a float",
                                   a->path, keys[k].key, d);
            return 0;
        }
        if (keys[k].strict)
            return ferry__fail(e, FERRY_ELORA, "%s: metadata '%s' is not a finite number%s%.40s%s",
                               a->path, keys[k].key, v->type == FERRY_VALUE_STRING ? " ('" : "",
                               v->type == FERRY_VALUE_STRING ? v->v.str.ptr : "",
                               v->type == FERRY_VALUE_STRING ? "')" : "");
    }
    return 0;
}

/* Reads the per-module alpha tensor I (a 0-dim or one-element float tensor). */
static int read_alpha_tensor(ferry__adapter *a, size_t i, float *out, ferry__err *e)
{
    ferry_tensor_info t;
    ferry_catalog_tensor(a->cat, i, &t);
    if (t.n_elems != 1)
        return ferry__fail(e, FERRY_ELORA, "%s: alpha tensor '%s' has %llu elements, not 1",
                           a->path, t.name, (unsigned long long)t.n_elems);
    if (t.dtype != FERRY_DTYPE_F32 && t.dtype != FERRY_DTYPE_F16 && t.dtype != FERRY_DTYPE_BF16 &&
        t.dtype != FERRY_DTYPE_F64)
        return ferry__fail(e, FERRY_ELORA, "%s: alpha tensor '%s' is %s, not a float type",
                           a->path, t.name, ferry_dtype_name(t.dtype));
    unsigned char buf[8];
    if (t.nbytes > sizeof buf)
        return ferry__fail(e, FERRY_ELORA, "%s: alpha tensor '%s' holds %llu bytes", a->path,
                           t.name, (unsigned long long)t.nbytes);
    int rc = ferry__io_read(tensor_file(a->cat, i), t.offset, t.nbytes, buf, FERRY_LOAD_READ, e);
    if (rc)
        return rc;
    if ((rc = ferry__to_f32(t.dtype, buf, out, 1)) != 0)
        return ferry__fail(e, rc, "%s: alpha tensor '%s': cannot read %s", a->path, t.name,
                           ferry_dtype_name(t.dtype));
    if (!isfinite(*out))
        return ferry__fail(e, FERRY_ELORA, "%s: alpha tensor '%s' is %g, not a finite number",
                           a->path, t.name, (double)*out);
    return 0;
}

/* ---- PEFT's adapter_config.json ----------------------------------------------------------------
 * PEFT writes alpha not into adapter_model.safetensors but beside it, in adapter_config.json
 * ("lora_alpha", "use_rslora", "alpha_pattern"). Without it every PEFT adapter trained with
 * alpha != r would be merged at the wrong strength, so it is read when the adapter file has PEFT's
 * own file name and its metadata gives no alpha. */

#define PEFT_CONFIG_MAX (UINT64_C(1) << 20)

typedef struct peft_config {
    char *text;         /* the file's bytes: JSON numbers point into them */
    ferry__json root;
    int have_root;
    double alpha;       /* NAN when absent */
    int rslora;
    const ferry__json *pattern; /* alpha_pattern object, or NULL */
} peft_config;

static int json_number(const ferry__json *j, double *out)
{
    if (!j || j->type != FERRY__JSON_NUMBER || j->num_len == 0 || j->num_len > 63)
        return 0;
    char buf[64];
    memcpy(buf, j->num, j->num_len);
    buf[j->num_len] = 0;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && isfinite(*out);
}

/* Reads DIR/adapter_config.json into CFG when it exists; a config that exists but cannot be
 * read or makes no sense is an error (it would decide the merge's strength). */
static int peft_config_read(const ferry__adapter *a, peft_config *cfg, ferry__err *e)
{
    cfg->alpha = NAN;
    const char *slash = strrchr(a->path, '/');
    const char *base = slash ? slash + 1 : a->path;
    if (strcmp(base, "adapter_model.safetensors") != 0)
        return 0;
    char *cpath = ferry__asprintf("%.*sadapter_config.json", (int)(base - a->path), a->path);
    if (!cpath)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    int rc = 0;
    int fd = open(cpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)
            rc = ferry__fail(e, FERRY_EIO, "%s: %s", cpath, strerror(errno));
        goto done;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = ferry__fail(e, FERRY_EIO, "%s: not a regular file", cpath);
        goto done;
    }
    if ((uint64_t)st.st_size > PEFT_CONFIG_MAX) {
        rc = ferry__fail(e, FERRY_ELIMIT, "%s: %lld bytes (limit %llu)", cpath,
                         (long long)st.st_size, (unsigned long long)PEFT_CONFIG_MAX);
        goto done;
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *text = cfg->text = malloc(len + 1);
    if (!text) {
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto done;
    }
    while (got < len) {
        ssize_t r = read(fd, text + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = ferry__fail(e, FERRY_EIO, "%s: read failed at byte %zu", cpath, got);
            goto done;
        }
        got += (size_t)r;
    }
    if ((rc = ferry__json_parse(text, len, cpath, &cfg->root, e)) != 0)
        goto done;
    cfg->have_root = 1;
    if (cfg->root.type != FERRY__JSON_OBJECT) {
        rc = ferry__fail(e, FERRY_ELORA, "%s: not a JSON object", cpath);
        goto done;
    }
    const ferry__json *v = ferry__json_get(&cfg->root, "lora_alpha");
    if (v && v->type != FERRY__JSON_NULL && !json_number(v, &cfg->alpha)) {
        rc = ferry__fail(e, FERRY_ELORA, "%s: \"lora_alpha\" is not a finite number", cpath);
        goto done;
    }
    v = ferry__json_get(&cfg->root, "use_rslora");
    cfg->rslora = v && v->type == FERRY__JSON_BOOL && v->b;
    v = ferry__json_get(&cfg->root, "alpha_pattern");
    if (v && v->type == FERRY__JSON_OBJECT && v->n) {
        for (size_t i = 0; i < v->n; i++) {
            double d;
            if (!json_number(&v->items[i], &d)) {
                rc = ferry__fail(e, FERRY_ELORA, "%s: alpha_pattern \"%s\" is not a number",
                                 cpath, v->keys[i]);
                goto done;
            }
        }
        cfg->pattern = v;
    }
done:
    if (fd >= 0)
        close(fd);
    free(cpath);
    return rc;
}

/* The alpha_pattern entry for STEM: keys name a module by its trailing dotted components. */
static int peft_pattern_alpha(const peft_config *cfg, const char *stem, double *out)
{
    if (!cfg->pattern)
        return 0;
    size_t n = strlen(stem);
    for (size_t i = 0; i < cfg->pattern->n; i++) {
        const char *k = cfg->pattern->keys[i];
        size_t kn = strlen(k);
        if (kn == 0 || kn > n || memcmp(stem + n - kn, k, kn) != 0)
            continue;
        if (kn < n && stem[n - kn - 1] != '.')
            continue;
        return json_number(&cfg->pattern->items[i], out);
    }
    return 0;
}

/* ---- opening ---------------------------------------------------------------------------------- */

static int factor_dtype_ok(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_I8:
    case FERRY_DTYPE_I16:
    case FERRY_DTYPE_I32:
    case FERRY_DTYPE_I64:
    case FERRY_DTYPE_U8:
    case FERRY_DTYPE_U16:
    case FERRY_DTYPE_U32:
    case FERRY_DTYPE_U64:
    case FERRY_DTYPE_BOOL: return 0;
    default: return ferry__dtype_readable(t);
    }
}

/* D = the shape of T outermost first. */
static void outer_first(const ferry_tensor_info *t, uint64_t *d)
{
    for (uint32_t i = 0; i < t->ndim; i++)
        d[i] = (uint64_t)(t->format == FERRY_FORMAT_GGUF ? t->shape[t->ndim - 1 - i]
                                                         : t->shape[i]);
}

static char *fmt_shape(const ferry_tensor_info *t, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (uint32_t i = 0; i < t->ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

/* Checks pair P's factor shapes and sets rank, rows, cols. */
static int pair_shapes(ferry__adapter *a, ferry__lora_pair *p, ferry__err *e)
{
    ferry_tensor_info ta, tb;
    ferry_catalog_tensor(a->cat, p->a_index, &ta);
    ferry_catalog_tensor(a->cat, p->b_index, &tb);
    char sa[160], sb[160];
    const ferry_tensor_info *ts[2] = {&ta, &tb};
    for (int k = 0; k < 2; k++)
        if (!factor_dtype_ok(ts[k]->dtype))
            return ferry__fail(e, FERRY_ELORA, "%s: LoRA factor '%s' is %s, not a float type",
                               a->path, ts[k]->name, ferry_dtype_name(ts[k]->dtype));
    if (ta.ndim < 2)
        return ferry__fail(e, FERRY_ELORA,
                           "%s: LoRA factor '%s' has shape %s: A needs [rank, in, ...]", a->path,
                           ta.name, fmt_shape(&ta, sa, sizeof sa));
    if (tb.ndim < 2)
        return ferry__fail(e, FERRY_ELORA,
                           "%s: LoRA factor '%s' has shape %s: B needs [out, rank, ...]", a->path,
                           tb.name, fmt_shape(&tb, sb, sizeof sb));
    uint64_t da[FERRY_MAX_DIMS], db[FERRY_MAX_DIMS];
    outer_first(&ta, da);
    outer_first(&tb, db);
    for (uint32_t i = 2; i < tb.ndim; i++)
        if (db[i] != 1)
            return ferry__fail(e, FERRY_ELORA,
                               "%s: LoRA factor '%s' has shape %s: the up factor's kernel must be "
                               "1x1",
                               a->path, tb.name, fmt_shape(&tb, sb, sizeof sb));
    if (da[0] == 0 || db[1] == 0)
        return ferry__fail(e, FERRY_ELORA, "%s: LoRA factors '%s' %s and '%s' %s have rank 0",
                           a->path, ta.name, fmt_shape(&ta, sa, sizeof sa), tb.name,
                           fmt_shape(&tb, sb, sizeof sb));
    if (da[0] != db[1])
        return ferry__fail(e, FERRY_ELORA,
                           "%s: LoRA factors disagree on the rank: '%s' %s has %llu, '%s' %s "
                           "has %llu",
                           a->path, ta.name, fmt_shape(&ta, sa, sizeof sa),
                           (unsigned long long)da[0], tb.name, fmt_shape(&tb, sb, sizeof sb),
                           (unsigned long long)db[1]);
    if (da[0] > UINT32_MAX)
        return ferry__fail(e, FERRY_ELIMIT, "%s: LoRA factor '%s': rank %llu", a->path, ta.name,
                           (unsigned long long)da[0]);
    uint64_t cols = 1;
    for (uint32_t i = 1; i < ta.ndim; i++)
        if (ferry__mul_u64(cols, da[i], &cols))
            return ferry__fail(e, FERRY_EOVERFLOW, "%s: LoRA factor '%s': shape %s overflows",
                               a->path, ta.name, fmt_shape(&ta, sa, sizeof sa));
    if (cols == 0 || db[0] == 0)
        return ferry__fail(e, FERRY_ELORA, "%s: LoRA factors '%s' %s and '%s' %s are empty",
                           a->path, ta.name, fmt_shape(&ta, sa, sizeof sa), tb.name,
                           fmt_shape(&tb, sb, sizeof sb));
    p->rank = (uint32_t)da[0];
    p->rows = db[0];
    p->cols = cols;
    return 0;
}

static int grow_pairs(ferry__adapter *a, size_t *cap)
{
    if (a->n_pairs < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    ferry__lora_pair *np = realloc(a->pairs, nc * sizeof *np);
    if (!np)
        return FERRY_ENOMEM;
    a->pairs = np;
    *cap = nc;
    return 0;
}

/* Finds pairs and alpha tensors in the catalog. */
static int scan(ferry__adapter *a, ferry__hmap *stems, ferry__err *e)
{
    size_t n = ferry_catalog_count(a->cat), cap = 0;
    int scheme = SCHEME_NONE;
    size_t scheme_tensor = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info t;
        ferry_catalog_tensor(a->cat, i, &t);
        size_t len = strlen(t.name);
        /* PEFT modules_to_save: whole trained copies of a module that replace the base weight
         * while the adapter is active. Skipping them would apply the adapter without them. */
        if (strstr(t.name, ".modules_to_save.") || strstr(t.name, ".original_module."))
            return ferry__fail(e, FERRY_ELORA,
                               "%s: tensor '%s' is a PEFT modules_to_save weight (a full "
                               "replacement of the base weight, not a low-rank term), which "
                               "ferry does not apply; merge it into the base model first",
                               a->path, t.name);
        for (size_t m = 0; m < FERRY__ARRAY_LEN(unsupported_marks); m++)
            if (strstr(t.name, unsupported_marks[m]))
                return ferry__fail(e, FERRY_ELORA,
                                   "%s: tensor '%s' belongs to an adapter variant ferry does not "
                                   "merge (only plain LoRA: W + scale * B.A)",
                                   a->path, t.name);
        const factor_rule *r = NULL;
        for (size_t k = 0; k < FERRY__ARRAY_LEN(factor_rules) && !r; k++)
            if (ends_with(t.name, len, factor_rules[k].suffix))
                r = &factor_rules[k];
        if (!r)
            continue; /* alpha tensors are read afterwards; anything else is not ours */
        if (scheme == SCHEME_NONE) {
            scheme = r->scheme;
            scheme_tensor = i;
        } else if (scheme != r->scheme) {
            ferry_tensor_info t0;
            ferry_catalog_tensor(a->cat, scheme_tensor, &t0);
            return ferry__fail(e, FERRY_ELORA,
                               "%s: mixes LoRA naming schemes: '%s' is %s, '%s' is %s", a->path,
                               t0.name, scheme_names[scheme], t.name, scheme_names[r->scheme]);
        }
        char *stem = ferry__strndup(t.name, len - strlen(r->suffix));
        if (!stem)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory");
        uint64_t pi;
        ferry__lora_pair *p;
        if (ferry__hmap_get(stems, stem, &pi)) {
            free(stem);
            p = &a->pairs[pi];
        } else {
            if (grow_pairs(a, &cap)) {
                free(stem);
                return ferry__fail(e, FERRY_ENOMEM, "out of memory");
            }
            p = &a->pairs[a->n_pairs];
            memset(p, 0, sizeof *p);
            p->stem = stem;
            p->alpha = NAN;
            p->a_index = p->b_index = NO_INDEX;
            a->n_pairs++;
            if (ferry__hmap_put(stems, p->stem, a->n_pairs - 1, NULL))
                return ferry__fail(e, FERRY_ENOMEM, "out of memory");
        }
        size_t *slot = r->kind == KIND_A ? &p->a_index : &p->b_index;
        if (*slot != NO_INDEX) {
            ferry_tensor_info t0;
            ferry_catalog_tensor(a->cat, *slot, &t0);
            return ferry__fail(e, FERRY_ELORA, "%s: LoRA factors '%s' and '%s' are both the %s of '%s'",
                               a->path, t0.name, t.name, r->kind == KIND_A ? "A (down)" : "B (up)",
                               p->stem);
        }
        *slot = i;
    }
    if (scheme == SCHEME_NONE)
        return ferry__fail(e, FERRY_ELORA,
                           "%s: no LoRA factors (no tensor named *.lora_A.weight / *.lora_B.weight, "
                           "*.lora_down.weight / *.lora_up.weight, or *.lora_a / *.lora_b)",
                           a->path);
    a->scheme = scheme_names[scheme];
    return 0;
}

static int check_pairs(ferry__adapter *a, ferry__err *e)
{
    for (size_t k = 0; k < a->n_pairs; k++) {
        ferry__lora_pair *p = &a->pairs[k];
        if (p->a_index == NO_INDEX || p->b_index == NO_INDEX) {
            ferry_tensor_info t;
            ferry_catalog_tensor(a->cat, p->a_index == NO_INDEX ? p->b_index : p->a_index, &t);
            return ferry__fail(e, FERRY_ELORA, "%s: LoRA factor '%s' has no %s partner for '%s'",
                               a->path, t.name, p->a_index == NO_INDEX ? "A (down)" : "B (up)",
                               p->stem);
        }
        int rc = pair_shapes(a, p, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* Sets each pair's alpha: its own alpha tensor, else the file-wide alpha (metadata or PEFT
 * config), else NAN (alpha = rank). */
static int read_alphas(ferry__adapter *a, const ferry__hmap *stems, ferry__err *e)
{
    int rc = metadata_alpha(a, e);
    if (rc)
        return rc;
    peft_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.alpha = NAN;
    if (strcmp(a->scheme, "peft") == 0 && isnan(a->default_alpha)) {
        if ((rc = peft_config_read(a, &cfg, e)) != 0)
            goto done;
        if (!isnan(cfg.alpha)) {
            a->default_alpha = (float)cfg.alpha;
            if (!isfinite(a->default_alpha)) {
                rc = ferry__fail(e, FERRY_ELORA, "%s: lora_alpha %g does not fit a float",
                                 a->path, cfg.alpha);
                goto done;
            }
        }
    }
    for (size_t k = 0; k < a->n_pairs; k++) {
        ferry__lora_pair *p = &a->pairs[k];
        double d;
        p->alpha = peft_pattern_alpha(&cfg, p->stem, &d) ? (float)d : a->default_alpha;
        /* rsLoRA: scale = alpha / sqrt(r), written as alpha' / r */
        if (cfg.rslora && !isnan(p->alpha))
            p->alpha = (float)((double)p->alpha * sqrt((double)p->rank));
    }
    size_t n = ferry_catalog_count(a->cat);
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info t;
        ferry_catalog_tensor(a->cat, i, &t);
        size_t len = strlen(t.name);
        if (!ends_with(t.name, len, ".alpha"))
            continue;
        char *stem = ferry__strndup(t.name, len - 6);
        if (!stem) {
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            goto done;
        }
        uint64_t pi;
        int found = ferry__hmap_get(stems, stem, &pi);
        free(stem);
        if (!found)
            continue; /* an alpha for factors the file does not hold changes nothing */
        if ((rc = read_alpha_tensor(a, i, &a->pairs[pi].alpha, e)) != 0)
            goto done;
    }
done:
    if (cfg.have_root)
        ferry__json_free(&cfg.root);
    free(cfg.text);
    return rc;
}

int ferry__adapter_open(const char *path, ferry__adapter **out, ferry__err *e)
{
    if (out)
        *out = NULL;
    if (!path || !*path || !out)
        return ferry__fail(e, FERRY_EINVAL, "ferry__adapter_open: no path");
    ferry__adapter *a = calloc(1, sizeof *a);
    if (!a)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    a->default_alpha = NAN;
    a->path = ferry__strdup(path);
    a->cat = ferry_catalog_create();
    ferry__hmap stems = {0};
    int rc;
    if (!a->path || !a->cat) {
        rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = ferry_catalog_add(a->cat, path, NULL)) != 0) {
        const char *msg = ferry_catalog_errmsg(a->cat);
        if (!*msg)
            rc = ferry__fail(e, rc, "%s: %s", path, ferry_strerror(rc));
        else if (strstr(msg, path))
            rc = ferry__fail(e, rc, "%s", msg);
        else
            rc = ferry__fail(e, rc, "%s: %s", path, msg);
        goto fail;
    }
    const char *type = NULL;
    if (ferry_catalog_get_str(a->cat, "adapter.type", &type) == 0 && strcmp(type, "lora") != 0) {
        rc = ferry__fail(e, FERRY_ELORA, "%s: adapter.type is '%s', not 'lora'", path, type);
        goto fail;
    }
    if ((rc = scan(a, &stems, e)) != 0 || (rc = check_pairs(a, e)) != 0 ||
        (rc = read_alphas(a, &stems, e)) != 0)
        goto fail;
    ferry__hmap_free(&stems);
    *out = a;
    return 0;
fail:
    ferry__hmap_free(&stems);
    ferry__adapter_close(a);
    return rc;
}

/* ---- mapping to base tensors ---------------------------------------------------------------- */

/* Prefixes that adapter tools put in front of the base model's own names. */
static const char *const strip_prefixes[] = {
    "base_model.model.", "base_model.", "unet.", "transformer.", "text_encoder.",
    "model.diffusion_model.",
};

/* The one table of llama module names, HF -> GGUF: per layer (inside "model.layers.N." and
 * "blk.N."), and at the top level; a GGUF name maps back to its first HF spelling. */
static const char *const hf_layer_map[][2] = {
    {"self_attn.q_proj", "attn_q"},     {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},     {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_proj", "ffn_gate"},      {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},      {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
};
static const char *const hf_top_map[][2] = {
    {"model.embed_tokens", "token_embd"}, {"embed_tokens", "token_embd"},
    {"lm_head", "output"},                {"model.norm", "output_norm"},
};

/* Whether S[0..N) is LIT. */
static int same_as(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* After PREFIX in S: the layer number's digits (1..9 of them) and a '.': the digits, else NULL. */
static const char *layer_digits(const char *s, const char *prefix, size_t *n)
{
    if (!starts_with(s, prefix))
        return NULL;
    const char *p = s + strlen(prefix), *q = p;
    while (isdigit((unsigned char)*q))
        q++;
    if (q == p || *q != '.' || q - p > 9)
        return NULL;
    *n = (size_t)(q - p);
    return p;
}

/* The other spelling of module name S[0..LEN) (no ".weight"): TO_GGUF from HF, else from GGUF.
 * Written into OUT as snprintf does; returns its length, 0 when S is not in the table. */
static size_t translate_name(const char *s, size_t len, int to_gguf, char *out, size_t cap)
{
    int from = to_gguf ? 0 : 1, to = 1 - from;
    for (size_t k = 0; k < FERRY__ARRAY_LEN(hf_top_map); k++)
        if (same_as(s, len, hf_top_map[k][from]))
            return (size_t)snprintf(out, cap, "%s", hf_top_map[k][to]);
    size_t nd = 0;
    const char *p = !to_gguf                 ? layer_digits(s, "blk.", &nd)
                    : starts_with(s, "model.") ? layer_digits(s, "model.layers.", &nd)
                                               : layer_digits(s, "layers.", &nd);
    if (!p || (size_t)(p - s) + nd + 1 > len)
        return 0;
    const char *module = p + nd + 1;
    for (size_t k = 0; k < FERRY__ARRAY_LEN(hf_layer_map); k++)
        if (same_as(module, len - (size_t)(module - s), hf_layer_map[k][from]))
            return (size_t)snprintf(out, cap, to_gguf ? "blk.%.*s.%s" : "model.layers.%.*s.%s",
                                    (int)nd, p, hf_layer_map[k][to]);
    return 0;
}

/* The GGUF name of the HF llama module name S (without ".weight") into OUT, or 0. */
static int hf_to_gguf(const char *s, char *out, size_t len)
{
    return translate_name(s, strlen(s), 1, out, len) > 0;
}

/* NAME without a trailing ".weight", translated, the suffix put back. */
static size_t lora_name(const char *name, int to_gguf, char *out, size_t cap)
{
    if (!name || (!out && cap))
        return 0;
    size_t len = strlen(name);
    int weight = ends_with(name, len, ".weight");
    size_t n = translate_name(name, weight ? len - 7 : len, to_gguf, out, cap);
    if (!n || !weight)
        return n;
    if (n < cap)
        snprintf(out + n, cap - n, ".weight");
    return n + 7;
}

size_t ferry_lora_gguf_name(const char *name, char *out, size_t cap)
{
    return lora_name(name, 1, out, cap);
}

size_t ferry_lora_hf_name(const char *name, char *out, size_t cap)
{
    return lora_name(name, 0, out, cap);
}

typedef struct map_ctx {
    ferry__adapter *a;
    const ferry_catalog *base;
    const char *bp, *tp; /* base prefix, target prefix ("" for none) */
    char *buf;
    size_t buf_len;
    /* kohya: underscored base names (target prefix and ".weight" removed) -> base index */
    ferry__hmap kohya;
    ferry__hmap kohya_dup; /* keys that two base names share -> the second one */
    char **keys;
    size_t n_keys;
} map_ctx;

/* Index of base tensor TP + NAME + SUFFIX when it exists and qualifies, else -1. */
static int64_t try_name(map_ctx *m, const char *name, const char *suffix)
{
    size_t need = strlen(m->tp) + strlen(name) + strlen(suffix) + 1;
    if (need > m->buf_len) {
        char *nb = realloc(m->buf, need);
        if (!nb)
            return -2;
        m->buf = nb;
        m->buf_len = need;
    }
    snprintf(m->buf, m->buf_len, "%s%s%s", m->tp, name, suffix);
    int64_t i = ferry_catalog_find(m->base, m->buf);
    if (i < 0 || !starts_with(m->buf, m->bp))
        return -1;
    return i;
}

/* PEFT and GGUF names: the name itself, then with known prefixes stripped one at a time; each
 * with and without ".weight", then as an HF llama name translated to GGUF. */
static int64_t lookup_plain(map_ctx *m, const char *stem)
{
    const char *v = stem;
    char gg[256];
    for (int step = 0; step < 8; step++) {
        int64_t i;
        if ((i = try_name(m, v, ".weight")) != -1 || (i = try_name(m, v, "")) != -1)
            return i;
        if (hf_to_gguf(v, gg, sizeof gg) &&
            ((i = try_name(m, gg, ".weight")) != -1 || (i = try_name(m, gg, "")) != -1))
            return i;
        const char *next = NULL;
        for (size_t k = 0; k < FERRY__ARRAY_LEN(strip_prefixes) && !next; k++)
            if (starts_with(v, strip_prefixes[k]) && v[strlen(strip_prefixes[k])])
                next = v + strlen(strip_prefixes[k]);
        if (!next)
            break;
        v = next;
    }
    return -1;
}

static void underscore(char *s)
{
    for (; *s; s++)
        if (*s == '.')
            *s = '_';
}

static int kohya_index(map_ctx *m, ferry__err *e)
{
    size_t n = ferry_catalog_count(m->base), tpl = strlen(m->tp);
    m->keys = calloc(n ? n : 1, sizeof *m->keys);
    if (!m->keys || ferry__hmap_reserve(&m->kohya, n))
        return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        ferry_tensor_info t;
        ferry_catalog_tensor(m->base, i, &t);
        size_t len = strlen(t.name);
        if (!starts_with(t.name, m->tp) || !starts_with(t.name, m->bp) ||
            !ends_with(t.name, len, ".weight") || len - 7 <= tpl)
            continue;
        char *k = ferry__strndup(t.name + tpl, len - 7 - tpl);
        if (!k)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory");
        m->keys[m->n_keys++] = k;
        underscore(k);
        int rc = ferry__hmap_put(&m->kohya, k, i, NULL);
        if (rc == FERRY_EDUP)
            rc = ferry__hmap_put(&m->kohya_dup, k, i, NULL);
        if (rc && rc != FERRY_EDUP)
            return ferry__fail(e, FERRY_ENOMEM, "out of memory");
    }
    return 0;
}

/* Base-name prefixes (underscored) that a kohya name's own prefix stands for, most specific
 * first; "" means the base names carry no prefix. */
static const struct {
    const char *kohya;
    const char *bases[5];
} kohya_prefixes[] = {
    {"lora_unet_", {"", "unet_", "model_diffusion_model_", "transformer_", NULL}},
    {"lora_te1_",
     {"text_encoder_", "conditioner_embedders_0_transformer_", "cond_stage_model_transformer_",
      "", NULL}},
    {"lora_te2_", {"text_encoder_2_", NULL}},
    {"lora_te3_", {"text_encoder_3_", NULL}},
    {"lora_te_", {"text_encoder_", "cond_stage_model_transformer_", "", NULL}},
};

static int64_t kohya_get(map_ctx *m, const char *key, ferry__err *e, int *err)
{
    uint64_t v, v2;
    if (!ferry__hmap_get(&m->kohya, key, &v))
        return -1;
    if (ferry__hmap_get(&m->kohya_dup, key, &v2)) {
        ferry_tensor_info t1, t2;
        ferry_catalog_tensor(m->base, (size_t)v, &t1);
        ferry_catalog_tensor(m->base, (size_t)v2, &t2);
        *err = ferry__fail(e, FERRY_ELORA,
                           "%s: kohya name '%s' fits both base tensors '%s' and '%s'",
                           m->a->path, key, t1.name, t2.name);
        return -1;
    }
    return (int64_t)v;
}

static int64_t lookup_kohya(map_ctx *m, const char *stem, ferry__err *e, int *err)
{
    const char *rest = stem;
    const char *const *bases = NULL;
    for (size_t k = 0; k < FERRY__ARRAY_LEN(kohya_prefixes) && !bases; k++)
        if (starts_with(stem, kohya_prefixes[k].kohya)) {
            rest = stem + strlen(kohya_prefixes[k].kohya);
            bases = kohya_prefixes[k].bases;
        }
    char *key = malloc(strlen(stem) + 64);
    if (!key) {
        *err = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        return -1;
    }
    int64_t i = -1;
    for (size_t k = 0; bases && bases[k] && i < 0 && !*err; k++) {
        sprintf(key, "%s%s", bases[k], rest);
        i = kohya_get(m, key, e, err);
    }
    if (i < 0 && !*err) {
        strcpy(key, stem);
        underscore(key);
        i = kohya_get(m, key, e, err);
    }
    free(key);
    return i;
}

int ferry__adapter_map(ferry__adapter *a, const ferry_catalog *base, const char *base_prefix,
                       const char *target_prefix, ferry__err *e)
{
    if (!a || !base)
        return ferry__fail(e, FERRY_EINVAL, "ferry__adapter_map: no adapter or base");
    for (size_t k = 0; k < a->n_pairs; k++) {
        free(a->pairs[k].base_name);
        a->pairs[k].base_name = NULL;
    }
    a->n_matched = 0;
    map_ctx m;
    memset(&m, 0, sizeof m);
    m.a = a;
    m.base = base;
    m.bp = base_prefix ? base_prefix : "";
    m.tp = target_prefix ? target_prefix : "";
    ferry__hmap claimed = {0}; /* base name -> pair index */
    int kohya = strcmp(a->scheme, "kohya") == 0;
    int rc = kohya ? kohya_index(&m, e) : 0;
    for (size_t k = 0; k < a->n_pairs && !rc; k++) {
        ferry__lora_pair *p = &a->pairs[k];
        int64_t bi = kohya ? lookup_kohya(&m, p->stem, e, &rc) : lookup_plain(&m, p->stem);
        if (bi == -2)
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
        if (rc || bi < 0)
            continue;
        ferry_tensor_info bt;
        ferry_catalog_tensor(base, (size_t)bi, &bt);
        uint64_t rows, cols;
        ferry__lora_matrix_view(&bt, &rows, &cols);
        if (rows != p->rows || cols != p->cols) {
            ferry_tensor_info ta, tb;
            char sa[160], sb[160], sw[160];
            ferry_catalog_tensor(a->cat, p->a_index, &ta);
            ferry_catalog_tensor(a->cat, p->b_index, &tb);
            rc = ferry__fail(e, FERRY_ELORA,
                             "%s: LoRA factors '%s' %s and '%s' %s make a %llu x %llu update, but "
                             "base tensor '%s' %s (%s) is %llu x %llu",
                             a->path, tb.name, fmt_shape(&tb, sb, sizeof sb), ta.name,
                             fmt_shape(&ta, sa, sizeof sa), (unsigned long long)p->rows,
                             (unsigned long long)p->cols, bt.name, fmt_shape(&bt, sw, sizeof sw),
                             bt.file, (unsigned long long)rows, (unsigned long long)cols);
            break;
        }
        uint64_t prev;
        int pr = ferry__hmap_put(&claimed, bt.name, k, &prev);
        if (pr == FERRY_EDUP) {
            rc = ferry__fail(e, FERRY_ELORA,
                             "%s: LoRA factors for '%s' and '%s' both map to base tensor '%s'",
                             a->path, a->pairs[prev].stem, p->stem, bt.name);
            break;
        }
        if (pr || !(p->base_name = ferry__strdup(bt.name))) {
            rc = ferry__fail(e, FERRY_ENOMEM, "out of memory");
            break;
        }
        a->n_matched++;
    }
    if (rc) {
        for (size_t k = 0; k < a->n_pairs; k++) {
            free(a->pairs[k].base_name);
            a->pairs[k].base_name = NULL;
        }
        a->n_matched = 0;
    }
    ferry__hmap_free(&claimed);
    ferry__hmap_free(&m.kohya);
    ferry__hmap_free(&m.kohya_dup);
    for (size_t k = 0; k < m.n_keys; k++)
        free(m.keys[k]);
    free(m.keys);
    free(m.buf);
    return rc;
}

/* ---- loading factors ------------------------------------------------------------------------ */

/* Reads tensor I of A's file (N elements) into a fresh f32 array. */
static int read_factor(ferry__adapter *a, size_t i, uint64_t n, float **out, ferry__err *e)
{
    *out = NULL;
    ferry_tensor_info t;
    ferry_catalog_tensor(a->cat, i, &t);
    uint64_t bytes;
    if (t.n_elems != n || ferry__mul_u64(n, sizeof(float), &bytes) || bytes > SIZE_MAX)
        return ferry__fail(e, FERRY_ELORA, "%s: LoRA factor '%s': %llu elements, expected %llu",
                           a->path, t.name, (unsigned long long)t.n_elems,
                           (unsigned long long)n);
    const ferry__iofile *f = tensor_file(a->cat, i);
    float *dst = malloc((size_t)bytes);
    if (!dst)
        return ferry__fail(e, FERRY_ENOMEM, "%s: LoRA factor '%s': out of memory (%llu bytes)",
                           a->path, t.name, (unsigned long long)bytes);
    int rc;
    if (t.dtype == FERRY_DTYPE_F32) {
        rc = t.nbytes == bytes ? ferry__io_read(f, t.offset, t.nbytes, dst, FERRY_LOAD_READ, e)
                               : ferry__fail(e, FERRY_ELORA, "%s: LoRA factor '%s': %llu bytes",
                                             a->path, t.name, (unsigned long long)t.nbytes);
    } else {
        void *raw = t.nbytes <= SIZE_MAX ? malloc(t.nbytes ? (size_t)t.nbytes : 1) : NULL;
        if (!raw) {
            free(dst);
            return ferry__fail(e, FERRY_ENOMEM, "%s: LoRA factor '%s': out of memory", a->path,
                               t.name);
        }
        rc = ferry__io_read(f, t.offset, t.nbytes, raw, FERRY_LOAD_READ, e);
        if (!rc && (rc = ferry__to_f32(t.dtype, raw, dst, n)) != 0)
            rc = ferry__fail(e, rc, "%s: LoRA factor '%s': cannot convert %s to f32", a->path,
                             t.name, ferry_dtype_name(t.dtype));
        free(raw);
    }
    for (uint64_t k = 0; !rc && k < n; k++)
        if (!isfinite(dst[k]))
            rc = ferry__fail(e, FERRY_ELORA, "%s: LoRA factor '%s': element %llu is %g", a->path,
                             t.name, (unsigned long long)k, (double)dst[k]);
    if (rc) {
        free(dst);
        return rc;
    }
    *out = dst;
    return 0;
}

int ferry__adapter_load(ferry__adapter *a, ferry__lora_pair *p, ferry__err *e)
{
    if (!a || !p)
        return ferry__fail(e, FERRY_EINVAL, "ferry__adapter_load: no adapter or pair");
    if (p->a && p->b)
        return 0;
    uint64_t na, nb;
    if (ferry__mul_u64(p->rank, p->cols, &na) || ferry__mul_u64(p->rows, p->rank, &nb))
        return ferry__fail(e, FERRY_EOVERFLOW, "%s: LoRA factors of '%s' overflow", a->path,
                           p->stem);
    float *fa = NULL, *fb = NULL;
    int rc = read_factor(a, p->a_index, na, &fa, e);
    if (!rc)
        rc = read_factor(a, p->b_index, nb, &fb, e);
    if (rc) {
        free(fa);
        free(fb);
        return rc;
    }
    free(p->a);
    free(p->b);
    p->a = fa;
    p->b = fb;
    return 0;
}
