/* The compute backend interface. Every built-in stage computes through these ops, so a new
 * device (CUDA, ...) is one more implementation of sf_backend_ops. Pointers passed to ops are
 * backend memory (from ops->alloc); on the CPU backend that is ordinary host memory.
 * Activations are row-major; a "ld" is the stride in floats between consecutive rows.
 * Feature h*d + j of a [n, H*d] buffer is component j of head h (SPEC section 2). */
#ifndef SEQFLOW_BACKEND_H
#define SEQFLOW_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "seqflow/dtype.h"
#include "seqflow/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_backend sf_backend;

/* Arithmetic of the products: F32 is float32 throughout (no TF32); BF16 rounds the operands
 * of products and attention to bfloat16 and accumulates in float32 (normalizations, softmax
 * and the memory M, z stay float32). AUTO is BF16 on a GPU and F32 on the CPU. */
typedef enum sf_precision {
    SF_PRECISION_AUTO = 0,
    SF_PRECISION_F32 = 1,
    SF_PRECISION_BF16 = 2
} sf_precision;

/* sf_dtype (seqflow/dtype.h) is the element type of the attention activations q, k, v: what
 * qkv writes and attention, memory_mix, memory_update and summary read. A row stride ("ld") of
 * such a buffer counts elements of this type. Everything else (x, the attention output, M, z,
 * global tokens) is float32. */

/* Local dilated attention over one segment, with the global tokens as one more part
 * (SPEC sections 3 and 5). out[i, h*d + j] receives A_dot. */
typedef struct sf_attention_desc {
    int n;                    /* rows present (partial segments have n < segment) */
    int segment;              /* N */
    int heads, head_dim;
    int ld;                   /* row stride of q, k, v and out */
    int causal;
    int n_branches;
    const sf_branch *branches;
    int n_global;             /* global tokens present (rows of gk/gv) */
    int global_ld;            /* row stride of gk, gv; head h at column h*head_dim */
    const float *gk, *gv;     /* [n_global, global_ld] or NULL when n_global == 0 */
    float scale;              /* 1/sqrt(d) */
    sf_dtype qkv_type;        /* element type of q, k, v (0: float32); gk, gv, out are float32 */
} sf_attention_desc;

typedef struct sf_backend_ops {
    const char *name;
    /* Buffers. alloc returns NULL on failure; free accepts NULL. */
    void *(*alloc)(sf_backend *be, size_t bytes);
    void (*free)(sf_backend *be, void *ptr);
    int (*upload)(sf_backend *be, void *dst, const void *host_src, size_t bytes);
    int (*download)(sf_backend *be, void *host_dst, const void *src, size_t bytes);
    int (*copy)(sf_backend *be, void *dst, const void *src, size_t bytes);
    int (*zero)(sf_backend *be, void *dst, size_t bytes);
    /* Waits until every op issued so far has finished (no-op on the CPU). */
    int (*sync)(sf_backend *be);

    /* y[n, out] = x[n, in] W^T (+ y when accumulate); W is [out, in] contiguous. */
    int (*matmul)(sf_backend *be, int n, int in, int out, const float *x, int ldx,
                  const float *w, float *y, int ldy, int accumulate);
    /* y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight; y may alias x. */
    int (*rmsnorm)(sf_backend *be, int n, int dim, const float *x, const float *weight,
                   float eps, float *y);
    /* y[i] = table[tokens[i]]; tokens already validated against the vocabulary. */
    int (*embed)(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table,
                 float *y);
    /* a = silu(a) * b, elementwise over [n, f]. */
    int (*swiglu)(sf_backend *be, int n, int f, float *a, const float *b);
    /* out = A_dot, see sf_attention_desc (q, k, v of type desc->qkv_type). */
    int (*attention)(sf_backend *be, const sf_attention_desc *desc, const void *q,
                     const void *k, const void *v, float *out);
    /* a = g_h * Retrieve(q; M, z) + (1 - g_h) * a with g_h = sigmoid(gate[h]) (SPEC 4).
     * M is [heads][d][d], z is [heads][d]; q ([n, ld] of qtype) and a ([n, ld] float32). */
    int (*memory_mix)(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                      const float *M, const float *z, const float *gate, float *a);
    /* The linear or delta update of M and z with this segment's k, v ([n, ld] of kvtype) (SPEC 4). */
    int (*memory_update)(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld,
                         sf_dtype kvtype, const void *k, const void *v, float *M, float *z);
    /* Summary tokens (SPEC 5): row j of sk/sv ([*count, width] float32, width = heads*d)
     * receives the mean of rows [j*segment/S, (j+1)*segment/S) ∩ [0, n) of k/v ([n, ld] of
     * kvtype), for each non-empty chunk. */
    int (*summary)(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld,
                   sf_dtype kvtype, const void *k, const void *v, float *sk, float *sv, int *count);
    /* Frees the backend's own state. */
    void (*destroy)(sf_backend *be);

    /* Optional (NULL when the backend needs neither; callers check).
     * prepare_weight: w (backend memory, [out, in], as later passed to matmul) will not change
     * until freed; the backend may keep a converted copy (bf16 on the GPU) made here, once,
     * instead of per product. The copy is dropped when w is freed through ops->free.
     * reserve: scratch for products and updates of up to `rows` rows of up to `width`
     * columns, with attention and memory of `heads` heads of `head_dim` (0 and 0: products
     * only), sized now so that no op allocates while a stream runs. Calls only ever grow it. */
    int (*prepare_weight)(sf_backend *be, const float *w, int out, int in);
    int (*reserve)(sf_backend *be, int rows, int width, int heads, int head_dim);
    /* matmul_shared: y[i][n, out] = x[n, in] w[i]^T for i < count (no accumulate): products
     * that share their input (Q/K/V, the two SwiGLU inputs). The same result as count matmul
     * calls, which callers make instead when this is NULL; a GPU backend converts x once. */
    int (*matmul_shared)(sf_backend *be, int n, int in, int out, const float *x, int ldx, int count,
                         const float *const *w, float *const *y, int ldy);
    /* qkv: q, k, v [n, width] = u wq^T, u wk^T, u wv^T with u = rmsnorm(x; norm, eps), the
     * attention's input products (x [n, dim] contiguous, weights [width, dim]), written as
     * `type` (qkv_type says which the backend reads fastest); u ([n, dim]) is the caller's
     * scratch. NULL: callers compose rmsnorm and matmul_shared (same function, float32 only). */
    int (*qkv)(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
               const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v,
               float *u);
    /* ffn: x += W2 (silu(W1 u) * (W3 u)) with u = rmsnorm(x; norm, eps): SPEC 2's SwiGLU MLP
     * with its residual, as one op so that a GPU keeps its intermediates in bf16 (no float32
     * [n, hidden] round trips). x is [n, dim] contiguous; w1, w3 are [hidden, dim], w2 is
     * [dim, hidden]. u ([n, dim]) and h1, h3 ([n, hidden]) are the caller's scratch, which the
     * op may overwrite in any layout. When NULL, callers compose rmsnorm, matmul_shared, swiglu
     * and matmul: the same function, with at most the extra rounding of the precision mode. */
    int (*ffn)(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps,
               const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3);
    /* prepare_weight_group: prepare_weight for count weights of one shape that are multiplied
     * with the same input (ffn's W1 and W3): the backend may keep one concatenated copy, so
     * the products become one. Callers use prepare_weight per weight when NULL. */
    int (*prepare_weight_group)(sf_backend *be, int count, const float *const *w, int out, int in);
    /* The side queue: work whose result nothing needs soon (a layer's memory update and
     * global tokens, read only by the next segment) runs beside the work issued after it.
     * side_begin: the ops this thread issues from now on go to the side queue, where they start
     * after everything issued so far (on both queues). side_end: this thread's ops go to the
     * main queue again, and do not wait for the side. side_join: ops issued after it (on
     * either queue) start after everything issued to the side before it. Between begin and
     * join the caller must keep main-queue ops off the buffers the side reads or writes; side
     * ops are device work only (no upload or download). All three NULL (the CPU): ops run in
     * the order issued, which is what they would have joined to. */
    int (*side_begin)(sf_backend *be);
    int (*side_end)(sf_backend *be);
    int (*side_join)(sf_backend *be);
    /* qkv_type: the type in which qkv should write q, k, v of heads of head_dim for the ops
     * that read them to run fastest. NULL means float32. The CUDA backend answers bf16 in
     * precision bf16 where its attention kernel reads bf16 K/V in place (an H100, d = 64): that
     * takes a float32 round trip and the attention's conversion pre-pass out of every layer
     * (bench/RESULTS.md, run 11). The ops take either type; only this one is fast. */
    sf_dtype (*qkv_type)(sf_backend *be, int head_dim);
    /* memory_mix_to: memory_mix with the result written as otype to out ([n, ld], rows ld
     * elements apart) instead of into a, whose contents are undefined afterwards (float32 out
     * must be a itself). With bf16 q/k/v an H100 writes the output product's bf16 input here
     * directly, with no conversion pass. matmul_typed: matmul with x of type xtype ([n, ldx]).
     * NULL (the CPU): callers use memory_mix and matmul, on float32. */
    int (*memory_mix_to)(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                         const float *M, const float *z, const float *gate, float *a, sf_dtype otype, void *out);
    int (*matmul_typed)(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx,
                        const float *w, float *y, int ldy, int accumulate);
    /* attention_mix: attention, then memory_mix_to of its result (SPEC 2: A = g_h A_mem +
     * (1 - g_h) A_dot) into out as otype; a ([n, desc->ld] float32) is scratch, undefined
     * afterwards. The same function as the two ops, with at most the rounding of the precision
     * mode; an H100 in bf16 (d = 64, bf16 q/k/v) fuses them, so the attention's float32 rows
     * are neither written normalized nor read back by a mix. NULL (the CPU): callers use the two. */
    int (*attention_mix)(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                         float *a, const float *M, const float *z, const float *gate, sf_dtype otype, void *out);
    /* side_join_before_product: side_join, with the wait placed in front of the next matrix
     * product issued on the main queue (in front of the reading of its input, a conversion
     * included; or at the next side_join or sync), so that the ops issued before it, among them
     * the norm that qkv and ffn run ahead of their products, keep starting as they would (on
     * the GPU, launched behind the kernel ahead of them: a wait in between stops that). Those
     * ops must not touch what the side reads or writes. NULL (the CPU): callers use side_join. */
    int (*side_join_before_product)(sf_backend *be);
    /* Lanes: further compute queues, each with its own scratch, so that independent work of
     * one thread runs at once on the device (the block stage runs consecutive segments on
     * alternate lanes, so that one's first layers fill the gaps of the other's last ones).
     * lanes(be, want): makes up to `want` lanes (at most SF_BACKEND_LANES; a later call never
     * removes any) and returns how many there are; 0 where there are none.
     * lane_begin: this thread's ops go to `lane` from now on, after everything issued to the
     * main queue so far (not after the other lanes). lane_end: back to the main queue, which
     * does not wait for the lane. lane_join: ops issued to the main queue after it start after
     * everything issued to `lane` before it.
     * lane_signal(mark): marks the current lane's progress (mark < SF_BACKEND_LANE_MARKS);
     * lane_wait(lane, mark): what the current lane issues next starts after `lane` reached
     * `mark` as last signaled before this call (at once if never signaled).
     * A lane's ops are device work only (no upload or download; copy and zero are fine); side
     * queue calls are not made from a lane. NULL (the CPU): no lanes. */
    int (*lanes)(sf_backend *be, int want);
    int (*lane_begin)(sf_backend *be, int lane);
    int (*lane_end)(sf_backend *be);
    int (*lane_join)(sf_backend *be, int lane);
    int (*lane_signal)(sf_backend *be, int mark);
    int (*lane_wait)(sf_backend *be, int lane, int mark);
    /* ffn_h1_floats: how many float32 elements of ffn's h1 scratch ffn will use for n rows (an
     * H100 in bf16 applies SwiGLU in the products' epilogue and uses none); callers may then
     * pass a smaller h1, or NULL for 0. NULL: all of it, n * hidden. */
    size_t (*ffn_h1_floats)(sf_backend *be, int n, int dim, int hidden);
    /* Graphs: the device work this thread issues from graph_begin to graph_end is recorded
     * instead of run, then run as one unit (a CUDA graph: the launches are handed to the
     * device at once and placed back to back). key names the caller's repeated sequence
     * (e.g. a block stage's layers): its graph is kept and updated in place when the next
     * sequence of that key issues the same kinds of work with other arguments.
     * graph_begin returns 1 when it started (graph_end must follow), 0 when the backend will
     * not (graphs off, profiling, lanes in use, too many keys), negative on error. Between the
     * two the caller issues device work only: no upload, download, sync or lane op, and not
     * the first use of a shape (products choose their algorithm by timing at first use; an
     * untimed one is taken while recording). Other threads' ops wait until graph_end.
     * graph_end(issue 0) drops what was recorded (after an error). NULL (the CPU): no graphs. */
    int (*graph_begin)(sf_backend *be, const void *key);
    int (*graph_end)(sf_backend *be, const void *key, int issue);
    /* rmsnorm_typed: rmsnorm with y of element type otype (bf16: the float32 result rounded to
     * nearest even once, bit-identical to rmsnorm followed by that rounding); y must not alias
     * x. The final norm uses it to send out bf16 rows, so that the device-to-host copy halves.
     * NULL (the CPU): callers run rmsnorm and round on the host. */
    int (*rmsnorm_typed)(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, sf_dtype otype,
                         void *y);
    /* upload_unordered: upload, ordered before the ops issued after it but not after those
     * issued before it, so that the copy runs while they do (a GPU otherwise starts it only
     * when they are done). The caller guarantees that no op issued before it reads or writes
     * dst. NULL (the CPU): callers use upload. */
    int (*upload_unordered)(sf_backend *be, void *dst, const void *host_src, size_t bytes);
} sf_backend_ops;

#define SF_BACKEND_LANES 2
#define SF_BACKEND_LANE_MARKS 64

struct sf_backend {
    const sf_backend_ops *ops;
    void *impl;
    int threads; /* CPU worker threads the backend may use (0 = all cores) */
    sf_precision precision; /* resolved at creation: F32 or BF16, never AUTO */
};

/* Creates a backend by name: "cpu" (always) or "cuda" (when built with CUDA and a GPU is
 * present; SF_E_BACKEND otherwise, with the reason in sf_last_error()). The caller owns *out
 * and frees it with sf_backend_free. device selects the GPU ordinal where it applies. */
int sf_backend_create(const char *name, int device, sf_backend **out);
/* The same with a precision: AUTO picks the device's default; BF16 on the CPU is refused
 * with SF_E_UNSUPPORTED (sf_backend_create is this with SF_PRECISION_AUTO). */
int sf_backend_create_ex(const char *name, int device, sf_precision precision, sf_backend **out);
void sf_backend_free(sf_backend *be);

/* Names of the backends compiled into this build, NULL-terminated, static. */
const char *const *sf_backend_names(void);

#ifdef __cplusplus
}
#endif
#endif
