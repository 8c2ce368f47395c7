/*
 * test_writer.c — the model-file writer: atomicity (nothing under the final name before finish,
 * the temporary file removed by destroy), refusal of short and excess writes, padding and
 * alignment of GGUF data, buffered and pass-through writes, declaration errors.
 */
#include <dirent.h>
#include <stdint.h>

#include "check.h"
#include "formats/formats.h"

static const char *dir;

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries in DIR whose name starts with PREFIX. */
static int count_prefix(const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

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

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + seed * 7 + 1);
}

static void test_atomic(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/atomic.gguf", dir);
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int64_t shape[2] = {8, 4};
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "a", FERRY_DTYPE_F32, 2, shape), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "b", FERRY_DTYPE_F32, 2, shape), 0);
    CHECK_EQ_INT(ferry_writer_begin(w, path), 0);
    CHECK(!exists(path));
    CHECK_EQ_INT(count_prefix("atomic.gguf.tmp."), 1);
    unsigned char buf[128];
    fill(buf, sizeof buf, 1);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 128), 0);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 100), 0);
    CHECK(!exists(path));
    /* short: 28 bytes missing */
    CHECK_EQ_INT(ferry_writer_finish(w), FERRY_EINVAL);
    CHECK(strstr(ferry_writer_errmsg(w), "'b'") && strstr(ferry_writer_errmsg(w), "100"));
    CHECK(!exists(path));
    /* excess: 29 > 28 left */
    CHECK_EQ_INT(ferry_writer_write(w, buf, 29), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 28), 0);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 1), FERRY_EINVAL);
    CHECK(!exists(path));
    CHECK_EQ_INT(ferry_writer_finish(w), 0);
    CHECK(exists(path));
    CHECK_EQ_INT(count_prefix("atomic.gguf.tmp."), 0);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 1), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_writer_finish(w), FERRY_EINVAL);
    ferry_writer_destroy(w);
    CHECK(exists(path)); /* destroy after finish keeps the file */

    /* destroy of an unfinished writer removes its temporary file and creates nothing */
    snprintf(path, sizeof path, "%s/abandoned.safetensors", dir);
    w = ferry_writer_create(FERRY_FORMAT_SAFETENSORS);
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "x", FERRY_DTYPE_F32, 2, shape), 0);
    CHECK_EQ_INT(ferry_writer_begin(w, path), 0);
    CHECK_EQ_INT(count_prefix("abandoned.safetensors.tmp."), 1);
    CHECK_EQ_INT(ferry_writer_write(w, buf, 64), 0);
    ferry_writer_destroy(w);
    CHECK_EQ_INT(count_prefix("abandoned.safetensors"), 0);

    /* a missing folder: refused at begin, nothing created */
    snprintf(path, sizeof path, "%s/no/such/dir/x.gguf", dir);
    w = ferry_writer_create(FERRY_FORMAT_GGUF);
    CHECK(ferry_writer_begin(w, path) < 0);
    CHECK(strstr(ferry_writer_errmsg(w), "x.gguf") != NULL);
    ferry_writer_destroy(w);

    /* replacing an existing file is atomic too: the old content stays until finish */
    snprintf(path, sizeof path, "%s/atomic.gguf", dir);
    size_t n0, n1;
    unsigned char *old = slurp(path, &n0);
    w = ferry_writer_create(FERRY_FORMAT_GGUF);
    CHECK_EQ_INT(ferry_writer_begin(w, path), 0);
    unsigned char *mid = slurp(path, &n1);
    CHECK(old && mid && n0 == n1 && memcmp(old, mid, n0) == 0);
    CHECK_EQ_INT(ferry_writer_finish(w), 0);
    free(mid);
    mid = slurp(path, &n1);
    CHECK(mid && n1 < n0); /* now an empty model */
    free(old);
    free(mid);
    ferry_writer_destroy(w);
}

/* GGUF data: each tensor at a multiple of the alignment, gaps zero, the end padded. */
static void test_alignment(void)
{
    for (int rep = 0; rep < 2; rep++) {
        uint32_t align = rep ? 256 : 32;
        char path[4096];
        snprintf(path, sizeof path, "%s/align%u.gguf", dir, align);
        ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
        if (rep) {
            ferry_value v = {.type = FERRY_VALUE_U32, .v.u = align};
            CHECK_EQ_INT(ferry_writer_set_meta(w, "general.alignment", &v), 0);
        }
        CHECK_EQ_INT(ferry_writer_set_meta_str(w, "general.name", "pad"), 0);
        int64_t s1[1] = {3}, s2[2] = {32, 3}, s3[1] = {5};
        CHECK_EQ_INT(ferry_writer_add_tensor(w, "t1", FERRY_DTYPE_F16, 1, s1), 0);  /* 6 B */
        CHECK_EQ_INT(ferry_writer_add_tensor(w, "t2", FERRY_DTYPE_Q8_0, 2, s2), 0); /* 102 B */
        CHECK_EQ_INT(ferry_writer_add_tensor(w, "empty", FERRY_DTYPE_F32, 1,
                                             (int64_t[1]){0}), 0);
        CHECK_EQ_INT(ferry_writer_add_tensor(w, "t3", FERRY_DTYPE_I8, 1, s3), 0);   /* 5 B */
        CHECK_EQ_INT(ferry_writer_begin(w, path), 0);
        unsigned char d1[6], d2[102], d3[5];
        fill(d1, 6, 1), fill(d2, 102, 2), fill(d3, 5, 3);
        CHECK_EQ_INT(ferry_writer_write(w, d1, 6), 0);
        for (int i = 0; i < 102; i += 17) /* many small writes */
            CHECK_EQ_INT(ferry_writer_write(w, d2 + i, 17), 0);
        CHECK_EQ_INT(ferry_writer_write(w, d3, 5), 0);
        CHECK_EQ_INT(ferry_writer_finish(w), 0);
        ferry_writer_destroy(w);

        size_t n;
        unsigned char *f = slurp(path, &n);
        CHECK(f != NULL);
        if (!f)
            continue;
        CHECK_EQ_INT(n % align, 0);
        ferry__parsed p;
        ferry__err e;
        CHECK_EQ_INT(ferry__gguf_parse(f, n, path, &p, &e), 0);
        CHECK_EQ_INT(p.alignment, align);
        CHECK_EQ_INT(p.n_tensors, 4);
        const unsigned char *src[] = {d1, d2, NULL, d3};
        const char *names[] = {"t1", "t2", "empty", "t3"};
        uint64_t end_prev = p.data_offset;
        for (size_t i = 0; i < p.n_tensors && i < 4; i++) {
            const ferry__tdesc *t = &p.tensors[i];
            if (!t->nbytes)
                continue; /* offset order puts empty tensors anywhere */
            size_t k = 0;
            while (k < 4 && strcmp(names[k], t->name))
                k++;
            CHECK(k < 4 && src[k]);
            CHECK_EQ_INT(t->offset % align, 0);
            for (uint64_t z = end_prev; z < t->offset; z++)
                if (f[z]) {
                    CHECK(!"padding not zero");
                    break;
                }
            if (k < 4 && src[k])
                CHECK(memcmp(f + t->offset, src[k], (size_t)t->nbytes) == 0);
            end_prev = t->offset + t->nbytes;
        }
        for (uint64_t z = end_prev; z < n; z++)
            if (f[z]) {
                CHECK(!"tail padding not zero");
                break;
            }
        ferry__parsed_free(&p);
        free(f);
    }
}

/* Writes larger than the buffer go straight through, mixed with small ones. */
static void test_large(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/large.gguf", dir);
    const size_t big = (size_t)3 << 20;
    unsigned char *d = malloc(big + 64);
    fill(d, big + 64, 9);
    ferry_writer *w = ferry_writer_create(FERRY_FORMAT_GGUF);
    int64_t s_small[1] = {16}, s_big[1] = {(int64_t)(big + 64)};
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "small", FERRY_DTYPE_I8, 1, s_small), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(w, "big", FERRY_DTYPE_I8, 1, s_big), 0);
    CHECK_EQ_INT(ferry_writer_begin(w, path), 0);
    CHECK_EQ_INT(ferry_writer_write(w, d, 16), 0);
    CHECK_EQ_INT(ferry_writer_write(w, d, 10), 0);       /* buffered */
    CHECK_EQ_INT(ferry_writer_write(w, d + 10, big), 0); /* straight through */
    CHECK_EQ_INT(ferry_writer_write(w, d + 10 + big, 54), 0);
    CHECK_EQ_INT(ferry_writer_finish(w), 0);
    ferry_writer_destroy(w);
    size_t n;
    unsigned char *f = slurp(path, &n);
    ferry__parsed p;
    ferry__err e;
    CHECK(f && ferry__gguf_parse(f, n, path, &p, &e) == 0);
    if (f && p.n_tensors == 2) {
        CHECK(memcmp(f + p.tensors[0].offset, d, 16) == 0);
        CHECK(memcmp(f + p.tensors[1].offset, d, big + 64) == 0);
        ferry__parsed_free(&p);
    }
    free(f);
    free(d);
}

static void test_declare_errors(void)
{
    ferry_writer *g = ferry_writer_create(FERRY_FORMAT_GGUF);
    ferry_writer *s = ferry_writer_create(FERRY_FORMAT_SAFETENSORS);
    CHECK(ferry_writer_create(FERRY_FORMAT_UNKNOWN) == NULL);
    int64_t sh[2] = {32, 2};
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "b", FERRY_DTYPE_BOOL, 2, sh), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "u", FERRY_DTYPE_U16, 2, sh), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_writer_add_tensor(s, "q", FERRY_DTYPE_Q4_0, 2, sh), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_writer_add_tensor(s, "k", FERRY_DTYPE_Q6_K, 2, sh), FERRY_EDTYPE);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "bad", (ferry_dtype)4, 2, sh), FERRY_EDTYPE);
    int64_t odd[2] = {33, 2}, neg[2] = {4, -1};
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "q", FERRY_DTYPE_Q8_0, 2, odd), FERRY_ESHAPE);
    CHECK(strstr(ferry_writer_errmsg(g), "'q'") != NULL);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "n", FERRY_DTYPE_F32, 2, neg), FERRY_ESHAPE);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "d", FERRY_DTYPE_F32, 9, sh), FERRY_ELIMIT);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "", FERRY_DTYPE_F32, 2, sh), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "ok", FERRY_DTYPE_Q8_0, 2, sh), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "ok", FERRY_DTYPE_F32, 2, sh), FERRY_EDUP);
    CHECK_EQ_INT(ferry_writer_add_tensor(s, "bf", FERRY_DTYPE_BF16, 2, sh), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(s, "u16", FERRY_DTYPE_U16, 2, sh), 0);

    ferry_value u = {.type = FERRY_VALUE_U32, .v.u = 7};
    CHECK_EQ_INT(ferry_writer_set_meta(s, "n", &u), FERRY_ETYPE);
    CHECK_EQ_INT(ferry_writer_set_meta_str(s, "n", "7"), 0);
    CHECK_EQ_INT(ferry_writer_set_meta_str(s, "n", "8"), FERRY_EDUP);
    CHECK_EQ_INT(ferry_writer_set_meta(g, "n", &u), 0);
    CHECK_EQ_INT(ferry_writer_set_meta(g, "n", &u), FERRY_EDUP);
    ferry_value a3 = {.type = FERRY_VALUE_U32, .v.u = 3};
    CHECK_EQ_INT(ferry_writer_set_meta(g, "general.alignment", &a3), FERRY_EALIGN);
    ferry_value a64 = {.type = FERRY_VALUE_U64, .v.u = 64};
    CHECK_EQ_INT(ferry_writer_set_meta(g, "general.alignment", &a64), FERRY_ETYPE);
    ferry_value items[2] = {{.type = FERRY_VALUE_I32, .v.i = 1}, {.type = FERRY_VALUE_F32}};
    ferry_value arr = {.type = FERRY_VALUE_ARRAY};
    arr.v.arr.elem = FERRY_VALUE_I32;
    arr.v.arr.n = 2;
    arr.v.arr.items = items;
    CHECK_EQ_INT(ferry_writer_set_meta(g, "mixed", &arr), FERRY_EINVAL);
    items[1].type = FERRY_VALUE_I32;
    CHECK_EQ_INT(ferry_writer_set_meta(g, "ints", &arr), 0);
    items[0].v.i = 99; /* the writer copied the value */

    char path[4096];
    snprintf(path, sizeof path, "%s/declared.gguf", dir);
    CHECK_EQ_INT(ferry_writer_write(g, "x", 1), FERRY_EINVAL); /* before begin */
    CHECK_EQ_INT(ferry_writer_begin(g, path), 0);
    CHECK_EQ_INT(ferry_writer_add_tensor(g, "late", FERRY_DTYPE_F32, 2, sh), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_writer_set_meta(g, "late", &u), FERRY_EINVAL);
    CHECK_EQ_INT(ferry_writer_begin(g, path), FERRY_EINVAL);
    unsigned char q[68] = {0};
    CHECK_EQ_INT(ferry_writer_write(g, q, 68), 0);
    CHECK_EQ_INT(ferry_writer_finish(g), 0);
    size_t n;
    unsigned char *f = slurp(path, &n);
    ferry__parsed p;
    ferry__err e;
    CHECK(f && ferry__gguf_parse(f, n, path, &p, &e) == 0);
    if (f && p.n_meta == 2) {
        CHECK_STR(p.meta[1].key, "ints");
        CHECK(p.meta[1].val.v.arr.n == 2 && p.meta[1].val.v.arr.items[0].v.i == 1);
        ferry__parsed_free(&p);
    }
    free(f);
    ferry_writer_destroy(g);
    ferry_writer_destroy(s);
    ferry_writer_destroy(NULL);
}

int main(void)
{
    dir = check_tmpdir("writer");
    test_atomic();
    test_alignment();
    test_large();
    test_declare_errors();
    check_rmdir(dir);
    return check_finish();
}
