/*
 * index.c — the index of a sharded safetensors model (*.safetensors.index.json).
 *
 * The index is a JSON object: "weight_map" (required) maps each tensor name to the shard file
 * holding it, "metadata" (optional) holds things like total_size. Shard names come from a file
 * anyone can craft and are later opened relative to the index's folder, so a name that could
 * leave that folder (absolute, a ".." component, a backslash, a NUL) is refused with FERRY_EPATH.
 * The catalog opens the shards; this file only lists them: unique shard names in order of first
 * appearance, and for each tensor the index of its shard.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"

void ferry__index_free(ferry__index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n_shards; i++)
        free(ix->shards[i]);
    for (size_t i = 0; i < ix->n_names; i++)
        free(ix->names[i]);
    for (size_t i = 0; i < ix->n_meta; i++) {
        free(ix->meta[i].key);
        ferry__value_free(&ix->meta[i].val);
    }
    free(ix->shards);
    free(ix->names);
    free(ix->shard_of);
    free(ix->meta);
    memset(ix, 0, sizeof *ix);
}

/* 0 when S (LEN bytes) is a safe relative path inside the index's folder; otherwise a short
 * reason. */
static const char *bad_shard_path(const char *s, size_t len)
{
    if (len == 0)
        return "is empty";
    if (strlen(s) != len)
        return "contains a NUL character";
    if (s[0] == '/')
        return "is absolute";
    if (memchr(s, '\\', len))
        return "contains a backslash";
    if (s[len - 1] == '/')
        return "names a folder";
    /* Components between slashes: none may be "..". */
    const char *c = s;
    for (;;) {
        const char *slash = strchr(c, '/');
        size_t n = slash ? (size_t)(slash - c) : strlen(c);
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return "has a \"..\" component";
        if (!slash)
            break;
        c = slash + 1;
    }
    return NULL;
}

/* Keeps string and number members of "metadata"; other kinds are skipped. Strings move from
 * the DOM. */
static int index_meta(ferry__json *m, const char *path, ferry__index *out, ferry__err *e)
{
    if (m->type != FERRY__JSON_OBJECT)
        return ferry__fail(e, FERRY_EFORMAT, "%s: index: \"metadata\" is not an object", path);
    out->meta = calloc(m->n ? m->n : 1, sizeof *out->meta);
    if (!out->meta)
        return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < m->n; i++) {
        ferry__json *v = &m->items[i];
        ferry_value val = {0};
        if (v->type == FERRY__JSON_STRING) {
            val.type = FERRY_VALUE_STRING;
            val.v.str.ptr = v->str;
            val.v.str.len = v->str_len;
            v->str = NULL;
            v->type = FERRY__JSON_NULL;
        } else if (v->type == FERRY__JSON_NUMBER) {
            uint64_t u;
            if (ferry__json_u64(v, &u) == 0) {
                val.type = FERRY_VALUE_U64;
                val.v.u = u;
            } else {
                char *s = ferry__strndup(v->num, v->num_len);
                if (!s)
                    return ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
                val.type = FERRY_VALUE_STRING;
                val.v.str.ptr = s;
                val.v.str.len = v->num_len;
            }
        } else {
            continue;
        }
        out->meta[out->n_meta].key = m->keys[i];
        out->meta[out->n_meta].val = val;
        out->n_meta++;
        m->keys[i] = NULL;
    }
    return 0;
}

int ferry__index_parse(const unsigned char *data, uint64_t size, const char *path,
                       ferry__index *out, ferry__err *e)
{
    memset(out, 0, sizeof *out);
    if (!path)
        path = "(index)";
    if (size > SIZE_MAX)
        return ferry__fail(e, FERRY_ELIMIT, "%s: index of %llu bytes is too large", path,
                           (unsigned long long)size);
    ferry__json root;
    ferry__hmap shards = {0};
    int rc = ferry__json_parse((const char *)data, (size_t)size, path, &root, e);
    if (rc)
        return rc;
    if (root.type != FERRY__JSON_OBJECT) {
        rc = ferry__fail(e, FERRY_EFORMAT, "%s: index: the document is not a JSON object", path);
        goto done;
    }
    ferry__json *wm = NULL, *meta = NULL;
    for (size_t i = 0; i < root.n; i++) {
        if (strcmp(root.keys[i], "weight_map") == 0)
            wm = &root.items[i];
        else if (strcmp(root.keys[i], "metadata") == 0)
            meta = &root.items[i];
        /* Other members (some tools add their own) are ignored. */
    }
    if (!wm || wm->type != FERRY__JSON_OBJECT) {
        rc = ferry__fail(e, FERRY_EFORMAT, "%s: index: %s", path,
                         wm ? "\"weight_map\" is not an object" : "no \"weight_map\"");
        goto done;
    }
    if (meta && (rc = index_meta(meta, path, out, e)))
        goto done;

    size_t n = wm->n;
    out->names = calloc(n ? n : 1, sizeof *out->names);
    out->shard_of = calloc(n ? n : 1, sizeof *out->shard_of);
    out->shards = calloc(1, sizeof *out->shards);
    size_t cap_shards = 1;
    if (!out->names || !out->shard_of || !out->shards) {
        rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        ferry__json *v = &wm->items[i];
        if (v->type != FERRY__JSON_STRING) {
            rc = ferry__fail(e, FERRY_EFORMAT,
                             "%s: index: tensor '%s' maps to something other than a file name",
                             path, wm->keys[i]);
            goto done;
        }
        const char *why = bad_shard_path(v->str, v->str_len);
        if (why) {
            rc = ferry__fail(e, FERRY_EPATH, "%s: index: tensor '%s': shard path \"%.200s\" %s",
                             path, wm->keys[i], v->str, why);
            goto done;
        }
        uint64_t idx;
        if (!ferry__hmap_get(&shards, v->str, &idx)) {
            if (out->n_shards == cap_shards) {
                char **ns = realloc(out->shards, cap_shards * 2 * sizeof *ns);
                if (!ns) {
                    rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
                    goto done;
                }
                out->shards = ns;
                cap_shards *= 2;
            }
            idx = out->n_shards;
            /* The map keys point at the shard strings, which OUT owns from here on. */
            out->shards[out->n_shards++] = v->str;
            v->str = NULL;
            v->type = FERRY__JSON_NULL;
            if (ferry__hmap_put(&shards, out->shards[idx], idx, NULL)) {
                rc = ferry__fail(e, FERRY_ENOMEM, "%s: out of memory", path);
                goto done;
            }
        }
        out->names[i] = wm->keys[i];
        wm->keys[i] = NULL;
        out->shard_of[i] = (uint32_t)idx;
        out->n_names = i + 1;
    }
done:
    ferry__hmap_free(&shards);
    ferry__json_free(&root);
    if (rc)
        ferry__index_free(out);
    return rc;
}
