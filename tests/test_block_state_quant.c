/* block state_quant=/state_group=/state_codec= (and the binary's --state-quant/--state-codec):
 * lossless state (f32 under zstd, lz4 or raw) gives output and state identical, bit for bit, to
 * a run that keeps every stream live; lossy state (int8, int4, fp8, bf16) gives every stored
 * float back within sf_quant_error_bound of the exact state (the store's documented bound),
 * really differs from it (the request is not ignored), and keeps the output close (int8: a
 * relative L2 error of the next round under 0.2%, measured 0.017%); bad values are refused with a message naming the option. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compress/quantize.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/small_model.h"
#include "support/spawn.h"

enum { STREAMS = 64, SEGMENT = 16 };

static sf_model *make_model(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 2, SEGMENT, 4);
    if (sf_branches_parse("8:1,16:2", &cfg) != SF_OK) return NULL;
    sf_model *m = NULL;
    return sf_model_create_random(&cfg, 7, &m) == SF_OK ? m : NULL;
}

/* Pushes one full segment per stream for `rounds` rounds, appending every output float. */
static int feed(sf_graph *g, int from, int to, sf_buffer *out)
{
    uint32_t tokens[SEGMENT];
    for (int r = from; r < to; r++) {
        for (uint64_t s = 0; s < STREAMS; s++) {
            for (int i = 0; i < SEGMENT; i++) tokens[i] = (uint32_t)((s * 37 + (uint64_t)r * 11 + (uint64_t)i * i) % 256);
            int rc = sf_graph_push(g, 500 + s, tokens, SEGMENT);
            for (sf_packet *p; rc == SF_OK && (p = sf_graph_pull(g)); sf_packet_free(p))
                rc = sf_buffer_append(out, p->x, p->n * p->width * sizeof(float));
            if (rc != SF_OK) return rc;
        }
    }
    return SF_OK;
}

/* The block stage's saved state: per stream id, its floats in the store's order (M, z, gk, gv;
 * the rings are dropped). Returns the stream count, or -1 when the layout does not parse. */
typedef struct stream_floats {
    uint64_t id;
    float *v;
} stream_floats;

static int block_states(const sf_buffer *saved, size_t floats_mz, size_t floats_g, int layers,
                        stream_floats *out)
{
    size_t at = 0;
    while (at + 8 <= saved->len) {
        uint32_t name_len;
        uint64_t len;
        memcpy(&name_len, saved->data + at + 4, 4);
        at += 8;
        if (at + name_len + 8 > saved->len) return -1;
        int is_block = name_len == 5 && memcmp(saved->data + at, "block", 5) == 0;
        at += name_len;
        memcpy(&len, saved->data + at, 8);
        at += 8;
        if (len > saved->len - at) return -1;
        if (!is_block) {
            at += len;
            continue;
        }
        const uint8_t *p = saved->data + at;
        uint32_t head[3];
        memcpy(head, p, sizeof head);
        p += sizeof head;
        size_t ring = 2 * (size_t)layers * sizeof(int);
        size_t per = 8 + (floats_mz + 2 * floats_g) * sizeof(float) + ring;
        if (head[0] > STREAMS || len != sizeof head + head[0] * per) return -1;
        for (uint32_t i = 0; i < head[0]; i++) {
            memcpy(&out[i].id, p, 8);
            p += 8;
            out[i].v = malloc((floats_mz + 2 * floats_g) * sizeof(float));
            memcpy(out[i].v, p, floats_mz * sizeof(float));
            p += floats_mz * sizeof(float) + ring;
            memcpy(out[i].v + floats_mz, p, 2 * floats_g * sizeof(float));
            p += 2 * floats_g * sizeof(float);
        }
        return (int)head[0];
    }
    return -1;
}

static const stream_floats *find(const stream_floats *s, int n, uint64_t id)
{
    for (int i = 0; i < n; i++)
        if (s[i].id == id) return &s[i];
    return NULL;
}

static double rel_l2(const sf_buffer *a, const sf_buffer *b)
{
    const float *x = (const float *)a->data, *y = (const float *)b->data;
    double num = 0, den = 0;
    for (size_t i = 0; i < a->len / sizeof(float); i++) {
        num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        den += (double)x[i] * x[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

typedef struct mode {
    const char *options;
    sf_quant_params quant;
    double output_tolerance; /* relative L2 error of the outputs after a second round */
} mode;

static void check_mode(const sf_model *m, const mode *md, const sf_buffer *want_out1,
                       const sf_buffer *want_out2, const stream_floats *want, int n_want)
{
    const sf_model_config *c = sf_model_get_config(m);
    size_t mz = (size_t)c->layers * c->heads * c->head_dim * (c->head_dim + 1);
    size_t g = (size_t)c->layers * c->global_tokens * c->heads * c->head_dim, total = mz + 2 * g;
    char pipeline[512];
    /* 64 streams of 6.4 KB: most are compressed or spilled under a 120 KB budget */
    snprintf(pipeline, sizeof pipeline, "segment ! embed ! block state_budget=120000 spill=%s %s ! norm",
             check_tmp_path("quant-spill"), md->options);
    sf_graph *gr = check_graph(m, pipeline);
    CHECK(gr != NULL);
    if (!gr) return;
    sf_buffer out1 = {0}, out2 = {0}, saved = {0};
    CHECK_OK(feed(gr, 0, 1, &out1));
    CHECK_OK(sf_graph_save(gr, &saved));
    /* the first round starts from zero state: its output is exact in every mode */
    CHECKF(out1.len == want_out1->len && memcmp(out1.data, want_out1->data, out1.len) == 0, "%s: round 1 differs",
           md->options);
    stream_floats got[STREAMS];
    int n = block_states(&saved, mz, g, c->layers, got);
    CHECKF(n == n_want, "%s: %d streams saved, want %d", md->options, n, n_want);
    int differing = 0;
    for (int i = 0; i < n && i < n_want; i++) {
        const stream_floats *w = find(want, n_want, got[i].id);
        CHECK(w != NULL);
        if (!w) continue;
        double bound = sf_quant_error_bound(&md->quant, w->v, total), worst = 0;
        for (size_t k = 0; k < total; k++) {
            double d = fabs((double)got[i].v[k] - w->v[k]);
            if (!(d <= worst)) worst = d;
        }
        CHECKF(worst <= bound, "%s: stream %llu off by %g, bound %g", md->options, (unsigned long long)got[i].id,
               worst, bound);
        differing += worst > 0;
    }
    if (md->quant.kind == SF_QUANT_F32) CHECKF(differing == 0, "%s: %d lossless states differ", md->options, differing);
    else CHECKF(differing >= STREAMS / 2, "%s: only %d of %d states were quantized", md->options, differing, n);
    CHECK_OK(feed(gr, 1, 2, &out2));
    CHECK(out2.len == want_out2->len);
    if (out2.len == want_out2->len) {
        double err = rel_l2(want_out2, &out2);
        if (md->quant.kind == SF_QUANT_F32) CHECKF(err == 0, "%s: lossless output differs (%g)", md->options, err);
        else CHECKF(err > 0 && err <= md->output_tolerance, "%s: round 2 relative error %g (tolerance %g)", md->options,
                    err, md->output_tolerance);
    }
    for (int i = 0; i < n; i++) free(got[i].v);
    sf_graph_free(gr);
    sf_buffer_release(&out1);
    sf_buffer_release(&out2);
    sf_buffer_release(&saved);
}

/* A pipeline refused with SF_E_OPTION naming `needle`: by the option table when the pipeline is
 * parsed (a value out of its range or choices), or else at the first push, when block's init
 * checks how the options go together. */
static void refused(const sf_model *m, const char *block_options, const char *needle)
{
    char pipeline[256];
    snprintf(pipeline, sizeof pipeline, "segment ! embed ! block %s ! norm", block_options);
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, &(sf_graph_options){.threads = 1}, &g);
    CHECK(rc == SF_OK);
    if (rc != SF_OK) return;
    rc = sf_graph_parse(g, pipeline);
    if (rc == SF_OK) rc = sf_graph_push(g, 1, (const uint32_t[]){1}, 1);
    CHECKF(rc == SF_E_OPTION && strstr(sf_last_error(), needle), "%s: rc %d, %s", block_options, rc, sf_last_error());
    sf_graph_free(g);
}

static void test_binary(void)
{
    if (!spawn_binary()) return;
    spawn_result r;
    char ref[512], out[512];
    snprintf(ref, sizeof ref, "%s", check_tmp_path("quant-ref.f32"));
    snprintf(out, sizeof out, "%s", check_tmp_path("quant-out.f32"));
    const char *plain[] = {"seqflow", "run", "-q", "-o", ref, NULL};
    CHECK(spawn_run(plain, NULL, 0, &r) == 0 && r.exit_code == 0);
    const char *lossy[] = {"seqflow", "run", "-q", "-o", out, "--state-budget", "300000", "--state-quant", "int4:32",
                           "--state-codec", "lz4", NULL};
    CHECK(spawn_run(lossy, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 0, "--state-quant int4:32: exit %d: %s", r.exit_code, r.err);
    const char *bad[][9] = {
        {"seqflow", "run", "--state-budget", "300000", "--state-quant", "int9", NULL},
        {"seqflow", "run", "--state-budget", "300000", "--state-quant", "int4:3", NULL},
        {"seqflow", "run", "--state-budget", "300000", "--state-quant", "bf16:8", NULL},
        {"seqflow", "run", "--state-budget", "300000", "--state-codec", "gzip", NULL},
        {"seqflow", "run", "--state-quant", "int8", NULL},
        {"seqflow", "run", "--checkpoint", "/nonexistent-dir", "--checkpoint-codec", "lz5", NULL},
        {"seqflow", "run", "--checkpoint-codec", "zstd", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(spawn_run(bad[i], NULL, 0, &r) == 0);
        CHECKF(r.exit_code == 2 && r.err_lines == 1 && strncmp(r.err, "seqflow: --", 11) == 0, "%s %s: exit %d: %s",
               bad[i][2], bad[i][3], r.exit_code, r.err);
    }
    unlink(ref);
    unlink(out);
}

int main(void)
{
    sf_model *m = make_model();
    CHECK(m != NULL);
    if (!m) return check_finish("test_block_state_quant");
    const sf_model_config *c = sf_model_get_config(m);
    size_t mz = (size_t)c->layers * c->heads * c->head_dim * (c->head_dim + 1);
    size_t g = (size_t)c->layers * c->global_tokens * c->heads * c->head_dim;

    /* the reference: every stream live and exact */
    sf_graph *ref = check_graph(m, "segment ! embed ! block ! norm");
    sf_buffer want1 = {0}, want2 = {0}, saved = {0};
    CHECK(ref != NULL);
    if (ref) {
        CHECK_OK(feed(ref, 0, 1, &want1));
        CHECK_OK(sf_graph_save(ref, &saved));
    }
    stream_floats want[STREAMS];
    int n_want = block_states(&saved, mz, g, c->layers, want);
    CHECKF(n_want == STREAMS, "reference saved %d streams", n_want);
    if (ref) CHECK_OK(feed(ref, 1, 2, &want2));
    sf_graph_free(ref);

    const mode modes[] = {
        {"state_codec=lz4", {SF_QUANT_F32, 1}, 0},
        {"state_codec=raw state_quant=f32", {SF_QUANT_F32, 1}, 0},
        {"state_quant=bf16", {SF_QUANT_BF16, 1}, 1e-3},
        {"state_quant=int8 state_group=32 state_codec=lz4", {SF_QUANT_INT8, 32}, 2e-3},
        {"state_quant=fp8", {SF_QUANT_FP8_E4M3, 64}, 1e-2},
        {"state_quant=int4 state_group=16 state_codec=zstd", {SF_QUANT_INT4, 16}, 2e-2},
    };
    for (size_t i = 0; n_want == STREAMS && i < sizeof modes / sizeof *modes; i++)
        check_mode(m, &modes[i], &want1, &want2, want, n_want);
    for (int i = 0; i < n_want; i++) free(want[i].v);
    rmdir(check_tmp_path("quant-spill"));

    refused(m, "state_budget=100000 state_quant=int9", "state_quant=int9");
    refused(m, "state_budget=100000 state_quant=int4 state_group=5", "even");
    refused(m, "state_budget=100000 state_group=0 state_quant=int8", "state_group=0");
    refused(m, "state_budget=100000 state_codec=gzip", "state_codec=gzip");
    refused(m, "state_budget=-1", "state_budget=-1");
    refused(m, "state_quant=int8", "needs a state_budget");

    sf_buffer_release(&want1);
    sf_buffer_release(&want2);
    sf_buffer_release(&saved);
    sf_model_free(m);
    test_binary();
    return check_finish("test_block_state_quant");
}
