/* Dilated local attention on the GPU (SPEC sections 3 and 5): the CUDA twins of
 * sf_cpu_attention (kernels/cpu/attention.c), which is their reference.
 *
 * Every entry point computes out[i, h*d + j] = A_dot for every row i < desc->n, every head and
 * every component: all branches of a head and the desc->n_global global tokens are merged by
 * their log-sum-exp; a query active in no branch and with no global token gets 0. q, k, v, out
 * and desc->gk/gv are device pointers laid out as sf_attention_desc says; desc->branches is a
 * host array. Launches go on `stream` and are asynchronous; nothing is allocated. A workspace is
 * device memory the caller owns, at least 256-byte aligned and sf_cuda_attention_workspace_bytes
 * long, reused by the next call only after this call's work on `stream` has run.
 * Return SF_OK, or SF_E_INVAL/SF_E_BACKEND/SF_E_UNSUPPORTED with sf_last_error() set;
 * SF_E_UNSUPPORTED launches nothing.
 * Non-finite inputs as on the CPU: a row is non-finite exactly when one of the keys it sees
 * (SPEC 3) has a non-finite V value or a NaN K value (or its own q is not finite); a masked key's
 * values never reach it (attention_mma.cuh says how the bf16 kernels make sure).
 *
 * The kernels (bench/lab/README.md tells the variants they won against):
 *   attention_pingpong.cu Hopper, bf16 q/k/v in place, d = 64: a persistent CTA a multiprocessor,
 *                         K/V by the copy engine, two consumer warpgroups taking turns on the
 *                         tensor cores; where there are enough position blocks times heads
 *   attention_wgmma.cu    Hopper wgmma (compute capability 9.0, sm_90a image), d = 64, 128; reads
 *                         float32 q/k/v through the bf16 pre-pass or bf16 q/k/v in place
 *   attention_staged.cu   portable mma.sync, bf16 K/V staged by the pre-pass, d = 32, 64, 128
 *   attention_convert.cu  portable mma.sync without a workspace: converts K/V in its inner loop
 *   attention_f32.cu      float32 throughout, any d up to 256 (precision f32, and the fallback)
 * sf_cuda_attention picks among them. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_H
#define SEQFLOW_KERNELS_CUDA_ATTENTION_H

#include <stddef.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.h"
#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Precision bf16: the fastest kernel for this device, head width and q/k/v type, bf16 tensor
 * cores with float32 accumulation and softmax. `dev` is the device `stream` runs on (its compute
 * capability picks the kernel; a test may pass another to force the portable kernels).
 * - q/k/v of desc->qkv_type bf16 ([n, ld] as qkv wrote them): the ping-pong kernel reads them in
 *   place where sf_cuda_attention_pingpong_preferred says so, else the wgmma kernel where it runs
 *   (workspace given); elsewhere SF_E_UNSUPPORTED, and the caller widens them to float32 and
 *   calls again.
 * - float32 q/k/v with a workspace: the wgmma kernel where it runs, else the staged kernel;
 *   workspace NULL: the convert kernel. Shapes none of these was built for (other head widths,
 *   unaligned rows or strides) run the float32 kernel: slower, never less exact.
 * A non-NULL workspace smaller than sf_cuda_attention_workspace_bytes(desc) is SF_E_INVAL. */
int sf_cuda_attention(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *out,
                      void *workspace, size_t workspace_bytes, cudaStream_t stream, const sf_cuda_device_info *dev);

/* Device bytes a workspace needs for this desc: K and V of max(segment, n) rows and the
 * n_global global tokens as bf16 (pass the largest n_global the stream will hold, i.e. G).
 * Host-only arithmetic; never fails. */
size_t sf_cuda_attention_workspace_bytes(const sf_attention_desc *desc);

/* The memory mix (SPEC 2: A = g_h A_mem + (1 - g_h) A_dot) applied by the attention kernel to the
 * rows it has just finished, written as bf16 to out ([n, desc->ld]); M ([heads][64][64]), z
 * ([heads][64]) and gate ([heads]) as memory_mix takes them. Device pointers. */
typedef struct sf_cuda_attention_mix {
    const float *M, *z, *gate;
    void *out;
} sf_cuda_attention_mix;

/* sf_cuda_attention on bf16 q/k/v read in place by the wgmma kernel, with the mix fused: mix->out
 * gets the mixed rows, `a` is scratch of [n, ld] float32 the kernel may leave unnormalized.
 * SF_E_UNSUPPORTED (nothing launched, no error set) where the fused kernel does not run (another
 * device or head width, float32 q/k/v, unaligned a or mix->out); the caller then runs
 * sf_cuda_attention and the mix apart. */
int sf_cuda_attention_with_mix(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *a,
                               const sf_cuda_attention_mix *mix, void *workspace, size_t workspace_bytes,
                               cudaStream_t stream, const sf_cuda_device_info *dev);

/* ---- the kernels one by one (sf_cuda_attention's choices; tests check each) ------------- */

/* Whether the wgmma kernel runs desc on device `dev`: compute capability 9.0, d = 64 or 128, and this
 * binary holds its sm_90a image (looked up once a device). */
int sf_cuda_attention_wgmma_usable(const sf_attention_desc *desc, const sf_cuda_device_info *dev);

/* The wgmma kernel (attention_wgmma.cu), on float32 q/k/v (the pre-pass stages K/V/globals) or
 * bf16 q/k/v (read in place, only the globals staged), as desc->qkv_type says; `mix` NULL, or
 * the fused mix of sf_cuda_attention_with_mix. The caller has checked sf_cuda_attention_wgmma_usable;
 * a workspace is required. */
int sf_cuda_attention_wgmma(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *out,
                            const sf_cuda_attention_mix *mix, void *workspace, size_t workspace_bytes,
                            cudaStream_t stream);

/* Whether the ping-pong kernel runs desc on device `dev`: compute capability 9.0, d = 64, bf16
 * q/k/v, the branches' dilations summing to at most 8, and this binary holds its sm_90a image. */
int sf_cuda_attention_pingpong_usable(const sf_attention_desc *desc, const sf_cuda_device_info *dev);

/* Whether sf_cuda_attention runs desc on the ping-pong kernel: usable, and with at least as
 * many work items (position blocks times heads) as the device has multiprocessors. */
int sf_cuda_attention_pingpong_preferred(const sf_attention_desc *desc, const sf_cuda_device_info *dev);

/* The ping-pong kernel (attention_pingpong.cu): bf16 q/k/v read in place, d = 64, a workspace;
 * `mix` NULL or the fused mix, as sf_cuda_attention_wgmma. SF_E_UNSUPPORTED, no error set, where
 * the copy engine cannot map q/k/v (the caller runs the wgmma kernel). The caller has checked
 * sf_cuda_attention_pingpong_usable. */
int sf_cuda_attention_pingpong(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *out,
                               const sf_cuda_attention_mix *mix, void *workspace, size_t workspace_bytes,
                               cudaStream_t stream);

/* The staged kernel (attention_staged.cu): float32 q/k/v, d = 32, 64 or 128, a workspace. */
int sf_cuda_attention_staged(const sf_attention_desc *desc, const float *q, const float *k, const float *v, float *out,
                             void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* The convert kernel (attention_convert.cu): float32 q/k/v, d = 32, 64 or 128, no workspace;
 * slower than the staged kernel (it converts every key tile to bf16 for every query tile). */
int sf_cuda_attention_convert(const sf_attention_desc *desc, const float *q, const float *k, const float *v, float *out,
                              cudaStream_t stream);

/* float32 arithmetic throughout (precision mode f32, used for checking): float32 q/k/v, any
 * head width up to 256. */
int sf_cuda_attention_f32(const sf_attention_desc *desc, const float *q, const float *k, const float *v, float *out,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
