/* The product's CUDA attention kernels against their CPU twin sf_cpu_attention on small random
 * shapes: causal and not, partial segments, global tokens, d = 32/64/128, rows no branch covers.
 * Every path of sf_cuda_attention is run: the kernel it picks for this device (the wgmma kernel
 * on compute capability 9.0 at d = 64), the staged kernel (forced by telling the dispatch it runs
 * on compute capability 8.0, and called directly), the convert kernel (no workspace), the float32
 * kernel, bf16 q/k/v read in place where the wgmma kernel runs (refused elsewhere), and a head
 * width no tensor-core kernel was built for (the float32 fallback). Output poisoned with NaN
 * before each run; tolerance ||out-ref||/||ref|| <= 2e-2 in bf16, 1e-4 in float32.
 * The lab's variants are checked by bench/lab/bench_attention_variants.cu.
 * Skips (77) when the build has no CUDA or the machine has no GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/check.h"
#include "seqflow/error.h"

#ifdef SEQFLOW_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_device.h"

#define TOL_BF16 2e-2
#define TOL_F32 1e-4

typedef struct shape {
    int heads, d, segment, n, causal, n_global, nb;
    sf_branch br[3];
} shape;

static void *device_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) return NULL;
    if (bytes && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}

/* x rounded to the nearest bf16 (ties to even), as bits and as a float */
static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static float bf16_round(float x)
{
    uint32_t u = (uint32_t)bf16_bits(x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Runs `rc` (the launch's return code), then compares dout with ref. */
static void expect(const char *path, const shape *s, int rc, const float *dout, float *got, const float *ref,
                   size_t cnt, double tol)
{
    CHECKF(rc == SF_OK, "%s, H=%d d=%d n=%d: %s", path, s->heads, s->d, s->n, sf_last_error());
    if (rc != SF_OK) return;
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaMemcpy(got, dout, cnt * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    int finite = 1;
    for (size_t i = 0; i < cnt; i++) finite &= isfinite(got[i]) != 0;
    double err = check_rel_err_f32(got, ref, cnt);
    CHECKF(finite && err <= tol, "%s, H=%d d=%d n=%d/%d causal=%d G=%d: rel err %.3e%s", path, s->heads, s->d, s->n,
           s->segment, s->causal, s->n_global, err, finite ? "" : ", non-finite");
}

static void check_shape(const shape *s, const sf_cuda_device_info *dev, check_rng *rng)
{
    const int ld = s->heads * s->d;
    const size_t cnt = (size_t)s->n * ld, gcnt = (size_t)s->n_global * ld;
    float *host = malloc((3 * cnt + 2 * gcnt + 3 * cnt) * sizeof *host);
    uint16_t *bits = malloc(3 * cnt * sizeof *bits);
    CHECK(host != NULL && bits != NULL);
    if (!host || !bits) {
        free(host), free(bits);
        return;
    }
    float *q = host, *k = q + cnt, *v = k + cnt, *gk = v + cnt, *gv = gk + gcnt, *ref = gv + gcnt, *ref16 = ref + cnt,
          *got = ref16 + cnt;
    for (size_t i = 0; i < 3 * cnt + 2 * gcnt; i++) host[i] = (float)(2 * check_rng_uniform(rng) - 1);
    sf_attention_desc desc = {s->n, s->segment, s->heads, s->d, ld, s->causal, s->nb, s->br, s->n_global,
                              ld, gk, gv, 1.0f / sqrtf((float)s->d), SF_DTYPE_F32, 0};
    CHECK_OK(sf_cpu_attention(NULL, &desc, q, k, v, ref));
    const size_t ws_bytes = sf_cuda_attention_workspace_bytes(&desc);
    float *dq = device_copy(q, cnt * 4), *dk = device_copy(k, cnt * 4), *dv = device_copy(v, cnt * 4);
    float *dgk = device_copy(gk, gcnt * 4), *dgv = device_copy(gv, gcnt * 4), *dout = device_copy(q, cnt * 4);
    void *ws = NULL;
    CHECK(cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    CHECK(dq && dk && dv && dgk && dgv && dout && ws);
    if (dq && dk && dv && dgk && dgv && dout && ws) {
        desc.gk = dgk, desc.gv = dgv;
        const sf_cuda_device_info portable = {dev->device, 8, 0}; /* no wgmma: the staged kernel */
#define POISON() CHECK(cudaMemset(dout, 0xff, cnt * sizeof(float)) == cudaSuccess) /* NaN */
        POISON();
        expect("sf_cuda_attention", s, sf_cuda_attention(&desc, dq, dk, dv, dout, ws, ws_bytes, 0, dev), dout, got,
               ref, cnt, TOL_BF16);
        POISON();
        expect("sf_cuda_attention on compute capability 8.0", s,
               sf_cuda_attention(&desc, dq, dk, dv, dout, ws, ws_bytes, 0, &portable), dout, got, ref, cnt, TOL_BF16);
        POISON();
        expect("sf_cuda_attention_staged", s, sf_cuda_attention_staged(&desc, dq, dk, dv, dout, ws, ws_bytes, 0), dout,
               got, ref, cnt, TOL_BF16);
        POISON();
        expect("sf_cuda_attention without a workspace", s, sf_cuda_attention(&desc, dq, dk, dv, dout, NULL, 0, 0, dev),
               dout, got, ref, cnt, TOL_BF16);
        POISON();
        expect("sf_cuda_attention_convert", s, sf_cuda_attention_convert(&desc, dq, dk, dv, dout, 0), dout, got, ref,
               cnt, TOL_BF16);
        POISON();
        expect("sf_cuda_attention_f32", s, sf_cuda_attention_f32(&desc, dq, dk, dv, dout, 0), dout, got, ref, cnt,
               TOL_F32);
        /* a workspace too small is refused before anything runs */
        CHECK(sf_cuda_attention(&desc, dq, dk, dv, dout, ws, 16, 0, dev) == SF_E_INVAL);

        /* bf16 q/k/v, as qkv writes them on an H100; the reference on the same rounded values */
        for (size_t i = 0; i < 3 * cnt; i++) bits[i] = bf16_bits(host[i]);
        float *rq = malloc(3 * cnt * sizeof *rq);
        CHECK(rq != NULL);
        void *b16 = device_copy(bits, 3 * cnt * 2);
        CHECK(b16 != NULL);
        if (rq && b16) {
            for (size_t i = 0; i < 3 * cnt; i++) rq[i] = bf16_round(host[i]);
            sf_attention_desc host_desc = desc; /* the global tokens stay float32 */
            host_desc.gk = gk, host_desc.gv = gv;
            CHECK_OK(sf_cpu_attention(NULL, &host_desc, rq, rq + cnt, rq + 2 * cnt, ref16));
            sf_attention_desc d16 = desc;
            d16.qkv_type = SF_DTYPE_BF16;
            const uint16_t *bq = b16, *bk = bq + cnt, *bv = bk + cnt;
            if (sf_cuda_attention_wgmma_usable(&d16, dev)) {
                POISON();
                expect("sf_cuda_attention, bf16 q/k/v in place", s,
                       sf_cuda_attention(&d16, bq, bk, bv, dout, ws, ws_bytes, 0, dev), dout, got, ref16, cnt,
                       TOL_BF16);
                POISON();
                expect("sf_cuda_attention_wgmma, float32 q/k/v", s,
                       sf_cuda_attention_wgmma(&desc, dq, dk, dv, dout, NULL, ws, ws_bytes, 0), dout, got, ref, cnt,
                       TOL_BF16);
            } else {
                CHECK(sf_cuda_attention(&d16, bq, bk, bv, dout, ws, ws_bytes, 0, dev) == SF_E_UNSUPPORTED);
            }
            /* elsewhere (and without a workspace) bf16 is refused: the caller widens it */
            CHECK(sf_cuda_attention(&d16, bq, bk, bv, dout, ws, ws_bytes, 0, &portable) == SF_E_UNSUPPORTED);
            CHECK(sf_cuda_attention(&d16, bq, bk, bv, dout, NULL, 0, 0, dev) == SF_E_UNSUPPORTED);
            sf_clear_error();
        }
        cudaFree(b16);
        free(rq);
#undef POISON
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dgk), cudaFree(dgv), cudaFree(dout), cudaFree(ws);
    free(host), free(bits);
}

/* d = 48: no tensor-core kernel was built for it; the dispatch runs the float32 kernel. */
static void check_odd_width(const sf_cuda_device_info *dev, check_rng *rng)
{
    const shape s = {1, 48, 64, 64, 1, 0, 1, {{64, 1}}};
    const size_t cnt = 64 * 48;
    float *host = malloc(5 * cnt * sizeof *host);
    CHECK(host != NULL);
    if (!host) return;
    float *q = host, *k = q + cnt, *v = k + cnt, *ref = v + cnt, *got = ref + cnt;
    for (size_t i = 0; i < 3 * cnt; i++) host[i] = (float)(2 * check_rng_uniform(rng) - 1);
    sf_attention_desc desc = {64, 64, 1, 48, 48, 1, 1, s.br, 0, 48, NULL, NULL, 0.1f, SF_DTYPE_F32, 0};
    CHECK_OK(sf_cpu_attention(NULL, &desc, q, k, v, ref));
    CHECK(sf_cuda_attention_convert(&desc, NULL, NULL, NULL, NULL, 0) == SF_E_UNSUPPORTED);
    const size_t ws_bytes = sf_cuda_attention_workspace_bytes(&desc);
    float *dq = device_copy(q, cnt * 4), *dk = device_copy(k, cnt * 4), *dv = device_copy(v, cnt * 4);
    float *dout = device_copy(q, cnt * 4);
    void *ws = NULL;
    CHECK(cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    CHECK(dq && dk && dv && dout && ws);
    if (dq && dk && dv && dout && ws) {
        CHECK(sf_cuda_attention_staged(&desc, dq, dk, dv, dout, ws, ws_bytes, 0) == SF_E_UNSUPPORTED);
        CHECK(cudaMemset(dout, 0xff, cnt * sizeof(float)) == cudaSuccess);
        expect("sf_cuda_attention, d = 48 (float32 fallback)", &s,
               sf_cuda_attention(&desc, dq, dk, dv, dout, ws, ws_bytes, 0, dev), dout, got, ref, cnt, TOL_F32);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(ws);
    free(host);
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return check_skip("no GPU");
    int index = 0;
    sf_cuda_device_info dev;
    CHECK(cudaGetDevice(&index) == cudaSuccess);
    CHECK_OK(sf_cuda_device_info_get(index, &dev));
    static const shape shapes[] = {
        {4, 64, 1024, 1024, 1, 0, 3, {{256, 1}, {512, 2}, {1024, 4}}},
        {4, 64, 1024, 1024, 0, 256, 3, {{256, 1}, {512, 2}, {1024, 4}}},
        {4, 64, 1024, 777, 1, 16, 3, {{256, 1}, {512, 2}, {1024, 4}}},
        {3, 32, 512, 300, 0, 0, 2, {{128, 1}, {512, 8}}},
        {2, 128, 512, 512, 1, 7, 2, {{64, 2}, {512, 1}}},
        {4, 64, 256, 256, 1, 0, 1, {{256, 4}}},
        {6, 64, 192, 150, 1, 0, 2, {{96, 3}, {64, 2}}},
    };
    check_rng rng = {12345};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], &dev, &rng);
    check_odd_width(&dev, &rng);
    return check_finish("test_cuda_attention");
}
#else
int main(void)
{
    return check_skip("no GPU (built without CUDA)");
}
#endif
