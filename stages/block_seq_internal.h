/* The parts of sequence parallelism shared by stages/block_seq.c (the exchange and a round)
 * and stages/block_seq_run.c (a whole stream: the plan, the balance, the files' I/O). Not a
 * public header. */
#ifndef SEQFLOW_STAGES_BLOCK_SEQ_INTERNAL_H
#define SEQFLOW_STAGES_BLOCK_SEQ_INTERNAL_H

#include "stages/block_seq.h"
#include "stages/block_state.h"

/* What one rank (or a run of ranks) contributes to a layer's state in a round. Combining a then
 * b (msg_then): z adds, the tokens are a's then b's keeping the last G, the maps compose. */
typedef struct seq_msg {
    double *z;      /* [H*d] sum of sigma(k) */
    float *tk, *tv; /* [G][W]: the last cnt summary tokens, oldest first */
    int cnt;
    double *A, *B;  /* [H][d][d]; A NULL for the linear rule */
} seq_msg;

/* what a message carries (the two exchanges of a layer under the delta rule carry different
 * parts; federation keeps the memory's parts inside a group) */
enum { PART_Z = 1, PART_TAIL = 2, PART_A = 4, PART_B = 8 };

#define MSG_MAGIC 0x53514d31u /* "SQM1" */
#define SF_SEQ_FLAT_RANKS 16  /* up to this many ranks in one group, the flat scan (scan_flat) */
#define SPAN_HASH_NONE 0u

struct sf_seq {
    block *b;
    stream_state *work; /* the chunk's walk: float32 state, as one process holds it */
    sf_comm *comm;
    sf_seq_options o;
    int *group_of, rank, ranks, gateway, n_groups, *gateway_of_group;
    /* one group of a few ranks: every rank sends its message to every other and composes in
     * rank order itself (scan_flat), no gateway round trip; a rank waits only for the ranks
     * before it mid-layer, for those after it at the layer's end (the round total) */
    int flat;
    int L, H, d, W, G, S, N, D;
    size_t hd, hdd;
    sf_memory_kind kind;
    /* the state after the rounds so far (the scan's; the hand-off's for saving): per layer */
    double *SM, *Sz;       /* [L][H*d*d], [L][H*d] */
    float *Sgk, *Sgv;      /* [L][G][W] ring */
    int *Scount, *Shead;   /* [L] */
    int rounds;            /* rounds run since create or restore */
    /* the chunk's projections, kept from the first pass to the walk: per segment q, k, v of
     * [N][W] each, one after the other (the block's own layout: sf_block_layer reads them in
     * place); csk: sigma(k), [segments][N][W] */
    float *cqkv, *csk;
    int chunk_capacity;
    /* scratch: messages (own, received, composed), summary tokens, z of the walk */
    seq_msg own, tmp, acc, pre, tot, *peer_msgs;
    int n_peer_msgs;
    float *zinc, *zwalk;
    uint8_t *wire;
    size_t wire_cap;
    sf_quant_feedback *fbB; /* [L][2][2] error feedback between gateways: per layer, phase (the linear rule's
                               one exchange, the delta rule's second), of B then A - I */
    sf_seq_stats stats;
};

#endif
