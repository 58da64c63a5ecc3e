/* Built-in stages one at a time: segment boundaries, flush and end of stream; the embed
 * vocabulary check; sinks (raw, npy, digest) and the threaded scheduler with a source. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "seqflow/seqflow.h"
#include "support/check.h"

static void check_segmenter(void)
{
    sf_graph *g;
    CHECK_OK(sf_graph_create(NULL, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment length=4"));
    uint32_t t[11];
    for (int i = 0; i < 11; i++) t[i] = (uint32_t)i;
    CHECK_OK(sf_graph_push(g, 3, t, 3));
    CHECK(sf_graph_pull(g) == NULL); /* nothing complete yet */
    CHECK_OK(sf_graph_flush(g, 3));
    sf_packet *p = sf_graph_pull(g);
    CHECK(p && p->kind == SF_PACKET_SEGMENT && p->n == 3 && (p->flags & SF_PACKET_PROVISIONAL) && p->segment == 0);
    sf_packet_free(p);
    CHECK_OK(sf_graph_push(g, 3, t + 3, 8));
    uint64_t expect_segment = 0;
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        p = sf_graph_pull(g);
        ok &= p && p->n == 4 && p->segment == expect_segment && p->position == 4 * expect_segment &&
              p->tokens[0] == 4 * expect_segment && p->stream == 3 && p->flags == 0;
        expect_segment++;
        sf_packet_free(p);
    }
    CHECK(ok);
    CHECK(sf_graph_pull(g) == NULL);
    CHECK_OK(sf_graph_end(g, 3));
    p = sf_graph_pull(g);
    CHECK(p && p->n == 3 && p->segment == 2 && p->position == 8 && p->tokens[2] == 10 && (p->flags & SF_PACKET_FINAL));
    sf_packet_free(p);
    /* a stream ending on a boundary still gets its (empty) final packet */
    CHECK_OK(sf_graph_push(g, 4, t, 4));
    CHECK_OK(sf_graph_end(g, 4));
    p = sf_graph_pull(g);
    CHECK(p && p->n == 4 && p->flags == 0);
    sf_packet_free(p);
    p = sf_graph_pull(g);
    CHECK(p && p->n == 0 && (p->flags & SF_PACKET_FINAL));
    sf_packet_free(p);
    sf_graph_free(g);

    /* bounded streams */
    CHECK_OK(sf_graph_create(NULL, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment length=4 max_streams=2"));
    CHECK_OK(sf_graph_push(g, 1, t, 1));
    CHECK_OK(sf_graph_push(g, 2, t, 1));
    CHECK(sf_graph_push(g, 3, t, 1) == SF_E_NOMEM);
    CHECK(strstr(sf_last_error(), "max_streams") != NULL);
    sf_graph_free(g);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void check_threaded_run(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const char *in = check_tmp_path("in.txt"), *raw = check_tmp_path("run.f32"), *digest = check_tmp_path("digest.txt");
    FILE *f = fopen(in, "w");
    for (int i = 0; i < 1000; i++) fprintf(f, "%d%c", (i * 37) % c->vocab, i % 10 ? ' ' : '\n');
    fclose(f);
    char pipeline[1024];
    snprintf(pipeline, sizeof pipeline,
             "source path=%s format=text chunk=100 ! segment ! embed ! block ! norm ! sink out=%s", in, raw);
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, &(sf_graph_options){.queue_depth = 1}, &g));
    CHECK_OK(sf_graph_parse(g, pipeline));
    CHECK_OK(sf_graph_run(g));
    CHECK(sf_graph_tokens_out(g) == 1000);
    CHECK(file_size(raw) == 1000L * c->dim * 4);
    /* each stage's work: the source's 10 chunks of 100; 1000 tokens in segments of N; the
     * block's seconds, not the source's, are the run's (the source waits for room downstream,
     * which is not counted) */
    sf_stage_stats st[6];
    for (int i = 0; i < 6; i++) CHECK_OK(sf_graph_stage_stats(g, i, &st[i]));
    const uint64_t segments = (uint64_t)((1000 + c->segment - 1) / c->segment);
    CHECKF(st[0].packets >= 10 && st[1].packets >= 10, "source %llu, segment %llu packets",
           (unsigned long long)st[0].packets, (unsigned long long)st[1].packets);
    CHECKF(st[3].packets == segments && st[5].packets == segments, "block %llu, sink %llu packets, %llu segments",
           (unsigned long long)st[3].packets, (unsigned long long)st[5].packets, (unsigned long long)segments);
    CHECKF(st[3].busy_seconds > 0 && st[3].busy_seconds > st[0].busy_seconds,
           "block busy %.6f s, source %.6f s", st[3].busy_seconds, st[0].busy_seconds);
    CHECK(sf_graph_stage_stats(g, 6, &st[0]) == SF_E_INVAL);
    sf_graph_free(g);

    /* the digest of the same run, twice: deterministic */
    char line[2][256] = {{0}};
    for (int rep = 0; rep < 2; rep++) {
        snprintf(pipeline, sizeof pipeline,
                 "source path=%s format=text ! segment ! embed ! block ! norm ! sink format=digest out=%s", in, digest);
        CHECK_OK(sf_graph_create(m, NULL, &g));
        CHECK_OK(sf_graph_parse(g, pipeline));
        CHECK_OK(sf_graph_run(g));
        sf_graph_free(g);
        f = fopen(digest, "r");
        CHECK(f && fgets(line[rep], sizeof line[rep], f));
        if (f) fclose(f);
    }
    CHECK(strstr(line[0], "rows=1000") != NULL);
    CHECK(strcmp(line[0], line[1]) == 0);

    /* one thread per layer gives the same bytes as one stage for every layer */
    char split[256] = {0};
    snprintf(pipeline, sizeof pipeline,
             "source path=%s format=text chunk=50 ! segment ! embed ! block layers=0 ! block layers=1 ! norm ! "
             "sink format=digest out=%s",
             in, digest);
    CHECK_OK(sf_graph_create(m, &(sf_graph_options){.queue_depth = 2}, &g));
    CHECK_OK(sf_graph_parse(g, pipeline));
    CHECK_OK(sf_graph_run(g));
    sf_graph_free(g);
    f = fopen(digest, "r");
    CHECK(f && fgets(split, sizeof split, f));
    if (f) fclose(f);
    CHECKF(strcmp(line[0], split) == 0, "split layers: %s vs %s", split, line[0]);

    /* an error in the middle of a threaded run stops every stage and removes the output */
    f = fopen(in, "a");
    fprintf(f, " 5 6 %d 7\n", c->vocab + 3);
    fclose(f);
    remove(raw);
    snprintf(pipeline, sizeof pipeline, "source path=%s format=text chunk=64 ! segment ! embed ! block ! norm ! sink out=%s",
             in, raw);
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, pipeline));
    CHECK(sf_graph_run(g) == SF_E_TOKEN);
    CHECKF(strstr(sf_graph_error(g), "embed: token id") != NULL, "%s", sf_graph_error(g));
    CHECK(file_size(raw) < 0);
    sf_graph_free(g);
}

/* The hidden states of one whole stream of n tokens pushed as stream `id` (all packets pulled
 * into out, n * D floats). */
static void run_stream(sf_graph *g, uint64_t id, const uint32_t *t, size_t n, float *out, size_t dim)
{
    CHECK_OK(sf_graph_push(g, id, t, n));
    CHECK_OK(sf_graph_end(g, id));
    size_t rows = 0;
    for (sf_packet *p; (p = sf_graph_pull(g)) != NULL; sf_packet_free(p)) {
        CHECK(p->stream == id && rows + p->n <= n);
        if (p->stream == id && rows + p->n <= n) memcpy(out + rows * dim, p->x, p->n * dim * sizeof(float));
        rows += p->n;
    }
    CHECK(rows == n);
}

/* A block keeps the states of ended streams for new ones: a stream started after others ended
 * must see fresh memory and an empty global-token FIFO, exactly as the first stream did. */
static void check_stream_reuse(const sf_model *m)
{
    const sf_model_config *cfg = sf_model_get_config(m);
    const size_t n = 3 * (size_t)cfg->segment + 5, dim = (size_t)cfg->dim;
    uint32_t *t = malloc(n * sizeof *t);
    float *first = malloc(n * dim * sizeof *first), *later = malloc(n * dim * sizeof *later);
    CHECK(t && first && later);
    if (!t || !first || !later) goto done;
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)((i * 7 + 3) % 251);
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
    run_stream(g, 1, t, n, first, dim);
    for (uint64_t id = 2; id < 8; id++) {
        /* other content in between, so that a reused state is dirty */
        for (size_t i = 0; i < n; i++) t[i] = (uint32_t)((i * 13 + id) % 251);
        run_stream(g, id, t, n, later, dim);
    }
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)((i * 7 + 3) % 251);
    run_stream(g, 9, t, n, later, dim);
    CHECK(memcmp(first, later, n * dim * sizeof(float)) == 0);
    sf_graph_free(g);
done:
    free(t);
    free(first);
    free(later);
}

int main(void)
{
    check_segmenter();
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.segment = 64, cfg.layers = 2;
    CHECK_OK(sf_branches_parse("16:1,64:4", &cfg));
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, 11, &m));
    /* embed refuses ids outside the vocabulary, naming the position */
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed"));
    uint32_t bad[3] = {1, 2, 256};
    CHECK(sf_graph_push(g, 0, bad, 3) == SF_OK); /* not yet a segment */
    CHECK(sf_graph_end(g, 0) == SF_E_TOKEN);
    CHECKF(strstr(sf_last_error(), "position 2") != NULL, "%s", sf_last_error());
    CHECK(sf_graph_push(g, 0, bad, 1) == SF_E_TOKEN); /* a failed graph stays failed */
    sf_graph_free(g);
    check_threaded_run(m);
    cfg.global_tokens = 4, cfg.summary_tokens = 2;
    sf_model *mg;
    CHECK_OK(sf_model_create_random(&cfg, 12, &mg));
    check_stream_reuse(mg);
    sf_model_free(mg);
    sf_model_free(m);
    return check_finish("test_stages");
}
