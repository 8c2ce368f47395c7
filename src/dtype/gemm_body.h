/*
 * gemm_body.h — the blocked f32 GEMM of gemm.c, written once and compiled twice: gemm.c includes
 * this file with KFN(name) naming the variant, KATTR its target attribute and KNR the width of a
 * register tile (columns, a multiple of 8). KERN_X86 selects the fused multiply-add intrinsic.
 *
 * C[m x n] += alpha * A[m x k] * B[k x n], row-major with leading dimensions. Columns are cut into
 * panels of GEMM_NB and the shared dimension into slabs of GEMM_KB, so that the slab of B being
 * read (GEMM_KB x GEMM_NB floats) stays in the L2 cache; inside, 4 x KNR tiles of C live in
 * registers while a slab is multiplied in, one rank-1 update per k. Edges use a plain i-k-j loop.
 */

#ifdef KERN_X86
#define KFMA(acc, a, b) ((acc) = (vf8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(acc)))
#else
#define KFMA(acc, a, b) ((acc) += (a) * (b))
#endif

/* The 4 x KNR tile of C at (i, j) += alpha * A[i..i+4, k0..k1) * B[k0..k1, j..j+KNR). */
static KATTR void KFN(tile)(uint64_t i, uint64_t j, uint64_t k0, uint64_t k1, float alpha,
                            const float *a, uint64_t lda, const float *b, uint64_t ldb, float *c,
                            uint64_t ldc)
{
    enum { NV = KNR / 8 };
    vf8 acc[4][NV];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < NV; v++)
            memcpy(&acc[r][v], c + (i + r) * ldc + j + 8 * v, 32);
    const float *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    for (uint64_t p = k0; p < k1; p++) {
        vf8 bv[NV];
        for (int v = 0; v < NV; v++)
            memcpy(&bv[v], b + p * ldb + j + 8 * v, 32);
        float s0 = alpha * a0[p], s1 = alpha * a1[p], s2 = alpha * a2[p], s3 = alpha * a3[p];
        vf8 av0 = {s0, s0, s0, s0, s0, s0, s0, s0}, av1 = {s1, s1, s1, s1, s1, s1, s1, s1};
        vf8 av2 = {s2, s2, s2, s2, s2, s2, s2, s2}, av3 = {s3, s3, s3, s3, s3, s3, s3, s3};
        for (int v = 0; v < NV; v++) {
            KFMA(acc[0][v], av0, bv[v]);
            KFMA(acc[1][v], av1, bv[v]);
            KFMA(acc[2][v], av2, bv[v]);
            KFMA(acc[3][v], av3, bv[v]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < NV; v++)
            memcpy(c + (i + r) * ldc + j + 8 * v, &acc[r][v], 32);
}

/* Rows [i0, i1) x columns [j0, j1) of C += alpha * A[., k0..k1) * B[k0..k1, .), plain loops. */
static KATTR void KFN(edge)(uint64_t i0, uint64_t i1, uint64_t j0, uint64_t j1, uint64_t k0,
                            uint64_t k1, float alpha, const float *a, uint64_t lda,
                            const float *b, uint64_t ldb, float *c, uint64_t ldc)
{
    for (uint64_t i = i0; i < i1; i++) {
        float *ci = c + i * ldc;
        for (uint64_t p = k0; p < k1; p++) {
            float s = alpha * a[i * lda + p];
            const float *bp = b + p * ldb;
            for (uint64_t j = j0; j < j1; j++)
                ci[j] += s * bp[j];
        }
    }
}

static KATTR void KFN(sgemm)(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a,
                             uint64_t lda, const float *b, uint64_t ldb, float *c, uint64_t ldc)
{
    for (uint64_t jj = 0; jj < n; jj += GEMM_NB) {
        uint64_t jend = FERRY__MIN(n, jj + GEMM_NB);
        uint64_t jfull = jj + (jend - jj) / KNR * KNR;
        for (uint64_t kk = 0; kk < k; kk += GEMM_KB) {
            uint64_t kend = FERRY__MIN(k, kk + GEMM_KB);
            uint64_t i = 0;
            for (; i + 4 <= m; i += 4) {
                for (uint64_t j = jj; j < jfull; j += KNR)
                    KFN(tile)(i, j, kk, kend, alpha, a, lda, b, ldb, c, ldc);
                if (jfull < jend)
                    KFN(edge)(i, i + 4, jfull, jend, kk, kend, alpha, a, lda, b, ldb, c, ldc);
            }
            if (i < m)
                KFN(edge)(i, m, jj, jend, kk, kend, alpha, a, lda, b, ldb, c, ldc);
        }
    }
}

#undef KFMA
