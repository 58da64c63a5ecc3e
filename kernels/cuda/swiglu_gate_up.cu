/* The MLP's gate and up products with SwiGLU applied in their epilogue (Hopper: bulk tensor
 * copies, wgmma, warp specialization):
 *
 *   g[n, F] = silu(u W1^T) * (u W3^T),   u [n, D] bf16,  W1, W3 [F, D] bf16 (K-major),  g bf16
 *
 * cuBLAS has no SwiGLU epilogue, so the composed path writes u [W1|W3]^T as [n, 2F] bf16 and a
 * separate pass (swiglu_rows_bf16: 3 x n F x 2 bytes of traffic, 66 us a layer of the reference
 * model, bandwidth-bound) pairs the halves. Here the pair never leaves the registers: each tile
 * holds the gate and up accumulators of the same 128 hidden columns, silu(gate) * up is computed
 * from the float32 accumulators (one rounding, to bf16, instead of three) and only g is written.
 *
 * Layout: gemm_tma.cuh's cooperative kernel (a TMA producer warpgroup, two wgmma consumer
 * warpgroups of 64 rows each) on tiles of 128 rows x 128 hidden columns, B = W1's slice then
 * W3's, adjacent in shared memory, so gate and up of a hidden column come out of one m64n256k16
 * in the same thread. The epilogue computes silu(gate) * up with the fast tanh, rounds once
 * to bf16 into a swizzled staging tile and one thread stores it by TMA (rows past n and columns
 * past F clipped, loads past them zeros), so any n and D, F multiples of 8 work.
 * Tried variants (bench/lab/GEMM_NOTES.md, "W1|W3 with SwiGLU in the epilogue"; the code in
 * bench/lab/swiglu_gate_up_variants.cu): clusters of 2 or 4 CTAs sharing each W1|W3 slice by TMA
 * multicast (the loads were not the bound: 1.5% and 10% slower), and a pingpong schedule (15%
 * slower). CPU twin: the CPU backend's matmul then swiglu (tests/test_backend_ops.c, ffn).
 * In precision fp8 the same kernel takes u, W1 and W3 in e4m3 (gemm_tma.cuh's E4M3 form: a K step
 * of 128 bytes is 128 values) and applies u's row scales and the weights' channel scales to the
 * float32 accumulators before silu, so W1 u | W3 u are not written in bf16 and read back for the
 * quantization of g (which W2 then reads as any bf16 input). The accumulators are the tensor
 * cores' e4m3 sums (as cuBLASLt's with FAST_ACCUM): within the inputs' own rounding. Where W2
 * takes its input with a scale for each 128 values of a row (gemm_fp8.cu, block weights) g
 * need not be written in bf16 at all: a tile's 128 hidden columns are one such block, so the
 * epilogue finds each row's largest magnitude over them (the four threads of a quad hold a
 * row's 128), writes that scale and g in e4m3 (half the bytes of bf16, no quantization pass
 * reading it back).
 * Built for sm_90a only. */
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm_tma.cuh"
#include "kernels/cuda/launch_early.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/tensor_map.h"

#include <cuda_fp8.h>

namespace {

using gemm_tma::BK;
using gemm_tma::BM;
using gemm_tma::SMEM_BYTES;
using gemm_tma::THREADS;
constexpr int BH = 128; /* hidden columns a tile: W1's 128 rows and W3's make the product's 256 */

/* The scales of the e4m3 form: u's rows (su), W1's and W3's channels (s1, s3); gs: g's when
 * the kernel writes g in e4m3, one a row and 128 hidden columns, [hidden / 128][n]. */
struct gate_up_scales {
    const float *su, *s1, *s3;
    float *gs;
};

#if SF_WGMMA_ENABLED
/* silu(x) = x sigmoid(x) = h + h tanh(h), h = x / 2: one MUFU op (tanh.approx, relative error
 * about 2^-11) where the exponential and the division take two (ex2, rcp). The epilogue runs
 * while no product does, and the MUFU pipe issues at an eighth of the FMA's rate. For large
 * negative x, tanh(h) reaches -1 and silu 0, its limit. */
__device__ __forceinline__ float silu(float x)
{
    const float h = 0.5f * x;
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
    return fmaf(h, t, h);
}

/* silu(gate) * up of this thread's accumulators into the warpgroup's staging tile: gate for
 * j < 16, up of the same hidden column at j + 16 (gemm_tma::consume_tile's layout); column c of
 * the 128 goes to box c / 64, 16-byte chunk (c % 64) / 8 swizzled by the row (rows are
 * 8-aligned, so row % 8 = g). E4M3: gate and up dequantized first by their row's scale and their
 * hidden column's (rows from row0, columns from h0; past n and f they scale by 0). */
template <bool E4M3>
__device__ __forceinline__ void stage_output(const float *acc, uint32_t out, int warp, int g, int t,
                                             const gate_up_scales &sc, int row0, int h0, int n, int f)
{
    float a[2] = {1.0f, 1.0f};
#pragma unroll
    for (int hr = 0; hr < 2 && E4M3; hr++) {
        const int row = row0 + 16 * warp + g + 8 * hr;
        a[hr] = row < n ? sc.su[row] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float w1[2] = {1.0f, 1.0f}, w3[2] = {1.0f, 1.0f};
#pragma unroll
        for (int e = 0; e < 2 && E4M3; e++) {
            const int col = h0 + 8 * j + 2 * t + e;
            w1[e] = col < f ? sc.s1[col] : 0.0f, w3[e] = col < f ? sc.s3[col] : 0.0f;
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int k = 4 * j + 2 * hr, row = 16 * warp + g + 8 * hr;
            float gate[2], up[2];
#pragma unroll
            for (int e = 0; e < 2; e++)
                gate[e] = E4M3 ? acc[k + e] * a[hr] * w1[e] : acc[k + e],
                up[e] = E4M3 ? acc[64 + k + e] * a[hr] * w3[e] : acc[64 + k + e];
            const uint32_t v = pack_bf16x2(silu(gate[0]) * up[0], silu(gate[1]) * up[1]);
            const uint32_t at = out + (j / 8) * gemm_tma::OUT_BOX_BYTES + row * 128 + (((j % 8) ^ g) << 4) + 4 * t;
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
        }
    }
}

/* stage_output<true> writing g in e4m3: a row's 128 values of the tile (32 in each thread of its
 * quad) share a scale, their largest magnitude / 448 (1 where all are zero: gemm_fp8.cu's
 * rule), written to sc.gs; the values go to one staging box of 64 rows x 128 bytes, 16-byte
 * chunk c / 16 of row r swizzled by r % 8 = g. The epilogue runs while no product does (both
 * consumers finish a tile together), so it keeps the bf16 form's order: the channel scales
 * loaded once a column pair for both rows, g written over the gate accumulators (the next
 * tile's first product overwrites them) rather than into more registers. */
__device__ __forceinline__ void stage_output_e4m3(float *acc, uint32_t out, int warp, int g, int t,
                                                  const gate_up_scales &sc, int row0, int h0, int n, int f)
{
    float a[2], m[2] = {0.0f, 0.0f};
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = row0 + 16 * warp + g + 8 * hr;
        a[hr] = row < n ? sc.su[row] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float w1[2], w3[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int col = h0 + 8 * j + 2 * t + e;
            w1[e] = col < f ? sc.s1[col] : 0.0f, w3[e] = col < f ? sc.s3[col] : 0.0f;
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int k = 4 * j + 2 * hr + e;
                acc[k] = silu(acc[k] * a[hr] * w1[e]) * (acc[64 + k] * a[hr] * w3[e]);
                m[hr] = fmaxf(m[hr], fabsf(acc[k]));
            }
    }
    float inv[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        m[hr] = fmaxf(m[hr], __shfl_xor_sync(0xffffffffu, m[hr], 1));
        m[hr] = fmaxf(m[hr], __shfl_xor_sync(0xffffffffu, m[hr], 2));
        const float s = m[hr] > 0.0f ? m[hr] / 448.0f : 1.0f;
        inv[hr] = 1.0f / s;
        const int row = row0 + 16 * warp + g + 8 * hr;
        if (t == 0 && row < n) sc.gs[(size_t)(h0 / 128) * n + row] = s;
    }
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int k = 4 * j + 2 * hr, row = 16 * warp + g + 8 * hr;
            const unsigned short pair = __nv_cvt_float2_to_fp8x2(make_float2(acc[k] * inv[hr], acc[k + 1] * inv[hr]),
                                                                 __NV_SATFINITE, __NV_E4M3);
            const uint32_t at = out + row * 128 + (((j / 2) ^ g) << 4) + 8 * (j % 2) + 2 * t;
            asm volatile("st.shared.u16 [%0], %1;" ::"r"(at), "h"(pair) : "memory");
        }
}
#endif

/* The cooperative kernel (gemm_tma.cuh) with B = W1's and W3's 128-row slices of the same
 * hidden columns, and SwiGLU in the epilogue: g rounded once to bf16 into a swizzled staging
 * tile, which one thread stores by TMA (rows past n and columns past F are clipped) while the
 * warpgroup goes on to its next tile's products. Launched as clusters of CLUSTER = 1 CTA (the
 * lab's variants take 2 and 4). E4M3: u, W1 and W3 in e4m3, their scales in sc; G8 (with E4M3):
 * g in e4m3 with its scales (stage_output_e4m3), map_g a map of bytes. */
template <int CLUSTER, bool E4M3, bool G8 = false>
__global__ void __launch_bounds__(THREADS, 1)
    swiglu_gate_up_kernel(const __grid_constant__ CUtensorMap map_u, const __grid_constant__ CUtensorMap map_w1,
                          const __grid_constant__ CUtensorMap map_w3, const __grid_constant__ CUtensorMap map_g, int n,
                          int d, int f, gate_up_scales sc)
{
#if SF_WGMMA_ENABLED
    extern __shared__ unsigned char smem_raw[];
    if (threadIdx.x == 0) tma_prefetch_map(&map_g);
    const gemm_tma::b_source b = {&map_w1, &map_w3, 0, 0};
    auto epilogue = [&](float *acc, uint32_t staging, int row0, int h0, int c) {
        const bool leader = threadIdx.x % 128 == 0;
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
        if (leader) tma_store_wait_read<0>(); /* the previous tile's store has left the staging tile */
        named_sync(1 + c, 128);
        if constexpr (G8)
            stage_output_e4m3(acc, staging, warp, lane >> 2, lane & 3, sc, row0, h0, n, f);
        else
            stage_output<E4M3>(acc, staging, warp, lane >> 2, lane & 3, sc, row0, h0, n, f);
        fence_proxy_async(); /* the staging tile, written by st.shared, is read by the copy engine */
        named_sync(1 + c, 128);
        if (leader) {
            tma_store_2d(&map_g, h0, row0, staging);
            if (!G8) tma_store_2d(&map_g, h0 + 64, row0, staging + gemm_tma::OUT_BOX_BYTES);
            tma_store_commit();
        }
    };
    const int k_step = gemm_tma::k_step<E4M3>();
    gemm_tma::run_cooperative<CLUSTER, E4M3>(smem_raw, &map_u, b, gemm_tma::walk_of(n, f, BH, CLUSTER),
                                             (d + k_step - 1) / k_step, epilogue);
#endif
}

/* Per device: the multiprocessors when the kernel fits there (its sm_90a image loads and its
 * shared memory can be raised), else 0. */
static int fit_here()
{
    static int known[64];
    return sf_cuda_hopper_known(known, (const void *)swiglu_gate_up_kernel<1, false>, SMEM_BYTES);
}

template <int CLUSTER, bool E4M3, bool G8>
static cudaError_t launch(int clusters, const CUtensorMap &mu, const CUtensorMap &mw1, const CUtensorMap &mw3,
                          const CUtensorMap &mg, int n, int dim, int hidden, const gate_up_scales &sc,
                          cudaStream_t stream)
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
    return cudaLaunchKernelEx(&cfg, swiglu_gate_up_kernel<CLUSTER, E4M3, G8>, mu, mw1, mw3, mg, n, dim, hidden, sc);
}

/* An operand of rows x cols (K-major, rows cols apart) in boxes of box_rows rows: bf16 or e4m3. */
template <bool E4M3> static int map_operand(CUtensorMap *map, const void *base, int rows, int cols, int box_rows)
{
    if constexpr (E4M3)
        return sf_cuda_tensor_map_u8_sw128(map, static_cast<const unsigned char *>(base), rows, cols, cols, box_rows);
    else
        return sf_cuda_tensor_map_bf16_sw128(map, static_cast<const __nv_bfloat16 *>(base), rows, cols, cols, box_rows);
}

/* Every form after its checks: the maps, then one CTA a multiprocessor (fits) at most. g: bf16,
 * or e4m3 bytes with G8. */
template <bool E4M3, bool G8 = false>
static int gate_up(int fits, int n, int dim, int hidden, const void *u, const void *w1, const void *w3, void *g,
                   const gate_up_scales &sc, cudaStream_t stream, const char *what)
{
    CUtensorMap map_u, map_w1, map_w3, map_g;
    int rc = map_operand<E4M3>(&map_u, u, n, dim, BM);
    if (rc == SF_OK) rc = map_operand<E4M3>(&map_w1, w1, hidden, dim, BH);
    if (rc == SF_OK) rc = map_operand<E4M3>(&map_w3, w3, hidden, dim, BH);
    if (rc == SF_OK) rc = map_operand<G8>(&map_g, g, n, hidden, 64);
    if (rc != SF_OK) return rc;
    const long long groups = (long long)((n + BM - 1) / BM) * ((hidden + BH - 1) / BH);
    const int clusters = (int)(groups < fits ? groups : fits);
    return sf_cuda_status(launch<1, E4M3, G8>(clusters, map_u, map_w1, map_w3, map_g, n, dim, hidden, sc, stream),
                          what);
}

} // namespace

int sf_cuda_swiglu_gate_up_usable(int dim, int hidden)
{
    if (dim <= 0 || hidden <= 0 || dim % 8 || hidden % 8) return 0;
    return fit_here();
}

int sf_cuda_swiglu_gate_up(int n, int dim, int hidden, const __nv_bfloat16 *u, const __nv_bfloat16 *w1,
                           const __nv_bfloat16 *w3, __nv_bfloat16 *g, cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    const int fits = sf_cuda_swiglu_gate_up_usable(dim, hidden);
    if (!fits) return sf_error(SF_E_UNSUPPORTED, "swiglu_gate_up: dim %d, hidden %d or this device", dim, hidden);
    return gate_up<false>(fits, n, dim, hidden, u, w1, w3, g, {nullptr, nullptr, nullptr, nullptr}, stream,
                          "swiglu_gate_up");
}

int sf_cuda_swiglu_gate_up_e4m3_usable(int dim, int hidden)
{
    if (dim <= 0 || hidden <= 0 || dim % 16 || hidden % 8) return 0;
    static int known[64];
    return sf_cuda_hopper_known(known, (const void *)swiglu_gate_up_kernel<1, true>, SMEM_BYTES);
}

int sf_cuda_swiglu_gate_up_e4m3(int n, int dim, int hidden, const unsigned char *u, const float *su,
                                const unsigned char *w1, const unsigned char *w3, const float *s1, const float *s3,
                                __nv_bfloat16 *g, cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    const int fits = sf_cuda_swiglu_gate_up_e4m3_usable(dim, hidden);
    if (!fits)
        return sf_error(SF_E_UNSUPPORTED, "swiglu_gate_up (e4m3): dim %d, hidden %d or this device", dim, hidden);
    return gate_up<true>(fits, n, dim, hidden, u, w1, w3, g, {su, s1, s3, nullptr}, stream, "swiglu_gate_up (e4m3)");
}

int sf_cuda_swiglu_gate_up_e4m3_blocks(int n, int dim, int hidden, const unsigned char *u, const float *su,
                                       const unsigned char *w1, const unsigned char *w3, const float *s1,
                                       const float *s3, unsigned char *g8, float *gs, cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    /* a tile's 128 hidden columns must be one block of g's scales */
    static_assert(BH == 128, "a tile's hidden columns are one block of 128");
    static int known[64];
    const int fits = dim > 0 && dim % 16 == 0 && hidden > 0 && hidden % 128 == 0
                         ? sf_cuda_hopper_known(known, (const void *)swiglu_gate_up_kernel<1, true, true>, SMEM_BYTES)
                         : 0;
    if (!fits)
        return sf_error(SF_E_UNSUPPORTED, "swiglu_gate_up (e4m3, g in blocks): dim %d, hidden %d or this device", dim,
                        hidden);
    return gate_up<true, true>(fits, n, dim, hidden, u, w1, w3, g8, {su, s1, s3, gs}, stream,
                               "swiglu_gate_up (e4m3, g in blocks)");
}
