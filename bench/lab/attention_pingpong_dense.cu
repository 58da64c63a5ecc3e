/* Dense causal attention over windows in FlashAttention-3's and cuDNN's layout (sm_90a, d = 64,
 * bf16 q/k/v): the structure the profiler found in cuDNN's kernel (bench/lab/
 * profile_attention_peer.sh: one persistent CTA a multiprocessor, 384 threads, 128-key tiles),
 * tried here on the work the product's kernel does on one branch without dilation (a dilated
 * branch is this in its dilated index space), checked and timed against it by
 * bench_cuda_attention_pingpong.cu.
 *
 * Warpgroup 0 is the producer: one thread loads every item's Q (128 rows, two buffers) and its
 * K/V tiles (128 keys) by the bulk tensor copy engine into a ring, each completing on an
 * mbarrier; the rest of the warpgroup gives its registers away (setmaxnreg). Warpgroups 1 and 2
 * own 64 query rows each of the item's 128 and read the same K/V tiles. They take turns on the
 * tensor cores (two named barriers, "ping-pong"): in its turn a warpgroup issues P V of its last
 * tile and S = Q K^T of this one, then hands the turn over and computes its softmax while the
 * other's products run. A slot goes back to the producer when both warpgroups' P V of it is done.
 * Items (head, window, 128-row query block) are walked heaviest first (the blocks at the windows'
 * ends see the most keys), CTA b taking items b, b + grid, ... */
#include <math.h>
#include <stdint.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench/lab/lab_kernels.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma_tile.cuh"
#include "kernels/cuda/tensor_map.h"
#include "seqflow/error.h"

namespace {
constexpr int D = 64, BM = 128, BN = 128, THREADS = 384;
constexpr int Q_BYTES = BM * D * 2;       /* an item's Q: 128 rows of 128 bytes */
constexpr int TILE = BN * D * 2;          /* a K or a V tile */
constexpr int WG_Q = 64 * 128;            /* a consumer's 64 rows of Q */
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240;

template <int STAGES> struct pp_layout {
    static constexpr int KV = 2 * Q_BYTES;                  /* after the two Q buffers */
    static constexpr int BARS = KV + STAGES * 2 * TILE;     /* q_full[2] q_empty[2] kv_full[S] kv_empty[S] */
    static constexpr int BYTES = BARS + 8 * (4 + 2 * STAGES) + 1024; /* + alignment slack */
};

struct pp_item {
    int h, q0, kbeg, nkt;
};

/* Item i of the heaviest-first walk: query block qblk = nq - 1 - i / (heads * windows) of window
 * w, head h; its keys run from the window's start to the block's end (BM == BN: qblk + 1 tiles). */
__device__ __forceinline__ pp_item pp_decode(int i, int heads, int windows, int nq, int win)
{
    const int per = heads * windows, level = i / per, rest = i % per;
    const int qblk = nq - 1 - level, w = rest / heads;
    pp_item it;
    it.h = rest % heads, it.kbeg = w * win, it.q0 = it.kbeg + qblk * BM, it.nkt = qblk + 1;
    return it;
}

template <int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    attention_pingpong(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                       const __grid_constant__ CUtensorMap vmap, float *out, int ldo, int heads, int windows, int win,
                       float c)
{
#if SF_WGMMA_ENABLED
    using L = pp_layout<STAGES>;
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem) + 1023) & ~1023u;
    const uint32_t q_full = base + L::BARS, q_empty = q_full + 16, kv_full = q_empty + 16,
                   kv_empty = kv_full + 8 * STAGES;
    const int nq = win / BM, nitems = nq * heads * windows;
    if (threadIdx.x == 0) {
        /* freeing a Q buffer or a slot: lane 0 of each of the consumers' 8 warps (mbar_arrive_warp) */
        for (int b = 0; b < 2; b++) mbar_init(q_full + 8 * b, 1), mbar_init(q_empty + 8 * b, 8);
        for (int s = 0; s < STAGES; s++) mbar_init(kv_full + 8 * s, 1), mbar_init(kv_empty + 8 * s, 8);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        tma_prefetch_map(&qmap), tma_prefetch_map(&kmap), tma_prefetch_map(&vmap);
    }
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PRODUCER_REGS));
        if (threadIdx.x != 0) return;
        uint32_t kt = 0, qi = 0;
        for (int i = blockIdx.x; i < nitems; i += gridDim.x, qi++) {
            const pp_item it = pp_decode(i, heads, windows, nq, win);
            const uint32_t qb = qi & 1;
            mbar_wait(q_empty + 8 * qb, ((qi >> 1) & 1) ^ 1);
            mbar_arrive_expect_tx(q_full + 8 * qb, Q_BYTES);
            tma_load_2d(base + qb * Q_BYTES, &qmap, it.h * D, it.q0, q_full + 8 * qb);
            for (int j = 0; j < it.nkt; j++, kt++) {
                const uint32_t s = kt % STAGES, slot = base + L::KV + s * 2 * TILE;
                mbar_wait(kv_empty + 8 * s, ((kt / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(kv_full + 8 * s, 2 * TILE);
                tma_load_2d(slot, &kmap, it.h * D, it.kbeg + j * BN, kv_full + 8 * s);
                tma_load_2d(slot + TILE, &vmap, it.h * D, it.kbeg + j * BN, kv_full + 8 * s);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int mine = 1 + cw, other = 2 - cw; /* named barriers: a warpgroup's turn */
    if (cw == 1) named_arrive(1, 256);     /* the first turn is warpgroup 1's */
    const uint32_t(*no_qf)[4] = nullptr;
    uint32_t kt = 0, qi = 0;
    for (int i = blockIdx.x; i < nitems; i += gridDim.x, qi++) {
        const pp_item it = pp_decode(i, heads, windows, nq, win);
        const uint32_t qb = qi & 1, qaddr = base + qb * Q_BYTES + cw * WG_Q;
        const int wrow = it.q0 + 64 * cw + 16 * warp + g;
        wg_src src; /* only the mask's fields: keys of the window up to the row */
        src.k = src.v = nullptr, src.stride = 0;
        src.kbeg = it.kbeg, src.kend = it.q0 + BM, src.win = win, src.causal = 1;
        mbar_wait(q_full + 8 * qb, (qi >> 1) & 1);
        float acc[D / 2], s[BN / 2], mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0, 0};
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int e = 0; e < D / 2; e++) acc[e] = 0;
        uint32_t prev = 0; /* the slot of the last tile, whose P V is still to be issued */
        for (int j = 0; j < it.nkt; j++, kt++) {
            const uint32_t slot_i = kt % STAGES, slot = base + L::KV + slot_i * 2 * TILE;
            mbar_wait(kv_full + 8 * slot_i, (kt / STAGES) & 1);
            named_sync(mine, 256);
            wgmma_fence();
            if (j > 0) wg_pv<BN, D>(acc, pa, base + L::KV + prev * 2 * TILE + TILE);
            wg_qk<BN, true, D>(s, no_qf, qaddr, slot);
            wgmma_commit();
            named_arrive(other, 256);
            wgmma_wait<0>();
            reg_fence<BN / 2>(s);
            reg_fence<D / 2>(acc);
            if (j > 0) mbar_arrive_warp(kv_empty + 8 * prev);
            if (j == it.nkt - 1) mbar_arrive_warp(q_empty + 8 * qb); /* its last S is done: Q is free */
            float bmax[2];
            wg_softmax_max<BN, true, D>(s, it.kbeg + j * BN, src, wrow, j == it.nkt - 1, c, mrow, lrow, acc, bmax);
            wg_softmax_exp<BN>(s, c, bmax, lrow, pa);
            prev = slot_i;
        }
        named_sync(mine, 256);
        wgmma_fence();
        wg_pv<BN, D>(acc, pa, base + L::KV + prev * 2 * TILE + TILE);
        wgmma_commit();
        named_arrive(other, 256);
        wgmma_wait<0>();
        reg_fence<D / 2>(acc);
        mbar_arrive_warp(kv_empty + 8 * prev);
        /* rows wrow and wrow + 8: O / l, float32 */
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float l = lrow[hr];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = 1.0f / l;
            float *orow = out + (size_t)(wrow + 8 * hr) * ldo + it.h * D + 2 * t;
#pragma unroll
            for (int j = 0; j < D / 8; j++)
                __stcs(reinterpret_cast<float2 *>(orow + 8 * j),
                       make_float2(acc[4 * j + 2 * hr] * inv, acc[4 * j + 2 * hr + 1] * inv));
        }
    }
    if (cw == 0) named_sync(mine, 256); /* warpgroup 2's last hand-over */
#endif
}

template <int STAGES>
int pingpong_launch(int n, int heads, int win, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                    const __nv_bfloat16 *v, int ld, float *out, int ldo, cudaStream_t stream)
{
    CUtensorMap mq, mk, mv;
    int rc = sf_cuda_tensor_map_bf16_sw128(&mq, q, n, ld, ld, BM);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&mk, k, n, ld, ld, BN);
    if (rc == SF_OK) rc = sf_cuda_tensor_map_bf16_sw128(&mv, v, n, ld, ld, BN);
    if (rc != SF_OK) return rc;
    constexpr int smem = pp_layout<STAGES>::BYTES;
    cudaError_t err = cudaFuncSetAttribute(attention_pingpong<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int sms = 0, dev = 0;
    if (err == cudaSuccess) err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "attention pingpong: %s", cudaGetErrorString(err));
    const int windows = n / win, items = win / BM * heads * windows;
    attention_pingpong<STAGES><<<items < sms ? items : sms, THREADS, smem, stream>>>(
        mq, mk, mv, out, ldo, heads, windows, win, 1.4426950408889634f / sqrtf((float)D));
    err = cudaGetLastError();
    return err == cudaSuccess ? SF_OK : sf_error(SF_E_BACKEND, "attention pingpong: %s", cudaGetErrorString(err));
}
} // namespace

int sf_lab_attention_pingpong(int n, int heads, int win, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, int ld, float *out, int ldo, int stages, cudaStream_t stream)
{
    if (n <= 0 || win % BM || n % win || heads * D > ld)
        return sf_error(SF_E_UNSUPPORTED, "attention pingpong: n %d, window %d (a multiple of %d dividing n)", n, win, BM);
    switch (stages) {
    case 2: return pingpong_launch<2>(n, heads, win, q, k, v, ld, out, ldo, stream);
    case 3: return pingpong_launch<3>(n, heads, win, q, k, v, ld, out, ldo, stream);
    case 4: return pingpong_launch<4>(n, heads, win, q, k, v, ld, out, ldo, stream);
    default: return sf_error(SF_E_INVAL, "attention pingpong: %d stages (2, 3 or 4)", stages);
    }
}
