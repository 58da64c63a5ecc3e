/* Start-up and latency of a GPU graph in push mode (`segment ! embed ! block ! norm`, stages on
 * the caller's thread), on a model file (bench_gpu_pipeline --make-model; the reference model
 * and the built-in one's shape, preset small):
 *
 *   bench_start_latency --model PATH --cold [--segments S] [--settings K=V,...] [--precision P]
 *   bench_start_latency --model PATH --latency [--load F] [--segments S] [--chunk C]
 *                       [--settings K=V,...] [--precision P]
 *
 * --cold (run it in a fresh process: the CUDA context is part of what a process pays): CUDA's
 * start (a backend created and freed before anything else: the context, cuBLAS's libraries
 * loaded), loading the model, creating the graph and setting it up (sf_graph_prepare: backend,
 * weight upload and conversion, and with the backend setting warmup=1 the warm-up segment),
 * then S segments of random tokens pushed back to back, each a whole segment
 * at once: the first segment's time from the graph set up to its rows pulled, the time from
 * the model loaded to those rows (graph creation and set-up included), each of the first 10 segments' time, their
 * rate against the steady rate of segments 21..S.
 *
 * --latency: the graph's capacity first (20 segments back to back on a stream of their own,
 * after 2 untimed), then tokens arrive in real time at F (default 0.5) of that rate, C tokens at
 * a time (default segment/32) on a fresh stream: for each segment the time from its last
 * token's arrival (the time it was due, so a late push counts) to its rows pulled from the
 * graph's last stage; p50, p99 and the worst over segments 2..S (default 300), the first
 * segment's on its own, and the time from the first token's arrival to the first rows out.
 * Output: readable lines and one RESULT line of key=value. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/process_stats.h"
#include "seqflow/seqflow.h"

static void die(const char *what)
{
    fprintf(stderr, "bench_start_latency: %s: %s\n", what, sf_last_error());
    exit(1);
}

static const char *settings = NULL;
static const char *device = "cuda"; /* --device: cpu to try the benchmark itself on a machine without a GPU */
static sf_precision precision = SF_PRECISION_AUTO;

static sf_graph *open_graph(const sf_model *m)
{
    sf_graph_options o = {.device = device, .queue_depth = 4, .precision = precision, .backend_settings = settings};
    sf_graph *g;
    if (sf_graph_create(m, &o, &g) != SF_OK) die("creating the graph");
    if (sf_graph_parse(g, "segment ! embed ! block ! norm") != SF_OK) die("building the pipeline");
    if (sf_graph_prepare(g) != SF_OK) die("setting the graph up");
    return g;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static void random_tokens(uint32_t *t, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (uint32_t)((rng >> 33) % (uint64_t)vocab);
    }
}

/* Pulls every waiting packet; returns the end position (position + n) of the last committed
 * hidden packet of `stream` seen, or 0. Touches every row, as a consumer would. */
static size_t drain(sf_graph *g, uint64_t stream, double *checksum)
{
    size_t end = 0;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->stream != stream || (p->flags & SF_PACKET_PROVISIONAL) || !p->n) continue;
        if (p->x) *checksum += p->x[0] + p->x[p->n * p->width - 1];
        end = p->position + p->n;
    }
    return end;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)ceil(p * (double)n) - 1;
    return v[i < n ? i : n - 1];
}

static const char *label(void) { return settings && *settings ? settings : "default settings"; }

static void cold(const char *model_path, int segments)
{
    if (segments < 21) segments = 21;
    double t = sf_monotonic_seconds();
    sf_backend *be;
    if (sf_backend_create(device, 0, &be) != SF_OK) die(device);
    sf_backend_free(be);
    const double context_s = sf_monotonic_seconds() - t;
    t = sf_monotonic_seconds();
    sf_model *m;
    if (sf_model_load(model_path, &m) != SF_OK) die(model_path);
    const double t_loaded = sf_monotonic_seconds(), load_s = t_loaded - t;
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment;
    uint32_t *tokens = malloc(N * (size_t)segments * sizeof *tokens);
    random_tokens(tokens, N * (size_t)segments, c->vocab);
    const double t_make = sf_monotonic_seconds();
    sf_graph *g = open_graph(m);
    const double t_ready = sf_monotonic_seconds(), setup_s = t_ready - t_make;
    double *done = malloc((size_t)segments * sizeof *done), sum = 0;
    for (int s = 0; s < segments; s++) {
        if (sf_graph_push(g, 0, tokens + (size_t)s * N, N) != SF_OK) die("push");
        if (drain(g, 0, &sum) != (size_t)(s + 1) * N) {
            fprintf(stderr, "bench_start_latency: segment %d's rows did not come out with its push\n", s);
            exit(1);
        }
        done[s] = sf_monotonic_seconds();
    }
    const double first_s = done[0] - t_ready;
    const double first10 = 10.0 * N / (done[9] - t_ready);
    const double steady = (double)(segments - 20) * N / (done[segments - 1] - done[19]);
    printf("cold start (%s, %s): CUDA start (context, cuBLAS) %.1f ms; model load %.1f ms; graph creation and set-up %.1f ms; first segment "
           "%.1f ms after it; %.1f ms from the model loaded to the first rows\n",
           model_path, label(), 1e3 * context_s, 1e3 * load_s, 1e3 * setup_s, 1e3 * first_s,
           1e3 * (done[0] - t_loaded));
    printf("  segments 1-10 (ms each):");
    for (int s = 0; s < 10; s++) printf(" %.2f", 1e3 * (done[s] - (s ? done[s - 1] : t_ready)));
    printf("\n  first 10 segments %.0f tokens/s, steady (segments 21-%d) %.0f tokens/s: %.1f%%\n", first10, segments,
           steady, 100 * first10 / steady);
    printf("RESULT context_ms=%.2f load_ms=%.2f setup_ms=%.2f first_ms=%.2f model_to_first_ms=%.2f first10_tps=%.0f "
           "steady_tps=%.0f first10_ratio=%.4f checksum=%g\n",
           1e3 * context_s, 1e3 * load_s, 1e3 * setup_s, 1e3 * first_s, 1e3 * (done[0] - t_loaded), first10, steady,
           first10 / steady, sum);
    if (sf_graph_end(g, 0) != SF_OK) die("end");
    drain(g, 0, &sum);
    sf_graph_free(g);
    sf_model_free(m);
    free(tokens), free(done);
}

static void sleep_until(double when)
{
    for (;;) {
        const double left = when - sf_monotonic_seconds();
        if (left <= 0) return;
        if (left > 2e-4) {
            /* sleep most of the way, spin the last bit (nanosleep overshoots by tens of us) */
            const double nap = left - 1e-4;
            struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
}

static void latency(const char *model_path, int segments, double load, size_t chunk)
{
    if (segments < 3) segments = 3;
    sf_model *m;
    if (sf_model_load(model_path, &m) != SF_OK) die(model_path);
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment;
    if (!chunk) chunk = N / 32 ? N / 32 : 1;
    if (chunk > N) chunk = N;
    uint32_t *tokens = malloc(N * sizeof *tokens);
    sf_graph *g = open_graph(m);
    double sum = 0;
    /* capacity, on stream 1 */
    double t0 = 0;
    for (int s = 0; s < 22; s++) {
        if (s == 2) t0 = sf_monotonic_seconds();
        random_tokens(tokens, N, c->vocab);
        if (sf_graph_push(g, 1, tokens, N) != SF_OK) die("push");
        drain(g, 1, &sum);
    }
    const double capacity = 20.0 * N / (sf_monotonic_seconds() - t0);
    if (sf_graph_end(g, 1) != SF_OK) die("end");
    drain(g, 1, &sum);
    const double rate = load * capacity, period = (double)chunk / rate;
    /* real time, on stream 2: chunk k is due at start + k * period */
    const size_t chunks_per_segment = (N + chunk - 1) / chunk;
    double *lat = malloc((size_t)segments * sizeof *lat), *due_end = malloc((size_t)segments * sizeof *due_end);
    double first_out = -1;
    int seen = 0;
    const double start = sf_monotonic_seconds() + 0.01;
    size_t k = 0;
    for (int s = 0; s < segments; s++) {
        random_tokens(tokens, N, c->vocab);
        for (size_t j = 0; j < chunks_per_segment; j++, k++) {
            const size_t at = j * chunk, n = N - at < chunk ? N - at : chunk;
            const double due = start + (double)k * period;
            sleep_until(due);
            if (sf_graph_push(g, 2, tokens + at, n) != SF_OK) die("push");
            if (j + 1 == chunks_per_segment) due_end[s] = due;
            const size_t end = drain(g, 2, &sum);
            if (end) {
                const double now = sf_monotonic_seconds();
                if (first_out < 0) first_out = now - start;
                for (; seen < segments && (size_t)(seen + 1) * N <= end; seen++) lat[seen] = now - due_end[seen];
            }
        }
    }
    if (sf_graph_end(g, 2) != SF_OK) die("end");
    drain(g, 2, &sum);
    if (seen < segments) {
        fprintf(stderr, "bench_start_latency: %d of %d segments came out while the stream ran\n", seen, segments);
        exit(1);
    }
    const double first = lat[0];
    const size_t n_lat = (size_t)segments - 1;
    double *rest = lat + 1;
    double mean = 0, worst = 0;
    for (size_t i = 0; i < n_lat; i++) mean += rest[i] / (double)n_lat, worst = rest[i] > worst ? rest[i] : worst;
    const double p50 = percentile(rest, n_lat, 0.50), p99 = percentile(rest, n_lat, 0.99);
    printf("latency (%s, %s): capacity %.0f tokens/s in push mode; tokens arriving at %.0f tokens/s (%.0f%%), %zu at "
           "a time, segments of %zu (one every %.2f ms)\n",
           model_path, label(), capacity, rate, 100 * load, chunk, N, 1e3 * (double)N / rate);
    printf("  last token to rows out, segments 2-%d: p50 %.3f ms, p99 %.3f ms, worst %.3f ms, mean %.3f ms; the first "
           "segment %.3f ms; first rows out %.2f ms after the first token\n",
           segments, 1e3 * p50, 1e3 * p99, 1e3 * worst, 1e3 * mean, 1e3 * first, 1e3 * first_out);
    printf("RESULT capacity_tps=%.0f rate_tps=%.0f latency_p50_ms=%.4f latency_p99_ms=%.4f latency_max_ms=%.4f "
           "latency_first_ms=%.4f first_out_ms=%.3f checksum=%g\n",
           capacity, rate, 1e3 * p50, 1e3 * p99, 1e3 * worst, 1e3 * first, 1e3 * first_out, sum);
    sf_graph_free(g);
    sf_model_free(m);
    free(tokens), free(lat), free(due_end);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_start_latency --model PATH (--cold | --latency) [--segments S] [--load F] [--chunk C]\n"
                    "                           [--settings K=V,...] [--precision bf16|fp8|f32] [--device cuda|cpu]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int mode = 0, segments = 0;
    double load = 0.5;
    size_t chunk = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--cold") == 0) {
            mode = 1;
            continue;
        }
        if (strcmp(a, "--latency") == 0) {
            mode = 2;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) usage();
        if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--segments") == 0) segments = atoi(v);
        else if (strcmp(a, "--load") == 0) load = atof(v);
        else if (strcmp(a, "--chunk") == 0) chunk = (size_t)strtoull(v, NULL, 10);
        else if (strcmp(a, "--settings") == 0) settings = v;
        else if (strcmp(a, "--device") == 0) device = v;
        else if (strcmp(a, "--precision") == 0) {
            if (strcmp(v, "bf16") == 0) precision = SF_PRECISION_BF16;
            else if (strcmp(v, "fp8") == 0) precision = SF_PRECISION_FP8;
            else if (strcmp(v, "f32") == 0) precision = SF_PRECISION_F32;
            else usage();
        } else usage();
    }
    if (!model || !mode || !(load > 0 && load <= 1)) usage();
    if (mode == 1) cold(model, segments ? segments : 40);
    else latency(model, segments ? segments : 300, load, chunk);
    return 0;
}
