/* x[n, out] += a[n, in] w^T (float32 x, bf16 a and w) two ways on the CUDA backend:
 *
 *   cuBLAS:  the backend's product with beta = 1 (sf_cuda_gemm: the cuBLASLt algorithm it times
 *            fastest for the shape), as the W2 and output products ran before;
 *   kernel:  residual_product.cu (TMA + wgmma, the tile added into x by the copy engine).
 *
 * Checks the kernel's contribution (x after minus x before) against cuBLAS's on random operands,
 * per element within 1e-3 of the contribution's scale (both sum in float32, in different
 * orders), so an element the kernel fails to add to fails, for several shapes with partial
 * tiles; then times both at the reference model's W2 (n = 8192, in = 4096, out = 1024) and
 * output-product (in = 1024) shapes: median of `reps` calls after warm-up, CUDA events on the
 * backend's stream, each call alone (x keeps accumulating; the time does not depend on its
 * values). Exit status 1 when a check fails. Usage: bench_cuda_residual_product [reps] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "bench/cuda_bench_backend.cuh"
#include "bench/cuda_check.h"
#include "bench/event_timing.cuh"
#include "bench/gemm_bench_common.cuh"
#include "bench/lab/lab_kernels.h"

static int failures = 0;

static float *upload(const std::vector<float> &h)
{
    float *d;
    CUDA_OK(cudaMalloc(&d, h.size() * sizeof(float)));
    CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> download(const float *d, size_t count)
{
    std::vector<float> h(count);
    CUDA_OK(cudaMemcpy(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static void one_shape(sf_cuda *c, const char *name, int n, int in, int out, int reps)
{
    __nv_bfloat16 *a = random_bf16((size_t)n * in, 1 + n, 2.0f), *w = random_bf16((size_t)out * in, 2 + in, 0.1f);
    std::vector<float> x0((size_t)n * out);
    srand(3);
    for (float &v : x0) v = rand() / (float)RAND_MAX - 0.5f;
    float *x_blas = upload(x0), *x_kernel = upload(x0);
    CUDA_OK(cudaDeviceSynchronize()); /* filled on the default stream; the backend's stream need not wait for it */
    const sf_cuda_gemm_args g = {n, in, out, out, 1, 0, 0, a, w, x_blas, CUDA_R_32F, 1.0f};
    auto blas = [&] {
        if (sf_cuda_gemm(c, &g, "residual (cuBLAS)") != SF_OK) {
            fprintf(stderr, "cuBLAS path failed: %s\n", sf_last_error());
            exit(2);
        }
    };
    auto kernel = [&] {
        if (sf_lab_residual_product(n, in, out, a, w, x_kernel, c->stream) != SF_OK) {
            fprintf(stderr, "kernel failed: %s\n", sf_last_error());
            exit(2);
        }
    };
    blas();
    kernel();
    CUDA_OK(cudaStreamSynchronize(c->stream));
    CUDA_OK(cudaGetLastError());
    const std::vector<float> hb = download(x_blas, x0.size()), hk = download(x_kernel, x0.size());
    double scale = 0, worst = 0;
    for (size_t i = 0; i < x0.size(); i++) scale = std::max(scale, fabs((double)hb[i] - x0[i]));
    size_t bad = 0;
    for (size_t i = 0; i < x0.size(); i++) {
        const double e = fabs(((double)hk[i] - x0[i]) - ((double)hb[i] - x0[i])) / (scale > 0 ? scale : 1);
        if (!(e <= 1e-3)) bad++;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    printf("check %-10s n=%-5d in=%-5d out=%-5d kernel vs cuBLAS: max error %.3g of the product's scale %.3g, %zu "
           "elements over 1e-3: %s\n",
           name, n, in, out, worst, scale, bad, bad ? "FAIL" : "ok");
    if (bad) failures++;
    if (reps > 0) {
        const double flop = 2.0 * n * (double)in * out;
        const double t_blas = median_event_ms(reps, blas, c->stream), t_kernel = median_event_ms(reps, kernel, c->stream);
        printf("time  %s n=%d in=%d out=%d (median of %d): cuBLAS (beta 1) %.4f ms %.1f TFLOP/s; residual_product "
               "%.4f ms %.1f TFLOP/s (%+.1f%%)\n",
               name, n, in, out, reps, t_blas, flop / t_blas / 1e9, t_kernel, flop / t_kernel / 1e9,
               100.0 * (t_blas / t_kernel - 1.0));
    }
    for (void *p : {(void *)a, (void *)w, (void *)x_blas, (void *)x_kernel}) CUDA_OK(cudaFree(p));
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    setvbuf(stdout, NULL, _IOLBF, 0);
    sf_backend *be = NULL;
    int exit_code = 0;
    sf_cuda *c = bench_cuda_open(&be, &exit_code);
    if (!c) return exit_code;
    if (!sf_lab_residual_product_usable(1024, 1024)) {
        printf("skipped: residual_product needs an sm_90 device\n");
        bench_cuda_close(be);
        return 0;
    }
    one_shape(c, "partial", 300, 256, 384, 0);
    one_shape(c, "partial", 129, 512, 136, 0);
    one_shape(c, "partial", 77, 72, 8, 0);
    one_shape(c, "W2", 8192, 4096, 1024, reps);
    one_shape(c, "O", 8192, 1024, 1024, reps);
    bench_cuda_close(be);
    printf("%s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
