/* What the product benchmarks (bench_gemm, bench_gemm_shapes, bench_cuda_swiglu_gate_up,
 * bench_cuda_residual_product) share: the cuBLAS status check and random bf16 operands (zeros
 * run faster and would flatter the rates). CUDA_OK is bench/cuda_check.h's. */
#ifndef SEQFLOW_BENCH_GEMM_COMMON_CUH
#define SEQFLOW_BENCH_GEMM_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuda_check.h"

#define CUBLAS_OK(x)                                                                                \
    do {                                                                                            \
        cublasStatus_t s_ = (x);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusString(s_));  \
            exit(2);                                                                                \
        }                                                                                           \
    } while (0)

/* x[i] = uniform in [-0.5, 0.5) times scale, from a hash of i and seed (splitmix64). */
__global__ static void fill_random_bf16(__nv_bfloat16 *x, size_t n, unsigned long long seed, float scale = 1.0f)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = __float2bfloat16(((float)(z >> 40) * (1.0f / 16777216.0f) - 0.5f) * scale);
    }
}

/* A new device array of `count` such values (the caller frees it with cudaFree). */
static inline __nv_bfloat16 *random_bf16(size_t count, unsigned long long seed, float scale = 1.0f)
{
    __nv_bfloat16 *p;
    CUDA_OK(cudaMalloc(&p, count * sizeof *p));
    fill_random_bf16<<<1024, 256>>>(p, count, seed, scale);
    CUDA_OK(cudaGetLastError());
    return p;
}

#endif
