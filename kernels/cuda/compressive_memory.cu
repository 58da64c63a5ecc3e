/* Compressive memory on the GPU (SPEC 4), the twin of kernels/cpu/compressive_memory.c. M and z stay
 * float32 in every precision: they sum over the whole stream, and bf16 would lose it.
 *
 * Head sizes 32, 64 and 128 (with 16-byte aligned rows) take the tiled kernels here: a block of
 * 256 threads owns one head and a chunk of consecutive rows, stages M_h and z_h in shared memory
 * once, and walks its chunk in tiles of 64 rows. Each tile is read from device memory once, by
 * 16-byte asynchronous copies into shared memory issued a tile (or two) ahead, so the loads of
 * the next tiles are in flight while the current one is computed; sigma and the denominators
 * sigma(x) . z (in double, as on the CPU) are computed once per element. The products are
 * float32 FMAs on 4x4 register tiles (bench/lab/MEMORY_NOTES.md: what bounds them, what was tried),
 * or, for d = 32 and 64, products on the tensor cores (compressive_memory_mma.cuh: 3xTF32 in precision f32,
 * bf16 operands in bf16; the default for the updates, see use_tensor_cores).
 *   mix:    a = g * (sigma(q) M / den) + (1 - g) * a, written into a (or, memory_mix_to, as bf16
 *           into the output product's input).
 *   update: per chunk, P = sigma(K)^T T with T = v (linear) or v - sigma(K) M / den (delta,
 *           computed in the same tile, so k and v are read once), and the chunk's column sums of
 *           sigma(K) (double); a second kernel adds the partials to M and z in chunk order, so
 *           the result is the same bits on every run (the chunking depends on n, heads, d only).
 *
 * q, k, v come as float32 or bf16 (seqflow/backend.h, sf_dtype): a kernel's element type T. bf16
 * tiles are copied raw (16 bytes = 8 elements) and widened to float where they are read, so the
 * math after the load is the float32 kernels'. Rows of bf16 need ld % 8 == 0 for the tiles.
 * The tensor-core twins are in compressive_memory_mma.cuh. Other head sizes, or unaligned rows, take the
 * general kernels of compressive_memory_general.cu. */
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/compressive_memory_general.h"
#include "kernels/cuda/compressive_memory_stream.cuh" /* sigma, and the stream kernels */

#define MAX_HEAD_DIM 256

typedef __nv_bfloat16 bf16;
template <typename T>
constexpr bool is_f32 = std::is_same<T, float>::value;

/* 4 consecutive elements as float (bf16: memory_stream.cuh's exact widening) */
__device__ static inline float4 load4(const float *p) { return *(const float4 *)p; }
__device__ static inline float4 load4(const bf16 *p)
{
    const uint2 u = *(const uint2 *)p;
    return make_float4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
}

/* ---- the tiled kernels (d = 32, 64, 128) ---------------------------------------------------- */

#define TILE_THREADS 256
#define TILE_ROWS 64
/* blocks of a launch: about one wave on an H100 (132 SMs) at the blocks an SM holds */
#define TARGET_BLOCKS(d) ((d) <= 64 ? 256 : 128)

/* Thread layouts of one tile, all from D. Copies: thread t moves float4 units t + 256p of the
 * tile (VEC of them a row), so it always holds the same 4 columns. Retrieval: thread (ry, rx)
 * computes rows ry*RR.. and columns rx*4..rx*4+3. Update: thread (uy, ux) owns rows uy*UJ.. of
 * M_h and columns ux*4..ux*4+3. */
template <int D>
struct tile_shape {
    static constexpr int VEC = D / 4;
    static constexpr int LOADS = TILE_ROWS * VEC / TILE_THREADS;
    static constexpr int RX = D / 4, RY = TILE_THREADS / RX, RR = TILE_ROWS / RY;
    static constexpr int UX = D / 4, UY = TILE_THREADS / UX, UJ = D / UY;
    static constexpr int LDX = D + 4; /* padded row of sigma(x): rows 4 apart fall in other banks */
    static constexpr int RAW = TILE_ROWS * D; /* one raw tile (q, a, k or v) as copied */
    static constexpr int MIN_BLOCKS = D <= 64 ? 2 : 1;
};

/* Shared memory of a tile kernel: [M_h] z_h 1/den sigma(x) and two stages of two raw tiles
 * (q and a, or k and v): the next tile is copied in while the current one is computed. */
template <int D>
static size_t tile_shared_bytes(bool with_m)
{
    typedef tile_shape<D> S;
    return sizeof(float) *
           ((with_m ? (size_t)D * D : 0) + D + TILE_ROWS + (size_t)TILE_ROWS * S::LDX + 4 * (size_t)S::RAW);
}

__device__ static inline void copy16_async(void *dst, const void *src, bool valid)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ static inline void copy_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
__device__ static inline void copy_wait_all(void) { asm volatile("cp.async.wait_group 0;\n" ::); }

/* Starts copying rows [i0, i0 + 64) of head h of x and y into raw tiles (zeros at or past end). */
template <int D, int RS = D> /* RS: row stride of the raw tiles in shared memory */
__device__ static inline void tile_copy(float *rx_, float *ry_, const float *x, const float *y, int ld, int h,
                                        int i0, int end)
{
    typedef tile_shape<D> S;
#pragma unroll
    for (int p = 0; p < S::LOADS; p++) {
        const int u = threadIdx.x + p * TILE_THREADS, r = u / S::VEC, col = (u % S::VEC) * 4;
        const bool in = i0 + r < end;
        const size_t at = in ? (size_t)(i0 + r) * ld + (size_t)h * D + col : 0;
        copy16_async(rx_ + r * RS + col, x + at, in);
        copy16_async(ry_ + r * RS + col, y + at, in);
    }
    copy_commit();
}

/* Starts copying rows [i0, i0 + 64) of head h of x into one raw tile, rows RS elements apart
 * (zeros at or past end), 16 bytes a copy; the caller commits. */
template <int D, int RS, typename T>
__device__ static inline void copy_rows_async(T *dst, const T *x, int ld, int h, int i0, int end)
{
    constexpr int PER = 16 / sizeof(T), VEC = D / PER, LOADS = TILE_ROWS * VEC / TILE_THREADS;
    static_assert(D % PER == 0 && TILE_ROWS * VEC % TILE_THREADS == 0, "whole copies per thread");
#pragma unroll
    for (int p = 0; p < LOADS; p++) {
        const int u = threadIdx.x + p * TILE_THREADS, r = u / VEC, col = (u % VEC) * PER;
        const bool in = i0 + r < end;
        const size_t at = in ? (size_t)(i0 + r) * ld + (size_t)h * D + col : 0;
        copy16_async(dst + r * RS + col, x + at, in);
    }
}

/* A stage is two raw tiles, rx_ and ry_ (64 rows RS floats apart each). Float x and y are
 * copied into them as they are (tile_copy). A bf16 x goes to rx_ as bf16 rows D apart, and a bf16
 * y right after it there (the two take at most rx_'s bytes), so that tile_widen can write y as
 * float into ry_, where the kernels read it, with no barrier between its reads and writes; a
 * float y (the mix's a) goes to ry_ as it is. */
template <int D, int RS, typename TX, typename TY>
__device__ static inline void stage_copy(float *rx_, float *ry_, const TX *x, const TY *y, int ld, int h, int i0,
                                         int end)
{
    static_assert(RS >= D, "bf16 x and y fit in the x tile");
    if constexpr (is_f32<TX> && is_f32<TY>) {
        tile_copy<D, RS>(rx_, ry_, x, y, ld, h, i0, end);
    } else {
        bf16 *bx = (bf16 *)rx_;
        copy_rows_async<D, D>(bx, x, ld, h, i0, end);
        if constexpr (is_f32<TY>) copy_rows_async<D, RS>(ry_, y, ld, h, i0, end);
        else copy_rows_async<D, D>(bx + TILE_ROWS * D, y, ld, h, i0, end);
        copy_commit();
    }
}

/* Row stride, in elements of T, of a stage's raw x tile (see stage_copy) */
template <typename T, int D, int RS>
constexpr int raw_stride = is_f32<T> ? RS : D;

/* The bf16 y tile that stage_copy put in the x tile rx_, widened into ry_ (rows RS apart). Each
 * thread moves the elements tile_sigma gives it; the barrier after tile_sigma publishes them. */
template <int D, int RS>
__device__ static inline void tile_widen(const float *rx_, float *ry_)
{
    typedef tile_shape<D> S;
    const bf16 *src = (const bf16 *)rx_ + TILE_ROWS * D;
#pragma unroll
    for (int p = 0; p < S::LOADS; p++) {
        const int u = threadIdx.x + p * TILE_THREADS, r = u / S::VEC, col = (u % S::VEC) * 4;
        *(float4 *)(ry_ + r * RS + col) = load4(src + r * D + col);
    }
}

/* sx = sigma(raw x) (0 past `end`) from this thread's own copies; with DEN sinv[r] =
 * 1 / (sigma(x_r) . z) (0 where that is 0), the dot product in double as on the CPU; with Z
 * zacc[c] += the column sums of sigma(x) over this thread's rows (its columns are fixed). */
template <int D, bool DEN, bool Z, int RS = D, typename T = float>
__device__ static inline void tile_sigma(const T *raw, int i0, int end, const float *sz, float *sx, float *sinv,
                                         double (&zacc)[4])
{
    typedef tile_shape<D> S;
#pragma unroll
    for (int p = 0; p < S::LOADS; p++) {
        const int u = threadIdx.x + p * TILE_THREADS, r = u / S::VEC, col = (u % S::VEC) * 4;
        const bool in = i0 + r < end;
        float4 s = load4(raw + r * RS + col);
        s.x = in ? sigma(s.x) : 0.0f, s.y = in ? sigma(s.y) : 0.0f;
        s.z = in ? sigma(s.z) : 0.0f, s.w = in ? sigma(s.w) : 0.0f;
        *(float4 *)(sx + r * S::LDX + col) = s;
        if (Z) zacc[0] += s.x, zacc[1] += s.y, zacc[2] += s.z, zacc[3] += s.w;
        if (DEN) {
            double den = (double)s.x * sz[col] + (double)s.y * sz[col + 1] + (double)s.z * sz[col + 2] +
                         (double)s.w * sz[col + 3];
            /* the VEC lanes of a row are consecutive and aligned within the warp */
#pragma unroll
            for (int off = S::VEC / 2; off > 0; off /= 2) den += __shfl_xor_sync(0xffffffffu, den, off);
            if (u % S::VEC == 0) sinv[r] = den != 0 ? (float)(1.0 / den) : 0.0f;
        }
    }
}

/* acc[i][c] = sum_j sx[ry*RR + i][j] * M[j][rx*4 + c], j in order */
template <int D>
__device__ static inline void tile_retrieve(const float *sx, const float *sM, float (&acc)[tile_shape<D>::RR][4])
{
    typedef tile_shape<D> S;
    const int rx = threadIdx.x % S::RX, ry = threadIdx.x / S::RX;
#pragma unroll
    for (int i = 0; i < S::RR; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0;
#pragma unroll 2
    for (int j = 0; j < D; j += 4) {
        float4 m[4];
#pragma unroll
        for (int jj = 0; jj < 4; jj++) m[jj] = *(const float4 *)(sM + (j + jj) * D + rx * 4);
#pragma unroll
        for (int i = 0; i < S::RR; i++) {
            const float4 xv = *(const float4 *)(sx + (ry * S::RR + i) * S::LDX + j);
            const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                acc[i][0] += xs[jj] * m[jj].x, acc[i][1] += xs[jj] * m[jj].y;
                acc[i][2] += xs[jj] * m[jj].z, acc[i][3] += xs[jj] * m[jj].w;
            }
        }
    }
}

/* Copies M_h (with_m) and z_h into shared memory. */
template <int D>
__device__ static inline void stage_memory(const float *M, const float *z, int h, bool with_m, float *sM, float *sz)
{
    if (with_m)
        for (int u = threadIdx.x; u < D * D / 4; u += TILE_THREADS)
            ((float4 *)sM)[u] = __ldg((const float4 *)(M + (size_t)h * D * D) + u);
    for (int u = threadIdx.x; u < D; u += TILE_THREADS) sz[u] = z[(size_t)h * D + u];
}

/* The mix's result, 4 or 2 consecutive columns, as float32 or bf16 (memory_mix_to's output type). */
__device__ static inline void store_mixed(float *dst, float4 o) { *(float4 *)dst = o; }
__device__ static inline void store_mixed(bf16 *dst, float4 o)
{
    __nv_bfloat162 lo = __floats2bfloat162_rn(o.x, o.y), hi = __floats2bfloat162_rn(o.z, o.w);
    *(uint2 *)dst = make_uint2(*(unsigned *)&lo, *(unsigned *)&hi);
}
__device__ static inline void store_mixed(float *dst, float2 o) { *(float2 *)dst = o; }
__device__ static inline void store_mixed(bf16 *dst, float2 o) { *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(o.x, o.y); }

/* grid (chunks, heads): out = g * (sigma(q) M / den) + (1 - g) * a over the block's rows (out is
 * a itself, or the bf16 input of the output product: OT) */
template <int D, typename T, typename OT>
__global__ static void __launch_bounds__(TILE_THREADS, tile_shape<D>::MIN_BLOCKS)
    tiled_mix_kernel(int n, int rows_per_chunk, int ld, const T *__restrict__ q, const float *__restrict__ M,
                     const float *__restrict__ z, const float *__restrict__ gate, const float *a, OT *out)
{
    typedef tile_shape<D> S;
    extern __shared__ float4 shared4[];
    float *sM = (float *)shared4, *sz = sM + D * D, *sinv = sz + D, *sx = sinv + TILE_ROWS;
    float *raw = sx + TILE_ROWS * S::LDX; /* stage s: q at raw + 2s RAW, a after it */
    const int h = blockIdx.y, begin = blockIdx.x * rows_per_chunk, end = min(n, begin + rows_per_chunk);
    const int rx = threadIdx.x % S::RX, ry = threadIdx.x / S::RX;
    const float g = memory_gate(gate, h);
    double unused[4];
    stage_copy<D, D>(raw, raw + S::RAW, q, a, ld, h, begin, end);
    stage_memory<D>(M, z, h, true, sM, sz);
    for (int i0 = begin, s = 0; i0 < end; i0 += TILE_ROWS, s ^= 1) {
        float *rq = raw + 2 * s * S::RAW, *ra = rq + S::RAW;
        copy_wait_all();
        __syncthreads(); /* this tile's copies are visible; the previous tile's readers are done */
        if (i0 + TILE_ROWS < end)
            stage_copy<D, D>(raw + 2 * (s ^ 1) * S::RAW, raw + (2 * (s ^ 1) + 1) * S::RAW, q, a, ld, h,
                             i0 + TILE_ROWS, end);
        tile_sigma<D, true, false, raw_stride<T, D, D>>((const T *)rq, i0, end, sz, sx, sinv, unused);
        __syncthreads();
        float acc[S::RR][4];
        tile_retrieve<D>(sx, sM, acc);
#pragma unroll
        for (int i = 0; i < S::RR; i++) {
            const int r = ry * S::RR + i, row = i0 + r;
            if (row >= end) continue;
            const float inv = sinv[r];
            float4 o = *(const float4 *)(ra + r * D + rx * 4);
            o.x = g * (acc[i][0] * inv) + (1.0f - g) * o.x, o.y = g * (acc[i][1] * inv) + (1.0f - g) * o.y;
            o.z = g * (acc[i][2] * inv) + (1.0f - g) * o.z, o.w = g * (acc[i][3] * inv) + (1.0f - g) * o.w;
            store_mixed(out + (size_t)row * ld + (size_t)h * D + rx * 4, o);
        }
    }
}

/* The chunk's z partial: each thread holds the column sums of sigma(K) for its 4 columns
 * (col = 4 * (t % (D / 4)) + c); the threads holding the same columns are added in thread
 * order, so the result is the same bits on every run. `raw` (the tile stages, free by now)
 * holds the exchange. */
template <int D>
__device__ static void store_chunk_z(const double (&zacc)[4], float *raw, double *partz_chunk)
{
    __syncthreads();
    double *zred = (double *)raw;
#pragma unroll
    for (int c = 0; c < 4; c++) zred[threadIdx.x * 4 + c] = zacc[c];
    __syncthreads();
    if (threadIdx.x < D) {
        const int col = threadIdx.x;
        double sum = 0;
        for (int t = col / 4; t < TILE_THREADS; t += D / 4) sum += zred[t * 4 + col % 4];
        partz_chunk[col] = sum;
    }
}

/* grid (chunks, heads): partM[chunk][h] = sigma(K)^T T over the chunk's rows, T = v (linear) or
 * v - sigma(K) M / den (delta); partz[chunk][h] = the chunk's column sums of sigma(K). */
template <int D, bool DELTA, typename T>
__global__ static void __launch_bounds__(TILE_THREADS, tile_shape<D>::MIN_BLOCKS)
    tiled_update_kernel(int n, int rows_per_chunk, int heads, int ld, const T *__restrict__ k,
                        const T *__restrict__ v, const float *__restrict__ M, const float *__restrict__ z,
                        float *__restrict__ partM, double *__restrict__ partz)
{
    typedef tile_shape<D> S;
    extern __shared__ float4 shared4[];
    float *sM = (float *)shared4, *sz = sM + (DELTA ? D * D : 0), *sinv = sz + D, *sx = sinv + TILE_ROWS;
    float *raw = sx + TILE_ROWS * S::LDX; /* stage s: k at raw + 2s RAW, v (then the target) after it */
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int begin = chunk * rows_per_chunk, end = min(n, begin + rows_per_chunk);
    const int ux = threadIdx.x % S::UX, uy = threadIdx.x / S::UX;
    stage_copy<D, D>(raw, raw + S::RAW, k, v, ld, h, begin, end);
    stage_memory<D>(M, z, h, DELTA, sM, sz);
    float acc[S::UJ][4];
#pragma unroll
    for (int a = 0; a < S::UJ; a++) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0;
    double zacc[4] = {0, 0, 0, 0}; /* z sums positive terms over the whole stream: double, as on the CPU */
    for (int i0 = begin, s = 0; i0 < end; i0 += TILE_ROWS, s ^= 1) {
        float *rk = raw + 2 * s * S::RAW, *sv = rk + S::RAW;
        copy_wait_all();
        __syncthreads();
        if (i0 + TILE_ROWS < end)
            stage_copy<D, D>(raw + 2 * (s ^ 1) * S::RAW, raw + (2 * (s ^ 1) + 1) * S::RAW, k, v, ld, h,
                             i0 + TILE_ROWS, end);
        tile_sigma<D, DELTA, true, raw_stride<T, D, D>>((const T *)rk, i0, end, sz, sx, sinv, zacc);
        if constexpr (!is_f32<T>) tile_widen<D, D>(rk, sv);
        __syncthreads();
        if (DELTA) { /* the target replaces v in place: each thread rewrites only its own outputs */
            const int rx = threadIdx.x % S::RX, ry = threadIdx.x / S::RX;
            float r[S::RR][4];
            tile_retrieve<D>(sx, sM, r);
#pragma unroll
            for (int i = 0; i < S::RR; i++) {
                const float inv = sinv[ry * S::RR + i];
                float4 *t = (float4 *)(sv + (ry * S::RR + i) * D + rx * 4);
                float4 tv = *t;
                tv.x -= r[i][0] * inv, tv.y -= r[i][1] * inv, tv.z -= r[i][2] * inv, tv.w -= r[i][3] * inv;
                *t = tv;
            }
            __syncthreads();
        }
#pragma unroll 4
        for (int r = 0; r < TILE_ROWS; r++) {
            const float4 t = *(const float4 *)(sv + r * D + ux * 4);
            float s[S::UJ];
            if constexpr (S::UJ % 4 == 0) {
#pragma unroll
                for (int a = 0; a < S::UJ; a += 4) {
                    const float4 s4 = *(const float4 *)(sx + r * S::LDX + uy * S::UJ + a);
                    s[a] = s4.x, s[a + 1] = s4.y, s[a + 2] = s4.z, s[a + 3] = s4.w;
                }
            } else {
#pragma unroll
                for (int a = 0; a < S::UJ; a++) s[a] = sx[r * S::LDX + uy * S::UJ + a];
            }
#pragma unroll
            for (int a = 0; a < S::UJ; a++) {
                acc[a][0] += s[a] * t.x, acc[a][1] += s[a] * t.y;
                acc[a][2] += s[a] * t.z, acc[a][3] += s[a] * t.w;
            }
        }
    }
    float *P = partM + ((size_t)chunk * heads + h) * D * D;
#pragma unroll
    for (int a = 0; a < S::UJ; a++)
        *(float4 *)(P + (size_t)(uy * S::UJ + a) * D + ux * 4) = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
    store_chunk_z<D>(zacc, raw, partz + ((size_t)chunk * heads + h) * D);
}

/* M[i] += sum over chunks of partM[chunk][i] (i over heads*d*d), then z likewise, chunks in order. */
__global__ static void chunk_reduce_kernel(int chunks, size_t m_count, size_t z_count, const float *__restrict__ partM,
                                           const double *__restrict__ partz, float *M, float *z)
{
    const size_t total = m_count + z_count;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        if (i < m_count) {
            float s = 0;
            for (int c = 0; c < chunks; c++) s += partM[(size_t)c * m_count + i];
            M[i] += s;
        } else {
            const size_t j = i - m_count;
            double s = 0;
            for (int c = 0; c < chunks; c++) s += partz[(size_t)c * z_count + j];
            z[j] += (float)s;
        }
    }
}

#include "kernels/cuda/compressive_memory_mma.cuh"
#include "kernels/cuda/compressive_memory_stream_update.cuh"

/* The chunk partials of the update by the stream kernel (memory_stream_update.cuh): d = 64, bf16
 * k and v, bf16 operands; tiled_update's chunks and partials (its grid transposed: heads fastest),
 * so its chunk reduce follows unchanged. */
template <bool DELTA>
static int stream_update_launch(sf_cuda *c, int n, int rows, int chunks, int heads, int ld, const bf16 *k,
                                const bf16 *v, const float *M, const float *z, float *partM, double *partz)
{
    const size_t shared = stream_update_shared_bytes(DELTA);
    int rc = sf_cuda_status(cudaFuncSetAttribute(stream_update64_kernel<DELTA>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                            "memory_update (stream, shared memory limit)");
    if (rc != SF_OK) return rc;
    stream_update64_kernel<DELTA><<<dim3((unsigned)heads, (unsigned)chunks), STREAM_UPDATE_THREADS, shared,
                                    c->stream>>>(n, rows, heads, ld, k, v, M, z, partM, partz);
    return sf_cuda_launched("memory_update (stream chunk partials)");
}

/* Rows a chunk (a whole number of tiles) and the chunk count: about TARGET_BLOCKS blocks in all.
 * A function of n, heads and d alone, so the update's summation order is the same on any GPU. */
static void tile_chunks(int n, int heads, int d, int *rows_per_chunk, int *chunks)
{
    const int tiles = (n + TILE_ROWS - 1) / TILE_ROWS;
    int want = TARGET_BLOCKS(d) / heads;
    want = want < 1 ? 1 : want > tiles ? tiles : want;
    *rows_per_chunk = (tiles + want - 1) / want * TILE_ROWS;
    *chunks = (n + *rows_per_chunk - 1) / *rows_per_chunk;
}

static bool tiled_head_dim(int d) { return d == 32 || d == 64 || d == 128; }

/* 16-byte copies need 16-byte aligned rows: ld a multiple of the elements of type in 16 bytes
 * (the mix's float32 a then has them too) */
static bool tiled_layout(int d, int ld, sf_dtype type, const void *p, const void *r)
{
    const int per_copy = type == SF_DTYPE_BF16 ? 8 : 4;
    return tiled_head_dim(d) && ld % per_copy == 0 && (uintptr_t)p % 16 == 0 && (uintptr_t)r % 16 == 0;
}

static size_t tiled_update_bytes(int n, int heads, int d)
{
    int rows, chunks;
    tile_chunks(n, heads, d, &rows, &chunks);
    return (size_t)chunks * heads * ((size_t)d * d * sizeof(float) + (size_t)d * sizeof(double));
}

/* Where the products of d = 32 and 64 run: on the tensor cores (3xTF32) or on FP32 FMAs. By
 * default the updates take the tensor cores and the mix the FMAs, the faster of the two for each
 * on the H100 (bench/lab/MEMORY_NOTES.md, session 3). The backend's setting memory=mma or fma
 * puts both on one (to test and time either). */
#define MIX_TENSOR_CORES 0
#define UPDATE_TENSOR_CORES 1

static bool use_tensor_cores(const sf_cuda *c, int d, bool update)
{
    const int chosen = c->settings.memory;
    return (d == 32 || d == 64) && (chosen == SF_CUDA_MEMORY_FMA   ? false
                                    : chosen == SF_CUDA_MEMORY_MMA ? true
                                    : update                       ? UPDATE_TENSOR_CORES
                                                                   : MIX_TENSOR_CORES);
}

/* The tensor-core products take bf16 operands in precision bf16 (float32 accumulation; M and z
 * stay float32), 3xTF32 in precision f32. Setting memory_bf16=0 keeps 3xTF32 in bf16 too (A/B
 * timing). */
static bool bf16_operands(const sf_cuda *c) { return c->settings.memory_bf16 && c->precision == SF_PRECISION_BF16; }

/* The stream kernels (memory_stream*.cuh) serve d = 64 with bf16 operands unless the tiled
 * kernels are asked for (setting memory=tiled|mma|fma). */
static bool use_stream(const sf_cuda *c, int d)
{
    return d == 64 && bf16_operands(c) && c->settings.memory == SF_CUDA_MEMORY_AUTO;
}

int sf_cuda_memory_stream_usable(sf_backend *be, int d, int ld) { return use_stream(sf_cuda_of(be), d) && ld % 8 == 0; }

template <int D, typename T, typename OT>
static int tiled_mix(sf_cuda *c, int n, int heads, int ld, const T *q, const float *M, const float *z,
                     const float *gate, const float *a, OT *out)
{
    int rows, chunks;
    tile_chunks(n, heads, D, &rows, &chunks);
    size_t shared = tile_shared_bytes<D>(true);
    void (*kernel)(int, int, int, const T *, const float *, const float *, const float *, const float *, OT *) =
        tiled_mix_kernel<D, T, OT>;
    if constexpr (D <= 64)
        if (use_tensor_cores(c, D, false)) {
            kernel = bf16_operands(c) ? mma_mix_kernel<D, T, OT, true> : mma_mix_kernel<D, T, OT, false>;
            shared = mma_shared_bytes<D>(true);
        }
    int rc = sf_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                            "memory_mix (shared memory limit)");
    if (rc != SF_OK) return rc;
    kernel<<<dim3((unsigned)chunks, (unsigned)heads), TILE_THREADS, shared, c->stream>>>(n, rows, ld, q, M, z, gate,
                                                                                          a, out);
    return sf_cuda_launched("memory_mix");
}

/* The chunk partials by the tiled kernels: on FP32 FMAs or on the tensor cores (use_tensor_cores) */
template <int D, bool DELTA, typename T>
static int tiled_update_partials(sf_cuda *c, int n, int rows, int chunks, int heads, int ld, const T *k, const T *v,
                                 const float *M, const float *z, float *partM, double *partz)
{
    size_t shared = tile_shared_bytes<D>(DELTA);
    void (*kernel)(int, int, int, int, const T *, const T *, const float *, const float *, float *, double *) =
        tiled_update_kernel<D, DELTA, T>;
    if constexpr (D <= 64)
        if (use_tensor_cores(c, D, true)) {
            kernel = bf16_operands(c) ? mma_update_kernel<D, DELTA, T, true> : mma_update_kernel<D, DELTA, T, false>;
            shared = mma_shared_bytes<D>(DELTA);
        }
    int rc = sf_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared),
                            "memory_update (shared memory limit)");
    if (rc != SF_OK) return rc;
    kernel<<<dim3((unsigned)chunks, (unsigned)heads), TILE_THREADS, shared, c->stream>>>(n, rows, heads, ld, k, v, M,
                                                                                          z, partM, partz);
    return sf_cuda_launched("memory_update (chunk partials)");
}

/* The update of head size D: the chunk partials (the stream kernel where it serves, else the
 * tiled ones), then their reduce into M and z in chunk order. */
template <int D, bool DELTA, typename T>
static int tiled_update(sf_cuda *c, int n, int heads, int ld, const T *k, const T *v, float *M, float *z)
{
    int rows, chunks;
    tile_chunks(n, heads, D, &rows, &chunks);
    float *partM = (float *)c->scratch;
    double *partz = (double *)(partM + (size_t)chunks * heads * D * D);
    int rc;
    if constexpr (D == 64 && !is_f32<T>)
        rc = use_stream(c, D) ? stream_update_launch<DELTA>(c, n, rows, chunks, heads, ld, k, v, M, z, partM, partz)
                              : tiled_update_partials<D, DELTA>(c, n, rows, chunks, heads, ld, k, v, M, z, partM, partz);
    else
        rc = tiled_update_partials<D, DELTA>(c, n, rows, chunks, heads, ld, k, v, M, z, partM, partz);
    if (rc != SF_OK) return rc;
    const size_t m_count = (size_t)heads * D * D, z_count = (size_t)heads * D, total = m_count + z_count;
    const unsigned blocks = (unsigned)((total + 255) / 256 < 2048 ? (total + 255) / 256 : 2048);
    chunk_reduce_kernel<<<blocks, 256, 0, c->stream>>>(chunks, m_count, z_count, partM, partz, M, z);
    return sf_cuda_launched("memory_update (chunk reduce)");
}

/* the tiled kernels of head size d, element type T and output type OT */
template <typename T, typename OT>
static int tiled_mix_typed(sf_cuda *c, int n, int heads, int d, int ld, const void *q, const float *M,
                           const float *z, const float *gate, const float *a, void *out)
{
    const T *qt = (const T *)q;
    OT *o = (OT *)out;
    return d == 32   ? tiled_mix<32>(c, n, heads, ld, qt, M, z, gate, a, o)
           : d == 64 ? tiled_mix<64>(c, n, heads, ld, qt, M, z, gate, a, o)
                     : tiled_mix<128>(c, n, heads, ld, qt, M, z, gate, a, o);
}

template <int D, typename T>
static int tiled_update_kind(sf_cuda *c, sf_memory_kind kind, int n, int heads, int ld, const T *k, const T *v,
                             float *M, float *z)
{
    return kind == SF_MEMORY_DELTA ? tiled_update<D, true>(c, n, heads, ld, k, v, M, z)
                                   : tiled_update<D, false>(c, n, heads, ld, k, v, M, z);
}

template <typename T>
static int tiled_update_typed(sf_cuda *c, sf_memory_kind kind, int n, int heads, int d, int ld, const void *k,
                              const void *v, float *M, float *z)
{
    const T *kt = (const T *)k, *vt = (const T *)v;
    return d == 32   ? tiled_update_kind<32>(c, kind, n, heads, ld, kt, vt, M, z)
           : d == 64 ? tiled_update_kind<64>(c, kind, n, heads, ld, kt, vt, M, z)
                     : tiled_update_kind<128>(c, kind, n, heads, ld, kt, vt, M, z);
}

/* ---- entry points ------------------------------------------------------------------------ */

static int check_head_dim(int d)
{
    if (d <= 0 || d > MAX_HEAD_DIM)
        return sf_error(SF_E_UNSUPPORTED, "CUDA memory kernels take head_dim 1..%d, not %d", MAX_HEAD_DIM, d);
    return SF_OK;
}

static int check_type(sf_dtype type, const char *op)
{
    if (type != SF_DTYPE_F32 && type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "%s: element type %d of q/k/v is neither float32 nor bf16", op, (int)type);
    return SF_OK;
}

int sf_cuda_memory_mix(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q, const float *M,
                       const float *z, const float *gate, float *a)
{
    return sf_cuda_memory_mix_to(be, n, heads, d, ld, qtype, q, M, z, gate, a, SF_DTYPE_F32, a);
}

/* memory_mix_to: bf16 q into a bf16 out is the H100 pipeline's case (the output product then
 * reads out as it is, with no conversion pass, and the mix writes half the bytes); it has
 * tiled kernels of its own. Every other combination mixes into a as memory_mix does and, for
 * a bf16 out, rounds a into it. */
int sf_cuda_memory_mix_to(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                          const float *M, const float *z, const float *gate, float *a, sf_dtype otype, void *out)
{
    int rc = check_type(qtype, "memory_mix");
    if (rc == SF_OK) rc = check_type(otype, "memory_mix (output)");
    if (rc != SF_OK || n <= 0 || heads <= 0) return rc;
    if (otype == SF_DTYPE_F32 && out != a)
        return sf_error(SF_E_INVAL, "memory_mix: a float32 result goes to a itself");
    rc = check_head_dim(d);
    if (rc != SF_OK) return rc;
    sf_cuda *c = sf_cuda_of(be);
    rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const bool tiled = tiled_layout(d, ld, qtype, q, a) && (uintptr_t)M % 16 == 0;
    const bool bf16_to_bf16 =
        tiled && qtype == SF_DTYPE_BF16 && otype == SF_DTYPE_BF16 && ld % 4 == 0 && (uintptr_t)out % 8 == 0;
    if (bf16_to_bf16 && use_stream(c, d)) {
        stream_mix64_kernel<<<dim3((unsigned)heads, (unsigned)((n + STREAM_MIX_ROWS - 1) / STREAM_MIX_ROWS)),
                              STREAM_THREADS, 0, c->stream>>>(n, ld, (const bf16 *)q, M, z, gate, a, (bf16 *)out);
        rc = sf_cuda_launched("memory_mix (stream)");
    } else if (bf16_to_bf16)
        rc = tiled_mix_typed<bf16, bf16>(c, n, heads, d, ld, q, M, z, gate, a, out);
    else {
        if (tiled)
            rc = qtype == SF_DTYPE_BF16 ? tiled_mix_typed<bf16, float>(c, n, heads, d, ld, q, M, z, gate, a, a)
                                        : tiled_mix_typed<float, float>(c, n, heads, d, ld, q, M, z, gate, a, a);
        else
            rc = sf_cuda_memory_mix_general(c, n, heads, d, ld, qtype, q, M, z, gate, a);
        if (rc == SF_OK && otype == SF_DTYPE_BF16)
            rc = sf_cuda_f32_to_bf16_ld(a, n, heads * d, ld, (__nv_bfloat16 *)out, ld, c->stream);
    }
    sf_cuda_leave(c);
    return rc;
}

/* the tiled update's partial sums, or the general update's buffers (the sizes reserve() asks for;
 * the general update of either kind or element type fits the delta's) */
size_t sf_cuda_memory_update_scratch_bytes(int n, int heads, int d)
{
    if (n <= 0 || heads <= 0 || d <= 0) return 0;
    return tiled_head_dim(d) ? tiled_update_bytes(n, heads, d) : sf_cuda_memory_general_bytes(n, heads, d, 1);
}

int sf_cuda_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                          const void *k, const void *v, float *M, float *z)
{
    int rc = check_type(kvtype, "memory_update");
    if (rc != SF_OK || kind == SF_MEMORY_NONE || n <= 0 || heads <= 0) return rc;
    rc = check_head_dim(d);
    if (rc != SF_OK) return rc;
    sf_cuda *c = sf_cuda_of(be);
    rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    if (tiled_layout(d, ld, kvtype, k, v) && (uintptr_t)M % 16 == 0) {
        /* reserve() sized the partials (sf_cuda_memory_update_scratch_bytes); a caller that did
         * not reserve grows the scratch here, once */
        rc = sf_cuda_scratch(c, tiled_update_bytes(n, heads, d));
        if (rc == SF_OK)
            rc = kvtype == SF_DTYPE_BF16 ? tiled_update_typed<bf16>(c, kind, n, heads, d, ld, k, v, M, z)
                                         : tiled_update_typed<float>(c, kind, n, heads, d, ld, k, v, M, z);
    } else {
        rc = sf_cuda_memory_update_general(c, kind, n, heads, d, ld, kvtype, k, v, M, z);
    }
    sf_cuda_leave(c);
    return rc;
}
