// The GPU's bf16 matrix rate as cuBLAS delivers it: the ceiling the whole-pipeline benchmark
// (bench_gpu_pipeline) reports its useful FLOP rate against. C = A B^T with A, B, C bf16,
// float32 accumulation (CUBLAS_COMPUTE_32F), random operands (zeros run faster and would
// flatter the ceiling), a few warm-up products, then the median of timed ones (CUDA events).
//
//   bench_gemm [--size 8192] [--reps 20]
// Prints "RESULT gemm_tflops=..." last for bench/gpu_bench.sh.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gemm_bench_common.cuh"
#include "event_timing.cuh"

int main(int argc, char **argv)
{
    int n = 8192, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--size")) n = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "usage: bench_gemm [--size N] [--reps R]\n");
            return 2;
        }
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const size_t elems = (size_t)n * n;
    __nv_bfloat16 *a, *b, *c;
    CUDA_OK(cudaMalloc(&a, elems * sizeof *a));
    CUDA_OK(cudaMalloc(&b, elems * sizeof *b));
    CUDA_OK(cudaMalloc(&c, elems * sizeof *c));
    fill_random_bf16<<<1024, 256>>>(a, elems, 1);
    fill_random_bf16<<<1024, 256>>>(b, elems, 2);
    CUDA_OK(cudaGetLastError());
    cublasHandle_t h;
    CUBLAS_OK(cublasCreate(&h));
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
        CUBLAS_OK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, b, CUDA_R_16BF, n, a, CUDA_R_16BF, n, &zero, c,
                               CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    for (int i = 0; i < 3; i++) gemm();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> tflops;
    for (float ms : event_times_ms(reps, gemm)) tflops.push_back(2.0 * n * (double)n * n / (ms * 1e-3) / 1e12);
    std::sort(tflops.begin(), tflops.end());
    double median = tflops[tflops.size() / 2];
    std::printf("cuBLAS bf16 GEMM %d^3 on %s (float32 accumulation, random data): median %.1f TFLOP/s "
                "(min %.1f, max %.1f, %d runs)\n",
                n, prop.name, median, tflops.front(), tflops.back(), reps);
    std::printf("RESULT gemm_tflops=%.1f\n", median);
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 0;
}
