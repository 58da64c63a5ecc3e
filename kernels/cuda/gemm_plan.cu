/* How the CUDA backend's bf16 products go through cuBLAS: cublasGemmEx, or the cuBLASLt
 * algorithm chosen once per shape (sf_cuda_gemm, cuda_backend.h; the ops are in matmul.cu).
 * On the H100 the heuristic's first Lt algorithm is about what cublasGemmEx runs, but another
 * of its top candidates is 12-26% faster on three of the model's four product shapes
 * (bench/lab/GEMM_NOTES.md). Which one wins is only known by timing, so each shape's first product
 * times the candidates (and cublasGemmEx) on its own operands, keeps the fastest in
 * c->gemm_plans, and every later product of that shape issues it with no further choice.
 * Candidates that split K are skipped: the others sum each output in the same order (their
 * results matched cublasGemmEx's bit for bit there), so which one wins a noisy timing never
 * changes the numbers. Setting gemm=gemmex never uses Lt; gemm=lt takes Lt's fastest even
 * where cublasGemmEx is faster (the tests use it to exercise that path). A later process takes
 * what an earlier one timed from the plan cache (gemm_plan_cache.cu). */
#include "kernels/cuda/cuda_backend.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_CANDIDATES 16
#define GEMM_TIMED_RUNS 5

static int run_gemmex(sf_cuda *c, const sf_cuda_gemm_args *g, const char *what)
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
 * backend needs no second handle; stream and workspace are those of the stream the op issues to. */
static cublasStatus_t run_lt(sf_cuda *c, sf_cuda_gemm_plan *p, const cublasLtMatmulAlgo_t *algo, const sf_cuda_gemm_args *g)
{
    const float alpha = 1.0f;
    return cublasLtMatmul((cublasLtHandle_t)c->blas, &p->op, &alpha, g->w, &p->a, g->x, &p->b, &g->beta, g->y, &p->c,
                          g->y, &p->c, algo, c->blas_workspace, c->blas_workspace_bytes, c->stream);
}

static size_t ytype_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* The largest power of two up to 256 dividing every operand address (and batch step): the
 * alignment Lt's candidates are chosen for, so a plan never meets a less aligned operand. */
static int operand_alignment(const sf_cuda_gemm_args *g)
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
static float time_product(sf_cuda *c, sf_cuda_gemm_plan *p, const cublasLtMatmulAlgo_t *algo, const sf_cuda_gemm_args *g,
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
static void *timing_target(const sf_cuda *c, const sf_cuda_gemm_args *g, size_t y_bytes)
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
static int choose_path(sf_cuda *c, sf_cuda_gemm_plan *p, const sf_cuda_gemm_args *g)
{
    p->use_lt = 0;
    if (c->settings.gemm == SF_CUDA_GEMM_GEMMEX || describe(p) != CUBLAS_STATUS_SUCCESS) return SF_OK;
    const int force_lt = c->settings.gemm == SF_CUDA_GEMM_LT;
    if (sf_cuda_plan_cache_find(c, p)) { /* what an earlier process timed for this shape */
        c->plans_cached++;
        return SF_OK;
    }
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

    sf_cuda_gemm_args timing = *g;
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
    if (rc == SF_OK) {
        c->plans_timed++;
        sf_cuda_plan_cache_add(c, p);
    }
    return rc;
}

static int same_shape(const sf_cuda_gemm_plan *p, const sf_cuda_gemm_args *g, int align)
{
    return p->n == g->n && p->in == g->in && p->out == g->out && p->ldy == g->ldy && p->batch == g->batch &&
           p->accumulate == (g->beta != 0.0f) && p->align == align && p->stride_w == g->stride_w &&
           p->stride_y == g->stride_y && p->ytype == g->ytype;
}

/* The plan for g's shape, chosen now if this is its first use; NULL: plain cublasGemmEx (the
 * table is full). */
static int find_plan(sf_cuda *c, const sf_cuda_gemm_args *g, sf_cuda_gemm_plan **plan)
{
    *plan = NULL;
    const int align = operand_alignment(g);
    for (int i = 0; i < c->n_gemm_plans; i++)
        if (same_shape(&c->gemm_plans[i], g, align)) return *plan = &c->gemm_plans[i], SF_OK;
    if (c->n_gemm_plans == SF_CUDA_GEMM_PLANS) return SF_OK;
    sf_cuda_gemm_plan *p = &c->gemm_plans[c->n_gemm_plans];
    memset(p, 0, sizeof *p);
    p->n = g->n, p->in = g->in, p->out = g->out, p->ldy = g->ldy, p->batch = g->batch;
    p->accumulate = g->beta != 0.0f, p->align = align, p->stride_w = g->stride_w, p->stride_y = g->stride_y;
    p->ytype = g->ytype;
    const int rc = choose_path(c, p, g);
    if (rc == SF_OK) c->n_gemm_plans++, *plan = p;
    return rc;
}

int sf_cuda_gemm(sf_cuda *c, const sf_cuda_gemm_args *g, const char *what)
{
    sf_cuda_gemm_plan *p;
    int rc = sf_cuda_join_at_product(c);
    if (rc == SF_OK) rc = find_plan(c, g, &p);
    if (rc != SF_OK) return rc;
    if (p && p->use_lt && p->workspace_bytes <= c->blas_workspace_bytes) {
        cublasStatus_t st = run_lt(c, p, &p->algo, g);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) return sf_cublas_status(st, what);
        /* an operand this algorithm cannot take after all: the general path below */
    }
    return run_gemmex(c, g, what);
}
