/*
 * catalog.c — the public catalog (ferry_catalog_*): what a set of model files holds.
 *
 * ferry_catalog_add opens one model — a GGUF file, a safetensors file, a sharded safetensors index
 * with its shards, or every part of a split GGUF — detecting the format from the content. It
 * works in two phases so that a failure leaves the catalog exactly as it was, and so that the
 * manager can parse without its lock: ferry__catalog_parse opens and parses every file into a
 * pending set and builds the new entries, touching no catalog; ferry__catalog_commit checks the
 * names against the catalog, makes every allocation it needs, and only then appends the files,
 * tensors and metadata by steps that cannot fail. Files stay open (mapped) for the manager, which
 * reaches them through catalog.h.
 *
 * Headers are read with pread into a heap buffer and parsed from there, never from the mapping:
 * a file truncated while it is opened makes a read come back short, reported as FERRY_ECHANGED
 * (or FERRY_EIO) naming the file, where a touch of the mapping would die of SIGBUS. Everything
 * the catalog keeps (names, metadata strings and arrays) is a copy, so the buffer is freed once
 * the file is parsed.
 *
 * Invariants: tensor names are separate allocations that never move (the name map points at them);
 * file objects are separate allocations (their addresses are handed out); tensors are stored in
 * file order (files in added order, each file's tensors in offset order).
 */
#include <stdlib.h>
#include <string.h>

#include "formats/catalog.h"
#include "formats/formats.h"
#include "formats/json_priv.h"

typedef struct cat_file {
    ferry__iofile io;
    ferry_format format;
} cat_file;

typedef struct cat_tensor {
    char *name; /* owned, prefixed */
    uint32_t file;
    uint32_t ndim;
    ferry_dtype dtype;
    int64_t shape[FERRY_MAX_DIMS];
    uint64_t offset, nbytes, n_elems, row_elems, n_rows;
} cat_tensor;

struct ferry_catalog {
    cat_file **files;
    size_t n_files, cap_files;
    cat_tensor *tensors;
    size_t n_tensors, cap_tensors;
    ferry__hmap names; /* tensor name -> index */
    ferry__kv *meta;
    size_t n_meta, cap_meta;
    ferry__hmap meta_keys; /* key -> index into meta */
    uint64_t total_bytes;
    ferry__err err;
};

const char *ferry_format_name(ferry_format f)
{
    switch (f) {
    case FERRY_FORMAT_GGUF: return "gguf";
    case FERRY_FORMAT_SAFETENSORS: return "safetensors";
    default: return "unknown";
    }
}

ferry_catalog *ferry_catalog_create(void) { return calloc(1, sizeof(ferry_catalog)); }

void ferry_catalog_destroy(ferry_catalog *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_tensors; i++)
        free(c->tensors[i].name);
    for (size_t i = 0; i < c->n_files; i++) {
        ferry__iofile_close(&c->files[i]->io);
        free(c->files[i]);
    }
    for (size_t i = 0; i < c->n_meta; i++) {
        free(c->meta[i].key);
        ferry__value_free(&c->meta[i].val);
    }
    free(c->files);
    free(c->tensors);
    free(c->meta);
    ferry__hmap_free(&c->names);
    ferry__hmap_free(&c->meta_keys);
    free(c);
}

const char *ferry_catalog_errmsg(const ferry_catalog *c) { return c ? c->err.msg : ""; }

/* ---- staging: what one add opens, before it is committed ----------------------------------- */

typedef struct pending {
    cat_file *f;        /* opened, owned until committed */
    ferry__parsed p;
} pending;

typedef struct staging {
    pending *v;
    size_t n, cap;
    ferry__kv *extra;   /* metadata that comes before the files' (an index's "metadata") */
    size_t n_extra;
} staging;

static void staging_free(staging *s)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i].f) {
            ferry__iofile_close(&s->v[i].f->io);
            free(s->v[i].f);
        }
        ferry__parsed_free(&s->v[i].p);
    }
    for (size_t i = 0; i < s->n_extra; i++) {
        free(s->extra[i].key);
        ferry__value_free(&s->extra[i].val);
    }
    free(s->extra);
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* Reserves room for N elements of ELEM bytes in *ARR (capacity *CAP). */
static int reserve(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < n) {
        if (ncap > SIZE_MAX / 2)
            return FERRY_ENOMEM;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem)
        return FERRY_ENOMEM;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return FERRY_ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* ---- reading headers ---------------------------------------------------------------------------
 * A head holds the file's first bytes, read through the descriptor as a reader asks for them
 * (ferry__src): HEAD_FIRST bytes (or the file, when smaller) at first, then doubled, or grown to
 * what was asked when that is more, capped at the file's size. A header of H bytes thus costs at
 * most max(HEAD_FIRST, 2 H) bytes of buffer, and the data section is never read. */
#define HEAD_FIRST (UINT64_C(64) << 10)

void (*ferry__catalog_read_hook)(const char *path, uint64_t offset, uint64_t len);

typedef struct head {
    ferry__src src;           /* src.data is buf, src.arg the head */
    const ferry__iofile *io;
    unsigned char *buf;       /* owned */
} head;

static int head_more(ferry__src *s, uint64_t want, ferry__err *e)
{
    head *h = s->arg;
    const ferry__iofile *io = h->io;
    uint64_t n = s->avail ? s->avail : HEAD_FIRST / 2;
    n = n > UINT64_MAX / 2 ? UINT64_MAX : 2 * n;
    n = FERRY__MIN(FERRY__MAX(n, want), s->size);
    if (n <= s->avail)
        return 0;
    /* the file's size was checked against SIZE_MAX when it was opened */
    unsigned char *p = realloc(h->buf, (size_t)n);
    if (!p)
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory for %llu bytes of its header",
                           io->path, (unsigned long long)n);
    h->buf = p;
    s->data = p;
    if (ferry__catalog_read_hook)
        ferry__catalog_read_hook(io->path, s->avail, n - s->avail);
    int rc = ferry__io_read(io, s->avail, n - s->avail, p + s->avail, FERRY_LOAD_READ, e);
    if (rc) {
        /* a short read is the file shrinking under the open: say so when fstat agrees */
        ferry__err ch;
        ferry__err_clear(&ch);
        if (ferry__iofile_check(io, FERRY__PATH_NONE, &ch) == FERRY_ECHANGED)
            return ferry__fail(e, FERRY_ECHANGED, "%s, while bytes [%llu, %llu) of its header "
                               "were read", ch.msg, (unsigned long long)s->avail,
                               (unsigned long long)n);
        return rc;
    }
    s->avail = n;
    return 0;
}

static void head_init(head *h, const ferry__iofile *io)
{
    memset(h, 0, sizeof *h);
    h->io = io;
    h->src.size = io->size;
    h->src.more = head_more;
    h->src.arg = h;
}

static void head_free(head *h)
{
    free(h->buf);
    h->buf = NULL;
    h->src.data = NULL;
    h->src.avail = 0;
}

/* Opens PATH into a new staging entry (not parsed yet); *OUT is its index. */
static int stage_open(staging *s, const char *path, size_t *out, ferry__err *e)
{
    if (reserve((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v))
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    cat_file *f = calloc(1, sizeof *f);
    if (!f)
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    int rc = ferry__iofile_open(path, &f->io, e);
    if (rc) {
        free(f);
        return rc;
    }
    memset(&s->v[s->n], 0, sizeof s->v[s->n]);
    s->v[s->n].f = f;
    *out = s->n++;
    return 0;
}

/* Whether the file read by H is a JSON text (an index): *IS set when its first non-space byte,
 * within the first HEAD_FIRST bytes, is '{', and it is not a safetensors file whose 8-byte length
 * happens to start with that byte. Reads those first bytes into H. */
static int looks_like_index(head *h, int *is, ferry__err *e)
{
    *is = 0;
    uint64_t n = FERRY__MIN(h->src.size, HEAD_FIRST), i = 0;
    int rc = ferry__src_fetch(&h->src, n, h->io->path, e);
    if (rc)
        return rc;
    const unsigned char *d = h->src.data;
    while (i < n && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r'))
        i++;
    if (i >= n || d[i] != '{')
        return 0;
    if (ferry__detect(d, (size_t)FERRY__MIN(n, 4096)) == FERRY_FORMAT_SAFETENSORS) {
        uint64_t len = ferry__le64(d);
        if (len <= h->src.size - 8)
            return 0; /* a safetensors header that fits: take it as safetensors */
    }
    *is = 1;
    return 0;
}

/* Parses staged file I as whatever its content says (GGUF or safetensors), reading its header
 * through H (a head of that file, maybe holding its first bytes already; the caller frees it). */
static int stage_parse_head(staging *s, size_t i, head *h, ferry__err *e)
{
    pending *pd = &s->v[i];
    const ferry__iofile *io = &pd->f->io;
    uint64_t first = FERRY__MIN(io->size, 4096);
    int rc = ferry__src_fetch(&h->src, first, io->path, e);
    if (rc)
        return rc;
    ferry_format fmt = ferry__detect(h->src.data, (size_t)first);
    if (fmt == FERRY_FORMAT_GGUF)
        rc = ferry__gguf_read(&h->src, io->path, &pd->p, e);
    else if (fmt == FERRY_FORMAT_SAFETENSORS)
        rc = ferry__safetensors_read(&h->src, io->path, &pd->p, e);
    else
        return ferry__fail(e, FERRY_EFORMAT, "%s: not a GGUF or safetensors file", io->path);
    if (rc)
        return rc;
    pd->f->format = fmt;
    return 0;
}

static int stage_parse(staging *s, size_t i, ferry__err *e)
{
    head h;
    head_init(&h, &s->v[i].f->io);
    int rc = stage_parse_head(s, i, &h, e);
    head_free(&h);
    return rc;
}

/* The folder part of PATH with its trailing '/', as a length ("" when none). */
static size_t dir_len(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? (size_t)(slash - path) + 1 : 0;
}

/* ---- sharded safetensors ---------------------------------------------------------------------- */

/* The folders a shard of the index PATH may resolve into: the real path of the index's folder as
 * named, and the folder of the index's own real path (a link to an index elsewhere, as in a
 * download cache of links into one folder of blobs). NULL entries when a path cannot be resolved. */
static void index_folders(const char *path, char *dirs[2])
{
    size_t dl = dir_len(path);
    char *d = dl ? ferry__asprintf("%.*s", (int)dl, path) : ferry__strdup(".");
    dirs[0] = d ? realpath(d, NULL) : NULL;
    free(d);
    dirs[1] = realpath(path, NULL);
    char *slash = dirs[1] ? strrchr(dirs[1], '/') : NULL;
    if (slash)
        slash[slash == dirs[1]] = 0; /* "/x.json" keeps "/" */
}

/* Whether the real path REAL lies inside folder DIR (itself a real path). */
static int inside(const char *real, const char *dir)
{
    size_t n = dir ? strlen(dir) : 0;
    if (!n || strncmp(real, dir, n) != 0)
        return 0;
    return dir[n - 1] == '/' || real[n] == '/';
}

/* FERRY_EPATH when shard SP (named NAME by index PATH) resolves, through links, outside both
 * folders of DIRS: the lexical check of the index reader cannot see links. 0 also when SP does
 * not resolve at all (opening it reports that). */
static int check_shard_real(const char *sp, const char *name, const char *path, char *dirs[2],
                            ferry__err *e)
{
    char *real = realpath(sp, NULL);
    if (!real)
        return 0;
    int ok = inside(real, dirs[0]) || inside(real, dirs[1]);
    int rc = ok ? 0
                : ferry__fail(e, FERRY_EPATH,
                              "%s: shard '%s' of the index %s resolves to %s, outside the index's "
                              "folder",
                              sp, name, path, real);
    free(real);
    return rc;
}

typedef struct shard_ref {
    const char *name;
    size_t k;
} shard_ref;

static int by_shard_name(const void *a, const void *b)
{
    return strcmp(((const shard_ref *)a)->name, ((const shard_ref *)b)->name);
}

/* The index read by H is parsed whole: it is a JSON document, read to its end (no larger than the
 * JSON reader's limit on a document). H's buffer is freed once it is parsed. */
static int add_index(staging *s, const char *path, head *h, ferry__err *e)
{
    ferry__index ix;
    memset(&ix, 0, sizeof ix);
    if (h->src.size > FERRY__JSON_MAX_TEXT)
        return ferry__fail(e, FERRY_ELIMIT, "%s: index of %llu bytes exceeds the limit of %llu "
                           "bytes of a JSON document", path, (unsigned long long)h->src.size,
                           (unsigned long long)FERRY__JSON_MAX_TEXT);
    int rc = ferry__src_fetch(&h->src, h->src.size, path, e);
    if (!rc)
        rc = ferry__index_parse(h->src.data, h->src.size, path, &ix, e);
    head_free(h);
    if (rc)
        return rc;
    size_t first = s->n;
    size_t dl = dir_len(path);
    ferry__hmap where = {0}; /* tensor name (unprefixed) -> staging index of its shard */
    char *dirs[2];
    index_folders(path, dirs);
    /* Shards are staged in name order ("-00001-of-" first); rank[k] is shard k's place. */
    shard_ref *order = malloc((ix.n_shards ? ix.n_shards : 1) * sizeof *order);
    size_t *rank = malloc((ix.n_shards ? ix.n_shards : 1) * sizeof *rank);
    if (!order || !rank) {
        rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t k = 0; k < ix.n_shards; k++)
        order[k].name = ix.shards[k], order[k].k = k;
    if (ix.n_shards > 1)
        qsort(order, ix.n_shards, sizeof *order, by_shard_name);
    for (size_t r = 0; r < ix.n_shards; r++)
        rank[order[r].k] = r;
    for (size_t r = 0; r < ix.n_shards; r++) {
        size_t k = order[r].k;
        char *sp = ferry__asprintf("%.*s%s", (int)dl, path, ix.shards[k]);
        if (!sp) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        size_t si;
        rc = check_shard_real(sp, ix.shards[k], path, dirs, e);
        if (rc) {
            free(sp);
            goto done;
        }
        rc = stage_open(s, sp, &si, e);
        if (rc == FERRY_ENOENT)
            rc = ferry__fail(e, FERRY_ENOENT, "%s: shard '%s' named by the index %s does not exist",
                             sp, ix.shards[k], path);
        if (!rc && (rc = stage_parse(s, si, e)) == 0 &&
            s->v[si].f->format != FERRY_FORMAT_SAFETENSORS)
            rc = ferry__fail(e, FERRY_EFORMAT,
                             "%s: shard '%s' of the index %s is a %s file, not safetensors", sp,
                             ix.shards[k], path, ferry_format_name(s->v[si].f->format));
        free(sp);
        if (rc)
            goto done;
        const ferry__parsed *p = &s->v[si].p;
        if (ferry__hmap_reserve(&where, where.len + p->n_tensors)) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t t = 0; t < p->n_tensors; t++) {
            uint64_t other;
            if (ferry__hmap_put(&where, p->tensors[t].name, si, &other) == FERRY_EDUP) {
                rc = ferry__fail(e, FERRY_EDUP, "%s: tensor '%s' is in both shards %s and %s",
                                 path, p->tensors[t].name, s->v[other].f->io.path,
                                 s->v[si].f->io.path);
                goto done;
            }
        }
    }
    for (size_t i = 0; i < ix.n_names; i++) {
        uint64_t si;
        if (ix.shard_of[i] >= ix.n_shards) {
            rc = ferry__fail(e, FERRY_EFORMAT, "%s: tensor '%s': shard number %u out of range",
                             path, ix.names[i], ix.shard_of[i]);
            goto done;
        }
        const char *want = ix.shards[ix.shard_of[i]];
        if (!ferry__hmap_get(&where, ix.names[i], &si)) {
            rc = ferry__fail(e, FERRY_EFORMAT,
                             "%s: tensor '%s' of the weight map is not in its shard '%s'", path,
                             ix.names[i], want);
            goto done;
        }
        if (si != first + rank[ix.shard_of[i]]) {
            rc = ferry__fail(e, FERRY_EFORMAT,
                             "%s: tensor '%s' of the weight map is in %s, not in its shard '%s'",
                             path, ix.names[i], s->v[si].f->io.path, want);
            goto done;
        }
    }
    /* The index's own metadata comes first. Moved out of IX. */
    if (ix.n_meta) {
        s->extra = calloc(ix.n_meta, sizeof *s->extra);
        if (!s->extra) {
            rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        for (size_t i = 0; i < ix.n_meta; i++) {
            s->extra[i] = ix.meta[i];
            memset(&ix.meta[i], 0, sizeof ix.meta[i]);
        }
        s->n_extra = ix.n_meta;
    }
done:
    free(order);
    free(rank);
    free(dirs[0]), free(dirs[1]);
    ferry__hmap_free(&where);
    ferry__index_free(&ix);
    return rc;
}

/* ---- split GGUF ------------------------------------------------------------------------------- */

typedef struct split_name {
    size_t base_len;    /* bytes before "-KKKKK-of-NNNNN.gguf" */
    unsigned k, n;      /* part number (1-based) and count */
    int kw;             /* digits of K as written */
    const char *n_txt;  /* the digits of N as written */
    int nw;
} split_name;

static int digits(const char *s, const char *end, unsigned *v)
{
    if (s >= end || end - s > 9)
        return 0;
    unsigned x = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        x = x * 10 + (unsigned)(*p - '0');
    }
    *v = x;
    return 1;
}

/* Whether PATH ends in "-KKKKK-of-NNNNN.gguf" with 1 <= K <= N. */
static int parse_split_name(const char *path, split_name *out)
{
    size_t len = strlen(path);
    const char *ext = ".gguf";
    if (len < 5 || strcmp(path + len - 5, ext) != 0)
        return 0;
    const char *end = path + len - 5, *p = end;
    while (p > path && p[-1] >= '0' && p[-1] <= '9')
        p--;
    const char *n_txt = p;
    if (!digits(n_txt, end, &out->n) || p - path < 4 || memcmp(p - 4, "-of-", 4) != 0)
        return 0;
    const char *kend = p - 4;
    p = kend;
    while (p > path && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (!digits(p, kend, &out->k) || p == path || p[-1] != '-')
        return 0;
    if (out->k < 1 || out->k > out->n)
        return 0;
    out->base_len = (size_t)(p - 1 - path);
    out->kw = (int)(kend - p);
    out->n_txt = n_txt;
    out->nw = (int)(end - n_txt);
    return 1;
}

/* Checks part K (1-based) of N against its own split keys. */
static int check_part(const pending *pd, unsigned k, unsigned n, ferry__err *e)
{
    uint32_t no, count;
    int rc = ferry__gguf_split_info(&pd->p, pd->f->io.path, &no, &count, e);
    if (rc)
        return rc;
    if (count > 1 && (count != n || no != k - 1))
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: split.no %u of split.count %u, but the name says part %u of %u",
                           pd->f->io.path, no, count, k, n);
    return 0;
}

/* Staged file 0 is a GGUF file. When it is one part of a split set, stages the other parts, all in
 * part order. */
static int add_split_parts(staging *s, const char *path, ferry__err *e)
{
    uint32_t no, count;
    int rc = ferry__gguf_split_info(&s->v[0].p, path, &no, &count, e);
    if (rc)
        return rc;
    split_name sn;
    int named = parse_split_name(path, &sn);
    if (count <= 1 && (!named || sn.n <= 1))
        return 0;
    if (!named)
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: part %u of a split GGUF of %u parts, but the name does not follow "
                           "NAME-0000k-of-0000N.gguf, so the other parts cannot be found",
                           path, no + 1, count);
    if (count > 1 && count != sn.n)
        return ferry__fail(e, FERRY_EFORMAT,
                           "%s: split.count %u differs from the %u parts the name says", path,
                           count, sn.n);
    if ((rc = check_part(&s->v[0], sn.k, sn.n, e)))
        return rc;
    /* Stage the other parts after entry 0, then rotate so that parts are in order. */
    for (unsigned k = 1; k <= sn.n; k++) {
        if (k == sn.k)
            continue;
        char *pp = ferry__asprintf("%.*s-%0*u-of-%.*s.gguf", (int)sn.base_len, path, sn.kw, k,
                                   sn.nw, sn.n_txt);
        if (!pp)
            return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        size_t si;
        rc = stage_open(s, pp, &si, e);
        if (rc == FERRY_ENOENT)
            rc = ferry__fail(e, FERRY_ENOENT, "%s: part %u of %u of the split model %s does not "
                             "exist", pp, k, sn.n, path);
        if (!rc && (rc = stage_parse(s, si, e)) == 0 && s->v[si].f->format != FERRY_FORMAT_GGUF)
            rc = ferry__fail(e, FERRY_EFORMAT, "%s: part %u of the split model %s is not GGUF", pp,
                             k, path);
        if (!rc)
            rc = check_part(&s->v[si], k, sn.n, e);
        free(pp);
        if (rc)
            return rc;
    }
    /* Entries are [part sn.k, parts 1.., skipping sn.k]; move entry 0 to position sn.k - 1. */
    pending first = s->v[0];
    memmove(&s->v[0], &s->v[1], (sn.k - 1) * sizeof *s->v);
    s->v[sn.k - 1] = first;
    return 0;
}

/* ---- committing ------------------------------------------------------------------------------- */

static void fill_tensor(cat_tensor *ct, const ferry__tdesc *t, ferry_format fmt, uint32_t file)
{
    ct->file = file;
    ct->ndim = t->ndim;
    ct->dtype = t->dtype;
    memcpy(ct->shape, t->shape, sizeof ct->shape);
    ct->offset = t->offset;
    ct->nbytes = t->nbytes;
    /* The reader checked the product of the shape; products of sub-shapes are no larger unless a
     * dimension is 0, so they are computed checked and saturate. */
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (ferry__mul_u64(n, (uint64_t)t->shape[d], &n))
            n = UINT64_MAX;
    ct->n_elems = n;
    if (t->ndim == 0) {
        ct->row_elems = 1;
        ct->n_rows = 1;
        return;
    }
    uint32_t inner = fmt == FERRY_FORMAT_GGUF ? 0 : t->ndim - 1;
    ct->row_elems = (uint64_t)t->shape[inner];
    uint64_t rows = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (d != inner && ferry__mul_u64(rows, (uint64_t)t->shape[d], &rows))
            rows = UINT64_MAX;
    ct->n_rows = ct->row_elems ? n / ct->row_elems : rows;
}

/* What ferry__catalog_parse makes: the staged files and the new tensors' entries, names prefixed
 * and owned here, file indices relative to the staged files, until a commit takes them. */
struct ferry__catalog_pending {
    staging s;
    cat_tensor *t;
    size_t nt;
};

/* Builds P's entries from its staged files, under PREFIX. */
static int build_entries(ferry__catalog_pending *p, const char *prefix, ferry__err *e)
{
    staging *s = &p->s;
    size_t nt = 0;
    for (size_t i = 0; i < s->n; i++)
        nt += s->v[i].p.n_tensors;
    size_t plen = prefix ? strlen(prefix) : 0;
    p->t = calloc(nt ? nt : 1, sizeof *p->t);
    if (!p->t)
        return ferry__fail(e, FERRY_ENOMEM, "out of memory adding %zu tensors", nt);
    for (size_t i = 0; i < s->n; i++) {
        ferry__parsed *ps = &s->v[i].p;
        for (size_t t = 0; t < ps->n_tensors; t++) {
            cat_tensor *ct = &p->t[p->nt];
            if (plen) {
                size_t nl = strlen(ps->tensors[t].name);
                ct->name = malloc(plen + nl + 1);
                if (!ct->name)
                    return ferry__fail(e, FERRY_ENOMEM, "out of memory adding %zu tensors", nt);
                memcpy(ct->name, prefix, plen);
                memcpy(ct->name + plen, ps->tensors[t].name, nl + 1);
            } else {
                ct->name = ps->tensors[t].name; /* moved: the staging's is left NULL */
                ps->tensors[t].name = NULL;
            }
            fill_tensor(ct, &ps->tensors[t], s->v[i].f->format, (uint32_t)i);
            p->nt++;
        }
    }
    return 0;
}

void ferry__catalog_pending_free(ferry__catalog_pending *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->nt; i++)
        free(p->t[i].name);
    free(p->t);
    staging_free(&p->s);
    free(p);
}

/* Stages the model at PATH into S: every file opened and parsed, an index's shards or a split
 * GGUF's parts included. */
static int stage_model(staging *s, const char *path, ferry__err *e)
{
    size_t i0;
    int rc = stage_open(s, path, &i0, e);
    if (rc)
        return rc;
    head h;
    head_init(&h, &s->v[0].f->io);
    int is_index = 0;
    if ((rc = looks_like_index(&h, &is_index, e))) {
        head_free(&h);
        return rc;
    }
    if (is_index) {
        /* The index holds no tensors: it is read, then closed, and its shards take its place. */
        pending ix = s->v[0];
        memmove(&s->v[0], &s->v[1], --s->n * sizeof *s->v);
        rc = add_index(s, path, &h, e);
        head_free(&h);
        ferry__iofile_close(&ix.f->io);
        free(ix.f);
        return rc;
    }
    rc = stage_parse_head(s, 0, &h, e);
    head_free(&h);
    if (!rc && s->v[0].f->format == FERRY_FORMAT_GGUF)
        rc = add_split_parts(s, path, e);
    return rc;
}

int ferry__catalog_parse(const char *path, const char *prefix, ferry__catalog_pending **out,
                         ferry__err *e)
{
    *out = NULL;
    if (!path || !*path)
        return ferry__fail(e, FERRY_EINVAL, "no path given");
    ferry__catalog_pending *p = calloc(1, sizeof *p);
    if (!p)
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    int rc = stage_model(&p->s, path, e);
    if (!rc)
        rc = build_entries(p, prefix, e);
    if (rc) {
        ferry__catalog_pending_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int ferry__catalog_commit(ferry_catalog *c, ferry__catalog_pending *p, ferry__err *e)
{
    staging *s = &p->s;
    size_t nt = p->nt, nm = s->n_extra;
    for (size_t i = 0; i < s->n; i++)
        nm += s->v[i].p.n_meta;
    size_t base = c->n_tensors;

    if (c->n_files + s->n > UINT32_MAX)
        return ferry__fail(e, FERRY_ELIMIT, "%s: a catalog holds at most %lu files",
                           s->n ? s->v[0].f->io.path : "", (unsigned long)UINT32_MAX);
    if (reserve((void **)&c->tensors, &c->cap_tensors, base + nt, sizeof *c->tensors) ||
        reserve((void **)&c->files, &c->cap_files, c->n_files + s->n, sizeof *c->files) ||
        reserve((void **)&c->meta, &c->cap_meta, c->n_meta + nm, sizeof *c->meta) ||
        ferry__hmap_reserve(&c->names, c->names.len + nt) ||
        ferry__hmap_reserve(&c->meta_keys, c->meta_keys.len + nm))
        return ferry__fail(e, FERRY_ENOMEM, "out of memory adding %zu tensors", nt);

    /* Names: insert, and on a collision (with the catalog's or another new one) take back what
     * was inserted. Reserved: put cannot fail with ENOMEM. */
    for (size_t i = 0; i < nt; i++) {
        const cat_tensor *ct = &p->t[i];
        uint64_t other;
        if (ferry__hmap_put(&c->names, ct->name, base + i, &other) != FERRY_EDUP)
            continue;
        const char *ofile = other < base ? c->files[c->tensors[other].file]->io.path
                                         : s->v[p->t[other - base].file].f->io.path;
        int rc = ferry__fail(e, FERRY_EDUP, "%s: tensor '%s' is already present from %s",
                             s->v[ct->file].f->io.path, ct->name, ofile);
        for (size_t j = 0; j < i; j++)
            ferry__hmap_del(&c->names, p->t[j].name);
        return rc;
    }

    /* From here on nothing can fail. The names now belong to the catalog. */
    for (size_t i = 0; i < nt; i++) {
        c->tensors[base + i] = p->t[i];
        c->tensors[base + i].file += (uint32_t)c->n_files;
        c->total_bytes += p->t[i].nbytes;
    }
    p->nt = 0;
    c->n_tensors += nt;
    for (size_t i = 0; i < s->n; i++) {
        c->files[c->n_files++] = s->v[i].f;
        s->v[i].f = NULL;
    }
    for (size_t i = 0; i < nm; i++) {
        ferry__kv *kv;
        if (i < s->n_extra) {
            kv = &s->extra[i];
        } else {
            size_t j = i - s->n_extra, f = 0;
            while (j >= s->v[f].p.n_meta)
                j -= s->v[f++].p.n_meta;
            kv = &s->v[f].p.meta[j];
        }
        if (ferry__hmap_put(&c->meta_keys, kv->key, c->n_meta, NULL) == 0) {
            c->meta[c->n_meta++] = *kv; /* moved */
            memset(kv, 0, sizeof *kv);
        }
    }
    return 0;
}

int ferry_catalog_add(ferry_catalog *c, const char *path, const char *prefix)
{
    if (!c)
        return FERRY_EINVAL;
    ferry__err *e = &c->err;
    ferry__err_clear(e);
    if (!path || !*path)
        return ferry__fail(e, FERRY_EINVAL, "ferry_catalog_add: no path");
    ferry__catalog_pending *p;
    int rc = ferry__catalog_parse(path, prefix, &p, e);
    if (!rc)
        rc = ferry__catalog_commit(c, p, e);
    ferry__catalog_pending_free(p);
    return rc;
}

/* ---- queries ---------------------------------------------------------------------------------- */

size_t ferry_catalog_count(const ferry_catalog *c) { return c ? c->n_tensors : 0; }

int ferry_catalog_tensor(const ferry_catalog *c, size_t i, ferry_tensor_info *out)
{
    if (!c || !out)
        return FERRY_EINVAL;
    if (i >= c->n_tensors)
        return FERRY_ENOENT;
    const cat_tensor *t = &c->tensors[i];
    const cat_file *f = c->files[t->file];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->file = f->io.path;
    out->format = f->format;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->n_elems = t->n_elems;
    out->row_elems = t->row_elems;
    out->n_rows = t->n_rows;
    out->offset = t->offset;
    out->nbytes = t->nbytes;
    return 0;
}

int64_t ferry_catalog_find(const ferry_catalog *c, const char *name)
{
    uint64_t v;
    if (!c || !name || !ferry__hmap_get(&c->names, name, &v))
        return -1;
    return (int64_t)v;
}

uint64_t ferry_catalog_total_bytes(const ferry_catalog *c) { return c ? c->total_bytes : 0; }

size_t ferry_catalog_file_count(const ferry_catalog *c) { return c ? c->n_files : 0; }

const char *ferry_catalog_file_path(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_files ? c->files[i]->io.path : NULL;
}

ferry_format ferry_catalog_file_format(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_files ? c->files[i]->format : FERRY_FORMAT_UNKNOWN;
}

const ferry__iofile *ferry__catalog_file(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_files ? &c->files[i]->io : NULL;
}

uint32_t ferry__catalog_tensor_file(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_tensors ? c->tensors[i].file : UINT32_MAX;
}

size_t ferry_catalog_meta_count(const ferry_catalog *c) { return c ? c->n_meta : 0; }

const char *ferry_catalog_meta_key(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_meta ? c->meta[i].key : NULL;
}

const ferry_value *ferry_catalog_meta_value(const ferry_catalog *c, size_t i)
{
    return c && i < c->n_meta ? &c->meta[i].val : NULL;
}

const ferry_value *ferry_catalog_meta_find(const ferry_catalog *c, const char *key)
{
    uint64_t i;
    if (!c || !key || !ferry__hmap_get(&c->meta_keys, key, &i))
        return NULL;
    return &c->meta[i].val;
}

static int get_value(const ferry_catalog *c, const char *key, const ferry_value **v)
{
    if (!c || !key)
        return FERRY_EINVAL;
    *v = ferry_catalog_meta_find(c, key);
    return *v ? 0 : FERRY_ENOENT;
}

static int is_unsigned(ferry_value_type t)
{
    return t == FERRY_VALUE_U8 || t == FERRY_VALUE_U16 || t == FERRY_VALUE_U32 ||
           t == FERRY_VALUE_U64;
}

static int is_signed(ferry_value_type t)
{
    return t == FERRY_VALUE_I8 || t == FERRY_VALUE_I16 || t == FERRY_VALUE_I32 ||
           t == FERRY_VALUE_I64;
}

int ferry_catalog_get_u64(const ferry_catalog *c, const char *key, uint64_t *out)
{
    const ferry_value *v;
    int rc = get_value(c, key, &v);
    if (rc)
        return rc;
    if (is_unsigned(v->type)) {
        *out = v->v.u;
        return 0;
    }
    if (is_signed(v->type) && v->v.i >= 0) {
        *out = (uint64_t)v->v.i;
        return 0;
    }
    return FERRY_ETYPE;
}

int ferry_catalog_get_i64(const ferry_catalog *c, const char *key, int64_t *out)
{
    const ferry_value *v;
    int rc = get_value(c, key, &v);
    if (rc)
        return rc;
    if (is_signed(v->type)) {
        *out = v->v.i;
        return 0;
    }
    if (is_unsigned(v->type) && v->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u;
        return 0;
    }
    return FERRY_ETYPE;
}

int ferry_catalog_get_f64(const ferry_catalog *c, const char *key, double *out)
{
    const ferry_value *v;
    int rc = get_value(c, key, &v);
    if (rc)
        return rc;
    if (v->type != FERRY_VALUE_F32 && v->type != FERRY_VALUE_F64)
        return FERRY_ETYPE;
    *out = v->v.f;
    return 0;
}

int ferry_catalog_get_bool(const ferry_catalog *c, const char *key, int *out)
{
    const ferry_value *v;
    int rc = get_value(c, key, &v);
    if (rc)
        return rc;
    if (v->type != FERRY_VALUE_BOOL)
        return FERRY_ETYPE;
    *out = v->v.u != 0;
    return 0;
}

int ferry_catalog_get_str(const ferry_catalog *c, const char *key, const char **out)
{
    const ferry_value *v;
    int rc = get_value(c, key, &v);
    if (rc)
        return rc;
    if (v->type != FERRY_VALUE_STRING)
        return FERRY_ETYPE;
    *out = v->v.str.ptr;
    return 0;
}
