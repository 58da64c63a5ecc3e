/* block batch=B: full segments of up to B distinct streams run through the products, norms and
 * MLP together. The output of every stream must match the unbatched run (the same packets, in
 * the same order within each stream); segments must really wait for a batch (observable in
 * push mode); a save while segments wait includes them; bad values are refused. The GPU
 * pipeline test runs the same on the CUDA backend. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/small_model.h"

enum { STREAMS = 6, ROUNDS = 6, SEGMENT = 16, MAX_OUT = 4096 };

/* Every output packet, per stream in emission order. */
typedef struct record {
    uint64_t stream, position, n, flags;
    size_t at; /* offset of its values in values[] */
} record;

typedef struct outputs {
    record rec[MAX_OUT];
    int count;
    float *values;
    size_t used, cap;
} outputs;

static int drain(sf_graph *g, outputs *o)
{
    int got = 0;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p), got++) {
        if (o->count == MAX_OUT) continue;
        size_t floats = p->n * p->width;
        if (o->used + floats > o->cap) {
            o->cap = 2 * (o->used + floats) + 1024;
            o->values = realloc(o->values, o->cap * sizeof(float));
        }
        if (floats) memcpy(o->values + o->used, p->x, floats * sizeof(float));
        o->rec[o->count++] = (record){p->stream, p->position, p->n, p->flags, o->used};
        o->used += floats;
    }
    return got;
}

static uint32_t token(uint64_t stream, int round, int i) { return (uint32_t)((stream * 97 + round * 31 + i * 13 + i * i) % 256); }

/* Rounds [from, to): each stream gets chunks that make full segments most of the time, a
 * partial tail sometimes, a provisional flush now and then, and ends after the last round. */
static void feed(sf_graph *g, int from, int to, outputs *o)
{
    uint32_t tokens[3 * SEGMENT];
    for (int r = from; r < to; r++)
        for (uint64_t s = 0; s < STREAMS; s++) {
            int n = (s + r) % 5 == 0 ? 7 + (int)s : SEGMENT * (1 + (int)((s + r) % 2));
            for (int i = 0; i < n; i++) tokens[i] = token(s, r, i);
            CHECK_OK(sf_graph_push(g, s, tokens, (size_t)n));
            if ((s * 3 + r) % 7 == 0) CHECK_OK(sf_graph_flush(g, s));
            if (r == ROUNDS - 1) CHECK_OK(sf_graph_end(g, s));
            drain(g, o);
        }
}

/* Largest relative difference (L2 per packet) between the two runs, stream by stream; -1 when
 * the packets themselves (stream, position, rows, flags, order) differ. */
static double compare_runs(const outputs *a, const outputs *b)
{
    if (a->count != b->count) return -1;
    double worst = 0;
    for (uint64_t s = 0; s < STREAMS; s++) {
        int i = 0, j = 0;
        for (;;) {
            while (i < a->count && a->rec[i].stream != s) i++;
            while (j < b->count && b->rec[j].stream != s) j++;
            if (i == a->count || j == b->count) {
                if (i != a->count || j != b->count) return -1;
                break;
            }
            const record *x = &a->rec[i++], *y = &b->rec[j++];
            if (x->position != y->position || x->n != y->n || x->flags != y->flags) return -1;
            double num = 0, den = 0;
            for (size_t k = 0; k < x->n * 32; k++) {
                double d = (double)a->values[x->at + k] - b->values[y->at + k];
                num += d * d, den += (double)b->values[y->at + k] * b->values[y->at + k];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!(rel <= worst)) worst = rel; /* NaN sticks */
        }
    }
    return worst;
}

int main(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 2, SEGMENT, 4);
    CHECK_OK(sf_branches_parse("8:1,16:2", &cfg));
    CHECK(cfg.dim == 32);
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, 5, &m));
    if (!m) return check_finish("test_block_batch");
    static outputs want, got, resumed;

    sf_graph *g = check_graph(m, "segment ! embed ! block ! norm");
    CHECK(g != NULL);
    if (g) feed(g, 0, ROUNDS, &want);
    sf_graph_free(g);
    CHECK(want.count > STREAMS * ROUNDS);

    for (int batch = 2; batch <= 4; batch++) {
        char pipeline[128];
        snprintf(pipeline, sizeof pipeline, "segment ! embed ! block batch=%d ! norm", batch);
        memset(&got, 0, sizeof got);
        g = check_graph(m, pipeline);
        CHECK(g != NULL);
        if (g) feed(g, 0, ROUNDS, &got);
        sf_graph_free(g);
        double err = compare_runs(&got, &want);
        CHECKF(err >= 0 && err <= 1e-5, "batch=%d: %s (rel err %.3g)", batch,
               err < 0 ? "packets differ from the unbatched run" : "values differ", err);
        printf("batch=%d: %d packets, per-stream rel err vs batch=1 %.2e\n", batch, got.count, err);
        free(got.values);
    }

    /* the segments really wait: three streams' full segments give nothing, the fourth all four */
    g = check_graph(m, "segment ! embed ! block batch=4 ! norm");
    CHECK(g != NULL);
    if (g) {
        uint32_t tokens[SEGMENT];
        for (int i = 0; i < SEGMENT; i++) tokens[i] = token(9, 0, i);
        memset(&got, 0, sizeof got);
        int out_after[4];
        for (uint64_t s = 0; s < 4; s++) {
            CHECK_OK(sf_graph_push(g, 40 + s, tokens, SEGMENT));
            out_after[s] = drain(g, &got);
        }
        CHECKF(out_after[0] == 0 && out_after[1] == 0 && out_after[2] == 0 && out_after[3] == 4,
               "outputs after each of 4 streams' segments: %d %d %d %d (want 0 0 0 4)", out_after[0], out_after[1],
               out_after[2], out_after[3]);
        /* the same stream twice runs what waits first */
        CHECK_OK(sf_graph_push(g, 40, tokens, SEGMENT));
        CHECK(drain(g, &got) == 0);
        CHECK_OK(sf_graph_push(g, 40, tokens, SEGMENT));
        CHECK(drain(g, &got) == 2); /* the waiting one, then this one unbatched */
        free(got.values);
    }
    sf_graph_free(g);

    /* save while segments wait, restore into a fresh graph, finish: the unbatched output */
    memset(&resumed, 0, sizeof resumed);
    sf_buffer saved = {0};
    g = check_graph(m, "segment ! embed ! block batch=4 ! norm");
    CHECK(g != NULL);
    if (g) {
        feed(g, 0, 3, &resumed);
        CHECK_OK(sf_graph_save(g, &saved));
        drain(g, &resumed); /* what waited came out ahead of the save */
    }
    sf_graph_free(g);
    g = check_graph(m, "segment ! embed ! block batch=4 ! norm");
    CHECK(g != NULL);
    if (g) {
        CHECK_OK(sf_graph_restore(g, saved.data, saved.len));
        feed(g, 3, ROUNDS, &resumed);
    }
    sf_graph_free(g);
    double err = compare_runs(&resumed, &want);
    CHECKF(err >= 0 && err <= 1e-5, "saved and restored batch=4 run: %s (rel err %.3g)",
           err < 0 ? "packets differ" : "values differ", err);
    sf_buffer_release(&saved);
    free(resumed.values);
    free(want.values);

    for (int bad = 0; bad < 2; bad++) {
        const char *text = bad ? "segment ! embed ! block batch=17 ! norm" : "segment ! embed ! block batch=0 ! norm";
        sf_graph *b = NULL;
        int rc = sf_graph_create(m, &(sf_graph_options){.threads = 1}, &b);
        if (rc == SF_OK) rc = sf_graph_parse(b, text);
        uint32_t one = 1;
        if (rc == SF_OK) rc = sf_graph_push(b, 0, &one, 1); /* stages start at the first push */
        CHECKF(rc == SF_E_OPTION, "%s accepted (rc %d)", text, rc);
        sf_graph_free(b);
    }
    sf_model_free(m);
    return check_finish("test_block_batch");
}
