/* The kernel variants behind sf_cuda_attention_bf16, selectable for benchmarks and tests
 * (bench/bench_cuda_attention.cu; bench/ATTENTION_NOTES.md says what each measured). */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_BF16_VARIANTS_H
#define SEQFLOW_KERNELS_CUDA_ATTENTION_BF16_VARIANTS_H

#include <stddef.h>
#include <cuda_runtime.h>

#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_CUDA_ATTENTION_VARIANTS 45
/* Variants from this one on stage K/V as bf16 in a workspace (attention_bf16_ws.cu). */
#define SF_CUDA_ATTENTION_FIRST_WS_VARIANT 4
/* Variants from this one on use Hopper wgmma (attention_wgmma.cu, sm_90a, d = 64); on another
 * device or head width they run SF_CUDA_ATTENTION_PORTABLE_VARIANT instead. */
#define SF_CUDA_ATTENTION_FIRST_WGMMA_VARIANT 9
#define SF_CUDA_ATTENTION_PORTABLE_VARIANT 6
/* What sf_cuda_attention_bf16_ws runs given a workspace, and what runs without one. */
#define SF_CUDA_ATTENTION_DEFAULT_VARIANT 36
#define SF_CUDA_ATTENTION_NO_WS_VARIANT 1

/* Same contract as sf_cuda_attention_bf16 with variant 0..SF_CUDA_ATTENTION_VARIANTS-1
 * (0 is a plain float32 kernel without tensor cores). The workspace variants take theirs from
 * cudaMallocAsync on `stream` for the call (convenient for tests; time them through _ws). */
int sf_cuda_attention_bf16_variant(int variant, const sf_attention_desc *desc, const float *q, const float *k,
                                   const float *v, float *out, cudaStream_t stream);
/* Same with a caller-owned workspace as for sf_cuda_attention_bf16_ws; variants below
 * SF_CUDA_ATTENTION_FIRST_WS_VARIANT ignore it. q, k, v are of desc->qkv_type: bf16 ones are read
 * in place by variant 36 on an H100 (d = 64); elsewhere bf16 is SF_E_UNSUPPORTED (nothing
 * launched; the backend then widens them to float32 first). */
int sf_cuda_attention_bf16_variant_ws(int variant, const sf_attention_desc *desc, const void *q, const void *k,
                                      const void *v, float *out, void *workspace, size_t workspace_bytes,
                                      cudaStream_t stream);
/* Static one-line description, NULL past the last variant. */
const char *sf_cuda_attention_bf16_variant_name(int variant);

#ifdef __cplusplus
}
#endif
#endif
