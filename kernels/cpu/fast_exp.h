/* expf that the compiler can vectorize (glibc's expf is a library call it will not): Cody-Waite
 * range reduction x = k ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r. Relative
 * error below 3e-7 on [-87, 88]; returns 0 below -87 (so exp(-inf) = 0, as softmax needs),
 * e^88 above 88 and NaN for NaN. The clamp also keeps the exponent in range before it is
 * converted to an integer: converting NaN or a huge float is undefined behaviour in C.
 * sf_fast_exp8 is the same function on eight lanes of AVX2 and FMA, for x86-64 code built for
 * those (-march=x86-64-v3) or marked SF_TARGET_AVX2_FMA and run only where the CPU has them
 * (kernels/cpu/vector_rows.h); it rounds k to even where sf_fast_expf rounds ties away from
 * zero, and its FMAs round once, so the two differ in the last bits. */
#ifndef SEQFLOW_KERNELS_CPU_FAST_EXP_H
#define SEQFLOW_KERNELS_CPU_FAST_EXP_H

#include <stdint.h>
#include <string.h>
/* SF_HAVE_AVX2_FMA: this build has the AVX2 + FMA forms (x86-64 with GCC or Clang, whose
 * target attribute compiles them whatever -march says). SF_TARGET_AVX2_FMA marks a function
 * that may use them: it must run only where sf_cpu_kernels_available(SF_CPU_KERNELS_AVX2). */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_HAVE_AVX2_FMA 1
#define SF_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#endif

#define SF_EXP_LO (-87.0f)
#define SF_EXP_HI 88.0f
#define SF_EXP_LOG2E 1.44269504088896341f
#define SF_EXP_LN2_HI 0.693359375f
#define SF_EXP_LN2_LO (-2.12194440e-4f)
#define SF_EXP_C2 0.5f
#define SF_EXP_C3 0.166666672f
#define SF_EXP_C4 4.16666716e-2f
#define SF_EXP_C5 8.33307914e-3f
#define SF_EXP_C6 1.38896e-3f

static inline float sf_fast_expf(float x)
{
    /* written so that NaN fails both tests and lands on SF_EXP_LO: every input reaches the
     * conversion below as a small integer-valued float */
    float clamped = x >= SF_EXP_LO ? (x <= SF_EXP_HI ? x : SF_EXP_HI) : SF_EXP_LO;
    float kf = __builtin_roundf(clamped * SF_EXP_LOG2E);
    float r = clamped - kf * SF_EXP_LN2_HI;
    r = r - kf * SF_EXP_LN2_LO;
    float p = 1.0f + r * (1.0f + r * (SF_EXP_C2 + r * (SF_EXP_C3 + r * (SF_EXP_C4 + r * (SF_EXP_C5 + r * SF_EXP_C6)))));
    uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23; /* kf in [-126, 127] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    if (x != x) return x; /* NaN stays NaN, so that a finiteness check downstream sees it */
    return x < SF_EXP_LO ? 0.0f : y;
}

#ifdef SF_HAVE_AVX2_FMA
SF_TARGET_AVX2_FMA static inline __m256 sf_fast_exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(SF_EXP_LO);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ); /* also true for -inf */
    __m256 c = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(SF_EXP_HI));
    __m256 kf = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(SF_EXP_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(SF_EXP_LN2_HI), c);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(SF_EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(SF_EXP_C6), r, _mm256_set1_ps(SF_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SF_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SF_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SF_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
    /* max/min above turned NaN into SF_EXP_LO; give NaN back, as the scalar form does */
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

#endif
