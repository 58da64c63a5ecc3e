/* The tile pieces of the Hopper wgmma attention kernel (attention_wgmma.cu) and of the lab's
 * wgmma variants (bench/lab/attention/): the keys of a tile, S = Q K^T and O += P V on swizzled
 * shared-memory tiles, and the two halves of the online softmax (RESCALE false and SUM false serve
 * the lab's FlashAttention-3 order and lean softmax). sm_90a device code only under
 * SF_WGMMA_ENABLED. C++ (CUDA) only.
 *
 * Head width D = 64 or 128. A 128-byte swizzle row holds 64 bf16, so a tile of rows of D values
 * is stored as D/64 column blocks one after the other: block b (columns 64b .. 64b + 63) of a
 * tile of R rows starts R * 128 bytes after block b - 1, each laid out as a d = 64 tile. The
 * accumulator of O then holds column block b in acc[32b .. 32b + 31], which is the d = 64 layout
 * continued: acc[4j + 2h + e] is column 8j + 2t + e for every j < D/8. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_WGMMA_TILE_CUH
#define SEQFLOW_KERNELS_CUDA_ATTENTION_WGMMA_TILE_CUH

#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"

#define WG_D 64 /* the lab's head width, and a column block: one 128-byte swizzle row */

/* One tile's keys, as kv_src of attention_staged.cuh: dilated key x is row x of k/v (already
 * offset to the head and row o, `stride` bf16 apart); a key is masked for a query unless both
 * sit in the same window of `win` dilated rows and (causal) key <= query. */
struct wg_src {
    const __nv_bfloat16 *k, *v;
    size_t stride;
    int kbeg, kend, win, causal;
};

/* The keys of branch rows g of head h, where `st` keeps them (rows g.r apart); the caller sets
 * the key range of each query tile (att_key_range). */
__device__ __forceinline__ wg_src wg_branch_src(const att_staged &st, int h, const att_branch_rows &g, int causal)
{
    wg_src src;
    src.k = st.kb + (size_t)h * st.khead + (size_t)g.o * st.krow;
    src.v = st.vb + (size_t)h * st.khead + (size_t)g.o * st.krow;
    src.stride = (size_t)g.r * st.krow;
    src.win = g.win;
    src.causal = causal;
    src.kbeg = src.kend = 0;
    return src;
}

/* Head h's n_global global tokens (staged head-major, rows of D): every query sees all of them. */
template <int D = WG_D> __device__ __forceinline__ wg_src wg_global_src(const att_staged &st, int h, int n_global)
{
    wg_src src;
    src.k = st.gkb + (size_t)h * n_global * D;
    src.v = st.gvb + (size_t)h * n_global * D;
    src.stride = D;
    src.kbeg = 0, src.kend = n_global, src.win = 1 << 30, src.causal = 0;
    return src;
}

#if SF_WGMMA_ENABLED
__device__ __forceinline__ void cp_async16_sh(uint32_t saddr, const void *gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(gmem), "r"(src_bytes) : "memory");
}

/* S[64 x BN] = Q K^T: Q from registers (QS false: qf[D / 16]) or from the swizzled Q tile at shared
 * address qaddr (QS true), K K-major (a k16 step is 32 bytes along the row, four steps a column
 * block; the Q tile's blocks are 64 rows apart, the key tile's BN). */
template <int BN, bool QS, int D = WG_D>
__device__ __forceinline__ void wg_qk(float *s, const uint32_t (*qf)[4], uint32_t qaddr, uint32_t kaddr)
{
    /* each k16 step's descriptors are the tiles' plus the step's offset / 16 (sw128_desc_at):
     * built once, not masked and shifted again for every product */
    const uint64_t kdesc = sw128_desc(kaddr, 16, 1024);
    const uint64_t qdesc0 = QS ? sw128_desc(qaddr, 16, 1024) : 0;
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        const uint64_t desc = sw128_desc_at(kdesc, (kc / 4) * BN * 128 + (kc % 4) * 32);
        if constexpr (QS) {
            const uint64_t qdesc = sw128_desc_at(qdesc0, (kc / 4) * 64 * 128 + (kc % 4) * 32);
            if constexpr (BN == 64)
                wgmma_m64n64k16_ss<0>(s, qdesc, desc, kc > 0);
            else
                wgmma_m64n128k16_ss<0>(s, qdesc, desc, kc > 0);
        } else {
            if constexpr (BN == 64)
                wgmma_m64n64k16_rs<0>(s, qf[kc], desc, kc > 0);
            else
                wgmma_m64n128k16_rs<0>(s, qf[kc], desc, kc > 0);
        }
    }
}

/* O[64 x D] += P V: P from registers, V MN-major (a k16 step is 16 key rows = 2048 bytes), one
 * 64-wide product a column block of V (blocks BN * 128 bytes apart) into its 32 accumulators. */
template <int BN, int D = WG_D>
__device__ __forceinline__ void wg_pv(float *acc, const uint32_t (*pa)[4], uint32_t vaddr)
{
    const uint64_t vdesc = sw128_desc(vaddr, 16, 1024);
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++)
#pragma unroll
        for (int b = 0; b < D / 64; b++)
            wgmma_m64n64k16_rs<1>(acc + 32 * b, pa[kc], sw128_desc_at(vdesc, b * BN * 128 + kc * 2048), 1);
}

/* S = Q K^T, issued and waited for: s is readable on return */
template <int BN, bool QS, int D = WG_D>
__device__ __forceinline__ void wg_qk_wait(float *s, const uint32_t (*qf)[4], uint32_t qaddr, uint32_t kaddr)
{
    wgmma_fence();
    wg_qk<BN, QS, D>(s, qf, qaddr, kaddr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<BN / 2>(s);
}

/* acc += P V, issued and waited for: this tile's products are done (and acc readable) on return */
template <int BN, int D = WG_D>
__device__ __forceinline__ void wg_pv_wait(float *acc, const uint32_t (*pa)[4], uint32_t vaddr)
{
    wgmma_fence();
    wg_pv<BN, D>(acc, pa, vaddr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<D / 2>(acc);
}

/* Masks S: row wrow + 8h keeps keys [klo, khi), its window cut at the
 * end of the keys and (causal) at the row. s[4j + 2h + e]: row wrow + 8h, key k0 + 8j + 2t + e. */
template <int BN>
__device__ __forceinline__ void wg_mask_tile(float *s, int k0, const wg_src &src, int wrow)
{
    const int t = threadIdx.x & 3;
    int klo[2], khi[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int x = wrow + 8 * hr;
        klo[hr] = x / src.win * src.win;
        khi[hr] = min(klo[hr] + src.win, src.kend);
        if (src.causal) khi[hr] = min(khi[hr], x + 1);
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + j * 8 + 2 * t + (e & 1);
            if (key < klo[e >> 1] || key >= khi[e >> 1]) s[4 * j + e] = -INFINITY;
        }
}

/* The softmax of one S tile, in two halves so that the next tile's S = Q K^T can be issued
 * between them (after the first half has rescaled O, which the tensor cores must not see
 * change while products are in flight). s[4j + 2h + e] is row wrow + 8h, key k0 + 8j + 2t + e
 * (the wgmma accumulator layout). First half: masks S when the tile needs it, updates the
 * running max of this thread's two rows (wrow, wrow + 8), rescales O and the running sums;
 * leaves in base[] what the second half subtracts. */
/* The max of S over row wrow + 8hr of the tile (the row's 4 lanes, a quad, hold BN/4 keys each). */
template <int BN>
__device__ __forceinline__ float wg_row_max(const float *s, int hr)
{
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

template <int BN, bool RESCALE = true, int D = WG_D>
__device__ __forceinline__ void wg_softmax_max(float *s, int k0, const wg_src &src, int wrow, bool need_mask, float c,
                                               float *mrow, float *lrow, float *acc, float *base,
                                               float *corr_out = nullptr)
{
    if (need_mask) wg_mask_tile<BN>(s, k0, src, wrow);
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const float mx = wg_row_max<BN>(s, hr);
        const float mnew = fmaxf(mrow[hr], mx * c);
        base[hr] = mnew == -INFINITY ? 0.0f : mnew;
        const float corr = fast_exp2(mrow[hr] - base[hr]);
        mrow[hr] = mnew;
        lrow[hr] *= corr;
        if constexpr (!RESCALE) { /* the caller rescales O once the products still adding to it are done */
            corr_out[hr] = corr;
        } else {
#pragma unroll
            for (int j = 0; j < D / 8; j++) acc[4 * j + 2 * hr] *= corr, acc[4 * j + 2 * hr + 1] *= corr;
        }
    }
}

/* Second half: P = exp2(S c - base), the running sums (SUM; the lean softmax's tensor-core row
 * sums leave them out), and P packed as the A fragments of P V.
 * P goes to fresh registers, not over S: writing into a wgmma accumulator's registers while the
 * other S set is in flight makes ptxas serialize the wgmmas (warning C7515). */
template <int BN, bool SUM = true>
__device__ __forceinline__ void wg_softmax_exp(const float *s, float c, const float *base, float *lrow, uint32_t (*pa)[4])
{
    float p[BN / 2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        float sum = 0;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            p[4 * j + 2 * hr] = fast_exp2(fmaf(s[4 * j + 2 * hr], c, -base[hr]));
            p[4 * j + 2 * hr + 1] = fast_exp2(fmaf(s[4 * j + 2 * hr + 1], c, -base[hr]));
            if constexpr (SUM) sum += p[4 * j + 2 * hr] + p[4 * j + 2 * hr + 1];
        }
        if constexpr (SUM) lrow[hr] += sum;
    }
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) {
        pa[kc][0] = pack_bf16x2(p[8 * kc + 0], p[8 * kc + 1]);
        pa[kc][1] = pack_bf16x2(p[8 * kc + 2], p[8 * kc + 3]);
        pa[kc][2] = pack_bf16x2(p[8 * kc + 4], p[8 * kc + 5]);
        pa[kc][3] = pack_bf16x2(p[8 * kc + 6], p[8 * kc + 7]);
    }
}
/* Row wrow + 8 hr of a finished tile's O made NaN where bit hr of `poison` says the row sees a
 * key whose V is not finite (attention_mma.cuh): in the merge, the output and the mix alike. */
template <int D = WG_D> __device__ __forceinline__ void wg_poison_row(float *acc, unsigned poison, int hr)
{
    if (poison >> hr & 1)
#pragma unroll
        for (int j = 0; j < D / 8; j++) acc[4 * j + 2 * hr] = acc[4 * j + 2 * hr + 1] = NAN;
}

/* 16-byte copy global -> shared, or 16 zero bytes without reading the source when `skip`. */
__device__ __forceinline__ void cp_async16_zfill(uint32_t saddr, const void *gmem, bool skip)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
                 "cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(saddr), "l"(gmem), "r"((int)skip)
                 : "memory");
}

#endif /* SF_WGMMA_ENABLED */

#endif
