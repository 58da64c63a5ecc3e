/* Dilated local attention on Hopper warpgroup MMA (wgmma, sm_90a), d = 64 and 128 (SPEC 3, 5);
 * reference: sf_cpu_attention. sf_cuda_attention runs it on compute capability 9.0 where the
 * ping-pong kernel (attention_pingpong.cu) does not: float32 q/k/v, d = 128, and bf16 q/k/v at
 * d = 64 with fewer position blocks times heads than multiprocessors.
 *
 * Same contract, workspace and block structure as the staged kernel (attention_staged.cuh):
 * the shared pre-pass stages K/V/globals as bf16 [head][row][d] (or, for bf16 q/k/v as qkv
 * wrote them, only the globals, K/V read in place); a block of one warpgroup owns T positions
 * of one head, walks every branch's query tiles of 64 dilated rows and then the global tokens,
 * and merges each finished tile into `out` by log-sum-exp; heaviest blocks first.
 *
 * What changes is the inner loop. mma.sync needs every B fragment brought to registers by
 * ldmatrix and issues 16x8x16 products per warp; wgmma reads K and V straight from shared memory
 * (128-byte-swizzled tiles, so no padding and no bank conflicts) and computes 64 x N x 16 per
 * instruction for the whole warpgroup, asynchronously. S = Q K^T takes Q as a swizzled
 * shared-memory tile and K as a K-major operand; P stays in registers (the accumulator layout of
 * S is the A-fragment layout of P V) and V, stored [keys][d], is the MN-major ("transposed") B
 * operand, so nothing is transposed or copied. K/V tiles arrive by 16-byte cp.async (zero-fill
 * past the end of the keys), three tiles in flight (two at d = 128), the next tile's copies
 * issued once S = Q K^T is (under the products' latency). The softmax (float32, exp2 domain,
 * masks only on tiles that need them) is the staged kernel's own. Three blocks share a
 * multiprocessor (two at d = 128), so one block's softmax runs under another's products; at
 * d = 128 a row is two 128-byte column blocks (attention_wgmma_tile.cuh). Float32 data read or
 * written once (Q, the pre-pass's K/V reads, the final output) goes evict-first, so that L2
 * keeps the bf16 K/V tiles every query tile re-reads.
 *
 * The variants this won against (warp specialization, FlashAttention-3's order, a leaner
 * softmax, copies running ahead across query tiles, the kernel beside its pre-pass, K/V tiles by
 * the copy engine, ...) are in bench/lab/attention/ with their measurements (bench/lab/README.md);
 * FlashAttention-3's order lost at d = 128 too (bench/lab/ATTENTION_NOTES.md). */
#include <math.h>
#include <stdint.h>
#include <cuda_bf16.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma_tile.cuh"
#include "kernels/cuda/compressive_memory_stream.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* The kernel's shape for head width D: 64 keys a tile, 64 query rows (one warpgroup) a tile;
 * at d = 64 3 tiles in flight and 3 blocks a multiprocessor, at d = 128 (tiles twice as large)
 * 2 and 2, which the 228 KiB of shared memory a multiprocessor holds. A tile is D/64 column
 * blocks of 64 (attention_wgmma_tile.cuh). */
template <int D> struct wg_cfg {
    static_assert(D == 64 || D == 128, "built for d = 64 and 128");
    static constexpr int BN = 64, STAGES = D == 64 ? 3 : 2, MINB = D == 64 ? 3 : 2;
    static constexpr int THREADS = 128, BM = 64; /* BM: query rows a tile */
    static constexpr int BLOCKS = D / 64;        /* column blocks of a row */
    static constexpr int TILE = BN * D * 2;      /* bytes of a K or a V tile */
    static constexpr int STAGE = 2 * TILE;       /* K tile then V tile, each 1024-byte aligned */
    static constexpr int KV_BYTES = STAGES * STAGE;
    static constexpr int Q_BYTES = 64 * D * 2;          /* the Q tile */
    static constexpr int PER_THREAD = BN * 8 / THREADS; /* 16-byte chunks of a column block a thread */
};

#if SF_WGMMA_ENABLED
/* K and V rows [k0, k0 + BN) into the stage at shared address `stage`, swizzled. */
template <int D> __device__ __forceinline__ void wg_issue_tile(const wg_src &s, int k0, uint32_t stage)
{
    using C = wg_cfg<D>;
#pragma unroll
    for (int b = 0; b < C::BLOCKS; b++)
#pragma unroll
        for (int u = 0; u < C::PER_THREAD; u++) {
            const int f = threadIdx.x + u * C::THREADS, key = f / 8, c8 = f % 8;
            const int x = k0 + key;
            const bool ok = x < s.kend;
            const size_t off = (ok ? (size_t)x * s.stride : 0) + b * 64 + c8 * 8;
            const uint32_t dst = b * C::BN * 128 + sw128_offset(key, c8);
            cp_async16_sh(stage + dst, s.k + off, ok ? 16 : 0);
            cp_async16_sh(stage + C::TILE + dst, s.v + off, ok ? 16 : 0);
        }
}

/* This thread's share of the copies of every key tile of one query tile: its chunks are key rows
 * tid/8 + 16u (u < PER_THREAD) at column chunk tid%8 of every column block, so the shared offsets
 * are one base plus u * 2048 bytes (plus BN * 128 a block) and the global addresses advance by a
 * fixed step a tile. Keys past the end are zero-filled with the source ignored (ignore-src), so
 * no address select is needed. Kept per thread, it issues a tile's copies in ~20 instructions a
 * column block instead of wg_issue_tile's ~90. */
template <int D> struct wg_stream {
    const __nv_bfloat16 *k, *v; /* chunk u = 0 of key tile 0 */
    size_t row16, tile;         /* elements between chunks u and u+1, and between tiles */
    int key0, kend;             /* key of chunk u = 0 in tile 0, end of the keys */
    uint32_t dst0;              /* shared offset of chunk u = 0 in a stage */

    __device__ __forceinline__ wg_stream(const wg_src &s)
    {
        const int row = threadIdx.x / 8, c8 = threadIdx.x % 8;
        key0 = s.kbeg + row, kend = s.kend;
        const size_t off = (size_t)key0 * s.stride + c8 * 8;
        k = s.k + off, v = s.v + off;
        row16 = 16 * s.stride, tile = (size_t)wg_cfg<D>::BN * s.stride;
        dst0 = sw128_offset(row, c8);
    }
    __device__ __forceinline__ void issue(int nt, uint32_t stage) const
    {
        using C = wg_cfg<D>;
        static_assert(C::THREADS / 8 == 16, "chunk u is 16 key rows below chunk u - 1");
        const size_t t0 = (size_t)nt * tile;
#pragma unroll
        for (int u = 0; u < C::PER_THREAD; u++) {
            const bool skip = key0 + nt * C::BN + 16 * u >= kend;
#pragma unroll
            for (int b = 0; b < C::BLOCKS; b++) {
                const uint32_t dst = stage + b * C::BN * 128 + dst0 + u * 2048;
                cp_async16_zfill(dst, k + t0 + u * row16 + b * 64, skip);
                cp_async16_zfill(dst + C::TILE, v + t0 + u * row16 + b * 64, skip);
            }
        }
    }
};

/* One query tile: dilated rows [qs, qe), query row x at qbase + x*qstride (float32 or bf16: QT),
 * output row at position opos0 + x*ostep; merges into out / m_s / l_s (indexed by position - P).
 * Every thread of the block calls it (it holds block barriers). `qaddr`, `kv`: shared addresses
 * of the Q tile and of the K/V stages. */
template <int D, class QT>
__device__ void wg_tile(const wg_src &src, const QT *qbase, size_t qstride, int qs, int qe, int opos0, int ostep, int P,
                        float *out, size_t ld, float c, uint32_t qaddr, uint32_t kv, float *m_s, float *l_s)
{
    using C = wg_cfg<D>;
    constexpr int BN = C::BN, STAGES = C::STAGES;
    const int nkt = (src.kend - src.kbeg + BN - 1) / BN;
    if (nkt <= 0) return;
    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* the tile's rows [qs, qe_w); this thread's: wrow, wrow + 8 */
    const int qe_w = min(qe, qs + 64);
    const int wrow = qs + warp * 16 + g;

#pragma unroll
    for (int p = 0; p < STAGES - 1; p++) {
        if (p < nkt) wg_issue_tile<D>(src, src.kbeg + p * BN, kv + p * C::STAGE);
        cp_async_commit();
    }
    if constexpr (sizeof(QT) == 2) {
        /* bf16 rows (qkv wrote them): 16-byte chunks go to the swizzled tile as they are */
#pragma unroll
        for (int u = 0; u < 64 * 8 * C::BLOCKS / 128; u++) {
            const int f = tid + u % 4 * 128, row = f / 8, c8 = f % 8, b = u / 4, x = qs + row;
            uint4 a = make_uint4(0, 0, 0, 0);
            if (x < qe_w) {
                const uint4 *qr = reinterpret_cast<const uint4 *>(qbase + (size_t)x * qstride + b * 64 + c8 * 8);
                a = __ldcs(qr);
            }
            const uint32_t dst = qaddr + b * 64 * 128 + sw128_offset(row, c8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w)
                         : "memory");
        }
        fence_proxy_async();
    } else {
        /* Q tile to shared memory as bf16, swizzled like K: rows past qe are zeros. The previous
         * tile's products are done with it (each thread waited, then a barrier). */
#pragma unroll
        for (int u = 0; u < 64 * 8 * C::BLOCKS / 128; u++) {
            const int f = tid + u % 4 * 128, row = f / 8, c8 = f % 8, blk = u / 4, x = qs + row;
            float4 a = make_float4(0, 0, 0, 0), b = a;
            if (x < qe_w) {
                const float4 *qr = reinterpret_cast<const float4 *>(qbase + (size_t)x * qstride + blk * 64 + c8 * 8);
                a = __ldcs(qr), b = __ldcs(qr + 1);
            }
            const uint32_t dst = qaddr + blk * 64 * 128 + sw128_offset(row, c8);
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(pack_bf16x2(a.x, a.y)),
                         "r"(pack_bf16x2(a.z, a.w)), "r"(pack_bf16x2(b.x, b.y)), "r"(pack_bf16x2(b.z, b.w))
                         : "memory");
        }
        fence_proxy_async(); /* the first key tile's barrier then publishes it */
    }
    const uint32_t(*no_qf)[4] = nullptr; /* Q is a shared-memory operand */
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
    /* tiles wholly inside the keys every row of the tile may see skip the mask */
    const int qwin = qs / src.win, qlast = max(qe_w, qs + 1) - 1;
    const bool qwin_same = qwin == qlast / src.win;
    const int wlo = qwin * src.win, whi = min(wlo + src.win, src.kend);
    float s[BN / 2];
    uint32_t pa[BN / 16][4];

    __shared__ unsigned long long bad_slots[C::THREADS / 32]; /* att_block_bad_keys */
    unsigned poison = 0; /* bit hr: row wrow + 8hr sees a key whose V is not finite */
    const wg_stream<D> copies(src);
    for (int it = 0; it < nkt; it++) {
        cp_async_wait<STAGES - 2>(); /* this thread's part of tile `it` has landed */
        fence_proxy_async();         /* ... and is visible to the tensor cores */
        __syncthreads();             /* everyone's has, and tile it-1 is done with */
        const int k0 = src.kbeg + it * BN;
        const uint32_t kaddr = kv + (it % STAGES) * C::STAGE;
        wgmma_fence();
        wg_qk<BN, true, D>(s, no_qf, qaddr, kaddr);
        wgmma_commit();
        {
            /* tile it + STAGES - 1 into the stage of tile it-1, which everyone is done with */
            const int nt = it + STAGES - 1;
            if (nt < nkt) copies.issue(nt, kv + (nt % STAGES) * C::STAGE);
            cp_async_commit();
        }
        const bool need_mask = !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs);
        if (need_mask) {
            /* under S = Q K^T (which reads K only): V's non-finite values to 0 before P V reads
             * them, and the rows that see their keys poisoned (attention_mma.cuh). This thread
             * scrubs the chunks it copied: key rows tid/8 + 16u. */
            uint64_t mine = 0;
#pragma unroll
            for (int u = 0; u < C::PER_THREAD; u++)
#pragma unroll
                for (int b = 0; b < C::BLOCKS; b++)
                    if (att_scrub16(kaddr + C::TILE + b * BN * 128 + copies.dst0 + u * 2048))
                        mine |= 1ull << (tid / 8 + 16 * u);
            if (mine) fence_proxy_async(); /* the zeros, to the tensor cores' proxy */
            const uint64_t bad = att_block_bad_keys<C::THREADS / 32>(mine, bad_slots);
            if (bad)
#pragma unroll
                for (int hr = 0; hr < 2; hr++)
                    poison |= (unsigned)att_row_sees(bad, k0, wrow + 8 * hr, src.win, src.kend, src.causal) << hr;
        }
        wgmma_wait<0>();
        reg_fence<BN / 2>(s);
        float base[2];
        wg_softmax_max<BN, true, D>(s, k0, src, wrow, need_mask, c, mrow, lrow, acc, base);
        wg_softmax_exp<BN>(s, c, base, lrow, pa);
        wgmma_fence();
        wg_pv<BN, D>(acc, pa, kaddr + C::TILE);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence<D / 2>(acc);
    }

    /* merge this tile's rows into the block's accumulators (out, m_s, l_s); a poisoned row is
     * NaN there, in the plain output and in the fused mix's alike */
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int x = wrow + 8 * hr;
        wg_poison_row<D>(acc, poison, hr);
        merge_tile_row<D>(out, ld, t, m_s, l_s, x < qe, opos0 + x * ostep - P, P, mrow[hr], lrow[hr],
                          [&](int j) { return make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]); });
    }
    __syncthreads(); /* m_s/l_s and the key stages are shared with the next tile */
}
#endif /* SF_WGMMA_ENABLED */

/* The block's last step with the memory mix fused (sf_cuda_attention_with_mix): instead of
 * normalizing its rows [P, Pend) of head h in `out`, the block mixes them with the memory's
 * retrieval (compressive_memory_stream.cuh) and writes the bf16 result to mix.out, so the float32
 * rows are neither written back normalized nor read again by a mix kernel. The K/V ring (free
 * now) holds M_h and z_h; l_s becomes 1/l (0: no key seen, A_dot = 0). */
__device__ __forceinline__ void mix_block_rows(const sf_attention_desc &dd, int h, int P, int Pend,
                                               const __nv_bfloat16 *q, const float *out, float *l_s,
                                               unsigned char *ring, const sf_cuda_attention_mix &mix)
{
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

/* One block: position block ord.block[blockIdx.x / heads] (or the plain order) of head
 * blockIdx.x % heads. D: the head width. QT: the type of q (float32, or bf16 when qkv wrote bf16
 * activations; K/V then come straight from them, `st` says where and how far apart their rows
 * are). MIX: the memory mix fused (bf16, d = 64 only). */
template <int D, class QT, bool MIX>
__global__ void __launch_bounds__(wg_cfg<D>::THREADS, wg_cfg<D>::MINB)
    attention_wgmma(sf_attention_desc dd, att_branches br, int T, const QT *q, att_staged st, float *out,
                    const att_order ord, sf_cuda_attention_mix mix)
{
#if SF_WGMMA_ENABLED
    using C = wg_cfg<D>;
    static_assert(!MIX || D == 64, "the fused mix's memory is 64 x 64 a head");
    extern __shared__ __align__(1024) unsigned char smem[];
    /* swizzled tiles must start 1024-byte aligned; the launch adds 1 KiB of slack */
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t qaddr = (base + 1023) & ~1023u, kv = qaddr + C::Q_BYTES;
    float *m_s = reinterpret_cast<float *>(smem + (kv - base) + C::KV_BYTES), *l_s = m_s + T;
    sf_wait_prior_grid(); /* launched early: sf_cuda_launch_early */
    const int h = blockIdx.x % dd.heads, item = blockIdx.x / dd.heads;
    const int nblocks = (dd.n + T - 1) / T;
    const size_t ld = dd.ld;
    const float c = dd.scale * 1.4426950408889634f;
    float *outh = out + h * D;
    if (ord.count ? item >= ord.count : item >= nblocks) return;
    const int P = (ord.count ? ord.block[item] : nblocks - 1 - item) * T;
    const int Pend = min(P + T, dd.n);
    for (int i = threadIdx.x; i < T; i += C::THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
    __syncthreads();

    for (int b = 0; b < br.count; b++) {
        const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
        const int r = g.r, o = g.o, qa1 = g.qa1;
        wg_src src = wg_branch_src(st, h, g, dd.causal);
        for (int qs = P / r; qs < qa1; qs += C::BM) {
            const int qe = min(qs + C::BM, qa1);
            att_key_range(g, qs, qe, dd.causal, &src.kbeg, &src.kend);
            wg_tile<D, QT>(src, q + (size_t)o * ld + h * D, (size_t)r * ld, qs, qe, o, r, P, outh, ld, c, qaddr, kv,
                           m_s, l_s);
        }
    }
    if (dd.n_global > 0) {
        const wg_src src = wg_global_src<D>(st, h, dd.n_global);
        for (int qs = P; qs < Pend; qs += C::BM)
            wg_tile<D, QT>(src, q + h * D, ld, qs, min(qs + C::BM, Pend), 0, 1, P, outh, ld, c, qaddr, kv, m_s, l_s);
    }
    if constexpr (MIX)
        mix_block_rows(dd, h, P, Pend, q, out, l_s, smem + (kv - base), mix);
    else
        normalize_block_rows<D, true>(outh, ld, P, Pend, l_s, C::THREADS);
#endif
}

/* ---- host side -------------------------------------------------------------------------- */

/* Blocks the current device holds at once: its multiprocessors times wg_cfg<D>::MINB (looked up
 * once a device; 0 where the runtime cannot tell). */
template <int D> static int wg_resident_blocks()
{
    static int known[64]; /* a benign race fills it */
    int dev = -1, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        cudaGetLastError();
        return 0;
    }
    if (!known[dev]) {
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        known[dev] = sms * wg_cfg<D>::MINB;
    }
    return known[dev];
}

/* Positions a block owns: T (att_block_positions), halved once when the heads times the
 * position blocks would not fill the device's resident slots even once. A head-parallel rank
 * holds a part of the heads (8 of the reference model's 16 on each of two GPUs: 256 blocks of
 * 256 positions for 396 slots on an H100), and a slot left empty costs more than the half-empty
 * tiles of the most dilated branch that halving makes. The result does not depend on T: a row's
 * tiles, keys and merges are the same whichever block holds it. */
template <int D> static long wg_fill_positions(const sf_attention_desc *desc, const att_branches &br, long T)
{
    const long half = T / 2;
    if (half < wg_cfg<D>::BM) return T;
    for (int b = 0; b < br.count; b++)
        if (half % br.dilation[b]) return T;
    const long blocks = (desc->n + T - 1) / T * desc->heads;
    const int slots = wg_resident_blocks<D>();
    return slots > 0 && blocks < slots ? half : T;
}

template <int D, class QT, bool MIX>
static int launch_wgmma(const sf_attention_desc *desc, const att_branches &br, const QT *q, const QT *k, const QT *v,
                        float *out, unsigned char *ws, cudaStream_t stream, const sf_cuda_attention_mix *mix)
{
    using C = wg_cfg<D>;
    static_assert(!MIX || (sizeof(QT) == 2 && D == 64 && C::KV_BYTES >= 4 * 8 * 32 * 8 + 64 * 4),
                  "the mix is fused into the bf16 kernel at d = 64, its ring holding M_h and z_h");
    constexpr bool IN_PLACE = sizeof(QT) == 2; /* bf16 activations: K/V read where they are */
    int rc;
    if constexpr (IN_PLACE)
        rc = att_check_bf16_inputs(desc, q, k, v);
    else
        rc = att_check_staged_inputs(desc, q, k, v);
    if (rc) return rc;
    long T;
    rc = att_block_positions(br, C::BM, &T);
    if (rc) return rc;
    T = wg_fill_positions<D>(desc, br, T);
    const size_t smem = 1024 + C::Q_BYTES + C::KV_BYTES + 2 * (size_t)T * sizeof(float);
    if (smem > 200 * 1024) return sf_error(SF_E_UNSUPPORTED, "cuda attention: block of %ld positions too large", T);
    cudaError_t err =
        cudaFuncSetAttribute(attention_wgmma<D, QT, MIX>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma): %s", cudaGetErrorString(err));
    att_staged st;
    if constexpr (IN_PLACE)
        rc = att_stage_globals(desc, k, v, ws, &st, stream, true);
    else
        rc = att_stage_workspace(desc, k, v, ws, &st, stream, true);
    if (rc) return rc;
    const int nblocks = (int)((desc->n + T - 1) / T);
    att_order ord; /* copied into the launch parameters */
    att_heaviest_first(desc, br, (int)T, nblocks, &ord);
    const unsigned grid = (unsigned)nblocks * desc->heads;
    const sf_cuda_attention_mix no_mix = {};
    err = sf_cuda_launch_early(attention_wgmma<D, QT, MIX>, grid, C::THREADS, smem, stream, *desc, br, (int)T, q, st,
                               out, ord, MIX ? *mix : no_mix);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma): %s", cudaGetErrorString(err));
    return SF_OK;
}

/* The launch for head width D on q/k/v as desc->qkv_type says (float32 or bf16), `mix` fused
 * where given (bf16, d = 64: the caller checked). */
template <int D>
static int launch_width(const sf_attention_desc *desc, const att_branches &br, const void *q, const void *k,
                        const void *v, float *out, unsigned char *ws, cudaStream_t stream,
                        const sf_cuda_attention_mix *mix)
{
    using B = __nv_bfloat16;
    if (desc->qkv_type != SF_DTYPE_BF16)
        return launch_wgmma<D, float, false>(desc, br, static_cast<const float *>(q), static_cast<const float *>(k),
                                             static_cast<const float *>(v), out, ws, stream, nullptr);
    if constexpr (D == 64)
        if (mix)
            return launch_wgmma<D, B, true>(desc, br, static_cast<const B *>(q), static_cast<const B *>(k),
                                            static_cast<const B *>(v), out, ws, stream, mix);
    return launch_wgmma<D, B, false>(desc, br, static_cast<const B *>(q), static_cast<const B *>(k),
                                     static_cast<const B *>(v), out, ws, stream, nullptr);
}

int att_check_bf16_inputs(const sf_attention_desc *desc, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v)
{
    const int G = desc->n_global;
    const bool aligned = ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16 == 0;
    if (desc->ld % 8 || !aligned ||
        (G > 0 && (desc->global_ld % 4 || ((uintptr_t)desc->gk | (uintptr_t)desc->gv) % 16)))
        return sf_error(SF_E_UNSUPPORTED,
                        "cuda attention: bf16 q/k/v need 16-byte alignment and row strides a multiple of 8 (ld %d)",
                        desc->ld);
    return SF_OK;
}

extern "C" int sf_cuda_attention_wgmma_usable(const sf_attention_desc *desc, const sf_cuda_device_info *dev)
{
    if ((desc->head_dim != 64 && desc->head_dim != 128) || !dev || dev->major != 9 || dev->minor != 0) return 0;
    /* per device: an sm_90a image of the kernels in this binary */
    static signed char known[64]; /* 0 unknown, 1 usable, -1 not; a benign race fills it */
    if (dev->device < 0 || dev->device >= 64) return 0;
    if (!known[dev->device]) {
        /* the image is looked up on the current device: ask again from a thread that runs `dev` */
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        if (cur != dev->device) return 0;
        cudaFuncAttributes fa;
        const bool ok = cudaFuncGetAttributes(&fa, attention_wgmma<64, float, false>) == cudaSuccess;
        cudaGetLastError(); /* a missing image must not linger as the next launch's error */
        known[dev->device] = ok ? 1 : -1;
    }
    return known[dev->device] > 0;
}

extern "C" int sf_cuda_attention_wgmma(const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                                       float *out, const sf_cuda_attention_mix *mix, void *workspace,
                                       size_t workspace_bytes, cudaStream_t stream)
{
    const bool bf16_in = desc->qkv_type == SF_DTYPE_BF16;
    if (desc->qkv_type != SF_DTYPE_F32 && !bf16_in)
        return sf_error(SF_E_INVAL, "cuda attention: q/k/v of unknown type %d", (int)desc->qkv_type);
    if (mix && !bf16_in) return sf_error(SF_E_UNSUPPORTED, "cuda attention: the fused mix reads bf16 q/k/v only");
    if (desc->head_dim != 64 && desc->head_dim != 128)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention (wgmma): head width %d, built for 64 and 128",
                        desc->head_dim);
    if (mix && desc->head_dim != 64)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: the fused mix is built for d = 64, not %d", desc->head_dim);
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    unsigned char *ws = static_cast<unsigned char *>(workspace);
    rc = desc->head_dim == 64 ? launch_width<64>(desc, br, q, k, v, out, ws, stream, mix)
                              : launch_width<128>(desc, br, q, k, v, out, ws, stream, mix);
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention (wgmma) launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
