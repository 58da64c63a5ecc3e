/* Local attention (SPEC 3 and 5) in two halves, for a caller that holds a segment's q, k, v
 * before it knows the global tokens that segment attends to (sequence parallelism: a rank
 * computes its chunk's attention while the earlier ranks' summary tokens and memory are still
 * on their way, stages/block_seq.c).
 *
 * The branches read only the segment's own q, k, v; the global tokens are one more part merged
 * by the softmax denominators (SPEC 3), so the branches' partial softmax can be kept and the
 * global part merged into it later. sf_attention_local then sf_attention_finish perform the
 * same floating-point operations in the same order as the backend's attention op with the same
 * desc: the result is the same bits.
 *
 * The CPU backend, float32 q, k, v only (SF_E_UNSUPPORTED otherwise). Host memory; nothing is
 * kept between the calls but what the caller holds (acc, ml). Return SF_OK, or SF_E_NOMEM,
 * SF_E_UNSUPPORTED with the message set. */
#ifndef SEQFLOW_KERNELS_ATTENTION_PARTS_H
#define SEQFLOW_KERNELS_ATTENTION_PARTS_H

#include "seqflow/backend.h"

/* Floats of acc and of ml for n rows of desc's heads. */
#define SF_ATTENTION_ACC_FLOATS(n, ld) ((size_t)(n) * (size_t)(ld))
#define SF_ATTENTION_ML_FLOATS(n, heads) ((size_t)2 * (size_t)(n) * (size_t)(heads))

/* The branches' half: for each head h and row i, the unnormalized output acc[i*ld + h*d + j]
 * and its softmax's running max and sum in ml ([heads][2][n]: max row, then sum row).
 * desc's global tokens are ignored (they may not be known yet). */
int sf_attention_local(sf_backend *be, const sf_attention_desc *desc, const float *q, const float *k, const float *v,
                       float *acc, float *ml);

/* The other half: desc's global tokens merged into (acc, ml) from sf_attention_local with the
 * same q, n, heads and branches, and A_dot written to out ([n][ld], as the attention op
 * writes it). acc and ml are only read. */
int sf_attention_finish(sf_backend *be, const sf_attention_desc *desc, const float *q, const float *acc, const float *ml,
                        float *out);

#endif
