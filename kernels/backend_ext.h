/* The built-in backends' extensions beyond the core ops of seqflow/backend.h: weight
 * preparation, scratch reservation, fused ops and the ordering of a GPU's queues. Internal:
 * stages never call a slot of this table. They call the sf_be_* functions below, which use a
 * slot where the backend fills it and otherwise compose the same function from core ops (the
 * one place that does). Every slot may be NULL; a backend without the table (ops->ext NULL,
 * the CPU and any backend written against the public header) gets the composed forms.
 *
 * Ownership and memory are those of the core ops: pointers are backend memory, ops issue in
 * order on the calling thread's queue. */
#ifndef SEQFLOW_KERNELS_BACKEND_EXT_H
#define SEQFLOW_KERNELS_BACKEND_EXT_H

#include <stddef.h>

#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_backend_ext {
    /* ---- weights and scratch ----
     * prepare_weight_group: count weights of one shape [out, in] (backend memory, later passed
     * to matmul as they are) will not change until freed; the backend may keep converted
     * copies (bf16 on a GPU), made once here, and, where they multiply the same input (Q/K/V,
     * W1/W3), one concatenated copy so that the products become one. Dropped when the weight
     * is freed through ops->free.
     * reserve: scratch for products and updates of up to `rows` rows of up to `width` columns,
     * with attention and memory of `heads` heads of `head_dim` (0 and 0: products only), sized
     * now so that no op allocates while a stream runs. Calls only ever grow it. */
    int (*prepare_weight_group)(sf_backend *be, int count, const float *const *w, int out, int in);
    int (*reserve)(sf_backend *be, int rows, int width, int heads, int head_dim);

    /* ---- fused ops: each the same function as its composition in kernels/backend.c, with at
     * most the rounding of the precision mode ----
     * qkv_type: the type in which qkv should write q, k, v of heads of head_dim for the ops
     * that read them to run fastest (bf16 on an H100 at d = 64; the ops take either).
     * qkv: q, k, v [n, width] = u wq^T, u wk^T, u wv^T with u = rmsnorm(x; norm, eps), written
     * as `type`; u ([n, dim]) is scratch.
     * ffn: x += W2 (silu(W1 u) * (W3 u)) with u = rmsnorm(x; norm, eps); u, h1, h3 are scratch
     * (h1 may be smaller, or NULL, as ffn_h1_floats says).
     * ffn_h1_floats: float32 elements of ffn's h1 that ffn uses for n rows.
     * attention_mix: attention, then (M non-NULL) memory_mix_to of its result into out as
     * otype; a ([n, desc->ld] float32) is scratch.
     * memory_mix_to: memory_mix with the result written as otype to out (a is then undefined).
     * matmul_typed: matmul with x of element type xtype and y of ytype (bf16: the float32
     * accumulator rounded once; written, never accumulated).
     * rmsnorm_typed: rmsnorm with y of element type otype (bf16: the float32 result rounded to
     * nearest even, bit-identical to rmsnorm then rounding); y must not alias x. */
    sf_dtype (*qkv_type)(sf_backend *be, int head_dim);
    int (*qkv)(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
               const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v,
               float *u);
    int (*ffn)(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps,
               const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3);
    size_t (*ffn_h1_floats)(sf_backend *be, int n, int dim, int hidden);
    /* ffn_partial: ffn without the residual, y = W2 (silu(W1 u) * (W3 u)) written as ytype
     * (x is read only by the norm; a float32 y may be x): a head-parallel rank's part of the MLP
     * (stages/block_shard.c) */
    int (*ffn_partial)(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                       const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3,
                       sf_dtype ytype, void *y);
    int (*attention_mix)(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                         float *a, const float *M, const float *z, const float *gate, sf_dtype otype, void *out);
    int (*memory_mix_to)(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                         const float *M, const float *z, const float *gate, float *a, sf_dtype otype, void *out);
    int (*matmul_typed)(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx, const float *w,
                        sf_dtype ytype, void *y, int ldy, int accumulate);
    int (*rmsnorm_typed)(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps,
                         sf_dtype otype, void *y);

    /* ---- head-parallel parts ----
     * part_type: the type in which a head-parallel rank writes its parts of the output product
     * and the MLP for the ranks' sum: bf16 where the products round their operands to bf16
     * anyway (half the bytes to move), float32 otherwise. Used only with matmul_typed's and
     * ffn_partial's ytype and add_typed.
     * add_typed: x[i] += y[i] for count elements, y of ytype.
     * normed_type: the type of the normed rows u = rmsnorm(x) that qkv_from and ffn_partial_from
     * take (bf16 where the products round their input to bf16 anyway); float32: they take none.
     * qkv_from, ffn_partial_from: qkv and ffn_partial given u ([n, dim], rows dim apart, of
     * normed_type) instead of x and the norm: the head-parallel ranks' sums hand every rank u
     * (kernels/comm.h, reduce_norm), so the products do not norm the rows again. */
    sf_dtype (*part_type)(sf_backend *be);
    int (*add_typed)(sf_backend *be, size_t count, float *x, sf_dtype ytype, const void *y);
    sf_dtype (*normed_type)(sf_backend *be);
    int (*qkv_from)(sf_backend *be, int n, int dim, int width, const void *u, const float *wq, const float *wk,
                    const float *wv, sf_dtype type, void *q, void *k, void *v);
    int (*ffn_partial_from)(sf_backend *be, int n, int dim, int hidden, const void *u, const float *w1, const float *w3,
                            const float *w2, float *h1, float *h3, sf_dtype ytype, void *y);

    /* ---- ordering ----
     * upload_unordered: upload, ordered before the ops issued after it but not after those
     * issued before it (the caller guarantees none of those touches dst).
     * The side queue, for work whose result nothing needs soon (a layer's commit: the memory
     * update and global tokens, read only by the next segment): side_begin: this thread's ops
     * go to the side queue from now on, starting after everything issued so far; side_end:
     * back to the main queue, which does not wait for the side; side_join: ops issued after it
     * start after everything issued to the side before it; side_join_before_product: the same
     * wait, placed in front of the next matrix product (so that the norm ahead of it still
     * launches early). Side ops are device work only. */
    int (*upload_unordered)(sf_backend *be, void *dst, const void *host_src, size_t bytes);
    int (*side_begin)(sf_backend *be);
    int (*side_end)(sf_backend *be);
    int (*side_join)(sf_backend *be);
    int (*side_join_before_product)(sf_backend *be);

    /* ---- checks ----
     * non_finite_begin: issues a scan of the first `count` elements of x (backend memory, of
     * element type `type`) for NaN or infinity, ordered after the ops issued before it, and
     * returns at once with *ticket for non_finite_end. non_finite_end: *found for that ticket,
     * waiting for its scan. Issued before a download of the same rows and ended after it, the
     * scan costs no wait of its own: the download waits for it anyway. Each begin must be
     * ended (a backend keeps a bounded number of tickets in flight). */
    int (*non_finite_begin)(sf_backend *be, const void *x, sf_dtype type, size_t count, int *ticket);
    int (*non_finite_end)(sf_backend *be, int ticket, int *found);

    /* ---- settings the stages follow ----
     * device_rows: whether rows stay in backend memory between stages (0: every stage boundary
     * goes through the host, for comparing the two paths). NULL: they stay. */
    int (*device_rows)(sf_backend *be);

    /* ---- start-up ----
     * warmup: called by a stage once its weights are prepared and its scratch reserved; the
     * backend pays its own first-use costs now (loading its kernels' images) and answers 1 when
     * the stage should also run one segment's work once before any stream (so that product
     * plans, library kernels and buffers are ready before the first segment arrives), 0 when
     * not (setting warmup=0), or a negative SF_E_* code. NULL: 0. */
    int (*warmup)(sf_backend *be);

    /* ---- transfers ----
     * download_start: begins copying bytes of src (backend memory) into host_dst after
     * everything issued so far, and returns at once with a ticket; download_wait(ticket) waits
     * for the copy. SF_E_UNSUPPORTED (sf_last_error untouched) where it cannot now (host_dst
     * not page-locked, no free transfer slot): the caller downloads the usual way. Waits may
     * come from another thread. NULL: never. */
    int (*download_start)(sf_backend *be, void *host_dst, const void *src, size_t bytes, void **ticket);
    int (*download_wait)(sf_backend *be, void *ticket);
} sf_backend_ext;

/* ---- what stages call (kernels/backend.c) ------------------------------------------------ */

/* Whether the backend queues work beside the main queue (a side queue): the block stage then
 * defers commits so that they run beside the next layer's attention. */
int sf_be_has_side_queue(const sf_backend *be);
/* prepare_weight_group, or nothing (the weights are used as they are). */
int sf_be_prepare_weights(sf_backend *be, int count, const float *const *w, int out, int in);
/* reserve, or nothing. */
int sf_be_reserve(sf_backend *be, int rows, int width, int heads, int head_dim);
/* The type qkv writes for head_dim: the backend's answer where it has a fused qkv and supports
 * the type in every attention op, else float32. */
sf_dtype sf_be_qkv_type(sf_backend *be, int head_dim);
/* The type in which attention_mix hands the mixed attention to the output product: bf16 where
 * q/k/v are bf16, the model has a memory and the backend has memory_mix_to and matmul_typed;
 * else float32 (out is then a itself). */
sf_dtype sf_be_mix_type(sf_backend *be, sf_dtype qkv_type, int has_memory);
/* q, k, v = rmsnorm(x) Wq^T, Wk^T, Wv^T (float32 composed: rmsnorm, three matmuls). */
int sf_be_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
              const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v, float *u);
/* Attention, then (M non-NULL) the memory retrieval and gate (SPEC 2: A = g A_mem + (1-g) A_dot)
 * into out as otype (otype as sf_be_mix_type says; float32 out must be a). */
int sf_be_attention_mix(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                        float *a, const float *M, const float *z, const float *gate, sf_dtype otype, void *out);
/* y (+)= x W^T with x of type xtype, y of ytype (float32 composed: matmul). */
int sf_be_matmul_typed(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx, const float *w,
                       sf_dtype ytype, void *y, int ldy, int accumulate);
/* float32 elements of h1 that sf_be_ffn needs for n rows. */
size_t sf_be_ffn_h1_floats(sf_backend *be, int n, int dim, int hidden);
/* x += W2 (silu(W1 u) * (W3 u)), u = rmsnorm(x) (composed: rmsnorm, matmuls, swiglu, matmul). */
int sf_be_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
              const float *w3, const float *w2, float *u, float *h1, float *h3);
/* y = W2 (silu(W1 u) * (W3 u)) as ytype, u = rmsnorm(x): sf_be_ffn without the residual (the
 * same composition with the last product written, not added; float32 only, y may be x). */
int sf_be_ffn_partial(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                      const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3, sf_dtype ytype,
                      void *y);
/* The type of a head-parallel rank's parts: the backend's part_type where it also has
 * matmul_typed, ffn_partial and add_typed, else float32. */
sf_dtype sf_be_part_type(sf_backend *be);
/* x[i] += y[i], count elements, y of ytype: add_typed, or SF_E_UNSUPPORTED without it. */
int sf_be_add_typed(sf_backend *be, size_t count, float *x, sf_dtype ytype, const void *y);
/* The type of normed rows the products take (normed_type): bf16 where the backend has
 * normed_type, qkv_from and ffn_partial_from and answers bf16, else float32 (they take none). */
sf_dtype sf_be_normed_type(sf_backend *be);
/* qkv_from and ffn_partial_from: SF_E_UNSUPPORTED without them. */
int sf_be_qkv_from(sf_backend *be, int n, int dim, int width, const void *u, const float *wq, const float *wk,
                   const float *wv, sf_dtype type, void *q, void *k, void *v);
int sf_be_ffn_partial_from(sf_backend *be, int n, int dim, int hidden, const void *u, const float *w1, const float *w3,
                           const float *w2, float *h1, float *h3, sf_dtype ytype, void *y);
/* rmsnorm_typed where the backend has it: SF_E_UNSUPPORTED otherwise (callers round on the host). */
int sf_be_rmsnorm_typed(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps,
                        sf_dtype otype, void *y);
/* non_finite_begin then non_finite_end, where the backend has them: SF_E_UNSUPPORTED otherwise
 * (sf_last_error untouched; the caller then scans on the host, or not at all). */
int sf_be_any_non_finite(sf_backend *be, const void *x, sf_dtype type, size_t count, int *found);
/* A check of rows in backend memory about to be brought to the host, in two halves around the
 * download: with checks ON (sf_set_check_finite) begin issues the backend's scan where the rows
 * are; end, after the download, sets *scan_host to 1 when the caller must scan its host copy, to
 * name the first non-finite value (or because the backend cannot look). In other modes nothing
 * runs and *scan_host is 0. end must follow every begin that returned SF_OK. */
typedef struct sf_rows_check {
    int state; /* 0 nothing issued, 1 a backend scan in flight (ticket), 2 the host must scan */
    int ticket;
} sf_rows_check;
int sf_be_check_rows_begin(sf_backend *be, const void *rows, sf_dtype type, size_t count, sf_rows_check *chk);
/* download_start and download_wait where the backend has them: SF_E_UNSUPPORTED otherwise. */
int sf_be_download_start(sf_backend *be, void *host_dst, const void *src, size_t bytes, void **ticket);
int sf_be_download_wait(sf_backend *be, void *ticket);
int sf_be_check_rows_end(sf_backend *be, sf_rows_check *chk, int *scan_host);
/* Whether stages keep rows in backend memory between them: never on the CPU (host memory is
 * backend memory there), else the backend's device_rows, else yes. */
int sf_be_device_rows(sf_backend *be);
/* The backend's warmup (see the slot), or 0: whether the stage should run a segment's work once
 * at set-up; negative on failure. */
int sf_be_warmup(sf_backend *be);
/* A function of the CUDA backend module (libseqflow-cuda.so), loading it on first use; NULL in
 * a build without CUDA, or when the module cannot be loaded or lacks it. For the parts of the
 * library that reach CUDA code other than through a backend (the NCCL communicator). */
void *sf_cuda_module_symbol(const char *name);
/* upload_unordered, or upload. */
int sf_be_upload_unordered(sf_backend *be, void *dst, const void *host_src, size_t bytes);
/* The side queue, or nothing (ops then run in the order issued, which is what they would have
 * joined to). */
int sf_be_side_begin(sf_backend *be);
int sf_be_side_end(sf_backend *be);
int sf_be_side_join(sf_backend *be);
int sf_be_side_join_before_product(sf_backend *be);

#ifdef __cplusplus
}
#endif
#endif
