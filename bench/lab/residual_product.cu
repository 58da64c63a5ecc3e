/* A product accumulated into the float32 residual (Hopper: bulk tensor copies, wgmma, warp
 * specialization):
 *
 *   x[n, out] += a[n, in] w^T,   a bf16 [n, in],  w bf16 [out, in] (K-major),  x float32
 *
 * what cuBLAS does with beta = 1 for the MLP's W2 product and the attention's output product.
 * Layout: gemm_tma.cuh's cooperative kernel on tiles of 128 rows x 256 output columns (B = w's
 * rows c0 .. c0 + 127 and c0 + 128 .. c0 + 255, the two boxes of one matrix). The epilogue adds
 * the tile into x without reading it: each consumer stages its 64 x 256 float32 accumulators in
 * 8 column chunks of 64 x 32 (two staging boxes, alternating) and one thread hands each chunk to
 * the copy engine's reduction (cp.reduce.async.bulk.tensor .add), which reads, adds and writes x
 * in L2 while the warpgroup goes on (rows past n and columns past out are left alone). Each
 * element of x gets exactly one addition, so the result is deterministic and equals x + (a w^T)
 * rounded once, as beta = 1. Launched early (programmatic dependent launch), so it also removes
 * the gap before the product that cuBLAS's own launches leave. A tried variant
 * (lab): faster than cuBLAS alone, not in the pipeline
 * (bench/lab/GEMM_NOTES.md). Checked against cuBLAS by bench/lab/bench_cuda_residual_product.cu;
 * before it moved here, also against the CPU backend's matmul
 * with accumulate (tests/test_backend_ops.c, ffn and matmul_typed). Built for sm_90a only. */
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm_tma.cuh"
#include "kernels/cuda/launch_early.cuh"
#include "bench/lab/lab_kernels.h"
#include "kernels/cuda/tensor_map.h"

namespace {

using gemm_tma::BK;
using gemm_tma::BM;
using gemm_tma::BN;
using gemm_tma::SMEM_BYTES;
using gemm_tma::THREADS;

#if SF_WGMMA_ENABLED
/* Consumer c's 64 x 256 tile added into x at (row0, col0): chunk q holds columns 32 q .. 32 q +
 * 31 (accumulator blocks j = 4 q .. 4 q + 3), each row 128 bytes of float32 in 16-byte chunks
 * swizzled by the row (rows are 8-aligned, so row % 8 = g). The staging box a chunk reuses was
 * last read by the reduction two chunks back (wait_group.read 1). */
__device__ __forceinline__ void add_tile(const float *acc, uint32_t out, const CUtensorMap *map_x, int row0, int col0,
                                         int c, int warp, int g, int t, bool leader)
{
#pragma unroll
    for (int q = 0; q < BN / 32; q++) {
        const uint32_t box = out + (q & 1) * gemm_tma::OUT_BOX_BYTES;
        if (leader) tma_store_wait_read<1>();
        named_sync(1 + c, 128);
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int k = 4 * (4 * q + jj) + 2 * hr, row = 16 * warp + g + 8 * hr;
                const uint32_t at = box + row * 128 + (((2 * jj + (t >> 1)) ^ g) << 4) + 8 * (t & 1);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(at), "f"(acc[k]), "f"(acc[k + 1]) : "memory");
            }
        fence_proxy_async(); /* the staging box, written by st.shared, is read by the copy engine */
        named_sync(1 + c, 128);
        if (leader) {
            tma_reduce_add_2d(map_x, col0 + 32 * q, row0, box);
            tma_store_commit();
        }
    }
}
#endif

__global__ void __launch_bounds__(THREADS, 1)
residual_product_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                        const __grid_constant__ CUtensorMap map_x, int n, int in, int out)
{
#if SF_WGMMA_ENABLED
    extern __shared__ unsigned char smem_raw[];
    if (threadIdx.x == 0) tma_prefetch_map(&map_x);
    const gemm_tma::b_source b = {&map_w, &map_w, 0, 128};
    auto epilogue = [&](const float *acc, uint32_t staging, int row0, int col0, int c) {
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
        add_tile(acc, staging, &map_x, row0, col0, c, warp, lane >> 2, lane & 3, threadIdx.x % 128 == 0);
    };
    gemm_tma::run_cooperative<1>(smem_raw, &map_a, b, gemm_tma::walk_of(n, out, BN, 1), (in + BK - 1) / BK, epilogue);
#endif
}

} // namespace

int sf_lab_residual_product_usable(int in, int out)
{
    if (in <= 0 || out <= 0 || in % 8 || out % 8) return 0;
    static int known[64]; /* per device, sf_cuda_hopper_known */
    return sf_cuda_hopper_known(known, (const void *)residual_product_kernel, SMEM_BYTES);
}

int sf_lab_residual_product(int n, int in, int out, const __nv_bfloat16 *a, const __nv_bfloat16 *w, float *x,
                             cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    const int sms = sf_lab_residual_product_usable(in, out);
    if (!sms) return sf_error(SF_E_UNSUPPORTED, "residual_product: in %d, out %d or this device", in, out);
    CUtensorMap map_a, map_w, map_x;
    int rc = sf_cuda_tensor_map_bf16_sw128(&map_a, a, n, in, in, BM);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&map_w, w, out, in, in, 128);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_f32_sw128(&map_x, x, n, out, out, 64);
    if (rc != SF_OK) return rc;
    const long long tiles = (long long)((n + BM - 1) / BM) * ((out + BN - 1) / BN);
    const unsigned grid = (unsigned)(tiles < sms ? tiles : sms);
    sf_cuda_launch_early(residual_product_kernel, dim3(grid), dim3(THREADS), SMEM_BYTES, stream, map_a, map_w, map_x, n,
                         in, out);
    return sf_cuda_launched("residual_product");
}
