/* The head-parallel ranks' sums after attention and MLP (stages/block_sums.c). Not a public
 * header. */
#ifndef SEQFLOW_STAGES_BLOCK_SUMS_H
#define SEQFLOW_STAGES_BLOCK_SUMS_H

#include "stages/block_state.h"

/* After the attention of layer l: x += A Wo^T, then the MLP (when the model has one), over
 * `rows` rows; head-parallel, each followed by the ranks' sum. join_owed: the side queue is
 * joined before the MLP's products (the deferred commits that read nothing they write). */
int sf_block_output_and_mlp(block *b, int l, int rows, int join_owed);
/* Head-parallel, at the start of a segment of `rows` rows, rank 0's rows in its x: every rank's
 * x = them (a broadcast), and with normed sums (block.normed) act.un = the first layer's
 * attention norm of them (sf_comm_first_rows); nothing unsharded. */
int sf_block_first_rows(block *b, int rows);
/* Rank 0 of split sums: emits the packet held back (block.held), if any. Defined in
 * stages/block.c, which owns the stage; called once the next segment's first attention is
 * issued. */
int sf_block_emit_held(block *b);
/* Normed sums: layer l's q, k, v ([rows, width] of block.qkv_type) from act.un, ending the
 * previous layer's owed sums chunk by chunk, each chunk's products after its own sum. */
int sf_block_qkv_normed(block *b, int l, int rows, unsigned char *q, unsigned char *k, unsigned char *v);

#endif
