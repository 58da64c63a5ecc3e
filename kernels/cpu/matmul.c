/* y = x W^T (+ y): OpenBLAS sgemm, rows split across threads so each call runs single-threaded
 * (see sf_cpu_backend_init). */
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/error.h"

/* Below this many rows per thread the split costs more than it saves. */
#define MIN_ROWS_PER_THREAD 32

int sf_cpu_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y,
                  int ldy, int accumulate)
{
    if (n <= 0) return SF_OK;
    const float beta = accumulate ? 1.0f : 0.0f;
    int threads = sf_cpu_threads(be);
    if (threads > n / MIN_ROWS_PER_THREAD) threads = n / MIN_ROWS_PER_THREAD;
    if (threads <= 1) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, ldx, w, in, beta, y, ldy);
        return SF_OK;
    }
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), per = (n + threads - 1) / threads;
        int r0 = t * per, rows = r0 + per > n ? n - r0 : per;
        if (rows > 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x + (size_t)r0 * ldx, ldx, w,
                        in, beta, y + (size_t)r0 * ldy, ldy);
    }
    return SF_OK;
}
