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
#include "support/serve_harness.h"

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
    tstream_make(&v, &f1, 1, 48, &rng);
    tstream_make(&v, &f2, 2, 16, &rng);
    for (int i = 0; i < STUCK_STREAMS; i++) tstream_make(&v, &stuck[i], 100 + (uint64_t)i, STUCK_SEGS, &rng);

    /* a reading client first, so that the other one arrives while rows flow */
    void *fast = client_dealer(v.endpoint, 0), *slow = client_dealer(v.endpoint, 1);
    tstream_push(fast, &v, &f1, 4, 0);
    size_t longest = 0, l;
    double until = sf_monotonic_seconds() + 20;
    while (f1.got < 4 && sf_monotonic_seconds() < until) {
        clients_wait(&fast, 1, 100);
        if ((l = client_take(fast, &f1, 1, &v)) > longest) longest = l;
    }
    CHECK(f1.got >= 4);
    for (int i = 0; i < STUCK_STREAMS; i++) tstream_push(slow, &v, &stuck[i], 64, 1);

    /* it sends PING and reads nothing; the reading client's two streams run to their end */
    double worst = 0, next_ping = 0;
    tstream *now = &f1;
    void *sock = fast;
    for (until = sf_monotonic_seconds() + 30; sf_monotonic_seconds() < until;) {
        clients_wait(&sock, 1, 50);
        if ((l = client_take(sock, now, 1, &v)) > longest) longest = l;
        if (sf_monotonic_seconds() >= next_ping) {
            client_send(slow, SF_SERVE_PING, 0, 1, 0, NULL, 0);
            next_ping = sf_monotonic_seconds() + 0.2;
            double in_flight = server_metric(&v, "seqflow_serve_send_bytes_in_flight");
            if (in_flight > worst) worst = in_flight;
        }
        if (now == &f1 && f1.closed) { /* then a second stream, on a fresh connection */
            now = &f2;
            sock = client_dealer(v.endpoint, 0);
            tstream_push(sock, &v, &f2, 4, 0);
        } else if (now == &f2 && f2.closed) {
            break;
        }
    }
    CHECKF(f1.closed && f1.got == f1.segs && !f1.bad, "stream 1: %d of %d segments, %d wrong, closed %d", f1.got,
           f1.segs, f1.bad, f1.closed);
    CHECKF(f2.closed && f2.got == f2.segs && !f2.bad, "stream 2 (while a client does not read): %d of %d segments, "
           "%d wrong, closed %d", f2.got, f2.segs, f2.bad, f2.closed);
    const double msg = (double)longest, peak = server_metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
    const double held = server_metric(&v, "seqflow_serve_send_bytes_in_flight");
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
    CHECK(server_metric(&v, "seqflow_serve_pending_tokens") > 0);

    /* gone now: ZeroMQ drops the rows queued for the connection and gives their buffers back
     * (a client that neither reads nor closes keeps them: ZeroMQ's heartbeat waits behind the
     * message it is stuck in, docs/SERVE.md) */
    zmq_close(slow);
    until = sf_monotonic_seconds() + 15;
    while (server_metric(&v, "seqflow_serve_send_bytes_in_flight") != 0 && sf_monotonic_seconds() < until)
        usleep(100000);
    CHECKF(server_metric(&v, "seqflow_serve_send_bytes_in_flight") == 0, "bytes still in flight for a dropped client");
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
    for (int i = 0; i < MANY; i++) tstream_make(&v, &ts[i], 1000 + (uint64_t)i, MANY_SEGS, &rng);
    for (int i = 0; i < MANY; i++) socks[i] = client_dealer(v.endpoint, 0);
    for (int i = 0; i < MANY; i++) tstream_push(socks[i], &v, &ts[i], 8, 0);
    size_t longest = 0, l;
    int closed = 0;
    for (double until = sf_monotonic_seconds() + 45; closed < MANY && sf_monotonic_seconds() < until;) {
        clients_wait(socks, MANY, 100);
        closed = 0;
        for (int i = 0; i < MANY; i++) {
            if ((l = client_take(socks[i], &ts[i], 1, &v)) > longest) longest = l;
            closed += ts[i].closed;
        }
    }
    int exact = 0;
    for (int i = 0; i < MANY; i++) exact += ts[i].closed && ts[i].got == MANY_SEGS && !ts[i].bad;
    CHECKF(exact == MANY, "%d of %d streams complete and exact (%d closed)", exact, MANY, closed);
    const double peak = server_metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
    CHECKF(peak > 0 && peak <= (double)budget + (double)longest, "peak %.0f bytes in flight, budget %llu, messages of %zu",
           peak, (unsigned long long)budget, longest);
    CHECK(server_metric(&v, "seqflow_serve_send_budget_bytes") == (double)budget);
    CHECK(server_metric(&v, "seqflow_serve_io_threads") == 2);
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
    tstream_make(&v, &t, 7, KEPT_SEGS + MORE_SEGS, &rng);
    /* the first connection gets 12 segments' rows and acknowledges none, then goes */
    void *first = client_dealer(v.endpoint, 0);
    client_send(first, SF_SERVE_OPEN, t.id, 64, 0, NULL, 0);
    tstream_push_range(first, &v, &t, 0, KEPT_SEGS, 1);
    size_t longest = 0, l;
    for (double until = sf_monotonic_seconds() + 20; t.got < KEPT_SEGS && sf_monotonic_seconds() < until;) {
        clients_wait(&first, 1, 100);
        if ((l = client_take(first, &t, 1, &v)) > longest) longest = l;
    }
    CHECKF(t.got == KEPT_SEGS && !t.bad, "first connection: %d of %d segments, %d wrong", t.got, KEPT_SEGS, t.bad);
    zmq_close(first);
    /* a fresh one RESUMEs with no row: all 12 again, in order, then the new ones */
    void *again = client_dealer(v.endpoint, 0);
    t.got = 0;
    client_send(again, SF_SERVE_RESUME, t.id, 64, 0, NULL, 0);
    tstream_push_range(again, &v, &t, KEPT_SEGS, KEPT_SEGS + MORE_SEGS, 0);
    for (double until = sf_monotonic_seconds() + 20; !t.closed && sf_monotonic_seconds() < until;) {
        clients_wait(&again, 1, 100);
        if ((l = client_take(again, &t, 1, &v)) > longest) longest = l;
    }
    CHECKF(t.closed && t.got == KEPT_SEGS + MORE_SEGS && !t.bad, "after RESUME: %d of %d segments, %d wrong, closed %d",
           t.got, KEPT_SEGS + MORE_SEGS, t.bad, t.closed);
    const double peak = server_metric(&v, "seqflow_serve_send_bytes_in_flight_peak");
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
    serve_test_ctx = zmq_ctx_new();
    stuck_client();
    many_streams();
    resume_paced();
    zmq_ctx_term(serve_test_ctx);
    return check_finish("test_serve_budget");
}
