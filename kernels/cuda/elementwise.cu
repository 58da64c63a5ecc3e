/* Row-wise and elementwise ops on the GPU: RMSNorm, embedding lookup, SwiGLU, summary pooling
 * (SPEC 2 and 5), and the float32 <-> bf16 conversions the products use. Sums of squares and
 * means accumulate in double, as the CPU twins (kernels/cpu/elementwise.c, summary.c) do. */
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_early.cuh"

#include <stdint.h>

#define ROW_THREADS 256

/* Block-wide sum; every thread gets the total. `shared` holds one slot per warp. */
__device__ static double block_sum(double v, double *shared)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    double total = 0;
    for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) total += shared[w];
    __syncthreads();
    return total;
}

__device__ static inline void store_row(float *dst, int j, float v) { dst[j] = v; }
__device__ static inline void store_row(__nv_bfloat16 *dst, int j, float v) { dst[j] = __float2bfloat16_rn(v); }
__device__ static inline void store4(float *dst, int j, float4 v) { *reinterpret_cast<float4 *>(dst + j) = v; }
__device__ static inline void store4(__nv_bfloat16 *dst, int j, float4 v)
{
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2 *>(dst + j) = make_uint2(*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi));
}

#define ROW_VEC 4 /* float4 loads a thread keeps in registers: rows up to 4 * 4 * ROW_THREADS wide */

/* One block a row. OUT float: the op (y may alias x: every read of the row happens before
 * block_sum's barrier). OUT bf16: the same float32 value rounded once, as the products then
 * take it (qkv, ffn), so the result is bit-identical to rmsnorm followed by sf_cuda_f32_to_bf16.
 * Rows of a multiple of 4 floats (16-byte aligned) are read once, 16 bytes a load, and kept in
 * registers for the scaling; others take the scalar loop, which reads the row twice. */
template <typename OUT>
__global__ static void rmsnorm_kernel(int dim, const float *x, const float *weight, float eps, OUT *y)
{
    __shared__ double partial[ROW_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * dim;
    OUT *dst = y + (size_t)blockIdx.x * dim;
    const bool vec = (dim & 3) == 0 && dim <= 4 * ROW_VEC * ROW_THREADS &&
                     (((uintptr_t)x | (uintptr_t)weight | (uintptr_t)y) & 15) == 0;
    double ss = 0;
    float4 v[ROW_VEC];
    if (vec) {
#pragma unroll
        for (int p = 0; p < ROW_VEC; p++) {
            int j = 4 * (threadIdx.x + p * ROW_THREADS);
            v[p] = j < dim ? *reinterpret_cast<const float4 *>(row + j) : make_float4(0, 0, 0, 0);
            ss += (double)v[p].x * v[p].x + (double)v[p].y * v[p].y + (double)v[p].z * v[p].z + (double)v[p].w * v[p].w;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)row[j] * row[j];
    }
    ss = block_sum(ss, partial);
    float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
    if (vec) {
#pragma unroll
        for (int p = 0; p < ROW_VEC; p++) {
            int j = 4 * (threadIdx.x + p * ROW_THREADS);
            if (j >= dim) continue;
            float4 w = *reinterpret_cast<const float4 *>(weight + j);
            store4(dst, j, make_float4(v[p].x * r * w.x, v[p].y * r * w.y, v[p].z * r * w.z, v[p].w * r * w.w));
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) store_row(dst, j, row[j] * r * weight[j]);
    }
}

/* One warp a row, for rows of a multiple of 4 floats up to 4 * 32 * VECS wide, 16-byte
 * aligned (the model widths): each lane holds VECS float4 loads in flight and the sum needs
 * only shuffles, no block barrier. One block a row left each thread one 16-byte load and two
 * barriers, ~1.7 TB/s on [8192, 1024]. Same contract as rmsnorm_kernel. */
template <typename OUT, int VECS>
__global__ static void rmsnorm_warp_kernel(int n, int dim, const float *x, const float *weight, float eps, OUT *y)
{
    sf_wait_prior_grid(); /* launched early: sf_cuda_launch_early */
    const int lane = threadIdx.x % 32;
    const size_t row_index = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row_index >= (size_t)n) return;
    const float *row = x + row_index * dim;
    OUT *dst = y + row_index * dim;
    float4 v[VECS];
    double ss = 0;
#pragma unroll
    for (int p = 0; p < VECS; p++) {
        int j = 4 * (lane + 32 * p);
        v[p] = j < dim ? *reinterpret_cast<const float4 *>(row + j) : make_float4(0, 0, 0, 0);
        ss += (double)v[p].x * v[p].x + (double)v[p].y * v[p].y + (double)v[p].z * v[p].z + (double)v[p].w * v[p].w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
#pragma unroll
    for (int p = 0; p < VECS; p++) {
        int j = 4 * (lane + 32 * p);
        if (j >= dim) continue;
        float4 w = *reinterpret_cast<const float4 *>(weight + j);
        store4(dst, j, make_float4(v[p].x * r * w.x, v[p].y * r * w.y, v[p].z * r * w.z, v[p].w * r * w.w));
    }
}

template <typename OUT>
static int launch_rmsnorm(int n, int dim, const float *x, const float *weight, float eps, OUT *y, cudaStream_t stream)
{
    const bool aligned = (dim & 3) == 0 && (((uintptr_t)x | (uintptr_t)weight | (uintptr_t)y) & 15) == 0;
    const unsigned warp_blocks = (unsigned)((n + ROW_THREADS / 32 - 1) / (ROW_THREADS / 32));
    if (aligned && dim <= 4 * 32 * 8)
        sf_cuda_launch_early(rmsnorm_warp_kernel<OUT, 8>, warp_blocks, ROW_THREADS, 0, stream, n, dim, x, weight, eps, y);
    else if (aligned && dim <= 4 * 32 * 16)
        sf_cuda_launch_early(rmsnorm_warp_kernel<OUT, 16>, warp_blocks, ROW_THREADS, 0, stream, n, dim, x, weight, eps,
                             y);
    else
        rmsnorm_kernel<OUT><<<n, ROW_THREADS, 0, stream>>>(dim, x, weight, eps, y);
    return sf_cuda_launched("rmsnorm");
}

int sf_cuda_rmsnorm_to_bf16(int n, int dim, const float *x, const float *weight, float eps, __nv_bfloat16 *y,
                            cudaStream_t stream)
{
    if (n <= 0 || dim <= 0) return SF_OK;
    return launch_rmsnorm(n, dim, x, weight, eps, y, stream);
}

int sf_cuda_rmsnorm_f32(int n, int dim, const float *x, const float *weight, float eps, float *y, cudaStream_t stream)
{
    return n <= 0 || dim <= 0 ? SF_OK : launch_rmsnorm(n, dim, x, weight, eps, y, stream);
}

int sf_cuda_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, float *y)
{
    if (n <= 0 || dim <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = launch_rmsnorm(n, dim, x, weight, eps, y, c->stream);
    sf_cuda_leave(c);
    return rc;
}

int sf_cuda_rmsnorm_typed(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps,
                          sf_dtype otype, void *y)
{
    if (otype != SF_DTYPE_F32 && otype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "rmsnorm_typed: output type %d is neither float32 nor bf16", (int)otype);
    if (n <= 0 || dim <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = otype == SF_DTYPE_BF16 ? launch_rmsnorm(n, dim, x, weight, eps, (__nv_bfloat16 *)y, c->stream)
                                : launch_rmsnorm(n, dim, x, weight, eps, (float *)y, c->stream);
    sf_cuda_leave(c);
    return rc;
}

__global__ static void embed_kernel(int dim, const uint32_t *tokens, const float *table, float *y)
{
    const float *src = table + (size_t)tokens[blockIdx.x] * dim;
    float *dst = y + (size_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
}

int sf_cuda_embed(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table, float *y)
{
    if (n <= 0 || dim <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    embed_kernel<<<n, ROW_THREADS, 0, c->stream>>>(dim, tokens, table, y);
    rc = sf_cuda_launched("embed");
    sf_cuda_leave(c);
    return rc;
}

__device__ static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* Four elements a thread when the buffers allow 16-byte accesses (count % 4 == 0 and aligned
 * pointers: every buffer the stages pass), else one. */
__global__ static void swiglu_kernel(size_t count, float *a, const float *b)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if ((count & 3) == 0 && (((uintptr_t)a | (uintptr_t)b) & 15) == 0) {
        float4 *a4 = reinterpret_cast<float4 *>(a);
        const float4 *b4 = reinterpret_cast<const float4 *>(b);
        for (; i < count / 4; i += stride) {
            float4 x = a4[i], y = b4[i];
            a4[i] = make_float4(silu(x.x) * y.x, silu(x.y) * y.y, silu(x.z) * y.z, silu(x.w) * y.w);
        }
        return;
    }
    for (; i < count; i += stride) a[i] = silu(a[i]) * b[i];
}

static unsigned grid_for(size_t count)
{
    size_t blocks = (count + 255) / 256;
    return blocks > 65535 ? 65535u : (unsigned)(blocks ? blocks : 1);
}

int sf_cuda_swiglu(sf_backend *be, int n, int f, float *a, const float *b)
{
    size_t count = (size_t)(n > 0 ? n : 0) * (size_t)(f > 0 ? f : 0);
    if (!count) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    swiglu_kernel<<<grid_for(count / 4 + 1), 256, 0, c->stream>>>(count, a, b);
    rc = sf_cuda_launched("swiglu");
    sf_cuda_leave(c);
    return rc;
}

/* blockIdx.y strides over rows; 8 outputs a thread when f % 8 == 0 and rows are 16-byte
 * aligned (every shape the reference model has), else one. */
__global__ static void swiglu_rows_bf16_kernel(int n, int f, const __nv_bfloat16 *h, __nv_bfloat16 *g)
{
    sf_wait_prior_grid(); /* launched early: sf_cuda_launch_early */
    const int vec = (f & 7) == 0 && (((uintptr_t)h | (uintptr_t)g) & 15) == 0;
    for (int r = blockIdx.y; r < n; r += gridDim.y) {
        const __nv_bfloat16 *a = h + (size_t)r * 2 * f, *b = a + f;
        __nv_bfloat16 *out = g + (size_t)r * f;
        if (vec) {
            for (int j = (blockIdx.x * blockDim.x + threadIdx.x) * 8; j < f; j += gridDim.x * blockDim.x * 8) {
                uint4 x = *reinterpret_cast<const uint4 *>(a + j), y = *reinterpret_cast<const uint4 *>(b + j);
                __nv_bfloat162 *xs = reinterpret_cast<__nv_bfloat162 *>(&x);
                const __nv_bfloat162 *ys = reinterpret_cast<const __nv_bfloat162 *>(&y);
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    float2 u = __bfloat1622float2(xs[p]), w = __bfloat1622float2(ys[p]);
                    xs[p] = __floats2bfloat162_rn(silu(u.x) * w.x, silu(u.y) * w.y);
                }
                *reinterpret_cast<uint4 *>(out + j) = x; /* 8 bf16 at once */
            }
        } else {
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < f; j += gridDim.x * blockDim.x)
                out[j] = __float2bfloat16_rn(silu(__bfloat162float(a[j])) * __bfloat162float(b[j]));
        }
    }
}

int sf_cuda_swiglu_rows_bf16(int n, int f, const __nv_bfloat16 *h, __nv_bfloat16 *g, cudaStream_t stream)
{
    if (n <= 0 || f <= 0) return SF_OK;
    unsigned x = (unsigned)((f / 8 + 255) / 256);
    dim3 grid(x ? x : 1, n < 65535 ? (unsigned)n : 65535u);
    sf_cuda_launch_early(swiglu_rows_bf16_kernel, grid, 256, 0, stream, n, f, h, g);
    return sf_cuda_launched("swiglu (bf16 rows)");
}

__device__ static inline double summary_elem(float x) { return x; }
__device__ static inline double summary_elem(__nv_bfloat16 x) { return __bfloat162float(x); }

/* Rows [lo, hi) of summary chunk j, cut at the n rows present, and the row of sk/sv it lands at
 * (the non-empty chunks before it); false when the chunk is empty. */
__device__ static inline bool summary_chunk(int j, int n, int segment, int summary_tokens, long *lo, long *hi,
                                            int *slot)
{
    *lo = (long)j * segment / summary_tokens, *hi = (long)(j + 1) * segment / summary_tokens;
    if (*hi > n) *hi = n;
    *slot = 0;
    for (int p = 0; p < j; p++) {
        long plo = (long)p * segment / summary_tokens, phi = (long)(p + 1) * segment / summary_tokens;
        if (phi > n) phi = n;
        *slot += plo < phi;
    }
    return *lo < *hi;
}

/* blockIdx.x = chunk j; chunk j lands at row "non-empty chunks before j" of sk/sv.
 * blockIdx.y takes SUMMARY_COLS columns; the block's SUMMARY_SLICES row slices each sum every
 * SUMMARY_SLICES-th row of the chunk (one serial 1024-row loop per column left most of the GPU
 * idle: ~0.22 ms a call on the reference model), then thread 0 of each column adds the slices
 * in a fixed order, so the mean stays deterministic. */
#define SUMMARY_COLS 32
#define SUMMARY_SLICES 8
template <typename T> /* the element type of k and v: float or bf16 */
__global__ static void summary_kernel(int n, int segment, int summary_tokens, int width, int ld, const T *k,
                                      const T *v, float *sk, float *sv)
{
    __shared__ double part[2][SUMMARY_SLICES][SUMMARY_COLS];
    long lo, hi;
    int slot;
    if (!summary_chunk(blockIdx.x, n, segment, summary_tokens, &lo, &hi, &slot)) return;
    const int col = threadIdx.x % SUMMARY_COLS, slice = threadIdx.x / SUMMARY_COLS;
    const int f = blockIdx.y * SUMMARY_COLS + col;
    double ak = 0, av = 0;
    if (f < width)
        for (long t = lo + slice; t < hi; t += SUMMARY_SLICES)
            ak += summary_elem(k[t * ld + f]), av += summary_elem(v[t * ld + f]);
    part[0][slice][col] = ak, part[1][slice][col] = av;
    __syncthreads();
    if (slice == 0 && f < width) {
        for (int r = 1; r < SUMMARY_SLICES; r++) ak += part[0][r][col], av += part[1][r][col];
        sk[(size_t)slot * width + f] = (float)(ak / (double)(hi - lo));
        sv[(size_t)slot * width + f] = (float)(av / (double)(hi - lo));
    }
}

/* bf16 k, v with 16-byte rows (ld, width multiples of 8): 8 columns a thread from one 16-byte
 * load of each, 8 threads a 64-column row piece (a whole 128-byte line), 64 row slices a block
 * (512 threads: at the reference, 8 chunks x 16 column pieces are 128 blocks, one an SM, so the
 * bytes in flight come from the threads of one block). The scalar kernel above reads 64 bytes
 * a warp a load and reached half the bytes floor (22 us a layer on the reference model for
 * 32 MB). Same sums: double, the slices added in order. */
#define SUMMARY_VEC_COLS 64
#define SUMMARY_VEC_SLICES 64
#define SUMMARY_VEC_THREADS (8 * SUMMARY_VEC_SLICES)
#define SUMMARY_VEC_SHARED (2 * SUMMARY_VEC_SLICES * SUMMARY_VEC_COLS * sizeof(double))
__global__ static void __launch_bounds__(SUMMARY_VEC_THREADS)
    summary_bf16x8_kernel(int n, int segment, int summary_tokens, int width, int ld, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v, float *sk, float *sv)
{
    extern __shared__ double summary_part[]; /* [2][SUMMARY_VEC_SLICES][SUMMARY_VEC_COLS] */
    double(*part)[SUMMARY_VEC_SLICES][SUMMARY_VEC_COLS] =
        reinterpret_cast<double(*)[SUMMARY_VEC_SLICES][SUMMARY_VEC_COLS]>(summary_part);
    long lo, hi;
    int slot;
    if (!summary_chunk(blockIdx.y, n, segment, summary_tokens, &lo, &hi, &slot)) return;
    const int cg = threadIdx.x % 8, slice = threadIdx.x / 8, c0 = cg * 8;
    const int f = blockIdx.x * SUMMARY_VEC_COLS + c0;
    double ak[8] = {0, 0, 0, 0, 0, 0, 0, 0}, av[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (f < width) {
#pragma unroll 4
        for (long t = lo + slice; t < hi; t += SUMMARY_VEC_SLICES) {
            const uint4 kw = __ldg((const uint4 *)(k + t * ld + f)), vw = __ldg((const uint4 *)(v + t * ld + f));
            const unsigned kk[4] = {kw.x, kw.y, kw.z, kw.w}, vv[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                ak[2 * i] += __uint_as_float(kk[i] << 16), ak[2 * i + 1] += __uint_as_float(kk[i] & 0xffff0000u);
                av[2 * i] += __uint_as_float(vv[i] << 16), av[2 * i + 1] += __uint_as_float(vv[i] & 0xffff0000u);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 8; i++) part[0][slice][c0 + i] = ak[i], part[1][slice][c0 + i] = av[i];
    __syncthreads();
    if (threadIdx.x < 2 * SUMMARY_VEC_COLS) {
        const int which = threadIdx.x / SUMMARY_VEC_COLS, col = threadIdx.x % SUMMARY_VEC_COLS;
        const int fc = blockIdx.x * SUMMARY_VEC_COLS + col;
        if (fc < width) {
            double sum = 0;
            for (int r = 0; r < SUMMARY_VEC_SLICES; r++) sum += part[which][r][col];
            (which ? sv : sk)[(size_t)slot * width + fc] = (float)(sum / (double)(hi - lo));
        }
    }
}

int sf_cuda_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, sf_dtype kvtype,
                    const void *k, const void *v, float *sk, float *sv, int *count)
{
    if (kvtype != SF_DTYPE_F32 && kvtype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "summary: element type %d of k/v is neither float32 nor bf16", (int)kvtype);
    /* the count depends on sizes only, so the host knows it without waiting for the device */
    int produced = 0;
    for (int j = 0; j < summary_tokens; j++) {
        long lo = (long)j * segment / summary_tokens, hi = (long)(j + 1) * segment / summary_tokens;
        if (hi > n) hi = n;
        produced += lo < hi;
    }
    *count = produced;
    if (!produced || width <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    dim3 grid((unsigned)summary_tokens, (unsigned)((width + SUMMARY_COLS - 1) / SUMMARY_COLS));
    const bool rows16 = ld % 8 == 0 && width % 8 == 0 && ((uintptr_t)k | (uintptr_t)v) % 16 == 0;
    if (kvtype == SF_DTYPE_BF16 && rows16) {
        rc = sf_cuda_status(cudaFuncSetAttribute(summary_bf16x8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)SUMMARY_VEC_SHARED),
                            "summary (shared memory limit)");
        if (rc == SF_OK)
            /* column pieces fastest: the blocks of one chunk's rows run together (whole rows) */
            summary_bf16x8_kernel<<<dim3((unsigned)((width + SUMMARY_VEC_COLS - 1) / SUMMARY_VEC_COLS),
                                         (unsigned)summary_tokens),
                                    SUMMARY_VEC_THREADS, SUMMARY_VEC_SHARED, c->stream>>>(
                n, segment, summary_tokens, width, ld, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, sk, sv);
    } else if (kvtype == SF_DTYPE_BF16)
        summary_kernel<<<grid, SUMMARY_COLS * SUMMARY_SLICES, 0, c->stream>>>(
            n, segment, summary_tokens, width, ld, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, sk, sv);
    else
        summary_kernel<<<grid, SUMMARY_COLS * SUMMARY_SLICES, 0, c->stream>>>(
            n, segment, summary_tokens, width, ld, (const float *)k, (const float *)v, sk, sv);
    if (rc == SF_OK) rc = sf_cuda_launched("summary");
    sf_cuda_leave(c);
    return rc;
}

/* blockIdx.y strides over rows, threads over columns: no index division (the flat version
 * divided by cols per element in 64 bits). 4 columns a thread when rows start 16-byte aligned. */
__global__ static void f32_to_bf16_kernel(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, int ldd)
{
    const int vec = (cols & 3) == 0 && (ld & 3) == 0 && (ldd & 3) == 0 && ((uintptr_t)src & 15) == 0 &&
                    ((uintptr_t)dst & 7) == 0;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *s = src + (size_t)r * ld;
        __nv_bfloat16 *d = dst + (size_t)r * ldd;
        if (vec) {
            for (int j = (blockIdx.x * blockDim.x + threadIdx.x) * 4; j < cols; j += gridDim.x * blockDim.x * 4) {
                float4 v = *reinterpret_cast<const float4 *>(s + j);
                __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
                uint2 packed = make_uint2(*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi));
                *reinterpret_cast<uint2 *>(d + j) = packed;
            }
        } else {
            for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += gridDim.x * blockDim.x)
                d[j] = __float2bfloat16_rn(s[j]);
        }
    }
}

int sf_cuda_f32_to_bf16_ld(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, int ldd,
                           cudaStream_t stream)
{
    if (rows <= 0 || cols <= 0) return SF_OK;
    unsigned x = (unsigned)((cols / 4 + 255) / 256);
    dim3 grid(x ? x : 1, rows < 65535 ? (unsigned)rows : 65535u);
    f32_to_bf16_kernel<<<grid, 256, 0, stream>>>(src, rows, cols, ld, dst, ldd);
    return sf_cuda_launched("f32 to bf16");
}

int sf_cuda_f32_to_bf16(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, cudaStream_t stream)
{
    return sf_cuda_f32_to_bf16_ld(src, rows, cols, ld, dst, cols, stream);
}

__global__ static void bf16_to_f32_kernel(const __nv_bfloat16 *src, size_t count, float *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

int sf_cuda_bf16_to_f32(const __nv_bfloat16 *src, size_t count, float *dst, cudaStream_t stream)
{
    if (!count) return SF_OK;
    bf16_to_f32_kernel<<<grid_for(count), 256, 0, stream>>>(src, count, dst);
    return sf_cuda_launched("bf16 to f32");
}

/* rows[i] += the sum of n parts' element i, in the parts' order (the first part starting the
 * sum), so that ranks adding the same parts in the same order get the same bits. N parts known
 * when compiled, so that the loop over them unrolls and their pointers stay in the parameters
 * (a loop over a run-time count measured half the memory rate); eight elements a step where the
 * count and the pointers allow (bf16 parts). */
struct add_parts_args {
    const void *p[SF_CUDA_ADD_PARTS_MAX];
};

template <int N> __global__ static void add_parts_bf16(float *rows, add_parts_args ps, size_t count)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count / 8; i += step) {
        uint4 raw[N];
#pragma unroll
        for (int q = 0; q < N; q++) raw[q] = reinterpret_cast<const uint4 *>(ps.p[q])[i];
        float4 *x4 = reinterpret_cast<float4 *>(rows) + 2 * i;
        float4 a = x4[0], b = x4[1];
        float s[8];
#pragma unroll
        for (int q = 0; q < N; q++) {
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&raw[q]);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float2 f = __bfloat1622float2(h[k]);
                s[2 * k] = q ? s[2 * k] + f.x : f.x, s[2 * k + 1] = q ? s[2 * k + 1] + f.y : f.y;
            }
        }
        a.x += s[0], a.y += s[1], a.z += s[2], a.w += s[3];
        b.x += s[4], b.y += s[5], b.z += s[6], b.w += s[7];
        x4[0] = a, x4[1] = b;
    }
}

/* the general form: any count and alignment, bf16 or float32 parts */
template <class T> __global__ static void add_parts_any(float *rows, add_parts_args ps, int n, size_t count)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += step) {
        float s = 0;
        for (int q = 0; q < n; q++) {
            const T v = static_cast<const T *>(ps.p[q])[i];
            float f;
            if constexpr (sizeof(T) == 2)
                f = __bfloat162float(v);
            else
                f = v;
            s = q ? s + f : f;
        }
        rows[i] += s;
    }
}

int sf_cuda_add_parts(const void *const *parts, int n, size_t count, float *rows, int bf16, cudaStream_t stream)
{
    if (n < 1 || n > SF_CUDA_ADD_PARTS_MAX) return sf_error(SF_E_INVAL, "cuda add: %d parts", n);
    if (!count) return SF_OK;
    add_parts_args ps = {};
    int vec = bf16 && count % 8 == 0 && ((uintptr_t)rows % 16) == 0;
    for (int q = 0; q < n; q++) ps.p[q] = parts[q], vec &= ((uintptr_t)parts[q] % 16) == 0;
    const unsigned grid = grid_for(vec ? count / 8 : count);
    switch (vec ? n : 0) {
    case 1: add_parts_bf16<1><<<grid, 256, 0, stream>>>(rows, ps, count); break;
    case 2: add_parts_bf16<2><<<grid, 256, 0, stream>>>(rows, ps, count); break;
    case 3: add_parts_bf16<3><<<grid, 256, 0, stream>>>(rows, ps, count); break;
    case 4: add_parts_bf16<4><<<grid, 256, 0, stream>>>(rows, ps, count); break;
    case 8: add_parts_bf16<8><<<grid, 256, 0, stream>>>(rows, ps, count); break;
    default:
        if (bf16)
            add_parts_any<__nv_bfloat16><<<grid_for(count), 256, 0, stream>>>(rows, ps, n, count);
        else
            add_parts_any<float><<<grid_for(count), 256, 0, stream>>>(rows, ps, n, count);
    }
    return sf_cuda_launched("add");
}

/* add_parts_bf16 then rmsnorm_warp_kernel in one pass, a warp a row at a time: rows[r] += the
 * sum of N bf16 parts' row r (the same order and roundings as add_parts_bf16), then u[r] = the
 * row's norm rounded to bf16 (the same sums as rmsnorm_warp_kernel: the lanes hold the same
 * columns and the columns past dim add zeros), so the result is bit-identical to the two kernels
 * while the rows are read once; the normed rows also go to `also` (other GPUs' buffers, through
 * peer access: no copy to wait for after the kernel). Rows of a multiple of 4 floats up to 4 *
 * 32 * VECS wide, every pointer 16-byte aligned and the parts' rows dim bf16 apart.
 *
 * A warp takes rows gridDim.x * (blockDim.x / 32) apart and, with PREFETCH, loads its next row
 * before it stores this one, so that its loads overlap its stores to another GPU, which drain
 * at the link's rate: with such copies 4 rows a warp and 4 warps a block took 9-10% off a row a
 * warp (bench/lab/bench_cuda_add_norm_peer.cu). Every shape gives the same bits. */
struct normed_copies {
    __nv_bfloat16 *p[SF_CUDA_ADD_PARTS_MAX];
    int n;
};

template <int N, int VECS> struct add_norm_row {
    float4 x[VECS];
    uint2 part[N][VECS];
};

template <int N, int VECS>
__device__ static inline void add_norm_load(add_norm_row<N, VECS> &in, const float *row, const add_parts_args &ps,
                                            size_t row_index, int dim, int lane)
{
#pragma unroll
    for (int p = 0; p < VECS; p++) {
        const int j = 4 * (lane + 32 * p);
        if (j >= dim) continue;
#pragma unroll
        for (int q = 0; q < N; q++)
            in.part[q][p] =
                *reinterpret_cast<const uint2 *>(static_cast<const __nv_bfloat16 *>(ps.p[q]) + row_index * dim + j);
        in.x[p] = *reinterpret_cast<const float4 *>(row + j);
    }
}

template <int N, int VECS, bool PREFETCH>
__global__ static void add_parts_norm_kernel(int n, int dim, float *rows, add_parts_args ps, const float *weight,
                                             float eps, __nv_bfloat16 *u, normed_copies also)
{
    const int lane = threadIdx.x % 32;
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    size_t row_index = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row_index >= (size_t)n) return;
    add_norm_row<N, VECS> in; /* PREFETCH: the next row's loads */
    if (PREFETCH) add_norm_load(in, rows + row_index * dim, ps, row_index, dim, lane);
    for (;;) {
        float *row = rows + row_index * dim;
        float4 v[VECS];
        double ss = 0;
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            const int j = 4 * (lane + 32 * p);
            if (j < dim) {
                float s[4];
#pragma unroll
                for (int q = 0; q < N; q++) {
                    const uint2 raw = PREFETCH ? in.part[q][p]
                                               : *reinterpret_cast<const uint2 *>(
                                                     static_cast<const __nv_bfloat16 *>(ps.p[q]) + row_index * dim + j);
                    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
                    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
                    s[0] = q ? s[0] + lo.x : lo.x, s[1] = q ? s[1] + lo.y : lo.y;
                    s[2] = q ? s[2] + hi.x : hi.x, s[3] = q ? s[3] + hi.y : hi.y;
                }
                v[p] = PREFETCH ? in.x[p] : *reinterpret_cast<const float4 *>(row + j);
                v[p].x += s[0], v[p].y += s[1], v[p].z += s[2], v[p].w += s[3];
            } else {
                v[p] = make_float4(0, 0, 0, 0);
            }
            ss += (double)v[p].x * v[p].x + (double)v[p].y * v[p].y + (double)v[p].z * v[p].z + (double)v[p].w * v[p].w;
        }
        const size_t next = row_index + warps;
        if (PREFETCH && next < (size_t)n) add_norm_load(in, rows + next * dim, ps, next, dim, lane); /* in flight */
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            const int j = 4 * (lane + 32 * p);
            if (j < dim) *reinterpret_cast<float4 *>(row + j) = v[p];
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
        __nv_bfloat16 *dst = u + row_index * dim;
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            int j = 4 * (lane + 32 * p);
            if (j >= dim) continue;
            float4 w = *reinterpret_cast<const float4 *>(weight + j);
            const float4 o = make_float4(v[p].x * r * w.x, v[p].y * r * w.y, v[p].z * r * w.z, v[p].w * r * w.w);
            store4(dst, j, o);
            for (int c = 0; c < also.n; c++) store4(also.p[c] + row_index * dim, j, o);
        }
        if (next >= (size_t)n) break;
        row_index = next;
    }
}

template <int VECS, bool PREFETCH>
static void launch_add_parts_norm(int nparts, unsigned grid, int threads, cudaStream_t stream, int n, int dim,
                                  float *rows, const add_parts_args &ps, const float *weight, float eps,
                                  __nv_bfloat16 *u, const normed_copies &also)
{
    switch (nparts) {
    case 1:
        add_parts_norm_kernel<1, VECS, PREFETCH><<<grid, threads, 0, stream>>>(n, dim, rows, ps, weight, eps, u, also);
        break;
    case 2:
        add_parts_norm_kernel<2, VECS, PREFETCH><<<grid, threads, 0, stream>>>(n, dim, rows, ps, weight, eps, u, also);
        break;
    default:
        add_parts_norm_kernel<4, VECS, PREFETCH><<<grid, threads, 0, stream>>>(n, dim, rows, ps, weight, eps, u, also);
    }
}

template <bool PREFETCH>
static void launch_add_parts_norm(int vecs, int nparts, unsigned grid, int threads, cudaStream_t stream, int n, int dim,
                                  float *rows, const add_parts_args &ps, const float *weight, float eps,
                                  __nv_bfloat16 *u, const normed_copies &also)
{
    if (vecs == 8)
        launch_add_parts_norm<8, PREFETCH>(nparts, grid, threads, stream, n, dim, rows, ps, weight, eps, u, also);
    else
        launch_add_parts_norm<16, PREFETCH>(nparts, grid, threads, stream, n, dim, rows, ps, weight, eps, u, also);
}

int sf_cuda_add_parts_norm_shaped(const void *const *parts, int nparts, int n, int dim, float *rows,
                                  const float *weight, float eps, __nv_bfloat16 *u, __nv_bfloat16 *const *also,
                                  int n_also, sf_cuda_add_norm_shape shape, cudaStream_t stream)
{
    const int rows_per_warp = shape.rows_per_warp, threads = shape.warps_per_block * 32;
    if (shape.warps_per_block < 1 || shape.warps_per_block > 32)
        return sf_error(SF_E_INVAL, "cuda add and norm: %d warps a block", shape.warps_per_block);
    if (nparts < 1 || nparts > SF_CUDA_ADD_PARTS_MAX)
        return sf_error(SF_E_INVAL, "cuda add and norm: %d parts", nparts);
    if (n_also < 0 || n_also > SF_CUDA_ADD_PARTS_MAX)
        return sf_error(SF_E_INVAL, "cuda add and norm: %d copies", n_also);
    if (rows_per_warp < 1) return sf_error(SF_E_INVAL, "cuda add and norm: %d rows a warp", rows_per_warp);
    if (n <= 0 || dim <= 0) return SF_OK;
    if (!weight) return sf_cuda_add_parts(parts, nparts, (size_t)n * dim, rows, 1, stream);
    add_parts_args ps = {};
    normed_copies cs = {};
    uintptr_t align = (uintptr_t)rows | (uintptr_t)weight | (uintptr_t)u;
    for (int q = 0; q < nparts; q++) ps.p[q] = parts[q], align |= (uintptr_t)parts[q];
    for (int c = 0; c < n_also; c++) cs.p[c] = also[c], align |= (uintptr_t)also[c];
    cs.n = n_also;
    const int fused =
        (align & 15) == 0 && (dim & 3) == 0 && dim <= 4 * 32 * 16 && (nparts == 1 || nparts == 2 || nparts == 4);
    if (!fused) { /* the composition, which the fused kernel equals bit for bit, then the copies */
        int rc = sf_cuda_add_parts(parts, nparts, (size_t)n * dim, rows, 1, stream);
        if (rc == SF_OK) rc = sf_cuda_rmsnorm_to_bf16(n, dim, rows, weight, eps, u, stream);
        for (int c = 0; c < n_also && rc == SF_OK; c++)
            rc = sf_cuda_status(cudaMemcpyAsync(also[c], u, (size_t)n * dim * 2, cudaMemcpyDefault, stream),
                                "add and norm (copy)");
        return rc;
    }
    const long long per_block = (long long)shape.warps_per_block * rows_per_warp;
    const unsigned grid = (unsigned)((n + per_block - 1) / per_block);
    const int vecs = dim <= 4 * 32 * 8 ? 8 : 16;
    if (shape.prefetch)
        launch_add_parts_norm<true>(vecs, nparts, grid, threads, stream, n, dim, rows, ps, weight, eps, u, cs);
    else
        launch_add_parts_norm<false>(vecs, nparts, grid, threads, stream, n, dim, rows, ps, weight, eps, u, cs);
    return sf_cuda_launched("add and norm");
}

int sf_cuda_add_parts_norm(const void *const *parts, int nparts, int n, int dim, float *rows, const float *weight,
                           float eps, __nv_bfloat16 *u, __nv_bfloat16 *const *also, int n_also, cudaStream_t stream)
{
    /* with copies to other GPUs a warp takes several rows (see the kernel); a row a warp keeps
     * the most loads in flight where every store is local */
    const sf_cuda_add_norm_shape shape =
        n_also ? SF_CUDA_ADD_NORM_PEER_SHAPE : sf_cuda_add_norm_shape{1, ROW_THREADS / 32, 0};
    return sf_cuda_add_parts_norm_shaped(parts, nparts, n, dim, rows, weight, eps, u, also, n_also, shape, stream);
}

int sf_cuda_add_typed(sf_backend *be, size_t count, float *x, sf_dtype ytype, const void *y)
{
    if (ytype != SF_DTYPE_F32 && ytype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda add: unknown type %d", (int)ytype);
    if (!count) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_add_parts(&y, 1, count, x, ytype == SF_DTYPE_BF16, c->stream);
    sf_cuda_leave(c);
    return rc;
}

/* Sets *flag when any of n 32-bit words holds a NaN or an infinity: a float32 each, or two bf16
 * (bf16 = the high half of a float32: exponent bits 0x7f80 all set). A tail bf16 of an odd count
 * is one more word whose high half is ignored (last_mask). */
__global__ static void any_non_finite_kernel(const uint32_t *w, size_t n, int bf16, uint32_t last_mask, int *flag)
{
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = w[i];
        if (i == n - 1) v &= last_mask;
        bad |= bf16 ? ((v & 0x7f80u) == 0x7f80u) | ((v & 0x7f800000u) == 0x7f800000u) : (v & 0x7f800000u) == 0x7f800000u;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *(volatile int *)flag = 1;
}

int sf_cuda_non_finite_begin(sf_backend *be, const void *x, sf_dtype type, size_t count, int *ticket)
{
    if (type != SF_DTYPE_F32 && type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda any_non_finite: unknown element type %d", (int)type);
    if (((uintptr_t)x & 3) != 0) return sf_error(SF_E_INVAL, "cuda any_non_finite: rows not 4-byte aligned");
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    /* a slot whose previous scan was never ended is not reused: at most SF_CUDA_FINITE_FLAGS
     * scans are in flight (one per stage thread between its begin and end, in practice) */
    int slot = -1;
    for (unsigned k = 0; k < SF_CUDA_FINITE_FLAGS && slot < 0; k++) {
        const unsigned s = (c->finite_next + k) % SF_CUDA_FINITE_FLAGS;
        if (!c->finite_busy[s]) slot = (int)s;
    }
    if (slot < 0) {
        sf_cuda_leave(c);
        return sf_error(SF_E_INVAL, "cuda any_non_finite: more than %d scans in flight", SF_CUDA_FINITE_FLAGS);
    }
    c->finite_next = (unsigned)slot + 1;
    c->finite_busy[slot] = 1;
    c->finite_flags[slot] = 0;
    if (count) {
        const int bf16 = type == SF_DTYPE_BF16;
        const size_t words = bf16 ? (count + 1) / 2 : count;
        /* little-endian: an odd bf16 count's last element is the low half of the last word */
        const uint32_t last_mask = bf16 && (count & 1) ? 0x0000ffffu : 0xffffffffu;
        const size_t want = (words + 4 * ROW_THREADS - 1) / (4 * ROW_THREADS);
        const unsigned blocks = (unsigned)(want < 1024 ? (want ? want : 1) : 1024);
        any_non_finite_kernel<<<blocks, ROW_THREADS, 0, c->stream>>>((const uint32_t *)x, words, bf16, last_mask,
                                                                      c->finite_flags_dev + slot);
        rc = sf_cuda_status(cudaGetLastError(), "any_non_finite");
    }
    /* an event right behind the kernel: the stream may be shared with other stage threads, whose
     * later work (the next segment's layers) the end must not wait for */
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(c->finite_done[slot], c->stream), "any_non_finite (order)");
    if (rc != SF_OK) c->finite_busy[slot] = 0;
    sf_cuda_leave(c);
    *ticket = slot;
    return rc;
}

int sf_cuda_non_finite_end(sf_backend *be, int ticket, int *found)
{
    *found = 0;
    sf_cuda *c = sf_cuda_of(be);
    if (ticket < 0 || ticket >= SF_CUDA_FINITE_FLAGS) return sf_error(SF_E_INVAL, "cuda any_non_finite: bad ticket");
    /* waiting outside the lock lets other stage threads keep issuing work meanwhile; after the
     * download of the same rows this returns at once */
    int rc = sf_cuda_status(cudaEventSynchronize(c->finite_done[ticket]), "any_non_finite (synchronize)");
    if (rc == SF_OK) *found = ((volatile int *)c->finite_flags)[ticket] != 0;
    pthread_mutex_lock(&c->lock);
    c->finite_busy[ticket] = 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Loads this file's kernels (the ones the embed and norm stages and the output checks launch
 * outside the block's layers) now: under lazy module loading each kernel's image is loaded at
 * its first launch, which would otherwise land in the first segment. */
int sf_cuda_elementwise_load(void)
{
    const void *kernels[] = {
        (const void *)embed_kernel,
        (const void *)rmsnorm_kernel<float>,
        (const void *)rmsnorm_kernel<__nv_bfloat16>,
        (const void *)rmsnorm_warp_kernel<float, 8>,
        (const void *)rmsnorm_warp_kernel<float, 16>,
        (const void *)rmsnorm_warp_kernel<__nv_bfloat16, 8>,
        (const void *)rmsnorm_warp_kernel<__nv_bfloat16, 16>,
        (const void *)swiglu_kernel,
        (const void *)swiglu_rows_bf16_kernel,
        (const void *)f32_to_bf16_kernel,
        (const void *)bf16_to_f32_kernel,
        (const void *)add_parts_bf16<1>,
        (const void *)add_parts_norm_kernel<2, 8, false>,
        (const void *)add_parts_norm_kernel<2, 8, true>,
        (const void *)any_non_finite_kernel,
    };
    cudaFuncAttributes fa;
    for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) {
        int rc = sf_cuda_status(cudaFuncGetAttributes(&fa, kernels[i]), "loading a kernel");
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}
