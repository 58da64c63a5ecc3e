/* Sequence parallelism's scan (stages/block_seq_internal.h): the gateway star, the binomial
 * tree, the flat scan with its round totals folded as they arrive, and what a rank computes
 * while messages travel.
 *
 * Overlap. A rank that must wait for a message its layer needs now (the messages of the ranks
 * before it, its parent's or children's in the tree, its gateway's) first runs, segment by segment, the attention branches of its
 * chunk (sf_attention_local: they read only the chunk's own q, k, v, never the memory or the
 * global tokens), and folds any round totals that came in, until the message is there. The
 * walk then merges the global tokens into the branches kept and mixes in the memory: what
 * waits for the exchange is that, the memory retrieval and update, and the rows' products.
 * The flat scan's round totals (the messages of the ranks after this one) are needed only by
 * the same layer of the next round: they are folded when they have arrived, at the latest when
 * a slot is needed (SEQ_PENDING layers may wait), so a rank goes on to its next layer without
 * waiting for the slower ranks after it. Every sum keeps its rank order: the bits do not depend
 * on what arrived when. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_parts.h"
#include "kernels/memory_map.h"
#include "stages/block_seq_internal.h"

/* ---- work while messages travel ---------------------------------------------------------- */

/* The attention branches of the chunk's next segment (the layer whose projections cqkv holds). */
static int attention_step(sf_seq *q)
{
    const int s = q->attn_done;
    const size_t seg_rows = (size_t)q->N * q->W;
    const sf_model_config *c = q->b->cfg;
    const float *qs = q->cqkv + 3 * (size_t)s * seg_rows;
    /* the desc of the block's attention (stages/block.c), without global tokens */
    const sf_attention_desc desc = {
        .n = s == q->attn_segments - 1 ? q->attn_last_rows : q->N, .segment = q->N, .heads = q->H, .head_dim = q->d,
        .ld = q->W, .causal = c->causal, .n_branches = c->n_branches, .branches = c->branches,
        .scale = 1.0f / sqrtf((float)q->d), .qkv_type = SF_DTYPE_F32};
    const double t0 = seq_now_s();
    const int rc = sf_attention_local(q->b->be, &desc, qs, qs + seg_rows, qs + 2 * seg_rows, q->cacc + s * seg_rows,
                                      q->cml + (size_t)s * SF_ATTENTION_ML_FLOATS(q->N, q->H));
    const double spent = seq_now_s() - t0;
    q->stats.compute_s += spent, q->inner_s += spent;
    q->attn_done++;
    return rc;
}

int seq_attention_rest(sf_seq *q)
{
    int rc = SF_OK;
    while (rc == SF_OK && q->attn_done < q->attn_segments) rc = attention_step(q);
    return rc;
}

static int totals_settle(sf_seq *q, int keep);

/* The next message from peer, which the layer needs now: while it is not there, the chunk's
 * attention branches, and whatever round totals arrived. */
static int recv_overlapped(sf_seq *q, int peer, seq_msg *m, uint32_t *hash, const sf_quant_params *quant)
{
    int rc = SF_OK;
    while (rc == SF_OK && q->attn_done < q->attn_segments && sf_comm_probe(q->comm, peer, 1) == 0) {
        rc = attention_step(q);
        if (rc == SF_OK) rc = totals_settle(q, SEQ_PENDING);
    }
    if (rc == SF_OK) rc = totals_settle(q, SEQ_PENDING);
    return rc == SF_OK ? seq_recv_msg(q, peer, m, hash, quant) : rc;
}

/* ---- the gateway star -------------------------------------------------------------------- */

int seq_scan(sf_seq *q, int l, int phase, const seq_msg *own, int parts)
{
    const int across_parts = q->o.federation ? (parts & PART_TAIL) : parts;
    const sf_quant_params *tier = q->o.tier.kind != SF_QUANT_F32 ? &q->o.tier : NULL;
    const int my_group = q->group_of[q->rank];
    int rc = SF_OK;
    if (q->rank != q->gateway) {
        rc = seq_send_msg(q, q->gateway, own, parts, SPAN_HASH_NONE, NULL, NULL);
        if (rc == SF_OK) rc = recv_overlapped(q, q->gateway, &q->pre, NULL, NULL);
        if (rc == SF_OK) rc = recv_overlapped(q, q->gateway, &q->tot, NULL, NULL);
        return rc;
    }
    /* the gateway: its members' messages in rank order (its own first), their combination */
    int first = q->rank, last = q->rank;
    while (last + 1 < q->ranks && q->group_of[last + 1] == my_group) last++;
    const int members = last - first + 1;
    seq_msg_copy(q, &q->peer_msgs[0], own);
    for (int r = first + 1; r <= last && rc == SF_OK; r++) rc = recv_overlapped(q, r, &q->peer_msgs[r - first], NULL, NULL);
    seq_msg_identity(q, &q->acc);
    for (int i = 0; i < members && rc == SF_OK; i++) rc = seq_msg_then(q, &q->acc, &q->peer_msgs[i], parts);
    /* spans between gateways, each with the sender's hash of the round state it started from */
    const uint32_t hash = seq_state_hash(q, l, !q->o.federation);
    sf_quant_feedback *fb = q->fbB && tier ? &q->fbB[4 * l + 2 * phase] : NULL;
    seq_msg *span = &q->peer_msgs[members]; /* scratch after the members */
    if (rc == SF_OK && q->n_groups > 1) {
        /* encoded once (the error feedback advances once a round); the same bytes to every
         * gateway, and decoded here into what the others will hold of ours */
        size_t len = 0;
        uint8_t *bytes = NULL;
        rc = seq_msg_encode(q, &q->acc, across_parts, hash, tier, fb, &len);
        if (rc == SF_OK && !(bytes = malloc(len))) rc = sf_error(SF_E_NOMEM, "out of memory");
        if (rc == SF_OK) memcpy(bytes, q->wire, len), rc = seq_msg_decode(q, len, span, NULL, tier);
        for (int g = 0; g < q->n_groups && rc == SF_OK; g++)
            if (g != my_group) {
                memcpy(q->wire, bytes, len);
                rc = seq_wire_send(q, q->gateway_of_group[g], len, 1);
            }
        free(bytes);
    }
    /* the total over the groups in order, and the prefix of the groups before ours */
    seq_msg_identity(q, &q->tot);
    seq_msg *before = &q->peer_msgs[members + 1];
    seq_msg_identity(q, before);
    for (int g = 0; g < q->n_groups && rc == SF_OK; g++) {
        if (g == my_group) {
            rc = seq_msg_then(q, &q->tot, q->n_groups > 1 ? span : &q->acc, across_parts);
            if (rc == SF_OK && q->o.federation) rc = seq_msg_then(q, &q->tot, &q->acc, parts & ~PART_TAIL);
            continue;
        }
        uint32_t theirs = 0;
        rc = recv_overlapped(q, q->gateway_of_group[g], &q->tmp, &theirs, tier);
        if (rc == SF_OK && theirs != hash)
            rc = sf_error(SF_E_STATE, "sequence exchange: layer %d's state differs between datacenter %d (hash %08x) and "
                          "%d (%08x) after %d rounds", l, my_group, hash, g, theirs, q->rounds);
        if (rc == SF_OK) rc = seq_msg_then(q, &q->tot, &q->tmp, across_parts);
        if (rc == SF_OK && g < my_group) rc = seq_msg_then(q, before, &q->tmp, across_parts);
    }
    if (rc == SF_OK) rc = seq_msg_canon(q, &q->tot, parts, NULL, NULL);
    /* each member's prefix: the groups before, then the members before it */
    for (int i = 0; i < members && rc == SF_OK; i++) {
        seq_msg_copy(q, &q->pre, before);
        for (int j = 0; j < i && rc == SF_OK; j++) rc = seq_msg_then(q, &q->pre, &q->peer_msgs[j], parts);
        if (rc == SF_OK) rc = seq_msg_canon(q, &q->pre, parts, NULL, NULL);
        if (rc == SF_OK && i > 0) {
            rc = seq_send_msg(q, first + i, &q->pre, parts, SPAN_HASH_NONE, NULL, NULL);
            if (rc == SF_OK) rc = seq_send_msg(q, first + i, &q->tot, parts, SPAN_HASH_NONE, NULL, NULL);
        }
        if (rc == SF_OK && i == 0) seq_msg_copy(q, &q->peer_msgs[members + 2], &q->pre);
    }
    if (rc == SF_OK) seq_msg_copy(q, &q->pre, &q->peer_msgs[members + 2]);
    return rc;
}

/* ---- the tree: one group beyond SF_SEQ_FLAT_RANKS ---------------------------------------- */

/* A binomial tree over the ranks: rank r's parent is r less its lowest set bit, its children
 * r + 2^k for every 2^k below that bit (rank 0: below the ranks' count). Up: each rank composes
 * its own message then its children's subtrees in rank order and sends that to its parent;
 * rank 0 ends with the round's total. Down: each rank, given the prefix of the ranks before it
 * and the total, sends each child the prefix of the ranks before that child (its own prefix,
 * its own message, the subtrees of the children before) and the total. 2 log2 R steps; every
 * rank holds rank 0's total, bit for bit, and its own exact prefix. */
int seq_scan_tree(sf_seq *q, int phase, const seq_msg *own, int parts)
{
    const int r = q->rank, R = q->ranks;
    int levels = 0; /* the children's levels: r + 2^k for k < levels */
    if (r == 0)
        while ((1 << levels) < R) levels++;
    else
        while (!(r & (1 << levels))) levels++;
    seq_msg *kids = q->peer_msgs; /* kids[k]: the subtree at r + 2^k */
    int rc = SF_OK, n_kids = 0;
    seq_msg_copy(q, &q->acc, own);
    for (int k = 0; k < levels && r + (1 << k) < R && rc == SF_OK; k++, n_kids++) {
        rc = recv_overlapped(q, r + (1 << k), &kids[k], NULL, NULL);
        if (rc == SF_OK) rc = seq_msg_then(q, &q->acc, &kids[k], parts);
    }
    if (rc == SF_OK && r) {
        const int parent = r - (1 << levels);
        rc = seq_send_msg(q, parent, &q->acc, parts, SPAN_HASH_NONE, NULL, NULL);
        if (rc == SF_OK) rc = recv_overlapped(q, parent, &q->pre, NULL, NULL);
        if (rc == SF_OK) rc = seq_recv_msg(q, parent, &q->tot, NULL, NULL);
    } else if (rc == SF_OK) {
        seq_msg_identity(q, &q->pre);
        seq_msg_copy(q, &q->tot, &q->acc);
        rc = seq_msg_canon(q, &q->tot, parts, NULL, NULL); /* what the others receive */
    }
    /* the children's prefixes: q->acc runs from this rank's prefix on */
    if (rc == SF_OK) {
        seq_msg_copy(q, &q->acc, &q->pre);
        rc = seq_msg_then(q, &q->acc, own, parts);
    }
    for (int k = 0; k < n_kids && rc == SF_OK; k++) {
        rc = seq_send_msg(q, r + (1 << k), &q->acc, parts, SPAN_HASH_NONE, NULL, NULL);
        if (rc == SF_OK) rc = seq_send_msg(q, r + (1 << k), &q->tot, parts, SPAN_HASH_NONE, NULL, NULL);
        if (rc == SF_OK && k + 1 < n_kids) rc = seq_msg_then(q, &q->acc, &kids[k], parts);
    }
    return rc;
}

/* ---- the flat scan ----------------------------------------------------------------------- */

int seq_scan_flat(sf_seq *q, int phase, const seq_msg *own, int parts, seq_pending *t)
{
    int rc = SF_OK;
    for (int p = 0; p < q->ranks && rc == SF_OK; p++)
        if (p != q->rank) rc = seq_send_msg(q, p, own, parts, SPAN_HASH_NONE, NULL, NULL);
    seq_msg_identity(q, &q->pre);
    for (int p = 0; p < q->rank && rc == SF_OK; p++) {
        rc = recv_overlapped(q, p, &q->tmp, NULL, NULL);
        if (rc == SF_OK) rc = seq_msg_then(q, &q->pre, &q->tmp, parts);
    }
    /* the round's total starts as the prefix then this rank's own: the same operations, in the
     * same order, as composing every rank's message from rank 0 on */
    if (rc == SF_OK) {
        seq_msg_copy(q, &t->tot[phase], &q->pre);
        rc = seq_msg_then(q, &t->tot[phase], own, parts);
    }
    return rc;
}

/* ---- the flat scan's round totals -------------------------------------------------------- */

/* Which parts each of a layer's exchanges carries, and which of them the memory takes. */
void seq_parts(const sf_seq *q, int *parts0, int *memory_parts)
{
    const int memory = q->kind != SF_MEMORY_NONE, linear = q->kind == SF_MEMORY_LINEAR;
    *parts0 = (memory ? PART_Z : 0) | PART_TAIL | (linear ? PART_B : 0);
    *memory_parts = memory ? PART_Z | (linear ? PART_B : 0) : 0;
}

/* Layer t's totals into the round state: what the layer's exchanges brought (z, tokens, the
 * linear map), then the delta rule's map. */
static int totals_apply(sf_seq *q, seq_pending *t)
{
    int parts0, memory_parts;
    seq_parts(q, &parts0, &memory_parts);
    int rc = seq_state_then(q, t->layer, &t->tot[0], memory_parts);
    if (rc == SF_OK && q->kind == SF_MEMORY_DELTA)
        rc = sf_memory_map_apply(q->H, q->d, t->tot[1].A, t->tot[1].B, q->SM + (size_t)t->layer * q->hdd);
    return rc;
}

/* Folds the messages that have arrived into the open totals, oldest first and in rank order
 * (a peer's messages come in the order it sent them: layer by layer, each layer's exchanges in
 * turn); totals complete go into the round state. Waits (receives) until at most `keep` layers'
 * totals are left. */
static int totals_settle(sf_seq *q, int keep)
{
    int rc = SF_OK;
    int parts[2];
    seq_parts(q, &parts[0], &(int){0});
    parts[1] = PART_A | PART_B;
    const int phases = q->kind == SF_MEMORY_DELTA ? 2 : 1;
    while (rc == SF_OK && q->pend_count > 0) {
        seq_pending *t = &q->pend[q->pend_first];
        if (!t->open) break;
        int ph = 0;
        while (ph < phases && t->next[ph] >= q->ranks) ph++;
        if (ph == phases) {
            rc = totals_apply(q, t);
            t->open = 0, q->pend_first = (q->pend_first + 1) % SEQ_PENDING, q->pend_count--;
            continue;
        }
        const int p = t->next[ph];
        if (q->pend_count <= keep && sf_comm_probe(q->comm, p, 1) == 0) break;
        rc = seq_recv_msg(q, p, &q->tmp, NULL, NULL);
        if (rc == SF_OK) rc = seq_msg_then(q, &t->tot[ph], &q->tmp, parts[ph]);
        t->next[ph]++;
    }
    return rc;
}

int seq_totals_reserve(sf_seq *q, int l, seq_pending **out)
{
    *out = NULL;
    /* the same layer of the round before must be in the round state first (the layer starts
     * from it), and a slot free */
    int rc = SF_OK, newest = -1;
    for (int i = 0; i < q->pend_count; i++)
        if (q->pend[(q->pend_first + i) % SEQ_PENDING].layer == l) newest = i;
    if (newest >= 0) rc = totals_settle(q, q->pend_count - newest - 1);
    if (rc == SF_OK && q->pend_count == SEQ_PENDING) rc = totals_settle(q, SEQ_PENDING - 1);
    if (rc == SF_OK && q->pend_count == SEQ_PENDING)
        return sf_error(SF_E_STATE, "sequence exchange: no slot for layer %d's round totals", l);
    if (rc != SF_OK) return rc;
    seq_pending *t = &q->pend[(q->pend_first + q->pend_count) % SEQ_PENDING];
    t->layer = l, t->open = 0;
    q->pend_count++;
    *out = t;
    return SF_OK;
}

int seq_totals_open(sf_seq *q, seq_pending *t)
{
    t->next[0] = t->next[1] = q->rank + 1;
    t->open = 1;
    return totals_settle(q, SEQ_PENDING);
}

int seq_totals_drain(sf_seq *q) { return totals_settle(q, 0); }
