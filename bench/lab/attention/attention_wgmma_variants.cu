/* The lab's wgmma attention variants (sm_90a, d = 64; SPEC 3 and 5), reference:
 * sf_cpu_attention. Variants >= SF_LAB_ATTENTION_FIRST_WGMMA_VARIANT of sf_lab_attention_variant
 * (bench/lab/ATTENTION_NOTES.md says what each measured). The general template the product's
 * kernel (kernels/cuda/attention_wgmma.cu) was cut from: variant 36 here is its lab twin.
 *
 * Same contract, workspace and block structure as the staged kernels (attention_staged.cuh):
 * the shared pre-pass stages K/V/globals as bf16 [head][row][64]; a block of one warpgroup owns
 * T positions of one head, walks every branch's query tiles of 64 dilated rows and then the
 * global tokens, and merges each finished tile into `out` by log-sum-exp; heaviest blocks first.
 *
 * What changes is the inner loop. mma.sync needs every B fragment brought to registers by
 * ldmatrix and issues 16x8x16 products per warp; wgmma reads K and V straight from shared memory
 * (128-byte-swizzled tiles, so no padding and no bank conflicts) and computes 64 x N x 16 per
 * instruction for the whole warpgroup, asynchronously. S = Q K^T takes Q as a swizzled
 * shared-memory tile (or bf16 register fragments) and K as a K-major operand; P stays in
 * registers (the accumulator layout of S is the A-fragment layout of P V) and V, stored
 * [keys][d], is the MN-major ("transposed") B operand, so nothing is transposed or copied. K/V
 * tiles arrive by 16-byte cp.async (zero-fill past the end of the keys, as the staged kernels
 * do). The softmax (float32, exp2 domain, masks only on tiles that need them) is the staged
 * kernels' own.
 *
 * Several blocks share a multiprocessor, so one block's softmax runs under another's products.
 * The default, 36, is the plain loop (Q in shared memory, 3 K/V stages, 3 blocks a multiprocessor,
 * evict-first float32 traffic) with the next tile's copies issued under S = Q K^T. Measured no
 * faster (bench/lab/ATTENTION_NOTES.md): the in-warpgroup overlap (OVERLAP), FlashAttention-3's
 * order, warp specialization (attention_wgmma_warpspec.cu), a leaner softmax (attention_wgmma_softmax.cuh),
 * the flow kernel (copies and Q loads ahead across query tiles, 39-42) and the kernel running
 * alongside its pre-pass (PRE, attention_wgmma_overlap.cuh, 43-44). */
#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "bench/lab/attention/attention_lab.cuh"
#include "bench/lab/attention/attention_variants.h"
#include "bench/lab/attention/attention_wgmma_overlap.cuh"
#include "bench/lab/attention/attention_wgmma_softmax.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/compressive_memory_stream.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma_tile.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* A variant: BN keys a tile, STAGES tiles in flight, OVERLAP (next S issued under the softmax),
 * QS (Q as a shared-memory operand instead of registers), NWG consumer warpgroups of 64 query
 * rows each sharing every K/V tile, STREAM (float32 data read or written once, Q and the
 * pre-pass's K/V reads and the final output stores, go evict-first, so that L2 keeps the bf16
 * K/V tiles that every query tile re-reads). SOFTMAX: options of the lean softmax (SM_* of
 * attention_wgmma_softmax.cuh; 0: the staged kernels' own). ISSUE: where the plain loop issues the
 * next tile's copies: 0 between the tile barrier and S = Q K^T, on the path to the tensor cores
 * (~90 address instructions a thread in SASS); 1 once S = Q K^T is issued, 2 once P V is, both
 * under the products' latency and from pointers kept per thread (wg_stream). */
template <int BN_, int STAGES_, bool OVERLAP_, bool QS_, int NWG_, bool STREAM_ = false, bool FA3_ = false,
          int SOFTMAX_ = 0, int ISSUE_ = 0, bool PREFETCH_ = false>
struct wg_cfg {
    static constexpr int BN = BN_, STAGES = STAGES_, NWG = NWG_;
    static constexpr bool OVERLAP = OVERLAP_, QS = QS_, STREAM = STREAM_;
    /* FA3: FlashAttention-3's order, S of tile it and P V of tile it-1 in flight together; tile
     * it-1's slot is still read while tile it is, so loads run STAGES - 2 tiles ahead */
    static constexpr bool FA3 = FA3_;
    static constexpr int ISSUE = ISSUE_;
    /* ISSUE 3: as 1, and P V is left in flight at the end of a tile (the next tile's barrier and
     * S = Q K^T are issued under it; its wait is S's): tile it-1's stage is still read while
     * tile it's copies go out, so loads run STAGES - 2 tiles ahead, as in FA3 */
    static constexpr bool PV_LATE = ISSUE == 3;
    static constexpr int AHEAD = FA3 || PV_LATE ? STAGES - 2 : STAGES - 1;
    static_assert(!PV_LATE || STAGES >= 3, "P V left in flight needs a stage besides this tile's and the next's");
    /* PREFETCH: a query tile's rows of `out` (read again by its merge) and the next query tile's
     * rows of q are asked into L2 when the tile starts, so neither load waits on memory */
    static constexpr bool PREFETCH = PREFETCH_;
    static constexpr int SOFTMAX = SOFTMAX_;
    static constexpr bool TCSUM = (SOFTMAX & SM_TCSUM) != 0;
    static constexpr int ONES_BYTES = TCSUM ? SM_ONES_BYTES : 0; /* after the K/V stages */
    static_assert(!SOFTMAX || (!FA3 && !OVERLAP && NWG == 1), "the lean softmax is written for the plain loop");
    static_assert(!ISSUE || (!FA3 && !OVERLAP && NWG == 1), "late copies are written for the plain loop");
    static_assert(!FA3 || (STAGES >= 3 && NWG == 1 && QS && !OVERLAP), "FA3 order: one warpgroup, Q in smem");
    static constexpr int THREADS = 128 * NWG, BM = 64 * NWG; /* BM: query rows a tile */
    static constexpr int TILE = BN * WG_D * 2;  /* bytes of a K or a V tile */
    static constexpr int STAGE = 2 * TILE;      /* K tile then V tile, each 1024-byte aligned */
    static constexpr int KV_BYTES = STAGES * STAGE;
    static constexpr int Q_BYTES = 64 * WG_D * 2; /* a warpgroup's Q tile when QS */
    static constexpr int PER_THREAD = BN * 8 / THREADS; /* 16-byte chunks of a tile a thread */
    static_assert(BN == 64 || BN == 128, "S = Q K^T is one m64n64 or m64n128 product a k-step");
    static_assert(!OVERLAP || (STAGES >= 3 && NWG == 1), "the next tile's K is read while this tile's V is");
    static_assert(NWG == 1 || QS, "two warpgroups run under the 128-register cap: Q in shared memory");
};

#if SF_WGMMA_ENABLED
/* Asks L2 for the 128-byte line at p (no register is written; a prefetch never faults). */
__device__ __forceinline__ void lab_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Rows [x0, x1) of a head's q (row x at qbase + x * qstride, D values of QT): into L2, a line a
 * thread, so that the query tile that loads them next finds them there. */
template <class C, class QT>
__device__ __forceinline__ void lab_prefetch_q_rows(const QT *qbase, size_t qstride, int x0, int x1)
{
    constexpr int LINES = WG_D * (int)sizeof(QT) / 128; /* 128-byte lines a row */
    for (int i = threadIdx.x; i < (x1 - x0) * LINES; i += C::THREADS)
        lab_prefetch_l2(qbase + (size_t)(x0 + i / LINES) * qstride + (i % LINES) * (128 / sizeof(QT)));
}

/* K and V rows [k0, k0 + BN) into the stage at shared address `stage`, swizzled. */
template <class C>
__device__ __forceinline__ void wg_issue_tile(const wg_src &s, int k0, uint32_t stage)
{
#pragma unroll
    for (int u = 0; u < C::PER_THREAD; u++) {
        const int f = threadIdx.x + u * C::THREADS, key = f / 8, c8 = f % 8;
        const int x = k0 + key;
        const bool ok = x < s.kend;
        const size_t off = (ok ? (size_t)x * s.stride : 0) + c8 * 8;
        const uint32_t dst = sw128_offset(key, c8);
        cp_async16_sh(stage + dst, s.k + off, ok ? 16 : 0);
        cp_async16_sh(stage + C::TILE + dst, s.v + off, ok ? 16 : 0);
    }
}

/* This thread's share of the copies of every key tile of one query tile: its chunks are key rows
 * tid/8 + 16u (u < PER_THREAD) at column chunk tid%8, so the shared offsets are one base plus
 * u * 2048 bytes and the global addresses advance by a fixed step a tile. Keys past the end are
 * zero-filled with the source ignored (ignore-src), so no address select is needed. */
template <class C>
struct wg_stream {
    const __nv_bfloat16 *k, *v; /* chunk u = 0 of key tile 0 */
    size_t row16, tile;          /* elements between chunks u and u+1, and between tiles */
    int key0, kend;              /* key of chunk u = 0 in tile 0, end of the keys */
    uint32_t dst0;               /* shared offset of chunk u = 0 in a stage */

    __device__ __forceinline__ wg_stream(const wg_src &s)
    {
        const int row = threadIdx.x / 8, c8 = threadIdx.x % 8;
        key0 = s.kbeg + row, kend = s.kend;
        const size_t off = (size_t)key0 * s.stride + c8 * 8;
        k = s.k + off, v = s.v + off;
        row16 = 16 * s.stride, tile = (size_t)C::BN * s.stride;
        dst0 = sw128_offset(row, c8);
    }
    __device__ __forceinline__ void issue(int nt, uint32_t stage) const
    {
        static_assert(C::THREADS % 8 == 0 && C::THREADS / 8 == 16, "chunk u is 16 key rows below chunk u - 1");
        const size_t t0 = (size_t)nt * tile;
#pragma unroll
        for (int u = 0; u < C::PER_THREAD; u++) {
            const bool skip = key0 + nt * C::BN + 16 * u >= kend;
            const uint32_t dst = stage + dst0 + u * 2048;
            cp_async16_zfill(dst, k + t0 + u * row16, skip);
            cp_async16_zfill(dst + C::TILE, v + t0 + u * row16, skip);
        }
    }
};

/* One query tile: dilated rows [qs, qe), query row x at qbase + x*qstride (float32 or bf16: QT),
 * output row at position opos0 + x*ostep; merges into out / m_s / l_s (indexed by position - P).
 * Every thread of the block calls it (it holds block barriers). `kv`: shared address of the
 * stages. */
template <class C, class QT = float>
__device__ void wg_tile(const wg_src &src, const QT *qbase, size_t qstride, int qs, int qe, int opos0, int ostep,
                        int P, float *out, size_t ld, float c, uint32_t qaddr, uint32_t kv, float *m_s, float *l_s,
                        uint32_t ones)
{
    constexpr int BN = C::BN, STAGES = C::STAGES;
    constexpr bool QS = C::QS;
    const int nkt = (src.kend - src.kbeg + BN - 1) / BN;
    if (nkt <= 0) return;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* this warpgroup's rows [qs_w, qe_w) (none when qe_w <= qs_w); this thread's: wrow, wrow + 8 */
    const int qs_w = qs + 64 * wg, qe_w = min(qe, qs_w + 64);
    const int wrow = qs_w + warp * 16 + g;
    qaddr += wg * C::Q_BYTES;

#pragma unroll
    for (int p = 0; p < C::AHEAD; p++) {
        if (p < nkt) wg_issue_tile<C>(src, src.kbeg + p * BN, kv + p * C::STAGE);
        cp_async_commit();
    }
    if constexpr (C::PREFETCH) {
        /* the 64 rows' 256 bytes of out this tile's merge reads: a 128-byte line a thread */
        const int x = qs_w + tid / 2;
        if (x < qe_w) lab_prefetch_l2(out + (size_t)(opos0 + x * ostep) * ld + (tid & 1) * 32);
    }
    uint32_t qf[WG_D / 16][4]; /* unused when QS */
    static_assert(QS || sizeof(QT) == sizeof(float), "bf16 queries are read into the shared Q tile");
    if constexpr (QS && sizeof(QT) == 2) {
        /* bf16 rows (qkv wrote them): 16-byte chunks go to the swizzled tile as they are */
#pragma unroll
        for (int u = 0; u < 64 * 8 / 128; u++) {
            const int f = tid + u * 128, row = f / 8, c8 = f % 8, x = qs_w + row;
            uint4 a = make_uint4(0, 0, 0, 0);
            if (x < qe_w) {
                const uint4 *qr = reinterpret_cast<const uint4 *>(qbase + (size_t)x * qstride + c8 * 8);
                a = C::STREAM ? __ldcs(qr) : __ldg(qr);
            }
            const uint32_t dst = qaddr + sw128_offset(row, c8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w)
                         : "memory");
        }
        fence_proxy_async();
    } else if constexpr (QS) {
        /* Q tile to shared memory, swizzled like K: rows past qe are zeros. The previous tile's
         * products are done with it (each thread waited, then a barrier). */
#pragma unroll
        for (int u = 0; u < 64 * 8 / 128; u++) {
            const int f = tid + u * 128, row = f / 8, c8 = f % 8, x = qs_w + row;
            float4 a = make_float4(0, 0, 0, 0), b = a;
            if (x < qe_w) {
                const float4 *qr = reinterpret_cast<const float4 *>(qbase + (size_t)x * qstride + c8 * 8);
                a = C::STREAM ? __ldcs(qr) : __ldg(qr), b = C::STREAM ? __ldcs(qr + 1) : __ldg(qr + 1);
            }
            const uint32_t dst = qaddr + sw128_offset(row, c8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(pack_bf16x2(a.x, a.y)),
                         "r"(pack_bf16x2(a.z, a.w)), "r"(pack_bf16x2(b.x, b.y)), "r"(pack_bf16x2(b.z, b.w))
                         : "memory");
        }
        fence_proxy_async(); /* the first key tile's barrier then publishes it */
    } else {
        /* Q as A fragments (the mma.sync m16n8k16 layout, warp w on rows 16w..16w+15) */
        att_load_q_frags<WG_D>(qf, qbase, qstride, wrow, qe, t);
    }
    float acc[WG_D / 2];
#pragma unroll
    for (int i = 0; i < WG_D / 2; i++) acc[i] = 0;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
    float lacc[4] = {0, 0, 0, 0}; /* SM_TCSUM: the row-sum product's accumulator */
    /* tiles wholly inside the keys every row of the warpgroup may see skip the mask; tiles
     * wholly outside them (a second warpgroup's rows end earlier or start a new window) skip
     * the products */
    const int qwin = qs_w / src.win, qlast = max(qe_w, qs_w + 1) - 1;
    const bool qwin_same = qwin == qlast / src.win;
    const int wlo = qwin * src.win, whi = min(wlo + src.win, src.kend);
    const int seen_hi = min(min(src.kend, (qlast / src.win + 1) * src.win), src.causal ? qlast + 1 : src.kend);
    float s[BN / 2];
    uint32_t pa[BN / 16][4];

    if constexpr (C::FA3) {
        uint32_t pb[BN / 16][4];
        const uint32_t(*no_qf)[4] = qf;
        /* tile it landed and everyone is done with tile it-2 (its P V waited in iteration it-1):
         * its slot takes tile it + AHEAD */
        auto arrive = [&](int it) {
            cp_async_wait<C::AHEAD - 1>();
            fence_proxy_async();
            __syncthreads();
            const int nt = it + C::AHEAD;
            if (nt < nkt) wg_issue_tile<C>(src, src.kbeg + nt * BN, kv + (nt % STAGES) * C::STAGE);
            cp_async_commit();
        };
        auto softmax = [&](uint32_t(*pcur)[4], int it, bool pv_pending) {
            const int k0 = src.kbeg + it * BN;
            const bool need_mask = !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
            float base[2], corr[2];
            wg_softmax_max<BN, false>(s, k0, src, wrow, need_mask, c, mrow, lrow, acc, base, corr);
            wg_softmax_exp<BN>(s, c, base, lrow, pcur);
            if (pv_pending) {
                wgmma_wait<0>(); /* P V of tile it-1 */
                reg_fence<WG_D / 2>(acc);
            }
#pragma unroll
            for (int j = 0; j < WG_D / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[4 * j + e] *= corr[e >> 1];
        };
        auto step = [&](uint32_t(*pcur)[4], uint32_t(*pprev)[4], int it) {
            arrive(it);
            wgmma_fence();
            wg_qk<BN, true>(s, no_qf, qaddr, kv + (it % STAGES) * C::STAGE);
            wgmma_commit();
            wg_pv<BN>(acc, pprev, kv + ((it - 1) % STAGES) * C::STAGE + C::TILE);
            wgmma_commit();
            wgmma_wait<1>(); /* S of tile it */
            reg_fence<BN / 2>(s);
            softmax(pcur, it, true);
        };
        arrive(0);
        wg_qk_wait<BN, true>(s, no_qf, qaddr, kv);
        softmax(pa, 0, false);
        int it = 1;
        for (; it + 1 < nkt; it += 2) {
            step(pb, pa, it);
            step(pa, pb, it + 1);
        }
        const uint32_t vlast = kv + ((nkt - 1) % STAGES) * C::STAGE + C::TILE;
        if (it < nkt) {
            step(pb, pa, it);
            wgmma_fence();
            wg_pv<BN>(acc, pb, vlast);
        } else {
            wgmma_fence();
            wg_pv<BN>(acc, pa, vlast);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence<WG_D / 2>(acc);
    } else if constexpr (!C::OVERLAP) {
        const wg_stream<C> copies(src);
        /* tile it + AHEAD into the stage of tile it-1 (it-2 with PV_LATE), which everyone is done
         * with */
        auto issue_next = [&](int it) {
            const int nt = it + C::AHEAD;
            if (nt < nkt) {
                if constexpr (C::ISSUE != 0)
                    copies.issue(nt, kv + (nt % STAGES) * C::STAGE);
                else
                    wg_issue_tile<C>(src, src.kbeg + nt * BN, kv + (nt % STAGES) * C::STAGE);
            }
            cp_async_commit();
        };
        for (int it = 0; it < nkt; it++) {
            cp_async_wait<C::AHEAD - 1>(); /* this thread's part of tile `it` has landed */
            fence_proxy_async();           /* ... and is visible to the tensor cores */
            __syncthreads();               /* everyone's has, and tile it-1 (it-2) is done with */
            if constexpr (C::ISSUE == 0) issue_next(it);
            const int k0 = src.kbeg + it * BN;
            const uint32_t kaddr = kv + (it % STAGES) * C::STAGE;
            if (C::NWG > 1 && (qe_w <= qs_w || k0 >= seen_hi || k0 + BN <= wlo)) continue;
            wgmma_fence();
            wg_qk<BN, C::QS>(s, qf, qaddr, kaddr);
            wgmma_commit();
            if constexpr (C::ISSUE == 1 || C::PV_LATE) issue_next(it);
            wgmma_wait<0>(); /* with PV_LATE also P V of tile it-1, issued before */
            reg_fence<BN / 2>(s);
            if constexpr (C::PV_LATE) reg_fence<WG_D / 2>(acc);
            const bool need_mask = !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
            if constexpr (C::SOFTMAX != 0) {
                wg_softmax_lean<BN, C::SOFTMAX>(s, k0, src, wrow, need_mask, c, mrow, C::TCSUM ? lacc : lrow, acc, pa);
            } else {
                float base[2];
                wg_softmax_max<BN>(s, k0, src, wrow, need_mask, c, mrow, lrow, acc, base);
                wg_softmax_exp<BN>(s, c, base, lrow, pa);
            }
            wgmma_fence();
            wg_pv<BN>(acc, pa, kaddr + C::TILE);
            if constexpr (C::TCSUM) wg_rowsum<BN>(lacc, pa, ones);
            wgmma_commit();
            if constexpr (C::ISSUE == 2) issue_next(it);
            if constexpr (!C::PV_LATE) {
                wgmma_wait<0>();
                reg_fence<WG_D / 2>(acc);
            }
            if constexpr (C::TCSUM) reg_fence<4>(lacc);
        }
        if constexpr (C::PV_LATE) {
            wgmma_wait<0>();
            reg_fence<WG_D / 2>(acc);
        }
    } else {
        /* S of tiles it and it+1 in two register sets used in turn (unrolled by 2): with one set
         * and a copy, ptxas may give both the same registers and then serializes the wgmma */
        float s_odd[BN / 2];
        cp_async_wait<STAGES - 2>(); /* tile 0 */
        fence_proxy_async();
        __syncthreads();
        wg_qk_wait<BN, C::QS>(s, qf, qaddr, kv);
        /* cur holds S of tile it; tiles up to it+1 are requested. Everyone is done with tile
         * it-1, so its stage takes tile it+STAGES-1. */
        auto step = [&](float *cur, float *next, int it) {
            __syncthreads();
            {
                const int nt = it + STAGES - 1;
                if (nt < nkt) wg_issue_tile<C>(src, src.kbeg + nt * BN, kv + (nt % STAGES) * C::STAGE);
                cp_async_commit();
            }
            cp_async_wait<STAGES - 2>(); /* tile it+1 */
            fence_proxy_async();
            __syncthreads();
            const int k0 = src.kbeg + it * BN;
            const uint32_t kaddr = kv + (it % STAGES) * C::STAGE;
            const bool need_mask = !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
            float base[2];
            wg_softmax_max<BN>(cur, k0, src, wrow, need_mask, c, mrow, lrow, acc, base);
            if (it + 1 < nkt) { /* the tensor cores compute the next S while this thread does the exps */
                wgmma_fence();
                wg_qk<BN, C::QS>(next, qf, qaddr, kv + ((it + 1) % STAGES) * C::STAGE);
                wgmma_commit();
            }
            wg_softmax_exp<BN>(cur, c, base, lrow, pa);
            wg_pv_wait<BN>(acc, pa, kaddr + C::TILE);
            reg_fence<BN / 2>(next);
        };
        for (int it = 0; it < nkt; it += 2) {
            step(s, s_odd, it);
            if (it + 1 < nkt) step(s_odd, s, it + 1);
        }
    }

    /* merge this tile's rows into the block's accumulators (out, m_s, l_s); the merge adds the
     * quad's partial sums, and with SM_TCSUM each thread holds the whole sum: one lane gives it */
    if constexpr (C::TCSUM) lrow[0] = t == 0 ? lacc[0] : 0.0f, lrow[1] = t == 0 ? lacc[2] : 0.0f;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int x = wrow + 8 * hr;
        merge_tile_row<WG_D>(out, ld, t, m_s, l_s, x < qe, opos0 + x * ostep - P, P, mrow[hr], lrow[hr],
                             [&](int j) { return make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]); });
    }
    __syncthreads(); /* m_s/l_s and the key stages are shared with the next tile */
}

#endif /* SF_WGMMA_ENABLED */

/* The block's last step with the memory mix fused (sf_cuda_attention_mix_ws): instead of
 * normalizing its rows [P, Pend) of head h in `out`, the block mixes them with the memory's
 * retrieval (memory_stream.cuh) and writes the bf16 result to mix.out, so the float32 rows are
 * neither written back normalized nor read again by a mix kernel. The K/V ring (free now) holds
 * M_h and z_h; l_s becomes 1/l (0: no key seen, A_dot = 0). */
template <class QT>
__device__ __forceinline__ void mix_block_rows(const sf_attention_desc &dd, int h, int P, int Pend, const QT *q,
                                               const float *out, float *l_s, unsigned char *ring,
                                               const sf_cuda_attention_mix &mix)
{
    if constexpr (sizeof(QT) == 2) {
        uint2 *sB = reinterpret_cast<uint2 *>(ring);
        float *sz = reinterpret_cast<float *>(sB + 4 * 8 * 32);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads(); /* every warp's merges into out are done and seen; the ring is free */
        for (int i = threadIdx.x; i < Pend - P; i += blockDim.x) l_s[i] = l_s[i] != 0 ? 1.0f / l_s[i] : 0.0f;
        stage_stream_mix(mix.M, mix.z, h, sB, sz);
        __syncthreads();
        const float wg = memory_gate(mix.gate, h);
        stream_mix_rows(P + 16 * (threadIdx.x >> 5), 16 * (blockDim.x >> 5), Pend, dd.ld, h, q, out, l_s, P, sB, sz, wg,
                        static_cast<__nv_bfloat16 *>(mix.out));
    }
}

/* PRE: how it meets the pre-pass (PRE_* of attention_wgmma_overlap.cuh). QT: the type of q
 * (float32, or bf16 when qkv wrote bf16 activations; K/V then come straight from them, `st`
 * says where and how far apart their rows are). */
template <class C, int MINB, int PRE = PRE_NONE, class QT = float, bool MIX = false>
__global__ void __launch_bounds__(C::THREADS, MINB)
    attention_wgmma_variant(sf_attention_desc dd, att_branches br, int T, const QT *q, lab_staged st, float *out,
                    const att_order ord, int per_cta, sf_cuda_attention_mix mix)
{
#if SF_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    /* swizzled tiles must start 1024-byte aligned; the launch adds 1 KiB of slack */
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t qaddr = (base + 1023) & ~1023u, kv = qaddr + (C::QS ? C::NWG * C::Q_BYTES : 0);
    const uint32_t ones = kv + C::KV_BYTES;
    float *m_s = reinterpret_cast<float *>(smem + (ones - base) + C::ONES_BYTES), *l_s = m_s + T;
    if constexpr (C::TCSUM) wg_fill_ones(ones, C::THREADS); /* published by the barrier below */
    /* launched early (sf_cuda_launch_early) except beside a pre-pass, which has its own wait below */
    if constexpr (PRE == PRE_NONE) sf_wait_prior_grid();
    const int h = blockIdx.x % dd.heads, item = blockIdx.x / dd.heads;
    const int nblocks = (dd.n + T - 1) / T;
    const size_t ld = dd.ld;
    const float c = dd.scale * 1.4426950408889634f;
    float *outh = out + h * WG_D;
    const int gchunks = (max(dd.n_global, 0) + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    if constexpr (PRE == PRE_ALL) att_wait_ready(st.ready, 0, st.nchunks + gchunks - 1);
    /* per_cta position blocks one after the other (a heavy and a light one: see launch_wgmma) */
    for (int sub = 0; sub < per_cta; sub++) {
        const int e = item * per_cta + sub;
        if (ord.count ? e >= ord.count || ord.block[e] == 0xFFFF : e >= nblocks) break;
        const int P = (ord.count ? ord.block[e] : nblocks - 1 - e) * T;
        const int Pend = min(P + T, dd.n);
        for (int i = threadIdx.x; i < T; i += C::THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
        __syncthreads();

        for (int b = 0; b < br.count; b++) {
            const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
            const int r = g.r, o = g.o, qa1 = g.qa1;
            wg_src src = wg_branch_src(st, h, g, dd.causal);
            if (PRE == PRE_BRANCH && P / r < qa1) { /* the keys of the first tile to the last one's */
                int kbeg, kend;
                att_key_range(g, P / r, qa1, dd.causal, &kbeg, &kend);
                att_wait_rows(st, o + kbeg * r, o + (kend - 1) * r);
            }
            for (int qs = P / r; qs < qa1; qs += C::BM) {
                const int qe = min(qs + C::BM, qa1);
                att_key_range(g, qs, qe, dd.causal, &src.kbeg, &src.kend);
                if constexpr (C::PREFETCH)
                    lab_prefetch_q_rows<C>(q + (size_t)o * ld + h * WG_D, (size_t)r * ld, qe, min(qe + C::BM, qa1));
                wg_tile<C>(src, q + (size_t)o * ld + h * WG_D, (size_t)r * ld, qs, qe, o, r, P, outh, ld, c, qaddr, kv,
                           m_s, l_s, ones);
            }
        }
        if (dd.n_global > 0) {
            const wg_src src = wg_global_src(st, h, dd.n_global);
            if constexpr (PRE == PRE_BRANCH) att_wait_ready(st.ready, st.nchunks, st.nchunks + gchunks - 1);
            for (int qs = P; qs < Pend; qs += C::BM) {
                if constexpr (C::PREFETCH)
                    lab_prefetch_q_rows<C>(q + h * WG_D, ld, min(qs + C::BM, Pend), min(qs + 2 * C::BM, Pend));
                wg_tile<C>(src, q + h * WG_D, ld, qs, min(qs + C::BM, Pend), 0, 1, P, outh, ld, c, qaddr, kv, m_s, l_s,
                           ones);
            }
        }
        if constexpr (MIX)
            mix_block_rows(dd, h, P, Pend, q, out, l_s, smem + (kv - base), mix);
        else
            normalize_block_rows<WG_D, C::STREAM>(outh, ld, P, Pend, l_s, C::THREADS);
        __syncthreads(); /* l_s is read above and reset for the next block */
    }
    /* this grid then completes only after the pre-pass, as the stream's next work expects */
    if constexpr (PRE != PRE_NONE) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#include "bench/lab/attention/attention_wgmma_flow.cuh"

/* ---- host side -------------------------------------------------------------------------- */

/* PAIR: a block (CTA) takes two position blocks, the heaviest left with the lightest left, so
 * that items cost about the same; otherwise one each, heaviest first. With every item resident
 * at once (one wave), heaviest-first cannot balance: the heaviest item (1.4-2x the mean load of
 * a slot at the reference shape) sets the end. */
template <class C, int MINB, bool PAIR = false, int FLOW = 0, int PRE = PRE_NONE, class QT = float, bool MIX = false>
static int launch_wgmma(const sf_attention_desc *desc, const att_branches &br, const QT *q, const QT *k, const QT *v,
                        float *out, unsigned char *ws, cudaStream_t stream, const sf_cuda_attention_mix *mix = nullptr)
{
    static_assert(!MIX || (sizeof(QT) == 2 && !FLOW && !PAIR && C::KV_BYTES >= 4 * 8 * 32 * 8 + 64 * 4),
                  "the mix is fused into the bf16 plain kernel, its ring holding M_h and z_h");
    constexpr bool IN_PLACE = sizeof(QT) == 2; /* bf16 activations: K/V read where they are */
    static_assert(!IN_PLACE || (!FLOW && !PRE && C::QS), "bf16 activations take the plain kernel");
    int rc;
    if constexpr (IN_PLACE)
        rc = att_check_bf16_inputs(desc, q, k, v);
    else
        rc = att_check_staged_inputs(desc, q, k, v);
    if (rc) return rc;
    long T;
    rc = att_block_positions(br, C::BM, &T);
    if (rc) return rc;
    const size_t smem =
        1024 + (C::QS ? C::NWG * C::Q_BYTES : 0) + C::KV_BYTES + C::ONES_BYTES + 2 * (size_t)T * sizeof(float);
    if (smem > 200 * 1024) return sf_error(SF_E_UNSUPPORTED, "cuda attention: block of %ld positions too large", T);
    static_assert(!(PAIR && FLOW), "the flow kernel takes one position block a CTA");
    cudaError_t err;
    if constexpr (FLOW)
        err = cudaFuncSetAttribute(attention_wgmma_flow<C, MINB, FLOW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    else
        err = cudaFuncSetAttribute(attention_wgmma_variant<C, MINB, PRE, QT, MIX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma): %s", cudaGetErrorString(err));
    lab_staged st;
    static_assert(!PRE || (C::STREAM && !FLOW), "the overlapped pre-pass reads as the streaming one");
    if constexpr (IN_PLACE)
        rc = att_stage_globals(desc, k, v, ws, &st, stream, C::STREAM);
    else
        rc = PRE ? att_stage_workspace_overlapped(desc, k, v, ws, &st, stream)
                 : att_stage_workspace(desc, k, v, ws, &st, stream, C::STREAM);
    if (rc) return rc;
    const int nblocks = (int)((desc->n + T - 1) / T);
    att_order ord; /* copied into the launch parameters */
    att_heaviest_first(desc, br, (int)T, nblocks, &ord);
    int per_cta = 1, items = nblocks;
    if (PAIR && ord.count) {
        att_order sorted = ord;
        ord.count = 0;
        for (int i = 0, j = nblocks - 1; i <= j; i++, j--) {
            ord.block[ord.count++] = sorted.block[i];
            ord.block[ord.count++] = i < j ? sorted.block[j] : (unsigned short)0xFFFF;
        }
        per_cta = 2, items = (nblocks + 1) / 2;
    }
    const unsigned grid = (unsigned)items * desc->heads;
    const sf_cuda_attention_mix no_mix = {};
    if constexpr (FLOW)
        attention_wgmma_flow<C, MINB, FLOW><<<grid, C::THREADS, smem, stream>>>(*desc, br, (int)T, q, st, out, ord, per_cta);
    else if constexpr (PRE != PRE_NONE)
        return att_launch_alongside(attention_wgmma_variant<C, MINB, PRE>, grid, C::THREADS, smem, stream, *desc, br, (int)T, q,
                                    st, out, ord, per_cta, no_mix);
    else {
        err = sf_cuda_launch_early(attention_wgmma_variant<C, MINB, PRE_NONE, QT, MIX>, grid, C::THREADS, smem, stream, *desc,
                                   br, (int)T, q, st, out, ord, per_cta, MIX ? *mix : no_mix);
        if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma): %s", cudaGetErrorString(err));
    }
    return SF_OK;
}

typedef wg_cfg<128, 2, false, true, 1, true, false, 0, 1> cfg45;
typedef wg_cfg<64, 3, false, true, 1, true, false, 0, 3> cfg46;
typedef wg_cfg<64, 4, false, true, 1, true, false, 0, 3> cfg47;
typedef wg_cfg<64, 3, false, true, 1, true, false, 0, 1, true> cfg48;
typedef wg_cfg<64, 3, false, true, 1, true, false, 0, 3, true> cfg49;
typedef wg_cfg<128, 2, false, true, 1, true, false, 0, 1, true> cfg50;

int att_wgmma_launch_bf16(int variant, const sf_attention_desc *desc, const att_branches &br, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, float *out, unsigned char *ws,
                          cudaStream_t stream, const sf_cuda_attention_mix *mix)
{
    typedef wg_cfg<64, 3, false, true, 1, true, false, 0, 1> cfg36;
    switch (variant) {
    case 36:
        if (mix)
            return launch_wgmma<cfg36, 3, false, 0, PRE_NONE, __nv_bfloat16, true>(desc, br, q, k, v, out, ws, stream,
                                                                                    mix);
        return launch_wgmma<cfg36, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 45: return launch_wgmma<cfg45, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 46: return launch_wgmma<cfg46, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 47: return launch_wgmma<cfg47, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 48: return launch_wgmma<cfg48, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 49: return launch_wgmma<cfg49, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    case 50: return launch_wgmma<cfg50, 3, false, 0, PRE_NONE, __nv_bfloat16>(desc, br, q, k, v, out, ws, stream);
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: variant %d reads float32 q/k/v only (36, 45-50 read bf16)",
                        variant);
    }
}

bool att_wgmma_usable(const sf_attention_desc *desc)
{
    if (desc->head_dim != WG_D) return false;
    /* per device: compute capability 9.0 and an sm_90a image of the kernels in this binary */
    static signed char known[64]; /* 0 unknown, 1 usable, -1 not; a benign race fills it */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (!known[dev]) {
        int major = 0, minor = 0;
        cudaFuncAttributes fa;
        const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                        major == 9 && minor == 0 &&
                        cudaFuncGetAttributes(&fa, attention_wgmma_variant<wg_cfg<64, 2, false, true, 1>, 4>) == cudaSuccess;
        cudaGetLastError(); /* a missing image must not linger as the next launch's error */
        known[dev] = ok ? 1 : -1;
    }
    return known[dev] > 0;
}

int att_wgmma_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                     const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    switch (variant) {
    /* Q from shared memory in 9: with Q in registers under the 128-register cap of 4 blocks a
     * multiprocessor, ptxas 13.0 gave P V's A fragments Q's registers (wrong results) */
    /*                               BN STAGES OVERLAP QS  NWG   blocks/SM */
    case 9: return launch_wgmma<wg_cfg<64, 2, false, true, 1>, 4>(desc, br, q, k, v, out, ws, stream);
    case 10: return launch_wgmma<wg_cfg<128, 2, false, false, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 11: return launch_wgmma<wg_cfg<64, 3, true, false, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 12: return launch_wgmma<wg_cfg<64, 2, false, true, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 13: return launch_wgmma<wg_cfg<64, 3, true, true, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 14: return launch_wgmma<wg_cfg<64, 2, false, true, 2>, 2>(desc, br, q, k, v, out, ws, stream);
    case 15: return launch_wgmma<wg_cfg<64, 3, false, true, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 16: return launch_wgmma<wg_cfg<64, 3, false, true, 1>, 3, true>(desc, br, q, k, v, out, ws, stream);
    case 17: return launch_wgmma<wg_cfg<64, 2, false, true, 1>, 4, true>(desc, br, q, k, v, out, ws, stream);
    case 18: return launch_wgmma<wg_cfg<64, 3, false, true, 1, true>, 3>(desc, br, q, k, v, out, ws, stream);
    case 19: return launch_wgmma<wg_cfg<64, 2, false, true, 1, true>, 3>(desc, br, q, k, v, out, ws, stream);
    /* as 18 in FlashAttention-3's order (softmax of tile it under P V of tile it-1) */
    case 29: return launch_wgmma<wg_cfg<64, 4, false, true, 1, true, true>, 2>(desc, br, q, k, v, out, ws, stream);
    case 30: return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, true>, 3>(desc, br, q, k, v, out, ws, stream);
    /* as 18 with the lean softmax (attention_wgmma_softmax.cuh): lazy rescale; + row sums on the
     * tensor cores; + bf16x2 exps; bf16x2 exps and tensor-core sums without the lazy rescale */
    case 31: return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, SM_LAZY>, 3>(desc, br, q, k, v, out, ws, stream);
    case 32:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, SM_LAZY | SM_TCSUM>, 3>(desc, br, q, k, v, out,
                                                                                                ws, stream);
    case 33:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, SM_LAZY | SM_TCSUM | SM_EXPBF16>, 3>(
            desc, br, q, k, v, out, ws, stream);
    case 34:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, SM_TCSUM | SM_EXPBF16>, 3>(desc, br, q, k, v,
                                                                                                   out, ws, stream);
    /* 33 with the registers it frees spent on a fourth block a multiprocessor (2 stages for the
     * shared memory, 128 registers) */
    case 35:
        return launch_wgmma<wg_cfg<64, 2, false, true, 1, true, false, SM_LAZY | SM_TCSUM | SM_EXPBF16>, 4>(
            desc, br, q, k, v, out, ws, stream);
    /* as 18 with the next tile's copies issued under S = Q K^T (36) or P V (37), from kept
     * pointers; 38: 36 with the lazy rescale of 31 */
    case 36:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3>(desc, br, q, k, v, out, ws, stream);
    case 37:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 2>, 3>(desc, br, q, k, v, out, ws, stream);
    case 38:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, SM_LAZY, 1>, 3>(desc, br, q, k, v, out, ws,
                                                                                        stream);
    /* 36's tile loop with the copies and the Q loads running ahead across query tiles (the flow
     * kernel); 40: four K/V stages (75 KiB a block, still three a multiprocessor); 41: 39 with
     * Q loaded after the merge, 42: 39 with copies only within a query tile */
    case 39:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3, false, FL_CROSS | FL_EARLY_Q>(
            desc, br, q, k, v, out, ws, stream);
    case 40:
        return launch_wgmma<wg_cfg<64, 4, false, true, 1, true, false, 0, 1>, 3, false, FL_CROSS | FL_EARLY_Q>(
            desc, br, q, k, v, out, ws, stream);
    case 41:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3, false, FL_CROSS>(desc, br, q, k, v, out,
                                                                                                  ws, stream);
    case 42:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3, false, FL_EARLY_Q>(desc, br, q, k, v,
                                                                                                    out, ws, stream);
    /* 36 alongside its pre-pass (attention_wgmma_overlap.cuh): 43 waits per branch on the rows
     * it reads, 44 on all of them at the start (only the launch overlaps) */
    case 43:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3, false, 0, PRE_BRANCH>(
            desc, br, q, k, v, out, ws, stream);
    case 44:
        return launch_wgmma<wg_cfg<64, 3, false, true, 1, true, false, 0, 1>, 3, false, 0, PRE_ALL>(
            desc, br, q, k, v, out, ws, stream);
    /* 45: 128 keys a tile in two stages, Q in shared memory, three blocks a multiprocessor (10
     * kept Q in registers and spilled); 46, 47: 36 with P V left in flight across the next
     * tile's barrier and S = Q K^T, 3 and 4 stages; 48: 36 with out's and the next q rows asked
     * into L2 at a tile's start; 49: 46 with that; 50: 45 with that */
    case 45: return launch_wgmma<cfg45, 3>(desc, br, q, k, v, out, ws, stream);
    case 46: return launch_wgmma<cfg46, 3>(desc, br, q, k, v, out, ws, stream);
    case 47: return launch_wgmma<cfg47, 3>(desc, br, q, k, v, out, ws, stream);
    case 48: return launch_wgmma<cfg48, 3>(desc, br, q, k, v, out, ws, stream);
    case 49: return launch_wgmma<cfg49, 3>(desc, br, q, k, v, out, ws, stream);
    case 50: return launch_wgmma<cfg50, 3>(desc, br, q, k, v, out, ws, stream);
    case 20:
    case 21:
    case 22:
    case 23:
    case 24:
    case 25:
    case 26:
    case 27:
    case 28: return att_wgmma_ws_launch(variant, desc, br, q, k, v, out, ws, stream);
    default: return sf_error(SF_E_INVAL, "cuda attention: no wgmma variant %d", variant);
    }
}
