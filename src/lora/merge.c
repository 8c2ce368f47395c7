/*
 * merge.c — the arithmetic of a LoRA term: the base weight's matrix view, the scale, the bytes
 * of the cached factors, and W += scale * B . A over a chunk of rows through ferry__sgemm (OpenBLAS
 * when built with it), so the manager can merge while a weight is being staged chunk by chunk.
 */
#include <math.h>

#include "dtype/dtype.h"
#include "lora/lora.h"

void ferry__lora_matrix_view(const ferry_tensor_info *info, uint64_t *rows, uint64_t *cols)
{
    if (info->ndim == 0) {
        *rows = 1;
        *cols = 1;
        return;
    }
    uint64_t outer =
        (uint64_t)(info->format == FERRY_FORMAT_GGUF ? info->shape[info->ndim - 1] : info->shape[0]);
    *rows = outer;
    *cols = outer ? info->n_elems / outer : 0;
}

uint64_t ferry__lora_pair_bytes(const ferry__lora_pair *p)
{
    uint64_t na, nb, n, bytes;
    if (ferry__mul_u64(p->rank, p->cols, &na) || ferry__mul_u64(p->rows, p->rank, &nb) ||
        ferry__add_u64(na, nb, &n) || ferry__mul_u64(n, sizeof(float), &bytes))
        return UINT64_MAX;
    return bytes;
}

float ferry__lora_scale(const ferry__lora_pair *p, float multiplier)
{
    if (p->rank == 0)
        return 0.0f;
    double alpha = isnan(p->alpha) ? (double)p->rank : (double)p->alpha;
    return (float)((double)multiplier * alpha / (double)p->rank);
}

/* A call outside the pair's rows or before its factors are loaded breaks the manager's own
 * invariant; it changes nothing rather than reading out of bounds. */
void ferry__lora_apply_rows(const ferry__lora_pair *p, float scale, uint64_t row0, uint64_t nrows,
                            float *w)
{
    if (!p || !w || !p->a || !p->b || nrows == 0 || row0 > p->rows || nrows > p->rows - row0)
        return;
    /* W[nrows x cols] += scale * B[row0 .. row0+nrows) (nrows x rank) . A (rank x cols) */
    ferry__sgemm(nrows, p->cols, p->rank, scale, p->b + row0 * p->rank, p->rank, p->a, p->cols,
                 w, p->cols);
}
