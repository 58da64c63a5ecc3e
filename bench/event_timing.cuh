/* The benchmarks' timing of one GPU call: CUDA events around each of `reps` calls on `stream`
 * (the default stream unless given: the stream the call issues to), each waited for, so that a
 * call is timed alone. Returns the times in milliseconds, sorted (the median is [reps / 2], the
 * minimum [0]). C++ only. */
#ifndef SEQFLOW_BENCH_EVENT_TIMING_CUH
#define SEQFLOW_BENCH_EVENT_TIMING_CUH

#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#include "cuda_check.h"

template <class Call>
static std::vector<float> event_times_ms(int reps, Call &&call, cudaStream_t stream = 0)
{
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    std::vector<float> ms(reps > 0 ? reps : 1);
    for (float &m : ms) {
        CUDA_OK(cudaEventRecord(e0, stream));
        call();
        CUDA_OK(cudaEventRecord(e1, stream));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaEventElapsedTime(&m, e0, e1));
    }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms;
}

/* The median of event_times_ms after `warmup` untimed calls. */
template <class Call>
static double median_event_ms(int reps, Call &&call, cudaStream_t stream = 0, int warmup = 3)
{
    for (int i = 0; i < warmup; i++) call();
    return event_times_ms(reps, call, stream)[(reps > 0 ? reps : 1) / 2];
}

#endif
