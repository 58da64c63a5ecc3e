/* Precision fp8 over a long stream: a small model (D = 64, 2 heads of 32, 2 layers, MLP 128,
 * delta memory, 16 global tokens, segments of 64) runs the same random tokens on the CPU in
 * float32 and on the GPU in fp8, segment by segment, for SEGMENTS segments (argument 1, default
 * 2000). The memory M of every layer (read from sf_graph_save) is compared with the CPU's at
 * segment 100 and at the end, and so are those segments' hidden rows:
 *  - each relative error (L2) within TOL_FP8_STATE (memory) and TOL_FP8 (rows);
 *  - the memory's error at the end at most DRIFT times its error at segment 100 plus
 *    DRIFT_SLACK: FP8 rounding enters every segment's update, and an error that compounded
 *    would grow with the stream instead of staying level.
 * Without a GPU this prints "skipped: no GPU" and exits 77; without FP8 (compute capability
 * below 8.9) "skipped: no FP8 on this GPU". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"
#include "support/small_model.h"

#define TOL_FP8 0.15       /* hidden rows, as test_gpu_pipeline */
#define TOL_FP8_STATE 0.15 /* the memory M of every layer */
#define DRIFT 2.0
#define DRIFT_SLACK 0.01
#define EARLY_SEGMENT 100

static sf_graph *new_graph(const sf_model *m, const char *device, sf_precision precision)
{
    /* one CPU thread: the model is small, and the test may run beside others */
    sf_graph_options opts = {.device = device, .precision = precision, .threads = 1};
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, &opts, &g);
    if (rc == SF_OK) rc = sf_graph_parse(g, "segment ! embed ! block ! norm");
    CHECKF(rc == SF_OK, "graph on %s: %s", device, sf_last_error());
    if (rc != SF_OK) {
        sf_graph_free(g);
        return NULL;
    }
    return g;
}

/* Pulls every packet; rows of positions [from, from + N) into rows ([N, D]). */
static void collect(sf_graph *g, size_t from, size_t N, size_t D, float *rows)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->n == 0 || (p->flags & SF_PACKET_PROVISIONAL)) continue;
        if (p->position >= from && p->position + p->n <= from + N)
            memcpy(rows + (p->position - from) * D, p->x, p->n * D * sizeof(float));
    }
}

/* The memory M of every layer of the graph's one stream ([layers][H][d][d] float32) from its
 * save (pipeline/graph.c: per stateful stage u32 index, u32 name length, name, u64 length,
 * state; the block's state: u32 streams, first layer, layers, then per stream u64 id and M
 * first). NULL on a layout it does not find (reported). */
static float *saved_memory(sf_graph *g, size_t floats)
{
    sf_buffer blob = {0};
    int rc = sf_graph_save(g, &blob);
    CHECKF(rc == SF_OK, "save: %s", sf_last_error());
    float *M = NULL;
    const unsigned char *p = blob.data, *end = blob.data + blob.len;
    while (rc == SF_OK && p + 8 <= end && !M) {
        uint32_t name_len;
        uint64_t len;
        memcpy(&name_len, p + 4, 4);
        if (p + 8 + name_len + 8 > end) break;
        const int is_block = name_len == 5 && memcmp(p + 8, "block", 5) == 0;
        memcpy(&len, p + 8 + name_len, 8);
        const unsigned char *state = p + 16 + name_len;
        if (state + len > end) break;
        uint32_t streams;
        if (is_block && len >= 12 + 8 + floats * sizeof(float) && (memcpy(&streams, state, 4), streams == 1)) {
            M = malloc(floats * sizeof *M);
            memcpy(M, state + 12 + 8, floats * sizeof *M);
        }
        p = state + len;
    }
    CHECKF(M != NULL, "the save (%zu bytes) holds no block state of one stream", blob.len);
    sf_buffer_release(&blob);
    return M;
}

int main(int argc, char **argv)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    const int segments = argc > 1 ? atoi(argv[1]) : 2000;
    if (segments <= EARLY_SEGMENT) {
        fprintf(stderr, "usage: %s [SEGMENTS > %d]\n", argv[0], EARLY_SEGMENT);
        return 2;
    }
    sf_backend *probe = NULL;
    if (sf_backend_create_ex("cuda", 0, SF_PRECISION_FP8, &probe) != SF_OK) {
        printf("  %s\n", sf_last_error());
        return check_skip("no FP8 on this GPU");
    }
    sf_backend_free(probe);

    const check_model_variant v = {"fp8 stream", "16:1,32:2,64:4", 64, 2, 32, 2, 1, 128, 16, 4, 1, 64, SF_MEMORY_DELTA};
    sf_model *m = NULL;
    CHECK_OK(check_variant_model(&v, 77, &m));
    if (!m) return check_finish("test_gpu_fp8_stream");
    const size_t N = (size_t)v.segment, D = (size_t)v.dim;
    const size_t m_floats = (size_t)v.layers * v.heads * v.head_dim * v.head_dim;
    sf_graph *cpu = new_graph(m, "cpu", SF_PRECISION_F32), *gpu = new_graph(m, "cuda", SF_PRECISION_FP8);
    float *want = malloc(N * D * sizeof *want), *got = malloc(N * D * sizeof *got);
    uint32_t *tokens = malloc(N * sizeof *tokens);
    check_rng r = {4242};
    double state_err[2] = {-1, -1}, rows_err[2] = {-1, -1}, rows_worst = 0;
    for (int s = 0; cpu && gpu && s < segments; s++) {
        for (size_t i = 0; i < N; i++) tokens[i] = (uint32_t)(check_rng_next(&r) % 50);
        for (size_t i = 0; i < N * D; i++) want[i] = got[i] = NAN;
        CHECK_OK(sf_graph_push(cpu, 0, tokens, N));
        CHECK_OK(sf_graph_push(gpu, 0, tokens, N));
        collect(cpu, (size_t)s * N, N, D, want);
        collect(gpu, (size_t)s * N, N, D, got);
        const double e = check_rel_err_f32(got, want, N * D);
        if (!(e <= rows_worst)) rows_worst = e;
        const int at = s + 1 == EARLY_SEGMENT ? 0 : s + 1 == segments ? 1 : -1;
        if (at < 0) continue;
        rows_err[at] = e;
        float *Mc = saved_memory(cpu, m_floats), *Mg = saved_memory(gpu, m_floats);
        if (Mc && Mg) state_err[at] = check_rel_err_f32(Mg, Mc, m_floats);
        free(Mc), free(Mg);
        printf("  segment %5d: memory rel err %.4f, hidden rows rel err %.4f (worst so far %.4f)\n", s + 1,
               state_err[at], rows_err[at], rows_worst);
    }
    for (int i = 0; i < 2; i++) {
        CHECKF(state_err[i] >= 0 && state_err[i] <= TOL_FP8_STATE, "memory rel err %.4g at %s", state_err[i],
               i ? "the end" : "segment 100");
        CHECKF(rows_err[i] >= 0 && rows_err[i] <= TOL_FP8, "rows rel err %.4g at %s", rows_err[i],
               i ? "the end" : "segment 100");
    }
    CHECKF(state_err[1] <= DRIFT * state_err[0] + DRIFT_SLACK,
           "the memory's error grew from %.4g (segment %d) to %.4g (segment %d)", state_err[0], EARLY_SEGMENT,
           state_err[1], segments);
    printf("RESULT fp8_stream segments=%d memory_err_100=%.5f memory_err_end=%.5f rows_err_100=%.5f rows_err_end=%.5f "
           "rows_err_worst=%.5f\n",
           segments, state_err[0], state_err[1], rows_err[0], rows_err[1], rows_worst);
    if (cpu) CHECK_OK(sf_graph_end(cpu, 0));
    if (gpu) CHECK_OK(sf_graph_end(gpu, 0));
    sf_graph_free(cpu), sf_graph_free(gpu);
    free(want), free(got), free(tokens);
    sf_model_free(m);
    return check_finish("test_gpu_fp8_stream");
}
