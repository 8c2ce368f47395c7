/*
 * test_layer_sets.c — how the tool cuts a model into the sets a pass prepares (tools/common/
 * layers.c): layers in file order, and split_large_sets, which streams a layer above a size tensor
 * by tensor: every tensor once, in order, bytes kept, W (two consecutive sets) shrinking to two
 * tensors, small layers left whole, and free_sets still freeing everything (ASan checks it);
 * and split_large_tensors, which cuts a lone tensor above a size into row ranges (slices): the
 * ranges cover its rows in order, none above the size, and their data is the tensor's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ferry.h"
#include "layers.h"
#include "model_fixture.h"

int main(void)
{
    const char *dir = check_tmpdir("layer_sets");
    char path[1200];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    if (fixture_write_llama(path, 4, 128, 256, 300, FERRY_DTYPE_F32))
        return 1;
    ferry *f = ferry_create(NULL);
    CHECK_EQ_INT(ferry_open(f, path, NULL), 0);
    ferry_policy p = {.home = FERRY_HOME_DISK};
    CHECK_EQ_INT(ferry_group_add(f, "all", "*", &p), 0);
    layer_set *sets = NULL;
    size_t n = 0;
    CHECK_EQ_INT(build_sets(f, &sets, &n), 0);
    size_t tensors = 0, largest = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; k++) {
        tensors += sets[k].n;
        bytes += sets[k].bytes;
        largest = sets[k].n > sets[largest].n ? k : largest;
    }
    CHECK(n >= 4 && sets[largest].n >= 5); /* the blocks: several tensors each */
    CHECK_EQ_INT(bytes, ferry_catalog_total_bytes(ferry_catalog_of(f)));
    uint64_t w_layers = sets_working_set(sets, n);
    ferry_tensor **order = malloc(tensors * sizeof *order);
    for (size_t k = 0, i = 0; k < n; k++)
        for (size_t j = 0; j < sets[k].n; j++)
            order[i++] = sets[k].t[j];

    /* nothing above the threshold: unchanged */
    layer_set *same = sets;
    size_t n_same = n;
    CHECK_EQ_INT(split_large_sets(&sets, &n, UINT64_MAX), 0);
    CHECK(sets == same && n == n_same);

    /* blocks above the threshold become one set per tensor; smaller sets stay whole */
    uint64_t limit = sets[largest].bytes - 1;
    size_t small_sets = 0, small_tensors = 0;
    for (size_t k = 0; k < n; k++)
        if (sets[k].bytes <= limit)
            small_sets++, small_tensors += sets[k].n;
    CHECK_EQ_INT(split_large_sets(&sets, &n, limit), 0);
    CHECK_EQ_INT(n, small_sets + (tensors - small_tensors));
    size_t i = 0;
    uint64_t bytes2 = 0;
    int in_order = 1;
    for (size_t k = 0; k < n; k++) {
        CHECK(sets[k].n == 1 || sets[k].bytes <= limit);
        bytes2 += sets[k].bytes;
        for (size_t j = 0; j < sets[k].n; j++)
            in_order &= i < tensors && sets[k].t[j] == order[i++];
    }
    CHECK(in_order && i == tensors);
    CHECK_EQ_INT(bytes2, bytes);
    CHECK(sets_working_set(sets, n) < w_layers);

    /* lone tensors above the threshold become row ranges of at most it, in order */
    size_t big = 0;
    for (size_t k = 0; k < n; k++)
        big = sets[k].bytes > sets[big].bytes ? k : big;
    CHECK_EQ_INT(sets[big].n, 1);
    ferry_tensor *whole = sets[big].t[0];
    ferry_tensor_info wi;
    CHECK_EQ_INT(ferry_tensor_get_info(whole, &wi), 0);
    uint64_t cut = wi.nbytes / 3 + 1; /* three ranges */
    size_t n_before = n, at_big = big, over = 0;
    for (size_t k = 0; k < n; k++)
        over += sets[k].n == 1 && sets[k].bytes > cut;
    CHECK(over >= 1);
    CHECK_EQ_INT(split_large_tensors(f, &sets, &n, cut), 0);
    CHECK(n > n_before);
    uint64_t bytes3 = 0, rows = 0;
    for (size_t k = 0; k < n; k++) {
        CHECK(sets[k].n == 1 || sets[k].bytes <= limit);
        CHECK(sets[k].n > 1 || sets[k].bytes <= cut || sets[k].bytes == 0);
        bytes3 += sets[k].bytes;
    }
    CHECK_EQ_INT(bytes3, bytes);
    /* the ranges of the largest tensor sit where it sat, and hold its rows and bytes */
    unsigned char *ref = malloc(wi.nbytes);
    CHECK_EQ_INT(ferry_tensor_read_file(f, whole, 0, wi.nbytes, ref), 0);
    uint64_t off = 0;
    int same_bytes = 1;
    for (size_t k = at_big; k < n && rows < wi.n_rows; k++) {
        ferry_tensor_info si;
        CHECK_EQ_INT(ferry_tensor_get_info(sets[k].t[0], &si), 0);
        CHECK_EQ_INT(si.offset, wi.offset + off);
        CHECK(si.nbytes <= cut);
        CHECK_EQ_INT(ferry_prepare(f, sets[k].t, 1), 0);
        same_bytes &= memcmp(ferry_tensor_data(sets[k].t[0]), ref + off, si.nbytes) == 0;
        ferry_release(f, sets[k].t, 1);
        rows += si.n_rows;
        off += si.nbytes;
    }
    CHECK(same_bytes);
    CHECK_EQ_INT(rows, wi.n_rows);
    CHECK_EQ_INT(off, wi.nbytes);
    free(ref);
    /* nothing above the threshold: unchanged */
    same = sets;
    n_same = n;
    CHECK_EQ_INT(split_large_tensors(f, &sets, &n, UINT64_MAX), 0);
    CHECK(sets == same && n == n_same);
    free(order);
    free_sets(sets);
    ferry_destroy(f);
    if (!check_failed)
        check_rmdir(dir);
    return check_finish();
}
