/*
 * tokenizer.c — llama.cpp's SentencePiece tokenizer over a GGUF vocabulary (tokenizer.h).
 *
 * Encoding: spaces become U+2581 ("▁"), one is put in front when add_space_prefix (the default),
 * the text is cut into UTF-8 characters, and the adjacent pair whose concatenation is the
 * highest-scoring token is merged first (the leftmost on equal scores), until no pair is a token.
 * A piece that is no token is split back along the merges that made it, and what is still no
 * token (only single characters can be: a merge always makes a token) is written as its bytes'
 * <0xNN> tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_BYTE = 6 };

typedef struct entry {
    const char *s;
    uint32_t len;
    int32_t id;      /* -1: a free slot */
} entry;

struct tokenizer {
    uint32_t n;
    const char **text;     /* (n) points into the catalog */
    uint32_t *len;         /* (n) */
    float *score;          /* (n) */
    int32_t *type;         /* (n) */
    entry *map;            /* open addressing, cap a power of two */
    size_t cap;
    int32_t byte_tok[256]; /* <0xNN> -> id, -1 when absent */
    int add_bos, add_space_prefix;
    uint32_t bos;
};

static uint64_t hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int32_t lookup(const tokenizer *t, const char *s, size_t n)
{
    for (size_t i = hash(s, n) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        const entry *e = &t->map[i];
        if (e->id < 0)
            return -1;
        if (e->len == n && memcmp(e->s, s, n) == 0)
            return e->id;
    }
}

void tokenizer_destroy(tokenizer *t)
{
    if (!t)
        return;
    free(t->text);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->map);
    free(t);
}

static int get_bool(const ferry_catalog *cat, const char *key, int def)
{
    int v;
    return ferry_catalog_get_bool(cat, key, &v) == 0 ? v : def;
}

tokenizer *tokenizer_create(const ferry_catalog *cat, char *err, size_t errlen)
{
    const char *model = NULL;
    const ferry_value *toks = ferry_catalog_meta_find(cat, "tokenizer.ggml.tokens");
    if (ferry_catalog_get_str(cat, "tokenizer.ggml.model", &model) || !toks ||
        toks->type != FERRY_VALUE_ARRAY || toks->v.arr.elem != FERRY_VALUE_STRING ||
        toks->v.arr.n == 0 || toks->v.arr.n > (1u << 24) || !strcmp(model, "none") ||
        !strcmp(model, "no_vocab")) {
        snprintf(err, errlen, "the file carries no tokenizer");
        return NULL;
    }
    if (strcmp(model, "llama") != 0) {
        snprintf(err, errlen, "tokenizer '%s': only llama (SentencePiece) vocabularies are read",
                 model);
        return NULL;
    }
    const ferry_value *scores = ferry_catalog_meta_find(cat, "tokenizer.ggml.scores");
    const ferry_value *types = ferry_catalog_meta_find(cat, "tokenizer.ggml.token_type");
    tokenizer *t = calloc(1, sizeof *t);
    uint32_t n = (uint32_t)toks->v.arr.n;
    if (!t)
        goto oom;
    t->n = n;
    t->cap = 1;
    while (t->cap < 2 * (size_t)n)
        t->cap <<= 1;
    t->text = calloc(n, sizeof *t->text);
    t->len = calloc(n, sizeof *t->len);
    t->score = calloc(n, sizeof *t->score);
    t->type = calloc(n, sizeof *t->type);
    t->map = malloc(t->cap * sizeof *t->map);
    if (!t->text || !t->len || !t->score || !t->type || !t->map)
        goto oom;
    for (size_t i = 0; i < t->cap; i++)
        t->map[i].id = -1;
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = -1;
    for (uint32_t i = 0; i < n; i++) {
        const ferry_value *v = &toks->v.arr.items[i];
        t->text[i] = v->v.str.ptr;
        t->len[i] = v->v.str.len > UINT32_MAX ? 0 : (uint32_t)v->v.str.len;
        t->type[i] = TOKEN_NORMAL;
        if (scores && scores->type == FERRY_VALUE_ARRAY && scores->v.arr.n == n &&
            scores->v.arr.elem == FERRY_VALUE_F32)
            t->score[i] = (float)scores->v.arr.items[i].v.f;
        if (types && types->type == FERRY_VALUE_ARRAY && types->v.arr.n == n &&
            types->v.arr.elem == FERRY_VALUE_I32)
            t->type[i] = (int32_t)types->v.arr.items[i].v.i;
        if (lookup(t, t->text[i], t->len[i]) < 0) { /* the first of duplicates wins */
            size_t k = hash(t->text[i], t->len[i]) & (t->cap - 1);
            while (t->map[k].id >= 0)
                k = (k + 1) & (t->cap - 1);
            t->map[k] = (entry){t->text[i], t->len[i], (int32_t)i};
        }
        unsigned b;
        if (t->type[i] == TOKEN_BYTE && t->len[i] == 6 && sscanf(t->text[i], "<0x%02X>", &b) == 1)
            t->byte_tok[b & 255] = (int32_t)i;
    }
    uint64_t bos = 1;
    ferry_catalog_get_u64(cat, "tokenizer.ggml.bos_token_id", &bos);
    t->bos = bos < n ? (uint32_t)bos : 0;
    t->add_bos = get_bool(cat, "tokenizer.ggml.add_bos_token", 1);
    t->add_space_prefix = get_bool(cat, "tokenizer.ggml.add_space_prefix", 1);
    return t;
oom:
    tokenizer_destroy(t);
    snprintf(err, errlen, "out of memory for a vocabulary of %u tokens", n);
    return NULL;
}

uint32_t tokenizer_size(const tokenizer *t) { return t->n; }

/* ---- encoding -------------------------------------------------------------------------------- */

typedef struct symbol {
    long prev, next;   /* -1 at the ends */
    const char *s;
    size_t n;          /* 0 once merged into its left neighbour */
} symbol;

typedef struct bigram {
    long left, right;
    float score;
    size_t size;
} bigram;

/* a binary max-heap of bigrams: higher score first, then the lower left index */
typedef struct heap {
    bigram *b;
    size_t n, cap;
} heap;

static int before(const bigram *a, const bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(heap *h, bigram g)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        bigram *nb = realloc(h->b, cap * sizeof *nb);
        if (!nb)
            return -1;
        h->b = nb;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && before(&g, &h->b[(i - 1) / 2])) {
        h->b[i] = h->b[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->b[i] = g;
    return 0;
}

static bigram heap_pop(heap *h)
{
    bigram top = h->b[0], last = h->b[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && before(&h->b[c + 1], &h->b[c]))
            c++;
        if (!before(&h->b[c], &last))
            break;
        h->b[i] = h->b[c];
        i = c;
    }
    if (h->n)
        h->b[i] = last;
    return top;
}

static int try_bigram(const tokenizer *t, heap *h, const symbol *sym, long l, long r)
{
    if (l < 0 || r < 0)
        return 0;
    /* the symbols of one text are contiguous, so the pair's text is sym[l].s[0..nl+nr) */
    size_t n = sym[l].n + sym[r].n;
    int32_t id = lookup(t, sym[l].s, n);
    if (id < 0)
        return 0;
    return heap_push(h, (bigram){l, r, t->score[id], n});
}

typedef struct outbuf {
    uint32_t *out;
    size_t n, max;
    int full;
} outbuf;

static void emit(outbuf *o, uint32_t id)
{
    if (o->n < o->max)
        o->out[o->n++] = id;
    else
        o->full = 1;
}

/* Writes the tokens of piece S (N bytes): itself when it is a token, else (a single character
 * the vocabulary lacks) its bytes' <0xNN> tokens. */
static void resegment(const tokenizer *t, const char *s, size_t n, outbuf *o)
{
    int32_t id = lookup(t, s, n);
    if (id >= 0) {
        emit(o, (uint32_t)id);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t b = t->byte_tok[(unsigned char)s[i]];
        emit(o, b >= 0 ? (uint32_t)b : 0);
    }
}

static size_t utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

long tokenizer_encode(const tokenizer *t, const char *text, uint32_t *out, size_t max)
{
    size_t tl = strlen(text), cap = 3 * tl + 4;
    char *s = malloc(cap);
    symbol *sym = malloc((3 * tl + 4) * sizeof *sym);
    heap h = {0};
    long result = -1;
    if (!s || !sym)
        goto done;
    size_t n = 0;
    if (t->add_space_prefix && tl > 0)
        memcpy(s + n, "\xe2\x96\x81", 3), n += 3;
    for (size_t i = 0; i < tl; i++) {
        if (text[i] == ' ')
            memcpy(s + n, "\xe2\x96\x81", 3), n += 3;
        else
            s[n++] = text[i];
    }
    long ns = 0;
    for (size_t i = 0; i < n; ns++) {
        size_t k = utf8_len((unsigned char)s[i]);
        if (k > n - i)
            k = n - i;
        sym[ns] = (symbol){ns - 1, ns + 1, s + i, k};
        i += k;
    }
    if (ns)
        sym[ns - 1].next = -1;
    for (long i = 1; i < ns; i++)
        if (try_bigram(t, &h, sym, i - 1, i))
            goto done;
    while (h.n) {
        bigram g = heap_pop(&h);
        symbol *l = &sym[g.left], *r = &sym[g.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != g.size)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = g.left;
        if (try_bigram(t, &h, sym, l->prev, g.left) || try_bigram(t, &h, sym, g.left, l->next))
            goto done;
    }
    outbuf o = {out, 0, max, 0};
    if (t->add_bos)
        emit(&o, t->bos);
    for (long i = 0; ns && i >= 0; i = sym[i].next)
        resegment(t, sym[i].s, sym[i].n, &o);
    result = o.full ? -1 : (long)o.n;
done:
    free(s);
    free(sym);
    free(h.b);
    return result;
}

/* ---- decoding -------------------------------------------------------------------------------- */

size_t tokenizer_piece(const tokenizer *t, uint32_t id, char *buf, size_t cap)
{
    size_t n = 0;
    if (id >= t->n || t->type[id] == TOKEN_CONTROL) {
        /* nothing */
    } else if (t->type[id] == TOKEN_BYTE) {
        unsigned b;
        if (sscanf(t->text[id], "<0x%02X>", &b) == 1 && cap > 0)
            buf[n++] = (char)b;
    } else {
        const char *s = t->text[id];
        for (uint32_t i = 0; i < t->len[id] && n < cap; i++) {
            if (i + 2 < t->len[id] && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                buf[n++] = ' ';
                i += 2;
            } else {
                buf[n++] = s[i];
            }
        }
    }
    if (n < cap)
        buf[n] = 0;
    return n;
}
