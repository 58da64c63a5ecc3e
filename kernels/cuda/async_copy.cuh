/* Hopper's asynchronous copies and the barriers they complete on, for the warp-specialized
 * kernels (swiglu_gate_up.cu, and the lab's bench/lab/attention/attention_wgmma_warpspec.cu):
 * shared-memory mbarriers, named barriers, and the bulk tensor copy engine (TMA:
 * cp.async.bulk.tensor), loads completing on an mbarrier and stores (or reductions) tracked by
 * bulk groups. Tensor maps are encoded on the host (tensor_map.h) and
 * passed by value as __grid_constant__ kernel parameters. Header-only, device code, sm_90. */
#ifndef SEQFLOW_KERNELS_CUDA_ASYNC_COPY_CUH
#define SEQFLOW_KERNELS_CUDA_ASYNC_COPY_CUH

#include <stdint.h>
#include <cuda.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* One arrival that also announces `bytes` of copy-engine writes the phase must wait for. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* Waits until the phase of parity `parity` of the barrier has completed (a fresh barrier counts
 * its phase before the first as completed with parity 1). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* This thread's arrival at named barrier `id` of `threads`, without waiting: the threads that
 * bar.sync on it go on once all have arrived (a hand-over from one warpgroup to another). */
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* One arrival on `bar` for the whole warp, by lane 0 once every lane got here. */
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar)
{
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

/* The box at (c0 innermost, c1) of `map` into shared `dst`, completing on `bar`; elements
 * outside the tensor arrive as zeros and still count in the barrier's bytes. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
/* Shared `src` into the box at (c0, c1) of `map`; elements outside the tensor are not written. */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, int c0, int c1, uint32_t src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
/* Shared `src` added element-wise into the box at (c0, c1) of `map` (float32: the copy engine
 * reads, adds and writes global memory; elements outside the tensor are left alone). */
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap *map, int c0, int c1, uint32_t src)
{
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];"
                 ::"l"(map), "r"(c0), "r"(c1), "r"(src) : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* This thread's committed stores, all but the newest N groups, have read their shared memory
 * (it may be overwritten). */
template <int N>
__device__ __forceinline__ void tma_store_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
/* ... and have written global memory. */
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
/* ---- clusters: the CTAs of one cluster share their shared memory's barriers and copies ---- */
__device__ __forceinline__ uint32_t cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* Every thread of every CTA of the cluster meets here; shared-memory writes (and barrier inits)
 * before it are visible cluster-wide after it. */
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* One arrival on the barrier at the same shared address in CTA `rank` of this cluster. */
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank)
{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
    /* the default (release at CTA scope), as CUTLASS's ClusterBarrier: the slot's reads are the
     * tensor cores', already complete; .release.cluster cost a fence on every arrival */
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
/* tma_load_2d into the same shared address of every CTA in `mask` (bit r: rank r), each copy
 * completing on the barrier at `bar`'s address in its own CTA. */
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar,
                                                      uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
#endif

#endif
