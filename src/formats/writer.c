/*
 * writer.c — the public model-file writer (ferry_writer_*), GGUF v3 and safetensors.
 *
 * The caller declares metadata and tensors, then streams the tensors' bytes in declaration order.
 * The header comes from the format's serializer (gguf.c / safetensors.c), which also fixes every
 * tensor's offset; the writer fills the gaps between tensors with zeros. Everything goes to a
 * temporary file beside the target ("PATH.tmp.XXXXXX", created exclusively); finish() checks that
 * every declared byte came, fsyncs, renames onto PATH and fsyncs the folder, so that PATH either
 * does not exist or holds a complete file. Small writes are gathered in a buffer; large ones go
 * straight to the file.
 *
 * Invariant while writing: pos (bytes emitted, buffered included) equals
 * tensors[cur].offset + cur_done whenever cur < n_tensors.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype/dtype.h"
#include "formats/formats.h"

#define WBUF_SIZE ((size_t)1 << 20)

enum { W_DECLARE, W_WRITING, W_DONE, W_FAILED };

struct ferry_writer {
    ferry_format format;
    int state;
    ferry__parsed p;      /* declared metadata and tensors, in declaration order */
    ferry__hmap names;    /* tensor name -> index (keys are p.tensors[i].name) */
    ferry__hmap keys;     /* metadata key -> index (keys are p.meta[i].key) */
    char *path;           /* target */
    char *tmp;            /* temporary file while it exists, else NULL */
    int fd;
    size_t cur;           /* tensor being written */
    uint64_t cur_done;    /* its bytes written so far */
    uint64_t pos;         /* bytes emitted so far */
    unsigned char *buf;   /* WBUF_SIZE bytes */
    size_t blen;
    ferry__err err;
};

ferry_writer *ferry_writer_create(ferry_format format)
{
    if (format != FERRY_FORMAT_GGUF && format != FERRY_FORMAT_SAFETENSORS)
        return NULL;
    ferry_writer *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->format = format;
    w->p.format = format;
    w->fd = -1;
    return w;
}

void ferry_writer_destroy(ferry_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp)
        unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w->buf);
    ferry__hmap_free(&w->names);
    ferry__hmap_free(&w->keys);
    ferry__parsed_free(&w->p);
    free(w);
}

const char *ferry_writer_errmsg(const ferry_writer *w) { return w ? w->err.msg : ""; }

/* A value's structure is sound (so that a deep copy and the serializer can walk it). */
static int check_value(ferry_writer *w, const char *key, const ferry_value *v, unsigned depth)
{
    if ((unsigned)v->type > FERRY_VALUE_F64)
        return ferry__fail(&w->err, FERRY_EINVAL, "key '%s': unknown value type %d", key,
                           (int)v->type);
    if (v->type == FERRY_VALUE_STRING && v->v.str.len && !v->v.str.ptr)
        return ferry__fail(&w->err, FERRY_EINVAL, "key '%s': string of %llu bytes without data",
                           key, (unsigned long long)v->v.str.len);
    if (v->type != FERRY_VALUE_ARRAY)
        return 0;
    if (depth + 1 > FERRY__MAX_NESTING)
        return ferry__fail(&w->err, FERRY_ELIMIT, "key '%s': arrays nested more than %u deep",
                           key, FERRY__MAX_NESTING);
    if ((unsigned)v->v.arr.elem > FERRY_VALUE_F64)
        return ferry__fail(&w->err, FERRY_EINVAL, "key '%s': unknown array item type %d", key,
                           (int)v->v.arr.elem);
    if (v->v.arr.n && !v->v.arr.items)
        return ferry__fail(&w->err, FERRY_EINVAL, "key '%s': array of %llu items without items",
                           key, (unsigned long long)v->v.arr.n);
    for (uint64_t i = 0; i < v->v.arr.n; i++) {
        const ferry_value *it = &v->v.arr.items[i];
        if (it->type != v->v.arr.elem)
            return ferry__fail(&w->err, FERRY_EINVAL,
                               "key '%s': array item %llu has type %d in an array of type %d", key,
                               (unsigned long long)i, (int)it->type, (int)v->v.arr.elem);
        int rc = check_value(w, key, it, depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

int ferry_writer_set_meta(ferry_writer *w, const char *key, const ferry_value *v)
{
    if (!w)
        return FERRY_EINVAL;
    if (w->state != W_DECLARE)
        return ferry__fail(&w->err, FERRY_EINVAL, "set_meta: the writer has already begun");
    if (!key || !*key || !v)
        return ferry__fail(&w->err, FERRY_EINVAL, "set_meta: no key or no value");
    if (strlen(key) > FERRY__MAX_NAME)
        return ferry__fail(&w->err, FERRY_ELIMIT, "set_meta: key of %zu bytes (limit %u)",
                           strlen(key), FERRY__MAX_NAME);
    int rc = check_value(w, key, v, 0);
    if (rc)
        return rc;
    if (w->format == FERRY_FORMAT_SAFETENSORS && v->type != FERRY_VALUE_STRING)
        return ferry__fail(&w->err, FERRY_ETYPE,
                           "key '%s': safetensors metadata values are strings only", key);
    if (w->format == FERRY_FORMAT_GGUF && strcmp(key, "general.alignment") == 0) {
        if (v->type != FERRY_VALUE_U32)
            return ferry__fail(&w->err, FERRY_ETYPE, "general.alignment must be a u32");
        if (!v->v.u || (v->v.u & (v->v.u - 1)) || v->v.u > (UINT64_C(1) << 20))
            return ferry__fail(&w->err, FERRY_EALIGN,
                               "general.alignment %llu is not a power of two up to 1 MiB",
                               (unsigned long long)v->v.u);
    }
    if (ferry__hmap_get(&w->keys, key, NULL))
        return ferry__fail(&w->err, FERRY_EDUP, "metadata key '%s' set twice", key);
    char *k = ferry__strdup(key);
    ferry_value copy;
    if (!k || ferry__value_copy(&copy, v)) {
        free(k);
        return ferry__fail(&w->err, FERRY_ENOMEM, "key '%s': out of memory", key);
    }
    if (ferry__hmap_reserve(&w->keys, w->keys.len + 1) ||
        ferry__parsed_add_meta(&w->p, k, &copy)) {
        free(k);
        ferry__value_free(&copy);
        return ferry__fail(&w->err, FERRY_ENOMEM, "key '%s': out of memory", key);
    }
    ferry__hmap_put(&w->keys, k, w->p.n_meta - 1, NULL);
    return 0;
}

int ferry_writer_set_meta_str(ferry_writer *w, const char *key, const char *value)
{
    if (!w)
        return FERRY_EINVAL;
    if (!value)
        return ferry__fail(&w->err, FERRY_EINVAL, "set_meta_str: no value for '%s'",
                           key ? key : "");
    ferry_value v;
    memset(&v, 0, sizeof v);
    v.type = FERRY_VALUE_STRING;
    v.v.str.ptr = value;
    v.v.str.len = strlen(value);
    return ferry_writer_set_meta(w, key, &v);
}

int ferry_writer_add_tensor(ferry_writer *w, const char *name, ferry_dtype dtype, uint32_t ndim,
                            const int64_t *shape)
{
    if (!w)
        return FERRY_EINVAL;
    ferry__err *e = &w->err;
    if (w->state != W_DECLARE)
        return ferry__fail(e, FERRY_EINVAL, "add_tensor: the writer has already begun");
    if (!name || !*name)
        return ferry__fail(e, FERRY_EINVAL, "add_tensor: no name");
    if (strlen(name) > FERRY__MAX_NAME)
        return ferry__fail(e, FERRY_ELIMIT, "add_tensor: name of %zu bytes (limit %u)",
                           strlen(name), FERRY__MAX_NAME);
    if (ndim > FERRY_MAX_DIMS)
        return ferry__fail(e, FERRY_ELIMIT, "tensor '%s': %u dimensions (limit %d)", name, ndim,
                           FERRY_MAX_DIMS);
    if (ndim && !shape)
        return ferry__fail(e, FERRY_EINVAL, "tensor '%s': no shape", name);
    if (!ferry__dtype_valid(dtype))
        return ferry__fail(e, FERRY_EDTYPE, "tensor '%s': %d is not a type", name, (int)dtype);
    if (w->format == FERRY_FORMAT_GGUF && !ferry__dtype_in_gguf(dtype))
        return ferry__fail(e, FERRY_EDTYPE, "tensor '%s': type %s does not exist in GGUF", name,
                           ferry_dtype_name(dtype));
    if (w->format == FERRY_FORMAT_SAFETENSORS && !ferry__dtype_st_name(dtype))
        return ferry__fail(e, FERRY_EDTYPE, "tensor '%s': type %s does not exist in safetensors",
                           name, ferry_dtype_name(dtype));
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return ferry__fail(e, FERRY_ESHAPE, "tensor '%s': dimension %u is negative (%lld)",
                               name, d, (long long)shape[d]);
        if (ferry__mul_u64(n, (uint64_t)shape[d], &n))
            return ferry__fail(e, FERRY_EOVERFLOW, "tensor '%s': element count overflows", name);
    }
    uint32_t blk = ferry_dtype_block_elems(dtype);
    if (w->format == FERRY_FORMAT_GGUF && blk > 1 && (ndim ? (uint64_t)shape[0] : 1) % blk)
        return ferry__fail(e, FERRY_ESHAPE,
                           "tensor '%s': row of %lld elements is not a whole number of %s blocks "
                           "of %u",
                           name, (long long)(ndim ? shape[0] : 1), ferry_dtype_name(dtype), blk);
    ferry__tdesc t;
    memset(&t, 0, sizeof t);
    int rc = ferry_dtype_nbytes(dtype, n, &t.nbytes);
    if (rc)
        return ferry__fail(e, rc, "tensor '%s': %llu elements of %s %s", name,
                           (unsigned long long)n, ferry_dtype_name(dtype),
                           rc == FERRY_ESHAPE ? "are not a whole number of blocks"
                                              : "do not have a size");
    if (ferry__hmap_get(&w->names, name, NULL))
        return ferry__fail(e, FERRY_EDUP, "tensor '%s' declared twice", name);
    t.name = ferry__strdup(name);
    t.dtype = dtype;
    t.ndim = ndim;
    for (uint32_t d = 0; d < ndim; d++)
        t.shape[d] = shape[d];
    if (!t.name || ferry__hmap_reserve(&w->names, w->names.len + 1) ||
        ferry__parsed_add_tensor(&w->p, &t)) {
        free(t.name);
        return ferry__fail(e, FERRY_ENOMEM, "tensor '%s': out of memory", name);
    }
    ferry__hmap_put(&w->names, t.name, w->p.n_tensors - 1, NULL);
    return 0;
}

/* ---- the file ------------------------------------------------------------------------------- */

static int io_fail(ferry_writer *w, const char *what, int err)
{
    w->state = W_FAILED;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->tmp) {
        unlink(w->tmp);
        free(w->tmp);
        w->tmp = NULL;
    }
    return ferry__fail(&w->err, FERRY_EIO, "%s: %s: %s", w->path, what, strerror(err));
}

static int write_all(ferry_writer *w, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t k = write(w->fd, p, FERRY__MIN(n, (size_t)1 << 30));
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return io_fail(w, "write failed", errno);
        }
        if (k == 0)
            return io_fail(w, "write made no progress", EIO);
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int flush_buf(ferry_writer *w)
{
    int rc = write_all(w, w->buf, w->blen);
    w->blen = 0;
    return rc;
}

/* Appends N bytes (DATA, or zeros when DATA is NULL) to the file. */
static int emit(ferry_writer *w, const void *data, size_t n)
{
    static const unsigned char zeros[4096];
    const unsigned char *p = data;
    if (p && n >= WBUF_SIZE) {
        int rc = flush_buf(w);
        if (!rc)
            rc = write_all(w, p, n);
        if (!rc)
            w->pos += n;
        return rc;
    }
    while (n) {
        if (w->blen == WBUF_SIZE) {
            int rc = flush_buf(w);
            if (rc)
                return rc;
        }
        size_t k = FERRY__MIN(n, WBUF_SIZE - w->blen);
        if (!p)
            k = FERRY__MIN(k, sizeof zeros);
        memcpy(w->buf + w->blen, p ? p : zeros, k);
        w->blen += k;
        w->pos += k;
        n -= k;
        if (p)
            p += k;
    }
    return 0;
}

static int pad_to(ferry_writer *w, uint64_t off)
{
    if (off < w->pos)
        return ferry__fail(&w->err, FERRY_EINVAL, "%s: internal: offset %llu behind position %llu",
                           w->path, (unsigned long long)off, (unsigned long long)w->pos);
    while (w->pos < off) {
        size_t n = (size_t)FERRY__MIN(off - w->pos, (uint64_t)WBUF_SIZE);
        int rc = emit(w, NULL, n);
        if (rc)
            return rc;
    }
    return 0;
}

/* Moves past finished (and empty) tensors and pads up to the next one's offset. */
static int advance(ferry_writer *w)
{
    while (w->cur < w->p.n_tensors && w->cur_done == w->p.tensors[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
    }
    /* Padding goes before a tensor's first byte only. */
    return w->cur < w->p.n_tensors && w->cur_done == 0 ? pad_to(w, w->p.tensors[w->cur].offset)
                                                        : 0;
}

static uint64_t rand_bits(const ferry_writer *w)
{
    static unsigned counter;
    uint64_t x = (uint64_t)(ferry__now() * 1e9) ^ ((uint64_t)getpid() << 32) ^
                 (uint64_t)(uintptr_t)w ^ ((uint64_t)__atomic_add_fetch(&counter, 1,
                                                                       __ATOMIC_RELAXED) << 48);
    /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Creates "PATH.tmp.XXXXXX" exclusively (mode 0666 less the umask, close-on-exec). */
static int create_tmp(ferry_writer *w)
{
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t pl = strlen(w->path);
    char *t = malloc(pl + 12);
    if (!t)
        return ferry__fail(&w->err, FERRY_ENOMEM, "%s: out of memory", w->path);
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t r = rand_bits(w);
        memcpy(t, w->path, pl);
        memcpy(t + pl, ".tmp.", 5);
        for (int i = 0; i < 6; i++, r /= 62)
            t[pl + 5 + i] = chars[r % 62];
        t[pl + 11] = 0;
        int fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
            w->fd = fd;
            w->tmp = t;
            return 0;
        }
        if (errno == EEXIST || errno == EINTR)
            continue;
        int err = errno;
        free(t);
        return ferry__fail(&w->err, err == ENOENT ? FERRY_ENOENT : FERRY_EIO,
                           "%s: cannot create a temporary file beside it: %s", w->path,
                           strerror(err));
    }
    free(t);
    return ferry__fail(&w->err, FERRY_EIO, "%s: no free temporary file name", w->path);
}

int ferry_writer_begin(ferry_writer *w, const char *path)
{
    if (!w)
        return FERRY_EINVAL;
    if (w->state != W_DECLARE)
        return ferry__fail(&w->err, FERRY_EINVAL, "begin: the writer has already begun");
    if (!path || !*path)
        return ferry__fail(&w->err, FERRY_EINVAL, "begin: no path");
    unsigned char *hdr = NULL;
    size_t len = 0;
    ferry__err se;
    ferry__err_clear(&se);
    w->p.alignment = 0; /* GGUF: general.alignment when set, else the default */
    int rc = w->format == FERRY_FORMAT_GGUF ? ferry__gguf_serialize(&w->p, &hdr, &len, &se)
                                            : ferry__safetensors_serialize(&w->p, &hdr, &len, &se);
    if (rc)
        return ferry__fail(&w->err, rc, "%s: %s", path, se.msg);
    w->path = ferry__strdup(path);
    w->buf = malloc(WBUF_SIZE);
    if (!w->path || !w->buf) {
        free(hdr);
        free(w->path), w->path = NULL;
        free(w->buf), w->buf = NULL;
        return ferry__fail(&w->err, FERRY_ENOMEM, "%s: out of memory", path);
    }
    if ((rc = create_tmp(w))) {
        free(hdr);
        free(w->path), w->path = NULL;
        free(w->buf), w->buf = NULL;
        return rc;
    }
    w->state = W_WRITING;
    w->pos = 0;
    w->cur = 0;
    w->cur_done = 0;
    rc = emit(w, hdr, len);
    free(hdr);
    if (!rc)
        rc = advance(w);
    return rc;
}

int ferry_writer_write(ferry_writer *w, const void *data, size_t n)
{
    if (!w)
        return FERRY_EINVAL;
    if (w->state != W_WRITING)
        return ferry__fail(&w->err, FERRY_EINVAL, "write: the writer is not writing (%s)",
                           w->state == W_DECLARE ? "begin not called"
                           : w->state == W_DONE  ? "already finished"
                                                 : "an earlier failure");
    if (n == 0)
        return 0;
    if (!data)
        return ferry__fail(&w->err, FERRY_EINVAL, "write: no data");
    if (w->cur >= w->p.n_tensors)
        return ferry__fail(&w->err, FERRY_EINVAL,
                           "%s: write of %zu bytes after every declared byte was written",
                           w->path, n);
    const ferry__tdesc *t = &w->p.tensors[w->cur];
    uint64_t room = t->nbytes - w->cur_done;
    if (n > room)
        return ferry__fail(&w->err, FERRY_EINVAL,
                           "%s: tensor '%s': write of %zu bytes exceeds the %llu bytes left of its "
                           "%llu",
                           w->path, t->name, n, (unsigned long long)room,
                           (unsigned long long)t->nbytes);
    int rc = emit(w, data, n);
    if (rc)
        return rc;
    w->cur_done += n;
    return advance(w);
}

/* fsyncs the folder that holds PATH, so that the rename is durable. */
static int sync_dir(ferry_writer *w)
{
    const char *slash = strrchr(w->path, '/');
    char *dir = slash ? ferry__strndup(w->path, slash == w->path ? 1 : (size_t)(slash - w->path))
                      : ferry__strdup(".");
    if (!dir)
        return ferry__fail(&w->err, FERRY_ENOMEM, "%s: out of memory", w->path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != EROFS))
        rc = ferry__fail(&w->err, FERRY_EIO, "%s: cannot sync its folder %s: %s", w->path, dir,
                         strerror(errno));
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

int ferry_writer_finish(ferry_writer *w)
{
    if (!w)
        return FERRY_EINVAL;
    if (w->state != W_WRITING)
        return ferry__fail(&w->err, FERRY_EINVAL, "finish: the writer is not writing");
    if (w->cur < w->p.n_tensors) {
        const ferry__tdesc *t = &w->p.tensors[w->cur];
        return ferry__fail(&w->err, FERRY_EINVAL,
                           "%s: tensor '%s': %llu of its %llu bytes written (%zu of %zu tensors "
                           "complete)",
                           w->path, t->name, (unsigned long long)w->cur_done,
                           (unsigned long long)t->nbytes, w->cur, w->p.n_tensors);
    }
    int rc = 0;
    /* GGUF readers that load the whole data section expect the last tensor padded too. */
    if (w->format == FERRY_FORMAT_GGUF && w->p.n_tensors) {
        uint64_t end;
        if (!ferry__align_up(w->pos, w->p.alignment ? w->p.alignment : 32, &end))
            rc = pad_to(w, end);
    }
    if (!rc)
        rc = flush_buf(w);
    if (rc)
        return rc;
    if (fsync(w->fd) != 0)
        return io_fail(w, "fsync failed", errno);
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return io_fail(w, "close failed", errno);
    if (rename(w->tmp, w->path) != 0)
        return io_fail(w, "rename of the temporary file failed", errno);
    free(w->tmp);
    w->tmp = NULL;
    w->state = W_DONE;
    return sync_dir(w);
}
