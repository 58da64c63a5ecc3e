/* Two GPUs of one process exchanging a head-parallel rank's part by the copy engines
 * (cudaMemcpyPeerAsync over NVLink) rather than by an NCCL all-reduce, which runs on the
 * multiprocessors: is the exchange fast enough, and does it leave the multiprocessors to the
 * products beside it?
 *
 *   bench_cuda_p2p [--mib M] [--reps R]
 *
 * With peer access enabled both ways, median of R (CUDA events on the issuing GPU):
 *   - one part (M MiB, default 16: [8192, 1024] bf16) from GPU 0 to GPU 1, alone;
 *   - the two parts crossing at once (0 -> 1 and 1 -> 0, each GPU's stream waiting for the
 *     other's start): the exchange a reduction of two ranks needs;
 *   - a busy kernel filling every multiprocessor (FMA chains and streaming reads, about 1 ms) on
 *     each GPU, alone and with the crossing copies issued beside it: the kernel's time with the
 *     copies against alone says what the copies take from the products;
 *   - half the part (M/2 MiB), crossing: what one of two chunks takes.
 * Prints "RESULT p2p_one_ms=... p2p_cross_ms=... busy_alone_ms=... busy_beside_ms=...
 * p2p_beside_ms=... p2p_half_cross_ms=..." last. Exits 77 with fewer than two GPUs or no peer
 * access. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#include "bench/cuda_check.h"
#include "bench/lab/two_gpus.h"

__global__ static void busy_kernel(const float4 *src, size_t count, int rounds, float *sink)
{
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    float acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        acc += v.x + v.y + v.z + v.w;
#pragma unroll 4
        for (int r = 0; r < rounds; r++) a = fmaf(a, b, 1e-7f);
    }
    if (acc + a == 12345.0f) sink[0] = acc; /* never, but the compiler cannot know */
}

struct gpu {
    int dev;
    cudaStream_t copy, work;
    cudaEvent_t t0, t1, w0, w1, go;
    void *part, *inbox;
    float4 *busy_src;
    float *sink;
};

static double median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static const size_t BUSY_FLOAT4 = (size_t)64 << 20; /* 1 GiB read by the busy kernel */
static const int BUSY_ROUNDS = 24;

static void launch_busy(gpu &g)
{
    CUDA_OK(cudaSetDevice(g.dev));
    busy_kernel<<<132 * 8, 256, 0, g.work>>>(g.busy_src, BUSY_FLOAT4, BUSY_ROUNDS, g.sink);
}

/* Both GPUs copy `bytes` of their part to the other's inbox at once (or only GPU 0 when !both);
 * returns GPU 0's copy time (ms) */
static float cross(gpu *g, size_t bytes, bool both)
{
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaSetDevice(g[i].dev));
        CUDA_OK(cudaEventRecord(g[i].go, g[i].copy));
    }
    for (int i = 0; i < (both ? 2 : 1); i++) {
        gpu &me = g[i], &peer = g[1 - i];
        CUDA_OK(cudaSetDevice(me.dev));
        CUDA_OK(cudaStreamWaitEvent(me.copy, peer.go, 0)); /* start together */
        CUDA_OK(cudaEventRecord(me.t0, me.copy));
        CUDA_OK(cudaMemcpyPeerAsync(peer.inbox, peer.dev, me.part, me.dev, bytes, me.copy));
        CUDA_OK(cudaEventRecord(me.t1, me.copy));
    }
    float ms = 0;
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaSetDevice(g[i].dev));
        CUDA_OK(cudaStreamSynchronize(g[i].copy));
    }
    CUDA_OK(cudaSetDevice(g[0].dev));
    CUDA_OK(cudaEventElapsedTime(&ms, g[0].t0, g[0].t1));
    return ms;
}

/* the busy kernel on both GPUs, with the crossing copies of `bytes` beside it when bytes > 0;
 * GPU 0's kernel time (ms) and, through *copy_ms, its copy time */
static float busy(gpu *g, size_t bytes, float *copy_ms)
{
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaSetDevice(g[i].dev));
        CUDA_OK(cudaEventRecord(g[i].w0, g[i].work));
        launch_busy(g[i]);
        CUDA_OK(cudaEventRecord(g[i].w1, g[i].work));
    }
    if (bytes) *copy_ms = cross(g, bytes, true);
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaSetDevice(g[i].dev));
        CUDA_OK(cudaStreamSynchronize(g[i].work));
    }
    float ms = 0;
    CUDA_OK(cudaSetDevice(g[0].dev));
    CUDA_OK(cudaEventElapsedTime(&ms, g[0].w0, g[0].w1));
    return ms;
}

int main(int argc, char **argv)
{
    int mib = 16, reps = 30;
    if (lab_args(argc, argv, "bench_cuda_p2p", "mib", &mib, &reps)) return 2;
    const int two = lab_two_gpus("bench_cuda_p2p");
    if (two) return two;
    const size_t bytes = (size_t)mib << 20;
    gpu g[2];
    for (int i = 0; i < 2; i++) {
        g[i].dev = i;
        CUDA_OK(cudaSetDevice(i));
        CUDA_OK(cudaStreamCreateWithFlags(&g[i].copy, cudaStreamNonBlocking));
        CUDA_OK(cudaStreamCreateWithFlags(&g[i].work, cudaStreamNonBlocking));
        cudaEvent_t *ev[] = {&g[i].t0, &g[i].t1, &g[i].w0, &g[i].w1, &g[i].go};
        for (cudaEvent_t *e : ev) CUDA_OK(cudaEventCreate(e));
        CUDA_OK(cudaMalloc(&g[i].part, bytes));
        CUDA_OK(cudaMalloc(&g[i].inbox, bytes));
        CUDA_OK(cudaMemset(g[i].part, 1, bytes));
        CUDA_OK(cudaMalloc(&g[i].busy_src, BUSY_FLOAT4 * sizeof(float4)));
        CUDA_OK(cudaMemset(g[i].busy_src, 0, BUSY_FLOAT4 * sizeof(float4)));
        CUDA_OK(cudaMalloc(&g[i].sink, sizeof(float)));
    }
    for (int w = 0; w < 3; w++) cross(g, bytes, true), busy(g, 0, NULL);
    std::vector<float> one, both, half, alone, beside, copy_beside;
    for (int r = 0; r < reps; r++) {
        one.push_back(cross(g, bytes, false));
        both.push_back(cross(g, bytes, true));
        half.push_back(cross(g, bytes / 2, true));
        alone.push_back(busy(g, 0, NULL));
        float c = 0;
        beside.push_back(busy(g, bytes, &c));
        copy_beside.push_back(c);
    }
    const double gbs = bytes / 1e9;
    printf("part of %d MiB, GPU 0 and 1 (H100 NVLink), median of %d\n", mib, reps);
    printf("  one way, alone:            %.4f ms (%.0f GB/s)\n", median(one), gbs / (median(one) * 1e-3));
    printf("  crossing, alone:           %.4f ms (%.0f GB/s each way)\n", median(both), gbs / (median(both) * 1e-3));
    printf("  half, crossing, alone:     %.4f ms\n", median(half));
    printf("  busy kernel alone:         %.4f ms\n", median(alone));
    printf("  busy kernel beside copies: %.4f ms (copies beside it %.4f ms)\n", median(beside), median(copy_beside));
    printf("RESULT p2p_one_ms=%.4f p2p_cross_ms=%.4f busy_alone_ms=%.4f busy_beside_ms=%.4f p2p_beside_ms=%.4f "
           "p2p_half_cross_ms=%.4f\n",
           median(one), median(both), median(alone), median(beside), median(copy_beside), median(half));
    return 0;
}
