/*
 * test_shard_links.c — shards of a sharded safetensors index are opened only inside the index's
 * folder, judged on real paths: a shard that is a symbolic link leaving the folder, or a shard in
 * a linked subfolder that leaves it, is refused (FERRY_EPATH, naming the shard and where it
 * leads), although its name passes the lexical check. Links that stay inside are fine, and so is
 * a download cache's layout, where the index and its shards are all links into one folder of
 * blobs, and an index reached through a linked folder.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"

static const char *g_dir;

static const char *at(const char *rel)
{
    static char buf[4][1400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, rel);
    return buf[k];
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

/* A safetensors shard holding one F32 [2] tensor NAME. */
static void write_shard(const char *path, const char *name)
{
    char json[200];
    int len = snprintf(json, sizeof json,
                       "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", name);
    while (len % 8)
        json[len++] = ' ';
    unsigned char buf[256];
    memset(buf, 0, sizeof buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, json, (size_t)len);
    write_file(path, buf, 8 + (size_t)len + 8);
}

static void write_index(const char *path, const char *shard_a, const char *shard_b)
{
    char text[600];
    int n = snprintf(text, sizeof text, "{\"weight_map\":{\"a\":\"%s\",\"b\":\"%s\"}}", shard_a,
                     shard_b);
    write_file(path, text, (size_t)n);
}

/* ferry_catalog_add of PATH: its code; a refusal's message must contain MUST (when given). */
static int open_index(const char *path, const char *must)
{
    ferry_catalog *c = ferry_catalog_create();
    int rc = ferry_catalog_add(c, path, NULL);
    const char *msg = ferry_catalog_errmsg(c);
    if (rc && must && !strstr(msg, must))
        fprintf(stderr, "%s: '%s' does not say '%s'\n", path, msg, must);
    CHECK(!rc || !must || strstr(msg, must) != NULL);
    if (!rc)
        CHECK_EQ_INT(ferry_catalog_count(c), 2);
    ferry_catalog_destroy(c);
    return rc;
}

int main(void)
{
    g_dir = check_tmpdir("shard_links");
    CHECK_EQ_INT(mkdir(at("model"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("model/sub"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("elsewhere"), 0755), 0);
    write_shard(at("model/b.safetensors"), "b");
    write_shard(at("model/sub/a.safetensors"), "a");
    write_shard(at("elsewhere/a.safetensors"), "a");

    /* plain files: fine */
    write_index(at("model/plain.index.json"), "sub/a.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/plain.index.json"), NULL), 0);

    /* a shard that is a link out of the folder */
    CHECK_EQ_INT(symlink(at("elsewhere/a.safetensors"), at("model/out.safetensors")), 0);
    write_index(at("model/link_out.index.json"), "out.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/link_out.index.json"), "out.safetensors"), FERRY_EPATH);
    CHECK_EQ_INT(open_index(at("model/link_out.index.json"), "elsewhere"), FERRY_EPATH);
    /* the same through a relative link with ".." in its target */
    CHECK_EQ_INT(symlink("../elsewhere/a.safetensors", at("model/rel_out.safetensors")), 0);
    write_index(at("model/rel_out.index.json"), "rel_out.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/rel_out.index.json"), "outside"), FERRY_EPATH);

    /* a shard in a linked subfolder that leaves the folder */
    CHECK_EQ_INT(symlink(at("elsewhere"), at("model/linked")), 0);
    write_index(at("model/dir_out.index.json"), "linked/a.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/dir_out.index.json"), "linked/a.safetensors"),
                 FERRY_EPATH);

    /* links that stay inside */
    CHECK_EQ_INT(symlink("sub/a.safetensors", at("model/in.safetensors")), 0);
    CHECK_EQ_INT(symlink("sub", at("model/alias")), 0);
    write_index(at("model/link_in.index.json"), "in.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/link_in.index.json"), NULL), 0);
    write_index(at("model/dir_in.index.json"), "alias/a.safetensors", "b.safetensors");
    CHECK_EQ_INT(open_index(at("model/dir_in.index.json"), NULL), 0);

    /* the index reached through a linked folder */
    CHECK_EQ_INT(symlink(at("model"), at("model_link")), 0);
    CHECK_EQ_INT(open_index(at("model_link/plain.index.json"), NULL), 0);
    CHECK_EQ_INT(open_index(at("model_link/link_out.index.json"), "outside"), FERRY_EPATH);

    /* a download cache: snapshot/rev/{index, shards} are links into blobs/ */
    CHECK_EQ_INT(mkdir(at("cache"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("cache/blobs"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("cache/snapshots"), 0755), 0);
    CHECK_EQ_INT(mkdir(at("cache/snapshots/rev"), 0755), 0);
    write_shard(at("cache/blobs/1111"), "a");
    write_shard(at("cache/blobs/2222"), "b");
    write_index(at("cache/blobs/3333"), "m-1.safetensors", "m-2.safetensors");
    CHECK_EQ_INT(symlink("../../blobs/1111", at("cache/snapshots/rev/m-1.safetensors")), 0);
    CHECK_EQ_INT(symlink("../../blobs/2222", at("cache/snapshots/rev/m-2.safetensors")), 0);
    CHECK_EQ_INT(symlink("../../blobs/3333", at("cache/snapshots/rev/m.index.json")), 0);
    CHECK_EQ_INT(open_index(at("cache/snapshots/rev/m.index.json"), NULL), 0);

    /* the manager opens through the same catalog */
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, at("model/dir_out.index.json"), NULL), FERRY_EPATH);
    CHECK_EQ_INT(ferry_open(f, at("model/plain.index.json"), NULL), 0);
    ferry_destroy(f);

    int rc = check_finish();
    if (!rc)
        check_rmdir(g_dir);
    return rc;
}
