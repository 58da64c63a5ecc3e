/* The warp-specialized Hopper product the fused-epilogue kernels share (swiglu_gate_up.cu; the
 * lab's variants of it and residual_product.cu in bench/lab/, which also use the clusters):
 * tiles of 128 rows x 256 product columns, A [rows, K] and B [columns, K] K-major in bf16 or both
 * in FP8 e4m3 (E4M3), float32 accumulators, an epilogue of the caller's (CUTLASS's "cooperative"
 * kernel, written out with PTX).
 *
 * One persistent CTA a multiprocessor, 384 threads. Warpgroup 0 is the producer: one thread
 * issues, for every K step (k_step: 128 bytes of each row), the bulk tensor copies (TMA, 128-byte
 * swizzle) of A's 128-row box and B's two 128-row boxes into a ring of STAGES slots of 48 KB, each
 * completing on the slot's "full" mbarrier, and runs ahead across tiles; its registers go to the
 * consumers (setmaxnreg). Warpgroups 1 and 2 own 64 rows each: per K step four wgmma m64n256k16
 * (bf16) or m64n256k32 (e4m3), the slot handed back on its "empty" mbarrier once the next step's
 * products are issued. The two B boxes
 * come from two tensor maps at two row offsets, so B can be two matrices side by side (W1 and
 * W3: gate and up of the same hidden column in the same thread) or one matrix's 256 rows. Loads
 * past the tensors' ends arrive as zeros. Only an sm_90a device pass may expand the device code
 * (SF_WGMMA_ENABLED). */
#ifndef SEQFLOW_KERNELS_CUDA_GEMM_TMA_CUH
#define SEQFLOW_KERNELS_CUDA_GEMM_TMA_CUH

#include <stdint.h>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/launch_early.cuh"

namespace gemm_tma {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 4, THREADS = 384;
/* Elements of a K step: 64 bf16 or 128 e4m3, 128 bytes of a row either way (one swizzle row), so
 * the boxes, the ring and the descriptors are the same for both. */
template <bool E4M3> __host__ __device__ constexpr int k_step() { return E4M3 ? 2 * BK : BK; }
constexpr int A_BYTES = BM * BK * 2;         /* A's box */
constexpr int B_BOX_BYTES = 128 * BK * 2;    /* each of B's two boxes */
constexpr int STAGE_BYTES = A_BYTES + 2 * B_BOX_BYTES;
constexpr int OUT_BOX_BYTES = 64 * 128;      /* a staging box: 64 rows of 128 bytes, swizzled */
constexpr int OUT_BYTES = 2 * OUT_BOX_BYTES; /* one consumer's staging */
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * OUT_BYTES + 2 * STAGES * 8 + 1024;
static_assert(STAGE_BYTES % 1024 == 0 && OUT_BOX_BYTES % 1024 == 0, "swizzled boxes start 1024-byte aligned");
static_assert(SMEM_BYTES <= 232448, "one CTA a multiprocessor");

/* Shared-memory layout of a CTA (1024-aligned ring, then the staging, then the barriers). */
struct smem_layout {
    uint32_t ring, out, full, empty;
};

/* The tiles of this CTA: group p covers CLUSTER consecutive row tiles (one a CTA of the
 * cluster, by rank) of the same `cols` output columns; groups first, first + step, ... */
struct tile_walk {
    int row_groups, groups, first, step, cols;
    __device__ int row0(int p, int cluster, int rank) const { return ((p % row_groups) * cluster + rank) * BM; }
    __device__ int col0(int p) const { return (p / row_groups) * cols; }
};

/* The walk over an output of n rows and `width` columns in tiles of `cols` columns. */
__device__ __forceinline__ tile_walk walk_of(int n, int width, int cols, int cluster)
{
    tile_walk w;
    w.row_groups = ((n + BM - 1) / BM + cluster - 1) / cluster;
    w.groups = w.row_groups * ((width + cols - 1) / cols);
    w.first = blockIdx.x / cluster, w.step = gridDim.x / cluster, w.cols = cols;
    return w;
}

/* B's two boxes of a tile at column c0: rows b0_row + c0 of map_b0 and b1_row + c0 of map_b1. */
struct b_source {
    const CUtensorMap *map_b0, *map_b1;
    int b0_row, b1_row;
};

#if SF_WGMMA_ENABLED
__device__ __forceinline__ smem_layout smem_at(unsigned char *raw)
{
    smem_layout l;
    l.ring = ((uint32_t)__cvta_generic_to_shared(raw) + 1023) & ~1023u;
    l.out = l.ring + STAGES * STAGE_BYTES;
    l.full = l.out + 2 * OUT_BYTES;
    l.empty = l.full + 8 * STAGES;
    return l;
}

/* Thread 0: the ring's barriers; the empty ones count lane 0 of every consumer warp of the
 * cluster (each slot is written by every CTA's multicast). */
__device__ __forceinline__ void init_barriers(const smem_layout &l, int cluster)
{
    for (int s = 0; s < STAGES; s++) {
        mbar_init(l.full + 8 * s, 1);
        mbar_init(l.empty + 8 * s, 8 * cluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Producer (one thread): every K step of every tile of this CTA into the ring. With a cluster,
 * the CTAs' tiles share B: each CTA loads 256 / CLUSTER of its rows once for all of them
 * (multicast), so a slot is refilled only when every CTA's consumers released it. */
template <int CLUSTER, bool E4M3>
__device__ __forceinline__ void produce(const CUtensorMap *map_a, const b_source &b, const smem_layout &l,
                                        const tile_walk &w, int kt_count, int rank)
{
    constexpr int B_ROWS = BN / CLUSTER; /* rows of B's 256 this CTA loads */
    uint32_t it = 0;
    for (int p = w.first; p < w.groups; p += w.step) {
        const int m0 = w.row0(p, CLUSTER, rank), c0 = w.col0(p);
        for (int kt = 0; kt < kt_count; kt++, it++) {
            const uint32_t s = it % STAGES, slot = l.ring + s * STAGE_BYTES, bar = l.full + 8 * s;
            mbar_wait(l.empty + 8 * s, ((it / STAGES) & 1) ^ 1);
            mbar_arrive_expect_tx(bar, STAGE_BYTES); /* its own A box, and all of B's */
            const int k0 = kt * k_step<E4M3>();
            tma_load_2d(slot, map_a, k0, m0, bar);
            if (CLUSTER == 1) {
                tma_load_2d(slot + A_BYTES, b.map_b0, k0, b.b0_row + c0, bar);
                tma_load_2d(slot + A_BYTES + B_BOX_BYTES, b.map_b1, k0, b.b1_row + c0, bar);
            } else {
                const int row = rank * B_ROWS; /* of the 256: the first box's 128, then the second's */
                const CUtensorMap *map = row < 128 ? b.map_b0 : b.map_b1;
                const int base = row < 128 ? b.b0_row : b.b1_row;
                tma_load_2d_multicast(slot + A_BYTES + row * 128, map, k0, base + c0 + row % 128, bar,
                                      (uint16_t)((1u << CLUSTER) - 1));
            }
        }
    }
}

/* A slot goes back to every CTA's producer of the cluster (lane 0 of each consumer warp). */
template <int CLUSTER>
__device__ __forceinline__ void release_slot(const smem_layout &l, uint32_t s)
{
    if ((threadIdx.x & 31) != 0) return;
    if (CLUSTER == 1) mbar_arrive(l.empty + 8 * s);
#pragma unroll
    for (int r = 0; r < CLUSTER && CLUSTER > 1; r++) mbar_arrive_cluster(l.empty + 8 * s, (uint32_t)r);
}

/* Consumer c's products of one tile into acc (64 rows x 256 columns: accumulator 4 j + 2 hr + e
 * is row 16 warp + g + 8 hr, column 8 j + 2 t + e, with g = lane / 4, t = lane % 4); `it` counts
 * the CTA's K steps across tiles, as the producer's does. Returns with the products complete and
 * every slot of the tile released. */
template <int CLUSTER, bool E4M3>
__device__ __forceinline__ void consume_tile(float *acc, const smem_layout &l, int c, int kt_count, uint32_t &it)
{
    for (int kt = 0; kt < kt_count; kt++, it++) {
        const uint32_t s = it % STAGES, slot = l.ring + s * STAGE_BYTES;
        mbar_wait(l.full + 8 * s, (it / STAGES) & 1);
        const uint64_t da = sw128_desc(slot + c * (A_BYTES / 2), 16, 1024);
        const uint64_t db = sw128_desc(slot + A_BYTES, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ks++) /* +32 bytes along K: +2 in the descriptor's address field */
            if constexpr (E4M3)
                wgmma_m64n256k32_e4m3_ss(acc, da + 2 * ks, db + 2 * ks, kt > 0 || ks > 0);
            else
                wgmma_m64n256k16_ss(acc, da + 2 * ks, db + 2 * ks, kt > 0 || ks > 0);
        wgmma_commit();
        if (kt > 0) {
            wgmma_wait<1>(); /* the previous step's products are done with its slot */
            release_slot<CLUSTER>(l, (it - 1) % STAGES);
        }
    }
    wgmma_wait<0>();
    reg_fence<128>(acc);
    release_slot<CLUSTER>(l, (it - 1) % STAGES);
}

/* The whole kernel but its epilogue: barriers, the producer, and each consumer's tiles, after
 * each of which epilogue(acc, staging, row0, col0, c) runs (consumer c's 64 rows start at row0,
 * the tile's columns at col0; staging is the consumer's OUT_BYTES of shared memory, which the
 * epilogue may hand to the copy engine: every bulk group is waited for before the CTA ends). */
template <int CLUSTER, bool E4M3 = false, class Epilogue>
__device__ __forceinline__ void run_cooperative(unsigned char *smem_raw, const CUtensorMap *map_a, const b_source &b,
                                                const tile_walk &w, int kt_count, Epilogue &&epilogue)
{
    const smem_layout l = smem_at(smem_raw);
    const int wg = threadIdx.x / 128, rank = CLUSTER > 1 ? (int)cluster_rank() : 0;
    if (threadIdx.x == 0) {
        init_barriers(l, CLUSTER);
        tma_prefetch_map(map_a), tma_prefetch_map(b.map_b0), tma_prefetch_map(b.map_b1);
    }
    if (CLUSTER > 1)
        cluster_sync(); /* no copy or arrival reaches a CTA before its barriers exist */
    else
        __syncthreads();
    sf_wait_prior_grid(); /* the operands (and what the epilogue touches) come from the kernels ahead */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) produce<CLUSTER, E4M3>(map_a, b, l, w, kt_count, rank);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int c = wg - 1;
        const uint32_t staging = l.out + c * OUT_BYTES;
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.0f;
        uint32_t it = 0;
        for (int p = w.first; p < w.groups; p += w.step) {
            consume_tile<CLUSTER, E4M3>(acc, l, c, kt_count, it);
            epilogue(acc, staging, w.row0(p, CLUSTER, rank) + 64 * c, w.col0(p), c);
        }
        if (threadIdx.x % 128 == 0) tma_store_wait_all();
    }
    /* no CTA leaves while another may still arrive on its barriers or copy into it */
    if (CLUSTER > 1) cluster_sync();
}
#endif

} // namespace gemm_tma

#endif
