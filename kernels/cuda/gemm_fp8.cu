/* Precision fp8: the projections and MLP products in FP8 e4m3 through cuBLASLt (matmul.cu
 * calls in). Weights are quantized once (prepare_weight_group) with a float32 scale per output
 * channel; each product's input is quantized on the fly with a scale per row, in one kernel
 * that finds the row's largest magnitude and writes the e4m3 row (fused with the norm ahead
 * of Q/K/V and W1/W3, and with SwiGLU ahead of W2). cuBLASLt multiplies the e4m3 operands with
 * float32 accumulation and, where it offers the outer-vector scale mode (cuBLAS 12.9 and up on
 * Hopper), multiplies each output by its row's and its channel's scale itself; elsewhere (or
 * with setting fp8_scale=epilogue) it runs with unit scales into a float32 buffer and
 * scale_epilogue below applies them. Accumulation is cuBLASLt's default, which promotes the
 * tensor cores' partial sums to float32 (FAST_ACCUM off): the products stay accurate to the
 * inputs' rounding; setting fp8_accum=fast turns FAST_ACCUM on (faster, the partial sums then
 * keep the tensor cores' narrower accumulator).
 * A weight prepared alone (the output and down products; setting fp8_blocks) with inputs a
 * multiple of 128 is quantized with a scale for each 128 inputs of a channel instead, and its
 * product's input with one for each 128 values of a row: cuBLASLt's VEC128 mode on both, which
 * applies each pair of scales to its 128-deep part of the sum. Finer scales lose no accuracy,
 * and a kernel that writes the input tile by tile (the gate/up kernel writing g) can quantize
 * it itself, where a row's scale would need the whole row first. */
#include "kernels/cuda/cuda_backend.h"

#include <cuda_fp8.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define E4M3_MAX 448.0f
#define QUANT_THREADS 256
#define FP8_CANDIDATES 8
#define FP8_TIMED_RUNS 3

/* ---- quantization ------------------------------------------------------------------------ */

static __device__ __forceinline__ float block_max(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* shared may still be read from a previous reduction */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float block_add(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Bytes of one value of x as `KIND` reads it. */
template <int KIND> __host__ __device__ constexpr size_t elem_bytes()
{
    return KIND == SF_CUDA_FP8_IN_F32 || KIND == SF_CUDA_FP8_IN_RMSNORM ? 4 : 2;
}

/* v[j] of the row as sf_cuda_fp8_input says; for RMSNORM before the row's 1/rms (applied by
 * the caller: it needs the whole row first). */
template <int KIND>
static __device__ __forceinline__ float row_value(const void *row, int cols, const float *norm, int j)
{
    if (KIND == SF_CUDA_FP8_IN_F32) return ((const float *)row)[j];
    if (KIND == SF_CUDA_FP8_IN_BF16) return __bfloat162float(((const __nv_bfloat16 *)row)[j]);
    if (KIND == SF_CUDA_FP8_IN_RMSNORM) return ((const float *)row)[j] * norm[j];
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)row;
    const float a = __bfloat162float(h[j]), b = __bfloat162float(h[cols + j]);
    return a / (1.0f + __expf(-a)) * b;
}

/* The row's scale from its thread-local largest magnitude and sum of squares (the norm's, for
 * SF_CUDA_FP8_IN_RMSNORM): written to *scale by thread 0; returns what a value is multiplied by
 * before its conversion (the norm's factor over the scale). A zero row takes scale 1 (and one of
 * non-finite values carries them into the output through its scale). */
template <int KIND>
static __device__ __forceinline__ float row_scale(float amax, float ss, int cols, float eps, float *shared,
                                                  float *scale)
{
    amax = block_max(amax, shared);
    float mult = 1.0f;
    if (KIND == SF_CUDA_FP8_IN_RMSNORM) {
        ss = block_add(ss, shared);
        mult = rsqrtf(ss / (float)cols + eps);
        amax *= mult;
    }
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    if (threadIdx.x == 0) *scale = s;
    return mult / s;
}

/* One block a row, for any row: pass 1 finds the largest magnitude (and the sum of squares for
 * the norm), pass 2 reads the row again (from L1/L2) and writes it. Rows that fit the
 * registers take quantize_rows_vec_kernel below instead. */
template <int KIND>
__global__ static void __launch_bounds__(QUANT_THREADS) quantize_rows_kernel(int cols, const void *x, int ldx,
                                                                             const float *norm, float eps,
                                                                             unsigned char *q, float *scale)
{
    __shared__ float shared[QUANT_THREADS / 32];
    const size_t r = blockIdx.x;
    const void *row = (const char *)x + r * (size_t)ldx * elem_bytes<KIND>();
    float amax = 0.0f, ss = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        amax = fmaxf(amax, fabsf(row_value<KIND>(row, cols, norm, j)));
        if (KIND == SF_CUDA_FP8_IN_RMSNORM) {
            const float v = ((const float *)row)[j];
            ss += v * v;
        }
    }
    const float inv = row_scale<KIND>(amax, ss, cols, eps, shared, scale + r);
    unsigned char *dst = q + r * (size_t)cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        dst[j] = (unsigned char)__nv_cvt_float_to_fp8(row_value<KIND>(row, cols, norm, j) * inv, __NV_SATFINITE,
                                                      __NV_E4M3);
}

/* Eight consecutive values v[0..7] of the row from column j (16-byte loads); for RMSNORM the sum
 * of squares of x is added to *ss. */
template <int KIND>
static __device__ __forceinline__ void load8(const void *row, int cols, const float *norm, int j, float *v, float *ss)
{
    if (KIND == SF_CUDA_FP8_IN_F32 || KIND == SF_CUDA_FP8_IN_RMSNORM) {
        const float4 a = *reinterpret_cast<const float4 *>((const float *)row + j);
        const float4 b = *reinterpret_cast<const float4 *>((const float *)row + j + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        if (KIND == SF_CUDA_FP8_IN_RMSNORM) {
            const float4 ga = *reinterpret_cast<const float4 *>(norm + j);
            const float4 gb = *reinterpret_cast<const float4 *>(norm + j + 4);
            const float g[8] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
#pragma unroll
            for (int i = 0; i < 8; i++) *ss += v[i] * v[i], v[i] *= g[i];
        }
    } else if (KIND == SF_CUDA_FP8_IN_BF16) {
        const uint4 u = *reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)row + j);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else {
        const uint4 ua = *reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)row + j);
        const uint4 ub = *reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)row + cols + j);
        const __nv_bfloat162 *ha = reinterpret_cast<const __nv_bfloat162 *>(&ua);
        const __nv_bfloat162 *hb = reinterpret_cast<const __nv_bfloat162 *>(&ub);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 a = __bfloat1622float2(ha[i]), b = __bfloat1622float2(hb[i]);
            v[2 * i] = a.x / (1.0f + __expf(-a.x)) * b.x;
            v[2 * i + 1] = a.y / (1.0f + __expf(-a.y)) * b.y;
        }
    }
}

/* The scale of 128 values whose largest magnitude (after the row's norm factor mult) is amax,
 * as row_scale takes it for a row; returns the values' multiplier. */
static __device__ __forceinline__ float block_scale(float amax, float mult, float *scale)
{
    amax *= mult;
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    if (scale) *scale = s;
    return mult / s;
}

/* quantize_rows_kernel for rows of up to QUANT_THREADS * VPT values, a multiple of 8, 16-byte
 * aligned: the row is read once, 16 bytes a load, kept in registers (VPT values a thread)
 * between the reduction and the quantization, and written 8 bytes a store. BLOCKS: a scale for
 * each 128 values (16 threads' 8; cols a multiple of 128), at scale[(j / 128) rows + r] for the
 * grid's rows; those past the n of x are zeros. */
template <int KIND, int VPT, bool BLOCKS>
__global__ static void __launch_bounds__(QUANT_THREADS)
    quantize_rows_vec_kernel(int n, int cols, const void *x, int ldx, const float *norm, float eps, unsigned char *q,
                             float *scale)
{
    __shared__ float shared[QUANT_THREADS / 32];
    const size_t r = blockIdx.x;
    const bool real = r < (size_t)n;
    const void *row = (const char *)x + r * (size_t)ldx * elem_bytes<KIND>();
    float v[VPT];
    float amax = 0.0f, ss = 0.0f;
#pragma unroll
    for (int p = 0; p < VPT / 8; p++) {
        const int j = 8 * (threadIdx.x + p * QUANT_THREADS);
        if (j < cols && real) {
            load8<KIND>(row, cols, norm, j, v + 8 * p, &ss);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) v[8 * p + i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[8 * p + i]));
    }
    float inv[VPT / 8];
    if (BLOCKS) {
        const float mult = KIND == SF_CUDA_FP8_IN_RMSNORM ? rsqrtf(block_add(ss, shared) / (float)cols + eps) : 1.0f;
#pragma unroll
        for (int p = 0; p < VPT / 8; p++) {
            const int j = 8 * (threadIdx.x + p * QUANT_THREADS);
            float m = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) m = fmaxf(m, fabsf(v[8 * p + i]));
            for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const bool writes = threadIdx.x % 16 == 0 && j < cols;
            inv[p] = block_scale(m, mult, writes ? scale + (size_t)(j / 128) * gridDim.x + r : nullptr);
        }
    } else {
        const float one = row_scale<KIND>(amax, ss, cols, eps, shared, scale + r);
#pragma unroll
        for (int p = 0; p < VPT / 8; p++) inv[p] = one;
    }
    unsigned char *dst = q + r * (size_t)cols;
#pragma unroll
    for (int p = 0; p < VPT / 8; p++) {
        const int j = 8 * (threadIdx.x + p * QUANT_THREADS);
        if (j >= cols) continue;
        unsigned short pair[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            pair[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[8 * p + 2 * i] * inv[p], v[8 * p + 2 * i + 1] * inv[p]),
                                               __NV_SATFINITE, __NV_E4M3);
        *reinterpret_cast<uint2 *>(dst + j) =
            make_uint2(pair[0] | (unsigned)pair[1] << 16, pair[2] | (unsigned)pair[3] << 16);
    }
}

/* quantize_rows_kernel with a scale for each 128 values of a row (any alignment; cols a
 * multiple of 128): a warp a block of 128 at a time, each lane 4 of its values; the grid's rows
 * past the n of x are zeros. */
template <int KIND>
__global__ static void __launch_bounds__(QUANT_THREADS)
    quantize_blocks_kernel(int n, int cols, const void *x, int ldx, const float *norm, float eps, unsigned char *q,
                           float *scale)
{
    __shared__ float shared[QUANT_THREADS / 32];
    const size_t r = blockIdx.x;
    const bool real = r < (size_t)n;
    const void *row = (const char *)x + r * (size_t)ldx * elem_bytes<KIND>();
    float mult = 1.0f;
    if (KIND == SF_CUDA_FP8_IN_RMSNORM) {
        float ss = 0.0f;
        for (int j = threadIdx.x; j < cols && real; j += blockDim.x)
            ss += ((const float *)row)[j] * ((const float *)row)[j];
        mult = rsqrtf(block_add(ss, shared) / (float)cols + eps);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int b = warp; b < cols / 128; b += QUANT_THREADS / 32) {
        float v[4], m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++)
            m = fmaxf(m, fabsf(v[i] = real ? row_value<KIND>(row, cols, norm, 128 * b + lane + 32 * i) : 0.0f));
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float inv = block_scale(m, mult, lane == 0 ? scale + (size_t)b * gridDim.x + r : nullptr);
#pragma unroll
        for (int i = 0; i < 4; i++)
            q[r * cols + 128 * b + lane + 32 * i] =
                (unsigned char)__nv_cvt_float_to_fp8(v[i] * inv, __NV_SATFINITE, __NV_E4M3);
    }
}

/* rows: the grid (n, or with BLOCKS n padded as sf_cuda_fp8_padded_rows says) */
template <int KIND, bool BLOCKS>
static void launch_quantize(int n, int rows, int cols, const void *x, int ldx, const float *norm, float eps,
                            unsigned char *q, float *scale, cudaStream_t stream)
{
    const size_t elem = elem_bytes<KIND>();
    const uintptr_t bits = (uintptr_t)x | (uintptr_t)((size_t)ldx * elem) |
                           (KIND == SF_CUDA_FP8_IN_SWIGLU ? (uintptr_t)((size_t)cols * elem) : 0) |
                           (KIND == SF_CUDA_FP8_IN_RMSNORM ? (uintptr_t)norm : 0);
    const bool vec = cols % 8 == 0 && (bits & 15) == 0 && ((uintptr_t)q & 7) == 0;
    if (vec && cols <= 8 * QUANT_THREADS)
        quantize_rows_vec_kernel<KIND, 8, BLOCKS>
            <<<rows, QUANT_THREADS, 0, stream>>>(n, cols, x, ldx, norm, eps, q, scale);
    else if (vec && cols <= 16 * QUANT_THREADS)
        quantize_rows_vec_kernel<KIND, 16, BLOCKS>
            <<<rows, QUANT_THREADS, 0, stream>>>(n, cols, x, ldx, norm, eps, q, scale);
    else if (BLOCKS)
        quantize_blocks_kernel<KIND><<<rows, QUANT_THREADS, 0, stream>>>(n, cols, x, ldx, norm, eps, q, scale);
    else
        quantize_rows_kernel<KIND><<<n, QUANT_THREADS, 0, stream>>>(cols, x, ldx, norm, eps, q, scale);
}

template <bool BLOCKS>
static int quantize(sf_cuda_fp8_input kind, int n, int cols, const void *x, int ldx, const float *norm, float eps,
                    unsigned char *q, float *scale, cudaStream_t stream)
{
    if (n <= 0 || cols <= 0) return SF_OK;
    if (BLOCKS && cols % 128) return sf_error(SF_E_INVAL, "fp8 quantize: %d columns are not whole blocks of 128", cols);
    const int rows = BLOCKS ? sf_cuda_fp8_padded_rows(n) : n;
    switch (kind) {
    case SF_CUDA_FP8_IN_F32:
        launch_quantize<SF_CUDA_FP8_IN_F32, BLOCKS>(n, rows, cols, x, ldx, norm, eps, q, scale, stream);
        break;
    case SF_CUDA_FP8_IN_BF16:
        launch_quantize<SF_CUDA_FP8_IN_BF16, BLOCKS>(n, rows, cols, x, ldx, norm, eps, q, scale, stream);
        break;
    case SF_CUDA_FP8_IN_RMSNORM:
        launch_quantize<SF_CUDA_FP8_IN_RMSNORM, BLOCKS>(n, rows, cols, x, ldx, norm, eps, q, scale, stream);
        break;
    case SF_CUDA_FP8_IN_SWIGLU:
        launch_quantize<SF_CUDA_FP8_IN_SWIGLU, BLOCKS>(n, rows, cols, x, ldx, norm, eps, q, scale, stream);
        break;
    default: return sf_error(SF_E_INVAL, "fp8 quantize: unknown input kind %d", (int)kind);
    }
    return sf_cuda_launched("fp8 quantize");
}

int sf_cuda_fp8_quantize_rows(sf_cuda_fp8_input kind, int n, int cols, const void *x, int ldx, const float *norm,
                              float eps, unsigned char *q, float *scale, cudaStream_t stream)
{
    return quantize<false>(kind, n, cols, x, ldx, norm, eps, q, scale, stream);
}

int sf_cuda_fp8_quantize_blocks(sf_cuda_fp8_input kind, int n, int cols, const void *x, int ldx, const float *norm,
                                float eps, unsigned char *q, float *scale, cudaStream_t stream)
{
    return quantize<true>(kind, n, cols, x, ldx, norm, eps, q, scale, stream);
}

int sf_cuda_fp8_padded_rows(int n) { return (n + 3) & ~3; }

int sf_cuda_fp8_shape_ok(int out, int in) { return out > 0 && in > 0 && out % 16 == 0 && in % 16 == 0; }

/* y[r, c] = raw[r, c] xs[r] ws[c] + beta y[r, c] (raw [n, out] contiguous float32; xs NULL: no
 * scales, the product's own). */
template <typename Y>
__global__ static void scale_epilogue_kernel(int n, int out, const float *raw, const float *xs, const float *ws,
                                             float beta, Y *y, int ldy)
{
    const size_t total = (size_t)n * out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / out, col = i % out;
        float v = xs ? raw[i] * xs[r] * ws[col] : raw[i];
        Y *dst = y + r * ldy + col;
        if (beta != 0.0f) v += beta * (float)*dst;
        *dst = (Y)v;
    }
}

/* ---- cuBLASLt ---------------------------------------------------------------------------- */

/* The descriptors of one FP8 product: D[out, n] = op(A)^T op(B), A the e4m3 weight [in x out
 * column-major, transposed] and B the e4m3 input [in x n], as matmul.cu's bf16 products read
 * the row-major operands (FP8 on Hopper takes only this TN form). outer: the outer-vector
 * scale mode for A (one scale per output channel) and B (one per row of x). The output is
 * float32 [n, out] contiguous when the epilogue applies the scales, else y itself. */
static cublasStatus_t describe_fp8(sf_cuda_fp8_plan *p)
{
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasStatus_t st = cublasLtMatmulDescInit(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    const int8_t fast = (int8_t)p->fast_accum;
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    if (p->outer || p->block) {
        /* VEC128 scales: [in / 128][rows], the block index outer (bench_cuda_fp8_block_scales
         * checks the layout against a plain kernel) */
        const int32_t mode =
            p->block ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
    }
    if (!st) st = cublasLtMatrixLayoutInit(&p->a, CUDA_R_8F_E4M3, p->in, p->out, p->in);
    if (!st) st = cublasLtMatrixLayoutInit(&p->b, CUDA_R_8F_E4M3, p->in, p->n, p->in);
    if (!st) {
        if (p->outer || p->block)
            st = cublasLtMatrixLayoutInit(&p->c, p->ytype, p->out, p->n, p->ldy);
        else st = cublasLtMatrixLayoutInit(&p->c, CUDA_R_32F, p->out, p->n, p->out);
    }
    return st;
}

static cublasStatus_t set_scales(sf_cuda_fp8_plan *p, const float *wscale, const float *xscale)
{
    if (!p->outer && !p->block) return CUBLAS_STATUS_SUCCESS;
    cublasStatus_t st =
        cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wscale, sizeof wscale);
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xscale, sizeof xscale);
    return st;
}

static int splits_k(const cublasLtMatmulAlgo_t *algo)
{
    int32_t splits = 1;
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    size_t got;
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &got);
    cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof reduction,
                                         &got);
    return splits > 1 || reduction != CUBLASLT_REDUCTION_SCHEME_NONE;
}

/* Up to `max` candidates for p (descriptors set), none splitting K (their sums then follow one
 * order, so which one a timing picks never changes the numbers). */
static int candidates(sf_cuda *c, sf_cuda_fp8_plan *p, cublasLtMatmulHeuristicResult_t *found, int max)
{
    cublasLtMatmulPreferenceOpaque_t pref;
    const uint64_t workspace = c->blas_workspace_bytes;
    const uint32_t align = (uint32_t)p->align;
    cublasStatus_t st = cublasLtMatmulPreferenceInit(&pref);
    if (!st) st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                       sizeof workspace);
    const cublasLtMatmulPreferenceAttributes_t aligned[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && !st; i++) st = cublasLtMatmulPreferenceSetAttribute(&pref, aligned[i], &align, sizeof align);
    int count = 0;
    if (!st)
        st = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->blas, &p->op, &p->a, &p->b, &p->c, &p->c, &pref, max,
                                            found, &count);
    if (st) return 0;
    int kept = 0;
    for (int i = 0; i < count; i++)
        if (found[i].state == CUBLAS_STATUS_SUCCESS && found[i].workspaceSize <= c->blas_workspace_bytes &&
            !splits_k(&found[i].algo))
            found[kept++] = found[i];
    return kept;
}

int sf_cuda_fp8_block_offered(sf_cuda *c, int out, int in)
{
    if (!c->fp8_block || !sf_cuda_fp8_shape_ok(out, in) || in % 128) return 0;
    /* a model-like row count, both output types (float32 accumulating, bf16 parts) */
    const cudaDataType ytypes[2] = {CUDA_R_32F, CUDA_R_16BF};
    const float *any = (const float *)c->blas_workspace;
    cublasLtMatmulHeuristicResult_t found[FP8_CANDIDATES];
    for (int k = 0; k < 2; k++) {
        sf_cuda_fp8_plan p;
        memset(&p, 0, sizeof p);
        p.n = 256, p.in = in, p.out = out, p.ldy = out, p.align = 256, p.block = 1, p.ytype = ytypes[k];
        p.fast_accum = c->settings.fp8_accum;
        if (describe_fp8(&p) != CUBLAS_STATUS_SUCCESS || set_scales(&p, any, any) != CUBLAS_STATUS_SUCCESS ||
            candidates(c, &p, found, FP8_CANDIDATES) == 0)
            return 0;
    }
    return 1;
}

int sf_cuda_fp8_init(sf_cuda *c)
{
    if (c->info.major * 10 + c->info.minor < 89)
        return sf_error(SF_E_UNSUPPORTED,
                        "precision fp8: GPU %d has compute capability %d.%d; FP8 products need 8.9 or later (use "
                        "--precision bf16)",
                        c->device, c->info.major, c->info.minor);
    /* a model-like shape with either output type (each shape is asked again at its first use);
     * the scale pointers only need to be device addresses here */
    sf_cuda_fp8_plan p;
    cublasLtMatmulHeuristicResult_t found[FP8_CANDIDATES];
    const float *any = (const float *)c->blas_workspace;
    const cudaDataType ytypes[2] = {CUDA_R_32F, CUDA_R_16BF};
    for (int k = (c->settings.fp8_scale == SF_CUDA_FP8_SCALE_AUTO ? 0 : 2); k < 4; k++) {
        const int outer = k < 2;
        memset(&p, 0, sizeof p);
        p.n = 256, p.in = 256, p.out = 256, p.ldy = 256, p.align = 256, p.outer = outer, p.ytype = ytypes[k % 2];
        p.fast_accum = c->settings.fp8_accum;
        if (describe_fp8(&p) != CUBLAS_STATUS_SUCCESS || set_scales(&p, any, any) != CUBLAS_STATUS_SUCCESS) continue;
        if (candidates(c, &p, found, FP8_CANDIDATES) > 0) {
            c->fp8_outer = outer;
            if (!outer && c->settings.fp8_scale == SF_CUDA_FP8_SCALE_AUTO)
                fprintf(stderr, "seqflow: cuda fp8: this cuBLASLt offers no outer-vector (per-channel) FP8 scales on "
                                "GPU %d; the scales are applied by an epilogue kernel instead\n",
                        c->device);
            /* block scales only beside cuBLASLt's own outer-vector ones (the epilogue kernel
             * applies a scale per row and channel only) */
            c->fp8_block = outer && c->settings.fp8_blocks; /* what sf_cuda_fp8_block_offered asks first */
            c->fp8_block = c->fp8_block && sf_cuda_fp8_block_offered(c, 256, 256);
            return SF_OK;
        }
    }
    return sf_error(SF_E_UNSUPPORTED,
                    "precision fp8: cuBLASLt offers no FP8 e4m3 product on GPU %d (compute capability %d.%d); use "
                    "--precision bf16",
                    c->device, c->info.major, c->info.minor);
}

static int operand_alignment(const sf_cuda_fp8_args *g)
{
    uintptr_t bits = (uintptr_t)g->x | (uintptr_t)g->w | (uintptr_t)g->y | 256;
    return (int)(bits & (~bits + 1));
}

static size_t y_bytes_of(const sf_cuda_fp8_plan *p)
{
    return p->outer || p->block ? ((size_t)(p->n - 1) * p->ldy + p->out) * (p->ytype == CUDA_R_32F ? 4 : 2)
                                : (size_t)p->n * p->out * sizeof(float);
}

static cublasStatus_t run_fp8(sf_cuda *c, sf_cuda_fp8_plan *p, const cublasLtMatmulAlgo_t *algo,
                              const sf_cuda_fp8_args *g, void *d, float beta)
{
    const float alpha = 1.0f;
    cublasStatus_t st = set_scales(p, g->wscale, g->xscale);
    if (!st)
        st = cublasLtMatmul((cublasLtHandle_t)c->blas, &p->op, &alpha, g->w, &p->a, g->x, &p->b, &beta, d, &p->c, d,
                            &p->c, algo, c->blas_workspace, c->blas_workspace_bytes, c->stream);
    return st;
}

/* Where a candidate may be timed without touching y (an accumulating product must add to it
 * exactly once): the end of the scratch when that overlaps neither input; NULL: none. */
static void *timing_target(const sf_cuda *c, const sf_cuda_fp8_args *g, size_t bytes)
{
    if (bytes > c->scratch_bytes) return NULL;
    const uintptr_t lo = (uintptr_t)c->scratch + ((c->scratch_bytes - bytes) & ~(uintptr_t)255), hi = lo + bytes;
    const uintptr_t x = (uintptr_t)g->x, x_end = x + (size_t)g->n * g->in;
    const size_t x_scales = g->block ? (size_t)g->n * (g->in / 128) : (size_t)g->n;
    const uintptr_t xs = (uintptr_t)g->xscale, xs_end = xs + x_scales * sizeof(float);
    if ((x < hi && lo < x_end) || (xs < hi && lo < xs_end)) return NULL;
    return (void *)lo;
}

/* The fastest candidate of the shape by timing (mean of FP8_TIMED_RUNS after one untimed),
 * into p->algo; the first candidate when there is nowhere to time. SF_E_UNSUPPORTED: none
 * offered, or none of those offered ran. */
static int choose_algo(sf_cuda *c, sf_cuda_fp8_plan *p, const sf_cuda_fp8_args *g, void *d)
{
    cublasLtMatmulHeuristicResult_t found[FP8_CANDIDATES];
    if (set_scales(p, g->wscale, g->xscale) != CUBLAS_STATUS_SUCCESS) return SF_E_UNSUPPORTED;
    const int count = candidates(c, p, found, FP8_CANDIDATES);
    if (count == 0) return SF_E_UNSUPPORTED;
    p->algo = found[0].algo;
    void *target = (p->outer || p->block) && g->beta != 0.0f ? timing_target(c, g, y_bytes_of(p)) : d;
    if (!target) return SF_OK;
    cudaEvent_t start = NULL, stop = NULL;
    int rc = sf_cuda_status(cudaEventCreate(&start), "cudaEventCreate");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreate(&stop), "cudaEventCreate");
    float best = -1;
    for (int i = 0; i < count && rc == SF_OK; i++) {
        int ok = 1;
        for (int k = 0; k <= FP8_TIMED_RUNS && ok; k++) {
            if (k == 1) ok = cudaEventRecord(start, c->stream) == cudaSuccess;
            if (ok) ok = run_fp8(c, p, &found[i].algo, g, target, 0.0f) == CUBLAS_STATUS_SUCCESS;
        }
        float ms = -1;
        if (ok && cudaEventRecord(stop, c->stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess &&
            cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms > 0 && (best < 0 || ms < best))
            best = ms, p->algo = found[i].algo;
        cudaGetLastError();
    }
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    /* offered but none ran (cuBLASLt refusing at the call what its heuristic offered): the
     * caller tries the unit scales */
    return rc == SF_OK && best < 0 ? SF_E_UNSUPPORTED : rc;
}

static int same_shape(const sf_cuda_fp8_plan *p, const sf_cuda_fp8_args *g, int align, int outer)
{
    return p->n == g->n && p->in == g->in && p->out == g->out && p->ldy == g->ldy && p->ytype == g->ytype &&
           p->accumulate == (g->beta != 0.0f) && p->align == align && p->outer == outer && p->block == g->block;
}

/* The plan for g's shape, made now at its first use (block scales for a block weight, else
 * outer-vector scales where the backend uses them and this shape is offered them, else unit
 * scales); *plan NULL with SF_OK means the table is full and `tmp` holds a plan made for this
 * call only. */
static int find_plan(sf_cuda *c, const sf_cuda_fp8_args *g, sf_cuda_fp8_plan *tmp, sf_cuda_fp8_plan **plan)
{
    const int align = operand_alignment(g);
    for (int i = 0; i < c->n_fp8_plans; i++)
        if (same_shape(&c->fp8_plans[i], g, align, c->fp8_plans[i].outer)) return *plan = &c->fp8_plans[i], SF_OK;
    sf_cuda_fp8_plan *p = c->n_fp8_plans < SF_CUDA_GEMM_PLANS ? &c->fp8_plans[c->n_fp8_plans] : tmp;
    int rc = SF_E_UNSUPPORTED;
    /* a block weight has no other form: its one try is the block modes */
    for (int outer = g->block ? 0 : c->fp8_outer; outer >= 0 && rc == SF_E_UNSUPPORTED; outer--) {
        memset(p, 0, sizeof *p);
        p->n = g->n, p->in = g->in, p->out = g->out, p->ldy = g->ldy, p->ytype = g->ytype, p->block = g->block;
        p->accumulate = g->beta != 0.0f, p->align = align, p->outer = outer, p->fast_accum = c->settings.fp8_accum;
        if (describe_fp8(p) != CUBLAS_STATUS_SUCCESS) continue;
        void *d = g->y;
        if (!outer && !g->block) {
            rc = sf_cuda_widened(c, (size_t)g->n * g->out * sizeof(float));
            if (rc != SF_OK) return rc;
            d = c->widened, rc = SF_E_UNSUPPORTED;
        }
        rc = choose_algo(c, p, g, d);
    }
    if (rc == SF_E_UNSUPPORTED)
        return sf_error(SF_E_BACKEND, "cuBLASLt: no FP8 algorithm for the product [%d, %d] x [%d, %d]^T", g->n, g->in,
                        g->out, g->in);
    if (rc != SF_OK) return rc;
    if (p != tmp) c->n_fp8_plans++;
    *plan = p;
    return SF_OK;
}

/* An output inside c->widened would be overwritten by its own product there. */
static int outside_widened(const sf_cuda *c, const sf_cuda_fp8_args *g)
{
    const uintptr_t y = (uintptr_t)g->y, w0 = (uintptr_t)c->widened;
    if (c->widened && y >= w0 && y < w0 + c->widened_bytes)
        return sf_error(SF_E_INVAL, "fp8 product: the output lies in the epilogue's own buffer");
    return SF_OK;
}

int sf_cuda_gemm_fp8(sf_cuda *c, const sf_cuda_fp8_args *g, const char *what)
{
    if (g->n <= 0 || g->out <= 0) return SF_OK;
    if (g->ytype != CUDA_R_32F && g->ytype != CUDA_R_16BF)
        return sf_error(SF_E_INVAL, "fp8 product: output type %d is neither float32 nor bf16", (int)g->ytype);
    int rc = sf_cuda_join_at_product(c);
    if (rc != SF_OK) return rc;
    /* cuBLASLt takes block scales only for a row count that is a multiple of 4 (the H100's
     * cuBLASLt 13.1 offers no algorithm otherwise: a row of the scales must start 16-byte
     * aligned); x holds that many (sf_cuda_fp8_quantize_blocks pads), so the padded product goes
     * into float32 and the epilogue below takes its real rows into y */
    const int pad = g->block && sf_cuda_fp8_padded_rows(g->n) != g->n;
    sf_cuda_fp8_args padded = *g;
    if (pad) {
        padded.n = sf_cuda_fp8_padded_rows(g->n), padded.ldy = g->out, padded.ytype = CUDA_R_32F, padded.beta = 0.0f;
        rc = outside_widened(c, g);
        if (rc == SF_OK) rc = sf_cuda_widened(c, (size_t)padded.n * g->out * sizeof(float));
        padded.y = c->widened;
    }
    sf_cuda_fp8_plan tmp, *p = NULL;
    if (rc == SF_OK) rc = find_plan(c, pad ? &padded : g, &tmp, &p);
    if (rc != SF_OK) return rc;
    if (pad) {
        rc = sf_cublas_status(run_fp8(c, p, &p->algo, &padded, c->widened, 0.0f), what);
    } else if (p->outer || p->block) {
        return sf_cublas_status(run_fp8(c, p, &p->algo, g, g->y, g->beta), what);
    } else {
        /* unit scales into float32 (c->widened), then the scales (and the accumulation) in the
         * epilogue */
        rc = outside_widened(c, g);
        if (rc == SF_OK) rc = sf_cuda_widened(c, (size_t)g->n * g->out * sizeof(float));
        if (rc == SF_OK) rc = sf_cublas_status(run_fp8(c, p, &p->algo, g, c->widened, 0.0f), what);
    }
    if (rc != SF_OK) return rc;
    const float *xs = pad ? NULL : g->xscale;
    const size_t total = (size_t)g->n * g->out;
    const unsigned blocks = (unsigned)(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
    if (g->ytype == CUDA_R_32F)
        scale_epilogue_kernel<float><<<blocks, 256, 0, c->stream>>>(g->n, g->out, (const float *)c->widened, xs,
                                                                    g->wscale, g->beta, (float *)g->y, g->ldy);
    else
        scale_epilogue_kernel<__nv_bfloat16><<<blocks, 256, 0, c->stream>>>(
            g->n, g->out, (const float *)c->widened, xs, g->wscale, g->beta, (__nv_bfloat16 *)g->y, g->ldy);
    return sf_cuda_launched("fp8 scale epilogue");
}
