/*
 * test_generate_threads.c — `ferry generate` computes the same bits whatever the number of compute
 * threads (1 to 5, more threads than rows in some products), on a model of every weight type the
 * engine reads, streamed from disk under a host budget so that ferry's prefetch threads run beside
 * the compute threads, its prompt of five in batches of two and one against one batch of five: a
 * batch's products run over all its tokens at once, and a token's numbers must not depend on
 * its batch. Under TSan (the "threads" label) the CLI itself is instrumented.
 *
 * And a mixture of experts: decoded one token at a time, its experts' slices are prepared
 * asynchronously and computed as their loads finish, beside the loader threads; streamed under a
 * budget that holds a few experts, the prompt too one token at a time, with 1 to 4 compute
 * threads, its logits are those of the model resident, its prompt as one batch, on one thread.
 */
#include <string.h>

#include "check.h"
#include "cli_harness.h"

/* `generate MODEL ARGS` on one thread, resident, against the same with STREAMED added and
 * FROM..TO threads: the logits (ROWS rows of 96) must be the same bytes. */
static void same_logits(const char *label, const char *model, const char *args,
                        const char *streamed, int from, int to, size_t rows)
{
    char ref[1300], path[1300];
    snprintf(ref, sizeof ref, "%s/ref.f32", tmp);
    snprintf(path, sizeof path, "%s/l.f32", tmp);
    CHECK_EQ_INT(run("generate '%s' %s --threads 1 --logits '%s'", model, args, ref), 0);
    size_t n0 = 0, n = 0;
    char *l0 = slurp(ref, &n0);
    CHECK(l0 && n0 == rows * 96 * 4);
    for (int t = from; t <= to; t++) {
        int rc = run("generate '%s' %s %s --threads %d --logits '%s'", model, args, streamed, t,
                     path);
        if (rc)
            fprintf(stderr, "%s, %d threads: exit %d: %s\n", label, t, rc, err_text);
        CHECK_EQ_INT(rc, 0);
        char *l = slurp(path, &n);
        int same = l && l0 && n == n0 && memcmp(l, l0, n0) == 0;
        if (!same)
            fprintf(stderr, "%s, %d threads: logits differ from the resident run\n", label, t);
        CHECK(same);
        free(l);
    }
    free(l0);
}

int main(void)
{
    tmp = check_tmpdir("generate_threads");
    static const char *types[] = {"f16", "q8_0", "q4_0"};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        char model[1200];
        snprintf(model, sizeof model, "%s/m_%s.gguf", tmp, types[ti]);
        CHECK_EQ_INT(run("gen -q -o '%s' --layers 2 --dim 64 --ff 128 --vocab 96 --heads 4 "
                         "--kv-heads 1 --dtype %s", model, types[ti]), 0);
        same_logits(types[ti], model, "--tokens 3,1,4,1,5 -n 6",
                    "--batch 2 --home disk --budget host=140KiB", 2, 5, 5 + 6 - 1);
    }
    char moe[1200];
    snprintf(moe, sizeof moe, "%s/moe.gguf", tmp);
    CHECK_EQ_INT(run("gen -q -o '%s' --arch moe --experts 8 --experts-used 2 --layers 2 --dim 64 "
                     "--ff 128 --vocab 96 --heads 4 --dtype q8_0", moe), 0);
    same_logits("moe", moe, "--tokens 3,1,4 -n 8", "--batch 1 --home disk --budget host=260KiB",
                1, 4, 3 + 8 - 1);
    return check_finish();
}
