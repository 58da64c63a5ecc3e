/* The whole pipeline on the GPU against the same pipeline on the CPU, on small random models
 * covering what test_pipeline_reference.c covers: branch sets (one leaving heads uncovered),
 * causal and not, memory none/linear/delta, global tokens, several layers with and without
 * MLP, head widths the bf16 attention kernel has (32, 64) and ones it has not (8, 12: they
 * run the f32 kernel), partial segments, a provisional flush, two interleaved streams, three
 * streams batched through one set of products (block batch=3) and one stage per layer; and
 * threaded runs of many segments (a source reading ahead of the block), with one block stage
 * and with one a layer. Precision f32 must agree to 1e-4 (relative, L2), bf16 to 2e-2, fp8 (where
 * the GPU has FP8) to 0.15.
 * Where the backend passes bf16 q/k/v (an H100, d = 64), bf16 runs a second time with float32
 * ones (backend setting qkv=f32), the path of other GPUs.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/shard_runs.h"
#include "support/gpu.h"
#include "support/small_model.h"
#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#endif

#define TOL_F32 1e-4
#define TOL_BF16 2e-2
/* precision fp8 (projections and MLP in e4m3, per-channel and per-row scales; attention and
 * memory bf16/float32): each such product is off by about 4% of its output's norm, which the
 * residual stream and the final norm dilute; docs/CUDA.md records what runs measured */
#define TOL_FP8 0.15

/* Whether the CUDA backend runs precision fp8 here (compute capability 8.9 and up, cuBLASLt
 * offering FP8 products). */
static int cuda_has_fp8(void)
{
    static int known = -1;
    if (known < 0) {
        sf_backend *be = NULL;
        known = sf_backend_create_ex("cuda", 0, SF_PRECISION_FP8, &be) == SF_OK;
        if (!known) sf_clear_error();
        sf_backend_free(be);
    }
    return known;
}

/* Whether the CUDA backend in bf16 passes q, k, v of this head width as bf16 (sf_be_qkv_type). */
static int cuda_passes_bf16_qkv(int head_dim)
{
    sf_backend *be = NULL;
    if (sf_backend_create_ex("cuda", 0, SF_PRECISION_BF16, &be) != SF_OK) return 0;
    const int yes = sf_be_qkv_type(be, head_dim) == SF_DTYPE_BF16;
    sf_backend_free(be);
    return yes;
}

/* The scenario on the CPU in float32 against the GPU in each precision (tests/support/shard_runs:
 * the chunking is fixed, so every device sees the same packets). */
static void compare(const char *name, const sf_model *m, const shard_scenario *sc, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim;
    uint32_t **tokens = shard_tokens(m, sc, seed);
    const shard_device cpu = {"cpu", SF_PRECISION_F32, NULL};
    shard_outputs want;
    if (shard_run(m, &cpu, sc, "", tokens, &want, 0, NULL) == SF_OK) {
        /* bf16 also with float32 q/k/v (setting qkv=f32): an H100 passes bf16 ones between the
         * ops of d = 64 and d = 128 layers, other GPUs float32 ones */
        static const struct {
            sf_precision p;
            const char *label;
            double tol;
            const char *settings;
        } modes[] = {{SF_PRECISION_F32, "f32", TOL_F32, NULL},
                     {SF_PRECISION_BF16, "bf16", TOL_BF16, NULL},
                     {SF_PRECISION_BF16, "bf16 f32 q/k/v", TOL_BF16, "qkv=f32"},
                     {SF_PRECISION_FP8, "fp8", TOL_FP8, NULL}};
        const int bf16_qkv = cuda_passes_bf16_qkv(c->head_dim), fp8 = cuda_has_fp8();
        for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
            if (modes[mi].settings && !bf16_qkv) continue; /* the same run as plain bf16 */
            if (modes[mi].p == SF_PRECISION_FP8 && !fp8) continue;
            const shard_device gpu = {"cuda", modes[mi].p, modes[mi].settings};
            shard_outputs got;
            const int ran = shard_run(m, &gpu, sc, "", tokens, &got, 0, NULL);
            if (ran != SF_OK) {
                shard_outputs_free(&got);
                continue;
            }
            double worst = 0;
            for (int s = 0; s < sc->streams; s++) {
                double err = check_rel_err_f32(got.x[s], want.x[s], sc->tokens * D);
                CHECKF(err <= modes[mi].tol, "%s [%s] stream %d: relative error %.3g", name, modes[mi].label, s, err);
                if (!(err <= worst)) worst = err;
            }
            if (sc->flush_at) {
                int same = got.provisional && want.provisional && got.prov_pos == want.prov_pos &&
                           got.prov_n == want.prov_n;
                CHECKF(same, "%s [%s]: the flush emitted different rows than on the CPU", name, modes[mi].label);
                if (same) {
                    double err = check_rel_err_f32(got.provisional, want.provisional, got.prov_n * D);
                    CHECKF(err <= modes[mi].tol, "%s [%s] flushed rows: relative error %.3g", name, modes[mi].label,
                           err);
                    if (!(err <= worst)) worst = err;
                }
            }
            printf("  %-48s %-14s rel err %.2e\n", name, modes[mi].label, worst);
            shard_outputs_free(&got);
        }
    }
    shard_outputs_free(&want);
    shard_tokens_free(tokens);
}

/* A threaded run (sf_graph_run: a source reading a token file ahead of the block, so the block
 * finds the next segment waiting) with the block stages `blocks`, on `device` with the backend's
 * `settings` (NULL: defaults); the rows as float32 [tokens, D] in *out. The chain ends in a sink
 * writing raw float32 to a file. */
static int run_threaded(const sf_model *m, const char *device, sf_precision precision, const char *settings,
                        const char *blocks, const char *tokens_path, size_t tokens, float **out)
{
    const size_t D = (size_t)sf_model_get_config(m)->dim;
    const char *raw = check_tmp_path("threaded.f32");
    char pipeline[1024];
    snprintf(pipeline, sizeof pipeline,
             "source path=%s format=text chunk=97 ! segment ! embed ! %s ! norm ! sink out=%s", tokens_path, blocks,
             raw);
    sf_graph_options opts = {.device = device, .precision = precision, .backend_settings = settings};
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, &opts, &g);
    if (rc == SF_OK) rc = sf_graph_parse(g, pipeline);
    if (rc == SF_OK) rc = sf_graph_run(g);
    CHECKF(rc == SF_OK, "threaded %s on %s: %s", blocks, device, g ? sf_graph_error(g) : sf_last_error());
    sf_graph_free(g);
    *out = NULL;
    if (rc != SF_OK) return rc;
    *out = malloc(tokens * D * sizeof(float));
    FILE *f = fopen(raw, "rb");
    const size_t got = f ? fread(*out, sizeof(float), tokens * D, f) : 0;
    if (f) fclose(f);
    CHECKF(got == tokens * D, "threaded %s on %s: %zu values written, want %zu", blocks, device, got, tokens * D);
    return got == tokens * D ? SF_OK : SF_E_IO;
}

/* The threaded runs' input: 12 full segments and a partial one. */
static size_t threaded_tokens(const sf_model *m) { return 12 * (size_t)sf_model_get_config(m)->segment + 7; }

/* A text file of threaded_tokens(m) random token ids (seeded) under `name` in the test's temporary
 * folder, and the CPU's rows for it (run_threaded, float32) in *cpu. Returns the file's path, or
 * NULL when the CPU run failed (already reported). */
static const char *threaded_input(const sf_model *m, uint64_t seed, const char *name, float **cpu)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t tokens = threaded_tokens(m);
    const char *path = check_tmp_path(name);
    FILE *f = fopen(path, "w");
    check_rng r = {seed};
    for (size_t i = 0; i < tokens; i++)
        fprintf(f, "%llu%c", (unsigned long long)(check_rng_next(&r) % (uint64_t)c->vocab), i % 16 == 15 ? '\n' : ' ');
    fclose(f);
    return run_threaded(m, "cpu", SF_PRECISION_F32, NULL, "block", path, tokens, cpu) == SF_OK ? path : NULL;
}

/* Threaded runs of many segments (a partial last one included) on the GPU against the CPU, where
 * the source reads ahead of the block and the side queue's commits of one segment run beside the
 * next one's first layers: each layer must wait for the previous segment's commit of that layer,
 * or its memory and global tokens are stale and the rows differ. With two layers, also one block
 * stage a layer against one for both: the same kernels on the same inputs in the same order, so
 * the same rows. */
static void compare_threaded(const char *name, const sf_model *m, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim, tokens = threaded_tokens(m);
    float *cpu = NULL;
    const char *path = threaded_input(m, seed, "threaded.txt", &cpu);
    if (!path) return;
    static const struct {
        sf_precision p;
        const char *label;
        double tol;
    } modes[] = {{SF_PRECISION_F32, "f32", TOL_F32}, {SF_PRECISION_BF16, "bf16", TOL_BF16}};
    const char *split = c->layers == 2 ? "block layers=0 ! block layers=1" : NULL;
    /* cuBLAS's own choice of algorithm for every product: the Lt plans are timed per graph and
     * may differ between the runs, and with them the rounding */
    const char *settings = "gemm=gemmex";
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        float *one = NULL, *per_layer = NULL;
        if (run_threaded(m, "cuda", modes[mi].p, settings, "block", path, tokens, &one) == SF_OK) {
            const double cpu_err = check_rel_err_f32(one, cpu, tokens * D);
            CHECKF(cpu_err <= modes[mi].tol, "%s [%s] threaded against the CPU: relative error %.3g", name,
                   modes[mi].label, cpu_err);
            printf("  %-48s %-14s threaded vs CPU %.2e\n", name, modes[mi].label, cpu_err);
            if (split && run_threaded(m, "cuda", modes[mi].p, settings, split, path, tokens, &per_layer) == SF_OK) {
                const double err = check_rel_err_f32(per_layer, one, tokens * D);
                CHECKF(err <= 1e-6, "%s [%s] one stage a layer against one block stage: relative error %.3g", name,
                       modes[mi].label, err);
            }
        }
        free(one), free(per_layer);
    }
    free(cpu);
}

/* norm dtype=bf16 on the GPU (the rows written in bf16 on the device, half the download)
 * against the same graph's float32 rows: each bf16 value within a rounding (2^-8 relative) of
 * its float, and where the two runs' floats agree (the same products: setting gemm=gemmex) the
 * very float rounded to nearest even; every position of the stream is checked to have come. */
static void compare_bf16_out(const char *name, const sf_model *m, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim, tokens = 2 * (size_t)c->segment + 5;
    uint32_t *in = malloc(tokens * sizeof *in);
    check_rng rng = {seed * 2654435761u + 1};
    for (size_t i = 0; i < tokens; i++) in[i] = (uint32_t)(check_rng_next(&rng) % (uint64_t)c->vocab);
    float *f32 = malloc(tokens * D * sizeof *f32);
    uint16_t *b16 = malloc(tokens * D * sizeof *b16);
    size_t f32_rows = 0, b16_rows = 0, b16_flagged = 0;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        sf_graph_options opts = {.device = "cuda", .precision = SF_PRECISION_BF16, .backend_settings = "gemm=gemmex"};
        sf_graph *g = NULL;
        CHECK_OK(sf_graph_create(m, &opts, &g));
        if (!g) break;
        CHECK_OK(sf_graph_parse(g, bf16 ? "segment ! embed ! block ! norm dtype=bf16" : "segment ! embed ! block ! norm"));
        CHECK_OK(sf_graph_push(g, 0, in, tokens));
        CHECK_OK(sf_graph_end(g, 0));
        for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
            if (p->kind != SF_PACKET_HIDDEN || !p->n || p->position + p->n > tokens) continue;
            if (bf16) {
                b16_flagged += p->dtype == SF_DTYPE_BF16 && p->x_bf16 ? p->n : 0;
                memcpy(b16 + p->position * D, sf_packet_rows(p), p->n * D * sizeof *b16);
                b16_rows += p->n;
            } else {
                memcpy(f32 + p->position * D, p->x, p->n * D * sizeof *f32);
                f32_rows += p->n;
            }
        }
        sf_graph_free(g);
    }
    CHECKF(f32_rows == tokens && b16_rows == tokens && b16_flagged == tokens,
           "%s: %zu float32 rows, %zu bf16 rows (%zu flagged) of %zu", name, f32_rows, b16_rows, b16_flagged, tokens);
    size_t exact = 0, outside = 0;
    for (size_t i = 0; f32_rows == tokens && b16_rows == tokens && i < tokens * D; i++) {
        exact += b16[i] == check_bf16_bits(f32[i]);
        outside += !(fabsf(check_bf16_float(b16[i]) - f32[i]) <= ldexpf(fabsf(f32[i]), -8) + 1e-6f);
    }
    CHECKF(outside == 0, "%s: %zu of %zu bf16 outputs further than a rounding from the float32 run's", name, outside,
           tokens * D);
    CHECKF(exact * 100 >= 99 * tokens * D, "%s: only %zu of %zu bf16 outputs are the float32 run's rounded", name, exact,
           tokens * D);
    printf("  %-48s %-14s norm dtype=bf16: %zu of %zu values the float32 run's rounded, %zu beyond a rounding\n", name,
           "bf16 out", exact, tokens * D, outside);
    free(in), free(f32), free(b16);
}

#ifdef SEQFLOW_HAVE_CUDA
/* Device memory is fixed once a stream is running: 40 more segments add no byte. */
static void check_memory_flat(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment;
    uint32_t *tokens = malloc(N * sizeof *tokens);
    for (size_t i = 0; i < N; i++) tokens[i] = (uint32_t)(i * 7 % (size_t)c->vocab);
    sf_graph_options opts = {.device = "cuda"};
    sf_graph *g = NULL;
    CHECK_OK(sf_graph_create(m, &opts, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
    sf_cuda_memory early = {0}, late = {0};
    for (int seg = 0; seg < 42 && g; seg++) {
        CHECK_OK(sf_graph_push(g, 0, tokens, N));
        for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        }
        if (seg == 1) CHECK_OK(sf_cuda_backend_memory(sf_stage_backend(sf_graph_stage(g, 0)), &early));
    }
    if (g) CHECK_OK(sf_cuda_backend_memory(sf_stage_backend(sf_graph_stage(g, 0)), &late));
    CHECKF(early.peak > 0 && late.peak == early.peak && late.allocated == early.allocated,
           "device bytes after 2 segments: %zu (peak %zu); after 42: %zu (peak %zu)", early.allocated, early.peak,
           late.allocated, late.peak);
    printf("  device memory: %zu bytes after 2 segments, %zu after 42 (peak %zu)\n", early.allocated, late.allocated,
           late.peak);
    sf_graph_free(g);
    free(tokens);
}
#endif

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    static const check_model_variant variants[] = {
        {"3 branches causal delta", "8:1,16:2,32:4", 24, 3, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"3 branches non-causal delta", "8:1,16:2,32:4", 24, 3, 8, 1, 0, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"linear memory, globals, 2 layers, MLP", "8:1,32:2", 24, 3, 8, 2, 1, 40, 6, 2, 1, 32, SF_MEMORY_LINEAR},
        {"no memory, globals 4/4, MLP", "16:1,32:4", 16, 2, 8, 2, 1, 24, 4, 4, 0, 32, SF_MEMORY_NONE},
        {"uncovered heads (16:2 over 3 heads)", "16:2", 24, 3, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"uncovered heads with globals, non-causal", "32:4", 24, 3, 8, 2, 0, 32, 5, 3, 1, 32, SF_MEMORY_DELTA},
        {"H*d != D, delta, globals, 3 layers", "8:1,16:2,32:4", 20, 2, 12, 3, 1, 28, 8, 4, 1, 32, SF_MEMORY_DELTA},
        {"d=32 (bf16 kernel), delta, globals, MLP", "32:1,64:2,128:4", 96, 4, 32, 2, 1, 128, 8, 2, 1, 128,
         SF_MEMORY_DELTA},
        {"d=64 (bf16 kernel), linear, non-causal", "64:1,128:2", 128, 2, 64, 2, 0, 0, 4, 4, 1, 128, SF_MEMORY_LINEAR},
        /* on an H100, bf16 q/k/v between the ops: attention reads K/V in place, memory and
         * summary read bf16 */
        {"d=64, causal delta, globals, MLP", "64:1,128:2,256:4", 128, 2, 64, 2, 1, 256, 16, 4, 1, 256, SF_MEMORY_DELTA},
        /* the wgmma attention's d = 128 form on an H100, bf16 q/k/v read in place there too */
        {"d=128, causal delta, globals, MLP", "128:1,256:2,512:4", 256, 2, 128, 2, 1, 512, 16, 4, 1, 512,
         SF_MEMORY_DELTA},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        sf_model *m = NULL;
        CHECK_OK(check_variant_model(v, 1000 + i, &m));
        if (!m) continue;
        const size_t N = (size_t)v->segment;
        shard_scenario one = {"segment ! embed ! block ! norm", 1, 3 * N + 19, N + N / 2 + 1};
        compare(v->name, m, &one, i);
        if (v->layers > 1) {
            shard_scenario split = {v->layers == 2 ? "segment ! embed ! block layers=0 ! block layers=1 ! norm"
                                             : "segment ! embed ! block layers=0 ! block layers=1-2 ! norm",
                              1, 2 * N + 3, 0};
            compare("  same, one stage per layer", m, &split, i);
        }
#ifdef SEQFLOW_HAVE_CUDA
        if (i == 7) check_memory_flat(m);
#endif
        if (i == 2 || i == 7 || i == 9) compare_threaded(v->name, m, 300 + i);
        if (i == 2 || i == 3 || i == 9) compare_bf16_out(v->name, m, 500 + i);
        if (i == 2 || i == 7 || i == 9) {
            shard_scenario two = {"segment ! embed ! block ! norm", 2, 2 * N + 5, 0};
            compare("  two interleaved streams", m, &two, 100 + i);
            /* three streams' full segments through one batch of products (block batch=) */
            shard_scenario batched = {"segment ! embed ! block batch=3 ! norm", 3, 3 * N + 5, 0};
            compare("  three streams, block batch=3", m, &batched, 200 + i);
        }
        sf_model_free(m);
    }
    return check_finish("test_gpu_pipeline");
}
