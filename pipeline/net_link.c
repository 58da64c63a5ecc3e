/* The link halves of pipeline/net.h and their protocol: sequence numbers, acknowledgements,
 * credit, end of stream and aborts (docs/DISTRIBUTED.md, "Links"). Stage threads run push and
 * pop here (encoding and decoding outside the lock); the I/O thread (net.c) calls
 * net_link_on_message and net_link_flush with the lock held. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/net_internal.h"
#include "seqflow/error.h"

typedef struct out_entry {
    zmq_msg_t msg; /* the encoded packet; copies (shared buffer) are what is sent */
    uint64_t seq;
    int end;
} out_entry;

struct net_link {
    sf_link base;
    net_link *next;
    sf_net *net;
    int peer;
    uint32_t channel;
    int dir;
    sf_link_options o;
    sf_wire_options wo;
    sf_wire_feedback *fb; /* the pushing thread's alone */
    pthread_cond_t cond;
    int error;
    char message[320];
    int closed;   /* send: close() called; recv: END received */
    /* send half */
    out_entry *ring;  /* entries acked+1 .. pushed, at index seq % ring_cap */
    int ring_cap;
    uint64_t pushed, pushed_bytes, acked, popped, popped_bytes, limit;
    int granted;
    uint64_t next_send; /* I/O: next seq to transmit */
    uint64_t last_nack; int64_t last_nack_ms;
    uint64_t *cum_bytes; /* cumulative pushed bytes after each seq (same indexing as ring) */
    /* receive half */
    zmq_msg_t *inbox;
    int inbox_cap, inbox_head, inbox_count;
    uint64_t expected, r_popped, r_popped_bytes;
    int ack_dirty, nack;
    uint64_t nacked_for; int64_t nack_ms;
};

int net_link_peer(const net_link *l) { return l->peer; }
int net_link_direction(const net_link *l) { return l->dir; }
uint32_t net_link_channel(const net_link *l) { return l->channel; }
net_link *net_link_next(const net_link *l) { return l->next; }
int net_link_unfinished(const net_link *l)
{
    return !l->error && !(l->closed && (l->dir == SF_NET_RECV || l->acked >= l->pushed));
}

static const char *dir_name(int dir) { return dir == SF_NET_SEND ? "to" : "from"; }

static void free_send_entries(net_link *l)
{
    for (uint64_t s = l->acked + 1; s <= l->pushed && l->ring; s++) zmq_msg_close(&l->ring[s % l->ring_cap].msg);
    l->acked = l->pushed;
}

static void free_inbox(net_link *l)
{
    while (l->inbox_count > 0) {
        zmq_msg_close(&l->inbox[l->inbox_head]);
        l->inbox_head = (l->inbox_head + 1) % l->inbox_cap;
        l->inbox_count--;
    }
}

static void vfail(net_link *l, int code, int tell, const char *fmt, va_list ap)
{
    if (l->error) return;
    l->error = code;
    vsnprintf(l->message, sizeof l->message, fmt, ap);
    if (l->dir == SF_NET_SEND) free_send_entries(l);
    else free_inbox(l);
    if (tell) {
        const int type = l->dir == SF_NET_SEND ? MSG_ABORT_TO_RECV : MSG_ABORT_TO_SEND;
        net_queue_abort(l->net, l->peer, type, l->channel, code, l->message);
    }
    pthread_cond_broadcast(&l->cond);
}

void net_link_fail(net_link *l, int code, int tell, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(l, code, tell, fmt, ap);
    va_end(ap);
}

static net_link *find(sf_net *n, int peer, uint32_t channel, int dir)
{
    for (net_link *l = n->links; l; l = l->next)
        if (l->peer == peer && l->channel == channel && l->dir == dir) return l;
    return NULL;
}

static int peer_rank(const net_link *l) { return l->net->peers[l->peer].rank; }

/* ---- the I/O thread's side ------------------------------------------------------------ */

static void on_data(net_link *l, const net_env *e, zmq_msg_t *payload, int has_payload)
{
    const int rank = peer_rank(l);
    if (e->seq < l->expected) { /* a resent copy of what we have: say so again */
        l->ack_dirty = 1;
        return;
    }
    if (e->seq > l->expected) { /* a gap (messages lost with a connection): ask to go back */
        const int64_t now = net_now_ms();
        if (l->nacked_for != l->expected || now - l->nack_ms > 200) {
            l->nack = 1, l->ack_dirty = 1, l->nacked_for = l->expected, l->nack_ms = now;
        }
        return;
    }
    if (l->closed) {
        net_link_fail(l, SF_E_PEER, 1, "link from rank %d, channel %u: data after the end of the stream", rank, l->channel);
        return;
    }
    if (e->type == MSG_END) {
        if (has_payload) {
            net_link_fail(l, SF_E_PEER, 1, "link from rank %d, channel %u: malformed end message", rank, l->channel);
            return;
        }
        l->closed = 1;
    } else {
        if (!has_payload) {
            net_link_fail(l, SF_E_PEER, 1, "link from rank %d, channel %u: data message without a packet", rank, l->channel);
            return;
        }
        if (e->seq > l->r_popped + (uint64_t)l->o.window_packets || l->inbox_count >= l->inbox_cap) {
            net_link_fail(l, SF_E_PEER, 1, "link from rank %d, channel %u: packet %llu beyond the credit granted (%llu)",
                          rank, l->channel, (unsigned long long)e->seq,
                          (unsigned long long)(l->r_popped + (uint64_t)l->o.window_packets));
            return;
        }
        zmq_msg_t *slot = &l->inbox[(l->inbox_head + l->inbox_count) % l->inbox_cap];
        zmq_msg_init(slot);
        zmq_msg_move(slot, payload);
        l->inbox_count++;
    }
    l->expected++;
    l->ack_dirty = 1;
    pthread_cond_broadcast(&l->cond);
}

static void on_ack(net_link *l, const net_env *e)
{
    const int rank = peer_rank(l);
    if (e->seq > l->pushed || e->a > e->seq || e->c == 0 || e->c > 1u << 20 || e->b > l->pushed_bytes) {
        net_link_fail(l, SF_E_PEER, 1, "link to rank %d, channel %u: inconsistent acknowledgement (ack %llu, popped %llu of %llu sent)",
                      rank, l->channel, (unsigned long long)e->seq, (unsigned long long)e->a, (unsigned long long)l->pushed);
        return;
    }
    if (e->seq < l->acked || e->a < l->popped || e->b < l->popped_bytes) return; /* a stale one, from a connection replaced since */
    while (l->acked < e->seq) {
        l->acked++;
        zmq_msg_close(&l->ring[l->acked % l->ring_cap].msg);
    }
    if (l->next_send <= l->acked) l->next_send = l->acked + 1;
    l->popped = e->a, l->popped_bytes = e->b;
    l->limit = e->a + e->c;
    l->granted = 1;
    if ((e->flags & ENV_NACK) && e->seq + 1 < l->next_send) {
        /* go back once per gap (a burst of dropped messages sends several NACKs) */
        const int64_t now = net_now_ms();
        if (l->last_nack != e->seq + 1 || now - l->last_nack_ms > 200) {
            l->next_send = e->seq + 1;
            l->last_nack = e->seq + 1, l->last_nack_ms = now;
        }
    }
    pthread_cond_broadcast(&l->cond);
}

void net_link_on_message(sf_net *n, int peer, const net_env *e, zmq_msg_t *payload, int has_payload)
{
    const int rank = n->peers[peer].rank;
    net_link *l;
    switch (e->type) {
    case MSG_DATA:
    case MSG_END:
        l = find(n, peer, e->channel, SF_NET_RECV);
        if (l && !l->error) on_data(l, e, payload, has_payload);
        return;
    case MSG_ACK:
        l = find(n, peer, e->channel, SF_NET_SEND);
        if (l && !l->error) {
            if (has_payload) net_link_fail(l, SF_E_PEER, 1, "link to rank %d, channel %u: malformed acknowledgement", rank, e->channel);
            else on_ack(l, e);
        }
        return;
    case MSG_ABORT_TO_RECV:
    case MSG_ABORT_TO_SEND: {
        l = find(n, peer, e->channel, e->type == MSG_ABORT_TO_RECV ? SF_NET_RECV : SF_NET_SEND);
        if (!l || l->error) return;
        char text[ABORT_TEXT_MAX + 1] = "";
        if (has_payload) {
            size_t len = zmq_msg_size(payload);
            if (len > ABORT_TEXT_MAX) len = ABORT_TEXT_MAX;
            memcpy(text, zmq_msg_data(payload), len);
            text[len] = '\0';
            for (size_t i = 0; i < len; i++)
                if ((unsigned char)text[i] < 32 || (unsigned char)text[i] > 126) text[i] = '?';
        }
        net_link_fail(l, SF_E_CLOSED, 0, "link %s rank %d, channel %u: aborted by rank %d%s%s", dir_name(l->dir), rank,
                      e->channel, rank, text[0] ? ": " : "", text);
        return;
    }
    default: return;
    }
}

void net_link_rewind(sf_net *n, int peer, int which)
{
    for (net_link *l = n->links; l; l = l->next) {
        if (l->peer != peer || l->error) continue;
        if (l->dir == SF_NET_SEND && which == NET_DATA) l->next_send = l->acked + 1;
        if (l->dir == SF_NET_RECV && which == NET_CONTROL) l->ack_dirty = 1;
    }
}

void net_link_refresh(sf_net *n, int peer)
{
    for (net_link *l = n->links; l; l = l->next)
        if (l->peer == peer && l->dir == SF_NET_RECV && !l->error) l->ack_dirty = 1;
}

void net_link_flush(sf_net *n, int peer)
{
    net_peer *p = &n->peers[peer];
    const int rank = n->o.rank;
    for (net_link *l = n->links; l; l = l->next) {
        if (l->peer != peer || l->error) continue;
        if (l->dir == SF_NET_RECV) {
            if (!l->ack_dirty || p->blocked[NET_CONTROL]) continue;
            net_env e = {MSG_ACK, l->nack ? ENV_NACK : 0, (uint32_t)rank, l->channel, l->expected - 1, l->r_popped,
                         l->r_popped_bytes, (uint32_t)l->o.window_packets};
            if (n->drop_acks || net_send(n, p, NET_CONTROL, &e, NULL) == 0) l->ack_dirty = 0, l->nack = 0;
            continue;
        }
        while (l->granted && l->next_send <= l->pushed && !p->blocked[NET_DATA]) {
            out_entry *o = &l->ring[l->next_send % l->ring_cap];
            if (!o->end && o->seq > l->limit) break; /* no credit: the receiver has not popped enough */
            net_env e = {o->end ? MSG_END : MSG_DATA, 0, (uint32_t)rank, l->channel, o->seq, 0, 0, 0};
            zmq_msg_t copy;
            zmq_msg_init(&copy);
            if (!o->end) zmq_msg_copy(&copy, &o->msg); /* shares the buffer: it stays ours for a resend */
            int rc = net_send(n, p, NET_DATA, &e, o->end ? NULL : &copy);
            zmq_msg_close(&copy);
            if (rc != 0) break;
            l->next_send++;
        }
    }
}

/* ---- the stage threads' side ------------------------------------------------------------ */

static void free_buffer(void *data, void *hint)
{
    (void)hint;
    free(data);
}

static int link_error_locked(net_link *l)
{
    return l->error ? sf_error(l->error, "%s", l->message) : SF_OK;
}

static int stop_set(const int *stop) { return stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE); }

/* One slice (at most 20 ms, so that *stop is looked at) of a wait on l's condition, n->lock
 * held, before `deadline` (net_now_ms's clock; < 0: none). 0 when the time is up or *stop set. */
static int wait_slice(net_link *l, int64_t deadline, const int *stop)
{
    if (deadline < 0 && !stop) {
        pthread_cond_wait(&l->cond, &l->net->lock);
        return 1;
    }
    if (stop_set(stop)) return 0;
    int64_t left = deadline < 0 ? 20 : deadline - net_now_ms();
    if (left <= 0) return 0;
    if (left > 20) left = 20;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    const long long ns = t.tv_nsec + (long long)left * 1000000LL;
    t.tv_sec += (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(&l->cond, &l->net->lock, &t);
    return 1;
}

/* push, its wait for credit bounded by timeout_ms (< 0: none) and *stop (NULL: none). */
static int push_within(sf_link *base, sf_packet *p, int timeout_ms, const int *stop)
{
    net_link *l = (net_link *)base;
    sf_net *n = l->net;
    if (l->dir != SF_NET_SEND) {
        sf_packet_free(p);
        return sf_error(SF_E_INVAL, "push on the receiving half of a network link");
    }
    sf_buffer buf = {0};
    int rc = sf_packet_to_host(p);
    if (rc == SF_OK) rc = sf_wire_encode(p, &l->wo, l->fb, &buf);
    sf_packet_free(p);
    if (rc != SF_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", sf_last_error());
        pthread_mutex_lock(&n->lock);
        net_link_fail(l, rc, 1, "link to rank %d, channel %u: %s", peer_rank(l), l->channel, why);
        pthread_mutex_unlock(&n->lock);
        net_wake(n);
        sf_buffer_release(&buf);
        return sf_error(rc, "link to rank %d, channel %u: %s", peer_rank(l), l->channel, why);
    }
    pthread_mutex_lock(&n->lock);
    const int64_t deadline = timeout_ms < 0 ? -1 : net_now_ms() + timeout_ms;
    int gave_up = 0;
    /* credit: at most window_packets and window_bytes not yet popped by the receiving stage
     * (one packet alone may exceed window_bytes) */
    while (!l->error && !l->closed &&
           (l->pushed - l->popped >= (uint64_t)l->o.window_packets ||
            (l->pushed > l->popped && l->pushed_bytes - l->popped_bytes + buf.len > l->o.window_bytes))) {
        if (!wait_slice(l, deadline, stop)) {
            /* the packet is encoded (its rounding is in the stream's residual): the link cannot
             * go on without it */
            if (stop_set(stop))
                net_link_fail(l, SF_E_CLOSED, 1, "link to rank %d, channel %u: stopped while waiting for credit",
                              peer_rank(l), l->channel);
            else
                net_link_fail(l, SF_E_CLOSED, 1,
                              "link to rank %d, channel %u: no credit within %d ms (the receiver took nothing)",
                              peer_rank(l), l->channel, timeout_ms);
            gave_up = 1;
        }
    }
    if (l->error || l->closed) {
        rc = l->error ? link_error_locked(l) : sf_error(SF_E_CLOSED, "push after close on a network link");
        pthread_mutex_unlock(&n->lock);
        if (gave_up) net_wake(n); /* the abort is queued for the peer */
        sf_buffer_release(&buf);
        return rc;
    }
    const uint64_t seq = ++l->pushed;
    out_entry *o = &l->ring[seq % l->ring_cap];
    o->seq = seq, o->end = 0;
    const size_t len = buf.len;
    if (zmq_msg_init_data(&o->msg, buf.data, len, free_buffer, NULL) != 0) {
        l->pushed--;
        pthread_mutex_unlock(&n->lock);
        sf_buffer_release(&buf);
        return sf_error(SF_E_NOMEM, "link to rank %d: out of memory for a message", peer_rank(l));
    }
    l->pushed_bytes += len;
    pthread_mutex_unlock(&n->lock);
    net_wake(n);
    return SF_OK;
}

static int net_push(sf_link *base, sf_packet *p) { return push_within(base, p, -1, NULL); }

static sf_packet *net_pop(sf_link *base)
{
    net_link *l = (net_link *)base;
    sf_net *n = l->net;
    if (l->dir != SF_NET_RECV) return NULL;
    pthread_mutex_lock(&n->lock);
    while (!l->error && l->inbox_count == 0 && !l->closed) pthread_cond_wait(&l->cond, &n->lock);
    if (l->error || l->inbox_count == 0) {
        pthread_mutex_unlock(&n->lock);
        return NULL;
    }
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    zmq_msg_move(&msg, &l->inbox[l->inbox_head]);
    zmq_msg_close(&l->inbox[l->inbox_head]);
    l->inbox_head = (l->inbox_head + 1) % l->inbox_cap;
    l->inbox_count--;
    pthread_mutex_unlock(&n->lock);

    const size_t size = zmq_msg_size(&msg);
    sf_packet *p = NULL;
    int rc = sf_wire_decode(zmq_msg_data(&msg), size, n->max_bytes, &p);
    zmq_msg_close(&msg);
    char why[256];
    if (rc != SF_OK) snprintf(why, sizeof why, "%s", sf_last_error());
    pthread_mutex_lock(&n->lock);
    if (rc != SF_OK) {
        net_link_fail(l, rc, 1, "link from rank %d, channel %u: malformed packet %llu: %s", peer_rank(l), l->channel,
                      (unsigned long long)(l->r_popped + 1), why);
    } else {
        l->r_popped++;
        l->r_popped_bytes += size;
        l->ack_dirty = 1; /* new credit */
    }
    pthread_mutex_unlock(&n->lock);
    net_wake(n);
    return p;
}

static int net_ready(sf_link *base)
{
    net_link *l = (net_link *)base;
    if (l->dir != SF_NET_RECV) return 1;
    pthread_mutex_lock(&l->net->lock);
    const int ready = l->error || l->inbox_count > 0 || l->closed;
    pthread_mutex_unlock(&l->net->lock);
    return ready;
}

static void net_close(sf_link *base)
{
    net_link *l = (net_link *)base;
    if (l->dir != SF_NET_SEND) return;
    pthread_mutex_lock(&l->net->lock);
    if (!l->closed && !l->error) {
        l->closed = 1;
        const uint64_t seq = ++l->pushed; /* the ring keeps one slot beyond the window for this */
        out_entry *o = &l->ring[seq % l->ring_cap];
        o->seq = seq, o->end = 1;
        zmq_msg_init(&o->msg);
        pthread_cond_broadcast(&l->cond);
    }
    pthread_mutex_unlock(&l->net->lock);
    net_wake(l->net);
}

static void abort_why(net_link *l, const char *why)
{
    pthread_mutex_lock(&l->net->lock);
    net_link_fail(l, SF_E_CLOSED, 1, "link %s rank %d, channel %u: aborted here%s%s", dir_name(l->dir), peer_rank(l),
                  l->channel, why && *why ? ": " : "", why ? why : "");
    pthread_mutex_unlock(&l->net->lock);
    net_wake(l->net);
}

static void net_abort(sf_link *base) { abort_why((net_link *)base, NULL); }

static void net_destroy(sf_link *base)
{
    net_link *l = (net_link *)base;
    sf_net *n = l->net;
    pthread_mutex_lock(&n->lock);
    if (l->dir == SF_NET_SEND && l->closed)
        while (!l->error && l->acked < l->pushed) pthread_cond_wait(&l->cond, &n->lock);
    const int finished = l->dir == SF_NET_SEND ? l->closed : (l->closed && l->inbox_count == 0);
    if (!finished && !l->error)
        net_link_fail(l, SF_E_CLOSED, 1, "link %s rank %d, channel %u: destroyed before its end", dir_name(l->dir),
                      peer_rank(l), l->channel);
    if (l->dir == SF_NET_RECV && finished && !l->error && l->ack_dirty) {
        /* the acknowledgement of the end may not have left yet: the sender's destroy waits for it */
        const net_env e = {MSG_ACK, 0, (uint32_t)n->o.rank, l->channel, l->expected - 1, l->r_popped, l->r_popped_bytes,
                           (uint32_t)l->o.window_packets};
        net_queue_ack(n, l->peer, &e);
    }
    if (l->dir == SF_NET_SEND) free_send_entries(l);
    free_inbox(l);
    for (net_link **pp = &n->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    pthread_mutex_unlock(&n->lock);
    net_wake(n);
    pthread_cond_destroy(&l->cond);
    sf_wire_feedback_free(l->fb);
    free(l->ring);
    free(l->inbox);
    free(l);
}

static const sf_link_ops net_ops = {net_push, net_pop, net_ready, net_close, net_abort, net_destroy, sf_net_link_error};

sf_link_options sf_link_options_default(void)
{
    sf_link_options o = {0};
    o.codec = SF_CODEC_RAW, o.quant = SF_QUANT_F32, o.error_feedback = 1;
    o.window_packets = 8, o.window_bytes = (size_t)256 << 20;
    return o;
}

int sf_net_link_create(sf_net *n, int peer, uint32_t channel, int direction, const sf_link_options *opt,
                       sf_link **out)
{
    *out = NULL;
    if (!n || (direction != SF_NET_SEND && direction != SF_NET_RECV))
        return sf_error(SF_E_INVAL, "sf_net_link_create: bad arguments");
    int index = -1;
    for (int i = 0; i < n->n_peers; i++)
        if (n->peers[i].rank == peer) index = i;
    if (index < 0) return sf_error(SF_E_INVAL, "sf_net_link_create: rank %d is not a peer of rank %d", peer, n->o.rank);
    sf_link_options o = opt ? *opt : sf_link_options_default();
    if (o.window_packets <= 0) o.window_packets = 8;
    if (o.window_packets > 1 << 16) return sf_error(SF_E_INVAL, "sf_net_link_create: window of %d packets", o.window_packets);
    if (!o.window_bytes) o.window_bytes = (size_t)256 << 20;
    if (o.codec < SF_CODEC_RAW || o.codec > SF_CODEC_ZSTD || o.quant < SF_QUANT_F32 || o.quant > SF_QUANT_FP8_E4M3 ||
        o.group < 0 || (o.shuffle != 0 && o.shuffle != 1))
        return sf_error(SF_E_INVAL, "sf_net_link_create: bad codec, quantization or shuffle");
    net_link *l = calloc(1, sizeof *l);
    if (!l) return sf_error(SF_E_NOMEM, "out of memory for a network link");
    l->base.ops = &net_ops;
    l->net = n, l->peer = index, l->channel = channel, l->dir = direction, l->o = o;
    l->wo = (sf_wire_options){o.codec, o.level, o.quant, o.group, o.shuffle};
    l->expected = 1, l->next_send = 1;
    int rc = SF_OK;
    if (direction == SF_NET_SEND) {
        l->ring_cap = o.window_packets + 1;
        l->ring = calloc((size_t)l->ring_cap, sizeof *l->ring);
        if (!l->ring) rc = sf_error(SF_E_NOMEM, "out of memory for a network link");
        if (rc == SF_OK && o.quant != SF_QUANT_F32 && o.error_feedback >= 0) rc = sf_wire_feedback_create(&l->fb);
    } else {
        l->inbox_cap = o.window_packets;
        l->inbox = calloc((size_t)l->inbox_cap, sizeof *l->inbox);
        if (!l->inbox) rc = sf_error(SF_E_NOMEM, "out of memory for a network link");
        l->ack_dirty = 1; /* the first credit grant: the sender waits for it */
    }
    if (rc != SF_OK) {
        free(l->ring), free(l->inbox), free(l);
        return rc;
    }
    pthread_cond_init(&l->cond, NULL);
    pthread_mutex_lock(&n->lock);
    net_peer *p = &n->peers[index];
    if (find(n, index, channel, direction)) {
        rc = sf_error(SF_E_INVAL, "sf_net_link_create: a link %s rank %d on channel %u exists", dir_name(direction), peer, channel);
    } else if (p->failed) {
        rc = sf_error(SF_E_PEER, "rank %d (host %s) failed earlier", peer, p->host);
    } else {
        l->next = n->links;
        n->links = l;
        p->want_active = 1;
    }
    pthread_mutex_unlock(&n->lock);
    if (rc != SF_OK) {
        pthread_cond_destroy(&l->cond);
        sf_wire_feedback_free(l->fb);
        free(l->ring), free(l->inbox), free(l);
        return rc;
    }
    net_wake(n);
    *out = &l->base;
    return SF_OK;
}

int sf_net_link_error(sf_link *base)
{
    net_link *l = (net_link *)base;
    if (!l || l->base.ops != &net_ops) return sf_error(SF_E_INVAL, "sf_net_link_error: not a network link");
    pthread_mutex_lock(&l->net->lock);
    int rc = link_error_locked(l);
    pthread_mutex_unlock(&l->net->lock);
    return rc;
}

int sf_net_link_push_within(sf_link *base, sf_packet *p, int timeout_ms, const int *stop)
{
    net_link *l = (net_link *)base;
    if (!l || l->base.ops != &net_ops || timeout_ms < 0) {
        sf_packet_free(p);
        return sf_error(SF_E_INVAL, "sf_net_link_push_within: not a network link, or a negative timeout");
    }
    return push_within(base, p, timeout_ms, stop);
}

int sf_net_link_wait(sf_link *base, int timeout_ms, const int *stop)
{
    net_link *l = (net_link *)base;
    if (!l || l->base.ops != &net_ops) return 1;
    sf_net *n = l->net;
    pthread_mutex_lock(&n->lock);
    const int64_t deadline = net_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    int done;
    for (;;) {
        done = l->error || (l->dir == SF_NET_RECV ? l->inbox_count > 0 || l->closed : l->acked >= l->pushed);
        if (done || !wait_slice(l, deadline, stop)) break;
    }
    pthread_mutex_unlock(&n->lock);
    return done;
}

void sf_net_link_abort_why(sf_link *base, const char *why)
{
    net_link *l = (net_link *)base;
    if (l && l->base.ops == &net_ops) abort_why(l, why);
}
