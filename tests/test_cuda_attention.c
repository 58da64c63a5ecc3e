/* The product's CUDA attention kernels against their CPU twin sf_cpu_attention on small random
 * shapes: causal and not, partial segments, global tokens, d = 32/64/128, rows no branch covers.
 * Every path of sf_cuda_attention is run: the kernel it picks for this device (the wgmma kernel
 * on compute capability 9.0 at d = 64 and 128, the ping-pong kernel for bf16 q/k/v at d = 64
 * where there are enough position blocks; the ping-pong kernel is also called directly on every
 * shape it takes, plain and with the mix), the staged kernel (forced by telling the dispatch it runs
 * on compute capability 8.0, and called directly), the convert kernel (no workspace), the float32
 * kernel, bf16 q/k/v read in place where the wgmma kernel runs (refused elsewhere), and a head
 * width no tensor-core kernel was built for (the float32 fallback). Output poisoned with NaN
 * before each run; tolerance ||out-ref||/||ref|| <= 2e-2 in bf16, 1e-4 in float32. Then NaN and
 * infinity in V and NaN in K at chosen keys (check_non_finite): the rows that see them are
 * non-finite as on the CPU, every other row finite and within tolerance, on every path
 * including the fused memory mix (d = 64; refused at other widths); each case prints "ok: ..."
 * when it passes.
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
    sf_branch br[5];
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
                if (sf_cuda_attention_pingpong_usable(&d16, dev)) {
                    POISON();
                    expect("sf_cuda_attention_pingpong, bf16 q/k/v", s,
                           sf_cuda_attention_pingpong(&d16, bq, bk, bv, dout, NULL, ws, ws_bytes, 0), dout, got,
                           ref16, cnt, TOL_BF16);
                }
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

/* ---- non-finite K/V at chosen keys (SPEC 3: a row sees only its unmasked keys) -------------
 * A NaN or infinity in V (or a NaN in K) at key j must make exactly the rows that see j
 * non-finite, as on the CPU: rows of the same key tile before j (causal), rows of other windows
 * or branches, rows past the end stay finite and within tolerance. Compared per (row, head). */

/* Whether (row, head) of x ([n, ld]) holds a non-finite value; from bf16 bits when b16 */
static int row_bad(const float *x, const uint16_t *b16, size_t ld, int i, int h, int d)
{
    for (int e = 0; e < d; e++) {
        const size_t at = (size_t)i * ld + (size_t)h * d + e;
        if (b16 ? (b16[at] & 0x7f80u) == 0x7f80u : !isfinite(x[at])) return 1;
    }
    return 0;
}

/* got against ref: the same (row, head) pairs non-finite, the finite ones within tol */
static void expect_nf(const char *path, const shape *s, int rc, const float *got, const uint16_t *got16,
                      const float *ref, double tol)
{
    const size_t ld = (size_t)s->heads * s->d;
    CHECKF(rc == SF_OK, "%s (non-finite K/V), H=%d d=%d n=%d: %s", path, s->heads, s->d, s->n, sf_last_error());
    if (rc != SF_OK) return;
    int wrong = 0, first_i = -1, first_h = -1, first_ref = 0;
    double num = 0, den = 0;
    for (int i = 0; i < s->n; i++)
        for (int h = 0; h < s->heads; h++) {
            const int want = row_bad(ref, NULL, ld, i, h, s->d), have = row_bad(got, got16, ld, i, h, s->d);
            if (want != have) {
                if (!wrong) first_i = i, first_h = h, first_ref = want;
                wrong++;
                continue;
            }
            if (want || !got) continue; /* bf16 output: finiteness only */
            for (int e = 0; e < s->d; e++) {
                const size_t at = (size_t)i * ld + (size_t)h * s->d + e;
                num += (got[at] - ref[at]) * (double)(got[at] - ref[at]);
                den += (double)ref[at] * ref[at];
            }
        }
    const double err = den > 0 ? sqrt(num / den) : 0;
    CHECKF(!wrong && err <= tol,
           "%s (non-finite K/V), H=%d d=%d n=%d causal=%d G=%d: %d (row, head) pairs differ in finiteness "
           "(first: row %d head %d, reference %s), finite rows' rel err %.3e",
           path, s->heads, s->d, s->n, s->causal, s->n_global, wrong, first_i, first_h,
           first_ref ? "non-finite" : "finite", err);
    if (!wrong && err <= tol) printf("  ok: %s, non-finite K/V, d=%d n=%d causal=%d G=%d\n", path, s->d, s->n, s->causal, s->n_global);
}

/* rc, or, once the launch behind it is done, the download of `bytes` from dev_src into host:
 * SF_OK, or SF_E_BACKEND when either fails */
static int fetch(int rc, void *host, const void *dev_src, size_t bytes)
{
    if (rc != SF_OK) return rc;
    return cudaDeviceSynchronize() == cudaSuccess &&
                   cudaMemcpy(host, dev_src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess
               ? SF_OK
               : SF_E_BACKEND;
}

/* bad_global: a NaN in the first global token's V too (every row sees it) */
static void check_non_finite(const shape *s, int bad_global, const sf_cuda_device_info *dev, check_rng *rng)
{
    const int ld = s->heads * s->d, n = s->n, d = s->d;
    const size_t cnt = (size_t)n * ld, gcnt = (size_t)s->n_global * ld;
    float *host = malloc((3 * cnt + 2 * gcnt + 3 * cnt) * sizeof *host);
    uint16_t *bits = malloc(4 * cnt * sizeof *bits);
    CHECK(host != NULL && bits != NULL);
    if (!host || !bits) {
        free(host), free(bits);
        return;
    }
    float *q = host, *k = q + cnt, *v = k + cnt, *gk = v + cnt, *gv = gk + gcnt, *ref = gv + gcnt, *ref16 = ref + cnt,
          *got = ref16 + cnt;
    for (size_t i = 0; i < 3 * cnt + 2 * gcnt; i++) host[i] = (float)(2 * check_rng_uniform(rng) - 1);
    /* keys inside their 64-key tiles (earlier rows of the tile must stay clean), the first and
     * the last, in every head: NaN and infinity in V, NaN in K */
    const int vnan[] = {100 % (n - 1) + 1, n - 3, 1}, vinf[] = {n / 2 + 5}, knan[] = {37 % n};
    for (int h = 0; h < s->heads; h++) {
        for (size_t b = 0; b < sizeof vnan / sizeof *vnan; b++) v[(size_t)vnan[b] * ld + h * d + (h + 1) % d] = NAN;
        for (size_t b = 0; b < sizeof vinf / sizeof *vinf; b++) v[(size_t)vinf[b] * ld + h * d + 3] = INFINITY;
        for (size_t b = 0; b < sizeof knan / sizeof *knan; b++) k[(size_t)knan[b] * ld + h * d + 2] = NAN;
        if (bad_global && s->n_global > 0) gv[h * d + 5] = NAN;
    }
    sf_attention_desc desc = {n, s->segment, s->heads, d, ld, s->causal, s->nb, s->br, s->n_global,
                              ld, gk, gv, 1.0f / sqrtf((float)d), SF_DTYPE_F32, 0};
    CHECK_OK(sf_cpu_attention(NULL, &desc, q, k, v, ref));
    /* the test means something: some rows are poisoned and, causal (row 0 sees no bad key; a
     * window without dilation may let every row of a non-causal run see one), some are not */
    int nbad = 0;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < s->heads; h++) nbad += row_bad(ref, NULL, ld, i, h, d);
    CHECKF(nbad > 0 && (bad_global || !s->causal || nbad < n * s->heads), "reference: %d of %d (row, head) pairs non-finite",
           nbad, n * s->heads);
    const size_t ws_bytes = sf_cuda_attention_workspace_bytes(&desc);
    float *dq = device_copy(q, cnt * 4), *dk = device_copy(k, cnt * 4), *dv = device_copy(v, cnt * 4);
    float *dgk = device_copy(gk, gcnt * 4), *dgv = device_copy(gv, gcnt * 4), *dout = device_copy(q, cnt * 4);
    void *ws = NULL;
    CHECK(cudaMalloc(&ws, ws_bytes) == cudaSuccess);
    CHECK(dq && dk && dv && dgk && dgv && dout && ws);
    if (dq && dk && dv && dgk && dgv && dout && ws) {
        desc.gk = dgk, desc.gv = dgv;
        const sf_cuda_device_info portable = {dev->device, 8, 0};
#define RUN_NF(path, call, tol)                                                                                        \
    do {                                                                                                               \
        CHECK(cudaMemset(dout, 0, cnt * sizeof(float)) == cudaSuccess);                                                \
        const int rc_ = fetch((call), got, dout, cnt * 4);                                                             \
        expect_nf(path, s, rc_, got, NULL, ref, tol);                                                                  \
    } while (0)
        RUN_NF("sf_cuda_attention", sf_cuda_attention(&desc, dq, dk, dv, dout, ws, ws_bytes, 0, dev), TOL_BF16);
        RUN_NF("staged (compute capability 8.0)",
               sf_cuda_attention(&desc, dq, dk, dv, dout, ws, ws_bytes, 0, &portable), TOL_BF16);
        if (d == 32 || d == 64 || d == 128)
            RUN_NF("sf_cuda_attention_convert", sf_cuda_attention_convert(&desc, dq, dk, dv, dout, 0), TOL_BF16);
        RUN_NF("sf_cuda_attention_f32", sf_cuda_attention_f32(&desc, dq, dk, dv, dout, 0), TOL_F32);

        /* bf16 q/k/v in place, plain and with the memory mix fused (wgmma devices) */
        sf_attention_desc d16 = desc;
        d16.qkv_type = SF_DTYPE_BF16;
        if (sf_cuda_attention_wgmma_usable(&d16, dev)) {
            float *rq = malloc(3 * cnt * sizeof *rq);
            for (size_t i = 0; i < 3 * cnt; i++) bits[i] = bf16_bits(host[i]);
            void *b16 = device_copy(bits, 3 * cnt * 2);
            /* the mix's memory: M small, z positive so that its denominators are not 0 */
            const size_t mcnt = (size_t)s->heads * 64 * 64;
            float *mh = malloc((mcnt + 64 * (size_t)s->heads + s->heads) * sizeof *mh);
            CHECK(rq && b16 && mh);
            if (rq && b16 && mh) {
                for (size_t i = 0; i < 3 * cnt; i++) rq[i] = bf16_round(host[i]);
                sf_attention_desc host_desc = desc;
                host_desc.gk = gk, host_desc.gv = gv;
                CHECK_OK(sf_cpu_attention(NULL, &host_desc, rq, rq + cnt, rq + 2 * cnt, ref16));
                const uint16_t *bq = b16, *bk = bq + cnt, *bv = bk + cnt;
                CHECK(cudaMemset(dout, 0, cnt * sizeof(float)) == cudaSuccess);
                int rc = sf_cuda_attention(&d16, bq, bk, bv, dout, ws, ws_bytes, 0, dev);
                rc = fetch(rc, got, dout, cnt * 4);
                expect_nf("sf_cuda_attention, bf16 q/k/v in place", s, rc, got, NULL, ref16, TOL_BF16);
                const int pingpong = sf_cuda_attention_pingpong_usable(&d16, dev);
                if (pingpong) {
                    CHECK(cudaMemset(dout, 0, cnt * sizeof(float)) == cudaSuccess);
                    rc = sf_cuda_attention_pingpong(&d16, bq, bk, bv, dout, NULL, ws, ws_bytes, 0);
                    rc = fetch(rc, got, dout, cnt * 4);
                    expect_nf("sf_cuda_attention_pingpong", s, rc, got, NULL, ref16, TOL_BF16);
                }

                float *zh = mh + mcnt, *gh = zh + 64 * (size_t)s->heads;
                for (size_t i = 0; i < mcnt; i++) mh[i] = (float)(0.02 * check_rng_uniform(rng));
                for (int i = 0; i < 64 * s->heads; i++) zh[i] = 1.0f + (float)check_rng_uniform(rng);
                for (int h = 0; h < s->heads; h++) gh[h] = 0.5f * h - 1.0f;
                float *dm = device_copy(mh, (mcnt + 64 * (size_t)s->heads + s->heads) * 4);
                void *dmix = NULL;
                CHECK(cudaMalloc(&dmix, cnt * 2) == cudaSuccess && dm);
                if (dm && dmix) {
                    const sf_cuda_attention_mix mix = {dm, dm + mcnt, dm + mcnt + 64 * s->heads, dmix};
                    CHECK(cudaMemset(dmix, 0, cnt * 2) == cudaSuccess);
                    rc = sf_cuda_attention_with_mix(&d16, bq, bk, bv, dout, &mix, ws, ws_bytes, 0, dev);
                    uint16_t *mixed = bits + 3 * cnt;
                    rc = fetch(rc, mixed, dmix, cnt * 2);
                    /* the mix adds the memory's finite retrieval: finiteness is A_dot's. Its memory
                     * is 64 x 64 a head: other widths are refused, nothing launched */
                    if (s->d == 64)
                        expect_nf("sf_cuda_attention_with_mix (fused)", s, rc, NULL, mixed, ref16, TOL_BF16);
                    else
                        CHECK(rc == SF_E_UNSUPPORTED);
                    if (pingpong) { /* the ping-pong kernel's own mix */
                        CHECK(cudaMemset(dmix, 0, cnt * 2) == cudaSuccess);
                        rc = sf_cuda_attention_pingpong(&d16, bq, bk, bv, dout, &mix, ws, ws_bytes, 0);
                        rc = fetch(rc, mixed, dmix, cnt * 2);
                        expect_nf("sf_cuda_attention_pingpong with the mix", s, rc, NULL, mixed, ref16, TOL_BF16);
                    }
                }
                cudaFree(dm), cudaFree(dmix);
            }
            cudaFree(b16);
            free(rq), free(mh);
        }
#undef RUN_NF
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
        {3, 128, 1024, 1024, 1, 0, 3, {{256, 1}, {512, 2}, {1024, 4}}},
        {2, 128, 1024, 777, 0, 64, 3, {{256, 1}, {512, 2}, {1024, 4}}},
        {4, 64, 256, 256, 1, 0, 1, {{256, 4}}},
        {6, 64, 192, 150, 1, 0, 2, {{96, 3}, {64, 2}}},
        /* the wgmma kernel's tiles on wide dilations (8 and 16) and on five distinct ones */
        {4, 64, 2048, 1900, 1, 32, 2, {{512, 1}, {2048, 8}}},
        {2, 128, 1024, 1000, 0, 0, 2, {{128, 1}, {1024, 8}}},
        {2, 64, 2048, 2000, 1, 16, 2, {{256, 1}, {2048, 16}}},
        {2, 64, 3840, 3000, 1, 0, 5, {{64, 1}, {128, 2}, {192, 3}, {256, 4}, {320, 5}}},
        /* enough position blocks times heads for sf_cuda_attention to take the ping-pong kernel
         * on an H100 (at least one a multiprocessor) */
        {24, 64, 4096, 4000, 1, 32, 3, {{128, 1}, {256, 2}, {512, 4}}},
    };
    check_rng rng = {12345};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], &dev, &rng);
    check_odd_width(&dev, &rng);
    static const struct {
        shape s;
        int bad_global;
    } nf[] = {
        {{2, 64, 512, 300, 1, 0, 2, {{128, 1}, {256, 4}}}, 0},
        {{2, 64, 512, 300, 0, 0, 2, {{128, 1}, {256, 4}}}, 0},
        {{2, 64, 512, 450, 1, 9, 2, {{64, 2}, {512, 1}}}, 0},
        {{2, 64, 256, 200, 1, 5, 1, {{256, 2}}}, 1},
        {{3, 32, 512, 333, 1, 0, 2, {{128, 1}, {512, 8}}}, 0},
        {{3, 32, 512, 333, 0, 4, 2, {{128, 4}, {512, 1}}}, 0},
        {{2, 128, 512, 260, 1, 7, 2, {{64, 2}, {512, 1}}}, 0},
        {{2, 128, 512, 260, 0, 0, 1, {{256, 4}}}, 0},
        {{2, 64, 1024, 700, 1, 0, 2, {{256, 1}, {1024, 16}}}, 0},
        {{2, 64, 1024, 900, 0, 0, 2, {{128, 1}, {1024, 8}}}, 0},
        {{2, 16, 128, 100, 1, 0, 1, {{128, 1}}}, 0}, /* d = 16: the float32 fallback */
    };
    for (size_t i = 0; i < sizeof nf / sizeof nf[0]; i++) check_non_finite(&nf[i].s, nf[i].bad_global, &dev, &rng);
    return check_finish("test_cuda_attention");
}
#else
int main(void)
{
    return check_skip("no GPU (built without CUDA)");
}
#endif
