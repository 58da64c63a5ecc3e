/* Dilated local attention on the GPU (SPEC sections 3 and 5): the CUDA twins of
 * sf_cpu_attention (kernels/cpu/attention.c), which is their reference.
 *
 * Both entry points compute out[i, h*d + j] = A_dot for every row i < desc->n, every head and
 * every component: all branches of a head and the desc->n_global global tokens are merged by
 * their log-sum-exp; a query active in no branch and with no global token gets 0. q, k, v, out
 * and desc->gk/gv are device pointers laid out as sf_attention_desc says; desc->branches is a
 * host array. Launches go on `stream` and are asynchronous; nothing is allocated.
 * Return SF_OK, or SF_E_BACKEND/SF_E_UNSUPPORTED with sf_last_error() set (e.g. a head width
 * the kernel was not built for). */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_H
#define SEQFLOW_KERNELS_CUDA_ATTENTION_H

#include <cuda_runtime.h>

#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* float32 arithmetic throughout (precision mode f32, used for checking). */
int sf_cuda_attention_f32(const sf_attention_desc *desc, const float *q, const float *k,
                          const float *v, float *out, cudaStream_t stream);

/* bf16 tensor-core kernel with float32 accumulation and softmax (precision mode bf16). */
int sf_cuda_attention_bf16(const sf_attention_desc *desc, const float *q, const float *k,
                           const float *v, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
