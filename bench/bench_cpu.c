/* CPU benchmark: OpenBLAS sgemm rate, the dilated-attention kernel's useful FLOP rate, whole
 * pipeline throughput for the small and medium models of the core issue, and resident memory
 * over a long stream. Prints one line per measurement (machine, date and command go into
 * bench/RESULTS.md by hand).
 *
 *   bench_cpu [--rss-tokens N] [--segments N] [--skip-medium] [--attention-only]
 *   bench_cpu --check-finite [--segments N] [--rounds R] [--ref-segment N]
 *
 * --check-finite measures what the finiteness check costs on the reference model (D=1024,
 * H=16, d=64, 4 layers, MLP 4096, N=8192, 256 global and 8 summary tokens, delta memory):
 * whole-pipeline tokens/s with block check_finite=1 and =0, alternating R rounds (best of
 * each), and the scan alone over the rows it reads (every layer's D floats a row), timed
 * apart, as a share of the time of a segment. --ref-segment shrinks N (branches N/4:1,
 * N/2:2, N:4) where a full-size run is too slow.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/attention.h"
#include "core/process_stats.h"
#include "seqflow/seqflow.h"


static float *random_floats(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof *x);
    srand(seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    return x;
}

/* sgemm on every core the way the backend uses it: rows split over OpenMP threads, each
 * calling single-threaded OpenBLAS. */
static double sgemm_gflops(int n)
{
    float *a = random_floats((size_t)n * n, 1), *b = random_floats((size_t)n * n, 2), *c = calloc((size_t)n * n, 4);
    int threads = omp_get_max_threads();
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = sf_monotonic_seconds();
#pragma omp parallel num_threads(threads)
        {
            int id = omp_get_thread_num(), per = (n + threads - 1) / threads;
            int r0 = id * per, rows = r0 + per > n ? n - r0 : per;
            if (rows > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, n, 1.0f, a + (size_t)r0 * n, n, b, n,
                            0.0f, c + (size_t)r0 * n, n);
        }
        double rate = 2.0 * n * n * n / (sf_monotonic_seconds() - t0) / 1e9;
        if (rate > best) best = rate;
    }
    free(a), free(b), free(c);
    return best;
}

static double attention_gflops(sf_backend *be, const sf_model_config *c, int reps, double *flops_out)
{
    const int N = c->segment, W = c->heads * c->head_dim;
    float *q = random_floats((size_t)N * W, 3), *k = random_floats((size_t)N * W, 4), *v = random_floats((size_t)N * W, 5);
    float *out = malloc((size_t)N * W * sizeof *out);
    sf_attention_desc d = {.n = N, .segment = N, .heads = c->heads, .head_dim = c->head_dim, .ld = W, .causal = c->causal,
                           .n_branches = c->n_branches, .branches = c->branches, .scale = 1.0f / sqrtf((float)c->head_dim)};
    double flops = sf_attention_useful_flops(&d), best = 1e30;
    be->ops->attention(be, &d, q, k, v, out); /* warm-up */
    for (int r = 0; r < reps; r++) {
        double t0 = sf_monotonic_seconds();
        be->ops->attention(be, &d, q, k, v, out);
        double t = sf_monotonic_seconds() - t0;
        if (t < best) best = t;
    }
    free(q), free(k), free(v), free(out);
    *flops_out = flops;
    return flops / best / 1e9;
}

/* Pushes `tokens` random tokens and returns tokens/s; reports RSS at checkpoints. */
static double pipeline_tokens_per_s(const sf_model *m, const char *pipeline, size_t tokens, size_t rss_at,
                                    size_t *rss_first, size_t *rss_last)
{
    sf_graph *g;
    if (sf_graph_create(m, NULL, &g) != SF_OK || sf_graph_parse(g, pipeline) != SF_OK) {
        fprintf(stderr, "bench: %s\n", sf_last_error());
        exit(1);
    }
    const sf_model_config *c = sf_model_get_config(m);
    size_t chunk = (size_t)c->segment;
    uint32_t *t = malloc(chunk * sizeof *t);
    unsigned s = 9;
    double t0 = sf_monotonic_seconds();
    size_t report = rss_at;
    for (size_t sent = 0; sent < tokens; sent += chunk) {
        for (size_t i = 0; i < chunk; i++) t[i] = (s = s * 1103515245u + 12345u) >> 16 & 0xff;
        if (sf_graph_push(g, 0, t, chunk) != SF_OK) {
            fprintf(stderr, "bench: %s\n", sf_last_error());
            exit(1);
        }
        for (sf_packet *p; (p = sf_graph_pull(g));) sf_packet_free(p);
        if (rss_at && sent + chunk >= report) {
            size_t r = sf_resident_bytes();
            if (report == rss_at) *rss_first = r;
            *rss_last = r;
            fprintf(stderr, "  %zu tokens: resident %.1f MiB, %.0f tokens/s\n", sent + chunk, r / 1048576.0,
                    (sent + chunk) / (sf_monotonic_seconds() - t0));
            report += rss_at;
        }
    }
    double rate = tokens / (sf_monotonic_seconds() - t0);
    free(t);
    sf_graph_free(g);
    return rate;
}

#define DEFAULT_PIPELINE "segment ! embed ! block ! norm"

/* --check-finite (see the top of the file). */
static int check_finite_cost(int segments, int rounds, int ref_segment)
{
    sf_model_config c;
    sf_model_config_default(&c);
    c.vocab = 256, c.dim = 1024, c.heads = 16, c.head_dim = 64, c.segment = ref_segment;
    c.causal = 1, c.memory = SF_MEMORY_DELTA, c.global_tokens = 256, c.summary_tokens = 8;
    c.layers = 4, c.mlp_hidden = 4096, c.final_norm = 1;
    char branches[96];
    snprintf(branches, sizeof branches, "%d:1,%d:2,%d:4", ref_segment / 4, ref_segment / 2, ref_segment);
    sf_model *m;
    if (sf_branches_parse(branches, &c) != SF_OK || sf_model_create_random(&c, 1, &m) != SF_OK) {
        fprintf(stderr, "bench: %s\n", sf_last_error());
        return 1;
    }
    size_t tokens = (size_t)segments * c.segment, r0 = 0, r1 = 0;
    double best[2] = {0, 0};
    pipeline_tokens_per_s(m, DEFAULT_PIPELINE, c.segment, 0, &r0, &r1); /* warm-up */
    for (int r = 0; r < rounds; r++)
        for (int on = 1; on >= 0; on--) {
            double tps = pipeline_tokens_per_s(m, on ? "segment ! embed ! block check_finite=1 ! norm"
                                                     : "segment ! embed ! block check_finite=0 ! norm",
                                               tokens, 0, &r0, &r1);
            printf("round %d check_finite=%d: %.1f tokens/s\n", r + 1, on, tps);
            if (tps > best[on]) best[on] = tps;
        }
    /* the scan alone: what check_finite=1 adds per segment, layers x N x D floats */
    size_t floats = (size_t)c.segment * c.dim;
    float *rows = random_floats(floats, 3);
    double scan_best = 1e30;
    size_t sink = 0;
    for (int r = 0; r < 20; r++) {
        double t0 = sf_monotonic_seconds();
        for (int l = 0; l < c.layers; l++) sink += sf_first_non_finite(rows, SF_DTYPE_F32, floats);
        double t = sf_monotonic_seconds() - t0;
        if (t < scan_best) scan_best = t;
    }
    free(rows);
    double segment_s = c.segment / best[0];
    printf("reference model N=%d (D=%d H=%d d=%d L=%d MLP %d, G=%d): check_finite=1 %.1f tokens/s, =0 %.1f tokens/s "
           "(best of %d rounds of %d segments): %+.2f%% throughput\n",
           c.segment, c.dim, c.heads, c.head_dim, c.layers, c.mlp_hidden, c.global_tokens, best[1], best[0], rounds,
           segments, 100.0 * (best[1] / best[0] - 1.0));
    printf("scan alone: %.3f ms per segment (%d layers x %zu floats, %.1f GB/s) = %.3f%% of a segment's %.1f ms%s\n",
           scan_best * 1e3, c.layers, floats, c.layers * floats * 4.0 / scan_best / 1e9, 100.0 * scan_best / segment_s,
           segment_s * 1e3, sink == (size_t)c.layers * 20 * floats ? "" : " (found a non-finite value?)");
    sf_model_free(m);
    return 0;
}

static void model_config(sf_model_config *c, int medium)
{
    sf_model_config_default(c);
    c->vocab = 256, c->head_dim = 64, c->causal = 1, c->memory = SF_MEMORY_DELTA;
    c->global_tokens = 0, c->summary_tokens = 0, c->final_norm = 1;
    if (medium) {
        c->dim = 1024, c->heads = 16, c->segment = 8192, c->layers = 2, c->mlp_hidden = 4096;
        sf_branches_parse("2048:1,4096:2,8192:4", c);
    } else {
        c->dim = 256, c->heads = 4, c->segment = 2048, c->layers = 2, c->mlp_hidden = 1024;
        sf_branches_parse("512:1,1024:2,2048:4", c);
    }
}

int main(int argc, char **argv)
{
    size_t rss_tokens = 0;
    int segments = 4, skip_medium = 0, attention_only = 0, check_finite = 0, rounds = 3, ref_segment = 8192,
        segments_given = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rss-tokens") == 0 && i + 1 < argc) rss_tokens = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--segments") == 0 && i + 1 < argc) segments = atoi(argv[++i]), segments_given = 1;
        else if (strcmp(argv[i], "--check-finite") == 0) check_finite = 1;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--ref-segment") == 0 && i + 1 < argc) ref_segment = atoi(argv[++i]);
        else if (strcmp(argv[i], "--skip-medium") == 0) skip_medium = 1;
        else if (strcmp(argv[i], "--attention-only") == 0) attention_only = 1;
        else {
            fprintf(stderr, "usage: bench_cpu [--rss-tokens N] [--segments N] [--skip-medium] [--attention-only]\n"
                            "       bench_cpu --check-finite [--segments N] [--rounds R] [--ref-segment N]\n");
            return 2;
        }
    }
    openblas_set_num_threads(1);
    printf("threads: %d\n", omp_get_max_threads());
    if (check_finite) {
        if (rounds < 1 || ref_segment < 4 || ref_segment % 4) {
            fprintf(stderr, "bench_cpu: --rounds must be >= 1 and --ref-segment a positive multiple of 4\n");
            return 2;
        }
        return check_finite_cost(segments_given ? segments : 2, rounds, ref_segment);
    }
    double gemm = sgemm_gflops(2048);
    printf("sgemm 2048^3 (OpenBLAS, all threads): %.1f GFLOP/s\n", gemm);
    sf_backend *be;
    if (sf_backend_create("cpu", 0, &be) != SF_OK) return 1;
    for (int medium = 0; medium <= 1; medium++) {
        if (medium && skip_medium) continue;
        sf_model_config c;
        model_config(&c, medium);
        char branches[128];
        sf_branches_format(&c, branches, sizeof branches);
        double flops;
        double att = attention_gflops(be, &c, medium ? 3 : 10, &flops);
        printf("%s attention (H=%d d=%d N=%d branches %s causal): %.2f GFLOP useful per segment, %.1f GFLOP/s = %.0f%% of sgemm\n",
               medium ? "medium" : "small", c.heads, c.head_dim, c.segment, branches, flops / 1e9, att, 100 * att / gemm);
        if (attention_only) continue;
        sf_model *m;
        if (sf_model_create_random(&c, 1, &m) != SF_OK) {
            fprintf(stderr, "bench: %s\n", sf_last_error());
            return 1;
        }
        size_t r0 = 0, r1 = 0;
        double tps = pipeline_tokens_per_s(m, DEFAULT_PIPELINE, (size_t)segments * c.segment, 0, &r0, &r1);
        printf("%s pipeline (D=%d H=%d d=%d N=%d L=%d MLP %d, delta memory): %.0f tokens/s over %d segments\n",
               medium ? "medium" : "small", c.dim, c.heads, c.head_dim, c.segment, c.layers, c.mlp_hidden, tps, segments);
        if (!medium && rss_tokens) {
            size_t step = rss_tokens / 10;
            tps = pipeline_tokens_per_s(m, DEFAULT_PIPELINE, rss_tokens, step, &r0, &r1);
            printf("small pipeline resident memory: %.1f MiB after %zu tokens, %.1f MiB after %zu tokens (%.0f tokens/s)\n",
                   r0 / 1048576.0, step, r1 / 1048576.0, rss_tokens, tps);
        }
        sf_model_free(m);
    }
    sf_backend_free(be);
    return 0;
}
