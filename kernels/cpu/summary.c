/* Summary tokens (SPEC 5): chunk j of a segment is [j*N/S, (j+1)*N/S) cut to the n rows
 * present; its token is the mean of K and of V over the chunk. Empty chunks give none. */
#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/error.h"

/* SF_CPU_DISPATCH: plain C, the same bits in either copy */
SF_CPU_DISPATCH static int summarize(int n, int segment, int summary_tokens, int width, int ld, const float *k,
                                     const float *v, float *sk, float *sv)
{
    int produced = 0;
    for (int j = 0; j < summary_tokens; j++) {
        long lo = (long)j * segment / summary_tokens, hi = (long)(j + 1) * segment / summary_tokens;
        if (hi > n) hi = n;
        if (lo >= hi) continue;
        float *dk = sk + (size_t)produced * width, *dv = sv + (size_t)produced * width;
        for (int f = 0; f < width; f++) {
            double ak = 0, av = 0;
            for (long t = lo; t < hi; t++) ak += k[t * ld + f], av += v[t * ld + f];
            dk[f] = (float)(ak / (double)(hi - lo));
            dv[f] = (float)(av / (double)(hi - lo));
        }
        produced++;
    }
    return produced;
}

int sf_cpu_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, const float *k,
                   const float *v, float *sk, float *sv, int *count)
{
    (void)be;
    *count = summarize(n, segment, summary_tokens, width, ld, k, v, sk, sv);
    return SF_OK;
}
