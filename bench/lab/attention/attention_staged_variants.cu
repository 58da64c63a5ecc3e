/* Dilated local attention on bf16 tensor cores, staged variant (SPEC 3 and 5); reference:
 * sf_cpu_attention. Variants >= SF_CUDA_ATTENTION_FIRST_WS_VARIANT of sf_cuda_attention_bf16.
 *
 * Why a workspace: the first kernel (attention_bf16.cu) re-reads float32 K/V from L2 for every
 * query tile and converts them in its inner loop, holding the next tile in registers; that
 * costs L2 bandwidth, registers (occupancy) and instructions per tile. Here a pre-pass converts
 * K, V and the global tokens once per call into bf16, head-major ([head][row][d]), so a dilated
 * branch's keys are rows o + r*x at a fixed stride of whole 2*d-byte lines and the main kernel
 * streams them with 16-byte cp.async straight into shared memory, STAGES tiles deep, no
 * conversion or register staging. Q stays float32: each query tile reads it once.
 *
 * The main kernel keeps the first kernel's block structure (a block owns T positions of one
 * head, visits every branch's query tiles of them and then the global tokens, and merges each
 * finished tile into `out` by log-sum-exp), so no block depends on another. Causal blocks
 * differ in cost by ~10x; the host orders (position block, head) items by their estimated
 * query-key pairs, heaviest first, and the hardware's in-order block dispatch then works as a
 * longest-processing-time-first schedule. */
#include <math.h>
#include <stdint.h>
#include <algorithm>
#include <cuda_bf16.h>

#include "kernels/cuda/attention_bf16_variants.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* ---- pre-pass: float32 [rows, ld] -> bf16 [heads][rows][D] ------------------------------ */
/* STREAM: read K/V as evict-first (ld.global.cs), so that the float32 inputs, read once, do not
 * push the bf16 copies the main kernel re-reads out of L2. */
template <int D, bool STREAM>
__global__ void stage_kv(int rows, int heads, int ld, const float *k, const float *v, __nv_bfloat16 *kb,
                         __nv_bfloat16 *vb)
{
    sf_wait_prior_grid(); /* launched early: sf_cuda_launch_early */
    const size_t total = (size_t)rows * heads * (D / 8);
    for (size_t f = (size_t)blockIdx.x * blockDim.x + threadIdx.x; f < total; f += (size_t)gridDim.x * blockDim.x) {
        const int c8 = (int)(f % (D / 8));
        const size_t rh = f / (D / 8);
        const int h = (int)(rh % heads);
        const size_t i = rh / heads;
        const size_t src = i * ld + (size_t)h * D + c8 * 8, dst = ((size_t)h * rows + i) * D + c8 * 8;
        const float4 *ks = reinterpret_cast<const float4 *>(k + src), *vs = reinterpret_cast<const float4 *>(v + src);
        const float4 a = STREAM ? __ldcs(ks) : __ldg(ks), b = STREAM ? __ldcs(ks + 1) : __ldg(ks + 1);
        const float4 c = STREAM ? __ldcs(vs) : __ldg(vs), d = STREAM ? __ldcs(vs + 1) : __ldg(vs + 1);
        *reinterpret_cast<uint4 *>(kb + dst) =
            make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
        *reinterpret_cast<uint4 *>(vb + dst) =
            make_uint4(pack_bf16x2(c.x, c.y), pack_bf16x2(c.z, c.w), pack_bf16x2(d.x, d.y), pack_bf16x2(d.z, d.w));
    }
}

/* The overlapped pre-pass (att_stage_workspace_overlapped): block c stages chunk c of
 * SF_ATT_CHUNK_ROWS rows, sequence chunks last first, then the globals', and raises ready[chunk]. */
template <int D>
__global__ void __launch_bounds__(256) stage_kv_flagged(int rows, int grows, int heads, int ld, int gld, const float *k,
                                                        const float *v, const float *gk, const float *gv,
                                                        __nv_bfloat16 *kb, __nv_bfloat16 *vb, __nv_bfloat16 *gkb,
                                                        __nv_bfloat16 *gvb, unsigned *ready)
{
    /* every block of this grid is running or done once all have passed this point, and none waits
     * on anything, so the main kernel's blocks, which wait on these flags, cannot starve it */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int nch = (rows + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    const bool glob = (int)blockIdx.x >= nch;
    const int chunk = glob ? (int)blockIdx.x - nch : nch - 1 - (int)blockIdx.x;
    const int all = glob ? grows : rows, stride = glob ? gld : ld, r0 = chunk * SF_ATT_CHUNK_ROWS;
    const float *ksrc = glob ? gk : k, *vsrc = glob ? gv : v;
    __nv_bfloat16 *kdst = glob ? gkb : kb, *vdst = glob ? gvb : vb;
    const int units = min(SF_ATT_CHUNK_ROWS, all - r0) * heads * (D / 8);
    /* UNROLL units' loads before their stores: the inputs may alias nothing here, but the
     * compiler cannot know, and one unit's loads in flight a thread leave DRAM idle */
    constexpr int UNROLL = 2;
    for (int f0 = threadIdx.x; f0 < units; f0 += UNROLL * blockDim.x) {
        float4 a[UNROLL][4];
        size_t dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int f = f0 + u * blockDim.x;
            dst[u] = ~(size_t)0;
            if (f < units) {
                const int c8 = f % (D / 8), rh = f / (D / 8), h = rh % heads, i = r0 + rh / heads;
                const size_t src = (size_t)i * stride + (size_t)h * D + c8 * 8;
                dst[u] = ((size_t)h * all + i) * D + c8 * 8;
                const float4 *ks = reinterpret_cast<const float4 *>(ksrc + src), *vs = reinterpret_cast<const float4 *>(vsrc + src);
                a[u][0] = __ldcs(ks), a[u][1] = __ldcs(ks + 1), a[u][2] = __ldcs(vs), a[u][3] = __ldcs(vs + 1);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (dst[u] == ~(size_t)0) continue;
            const float4 *x = a[u];
            *reinterpret_cast<uint4 *>(kdst + dst[u]) =
                make_uint4(pack_bf16x2(x[0].x, x[0].y), pack_bf16x2(x[0].z, x[0].w), pack_bf16x2(x[1].x, x[1].y), pack_bf16x2(x[1].z, x[1].w));
            *reinterpret_cast<uint4 *>(vdst + dst[u]) =
                make_uint4(pack_bf16x2(x[2].x, x[2].y), pack_bf16x2(x[2].z, x[2].w), pack_bf16x2(x[3].x, x[3].y), pack_bf16x2(x[3].z, x[3].w));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(ready + (glob ? nch : 0) + chunk) : "memory");
    }
}

/* ---- main kernel ------------------------------------------------------------------------ */

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

static size_t round_up_256(size_t x) { return (x + 255) & ~(size_t)255; }

static size_t kv_bytes(int rows, int heads, int d) { return round_up_256((size_t)rows * heads * d * 2); }

/* the overlapped pre-pass's ready flags, after the bf16 copies */
static size_t ready_bytes(int rows, int g)
{
    const size_t chunks = (size_t)(rows + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS +
                          (size_t)(g + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    return round_up_256(chunks * sizeof(unsigned));
}

static size_t workspace_need(int rows, int g, int heads, int d)
{
    return 2 * kv_bytes(rows, heads, d) + 2 * kv_bytes(g, heads, d) + ready_bytes(rows, g);
}

extern "C" size_t sf_cuda_attention_workspace_bytes(const sf_attention_desc *desc)
{
    const int rows = desc->segment > desc->n ? desc->segment : desc->n;
    const int g = desc->n_global > 0 ? desc->n_global : 0;
    return workspace_need(rows, g, desc->heads, desc->head_dim);
}

/* Query-key pairs a block of positions [P, Pend) attends to (offset 0 stands for every head):
 * the schedule's cost estimate. */
static double block_pairs(const sf_attention_desc *d, const att_branches &br, int P, int Pend)
{
    double pairs = (double)(Pend - P) * d->n_global;
    for (int b = 0; b < br.count; b++) {
        const int r = br.dilation[b], win = br.window[b] / r, nd = (d->n + r - 1) / r;
        const int xb = std::min((Pend + r - 1) / r, nd);
        for (int x = P / r; x < xb;) {
            const int ws = x / win * win, e = std::min(xb, ws + win);
            if (d->causal)
                pairs += 0.5 * (double)(x - ws + 1 + e - ws) * (e - x);
            else
                pairs += (double)(e - x) * (std::min(ws + win, nd) - ws);
            x = e;
        }
    }
    return pairs;
}

void att_heaviest_first(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, att_order *ord)
{
    ord->count = 0;
    if (nblocks > SF_ATT_ORDER_MAX) return;
    double cost[SF_ATT_ORDER_MAX];
    for (int i = 0; i < nblocks; i++) {
        cost[i] = block_pairs(d, br, i * T, std::min(i * T + T, d->n));
        ord->block[i] = (unsigned short)i;
    }
    std::stable_sort(ord->block, ord->block + nblocks,
                     [&](unsigned short a, unsigned short b) { return cost[a] > cost[b]; });
    ord->count = nblocks;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int D>
static void stage_inputs(int rows, int heads, int ld, const float *k, const float *v, __nv_bfloat16 *kb,
                         __nv_bfloat16 *vb, bool streaming, cudaStream_t stream)
{
    const size_t total = (size_t)rows * heads * (D / 8);
    if (total == 0) return;
    const unsigned grid = (unsigned)std::min<size_t>((total + 255) / 256, 8192);
    if (streaming)
        sf_cuda_launch_early(stage_kv<D, true>, grid, 256, 0, stream, rows, heads, ld, k, v, kb, vb);
    else
        sf_cuda_launch_early(stage_kv<D, false>, grid, 256, 0, stream, rows, heads, ld, k, v, kb, vb);
}

int att_check_staged_inputs(const sf_attention_desc *desc, const float *q, const float *k, const float *v)
{
    const int G = desc->n_global;
    if (desc->ld % 4 || (G > 0 && desc->global_ld % 4) || !aligned16(k) || !aligned16(v) || !aligned16(q) ||
        (G > 0 && (!aligned16(desc->gk) || !aligned16(desc->gv))))
        return sf_error(SF_E_UNSUPPORTED,
                        "cuda attention: q/k/v need 16-byte alignment and row strides a multiple of 4 floats (ld %d)",
                        desc->ld);
    return SF_OK;
}

int att_block_positions(const att_branches &br, int bm, long *T)
{
    long lcm = 1;
    int rmax = 1;
    for (int b = 0; b < br.count; b++) {
        lcm = lcm / att_gcd((int)lcm, br.dilation[b]) * br.dilation[b];
        if (lcm > (1 << 20)) return sf_error(SF_E_UNSUPPORTED, "cuda attention: dilations too varied");
        if (br.dilation[b] > rmax) rmax = br.dilation[b];
    }
    *T = ((long)bm * rmax + lcm - 1) / lcm * lcm;
    if (*T > 8192 && lcm <= 8192) *T = (8192 / lcm) * lcm;
    return SF_OK;
}

int att_stage_workspace(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                        att_staged *staged, cudaStream_t stream, bool streaming)
{
    const int H = desc->heads, n = desc->n, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    __nv_bfloat16 *kb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *vb = reinterpret_cast<__nv_bfloat16 *>(ws + kv_bytes(n, H, D));
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * kv_bytes(n, H, D));
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * kv_bytes(n, H, D) + kv_bytes(G, H, D));
    switch (D) {
    case 32:
        stage_inputs<32>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<32>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    case 64:
        stage_inputs<64>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<64>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    case 128:
        stage_inputs<128>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<128>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    default: return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)", D);
    }
    staged->kb = kb, staged->vb = vb, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = (size_t)n * D, staged->krow = D;
    staged->ready = nullptr, staged->nchunks = 0;
    return SF_OK;
}

int att_stage_globals(const sf_attention_desc *desc, const __nv_bfloat16 *k, const __nv_bfloat16 *v, unsigned char *ws,
                      att_staged *staged, cudaStream_t stream, bool streaming)
{
    const int H = desc->heads, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    if (D != 64) return sf_error(SF_E_UNSUPPORTED, "cuda attention: bf16 K/V read in place for d = 64, not %d", D);
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + kv_bytes(G, H, D));
    if (G > 0) stage_inputs<64>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
    staged->kb = k, staged->vb = v, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = D, staged->krow = (size_t)desc->ld;
    staged->ready = nullptr, staged->nchunks = 0;
    return SF_OK;
}

int att_stage_workspace_overlapped(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                                   att_staged *staged, cudaStream_t stream)
{
    const int H = desc->heads, n = desc->n, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    if (D != 64) return sf_error(SF_E_UNSUPPORTED, "cuda attention: overlapped pre-pass built for d = 64, not %d", D);
    __nv_bfloat16 *kb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *vb = reinterpret_cast<__nv_bfloat16 *>(ws + kv_bytes(n, H, D));
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * kv_bytes(n, H, D));
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * kv_bytes(n, H, D) + kv_bytes(G, H, D));
    unsigned *ready = reinterpret_cast<unsigned *>(ws + 2 * kv_bytes(n, H, D) + 2 * kv_bytes(G, H, D));
    const int nch = (n + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS, gch = (G + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    cudaError_t err = cudaMemsetAsync(ready, 0, ready_bytes(n, G), stream);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention: clearing ready flags: %s", cudaGetErrorString(err));
    if (nch + gch > 0)
        stage_kv_flagged<64><<<nch + gch, 256, 0, stream>>>(n, G, H, desc->ld, desc->global_ld, k, v, desc->gk, desc->gv,
                                                            kb, vb, gkb, gvb, ready);
    staged->kb = kb, staged->vb = vb, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = (size_t)n * D, staged->krow = D;
    staged->ready = ready, staged->nchunks = nch;
    return SF_OK;
}

template <int D, int WARPS, int MT, int BN, int STAGES, int MINB>
static int launch_staged(const sf_attention_desc *desc, const att_branches &br, const float *q, const float *k,
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

template <int D>
static int launch_ws_variant(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                             const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    constexpr int BN = D >= 128 ? 32 : 64;
    /* resident blocks of 4 warps a multiprocessor: 4 caps registers at 128, 3 at 168 */
    constexpr int MINB4 = D >= 128 ? 2 : 4, MINB3 = D >= 128 ? 2 : 3;
    switch (variant) {
    case 4: return launch_staged<D, 4, 1, BN, 2, MINB4>(desc, br, q, k, v, out, ws, stream);
    case 5: return launch_staged<D, 4, 1, BN, 3, MINB4>(desc, br, q, k, v, out, ws, stream);
    case 6: return launch_staged<D, 4, 1, BN, 2, MINB3>(desc, br, q, k, v, out, ws, stream);
    /* 32 rows a warp: 2 warps keep a block at 64 rows (T, and so the causal balance, unchanged) */
    case 7: return launch_staged<D, 2, 2, BN, 2, 4>(desc, br, q, k, v, out, ws, stream);
    case 8: return launch_staged<D, 4, 2, BN, 2, 2>(desc, br, q, k, v, out, ws, stream);
    default: return sf_error(SF_E_INVAL, "cuda attention: no variant %d", variant);
    }
}

/* What every workspace launch checks first: the branch table, the global tokens' pointers and
 * the workspace's size and alignment; *br gets the table. */
static int check_ws_launch(const sf_attention_desc *desc, const void *workspace, size_t workspace_bytes,
                           att_branches *br)
{
    int rc = att_fill_branches(desc, br);
    if (rc) return rc;
    if (desc->n_global > 0 && (!desc->gk || !desc->gv))
        return sf_error(SF_E_INVAL, "cuda attention: %d global tokens but no gk/gv", desc->n_global);
    const size_t need =
        workspace_need(desc->n, desc->n_global > 0 ? desc->n_global : 0, desc->heads, desc->head_dim);
    if (!workspace || workspace_bytes < need || ((uintptr_t)workspace & 255))
        return sf_error(SF_E_INVAL, "cuda attention: workspace %p of %zu bytes, need %zu bytes 256-byte aligned",
                        workspace, workspace_bytes, need);
    return SF_OK;
}

extern "C" int sf_cuda_attention_bf16_variant_ws(int variant, const sf_attention_desc *desc, const void *qp,
                                                 const void *kp, const void *vp, float *out, void *workspace,
                                                 size_t workspace_bytes, cudaStream_t stream)
{
    const bool bf16_in = desc->qkv_type == SF_DTYPE_BF16;
    if (bf16_in && !(variant >= SF_CUDA_ATTENTION_FIRST_WGMMA_VARIANT && att_wgmma_usable(desc)))
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: bf16 q/k/v are read by the wgmma kernels (an H100, d = 64)");
    if (desc->qkv_type != SF_DTYPE_F32 && !bf16_in)
        return sf_error(SF_E_INVAL, "cuda attention: q/k/v of unknown type %d", (int)desc->qkv_type);
    const float *q = static_cast<const float *>(qp), *k = static_cast<const float *>(kp), *v = static_cast<const float *>(vp);
    if (variant < SF_CUDA_ATTENTION_FIRST_WS_VARIANT)
        return sf_cuda_attention_bf16_variant(variant, desc, q, k, v, out, stream);
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    unsigned char *ws = static_cast<unsigned char *>(workspace);
    if (variant >= SF_CUDA_ATTENTION_FIRST_WGMMA_VARIANT && variant < SF_CUDA_ATTENTION_VARIANTS) {
        /* Hopper-only kernels, d = 64: elsewhere the best portable variant computes the same */
        if (att_wgmma_usable(desc)) {
            if (bf16_in)
                rc = att_wgmma_launch_bf16(variant, desc, br, static_cast<const __nv_bfloat16 *>(qp),
                                           static_cast<const __nv_bfloat16 *>(kp), static_cast<const __nv_bfloat16 *>(vp),
                                           out, ws, stream);
            else
                rc = att_wgmma_launch(variant, desc, br, q, k, v, out, ws, stream);
            if (rc) return rc;
            cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
            return SF_OK;
        }
        variant = SF_CUDA_ATTENTION_PORTABLE_VARIANT;
    }
    switch (desc->head_dim) {
    case 32: rc = launch_ws_variant<32>(variant, desc, br, q, k, v, out, ws, stream); break;
    case 64: rc = launch_ws_variant<64>(variant, desc, br, q, k, v, out, ws, stream); break;
    case 128: rc = launch_ws_variant<128>(variant, desc, br, q, k, v, out, ws, stream); break;
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)",
                        desc->head_dim);
    }
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}

extern "C" int sf_cuda_attention_mix_ws(const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                                        float *a, const sf_cuda_attention_mix *mix, void *workspace,
                                        size_t workspace_bytes, cudaStream_t stream)
{
    if (desc->qkv_type != SF_DTYPE_BF16 || desc->head_dim != 64 || !mix || !mix->out ||
        SF_CUDA_ATTENTION_DEFAULT_VARIANT != 36 || !att_wgmma_usable(desc) || desc->n <= 0 ||
        ((uintptr_t)mix->out | (uintptr_t)a) % 16)
        return SF_E_UNSUPPORTED; /* not an error: the caller runs the attention and the mix */
    att_branches br;
    int rc = check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    rc = att_wgmma_launch_bf16(36, desc, br, static_cast<const __nv_bfloat16 *>(q),
                               static_cast<const __nv_bfloat16 *>(k), static_cast<const __nv_bfloat16 *>(v), a,
                               static_cast<unsigned char *>(workspace), stream, mix);
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (mix) launch: %s", cudaGetErrorString(err));
    return SF_OK;
}

extern "C" int sf_cuda_attention_bf16_ws(const sf_attention_desc *desc, const void *q, const void *k,
                                         const void *v, float *out, void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream)
{
    if (!workspace)
        return sf_cuda_attention_bf16(desc, static_cast<const float *>(q), static_cast<const float *>(k),
                                      static_cast<const float *>(v), out, stream);
    return sf_cuda_attention_bf16_variant_ws(SF_CUDA_ATTENTION_DEFAULT_VARIANT, desc, q, k, v, out, workspace,
                                             workspace_bytes, stream);
}
