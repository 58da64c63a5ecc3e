/* Dilated local attention on the GPU (SPEC sections 3 and 5): the CUDA twins of
 * sf_cpu_attention (kernels/cpu/attention.c), which is their reference.
 *
 * Every entry point computes out[i, h*d + j] = A_dot for every row i < desc->n, every head and
 * every component: all branches of a head and the desc->n_global global tokens are merged by
 * their log-sum-exp; a query active in no branch and with no global token gets 0. q, k, v, out
 * and desc->gk/gv are device pointers laid out as sf_attention_desc says; desc->branches is a
 * host array. Launches go on `stream` and are asynchronous; nothing is allocated.
 * Return SF_OK, or SF_E_BACKEND/SF_E_UNSUPPORTED with sf_last_error() set (e.g. a head width
 * the kernel was not built for). */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_H
#define SEQFLOW_KERNELS_CUDA_ATTENTION_H

#include <stddef.h>
#include <cuda_runtime.h>

#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* float32 arithmetic throughout (precision mode f32, used for checking). */
int sf_cuda_attention_f32(const sf_attention_desc *desc, const float *q, const float *k,
                          const float *v, float *out, cudaStream_t stream);

/* bf16 tensor-core kernel with float32 accumulation and softmax (precision mode bf16).
 * Without a workspace this runs the slower kernel that converts K/V in its inner loop;
 * prefer sf_cuda_attention_bf16_ws. */
int sf_cuda_attention_bf16(const sf_attention_desc *desc, const float *q, const float *k,
                           const float *v, float *out, cudaStream_t stream);

/* Device bytes the _ws entry needs for this desc: K and V of max(segment, n) rows and the
 * n_global global tokens as bf16 (pass the largest n_global the stream will hold, i.e. G).
 * Host-only arithmetic; never fails. */
size_t sf_cuda_attention_workspace_bytes(const sf_attention_desc *desc);

/* As sf_cuda_attention_bf16, fast path: a pre-pass on `stream` converts K, V and the global
 * tokens to bf16 per head into `workspace` (device memory the caller owns, reused by the next
 * call only after this call's work on `stream` has run, at least 256-byte aligned), then the
 * main kernel streams them with cp.async. workspace NULL runs sf_cuda_attention_bf16; a
 * non-NULL workspace smaller than sf_cuda_attention_workspace_bytes(desc) is SF_E_INVAL.
 * q, k, v are of desc->qkv_type; bf16 ones (qkv's output on an H100) are read in place, with
 * only the global tokens staged, or refused with SF_E_UNSUPPORTED where that is not built
 * (sf_cuda_attention_bf16_variant_ws). The entries without a workspace take float32 only. */
int sf_cuda_attention_bf16_ws(const sf_attention_desc *desc, const void *q, const void *k,
                              const void *v, float *out, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream);

/* The memory mix (SPEC 2: A = g_h A_mem + (1 - g_h) A_dot) applied by the attention kernel to the
 * rows it has just finished, written as bf16 to out ([n, desc->ld]); M ([heads][64][64]), z
 * ([heads][64]) and gate ([heads]) as memory_mix takes them. Device pointers. */
typedef struct sf_cuda_attention_mix {
    const float *M, *z, *gate;
    void *out;
} sf_cuda_attention_mix;

/* sf_cuda_attention_bf16_ws on bf16 q/k/v read in place by the default kernel, with the mix
 * fused: out gets the mixed rows, `out` of the plain entry (here `a`) is scratch the kernel
 * may leave unnormalized. d = 64 on an H100 only: SF_E_UNSUPPORTED (nothing launched) where
 * the fused kernel does not run; the caller then runs the attention and memory_mix_to. */
int sf_cuda_attention_mix_ws(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *a,
                             const sf_cuda_attention_mix *mix, void *workspace, size_t workspace_bytes,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
