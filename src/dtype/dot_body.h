/*
 * dot_body.h — the dot-product kernels of dot.c, written once and compiled twice: dot.c includes
 * this file with KFN(name) naming the variant and KATTR its target attribute (portable, then
 * AVX2+FMA+F16C where the compiler targets x86). With KERN_X86 the conversions (halves, and the
 * int8 widening, which compilers lower poorly from generic vector code) and the fused
 * multiply-add are x86 intrinsics, and q4_K / q6_K get kernels of their own; without it
 * everything is plain GNU C vector code, and the k-quants go through the f32 buffer.
 *
 * Every kernel has the signature float (ferry_dtype t, const uint8_t *row, const float *x,
 * uint64_t n): row holds n elements of type t (whole blocks), the result is sum(row[i] * x[i]).
 * Rows are read with unaligned loads (memcpy), x need only be float-aligned. Vectors live only in
 * locals (never in arguments or return values) so that the portable variant keeps the base ABI.
 */

#ifdef KERN_X86
#define KFMA(acc, a, b) ((acc) = (vf8)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(acc)))
#else
#define KFMA(acc, a, b) ((acc) += (a) * (b))
#endif

/* Sum of dense f32 X[0..n) times W[0..n), W possibly unaligned. */
static KATTR float KFN(dot_f32_raw)(const uint8_t *w, const float *x, uint64_t n)
{
    vf8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    uint64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vf8 w0, w1, w2, w3, x0, x1, x2, x3;
        memcpy(&w0, w + 4 * i, 32);
        memcpy(&w1, w + 4 * i + 32, 32);
        memcpy(&w2, w + 4 * i + 64, 32);
        memcpy(&w3, w + 4 * i + 96, 32);
        memcpy(&x0, x + i, 32);
        memcpy(&x1, x + i + 8, 32);
        memcpy(&x2, x + i + 16, 32);
        memcpy(&x3, x + i + 24, 32);
        KFMA(a0, w0, x0);
        KFMA(a1, w1, x1);
        KFMA(a2, w2, x2);
        KFMA(a3, w3, x3);
    }
    for (; i + 8 <= n; i += 8) {
        vf8 w0, x0;
        memcpy(&w0, w + 4 * i, 32);
        memcpy(&x0, x + i, 32);
        KFMA(a0, w0, x0);
    }
    a0 = (a0 + a1) + (a2 + a3);
    float s = 0.0f;
    for (; i < n; i++) {
        float v;
        memcpy(&v, w + 4 * i, 4);
        s += v * x[i];
    }
    for (int k = 0; k < 8; k++)
        s += a0[k];
    return s;
}

static KATTR float KFN(dot_f32)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    return KFN(dot_f32_raw)(w, x, n);
}

/* OUT = the vector form of ferry__h2f on eight halves held in the low 16 bits of the lanes of
 * U (a vu8). The lane masks come from arithmetic shifts of differences (the values are below
 * 2^15) rather than compares, which GCC scalarizes when it splits wide vectors for SSE2. */
#define KH2F(out, u)                                                                               \
    do {                                                                                           \
        vu8 em_ = (u) & 0x7fffu;                                                                   \
        vu8 norm_ = (em_ << 13) + ((127u - 15u) << 23);                                            \
        norm_ += (vu8)((0x7bff - (vi8)em_) >> 31) & ((128u - 16u) << 23);                          \
        vf8 subf_ = __builtin_convertvector((vi8)em_, vf8) * 0x1p-24f;                             \
        vu8 small_ = (vu8)(((vi8)em_ - 0x400) >> 31);                                              \
        (out) = (vf8)((((u) & 0x8000u) << 16) | ((vu8)subf_ & small_) | (norm_ & ~small_));        \
    } while (0)

/* Even and odd elements of the 16 floats A (0..7), B (8..15). */
#if defined(__clang__)
#define KEVEN(a, b) __builtin_shufflevector((a), (b), 0, 2, 4, 6, 8, 10, 12, 14)
#define KODD(a, b) __builtin_shufflevector((a), (b), 1, 3, 5, 7, 9, 11, 13, 15)
#else
#define KEVEN(a, b) __builtin_shuffle((a), (b), (vi8){0, 2, 4, 6, 8, 10, 12, 14})
#define KODD(a, b) __builtin_shuffle((a), (b), (vi8){1, 3, 5, 7, 9, 11, 13, 15})
#endif

static KATTR float KFN(dot_f16)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 a0 = {0}, a1 = {0};
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf8 x0, x1;
        memcpy(&x0, x + i, 32);
        memcpy(&x1, x + i + 8, 32);
#ifdef KERN_X86
        __m128i h0, h1;
        memcpy(&h0, w + 2 * i, 16);
        memcpy(&h1, w + 2 * i + 16, 16);
        KFMA(a0, (vf8)_mm256_cvtph_ps(h0), x0);
        KFMA(a1, (vf8)_mm256_cvtph_ps(h1), x1);
#else
        /* Sixteen halves as eight 32-bit lanes: even elements in the low halves, odd ones in
         * the high halves; converting them in place avoids widening, x is split to match. */
        vu8 v;
        memcpy(&v, w + 2 * i, 32);
        vu8 ev = v & 0xffffu, od = v >> 16;
        vf8 we, wo;
        KH2F(we, ev);
        KH2F(wo, od);
        KFMA(a0, we, KEVEN(x0, x1));
        KFMA(a1, wo, KODD(x0, x1));
#endif
    }
    a0 += a1;
    float s = 0.0f;
    for (; i < n; i++)
        s += ferry__h2f(ferry__ld16(w + 2 * i)) * x[i];
    for (int k = 0; k < 8; k++)
        s += a0[k];
    return s;
}

static KATTR float KFN(dot_bf16)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 a0 = {0}, a1 = {0};
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf8 x0, x1;
        memcpy(&x0, x + i, 32);
        memcpy(&x1, x + i + 8, 32);
#ifdef KERN_X86
        __m128i h0, h1;
        memcpy(&h0, w + 2 * i, 16);
        memcpy(&h1, w + 2 * i + 16, 16);
        vf8 w0 = (vf8)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16);
        vf8 w1 = (vf8)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16);
        KFMA(a0, w0, x0);
        KFMA(a1, w1, x1);
#else
        /* as in dot_f16: a bfloat16 is the high half of a float, so the odd elements are the
         * lanes with their low halves cleared and the even ones the lanes shifted up */
        vu8 v;
        memcpy(&v, w + 2 * i, 32);
        KFMA(a0, (vf8)(v << 16), KEVEN(x0, x1));
        KFMA(a1, (vf8)(v & 0xffff0000u), KODD(x0, x1));
#endif
    }
    a0 += a1;
    float s = 0.0f;
    for (; i < n; i++)
        s += ferry__bf2f(ferry__ld16(w + 2 * i)) * x[i];
    for (int k = 0; k < 8; k++)
        s += a0[k];
    return s;
}

#ifdef KERN_X86
/* Eight int8 at P as floats. */
#define KCVT_I8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define KSCALE(p) _cvtsh_ss(ferry__ld16(p))
#else
#define KSCALE(p) ferry__h2f(ferry__ld16(p))
#endif

/* q8_0: per block the 32 products q*x are summed in a vector, then scaled by d once. */
static KATTR float KFN(dot_q8_0)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 acc = {0};
    for (uint64_t b = 0; b < n / 32; b++, w += 34, x += 32) {
        float d = KSCALE(w);
        vf8 x0, x1, x2, x3;
        memcpy(&x0, x, 32);
        memcpy(&x1, x + 8, 32);
        memcpy(&x2, x + 16, 32);
        memcpy(&x3, x + 24, 32);
#ifdef KERN_X86
        vf8 s0 = (vf8)KCVT_I8(w + 2) * x0, s1 = (vf8)KCVT_I8(w + 10) * x1;
        KFMA(s0, (vf8)KCVT_I8(w + 18), x2);
        KFMA(s1, (vf8)KCVT_I8(w + 26), x3);
#else
        vsb8 q0, q1, q2, q3;
        memcpy(&q0, w + 2, 8);
        memcpy(&q1, w + 10, 8);
        memcpy(&q2, w + 18, 8);
        memcpy(&q3, w + 26, 8);
        vf8 s0 = __builtin_convertvector(q0, vf8) * x0, s1 = __builtin_convertvector(q1, vf8) * x1;
        KFMA(s0, __builtin_convertvector(q2, vf8), x2);
        KFMA(s1, __builtin_convertvector(q3, vf8), x3);
#endif
        vf8 dv = {d, d, d, d, d, d, d, d};
        KFMA(acc, s0 + s1, dv);
    }
    float s = 0.0f;
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

/* q4_0: bytes 0..7 and 8..15 of the nibbles give elements 0..7 / 8..15 (low nibbles) and
 * 16..23 / 24..31 (high nibbles); the -8 offset is applied in the integer domain. */
static KATTR float KFN(dot_q4_0)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 acc = {0};
    for (uint64_t b = 0; b < n / 32; b++, w += 18, x += 32) {
        float d = KSCALE(w);
        vf8 x0, x1, x2, x3;
        memcpy(&x0, x, 32);
        memcpy(&x1, x + 8, 32);
        memcpy(&x2, x + 16, 32);
        memcpy(&x3, x + 24, 32);
#ifdef KERN_X86
        __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));
        __m128i m4 = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
        __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), e8);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), e8);
        vf8 f0 = (vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        vf8 f1 = (vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
        vf8 f2 = (vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
        vf8 f3 = (vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
#else
        vub8 qa, qb;
        memcpy(&qa, w + 2, 8);
        memcpy(&qb, w + 10, 8);
        vf8 f0 = __builtin_convertvector((vsb8)(qa & 15) - 8, vf8);
        vf8 f1 = __builtin_convertvector((vsb8)(qb & 15) - 8, vf8);
        vf8 f2 = __builtin_convertvector((vsb8)(qa >> 4) - 8, vf8);
        vf8 f3 = __builtin_convertvector((vsb8)(qb >> 4) - 8, vf8);
#endif
        vf8 s0 = f0 * x0, s1 = f1 * x1;
        KFMA(s0, f2, x2);
        KFMA(s1, f3, x3);
        vf8 dv = {d, d, d, d, d, d, d, d};
        KFMA(acc, s0 + s1, dv);
    }
    float s = 0.0f;
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

#ifdef KERN_X86
/* Bytes 0..7, 8..15 of the 128-bit V as eight floats each (unsigned or signed bytes). */
#define KU8_LO(v) ((vf8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)))
#define KU8_HI(v) ((vf8)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64((v), (v)))))
#define KI8_LO(v) ((vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)))
#define KI8_HI(v) ((vf8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64((v), (v)))))

/* Sum over 32 elements of unsigned bytes Q (in a 256-bit vector) times X[0..32), and the sum of
 * those X, into *QX and *XS. */
#define KDOT32_U8(q, xp, qx, xs)                                                                   \
    do {                                                                                           \
        __m128i q0_ = _mm256_castsi256_si128(q), q1_ = _mm256_extracti128_si256((q), 1);           \
        vf8 x0_, x1_, x2_, x3_;                                                                    \
        memcpy(&x0_, (xp), 32);                                                                    \
        memcpy(&x1_, (xp) + 8, 32);                                                                \
        memcpy(&x2_, (xp) + 16, 32);                                                               \
        memcpy(&x3_, (xp) + 24, 32);                                                               \
        vf8 s0_ = KU8_LO(q0_) * x0_, s1_ = KU8_HI(q0_) * x1_;                                      \
        KFMA(s0_, KU8_LO(q1_), x2_);                                                               \
        KFMA(s1_, KU8_HI(q1_), x3_);                                                               \
        (qx) = s0_ + s1_;                                                                          \
        (xs) = (x0_ + x1_) + (x2_ + x3_);                                                          \
    } while (0)

/* q4_K: per 32-element sub-block j, sum(x * (d*sc_j*q - dmin*m_j)) =
 * d*sc_j * sum(q*x) - dmin*m_j * sum(x). */
static KATTR float KFN(dot_q4_k)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 acc = {0}, accm = {0};
    const __m256i m4 = _mm256_set1_epi8(15);
    for (uint64_t b = 0; b < n / 256; b++, w += 144, x += 256) {
        float d = KSCALE(w), dmin = KSCALE(w + 2);
        for (int c = 0; c < 4; c++) {
            int sc1, m1, sc2, m2;
            ferry__k4_scale_min(w + 4, 2 * c, &sc1, &m1);
            ferry__k4_scale_min(w + 4, 2 * c + 1, &sc2, &m2);
            __m256i q = _mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            vf8 qx, xs;
            float f;
            KDOT32_U8(lo, x + 64 * c, qx, xs);
            f = d * (float)sc1;
            vf8 d1 = {f, f, f, f, f, f, f, f};
            f = dmin * (float)m1;
            vf8 o1 = {f, f, f, f, f, f, f, f};
            KFMA(acc, qx, d1);
            KFMA(accm, xs, o1);
            KDOT32_U8(hi, x + 64 * c + 32, qx, xs);
            f = d * (float)sc2;
            vf8 d2 = {f, f, f, f, f, f, f, f};
            f = dmin * (float)m2;
            vf8 o2 = {f, f, f, f, f, f, f, f};
            KFMA(acc, qx, d2);
            KFMA(accm, xs, o2);
        }
    }
    acc -= accm;
    float s = 0.0f;
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

/* q6_K: the six-bit quants of each 128-element half are rebuilt 32 at a time from ql nibbles and
 * qh bit pairs, offset by -32 as signed bytes; each 16 elements have their own int8 scale. */
static KATTR float KFN(dot_q6_k)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    (void)t;
    vf8 acc = {0};
    const __m256i o32 = _mm256_set1_epi8(32);
    for (uint64_t b = 0; b < n / 256; b++, w += 210, x += 256) {
        float d = KSCALE(w + 208);
        const int8_t *sc = (const int8_t *)(w + 192);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            ferry__q6k_quants_avx2(w, h, q);
            for (int g = 0; g < 4; g++) {
                __m256i qs = _mm256_sub_epi8(q[g], o32);
                __m128i a = _mm256_castsi256_si128(qs), bb = _mm256_extracti128_si256(qs, 1);
                const float *xp = x + 128 * h + 32 * g;
                vf8 x0, x1, x2, x3;
                memcpy(&x0, xp, 32);
                memcpy(&x1, xp + 8, 32);
                memcpy(&x2, xp + 16, 32);
                memcpy(&x3, xp + 24, 32);
                vf8 s0 = KI8_LO(a) * x0, s1 = KI8_LO(bb) * x2;
                KFMA(s0, KI8_HI(a), x1);
                KFMA(s1, KI8_HI(bb), x3);
                float f0 = d * (float)sc[8 * h + 2 * g], f1 = d * (float)sc[8 * h + 2 * g + 1];
                vf8 d0 = {f0, f0, f0, f0, f0, f0, f0, f0}, d1 = {f1, f1, f1, f1, f1, f1, f1, f1};
                KFMA(acc, s0, d0);
                KFMA(acc, s1, d1);
            }
        }
    }
    float s = 0.0f;
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}
#undef KU8_LO
#undef KU8_HI
#undef KI8_LO
#undef KI8_HI
#undef KDOT32_U8
#endif /* KERN_X86 */

/* Every other readable type: dequantize a few blocks at a time into a stack buffer (a whole
 * number of blocks of any type: 1, 32 and 256 all divide it) and take the f32 dot product. */
#define KCHUNK 1024
static KATTR float KFN(dot_via_f32)(ferry_dtype t, const uint8_t *w, const float *x, uint64_t n)
{
    float buf[KCHUNK];
    uint64_t be = ferry_dtype_block_elems(t), bb = ferry_dtype_block_bytes(t);
    float s = 0.0f;
    for (uint64_t i = 0; i < n; i += KCHUNK) {
        uint64_t c = FERRY__MIN(n - i, (uint64_t)KCHUNK);
        if (ferry__to_f32(t, w + i / be * bb, buf, c) != 0)
            return 0.0f; /* unreachable: the caller checked t and n */
        s += KFN(dot_f32_raw)((const uint8_t *)buf, x + i, c);
    }
    return s;
}
#undef KCHUNK

static dot_kernel KFN(pick)(ferry_dtype t)
{
    switch (t) {
    case FERRY_DTYPE_F32: return KFN(dot_f32);
    case FERRY_DTYPE_F16: return KFN(dot_f16);
    case FERRY_DTYPE_BF16: return KFN(dot_bf16);
    case FERRY_DTYPE_Q8_0: return KFN(dot_q8_0);
    case FERRY_DTYPE_Q4_0: return KFN(dot_q4_0);
#ifdef KERN_X86
    case FERRY_DTYPE_Q4_K: return KFN(dot_q4_k);
    case FERRY_DTYPE_Q6_K: return KFN(dot_q6_k);
#endif
    default: return KFN(dot_via_f32);
    }
}

#undef KFMA
#undef KH2F
#undef KEVEN
#undef KODD
#undef KSCALE
#ifdef KCVT_I8
#undef KCVT_I8
#endif
