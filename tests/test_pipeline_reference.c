/* The CPU pipeline against the float64 reference of SPEC (tests/support/reference.c) on small
 * random models: branch sets (one leaving heads uncovered), causal and not, every memory kind,
 * global tokens on and off, several layers with and without MLP, streams ending in a partial
 * segment, the causal prefix property, several streams, split layers and save/restore. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/reference.h"

#define TOLERANCE 1e-4

typedef struct collected {
    float *x;          /* [tokens, D] committed rows by position */
    size_t tokens;
    float *provisional; /* last provisional packet's rows, by position */
    size_t prov_pos, prov_n;
} collected;

static void collect(sf_graph *g, collected *c, size_t n_streams, int dim)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->stream >= n_streams || p->n == 0) continue;
        collected *s = &c[p->stream];
        if (p->flags & SF_PACKET_PROVISIONAL) {
            free(s->provisional);
            s->provisional = malloc(p->n * (size_t)dim * sizeof(float) + 1);
            memcpy(s->provisional, p->x, p->n * (size_t)dim * sizeof(float));
            s->prov_pos = p->position, s->prov_n = p->n;
            continue;
        }
        if (p->position + p->n <= s->tokens)
            memcpy(s->x + p->position * (size_t)dim, p->x, p->n * (size_t)dim * sizeof(float));
    }
}

static uint32_t *random_tokens(size_t n, int vocab, uint64_t seed)
{
    check_rng r = {seed};
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(check_rng_next(&r) % (uint64_t)vocab);
    return t;
}

/* Whole stream in uneven chunks through `pipeline`, compared with ref_stream. */
static void check_stream(const char *name, const sf_model *m, const char *pipeline, size_t n_tokens, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    uint32_t *tokens = random_tokens(n_tokens, c->vocab, seed);
    double *want = malloc(n_tokens * (size_t)c->dim * sizeof *want);
    CHECK_OK(ref_stream(m, tokens, n_tokens, want));
    collected got = {calloc(n_tokens * (size_t)c->dim + 1, sizeof(float)), n_tokens, NULL, 0, 0};
    for (size_t i = 0; i < n_tokens * (size_t)c->dim; i++) got.x[i] = NAN;
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, pipeline));
    for (size_t at = 0, step = 7; at < n_tokens; at += step, step = step * 3 % 41 + 1) {
        size_t take = n_tokens - at < step ? n_tokens - at : step;
        CHECK_OK(sf_graph_push(g, 0, tokens + at, take));
        collect(g, &got, 1, c->dim);
    }
    CHECK_OK(sf_graph_end(g, 0));
    collect(g, &got, 1, c->dim);
    double err = check_rel_err_f32_f64(got.x, want, n_tokens * (size_t)c->dim);
    CHECKF(err <= TOLERANCE, "%s: relative error %.3g", name, err);
    printf("  %-44s rel err %.2e\n", name, err);
    sf_graph_free(g);
    free(got.x);
    free(want);
    free(tokens);
}

/* A flushed prefix yields the same outputs as the completed segment, and the flush commits
 * nothing: the rest of the stream still matches the reference. */
static void check_flush(const char *name, const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment, n_tokens = 3 * N, D = (size_t)c->dim;
    uint32_t *tokens = random_tokens(n_tokens, c->vocab, 99);
    double *want = malloc(n_tokens * D * sizeof *want);
    CHECK_OK(ref_stream(m, tokens, n_tokens, want));
    collected got = {calloc(n_tokens * D, sizeof(float)), n_tokens, NULL, 0, 0};
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
    size_t prefix = N + N / 2 + 1;
    CHECK_OK(sf_graph_push(g, 0, tokens, prefix));
    CHECK_OK(sf_graph_flush(g, 0));
    collect(g, &got, 1, c->dim);
    CHECKF(got.provisional && got.prov_pos == N && got.prov_n == prefix - N, "%s: flush emitted %zu rows at %zu", name,
           got.prov_n, got.prov_pos);
    CHECK_OK(sf_graph_flush(g, 0)); /* twice: still nothing committed */
    CHECK_OK(sf_graph_push(g, 0, tokens + prefix, n_tokens - prefix));
    CHECK_OK(sf_graph_end(g, 0));
    float *provisional = got.provisional;
    got.provisional = NULL;
    collect(g, &got, 1, c->dim);
    double err = check_rel_err_f32_f64(got.x, want, n_tokens * D);
    CHECKF(err <= TOLERANCE, "%s: stream after flushes: relative error %.3g", name, err);
    if (provisional && c->causal) {
        double perr = check_rel_err_f32(provisional, got.x + N * D, (prefix - N) * D);
        CHECKF(perr <= 1e-5, "%s: flushed prefix differs from the completed segment: %.3g", name, perr);
        printf("  %-44s prefix rel err %.2e\n", name, perr);
    }
    if (provisional && !c->causal) {
        /* non-causal: the prefix is the segment as if only those positions existed */
        ref_state *rs = ref_state_new(m);
        double *out = malloc(N * D * sizeof *out);
        CHECK_OK(ref_segment(m, rs, tokens, (int)N, 1, out));
        CHECK_OK(ref_segment(m, rs, tokens + N, (int)(prefix - N), 0, out));
        double perr = check_rel_err_f32_f64(provisional, out, (prefix - N) * D);
        CHECKF(perr <= TOLERANCE, "%s: non-causal flushed prefix: %.3g", name, perr);
        free(out);
        ref_state_free(rs);
    }
    free(provisional);
    sf_graph_free(g);
    free(got.x);
    free(got.provisional);
    free(want);
    free(tokens);
}

/* Two streams interleaved never share state. */
static void check_streams(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t n_tokens = 2 * (size_t)c->segment + 5, D = (size_t)c->dim;
    uint32_t *a = random_tokens(n_tokens, c->vocab, 5), *b = random_tokens(n_tokens, c->vocab, 6);
    double *want_a = malloc(n_tokens * D * sizeof(double)), *want_b = malloc(n_tokens * D * sizeof(double));
    CHECK_OK(ref_stream(m, a, n_tokens, want_a));
    CHECK_OK(ref_stream(m, b, n_tokens, want_b));
    collected got[2] = {{calloc(n_tokens * D, 4), n_tokens, NULL, 0, 0}, {calloc(n_tokens * D, 4), n_tokens, NULL, 0, 0}};
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
    for (size_t at = 0; at < n_tokens; at += 9) {
        size_t take = n_tokens - at < 9 ? n_tokens - at : 9;
        CHECK_OK(sf_graph_push(g, 1, b + at, take));
        CHECK_OK(sf_graph_push(g, 0, a + at, take));
        collect(g, got, 2, c->dim);
    }
    CHECK_OK(sf_graph_end(g, 0));
    CHECK_OK(sf_graph_end(g, 1));
    collect(g, got, 2, c->dim);
    double ea = check_rel_err_f32_f64(got[0].x, want_a, n_tokens * D);
    double eb = check_rel_err_f32_f64(got[1].x, want_b, n_tokens * D);
    CHECKF(ea <= TOLERANCE && eb <= TOLERANCE, "two streams: %.3g %.3g", ea, eb);
    sf_graph_free(g);
    free(got[0].x), free(got[1].x), free(want_a), free(want_b), free(a), free(b);
}

/* Saving the state mid-stream and restoring it into a fresh graph continues exactly. */
static void check_save_restore(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t n_tokens = 3 * (size_t)c->segment + 11, cut = (size_t)c->segment + 17, D = (size_t)c->dim;
    uint32_t *t = random_tokens(n_tokens, c->vocab, 77);
    double *want = malloc(n_tokens * D * sizeof(double));
    CHECK_OK(ref_stream(m, t, n_tokens, want));
    collected got = {calloc(n_tokens * D, 4), n_tokens, NULL, 0, 0};
    sf_graph *g1, *g2;
    CHECK_OK(sf_graph_create(m, NULL, &g1));
    CHECK_OK(sf_graph_parse(g1, "segment ! embed ! block ! norm"));
    CHECK_OK(sf_graph_push(g1, 0, t, cut));
    collect(g1, &got, 1, c->dim);
    sf_buffer state = {0};
    CHECK_OK(sf_graph_save(g1, &state));
    sf_graph_free(g1);
    CHECK_OK(sf_graph_create(m, NULL, &g2));
    CHECK_OK(sf_graph_parse(g2, "segment ! embed ! block ! norm"));
    CHECK_OK(sf_graph_restore(g2, state.data, state.len));
    CHECK(sf_graph_restore(g2, state.data, state.len - 1) == SF_E_STATE);
    CHECK_OK(sf_graph_restore(g2, state.data, state.len));
    CHECK_OK(sf_graph_push(g2, 0, t + cut, n_tokens - cut));
    CHECK_OK(sf_graph_end(g2, 0));
    collect(g2, &got, 1, c->dim);
    double err = check_rel_err_f32_f64(got.x, want, n_tokens * D);
    CHECKF(err <= TOLERANCE, "save/restore: relative error %.3g", err);
    sf_buffer_release(&state);
    sf_graph_free(g2);
    free(got.x), free(want), free(t);
}

typedef struct variant {
    const char *name, *branches;
    int dim, heads, head_dim, layers, causal, mlp, global, summary, final_norm;
    sf_memory_kind memory;
} variant;

int main(void)
{
    static const variant variants[] = {
        {"3 branches causal delta", "8:1,16:2,32:4", 24, 3, 8, 1, 1, 0, 0, 0, 1, SF_MEMORY_DELTA},
        {"3 branches non-causal delta", "8:1,16:2,32:4", 24, 3, 8, 1, 0, 0, 0, 0, 1, SF_MEMORY_DELTA},
        {"linear memory, globals, 2 layers, MLP", "8:1,32:2", 24, 3, 8, 2, 1, 40, 6, 2, 1, SF_MEMORY_LINEAR},
        {"no memory, globals 4/4, MLP", "16:1,32:4", 16, 2, 8, 2, 1, 24, 4, 4, 0, SF_MEMORY_NONE},
        {"uncovered heads (16:2 over 3 heads)", "16:2", 24, 3, 8, 1, 1, 0, 0, 0, 1, SF_MEMORY_DELTA},
        {"uncovered heads with globals, non-causal", "32:4", 24, 3, 8, 2, 0, 32, 5, 3, 1, SF_MEMORY_DELTA},
        {"H*d != D, delta, globals, 3 layers", "8:1,16:2,32:4", 20, 2, 12, 3, 1, 28, 8, 4, 1, SF_MEMORY_DELTA},
        {"one full window, linear", "32:1", 16, 2, 8, 1, 1, 16, 3, 1, 0, SF_MEMORY_LINEAR},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const variant *v = &variants[i];
        sf_model_config cfg;
        sf_model_config_default(&cfg);
        cfg.dim = v->dim, cfg.heads = v->heads, cfg.head_dim = v->head_dim, cfg.layers = v->layers;
        cfg.vocab = 50, cfg.segment = 32, cfg.causal = v->causal, cfg.memory = v->memory;
        cfg.mlp_hidden = v->mlp, cfg.global_tokens = v->global, cfg.summary_tokens = v->summary;
        cfg.final_norm = v->final_norm;
        CHECK_OK(sf_branches_parse(v->branches, &cfg));
        sf_model *m;
        CHECK_OK(sf_model_create_random(&cfg, 1000 + i, &m));
        if (!m) continue;
        check_stream(v->name, m, "segment ! embed ! block ! norm", 3 * 32 + 19, i);
        check_flush(v->name, m);
        if (v->layers > 1) check_stream("  same, one stage per layer", m,
                                        v->layers == 2 ? "segment ! embed ! block layers=0 ! block layers=1 ! norm"
                                                       : "segment ! embed ! block layers=0 ! block layers=1-2 ! norm",
                                        2 * 32 + 3, i);
        if (i == 2 || i == 6) {
            check_streams(m);
            check_save_restore(m);
        }
        sf_model_free(m);
    }
    return check_finish("test_pipeline_reference");
}
