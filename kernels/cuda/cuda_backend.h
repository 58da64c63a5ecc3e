/* The CUDA backend: device memory, one compute stream, cuBLAS products, hand-written kernels
 * for the row-wise ops and the compressive memory, sf_cuda_attention_f32/_bf16 for attention.
 * Host <-> device copies of activations go through pinned, double-buffered staging on two copy
 * streams (sized by reserve), ordered against the compute stream by events.
 * kernels/backend.c creates it by name ("cuda"). Built only when nvcc is present.
 *
 * Threads: the stages of one graph share its backend from several threads. Every op issues
 * its launches under the backend's lock onto the one compute stream, so ops never interleave
 * inside the stream and shared scratch is safe; download and sync wait outside the lock.
 *
 * Memory: ops->alloc is cudaMalloc (counted, see sf_cuda_backend_memory); the bf16 weight
 * copies (prepare_weight_group) and the scratch (reserve) are counted too. Ops allocate nothing.
 *
 * Settings (cuda_settings.h, docs/CUDA.md) are parsed once in sf_cuda_backend_init and kept in
 * the backend; the kernels' entry points take what they need from there. */
#ifndef SEQFLOW_KERNELS_CUDA_BACKEND_H
#define SEQFLOW_KERNELS_CUDA_BACKEND_H

#include <stddef.h>

#include "seqflow/backend.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *be (ops, impl) for GPU `device` with be->precision already resolved (F32 or BF16).
 * settings: the backend's "key=value,..." string (sf_backend_options.settings; NULL or "" for
 * the environment defaults), read here only, never kept. Creates the streams, the cuBLAS
 * handle and its workspace. Returns SF_OK; SF_E_OPTION naming a bad setting (checked before
 * the device is touched); or SF_E_BACKEND naming the CUDA failure (no GPU, no driver, bad
 * ordinal). Nothing is left allocated on failure. ops->destroy releases everything (the caller
 * frees *be itself, as sf_backend_free does). */
int sf_cuda_backend_init(sf_backend *be, int device, const char *settings);

typedef struct sf_cuda_memory {
    size_t allocated;      /* bytes held now through this backend (buffers, bf16 weights, scratch, workspace) */
    size_t peak;           /* the most `allocated` has been since creation */
    size_t device_free;    /* cudaMemGetInfo: free bytes on the device (all processes) */
    size_t device_total;   /* cudaMemGetInfo: the device's memory */
} sf_cuda_memory;

/* Memory figures of a CUDA backend (for benchmarks). be must be a "cuda" backend:
 * SF_E_INVAL otherwise; SF_E_BACKEND when cudaMemGetInfo fails. */
int sf_cuda_backend_memory(const sf_backend *be, sf_cuda_memory *out);

/* Product plans of a CUDA backend so far (for tests and benchmarks): the shapes whose cuBLAS
 * path was chosen by timing, and those taken from the plan cache (setting plan_cache). be must
 * be a "cuda" backend: SF_E_INVAL otherwise. */
typedef struct sf_cuda_plans {
    int timed;
    int from_cache;
} sf_cuda_plans;
int sf_cuda_backend_plans(const sf_backend *be, sf_cuda_plans *out);

#ifdef __cplusplus
}
#endif

/* ---- internal, shared by the .cu files of kernels/cuda ------------------------------------- */
#ifdef __CUDACC__
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "seqflow/error.h"

typedef struct sf_cuda_weight {
    const float *f32;       /* the backend buffer as the stage passes it to matmul */
    __nv_bfloat16 *bf16;    /* its bf16 copy, made once (NULL where it has an FP8 one) */
    unsigned char *fp8;     /* precision fp8: its e4m3 copy [out, in], row o = W[o] / scale[o] */
    float *scale;           /* with fp8: the per-output-channel scales, [out]; with block, one for
                               each 128 inputs of a channel, [in / 128][out] */
    int block;              /* fp8 scales per 128 inputs (a weight prepared alone; setting fp8_blocks) */
    size_t count;
    int out, in;            /* its shape: a product of another shape must not use the copy */
    void *mem;              /* the group's one allocation (copies, then scales) */
    int index;              /* its place in the group */
    size_t owned;           /* bytes of mem this entry frees (0: a later member of a group, whose
                               first entry owns the memory) */
} sf_cuda_weight;

typedef struct sf_cuda_alloc {
    void *ptr;
    size_t bytes;
} sf_cuda_alloc;

/* A pinned host buffer for copies: `ready` orders the copy after the compute stream's prior
 * work, `done` marks the copy finished. */
typedef struct sf_cuda_staging {
    void *host;
    size_t bytes;
    cudaEvent_t ready, done;
    int pending; /* an upload from it may still be in flight */
    int busy;    /* a download is using it (its thread copies out without the lock) */
} sf_cuda_staging;

#define SF_CUDA_STAGING_SLOTS 2

typedef struct sf_cuda_profile sf_cuda_profile; /* profile.cu */

/* One product shape's way through cuBLAS (gemm_plan.cu): the cuBLASLt algorithm timed fastest at
 * the shape's first use, or cublasGemmEx. Descriptors live inside (Init, no heap), so the
 * table needs no teardown. */
typedef struct sf_cuda_gemm_plan {
    int n, in, out, ldy, batch, accumulate, align;
    long long stride_w, stride_y;
    cudaDataType ytype;
    int use_lt; /* 0: cublasGemmEx was as fast, or Lt offered no algorithm */
    cublasLtMatmulAlgo_t algo;
    size_t workspace_bytes;
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t a, b, c;
} sf_cuda_gemm_plan;

#define SF_CUDA_GEMM_PLANS 32 /* shapes planned; later ones take cublasGemmEx untimed */

/* One FP8 product shape's cuBLASLt algorithm (gemm_fp8.cu), chosen at its first use. outer:
 * cuBLASLt applies the weight and row scales (outer-vector scale mode); else unit scales and
 * the epilogue kernel applies them. block: the weight's scales are per 128 x 128 block and the
 * input's per 128 values of a row (sf_cuda_fp8_args), applied by cuBLASLt. */
typedef struct sf_cuda_fp8_plan {
    int n, in, out, ldy, accumulate, align, outer, block, fast_accum;
    cudaDataType ytype;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t a, b, c;
} sf_cuda_fp8_plan;

/* A compute stream with what an op issuing to it may use: the scratch, the cuBLAS workspace
 * and the float32 copies (widened). */
typedef struct sf_cuda_stream {
    cudaStream_t stream;
    void *scratch;
    size_t scratch_bytes;
    void *blas_workspace;
    size_t blas_workspace_bytes;
    void *widened;
    size_t widened_bytes;
} sf_cuda_stream;

#define SF_CUDA_FINITE_FLAGS 64

typedef struct sf_cuda {
    int device;
    /* the non-finite scans' answers: mapped page-locked ints the kernel writes from the device,
     * one per scan between its begin and its end */
    int *finite_flags, *finite_flags_dev;
    cudaEvent_t finite_done[SF_CUDA_FINITE_FLAGS]; /* recorded behind each call's kernel */
    unsigned char finite_busy[SF_CUDA_FINITE_FLAGS]; /* begun, not yet ended (under the lock) */
    unsigned finite_next;
    sf_cuda_device_info info; /* compute capability, asked once at init: the kernels are picked by it */
    sf_precision precision;
    sf_cuda_settings settings; /* parsed once at init; read-only afterwards */
    /* the attention kernel reads bf16 q/k/v in place: precision bf16, compute capability 9.0,
     * settings.qkv_bf16 (qkv_type and supports_op answer from it) */
    int bf16_in_place;
    cudaStream_t stream;
    cudaStream_t copy_in, copy_out; /* host <-> device copies, off the compute stream */
    sf_cuda_staging up[SF_CUDA_STAGING_SLOTS], down[SF_CUDA_STAGING_SLOTS];
    int up_next;
    size_t staging_limit; /* the largest transfer staged (reserve); larger ones are plain copies */
    cublasHandle_t blas;
    void *blas_workspace;
    size_t blas_workspace_bytes;
    pthread_mutex_t lock;
    sf_cuda_alloc *allocs; /* live ops->alloc buffers, for the byte count */
    int n_allocs, cap_allocs;
    sf_cuda_weight *weights;
    int n_weights, cap_weights;
    void *scratch; /* bf16 activations of a product, or the delta targets: reserve() */
    size_t scratch_bytes;
    /* float32 copies of bf16 q, k, v for an attention kernel that reads float32 only (not an
     * H100, d != 64, a non-default variant): allocated at the first such call, then kept */
    void *widened;
    size_t widened_bytes;
    size_t allocated, peak;
    sf_cuda_profile *profile;                         /* settings.profile only */
    sf_cuda_gemm_plan gemm_plans[SF_CUDA_GEMM_PLANS]; /* gemm_plan.cu, under the lock */
    int n_gemm_plans;
    struct sf_cuda_plan_cache *plan_cache; /* gemm_plan_cache.cu; NULL until a shape's first product */
    int plan_cache_failed;                 /* the cache could not be set up: no second try */
    int plans_timed, plans_cached;         /* sf_cuda_backend_plans */
    /* precision fp8 (be->precision FP8; c->precision is then BF16 for everything else):
     * weights of shapes cuBLASLt takes in FP8 get e4m3 copies at prepare_weight_group */
    int fp8;
    int fp8_outer; /* cuBLASLt applies the scales (probed at init; setting fp8_scale) */
    int fp8_block; /* cuBLASLt offers block scales (probed at init; setting fp8_blocks) */
    sf_cuda_fp8_plan fp8_plans[SF_CUDA_GEMM_PLANS]; /* gemm_fp8.cu, under the lock */
    int n_fp8_plans;
    /* The side queue (ext side_begin/end/join): its own stream. While a thread is on it,
     * sf_cuda_enter swaps it with the fields above (stream, scratch, cuBLAS stream and
     * workspace, widened), so every op issues to it unchanged and never shares scratch with
     * the main stream; leave swaps back. side.stream is NULL when disabled (settings
     * side_queue=0, or profiling). */
    sf_cuda_stream side;
    sf_cuda_stream *swapped; /* the stream whose fields are swapped in now (inside enter/leave) */
    int join_at_product;     /* side_join_before_product: the next main-stream product waits first */
    cudaEvent_t side_start, side_done;
} sf_cuda;

static inline sf_cuda *sf_cuda_of(sf_backend *be) { return (sf_cuda *)be->impl; }

/* The plan cache (gemm_plan_cache.cu), under the lock. find: 1 and p's path filled (use_lt,
 * algo, workspace_bytes; p's descriptors must be set up) when the cache holds one that cuBLASLt
 * still accepts for p's shape, else 0. add: p's chosen path, to be written at close. close:
 * writes what was added (a cache: failures are silent) and frees it; at the backend's release. */
int sf_cuda_plan_cache_find(sf_cuda *c, sf_cuda_gemm_plan *p);
void sf_cuda_plan_cache_add(sf_cuda *c, const sf_cuda_gemm_plan *p);
void sf_cuda_plan_cache_close(sf_cuda *c);

/* Returns SF_E_BACKEND with the CUDA message when err is not cudaSuccess. */
static inline int sf_cuda_status(cudaError_t err, const char *what)
{
    if (err == cudaSuccess) return SF_OK;
    return sf_error(SF_E_BACKEND, "CUDA: %s: %s", what, cudaGetErrorString(err));
}
int sf_cublas_status(cublasStatus_t st, const char *what);
/* Checks the last launch (configuration errors surface here, not at the call). */
static inline int sf_cuda_launched(const char *kernel) { return sf_cuda_status(cudaGetLastError(), kernel); }

/* The wait side_join_before_product left for the next main-stream product, if any (under the
 * lock): sf_cuda_gemm calls it, and every product path before it first reads its input. */
int sf_cuda_join_at_product(sf_cuda *c);

/* Takes the backend's lock, makes its device current on this thread and its early_launch
 * setting the one sf_cuda_launch_early uses on this thread (launch_early.cuh); leave unlocks. */
int sf_cuda_enter(sf_cuda *c);
void sf_cuda_leave(sf_cuda *c);
/* The stream of c that this thread's ops go to (NULL: the main stream), set outside
 * enter/leave; the stream this thread is on now, if it belongs to c. */
void sf_cuda_set_thread_stream(sf_cuda *c, sf_cuda_stream *s);
sf_cuda_stream *sf_cuda_thread_stream(const sf_cuda *c);
/* A stream of its own with scratch of scratch_bytes and cuBLAS workspace (under the lock), and
 * their release (nothing issued to it may still run). */
int sf_cuda_stream_create(sf_cuda *c, sf_cuda_stream *s, size_t scratch_bytes, size_t blas_workspace_bytes);
void sf_cuda_stream_release(sf_cuda *c, sf_cuda_stream *s);
/* Grows the counted scratch to at least `bytes` (under the lock). */
int sf_cuda_scratch(sf_cuda *c, size_t bytes);
/* Counted device allocation / release for the backend's own buffers (under the lock). */
int sf_cuda_malloc_counted(sf_cuda *c, void **ptr, size_t bytes);
/* Grows c->widened to at least `bytes` (under the lock; kept until the backend is destroyed). */
int sf_cuda_widened(sf_cuda *c, size_t bytes);
void sf_cuda_free_counted(sf_cuda *c, void *ptr, size_t bytes);

/* Kernels launched on `stream` (elementwise.cu); they return launch status. */
int sf_cuda_f32_to_bf16(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, cudaStream_t stream);
/* the same with the rows of dst ldd elements apart */
int sf_cuda_f32_to_bf16_ld(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, int ldd,
                           cudaStream_t stream);
int sf_cuda_bf16_to_f32(const __nv_bfloat16 *src, size_t count, float *dst, cudaStream_t stream);
/* y = rmsnorm(x), float32, [n, dim] contiguous both (the op's launch, for callers holding the lock). */
int sf_cuda_rmsnorm_f32(int n, int dim, const float *x, const float *weight, float eps, float *y, cudaStream_t stream);
/* y = rmsnorm(x) rounded to bf16, [n, dim] contiguous both (the input of a bf16 product). */
int sf_cuda_rmsnorm_to_bf16(int n, int dim, const float *x, const float *weight, float eps, __nv_bfloat16 *y,
                            cudaStream_t stream);
/* g[i, j] = silu(h[i, j]) * h[i, f + j] for h [n, 2f] and g [n, f], bf16, float32 arithmetic. */
int sf_cuda_swiglu_rows_bf16(int n, int f, const __nv_bfloat16 *h, __nv_bfloat16 *g, cudaStream_t stream);
/* For the Hopper-only kernels (sm_90a images): the current device's multiprocessor count when it
 * has compute capability 9.0, `kernel`'s image loads there and its dynamic shared memory can be
 * raised to smem_bytes; else 0 (the error a missing image leaves is cleared). Callers keep the
 * answer per device: sf_cuda_hopper_known. */
int sf_cuda_hopper_kernel_fits(const void *kernel, int smem_bytes);
/* The per-device memo of such an answer: known[dev] 0 means not asked yet; a benign race may
 * fill an entry twice with the same value. Returns the answer for the current device. */
int sf_cuda_hopper_known(int *known, const void *kernel, int smem_bytes);
/* swiglu_gate_up.cu (sm_90a): g[n, hidden] = silu(u w1^T) * (u w3^T), u [n, dim], w1 and w3
 * [hidden, dim], g bf16, SwiGLU in the products' epilogue (float32 accumulators, one rounding).
 * usable: the multiprocessor count when this is an H100 class device (compute capability 9.0
 * with the sm_90a image) and dim, hidden are multiples of 8; else 0. Pointers 16-byte aligned. */
int sf_cuda_swiglu_gate_up_usable(int dim, int hidden);
int sf_cuda_swiglu_gate_up(int n, int dim, int hidden, const __nv_bfloat16 *u, const __nv_bfloat16 *w1,
                           const __nv_bfloat16 *w3, __nv_bfloat16 *g, cudaStream_t stream);
/* The same in precision fp8: u [n, dim] e4m3 with a scale per row (su: u's row i is su[i] times
 * its e4m3 values), w1 and w3 [hidden, dim] e4m3 with a scale per row (s1, s3), g bf16. usable:
 * as above, dim a multiple of 16. */
int sf_cuda_swiglu_gate_up_e4m3_usable(int dim, int hidden);
int sf_cuda_swiglu_gate_up_e4m3(int n, int dim, int hidden, const unsigned char *u, const float *su,
                                const unsigned char *w1, const unsigned char *w3, const float *s1, const float *s3,
                                __nv_bfloat16 *g, cudaStream_t stream);
/* The same writing g quantized as sf_cuda_fp8_quantize_blocks would (g8 [n, hidden] e4m3, gs a
 * scale for each 128 values of a row, [hidden / 128][n]), straight from the float32 sums; hidden
 * a multiple of 128. */
int sf_cuda_swiglu_gate_up_e4m3_blocks(int n, int dim, int hidden, const unsigned char *u, const float *su,
                                       const unsigned char *w1, const unsigned char *w3, const float *s1,
                                       const float *s3, unsigned char *g8, float *gs, cudaStream_t stream);

/* A bf16 product on cuBLAS (gemm_plan.cu): y (float32 or bf16, rows ldy apart) = x w^T + beta y
 * for `batch` weights stride_w elements apart with one shared x, outputs stride_y elements
 * apart; x, w bf16 and contiguous. Issued with the algorithm chosen at the shape's first use.
 * Under the lock, on c->stream. */
typedef struct sf_cuda_gemm_args {
    int n, in, out, ldy, batch;
    long long stride_w, stride_y;
    const __nv_bfloat16 *x, *w;
    void *y;
    cudaDataType ytype;
    float beta;
} sf_cuda_gemm_args;
int sf_cuda_gemm(sf_cuda *c, const sf_cuda_gemm_args *g, const char *what);

/* ---- precision fp8 (gemm_fp8.cu) ----
 * Whether FP8 e4m3 products run here: at init (precision fp8) on compute capability 8.9 and
 * up, asking cuBLASLt for an algorithm with outer-vector scales (unless setting fp8_scale says
 * epilogue), else with unit scales; sets c->fp8_outer, and c->fp8_block where block scales are
 * offered too (setting fp8_blocks). SF_E_UNSUPPORTED naming the reason when neither is offered.
 * Under no lock (init). */
int sf_cuda_fp8_init(sf_cuda *c);
/* Whether a weight of [out, in] gets an FP8 copy (both multiples of 16: cuBLASLt's FP8 rule). */
int sf_cuda_fp8_shape_ok(int out, int in);
/* n rounded up to a multiple of 4: the rows of a block-scaled input (cuBLASLt's rule). */
int sf_cuda_fp8_padded_rows(int n);
/* Whether a weight [out, in] takes block scales here (c->fp8_block, in a multiple of 128, and
 * cuBLASLt offering the shape: on an H100 it offers none for [64, 8192], for one). Under the
 * lock, or at init. */
int sf_cuda_fp8_block_offered(sf_cuda *c, int out, int in);
/* q[r, :] = e4m3(v[r, :] / scale[r]) with scale[r] = max |v[r, :]| / 448 (1 for a zero row),
 * for n rows of cols values v read from x as `kind` says; q [n, cols] contiguous. */
typedef enum sf_cuda_fp8_input {
    SF_CUDA_FP8_IN_F32 = 0, /* v = x (float32, rows ldx apart) */
    SF_CUDA_FP8_IN_BF16,    /* v = x (bf16, rows ldx apart) */
    SF_CUDA_FP8_IN_RMSNORM, /* v = rmsnorm(x; norm, eps) (float32 x, rows ldx apart) */
    SF_CUDA_FP8_IN_SWIGLU   /* v = silu(h[:, j]) * h[:, cols + j] (bf16 h [n, 2 cols], rows ldx apart) */
} sf_cuda_fp8_input;
int sf_cuda_fp8_quantize_rows(sf_cuda_fp8_input kind, int n, int cols, const void *x, int ldx, const float *norm,
                              float eps, unsigned char *q, float *scale, cudaStream_t stream);
/* The same with a scale for each 128 values of a row (a block weight, and the input of its
 * product): q[r, j] = e4m3(v[r, j] / scale[(j / 128) rows + r]), the scale max |v| / 448 over
 * those 128 values (1 where all are zero; for RMSNORM after the row's norm). cols a multiple of
 * 128. rows = sf_cuda_fp8_padded_rows(n): q and scale hold that many, those past n zeros. */
int sf_cuda_fp8_quantize_blocks(sf_cuda_fp8_input kind, int n, int cols, const void *x, int ldx, const float *norm,
                                float eps, unsigned char *q, float *scale, cudaStream_t stream);
/* y (ytype float32 or bf16, rows ldy apart) = (x w^T) * xscale[row] * wscale[col] + beta y, x
 * [n, in] and w [out, in] e4m3 contiguous. block: x's and w's scales are those of
 * sf_cuda_fp8_quantize_blocks, each applied to its 128 values of a sum (c->fp8_block), x with
 * its padded rows. The algorithm is chosen at the shape's first use. Under the lock, on
 * c->stream. */
typedef struct sf_cuda_fp8_args {
    int n, in, out, ldy;
    const unsigned char *x, *w;
    const float *xscale, *wscale;
    void *y;
    cudaDataType ytype;
    float beta;
    int block;
} sf_cuda_fp8_args;
int sf_cuda_gemm_fp8(sf_cuda *c, const sf_cuda_fp8_args *g, const char *what);

/* Warm-up (setting warmup): loads the images of elementwise.cu's kernels (cudaFuncGetAttributes
 * on each), so that none pays for lazy loading at its first launch mid-stream. Under the lock. */
int sf_cuda_elementwise_load(void);

/* The core ops (seqflow/backend.h) and the ext slots (kernels/backend_ext.h): contracts there. */
int sf_cuda_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y, int ldy,
                   int accumulate);
int sf_cuda_prepare_weight_group(sf_backend *be, int count, const float *const *w, int out, int in);
int sf_cuda_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
                const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v, float *u);
/* ext ffn_h1_floats: 0 where ffn takes the W1|W3 SwiGLU kernel (which writes only h3). */
size_t sf_cuda_ffn_h1_floats(sf_backend *be, int n, int dim, int hidden);
int sf_cuda_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
                const float *w3, const float *w2, float *u, float *h1, float *h3);
int sf_cuda_ffn_partial(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                        const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3,
                        sf_dtype ytype, void *y);
/* ext normed_type, qkv_from, ffn_partial_from (matmul.cu): bf16 normed rows in precision bf16 */
sf_dtype sf_cuda_normed_type(sf_backend *be);
int sf_cuda_qkv_from(sf_backend *be, int n, int dim, int width, const void *u, const float *wq, const float *wk,
                     const float *wv, sf_dtype type, void *q, void *k, void *v);
int sf_cuda_ffn_partial_from(sf_backend *be, int n, int dim, int hidden, const void *u, const float *w1,
                             const float *w3, const float *w2, float *h1, float *h3, sf_dtype ytype, void *y);
/* ext add_typed (elementwise.cu): x[i] += y[i] for count elements, y float32 or bf16. */
int sf_cuda_add_typed(sf_backend *be, size_t count, float *x, sf_dtype ytype, const void *y);
/* rows[i] += the sum of the n parts' element i (count elements each, bf16 or float32), summed
 * in the parts' order, launched on `stream` (the add under add_typed, and the head-parallel
 * parts' sum of comm_exchange.cu). n from 1 to SF_CUDA_ADD_PARTS_MAX. */
#define SF_CUDA_ADD_PARTS_MAX 8
int sf_cuda_add_parts(const void *const *parts, int n, size_t count, float *rows, int bf16, cudaStream_t stream);
/* rows [n, dim] += the sum of nparts bf16 parts ([n, dim] each, in order), then u = rmsnorm(rows;
 * weight, eps) rounded to bf16: bit-identical to sf_cuda_add_parts then sf_cuda_rmsnorm_to_bf16,
 * in one pass where the shapes allow; the same normed rows also written to also[0 .. n_also)
 * (e.g. other GPUs' memory with peer access). weight NULL: the add alone (u untouched). */
int sf_cuda_add_parts_norm(const void *const *parts, int nparts, int n, int dim, float *rows, const float *weight,
                           float eps, __nv_bfloat16 *u, __nv_bfloat16 *const *also, int n_also, cudaStream_t stream);
/* The same with the kernel's shape given: rows_per_warp rows a warp (gridDim.x * warps_per_block
 * apart), warps_per_block, and prefetch (a warp loads its next row before it stores this one).
 * For the lab's comparison (bench/lab/bench_cuda_add_norm_peer.cu); sf_cuda_add_parts_norm takes
 * {1, 8, 0} without copies and SF_CUDA_ADD_NORM_PEER_SHAPE with them, what measured fastest there. */
typedef struct sf_cuda_add_norm_shape {
    int rows_per_warp, warps_per_block, prefetch;
} sf_cuda_add_norm_shape;
#define SF_CUDA_ADD_NORM_PEER_SHAPE (sf_cuda_add_norm_shape{4, 4, 1})
int sf_cuda_add_parts_norm_shaped(const void *const *parts, int nparts, int n, int dim, float *rows,
                                  const float *weight, float eps, __nv_bfloat16 *u, __nv_bfloat16 *const *also,
                                  int n_also, sf_cuda_add_norm_shape shape, cudaStream_t stream);
void sf_cuda_drop_weight(sf_cuda *c, const void *w); /* under the lock */
int sf_cuda_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, float *y);
/* The non-finite scan (elementwise.cu): begin issues a kernel over x on the thread's stream and
 * an event behind it; end waits for that event and reads the flag. */
int sf_cuda_non_finite_begin(sf_backend *be, const void *x, sf_dtype type, size_t count, int *ticket);
int sf_cuda_non_finite_end(sf_backend *be, int ticket, int *found);
int sf_cuda_rmsnorm_typed(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps,
                          sf_dtype otype, void *y);
int sf_cuda_embed(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table, float *y);
int sf_cuda_swiglu(sf_backend *be, int n, int f, float *a, const float *b);
int sf_cuda_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, sf_dtype kvtype,
                    const void *k, const void *v, float *sk, float *sv, int *count);
int sf_cuda_memory_mix(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q, const float *M,
                       const float *z, const float *gate, float *a);
int sf_cuda_memory_mix_to(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                          const float *M, const float *z, const float *gate, float *a, sf_dtype otype, void *out);
int sf_cuda_matmul_typed(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx, const float *w,
                         sf_dtype ytype, void *y, int ldy, int accumulate);
/* 1 when the memory's stream kernels (memory_stream*.cuh: d = 64, bf16 operands, rows ld % 8 == 0)
 * serve this backend, the condition for the mix fused into the attention (attention_mix). */
int sf_cuda_memory_stream_usable(sf_backend *be, int d, int ld);
/* Scratch bytes sf_cuda_memory_update needs for n rows (either kind), for reserve(). */
size_t sf_cuda_memory_update_scratch_bytes(int n, int heads, int d);
int sf_cuda_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                          const void *k, const void *v, float *M, float *z);
#endif /* __CUDACC__ */

#endif
