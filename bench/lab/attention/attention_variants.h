/* The attention kernel variants tried against the product's (bench/lab/README.md: what each
 * tried and measured; bench/lab/ATTENTION_NOTES.md: the sessions), selectable by number for
 * bench/lab/bench_attention_variants.cu. Lab code: built with the benchmarks only, never part of
 * libseqflow. Same contract as sf_cuda_attention (kernels/cuda/cuda_attention.h). */
#ifndef SEQFLOW_BENCH_LAB_ATTENTION_VARIANTS_H
#define SEQFLOW_BENCH_LAB_ATTENTION_VARIANTS_H

#include <stddef.h>
#include <cuda_runtime.h>

#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_LAB_ATTENTION_VARIANTS 51
/* Variants from this one on stage K/V as bf16 in a workspace (attention_staged_variants.cu). */
#define SF_LAB_ATTENTION_FIRST_WS_VARIANT 4
/* Variants from this one on use Hopper wgmma (sm_90a, d = 64); on another device or head width
 * they run SF_LAB_ATTENTION_STAGED instead. */
#define SF_LAB_ATTENTION_FIRST_WGMMA_VARIANT 9
/* The variants whose code the product runs, as its kernels (kernels/cuda/): attention_convert.cu,
 * attention_staged.cu, attention_wgmma.cu. 1 and 6 call the product kernels; 36 keeps its own
 * copy of the general wgmma template, so it checks the product kernel bit for bit. */
#define SF_LAB_ATTENTION_CONVERT 1
#define SF_LAB_ATTENTION_STAGED 6
#define SF_LAB_ATTENTION_WGMMA 36

/* Workspace bytes every variant can use: sf_cuda_attention_workspace_bytes plus the ready flags
 * of the overlapped pre-pass (43, 44). */
size_t sf_lab_attention_workspace_bytes(const sf_attention_desc *desc);

/* Variant 0..SF_LAB_ATTENTION_VARIANTS-1 (0 is a plain float32 kernel without tensor cores)
 * with a caller-owned workspace of sf_lab_attention_workspace_bytes (variants below
 * SF_LAB_ATTENTION_FIRST_WS_VARIANT ignore it). q, k, v are of desc->qkv_type: bf16 ones are read
 * in place by variant 36 on an H100 (d = 64); elsewhere bf16 is SF_E_UNSUPPORTED. */
int sf_lab_attention_variant(int variant, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                             float *out, void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* Static one-line description, NULL past the last variant. */
const char *sf_lab_attention_variant_name(int variant);

#ifdef __cplusplus
}
#endif
#endif
