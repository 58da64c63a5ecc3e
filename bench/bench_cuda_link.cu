/* The host-device link as the pipeline uses it: one segment's hidden states (default 8192 rows
 * x 1024 float32 = 32 MiB) copied between a device buffer and page-locked host memory, each
 * direction alone, median of many copies after warm-up (CUDA events). The attention-only
 * model's threaded binary sends exactly this download every segment, so this rate bounds it
 * (bench/target_bounds.py, bench/gpu_bench.sh).
 *
 *   bench_cuda_link [--bytes B] [--reps R]
 * Prints "RESULT link_dtoh_gbs=... link_htod_gbs=..." last (GB/s = 1e9 bytes a second). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench/cuda_check.h"
#include "bench/event_timing.cuh"

int main(int argc, char **argv)
{
    size_t bytes = (size_t)8192 * 1024 * sizeof(float);
    int reps = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes")) bytes = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_cuda_link [--bytes B] [--reps R]\n");
            return 2;
        }
    }
    if (bytes == 0 || reps < 1) {
        fprintf(stderr, "bench_cuda_link: --bytes and --reps must be positive\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    void *dev = NULL, *host = NULL;
    CUDA_OK(cudaMalloc(&dev, bytes));
    CUDA_OK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    memset(host, 1, bytes);
    CUDA_OK(cudaMemset(dev, 0, bytes));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const double down_ms = median_event_ms(
        reps, [&] { CUDA_OK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream)); }, stream);
    const double up_ms = median_event_ms(
        reps, [&] { CUDA_OK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream)); }, stream);
    const double down = bytes / (down_ms * 1e-3) / 1e9, up = bytes / (up_ms * 1e-3) / 1e9;
    printf("link: %.1f MiB copies, page-locked host memory, median of %d: device to host %.3f ms = %.1f GB/s, "
           "host to device %.3f ms = %.1f GB/s\n",
           bytes / 1048576.0, reps, down_ms, down, up_ms, up);
    printf("RESULT link_dtoh_gbs=%.2f link_htod_gbs=%.2f\n", down, up);
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFreeHost(host));
    CUDA_OK(cudaFree(dev));
    return 0;
}
