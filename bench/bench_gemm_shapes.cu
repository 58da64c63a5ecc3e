// The reference model's products (D=1024, W=1024, F=4096, n=8192 rows, bf16 operands, float32
// accumulation) timed three ways, to decide what kernels/cuda/matmul.cu should issue:
//   gemmex   cublasGemmEx, CUBLAS_GEMM_DEFAULT, exactly as matmul.cu does it today;
//   lt       cublasLtMatmul with each of the heuristic's top algorithms (up to 16, 32 MiB
//            workspace): the heuristic's first ("lt#0") and the fastest ("lt best");
//   batched  Q/K/V as one call: three contiguous weights (stride W*D), the shared input
//            (stride 0), q|k|v contiguous (stride n*W); and, for comparison only, one GEMM of
//            out=3W into one [n, 3W] buffer.
// Each case: warm-up, then the median of --reps runs timed with CUDA events, random operands.
// TFLOP/s = 2 n in out (times the products in the case) / time. Every Lt result is checked
// against cublasGemmEx's (only the summation order differs: f32 out agrees to ~1e-5 of the
// output's scale; bf16 out to one bf16 rounding step of each element).
//
//   bench_gemm_shapes [--reps 30] [--n 8192]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "gemm_bench_common.cuh"
#include "event_timing.cuh"

static const size_t WORKSPACE_BYTES = (size_t)32 << 20; /* the backend's blas_workspace */
static int reps = 30;
static int failures = 0;

/* Median milliseconds of one call of `run` (warm-up first). */
static double time_ms(const std::function<void()> &run)
{
    for (int i = 0; i < 5; i++) run();
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> ms = event_times_ms(reps, run);
    return ms[ms.size() / 2];
}

/* Host copy of a float32 or bf16 device matrix as float. */
static std::vector<float> host_floats(const void *d, size_t count, cudaDataType type)
{
    std::vector<float> h(count);
    if (type == CUDA_R_32F) {
        CUDA_OK(cudaMemcpy(h.data(), d, count * 4, cudaMemcpyDeviceToHost));
    } else {
        std::vector<__nv_bfloat16> b(count);
        CUDA_OK(cudaMemcpy(b.data(), d, count * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) h[i] = __bfloat162float(b[i]);
    }
    return h;
}

/* Max |got - want|; fails the run when an element is NaN or off by more than the rounding
 * that a different summation order allows (see the top of the file). */
static double check_same(const char *what, const std::vector<float> &got, const std::vector<float> &want,
                         cudaDataType type)
{
    double scale = 0, worst = 0;
    for (float w : want) scale = std::max(scale, (double)std::fabs(w));
    bool ok = scale > 0;
    for (size_t i = 0; i < want.size(); i++) {
        double d = std::fabs((double)got[i] - want[i]);
        double tol = 1e-5 * scale + (type == CUDA_R_16BF ? std::ldexp(std::fabs((double)want[i]), -7) : 0.0);
        if (!(d <= tol)) ok = false;
        if (!(d <= worst)) worst = d; /* NaN sticks */
    }
    if (!ok) {
        std::printf("FAIL %s: max abs diff %.3g (output scale %.3g)\n", what, worst, scale);
        failures++;
    }
    return worst;
}

struct shape {
    const char *name;
    int n, in, out;
    cudaDataType ytype;
    float beta;
};

static double tflops(double flop, double ms) { return flop / (ms * 1e-3) / 1e12; }

static void line(const char *shape_name, const char *variant, double ms, double flop, const char *extra)
{
    std::printf("%-34s %-30s %8.4f ms %7.1f TFLOP/s %s\n", shape_name, variant, ms, tflops(flop, ms), extra);
}

/* One Lt problem: y[n, out] (ld ldy, batch stride sy) = x[n, in] (stride sx) w^T (stride sw),
 * column-major y^T = op(w)=T times x^T, like matmul.cu. */
struct lt_problem {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
};

static lt_problem lt_make(const shape &s, int ldy, int batch, long long sw, long long sx, long long sy)
{
    lt_problem p;
    CUBLAS_OK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    CUBLAS_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CUBLAS_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, s.in, s.out, s.in));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, s.in, s.n, s.in));
    CUBLAS_OK(cublasLtMatrixLayoutCreate(&p.c, s.ytype, s.out, s.n, ldy));
    if (batch > 1) {
        const cublasLtMatrixLayout_t lay[3] = {p.a, p.b, p.c};
        const long long stride[3] = {sw, sx, sy};
        for (int i = 0; i < 3; i++) {
            CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
            CUBLAS_OK(cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride[i],
                                                       sizeof stride[i]));
        }
    }
    return p;
}

static void lt_free(lt_problem &p)
{
    cublasLtMatrixLayoutDestroy(p.a), cublasLtMatrixLayoutDestroy(p.b), cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
}

struct context {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;
};

/* Times every heuristic algorithm for the problem; prints lt#0 and the fastest, checks each
 * algorithm's result against `want` (y reset from y0 first where beta is 1). */
static void lt_cases(context &cx, const shape &s, const char *label, const lt_problem &p, const void *w, const void *x,
                     void *y, const void *y0, size_t y_count, const std::vector<float> &want, double flop,
                     double gemmex_ms)
{
    cublasLtMatmulPreference_t pref;
    CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WORKSPACE_BYTES,
                                                   sizeof WORKSPACE_BYTES));
    cublasLtMatmulHeuristicResult_t found[16];
    int count = 0;
    CUBLAS_OK(cublasLtMatmulAlgoGetHeuristic(cx.lt, p.op, p.a, p.b, p.c, p.c, pref, 16, found, &count));
    cublasLtMatmulPreferenceDestroy(pref);
    if (count == 0) {
        std::printf("%-34s lt: the heuristic returned no algorithm\n", label);
        return;
    }
    const float alpha = 1.0f;
    const size_t ybytes = y_count * (s.ytype == CUDA_R_32F ? 4 : 2);
    double best = 1e30, first = 0, worst_diff = 0;
    int best_i = -1, ran = 0;
    for (int i = 0; i < count; i++) {
        const cublasLtMatmulAlgo_t *algo = &found[i].algo;
        auto run = [&] {
            CUBLAS_OK(cublasLtMatmul(cx.lt, p.op, &alpha, w, p.a, x, p.b, &s.beta, y, p.c, y, p.c, algo, cx.workspace,
                                     WORKSPACE_BYTES, 0));
        };
        CUDA_OK(cudaMemcpy(y, y0, ybytes, cudaMemcpyDeviceToDevice));
        if (cublasLtMatmul(cx.lt, p.op, &alpha, w, p.a, x, p.b, &s.beta, y, p.c, y, p.c, algo, cx.workspace,
                           WORKSPACE_BYTES, 0) != CUBLAS_STATUS_SUCCESS)
            continue; /* a heuristic entry this problem cannot run: skip it */
        char what[96];
        std::snprintf(what, sizeof what, "%s lt#%d", label, i);
        worst_diff = std::max(worst_diff, check_same(what, host_floats(y, y_count, s.ytype), want, s.ytype));
        double ms = time_ms(run);
        ran++;
        if (i == 0) first = ms;
        if (ms < best) best = ms, best_i = i;
    }
    char extra[200];
    if (first > 0) {
        std::snprintf(extra, sizeof extra, "(%+.1f%% vs gemmex)", 100.0 * (gemmex_ms / first - 1.0));
        line(label, "lt#0 (heuristic's first)", first, flop, extra);
    }
    int32_t splits = 1, tile = 0;
    size_t got;
    if (best_i >= 0) { /* matmul.cu skips split-K candidates: is the winner one? */
        cublasLtMatmulAlgoConfigGetAttribute(&found[best_i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof splits, &got);
        cublasLtMatmulAlgoConfigGetAttribute(&found[best_i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                             &got);
    }
    std::snprintf(extra, sizeof extra, "(%+.1f%% vs gemmex; %d of %d algos ran; max |lt - gemmex| %.3g; splitK %d tile %d)",
                  100.0 * (gemmex_ms / best - 1.0), ran, count, worst_diff, (int)splits, (int)tile);
    char variant[40];
    std::snprintf(variant, sizeof variant, "lt best (#%d)", best_i);
    line(label, variant, best, flop, extra);
}

/* One product of the model: gemmex, then every Lt algorithm. */
static void single_shape(context &cx, const shape &s)
{
    const size_t nx = (size_t)s.n * s.in, nw = (size_t)s.out * s.in, ny = (size_t)s.n * s.out;
    const size_t esize = s.ytype == CUDA_R_32F ? 4 : 2;
    __nv_bfloat16 *x = random_bf16(nx, 11), *w = random_bf16(nw, 12);
    void *y, *y0;
    CUDA_OK(cudaMalloc(&y, ny * esize));
    CUDA_OK(cudaMalloc(&y0, ny * esize));
    if (s.ytype == CUDA_R_32F) { /* beta = 1 accumulates onto a random x, as the residual does */
        __nv_bfloat16 *r = random_bf16(ny, 13);
        std::vector<float> h = host_floats(r, ny, CUDA_R_16BF);
        CUDA_OK(cudaMemcpy(y0, h.data(), ny * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaFree(r));
    } else {
        CUDA_OK(cudaMemset(y0, 0, ny * esize));
    }
    const float alpha = 1.0f;
    auto gemmex = [&] {
        CUBLAS_OK(cublasGemmEx(cx.blas, CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.n, s.in, &alpha, w, CUDA_R_16BF, s.in, x,
                               CUDA_R_16BF, s.in, &s.beta, y, s.ytype, s.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    CUDA_OK(cudaMemcpy(y, y0, ny * esize, cudaMemcpyDeviceToDevice));
    gemmex();
    std::vector<float> want = host_floats(y, ny, s.ytype);
    const double flop = 2.0 * s.n * (double)s.in * s.out;
    double ms = time_ms(gemmex);
    line(s.name, "gemmex (matmul.cu today)", ms, flop, "");
    lt_problem p = lt_make(s, s.out, 1, 0, 0, 0);
    lt_cases(cx, s, s.name, p, w, x, y, y0, ny, want, flop, ms);
    lt_free(p);
    for (void *p : {(void *)x, (void *)w, y, y0}) CUDA_OK(cudaFree(p));
}

/* Q, K, V: three products of one bf16 input, float32 out, beta 0. */
static void qkv_shape(context &cx, int n, int D, int W)
{
    const size_t nx = (size_t)n * D, nw = (size_t)W * D, ny = (size_t)n * W;
    __nv_bfloat16 *x = random_bf16(nx, 21), *w3 = random_bf16(3 * nw, 22); /* wq|wk|wv contiguous */
    float *y3, *y0, *wide;
    CUDA_OK(cudaMalloc(&y3, 3 * ny * 4)); /* q|k|v contiguous, n*W apart */
    CUDA_OK(cudaMalloc(&y0, 3 * ny * 4));
    CUDA_OK(cudaMalloc(&wide, 3 * ny * 4)); /* [n, 3W] */
    CUDA_OK(cudaMemset(y0, 0xff, 3 * ny * 4)); /* NaN: beta 0 must not read it */
    const float alpha = 1.0f, beta = 0.0f;
    const double flop = 3 * 2.0 * n * (double)D * W;
    char label[64];
    std::snprintf(label, sizeof label, "QKV 3x in=%d out=%d f32 b=0", D, W);

    auto three = [&] {
        for (int i = 0; i < 3; i++)
            CUBLAS_OK(cublasGemmEx(cx.blas, CUBLAS_OP_T, CUBLAS_OP_N, W, n, D, &alpha, w3 + i * nw, CUDA_R_16BF, D, x,
                                   CUDA_R_16BF, D, &beta, y3 + i * ny, CUDA_R_32F, W, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    };
    CUDA_OK(cudaMemcpy(y3, y0, 3 * ny * 4, cudaMemcpyDeviceToDevice));
    three();
    std::vector<float> want = host_floats(y3, 3 * ny, CUDA_R_32F);
    double ms3 = time_ms(three);
    line(label, "3x gemmex (matmul.cu today)", ms3, flop, "");

    auto batched = [&] {
        CUBLAS_OK(cublasGemmStridedBatchedEx(cx.blas, CUBLAS_OP_T, CUBLAS_OP_N, W, n, D, &alpha, w3, CUDA_R_16BF, D,
                                             (long long)nw, x, CUDA_R_16BF, D, 0, &beta, y3, CUDA_R_32F, W,
                                             (long long)ny, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    CUDA_OK(cudaMemcpy(y3, y0, 3 * ny * 4, cudaMemcpyDeviceToDevice));
    batched();
    char extra[128];
    double diff = check_same("QKV strided batched", host_floats(y3, 3 * ny, CUDA_R_32F), want, CUDA_R_32F);
    double msb = time_ms(batched);
    std::snprintf(extra, sizeof extra, "(%+.1f%% vs 3x gemmex; max |diff| %.3g)", 100.0 * (ms3 / msb - 1.0), diff);
    line(label, "strided batched gemmex (3)", msb, flop, extra);

    /* the same batch through Lt, every heuristic algorithm */
    shape s = {label, n, D, W, CUDA_R_32F, 0.0f};
    lt_problem p = lt_make(s, W, 3, (long long)nw, 0, (long long)ny);
    char lt_label[80];
    std::snprintf(lt_label, sizeof lt_label, "%s batch3", label);
    lt_cases(cx, s, lt_label, p, w3, x, y3, y0, 3 * ny, want, flop, ms3);
    lt_free(p);

    /* one GEMM of out=3W into [n, 3W]: a different layout, here only to compare rates */
    auto one_wide = [&] {
        CUBLAS_OK(cublasGemmEx(cx.blas, CUBLAS_OP_T, CUBLAS_OP_N, 3 * W, n, D, &alpha, w3, CUDA_R_16BF, D, x,
                               CUDA_R_16BF, D, &beta, wide, CUDA_R_32F, 3 * W, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
    };
    one_wide();
    {
        std::vector<float> got = host_floats(wide, 3 * ny, CUDA_R_32F), re(3 * ny);
        for (int r = 0; r < n; r++)
            for (int j = 0; j < 3; j++)
                std::memcpy(&re[j * ny + (size_t)r * W], &got[(size_t)r * 3 * W + j * W], W * 4);
        diff = check_same("QKV one wide GEMM", re, want, CUDA_R_32F);
    }
    double msw = time_ms(one_wide);
    std::snprintf(extra, sizeof extra, "(%+.1f%% vs 3x gemmex; max |diff| %.3g)", 100.0 * (ms3 / msw - 1.0), diff);
    line(label, "one gemmex out=3W [n,3W]", msw, flop, extra);
    shape sw = {label, n, D, 3 * W, CUDA_R_32F, 0.0f};
    lt_problem pw = lt_make(sw, 3 * W, 1, 0, 0, 0);
    std::vector<float> want_wide = host_floats(wide, 3 * ny, CUDA_R_32F);
    std::snprintf(lt_label, sizeof lt_label, "%s wide", label);
    lt_cases(cx, sw, lt_label, pw, w3, x, wide, y0, 3 * ny, want_wide, flop, ms3);
    lt_free(pw);
    for (void *p : {(void *)x, (void *)w3, (void *)y3, (void *)y0, (void *)wide}) CUDA_OK(cudaFree(p));
}

int main(int argc, char **argv)
{
    int n = 8192;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--n")) n = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "usage: bench_gemm_shapes [--reps R] [--n ROWS]\n");
            return 2;
        }
    }
    if (reps < 1 || n < 1) {
        std::fprintf(stderr, "bench_gemm_shapes: --reps and --n must be positive\n");
        return 2;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    context cx;
    CUBLAS_OK(cublasCreate(&cx.blas));
    CUBLAS_OK(cublasLtCreate(&cx.lt));
    CUDA_OK(cudaMalloc(&cx.workspace, WORKSPACE_BYTES));
    CUBLAS_OK(cublasSetWorkspace(cx.blas, cx.workspace, WORKSPACE_BYTES)); /* as cuda_backend.cu does */
    std::printf("bench_gemm_shapes on %s, cuBLAS %d, n=%d, median of %d runs after 5 warm-up\n", prop.name,
                (int)cublasLtGetVersion(), n, reps);
    const int D = 1024, W = 1024, F = 4096;
    qkv_shape(cx, n, D, W);
    const shape singles[] = {
        {"QKV one in=1024 out=1024 f32 b=0", n, D, W, CUDA_R_32F, 0.0f},
        {"O in=1024 out=1024 f32 b=1", n, W, D, CUDA_R_32F, 1.0f},
        {"W2 in=4096 out=1024 f32 b=1", n, F, D, CUDA_R_32F, 1.0f},
        {"W1|W3 in=1024 out=8192 bf16", n, D, 2 * F, CUDA_R_16BF, 0.0f},
    };
    for (const shape &s : singles) single_shape(cx, s);
    cudaFree(cx.workspace);
    cublasLtDestroy(cx.lt);
    cublasDestroy(cx.blas);
    if (failures) {
        std::printf("bench_gemm_shapes: %d result checks FAILED\n", failures);
        return 1;
    }
    std::printf("bench_gemm_shapes: all Lt/batched results match cublasGemmEx\n");
    return 0;
}
