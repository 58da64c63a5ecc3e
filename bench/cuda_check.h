/* CUDA_OK(call): the benchmarks' and probes' check of a CUDA runtime call. A failure prints the
 * place, the call and CUDA's message, and exits with status 2 (a benchmark that cannot run
 * has nothing to report). */
#ifndef SEQFLOW_BENCH_CUDA_CHECK_H
#define SEQFLOW_BENCH_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>

#define CUDA_OK(x)                                                                                  \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)

#endif
