/* The block stage's private parts shared by its two files: the stage's state (block), the
 * per-stream state and the functions of stages/block_state.c, which create, reuse, store and
 * serialize that per-stream state; stages/block.c computes the layers. Not a public header. */
#ifndef SEQFLOW_STAGES_BLOCK_STATE_H
#define SEQFLOW_STAGES_BLOCK_STATE_H

#include <stdint.h>

#include "state/state_store.h"
#include "seqflow/stage.h"
#include "stages/stream_table.h"

#define SF_BLOCK_MAX_BATCH 16
#define SF_BLOCK_MAX_OVERLAP 16 /* 2 * this <= SF_COMM_TICKETS: every chunk's two all-reduces of a layer */

typedef struct layer_weights {
    float *attn_norm, *wq, *wk, *wv, *wo, *gate, *mlp_norm, *w1, *w3, *w2;
} layer_weights;

typedef struct stream_state {
    float *M, *z;    /* [layers][H][d][d], [layers][H][d] */
    float *gk, *gv;  /* [layers][G][H*d]: a ring per layer; attention ignores its order */
    int *g_count, *g_head;
} stream_state;

/* The buffers one segment's layers compute in (its rows x aside), allocated at init. q, k, v:
 * [N, width] each, of block.qkv_type (the backend's fastest, when it fuses qkv; float32
 * otherwise), qkv_size bytes an element; three equal parts of one buffer. With deferred commits
 * (block.defer_commit) a second such set follows, and layer l uses set l % 2. ao: with bf16
 * q/k/v and a memory, the mixed attention output as the output product's bf16 input ([N,
 * width], the mix writes it, the output product reads it); NULL otherwise. part: with bf16
 * parts (block.part_type), a head-parallel rank's part of the output product and of the MLP
 * ([N, D] bf16), which the all-reduce sums; NULL otherwise. un: with bf16 parts and products
 * that take normed rows (sf_be_normed_type), the normed rows the ranks' sums hand the products
 * ([N, D] bf16; used where block.normed). */
typedef struct block_activations {
    float *u, *a, *h1, *h3, *sk, *sv;
    unsigned char *q, *k, *v, *ao, *part, *un;
} block_activations;

struct sf_comm;
struct block_shard;
struct sf_head_procs;

typedef struct block {
    const sf_model_config *cfg;
    sf_backend *be;
    int first, count;       /* layers [first, first + count) */
    /* Head parallelism (stages/block_shard.c): this rank's heads [head0, head0 + heads) of the
     * model's H and its `hidden` of the MLP's F columns; unsharded: rank 0 of ranks 1, all of
     * them. width is heads * d, the width of q, k, v, the attention output and global tokens. */
    int rank, ranks, heads, head0, hidden;
    struct sf_comm *comm;        /* the ranks' collectives; NULL unsharded (none issued) */
    struct block_shard *shard;   /* rank 0 of a sharded block: the other ranks (NULL elsewhere) */
    /* head ranks that are processes (stages/head_procs.h; borrowed from the graph): rank 0 hands
     * out work (procs_units: units handed out so far), a follower (procs->index > 0) does it
     * (procs_units: the last unit done); NULL when the ranks are threads, or unsharded */
    struct sf_head_procs *procs;
    uint64_t procs_units;
    int inject_failure, segments_seen; /* inject_failure=: the last rank fails after that many segments */
    int overlap;                 /* overlap=: as given (0: chosen when the ranks are joined) */
    int chunks;                  /* chunks of the rows after attention (head-parallel): overlap=, or
                                    what sf_block_comm_warmup chose for 0; 1 before */
    int reduce_f32;              /* reduce=f32: the ranks sum float32 whatever the backend's part type */
    int reduce_nccl;             /* reduce=nccl: parts summed by the transport's all-reduce, never copies */
    sf_dtype part_type;          /* the type of the ranks' parts (sf_be_part_type; float32 unsharded) */
    /* normed sums (stages/block_sums.c), chosen by sf_block_comm_warmup where act.un exists: each
     * sum also norms the rows for the next product (split: each rank its slices, x then holding
     * the sums in those only until the segment's last sum brings them to rank 0); owed: the
     * sums of a layer's MLP that the next layer's Q/K/V ends, chunk by chunk */
    int normed, split;
    struct sum_chunk {
        int ticket, r0, nr;
    } owed[SF_BLOCK_MAX_OVERLAP];
    int n_owed;
    /* split sums, rank 0 (stages/block.c, sf_block_emit_held): a segment's packet, held until
     * the next segment's first rows are out or anything else may follow; stage: whose emit */
    sf_packet *held;
    sf_stage *stage;
    int width;              /* heads * d */
    layer_weights *weights; /* [count], backend memory */
    float *x;
    block_activations act;
    sf_dtype qkv_type;
    /* the type of the output product's input: bf16 where the mix writes act.ao (sf_be_mix_type),
     * float32 where it is act.a */
    sf_dtype mix_type;
    size_t qkv_size, qkv_set_bytes;
    /* A layer's commit (memory update, global tokens) is issued to the side queue after the
     * next layer's Q/K/V, so it runs beside that layer's attention, mostly in its tail, where
     * most multiprocessors have nothing left to do, instead of beside the products; the next
     * layer's Q/K/V then writes the other set, since the commit still reads k and v.
     * defer_commit 2 also defers the last layer's, to the first layer of the next segment
     * (with an even layer count the two use different sets): `late` holds it until then, or
     * until anything reads or drops a stream's state (flush_late_commit in block.c). */
    int defer_commit;
    struct {
        stream_state *states[SF_BLOCK_MAX_BATCH];
        int count, n; /* count 0: none waiting */
    } late;
    sf_stream_table streams;
    /* with state_budget: every stream's state lives in the store between packets, and the one
     * being processed in work (see sf_block_state_load) */
    sf_state_store *store;
    struct stream_state *work;
    uint64_t work_stream;
    int work_current; /* work already holds work_stream's stored state */
    float *host;      /* M | z | gk | gv of one stream, on the host */
    int *ring;        /* g_count | g_head of one stream */
    /* states of ended streams, kept for the next new ones: on a GPU, allocating and freeing
     * device memory per stream would synchronize the device at every stream boundary */
    struct stream_state *spare[4];
    int n_spare;
    /* batch > 1: full segments of distinct streams wait in pending until `batch` of them are
     * in, then their rows run through the products, norms and MLP as one [batch * N, D] block
     * (one launch each); attention and memory stay per stream. Anything else (a partial,
     * provisional or final segment, a second segment of a waiting stream, a checkpoint, the
     * end of input) first runs what waits, so packets leave in the order they came. */
    int batch;
    sf_packet *pending[SF_BLOCK_MAX_BATCH];
    int n_pending;
    /* check_finite: an sf_check_finite_mode (OFF when the stage's option is 0). Rows in host
     * memory (the CPU backend) are scanned after every layer unless OFF; other backends' rows,
     * only when ON, where they leave the device (after the download here, in the final norm, or
     * where the graph brings them to the host) */
    int check_finite, host_rows;
    /* sequence parallelism (stages/block_seq.c), for one sf_block_layer call: the segment's
     * attention branches, computed beforehand by sf_attention_local (kernels/attention_parts.h;
     * the CPU backend, one stream, float32), so that the layer only merges the global tokens
     * in. NULL: the layer computes the whole attention. */
    const float *attn_acc, *attn_ml;
    /* the same, for the commit: what the caller already computed of the segment's memory update
     * and global tokens (block_commit_given); NULL: the commit computes them from k and v */
    const struct block_commit_given *commit_given;
} block;

/* A segment's commit computed beforehand (sequence parallelism maps a chunk before it walks it,
 * and the map has the update's products): the memory update's parts (kernels/memory_map.h,
 * sf_memory_update_parts: P, G [heads][d][d], z_inc [heads*d]; unused without a memory) and the
 * summary tokens the segment produces (tk, tv: tokens rows of the block's width). Host float32
 * memory, the CPU backend's; the caller keeps it. */
typedef struct block_commit_given {
    const float *P, *G, *z_inc;
    const float *tk, *tv;
    int tokens;
} block_commit_given;

/* The rest of block_init once the options are read (cfg, be, first, count, batch, the shard
 * plan and defer_commit set): this rank's weights, the rows and activations, the backend's
 * preparation. Also what the other ranks of a sharded block run (stages/block_shard.c). */
int sf_block_setup(block *b, const sf_model *m);

/* Frees what sf_block_setup and the streams allocated (not b itself, nor b->comm). */
void sf_block_release(block *b);

/* Layer l (0 = the block's first) of one stream's segment of n rows at b->x, with that stream's
 * state s: as in a run, the SPEC 2 math, then, when commit, the memory and global-token update
 * of s. qkv: the layer's projections of these rows, already computed, laid out as the block's
 * own set (backend memory of block.qkv_type: q, then k and v, each N * width elements after the
 * one before, N the model's segment), read in place; NULL: computed here. For sequence
 * parallelism (stages/block_seq.c), which needs k and v of a whole run before the memory is
 * known. Not with deferred commits (SF_E_INVAL). */
int sf_block_layer(block *b, stream_state *s, int l, int n, int commit, unsigned char *qkv);

/* One unit of a sharded block's work that rank 0 tells the other ranks to do, so that they
 * issue the same collectives and make the same state changes in the same order. */
enum {
    SF_BLOCK_WORK_FORWARD, /* streams' segments of n rows through the layers (rows broadcast from
                              rank 0), then, when final, the stream's end */
    SF_BLOCK_WORK_FLUSH,   /* the deferred commit (block.late), joined */
    SF_BLOCK_WORK_SAVE,    /* the flush, then the state into out */
    SF_BLOCK_WORK_RESTORE, /* the state from data */
    SF_BLOCK_WORK_QUIT
};
typedef struct block_work {
    int op, count, n, commit, final;
    uint64_t streams[SF_BLOCK_MAX_BATCH];
    sf_buffer *out;        /* SAVE */
    const uint8_t *data;   /* RESTORE */
    size_t len;
} block_work;
/* A rank other than 0 doing w (block.c): the same calls rank 0 makes for it. */
int sf_block_follow(block *b, const block_work *w);

/* A backend buffer of n floats, filled from host when host is not NULL; NULL with *rc set on
 * failure. Does nothing (NULL) when *rc is already an error, so calls can be chained. */
float *sf_block_upload(block *b, const float *host, size_t n, int *rc);

/* The stream table's create, release (keeps a few states for reuse: block.spare) and destroy. */
void *sf_block_stream_create(void *ctx, uint64_t stream);
void sf_block_stream_release(void *ctx, void *state);
void sf_block_stream_destroy(void *ctx, void *state);

/* state_budget= (the options state_budget, spill, spill_sync, state_quant, state_group,
 * state_codec): b->store and its work buffers, or nothing without a budget. */
int sf_block_store_init(sf_stage *st, block *b);
/* With a store: makes b->work hold stream's state (zero for a stream it has not seen); puts
 * b->work back as stream's state after a committed segment. */
int sf_block_state_load(block *b, uint64_t stream);
int sf_block_state_put_back(block *b, uint64_t stream);

/* Every stream's state into out, and back (the stage's save and restore; see block_state.c for
 * the layout). The caller has issued everything the states wait for. */
int sf_block_state_save(block *b, sf_buffer *out);
int sf_block_state_restore(block *b, const uint8_t *data, size_t len);

/* Frees every stream's state, the store and its buffers. */
void sf_block_state_free(block *b);

#endif
