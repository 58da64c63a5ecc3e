/* What the workspace kernels of sf_cuda_attention_bf16 share (attention_bf16_ws.cu, which
 * defines these, and attention_wgmma.cu): the bf16 K/V pre-pass into the workspace, the block
 * size T, and the heaviest-first order of (position block, head) items. C++ only. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_STAGING_H
#define SEQFLOW_KERNELS_CUDA_ATTENTION_STAGING_H

#include <stddef.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/backend.h"

#define SF_ATT_ORDER_MAX 1024 /* position blocks the heaviest-first order covers */

struct att_order {
    int count; /* 0: plain order, last positions first */
    unsigned short block[SF_ATT_ORDER_MAX];
};

/* Where the kernels read bf16 K/V: row i of head h of kb/vb is at kb + h*khead + i*krow. The
 * pre-pass's copies are head-major [head][row][d] (khead = n*d, krow = d); bf16 activations are
 * read where qkv wrote them, [n, ld] (khead = d, krow = ld: only the wgmma kernels of
 * attention_wgmma.cu read these). gkb/gvb (desc->n_global rows) are always head-major copies. */
struct att_staged {
    const __nv_bfloat16 *kb, *vb, *gkb, *gvb;
    size_t khead, krow;
    /* overlapped pre-pass only (att_stage_workspace_overlapped), else NULL: ready[c] != 0 once
     * rows [c, c+1) * SF_ATT_CHUNK_ROWS of kb/vb (every head) are staged; the globals' chunks
     * follow at ready[nchunks] */
    const unsigned *ready;
    int nchunks;
};

/* Rows of kb/vb (all heads) the overlapped pre-pass stages and flags together. */
#define SF_ATT_CHUNK_ROWS 64

/* Checks the alignment the staged kernels need (SF_E_UNSUPPORTED otherwise, nothing launched). */
int att_check_staged_inputs(const sf_attention_desc *desc, const float *q, const float *k, const float *v);

/* Positions per block for query tiles of `bm` dilated rows: a multiple of every dilation that
 * holds one full tile of the most dilated branch. SF_E_UNSUPPORTED for dilations too varied. */
int att_block_positions(const att_branches &br, int bm, long *T);

/* Launches the pre-pass on `stream`: K, V and the global tokens to bf16 in `ws` (laid out as
 * sf_cuda_attention_workspace_bytes says); fills *staged with where they are. `streaming`
 * reads the float32 inputs as evict-first in L2. */
int att_stage_workspace(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                        att_staged *staged, cudaStream_t stream, bool streaming = false);

/* For bf16 k, v ([n, desc->ld], read in place): stages only the global tokens into `ws`. */
int att_stage_globals(const sf_attention_desc *desc, const __nv_bfloat16 *k, const __nv_bfloat16 *v, unsigned char *ws,
                      att_staged *staged, cudaStream_t stream, bool streaming);

/* As att_stage_workspace (streaming reads), but the main kernel may run alongside it: zeroes
 * the ready flags in `ws`, then stages K/V in chunks of SF_ATT_CHUNK_ROWS rows, last rows first
 * (the heaviest blocks' first keys), then the globals, each block raising its chunk's flag. The
 * kernel triggers its dependents at once, so a main kernel launched next with programmatic
 * stream serialization starts while it runs and must wait on staged->ready before reading. */
int att_stage_workspace_overlapped(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                                   att_staged *staged, cudaStream_t stream);

/* Orders the position blocks of T positions by their query-key pairs, heaviest first. */
void att_heaviest_first(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, att_order *ord);

/* The Hopper wgmma kernels (attention_wgmma.cu, variants >= SF_CUDA_ATTENTION_FIRST_WGMMA_VARIANT):
 * whether they can run this desc on the current device (compute capability 9.0, d = 64), and
 * their launcher (workspace already validated). */
bool att_wgmma_usable(const sf_attention_desc *desc);
int att_wgmma_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                     const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream);
/* The same for bf16 q, k, v ([n, desc->ld] as qkv wrote them, K/V read in place): variant 36
 * (the default) only; SF_E_UNSUPPORTED for others, and for unaligned rows (nothing launched). */
int att_check_bf16_inputs(const sf_attention_desc *desc, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v);
/* mix non-NULL: variant 36 with the memory mix fused (cuda_attention.h, sf_cuda_attention_mix_ws) */
int att_wgmma_launch_bf16(int variant, const sf_attention_desc *desc, const att_branches &br, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, float *out, unsigned char *ws,
                          cudaStream_t stream, const sf_cuda_attention_mix *mix = nullptr);

#endif
