/* The backend's marks (backend_ext.h, mark_start and mark_wait), with which the block stage
 * stays at most one segment ahead of the device: a mark's wait returns only once the work
 * issued before it has run, marks give their slots back, and a backend without them (the CPU)
 * says so. Without a GPU the CUDA part prints "skipped: no GPU". SF_CUDA_MARKS is the CUDA
 * backend's count of marks (kernels/cuda/cuda_backend.h). */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"

#ifdef SEQFLOW_HAVE_CUDA
#include "core/process_stats.h"
#include "kernels/cuda/cuda_backend.h"

/* Products that take the device a few milliseconds (2048 x 2048 x 2048, several). */
static int issue_work(sf_backend *be, const float *x, const float *w, float *y)
{
    enum { N = 2048 };
    int rc = SF_OK;
    for (int k = 0; k < 12 && rc == SF_OK; k++) rc = be->ops->matmul(be, N, N, N, x, N, w, y, N, 0);
    return rc;
}

/* A mark's wait returns once the work issued before it has run: the same work timed through
 * the backend's sync and through a mark must take about as long (a mark recorded where the
 * work does not run would be waited for at once). Several rounds; the bound is generous (half
 * the sync's time), so that only a wait that does not wait for the work fails it. */
static void test_mark_follows_work(sf_backend *be)
{
    enum { N = 2048 };
    float *h = calloc((size_t)N * N, sizeof(float));
    float *x = be->ops->alloc(be, sizeof(float) * N * N), *w = be->ops->alloc(be, sizeof(float) * N * N);
    float *y = be->ops->alloc(be, sizeof(float) * N * N);
    CHECK(h && x && w && y);
    if (!h || !x || !w || !y) goto done;
    for (size_t i = 0; i < (size_t)N * N; i++) h[i] = (float)(i % 7) * 0.01f;
    CHECK_OK(be->ops->upload(be, x, h, sizeof(float) * N * N));
    CHECK_OK(be->ops->upload(be, w, h, sizeof(float) * N * N));
    CHECK_OK(issue_work(be, x, w, y)); /* plans chosen, kernels loaded */
    CHECK_OK(be->ops->sync(be));
    for (int round = 0; round < 4; round++) {
        double t0 = sf_monotonic_seconds();
        CHECK_OK(issue_work(be, x, w, y));
        CHECK_OK(be->ops->sync(be));
        const double synced = sf_monotonic_seconds() - t0;
        t0 = sf_monotonic_seconds();
        CHECK_OK(issue_work(be, x, w, y));
        void *mark = NULL;
        CHECK_OK(sf_be_mark_start(be, &mark));
        CHECK(mark != NULL);
        if (!mark) break;
        CHECK_OK(sf_be_mark_wait(be, mark));
        const double marked = sf_monotonic_seconds() - t0;
        CHECKF(marked >= 0.5 * synced, "round %d: the work took %.3f ms to a sync, %.3f ms to a mark's wait", round,
               1e3 * synced, 1e3 * marked);
        CHECK_OK(be->ops->sync(be));
    }
done:
    free(h);
    if (x) be->ops->free(be, x);
    if (w) be->ops->free(be, w);
    if (y) be->ops->free(be, y);
}

/* Every slot in use: the next start says SF_E_UNSUPPORTED (the caller then does without); waited
 * for, the slots come back, in any order. A ticket of no slot is refused. */
static void test_mark_slots(sf_backend *be)
{
    for (int round = 0; round < 3; round++) {
        void *marks[SF_CUDA_MARKS] = {0};
        for (int i = 0; i < SF_CUDA_MARKS; i++) CHECK_OK(sf_be_mark_start(be, &marks[i]));
        void *extra = NULL;
        CHECK(sf_be_mark_start(be, &extra) == SF_E_UNSUPPORTED);
        for (int i = SF_CUDA_MARKS - 1; i >= 0; i--)
            if (marks[i]) CHECK_OK(sf_be_mark_wait(be, marks[i]));
    }
    int other = 0;
    CHECK(sf_be_mark_wait(be, &other) == SF_E_INVAL);
}
#endif

int main(void)
{
    sf_backend *cpu = NULL;
    CHECK_OK(sf_backend_create("cpu", 0, &cpu));
    void *mark = NULL;
    CHECK(sf_be_mark_start(cpu, &mark) == SF_E_UNSUPPORTED && mark == NULL);
    sf_backend_free(cpu);
#ifdef SEQFLOW_HAVE_CUDA
    if (!check_have_gpu()) return check_skip("no GPU");
    sf_backend *be = NULL;
    CHECK_OK(sf_backend_create_ex("cuda", 0, SF_PRECISION_BF16, &be));
    if (be) {
        test_mark_follows_work(be);
        test_mark_slots(be);
        sf_backend_free(be);
    }
    return check_finish("test_cuda_marks");
#else
    return check_skip("no GPU (a build without CUDA)");
#endif
}
