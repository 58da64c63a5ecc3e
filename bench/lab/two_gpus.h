/* What the lab's two-GPU benches share: their arguments, the check that GPUs 0 and 1 exist and
 * reach each other, and the small helpers of their checks and timings. Header-only (C++). */
#ifndef SEQFLOW_BENCH_LAB_TWO_GPUS_H
#define SEQFLOW_BENCH_LAB_TWO_GPUS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#include "bench/cuda_check.h"

/* `--<size_flag> N` into *size and `--reps R` into *reps (both keep their defaults when absent).
 * 0, or 2 after printing the usage of `name`. */
static inline int lab_args(int argc, char **argv, const char *name, const char *size_flag, int *size, int *reps)
{
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--", 2) && !strcmp(argv[i] + 2, size_flag) && i + 1 < argc)
            *size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            *reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--%s N] [--reps R]\n", name, size_flag);
            return 2;
        }
    }
    return 0;
}

/* 0 when GPUs 0 and 1 exist and have peer access both ways, which is then enabled; else 77 (a
 * skip) after saying why. */
static inline int lab_two_gpus(const char *name)
{
    int n = 0, can01 = 0, can10 = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("%s: skipped: fewer than two GPUs\n", name);
        return 77;
    }
    CUDA_OK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CUDA_OK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    if (!can01 || !can10) {
        printf("%s: skipped: no peer access between GPUs 0 and 1\n", name);
        return 77;
    }
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaSetDevice(i));
        CUDA_OK(cudaDeviceEnablePeerAccess(1 - i, 0));
    }
    return 0;
}

/* ms between two events of `device`, once the second has happened */
static inline float lab_elapsed(int device, cudaEvent_t t0, cudaEvent_t t1)
{
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
    return ms;
}

/* `bytes` at p (memory of any GPU) on the host, after everything issued on `device` */
static inline std::vector<unsigned char> lab_fetch(int device, const void *p, size_t bytes)
{
    std::vector<unsigned char> h(bytes);
    CUDA_OK(cudaSetDevice(device));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDefault));
    return h;
}

static inline double lab_median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

#endif
