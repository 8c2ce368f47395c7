/*
 * model_fixture.h — small llama-shaped model files for the manager's tests, written through the
 * public writer, with contents that are valid numbers in every dtype (quantized from f32), and an
 * independent check of prepared bytes against the file (plain pread).
 */
#ifndef FERRY_MODEL_FIXTURE_H
#define FERRY_MODEL_FIXTURE_H

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry.h"

typedef struct fixture_tensor {
    char name[64];
    ferry_dtype dtype;
    uint32_t ndim;
    int64_t shape[4]; /* in the file's order */
} fixture_tensor;

/* Values: smooth, deterministic, never all zero. */
static inline float fixture_value(uint32_t tensor, uint64_t i)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(tensor + 1) * 0xD1B54A32D192ED03ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return ((float)(x & 0xFFFFFF) / 16777216.0f - 0.5f) * 0.25f;
}

/* A llama-like layout: token_embd, LAYERS blocks of (attn_norm, attn_q, attn_k, ffn_up, ffn_down),
 * output_norm, output. DIM must be a multiple of 32 for the quantized types. */
static inline size_t fixture_layout(fixture_tensor *ts, int layers, int dim, int ff, int vocab,
                                    ferry_dtype wt, int safetensors)
{
    size_t n = 0;
#define FIX_ADD(nm, dt, nd, a, b)                                                                 \
    do {                                                                                          \
        snprintf(ts[n].name, sizeof ts[n].name, "%s", nm);                                        \
        ts[n].dtype = (dt);                                                                       \
        ts[n].ndim = (nd);                                                                        \
        if (safetensors && (nd) == 2) {                                                           \
            ts[n].shape[0] = (b);                                                                 \
            ts[n].shape[1] = (a);                                                                 \
        } else {                                                                                  \
            ts[n].shape[0] = (a);                                                                 \
            ts[n].shape[1] = (b);                                                                 \
        }                                                                                         \
        n++;                                                                                      \
    } while (0)
    char nm[64];
    FIX_ADD("token_embd.weight", wt, 2, dim, vocab);
    for (int l = 0; l < layers; l++) {
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        FIX_ADD(nm, FERRY_DTYPE_F32, 1, dim, 1);
        snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", l);
        FIX_ADD(nm, wt, 2, dim, dim);
        snprintf(nm, sizeof nm, "blk.%d.attn_k.weight", l);
        FIX_ADD(nm, wt, 2, dim, dim);
        snprintf(nm, sizeof nm, "blk.%d.ffn_up.weight", l);
        FIX_ADD(nm, wt, 2, dim, ff);
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", l);
        FIX_ADD(nm, wt, 2, ff, dim);
    }
    FIX_ADD("output_norm.weight", FERRY_DTYPE_F32, 1, dim, 1);
    FIX_ADD("output.weight", wt, 2, dim, vocab);
#undef FIX_ADD
    return n;
}

static inline uint64_t fixture_elems(const fixture_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

/* Writes the model; returns 0 on success. Tensors of f32-convertible dtypes hold fixture_value;
 * the others (k-quants) bytes of a fixed pattern, for tests that compare bytes, never values. */
static inline int fixture_write(const char *path, ferry_format fmt, const fixture_tensor *ts,
                                size_t n)
{
    ferry_writer *w = ferry_writer_create(fmt);
    if (!w)
        return -1;
    int rc = ferry_writer_set_meta_str(w, "general.architecture", "llama");
    for (size_t i = 0; i < n && !rc; i++)
        rc = ferry_writer_add_tensor(w, ts[i].name, ts[i].dtype, ts[i].ndim, ts[i].shape);
    if (!rc)
        rc = ferry_writer_begin(w, path);
    for (size_t i = 0; i < n && !rc; i++) {
        uint64_t ne = fixture_elems(&ts[i]), nb = 0;
        ferry_dtype_nbytes(ts[i].dtype, ne, &nb);
        float *v = malloc((ne ? ne : 1) * sizeof *v);
        unsigned char *out = malloc(nb ? nb : 1);
        if (!v || !out) {
            free(v), free(out);
            rc = -1;
            break;
        }
        for (uint64_t k = 0; k < ne; k++)
            v[k] = fixture_value((uint32_t)i, k);
        if (ferry_dtype_can_convert(FERRY_DTYPE_F32, ts[i].dtype))
            rc = ferry_dtype_convert(FERRY_DTYPE_F32, v, ts[i].dtype, out, ne);
        else
            for (uint64_t k = 0; k < nb; k++)
                out[k] = (unsigned char)(k * 131 + i * 7 + (k >> 9));
        if (!rc)
            rc = ferry_writer_write(w, out, nb);
        free(v), free(out);
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "fixture_write %s: %s\n", path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

/* Writes the fixture_layout model of LAYERS blocks (DIM, FF, VOCAB; weights of type WT) to PATH
 * in GGUF; returns 0, or -1 with a line on stderr. */
static inline int fixture_write_llama(const char *path, int layers, int dim, int ff, int vocab,
                                      ferry_dtype wt)
{
    fixture_tensor *ts = calloc((size_t)layers * 5 + 3, sizeof *ts);
    int rc = -1;
    if (ts)
        rc = fixture_write(path, FERRY_FORMAT_GGUF, ts,
                           fixture_layout(ts, layers, dim, ff, vocab, wt, 0));
    free(ts);
    if (rc)
        fprintf(stderr, "cannot write %s\n", path);
    return rc;
}

/* Reads N bytes at OFF of PATH with plain pread: the independent reference. */
static inline void *fixture_pread(const char *path, uint64_t off, uint64_t n)
{
    int fd = open(path, O_RDONLY);
    unsigned char *buf = malloc(n ? n : 1);
    uint64_t got = 0;
    while (fd >= 0 && buf && got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (r <= 0)
            break;
        got += (uint64_t)r;
    }
    if (fd >= 0)
        close(fd);
    if (got != n) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Writes PATH's dirty pages back and drops its pages from the page cache; 0 on success. */
static inline int fixture_drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 ? 0 : -1;
    close(fd);
    return rc;
}

/* 1 when prepared tensor T holds exactly its bytes in the file (read back with ferry_tensor_read,
 * from any device; compared with a plain pread of the file). */
static inline int fixture_same_as_file(ferry *f, ferry_tensor *t)
{
    ferry_tensor_info info;
    ferry_tensor_get_info(t, &info);
    unsigned char *want = fixture_pread(info.file, info.offset, info.nbytes);
    unsigned char *got = malloc(info.nbytes ? info.nbytes : 1);
    int ok = want && got && ferry_tensor_nbytes(t) == info.nbytes &&
             ferry_tensor_read(f, t, 0, info.nbytes, got) == 0 &&
             memcmp(want, got, info.nbytes) == 0;
    free(want), free(got);
    return ok;
}

/* Handles of every tensor F finds (ignored ones left out), in file order; *N their number.
 * free() the array. */
static inline ferry_tensor **fixture_all_tensors(ferry *f, size_t *n)
{
    const ferry_catalog *c = ferry_catalog_of(f);
    size_t cnt = ferry_catalog_count(c), k = 0;
    ferry_tensor **ts = calloc(cnt ? cnt : 1, sizeof *ts);
    for (size_t i = 0; ts && i < cnt; i++) {
        ferry_tensor_info info;
        ferry_catalog_tensor(c, i, &info);
        ferry_tensor *t = ferry_find(f, info.name);
        if (t)
            ts[k++] = t;
    }
    *n = k;
    return ts;
}

/* Opens PATH in F, puts every tensor in one group "all" under policy P and returns
 * fixture_all_tensors (free() it); NULL, with a message, when the open or the group fails. */
static inline ferry_tensor **fixture_open_all(ferry *f, const char *path, const ferry_policy *p,
                                              size_t *n)
{
    *n = 0;
    if (ferry_open(f, path, NULL) || ferry_group_add(f, "all", "*", p)) {
        fprintf(stderr, "%s: %s\n", path, ferry_errmsg(f));
        return NULL;
    }
    return fixture_all_tensors(f, n);
}

#endif
