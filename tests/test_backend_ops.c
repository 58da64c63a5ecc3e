/* Every op of sf_backend_ops on every non-CPU backend (today: cuda in f32, in bf16, in bf16 with
 * every product forced through cuBLASLt (setting gemm=lt), and the MLP in bf16 on its composed
 * path (gate_up=0); the memory ops also on each of their kernels (memory=fma, memory=mma))
 * against the CPU backend, on random inputs of several shapes. Outputs are poisoned with NaN before
 * each run, so an element an op fails to write fails the comparison. Relative error (L2) at
 * most 1e-4 in f32; in bf16 the products and attention may reach 2e-2, the memory's products
 * (bf16 operands, float32 M and z) 4e-3, the other ops (norms, pooling, z: float32 in every
 * precision) stay at 1e-4.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"
#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#endif

#define TOL_F32 1e-4
#define TOL_BF16 2e-2
/* outputs written as bf16 (qkv with SF_DTYPE_BF16) carry one more rounding, 2^-9 relative at most */
#define TOL_BF16_OUTPUT 4e-3

static sf_backend *cpu;
static check_rng rng = {12345};

/* The backend's extension table, or an empty one: which fused ops it has. They are called
 * through the sf_be_* functions, as the stages call them. */
static const sf_backend_ext *ext(const sf_backend *be)
{
    static const sf_backend_ext none;
    return be->ops->ext ? be->ops->ext : &none;
}

typedef struct target {
    sf_backend *be;
    const char *label;
    double tol_products; /* matmul and attention */
    double tol_memory;   /* M after an update, a after a mix: their products take bf16 operands in bf16 */
} target;

static float *random_host(size_t count, double scale)
{
    float *h = malloc(count * sizeof *h + sizeof *h);
    check_fill_normal(&rng, h, count, scale);
    return h;
}

static float *positive_host(size_t count, double lo, double hi)
{
    float *h = malloc(count * sizeof *h + sizeof *h);
    for (size_t i = 0; i < count; i++) h[i] = (float)(lo + (hi - lo) * check_rng_uniform(&rng));
    return h;
}

static void *to_backend(sf_backend *be, const void *host, size_t bytes)
{
    void *d = be->ops->alloc(be, bytes ? bytes : 1);
    CHECKF(d != NULL, "%s alloc of %zu bytes: %s", be->ops->name, bytes, sf_last_error());
    if (d && host && bytes) CHECK_OK(be->ops->upload(be, d, host, bytes));
    return d;
}

static void poison(sf_backend *be, void *d, size_t count)
{
    float *nan = malloc(count * sizeof *nan + 4);
    for (size_t i = 0; i < count; i++) nan[i] = NAN;
    CHECK_OK(be->ops->upload(be, d, nan, count * sizeof(float)));
    free(nan);
}

static float *to_host(sf_backend *be, const void *d, size_t count)
{
    float *h = malloc(count * sizeof *h + 4);
    CHECK_OK(be->ops->download(be, h, d, count * sizeof(float)));
    return h;
}

/* Compares `count` floats of a device buffer on each backend; reports and returns the error. */
static double compare(const char *what, const target *t, const void *got_dev, const void *want_dev, size_t count,
                      double tol)
{
    float *got = to_host(t->be, got_dev, count), *want = to_host(cpu, want_dev, count);
    double err = check_rel_err_f32(got, want, count);
    CHECKF(err <= tol, "%s %s: relative error %.3g (tolerance %.1g)", t->label, what, err, tol);
    free(got);
    free(want);
    return err;
}

/* h rounded to bf16 values in place (what the CPU reference then computes on) */
static void round_to_bf16(float *h, size_t count)
{
    for (size_t i = 0; i < count; i++) h[i] = check_bf16_float(check_bf16_bits(h[i]));
}

/* A new backend buffer holding h as bf16. */
static void *bf16_upload(sf_backend *be, const float *h, size_t count)
{
    uint16_t *bits = malloc(count * 2 + 2);
    for (size_t i = 0; i < count; i++) bits[i] = check_bf16_bits(h[i]);
    void *d = to_backend(be, bits, count * 2);
    free(bits);
    return d;
}

/* A pair of the same host data on the CPU backend and on the target. */
typedef struct pair {
    void *c, *g;
} pair;

static pair both(const target *t, const void *host, size_t bytes)
{
    pair p = {to_backend(cpu, host, bytes), to_backend(t->be, host, bytes)};
    return p;
}

static void both_poison(const target *t, pair p, size_t count)
{
    poison(cpu, p.c, count);
    poison(t->be, p.g, count);
}

static void both_free(const target *t, pair p)
{
    cpu->ops->free(cpu, p.c);
    t->be->ops->free(t->be, p.g);
}

static void test_buffers(const target *t)
{
    sf_backend *be = t->be;
    const size_t n = 1000;
    float *h = random_host(n, 1), *back = malloc(n * sizeof *back);
    float *a = to_backend(be, h, n * sizeof(float)), *b = be->ops->alloc(be, n * sizeof(float));
    CHECK_OK(be->ops->copy(be, b, a, n * sizeof(float)));
    CHECK_OK(be->ops->download(be, back, b, n * sizeof(float)));
    CHECKF(memcmp(back, h, n * sizeof(float)) == 0, "%s: upload/copy/download round trip differs", t->label);
    CHECK_OK(be->ops->zero(be, b + 10, 100 * sizeof(float)));
    CHECK_OK(be->ops->sync(be));
    CHECK_OK(be->ops->download(be, back, b, n * sizeof(float)));
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= back[i] == (i >= 10 && i < 110 ? 0.0f : h[i]);
    CHECKF(ok, "%s: zero wrote outside [10, 110) or missed part of it", t->label);
    be->ops->free(be, a);
    be->ops->free(be, b);
    be->ops->free(be, NULL);
    free(h);
    free(back);
}

static void test_matmul(const target *t)
{
    static const int shapes[][5] = {/* n, in, out, ldx pad, ldy pad */
                                    {1, 8, 8, 0, 0},     {37, 24, 40, 3, 5},   {128, 64, 96, 0, 0},
                                    {70, 130, 33, 4, 7}, {256, 128, 384, 0, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        const int ldx = in + shapes[s][3], ldy = out + shapes[s][4];
        for (int variant = 0; variant < 3; variant++) {
            /* variant 0: overwrite, 1: accumulate, 2: a weight never prepared */
            float *hx = random_host((size_t)n * ldx, 1), *hw = random_host((size_t)out * in, 1.0 / sqrt(in));
            float *hy = random_host((size_t)n * ldy, 1);
            pair x = both(t, hx, (size_t)n * ldx * 4), w = both(t, hw, (size_t)out * in * 4);
            pair y = both(t, hy, (size_t)n * ldy * 4);
            if (variant != 2) CHECK_OK(sf_be_prepare_weights(t->be, 1, (const float *const *)&w.g, out, in));
            if (variant == 0) both_poison(t, y, (size_t)n * ldy);
            if (variant == 0) {
                /* the padding columns must stay as they were: put finite values there */
                for (int i = 0; i < n; i++)
                    for (int j = out; j < ldy; j++) hy[(size_t)i * ldy + j] = 7.0f;
                for (int i = 0; i < n; i++) {
                    CHECK_OK(cpu->ops->upload(cpu, (float *)y.c + (size_t)i * ldy + out, hy + (size_t)i * ldy + out,
                                              (size_t)(ldy - out) * 4));
                    CHECK_OK(t->be->ops->upload(t->be, (float *)y.g + (size_t)i * ldy + out,
                                                hy + (size_t)i * ldy + out, (size_t)(ldy - out) * 4));
                }
            }
            CHECK_OK(cpu->ops->matmul(cpu, n, in, out, x.c, ldx, w.c, y.c, ldy, variant == 1));
            CHECK_OK(t->be->ops->matmul(t->be, n, in, out, x.g, ldx, w.g, y.g, ldy, variant == 1));
            char what[96];
            snprintf(what, sizeof what, "matmul n=%d in=%d out=%d ldx=%d ldy=%d %s", n, in, out, ldx, ldy,
                     variant == 0 ? "overwrite" : variant == 1 ? "accumulate" : "unprepared");
            compare(what, t, y.g, y.c, (size_t)n * ldy, variant == 2 ? TOL_F32 : t->tol_products);
            both_free(t, x), both_free(t, w), both_free(t, y);
            free(hx), free(hw), free(hy);
        }
    }
}

/* The fused products against the CPU composed from plain ops: products of prepared (and
 * grouped) weights, qkv (rmsnorm, then three products) and ffn (x += W2 (silu(W1 u) * W3 u),
 * u = rmsnorm(x)), which the CPU backend composes (kernels/backend.c). */
static void test_fused_products(const target *t)
{
    /* every shape but {5, 16, 20} fits the fused gate/up kernel (dim and hidden % 8), with
     * partial row and column tiles; the last two have the shapes the lab's SwiGLU + W2 kernel
     * took (dim % 256, hidden % 128; rows not a multiple of its 128) */
    static const int shapes[][3] = {/* n, dim, hidden */ {1, 8, 16},     {37, 24, 40},     {128, 64, 256},
                                    {200, 96, 384}, {50, 32, 72},     {5, 16, 20},
                                    {300, 256, 384}, {129, 512, 128}};
    char what[96];
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], dim = shapes[s][1], hidden = shapes[s][2];
        const size_t nx = (size_t)n * dim, nh = (size_t)n * hidden;
        float *hx = random_host(nx, 1), *hn = random_host((size_t)dim, 1);
        float *hw[3], *hw2 = random_host((size_t)dim * hidden, 1.0 / sqrt(hidden));
        for (int i = 0; i < 3; i++) hw[i] = random_host((size_t)hidden * dim, 1.0 / sqrt(dim));
        pair x = both(t, hx, nx * 4), norm = both(t, hn, (size_t)dim * 4), w2 = both(t, hw2, (size_t)dim * hidden * 4);
        pair w[3], y[3];
        for (int i = 0; i < 3; i++) {
            w[i] = both(t, hw[i], (size_t)hidden * dim * 4), y[i] = both(t, NULL, nh * 4);
            both_poison(t, y[i], nh);
        }
        /* every other shape prepares the first two as a group (ffn's W1|W3: one product) */
        const float *group[2] = {w[0].g, w[1].g};
        int grouped = (s % 2 == 1) && ext(t->be)->prepare_weight_group;
        if (grouped) CHECK_OK(sf_be_prepare_weights(t->be, 2, group, hidden, dim));
        for (int i = grouped ? 2 : 0; i < 3; i++)
            CHECK_OK(sf_be_prepare_weights(t->be, 1, (const float *const *)&w[i].g, hidden, dim));
        CHECK_OK(sf_be_prepare_weights(t->be, 1, (const float *const *)&w2.g, dim, hidden));
        /* each prepared weight (grouped or not) multiplied on its own */
        for (int i = 0; i < 3; i++) {
            CHECK_OK(t->be->ops->matmul(t->be, n, dim, hidden, x.g, dim, w[i].g, y[i].g, hidden, 0));
            CHECK_OK(cpu->ops->matmul(cpu, n, dim, hidden, x.c, dim, w[i].c, y[i].c, hidden, 0));
            snprintf(what, sizeof what, "matmul (prepared%s) n=%d in=%d out=%d product %d",
                     grouped && i < 2 ? ", grouped" : "", n, dim, hidden, i);
            compare(what, t, y[i].g, y[i].c, nh, t->tol_products);
        }
        if (ext(t->be)->qkv) {
            pair u = both(t, NULL, nx * 4);
            for (int i = 0; i < 3; i++) both_poison(t, y[i], nh);
            CHECK_OK(sf_be_qkv(t->be, n, dim, hidden, x.g, norm.g, 1e-6f, w[0].g, w[1].g, w[2].g, SF_DTYPE_F32,
                                     y[0].g, y[1].g, y[2].g, u.g));
            CHECK_OK(cpu->ops->rmsnorm(cpu, n, dim, x.c, norm.c, 1e-6f, u.c));
            for (int i = 0; i < 3; i++) {
                CHECK_OK(cpu->ops->matmul(cpu, n, dim, hidden, u.c, dim, w[i].c, y[i].c, hidden, 0));
                snprintf(what, sizeof what, "qkv n=%d dim=%d width=%d product %d", n, dim, hidden, i);
                compare(what, t, y[i].g, y[i].c, nh, t->tol_products);
            }
            /* the same products written as bf16 (into NaN-poisoned buffers) */
            void *yb[3];
            float *nan = malloc(nh * 4 + 4);
            for (size_t i = 0; i < nh; i++) nan[i] = NAN;
            for (int i = 0; i < 3; i++) yb[i] = bf16_upload(t->be, nan, nh);
            CHECK_OK(sf_be_qkv(t->be, n, dim, hidden, x.g, norm.g, 1e-6f, w[0].g, w[1].g, w[2].g, SF_DTYPE_BF16,
                                     yb[0], yb[1], yb[2], u.g));
            const double tol = t->tol_products > TOL_BF16_OUTPUT ? t->tol_products : TOL_BF16_OUTPUT;
            for (int i = 0; i < 3; i++) {
                float *got = check_bf16_download(t->be, yb[i], nh), *want = to_host(cpu, y[i].c, nh);
                const double err = check_rel_err_f32(got, want, nh);
                CHECKF(err <= tol, "%s qkv (bf16 out) n=%d dim=%d width=%d product %d: relative error %.3g", t->label, n,
                       dim, hidden, i, err);
                free(got), free(want);
                t->be->ops->free(t->be, yb[i]);
            }
            free(nan);
            both_free(t, u);
        }
        if (ext(t->be)->ffn) {
            pair u = both(t, NULL, nx * 4);
            for (int i = 0; i < 2; i++) both_poison(t, y[i], nh);
            CHECK_OK(sf_be_ffn(t->be, n, dim, hidden, x.g, norm.g, 1e-6f, w[0].g, w[1].g, w2.g, u.g, y[0].g,
                                     y[1].g));
            CHECK_OK(cpu->ops->rmsnorm(cpu, n, dim, x.c, norm.c, 1e-6f, u.c));
            CHECK_OK(cpu->ops->matmul(cpu, n, dim, hidden, u.c, dim, w[0].c, y[0].c, hidden, 0));
            CHECK_OK(cpu->ops->matmul(cpu, n, dim, hidden, u.c, dim, w[1].c, y[1].c, hidden, 0));
            CHECK_OK(cpu->ops->swiglu(cpu, n, hidden, y[0].c, y[1].c));
            CHECK_OK(cpu->ops->matmul(cpu, n, hidden, dim, y[0].c, hidden, w2.c, x.c, dim, 1));
            snprintf(what, sizeof what, "ffn n=%d dim=%d hidden=%d (x after the residual)", n, dim, hidden);
            compare(what, t, x.g, x.c, nx, t->tol_products);
            /* the residual alone would pass a loose check: the MLP's own contribution must match too */
            float *gx = to_host(t->be, x.g, nx), *cx = to_host(cpu, x.c, nx);
            for (size_t i = 0; i < nx; i++) gx[i] -= hx[i], cx[i] -= hx[i];
            double err = check_rel_err_f32(gx, cx, nx);
            CHECKF(err <= t->tol_products, "%s ffn n=%d dim=%d hidden=%d: MLP output rel err %.3g", t->label, n, dim,
                   hidden, err);
            printf("  %-5s ffn n=%3d dim=%3d hidden=%3d %s MLP output rel err %.2e\n", t->label, n, dim, hidden,
                   grouped ? "W1|W3 grouped " : "W1, W3 apart  ", err);
            /* no h1 where the backend says ffn uses none of it (ffn_h1_floats; the block stage
             * then allocates none): the same rows as the default run above, which had one */
            const size_t h1_floats = sf_be_ffn_h1_floats(t->be, n, dim, hidden);
            CHECKF(h1_floats == 0 || h1_floats == nh, "%s ffn_h1_floats n=%d hidden=%d: %zu, want 0 or %zu", t->label,
                   n, hidden, h1_floats, nh);
            if (h1_floats == 0) {
                pair x3 = both(t, hx, nx * 4);
                both_poison(t, y[1], nh);
                CHECK_OK(sf_be_ffn(t->be, n, dim, hidden, x3.g, norm.g, 1e-6f, w[0].g, w[1].g, w2.g, u.g, NULL,
                                         y[1].g));
                float *with_h1 = to_host(t->be, x.g, nx), *without = to_host(t->be, x3.g, nx);
                const double diff = check_rel_err_f32(without, with_h1, nx);
                CHECKF(diff == 0, "%s ffn n=%d dim=%d hidden=%d without h1: %.3g from the run with it", t->label, n, dim,
                       hidden, diff);
                free(with_h1), free(without);
                both_free(t, x3);
            }
            free(gx), free(cx);
            both_free(t, u);
        }
        for (int i = 0; i < 3; i++) both_free(t, w[i]), both_free(t, y[i]), free(hw[i]);
        both_free(t, x), both_free(t, norm), both_free(t, w2);
        free(hx), free(hn), free(hw2);
    }
}

/* Q/K/V as stages/block.c lays them out: wq, wk, wv prepared as one group of 3, and q, k, v
 * slices of one allocation n_max*W apart (n_max > n, so a stride of n*W would be wrong). The
 * CUDA backend issues one strided-batched product for exactly this case; the whole buffer is
 * poisoned, each slice must match the CPU and the rows between slices must stay untouched. */
static void test_qkv_grouped(const target *t)
{
    static const int shapes[][4] = {/* n, n_max, dim, width */ {64, 80, 32, 48}, {200, 256, 96, 128},
                                    {37, 40, 24, 40}, {1, 3, 16, 8}};
    if (!ext(t->be)->prepare_weight_group || !ext(t->be)->qkv) return;
    char what[112];
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], n_max = shapes[s][1], dim = shapes[s][2], width = shapes[s][3];
        const size_t nx = (size_t)n * dim, nh = (size_t)n * width, slice = (size_t)n_max * width;
        float *hx = random_host(nx, 1), *hn = random_host((size_t)dim, 1);
        float *hw = random_host(3 * (size_t)width * dim, 1.0 / sqrt(dim));
        pair x = both(t, hx, nx * 4), norm = both(t, hn, (size_t)dim * 4), u = both(t, NULL, nx * 4);
        pair w[3], want[3];
        for (int i = 0; i < 3; i++) {
            w[i] = both(t, hw + (size_t)i * width * dim, (size_t)width * dim * 4);
            want[i] = both(t, NULL, nh * 4);
        }
        const float *group[3] = {w[0].g, w[1].g, w[2].g};
        CHECK_OK(sf_be_prepare_weights(t->be, 3, group, width, dim));
        float *qkv = to_backend(t->be, NULL, 3 * slice * 4);
        float *gy[3] = {qkv, qkv + slice, qkv + 2 * slice};
        for (int pass = 0; pass < 2; pass++) { /* qkv, then rmsnorm and matmul per weight on the same layout */
            poison(t->be, qkv, 3 * slice);
            CHECK_OK(cpu->ops->rmsnorm(cpu, n, dim, x.c, norm.c, 1e-6f, u.c));
            if (pass == 0) {
                CHECK_OK(sf_be_qkv(t->be, n, dim, width, x.g, norm.g, 1e-6f, w[0].g, w[1].g, w[2].g,
                                         SF_DTYPE_F32, gy[0], gy[1], gy[2], u.g));
            } else {
                CHECK_OK(t->be->ops->rmsnorm(t->be, n, dim, x.g, norm.g, 1e-6f, u.g));
                for (int i = 0; i < 3; i++)
                    CHECK_OK(t->be->ops->matmul(t->be, n, dim, width, u.g, dim, group[i], gy[i], width, 0));
            }
            for (int i = 0; i < 3; i++) {
                CHECK_OK(cpu->ops->matmul(cpu, n, dim, width, u.c, dim, w[i].c, want[i].c, width, 0));
                snprintf(what, sizeof what, "%s grouped n=%d (slices %d rows apart) dim=%d width=%d product %d",
                         pass ? "matmul of a grouped weight" : "qkv", n, n_max, dim, width, i);
                compare(what, t, gy[i], want[i].c, nh, t->tol_products);
            }
            float *all = to_host(t->be, qkv, 3 * slice);
            size_t written = 0;
            for (size_t i = 0; i < 3 * slice; i++) written += !isnan(all[i]) && i % slice >= nh;
            CHECKF(written == 0, "%s %s grouped n=%d n_max=%d: %zu elements written past the slices' n rows",
                   t->label, pass ? "matmul of a grouped weight" : "qkv", n, n_max, written);
            free(all);
        }
        { /* bf16 outputs in the same layout, slices n_max*width bf16 elements apart (stages/block.c) */
            float *nan = malloc(3 * slice * 4 + 4);
            for (size_t i = 0; i < 3 * slice; i++) nan[i] = NAN;
            unsigned char *qkvb = bf16_upload(t->be, nan, 3 * slice);
            free(nan);
            CHECK_OK(sf_be_qkv(t->be, n, dim, width, x.g, norm.g, 1e-6f, w[0].g, w[1].g, w[2].g, SF_DTYPE_BF16,
                                     qkvb, qkvb + 2 * slice, qkvb + 4 * slice, u.g));
            float *all = check_bf16_download(t->be, qkvb, 3 * slice);
            const double tol = t->tol_products > TOL_BF16_OUTPUT ? t->tol_products : TOL_BF16_OUTPUT;
            for (int i = 0; i < 3; i++) {
                float *ref = to_host(cpu, want[i].c, nh);
                const double err = check_rel_err_f32(all + i * slice, ref, nh);
                CHECKF(err <= tol, "%s qkv (bf16 out) grouped n=%d n_max=%d product %d: relative error %.3g", t->label,
                       n, n_max, i, err);
                free(ref);
            }
            size_t written = 0;
            for (size_t i = 0; i < 3 * slice; i++) written += !isnan(all[i]) && i % slice >= nh;
            CHECKF(written == 0, "%s qkv (bf16 out) grouped n=%d n_max=%d: %zu elements written past the slices' n rows",
                   t->label, n, n_max, written);
            free(all);
            t->be->ops->free(t->be, qkvb);
        }
        printf("  %-5s qkv n=%3d dim=%3d width=%3d grouped wq|wk|wv, q|k|v %d rows apart\n", t->label, n, dim, width,
               n_max);
        t->be->ops->free(t->be, qkv);
        for (int i = 0; i < 3; i++) both_free(t, w[i]), both_free(t, want[i]);
        both_free(t, x), both_free(t, norm), both_free(t, u);
        free(hx), free(hn), free(hw);
    }
}

static void test_rowwise(const target *t)
{
    /* widths for every rmsnorm path: scalar (7, 1030), one warp a row (64, 300; 1500), one block
     * a row with 16-byte loads (3000) */
    static const int shapes[][2] = {{1, 7}, {33, 64}, {100, 300}, {5, 1030}, {9, 1500}, {3, 3000}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], dim = shapes[s][1];
        const size_t count = (size_t)n * dim;
        char what[64];
        float *hx = random_host(count, 2), *hw = random_host((size_t)dim, 1), *hb = random_host(count, 1);
        pair x = both(t, hx, count * 4), w = both(t, hw, (size_t)dim * 4), y = both(t, NULL, count * 4);
        both_poison(t, y, count);
        CHECK_OK(cpu->ops->rmsnorm(cpu, n, dim, x.c, w.c, 1e-6f, y.c));
        CHECK_OK(t->be->ops->rmsnorm(t->be, n, dim, x.g, w.g, 1e-6f, y.g));
        snprintf(what, sizeof what, "rmsnorm n=%d dim=%d", n, dim);
        compare(what, t, y.g, y.c, count, TOL_F32);
        if (ext(t->be)->rmsnorm_typed) {
            /* typed: float32 equal to rmsnorm's, bf16 its rounding to nearest even, bit for bit;
             * both outputs poisoned first (0xFFFF is a NaN in bf16 and in either half of a float) */
            float *want = malloc(count * sizeof *want);
            uint16_t *bits = malloc(count * sizeof *bits);
            float *got32 = malloc(count * sizeof *got32);
            void *yt = t->be->ops->alloc(t->be, count * 4);
            CHECK(want && bits && got32 && yt);
            CHECK_OK(t->be->ops->download(t->be, want, y.g, count * 4));
            memset(bits, 0xFF, count * 2);
            CHECK_OK(t->be->ops->upload(t->be, yt, bits, count * 2));
            CHECK_OK(sf_be_rmsnorm_typed(t->be, n, dim, x.g, w.g, 1e-6f, SF_DTYPE_BF16, yt));
            CHECK_OK(t->be->ops->download(t->be, bits, yt, count * 2));
            size_t off = 0;
            for (size_t i = 0; i < count; i++) off += bits[i] != check_bf16_bits(want[i]);
            CHECKF(off == 0, "%s rmsnorm_typed bf16 n=%d dim=%d: %zu of %zu values are not rmsnorm's rounded", t->label,
                   n, dim, off, count);
            memset(got32, 0xFF, count * 4);
            CHECK_OK(t->be->ops->upload(t->be, yt, got32, count * 4));
            CHECK_OK(sf_be_rmsnorm_typed(t->be, n, dim, x.g, w.g, 1e-6f, SF_DTYPE_F32, yt));
            CHECK_OK(t->be->ops->download(t->be, got32, yt, count * 4));
            CHECKF(memcmp(got32, want, count * 4) == 0, "%s rmsnorm_typed f32 n=%d dim=%d differs from rmsnorm", t->label,
                   n, dim);
            t->be->ops->free(t->be, yt);
            free(want), free(bits), free(got32);
        }
        /* in place (y aliases x) */
        CHECK_OK(cpu->ops->rmsnorm(cpu, n, dim, x.c, w.c, 1e-5f, x.c));
        CHECK_OK(t->be->ops->rmsnorm(t->be, n, dim, x.g, w.g, 1e-5f, x.g));
        snprintf(what, sizeof what, "rmsnorm in place n=%d dim=%d", n, dim);
        compare(what, t, x.g, x.c, count, TOL_F32);
        /* swiglu on fresh data: a = silu(a) * b */
        pair a = both(t, hx, count * 4), b = both(t, hb, count * 4);
        CHECK_OK(cpu->ops->swiglu(cpu, n, dim, a.c, b.c));
        CHECK_OK(t->be->ops->swiglu(t->be, n, dim, a.g, b.g));
        snprintf(what, sizeof what, "swiglu n=%d f=%d", n, dim);
        compare(what, t, a.g, a.c, count, TOL_F32);
        /* embed: rows of a [vocab, dim] table */
        const int vocab = 50;
        float *ht = random_host((size_t)vocab * dim, 1);
        uint32_t *tokens = malloc((size_t)n * sizeof *tokens);
        for (int i = 0; i < n; i++) tokens[i] = (uint32_t)(check_rng_next(&rng) % vocab);
        pair table = both(t, ht, (size_t)vocab * dim * 4), tok = both(t, tokens, (size_t)n * 4);
        both_poison(t, y, count);
        CHECK_OK(cpu->ops->embed(cpu, n, dim, tok.c, table.c, y.c));
        CHECK_OK(t->be->ops->embed(t->be, n, dim, tok.g, table.g, y.g));
        snprintf(what, sizeof what, "embed n=%d dim=%d", n, dim);
        double err = compare(what, t, y.g, y.c, count, TOL_F32);
        CHECKF(err == 0, "%s %s: a lookup must be exact, error %.3g", t->label, what, err);
        if (ext(t->be)->upload_unordered) {
            /* new ids through upload_unordered over the old ones, with a kernel that does not
             * touch them queued ahead: the lookup issued after sees the new ids */
            for (int i = 0; i < n; i++) tokens[i] = (uint32_t)(check_rng_next(&rng) % vocab);
            CHECK_OK(t->be->ops->rmsnorm(t->be, n, dim, x.g, w.g, 1e-5f, x.g));
            CHECK_OK(sf_be_upload_unordered(t->be, tok.g, tokens, (size_t)n * 4));
            both_poison(t, y, count);
            CHECK_OK(t->be->ops->embed(t->be, n, dim, tok.g, table.g, y.g));
            CHECK_OK(cpu->ops->upload(cpu, tok.c, tokens, (size_t)n * 4));
            CHECK_OK(cpu->ops->embed(cpu, n, dim, tok.c, table.c, y.c));
            snprintf(what, sizeof what, "embed after upload_unordered n=%d dim=%d", n, dim);
            err = compare(what, t, y.g, y.c, count, TOL_F32);
            CHECKF(err == 0, "%s %s: error %.3g", t->label, what, err);
        }
        both_free(t, x), both_free(t, w), both_free(t, y), both_free(t, a), both_free(t, b);
        both_free(t, table), both_free(t, tok);
        free(hx), free(hw), free(hb), free(ht), free(tokens);
    }
}

static void test_summary(const target *t)
{
    /* rows padded by 4 floats, and (bf16: 16-byte rows, the vector kernel) by 8 */
    static const int cases[][5] = {/* n, segment, S, width, padding */
                                   {32, 32, 4, 24, 4},   {19, 32, 4, 24, 4},      {5, 6, 4, 16, 4},
                                   {64, 64, 3, 200, 4},  {1, 16, 8, 8, 4},        {300, 512, 8, 192, 8},
                                   {1000, 1024, 8, 136, 0}};
    for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
        const int n = cases[s][0], N = cases[s][1], S = cases[s][2], width = cases[s][3], ld = width + cases[s][4];
        float *hk = random_host((size_t)n * ld, 1), *hv = random_host((size_t)n * ld, 1);
        pair k = both(t, hk, (size_t)n * ld * 4), v = both(t, hv, (size_t)n * ld * 4);
        pair sk = both(t, NULL, (size_t)S * width * 4), sv = both(t, NULL, (size_t)S * width * 4);
        both_poison(t, sk, (size_t)S * width);
        both_poison(t, sv, (size_t)S * width);
        int count_c = -1, count_g = -2;
        CHECK_OK(cpu->ops->summary(cpu, n, N, S, width, ld, SF_DTYPE_F32, k.c, v.c, sk.c, sv.c, &count_c));
        CHECK_OK(t->be->ops->summary(t->be, n, N, S, width, ld, SF_DTYPE_F32, k.g, v.g, sk.g, sv.g, &count_g));
        CHECKF(count_c == count_g, "%s summary n=%d N=%d S=%d: %d tokens, the CPU made %d", t->label, n, N, S, count_g,
               count_c);
        char what[80];
        snprintf(what, sizeof what, "summary n=%d N=%d S=%d (%d tokens)", n, N, S, count_c);
        if (count_c > 0 && count_c == count_g) {
            compare(what, t, sk.g, sk.c, (size_t)count_c * width, TOL_F32);
            compare(what, t, sv.g, sv.c, (size_t)count_c * width, TOL_F32);
        }
        if (s == 0) /* bf16 k, v are a GPU type: the CPU refuses them */
            CHECK(cpu->ops->summary(cpu, n, N, S, width, ld, SF_DTYPE_BF16, k.c, v.c, sk.c, sv.c, &count_c) ==
                  SF_E_UNSUPPORTED);
        if (strcmp(t->be->ops->name, "cuda") == 0) {
            /* bf16 k, v (what qkv writes on an H100): the CPU reference on the same values, rounded */
            const size_t count = (size_t)n * ld;
            round_to_bf16(hk, count), round_to_bf16(hv, count);
            CHECK_OK(cpu->ops->upload(cpu, k.c, hk, count * 4));
            CHECK_OK(cpu->ops->upload(cpu, v.c, hv, count * 4));
            void *kb = bf16_upload(t->be, hk, count), *vb = bf16_upload(t->be, hv, count);
            both_poison(t, sk, (size_t)S * width);
            both_poison(t, sv, (size_t)S * width);
            count_c = -1, count_g = -2;
            CHECK_OK(cpu->ops->summary(cpu, n, N, S, width, ld, SF_DTYPE_F32, k.c, v.c, sk.c, sv.c, &count_c));
            CHECK_OK(t->be->ops->summary(t->be, n, N, S, width, ld, SF_DTYPE_BF16, kb, vb, sk.g, sv.g, &count_g));
            CHECKF(count_c == count_g, "%s summary (bf16 k, v) n=%d N=%d S=%d: %d tokens, the CPU made %d", t->label,
                   n, N, S, count_g, count_c);
            snprintf(what, sizeof what, "summary (bf16 k, v) n=%d N=%d S=%d (%d tokens)", n, N, S, count_c);
            if (count_c > 0 && count_c == count_g) {
                compare(what, t, sk.g, sk.c, (size_t)count_c * width, TOL_F32);
                compare(what, t, sv.g, sv.c, (size_t)count_c * width, TOL_F32);
            }
            t->be->ops->free(t->be, kb), t->be->ops->free(t->be, vb);
        }
        both_free(t, k), both_free(t, v), both_free(t, sk), both_free(t, sv);
        free(hk), free(hv);
    }
}

static void test_memory(const target *t)
{
    static const int shapes[][3] = {{32, 3, 8}, {19, 2, 32}, {1, 4, 16}, {256, 4, 64}, {300, 3, 64}, {70, 2, 128}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], H = shapes[s][1], d = shapes[s][2], ld = H * d + 4;
        const size_t hdd = (size_t)H * d * d, hd = (size_t)H * d;
        /* a memory that has seen a few segments: z positive and large, M of matching scale */
        float *hM = random_host(hdd, 3), *hz = positive_host(hd, 20, 60), *hg = random_host((size_t)H, 1);
        float *hq = random_host((size_t)n * ld, 1), *hk = random_host((size_t)n * ld, 1);
        float *hv = random_host((size_t)n * ld, 1), *ha = random_host((size_t)n * ld, 1);
        pair M = both(t, hM, hdd * 4), z = both(t, hz, hd * 4), g = both(t, hg, (size_t)H * 4);
        pair q = both(t, hq, (size_t)n * ld * 4), k = both(t, hk, (size_t)n * ld * 4);
        pair v = both(t, hv, (size_t)n * ld * 4), a = both(t, ha, (size_t)n * ld * 4);
        char what[96];
        CHECK_OK(cpu->ops->memory_mix(cpu, n, H, d, ld, SF_DTYPE_F32, q.c, M.c, z.c, g.c, a.c));
        CHECK_OK(t->be->ops->memory_mix(t->be, n, H, d, ld, SF_DTYPE_F32, q.g, M.g, z.g, g.g, a.g));
        snprintf(what, sizeof what, "memory_mix n=%d H=%d d=%d", n, H, d);
        compare(what, t, a.g, a.c, (size_t)n * ld, t->tol_memory);
        for (int kind = SF_MEMORY_LINEAR; kind <= SF_MEMORY_DELTA; kind++) {
            if (kind != SF_MEMORY_LINEAR && kind != SF_MEMORY_DELTA) continue;
            pair M2 = both(t, hM, hdd * 4), z2 = both(t, hz, hd * 4);
            CHECK_OK(cpu->ops->memory_update(cpu, (sf_memory_kind)kind, n, H, d, ld, SF_DTYPE_F32, k.c, v.c, M2.c,
                                             z2.c));
            CHECK_OK(t->be->ops->memory_update(t->be, (sf_memory_kind)kind, n, H, d, ld, SF_DTYPE_F32, k.g, v.g, M2.g,
                                               z2.g));
            snprintf(what, sizeof what, "memory_update %s n=%d H=%d d=%d: M",
                     kind == SF_MEMORY_DELTA ? "delta" : "linear", n, H, d);
            compare(what, t, M2.g, M2.c, hdd, t->tol_memory);
            snprintf(what, sizeof what, "memory_update %s n=%d H=%d d=%d: z",
                     kind == SF_MEMORY_DELTA ? "delta" : "linear", n, H, d);
            compare(what, t, z2.g, z2.c, hd, TOL_F32);
            both_free(t, M2), both_free(t, z2);
        }
        /* none leaves M alone */
        CHECK_OK(t->be->ops->memory_update(t->be, SF_MEMORY_NONE, n, H, d, ld, SF_DTYPE_F32, k.g, v.g, M.g, z.g));
        float *back = to_host(t->be, M.g, hdd);
        CHECKF(memcmp(back, hM, hdd * 4) == 0, "%s memory_update none changed M", t->label);
        free(back);
        /* bf16 q, k, v (what qkv writes on an H100) against the CPU on the same values rounded to
         * bf16, with M, z, gate as above: rows of ld % 8 == 4, or a first row 8 bytes off 16, take
         * the general kernels; ld % 8 == 0 the tiled ones (d = 32, 64, 128) */
        static const int bf16_layouts[][2] = {/* row padding, elements before row 0 */ {4, 0}, {8, 0}, {8, 4}};
        for (size_t b = 0; b < sizeof bf16_layouts / sizeof *bf16_layouts && !strcmp(t->be->ops->name, "cuda"); b++) {
            const int bld = H * d + bf16_layouts[b][0], off = bf16_layouts[b][1];
            const size_t count = (size_t)n * bld + off;
            float *bq = random_host(count, 1), *bk = random_host(count, 1), *bv = random_host(count, 1);
            float *ba = random_host((size_t)n * bld, 1);
            round_to_bf16(bq, count), round_to_bf16(bk, count), round_to_bf16(bv, count);
            float *cq = to_backend(cpu, bq, count * 4), *ck = to_backend(cpu, bk, count * 4);
            float *cv = to_backend(cpu, bv, count * 4);
            uint16_t *gq = bf16_upload(t->be, bq, count), *gk = bf16_upload(t->be, bk, count);
            uint16_t *gv = bf16_upload(t->be, bv, count);
            pair ab = both(t, ba, (size_t)n * bld * 4);
            CHECK_OK(cpu->ops->memory_mix(cpu, n, H, d, bld, SF_DTYPE_F32, cq + off, M.c, z.c, g.c, ab.c));
            CHECK_OK(t->be->ops->memory_mix(t->be, n, H, d, bld, SF_DTYPE_BF16, gq + off, M.g, z.g, g.g, ab.g));
            snprintf(what, sizeof what, "memory_mix (bf16 q) n=%d H=%d d=%d ld=%d, row 0 at %d", n, H, d, bld, off);
            compare(what, t, ab.g, ab.c, (size_t)n * bld, t->tol_memory);
            if (ext(t->be)->memory_mix_to) { /* the same mix into a NaN-poisoned bf16 out, rows bld apart */
                float *nan = malloc((size_t)n * bld * 4 + 4);
                for (size_t i = 0; i < (size_t)n * bld; i++) nan[i] = NAN;
                void *out = bf16_upload(t->be, nan, (size_t)n * bld);
                CHECK_OK(t->be->ops->upload(t->be, ab.g, ba, (size_t)n * bld * 4));
                CHECK_OK(ext(t->be)->memory_mix_to(t->be, n, H, d, bld, SF_DTYPE_BF16, gq + off, M.g, z.g, g.g, ab.g,
                                                   SF_DTYPE_BF16, out));
                float *got = check_bf16_download(t->be, out, (size_t)n * bld),
                      *want = to_host(cpu, ab.c, (size_t)n * bld);
                /* the rows' H*d columns, side by side; the padding is not the op's to write */
                const size_t w = (size_t)H * d;
                float *gw = malloc((size_t)n * w * 4 + 4), *ww = malloc((size_t)n * w * 4 + 4);
                for (int i = 0; i < n; i++) {
                    memcpy(gw + i * w, got + (size_t)i * bld, w * 4);
                    memcpy(ww + i * w, want + (size_t)i * bld, w * 4);
                }
                const double err = check_rel_err_f32(gw, ww, (size_t)n * w);
                CHECKF(err <= TOL_BF16_OUTPUT, "%s memory_mix_to (bf16 q, bf16 out) n=%d H=%d d=%d ld=%d: rel err %.3g",
                       t->label, n, H, d, bld, err);
                free(nan), free(got), free(want), free(gw), free(ww);
                t->be->ops->free(t->be, out);
            }
            for (int kind = SF_MEMORY_LINEAR; kind <= SF_MEMORY_DELTA; kind++) {
                pair M2 = both(t, hM, hdd * 4), z2 = both(t, hz, hd * 4);
                CHECK_OK(cpu->ops->memory_update(cpu, (sf_memory_kind)kind, n, H, d, bld, SF_DTYPE_F32, ck + off,
                                                 cv + off, M2.c, z2.c));
                CHECK_OK(t->be->ops->memory_update(t->be, (sf_memory_kind)kind, n, H, d, bld, SF_DTYPE_BF16, gk + off,
                                                   gv + off, M2.g, z2.g));
                const char *kind_name = kind == SF_MEMORY_DELTA ? "delta" : "linear";
                snprintf(what, sizeof what, "memory_update %s (bf16 k, v) n=%d H=%d d=%d ld=%d, row 0 at %d: M",
                         kind_name, n, H, d, bld, off);
                compare(what, t, M2.g, M2.c, hdd, t->tol_memory);
                snprintf(what, sizeof what, "memory_update %s (bf16 k, v) n=%d H=%d d=%d ld=%d, row 0 at %d: z",
                         kind_name, n, H, d, bld, off);
                compare(what, t, z2.g, z2.c, hd, TOL_F32);
                both_free(t, M2), both_free(t, z2);
            }
            cpu->ops->free(cpu, cq), cpu->ops->free(cpu, ck), cpu->ops->free(cpu, cv);
            t->be->ops->free(t->be, gq), t->be->ops->free(t->be, gk), t->be->ops->free(t->be, gv);
            both_free(t, ab);
            free(bq), free(bk), free(bv), free(ba);
        }
        if (s == 0) { /* bf16 q, k, v are a GPU type: the CPU refuses them (last: running them would spoil M.c) */
            CHECK(cpu->ops->memory_mix(cpu, n, H, d, ld, SF_DTYPE_BF16, q.c, M.c, z.c, g.c, a.c) == SF_E_UNSUPPORTED);
            CHECK(cpu->ops->memory_update(cpu, SF_MEMORY_DELTA, n, H, d, ld, SF_DTYPE_BF16, k.c, v.c, M.c, z.c) ==
                  SF_E_UNSUPPORTED);
        }
        both_free(t, M), both_free(t, z), both_free(t, g), both_free(t, q), both_free(t, k), both_free(t, v);
        both_free(t, a);
        free(hM), free(hz), free(hg), free(hq), free(hk), free(hv), free(ha);
    }
}

/* matmul_typed with a bf16 x (the output product's input on an H100), against matmul on the
 * CPU on the same values rounded to bf16: contiguous rows (the direct bf16 product where the
 * weight is prepared) and padded ones (widened first) */
static void test_matmul_typed(const target *t)
{
    /* on an H100 the contiguous ones go through cuBLAS (several row and column tiles, partial, in
     * the last) */
    static const int shapes[][4] = {/* n, in, out, ldx */ {64, 96, 40, 96}, {33, 64, 128, 72}, {1, 32, 8, 32},
                                    {300, 256, 520, 256}};
    if (!ext(t->be)->matmul_typed) return;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2], ldx = shapes[s][3];
        const size_t nx = (size_t)n * ldx, ny = (size_t)n * out;
        float *hx = random_host(nx, 1), *hw = random_host((size_t)out * in, 1.0 / sqrt(in)), *hy = random_host(ny, 1);
        round_to_bf16(hx, nx);
        pair x = both(t, hx, nx * 4), w = both(t, hw, (size_t)out * in * 4), y = both(t, hy, ny * 4);
        void *xb = bf16_upload(t->be, hx, nx);
        CHECK_OK(sf_be_prepare_weights(t->be, 1, (const float *const *)&w.g, out, in));
        CHECK_OK(cpu->ops->matmul(cpu, n, in, out, x.c, ldx, w.c, y.c, out, 1));
        CHECK_OK(sf_be_matmul_typed(t->be, n, in, out, SF_DTYPE_BF16, xb, ldx, w.g, SF_DTYPE_F32, y.g, out, 1));
        char what[96];
        snprintf(what, sizeof what, "matmul_typed (bf16 x) n=%d in=%d out=%d ldx=%d, accumulate", n, in, out, ldx);
        compare(what, t, y.g, y.c, ny, t->tol_products);
        t->be->ops->free(t->be, xb);
        both_free(t, x), both_free(t, w), both_free(t, y);
        free(hx), free(hw), free(hy);
    }
}

typedef struct attention_case {
    const char *branches;
    int n, segment, heads, head_dim, causal, n_global, pad;
} attention_case;

static void test_attention(const target *t)
{
    static const attention_case cases[] = {
        {"8:1,16:2,32:4", 32, 32, 3, 8, 1, 0, 0},   {"8:1,16:2,32:4", 32, 32, 3, 8, 0, 5, 4},
        {"16:2", 27, 32, 3, 8, 1, 0, 0},            {"64:1,128:2,256:4", 256, 256, 4, 32, 1, 16, 0},
        {"64:1,128:2,256:4", 200, 256, 4, 32, 0, 16, 0}, {"128:1,256:2", 256, 256, 2, 64, 1, 0, 0},
        {"128:1,256:2", 131, 256, 2, 64, 0, 7, 4},  {"64:1,128:4", 128, 128, 2, 128, 1, 8, 0},
        {"64:1,128:4", 77, 128, 2, 128, 1, 0, 0},   {"32:1", 1, 32, 2, 32, 1, 3, 0},
        {"512:1,1024:2,2048:4", 2048, 2048, 4, 64, 1, 16, 0}, {"128:1,256:2", 300, 512, 3, 64, 1, 5, 8},
    };
    for (size_t s = 0; s < sizeof cases / sizeof *cases; s++) {
        const attention_case *ac = &cases[s];
        sf_model_config cfg;
        sf_model_config_default(&cfg);
        CHECK_OK(sf_branches_parse(ac->branches, &cfg));
        const int W = ac->heads * ac->head_dim, ld = W + ac->pad, G = ac->n_global, gld = W + ac->pad;
        const size_t rows = (size_t)ac->n * ld;
        float *hq = random_host(rows, 1), *hk = random_host(rows, 1), *hv = random_host(rows, 1);
        float *hgk = random_host((size_t)(G ? G : 1) * gld, 1), *hgv = random_host((size_t)(G ? G : 1) * gld, 1);
        pair q = both(t, hq, rows * 4), k = both(t, hk, rows * 4), v = both(t, hv, rows * 4);
        pair gk = both(t, hgk, (size_t)(G ? G : 1) * gld * 4), gv = both(t, hgv, (size_t)(G ? G : 1) * gld * 4);
        pair out = both(t, NULL, rows * 4);
        both_poison(t, out, rows);
        sf_attention_desc desc = {.n = ac->n, .segment = ac->segment, .heads = ac->heads, .head_dim = ac->head_dim,
                                  .ld = ld, .causal = ac->causal, .n_branches = cfg.n_branches,
                                  .branches = cfg.branches, .n_global = G, .global_ld = gld,
                                  .gk = G ? gk.c : NULL, .gv = G ? gv.c : NULL,
                                  .scale = 1.0f / sqrtf((float)ac->head_dim)};
        CHECK_OK(cpu->ops->attention(cpu, &desc, q.c, k.c, v.c, out.c));
        desc.gk = G ? gk.g : NULL, desc.gv = G ? gv.g : NULL;
        CHECK_OK(t->be->ops->attention(t->be, &desc, q.g, k.g, v.g, out.g));
        /* the padding columns hold NaN on both sides and are not the op's to write: compare rows */
        float *got = to_host(t->be, out.g, rows), *want = to_host(cpu, out.c, rows);
        float *gw = malloc((size_t)ac->n * W * 4 + 4), *ww = malloc((size_t)ac->n * W * 4 + 4);
        for (int i = 0; i < ac->n; i++) {
            memcpy(gw + (size_t)i * W, got + (size_t)i * ld, (size_t)W * 4);
            memcpy(ww + (size_t)i * W, want + (size_t)i * ld, (size_t)W * 4);
        }
        double err = check_rel_err_f32(gw, ww, (size_t)ac->n * W);
        CHECKF(err <= t->tol_products, "%s attention %s n=%d N=%d H=%d d=%d causal=%d G=%d ld=%d: rel err %.3g",
               t->label, ac->branches, ac->n, ac->segment, ac->heads, ac->head_dim, ac->causal, G, ld, err);
        printf("  %-5s attention %-20s n=%4d d=%3d causal=%d G=%2d  rel err %.2e\n", t->label, ac->branches,
               ac->n, ac->head_dim, ac->causal, G, err);
        free(got), free(want);
        /* bf16 q, k, v (qkv's output type on an H100): the CPU computes on the same rounded values.
         * Rows ld % 8 == 0 of d = 64 go to the kernel that reads K/V in place, the others are
         * widened to float32 first; both must match. */
        round_to_bf16(hq, rows), round_to_bf16(hk, rows), round_to_bf16(hv, rows);
        void *qb = bf16_upload(t->be, hq, rows), *kb = bf16_upload(t->be, hk, rows), *vb = bf16_upload(t->be, hv, rows);
        CHECK_OK(cpu->ops->upload(cpu, q.c, hq, rows * 4));
        CHECK_OK(cpu->ops->upload(cpu, k.c, hk, rows * 4));
        CHECK_OK(cpu->ops->upload(cpu, v.c, hv, rows * 4));
        both_poison(t, out, rows);
        desc.gk = G ? gk.c : NULL, desc.gv = G ? gv.c : NULL;
        CHECK_OK(cpu->ops->attention(cpu, &desc, q.c, k.c, v.c, out.c));
        desc.gk = G ? gk.g : NULL, desc.gv = G ? gv.g : NULL, desc.qkv_type = SF_DTYPE_BF16;
        CHECK_OK(t->be->ops->attention(t->be, &desc, qb, kb, vb, out.g));
        got = to_host(t->be, out.g, rows), want = to_host(cpu, out.c, rows);
        for (int i = 0; i < ac->n; i++) {
            memcpy(gw + (size_t)i * W, got + (size_t)i * ld, (size_t)W * 4);
            memcpy(ww + (size_t)i * W, want + (size_t)i * ld, (size_t)W * 4);
        }
        err = check_rel_err_f32(gw, ww, (size_t)ac->n * W);
        CHECKF(err <= t->tol_products, "%s attention (bf16 q/k/v) %s n=%d H=%d d=%d causal=%d G=%d ld=%d: rel err %.3g",
               t->label, ac->branches, ac->n, ac->heads, ac->head_dim, ac->causal, G, ld, err);
        printf("  %-5s attention %-20s n=%4d d=%3d causal=%d G=%2d  bf16 q/k/v%s rel err %.2e\n", t->label,
               ac->branches, ac->n, ac->head_dim, ac->causal, G, ld % 8 || ac->head_dim != 64 ? " (widened)" : "", err);
        if (ext(t->be)->attention_mix) {
            /* attention then the memory mix into a NaN-poisoned bf16 out: fused by the kernel that
             * reads K/V in place (an H100, d = 64, ld % 8 == 0), the two ops elsewhere */
            const int H = ac->heads, d = ac->head_dim;
            float *hM = random_host((size_t)H * d * d, 3), *hz = positive_host((size_t)H * d, 20, 60);
            float *hg = random_host((size_t)H, 1), *nan = malloc(rows * 4 + 4);
            pair M = both(t, hM, (size_t)H * d * d * 4), z = both(t, hz, (size_t)H * d * 4), g = both(t, hg, (size_t)H * 4);
            for (size_t i = 0; i < rows; i++) nan[i] = NAN;
            void *mixed = bf16_upload(t->be, nan, rows);
            CHECK_OK(cpu->ops->memory_mix(cpu, ac->n, H, d, ld, SF_DTYPE_F32, q.c, M.c, z.c, g.c, out.c));
            poison(t->be, out.g, rows); /* scratch for the op; the CPU's mixed rows are the reference */
            CHECK_OK(sf_be_attention_mix(t->be, &desc, qb, kb, vb, out.g, M.g, z.g, g.g, SF_DTYPE_BF16, mixed));
            float *gm = check_bf16_download(t->be, mixed, rows), *wm = to_host(cpu, out.c, rows);
            for (int i = 0; i < ac->n; i++) {
                memcpy(gw + (size_t)i * W, gm + (size_t)i * ld, (size_t)W * 4);
                memcpy(ww + (size_t)i * W, wm + (size_t)i * ld, (size_t)W * 4);
            }
            const double tol = t->tol_products > TOL_BF16_OUTPUT ? t->tol_products : TOL_BF16_OUTPUT;
            err = check_rel_err_f32(gw, ww, (size_t)ac->n * W);
            CHECKF(err <= tol, "%s attention_mix (bf16 q/k/v, bf16 out) %s n=%d H=%d d=%d causal=%d G=%d ld=%d: rel err %.3g",
                   t->label, ac->branches, ac->n, H, d, ac->causal, G, ld, err);
            printf("  %-5s attention_mix %-16s n=%4d d=%3d causal=%d G=%2d  bf16 q/k/v%s rel err %.2e\n", t->label,
                   ac->branches, ac->n, d, ac->causal, G, ld % 8 || d != 64 ? " (two ops)" : "", err);
            t->be->ops->free(t->be, mixed);
            both_free(t, M), both_free(t, z), both_free(t, g);
            free(hM), free(hz), free(hg), free(nan), free(gm), free(wm);
        }
        t->be->ops->free(t->be, qb), t->be->ops->free(t->be, kb), t->be->ops->free(t->be, vb);
        free(got), free(want), free(gw), free(ww);
        both_free(t, q), both_free(t, k), both_free(t, v), both_free(t, gk), both_free(t, gv), both_free(t, out);
        free(hq), free(hk), free(hv), free(hgk), free(hgv);
    }
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    CHECK_OK(sf_backend_create("cpu", 0, &cpu));
    /* Settings name what each mode changes and leave the rest to the environment, so that a run
     * with e.g. SEQFLOW_CUDA_MEMORY=mma checks that path throughout (bench/run_*.sh do). */
    static const struct {
        sf_precision precision;
        const char *label;
        double tol;
        const char *settings; /* the backend's settings (docs/CUDA.md) */
        int mlp_only;         /* the MLP paths alone: the mode differs from the one above only there */
    } modes[] = {{SF_PRECISION_F32, "f32", TOL_F32, "gemm=fastest", 0},
                 {SF_PRECISION_BF16, "bf16", TOL_BF16, "gemm=fastest", 0},
                 /* every bf16 product through cuBLASLt (gemm_plan.cu) */
                 {SF_PRECISION_BF16, "bf16lt", TOL_BF16, "gemm=lt", 0},
                 /* the MLP composed: cuBLAS's W1|W3 product, then the SwiGLU pass (not the fused
                  * gate/up kernel an H100 runs by default) */
                 {SF_PRECISION_BF16, "bf16mlp", TOL_BF16, "gemm=fastest,gate_up=0", 1}};
    for (size_t m = 0; m < sizeof modes / sizeof *modes && cpu; m++) {
        target t = {NULL, modes[m].label, modes[m].tol, modes[m].tol == TOL_F32 ? TOL_F32 : TOL_BF16_OUTPUT};
        sf_backend_options opts = {0};
        opts.precision = modes[m].precision;
        opts.settings = modes[m].settings;
        CHECK_OK(sf_backend_create_opts("cuda", &opts, &t.be));
        if (!t.be) continue;
        CHECK(t.be->precision == modes[m].precision);
        CHECK_OK(sf_be_reserve(t.be, 256, 384, 6, 64));
        if (modes[m].mlp_only) {
            test_fused_products(&t);
            CHECK_OK(t.be->ops->sync(t.be));
            sf_backend_free(t.be);
            continue;
        }
        test_buffers(&t);
        test_matmul(&t);
        test_fused_products(&t);
        test_qkv_grouped(&t);
        test_matmul_typed(&t);
        test_rowwise(&t);
        test_summary(&t);
        test_memory(&t);
        /* the default picks tensor cores for the updates and FMAs for the retrieval: check the
         * other kernel of each op too, on a backend of this precision set to it (the tensor-core
         * products are 3xTF32 in f32 and take bf16 operands in bf16) */
        static const char *const memory_kernels[] = {"gemm=fastest,memory=fma", "gemm=fastest,memory=mma"};
        for (int k = 0; k < 2 && m <= 1; k++) {
            target tm = t;
            opts.settings = memory_kernels[k];
            CHECK_OK(sf_backend_create_opts("cuda", &opts, &tm.be));
            if (!tm.be) continue;
            CHECK_OK(sf_be_reserve(tm.be, 256, 384, 6, 64));
            test_memory(&tm);
            CHECK_OK(tm.be->ops->sync(tm.be));
            sf_backend_free(tm.be);
        }
        test_attention(&t);
        CHECK_OK(t.be->ops->sync(t.be));
        sf_backend_free(t.be);
    }
    /* settings: an unknown key or a bad value is refused, naming it, and leaves no backend */
    {
        sf_backend_options bad = {0};
        sf_backend *none = NULL;
        bad.settings = "gate_up=maybe";
        CHECK(sf_backend_create_opts("cuda", &bad, &none) == SF_E_OPTION && none == NULL);
        CHECKF(strstr(sf_last_error(), "gate_up") != NULL, "bad value: error names the key: %s", sf_last_error());
        bad.settings = "no_such_key=1";
        CHECK(sf_backend_create_opts("cuda", &bad, &none) == SF_E_OPTION && none == NULL);
        CHECKF(strstr(sf_last_error(), "no_such_key") != NULL, "unknown key: error names it: %s", sf_last_error());
    }
    /* bf16 is a GPU precision: the CPU refuses it rather than silently computing in f32 */
    sf_backend *refused = NULL;
    CHECK(sf_backend_create_ex("cpu", 0, SF_PRECISION_BF16, &refused) == SF_E_UNSUPPORTED && refused == NULL);
    sf_backend_free(cpu);
    return check_finish("test_backend_ops");
}
