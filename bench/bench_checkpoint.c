/* Checkpoint benchmark: write and restore time of one stream's complete state for the issue-3
 * reference model (D=1024, H=16, d=64, 4 layers, 256 global tokens; M, z, gk, gv per layer),
 * with each codec. The state is real: a push-mode graph of that configuration (random weights,
 * segment 256, 128 summary tokens so the global FIFO is full, no MLP since it holds no state)
 * runs two segments of pseudo-random text first.
 *
 * write   = frame encode + write + fsync + rename + directory fsync (sf_checkpoint_write)
 * load    = read + frame checks + decode of the newest checkpoint (sf_checkpoint_load_newest);
 *           the file was just written, so this reads from the page cache, not a cold disk
 * restore = sf_graph_restore of the loaded state into a second, started graph
 * Median of `reps` repetitions (default 7).
 *
 *   bench_checkpoint [DIR [reps]]    (DIR default /tmp/seqflow-bench-checkpoint)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "state/checkpoint.h"
#include "seqflow/seqflow.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_checkpoint: %s: %s\n", what, sf_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp/seqflow-bench-checkpoint";
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (reps < 1 || reps > 1000) reps = 7;

    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.dim = 1024;
    cfg.heads = 16;
    cfg.head_dim = 64;
    cfg.layers = 4;
    cfg.vocab = 256;
    cfg.segment = 256;
    cfg.global_tokens = 256;
    cfg.summary_tokens = 128;
    cfg.mlp_hidden = 0;
    if (sf_branches_parse("64:1,128:2,256:4", &cfg) != SF_OK) return fail("branches");
    sf_model *model;
    if (sf_model_create_random(&cfg, 7, &model) != SF_OK) return fail("model");

    const size_t tokens = 2 * (size_t)cfg.segment;
    uint32_t *t = malloc(tokens * sizeof *t);
    uint64_t s = 99;
    for (size_t i = 0; i < tokens; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (uint32_t)(s >> 33) % 96 + 32;
    }
    sf_graph *g, *g2;
    sf_buffer state = {0};
    double t0 = now();
    if (sf_graph_create(model, NULL, &g) != SF_OK || sf_graph_parse(g, "segment ! embed ! block") != SF_OK ||
        sf_graph_push(g, 0, t, tokens) != SF_OK)
        return fail("short run");
    for (sf_packet *p; (p = sf_graph_pull(g));) sf_packet_free(p);
    if (sf_graph_save(g, &state) != SF_OK) return fail("save");
    double run_s = now() - t0;
    if (sf_graph_create(model, NULL, &g2) != SF_OK || sf_graph_parse(g2, "segment ! embed ! block") != SF_OK ||
        sf_graph_restore(g2, state.data, state.len) != SF_OK) /* starts g2: weights uploaded once */
        return fail("second graph");

    size_t per_stream = ((size_t)cfg.layers * cfg.heads * cfg.head_dim * (cfg.head_dim + 1) +
                         2 * (size_t)cfg.layers * cfg.global_tokens * cfg.heads * cfg.head_dim) * sizeof(float);
    printf("bench_checkpoint: D=%d H=%d d=%d L=%d G=%d, one stream after %zu tokens (%.1f s)\n", cfg.dim, cfg.heads,
           cfg.head_dim, cfg.layers, cfg.global_tokens, tokens, run_s);
    printf("state: %zu bytes (M+z+gk+gv from the config: %zu bytes), median of %d, dir %s\n", state.len, per_stream,
           reps, dir);
    printf("%-5s %12s %7s %10s %10s %10s %10s\n", "codec", "file bytes", "ratio", "write ms", "load ms", "restore ms",
           "write GB/s");
    if (sf_checkpoint_dir_prepare(dir) != SF_OK || sf_checkpoint_clear(dir) != SF_OK) return fail(dir);
    double *w = malloc((size_t)reps * sizeof *w), *l = malloc((size_t)reps * sizeof *l),
           *r = malloc((size_t)reps * sizeof *r);
    uint64_t seq = 0;
    for (int codec = SF_CODEC_RAW; codec <= SF_CODEC_ZSTD; codec++) {
        size_t file_bytes = 0;
        for (int i = 0; i < reps; i++) {
            double a = now();
            if (sf_checkpoint_write(dir, ++seq, state.data, state.len, (sf_codec)codec, 2) != SF_OK) return fail("write");
            double b = now();
            uint64_t got_seq;
            uint8_t *payload;
            size_t len;
            if (sf_checkpoint_load_newest(dir, (size_t)1 << 32, NULL, NULL, &got_seq, &payload, &len) != SF_OK ||
                got_seq != seq || len != state.len || memcmp(payload, state.data, len) != 0)
                return fail("load");
            double c = now();
            if (sf_graph_restore(g2, payload, len) != SF_OK) return fail("restore");
            double d = now();
            free(payload);
            w[i] = b - a, l[i] = c - b, r[i] = d - c;
            char path[4096];
            FILE *f = sf_checkpoint_path(dir, seq, path, sizeof path) == SF_OK ? fopen(path, "rb") : NULL;
            if (f) {
                fseek(f, 0, SEEK_END);
                file_bytes = (size_t)ftell(f);
                fclose(f);
            }
        }
        double wm = median(w, reps), lm = median(l, reps), rm = median(r, reps);
        printf("%-5s %12zu %7.2f %10.2f %10.2f %10.2f %10.2f\n", sf_codec_name((sf_codec)codec), file_bytes,
               (double)state.len / (double)file_bytes, 1e3 * wm, 1e3 * lm, 1e3 * rm, (double)state.len / wm / 1e9);
    }
    sf_checkpoint_clear(dir);
    rmdir(dir);
    free(w);
    free(l);
    free(r);
    free(t);
    sf_buffer_release(&state);
    sf_graph_free(g);
    sf_graph_free(g2);
    sf_model_free(model);
    return 0;
}
