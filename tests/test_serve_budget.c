/* seqflow serve's send budget (pipeline/serve.h, pipeline/serve_send.c): the ROWS handed to
 * ZeroMQ without a copy and not yet written stay under the budget plus one message, as /metrics
 * reports them, whatever the clients do:
 *  - a client that stops reading but stays connected (it sends PING) holds at most half the
 *    budget plus one message; the server stops computing its streams (its tokens wait) while
 *    another client's streams run to their end, rows exact;
 *  - once that client closes its socket, ZeroMQ gives the buffers back (nothing left in flight)
 *    and its streams expire;
 *  - 64 streams on 64 connections with rows far larger than the budget all complete, rows exact
 *    (the buffers go back to the pool only once written: a buffer reused too early would change
 *    rows in flight);
 *  - a RESUME on a fresh connection gets the kept rows again under the budget, a few at a time,
 *    in order and before the stream's new rows. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include "core/process_stats.h"
#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"
#include "state/checkpoint.h"
#include "support/check.h"

#define PIPELINE "segment ! embed ! norm"
#define MAX_SEGS 64

static void *zctx;

/* ---- a server on its thread, its /metrics ------------------------------------------------ */

typedef struct server {
    sf_model *model;
    sf_graph *graph;
    sf_serve *serve;
    pthread_t thread;
    int rc, port, seg;
    char endpoint[256];
} server;

static void *serve_main(void *arg)
{
    server *v = arg;
    v->rc = sf_serve_run(v->serve);
    return NULL;
}

/* The built-in model's embedding and norm at D = dim, N = seg; a server with that budget (and
 * checkpoints in ckpt, unless NULL). */
static int server_start(server *v, int dim, int seg, uint64_t budget, double idle_s, const char *sock, const char *ckpt)
{
    memset(v, 0, sizeof *v);
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.dim = dim;
    cfg.layers = 1;
    cfg.segment = seg;
    cfg.mlp_hidden = 64;
    CHECK_OK(sf_branches_parse("64:1,128:2,256:4", &cfg));
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &v->model));
    if (!v->model) return 0;
    sf_graph_options go = {.threads = 1};
    CHECK_OK(sf_graph_create(v->model, &go, &v->graph));
    CHECK_OK(sf_graph_parse(v->graph, PIPELINE));
    snprintf(v->endpoint, sizeof v->endpoint, "ipc://%s", check_tmp_path(sock));
    sf_serve_options so = {.bind = v->endpoint, .http = "tcp://127.0.0.1:*", .plaintext = 1, .idle_timeout = idle_s,
                           .send_budget = budget, .io_threads = 2, .checkpoint_dir = ckpt};
    CHECK_OK(sf_serve_create(v->graph, sf_model_get_config(v->model), &so, &v->serve));
    if (!v->serve) return 0;
    char http[256];
    CHECK_OK(sf_serve_endpoint(v->serve, 1, http, sizeof http));
    const char *colon = strrchr(http, ':');
    v->port = colon ? atoi(colon + 1) : -1;
    v->seg = seg;
    pthread_create(&v->thread, NULL, serve_main, v);
    return 1;
}

static void server_stop(server *v)
{
    if (v->serve) {
        sf_serve_stop(v->serve);
        pthread_join(v->thread, NULL);
        CHECK(v->rc == SF_OK);
    }
    sf_serve_free(v->serve);
    sf_graph_free(v->graph);
    sf_model_free(v->model);
}

/* A metric's value from GET /metrics (served by the server's loop, between its steps); -1 when
 * it cannot be read. */
static double metric(const server *v, const char *name)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)v->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    static char page[1 << 16];
    size_t got = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "GET /metrics HTTP/1.0\r\n\r\n", 25) == 25) {
        ssize_t r;
        while (got + 1 < sizeof page && (r = read(fd, page + got, sizeof page - 1 - got)) > 0) got += (size_t)r;
    }
    close(fd);
    page[got] = '\0';
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(page, key);
    return at ? strtod(at + strlen(key), NULL) : -1;
}

/* ---- clients -------------------------------------------------------------------------------- */

typedef struct tstream {
    uint64_t id;
    int segs, got, closed, bad;
    uint32_t *tokens;
    uint64_t ref[MAX_SEGS]; /* hash of each segment's rows in one-process push mode */
} tstream;

static void csend(void *d, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len)
{
    sf_buffer m = {0};
    sf_serve_encode(&m, type, stream, a, b, payload, len);
    zmq_send(d, m.data, m.len, 0);
    sf_buffer_release(&m);
}

static void *dealer(const char *endpoint, int stuck)
{
    void *d = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0, one = 1, small = 4096;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    if (stuck) { /* its I/O thread stops reading once one message waits: the rows stay with the server */
        zmq_setsockopt(d, ZMQ_RCVHWM, &one, sizeof one);
        zmq_setsockopt(d, ZMQ_RCVBUF, &small, sizeof small);
    }
    zmq_connect(d, endpoint);
    return d;
}

/* Random tokens and the hash of each segment's rows through a graph of the server's model. */
static void make_stream(const server *v, tstream *t, uint64_t id, int segs, check_rng *rng)
{
    memset(t, 0, sizeof *t);
    t->id = id;
    t->segs = segs;
    const size_t n = (size_t)segs * (size_t)v->seg;
    t->tokens = malloc(n * sizeof *t->tokens);
    for (size_t i = 0; i < n; i++) t->tokens[i] = (uint32_t)(check_rng_next(rng) % 256);
    sf_graph *g;
    sf_graph_options go = {.threads = 1};
    CHECK_OK(sf_graph_create(v->model, &go, &g));
    CHECK_OK(sf_graph_parse(g, PIPELINE));
    CHECK_OK(sf_graph_push(g, id, t->tokens, n));
    CHECK_OK(sf_graph_end(g, id));
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p))
        if (p->n && p->position % (uint64_t)v->seg == 0 && p->position / (uint64_t)v->seg < MAX_SEGS)
            t->ref[p->position / (uint64_t)v->seg] = XXH64(p->x, p->n * p->width * sizeof(float), 0);
    sf_graph_free(g);
}

/* Segments [from, to) as one PUSH each, then CLOSE unless keep_open. */
static void push_range(void *d, const server *v, const tstream *t, int from, int to, int keep_open)
{
    uint8_t *payload = malloc(4 * (size_t)v->seg);
    for (int k = from; k < to; k++) {
        const uint32_t *tok = t->tokens + (size_t)k * (size_t)v->seg;
        for (int i = 0; i < v->seg; i++)
            payload[4 * i] = (uint8_t)tok[i], payload[4 * i + 1] = payload[4 * i + 2] = payload[4 * i + 3] = 0;
        csend(d, SF_SERVE_PUSH, t->id, (uint64_t)k * (uint64_t)v->seg, (uint64_t)v->seg, payload, 4 * (size_t)v->seg);
    }
    free(payload);
    if (!keep_open) csend(d, SF_SERVE_CLOSE, t->id, 0, 0, NULL, 0);
}

/* OPEN with credit, every segment as one PUSH, CLOSE unless keep_open. */
static void push_stream(void *d, const server *v, const tstream *t, int credit, int keep_open)
{
    csend(d, SF_SERVE_OPEN, t->id, (uint64_t)credit, 0, NULL, 0);
    push_range(d, v, t, 0, t->segs, keep_open);
}

/* Takes the messages waiting on d for its streams: each ROWS checked against the reference (in
 * order, exact) and answered with CREDIT 1 (acknowledging no row: a resumable stream's server
 * keeps them all). Returns the longest message seen. */
static size_t take(void *d, tstream *ts, int n, const server *v)
{
    size_t longest = 0;
    sf_buffer whole = {0}; /* the message: its frames one after the other (protocol version 3) */
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, d, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            sf_buffer_release(&whole);
            return longest;
        }
        whole.len = 0;
        for (int more = 1; more;) {
            if (sf_buffer_append(&whole, zmq_msg_data(&m), zmq_msg_size(&m)) != SF_OK) ts[0].bad++;
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
            zmq_msg_init(&m);
            if (more && zmq_msg_recv(&m, d, 0) < 0) more = 0, ts[0].bad++;
        }
        zmq_msg_close(&m);
        size_t len = whole.len;
        if (len > longest) longest = len;
        sf_serve_msg msg;
        tstream *t = NULL;
        int ok = sf_serve_decode(whole.data, len, 1 << 20, &msg) == SF_OK;
        for (int i = 0; ok && i < n; i++)
            if (ts[i].id == msg.stream) t = &ts[i];
        if (!t) {
            fprintf(stderr, "a message for no stream of this client\n");
            ts[0].bad++;
        } else if (msg.type == SF_SERVE_ROWS) {
            sf_packet *p = NULL;
            int good = sf_wire_decode(msg.payload, msg.payload_len, 1 << 26, &p) == SF_OK;
            if (good && p->n) {
                good = p->position == (uint64_t)t->got * (uint64_t)v->seg && t->got < t->segs &&
                       XXH64(p->x, p->n * p->width * sizeof(float), 0) == t->ref[t->got];
                t->got++;
            }
            t->bad += !good;
            sf_packet_free(p);
            csend(d, SF_SERVE_CREDIT, t->id, 1, 0, NULL, 0);
        } else if (msg.type == SF_SERVE_CLOSED) {
            t->closed = 1;
        } else if (msg.type != SF_SERVE_OPENED && msg.type != SF_SERVE_PONG && msg.type != SF_SERVE_DURABLE) {
            fprintf(stderr, "unexpected %s on stream %llu\n", sf_serve_type_name(msg.type), (unsigned long long)msg.stream);
            t->bad++;
        }
    }
}

static void wait_readable(void **socks, int n, long ms)
{
    zmq_pollitem_t items[64];
    for (int i = 0; i < n; i++) items[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
    zmq_poll(items, n, ms);
}

/* ---- a client that stops reading ----------------------------------------------------------- */

#define STUCK_STREAMS 4
#define STUCK_SEGS 32

static void stuck_client(void)
{
    const uint64_t budget = 1 << 20; /* 4 ROWS of 256 x 256 floats */
    server v;
    if (!server_start(&v, 256, 256, budget, 3.0, "budget-stuck.sock", NULL)) return;
    check_rng rng = {7};
    tstream f1, f2, stuck[STUCK_STREAMS];
    make_stream(&v, &f1, 1, 48, &rng);
    make_stream(&v, &f2, 2, 16, &rng);
    for (int i = 0; i < STUCK_STREAMS; i++) make_stream(&v, &stuck[i], 100 + (uint64_t)i, STUCK_SEGS, &rng);

    /* a reading client first, so that the other one arrives while rows flow */
    void *fast = dealer(v.endpoint, 0), *slow = dealer(v.endpoint, 1);
    push_stream(fast, &v, &f1, 4, 0);
    size_t longest = 0, l;
    double until = sf_monotonic_seconds() + 20;
    while (f1.got < 4 && sf_monotonic_seconds() < until) {
        wait_readable(&fast, 1, 100);
        if ((l = take(fast, &f1, 1, &v)) > longest) longest = l;
    }
    CHECK(f1.got >= 4);
    for (int i = 0; i < STUCK_STREAMS; i++) push_stream(slow, &v, &stuck[i], 64, 1);

    /* it sends PING and reads nothing; the reading client's two streams run to their end */
    double worst = 0, next_ping = 0;
    tstream *now = &f1;
    void *sock = fast;
    for (until = sf_monotonic_seconds() + 30; sf_monotonic_seconds() < until;) {
        wait_readable(&sock, 1, 50);
        if ((l = take(sock, now, 1, &v)) > longest) longest = l;
        if (sf_monotonic_seconds() >= next_ping) {
            csend(slow, SF_SERVE_PING, 0, 1, 0, NULL, 0);
            next_ping = sf_monotonic_seconds() + 0.2;
            double in_flight = metric(&v, "seqflow_serve_send_bytes_in_flight");
            if (in_flight > worst) worst = in_flight;
        }
        if (now == &f1 && f1.closed) { /* then a second stream, on a fresh connection */
            now = &f2;
            sock = dealer(v.endpoint, 0);
            push_stream(sock, &v, &f2, 4, 0);
        } else if (now == &f2 && f2.closed) {
            break;
        }
    }
    CHECKF(f1.closed && f1.got == f1.segs && !f1.bad, "stream 1: %d of %d segments, %d wrong, closed %d", f1.got,
           f1.segs, f1.bad, f1.closed);
    CHECKF(f2.closed && f2.got == f2.segs && !f2.bad, "stream 2 (while a client does not read): %d of %d segments, "
           "%d wrong, closed %d", f2.got, f2.segs, f2.bad, f2.closed);
    const double msg = (double)longest, peak = metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
    const double held = metric(&v, "seqflow_serve_send_bytes_in_flight");
    CHECKF(msg > 256 * 256 * 4 && peak > 0 && peak <= (double)budget + msg && worst <= (double)budget + msg,
           "peak %.0f bytes in flight (seen %.0f) for a budget of %llu and messages of %.0f", peak, worst,
           (unsigned long long)budget, msg);
    /* what the silent reader holds: at most half the budget and a message; its tokens wait */
    CHECKF(held > 0 && held <= (double)budget / 2 + msg, "%.0f bytes in flight for a client that reads nothing", held);
    sf_serve_stats st;
    sf_serve_get_stats(v.serve, &st);
    const uint64_t all = (uint64_t)(f1.segs + f2.segs + STUCK_STREAMS * STUCK_SEGS) * 256;
    CHECKF(st.tokens_out < all - STUCK_STREAMS * STUCK_SEGS * 256 / 2, "%llu of %llu rows computed: the server did not "
           "stop for the client that reads nothing", (unsigned long long)st.tokens_out, (unsigned long long)all);
    CHECK(metric(&v, "seqflow_serve_pending_tokens") > 0);

    /* gone now: ZeroMQ drops the rows queued for the connection and gives their buffers back
     * (a client that neither reads nor closes keeps them: ZeroMQ's heartbeat waits behind the
     * message it is stuck in, docs/SERVE.md) */
    zmq_close(slow);
    until = sf_monotonic_seconds() + 15;
    while (metric(&v, "seqflow_serve_send_bytes_in_flight") != 0 && sf_monotonic_seconds() < until) usleep(100000);
    CHECKF(metric(&v, "seqflow_serve_send_bytes_in_flight") == 0, "bytes still in flight for a dropped client");
    until = sf_monotonic_seconds() + 15;
    do {
        usleep(100000);
        sf_serve_get_stats(v.serve, &st);
    } while (st.streams_expired < STUCK_STREAMS && sf_monotonic_seconds() < until);
    CHECKF(st.streams_expired == STUCK_STREAMS && st.streams == 0, "expired %llu, open %u",
           (unsigned long long)st.streams_expired, st.streams);
    zmq_close(fast);
    if (sock != fast) zmq_close(sock);
    server_stop(&v);
    free(f1.tokens), free(f2.tokens);
    for (int i = 0; i < STUCK_STREAMS; i++) free(stuck[i].tokens);
}

/* ---- many streams, rows far beyond the budget ------------------------------------------------ */

#define MANY 64
#define MANY_SEGS 4

static void many_streams(void)
{
    const uint64_t budget = 4 << 20; /* 4 ROWS of 512 x 512 floats; 64 streams want 512 */
    server v;
    if (!server_start(&v, 512, 512, budget, 30.0, "budget-many.sock", NULL)) return;
    check_rng rng = {11};
    static tstream ts[MANY];
    void *socks[MANY];
    for (int i = 0; i < MANY; i++) make_stream(&v, &ts[i], 1000 + (uint64_t)i, MANY_SEGS, &rng);
    for (int i = 0; i < MANY; i++) socks[i] = dealer(v.endpoint, 0);
    for (int i = 0; i < MANY; i++) push_stream(socks[i], &v, &ts[i], 8, 0);
    size_t longest = 0, l;
    int closed = 0;
    for (double until = sf_monotonic_seconds() + 45; closed < MANY && sf_monotonic_seconds() < until;) {
        wait_readable(socks, MANY, 100);
        closed = 0;
        for (int i = 0; i < MANY; i++) {
            if ((l = take(socks[i], &ts[i], 1, &v)) > longest) longest = l;
            closed += ts[i].closed;
        }
    }
    int exact = 0;
    for (int i = 0; i < MANY; i++) exact += ts[i].closed && ts[i].got == MANY_SEGS && !ts[i].bad;
    CHECKF(exact == MANY, "%d of %d streams complete and exact (%d closed)", exact, MANY, closed);
    const double peak = metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
    CHECKF(peak > 0 && peak <= (double)budget + (double)longest, "peak %.0f bytes in flight, budget %llu, messages of %zu",
           peak, (unsigned long long)budget, longest);
    CHECK(metric(&v, "seqflow_serve_send_budget_bytes") == (double)budget);
    CHECK(metric(&v, "seqflow_serve_io_threads") == 2);
    for (int i = 0; i < MANY; i++) {
        zmq_close(socks[i]);
        free(ts[i].tokens);
    }
    server_stop(&v);
}

/* ---- RESUME: the kept rows again, under the budget ------------------------------------------ */

#define KEPT_SEGS 12
#define MORE_SEGS 4

static void resume_paced(void)
{
    const uint64_t budget = 1 << 20; /* 4 ROWS; the stream keeps 12 of them */
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s", check_tmp_path("budget-ckpt"));
    server v;
    if (!server_start(&v, 256, 256, budget, 30.0, "budget-resume.sock", ckpt)) return;
    check_rng rng = {13};
    tstream t;
    make_stream(&v, &t, 7, KEPT_SEGS + MORE_SEGS, &rng);
    /* the first connection gets 12 segments' rows and acknowledges none, then goes */
    void *first = dealer(v.endpoint, 0);
    csend(first, SF_SERVE_OPEN, t.id, 64, 0, NULL, 0);
    push_range(first, &v, &t, 0, KEPT_SEGS, 1);
    size_t longest = 0, l;
    for (double until = sf_monotonic_seconds() + 20; t.got < KEPT_SEGS && sf_monotonic_seconds() < until;) {
        wait_readable(&first, 1, 100);
        if ((l = take(first, &t, 1, &v)) > longest) longest = l;
    }
    CHECKF(t.got == KEPT_SEGS && !t.bad, "first connection: %d of %d segments, %d wrong", t.got, KEPT_SEGS, t.bad);
    zmq_close(first);
    /* a fresh one RESUMEs with no row: all 12 again, in order, then the new ones */
    void *again = dealer(v.endpoint, 0);
    t.got = 0;
    csend(again, SF_SERVE_RESUME, t.id, 64, 0, NULL, 0);
    push_range(again, &v, &t, KEPT_SEGS, KEPT_SEGS + MORE_SEGS, 0);
    for (double until = sf_monotonic_seconds() + 20; !t.closed && sf_monotonic_seconds() < until;) {
        wait_readable(&again, 1, 100);
        if ((l = take(again, &t, 1, &v)) > longest) longest = l;
    }
    CHECKF(t.closed && t.got == KEPT_SEGS + MORE_SEGS && !t.bad, "after RESUME: %d of %d segments, %d wrong, closed %d",
           t.got, KEPT_SEGS + MORE_SEGS, t.bad, t.closed);
    const double peak = metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
    CHECKF(peak > 0 && peak <= (double)budget + (double)longest, "peak %.0f bytes in flight, budget %llu, messages of %zu",
           peak, (unsigned long long)budget, longest);
    zmq_close(again);
    server_stop(&v);
    sf_checkpoint_clear(ckpt);
    rmdir(ckpt);
    free(t.tokens);
}

int main(void)
{
    zctx = zmq_ctx_new();
    stuck_client();
    many_streams();
    resume_paced();
    zmq_ctx_term(zctx);
    return check_finish("test_serve_budget");
}
