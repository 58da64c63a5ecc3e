/* Compressive memory on the GPU for head sizes without a tiled kernel (kernels/cuda/compressive_memory.cu
 * takes d = 32, 64, 128 with 16-byte aligned rows): simple kernels and cuBLAS products. The twin
 * of kernels/cpu/compressive_memory.c like the tiled kernels; M and z stay float32. q, k, v are float32 or
 * bf16 (T), widened where they are loaded; a bf16 v is widened into the scratch first, where the
 * float32 products read their target. Called by memory.cu's entry points under the backend's lock. */
#include <type_traits>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/compressive_memory_general.h"

__device__ static inline float sigma(float x) { return x > 0 ? x + 1.0f : expf(x); } /* ELU + 1 */

__device__ static inline float load(const float *p) { return *p; }
__device__ static inline float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

#define ROW_TILE 16  /* rows of q or k per block of the retrieval */
#define COL_TILE 8   /* rows of M_h per block of the update */
#define SEG_TILE 32  /* segment rows staged in shared memory per step of the update */

/* retrieve_kernel modes */
#define RETRIEVE_MIX 0    /* a = g * Retrieve(q) + (1 - g) * a */
#define RETRIEVE_DELTA 1  /* target = v - Retrieve(k) */

/* grid (heads, row tiles), block >= d threads. src is q (mix) or k (delta). */
template <typename T>
__global__ static void retrieve_kernel(int mode, int n, int d, int ld, const T *src, const float *M, const float *z,
                                       const float *gate, const T *v, float *dst, int dst_ld)
{
    extern __shared__ float shared[];
    float *sx = shared;                 /* [ROW_TILE][d] */
    float *inv = shared + ROW_TILE * d; /* [ROW_TILE] */
    const int h = blockIdx.x, r0 = blockIdx.y * ROW_TILE, e = threadIdx.x;
    const int rows = n - r0 < ROW_TILE ? n - r0 : ROW_TILE;
    for (int idx = threadIdx.x; idx < ROW_TILE * d; idx += blockDim.x) {
        int r = idx / d, col = idx % d;
        sx[idx] = r < rows ? sigma(load(src + (size_t)(r0 + r) * ld + (size_t)h * d + col)) : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        double den = 0;
        for (int j = 0; j < d; j++) den += (double)sx[threadIdx.x * d + j] * z[(size_t)h * d + j];
        inv[threadIdx.x] = den != 0 ? (float)(1.0 / den) : 0.0f;
    }
    __syncthreads();
    if (e >= d) return;
    float acc[ROW_TILE];
    for (int r = 0; r < ROW_TILE; r++) acc[r] = 0;
    const float *Mh = M + (size_t)h * d * d;
    for (int j = 0; j < d; j++) {
        float m = Mh[(size_t)j * d + e];
#pragma unroll
        for (int r = 0; r < ROW_TILE; r++) acc[r] += sx[r * d + j] * m;
    }
    if (mode == RETRIEVE_MIX) {
        const float g = 1.0f / (1.0f + expf(-gate[h]));
        for (int r = 0; r < rows; r++) {
            float *out = dst + (size_t)(r0 + r) * dst_ld + (size_t)h * d + e;
            *out = g * (acc[r] * inv[r]) + (1.0f - g) * *out;
        }
    } else {
        for (int r = 0; r < rows; r++)
            dst[(size_t)(r0 + r) * dst_ld + (size_t)h * d + e] =
                load(v + (size_t)(r0 + r) * ld + (size_t)h * d + e) - acc[r] * inv[r];
    }
}

/* grid (heads, column tiles of M_h rows), block >= d threads. target has row stride target_ld. */
template <typename T>
__global__ static void update_kernel(int n, int d, int ld, const T *k, const float *target, int target_ld, float *M,
                                     float *z)
{
    extern __shared__ float shared[];
    float *sk = shared;                    /* [SEG_TILE][COL_TILE] */
    float *tg = shared + SEG_TILE * COL_TILE; /* [SEG_TILE][d] */
    const int h = blockIdx.x, j0 = blockIdx.y * COL_TILE, e = threadIdx.x;
    const int cols = d - j0 < COL_TILE ? d - j0 : COL_TILE;
    float acc[COL_TILE];
    for (int jj = 0; jj < COL_TILE; jj++) acc[jj] = 0;
    double zacc = 0; /* z sums positive terms over the segment: double, as on the CPU */
    for (int i0 = 0; i0 < n; i0 += SEG_TILE) {
        const int rows = n - i0 < SEG_TILE ? n - i0 : SEG_TILE;
        for (int idx = threadIdx.x; idx < SEG_TILE * COL_TILE; idx += blockDim.x) {
            int r = idx / COL_TILE, jj = idx % COL_TILE;
            sk[idx] = r < rows && jj < cols ? sigma(load(k + (size_t)(i0 + r) * ld + (size_t)h * d + j0 + jj)) : 0.0f;
        }
        for (int idx = threadIdx.x; idx < rows * d; idx += blockDim.x) {
            int r = idx / d, col = idx % d;
            tg[idx] = target[(size_t)(i0 + r) * target_ld + (size_t)h * d + col];
        }
        __syncthreads();
        if (e < d) {
            for (int r = 0; r < rows; r++) {
                float t = tg[r * d + e];
#pragma unroll
                for (int jj = 0; jj < COL_TILE; jj++) acc[jj] += sk[r * COL_TILE + jj] * t;
            }
        }
        if (threadIdx.x < cols)
            for (int r = 0; r < rows; r++) zacc += sk[r * COL_TILE + threadIdx.x];
        __syncthreads();
    }
    float *Mh = M + (size_t)h * d * d;
    if (e < d)
        for (int jj = 0; jj < cols; jj++) Mh[(size_t)(j0 + jj) * d + e] += acc[jj];
    if (threadIdx.x < cols) z[(size_t)h * d + j0 + threadIdx.x] += (float)zacc;
}

/* sk = sigma(k) over [n, width] (row stride ld for k, width for sk); ones[i] = 1 for the
 * column sums of z. */
template <typename T>
__global__ static void sigma_rows_kernel(int n, int width, int ld, const T *k, float *sk, float *ones)
{
    const size_t count = (size_t)n * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / width, col = i % width;
        sk[i] = sigma(load(k + r * ld + col));
        if (col == 0) ones[r] = 1.0f;
    }
}

/* dst = v over [n, width] as float32 (row stride ld for v, width for dst) */
__global__ static void widen_rows_kernel(int n, int width, int ld, const __nv_bfloat16 *v, float *dst)
{
    const size_t count = (size_t)n * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(v[(i / width) * ld + i % width]);
}

static unsigned grid_of(size_t count) { return (unsigned)((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096); }

static int threads_for(int d) { return (d + 31) / 32 * 32; }

int sf_cuda_memory_mix_general(sf_cuda *c, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                               const float *M, const float *z, const float *gate, float *a)
{
    dim3 grid((unsigned)heads, (unsigned)((n + ROW_TILE - 1) / ROW_TILE));
    size_t shared = (size_t)ROW_TILE * (d + 1) * sizeof(float);
    if (qtype == SF_DTYPE_BF16)
        retrieve_kernel<<<grid, threads_for(d), shared, c->stream>>>(RETRIEVE_MIX, n, d, ld, (const __nv_bfloat16 *)q,
                                                                     M, z, gate, (const __nv_bfloat16 *)NULL, a, ld);
    else
        retrieve_kernel<<<grid, threads_for(d), shared, c->stream>>>(RETRIEVE_MIX, n, d, ld, (const float *)q, M, z,
                                                                     gate, (const float *)NULL, a, ld);
    return sf_cuda_launched("memory_mix");
}

#define SF_UNSUPPORTED_LAYOUT 1 /* batched_update: take the one-kernel update instead */

static size_t update_part_bytes(int n, int width) { return ((size_t)n * width * sizeof(float) + 255) / 256 * 256; }

/* The update as cuBLAS products, which is what it is: per head M_h += sigma(K_h)^T T_h, one
 * strided-batched SGEMM over the heads (float32, DEFAULT math: no TF32), and z += the column
 * sums of sigma(K) as one SGEMV against a vector of ones. Read column-major, row-major
 * M_h[j][e] is C = M_h^T (d x d), T_h is (d x n) with ld target_ld and sigma(K_h) (d x n) with
 * ld width, so C += T_h * sigma(K_h)^T. sigma(K) and the ones go to the scratch, after the
 * target when that is there too (reserve sizes it); without room, the one-kernel update runs. */
template <typename T>
static int batched_update(sf_cuda *c, int n, int heads, int d, int ld, const T *k, const float *target, int target_ld,
                          float *M, float *z)
{
    const int width = heads * d;
    /* a target in the scratch sits at its start; sigma(K) and the ones follow it */
    size_t offset = (target == (const float *)c->scratch) ? update_part_bytes(n, width) : 0;
    if (offset + update_part_bytes(n, width) + (size_t)n * sizeof(float) > c->scratch_bytes) return SF_UNSUPPORTED_LAYOUT;
    float *sk = (float *)((char *)c->scratch + offset);
    float *ones = (float *)((char *)sk + update_part_bytes(n, width));
    sigma_rows_kernel<<<grid_of((size_t)n * width), 256, 0, c->stream>>>(n, width, ld, k, sk, ones);
    int rc = sf_cuda_launched("memory_update (sigma)");
    const float one = 1.0f;
    if (rc == SF_OK)
        rc = sf_cublas_status(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, d, d, n, &one, target,
                                                        target_ld, d, sk, width, d, &one, M, d, (long long)d * d,
                                                        heads),
                              "memory_update (batched SGEMM)");
    if (rc == SF_OK)
        rc = sf_cublas_status(cublasSgemv(c->blas, CUBLAS_OP_N, width, n, &one, sk, width, ones, 1, &one, z, 1),
                              "memory_update (z)");
    return rc;
}

/* general head sizes: [target] [sigma(K)] [ones] */
size_t sf_cuda_memory_general_bytes(int n, int heads, int d, int target)
{
    const size_t part = update_part_bytes(n, heads * d);
    return (target ? part : 0) + part + (size_t)n * sizeof(float);
}

/* The general update for k, v of type T: the target (delta: v - Retrieve(k); linear: v itself, or
 * v widened to float32 when T is bf16) into the scratch, then the cuBLAS products, or without room
 * for them the one-kernel update. */
template <typename T>
static int update_general(sf_cuda *c, sf_memory_kind kind, int n, int heads, int d, int ld, const T *k, const T *v,
                          float *M, float *z)
{
    const float *target = NULL;
    int target_ld = ld;
    const int width = heads * d;
    const bool widen = kind != SF_MEMORY_DELTA && !std::is_same<T, float>::value;
    int rc = sf_cuda_scratch(c, sf_cuda_memory_general_bytes(n, heads, d, kind == SF_MEMORY_DELTA || widen));
    if (rc == SF_OK && kind == SF_MEMORY_DELTA) {
        dim3 grid((unsigned)heads, (unsigned)((n + ROW_TILE - 1) / ROW_TILE));
        size_t shared = (size_t)ROW_TILE * (d + 1) * sizeof(float);
        retrieve_kernel<<<grid, threads_for(d), shared, c->stream>>>(RETRIEVE_DELTA, n, d, ld, k, M, z, NULL, v,
                                                                     (float *)c->scratch, width);
        rc = sf_cuda_launched("memory_update (delta target)");
        target = (const float *)c->scratch, target_ld = width;
    } else if (rc == SF_OK && widen) {
        const __nv_bfloat16 *vb = (const __nv_bfloat16 *)v;
        widen_rows_kernel<<<grid_of((size_t)n * width), 256, 0, c->stream>>>(n, width, ld, vb, (float *)c->scratch);
        rc = sf_cuda_launched("memory_update (v to float32)");
        target = (const float *)c->scratch, target_ld = width;
    } else {
        target = (const float *)v; /* T is float here */
    }
    if (rc == SF_OK) rc = batched_update(c, n, heads, d, ld, k, target, target_ld, M, z);
    if (rc == SF_UNSUPPORTED_LAYOUT) {
        dim3 grid((unsigned)heads, (unsigned)((d + COL_TILE - 1) / COL_TILE));
        size_t shared = ((size_t)SEG_TILE * COL_TILE + (size_t)SEG_TILE * d) * sizeof(float);
        update_kernel<<<grid, threads_for(d), shared, c->stream>>>(n, d, ld, k, target, target_ld, M, z);
        rc = sf_cuda_launched("memory_update");
    }
    return rc;
}

int sf_cuda_memory_update_general(sf_cuda *c, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                                  const void *k, const void *v, float *M, float *z)
{
    if (kvtype == SF_DTYPE_BF16)
        return update_general(c, kind, n, heads, d, ld, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, M, z);
    return update_general(c, kind, n, heads, d, ld, (const float *)k, (const float *)v, M, z);
}
