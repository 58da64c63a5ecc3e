/* A head-parallel rank's parts in bf16 (kernels/backend_ext.h, "head-parallel parts"), on the
 * CUDA backend against float64 on the host:
 *   - part_type: bf16 in precisions bf16 and fp8, float32 in f32 (whose ranks must stay exact);
 *   - matmul_typed writing bf16 y (no accumulate) from float32 and from bf16 x: within one bf16
 *     rounding of the bf16 product; accumulate with a bf16 y is refused;
 *   - ffn_partial writing bf16 y: the MLP of rmsnorm(x) without the residual, x left unchanged;
 *     in fp8 too (it used to add x's own rows to its part);
 *   - qkv_from and ffn_partial_from (bf16 only): from u = rmsnorm_typed(x) bit for bit qkv's and
 *     ffn_partial's outputs from x;
 *   - add_typed: x += y, bit for bit the float32 sum of x and the widened bf16 (or float32) y,
 *     on counts and offsets that take the vector kernel and ones that do not.
 * Outputs are poisoned with NaN first. Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

#define TOL_BF16_PART 2.5e-2 /* a bf16 product (2e-2, test_backend_ops) rounded once more */
#define TOL_FP8_PART 0.15    /* the fp8 MLP chain (test_cuda_fp8's TOL_FP8_CHAIN) */

static check_rng rng = {4242};

static void *dev(sf_backend *be, const void *host, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes);
    CHECK(d != NULL);
    if (d && host) CHECK_OK(be->ops->upload(be, d, host, bytes));
    return d;
}

static float *normal(size_t count, double scale)
{
    float *h = malloc(count * sizeof *h + 4);
    check_fill_normal(&rng, h, count, scale);
    return h;
}

/* a new device buffer of count bf16 NaNs */
static void *bf16_nan(sf_backend *be, size_t count)
{
    uint16_t *bits = malloc(count * 2 + 2);
    for (size_t i = 0; i < count; i++) bits[i] = 0x7fc0;
    void *d = dev(be, bits, count * 2);
    free(bits);
    return d;
}

/* want[n, out] = x[n, in] w[out, in]^T in float64 */
static float *product(const float *x, const float *w, int n, int in, int out)
{
    float *y = malloc((size_t)n * out * sizeof *y + 4);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < in; k++) s += (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];
            y[(size_t)i * out + o] = (float)s;
        }
    return y;
}

static void check_matmul(sf_backend *be, const char *label, int n, int in, int out)
{
    float *hx = normal((size_t)n * in, 1), *hw = normal((size_t)out * in, 1.0 / sqrt(in));
    float *want = product(hx, hw, n, in, out);
    float *x = dev(be, hx, (size_t)n * in * 4), *w = dev(be, hw, (size_t)out * in * 4);
    CHECK_OK(sf_be_prepare_weights(be, 1, (const float *const *)&w, out, in));
    void *y = bf16_nan(be, (size_t)n * out);
    CHECK_OK(sf_be_matmul_typed(be, n, in, out, SF_DTYPE_F32, x, in, w, SF_DTYPE_BF16, y, out, 0));
    float *got = check_bf16_download(be, y, (size_t)n * out);
    const double tol = strcmp(label, "fp8") == 0 ? TOL_FP8_PART : TOL_BF16_PART;
    double err = check_rel_err_f32(got, want, (size_t)n * out);
    CHECKF(err <= tol, "%s matmul_typed (float32 x, bf16 y) n=%d in=%d out=%d: relative error %.3g", label, n, in, out,
           err);
    free(got);
    /* bf16 x: the same product from x rounded to bf16 */
    uint16_t *bits = malloc((size_t)n * in * 2 + 2);
    for (size_t i = 0; i < (size_t)n * in; i++) bits[i] = check_bf16_bits(hx[i]);
    void *xb = dev(be, bits, (size_t)n * in * 2);
    void *y2 = bf16_nan(be, (size_t)n * out);
    CHECK_OK(sf_be_matmul_typed(be, n, in, out, SF_DTYPE_BF16, xb, in, w, SF_DTYPE_BF16, y2, out, 0));
    got = check_bf16_download(be, y2, (size_t)n * out);
    err = check_rel_err_f32(got, want, (size_t)n * out);
    CHECKF(err <= tol, "%s matmul_typed (bf16 x, bf16 y) n=%d in=%d out=%d: relative error %.3g", label, n, in, out,
           err);
    /* a bf16 result is written, never accumulated */
    CHECK(sf_be_matmul_typed(be, n, in, out, SF_DTYPE_F32, x, in, w, SF_DTYPE_BF16, y, out, 1) == SF_E_INVAL);
    printf("  %-4s matmul_typed to bf16 n=%3d in=%3d out=%3d: relative error %.2e\n", label, n, in, out, err);
    free(got), free(bits), free(hx), free(hw), free(want);
    be->ops->free(be, x), be->ops->free(be, w), be->ops->free(be, y), be->ops->free(be, xb), be->ops->free(be, y2);
}

static void check_ffn(sf_backend *be, const char *label, int n, int dim, int hidden)
{
    const size_t nx = (size_t)n * dim;
    float *hx = normal(nx, 1), *hn = normal((size_t)dim, 1);
    float *h1 = normal((size_t)hidden * dim, 1.0 / sqrt(dim)), *h3 = normal((size_t)hidden * dim, 1.0 / sqrt(dim));
    float *h2 = normal((size_t)dim * hidden, 1.0 / sqrt(hidden));
    /* float64 reference: u = rmsnorm(x), g = silu(u W1^T) * (u W3^T), want = g W2^T */
    float *u = malloc(nx * sizeof *u + 4);
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int k = 0; k < dim; k++) ss += (double)hx[(size_t)i * dim + k] * hx[(size_t)i * dim + k];
        const double r = 1.0 / sqrt(ss / dim + 1e-6);
        for (int k = 0; k < dim; k++) u[(size_t)i * dim + k] = (float)(hx[(size_t)i * dim + k] * r * hn[k]);
    }
    float *a = product(u, h1, n, dim, hidden), *b = product(u, h3, n, dim, hidden);
    for (size_t i = 0; i < (size_t)n * hidden; i++) a[i] = (float)(a[i] / (1.0 + exp(-(double)a[i])) * b[i]);
    float *want = product(a, h2, n, hidden, dim);
    float *x = dev(be, hx, nx * 4), *norm = dev(be, hn, (size_t)dim * 4);
    float *w1 = dev(be, h1, (size_t)hidden * dim * 4), *w3 = dev(be, h3, (size_t)hidden * dim * 4);
    float *w2 = dev(be, h2, (size_t)dim * hidden * 4);
    const float *group[2] = {w1, w3};
    CHECK_OK(sf_be_prepare_weights(be, 2, group, hidden, dim));
    CHECK_OK(sf_be_prepare_weights(be, 1, (const float *const *)&w2, dim, hidden));
    float *du = dev(be, NULL, nx * 4), *d1 = dev(be, NULL, (size_t)n * hidden * 4);
    float *d3 = dev(be, NULL, (size_t)n * hidden * 4);
    void *y = bf16_nan(be, nx);
    CHECK_OK(sf_be_ffn_partial(be, n, dim, hidden, x, norm, 1e-6f, w1, w3, w2, du, d1, d3, SF_DTYPE_BF16, y));
    float *got = check_bf16_download(be, y, nx), *x_after = malloc(nx * 4 + 4);
    CHECK_OK(be->ops->download(be, x_after, x, nx * 4));
    const double tol = strcmp(label, "fp8") == 0 ? TOL_FP8_PART : TOL_BF16_PART;
    const double err = check_rel_err_f32(got, want, nx);
    CHECKF(err <= tol, "%s ffn_partial (bf16 y) n=%d dim=%d hidden=%d: relative error %.3g", label, n, dim, hidden,
           err);
    CHECKF(memcmp(x_after, hx, nx * 4) == 0, "%s ffn_partial (bf16 y) n=%d: x changed", label, n);
    printf("  %-4s ffn_partial to bf16 n=%3d dim=%3d hidden=%3d: relative error %.2e\n", label, n, dim, hidden, err);
    free(hx), free(hn), free(h1), free(h3), free(h2), free(u), free(a), free(b), free(want), free(got), free(x_after);
    void *bufs[] = {x, norm, w1, w3, w2, du, d1, d3, y};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
}

/* qkv_from and ffn_partial_from given u = rmsnorm_typed(x) in bf16: bit for bit qkv's and
 * ffn_partial's outputs from x and the norm (the products see the same bf16 u) */
static void check_from(sf_backend *be, int n, int dim, int width, int hidden)
{
    const size_t nx = (size_t)n * dim, nq = (size_t)n * width;
    float *hx = normal(nx, 1), *hn = normal((size_t)dim, 1), *hq = normal((size_t)3 * width * dim, 1.0 / sqrt(dim));
    float *h13 = normal((size_t)2 * hidden * dim, 1.0 / sqrt(dim)),
          *h2 = normal((size_t)dim * hidden, 1.0 / sqrt(hidden));
    float *x = dev(be, hx, nx * 4), *norm = dev(be, hn, (size_t)dim * 4),
          *wqkv = dev(be, hq, (size_t)3 * width * dim * 4);
    float *w13 = dev(be, h13, (size_t)2 * hidden * dim * 4), *w2 = dev(be, h2, (size_t)dim * hidden * 4);
    const float *qkv_group[3] = {wqkv, wqkv + (size_t)width * dim, wqkv + (size_t)2 * width * dim};
    const float *group13[2] = {w13, w13 + (size_t)hidden * dim};
    CHECK_OK(sf_be_prepare_weights(be, 3, qkv_group, width, dim));
    CHECK_OK(sf_be_prepare_weights(be, 2, group13, hidden, dim));
    CHECK_OK(sf_be_prepare_weights(be, 1, (const float *const *)&w2, dim, hidden));
    unsigned char *q = bf16_nan(be, 3 * nq), *q2 = bf16_nan(be, 3 * nq);
    void *u = bf16_nan(be, nx), *y = bf16_nan(be, nx), *y2 = bf16_nan(be, nx);
    float *du = dev(be, NULL, nx * 4), *d1 = dev(be, NULL, (size_t)n * hidden * 4 * 2);
    float *d3 = dev(be, NULL, (size_t)n * hidden * 4);
    CHECKF(sf_be_normed_type(be) == SF_DTYPE_BF16, "normed_type in bf16: %d", (int)sf_be_normed_type(be));
    CHECK_OK(sf_be_qkv(be, n, dim, width, x, norm, 1e-6f, qkv_group[0], qkv_group[1], qkv_group[2], SF_DTYPE_BF16, q,
                       q + nq * 2, q + nq * 4, du));
    CHECK_OK(sf_be_rmsnorm_typed(be, n, dim, x, norm, 1e-6f, SF_DTYPE_BF16, u));
    CHECK_OK(sf_be_qkv_from(be, n, dim, width, u, qkv_group[0], qkv_group[1], qkv_group[2], SF_DTYPE_BF16, q2,
                            q2 + nq * 2, q2 + nq * 4));
    CHECK_OK(sf_be_ffn_partial(be, n, dim, hidden, x, norm, 1e-6f, group13[0], group13[1], w2, du, d1, d3,
                               SF_DTYPE_BF16, y));
    CHECK_OK(sf_be_ffn_partial_from(be, n, dim, hidden, u, group13[0], group13[1], w2, d1, d3, SF_DTYPE_BF16, y2));
    float *a = check_bf16_download(be, q, 3 * nq), *b = check_bf16_download(be, q2, 3 * nq);
    float *c = check_bf16_download(be, y, nx), *d = check_bf16_download(be, y2, nx);
    CHECKF(memcmp(a, b, 3 * nq * 4) == 0, "qkv_from n=%d dim=%d width=%d: not qkv's bits", n, dim, width);
    CHECKF(memcmp(c, d, nx * 4) == 0, "ffn_partial_from n=%d dim=%d hidden=%d: not ffn_partial's bits", n, dim, hidden);
    printf("  bf16 qkv_from and ffn_partial_from n=%3d dim=%3d: bit for bit qkv's and ffn_partial's\n", n, dim);
    free(hx), free(hn), free(hq), free(h13), free(h2), free(a), free(b), free(c), free(d);
    void *bufs[] = {x, norm, wqkv, w13, w2, q, q2, u, y, y2, du, d1, d3};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
}

/* x += y for `count` elements at element offset `off` of both buffers */
static void check_add(sf_backend *be, sf_dtype ytype, size_t count, size_t off)
{
    const size_t total = count + off;
    float *hx = normal(total, 1), *hy = normal(total, 1);
    uint16_t *bits = malloc(total * 2 + 2);
    for (size_t i = 0; i < total; i++) bits[i] = check_bf16_bits(hy[i]);
    const int bf16 = ytype == SF_DTYPE_BF16;
    float *x = dev(be, hx, total * 4);
    unsigned char *y = dev(be, bf16 ? (const void *)bits : hy, total * (bf16 ? 2 : 4));
    CHECK_OK(sf_be_add_typed(be, count, x + off, ytype, y + off * (bf16 ? 2 : 4)));
    float *got = malloc(total * 4 + 4);
    CHECK_OK(be->ops->download(be, got, x, total * 4));
    size_t wrong = 0;
    for (size_t i = 0; i < total; i++) {
        const float want = i < off ? hx[i] : hx[i] + (bf16 ? check_bf16_float(bits[i]) : hy[i]);
        wrong += memcmp(&got[i], &want, 4) != 0;
    }
    CHECKF(wrong == 0, "add_typed (%s y) count=%zu offset=%zu: %zu elements not the float32 sum", bf16 ? "bf16" : "f32",
           count, off, wrong);
    free(hx), free(hy), free(bits), free(got);
    be->ops->free(be, x), be->ops->free(be, y);
}

int main(void)
{
    if (!check_have_gpu()) {
        printf("test_cuda_parts: skipped: no GPU\n");
        return 77;
    }
    static const struct {
        sf_precision precision;
        const char *label;
        sf_dtype part;
    } modes[] = {{SF_PRECISION_F32, "f32", SF_DTYPE_F32},
                 {SF_PRECISION_BF16, "bf16", SF_DTYPE_BF16},
                 {SF_PRECISION_FP8, "fp8", SF_DTYPE_BF16}};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        sf_backend *be = NULL;
        const int rc = sf_backend_create_ex("cuda", 0, modes[m].precision, &be);
        if (modes[m].precision == SF_PRECISION_FP8 && rc == SF_E_UNSUPPORTED) {
            printf("  fp8: not on this GPU (%s)\n", sf_last_error());
            continue;
        }
        CHECK_OK(rc);
        if (!be) continue;
        CHECKF(sf_be_part_type(be) == modes[m].part, "%s: part_type %d, want %d", modes[m].label,
               (int)sf_be_part_type(be), (int)modes[m].part);
        if (modes[m].part == SF_DTYPE_BF16) {
            CHECK_OK(sf_be_reserve(be, 512, 1024, 0, 0));
            check_matmul(be, modes[m].label, 1, 64, 32);
            check_matmul(be, modes[m].label, 37, 256, 96);
            check_matmul(be, modes[m].label, 300, 512, 256);
            check_ffn(be, modes[m].label, 16, 64, 128);
            check_ffn(be, modes[m].label, 129, 256, 512);
        }
        if (modes[m].precision == SF_PRECISION_BF16) {
            check_from(be, 64, 256, 128, 512);
            check_from(be, 300, 512, 256, 1024);
        } else {
            CHECKF(sf_be_normed_type(be) == SF_DTYPE_F32, "%s: normed_type %d, want none", modes[m].label,
                   (int)sf_be_normed_type(be));
        }
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const sf_dtype t = bf16 ? SF_DTYPE_BF16 : SF_DTYPE_F32;
            check_add(be, t, 8192, 0);   /* the vector kernel */
            check_add(be, t, 8 * 37, 8); /* an offset that keeps 16-byte alignment */
            check_add(be, t, 1001, 3);   /* neither */
            check_add(be, t, 1, 0);
        }
        CHECK_OK(be->ops->sync(be));
        sf_backend_free(be);
    }
    return check_finish("test_cuda_parts");
}
