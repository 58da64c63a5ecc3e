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

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef struct sf_backend sf_backend;

/* Arithmetic of the products: F32 is float32 throughout (no TF32); BF16 rounds the operands
 * of products and attention to bfloat16 and accumulates in float32 (normalizations, softmax
 * and the memory M, z stay float32). FP8 (the CUDA backend only, compute capability 8.9 and
 * up) is BF16 except the projections and the MLP: their weights are quantized to FP8 e4m3 once
 * with a scale per output channel, their inputs per row with a scale each, accumulation in
 * float32 (docs/CUDA.md gives its tolerance). AUTO is BF16 on a GPU and F32 on the CPU. */
typedef enum sf_precision {
    SF_PRECISION_AUTO = 0,
    SF_PRECISION_F32 = 1,
    SF_PRECISION_BF16 = 2,
    SF_PRECISION_FP8 = 3
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

/* The core ops, for supports_op. */
typedef enum sf_op {
    SF_OP_MATMUL = 0,
    SF_OP_RMSNORM,
    SF_OP_EMBED,
    SF_OP_SWIGLU,
    SF_OP_ATTENTION,
    SF_OP_MEMORY_MIX,
    SF_OP_MEMORY_UPDATE,
    SF_OP_SUMMARY,
    SF_OP_COUNT
} sf_op;

struct sf_backend_ext; /* internal: fusions, weight preparation, scratch, ordering (kernels/backend_ext.h) */

/* A backend is this table of core ops. A new device implements them (every one but
 * supports_op is required) and gets correct results through every built-in stage: the stages
 * compose what they need from these ops (kernels/backend.c), and only use faster fused forms
 * where a built-in backend offers them. Ops run in the order issued: an op may return before
 * its work is done (a GPU queues it), but each later op sees its results, and download and
 * sync wait for everything issued before them. */
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
    /* Whether op runs with activations (q, k, v for the attention ops) of element type `type`.
     * NULL: every op, float32 only. Callers ask before they pass anything but float32. */
    int (*supports_op)(sf_backend *be, sf_op op, sf_dtype type);

    /* Internal: the built-in backends' fused ops and scheduling (kernels/backend_ext.h). NULL
     * for a backend written against this header; stages then compose the core ops above. */
    const struct sf_backend_ext *ext;
} sf_backend_ops;

struct sf_backend {
    const sf_backend_ops *ops;
    void *impl;
    int threads; /* CPU worker threads the backend may use (0 = all cores) */
    sf_precision precision; /* resolved at creation: F32 or BF16, never AUTO */
};

/* What a backend is created with. Zero-initialized means: device 0, the device's precision,
 * all cores, default settings. */
typedef struct sf_backend_options {
    int device;             /* GPU ordinal where it applies */
    sf_precision precision; /* AUTO: BF16 on a GPU, F32 on the CPU */
    int threads;            /* CPU worker threads (0 = all cores) */
    /* The backend's own settings, "key=value,key=value" (NULL or "": defaults). Each backend
     * documents its keys (the CUDA backend: docs/CUDA.md); an unknown key or a bad value is
     * SF_E_OPTION naming it. A key given here wins over its environment default. */
    const char *settings;
} sf_backend_options;

/* Creates a backend by name: "cpu" (always) or "cuda" (when built with CUDA and a GPU is
 * present; SF_E_BACKEND otherwise, with the reason in sf_last_error()). opts may be NULL for
 * the defaults. The caller owns *out and frees it with sf_backend_free (NULL accepted). BF16
 * on the CPU is refused with SF_E_UNSUPPORTED. */
int sf_backend_create_opts(const char *name, const sf_backend_options *opts, sf_backend **out);

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

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
