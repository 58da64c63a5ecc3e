/* y = x W^T (+ y): OpenBLAS sgemm on fixed blocks of rows, shared out among threads (each call
 * runs single-threaded, see sf_cpu_backend_init). */
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/error.h"

/* Rows per sgemm call, the same whatever the thread count: a BLAS may compute a row differently
 * depending on how many rows its call has and where the row sits among them (tail kernels for
 * the last rows, small-matrix paths), so the bytes out are independent of --threads only if
 * the calls are. Threads share out whole blocks; a block never splits the reduction (in), so
 * each output element is one dot product computed in one call. 64 is a multiple of every
 * x86 sgemm kernel's row unroll, which keeps the results of one call over all rows on the
 * common kernels, and large enough that packing W again per block costs nothing measurable. */
#define ROW_BLOCK 64

int sf_cpu_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y,
                  int ldy, int accumulate)
{
    if (n <= 0) return SF_OK;
    const float beta = accumulate ? 1.0f : 0.0f;
    const int blocks = (n + ROW_BLOCK - 1) / ROW_BLOCK;
    int threads = sf_cpu_threads(be);
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int b = 0; b < blocks; b++) {
        int r0 = b * ROW_BLOCK, rows = n - r0 < ROW_BLOCK ? n - r0 : ROW_BLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x + (size_t)r0 * ldx, ldx, w, in,
                    beta, y + (size_t)r0 * ldy, ldy);
    }
    return SF_OK;
}
