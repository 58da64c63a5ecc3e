/* Lab: the tried variants of the product's W1|W3 SwiGLU kernel (kernels/cuda/swiglu_gate_up.cu,
 * whose header describes the kernel): clusters of 2 or 4 CTAs sharing each W1|W3 slice by TMA
 * multicast (the loads were not the bound: 1.5% and 10% slower), and a pingpong schedule (15%
 * slower; bench/lab/GEMM_NOTES.md, "W1|W3 with SwiGLU in the epilogue"). Cluster 1 with the
 * cooperative schedule is the product's kernel, kept here so that the variants are timed
 * against it in one program (bench/lab/bench_cuda_swiglu_gate_up.cu, which checks each against
 * the CPU's float32 product). Built for sm_90a only, with the benchmarks. */
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm_tma.cuh"
#include "kernels/cuda/launch_early.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/tensor_map.h"
#include "bench/lab/lab_kernels.h"

namespace {

using gemm_tma::BK;
using gemm_tma::BM;
using gemm_tma::SMEM_BYTES;
using gemm_tma::THREADS;
constexpr int BH = 128; /* hidden columns a tile: W1's 128 rows and W3's make the product's 256 */

#if SF_WGMMA_ENABLED
/* The fast exponential and division (MUFU ex2 and rcp): the epilogue does not overlap the
 * products, and expf with a full division cost it ~3 us a tile of ~15 (by instruction count).
 * For x < -87, exp(-x) is inf and the quotient 0, as silu's limit. */
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

/* silu(gate) * up of this thread's accumulators into the warpgroup's staging tile: gate for
 * j < 16, up of the same hidden column at j + 16 (gemm_tma::consume_tile's layout); column c of
 * the 128 goes to box c / 64, 16-byte chunk (c % 64) / 8 swizzled by the row (rows are
 * 8-aligned, so row % 8 = g). */
__device__ __forceinline__ void stage_output(const float *acc, uint32_t out, int warp, int g, int t)
{
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int k = 4 * j + 2 * hr, row = 16 * warp + g + 8 * hr;
            const uint32_t v = pack_bf16x2(silu(acc[k]) * acc[64 + k], silu(acc[k + 1]) * acc[64 + k + 1]);
            const uint32_t at = out + (j / 8) * gemm_tma::OUT_BOX_BYTES + row * 128 + (((j % 8) ^ g) << 4) + 4 * t;
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
        }
}
#endif

/* The cooperative kernel (gemm_tma.cuh) with B = W1's and W3's 128-row slices of the same
 * hidden columns, and SwiGLU in the epilogue: g rounded once to bf16 into a swizzled staging
 * tile, which one thread stores by TMA (rows past n and columns past F are clipped) while the
 * warpgroup goes on to its next tile's products. CLUSTER > 1: clusters of CTAs on neighbouring
 * row tiles that share each W1|W3 slice by multicast (a tried variant). */
template <int CLUSTER>
__global__ void __launch_bounds__(THREADS, 1)
swiglu_gate_up_kernel(const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_w1,
                      const __grid_constant__ CUtensorMap map_w3, const __grid_constant__ CUtensorMap map_g, int n,
                      int d, int f)
{
#if SF_WGMMA_ENABLED
    extern __shared__ unsigned char smem_raw[];
    if (threadIdx.x == 0) tma_prefetch_map(&map_g);
    const gemm_tma::b_source b = {&map_w1, &map_w3, 0, 0};
    auto epilogue = [&](const float *acc, uint32_t staging, int row0, int h0, int c) {
        const bool leader = threadIdx.x % 128 == 0;
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
        if (leader) tma_store_wait_read<0>(); /* the previous tile's store has left the staging tile */
        named_sync(1 + c, 128);
        stage_output(acc, staging, warp, lane >> 2, lane & 3);
        fence_proxy_async(); /* the staging tile, written by st.shared, is read by the copy engine */
        named_sync(1 + c, 128);
        if (leader) {
            tma_store_2d(&map_g, h0, row0, staging);
            tma_store_2d(&map_g, h0 + 64, row0, staging + gemm_tma::OUT_BOX_BYTES);
            tma_store_commit();
        }
    };
    gemm_tma::run_cooperative<CLUSTER>(smem_raw, &map_u, b, gemm_tma::walk_of(n, f, BH, CLUSTER), (d + BK - 1) / BK,
                                       epilogue);
#endif
}

/* ---- pingpong: each consumer warpgroup owns whole tiles, alternating, so that one's epilogue
 * runs under the other's products (CUTLASS's "warp-specialized pingpong" order). A tile is 128
 * rows x 64 hidden columns (B = W1's 64 rows then W3's: gate and up in one m64n128k16 per 64
 * rows), the ring 6 slots of 32 KB; tile j of the CTA's walk is consumer j % 2's, its K steps
 * ring positions j KT .. j KT + KT - 1. A consumer starts tile j's products only once the other
 * has issued tile j - 1's (an "order" mbarrier each): besides handing the tensor cores over in
 * turn, this keeps every wait within one phase of its slot's barrier, which a parity wait
 * needs (without it, a consumer 16 steps ahead took an old phase for its own and hung). Same
 * operands, clipping and epilogue math as the cooperative kernel. */
namespace pingpong {
constexpr int BM = 128, BH = 64, BK = 64, STAGES = 6, THREADS = 384;
constexpr int U_BYTES = BM * BK * 2, W_BYTES = BH * BK * 2, STAGE_BYTES = U_BYTES + 2 * W_BYTES;
constexpr int OUT_BYTES = BM * 64 * 2; /* one consumer's staging tile: one store box, 128 x 64 */
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 2 * OUT_BYTES + (2 * STAGES + 2) * 8 + 1024;
static_assert(STAGE_BYTES % 1024 == 0 && U_BYTES % 1024 == 0 && W_BYTES % 1024 == 0, "1024-byte aligned boxes");
static_assert(SMEM_BYTES <= 232448, "one CTA a multiprocessor");
} // namespace pingpong

__global__ void __launch_bounds__(pingpong::THREADS, 1)
swiglu_gate_up_pingpong_kernel(const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_w1,
                               const __grid_constant__ CUtensorMap map_w3, const __grid_constant__ CUtensorMap map_g,
                               int n, int d, int f)
{
#if SF_WGMMA_ENABLED
    /* this schedule's shapes, shadowing the cooperative kernel's */
    constexpr int BM = pingpong::BM, BH = pingpong::BH, BK = pingpong::BK, STAGES = pingpong::STAGES;
    constexpr int U_BYTES = pingpong::U_BYTES, W_BYTES = pingpong::W_BYTES, STAGE_BYTES = pingpong::STAGE_BYTES;
    constexpr int OUT_BYTES = pingpong::OUT_BYTES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t ring = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023) & ~1023u;
    const uint32_t out_base = ring + STAGES * STAGE_BYTES, full = out_base + 2 * OUT_BYTES, empty = full + 8 * STAGES;
    const int wg = threadIdx.x / 128;
    const int row_tiles = (n + BM - 1) / BM, tiles = row_tiles * ((f + BH - 1) / BH), kt_count = (d + BK - 1) / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full + 8 * s, 1);
            mbar_init(empty + 8 * s, 4); /* lane 0 of each warp of the slot's consumer */
        }
        mbar_init(empty + 8 * STAGES, 1), mbar_init(empty + 8 * STAGES + 8, 1); /* order[c]: c may go on */
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        tma_prefetch_map(&map_u), tma_prefetch_map(&map_w1), tma_prefetch_map(&map_w3), tma_prefetch_map(&map_g);
    }
    __syncthreads();
    sf_wait_prior_grid(); /* u is the norm's output, and g may still be read by the product ahead */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0) return;
        uint32_t it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = (tile % row_tiles) * BM, h0 = (tile / row_tiles) * BH;
            for (int kt = 0; kt < kt_count; kt++, it++) {
                const uint32_t s = it % STAGES, slot = ring + s * STAGE_BYTES, bar = full + 8 * s;
                mbar_wait(empty + 8 * s, ((it / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(bar, STAGE_BYTES);
                tma_load_2d(slot, &map_u, kt * BK, m0, bar);
                tma_load_2d(slot + U_BYTES, &map_w1, kt * BK, h0, bar);
                tma_load_2d(slot + U_BYTES + W_BYTES, &map_w3, kt * BK, h0, bar);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool leader = threadIdx.x % 128 == 0;
    const uint32_t out = out_base + c * OUT_BYTES;
    float acc[2][64]; /* rows 0-63 and 64-127 of the tile: columns 0-63 gate, 64-127 up */
#pragma unroll
    for (int i = 0; i < 64; i++) acc[0][i] = acc[1][i] = 0.0f;
    const uint32_t my_order = empty + 8 * STAGES + 8 * c, other_order = empty + 8 * STAGES + 8 * (1 - c);
    int j = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, j++) {
        if ((j & 1) != c) continue;
        const int m0 = (tile % row_tiles) * BM, h0 = (tile / row_tiles) * BH;
        const uint32_t it0 = (uint32_t)j * kt_count;
        /* the other consumer's tile j - 1 issued: its signal number (j - 1) / 2 on my barrier */
        if (j > 0) mbar_wait(my_order, (uint32_t)((j - 1) / 2) & 1);
        for (int kt = 0; kt < kt_count; kt++) {
            const uint32_t it = it0 + kt, s = it % STAGES, slot = ring + s * STAGE_BYTES;
            mbar_wait(full + 8 * s, (it / STAGES) & 1);
            const uint64_t da = sw128_desc(slot, 16, 1024), db = sw128_desc(slot + U_BYTES, 16, 1024);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 16; ks++) {
                wgmma_m64n128k16_ss<0>(acc[0], da + 2 * ks, db + 2 * ks, kt > 0 || ks > 0);
                wgmma_m64n128k16_ss<0>(acc[1], da + (U_BYTES / 2 >> 4) + 2 * ks, db + 2 * ks, kt > 0 || ks > 0);
            }
            wgmma_commit();
            if (kt == kt_count - 1 && leader) mbar_arrive(other_order); /* its products may start */
            if (kt > 0) {
                wgmma_wait<1>();
                if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % STAGES));
            }
        }
        wgmma_wait<0>();
        reg_fence<64>(acc[0]);
        reg_fence<64>(acc[1]);
        if (lane == 0) mbar_arrive(empty + 8 * ((it0 + kt_count - 1) % STAGES));
        if (leader) tma_store_wait_read<0>();
        named_sync(1 + c, 128);
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int hr = 0; hr < 2; hr++) {
                    const float *a = acc[half];
                    const int k = 4 * jj + 2 * hr, row = 64 * half + 16 * warp + g + 8 * hr;
                    const uint32_t v = pack_bf16x2(silu(a[k]) * a[32 + k], silu(a[k + 1]) * a[32 + k + 1]);
                    const uint32_t at = out + row * 128 + ((jj ^ g) << 4) + 4 * t;
                    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
                }
        fence_proxy_async();
        named_sync(1 + c, 128);
        if (leader) {
            tma_store_2d(&map_g, h0, m0, out);
            tma_store_commit();
        }
    }
    if (leader) tma_store_wait_all();
#endif
}

/* Per device and cluster size: multiprocessors, and how many clusters fit at once (0: the
 * kernel cannot run here). A benign race may fill an entry twice with the same values. */
struct gate_up_fit {
    signed char known; /* 0 unknown, 1 usable, -1 not */
    int clusters[3];   /* cooperative, cluster sizes 1, 2, 4 */
    int pingpong;      /* pingpong CTAs (one a multiprocessor) */
};

template <int CLUSTER>
static int max_clusters()
{
    const int sms = sf_cuda_hopper_kernel_fits((const void *)swiglu_gate_up_kernel<CLUSTER>, SMEM_BYTES);
    if (CLUSTER == 1 || sms == 0) return sms;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(CLUSTER), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = SMEM_BYTES;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CLUSTER, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    int count = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&count, swiglu_gate_up_kernel<CLUSTER>, &cfg) == cudaSuccess;
    cudaGetLastError();
    return ok ? count : 0;
}

static const gate_up_fit *fit_here()
{
    static gate_up_fit fit[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return NULL;
    gate_up_fit *f = &fit[dev];
    if (!f->known) {
        f->clusters[0] = max_clusters<1>();
        f->clusters[1] = f->clusters[0] ? max_clusters<2>() : 0;
        f->clusters[2] = f->clusters[0] ? max_clusters<4>() : 0;
        f->pingpong = sf_cuda_hopper_kernel_fits((const void *)swiglu_gate_up_pingpong_kernel, pingpong::SMEM_BYTES);
        f->known = f->clusters[0] > 0 && f->pingpong > 0 ? 1 : -1;
    }
    return f->known > 0 ? f : NULL;
}

template <int CLUSTER>
static cudaError_t launch(int clusters, const CUtensorMap &mu, const CUtensorMap &mw1, const CUtensorMap &mw3,
                          const CUtensorMap &mg, int n, int dim, int hidden, cudaStream_t stream)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(clusters * CLUSTER)), cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM_BYTES, cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    int k = 0;
    attr[k].id = cudaLaunchAttributeClusterDimension;
    attr[k].val.clusterDim.x = CLUSTER, attr[k].val.clusterDim.y = 1, attr[k].val.clusterDim.z = 1;
    k++;
    if (sf_cuda_early_launch()) {
        attr[k].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[k].val.programmaticStreamSerializationAllowed = 1;
        k++;
    }
    cfg.attrs = attr, cfg.numAttrs = (unsigned)k;
    return cudaLaunchKernelEx(&cfg, swiglu_gate_up_kernel<CLUSTER>, mu, mw1, mw3, mg, n, dim, hidden);
}

} // namespace

int sf_lab_swiglu_gate_up_usable(int dim, int hidden)
{
    if (dim <= 0 || hidden <= 0 || dim % 8 || hidden % 8) return 0;
    return fit_here() != NULL;
}

int sf_lab_swiglu_gate_up_clusters(int cluster)
{
    const gate_up_fit *fit = fit_here();
    return !fit ? 0 : cluster == 1 ? fit->clusters[0] : cluster == 2 ? fit->clusters[1] : cluster == 4 ? fit->clusters[2] : 0;
}

int sf_lab_swiglu_gate_up(int n, int dim, int hidden, const __nv_bfloat16 *u, const __nv_bfloat16 *w1,
                          const __nv_bfloat16 *w3, __nv_bfloat16 *g, int pingpong_schedule, int cluster,
                          cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    const gate_up_fit *fit = sf_lab_swiglu_gate_up_usable(dim, hidden) ? fit_here() : NULL;
    if (!fit) return sf_error(SF_E_UNSUPPORTED, "swiglu_gate_up (lab): dim %d, hidden %d or this device", dim, hidden);
    if (cluster != 1 && cluster != 2 && cluster != 4)
        return sf_error(SF_E_INVAL, "swiglu_gate_up (lab): cluster %d (takes 1, 2, 4)", cluster);
    if (pingpong_schedule) {
        CUtensorMap map_u, map_w1, map_w3, map_g;
        int rc = sf_cuda_tensor_map_bf16_sw128(&map_u, u, n, dim, dim, pingpong::BM);
        if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_w1, w1, hidden, dim, dim, pingpong::BH);
        if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_w3, w3, hidden, dim, dim, pingpong::BH);
        if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_g, g, n, hidden, hidden, pingpong::BM);
        if (rc != SF_OK) return rc;
        const long long tiles =
            (long long)((n + pingpong::BM - 1) / pingpong::BM) * ((hidden + pingpong::BH - 1) / pingpong::BH);
        const unsigned grid = (unsigned)(tiles < fit->pingpong ? tiles : fit->pingpong);
        sf_cuda_launch_early(swiglu_gate_up_pingpong_kernel, dim3(grid), dim3(pingpong::THREADS), pingpong::SMEM_BYTES,
                             stream, map_u, map_w1, map_w3, map_g, n, dim, hidden);
        return sf_cuda_launched("swiglu_gate_up (pingpong)");
    }
    if (cluster > 1 && fit->clusters[cluster == 2 ? 1 : 2] == 0) cluster = 1; /* this device has no room */
    const int fits = fit->clusters[cluster == 1 ? 0 : cluster == 2 ? 1 : 2];
    CUtensorMap map_u, map_w1, map_w3, map_g;
    const int w_rows = cluster == 1 ? BH : 2 * BH / cluster;
    int rc = sf_cuda_tensor_map_bf16_sw128(&map_u, u, n, dim, dim, BM);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_w1, w1, hidden, dim, dim, w_rows);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_w3, w3, hidden, dim, dim, w_rows);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_g, g, n, hidden, hidden, 64);
    if (rc != SF_OK) return rc;
    const long long groups = (long long)((n + BM * cluster - 1) / (BM * cluster)) * ((hidden + BH - 1) / BH);
    const int clusters = (int)(groups < fits ? groups : fits);
    cudaError_t err = cluster == 1 ? launch<1>(clusters, map_u, map_w1, map_w3, map_g, n, dim, hidden, stream)
                    : cluster == 2 ? launch<2>(clusters, map_u, map_w1, map_w3, map_g, n, dim, hidden, stream)
                                   : launch<4>(clusters, map_u, map_w1, map_w3, map_g, n, dim, hidden, stream);
    return sf_cuda_status(err, "swiglu_gate_up");
}
