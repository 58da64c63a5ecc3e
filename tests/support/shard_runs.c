#include "support/shard_runs.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/check.h"

static void collect(sf_graph *g, shard_outputs *o, size_t tokens, int dim)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->stream >= SHARD_MAX_STREAMS || p->n == 0) continue;
        const size_t bytes = p->n * (size_t)dim * sizeof(float);
        if (p->flags & SF_PACKET_PROVISIONAL) {
            if (p->stream != 0) continue;
            free(o->provisional);
            o->provisional = malloc(bytes);
            memcpy(o->provisional, p->x, bytes);
            o->prov_pos = p->position, o->prov_n = p->n;
            continue;
        }
        if (p->position + p->n <= tokens) memcpy(o->x[p->stream] + p->position * (size_t)dim, p->x, bytes);
    }
}

void shard_outputs_free(shard_outputs *o)
{
    for (int s = 0; s < SHARD_MAX_STREAMS; s++) free(o->x[s]);
    free(o->provisional);
    memset(o, 0, sizeof *o);
}

/* The pipeline with every "block" given `extra` options. */
static void with_options(const char *pipeline, const char *extra, char *out, size_t size)
{
    size_t used = 0;
    out[0] = 0;
    for (const char *p = pipeline; *p && used + 1 < size;) {
        const char *hit = strstr(p, "block");
        const size_t take = hit ? (size_t)(hit - p) + 5 : strlen(p);
        used += (size_t)snprintf(out + used, size - used, "%.*s%s%s", (int)take, p, hit && *extra ? " " : "",
                                 hit ? extra : "");
        p += take;
    }
}

static void push_range(sf_graph *g, const shard_scenario *sc, uint32_t *const *tokens, size_t from, size_t to,
                       shard_outputs *o, int dim, int *flushed)
{
    for (size_t at = 0, step = 7; at < to; at += step, step = step * 3 % 41 + 1) {
        if (at + step <= from) continue; /* the same chunks whatever `from` is */
        const size_t start = at < from ? from : at, end = at + step < to ? at + step : to;
        for (int s = sc->streams - 1; s >= 0; s--) CHECK_OK(sf_graph_push(g, (uint64_t)s, tokens[s] + start, end - start));
        if (sc->flush_at && !*flushed && end >= sc->flush_at) {
            CHECK_OK(sf_graph_flush(g, 0));
            *flushed = 1;
        }
        collect(g, o, sc->tokens, dim);
    }
}

sf_graph *shard_graph(const sf_model *m, const shard_device *dev, const shard_scenario *sc, const char *extra)
{
    sf_graph_options opts = {.device = dev->name, .precision = dev->precision, .backend_settings = dev->settings,
                             .threads = strcmp(dev->name, "cpu") == 0 ? 1 : 0};
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, &opts, &g);
    CHECKF(rc == SF_OK, "graph on %s: %s", dev->name, sf_last_error());
    if (rc != SF_OK) return NULL;
    char pipeline[512];
    with_options(sc->pipeline, extra, pipeline, sizeof pipeline);
    rc = sf_graph_parse(g, pipeline);
    CHECKF(rc == SF_OK, "parse '%s': %s", pipeline, sf_last_error());
    if (rc != SF_OK) {
        sf_graph_free(g);
        return NULL;
    }
    return g;
}

int shard_run(const sf_model *m, const shard_device *dev, const shard_scenario *sc, const char *extra,
              uint32_t *const *tokens, shard_outputs *o, size_t split, const char *extra_after)
{
    const size_t D = (size_t)sf_model_get_config(m)->dim;
    memset(o, 0, sizeof *o);
    for (int s = 0; s < sc->streams; s++) {
        o->x[s] = malloc(sc->tokens * D * sizeof(float));
        for (size_t i = 0; i < sc->tokens * D; i++) o->x[s][i] = NAN;
    }
    sf_graph *g = shard_graph(m, dev, sc, extra);
    if (!g) return SF_E_INVAL;
    int flushed = 0;
    push_range(g, sc, tokens, 0, split ? split : sc->tokens, o, (int)D, &flushed);
    if (split) {
        sf_buffer state = {0};
        CHECK_OK(sf_graph_save(g, &state));
        collect(g, o, sc->tokens, (int)D);
        sf_graph_free(g);
        g = shard_graph(m, dev, sc, extra_after);
        int rc = g ? sf_graph_restore(g, state.data, state.len) : SF_E_INVAL;
        sf_buffer_release(&state);
        if (rc != SF_OK) {
            sf_graph_free(g);
            return rc;
        }
        push_range(g, sc, tokens, split, sc->tokens, o, (int)D, &flushed);
    }
    int rc = SF_OK;
    for (int s = 0; s < sc->streams && rc == SF_OK; s++) rc = sf_graph_end(g, (uint64_t)s);
    CHECKF(rc == SF_OK, "end of the streams: %s", sf_last_error());
    collect(g, o, sc->tokens, (int)D);
    sf_graph_free(g);
    return rc;
}

uint32_t **shard_tokens(const sf_model *m, const shard_scenario *sc, uint64_t seed)
{
    uint32_t **t = calloc(SHARD_MAX_STREAMS, sizeof *t);
    check_rng r = {seed};
    for (int s = 0; s < sc->streams; s++) {
        t[s] = malloc(sc->tokens * sizeof(uint32_t));
        for (size_t i = 0; i < sc->tokens; i++)
            t[s][i] = (uint32_t)(check_rng_next(&r) % (uint64_t)sf_model_get_config(m)->vocab);
    }
    return t;
}

void shard_tokens_free(uint32_t **t)
{
    for (int s = 0; t && s < SHARD_MAX_STREAMS; s++) free(t[s]);
    free(t);
}

double shard_worst_error(const char *name, const char *label, const shard_outputs *got, const shard_outputs *want,
                         const shard_scenario *sc, size_t D)
{
    double worst = 0;
    for (int s = 0; s < sc->streams; s++) {
        double err = check_rel_err_f32(got->x[s], want->x[s], sc->tokens * D);
        if (!(err <= worst)) worst = err;
    }
    if (sc->flush_at) {
        int same = got->provisional && want->provisional && got->prov_pos == want->prov_pos && got->prov_n == want->prov_n;
        CHECKF(same, "%s [%s]: the flush emitted different rows", name, label);
        if (same) {
            double err = check_rel_err_f32(got->provisional, want->provisional, got->prov_n * D);
            if (!(err <= worst)) worst = err;
        }
    }
    return worst;
}
