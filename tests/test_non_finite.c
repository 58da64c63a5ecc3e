/* Non-finite numbers never pass silently. A NaN entering the hidden rows at one token (here:
 * its embedding row) stops the block stage at layer 0, naming the stream and that token's
 * position, not an earlier one: causal attention skips masked keys instead of weighting them
 * by zero, so the NaN cannot reach earlier rows. Weights so large that activations overflow
 * stop the run at the layer where the overflow happens. check_finite=0 turns the check off
 * (the NaN then reaches the output). Through the binary, the same is exit 1 and one line. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/gpu.h"
#include "support/small_model.h"
#include "support/spawn.h"

enum { SEGMENT = 256, BAD_TOKEN = 7, BAD_AT = 100, STREAM = 5, START = 3 * SEGMENT };

static sf_model *make_model(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 3, SEGMENT, 4);
    CHECK_OK(sf_branches_parse("64:1,128:2,256:4", &cfg));
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, 3, &m));
    return m;
}

/* Tokens of a stream: never BAD_TOKEN except at BAD_AT (when bad). */
static void fill(uint32_t *tokens, int n, int bad)
{
    for (int i = 0; i < n; i++) tokens[i] = 8 + (uint32_t)((i * 7 + i / 3) % 40);
    if (bad) tokens[BAD_AT] = BAD_TOKEN;
}

/* Pushes two segments of stream STREAM (the second holding the bad token when bad, so that
 * positions past the first segment are named correctly); returns the first failure's code
 * with its message in msg. */
static int first_bad_position; /* run_on's: the first output row holding a non-finite value, -1 if none */

static int run_on(const sf_model *m, const char *device, const char *pipeline, int bad, char *msg, size_t msg_size,
                  int *nan_out)
{
    first_bad_position = -1;
    sf_graph *g = NULL;
    if (strcmp(device, "cpu") == 0) {
        g = check_graph(m, pipeline);
    } else {
        const sf_graph_options opts = {.device = device};
        if (sf_graph_create(m, &opts, &g) != SF_OK || sf_graph_parse(g, pipeline) != SF_OK) {
            fprintf(stderr, "  %s on %s: %s\n", pipeline, device, sf_last_error());
            sf_graph_free(g);
            g = NULL;
        }
    }
    CHECK(g != NULL);
    if (!g) return SF_E_INVAL;
    uint32_t tokens[SEGMENT];
    int rc = SF_OK;
    msg[0] = 0;
    *nan_out = 0;
    for (int s = 0; s < 2 && rc == SF_OK; s++) {
        fill(tokens, SEGMENT, bad && s == 1);
        rc = sf_graph_push(g, STREAM, tokens, SEGMENT);
        for (sf_packet *p; rc == SF_OK && (p = sf_graph_pull(g)); sf_packet_free(p))
            for (size_t i = 0; i < p->n * p->width; i++) {
                const int bad_value = p->x ? !isfinite(p->x[i]) : (p->x_bf16[i] & 0x7f80u) == 0x7f80u;
                const int pos = (int)(p->position + i / p->width);
                if (bad_value && (first_bad_position < 0 || pos < first_bad_position)) first_bad_position = pos;
                *nan_out |= bad_value;
            }
    }
    if (rc == SF_OK) rc = sf_graph_end(g, STREAM);
    if (rc != SF_OK) snprintf(msg, msg_size, "%s", sf_graph_error(g)[0] ? sf_graph_error(g) : sf_last_error());
    sf_graph_free(g);
    return rc;
}

static int run(const sf_model *m, const char *pipeline, int bad, char *msg, size_t msg_size, int *nan_out)
{
    return run_on(m, "cpu", pipeline, bad, msg, msg_size, nan_out);
}

/* On a GPU: with checks HOST a GPU run's rows are not scanned, so the NaN reaches the output;
 * with checks ON (the default) they are scanned on the device where they are brought to the host (the final
 * norm, in float32 and bf16, the graph's own download for a pull), and a hit names the stream
 * and the bad token's own position, as on the CPU: the attention kernels keep a masked key's
 * NaN out of the rows before it; a clean input passes; OFF scans nothing, and the output's
 * rows before the bad token are finite, the bad token's row is not. */
static void check_gpu(const sf_model *m)
{
    char msg[1024], want[64];
    int nan_out;
    snprintf(want, sizeof want, "stream %d, position %d,", STREAM, SEGMENT + BAD_AT);
    const char *pipelines[] = {"segment ! embed ! block ! norm", "segment ! embed ! block",
                               "segment ! embed ! block ! norm dtype=bf16",
                               "segment ! embed ! block ! norm ! sink format=null"};
    const int n_pipelines = (int)(sizeof pipelines / sizeof *pipelines);
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_HOST));
    for (int i = 0; i < n_pipelines; i++) {
        int rc = run_on(m, "cuda", pipelines[i], 1, msg, sizeof msg, &nan_out);
        CHECKF(rc == SF_OK && (nan_out || i == 3), "cuda, HOST, %s: rc %d, NaN out %d: %s", pipelines[i], rc, nan_out, msg);
        CHECKF(i == 3 || first_bad_position == SEGMENT + BAD_AT, "cuda, HOST, %s: first non-finite row at %d, want %d",
               pipelines[i], first_bad_position, SEGMENT + BAD_AT);
    }
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_ON));
    for (int i = 0; i < n_pipelines; i++) {
        int rc = run_on(m, "cuda", pipelines[i], 1, msg, sizeof msg, &nan_out);
        CHECKF(rc == SF_E_NONFINITE && strstr(msg, want), "cuda, ON, %s: rc %d: %s", pipelines[i], rc, msg);
        rc = run_on(m, "cuda", pipelines[i], 0, msg, sizeof msg, &nan_out);
        CHECKF(rc == SF_OK && !nan_out, "cuda, ON, %s, clean input: rc %d: %s", pipelines[i], rc, msg);
    }
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_OFF));
    int rc = run_on(m, "cuda", "segment ! embed ! block ! norm", 1, msg, sizeof msg, &nan_out);
    CHECKF(rc == SF_OK && nan_out && first_bad_position == SEGMENT + BAD_AT,
           "cuda, OFF: rc %d, NaN in output %d, first non-finite row at %d (want %d): %s", rc, nan_out,
           first_bad_position, SEGMENT + BAD_AT, msg);
    rc = run_on(m, "cuda", "segment ! embed ! block check_finite=0 ! norm", 1, msg, sizeof msg, &nan_out);
    CHECKF(rc == SF_OK && first_bad_position == SEGMENT + BAD_AT,
           "cuda, OFF, check_finite=0: rc %d, first non-finite row at %d (want %d): %s", rc, first_bad_position,
           SEGMENT + BAD_AT, msg);
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_ON));
}

int main(void)
{
    sf_model *m = make_model();
    if (!m) return check_finish("test_non_finite");
    const sf_model_config *cfg = sf_model_get_config(m);
    char msg[1024], want[128];
    int nan_out;

    /* clean input: no error */
    CHECK_OK(run(m, "segment ! embed ! block ! norm", 1, msg, sizeof msg, &nan_out));
    CHECK(!nan_out);

    /* a NaN embedding row: the block stops at layer 0, at the token's own position */
    float *embed = (float *)sf_model_embedding(m);
    float saved = embed[(size_t)BAD_TOKEN * cfg->dim + 3];
    embed[(size_t)BAD_TOKEN * cfg->dim + 3] = NAN;
    int rc = run(m, "segment ! embed ! block ! norm", 1, msg, sizeof msg, &nan_out);
    snprintf(want, sizeof want, "stream %d, position %d,", STREAM, SEGMENT + BAD_AT);
    CHECKF(rc == SF_E_NONFINITE && strstr(msg, "layer 0 ") && strstr(msg, want) && strstr(msg, "NaN"),
           "NaN embedding: rc %d: %s (want layer 0 and '%s')", rc, msg, want);
    /* with the check off it reaches the output */
    rc = run(m, "segment ! embed ! block check_finite=0 ! norm", 1, msg, sizeof msg, &nan_out);
    CHECKF(rc == SF_OK && nan_out, "check_finite=0: rc %d, NaN in output %d: %s", rc, nan_out, msg);
    /* the modes: ON by default; an unknown one is refused and changes nothing */
    CHECK(sf_check_finite() == SF_CHECK_FINITE_ON);
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_HOST));
    CHECK(sf_set_check_finite((sf_check_finite_mode)7) == SF_E_INVAL && sf_check_finite() == SF_CHECK_FINITE_HOST);
    CHECK_OK(sf_set_check_finite(SF_CHECK_FINITE_ON));
    /* the token absent: nothing happens */
    CHECK_OK(run(m, "segment ! embed ! block ! norm", 0, msg, sizeof msg, &nan_out));
    if (check_have_gpu()) check_gpu(m);
    else printf("test_non_finite: GPU cases skipped: no GPU\n");
    embed[(size_t)BAD_TOKEN * cfg->dim + 3] = saved;

    /* finite but huge output projection in layer 1: activations overflow there */
    const sf_block_weights *w = sf_model_block(m, 1);
    float *wo = (float *)w->wo;
    size_t n_wo = (size_t)cfg->dim * cfg->heads * cfg->head_dim;
    float *wo_saved = malloc(n_wo * sizeof *wo_saved);
    memcpy(wo_saved, wo, n_wo * sizeof *wo);
    for (size_t i = 0; i < n_wo; i++) wo[i] = wo[i] < 0 ? -FLT_MAX : FLT_MAX;
    rc = run(m, "segment ! embed ! block ! norm", 0, msg, sizeof msg, &nan_out);
    CHECKF(rc == SF_E_NONFINITE && strstr(msg, "layer 1 ") && strstr(msg, "overflow"), "huge Wo in layer 1: rc %d: %s",
           rc, msg);
    /* a block running only layers 1-2 names the model's layer number too */
    rc = run(m, "segment ! embed ! block layers=0 ! block layers=1-2 ! norm", 0, msg, sizeof msg, &nan_out);
    CHECKF(rc == SF_E_NONFINITE && strstr(msg, "layer 1 "), "layers=1-2: rc %d: %s", rc, msg);
    /* through the binary: exit 1, one line naming the stage and the layer; no output left */
    if (spawn_binary()) {
        char model_path[512], out_path[512];
        snprintf(model_path, sizeof model_path, "%s", check_tmp_path("overflow.safetensors"));
        snprintf(out_path, sizeof out_path, "%s", check_tmp_path("overflow.raw"));
        CHECK_OK(sf_model_save(m, model_path));
        const char *argv[] = {"seqflow", "run", "-m", model_path, "-q", "-o", out_path, NULL};
        spawn_result r;
        CHECK(spawn_run(argv, NULL, 0, &r) == 0);
        CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "block") && strstr(r.err, "layer 1 ") &&
                   strstr(r.err, "position"),
               "binary with overflowing weights: exit %d: %s", r.exit_code, r.err);
        CHECK(!check_path_exists(out_path));
        /* --check-finite 0: the same run completes (its output holds the infinities) */
        const char *unchecked[] = {"seqflow", "run", "-m", model_path, "-q", "-o", out_path, "--check-finite", "0", NULL};
        CHECK(spawn_run(unchecked, NULL, 0, &r) == 0);
        CHECKF(r.exit_code == 0 && check_path_exists(out_path), "--check-finite 0: exit %d: %s", r.exit_code, r.err);
        unlink(out_path);
        const char *bad_value[] = {"seqflow", "run", "-q", "--check-finite", "2", NULL};
        CHECK(spawn_run(bad_value, NULL, 0, &r) == 0);
        CHECKF(r.exit_code == 2 && r.err_lines == 1 && strstr(r.err, "--check-finite"), "--check-finite 2: exit %d: %s",
               r.exit_code, r.err);
        unlink(model_path);
    }
    memcpy(wo, wo_saved, n_wo * sizeof *wo);
    free(wo_saved);
    CHECK_OK(run(m, "segment ! embed ! block ! norm", 0, msg, sizeof msg, &nan_out));

    /* packets: the check names stream, position and column, float32 and bf16 alike */
    sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, 32);
    CHECK(p != NULL);
    if (p) {
        p->n = 4, p->width = 8, p->stream = 2, p->position = 40;
        for (int i = 0; i < 32; i++) p->x[i] = (float)i;
        CHECK_OK(sf_packet_check_finite(p, "here"));
        p->x[19] = -INFINITY;
        CHECK(sf_packet_check_finite(p, "here") == SF_E_NONFINITE);
        CHECKF(strstr(sf_last_error(), "-inf") && strstr(sf_last_error(), "here: stream 2, position 42, column 3"),
               "packet check: %s", sf_last_error());
        p->x[19] = 19.0f;
        p->x[30] = NAN;
        CHECK_OK(sf_packet_to_bf16(p));
        CHECK(sf_packet_check_finite(p, "in bf16") == SF_E_NONFINITE);
        CHECKF(strstr(sf_last_error(), "NaN") && strstr(sf_last_error(), "position 43, column 6"), "bf16 check: %s",
               sf_last_error());
        sf_packet_free(p);
    }
    sf_model_free(m);
    return check_finish("test_non_finite");
}
