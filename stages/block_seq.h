/* Sequence parallelism: one stream's segments spread over R ranks, each rank running every layer
 * on a contiguous run of whole segments (its chunk), with the answer of one process (SPEC 7).
 * Not a public header; tools/sequence_cli.c drives it over processes, tests over threads; the
 * code: stages/block_seq.c (the exchange, a round), stages/block_seq_run.c (a whole stream).
 *
 * The stream is cut into rounds; in each round rank 0 holds the first chunk, rank 1 the next,
 * and so on (a rank may hold none, e.g. past the end of the stream). Every rank calls
 * sf_seq_round once per round with its chunk's rows, and they go through all the layers in
 * place. What a layer of a segment needs from the segments before it is the memory (M, z) and
 * the global tokens as they stood at its start (SPEC 4, 5); the ranks get it in one of two ways:
 *
 * SF_SEQ_SCAN (the default): layer by layer, each rank computes its chunk's Q, K, V, its sum of
 * sigma(k) and its summary tokens, and (delta rule, once the z at its start is known) its
 * chunk's memory map (kernels/memory_map.h); the ranks combine these in an exclusive scan
 * (below), after which each knows the exact state at its chunk's start, and finishes the layer
 * by walking its own segments from there. Every rank works at once; the only wait is for the
 * scan, and what does not need its answer runs meanwhile: while a rank waits for the earlier
 * ranks' messages it computes its chunk's attention branches (they read only the chunk's own
 * q, k, v; the walk merges the global tokens into them), and the round totals (the later
 * ranks' messages, needed only by the same layer of the next round) are folded in as they
 * arrive, while the rank goes on to its next layer (stages/block_seq_scan.c). Within 1e-5 of
 * one process in float32, not bit for bit: z and the maps are summed and
 * composed in another order (in double, rounded to float32 for the wire), and M at a chunk's
 * start is A M + B instead of the segments' float32 updates one by one. Run to run it is
 * deterministic: the order of every sum is fixed by the ranks' order, not by timing.
 *
 * SF_SEQ_HANDOFF: each rank waits for the exact state at its chunk's start from the rank before
 * it (rank 0, from the last rank's previous round), runs the layer on its chunk and passes the
 * state on. Bit for bit one process's answer; the ranks form a pipeline over the layers (rank r
 * runs layer l while rank r + 1 runs layer l - 1), so it pays when a layer of a chunk takes
 * longer than a state's trip, and the rounds are short next to the layers times the ranks.
 *
 * The scan: in one group of up to 16 ranks, every rank sends its message to every other and
 * composes them in rank order itself (the flat scan); one group of more ranks scans over a
 * binomial tree (2 log2 R steps, rank 0's total sent down). Several groups: ranks are grouped
 * (datacenters, sf_seq_options.group_of: consecutive ranks); the
 * lowest rank of each group is its gateway. Each rank sends its chunk's message to its gateway;
 * the gateway combines its group's messages in rank order into the group's span message and
 * exchanges span messages with the other gateways (only these cross between groups), then
 * sends each member the combination of everything before it (its exclusive prefix) and the
 * round's total. A message is (z sum, the last G summary tokens, memory map (A, B)); combining
 * adds z, concatenates the tokens keeping the last G, and composes the maps. Every rank uses
 * only what was sent (float32, or the tier's quantized form), its own part included, so every
 * rank holds the same round state bit for bit; a hash of it rides every span message and a
 * mismatch stops the run.
 *
 * Between gateways the maps may be quantized (sf_seq_options.tier: int8, int4, fp8 with a scale
 * per group; bf16): the approximate tier. B carries its rounding into the next round's span of
 * the same layer (error feedback), so the state's error stays at one message's rounding rather
 * than growing with the stream; A is rounded without feedback. federation: only the global
 * tokens cross between groups; each group keeps the memory of its own segments (an
 * approximation of the exact run: the memory of a group's chunks misses the other groups').
 *
 * Errors: a peer that fails or goes silent ends the exchange with SF_E_COMM (the
 * communicator's message); a state hash mismatch with SF_E_STATE; the CPU backend only. */
#ifndef SEQFLOW_STAGES_BLOCK_SEQ_H
#define SEQFLOW_STAGES_BLOCK_SEQ_H

#include <stdint.h>

#include "compress/quantize.h"
#include "kernels/comm.h"
#include "seqflow/buffer.h"
#include "seqflow/model.h"

typedef enum { SF_SEQ_SCAN = 0, SF_SEQ_HANDOFF = 1 } sf_seq_exchange;

typedef struct sf_seq_options {
    sf_seq_exchange exchange;
    const int *group_of;  /* [ranks]: each rank's group (datacenter), non-decreasing from 0; NULL:
                             one group. Copied. */
    sf_quant_params tier; /* scan: the maps' encoding between gateways; kind F32 (the default, 0):
                             exact */
    int federation;       /* scan with groups: only global tokens cross between groups */
    int threads;          /* OpenMP threads for the maps (0: 1) */
} sf_seq_options;

typedef struct sf_seq sf_seq;

/* This rank's part (comm's rank of comm's size) for model m on backend be (a "cpu" backend),
 * every layer. Borrows m, be and comm (they must outlive it); the caller owns *out and frees it
 * with sf_seq_free (NULL accepted). SF_E_UNSUPPORTED on another backend. */
int sf_seq_create(const sf_model *m, sf_backend *be, sf_comm *comm, const sf_seq_options *o, sf_seq **out);
void sf_seq_free(sf_seq *q);

/* One round: this rank's chunk of `segments` consecutive segments (0 allowed), each of the
 * model's N rows except the last, which has last_rows (1..N: the stream's partial final
 * segment, or N), rows at x ([rows, D] float32, host memory), through every layer in place.
 * last_round: no round follows (hand-off: the last rank keeps the state). Every rank calls it
 * for every round, in the same order. The state commits: it is the state after the round. */
int sf_seq_round(sf_seq *q, int segments, int last_rows, float *x, int last_round);

/* Bytes each way on this rank so far: what it sent and received in the exchange, split into
 * what crossed between groups and the rest. */
typedef struct sf_seq_stats {
    uint64_t sent_across, received_across, sent_within, received_within;
    double exchange_s, compute_s; /* time waiting in the exchange, and computing */
    /* of exchange_s, the time blocked in a receive: from a rank before this one (the scan's
     * prefixes, the hand-off's state), and from a rank after it (the flat scan's round totals) */
    double blocked_before_s, blocked_after_s;
} sf_seq_stats;
void sf_seq_stats_get(const sf_seq *q, sf_seq_stats *out);

/* The round state into out, and back: the state after the rounds run so far, as every rank of
 * a scan holds it (the hand-off mode: the last rank's, after its chunk). A checkpoint of a
 * run; restore before the next round, on the same number of ranks or another. Both first wait
 * for the round totals still on their way (the flat scan folds them in as they arrive). */
int sf_seq_state_save(sf_seq *q, sf_buffer *out);
int sf_seq_state_restore(sf_seq *q, const uint8_t *data, size_t len);


/* ---- a whole stream -------------------------------------------------------------------- */

/* Who holds what: a stream of `tokens` tokens in segments of N; in every round rank r holds
 * chunk[r] consecutive segments (>= 0, at least one rank > 0), after ranks 0..r-1's. */
typedef struct sf_seq_plan {
    uint64_t tokens;
    int N, ranks;
    int *chunk;  /* [ranks] */
    int balance; /* sf_seq_run: after each round, chunk is split anew in proportion to each rank's
                    measured speed (segments per second of computing in that round), keeping the
                    round's total: ranks of different speed finish their chunks together */
} sf_seq_plan;

/* Rounds the stream takes (0 for an empty stream). */
uint64_t sf_seq_plan_rounds(const sf_seq_plan *p);
/* Rank r's part of round t: segments [*first, *first + *count) (count 0 past the stream's end),
 * the last of which has *last_rows rows. */
void sf_seq_plan_chunk(const sf_seq_plan *p, uint64_t round, int rank, uint64_t *first, int *count, int *last_rows);

/* Reads tokens [pos, pos + n) of the stream into ids; writes the output rows ([n, D] float32) of
 * positions [pos, pos + n). Return SF_OK or an error code (with its message set). */
typedef struct sf_seq_io {
    int (*read)(void *user, uint64_t pos, size_t n, uint32_t *ids);
    int (*write)(void *user, uint64_t pos, size_t n, const float *rows);
    /* after each round's rows were written (may be NULL): progress, checkpoints; an error ends
     * the run */
    int (*round_done)(void *user, uint64_t round, uint64_t rounds);
    void *user;
} sf_seq_io;

/* This rank's share of the whole stream from round first_round on (0, or the round after a
 * restored state): per round, its chunk's tokens read, embedded (ids checked against the
 * vocabulary), through sf_seq_round, the final norm when the model has one, written. */
int sf_seq_run(sf_seq *q, const sf_model *m, const sf_seq_plan *p, uint64_t first_round, const sf_seq_io *io);

#endif
