/*
 * workload.c — the passes of `ferry run`: each layer prepared, its products taken, checked when
 * asked, released; the time, bytes read and prepare waits of every pass.
 */
#include <stdlib.h>
#include <string.h>

#include "limits.h"
#include "verify.h"
#include "workload.h"

int workload_init(workload *w, ferry *f, layer_set *sets, size_t nsets)
{
    memset(w, 0, sizeof *w);
    w->f = f;
    w->sets = sets;
    w->nsets = nsets;
    uint64_t max_cols = 1, max_rows = 1;
    for (size_t s = 0; s < nsets; s++)
        for (size_t i = 0; i < sets[s].n; i++) {
            ferry_tensor_info info;
            ferry_tensor_get_info(sets[s].t[i], &info);
            max_cols = info.row_elems > max_cols ? info.row_elems : max_cols;
            max_rows = info.n_rows > max_rows ? info.n_rows : max_rows;
        }
    w->x = malloc(max_cols * sizeof *w->x);
    w->y = malloc(max_rows * sizeof *w->y);
    if (!w->x || !w->y)
        return cli_error("out of memory");
    for (uint64_t i = 0; i < max_cols; i++)
        w->x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return 0;
}

int workload_run(workload *w, uint64_t passes, workload_pass *ps, int progress)
{
    ferry *f = w->f;
    layer_set *sets = w->sets;
    size_t nsets = w->nsets;
    int rc = CLI_EXIT_OK;
    cli_progress bar;
    cli_progress_start(&bar, "run", passes * nsets, progress);
    for (uint64_t p = 0; p < passes && rc == CLI_EXIT_OK; p++) {
        const ferry_catalog *cat = ferry_catalog_of(f);
        for (size_t i = 0; w->cold && i < ferry_catalog_file_count(cat); i++)
            limits_drop_cache(ferry_catalog_file_path(cat, i)); /* best effort */
        ferry_stats st0, st1;
        ferry_get_stats(f, &st0);
        double t0 = ferry_now();
        for (size_t s = 0; s < nsets && rc == CLI_EXIT_OK; s++) {
            layer_set *ls = &sets[s];
            if (ferry_prepare(f, ls->t, ls->n)) {
                rc = cli_error("%s", ferry_errmsg(f));
                break;
            }
            double c0 = ferry_now();
            for (size_t i = 0; i < ls->n && w->compute; i++) {
                ferry_tensor_info info;
                ferry_tensor_get_info(ls->t[i], &info);
                if (info.ndim < 2 || !info.n_rows || !info.row_elems)
                    continue; /* a vector, or an empty weight: no product to take */
                if (ferry_matvec(ferry_tensor_dtype(ls->t[i]), ferry_tensor_data(ls->t[i]),
                                 info.n_rows, info.row_elems, w->x, w->y) == 0)
                    w->checksum += w->y[0] + w->y[info.n_rows - 1];
            }
            if (w->compute)
                ferry_trace_event(f, "compute", "compute", c0, ferry_now());
            for (size_t i = 0; i < ls->n && w->verify; i++) {
                char why[256];
                if (!verify_prepared(f, ls->t[i], w->merge_mode, why, sizeof why)) {
                    ferry_tensor_info info;
                    ferry_tensor_get_info(ls->t[i], &info);
                    fprintf(stderr, "ferry: verify: %s: tensor '%s': %s\n", info.file, info.name,
                            why);
                    w->verify_failed = 1;
                }
            }
            ferry_release(f, ls->t, ls->n);
            cli_progress_update(&bar, p * nsets + s + 1);
        }
        ps[p].seconds = ferry_now() - t0;
        ferry_get_stats(f, &st1);
        ps[p].bytes_read = st1.bytes_read - st0.bytes_read;
        ps[p].stall = st1.wait_seconds - st0.wait_seconds;
    }
    cli_progress_end(&bar);
    return rc;
}

void workload_free(workload *w)
{
    free(w->x);
    free(w->y);
    w->x = w->y = NULL;
}
