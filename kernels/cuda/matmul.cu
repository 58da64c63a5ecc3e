/* y = x W^T (+ y) on cuBLAS. Row-major y[n, out] = x[n, in] W[out, in]^T is, read column-major,
 * y^T (out x n) = W^T (out x in, W stored as in x out) times x^T (in x n): one GEMM with
 * op(A) = T, op(B) = N and no copies.
 * Precision f32: cublasSgemm in DEFAULT math (no TF32). Precision bf16: weights get a bf16
 * copy once (prepare_weight), x is rounded into the reserved scratch, and cublasGemmEx
 * multiplies bf16 operands with float32 accumulation into the float32 y. A weight that was
 * never prepared is multiplied in f32, which is slower but exact. */
#include "kernels/cuda/cuda_backend.h"

#include <stdlib.h>

static const sf_cuda_weight *find_weight(const sf_cuda *c, const float *w)
{
    for (int i = 0; i < c->n_weights; i++)
        if (c->weights[i].f32 == w) return &c->weights[i];
    return NULL;
}

int sf_cuda_prepare_weight(sf_backend *be, const float *w, int out, int in)
{
    sf_cuda *c = sf_cuda_of(be);
    if (c->precision != SF_PRECISION_BF16 || !w || out <= 0 || in <= 0) return SF_OK;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    size_t count = (size_t)out * in;
    const sf_cuda_weight *known = find_weight(c, w);
    if (known && known->out == out && known->in == in) {
        sf_cuda_leave(c);
        return SF_OK;
    }
    if (known) sf_cuda_drop_weight(c, w);
    if (c->n_weights == c->cap_weights) {
        int cap = c->cap_weights ? 2 * c->cap_weights : 32;
        sf_cuda_weight *grown = (sf_cuda_weight *)realloc(c->weights, (size_t)cap * sizeof *grown);
        if (!grown) {
            sf_cuda_leave(c);
            return sf_error(SF_E_NOMEM, "out of memory");
        }
        c->weights = grown, c->cap_weights = cap;
    }
    void *copy = NULL;
    rc = sf_cuda_malloc_counted(c, &copy, count * sizeof(__nv_bfloat16));
    if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(w, out, in, in, (__nv_bfloat16 *)copy, c->stream);
    if (rc == SF_OK) {
        sf_cuda_weight *slot = &c->weights[c->n_weights++];
        slot->f32 = w, slot->bf16 = (__nv_bfloat16 *)copy, slot->count = count;
        slot->out = out, slot->in = in;
    } else {
        sf_cuda_free_counted(c, copy, count * sizeof(__nv_bfloat16));
    }
    sf_cuda_leave(c);
    return rc;
}

void sf_cuda_drop_weight(sf_cuda *c, const void *w)
{
    for (int i = 0; i < c->n_weights; i++) {
        if ((const void *)c->weights[i].f32 != w) continue;
        sf_cuda_free_counted(c, c->weights[i].bf16, c->weights[i].count * sizeof(__nv_bfloat16));
        c->weights[i] = c->weights[--c->n_weights];
        return;
    }
}

int sf_cuda_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y,
                   int ldy, int accumulate)
{
    if (n <= 0 || out <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const sf_cuda_weight *wb = c->precision == SF_PRECISION_BF16 ? find_weight(c, w) : NULL;
    if (wb && wb->out == out && wb->in == in) {
        /* without reserve() the scratch grows here: one allocation, never per segment again */
        rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
        __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
        if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
        if (rc == SF_OK)
            rc = sf_cublas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, wb->bf16,
                                               CUDA_R_16BF, in, xb, CUDA_R_16BF, in, &beta, y, CUDA_R_32F, ldy,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                  "bf16 GEMM");
    } else {
        rc = sf_cublas_status(
            cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in, x, ldx, &beta, y, ldy),
            "SGEMM");
    }
    sf_cuda_leave(c);
    return rc;
}

/* matmul_shared (seqflow/backend.h): in bf16, x is rounded into the scratch once for all the
 * products (Q/K/V: 3 conversions become 1); each product is then the GEMM of sf_cuda_matmul.
 * In f32, or for a weight never prepared, it is exactly sf_cuda_matmul per weight. */
int sf_cuda_matmul_shared(sf_backend *be, int n, int in, int out, const float *x, int ldx, int count,
                          const float *const *w, float *const *y, int ldy)
{
    if (n <= 0 || out <= 0 || count <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c); /* the weight table is read under the lock, like every op's state */
    if (rc != SF_OK) return rc;
    int all_bf16 = c->precision == SF_PRECISION_BF16;
    for (int i = 0; i < count && all_bf16; i++) {
        const sf_cuda_weight *wb = find_weight(c, w[i]);
        all_bf16 = wb && wb->out == out && wb->in == in;
    }
    if (!all_bf16) {
        sf_cuda_leave(c);
        for (int i = 0; i < count && rc == SF_OK; i++) rc = sf_cuda_matmul(be, n, in, out, x, ldx, w[i], y[i], ldy, 0);
        return rc;
    }
    const float alpha = 1.0f, beta = 0.0f;
    rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
    __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
    for (int i = 0; i < count && rc == SF_OK; i++)
        rc = sf_cublas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha,
                                           find_weight(c, w[i])->bf16, CUDA_R_16BF, in, xb, CUDA_R_16BF, in, &beta,
                                           y[i], CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                              "bf16 GEMM (shared input)");
    sf_cuda_leave(c);
    return rc;
}
