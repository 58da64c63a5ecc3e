/* Dense causal attention over 2048-row windows (16 heads, d = 64, bf16 q/k/v) two ways:
 *
 *   product:  the product's wgmma kernel (sf_cuda_attention_wgmma) on one branch 2048:1 without
 *             global tokens, q/k/v read in place, as bench_attention_variants times "dense 2048
 *             causal";
 *   pingpong: the lab's persistent, warp-specialized kernel (attention_pingpong_dense.cu) with 2, 3
 *             and 4 K/V stages.
 *
 * Checks each pingpong form against the product on the same inputs (relative L2 difference of
 * the outputs within 1e-2: both round P to bf16, in different tile orders; an element the kernel
 * never writes stays NaN and fails), then times both: median of `reps` calls after warm-up, CUDA
 * events, useful TFLOP/s (each causal pair once). Two sizes: 64 windows (n = 8192, the reference
 * segment's branch 2048:1) and 112 windows (n = 14336: the reference branches' work, where
 * cuDNN was measured at its best). Exit status 1 when a check fails.
 * Usage: bench_cuda_attention_pingpong [reps] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "bench/cuda_check.h"
#include "bench/event_timing.cuh"
#include "bench/gemm_bench_common.cuh"
#include "bench/lab/lab_kernels.h"
extern "C" { /* the CPU kernels' headers are plain C */
#include "kernels/cpu/attention.h"
}
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

static int failures = 0;

static double rel_diff(const float *a_dev, const float *b_dev, size_t count, size_t *nonfinite)
{
    std::vector<float> a(count), b(count);
    CUDA_OK(cudaMemcpy(a.data(), a_dev, count * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), b_dev, count * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    *nonfinite = 0;
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(b[i])) (*nonfinite)++;
        const double e = (double)b[i] - a[i];
        num += e * e, den += (double)a[i] * a[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static void one_size(int windows, int reps)
{
    const int heads = 16, d = 64, win = 2048, n = windows / heads * win, ld = heads * d;
    const size_t cnt = (size_t)n * ld;
    __nv_bfloat16 *q = random_bf16(cnt, 11, 4.0f), *k = random_bf16(cnt, 12, 4.0f), *v = random_bf16(cnt, 13, 1.0f);
    float *ref, *got;
    CUDA_OK(cudaMalloc(&ref, cnt * sizeof(float)));
    CUDA_OK(cudaMalloc(&got, cnt * sizeof(float)));
    const sf_branch branch = {win, 1};
    sf_attention_desc dd = {};
    dd.n = dd.segment = n, dd.heads = heads, dd.head_dim = d, dd.ld = ld, dd.causal = 1;
    dd.n_branches = 1, dd.branches = &branch, dd.scale = 1.0f / sqrtf((float)d), dd.qkv_type = SF_DTYPE_BF16;
    const size_t ws_bytes = sf_cuda_attention_workspace_bytes(&dd);
    void *ws;
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    CUDA_OK(cudaDeviceSynchronize());
    const double flops = sf_attention_useful_flops(&dd);
    auto product = [&] {
        if (sf_cuda_attention_wgmma(&dd, q, k, v, ref, NULL, ws, ws_bytes, 0) != SF_OK) {
            fprintf(stderr, "product kernel failed: %s\n", sf_last_error());
            exit(2);
        }
    };
    product();
    CUDA_OK(cudaDeviceSynchronize());
    printf("%3d windows (n = %5d)  %-28s %10s %10s %10s %12s\n", windows, n, "kernel", "median ms", "min ms",
           "TFLOP/s", "rel. diff");
    for (int stages = 2; stages <= 4; stages++) {
        CUDA_OK(cudaMemset(got, 0xff, cnt * sizeof(float))); /* NaN until written */
        const int rc = sf_lab_attention_pingpong(n, heads, win, q, k, v, ld, got, ld, stages, 0);
        CUDA_OK(cudaDeviceSynchronize());
        size_t bad = 0;
        const double rel = rc == SF_OK ? rel_diff(ref, got, cnt, &bad) : 1.0;
        const bool ok = rc == SF_OK && bad == 0 && rel <= 1e-2;
        failures += !ok;
        char name[64];
        snprintf(name, sizeof name, "pingpong, %d stages", stages);
        if (!ok) {
            printf("%-40s %-28s FAIL (%s, rel. diff %.3e, %zu non-finite)\n", "", name,
                   rc == SF_OK ? "ran" : sf_last_error(), rel, bad);
            continue;
        }
        const std::vector<float> ms = event_times_ms(reps, [&] {
            sf_lab_attention_pingpong(n, heads, win, q, k, v, ld, got, ld, stages, 0);
        });
        printf("%-40s %-28s %10.3f %10.3f %10.1f %12.3e\n", "", name, ms[ms.size() / 2], ms[0],
               flops / (ms[ms.size() / 2] * 1e-3) / 1e12, rel);
    }
    const std::vector<float> ms = event_times_ms(reps, product);
    printf("%-40s %-28s %10.3f %10.3f %10.1f\n", "", "product (wgmma kernel)", ms[ms.size() / 2], ms[0],
           flops / (ms[ms.size() / 2] * 1e-3) / 1e12);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(ref), cudaFree(got), cudaFree(ws);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 30;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("skipped: no GPU\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    one_size(64, reps);
    one_size(112, reps);
    printf("checks: %d failed\n", failures);
    return failures ? 1 : 0;
}
