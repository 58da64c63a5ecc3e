/* Compressive memory (SPEC 4): retrieval mixed in by the gate, and the linear / delta updates.
 * Per head: sigma(Q) and sigma(K) are gathered into contiguous [n, d] blocks so that the
 * [n,d]x[d,d] and [d,n]x[n,d] products run on sgemm. M and z stay float32. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_rows.h"
#include "seqflow/error.h"

/* Retrieve (SPEC 4) for n gathered rows: out[i] = sx[i] M / (sx[i] . z), 0 where sx[i] . z == 0.
 * This and the per-head loops below are SF_CPU_DISPATCH: plain C, the same bits either copy. */
SF_CPU_DISPATCH static void retrieve(const float *sx, int n, int d, const float *Mh, const float *zh, float *out)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, sx, d, Mh, d, 0.0f, out, d);
    for (int i = 0; i < n; i++) {
        double den = 0;
        for (int e = 0; e < d; e++) den += (double)sx[(size_t)i * d + e] * zh[e];
        float inv = den != 0 ? (float)(1.0 / den) : 0.0f;
        for (int e = 0; e < d; e++) out[(size_t)i * d + e] *= inv;
    }
}

/* a's rows of one head (ld apart) = g * num + (1 - g) * a, num [n, d] */
SF_CPU_DISPATCH static void mix_rows(int n, int d, int ld, float g, const float *num, float *a)
{
    for (int i = 0; i < n; i++) {
        float *dst = a + (size_t)i * ld;
        for (int e = 0; e < d; e++) dst[e] = g * num[(size_t)i * d + e] + (1.0f - g) * dst[e];
    }
}

/* One head's update of Mh, zh from its k, v (rows ld apart); sk, target and (delta) r: [n, d]
 * scratch. */
SF_CPU_DISPATCH static void update_head(sf_memory_kind kind, int n, int d, int ld, const float *kh, const float *vh,
                                        float *Mh, float *zh, float *sk, float *target, float *r)
{
    sf_cpu_sigma_rows(n, d, kh, ld, sk, d);
    for (int i = 0; i < n; i++)
        for (int e = 0; e < d; e++) target[(size_t)i * d + e] = vh[(size_t)i * ld + e];
    if (kind == SF_MEMORY_DELTA) {
        /* target = V - sigma(K) M / (sigma(K) . z), all with the memory before the segment */
        retrieve(sk, n, d, Mh, zh, r);
        for (size_t i = 0; i < (size_t)n * d; i++) target[i] -= r[i];
    }
    /* M += sigma(K)^T target */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0f, sk, d, target, d, 1.0f, Mh, d);
    for (int e = 0; e < d; e++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += sk[(size_t)i * d + e];
        zh[e] += (float)s;
    }
}

int sf_cpu_memory_mix(sf_backend *be, int n, int heads, int d, int ld, const float *q, const float *M,
                      const float *z, const float *gate, float *a)
{
    if (n <= 0) return SF_OK;
    int failed = 0;
#pragma omp parallel for num_threads(sf_cpu_threads(be)) schedule(dynamic, 1)
    for (int h = 0; h < heads; h++) {
        float *sq = malloc((size_t)n * d * sizeof *sq), *num = malloc((size_t)n * d * sizeof *num);
        if (!sq || !num) {
#pragma omp atomic write
            failed = 1;
        } else {
            const float *Mh = M + (size_t)h * d * d, *zh = z + (size_t)h * d;
            sf_cpu_sigma_rows(n, d, q + (size_t)h * d, ld, sq, d); /* sigma = ELU + 1 */
            retrieve(sq, n, d, Mh, zh, num);
            const float g = 1.0f / (1.0f + expf(-gate[h]));
            mix_rows(n, d, ld, g, num, a + (size_t)h * d);
        }
        free(sq);
        free(num);
    }
    return failed ? sf_error(SF_E_NOMEM, "out of memory in memory retrieval") : SF_OK;
}

int sf_cpu_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, const float *k,
                         const float *v, float *M, float *z)
{
    if (kind == SF_MEMORY_NONE || n <= 0) return SF_OK;
    int failed = 0;
#pragma omp parallel for num_threads(sf_cpu_threads(be)) schedule(dynamic, 1)
    for (int h = 0; h < heads; h++) {
        const size_t nd = (size_t)n * d;
        float *sk = malloc(nd * sizeof *sk), *target = malloc(nd * sizeof *target);
        float *r = kind == SF_MEMORY_DELTA ? malloc(nd * sizeof *r) : NULL;
        if (!sk || !target || (kind == SF_MEMORY_DELTA && !r)) {
#pragma omp atomic write
            failed = 1;
        } else {
            update_head(kind, n, d, ld, k + (size_t)h * d, v + (size_t)h * d, M + (size_t)h * d * d, z + (size_t)h * d,
                        sk, target, r);
        }
        free(sk);
        free(target);
        free(r);
    }
    return failed ? sf_error(SF_E_NOMEM, "out of memory in the memory update") : SF_OK;
}
