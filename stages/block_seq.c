/* Sequence parallelism (stages/block_seq.h): a rank's chunk of a round through every layer, the
 * state at its start learnt by a scan over the ranks or handed over by the rank before it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/frame.h"
#include "kernels/attention_parts.h"
#include "kernels/backend_ext.h"
#include "kernels/memory_map.h"
#include "stages/block_seq.h"
#include "stages/block_shard.h"
#include "stages/block_state.h"

#include "stages/block_seq_internal.h"

/* ---- the round state --------------------------------------------------------------------- */

/* A hash of layer l's round state (what every rank must hold alike): CRC-32C of its bytes. */
uint32_t seq_state_hash(const sf_seq *q, int l, int memory)
{
    uint32_t h = 0;
    if (memory) {
        h = sf_crc32c(h, q->SM + (size_t)l * q->hdd, q->hdd * sizeof(double));
        h = sf_crc32c(h, q->Sz + (size_t)l * q->hd, q->hd * sizeof(double));
    }
    if (q->G) {
        h = sf_crc32c(h, q->Sgk + (size_t)l * q->G * q->W, (size_t)q->G * q->W * sizeof(float));
        h = sf_crc32c(h, q->Sgv + (size_t)l * q->G * q->W, (size_t)q->G * q->W * sizeof(float));
        h = sf_crc32c(h, &q->Scount[l], sizeof(int));
    }
    return h == SPAN_HASH_NONE ? 1 : h;
}

/* The round state's global tokens of layer l, oldest first, into tk, tv, cnt. */
static void state_tokens(const sf_seq *q, int l, float *tk, float *tv, int *cnt)
{
    const size_t row = (size_t)q->W;
    const float *gk = q->Sgk + (size_t)l * q->G * row, *gv = q->Sgv + (size_t)l * q->G * row;
    *cnt = 0;
    for (int j = 0; j < q->Scount[l]; j++) {
        const int slot = (q->Shead[l] + j) % q->G;
        seq_tail_append(q, tk, tv, cnt, gk + slot * row, gv + slot * row, 1);
    }
}

/* Layer l's M in the work state <- the round state's M then the map (A, B) (A NULL: linear),
 * in double, rounded once to the float32 the walk holds. */
static int work_memory_from(sf_seq *q, int l, const double *A, const double *B)
{
    double *M = malloc(q->hdd * sizeof *M + 1);
    if (!M) return sf_error(SF_E_NOMEM, "out of memory");
    memcpy(M, q->SM + (size_t)l * q->hdd, q->hdd * sizeof *M);
    int rc = sf_memory_map_apply(q->H, q->d, A, B, M);
    for (size_t i = 0; rc == SF_OK && i < q->hdd; i++) q->work->M[(size_t)l * q->hdd + i] = (float)M[i];
    free(M);
    return rc;
}

/* Layer l of the work state <- the round state then m: its z and tokens, and M where m carries
 * the map (PART_B; the delta rule's map comes in a second exchange: work_memory_from then). */
static int work_from(sf_seq *q, int l, const seq_msg *m, int memory_parts)
{
    stream_state *w = q->work;
    const size_t row = (size_t)q->W;
    int rc = SF_OK;
    if (memory_parts & PART_B) rc = work_memory_from(q, l, (memory_parts & PART_A) ? m->A : NULL, m->B);
    for (size_t i = 0; i < q->hd; i++)
        w->z[(size_t)l * q->hd + i] = (float)(q->Sz[(size_t)l * q->hd + i] + ((memory_parts & PART_Z) ? m->z[i] : 0));
    if (q->G) {
        float *gk = w->gk + (size_t)l * q->G * row, *gv = w->gv + (size_t)l * q->G * row;
        state_tokens(q, l, gk, gv, &w->g_count[l]);
        seq_tail_append(q, gk, gv, &w->g_count[l], m->tk, m->tv, m->cnt);
        w->g_head[l] = 0;
    }
    return rc;
}

/* The round state of layer l <- itself then the round's total t. */
int seq_state_then(sf_seq *q, int l, const seq_msg *t, int memory_parts)
{
    int rc = SF_OK;
    if (memory_parts & PART_B)
        rc = sf_memory_map_apply(q->H, q->d, (memory_parts & PART_A) ? t->A : NULL, t->B, q->SM + (size_t)l * q->hdd);
    if (memory_parts & PART_Z)
        for (size_t i = 0; i < q->hd; i++) q->Sz[(size_t)l * q->hd + i] += t->z[i];
    if (q->G) {
        const size_t row = (size_t)q->W;
        float *gk = q->Sgk + (size_t)l * q->G * row, *gv = q->Sgv + (size_t)l * q->G * row;
        float *tk = malloc((size_t)q->G * row * sizeof *tk), *tv = malloc((size_t)q->G * row * sizeof *tv);
        if (!tk || !tv) rc = sf_error(SF_E_NOMEM, "out of memory");
        int cnt = 0;
        if (rc == SF_OK) {
            state_tokens(q, l, tk, tv, &cnt);
            seq_tail_append(q, tk, tv, &cnt, t->tk, t->tv, t->cnt);
            memcpy(gk, tk, (size_t)cnt * row * sizeof *gk);
            memcpy(gv, tv, (size_t)cnt * row * sizeof *gv);
            q->Scount[l] = cnt, q->Shead[l] = 0;
        }
        free(tk), free(tv);
    }
    return rc;
}

/* ---- a round ----------------------------------------------------------------------------- */

static int ensure_chunk(sf_seq *q, int segments)
{
    if (segments <= q->chunk_capacity) return SF_OK;
    const size_t n = (size_t)segments * q->N * q->W;
    free(q->cqkv), free(q->csk);
    q->cqkv = malloc(3 * n * sizeof(float)), q->csk = malloc(n * sizeof(float));
    free(q->zinc), free(q->zwalk), free(q->cacc), free(q->cml);
    q->zinc = malloc((size_t)segments * q->hd * sizeof(float) + 1);
    q->zwalk = malloc(q->hd * sizeof(float) + 1);
    q->cacc = malloc(n * sizeof(float));
    q->cml = malloc((size_t)segments * SF_ATTENTION_ML_FLOATS(q->N, q->H) * sizeof(float));
    free(q->cP), free(q->cG), free(q->ctk), free(q->ctv), free(q->ctok);
    q->cP = malloc((size_t)segments * q->hdd * sizeof(float) + 1);
    q->cG = malloc((size_t)segments * q->hdd * sizeof(float) + 1);
    q->ctk = malloc((size_t)segments * q->S * q->W * sizeof(float) + 1);
    q->ctv = malloc((size_t)segments * q->S * q->W * sizeof(float) + 1);
    q->ctok = calloc((size_t)segments, sizeof(int));
    if (!q->cqkv || !q->csk || !q->zinc || !q->zwalk || !q->cacc || !q->cml || !q->cP || !q->cG || !q->ctk || !q->ctv ||
        !q->ctok) {
        q->chunk_capacity = 0;
        return sf_error(SF_E_NOMEM, "out of memory for a chunk of %d segments", segments);
    }
    q->chunk_capacity = segments;
    return SF_OK;
}

static int check_rows(const sf_seq *q, const float *x, size_t rows, int l, int s)
{
    const size_t n = rows * q->D;
    const size_t at = sf_first_non_finite(x, SF_DTYPE_F32, n);
    if (at == n) return SF_OK;
    return sf_error(SF_E_NONFINITE, "layer %d produced a non-finite value: segment %d of this rank's chunk, row %zu, "
                    "column %zu; the weights or the input overflow float32", l, s, at / q->D, at % q->D);
}

/* Time since *t0 into *into, less what inner work counted as computing meanwhile; *t0 and
 * *inner0 move on. */
static void account(sf_seq *q, double *t0, double *inner0, double *into)
{
    const double now = seq_now_s();
    *into += now - *t0 - (q->inner_s - *inner0);
    *t0 = now, *inner0 = q->inner_s;
}

/* Layer l's exchange of `parts` of own: the flat scan or the gateways'. */
static int exchange(sf_seq *q, int l, int phase, int parts, seq_pending *t)
{
    if (q->flat) return seq_scan_flat(q, phase, &q->own, parts, t);
    return q->tree ? seq_scan_tree(q, phase, &q->own, parts) : seq_scan(q, l, phase, &q->own, parts);
}

/* Layer l over the chunk, the scan way. */
static int scan_layer(sf_seq *q, int l, int segments, int last_rows, float *x)
{
    block *b = q->b;
    const sf_model_config *c = b->cfg;
    const layer_weights *w = &b->weights[l];
    const size_t seg_rows = (size_t)q->N * q->W, ml_floats = SF_ATTENTION_ML_FLOATS(q->N, q->H);
    double t0 = seq_now_s(), inner0 = q->inner_s;
    /* the flat scan: a slot for this layer's round totals */
    seq_pending *t = NULL;
    int rc = q->flat ? seq_totals_reserve(q, l, &t) : SF_OK;
    account(q, &t0, &inner0, &q->stats.exchange_s);
    q->attn_done = 0, q->attn_segments = segments, q->attn_last_rows = last_rows;
    /* the projections, z's increments, the summary tokens; the linear rule's map */
    seq_msg_identity(q, &q->own);
    for (int s = 0; s < segments && rc == SF_OK; s++) {
        const int n = s == segments - 1 ? last_rows : q->N;
        float *xs = x + (size_t)s * q->N * q->D;
        float *qs = q->cqkv + 3 * s * seg_rows, *ks = qs + seg_rows, *vs = ks + seg_rows;
        rc = sf_be_qkv(b->be, n, q->D, q->W, xs, w->attn_norm, c->norm_eps, w->wq, w->wk, w->wv, SF_DTYPE_F32, qs, ks,
                       vs, b->act.u);
        float *zi = q->zinc + (size_t)s * q->hd, *sks = q->csk + s * seg_rows, *Ps = q->cP + (size_t)s * q->hdd;
        if (rc == SF_OK && q->kind != SF_MEMORY_NONE) sf_memory_sigma(n, q->H, q->d, q->W, ks, sks, zi);
        if (rc == SF_OK && q->kind == SF_MEMORY_LINEAR) {
            rc = sf_memory_map_parts(q->kind, n, q->H, q->d, q->W, sks, vs, NULL, Ps, NULL, q->o.threads);
            if (rc == SF_OK) rc = sf_memory_map_then_parts(q->kind, q->H, q->d, Ps, NULL, NULL, q->own.B);
        }
        for (size_t i = 0; i < q->hd && rc == SF_OK && q->kind != SF_MEMORY_NONE; i++) q->own.z[i] += zi[i];
        q->ctok[s] = 0;
        if (rc == SF_OK && q->G && q->S) { /* kept for the walk's commit */
            float *tk = q->ctk + (size_t)s * q->S * q->W, *tv = q->ctv + (size_t)s * q->S * q->W;
            rc = b->be->ops->summary(b->be, n, q->N, q->S, q->W, q->W, SF_DTYPE_F32, ks, vs, tk, tv, &q->ctok[s]);
            if (rc == SF_OK) seq_tail_append(q, q->own.tk, q->own.tv, &q->own.cnt, tk, tv, q->ctok[s]);
        }
    }
    int parts0, mem_parts;
    seq_parts(q, &parts0, &mem_parts);
    if (rc == SF_OK) rc = seq_msg_canon(q, &q->own, parts0, NULL, NULL);
    account(q, &t0, &inner0, &q->stats.compute_s);
    /* while the messages travel, the chunk's attention branches (block_seq_scan.c) */
    if (rc == SF_OK) rc = exchange(q, l, 0, parts0, t);
    account(q, &t0, &inner0, &q->stats.exchange_s);
    if (rc == SF_OK) rc = work_from(q, l, &q->pre, mem_parts);
    if (rc == SF_OK && !q->flat) rc = seq_state_then(q, l, &q->tot, mem_parts);
    if (rc == SF_OK && q->kind == SF_MEMORY_DELTA) {
        /* the z of the walk at each segment, then the delta map of the chunk */
        memcpy(q->zwalk, q->work->z + (size_t)l * q->hd, q->hd * sizeof(float));
        seq_msg_identity(q, &q->own);
        for (int s = 0; s < segments && rc == SF_OK; s++) {
            const int n = s == segments - 1 ? last_rows : q->N;
            float *Ps = q->cP + (size_t)s * q->hdd, *Gs = q->cG + (size_t)s * q->hdd;
            rc = sf_memory_map_parts(SF_MEMORY_DELTA, n, q->H, q->d, q->W, q->csk + s * seg_rows,
                                     q->cqkv + (3 * s + 2) * seg_rows, q->zwalk, Ps, Gs, q->o.threads);
            if (rc == SF_OK) rc = sf_memory_map_then_parts(SF_MEMORY_DELTA, q->H, q->d, Ps, Gs, q->own.A, q->own.B);
            for (size_t i = 0; i < q->hd; i++) q->zwalk[i] += q->zinc[(size_t)s * q->hd + i];
        }
        if (rc == SF_OK) rc = seq_msg_canon(q, &q->own, PART_A | PART_B, NULL, NULL);
        account(q, &t0, &inner0, &q->stats.compute_s);
        /* the z parts were applied above: this exchange moves only the maps */
        if (rc == SF_OK) rc = exchange(q, l, 1, PART_A | PART_B, t);
        account(q, &t0, &inner0, &q->stats.exchange_s);
        if (rc == SF_OK) rc = work_memory_from(q, l, q->pre.A, q->pre.B);
        if (rc == SF_OK && !q->flat) /* the flat scan's total comes in later (seq_totals_open) */
            rc = sf_memory_map_apply(q->H, q->d, q->tot.A, q->tot.B, q->SM + (size_t)l * q->hdd);
    }
    /* the branches no wait covered, then the walk: each segment's layer from the exact state at
     * its start, its branches and its commit (the map's products, the summary tokens) given */
    if (rc == SF_OK) rc = seq_attention_rest(q);
    for (int s = 0; s < segments && rc == SF_OK; s++) {
        const int n = s == segments - 1 ? last_rows : q->N;
        float *keep = b->x;
        b->x = x + (size_t)s * q->N * q->D;
        b->attn_acc = q->cacc + s * seg_rows, b->attn_ml = q->cml + s * ml_floats;
        const block_commit_given given = {.P = q->cP + (size_t)s * q->hdd, .G = q->cG + (size_t)s * q->hdd,
                                          .z_inc = q->zinc + (size_t)s * q->hd, .tk = q->ctk + (size_t)s * q->S * q->W,
                                          .tv = q->ctv + (size_t)s * q->S * q->W, .tokens = q->ctok[s]};
        b->commit_given = &given;
        rc = sf_block_layer(b, q->work, l, n, 1, (unsigned char *)(q->cqkv + 3 * s * seg_rows));
        b->x = keep, b->attn_acc = b->attn_ml = NULL, b->commit_given = NULL;
        if (rc == SF_OK) rc = check_rows(q, x + (size_t)s * q->N * q->D, (size_t)n, l, s);
    }
    account(q, &t0, &inner0, &q->stats.compute_s);
    /* the flat scan's round totals: folded from now on, as the later ranks' messages arrive */
    if (rc == SF_OK && q->flat) rc = seq_totals_open(q, t);
    account(q, &t0, &inner0, &q->stats.exchange_s);
    return rc;
}

/* Layer l's part of the work state as a message of floats: M, z, tokens (ring), count, head. */
static size_t handoff_floats(const sf_seq *q) { return q->hdd + q->hd + 2 * (size_t)q->G * q->W + 2; }

static int handoff_io(sf_seq *q, int l, int peer, int send)
{
    stream_state *w = q->work;
    const size_t n = handoff_floats(q), row = (size_t)q->W;
    float *buf = malloc(n * sizeof *buf);
    if (!buf) return sf_error(SF_E_NOMEM, "out of memory");
    float *p = buf;
    float *parts[4] = {w->M + (size_t)l * q->hdd, w->z + (size_t)l * q->hd, w->gk + (size_t)l * q->G * row,
                       w->gv + (size_t)l * q->G * row};
    const size_t sizes[4] = {q->hdd, q->hd, (size_t)q->G * row, (size_t)q->G * row};
    int rc = SF_OK;
    const int across = q->group_of[peer] != q->group_of[q->rank];
    if (send) {
        for (int i = 0; i < 4; i++) memcpy(p, parts[i], sizes[i] * sizeof *p), p += sizes[i];
        memcpy(p, &w->g_count[l], sizeof(int)), memcpy(p + 1, &w->g_head[l], sizeof(int));
        rc = sf_comm_send_tagged(q->comm, buf, n, SF_DTYPE_F32, peer, 0, 1);
        if (across) q->stats.sent_across += n * 4;
        else q->stats.sent_within += n * 4;
    } else {
        const double t0 = seq_now_s();
        rc = sf_comm_recv_tagged(q->comm, buf, n, SF_DTYPE_F32, peer, 1);
        *(peer < q->rank ? &q->stats.blocked_before_s : &q->stats.blocked_after_s) += seq_now_s() - t0;
        for (int i = 0; rc == SF_OK && i < 4; i++) memcpy(parts[i], p, sizes[i] * sizeof *p), p += sizes[i];
        if (rc == SF_OK) memcpy(&w->g_count[l], p, sizeof(int)), memcpy(&w->g_head[l], p + 1, sizeof(int));
        if (rc == SF_OK && (w->g_count[l] < 0 || w->g_count[l] > q->G || w->g_head[l] < 0 ||
                            (q->G && w->g_head[l] >= q->G) || (!q->G && w->g_head[l]))) 
            rc = sf_error(SF_E_COMM, "sequence hand-off: rank %d sent a malformed state", peer);
        if (across) q->stats.received_across += n * 4;
        else q->stats.received_within += n * 4;
    }
    free(buf);
    return rc;
}

/* The work state's layer l into the round state (hand-off: for a save). */
static void state_from_work(sf_seq *q, int l)
{
    const stream_state *w = q->work;
    const size_t row = (size_t)q->W;
    for (size_t i = 0; i < q->hdd; i++) q->SM[(size_t)l * q->hdd + i] = w->M[(size_t)l * q->hdd + i];
    for (size_t i = 0; i < q->hd; i++) q->Sz[(size_t)l * q->hd + i] = w->z[(size_t)l * q->hd + i];
    if (q->G) {
        memcpy(q->Sgk + (size_t)l * q->G * row, w->gk + (size_t)l * q->G * row, (size_t)q->G * row * sizeof(float));
        memcpy(q->Sgv + (size_t)l * q->G * row, w->gv + (size_t)l * q->G * row, (size_t)q->G * row * sizeof(float));
    }
    q->Scount[l] = w->g_count[l], q->Shead[l] = w->g_head[l];
}

/* The round state's layer l into the work state, exactly (a start or a restore). */
static void work_from_state(sf_seq *q, int l)
{
    stream_state *w = q->work;
    const size_t row = (size_t)q->W;
    for (size_t i = 0; i < q->hdd; i++) w->M[(size_t)l * q->hdd + i] = (float)q->SM[(size_t)l * q->hdd + i];
    for (size_t i = 0; i < q->hd; i++) w->z[(size_t)l * q->hd + i] = (float)q->Sz[(size_t)l * q->hd + i];
    if (q->G) {
        memcpy(w->gk + (size_t)l * q->G * row, q->Sgk + (size_t)l * q->G * row, (size_t)q->G * row * sizeof(float));
        memcpy(w->gv + (size_t)l * q->G * row, q->Sgv + (size_t)l * q->G * row, (size_t)q->G * row * sizeof(float));
    }
    w->g_count[l] = q->Scount[l], w->g_head[l] = q->Shead[l];
}

static int handoff_layer(sf_seq *q, int l, int segments, int last_rows, float *x, int last_round)
{
    const int prev = q->rank > 0 ? q->rank - 1 : q->ranks - 1, next = (q->rank + 1) % q->ranks;
    int rc = SF_OK;
    double t0 = seq_now_s();
    if (q->rank == 0 && q->rounds == 0) work_from_state(q, l);
    else if (q->ranks > 1) rc = handoff_io(q, l, prev, 0);
    q->stats.exchange_s += seq_now_s() - t0, t0 = seq_now_s();
    for (int s = 0; s < segments && rc == SF_OK; s++) {
        const int n = s == segments - 1 ? last_rows : q->N;
        float *keep = q->b->x;
        q->b->x = x + (size_t)s * q->N * q->D;
        rc = sf_block_layer(q->b, q->work, l, n, 1, NULL);
        q->b->x = keep;
        if (rc == SF_OK) rc = check_rows(q, x + (size_t)s * q->N * q->D, (size_t)n, l, s);
    }
    q->stats.compute_s += seq_now_s() - t0, t0 = seq_now_s();
    const int last_rank = q->rank == q->ranks - 1;
    if (rc == SF_OK && last_rank) state_from_work(q, l);
    if (rc == SF_OK && q->ranks > 1 && !(last_rank && last_round)) rc = handoff_io(q, l, next, 1);
    q->stats.exchange_s += seq_now_s() - t0;
    return rc;
}

int sf_seq_round(sf_seq *q, int segments, int last_rows, float *x, int last_round)
{
    if (segments < 0 || (segments > 0 && (last_rows < 1 || last_rows > q->N) ) || (segments > 0 && !x))
        return sf_error(SF_E_INVAL, "sequence round: %d segments, the last of %d rows", segments, last_rows);
    int rc = ensure_chunk(q, segments > 0 ? segments : 1);
    for (int l = 0; l < q->L && rc == SF_OK; l++)
        rc = q->o.exchange == SF_SEQ_HANDOFF ? handoff_layer(q, l, segments, last_rows, x, last_round)
                                             : scan_layer(q, l, segments, last_rows, x);
    /* the stream's end: every total in (no message left in flight, the state complete) */
    if (rc == SF_OK && last_round) rc = seq_totals_drain(q);
    if (rc == SF_OK) q->rounds++;
    else sf_comm_abort(q->comm, sf_last_error());
    return rc;
}

void sf_seq_stats_get(const sf_seq *q, sf_seq_stats *out) { *out = q->stats; }

/* ---- create, free, save, restore --------------------------------------------------------- */

int sf_seq_create(const sf_model *m, sf_backend *be, sf_comm *comm, const sf_seq_options *o, sf_seq **out)
{
    *out = NULL;
    if (!m || !be || !comm) return sf_error(SF_E_INVAL, "sequence parallelism needs a model, a backend and ranks");
    if (strcmp(be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "sequence parallelism runs on the cpu backend (not %s)", be->ops->name);
    sf_seq *q = calloc(1, sizeof *q);
    if (!q) return sf_error(SF_E_NOMEM, "out of memory");
    const sf_model_config *c = sf_model_get_config(m);
    q->o = o ? *o : (sf_seq_options){0};
    q->comm = comm, q->rank = comm->rank, q->ranks = comm->size;
    q->L = c->layers, q->H = c->heads, q->d = c->head_dim, q->W = c->heads * c->head_dim, q->G = c->global_tokens;
    q->S = c->global_tokens ? c->summary_tokens : 0, q->N = c->segment, q->D = c->dim, q->kind = c->memory;
    q->hd = (size_t)q->H * q->d, q->hdd = q->hd * q->d;
    int rc = SF_OK;
    q->group_of = calloc((size_t)q->ranks, sizeof *q->group_of);
    q->gateway_of_group = calloc((size_t)q->ranks, sizeof *q->gateway_of_group);
    if (!q->group_of || !q->gateway_of_group) rc = sf_error(SF_E_NOMEM, "out of memory");
    for (int r = 0; rc == SF_OK && r < q->ranks; r++) {
        q->group_of[r] = o && o->group_of ? o->group_of[r] : 0;
        const int prev = r ? q->group_of[r - 1] : -1;
        if (q->group_of[r] != prev && q->group_of[r] != prev + 1)
            rc = sf_error(SF_E_INVAL, "sequence parallelism: rank %d is in group %d after group %d (groups must hold "
                          "consecutive ranks, numbered from 0)", r, q->group_of[r], prev);
        else if (q->group_of[r] != prev)
            q->gateway_of_group[q->n_groups++] = r;
    }
    if (rc == SF_OK) q->gateway = q->gateway_of_group[q->group_of[q->rank]];
    q->flat = q->n_groups == 1 && q->ranks > 1 && q->ranks <= SF_SEQ_FLAT_RANKS;
    q->tree = q->n_groups == 1 && q->ranks > SF_SEQ_FLAT_RANKS;
    if (rc == SF_OK && q->o.federation && q->o.exchange != SF_SEQ_SCAN)
        rc = sf_error(SF_E_INVAL, "federation needs the scan exchange");
    /* the block: every layer, unsharded, without deferred commits */
    block *b = q->b = calloc(1, sizeof *q->b);
    if (rc == SF_OK && !b) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc == SF_OK) {
        b->cfg = c, b->be = be, b->first = 0, b->count = c->layers, b->batch = 1, b->host_rows = 1;
        b->check_finite = 0;
        sf_stream_table_init(&b->streams, 1, sf_block_stream_create, sf_block_stream_release, b);
        rc = sf_block_shard_plan(b, 0, 1);
    }
    if (rc == SF_OK) rc = sf_block_setup(b, m);
    if (rc == SF_OK && b->qkv_type != SF_DTYPE_F32)
        rc = sf_error(SF_E_UNSUPPORTED, "sequence parallelism needs float32 projections");
    if (rc == SF_OK && !(q->work = sf_block_stream_create(b, 0))) rc = SF_E_NOMEM;
    /* the round state, zero (SPEC 4, 5: a stream starts from nothing) */
    const size_t gw = (size_t)q->L * q->G * q->W + 1;
    if (rc == SF_OK) {
        q->SM = calloc((size_t)q->L * q->hdd + 1, sizeof *q->SM), q->Sz = calloc((size_t)q->L * q->hd + 1, sizeof *q->Sz);
        q->Sgk = calloc(gw, sizeof *q->Sgk), q->Sgv = calloc(gw, sizeof *q->Sgv);
        q->Scount = calloc((size_t)q->L, sizeof(int)), q->Shead = calloc((size_t)q->L, sizeof(int));
        if (!q->SM || !q->Sz || !q->Sgk || !q->Sgv || !q->Scount || !q->Shead) rc = sf_error(SF_E_NOMEM, "out of memory");
    }
    /* messages: own, tmp, acc, pre, tot */
    seq_msg *fixed[] = {&q->own, &q->tmp, &q->acc, &q->pre, &q->tot};
    for (size_t i = 0; rc == SF_OK && i < sizeof fixed / sizeof *fixed; i++) rc = seq_msg_alloc(q, fixed[i]);
    /* at a gateway its members', then 3 scratch; in the tree, a child's subtree per level */
    q->n_peer_msgs = q->ranks + 3;
    if (q->tree)
        for (q->n_peer_msgs = 0; (1 << q->n_peer_msgs) < q->ranks;) q->n_peer_msgs++;
    if (rc == SF_OK && !(q->peer_msgs = calloc((size_t)q->n_peer_msgs, sizeof *q->peer_msgs)))
        rc = sf_error(SF_E_NOMEM, "out of memory");
    for (int i = 0; rc == SF_OK && !q->flat && (q->tree || q->rank == q->gateway) && i < q->n_peer_msgs; i++)
        rc = seq_msg_alloc(q, &q->peer_msgs[i]);
    /* the flat scan: its round totals' slots */
    for (int i = 0; rc == SF_OK && q->flat && i < 2 * SEQ_PENDING; i++) rc = seq_msg_alloc(q, &q->pend[i / 2].tot[i % 2]);
    if (rc == SF_OK && q->o.tier.kind != SF_QUANT_F32) {
        if (sf_quant_encoded_size(&q->o.tier, q->hdd ? q->hdd : 1) == 0)
            rc = sf_error(SF_E_INVAL, "sequence parallelism: bad tier quantization (group %d)", q->o.tier.group);
        q->fbB = calloc(4 * (size_t)q->L, sizeof *q->fbB);
        if (rc == SF_OK && !q->fbB) rc = sf_error(SF_E_NOMEM, "out of memory");
        for (int i = 0; rc == SF_OK && i < 4 * q->L; i++) rc = sf_quant_feedback_init(&q->fbB[i], q->hdd);
    }
    if (rc != SF_OK) {
        sf_seq_free(q);
        return rc;
    }
    *out = q;
    return SF_OK;
}

void sf_seq_free(sf_seq *q)
{
    if (!q) return;
    if (q->b) {
        if (q->work) sf_block_stream_destroy(q->b, q->work);
        if (q->b->cfg && q->b->weights) sf_block_release(q->b);
        free(q->b);
    }
    seq_msg *fixed[] = {&q->own, &q->tmp, &q->acc, &q->pre, &q->tot};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) seq_msg_free(fixed[i]);
    for (int i = 0; q->peer_msgs && i < q->n_peer_msgs; i++) seq_msg_free(&q->peer_msgs[i]);
    for (int i = 0; i < 2 * SEQ_PENDING; i++) seq_msg_free(&q->pend[i / 2].tot[i % 2]);
    free(q->peer_msgs);
    for (int i = 0; q->fbB && i < 4 * q->L; i++) sf_quant_feedback_release(&q->fbB[i]);
    free(q->fbB);
    free(q->SM), free(q->Sz), free(q->Sgk), free(q->Sgv), free(q->Scount), free(q->Shead);
    free(q->cqkv), free(q->csk), free(q->zinc), free(q->zwalk), free(q->cacc), free(q->cml), free(q->wire);
    free(q->cP), free(q->cG), free(q->ctk), free(q->ctv), free(q->ctok);
    free(q->group_of), free(q->gateway_of_group);
    free(q);
}

/* Layout: "SQS1", u32 L, H, d, G, W, u32 rounds (informative), then per layer M (double
 * [H d d]), z (double [H d]), u32 count, u32 head, gk, gv (float [G W]); little-endian hosts. */
#define STATE_MAGIC 0x31535153u

int sf_seq_state_save(sf_seq *q, sf_buffer *out)
{
    const uint32_t head[7] = {STATE_MAGIC, (uint32_t)q->L, (uint32_t)q->H, (uint32_t)q->d, (uint32_t)q->G,
                              (uint32_t)q->W, (uint32_t)q->rounds};
    int rc = seq_totals_drain(q);
    if (rc == SF_OK) rc = sf_buffer_append(out, head, sizeof head);
    const size_t gw = (size_t)q->G * q->W;
    for (int l = 0; l < q->L && rc == SF_OK; l++) {
        const uint32_t ring[2] = {(uint32_t)q->Scount[l], (uint32_t)q->Shead[l]};
        rc = sf_buffer_append(out, q->SM + (size_t)l * q->hdd, q->hdd * sizeof(double));
        if (rc == SF_OK) rc = sf_buffer_append(out, q->Sz + (size_t)l * q->hd, q->hd * sizeof(double));
        if (rc == SF_OK) rc = sf_buffer_append(out, ring, sizeof ring);
        if (rc == SF_OK && gw) rc = sf_buffer_append(out, q->Sgk + l * gw, gw * sizeof(float));
        if (rc == SF_OK && gw) rc = sf_buffer_append(out, q->Sgv + l * gw, gw * sizeof(float));
    }
    return rc;
}

int sf_seq_state_restore(sf_seq *q, const uint8_t *data, size_t len)
{
    uint32_t head[7];
    const size_t gw = (size_t)q->G * q->W;
    const size_t want = sizeof head + (size_t)q->L * (q->hdd * 8 + q->hd * 8 + 8 + 2 * gw * 4);
    if (len < sizeof head) return sf_error(SF_E_STATE, "sequence state: %zu bytes", len);
    int rc = seq_totals_drain(q); /* nothing may land on the state restored */
    if (rc != SF_OK) return rc;
    memcpy(head, data, sizeof head);
    if (head[0] != STATE_MAGIC || head[1] != (uint32_t)q->L || head[2] != (uint32_t)q->H || head[3] != (uint32_t)q->d ||
        head[4] != (uint32_t)q->G || head[5] != (uint32_t)q->W || len != want)
        return sf_error(SF_E_STATE, "sequence state: saved for another model (or damaged: %zu bytes, %zu expected)", len,
                        want);
    const uint8_t *p = data + sizeof head;
    for (int l = 0; l < q->L; l++) {
        uint32_t ring[2];
        memcpy(q->SM + (size_t)l * q->hdd, p, q->hdd * 8), p += q->hdd * 8;
        memcpy(q->Sz + (size_t)l * q->hd, p, q->hd * 8), p += q->hd * 8;
        memcpy(ring, p, sizeof ring), p += sizeof ring;
        if (ring[0] > (uint32_t)q->G || (q->G ? ring[1] >= (uint32_t)q->G : ring[1] != 0))
            return sf_error(SF_E_STATE, "sequence state: layer %d's tokens are malformed", l);
        q->Scount[l] = (int)ring[0], q->Shead[l] = (int)ring[1];
        if (gw) memcpy(q->Sgk + l * gw, p, gw * 4), p += gw * 4;
        if (gw) memcpy(q->Sgv + l * gw, p, gw * 4), p += gw * 4;
    }
    q->rounds = 0;
    return SF_OK;
}
