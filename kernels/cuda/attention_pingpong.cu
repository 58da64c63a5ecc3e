/* Dilated local attention on Hopper in FlashAttention-3's and cuDNN's layout (sm_90a, d = 64, bf16
 * q/k/v read in place; SPEC 3 and 5); reference: sf_cpu_attention. sf_cuda_attention runs it where
 * it runs and has at least one item a multiprocessor (sf_cuda_attention_pingpong_preferred), and
 * the wgmma kernel (attention_wgmma.cu) elsewhere.
 *
 * The work is the wgmma kernel's: an item is T positions of one head (att_block_positions with
 * 128-row query tiles), whose every branch's query tiles and then the global tokens' are merged
 * into `out` by log-sum-exp (m_s, l_s in shared memory), then normalized, or mixed with the
 * memory's retrieval (the fused mix); with one branch without dilation and no global tokens
 * each row has one tile, which stores it normalized. What changes is who does what:
 * - one persistent CTA a multiprocessor (384 threads) walks items, heaviest first, in a snake
 *   (CTA b takes item b of the first round, G - 1 - b of the second, ...), so the rounds' costs
 *   even out;
 * - warpgroup 0 is the producer: one thread loads each query tile's 128 rows of Q and its keys'
 *   K/V tiles of 128 rows by the bulk tensor copy engine (a tensor map per branch and head
 *   offset: dilated row x of head offset o is row o + x r, rows r ld apart), Q into two buffers
 *   and K/V into a ring of STAGES slots, each completing on an mbarrier; the rest of the
 *   warpgroup gives its registers away (setmaxnreg);
 * - warpgroups 1 and 2 own a query tile's rows 0-63 and 64-127 and read the same K/V tiles. They
 *   take turns on the tensor cores (named barriers, "ping-pong"): in its turn a warpgroup issues
 *   P V of its last tile and S = Q K^T of this one, hands the turn over, and computes its softmax
 *   while the other's products run. A slot goes back to the producer once both warpgroups' P V
 *   of it is done, a Q buffer once both warpgroups' last S of the tile is.
 * Non-finite values of V (attention_mma.cuh): on a tile some row of the 128 sees only in part,
 * warpgroup 1 sets them to 0 in the slot during its softmax (before either warpgroup's P V of
 * that tile, which comes in their next turns) and leaves the keys it found for warpgroup 2;
 * each then makes NaN its rows that see such a key, as the wgmma kernel does.
 * The variants this structure was chosen against are in bench/lab/ (attention_pingpong_dense.cu, the
 * dense form first measured; bench/lab/ATTENTION_NOTES.md). */
#include <math.h>
#include <stdint.h>
#include <cuda.h>
#include <cuda_bf16.h>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma_tile.cuh"
#include "kernels/cuda/compressive_memory_stream.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_early.cuh"
#include "kernels/cuda/tensor_map.h"
#include "seqflow/error.h"

namespace {
constexpr int D = 64, BM = 128, BN = 128, THREADS = 384, CONSUMERS = 256, STAGES = 3;
constexpr int Q_BYTES = BM * D * 2; /* a query tile: 128 rows of 128 bytes */
constexpr int TILE = BN * D * 2;    /* a K or a V tile */
constexpr int WG_Q = 64 * 128;      /* a consumer's 64 rows of Q */
constexpr int MAPS = 8;             /* (branch, head offset) pairs: the dilations' sum */
constexpr int MIX_BYTES = 4 * 8 * 32 * 8 + 64 * 4; /* M_h's fragments and z_h (stage_stream_mix) */
/* named barriers: 1 and 2 a consumer's turn, 3 warpgroup 1 alone, 4 both consumers */
constexpr int BAR_WG1 = 3, BAR_CONSUMERS = 4;

/* The copy engine's maps: q, k and v of every (branch, head offset), rows of the dilated index;
 * q of every position (the global tokens' queries); the staged global tokens' K and V. */
struct pp_maps {
    CUtensorMap q[MAPS], k[MAPS], v[MAPS], q_all, gk, gv;
    signed char first[SF_ATT_MAX_BRANCHES]; /* branch b, head offset o: maps first[b] + o */
};

/* Shared memory after the 1024-aligned base: Q buffers, the ring, the mix's M_h and z_h, the
 * barriers, the bad keys of each slot, then m_s and l_s (T each). */
struct pp_smem {
    static constexpr int KV = 2 * Q_BYTES;
    static constexpr int MIX = KV + STAGES * 2 * TILE;
    static constexpr int BARS = MIX + MIX_BYTES;         /* q_full[2] q_empty[2] kv_full[S] kv_empty[S] */
    static constexpr int BAD = BARS + 8 * (4 + 2 * STAGES); /* 2 x u64 a slot */
    static constexpr int ML = BAD + 16 * STAGES;
    static size_t bytes(long T) { return 1024 + ML + 2 * (size_t)T * sizeof(float); }
};

/* The CTA's k-th item (position block, head) of the heaviest-first list, for a grid of G CTAs:
 * item k G + b in round k, k G + G - 1 - b in odd rounds (a snake, so that the rounds' costs even
 * out over the CTAs); -1 past the end. */
__device__ __forceinline__ int pp_item(int k, int items)
{
    const int G = gridDim.x, round = k, i = round * G + (round & 1 ? G - 1 - (int)blockIdx.x : (int)blockIdx.x);
    return i < items ? i : -1;
}

/* Walks the query tiles of head h's position block [P, P + T) in the order every role takes them: each branch, then the
 * global tokens (b = br.count), calling tile(b, map, qs, qe, kbeg, kend, g) for the dilated query rows [qs, qe) and
 * keys [kbeg, kend) (g: the branch's rows; unused for the global tokens). Tiles with no keys are left out, by every
 * role alike. */
template <class F>
__device__ __forceinline__ void pp_walk(const sf_attention_desc &dd, const att_branches &br, const pp_maps &maps, int h,
                                        int P, int T, F tile)
{
    for (int b = 0; b < br.count; b++) {
        const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
        for (int qs = P / g.r; qs < g.qa1; qs += BM) {
            const int qe = min(qs + BM, g.qa1);
            int kbeg, kend;
            att_key_range(g, qs, qe, dd.causal, &kbeg, &kend);
            if (kend > kbeg) tile(b, maps.first[b] + g.o, qs, qe, kbeg, kend, g);
        }
    }
    if (dd.n_global > 0) {
        const int Pend = min(P + T, dd.n);
        att_branch_rows g = {1, 0, dd.n, 1 << 30, Pend};
        for (int qs = P; qs < Pend; qs += BM) tile(br.count, -1, qs, min(qs + BM, Pend), 0, dd.n_global, g);
    }
}

#if SF_WGMMA_ENABLED
/* Warpgroup 1's scrub of a V tile (attention_mma.cuh): non-finite values to 0 in the slot, the
 * keys that held any to bad[0..1] (bits of keys 0-63, 64-127). Its 128 threads take 8 chunks of
 * 16 bytes each: key rows tid / 8 + 16 u. */
__device__ __forceinline__ void pp_scrub(uint32_t vaddr, unsigned long long *bad, int tid)
{
    uint64_t mine[2] = {0, 0};
#pragma unroll
    for (int u = 0; u < BN / 16; u++) {
        const int key = tid / 8 + 16 * u;
        if (att_scrub16(vaddr + sw128_offset(key, tid % 8))) mine[key >> 6] |= 1ull << (key & 63);
    }
    fence_proxy_async(); /* the zeros, to the tensor cores' proxy */
#pragma unroll
    for (int w = 0; w < 2; w++) {
        const uint32_t lo = __reduce_or_sync(0xffffffffu, (uint32_t)mine[w]);
        const uint32_t hi = __reduce_or_sync(0xffffffffu, (uint32_t)(mine[w] >> 32));
        mine[w] = ((uint64_t)hi << 32) | lo;
    }
    if (tid == 0) bad[0] = bad[1] = 0;
    named_sync(BAR_WG1, 128);
    if ((tid & 31) == 0)
#pragma unroll
        for (int w = 0; w < 2; w++)
            if (mine[w]) atomicOr(&bad[w], (unsigned long long)mine[w]);
    named_sync(BAR_WG1, 128);
}
#endif

__global__ void __launch_bounds__(THREADS, 1)
    attention_pingpong(sf_attention_desc dd, att_branches br, int T, const __nv_bfloat16 *q, float *out,
                       const att_order ord, sf_cuda_attention_mix mix, int direct,
                       const __grid_constant__ pp_maps maps)
{
#if SF_WGMMA_ENABLED
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem), base = (raw + 1023) & ~1023u;
    unsigned char *gbase = smem + (base - raw);
    const uint32_t q_full = base + pp_smem::BARS, q_empty = q_full + 16, kv_full = q_empty + 16,
                   kv_empty = kv_full + 8 * STAGES;
    unsigned long long *bad_s = reinterpret_cast<unsigned long long *>(gbase + pp_smem::BAD);
    float *m_s = reinterpret_cast<float *>(gbase + pp_smem::ML), *l_s = m_s + T;
    const int nblocks = (dd.n + T - 1) / T, items = nblocks * dd.heads;
    if (threadIdx.x == 0) {
        /* freeing a Q buffer or a slot: lane 0 of each of the consumers' 8 warps (mbar_arrive_warp) */
        for (int b = 0; b < 2; b++) mbar_init(q_full + 8 * b, 1), mbar_init(q_empty + 8 * b, 8);
        for (int s = 0; s < STAGES; s++) mbar_init(kv_full + 8 * s, 1), mbar_init(kv_empty + 8 * s, 8);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    sf_wait_prior_grid(); /* launched early: q/k/v and the staged global tokens come from the kernels ahead */
    auto block_of = [&](int item) { return (ord.count ? ord.block[item / dd.heads] : nblocks - 1 - item / dd.heads) * T; };
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x != 0) return;
        uint32_t kt = 0, qt = 0;
        for (int k = 0, item; (item = pp_item(k, items)) >= 0; k++) {
            const int h = item % dd.heads, P = block_of(item);
            pp_walk(dd, br, maps, h, P, T, [&](int b, int m, int qs, int, int kbeg, int kend, const att_branch_rows &) {
                const bool global = b == br.count;
                const uint32_t qb = qt & 1;
                mbar_wait(q_empty + 8 * qb, ((qt >> 1) & 1) ^ 1);
                mbar_arrive_expect_tx(q_full + 8 * qb, Q_BYTES);
                tma_load_2d(base + qb * Q_BYTES, global ? &maps.q_all : &maps.q[m], h * D, qs, q_full + 8 * qb);
                qt++;
                for (int k0 = kbeg; k0 < kend; k0 += BN, kt++) {
                    const uint32_t s = kt % STAGES, slot = base + pp_smem::KV + s * 2 * TILE;
                    mbar_wait(kv_empty + 8 * s, ((kt / STAGES) & 1) ^ 1);
                    mbar_arrive_expect_tx(kv_full + 8 * s, 2 * TILE);
                    if (global) { /* head h's global tokens are rows h G .. of the staged ones */
                        tma_load_2d(slot, &maps.gk, 0, h * dd.n_global + k0, kv_full + 8 * s);
                        tma_load_2d(slot + TILE, &maps.gv, 0, h * dd.n_global + k0, kv_full + 8 * s);
                    } else {
                        tma_load_2d(slot, &maps.k[m], h * D, k0, kv_full + 8 * s);
                        tma_load_2d(slot + TILE, &maps.v[m], h * D, k0, kv_full + 8 * s);
                    }
                }
            });
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, tid = threadIdx.x - 128 * wg, ctid = threadIdx.x - 128;
    const int warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mine = 1 + cw, other = 2 - cw; /* named barriers: a consumer's turn */
    if (cw == 1) named_arrive(1, CONSUMERS); /* the first turn is warpgroup 1's */
    const float c = dd.scale * 1.4426950408889634f;
    const size_t ld = dd.ld;
    const uint32_t(*no_qf)[4] = nullptr;
    uint32_t kt = 0, qt = 0;
    for (int k = 0, item; (item = pp_item(k, items)) >= 0; k++) {
        const int h = item % dd.heads, P = block_of(item), Pend = min(P + T, dd.n);
        float *outh = out + h * D;
        for (int i = ctid; i < T; i += CONSUMERS) m_s[i] = -INFINITY, l_s[i] = 0;
        named_sync(BAR_CONSUMERS, CONSUMERS);
        int branch = -1;
        pp_walk(dd, br, maps, h, P, T,
                [&](int b, int, int qs, int qe, int kbeg, int kend, const att_branch_rows &gr) {
            if (b != branch) { /* the last branch's merges touched the same positions */
                if (branch >= 0) named_sync(BAR_CONSUMERS, CONSUMERS);
                branch = b;
            }
            const bool global = b == br.count;
            wg_src src; /* the masks' fields */
            src.k = src.v = nullptr, src.stride = 0;
            src.kbeg = kbeg, src.kend = kend, src.win = gr.win, src.causal = global ? 0 : dd.causal;
            const int opos0 = global ? 0 : gr.o, ostep = global ? 1 : gr.r;
            const uint32_t qb = qt & 1, qaddr = base + qb * Q_BYTES + cw * WG_Q;
            const int qs_w = qs + 64 * cw, qe_w = min(qe, qs_w + 64), wrow = qs_w + 16 * warp + g;
            /* tiles wholly inside the keys every row sees skip the mask; the scrub looks at tiles
             * some row of the 128 sees only in part */
            const int qlast_w = max(qe_w, qs_w + 1) - 1, qlast = max(qe, qs + 1) - 1;
            const int wlo = qs_w / src.win * src.win, whi = min(wlo + src.win, kend);
            const bool same_w = qs_w / src.win == qlast_w / src.win;
            const int clo = qs / src.win * src.win, chi = min(clo + src.win, kend);
            const bool same_c = qs / src.win == qlast / src.win;
            mbar_wait(q_full + 8 * qb, (qt >> 1) & 1);
            qt++;
            float acc[D / 2], s[BN / 2], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
            uint32_t pa[BN / 16][4];
#pragma unroll
            for (int e = 0; e < D / 2; e++) acc[e] = 0;
            unsigned poison = 0;
            uint32_t prev = 0;
            int prev_k0 = 0;
            bool prev_scrub = false;
            /* the rows of this thread that see a key flagged in slot `sl`'s bad keys (tile at k0) */
            auto poison_from = [&](uint32_t sl, int k0) {
                const unsigned long long b0 = bad_s[2 * sl], b1 = bad_s[2 * sl + 1];
                if (b0 | b1)
#pragma unroll
                    for (int hr = 0; hr < 2; hr++) {
                        const int x = wrow + 8 * hr;
                        poison |= (unsigned)(att_row_sees(b0, k0, x, src.win, kend, src.causal) ||
                                             att_row_sees(b1, k0 + 64, x, src.win, kend, src.causal))
                                  << hr;
                    }
            };
                /* after a tile's S: Q back when it was the last, the scrub, the softmax into P */
            auto after_s = [&](int k0, uint32_t sl, uint32_t slot) {
                if (k0 + BN >= kend) mbar_arrive_warp(q_empty + 8 * qb); /* the tile's last S is done: Q is free */
                const bool need_mask =
                    !same_w || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
                prev_scrub = !same_c || k0 < clo || k0 + BN > chi || (src.causal && k0 + BN - 1 > qs);
                if (prev_scrub && cw == 0) pp_scrub(slot + TILE, bad_s + 2 * sl, tid);
                float bmax[2];
                wg_softmax_max<BN, true, D>(s, k0, src, wrow, need_mask, c, mrow, lrow, acc, bmax);
                wg_softmax_exp<BN>(s, c, bmax, lrow, pa);
                prev = sl, prev_k0 = k0;
            };
            {   /* the first key tile: S alone (every wgmma outside data-dependent branches, or
                 * ptxas serializes them) */
                const uint32_t sl = kt % STAGES, slot = base + pp_smem::KV + sl * 2 * TILE;
                mbar_wait(kv_full + 8 * sl, (kt / STAGES) & 1);
                named_sync(mine, CONSUMERS);
                wgmma_fence();
                wg_qk<BN, true, D>(s, no_qf, qaddr, slot);
                wgmma_commit();
                named_arrive(other, CONSUMERS);
                wgmma_wait<0>();
                reg_fence<BN / 2>(s);
                kt++;
                after_s(kbeg, sl, slot);
            }
            for (int k0 = kbeg + BN; k0 < kend; k0 += BN, kt++) {
                const uint32_t sl = kt % STAGES, slot = base + pp_smem::KV + sl * 2 * TILE;
                mbar_wait(kv_full + 8 * sl, (kt / STAGES) & 1);
                named_sync(mine, CONSUMERS);
                wgmma_fence();
                wg_pv<BN, D>(acc, pa, base + pp_smem::KV + prev * 2 * TILE + TILE);
                wg_qk<BN, true, D>(s, no_qf, qaddr, slot);
                wgmma_commit();
                named_arrive(other, CONSUMERS);
                wgmma_wait<0>();
                reg_fence<BN / 2>(s);
                reg_fence<D / 2>(acc);
                if (prev_scrub) poison_from(prev, prev_k0);
                mbar_arrive_warp(kv_empty + 8 * prev);
                after_s(k0, sl, slot);
            }
            named_sync(mine, CONSUMERS);
            wgmma_fence();
            wg_pv<BN, D>(acc, pa, base + pp_smem::KV + prev * 2 * TILE + TILE);
            wgmma_commit();
            named_arrive(other, CONSUMERS);
            wgmma_wait<0>();
            reg_fence<D / 2>(acc);
            if (prev_scrub) poison_from(prev, prev_k0);
            mbar_arrive_warp(kv_empty + 8 * prev);
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int x = wrow + 8 * hr;
                wg_poison_row<D>(acc, poison, hr);
                if (direct) { /* this tile is the row's only one: its output, normalized */
                    float l = lrow[hr];
                    l += __shfl_xor_sync(0xffffffffu, l, 1);
                    l += __shfl_xor_sync(0xffffffffu, l, 2);
                    if (x < qe_w) {
                        const float inv = l != 0 ? 1.0f / l : 0.0f;
                        float *orow = outh + (size_t)(opos0 + x * ostep) * ld + 2 * t;
#pragma unroll
                        for (int j = 0; j < D / 8; j++)
                            __stcs(reinterpret_cast<float2 *>(orow + 8 * j),
                                   make_float2(acc[4 * j + 2 * hr] * inv, acc[4 * j + 2 * hr + 1] * inv));
                    }
                    continue;
                }
                merge_tile_row<D>(outh, ld, t, m_s, l_s, x < qe_w, opos0 + x * ostep - P, P, mrow[hr], lrow[hr],
                                  [&](int j) { return make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]); });
            }
        });
        named_sync(BAR_CONSUMERS, CONSUMERS); /* every merge of the item is in */
        if (mix.out) {
            uint2 *sB = reinterpret_cast<uint2 *>(gbase + pp_smem::MIX);
            float *sz = reinterpret_cast<float *>(sB + 4 * 8 * 32);
            for (int i = ctid; i < Pend - P; i += CONSUMERS) l_s[i] = l_s[i] != 0 ? 1.0f / l_s[i] : 0.0f;
            stage_stream_mix(mix.M, mix.z, h, sB, sz, ctid, CONSUMERS);
            named_sync(BAR_CONSUMERS, CONSUMERS);
            stream_mix_rows(P + 16 * (ctid >> 5), 16 * (CONSUMERS / 32), Pend, ld, h, q, out, l_s, P, sB, sz,
                            memory_gate(mix.gate, h), static_cast<__nv_bfloat16 *>(mix.out));
        } else if (!direct) {
            for (int f = ctid; f < (Pend - P) * (D / 4); f += CONSUMERS) {
                const int li = f / (D / 4);
                float4 *dst = reinterpret_cast<float4 *>(outh + (size_t)(P + li) * ld) + f % (D / 4);
                const float l = l_s[li], inv = l != 0 ? 1.0f / l : 0.0f;
                const float4 o = l != 0 ? *dst : make_float4(0, 0, 0, 0);
                __stcs(dst, make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv));
            }
        }
        named_sync(BAR_CONSUMERS, CONSUMERS); /* l_s and the mix's tiles are read above */
    }
    if (cw == 0) named_sync(mine, CONSUMERS); /* warpgroup 2's last hand-over */
#endif
}

/* The maps of pp_maps for q/k/v ([n, ld] bf16) and the staged global tokens; SF_E_UNSUPPORTED
 * (no error set) where the branches need more than MAPS of them or the encoder refuses one. */
int pp_encode(const sf_attention_desc *d, const att_branches &br, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
              const __nv_bfloat16 *v, const att_staged &st, pp_maps *m)
{
    int used = 0;
    for (int b = 0; b < br.count; b++) {
        const int r = br.dilation[b];
        if (used + r > MAPS) return SF_E_UNSUPPORTED;
        m->first[b] = (signed char)used;
        for (int o = 0; o < r; o++, used++) {
            const long long rows = d->n > o ? (d->n - o + r - 1) / r : 1, stride = (long long)r * d->ld;
            const long long off = d->n > o ? (long long)o * d->ld : 0;
            if (sf_cuda_tensor_map_bf16_sw128(&m->q[used], q + off, rows, d->ld, stride, BM) ||
                sf_cuda_tensor_map_bf16_sw128(&m->k[used], k + off, rows, d->ld, stride, BN) ||
                sf_cuda_tensor_map_bf16_sw128(&m->v[used], v + off, rows, d->ld, stride, BN))
                return SF_E_UNSUPPORTED;
        }
    }
    if (sf_cuda_tensor_map_bf16_sw128(&m->q_all, q, d->n, d->ld, d->ld, BM)) return SF_E_UNSUPPORTED;
    const long long grows = (long long)d->heads * (d->n_global > 0 ? d->n_global : 1);
    if (d->n_global > 0 && (sf_cuda_tensor_map_bf16_sw128(&m->gk, st.gkb, grows, D, D, BN) ||
                            sf_cuda_tensor_map_bf16_sw128(&m->gv, st.gvb, grows, D, D, BN)))
        return SF_E_UNSUPPORTED;
    return SF_OK;
}

int pp_fits()
{
    static int known[64];
    return sf_cuda_hopper_known(known, (const void *)attention_pingpong, (int)pp_smem::bytes(BM));
}
} // namespace

extern "C" int sf_cuda_attention_pingpong_usable(const sf_attention_desc *desc, const sf_cuda_device_info *dev)
{
    if (desc->head_dim != D || desc->qkv_type != SF_DTYPE_BF16 || !dev || dev->major != 9 || dev->minor != 0)
        return 0;
    int sum = 0;
    for (int b = 0; b < desc->n_branches; b++) sum += desc->branches[b].dilation;
    return sum <= MAPS && pp_fits() > 0;
}

extern "C" int sf_cuda_attention_pingpong_preferred(const sf_attention_desc *desc, const sf_cuda_device_info *dev)
{
    if (!sf_cuda_attention_pingpong_usable(desc, dev) || desc->n <= 0) return 0;
    att_branches br;
    long T;
    if (att_fill_branches(desc, &br) || att_block_positions(br, BM, &T)) {
        sf_clear_error();
        return 0;
    }
    /* fewer items than multiprocessors leave the heaviest item alone setting the time: the wgmma
     * kernel's smaller blocks balance better there (a head-parallel rank's 8 heads) */
    return (desc->n + T - 1) / T * desc->heads >= pp_fits();
}

extern "C" int sf_cuda_attention_pingpong(const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                                          float *out, const sf_cuda_attention_mix *mix, void *workspace,
                                          size_t workspace_bytes, cudaStream_t stream)
{
    if (desc->head_dim != D || desc->qkv_type != SF_DTYPE_BF16) return SF_E_UNSUPPORTED;
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    const __nv_bfloat16 *qb = static_cast<const __nv_bfloat16 *>(q), *kb = static_cast<const __nv_bfloat16 *>(k),
                        *vb = static_cast<const __nv_bfloat16 *>(v);
    rc = att_check_bf16_inputs(desc, qb, kb, vb);
    if (rc) return rc;
    long T;
    rc = att_block_positions(br, BM, &T);
    if (rc) return rc;
    const size_t smem = pp_smem::bytes(T);
    const int sms = pp_fits();
    if (smem > 227 * 1024 || sms <= 0) return SF_E_UNSUPPORTED;
    const int nblocks = (int)((desc->n + T - 1) / T), items = nblocks * desc->heads;
    cudaError_t err = cudaFuncSetAttribute(attention_pingpong, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (pingpong): %s", cudaGetErrorString(err));
    att_staged st;
    rc = att_stage_globals(desc, kb, vb, static_cast<unsigned char *>(workspace), &st, stream, true);
    if (rc) return rc;
    pp_maps maps = {};
    if (pp_encode(desc, br, qb, kb, vb, st, &maps) != SF_OK) {
        /* the caller's fallback stages the global tokens again, as its kernel reads them */
        sf_clear_error();
        return SF_E_UNSUPPORTED;
    }
    /* one branch without dilation and no global tokens: each row's only tile writes it */
    const int direct = !mix && br.count == 1 && br.dilation[0] == 1 && desc->n_global <= 0;
    att_order ord;
    att_heaviest_first(desc, br, (int)T, nblocks, &ord);
    const sf_cuda_attention_mix no_mix = {};
    err = sf_cuda_launch_early(attention_pingpong, dim3((unsigned)(items < sms ? items : sms)), dim3(THREADS), smem,
                               stream, *desc, br, (int)T, qb, out, ord, mix ? *mix : no_mix, direct, maps);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (pingpong): %s", cudaGetErrorString(err));
    return SF_OK;
}
