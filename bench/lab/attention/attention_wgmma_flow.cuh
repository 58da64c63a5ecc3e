/* The flow kernel of the lab's wgmma variants (39-42), kept with its measurements
 * (bench/lab/ATTENTION_NOTES.md); included by attention_wgmma_variants.cu only, after the main
 * kernel, whose helpers and configuration it uses. */
#ifndef SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_FLOW_CUH
#define SEQFLOW_BENCH_LAB_ATTENTION_WGMMA_FLOW_CUH

/* ---- the flow kernel (variants 39, 40): one stream of key tiles across query tiles ----------
 * In attention_wgmma_variant every query tile starts cold: its Q is loaded and its first key tiles are
 * requested only once the previous tile has merged, so each query tile (12 key tiles on average at
 * the reference shape) pays a global-load round trip for Q, another for the first K/V tile and the
 * merge's read of `out`, one after the other. Here a block's query tiles (every branch, then the
 * global tokens) form one sequence of key tiles: the copies run AHEAD tiles ahead across query
 * tiles (into the ring slots the last tiles of a query tile free), and the next query tile's Q
 * loads are issued before this one's merge, so both latencies overlap it. The tile math is 36's. */
/* FLOW options (variants 41 and 42 take one away from 39 each, to see which one costs) */
enum { FL_CROSS = 1, /* copies run ahead across query tiles */
       FL_EARLY_Q = 2 /* the next query tile's Q loads go out before this one's merge */ };

#if SF_WGMMA_ENABLED
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

template <class C, int MINB, int FLOW>
__global__ void __launch_bounds__(C::THREADS, MINB)
    attention_wgmma_flow(sf_attention_desc dd, att_branches br, int T, const float *q, lab_staged st, float *out,
                         const att_order ord, int per_cta)
{
#if SF_WGMMA_ENABLED
    static_assert(C::NWG == 1 && C::QS && !C::OVERLAP && !C::FA3 && C::SOFTMAX == 0, "the flow kernel is 36's loop");
    constexpr int BN = C::BN, STAGES = C::STAGES, BM = C::BM;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t qaddr = (base + 1023) & ~1023u, kv = qaddr + C::Q_BYTES;
    float *m_s = reinterpret_cast<float *>(smem + (kv - base) + C::KV_BYTES), *l_s = m_s + T;
    (void)per_cta; /* one position block a CTA */
    const int h = blockIdx.x % dd.heads, e = blockIdx.x / dd.heads;
    const int nblocks = (dd.n + T - 1) / T;
    const int P = (ord.count ? ord.block[e] : nblocks - 1 - e) * T, Pend = min(P + T, dd.n);
    const size_t ld = dd.ld;
    const float c = dd.scale * 1.4426950408889634f;
    float *outh = out + h * WG_D;
    const int nb = br.count + (dd.n_global > 0 ? 1 : 0); /* b == br.count: the global tokens */

    /* query tile (b, qs) of this block */
    auto tile_of = [&](int b, int qs, wg_qtile &t) {
        t.qs = qs;
        if (b < br.count) {
            const att_branch_rows g = att_rows_of(br, b, h, dd.n, P, T);
            const int r = g.r, o = g.o;
            t.src = wg_branch_src(st, h, g, dd.causal);
            t.qe = min(qs + BM, g.qa1);
            att_key_range(g, qs, t.qe, dd.causal, &t.src.kbeg, &t.src.kend);
            t.qbase = q + (size_t)o * ld + h * WG_D, t.qstride = (size_t)r * ld, t.opos0 = o, t.ostep = r;
        } else {
            t.src = wg_global_src(st, h, dd.n_global);
            t.qe = min(qs + BM, Pend);
            t.qbase = q + h * WG_D, t.qstride = ld, t.opos0 = 0, t.ostep = 1;
        }
    };
    /* moves (b, qs) to the first query tile with keys at or after it (qs < 0: the start of branch
     * b) and fills t; false past the last */
    auto seek = [&](int &b, int &qs, wg_qtile &t) -> bool {
        for (; b < nb; b++, qs = -1) {
            int lo = P, hi = Pend;
            if (b < br.count) {
                const int r = br.dilation[b], o = h % r;
                lo = P / r, hi = min((P + T) / r, dd.n > o ? (dd.n - o + r - 1) / r : 0);
            }
            for (qs = max(qs, lo); qs < hi; qs += BM) {
                tile_of(b, qs, t);
                if (t.src.kend > t.src.kbeg) return true;
            }
        }
        return false;
    };
    auto nkt_of = [](const wg_src &s) { return (s.kend - s.kbeg + BN - 1) / BN; };

    /* the copy cursor: query tile (cb, cqs), its key tile cnt of cnkt, into ring slot cslot */
    int cb = 0, cqs = -1, cnt = 0, cnkt = 0, cslot = 0;
    wg_stream32<C> cs;
    {
        wg_qtile tq;
        if (seek(cb, cqs, tq)) cs.init(tq.src), cnkt = nkt_of(tq.src);
    }
    auto advance = [&]() {
        wg_qtile tq;
        cqs += BM, cnt = 0, cnkt = 0;
        if (seek(cb, cqs, tq)) cs.init(tq.src), cnkt = nkt_of(tq.src);
    };
    /* the next key tile into the next slot (without FL_CROSS, none past the query tile's last) */
    auto issue_one = [&]() {
        if ((FLOW & FL_CROSS) && cnkt > 0 && cnt == cnkt) advance();
        if (cnt < cnkt) {
            cs.issue(cnt, kv + cslot * C::STAGE);
            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
            cnt++;
        }
        cp_async_commit();
    };

    for (int i = threadIdx.x; i < T; i += C::THREADS) m_s[i] = -INFINITY, l_s[i] = 0;
#pragma unroll
    for (int p = 0; p < C::AHEAD; p++) issue_one();
    int qb = 0, qq = -1;
    wg_qtile cur;
    bool have = seek(qb, qq, cur);
    if (have) {
        float4 qr[8];
        wg_q_load<C::STREAM>(cur, qr);
        wg_q_store(qaddr, qr);
    }

    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const uint32_t(*no_qf)[4] = nullptr;
    int slot = 0;
    while (have) {
        const wg_src &src = cur.src;
        const int nkt = nkt_of(src);
        const int qs_w = cur.qs, qe_w = cur.qe, wrow = qs_w + warp * 16 + g;
        const int qwin = qs_w / src.win, qlast = max(qe_w, qs_w + 1) - 1;
        const bool qwin_same = qwin == qlast / src.win;
        const int wlo = qwin * src.win, whi = min(wlo + src.win, src.kend);
        float acc[WG_D / 2];
#pragma unroll
        for (int i = 0; i < WG_D / 2; i++) acc[i] = 0;
        float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
        float s[BN / 2];
        uint32_t pa[BN / 16][4];
        for (int it = 0; it < nkt; it++) {
            cp_async_wait<STAGES - 2>(); /* this thread's part of key tile `it` has landed */
            fence_proxy_async();
            __syncthreads(); /* everyone's has, and the previous key tile is done with */
            const int k0 = src.kbeg + it * BN;
            const uint32_t kaddr = kv + slot * C::STAGE;
            slot = slot + 1 == STAGES ? 0 : slot + 1;
            wgmma_fence();
            wg_qk<BN, true>(s, no_qf, qaddr, kaddr);
            wgmma_commit();
            issue_one(); /* into the slot of the previous key tile, perhaps of the next query tile */
            wgmma_wait<0>();
            reg_fence<BN / 2>(s);
            const bool need_mask = !qwin_same || k0 < wlo || k0 + BN > whi || (src.causal && k0 + BN - 1 > qs_w);
            float bse[2];
            wg_softmax_max<BN>(s, k0, src, wrow, need_mask, c, mrow, lrow, acc, bse);
            wg_softmax_exp<BN>(s, c, bse, lrow, pa);
            wg_pv_wait<BN>(acc, pa, kaddr + C::TILE);
        }
        /* the next query tile's Q loads go out before this tile's merge, which waits on `out` */
        int nqb = qb, nqq = qq + BM;
        wg_qtile nxt;
        const bool more = seek(nqb, nqq, nxt);
        float4 qr[8];
        if ((FLOW & FL_EARLY_Q) && more) wg_q_load<C::STREAM>(nxt, qr);
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int x = wrow + 8 * hr;
            merge_tile_row<WG_D>(outh, ld, t, m_s, l_s, x < qe_w, cur.opos0 + x * cur.ostep - P, P, mrow[hr],
                                 lrow[hr], [&](int j) { return make_float2(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]); });
        }
        __syncthreads(); /* m_s/l_s, and everyone's last S = Q K^T is done with the Q tile */
        if (!(FLOW & FL_CROSS) && more) {
            advance();
#pragma unroll
            for (int p = 0; p < C::AHEAD; p++) issue_one();
        }
        if (!(FLOW & FL_EARLY_Q) && more) wg_q_load<C::STREAM>(nxt, qr);
        if (more) wg_q_store(qaddr, qr);
        cur = nxt, qb = nqb, qq = nqq, have = more;
    }
    __syncthreads(); /* l_s, when the block had no query tile */
    normalize_block_rows<WG_D, C::STREAM>(outh, ld, P, Pend, l_s, C::THREADS);
#endif
}

#endif
