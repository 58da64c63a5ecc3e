/* y = x W^T (+ y) on cuBLAS. Row-major y[n, out] = x[n, in] W[out, in]^T is, read column-major,
 * y^T (out x n) = W^T (out x in, W stored as in x out) times x^T (in x n): one GEMM with
 * op(A) = T, op(B) = N and no copies.
 * Precision f32: cublasSgemm in DEFAULT math (no TF32). Precision bf16: weights get a bf16
 * copy once (prepare_weight_group), x is rounded into the reserved scratch, and cuBLAS (cublasLt's
 * algorithm timed fastest for the shape, or cublasGemmEx: gemm_plan.cu) multiplies bf16 operands
 * with float32 accumulation into the float32 y. A weight that was
 * never prepared is multiplied in f32, which is slower but exact. qkv and ffn (below) fuse the
 * norms and SwiGLU with the products so their intermediates stay bf16. */
#include "kernels/cuda/cuda_backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const sf_cuda_weight *find_weight(const sf_cuda *c, const float *w)
{
    for (int i = 0; i < c->n_weights; i++)
        if (c->weights[i].f32 == w) return &c->weights[i];
    return NULL;
}

/* One bf16 GEMM y[n, out] = x[n, in] w^T (+ beta y) with x, w already bf16 (contiguous) and y
 * of type `ytype` (bf16 or float32), rows ldy elements apart. */
static int gemm_bf16(sf_cuda *c, int n, int in, int out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, void *y,
                     int ldy, cudaDataType ytype, float beta, const char *what)
{
    const sf_cuda_gemm_args g = {n, in, out, ldy, 1, 0, 0, x, w, y, ytype, beta};
    return sf_cuda_gemm(c, &g, what);
}

/* w's bf16 copy when this backend multiplies in bf16 and w was prepared with this shape (a
 * weight of another shape must not use it); NULL means the product runs in float32. */
static const sf_cuda_weight *bf16_weight(const sf_cuda *c, const float *w, int out, int in)
{
    if (c->precision != SF_PRECISION_BF16) return NULL;
    const sf_cuda_weight *wb = find_weight(c, w);
    return wb && wb->bf16 && wb->out == out && wb->in == in ? wb : NULL;
}

/* w's e4m3 copy and scales in precision fp8, when w was prepared with this shape; NULL
 * otherwise (the product then runs as bf16_weight says). */
static const sf_cuda_weight *fp8_weight(const sf_cuda *c, const float *w, int out, int in)
{
    if (!c->fp8) return NULL;
    const sf_cuda_weight *wb = find_weight(c, w);
    return wb && wb->fp8 && wb->out == out && wb->in == in ? wb : NULL;
}

/* x quantized (gemm_fp8.cu) for a product with `wb` into the scratch: the e4m3 rows, then
 * their scales, one a row or (a block weight) one a 128 values of a row. */
static int fp8_input(sf_cuda *c, const sf_cuda_weight *wb, sf_cuda_fp8_input kind, int n, int cols, const void *x,
                     int ldx, const float *norm, float eps, unsigned char **q, float **scale)
{
    const size_t rows = wb->block ? (size_t)sf_cuda_fp8_padded_rows(n) : (size_t)n;
    const size_t q_bytes = (rows * cols + 255) & ~(size_t)255;
    const size_t scales = wb->block ? rows * (cols / 128) : rows;
    int rc = sf_cuda_join_at_product(c); /* before the quantization reads x */
    if (rc == SF_OK) rc = sf_cuda_scratch(c, q_bytes + scales * sizeof(float));
    *q = (unsigned char *)c->scratch, *scale = (float *)((unsigned char *)c->scratch + q_bytes);
    if (rc == SF_OK && wb->block)
        rc = sf_cuda_fp8_quantize_blocks(kind, n, cols, x, ldx, norm, eps, *q, *scale, c->stream);
    else if (rc == SF_OK)
        rc = sf_cuda_fp8_quantize_rows(kind, n, cols, x, ldx, norm, eps, *q, *scale, c->stream);
    return rc;
}

/* y = (q wb^T) scaled (+ beta y) for a quantized input (fp8_input for wb) and an FP8 weight. */
static int fp8_product(sf_cuda *c, int n, int in, int out, const unsigned char *q, const float *scale,
                       const sf_cuda_weight *wb, void *y, int ldy, cudaDataType ytype, float beta, const char *what)
{
    const sf_cuda_fp8_args g = {n, in, out, ldy, q, wb->fp8, scale, wb->scale, y, ytype, beta, wb->block};
    return sf_cuda_gemm_fp8(c, &g, what);
}

/* The distance from y[0] to y[1] in elements of `size` bytes when the count outputs are equally
 * spaced, in order, and far enough apart not to overlap ([n, out] rows ldy apart each); 0
 * otherwise. Plain integers: the outputs may be separate allocations, which pointer subtraction
 * must not see. */
static long long equal_output_stride(int n, int out, int count, void *const *y, int ldy, size_t size)
{
    const intptr_t step = (intptr_t)y[1] - (intptr_t)y[0];
    if (step <= 0 || step % (intptr_t)size) return 0;
    for (int i = 2; i < count; i++)
        if ((intptr_t)y[i] - (intptr_t)y[i - 1] != step) return 0;
    const long long elements = (long long)(step / (intptr_t)size);
    return elements >= (long long)(n - 1) * ldy + out ? elements : 0;
}

/* y[i] = xb w[i]^T (ytype: float32 or bf16, beta 0) for count bf16 weights of one shape sharing the bf16 input
 * xb. Weights prepared as one group (consecutive in one allocation) with equally spaced outputs
 * (stages/block.c: q, k, v in one buffer) go out as ONE strided-batched GEMM: for Q/K/V at
 * n=8192, 1024x1024 on the H100 that is 9% faster than three cublasGemmEx calls, and 21-26%
 * with the Lt algorithm the plan picks (bench/lab/GEMM_NOTES.md). Otherwise one GEMM per weight. */
static int shared_input_gemms_bf16(sf_cuda *c, int n, int in, int out, const __nv_bfloat16 *xb, int count,
                                   const sf_cuda_weight *const *wb, void *const *y, int ldy, cudaDataType ytype,
                                   const char *what)
{
    const size_t each = (size_t)out * in, ysize = ytype == CUDA_R_16BF ? 2 : sizeof(float);
    int grouped = count > 1;
    for (int i = 1; i < count && grouped; i++) grouped = wb[i]->bf16 == wb[0]->bf16 + (size_t)i * each;
    const long long stride = grouped ? equal_output_stride(n, out, count, y, ldy, ysize) : 0;
    if (stride) {
        const sf_cuda_gemm_args g = {n, in, out, ldy, count, (long long)each, stride, xb, wb[0]->bf16, y[0], ytype, 0.0f};
        return sf_cuda_gemm(c, &g, what);
    }
    int rc = SF_OK;
    for (int i = 0; i < count && rc == SF_OK; i++)
        rc = gemm_bf16(c, n, in, out, xb, wb[i]->bf16, y[i], ldy, ytype, 0.0f, what);
    return rc;
}

/* Rounds x once into the scratch, then the products of shared_input_gemms_bf16 (all prepared). */
#define SHARED_MAX 8 /* products matmul_shared takes in one pass (Q/K/V: 3, W1/W3: 2) */

static int shared_input_gemms(sf_cuda *c, int n, int in, int out, const float *x, int ldx, int count,
                              const sf_cuda_weight *const *wb, float *const *y, int ldy, const char *what)
{
    int rc = sf_cuda_join_at_product(c); /* before the rounding reads x */
    if (rc == SF_OK) rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
    __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
    if (rc == SF_OK) rc = shared_input_gemms_bf16(c, n, in, out, xb, count, wb, (void *const *)y, ldy, CUDA_R_32F, what);
    return rc;
}

static int grow_weight_table(sf_cuda *c, int more)
{
    if (c->n_weights + more <= c->cap_weights) return SF_OK;
    int cap = c->cap_weights ? 2 * c->cap_weights : 32;
    while (cap < c->n_weights + more) cap *= 2;
    sf_cuda_weight *grown = (sf_cuda_weight *)realloc(c->weights, (size_t)cap * sizeof *grown);
    if (!grown) return sf_error(SF_E_NOMEM, "out of memory");
    c->weights = grown, c->cap_weights = cap;
    return SF_OK;
}

/* Copies of count weights of one shape in one allocation, in order: bf16, or in precision fp8
 * (shapes cuBLASLt takes in FP8) e4m3 with a scale per output channel after all the copies. A
 * product with all of them is then one GEMM over the concatenation (ffn's W1|W3, bf16). A
 * weight prepared alone with inputs a multiple of 128 gets a scale for each 128 inputs of a
 * channel where cuBLASLt takes them (gemm_fp8.cu; groups feed the gate/up kernel, which applies
 * a channel's scale after the whole sum). Entry 0 owns the memory. */
static int prepare_group(sf_cuda *c, int count, const float *const *w, int out, int in)
{
    const int fp8 = c->fp8 && sf_cuda_fp8_shape_ok(out, in);
    const int block = fp8 && count == 1 && sf_cuda_fp8_block_offered(c, out, in);
    const sf_cuda_weight *first = find_weight(c, w[0]);
    int fresh = 0;
    for (int i = 0; i < count; i++) {
        const sf_cuda_weight *known = find_weight(c, w[i]);
        /* already prepared together, in this order, of this shape? then there is nothing to do */
        fresh |= !known || known->out != out || known->in != in || !first || known->mem != first->mem ||
                 known->index != i;
    }
    if (!fresh) return SF_OK;
    for (int i = 0; i < count; i++) sf_cuda_drop_weight(c, w[i]);
    int rc = grow_weight_table(c, count);
    if (rc != SF_OK) return rc;
    const size_t each = (size_t)out * in;
    const size_t copies = fp8 ? (count * each + 255) & ~(size_t)255 : count * each * sizeof(__nv_bfloat16);
    const size_t scales_each = block ? (size_t)out * (in / 128) : (size_t)out;
    const size_t bytes = copies + (fp8 ? count * scales_each * sizeof(float) : 0);
    void *copy = NULL;
    rc = sf_cuda_malloc_counted(c, &copy, bytes);
    unsigned char *q = (unsigned char *)copy;
    float *scales = (float *)(q + copies);
    for (int i = 0; i < count && rc == SF_OK; i++)
        rc = block ? sf_cuda_fp8_quantize_blocks(SF_CUDA_FP8_IN_F32, out, in, w[i], in, NULL, 0.0f, q + i * each,
                                                 scales + i * scales_each, c->stream)
             : fp8 ? sf_cuda_fp8_quantize_rows(SF_CUDA_FP8_IN_F32, out, in, w[i], in, NULL, 0.0f, q + i * each,
                                               scales + i * scales_each, c->stream)
                   : sf_cuda_f32_to_bf16(w[i], out, in, in, (__nv_bfloat16 *)copy + i * each, c->stream);
    if (rc != SF_OK) {
        sf_cuda_free_counted(c, copy, bytes);
        return rc;
    }
    for (int i = 0; i < count; i++) {
        sf_cuda_weight *slot = &c->weights[c->n_weights++];
        memset(slot, 0, sizeof *slot);
        slot->f32 = w[i], slot->count = each, slot->out = out, slot->in = in;
        if (fp8)
            slot->fp8 = q + i * each, slot->scale = scales + i * scales_each, slot->block = block;
        else slot->bf16 = (__nv_bfloat16 *)copy + i * each;
        slot->mem = copy, slot->index = i;
        slot->owned = i == 0 ? bytes : 0;
    }
    return SF_OK;
}

int sf_cuda_prepare_weight_group(sf_backend *be, int count, const float *const *w, int out, int in)
{
    sf_cuda *c = sf_cuda_of(be);
    if (c->precision != SF_PRECISION_BF16 || count <= 0 || out <= 0 || in <= 0) return SF_OK;
    for (int i = 0; i < count; i++)
        if (!w[i]) return sf_error(SF_E_INVAL, "prepare_weight_group: weight %d is NULL", i);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = prepare_group(c, count, w, out, in);
    sf_cuda_leave(c);
    return rc;
}

/* Drops w's entry; the owner of a group's memory takes the whole group with it. */
void sf_cuda_drop_weight(sf_cuda *c, const void *w)
{
    for (int i = 0; i < c->n_weights; i++) {
        if ((const void *)c->weights[i].f32 != w) continue;
        sf_cuda_weight gone = c->weights[i];
        c->weights[i] = c->weights[--c->n_weights];
        if (!gone.owned) return;
        for (int j = 0; j < c->n_weights;)
            if (c->weights[j].mem == gone.mem) c->weights[j] = c->weights[--c->n_weights];
            else j++;
        sf_cuda_free_counted(c, gone.mem, gone.owned);
        return;
    }
}

/* sf_cuda_matmul's work, under the lock; y of type yt (bf16 only where w was prepared, and
 * without accumulate) */
static int matmul_locked(sf_cuda *c, int n, int in, int out, const float *x, int ldx, const float *w, void *y, int ldy,
                         int accumulate, cudaDataType yt)
{
    int rc = sf_cuda_join_at_product(c); /* before x is read, by the conversion or the product */
    if (rc != SF_OK) return rc;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const sf_cuda_weight *w8 = fp8_weight(c, w, out, in);
    if (w8) {
        unsigned char *q;
        float *scale;
        rc = fp8_input(c, w8, SF_CUDA_FP8_IN_F32, n, in, x, ldx, NULL, 0.0f, &q, &scale);
        if (rc == SF_OK) rc = fp8_product(c, n, in, out, q, scale, w8, y, ldy, yt, beta, "fp8 GEMM");
        return rc;
    }
    const sf_cuda_weight *wb = bf16_weight(c, w, out, in);
    if (!wb && yt != CUDA_R_32F)
        return sf_error(SF_E_UNSUPPORTED, "cuda matmul: a bf16 result needs a weight prepared in bf16 or fp8");
    if (wb) {
        /* without reserve() the scratch grows here: one allocation, never per segment again */
        rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
        __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
        if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
        if (rc == SF_OK) rc = gemm_bf16(c, n, in, out, xb, wb->bf16, y, ldy, yt, beta, "bf16 GEMM");
    } else {
        rc = sf_cublas_status(
            cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in, x, ldx, &beta, (float *)y, ldy),
            "SGEMM");
    }
    return rc;
}

int sf_cuda_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y,
                   int ldy, int accumulate)
{
    if (n <= 0 || out <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = matmul_locked(c, n, in, out, x, ldx, w, y, ldy, accumulate, CUDA_R_32F);
    sf_cuda_leave(c);
    return rc;
}

/* matmul_typed (kernels/backend_ext.h): a bf16 x (the mixed attention output of an H100 layer) goes
 * to the GEMM as it is, with no conversion pass, when w was prepared and the rows are
 * contiguous; otherwise x is widened to float32 and multiplied as sf_cuda_matmul does. A bf16 y
 * (a head-parallel rank's part, summed across the ranks in bf16) is the float32 accumulator
 * rounded once, by the product's epilogue. */
int sf_cuda_matmul_typed(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx, const float *w,
                         sf_dtype ytype, void *y, int ldy, int accumulate)
{
    if (xtype != SF_DTYPE_F32 && xtype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda matmul: unknown input type %d", (int)xtype);
    if (ytype != SF_DTYPE_F32 && ytype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda matmul: unknown output type %d", (int)ytype);
    if (ytype == SF_DTYPE_BF16 && accumulate)
        return sf_error(SF_E_INVAL, "cuda matmul: a bf16 result is written, not accumulated");
    if (xtype == SF_DTYPE_F32 && ytype == SF_DTYPE_F32)
        return sf_cuda_matmul(be, n, in, out, (const float *)x, ldx, w, (float *)y, ldy, accumulate);
    if (n <= 0 || out <= 0) return SF_OK;
    const cudaDataType yt = ytype == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    if (xtype == SF_DTYPE_F32) {
        rc = matmul_locked(c, n, in, out, (const float *)x, ldx, w, y, ldy, accumulate, yt);
        sf_cuda_leave(c);
        return rc;
    }
    const float beta = accumulate ? 1.0f : 0.0f;
    const sf_cuda_weight *w8 = fp8_weight(c, w, out, in);
    if (w8) {
        unsigned char *q;
        float *scale;
        rc = fp8_input(c, w8, SF_CUDA_FP8_IN_BF16, n, in, x, ldx, NULL, 0.0f, &q, &scale);
        if (rc == SF_OK) rc = fp8_product(c, n, in, out, q, scale, w8, y, ldy, yt, beta, "fp8 GEMM (bf16 input)");
        sf_cuda_leave(c);
        return rc;
    }
    const sf_cuda_weight *wb = bf16_weight(c, w, out, in);
    if (wb && ldx == in) {
        rc = gemm_bf16(c, n, in, out, (const __nv_bfloat16 *)x, wb->bf16, y, ldy, yt, beta, "bf16 GEMM (bf16 input)");
        sf_cuda_leave(c);
        return rc;
    }
    /* under one hold of the lock: another thread's op must not reuse c->widened in between */
    const size_t count = (size_t)(n - 1) * ldx + in;
    rc = sf_cuda_join_at_product(c); /* before the widening reads x */
    if (rc == SF_OK) rc = sf_cuda_widened(c, count * sizeof(float));
    float *wide = (float *)c->widened;
    if (rc == SF_OK) rc = sf_cuda_bf16_to_f32((const __nv_bfloat16 *)x, count, wide, c->stream);
    if (rc == SF_OK) rc = matmul_locked(c, n, in, out, wide, ldx, w, y, ldy, accumulate, yt);
    sf_cuda_leave(c);
    return rc;
}

/* y[i] = x w[i]^T for count weights sharing x (qkv's and ffn's float32 input paths): in bf16, x
 * is rounded into the scratch once for all the products (3 conversions become 1); each product
 * is then the GEMM of sf_cuda_matmul. In f32, or for a weight never prepared, it is exactly
 * sf_cuda_matmul per weight. */
static int matmul_shared(sf_backend *be, int n, int in, int out, const float *x, int ldx, int count,
                         const float *const *w, float *const *y, int ldy)
{
    if (n <= 0 || out <= 0 || count <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c); /* the weight table is read under the lock, like every op's state */
    if (rc != SF_OK) return rc;
    const sf_cuda_weight *wb[SHARED_MAX];
    int all_fp8 = count <= SHARED_MAX;
    /* one quantized input serves all: the weights' scales must be of one kind */
    for (int i = 0; i < count && all_fp8; i++)
        all_fp8 = (wb[i] = fp8_weight(c, w[i], out, in)) != NULL && wb[i]->block == wb[0]->block;
    if (all_fp8) {
        unsigned char *q;
        float *scale;
        rc = fp8_input(c, wb[0], SF_CUDA_FP8_IN_F32, n, in, x, ldx, NULL, 0.0f, &q, &scale);
        for (int i = 0; i < count && rc == SF_OK; i++)
            rc = fp8_product(c, n, in, out, q, scale, wb[i], y[i], ldy, CUDA_R_32F, 0.0f, "fp8 GEMM (shared input)");
        sf_cuda_leave(c);
        return rc;
    }
    int all_bf16 = count <= SHARED_MAX;
    for (int i = 0; i < count && all_bf16; i++) all_bf16 = (wb[i] = bf16_weight(c, w[i], out, in)) != NULL;
    if (!all_bf16) {
        sf_cuda_leave(c);
        for (int i = 0; i < count && rc == SF_OK; i++) rc = sf_cuda_matmul(be, n, in, out, x, ldx, w[i], y[i], ldy, 0);
        return rc;
    }
    rc = shared_input_gemms(c, n, in, out, x, ldx, count, wb, y, ldy, "bf16 GEMM (shared input)");
    sf_cuda_leave(c);
    return rc;
}

/* Whether ffn takes the W1|W3 SwiGLU kernel in bf16 (the default on an H100; setting gate_up=0
 * takes the composed path). ffn and ffn_h1_floats both ask, so they agree on which path runs. */
static int gate_up_wanted(const sf_cuda *c, int dim, int hidden)
{
    return c->precision == SF_PRECISION_BF16 && !c->fp8 && c->settings.gate_up &&
           sf_cuda_swiglu_gate_up_usable(dim, hidden);
}

/* Whether ffn's bf16 products from ub take the W1|W3 SwiGLU kernel: wanted (above), and the
 * weights, g3 and ub (NULL: the backend's scratch, always aligned) 16-byte aligned for its maps. */
static int gate_up_takes(const sf_cuda *c, int dim, int hidden, const sf_cuda_weight *b1, const sf_cuda_weight *b3,
                         const void *g3, const void *ub)
{
    return b1 && b3 && gate_up_wanted(c, dim, hidden) &&
           (((uintptr_t)b1->bf16 | (uintptr_t)b3->bf16 | (uintptr_t)g3 | (uintptr_t)ub) & 15) == 0;
}

size_t sf_cuda_ffn_h1_floats(sf_backend *be, int n, int dim, int hidden)
{
    if (n <= 0 || hidden <= 0) return 0;
    return gate_up_wanted(sf_cuda_of(be), dim, hidden) ? 0 : (size_t)n * hidden;
}

/* ffn (kernels/backend_ext.h). In bf16 with prepared weights the intermediates never exist in
 * float32: the norm writes bf16 straight into the scratch, W1 and W3 write bf16 side by side
 * into the caller's h1, SwiGLU writes bf16 into h3, and W2 accumulates into x in float32
 * (beta = 1, the residual); on an H100 W1, W3 and SwiGLU are one kernel writing h3 (below).
 * Against the float32 composition this saves the [n, hidden] float32 writes and reads of W1/W3,
 * SwiGLU and W2's input conversion: about 10 n*hidden bytes of the 24 n*hidden it moved. The
 * only new rounding is of W1 u and W3 u to bf16 before SwiGLU. Otherwise (f32, unprepared
 * weights) it is the composed sequence. */
static int ffn_bf16(sf_cuda *c, int n, int dim, int hidden, const __nv_bfloat16 *ub, const sf_cuda_weight *b1,
                    const sf_cuda_weight *b3, const sf_cuda_weight *b2, int gate_up, __nv_bfloat16 *g1,
                    __nv_bfloat16 *g3, void *y, cudaDataType yt, float beta);

/* beta 1: x += the MLP (ffn; y is x, yt float32); beta 0: y = the MLP of x's rows as yt
 * (ffn_partial: y may be x, read by the norm first) */
static int ffn_beta(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                    const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3, void *y,
                    cudaDataType yt, float beta)
{
    if (n <= 0 || dim <= 0 || hidden <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    __nv_bfloat16 *g1 = (__nv_bfloat16 *)h1, *g3 = (__nv_bfloat16 *)h3;
    const sf_cuda_weight *e1 = fp8_weight(c, w1, hidden, dim), *e3 = fp8_weight(c, w3, hidden, dim);
    const sf_cuda_weight *e2 = fp8_weight(c, w2, dim, hidden);
    if (e1 && e3 && e2 && h1 && e1->block == e3->block) {
        /* precision fp8: the norm quantizes u, W1 u | W3 u go to h1 as bf16 [n, 2 hidden],
         * SwiGLU quantizes g for W2, which accumulates into x */
        unsigned char *q;
        float *scale;
        rc = fp8_input(c, e1, SF_CUDA_FP8_IN_RMSNORM, n, dim, x, dim, norm, eps, &q, &scale);
        /* the gate/up kernel (setting gate_up, W1 and W3 with channel scales): g = SwiGLU
         * straight from the e4m3 products into h1, for a block W2 in e4m3 with its scales
         * ([n, hidden] bytes, then [hidden / 128][n] floats: h1 holds n hidden floats; n a
         * multiple of 4, which W2 then needs no padding for), else as bf16 [n, hidden]
         * quantized for W2 as any bf16 input */
        const int fused = c->settings.gate_up && !e1->block && sf_cuda_swiglu_gate_up_e4m3_usable(dim, hidden) &&
                          (((uintptr_t)e1->fp8 | (uintptr_t)e3->fp8 | (uintptr_t)g1) & 15) == 0;
        if (rc == SF_OK && fused && e2->block && sf_cuda_fp8_padded_rows(n) == n) {
            unsigned char *g8 = (unsigned char *)h1;
            float *gs = (float *)(g8 + (((size_t)n * hidden + 255) & ~(size_t)255));
            rc = sf_cuda_swiglu_gate_up_e4m3_blocks(n, dim, hidden, q, scale, e1->fp8, e3->fp8, e1->scale, e3->scale,
                                                    g8, gs, c->stream);
            if (rc == SF_OK) rc = fp8_product(c, n, hidden, dim, g8, gs, e2, y, dim, yt, beta, "fp8 GEMM (ffn W2)");
            sf_cuda_leave(c);
            return rc;
        }
        if (rc == SF_OK && fused) {
            rc = sf_cuda_swiglu_gate_up_e4m3(n, dim, hidden, q, scale, e1->fp8, e3->fp8, e1->scale, e3->scale, g1,
                                             c->stream);
            if (rc == SF_OK) rc = fp8_input(c, e2, SF_CUDA_FP8_IN_BF16, n, hidden, g1, hidden, NULL, 0.0f, &q, &scale);
            if (rc == SF_OK) rc = fp8_product(c, n, hidden, dim, q, scale, e2, y, dim, yt, beta, "fp8 GEMM (ffn W2)");
            sf_cuda_leave(c);
            return rc;
        }
        /* W1|W3 prepared as one group (copies and scales consecutive): one product of twice
         * the width, whose rows are [W1 u | W3 u] as h1 wants them */
        if (rc == SF_OK && !e1->block && e3->fp8 == e1->fp8 + (size_t)hidden * dim && e3->scale == e1->scale + hidden)
            rc = fp8_product(c, n, dim, 2 * hidden, q, scale, e1, g1, 2 * hidden, CUDA_R_16BF, 0.0f,
                             "fp8 GEMM (ffn W1|W3)");
        else if (rc == SF_OK) {
            rc = fp8_product(c, n, dim, hidden, q, scale, e1, g1, 2 * hidden, CUDA_R_16BF, 0.0f, "fp8 GEMM (ffn W1)");
            if (rc == SF_OK)
                rc = fp8_product(c, n, dim, hidden, q, scale, e3, g1 + hidden, 2 * hidden, CUDA_R_16BF, 0.0f,
                                 "fp8 GEMM (ffn W3)");
        }
        if (rc == SF_OK)
            rc = fp8_input(c, e2, SF_CUDA_FP8_IN_SWIGLU, n, hidden, g1, 2 * hidden, NULL, 0.0f, &q, &scale);
        if (rc == SF_OK) rc = fp8_product(c, n, hidden, dim, q, scale, e2, y, dim, yt, beta, "fp8 GEMM (ffn W2)");
        sf_cuda_leave(c);
        return rc;
    }
    const sf_cuda_weight *b1 = bf16_weight(c, w1, hidden, dim), *b3 = bf16_weight(c, w3, hidden, dim);
    const sf_cuda_weight *b2 = bf16_weight(c, w2, dim, hidden);
    /* the W1|W3 SwiGLU kernel writes only h3, so callers that asked (ffn_h1_floats) pass no h1 */
    const int gate_up = b2 && gate_up_takes(c, dim, hidden, b1, b3, g3, NULL);
    if (!gate_up && !h1) {
        sf_cuda_leave(c);
        return sf_error(SF_E_INVAL, "cuda ffn: this path needs the h1 scratch, which was not passed (were the "
                                    "CUDA settings changed after the stage was set up?)");
    }
    if (!b1 || !b3 || !b2) {
        sf_cuda_leave(c);
        if (yt != CUDA_R_32F)
            return sf_error(SF_E_UNSUPPORTED, "cuda ffn: a bf16 result needs weights prepared in bf16 or fp8");
        const float *w13[2] = {w1, w3};
        float *y13[2] = {h1, h3};
        rc = sf_cuda_rmsnorm(be, n, dim, x, norm, eps, u);
        if (rc == SF_OK) rc = matmul_shared(be, n, dim, hidden, u, dim, 2, w13, y13, hidden);
        if (rc == SF_OK) rc = sf_cuda_swiglu(be, n, hidden, h1, h3);
        if (rc == SF_OK) rc = sf_cuda_matmul(be, n, hidden, dim, h1, hidden, w2, (float *)y, dim, beta != 0.0f);
        return rc;
    }
    rc = sf_cuda_scratch(c, (size_t)n * dim * sizeof(__nv_bfloat16));
    __nv_bfloat16 *ub = (__nv_bfloat16 *)c->scratch; /* cudaMalloc'd: aligned for the kernel's maps */
    if (rc == SF_OK) rc = sf_cuda_rmsnorm_to_bf16(n, dim, x, norm, eps, ub, c->stream);
    if (rc == SF_OK) rc = ffn_bf16(c, n, dim, hidden, ub, b1, b3, b2, gate_up, g1, g3, y, yt, beta);
    sf_cuda_leave(c);
    return rc;
}

/* ffn_beta's bf16 products from u (bf16, normed): the caller holds the lock. */
static int ffn_bf16(sf_cuda *c, int n, int dim, int hidden, const __nv_bfloat16 *ub, const sf_cuda_weight *b1,
                    const sf_cuda_weight *b3, const sf_cuda_weight *b2, int gate_up, __nv_bfloat16 *g1,
                    __nv_bfloat16 *g3, void *y, cudaDataType yt, float beta)
{
    int rc = SF_OK;
    /* The default on an H100: W1 u and W3 u stay in registers and SwiGLU runs in the products'
     * epilogue (swiglu_gate_up.cu), g straight into h3, no [n, 2 hidden] written and read back.
     * Setting gate_up=0 takes the composed path below. */
    if (gate_up) {
        rc = sf_cuda_join_at_product(c);
        if (rc == SF_OK) rc = sf_cuda_swiglu_gate_up(n, dim, hidden, ub, b1->bf16, b3->bf16, g3, c->stream);
        if (rc == SF_OK) rc = gemm_bf16(c, n, hidden, dim, g3, b2->bf16, y, dim, yt, beta, "bf16 GEMM (ffn W2)");
        return rc;
    }
    /* W1 u | W3 u side by side in h1 ([n, 2 hidden] bf16 fills it exactly): one GEMM of twice
     * the width when W1|W3 were prepared as one group, else two into the halves of each row;
     * SwiGLU pairs each row's halves into h3, which W2 reads */
    if (b3->bf16 == b1->bf16 + (size_t)hidden * dim)
        rc = gemm_bf16(c, n, dim, 2 * hidden, ub, b1->bf16, g1, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W1|W3)");
    else {
        rc = gemm_bf16(c, n, dim, hidden, ub, b1->bf16, g1, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W1)");
        if (rc == SF_OK)
            rc = gemm_bf16(c, n, dim, hidden, ub, b3->bf16, g1 + hidden, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W3)");
    }
    if (rc == SF_OK) rc = sf_cuda_swiglu_rows_bf16(n, hidden, g1, g3, c->stream);
    if (rc == SF_OK) rc = gemm_bf16(c, n, hidden, dim, g3, b2->bf16, y, dim, yt, beta, "bf16 GEMM (ffn W2)");
    return rc;
}

int sf_cuda_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
                const float *w3, const float *w2, float *u, float *h1, float *h3)
{
    return ffn_beta(be, n, dim, hidden, x, norm, eps, w1, w3, w2, u, h1, h3, x, CUDA_R_32F, 1.0f);
}

int sf_cuda_ffn_partial(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                        const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3,
                        sf_dtype ytype, void *y)
{
    if (ytype != SF_DTYPE_F32 && ytype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda ffn: unknown output type %d", (int)ytype);
    return ffn_beta(be, n, dim, hidden, x, norm, eps, w1, w3, w2, u, h1, h3, y,
                    ytype == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F, 0.0f);
}

/* qkv (kernels/backend_ext.h): in bf16 with prepared weights the norm writes bf16 straight into the
 * scratch (no float32 u written and read back for the conversion); bit-identical to the
 * composition, since that rounds the same float32 norm once. With type bf16 the products write
 * q, k, v in bf16 (rounded from the float32 accumulators): half the bytes, and attention reads
 * K/V in place instead of converting them. Otherwise (f32 precision, weights never prepared)
 * the composed float32 sequence, rounded to bf16 afterwards when type asks for it. */
int sf_cuda_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
                const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v, float *u)
{
    if (n <= 0 || dim <= 0 || width <= 0) return SF_OK;
    if (type != SF_DTYPE_F32 && type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda qkv: unknown output type %d", (int)type);
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const float *w[3] = {wq, wk, wv};
    void *y[3] = {q, k, v};
    const sf_cuda_weight *wb[3];
    int all_fp8 = 1;
    for (int i = 0; i < 3 && all_fp8; i++)
        all_fp8 = (wb[i] = fp8_weight(c, w[i], width, dim)) != NULL && wb[i]->block == wb[0]->block;
    if (all_fp8) {
        /* precision fp8: the norm quantizes u; each product writes its output as `type` */
        unsigned char *qx;
        float *scale;
        rc = fp8_input(c, wb[0], SF_CUDA_FP8_IN_RMSNORM, n, dim, x, dim, norm, eps, &qx, &scale);
        for (int i = 0; i < 3 && rc == SF_OK; i++)
            rc = fp8_product(c, n, dim, width, qx, scale, wb[i], y[i], width,
                             type == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F, 0.0f, "fp8 GEMM (qkv)");
        sf_cuda_leave(c);
        return rc;
    }
    int all_bf16 = 1;
    for (int i = 0; i < 3 && all_bf16; i++) all_bf16 = (wb[i] = bf16_weight(c, w[i], width, dim)) != NULL;
    if (!all_bf16 && type == SF_DTYPE_F32) {
        sf_cuda_leave(c);
        float *f[3] = {(float *)q, (float *)k, (float *)v};
        rc = sf_cuda_rmsnorm(be, n, dim, x, norm, eps, u);
        if (rc == SF_OK) rc = matmul_shared(be, n, dim, width, u, dim, 3, w, f, width);
        return rc;
    }
    if (!all_bf16) {
        /* float32 products one at a time through c->widened, each rounded into its bf16 output,
         * under one hold of the lock (another thread's op must not reuse c->widened between) */
        rc = sf_cuda_widened(c, (size_t)n * width * sizeof(float));
        if (rc == SF_OK) rc = sf_cuda_rmsnorm_f32(n, dim, x, norm, eps, u, c->stream);
        for (int i = 0; i < 3 && rc == SF_OK; i++) {
            rc = matmul_locked(c, n, dim, width, u, dim, w[i], (float *)c->widened, width, 0, CUDA_R_32F);
            if (rc == SF_OK)
                rc = sf_cuda_f32_to_bf16((const float *)c->widened, n, width, width, (__nv_bfloat16 *)y[i], c->stream);
        }
        sf_cuda_leave(c);
        return rc;
    }
    rc = sf_cuda_scratch(c, (size_t)n * dim * sizeof(__nv_bfloat16));
    __nv_bfloat16 *ub = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_rmsnorm_to_bf16(n, dim, x, norm, eps, ub, c->stream);
    if (rc == SF_OK)
        rc = shared_input_gemms_bf16(c, n, dim, width, ub, 3, wb, y, width,
                                     type == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F, "bf16 GEMM (qkv)");
    sf_cuda_leave(c);
    return rc;
}

/* The products from a normed input (kernels/backend_ext.h, normed_type): u bf16 [n, dim], rows
 * dim apart, as the head-parallel ranks' sums hand it (stages/block_sums.c); the same products
 * as qkv and ffn_partial after their norm. Weights prepared in bf16 only; the setting
 * normed_sums=0 answers none (the ranks then add whole sums and the products norm). */
sf_dtype sf_cuda_normed_type(sf_backend *be)
{
    const sf_cuda *c = sf_cuda_of(be);
    return c->settings.normed_sums && c->precision == SF_PRECISION_BF16 && !c->fp8 ? SF_DTYPE_BF16 : SF_DTYPE_F32;
}

int sf_cuda_qkv_from(sf_backend *be, int n, int dim, int width, const void *u, const float *wq, const float *wk,
                     const float *wv, sf_dtype type, void *q, void *k, void *v)
{
    if (n <= 0 || dim <= 0 || width <= 0) return SF_OK;
    if (type != SF_DTYPE_F32 && type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda qkv: unknown output type %d", (int)type);
    sf_cuda *c = sf_cuda_of(be);
    const float *w[3] = {wq, wk, wv};
    void *y[3] = {q, k, v};
    const sf_cuda_weight *wb[3];
    for (int i = 0; i < 3; i++)
        if (!(wb[i] = bf16_weight(c, w[i], width, dim)))
            return sf_error(SF_E_UNSUPPORTED, "cuda qkv from a normed input: weights not prepared in bf16");
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = shared_input_gemms_bf16(c, n, dim, width, (const __nv_bfloat16 *)u, 3, wb, y, width,
                                 type == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F, "bf16 GEMM (qkv)");
    sf_cuda_leave(c);
    return rc;
}

int sf_cuda_ffn_partial_from(sf_backend *be, int n, int dim, int hidden, const void *u, const float *w1,
                             const float *w3, const float *w2, float *h1, float *h3, sf_dtype ytype, void *y)
{
    if (n <= 0 || dim <= 0 || hidden <= 0) return SF_OK;
    if (ytype != SF_DTYPE_F32 && ytype != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda ffn: unknown output type %d", (int)ytype);
    sf_cuda *c = sf_cuda_of(be);
    const sf_cuda_weight *b1 = bf16_weight(c, w1, hidden, dim), *b3 = bf16_weight(c, w3, hidden, dim);
    const sf_cuda_weight *b2 = bf16_weight(c, w2, dim, hidden);
    if (!b1 || !b3 || !b2)
        return sf_error(SF_E_UNSUPPORTED, "cuda ffn from a normed input: weights not prepared in bf16");
    const int gate_up = gate_up_takes(c, dim, hidden, b1, b3, h3, u);
    if (!gate_up && !h1) return sf_error(SF_E_INVAL, "cuda ffn: this path needs the h1 scratch, which was not passed");
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = ffn_bf16(c, n, dim, hidden, (const __nv_bfloat16 *)u, b1, b3, b2, gate_up, (__nv_bfloat16 *)h1,
                  (__nv_bfloat16 *)h3, y, ytype == SF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F, 0.0f);
    sf_cuda_leave(c);
    return rc;
}
