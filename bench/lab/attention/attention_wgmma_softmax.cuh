/* A leaner online softmax for the plain wgmma loop (the lab's variants 31+), built from three
 * independent options (bench/lab/ATTENTION_NOTES.md says what each measured):
 *
 * SM_LAZY: the running max of a row moves only when a tile's max exceeds it by more than
 * SM_LAZY_THRESH (log2 units), and the warp rescales O and the sums only when one of its rows
 * moved (warp vote). After the first tile or two of a window the max rarely grows by that much,
 * so the 32 multiplies a thread of the O rescale (and its exp2) mostly go. Exact apart from
 * range: P is then at most 2^SM_LAZY_THRESH, which bf16 P and the float32 sums hold with the
 * same relative precision as values up to 1 (FlashAttention-4's conditional rescaling).
 *
 * SM_TCSUM: the row sums l come from the tensor cores, P times a tile of ones (one extra
 * m64n8k16 product a k-step, 1/8 of P V's work) accumulated across tiles like O, instead of 32
 * float32 adds a thread a tile. The denominator then sums the same bf16-rounded P as the
 * numerator. Each thread of a quad holds its rows' whole sums.
 *
 * SM_EXPBF16: two exps an instruction (ex2.approx.ftz.bf16x2): the argument S c - base is formed
 * in float32 by one FFMA, rounded to bf16, and the result is already P's bf16 A-fragment, so the
 * pack moves before the exp and the MUFU work halves. The argument's rounding adds a relative
 * error of at most ln2 |x| 2^-9 an element; a numpy model of the reference's logits put the
 * output's relative error at 4.1e-3 against 3.5e-3 for float32 exps (bf16 Q/K dominate). Only
 * with SM_TCSUM: the float32 P needed for the sums no longer exists. On sm_90 ptxas 13.0 lowers
 * the bf16x2 form to two MUFU.EX2.BF16 (one a half) plus repacking, so nothing is saved there.
 *
 * Measured (bench/lab/ATTENTION_NOTES.md, variants 31-35): none beat the staged kernels' softmax;
 * the loop is latency-bound, not issue-bound.
 *
 * sm_90a device code only under SF_WGMMA_ENABLED. C++ (CUDA) only. */
#ifndef SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_SOFTMAX_CUH
#define SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_SOFTMAX_CUH

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention_wgmma_tile.cuh"

enum { SM_LAZY = 1, SM_TCSUM = 2, SM_EXPBF16 = 4 };
/* 8: P up to 256, FlashAttention-4's choice; float32 O and l have ample range for it */
#define SM_LAZY_THRESH 8.0f
/* bytes of the ones tile (bf16 1.0) that the row-sum product reads as its B operand: one
 * 1024-byte swizzle atom is all an n8 operand addresses; the second is slack */
#define SM_ONES_BYTES 2048

#if SF_WGMMA_ENABLED
/* D[64 x 8] += A[64 x 16] (registers) * B[16 x 8] (shared, K-major descriptor). */
__device__ __forceinline__ void wgmma_m64n8k16_rs_acc(float *d, const uint32_t *a, uint64_t desc_b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

/* lsum[2h + e] += the sum over this tile's keys of P's row 16 warp + g + 8h (every column e of
 * the n8 result is the same sum). Issue inside the commit group of P V. */
template <int BN>
__device__ __forceinline__ void wg_rowsum(float *lsum, const uint32_t (*pa)[4], uint32_t ones)
{
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) wgmma_m64n8k16_rs_acc(lsum, pa[kc], sw128_desc(ones + (kc & 3) * 32, 16, 1024));
}

/* The ones tile: every thread of the block calls it once; a barrier and the first tile's proxy
 * fence publish it to the tensor cores. */
__device__ __forceinline__ void wg_fill_ones(uint32_t ones, int nthreads)
{
    for (int i = threadIdx.x; i < SM_ONES_BYTES / 16; i += nthreads)
        asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(ones + i * 16), "r"(0x3F803F80u) : "memory");
    fence_proxy_async();
}

__device__ __forceinline__ uint32_t ex2_bf16x2(uint32_t x)
{
    uint32_t y;
    asm("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* One tile's softmax: S (scores, unscaled) -> P as P V's A fragments pa; updates the running
 * max mrow of this thread's rows (the base O and the sums are relative to), the sums lsum
 * (lsum[h] of this thread's columns, or with SM_TCSUM the n8 accumulator lsum[2h + e], which
 * the row-sum product adds to) and O. Every thread of the warp calls it (it votes). */
template <int BN, int FLAGS>
__device__ __forceinline__ void wg_softmax_lean(float *s, int k0, const wg_src &src, int wrow, bool need_mask, float c,
                                                float *mrow, float *lsum, float *acc, uint32_t (*pa)[4])
{
    static_assert(!(FLAGS & SM_EXPBF16) || (FLAGS & SM_TCSUM), "bf16 exps leave no float32 P to sum");
    constexpr bool TCSUM = (FLAGS & SM_TCSUM) != 0;
    if (need_mask) wg_mask_tile<BN>(s, k0, src, wrow);
    float mnew[2];
    bool grow = false;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float mx = wg_row_max<BN>(s, hr);
        mnew[hr] = fmaxf(mrow[hr], mx * c);
        /* -inf + thresh stays -inf: a row's first live key always moves it */
        grow |= (FLAGS & SM_LAZY) ? mnew[hr] > mrow[hr] + SM_LAZY_THRESH : mnew[hr] > mrow[hr];
    }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float corr = fast_exp2(mrow[hr] - (mnew[hr] == -INFINITY ? 0.0f : mnew[hr]));
            mrow[hr] = mnew[hr];
            if constexpr (TCSUM)
                lsum[2 * hr] *= corr, lsum[2 * hr + 1] *= corr;
            else
                lsum[hr] *= corr;
#pragma unroll
            for (int j = 0; j < WG_D / 8; j++) acc[4 * j + 2 * hr] *= corr, acc[4 * j + 2 * hr + 1] *= corr;
        }
    }
    const float base[2] = {mrow[0] == -INFINITY ? 0.0f : mrow[0], mrow[1] == -INFINITY ? 0.0f : mrow[1]};
    if constexpr ((FLAGS & SM_EXPBF16) != 0) {
        /* pa[kc][i] holds keys 16kc + 8(i >> 1) + 2t, +1 of row wrow + 8(i & 1) */
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float b = base[i & 1];
                pa[kc][i] = ex2_bf16x2(pack_bf16x2(fmaf(s[8 * kc + 2 * i], c, -b), fmaf(s[8 * kc + 2 * i + 1], c, -b)));
            }
    } else {
        wg_softmax_exp<BN, !TCSUM>(s, c, base, lsum, pa);
    }
}
#endif /* SF_WGMMA_ENABLED */

#endif
