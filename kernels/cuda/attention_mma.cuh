/* Pieces shared by the bf16 attention kernels (attention_convert.cuh, attention_staged.cuh,
 * attention_wgmma.cu, and the lab's variants): the branch table passed by value to the kernels,
 * its validation, and the mma.sync / ldmatrix / cp.async wrappers. Header-only, static: each .cu
 * gets its own copy. */
#ifndef SEQFLOW_KERNELS_CUDA_ATTENTION_MMA_CUH
#define SEQFLOW_KERNELS_CUDA_ATTENTION_MMA_CUH

#include <stdint.h>
#include <cuda_bf16.h>

#include "kernels/cuda/mma_bf16.cuh"
#include "seqflow/backend.h"
#include "seqflow/error.h"

#define SF_ATT_MAX_BRANCHES 16

struct att_branches {
    int count;
    int window[SF_ATT_MAX_BRANCHES], dilation[SF_ATT_MAX_BRANCHES];
    int head_offset; /* sf_attention_desc.head_offset: head h's offsets are those of head_offset + h */
};

static inline int att_fill_branches(const sf_attention_desc *desc, att_branches *br)
{
    if (desc->n_branches > SF_ATT_MAX_BRANCHES)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: %d branches, at most %d supported", desc->n_branches,
                        SF_ATT_MAX_BRANCHES);
    br->count = desc->n_branches;
    br->head_offset = desc->head_offset;
    if (desc->head_offset < 0) return sf_error(SF_E_INVAL, "cuda attention: head offset %d", desc->head_offset);
    for (int b = 0; b < br->count; b++) {
        br->window[b] = desc->branches[b].window;
        br->dilation[b] = desc->branches[b].dilation;
        if (br->window[b] <= 0 || br->dilation[b] <= 0 || br->window[b] % br->dilation[b])
            return sf_error(SF_E_INVAL, "cuda attention: branch %d (%d:%d) is not a window with a dividing dilation",
                            b, br->window[b], br->dilation[b]);
    }
    return SF_OK;
}

static inline int att_gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Branch b's rows for head h over n positions (SPEC 3): the head's offset o = (head_offset + h) mod r, the
 * nd dilated rows present, the window in dilated rows, and qa1, the end (dilated, exclusive) of
 * the rows of the position block [P, P + T). Every kernel family walks the branches with it. */
struct att_branch_rows {
    int r, o, nd, win, qa1;
};

__device__ __forceinline__ att_branch_rows att_rows_of(const att_branches &br, int b, int h, int n, int P, int T)
{
    att_branch_rows g;
    g.r = br.dilation[b], g.o = (br.head_offset + h) % g.r;
    g.nd = n > g.o ? (n - g.o + g.r - 1) / g.r : 0;
    g.win = br.window[b] / g.r;
    g.qa1 = min((P + T) / g.r, g.nd);
    return g;
}

/* The keys [kbeg, kend) of the dilated query rows [qs, qe): their windows, cut at the rows
 * present and, causal, at the last query row. */
__device__ __forceinline__ void att_key_range(const att_branch_rows &g, int qs, int qe, int causal, int *kbeg, int *kend)
{
    *kbeg = qs / g.win * g.win;
    *kend = min(g.nd, ((qe - 1) / g.win + 1) * g.win);
    if (causal) *kend = min(*kend, qe);
}

/* Q rows row0 and row0 + 8 (dilated, rows past qe read as 0) as the A fragments of
 * mma.sync m16n8k16 for D columns: register i of k-step kc holds row row0 + 8(i&1), columns
 * 16kc + 2t + 8(i>>1) and the next, rounded to bf16. t = lane & 3. */
template <int D>
__device__ __forceinline__ void att_load_q_frags(uint32_t (*qf)[4], const float *qbase, size_t qstride, int row0,
                                                 int qe, int t)
{
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int x = row0 + 8 * hr;
            float2 lo = make_float2(0, 0), hi = make_float2(0, 0);
            if (x < qe) {
                const float *qr = qbase + (size_t)x * qstride + kc * 16 + 2 * t;
                lo = __ldg(reinterpret_cast<const float2 *>(qr));
                hi = __ldg(reinterpret_cast<const float2 *>(qr + 8));
            }
            qf[kc][hr] = pack_bf16x2(lo.x, lo.y);
            qf[kc][2 + hr] = pack_bf16x2(hi.x, hi.y);
        }
}

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *p)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* 16-byte asynchronous copy global -> shared; src_bytes 0 fills the 16 bytes with zeros
 * (rows past the end of the keys must be zeros: P = 0 times garbage could be NaN). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ---- non-finite values of V on masked key tiles (every bf16 kernel) ------------------------
 * O += P V runs on whole key tiles: a key masked for a row still enters the product with P = 0,
 * and 0 times NaN or infinity is NaN, so one non-finite V value would reach rows that must not
 * see its key (earlier rows under the causal mask, other windows, rows past the end). The CPU
 * and the float32 kernel skip masked keys. The tensor-core kernels match them this way, only on
 * tiles that need a mask (a tile without one is seen whole by every row of the query tile, and
 * multiplying by the NaN is then the right answer): once the tile is in shared memory, the
 * non-finite values of its V rows are set to 0 (att_scrub16) and the keys that held one noted
 * (att_block_bad_keys, bit i for key k0 + i); every row that sees such a key (att_row_sees: its
 * unmasked keys, SPEC 3) is made NaN before it is merged, as the CPU's would be.
 * K needs nothing: a masked score is overwritten with -inf, whatever Q K^T gave; a NaN score a
 * row does see makes its sum l NaN, which merge_tile_row carries into the output. */

/* Bit 15 (31) set when the low (high) bf16 of w is non-finite: its exponent bits (0x7f80) all
 * set. Adding 0x0080 to them carries into bit 15 then only, and never out of the 16-bit half. */
__device__ __forceinline__ uint32_t att_bf16x2_nonfinite(uint32_t w)
{
    return ((w & 0x7f807f80u) + 0x00800080u) & 0x80008000u;
}

/* w with the halves att_bf16x2_nonfinite flagged in `top` set to 0 */
__device__ __forceinline__ uint32_t att_bf16x2_zero(uint32_t w, uint32_t top) { return w & ~((top >> 15) * 0xffffu); }

/* 16 bytes (8 bf16 values of a V row) of shared memory at `addr`: the non-finite values are set
 * to 0 in place; returns whether there were any. */
__device__ __forceinline__ bool att_scrub16(uint32_t addr)
{
    uint32_t w[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(addr)
                 : "memory");
    uint32_t top[4], any = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        top[i] = att_bf16x2_nonfinite(w[i]);
        any |= top[i];
    }
    if (!any) return false;
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = att_bf16x2_zero(w[i], top[i]);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
    return true;
}

/* att_scrub16 on 8 bytes (4 bf16 values) of shared memory at p */
__device__ __forceinline__ bool att_scrub8(uint2 *p)
{
    const uint2 w = *p;
    const uint32_t t0 = att_bf16x2_nonfinite(w.x), t1 = att_bf16x2_nonfinite(w.y);
    if (!(t0 | t1)) return false;
    *p = make_uint2(att_bf16x2_zero(w.x, t0), att_bf16x2_zero(w.y, t1));
    return true;
}

/* att_scrub16 over this thread's share of a V tile of the mma.sync kernels: BN key rows of D
 * bf16, rows PAD elements apart from `vs` (shared memory). Returns bit i set when key row i held
 * a non-finite value. */
template <int BN, int D, int PAD, int THREADS>
__device__ __forceinline__ uint64_t att_scrub_v_tile(const __nv_bfloat16 *vs)
{
    constexpr int CPR = D / 8, PER = BN * CPR / THREADS;
    static_assert(BN <= 64 && (BN * CPR) % THREADS == 0, "a tile's keys fit the 64-bit mask, its chunks the threads");
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(vs);
    uint64_t mine = 0;
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int f = threadIdx.x + u * THREADS, key = f / CPR, c8 = f % CPR;
        if (att_scrub16(base + (uint32_t)(key * PAD + c8 * 8) * 2)) mine |= 1ull << key;
    }
    return mine;
}

/* The keys of the tile (bit i: key k0 + i, 64 at most) whose V row held a non-finite value,
 * from every thread's `mine`. One block barrier when no thread found one (the usual case); a
 * second, and `slots` (one 64-bit word a warp, shared memory), only when some did. Every thread
 * of the block (WARPS warps) calls it; the V tile's scrubbed values are visible to the block's
 * threads on return (to the async proxy too when the writers fenced before calling). */
template <int WARPS>
__device__ __forceinline__ uint64_t att_block_bad_keys(uint64_t mine, unsigned long long *slots)
{
    if (!__syncthreads_or(mine != 0)) return 0;
    const uint32_t lo = __reduce_or_sync(0xffffffffu, (uint32_t)mine);
    const uint32_t hi = __reduce_or_sync(0xffffffffu, (uint32_t)(mine >> 32));
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = ((unsigned long long)hi << 32) | lo;
    __syncthreads();
    uint64_t all = 0;
#pragma unroll
    for (int w = 0; w < WARPS; w++) all |= slots[w];
    return all;
}

/* Whether dilated query row x sees a key flagged in `bad` (bit i: key k0 + i): the keys of its
 * window of `win` rows, cut at kend and (causal) at x itself; the masks' own rule. */
__device__ __forceinline__ bool att_row_sees(uint64_t bad, int k0, int x, int win, int kend, int causal)
{
    const int lo = x / win * win;
    int hi = min(lo + win, kend);
    if (causal) hi = min(hi, x + 1);
    const int a = max(lo - k0, 0), b = min(hi - k0, 64);
    if (b <= a) return false;
    return (bad & ((~0ull >> (64 - (b - a))) << a)) != 0;
}

/* Merges one query row of a finished tile into the block's accumulator row (SPEC 3's
 * log-sum-exp merge): the row of `out` at li + P (columns from 2t, the thread's pairs) and the
 * row's running max and sum in m_s[li], l_s[li]. Every thread of the warp calls it (it
 * synchronizes the warp); the quad of 4 threads sharing the row adds its partial sums l.
 * pair(j) is the thread's two output values of column block j (columns 8j + 2t, + 1). A row
 * whose O or l is NaN stays NaN in `out` and l_s. */
template <int D, typename Pair>
__device__ __forceinline__ void merge_tile_row(float *out, size_t ld, int t, float *m_s, float *l_s, bool row_valid,
                                               int li, int P, float m, float l, Pair pair)
{
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    /* l != 0, not l > 0: a NaN sum (a NaN score the row sees) must reach the output */
    const bool live = row_valid && l != 0;
    float mold = 0, lold = 0;
    if (live) mold = m_s[li], lold = l_s[li];
    __syncwarp();
    if (!live) return;
    float *orow = out + (size_t)(li + P) * ld + t * 2;
    if (lold == 0) {
#pragma unroll
        for (int j = 0; j < D / 8; j++) *reinterpret_cast<float2 *>(orow + j * 8) = pair(j);
        if (t == 0) m_s[li] = m, l_s[li] = l;
        return;
    }
    const float mn = fmaxf(mold, m);
    const float ca = fast_exp2(mold - mn), cb = fast_exp2(m - mn);
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        float2 o = *reinterpret_cast<float2 *>(orow + j * 8);
        const float2 a = pair(j);
        o.x = o.x * ca + a.x * cb;
        o.y = o.y * ca + a.y * cb;
        *reinterpret_cast<float2 *>(orow + j * 8) = o;
    }
    if (t == 0) m_s[li] = mn, l_s[li] = lold * ca + l * cb;
}

/* A block's last step: the rows [P, Pend) of its head's output (outh, D columns, rows ld apart)
 * divided by their merged sums l_s, 0 where no key was seen. Threads from threadIdx.x, `step`
 * apart; STREAM stores evict-first (the output is read once, by the next op). */
template <int D, bool STREAM = false>
__device__ __forceinline__ void normalize_block_rows(float *outh, size_t ld, int P, int Pend, const float *l_s, int step)
{
    for (int f = threadIdx.x; f < (Pend - P) * (D / 4); f += step) {
        const int li = f / (D / 4), c4 = f % (D / 4);
        float4 *dst = reinterpret_cast<float4 *>(outh + (size_t)(P + li) * ld) + c4;
        const float l = l_s[li];
        if (l == 0) {
            if (STREAM)
                __stcs(dst, make_float4(0, 0, 0, 0));
            else
                *dst = make_float4(0, 0, 0, 0);
        } else {
            const float inv = 1.0f / l;
            float4 o = *dst;
            o = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
            if (STREAM)
                __stcs(dst, o);
            else
                *dst = o;
        }
    }
}

#endif
