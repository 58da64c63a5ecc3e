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

/* A layer's round totals in the flat scan, waiting for the messages of the ranks after this
 * one: tot[phase] holds the composition of every rank's message up to next[phase] - 1 (the
 * delta rule's two exchanges; one otherwise). open: the layer's own exchanges are done. */
typedef struct seq_pending {
    int layer, open, next[2];
    seq_msg tot[2];
} seq_pending;
#define SEQ_PENDING 3 /* layers whose totals may wait at once */

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
    /* one group of more ranks: the binomial tree (seq_scan_tree) instead of the gateway's star */
    int tree;
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
    /* what the first pass computed of each segment's commit, kept for the walk's (the memory
     * map's products are the update's: kernels/memory_map.h, sf_memory_map_parts): per segment
     * P and G [H][d][d], the summary tokens ctk, ctv [S][W] and their count ctok */
    float *cP, *cG, *ctk, *ctv;
    int *ctok;
    int chunk_capacity;
    /* the chunk's attention branches (kernels/attention_parts.h), computed while messages
     * travel: per segment acc [N][W] and ml [2][H][N]; attn_done of attn_segments (the last of
     * attn_last_rows rows) done in the current layer. inner_s: seconds of computing done inside
     * the exchange (counted in stats.compute_s, not in exchange_s) */
    float *cacc, *cml;
    int attn_done, attn_segments, attn_last_rows;
    double inner_s;
    /* the flat scan's round totals still waiting: a ring of pend_count from pend_first */
    seq_pending pend[SEQ_PENDING];
    int pend_first, pend_count;
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

/* ---- the round state (stages/block_seq.c) ------------------------------------------------ */

/* A hash of layer l's round state (memory: its M and z too), never SPAN_HASH_NONE. */
uint32_t seq_state_hash(const sf_seq *q, int l, int memory);
/* The round state of layer l <- itself then the round's total t (its memory_parts, and the
 * tokens). */
int seq_state_then(sf_seq *q, int l, const seq_msg *t, int memory_parts);

/* ---- the scan (stages/block_seq_scan.c) --------------------------------------------------- */

/* Which parts a layer's first exchange carries (the delta rule's second: PART_A | PART_B), and
 * which of them the memory takes. */
void seq_parts(const sf_seq *q, int *parts0, int *memory_parts);
/* One exchange of layer l through the gateways: own is this rank's (already canonical) message
 * with `parts`; on return q->pre is the combination of every rank's before this one, q->tot
 * the round's. Which parts cross between groups: all, or only the tokens (federation). */
int seq_scan(sf_seq *q, int l, int phase, const seq_msg *own, int parts);
/* The same for one group of more than SF_SEQ_FLAT_RANKS ranks, over a binomial tree (log
 * depth): q->pre and q->tot as seq_scan leaves them. */
int seq_scan_tree(sf_seq *q, int phase, const seq_msg *own, int parts);
/* One exchange of the flat scan: own to every other rank, q->pre from the ranks before this
 * one, t->tot[phase] started (the ranks after this one are folded in later). */
int seq_scan_flat(sf_seq *q, int phase, const seq_msg *own, int parts, seq_pending *t);
/* The flat scan's totals of layer l: a slot, taken at the layer's start (the same layer of the
 * round before first completed, into the round state); opened at the layer's end (from then
 * on, the messages of later ranks fold into it as they arrive); all completed (drain). */
int seq_totals_reserve(sf_seq *q, int l, seq_pending **out);
int seq_totals_open(sf_seq *q, seq_pending *t);
int seq_totals_drain(sf_seq *q);
/* The chunk's attention branches not yet computed in this layer. */
int seq_attention_rest(sf_seq *q);

/* ---- messages (stages/block_seq_msg.c) ----------------------------------------------------
 * A message's buffers are sized for q's model (seq_msg_alloc; seq_msg_free accepts a zeroed
 * one). Parts a message lacks stay the identity. Functions return SF_OK or an SF_E_* code with
 * its message set. */
double seq_now_s(void);
int seq_msg_alloc(const sf_seq *q, seq_msg *m);
void seq_msg_free(seq_msg *m);
/* m <- the identity: z 0, no tokens, A = I, B = 0 */
void seq_msg_identity(const sf_seq *q, seq_msg *m);
/* tokens (tk, tv, cnt) <- the last G of (tokens, count more from k, v) */
void seq_tail_append(const sf_seq *q, float *tk, float *tv, int *cnt, const float *k, const float *v, int count);
/* a <- a then b, for the given parts */
int seq_msg_then(const sf_seq *q, seq_msg *a, const seq_msg *b, int parts);
void seq_msg_copy(const sf_seq *q, seq_msg *dst, const seq_msg *src);
/* m's parts into q->wire (*len bytes), with a hash of the sender's round state (or
 * SPAN_HASH_NONE); the maps in quant's encoding (NULL: float32), B with error feedback fb */
int seq_msg_encode(sf_seq *q, const seq_msg *m, int parts, uint32_t hash, const sf_quant_params *quant,
                   sf_quant_feedback *fb, size_t *len);
/* m <- the message in q->wire (len bytes), checked; *hash its hash (hash may be NULL) */
int seq_msg_decode(const sf_seq *q, size_t len, seq_msg *m, uint32_t *hash, const sf_quant_params *quant);
/* q->wire's len bytes to peer, and the next such bytes from it (counted in q->stats; the time a
 * receive is blocked, too) */
int seq_wire_send(sf_seq *q, int peer, size_t len, int across);
int seq_wire_recv(sf_seq *q, int peer, size_t *len, int across);
/* encode then send; receive then decode (float32 maps, within a group) */
int seq_send_msg(sf_seq *q, int peer, const seq_msg *m, int parts, uint32_t hash, const sf_quant_params *quant,
                 sf_quant_feedback *fb);
int seq_recv_msg(sf_seq *q, int peer, seq_msg *m, uint32_t *hash, const sf_quant_params *quant);
/* m <- what m becomes on the wire: every rank uses only that, its own part included, so that
 * all hold the same bits */
int seq_msg_canon(sf_seq *q, seq_msg *m, int parts, const sf_quant_params *quant, sf_quant_feedback *fb);

#endif
