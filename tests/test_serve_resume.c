/* seqflow serve with checkpoints (pipeline/serve.h, docs/SERVE.md "Restarts"), in one process:
 * DURABLE follows a checkpoint; RESUME takes a stream over on a live server and after a restart
 * (a new server on the same directory), and the rows the client gets, once each, are those of
 * one-process push mode byte for byte; RESUME of an unknown stream, of acknowledged rows, or in
 * protocol version 1 is refused clearly; a version-1 client is answered in version 1; a damaged
 * checkpoint stops the next server from starting, naming the checksum. A checkpoint is written
 * off the loop: while a write is held the server answers and computes, and sends no DURABLE;
 * DURABLE comes once the file exists, verifies and holds the stream up to that position; a
 * failed write is logged, counted and tried again. The SIGKILL of a real server under real
 * clients is tests/serve_resume.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/stat.h>
#include <zmq.h>

#include "core/process_stats.h"
#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"
#include "state/checkpoint.h"
#include "support/check.h"

#define PIPELINE "segment ! embed ! block ! norm"
#define LEN 500

static sf_model *model;
static int dim;
static void *zctx;
static char endpoint[256], dir[512];
static uint8_t buf[1 << 20];

static void *dealer(void)
{
    void *d = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(d, endpoint);
    return d;
}

static void csend(void *d, int version, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *p, size_t len)
{
    sf_buffer m = {0};
    sf_serve_encode_version(&m, version, type, stream, a, b, p, len);
    zmq_send(d, m.data, m.len, 0);
    sf_buffer_release(&m);
}

/* The next message within 5 s; its type (ERROR: minus its code), 0 when none came. */
static int next(void *d, sf_serve_msg *m)
{
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 5000) <= 0) return 0;
    long n = sf_serve_recv(d, buf, sizeof buf, 0);
    if (n < 0 || (size_t)n > sizeof buf || sf_serve_decode(buf, (size_t)n, 1 << 20, m) != SF_OK) return 0;
    return m->type == SF_SERVE_ERROR ? -(int)m->a : (int)m->type;
}

typedef struct stream_case {
    uint64_t id;
    uint32_t tok[LEN];
    float ref[LEN * 64], rows[LEN * 64];
    uint64_t received;
} stream_case;

static void reference(stream_case *sc)
{
    sf_graph *g;
    sf_graph_options o = {.threads = 1};
    CHECK_OK(sf_graph_create(model, &o, &g));
    CHECK_OK(sf_graph_parse(g, PIPELINE));
    CHECK_OK(sf_graph_push(g, sc->id, sc->tok, LEN));
    CHECK_OK(sf_graph_end(g, sc->id));
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p))
        if (p->n && p->position + p->n <= LEN) memcpy(sc->ref + p->position * dim, p->x, p->n * dim * sizeof(float));
    sf_graph_free(g);
}

/* A ROWS message into the case: rows before `received` (sent again after a resume) dropped. */
static void take(void *d, stream_case *sc, const sf_serve_msg *m)
{
    sf_packet *p = NULL;
    CHECK(sf_wire_decode(m->payload, m->payload_len, 1 << 26, &p) == SF_OK);
    if (!p) return;
    CHECKF(p->position <= sc->received, "rows at %llu, %llu expected", (unsigned long long)p->position,
           (unsigned long long)sc->received);
    if (p->position + p->n > sc->received && p->position <= sc->received && p->position + p->n <= LEN) {
        size_t skip = sc->received - p->position;
        memcpy(sc->rows + sc->received * dim, p->x + skip * dim, (p->n - skip) * dim * sizeof(float));
        sc->received = p->position + p->n;
    }
    sf_packet_free(p);
    csend(d, 2, SF_SERVE_CREDIT, sc->id, 1, sc->received, NULL, 0);
}

static void push(void *d, stream_case *sc, uint64_t from, uint64_t to)
{
    csend(d, 2, SF_SERVE_PUSH, sc->id, from, to - from, sc->tok + from, (to - from) * 4);
}

/* Reads until a message of `type` (ROWS taken on the way); returns its `a`, or ~0 when none. */
static uint64_t until(void *d, stream_case *sc, int type)
{
    sf_serve_msg m;
    for (int t; (t = next(d, &m)) != 0;) {
        if (t == SF_SERVE_ROWS) take(d, sc, &m);
        else if (t == type) return m.a;
        else if (t < 0) {
            fprintf(stderr, "ERROR %d: %.*s\n", -t, (int)m.payload_len, (const char *)m.payload);
            return ~0ull;
        }
    }
    return ~0ull;
}

static void *serve_thread(void *arg)
{
    sf_serve_run(arg);
    return NULL;
}

static sf_serve *start(sf_graph **g, pthread_t *th, const char *ckpt, int expect)
{
    sf_graph_options go = {.threads = 1};
    CHECK_OK(sf_graph_create(model, &go, g));
    CHECK_OK(sf_graph_parse(*g, PIPELINE));
    /* a send budget of 4 ROWS (a client's share: 2): rows go out a few at a time, and what the
     * checks below see is as without it */
    sf_serve_options so = {.bind = "tcp://127.0.0.1:*", .plaintext = 1, .idle_timeout = 5, .window = 4096,
                           .checkpoint_dir = ckpt, .checkpoint_every = 0.05, .send_budget = 4 * (64 * 64 * 4 + 200)};
    sf_serve *s = NULL;
    int rc = sf_serve_create(*g, sf_model_get_config(model), &so, &s);
    CHECKF(rc == expect, "sf_serve_create: %d (%s), %d expected", rc, sf_last_error(), expect);
    if (!s) return NULL;
    CHECK_OK(sf_serve_endpoint(s, 0, endpoint, sizeof endpoint));
    pthread_create(th, NULL, serve_thread, s);
    return s;
}

static void stop(sf_serve *s, sf_graph *g, pthread_t th)
{
    if (s) {
        sf_serve_stop(s);
        pthread_join(th, NULL);
    }
    sf_serve_free(s);
    sf_graph_free(g);
}


/* ---- the writer thread: a write held by the checkpoint_writing hook, then one failed ------- */

static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static uint64_t hold_allow = ~0ull; /* writes numbered above wait */
static uint64_t hold_waiting;       /* the number of the write waiting, 0 when none */
static uint64_t fail_seq;           /* the write of this number fails (its directory moved away) */
static int moved_away, failure_logged;
static char dir2[512], dir2_away[600];

static void writing_hook(void *user, uint64_t seq)
{
    (void)user;
    pthread_mutex_lock(&hold_mu);
    while (seq > hold_allow) {
        hold_waiting = seq;
        pthread_cond_broadcast(&hold_cv);
        pthread_cond_wait(&hold_cv, &hold_mu);
    }
    hold_waiting = 0;
    if (moved_away) { /* the retry after the failure finds its directory again */
        rename(dir2_away, dir2);
        moved_away = 0;
    } else if (seq == fail_seq) {
        moved_away = rename(dir2, dir2_away) == 0;
    }
    pthread_mutex_unlock(&hold_mu);
}

static void hold_log(void *user, const char *line)
{
    (void)user;
    pthread_mutex_lock(&hold_mu);
    if (strstr(line, "not written")) failure_logged = 1;
    pthread_mutex_unlock(&hold_mu);
}

static void hold_set(uint64_t allow)
{
    pthread_mutex_lock(&hold_mu);
    hold_allow = allow;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
}

/* The number of the write the hook holds, once one waits (within 5 s); 0 when none did. */
static uint64_t hold_wait_for_write(void)
{
    uint64_t seq = 0;
    for (double t = sf_monotonic_seconds() + 5; !seq && sf_monotonic_seconds() < t; usleep(2000)) {
        pthread_mutex_lock(&hold_mu);
        seq = hold_waiting > hold_allow ? hold_waiting : 0;
        pthread_mutex_unlock(&hold_mu);
    }
    return seq;
}

/* The fed position checkpoint `seq` (the newest in dir2, checksums verified; 0: whichever is
 * the newest) holds for stream `id`; ~0 when it is not the newest valid one or does not hold
 * the stream. */
static uint64_t checkpoint_fed(uint64_t seq, uint64_t id)
{
    uint64_t got = 0, fed = ~0ull;
    uint8_t *p = NULL;
    size_t len = 0;
    if (sf_checkpoint_load_newest(dir2, (size_t)1 << 30, NULL, NULL, &got, &p, &len) != SF_OK || (seq && got != seq) || len < 24) {
        free(p);
        return fed;
    }
    uint32_t fp_len, n;
    uint64_t state_len;
    memcpy(&fp_len, p + 16, 4);
    size_t at = 20 + (size_t)fp_len;
    memcpy(&state_len, p + at, 8);
    at += 8 + (size_t)state_len;
    memcpy(&n, p + at, 4);
    at += 4;
    for (uint32_t i = 0; i < n && at + 40 <= len; i++) {
        uint64_t sid, sfed;
        uint32_t kept;
        memcpy(&sid, p + at, 8);
        memcpy(&sfed, p + at + 8, 8);
        memcpy(&kept, p + at + 36, 4);
        at += 40;
        if (sid == id) fed = sfed;
        for (uint32_t k = 0; k < kept && at + 24 <= len; k++) {
            uint64_t mlen;
            memcpy(&mlen, p + at + 16, 8);
            at += 24 + (size_t)mlen;
        }
    }
    free(p);
    return fed;
}

static int file_exists(uint64_t seq)
{
    char path[1024];
    struct stat sb;
    return sf_checkpoint_path(dir2, seq, path, sizeof path) == SF_OK && stat(path, &sb) == 0;
}

/* Reads until DURABLE (ROWS taken, PONG counted); its position, ~0 when none came in 5 s. */
static uint64_t until_durable(void *d, stream_case *sc)
{
    sf_serve_msg m;
    for (int t; (t = next(d, &m)) != 0;) {
        if (t == SF_SERVE_ROWS) take(d, sc, &m);
        else if (t == SF_SERVE_DURABLE) return m.a;
        else if (t < 0) return ~0ull;
    }
    return ~0ull;
}

static void writer_case(void)
{
    snprintf(dir2, sizeof dir2, "%s", check_tmp_path("serve_resume_writer"));
    snprintf(dir2_away, sizeof dir2_away, "%s.away", dir2);
    sf_checkpoint_clear(dir2);
    sf_graph *g;
    sf_graph_options go = {.threads = 1};
    CHECK_OK(sf_graph_create(model, &go, &g));
    CHECK_OK(sf_graph_parse(g, PIPELINE));
    sf_serve_options so = {.bind = "tcp://127.0.0.1:*", .plaintext = 1, .idle_timeout = 5, .window = 4096,
                           .checkpoint_dir = dir2, .checkpoint_every = 0.02, .checkpoint_writing = writing_hook,
                           .log = hold_log};
    sf_serve *s = NULL;
    CHECK_OK(sf_serve_create(g, sf_model_get_config(model), &so, &s));
    if (!s) {
        sf_graph_free(g);
        return;
    }
    pthread_t th;
    CHECK_OK(sf_serve_endpoint(s, 0, endpoint, sizeof endpoint));
    pthread_create(&th, NULL, serve_thread, s);
    static stream_case c;
    c.id = 9;
    for (int i = 0; i < LEN; i++) c.tok[i] = (uint32_t)(i * 7 % 256);
    void *d = dealer();
    csend(d, 2, SF_SERVE_OPEN, c.id, 8, 0, NULL, 0);
    CHECK(until(d, &c, SF_SERVE_OPENED) == 0);
    push(d, &c, 0, 100);
    uint64_t durable = 0;
    while (durable < 100 && durable != ~0ull) durable = until_durable(d, &c);
    CHECKF(durable == 100, "DURABLE %llu", (unsigned long long)durable);

    /* a write held: the loop answers PING and computes ROWS meanwhile, and says nothing durable */
    hold_set(0);
    push(d, &c, 100, 200);
    uint64_t held = hold_wait_for_write();
    CHECK(held > 0);
    sf_serve_stats st;
    sf_serve_get_stats(s, &st);
    uint64_t written = st.checkpoints;
    const double paused = st.checkpoint_pause_seconds; /* the held one's snapshot included */
    push(d, &c, 200, 300);
    sf_serve_msg m;
    int durable_seen = 0, pongs = 0;
    double t0 = sf_monotonic_seconds();
    csend(d, 2, SF_SERVE_PING, 0, 77, 0, NULL, 0);
    for (int t; (pongs == 0 || c.received < 256) && (t = next(d, &m)) != 0;) {
        if (t == SF_SERVE_ROWS) take(d, &c, &m);
        else if (t == SF_SERVE_PONG) pongs += m.a == 77;
        else if (t == SF_SERVE_DURABLE) durable_seen++;
    }
    CHECKF(pongs == 1 && c.received == 256, "pong %d, rows %llu while a write is held", pongs,
           (unsigned long long)c.received);
    CHECKF(sf_monotonic_seconds() - t0 < 2, "%.3f s for PONG and rows", sf_monotonic_seconds() - t0);
    CHECK(durable_seen == 0);
    CHECK(!file_exists(held));
    /* the held write is not the loop's pause: meanwhile the loop paused for snapshots at most,
     * less than the time the write was held (the pause of a snapshot whose write has not
     * landed is counted before its write's seconds, so the two sums are not comparable here) */
    sf_serve_get_stats(s, &st);
    CHECK(st.checkpoints == written);
    CHECKF(st.checkpoint_pause_seconds - paused < sf_monotonic_seconds() - t0,
           "the loop paused %.3f s while a write was held for %.3f s", st.checkpoint_pause_seconds - paused,
           sf_monotonic_seconds() - t0);

    /* released (the next one held): DURABLE comes once the file is there, verifies and holds
     * the stream up to that position */
    hold_set(held);
    durable = until_durable(d, &c);
    CHECKF(durable > 100 && durable <= 300, "DURABLE %llu after the write landed", (unsigned long long)durable);
    CHECK(file_exists(held));
    uint64_t fed = checkpoint_fed(held, c.id);
    CHECKF(fed == durable, "checkpoint %llu holds stream 9 at %llu, DURABLE said %llu", (unsigned long long)held,
           (unsigned long long)fed, (unsigned long long)durable);

    /* the next write fails (its directory moved away): logged and counted; the retry (the same
     * number, the directory back) lands, and DURABLE reaches every token fed */
    pthread_mutex_lock(&hold_mu);
    fail_seq = held + 1;
    pthread_mutex_unlock(&hold_mu);
    push(d, &c, 300, 400);
    hold_set(held + 1); /* the failed one and its retry are both numbered held + 1 */
    while (durable < 400 && durable != ~0ull) durable = until_durable(d, &c);
    CHECKF(durable == 400, "DURABLE %llu", (unsigned long long)durable);
    sf_serve_get_stats(s, &st);
    CHECKF(st.checkpoint_failures == 1, "%llu failures", (unsigned long long)st.checkpoint_failures);
    pthread_mutex_lock(&hold_mu);
    CHECK(failure_logged && !moved_away);
    pthread_mutex_unlock(&hold_mu);
    CHECK(checkpoint_fed(0, c.id) == 400);
    hold_set(~0ull);
    csend(d, 2, SF_SERVE_CLOSE, c.id, 0, 0, NULL, 0);
    CHECK(until(d, &c, SF_SERVE_CLOSED) == 400);
    zmq_close(d);
    stop(s, g, th);
    sf_checkpoint_clear(dir2);
    rmdir(dir2);
}

int main(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.dim = dim = 64;
    cfg.layers = 1;
    cfg.segment = 64;
    cfg.mlp_hidden = 64;
    CHECK_OK(sf_branches_parse("16:1,32:2,64:4", &cfg));
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &model));
    if (!model) return check_finish("test_serve_resume");
    zctx = zmq_ctx_new();
    snprintf(dir, sizeof dir, "%s", check_tmp_path("serve_resume_ckpt"));
    sf_checkpoint_clear(dir);
    static stream_case a, b;
    check_rng rng = {4242};
    a.id = 5, b.id = 6;
    for (int i = 0; i < LEN; i++) a.tok[i] = (uint32_t)(check_rng_next(&rng) % 256), b.tok[i] = (uint32_t)(check_rng_next(&rng) % 256);
    reference(&a);
    reference(&b);

    sf_graph *g;
    pthread_t th;
    sf_serve *s = start(&g, &th, dir, SF_OK);
    if (!s) return check_finish("test_serve_resume");
    void *d = dealer();
    sf_serve_msg m;
    /* two streams; a checkpoint makes 300 and 200 tokens durable */
    csend(d, 2, SF_SERVE_OPEN, a.id, 8, 0, NULL, 0);
    CHECK(until(d, &a, SF_SERVE_OPENED) == 0);
    csend(d, 2, SF_SERVE_OPEN, b.id, 8, 0, NULL, 0);
    CHECK(until(d, &b, SF_SERVE_OPENED) == 0);
    push(d, &a, 0, 300);
    push(d, &b, 0, 200);
    uint64_t durable[2] = {0, 0};
    for (double until_t = sf_monotonic_seconds() + 10; (durable[0] < 300 || durable[1] < 200) && sf_monotonic_seconds() < until_t;) {
        int t = next(d, &m);
        if (t == SF_SERVE_ROWS) take(d, m.stream == a.id ? &a : &b, &m);
        else if (t == SF_SERVE_DURABLE) durable[m.stream == b.id] = m.a;
        else if (t == 0) break;
    }
    CHECKF(durable[0] == 300 && durable[1] == 200, "DURABLE %llu and %llu", (unsigned long long)durable[0],
           (unsigned long long)durable[1]);
    CHECK(a.received == 256 && b.received == 192);
    /* refusals: an unknown stream, protocol version 1, rows already acknowledged */
    csend(d, 2, SF_SERVE_RESUME, 77, 4, 0, NULL, 0);
    CHECK(next(d, &m) == -SF_SERVE_E_UNKNOWN && m.stream == 77 && strstr((const char *)m.payload, "no state of stream 77"));
    csend(d, 1, SF_SERVE_RESUME, a.id, 4, 0, NULL, 0);
    CHECK(next(d, &m) == -SF_SERVE_E_MALFORMED && strstr((const char *)m.payload, "version 2"));
    CHECK(buf[4] == 1); /* answered in the client's version */
    csend(d, 2, SF_SERVE_RESUME, a.id, 4, 64, NULL, 0);
    CHECK(next(d, &m) == -SF_SERVE_E_GAP);
    /* a version-1 client's stream: replies in version 1, and it cannot be resumed */
    void *old = dealer();
    csend(old, 1, SF_SERVE_OPEN, 40, 2, 0, NULL, 0);
    CHECK(next(old, &m) == SF_SERVE_OPENED && m.version == 1);
    csend(old, 1, SF_SERVE_CREDIT, 40, 1, 5, NULL, 0); /* b is version 2's */
    CHECK(next(old, &m) == -SF_SERVE_E_MALFORMED);
    csend(d, 2, SF_SERVE_RESUME, 40, 4, 0, NULL, 0);
    CHECK(next(d, &m) == -SF_SERVE_E_UNKNOWN && strstr((const char *)m.payload, "version 1"));
    /* stream a resumed on the live server from another socket: it continues from 300 */
    void *d2 = dealer();
    csend(d2, 2, SF_SERVE_RESUME, a.id, 8, a.received, NULL, 0);
    CHECK(until(d2, &a, SF_SERVE_OPENED) == 300);
    push(d2, &a, 300, LEN);
    csend(d2, 2, SF_SERVE_CLOSE, a.id, 0, 0, NULL, 0);
    CHECK(until(d2, &a, SF_SERVE_CLOSED) == LEN);
    CHECK(a.received == LEN && memcmp(a.rows, a.ref, sizeof a.ref) == 0);
    /* stop (a last checkpoint), then a new server on the directory: b resumes at 200 */
    stop(s, g, th);
    zmq_close(d);
    zmq_close(d2);
    zmq_close(old);
    s = start(&g, &th, dir, SF_OK);
    if (!s) return check_finish("test_serve_resume");
    sf_serve_stats st;
    sf_serve_get_stats(s, &st);
    CHECKF(st.streams_restored == 1, "%llu streams restored", (unsigned long long)st.streams_restored);
    /* a client holding more rows than the checkpoint had sent (computed after it, before a
     * kill): taken; 10 more tokens, a stop, and the checkpoint then written loads again */
    d = dealer();
    csend(d, 2, SF_SERVE_RESUME, b.id, 8, 256, NULL, 0);
    CHECK(until(d, &b, SF_SERVE_OPENED) == 200);
    push(d, &b, 200, 210);
    csend(d, 2, SF_SERVE_PING, 0, 1, 0, NULL, 0);
    CHECK(until(d, &b, SF_SERVE_PONG) == 1);
    zmq_close(d);
    stop(s, g, th);
    s = start(&g, &th, dir, SF_OK);
    if (!s) return check_finish("test_serve_resume");
    d = dealer();
    csend(d, 2, SF_SERVE_OPEN, b.id, 8, 0, NULL, 0); /* not by OPEN: it awaits RESUME */
    CHECK(next(d, &m) == -SF_SERVE_E_BUSY);
    csend(d, 2, SF_SERVE_RESUME, a.id, 8, 0, NULL, 0); /* closed: gone */
    CHECK(next(d, &m) == -SF_SERVE_E_UNKNOWN);
    csend(d, 2, SF_SERVE_RESUME, b.id, 8, b.received, NULL, 0);
    CHECK(until(d, &b, SF_SERVE_OPENED) == 210);
    push(d, &b, 210, LEN);
    csend(d, 2, SF_SERVE_CLOSE, b.id, 0, 0, NULL, 0);
    CHECK(until(d, &b, SF_SERVE_CLOSED) == LEN);
    CHECK(b.received == LEN && memcmp(b.rows, b.ref, sizeof b.ref) == 0);
    for (double t = sf_monotonic_seconds() + 5; sf_monotonic_seconds() < t; usleep(10000)) { /* CLOSED, then freed */
        sf_serve_get_stats(s, &st);
        if (st.streams == 0) break;
    }
    CHECKF(st.streams_resumed == 1 && st.streams == 0, "resumed %llu, open %u", (unsigned long long)st.streams_resumed, st.streams);
    zmq_close(d);
    stop(s, g, th);
    /* a damaged newest checkpoint, alone: the server does not start, naming the checksum */
    uint64_t *seqs = NULL;
    size_t n = 0;
    CHECK_OK(sf_checkpoint_list(dir, &seqs, &n));
    CHECK(n >= 1);
    char path[1024];
    for (size_t i = 0; i + 1 < n; i++) {
        sf_checkpoint_path(dir, seqs[i], path, sizeof path);
        unlink(path);
    }
    if (n) {
        sf_checkpoint_path(dir, seqs[n - 1], path, sizeof path);
        FILE *f = fopen(path, "r+b");
        CHECK(f != NULL);
        if (f) {
            fseek(f, -3, SEEK_END);
            fputc('X', f);
            fclose(f);
        }
    }
    free(seqs);
    s = start(&g, &th, dir, SF_E_STATE);
    CHECKF(strstr(sf_last_error(), "no valid checkpoint"), "message: %s", sf_last_error());
    stop(s, g, th);
    /* without checkpoints RESUME is refused, saying why */
    s = start(&g, &th, NULL, SF_OK);
    d = dealer();
    csend(d, 2, SF_SERVE_RESUME, 1, 4, 0, NULL, 0);
    CHECK(next(d, &m) == -SF_SERVE_E_UNKNOWN && strstr((const char *)m.payload, "no checkpoints"));
    zmq_close(d);
    stop(s, g, th);
    sf_checkpoint_clear(dir);
    writer_case();
    zmq_ctx_term(zctx);
    sf_model_free(model);
    return check_finish("test_serve_resume");
}
