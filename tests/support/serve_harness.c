/* Servers of the built-in model on a thread, and clients of them over ZeroMQ, for the tests
 * of `seqflow serve` (tests/test_serve_*.c). */
#define _GNU_SOURCE
#include "support/serve_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "pipeline/wire.h"

void *serve_test_ctx;

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void *serve_main(void *arg)
{
    server *v = arg;
    v->rc = sf_serve_run(v->serve);
    return NULL;
}

int server_start(server *v, int dim, int seg, uint64_t budget, double idle_s, const char *sock, const char *ckpt)
{
    sf_serve_options so = {.idle_timeout = idle_s, .send_budget = budget, .checkpoint_dir = ckpt};
    return server_start_with(v, dim, seg, so, sock);
}

int server_start_with(server *v, int dim, int seg, sf_serve_options so, const char *sock)
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
    so.bind = v->endpoint, so.http = "tcp://127.0.0.1:*", so.plaintext = 1, so.io_threads = 2;
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

void server_stop(server *v)
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

double server_metric(const server *v, const char *name)
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

void client_send(void *d, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len)
{
    sf_buffer m = {0};
    sf_serve_encode(&m, type, stream, a, b, payload, len);
    zmq_send(d, m.data, m.len, 0);
    sf_buffer_release(&m);
}

void *client_dealer(const char *endpoint, int stuck)
{
    void *d = zmq_socket(serve_test_ctx, ZMQ_DEALER);
    int zero = 0, one = 1, small = 4096;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    if (stuck) { /* its I/O thread stops reading once one message waits: the rows stay with the server */
        zmq_setsockopt(d, ZMQ_RCVHWM, &one, sizeof one);
        zmq_setsockopt(d, ZMQ_RCVBUF, &small, sizeof small);
    }
    zmq_connect(d, endpoint);
    return d;
}

void tstream_make(const server *v, tstream *t, uint64_t id, int segs, check_rng *rng)
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

void tstream_push_range(void *d, const server *v, const tstream *t, int from, int to, int keep_open)
{
    uint8_t *payload = malloc(4 * (size_t)v->seg);
    for (int k = from; k < to; k++) {
        const uint32_t *tok = t->tokens + (size_t)k * (size_t)v->seg;
        for (int i = 0; i < v->seg; i++)
            payload[4 * i] = (uint8_t)tok[i], payload[4 * i + 1] = payload[4 * i + 2] = payload[4 * i + 3] = 0;
        client_send(d, SF_SERVE_PUSH, t->id, (uint64_t)k * (uint64_t)v->seg, (uint64_t)v->seg, payload,
                    4 * (size_t)v->seg);
    }
    free(payload);
    if (!keep_open) client_send(d, SF_SERVE_CLOSE, t->id, 0, 0, NULL, 0);
}

void tstream_push(void *d, const server *v, const tstream *t, int credit, int keep_open)
{
    client_send(d, SF_SERVE_OPEN, t->id, (uint64_t)credit, 0, NULL, 0);
    tstream_push_range(d, v, t, 0, t->segs, keep_open);
}

size_t client_take(void *d, tstream *ts, int n, const server *v) { return client_take_region(d, NULL, ts, n, v); }

size_t client_take_region(void *d, client_region *r, tstream *ts, int n, const server *v)
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
        } else if (msg.type == SF_SERVE_ROWS || msg.type == SF_SERVE_ROWS_AT) {
            const uint8_t *packet = msg.payload;
            size_t packet_len = msg.payload_len;
            uint64_t pos = 0;
            if (msg.type == SF_SERVE_ROWS_AT) { /* the packet lies in the region */
                pos = get64(msg.payload);
                packet_len = get64(msg.payload + 8);
                packet = r && r->base && pos % r->size + packet_len <= r->size ? r->base + pos % r->size : NULL;
                t->region_rows++;
            }
            sf_packet *p = NULL;
            int good = packet && sf_wire_decode(packet, packet_len, 1 << 26, &p) == SF_OK;
            good = good && p->position == msg.a && p->n == msg.b;
            if (good && p->n) {
                good = p->position == (uint64_t)t->got * (uint64_t)v->seg && t->got < t->segs &&
                       XXH64(p->x, p->n * p->width * sizeof(float), 0) == t->ref[t->got];
                t->got++;
            }
            t->bad += !good;
            sf_packet_free(p);
            if (msg.type == SF_SERVE_ROWS_AT && r) {
                r->seen = pos + packet_len;
                if (!r->hold) client_send(d, SF_SERVE_RELEASE, 0, r->seen, 0, NULL, 0);
            }
            client_send(d, SF_SERVE_CREDIT, t->id, 1, 0, NULL, 0);
        } else if (msg.type == SF_SERVE_CLOSED) {
            t->closed = 1;
        } else if (msg.type != SF_SERVE_OPENED && msg.type != SF_SERVE_PONG && msg.type != SF_SERVE_DURABLE) {
            fprintf(stderr, "unexpected %s on stream %llu\n", sf_serve_type_name(msg.type),
                    (unsigned long long)msg.stream);
            t->bad++;
        }
    }
}

void clients_wait(void **socks, int n, long ms)
{
    zmq_pollitem_t items[64];
    for (int i = 0; i < n; i++) items[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
    zmq_poll(items, n, ms);
}

int client_map(void *d, uint64_t bytes, client_region *r, char *error, size_t error_size)
{
    memset(r, 0, sizeof *r);
    client_send(d, SF_SERVE_MAP, 0, bytes, 0, NULL, 0);
    uint8_t reply[SF_SERVE_HEADER_SIZE + SF_SERVE_MAX_TEXT + 1];
    const long len = sf_serve_recv(d, reply, sizeof reply - 1, 0);
    sf_serve_msg m;
    if (len < 0 || sf_serve_decode(reply, (size_t)len, 0, &m) != SF_OK) return 0;
    if (m.type == SF_SERVE_ERROR) {
        snprintf(error, error_size, "%.*s", (int)m.payload_len, (const char *)m.payload);
        return 0;
    }
    if (m.type != SF_SERVE_MAPPED) return 0;
    memcpy(r->name, m.payload, m.payload_len);
    r->name[m.payload_len] = '\0';
    r->size = m.a;
    const int fd = shm_open(r->name, O_RDONLY, 0);
    void *base = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)r->size, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (base == MAP_FAILED) return 0;
    r->base = base;
    return 1;
}

void client_unmap(client_region *r)
{
    if (r->base) munmap((void *)r->base, (size_t)r->size);
    r->base = NULL;
}
