/* The bf16 CUDA backend that the hand-written kernel benches (bench_cuda_swiglu_gate_up,
 * bench_cuda_residual_product) drive through its internals, entered (its lock held, its device
 * current) for the whole run. */
#ifndef SEQFLOW_BENCH_CUDA_BENCH_BACKEND_CUH
#define SEQFLOW_BENCH_CUDA_BENCH_BACKEND_CUH

#include <stdio.h>

#include "kernels/cuda/cuda_backend.h"
#include "seqflow/seqflow.h"

/* The entered backend in *be, or NULL after printing why, with *exit_code 0 (no GPU: skipped)
 * or 2 (it could not be created). */
static inline sf_cuda *bench_cuda_open(sf_backend **be, int *exit_code)
{
    *be = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("skipped: no GPU\n");
        *exit_code = 0;
        return NULL;
    }
    if (sf_backend_create_ex("cuda", 0, SF_PRECISION_BF16, be) != SF_OK) {
        fprintf(stderr, "cuda backend: %s\n", sf_last_error());
        *exit_code = 2;
        return NULL;
    }
    sf_cuda *c = sf_cuda_of(*be);
    if (sf_cuda_enter(c) != SF_OK) {
        fprintf(stderr, "cuda backend: %s\n", sf_last_error());
        sf_backend_free(*be);
        *exit_code = 2;
        return NULL;
    }
    return c;
}

/* Leaves and frees what bench_cuda_open made. */
static inline void bench_cuda_close(sf_backend *be)
{
    sf_cuda_leave(sf_cuda_of(be));
    sf_backend_free(be);
}

#endif
