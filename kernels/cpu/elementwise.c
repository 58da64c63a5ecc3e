/* Row-wise and elementwise ops: RMSNorm, embedding lookup, SwiGLU. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_rows.h"
#include "seqflow/error.h"

/* SF_CPU_DISPATCH: plain C, the same bits in either copy */
SF_CPU_DISPATCH static void rmsnorm_row(int dim, const float *row, const float *weight, float eps, float *dst)
{
    double ss = 0;
    for (int j = 0; j < dim; j++) ss += (double)row[j] * row[j];
    float r = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (int j = 0; j < dim; j++) dst[j] = row[j] * r * weight[j];
}

int sf_cpu_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps, float *y)
{
#pragma omp parallel for num_threads(sf_cpu_threads(be)) if (n >= 64) schedule(static)
    for (int i = 0; i < n; i++) rmsnorm_row(dim, x + (size_t)i * dim, weight, eps, y + (size_t)i * dim);
    return SF_OK;
}

int sf_cpu_embed(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table, float *y)
{
    (void)be;
    for (int i = 0; i < n; i++)
        memcpy(y + (size_t)i * dim, table + (size_t)tokens[i] * dim, (size_t)dim * sizeof *y);
    return SF_OK;
}

int sf_cpu_swiglu(sf_backend *be, int n, int f, float *a, const float *b)
{
    const size_t count = (size_t)n * f;
#pragma omp parallel for num_threads(sf_cpu_threads(be)) if (count >= 65536) schedule(static)
    for (int i = 0; i < n; i++) sf_cpu_swiglu_rows(a + (size_t)i * f, b + (size_t)i * f, (size_t)f);
    return SF_OK;
}
