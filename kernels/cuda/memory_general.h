/* The compressive-memory kernels for head sizes without a tiled kernel (memory_general.cu),
 * called by kernels/cuda/memory.cu under the backend's lock on its compute stream. */
#ifndef SEQFLOW_KERNELS_CUDA_MEMORY_GENERAL_H
#define SEQFLOW_KERNELS_CUDA_MEMORY_GENERAL_H

#include "kernels/cuda/cuda_backend.h"

int sf_cuda_memory_mix_general(sf_cuda *c, int n, int heads, int d, int ld, const float *q, const float *M,
                               const float *z, const float *gate, float *a);
/* Grows the scratch to sf_cuda_memory_general_bytes itself when it is smaller. */
int sf_cuda_memory_update_general(sf_cuda *c, sf_memory_kind kind, int n, int heads, int d, int ld, const float *k,
                                  const float *v, float *M, float *z);
/* scratch bytes of the general update: [delta target] [sigma(K)] [ones] */
size_t sf_cuda_memory_general_bytes(int n, int heads, int d, int delta);

#endif
