/* Whole-pipeline benchmark: a model and a token file through
 * `segment ! embed ! block ! norm` in push mode on one device, timed in steady state, with the
 * model's useful FLOPs per token, the achieved rate, and device memory over a long stream.
 * bench/gpu_bench.sh drives it on the GPU machine next to the PyTorch peer
 * (bench/peers/seqflow_torch.py), which reads the same model and token files.
 *
 *   bench_gpu_pipeline --make-model PATH --preset reference|attention|small [--seed S] [--heads H]
 *   bench_gpu_pipeline --make-tokens PATH --count N [--vocab V] [--seed S]
 *   bench_gpu_pipeline --model PATH --tokens PATH [--device cuda|cpu] [--warmup-segments W]
 *                      [--out H.npy] [--compare-to REF.npy] [--gemm-tflops R]
 *   bench_gpu_pipeline --model PATH --memory-run TOKENS [--memory-at X] [--memory-seconds S]
 *
 * Useful FLOPs count what the SPEC model must compute: attention pairs with causal masking
 * counted exactly and the global tokens present at each segment (sf_attention_useful_flops,
 * 4*d per pair), the Q/K/V/O projections, the SwiGLU MLP, memory retrieval (2*d*(d+1) per head
 * and token) and update (delta: retrieval plus the 2*d*d outer product; linear: 2*d*d).
 * Norms, embedding, gating and summary pooling are left out (a rounding error next to these).
 * Device memory: the CUDA backend's own count of what it holds and its peak
 * (sf_cuda_backend_memory), and cudaMemGetInfo's bytes in use on the whole device (context and
 * library internals included), sampled after every segment. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention.h"
#include "core/process_stats.h"
#include "seqflow/seqflow.h"

#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

static void die(const char *what)
{
    fprintf(stderr, "bench_gpu_pipeline: %s: %s\n", what, sf_last_error());
    exit(1);
}

/* Device memory of the graph's backend: what it holds through its own allocations (buffers,
 * bf16 weight copies, scratch, cuBLAS workspace) and their peak since creation, and the bytes
 * in use on the whole device (cudaMemGetInfo: also the CUDA context and library internals).
 * All -1 on a backend that is not CUDA. */
typedef struct device_memory {
    double held, peak, device_used;
} device_memory;

static device_memory graph_device_memory(sf_graph *g)
{
    device_memory r = {-1, -1, -1};
#ifdef SEQFLOW_HAVE_CUDA
    sf_backend *be = sf_stage_backend(sf_graph_stage(g, 0));
    sf_cuda_memory m;
    if (be && strcmp(be->ops->name, "cuda") == 0 && sf_cuda_backend_memory(be, &m) == SF_OK)
        r.held = (double)m.allocated, r.peak = (double)m.peak, r.device_used = (double)(m.device_total - m.device_free);
#else
    (void)g;
#endif
    return r;
}

/* ---- model and token files ------------------------------------------------------------- */

static int preset_config(const char *preset, sf_model_config *c)
{
    sf_model_config_default(c);
    if (strcmp(preset, "small") == 0) return 0; /* the built-in model's shape */
    int attention_only = strcmp(preset, "attention") == 0;
    if (!attention_only && strcmp(preset, "reference") != 0) return -1;
    c->vocab = 256, c->dim = 1024, c->heads = 16, c->head_dim = 64, c->segment = 8192;
    c->causal = 1, c->memory = SF_MEMORY_DELTA, c->global_tokens = 256, c->summary_tokens = 8;
    c->layers = attention_only ? 1 : 4, c->mlp_hidden = attention_only ? 0 : 4096, c->final_norm = 1;
    if (sf_branches_parse("2048:1,4096:2,8192:4", c) != SF_OK) die("branches");
    return 0;
}

/* causal < 0, heads 0 and memory NULL keep the preset's; heads H splits the model width into H
 * heads of dim / H (the reference model as 8 heads of 128: --heads 8). */
static void make_model(const char *path, const char *preset, unsigned long long seed, int causal, const char *memory,
                       int segment, const char *branches, int heads)
{
    sf_model_config c;
    if (preset_config(preset, &c) != 0) {
        fprintf(stderr, "bench_gpu_pipeline: unknown preset '%s' (reference, attention, small)\n", preset);
        exit(2);
    }
    if (causal >= 0) c.causal = causal;
    if (segment > 0) c.segment = segment;
    if (heads > 0) {
        if (c.dim % heads) {
            fprintf(stderr, "bench_gpu_pipeline: --heads %d does not divide the width %d\n", heads, c.dim);
            exit(2);
        }
        c.heads = heads, c.head_dim = c.dim / heads;
    }
    if (branches && sf_branches_parse(branches, &c) != SF_OK) die(branches);
    if (memory) {
        if (strcmp(memory, "none") == 0) c.memory = SF_MEMORY_NONE;
        else if (strcmp(memory, "linear") == 0) c.memory = SF_MEMORY_LINEAR;
        else if (strcmp(memory, "delta") == 0) c.memory = SF_MEMORY_DELTA;
        else {
            fprintf(stderr, "bench_gpu_pipeline: --memory expects none, linear or delta\n");
            exit(2);
        }
    }
    sf_model *m;
    if (sf_model_create_random(&c, seed, &m) != SF_OK) die("creating the model");
    if (sf_model_save(m, path) != SF_OK) die(path);
    sf_model_free(m);
}

static void make_tokens(const char *path, size_t count, unsigned vocab, unsigned long long seed)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t i = 0; i < count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t t = (uint32_t)((s >> 33) % vocab);
        unsigned char le[4] = {t & 0xff, t >> 8 & 0xff, t >> 16 & 0xff, t >> 24};
        if (fwrite(le, 1, 4, f) != 4) {
            perror(path);
            exit(1);
        }
    }
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static uint32_t *read_tokens(const char *path, size_t *count)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    *count = (size_t)bytes / 4;
    uint32_t *t = malloc(*count * 4 + 4);
    unsigned char *raw = malloc(*count * 4 + 4);
    if (!t || !raw || fread(raw, 4, *count, f) != *count) {
        fprintf(stderr, "bench_gpu_pipeline: cannot read %s\n", path);
        exit(1);
    }
    for (size_t i = 0; i < *count; i++)
        t[i] = raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 | (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
    free(raw);
    fclose(f);
    return t;
}

/* [rows, cols] float32 little-endian .npy (format 1.0). */
static void write_npy(const char *path, const float *x, size_t rows, size_t cols)
{
    char header[128];
    int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }", rows, cols);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    unsigned short hlen = (unsigned short)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f), fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    if (fwrite(x, sizeof *x, rows * cols, f) != rows * cols || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Relative L2 error of x ([count] floats) against the float32 .npy at path (written by
 * write_npy, of the same element count); negative when the file does not match. */
static double rel_err_to_npy(const char *path, const float *x, size_t count)
{
    FILE *f = fopen(path, "rb");
    unsigned char head[10];
    if (!f || fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) {
        if (f) fclose(f);
        return -1;
    }
    fseek(f, 10 + (long)(head[8] | head[9] << 8), SEEK_SET);
    double num = 0, den = 0;
    float buf[4096];
    size_t done = 0, got;
    while (done < count && (got = fread(buf, sizeof *buf, count - done < 4096 ? count - done : 4096, f)) > 0) {
        for (size_t i = 0; i < got; i++) {
            const double d = (double)x[done + i] - buf[i];
            num += d * d, den += (double)buf[i] * buf[i];
        }
        done += got;
    }
    fclose(f);
    if (done != count || den <= 0) return -1;
    return sqrt(num / den);
}

/* ---- useful work --------------------------------------------------------------------- */

/* Global tokens present when segment s starts: S per completed segment, at most G. */
static int globals_at(const sf_model_config *c, size_t s)
{
    if (c->global_tokens <= 0 || c->summary_tokens <= 0) return 0;
    size_t g = s * (size_t)c->summary_tokens;
    return g > (size_t)c->global_tokens ? c->global_tokens : (int)g;
}

/* The dilated attention's share (every layer): what the attention kernel does. */
static double segment_attention_flops(const sf_model_config *c, int n, int n_global)
{
    sf_attention_desc desc = {.n = n, .segment = c->segment, .heads = c->heads, .head_dim = c->head_dim,
                              .ld = c->heads * c->head_dim, .causal = c->causal, .n_branches = c->n_branches,
                              .branches = c->branches, .n_global = n_global,
                              .scale = 1.0f / sqrtf((float)c->head_dim)};
    return sf_attention_useful_flops(&desc) * c->layers;
}

static double segment_useful_flops(const sf_model_config *c, int n, int n_global)
{
    const double H = c->heads, d = c->head_dim, W = H * d, D = c->dim;
    double per_layer = 2.0 * n * D * W * 4;                                /* Q, K, V, O */
    per_layer += 2.0 * n * D * c->mlp_hidden * 3;                    /* W1, W3, W2 */
    if (c->memory != SF_MEMORY_NONE) {
        per_layer += 2.0 * n * H * d * (d + 1);                      /* retrieval */
        per_layer += 2.0 * n * H * d * d;                            /* sigma(K)^T (V or V - R) */
        if (c->memory == SF_MEMORY_DELTA) per_layer += 2.0 * n * H * d * (d + 1); /* R */
    }
    return per_layer * c->layers + segment_attention_flops(c, n, n_global);
}

/* ---- runs ---------------------------------------------------------------------------- */

static sf_precision precision = SF_PRECISION_AUTO; /* --precision */

static int block_batch = 1; /* --batch: block batch= */

static const char *backend_settings = NULL; /* --settings: the backend's key=value,... */

static sf_graph *open_graph(const sf_model *m, const char *device)
{
    sf_graph_options o = {.device = device, .queue_depth = 4, .precision = precision,
                          .backend_settings = backend_settings};
    sf_graph *g;
    char pipeline[96];
    snprintf(pipeline, sizeof pipeline, "segment ! embed ! block batch=%d ! norm", block_batch);
    if (sf_graph_create(m, &o, &g) != SF_OK) die("creating the graph");
    if (sf_graph_parse(g, pipeline) != SF_OK) die("building the pipeline");
    return g;
}

/* Pulls every waiting packet; copies rows into out (when non-NULL). Returns rows pulled. */
static size_t drain(sf_graph *g, float *out, size_t width)
{
    size_t rows = 0;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || (p->flags & SF_PACKET_PROVISIONAL)) continue;
        if (out && p->n) memcpy(out + p->position * width, p->x, p->n * p->width * sizeof(float));
        rows += p->n;
    }
    return rows;
}

static void run_tokens(const sf_model *m, const char *device, const char *tokens_path, int warmup,
                       const char *out_path, const char *ref_path, double gemm_tflops)
{
    const sf_model_config *c = sf_model_get_config(m);
    size_t count;
    uint32_t *tokens = read_tokens(tokens_path, &count);
    const size_t N = (size_t)c->segment, n_seg = (count + N - 1) / N;
    if (n_seg < 2) {
        fprintf(stderr, "bench_gpu_pipeline: %s holds %zu tokens, fewer than two segments of %zu\n", tokens_path, count, N);
        exit(1);
    }
    if ((size_t)warmup >= n_seg) warmup = (int)n_seg - 1;
    float *out = out_path || ref_path ? malloc(count * (size_t)c->dim * sizeof *out) : NULL;
    if (out_path && !out) die("no memory for the output");
    /* Fault the pages in now: first-touch faults of a fresh buffer (32 MiB a segment on the
     * reference model) would otherwise be timed as pipeline work. */
    if (out) memset(out, 0, count * (size_t)c->dim * sizeof *out);
    double t_setup = sf_monotonic_seconds();
    sf_graph *g = open_graph(m, device);
    device_memory mem_start = graph_device_memory(g);
    double used_peak = mem_start.device_used;
    size_t pulled = 0, pulled0 = 0;
    double t0 = 0, push_s = 0, drain_s = 0; /* host phases over the timed segments */
    for (size_t s = 0; s < n_seg; s++) {
        size_t n = count - s * N < N ? count - s * N : N;
        double tp = sf_monotonic_seconds();
        if (sf_graph_push(g, 0, tokens + s * N, n) != SF_OK) die("push");
        double td = sf_monotonic_seconds();
        pulled += drain(g, out, (size_t)c->dim);
        if (s + 1 > (size_t)warmup) push_s += td - tp, drain_s += sf_monotonic_seconds() - td;
        device_memory now = graph_device_memory(g);
        if (now.device_used > used_peak) used_peak = now.device_used;
        if (s + 1 == (size_t)warmup) t0 = sf_monotonic_seconds(), pulled0 = pulled;
        if (s == 0) fprintf(stderr, "  first segment done %.2f s after the graph was created\n", sf_monotonic_seconds() - t_setup);
    }
    if (sf_graph_end(g, 0) != SF_OK) die("end");
    pulled += drain(g, out, (size_t)c->dim);
    double t1 = sf_monotonic_seconds();
    if (warmup == 0) t0 = t_setup, pulled0 = 0;
    if (pulled != count) {
        fprintf(stderr, "bench_gpu_pipeline: %zu rows came out for %zu tokens\n", pulled, count);
        exit(1);
    }
    double flops = 0;
    for (size_t s = pulled0 / N; s < n_seg; s++) {
        size_t n = count - s * N < N ? count - s * N : N;
        flops += segment_useful_flops(c, (int)n, globals_at(c, s));
    }
    const double timed = (double)(count - pulled0), seconds = t1 - t0;
    const double per_token_steady = segment_useful_flops(c, (int)N, globals_at(c, 1u << 30)) / N;
    printf("seqflow %s (%s): %zu tokens (%zu segments, %d warm-up), %.0f tokens/s steady\n", device,
           precision == SF_PRECISION_F32    ? "f32"
           : precision == SF_PRECISION_BF16 ? "bf16"
           : precision == SF_PRECISION_FP8  ? "fp8"
                                            : "default precision", count,
           n_seg, warmup,
           timed / seconds);
    printf("useful work: %.2f MFLOP/token with a full global FIFO; %.1f TFLOP/s achieved over the timed segments",
           per_token_steady / 1e6, flops / seconds / 1e12);
    if (gemm_tflops > 0) printf(" = %.1f%% of the bf16 GEMM rate (%.1f TFLOP/s)", 100 * flops / seconds / 1e12 / gemm_tflops, gemm_tflops);
    printf("\n");
    printf("host phases over the timed segments: push (every stage, on this thread) %.1f ms/segment, "
           "pull and copy to --out %.1f ms/segment (SEQFLOW_PROFILE=1 splits push by stage)\n",
           1e3 * push_s / (double)(n_seg - (size_t)warmup), 1e3 * drain_s / (double)(n_seg - (size_t)warmup));
    device_memory mem_end = graph_device_memory(g);
    if (mem_end.peak >= 0)
        printf("device memory: backend holds %.1f MiB after graph creation, peak %.1f MiB over the run; "
               "device in use (whole GPU) peak %.1f MiB\n",
               mem_start.held / 1048576, mem_end.peak / 1048576, used_peak / 1048576);
    /* machine-readable line for gpu_bench.sh */
    printf("RESULT tokens_per_s=%.1f tflops=%.3f mflop_per_token=%.4f attention_mflop_per_token=%.4f peak_mib=%.1f\n",
           timed / seconds, flops / seconds / 1e12, per_token_steady / 1e6,
           segment_attention_flops(c, (int)N, globals_at(c, 1u << 30)) / N / 1e6, mem_end.peak / 1048576);
    sf_graph_free(g);
    if (ref_path) {
        const double err = rel_err_to_npy(ref_path, out, count * (size_t)c->dim);
        if (err < 0) {
            fprintf(stderr, "bench_gpu_pipeline: %s is not a float32 .npy of %zu x %d\n", ref_path, count, c->dim);
            exit(1);
        }
        printf("relative error (L2) of the output against %s: %.5f\nRESULT rel_err=%.6f\n", ref_path, err, err);
    }
    if (out_path) write_npy(out_path, out, count, (size_t)c->dim);
    free(out);
    free(tokens);
}

/* --streams S: the tokens split into S streams of whole segments, pushed round-robin one
 * segment of each stream per round (so block batch=B can take B streams' segments at once);
 * rounds after the warm-up are timed. */
static void run_streams(const sf_model *m, const char *device, const char *tokens_path, int streams, int warmup,
                        double gemm_tflops)
{
    const sf_model_config *c = sf_model_get_config(m);
    size_t count;
    uint32_t *tokens = read_tokens(tokens_path, &count);
    const size_t N = (size_t)c->segment, rounds = count / N / (size_t)streams;
    if (rounds < 2 || (size_t)warmup >= rounds) {
        fprintf(stderr, "bench_gpu_pipeline: %s holds %zu rounds of %d streams x %zu tokens; need more than the %d warm-up\n",
                tokens_path, rounds, streams, N, warmup);
        exit(1);
    }
    sf_graph *g = open_graph(m, device);
    double t0 = sf_monotonic_seconds();
    size_t pulled = 0, pulled0 = 0;
    for (size_t r = 0; r < rounds; r++) {
        if (r == (size_t)warmup) t0 = sf_monotonic_seconds(), pulled0 = pulled;
        for (int s = 0; s < streams; s++)
            if (sf_graph_push(g, (uint64_t)s, tokens + ((size_t)s * rounds + r) * N, N) != SF_OK) die("push");
        pulled += drain(g, NULL, (size_t)c->dim);
    }
    for (int s = 0; s < streams; s++)
        if (sf_graph_end(g, (uint64_t)s) != SF_OK) die("end");
    pulled += drain(g, NULL, (size_t)c->dim);
    double t1 = sf_monotonic_seconds();
    if (pulled != rounds * N * (size_t)streams) {
        fprintf(stderr, "bench_gpu_pipeline: %zu rows came out for %zu tokens\n", pulled, rounds * N * (size_t)streams);
        exit(1);
    }
    double flops = 0;
    for (size_t r = (size_t)warmup; r < rounds; r++) flops += streams * segment_useful_flops(c, (int)N, globals_at(c, r));
    const double timed = (double)(pulled - pulled0), seconds = t1 - t0;
    printf("seqflow %s, %d streams, block batch=%d, segment %zu: %.0f tokens/s over %zu timed rounds, %.1f useful TFLOP/s",
           device, streams, block_batch, N, timed / seconds, rounds - (size_t)warmup, flops / seconds / 1e12);
    if (gemm_tflops > 0) printf(" = %.1f%% of the bf16 GEMM rate", 100 * flops / seconds / 1e12 / gemm_tflops);
    printf("\nRESULT tokens_per_s=%.1f tflops=%.3f\n", timed / seconds, flops / seconds / 1e12);
    sf_graph_free(g);
    free(tokens);
}

/* Random tokens for as long as asked (or until the time limit); device memory sampled after
 * every segment. Reports the peak up to `at` tokens and the peak over the whole run. */
static void memory_run(const sf_model *m, const char *device, size_t total, size_t at, double max_seconds)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment;
    uint32_t *t = malloc(N * sizeof *t);
    sf_graph *g = open_graph(m, device);
    const device_memory start = graph_device_memory(g);
    double used_peak = start.device_used, peak_at = -1, used_peak_at = -1;
    size_t done = 0, tokens_at = 0;
    unsigned long long s = 7;
    /* about 60 reports over the run, at least 2 s apart */
    const double report_every = max_seconds < 120 ? 2 : max_seconds / 60;
    double t0 = sf_monotonic_seconds(), next_report = t0 + report_every;
    while (done < total && sf_monotonic_seconds() - t0 < max_seconds) {
        for (size_t i = 0; i < N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            t[i] = (uint32_t)((s >> 33) % (unsigned)c->vocab);
        }
        if (sf_graph_push(g, 0, t, N) != SF_OK) die("push");
        done += N;
        drain(g, NULL, 0);
        device_memory mem = graph_device_memory(g);
        if (mem.device_used > used_peak) used_peak = mem.device_used;
        if (done <= at || tokens_at == 0) peak_at = mem.peak, used_peak_at = used_peak, tokens_at = done;
        double now = sf_monotonic_seconds();
        if (now >= next_report) {
            /* one line a report, for plots (bench/plot.py): the rate so far, the backend's peak,
             * the whole device's use, this process's resident memory */
            const device_memory d = graph_device_memory(g);
            printf("MEMLOG tokens=%zu seconds=%.1f tokens_per_s=%.0f backend_peak_mib=%.1f device_used_mib=%.1f "
                   "rss_mib=%.1f\n",
                   done, now - t0, done / (now - t0), d.peak / 1048576, d.device_used / 1048576,
                   sf_resident_bytes() / 1048576.0);
            fflush(stdout);
            next_report = now + report_every;
        }
    }
    if (sf_graph_end(g, 0) != SF_OK) die("end");
    drain(g, NULL, 0);
    double seconds = sf_monotonic_seconds() - t0;
    const device_memory end = graph_device_memory(g);
    printf("memory run (%s, %s): backend holds %.1f MiB after graph creation; backend peak %.1f MiB after %zu tokens, "
           "%.1f MiB after %zu tokens; whole-device use peak %.1f MiB and %.1f MiB (%.0f s, %.0f tokens/s)\n",
           device, c->mlp_hidden ? "with MLP" : "attention only", start.held / 1048576, peak_at / 1048576, tokens_at,
           end.peak / 1048576, done, used_peak_at / 1048576, used_peak / 1048576, seconds, done / seconds);
    printf("RESULT mem_tokens_a=%zu mem_peak_a_mib=%.1f mem_tokens_b=%zu mem_peak_b_mib=%.1f used_a_mib=%.1f used_b_mib=%.1f\n",
           tokens_at, peak_at / 1048576, done, end.peak / 1048576, used_peak_at / 1048576, used_peak / 1048576);
    sf_graph_free(g);
    free(t);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_gpu_pipeline --make-model PATH --preset reference|attention|small [--seed S]\n"
            "                          [--causal 0|1] [--memory none|linear|delta] [--segment N --branches W:R,...]\n"
            "                          [--heads H (H heads of width/H)]\n"
            "       bench_gpu_pipeline --make-tokens PATH --count N [--vocab V] [--seed S]\n"
            "       bench_gpu_pipeline --model PATH --tokens PATH [--device cuda|cpu] [--precision bf16|fp8|f32]\n"
            "                          [--warmup-segments W] [--batch B (block batch=)] [--settings K=V,...]\n"
            "                          [--streams S (S streams of whole segments, round-robin; no --out)]\n"
            "                          [--out H.npy] [--compare-to REF.npy] [--gemm-tflops R]\n"
            "       bench_gpu_pipeline --model PATH --memory-run TOKENS [--memory-at X] [--memory-seconds S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *make_model_path = NULL, *preset = "reference", *make_tokens_path = NULL, *model_path = NULL;
    const char *tokens_path = NULL, *device = "cuda", *out_path = NULL, *memory = NULL, *ref_path = NULL;
    int causal = -1, segment = 0, streams = 0, heads = 0;
    const char *branches = NULL;
    unsigned long long seed = 1;
    size_t count = 0, mem_total = 0, mem_at = 1u << 20;
    unsigned vocab = 256;
    int warmup = 2;
    double gemm = 0, mem_seconds = 1e30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if (strcmp(a, "--make-model") == 0) make_model_path = v;
        else if (strcmp(a, "--preset") == 0) preset = v;
        else if (strcmp(a, "--causal") == 0) causal = atoi(v);
        else if (strcmp(a, "--memory") == 0) memory = v;
        else if (strcmp(a, "--segment") == 0) segment = atoi(v);
        else if (strcmp(a, "--heads") == 0)
            heads = atoi(v);
        else if (strcmp(a, "--branches") == 0) branches = v;
        else if (strcmp(a, "--batch") == 0) block_batch = atoi(v);
        else if (strcmp(a, "--streams") == 0) streams = atoi(v);
        else if (strcmp(a, "--precision") == 0) {
            if (strcmp(v, "bf16") == 0) precision = SF_PRECISION_BF16;
            else if (strcmp(v, "f32") == 0) precision = SF_PRECISION_F32;
            else if (strcmp(v, "fp8") == 0) precision = SF_PRECISION_FP8;
            else usage();
        }
        else if (strcmp(a, "--make-tokens") == 0) make_tokens_path = v;
        else if (strcmp(a, "--count") == 0) count = strtoull(v, NULL, 10);
        else if (strcmp(a, "--vocab") == 0) vocab = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--seed") == 0) seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--model") == 0) model_path = v;
        else if (strcmp(a, "--tokens") == 0) tokens_path = v;
        else if (strcmp(a, "--device") == 0) device = v;
        else if (strcmp(a, "--warmup-segments") == 0) warmup = atoi(v);
        else if (strcmp(a, "--out") == 0) out_path = v;
        else if (strcmp(a, "--compare-to") == 0) ref_path = v;
        else if (strcmp(a, "--settings") == 0) backend_settings = v;
        else if (strcmp(a, "--gemm-tflops") == 0) gemm = atof(v);
        else if (strcmp(a, "--memory-run") == 0) mem_total = strtoull(v, NULL, 10);
        else if (strcmp(a, "--memory-at") == 0) mem_at = strtoull(v, NULL, 10);
        else if (strcmp(a, "--memory-seconds") == 0) mem_seconds = atof(v);
        else usage();
        i++;
    }
    if (make_model_path) {
        make_model(make_model_path, preset, seed, causal, memory, segment, branches, heads);
        return 0;
    }
    if (make_tokens_path) {
        if (!count || !vocab) usage();
        make_tokens(make_tokens_path, count, vocab, seed);
        return 0;
    }
    if (!model_path || (!tokens_path && !mem_total)) usage();
    sf_model *m;
    if (sf_model_load(model_path, &m) != SF_OK) die(model_path);
    if (tokens_path && streams > 0) {
        if (out_path) usage();
        run_streams(m, device, tokens_path, streams, warmup, gemm);
    } else if (tokens_path) {
        run_tokens(m, device, tokens_path, warmup, out_path, ref_path, gemm);
    }
    if (mem_total) memory_run(m, device, mem_total, mem_at, mem_seconds);
    sf_model_free(m);
    return 0;
}
