/* The lab's variants of the convert kernel (kernels/cuda/attention_convert.cuh: K/V converted to
 * bf16 in the inner loop, no workspace), 0-3, and every variant's name. 0 is a plain float32
 * kernel (a warp a row, no tensor cores), the tensor-core kernels' first twin; 1 is the
 * product's shape (sf_cuda_attention_convert); 2 and 3 change the block's rows and key tile.
 * bench/lab/ATTENTION_NOTES.md says what each measured. */
#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "bench/lab/attention/attention_lab.cuh"
#include "bench/lab/attention/attention_variants.h"
#include "kernels/cuda/attention_convert.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

/* ---- variant 0: one warp per (position, head), float32, no tensor cores (the check's twin) */
template <int D>
__global__ void attention_simple(sf_attention_desc dd, att_branches br, const float *q, const float *k,
                                 const float *v, float *out)
{
    const int lane = threadIdx.x & 31;
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, h = blockIdx.y;
    if (i >= dd.n) return;
    constexpr int E = D / 32;
    float qi[E], acc[E];
    for (int e = 0; e < E; e++) qi[e] = q[(size_t)i * dd.ld + h * D + lane + 32 * e], acc[e] = 0;
    float m = -INFINITY, l = 0;
    auto attend = [&](const float *kr, const float *vr) {
        float s = 0;
        for (int e = 0; e < E; e++) s += qi[e] * kr[lane + 32 * e];
        for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= dd.scale;
        float mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
        for (int e = 0; e < E; e++) acc[e] = acc[e] * c + p * vr[lane + 32 * e];
        l = l * c + p;
        m = mn;
    };
    for (int b = 0; b < br.count; b++) {
        const int w = br.window[b], r = br.dilation[b], o = h % r;
        if (i % r != o) continue;
        const int start = i / w * w;
        int end = dd.causal ? i + 1 : start + w;
        if (end > dd.n) end = dd.n;
        for (int j = start + o; j < end; j += r)
            attend(k + (size_t)j * dd.ld + h * D, v + (size_t)j * dd.ld + h * D);
    }
    for (int j = 0; j < dd.n_global; j++)
        attend(dd.gk + (size_t)j * dd.global_ld + h * D, dd.gv + (size_t)j * dd.global_ld + h * D);
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    for (int e = 0; e < E; e++) out[(size_t)i * dd.ld + h * D + lane + 32 * e] = acc[e] * inv;
}

/* ---- host side -------------------------------------------------------------------------- */

template <int D>
static int launch_variant(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                          const float *k, const float *v, float *out, cudaStream_t stream)
{
    constexpr int BN_WIDE = D >= 128 ? 32 : 64;
    switch (variant) {
    case 0: {
        dim3 grid((desc->n + 3) / 4, desc->heads);
        attention_simple<D><<<grid, 128, 0, stream>>>(*desc, br, q, k, v, out);
        return SF_OK;
    }
    case 2: return launch_fused<D, 8, BN_WIDE>(desc, br, q, k, v, out, stream);
    case 3: return launch_fused<D, 4, 32>(desc, br, q, k, v, out, stream);
    default: return sf_error(SF_E_INVAL, "cuda attention: no variant %d", variant);
    }
}

extern "C" const char *sf_lab_attention_variant_name(int variant)
{
    switch (variant) {
    case 0: return "simple-f32 (warp per row)";
    case 1: return "fused mma 4 warps, 64 rows, 64 keys";
    case 2: return "fused mma 8 warps, 128 rows, 64 keys";
    case 3: return "fused mma 4 warps, 64 rows, 32 keys";
    case 4: return "staged bf16 K/V, cp.async x2, 4 warps, 128 regs";
    case 5: return "staged bf16 K/V, cp.async x3, 4 warps, 128 regs";
    case 6: return "staged bf16 K/V, cp.async x2, 4 warps, 168 regs";
    case 7: return "staged, 2 warps x 32 rows, 64 keys";
    case 8: return "staged, 4 warps x 32 rows, 64 keys";
    case 9: return "wgmma 64 rows, 64 keys x2, Q in smem, 4 blk/SM";
    case 10: return "wgmma 64 rows, 128 keys x2, Q in regs, 3 blk/SM";
    case 11: return "wgmma 64 keys x3, next S under softmax, 3 blk";
    case 12: return "wgmma 64 rows, 64 keys x2, Q in smem, 3 blk/SM";
    case 13: return "as 11, Q in smem";
    case 14: return "wgmma 2 warpgroups x 64 rows share K/V, x2";
    case 15: return "as 12, 64 keys x3";
    case 16: return "as 15, heavy+light block pairs a CTA";
    case 17: return "as 9, heavy+light block pairs a CTA";
    case 18: return "as 15, streaming (evict-first) f32 traffic";
    case 19: return "as 12, streaming (evict-first) f32 traffic";
    case 20: return "warp-specialized: producer warp, 2 WG x 64 rows, 64 keys x4";
    case 21: return "as 20, next S under softmax";
    case 22: return "as 20, 128 keys x3";
    case 23: return "as 21, producer warpgroup, setmaxnreg 232";
    case 24: return "as 22, 3 WG x 64 rows, setmaxnreg 160/24";
    case 25: return "as 20, 3 WG x 64 rows, setmaxnreg 160/24";
    case 26: return "as 20, FA3 order (softmax under previous P V)";
    case 27: return "as 22, FA3 order, setmaxnreg 232";
    case 28: return "as 25, FA3 order";
    case 29: return "as 18, FA3 order, 64 keys x4, 2 blk/SM";
    case 30: return "as 18, FA3 order, 64 keys x3, 3 blk/SM";
    case 31: return "as 18, lazy O rescale (max +8 before it moves)";
    case 32: return "as 31, row sums on the tensor cores";
    case 33: return "as 32, ex2.bf16x2 (two exps an instruction)";
    case 34: return "as 33 without the lazy rescale";
    case 35: return "as 33, 64 keys x2, 4 blk/SM (128 regs)";
    case 36: return "as 18, next copies issued under Q K^T";
    case 37: return "as 18, next copies issued under P V";
    case 38: return "as 36 with the lazy rescale of 31";
    case 39: return "as 36, copies and Q loads run ahead across query tiles";
    case 40: return "as 39, 64 keys x4";
    case 41: return "as 39, Q loaded after the merge";
    case 42: return "as 39, copies only within a query tile";
    case 43: return "as 36 alongside its pre-pass, waits per branch";
    case 44: return "as 36 alongside its pre-pass, waits for all first";
    case 45: return "128 keys x2, Q in smem, 3 blk/SM";
    case 46: return "as 36, P V waited with the next S";
    case 47: return "as 46, 64 keys x4";
    case 48: return "as 36, out and next q rows into L2";
    case 49: return "as 46 and 48";
    case 50: return "as 45 and 48";
    default: return NULL;
    }
}

int lab_attention_fused(int variant, const sf_attention_desc *desc, const float *q, const float *k, const float *v,
                        float *out, cudaStream_t stream)
{
    if (desc->qkv_type != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: variant %d reads float32 q/k/v only", variant);
    if (variant == SF_LAB_ATTENTION_CONVERT) return sf_cuda_attention_convert(desc, q, k, v, out, stream);
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_fill_branches(desc, &br);
    if (rc) return rc;
    if (desc->n_global > 0 && (!desc->gk || !desc->gv))
        return sf_error(SF_E_INVAL, "cuda attention: %d global tokens but no gk/gv", desc->n_global);
    switch (desc->head_dim) {
    case 32: rc = launch_variant<32>(variant, desc, br, q, k, v, out, stream); break;
    case 64: rc = launch_variant<64>(variant, desc, br, q, k, v, out, stream); break;
    case 128: rc = launch_variant<128>(variant, desc, br, q, k, v, out, stream); break;
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)",
                        desc->head_dim);
    }
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
