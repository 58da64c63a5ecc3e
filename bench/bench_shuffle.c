/* Byte shuffle before LZ4/zstd (compress/shuffle.h, sf_frame_desc.shuffle) on float32 state of
 * the kind the cross-datacenter tier sends losslessly:
 *   M:      Infini-attention memories M = sum_t sigma(k_t) v_t^T, sigma = ELU + 1, keys and values
 *           standard Gaussian, d = 64, 8 heads, 2048 tokens; --copies independent ones (layers or
 *           streams) in one frame;
 *   M/T:    the same divided by the token count (a running mean instead of a sum);
 *   smooth: a smooth 1024 x 1024 map (a few low-frequency waves and bumps, plus Gaussian noise
 *           of 1e-4 of its range).
 * For each: frame bytes, ratio (float32 bytes / frame bytes, header included) and encode /
 * decode MB/s (1e6 bytes of float32 input per second, one thread, best of --repeat) for LZ4,
 * LZ4-HC 9, zstd 1, 3 and 9, lossless f32 and bf16 quantization, without and with the shuffle;
 * then, as a yardstick, each float32 byte plane's order-0 entropy (what a coder of independent
 * bytes could reach on the shuffled planes), and the shuffle loop alone (and memcpy).
 *
 *   bench_shuffle [--copies C] [--repeat N] [--seed S]
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/frame.h"
#include "compress/shuffle.h"
#include "seqflow/error.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64* and Box-Muller: reproducible Gaussian draws without libc's rand. */
static uint64_t rng_state;
static double uniform(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
static double gaussian(void)
{
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

enum { D = 64, HEADS = 8, TOKENS = 2048 };

/* One memory per head: M[i][j] = sum_t sigma(k_t)[i] v_t[j], accumulated in float32 as a kernel
 * would, token by token. */
static void memory(float *m, double scale)
{
    float k[D], v[D];
    for (int h = 0; h < HEADS; h++) {
        float *mh = m + (size_t)h * D * D;
        memset(mh, 0, sizeof(float) * D * D);
        for (int t = 0; t < TOKENS; t++) {
            for (int i = 0; i < D; i++) {
                double x = gaussian();
                k[i] = (float)(x > 0 ? x + 1.0 : exp(x)); /* ELU + 1 */
                v[i] = (float)gaussian();
            }
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++) mh[i * D + j] += k[i] * v[j];
        }
        if (scale != 1.0)
            for (int i = 0; i < D * D; i++) mh[i] = (float)(mh[i] * scale);
    }
}

static void smooth_map(float *x, int side)
{
    for (int r = 0; r < side; r++)
        for (int c = 0; c < side; c++) {
            double u = (double)r / side, w = (double)c / side;
            double f = sin(6.3 * u) * cos(4.1 * w) + 0.5 * sin(13.0 * (u + w)) +
                       0.8 * exp(-((u - 0.3) * (u - 0.3) + (w - 0.6) * (w - 0.6)) / 0.02) + 2.0;
            x[(size_t)r * side + c] = (float)(f + 4e-4 * gaussian());
        }
}

typedef struct {
    const char *name;
    sf_codec codec;
    int level;
} codec_case;

static void bench_frame(const char *what, const float *x, size_t rows, size_t cols, const codec_case *cc,
                        sf_quant_kind quant, int shuffle, int repeat, sf_buffer *buf, float *y)
{
    size_t n = rows * cols, bytes = n * sizeof(float);
    sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 2, .shape = {rows, cols},
                       .codec = cc->codec, .level = cc->level, .quant = {quant, 1}, .shuffle = shuffle};
    double best_enc = INFINITY, best_dec = INFINITY, spent = 0;
    for (int r = 0; r < repeat && (r < 2 || spent < 3.0); r++) {
        buf->len = 0;
        double t0 = now();
        int rc = sf_frame_encode(&d, x, bytes, NULL, buf);
        double t1 = now();
        if (rc == 0) rc = sf_frame_decode_into(buf->data, buf->len, (size_t)1 << 34, NULL, y, bytes, NULL);
        double t2 = now();
        if (rc) {
            printf("%-7s %-8s %-5s failed: %s\n", what, cc->name, quant ? "bf16" : "f32", sf_last_error());
            return;
        }
        best_enc = fmin(best_enc, t1 - t0), best_dec = fmin(best_dec, t2 - t1);
        spent += t2 - t0;
    }
    if (quant == SF_QUANT_F32 && memcmp(x, y, bytes) != 0) printf("%s: lossless round trip differs!\n", what);
    printf("%-7s %-5s %-8s %-3s %10zu %7.2fx %9.0f %9.0f\n", what, quant ? "bf16" : "f32", cc->name,
           shuffle ? "on" : "off", buf->len, (double)bytes / (double)buf->len, bytes / best_enc / 1e6,
           bytes / best_dec / 1e6);
}

/* Order-0 entropy, in bits per byte, of byte b of every float32 value. */
static double plane_entropy(const float *x, size_t n, int b)
{
    size_t count[256] = {0};
    const uint8_t *p = (const uint8_t *)x;
    for (size_t i = 0; i < n; i++) count[p[4 * i + b]]++;
    double h = 0;
    for (int v = 0; v < 256; v++)
        if (count[v]) h -= (double)count[v] / (double)n * log2((double)count[v] / (double)n);
    return h;
}

static void bench_loop(const char *what, const float *x, size_t bytes, int repeat)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    double t[5] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    for (int r = 0; r < repeat * 4; r++) {
        double t0 = now();
        sf_byte_shuffle(x, a, bytes, 4);
        double t1 = now();
        sf_byte_unshuffle(a, b, bytes, 4);
        double t2 = now();
        sf_byte_shuffle(x, a, bytes, 2);
        double t3 = now();
        sf_byte_unshuffle(a, b, bytes, 2);
        double t4 = now();
        memcpy(b, x, bytes);
        double t5 = now();
        t[0] = fmin(t[0], t1 - t0), t[1] = fmin(t[1], t2 - t1), t[2] = fmin(t[2], t3 - t2);
        t[3] = fmin(t[3], t4 - t3), t[4] = fmin(t[4], t5 - t4);
    }
    printf("%-7s %9.2f MB: shuffle/4 %6.0f  unshuffle/4 %6.0f  shuffle/2 %6.0f  unshuffle/2 %6.0f  memcpy %6.0f MB/s\n",
           what, bytes / 1e6, bytes / t[0] / 1e6, bytes / t[1] / 1e6, bytes / t[2] / 1e6, bytes / t[3] / 1e6,
           bytes / t[4] / 1e6);
    free(a), free(b);
}

int main(int argc, char **argv)
{
    int copies = 16, repeat = 7;
    unsigned long long seed = 12345;
    static const struct option longopts[] = {{"copies", required_argument, 0, 'c'},
                                             {"repeat", required_argument, 0, 'r'},
                                             {"seed", required_argument, 0, 's'},
                                             {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "c:r:s:", longopts, NULL)) != -1;) {
        switch (o) {
        case 'c': copies = atoi(optarg); break;
        case 'r': repeat = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        default: fprintf(stderr, "usage: bench_shuffle [--copies C] [--repeat N] [--seed S]\n"); return 2;
        }
    }
    if (copies < 1) copies = 1;
    if (repeat < 1) repeat = 1;
    rng_state = seed ? seed : 1;

    const size_t per = (size_t)HEADS * D * D, side = 1024;
    const size_t n_mem = per * (size_t)copies;
    float *m = malloc(n_mem * sizeof *m), *mean = malloc(n_mem * sizeof *mean);
    float *smooth = malloc(side * side * sizeof *smooth);
    size_t biggest = n_mem > side * side ? n_mem : side * side;
    float *y = malloc(biggest * sizeof *y);
    if (!m || !mean || !smooth || !y) return 1;
    for (int c = 0; c < copies; c++) memory(m + c * per, 1.0);
    for (size_t i = 0; i < n_mem; i++) mean[i] = m[i] / (float)TOKENS;
    smooth_map(smooth, (int)side);

    static const codec_case codecs[] = {{"lz4", SF_CODEC_LZ4, 1},    {"lz4-hc9", SF_CODEC_LZ4, 9},
                                        {"zstd-1", SF_CODEC_ZSTD, 1}, {"zstd-3", SF_CODEC_ZSTD, 3},
                                        {"zstd-9", SF_CODEC_ZSTD, 9}};
    struct {
        const char *name;
        const float *x;
        size_t rows, cols;
    } sets[] = {{"M", m, n_mem / D, D}, {"M/T", mean, n_mem / D, D}, {"smooth", smooth, side, side}};
    printf("bench_shuffle: M = sum_t (ELU+1)(k_t) v_t^T, d=%d, %d heads, %d tokens, %d copies (%.2f MB); "
           "smooth %zux%zu (%.2f MB); seed %llu\n",
           D, HEADS, TOKENS, copies, n_mem * 4 / 1e6, side, side, side * side * 4 / 1e6, seed);
    printf("one thread, best of %d; MB/s of float32 input (1e6 bytes)\n", repeat);
    printf("%-7s %-5s %-8s %-3s %10s %8s %9s %9s\n", "data", "quant", "codec", "sh", "bytes", "ratio", "enc MB/s",
           "dec MB/s");
    sf_buffer buf = {0};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        for (int q = SF_QUANT_F32; q <= SF_QUANT_BF16; q++)
            for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++)
                for (int sh = 0; sh < 2; sh++)
                    bench_frame(sets[s].name, sets[s].x, sets[s].rows, sets[s].cols, &codecs[c], (sf_quant_kind)q, sh,
                                repeat, &buf, y);
    }
    printf("order-0 entropy of each float32 byte plane (little-endian: byte 3 = sign + 7 exponent bits), bits:\n");
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        double h[4], sum = 0;
        for (int b = 0; b < 4; b++) sum += h[b] = plane_entropy(sets[s].x, sets[s].rows * sets[s].cols, b);
        printf("%-7s byte0 %.2f  byte1 %.2f  byte2 %.2f  byte3 %.2f  -> order-0 ceiling %.2fx\n", sets[s].name, h[0], h[1],
               h[2], h[3], 32.0 / sum);
    }
    printf("the shuffle loop alone (compress/shuffle.c), one thread, best of %d:\n", repeat * 4);
    bench_loop("M", m, n_mem * sizeof(float), repeat);
    bench_loop("smooth", smooth, side * side * sizeof(float), repeat);
    sf_buffer_release(&buf);
    free(m), free(mean), free(smooth), free(y);
    return 0;
}
