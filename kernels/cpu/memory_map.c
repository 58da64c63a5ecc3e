/* kernels/memory_map.h on the CPU: per head, the segment's sigma(K) and V widened to double,
 * the products on dgemm. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_rows.h"
#include "kernels/memory_map.h"
#include "seqflow/error.h"

/* sigma (ELU + 1) is sf_cpu_sigma_rows, the very function of the CPU memory update
 * (compressive_memory.c), so that the denominators and z agree with it bit for bit */

void sf_memory_map_identity(int heads, int d, double *A, double *B)
{
    const size_t dd = (size_t)d * d;
    memset(B, 0, (size_t)heads * dd * sizeof *B);
    if (!A) return;
    memset(A, 0, (size_t)heads * dd * sizeof *A);
    for (int h = 0; h < heads; h++)
        for (int e = 0; e < d; e++) A[(size_t)h * dd + (size_t)e * d + e] = 1.0;
}

/* The z increment of n rows of W sigma values: per component the double sum over the rows
 * in row order (the order of the CPU update's own sum), accumulated a block of columns at a
 * time so that the rows are read in place. */
SF_CPU_DISPATCH static void z_sums(int n, int W, int ld, const float *sk, float *z_increment)
{
    enum { BLOCK = 64 };
    for (int e0 = 0; e0 < W; e0 += BLOCK) {
        const int m = W - e0 < BLOCK ? W - e0 : BLOCK;
        double s[BLOCK] = {0};
        for (int i = 0; i < n; i++)
            for (int e = 0; e < m; e++) s[e] += sk[(size_t)i * ld + e0 + e];
        for (int e = 0; e < m; e++) z_increment[e0 + e] = (float)s[e];
    }
}

/* (the clones stay static: an exported function with clones would export its resolver too) */
void sf_memory_sigma(int n, int heads, int d, int ld, const float *k, float *sk, float *z_increment)
{
    sf_cpu_sigma_rows(n, heads * d, k, ld, sk, ld);
    if (z_increment) z_sums(n, heads * d, ld, sk, z_increment);
}

/* One head's parts from sigma(K) (rows sld apart): P = sigma(K)^T V and, for the delta rule,
 * Gf = sigma(K)^T D sigma(K), in float32 on sgemm as the update's own products; dk: n*d floats
 * of scratch. */
static void head_parts(sf_memory_kind kind, int n, int d, int ld, const float *sk, int sld, const float *v,
                       const float *z, float *P, float *Gf, float *dk)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0f, sk, sld, v, ld, 0.0f, P, d);
    if (kind != SF_MEMORY_DELTA) return;
    /* dk = D sigma(K), the denominators as the float update takes them: (float)(1 / den) with
     * den the double sum of float products */
    for (int i = 0; i < n; i++) {
        double den = 0;
        for (int e = 0; e < d; e++) den += (double)sk[(size_t)i * sld + e] * z[e];
        const float inv = den != 0 ? (float)(1.0 / den) : 0.0f;
        for (int e = 0; e < d; e++) dk[(size_t)i * d + e] = inv * sk[(size_t)i * sld + e];
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0f, sk, sld, dk, d, 0.0f, Gf, d);
}

/* One head's map <- the segment's then it: (A, B) <- (A - G A, B - G B + P) in double, G the
 * parts' Gf widened (delta); B <- B + P (linear). G: 2 d*d doubles of scratch. */
static void head_then(sf_memory_kind kind, int d, const float *P, const float *Gf, double *A, double *B, double *G)
{
    const size_t dd = (size_t)d * d;
    if (kind != SF_MEMORY_DELTA) {
        for (size_t i = 0; i < dd; i++) B[i] += P[i];
        return;
    }
    double *GA = G + dd;
    for (size_t i = 0; i < dd; i++) G[i] = Gf[i];
    if (A) {
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, G, d, A, d, 0.0, GA, d);
        for (size_t i = 0; i < dd; i++) A[i] -= GA[i];
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, G, d, B, d, 0.0, GA, d);
    for (size_t i = 0; i < dd; i++) B[i] += (double)P[i] - GA[i];
}

/* One head: sigma(K) (given: k holds it already, rows ld apart), the float32 z increment, then
 * the map. The segment's products over its n rows (sigma(K)^T V, sigma(K)^T D sigma(K)) run in
 * float32 on sgemm, as the update's own do; the map they enter is double. */
static int map_head(sf_memory_kind kind, int n, int d, int ld, const float *k, int given, const float *v, const float *z,
                    double *A, double *B, float *z_increment)
{
    const size_t nd = (size_t)n * d, dd = (size_t)d * d;
    float *own = given ? NULL : malloc(nd * sizeof *own);
    float *dk = kind == SF_MEMORY_DELTA && B ? malloc(nd * sizeof *dk) : NULL;
    float *P = B ? malloc(2 * dd * sizeof *P) : NULL;
    double *G = kind == SF_MEMORY_DELTA && B ? malloc(2 * dd * sizeof *G) : NULL;
    int rc = SF_OK;
    if ((!given && !own) || (B && !P) || (kind == SF_MEMORY_DELTA && B && (!dk || !G))) {
        rc = SF_E_NOMEM;
        goto done;
    }
    const float *sk = k;
    int sld = ld;
    if (!given) {
        sf_cpu_sigma_rows(n, d, k, ld, own, d);
        sk = own, sld = d;
    }
    if (z_increment)
        for (int e = 0; e < d; e++) {
            double s = 0;
            for (int i = 0; i < n; i++) s += sk[(size_t)i * sld + e];
            z_increment[e] = (float)s;
        }
    if (!B) goto done; /* z only */
    head_parts(kind, n, d, ld, sk, sld, v, z, P, P + dd, dk);
    head_then(kind, d, P, P + dd, A, B, G);
done:
    free(own);
    free(dk);
    free(P);
    free(G);
    return rc;
}

static int map_segment(sf_memory_kind kind, int n, int heads, int d, int ld, const float *k, int given, const float *v,
                       const float *z, double *A, double *B, float *z_increment, int threads);

int sf_memory_map_segment(sf_memory_kind kind, int n, int heads, int d, int ld, const float *k, const float *v,
                          const float *z, double *A, double *B, float *z_increment, int threads)
{
    return map_segment(kind, n, heads, d, ld, k, 0, v, z, A, B, z_increment, threads);
}

int sf_memory_map_segment_sigma(sf_memory_kind kind, int n, int heads, int d, int ld, const float *sk, const float *v,
                                const float *z, double *A, double *B, int threads)
{
    return map_segment(kind, n, heads, d, ld, sk, 1, v, z, A, B, NULL, threads);
}

static int map_segment(sf_memory_kind kind, int n, int heads, int d, int ld, const float *k, int given, const float *v,
                       const float *z, double *A, double *B, float *z_increment, int threads)
{
    if (kind == SF_MEMORY_NONE || n <= 0) {
        if (z_increment) memset(z_increment, 0, (size_t)heads * d * sizeof *z_increment);
        return SF_OK;
    }
    const size_t dd = (size_t)d * d;
    int failed = 0;
    if (threads <= 0) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int h = 0; h < heads; h++) {
        int rc = map_head(kind, n, d, ld, k + (size_t)h * d, given, v + (size_t)h * d, z ? z + (size_t)h * d : NULL,
                          A ? A + (size_t)h * dd : NULL, B ? B + (size_t)h * dd : NULL,
                          z_increment ? z_increment + (size_t)h * d : NULL);
        if (rc != SF_OK) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? sf_error(SF_E_NOMEM, "out of memory for a segment's memory map") : SF_OK;
}

int sf_memory_map_parts(sf_memory_kind kind, int n, int heads, int d, int ld, const float *sk, const float *v,
                        const float *z, float *P, float *G, int threads)
{
    const size_t dd = (size_t)d * d;
    if (kind == SF_MEMORY_NONE) return SF_OK;
    if (n <= 0) {
        memset(P, 0, (size_t)heads * dd * sizeof *P);
        if (kind == SF_MEMORY_DELTA) memset(G, 0, (size_t)heads * dd * sizeof *G);
        return SF_OK;
    }
    int failed = 0;
    if (threads <= 0) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int h = 0; h < heads; h++) {
        float *dk = kind == SF_MEMORY_DELTA ? malloc((size_t)n * d * sizeof *dk) : NULL;
        if (kind == SF_MEMORY_DELTA && !dk) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        head_parts(kind, n, d, ld, sk + (size_t)h * d, ld, v + (size_t)h * d, z ? z + (size_t)h * d : NULL,
                   P + (size_t)h * dd, kind == SF_MEMORY_DELTA ? G + (size_t)h * dd : NULL, dk);
        free(dk);
    }
    return failed ? sf_error(SF_E_NOMEM, "out of memory for a segment's memory map") : SF_OK;
}

int sf_memory_map_then_parts(sf_memory_kind kind, int heads, int d, const float *P, const float *G, double *A,
                             double *B)
{
    if (kind == SF_MEMORY_NONE) return SF_OK;
    const size_t dd = (size_t)d * d;
    double *scratch = kind == SF_MEMORY_DELTA ? malloc(2 * dd * sizeof *scratch) : NULL;
    if (kind == SF_MEMORY_DELTA && !scratch) return sf_error(SF_E_NOMEM, "out of memory composing memory maps");
    for (int h = 0; h < heads; h++)
        head_then(kind, d, P + (size_t)h * dd, kind == SF_MEMORY_DELTA ? G + (size_t)h * dd : NULL,
                  A ? A + (size_t)h * dd : NULL, B + (size_t)h * dd, scratch);
    free(scratch);
    return SF_OK;
}

/* One head's update from its parts, in double: M <- M + P - G M (G NULL: M + P), rounded once. */
SF_CPU_DISPATCH static void head_update(int d, const float *P, const float *G, float *M, double *t)
{
    const size_t dd = (size_t)d * d;
    for (size_t i = 0; i < dd; i++) t[i] = (double)M[i] + (double)P[i];
    if (G)
        for (int i = 0; i < d; i++) {
            double *ti = t + (size_t)i * d;
            for (int e = 0; e < d; e++) {
                const double gie = G[(size_t)i * d + e];
                const float *me = M + (size_t)e * d;
                for (int j = 0; j < d; j++) ti[j] -= gie * (double)me[j];
            }
        }
    for (size_t i = 0; i < dd; i++) M[i] = (float)t[i];
}

int sf_memory_update_parts(sf_memory_kind kind, int heads, int d, const float *P, const float *G,
                           const float *z_increment, float *M, float *z)
{
    if (kind == SF_MEMORY_NONE) return SF_OK;
    const size_t dd = (size_t)d * d;
    double *t = malloc(dd * sizeof *t);
    if (!t) return sf_error(SF_E_NOMEM, "out of memory in the memory update");
    for (int h = 0; h < heads; h++)
        head_update(d, P + (size_t)h * dd, kind == SF_MEMORY_DELTA ? G + (size_t)h * dd : NULL, M + (size_t)h * dd, t);
    free(t);
    for (size_t i = 0; i < (size_t)heads * d; i++) z[i] += z_increment[i];
    return SF_OK;
}

/* t = a b for one head, in a fixed order of plain double operations: a rank's map is composed
 * and applied by several ranks, which must get the same bits whatever their BLAS or CPU */
static void product(int d, const double *a, const double *b, double *t)
{
    for (int i = 0; i < d; i++) {
        double *ti = t + (size_t)i * d;
        for (int j = 0; j < d; j++) ti[j] = 0;
        for (int e = 0; e < d; e++) {
            const double aie = a[(size_t)i * d + e];
            const double *be = b + (size_t)e * d;
            for (int j = 0; j < d; j++) ti[j] += aie * be[j];
        }
    }
}

int sf_memory_map_then(int heads, int d, const double *A2, const double *B2, double *A, double *B)
{
    const size_t dd = (size_t)d * d;
    if (!A2) {
        for (size_t i = 0; i < (size_t)heads * dd; i++) B[i] += B2[i];
        return SF_OK;
    }
    double *t = malloc(dd * sizeof *t);
    if (!t) return sf_error(SF_E_NOMEM, "out of memory composing memory maps");
    for (int h = 0; h < heads; h++) {
        const double *a2 = A2 + (size_t)h * dd, *b2 = B2 + (size_t)h * dd;
        double *a = A + (size_t)h * dd, *b = B + (size_t)h * dd;
        product(d, a2, b, t);
        for (size_t i = 0; i < dd; i++) b[i] = t[i] + b2[i];
        product(d, a2, a, t);
        memcpy(a, t, dd * sizeof *t);
    }
    free(t);
    return SF_OK;
}

int sf_memory_map_apply(int heads, int d, const double *A, const double *B, double *M)
{
    const size_t dd = (size_t)d * d;
    if (!A) {
        for (size_t i = 0; i < (size_t)heads * dd; i++) M[i] += B[i];
        return SF_OK;
    }
    double *t = malloc(dd * sizeof *t);
    if (!t) return sf_error(SF_E_NOMEM, "out of memory applying a memory map");
    for (int h = 0; h < heads; h++) {
        product(d, A + (size_t)h * dd, M + (size_t)h * dd, t);
        for (size_t i = 0; i < dd; i++) M[(size_t)h * dd + i] = t[i] + B[(size_t)h * dd + i];
    }
    free(t);
    return SF_OK;
}
