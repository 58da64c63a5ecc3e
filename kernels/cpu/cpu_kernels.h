/* Internal: the CPU implementations of the backend ops (see seqflow/backend.h for their contracts). */
#ifndef SEQFLOW_KERNELS_CPU_KERNELS_H
#define SEQFLOW_KERNELS_CPU_KERNELS_H

#include "kernels/cpu/cpu_backend.h"
#include "seqflow/backend.h"

/* Marks a plain C loop for run-time selection on x86-64: GCC compiles it twice, for the
 * portable baseline and for x86-64-v3 (AVX2, FMA), and the loader picks the copy the CPU runs
 * (an ifunc). The build does not contract a*b+c into FMA (-std=c11), so both copies compute
 * the same bits: only the speed depends on the CPU. (The exp-bound row kernels, whose vector
 * forms do round differently, are kernels/cpu/vector_rows.h.) Empty where the whole build
 * already targets AVX2 (SEQFLOW_ARCH), on other architectures and other compilers. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX2__) && defined(__ELF__)
#define SF_CPU_DISPATCH __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SF_CPU_DISPATCH
#endif

/* Worker threads an op may use: be->threads, or omp_get_max_threads() when 0. */
int sf_cpu_threads(const sf_backend *be);

int sf_cpu_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y,
                  int ldy, int accumulate);
int sf_cpu_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, float *y);
int sf_cpu_embed(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table, float *y);
int sf_cpu_swiglu(sf_backend *be, int n, int f, float *a, const float *b);
int sf_cpu_attention(sf_backend *be, const sf_attention_desc *desc, const float *q, const float *k,
                     const float *v, float *out);
int sf_cpu_memory_mix(sf_backend *be, int n, int heads, int d, int ld, const float *q, const float *M,
                      const float *z, const float *gate, float *a);
int sf_cpu_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, const float *k,
                         const float *v, float *M, float *z);
int sf_cpu_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, const float *k,
                   const float *v, float *sk, float *sv, int *count);

#endif
