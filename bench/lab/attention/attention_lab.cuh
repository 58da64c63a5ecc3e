/* What the lab's attention variant files share among themselves (bench/lab/attention/; the
 * entry points are in attention_variants.h): the overlapped pre-pass's ready flags, and each
 * family's launcher by variant number. Built on the product's pieces (kernels/cuda/
 * attention_staging.h). C++ (CUDA) only. */
#ifndef SEQFLOW_BENCH_LAB_ATTENTION_LAB_CUH
#define SEQFLOW_BENCH_LAB_ATTENTION_LAB_CUH

#include <stddef.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/cuda_attention.h"

/* Rows of kb/vb (all heads) the overlapped pre-pass stages and flags together. */
#define SF_ATT_CHUNK_ROWS 64

/* att_staged, plus the overlapped pre-pass's flags (att_stage_workspace_overlapped), else NULL:
 * ready[c] != 0 once rows [c, c+1) * SF_ATT_CHUNK_ROWS of kb/vb (every head) are staged; the
 * globals' chunks follow at ready[nchunks]. */
struct lab_staged : att_staged {
    const unsigned *ready = nullptr;
    int nchunks = 0;
};

/* Bytes of the ready flags for `rows` rows and g global tokens (after the product's workspace
 * layout, att_workspace_need). */
size_t lab_ready_bytes(int rows, int g);

/* As att_stage_workspace (streaming reads, d = 64), but the main kernel may run alongside it:
 * zeroes the ready flags in `ws`, then stages K/V in chunks of SF_ATT_CHUNK_ROWS rows, last rows
 * first (the heaviest blocks' first keys), then the globals, each block raising its chunk's flag.
 * The kernel triggers its dependents at once, so a main kernel launched next with programmatic
 * stream serialization starts while it runs and must wait on staged->ready before reading. `ws`
 * holds att_workspace_need(n, G, ...) + lab_ready_bytes(n, G) bytes. */
int att_stage_workspace_overlapped(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                                   lab_staged *staged, cudaStream_t stream);

/* Whether the wgmma variants run desc on the current device (compute capability 9.0, d = 64,
 * their sm_90a image present). */
bool att_wgmma_usable(const sf_attention_desc *desc);

/* The wgmma variants (attention_wgmma_variants.cu), float32 q/k/v; the workspace is validated. */
int att_wgmma_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q, const float *k,
                     const float *v, float *out, unsigned char *ws, cudaStream_t stream);

/* The same on bf16 q, k, v ([n, desc->ld], K/V read in place): variant 36 (the product kernel's
 * lab twin) and 45-50, SF_E_UNSUPPORTED for others; mix non-NULL fuses the memory mix (36). */
int att_wgmma_launch_bf16(int variant, const sf_attention_desc *desc, const att_branches &br, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, float *out, unsigned char *ws,
                          cudaStream_t stream, const sf_cuda_attention_mix *mix = nullptr);

/* The warp-specialized variants (attention_wgmma_warpspec.cu, 20-28). */
int att_wgmma_ws_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                        const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream);

/* The convert-kernel variants without a workspace (attention_fused_variants.cu, 0-3). */
int lab_attention_fused(int variant, const sf_attention_desc *desc, const float *q, const float *k, const float *v,
                        float *out, cudaStream_t stream);

#endif
