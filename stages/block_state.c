/* The block stage's per-stream state (stages/block_state.h): M, z and the global-token FIFO of
 * every layer, on the backend; created when a stream first appears, kept for reuse when it ends,
 * under a state_budget held in a state store between packets, and serialized for checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "stages/block_state.h"

float *sf_block_upload(block *b, const float *host, size_t n, int *rc)
{
    if (*rc != SF_OK) return NULL;
    float *dev = b->be->ops->alloc(b->be, n * sizeof(float));
    if (!dev) {
        *rc = sf_error(SF_E_NOMEM, "out of memory for %zu weights", n);
        return NULL;
    }
    if (host) *rc = b->be->ops->upload(b->be, dev, host, n * sizeof(float));
    return dev;
}

/* this rank's heads (all of them unsharded) */
static size_t state_floats_M(const block *b) { return (size_t)b->count * b->heads * b->cfg->head_dim * b->cfg->head_dim; }
static size_t state_floats_z(const block *b) { return (size_t)b->count * b->heads * b->cfg->head_dim; }
static size_t state_floats_g(const block *b) { return (size_t)b->count * b->cfg->global_tokens * b->width; }

void sf_block_stream_destroy(void *ctx, void *state)
{
    block *b = ctx;
    stream_state *s = state;
    if (!s) return;
    b->be->ops->free(b->be, s->M);
    b->be->ops->free(b->be, s->z);
    b->be->ops->free(b->be, s->gk);
    b->be->ops->free(b->be, s->gv);
    free(s->g_count);
    free(s->g_head);
    free(s);
}

/* A saved global-token ring (count and head per layer) that fits this block's FIFO. */
static int check_ring(const block *b, const int *count, const int *head)
{
    const int G = b->cfg->global_tokens;
    for (int l = 0; l < b->count; l++)
        if (count[l] < 0 || count[l] > G || head[l] < 0 || head[l] >= (G ? G : 1))
            return sf_error(SF_E_STATE, "block state has an invalid global-token ring");
    return SF_OK;
}

/* A new stream's state: memory zero, global-token FIFO empty (SPEC 4 and 5). */
static int stream_reset(block *b, stream_state *s)
{
    memset(s->g_count, 0, (size_t)b->count * sizeof(int));
    memset(s->g_head, 0, (size_t)b->count * sizeof(int));
    int rc = b->be->ops->zero(b->be, s->M, state_floats_M(b) * sizeof(float));
    if (rc == SF_OK) rc = b->be->ops->zero(b->be, s->z, state_floats_z(b) * sizeof(float));
    /* FIFO slots not filled yet are never read, but saved and quantized: zero, not garbage */
    if (rc == SF_OK) rc = b->be->ops->zero(b->be, s->gk, state_floats_g(b) * sizeof(float));
    if (rc == SF_OK) rc = b->be->ops->zero(b->be, s->gv, state_floats_g(b) * sizeof(float));
    return rc;
}

/* The stream table's destroy: keeps a few states for reuse (see block.spare). */
void sf_block_stream_release(void *ctx, void *state)
{
    block *b = ctx;
    if (state && b->n_spare < (int)(sizeof b->spare / sizeof *b->spare))
        b->spare[b->n_spare++] = state;
    else
        sf_block_stream_destroy(b, state);
}

void *sf_block_stream_create(void *ctx, uint64_t stream)
{
    block *b = ctx;
    (void)stream;
    if (b->n_spare > 0) {
        stream_state *s = b->spare[--b->n_spare];
        if (stream_reset(b, s) == SF_OK) return s;
        sf_block_stream_destroy(b, s);
        return NULL;
    }
    stream_state *s = calloc(1, sizeof *s);
    if (!s) {
        sf_error(SF_E_NOMEM, "out of memory");
        return NULL;
    }
    int rc = SF_OK;
    s->M = sf_block_upload(b, NULL, state_floats_M(b) + 1, &rc);
    s->z = sf_block_upload(b, NULL, state_floats_z(b) + 1, &rc);
    s->gk = sf_block_upload(b, NULL, state_floats_g(b) + 1, &rc);
    s->gv = sf_block_upload(b, NULL, state_floats_g(b) + 1, &rc);
    s->g_count = calloc((size_t)b->count, sizeof(int));
    s->g_head = calloc((size_t)b->count, sizeof(int));
    if (rc == SF_OK && (!s->g_count || !s->g_head)) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc == SF_OK) rc = stream_reset(b, s);
    if (rc != SF_OK) {
        sf_block_stream_destroy(b, s);
        return NULL;
    }
    return s;
}

/* ---- the state store (state_budget=): state/state_store.h ---------------------------- */

static size_t state_floats(const block *b)
{
    return state_floats_M(b) + state_floats_z(b) + 2 * state_floats_g(b);
}

static size_t ring_bytes(const block *b) { return 2 * (size_t)b->count * sizeof(int); }

/* Copies between a stream's backend buffers and b->host (M | z | gk | gv). */
static int state_transfer(block *b, stream_state *s, int to_host)
{
    const sf_backend_ops *ops = b->be->ops;
    float *dev[4] = {s->M, s->z, s->gk, s->gv};
    size_t n[4] = {state_floats_M(b), state_floats_z(b), state_floats_g(b), state_floats_g(b)};
    float *host = b->host;
    int rc = SF_OK;
    for (int i = 0; i < 4 && rc == SF_OK; host += n[i], i++) {
        if (!n[i]) continue;
        rc = to_host ? ops->download(b->be, host, dev[i], n[i] * sizeof(float))
                     : ops->upload(b->be, dev[i], host, n[i] * sizeof(float));
    }
    return rc;
}

/* Makes b->work hold stream's state: from the store, or zero for a stream it has not seen. */
int sf_block_state_load(block *b, uint64_t stream)
{
    stream_state *s = b->work;
    if (b->work_current && b->work_stream == stream) return SF_OK;
    b->work_current = 0;
    size_t rings = (size_t)b->count * sizeof(int);
    if (!sf_state_store_contains(b->store, stream)) return stream_reset(b, s);
    sf_state_span span = {b->host, state_floats(b)};
    int rc = sf_state_store_get(b->store, stream, &span, 1, b->ring, ring_bytes(b), NULL);
    if (rc != SF_OK) return rc;
    memcpy(s->g_count, b->ring, rings);
    memcpy(s->g_head, b->ring + b->count, rings);
    return state_transfer(b, s, 0);
}

/* Puts b->work back as stream's state after a committed segment. */
int sf_block_state_put_back(block *b, uint64_t stream)
{
    stream_state *s = b->work;
    size_t rings = (size_t)b->count * sizeof(int);
    int rc = state_transfer(b, s, 1);
    memcpy(b->ring, s->g_count, rings);
    memcpy(b->ring + b->count, s->g_head, rings);
    sf_state_span span = {b->host, state_floats(b)};
    if (rc == SF_OK) rc = sf_state_store_put(b->store, stream, &span, 1, b->ring, ring_bytes(b));
    b->work_stream = stream;
    b->work_current = rc == SF_OK;
    return rc;
}

/* state_quant and state_group were checked one by one against the option table; what is left
 * is how they go together. */
static int parse_state_quant(const char *text, long long group, sf_quant_params *out)
{
    sf_quant_kind kind;
    int rc = sf_quant_kind_parse(text, &kind);
    if (rc != SF_OK) return rc;
    if (kind == SF_QUANT_INT4 && group % 2)
        return sf_error(SF_E_OPTION, "state_group=%lld must be even for int4", group);
    *out = (sf_quant_params){kind, (int)group};
    return SF_OK;
}

int sf_block_store_init(sf_stage *st, block *b)
{
    long long budget = sf_stage_option_int(st, "state_budget");
    const char *spill = sf_stage_option(st, "spill");
    const char *quant = sf_stage_option(st, "state_quant"), *codec = sf_stage_option(st, "state_codec");
    sf_quant_params qp;
    sf_codec cp;
    int rc = parse_state_quant(quant, sf_stage_option_int(st, "state_group"), &qp);
    if (rc == SF_OK) rc = sf_codec_parse(codec, &cp);
    if (rc != SF_OK) return rc;
    if (budget == 0) {
        if (spill && *spill) return sf_error(SF_E_OPTION, "spill=%s needs a state_budget", spill);
        /* without a store every state stays live and exact: a lossy request would be ignored */
        if (qp.kind != SF_QUANT_F32) return sf_error(SF_E_OPTION, "state_quant=%s needs a state_budget", quant);
        return SF_OK;
    }
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = (size_t)budget;
    cfg.spill_dir = spill;
    cfg.quant = qp;
    cfg.codec = cp;
    cfg.fsync = sf_stage_option_bool(st, "spill_sync");
    rc = sf_state_store_create(&cfg, &b->store);
    if (rc != SF_OK) return rc;
    b->work = sf_block_stream_create(b, 0);
    b->host = malloc((state_floats(b) + 1) * sizeof(float));
    b->ring = calloc(2 * (size_t)b->count, sizeof(int));
    if (!b->work || !b->host || !b->ring) return sf_error(SF_E_NOMEM, "out of memory");
    return SF_OK;
}

typedef struct store_save_ctx {
    block *b;
    sf_buffer *out;
} store_save_ctx;

/* One stream in block_save's layout: id, M, z, g_count, g_head, gk, gv. */
static int save_stored_stream(void *ctx, uint64_t stream)
{
    store_save_ctx *c = ctx;
    block *b = c->b;
    sf_state_span span = {b->host, state_floats(b)};
    size_t mz = state_floats_M(b) + state_floats_z(b);
    int rc = sf_state_store_get(b->store, stream, &span, 1, b->ring, ring_bytes(b), NULL);
    if (rc == SF_OK) rc = sf_buffer_append(c->out, &stream, sizeof stream);
    if (rc == SF_OK) rc = sf_buffer_append(c->out, b->host, mz * sizeof(float));
    if (rc == SF_OK) rc = sf_buffer_append(c->out, b->ring, ring_bytes(b));
    if (rc == SF_OK)
        rc = sf_buffer_append(c->out, b->host + mz, 2 * state_floats_g(b) * sizeof(float));
    return rc;
}

static int save_store(block *b, sf_buffer *out)
{
    sf_state_store_stats stats;
    sf_state_store_get_stats(b->store, &stats);
    uint32_t head[3] = {(uint32_t)stats.streams, (uint32_t)b->first, (uint32_t)b->count};
    int rc = sf_buffer_append(out, head, sizeof head);
    store_save_ctx c = {b, out};
    return rc == SF_OK ? sf_state_store_foreach(b->store, save_stored_stream, &c) : rc;
}

/* Streams of block_save's layout (already size-checked) into the store. */
static int restore_store(block *b, uint32_t streams, const uint8_t *at)
{
    size_t mz = state_floats_M(b) + state_floats_z(b), g2 = 2 * state_floats_g(b);
    sf_state_store_clear(b->store);
    b->work_current = 0;
    for (uint32_t i = 0; i < streams; i++) {
        uint64_t id;
        memcpy(&id, at, 8);
        at += 8;
        memcpy(b->host, at, mz * sizeof(float));
        at += mz * sizeof(float);
        memcpy(b->ring, at, ring_bytes(b));
        at += ring_bytes(b);
        memcpy(b->host + mz, at, g2 * sizeof(float));
        at += g2 * sizeof(float);
        int rc = check_ring(b, b->ring, b->ring + b->count);
        if (rc != SF_OK) return rc;
        sf_state_span span = {b->host, state_floats(b)};
        rc = sf_state_store_put(b->store, id, &span, 1, b->ring, ring_bytes(b));
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}

/* State: u32 streams, u32 first layer, u32 layer count; per stream: u64 id, then M, z,
 * g_count, g_head, gk, gv of every layer (floats as stored). */
int sf_block_state_save(block *b, sf_buffer *out)
{
    if (b->store) return save_store(b, out);
    uint32_t head[3] = {(uint32_t)b->streams.count, (uint32_t)b->first, (uint32_t)b->count};
    int rc = sf_buffer_append(out, head, sizeof head);
    size_t nM = state_floats_M(b), nz = state_floats_z(b), ng = state_floats_g(b);
    size_t biggest = nM > ng ? nM : ng;
    float *tmp = malloc((biggest + 1) * sizeof(float));
    if (!tmp) return sf_error(SF_E_NOMEM, "out of memory");
    for (int i = 0; i < b->streams.count && rc == SF_OK; i++) {
        stream_state *s = b->streams.states[i];
        uint64_t id = b->streams.ids[i];
        rc = sf_buffer_append(out, &id, sizeof id);
        const float *parts[4] = {s->M, s->z, s->gk, s->gv};
        size_t sizes[4] = {nM, nz, ng, ng};
        for (int p = 0; p < 4 && rc == SF_OK; p++) {
            rc = b->be->ops->download(b->be, tmp, parts[p], sizes[p] * sizeof(float));
            if (rc == SF_OK) rc = sf_buffer_append(out, tmp, sizes[p] * sizeof(float));
            if (p == 1 && rc == SF_OK) {
                rc = sf_buffer_append(out, s->g_count, (size_t)b->count * sizeof(int));
                if (rc == SF_OK) rc = sf_buffer_append(out, s->g_head, (size_t)b->count * sizeof(int));
            }
        }
    }
    free(tmp);
    return rc;
}

int sf_block_state_restore(block *b, const uint8_t *data, size_t len)
{
    uint32_t head[3];
    if (len < sizeof head) return sf_error(SF_E_STATE, "block state is truncated");
    memcpy(head, data, sizeof head);
    if (head[1] != (uint32_t)b->first || head[2] != (uint32_t)b->count)
        return sf_error(SF_E_STATE, "block state is for layers %u..%u, this stage runs %d..%d", head[1],
                        head[1] + head[2] - 1, b->first, b->first + b->count - 1);
    size_t nM = state_floats_M(b), nz = state_floats_z(b), ng = state_floats_g(b);
    size_t per_stream = 8 + (nM + nz + 2 * ng) * sizeof(float) + 2 * (size_t)b->count * sizeof(int);
    if ((len - sizeof head) / per_stream < head[0] || (len - sizeof head) != per_stream * head[0])
        return sf_error(SF_E_STATE, "block state has the wrong size");
    if (b->store) return restore_store(b, head[0], data + sizeof head);
    b->late.count = 0; /* its streams' states are replaced wholesale */
    sf_stream_table_clear(&b->streams);
    const uint8_t *at = data + sizeof head;
    for (uint32_t i = 0; i < head[0]; i++) {
        uint64_t id;
        memcpy(&id, at, 8);
        at += 8;
        stream_state *s = sf_stream_table_get(&b->streams, id);
        if (!s) return SF_E_NOMEM;
        float *parts[4] = {s->M, s->z, s->gk, s->gv};
        size_t sizes[4] = {nM, nz, ng, ng};
        for (int p = 0; p < 4; p++) {
            int rc = b->be->ops->upload(b->be, parts[p], at, sizes[p] * sizeof(float));
            if (rc != SF_OK) return rc;
            at += sizes[p] * sizeof(float);
            if (p == 1) {
                memcpy(s->g_count, at, (size_t)b->count * sizeof(int));
                at += (size_t)b->count * sizeof(int);
                memcpy(s->g_head, at, (size_t)b->count * sizeof(int));
                at += (size_t)b->count * sizeof(int);
                rc = check_ring(b, s->g_count, s->g_head);
                if (rc != SF_OK) return rc;
            }
        }
    }
    return SF_OK;
}

void sf_block_state_free(block *b)
{
    sf_stream_table_clear(&b->streams);
    while (b->n_spare > 0) sf_block_stream_destroy(b, b->spare[--b->n_spare]);
    sf_state_store_free(b->store);
    sf_block_stream_destroy(b, b->work);
    free(b->host);
    free(b->ring);
}
