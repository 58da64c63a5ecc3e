/* The convert attention kernel (SPEC 3 and 5; reference: sf_cpu_attention): bf16 tensor cores
 * without a workspace. Its tile shape is a template: attention_convert.cu instantiates the one
 * the product runs, the lab (bench/lab/attention/) the others it measured.
 *
 * One launch per segment. A block owns T consecutive positions of one head (T a multiple of
 * every dilation, so each branch's active rows in it are one run of dilated indices) and
 * visits, one after the other, every branch's query tiles of those positions and then the
 * global tokens. In dilated index space (position = o + r*index) a branch is plain dense
 * (causal) attention with windows of w/r rows, so a tile streams its keys straight from
 * K/V with row stride r*ld: no gather copy. Keys are converted from float32 to bf16 as they are
 * staged in shared memory (double buffered, the next tile's loads in flight in registers during
 * the current tile's math); S = Q K^T and O += P V run on mma.sync m16n8k16 with float32
 * accumulators, the online softmax in registers (log2 domain). A finished tile's partial
 * state (O unnormalized, max, sum) is merged into `out` by log-sum-exp; out's rows belong to
 * this block alone, so `out` itself is the accumulator and the per-position max and sum live
 * in shared memory; a last pass divides by the sum (or writes 0 where nothing was attended).
 * C++ (CUDA) only. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_CONVERT_CUH
#define SEQFLOW_KERNELS_CUDA_ATTENTION_CONVERT_CUH

#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "kernels/cuda/attention_mma.cuh"
#include "seqflow/backend.h"
#include "seqflow/error.h"

/* Where one tile's rows come from: dilated index x is row o + r*x of q/k/v (stride ld), or
 * row x of the global tokens. Keys [kbeg, kend) are streamed; a key is masked for a query
 * unless both sit in the same window of `win` dilated rows and (causal) key <= query. */
struct tile_src {
    const float *kbase, *vbase; /* row 0 of the key source, head column applied */
    size_t kstride;             /* floats between consecutive keys */
    int kbeg, kend, win, causal;
};

template <int D, int WARPS, int BN>
struct fused_cfg {
    static constexpr int THREADS = WARPS * 32;
    static constexpr int BM = WARPS * 16;
    static constexpr int PAD = D + 8; /* bf16 per staged row: +16 bytes keeps ldmatrix conflict-free */
    static constexpr int LOADS = BN * D / 4 / THREADS; /* float4 per thread per tensor per key tile */
    static constexpr size_t KV_BYTES = 2 * 2 * BN * PAD * sizeof(__nv_bfloat16);
};

template <int D, int WARPS, int BN>
__device__ __forceinline__ void load_keys(const tile_src &src, int k0, float4 (&kr)[fused_cfg<D, WARPS, BN>::LOADS],
                                          float4 (&vr)[fused_cfg<D, WARPS, BN>::LOADS])
{
    using C = fused_cfg<D, WARPS, BN>;
#pragma unroll
    for (int u = 0; u < C::LOADS; u++) {
        int f = threadIdx.x + u * C::THREADS, key = f / (D / 4), c4 = f % (D / 4);
        int x = k0 + key;
        if (x < src.kend) {
            kr[u] = __ldg(reinterpret_cast<const float4 *>(src.kbase + (size_t)x * src.kstride) + c4);
            vr[u] = __ldg(reinterpret_cast<const float4 *>(src.vbase + (size_t)x * src.kstride) + c4);
        } else { /* zeros, not garbage: P = 0 times a NaN would still be NaN */
            kr[u] = make_float4(0, 0, 0, 0);
            vr[u] = make_float4(0, 0, 0, 0);
        }
    }
}

/* The loaded keys into shared memory as bf16. `check` (a tile that needs the mask): returns
 * nonzero when a V value of this thread's share is not finite (scrub_staged_v then scrubs). */
template <int D, int WARPS, int BN>
__device__ __forceinline__ uint32_t stage_keys(__nv_bfloat16 *ks, __nv_bfloat16 *vs,
                                               const float4 (&kr)[fused_cfg<D, WARPS, BN>::LOADS],
                                               const float4 (&vr)[fused_cfg<D, WARPS, BN>::LOADS], bool check)
{
    using C = fused_cfg<D, WARPS, BN>;
    uint32_t top = 0;
#pragma unroll
    for (int u = 0; u < C::LOADS; u++) {
        int f = threadIdx.x + u * C::THREADS, key = f / (D / 4), c4 = f % (D / 4);
        *reinterpret_cast<uint2 *>(ks + key * C::PAD + c4 * 4) =
            make_uint2(pack_bf16x2(kr[u].x, kr[u].y), pack_bf16x2(kr[u].z, kr[u].w));
        const uint32_t v0 = pack_bf16x2(vr[u].x, vr[u].y), v1 = pack_bf16x2(vr[u].z, vr[u].w);
        if (check) top |= att_bf16x2_nonfinite(v0) | att_bf16x2_nonfinite(v1);
        *reinterpret_cast<uint2 *>(vs + key * C::PAD + c4 * 4) = make_uint2(v0, v1);
    }
    return top;
}

/* After stage_keys found a non-finite V value in this thread's share: those values set to 0
 * (attention_mma.cuh says why; its own writes, so no barrier before); returns bit key set for
 * each key row of the share that held one. */
template <int D, int WARPS, int BN>
__device__ __forceinline__ uint64_t scrub_staged_v(__nv_bfloat16 *vs)
{
    using C = fused_cfg<D, WARPS, BN>;
    static_assert(BN <= 64, "a tile's keys fit the 64-bit mask");
    uint64_t bad = 0;
#pragma unroll
    for (int u = 0; u < C::LOADS; u++) {
        const int f = threadIdx.x + u * C::THREADS, key = f / (D / 4), c4 = f % (D / 4);
        if (att_scrub8(reinterpret_cast<uint2 *>(vs + key * C::PAD + c4 * 4))) bad |= 1ull << key;
    }
    return bad;
}

/* One query tile: dilated rows [qs, qe), query row x at qbase + x*qstride, output row at
 * position opos0 + x*ostep. Merges its partial softmax into out / m_s / l_s (indexed by
 * position - P). Every thread of the block calls it (it holds block barriers). */
template <int D, int WARPS, int BN>
__device__ void attend_tile(const tile_src &src, const float *qbase, size_t qstride, int qs, int qe, int opos0,
                            int ostep, int P, float *out, size_t ld, float c, __nv_bfloat16 *kv, float *m_s,
                            float *l_s)
{
    using C = fused_cfg<D, WARPS, BN>;
    const int nkt = (src.kend - src.kbeg + BN - 1) / BN;
    if (nkt <= 0) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = qs + warp * 16 + g; /* this thread's rows: row0 and row0 + 8 */

    uint32_t qf[D / 16][4];
    att_load_q_frags<D>(qf, qbase, qstride, row0, qe, t);
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};

    /* whole-tile test for the mask: all queries in one window and no key tile past it */
    const int qlast = qe - 1;
    const int qwin_same = (qs / src.win) == (qlast / src.win);

    const auto needs_mask = [&](int k0) {
        return !qwin_same || k0 + BN > src.kend || (src.causal && k0 + BN - 1 > qs) ||
               (k0 / src.win) != (qs / src.win) || ((k0 + BN - 1) / src.win) != (qs / src.win);
    };
    static_assert(C::BM <= C::THREADS, "a thread a query row");
    __shared__ unsigned long long bad_slots[2 * WARPS]; /* two tiles' keys, one word a warp */
    /* bit x - qs: query row x sees a key whose V is not finite (the previous query tile's last
     * barrier let go of it) */
    __shared__ unsigned long long poison_s[(C::BM + 63) / 64];
    if (threadIdx.x < (C::BM + 63) / 64) poison_s[threadIdx.x] = 0;
    /* a staged tile to the block (a barrier); one that needs the mask was scrubbed: the rows that
     * see its flagged keys are poisoned (made NaN at the merge), thread i judging row qs + i */
    const auto publish = [&](int k0, __nv_bfloat16 *vs, uint32_t found) {
        if (!needs_mask(k0)) {
            __syncthreads();
            return;
        }
        const uint64_t mine = found ? scrub_staged_v<D, WARPS, BN>(vs) : 0;
        const uint32_t lo = __reduce_or_sync(0xffffffffu, (uint32_t)mine);
        const uint32_t hi = __reduce_or_sync(0xffffffffu, (uint32_t)(mine >> 32));
        unsigned long long *slots = bad_slots + (k0 / BN & 1) * WARPS;
        if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = ((unsigned long long)hi << 32) | lo;
        __syncthreads();
        uint64_t bad = 0;
#pragma unroll
        for (int w = 0; w < WARPS; w++) bad |= slots[w];
        if (bad && threadIdx.x < C::BM && att_row_sees(bad, k0, qs + threadIdx.x, src.win, src.kend, src.causal))
            atomicOr(&poison_s[threadIdx.x / 64], 1ull << (threadIdx.x % 64));
    };

    float4 kr[C::LOADS], vr[C::LOADS];
    load_keys<D, WARPS, BN>(src, src.kbeg, kr, vr);
    publish(src.kbeg, kv + BN * C::PAD,
            stage_keys<D, WARPS, BN>(kv, kv + BN * C::PAD, kr, vr, needs_mask(src.kbeg)));

    for (int it = 0; it < nkt; it++) {
        const int k0 = src.kbeg + it * BN;
        __nv_bfloat16 *ks = kv + (it & 1) * 2 * BN * C::PAD, *vs = ks + BN * C::PAD;
        if (it + 1 < nkt) load_keys<D, WARPS, BN>(src, k0 + BN, kr, vr);

        float s[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) {
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t b[4];
                ldsm_x4(b, ks + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * C::PAD + kc * 16 + ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * np], qf[kc], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qf[kc], b[2], b[3]);
            }
        }
        if (needs_mask(k0)) {
            /* row x keeps the keys [lo, hi) of its window, cut at kend and (causal) at x */
            int lo[2], hi[2];
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int x = row0 + 8 * hr;
                lo[hr] = x / src.win * src.win;
                hi[hr] = min(lo[hr] + src.win, src.kend);
                if (src.causal) hi[hr] = min(hi[hr], x + 1);
            }
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + j * 8 + 2 * t + (e & 1);
                    if (key < lo[e >> 1] || key >= hi[e >> 1]) s[j][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrow[hr], mx * c);
            const float base = mnew == -INFINITY ? 0.0f : mnew;
            const float corr = fast_exp2(mrow[hr] - base);
            mrow[hr] = mnew;
            float sum = 0;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                s[j][2 * hr] = fast_exp2(fmaf(s[j][2 * hr], c, -base));
                s[j][2 * hr + 1] = fast_exp2(fmaf(s[j][2 * hr + 1], c, -base));
                sum += s[j][2 * hr] + s[j][2 * hr + 1];
            }
            lrow[hr] = lrow[hr] * corr + sum;
#pragma unroll
            for (int j = 0; j < D / 8; j++) acc[j][2 * hr] *= corr, acc[j][2 * hr + 1] *= corr;
        }
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            uint32_t a[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                             pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_t(b, vs + (kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * C::PAD + dp * 16 + (lane >> 4) * 8);
                mma_bf16(acc[2 * dp], a, b[0], b[1]);
                mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
            }
        }
        if (it + 1 < nkt) {
            __nv_bfloat16 *kn = kv + ((it + 1) & 1) * 2 * BN * C::PAD;
            publish(k0 + BN, kn + BN * C::PAD,
                    stage_keys<D, WARPS, BN>(kn, kn + BN * C::PAD, kr, vr, needs_mask(k0 + BN)));
        } else {
            __syncthreads();
        }
    }

    /* merge this tile's rows into the block's accumulators (the loop's last barrier published
     * poison_s) */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int x = row0 + 8 * hr;
        if (poison_s[(x - qs) / 64] >> ((x - qs) % 64) & 1)
#pragma unroll
            for (int j = 0; j < D / 8; j++) acc[j][2 * hr] = acc[j][2 * hr + 1] = NAN;
        merge_tile_row<D>(out, ld, t, m_s, l_s, x < qe, opos0 + x * ostep - P, P, mrow[hr], lrow[hr],
                          [&](int j) { return make_float2(acc[j][2 * hr], acc[j][2 * hr + 1]); });
    }
    __syncthreads();
}

template <int D, int WARPS, int BN>
__global__ void __launch_bounds__(WARPS * 32) attention_fused(sf_attention_desc dd, att_branches br, int T,
                                                              const float *q, const float *k, const float *v,
                                                              float *out)
{
    using C = fused_cfg<D, WARPS, BN>;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16 *kv = reinterpret_cast<__nv_bfloat16 *>(smem);
    float *m_s = reinterpret_cast<float *>(smem + C::KV_BYTES), *l_s = m_s + T;
    const int h = blockIdx.y;
    /* the last positions of a causal window do the most work: start them first */
    const int P = (gridDim.x - 1 - blockIdx.x) * T;
    const int Pend = min(P + T, dd.n);
    const size_t ld = dd.ld;
    const float c = dd.scale * 1.4426950408889634f;
    float *outh = out + h * D;
    for (int i = threadIdx.x; i < T; i += C::THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
    __syncthreads();

    for (int b = 0; b < br.count; b++) {
        const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
        const int r = g.r, o = g.o, qa1 = g.qa1;
        for (int qs = P / r; qs < qa1; qs += C::BM) {
            const int qe = min(qs + C::BM, qa1);
            tile_src src;
            src.kbase = k + (size_t)o * ld + h * D;
            src.vbase = v + (size_t)o * ld + h * D;
            src.kstride = (size_t)r * ld;
            att_key_range(g, qs, qe, dd.causal, &src.kbeg, &src.kend);
            src.win = g.win;
            src.causal = dd.causal;
            attend_tile<D, WARPS, BN>(src, q + (size_t)o * ld + h * D, (size_t)r * ld, qs, qe, o, r, P, outh, ld, c,
                                      kv, m_s, l_s);
        }
    }
    if (dd.n_global > 0) {
        tile_src src;
        src.kbase = dd.gk + h * D;
        src.vbase = dd.gv + h * D;
        src.kstride = dd.global_ld;
        src.kbeg = 0;
        src.kend = dd.n_global;
        src.win = 1 << 30;
        src.causal = 0;
        for (int qs = P; qs < Pend; qs += C::BM)
            attend_tile<D, WARPS, BN>(src, q + h * D, ld, qs, min(qs + C::BM, Pend), 0, 1, P, outh, ld, c, kv, m_s,
                                      l_s);
    }
    normalize_block_rows<D>(outh, ld, P, Pend, l_s, C::THREADS);
}

/* ---- host side -------------------------------------------------------------------------- */

template <int D, int WARPS, int BN>
static inline int launch_fused(const sf_attention_desc *desc, const att_branches &br, const float *q, const float *k,
                        const float *v, float *out, cudaStream_t stream)
{
    using C = fused_cfg<D, WARPS, BN>;
    if (desc->ld % 4 || (desc->n_global > 0 && desc->global_ld % 4))
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: row strides must be multiples of 4 floats (ld %d)",
                        desc->ld);
    /* T: a multiple of every dilation holding a full query tile of the most dilated branch */
    long lcm = 1;
    int rmax = 1;
    for (int b = 0; b < br.count; b++) {
        lcm = lcm / att_gcd((int)lcm, br.dilation[b]) * br.dilation[b];
        if (lcm > (1 << 20)) return sf_error(SF_E_UNSUPPORTED, "cuda attention: dilations too varied");
        if (br.dilation[b] > rmax) rmax = br.dilation[b];
    }
    long T = ((long)C::BM * rmax + lcm - 1) / lcm * lcm;
    if (T > 8192 && lcm <= 8192) T = (8192 / lcm) * lcm;
    size_t smem = C::KV_BYTES + 2 * (size_t)T * sizeof(float);
    if (smem > 200 * 1024) return sf_error(SF_E_UNSUPPORTED, "cuda attention: block of %ld positions too large", T);
    cudaError_t err = cudaFuncSetAttribute(attention_fused<D, WARPS, BN>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention: %s", cudaGetErrorString(err));
    dim3 grid((unsigned)((desc->n + T - 1) / T), (unsigned)desc->heads);
    attention_fused<D, WARPS, BN><<<grid, C::THREADS, smem, stream>>>(*desc, br, (int)T, q, k, v, out);
    return SF_OK;
}

#endif
