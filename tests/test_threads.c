/* The bytes out do not depend on the thread count: models with and without MLP, several
 * interleaved streams with full and odd-length partial segments (so the products see row
 * counts that no thread count divides evenly), block batch=1 and batch=3, each run with 1, 2,
 * 3 and 8 compute threads, must give identical floats. Work is split by rows, never by a
 * reduction dimension, and the row blocks of a product must not depend on the thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/small_model.h"

enum { STREAMS = 3, ROUNDS = 4, SEGMENT = 256 };

/* Every value that left the graph, in order, with each packet's stream, position and rows. */
typedef struct outputs {
    float *values;
    size_t used, cap;
    uint64_t *meta;
    size_t meta_used, meta_cap;
} outputs;

static void append(outputs *o, const sf_packet *p)
{
    size_t floats = p->n * p->width;
    if (o->used + floats > o->cap) {
        o->cap = 2 * (o->used + floats) + 4096;
        o->values = realloc(o->values, o->cap * sizeof(float));
    }
    if (floats) memcpy(o->values + o->used, p->x, floats * sizeof(float));
    o->used += floats;
    if (o->meta_used + 3 > o->meta_cap) {
        o->meta_cap = 2 * (o->meta_used + 3) + 64;
        o->meta = realloc(o->meta, o->meta_cap * sizeof(uint64_t));
    }
    o->meta[o->meta_used++] = p->stream;
    o->meta[o->meta_used++] = p->position;
    o->meta[o->meta_used++] = p->n;
}

static void drain(sf_graph *g, outputs *o)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) append(o, p);
}

static uint32_t token(uint64_t stream, int round, int i) { return (uint32_t)((stream * 89 + round * 37 + i * 11 + i * i) % 200); }

/* Streams interleaved: full segments, a segment and a half, and odd-length tails (207, 101
 * tokens) that end partial segments; every stream ends after the last round. */
static void run(const sf_model *m, const char *pipeline, int threads, outputs *o)
{
    sf_graph *g = NULL;
    sf_graph_options opts = {.threads = threads};
    CHECK_OK(sf_graph_create(m, &opts, &g));
    if (g) CHECK_OK(sf_graph_parse(g, pipeline));
    static uint32_t tokens[2 * SEGMENT];
    for (int r = 0; g && r < ROUNDS; r++)
        for (uint64_t s = 0; s < STREAMS; s++) {
            int n = (s + r) % 3 == 0 ? SEGMENT : (s + r) % 3 == 1 ? SEGMENT + SEGMENT / 2 : 101;
            if (r == ROUNDS - 1 && s == 0) n = 207;
            for (int i = 0; i < n; i++) tokens[i] = token(s, r, i);
            CHECK_OK(sf_graph_push(g, s, tokens, (size_t)n));
            if (r == ROUNDS - 1) CHECK_OK(sf_graph_end(g, s));
            drain(g, o);
        }
    sf_graph_free(g);
}

static void check_model(int mlp)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 2, SEGMENT, 8);
    CHECK_OK(sf_branches_parse("64:1,128:2,256:4", &cfg));
    cfg.dim = 64;
    cfg.heads = 4;
    cfg.head_dim = 16;
    cfg.mlp_hidden = mlp;
    cfg.vocab = 200;
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, 11, &m));
    if (!m) return;
    static const int thread_counts[] = {1, 2, 3, 8};
    for (int batch = 1; batch <= 3; batch += 2) {
        char pipeline[128];
        snprintf(pipeline, sizeof pipeline, "segment ! embed ! block batch=%d ! norm", batch);
        outputs want = {0};
        run(m, pipeline, 1, &want);
        CHECK(want.used > (size_t)STREAMS * ROUNDS * SEGMENT * 64 / 2);
        for (size_t t = 1; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
            outputs got = {0};
            run(m, pipeline, thread_counts[t], &got);
            int same = got.used == want.used && got.meta_used == want.meta_used &&
                       memcmp(got.meta, want.meta, want.meta_used * sizeof(uint64_t)) == 0 &&
                       memcmp(got.values, want.values, want.used * sizeof(float)) == 0;
            size_t first = 0;
            while (same == 0 && first < want.used && first < got.used && got.values[first] == want.values[first]) first++;
            CHECKF(same, "mlp=%d batch=%d: %d threads differ from 1 thread (first at value %zu of %zu)", mlp, batch,
                   thread_counts[t], first, want.used);
            free(got.values);
            free(got.meta);
        }
        free(want.values);
        free(want.meta);
    }
    sf_model_free(m);
}

int main(void)
{
    check_model(128);
    check_model(0);
    return check_finish("test_threads");
}
