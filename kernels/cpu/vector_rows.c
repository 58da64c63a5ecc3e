/* The row kernels of vector_rows.h: the baseline forms in plain C, the AVX2 + FMA forms in
 * functions compiled for those instructions (SF_TARGET_AVX2_FMA) whatever the build's -march,
 * and the choice between them. Every row ends in a masked tail, not a scalar loop, so that
 * the AVX2 form of a row never mixes in sf_fast_expf's roundf call. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/vector_rows.h"
#include "seqflow/error.h"

/* ---- the choice ------------------------------------------------------------------------ */

static int cpu_has_avx2_fma(void)
{
#if defined(__AVX2__) && defined(__FMA__)
    return 1; /* the whole build needs them already */
#elif defined(SF_HAVE_AVX2_FMA)
    /* libgcc's check includes the OS's support of the YMM state (XGETBV) */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* SF_CPU_KERNELS_AUTO until forced; read once per kernel call */
static _Atomic int forced = SF_CPU_KERNELS_AUTO;

int sf_cpu_kernels_available(sf_cpu_kernel_set set)
{
    return set == SF_CPU_KERNELS_AUTO || set == SF_CPU_KERNELS_BASELINE || (set == SF_CPU_KERNELS_AVX2 && cpu_has_avx2_fma());
}

sf_cpu_kernel_set sf_cpu_kernels(void)
{
    int f = atomic_load_explicit(&forced, memory_order_relaxed);
    if (f != SF_CPU_KERNELS_AUTO) return (sf_cpu_kernel_set)f;
    return cpu_has_avx2_fma() ? SF_CPU_KERNELS_AVX2 : SF_CPU_KERNELS_BASELINE;
}

const char *sf_cpu_kernels_name(sf_cpu_kernel_set set)
{
    return set == SF_CPU_KERNELS_AVX2 ? "avx2" : set == SF_CPU_KERNELS_BASELINE ? "baseline" : "auto";
}

int sf_cpu_kernels_force(sf_cpu_kernel_set set)
{
    if (!sf_cpu_kernels_available(set))
        return sf_error(SF_E_UNSUPPORTED, "cpu kernels '%s': this %s", sf_cpu_kernels_name(set),
#ifdef SF_HAVE_AVX2_FMA
                        "CPU has no AVX2 and FMA"
#else
                        "build is not for x86-64"
#endif
        );
    atomic_store_explicit(&forced, (int)set, memory_order_relaxed);
    return SF_OK;
}

/* ---- baseline ---------------------------------------------------------------------------- */

static inline float sigma1(float x) { return x > 0 ? x + 1.0f : sf_fast_expf(x); }

static float softmax_row(float *s, int limit, int tk, float *m, float *l)
{
    float mx = *m;
    for (int b = 0; b < limit; b++) mx = s[b] > mx ? s[b] : mx;
    float sum = 0;
    for (int b = 0; b < limit; b++) {
        float p = sf_fast_expf(s[b] - mx);
        s[b] = p;
        sum += p;
    }
    for (int b = limit; b < tk; b++) s[b] = 0;
    /* *m is -inf before the row's first key: exp(-inf) = 0 and l = 0 anyway */
    float corr = sf_fast_expf(*m - mx);
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

static void softmax_tile(float *s, int ld, int tq, int tk, int first, float *m, float *l, float *o, int d)
{
    for (int a = 0; a < tq; a++) {
        float *srow = s + (size_t)a * ld;
        int limit = first + a + 1 < tk ? first + a + 1 : tk;
        if (limit <= 0) { /* nothing of this tile for this row: p = 0, state unchanged */
            memset(srow, 0, (size_t)tk * sizeof *srow);
            continue;
        }
        float corr = softmax_row(srow, limit, tk, &m[a], &l[a]);
        if (corr != 1.0f) {
            float *orow = o + (size_t)a * d;
            for (int e = 0; e < d; e++) orow[e] *= corr;
        }
    }
}

static void merge_tile(int rows, int d, const int *pos, const float *o, const float *tm, const float *tl, float *acc,
                       float *m, float *l)
{
    for (int a = 0; a < rows; a++) {
        if (tl[a] == 0) continue;
        int i = pos[a];
        float *arow = acc + (size_t)i * d;
        const float *orow = o + (size_t)a * d;
        if (l[i] == 0) {
            memcpy(arow, orow, (size_t)d * sizeof *arow);
            m[i] = tm[a];
            l[i] = tl[a];
            continue;
        }
        float mn = m[i] > tm[a] ? m[i] : tm[a];
        float ca = sf_fast_expf(m[i] - mn), cb = sf_fast_expf(tm[a] - mn);
        for (int e = 0; e < d; e++) arow[e] = arow[e] * ca + orow[e] * cb;
        l[i] = l[i] * ca + tl[a] * cb;
        m[i] = mn;
    }
}

static void sigma_rows(int n, int width, const float *src, int lds, float *dst, int ldd)
{
    for (int i = 0; i < n; i++)
        for (int e = 0; e < width; e++) dst[(size_t)i * ldd + e] = sigma1(src[(size_t)i * lds + e]);
}

static void swiglu_rows(float *a, const float *b, size_t count)
{
    for (size_t i = 0; i < count; i++) a[i] = a[i] / (1.0f + sf_fast_expf(-a[i])) * b[i];
}

/* ---- AVX2 + FMA -------------------------------------------------------------------------- */

#ifdef SF_HAVE_AVX2_FMA
/* lanes [0, count) set, count in [0, 8] */
SF_TARGET_AVX2_FMA static inline __m256i lanes_below(int count)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SF_TARGET_AVX2_FMA static inline float hmax8(__m256 v)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

SF_TARGET_AVX2_FMA static inline float hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

SF_TARGET_AVX2_FMA static inline float exp1_avx2(float x) { return _mm256_cvtss_f32(sf_fast_exp8(_mm256_set1_ps(x))); }

/* as softmax_row; the max keeps the scalar form's rule (s[b] > mx ? s[b] : mx: a NaN logit is
 * passed over by the max and comes out of its exp as NaN) */
SF_TARGET_AVX2_FMA static float softmax_row_avx2(float *s, int limit, int tk, float *m, float *l)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vm = _mm256_set1_ps(*m);
    int b = 0;
    for (; b + 8 <= limit; b += 8) vm = _mm256_max_ps(_mm256_loadu_ps(s + b), vm);
    const __m256i tail = lanes_below(limit - b);
    if (b < limit) vm = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(s + b, tail), _mm256_castsi256_ps(tail)), vm);
    const float mx = hmax8(vm);
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    for (b = 0; b + 8 <= limit; b += 8) {
        __m256 p = sf_fast_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + b), vmx));
        _mm256_storeu_ps(s + b, p);
        acc = _mm256_add_ps(acc, p);
    }
    if (b < limit) {
        __m256 p = sf_fast_exp8(_mm256_sub_ps(_mm256_maskload_ps(s + b, tail), vmx));
        p = _mm256_and_ps(p, _mm256_castsi256_ps(tail));
        _mm256_maskstore_ps(s + b, tail, p);
        acc = _mm256_add_ps(acc, p);
    }
    for (b = limit; b < tk; b++) s[b] = 0;
    float corr = exp1_avx2(*m - mx);
    *l = *l * corr + hsum8(acc);
    *m = mx;
    return corr;
}

SF_TARGET_AVX2_FMA static void softmax_tile_avx2(float *s, int ld, int tq, int tk, int first, float *m, float *l,
                                                 float *o, int d)
{
    for (int a = 0; a < tq; a++) {
        float *srow = s + (size_t)a * ld;
        int limit = first + a + 1 < tk ? first + a + 1 : tk;
        if (limit <= 0) {
            memset(srow, 0, (size_t)tk * sizeof *srow);
            continue;
        }
        float corr = softmax_row_avx2(srow, limit, tk, &m[a], &l[a]);
        if (corr != 1.0f) {
            float *orow = o + (size_t)a * d;
            for (int e = 0; e < d; e++) orow[e] *= corr;
        }
    }
}

SF_TARGET_AVX2_FMA static void merge_tile_avx2(int rows, int d, const int *pos, const float *o, const float *tm,
                                               const float *tl, float *acc, float *m, float *l)
{
    for (int a = 0; a < rows; a++) {
        if (tl[a] == 0) continue;
        int i = pos[a];
        float *arow = acc + (size_t)i * d;
        const float *orow = o + (size_t)a * d;
        if (l[i] == 0) {
            memcpy(arow, orow, (size_t)d * sizeof *arow);
            m[i] = tm[a];
            l[i] = tl[a];
            continue;
        }
        float mn = m[i] > tm[a] ? m[i] : tm[a];
        /* both factors from one exp8 */
        float c[8];
        _mm256_storeu_ps(c, sf_fast_exp8(_mm256_setr_ps(m[i] - mn, tm[a] - mn, 0, 0, 0, 0, 0, 0)));
        const float ca = c[0], cb = c[1];
        const __m256 va = _mm256_set1_ps(ca), vb = _mm256_set1_ps(cb);
        int e = 0;
        for (; e + 8 <= d; e += 8)
            _mm256_storeu_ps(arow + e, _mm256_fmadd_ps(_mm256_loadu_ps(arow + e), va,
                                                       _mm256_mul_ps(_mm256_loadu_ps(orow + e), vb)));
        for (; e < d; e++) arow[e] = arow[e] * ca + orow[e] * cb;
        l[i] = l[i] * ca + tl[a] * cb;
        m[i] = mn;
    }
}

SF_TARGET_AVX2_FMA static inline __m256 sigma8(__m256 x)
{
    const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ); /* false for NaN */
    return _mm256_blendv_ps(sf_fast_exp8(x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)), pos);
}

SF_TARGET_AVX2_FMA static void sigma_rows_avx2(int n, int width, const float *src, int lds, float *dst, int ldd)
{
    const __m256i tail = lanes_below(width % 8);
    for (int i = 0; i < n; i++) {
        const float *x = src + (size_t)i * lds;
        float *y = dst + (size_t)i * ldd;
        int e = 0;
        for (; e + 8 <= width; e += 8) _mm256_storeu_ps(y + e, sigma8(_mm256_loadu_ps(x + e)));
        if (e < width) _mm256_maskstore_ps(y + e, tail, sigma8(_mm256_maskload_ps(x + e, tail)));
    }
}

SF_TARGET_AVX2_FMA static inline __m256 swiglu8(__m256 a, __m256 b)
{
    const __m256 e = sf_fast_exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));
    return _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), b);
}

SF_TARGET_AVX2_FMA static void swiglu_rows_avx2(float *a, const float *b, size_t count)
{
    size_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(a + i, swiglu8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i < count) {
        const __m256i tail = lanes_below((int)(count - i));
        _mm256_maskstore_ps(a + i, tail, swiglu8(_mm256_maskload_ps(a + i, tail), _mm256_maskload_ps(b + i, tail)));
    }
}
#endif

/* ---- the entry points -------------------------------------------------------------------- */

/* the AVX2 form where chosen, else the baseline; the choice is one relaxed load */
#ifdef SF_HAVE_AVX2_FMA
#define AVX2_CHOSEN() (sf_cpu_kernels() == SF_CPU_KERNELS_AVX2)
#else
#define AVX2_CHOSEN() 0
#define softmax_tile_avx2 softmax_tile
#define merge_tile_avx2 merge_tile
#define sigma_rows_avx2 sigma_rows
#define swiglu_rows_avx2 swiglu_rows
#endif

void sf_cpu_softmax_tile(float *s, int ld, int tq, int tk, int first, float *m, float *l, float *o, int d)
{
    if (AVX2_CHOSEN()) softmax_tile_avx2(s, ld, tq, tk, first, m, l, o, d);
    else softmax_tile(s, ld, tq, tk, first, m, l, o, d);
}

void sf_cpu_merge_tile(int rows, int d, const int *pos, const float *o, const float *tm, const float *tl, float *acc,
                       float *m, float *l)
{
    if (AVX2_CHOSEN()) merge_tile_avx2(rows, d, pos, o, tm, tl, acc, m, l);
    else merge_tile(rows, d, pos, o, tm, tl, acc, m, l);
}

void sf_cpu_sigma_rows(int n, int width, const float *src, int lds, float *dst, int ldd)
{
    if (AVX2_CHOSEN()) sigma_rows_avx2(n, width, src, lds, dst, ldd);
    else sigma_rows(n, width, src, lds, dst, ldd);
}

void sf_cpu_swiglu_rows(float *a, const float *b, size_t count)
{
    if (AVX2_CHOSEN()) swiglu_rows_avx2(a, b, count);
    else swiglu_rows(a, b, count);
}
