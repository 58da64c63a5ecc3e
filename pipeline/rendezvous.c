/* Rank 0's rendezvous and the other ranks' join (pipeline/rendezvous.h). One ZeroMQ context
 * per call, so the ZAP handler (one per context) belongs to this rendezvous alone, and the
 * server's one thread serves both the ROUTER and the ZAP requests of its handshakes. */
#include "pipeline/rendezvous.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include <zmq.h>

#include "core/byte_order.h"
#include "seqflow/error.h"

enum { T_HELLO = 1, T_WELCOME = 2, T_REFUSE = 3, T_CHUNK = 4, T_DONE = 5, T_ASK = 6, T_TOPOLOGY = 7 };
#define HEADER_BYTES 8
#define MAX_STR 1024            /* version, endpoint, host, refusal text */
#define MAX_HELLO (HEADER_BYTES + 8 + 32 + 4 * (2 + MAX_STR))
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

/* ---- messages --------------------------------------------------------------------------------- */

static void put_bytes(sf_buffer *b, int *bad, const void *p, size_t n)
{
    if (!*bad && sf_buffer_append(b, p, n) != SF_OK) *bad = 1;
}
static void put_le(sf_buffer *b, int *bad, uint64_t v, int bytes)
{
    if (!*bad && sf_buffer_put_le(b, v, bytes) != SF_OK) *bad = 1;
}
static void put_u16(sf_buffer *b, int *bad, uint16_t v) { put_le(b, bad, v, 2); }
static void put_u32(sf_buffer *b, int *bad, uint32_t v) { put_le(b, bad, v, 4); }
static void put_u64(sf_buffer *b, int *bad, uint64_t v) { put_le(b, bad, v, 8); }
/* A string or blob: u16 length, bytes (callers bound the length first). */
static void put_blob(sf_buffer *b, int *bad, const void *p, size_t n)
{
    put_u16(b, bad, (uint16_t)n);
    put_bytes(b, bad, p, n);
}
static void put_str(sf_buffer *b, int *bad, const char *s) { put_blob(b, bad, s ? s : "", s ? strnlen(s, MAX_STR) : 0); }
static void put_header(sf_buffer *b, int *bad, int type)
{
    put_bytes(b, bad, "SFRV", 4);
    put_u16(b, bad, SF_RENDEZVOUS_PROTOCOL);
    put_u16(b, bad, (uint16_t)type);
}

/* A blob of at most max bytes: *len and a pointer into the message. */
static const uint8_t *get_blob(sf_byte_reader *r, size_t max, size_t *len)
{
    size_t n = (size_t)sf_byte_le(r, 2);
    if (n > max) r->bad = 1;
    const uint8_t *p = r->bad ? NULL : sf_byte_take(r, n);
    *len = p ? n : 0;
    return p;
}
/* A string (no NUL inside) copied into dst[size]. */
static void get_str(sf_byte_reader *r, char *dst, size_t size)
{
    size_t n;
    const uint8_t *p = get_blob(r, size - 1, &n);
    if (p && memchr(p, 0, n)) r->bad = 1;
    memcpy(dst, p && !r->bad ? p : (const uint8_t *)"", p && !r->bad ? n : 0);
    dst[p && !r->bad ? n : 0] = '\0';
}
/* The header's type, or -1 (magic) / -2 (protocol version, in *version). */
static int get_header(sf_byte_reader *r, int *version)
{
    const uint8_t *magic = sf_byte_take(r, 4);
    if (!magic || memcmp(magic, "SFRV", 4) != 0) return -1;
    *version = (int)sf_byte_le(r, 2);
    int type = (int)sf_byte_le(r, 2);
    if (r->bad) return -1;
    return *version == SF_RENDEZVOUS_PROTOCOL ? type : -2;
}

/* A hello as received (strings copied). */
typedef struct hello_in {
    int rank, world;
    uint64_t model, config, pipeline, options;
    char version[MAX_STR + 1], endpoint[MAX_STR + 1], host[MAX_STR + 1];
    uint8_t blob[SF_RENDEZVOUS_MAX_BLOB];
    size_t blob_len;
} hello_in;

static int encode_hello(const sf_hello *h, sf_buffer *b)
{
    int bad = 0;
    put_header(b, &bad, T_HELLO);
    put_u32(b, &bad, (uint32_t)h->rank);
    put_u32(b, &bad, (uint32_t)h->world);
    put_u64(b, &bad, h->model_hash);
    put_u64(b, &bad, h->config_hash);
    put_u64(b, &bad, h->pipeline_hash);
    put_u64(b, &bad, h->options_hash);
    put_str(b, &bad, h->version);
    put_str(b, &bad, h->endpoint);
    put_str(b, &bad, h->host);
    put_blob(b, &bad, h->blob, h->blob_len);
    return bad ? sf_error(SF_E_NOMEM, "out of memory") : SF_OK;
}

static int decode_hello(sf_byte_reader *r, hello_in *h)
{
    h->rank = (int32_t)sf_byte_le(r, 4);
    h->world = (int32_t)sf_byte_le(r, 4);
    h->model = sf_byte_le(r, 8);
    h->config = sf_byte_le(r, 8);
    h->pipeline = sf_byte_le(r, 8);
    h->options = sf_byte_le(r, 8);
    get_str(r, h->version, sizeof h->version);
    get_str(r, h->endpoint, sizeof h->endpoint);
    get_str(r, h->host, sizeof h->host);
    const uint8_t *blob = get_blob(r, SF_RENDEZVOUS_MAX_BLOB, &h->blob_len);
    if (blob) memcpy(h->blob, blob, h->blob_len);
    return !r->bad && r->at == r->n;
}

static int check_hello(const sf_hello *h, const char *who)
{
    if (!h || h->world < 1 || h->rank < 0 || h->rank >= h->world)
        return sf_error(SF_E_INVAL, "%s: a hello needs 0 <= rank < world", who);
    if (h->blob_len > SF_RENDEZVOUS_MAX_BLOB || (h->blob_len && !h->blob))
        return sf_error(SF_E_INVAL, "%s: the blob holds at most %d bytes", who, SF_RENDEZVOUS_MAX_BLOB);
    const char *strs[] = {h->version, h->endpoint, h->host};
    for (int i = 0; i < 3; i++)
        if (strs[i] && strlen(strs[i]) > MAX_STR) return sf_error(SF_E_INVAL, "%s: a string over %d bytes", who, MAX_STR);
    return SF_OK;
}

/* ---- results ---------------------------------------------------------------------------------- */

void sf_rendezvous_result_free(sf_rendezvous_result *r)
{
    if (!r) return;
    for (int i = 0; r->peers && i < r->world; i++) {
        free(r->peers[i].endpoint);
        free(r->peers[i].host);
        free(r->peers[i].blob);
    }
    free(r->peers);
    free(r->payload);
    free(r);
}

static int result_new(int rank, int world, sf_rendezvous_result **out)
{
    sf_rendezvous_result *r = calloc(1, sizeof *r);
    if (r) r->peers = calloc((size_t)world, sizeof *r->peers);
    if (!r || !r->peers) {
        free(r);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    r->rank = rank;
    r->world = world;
    *out = r;
    return SF_OK;
}

static int peer_set(sf_rendezvous_peer *p, const char *endpoint, const char *host, const uint8_t *blob, size_t blob_len)
{
    p->endpoint = strdup(endpoint ? endpoint : "");
    p->host = strdup(host ? host : "");
    p->blob = blob_len ? malloc(blob_len) : NULL;
    if (!p->endpoint || !p->host || (blob_len && !p->blob)) return sf_error(SF_E_NOMEM, "out of memory");
    if (blob_len) memcpy(p->blob, blob, blob_len);
    p->blob_len = blob_len;
    return SF_OK;
}

/* ---- sockets ---------------------------------------------------------------------------------- */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int set_int(void *s, int option, int value) { return zmq_setsockopt(s, option, &value, sizeof value); }

static int set_key(void *s, int option, const char *z85)
{
    return z85 && strlen(z85) == 40 ? zmq_setsockopt(s, option, z85, 41) : -1;
}

static int send_buf(void *s, const sf_buffer *b, int flags) { return zmq_send(s, b->data, b->len, flags) < 0 ? -1 : 0; }

/* ---- serve ------------------------------------------------------------------------------------ */

typedef struct identity {
    uint8_t id[256];
    size_t len;
} identity;

typedef struct server {
    void *ctx, *router, *zap;
    const sf_rendezvous_config *c;
    const sf_hello *own;
    int world;
    hello_in *hello;      /* [world]: what each rank said (rank 0: own) */
    int *arrived;         /* [world]: index + 1 into peers, 0 = not yet */
    int *done;            /* [world]: sent DONE */
    identity *peers;      /* every connection that said anything, for REFUSE */
    int n_peers, cap_peers;
} server;

/* The connection's index among s->peers (added when new), or -1 when full. */
static int peer_index(server *s, const uint8_t *id, size_t len)
{
    for (int i = 0; i < s->n_peers; i++)
        if (s->peers[i].len == len && memcmp(s->peers[i].id, id, len) == 0) return i;
    if (s->n_peers == s->cap_peers || len > sizeof s->peers[0].id) return -1;
    memcpy(s->peers[s->n_peers].id, id, len);
    s->peers[s->n_peers].len = len;
    return s->n_peers++;
}

static int send_to(server *s, const identity *to, const uint8_t *data, size_t len)
{
    if (zmq_send(s->router, to->id, to->len, ZMQ_SNDMORE) < 0) return -1;
    return zmq_send(s->router, data, len, 0) < 0 ? -1 : 0;
}

/* Sends REFUSE with the current error message to every connection, those whose HELLO is still
 * queued included; returns code. */
static int refuse_all(server *s, int code)
{
    char text[512];
    snprintf(text, sizeof text, "%s", sf_last_error());
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        peer_index(s, zmq_msg_data(&m), zmq_msg_size(&m));
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the rest of that message */
            zmq_msg_init(&m);
            more = zmq_msg_recv(&m, s->router, 0) >= 0 && zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
    }
    sf_buffer b = {0};
    int bad = 0;
    put_header(&b, &bad, T_REFUSE);
    put_str(&b, &bad, text);
    set_int(s->router, ZMQ_SNDTIMEO, 0);
    for (int i = 0; !bad && i < s->n_peers; i++) send_to(s, &s->peers[i], b.data, b.len);
    sf_buffer_release(&b);
    sf_error(code, "%s", text);
    return code;
}

/* Answers one ZAP request: CURVE keys of the topology are admitted, their Z85 text becoming
 * the connection's User-Id; everything else is denied. */
static void zap_answer(server *s)
{
    char frames[7][256];
    size_t sizes[7] = {0};
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s->zap, 0) < 0) return (void)zmq_msg_close(&m);
        if (n < 7) {
            sizes[n] = zmq_msg_size(&m) < sizeof frames[0] ? zmq_msg_size(&m) : sizeof frames[0] - 1;
            memcpy(frames[n], zmq_msg_data(&m), sizes[n]);
            frames[n][sizes[n]] = '\0';
        }
        n++;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    char user[41] = "";
    int ok = 0;
    if (n == 7 && strcmp(frames[5], "CURVE") == 0 && sizes[6] == 32 && zmq_z85_encode(user, (uint8_t *)frames[6], 32)) {
        for (int r = 0; r < s->world && !ok; r++) ok = s->c->rank_keys[r] && strcmp(s->c->rank_keys[r], user) == 0;
    }
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not in the topology";
    zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(s->zap, frames[1], n > 1 ? sizes[1] : 0, ZMQ_SNDMORE);
    zmq_send(s->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(s->zap, ok ? user : "", ok ? 40 : 0, ZMQ_SNDMORE);
    zmq_send(s->zap, "", 0, 0);
}

static const char *what_differs(const hello_in *a, const hello_in *b)
{
    if (a->model != b->model) return "model weights";
    if (a->config != b->config) return "model configuration";
    if (a->pipeline != b->pipeline) return "pipeline text";
    if (a->options != b->options) return "options";
    return NULL;
}

/* Checks a HELLO from connection `from` against what is known; SF_OK records it. */
static int take_hello(server *s, int from, sf_byte_reader *r, const char *user_id)
{
    hello_in h;
    if (!decode_hello(r, &h)) return sf_error(SF_E_PEER, "rendezvous: a malformed HELLO (%zu bytes)", r->n);
    const hello_in *zero = &s->hello[0];
    if (h.world != s->world)
        return sf_error(SF_E_PEER, "rank %d (host %s) says the world has %d ranks, rank 0 (host %s) that it has %d",
                        h.rank, h.host, h.world, zero->host, s->world);
    if (h.rank < 0 || h.rank >= s->world)
        return sf_error(SF_E_PEER, "host %s claims rank %d, outside 0..%d", h.host, h.rank, s->world - 1);
    if (!s->c->plaintext && (!user_id || strcmp(user_id, s->c->rank_keys[h.rank]) != 0))
        return sf_error(SF_E_PEER, "rank %d (host %s) connected with another key than rank %d's in the topology",
                        h.rank, h.host, h.rank);
    if (s->arrived[h.rank])
        return sf_error(SF_E_PEER, "rank %d is claimed twice: by host %s (%s) and host %s (%s)", h.rank,
                        s->hello[h.rank].host, s->hello[h.rank].endpoint, h.host, h.endpoint);
    if (strcmp(h.version, zero->version) != 0)
        return sf_error(SF_E_PEER, "rank %d (host %s) runs seqflow %s but rank 0 (host %s) runs seqflow %s", h.rank,
                        h.host, h.version, zero->host, zero->version);
    const char *diff = what_differs(&h, zero);
    if (diff)
        return sf_error(SF_E_PEER, "rank %d (host %s) and rank 0 (host %s) differ in their %s", h.rank, h.host,
                        zero->host, diff);
    s->hello[h.rank] = h;
    s->arrived[h.rank] = from + 1;
    return SF_OK;
}

/* ASK (i32 rank) from connection `from`: a rank without the topology file asks for the text.
 * The same rule as for a HELLO: under CURVE only over that rank's key. */
static int give_topology(server *s, int from, sf_byte_reader *r, const char *user_id)
{
    const int rank = (int32_t)sf_byte_le(r, 4);
    if (r->bad || r->at != r->n) return sf_error(SF_E_PEER, "rendezvous: a malformed topology request");
    if (rank <= 0 || rank >= s->world) return sf_error(SF_E_PEER, "a rank asks for the topology as rank %d, outside 1..%d", rank, s->world - 1);
    if (!s->c->plaintext && (!user_id || strcmp(user_id, s->c->rank_keys[rank]) != 0))
        return sf_error(SF_E_PEER, "rank %d asked for the topology with another key than rank %d's in the topology", rank, rank);
    if (!s->c->topology_text)
        return sf_error(SF_E_PEER, "rank %d asked for the topology, and rank 0 has none to give: start it with --topology FILE", rank);
    sf_buffer b = {0};
    int bad = 0;
    put_header(&b, &bad, T_TOPOLOGY);
    put_u32(&b, &bad, (uint32_t)s->c->topology_len);
    put_bytes(&b, &bad, s->c->topology_text, s->c->topology_len);
    int rc = bad ? sf_error(SF_E_NOMEM, "out of memory") : SF_OK;
    if (rc == SF_OK && send_to(s, &s->peers[from], b.data, b.len) != 0)
        rc = sf_error(SF_E_PEER, "rank %d left before taking the topology: %s", rank, zmq_strerror(zmq_errno()));
    sf_buffer_release(&b);
    return rc;
}

/* Polls the ROUTER and the ZAP handler until deadline; *got receives a message's sender
 * (index into peers) and body, or -1 on timeout. */
static int serve_recv(server *s, long long deadline, int *got, zmq_msg_t *body)
{
    *got = -1;
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0) return SF_OK;
        zmq_pollitem_t items[2] = {{s->router, 0, ZMQ_POLLIN, 0}, {s->zap, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, s->zap ? 2 : 1, left > 1000 ? 1000 : (long)left) < 0) {
            if (zmq_errno() == EINTR) continue;
            return sf_error(SF_E_IO, "rendezvous: poll: %s", zmq_strerror(zmq_errno()));
        }
        if (s->zap && (items[1].revents & ZMQ_POLLIN)) zap_answer(s);
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t id;
        zmq_msg_init(&id);
        int rc = zmq_msg_recv(&id, s->router, ZMQ_DONTWAIT);
        if (rc < 0 || !zmq_msg_more(&id)) {
            zmq_msg_close(&id);
            continue;
        }
        int from = peer_index(s, zmq_msg_data(&id), zmq_msg_size(&id));
        zmq_msg_close(&id);
        if (zmq_msg_recv(body, s->router, 0) < 0) continue;
        while (zmq_msg_more(body)) { /* a DEALER of ours sends one frame: drop anything more */
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            zmq_msg_recv(&extra, s->router, 0);
            int more = zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            if (!more) break;
        }
        if (from < 0) continue; /* more connections than ranks: ignored */
        *got = from;
        return SF_OK;
    }
}

static int missing_ranks(server *s, const int *have, const char *what)
{
    char list[400] = "";
    int n = 0;
    for (int r = 1; r < s->world; r++) {
        if (have[r]) continue;
        size_t at = strlen(list);
        if (at > sizeof list - 80) {
            snprintf(list + at, sizeof list - at, ", ...");
            break;
        }
        const char *e = s->c->rank_endpoints ? s->c->rank_endpoints[r] : NULL;
        snprintf(list + at, sizeof list - at, "%s%d%s%s%s", n++ ? ", " : "", r, e ? " (" : "", e ? e : "", e ? ")" : "");
    }
    return sf_error(SF_E_PEER, "rendezvous at %s: rank%s %s %s within %d ms", s->c->endpoint, n > 1 ? "s" : "", list,
                    what, s->c->timeout_ms);
}

/* WELCOME and the payload's chunks to rank r. */
static int welcome(server *s, int r, const sf_buffer *table, const sf_buffer *payload)
{
    const identity *to = &s->peers[s->arrived[r] - 1];
    sf_buffer b = {0};
    int bad = 0;
    put_header(&b, &bad, T_WELCOME);
    put_u32(&b, &bad, (uint32_t)s->world);
    put_u64(&b, &bad, payload->len);
    put_bytes(&b, &bad, table->data, table->len);
    int rc = bad ? sf_error(SF_E_NOMEM, "out of memory") : SF_OK;
    if (rc == SF_OK && send_to(s, to, b.data, b.len) != 0) rc = -1;
    for (size_t at = 0; rc == SF_OK && at < payload->len; at += SF_RENDEZVOUS_CHUNK) {
        size_t n = payload->len - at < SF_RENDEZVOUS_CHUNK ? payload->len - at : SF_RENDEZVOUS_CHUNK;
        b.len = 0;
        put_header(&b, &bad, T_CHUNK);
        put_u64(&b, &bad, at);
        put_bytes(&b, &bad, payload->data + at, n);
        if (bad) rc = sf_error(SF_E_NOMEM, "out of memory");
        else if (send_to(s, to, b.data, b.len) != 0) rc = -1;
    }
    sf_buffer_release(&b);
    if (rc == -1)
        rc = sf_error(SF_E_PEER, "rank %d (host %s) left before taking its welcome: %s", r, s->hello[r].host,
                      zmq_strerror(zmq_errno()));
    return rc;
}

static int serve(server *s, sf_rendezvous_payload_fn payload, void *user, sf_rendezvous_result **out)
{
    const sf_rendezvous_config *c = s->c;
    if (!(s->router = zmq_socket(s->ctx, ZMQ_ROUTER))) return sf_error(SF_E_IO, "rendezvous: %s", zmq_strerror(zmq_errno()));
    set_int(s->router, ZMQ_LINGER, 2000);
    set_int(s->router, ZMQ_ROUTER_MANDATORY, 1);
    set_int(s->router, ZMQ_SNDHWM, 8);
    set_int(s->router, ZMQ_SNDTIMEO, c->timeout_ms);
    int64_t maxmsg = MAX_HELLO;
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (!c->plaintext) {
        if (!(s->zap = zmq_socket(s->ctx, ZMQ_REP)) || zmq_bind(s->zap, ZAP_ENDPOINT) != 0)
            return sf_error(SF_E_IO, "rendezvous: ZAP handler: %s", zmq_strerror(zmq_errno()));
        set_int(s->router, ZMQ_CURVE_SERVER, 1);
        if (set_key(s->router, ZMQ_CURVE_SECRETKEY, c->secret_key) != 0 ||
            zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "seqflow", 7) != 0)
            return sf_error(SF_E_INVAL, "rendezvous: rank 0's secret key refused by libzmq: %s", zmq_strerror(zmq_errno()));
    }
    if (zmq_bind(s->router, c->endpoint) != 0)
        return sf_error(SF_E_IO, "rendezvous: cannot bind %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
    int rc = SF_OK, arrived = 1;
    long long deadline = now_ms() + c->timeout_ms;
    zmq_msg_t body;
    while (arrived < s->world) {
        zmq_msg_init(&body);
        int from;
        rc = serve_recv(s, deadline, &from, &body);
        if (rc == SF_OK && from < 0) rc = missing_ranks(s, s->arrived, "never arrived");
        if (rc == SF_OK) {
            sf_byte_reader r = {zmq_msg_data(&body), zmq_msg_size(&body), 0, 0};
            int version, type = get_header(&r, &version);
            if (type == -2)
                rc = sf_error(SF_E_PEER, "rendezvous: a rank speaks protocol %d, rank 0 (host %s) %d: another seqflow version",
                              version, s->hello[0].host, SF_RENDEZVOUS_PROTOCOL);
            else if (type == T_ASK)
                rc = give_topology(s, from, &r, c->plaintext ? NULL : zmq_msg_gets(&body, "User-Id"));
            else if (type != T_HELLO)
                rc = sf_error(SF_E_PEER, "rendezvous: a message of type %d before every rank said hello", type);
            else if ((rc = take_hello(s, from, &r, c->plaintext ? NULL : zmq_msg_gets(&body, "User-Id"))) == SF_OK)
                arrived++;
        }
        zmq_msg_close(&body);
        if (rc != SF_OK) return refuse_all(s, rc);
    }
    /* everyone is here and agrees: the table of every rank, then each rank's welcome */
    sf_buffer table = {0}, data = {0};
    int bad = 0;
    for (int r = 0; r < s->world; r++) {
        put_str(&table, &bad, s->hello[r].endpoint);
        put_str(&table, &bad, s->hello[r].host);
        put_blob(&table, &bad, s->hello[r].blob, s->hello[r].blob_len);
    }
    if (bad) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc == SF_OK) rc = result_new(0, s->world, out);
    for (int r = 0; r < s->world && rc == SF_OK; r++) {
        const hello_in *h = &s->hello[r];
        rc = peer_set(&(*out)->peers[r], h->endpoint, h->host, h->blob, h->blob_len);
    }
    for (int r = 0; r < s->world && rc == SF_OK; r++) {
        data.len = 0;
        if (payload && (rc = payload(user, r, &data)) != SF_OK) break;
        if (data.len > c->max_payload) {
            rc = sf_error(SF_E_INVAL, "rendezvous: the payload for rank %d is %zu bytes, over the limit of %zu", r,
                          data.len, c->max_payload);
        } else if (r == 0) {
            (*out)->payload = data.data, (*out)->payload_len = data.len;
            data = (sf_buffer){0};
        } else {
            rc = welcome(s, r, &table, &data);
        }
    }
    sf_buffer_release(&table);
    sf_buffer_release(&data);
    if (rc != SF_OK) return refuse_all(s, rc);
    /* serve returns once every rank holds its payload */
    int confirmed = 1;
    s->done[0] = 1;
    deadline = now_ms() + c->timeout_ms;
    while (confirmed < s->world) {
        zmq_msg_init(&body);
        int from;
        rc = serve_recv(s, deadline, &from, &body);
        if (rc == SF_OK && from < 0) rc = missing_ranks(s, s->done, "did not confirm their welcome");
        if (rc == SF_OK) {
            sf_byte_reader r = {zmq_msg_data(&body), zmq_msg_size(&body), 0, 0};
            int version;
            for (int k = 1; k < s->world; k++)
                if (s->arrived[k] == from + 1 && !s->done[k] && get_header(&r, &version) == T_DONE)
                    s->done[k] = 1, confirmed++;
        }
        zmq_msg_close(&body);
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}

int sf_rendezvous_serve(const sf_rendezvous_config *c, const sf_hello *own, sf_rendezvous_payload_fn payload,
                        void *user, sf_rendezvous_result **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_rendezvous_serve: NULL argument");
    *out = NULL;
    if (!c || !c->endpoint) return sf_error(SF_E_INVAL, "sf_rendezvous_serve: no rendezvous endpoint");
    int rc = check_hello(own, "sf_rendezvous_serve");
    if (rc != SF_OK) return rc;
    if (own->rank != 0) return sf_error(SF_E_INVAL, "sf_rendezvous_serve: rank 0 serves the rendezvous, not rank %d", own->rank);
    sf_rendezvous_config cfg = *c;
    if (cfg.timeout_ms <= 0) cfg.timeout_ms = SF_RENDEZVOUS_DEFAULT_TIMEOUT_MS;
    if (!cfg.max_payload) cfg.max_payload = SF_RENDEZVOUS_DEFAULT_MAX_PAYLOAD;
    if (!cfg.plaintext) {
        if (!cfg.secret_key || !cfg.rank_keys)
            return sf_error(SF_E_INVAL, "rendezvous: CURVE needs rank 0's secret key and every rank's public key");
        for (int r = 0; r < own->world; r++)
            if (!cfg.rank_keys[r] || strlen(cfg.rank_keys[r]) != 40)
                return sf_error(SF_E_INVAL, "rendezvous: rank %d has no valid public key", r);
    }
    server s = {.c = &cfg, .own = own, .world = own->world, .cap_peers = 2 * own->world + 16};
    s.hello = calloc((size_t)s.world, sizeof *s.hello);
    s.arrived = calloc((size_t)s.world, sizeof *s.arrived);
    s.done = calloc((size_t)s.world, sizeof *s.done);
    s.peers = calloc((size_t)s.cap_peers, sizeof *s.peers);
    s.ctx = zmq_ctx_new();
    if (!s.hello || !s.arrived || !s.done || !s.peers || !s.ctx) {
        rc = sf_error(SF_E_NOMEM, "out of memory");
    } else {
        hello_in *h0 = &s.hello[0];
        h0->rank = 0, h0->world = own->world;
        h0->model = own->model_hash, h0->config = own->config_hash;
        h0->pipeline = own->pipeline_hash, h0->options = own->options_hash;
        snprintf(h0->version, sizeof h0->version, "%s", own->version ? own->version : "");
        snprintf(h0->endpoint, sizeof h0->endpoint, "%s", own->endpoint ? own->endpoint : "");
        snprintf(h0->host, sizeof h0->host, "%s", own->host ? own->host : "");
        if (own->blob_len) memcpy(h0->blob, own->blob, own->blob_len);
        h0->blob_len = own->blob_len;
        s.arrived[0] = -1; /* rank 0 is here, with no connection */
        rc = serve(&s, payload, user, out);
    }
    if (rc != SF_OK) {
        sf_rendezvous_result_free(*out);
        *out = NULL;
    }
    if (s.router) zmq_close(s.router);
    if (s.zap) zmq_close(s.zap);
    if (s.ctx) zmq_ctx_term(s.ctx);
    free(s.hello);
    free(s.arrived);
    free(s.done);
    free(s.peers);
    return rc;
}

/* ---- join ------------------------------------------------------------------------------------- */

typedef struct client {
    void *ctx, *sock, *monitor;
    const sf_rendezvous_config *c;
    int handshake_ok;
} client;

/* Reads one monitor event; returns the handshake failure's message, or NULL. */
static const char *monitor_event(client *cl, int *failed)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    *failed = 0;
    if (zmq_msg_recv(&m, cl->monitor, ZMQ_DONTWAIT) < 0) return zmq_msg_close(&m), NULL;
    uint16_t event = 0;
    if (zmq_msg_size(&m) >= 2) memcpy(&event, zmq_msg_data(&m), 2);
    int more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    if (more) { /* the second frame: the endpoint */
        zmq_msg_init(&m);
        zmq_msg_recv(&m, cl->monitor, 0);
        zmq_msg_close(&m);
    }
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) cl->handshake_ok = 1;
    /* the HELLO went over the lost connection: nothing will answer it */
    if (event == ZMQ_EVENT_DISCONNECTED && cl->handshake_ok) {
        *failed = 1;
        return "closed the connection without an answer: rank 0 refused the job or stopped (its message says why)";
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        *failed = 1;
        return "refused this rank's CURVE key (not one of the topology's, or not this rank's)";
    }
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
        *failed = 1;
        return "failed the CURVE handshake (a wrong server key for rank 0, or plaintext on one side only)";
    }
    return NULL;
}

/* Waits for the next message on the DEALER until *deadline (ms), watching handshake events.
 * The first successful handshake extends *deadline: the server is there, and answers once
 * every rank has arrived or its own timeout has passed. */
static int client_recv(client *cl, long long *deadline, zmq_msg_t *msg, const char *waiting_for)
{
    for (;;) {
        long long left = *deadline - now_ms();
        if (left <= 0) {
            if (cl->handshake_ok)
                return sf_error(SF_E_PEER, "rendezvous at %s: no %s within %d ms", cl->c->endpoint, waiting_for,
                                cl->c->timeout_ms);
            return sf_error(SF_E_PEER, "rendezvous at %s (rank 0) did not answer within %d ms: is rank 0 running and "
                                       "the endpoint reachable?", cl->c->endpoint, cl->c->timeout_ms);
        }
        zmq_pollitem_t items[2] = {{cl->sock, 0, ZMQ_POLLIN, 0}, {cl->monitor, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, left > 1000 ? 1000 : (long)left) < 0) {
            if (zmq_errno() == EINTR) continue;
            return sf_error(SF_E_IO, "rendezvous: poll: %s", zmq_strerror(zmq_errno()));
        }
        if (items[0].revents & ZMQ_POLLIN) {
            if (zmq_msg_recv(msg, cl->sock, ZMQ_DONTWAIT) >= 0) return SF_OK;
            if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
                return sf_error(SF_E_PEER, "rendezvous at %s: %s", cl->c->endpoint, zmq_strerror(zmq_errno()));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            int failed, before = cl->handshake_ok;
            const char *why = monitor_event(cl, &failed);
            if (failed) {
                /* a refusal sent just before the server closed may still be on its way in */
                zmq_pollitem_t last = {cl->sock, 0, ZMQ_POLLIN, 0};
                if (zmq_poll(&last, 1, 200) == 1 && zmq_msg_recv(msg, cl->sock, ZMQ_DONTWAIT) >= 0) return SF_OK;
                return sf_error(SF_E_PEER, "rendezvous at %s %s", cl->c->endpoint, why);
            }
            if (!before && cl->handshake_ok) *deadline = now_ms() + 2LL * cl->c->timeout_ms + 5000;
        }
    }
}

static int read_welcome(sf_byte_reader *r, int rank, size_t max_payload, sf_rendezvous_result **out, uint64_t *payload_len)
{
    int world = (int32_t)sf_byte_le(r, 4);
    *payload_len = sf_byte_le(r, 8);
    if (r->bad || world < 1 || world > (1 << 20) || rank >= world)
        return sf_error(SF_E_PEER, "rendezvous: a malformed WELCOME (world %d)", world);
    if (*payload_len > max_payload)
        return sf_error(SF_E_PEER, "rendezvous: the payload for rank %d is %llu bytes, over this rank's limit of %zu",
                        rank, (unsigned long long)*payload_len, max_payload);
    /* each rank takes at least 6 bytes: a world the message cannot hold is refused unallocated */
    if ((r->n - r->at) / 6 < (size_t)world) return sf_error(SF_E_PEER, "rendezvous: a WELCOME shorter than its world");
    int rc = result_new(rank, world, out);
    for (int i = 0; i < world && rc == SF_OK; i++) {
        char endpoint[MAX_STR + 1], host[MAX_STR + 1];
        size_t blob_len;
        get_str(r, endpoint, sizeof endpoint);
        get_str(r, host, sizeof host);
        const uint8_t *blob = get_blob(r, SF_RENDEZVOUS_MAX_BLOB, &blob_len);
        if (r->bad) rc = sf_error(SF_E_PEER, "rendezvous: a malformed WELCOME (rank %d's entry)", i);
        else rc = peer_set(&(*out)->peers[i], endpoint, host, blob, blob_len);
    }
    if (rc == SF_OK && r->at != r->n) rc = sf_error(SF_E_PEER, "rendezvous: a WELCOME longer than its world");
    return rc;
}

/* The DEALER to the server (keys, monitor, connected). */
static int client_open(client *cl)
{
    const sf_rendezvous_config *c = cl->c;
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://sf-rendezvous-monitor-%p", (void *)cl);
    if (!(cl->sock = zmq_socket(cl->ctx, ZMQ_DEALER))) return sf_error(SF_E_IO, "rendezvous: %s", zmq_strerror(zmq_errno()));
    set_int(cl->sock, ZMQ_LINGER, 1000);
    int64_t maxmsg = SF_RENDEZVOUS_CHUNK + (1 << 20);
    zmq_setsockopt(cl->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (!c->plaintext &&
        (set_key(cl->sock, ZMQ_CURVE_SERVERKEY, c->server_public_key) || set_key(cl->sock, ZMQ_CURVE_PUBLICKEY, c->public_key) ||
         set_key(cl->sock, ZMQ_CURVE_SECRETKEY, c->secret_key)))
        return sf_error(SF_E_INVAL, "rendezvous: CURVE keys refused by libzmq: %s", zmq_strerror(zmq_errno()));
    if (zmq_socket_monitor(cl->sock, mon, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED |
                                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
        !(cl->monitor = zmq_socket(cl->ctx, ZMQ_PAIR)) || zmq_connect(cl->monitor, mon) != 0)
        return sf_error(SF_E_IO, "rendezvous: monitor: %s", zmq_strerror(zmq_errno()));
    if (zmq_connect(cl->sock, c->endpoint) != 0)
        return sf_error(SF_E_INVAL, "rendezvous: cannot connect to %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
    return SF_OK;
}

static int join(client *cl, const sf_hello *own, sf_rendezvous_result **out)
{
    const sf_rendezvous_config *c = cl->c;
    size_t max_payload = c->max_payload ? c->max_payload : SF_RENDEZVOUS_DEFAULT_MAX_PAYLOAD;
    int rc = client_open(cl);
    if (rc != SF_OK) return rc;
    sf_buffer b = {0};
    rc = encode_hello(own, &b);
    if (rc == SF_OK && send_buf(cl->sock, &b, 0) != 0)
        rc = sf_error(SF_E_IO, "rendezvous: sending HELLO: %s", zmq_strerror(zmq_errno()));
    sf_buffer_release(&b);
    if (rc != SF_OK) return rc;
    /* the server answers once every rank has arrived: up to its own timeout after the handshake */
    long long deadline = now_ms() + c->timeout_ms;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    uint64_t expected = 0;
    for (int welcomed = 0;;) {
        rc = client_recv(cl, &deadline, &msg, welcomed ? "payload" : "WELCOME");
        if (rc != SF_OK) break;
        sf_byte_reader r = {zmq_msg_data(&msg), zmq_msg_size(&msg), 0, 0};
        int version, type = get_header(&r, &version);
        if (type == -2) {
            rc = sf_error(SF_E_PEER, "rendezvous at %s speaks protocol %d, this rank %d: another seqflow version",
                          c->endpoint, version, SF_RENDEZVOUS_PROTOCOL);
        } else if (type == T_REFUSE) {
            char text[MAX_STR + 1];
            get_str(&r, text, sizeof text);
            rc = sf_error(SF_E_PEER, "refused by the rendezvous: %s", r.bad ? "(malformed refusal)" : text);
        } else if (type == T_WELCOME && !welcomed) {
            rc = read_welcome(&r, own->rank, max_payload, out, &expected);
            welcomed = 1;
        } else if (type == T_CHUNK && welcomed) {
            uint64_t offset = sf_byte_le(&r, 8);
            size_t n = r.n - r.at;
            sf_rendezvous_result *res = *out;
            if (r.bad || offset != res->payload_len || n > expected - res->payload_len)
                rc = sf_error(SF_E_PEER, "rendezvous: a payload chunk out of place (offset %llu)", (unsigned long long)offset);
            else {
                uint8_t *p = realloc(res->payload, res->payload_len + n);
                if (!p) rc = sf_error(SF_E_NOMEM, "out of memory for the rendezvous payload");
                else memcpy(p + res->payload_len, r.p + r.at, n), res->payload = p, res->payload_len += n;
            }
            deadline = now_ms() + c->timeout_ms;
        } else {
            rc = sf_error(SF_E_PEER, "rendezvous at %s: an unexpected message (type %d)", c->endpoint, type);
        }
        zmq_msg_close(&msg);
        zmq_msg_init(&msg);
        if (rc != SF_OK || (welcomed && (*out)->payload_len == expected)) break;
    }
    zmq_msg_close(&msg);
    if (rc != SF_OK) return rc;
    b = (sf_buffer){0};
    int bad = 0;
    put_header(&b, &bad, T_DONE);
    if (bad || send_buf(cl->sock, &b, 0) != 0) rc = sf_error(SF_E_IO, "rendezvous: sending DONE failed");
    sf_buffer_release(&b);
    return rc;
}

/* Asks for the topology (ASK) and waits for it. */
static int ask(client *cl, int rank, char **text, size_t *len)
{
    const sf_rendezvous_config *c = cl->c;
    int rc = client_open(cl);
    if (rc != SF_OK) return rc;
    sf_buffer b = {0};
    int bad = 0;
    put_header(&b, &bad, T_ASK);
    put_u32(&b, &bad, (uint32_t)rank);
    if (bad || send_buf(cl->sock, &b, 0) != 0) rc = sf_error(SF_E_IO, "rendezvous: sending the topology request failed");
    sf_buffer_release(&b);
    long long deadline = now_ms() + c->timeout_ms;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (rc == SF_OK) rc = client_recv(cl, &deadline, &msg, "topology");
    if (rc == SF_OK) {
        sf_byte_reader r = {zmq_msg_data(&msg), zmq_msg_size(&msg), 0, 0};
        int version, type = get_header(&r, &version);
        size_t n = type == T_TOPOLOGY ? (size_t)sf_byte_le(&r, 4) : 0;
        if (type == T_REFUSE) {
            char refusal[MAX_STR + 1];
            get_str(&r, refusal, sizeof refusal);
            rc = sf_error(SF_E_PEER, "refused by the rendezvous: %s", r.bad ? "(malformed refusal)" : refusal);
        } else if (type != T_TOPOLOGY || r.bad || n != r.n - r.at) {
            rc = sf_error(SF_E_PEER, "rendezvous at %s: a malformed answer to the topology request (type %d)", c->endpoint, type);
        } else if (!(*text = malloc(n + 1))) {
            rc = sf_error(SF_E_NOMEM, "out of memory");
        } else {
            memcpy(*text, r.p + r.at, n);
            (*text)[n] = '\0';
            *len = n;
        }
    }
    zmq_msg_close(&msg);
    return rc;
}

/* Runs join or ask on a context and socket of its own, closed before returning. */
static int client_run(const sf_rendezvous_config *c, const sf_hello *own, sf_rendezvous_result **out, int rank,
                      char **text, size_t *len)
{
    sf_rendezvous_config cfg = *c;
    if (cfg.timeout_ms <= 0) cfg.timeout_ms = SF_RENDEZVOUS_DEFAULT_TIMEOUT_MS;
    if (!cfg.plaintext && (!cfg.server_public_key || !cfg.public_key || !cfg.secret_key))
        return sf_error(SF_E_INVAL, "rendezvous: CURVE needs rank 0's public key and this rank's key pair");
    client cl = {.c = &cfg};
    if (!(cl.ctx = zmq_ctx_new())) return sf_error(SF_E_IO, "rendezvous: %s", zmq_strerror(zmq_errno()));
    int rc = own ? join(&cl, own, out) : ask(&cl, rank, text, len);
    if (rc != SF_OK && cl.sock) set_int(cl.sock, ZMQ_LINGER, 0);
    if (cl.sock) zmq_socket_monitor(cl.sock, NULL, 0);
    if (cl.monitor) zmq_close(cl.monitor);
    if (cl.sock) zmq_close(cl.sock);
    zmq_ctx_term(cl.ctx);
    return rc;
}

int sf_rendezvous_join(const sf_rendezvous_config *c, const sf_hello *own, sf_rendezvous_result **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_rendezvous_join: NULL argument");
    *out = NULL;
    if (!c || !c->endpoint) return sf_error(SF_E_INVAL, "sf_rendezvous_join: no rendezvous endpoint");
    int rc = check_hello(own, "sf_rendezvous_join");
    if (rc == SF_OK) rc = client_run(c, own, out, 0, NULL, NULL);
    if (rc != SF_OK) {
        sf_rendezvous_result_free(*out);
        *out = NULL;
    }
    return rc;
}

int sf_rendezvous_fetch_topology(const sf_rendezvous_config *c, int rank, char **text, size_t *len)
{
    if (!text || !len) return sf_error(SF_E_INVAL, "sf_rendezvous_fetch_topology: NULL argument");
    *text = NULL;
    *len = 0;
    if (!c || !c->endpoint) return sf_error(SF_E_INVAL, "sf_rendezvous_fetch_topology: no rendezvous endpoint");
    if (rank <= 0) return sf_error(SF_E_INVAL, "sf_rendezvous_fetch_topology: rank 0 serves the topology, it does not ask");
    int rc = client_run(c, NULL, NULL, rank, text, len);
    if (rc != SF_OK) {
        free(*text);
        *text = NULL;
        *len = 0;
    }
    return rc;
}
