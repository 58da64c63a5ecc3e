/* The staged attention kernel (SPEC 3 and 5; reference: sf_cpu_attention): bf16 K/V from the
 * workspace's pre-pass on mma.sync m16n8k16. Its tile shape is a template: attention_staged.cu
 * instantiates the one the product runs, the lab (bench/lab/attention/) the others it measured.
 *
 * Why a workspace: the convert kernel (attention_convert.cu) re-reads float32 K/V from L2 for
 * every query tile and converts them in its inner loop, holding the next tile in registers; that
 * costs L2 bandwidth, registers (occupancy) and instructions per tile. Here a pre-pass converts
 * K, V and the global tokens once per call into bf16, head-major ([head][row][d]), so a dilated
 * branch's keys are rows o + r*x at a fixed stride of whole 2*d-byte lines and the main kernel
 * streams them with 16-byte cp.async straight into shared memory, STAGES tiles deep, no
 * conversion or register staging. Q stays float32: each query tile reads it once.
 *
 * A block owns T positions of one head, visits every branch's query tiles of them and then the
 * global tokens, and merges each finished tile into `out` by log-sum-exp, so no block depends
 * on another. Causal blocks differ in cost by ~10x; the host orders (position block, head)
 * items by their estimated query-key pairs, heaviest first, and the hardware's in-order block
 * dispatch then works as a longest-processing-time-first schedule. C++ (CUDA) only. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_STAGED_CUH
#define SEQFLOW_KERNELS_CUDA_ATTENTION_STAGED_CUH

#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "seqflow/error.h"


/* One tile's keys: dilated index x is row x of k/v (already offset to the head and to row o,
 * `stride` bf16 apart). Keys [kbeg, kend) are streamed; a key is masked for a query unless both
 * sit in the same window of `win` dilated rows and (causal) key <= query. */
struct kv_src {
    const __nv_bfloat16 *k, *v;
    size_t stride;
    int kbeg, kend, win, causal;
};

/* MT m16 row tiles per warp: each K/V fragment read from shared memory feeds MT products,
 * so MT = 2 halves the shared-memory bytes per FLOP (ldmatrix traffic binds at MT = 1). */
template <int D, int WARPS, int MT, int BN, int STAGES>
struct staged_cfg {
    static constexpr int THREADS = WARPS * 32;
    static constexpr int BM = WARPS * 16 * MT;
    static constexpr int PAD = D + 8; /* +16 bytes a row keeps ldmatrix conflict-free */
    static constexpr int CPR = D / 8; /* 16-byte chunks per row */
    static constexpr int PER_THREAD = BN * CPR / THREADS;
    static constexpr int STAGE = 2 * BN * PAD; /* bf16 elements: K tile then V tile */
    static constexpr size_t KV_BYTES = (size_t)STAGES * STAGE * sizeof(__nv_bfloat16);
    static_assert((BN * CPR) % THREADS == 0, "tile chunks must split evenly over the threads");
};

template <class C>
__device__ __forceinline__ void issue_tile(const kv_src &s, int k0, __nv_bfloat16 *stage)
{
    __nv_bfloat16 *ks = stage, *vs = stage + (C::STAGE / 2);
#pragma unroll
    for (int u = 0; u < C::PER_THREAD; u++) {
        const int f = threadIdx.x + u * C::THREADS, key = f / C::CPR, c8 = f % C::CPR;
        const int x = k0 + key;
        const bool ok = x < s.kend;
        const size_t off = (ok ? (size_t)x * s.stride : 0) + c8 * 8;
        cp_async16(ks + key * C::PAD + c8 * 8, s.k + off, ok ? 16 : 0);
        cp_async16(vs + key * C::PAD + c8 * 8, s.v + off, ok ? 16 : 0);
    }
}

/* One query tile: dilated rows [qs, qe), query row x at qbase + x*qstride (float32), output row
 * at position opos0 + x*ostep. Merges its partial softmax into out / m_s / l_s (indexed by
 * position - P). Every thread of the block calls it (it holds block barriers). */
template <int D, int WARPS, int MT, int BN, int STAGES>
__device__ void staged_tile(const kv_src &src, const float *qbase, size_t qstride, int qs, int qe, int opos0, int ostep,
                            int P, float *out, size_t ld, float c, __nv_bfloat16 *kv, float *m_s, float *l_s)
{
    using C = staged_cfg<D, WARPS, MT, BN, STAGES>;
    const int nkt = (src.kend - src.kbeg + BN - 1) / BN;
    if (nkt <= 0) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow = qs + warp * 16 * MT + g; /* this thread's rows: wrow + 16*mt and + 8 */

    /* start the key stream first: its latency hides behind the query loads */
#pragma unroll
    for (int p = 0; p < STAGES - 1; p++) {
        if (p < nkt) issue_tile<C>(src, src.kbeg + p * BN, kv + p * C::STAGE);
        cp_async_commit();
    }

    uint32_t qf[MT][D / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int x = wrow + 16 * mt + 8 * hr;
                float2 lo = make_float2(0, 0), hi = make_float2(0, 0);
                if (x < qe) {
                    const float *qr = qbase + (size_t)x * qstride + kc * 16 + 2 * t;
                    lo = __ldg(reinterpret_cast<const float2 *>(qr));
                    hi = __ldg(reinterpret_cast<const float2 *>(qr + 8));
                }
                qf[mt][kc][hr] = pack_bf16x2(lo.x, lo.y);
                qf[mt][kc][2 + hr] = pack_bf16x2(hi.x, hi.y);
            }
        }
    float acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < D / 8; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0;
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) mrow[mt][0] = mrow[mt][1] = -INFINITY, lrow[mt][0] = lrow[mt][1] = 0;

    const int qwin = qs / src.win;
    const bool qwin_same = qwin == (qe - 1) / src.win;
    __shared__ unsigned long long bad_slots[WARPS]; /* att_block_bad_keys */
    unsigned poison = 0; /* bit 2mt + hr: row wrow + 16mt + 8hr sees a key whose V is not finite */

    for (int it = 0; it < nkt; it++) {
        cp_async_wait<STAGES - 2>(); /* this thread's part of tile `it` has landed */
        __syncthreads();             /* everyone's has, and everyone is done with tile it-1 */
        {
            const int nt = it + STAGES - 1;
            if (nt < nkt) issue_tile<C>(src, src.kbeg + nt * BN, kv + (nt % STAGES) * C::STAGE);
            cp_async_commit();
        }
        const int k0 = src.kbeg + it * BN;
        const __nv_bfloat16 *ks = kv + (it % STAGES) * C::STAGE, *vs = ks + C::STAGE / 2;

        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BN / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t b[4];
                ldsm_x4(b, ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * C::PAD + kc * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * np], qf[mt][kc], b[0], b[1]);
                    mma_bf16(s[mt][2 * np + 1], qf[mt][kc], b[2], b[3]);
                }
            }
        }
        const bool need_mask = !qwin_same || k0 + BN > src.kend || (src.causal && k0 + BN - 1 > qs) ||
                               k0 / src.win != qwin || (k0 + BN - 1) / src.win != qwin;
        if (need_mask) {
            /* V's non-finite values to 0 before P V reads them, the rows that see their keys
             * poisoned (attention_mma.cuh) */
            const uint64_t bad =
                att_block_bad_keys<WARPS>(att_scrub_v_tile<BN, D, C::PAD, C::THREADS>(vs), bad_slots);
            if (bad)
#pragma unroll
                for (int r = 0; r < 2 * MT; r++)
                    poison |= (unsigned)att_row_sees(bad, k0, wrow + 8 * r, src.win, src.kend, src.causal) << r;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < BN / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int x = wrow + 16 * mt + 8 * (e >> 1), key = k0 + j * 8 + 2 * t + (e & 1);
                        const bool ok = key < src.kend && key / src.win == x / src.win && (!src.causal || key <= x);
                        if (!ok) s[mt][j][e] = -INFINITY;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hr], s[mt][j][2 * hr + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(mrow[mt][hr], mx * c);
                const float base = mnew == -INFINITY ? 0.0f : mnew;
                const float corr = fast_exp2(mrow[mt][hr] - base);
                mrow[mt][hr] = mnew;
                float sum = 0;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    s[mt][j][2 * hr] = fast_exp2(fmaf(s[mt][j][2 * hr], c, -base));
                    s[mt][j][2 * hr + 1] = fast_exp2(fmaf(s[mt][j][2 * hr + 1], c, -base));
                    sum += s[mt][j][2 * hr] + s[mt][j][2 * hr + 1];
                }
                lrow[mt][hr] = lrow[mt][hr] * corr + sum;
#pragma unroll
                for (int j = 0; j < D / 8; j++) acc[mt][j][2 * hr] *= corr, acc[mt][j][2 * hr + 1] *= corr;
            }
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack_bf16x2(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                a[mt][1] = pack_bf16x2(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                a[mt][2] = pack_bf16x2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                a[mt][3] = pack_bf16x2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, vs + (kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * C::PAD + dp * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_bf16(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
    }

    /* merge this tile's rows into the block's accumulators (out, m_s, l_s) */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int x = wrow + 16 * mt + 8 * hr;
            if (poison >> (2 * mt + hr) & 1)
#pragma unroll
                for (int j = 0; j < D / 8; j++) acc[mt][j][2 * hr] = acc[mt][j][2 * hr + 1] = NAN;
            merge_tile_row<D>(out, ld, t, m_s, l_s, x < qe, opos0 + x * ostep - P, P, mrow[mt][hr], lrow[mt][hr],
                              [&](int j) { return make_float2(acc[mt][j][2 * hr], acc[mt][j][2 * hr + 1]); });
        }
    __syncthreads(); /* m_s/l_s and the key stages are shared with the next tile */
}

template <int D, int WARPS, int MT, int BN, int STAGES, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    attention_staged(sf_attention_desc dd, att_branches br, int T, const float *q, const __nv_bfloat16 *kb,
                     const __nv_bfloat16 *vb, const __nv_bfloat16 *gkb, const __nv_bfloat16 *gvb, float *out,
                     const att_order ord)
{
    using C = staged_cfg<D, WARPS, MT, BN, STAGES>;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *kv = reinterpret_cast<__nv_bfloat16 *>(smem);
    float *m_s = reinterpret_cast<float *>(smem + C::KV_BYTES), *l_s = m_s + T;
    const int h = blockIdx.x % dd.heads, item = blockIdx.x / dd.heads;
    const int nblocks = (dd.n + T - 1) / T;
    const int P = (ord.count ? ord.block[item] : nblocks - 1 - item) * T;
    const int Pend = min(P + T, dd.n);
    const size_t ld = dd.ld;
    const float c = dd.scale * 1.4426950408889634f;
    float *outh = out + h * D;
    for (int i = threadIdx.x; i < T; i += C::THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
    __syncthreads();

    for (int b = 0; b < br.count; b++) {
        const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
        const int r = g.r, o = g.o, qa1 = g.qa1;
        kv_src src;
        src.k = kb + ((size_t)h * dd.n + o) * D;
        src.v = vb + ((size_t)h * dd.n + o) * D;
        src.stride = (size_t)r * D;
        src.win = g.win;
        src.causal = dd.causal;
        for (int qs = P / r; qs < qa1; qs += C::BM) {
            const int qe = min(qs + C::BM, qa1);
            att_key_range(g, qs, qe, dd.causal, &src.kbeg, &src.kend);
            staged_tile<D, WARPS, MT, BN, STAGES>(src, q + (size_t)o * ld + h * D, (size_t)r * ld, qs, qe, o, r, P, outh,
                                              ld, c, kv, m_s, l_s);
        }
    }
    if (dd.n_global > 0) {
        kv_src src;
        src.k = gkb + (size_t)h * dd.n_global * D;
        src.v = gvb + (size_t)h * dd.n_global * D;
        src.stride = D;
        src.kbeg = 0;
        src.kend = dd.n_global;
        src.win = 1 << 30;
        src.causal = 0;
        for (int qs = P; qs < Pend; qs += C::BM)
            staged_tile<D, WARPS, MT, BN, STAGES>(src, q + h * D, ld, qs, min(qs + C::BM, Pend), 0, 1, P, outh, ld, c, kv,
                                              m_s, l_s);
    }
    normalize_block_rows<D>(outh, ld, P, Pend, l_s, C::THREADS);
}

/* ---- host side -------------------------------------------------------------------------- */

/* Checks, pre-pass and launch of one tile shape; the workspace is already validated. */
template <int D, int WARPS, int MT, int BN, int STAGES, int MINB>
static inline int launch_staged(const sf_attention_desc *desc, const att_branches &br, const float *q, const float *k,
                         const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    using C = staged_cfg<D, WARPS, MT, BN, STAGES>;
    int rc = att_check_staged_inputs(desc, q, k, v);
    if (rc) return rc;
    /* checked before the pre-pass, so that an unsupported shape launches nothing */
    long T;
    rc = att_block_positions(br, C::BM, &T);
    if (rc) return rc;
    const size_t smem = C::KV_BYTES + 2 * (size_t)T * sizeof(float);
    if (smem > 200 * 1024) return sf_error(SF_E_UNSUPPORTED, "cuda attention: block of %ld positions too large", T);
    cudaError_t err = cudaFuncSetAttribute(attention_staged<D, WARPS, MT, BN, STAGES, MINB>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention: %s", cudaGetErrorString(err));
    att_staged st;
    rc = att_stage_workspace(desc, k, v, ws, &st, stream);
    if (rc) return rc;
    const int nblocks = (int)((desc->n + T - 1) / T);
    att_order ord; /* copied into the launch parameters */
    att_heaviest_first(desc, br, (int)T, nblocks, &ord);
    attention_staged<D, WARPS, MT, BN, STAGES, MINB><<<(unsigned)nblocks * desc->heads, C::THREADS, smem, stream>>>(
        *desc, br, (int)T, q, st.kb, st.vb, st.gkb, st.gvb, out, ord);
    return SF_OK;
}

#endif
