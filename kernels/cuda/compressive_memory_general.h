/* The compressive-memory kernels for head sizes without a tiled kernel (compressive_memory_general.cu),
 * called by kernels/cuda/compressive_memory.cu under the backend's lock on its compute stream. */
#ifndef SEQFLOW_KERNELS_CUDA_MEMORY_GENERAL_H
#define SEQFLOW_KERNELS_CUDA_MEMORY_GENERAL_H

#include "kernels/cuda/cuda_backend.h"

/* q, k, v of qtype / kvtype (SF_DTYPE_F32 or SF_DTYPE_BF16, checked by the caller), rows ld elements apart */
int sf_cuda_memory_mix_general(sf_cuda *c, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                               const float *M, const float *z, const float *gate, float *a);
/* Grows the scratch to sf_cuda_memory_general_bytes itself when it is smaller. */
int sf_cuda_memory_update_general(sf_cuda *c, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                                  const void *k, const void *v, float *M, float *z);
/* scratch bytes of the general update: [target] [sigma(K)] [ones]; `target` (the delta's, or
 * bf16 v widened to float32) is 0: no target slot */
size_t sf_cuda_memory_general_bytes(int n, int heads, int d, int target);

#endif
