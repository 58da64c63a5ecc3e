/* Lab kernels: variants that were tried against the product's and lost (bench/lab/GEMM_NOTES.md
 * has the measurements). They are built only with the benchmarks (the seqflow_lab library in
 * bench/CMakeLists.txt, sm_90a), never reach the library, and are checked against cuBLAS or the
 * product's kernel in their benchmarks in this folder. Each takes the stream it launches on;
 * pointers are device memory, 16-byte aligned. Launches follow the backend's early_launch
 * setting of the calling thread (launch_early.cuh). */
#ifndef SEQFLOW_BENCH_LAB_LAB_KERNELS_H
#define SEQFLOW_BENCH_LAB_LAB_KERNELS_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* swiglu_gate_up_variants.cu: the product's g[n, hidden] = silu(u w1^T) * (u w3^T) kernel
 * (kernels/cuda/swiglu_gate_up.cu) with its tried schedules: pingpong_schedule 1 the pingpong
 * kernel (cluster ignored), else the cooperative kernel in clusters of `cluster` CTAs (1, 2, 4;
 * 1 is the product's; a cluster that does not fit on the device runs as 1). usable: non-zero on
 * an H100 class device with dim, hidden multiples of 8. clusters: how many clusters of
 * `cluster` CTAs fit at once (0: none). */
int sf_lab_swiglu_gate_up_usable(int dim, int hidden);
int sf_lab_swiglu_gate_up_clusters(int cluster);
int sf_lab_swiglu_gate_up(int n, int dim, int hidden, const __nv_bfloat16 *u, const __nv_bfloat16 *w1,
                          const __nv_bfloat16 *w3, __nv_bfloat16 *g, int pingpong_schedule, int cluster,
                          cudaStream_t stream);

/* swiglu_w2.cu: x[n, dim] += (silu(h[:, :hidden]) * h[:, hidden:]) w2^T with h [n, 2 hidden] and
 * w2 [dim, hidden] bf16, SwiGLU applied as the product's operand is loaded. usable: an H100 class
 * device, dim % 256 == 0, hidden % 128 == 0. */
int sf_lab_swiglu_w2_usable(int dim, int hidden);
int sf_lab_swiglu_w2(int n, int dim, int hidden, const __nv_bfloat16 *h, const __nv_bfloat16 *w2, float *x,
                     cudaStream_t stream);

/* residual_product.cu: x[n, out] += a[n, in] w^T, a and w [out, in] bf16, x float32 with rows of
 * `out` (cuBLAS's beta = 1), the tile added by the copy engine's reduction. usable: the
 * multiprocessor count on an H100 class device with in, out multiples of 8; else 0. */
int sf_lab_residual_product_usable(int in, int out);
int sf_lab_residual_product(int n, int in, int out, const __nv_bfloat16 *a, const __nv_bfloat16 *w, float *x,
                            cudaStream_t stream);

/* add_norm_bulk.cu: the split sums' add-and-norm of two bf16 parts into float32 rows (dim wide),
 * the normed bf16 rows into u here and into peer (another GPU's memory, peer access) by TMA bulk
 * stores from shared memory instead of the threads' stores; the bits of the product's
 * sf_cuda_add_parts_norm_shaped. rows_per_warp and warps_per_block as its shape. usable: dim a
 * multiple of 128 up to 1024. Returns 0, or -1 (unusable shape or launch error). */
int sf_lab_add_norm_bulk_usable(int dim);
int sf_lab_add_norm_bulk(const __nv_bfloat16 *p0, const __nv_bfloat16 *p1, int n, int dim, float *rows,
                         const float *weight, float eps, __nv_bfloat16 *u, __nv_bfloat16 *peer, int rows_per_warp,
                         int warps_per_block, cudaStream_t stream);

/* attention_pingpong_dense.cu: dense causal attention over windows of `win` rows (a multiple of 128
 * dividing n), d = 64, in FlashAttention-3's and cuDNN's layout: a persistent CTA a
 * multiprocessor, a producer loading Q and 128-key K/V tiles by the copy engine into a ring of
 * `stages` (2-4), two consumer warpgroups taking turns on the tensor cores. q, k, v bf16 [n, ld]
 * (head h at column 64 h; heads * 64 <= ld), out float32 [n, ldo], normalized. Returns SF_OK or
 * a negative sf_ error. */
int sf_lab_attention_pingpong(int n, int heads, int win, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, int ld, float *out, int ldo, int stages, cudaStream_t stream);

#endif
