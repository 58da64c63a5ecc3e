/* Row-wise and elementwise ops on the GPU: RMSNorm, embedding lookup, SwiGLU, summary pooling
 * (SPEC 2 and 5), and the float32 <-> bf16 conversions the products use. Sums of squares and
 * means accumulate in double, as the CPU twins (kernels/cpu/elementwise.c, summary.c) do. */
#include "kernels/cuda/cuda_backend.h"

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

__global__ static void rmsnorm_kernel(int dim, const float *x, const float *weight, float eps, float *y)
{
    __shared__ double partial[ROW_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * dim;
    float *dst = y + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (double)row[j] * row[j];
    ss = block_sum(ss, partial);
    float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
    /* y may alias x: every read of the row happened before block_sum's barrier */
    for (int j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = row[j] * r * weight[j];
}

int sf_cuda_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, float *y)
{
    if (n <= 0 || dim <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rmsnorm_kernel<<<n, ROW_THREADS, 0, c->stream>>>(dim, x, weight, eps, y);
    rc = sf_cuda_launched("rmsnorm");
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

__global__ static void swiglu_kernel(size_t count, float *a, const float *b)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float x = a[i];
        a[i] = x / (1.0f + expf(-x)) * b[i];
    }
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
    swiglu_kernel<<<grid_for(count), 256, 0, c->stream>>>(count, a, b);
    rc = sf_cuda_launched("swiglu");
    sf_cuda_leave(c);
    return rc;
}

/* blockIdx.x = chunk j; chunk j lands at row "non-empty chunks before j" of sk/sv.
 * blockIdx.y takes SUMMARY_COLS columns; the block's SUMMARY_SLICES row slices each sum every
 * SUMMARY_SLICES-th row of the chunk (one serial 1024-row loop per column left most of the GPU
 * idle: ~0.22 ms a call on the reference model), then thread 0 of each column adds the slices
 * in a fixed order, so the mean stays deterministic. */
#define SUMMARY_COLS 32
#define SUMMARY_SLICES 8
__global__ static void summary_kernel(int n, int segment, int summary_tokens, int width, int ld, const float *k,
                                      const float *v, float *sk, float *sv)
{
    __shared__ double part[2][SUMMARY_SLICES][SUMMARY_COLS];
    const int j = blockIdx.x;
    long lo = (long)j * segment / summary_tokens, hi = (long)(j + 1) * segment / summary_tokens;
    if (hi > n) hi = n;
    if (lo >= hi) return;
    int slot = 0;
    for (int p = 0; p < j; p++) {
        long plo = (long)p * segment / summary_tokens, phi = (long)(p + 1) * segment / summary_tokens;
        if (phi > n) phi = n;
        slot += plo < phi;
    }
    const int col = threadIdx.x % SUMMARY_COLS, slice = threadIdx.x / SUMMARY_COLS;
    const int f = blockIdx.y * SUMMARY_COLS + col;
    double ak = 0, av = 0;
    if (f < width)
        for (long t = lo + slice; t < hi; t += SUMMARY_SLICES) ak += k[t * ld + f], av += v[t * ld + f];
    part[0][slice][col] = ak, part[1][slice][col] = av;
    __syncthreads();
    if (slice == 0 && f < width) {
        for (int r = 1; r < SUMMARY_SLICES; r++) ak += part[0][r][col], av += part[1][r][col];
        sk[(size_t)slot * width + f] = (float)(ak / (double)(hi - lo));
        sv[(size_t)slot * width + f] = (float)(av / (double)(hi - lo));
    }
}

int sf_cuda_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, const float *k,
                    const float *v, float *sk, float *sv, int *count)
{
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
    summary_kernel<<<grid, SUMMARY_COLS * SUMMARY_SLICES, 0, c->stream>>>(n, segment, summary_tokens, width, ld, k, v, sk, sv);
    rc = sf_cuda_launched("summary");
    sf_cuda_leave(c);
    return rc;
}

__global__ static void f32_to_bf16_kernel(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst)
{
    size_t count = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, col = i % cols;
        dst[i] = __float2bfloat16_rn(src[r * ld + col]);
    }
}

int sf_cuda_f32_to_bf16(const float *src, int rows, int cols, int ld, __nv_bfloat16 *dst, cudaStream_t stream)
{
    size_t count = (size_t)rows * cols;
    if (!count) return SF_OK;
    f32_to_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(src, rows, cols, ld, dst);
    return sf_cuda_launched("f32 to bf16");
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
