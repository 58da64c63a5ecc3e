/* The tile pieces shared by the Hopper wgmma attention kernels (attention_wgmma.cu: one
 * warpgroup a block, variants 9-19; attention_wgmma_ws.cu: warp-specialized, 20+): the keys of a
 * tile, S = Q K^T and O += P V on swizzled shared-memory tiles, and the two halves of the online
 * softmax. sm_90a device code only under SF_WGMMA_ENABLED. C++ (CUDA) only. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_WGMMA_TILE_CUH
#define SEQFLOW_KERNELS_CUDA_ATTENTION_WGMMA_TILE_CUH

#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"

#define WG_D 64 /* head width: one 128-byte swizzle row a key */

/* One tile's keys, as kv_src of attention_bf16_ws.cu: dilated key x is row x of k/v (already
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

/* Head h's n_global global tokens (staged head-major): every query sees all of them. */
__device__ __forceinline__ wg_src wg_global_src(const att_staged &st, int h, int n_global)
{
    wg_src src;
    src.k = st.gkb + (size_t)h * n_global * WG_D;
    src.v = st.gvb + (size_t)h * n_global * WG_D;
    src.stride = WG_D;
    src.kbeg = 0, src.kend = n_global, src.win = 1 << 30, src.causal = 0;
    return src;
}

#if SF_WGMMA_ENABLED
__device__ __forceinline__ void cp_async16_sh(uint32_t saddr, const void *gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(gmem), "r"(src_bytes) : "memory");
}

/* S[64 x BN] = Q K^T: Q from registers (QS false) or from the swizzled Q tile at shared
 * address qaddr (QS true), K K-major (a k16 step is 32 bytes along the row). */
template <int BN, bool QS>
__device__ __forceinline__ void wg_qk(float *s, const uint32_t (*qf)[4], uint32_t qaddr, uint32_t kaddr)
{
#pragma unroll
    for (int kc = 0; kc < WG_D / 16; kc++) {
        const uint64_t desc = sw128_desc(kaddr + kc * 32, 16, 1024);
        if constexpr (QS) {
            const uint64_t qdesc = sw128_desc(qaddr + kc * 32, 16, 1024);
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

/* O[64 x 64] += P V: P from registers, V MN-major (a k16 step is 16 key rows = 2048 bytes). */
template <int BN>
__device__ __forceinline__ void wg_pv(float *acc, const uint32_t (*pa)[4], uint32_t vaddr)
{
#pragma unroll
    for (int kc = 0; kc < BN / 16; kc++) wgmma_m64n64k16_rs<1>(acc, pa[kc], sw128_desc(vaddr + kc * 2048, 16, 1024), 1);
}

/* S = Q K^T, issued and waited for: s is readable on return */
template <int BN, bool QS>
__device__ __forceinline__ void wg_qk_wait(float *s, const uint32_t (*qf)[4], uint32_t qaddr, uint32_t kaddr)
{
    wgmma_fence();
    wg_qk<BN, QS>(s, qf, qaddr, kaddr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<BN / 2>(s);
}

/* acc += P V, issued and waited for: this tile's products are done (and acc readable) on return */
template <int BN>
__device__ __forceinline__ void wg_pv_wait(float *acc, const uint32_t (*pa)[4], uint32_t vaddr)
{
    wgmma_fence();
    wg_pv<BN>(acc, pa, vaddr);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence<WG_D / 2>(acc);
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

template <int BN, bool RESCALE = true>
__device__ __forceinline__ void wg_softmax_max(float *s, int k0, const wg_src &src, int wrow, bool need_mask, float c,
                                               float *mrow, float *lrow, float *acc, float *base, float *corr_out = nullptr)
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
            for (int j = 0; j < WG_D / 8; j++) acc[4 * j + 2 * hr] *= corr, acc[4 * j + 2 * hr + 1] *= corr;
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
/* 16-byte copy global -> shared, or 16 zero bytes without reading the source when `skip`. */
__device__ __forceinline__ void cp_async16_zfill(uint32_t saddr, const void *gmem, bool skip)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
                 "cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(saddr), "l"(gmem), "r"((int)skip)
                 : "memory");
}

/* The arguments wg_tile takes for one query tile. */
struct wg_qtile {
    wg_src src;
    const float *qbase;
    size_t qstride;
    int qs, qe, opos0, ostep;
};

/* Q rows [qs, qe) of a tile in registers: chunk u of this thread is row tid/8 + 16u, columns
 * 8 (tid % 8) .. +8 (two float4); rows past qe are zeros. */
template <bool STREAM>
__device__ __forceinline__ void wg_q_load(const wg_qtile &t, float4 (&r)[8])
{
    const int row0 = threadIdx.x / 8, c8 = threadIdx.x % 8;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int x = t.qs + row0 + 16 * u;
        r[2 * u] = r[2 * u + 1] = make_float4(0, 0, 0, 0);
        if (x < t.qe) {
            const float4 *qr = reinterpret_cast<const float4 *>(t.qbase + (size_t)x * t.qstride + c8 * 8);
            r[2 * u] = STREAM ? __ldcs(qr) : __ldg(qr), r[2 * u + 1] = STREAM ? __ldcs(qr + 1) : __ldg(qr + 1);
        }
    }
}

/* ... as bf16 into the swizzled Q tile; the next key tile's barrier publishes it. */
__device__ __forceinline__ void wg_q_store(uint32_t qaddr, const float4 (&r)[8])
{
    const int row0 = threadIdx.x / 8, c8 = threadIdx.x % 8;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const float4 a = r[2 * u], b = r[2 * u + 1];
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(qaddr + sw128_offset(row0 + 16 * u, c8)),
                     "r"(pack_bf16x2(a.x, a.y)), "r"(pack_bf16x2(a.z, a.w)), "r"(pack_bf16x2(b.x, b.y)),
                     "r"(pack_bf16x2(b.z, b.w))
                     : "memory");
    }
    fence_proxy_async();
}

/* wg_stream with 32-bit steps (a tile is at most 64 r 64 elements), so that the copy cursor the
 * flow kernel keeps across query tiles costs fewer registers. */
template <class C>
struct wg_stream32 {
    const __nv_bfloat16 *k, *v;
    uint32_t row16, tile;
    int key0, kend;
    uint32_t dst0;

    __device__ __forceinline__ void init(const wg_src &s)
    {
        const int row = threadIdx.x / 8, c8 = threadIdx.x % 8;
        key0 = s.kbeg + row, kend = s.kend;
        const size_t off = (size_t)key0 * s.stride + c8 * 8;
        k = s.k + off, v = s.v + off;
        row16 = 16 * (uint32_t)s.stride, tile = (uint32_t)C::BN * (uint32_t)s.stride;
        dst0 = sw128_offset(row, c8);
    }
    __device__ __forceinline__ void issue(int nt, uint32_t stage) const
    {
        static_assert(C::THREADS == 128, "chunk u is 16 key rows below chunk u - 1");
#pragma unroll
        for (int u = 0; u < C::PER_THREAD; u++) {
            const bool skip = key0 + nt * C::BN + 16 * u >= kend;
            const uint32_t dst = stage + dst0 + u * 2048;
            const uint32_t off = (uint32_t)nt * tile + u * row16;
            cp_async16_zfill(dst, k + off, skip);
            cp_async16_zfill(dst + C::TILE, v + off, skip);
        }
    }
};
#endif /* SF_WGMMA_ENABLED */

/* The warp-specialized variants' launcher (attention_wgmma_ws.cu), for att_wgmma_launch. */
int att_wgmma_ws_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                        const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream);

#endif
