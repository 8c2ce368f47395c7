/*
 * test_empty_tensors.c — tensors with no elements (a 2-D GGUF [64, 0], a safetensors [0, 64], a
 * 1-D [0]) and the rules both readers share about them: such files open, every policy prepares
 * them (data of 0 bytes, the others' bytes equal to the file), the CLI runs, plans, inspects and
 * merges them; a zero-byte tensor between two overlapping ones does not hide the overlap; and the
 * empty tensor name is refused by both readers. Files are written byte by byte from the specs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cli_harness.h"
#include "ferry.h"

typedef struct bytes {
    unsigned char p[8192];
    size_t n;
} bytes;

static void put(bytes *b, const void *d, size_t n)
{
    if (b->n + n > sizeof b->p) {
        fprintf(stderr, "test_empty_tensors: buffer full\n");
        exit(2);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_le(bytes *b, uint64_t v, int size)
{
    unsigned char x[8];
    for (int i = 0; i < size; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, (size_t)size);
}

static void put_gstr(bytes *b, const char *s)
{
    put_le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

typedef struct gtensor {
    const char *name;
    uint32_t ndim;
    uint64_t ne[2];
    uint64_t offset; /* from the data section, a multiple of 32 */
} gtensor;

/* A GGUF v3 file of f32 tensors, no metadata, alignment 32, DATA bytes of data (value i % 251). */
static void write_gguf(const char *path, const gtensor *ts, size_t n, size_t data)
{
    bytes b = {.n = 0};
    put(&b, "GGUF", 4);
    put_le(&b, 3, 4);
    put_le(&b, n, 8);
    put_le(&b, 0, 8);
    for (size_t i = 0; i < n; i++) {
        put_gstr(&b, ts[i].name);
        put_le(&b, ts[i].ndim, 4);
        for (uint32_t d = 0; d < ts[i].ndim; d++)
            put_le(&b, ts[i].ne[d], 8);
        put_le(&b, 0, 4); /* GGML_TYPE_F32 */
        put_le(&b, ts[i].offset, 8);
    }
    while (b.n % 32)
        put_le(&b, 0, 1);
    for (size_t i = 0; i < data; i++)
        put_le(&b, i % 251, 1);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(b.p, 1, b.n, fp) != b.n || fclose(fp)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* A safetensors file: the 8-byte length, JSON (space-padded to 8), DATA bytes (value i % 251). */
static void write_st(const char *path, const char *json, size_t data)
{
    bytes b = {.n = 0};
    size_t len = strlen(json), pad = (8 - len % 8) % 8;
    put_le(&b, len + pad, 8);
    put(&b, json, len);
    for (size_t i = 0; i < pad; i++)
        put(&b, " ", 1);
    for (size_t i = 0; i < data; i++)
        put_le(&b, i % 251, 1);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(b.p, 1, b.n, fp) != b.n || fclose(fp)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static char g_gguf[1200], g_st[1200];

/* Opens PATH in a catalog: its code (0 or the refusal), the message checked to name the file. */
static int catalog_open(const char *path, const char *must_say)
{
    ferry_catalog *c = ferry_catalog_create();
    int rc = ferry_catalog_add(c, path, NULL);
    if (rc) {
        const char *msg = ferry_catalog_errmsg(c);
        CHECK(strstr(msg, path) != NULL);
        if (must_say && !strstr(msg, must_say))
            fprintf(stderr, "%s: message '%s' does not say '%s'\n", path, msg, must_say);
        CHECK(!must_say || strstr(msg, must_say) != NULL);
    }
    ferry_catalog_destroy(c);
    return rc;
}

/* Every home and load mode prepares the whole file: the empty tensors have 0 bytes, the others
 * the file's bytes. */
static void test_prepare(const char *path)
{
    static const ferry_home homes[] = {FERRY_HOME_HOST, FERRY_HOME_DISK, FERRY_HOME_DEVICE};
    static const ferry_load loads[] = {FERRY_LOAD_AUTO, FERRY_LOAD_MMAP, FERRY_LOAD_READ,
                                       FERRY_LOAD_DIRECT};
    FILE *fp = fopen(path, "rb");
    unsigned char file[8192];
    size_t fsize = fp ? fread(file, 1, sizeof file, fp) : 0;
    if (fp)
        fclose(fp);
    CHECK(fsize > 0);
    for (size_t h = 0; h < sizeof homes / sizeof homes[0]; h++)
        for (size_t l = 0; l < sizeof loads / sizeof loads[0]; l++) {
            ferry *f = ferry_create(NULL);
            int dev = 0;
            if (homes[h] == FERRY_HOME_DEVICE)
                CHECK_EQ_INT(ferry_add_device(f, "sim:64MiB", &dev), 0);
            ferry_policy p = {.home = homes[h], .load = loads[l], .compute_device = dev};
            int rc = ferry_open(f, path, NULL);
            CHECK_EQ_INT(rc, 0);
            CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
            if (rc) {
                fprintf(stderr, "%s: %s\n", path, ferry_errmsg(f));
                ferry_destroy(f);
                continue;
            }
            CHECK_EQ_INT(ferry_validate(f), 0);
            const char *names[] = {"a.weight", "empty.weight", "empty1d"};
            ferry_tensor *ts[3];
            for (int i = 0; i < 3; i++) {
                ts[i] = ferry_find(f, names[i]);
                CHECK(ts[i] != NULL);
            }
            if (!ts[0] || !ts[1] || !ts[2]) {
                ferry_destroy(f);
                continue;
            }
            rc = ferry_load_group(f, "all");
            if (rc)
                fprintf(stderr, "%s: home %d load %d: %s\n", path, (int)homes[h], (int)loads[l],
                        ferry_errmsg(f));
            CHECK_EQ_INT(rc, 0);
            rc = ferry_prepare(f, ts, 3);
            if (rc)
                fprintf(stderr, "%s: home %d load %d: %s\n", path, (int)homes[h], (int)loads[l],
                        ferry_errmsg(f));
            CHECK_EQ_INT(rc, 0);
            if (rc == 0) {
                for (int i = 1; i < 3; i++) {
                    ferry_tensor_info in;
                    CHECK_EQ_INT(ferry_tensor_get_info(ts[i], &in), 0);
                    CHECK_EQ_INT(in.nbytes, 0);
                    CHECK_EQ_INT(in.n_elems, 0);
                    CHECK_EQ_INT(ferry_tensor_nbytes(ts[i]), 0);
                }
                ferry_tensor_info ia;
                CHECK_EQ_INT(ferry_tensor_get_info(ts[0], &ia), 0);
                CHECK_EQ_INT(ia.nbytes, 1024);
                unsigned char got[1024];
                CHECK_EQ_INT(ferry_tensor_read(f, ts[0], 0, sizeof got, got), 0);
                CHECK(ia.offset + sizeof got <= fsize &&
                      memcmp(got, file + ia.offset, sizeof got) == 0);
                CHECK_EQ_INT(ferry_tensor_read(f, ts[1], 0, 0, got), 0);
                CHECK_EQ_INT(ferry_release(f, ts, 3), 0);
            }
            ferry_placement *pl = NULL;
            size_t np = 0;
            CHECK_EQ_INT(ferry_plan(f, &pl, &np, NULL), 0);
            CHECK_EQ_INT(np, 3);
            free(pl);
            ferry_destroy(f);
        }
}

/* The CLI: run (computing and verifying), on the cpu and through a device, plan, inspect. */
static void test_cli(const char *path, const char *shape)
{
    int rc = run("run --verify --passes 2 -q '%s'", path);
    if (rc)
        fprintf(stderr, "run %s: %s\n", path, err_text);
    CHECK_EQ_INT(rc, 0);
    rc = run("run --verify --passes 2 -q --device sim:64MiB '%s'", path);
    if (rc)
        fprintf(stderr, "run --device %s: %s\n", path, err_text);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(run("plan '%s'", path), 0);
    CHECK_EQ_INT(run("inspect --json '%s'", path), 0);
    CHECK(strstr(out_text, "\"empty.weight\"") != NULL);
    CHECK(strstr(out_text, shape) != NULL);
}

/* lora merge of a base holding an empty tensor: the output keeps it, empty, in its place. */
static void test_merge(void)
{
    char base[1200], ad[1200], out[1200];
    snprintf(base, sizeof base, "%s/base.gguf", tmp);
    snprintf(ad, sizeof ad, "%s/ad.safetensors", tmp);
    snprintf(out, sizeof out, "%s/merged.gguf", tmp);
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int64_t q[2] = {64, 64}, e[2] = {64, 0};
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "blk.0.attn_q.weight", FERRY_DTYPE_F32, 2, q), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "blk.0.attn_k.weight", FERRY_DTYPE_F32, 2, e), 0);
    CHECK_EQ_INT(ferry_writer_begin(w, base), 0);
    float row[64];
    for (int r = 0; r < 64; r++) {
        for (int c = 0; c < 64; c++)
            row[c] = (float)((r * 64 + c) % 17) / 17.0f - 0.5f;
        CHECK_EQ_INT(ferry_writer_write(w, row, sizeof row), 0);
    }
    int rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "writer: %s\n", ferry_writer_errmsg(w));
    CHECK_EQ_INT(rc, 0);
    ferry_writer_destroy(w);
    rc = run("gen --lora '%s' -o '%s' --rank 4 -q", base, ad);
    if (rc)
        fprintf(stderr, "gen --lora: %s\n", err_text);
    CHECK_EQ_INT(rc, 0);
    rc = run("lora merge '%s' -a '%s' -o '%s' -q", base, ad, out);
    if (rc)
        fprintf(stderr, "lora merge: %s\n", err_text);
    CHECK_EQ_INT(rc, 0);
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, out, NULL), 0);
    int64_t k = ferry_catalog_find(c, "blk.0.attn_k.weight");
    CHECK(k >= 0);
    ferry_tensor_info ti;
    if (k >= 0 && ferry_catalog_tensor(c, (size_t)k, &ti) == 0)
        CHECK(ti.nbytes == 0 && ti.ndim == 2 && ti.shape[0] == 64 && ti.shape[1] == 0);
    ferry_catalog_destroy(c);
    CHECK_EQ_INT(run("run --verify -q -a '%s' '%s'", ad, base), 0);
}

/* A zero-byte tensor whose offset sorts between two overlapping tensors hides nothing. */
static void test_overlap_behind_empty(void)
{
    char p[1200];
    gtensor g[] = {{"a", 1, {64, 0}, 0}, {"e", 1, {0, 0}, 128}, {"c", 1, {16, 0}, 160}};
    snprintf(p, sizeof p, "%s/overlap.gguf", tmp);
    write_gguf(p, g, 3, 256);
    CHECK_EQ_INT(catalog_open(p, "'a'"), FERRY_EOVERLAP);
    snprintf(p, sizeof p, "%s/overlap.safetensors", tmp);
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[128,128]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[160,224]}}",
             256);
    CHECK_EQ_INT(catalog_open(p, "'c'"), FERRY_EOVERLAP);
    /* several empty tensors in a row, and one at the very end of the overlapping one */
    snprintf(p, sizeof p, "%s/overlap2.safetensors", tmp);
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]},"
             "\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
             "\"e2\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]},"
             "\"e3\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[256,256]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[248,256]}}",
             256);
    CHECK_EQ_INT(catalog_open(p, "overlap"), FERRY_EOVERLAP);
    /* touching is not overlapping, with or without an empty tensor between */
    snprintf(p, sizeof p, "%s/touch.safetensors", tmp);
    write_st(p,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[0,128]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[64,64]},"
             "\"c\":{\"dtype\":\"F32\",\"shape\":[32],\"data_offsets\":[128,256]}}",
             256);
    CHECK_EQ_INT(catalog_open(p, NULL), 0);
}

/* The empty name: refused by both readers, with the same code. */
static void test_empty_name(void)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/noname.safetensors", tmp);
    write_st(p, "{\"\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
    CHECK_EQ_INT(catalog_open(p, "empty"), FERRY_EFORMAT);
    gtensor g[] = {{"", 1, {4, 0}, 0}};
    snprintf(p, sizeof p, "%s/noname.gguf", tmp);
    write_gguf(p, g, 1, 32);
    CHECK_EQ_INT(catalog_open(p, "empty"), FERRY_EFORMAT);
}

int main(void)
{
    tmp = check_tmpdir("empty_tensors");
    snprintf(g_gguf, sizeof g_gguf, "%s/empty.gguf", tmp);
    snprintf(g_st, sizeof g_st, "%s/empty.safetensors", tmp);
    /* GGUF: ne[0] is the row length, so [64, 0] is 0 rows of 64 */
    gtensor g[] = {{"a.weight", 2, {64, 4}, 0}, {"empty.weight", 2, {64, 0}, 1024},
                   {"empty1d", 1, {0, 0}, 1024}};
    write_gguf(g_gguf, g, 3, 1024);
    write_st(g_st,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[4,64],\"data_offsets\":[0,1024]},"
             "\"empty.weight\":{\"dtype\":\"F32\",\"shape\":[0,64],\"data_offsets\":[1024,1024]},"
             "\"empty1d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[1024,1024]}}",
             1024);
    CHECK_EQ_INT(catalog_open(g_gguf, NULL), 0);
    CHECK_EQ_INT(catalog_open(g_st, NULL), 0);
    test_prepare(g_gguf);
    test_prepare(g_st);
    test_cli(g_gguf, "[64, 0]");
    test_cli(g_st, "[0, 64]");
    test_merge();
    test_overlap_behind_empty();
    test_empty_name();
    int rc = check_finish();
    if (!rc)
        check_rmdir(tmp);
    return rc;
}
