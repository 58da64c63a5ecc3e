/* block state_budget=/spill=: hundreds of interleaved streams whose state is moved into a
 * state store between packets (compressed, then spilled, far beyond the budget) give output
 * identical, bit for bit, to a run that keeps every stream live; a save/restore through the
 * store continues identically; no spill directory and too small a budget fail cleanly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/small_model.h"

enum { STREAMS = 200, ROUNDS = 5 };

/* Spill files under dir: each state store spills into a subdirectory of its own
 * (sf-state-XXXXXX), so those are counted through. */
static int spill_files(const char *dir) { return check_count_files(dir, "sf-state-"); }

/* Appends every waiting output packet (stream, position, rows, flags, values) to out. */
static int drain(sf_graph *g, sf_buffer *out)
{
    int rc = SF_OK;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        uint64_t head[4] = {p->stream, p->position, p->n, p->flags};
        if (rc == SF_OK) rc = sf_buffer_append(out, head, sizeof head);
        if (rc == SF_OK && p->n)
            rc = sf_buffer_append(out, p->x, p->n * p->width * sizeof(float));
    }
    return rc;
}

static uint32_t token(uint64_t stream, int round, int i)
{
    return (uint32_t)((stream * 131 + (uint64_t)round * 17 + (uint64_t)i * 7 + i * i) % 256);
}

/* Pushes rounds [from, to) of every stream (ending them after the last round) into g.
 * Returns SF_OK or the first error. */
static int feed(sf_graph *g, int from, int to, sf_buffer *out)
{
    uint32_t tokens[64];
    for (int r = from; r < to; r++) {
        for (uint64_t s = 0; s < STREAMS; s++) {
            int n = 5 + (int)((s * 3 + (uint64_t)r * 5) % 19);
            for (int i = 0; i < n; i++) tokens[i] = token(s, r, i);
            int rc = sf_graph_push(g, 1000 + s * 77, tokens, (size_t)n);
            if (rc == SF_OK && (s + (uint64_t)r) % 4 == 0) rc = sf_graph_flush(g, 1000 + s * 77);
            if (rc == SF_OK && r == ROUNDS - 1) rc = sf_graph_end(g, 1000 + s * 77);
            if (rc == SF_OK) rc = drain(g, out);
            if (rc != SF_OK) return rc;
        }
    }
    return SF_OK;
}

/* Runs the binary through the shell; its exit status, or -1 when it did not run. */
static int run_binary(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' run -q %s 2>/dev/null", getenv("SEQFLOW_BIN"), args);
    int st = system(cmd);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* seqflow run --state-budget/--spill-dir: the same output as without, and a clean failure
 * (exit 1) for a budget below one stream's state. */
static void test_binary(void)
{
    if (!getenv("SEQFLOW_BIN")) return;
    char ref[512], out[512], dir[512], args[2048];
    snprintf(ref, sizeof ref, "%s", check_tmp_path("budget-ref.f32"));
    snprintf(out, sizeof out, "%s", check_tmp_path("budget-out.f32"));
    snprintf(dir, sizeof dir, "%s", check_tmp_path("budget-spill"));
    snprintf(args, sizeof args, "-o '%s'", ref);
    CHECK(run_binary(args) == 0);
    snprintf(args, sizeof args, "--state-budget 400000 --spill-dir '%s' -o '%s' "
             "'segment ! embed ! block layers=0 ! block layers=1 ! norm'", dir, out);
    CHECK(run_binary(args) == 0);
    CHECK(check_same_file(ref, out));
    CHECK(run_binary("--state-budget 1000 --sink-format null") == 1);
    CHECK(run_binary("--spill-dir /tmp --sink-format null") == 2);
    unlink(ref);
    unlink(out);
    rmdir(dir);
}

int main(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 2, 16, 4);
    CHECK_OK(sf_branches_parse("8:1,16:2", &cfg));
    sf_model *m = NULL;
    CHECK_OK(sf_model_create_random(&cfg, 11, &m));
    if (!m) return check_finish("test_block_state_budget");

    /* the reference: every stream's state stays live in the block stages */
    sf_buffer want = {0};
    sf_graph *g = check_graph(m, "segment ! embed ! block layers=0 ! block layers=1 ! norm");
    CHECK(g != NULL);
    if (g) CHECK_OK(feed(g, 0, ROUNDS, &want));
    sf_graph_free(g);
    CHECK(want.len > (size_t)STREAMS * 50 * cfg.dim * sizeof(float));

    /* one layer's state of one stream is 800 floats (3.2 KB), 200 streams 640 KB: a 48 KB
     * budget keeps a handful hot, a few compressed, the rest on disk */
    const char *dir = check_tmp_path("block-spill");
    char pipeline[1024];
    snprintf(pipeline, sizeof pipeline,
             "segment ! embed ! block layers=0 state_budget=49152 spill=%s ! "
             "block layers=1 state_budget=49152 spill=%s ! norm",
             dir, dir);
    sf_buffer got = {0};
    g = check_graph(m, pipeline);
    CHECK(g != NULL);
    if (g) {
        CHECK_OK(feed(g, 0, ROUNDS - 1, &got));
        CHECKF(spill_files(dir) > STREAMS, "%d spill files for 2 x %d streams", spill_files(dir),
               STREAMS);
        CHECK_OK(feed(g, ROUNDS - 1, ROUNDS, &got));
        CHECKF(spill_files(dir) == 0, "%d spill files left after every stream ended", spill_files(dir));
    }
    sf_graph_free(g);
    CHECKF(got.len == want.len && memcmp(got.data, want.data, want.len) == 0,
           "bounded run differs from the unbounded one (%zu vs %zu bytes)", got.len, want.len);

    /* save midway (streams spread over all tiers), restore into a fresh graph, finish there */
    sf_buffer resumed = {0}, saved = {0};
    g = check_graph(m, pipeline);
    CHECK(g != NULL);
    if (g) {
        CHECK_OK(feed(g, 0, 3, &resumed));
        CHECK_OK(sf_graph_save(g, &saved));
    }
    sf_graph_free(g);
    CHECK(spill_files(dir) == 0);
    g = check_graph(m, pipeline);
    CHECK(g != NULL);
    if (g) {
        CHECK_OK(sf_graph_restore(g, saved.data, saved.len));
        CHECK_OK(feed(g, 3, ROUNDS, &resumed));
    }
    sf_graph_free(g);
    CHECKF(resumed.len == want.len && memcmp(resumed.data, want.data, want.len) == 0,
           "restored run differs (%zu vs %zu bytes)", resumed.len, want.len);
    sf_buffer_release(&saved);
    sf_buffer_release(&resumed);
    rmdir(dir);

    /* no spill directory: the budget runs out and the run fails with a clear message */
    sf_buffer junk = {0};
    g = check_graph(m, "segment ! embed ! block state_budget=49152 ! norm");
    CHECK(g != NULL);
    if (g) {
        int rc = feed(g, 0, ROUNDS, &junk);
        CHECKF(rc == SF_E_BUDGET, "rc %d", rc);
        CHECK(strstr(sf_last_error(), "budget") != NULL);
    }
    sf_graph_free(g);
    sf_buffer_release(&junk);
    sf_graph *bad = NULL;
    CHECK_OK(sf_graph_create(m, NULL, &bad));
    CHECK(sf_graph_parse(bad, "segment ! embed ! block spill=/tmp ! norm") != SF_OK ||
          sf_graph_push(bad, 1, (const uint32_t[]){1}, 1) != SF_OK);
    sf_graph_free(bad);

    sf_buffer_release(&want);
    sf_buffer_release(&got);
    sf_model_free(m);
    test_binary();
    return check_finish("test_block_state_budget");
}
