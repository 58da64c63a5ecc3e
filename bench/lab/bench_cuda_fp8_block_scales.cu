/* Does cuBLASLt run e4m3 products with 1 x 128 block scales (a float32 scale for each 128
 * values along K) on this GPU, for the MLP's down product, and how fast against the
 * outer-vector scales (one per row, one per channel) the product uses today? A kernel that
 * writes g already quantized can only give a scale per block of the columns it owns.
 *
 *   bench_cuda_fp8_block_scales [--n N] [--in K] [--out M] [--reps R]
 *
 * The product of precision fp8's W2 (default n = 8192 rows of g, in = 4096, out = 1024):
 * D[n, out] = sum_k g[n, k] sg(n, k / 128) W[out, k] sw(out, k / 128) + D (float32, beta 1),
 * A = W (TRANSA), B = g. For each scale mode pair (A, B) in {(VEC128, VEC128),
 * (BLK128x128, VEC128), (OUTER_VEC, OUTER_VEC)} and the two ways a scale tensor could be laid
 * out (the block index outer: s[kb * rows + r]; or inner: s[r * KB + kb]), random
 * scales (each operand's layout either way) are checked against a plain float32 kernel on the same operands (worst
 * relative error over all outputs, against the output's largest magnitude), then the fastest offered algorithm is timed
 * (median of R, CUDA events). Prints one line a case and "RESULT outer_us=... vec128_us=... (or none)" last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "bench/cuda_check.h"

enum { OUTER = 0, VEC128 = 1, BLK = 2 };
static const char *const mode_name[] = {"OUTER_VEC", "VEC128", "BLK128x128"};

/* The scale of operand element (r, k): by mode and layout (0: block index outer, 1: inner). */
__host__ __device__ static inline size_t scale_index(int mode, int layout, int rows, int k_blocks, int r, int k)
{
    const int kb = k / 128;
    if (mode == OUTER) return (size_t)r;
    const int rr = mode == BLK ? r / 128 : r, nr = mode == BLK ? (rows + 127) / 128 : rows;
    return layout == 0 ? (size_t)kb * nr + rr : (size_t)rr * k_blocks + kb;
}

__global__ static void reference_kernel(int n, int in, int out, const __nv_fp8_e4m3 *g, const float *sg, int g_mode,
                                        const __nv_fp8_e4m3 *w, const float *sw, int w_mode, int layouts,
                                        const float *d0, float *d)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= out) return;
    const int kb = (in + 127) / 128;
    float acc = 0.0f;
    for (int k = 0; k < in; k++)
        acc += (float)g[(size_t)r * in + k] * sg[scale_index(g_mode, layouts & 1, n, kb, r, k)] *
               (float)w[(size_t)c * in + k] * sw[scale_index(w_mode, layouts >> 1, out, kb, c, k)];
    d[(size_t)r * out + c] = acc + d0[(size_t)r * out + c];
}

static size_t scale_count(int mode, int rows, int in)
{
    const size_t kb = (size_t)(in + 127) / 128;
    return mode == OUTER ? (size_t)rows : mode == BLK ? kb * ((rows + 127) / 128) : kb * rows;
}

struct Product {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t a = NULL, b = NULL, c = NULL;
    cublasLtMatmulHeuristicResult_t found[8];
    int count = 0;
};

static cublasStatus_t describe(cublasLtHandle_t lt, Product *p, int n, int in, int out, int w_mode, int g_mode,
                               const float *sw, const float *sg, size_t workspace)
{
    static const int32_t lt_mode[] = {CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F,
                                      CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                                      CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F};
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasStatus_t st = cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (!st) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    if (!st) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if (!st)
        st =
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &lt_mode[w_mode], sizeof(int32_t));
    if (!st)
        st =
            cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &lt_mode[g_mode], sizeof(int32_t));
    if (!st) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
    if (!st) st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sg, sizeof sg);
    if (!st) st = cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, in, out, in);
    if (!st) st = cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, in, n, in);
    if (!st) st = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, out, n, out);
    cublasLtMatmulPreference_t pref = NULL;
    if (!st) st = cublasLtMatmulPreferenceCreate(&pref);
    if (!st)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                  sizeof workspace);
    if (!st) st = cublasLtMatmulAlgoGetHeuristic(lt, p->op, p->a, p->b, p->c, p->c, pref, 8, p->found, &p->count);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

static void release(Product *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
}

int main(int argc, char **argv)
{
    int n = 8192, in = 4096, out = 1024, reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--in"))
            in = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--out"))
            out = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--n N] [--in K] [--out M] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s (%d.%d), cuBLASLt %zu, product n=%d in=%d out=%d\n", prop.name, prop.major, prop.minor,
           cublasLtGetVersion(), n, in, out);

    /* operands: e4m3 values of uniform(-2, 2); scales uniform(0.25, 4) */
    srand(7);
    std::vector<__nv_fp8_e4m3> hg((size_t)n * in), hw((size_t)out * in);
    for (auto &v : hg) v = __nv_fp8_e4m3(4.0f * rand() / RAND_MAX - 2.0f);
    for (auto &v : hw) v = __nv_fp8_e4m3(4.0f * rand() / RAND_MAX - 2.0f);
    const size_t max_scales = scale_count(VEC128, std::max(n, out), in);
    std::vector<float> hs(max_scales);
    for (auto &v : hs) v = 0.25f + 3.75f * rand() / RAND_MAX;
    std::vector<float> hd0((size_t)n * out);
    for (auto &v : hd0) v = 2.0f * rand() / RAND_MAX - 1.0f;

    __nv_fp8_e4m3 *g, *w;
    float *sg, *sw, *d0, *d, *ref;
    const size_t workspace = 64u << 20;
    void *ws;
    CUDA_OK(cudaMalloc(&g, hg.size()));
    CUDA_OK(cudaMalloc(&w, hw.size()));
    CUDA_OK(cudaMalloc(&sg, max_scales * 4));
    CUDA_OK(cudaMalloc(&sw, max_scales * 4));
    CUDA_OK(cudaMalloc(&d0, hd0.size() * 4));
    CUDA_OK(cudaMalloc(&d, hd0.size() * 4));
    CUDA_OK(cudaMalloc(&ref, hd0.size() * 4));
    CUDA_OK(cudaMalloc(&ws, workspace));
    CUDA_OK(cudaMemcpy(g, hg.data(), hg.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(w, hw.data(), hw.size(), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sg, hs.data(), max_scales * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(sw, hs.data() + 1, (max_scales - 1) * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d0, hd0.data(), hd0.size() * 4, cudaMemcpyHostToDevice));

    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 2;
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    const int cases[3][2] = {{OUTER, OUTER}, {VEC128, VEC128}, {BLK, VEC128}};
    float best_us[3] = {-1, -1, -1};
    std::vector<float> hr(hd0.size()), hdv(hd0.size());
    for (int ci = 0; ci < 3; ci++) {
        const int w_mode = cases[ci][0], g_mode = cases[ci][1];
        Product p;
        cublasStatus_t st = describe(lt, &p, n, in, out, w_mode, g_mode, sw, sg, workspace);
        printf("A %s, B %s: heuristic status %d, %d algorithms\n", mode_name[w_mode], mode_name[g_mode], (int)st,
               p.count);
        if (st || p.count == 0) {
            release(&p);
            continue;
        }
        const float alpha = 1.0f, beta = 1.0f;
        /* layouts: bit 0 B's (g's) scale layout, bit 1 A's (W's) */
        for (int layouts = 0; layouts < (w_mode == OUTER && g_mode == OUTER ? 1 : 4); layouts++) {
            reference_kernel<<<dim3((out + 127) / 128, n), 128>>>(n, in, out, g, sg, g_mode, w, sw, w_mode, layouts, d0,
                                                                  ref);
            CUDA_OK(cudaMemcpy(d, d0, hd0.size() * 4, cudaMemcpyDeviceToDevice));
            st = cublasLtMatmul(lt, p.op, &alpha, w, p.a, g, p.b, &beta, d, p.c, d, p.c, &p.found[0].algo, ws,
                                workspace, 0);
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(hr.data(), ref, hr.size() * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hdv.data(), d, hdv.size() * 4, cudaMemcpyDeviceToHost));
            double amax = 0, worst = 0;
            for (size_t i = 0; i < hr.size(); i++) amax = std::max(amax, (double)fabsf(hr[i]));
            for (size_t i = 0; i < hr.size(); i++) worst = std::max(worst, (double)fabsf(hr[i] - hdv[i]));
            printf("  A's block index %s, B's %s: matmul status %d, worst error %.3e of the largest output %.3e "
                   "(%.2e)\n",
                   layouts & 2 ? "inner" : "outer", layouts & 1 ? "inner" : "outer", (int)st, worst, amax,
                   worst / amax);
        }
        for (int a = 0; a < p.count; a++) {
            std::vector<float> ms;
            for (int r = 0; r <= reps; r++) {
                CUDA_OK(cudaEventRecord(e0));
                st = cublasLtMatmul(lt, p.op, &alpha, w, p.a, g, p.b, &beta, d, p.c, d, p.c, &p.found[a].algo, ws,
                                    workspace, 0);
                CUDA_OK(cudaEventRecord(e1));
                CUDA_OK(cudaEventSynchronize(e1));
                float t;
                CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
                if (r > 0) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const float us = 1000.0f * ms[ms.size() / 2];
            printf("  algorithm %d: status %d, median %.1f us, %.0f TFLOP/s\n", a, (int)st, us,
                   2.0 * n * in * out / (us * 1e-6) / 1e12);
            if (st == CUBLAS_STATUS_SUCCESS && (best_us[ci] < 0 || us < best_us[ci])) best_us[ci] = us;
        }
        release(&p);
    }
    printf("RESULT outer_us=%.1f vec128_us=%.1f blk_vec128_us=%.1f\n", best_us[0], best_us[1], best_us[2]);
    cublasLtDestroy(lt);
    return 0;
}
