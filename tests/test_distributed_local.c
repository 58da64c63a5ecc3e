/* Distributed runs in one process: every "rank" is a graph on its own thread, the links between
 * ranks queues of an sf_dist_exchange. Layer pipelines over 2 and 3 ranks, stream-parallel
 * groups over 2 and 3 replicas (the driver among them or not) and the two combined must give
 * the single-process output byte for byte (CPU, float32), for several streams with partial,
 * provisional and final segments. Checkpoints cross the ranks: a run cut short by a failing
 * link, resumed from its newest checkpoint (each rank handed its share), ends with the same
 * bytes. Bad placements are refused naming the stage. Head ranks as "processes" (block
 * head_ranks=: the host communicator over the exchange, the network communicator over real
 * links) give the bytes of the same heads_of= on threads of one graph, also resumed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/comm_net.h"
#include "pipeline/distributed.h"
#include "pipeline/net.h"
#include "state/checkpoint.h"
#include "support/check.h"
#include "support/small_model.h"

enum { STREAMS = 5, ROUNDS = 7, SEGMENT = 8, MAX_RANKS = 5, ITEMS = STREAMS * ROUNDS };

/* ---- the feed: a source of a fixed script of multi-stream packets ---------------------- */

typedef struct feed {
    int at;         /* next script item */
    int marked;     /* a marker follows item at-1 already */
} feed;

static uint32_t token(int s, int r, int i) { return (uint32_t)((s * 97 + r * 31 + i * 13 + i * i) % 50); }

static int feed_init(sf_stage *st)
{
    feed *f = calloc(1, sizeof *f);
    if (!f) return SF_E_NOMEM;
    sf_stage_set_priv(st, f);
    return SF_OK;
}

/* Item k: round k / STREAMS, stream k % STREAMS: a chunk of tokens (a FLUSH now and then), the
 * stream's FINAL packet in the last round. A checkpoint marker every 4 items. */
static int feed_generate(sf_stage *st)
{
    feed *f = sf_stage_priv(st);
    if (f->at == ITEMS) return 0;
    if (sf_stage_checkpoint_every(st) && f->at % 4 == 0 && f->at && !f->marked) {
        f->marked = 1;
        int rc = sf_stage_emit_checkpoint(st);
        return rc == SF_OK ? 1 : rc;
    }
    const int s = f->at % STREAMS, r = f->at / STREAMS;
    f->at++;
    f->marked = 0;
    const int n = (s + r) % 4 == 0 ? 3 + s : SEGMENT * (1 + (s + r) % 2) + (r % 3 == 1 ? 5 : 0);
    const int kind = (s * 3 + r) % 5 == 0 ? SF_PACKET_FLUSH : SF_PACKET_TOKENS;
    sf_packet *p = sf_packet_new(kind, (size_t)n, 0);
    if (!p) return SF_E_NOMEM;
    p->stream = (uint64_t)s * 11 + 3;
    p->n = (size_t)n;
    for (int i = 0; i < n; i++) p->tokens[i] = token(s, r, i);
    if (r == ROUNDS - 1) p->flags |= SF_PACKET_FINAL;
    int rc = sf_stage_emit(st, p);
    return rc == SF_OK ? 1 : rc;
}

static int feed_save(sf_stage *st, sf_buffer *out)
{
    feed *f = sf_stage_priv(st);
    int32_t v[2] = {f->at, f->marked};
    return sf_buffer_append(out, v, sizeof v);
}

static int feed_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    feed *f = sf_stage_priv(st);
    int32_t v[2];
    if (len != sizeof v) return sf_error(SF_E_STATE, "feed state");
    memcpy(v, data, sizeof v);
    f->at = v[0];
    f->marked = v[1];
    return SF_OK;
}

static void feed_free(sf_stage *st) { free(sf_stage_priv(st)); }

static const sf_stage_class feed_class = {.name = "feed", .help = "test script", .init = feed_init,
                                          .generate = feed_generate, .save = feed_save, .restore = feed_restore,
                                          .free = feed_free};

/* ---- the collector: a sink into one growing byte string --------------------------------- */

typedef struct bytes {
    uint8_t *data;
    size_t len, cap;
} bytes;

static bytes collected; /* what the driver's sink received; the "output file" across runs */

static void put(bytes *b, const void *v, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = 2 * (b->len + n) + 4096;
        b->data = realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, v, n);
    b->len += n;
}

/* A fresh start replaces the output, a resume keeps it (restore truncates it). */
static int collect_init(sf_stage *st)
{
    if (!sf_stage_resuming(st)) collected.len = 0;
    return SF_OK;
}

static int collect_process(sf_stage *st, sf_packet *p)
{
    (void)st;
    uint64_t head[5] = {p->kind, p->flags, p->stream, p->position, p->n};
    put(&collected, head, sizeof head);
    if (p->x) put(&collected, p->x, p->n * p->width * sizeof(float));
    sf_packet_free(p);
    return SF_OK;
}

static int collect_save(sf_stage *st, sf_buffer *out)
{
    (void)st;
    uint64_t len = collected.len;
    return sf_buffer_append(out, &len, sizeof len);
}

static int collect_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    (void)st;
    uint64_t at;
    if (len != sizeof at) return sf_error(SF_E_STATE, "collect state");
    memcpy(&at, data, sizeof at);
    if (at > collected.len) return sf_error(SF_E_STATE, "collected output shorter than the checkpoint's");
    collected.len = (size_t)at; /* as the sink truncates OUT.partial */
    return SF_OK;
}

static const sf_stage_class collect_class = {.name = "collect", .help = "test sink", .init = collect_init, .process = collect_process,
                                             .save = collect_save, .restore = collect_restore, .terminal = 1};

/* ---- runs ----------------------------------------------------------------------------------- */

static sf_model *model;
static const char *ckpt_dir;

/* feed ! BODY ! collect. */
static sf_graph *make_graph(const char *body)
{
    sf_graph_options o = {.threads = 1, .queue_depth = 2};
    sf_graph *g = NULL;
    if (sf_graph_create(model, &o, &g) != SF_OK) return NULL;
    if (sf_graph_add_class(g, &feed_class, NULL, NULL) != SF_OK || sf_graph_parse(g, body) != SF_OK ||
        sf_graph_add_class(g, &collect_class, NULL, NULL) != SF_OK) {
        fprintf(stderr, "%s\n", sf_last_error());
        sf_graph_free(g);
        return NULL;
    }
    return g;
}

typedef struct rank_run {
    sf_graph *g;
    int rc;
    char error[512];
} rank_run;

static void *free_rank(void *arg)
{
    sf_graph_free(((rank_run *)arg)->g);
    return NULL;
}

static void *run_rank(void *arg)
{
    rank_run *r = arg;
    r->rc = sf_graph_run(r->g);
    snprintf(r->error, sizeof r->error, "%s", sf_graph_error(r->g));
    return NULL;
}

typedef struct job {
    int world;
    int network;    /* real network links (ipc://, plaintext) instead of the exchange */
    int checkpoint, resume;
    int fail_sender, fail_channel, fail_after; /* fail_after 0: no failure */
} job;

static int net_factory(void *user, int peer, uint32_t channel, int direction, sf_link **out)
{
    return sf_net_link_create(user, peer, channel, direction == SF_DIST_SEND ? SF_NET_SEND : SF_NET_RECV, NULL, out);
}

static int net_comm(void *user, const int *ranks, int n, int index, uint32_t channel_base, int timeout_ms,
                    sf_comm **out)
{
    return sf_comm_net_create_group(user, ranks, n, index, channel_base, NULL, NULL, timeout_ms, out);
}

/* One sf_net per rank, every other rank a peer, on ipc:// endpoints under the test folder. */
static int make_nets(int world, sf_net **nets)
{
    static char endpoints[MAX_RANKS][256];
    sf_net_peer peers[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        snprintf(endpoints[r], sizeof endpoints[r], "ipc://%s", check_tmp_path(r == 0 ? "dl-net0" : r == 1 ? "dl-net1"
                                                                              : r == 2 ? "dl-net2" : r == 3 ? "dl-net3" : "dl-net4"));
    }
    int rc = SF_OK;
    for (int r = 0; r < world && rc == SF_OK; r++) {
        int n = 0;
        for (int q = 0; q < world; q++)
            if (q != r) peers[n++] = (sf_net_peer){q, endpoints[q], NULL, "local"};
        sf_net_options o = {.rank = r, .bind = endpoints[r], .plaintext = 1, .peers = peers, .n_peers = n};
        rc = sf_net_create(&o, &nets[r]);
    }
    return rc;
}

/* Runs body over job->world ranks; returns rank 0's status (every rank must agree on failure). */
static int run_job(const char *body, const job *jb, char *error, size_t error_size)
{
    sf_dist_exchange *x = NULL;
    CHECK_OK(sf_dist_exchange_create(jb->world, 2, &x));
    if (jb->fail_after) sf_dist_exchange_fail_after(x, jb->fail_sender, (uint32_t)jb->fail_channel, (uint64_t)jb->fail_after);
    rank_run runs[MAX_RANKS] = {{0}};
    sf_net *nets[MAX_RANKS] = {0};
    int rc = jb->network ? make_nets(jb->world, nets) : SF_OK;
    for (int r = 0; r < jb->world && rc == SF_OK; r++) {
        runs[r].g = make_graph(body);
        if (!runs[r].g) rc = SF_E_PARSE;
        sf_dist_links links = jb->network ? (sf_dist_links){net_factory, nets[r], net_comm} : sf_dist_exchange_links(x, r);
        if (rc == SF_OK) rc = sf_dist_build(runs[r].g, jb->world, r, &links);
    }
    if (rc == SF_OK && jb->checkpoint) {
        sf_graph_checkpoint_options ck = {.dir = ckpt_dir, .every = 1, .keep = 3, .resume = jb->resume};
        rc = sf_graph_set_checkpoint(runs[0].g, &ck);
        const uint8_t *state = NULL;
        size_t len = 0;
        if (rc == SF_OK) rc = sf_dist_checkpoint_load(runs[0].g, &state, &len);
        for (int r = 1; r < jb->world && rc == SF_OK && state; r++) {
            sf_buffer share = {0};
            rc = sf_dist_rank_state(runs[0].g, state, len, r, &share);
            if (rc == SF_OK) rc = sf_dist_set_state(runs[r].g, share.data, share.len);
            sf_buffer_release(&share);
        }
    }
    if (rc != SF_OK) {
        snprintf(error, error_size, "%s", sf_last_error());
    } else {
        pthread_t threads[MAX_RANKS];
        for (int r = 0; r < jb->world; r++) pthread_create(&threads[r], NULL, run_rank, &runs[r]);
        for (int r = 0; r < jb->world; r++) pthread_join(threads[r], NULL);
        rc = runs[0].rc;
        snprintf(error, error_size, "%s", runs[0].error);
        /* after a failure, a rank that had finished its share may have ended cleanly */
        for (int r = 1; r < jb->world && rc == SF_OK; r++)
            CHECKF(runs[r].rc == SF_OK, "rank %d ended %d (%s), rank 0 well", r, runs[r].rc, runs[r].error);
    }
    /* each rank lets go of its graph on its own thread, as processes would: a closed network
     * link waits for its last acknowledgements */
    pthread_t threads[MAX_RANKS];
    for (int r = 0; r < jb->world; r++) pthread_create(&threads[r], NULL, free_rank, &runs[r]);
    for (int r = 0; r < jb->world; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < jb->world; r++) sf_net_free(nets[r]);
    sf_dist_exchange_free(x);
    return rc;
}

static bytes reference;

static void check_layout_on(const char *body, int world, int network)
{
    collected.len = 0;
    char error[512] = "";
    int rc = run_job(body, &(job){.world = world, .network = network}, error, sizeof error);
    CHECKF(rc == SF_OK, "'%s' over %d ranks%s: %s", body, world, network ? " (network)" : "", error);
    CHECKF(collected.len == reference.len && memcmp(collected.data, reference.data, reference.len) == 0,
           "'%s' over %d ranks%s: %zu bytes, differ from the single-process %zu", body, world, network ? " (network)" : "",
           collected.len, reference.len);
}

/* The exchange, then real network links (one sf_net per rank, all in this process; the
 * binary's tests, distributed_cli.sh, run them between processes). */
static void check_layout(const char *body, int world)
{
    check_layout_on(body, world, 0);
    check_layout_on(body, world, 1);
}

/* Fails the link of `sender` on `channel` after `after` packets, then resumes until done. */
static void check_resume(const char *body, int world, int sender, int channel, int after)
{
    sf_checkpoint_clear(ckpt_dir);
    collected.len = 0;
    char error[512] = "";
    job jb = {.world = world, .checkpoint = 1, .fail_sender = sender, .fail_channel = channel, .fail_after = after};
    int rc = run_job(body, &jb, error, sizeof error);
    CHECKF(rc != SF_OK, "'%s': the injected failure after %d packets went unnoticed", body, after);
    CHECKF(strstr(error, "injected failure") || strstr(error, "stopped"), "error: %s", error);
    uint64_t *seqs = NULL;
    size_t n = 0;
    CHECK_OK(sf_checkpoint_list(ckpt_dir, &seqs, &n));
    CHECKF(n > 0, "'%s': no checkpoint before the failure after %d packets", body, after);
    free(seqs);
    jb = (job){.world = world, .checkpoint = 1, .resume = 1};
    rc = run_job(body, &jb, error, sizeof error);
    CHECKF(rc == SF_OK, "'%s' resumed: %s", body, error);
    CHECKF(collected.len == reference.len && memcmp(collected.data, reference.data, reference.len) == 0,
           "'%s' resumed after a failure at %d: %zu bytes differ from the single-process %zu", body, after, collected.len,
           reference.len);
}

static void check_refused(const char *body, int world, const char *expect)
{
    char error[512] = "";
    int rc = run_job(body, &(job){.world = world}, error, sizeof error);
    CHECKF(rc != SF_OK && strstr(error, expect), "'%s': %d '%s', expected '%s'", body, rc, error, expect);
}

int main(void)
{
    sf_model_config cfg;
    check_small_model_config(&cfg, 3, SEGMENT, 4);
    CHECK_OK(sf_branches_parse("4:1,8:2", &cfg));
    CHECK_OK(sf_model_create_random(&cfg, 9, &model));
    static char dir[512]; /* check_tmp_path's buffers are reused */
    snprintf(dir, sizeof dir, "%s", check_tmp_path("distributed_local_ckpt"));
    ckpt_dir = dir;

    const char *single = "segment ! embed ! block layers=0-0 ! block layers=1-2 ! norm";
    char error[512] = "";
    CHECKF(run_job(single, &(job){.world = 1}, error, sizeof error) == SF_OK, "single process: %s", error);
    reference = collected;
    collected = (bytes){0};
    CHECKF(reference.len > 10000, "reference of %zu bytes", reference.len);

    check_layout("segment ! embed ! block layers=0-0 @1 ! block layers=1-2 @1 ! norm", 2);
    check_layout("segment ! embed @1 ! block layers=0-0 @1 ! block layers=1-2 @2 ! norm @2", 3);
    check_layout("segment @2 ! embed @1 ! block layers=0-0 @2 ! block layers=1-2 @1 ! norm", 3);
    check_layout("segment ! embed @1,2 ! block layers=0-0 @1,2 ! block layers=1-2 @1,2 ! norm @1,2", 3);
    check_layout("segment ! embed ! block layers=0-0 @0,1,2 ! block layers=1-2 @0,1,2 ! norm", 3);
    check_layout("segment @1 ! embed @1 ! block layers=0-0 @2,3,4 ! block layers=1-2 @2,3,4 ! norm @1", 5);
    /* layer pipeline and stream parallel together */
    check_layout("segment ! embed @1 ! block layers=0-0 @2,3 ! block layers=1-2 @1 ! norm", 4);
    check_layout("segment @1 ! embed @2,3 ! block layers=0-0 @1 ! block layers=1-2 @2,4 ! norm @1", 5);

    check_resume("segment ! embed @1 ! block layers=0-0 @1 ! block layers=1-2 @2 ! norm @2", 3, 1, 4, 40);
    check_resume("segment ! embed ! block layers=0-0 @1,2 ! block layers=1-2 @1,2 ! norm", 3, 2, 5, 20);
    check_resume("segment ! embed @1 ! block layers=0-0 @2,3 ! block layers=1-2 @1 ! norm", 4, 3, 4, 15);
    check_resume("segment ! embed @1 ! block layers=0-0 @2,3 ! block layers=1-2 @1 ! norm", 4, 1, 5, 50);

    /* head ranks that are other "processes": the bytes of heads_of=2 on threads of one graph */
    free(reference.data);
    reference = (bytes){0};
    collected.len = 0;
    const char *threads = "segment ! embed ! block layers=0-0 heads_of=2 ! block layers=1-2 heads_of=2 ! norm";
    CHECKF(run_job(threads, &(job){.world = 1}, error, sizeof error) == SF_OK, "heads on threads: %s", error);
    reference = collected;
    collected = (bytes){0};
    check_layout("segment ! embed ! block layers=0-0 head_ranks=0,1 ! block layers=1-2 head_ranks=1,0 ! norm", 2);
    check_layout("segment ! embed @1 ! block layers=0-0 head_ranks=2,1 ! block layers=1-2 head_ranks=0,2 @0 ! norm", 3);
    const char *heads = "segment ! embed ! block layers=0-0 head_ranks=1,2 ! block layers=1-2 head_ranks=2,0 ! norm";
    check_resume(heads, 3, 1, 4, 20);
    check_resume(heads, 3, 1, 0x48000003, 25); /* the work link to the following head rank */
    check_refused("segment ! embed ! block head_ranks=1,2 @2 ! norm", 3, "runs the stage on its first rank, 1");
    check_refused("segment ! embed ! block head_ranks=1,3 ! norm", 3, "the job has 3 ranks");
    check_refused("segment ! embed ! block head_ranks=1,1 ! norm", 3, "lists rank 1 twice");
    check_refused("segment ! embed ! block head_ranks=0,1 heads_of=4 ! norm", 2, "disagree");

    check_refused("segment @1,2 ! embed ! block ! norm", 3, "emit one packet per packet in");
    check_refused("segment ! embed ! block batch=2 @1,2 ! norm", 3, "batch=1");
    check_refused("segment ! embed @1,2 ! block @1 ! norm", 3, "must run there too");
    check_refused("segment ! embed @3 ! block ! norm", 3, "job has 3 ranks");
    check_refused("segment ! embed @1,2 ! block @2,3 ! norm", 4, "another replicated group");

    free(reference.data);
    free(collected.data);
    sf_model_free(model);
    return check_finish("test_distributed_local");
}
