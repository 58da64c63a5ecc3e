/* The MLP's first half, g = silu(u W1^T) * (u W3^T), two ways on the CUDA backend:
 *
 *   composed: the backend's W1|W3 product (sf_cuda_gemm: the cuBLASLt algorithm it times fastest
 *             for the shape) into [n, 2F] bf16, then the SwiGLU pass (swiglu_rows_bf16);
 *   fused:    the product's kernel (TMA + wgmma, SwiGLU in the epilogue, g written directly) and
 *             its tried schedules, from the lab's copy (swiglu_gate_up_variants.cu): cooperative
 *             in clusters of 1 (the product's), 2 and 4 CTAs, and pingpong.
 *
 * Also checks and times the lab's swiglu_w2.cu (SwiGLU folded into the W2 product) where the
 * shape suits it (D % 256, F % 128), against the SwiGLU pass and cuBLAS's W2.
 *
 * Checks the fused g against the composed one on random operands (g poisoned with NaN before
 * every checked call, so an element it fails to write fails; the two differ by the composed
 * path's rounding of W1 u and W3 u to bf16: relative error <= 2e-2 of the output's scale), for
 * several shapes including partial tiles, then times both at the reference model's shape (n =
 * 8192, D = 1024, F = 4096): median of `reps` calls after warm-up, CUDA events on the backend's
 * stream, each call timed alone. TFLOP/s count the products' 2 n D 2F. Exit status 1 when a
 * check fails. Then the product's own kernels (bf16, and the two e4m3 forms of precision fp8) at
 * the same shape: product_kernels below. Usage: bench_cuda_swiglu_gate_up [reps] (0: the checks
 * alone) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
#include <cuda_fp8.h>

#include "bench/cuda_bench_backend.cuh"
#include "bench/cuda_check.h"
#include "bench/event_timing.cuh"
#include "bench/gemm_bench_common.cuh"
#include "bench/lab/lab_kernels.h"

static int failures = 0;

static std::vector<float> to_host(const __nv_bfloat16 *d, size_t count)
{
    std::vector<__nv_bfloat16> h(count);
    CUDA_OK(cudaMemcpy(h.data(), d, count * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(count);
    for (size_t i = 0; i < count; i++) f[i] = __bfloat162float(h[i]);
    return f;
}

/* swiglu_w2.cu: x += (silu(h1) * h3) W2^T from the composed path's h = [h1 | h3] against cuBLAS's
 * W2 product (beta = 1) of that path's g = silu(h1) * h3. Both add to the same random x; the
 * contributions (x after minus x before) must agree within 2e-2 of their scale (the lab kernel
 * rounds silu(h1) * h3 from float32 itself, cuBLAS reads the pass's bf16 g), so an element the
 * kernel fails to add to is off by its whole contribution. With reps, times both (the composed
 * side: the W2 product alone, g already there). */
static void check_swiglu_w2(sf_cuda *c, int n, int D, int F, const __nv_bfloat16 *h, const __nv_bfloat16 *g, int reps)
{
    __nv_bfloat16 *w2 = random_bf16((size_t)D * F, 3 + D, 0.2f);
    const size_t nx = (size_t)n * D;
    std::vector<float> x0(nx);
    for (size_t i = 0; i < nx; i++) x0[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    float *x_blas, *x_lab;
    CUDA_OK(cudaMalloc(&x_blas, nx * 4));
    CUDA_OK(cudaMalloc(&x_lab, nx * 4));
    CUDA_OK(cudaMemcpy(x_blas, x0.data(), nx * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(x_lab, x0.data(), nx * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* filled on the default stream */
    const sf_cuda_gemm_args g2 = {n, F, D, D, 1, 0, 0, g, w2, x_blas, CUDA_R_32F, 1.0f};
    if (sf_cuda_gemm(c, &g2, "W2") != SF_OK || sf_lab_swiglu_w2(n, D, F, h, w2, x_lab, c->stream) != SF_OK) {
        fprintf(stderr, "swiglu_w2 check failed to run: %s\n", sf_last_error());
        exit(2);
    }
    CUDA_OK(cudaStreamSynchronize(c->stream));
    std::vector<float> a(nx), b(nx);
    CUDA_OK(cudaMemcpy(a.data(), x_lab, nx * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), x_blas, nx * 4, cudaMemcpyDeviceToHost));
    double scale = 0, worst = 0;
    for (size_t i = 0; i < nx; i++) scale = std::max(scale, fabs((double)b[i] - x0[i]));
    size_t bad = 0;
    for (size_t i = 0; i < nx; i++) {
        const double e = fabs(((double)a[i] - x0[i]) - ((double)b[i] - x0[i])) / (scale > 0 ? scale : 1);
        if (!(e <= 2e-2)) bad++;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    printf("check n=%-5d D=%-5d F=%-5d swiglu_w2 vs SwiGLU pass + cuBLAS W2: max error %.3g of the contribution "
           "scale %.3g, %zu elements over 2e-2: %s\n",
           n, D, F, worst, scale, bad, bad ? "FAIL" : "ok");
    if (bad) failures++;
    if (reps > 0) {
        const double flop = 2.0 * n * D * F;
        const double t_blas = median_event_ms(
            reps, [&] { (void)sf_cuda_gemm(c, &g2, "W2"); }, c->stream);
        const double t_lab = median_event_ms(
            reps, [&] { (void)sf_lab_swiglu_w2(n, D, F, h, w2, x_lab, c->stream); }, c->stream);
        printf("  W2 product alone (cuBLAS, g given)     %8.4f ms  %6.1f TFLOP/s\n", t_blas, flop / t_blas / 1e9);
        printf("  swiglu_w2 (SwiGLU in the load)         %8.4f ms  %6.1f TFLOP/s\n", t_lab, flop / t_lab / 1e9);
    }
    for (void *p : {(void *)w2, (void *)x_blas, (void *)x_lab}) CUDA_OK(cudaFree(p));
}

/* The variant one_shape's fused path runs (the timing loop sets each in turn). */
static int pingpong_schedule = 0, cluster = 1;

static void one_shape(sf_cuda *c, int n, int D, int F, int reps)
{
    __nv_bfloat16 *u = random_bf16((size_t)n * D, 1 + n, 2.0f), *w13 = random_bf16((size_t)2 * F * D, 2 + F, 0.2f);
    const __nv_bfloat16 *w1 = w13, *w3 = w13 + (size_t)F * D;
    CUDA_OK(cudaDeviceSynchronize()); /* filled on the default stream; the backend's stream need not wait for it */
    __nv_bfloat16 *h, *want, *got;
    CUDA_OK(cudaMalloc(&h, (size_t)n * 2 * F * 2));
    CUDA_OK(cudaMalloc(&want, (size_t)n * F * 2));
    CUDA_OK(cudaMalloc(&got, (size_t)n * F * 2));
    const sf_cuda_gemm_args g = {n, D, 2 * F, 2 * F, 1, 0, 0, u, w13, h, CUDA_R_16BF, 0.0f};
    auto composed = [&] {
        if (sf_cuda_gemm(c, &g, "W1|W3") != SF_OK || sf_cuda_swiglu_rows_bf16(n, F, h, want, c->stream) != SF_OK) {
            fprintf(stderr, "composed path failed: %s\n", sf_last_error());
            exit(2);
        }
    };
    auto fused = [&] {
        if (sf_lab_swiglu_gate_up(n, D, F, u, w1, w3, got, pingpong_schedule, cluster, c->stream) != SF_OK) {
            fprintf(stderr, "fused path failed: %s\n", sf_last_error());
            exit(2);
        }
    };
    composed();
    CUDA_OK(cudaMemsetAsync(got, 0xff, (size_t)n * F * 2, c->stream)); /* bf16 NaN everywhere */
    fused();
    CUDA_OK(cudaStreamSynchronize(c->stream));
    CUDA_OK(cudaGetLastError());
    const std::vector<float> a = to_host(got, (size_t)n * F), b = to_host(want, (size_t)n * F);
    double scale = 0, worst = 0;
    for (float x : b) scale = std::max(scale, (double)fabsf(x));
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const double e = fabs((double)a[i] - b[i]) / (scale > 0 ? scale : 1);
        if (!(e <= 2e-2)) bad++;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    printf("check n=%-5d D=%-5d F=%-5d fused vs composed: max error %.3g of the output scale %.3g, %zu elements over "
           "2e-2: %s\n",
           n, D, F, worst, scale, bad, bad ? "FAIL" : "ok");
    if (bad) failures++;
    /* once a shape: with the product's schedule */
    if (cluster == 1 && !pingpong_schedule && sf_lab_swiglu_w2_usable(D, F)) check_swiglu_w2(c, n, D, F, h, want, reps);
    if (reps > 0) {
        const double flop = 2.0 * n * D * 2.0 * F;
        const double t_comp = median_event_ms(reps, composed, c->stream);
        const double t_gemm = median_event_ms(
            reps, [&] { (void)sf_cuda_gemm(c, &g, "W1|W3"); }, c->stream);
        printf("time  n=%d D=%d F=%d (median of %d)\n", n, D, F, reps);
        printf("  composed: W1|W3 product + SwiGLU pass  %8.4f ms  %6.1f TFLOP/s\n", t_comp, flop / t_comp / 1e9);
        printf("    of which the W1|W3 product alone     %8.4f ms  %6.1f TFLOP/s\n", t_gemm, flop / t_gemm / 1e9);
        pingpong_schedule = 1;
        const double t_ping = median_event_ms(reps, fused, c->stream);
        printf("  fused: swiglu_gate_up, pingpong        %8.4f ms  %6.1f TFLOP/s  (%+.1f%% vs composed)\n", t_ping,
               flop / t_ping / 1e9, 100.0 * (t_comp / t_ping - 1.0));
        pingpong_schedule = 0;
        for (int cl : {1, 2, 4}) {
            cluster = cl;
            const double t_fused = median_event_ms(reps, fused, c->stream);
            printf("  fused: cooperative, cluster %d%s %8.4f ms  %6.1f TFLOP/s  (%+.1f%% vs composed)\n", cl,
                   cl == 1 ? " (default)" : "          ", t_fused, flop / t_fused / 1e9,
                   100.0 * (t_comp / t_fused - 1.0));
        }
        cluster = 1;
    }
    for (void *p : {(void *)u, (void *)w13, (void *)h, (void *)want, (void *)got}) CUDA_OK(cudaFree(p));
}

/* Random e4m3 bytes (finite: NaN's two codes become zero), count of them on the device. */
static unsigned char *random_e4m3(size_t count, unsigned seed)
{
    std::vector<unsigned char> h(count);
    srand(seed);
    for (auto &b : h) {
        b = (unsigned char)(rand() & 0xff);
        if ((b & 0x7f) == 0x7f) b = 0;
    }
    unsigned char *d;
    CUDA_OK(cudaMalloc(&d, count));
    CUDA_OK(cudaMemcpy(d, h.data(), count, cudaMemcpyHostToDevice));
    return d;
}

static float *filled(size_t count, float v)
{
    std::vector<float> h(count, v);
    float *d;
    CUDA_OK(cudaMalloc(&d, count * 4));
    CUDA_OK(cudaMemcpy(d, h.data(), count * 4, cudaMemcpyHostToDevice));
    return d;
}

/* The product's own kernels (kernels/cuda/swiglu_gate_up.cu, not the lab's copy) at one shape:
 * bf16; e4m3 writing g in bf16; e4m3 writing g in e4m3 with a scale a row and 128 columns
 * (precision fp8's form beside a block W2). Checks the e4m3 g against the bf16 g of the same
 * operands (each value within 1/16 of its block's largest magnitude, plus the bf16 rounding)
 * before timing; with reps, median of reps. */
static void product_kernels(sf_cuda *c, int n, int D, int F, int reps)
{
    __nv_bfloat16 *u = random_bf16((size_t)n * D, 11, 2.0f), *w13 = random_bf16((size_t)2 * F * D, 12, 0.2f);
    unsigned char *u8 = random_e4m3((size_t)n * D, 13), *w8 = random_e4m3((size_t)2 * F * D, 14), *g8;
    float *su = filled(n, 1.0f / 64), *sw = filled((size_t)2 * F, 1.0f / 256), *gs;
    __nv_bfloat16 *g;
    CUDA_OK(cudaMalloc(&g, (size_t)n * F * 2));
    CUDA_OK(cudaMalloc(&g8, (size_t)n * F));
    CUDA_OK(cudaMalloc(&gs, (size_t)n * (F / 128) * 4));
    CUDA_OK(cudaDeviceSynchronize());
    const unsigned char *w1 = w8, *w3 = w8 + (size_t)F * D;
    auto bf16 = [&] { return sf_cuda_swiglu_gate_up(n, D, F, u, w13, w13 + (size_t)F * D, g, c->stream); };
    auto e4m3 = [&] { return sf_cuda_swiglu_gate_up_e4m3(n, D, F, u8, su, w1, w3, sw, sw + F, g, c->stream); };
    auto blocks = [&] {
        return sf_cuda_swiglu_gate_up_e4m3_blocks(n, D, F, u8, su, w1, w3, sw, sw + F, g8, gs, c->stream);
    };
    /* NaN in every byte of g8 and every scale: an element the kernel fails to write fails */
    CUDA_OK(cudaMemsetAsync(g8, 0x7f, (size_t)n * F, c->stream));
    CUDA_OK(cudaMemsetAsync(gs, 0xff, (size_t)n * (F / 128) * 4, c->stream));
    const int ran = e4m3() == SF_OK && blocks() == SF_OK;
    CUDA_OK(cudaStreamSynchronize(c->stream));
    if (!ran) {
        printf("product kernels n=%d D=%d F=%d: did not run (%s): FAIL\n", n, D, F, sf_last_error());
        failures++;
    } else {
        const std::vector<float> want = to_host(g, (size_t)n * F);
        std::vector<unsigned char> q((size_t)n * F);
        std::vector<float> scales((size_t)n * (F / 128));
        CUDA_OK(cudaMemcpy(q.data(), g8, q.size(), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(scales.data(), gs, scales.size() * 4, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        double worst = 0;
        for (int r = 0; r < n; r++)
            for (int b = 0; b < F / 128; b++) {
                double amax = 0;
                for (int j = 0; j < 128; j++) amax = std::max(amax, (double)fabsf(want[(size_t)r * F + b * 128 + j]));
                const float s = scales[(size_t)b * n + r];
                for (int j = 0; j < 128; j++) {
                    const size_t at = (size_t)r * F + b * 128 + j;
                    __nv_fp8_e4m3 v;
                    v.__x = q[at];
                    const double e = fabs((double)(float)v * s - want[at]) / (amax > 0 ? amax : 1);
                    if (!(e <= 1.0 / 16 + 1.0 / 128)) bad++;
                    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                }
            }
        printf("check n=%-5d D=%-5d F=%-5d product e4m3, g in blocks vs g in bf16: max error %.3g of the block's "
               "largest, %zu over 1/16 + 1/128: %s\n",
               n, D, F, worst, bad, bad ? "FAIL" : "ok");
        if (bad) failures++;
    }
    if (reps > 0) {
        const double flop = 2.0 * n * D * 2.0 * F;
        const double t_bf16 = median_event_ms(reps, bf16, c->stream);
        const double t_e4m3 = median_event_ms(reps, e4m3, c->stream);
        const double t_blocks = median_event_ms(reps, blocks, c->stream);
        printf("time  product kernels n=%d D=%d F=%d (median of %d)\n", n, D, F, reps);
        printf("  bf16                                   %8.4f ms  %6.1f TFLOP/s\n", t_bf16, flop / t_bf16 / 1e9);
        printf("  e4m3, g in bf16                        %8.4f ms  %6.1f TFLOP/s\n", t_e4m3, flop / t_e4m3 / 1e9);
        printf("  e4m3, g in e4m3 (blocks of 128)        %8.4f ms  %6.1f TFLOP/s\n", t_blocks, flop / t_blocks / 1e9);
    }
    for (void *p :
         {(void *)u, (void *)w13, (void *)u8, (void *)w8, (void *)su, (void *)sw, (void *)g, (void *)g8, (void *)gs})
        CUDA_OK(cudaFree(p));
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out as it is printed, even when killed */
    sf_backend *be = NULL;
    int exit_code = 0;
    sf_cuda *c = bench_cuda_open(&be, &exit_code);
    if (!c) return exit_code;
    if (!sf_lab_swiglu_gate_up_usable(1024, 4096)) {
        printf("skipped: swiglu_gate_up needs an sm_90 device\n");
        bench_cuda_close(be);
        return 0;
    }
    const int shapes[][3] = {{300, 256, 384}, {129, 512, 128}, {1000, 1024, 4096}, {77, 72, 200}, {8192, 1024, 4096}};
    printf("clusters resident at once: %d of 1 CTA, %d of 2, %d of 4\n", sf_lab_swiglu_gate_up_clusters(1),
           sf_lab_swiglu_gate_up_clusters(2), sf_lab_swiglu_gate_up_clusters(4));
    /* every cluster size on every shape */
    for (int cl : {1, 4, 2}) {
        cluster = cl;
        printf("cooperative, cluster %d:\n", cl);
        for (const auto &s : shapes) one_shape(c, s[0], s[1], s[2], 0);
    }
    cluster = 1;
    pingpong_schedule = 1;
    printf("pingpong:\n");
    for (const auto &s : shapes) one_shape(c, s[0], s[1], s[2], 0);
    pingpong_schedule = 0;
    one_shape(c, 8192, 1024, 4096, reps);
    product_kernels(c, 300, 256, 384, 0);
    product_kernels(c, 8192, 1024, 4096, reps);
    bench_cuda_close(be);
    printf("%s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
