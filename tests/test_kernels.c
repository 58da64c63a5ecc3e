/* Every CPU backend op against naive double-precision loops on random inputs of several
 * shapes; outputs are poisoned with NaN first so an unwritten element fails. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/vector_rows.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

static check_rng rng = {2024};

static float *randoms(size_t n, double scale)
{
    float *x = malloc(n * sizeof *x + 4);
    check_fill_normal(&rng, x, n, scale);
    return x;
}

static float *poisoned(size_t n)
{
    float *x = malloc(n * sizeof *x + 4);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

/* naive attention of one (head, query) over the union of keys, in double */
static void naive_attention(const sf_attention_desc *dd, const float *q, const float *k, const float *v, int h, int i,
                            double *out)
{
    const int d = dd->head_dim, ld = dd->ld, n = dd->n;
    double *logit = malloc(((size_t)dd->n_branches * n + dd->n_global + 1) * sizeof *logit);
    const float **val = malloc(((size_t)dd->n_branches * n + dd->n_global + 1) * sizeof *val);
    int c = 0;
    for (int b = 0; b < dd->n_branches; b++) {
        int w = dd->branches[b].window, r = dd->branches[b].dilation, o = h % r;
        if (i % r != o) continue;
        for (int j = 0; j < n; j++) {
            if (j % r != o || j / w != i / w || (dd->causal && j > i)) continue;
            double s = 0;
            for (int e = 0; e < d; e++) s += (double)q[(size_t)i * ld + h * d + e] * k[(size_t)j * ld + h * d + e];
            logit[c] = s * dd->scale, val[c++] = v + (size_t)j * ld + h * d;
        }
    }
    for (int g = 0; g < dd->n_global; g++) {
        double s = 0;
        for (int e = 0; e < d; e++) s += (double)q[(size_t)i * ld + h * d + e] * dd->gk[(size_t)g * dd->global_ld + h * d + e];
        logit[c] = s * dd->scale, val[c++] = dd->gv + (size_t)g * dd->global_ld + h * d;
    }
    for (int e = 0; e < d; e++) out[e] = 0;
    double mx = -INFINITY, sum = 0;
    for (int t = 0; t < c; t++) mx = fmax(mx, logit[t]);
    for (int t = 0; t < c; t++) sum += exp(logit[t] - mx);
    for (int t = 0; t < c; t++) {
        const double p = exp(logit[t] - mx) / sum;
        for (int e = 0; e < d; e++) out[e] += p * val[t][e];
    }
    free(logit);
    free(val);
}

/* Logits are q.k * scale with q scaled by attn_qscale (larger = peakier softmax). */
static double attn_qscale = 1.0;

static void check_attention(sf_backend *be, const char *branches, int heads, int d, int ld_extra, int segment, int n,
                            int causal, int n_global)
{
    sf_model_config cfg = {0};
    CHECK_OK(sf_branches_parse(branches, &cfg));
    const int ld = heads * d + ld_extra;
    float *q = randoms((size_t)n * ld, attn_qscale), *k = randoms((size_t)n * ld, 1.0), *v = randoms((size_t)n * ld, 1.0);
    float *gk = randoms((size_t)(n_global + 1) * heads * d, 1.0), *gv = randoms((size_t)(n_global + 1) * heads * d, 1.0);
    float *out = poisoned((size_t)n * ld);
    sf_attention_desc dd = {.n = n, .segment = segment, .heads = heads, .head_dim = d, .ld = ld, .causal = causal,
                            .n_branches = cfg.n_branches, .branches = cfg.branches, .n_global = n_global,
                            .global_ld = heads * d, .gk = gk, .gv = gv, .scale = 1.0f / sqrtf((float)d)};
    CHECK_OK(be->ops->attention(be, &dd, q, k, v, out));
    double *want = calloc((size_t)n * heads * d, sizeof *want);
    float *got = malloc((size_t)n * heads * d * sizeof *got);
    int zero_rows_ok = 1;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            naive_attention(&dd, q, k, v, h, i, want + ((size_t)i * heads + h) * d);
            memcpy(got + ((size_t)i * heads + h) * d, out + (size_t)i * ld + h * d, (size_t)d * sizeof *got);
            int covered = n_global > 0;
            for (int b = 0; b < cfg.n_branches; b++) covered |= i % cfg.branches[b].dilation == h % cfg.branches[b].dilation;
            if (!covered)
                for (int e = 0; e < d; e++) zero_rows_ok &= out[(size_t)i * ld + h * d + e] == 0.0f;
        }
    double err = check_rel_err_f32_f64(got, want, (size_t)n * heads * d);
    CHECKF(err <= 1e-5, "attention %s H=%d d=%d N=%d n=%d causal=%d G=%d: rel err %.3g", branches, heads, d, segment, n,
           causal, n_global, err);
    CHECK(zero_rows_ok);
    free(q), free(k), free(v), free(gk), free(gv), free(out), free(want), free(got);
}

static double sig(double x) { return x > 0 ? x + 1 : exp(x); }

static void check_memory(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld_extra, int z_zero)
{
    const int ld = heads * d + ld_extra;
    float *q = randoms((size_t)n * ld, 1.0), *k = randoms((size_t)n * ld, 1.0), *v = randoms((size_t)n * ld, 1.0);
    float *M = randoms((size_t)heads * d * d, 0.3), *z = randoms((size_t)heads * d, 1.0), *gate = randoms((size_t)heads, 1.0);
    for (int i = 0; i < heads * d; i++) z[i] = z_zero ? 0.0f : fabsf(z[i]) + 1.0f;
    float *a = randoms((size_t)n * ld, 1.0), *a0 = malloc((size_t)n * ld * sizeof *a0);
    memcpy(a0, a, (size_t)n * ld * sizeof *a0);
    CHECK_OK(be->ops->memory_mix(be, n, heads, d, ld, SF_DTYPE_F32, q, M, z, gate, a));
    double *want = malloc((size_t)n * heads * d * sizeof *want);
    float *got = malloc((size_t)n * heads * d * sizeof *got);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            double den = 0, g = 1 / (1 + exp(-(double)gate[h]));
            for (int e = 0; e < d; e++) den += sig(q[(size_t)i * ld + h * d + e]) * z[h * d + e];
            for (int e = 0; e < d; e++) {
                double num = 0;
                for (int f = 0; f < d; f++) num += sig(q[(size_t)i * ld + h * d + f]) * M[((size_t)h * d + f) * d + e];
                double mem = den == 0 ? 0 : num / den;
                want[((size_t)i * heads + h) * d + e] = g * mem + (1 - g) * a0[(size_t)i * ld + h * d + e];
                got[((size_t)i * heads + h) * d + e] = a[(size_t)i * ld + h * d + e];
            }
        }
    double err = check_rel_err_f32_f64(got, want, (size_t)n * heads * d);
    CHECKF(err <= 1e-5, "memory_mix n=%d H=%d d=%d z_zero=%d: rel err %.3g", n, heads, d, z_zero, err);

    double *Mw = malloc((size_t)heads * d * d * sizeof *Mw), *zw = malloc((size_t)heads * d * sizeof *zw);
    for (int h = 0; h < heads; h++) {
        for (int f = 0; f < d * d; f++) Mw[(size_t)h * d * d + f] = M[(size_t)h * d * d + f];
        for (int f = 0; f < d; f++) zw[h * d + f] = z[h * d + f];
        if (kind == SF_MEMORY_NONE) continue;
        for (int t = 0; t < n; t++) {
            const float *kt = k + (size_t)t * ld + h * d, *vt = v + (size_t)t * ld + h * d;
            double den = 0;
            for (int f = 0; f < d; f++) den += sig(kt[f]) * z[h * d + f];
            for (int e = 0; e < d; e++) {
                double target = vt[e];
                if (kind == SF_MEMORY_DELTA && den != 0) {
                    double num = 0;
                    for (int f = 0; f < d; f++) num += sig(kt[f]) * M[((size_t)h * d + f) * d + e];
                    target -= num / den;
                }
                for (int f = 0; f < d; f++) Mw[((size_t)h * d + f) * d + e] += sig(kt[f]) * target;
            }
            for (int f = 0; f < d; f++) zw[h * d + f] += sig(kt[f]);
        }
    }
    /* bf16 q/k/v are a GPU type: the CPU refuses them */
    const uint16_t one_bf16[2] = {0x3f80, 0x3f80};
    if (kind != SF_MEMORY_NONE) {
        CHECK(be->ops->memory_update(be, kind, 1, 1, 1, 1, SF_DTYPE_BF16, one_bf16, one_bf16 + 1, M, z) ==
              SF_E_UNSUPPORTED);
        CHECK(be->ops->memory_mix(be, 1, 1, 1, 1, SF_DTYPE_BF16, one_bf16, M, z, gate, a) == SF_E_UNSUPPORTED);
    }
    CHECK_OK(be->ops->memory_update(be, kind, n, heads, d, ld, SF_DTYPE_F32, k, v, M, z));
    double em = check_rel_err_f32_f64(M, Mw, (size_t)heads * d * d), ez = check_rel_err_f32_f64(z, zw, (size_t)heads * d);
    CHECKF(em <= 1e-5 && ez <= 1e-6, "memory_update kind=%d n=%d H=%d d=%d: M %.3g z %.3g", kind, n, heads, d, em, ez);
    free(q), free(k), free(v), free(M), free(z), free(gate), free(a), free(a0), free(want), free(got), free(Mw), free(zw);
}

static void check_dense_ops(sf_backend *be)
{
    const int n = 70, in = 33, out = 45, ldx = 40, ldy = 50;
    float *x = randoms((size_t)n * ldx, 1.0), *w = randoms((size_t)out * in, 0.2), *y = randoms((size_t)n * ldy, 1.0);
    float *y0 = malloc((size_t)n * ldy * sizeof *y0);
    memcpy(y0, y, (size_t)n * ldy * sizeof *y0);
    for (int accumulate = 0; accumulate <= 1; accumulate++) {
        memcpy(y, y0, (size_t)n * ldy * sizeof *y);
        CHECK_OK(be->ops->matmul(be, n, in, out, x, ldx, w, y, ldy, accumulate));
        double worst = 0;
        for (int i = 0; i < n; i++)
            for (int o = 0; o < out; o++) {
                double s = accumulate ? y0[(size_t)i * ldy + o] : 0;
                for (int c = 0; c < in; c++) s += (double)x[(size_t)i * ldx + c] * w[(size_t)o * in + c];
                worst = fmax(worst, fabs(s - y[(size_t)i * ldy + o]) / (1 + fabs(s)));
            }
        CHECKF(worst <= 1e-5, "matmul accumulate=%d: %.3g", accumulate, worst);
        CHECK(y[ldy - 1] == y0[ldy - 1]); /* padding columns untouched */
    }
    float *nx = randoms((size_t)n * in, 3.0), *nw = randoms((size_t)in, 1.0), *ny = poisoned((size_t)n * in);
    CHECK_OK(be->ops->rmsnorm(be, n, in, nx, nw, 1e-6f, ny));
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int c = 0; c < in; c++) ss += (double)nx[i * in + c] * nx[i * in + c];
        for (int c = 0; c < in; c++) {
            double want = nx[i * in + c] / sqrt(ss / in + 1e-6) * nw[c];
            worst = fmax(worst, fabs(want - ny[i * in + c]) / (1 + fabs(want)));
        }
    }
    CHECKF(worst <= 1e-6, "rmsnorm: %.3g", worst);
    float *a = randoms(1000, 4.0), *b = randoms(1000, 1.0), *a0 = malloc(1000 * sizeof *a0);
    memcpy(a0, a, 1000 * sizeof *a0);
    CHECK_OK(be->ops->swiglu(be, 10, 100, a, b));
    worst = 0;
    for (int i = 0; i < 1000; i++) {
        double want = a0[i] / (1 + exp(-(double)a0[i])) * b[i];
        worst = fmax(worst, fabs(want - a[i]) / (1 + fabs(want)));
    }
    CHECKF(worst <= 1e-6, "swiglu: %.3g", worst);
    uint32_t tokens[3] = {2, 0, 2};
    float table[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, *e = poisoned(12);
    CHECK_OK(be->ops->embed(be, 3, 4, tokens, table, e));
    CHECK(e[0] == 8 && e[4] == 0 && e[11] == 11);
    free(x), free(w), free(y), free(y0), free(nx), free(nw), free(ny), free(a), free(b), free(a0), free(e);
}

static void check_summary(sf_backend *be)
{
    const int width = 6, ld = 8, N = 10, S = 3;
    float *k = randoms((size_t)N * ld, 1.0), *v = randoms((size_t)N * ld, 1.0);
    float *sk = poisoned((size_t)S * width), *sv = poisoned((size_t)S * width);
    for (int n = 1; n <= N; n++) {
        int count = -1;
        CHECK_OK(be->ops->summary(be, n, N, S, width, ld, SF_DTYPE_F32, k, v, sk, sv, &count));
        int expect = 0, ok = 1;
        for (int j = 0; j < S; j++) {
            int lo = j * N / S, hi = (j + 1) * N / S < n ? (j + 1) * N / S : n;
            if (lo >= hi) continue;
            for (int f = 0; f < width; f++) {
                double mk = 0, mv = 0;
                for (int t = lo; t < hi; t++) mk += k[t * ld + f], mv += v[t * ld + f];
                ok &= fabs(mk / (hi - lo) - sk[expect * width + f]) < 1e-6 && fabs(mv / (hi - lo) - sv[expect * width + f]) < 1e-6;
            }
            expect++;
        }
        CHECKF(count == expect && ok, "summary n=%d: %d tokens (want %d)", n, count, expect);
    }
    int count = -1;
    CHECK(be->ops->summary(be, N, N, S, width, ld, SF_DTYPE_BF16, k, v, sk, sv, &count) == SF_E_UNSUPPORTED);
    free(k), free(v), free(sk), free(sv);
}

static void check_flops(void)
{
    sf_model_config cfg = {0};
    CHECK_OK(sf_branches_parse("4:1,8:2", &cfg));
    for (int causal = 0; causal <= 1; causal++) {
        sf_attention_desc dd = {.n = 13, .segment = 16, .heads = 3, .head_dim = 4, .causal = causal,
                                .n_branches = cfg.n_branches, .branches = cfg.branches, .n_global = 2};
        double pairs = 0;
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 13; i++) {
                for (int b = 0; b < cfg.n_branches; b++) {
                    int w = cfg.branches[b].window, r = cfg.branches[b].dilation;
                    for (int j = 0; j < 13; j++)
                        pairs += i % r == h % r && j % r == h % r && i / w == j / w && (!causal || j <= i);
                }
                pairs += 2;
            }
        CHECKF(sf_attention_useful_flops(&dd) == 4.0 * 4 * pairs, "flops causal=%d", causal);
    }
}

/* The result does not depend on the number of threads (each head is one thread's work). */
static void check_attention_threads(void)
{
    sf_model_config cfg = {0};
    CHECK_OK(sf_branches_parse("64:1,128:2,256:4", &cfg));
    const int heads = 5, d = 16, n = 250, ld = heads * d;
    float *q = randoms((size_t)n * ld, 1.0), *k = randoms((size_t)n * ld, 1.0), *v = randoms((size_t)n * ld, 1.0);
    float *out[3];
    sf_attention_desc dd = {.n = n, .segment = 256, .heads = heads, .head_dim = d, .ld = ld, .causal = 1,
                            .n_branches = cfg.n_branches, .branches = cfg.branches, .scale = 0.25f};
    const int threads[3] = {1, 2, 7};
    for (int t = 0; t < 3; t++) {
        sf_backend *be;
        CHECK_OK(sf_backend_create("cpu", 0, &be));
        be->threads = threads[t];
        out[t] = poisoned((size_t)n * ld);
        CHECK_OK(be->ops->attention(be, &dd, q, k, v, out[t]));
        sf_backend_free(be);
    }
    CHECK(memcmp(out[0], out[1], (size_t)n * ld * sizeof(float)) == 0);
    CHECK(memcmp(out[0], out[2], (size_t)n * ld * sizeof(float)) == 0);
    free(q), free(k), free(v), free(out[0]), free(out[1]), free(out[2]);
}

/* Causal masking skips later keys rather than weighting them by zero: a NaN or infinity in the
 * key and value of position `bad` must leave every earlier row finite and equal (to rounding)
 * to the clean result, while rows from `bad` on see it. */
static void check_masked_non_finite(sf_backend *be, const char *branches, int bad, float poison)
{
    sf_model_config cfg = {0};
    CHECK_OK(sf_branches_parse(branches, &cfg));
    const int heads = 2, d = 16, n = 200, ld = heads * d;
    float *q = randoms((size_t)n * ld, 1.0), *k = randoms((size_t)n * ld, 1.0), *v = randoms((size_t)n * ld, 1.0);
    float *clean = poisoned((size_t)n * ld), *out = poisoned((size_t)n * ld);
    sf_attention_desc dd = {.n = n, .segment = 256, .heads = heads, .head_dim = d, .ld = ld, .causal = 1,
                            .n_branches = cfg.n_branches, .branches = cfg.branches, .scale = 0.25f};
    CHECK_OK(be->ops->attention(be, &dd, q, k, v, clean));
    for (int e = 0; e < ld; e++) k[(size_t)bad * ld + e] = poison, v[(size_t)bad * ld + e] = poison;
    CHECK_OK(be->ops->attention(be, &dd, q, k, v, out));
    int earlier_ok = 1, later_hit = 0;
    for (int i = 0; i < n; i++)
        for (int e = 0; e < ld; e++) {
            float got = out[(size_t)i * ld + e], want = clean[(size_t)i * ld + e];
            if (i < bad) earlier_ok &= isfinite(got) && fabsf(got - want) <= 1e-5f * (1.0f + fabsf(want));
            else later_hit |= !isfinite(got);
        }
    CHECKF(earlier_ok, "%s: a non-finite key/value at %d leaked into earlier rows", branches, bad);
    CHECKF(later_hit, "%s: the non-finite key/value at %d reached no row", branches, bad);
    free(q), free(k), free(v), free(clean), free(out);
}

static void check_buffers(sf_backend *be)
{
    float *a = be->ops->alloc(be, 100 * sizeof(float)), *b = be->ops->alloc(be, 100 * sizeof(float));
    CHECK(a && b && ((uintptr_t)a & 63) == 0 && ((uintptr_t)b & 63) == 0);
    float host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i, back[i] = NAN;
    CHECK_OK(be->ops->upload(be, a, host, sizeof host));
    CHECK_OK(be->ops->copy(be, b, a, sizeof host));
    CHECK_OK(be->ops->zero(be, a, sizeof host));
    CHECK_OK(be->ops->sync(be));
    CHECK_OK(be->ops->download(be, back, b, sizeof back));
    CHECK(memcmp(back, host, sizeof host) == 0);
    CHECK_OK(be->ops->download(be, back, a, sizeof back));
    CHECK(back[0] == 0.0f && back[99] == 0.0f);
    be->ops->free(be, a);
    be->ops->free(be, b);
    be->ops->free(be, NULL);
    void *tiny = be->ops->alloc(be, 0);
    be->ops->free(be, tiny);
}

#ifdef SF_HAVE_AVX2_FMA
/* sf_fast_exp8, on a CPU with AVX2 and FMA only */
SF_TARGET_AVX2_FMA static void check_fast_exp8(void)
{
    {
        float in[8] = {NAN, INFINITY, 1e30f, -3.4e38f, 3.4e38f, 88.5f, -NAN, 1.0f}, out[8];
        _mm256_storeu_ps(out, sf_fast_exp8(_mm256_loadu_ps(in)));
        float top = sf_fast_expf(SF_EXP_HI);
        CHECKF(isnan(out[0]) && out[1] == top && out[2] == top && out[3] == 0.0f && out[4] == top && out[5] == top &&
                   isnan(out[6]) && fabsf(out[7] / sf_fast_expf(1.0f) - 1) < 5e-7f,
               "fast_exp8 extremes: %g %g %g %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4], out[5], out[6],
               out[7]);
    }
    float in[8] = {-INFINITY, -200.0f, -87.5f, -20.25f, -1.0f, 0.0f, 0.3466f, 80.0f}, lanes[8];
    _mm256_storeu_ps(lanes, sf_fast_exp8(_mm256_loadu_ps(in)));
    int ok = lanes[0] == 0.0f && lanes[1] == 0.0f && lanes[2] == 0.0f;
    for (int i = 3; i < 8; i++) ok &= fabs(lanes[i] / exp((double)in[i]) - 1) < 5e-7;
    CHECKF(ok, "fast_exp8: %g %g %g %g %g %g %g %g", lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5],
           lanes[6], lanes[7]);
    double worst = 0;
    for (float x = -87.0f; x < 88.0f; x += 0.37f) {
        _mm256_storeu_ps(lanes, sf_fast_exp8(_mm256_set1_ps(x)));
        worst = fmax(worst, fabs(lanes[0] / exp((double)x) - 1));
    }
    CHECKF(worst < 5e-7, "fast_exp8 relative error %.3g", worst);
}
#endif

static void check_fast_exp(void)
{
    double worst = 0;
    for (double x = -87; x < 88; x += 0.0137)
        worst = fmax(worst, fabs(sf_fast_expf((float)x) / exp((double)(float)x) - 1));
    CHECKF(worst < 5e-7, "fast exp relative error %.3g", worst);
    CHECK(sf_fast_expf(-INFINITY) == 0.0f && sf_fast_expf(-200.0f) == 0.0f);
    /* Extreme inputs: the exponent must be clamped before its conversion to an integer (the
     * sanitizer build aborts on the signed overflow a NaN or huge input used to cause), large
     * inputs saturate at e^88 and NaN stays NaN. */
    {
        volatile float extreme[] = {NAN, -NAN, INFINITY, 1e30f, 3.4e38f, -3.4e38f, 88.5f, 1000.0f};
        const float top = sf_fast_expf(SF_EXP_HI);
        CHECK(isnan(sf_fast_expf(extreme[0])) && isnan(sf_fast_expf(extreme[1])));
        for (int i = 2; i < 5; i++) CHECKF(sf_fast_expf(extreme[i]) == top, "exp(%g) = %g", extreme[i], sf_fast_expf(extreme[i]));
        CHECK(sf_fast_expf(extreme[5]) == 0.0f);
        CHECK(sf_fast_expf(extreme[6]) == top && sf_fast_expf(extreme[7]) == top && isfinite(top));
    }
#ifdef SF_HAVE_AVX2_FMA
    if (sf_cpu_kernels_available(SF_CPU_KERNELS_AVX2)) check_fast_exp8();
    else printf("sf_fast_exp8 not checked: this CPU has no AVX2 and FMA\n");
#endif
}

/* |a - b| <= tol (1 + |b|), or both NaN */
static int close_or_nan(float a, float b, double tol)
{
    return (isnan(a) && isnan(b)) || (a == b) || fabs((double)a - b) <= tol * (1 + fabs((double)b));
}

/* The row kernels of each form on the same inputs (tails of every length, non-finite values):
 * the AVX2 form within rounding of the baseline one, NaN where it gives NaN, nothing written
 * past a row, and the same bits when called again. */
static void check_kernel_forms(void)
{
    /* the choice: the CPU's best unless forced; a set the CPU lacks is refused */
    CHECK(sf_cpu_kernels() == (sf_cpu_kernels_available(SF_CPU_KERNELS_AVX2) ? SF_CPU_KERNELS_AVX2 : SF_CPU_KERNELS_BASELINE));
    CHECK_OK(sf_cpu_kernels_force(SF_CPU_KERNELS_BASELINE));
    CHECK(sf_cpu_kernels() == SF_CPU_KERNELS_BASELINE);
    if (!sf_cpu_kernels_available(SF_CPU_KERNELS_AVX2)) {
        CHECK(sf_cpu_kernels_force(SF_CPU_KERNELS_AVX2) == SF_E_UNSUPPORTED && sf_cpu_kernels() == SF_CPU_KERNELS_BASELINE);
        CHECK_OK(sf_cpu_kernels_force(SF_CPU_KERNELS_AUTO));
        printf("avx2 row kernels not compared: this CPU or build has none\n");
        return;
    }
    enum { SETS = 2, N = 6, W = 45, LD = 48, TQ = 9, TK = 37, TLD = 40, D = 12 };
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -100.0f, 100.0f, 1e-30f, -87.2f, 88.3f};
    const int ns = (int)(sizeof special / sizeof *special);
    float *x = randoms((size_t)N * LD, 3.0), *b = randoms((size_t)N * LD, 1.0);
    for (int i = 0; i < ns; i++) x[i * 7 % (N * LD)] = special[i];
    float sig[SETS][N * LD], swi[SETS][N * LD];
    float s[SETS][TQ * TLD], o[SETS][TQ * D], m[SETS][TQ], l[SETS][TQ];
    float acc[SETS][2 * TQ * D], am[SETS][2 * TQ], al[SETS][2 * TQ];
    int pos[TQ];
    float *s0 = randoms((size_t)TQ * TLD, 2.0), *o0 = randoms((size_t)TQ * D, 1.0), *acc0 = randoms(2 * TQ * D, 1.0);
    s0[5 * TLD + 1] = NAN; /* one NaN logit: its probability is NaN in both forms */
    for (int a = 0; a < TQ; a++) pos[a] = 2 * a + 1;
    for (int set = 0; set < SETS; set++) {
        CHECK_OK(sf_cpu_kernels_force(set ? SF_CPU_KERNELS_AVX2 : SF_CPU_KERNELS_BASELINE));
        for (int i = 0; i < N * LD; i++) sig[set][i] = swi[set][i] = -7.0f; /* past each row: untouched */
        sf_cpu_sigma_rows(N, W, x, LD, sig[set], LD);
        memcpy(swi[set], x, (size_t)N * LD * sizeof(float));
        sf_cpu_swiglu_rows(swi[set], b, (size_t)N * LD - 3);
        /* two steps of one tile: every key visible, then the causal diagonal (first = -2:
         * rows 0 and 1 see nothing), rows starting from a running max and sum of their own */
        memcpy(s[set], s0, sizeof s[set]);
        memcpy(o[set], o0, sizeof o[set]);
        for (int a = 0; a < TQ; a++) m[set][a] = a % 3 ? 0.5f : -INFINITY, l[set][a] = a % 3 ? 2.0f : 0.0f;
        sf_cpu_softmax_tile(s[set], TLD, TQ, TK, TK, m[set], l[set], o[set], D);
        memcpy(s[set], s0, sizeof s[set]);
        sf_cpu_softmax_tile(s[set], TLD, TQ, TK, -2, m[set], l[set], o[set], D);
        memcpy(acc[set], acc0, sizeof acc[set]);
        for (int i = 0; i < 2 * TQ; i++) am[set][i] = i % 4 ? 1.5f : 0.0f, al[set][i] = i % 4 ? 3.0f : 0.0f;
        sf_cpu_merge_tile(TQ, D, pos, o[set], m[set], l[set], acc[set], am[set], al[set]);
    }
    int ok_sig = 1, ok_swi = 1, ok_tail = 1, ok_soft = 1, ok_merge = 1;
    for (int i = 0; i < N * LD; i++) {
        if (i % LD >= W) ok_tail &= sig[0][i] == -7.0f && sig[1][i] == -7.0f;
        else ok_sig &= close_or_nan(sig[1][i], sig[0][i], 1e-6);
        if (i >= N * LD - 3) ok_tail &= swi[0][i] == x[i] && swi[1][i] == x[i];
        else ok_swi &= close_or_nan(swi[1][i], swi[0][i], 1e-6);
    }
    for (int i = 0; i < TQ * TLD; i++) ok_soft &= close_or_nan(s[1][i], s[0][i], 1e-6);
    for (int a = 0; a < TQ; a++) ok_soft &= m[1][a] == m[0][a] && close_or_nan(l[1][a], l[0][a], 1e-6);
    for (int i = 0; i < TQ * D; i++) ok_soft &= close_or_nan(o[1][i], o[0][i], 1e-6);
    for (int i = 0; i < 2 * TQ * D; i++) ok_merge &= close_or_nan(acc[1][i], acc[0][i], 1e-6);
    for (int i = 0; i < 2 * TQ; i++) ok_merge &= am[1][i] == am[0][i] && close_or_nan(al[1][i], al[0][i], 1e-6);
    CHECK(isnan(sig[0][0]) && isnan(sig[1][0]) && isnan(s[0][5 * TLD + 1]) && isnan(s[1][5 * TLD + 1]));
    CHECK(s[0][0] == 0 && s[1][TLD + 1] == 0 && s[1][2 * TLD] != 0 && s[1][2 * TLD + 1] == 0); /* the diagonal */
    CHECKF(ok_sig && ok_tail, "sigma rows: avx2 against baseline (tails untouched: %d)", ok_tail);
    CHECK(ok_swi);
    CHECK(ok_soft);
    CHECK(ok_merge);
    /* one form, called again: the same bits */
    float again[N * LD];
    sf_cpu_sigma_rows(N, W, x, LD, again, LD);
    int same = 1;
    for (int i = 0; i < N * LD; i++) same &= i % LD >= W || memcmp(&again[i], &sig[1][i], sizeof again[i]) == 0;
    CHECK(same);
    CHECK_OK(sf_cpu_kernels_force(SF_CPU_KERNELS_AUTO));
    CHECK(sf_cpu_kernels() == SF_CPU_KERNELS_AVX2);
    free(x), free(b), free(s0), free(o0), free(acc0);
}

/* Every op of the CPU backend against the float64 loops, on the kernel set forced now. */
static void check_backend(sf_backend *be)
{
    check_buffers(be);
    check_dense_ops(be);
    check_summary(be);
    check_flops();
    for (int causal = 0; causal <= 1; causal++) {
        check_attention(be, "8:1,16:2,32:4", 3, 8, 0, 32, 32, causal, 0);
        check_attention(be, "8:1,16:2,32:4", 3, 8, 5, 32, 21, causal, 4);        /* partial, ld > H*d, globals */
        check_attention(be, "16:2", 3, 16, 0, 32, 32, causal, 0);                  /* uncovered rows are 0 */
        check_attention(be, "8:2", 3, 8, 3, 32, 27, causal, 0);                    /* uncovered, partial */
        check_attention(be, "16:4", 2, 8, 0, 32, 19, causal, 2);                   /* uncovered but globals */
        check_attention(be, "32:4", 4, 8, 0, 32, 1, causal, 3);                    /* one row */
        check_attention(be, "32:4", 4, 8, 0, 32, 1, causal, 0);                    /* one row, no globals */
        check_attention(be, "256:1,512:2", 2, 32, 0, 512, 300, causal, 0);         /* several tiles */
        check_attention(be, "512:1", 1, 64, 0, 512, 512, causal, 200);            /* many globals */
        check_attention(be, "384:3,768:1", 4, 24, 8, 768, 701, causal, 5);         /* tails of every size */
        check_attention(be, "128:1,128:1", 2, 16, 0, 128, 129 - 2, causal, 0);     /* a branch twice */
        check_attention(be, "1:1,4:4", 4, 8, 0, 8, 8, causal, 0);                  /* one-key windows */
        attn_qscale = 4.0; /* peaky softmax: the running max changes from tile to tile */
        check_attention(be, "256:1", 2, 64, 0, 512, 512, causal, 3);
        attn_qscale = 1.0;
    }
    check_attention_threads();
    check_masked_non_finite(be, "256:1", 150, NAN);
    check_masked_non_finite(be, "256:1", 130, INFINITY);
    check_masked_non_finite(be, "64:1,128:2", 100, NAN);
    check_masked_non_finite(be, "256:1", 5, NAN); /* inside the first tile */
    check_memory(be, SF_MEMORY_DELTA, 50, 3, 8, 2, 0);
    check_memory(be, SF_MEMORY_LINEAR, 17, 2, 16, 0, 0);
    check_memory(be, SF_MEMORY_DELTA, 300, 2, 64, 16, 0);
    check_memory(be, SF_MEMORY_LINEAR, 1, 4, 32, 0, 0);
    check_memory(be, SF_MEMORY_DELTA, 9, 2, 4, 0, 1); /* z == 0: retrieval is 0 */
    check_memory(be, SF_MEMORY_NONE, 9, 2, 4, 0, 0);
}

int main(void)
{
    sf_backend *be;
    CHECK_OK(sf_backend_create("cpu", 0, &be));
    check_fast_exp();
    check_kernel_forms();
    /* every op on each kernel set this CPU has (vector_rows.h), then on the CPU's choice */
    static const sf_cpu_kernel_set sets[] = {SF_CPU_KERNELS_BASELINE, SF_CPU_KERNELS_AVX2};
    for (int i = 0; i < 2; i++) {
        if (!sf_cpu_kernels_available(sets[i])) continue;
        CHECK_OK(sf_cpu_kernels_force(sets[i]));
        check_backend(be);
    }
    CHECK_OK(sf_cpu_kernels_force(SF_CPU_KERNELS_AUTO));

    sf_backend *other = (sf_backend *)1;
    CHECK(sf_backend_create("quantum", 0, &other) == SF_E_BACKEND && other == NULL);
    CHECK(strstr(sf_last_error(), "quantum") != NULL && strstr(sf_last_error(), "cpu") != NULL);
    /* cuda exists where a GPU does (tests/test_backend_ops.c checks its ops); elsewhere it
     * fails cleanly, naming the device */
    other = (sf_backend *)1;
    int cuda_rc = sf_backend_create("cuda", 0, &other);
    if (cuda_rc == SF_OK) {
        CHECK(other && strcmp(other->ops->name, "cuda") == 0);
        sf_backend_free(other);
    } else {
        CHECK(cuda_rc == SF_E_BACKEND && other == NULL);
        CHECK(strstr(sf_last_error(), "cuda") != NULL);
    }
    const char *const *names = sf_backend_names();
    CHECK(names && names[0] && strcmp(names[0], "cpu") == 0);
    sf_backend_free(be);
    sf_backend_free(NULL);
    return check_finish("test_kernels");
}
