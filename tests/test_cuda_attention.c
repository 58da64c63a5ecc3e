/* sf_cuda_attention_bf16 against its CPU twin sf_cpu_attention on small random shapes:
 * causal and not, partial segments, global tokens, d = 32/64/128, rows no branch covers.
 * Output poisoned with NaN before each run; bf16 tolerance ||out-ref||/||ref|| <= 2e-2.
 * Skips (77) when the build has no CUDA or the machine has no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "support/check.h"
#include "seqflow/error.h"

#ifdef SEQFLOW_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/attention_bf16_variants.h"
#include "kernels/cuda/cuda_attention.h"

typedef struct shape {
    int heads, d, segment, n, causal, n_global, nb;
    sf_branch br[3];
} shape;

static float *device_copy(const float *h, size_t count)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, count ? count * sizeof *d : 4) != cudaSuccess) return NULL;
    if (count && cudaMemcpy(d, h, count * sizeof *d, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}

static void check_shape(const shape *s, check_rng *rng)
{
    const int ld = s->heads * s->d;
    const size_t cnt = (size_t)s->n * ld, gcnt = (size_t)s->n_global * ld;
    float *host = malloc((3 * cnt + 2 * gcnt + 2 * cnt) * sizeof *host);
    CHECK(host != NULL);
    if (!host) return;
    float *q = host, *k = q + cnt, *v = k + cnt, *gk = v + cnt, *gv = gk + gcnt, *ref = gv + gcnt, *got = ref + cnt;
    for (size_t i = 0; i < 3 * cnt + 2 * gcnt; i++) host[i] = (float)(2 * check_rng_uniform(rng) - 1);
    sf_attention_desc desc = {s->n, s->segment, s->heads, s->d, ld, s->causal, s->nb, s->br, s->n_global,
                              ld, gk, gv, 1.0f / sqrtf((float)s->d), SF_DTYPE_F32};
    CHECK_OK(sf_cpu_attention(NULL, &desc, q, k, v, ref));
    float *dq = device_copy(q, cnt), *dk = device_copy(k, cnt), *dv = device_copy(v, cnt);
    float *dgk = device_copy(gk, gcnt), *dgv = device_copy(gv, gcnt), *dout = device_copy(q, cnt);
    CHECK(dq && dk && dv && dgk && dgv && dout);
    if (dq && dk && dv && dgk && dgv && dout) {
        desc.gk = dgk, desc.gv = dgv;
        for (int var = 1; var < SF_CUDA_ATTENTION_VARIANTS; var++) {
            CHECK(cudaMemset(dout, 0xff, cnt * sizeof(float)) == cudaSuccess); /* NaN */
            CHECK_OK(sf_cuda_attention_bf16_variant(var, &desc, dq, dk, dv, dout, 0));
            CHECK(cudaDeviceSynchronize() == cudaSuccess);
            CHECK(cudaMemcpy(got, dout, cnt * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
            int finite = 1;
            for (size_t i = 0; i < cnt; i++) finite &= isfinite(got[i]) != 0;
            double err = check_rel_err_f32(got, ref, cnt);
            CHECKF(finite && err <= 2e-2, "variant %d, H=%d d=%d n=%d/%d causal=%d G=%d: rel err %.3e%s", var,
                   s->heads, s->d, s->n, s->segment, s->causal, s->n_global, err, finite ? "" : ", non-finite");
        }
        /* the public entry point, and a head width it was not built for */
        CHECK(cudaMemset(dout, 0xff, cnt * sizeof(float)) == cudaSuccess);
        CHECK_OK(sf_cuda_attention_bf16(&desc, dq, dk, dv, dout, 0));
        CHECK(cudaMemcpy(got, dout, cnt * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(check_rel_err_f32(got, ref, cnt) <= 2e-2);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dgk), cudaFree(dgv), cudaFree(dout);
    free(host);
}

int main(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return check_skip("no GPU");
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
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], &rng);
    shape odd = {1, 48, 64, 64, 1, 0, 1, {{64, 1}}};
    sf_attention_desc desc = {64, 64, 1, 48, 48, 1, 1, odd.br, 0, 48, NULL, NULL, 0.1f, SF_DTYPE_F32};
    CHECK(sf_cuda_attention_bf16(&desc, NULL, NULL, NULL, NULL, 0) == SF_E_UNSUPPORTED);
    return check_finish("test_cuda_attention");
}
#else
int main(void)
{
    return check_skip("no GPU (built without CUDA)");
}
#endif
