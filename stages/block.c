/* block: the attention block of SPEC 2 (RMSNorm, Q/K/V, dilated local attention merged with the
 * global tokens, compressive memory retrieval and gate, output projection, optional SwiGLU MLP),
 * then the memory and global-token updates of sections 4 and 5 when the segment commits.
 * One instance runs a contiguous range of layers (`layers=`), so a pipeline can spread layers
 * over several stage threads. Every buffer is sized for a full segment at init: nothing is
 * allocated per segment, and per-stream state is fixed-size. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_parts.h"
#include "kernels/backend_ext.h"
#include "kernels/comm.h"
#include "kernels/memory_map.h"
#include "stages/block_shard.h"
#include "stages/block_state.h"
#include "stages/block_sums.h"
#include "stages/head_procs.h"
#include "stages/stages.h"

static const sf_option block_options[] = {
    {.name = "layers", .type = SF_OPT_STRING, .default_value = "all", .help = "layers to run: all, K, or A-B (inclusive)"},
    {.name = "max_streams", .type = SF_OPT_INT, .default_value = "1024", .min = 1, .max = 1 << 20, .unit = "streams",
     .help = "streams that may be open at once"},
    {.name = "state_budget", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = INFINITY, .unit = "bytes",
     .help = "bytes of memory for the streams' state; idle streams are compressed, then spilled (0 = no limit)"},
    {.name = "spill", .type = SF_OPT_STRING,
     .help = "directory for state beyond state_budget (unset: exceeding it is an error)"},
    {.name = "spill_sync", .type = SF_OPT_BOOL, .default_value = "0",
     .help = "fsync each spill file (only needed if spills must survive a crash)"},
    {.name = "state_quant", .type = SF_OPT_STRING, .default_value = "f32", .choices = "f32|bf16|int8|int4|fp8|fp8_e4m3",
     .help = "how idle state is quantized: f32 (lossless), bf16, int8, int4 or fp8 (lossy)"},
    {.name = "state_group", .type = SF_OPT_INT, .default_value = "64", .min = 1, .max = 1 << 24, .unit = "values",
     .help = "values sharing one scale for int8/int4/fp8 state (even for int4)"},
    {.name = "state_codec", .type = SF_OPT_STRING, .default_value = "zstd", .choices = "zstd|lz4|raw",
     .help = "codec of idle state"},
    {.name = "batch", .type = SF_OPT_INT, .default_value = "1", .min = 1, .max = SF_BLOCK_MAX_BATCH, .unit = "streams",
     .help = "full segments of up to this many streams computed together: one product launch for all of them, batch "
             "times the activation memory"},
    {.name = "check_finite", .type = SF_OPT_BOOL, .default_value = "1",
     .help = "stop at the first NaN or infinity in the hidden rows, naming the layer, stream and position (CPU: after "
             "every layer; a GPU's rows on the GPU, where they leave it; the process-wide --check-finite 0 turns it off)"},
    {.name = "defer_commit", .type = SF_OPT_INT, .default_value = "2", .min = 0, .max = 2,
     .help = "GPU with a side queue: 0 commits each layer beside its own output product and MLP, 1 beside the next "
             "layer's attention, 2 also the last layer's beside the next segment's first",
     .env = "SEQFLOW_BLOCK_DEFER_COMMIT"},
    {.name = "heads_of", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = 256, .unit = "ranks",
     .help = "split each layer's heads and MLP over this many ranks (cpu: threads; cuda: one GPU each, NCCL); 0 = "
             "unsharded (stages/block_shard.c)"},
    {.name = "head_ranks", .type = SF_OPT_STRING,
     .help = "heads_of over processes of a distributed run: the job's ranks that hold the heads, e.g. 1,2; the stage "
             "runs on the first, the others follow it (stages/head_procs.h)"},
    {.name = "devices", .type = SF_OPT_STRING,
     .help = "heads_of on cuda: the GPU of each rank, e.g. 0,1 (default: the graph's GPU, then the next ones)"},
    {.name = "comm_timeout", .type = SF_OPT_INT, .default_value = "120000", .min = 1, .max = 86400000, .unit = "ms",
     .help = "heads_of: how long a rank waits for the others in a collective before the run fails"},
    {.name = "overlap", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = SF_BLOCK_MAX_OVERLAP,
     .unit = "chunks",
     .help = "heads_of: the rows after attention go through the output product, MLP and their sums in this many "
             "chunks, each chunk's sum beside the next chunk's work; 0 = the fastest measured: 2 on GPUs with "
             "heads_of >= 2, except 1 where NCCL sums bf16 parts; 1 on the CPU"},
    {.name = "reduce", .type = SF_OPT_STRING, .default_value = "auto", .choices = "auto|f32|nccl",
     .help = "heads_of: how the ranks' parts are summed; auto = in bf16 where the products are bf16 (precision bf16 "
             "or fp8 on a GPU: half the bytes), by the copy engines where the ranks are GPUs of this process with "
             "peer access and overlap <= 3, else by NCCL; nccl = bf16 parts by NCCL's all-reduce; f32 = float32 rows "
             "by all-reduce"},
    {.name = "inject_failure", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = 1 << 30, .unit = "segments",
     .help = "testing heads_of: the last rank fails after this many segments (0 = never)"},
    {0}};

static int parse_layers(const char *text, int layers, int *first, int *count)
{
    int a, b;
    char tail;
    if (!text || strcmp(text, "all") == 0) {
        *first = 0, *count = layers;
        return SF_OK;
    }
    if (sscanf(text, "%d-%d%c", &a, &b, &tail) == 2) {
    } else if (sscanf(text, "%d%c", &a, &tail) == 1) {
        b = a;
    } else {
        return sf_error(SF_E_OPTION, "layers=%s: expected all, K or A-B", text);
    }
    if (a < 0 || b < a || b >= layers)
        return sf_error(SF_E_OPTION, "layers=%s: the model has layers 0..%d", text, layers - 1);
    *first = a, *count = b - a + 1;
    return SF_OK;
}

/* Weight copies (bf16 on a GPU) made once here, and scratch for the widest product of a full
 * segment, so that no op allocates while streams run (both nothing on the CPU). */
static int prepare_backend(block *b)
{
    const sf_model_config *c = b->cfg;
    const int D = c->dim, W = b->width, F = b->hidden;
    int rc = SF_OK;
    for (int l = 0; l < b->count && rc == SF_OK; l++) {
        const layer_weights *w = &b->weights[l];
        /* Q, K, V as one group: with q, k, v one buffer apart (block_init) a GPU may run the
         * three products as one batched launch; W1 and W3 likewise multiply the same input */
        const float *wqkv[3] = {w->wq, w->wk, w->wv}, *w13[2] = {w->w1, w->w3};
        const float *wo = w->wo, *w2 = w->w2;
        rc = sf_be_prepare_weights(b->be, 3, wqkv, W, D);
        if (rc == SF_OK) rc = sf_be_prepare_weights(b->be, 1, &wo, D, W);
        if (rc == SF_OK && F) rc = sf_be_prepare_weights(b->be, 2, w13, F, D);
        if (rc == SF_OK && F) rc = sf_be_prepare_weights(b->be, 1, &w2, D, F);
    }
    int widest = D > W ? D : W;
    if (F > widest) widest = F;
    /* + G rows: a GPU backend stages the segment's K/V and the global tokens there for attention */
    if (rc == SF_OK) rc = sf_be_reserve(b->be, c->segment + c->global_tokens, widest, b->heads, c->head_dim);
    /* batched products take batch * N rows of at most D or W columns (no attention, no memory) */
    if (rc == SF_OK && b->batch > 1) rc = sf_be_reserve(b->be, c->segment * b->batch, D > W ? D : W, 0, 0);
    return rc;
}

/* block.defer_commit from defer_commit= (its row names the environment default): deferred only where a
 * side queue exists, there is a next layer in this block and an MLP to make the side worth it
 * (layer_forward), and there is something to commit. The cost is a second q/k/v set (3 N width
 * elements). */
static int defer_commit_wanted(sf_stage *st, const block *b, int *out)
{
    const sf_model_config *c = b->cfg;
    const long long mode = sf_stage_option_int(st, "defer_commit");
    const int commits = c->memory != SF_MEMORY_NONE || (c->global_tokens > 0 && c->summary_tokens > 0);
    *out = 0;
    if (mode <= 0 || !sf_be_has_side_queue(b->be) || b->count < 2 || c->mlp_hidden <= 0 || !commits) return SF_OK;
    /* the last layer's commit waits for the next segment only where that segment's first
     * layer writes the other q/k/v set (and not with a state store: block_init) */
    *out = mode >= 2 && b->count % 2 == 0 ? 2 : 1;
    return SF_OK;
}

/* One segment's activations (its rows x aside) into *act. */
static int alloc_activations(block *b, size_t N, block_activations *act)
{
    const sf_model_config *c = b->cfg;
    size_t D = (size_t)c->dim, W = (size_t)b->width, F = (size_t)b->hidden;
    int rc = SF_OK;
    act->u = sf_block_upload(b, NULL, N * D, &rc);
    /* q, k, v: three equal parts of one buffer (see prepare_backend); the composed path
     * (no fused qkv) writes them with float32 products */
    const size_t qkv_floats =
        ((b->defer_commit ? 2 : 1) * b->qkv_set_bytes + sizeof(float) - 1) / sizeof(float);
    act->q = (unsigned char *)sf_block_upload(b, NULL, qkv_floats, &rc);
    if (act->q) act->k = act->q + N * W * b->qkv_size, act->v = act->k + N * W * b->qkv_size;
    act->a = sf_block_upload(b, NULL, N * W, &rc);
    if (b->mix_type == SF_DTYPE_BF16) act->ao = (unsigned char *)sf_block_upload(b, NULL, (N * W + 1) / 2, &rc);
    if (b->part_type == SF_DTYPE_BF16) act->part = (unsigned char *)sf_block_upload(b, NULL, (N * D + 1) / 2, &rc);
    if (act->part && sf_be_normed_type(b->be) == SF_DTYPE_BF16)
        act->un = (unsigned char *)sf_block_upload(b, NULL, (N * D + 1) / 2, &rc);
    if (F) {
        /* a GPU's ffn may need less of h1, or none */
        const size_t h1_floats = sf_be_ffn_h1_floats(b->be, (int)N, (int)D, (int)F);
        if (h1_floats) act->h1 = sf_block_upload(b, NULL, h1_floats, &rc);
        act->h3 = sf_block_upload(b, NULL, N * F, &rc);
    }
    if (c->summary_tokens) {
        act->sk = sf_block_upload(b, NULL, (size_t)c->summary_tokens * W, &rc);
        act->sv = sf_block_upload(b, NULL, (size_t)c->summary_tokens * W, &rc);
    }
    return rc;
}

static void free_activations(block *b, const block_activations *act)
{
    void *buffers[] = {act->u, act->q /* and k, v */, act->a, act->ao, act->part, act->un, act->h1, act->h3, act->sk,
                       act->sv};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; i++) b->be->ops->free(b->be, buffers[i]);
}

static int block_warmup(block *b);

int sf_block_setup(block *b, const sf_model *m)
{
    const sf_model_config *c = b->cfg;
    const size_t D = (size_t)c->dim, N = (size_t)c->segment * b->batch;
    int rc = sf_block_load_weights(b, m);
    b->x = sf_block_upload(b, NULL, N * D, &rc);
    b->qkv_type = sf_be_qkv_type(b->be, c->head_dim);
    b->mix_type = sf_be_mix_type(b->be, b->qkv_type, c->memory != SF_MEMORY_NONE);
    b->qkv_size = b->qkv_type == SF_DTYPE_BF16 ? 2 : sizeof(float);
    b->qkv_set_bytes = 3 * N * b->width * b->qkv_size;
    /* every rank resolves the same: the same options, backends of one kind */
    b->part_type = b->ranks > 1 && !b->reduce_f32 ? sf_be_part_type(b->be) : SF_DTYPE_F32;
    if (rc == SF_OK) rc = alloc_activations(b, N, &b->act);
    return rc == SF_OK ? prepare_backend(b) : rc;
}

static int block_init(sf_stage *st)
{
    const sf_model *m = sf_stage_model(st);
    if (!m) return sf_error(SF_E_INVAL, "block needs a model");
    block *b = calloc(1, sizeof *b);
    if (!b) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, b);
    b->stage = st;
    b->cfg = sf_model_get_config(m);
    b->be = sf_stage_backend(st);
    const sf_model_config *c = b->cfg;
    int rc = parse_layers(sf_stage_option(st, "layers"), c->layers, &b->first, &b->count);
    if (rc != SF_OK) return rc;
    sf_stream_table_init(&b->streams, (int)sf_stage_option_int(st, "max_streams"), sf_block_stream_create,
                         sf_block_stream_release, b);
    b->batch = (int)sf_stage_option_int(st, "batch");
    b->check_finite = sf_stage_option_bool(st, "check_finite") ? (int)sf_check_finite() : SF_CHECK_FINITE_OFF;
    b->host_rows = strcmp(b->be->ops->name, "cpu") == 0; /* its memory is host memory */
    int ranks = (int)sf_stage_option_int(st, "heads_of"), rank = 0;
    b->procs = sf_stage_head_procs(st); /* head ranks that are processes (head_ranks=) */
    rc = sf_block_procs_plan(st, b->procs, &ranks, &rank);
    if (rc != SF_OK) return rc;
    b->inject_failure = (int)sf_stage_option_int(st, "inject_failure");
    b->overlap = (int)sf_stage_option_int(st, "overlap");
    b->reduce_f32 = strcmp(sf_stage_option(st, "reduce"), "f32") == 0;
    b->reduce_nccl = strcmp(sf_stage_option(st, "reduce"), "nccl") == 0;
    if (ranks && sf_stage_option_int(st, "state_budget"))
        return sf_error(SF_E_OPTION, "heads_of=%d: a state_budget is not supported with head parallelism", ranks);
    if (rank > 0) b->check_finite = SF_CHECK_FINITE_OFF; /* head rank 0 checks the rows, which are the same here */
    rc = sf_block_shard_plan(b, rank, ranks ? ranks : 1);
    if (rc == SF_OK) rc = sf_block_store_init(st, b);
    if (rc == SF_OK) rc = defer_commit_wanted(st, b, &b->defer_commit);
    /* a state store takes each stream's state right after its segment (sf_block_state_put_back) */
    if (b->store && b->defer_commit == 2) b->defer_commit = 1;
    if (rc == SF_OK) rc = sf_block_setup(b, m);
    if (rc == SF_OK) rc = block_warmup(b);
    /* the other ranks, and the communicator, last: what init ran before issued no collective */
    if (rc == SF_OK && rank > 0) return sf_block_procs_join(st, b); /* a follower: rank 0 hands it its work */
    if (rc == SF_OK && ranks) rc = sf_block_shard_start(st, b, ranks);
    return rc;
}

/* Appends `produced` summary tokens (tk, tv: rows of the block's width) to the layer's FIFO,
 * evicting the oldest. */
static int push_tokens(block *b, stream_state *s, int l, const float *tk, const float *tv, int produced)
{
    const sf_model_config *c = b->cfg;
    const sf_backend_ops *ops = b->be->ops;
    int rc = SF_OK;
    size_t row = (size_t)b->width * sizeof(float);
    float *gk = s->gk + (size_t)l * c->global_tokens * b->width;
    float *gv = s->gv + (size_t)l * c->global_tokens * b->width;
    /* token j goes to slot first + j (mod G): one copy per run of consecutive slots, so
     * usually one per segment instead of one per token (each copy is a device launch) */
    int first = (s->g_head[l] + s->g_count[l]) % c->global_tokens;
    for (int j = 0; j < produced && rc == SF_OK;) {
        int slot = (first + j) % c->global_tokens;
        int run = produced - j < c->global_tokens - slot ? produced - j : c->global_tokens - slot;
        rc = ops->copy(b->be, gk + (size_t)slot * b->width, tk + (size_t)j * b->width, run * row);
        if (rc == SF_OK) rc = ops->copy(b->be, gv + (size_t)slot * b->width, tv + (size_t)j * b->width, run * row);
        j += run;
    }
    /* the FIFO fills up, then each new token evicts the oldest */
    for (int j = 0; j < produced && rc == SF_OK; j++) {
        if (s->g_count[l] < c->global_tokens) s->g_count[l]++;
        else s->g_head[l] = (s->g_head[l] + 1) % c->global_tokens;
    }
    return rc;
}

/* Appends this segment's summary tokens to the layer's FIFO, evicting the oldest. */
static int push_global_tokens(block *b, stream_state *s, int l, int n, const void *k, const void *v)
{
    const sf_model_config *c = b->cfg;
    int produced = 0;
    int rc = b->be->ops->summary(b->be, n, c->segment, c->summary_tokens, b->width, b->width, b->qkv_type, k, v,
                                 b->act.sk, b->act.sv, &produced);
    return rc == SF_OK ? push_tokens(b, s, l, b->act.sk, b->act.sv, produced) : rc;
}

/* Layer l's q/k/v set (block.defer_commit): set l % 2 when commits are deferred, else the one. */
static unsigned char *qkv_set(const block *b, int l)
{
    return b->act.q + (b->defer_commit ? (size_t)(l % 2) * b->qkv_set_bytes : 0);
}

/* Layer l's commit for `count` streams of n rows (SPEC 4 and 5): the memory update and the
 * global tokens, from that layer's k and v. */
static int commit_layer(block *b, stream_state *const *states, int count, int l, int n)
{
    const sf_model_config *c = b->cfg;
    const int H = b->heads, d = c->head_dim, W = b->width, G = c->global_tokens;
    const size_t hdd = (size_t)H * d * d, hd = (size_t)H * d, part_bytes = (size_t)n * W * b->qkv_size;
    const unsigned char *kset = qkv_set(b, l) + (b->act.k - b->act.q), *vset = qkv_set(b, l) + (b->act.v - b->act.q);
    int rc = SF_OK;
    const block_commit_given *g = b->commit_given;
    if (g) { /* computed beforehand (block.commit_given): one stream, the CPU backend */
        if (count != 1) return sf_error(SF_E_INVAL, "commit given in part: one stream only");
        if (c->memory != SF_MEMORY_NONE)
            rc = sf_memory_update_parts(c->memory, H, d, g->P, g->G, g->z_inc, states[0]->M + l * hdd,
                                        states[0]->z + l * hd);
        if (rc == SF_OK && G > 0 && c->summary_tokens > 0) rc = push_tokens(b, states[0], l, g->tk, g->tv, g->tokens);
        return rc;
    }
    for (int i = 0; i < count && rc == SF_OK; i++) {
        stream_state *s = states[i];
        const void *k = kset + i * part_bytes, *v = vset + i * part_bytes;
        if (c->memory != SF_MEMORY_NONE)
            rc = b->be->ops->memory_update(b->be, c->memory, n, H, d, W, b->qkv_type, k, v, s->M + l * hdd,
                                           s->z + l * hd);
        if (rc == SF_OK && G > 0 && c->summary_tokens > 0) rc = push_global_tokens(b, s, l, n, k, v);
    }
    return rc;
}

/* commit_layer on the side queue where the backend has one (in order otherwise). */
static int commit_layer_beside(block *b, stream_state *const *states, int count, int l, int n)
{
    int rc = sf_be_side_begin(b->be);
    if (rc == SF_OK) rc = commit_layer(b, states, count, l, n);
    int end_rc = sf_be_side_end(b->be);
    return rc == SF_OK ? end_rc : rc;
}

/* Issues the last layer's commit that waits in b->late, if any (defer_commit 2). Called by the
 * next segment's first layer (that layer's join before its MLP covers it), and, joined at
 * once, before anything reads, saves, replaces or drops a state. */
static int flush_late_commit(block *b, int join)
{
    int rc = SF_OK;
    if (b->late.count) {
        const int count = b->late.count;
        b->late.count = 0;
        rc = commit_layer_beside(b, b->late.states, count, b->count - 1, b->late.n);
    }
    /* joined whether issued now or before (a follower's, at its segment's end) */
    return rc == SF_OK && join ? sf_be_side_join(b->be) : rc;
}

/* The commits deferred to layer l, issued after its qkv: the previous layer's (the attention
 * that read the memory and tokens it writes is long done, and it runs beside this layer's
 * attention, issued next) and, in the first layer, the previous segment's last (defer_commit 2). */
static int commit_begin(block *b, stream_state *const *states, int count, int l, int n, int commit)
{
    int rc = SF_OK;
    if (commit && b->defer_commit && l > 0) rc = commit_layer_beside(b, states, count, l - 1, n);
    if (rc == SF_OK && l == 0) rc = flush_late_commit(b, 0);
    return rc;
}

/* Layer l's own commit, issued after its attention, or left for later. The commit reads k and v
 * and writes the memory and the global tokens, which only the next segment reads.
 * Not deferring, it runs on the side queue beside the output product and the MLP issued after it:
 * the attention and the retrieval read the old memory and tokens, and were issued first, so the
 * side starts after them. Without an MLP there is too little to run beside it, and the
 * cross-queue waits cost more than they hide: it runs in order.
 * Deferring, the next layer issues it (commit_begin), and the commits issued so far (the
 * previous layer's and the previous segment's last) are joined in this layer, not before the
 * next layer's qkv: a wait ahead of the qkv's norm would keep that norm from launching early.
 * They run beside this layer's attention, mostly in its tail, and beside the output product
 * (joined before the output product instead, the product waited for them). The join goes before
 * the MLP's products (*join_owed, for ffn), or, where this layer's own commit follows now (the
 * last layer, defer_commit 1), before that commit. */
static int commit_end(block *b, stream_state *const *states, int count, int l, int n, int commit, int *join_owed)
{
    *join_owed = b->defer_commit != 0;
    if (!commit || (b->defer_commit && l + 1 < b->count)) return SF_OK;
    if (b->defer_commit == 2) {
        memcpy(b->late.states, states, (size_t)count * sizeof *states);
        b->late.count = count, b->late.n = n;
        return SF_OK;
    }
    int rc = *join_owed ? sf_be_side_join(b->be) : SF_OK;
    *join_owed = 0;
    if (rc != SF_OK) return rc;
    return b->cfg->mlp_hidden > 0 ? commit_layer_beside(b, states, count, l, n) : commit_layer(b, states, count, l, n);
}

/* Stream i's attention of layer l (A_dot over its segment and global tokens) mixed with its
 * memory retrieval (SPEC 2) into its rows of the output product's input (block.mix_type). */
static int attention_mix(block *b, stream_state *s, int l, int i, int n, const unsigned char *qkv)
{
    const sf_model_config *c = b->cfg;
    const int H = b->heads, d = c->head_dim, W = b->width, G = c->global_tokens;
    const size_t part = (size_t)n * W, part_bytes = part * b->qkv_size;
    const unsigned char *q = qkv + i * part_bytes, *k = q + (b->act.k - b->act.q), *v = q + (b->act.v - b->act.q);
    const int memory = c->memory != SF_MEMORY_NONE;
    float *a = b->act.a + i * part;
    void *out = b->mix_type == SF_DTYPE_BF16 ? (void *)(b->act.ao + i * part * 2) : (void *)a;
    sf_attention_desc desc = {
        .n = n, .segment = c->segment, .heads = H, .head_dim = d, .ld = W, .causal = c->causal,
        .n_branches = c->n_branches, .branches = c->branches,
        .n_global = G ? s->g_count[l] : 0, .global_ld = W,
        .gk = G ? s->gk + (size_t)l * G * W : NULL, .gv = G ? s->gv + (size_t)l * G * W : NULL,
        .scale = 1.0f / sqrtf((float)d), .qkv_type = b->qkv_type, .head_offset = b->head0};
    if (b->attn_acc) { /* the branches were computed before: the composed attention_mix's other steps */
        if (b->mix_type != SF_DTYPE_F32 || i != 0)
            return sf_error(SF_E_INVAL, "attention given in part: one stream's float32 mix only");
        int rc = sf_attention_finish(b->be, &desc, (const float *)q, b->attn_acc, b->attn_ml, a);
        if (rc != SF_OK || !memory) return rc;
        return b->be->ops->memory_mix(b->be, n, H, d, W, b->qkv_type, q, s->M + (size_t)l * H * d * d,
                                      s->z + (size_t)l * H * d, b->weights[l].gate, a);
    }
    return sf_be_attention_mix(b->be, &desc, q, k, v, a, memory ? s->M + (size_t)l * H * d * d : NULL,
                               memory ? s->z + (size_t)l * H * d : NULL, b->weights[l].gate, b->mix_type, out);
}

/* One layer (SPEC 2) over `count` streams' segments of n rows each, stacked in b->x (count > 1
 * only for full segments): the products, norms and MLP see all count * n rows at once. */
static int layer_forward_qkv(block *b, stream_state *const *states, int count, int l, int n, int commit,
                             int have_qkv);

static int layer_forward(block *b, stream_state *const *states, int count, int l, int n, int commit)
{
    return layer_forward_qkv(b, states, count, l, n, commit, 0);
}

int sf_block_layer(block *b, stream_state *s, int l, int n, int commit, unsigned char *qkv)
{
    if (!qkv) return layer_forward_qkv(b, &s, 1, l, n, commit, 0);
    if (b->defer_commit || b->normed)
        return sf_error(SF_E_INVAL, "sf_block_layer: given projections with deferred commits or normed sums");
    /* the layer reads its set at act.q (qkv_set without deferred commits): lend it the caller's */
    unsigned char *q = b->act.q, *k = b->act.k, *v = b->act.v;
    b->act.q = qkv, b->act.k = qkv + (k - q), b->act.v = qkv + (v - q);
    int rc = layer_forward_qkv(b, &s, 1, l, n, commit, 1);
    b->act.q = q, b->act.k = k, b->act.v = v;
    return rc;
}

/* layer_forward; have_qkv: the set already holds this layer's q, k, v */
static int layer_forward_qkv(block *b, stream_state *const *states, int count, int l, int n, int commit,
                             int have_qkv)
{
    const sf_model_config *c = b->cfg;
    sf_backend *be = b->be;
    const layer_weights *w = &b->weights[l];
    const int D = c->dim, W = b->width, rows = count * n;
    unsigned char *q = qkv_set(b, l), *k = q + (b->act.k - b->act.q), *v = q + (b->act.v - b->act.q);
    /* not deferring, the previous layer's commit may still read the k and v this qkv overwrites
     * (deferring, the one that used this set was joined in the previous layer) */
    int rc = b->defer_commit ? SF_OK : sf_be_side_join(be);
    /* q, k, v = u Wq^T, u Wk^T, u Wv^T with u = rmsnorm(x) (normed sums: u handed by them) */
    if (rc == SF_OK && !have_qkv && b->normed)
        rc = sf_block_qkv_normed(b, l, rows, q, k, v);
    else if (rc == SF_OK && !have_qkv)
        rc = sf_be_qkv(be, rows, D, W, b->x, w->attn_norm, c->norm_eps, w->wq, w->wk, w->wv, b->qkv_type, q, k, v,
                       b->act.u);
    if (rc == SF_OK) rc = commit_begin(b, states, count, l, n, commit);
    /* A = g A_mem + (1 - g) A_dot, stream by stream */
    for (int i = 0; i < count && rc == SF_OK; i++) rc = attention_mix(b, states[i], l, i, n, q);
    int join_owed = 0;
    if (rc == SF_OK) rc = commit_end(b, states, count, l, n, commit, &join_owed);
    /* x += A Wo^T; x += W2 (silu(W1 u) * W3 u), u = rmsnorm(x) */
    if (rc == SF_OK) rc = sf_block_output_and_mlp(b, l, rows, join_owed);
    return rc;
}

/* Host rows after layer l: a NaN or infinity stops the run here, naming the layer where it first
 * appeared, rather than flowing on into every later layer and the output. packets[i] holds the
 * stream and position of rows [i n, (i + 1) n). One pass over D floats a row, next to the
 * layer's O(D W + D F) work a row: under 1% (bench/bench_cpu --check-finite). */
static int check_layer_rows(const block *b, sf_packet *const *packets, int count, int n, int l)
{
    const size_t D = (size_t)b->cfg->dim, floats = (size_t)n * D;
    for (int i = 0; i < count; i++) {
        const float *rows = b->x + (size_t)i * floats;
        size_t at = sf_first_non_finite(rows, SF_DTYPE_F32, floats);
        if (at == floats) continue;
        float v = rows[at];
        return sf_error(SF_E_NONFINITE,
                        "layer %d produced a non-finite value (%s): stream %llu, position %llu, column %zu; the "
                        "weights or the input overflow float32",
                        b->first + l, v != v ? "NaN" : v > 0 ? "+inf" : "-inf", (unsigned long long)packets[i]->stream,
                        (unsigned long long)(packets[i]->position + at / D), at % D);
    }
    return SF_OK;
}

/* Every layer over the stacked segments, then the side queue joined: what follows (the
 * download, the next stage, a save) may read anything the layers wrote. */
static int layers_forward(block *b, stream_state *const *states, sf_packet *const *packets, int count, int n,
                          int commit)
{
    /* head-parallel: every rank starts from rank 0's rows */
    int rc = sf_block_first_rows(b, count * n);
    for (int l = 0; l < b->count && rc == SF_OK; l++) {
        rc = layer_forward(b, states, count, l, n, commit);
        if (rc == SF_OK && b->check_finite && b->host_rows) rc = check_layer_rows(b, packets, count, n, l);
    }
    int join_rc = sf_be_side_join(b->be);
    if (rc == SF_OK) rc = join_rc;
    /* A head rank's follower downloads nothing at the end of a segment, and waits at the start
     * of the next for rank 0's rows: its last layer's commit runs in that wait, rather than
     * beside the next segment's first attention. Joined by the next layer 0's join, as where
     * it is issued there, or by any flush that joins. */
    if (rc == SF_OK && b->rank > 0 && commit) rc = flush_late_commit(b, 0);
    /* What follows may block on the device without looking (a download here or in a later stage,
     * a free that synchronizes), and would wait forever for a rank that failed if the device
     * waited for it. Where a collective of this segment could leave it so (an NCCL kernel),
     * every rank waits, polling, for the segment's collectives: the wait ends by the failure
     * flag or the timeout instead. Where none could (the copy engines' sums wait only for parts
     * the other ranks have issued), it fences: this rank goes on to the next segment while the
     * device runs this one's tail, so that neither GPU idles between segments while the hosts
     * turn around (sf_comm_end_unit). One rank has no other rank to wait for: it runs ahead as
     * the unsharded block does. */
    if (rc == SF_OK && b->comm && b->comm->size > 1) rc = sf_comm_end_unit(b->comm);
    return rc;
}

int sf_block_follow(block *b, const block_work *w)
{
    int rc = SF_OK;
    switch (w->op) {
    case SF_BLOCK_WORK_FORWARD: {
        if (b->inject_failure && b->rank == b->ranks - 1 && w->n > 0 && ++b->segments_seen > b->inject_failure)
            return sf_error(SF_E_BACKEND, "rank %d: failure injected after %d segments (block inject_failure=)", b->rank,
                            b->inject_failure);
        stream_state *states[SF_BLOCK_MAX_BATCH];
        for (int i = 0; i < w->count && w->n > 0 && rc == SF_OK; i++)
            if (!(states[i] = sf_stream_table_get(&b->streams, w->streams[i]))) rc = SF_E_NOMEM;
        if (rc == SF_OK && w->n > 0) rc = layers_forward(b, states, NULL, w->count, w->n, w->commit);
        if (rc == SF_OK && w->final) rc = flush_late_commit(b, 1);
        if (rc == SF_OK && w->final) sf_stream_table_remove(&b->streams, w->streams[0]);
        return rc;
    }
    case SF_BLOCK_WORK_FLUSH:
        return flush_late_commit(b, 1);
    case SF_BLOCK_WORK_SAVE:
        rc = flush_late_commit(b, 1);
        if (rc == SF_OK && b->comm) rc = sf_comm_wait(b->comm);
        return rc == SF_OK ? sf_block_state_save(b, w->out) : rc;
    case SF_BLOCK_WORK_RESTORE:
        return sf_block_state_restore(b, w->data, w->len);
    default:
        return SF_OK;
    }
}

/* Host buffers a GPU graph's first segments come down into (the packet cache keeps them): a
 * link's depth of packets in flight, and one more. */
#define WARMUP_PACKETS 5

/* Start-up, where the backend asks for it (sf_be_warmup; the CUDA setting warmup=1): one
 * segment of made-up rows through every layer on a state of its own, which the first stream
 * then takes (reset to zero, block.spare), so the first real segment finds its product plans
 * chosen, the libraries' kernels loaded and its state allocated; then the packet cache filled
 * with the page-locked buffers its rows come down into. Nothing of it reaches an output. */
static int block_warmup(block *b)
{
    int rc = sf_be_warmup(b->be);
    if (rc <= 0) return rc;
    const sf_model_config *c = b->cfg;
    const size_t N = (size_t)c->segment, D = (size_t)c->dim, all = N * D;
    const size_t period = all < 65536 ? all : 65536;
    /* not zeros (products can run faster on zeros, and the plans are timed here): a repeating
     * run of values in [-1, 1), one period made here and doubled on the device (making all of
     * it on the host took 20 ms for the reference model) */
    float *host = malloc(period * sizeof *host);
    if (!host) return sf_error(SF_E_NOMEM, "out of memory");
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < period; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        host[i] = (float)(int32_t)(r >> 40 & 0xffffff) / (float)(1 << 23) - 1.0f;
    }
    rc = b->be->ops->upload(b->be, b->x, host, period * sizeof *host);
    free(host);
    for (size_t have = period; rc == SF_OK && have < all; have *= 2)
        rc = b->be->ops->copy(b->be, b->x + have, b->x, (all - have < have ? all - have : have) * sizeof(float));
    stream_state *state = NULL;
    if (rc == SF_OK && !(state = sf_block_stream_create(b, 0))) rc = SF_E_NOMEM;
    if (rc == SF_OK) rc = layers_forward(b, &state, NULL, 1, (int)N, 1);
    if (rc == SF_OK) rc = flush_late_commit(b, 1);
    if (rc == SF_OK) rc = b->be->ops->sync(b->be);
    if (state) sf_block_stream_release(b, state);
    /* page-locking takes about 15 ms a packet for the reference model; made on a second thread
     * while the segment ran, they held it up by as long (an H100), so they are made here */
    sf_packet *warm[WARMUP_PACKETS] = {0};
    for (int i = 0; i < WARMUP_PACKETS && rc == SF_OK && !b->host_rows; i++)
        if (!(warm[i] = sf_packet_new(SF_PACKET_HIDDEN, 0, all))) rc = sf_error(SF_E_NOMEM, "out of memory");
    for (int i = 0; i < WARMUP_PACKETS; i++) sf_packet_free(warm[i]);
    return rc;
}

static int batchable(const block *b, const sf_packet *p)
{
    if (b->batch <= 1 || b->store || p->kind != SF_PACKET_HIDDEN || p->n != (size_t)b->cfg->segment ||
        p->width != (size_t)b->cfg->dim || (p->flags & (SF_PACKET_PROVISIONAL | SF_PACKET_FINAL)))
        return 0;
    for (int i = 0; i < b->n_pending; i++)
        if (b->pending[i]->stream == p->stream) return 0;
    return 1;
}

static int run_one(sf_stage *st, sf_packet *in);

/* Rows of a device backend brought to the host p after the block's layers from dev (host rows
 * were checked after each layer already): with checks ON scanned on the device by a scan issued
 * ahead of the download, a hit then named from the downloaded p. */
static int download_checked(const block *b, sf_packet *p, const float *dev)
{
    const size_t bytes = p->n * p->width * sizeof(float);
    const int check = b->check_finite == SF_CHECK_FINITE_ON && !b->host_rows;
    sf_rows_check chk = {0};
    int found = 0;
    const int scan = check ? sf_be_check_rows_begin(b->be, dev, SF_DTYPE_F32, p->n * p->width, &chk) : SF_OK;
    int rc = b->be->ops->download(b->be, p->x, dev, bytes);
    const int ended = scan == SF_OK ? sf_be_check_rows_end(b->be, &chk, &found) : SF_OK;
    if (rc == SF_OK) rc = scan != SF_OK ? scan : ended;
    if (rc != SF_OK || !found) return rc;
    char where[64];
    snprintf(where, sizeof where, "after layers %d-%d", b->first, b->first + b->count - 1);
    return sf_packet_check_finite(p, where);
}

/* Split sums (rank 0): a segment's packet waits here until the next segment's first rows are
 * out to the other ranks and its first attention is issued. Emitted at once, the next stages'
 * kernels on it (the final norm) would go on this GPU's stream in front of the next segment's
 * first norm, and so into the others' wait for those rows at every segment's start. Emitted
 * after the next segment's first attention (stages/block_sums.c), and wherever anything else
 * may follow: the input idle, a flush, a save, another packet's emit. */
int sf_block_emit_held(block *b)
{
    sf_packet *p = b->held;
    b->held = NULL;
    return p ? sf_stage_emit(b->stage, p) : SF_OK;
}

/* Runs the waiting segments as one batch and emits them in arrival order. A lone segment runs
 * as any other, in place: stacking it would only add two copies of its rows. */
static int run_pending(sf_stage *st)
{
    block *b = sf_stage_priv(st);
    const int count = b->n_pending;
    if (count == 0) return SF_OK;
    b->n_pending = 0;
    if (count == 1) return run_one(st, b->pending[0]);
    const sf_backend_ops *ops = b->be->ops;
    const size_t rows = (size_t)b->cfg->segment, floats = rows * (size_t)b->cfg->dim;
    stream_state *states[SF_BLOCK_MAX_BATCH];
    uint64_t ids[SF_BLOCK_MAX_BATCH];
    for (int i = 0; i < count; i++) ids[i] = b->pending[i]->stream;
    int rc = b->shard ? sf_block_shard_forward(b, ids, count, (int)rows, 1, 0) : SF_OK;
    for (int i = 0; i < count && rc == SF_OK; i++) {
        sf_packet *p = b->pending[i];
        states[i] = sf_stream_table_get(&b->streams, p->stream);
        if (!states[i]) rc = SF_E_NOMEM;
        float *dst = b->x + i * floats;
        if (rc == SF_OK) rc = p->dev ? ops->copy(b->be, dst, p->dev, floats * sizeof(float))
                                     : ops->upload(b->be, dst, p->x, floats * sizeof(float));
    }
    if (rc == SF_OK) rc = layers_forward(b, states, b->pending, count, (int)rows, 1);
    for (int i = 0; i < count && rc == SF_OK; i++) {
        sf_packet *p = b->pending[i];
        const float *src = b->x + i * floats;
        rc = p->dev ? ops->copy(b->be, p->dev, src, floats * sizeof(float)) : download_checked(b, p, src);
    }
    int i = 0;
    for (; i < count && rc == SF_OK; i++) rc = sf_stage_emit(st, b->pending[i]);
    for (; i < count; i++) sf_packet_free(b->pending[i]);
    return rc;
}

/* A following head rank (another process): its input is its work, and the flush came as work. */
static int follows(const block *b) { return b->procs && b->procs->index > 0; }

static int block_flush(sf_stage *st)
{
    block *b = sf_stage_priv(st);
    if (follows(b)) return SF_OK;
    int rc = sf_block_emit_held(b);
    if (rc == SF_OK) rc = run_pending(st);
    if (rc == SF_OK && b->shard) rc = sf_block_shard_flush(b);
    int late_rc = flush_late_commit(b, 1);
    rc = sf_block_shard_check(b, rc == SF_OK ? late_rc : rc);
    if (rc == SF_OK) sf_block_shard_end(b); /* the end of the other processes' work */
    return rc;
}

static int block_idle(sf_stage *st)
{
    block *b = sf_stage_priv(st);
    return b->held ? sf_block_shard_check(b, sf_block_emit_held(b)) : SF_OK;
}

static int block_process(sf_stage *st, sf_packet *in)
{
    block *b = sf_stage_priv(st);
    if (follows(b)) return sf_block_procs_follow(b, in);
    if (in->dtype != SF_DTYPE_F32) {
        sf_packet_free(in);
        return sf_error(SF_E_INVAL, "its input rows are bf16 (a norm with dtype=bf16 ahead of it); "
                                    "only a sink takes bf16 rows");
    }
    if (batchable(b, in)) {
        int rc = sf_block_emit_held(b);
        if (rc != SF_OK) {
            sf_packet_free(in);
            return sf_block_shard_check(b, rc);
        }
        b->pending[b->n_pending++] = in;
        return sf_block_shard_check(b, b->n_pending == b->batch ? run_pending(st) : SF_OK);
    }
    int rc = run_pending(st);
    if (rc != SF_OK) {
        sf_packet_free(in);
        return sf_block_shard_check(b, rc);
    }
    return sf_block_shard_check(b, run_one(st, in));
}

/* One packet through every layer, then on downstream (takes ownership of in). */
static int run_one(sf_stage *st, sf_packet *in)
{
    block *b = sf_stage_priv(st);
    int rc = SF_OK;
    if (in->kind != SF_PACKET_HIDDEN || in->width != (size_t)b->cfg->dim || in->n > (size_t)b->cfg->segment) {
        sf_packet_free(in);
        return sf_error(SF_E_INVAL, "block takes embedded segments of width %d (put 'embed' before it)", b->cfg->dim);
    }
    if (b->shard)
        rc = sf_block_shard_forward(b, &in->stream, 1, (int)in->n, !(in->flags & SF_PACKET_PROVISIONAL),
                                    (in->flags & SF_PACKET_FINAL) != 0);
    if (in->n > 0 && rc == SF_OK) {
        stream_state *s = b->store ? b->work : sf_stream_table_get(&b->streams, in->stream);
        if (!s) rc = SF_E_NOMEM;
        if (rc == SF_OK && b->store) rc = sf_block_state_load(b, in->stream);
        int commit = !(in->flags & SF_PACKET_PROVISIONAL);
        size_t bytes = in->n * in->width * sizeof(float);
        /* rows already on the device (packet.h, dev) are computed in place and stay there */
        float *host_rows_x = b->x;
        if (in->dev) b->x = in->dev;
        else if (rc == SF_OK)
            rc = b->be->ops->upload(b->be, b->x, in->x, bytes);
        if (rc == SF_OK) rc = layers_forward(b, &s, &in, 1, (int)in->n, commit);
        if (rc == SF_OK && !in->dev) rc = download_checked(b, in, b->x);
        b->x = host_rows_x;
        if (rc == SF_OK && b->store && commit && !(in->flags & SF_PACKET_FINAL))
            rc = sf_block_state_put_back(b, in->stream);
    }
    if (rc == SF_OK && (in->flags & SF_PACKET_FINAL)) rc = flush_late_commit(b, 1);
    if (rc == SF_OK && (in->flags & SF_PACKET_FINAL)) sf_stream_table_remove(&b->streams, in->stream);
    if (rc == SF_OK && (in->flags & SF_PACKET_FINAL) && b->store) {
        rc = sf_state_store_remove(b->store, in->stream);
        if (b->work_stream == in->stream) b->work_current = 0;
    }
    if (rc == SF_OK) rc = sf_block_emit_held(b); /* a previous one, if still held */
    /* rows that stay on the device wait for the next segment (sf_block_emit_held) */
    if (rc == SF_OK && b->split && b->rank == 0 && in->dev && in->n > 0 && b->batch <= 1 &&
        !(in->flags & SF_PACKET_FINAL)) {
        b->held = in;
        return SF_OK;
    }
    if (rc != SF_OK) {
        sf_packet_free(in);
        return rc;
    }
    return sf_stage_emit(st, in);
}

/* The state (layout: stages/block_state.c) must include every segment that came before the
 * save: the waiting ones run first (they are emitted ahead of the checkpoint marker), and a
 * deferred commit is issued. */
static int block_save(sf_stage *st, sf_buffer *out)
{
    block *b = sf_stage_priv(st);
    if (follows(b)) return sf_error(SF_E_STATE, "a following head rank's state is saved by head rank 0");
    int rc = sf_block_emit_held(b);
    if (rc == SF_OK) rc = run_pending(st);
    if (rc == SF_OK) rc = flush_late_commit(b, 1);
    /* head-parallel: every rank's state, in the layout of stages/block_shard.c */
    if (rc == SF_OK) rc = b->shard ? sf_block_shard_save(b, out) : sf_block_state_save(b, out);
    return sf_block_shard_check(b, rc);
}

static int block_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    block *b = sf_stage_priv(st);
    if (follows(b)) return sf_error(SF_E_STATE, "a following head rank's state is restored by head rank 0");
    if (b->shard) return sf_block_shard_check(b, sf_block_shard_restore(b, data, len));
    int rc = sf_block_shard_refuse(b, data, len);
    return rc == SF_OK ? sf_block_state_restore(b, data, len) : rc;
}

void sf_block_release(block *b)
{
    for (int i = 0; i < b->n_pending; i++) sf_packet_free(b->pending[i]);
    b->n_pending = 0;
    sf_packet_free(b->held); /* a run that failed or was cut short */
    b->held = NULL;
    sf_block_state_free(b);
    sf_backend *be = b->be;
    for (int l = 0; b->weights && l < b->count; l++) {
        float **w = (float **)&b->weights[l];
        for (size_t i = 0; i < sizeof(layer_weights) / sizeof(float *); i++) be->ops->free(be, w[i]);
    }
    free(b->weights);
    b->weights = NULL;
    be->ops->free(be, b->x);
    b->x = NULL;
    free_activations(b, &b->act);
    memset(&b->act, 0, sizeof b->act);
}

static void block_free(sf_stage *st)
{
    block *b = sf_stage_priv(st);
    if (!b) return;
    /* the other ranks first (they end their collectives), then this rank's communicator (head
     * ranks that are processes: the graph's, but on cuda the stage's NCCL one) */
    sf_block_shard_stop(b);
    if (!b->procs || b->comm != b->procs->comm) sf_comm_free(b->comm);
    b->comm = NULL;
    sf_block_release(b);
    free(b);
}

const sf_stage_class sf_block_stage = {
    .name = "block",
    .help = "attention blocks: dilated attention, compressive memory, global tokens, MLP",
    .options = block_options,
    .init = block_init,
    .process = block_process,
    .flush = block_flush,
    .save = block_save,
    .restore = block_restore,
    .free = block_free,
    .device_rows = 1,
    .idle = block_idle,
};
