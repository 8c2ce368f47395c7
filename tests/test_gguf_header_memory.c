/*
 * test_gguf_header_memory.c — what a GGUF header costs ferry_catalog_add, which reads the header
 * with pread into a buffer that grows (doubling) until the reader is done: the peak resident set
 * of a process that opens a model, above that of one opening a one-tensor model, measured with
 * wait4.
 *  - a tokenizer of 1M strings (an 18 MB header; the catalog keeps 32 bytes of ferry_value and the
 *    string per token, about 2.4 times the header) peaks within 5 times the header: the buffer
 *    is at most twice the header and is freed after the parse;
 *  - a small header in front of 1 GiB of tensor data (a hole) peaks within 4 MiB: the data
 *    section is not read.
 * Files are written here from the GGUF specification.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "ferry.h"

static const char *g_dir;
static const char *g_self;

static void put(FILE *fp, const void *p, size_t n) { fwrite(p, 1, n, fp); }

static void put_u32(FILE *fp, uint32_t v)
{
    unsigned char q[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(fp, q, 4);
}

static void put_u64(FILE *fp, uint64_t v)
{
    put_u32(fp, (uint32_t)v);
    put_u32(fp, (uint32_t)(v >> 32));
}

static void put_str(FILE *fp, const char *s)
{
    put_u64(fp, strlen(s));
    put(fp, s, strlen(s));
}

/* A GGUF v3 file with a tokenizer of VOCAB strings and one f32 tensor "w" of ELEMS elements (its
 * data a hole). Returns the header's length (data section start), 0 on failure. */
static uint64_t write_gguf(const char *path, unsigned vocab, uint64_t elems)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return 0;
    put(fp, "GGUF", 4);
    put_u32(fp, 3);
    put_u64(fp, 1); /* tensors */
    put_u64(fp, 1); /* key/values */
    put_str(fp, "tokenizer.ggml.tokens");
    put_u32(fp, 9); /* array */
    put_u32(fp, 8); /* of strings */
    put_u64(fp, vocab);
    for (unsigned i = 0; i < vocab; i++) {
        char tok[32];
        snprintf(tok, sizeof tok, "tok%07u", i);
        put_str(fp, tok);
    }
    put_str(fp, "w");
    put_u32(fp, 1);
    put_u64(fp, elems);
    put_u32(fp, 0); /* f32 */
    put_u64(fp, 0);
    long at = ftell(fp);
    while (at % 32) {
        fputc(0, fp);
        at++;
    }
    int ok = fclose(fp) == 0;
    if (!ok || truncate(path, (off_t)((uint64_t)at + 4 * elems)) != 0)
        return 0;
    return (uint64_t)at;
}

/* In a fresh process (this program with --open PATH): the catalog's add of PATH. Its exit
 * status (0: opened) and *PEAK its peak RSS. */
static int open_peak(const char *path, uint64_t *peak)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl(g_self, g_self, "--open", path, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (pid < 0 || wait4(pid, &st, 0, &ru) != pid)
        return -1;
    *peak = (uint64_t)ru.ru_maxrss * 1024;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int open_only(const char *path)
{
    ferry_catalog *c = ferry_catalog_create();
    int rc = c ? ferry_catalog_add(c, path, NULL) : FERRY_ENOMEM;
    if (rc)
        fprintf(stderr, "%s\n", c ? ferry_catalog_errmsg(c) : "out of memory");
    /* what the catalog keeps must be there: read the last token */
    const ferry_value *v = rc ? NULL : ferry_catalog_meta_find(c, "tokenizer.ggml.tokens");
    if (!rc && (!v || v->type != FERRY_VALUE_ARRAY || v->v.arr.n == 0 ||
                v->v.arr.items[v->v.arr.n - 1].type != FERRY_VALUE_STRING))
        rc = 1;
    ferry_catalog_destroy(c);
    return rc ? 1 : 0;
}

/* One case: VOCAB tokens, ELEMS data elements; the peak above BASE within ALLOWED bytes. */
static void check_case(const char *name, unsigned vocab, uint64_t elems, uint64_t base,
                       double times_header, uint64_t plus)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, name);
    uint64_t header = write_gguf(path, vocab, elems);
    CHECK(header > 0);
    uint64_t peak = 0;
    CHECK_EQ_INT(open_peak(path, &peak), 0);
    uint64_t allowed = base + (uint64_t)(times_header * (double)header) + plus;
    printf("%s: header %.1f MB, file %.1f MB: peak RSS %.1f MB (one-tensor model %.1f MB, "
           "allowed %.1f MB)\n",
           name, (double)header / 1e6, (double)(header + 4 * elems) / 1e6, (double)peak / 1e6,
           (double)base / 1e6, (double)allowed / 1e6);
    CHECK(peak > 0 && peak <= allowed);
    unlink(path);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--open") == 0)
        return open_only(argv[2]);
    g_self = argv[0];
    g_dir = check_tmpdir("gguf_header_memory");
    if (SANITIZED) {
        printf("peak RSS bounds not checked in a sanitizer build (its shadow and quarantine "
               "count in the peak)\n");
    } else {
        char path[1200];
        snprintf(path, sizeof path, "%s/one.gguf", g_dir);
        uint64_t base = 0;
        CHECK(write_gguf(path, 1, 1) > 0);
        CHECK_EQ_INT(open_peak(path, &base), 0);
        CHECK(base > 0);
        check_case("vocab", 1000000, 1, base, 5.0, 0);
        check_case("hole", 1000, UINT64_C(1) << 28, base, 0.0, UINT64_C(4) << 20);
    }
    int rc = check_finish();
    if (!rc)
        check_rmdir(g_dir);
    return rc;
}
