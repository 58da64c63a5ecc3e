/* The compressive-memory kernels with their products on the tensor cores (d = 32, 64): the
 * twins of memory.cu's FMA kernels, which include this file after the tile helpers these use
 * (tile copies, sigma, the v widening, the mix's stores, the z partial). Device code only. */
#ifndef SEQFLOW_KERNELS_CUDA_MEMORY_MMA_CUH
#define SEQFLOW_KERNELS_CUDA_MEMORY_MMA_CUH

#include "kernels/cuda/mma_bf16.cuh"

/* ---- the same kernels with the products on the tensor cores (d = 32, 64) -------------------
 * 3xTF32 on mma.sync m16n8k8: x = big + small with big = tf32(x), small = tf32(x - big), and
 * a b ~ big_a big_b + big_a small_b + small_a big_b, accumulated in float32; the dropped
 * small_a small_b is 2^-22 of the product, so the results keep float32 accuracy (plain TF32
 * would be ~1e-3 off, over the backend's 1e-4). Everything around the products (copies, sigma,
 * the double denominators, the z sums, the chunk partials and their reduce) is memory.cu's.
 * Fragment loads read shared memory without bank conflicts: raw tiles and sigma(x) rows are
 * D + 4 floats apart, M_h rows D + 8. The retrieval's warp w computes rows 16 (w % 4).. and
 * columns (D / 2)(w / 4).. of the tile; the update's warp w owns rows 16 (w % UM).. and columns
 * UW (w / UM).. of the chunk's partial. */

template <int D>
struct mma_shape {
    static constexpr int LDR = D + 4; /* raw tiles and sigma(x) */
    static constexpr int LDM = D + 8; /* M_h */
    static constexpr int RAW = TILE_ROWS * LDR;
    static constexpr int RN = D / 16;               /* retrieval: n-tiles of 8 columns a warp */
    static constexpr int UM = D / 16, UW = D * D / 128, UN = UW / 8; /* update: m-tiles, columns, n-tiles */
    static_assert(TILE_THREADS == 256 && TILE_ROWS == 64 && (D == 32 || D == 64), "warp layout of 8 warps");
    static_assert(LDR == tile_shape<D>::LDX, "tile_sigma writes sigma(x) rows LDX apart");
};

template <int D>
static size_t mma_shared_bytes(bool with_m)
{
    typedef mma_shape<D> S;
    return sizeof(float) * ((with_m ? (size_t)D * S::LDM : 0) + D + TILE_ROWS + (size_t)TILE_ROWS * S::LDR +
                            4 * (size_t)S::RAW);
}

__device__ static inline unsigned to_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ static inline void split_tf32(float x, unsigned &big, unsigned &small)
{
    big = to_tf32(x);
    small = to_tf32(x - __uint_as_float(big)); /* x - big is exact */
}
__device__ static inline void mma_tf32(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* c += a b for one k-step, a already split; the small terms first, while c is smallest */
__device__ static inline void mma_3xtf32(float (&c)[4], const unsigned (&ab)[4], const unsigned (&as)[4], float b0,
                                         float b1)
{
    unsigned bb0, bs0, bb1, bs1;
    split_tf32(b0, bb0, bs0), split_tf32(b1, bb1, bs1);
    mma_tf32(c, as, bb0, bb1);
    mma_tf32(c, ab, bs0, bs1);
    mma_tf32(c, ab, bb0, bb1);
}

/* Precision bf16 (the backend's, SF_PRECISION_BF16) rounds the products' operands to bf16 and
 * accumulates in float32, as for every other product (seqflow/backend.h): one m16n8k16 mma
 * (mma_bf16.cuh) where 3xTF32 takes three m16n8k8 ones for half the k. Same fragment owners as
 * below, so the kernels around the products do not change. */

/* acc[nt] = the C fragments (rows g, g + 8; columns 2t, 2t + 1 of n-tile nt) of this warp's
 * part of sigma(X) M: A[r][j] = sx[r][j], B[j][c] = M[j][c]. BF: bf16 operands. */
template <int D, bool BF = false>
__device__ static inline void mma_retrieve(const float *sx, const float *sM, float (&acc)[mma_shape<D>::RN][4])
{
    typedef mma_shape<D> S;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const float *x0 = sx + (16 * (w % 4) + g) * S::LDR, *x1 = x0 + 8 * S::LDR;
    if constexpr (BF) {
        const float *mc = sM + (D / 2) * (w / 4) + g;
#pragma unroll
        for (int nt = 0; nt < S::RN; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
#pragma unroll
        for (int j0 = 0; j0 < D; j0 += 16) {
            const int k = j0 + 2 * t;
            const unsigned a[4] = {pack_bf16x2(x0[k], x0[k + 1]), pack_bf16x2(x1[k], x1[k + 1]),
                                   pack_bf16x2(x0[k + 8], x0[k + 9]), pack_bf16x2(x1[k + 8], x1[k + 9])};
#pragma unroll
            for (int nt = 0; nt < S::RN; nt++) {
                const float *m = mc + 8 * nt;
                mma_bf16(acc[nt], a, pack_bf16x2(m[k * S::LDM], m[(k + 1) * S::LDM]),
                         pack_bf16x2(m[(k + 8) * S::LDM], m[(k + 9) * S::LDM]));
            }
        }
        return;
    }
    const float *m = sM + t * S::LDM + (D / 2) * (w / 4) + g;
#pragma unroll
    for (int nt = 0; nt < S::RN; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
#pragma unroll
    for (int j0 = 0; j0 < D; j0 += 8) {
        unsigned ab[4], as[4];
        split_tf32(x0[j0 + t], ab[0], as[0]), split_tf32(x1[j0 + t], ab[1], as[1]);
        split_tf32(x0[j0 + t + 4], ab[2], as[2]), split_tf32(x1[j0 + t + 4], ab[3], as[3]);
#pragma unroll
        for (int nt = 0; nt < S::RN; nt++)
            mma_3xtf32(acc[nt], ab, as, m[j0 * S::LDM + 8 * nt], m[(j0 + 4) * S::LDM + 8 * nt]);
    }
}

/* acc += this warp's part of sigma(X)^T T over the tile's 64 rows: A[j][r] = sx[r][j],
 * B[r][c] = T[r][c]. Lane t takes tile rows r0 + 2t and r0 + 2t + 1 as the k-step's k = t and
 * t + 4 in A and B alike (the order of a sum's terms is free), which keeps the loads of both
 * free of bank conflicts. */
template <int D, bool BF = false>
__device__ static inline void mma_accumulate(const float *sx, const float *sT, float (&acc)[mma_shape<D>::UN][4])
{
    typedef mma_shape<D> S;
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    if constexpr (BF) { /* k = the tile's rows: lane t takes rows 2t, 2t + 1 (+ 8), as the fragments want */
        const float *xj = sx + 16 * (w % S::UM) + g, *bc = sT + S::UW * (w / S::UM) + g;
#pragma unroll 2
        for (int r0 = 0; r0 < TILE_ROWS; r0 += 16) {
            const float *x0 = xj + (r0 + 2 * t) * S::LDR, *x1 = x0 + S::LDR, *x8 = x0 + 8 * S::LDR, *x9 = x8 + S::LDR;
            const unsigned a[4] = {pack_bf16x2(x0[0], x1[0]), pack_bf16x2(x0[8], x1[8]), pack_bf16x2(x8[0], x9[0]),
                                   pack_bf16x2(x8[8], x9[8])};
            const float *b0 = bc + (r0 + 2 * t) * S::LDR, *b1 = b0 + S::LDR, *b8 = b0 + 8 * S::LDR, *b9 = b8 + S::LDR;
#pragma unroll
            for (int nt = 0; nt < S::UN; nt++)
                mma_bf16(acc[nt], a, pack_bf16x2(b0[8 * nt], b1[8 * nt]), pack_bf16x2(b8[8 * nt], b9[8 * nt]));
        }
        return;
    }
    const float *x = sx + 2 * t * S::LDR + 16 * (w % S::UM) + g;
    const float *b = sT + 2 * t * S::LDR + S::UW * (w / S::UM) + g;
#pragma unroll 2
    for (int r0 = 0; r0 < TILE_ROWS; r0 += 8) {
        const float *x0 = x + r0 * S::LDR, *x1 = x0 + S::LDR;
        unsigned ab[4], as[4];
        split_tf32(x0[0], ab[0], as[0]), split_tf32(x0[8], ab[1], as[1]);
        split_tf32(x1[0], ab[2], as[2]), split_tf32(x1[8], ab[3], as[3]);
#pragma unroll
        for (int nt = 0; nt < S::UN; nt++)
            mma_3xtf32(acc[nt], ab, as, b[r0 * S::LDR + 8 * nt], b[(r0 + 1) * S::LDR + 8 * nt]);
    }
}

template <int D>
__device__ static inline void stage_memory_padded(const float *M, const float *z, int h, bool with_m, float *sM,
                                                  float *sz)
{
    if (with_m)
        for (int u = threadIdx.x; u < D * D / 4; u += TILE_THREADS)
            *(float4 *)(sM + (u / (D / 4)) * mma_shape<D>::LDM + (u % (D / 4)) * 4) =
                __ldg((const float4 *)(M + (size_t)h * D * D) + u);
    for (int u = threadIdx.x; u < D; u += TILE_THREADS) sz[u] = z[(size_t)h * D + u];
}

/* tiled_mix_kernel with the retrieval on the tensor cores */
template <int D, typename T, typename OT, bool BF>
__global__ static void __launch_bounds__(TILE_THREADS, 2)
    mma_mix_kernel(int n, int rows_per_chunk, int ld, const T *__restrict__ q, const float *__restrict__ M,
                   const float *__restrict__ z, const float *__restrict__ gate, const float *a, OT *out)
{
    typedef mma_shape<D> S;
    extern __shared__ float4 shared4[];
    float *sM = (float *)shared4, *sz = sM + D * S::LDM, *sinv = sz + D, *sx = sinv + TILE_ROWS;
    float *raw = sx + TILE_ROWS * S::LDR; /* stage s: q at raw + 2s RAW, a after it */
    const int h = blockIdx.y, begin = blockIdx.x * rows_per_chunk, end = min(n, begin + rows_per_chunk);
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int r_lo = 16 * (w % 4) + lane / 4, c0 = (D / 2) * (w / 4) + 2 * (lane % 4);
    const float wg = memory_gate(gate, h);
    double unused[4];
    stage_copy<D, S::LDR>(raw, raw + S::RAW, q, a, ld, h, begin, end);
    stage_memory_padded<D>(M, z, h, true, sM, sz);
    for (int i0 = begin, s = 0; i0 < end; i0 += TILE_ROWS, s ^= 1) {
        float *rq = raw + 2 * s * S::RAW, *ra = rq + S::RAW;
        copy_wait_all();
        __syncthreads(); /* this tile's copies are visible; the previous tile's readers are done */
        if (i0 + TILE_ROWS < end)
            stage_copy<D, S::LDR>(raw + 2 * (s ^ 1) * S::RAW, raw + (2 * (s ^ 1) + 1) * S::RAW, q, a, ld, h,
                                  i0 + TILE_ROWS, end);
        tile_sigma<D, true, false, raw_stride<T, D, S::LDR>>((const T *)rq, i0, end, sz, sx, sinv, unused);
        __syncthreads();
        float acc[S::RN][4];
        mma_retrieve<D, BF>(sx, sM, acc);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = r_lo + 8 * half, row = i0 + r;
            if (row >= end) continue;
            const float inv = sinv[r];
#pragma unroll
            for (int nt = 0; nt < S::RN; nt++) {
                const int col = c0 + 8 * nt;
                float2 o = *(const float2 *)(ra + r * S::LDR + col);
                o.x = wg * (acc[nt][2 * half] * inv) + (1.0f - wg) * o.x;
                o.y = wg * (acc[nt][2 * half + 1] * inv) + (1.0f - wg) * o.y;
                store_mixed(out + (size_t)row * ld + (size_t)h * D + col, o);
            }
        }
    }
}

/* tiled_update_kernel with both products on the tensor cores */
template <int D, bool DELTA, typename T, bool BF>
__global__ static void __launch_bounds__(TILE_THREADS, 2)
    mma_update_kernel(int n, int rows_per_chunk, int heads, int ld, const T *__restrict__ k,
                      const T *__restrict__ v, const float *__restrict__ M, const float *__restrict__ z,
                      float *__restrict__ partM, double *__restrict__ partz)
{
    typedef mma_shape<D> S;
    extern __shared__ float4 shared4[];
    float *sM = (float *)shared4, *sz = sM + (DELTA ? D * S::LDM : 0), *sinv = sz + D, *sx = sinv + TILE_ROWS;
    float *raw = sx + TILE_ROWS * S::LDR; /* stage s: k at raw + 2s RAW, v (then the target) after it */
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int begin = chunk * rows_per_chunk, end = min(n, begin + rows_per_chunk);
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    stage_copy<D, S::LDR>(raw, raw + S::RAW, k, v, ld, h, begin, end);
    stage_memory_padded<D>(M, z, h, DELTA, sM, sz);
    float acc[S::UN][4];
#pragma unroll
    for (int nt = 0; nt < S::UN; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
    double zacc[4] = {0, 0, 0, 0};
    for (int i0 = begin, s = 0; i0 < end; i0 += TILE_ROWS, s ^= 1) {
        float *rk = raw + 2 * s * S::RAW, *sv = rk + S::RAW;
        copy_wait_all();
        __syncthreads();
        if (i0 + TILE_ROWS < end)
            stage_copy<D, S::LDR>(raw + 2 * (s ^ 1) * S::RAW, raw + (2 * (s ^ 1) + 1) * S::RAW, k, v, ld, h,
                                  i0 + TILE_ROWS, end);
        tile_sigma<D, DELTA, true, raw_stride<T, D, S::LDR>>((const T *)rk, i0, end, sz, sx, sinv, zacc);
        if constexpr (!is_f32<T>) tile_widen<D, S::LDR>(rk, sv);
        __syncthreads();
        if (DELTA) { /* the target replaces v in place: each thread rewrites only its own outputs */
            const int r_lo = 16 * (w % 4) + lane / 4, c0 = (D / 2) * (w / 4) + 2 * (lane % 4);
            float r[S::RN][4];
            mma_retrieve<D, BF>(sx, sM, r);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const float inv = sinv[r_lo + 8 * half];
#pragma unroll
                for (int nt = 0; nt < S::RN; nt++) {
                    float2 *tp = (float2 *)(sv + (r_lo + 8 * half) * S::LDR + c0 + 8 * nt);
                    float2 tv = *tp;
                    tv.x -= r[nt][2 * half] * inv, tv.y -= r[nt][2 * half + 1] * inv;
                    *tp = tv;
                }
            }
            __syncthreads();
        }
        mma_accumulate<D, BF>(sx, sv, acc);
    }
    float *P = partM + ((size_t)chunk * heads + h) * D * D;
    const int j_lo = 16 * (w % S::UM) + lane / 4, c0 = S::UW * (w / S::UM) + 2 * (lane % 4);
#pragma unroll
    for (int nt = 0; nt < S::UN; nt++) {
        *(float2 *)(P + (size_t)j_lo * D + c0 + 8 * nt) = make_float2(acc[nt][0], acc[nt][1]);
        *(float2 *)(P + (size_t)(j_lo + 8) * D + c0 + 8 * nt) = make_float2(acc[nt][2], acc[nt][3]);
    }
    store_chunk_z<D>(zacc, raw, partz + ((size_t)chunk * heads + h) * D);
}

#endif
