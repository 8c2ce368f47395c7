/*
 * gemm.c — the f32 GEMM used by LoRA merge (W += scale * B.A): OpenBLAS's cblas_sgemm, loaded
 * with dlopen on the first GEMM that would use it, when ferry was built with FERRY_BLAS and the
 * library is present; otherwise (and always as ferry__sgemm_ref) a blocked C loop. The loop's
 * kernel (gemm_body.h) is compiled portably and, on x86, once more for AVX2+FMA, picked at run
 * time.
 *
 * OpenBLAS is not linked: its constructor starts worker threads that spin after start, which
 * would take cores from processes that never merge an adapter.
 */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"
#include "util/util.h"

/* OpenBLAS synchronizes its worker threads in code ThreadSanitizer does not instrument, so a TSan
 * build would report its writes to C as races; such builds use the builtin loop. */
#if defined(__SANITIZE_THREAD__)
#define FERRY_GEMM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_GEMM_TSAN 1
#endif
#endif
#if defined(FERRY_BLAS_DLOPEN) && !defined(FERRY_GEMM_TSAN)
#define FERRY_GEMM_CBLAS 1
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FERRY_GEMM_X86 1
#include <immintrin.h>
#endif

typedef float vf8 __attribute__((vector_size(32)));

/* Panel sizes: a GEMM_KB x GEMM_NB slab of B is 256 KiB. */
#define GEMM_NB 256
#define GEMM_KB 256

#define KFN(name) name##_generic
#define KATTR
#define KNR 8
#include "dtype/gemm_body.h"
#undef KFN
#undef KATTR
#undef KNR

#ifdef FERRY_GEMM_X86
#define KERN_X86 1
#define KFN(name) name##_avx2
#define KATTR __attribute__((target("avx2,fma")))
#define KNR 16
#include "dtype/gemm_body.h"
#undef KFN
#undef KATTR
#undef KNR
#undef KERN_X86
#endif

void ferry__sgemm_ref(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a,
                      uint64_t lda, const float *b, uint64_t ldb, float *c, uint64_t ldc)
{
    if (m == 0 || n == 0 || k == 0 || alpha == 0.0f)
        return;
#ifdef FERRY_GEMM_X86
    if (ferry__dtype_use_avx2()) {
        sgemm_avx2(m, n, k, alpha, a, lda, b, ldb, c, ldc);
        return;
    }
#endif
    sgemm_generic(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

#ifdef FERRY_GEMM_CBLAS
/* cblas_sgemm's C ABI: the CBLAS enums are ints (CblasRowMajor 101, CblasNoTrans 111). */
#define CBLAS_ROW_MAJOR 101
#define CBLAS_NO_TRANS 111
typedef void (*cblas_sgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb,
                               float beta, float *c, int ldc);

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static cblas_sgemm_fn blas_sgemm; /* written once under blas_once, NULL: the builtin loop */

static const char *const blas_names[] = {"libopenblas.so.0", "libopenblas.so"};

static void blas_load(void)
{
    const char *e = getenv("FERRY_BLAS");
    if (e && strcmp(e, "0") == 0)
        return;
    void *lib = ferry__dlopen_first(blas_names, FERRY__ARRAY_LEN(blas_names), NULL);
    if (lib)
        ferry__dlsym_fn(lib, "cblas_sgemm", &blas_sgemm, sizeof blas_sgemm);
}

/* OpenBLAS's cblas_sgemm, loading it on the first call; NULL when it is off or absent. */
static cblas_sgemm_fn blas(void)
{
    pthread_once(&blas_once, blas_load);
    return blas_sgemm;
}
#endif

void ferry__sgemm(uint64_t m, uint64_t n, uint64_t k, float alpha, const float *a, uint64_t lda,
                  const float *b, uint64_t ldb, float *c, uint64_t ldc)
{
    if (m == 0 || n == 0 || k == 0 || alpha == 0.0f)
        return;
#ifdef FERRY_GEMM_CBLAS
    /* CBLAS takes int dimensions; anything larger goes to the builtin loop. */
    if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
        ldc <= INT_MAX) {
        cblas_sgemm_fn f = blas();
        if (f) {
            f(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
              (int)lda, b, (int)ldb, 1.0f, c, (int)ldc);
            return;
        }
    }
#endif
    ferry__sgemm_ref(m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

const char *ferry__sgemm_backend(void)
{
#ifdef FERRY_GEMM_CBLAS
    return blas() ? "openblas" : "builtin";
#else
    return "builtin";
#endif
}
