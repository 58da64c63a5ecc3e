/* What the workspace attention kernels share (attention_staged.cu defines these, attention_wgmma.cu
 * and the lab's variants use them): the bf16 K/V pre-pass into the workspace, the workspace's
 * layout and checks, the block size T, and the heaviest-first order of (position block, head)
 * items. C++ only. */
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
 * read where qkv wrote them, [n, ld] (khead = d, krow = ld: only the wgmma kernel reads these).
 * gkb/gvb (desc->n_global rows) are always head-major copies. */
struct att_staged {
    const __nv_bfloat16 *kb, *vb, *gkb, *gvb;
    size_t khead, krow;
};

/* Bytes of one bf16 copy of `rows` rows of `heads` heads of width d, rounded up to 256 so that
 * the next part of the workspace stays aligned. */
size_t att_kv_bytes(int rows, int heads, int d);

/* Workspace bytes for K and V of `rows` rows and g global tokens: kb, vb, gkb, gvb in that order,
 * each att_kv_bytes long. */
size_t att_workspace_need(int rows, int g, int heads, int d);

/* What every workspace launch checks first: the branch table (*br gets it), the global tokens'
 * pointers and the workspace's size (att_workspace_need for desc->n rows) and 256-byte
 * alignment. SF_E_INVAL/SF_E_UNSUPPORTED with sf_last_error() set, nothing launched. */
int att_check_ws_launch(const sf_attention_desc *desc, const void *workspace, size_t workspace_bytes, att_branches *br);

/* Checks the alignment the staged kernels need (SF_E_UNSUPPORTED otherwise, nothing launched). */
int att_check_staged_inputs(const sf_attention_desc *desc, const float *q, const float *k, const float *v);

/* Positions per block for query tiles of `bm` dilated rows: a multiple of every dilation that
 * holds one full tile of the most dilated branch. SF_E_UNSUPPORTED for dilations too varied. */
int att_block_positions(const att_branches &br, int bm, long *T);

/* Launches the pre-pass on `stream`: K, V and the global tokens to bf16 in `ws` (laid out as
 * att_workspace_need says); fills *staged with where they are. `streaming` reads the float32
 * inputs as evict-first in L2 (d = 64 and 128, for the wgmma kernel; d = 32 ignores it).
 * SF_E_UNSUPPORTED for a head width other than 32, 64, 128. */
int att_stage_workspace(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                        att_staged *staged, cudaStream_t stream, bool streaming = false);

/* For bf16 k, v ([n, desc->ld], read in place, d = 64 or 128): stages only the global tokens into `ws`
 * (at its start) and fills *staged. */
int att_stage_globals(const sf_attention_desc *desc, const __nv_bfloat16 *k, const __nv_bfloat16 *v, unsigned char *ws,
                      att_staged *staged, cudaStream_t stream, bool streaming);

/* Orders the position blocks of T positions by their query-key pairs, heaviest first; leaves
 * ord->count 0 (plain order) past SF_ATT_ORDER_MAX blocks. */
void att_heaviest_first(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, att_order *ord);

/* The bf16 q, k, v the wgmma kernel reads in place ([n, desc->ld] as qkv wrote them): 16-byte
 * aligned rows, ld a multiple of 8; SF_E_UNSUPPORTED otherwise (nothing launched). */
int att_check_bf16_inputs(const sf_attention_desc *desc, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v);

#endif
