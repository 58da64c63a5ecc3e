/* Compressive memory on the GPU (SPEC 4), the twin of kernels/cpu/memory.c. M and z stay
 * float32 in every precision: they sum over the whole stream, and bf16 would lose it.
 *
 * memory_mix is one kernel: a block takes one head and ROW_TILE rows; sigma(q) of those rows
 * sits in shared memory, thread e walks column e of M_h once for all of them, and the gate mix
 * is written straight into a (no Retrieve buffer).
 * memory_update is one kernel for both kinds: a block owns COL_TILE rows j of M_h (and z_h)
 * and streams the segment through shared memory, M[j, e] += sum_i sigma(k_i)[j] target_i[e].
 * The target is v (linear) or v - Retrieve(sigma(k)) (delta); the delta's Retrieve must see
 * M before the update, so it runs first, into the reserved scratch.
 * For d = 32, 64, 128 the update itself is split over row chunks (split_update, below); other
 * head sizes take the cuBLAS products (batched_update), and without scratch the one kernel. */
#include "kernels/cuda/cuda_backend.h"

#define ROW_TILE 16  /* rows of q or k per block of the retrieval */
#define COL_TILE 8   /* rows of M_h per block of the update */
#define SEG_TILE 32  /* segment rows staged in shared memory per step of the update */
#define MAX_HEAD_DIM 256

__device__ static inline float sigma(float x) { return x > 0 ? x + 1.0f : expf(x); } /* ELU + 1 */

/* retrieve_kernel modes */
#define RETRIEVE_MIX 0    /* a = g * Retrieve(q) + (1 - g) * a */
#define RETRIEVE_DELTA 1  /* target = v - Retrieve(k) */

/* grid (heads, row tiles), block >= d threads. src is q (mix) or k (delta). */
__global__ static void retrieve_kernel(int mode, int n, int d, int ld, const float *src, const float *M,
                                       const float *z, const float *gate, const float *v, float *dst, int dst_ld)
{
    extern __shared__ float shared[];
    float *sx = shared;                 /* [ROW_TILE][d] */
    float *inv = shared + ROW_TILE * d; /* [ROW_TILE] */
    const int h = blockIdx.x, r0 = blockIdx.y * ROW_TILE, e = threadIdx.x;
    const int rows = n - r0 < ROW_TILE ? n - r0 : ROW_TILE;
    for (int idx = threadIdx.x; idx < ROW_TILE * d; idx += blockDim.x) {
        int r = idx / d, col = idx % d;
        sx[idx] = r < rows ? sigma(src[(size_t)(r0 + r) * ld + (size_t)h * d + col]) : 0.0f;
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
                v[(size_t)(r0 + r) * ld + (size_t)h * d + e] - acc[r] * inv[r];
    }
}

/* grid (heads, column tiles of M_h rows), block >= d threads. target has row stride target_ld. */
__global__ static void update_kernel(int n, int d, int ld, const float *k, const float *target, int target_ld,
                                     float *M, float *z)
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
            sk[idx] = r < rows && jj < cols ? sigma(k[(size_t)(i0 + r) * ld + (size_t)h * d + j0 + jj]) : 0.0f;
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
__global__ static void sigma_rows_kernel(int n, int width, int ld, const float *k, float *sk, float *ones)
{
    const size_t count = (size_t)n * width;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / width, col = i % width;
        sk[i] = sigma(k[r * ld + col]);
        if (col == 0) ones[r] = 1.0f;
    }
}

static int threads_for(int d) { return (d + 31) / 32 * 32; }

static int check_head_dim(int d)
{
    if (d <= 0 || d > MAX_HEAD_DIM)
        return sf_error(SF_E_UNSUPPORTED, "CUDA memory kernels take head_dim 1..%d, not %d", MAX_HEAD_DIM, d);
    return SF_OK;
}

int sf_cuda_memory_mix(sf_backend *be, int n, int heads, int d, int ld, const float *q, const float *M,
                       const float *z, const float *gate, float *a)
{
    if (n <= 0 || heads <= 0) return SF_OK;
    int rc = check_head_dim(d);
    if (rc != SF_OK) return rc;
    sf_cuda *c = sf_cuda_of(be);
    rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    dim3 grid((unsigned)heads, (unsigned)((n + ROW_TILE - 1) / ROW_TILE));
    size_t shared = (size_t)ROW_TILE * (d + 1) * sizeof(float);
    retrieve_kernel<<<grid, threads_for(d), shared, c->stream>>>(RETRIEVE_MIX, n, d, ld, q, M, z, gate, NULL, a, ld);
    rc = sf_cuda_launched("memory_mix");
    sf_cuda_leave(c);
    return rc;
}

#define SF_UNSUPPORTED_LAYOUT 1 /* batched_update: take the one-kernel update instead */

/* The split update (issue 3, gpuperf2). The products sigma(K_h)^T T_h are d x d with n-deep
 * sums; as one GEMM per head they ran on ~one CTA per head (16 of 132 SMs, ~3 ms a layer).
 * Here the segment rows are cut into chunks: block (chunk, head) sums its chunk into a d x d
 * partial (and the chunk's column sums of sigma(K) for z) in float32 registers, each thread a
 * (d/16) x (d/16) tile; a second kernel adds the partials to M and z in chunk order, so the
 * result is deterministic. sigma is applied while staging, so sigma(K) is never stored. */
#define SPLIT_THREADS 256
#define SPLIT_SEG 32          /* rows staged in shared memory per step */
#define SPLIT_MIN_ROWS 256    /* rows per chunk at least (fewer chunks for short segments) */
#define SPLIT_MAX_CHUNKS 64

template <int D>
__global__ static void __launch_bounds__(SPLIT_THREADS)
    split_partial_kernel(int n, int rows_per_chunk, int heads, int ld, const float *k, const float *target,
                         int target_ld, float *partM, float *partz)
{
    constexpr int T = D / 16; /* thread tile: rows j = tj + 16*a, columns e = te + 16*b */
    __shared__ float sk[SPLIT_SEG][D];
    __shared__ float tg[SPLIT_SEG][D];
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int tj = threadIdx.x / 16, te = threadIdx.x % 16;
    const int r_begin = chunk * rows_per_chunk;
    const int r_end = min(n, r_begin + rows_per_chunk);
    float acc[T][T];
#pragma unroll
    for (int a = 0; a < T; a++)
#pragma unroll
        for (int b = 0; b < T; b++) acc[a][b] = 0;
    float zacc = 0;
    for (int i0 = r_begin; i0 < r_end; i0 += SPLIT_SEG) {
        const int rows = min(SPLIT_SEG, r_end - i0);
        for (int idx = threadIdx.x; idx < SPLIT_SEG * D; idx += SPLIT_THREADS) {
            const int r = idx / D, col = idx % D;
            const bool in = r < rows;
            sk[r][col] = in ? sigma(k[(size_t)(i0 + r) * ld + (size_t)h * D + col]) : 0.0f;
            tg[r][col] = in ? target[(size_t)(i0 + r) * target_ld + (size_t)h * D + col] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int r = 0; r < SPLIT_SEG; r++) {
            float x[T], y[T];
#pragma unroll
            for (int a = 0; a < T; a++) x[a] = sk[r][tj + 16 * a];
#pragma unroll
            for (int b = 0; b < T; b++) y[b] = tg[r][te + 16 * b];
#pragma unroll
            for (int a = 0; a < T; a++)
#pragma unroll
                for (int b = 0; b < T; b++) acc[a][b] += x[a] * y[b];
        }
        if (threadIdx.x < D)
            for (int r = 0; r < rows; r++) zacc += sk[r][threadIdx.x];
        __syncthreads();
    }
    float *P = partM + ((size_t)chunk * heads + h) * D * D;
#pragma unroll
    for (int a = 0; a < T; a++)
#pragma unroll
        for (int b = 0; b < T; b++) P[(size_t)(tj + 16 * a) * D + te + 16 * b] = acc[a][b];
    if (threadIdx.x < D) partz[((size_t)chunk * heads + h) * D + threadIdx.x] = zacc;
}

/* M[i] += sum over chunks of partM[chunk][i] (i over heads*d*d), then z likewise. */
__global__ static void split_reduce_kernel(int chunks, size_t m_count, size_t z_count, const float *partM,
                                           const float *partz, float *M, float *z)
{
    const size_t total = m_count + z_count;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        if (i < m_count) {
            float s = 0;
            for (int c = 0; c < chunks; c++) s += partM[(size_t)c * m_count + i];
            M[i] += s;
        } else {
            const size_t j = i - m_count;
            double s = 0; /* z sums positive terms over the whole stream: double here, as on the CPU */
            for (int c = 0; c < chunks; c++) s += partz[(size_t)c * z_count + j];
            z[j] += (float)s;
        }
    }
}

static int split_chunks(int n)
{
    int chunks = (n + SPLIT_MIN_ROWS - 1) / SPLIT_MIN_ROWS;
    return chunks > SPLIT_MAX_CHUNKS ? SPLIT_MAX_CHUNKS : chunks;
}

/* bytes of the partials of split_update (0 when d has no split kernel) */
static size_t split_bytes(int n, int heads, int d)
{
    if (d != 32 && d != 64 && d != 128) return 0;
    return (size_t)split_chunks(n) * heads * ((size_t)d * d + d) * sizeof(float);
}

static int split_update(sf_cuda *c, void *part, int n, int heads, int d, int ld, const float *k, const float *target,
                        int target_ld, float *M, float *z)
{
    const int chunks = split_chunks(n);
    int rows = (n + chunks - 1) / chunks;
    rows = (rows + SPLIT_SEG - 1) / SPLIT_SEG * SPLIT_SEG;
    const int used = (n + rows - 1) / rows; /* rounding the chunk up can leave the last ones empty */
    float *partM = (float *)part;
    float *partz = partM + (size_t)used * heads * d * d;
    dim3 grid((unsigned)used, (unsigned)heads);
    if (d == 32)
        split_partial_kernel<32><<<grid, SPLIT_THREADS, 0, c->stream>>>(n, rows, heads, ld, k, target, target_ld, partM, partz);
    else if (d == 64)
        split_partial_kernel<64><<<grid, SPLIT_THREADS, 0, c->stream>>>(n, rows, heads, ld, k, target, target_ld, partM, partz);
    else
        split_partial_kernel<128><<<grid, SPLIT_THREADS, 0, c->stream>>>(n, rows, heads, ld, k, target, target_ld, partM, partz);
    int rc = sf_cuda_launched("memory_update (split partials)");
    if (rc != SF_OK) return rc;
    const size_t m_count = (size_t)heads * d * d, z_count = (size_t)heads * d;
    const size_t total = m_count + z_count;
    unsigned blocks = (unsigned)((total + 255) / 256 < 2048 ? (total + 255) / 256 : 2048);
    split_reduce_kernel<<<blocks, 256, 0, c->stream>>>(used, m_count, z_count, partM, partz, M, z);
    return sf_cuda_launched("memory_update (split reduce)");
}

static size_t update_part_bytes(int n, int width) { return ((size_t)n * width * sizeof(float) + 255) / 256 * 256; }

/* The update as cuBLAS products, which is what it is: per head M_h += sigma(K_h)^T T_h, one
 * strided-batched SGEMM over the heads (float32, DEFAULT math: no TF32), and z += the column
 * sums of sigma(K) as one SGEMV against a vector of ones. Read column-major, row-major
 * M_h[j][e] is C = M_h^T (d x d), T_h is (d x n) with ld target_ld and sigma(K_h) (d x n) with
 * ld width, so C += T_h * sigma(K_h)^T. sigma(K) and the ones go to the scratch after the
 * delta target (reserve sizes it); without room, the one-kernel update runs. */
static int batched_update(sf_cuda *c, int n, int heads, int d, int ld, const float *k, const float *target,
                          int target_ld, float *M, float *z)
{
    const int width = heads * d;
    /* the delta target sits at the start of the scratch; sigma(K) and the ones follow it */
    size_t offset = (target == (const float *)c->scratch) ? update_part_bytes(n, width) : 0;
    if (offset + update_part_bytes(n, width) + (size_t)n * sizeof(float) > c->scratch_bytes) return SF_UNSUPPORTED_LAYOUT;
    float *sk = (float *)((char *)c->scratch + offset);
    float *ones = (float *)((char *)sk + update_part_bytes(n, width));
    size_t count = (size_t)n * width;
    unsigned blocks = (unsigned)((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096);
    sigma_rows_kernel<<<blocks, 256, 0, c->stream>>>(n, width, ld, k, sk, ones);
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

/* [delta target] then [partial sums] (split) or [sigma(K)][ones] (batched): as laid out below */
size_t sf_cuda_memory_update_scratch_bytes(int n, int heads, int d)
{
    if (n <= 0 || heads <= 0 || d <= 0) return 0;
    const size_t part = update_part_bytes(n, heads * d), split = split_bytes(n, heads, d);
    const size_t rest = split ? split : part + (size_t)n * sizeof(float);
    return part + rest;
}

int sf_cuda_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, const float *k,
                          const float *v, float *M, float *z)
{
    if (kind == SF_MEMORY_NONE || n <= 0 || heads <= 0) return SF_OK;
    int rc = check_head_dim(d);
    if (rc != SF_OK) return rc;
    sf_cuda *c = sf_cuda_of(be);
    rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const float *target = v;
    int target_ld = ld;
    const int width = heads * d;
    /* [delta target] [sigma(K)] [ones] or [delta target] [partial sums]: reserve() sized it
     * (sf_cuda_memory_update_scratch_bytes); a caller that did not reserve grows it here, once */
    const size_t split = split_bytes(n, heads, d);
    const size_t target_bytes = kind == SF_MEMORY_DELTA ? update_part_bytes(n, width) : 0;
    rc = sf_cuda_scratch(c, split ? target_bytes + split
                                  : target_bytes + update_part_bytes(n, width) + (size_t)n * sizeof(float));
    if (kind == SF_MEMORY_DELTA) {
        if (rc == SF_OK) {
            dim3 grid((unsigned)heads, (unsigned)((n + ROW_TILE - 1) / ROW_TILE));
            size_t shared = (size_t)ROW_TILE * (d + 1) * sizeof(float);
            retrieve_kernel<<<grid, threads_for(d), shared, c->stream>>>(RETRIEVE_DELTA, n, d, ld, k, M, z, NULL, v,
                                                                         (float *)c->scratch, width);
            rc = sf_cuda_launched("memory_update (delta target)");
            target = (const float *)c->scratch, target_ld = width;
        }
    }
    if (rc == SF_OK && split)
        rc = split_update(c, (char *)c->scratch + target_bytes, n, heads, d, ld, k, target, target_ld, M, z);
    else if (rc == SF_OK)
        rc = batched_update(c, n, heads, d, ld, k, target, target_ld, M, z);
    if (rc == SF_UNSUPPORTED_LAYOUT) {
        dim3 grid((unsigned)heads, (unsigned)((d + COL_TILE - 1) / COL_TILE));
        size_t shared = ((size_t)SEG_TILE * COL_TILE + (size_t)SEG_TILE * d) * sizeof(float);
        update_kernel<<<grid, threads_for(d), shared, c->stream>>>(n, d, ld, k, target, target_ld, M, z);
        rc = sf_cuda_launched("memory_update");
    }
    sf_cuda_leave(c);
    return rc;
}
