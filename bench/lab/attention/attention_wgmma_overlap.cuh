/* The main wgmma kernel running alongside its pre-pass (the lab's variants 43, 44):
 * the pre-pass (att_stage_workspace_overlapped) raises a flag a chunk of staged rows, and the
 * main kernel, launched with programmatic stream serialization, waits on the chunks a branch's
 * keys cover before that branch's first copy. The pre-pass is bound by DRAM (~100 MB in ~30 us
 * at the reference shape, bench/lab/ATTENTION_NOTES.md) and the main kernel by issue, so they can
 * share the machine. C++ (CUDA) only. */
#ifndef SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_OVERLAP_CUH
#define SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_OVERLAP_CUH

#include <cuda_runtime.h>

#include "bench/lab/attention/attention_lab.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* PRE options of attention_wgmma_variant: how the main kernel meets its pre-pass */
enum { PRE_NONE = 0, /* launched after it (stream order) */
       PRE_BRANCH = 1, /* alongside: each branch waits on the chunks its keys cover */
       PRE_ALL = 2 /* alongside, but every block waits on every chunk first: only the launch overlaps */ };

/* Every thread of the block calls it: returns once ready[c0..c1] are all raised (acquire by
 * warp 0, then a barrier), so that the block's later copies of those rows see the pre-pass's
 * stores. One warp polls, with a back-off: hundreds of blocks polling the same few lines with
 * every thread slowed the pre-pass itself (first measurement, bench/lab/ATTENTION_NOTES.md). */
__device__ __forceinline__ void att_wait_ready(const unsigned *ready, int c0, int c1)
{
    if (threadIdx.x < 32) {
        for (;;) {
            bool ok = true;
            for (int c = c0 + (int)threadIdx.x; c <= c1; c += 32) {
                unsigned f;
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(ready + c) : "memory");
                ok = ok && f != 0;
            }
            if (__all_sync(0xffffffffu, ok)) break;
            __nanosleep(2000);
        }
    }
    __syncthreads();
}

/* Sequence rows [first, last] as chunk flags (none when last < first). */
__device__ __forceinline__ void att_wait_rows(const lab_staged &st, int first, int last)
{
    if (last >= first) att_wait_ready(st.ready, first / SF_ATT_CHUNK_ROWS, last / SF_ATT_CHUNK_ROWS);
}

/* Launches `kernel` so that it may start before the kernel ahead of it in `stream` has finished
 * (that one triggers its dependents at once). */
template <class... Params, class... Args>
static int att_launch_alongside(void (*kernel)(Params...), unsigned grid, unsigned threads, size_t smem,
                                cudaStream_t stream, Args... args)
{
    const cudaError_t err = sf_cuda_launch_programmatic(true, kernel, dim3(grid), dim3(threads), smem, stream, args...);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention: launch alongside the pre-pass: %s", cudaGetErrorString(err));
    return SF_OK;
}

#endif
