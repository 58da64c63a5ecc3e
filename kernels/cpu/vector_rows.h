/* Internal: the CPU's exp-bound row kernels (attention's online softmax and merge, the memory's
 * sigma, SwiGLU) in two forms, picked at run time for the whole process:
 *
 *   baseline  plain C on sf_fast_expf, for any CPU of the architecture (arm64 too);
 *   avx2      AVX2 + FMA intrinsics on sf_fast_exp8, eight lanes, x86-64 only, taken when the
 *             CPU has both (and always in a build whose -march already has them).
 *
 * The two forms differ in the last bits (FMA rounding, the order of the row sums, exp's
 * rounding of k ln2 to even rather than away from zero): the output of a whole run stays within
 * 1e-5 relative (L2 per row) between them. On one CPU the choice never changes, so a run gives
 * the same bits every time, whatever the thread count. Callers pass whole rows or tiles so that
 * the choice is read once per call, not per element. */
#ifndef SEQFLOW_KERNELS_CPU_VECTOR_ROWS_H
#define SEQFLOW_KERNELS_CPU_VECTOR_ROWS_H

#include <stddef.h>

typedef enum sf_cpu_kernel_set {
    SF_CPU_KERNELS_AUTO = -1,    /* (for sf_cpu_kernels_force) the CPU's best */
    SF_CPU_KERNELS_BASELINE = 0, /* plain C */
    SF_CPU_KERNELS_AVX2 = 1,     /* AVX2 + FMA */
} sf_cpu_kernel_set;

/* The set the row kernels below run: the forced one, else the best this CPU has. */
sf_cpu_kernel_set sf_cpu_kernels(void);

/* "baseline" or "avx2". */
const char *sf_cpu_kernels_name(sf_cpu_kernel_set set);

/* Whether this build and CPU can run `set` (BASELINE and AUTO always). */
int sf_cpu_kernels_available(sf_cpu_kernel_set set);

/* Makes every later call of the row kernels in this process use `set` (AUTO: back to the CPU's
 * best). For tests and benchmarks comparing the forms on one machine; call it while no kernel
 * runs. Returns SF_OK, or SF_E_UNSUPPORTED (nothing changed) when the CPU or build lacks it. */
int sf_cpu_kernels_force(sf_cpu_kernel_set set);

/* One online-softmax step of a score tile: s holds tq rows of scaled logits, ld floats apart,
 * of which row a sees the first limit(a) = min(first + a + 1, tk) keys (every tk when
 * first >= tk; the causal diagonal otherwise), the rest of [0, tk) being masked. For each row
 * with limit(a) > 0: updates its running max m[a] and sum l[a], turns the row into
 * probabilities (0 where masked) and multiplies row a of o ([tq, d]) by exp(old m - new m).
 * A row with limit(a) <= 0 becomes all 0 and keeps its m, l and o. m starts at -inf, l at 0. */
void sf_cpu_softmax_tile(float *s, int ld, int tq, int tk, int first, float *m, float *l, float *o, int d);

/* Merges a query tile's partial softmax (o [rows, d] unnormalized, its max tm and sum tl per
 * row) into a head's per-position accumulators (acc [.., d], m, l) at positions pos[a]: by
 * their log-sum-exp, a position with l == 0 taking the tile's as they are. Rows with tl == 0
 * are skipped. */
void sf_cpu_merge_tile(int rows, int d, const int *pos, const float *o, const float *tm, const float *tl, float *acc,
                       float *m, float *l);

/* dst[i*ldd + e] = sigma(src[i*lds + e]) = ELU(x) + 1 (x + 1 above 0, e^x otherwise) for
 * i < n, e < width. dst may be src (ldd == lds). NaN stays NaN. */
void sf_cpu_sigma_rows(int n, int width, const float *src, int lds, float *dst, int ldd);

/* a[i] = silu(a[i]) * b[i] = a[i] / (1 + e^-a[i]) * b[i] for i < count. */
void sf_cpu_swiglu_rows(float *a, const float *b, size_t count);

#endif
