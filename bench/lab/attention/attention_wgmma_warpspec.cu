/* Dilated local attention on Hopper wgmma, warp-specialized (FlashAttention-3's layout), d = 64
 * (SPEC 3 and 5); reference: sf_cpu_attention. The lab's variants 20-28
 * (bench/lab/ATTENTION_NOTES.md says what each measured). Same contract, workspace, pre-pass, block
 * structure (T positions of one head: every branch's query tiles, then the globals, merged into
 * `out` by log-sum-exp) and tile math (attention_wgmma_tile.cuh) as attention_wgmma_variants.cu; what
 * changes is who loads and who waits. */
#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "bench/lab/attention/attention_lab.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma_tile.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

#if SF_WGMMA_ENABLED
/* ---- a producer warp feeds 2 or 3 consumer warpgroups ------------------------------------
 * The variants of attention_wgmma_variants.cu run load -> S -> softmax -> P V -> CTA barrier in series in
 * every block and hide latency only through 3 resident blocks (12 warps): ncu found them
 * latency-bound. Here one CTA a multiprocessor holds a producer warp that streams K/V tiles
 * through a ring of STAGES slots (cp.async, completion signalled on a "full" mbarrier per slot)
 * and consumer warpgroups of 64 query rows each that read every tile and hand the slot back on
 * its "empty" mbarrier: no CTA-wide barrier per key tile, the producer runs ahead across query
 * tiles (no pipeline fill per tile), the warpgroups drift apart within a branch. OVERLAP 1: the
 * next S under this tile's exps; 2: FlashAttention-3's order (this softmax under the previous
 * tile's P V). None measured faster than variant 18 (bench/lab/ATTENTION_NOTES.md). */

/* Shared-memory addresses of the ring: slot s at kv + s*STAGE, its barriers at full + 8s and
 * empty + 8s. `seq` counts tiles over the CTA's whole walk, the same in every role. */
struct ws_ring {
    uint32_t kv, full, empty;
};

/* Producer state of one lane: tiles issued, and tiles signalled full (at most LAG behind). */
struct ws_producer {
    uint32_t issued, signalled;
};

template <class C>
__device__ __forceinline__ void ws_signal(const ws_ring &ring, ws_producer &pr)
{
    fence_proxy_async(); /* this lane's cp.async data, to the tensor cores' proxy */
    mbar_arrive(ring.full + 8 * (pr.signalled % C::STAGES));
    pr.signalled++;
}

/* Producer (one warp): every key tile of one query tile into the ring. A slot is refilled once
 * both warpgroups released it; a tile is signalled full once this lane's copies of it landed,
 * LAG tiles later (cp.async groups complete in order). With LAG <= STAGES - 2, every tile the
 * consumers need before the producer can go on is already signalled. */
template <class C>
__device__ void ws_produce(const wg_src &src, const ws_ring &ring, ws_producer &pr)
{
    const int nkt = (src.kend - src.kbeg + C::BN - 1) / C::BN, lane = threadIdx.x & 31;
    for (int it = 0; it < nkt; it++) {
        const uint32_t slot = pr.issued % C::STAGES;
        mbar_wait(ring.empty + 8 * slot, ((pr.issued / C::STAGES) & 1) ^ 1);
        const uint32_t stage = ring.kv + slot * C::STAGE;
        const int k0 = src.kbeg + it * C::BN;
#pragma unroll 4
        for (int u = 0; u < C::BN * 8 / 32; u++) {
            const int f = lane + u * 32, key = f / 8, c8 = f % 8, x = k0 + key;
            const bool ok = x < src.kend;
            const size_t off = (ok ? (size_t)x * src.stride : 0) + c8 * 8;
            const uint32_t dst = sw128_offset(key, c8);
            cp_async16_sh(stage + dst, src.k + off, ok ? 16 : 0);
            cp_async16_sh(stage + C::TILE + dst, src.v + off, ok ? 16 : 0);
        }
        cp_async_commit();
        pr.issued++;
        if (pr.issued - pr.signalled > C::LAG) {
            cp_async_wait<C::LAG>();
            ws_signal<C>(ring, pr);
        }
    }
}

/* Consumer warpgroup: one query tile's 64 rows of this warpgroup (dilated rows [qs, qe) of the
 * tile, this warpgroup's from qs + 64*wg), as wg_tile, but the K/V tiles come through the ring.
 * The warpgroups run apart within a branch (their tiles' rows, hence merges, are disjoint);
 * the caller puts a barrier of all consumers between branches, which cover the same positions. */
template <class C>
__device__ void ws_consume(const wg_src &src, const float *qbase, size_t qstride, int qs, int qe, int opos0, int ostep,
                           int P, float *out, size_t ld, float c, uint32_t qaddr, const ws_ring &ring, uint32_t &seq,
                           float *m_s, float *l_s)
{
    constexpr int BN = C::BN, S = C::STAGES;
    const int nkt = (src.kend - src.kbeg + BN - 1) / BN;
    if (nkt <= 0) return;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int qs_w = qs + 64 * wg, qe_w = min(qe, qs_w + 64);
    const int wrow = qs_w + warp * 16 + g;
    qaddr += wg * C::Q_BYTES;
    named_sync(2 + wg, 128); /* every warp's products of the last tile are done with this Q buffer */
#pragma unroll
    for (int u = 0; u < 64 * 8 / 128; u++) {
        const int f = tid + u * 128, row = f / 8, c8 = f % 8, x = qs_w + row;
        float4 a = make_float4(0, 0, 0, 0), b = a;
        if (x < qe_w) {
            const float4 *qr = reinterpret_cast<const float4 *>(qbase + (size_t)x * qstride + c8 * 8);
            a = __ldcs(qr), b = __ldcs(qr + 1);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(qaddr + sw128_offset(row, c8)),
                     "r"(pack_bf16x2(a.x, a.y)), "r"(pack_bf16x2(a.z, a.w)), "r"(pack_bf16x2(b.x, b.y)),
                     "r"(pack_bf16x2(b.z, b.w))
                     : "memory");
    }
    fence_proxy_async();
    named_sync(2 + wg, 128); /* the warpgroup's Q tile is complete */

    float acc[WG_D / 2];
#pragma unroll
    for (int i = 0; i < WG_D / 2; i++) acc[i] = 0;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
    const int qwin = qs_w / src.win, qlast = max(qe_w, qs_w + 1) - 1;
    const bool qwin_same = qwin == qlast / src.win;
    const int wlo = qwin * src.win, whi = min(wlo + src.win, src.kend);
    const int seen_hi = min(min(src.kend, (qlast / src.win + 1) * src.win), src.causal ? qlast + 1 : src.kend);
    /* the tiles this warpgroup computes are [lo, hi): the others it only waits for and releases */
    int lo = 0, hi = 0;
    if (qe_w > qs_w) {
        lo = max(0, (wlo - src.kbeg) / BN);
        hi = min(nkt, (seen_hi - src.kbeg + BN - 1) / BN);
    }
    auto wait_full = [&](int it) {
        const uint32_t j = seq + it;
        mbar_wait(ring.full + 8 * (j % S), (j / S) & 1);
    };
    auto release = [&](int it) {
        __syncwarp();
        if (lane == 0) mbar_arrive(ring.empty + 8 * ((seq + it) % S));
    };
    for (int it = 0; it < lo; it++) wait_full(it), release(it);
    float s[BN / 2];
    uint32_t pa[BN / 16][4];
    const uint32_t *no_qf = nullptr;
    auto need_mask = [&](int k0) {
        return !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
    };
    if constexpr (!C::OVERLAP) {
        for (int it = lo; it < hi; it++) {
            wait_full(it);
            const int k0 = src.kbeg + it * BN;
            const uint32_t kaddr = ring.kv + ((seq + it) % S) * C::STAGE;
            wg_qk_wait<BN, true>(s, reinterpret_cast<const uint32_t(*)[4]>(no_qf), qaddr, kaddr);
            float base[2];
            wg_softmax_max<BN>(s, k0, src, wrow, need_mask(k0), c, mrow, lrow, acc, base);
            wg_softmax_exp<BN>(s, c, base, lrow, pa);
            wg_pv_wait<BN>(acc, pa, kaddr + C::TILE);
            release(it);
        }
    } else if constexpr (C::OVERLAP == 2) {
        /* FlashAttention-3's order: S of tile it and P V of tile it-1 in flight together; the
         * softmax of tile it runs under P V (it-1); O is rescaled once that is done. P in two
         * register sets used in turn (P V (it-1) still reads one while the other is written). */
        uint32_t pb[BN / 16][4];
        /* the softmax of S (tile it, in s): P into pcur; O is rescaled after P V (it-1) is done */
        auto softmax = [&](uint32_t(*pcur)[4], int it, bool pv_pending) {
            const int k0 = src.kbeg + it * BN;
            float base[2], corr[2];
            wg_softmax_max<BN, false>(s, k0, src, wrow, need_mask(k0), c, mrow, lrow, acc, base, corr);
            wg_softmax_exp<BN>(s, c, base, lrow, pcur);
            if (pv_pending) {
                wgmma_wait<0>(); /* P V of tile it-1 */
                reg_fence<WG_D / 2>(acc);
                release(it - 1);
            }
#pragma unroll
            for (int j = 0; j < WG_D / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[4 * j + e] *= corr[e >> 1];
        };
        /* every wgmma outside data-dependent branches: ptxas serializes them otherwise (C7520) */
        auto step = [&](uint32_t(*pcur)[4], uint32_t(*pprev)[4], int it) {
            wait_full(it);
            wgmma_fence();
            wg_qk<BN, true>(s, reinterpret_cast<const uint32_t(*)[4]>(no_qf), qaddr, ring.kv + ((seq + it) % S) * C::STAGE);
            wgmma_commit();
            wg_pv<BN>(acc, pprev, ring.kv + ((seq + it - 1) % S) * C::STAGE + C::TILE);
            wgmma_commit();
            wgmma_wait<1>(); /* S of tile it */
            reg_fence<BN / 2>(s);
            softmax(pcur, it, true);
        };
        auto last_pv = [&](uint32_t(*plast)[4]) {
            wg_pv_wait<BN>(acc, plast, ring.kv + ((seq + hi - 1) % S) * C::STAGE + C::TILE);
            release(hi - 1);
        };
        if (lo < hi) {
            wait_full(lo);
            wg_qk_wait<BN, true>(s, reinterpret_cast<const uint32_t(*)[4]>(no_qf), qaddr, ring.kv + ((seq + lo) % S) * C::STAGE);
            softmax(pa, lo, false);
            int it = lo + 1;
            for (; it + 1 < hi; it += 2) {
                step(pb, pa, it);
                step(pa, pb, it + 1);
            }
            if (it < hi) {
                step(pb, pa, it);
                last_pv(pb);
            } else {
                last_pv(pa);
            }
        }
    } else if (lo < hi) {
        float s_odd[BN / 2];
        wait_full(lo);
        wg_qk_wait<BN, true>(s, reinterpret_cast<const uint32_t(*)[4]>(no_qf), qaddr, ring.kv + ((seq + lo) % S) * C::STAGE);
        auto step = [&](float *cur, float *next, int it) {
            const int k0 = src.kbeg + it * BN;
            const uint32_t kaddr = ring.kv + ((seq + it) % S) * C::STAGE;
            float base[2];
            wg_softmax_max<BN>(cur, k0, src, wrow, need_mask(k0), c, mrow, lrow, acc, base);
            if (it + 1 < hi) { /* next S on the tensor cores while this thread does the exps */
                wait_full(it + 1);
                wgmma_fence();
                wg_qk<BN, true>(next, reinterpret_cast<const uint32_t(*)[4]>(no_qf), qaddr,
                                ring.kv + ((seq + it + 1) % S) * C::STAGE);
                wgmma_commit();
            }
            wg_softmax_exp<BN>(cur, c, base, lrow, pa);
            wg_pv_wait<BN>(acc, pa, kaddr + C::TILE);
            reg_fence<BN / 2>(next);
            release(it);
        };
        for (int it = lo; it < hi; it += 2) {
            step(s, s_odd, it);
            if (it + 1 < hi) step(s_odd, s, it + 1);
        }
    }
    for (int it = max(lo, hi); it < nkt; it++) wait_full(it), release(it);
    seq += nkt;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int x = wrow + 8 * hr;
        merge_tile_row<WG_D>(out, ld, t, m_s, l_s, x < qe, opos0 + x * ostep - P, P, mrow[hr], lrow[hr],
                             [&](int j) { return make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]); });
    }
}
#endif /* SF_WGMMA_ENABLED */

/* Warp-specialized variants: BN keys a tile, STAGES ring slots, OVERLAP as in wg_cfg; NWG
 * consumer warpgroups (BM = 64*NWG query rows share each K/V tile), Q in shared memory,
 * evict-first float32 traffic, one CTA a multiprocessor. REGS 0: a producer warp, registers as
 * ptxas gives them (it caps 288 threads as 384: 168); else a producer warpgroup (one warp of it
 * copies) that hands registers to the consumers by setmaxnreg, REGS each (PRODUCER_REGS left to
 * the producer: 2 x 232 or, FlashAttention-3's split at d = 64, 3 x 160). */
template <int BN_, int STAGES_, int OVERLAP_, int REGS_ = 0, int NWG_ = 2>
struct ws_cfg {
    static constexpr int BN = BN_, STAGES = STAGES_, NWG = NWG_, LAG = STAGES_ - 2, REGS = REGS_;
    static constexpr int PRODUCER_REGS = NWG == 2 ? 40 : 24;
    static constexpr int OVERLAP = OVERLAP_;
    static constexpr bool QS = true, STREAM = true;
    static constexpr int CONSUMERS = 128 * NWG, THREADS = CONSUMERS + (REGS ? 128 : 32), BM = 64 * NWG;
    static constexpr int TILE = BN * WG_D * 2, STAGE = 2 * TILE, KV_BYTES = STAGES * STAGE;
    static constexpr int Q_BYTES = 64 * WG_D * 2;
    static_assert(BN == 64 || BN == 128, "S = Q K^T is one m64n64 or m64n128 product a k-step");
    static_assert(STAGES >= 3, "LAG = STAGES - 2 >= 1 keeps a tile in flight while the producer waits");
    static_assert(!REGS || 128 * PRODUCER_REGS + CONSUMERS * REGS <= 65536, "register file of one multiprocessor");
    static_assert(NWG == 2 || REGS, "three consumer warpgroups fit only with setmaxnreg");
};

#if SF_WGMMA_ENABLED
/* Calls tile(b, src, qbase, qstride, qs, qe, opos0, ostep) for every query tile of position block
 * [P, Pend) of head h, in the order every role of the CTA walks them: each branch b, then the
 * global tokens (b = br.count). */
template <class C, class F>
__device__ __forceinline__ void ws_walk(const sf_attention_desc &dd, const att_branches &br, const lab_staged &st,
                                        const float *q, int h, int P, int T, int Pend, F tile)
{
    const size_t ld = dd.ld;
    for (int b = 0; b < br.count; b++) {
        const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
        const int r = g.r, o = g.o, qa1 = g.qa1;
        wg_src src = wg_branch_src(st, h, g, dd.causal);
        for (int qs = P / r; qs < qa1; qs += C::BM) {
            const int qe = min(qs + C::BM, qa1);
            att_key_range(g, qs, qe, dd.causal, &src.kbeg, &src.kend);
            tile(b, src, q + (size_t)o * ld + h * WG_D, (size_t)r * ld, qs, qe, o, r);
        }
    }
    if (dd.n_global > 0) {
        const wg_src src = wg_global_src(st, h, dd.n_global);
        for (int qs = P; qs < Pend; qs += C::BM) tile(br.count, src, q + h * WG_D, ld, qs, min(qs + C::BM, Pend), 0, 1);
    }
}
#endif

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    attention_wgmma_ws(sf_attention_desc dd, att_branches br, int T, const float *q, lab_staged st, float *out,
                       const att_order ord)
{
#if SF_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t qaddr = (base + 1023) & ~1023u;
    ws_ring ring;
    ring.kv = qaddr + C::NWG * C::Q_BYTES;
    ring.full = ring.kv + C::KV_BYTES;
    ring.empty = ring.full + 8 * C::STAGES;
    float *m_s = reinterpret_cast<float *>(smem + (ring.empty + 8 * C::STAGES - base)), *l_s = m_s + T;
    if (threadIdx.x == 0)
        for (int i = 0; i < C::STAGES; i++) mbar_init(ring.full + 8 * i, 32), mbar_init(ring.empty + 8 * i, 4 * C::NWG);
    __syncthreads();
    const int h = blockIdx.x % dd.heads, e = blockIdx.x / dd.heads;
    const int nblocks = (dd.n + T - 1) / T;
    const int P = (ord.count ? ord.block[e] : nblocks - 1 - e) * T, Pend = min(P + T, dd.n);
    if (threadIdx.x >= C::CONSUMERS) {
        if constexpr (C::REGS > 0) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(C::PRODUCER_REGS));
        if (threadIdx.x >= C::CONSUMERS + 32) return; /* one warp of the producer warpgroup copies */
        ws_producer pr = {0, 0};
        ws_walk<C>(dd, br, st, q, h, P, T, Pend,
                   [&](int, const wg_src &src, const float *, size_t, int, int, int, int) { ws_produce<C>(src, ring, pr); });
        cp_async_wait<0>();
        while (pr.signalled < pr.issued) ws_signal<C>(ring, pr);
    } else {
        if constexpr (C::REGS > 0) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(C::REGS));
        const size_t ld = dd.ld;
        const float c = dd.scale * 1.4426950408889634f;
        float *outh = out + h * WG_D;
        uint32_t seq = 0;
        for (int i = threadIdx.x; i < T; i += C::CONSUMERS) m_s[i] = -INFINITY, l_s[i] = 0;
        named_sync(1, C::CONSUMERS);
        int branch = -1;
        ws_walk<C>(dd, br, st, q, h, P, T, Pend,
                   [&](int b, const wg_src &src, const float *qbase, size_t qstride, int qs, int qe, int opos0,
                       int ostep) {
                       if (b != branch) named_sync(1, C::CONSUMERS), branch = b; /* merges of one branch done */
                       ws_consume<C>(src, qbase, qstride, qs, qe, opos0, ostep, P, outh, ld, c, qaddr, ring, seq, m_s,
                                     l_s);
                   });
        named_sync(1, C::CONSUMERS); /* every merge is in */
        normalize_block_rows<WG_D, true>(outh, ld, P, Pend, l_s, C::CONSUMERS);
    }
#endif
}

/* One CTA (producer warp + 2 consumer warpgroups) a position block of one head, heaviest first. */
template <class C>
static int launch_wgmma_ws(const sf_attention_desc *desc, const att_branches &br, const float *q, const float *k,
                           const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    int rc = att_check_staged_inputs(desc, q, k, v);
    if (rc) return rc;
    long T;
    rc = att_block_positions(br, C::BM, &T);
    if (rc) return rc;
    const size_t smem = 1024 + C::NWG * C::Q_BYTES + C::KV_BYTES + 16 * C::STAGES + 2 * (size_t)T * sizeof(float);
    if (smem > 220 * 1024) return sf_error(SF_E_UNSUPPORTED, "cuda attention: block of %ld positions too large", T);
    cudaError_t err =
        cudaFuncSetAttribute(attention_wgmma_ws<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma ws): %s", cudaGetErrorString(err));
    lab_staged st;
    rc = att_stage_workspace(desc, k, v, ws, &st, stream, C::STREAM);
    if (rc) return rc;
    const int nblocks = (int)((desc->n + T - 1) / T);
    att_order ord;
    att_heaviest_first(desc, br, (int)T, nblocks, &ord);
    attention_wgmma_ws<C><<<(unsigned)nblocks * desc->heads, C::THREADS, smem, stream>>>(*desc, br, (int)T, q, st,
                                                                                          out, ord);
    return SF_OK;
}
int att_wgmma_ws_launch(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                        const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    switch (variant) {
    /*                                      BN STAGES OVERLAP REGS NWG */
    case 20: return launch_wgmma_ws<ws_cfg<64, 4, false>>(desc, br, q, k, v, out, ws, stream);
    case 21: return launch_wgmma_ws<ws_cfg<64, 4, true>>(desc, br, q, k, v, out, ws, stream);
    case 22: return launch_wgmma_ws<ws_cfg<128, 3, false>>(desc, br, q, k, v, out, ws, stream);
    case 23: return launch_wgmma_ws<ws_cfg<64, 4, true, 232>>(desc, br, q, k, v, out, ws, stream);
    case 24: return launch_wgmma_ws<ws_cfg<128, 3, false, 160, 3>>(desc, br, q, k, v, out, ws, stream);
    case 25: return launch_wgmma_ws<ws_cfg<64, 4, false, 160, 3>>(desc, br, q, k, v, out, ws, stream);
    /* OVERLAP 2: FlashAttention-3's order (softmax of tile it under P V of tile it-1) */
    case 26: return launch_wgmma_ws<ws_cfg<64, 4, 2>>(desc, br, q, k, v, out, ws, stream);
    case 27: return launch_wgmma_ws<ws_cfg<128, 3, 2, 232>>(desc, br, q, k, v, out, ws, stream);
    case 28: return launch_wgmma_ws<ws_cfg<64, 4, 2, 160, 3>>(desc, br, q, k, v, out, ws, stream);
    default: return sf_error(SF_E_INVAL, "cuda attention: no warp-specialized wgmma variant %d", variant);
    }
}
