/* Head-parallel blocks: a block stage's heads (and its MLP's columns) split over R ranks, each
 * with its own backend (cpu: a thread and its cores; cuda: a thread and one GPU), joined by a
 * communicator (kernels/comm.h: host or NCCL). Not a public header.
 *
 * Rank r holds heads [r H/R, (r+1) H/R): the rows of Wq, Wk, Wv and the columns of Wo of those
 * heads, their gates, their compressive memory and global tokens; and the MLP's columns
 * [r F/R, (r+1) F/R): rows of W1 and W3, columns of W2. Each rank computes its heads' part of
 * the output projection and of the MLP; an all-reduce (sum) of the D-wide rows follows each,
 * so that after it every rank holds the same rows (rank 0 adds the residual, the others only
 * their part). Attention keeps SPEC 3's dilation offsets of the model's head indices
 * (sf_attention_desc.head_offset).
 *
 * Rank 0 is the stage itself, on the graph's backend and thread; the embedding, final norm,
 * source and sink stay there. The other ranks are threads started by the stage (followers):
 * rank 0 hands each one the same units of work it does itself (block_work: a segment, a flush,
 * a save, a restore), in order, and they make the same calls; the rows go from rank 0 to the
 * others by a broadcast at the start of each segment. A failure of any rank stops them all:
 * the others' collectives end with SF_E_COMM, and rank 0 reports the failed rank's message.
 *
 * The ranks may instead be processes of a distributed run (block head_ranks=, stages/head_procs.h;
 * stages/block_procs.c): rank 0 is the stage on the first rank listed and hands the same units of
 * work to the others' stages over the network (block.procs); the functions below serve both.
 *
 * Checkpoints: the stage's state is every rank's own state (its heads' memory and tokens), in
 * rank order, under a header naming the number of ranks; a resume needs the same number. The
 * layout is the same whether the ranks are threads or processes. */
#ifndef SEQFLOW_STAGES_BLOCK_SHARD_H
#define SEQFLOW_STAGES_BLOCK_SHARD_H

#include "stages/block_state.h"

/* Sets b's part for rank of ranks (1: everything): rank, ranks, heads, head0, hidden, width.
 * SF_E_OPTION naming H (or F) and R when R does not divide them. */
int sf_block_shard_plan(block *b, int rank, int ranks);
/* Uploads this rank's weights from m into b->weights (all of them for ranks 1). */
int sf_block_load_weights(block *b, const sf_model *m);

/* Rank 0 (block_init, after sf_block_setup): starts ranks 1..ranks-1 (their backends, weights,
 * buffers) and the communicator of all of them (b->comm), reading the stage's devices= and
 * comm_timeout=. On failure everything started is stopped again; block_free cleans up. With
 * head ranks that are processes (b->procs): takes their communicator and meets the others in
 * its first collectives instead. */
int sf_block_shard_start(sf_stage *st, block *b, int ranks);
/* Every rank's first collectives (an all-reduce and a broadcast of D values), at set-up: a rank
 * that cannot reach the others fails there rather than in the first segment. */
int sf_block_comm_warmup(block *b);
/* Rank 0: hands the other ranks a segment of `count` streams of n rows each (n 0: only the
 * stream's end), which rank 0 is about to run itself (block_work FORWARD). */
int sf_block_shard_forward(block *b, const uint64_t *streams, int count, int n, int commit, int final);
/* Rank 0: hands the other ranks a flush of the deferred commit. */
int sf_block_shard_flush(block *b);
/* Rank 0, at the end of the input (after the last flush): head ranks that are processes get
 * the end of their work (their stages end); nothing for threads. */
void sf_block_shard_end(block *b);
/* Rank 0: every rank's state into out (rank 0's own state included). */
int sf_block_shard_save(block *b, sf_buffer *out);
/* Rank 0: every rank's state from data (SF_E_STATE naming both counts when the number of ranks
 * differs, or when the state was saved without head parallelism). */
int sf_block_shard_restore(block *b, const uint8_t *data, size_t len);
/* An unsharded block's check of saved state: SF_E_STATE when it was saved by head-parallel
 * ranks, SF_OK otherwise. */
int sf_block_shard_refuse(const block *b, const uint8_t *data, size_t len);
/* Rank 0, after each of the stage's calls: rc unchanged when SF_OK or unsharded; otherwise the
 * other ranks are stopped, and the error returned is the first failed rank's (SF_E_COMM naming
 * it) when that was another rank, else rc. Head ranks that are processes: the communicator is
 * aborted with the message (the followers' waits end), which names the head rank that failed
 * first; SF_E_PEER when the network lost one (comm.lost_peer: the job may roll back). */
int sf_block_shard_check(block *b, int rc);
/* Rank 0 (block_free): stops the other ranks, waits for their threads, frees them. */
void sf_block_shard_stop(block *b);

/* ---- head ranks that are processes (stages/block_procs.c) ----------------------------------- */

/* block_init: with head_ranks= given, *ranks (heads_of=, 0 when unset) and *rank from the
 * graph's head ranks h: SF_E_UNSUPPORTED outside a distributed run (h NULL), on a backend other
 * than cpu and cuda, or on cuda in a build without NCCL; SF_E_OPTION when heads_of= disagrees.
 * Nothing changed without head_ranks=. */
int sf_block_procs_plan(sf_stage *st, struct sf_head_procs *h, int *ranks, int *rank);
/* Every head rank, at the end of block_init (rank 0 from sf_block_shard_start): sets b->comm
 * and meets the others in the first collectives. cpu: borrows the graph's network
 * communicator. cuda: gathers every rank's GPU (SF_E_OPTION naming both ranks when two share
 * one, on every rank, before NCCL is joined), then head rank 0 makes an NCCL id and sends it to
 * each follower over the network communicator, and each joins the NCCL communicator on its GPU
 * (within comm_timeout=, watching h->stop), which b->comm then owns (block_free frees it). A
 * failure aborts the network communicator with this rank's reason. */
int sf_block_procs_join(sf_stage *st, block *b);
/* Aborts the head ranks' communicators (the stage's NCCL one, if any, and the network one). */
void sf_block_procs_abort(block *b, const char *why);
/* Rank 0: hands w to every follower (RESTORE: data[k], len[k] is follower k's state). */
int sf_block_procs_send(block *b, const block_work *w, const uint8_t *const *data, const size_t *len);
/* Rank 0, after handing out a SAVE: follower k's state, appended to out (over the network
 * communicator, on cuda too: host memory). */
int sf_block_procs_gather(block *b, int k, sf_buffer *out);
/* A follower's process(): the unit of work p holds (takes p), done as rank 0 does it; a SAVE's
 * state goes back to rank 0. On failure the communicator is aborted with the reason. */
int sf_block_procs_follow(block *b, sf_packet *p);

#endif
