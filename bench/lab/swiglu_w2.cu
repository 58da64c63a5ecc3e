/* The MLP's output product with SwiGLU folded into its operand load (Hopper, wgmma):
 *
 *   x[n, dim] += (silu(h[:, :F]) * h[:, F:]) W2^T,   h = W1 u | W3 u  ([n, 2F] bf16),  W2 [dim, F] bf16
 *
 * cuBLAS has no such prologue, so the composed path writes silu(a) * b as its own [n, F] bf16
 * pass (swiglu_rows_bf16, ~8% of the reference model's time, bandwidth-bound) and reads it back
 * in the product. Here each block stages 64-wide K slices of the two halves of h and of W2 in
 * shared memory (cp.async, three stages), every warp turns its gate and up fragments (ldmatrix)
 * into the product's A fragments in registers, and wgmma (A from registers, W2 as a K-major
 * 128-byte-swizzled operand) accumulates a 128 x 256 tile in float32, added to x at the end.
 * silu(a) * b is computed in float32 (fast exponential and division) and rounded to bf16. Lab: it ran
 * 1.7x slower than the SwiGLU pass and cuBLAS together (bench/RESULTS.md). CPU twin: the
 * CPU backend's swiglu then matmul (tests/test_backend_ops.c, ffn). Built for sm_90a only. */
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_early.cuh"
#include "bench/lab/lab_kernels.h"

namespace {

constexpr int BM = 128, BN = 256, BK = 64, STAGES = 3, THREADS = 256;
constexpr int B_BYTES = BN * BK * 2;    /* W2 slice, swizzled rows of 128 bytes */
constexpr int H_PITCH = (BK + 8) * 2;   /* gate/up rows padded: ldmatrix without bank conflicts */
constexpr int H_BYTES = BM * H_PITCH;   /* one half of h's slice */
constexpr int STAGE_BYTES = B_BYTES + 2 * H_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + 1024; /* + alignment of the swizzled tiles */
static_assert(STAGE_BYTES % 1024 == 0, "each stage's W2 slice starts 1024-byte aligned");

#if SF_WGMMA_ENABLED
/* silu(a) * b with the fast exponential and division: each block recomputes its rows' SwiGLU
 * for every 256 columns of x, so its cost counts 4 times at dim = 1024 (run 14, call 9: with
 * expf and a full division, ~110 us a layer of issue slots alone) */
__device__ __forceinline__ float silu_mul(float a, float b) { return __fdividef(a, 1.0f + __expf(-a)) * b; }

/* Stage kt's slices: W2 rows [j0, j0 + 256) x K [k0, k0 + 64) swizzled; gate and up rows
 * [m0, m0 + 128) of the same K, zeros past row n. */
__device__ __forceinline__ void issue_stage(unsigned char *stage, const __nv_bfloat16 *h, const __nv_bfloat16 *w2,
                                            int n, int f, int m0, int j0, int k0)
{
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(stage);
#pragma unroll
    for (int u = 0; u < BN * 8 / THREADS; u++) {
        const int c = threadIdx.x + u * THREADS, row = c / 8, chunk = c % 8;
        const __nv_bfloat16 *src = w2 + (size_t)(j0 + row) * f + k0 + chunk * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(b + sw128_offset(row, chunk)), "l"(src)
                     : "memory");
    }
    unsigned char *gate = stage + B_BYTES, *up = gate + H_BYTES;
#pragma unroll
    for (int u = 0; u < BM * 8 / THREADS; u++) {
        const int c = threadIdx.x + u * THREADS, row = c / 8, chunk = c % 8, m = m0 + row;
        const int inside = m < n;
        const __nv_bfloat16 *src = h + (size_t)(inside ? m : 0) * 2 * f + k0 + chunk * 8;
        cp_async16(gate + row * H_PITCH + chunk * 16, src, inside ? 16 : 0);
        cp_async16(up + row * H_PITCH + chunk * 16, src + f, inside ? 16 : 0);
    }
}
#endif

#if SF_WGMMA_ENABLED
/* Stage kt's gate and up fragments of this warp into A fragments (bf16 silu(g) * u). */
__device__ __forceinline__ void transform(uint32_t (*a)[4], const unsigned char *stage, int frag_row, int frag_col)
{
    const unsigned char *gate = stage + B_BYTES, *up = gate + H_BYTES;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ks++) {
        uint32_t g[4], u[4];
        ldsm_x4(g, gate + frag_row * H_PITCH + (ks * 16 + frag_col) * 2);
        ldsm_x4(u, up + frag_row * H_PITCH + (ks * 16 + frag_col) * 2);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 gf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&g[i]));
            const float2 uf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u[i]));
            a[ks][i] = pack_bf16x2(silu_mul(gf.x, uf.x), silu_mul(gf.y, uf.y));
        }
    }
}

/* K step kt: its A fragments into a, its products issued (left running), then, once step
 * kt - 1's products are done in every warpgroup, step kt + 2's slices loaded into the stage
 * kt - 1 used. The transform of step kt thus runs under the products of step kt - 1. */
__device__ __forceinline__ void k_step(int kt, int kt_count, uint32_t (*a)[4], uint32_t (*a_prev)[4], float (*acc)[64],
                                       unsigned char *smem,
                                       const __nv_bfloat16 *h, const __nv_bfloat16 *w2, int n, int f, int m0, int j0,
                                       int frag_row, int frag_col)
{
    cp_async_wait<1>();
    fence_proxy_async(); /* W2's slice, written by cp.async, is read by the tensor cores */
    __syncthreads();
    unsigned char *stage = smem + (kt % STAGES) * STAGE_BYTES;
    transform(a, stage, frag_row, frag_col);
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(stage);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BK / 16; ks++) {
        wgmma_m64n128k16_rs<0>(acc[0], a[ks], sw128_desc(b + ks * 32, 16, 1024), 1);
        wgmma_m64n128k16_rs<0>(acc[1], a[ks], sw128_desc(b + 128 * 128 + ks * 32, 16, 1024), 1);
    }
    wgmma_commit();
    wgmma_wait<1>(); /* step kt - 1's products: its A registers and its stage are free */
    /* the products read A from registers after issue: a_prev (step kt - 1's) must hold its
     * values up to this wait, a (this step's) up to the next one */
#pragma unroll
    for (int i = 0; i < BK / 16; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a_prev[i][j]), "+r"(a[i][j])::"memory");
    __syncthreads();
    if (kt + 2 < kt_count) issue_stage(smem + ((kt + 2) % STAGES) * STAGE_BYTES, h, w2, n, f, m0, j0, (kt + 2) * BK);
    cp_async_commit();
}
#endif

/* One block: rows [128 bx, +128) of x, columns [256 by, +256); warpgroup wg has rows 64 wg.. */
__global__ void __launch_bounds__(THREADS, 1)
swiglu_w2_kernel(int n, int dim, int f, const __nv_bfloat16 *__restrict__ h, const __nv_bfloat16 *__restrict__ w2,
                 float *__restrict__ x)
{
#if SF_WGMMA_ENABLED
    sf_wait_prior_grid();
    extern __shared__ unsigned char smem_raw[];
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int m0 = blockIdx.x * BM, j0 = blockIdx.y * BN, kt_count = f / BK;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x & 31;
    float acc[2][64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[0][i] = acc[1][i] = 0.0f;
    issue_stage(smem, h, w2, n, f, m0, j0, 0);
    cp_async_commit();
    if (kt_count > 1) issue_stage(smem + STAGE_BYTES, h, w2, n, f, m0, j0, BK);
    cp_async_commit();
    /* this lane's ldmatrix row and column within a 16 x 16 fragment of its warp's 16 rows */
    const int frag_row = wg * 64 + warp * 16 + (lane & 15), frag_col = (lane >> 4) * 8;
    /* two sets of A fragments, alternating, with static indices (kt_count is even) */
    uint32_t a0[BK / 16][4], a1[BK / 16][4];
    for (int kt = 0; kt < kt_count; kt += 2) {
        k_step(kt, kt_count, a0, a1, acc, smem, h, w2, n, f, m0, j0, frag_row, frag_col);
        k_step(kt + 1, kt_count, a1, a0, acc, smem, h, w2, n, f, m0, j0, frag_row, frag_col);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BK / 16; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(a1[i][j])::"memory");
    reg_fence<64>(acc[0]);
    reg_fence<64>(acc[1]);
    /* accumulator (half, 4 j + 2 hr + e): row g + 8 hr of the warp's 16, column 128 half + 8 j + 2 t + e */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int m = m0 + wg * 64 + warp * 16 + g + 8 * hr;
        if (m >= n) continue;
        float *row = x + (size_t)m * dim + j0 + 2 * t;
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                float2 *p = reinterpret_cast<float2 *>(row + half * 128 + 8 * j);
                float2 v = *p;
                v.x += acc[half][4 * j + 2 * hr], v.y += acc[half][4 * j + 2 * hr + 1];
                *p = v;
            }
    }
#endif
}

} // namespace

int sf_lab_swiglu_w2_usable(int dim, int hidden)
{
    if (dim <= 0 || hidden <= 0 || dim % BN || hidden % (2 * BK)) return 0;
    static int known[64]; /* per device, sf_cuda_hopper_known */
    return sf_cuda_hopper_known(known, (const void *)swiglu_w2_kernel, SMEM_BYTES) > 0;
}

int sf_lab_swiglu_w2(int n, int dim, int hidden, const __nv_bfloat16 *h, const __nv_bfloat16 *w2, float *x,
                      cudaStream_t stream)
{
    if (n <= 0) return SF_OK;
    if (!sf_lab_swiglu_w2_usable(dim, hidden))
        return sf_error(SF_E_UNSUPPORTED, "swiglu_w2: dim %d, hidden %d or this device", dim, hidden);
    dim3 grid((unsigned)((n + BM - 1) / BM), (unsigned)(dim / BN));
    sf_cuda_launch_early(swiglu_w2_kernel, grid, THREADS, SMEM_BYTES, stream, n, dim, hidden, h, w2, x);
    return sf_cuda_launched("swiglu_w2");
}
