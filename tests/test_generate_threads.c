/*
 * test_generate_threads.c — `ferry generate` computes the same bits whatever the number of compute
 * threads (1 to 5, more threads than rows in some products), on a model of every weight type the
 * engine reads, streamed from disk under a host budget so that ferry's prefetch threads run beside
 * the compute threads. Under TSan (the "threads" label) the CLI itself is instrumented.
 */
#include <string.h>

#include "check.h"
#include "cli_harness.h"

int main(void)
{
    tmp = check_tmpdir("generate_threads");
    static const char *types[] = {"f16", "q8_0", "q4_0"};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char model[1200], ref[1300], path[1300];
        snprintf(model, sizeof model, "%s/m_%s.gguf", tmp, types[ti]);
        snprintf(ref, sizeof ref, "%s/ref.f32", tmp);
        snprintf(path, sizeof path, "%s/l.f32", tmp);
        CHECK_EQ_INT(run("gen -q -o '%s' --layers 2 --dim 64 --ff 128 --vocab 96 --heads 4 "
                         "--kv-heads 1 --dtype %s", model, types[ti]), 0);
        CHECK_EQ_INT(run("generate '%s' --tokens 3,1,4,1,5 -n 6 --threads 1 --logits '%s'",
                         model, ref), 0);
        size_t n0 = 0, n = 0;
        char *l0 = slurp(ref, &n0);
        CHECK(l0 && n0 == (5 + 6 - 1) * 96 * 4);
        for (int t = 2; t <= 5; t++) {
            int rc = run("generate '%s' --tokens 3,1,4,1,5 -n 6 --threads %d --logits '%s' "
                         "--home disk --budget host=140KiB", model, t, path);
            if (rc)
                fprintf(stderr, "%s, %d threads: exit %d: %s\n", types[ti], t, rc, err_text);
            CHECK_EQ_INT(rc, 0);
            char *l = slurp(path, &n);
            int same = l && l0 && n == n0 && memcmp(l, l0, n0) == 0;
            if (!same)
                fprintf(stderr, "%s, %d threads: logits differ from 1 thread\n", types[ti], t);
            CHECK(same);
            free(l);
        }
        free(l0);
    }

    char moe[1200], ref[1300], path[1300];
    snprintf(moe, sizeof moe, "%s/moe.gguf", tmp);
    snprintf(ref, sizeof ref, "%s/moe_ref.f32", tmp);
    snprintf(path, sizeof path, "%s/moe_l.f32", tmp);
    CHECK_EQ_INT(run("gen -q -o '%s' --arch moe --experts 8 --experts-used 2 --layers 2 --dim 64 "
                     "--ff 128 --vocab 96 --heads 4 --dtype q8_0", moe), 0);
    CHECK_EQ_INT(run("generate '%s' --tokens 3,1,4 -n 8 --batch 1 --threads 1 --logits '%s'", moe,
                     ref), 0);
    size_t n0 = 0, n = 0;
    char *l0 = slurp(ref, &n0);
    CHECK(l0 && n0 == (3 + 8 - 1) * 96 * 4);
    for (int t = 1; t <= 4; t++) {
        int rc = run("generate '%s' --tokens 3,1,4 -n 8 --threads %d --logits '%s' --home disk "
                     "--budget host=260KiB", moe, t, path);
        if (rc)
            fprintf(stderr, "moe, %d threads: exit %d: %s\n", t, rc, err_text);
        CHECK_EQ_INT(rc, 0);
        char *l = slurp(path, &n);
        int same = l && l0 && n == n0 && memcmp(l, l0, n0) == 0;
        if (!same)
            fprintf(stderr, "moe, %d threads: logits differ from the resident run\n", t);
        CHECK(same);
        free(l);
    }
    free(l0);
    return check_finish();
}
