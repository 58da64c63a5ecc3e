/* Quantizer benchmark: encode and decode rate of each kind, single thread, best of 5 over
 * 64 MiB of float32 (GB/s of float32 input, 1e9 bytes), and the compression ratio against
 * float32. Prints one line per kind.
 *
 *   bench_quantize [group]      (default group 64 for int8, int4 and fp8)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "compress/quantize.h"
#include "seqflow/error.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const size_t n = (size_t)64 << 20 >> 2; /* 64 MiB of float32 */
    int group = argc > 1 ? atoi(argv[1]) : 64;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    uint8_t *buf = malloc(n * sizeof(float));
    if (!x || !y || !buf) return 1;
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++) { /* roughly normal: sum of 4 uniforms, centred */
        double u = 0;
        for (int k = 0; k < 4; k++) {
            s = s * 1103515245u + 12345u;
            u += (double)(s >> 8) / (double)(1u << 24);
        }
        x[i] = (float)((u - 2.0) * 1.7);
    }
    static const char *const names[] = {"f32", "bf16", "int8", "int4", "fp8_e4m3"};
    printf("bench_quantize: %zu floats (64 MiB), group %d, single thread, best of 5\n", n, group);
    for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++) {
        sf_quant_params p = {(sf_quant_kind)kind, group};
        size_t size = sf_quant_encoded_size(&p, n);
        double enc = INFINITY, dec = INFINITY;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now();
            int rc = sf_quantize(&p, x, n, buf, size);
            double t1 = now();
            if (!rc) rc = sf_dequantize(&p, buf, size, y, n);
            double t2 = now();
            if (rc) {
                fprintf(stderr, "%s: %s\n", names[kind], sf_last_error());
                return 1;
            }
            if (t1 - t0 < enc) enc = t1 - t0;
            if (t2 - t1 < dec) dec = t2 - t1;
        }
        double max_err = 0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)y[i] - (double)x[i]);
            if (e > max_err) max_err = e;
        }
        double bytes = (double)n * sizeof(float);
        printf("%-9s encode %6.2f GB/s  decode %6.2f GB/s  ratio %5.2fx  (%zu bytes, max abs err %.3g, bound %.3g)\n",
               names[kind], bytes / enc * 1e-9, bytes / dec * 1e-9, bytes / (double)size, size, max_err,
               sf_quant_error_bound(&p, x, n));
    }
    free(x);
    free(y);
    free(buf);
    return 0;
}
