/*
 * test_synth.c — the synthetic-model generator of `ferry gen` (tools/common/synth.c, in
 * ferry_tools): its AVX2 value generator gives exactly the floats of
 * the portable loop for every tensor kind, scale, length (tails of 1..15 past the 16-wide steps)
 * and chunk, and a whole model written either way is the same file. Without AVX2 both runs take
 * the portable loop and the test says so.
 */
#include <math.h>
#include <stdint.h>

#include "check.h"
#include "ferry_tools.h"

static void test_fill_paths(const float *tab)
{
    enum { N = (1 << 16) + 37 };
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    CHECK(a && b);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    static const struct {
        int kind;
        float scale;
    } kinds[] = {{SYNTH_WEIGHT, 0.02f}, {SYNTH_NORM, 0.01f}, {SYNTH_BIAS, 0.5f},
                 {SYNTH_WEIGHT, 3.0e-5f}, {SYNTH_WEIGHT, 1.0f}};
    static const uint64_t lengths[] = {0, 1, 3, 4, 15, 16, 17, 31, 32, 33, 100, 4096, N};
    int differ = 0, runs = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++)
            for (uint64_t seed = 0; seed < 3; seed++) {
                synth_tensor t;
                memset(&t, 0, sizeof t);
                t.kind = kinds[k].kind;
                t.scale = kinds[k].scale;
                uint64_t n = lengths[li];
                memset(a, 0xa5, N * sizeof *a);
                memset(b, 0x5a, N * sizeof *b);
                synth_force_portable = 1;
                synth_fill_values(&t, tab, seed * 977, k + 3, li + seed, a, n);
                synth_force_portable = 0;
                synth_fill_values(&t, tab, seed * 977, k + 3, li + seed, b, n);
                runs++;
                if (memcmp(a, b, n * sizeof *a) != 0) {
                    differ++;
                    for (uint64_t i = 0; i < n; i++)
                        if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
                            fprintf(stderr, "kind %zu n %llu seed %llu: value %llu: %a vs %a\n",
                                    k, (unsigned long long)n, (unsigned long long)seed,
                                    (unsigned long long)i, (double)a[i], (double)b[i]);
                            break;
                        }
                }
                /* nothing past N values is touched */
                CHECK(n == N || memcmp(&a[n], "\xa5\xa5\xa5\xa5", 4) == 0);
                CHECK(n == N || memcmp(&b[n], "\x5a\x5a\x5a\x5a", 4) == 0);
            }
    CHECK_EQ_INT(differ, 0);
    CHECK(runs > 100);
    /* the values are the kind's: norms around 1, the others centred with the given spread */
    synth_tensor t;
    memset(&t, 0, sizeof t);
    t.kind = SYNTH_NORM;
    t.scale = 0.01f;
    synth_fill_values(&t, tab, 1, 1, 1, a, N);
    double s = 0;
    for (int i = 0; i < N; i++)
        s += a[i];
    CHECK(fabs(s / N - 1.0) < 0.001);
    free(a);
    free(b);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len)) != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len) {
        *n = (size_t)len;
    } else {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    return buf;
}

/* A small model written with each path: the same bytes. */
static void test_same_file(const char *dir)
{
    synth_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = SYNTH_LLAMA;
    cfg.format = FERRY_FORMAT_GGUF;
    cfg.dtype = FERRY_DTYPE_Q4_0;
    cfg.seed = 42;
    cfg.layers = 1;
    cfg.dim = 256;
    cfg.ff = 512;
    cfg.vocab = 1000;
    synth_model m;
    char err[256];
    CHECK_EQ_INT(synth_plan(&cfg, &m, err, sizeof err), 0);
    char pa[1200], pb[1200];
    snprintf(pa, sizeof pa, "%s/portable.gguf", dir);
    snprintf(pb, sizeof pb, "%s/fast.gguf", dir);
    synth_force_portable = 1;
    CHECK_EQ_INT(synth_write(&m, pa, 0), 0);
    synth_force_portable = 0;
    CHECK_EQ_INT(synth_write(&m, pb, 0), 0);
    synth_free(&m);
    size_t na = 0, nb = 0;
    char *a = slurp(pa, &na), *b = slurp(pb, &nb);
    CHECK(a && b);
    CHECK(na > 100000);
    CHECK(na == nb && a && b && memcmp(a, b, na) == 0);
    free(a);
    free(b);
}

int main(void)
{
    const char *dir = check_tmpdir("synth");
#ifdef SYNTH_X86
    if (!__builtin_cpu_supports("avx2"))
#endif
        fprintf(stderr, "note: no AVX2 here: both runs take the portable loop\n");
    float *tab = synth_normal_table();
    CHECK(tab != NULL);
    if (tab)
        test_fill_paths(tab);
    free(tab);
    test_same_file(dir);
    int rc = check_finish();
    if (rc == 0)
        check_rmdir(dir);
    return rc;
}
