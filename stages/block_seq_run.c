/* Sequence parallelism over a whole stream (stages/block_seq.h): who holds which segments in
 * each round, the split balanced by the ranks' speed, and a rank's rounds from its tokens to
 * its rows. */
#include <stdlib.h>
#include <string.h>

#include "stages/block_seq_internal.h"


uint64_t sf_seq_plan_rounds(const sf_seq_plan *p)
{
    uint64_t per = 0;
    for (int r = 0; r < p->ranks; r++) per += (uint64_t)p->chunk[r];
    const uint64_t segments = (p->tokens + (uint64_t)p->N - 1) / (uint64_t)p->N;
    return per ? (segments + per - 1) / per : 0;
}

void sf_seq_plan_chunk(const sf_seq_plan *p, uint64_t round, int rank, uint64_t *first, int *count, int *last_rows)
{
    uint64_t per = 0, before = 0;
    for (int r = 0; r < p->ranks; r++) {
        if (r < rank) before += (uint64_t)p->chunk[r];
        per += (uint64_t)p->chunk[r];
    }
    const uint64_t segments = (p->tokens + (uint64_t)p->N - 1) / (uint64_t)p->N;
    const uint64_t start = round * per + before;
    *first = start;
    *count = 0;
    *last_rows = p->N;
    if (start >= segments) return;
    const uint64_t end = start + (uint64_t)p->chunk[rank] < segments ? start + (uint64_t)p->chunk[rank] : segments;
    *count = (int)(end - start);
    if (end == segments && p->tokens % (uint64_t)p->N) *last_rows = (int)(p->tokens % (uint64_t)p->N);
}

/* The next round's split: each rank's speed this round (its segments over its seconds of
 * computing, gathered so that every rank holds the same numbers), the round's total shared in
 * proportion, at least one segment each, what rounding leaves to the fastest. */
static int rebalance(sf_seq *q, const sf_seq_plan *p, int segments, double *computed)
{
    const double spent = q->stats.compute_s - *computed;
    *computed = q->stats.compute_s;
    float mine = segments > 0 && spent > 0 ? (float)(segments / spent) : 0.0f;
    float *speed = malloc((size_t)p->ranks * sizeof *speed);
    if (!speed) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = sf_comm_all_gather(q->comm, &mine, speed, 1, SF_DTYPE_F32);
    double sum = 0;
    int total = 0, fastest = 0, measured = 1;
    for (int r = 0; rc == SF_OK && r < p->ranks; r++) {
        total += p->chunk[r];
        if (!(speed[r] > 0)) measured = 0; /* a rank without a measure: the split stays */
        sum += speed[r];
        if (speed[r] > speed[fastest]) fastest = r;
    }
    if (rc == SF_OK && measured && total >= p->ranks) {
        int given = 0;
        for (int r = 0; r < p->ranks; r++) {
            int k = (int)((double)total * speed[r] / sum);
            p->chunk[r] = k < 1 ? 1 : k;
            given += p->chunk[r];
        }
        /* what rounding left (or took) goes to (or comes from) the fastest, never below 1 */
        p->chunk[fastest] += total - given;
        for (int r = 0; p->chunk[fastest] < 1 && r < p->ranks; r++)
            while (r != fastest && p->chunk[r] > 1 && p->chunk[fastest] < 1) p->chunk[r]--, p->chunk[fastest]++;
    }
    free(speed);
    return rc;
}

int sf_seq_run(sf_seq *q, const sf_model *m, const sf_seq_plan *p, uint64_t first_round, const sf_seq_io *io)
{
    const sf_model_config *c = sf_model_get_config(m);
    if (p->ranks != q->ranks || p->N != q->N)
        return sf_error(SF_E_INVAL, "sequence plan for %d ranks and segments of %d; the job has %d ranks, the model %d",
                        p->ranks, p->N, q->ranks, q->N);
    float *x = NULL;
    uint32_t *ids = NULL;
    size_t rows_max = 0;
    const float *table = sf_model_embedding(m), *norm = sf_model_final_norm(m);
    int rc = SF_OK;
    const uint64_t rounds = sf_seq_plan_rounds(p);
    double computed = q->stats.compute_s;
    for (uint64_t t = first_round; t < rounds && rc == SF_OK; t++) {
        uint64_t first;
        int count, last_rows;
        sf_seq_plan_chunk(p, t, q->rank, &first, &count, &last_rows);
        const size_t rows = count ? (size_t)(count - 1) * q->N + (size_t)last_rows : 0;
        const uint64_t pos = first * (uint64_t)q->N;
        if (rows > rows_max) { /* the chunk grew (a rebalance) or is the first */
            free(x), free(ids);
            rows_max = (size_t)count * q->N;
            x = malloc(rows_max * q->D * sizeof *x), ids = malloc(rows_max * sizeof *ids);
            if (!x || !ids) {
                rc = sf_error(SF_E_NOMEM, "out of memory for a chunk of %d segments", count);
                break;
            }
        }
        if (rows) rc = io->read(io->user, pos, rows, ids);
        for (size_t i = 0; i < rows && rc == SF_OK; i++) {
            if (ids[i] >= (uint32_t)c->vocab)
                rc = sf_error(SF_E_INVAL, "token %u at position %llu is outside the vocabulary of %d", ids[i],
                              (unsigned long long)(pos + i), c->vocab);
            else
                memcpy(x + i * q->D, table + (size_t)ids[i] * q->D, (size_t)q->D * sizeof *x);
        }
        if (rc == SF_OK) rc = sf_seq_round(q, count, last_rows, x, t + 1 == rounds);
        /* the final norm of SPEC 2, on every row the round produced */
        if (rc == SF_OK && rows && norm) rc = q->b->be->ops->rmsnorm(q->b->be, (int)rows, q->D, x, norm, c->norm_eps, x);
        if (rc == SF_OK && rows) rc = io->write(io->user, pos, rows, x);
        if (rc == SF_OK && p->balance && t + 1 < rounds) rc = rebalance(q, p, count, &computed);
        if (rc == SF_OK && io->round_done) rc = io->round_done(io->user, t, rounds);
    }
    if (rc != SF_OK) sf_comm_abort(q->comm, sf_last_error());
    free(x);
    free(ids);
    return rc;
}
