/*
 * open_bench.c — how long opening a model takes: parse + catalog of a GGUF and a safetensors file
 * with 10,000 and with 300 small tensors (llama-style names), file warm in the page cache.
 *
 * Target (3) of bench/README.md: ferry_catalog_create + ferry_catalog_add + destroy of a
 * 10,000-tensor model in < 50 ms, of a 300-tensor model in < 5 ms. To say where the time goes it
 * also times, on the same file, the pieces separately:
 *   parse  — ferry__gguf_parse / ferry__safetensors_parse on an in-memory copy + parsed_free;
 *   iofile — ferry__iofile_open + close (open, fstat, mmap, O_DIRECT open);
 *   mgr    — ferry_create + ferry_open + ferry_destroy (the manager's open, for information);
 *   fresh  — the catalog's create + add + destroy as the first thing a new process does (this
 *            program run again with --once PATH): the cost of an engine's one open, fresh heap
 *            pages included, where the repeated opens reuse what the allocator kept.
 * The GGUF cases are run with and without a llama-sized tokenizer vocabulary in the metadata
 * (tokenizer.ggml.tokens / scores / token_type arrays of --vocab entries), because a real
 * 300-tensor GGUF (llama 7B has 291) carries one and its parse dominates a small model's open.
 *
 * usage: open_bench [--reps N] [--vocab N] [--dir DIR] [--only TEXT] [--keep]
 *   --only TEXT   run only the cases whose label contains TEXT ("safetensors 10000")
 *   --dir DIR     generate into (and, with --keep, leave the files in) DIR instead of a fresh
 *                 /tmp/ferry-open-bench-XXXXXX
 * Prints one line per (case, phase) with median / min / max in ms, then PASS/FAIL per case.
 * Exit status 0 when every case passes, 1 otherwise, 2 on error.
 */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry.h"
#include "formats/formats.h"
#include "io/io.h"
#include "util/util.h"

#include "bench_util.h"

typedef struct bcase {
    const char *label;
    ferry_format format;
    unsigned n_tensors;
    unsigned vocab;      /* GGUF tokenizer entries (0: none) */
    double target_ms;
    char path[512];
    uint64_t file_bytes;
} bcase;

/* ---- generating the models ------------------------------------------------------------------ */

/* The name and shape of tensor I of a llama-style model with N tensors (file's own order). */
static void tensor_desc(ferry_format fmt, unsigned i, unsigned n, char *name, size_t cap,
                        uint32_t *ndim, int64_t shape[2], ferry_dtype *dt)
{
    static const char *gguf_blk[] = {"attn_norm.weight", "attn_q.weight",   "attn_k.weight",
                                     "attn_v.weight",    "attn_output.weight", "ffn_norm.weight",
                                     "ffn_gate.weight",  "ffn_up.weight",   "ffn_down.weight"};
    static const char *st_blk[] = {"input_layernorm.weight",  "self_attn.q_proj.weight",
                                   "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                   "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                   "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                   "mlp.down_proj.weight"};
    const int gguf = fmt == FERRY_FORMAT_GGUF;
    /* 3 tensors outside the blocks: embedding, final norm, output */
    if (i == 0 || i + 2 >= n) {
        int k = i == 0 ? 0 : (int)(i + 2 - n) + 1; /* 0 embd, 1 norm, 2 output */
        if (k == 1) {
            snprintf(name, cap, "%s", gguf ? "output_norm.weight" : "model.norm.weight");
            *ndim = 1;
            shape[0] = 64;
            *dt = FERRY_DTYPE_F32;
            return;
        }
        snprintf(name, cap, "%s",
                 k == 0 ? (gguf ? "token_embd.weight" : "model.embed_tokens.weight")
                        : (gguf ? "output.weight" : "lm_head.weight"));
        *ndim = 2;
        shape[0] = gguf ? 64 : 32;
        shape[1] = gguf ? 32 : 64;
        *dt = FERRY_DTYPE_F16;
        return;
    }
    unsigned j = i - 1, blk = j / 9, which = j % 9;
    if (gguf)
        snprintf(name, cap, "blk.%u.%s", blk, gguf_blk[which]);
    else
        snprintf(name, cap, "model.layers.%u.%s", blk, st_blk[which]);
    if (which == 0 || which == 5) {
        *ndim = 1;
        shape[0] = 64;
        *dt = FERRY_DTYPE_F32;
    } else {
        *ndim = 2;
        shape[0] = gguf ? 64 : 16; /* GGUF: innermost first */
        shape[1] = gguf ? 16 : 64;
        *dt = FERRY_DTYPE_F16;
    }
}

static int set_vocab(ferry_writer *w, unsigned vocab)
{
    int rc = 0;
    ferry_value *tok = calloc(vocab ? vocab : 1, sizeof *tok);
    ferry_value *score = calloc(vocab ? vocab : 1, sizeof *score);
    ferry_value *type = calloc(vocab ? vocab : 1, sizeof *type);
    char *text = malloc((size_t)(vocab ? vocab : 1) * 16);
    if (!tok || !score || !type || !text) {
        rc = FERRY_ENOMEM;
        goto out;
    }
    for (unsigned i = 0; i < vocab; i++) {
        char *s = text + (size_t)i * 16;
        int len = snprintf(s, 16, i < 3 ? "<s%u>" : "\xe2\x96\x81tok%u", i);
        tok[i].type = FERRY_VALUE_STRING;
        tok[i].v.str.ptr = s;
        tok[i].v.str.len = (uint64_t)len;
        score[i].type = FERRY_VALUE_F32;
        score[i].v.f = -(double)i;
        type[i].type = FERRY_VALUE_I32;
        type[i].v.i = i < 3 ? 3 : 1;
    }
    ferry_value a = {.type = FERRY_VALUE_ARRAY};
    a.v.arr.n = vocab;
    a.v.arr.elem = FERRY_VALUE_STRING;
    a.v.arr.items = tok;
    if ((rc = ferry_writer_set_meta(w, "tokenizer.ggml.tokens", &a)))
        goto out;
    a.v.arr.elem = FERRY_VALUE_F32;
    a.v.arr.items = score;
    if ((rc = ferry_writer_set_meta(w, "tokenizer.ggml.scores", &a)))
        goto out;
    a.v.arr.elem = FERRY_VALUE_I32;
    a.v.arr.items = type;
    rc = ferry_writer_set_meta(w, "tokenizer.ggml.token_type", &a);
out:
    free(tok);
    free(score);
    free(type);
    free(text);
    return rc;
}

static int generate(bcase *c)
{
    ferry_writer *w = ferry_writer_create(c->format);
    if (!w)
        return FERRY_ENOMEM;
    int rc = 0;
    const int gguf = c->format == FERRY_FORMAT_GGUF;
    char name[128];
    uint32_t ndim;
    int64_t shape[2];
    ferry_dtype dt;
    static const unsigned char zeros[64 * 64 * 4];

    if (gguf) {
        ferry_value u = {.type = FERRY_VALUE_U32};
        rc = ferry_writer_set_meta_str(w, "general.architecture", "llama");
        if (!rc)
            rc = ferry_writer_set_meta_str(w, "general.name", "open-bench");
        u.v.u = c->n_tensors / 9;
        if (!rc)
            rc = ferry_writer_set_meta(w, "llama.block_count", &u);
        u.v.u = 64;
        if (!rc)
            rc = ferry_writer_set_meta(w, "llama.embedding_length", &u);
        if (!rc)
            rc = ferry_writer_set_meta_str(w, "tokenizer.ggml.model", "llama");
        if (!rc && c->vocab)
            rc = set_vocab(w, c->vocab);
    } else {
        rc = ferry_writer_set_meta_str(w, "format", "pt");
    }
    for (unsigned i = 0; i < c->n_tensors && !rc; i++) {
        tensor_desc(c->format, i, c->n_tensors, name, sizeof name, &ndim, shape, &dt);
        rc = ferry_writer_add_tensor(w, name, dt, ndim, shape);
    }
    if (!rc)
        rc = ferry_writer_begin(w, c->path);
    for (unsigned i = 0; i < c->n_tensors && !rc; i++) {
        tensor_desc(c->format, i, c->n_tensors, name, sizeof name, &ndim, shape, &dt);
        uint64_t n = 1;
        for (uint32_t d = 0; d < ndim; d++)
            n *= (uint64_t)shape[d];
        uint64_t bytes = 0;
        ferry_dtype_nbytes(dt, n, &bytes);
        rc = ferry_writer_write(w, zeros, (size_t)bytes);
    }
    if (!rc)
        rc = ferry_writer_finish(w);
    if (rc)
        fprintf(stderr, "open_bench: writing %s: %s\n", c->path, ferry_writer_errmsg(w));
    ferry_writer_destroy(w);
    return rc;
}

/* ---- the timed phases ----------------------------------------------------------------------- */

static int time_catalog(const bcase *c, double *create_add, double *destroy, double *total)
{
    double t0 = bench_now();
    ferry_catalog *cat = ferry_catalog_create();
    if (!cat)
        return FERRY_ENOMEM;
    int rc = ferry_catalog_add(cat, c->path, NULL);
    double t1 = bench_now();
    if (rc) {
        fprintf(stderr, "open_bench: %s: %s\n", c->path, ferry_catalog_errmsg(cat));
        ferry_catalog_destroy(cat);
        return rc;
    }
    if (ferry_catalog_count(cat) != c->n_tensors) {
        fprintf(stderr, "open_bench: %s: %zu tensors, expected %u\n", c->path,
                ferry_catalog_count(cat), c->n_tensors);
        ferry_catalog_destroy(cat);
        return FERRY_EMISMATCH;
    }
    ferry_catalog_destroy(cat);
    double t2 = bench_now();
    *create_add = t1 - t0;
    *destroy = t2 - t1;
    *total = t2 - t0;
    return 0;
}

static int time_parse(const bcase *c, const unsigned char *buf, uint64_t size, double *parse,
                      double *freeing)
{
    ferry__parsed p;
    memset(&p, 0, sizeof p);
    ferry__err e;
    ferry__err_clear(&e);
    double t0 = bench_now();
    int rc = c->format == FERRY_FORMAT_GGUF ? ferry__gguf_parse(buf, size, c->path, &p, &e)
                                            : ferry__safetensors_parse(buf, size, c->path, &p, &e);
    double t1 = bench_now();
    if (rc) {
        fprintf(stderr, "open_bench: parse %s: %s\n", c->path, e.msg);
        return rc;
    }
    ferry__parsed_free(&p);
    double t2 = bench_now();
    *parse = t1 - t0;
    *freeing = t2 - t1;
    return 0;
}

static int time_iofile(const bcase *c, double *open_close)
{
    ferry__iofile f;
    ferry__err e;
    ferry__err_clear(&e);
    double t0 = bench_now();
    int rc = ferry__iofile_open(c->path, &f, &e);
    if (rc) {
        fprintf(stderr, "open_bench: iofile %s: %s\n", c->path, e.msg);
        return rc;
    }
    ferry__iofile_close(&f);
    *open_close = bench_now() - t0;
    return 0;
}

static int time_manager(const bcase *c, double *total)
{
    double t0 = bench_now();
    ferry *f = ferry_create(NULL);
    if (!f)
        return FERRY_ENOMEM;
    int rc = ferry_open(f, c->path, NULL);
    if (rc)
        fprintf(stderr, "open_bench: ferry_open %s: %s\n", c->path, ferry_errmsg(f));
    ferry_destroy(f);
    *total = bench_now() - t0;
    return rc;
}

/* The catalog open of PATH as the first thing a process does: this program run again with
 * --once, timing one create + add + destroy and printing the milliseconds. The repeated opens
 * above reuse what the allocator kept from the last one; a real engine opens a model once, in a
 * process whose heap is fresh, and pays for faulting in every page the metadata takes. */
static int time_fresh_process(const bcase *c, double *total)
{
    int fds[2];
    if (pipe(fds) != 0)
        return FERRY_EIO;
    /* posix_spawn, not fork: glibc spawns with a shared address space (CLONE_VM | CLONE_VFORK),
     * so this process's heap is not made copy-on-write, which would turn the other phases' reuse
     * of freed memory into page faults. */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    char *args[] = {"open_bench", "--once", (char *)c->path, NULL};
    extern char **environ;
    pid_t pid;
    int err = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        return FERRY_EIO;
    }
    char buf[64] = "";
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return FERRY_EIO;
    buf[n] = 0;
    *total = strtod(buf, NULL) / 1e3;
    return 0;
}

static int once(const char *path)
{
    double t0 = bench_now();
    ferry_catalog *cat = ferry_catalog_create();
    int rc = cat ? ferry_catalog_add(cat, path, NULL) : FERRY_ENOMEM;
    ferry_catalog_destroy(cat);
    double t = bench_now() - t0;
    if (rc)
        return 1;
    printf("%.6f\n", t * 1e3);
    return 0;
}

static void print_row(const char *label, const char *phase, double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] *= 1e3;
    bench_stat s = bench_summarize(v, n);
    printf("%-34s %-22s median %8.3f ms   min %8.3f   max %8.3f   (n=%zu)\n", label, phase,
           s.median, s.min, s.max, s.n);
}

static unsigned char *slurp(const char *path, uint64_t *size)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || st.st_size <= 0) {
        fclose(fp);
        return NULL;
    }
    unsigned char *buf = malloc((size_t)st.st_size);
    if (buf && fread(buf, 1, (size_t)st.st_size, fp) != (size_t)st.st_size) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    *size = (uint64_t)st.st_size;
    return buf;
}

/* Runs every phase REPS times (after one untimed warm-up) and prints them. 1 when the catalog
 * total misses the target, 0 when it meets it, negative on error. */
static int run_case(bcase *c, unsigned reps)
{
    double *ca = calloc(reps, sizeof *ca), *de = calloc(reps, sizeof *de),
           *to = calloc(reps, sizeof *to), *pa = calloc(reps, sizeof *pa),
           *pf = calloc(reps, sizeof *pf), *io = calloc(reps, sizeof *io),
           *mg = calloc(reps, sizeof *mg), *fp = calloc(reps, sizeof *fp);
    uint64_t size = 0;
    unsigned char *buf = slurp(c->path, &size);
    int rc = (!ca || !de || !to || !pa || !pf || !io || !mg || !fp || !buf) ? FERRY_ENOMEM : 0;
    double dummy[3];
    if (!rc) /* warm-up: page cache, allocator, lazy binding */
        rc = time_catalog(c, &dummy[0], &dummy[1], &dummy[2]);
    /* The phases alternate within each repetition so that drift affects them alike. */
    for (unsigned r = 0; r < reps && !rc; r++) {
        rc = time_catalog(c, &ca[r], &de[r], &to[r]);
        if (!rc)
            rc = time_parse(c, buf, size, &pa[r], &pf[r]);
        if (!rc)
            rc = time_iofile(c, &io[r]);
        if (!rc)
            rc = time_manager(c, &mg[r]);
        if (!rc)
            rc = time_fresh_process(c, &fp[r]);
    }
    int verdict = rc;
    if (!rc) {
        char label[96];
        char sz[32];
        snprintf(label, sizeof label, "%s (%s)", c->label, ferry_format_size(c->file_bytes, sz));
        print_row(label, "catalog create+add", ca, reps);
        print_row(label, "catalog destroy", de, reps);
        double med_total;
        {
            double *v = to;
            for (unsigned i = 0; i < reps; i++)
                v[i] *= 1e3;
            bench_stat s = bench_summarize(v, reps);
            med_total = s.median;
            printf("%-34s %-22s median %8.3f ms   min %8.3f   max %8.3f   (n=%zu)\n", label,
                   "catalog TOTAL", s.median, s.min, s.max, s.n);
        }
        print_row(label, "  parse (in memory)", pa, reps);
        print_row(label, "  parsed_free", pf, reps);
        print_row(label, "  iofile open+close", io, reps);
        print_row(label, "manager create+open+destroy", mg, reps);
        print_row(label, "catalog in a fresh process", fp, reps);
        verdict = med_total < c->target_ms ? 0 : 1;
        printf("%-34s %s: median %.3f ms vs target < %.0f ms\n\n", label,
               verdict ? "FAIL" : "PASS", med_total, c->target_ms);
    }
    free(ca);
    free(de);
    free(to);
    free(pa);
    free(pf);
    free(io);
    free(mg);
    free(fp);
    free(buf);
    return verdict;
}

int main(int argc, char **argv)
{
    unsigned reps = 30, vocab = 32000;
    const char *dir = NULL, *only = NULL;
    int keep = 0;
    if (argc == 3 && !strcmp(argv[1], "--once"))
        return once(argv[2]);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) {
            vocab = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--keep")) {
            keep = 1;
        } else {
            fprintf(stderr, "usage: open_bench [--reps N] [--vocab N] [--dir DIR] [--only TEXT] [--keep]\n");
            return 2;
        }
    }
    if (reps == 0)
        reps = 1;
    char tmpl[] = "/tmp/ferry-open-bench-XXXXXX";
    if (!dir) {
        dir = mkdtemp(tmpl);
        if (!dir) {
            fprintf(stderr, "open_bench: mkdtemp: %s\n", strerror(errno));
            return 2;
        }
    }
    bcase cases[] = {
        {"gguf 10000 tensors", FERRY_FORMAT_GGUF, 10000, 0, 50.0, "", 0},
        {"gguf 10000 tensors + vocab", FERRY_FORMAT_GGUF, 10000, 1, 50.0, "", 0},
        {"safetensors 10000 tensors", FERRY_FORMAT_SAFETENSORS, 10000, 0, 50.0, "", 0},
        {"gguf 300 tensors", FERRY_FORMAT_GGUF, 300, 0, 5.0, "", 0},
        {"gguf 300 tensors + vocab", FERRY_FORMAT_GGUF, 300, 1, 5.0, "", 0},
        {"safetensors 300 tensors", FERRY_FORMAT_SAFETENSORS, 300, 0, 5.0, "", 0},
    };
    size_t n_cases = sizeof cases / sizeof cases[0];
    int failed = 0, err = 0;
    printf("open_bench: %u repetitions per case, warm page cache, vocabulary %u entries in the "
           "'+ vocab' cases, files in %s\n\n",
           reps, vocab, dir);
    for (size_t i = 0; i < n_cases; i++) {
        bcase *c = &cases[i];
        if (only && !strstr(c->label, only))
            continue;
        if (c->vocab) {
            if (!vocab)
                continue;
            c->vocab = vocab;
        }
        snprintf(c->path, sizeof c->path, "%s/m%u%s.%s", dir, c->n_tensors, c->vocab ? "v" : "",
                 c->format == FERRY_FORMAT_GGUF ? "gguf" : "safetensors");
        struct stat st;
        if (stat(c->path, &st) != 0 && generate(c) != 0) {
            err = 1;
            break;
        }
        if (stat(c->path, &st) == 0)
            c->file_bytes = (uint64_t)st.st_size;
        int v = run_case(c, reps);
        if (v < 0) {
            err = 1;
            break;
        }
        failed += v;
    }
    if (!keep) {
        for (size_t i = 0; i < n_cases; i++)
            if (cases[i].path[0])
                unlink(cases[i].path);
        if (dir == tmpl)
            rmdir(dir);
    }
    if (err)
        return 2;
    printf("open_bench: %d case(s) missed the target\n", failed);
    return failed ? 1 : 0;
}
