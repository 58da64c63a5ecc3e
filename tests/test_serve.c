/* seqflow serve (pipeline/serve.h): many clients at once get exactly the rows of one-process
 * push mode; a client that dies does not disturb the others and its streams expire; a client
 * whose key is not admitted is refused; malformed messages get ERROR and the server goes on;
 * protocol version 3 takes a ROWS in frames (every client here but one speaks it);
 * the binary (`seqflow serve`) gives `seqflow run`'s rows byte for byte and answers /metrics. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/process_stats.h"
#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/spawn.h"

#define PIPELINE "segment ! embed ! block ! norm"
#define CLIENTS 16
#define STREAMS 4
#define MAX_LEN 400

static sf_model *model;
static int dim;
static void *zctx;
static char endpoint[256], server_public[41], client_public[41], client_secret[41];

/* ---- a client: one DEALER ------------------------------------------------------------------ */

static void *client_connect(const char *pub, const char *sec)
{
    void *d = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    if (pub) {
        zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, server_public, 40);
        zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    zmq_connect(d, endpoint);
    return d;
}

static void csend(void *d, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len)
{
    sf_buffer m = {0};
    sf_serve_encode(&m, type, stream, a, b, payload, len);
    zmq_send(d, m.data, m.len, 0);
    sf_buffer_release(&m);
}

/* Receives one message (all its frames) within timeout_ms into buf (size bytes); returns its
 * length or -1. */
static int crecv(void *d, uint8_t *buf, size_t size, int timeout_ms)
{
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return -1;
    long n = sf_serve_recv(d, buf, size, 0);
    return n < 0 || (size_t)n > size ? -1 : (int)n;
}

/* The next message's type and code after sending one: ERROR's code, or 0 for another type. */
static int expect_reply(void *d, sf_serve_msg *m, uint8_t *buf, size_t size)
{
    int n = crecv(d, buf, size, 5000);
    if (n < 0 || sf_serve_decode(buf, (size_t)n, 1 << 20, m) != SF_OK) return -1;
    return m->type == SF_SERVE_ERROR ? (int)m->a : 0;
}

/* ---- the reference: one-process push mode ------------------------------------------------ */

typedef struct stream_case {
    uint64_t id;
    uint32_t tokens[MAX_LEN];
    size_t len, pushed, got;
    float *ref, *rows;       /* [len, dim] */
    int opened, flushed, close_sent, closed, provisional_ok, provisional_seen;
} stream_case;

static void reference(stream_case *sc)
{
    sf_graph *g;
    sf_graph_options o = {.threads = 1};
    CHECK_OK(sf_graph_create(model, &o, &g));
    CHECK_OK(sf_graph_parse(g, PIPELINE));
    CHECK_OK(sf_graph_push(g, sc->id, sc->tokens, sc->len));
    CHECK_OK(sf_graph_end(g, sc->id));
    size_t at = 0;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        CHECK(p->position == at && at + p->n <= sc->len && p->width == (size_t)dim);
        if (p->n && p->position == at && at + p->n <= sc->len) memcpy(sc->ref + at * dim, p->x, p->n * dim * sizeof(float));
        at += p->n;
    }
    CHECK(at == sc->len);
    sf_graph_free(g);
}

static void init_case(stream_case *sc, uint64_t id, check_rng *rng)
{
    memset(sc, 0, sizeof *sc);
    sc->id = id;
    sc->len = 1 + check_rng_next(rng) % MAX_LEN;
    for (size_t i = 0; i < sc->len; i++) sc->tokens[i] = (uint32_t)(check_rng_next(rng) % 256);
    sc->ref = calloc(sc->len * dim, sizeof(float));
    sc->rows = calloc(sc->len * dim, sizeof(float));
    reference(sc);
}

/* One ROWS message into its stream; returns 0 when it is wrong. */
static int take_rows(stream_case *sc, const sf_serve_msg *m)
{
    sf_packet *p = NULL;
    if (sf_wire_decode(m->payload, m->payload_len, 1 << 26, &p) != SF_OK) return 0;
    int ok = p->stream == sc->id && p->position == m->a && p->n == m->b && (p->n == 0 || p->width == (size_t)dim);
    if (ok && (p->flags & SF_PACKET_PROVISIONAL)) {
        /* a flushed prefix: the same rows as the completed segment will have (SPEC 1), up to
         * the rounding of a product over fewer rows */
        sc->provisional_seen++;
        ok = p->position + p->n <= sc->len &&
             check_rel_err_f32(p->x, sc->ref + p->position * dim, p->n * dim) < 1e-5;
        sc->provisional_ok += ok;
    } else if (ok) {
        ok = p->position == sc->got && sc->got + p->n <= sc->len;
        if (ok && p->n) memcpy(sc->rows + sc->got * dim, p->x, p->n * dim * sizeof(float));
        sc->got += p->n;
    }
    sf_packet_free(p);
    return ok;
}

/* Streams all of a client's cases to the end: random chunks, a FLUSH halfway, credit given
 * back one message at a time. Returns the number of protocol surprises. */
static int drive(void *d, stream_case *cases, int n, check_rng *rng, double deadline)
{
    static __thread uint8_t buf[1 << 20];
    int bad = 0, done = 0;
    for (int i = 0; i < n; i++) csend(d, SF_SERVE_OPEN, cases[i].id, 2, 0, NULL, 0);
    while (done < n && sf_monotonic_seconds() < deadline && bad < 5) {
        for (int i = 0; i < n; i++) {
            stream_case *sc = &cases[i];
            if (!sc->opened || sc->close_sent) continue;
            if (sc->pushed < sc->len) {
                size_t k = 1 + check_rng_next(rng) % 97;
                if (k > sc->len - sc->pushed) k = sc->len - sc->pushed;
                uint8_t payload[4 * MAX_LEN];
                for (size_t t = 0; t < k; t++) {
                    uint32_t v = sc->tokens[sc->pushed + t];
                    payload[4 * t] = (uint8_t)v, payload[4 * t + 1] = (uint8_t)(v >> 8);
                    payload[4 * t + 2] = (uint8_t)(v >> 16), payload[4 * t + 3] = (uint8_t)(v >> 24);
                }
                csend(d, SF_SERVE_PUSH, sc->id, sc->pushed, k, payload, 4 * k);
                sc->pushed += k;
                if (!sc->flushed && sc->pushed >= sc->len / 2) {
                    csend(d, SF_SERVE_FLUSH, sc->id, 0, 0, NULL, 0);
                    sc->flushed = 1;
                }
            } else {
                csend(d, SF_SERVE_CLOSE, sc->id, 0, 0, NULL, 0);
                sc->close_sent = 1;
            }
        }
        int got;
        while ((got = crecv(d, buf, sizeof buf, 2)) >= 0) {
            sf_serve_msg m;
            stream_case *sc = NULL;
            if (sf_serve_decode(buf, (size_t)got, 1 << 20, &m) != SF_OK) {
                bad++;
                continue;
            }
            for (int i = 0; i < n; i++)
                if (cases[i].id == m.stream) sc = &cases[i];
            if (!sc) {
                bad++;
                continue;
            }
            if (m.type == SF_SERVE_OPENED) sc->opened = m.a == 0;
            else if (m.type == SF_SERVE_ROWS) {
                bad += !take_rows(sc, &m);
                csend(d, SF_SERVE_CREDIT, sc->id, 1, 0, NULL, 0);
            } else if (m.type == SF_SERVE_CLOSED) {
                sc->closed = 1;
                done++;
                bad += m.a != sc->len;
            } else {
                fprintf(stderr, "unexpected %s on stream %llu: %.*s\n", sf_serve_type_name(m.type),
                        (unsigned long long)m.stream, (int)m.payload_len, m.payload ? (const char *)m.payload : "");
                bad++;
            }
        }
    }
    return bad + (done < n);
}

typedef struct client_job {
    int index;
    stream_case cases[STREAMS];
    int bad;
} client_job;

static void *client_thread(void *arg)
{
    client_job *j = arg;
    check_rng rng = {1000 + (uint64_t)j->index};
    void *d = client_connect(client_public, client_secret);
    j->bad = drive(d, j->cases, STREAMS, &rng, sf_monotonic_seconds() + 120);
    zmq_close(d);
    return NULL;
}

/* One stream through a client of protocol `version`: 256 tokens, then CLOSE. Its rows go to
 * rows ([256, dim]); returns the most frames one ROWS came in, and the largest frame in *largest
 * (-1 when the stream did not end well). */
static int framed_stream(int version, uint64_t id, float *rows, size_t *largest)
{
    void *d = client_connect(client_public, client_secret);
    uint8_t payload[4 * 256] = {0};
    for (int t = 0; t < 256; t++) payload[4 * t] = (uint8_t)(t * 7);
    const sf_serve_type types[] = {SF_SERVE_OPEN, SF_SERVE_PUSH, SF_SERVE_CLOSE};
    for (int i = 0; i < 3; i++) {
        sf_buffer m = {0};
        sf_serve_encode_version(&m, version, types[i], id, i == 0 ? 8 : 0, i == 1 ? 256 : 0, i == 1 ? payload : NULL,
                                i == 1 ? sizeof payload : 0);
        zmq_send(d, m.data, m.len, 0);
        sf_buffer_release(&m);
    }
    int most = 0, ended = 0, bad = 0;
    size_t got = 0;
    *largest = 0;
    sf_buffer whole = {0};
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    while (!ended && !bad && zmq_poll(&it, 1, 5000) > 0) {
        int frames = 0;
        whole.len = 0;
        for (int more = 1; more; frames++) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, d, 0) < 0) bad = 1;
            if (zmq_msg_size(&f) > *largest) *largest = zmq_msg_size(&f);
            sf_buffer_append(&whole, zmq_msg_data(&f), zmq_msg_size(&f));
            more = !bad && zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        sf_serve_msg m;
        if (bad || sf_serve_decode(whole.data, whole.len, 0, &m) != SF_OK || m.version != version) {
            bad = 1;
        } else if (m.type == SF_SERVE_ROWS) {
            sf_packet *p = NULL;
            bad = sf_wire_decode(m.payload, m.payload_len, 1 << 26, &p) != SF_OK || p->position != got ||
                  got + p->n > 256 || p->width != (size_t)dim;
            if (!bad && p->n) memcpy(rows + got * dim, p->x, p->n * dim * sizeof(float));
            if (!bad) got += p->n;
            sf_packet_free(p);
            if (frames > most) most = frames;
            sf_buffer re = {0};
            sf_serve_encode_version(&re, version, SF_SERVE_CREDIT, id, 1, version >= 2 ? got : 0, NULL, 0);
            zmq_send(d, re.data, re.len, 0);
            sf_buffer_release(&re);
        } else if (m.type == SF_SERVE_CLOSED) {
            ended = m.a == 256 && got == 256;
            bad = !ended;
        } else if (m.type != SF_SERVE_OPENED) {
            bad = 1;
        }
    }
    sf_buffer_release(&whole);
    zmq_close(d);
    return ended ? most : -1;
}

/* A version-3 client takes a ROWS in frames of at most the server's frame_bytes (4096 here),
 * an older client in one frame; the rows are the same. */
static void framing(void)
{
    float *r3 = calloc(256 * (size_t)dim, sizeof(float)), *r2 = calloc(256 * (size_t)dim, sizeof(float));
    size_t largest3 = 0, largest2 = 0;
    const int frames3 = framed_stream(3, 700, r3, &largest3), frames2 = framed_stream(2, 701, r2, &largest2);
    /* a segment is 64 rows of 64 float32 (16 KiB): 5 frames of at most 4096 bytes */
    CHECKF(frames3 >= 5 && largest3 <= 4096, "version 3: ROWS in up to %d frames, the largest %zu bytes", frames3, largest3);
    CHECKF(frames2 == 1 && largest2 > 16384, "version 2: ROWS in up to %d frames, the largest %zu bytes", frames2, largest2);
    CHECK(memcmp(r3, r2, 256 * (size_t)dim * sizeof(float)) == 0);
    free(r3);
    free(r2);
}

/* A client that opens two streams, pushes more than its credit lets the server compute, and
 * disappears without CLOSE. */
static void *doomed_thread(void *arg)
{
    (void)arg;
    void *d = client_connect(client_public, client_secret);
    uint8_t buf[4096], payload[4 * 300] = {0};
    for (uint64_t s = 0; s < 2; s++) {
        csend(d, SF_SERVE_OPEN, 900 + s, 1, 0, NULL, 0);
        csend(d, SF_SERVE_PUSH, 900 + s, 0, 300, payload, sizeof payload);
    }
    for (int i = 0; i < 2; i++) crecv(d, buf, sizeof buf, 2000); /* OPENED */
    zmq_close(d); /* killed mid-stream: no CLOSE, the server holds pending tokens for it */
    return NULL;
}

static void *serve_thread(void *arg)
{
    int *rc = ((void **)arg)[1];
    *rc = sf_serve_run(((void **)arg)[0]);
    return NULL;
}

static void malformed(void)
{
    void *d = client_connect(client_public, client_secret);
    uint8_t buf[4096], h[SF_SERVE_HEADER_SIZE + 8];
    sf_serve_msg m;
    CHECK(zmq_send(d, "hello", 5, 0) == 5);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    sf_serve_header(h, SF_SERVE_OPEN, 1, 0, 0);
    h[0] = 'X';
    zmq_send(d, h, SF_SERVE_HEADER_SIZE, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    sf_serve_header(h, 99, 1, 0, 0);
    zmq_send(d, h, SF_SERVE_HEADER_SIZE, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    sf_serve_header(h, SF_SERVE_PUSH, 1, 0, UINT64_MAX / 2); /* a count that would overflow 4n */
    zmq_send(d, h, sizeof h, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    sf_serve_header(h, SF_SERVE_PUSH, 1, 0, 3); /* 3 tokens, 8 payload bytes */
    zmq_send(d, h, sizeof h, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    sf_serve_header(h, SF_SERVE_ROWS, 1, 0, 0); /* a server's message */
    zmq_send(d, h, sizeof h, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_TYPE);
    zmq_send(d, h, SF_SERVE_HEADER_SIZE, ZMQ_SNDMORE); /* two frames */
    zmq_send(d, h, SF_SERVE_HEADER_SIZE, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    uint32_t tok[2] = {1, 2};
    csend(d, SF_SERVE_PUSH, 77, 0, 2, tok, sizeof tok); /* not open */
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_NOT_OPEN && m.stream == 77);
    csend(d, SF_SERVE_OPEN, 77, 4, 0, NULL, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == 0 && m.type == SF_SERVE_OPENED && m.a == 0);
    csend(d, SF_SERVE_PUSH, 77, 5, 2, tok, sizeof tok); /* wrong position */
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_POSITION);
    uint32_t outside[2] = {1, 256};
    csend(d, SF_SERVE_PUSH, 77, 0, 2, outside, sizeof outside);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_TOKEN);
    uint32_t *many = calloc(5000, sizeof *many); /* over the window of 4096 */
    csend(d, SF_SERVE_PUSH, 77, 0, 5000, many, 5000 * sizeof *many);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == SF_SERVE_E_MALFORMED);
    free(many);
    void *other = client_connect(client_public, client_secret);
    csend(other, SF_SERVE_OPEN, 77, 1, 0, NULL, 0);
    CHECK(expect_reply(other, &m, buf, sizeof buf) == SF_SERVE_E_BUSY);
    zmq_close(other);
    /* and the stream still works: two tokens, CLOSE, the final rows, CLOSED */
    csend(d, SF_SERVE_PUSH, 77, 0, 2, tok, sizeof tok);
    csend(d, SF_SERVE_CLOSE, 77, 0, 0, NULL, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == 0 && m.type == SF_SERVE_ROWS && m.b == 2);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == 0 && m.type == SF_SERVE_CLOSED && m.a == 2);
    csend(d, SF_SERVE_PING, 0, 42, 0, NULL, 0);
    CHECK(expect_reply(d, &m, buf, sizeof buf) == 0 && m.type == SF_SERVE_PONG && m.a == 42);
    zmq_close(d);
}

static void refused(void)
{
    char pub[41], sec[41];
    CHECK(zmq_curve_keypair(pub, sec) == 0);
    void *stranger = client_connect(pub, sec), *plain = client_connect(NULL, NULL);
    csend(stranger, SF_SERVE_OPEN, 5, 1, 0, NULL, 0);
    csend(plain, SF_SERVE_OPEN, 6, 1, 0, NULL, 0);
    uint8_t buf[256];
    CHECK(crecv(stranger, buf, sizeof buf, 700) < 0);
    CHECK(crecv(plain, buf, sizeof buf, 100) < 0);
    zmq_close(stranger);
    zmq_close(plain);
}

/* ---- the binary ----------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text, int mode)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    chmod(path, (mode_t)mode);
}

static int http_get(int port, const char *path, char *out, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[128];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) n = -1;
    size_t got = 0;
    ssize_t r;
    while (n >= 0 && got + 1 < size && (r = read(fd, out + got, size - 1 - got)) > 0) got += (size_t)r;
    out[got] = '\0';
    close(fd);
    return (int)got;
}

static void binary(void)
{
    if (!spawn_binary()) return;
    char pub[41], sec[41], keyfile[256], clients[256], line[128], sock[256], tokfile[256], reffile[256];
    CHECK(zmq_curve_keypair(pub, sec) == 0);
    snprintf(keyfile, sizeof keyfile, "%s", check_tmp_path("serve.key"));
    snprintf(clients, sizeof clients, "%s", check_tmp_path("serve.clients"));
    snprintf(tokfile, sizeof tokfile, "%s", check_tmp_path("serve.u32"));
    snprintf(reffile, sizeof reffile, "%s", check_tmp_path("serve.f32"));
    snprintf(line, sizeof line, "%s\n", sec);
    write_text(keyfile, line, 0600);
    snprintf(line, sizeof line, "# the test client\n%s\n", client_public);
    write_text(clients, line, 0644);
    snprintf(sock, sizeof sock, "ipc://%s", check_tmp_path("serve.sock"));
    char http[64], errfile[256];
    snprintf(errfile, sizeof errfile, "%s", check_tmp_path("serve.err"));
    const char *model_opts[] = {"--dim", "64", "--layers", "1", "--segment", "64", "--branches", "16:1,32:2,64:4", "--mlp", "64"};
    const char *argv[32] = {"seqflow", "serve", "--bind", sock, "--key", keyfile, "--clients", clients, "--http", http,
                            "-t", "1"};
    int argc = 12;
    for (int i = 0; i < 10; i++) argv[argc++] = model_opts[i];
    /* a free port can be taken by another test between the probe and the bind: the server
     * then exits saying so, and starts again on another */
    int port = -1, pid = -1;
    for (int attempt = 0; attempt < 5 && pid < 0; attempt++) {
        port = check_free_port();
        snprintf(http, sizeof http, "tcp://127.0.0.1:%d", port);
        int in_fd;
        pid = spawn_start(argv, &in_fd, errfile);
        if (pid <= 0) break;
        close(in_fd);
        char page[256];
        int status, up = 0;
        for (double t = sf_monotonic_seconds() + 30; !up && sf_monotonic_seconds() < t; usleep(20000)) {
            if (waitpid(pid, &status, WNOHANG) == pid) {
                size_t len = 0;
                char *err = (char *)check_read_file(errfile, &len);
                const int taken = err && strstr(err, "Address already in use");
                CHECKF(taken, "the server exited at start: %s", err ? err : "(no message)");
                free(err);
                pid = -1;
                if (!taken) return;
                break;
            }
            up = http_get(port, "/health", page, sizeof page) > 0;
        }
        CHECKF(pid < 0 || up, "the server did not answer on %s within 30 s", http);
    }
    CHECK(pid > 0);
    if (pid <= 0) return;
    /* server key: derived from the secret, as a client learns it */
    char server_pub[41];
    CHECK(zmq_curve_public(server_pub, sec) == 0);
    memcpy(server_public, server_pub, 41);
    snprintf(endpoint, sizeof endpoint, "%s", sock);
    check_rng rng = {77};
    stream_case *sc = calloc(1, sizeof *sc);
    init_case(sc, 3, &rng);
    void *d = client_connect(client_public, client_secret);
    CHECK(drive(d, sc, 1, &rng, sf_monotonic_seconds() + 30) == 0);
    CHECK(sc->got == sc->len);
    zmq_close(d);
    /* `seqflow run` on the same tokens */
    FILE *f = fopen(tokfile, "wb");
    fwrite(sc->tokens, 4, sc->len, f);
    fclose(f);
    const char *run[32] = {"seqflow", "run", "-i", tokfile, "-f", "u32", "-o", reffile, "-q"};
    int rn = 9;
    for (int i = 0; i < 10; i++) run[rn++] = model_opts[i];
    spawn_result r;
    CHECK(spawn_run(run, NULL, 0, &r) == 0 && r.exit_code == 0);
    float *ref = calloc(sc->len * dim, sizeof(float));
    f = fopen(reffile, "rb");
    CHECK(f && fread(ref, sizeof(float), sc->len * dim, f) == sc->len * dim);
    if (f) fclose(f);
    CHECKF(memcmp(ref, sc->rows, sc->len * dim * sizeof(float)) == 0, "served rows differ from seqflow run's");
    free(ref);
    char page[16384];
    CHECK(http_get(port, "/health", page, sizeof page) > 0 && strstr(page, "200 OK") && strstr(page, "\"ok\""));
    CHECK(http_get(port, "/metrics", page, sizeof page) > 0);
    char want[96];
    snprintf(want, sizeof want, "seqflow_serve_tokens_out_total %zu\n", sc->len);
    CHECKF(strstr(page, want) != NULL, "metrics lack '%s'", want);
    CHECK(strstr(page, "seqflow_serve_segment_latency_seconds_count ") != NULL);
    CHECK(http_get(port, "/nothing", page, sizeof page) > 0 && strstr(page, "404"));
    kill(pid, SIGTERM);
    CHECK(spawn_wait(pid) == 0);
    free(sc->ref);
    free(sc->rows);
    free(sc);
    /* usage errors: no --bind; CURVE without keys; a key file others can read */
    const char *nobind[] = {"seqflow", "serve", "--plaintext", NULL};
    CHECK(spawn_run(nobind, NULL, 0, &r) == 0 && r.exit_code == 2);
    const char *nokeys[] = {"seqflow", "serve", "--bind", sock, NULL};
    CHECK(spawn_run(nokeys, NULL, 0, &r) == 0 && r.exit_code == 2);
    chmod(keyfile, 0644);
    const char *open_key[] = {"seqflow", "serve", "--bind", sock, "--key", keyfile, "--clients", clients, NULL};
    CHECK(spawn_run(open_key, NULL, 0, &r) == 0 && r.exit_code == 2 && strstr(r.err, "read by others"));
}

int main(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.dim = 64;
    cfg.layers = 1;
    cfg.segment = 64;
    cfg.mlp_hidden = 64;
    CHECK_OK(sf_branches_parse("16:1,32:2,64:4", &cfg));
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &model));
    if (!model) return check_finish("test_serve");
    dim = cfg.dim;
    zctx = zmq_ctx_new();
    char server_secret[41];
    CHECK(zmq_curve_keypair(server_public, server_secret) == 0);
    CHECK(zmq_curve_keypair(client_public, client_secret) == 0);

    sf_graph *g;
    sf_graph_options go = {.threads = 1};
    CHECK_OK(sf_graph_create(model, &go, &g));
    CHECK_OK(sf_graph_parse(g, PIPELINE));
    const char *keys[] = {client_public};
    sf_serve_options so = {.bind = "tcp://127.0.0.1:*", .secret_key = server_secret, .client_keys = keys,
                           .n_client_keys = 1, .idle_timeout = 1.0, .window = 4096, .frame_bytes = 4096};
    sf_serve *s = NULL;
    CHECK_OK(sf_serve_create(g, sf_model_get_config(model), &so, &s));
    if (!s) return check_finish("test_serve");
    CHECK_OK(sf_serve_endpoint(s, 0, endpoint, sizeof endpoint));
    int serve_rc = -1;
    void *args[2] = {s, &serve_rc};
    pthread_t server;
    pthread_create(&server, NULL, serve_thread, args);

    static client_job jobs[CLIENTS];
    check_rng rng = {12345};
    for (int c = 0; c < CLIENTS; c++) {
        jobs[c].index = c;
        for (int k = 0; k < STREAMS; k++) init_case(&jobs[c].cases[k], (uint64_t)(c * STREAMS + k + 1), &rng);
    }
    pthread_t doomed, threads[CLIENTS];
    pthread_create(&doomed, NULL, doomed_thread, NULL);
    for (int c = 0; c < CLIENTS; c++) pthread_create(&threads[c], NULL, client_thread, &jobs[c]);
    refused();
    malformed();
    framing();
    pthread_join(doomed, NULL);
    int exact = 0, provisional = 0;
    for (int c = 0; c < CLIENTS; c++) {
        pthread_join(threads[c], NULL);
        CHECKF(jobs[c].bad == 0, "client %d: %d protocol surprises", c, jobs[c].bad);
        for (int k = 0; k < STREAMS; k++) {
            stream_case *sc = &jobs[c].cases[k];
            exact += sc->got == sc->len && memcmp(sc->rows, sc->ref, sc->len * dim * sizeof(float)) == 0;
            provisional += sc->provisional_seen == sc->provisional_ok;
            free(sc->ref);
            free(sc->rows);
        }
    }
    CHECKF(exact == CLIENTS * STREAMS, "%d of %d streams byte for byte", exact, CLIENTS * STREAMS);
    CHECK(provisional == CLIENTS * STREAMS);
    /* the dead client's two streams expire after the idle timeout (1 s) */
    sf_serve_stats st;
    double until = sf_monotonic_seconds() + 5;
    do {
        usleep(100000);
        sf_serve_get_stats(s, &st);
    } while (st.streams_expired < 2 && sf_monotonic_seconds() < until);
    CHECKF(st.streams_expired == 2 && st.streams == 0, "expired %llu, open %u", (unsigned long long)st.streams_expired,
           st.streams);
    CHECK(st.refused >= 1);
    sf_serve_stop(s);
    pthread_join(server, NULL);
    CHECK(serve_rc == SF_OK);
    sf_serve_free(s);
    sf_graph_free(g);

    binary();
    zmq_ctx_term(zctx);
    sf_model_free(model);
    return check_finish("test_serve");
}
