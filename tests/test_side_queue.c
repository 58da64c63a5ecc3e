/* The backend's side queue (sf_be_side_begin / _end / _join / _join_before_product,
 * kernels/backend_ext.h) on the GPU: side work starts after what the main queue issued before it,
 * the main queue's work after a join sees everything the side wrote, and both queues compute
 * what the CPU computes in order. Each ordering is checked where breaking it shows: the side
 * reads k that a long main-queue product delays (k is NaN until then), the retrieval after the
 * join reads M that several memory updates on the side are still writing, and so do a bf16
 * product and an SGEMM after side_join_before_product. Run with the side queue on (default) and off
 * (SEQFLOW_CUDA_SIDE_QUEUE=0): both must give the same result.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

enum { N = 4096, H = 16, D = 64, W = H * D, UPDATES = 4, BIG = 3072 };

static check_rng rng = {777};

static float *random_host(size_t count, double scale)
{
    float *h = malloc(count * sizeof *h + sizeof *h);
    check_fill_normal(&rng, h, count, scale);
    return h;
}

static void *on(sf_backend *be, const float *host, size_t count)
{
    void *d = be->ops->alloc(be, count * sizeof(float));
    CHECKF(d != NULL, "%s alloc: %s", be->ops->name, sf_last_error());
    if (d && host) CHECK_OK(be->ops->upload(be, d, host, count * sizeof(float)));
    return d;
}

static float *back(sf_backend *be, const void *d, size_t count)
{
    float *h = malloc(count * sizeof *h + 4);
    CHECK_OK(be->ops->download(be, h, d, count * sizeof(float)));
    return h;
}

typedef struct inputs {
    float *k, *v, *q, *a, *M, *z, *gate, *x, *w, *big_x, *big_w, *wm;
} inputs;

/* UPDATES delta updates of M, z on the side, then sf_be_side_join_before_product (a plain join
 * where the backend has no deferred one) and y = M wm^T ([H*D, D] rows of M; wm [W, D]): the product reads what the
 * side writes, so it shows whether the deferred wait is in front of it. wm prepared: the bf16
 * products' path; not: SGEMM's. */
static void join_at_product(sf_backend *be, int use_side, const float *k, const float *v, float *M, float *z,
                            const float *wm, float *y)
{
    const sf_backend_ops *ops = be->ops;
    if (use_side) CHECK_OK(sf_be_side_begin(be));
    for (int i = 0; i < UPDATES; i++)
        CHECK_OK(ops->memory_update(be, SF_MEMORY_DELTA, N, H, D, W, SF_DTYPE_F32, k, v, M, z));
    if (use_side) {
        CHECK_OK(sf_be_side_end(be));
        CHECK_OK(sf_be_side_join_before_product(be));
    }
    CHECK_OK(ops->matmul(be, H * D, D, W, M, D, wm, y, W, 0));
}

/* The sequence of a block layer, in the order it issues it: a long product on the main queue
 * (BIG^3 in float32), then k from a copy; on the side, UPDATES delta updates of M, z from k, v;
 * on the main queue meanwhile a bf16 product (its own scratch); then the join and the
 * retrieval of a from the updated memory. Writes a, M and the product y back to the host. */
static void run(sf_backend *be, const inputs *in, int use_side, float **a_out, float **M_out, float **y_out,
                float **ym_out)
{
    const sf_backend_ops *ops = be->ops;
    const size_t rows = (size_t)N * W;
    float *k_src = on(be, in->k, rows), *k = on(be, NULL, rows), *v = on(be, in->v, rows);
    float *q = on(be, in->q, rows), *a = on(be, in->a, rows);
    float *M = on(be, in->M, (size_t)H * D * D), *z = on(be, in->z, (size_t)H * D), *gate = on(be, in->gate, H);
    float *x = on(be, in->x, rows), *w = on(be, in->w, (size_t)W * W), *y = on(be, NULL, rows);
    float *big_x = on(be, in->big_x, (size_t)BIG * BIG), *big_w = on(be, in->big_w, (size_t)BIG * BIG);
    float *big_y = on(be, NULL, (size_t)BIG * BIG);
    float *nan = malloc(rows * sizeof *nan);
    for (size_t i = 0; i < rows; i++) nan[i] = NAN;
    CHECK_OK(ops->upload(be, k, nan, rows * sizeof(float)));
    CHECK_OK(sf_be_prepare_weights(be, 1, (const float *const *)&w, W, W));
    CHECK_OK(ops->sync(be));

    CHECK_OK(ops->matmul(be, BIG, BIG, BIG, big_x, BIG, big_w, big_y, BIG, 0));
    CHECK_OK(ops->copy(be, k, k_src, rows * sizeof(float)));
    if (use_side) {
        CHECK_OK(sf_be_side_begin(be));
        CHECK_OK(sf_be_side_begin(be)); /* again: still on the side, nothing else changes */
    }
    for (int i = 0; i < UPDATES; i++)
        CHECK_OK(ops->memory_update(be, SF_MEMORY_DELTA, N, H, D, W, SF_DTYPE_F32, k, v, M, z));
    if (use_side) {
        CHECK_OK(sf_be_side_end(be));
        CHECK_OK(sf_be_side_end(be)); /* not on the side any more: nothing to do */
    }
    CHECK_OK(ops->matmul(be, N, W, W, x, W, w, y, W, 0));
    if (use_side) CHECK_OK(sf_be_side_join(be));
    CHECK_OK(ops->memory_mix(be, N, H, D, W, SF_DTYPE_F32, q, M, z, gate, a));
    *a_out = back(be, a, rows);
    *M_out = back(be, M, (size_t)H * D * D);
    *y_out = back(be, y, rows);
    /* the deferred join: first before a bf16 product (wm prepared), then before an SGEMM (wu,
     * the same values, not prepared); ym_out holds both results */
    const size_t ym = (size_t)H * D * W;
    float *wm = on(be, in->wm, (size_t)W * D), *wu = on(be, in->wm, (size_t)W * D), *y2 = on(be, NULL, 2 * ym);
    CHECK_OK(sf_be_prepare_weights(be, 1, (const float *const *)&wm, W, D));
    join_at_product(be, use_side, k, v, M, z, wm, y2);
    join_at_product(be, use_side, k, v, M, z, wu, y2 + ym);
    *ym_out = back(be, y2, 2 * ym);
    void *all[] = {k_src, k, v, q, a, M, z, gate, x, w, y, big_x, big_w, big_y, wm, wu, y2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) ops->free(be, all[i]);
    free(nan);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    inputs in;
    const size_t rows = (size_t)N * W;
    in.k = random_host(rows, 1), in.v = random_host(rows, 1), in.q = random_host(rows, 1);
    in.a = random_host(rows, 1), in.x = random_host(rows, 1), in.w = random_host((size_t)W * W, 0.03);
    in.M = random_host((size_t)H * D * D, 3), in.gate = random_host(H, 1);
    in.big_x = random_host((size_t)BIG * BIG, 1), in.big_w = random_host((size_t)BIG * BIG, 1);
    in.wm = random_host((size_t)W * D, 0.1);
    in.z = malloc((size_t)H * D * sizeof(float));
    for (int i = 0; i < H * D; i++) in.z[i] = (float)(20 + 40 * check_rng_uniform(&rng));

    sf_backend *cpu = NULL;
    CHECK_OK(sf_backend_create("cpu", 0, &cpu));
    if (!cpu) return check_finish("test_side_queue");
    CHECK(!sf_be_has_side_queue(cpu)); /* the calls below then run in order */
    float *want_a, *want_M, *want_y, *want_ym;
    run(cpu, &in, 0, &want_a, &want_M, &want_y, &want_ym);

    /* 3xTF32 memory products (float32-accurate) in bf16 as well, so that the 1e-4 below sees any
     * ordering fault; the bf16-operand products are checked in test_backend_ops */
    setenv("SEQFLOW_CUDA_MEMORY_BF16", "0", 1);
    static const char *const modes[] = {"1", "0"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        setenv("SEQFLOW_CUDA_SIDE_QUEUE", modes[m], 1);
        sf_backend *gpu = NULL;
        CHECK_OK(sf_backend_create("cuda", 0, &gpu)); /* bf16 */
        if (!gpu) continue;
        CHECK(sf_be_has_side_queue(gpu));
        CHECK_OK(sf_be_reserve(gpu, N, W, H, D));
        float *a, *M, *y, *ym;
        run(gpu, &in, 1, &a, &M, &y, &ym);
        /* the memory is float32 in every precision; the product and the retrieval's input mix
         * are bf16 products where they are products */
        double err_M = check_rel_err_f32(M, want_M, (size_t)H * D * D);
        double err_a = check_rel_err_f32(a, want_a, rows);
        double err_y = check_rel_err_f32(y, want_y, rows);
        CHECKF(err_M <= 1e-4, "SEQFLOW_CUDA_SIDE_QUEUE=%s: M after the side's updates, relative error %.3g", modes[m], err_M);
        CHECKF(err_a <= 1e-4, "SEQFLOW_CUDA_SIDE_QUEUE=%s: retrieval after the join, relative error %.3g", modes[m], err_a);
        CHECKF(err_y <= 2e-2, "SEQFLOW_CUDA_SIDE_QUEUE=%s: main-queue product beside the side, relative error %.3g",
               modes[m], err_y);
        /* M is float32-accurate (3xTF32 updates; 12 of them by now, hence 1e-3 for the SGEMM) and
         * each batch of updates moves it by far more, so a product that read it early fails */
        const size_t ym_count = (size_t)H * D * W;
        double err_bf16 = check_rel_err_f32(ym, want_ym, ym_count);
        double err_f32 = check_rel_err_f32(ym + ym_count, want_ym + ym_count, ym_count);
        CHECKF(err_bf16 <= 2e-2, "SEQFLOW_CUDA_SIDE_QUEUE=%s: bf16 product after side_join_before_product, relative error %.3g",
               modes[m], err_bf16);
        CHECKF(err_f32 <= 1e-3, "SEQFLOW_CUDA_SIDE_QUEUE=%s: SGEMM after side_join_before_product, relative error %.3g",
               modes[m], err_f32);
        printf("SEQFLOW_CUDA_SIDE_QUEUE=%s: M %.2e, a %.2e, product %.2e, after the deferred joins %.2e / %.2e\n",
               modes[m], err_M, err_a, err_y, err_bf16, err_f32);
        free(a), free(M), free(y), free(ym);
        sf_backend_free(gpu);
    }
    unsetenv("SEQFLOW_CUDA_SIDE_QUEUE");
    free(want_a), free(want_M), free(want_y), free(want_ym);
    sf_backend_free(cpu);
    float *all[] = {in.k, in.v, in.q, in.a, in.M, in.z, in.gate, in.x, in.w, in.big_x, in.big_w, in.wm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    return check_finish("test_side_queue");
}
