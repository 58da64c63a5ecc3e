/* y = x W^T (+ y) on cuBLAS. Row-major y[n, out] = x[n, in] W[out, in]^T is, read column-major,
 * y^T (out x n) = W^T (out x in, W stored as in x out) times x^T (in x n): one GEMM with
 * op(A) = T, op(B) = N and no copies.
 * Precision f32: cublasSgemm in DEFAULT math (no TF32). Precision bf16: weights get a bf16
 * copy once (prepare_weight), x is rounded into the reserved scratch, and cuBLAS (cublasLt's
 * algorithm timed fastest for the shape, or cublasGemmEx; see below) multiplies bf16 operands
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

/* ---- the bf16 products: cublasGemmEx, or the cuBLASLt algorithm chosen once per shape ------
 * On the H100 the heuristic's first Lt algorithm is about what cublasGemmEx runs, but another
 * of its top candidates is 12-26% faster on three of the model's four product shapes
 * (bench/GEMM_NOTES.md). Which one wins is only known by timing, so each shape's first product
 * times the candidates (and cublasGemmEx) on its own operands, keeps the fastest in
 * c->gemm_plans, and every later product of that shape issues it with no further choice.
 * Candidates that split K are skipped: the others sum each output in the same order (their
 * results matched cublasGemmEx's bit for bit there), so which one wins a noisy timing never
 * changes the numbers. SEQFLOW_CUDA_GEMM=gemmex never uses Lt; =lt takes Lt's fastest even
 * where cublasGemmEx is faster (the tests use it to exercise that path). */
#define GEMM_CANDIDATES 16
#define GEMM_TIMED_RUNS 5

/* y (float32 or bf16, rows ldy apart) = x w^T + beta y for batch weights stride_w elements
 * apart, one shared x, outputs stride_y elements apart; x, w bf16 and contiguous. */
typedef struct gemm_args {
    int n, in, out, ldy, batch;
    long long stride_w, stride_y;
    const __nv_bfloat16 *x, *w;
    void *y;
    cudaDataType ytype;
    float beta;
} gemm_args;

static int run_gemmex(sf_cuda *c, const gemm_args *g, const char *what)
{
    const float alpha = 1.0f;
    if (g->batch == 1)
        return sf_cublas_status(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, g->out, g->n, g->in, &alpha, g->w,
                                             CUDA_R_16BF, g->in, g->x, CUDA_R_16BF, g->in, &g->beta, g->y, g->ytype,
                                             g->ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                what);
    return sf_cublas_status(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, g->out, g->n, g->in, &alpha,
                                                       g->w, CUDA_R_16BF, g->in, g->stride_w, g->x, CUDA_R_16BF, g->in,
                                                       0, &g->beta, g->y, g->ytype, g->ldy, g->stride_y, g->batch,
                                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                            what);
}

/* A cuBLAS handle is a cuBLASLt handle too (cuBLAS documentation, cublasLtHandle_t), so the
 * backend needs no second handle; stream and workspace are the current queue's. */
static cublasStatus_t run_lt(sf_cuda *c, sf_cuda_gemm_plan *p, const cublasLtMatmulAlgo_t *algo, const gemm_args *g)
{
    const float alpha = 1.0f;
    return cublasLtMatmul((cublasLtHandle_t)c->blas, &p->op, &alpha, g->w, &p->a, g->x, &p->b, &g->beta, g->y, &p->c,
                          g->y, &p->c, algo, c->blas_workspace, c->blas_workspace_bytes, c->stream);
}

static size_t ytype_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* The largest power of two up to 256 dividing every operand address (and batch step): the
 * alignment Lt's candidates are chosen for, so a plan never meets a less aligned operand. */
static int operand_alignment(const gemm_args *g)
{
    uintptr_t bits = (uintptr_t)g->x | (uintptr_t)g->w | (uintptr_t)g->y | 256;
    if (g->batch > 1) bits |= (uintptr_t)(g->stride_w * 2) | (uintptr_t)(g->stride_y * ytype_bytes(g->ytype));
    return (int)(bits & (~bits + 1));
}

static cublasStatus_t describe(sf_cuda_gemm_plan *p)
{
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasStatus_t st = cublasLtMatmulDescInit(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    if (!st) st = cublasLtMatmulDescSetAttribute(&p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if (!st) st = cublasLtMatrixLayoutInit(&p->a, CUDA_R_16BF, p->in, p->out, p->in);
    if (!st) st = cublasLtMatrixLayoutInit(&p->b, CUDA_R_16BF, p->in, p->n, p->in);
    if (!st) st = cublasLtMatrixLayoutInit(&p->c, p->ytype, p->out, p->n, p->ldy);
    if (p->batch > 1) {
        cublasLtMatrixLayoutOpaque_t *layout[3] = {&p->a, &p->b, &p->c};
        const long long stride[3] = {p->stride_w, 0, p->stride_y}; /* b: the one shared input */
        for (int i = 0; i < 3 && !st; i++) {
            st = cublasLtMatrixLayoutSetAttribute(layout[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &p->batch,
                                                  sizeof p->batch);
            if (!st)
                st = cublasLtMatrixLayoutSetAttribute(layout[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &stride[i], sizeof stride[i]);
        }
    }
    return st;
}

/* Milliseconds of one product (mean of GEMM_TIMED_RUNS after one untimed), through Lt with
 * `algo`, or cublasGemmEx when algo is NULL; negative when it cannot run. */
static float time_product(sf_cuda *c, sf_cuda_gemm_plan *p, const cublasLtMatmulAlgo_t *algo, const gemm_args *g,
                          cudaEvent_t start, cudaEvent_t stop)
{
    for (int i = 0; i <= GEMM_TIMED_RUNS; i++) {
        if (i == 1 && cudaEventRecord(start, c->stream) != cudaSuccess) return -1;
        if (algo ? run_lt(c, p, algo, g) != CUBLAS_STATUS_SUCCESS : run_gemmex(c, g, "GEMM timing") != SF_OK) {
            sf_clear_error();
            return -1;
        }
    }
    float ms = -1;
    if (cudaEventRecord(stop, c->stream) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
        return -1;
    return ms / GEMM_TIMED_RUNS;
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

/* Where an accumulating product of y_bytes may be timed: the end of the scratch, when that
 * overlaps none of its operands (the scratch usually holds x's bf16 copy at its start). NULL:
 * no room, and the shape stays on cublasGemmEx; allocating a temporary instead would raise the
 * peak device memory whenever a new shape (a partial segment) first appears. */
static void *timing_target(const sf_cuda *c, const gemm_args *g, size_t y_bytes)
{
    if (y_bytes > c->scratch_bytes) return NULL;
    const uintptr_t lo = (uintptr_t)c->scratch + ((c->scratch_bytes - y_bytes) & ~(uintptr_t)255);
    const uintptr_t hi = lo + y_bytes;
    const uintptr_t x = (uintptr_t)g->x, x_end = x + (size_t)g->n * g->in * sizeof(__nv_bfloat16);
    const uintptr_t w = (uintptr_t)g->w, w_end = w + ((size_t)(g->batch - 1) * g->stride_w + (size_t)g->out * g->in) * 2;
    const uintptr_t y = (uintptr_t)g->y, y_end = y + y_bytes;
    if ((x < hi && lo < x_end) || (w < hi && lo < w_end) || (y < hi && lo < y_end)) return NULL;
    return (void *)lo;
}

/* Fills p->use_lt / algo for the shape of g by timing (see the top of this section). A beta 0
 * product times into its own y, which the real product then overwrites; an accumulating one
 * must add to y exactly once, so it times into free scratch (timing_target: the values there
 * are garbage, which costs the same). First use of the shape only; never on a later product. */
static int choose_path(sf_cuda *c, sf_cuda_gemm_plan *p, const gemm_args *g)
{
    p->use_lt = 0;
    const char *mode = getenv("SEQFLOW_CUDA_GEMM");
    if ((mode && !strcmp(mode, "gemmex")) || describe(p) != CUBLAS_STATUS_SUCCESS) return SF_OK;
    const int force_lt = mode && !strcmp(mode, "lt");
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
    cublasLtMatmulHeuristicResult_t found[GEMM_CANDIDATES];
    int count = 0;
    if (!st)
        st = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)c->blas, &p->op, &p->a, &p->b, &p->c, &p->c, &pref,
                                            GEMM_CANDIDATES, found, &count);
    if (st || count == 0) return SF_OK; /* no Lt algorithm: cublasGemmEx */

    gemm_args timing = *g;
    const size_t y_bytes =
        ((size_t)(g->batch - 1) * g->stride_y + (size_t)(g->n - 1) * g->ldy + g->out) * ytype_bytes(g->ytype);
    if (g->beta != 0.0f && !(timing.y = timing_target(c, g, y_bytes))) return SF_OK;
    cudaEvent_t start = NULL, stop = NULL;
    int rc = sf_cuda_status(cudaEventCreate(&start), "cudaEventCreate");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreate(&stop), "cudaEventCreate");
    float best = -1;
    if (rc == SF_OK && !force_lt) best = time_product(c, p, NULL, &timing, start, stop);
    for (int i = 0; i < count && rc == SF_OK; i++) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS || found[i].workspaceSize > c->blas_workspace_bytes ||
            splits_k(&found[i].algo))
            continue;
        float ms = time_product(c, p, &found[i].algo, &timing, start, stop);
        if (ms > 0 && (best < 0 || ms < best)) {
            best = ms, p->use_lt = 1;
            p->algo = found[i].algo, p->workspace_bytes = found[i].workspaceSize;
        }
    }
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    return rc;
}

static int same_shape(const sf_cuda_gemm_plan *p, const gemm_args *g, int align)
{
    return p->n == g->n && p->in == g->in && p->out == g->out && p->ldy == g->ldy && p->batch == g->batch &&
           p->accumulate == (g->beta != 0.0f) && p->align == align && p->stride_w == g->stride_w &&
           p->stride_y == g->stride_y && p->ytype == g->ytype;
}

/* The plan for g's shape, chosen now if this is its first use; NULL: plain cublasGemmEx (the
 * table is full, or the stream is being captured into a graph, where nothing may be timed). */
static int find_plan(sf_cuda *c, const gemm_args *g, sf_cuda_gemm_plan **plan)
{
    *plan = NULL;
    const int align = operand_alignment(g);
    for (int i = 0; i < c->n_gemm_plans; i++)
        if (same_shape(&c->gemm_plans[i], g, align)) return *plan = &c->gemm_plans[i], SF_OK;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    int rc = sf_cuda_status(cudaStreamIsCapturing(c->stream, &capture), "cudaStreamIsCapturing");
    if (rc != SF_OK || capture != cudaStreamCaptureStatusNone || c->n_gemm_plans == SF_CUDA_GEMM_PLANS) return rc;
    sf_cuda_gemm_plan *p = &c->gemm_plans[c->n_gemm_plans];
    memset(p, 0, sizeof *p);
    p->n = g->n, p->in = g->in, p->out = g->out, p->ldy = g->ldy, p->batch = g->batch;
    p->accumulate = g->beta != 0.0f, p->align = align, p->stride_w = g->stride_w, p->stride_y = g->stride_y;
    p->ytype = g->ytype;
    rc = choose_path(c, p, g);
    if (rc == SF_OK) c->n_gemm_plans++, *plan = p;
    return rc;
}

static int gemm(sf_cuda *c, const gemm_args *g, const char *what)
{
    sf_cuda_gemm_plan *p;
    int rc = find_plan(c, g, &p);
    if (rc != SF_OK) return rc;
    if (p && p->use_lt && p->workspace_bytes <= c->blas_workspace_bytes) {
        cublasStatus_t st = run_lt(c, p, &p->algo, g);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) return sf_cublas_status(st, what);
        /* an operand this algorithm cannot take after all: the general path below */
    }
    return run_gemmex(c, g, what);
}

/* One bf16 GEMM y[n, out] = x[n, in] w^T (+ beta y) with x, w already bf16 (contiguous) and y
 * of type `ytype` (bf16 or float32), rows ldy elements apart. */
static int gemm_bf16(sf_cuda *c, int n, int in, int out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, void *y,
                     int ldy, cudaDataType ytype, float beta, const char *what)
{
    const gemm_args g = {n, in, out, ldy, 1, 0, 0, x, w, y, ytype, beta};
    return gemm(c, &g, what);
}

/* w's bf16 copy when this backend multiplies in bf16 and w was prepared with this shape (a
 * weight of another shape must not use it); NULL means the product runs in float32. */
static const sf_cuda_weight *bf16_weight(const sf_cuda *c, const float *w, int out, int in)
{
    if (c->precision != SF_PRECISION_BF16) return NULL;
    const sf_cuda_weight *wb = find_weight(c, w);
    return wb && wb->out == out && wb->in == in ? wb : NULL;
}

/* The distance from y[0] to y[1] in floats when the count outputs are equally spaced, in order,
 * and far enough apart not to overlap ([n, out] rows ldy apart each); 0 otherwise. Plain
 * integers: the outputs may be separate allocations, which pointer subtraction must not see. */
static long long equal_output_stride(int n, int out, int count, float *const *y, int ldy)
{
    const intptr_t step = (intptr_t)y[1] - (intptr_t)y[0];
    if (step <= 0 || step % (intptr_t)sizeof(float)) return 0;
    for (int i = 2; i < count; i++)
        if ((intptr_t)y[i] - (intptr_t)y[i - 1] != step) return 0;
    const long long floats = (long long)(step / (intptr_t)sizeof(float));
    return floats >= (long long)(n - 1) * ldy + out ? floats : 0;
}

/* y[i] = xb w[i]^T (float32, beta 0) for count bf16 weights of one shape sharing the bf16 input
 * xb. Weights prepared as one group (consecutive in one allocation) with equally spaced outputs
 * (stages/block.c: q, k, v in one buffer) go out as ONE strided-batched GEMM: for Q/K/V at
 * n=8192, 1024x1024 on the H100 that is 9% faster than three cublasGemmEx calls, and 21-26%
 * with the Lt algorithm the plan picks (bench/GEMM_NOTES.md). Otherwise one GEMM per weight. */
static int shared_input_gemms_bf16(sf_cuda *c, int n, int in, int out, const __nv_bfloat16 *xb, int count,
                                   const sf_cuda_weight *const *wb, float *const *y, int ldy, const char *what)
{
    const size_t each = (size_t)out * in;
    int grouped = count > 1;
    for (int i = 1; i < count && grouped; i++) grouped = wb[i]->bf16 == wb[0]->bf16 + (size_t)i * each;
    const long long stride = grouped ? equal_output_stride(n, out, count, y, ldy) : 0;
    if (stride) {
        const gemm_args g = {n, in, out, ldy, count, (long long)each, stride, xb, wb[0]->bf16, y[0], CUDA_R_32F, 0.0f};
        return gemm(c, &g, what);
    }
    int rc = SF_OK;
    for (int i = 0; i < count && rc == SF_OK; i++)
        rc = gemm_bf16(c, n, in, out, xb, wb[i]->bf16, y[i], ldy, CUDA_R_32F, 0.0f, what);
    return rc;
}

/* Rounds x once into the scratch, then the products of shared_input_gemms_bf16 (all prepared). */
#define SHARED_MAX 8 /* products matmul_shared takes in one pass (Q/K/V: 3) */

static int shared_input_gemms(sf_cuda *c, int n, int in, int out, const float *x, int ldx, int count,
                              const sf_cuda_weight *const *wb, float *const *y, int ldy, const char *what)
{
    int rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
    __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
    if (rc == SF_OK) rc = shared_input_gemms_bf16(c, n, in, out, xb, count, wb, y, ldy, what);
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

/* bf16 copies of count weights of one shape in one allocation, in order: a product with all
 * of them is then one GEMM over the concatenation (ffn's W1|W3). Entry 0 owns the memory. */
static int prepare_group(sf_cuda *c, int count, const float *const *w, int out, int in)
{
    int fresh = 0;
    for (int i = 0; i < count; i++) {
        const sf_cuda_weight *known = find_weight(c, w[i]);
        fresh |= !known || known->out != out || known->in != in;
        /* already prepared together, in this order? then there is nothing to do */
        if (known && i > 0 && find_weight(c, w[0]) && known->bf16 != find_weight(c, w[0])->bf16 + (size_t)i * out * in)
            fresh = 1;
    }
    if (!fresh) return SF_OK;
    for (int i = 0; i < count; i++) sf_cuda_drop_weight(c, w[i]);
    int rc = grow_weight_table(c, count);
    if (rc != SF_OK) return rc;
    const size_t each = (size_t)out * in;
    void *copy = NULL;
    rc = sf_cuda_malloc_counted(c, &copy, (size_t)count * each * sizeof(__nv_bfloat16));
    for (int i = 0; i < count && rc == SF_OK; i++)
        rc = sf_cuda_f32_to_bf16(w[i], out, in, in, (__nv_bfloat16 *)copy + i * each, c->stream);
    if (rc != SF_OK) {
        sf_cuda_free_counted(c, copy, (size_t)count * each * sizeof(__nv_bfloat16));
        return rc;
    }
    for (int i = 0; i < count; i++) {
        sf_cuda_weight *slot = &c->weights[c->n_weights++];
        slot->f32 = w[i], slot->bf16 = (__nv_bfloat16 *)copy + i * each, slot->count = each;
        slot->out = out, slot->in = in;
        slot->owned = i == 0 ? count * each : 0;
    }
    return SF_OK;
}

int sf_cuda_prepare_weight(sf_backend *be, const float *w, int out, int in)
{
    return w ? sf_cuda_prepare_weight_group(be, 1, &w, out, in) : SF_OK;
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
        const __nv_bfloat16 *lo = gone.bf16, *hi = gone.bf16 + gone.owned;
        for (int j = 0; j < c->n_weights;)
            if (c->weights[j].bf16 >= lo && c->weights[j].bf16 < hi) c->weights[j] = c->weights[--c->n_weights];
            else j++;
        sf_cuda_free_counted(c, gone.bf16, gone.owned * sizeof(__nv_bfloat16));
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
    const sf_cuda_weight *wb = bf16_weight(c, w, out, in);
    if (wb) {
        /* without reserve() the scratch grows here: one allocation, never per segment again */
        rc = sf_cuda_scratch(c, (size_t)n * in * sizeof(__nv_bfloat16));
        __nv_bfloat16 *xb = (__nv_bfloat16 *)c->scratch;
        if (rc == SF_OK) rc = sf_cuda_f32_to_bf16(x, n, in, ldx, xb, c->stream);
        if (rc == SF_OK) rc = gemm_bf16(c, n, in, out, xb, wb->bf16, y, ldy, CUDA_R_32F, beta, "bf16 GEMM");
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
    const sf_cuda_weight *wb[SHARED_MAX];
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

/* ffn (seqflow/backend.h). In bf16 with prepared weights the intermediates never exist in
 * float32: the norm writes bf16 straight into the scratch, W1 and W3 write bf16 side by side
 * into the caller's h1, SwiGLU writes bf16 into h3, and W2 accumulates into x in float32
 * (beta = 1, the residual). Against the float32 composition this saves the
 * [n, hidden] float32 writes and reads of W1/W3, SwiGLU and W2's input conversion: about
 * 10 n*hidden bytes of the 24 n*hidden it moved. The only new rounding is of W1 u and W3 u to
 * bf16 before SwiGLU. Otherwise (f32, unprepared weights) it is the composed sequence. */
int sf_cuda_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
                const float *w3, const float *w2, float *u, float *h1, float *h3)
{
    if (n <= 0 || dim <= 0 || hidden <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const sf_cuda_weight *b1 = bf16_weight(c, w1, hidden, dim), *b3 = bf16_weight(c, w3, hidden, dim);
    const sf_cuda_weight *b2 = bf16_weight(c, w2, dim, hidden);
    if (!b1 || !b3 || !b2) {
        sf_cuda_leave(c);
        const float *w13[2] = {w1, w3};
        float *y13[2] = {h1, h3};
        rc = sf_cuda_rmsnorm(be, n, dim, x, norm, eps, u);
        if (rc == SF_OK) rc = sf_cuda_matmul_shared(be, n, dim, hidden, u, dim, 2, w13, y13, hidden);
        if (rc == SF_OK) rc = sf_cuda_swiglu(be, n, hidden, h1, h3);
        if (rc == SF_OK) rc = sf_cuda_matmul(be, n, hidden, dim, h1, hidden, w2, x, dim, 1);
        return rc;
    }
    __nv_bfloat16 *g1 = (__nv_bfloat16 *)h1, *g3 = (__nv_bfloat16 *)h3;
    rc = sf_cuda_scratch(c, (size_t)n * dim * sizeof(__nv_bfloat16));
    __nv_bfloat16 *ub = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_rmsnorm_to_bf16(n, dim, x, norm, eps, ub, c->stream);
    /* W1 u | W3 u side by side in h1 ([n, 2 hidden] bf16 fills it exactly): one GEMM of twice
     * the width when W1|W3 were prepared as one group, else two into the halves of each row;
     * SwiGLU pairs each row's halves into h3, which W2 reads */
    if (rc == SF_OK && b3->bf16 == b1->bf16 + (size_t)hidden * dim)
        rc = gemm_bf16(c, n, dim, 2 * hidden, ub, b1->bf16, g1, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W1|W3)");
    else if (rc == SF_OK) {
        rc = gemm_bf16(c, n, dim, hidden, ub, b1->bf16, g1, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W1)");
        if (rc == SF_OK)
            rc = gemm_bf16(c, n, dim, hidden, ub, b3->bf16, g1 + hidden, 2 * hidden, CUDA_R_16BF, 0.0f, "bf16 GEMM (ffn W3)");
    }
    if (rc == SF_OK) rc = sf_cuda_swiglu_rows_bf16(n, hidden, g1, g3, c->stream);
    if (rc == SF_OK) rc = gemm_bf16(c, n, hidden, dim, g3, b2->bf16, x, dim, CUDA_R_32F, 1.0f, "bf16 GEMM (ffn W2)");
    sf_cuda_leave(c);
    return rc;
}

/* qkv (seqflow/backend.h): in bf16 with prepared weights the norm writes bf16 straight into the
 * scratch (no float32 u written and read back for the conversion); bit-identical to the
 * composition, since that rounds the same float32 norm once. */
int sf_cuda_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
                const float *wq, const float *wk, const float *wv, float *q, float *k, float *v, float *u)
{
    if (n <= 0 || dim <= 0 || width <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    const float *w[3] = {wq, wk, wv};
    float *y[3] = {q, k, v};
    const sf_cuda_weight *wb[3];
    int all_bf16 = 1;
    for (int i = 0; i < 3 && all_bf16; i++) all_bf16 = (wb[i] = bf16_weight(c, w[i], width, dim)) != NULL;
    if (!all_bf16) {
        sf_cuda_leave(c);
        rc = sf_cuda_rmsnorm(be, n, dim, x, norm, eps, u);
        if (rc == SF_OK) rc = sf_cuda_matmul_shared(be, n, dim, width, u, dim, 3, w, y, width);
        return rc;
    }
    rc = sf_cuda_scratch(c, (size_t)n * dim * sizeof(__nv_bfloat16));
    __nv_bfloat16 *ub = (__nv_bfloat16 *)c->scratch;
    if (rc == SF_OK) rc = sf_cuda_rmsnorm_to_bf16(n, dim, x, norm, eps, ub, c->stream);
    if (rc == SF_OK) rc = shared_input_gemms_bf16(c, n, dim, width, ub, 3, wb, y, width, "bf16 GEMM (qkv)");
    sf_cuda_leave(c);
    return rc;
}
