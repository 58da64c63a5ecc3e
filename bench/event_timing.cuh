/* The benchmarks' timing of one GPU call: CUDA events around each of `reps` calls on the default
 * stream, each waited for, so that a call is timed alone. Returns the times in milliseconds,
 * sorted (the median is [reps / 2], the minimum [0]). C++ only. */
#ifndef SEQFLOW_BENCH_EVENT_TIMING_CUH
#define SEQFLOW_BENCH_EVENT_TIMING_CUH

#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#include "cuda_check.h"

template <class Call>
static std::vector<float> event_times_ms(int reps, Call &&call)
{
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    std::vector<float> ms(reps > 0 ? reps : 1);
    for (float &m : ms) {
        CUDA_OK(cudaEventRecord(e0));
        call();
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaEventElapsedTime(&m, e0, e1));
    }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms;
}

#endif
