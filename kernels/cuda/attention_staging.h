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
    /* split heavy items (att_split_heavy), else NULL: per (slot, head) item, the partner's
     * unnormalized O ([T][64]), its m and l ([2][T]) and its done flag */
    float *split_o, *split_ml;
    unsigned *split_flag;
};

/* An att_order entry of the bf16 in-place kernel: the position block, and for a split block
 * the slot (0 .. SF_ATT_SPLIT_MAX-1) and the part: the owner computes branch 0, merges its
 * partner's result and finishes the rows; the partner computes the other branches and the global
 * tokens into the slot. */
#define SF_ATT_ITEM_BLOCK 0x03FFu
#define SF_ATT_ITEM_SLOT_SHIFT 10
#define SF_ATT_ITEM_OWNER 0x4000u
#define SF_ATT_ITEM_PARTNER 0x8000u
#define SF_ATT_SPLIT_MAX 16

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

/* After att_stage_globals: points staged->split_* into the workspace room the in-place path
 * leaves free (the K/V copies') for blocks of T positions; returns how many position blocks
 * (every head) it holds, 0 for none. */
int att_split_workspace(const sf_attention_desc *desc, int T, unsigned char *ws, att_staged *staged);

/* As att_stage_workspace (streaming reads), but the main kernel may run alongside it: zeroes
 * the ready flags in `ws`, then stages K/V in chunks of SF_ATT_CHUNK_ROWS rows, last rows first
 * (the heaviest blocks' first keys), then the globals, each block raising its chunk's flag. The
 * kernel triggers its dependents at once, so a main kernel launched next with programmatic
 * stream serialization starts while it runs and must wait on staged->ready before reading. */
int att_stage_workspace_overlapped(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                                   att_staged *staged, cudaStream_t stream);

/* Orders the position blocks of T positions by their query-key pairs, heaviest first. */
void att_heaviest_first(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, att_order *ord);

/* Splits the heaviest position blocks of a heaviest-first order (at most max_split of them)
 * into an owner and a partner item and re-sorts the items by cost; returns how many it split.
 * slots: the blocks resident at once on the device. With more than one item a slot, a block
 * heavier than a slot's share of the work sets the kernel's end (bench/ATTENTION_NOTES.md,
 * session 5): splitting those evens the slots. Every owner waits for its partner, so the
 * partners' count (max_split * heads) must stay under slots (no deadlock). */
int att_split_heavy(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, int slots, int max_split,
                    att_order *ord);

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
