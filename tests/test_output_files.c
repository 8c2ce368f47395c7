/*
 * test_output_files.c — what the CLI's writers (`lora merge -o`, `gen -o`, `gen --lora -o`,
 * `run --trace`, `generate --logits`) may replace: never one of the command's own inputs, whatever the spelling (a hard
 * link, a symbolic link, "dir/../name"), compared by device and inode; never anything but a
 * regular file (a folder, FIFO, socket or device node stays what it was); a symbolic link to a
 * regular file is written through, the link kept. An input named as output is a usage error
 * (exit 2), a special file a failure (exit 1); both leave every file as it was.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "cli_harness.h"
#include "ferry.h"

static char g_base[1200], g_ad[1200], g_out[1200];

static uint64_t hash_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint64_t h = 1469598103934665603ull;
    int c;
    if (!fp)
        return 0;
    while ((c = fgetc(fp)) != EOF)
        h = (h ^ (uint64_t)c) * 1099511628211ull;
    fclose(fp);
    return h;
}

static const char *path_in(const char *name)
{
    static char buf[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, name);
    return buf[k];
}

static mode_t kind(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? (st.st_mode & S_IFMT) : 0;
}

/* A refused write: exit CODE, the message names the output, BASE and ADAPTER unchanged. */
static void expect_code(int rc, int code, const char *out, const char *must_say)
{
    static uint64_t h_base, h_ad;
    if (!h_base) {
        h_base = hash_file(g_base);
        h_ad = hash_file(g_ad);
    }
    if (rc != code)
        fprintf(stderr, "-o %s: exit %d, stderr: %s\n", out, rc, err_text);
    CHECK_EQ_INT(rc, code);
    CHECK(strstr(err_text, out) != NULL);
    if (must_say && !strstr(err_text, must_say))
        fprintf(stderr, "-o %s: '%s' does not say '%s'\n", out, err_text, must_say);
    CHECK(!must_say || strstr(err_text, must_say) != NULL);
    CHECK(hash_file(g_base) == h_base);
    CHECK(hash_file(g_ad) == h_ad);
}

/* An output that is an input: a usage error. */
static void expect_refused(int rc, const char *out, const char *must_say)
{
    expect_code(rc, 2, out, must_say);
}

/* An output that is not a regular file: a failure. */
static void expect_kept(int rc, const char *out, const char *must_say)
{
    expect_code(rc, 1, out, must_say);
}

/* Outputs that are inputs. */
static void test_inputs(void)
{
    const char *merge = "lora merge '%s' -a '%s' -o '%s' -q";
    /* the adapter itself, and through a hard link, a symbolic link and a roundabout spelling */
    expect_refused(run(merge, g_base, g_ad, g_ad), g_ad, "the adapter");
    const char *hard = path_in("ad_hard.safetensors"), *soft = path_in("ad_soft.safetensors");
    CHECK_EQ_INT(link(g_ad, hard), 0);
    CHECK_EQ_INT(symlink(g_ad, soft), 0);
    expect_refused(run(merge, g_base, g_ad, hard), hard, "same file");
    expect_refused(run(merge, g_base, g_ad, soft), soft, "same file");
    CHECK(kind(soft) == S_IFLNK);
    char round[1300];
    snprintf(round, sizeof round, "%s/../%s/ad.safetensors", tmp, strrchr(tmp, '/') + 1);
    expect_refused(run(merge, g_base, g_ad, round), round, "same file");
    /* with a multiplier the adapter is still an input */
    char admul[1300];
    snprintf(admul, sizeof admul, "%s:0.5", g_ad);
    expect_refused(run(merge, g_base, admul, hard), hard, "same file");
    /* the base, as before */
    expect_refused(run(merge, g_base, g_ad, g_base), g_base, "base model");
    /* gen --lora: the base, through a hard link */
    const char *bhard = path_in("base_hard.gguf");
    CHECK_EQ_INT(link(g_base, bhard), 0);
    expect_refused(run("gen --lora '%s' -o '%s' -q", g_base, bhard), bhard, "same file");
    /* run --trace: neither the model nor an adapter */
    expect_refused(run("run -q --passes 1 --trace '%s' '%s'", g_base, g_base), g_base,
                   "same file");
    expect_refused(run("run -q --passes 1 -a '%s' --trace '%s' '%s'", admul, hard, g_base), hard,
                   "same file");
    /* generate --logits: neither the model nor an adapter */
    expect_refused(run("generate '%s' --tokens 1,2 -n 1 --logits '%s'", g_base, g_base), g_base,
                   "same file");
    expect_refused(run("generate '%s' -a '%s' --tokens 1,2 -n 1 --logits '%s'", g_base, admul,
                       hard), hard, "same file");
}

/* Outputs that are not regular files. */
static void test_special(void)
{
    const char *fifo = path_in("fifo.gguf");
    CHECK_EQ_INT(mkfifo(fifo, 0600), 0);
    expect_kept(run("gen -o '%s' --layers 1 --dim 64 --vocab 64 -q", fifo), fifo, "FIFO");
    expect_kept(run("gen --lora '%s' -o '%s' -q", g_base, fifo), fifo, "FIFO");
    expect_kept(run("lora merge '%s' -a '%s' -o '%s' -q", g_base, g_ad, fifo), fifo, "FIFO");
    expect_kept(run("run -q --passes 1 --trace '%s' '%s'", fifo, g_base), fifo, "FIFO");
    expect_kept(run("generate '%s' --tokens 1 -n 1 --logits '%s'", g_base, fifo), fifo, "FIFO");
    CHECK(kind(fifo) == S_IFIFO);
    /* a symbolic link to a FIFO is judged by what it names */
    const char *to_fifo = path_in("to_fifo.gguf");
    CHECK_EQ_INT(symlink(fifo, to_fifo), 0);
    expect_kept(run("gen -o '%s' --layers 1 --dim 64 --vocab 64 -q", to_fifo), to_fifo,
                   "FIFO");
    CHECK(kind(to_fifo) == S_IFLNK && kind(fifo) == S_IFIFO);

    const char *sock = path_in("sock.gguf");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(sock) < sizeof sa.sun_path && s >= 0) {
        memcpy(sa.sun_path, sock, strlen(sock) + 1);
        CHECK_EQ_INT(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
        expect_kept(run("gen -o '%s' --layers 1 --dim 64 --vocab 64 -q", sock), sock,
                       "socket");
        CHECK(kind(sock) == S_IFSOCK);
    } else {
        printf("socket case skipped: the scratch path is too long for a socket address\n");
    }
    if (s >= 0)
        close(s);

    /* a character device like /dev/null (made here, never the real one) */
    const char *dev = path_in("null.gguf");
    if (mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0) {
        expect_kept(run("gen -o '%s' --layers 1 --dim 64 --vocab 64 -q", dev), dev,
                       "character device");
        expect_kept(run("lora merge '%s' -a '%s' -o '%s' -q", g_base, g_ad, dev), dev,
                       "character device");
        CHECK(kind(dev) == S_IFCHR);
    } else {
        printf("device node case skipped: mknod: %s\n", strerror(errno));
    }
    /* a folder */
    const char *dir = path_in("folder.gguf");
    CHECK_EQ_INT(mkdir(dir, 0700), 0);
    expect_kept(run("lora merge '%s' -a '%s' -o '%s' -q", g_base, g_ad, dir), dir, "folder");
    expect_kept(run("gen -o '%s' --layers 1 --dim 64 --vocab 64 -q", dir), dir, "folder");
    CHECK(kind(dir) == S_IFDIR);
}

/* A symbolic link to a regular file that is no input: written through, the link kept. */
static void test_link_written_through(void)
{
    const char *target = path_in("target.gguf"), *link_path = path_in("link.gguf");
    FILE *fp = fopen(target, "wb");
    CHECK(fp != NULL);
    if (fp) {
        fputs("old contents", fp);
        fclose(fp);
    }
    CHECK_EQ_INT(symlink(target, link_path), 0);
    int rc = run("lora merge '%s' -a '%s' -o '%s' -q", g_base, g_ad, link_path);
    if (rc)
        fprintf(stderr, "merge through a link: %s\n", err_text);
    CHECK_EQ_INT(rc, 0);
    CHECK(kind(link_path) == S_IFLNK && kind(target) == S_IFREG);
    CHECK(hash_file(target) == hash_file(g_out));
    ferry_catalog *c = ferry_catalog_create();
    CHECK_EQ_INT(ferry_catalog_add(c, target, NULL), 0);
    ferry_catalog_destroy(c);
    /* the trace too */
    const char *tlink = path_in("trace_link.json"), *ttarget = path_in("trace.json");
    fp = fopen(ttarget, "w");
    if (fp)
        fclose(fp);
    CHECK_EQ_INT(symlink(ttarget, tlink), 0);
    CHECK_EQ_INT(run("run -q --passes 1 --trace '%s' '%s'", tlink, g_base), 0);
    CHECK(kind(tlink) == S_IFLNK && kind(ttarget) == S_IFREG);
    size_t n = 0;
    char *text = slurp(ttarget, &n);
    CHECK(text && strstr(text, "traceEvents") != NULL);
    free(text);
}

int main(void)
{
    tmp = check_tmpdir("output_files");
    snprintf(g_base, sizeof g_base, "%s/base.gguf", tmp);
    snprintf(g_ad, sizeof g_ad, "%s/ad.safetensors", tmp);
    snprintf(g_out, sizeof g_out, "%s/merged.gguf", tmp);
    if (run("gen -o '%s' --layers 1 --dim 64 --ff 128 --vocab 64 --dtype f16 -q", g_base) ||
        run("gen --lora '%s' -o '%s' --rank 4 -q", g_base, g_ad) ||
        run("lora merge '%s' -a '%s' -o '%s' -q", g_base, g_ad, g_out)) {
        fprintf(stderr, "cannot make the test files: %s\n", err_text);
        return 1;
    }
    test_inputs();
    test_special();
    test_link_written_through();
    int rc = check_finish();
    if (!rc)
        check_rmdir(tmp);
    return rc;
}
