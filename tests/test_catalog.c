/*
 * test_catalog.c — the catalog through the public interface, on files written with the writer:
 * GGUF, safetensors, a split GGUF of 3 parts, a sharded safetensors index with 2 shards, prefixes,
 * name collisions (EDUP naming both files), detection by content under misleading extensions, the
 * typed metadata getters, failures that leave the catalog unchanged, and the time to open models
 * of 10,000 tensors.
 */
#include <stdint.h>

#include "check.h"
#include "formats/catalog.h"
#include "formats/formats.h"

static const char *dir;

typedef struct tspec {
    const char *name;
    ferry_dtype dtype;
    uint32_t ndim;
    int64_t shape[4];
} tspec;

static unsigned char pattern(const char *name, uint64_t i)
{
    return (unsigned char)(ferry__hash_str(name) + i * 13);
}

/* Declares TS on W (which may already hold metadata), writes their pattern bytes to PATH. */
static int write_model(ferry_writer *w, const char *path, const tspec *ts, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t elems = 1;
        for (uint32_t d = 0; d < ts[i].ndim; d++)
            elems *= (uint64_t)ts[i].shape[d];
        uint64_t nb;
        ferry_dtype_nbytes(ts[i].dtype, elems, &nb);
        unsigned char *buf = malloc(nb ? (size_t)nb : 1);
        for (uint64_t k = 0; k < nb; k++)
            buf[k] = pattern(ts[i].name, k);
        rc = ferry_writer_write(w, buf, (size_t)nb);
        free(buf);
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "write_model %s: %s\n", path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

static const char *p_(const char *name)
{
    static char buf[8][4096];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* Tensor I's bytes in its mapped file hold the pattern of its unprefixed name. */
static int data_ok(const ferry_catalog *c, size_t i, const char *plain_name)
{
    ferry_tensor_info ti;
    if (ferry_catalog_tensor(c, i, &ti))
        return 0;
    const ferry__iofile *f = ferry__catalog_file(c, ferry__catalog_tensor_file(c, i));
    if (!f || strcmp(f->path, ti.file) != 0 || ti.offset + ti.nbytes > f->size)
        return 0;
    for (uint64_t k = 0; k < ti.nbytes; k++)
        if (f->map[ti.offset + k] != pattern(plain_name, k))
            return 0;
    return 1;
}

/* A snapshot of what a catalog shows, to prove a failed add changed nothing. */
typedef struct snap {
    size_t n, files, meta;
    uint64_t total;
} snap;

static snap take(const ferry_catalog *c)
{
    snap s = {ferry_catalog_count(c), ferry_catalog_file_count(c), ferry_catalog_meta_count(c),
              ferry_catalog_total_bytes(c)};
    return s;
}

static int same(snap a, snap b)
{
    return a.n == b.n && a.files == b.files && a.meta == b.meta && a.total == b.total;
}

static const tspec gguf_ts[] = {
    {"tok_embd.weight", FERRY_DTYPE_F32, 2, {8, 4}},
    {"blk.0.attn_q.weight", FERRY_DTYPE_Q8_0, 2, {64, 2}},
    {"output_norm.weight", FERRY_DTYPE_F16, 1, {16}},
};

static void write_gguf(const char *path)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    ferry_writer_set_meta_str(w, "general.architecture", "llama");
    ferry_value v = {.type = FERRY_VALUE_U32, .v.u = 4096};
    ferry_writer_set_meta(w, "llama.context_length", &v);
    v.type = FERRY_VALUE_I32, v.v.i = -3;
    ferry_writer_set_meta(w, "test.negative", &v);
    v.type = FERRY_VALUE_F32, v.v.f = 0.5;
    ferry_writer_set_meta(w, "llama.rope.scale", &v);
    v.type = FERRY_VALUE_BOOL, v.v.u = 1;
    ferry_writer_set_meta(w, "test.flag", &v);
    v.type = FERRY_VALUE_U64, v.v.u = UINT64_MAX;
    ferry_writer_set_meta(w, "test.huge", &v);
    ferry_value items[3] = {{.type = FERRY_VALUE_STRING}, {.type = FERRY_VALUE_STRING},
                            {.type = FERRY_VALUE_STRING}};
    const char *toks[3] = {"<s>", "</s>", "hi"};
    for (int i = 0; i < 3; i++)
        items[i].v.str.ptr = toks[i], items[i].v.str.len = strlen(toks[i]);
    ferry_value arr = {.type = FERRY_VALUE_ARRAY};
    arr.v.arr.elem = FERRY_VALUE_STRING, arr.v.arr.n = 3, arr.v.arr.items = items;
    ferry_writer_set_meta(w, "tokenizer.ggml.tokens", &arr);
    CHECK_EQ_INT(write_model(w, path, gguf_ts, 3), 0);
}

static const tspec st_ts[] = {
    {"model.embed.weight", FERRY_DTYPE_F32, 2, {4, 8}},
    {"model.norm.weight", FERRY_DTYPE_BF16, 1, {3}},
    {"model.step", FERRY_DTYPE_I64, 0, {0}},
};

static void write_st(const char *path)
{
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_SAFETENSORS);
    ferry_writer_set_meta_str(w, "format", "pt");
    CHECK_EQ_INT(write_model(w, path, st_ts, 3), 0);
}

static void test_gguf_and_getters(void)
{
    ferry_catalog *c = ferry_catalog_create();
    const char *path = p_("model.gguf");
    write_gguf(path);
    CHECK_EQ_INT(ferry_catalog_add(c, path, NULL), 0);
    CHECK_EQ_INT(ferry_catalog_count(c), 3);
    CHECK_EQ_INT(ferry_catalog_file_count(c), 1);
    CHECK_STR(ferry_catalog_file_path(c, 0), path);
    CHECK_EQ_INT(ferry_catalog_file_format(c, 0), FERRY_FORMAT_GGUF);
    CHECK(ferry_catalog_file_path(c, 1) == NULL);
    CHECK_STR(ferry_format_name(FERRY_FORMAT_GGUF), "gguf");
    CHECK_STR(ferry_format_name(FERRY_FORMAT_SAFETENSORS), "safetensors");
    CHECK_STR(ferry_format_name(FERRY_FORMAT_UNKNOWN), "unknown");

    ferry_tensor_info ti;
    int64_t q = ferry_catalog_find(c, "blk.0.attn_q.weight");
    CHECK(q >= 0);
    CHECK_EQ_INT(ferry_catalog_tensor(c, (size_t)q, &ti), 0);
    CHECK_STR(ti.name, "blk.0.attn_q.weight");
    CHECK_STR(ti.file, path);
    CHECK_EQ_INT(ti.format, FERRY_FORMAT_GGUF);
    CHECK_EQ_INT(ti.dtype, FERRY_DTYPE_Q8_0);
    CHECK_EQ_INT(ti.ndim, 2);
    CHECK(ti.shape[0] == 64 && ti.shape[1] == 2);
    CHECK_EQ_INT(ti.n_elems, 128);
    CHECK_EQ_INT(ti.row_elems, 64); /* GGUF: shape[0] is the row */
    CHECK_EQ_INT(ti.n_rows, 2);
    CHECK_EQ_INT(ti.nbytes, 136);
    CHECK_EQ_INT(ti.offset % 32, 0);
    CHECK_EQ_INT(ferry_catalog_tensor(c, 3, &ti), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_catalog_find(c, "nope"), -1);
    CHECK_EQ_INT(ferry_catalog_total_bytes(c), 128 + 136 + 32);
    /* file order: by offset, which is declaration order for the writer */
    uint64_t prev = 0;
    int ordered = 1, data = 1;
    for (size_t i = 0; i < 3; i++) {
        ferry_catalog_tensor(c, i, &ti);
        ordered &= ti.offset >= prev;
        prev = ti.offset;
        CHECK_STR(ti.name, gguf_ts[i].name);
        data &= data_ok(c, i, gguf_ts[i].name);
    }
    CHECK(ordered);
    CHECK(data);

    /* metadata */
    CHECK_EQ_INT(ferry_catalog_meta_count(c), 7);
    CHECK_STR(ferry_catalog_meta_key(c, 0), "general.architecture");
    CHECK(ferry_catalog_meta_key(c, 7) == NULL && ferry_catalog_meta_value(c, 7) == NULL);
    const ferry_value *tv = ferry_catalog_meta_find(c, "tokenizer.ggml.tokens");
    CHECK(tv && tv->type == FERRY_VALUE_ARRAY && tv->v.arr.n == 3 &&
          strcmp(tv->v.arr.items[1].v.str.ptr, "</s>") == 0);
    uint64_t u = 77;
    int64_t i64 = 77;
    double f = 77;
    int b = 77;
    const char *s = NULL;
    CHECK_EQ_INT(ferry_catalog_get_u64(c, "llama.context_length", &u), 0);
    CHECK_EQ_INT(u, 4096);
    CHECK_EQ_INT(ferry_catalog_get_i64(c, "llama.context_length", &i64), 0);
    CHECK_EQ_INT(i64, 4096);
    CHECK_EQ_INT(ferry_catalog_get_i64(c, "test.negative", &i64), 0);
    CHECK_EQ_INT(i64, -3);
    u = 77;
    CHECK_EQ_INT(ferry_catalog_get_u64(c, "test.negative", &u), FERRY_ETYPE);
    CHECK_EQ_INT(u, 77);
    i64 = 77;
    CHECK_EQ_INT(ferry_catalog_get_i64(c, "test.huge", &i64), FERRY_ETYPE);
    CHECK_EQ_INT(i64, 77);
    CHECK_EQ_INT(ferry_catalog_get_u64(c, "test.huge", &u), 0);
    CHECK(u == UINT64_MAX);
    CHECK_EQ_INT(ferry_catalog_get_f64(c, "llama.rope.scale", &f), 0);
    CHECK(f == 0.5);
    f = 77;
    CHECK_EQ_INT(ferry_catalog_get_f64(c, "llama.context_length", &f), FERRY_ETYPE);
    CHECK(f == 77);
    CHECK_EQ_INT(ferry_catalog_get_bool(c, "test.flag", &b), 0);
    CHECK_EQ_INT(b, 1);
    CHECK_EQ_INT(ferry_catalog_get_bool(c, "llama.context_length", &b), FERRY_ETYPE);
    CHECK_EQ_INT(ferry_catalog_get_u64(c, "test.flag", &u), FERRY_ETYPE);
    CHECK_EQ_INT(ferry_catalog_get_str(c, "general.architecture", &s), 0);
    CHECK_STR(s, "llama");
    s = NULL;
    CHECK_EQ_INT(ferry_catalog_get_str(c, "llama.context_length", &s), FERRY_ETYPE);
    CHECK(s == NULL);
    CHECK_EQ_INT(ferry_catalog_get_str(c, "tokenizer.ggml.tokens", &s), FERRY_ETYPE);
    CHECK_EQ_INT(ferry_catalog_get_u64(c, "absent", &u), FERRY_ENOENT);
    CHECK_EQ_INT(ferry_catalog_get_str(c, "absent", &s), FERRY_ENOENT);
    ferry_catalog_destroy(c);
    ferry_catalog_destroy(NULL);
}

static void test_safetensors_prefix_collision(void)
{
    ferry_catalog *c = ferry_catalog_create();
    const char *g = p_("model.gguf"), *st = p_("model.safetensors");
    write_st(st);
    CHECK_EQ_INT(ferry_catalog_add(c, g, NULL), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, st, "te."), 0);
    CHECK_EQ_INT(ferry_catalog_count(c), 6);
    CHECK_EQ_INT(ferry_catalog_file_count(c), 2);
    CHECK_EQ_INT(ferry_catalog_file_format(c, 1), FERRY_FORMAT_SAFETENSORS);
    ferry_tensor_info ti;
    CHECK_EQ_INT(ferry_catalog_find(c, "model.embed.weight"), -1);
    int64_t k = ferry_catalog_find(c, "te.model.embed.weight");
    CHECK_EQ_INT(k, 3);
    CHECK_EQ_INT(ferry_catalog_tensor(c, (size_t)k, &ti), 0);
    CHECK_STR(ti.file, st);
    CHECK_EQ_INT(ti.format, FERRY_FORMAT_SAFETENSORS);
    CHECK(ti.ndim == 2 && ti.shape[0] == 4 && ti.shape[1] == 8);
    CHECK_EQ_INT(ti.row_elems, 8); /* safetensors: the last dimension is the row */
    CHECK_EQ_INT(ti.n_rows, 4);
    CHECK(data_ok(c, (size_t)k, "model.embed.weight"));
    k = ferry_catalog_find(c, "te.model.step");
    CHECK(k >= 0 && ferry_catalog_tensor(c, (size_t)k, &ti) == 0);
    CHECK(ti.ndim == 0 && ti.n_elems == 1 && ti.row_elems == 1 && ti.n_rows == 1 &&
          ti.nbytes == 8);
    CHECK(data_ok(c, (size_t)ferry_catalog_find(c, "te.model.norm.weight"), "model.norm.weight"));
    const char *s;
    CHECK(ferry_catalog_get_str(c, "format", &s) == 0 && strcmp(s, "pt") == 0);

    /* The same GGUF again without prefix: every name collides. */
    snap before = take(c);
    CHECK_EQ_INT(ferry_catalog_add(c, g, NULL), FERRY_EDUP);
    const char *msg = ferry_catalog_errmsg(c);
    CHECK(strstr(msg, "tok_embd.weight") != NULL);
    /* both files named: the same path twice, in "X: ... from X" */
    const char *first = strstr(msg, g);
    CHECK(first && strstr(first + strlen(g), g));
    CHECK(same(before, take(c)));
    /* A different file whose names collide with a prefixed one. */
    const char *g2 = p_("other.gguf");
    tspec clash[2] = {{"fresh", FERRY_DTYPE_F32, 1, {4}},
                      {"te.model.norm.weight", FERRY_DTYPE_F32, 1, {4}}};
    CHECK_EQ_INT(write_model(ferry_writer_create(FERRY_FORMAT_GGUF), g2, clash, 2), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, g2, NULL), FERRY_EDUP);
    msg = ferry_catalog_errmsg(c);
    CHECK(strstr(msg, g2) && strstr(msg, st) && strstr(msg, "te.model.norm.weight"));
    CHECK(same(before, take(c)));
    CHECK_EQ_INT(ferry_catalog_find(c, "fresh"), -1);
    /* ... and under a prefix it goes in. */
    CHECK_EQ_INT(ferry_catalog_add(c, g2, "o."), 0);
    CHECK_EQ_INT(ferry_catalog_find(c, "o.fresh"), 6);
    CHECK_EQ_INT(ferry_catalog_count(c), 8);
    ferry_catalog_destroy(c);
}

static void test_detection_and_failures(void)
{
    /* GGUF content under a safetensors name and the other way round */
    const char *fake_st = p_("really-gguf.safetensors"), *fake_g = p_("really-st.gguf");
    write_gguf(fake_st);
    write_st(fake_g);
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, fake_st, "a."), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, fake_g, "b."), 0);
    CHECK_EQ_INT(ferry_catalog_file_format(c, 0), FERRY_FORMAT_GGUF);
    CHECK_EQ_INT(ferry_catalog_file_format(c, 1), FERRY_FORMAT_SAFETENSORS);
    CHECK_EQ_INT(ferry_catalog_count(c), 6);
    CHECK_STR(ferry_catalog_errmsg(c), "");

    snap before = take(c);
    CHECK_EQ_INT(ferry_catalog_add(c, p_("missing.gguf"), NULL), FERRY_ENOENT);
    CHECK(strstr(ferry_catalog_errmsg(c), "missing.gguf") != NULL);
    CHECK(same(before, take(c)));
    const char *junk = p_("junk.bin");
    check_write_file(junk, "hello, this is not a model file at all", 38);
    CHECK_EQ_INT(ferry_catalog_add(c, junk, NULL), FERRY_EFORMAT);
    CHECK(strstr(ferry_catalog_errmsg(c), "not a GGUF or safetensors file") &&
          strstr(ferry_catalog_errmsg(c), "junk.bin"));
    CHECK(same(before, take(c)));
    const char *empty = p_("empty.gguf");
    check_write_file(empty, "", 0);
    CHECK_EQ_INT(ferry_catalog_add(c, empty, NULL), FERRY_EFORMAT);
    /* a truncated GGUF: the reader's error comes through, catalog unchanged */
    size_t n = 0;
    FILE *fp = fopen(p_("model.gguf"), "rb");
    unsigned char buf[4096];
    if (fp) {
        n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
    }
    const char *cut = p_("cut.gguf");
    check_write_file(cut, buf, n > 100 ? 100 : n);
    CHECK(ferry_catalog_add(c, cut, "z.") < 0);
    CHECK(strstr(ferry_catalog_errmsg(c), "cut.gguf") != NULL);
    CHECK(same(before, take(c)));
    CHECK_EQ_INT(ferry_catalog_find(c, "a.tok_embd.weight"), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, NULL, NULL), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_catalog_add(NULL, fake_st, NULL), FERRY_EINVAL);
    ferry_catalog_destroy(c);
}

/* A split GGUF: NAME-0000k-of-00003.gguf with split.no / split.count, opened from any part. */
static void write_split(const char *base, int parts_to_write)
{
    for (int k = 0; k < 3; k++) {
        if (!(parts_to_write & (1 << k)))
            continue;
        char name[256];
        snprintf(name, sizeof name, "%s-%05d-of-00003.gguf", base, k + 1);
        ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
        ferry_value v = {.type = FERRY_VALUE_U16, .v.u = (uint64_t)k};
        ferry_writer_set_meta(w, "split.no", &v);
        v.v.u = 3;
        ferry_writer_set_meta(w, "split.count", &v);
        if (k == 0)
            ferry_writer_set_meta_str(w, "general.name", "split model");
        char t1[64], t2[64];
        snprintf(t1, sizeof t1, "blk.%d.a", k);
        snprintf(t2, sizeof t2, "blk.%d.b", k);
        tspec ts[2] = {{t1, FERRY_DTYPE_F32, 1, {8}}, {t2, FERRY_DTYPE_Q8_0, 1, {32}}};
        CHECK_EQ_INT(write_model(w, p_(name), ts, 2), 0);
    }
}

static void test_split(void)
{
    write_split("split", 7);
    const char *order[6] = {"blk.0.a", "blk.0.b", "blk.1.a", "blk.1.b", "blk.2.a", "blk.2.b"};
    for (int start = 1; start <= 2; start++) {
        char name[64];
        snprintf(name, sizeof name, "split-%05d-of-00003.gguf", start);
        ferry_catalog *c = ferry_catalog_create();
        CHECK_EQ_INT(ferry_catalog_add(c, p_(name), "m."), 0);
        CHECK_EQ_INT(ferry_catalog_file_count(c), 3);
        CHECK_EQ_INT(ferry_catalog_count(c), 6);
        for (size_t i = 0; i < 3; i++) {
            char want[64];
            snprintf(want, sizeof want, "split-%05zu-of-00003.gguf", i + 1);
            const char *fp = ferry_catalog_file_path(c, i);
            CHECK(fp && strstr(fp, want));
        }
        int ok = 1;
        for (size_t i = 0; i < 6 && i < ferry_catalog_count(c); i++) {
            ferry_tensor_info ti;
            ferry_catalog_tensor(c, i, &ti);
            char want[64];
            snprintf(want, sizeof want, "m.%s", order[i]);
            ok &= strcmp(ti.name, want) == 0 && data_ok(c, i, order[i]) &&
                  ferry__catalog_tensor_file(c, i) == i / 2;
        }
        CHECK(ok);
        uint64_t no = 9;
        CHECK_EQ_INT(ferry_catalog_get_u64(c, "split.no", &no), 0);
        CHECK_EQ_INT(no, 0); /* the first part's value wins */
        CHECK_EQ_INT(ferry_catalog_meta_count(c), 3);
        const char *s;
        CHECK(ferry_catalog_get_str(c, "general.name", &s) == 0 && strcmp(s, "split model") == 0);
        ferry_catalog_destroy(c);
    }

    /* a missing part */
    write_split("broken", 1 | 4);
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, p_("model.gguf"), NULL), 0);
    snap before = take(c);
    CHECK_EQ_INT(ferry_catalog_add(c, p_("broken-00001-of-00003.gguf"), NULL), FERRY_ENOENT);
    CHECK(strstr(ferry_catalog_errmsg(c), "broken-00002-of-00003.gguf") != NULL);
    CHECK(same(before, take(c)));
    /* a part whose split.no disagrees with its name */
    const char *bad2 = p_("broken-00002-of-00003.gguf");
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    ferry_value v = {.type = FERRY_VALUE_U16, .v.u = 2};
    ferry_writer_set_meta(w, "split.no", &v);
    v.v.u = 3;
    ferry_writer_set_meta(w, "split.count", &v);
    tspec ts[1] = {{"x", FERRY_DTYPE_F32, 1, {4}}};
    CHECK_EQ_INT(write_model(w, bad2, ts, 1), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, p_("broken-00001-of-00003.gguf"), NULL), FERRY_EFORMAT);
    CHECK(same(before, take(c)));
    /* split keys without a split name */
    w = ferry_writer_create(FERRY_FORMAT_GGUF);
    v.v.u = 0;
    ferry_writer_set_meta(w, "split.no", &v);
    v.v.u = 2;
    ferry_writer_set_meta(w, "split.count", &v);
    CHECK_EQ_INT(write_model(w, p_("lonely.gguf"), ts, 1), 0);
    CHECK_EQ_INT(ferry_catalog_add(c, p_("lonely.gguf"), NULL), FERRY_EFORMAT);
    CHECK(same(before, take(c)));
    ferry_catalog_destroy(c);
}

static void write_index(const char *path, const char *json)
{
    CHECK_EQ_INT(check_write_file(path, json, strlen(json)), 0);
}

static void test_index(void)
{
    tspec s1[2] = {{"layers.0.w", FERRY_DTYPE_F16, 2, {2, 4}}, {"embed", FERRY_DTYPE_F32, 1, {6}}};
    tspec s2[1] = {{"layers.1.w", FERRY_DTYPE_F16, 2, {2, 4}}};
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_SAFETENSORS);
    ferry_writer_set_meta_str(w, "format", "pt");
    CHECK_EQ_INT(write_model(w, p_("sh-00001-of-00002.safetensors"), s1, 2), 0);
    CHECK_EQ_INT(write_model(ferry_writer_create(FERRY_FORMAT_SAFETENSORS),
                             p_("sh-00002-of-00002.safetensors"), s2, 1), 0);
    const char *ix = p_("sh.safetensors.index.json");
    write_index(ix, "{\n  \"metadata\": {\"total_size\": 72},\n  \"weight_map\": {\n"
                    "    \"layers.1.w\": \"sh-00002-of-00002.safetensors\",\n"
                    "    \"layers.0.w\": \"sh-00001-of-00002.safetensors\",\n"
                    "    \"embed\": \"sh-00001-of-00002.safetensors\"\n  }\n}\n");
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, ix, "unet."), 0);
    CHECK_EQ_INT(ferry_catalog_file_count(c), 2);
    CHECK_EQ_INT(ferry_catalog_count(c), 3);
    CHECK_EQ_INT(ferry_catalog_file_format(c, 0), FERRY_FORMAT_SAFETENSORS);
    for (size_t i = 0; i < ferry_catalog_count(c); i++) {
        ferry_tensor_info ti;
        ferry_catalog_tensor(c, i, &ti);
        CHECK(strncmp(ti.name, "unet.", 5) == 0 && data_ok(c, i, ti.name + 5));
    }
    int64_t k = ferry_catalog_find(c, "unet.layers.1.w");
    CHECK(k >= 0 && ferry__catalog_tensor_file(c, (size_t)k) == 1);
    const char *fp = ferry_catalog_file_path(c, (size_t)ferry__catalog_tensor_file(c, (size_t)k));
    CHECK(fp && strstr(fp, "sh-00002-of-00002.safetensors"));
    uint64_t total = 0;
    const ferry_value *tv = ferry_catalog_meta_find(c, "total_size");
    CHECK(tv != NULL);
    if (tv && tv->type != FERRY_VALUE_STRING)
        CHECK(ferry_catalog_get_u64(c, "total_size", &total) == 0 && total == 72);
    CHECK(ferry_catalog_meta_find(c, "format") != NULL);

    snap before = take(c);
    /* a shard that does not exist */
    const char *ix2 = p_("gone.safetensors.index.json");
    write_index(ix2, "{\"metadata\": {}, \"weight_map\": {\"a\": \"sh-00001-of-00002.safetensors\","
                     " \"b\": \"nothere.safetensors\"}}");
    CHECK_EQ_INT(ferry_catalog_add(c, ix2, "x."), FERRY_ENOENT);
    const char *msg = ferry_catalog_errmsg(c);
    CHECK(strstr(msg, "nothere.safetensors") && strstr(msg, "gone.safetensors.index.json"));
    CHECK(same(before, take(c)));
    /* a weight_map entry pointing at the wrong shard */
    const char *ix3 = p_("wrong.safetensors.index.json");
    write_index(ix3, "{\"weight_map\": {\"embed\": \"sh-00002-of-00002.safetensors\","
                     " \"layers.0.w\": \"sh-00001-of-00002.safetensors\"}}");
    CHECK_EQ_INT(ferry_catalog_add(c, ix3, "y."), FERRY_EFORMAT);
    CHECK(strstr(ferry_catalog_errmsg(c), "embed") != NULL);
    CHECK(same(before, take(c)));
    /* a weight_map entry in no shard */
    write_index(ix3, "{\"weight_map\": {\"ghost\": \"sh-00001-of-00002.safetensors\"}}");
    CHECK_EQ_INT(ferry_catalog_add(c, ix3, "y."), FERRY_EFORMAT);
    CHECK(strstr(ferry_catalog_errmsg(c), "ghost") != NULL);
    CHECK(same(before, take(c)));
    /* the same shards again under the same prefix collide */
    CHECK_EQ_INT(ferry_catalog_add(c, ix, "unet."), FERRY_EDUP);
    CHECK(same(before, take(c)));
    /* a shard path leaving the folder */
    write_index(ix3, "{\"weight_map\": {\"a\": \"../sh-00001-of-00002.safetensors\"}}");
    CHECK_EQ_INT(ferry_catalog_add(c, ix3, "y."), FERRY_EPATH);
    CHECK(same(before, take(c)));
    ferry_catalog_destroy(c);
}

/* Models of 10,000 tensors open in a few milliseconds (printed; checked against a loose bound so
 * that sanitizer builds pass). */
static void test_many(void)
{
    enum { N = 10000 };
    static tspec ts[N];
    static char names[N][48];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "blk.%d.attn_%c.weight", i / 8, 'a' + i % 8);
        ts[i].name = names[i];
        ts[i].dtype = FERRY_DTYPE_F16;
        ts[i].ndim = 2;
        ts[i].shape[0] = 4;
        ts[i].shape[1] = 2;
    }
    const char *paths[2] = {p_("many.gguf"), p_("many.safetensors")};
    for (int fmt = 0; fmt < 2; fmt++) {
        ferry_writer *w = ferry_writer_create(fmt ? FERRY_FORMAT_SAFETENSORS : FERRY_FORMAT_GGUF);
        CHECK_EQ_INT(write_model(w, paths[fmt], ts, N), 0);
        ferry_catalog *c = ferry_catalog_create();
        double t0 = ferry__now();
        int rc = ferry_catalog_add(c, paths[fmt], "p.");
        double dt = ferry__now() - t0;
        CHECK_EQ_INT(rc, 0);
        if (rc)
            fprintf(stderr, "%s\n", ferry_catalog_errmsg(c));
        CHECK_EQ_INT(ferry_catalog_count(c), N);
        CHECK_EQ_INT(ferry_catalog_find(c, "p.blk.1249.attn_h.weight"), N - 1);
        printf("open %d-tensor %s: %.2f ms\n", N, fmt ? "safetensors" : "gguf", dt * 1e3);
        CHECK(dt < 2.0);
        ferry_catalog_destroy(c);
    }
}

int main(void)
{
    dir = check_tmpdir("catalog");
    test_gguf_and_getters();
    test_safetensors_prefix_collision();
    test_detection_and_failures();
    test_split();
    test_index();
    test_many();
    check_rmdir(dir);
    return check_finish();
}
