/* The memory's stream kernels (d = 64, bf16 q/k/v, bf16 operands: the H100 pipeline's case): the
 * mix, and the pieces the update (memory_stream_update.cuh) shares with it (sigma, the lanes'
 * features, M_h staged as B fragments, the retrieval). Self-contained (device code), so that the
 * attention kernel can apply the mix to the rows it has just finished (sf_cuda_attention_with_mix)
 * as well as memory.cu to a whole segment.
 *
 * Why a second mix: the tiled kernels (memory.cu) walk 64-row tiles with two or three block
 * barriers each and reach ~1/3 of the bytes floor (bench/lab/MEMORY_NOTES.md). Here a warp owns 16
 * rows of one head at a time and needs no barrier after M_h is staged: it loads its rows of q and
 * a straight into registers, applies sigma there, multiplies by M_h on the tensor cores and
 * writes its rows. Nothing is exchanged between warps, so latency is hidden by the warps alone.
 *
 * The trick that makes the loads whole 16-byte runs: a dot product's k order is free (permute A's
 * columns and B's rows alike) and a product's output columns follow B's. So lane t of a quad
 * holds features {8t..8t+7} and {32+8t..32+8t+7} of its two rows (two coalesced 16-byte loads a
 * row), which fill its m16n8k16 A slots in load order, and the output columns it holds are
 * {16m + 4t .. 16m + 4t + 3 : m < 4} (one float4 of a, 8 bytes of out each), with M_h's rows and
 * columns permuted to match when it is staged (stage_stream_b). */
#ifndef SEQFLOW_KERNELS_CUDA_MEMORY_STREAM_CUH
#define SEQFLOW_KERNELS_CUDA_MEMORY_STREAM_CUH

#include "kernels/cuda/mma_bf16.cuh"

__device__ static inline float sigma(float x) { return x > 0 ? x + 1.0f : expf(x); } /* ELU + 1 */

/* SPEC 2's gate of head h: g_h = sigmoid(gate[h]) */
__device__ static inline float memory_gate(const float *gate, int h) { return 1.0f / (1.0f + expf(-gate[h])); }

/* Word i (0..3) of 16 loaded bytes, and the two bf16 of a word as float (a bf16 is the high half
 * of its float: widening is exact; the lower element in the low half). */
__device__ static inline uint32_t word_of(const uint4 &u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }
__device__ static inline float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ static inline float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

#define STREAM_THREADS 256
#define STREAM_MIX_ROWS 256 /* rows a block: two 16-row passes a warp */

/* Feature of element e of word wi (0..7) of quad lane t: its two 16-byte runs, 8t..8t+7 and
 * 32+8t..32+8t+7, in load order. Word wi of k-step kk = wi/2 is that lane's a0a1 (wi even) or
 * a4a5 (wi odd). Host-callable for index models. */
__host__ __device__ static inline int stream_feature_of(int t, int wi, int e)
{
    return (wi >> 2) * 32 + 8 * t + 2 * (wi & 3) + e;
}
/* The mix's column of C slot (n-tile j, element e) of quad lane t: 16m + 4t .. + 3 for m = j/2,
 * one float4 of a a row */
__device__ static inline int stream_column(int t, int j, int e) { return 4 * t + 16 * (j >> 1) + 2 * (j & 1) + e; }

/* M_h (float32, [64][64]) as bf16 B fragments of 4 k-steps x 8 n-tiles, [kk][j][lane]: a lane
 * reads its two registers of a fragment with one conflict-free 8-byte load. Its rows follow
 * stream_feature_of; its columns stream_column (the mix), or, v_columns, stream_feature_of
 * (the delta update: the C fragments then land on the v words the lane holds). */
__device__ static inline void stage_stream_b(const float *__restrict__ Mh, uint2 *sB, bool v_columns, int first,
                                             int step)
{
    for (int e = first; e < 4 * 8 * 32; e += step) {
        const int kk = e >> 8, j = (e >> 5) & 7, lane = e & 31, g = lane >> 2, t = lane & 3;
        const float *col = Mh + (v_columns ? stream_feature_of(g >> 1, j, g & 1) : stream_column(g >> 1, j, g & 1));
        const float *m0 = col + 64 * stream_feature_of(t, 2 * kk, 0), *m1 = col + 64 * stream_feature_of(t, 2 * kk + 1, 0);
        sB[e] = make_uint2(pack_bf16x2(__ldg(m0), __ldg(m0 + 64)), pack_bf16x2(__ldg(m1), __ldg(m1 + 64)));
    }
}

/* The same, every thread of the block taking its share. */
__device__ static inline void stage_stream_b(const float *__restrict__ Mh, uint2 *sB, bool v_columns)
{
    stage_stream_b(Mh, sB, v_columns, threadIdx.x, blockDim.x);
}

/* A fragments of sigma(x) for a lane's two rows (raw: its two 16-byte runs a row), and
 * the lane's part of each row's sigma(x) . z */
__device__ static inline void stream_sigma(const uint4 (&raw)[2][2], const float *sz, int t, uint32_t (&A)[2][8],
                                           float (&den)[2])
{
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float part = 0;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            const uint32_t u = word_of(raw[half][w >> 2], w & 3);
            const float s0 = sigma(bf16_lo(u)), s1 = sigma(bf16_hi(u));
            part += s0 * sz[stream_feature_of(t, w, 0)] + s1 * sz[stream_feature_of(t, w, 1)];
            A[half][w] = pack_bf16x2(s0, s1);
        }
        den[half] = part;
    }
}

/* c[j] = sigma(x) M_h for n-tiles J0 .. J0 + NJ - 1 (rows g, g + 8 of the warp's 16) */
template <int J0, int NJ>
__device__ static inline void stream_retrieve(const uint32_t (&A)[2][8], const uint2 *sB, int lane, float (&c)[NJ][4])
{
#pragma unroll
    for (int j = 0; j < NJ; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a4[4] = {A[0][2 * kk], A[1][2 * kk], A[0][2 * kk + 1], A[1][2 * kk + 1]};
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const uint2 b = sB[(kk * 8 + J0 + j) * 32 + lane];
            mma_bf16(c[j], a4, b.x, b.y);
        }
    }
}

/* One warp's rows r0 .. r0 + 15 of head h as its lanes hold them: q's two 16-byte runs and a's
 * four float4 a row (zeros for rows at or past end). */
struct stream_mix_in {
    uint4 raw[2][2];
    float4 av[2][4];
};

__device__ static inline void stream_mix_load(int r0, int end, size_t ld, int h, const __nv_bfloat16 *__restrict__ q,
                                              const float *__restrict__ a, stream_mix_in &x)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = r0 + g + 8 * half;
        const bool in = row < end;
        const __nv_bfloat16 *qr = q + (size_t)(in ? row : 0) * ld + (size_t)h * 64;
        const float *ar = a + (size_t)(in ? row : 0) * ld + (size_t)h * 64;
        /* a is read once: evict-first, so that L2 keeps out for the output product */
        x.raw[half][0] = in ? __ldcs((const uint4 *)(qr + 8 * t)) : make_uint4(0, 0, 0, 0);
        x.raw[half][1] = in ? __ldcs((const uint4 *)(qr + 32 + 8 * t)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < 4; m++)
            x.av[half][m] = in ? __ldcs((const float4 *)(ar + 16 * m + 4 * t)) : make_float4(0, 0, 0, 0);
    }
}

/* The mix of those rows (those below end): out = wg (sigma(q) M_h / den) + (1 - wg) a, a scaled,
 * with a_inv, by a_inv[row - a_base] first (0 where that is 0: the attention's unnormalized
 * rows, whose sums it holds). sB, sz: M_h (stage_stream_b) and z_h in shared memory. */
__device__ static inline void stream_mix_store(int r0, int end, size_t ld, int h, const stream_mix_in &x,
                                               const float *a_inv, int a_base, const uint2 *sB, const float *sz,
                                               float wg, __nv_bfloat16 *__restrict__ out)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t A[2][8];
    float den[2], inv[2], ainv[2];
    stream_sigma(x.raw, sz, t, A, den);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float d = den[half];
        d += __shfl_xor_sync(0xffffffffu, d, 1);
        d += __shfl_xor_sync(0xffffffffu, d, 2);
        const int row = r0 + g + 8 * half;
        inv[half] = d != 0 ? 1.0f / d : 0.0f;
        ainv[half] = a_inv && row < end ? a_inv[row - a_base] : 1.0f;
    }
    /* the columns in two halves (n-tiles 0-3: m = 0, 1; 4-7: m = 2, 3), fewer live accumulators */
#pragma unroll
    for (int cols = 0; cols < 2; cols++) {
        float c[4][4];
        if (cols == 0) stream_retrieve<0, 4>(A, sB, lane, c);
        else stream_retrieve<4, 4>(A, sB, lane, c);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int row = r0 + g + 8 * half, e = 2 * half;
            if (row >= end) continue;
#pragma unroll
            for (int mm = 0; mm < 2; mm++) {
                const int m = 2 * cols + mm;
                float4 v = x.av[half][m];
                if (a_inv) /* a select, not a product: rows no key reached may hold anything */
                    v = ainv[half] == 0 ? make_float4(0, 0, 0, 0)
                                        : make_float4(v.x * ainv[half], v.y * ainv[half], v.z * ainv[half], v.w * ainv[half]);
                const uint32_t lo = pack_bf16x2(wg * (c[2 * mm][e] * inv[half]) + (1.0f - wg) * v.x,
                                                wg * (c[2 * mm][e + 1] * inv[half]) + (1.0f - wg) * v.y);
                const uint32_t hi = pack_bf16x2(wg * (c[2 * mm + 1][e] * inv[half]) + (1.0f - wg) * v.z,
                                                wg * (c[2 * mm + 1][e + 1] * inv[half]) + (1.0f - wg) * v.w);
                *(uint2 *)(out + (size_t)row * ld + (size_t)h * 64 + 16 * m + 4 * t) = make_uint2(lo, hi);
            }
        }
    }
}

/* The mix of this warp's 16-row pieces first, first + step, ... below end. (Two pieces' loads
 * in flight at once measured slower: spills, 0.038 against 0.033 ms; MEMORY_NOTES session 5.) */
__device__ static inline void stream_mix_rows(int first, int step, int end, size_t ld, int h,
                                              const __nv_bfloat16 *__restrict__ q, const float *__restrict__ a,
                                              const float *a_inv, int a_base, const uint2 *sB, const float *sz,
                                              float wg, __nv_bfloat16 *__restrict__ out)
{
    for (int r0 = first; r0 < end; r0 += step) {
        stream_mix_in x;
        stream_mix_load(r0, end, ld, h, q, a, x);
        stream_mix_store(r0, end, ld, h, x, a_inv, a_base, sB, sz, wg, out);
    }
}

/* M_h and z_h of head h into shared memory for stream_mix_rows, by the threads first, first +
 * step, ... of those taking part (every thread of the block when not given); the caller's
 * barrier publishes them */
__device__ static inline void stage_stream_mix(const float *__restrict__ M, const float *__restrict__ z, int h,
                                               uint2 *sB, float *sz, int first, int step)
{
    stage_stream_b(M + (size_t)h * 64 * 64, sB, false, first, step);
    for (int i = first; i < 64; i += step) sz[i] = z[(size_t)h * 64 + i];
}
__device__ static inline void stage_stream_mix(const float *__restrict__ M, const float *__restrict__ z, int h,
                                               uint2 *sB, float *sz)
{
    stage_stream_mix(M, z, h, sB, sz, threadIdx.x, blockDim.x);
}

/* grid (heads, row blocks of STREAM_MIX_ROWS): out = g (sigma(q) M / den) + (1 - g) a, as bf16.
 * Heads fastest, so that the blocks reading the same rows run together (whole rows from DRAM;
 * the same order gained 2-3% on the update, MEMORY_NOTES session 5). */
__global__ static void __launch_bounds__(STREAM_THREADS, 2)
    stream_mix64_kernel(int n, int ld, const __nv_bfloat16 *__restrict__ q, const float *__restrict__ M,
                        const float *__restrict__ z, const float *__restrict__ gate, const float *__restrict__ a,
                        __nv_bfloat16 *__restrict__ out)
{
    __shared__ uint2 sB[4 * 8 * 32];
    __shared__ float sz[64];
    const int h = blockIdx.x, begin = blockIdx.y * STREAM_MIX_ROWS, end = min(n, begin + STREAM_MIX_ROWS);
    stage_stream_mix(M, z, h, sB, sz);
    const float wg = memory_gate(gate, h);
    __syncthreads();
    stream_mix_rows(begin + 16 * (threadIdx.x >> 5), 16 * (STREAM_THREADS / 32), end, ld, h, q, a, nullptr, 0, sB, sz,
                    wg, out);
}

#endif
