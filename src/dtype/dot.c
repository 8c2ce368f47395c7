/*
 * dot.c — the decode-shaped workload: y = W.x one row at a time, with W in its stored type and x
 * in f32. Rows of f32, f16, bf16, q8_0 and q4_0 (and with AVX2 q4_K and q6_K) are dequantized
 * in registers; every other readable type goes through a small stack buffer of f32.
 *
 * The kernels (dot_body.h) are compiled twice: portable vector code for the baseline ISA, and on
 * x86 an AVX2+FMA+F16C variant picked at run time when the CPU has it; with AVX-512 the f32, f16,
 * bf16, q8_0 and q4_0 rows go to dot_avx512.c. All give the same sums up to float rounding (FMA
 * rounds products once, not twice; the order of the sums differs).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtype/dtype.h"
#include "dtype/dtype_kern.h"
#include "util/util.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FERRY_DOT_X86 1
#include <immintrin.h>
#endif

typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef int8_t vsb8 __attribute__((vector_size(8)));
typedef uint8_t vub8 __attribute__((vector_size(8)));

typedef float (*dot_kernel)(ferry_dtype t, const uint8_t *row, const float *x, uint64_t n);

/* The portable kernels. */
#define KFN(name) name##_generic
#define KATTR
#include "dtype/dot_body.h"
#undef KFN
#undef KATTR

#ifdef FERRY_DOT_X86
#define KERN_X86 1
#define KFN(name) name##_avx2
#define KATTR __attribute__((target("avx2,fma,f16c")))
#include "dtype/dot_body.h"
#undef KFN
#undef KATTR
#undef KERN_X86
#endif

/* Set only by tests (ferry__dtype_force_isa), between runs. */
static int force_cap = -1;

int ferry__dtype_force_isa(int level)
{
    int old = force_cap;
    force_cap = level;
    return old;
}

int ferry__dtype_force_generic(int on)
{
    return ferry__dtype_force_isa(on ? FERRY__ISA_GENERIC : -1) == FERRY__ISA_GENERIC;
}

/* What the CPU supports, capped by FERRY_ISA: computed once (racing first calls compute the same
 * value). */
static int cpu_isa(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0)
        return v;
    v = FERRY__ISA_GENERIC;
#ifdef FERRY_DOT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
#if !defined(__clang__)
        && __builtin_cpu_supports("f16c")
#endif
    ) {
        v = FERRY__ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
            v = FERRY__ISA_AVX512;
        if (v == FERRY__ISA_AVX512 && __builtin_cpu_supports("avx512vnni") &&
            __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni"))
            v = FERRY__ISA_AVX512_VBMI;
    }
#endif
    const char *e = getenv("FERRY_ISA");
    if (e && strcmp(e, "generic") == 0)
        v = FERRY__ISA_GENERIC;
    else if (e && strcmp(e, "avx2") == 0 && v > FERRY__ISA_AVX2)
        v = FERRY__ISA_AVX2;
    else if (e && strcmp(e, "avx512") == 0 && v > FERRY__ISA_AVX512)
        v = FERRY__ISA_AVX512;
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

int ferry__dtype_isa(void)
{
    int v = cpu_isa();
    return force_cap >= 0 && force_cap < v ? force_cap : v;
}

int ferry__dtype_use_avx2(void) { return ferry__dtype_isa() >= FERRY__ISA_AVX2; }

const char *ferry__dot_isa(void)
{
    int v = ferry__dtype_isa();
    return v == FERRY__ISA_AVX512_VBMI ? "avx512vbmi"
           : v == FERRY__ISA_AVX512    ? "avx512"
           : v == FERRY__ISA_AVX2      ? "avx2"
                                       : "generic";
}

static dot_kernel pick(ferry_dtype t)
{
#ifdef FERRY_DOT_X86
    if (ferry__dtype_use_avx2())
        return pick_avx2(t);
#endif
    return pick_generic(t);
}

int ferry__dot_row(ferry_dtype t, const void *row, const float *x, uint64_t n, float *out)
{
    if (!ferry__dtype_readable(t))
        return FERRY_EDTYPE;
    if (n % ferry_dtype_block_elems(t) != 0)
        return FERRY_ESHAPE;
    if (!out || (n && (!row || !x)))
        return FERRY_EINVAL;
#ifdef FERRY_DOT_AVX512
    /* one row through the matvec kernels: the same sums as the row computed among others */
    if (n && ferry__dtype_isa() >= FERRY__ISA_AVX512 &&
        ferry__matvec_avx512(t, row, 1, n, 0, x, out))
        return 0;
#endif
    *out = n ? pick(t)(t, row, x, n) : 0.0f;
    return 0;
}

int ferry__matvec(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                  const float *x, float *y)
{
    if (!ferry__dtype_readable(t))
        return FERRY_EDTYPE;
    uint64_t need;
    int rc = ferry_dtype_nbytes(t, cols, &need);
    if (rc != 0)
        return rc;
    if (rows && row_bytes < need)
        return FERRY_EINVAL;
    if (rows == 0)
        return 0;
    if (!w || !y || (cols && !x))
        return FERRY_EINVAL;
    if (cols == 0) {
        memset(y, 0, rows * sizeof *y);
        return 0;
    }
#ifdef FERRY_DOT_AVX512
    if (ferry__dtype_isa() >= FERRY__ISA_AVX512 &&
        ferry__matvec_avx512(t, w, rows, cols, row_bytes, x, y))
        return 0;
#endif
    dot_kernel fn = pick(t);
    const uint8_t *p = w;
    for (uint64_t r = 0; r < rows; r++)
        y[r] = fn(t, p + r * row_bytes, x, cols);
    return 0;
}

/* ferry.h: the public matvec over whole rows (row_bytes from the dtype). */
int ferry_matvec(ferry_dtype t, const void *w, uint64_t rows, uint64_t cols, const float *x,
                 float *y)
{
    uint64_t row_bytes;
    if (!w || !x || !y)
        return FERRY_EINVAL;
    int rc = ferry_dtype_nbytes(t, cols, &row_bytes);
    if (rc)
        return rc;
    return ferry__matvec(t, w, rows, cols, row_bytes, x, y);
}
