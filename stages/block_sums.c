/* The head-parallel ranks' sums after each layer's attention and MLP (stages/block_shard.h):
 * the output product and the MLP, each rank's part of them, and the sums of the parts, in
 * chunks of rows so that each chunk's sum runs beside the next chunk's work.
 *
 * Two forms. Float32 rows, or bf16 parts with products that norm their own input: the ranks
 * sum and every rank adds the sum to its rows (x), and the products read x. Normed (block.normed:
 * bf16 parts, products that take normed rows, sf_be_normed_type): each sum also norms the rows
 * for the product that follows (the MLP's norm after the attention's sum, the next layer's
 * attention norm after the MLP's), so the norm reads the rows where the add left them, and
 * the next layer's Q/K/V of a chunk starts as soon as that chunk's sum is in. Split (block.split:
 * the copy engines and peer access), each rank adds and norms only its slice of each chunk and
 * the normed rows travel instead; the segment's last sum brings the rows to rank 0. */
#include <stddef.h>

#include "kernels/backend_ext.h"
#include "kernels/comm.h"
#include "stages/block_sums.h"

/* x += W2 (silu(W1 u) * W3 u), u = rmsnorm(x): the MLP of layer l over `rows` rows at x, after
 * the wait for the side queue that commit_end left owed (the MLP's norm touches nothing the side
 * does, so the wait can sit in front of its products). Head-parallel, rank 0 adds its part to
 * the rows and the other ranks write theirs in their place: the all-reduce that follows
 * (output_and_mlp_rows) sums rows and parts. */
static int ffn(block *b, int l, float *x, int rows, int join_owed, void *part)
{
    const sf_model_config *c = b->cfg;
    const layer_weights *w = &b->weights[l];
    int rc = join_owed ? sf_be_side_join_before_product(b->be) : SF_OK;
    if (rc == SF_OK && b->rank == 0 && !part)
        rc = sf_be_ffn(b->be, rows, c->dim, b->hidden, x, w->mlp_norm, c->norm_eps, w->w1, w->w3, w->w2, b->act.u,
                       b->act.h1, b->act.h3);
    else if (rc == SF_OK)
        rc = sf_be_ffn_partial(b->be, rows, c->dim, b->hidden, x, w->mlp_norm, c->norm_eps, w->w1, w->w3, w->w2,
                               b->act.u, b->act.h1, b->act.h3, part ? b->part_type : SF_DTYPE_F32, part ? part : x);
    return rc;
}

/* With bf16 parts (block.part_type): rows [r0, ...) of act.part, where every rank writes its
 * part of the output product and of the MLP, and the sum of the parts goes to be added to x;
 * NULL where the ranks sum float32 x itself (rank 0 adds its part to the rows, the others
 * write theirs in their place), or unsharded. The warm-up, which runs before the communicator
 * exists and whose rows are thrown away, writes the parts too: their products get ready. */
static void *part_at(const block *b, int r0) { return b->act.part ? b->act.part + (size_t)r0 * b->cfg->dim * 2 : NULL; }

/* x += A Wo^T for rows [r0, r0 + nr), or this rank's part of it (see part_at) */
static int output_product(block *b, const layer_weights *w, int r0, int nr)
{
    const int D = b->cfg->dim, W = b->width;
    const size_t in_size = b->mix_type == SF_DTYPE_BF16 ? 2 : sizeof(float);
    const unsigned char *in = b->mix_type == SF_DTYPE_BF16 ? b->act.ao : (const unsigned char *)b->act.a;
    in += (size_t)r0 * W * in_size;
    void *part = part_at(b, r0);
    if (part) return sf_be_matmul_typed(b->be, nr, W, D, b->mix_type, in, W, w->wo, b->part_type, part, D, 0);
    return sf_be_matmul_typed(b->be, nr, W, D, b->mix_type, in, W, w->wo, SF_DTYPE_F32, b->x + (size_t)r0 * D, D,
                              b->rank == 0);
}

/* The sum of rows [r0, r0 + nr): the all-reduce of x, or the parts' sum added to x (see
 * part_at; sf_comm_reduce_add_*: by the copy engines where the ranks are GPUs of this process).
 * ticket NULL: done in order; else started beside the next work (reduce_end). */
static int reduce_start(block *b, int r0, int nr, int *ticket)
{
    const size_t count = (size_t)nr * b->cfg->dim;
    float *x = b->x + (size_t)r0 * b->cfg->dim;
    void *part = part_at(b, r0);
    if (!part)
        return ticket ? sf_comm_all_reduce_start(b->comm, x, count, SF_DTYPE_F32, ticket)
                      : sf_comm_all_reduce(b->comm, x, count, SF_DTYPE_F32);
    int own = 0;
    int rc = sf_comm_reduce_add_start(b->comm, part, count, b->part_type, ticket ? ticket : &own);
    if (rc == SF_OK && !ticket) rc = sf_comm_reduce_add_end(b->comm, own, x, part, count, b->part_type);
    return rc;
}

/* The end of reduce_start's sum `ticket`: the ops after it wait for it. */
static int reduce_end(block *b, int r0, int nr, int ticket)
{
    void *part = part_at(b, r0);
    if (!part) return sf_comm_join(b->comm, ticket);
    return sf_comm_reduce_add_end(b->comm, ticket, b->x + (size_t)r0 * b->cfg->dim, part, (size_t)nr * b->cfg->dim,
                                  b->part_type);
}

/* After the attention of layer l: x += A Wo^T, then the MLP; head-parallel, each followed by the
 * ranks' sum (the all-reduce of x plus every rank's part, or the bf16 parts' sum added to x).
 * In K chunks (block.chunks, head-parallel) each chunk's sum runs beside the next chunk's work:
 * the output product and the MLP are row by row, and only the next layer's attention needs
 * every row. */
static int output_and_mlp_rows(block *b, int l, int rows, int join_owed)
{
    const sf_model_config *c = b->cfg;
    const layer_weights *w = &b->weights[l];
    const int D = c->dim, mlp = c->mlp_hidden > 0;
    int chunks = b->comm && b->chunks > 1 ? b->chunks : 1;
    if (chunks > rows) chunks = rows;
    int rc = SF_OK;
    if (chunks <= 1) {
        rc = output_product(b, w, 0, rows);
        if (rc == SF_OK && b->comm) rc = reduce_start(b, 0, rows, NULL);
        if (rc == SF_OK && mlp) rc = ffn(b, l, b->x, rows, join_owed, part_at(b, 0));
        if (rc == SF_OK && mlp && b->comm) rc = reduce_start(b, 0, rows, NULL);
        return rc;
    }
    const int per = (rows + chunks - 1) / chunks;
    int ticket[2][SF_BLOCK_MAX_OVERLAP], n_chunks = 0;
    for (int r0 = 0; r0 < rows && rc == SF_OK; r0 += per, n_chunks++) {
        const int nr = rows - r0 < per ? rows - r0 : per;
        rc = output_product(b, w, r0, nr);
        if (rc == SF_OK) rc = reduce_start(b, r0, nr, &ticket[0][n_chunks]);
    }
    for (int j = 0; j < n_chunks && rc == SF_OK; j++) {
        const int r0 = j * per, nr = rows - r0 < per ? rows - r0 : per;
        rc = reduce_end(b, r0, nr, ticket[0][j]);
        if (rc == SF_OK && mlp) rc = ffn(b, l, b->x + (size_t)r0 * D, nr, join_owed && j == 0, part_at(b, r0));
        if (rc == SF_OK && mlp) rc = reduce_start(b, r0, nr, &ticket[1][j]);
    }
    for (int j = 0; j < n_chunks && rc == SF_OK && mlp; j++) {
        const int r0 = j * per, nr = rows - r0 < per ? rows - r0 : per;
        rc = reduce_end(b, r0, nr, ticket[1][j]);
    }
    return rc;
}

/* ---- normed sums ---------------------------------------------------------------------------- */

static unsigned char *normed_at(const block *b, int r0) { return b->act.un + (size_t)r0 * b->cfg->dim * 2; }

typedef struct sum_chunk sum_chunk; /* block_state.h: a chunk's sum */

static int sum_start(block *b, sum_chunk *s)
{
    return sf_comm_reduce_norm_start(b->comm, part_at(b, s->r0), s->nr, b->cfg->dim, b->part_type, &s->ticket);
}

/* The ends of n sums, normed by `norm` into act.un (NULL: the segment's last sums, the rows to
 * rank 0 where split), all issued before their joins: split, a rank adds and norms the next
 * chunk while the last one's normed rows travel. join_each: the caller joins each chunk itself
 * (sf_comm_reduce_norm_join) just before the work that reads it; else they are joined here. */
static int sums_end(block *b, const sum_chunk *s, int n, const float *norm, int join_each)
{
    const int D = b->cfg->dim;
    int rc = SF_OK;
    for (int j = 0; j < n && rc == SF_OK; j++)
        rc = sf_comm_reduce_norm_end(b->comm, s[j].ticket, b->x + (size_t)s[j].r0 * D, part_at(b, s[j].r0), s[j].nr, D,
                                     b->part_type, norm, b->cfg->norm_eps, norm ? normed_at(b, s[j].r0) : NULL);
    for (int j = 0; j < n && rc == SF_OK && !join_each; j++) rc = sf_comm_reduce_norm_join(b->comm, s[j].ticket);
    return rc;
}

int sf_block_first_rows(block *b, int rows)
{
    const sf_model_config *c = b->cfg;
    if (!b->comm) return SF_OK;
    if (!b->normed) return sf_comm_broadcast(b->comm, b->x, (size_t)rows * c->dim, SF_DTYPE_F32, 0);
    b->n_owed = 0;
    int rc = SF_OK, split = 0;
    /* rank 0 computes in the rows of each packet (run_one): the split sums' last copies go there */
    if (b->split) rc = sf_comm_reduce_norm_reserve(b->comm, rows, c->dim, b->part_type, b->x, b->act.un, 1, &split);
    /* every rank starts from rank 0's rows: split, rank 0 norms them and the others receive the
     * normed rows and the rows (the copy engines), else a broadcast and a norm */
    if (rc == SF_OK)
        rc = sf_comm_first_rows(b->comm, rows, c->dim, b->x, b->weights[0].attn_norm, c->norm_eps, b->act.un);
    return rc;
}

int sf_block_qkv_normed(block *b, int l, int rows, unsigned char *q, unsigned char *k, unsigned char *v)
{
    const layer_weights *w = &b->weights[l];
    const int D = b->cfg->dim, W = b->width;
    const size_t row = (size_t)W * b->qkv_size;
    const int owed = b->n_owed;
    b->n_owed = 0;
    /* chunk by chunk as the previous layer's MLP summed them: each chunk's products start
     * while the next chunk's rows travel */
    int rc = owed ? sums_end(b, b->owed, owed, w->attn_norm, 1) : SF_OK;
    for (int j = 0; j < (owed ? owed : 1) && rc == SF_OK; j++) {
        const int r0 = owed ? b->owed[j].r0 : 0, nr = owed ? b->owed[j].nr : rows;
        if (owed) rc = sf_comm_reduce_norm_join(b->comm, b->owed[j].ticket);
        if (rc == SF_OK)
            rc = sf_be_qkv_from(b->be, nr, D, W, normed_at(b, r0), w->wq, w->wk, w->wv, b->qkv_type, q + r0 * row,
                                k + r0 * row, v + r0 * row);
    }
    return rc;
}

/* output_and_mlp with normed sums. The layer's last sums stay owed to the next layer's Q/K/V
 * (block.owed), or end here in the block's last layer. */
static int output_and_mlp_normed(block *b, int l, int rows, int join_owed)
{
    const sf_model_config *c = b->cfg;
    const layer_weights *w = &b->weights[l];
    const int D = c->dim, mlp = c->mlp_hidden > 0, last = l + 1 == b->count;
    int chunks = b->chunks > 1 ? b->chunks : 1;
    if (chunks > rows) chunks = rows;
    const int per = (rows + chunks - 1) / chunks;
    sum_chunk s[SF_BLOCK_MAX_OVERLAP];
    int n = 0, rc = SF_OK;
    /* the previous segment's held packet goes on once this segment's first attention is issued */
    if (l == 0) rc = sf_block_emit_held(b);
    for (int r0 = 0; r0 < rows && rc == SF_OK; r0 += per, n++) {
        s[n].r0 = r0, s[n].nr = rows - r0 < per ? rows - r0 : per;
        rc = output_product(b, w, r0, s[n].nr);
        if (rc == SF_OK) rc = sum_start(b, &s[n]);
    }
    if (rc == SF_OK && mlp) rc = sums_end(b, s, n, w->mlp_norm, 1);
    for (int j = 0; j < n && rc == SF_OK && mlp; j++) {
        rc = sf_comm_reduce_norm_join(b->comm, s[j].ticket);
        if (rc == SF_OK && join_owed && j == 0) rc = sf_be_side_join_before_product(b->be);
        if (rc == SF_OK)
            rc = sf_be_ffn_partial_from(b->be, s[j].nr, D, b->hidden, normed_at(b, s[j].r0), w->w1, w->w3, w->w2,
                                        b->act.h1, b->act.h3, b->part_type, part_at(b, s[j].r0));
        if (rc == SF_OK) rc = sum_start(b, &s[j]);
    }
    if (rc != SF_OK) return rc;
    if (last) return sums_end(b, s, n, NULL, 0);
    for (int j = 0; j < n; j++) b->owed[j] = s[j];
    b->n_owed = n;
    return SF_OK;
}

int sf_block_output_and_mlp(block *b, int l, int rows, int join_owed)
{
    return b->normed ? output_and_mlp_normed(b, l, rows, join_owed) : output_and_mlp_rows(b, l, rows, join_owed);
}
