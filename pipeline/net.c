/* The network transport's context (pipeline/net.h): the ZeroMQ context, the I/O thread that
 * owns every socket, the peers (connection, heartbeats, silence), the ZAP handler and the
 * envelope. The link halves and their protocol are in net_link.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/net_internal.h"
#include "pipeline/zap.h"
#include "seqflow/error.h"

int64_t net_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void net_wake(sf_net *n)
{
    uint64_t one = 1;
    ssize_t w = write(n->wake_fd, &one, sizeof one); /* a full counter still wakes the thread */
    (void)w;
}

/* ---- the envelope --------------------------------------------------------------------- */

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

void net_env_pack(const net_env *e, uint8_t out[ENV_SIZE])
{
    memcpy(out, ENV_MAGIC, 4);
    out[4] = ENV_VERSION;
    out[5] = (uint8_t)e->type;
    put_le(out + 6, (uint64_t)e->flags, 2);
    put_le(out + 8, e->rank, 4);
    put_le(out + 12, e->channel, 4);
    put_le(out + 16, e->seq, 8);
    put_le(out + 24, e->a, 8);
    put_le(out + 32, e->b, 8);
    put_le(out + 40, e->c, 4);
    put_le(out + 44, sf_crc32c(0, out, 44), 4);
}

int net_env_parse(const uint8_t *buf, size_t len, net_env *e)
{
    if (len != ENV_SIZE) return sf_error(SF_E_PEER, "an envelope of %zu bytes (%d expected)", len, ENV_SIZE);
    if (memcmp(buf, ENV_MAGIC, 4) != 0) return sf_error(SF_E_PEER, "bad envelope magic");
    if (get_le(buf + 44, 4) != sf_crc32c(0, buf, 44)) return sf_error(SF_E_PEER, "envelope checksum mismatch");
    if (buf[4] != ENV_VERSION) return sf_error(SF_E_PEER, "envelope version %u unknown", buf[4]);
    e->type = buf[5];
    e->flags = (int)get_le(buf + 6, 2);
    e->rank = (uint32_t)get_le(buf + 8, 4);
    e->channel = (uint32_t)get_le(buf + 12, 4);
    e->seq = get_le(buf + 16, 8);
    e->a = get_le(buf + 24, 8);
    e->b = get_le(buf + 32, 8);
    e->c = (uint32_t)get_le(buf + 40, 4);
    if (e->type < MSG_DATA || e->type > MSG_BYE) return sf_error(SF_E_PEER, "message type %d unknown", e->type);
    if (e->flags & ~ENV_NACK) return sf_error(SF_E_PEER, "envelope flags 0x%x unknown", e->flags);
    return SF_OK;
}

/* ---- peers ---------------------------------------------------------------------------- */

static void queue_ctrl(sf_net *n, int peer, const net_env *e, const char *text)
{
    net_ctrl *c = calloc(1, sizeof *c);
    if (!c) return; /* the peer then learns by its own timeout */
    c->peer = peer, c->e = *e;
    snprintf(c->text, sizeof c->text, "%s", text ? text : "");
    *n->ctrl_tail = c;
    n->ctrl_tail = &c->next;
}

void net_queue_abort(sf_net *n, int peer, int type, uint32_t channel, int code, const char *text)
{
    const net_env e = {type, 0, (uint32_t)n->o.rank, channel, 0, (uint64_t)(int64_t)code, 0, 0};
    queue_ctrl(n, peer, &e, text);
}

void net_queue_ack(sf_net *n, int peer, const net_env *e) { queue_ctrl(n, peer, e, NULL); }

void net_fail_peer(sf_net *n, int peer, int code, const char *fmt, ...)
{
    net_peer *p = &n->peers[peer];
    if (p->failed) return;
    p->failed = 1;
    char message[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    for (net_link *l = n->links; l; l = net_link_next(l)) {
        if (net_link_peer(l) != peer) continue;
        /* tell it too, best effort: after a one-way partition it still hears us, and would
         * otherwise wait for a receiver that gave up on it */
        if (p->dealer[NET_CONTROL]) {
            net_env e = {net_link_direction(l) == SF_NET_SEND ? MSG_ABORT_TO_RECV : MSG_ABORT_TO_SEND, 0,
                         (uint32_t)n->o.rank, net_link_channel(l), 0, (uint64_t)(int64_t)code, 0, 0};
            zmq_msg_t text;
            zmq_msg_init_size(&text, strlen(message) < ABORT_TEXT_MAX ? strlen(message) : ABORT_TEXT_MAX);
            memcpy(zmq_msg_data(&text), message, zmq_msg_size(&text));
            net_send(n, p, NET_CONTROL, &e, &text);
            zmq_msg_close(&text);
        }
        net_link_fail(l, code, 0, "%s", message);
    }
}

int net_send(sf_net *n, net_peer *p, int which, const net_env *e, zmq_msg_t *payload)
{
    uint8_t buf[ENV_SIZE];
    net_env_pack(e, buf);
    void *d = p->dealer[which];
    if (!d || p->blocked[which]) return 1;
    if (zmq_send(d, buf, ENV_SIZE, ZMQ_DONTWAIT | (payload ? ZMQ_SNDMORE : 0)) < 0) {
        if (errno == EAGAIN) {
            p->blocked[which] = 1;
            return 1;
        }
        return -1;
    }
    /* ZeroMQ delivers a multipart message whole once its first part is accepted */
    const size_t size = payload ? zmq_msg_size(payload) : 0;
    if (payload && zmq_msg_send(payload, d, ZMQ_DONTWAIT) < 0) return -1;
    n->stats.bytes_sent += ENV_SIZE + size;
    if (e->type == MSG_DATA) n->stats.packets_sent++, n->stats.packet_bytes_sent += size;
    return 0;
}

static void set_int(void *s, int option, int value) { zmq_setsockopt(s, option, &value, sizeof value); }

/* ZMTP heartbeats. libzmq restarts a connection's timeout only when a whole message arrives,
 * so a side that waits for them behind a large packet on a slow path (a segment is tens of
 * MiB) would cut a healthy connection and resend forever. Hence: the dealers ping (their
 * replies come back on an idle direction) and time out; the control dealer also asks the
 * ROUTER to drop it after a silence (TTL), the data dealer does not; the ROUTER only answers.
 * A peer's death is the application heartbeat's business (on the control connection). */
static void common_options(sf_net *n, void *s, int which)
{
    set_int(s, ZMQ_LINGER, n->o.linger_ms);
    set_int(s, ZMQ_HEARTBEAT_IVL, which < 0 ? 0 : n->o.heartbeat_ms);
    set_int(s, ZMQ_HEARTBEAT_TIMEOUT, n->o.timeout_ms);
    set_int(s, ZMQ_HEARTBEAT_TTL, which == NET_CONTROL ? n->o.timeout_ms : 0);
    /* data is bounded by the links' credit and acknowledgements are coalesced per link, so
     * these only cap what a misbehaving peer can queue */
    set_int(s, ZMQ_SNDHWM, 1024);
    set_int(s, ZMQ_RCVHWM, 1024);
    int64_t max = (int64_t)n->max_bytes + 4096;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max);
}

/* Creates the two dealers and their monitors (I/O thread, under lock). */
static void activate(sf_net *n, int i)
{
    net_peer *p = &n->peers[i];
    p->active = 1, p->want_active = 0;
    p->activated_ms = net_now_ms();
    p->next_heartbeat_ms = 0;
    for (int which = 0; which < 2 && !p->failed; which++) {
        void *d = zmq_socket(n->ctx, ZMQ_DEALER);
        if (!d) {
            net_fail_peer(n, i, SF_E_PEER, "rank %d (host %s): cannot make a socket: %s", p->rank, p->host, zmq_strerror(errno));
            return;
        }
        common_options(n, d, which);
        set_int(d, ZMQ_IMMEDIATE, 1); /* queue nothing for a connection that is not up: we resend */
        set_int(d, ZMQ_RECONNECT_IVL, 100);
        set_int(d, ZMQ_RECONNECT_IVL_MAX, 1000);
        if (p->has_key) {
            zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, p->public_key, 40);
            zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, n->o.public_key, 40);
            zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, n->o.secret_key, 40);
        }
        char addr[96];
        snprintf(addr, sizeof addr, "inproc://sf-net-%p-monitor-%d-%d", (void *)n, i, which);
        if (zmq_socket_monitor(d, addr, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) == 0) {
            p->monitor[which] = zmq_socket(n->ctx, ZMQ_PAIR);
            if (p->monitor[which] && zmq_connect(p->monitor[which], addr) != 0)
                zmq_close(p->monitor[which]), p->monitor[which] = NULL;
        }
        p->dealer[which] = d;
        if (zmq_connect(d, p->endpoint) != 0)
            net_fail_peer(n, i, SF_E_PEER, "rank %d (host %s): cannot connect to %s: %s", p->rank, p->host, p->endpoint,
                          zmq_strerror(errno));
    }
}

static void on_monitor(sf_net *n, int i, int which)
{
    net_peer *p = &n->peers[i];
    for (;;) {
        zmq_msg_t ev, where;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, p->monitor[which], ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&ev) >= 6) memcpy(&event, zmq_msg_data(&ev), 2);
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more) {
            zmq_msg_init(&where);
            zmq_msg_recv(&where, p->monitor[which], 0);
            zmq_msg_close(&where);
        }
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            p->up[which] = 1;
            p->connected = p->up[0] && p->up[1];
            p->ever_connected = 1;
            p->blocked[which] = 0;
            /* whatever the last connection lost goes again. Not after the dealer's first
             * handshake: nothing can have been lost before it (ZMQ_IMMEDIATE queues nothing
             * without a connection), and packets sent on the new connection before this event
             * was read would go twice (a window of them, on a slow path) */
            if (which != NET_DATA || p->handshakes[which] > 0) net_link_rewind(n, i, which);
            p->handshakes[which]++;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            p->up[which] = 0;
            p->connected = 0;
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            net_fail_peer(n, i, SF_E_PEER, "rank %d (host %s) at %s refused this process (its CURVE key or address is not admitted)",
                          p->rank, p->host, p->endpoint);
        } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
            net_fail_peer(n, i, SF_E_PEER,
                          "handshake with rank %d (host %s) at %s failed (CURVE against plaintext, or a wrong server key)",
                          p->rank, p->host, p->endpoint);
        }
    }
}

static int peer_index(const sf_net *n, int rank)
{
    for (int i = 0; i < n->n_peers; i++)
        if (n->peers[i].rank == rank) return i;
    return -1;
}

/* One message from the ROUTER: identity, envelope, optional payload. */
static int on_router(sf_net *n)
{
    zmq_msg_t id, env, pay;
    zmq_msg_init(&id);
    if (zmq_msg_recv(&id, n->router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&id);
        return 0;
    }
    int more = zmq_msg_more(&id);
    zmq_msg_init(&env);
    zmq_msg_init(&pay);
    int has_payload = 0, extra = 0;
    if (more) {
        zmq_msg_recv(&env, n->router, 0);
        if (zmq_msg_more(&env)) {
            zmq_msg_recv(&pay, n->router, 0);
            has_payload = 1;
            while (zmq_msg_more(&pay)) { /* more parts than any message has: drain them */
                zmq_msg_t x;
                zmq_msg_init(&x);
                zmq_msg_recv(&x, n->router, 0);
                more = zmq_msg_more(&x);
                zmq_msg_close(&x);
                extra = 1;
                if (!more) break;
            }
        }
    }
    /* who sent it: under CURVE the ZAP handler's user id (the rank its key belongs to) */
    int authenticated = -1;
    const char *uid = zmq_msg_gets(&env, "User-Id");
    if (uid && *uid) authenticated = atoi(uid);
    pthread_mutex_lock(&n->lock);
    net_deliver(n, authenticated, zmq_msg_data(&id), zmq_msg_size(&id), zmq_msg_data(&env), zmq_msg_size(&env), &pay,
                has_payload, extra);
    pthread_mutex_unlock(&n->lock);
    zmq_msg_close(&id);
    zmq_msg_close(&env);
    zmq_msg_close(&pay);
    return 1;
}

void net_deliver(sf_net *n, int authenticated, const void *rid, size_t rid_len, const void *env, size_t env_len,
                 zmq_msg_t *payload, int has_payload, int extra)
{
    net_env e;
    int rc = net_env_parse(env, env_len, &e);
    const size_t size = has_payload ? zmq_msg_size(payload) : 0;
    n->stats.bytes_received += env_len + size;
    if (rc == SF_OK && e.type == MSG_DATA) n->stats.packets_received++, n->stats.packet_bytes_received += size;
    char why[200];
    snprintf(why, sizeof why, "%s", rc == SF_OK ? "" : sf_last_error());
    int rank = authenticated >= 0 ? authenticated : (rc == SF_OK ? (int)e.rank : -1);
    int i = rank >= 0 ? peer_index(n, rank) : -1;
    for (int j = 0; j < n->n_peers && i < 0 && rank < 0; j++)
        if (n->peers[j].rid_len && n->peers[j].rid_len == rid_len && !memcmp(n->peers[j].rid, rid, rid_len)) i = j;
    if (i >= 0 && rc == SF_OK && rid_len <= sizeof n->peers[i].rid)
        memcpy(n->peers[i].rid, rid, rid_len), n->peers[i].rid_len = rid_len;
    if (i < 0 || n->peers[i].failed) return;
    net_peer *p = &n->peers[i];
    if (rc == SF_OK && authenticated >= 0 && (int)e.rank != authenticated)
        rc = SF_E_PEER, snprintf(why, sizeof why, "a message claiming to be from rank %u", e.rank);
    if (rc == SF_OK && extra) rc = SF_E_PEER, snprintf(why, sizeof why, "a message of too many parts");
    if (rc != SF_OK) {
        net_fail_peer(n, i, SF_E_PEER, "rank %d (host %s) sent a malformed message: %s", p->rank, p->host, why);
        return;
    }
    p->last_heard_ms = net_now_ms();
    /* nothing follows a BYE on its control connection, so a HEARTBEAT after it is a new process
     * of that rank; a packet or END may still arrive late on the data connection */
    if (e.type == MSG_BYE || e.type == MSG_HEARTBEAT) p->left = e.type == MSG_BYE;
    if (e.type == MSG_BYE) return;
    if (!p->active) p->want_active = 1;
    if (e.type == MSG_HEARTBEAT) p->progress = e.a;
    else net_link_on_message(n, i, &e, payload, has_payload);
}

/* ---- ZAP (RFC 27): admit the peers' keys, or in plaintext their addresses ---------------- */

static int address_allowed(const sf_net *n, const char *addr)
{
    /* not an IP address: an ipc connection ("localhost:uid:gid:pid"), local by nature and
     * guarded by the socket file's permissions */
    uint8_t ip[16];
    if (inet_pton(AF_INET, addr, ip) != 1 && inet_pton(AF_INET6, addr, ip) != 1) return 1;
    if (strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0 || strncmp(addr, "::ffff:127.", 11) == 0)
        return 1;
    for (int i = 0; i < n->n_allowed; i++)
        if (strcmp(addr, n->allowed_addr[i]) == 0) return 1;
    return 0;
}

/* A peer's key, or (plaintext) an address the topology allows. */
static int zap_decide(void *user, const sf_zap_request *r, char *user_id, size_t size)
{
    sf_net *n = user;
    if (r->key && !n->o.plaintext) {
        for (int i = 0; i < n->n_peers; i++)
            if (n->peers[i].has_key && memcmp(n->peers[i].key_bin, r->key, 32) == 0) {
                snprintf(user_id, size, "%d", n->peers[i].rank);
                return 1;
            }
        return 0;
    }
    return strcmp(r->mechanism, "NULL") == 0 && n->o.plaintext && address_allowed(n, r->address);
}

static void on_zap(sf_net *n) { sf_zap_answer(n->zap, zap_decide, n, "not a peer"); }

/* ---- the I/O thread ------------------------------------------------------------------- */

/* The control messages queued for peer i (aborts, acknowledgements), in order, until its
 * connection is full. */
static void send_ctrl(sf_net *n, int i)
{
    net_peer *p = &n->peers[i];
    for (net_ctrl **cc = &n->ctrl; *cc;) {
        net_ctrl *c = *cc;
        if (c->peer != i) {
            cc = &c->next;
            continue;
        }
        zmq_msg_t text;
        zmq_msg_init_size(&text, strlen(c->text));
        memcpy(zmq_msg_data(&text), c->text, strlen(c->text));
        int rc = net_send(n, p, NET_CONTROL, &c->e, c->e.type == MSG_ACK ? NULL : &text);
        zmq_msg_close(&text);
        if (rc == 1) break;
        *cc = c->next;
        if (n->ctrl_tail == &c->next) n->ctrl_tail = cc;
        free(c);
    }
}

/* Heartbeats, silence and connect deadlines, aborts, and every link's pending output. */
static void tick(sf_net *n)
{
    const int64_t now = net_now_ms();
    /* messages still waiting on the ROUTER (this thread was held up: a loaded machine, a
     * stopped process resumed) may be the very heartbeats: read them before judging anyone
     * (up to twice the timeout, so that another peer's flood cannot hide a dead one) */
    int events = 0;
    size_t size = sizeof events;
    const int unread = zmq_getsockopt(n->router, ZMQ_EVENTS, &events, &size) == 0 && (events & ZMQ_POLLIN);
    for (int i = 0; i < n->n_peers; i++) {
        net_peer *p = &n->peers[i];
        if (p->want_active && !p->active) activate(n, i);
        if (!p->active || p->failed) continue;
        if (p->last_heard_ms < 0 && now - p->activated_ms > n->o.connect_timeout_ms) {
            net_fail_peer(n, i, SF_E_PEER, "rank %d (host %s) at %s not reached within %d ms", p->rank, p->host, p->endpoint,
                          n->o.connect_timeout_ms);
            continue;
        }
        if (p->last_heard_ms >= 0 && now - p->last_heard_ms > n->o.timeout_ms &&
            (!unread || now - p->last_heard_ms > 2 * (int64_t)n->o.timeout_ms)) {
            if (!p->left) {
                net_fail_peer(
                    n, i, SF_E_PEER,
                    "rank %d (host %s) stopped answering: silent for %lld ms (timeout %d ms, last progress %llu)",
                    p->rank, p->host, (long long)(now - p->last_heard_ms), n->o.timeout_ms,
                    (unsigned long long)p->progress);
                continue;
            }
            /* it said goodbye: no failure, unless a link with it is still unfinished (one its
             * process never made; what it had made it ended or aborted before leaving, and
             * the timeout gave the last packets time to arrive) */
            int unfinished = 0;
            for (net_link *l = n->links; l && !unfinished; l = net_link_next(l))
                unfinished = net_link_peer(l) == i && net_link_unfinished(l);
            if (unfinished) {
                net_fail_peer(n, i, SF_E_PEER,
                              "rank %d (host %s) left %lld ms ago (its network closed) with a link to or from this "
                              "process unfinished",
                              p->rank, p->host, (long long)(now - p->last_heard_ms));
                continue;
            }
        }
        send_ctrl(n, i);
        if (now >= p->next_heartbeat_ms) {
            net_env e = {MSG_HEARTBEAT, 0, (uint32_t)n->o.rank, 0, 0, n->progress, 0, 0};
            if (net_send(n, p, NET_CONTROL, &e, NULL) == 0) {
                p->next_heartbeat_ms = now + n->o.heartbeat_ms;
                /* an ACK can be lost (one that arrives before its sending half exists is
                 * dropped there; a connection drops what it had queued) and nothing else
                 * makes a receiver with nothing more to receive send another: repeat them */
                net_link_refresh(n, i);
            }
        }
        net_link_flush(n, i);
    }
    /* aborts for failed or never-activated peers are dropped */
    for (net_ctrl **cc = &n->ctrl; *cc;) {
        net_ctrl *c = *cc;
        if (n->peers[c->peer].failed) {
            *cc = c->next;
            if (n->ctrl_tail == &c->next) n->ctrl_tail = cc;
            free(c);
        } else {
            cc = &c->next;
        }
    }
}

static int ctrl_pending(const sf_net *n, int i)
{
    for (const net_ctrl *c = n->ctrl; c; c = c->next)
        if (c->peer == i) return 1;
    return 0;
}

/* BYE to every active peer, the last message on each control connection (ZMQ_LINGER delivers
 * it): a peer that hears this process fall silent after its end must not take it for one that
 * died, nor name it for another's death. A connection still in its first handshake, or full
 * (EAGAIN), gets until a deadline shared by all, at most 100 ms: an ending process must not wait
 * on anyone. */
static void say_goodbye(sf_net *n)
{
    pthread_mutex_lock(&n->lock);
    const net_env e = {MSG_BYE, 0, (uint32_t)n->o.rank, 0, 0, n->progress, 0, 0};
    const int64_t deadline = net_now_ms() + (n->o.linger_ms < 100 ? n->o.linger_ms : 100);
    for (int i = 0; i < n->n_peers; i++) {
        net_peer *p = &n->peers[i];
        /* a connection that went down takes nothing (ZMQ_IMMEDIATE): the rank left or died; one
         * still in its first handshake may come up before the deadline */
        if (!p->active || p->failed || !p->dealer[NET_CONTROL] ||
            (p->handshakes[NET_CONTROL] > 0 && !p->up[NET_CONTROL]))
            continue;
        for (;;) {
            p->blocked[NET_CONTROL] = 0;
            const int64_t left_ms = deadline - net_now_ms();
            /* first what is still queued for it: the aborts of the links this process dropped
             * as it ended (its error, for the peer), which stopping may have cut off before the
             * next tick; the BYE comes last */
            send_ctrl(n, i);
            if ((!ctrl_pending(n, i) && net_send(n, p, NET_CONTROL, &e, NULL) != 1) || left_ms <= 0) break;
            zmq_pollitem_t item = {p->dealer[NET_CONTROL], 0, ZMQ_POLLOUT, 0};
            pthread_mutex_unlock(&n->lock); /* status queries go on meanwhile */
            zmq_poll(&item, 1, (long)left_ms);
            pthread_mutex_lock(&n->lock);
        }
    }
    pthread_mutex_unlock(&n->lock);
}

static void *io_thread(void *arg)
{
    sf_net *n = arg;
    zmq_pollitem_t *items = n->poll_items;
    int *which = n->poll_peer;
    int poll_ms = n->o.heartbeat_ms / 4;
    if (poll_ms < 5) poll_ms = 5;
    if (poll_ms > 100) poll_ms = 100;
    for (;;) {
        pthread_mutex_lock(&n->lock);
        const int stop = n->stop, frozen = n->frozen;
        int k = 0;
        if (!frozen && items) {
            items[k++] = (zmq_pollitem_t){n->router, 0, ZMQ_POLLIN, 0};
            items[k++] = (zmq_pollitem_t){n->zap, 0, ZMQ_POLLIN, 0};
            for (int i = 0; i < n->n_peers; i++) {
                net_peer *p = &n->peers[i];
                for (int w = 0; w < 2; w++) {
                    if (p->monitor[w]) which[k] = i, items[k++] = (zmq_pollitem_t){p->monitor[w], 0, ZMQ_POLLIN, 0};
                    if (p->dealer[w] && p->blocked[w] && !p->failed)
                        which[k] = i, items[k++] = (zmq_pollitem_t){p->dealer[w], 0, ZMQ_POLLOUT, 0};
                }
            }
        }
        if (items) items[k++] = (zmq_pollitem_t){NULL, n->wake_fd, ZMQ_POLLIN, 0};
        pthread_mutex_unlock(&n->lock);
        if (stop || !items) break;
        zmq_poll(items, k, frozen ? 10 : poll_ms);
        uint64_t count;
        if (read(n->wake_fd, &count, sizeof count) < 0) count = 0;
        if (frozen) continue;
        on_zap(n);
        for (int j = 2; j < k - 1; j++) {
            net_peer *p = &n->peers[which[j]];
            for (int w = 0; w < 2; w++) {
                if (items[j].socket == p->monitor[w] && (items[j].revents & ZMQ_POLLIN)) {
                    pthread_mutex_lock(&n->lock);
                    on_monitor(n, which[j], w);
                    pthread_mutex_unlock(&n->lock);
                }
                if (items[j].socket == p->dealer[w] && (items[j].revents & ZMQ_POLLOUT)) p->blocked[w] = 0;
            }
        }
        for (int budget = 256; budget > 0 && on_router(n); budget--) {}
        pthread_mutex_lock(&n->lock);
        tick(n);
        pthread_mutex_unlock(&n->lock);
    }
    say_goodbye(n);
    for (int i = 0; i < n->n_peers; i++) {
        net_peer *p = &n->peers[i];
        for (int w = 0; w < 2; w++) {
            if (p->dealer[w]) zmq_socket_monitor(p->dealer[w], NULL, 0);
            if (p->monitor[w]) zmq_close(p->monitor[w]);
            if (p->dealer[w]) zmq_close(p->dealer[w]);
            p->dealer[w] = p->monitor[w] = NULL;
        }
    }
    zmq_close(n->router);
    zmq_close(n->zap);
    return NULL;
}

/* ---- creation ------------------------------------------------------------------------- */

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

/* "tcp://host:port" -> host ("[::1]" unwrapped); "" for other transports. */
static void endpoint_host(const char *endpoint, char *out, size_t size)
{
    out[0] = 0;
    if (strncmp(endpoint, "tcp://", 6) != 0) return;
    const char *h = endpoint + 6, *end = strrchr(h, ':');
    if (!end) end = h + strlen(h);
    if (*h == '[' && end > h && end[-1] == ']') h++, end--;
    size_t len = (size_t)(end - h);
    if (len >= size) len = size - 1;
    memcpy(out, h, len);
    out[len] = 0;
}

static void allow_host(sf_net *n, const char *host)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (!*host || getaddrinfo(host, NULL, &hints, &res) != 0) return;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        char text[64];
        const void *src = a->ai_family == AF_INET ? (const void *)&((struct sockaddr_in *)a->ai_addr)->sin_addr
                                                  : (const void *)&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
        if (!inet_ntop(a->ai_family, src, text, sizeof text)) continue;
        char **grown = realloc(n->allowed_addr, (size_t)(n->n_allowed + 1) * sizeof *grown);
        if (!grown) break;
        n->allowed_addr = grown;
        if ((grown[n->n_allowed] = strdup(text))) n->n_allowed++;
    }
    freeaddrinfo(res);
}

static int valid_key(const char *key) { return key && strlen(key) == 40; }

static int create(const sf_net_options *opt, int detached, sf_net **out)
{
    *out = NULL;
    if (!opt || !opt->bind || opt->rank < 0 || opt->n_peers < 0 || (opt->n_peers && !opt->peers))
        return sf_error(SF_E_INVAL, "sf_net_create: missing rank, endpoint or peers");
    if (!opt->plaintext && (!valid_key(opt->secret_key) || !valid_key(opt->public_key)))
        return sf_error(SF_E_INVAL, "sf_net_create: rank %d has no CURVE key pair (40-character Z85 keys) and plaintext is off",
                        opt->rank);
    if (!opt->plaintext && !zmq_has("curve")) return sf_error(SF_E_UNSUPPORTED, "libzmq was built without CURVE");
    sf_net *n = calloc(1, sizeof *n);
    if (!n) return sf_error(SF_E_NOMEM, "out of memory for the network");
    n->o = *opt;
    if (n->o.heartbeat_ms <= 0) n->o.heartbeat_ms = 500;
    if (n->o.timeout_ms <= 0) n->o.timeout_ms = 3000;
    if (n->o.connect_timeout_ms <= 0) n->o.connect_timeout_ms = 10000;
    if (n->o.linger_ms <= 0) n->o.linger_ms = 1000;
    n->max_bytes = n->o.max_message_bytes ? n->o.max_message_bytes : (size_t)1 << 30;
    n->bind = dup_str(opt->bind);
    n->o.bind = n->bind, n->o.peers = NULL;
    n->wake_fd = -1;
    n->ctrl_tail = &n->ctrl;
    pthread_mutex_init(&n->lock, NULL);
    int rc = SF_OK;
    n->peers = calloc((size_t)opt->n_peers + 1, sizeof *n->peers);
    if (!n->peers || !n->bind) rc = sf_error(SF_E_NOMEM, "out of memory for the network");
    for (int i = 0; rc == SF_OK && i < opt->n_peers; i++) {
        const sf_net_peer *src = &opt->peers[i];
        net_peer *p = &n->peers[n->n_peers++];
        p->last_heard_ms = -1;
        p->rank = src->rank;
        if (!src->endpoint || src->rank < 0 || src->rank == opt->rank) {
            rc = sf_error(SF_E_INVAL, "sf_net_create: peer %d has no endpoint or is this rank", src->rank);
            break;
        }
        for (int j = 0; j < i; j++)
            if (opt->peers[j].rank == src->rank) rc = sf_error(SF_E_INVAL, "sf_net_create: rank %d listed twice", src->rank);
        char host[256];
        endpoint_host(src->endpoint, host, sizeof host);
        p->endpoint = dup_str(src->endpoint);
        p->host = dup_str(src->host ? src->host : *host ? host : "local");
        if (!p->endpoint || !p->host) rc = sf_error(SF_E_NOMEM, "out of memory for the network");
        if (opt->plaintext) {
            allow_host(n, host);
        } else if (!valid_key(src->public_key) || !zmq_z85_decode(p->key_bin, src->public_key)) {
            rc = sf_error(SF_E_INVAL, "sf_net_create: rank %d has no valid CURVE public key", src->rank);
        } else {
            memcpy(p->public_key, src->public_key, 41);
            p->has_key = 1;
        }
    }
    if (rc == SF_OK) { /* the I/O thread's poll set: router, ZAP, per peer 2 monitors and 2 dealers, the eventfd */
        n->poll_items = calloc(3 + 4 * (size_t)n->n_peers, sizeof *n->poll_items);
        n->poll_peer = calloc(3 + 4 * (size_t)n->n_peers, sizeof *n->poll_peer);
        if (!n->poll_items || !n->poll_peer) rc = sf_error(SF_E_NOMEM, "out of memory for the network");
    }
    if (rc == SF_OK) {
        n->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (n->wake_fd < 0) rc = sf_error(SF_E_IO, "cannot make an eventfd: %s", strerror(errno));
    }
    if (rc == SF_OK && detached) {
        *out = n;
        return SF_OK;
    }
    if (rc == SF_OK) {
        n->ctx = zmq_ctx_new();
        if (!n->ctx) rc = sf_error(SF_E_IO, "cannot make a ZeroMQ context: %s", zmq_strerror(errno));
    }
    if (rc == SF_OK) {
        /* the ZAP handler must exist before the ROUTER accepts anyone: without one libzmq
         * admits every CURVE client */
        n->zap = zmq_socket(n->ctx, ZMQ_REP);
        n->router = zmq_socket(n->ctx, ZMQ_ROUTER);
        if (!n->zap || !n->router || zmq_bind(n->zap, "inproc://zeromq.zap.01") != 0)
            rc = sf_error(SF_E_IO, "cannot start the ZAP handler: %s", zmq_strerror(errno));
    }
    if (rc == SF_OK) {
        common_options(n, n->router, -1);
        zmq_setsockopt(n->router, ZMQ_ZAP_DOMAIN, "seqflow", 7);
        if (!opt->plaintext) {
            set_int(n->router, ZMQ_CURVE_SERVER, 1);
            zmq_setsockopt(n->router, ZMQ_CURVE_SECRETKEY, opt->secret_key, 40);
        }
        if (zmq_bind(n->router, n->bind) != 0)
            rc = sf_error(SF_E_IO, "rank %d cannot listen on %s: %s", opt->rank, n->bind, zmq_strerror(errno));
    }
    if (rc == SF_OK) {
        if (pthread_create(&n->thread, NULL, io_thread, n) != 0) rc = sf_error(SF_E_IO, "cannot start the network thread");
        else n->thread_started = 1;
    }
    if (rc != SF_OK) {
        sf_net_free(n);
        return rc;
    }
    *out = n;
    return SF_OK;
}

int sf_net_create(const sf_net_options *opt, sf_net **out) { return create(opt, 0, out); }

int net_create_detached(const sf_net_options *opt, sf_net **out) { return create(opt, 1, out); }

void sf_net_free(sf_net *n)
{
    if (!n) return;
    if (n->thread_started) {
        pthread_mutex_lock(&n->lock);
        n->stop = 1;
        pthread_mutex_unlock(&n->lock);
        net_wake(n);
        pthread_join(n->thread, NULL);
    } else {
        if (n->router) zmq_close(n->router);
        if (n->zap) zmq_close(n->zap);
    }
    if (n->ctx) zmq_ctx_term(n->ctx);
    if (n->wake_fd >= 0) close(n->wake_fd);
    while (n->ctrl) {
        net_ctrl *c = n->ctrl;
        n->ctrl = c->next;
        free(c);
    }
    for (int i = 0; i < n->n_peers; i++) free(n->peers[i].endpoint), free(n->peers[i].host);
    for (int i = 0; i < n->n_allowed; i++) free(n->allowed_addr[i]);
    free(n->allowed_addr);
    free(n->peers);
    free(n->poll_items);
    free(n->poll_peer);
    free(n->bind);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

void sf_net_progress(sf_net *n, uint64_t count)
{
    pthread_mutex_lock(&n->lock);
    n->progress = count;
    pthread_mutex_unlock(&n->lock);
}

void sf_net_stats_get(sf_net *n, sf_net_stats *out)
{
    pthread_mutex_lock(&n->lock);
    *out = n->stats;
    pthread_mutex_unlock(&n->lock);
}

int sf_net_peer_status_get(sf_net *n, int peer, sf_net_peer_status *out)
{
    int i = peer_index(n, peer);
    if (i < 0) return sf_error(SF_E_INVAL, "rank %d is not a peer", peer);
    pthread_mutex_lock(&n->lock);
    net_peer *p = &n->peers[i];
    out->active = p->active || p->want_active;
    out->connected = p->connected;
    out->failed = p->failed;
    out->left = p->left;
    out->progress = p->progress;
    out->silent_ms = p->last_heard_ms < 0 ? -1 : net_now_ms() - p->last_heard_ms;
    pthread_mutex_unlock(&n->lock);
    return SF_OK;
}

int sf_net_keypair(char public_key[41], char secret_key[41])
{
    if (!zmq_has("curve")) return sf_error(SF_E_UNSUPPORTED, "libzmq was built without CURVE");
    if (zmq_curve_keypair(public_key, secret_key) != 0)
        return sf_error(SF_E_UNSUPPORTED, "zmq_curve_keypair: %s", zmq_strerror(errno));
    return SF_OK;
}

void sf_net_test_freeze(sf_net *n, int frozen)
{
    pthread_mutex_lock(&n->lock);
    n->frozen = frozen;
    pthread_mutex_unlock(&n->lock);
    net_wake(n);
}

void sf_net_test_drop_acks(sf_net *n, int on)
{
    pthread_mutex_lock(&n->lock);
    n->drop_acks = on;
    pthread_mutex_unlock(&n->lock);
    net_wake(n);
}
