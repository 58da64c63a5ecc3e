/* The network communicator (pipeline/comm_net.h): sf_comm_ops over the links of an sf_net.
 * Every operation is a sequence of whole messages on per-peer link pairs made on first use;
 * every wait is bounded (sf_net_link_wait, sf_net_link_push_within), so that nothing hangs. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/comm_net.h"
#include "seqflow/error.h"
#include "seqflow/packet.h"

enum { LINK_DATA, LINK_EXACT, LINK_COLL, LINKS };

/* What a message is, in its packet's position field: point to point, or which collective
 * (and the broadcast's root above the low byte), so that ranks in different collectives are
 * told apart instead of mixing their data. */
enum { OP_P2P = 0, OP_ALL_REDUCE = 1, OP_ALL_GATHER = 2, OP_BROADCAST = 3 };

typedef struct link_pair {
    sf_link *send, *recv;    /* both NULL until first used */
    uint64_t sent, received; /* messages so far each way (the packets' segment numbers) */
    int lossy;               /* the sending half quantizes f32 values */
} link_pair;

typedef struct net_comm {
    sf_net *net;
    uint32_t base;
    sf_comm_net_options_fn options;
    void *user;
    pthread_mutex_t lock; /* failed, why and the pairs' halves, against sf_comm_abort from another thread */
    int failed;
    char why[400];    /* the first failure */
    link_pair *pairs; /* [size * LINKS]: pairs[peer * LINKS + link] */
    int *net_rank;    /* [size]: the sf_net rank of each of the communicator's ranks */
    float *acc;       /* rank 0's float32 sums of bf16 values */
    size_t acc_cap;
} net_comm;

static int stopped(const sf_comm *c) { return c->stop && __atomic_load_n(c->stop, __ATOMIC_ACQUIRE); }

static const char *type_name(sf_dtype type) { return type == SF_DTYPE_BF16 ? "bf16" : "float32"; }

static void describe(uint64_t what, char *out, size_t size)
{
    static const char *names[] = {"point-to-point", "all_reduce", "all_gather", "broadcast"};
    const unsigned op = (unsigned)(what & 0xFF);
    if (op == OP_BROADCAST)
        snprintf(out, size, "broadcast from rank %llu", (unsigned long long)(what >> 8));
    else
        snprintf(out, size, "%s", op <= OP_ALL_GATHER ? names[op] : "an unknown operation");
}

/* Aborts every half made so far, telling the peers `why`. Under m->lock. */
static void abort_links_locked(net_comm *m, int size, const char *why)
{
    for (int i = 0; i < size * LINKS; i++) {
        if (m->pairs[i].send) sf_net_link_abort_why(m->pairs[i].send, why);
        if (m->pairs[i].recv) sf_net_link_abort_why(m->pairs[i].recv, why);
    }
}

/* Records the communicator's first failure (the message formatted here), aborts its links and
 * returns SF_E_COMM with the message. */
static int fail(sf_comm *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int fail(sf_comm *c, const char *fmt, ...)
{
    net_comm *m = c->impl;
    char msg[sizeof m->why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&m->lock);
    if (!m->failed) {
        m->failed = 1;
        snprintf(m->why, sizeof m->why, "%s", msg);
        abort_links_locked(m, c->size, msg);
    }
    pthread_mutex_unlock(&m->lock);
    return sf_error(SF_E_COMM, "%s", msg);
}

/* SF_OK while the communicator is healthy; SF_E_COMM once it failed or its flag is up. */
static int alive(sf_comm *c, const char *op)
{
    net_comm *m = c->impl;
    char why[sizeof m->why] = "";
    pthread_mutex_lock(&m->lock);
    const int failed = m->failed;
    if (failed) memcpy(why, m->why, sizeof why);
    pthread_mutex_unlock(&m->lock);
    if (failed) return sf_error(SF_E_COMM, "%s on rank %d of %d: failed earlier: %s", op, c->rank, c->size, why);
    if (stopped(c))
        return fail(c, "%s on rank %d of %d: stopped, another rank of the group failed", op, c->rank, c->size);
    return SF_OK;
}

/* The pair of halves to and from peer on `link`, made on first use. */
static int pair_of(sf_comm *c, const char *op, int peer, int link, link_pair **out)
{
    net_comm *m = c->impl;
    link_pair *pp = &m->pairs[(size_t)peer * LINKS + (size_t)link];
    *out = pp;
    if (pp->send) return SF_OK;
    sf_link_options o = sf_link_options_default();
    int rc = m->options ? m->options(m->user, m->net_rank[peer], &o) : SF_OK;
    if (rc != SF_OK)
        return fail(c, "%s on rank %d of %d: the options of the links to rank %d: %s", op, c->rank, c->size, peer,
                    sf_last_error());
    if (link != LINK_DATA) o.quant = SF_QUANT_F32, o.group = 0;
    sf_link *s = NULL, *r = NULL;
    char why[300] = "";
    pthread_mutex_lock(&m->lock);
    if (m->failed) {
        pthread_mutex_unlock(&m->lock);
        return alive(c, op);
    }
    const int to = m->net_rank[peer];
    rc = sf_net_link_create(m->net, to, m->base + (uint32_t)link, SF_NET_SEND, &o, &s);
    if (rc == SF_OK) rc = sf_net_link_create(m->net, to, m->base + (uint32_t)link, SF_NET_RECV, &o, &r);
    if (rc == SF_OK) {
        pp->send = s, pp->recv = r, pp->lossy = o.quant != SF_QUANT_F32;
    } else {
        snprintf(why, sizeof why, "%s", sf_last_error());
        sf_link_destroy(s);
    }
    pthread_mutex_unlock(&m->lock);
    if (rc != SF_OK) return fail(c, "%s on rank %d of %d: links to rank %d: %s", op, c->rank, c->size, peer, why);
    return SF_OK;
}

static int send_msg(sf_comm *c, const char *op, int link, int peer, const void *buf, size_t count, sf_dtype type,
                    uint64_t tag, uint64_t what)
{
    link_pair *pp;
    int rc = alive(c, op);
    if (rc == SF_OK) rc = pair_of(c, op, peer, link, &pp);
    if (rc != SF_OK) return rc;
    if (pp->lossy && type == SF_DTYPE_F32)
        for (size_t i = 0; i < count; i++)
            if (!isfinite(((const float *)buf)[i]))
                return sf_error(SF_E_INVAL,
                                "%s on rank %d of %d to rank %d: value %zu is %g: a lossy link carries finite "
                                "values only (send it exact)",
                                op, c->rank, c->size, peer, i, (double)((const float *)buf)[i]);
    const size_t bytes = count * sf_dtype_size(type);
    sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, (bytes + 3) / 4);
    if (!p)
        return sf_error(SF_E_NOMEM, "%s on rank %d of %d: out of memory for %zu bytes", op, c->rank, c->size, bytes);
    if (type == SF_DTYPE_BF16) p->x_bf16 = (uint16_t *)p->x, p->x = NULL, p->dtype = SF_DTYPE_BF16;
    if (bytes) memcpy((void *)sf_packet_rows(p), buf, bytes);
    p->n = count ? 1 : 0, p->width = count;
    p->stream = tag, p->segment = pp->sent + 1, p->position = what;
    rc = sf_net_link_push_within(pp->send, p, c->timeout_ms, c->stop);
    if (rc == SF_E_PEER) __atomic_store_n(&c->lost_peer, 1, __ATOMIC_RELEASE);
    if (rc != SF_OK) return fail(c, "%s on rank %d of %d to rank %d: %s", op, c->rank, c->size, peer, sf_last_error());
    pp->sent++;
    return SF_OK;
}

/* The next message from peer on `link`, checked (*out the caller's: sf_packet_free). */
static int recv_msg(sf_comm *c, const char *op, int link, int peer, size_t count, sf_dtype type, uint64_t what,
                    sf_packet **out)
{
    net_comm *m = c->impl;
    link_pair *pp;
    *out = NULL;
    int rc = alive(c, op);
    if (rc == SF_OK) rc = pair_of(c, op, peer, link, &pp);
    if (rc != SF_OK) return rc;
    if (!sf_net_link_wait(pp->recv, c->timeout_ms, c->stop)) {
        if (stopped(c))
            return fail(c, "%s on rank %d of %d: stopped, another rank of the group failed", op, c->rank, c->size);
        return fail(c, "%s on rank %d of %d: nothing from rank %d within %d ms", op, c->rank, c->size, peer,
                    c->timeout_ms);
    }
    sf_packet *p = pp->recv->ops->pop(pp->recv);
    if (!p) {
        rc = sf_net_link_error(pp->recv);
        pthread_mutex_lock(&m->lock);
        const int failed = m->failed; /* aborted here, from another thread */
        pthread_mutex_unlock(&m->lock);
        if (failed) return alive(c, op);
        if (rc == SF_OK)
            return fail(c, "%s on rank %d of %d: rank %d closed its communicator", op, c->rank, c->size, peer);
        if (rc == SF_E_PEER) __atomic_store_n(&c->lost_peer, 1, __ATOMIC_RELEASE);
        return fail(c, "%s on rank %d of %d from rank %d: %s", op, c->rank, c->size, peer, sf_last_error());
    }
    char want[64], got[64];
    if (p->segment != pp->received + 1) {
        rc = fail(c, "%s on rank %d of %d from rank %d: message out of order (number %llu, %llu expected)", op, c->rank,
                  c->size, peer, (unsigned long long)p->segment, (unsigned long long)(pp->received + 1));
    } else if (p->kind != SF_PACKET_HIDDEN || p->position != what) {
        describe(what, want, sizeof want), describe(p->position, got, sizeof got);
        rc = fail(c, "%s on rank %d of %d: rank %d sent a %s message, this rank is in %s", op, c->rank, c->size, peer,
                  got, want);
    } else if (p->width != count || (count && (p->n != 1 || p->dtype != type))) {
        rc = fail(c, "%s on rank %d of %d: rank %d sent %zu %s values, %zu %s expected", op, c->rank, c->size, peer,
                  p->n * p->width, type_name(p->dtype), count, type_name(type));
    }
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    pp->received++;
    *out = p;
    return SF_OK;
}

static int recv_into(sf_comm *c, const char *op, int link, int peer, void *buf, size_t count, sf_dtype type,
                     uint64_t what)
{
    sf_packet *p;
    int rc = recv_msg(c, op, link, peer, count, type, what, &p);
    if (rc == SF_OK && count) memcpy(buf, sf_packet_rows(p), count * sf_dtype_size(type));
    sf_packet_free(p);
    return rc;
}

/* ---- the table -------------------------------------------------------------------------- */

static int net_send(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer)
{
    return send_msg(c, "send", LINK_DATA, peer, buf, count, type, 0, OP_P2P);
}

static int net_recv(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer)
{
    return recv_into(c, "recv", LINK_DATA, peer, buf, count, type, OP_P2P);
}

static int net_send_tagged(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer, uint64_t tag, int exact)
{
    return send_msg(c, "send", exact ? LINK_EXACT : LINK_DATA, peer, buf, count, type, tag, OP_P2P);
}

static int net_recv_tagged(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer, int exact)
{
    return recv_into(c, "recv", exact ? LINK_EXACT : LINK_DATA, peer, buf, count, type, OP_P2P);
}

static int net_probe(sf_comm *c, int peer, int exact)
{
    link_pair *pp;
    /* a failure is "ready": the receive reports it at once */
    if (alive(c, "probe") != SF_OK || pair_of(c, "probe", peer, exact ? LINK_EXACT : LINK_DATA, &pp) != SF_OK) return 1;
    return sf_net_link_wait(pp->recv, 0, c->stop);
}

static float bf16_value(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Rank 0's part of all_reduce: buf += every other rank's, in rank order. */
static int reduce_at_root(sf_comm *c, void *buf, size_t count, sf_dtype type)
{
    net_comm *m = c->impl;
    float *acc = buf;
    if (type == SF_DTYPE_BF16) {
        if (m->acc_cap < count) {
            float *grown = realloc(m->acc, count * sizeof *grown);
            if (!grown) return sf_error(SF_E_NOMEM, "all_reduce on rank 0: out of memory for %zu sums", count);
            m->acc = grown, m->acc_cap = count;
        }
        acc = m->acc;
        for (size_t i = 0; i < count; i++) acc[i] = bf16_value(((const uint16_t *)buf)[i]);
    }
    for (int r = 1; r < c->size; r++) {
        sf_packet *p;
        int rc = recv_msg(c, "all_reduce", LINK_COLL, r, count, type, OP_ALL_REDUCE, &p);
        if (rc != SF_OK) return rc;
        if (type == SF_DTYPE_F32)
            for (size_t i = 0; i < count; i++) acc[i] += p->x[i];
        else
            for (size_t i = 0; i < count; i++) acc[i] += bf16_value(p->x_bf16[i]);
        sf_packet_free(p);
    }
    if (type == SF_DTYPE_BF16)
        for (size_t i = 0; i < count; i++) ((uint16_t *)buf)[i] = sf_bf16_round(acc[i]);
    return SF_OK;
}

static int net_all_reduce(sf_comm *c, void *buf, size_t count, sf_dtype type)
{
    int rc = alive(c, "all_reduce");
    if (rc != SF_OK || c->size == 1) return rc;
    if (c->rank != 0) {
        rc = send_msg(c, "all_reduce", LINK_COLL, 0, buf, count, type, 0, OP_ALL_REDUCE);
        return rc == SF_OK ? recv_into(c, "all_reduce", LINK_COLL, 0, buf, count, type, OP_ALL_REDUCE) : rc;
    }
    rc = reduce_at_root(c, buf, count, type);
    for (int r = 1; r < c->size && rc == SF_OK; r++)
        rc = send_msg(c, "all_reduce", LINK_COLL, r, buf, count, type, 0, OP_ALL_REDUCE);
    return rc;
}

static int net_all_gather(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type)
{
    int rc = alive(c, "all_gather");
    if (rc != SF_OK) return rc;
    const size_t esize = sf_dtype_size(type);
    if (count > SIZE_MAX / esize / (size_t)c->size)
        return sf_error(SF_E_INVAL, "all_gather on rank %d of %d: %zu elements a rank is too many", c->rank, c->size,
                        count);
    const size_t total = count * (size_t)c->size, bytes = count * esize;
    if (c->rank != 0) {
        rc = send_msg(c, "all_gather", LINK_COLL, 0, send, count, type, 0, OP_ALL_GATHER);
        return rc == SF_OK ? recv_into(c, "all_gather", LINK_COLL, 0, recv, total, type, OP_ALL_GATHER) : rc;
    }
    if (bytes) memmove(recv, send, bytes); /* send may be recv's own slot */
    for (int r = 1; r < c->size && rc == SF_OK; r++)
        rc = recv_into(c, "all_gather", LINK_COLL, r, (unsigned char *)recv + (size_t)r * bytes, count, type,
                       OP_ALL_GATHER);
    for (int r = 1; r < c->size && rc == SF_OK; r++)
        rc = send_msg(c, "all_gather", LINK_COLL, r, recv, total, type, 0, OP_ALL_GATHER);
    return rc;
}

static int net_broadcast(sf_comm *c, void *buf, size_t count, sf_dtype type, int root)
{
    int rc = alive(c, "broadcast");
    const uint64_t what = OP_BROADCAST | (uint64_t)root << 8;
    if (rc != SF_OK) return rc;
    if (c->rank != root) return recv_into(c, "broadcast", LINK_COLL, root, buf, count, type, what);
    for (int r = 0; r < c->size && rc == SF_OK; r++)
        if (r != root) rc = send_msg(c, "broadcast", LINK_COLL, r, buf, count, type, 0, what);
    return rc;
}

static int net_all_reduce_start(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket)
{
    *ticket = 0;
    return net_all_reduce(c, buf, count, type);
}

static int net_join(sf_comm *c, int ticket) { return alive(c, "join"); }
static int net_wait(sf_comm *c) { return alive(c, "wait"); }
static int net_fence(sf_comm *c) { return alive(c, "fence"); }
static int net_group_begin(sf_comm *c) { return alive(c, "group_begin"); }
static int net_group_end(sf_comm *c) { return alive(c, "group_end"); }

static void net_abort(sf_comm *c, const char *why)
{
    net_comm *m = c->impl;
    char msg[sizeof m->why];
    snprintf(msg, sizeof msg, "rank %d of %d aborted: %s", c->rank, c->size, why && *why ? why : "aborted");
    pthread_mutex_lock(&m->lock);
    if (!m->failed) {
        m->failed = 1;
        snprintf(m->why, sizeof m->why, "%s", msg);
        abort_links_locked(m, c->size, msg);
    }
    pthread_mutex_unlock(&m->lock);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void net_destroy(sf_comm *c)
{
    net_comm *m = c->impl;
    const int n = c->size * LINKS;
    pthread_mutex_lock(&m->lock);
    const int failed = m->failed;
    pthread_mutex_unlock(&m->lock);
    if (!failed) {
        /* the end of every sending half goes out at once; then one deadline for all their
         * acknowledgements (a dead peer fails its links within the net's timeout) */
        for (int i = 0; i < n; i++)
            if (m->pairs[i].send) m->pairs[i].send->ops->close(m->pairs[i].send);
        const double deadline = now_ms() + c->timeout_ms;
        for (int i = 0; i < n; i++) {
            sf_link *s = m->pairs[i].send;
            if (!s) continue;
            const double left = deadline - now_ms();
            if (!sf_net_link_wait(s, left > 0 ? (int)left : 0, NULL))
                sf_net_link_abort_why(s, "the communicator was freed before the peer took everything");
        }
    }
    for (int i = 0; i < n; i++) {
        sf_link_destroy(m->pairs[i].send);
        sf_link_destroy(m->pairs[i].recv); /* a half not at its end is aborted: the peer sees it */
    }
    pthread_mutex_destroy(&m->lock);
    free(m->pairs);
    free(m->net_rank);
    free(m->acc);
    free(m);
    free(c);
}

static const sf_comm_ops net_ops = {
    .name = "net",
    .all_reduce = net_all_reduce,
    .all_gather = net_all_gather,
    .broadcast = net_broadcast,
    .send = net_send,
    .recv = net_recv,
    .group_begin = net_group_begin,
    .group_end = net_group_end,
    .all_reduce_start = net_all_reduce_start,
    .join = net_join,
    .wait = net_wait,
    .fence = net_fence,
    .abort = net_abort,
    .destroy = net_destroy,
    .send_tagged = net_send_tagged,
    .recv_tagged = net_recv_tagged,
    .probe = net_probe,
};

int sf_comm_net_create_group(sf_net *net, const int *ranks, int size, int rank, uint32_t channel_base,
                             sf_comm_net_options_fn options, void *user, int timeout_ms, sf_comm **out)
{
    if (out) *out = NULL;
    if (!net || !out || !ranks) return sf_error(SF_E_INVAL, "network communicator: no sf_net, ranks or place for the result");
    if (size < 1 || rank < 0 || rank >= size)
        return sf_error(SF_E_INVAL, "network communicator: rank %d of %d", rank, size);
    if (timeout_ms <= 0) return sf_error(SF_E_INVAL, "network communicator: timeout %d ms", timeout_ms);
    if (channel_base > UINT32_MAX - (LINKS - 1))
        return sf_error(SF_E_INVAL, "network communicator: channel base %u leaves no room for %d channels",
                        channel_base, LINKS);
    sf_net_peer_status st;
    if (sf_net_peer_status_get(net, ranks[rank], &st) == SF_OK)
        return sf_error(SF_E_INVAL, "network communicator: rank %d is a peer of this sf_net, not its own rank",
                        ranks[rank]);
    for (int r = 0; r < size; r++) {
        for (int q = 0; q < r; q++)
            if (ranks[q] == ranks[r])
                return sf_error(SF_E_INVAL, "network communicator: ranks %d and %d are both the net's rank %d", q, r,
                                ranks[r]);
        if (r != rank && sf_net_peer_status_get(net, ranks[r], &st) != SF_OK)
            return sf_error(SF_E_INVAL, "network communicator: rank %d of %d (the net's rank %d) is not a peer of rank "
                                        "%d's sf_net",
                            r, size, ranks[r], ranks[rank]);
    }
    sf_comm *c = calloc(1, sizeof *c);
    net_comm *m = calloc(1, sizeof *m);
    link_pair *pairs = calloc((size_t)size * LINKS, sizeof *pairs);
    int *net_rank = malloc((size_t)size * sizeof *net_rank);
    if (!c || !m || !pairs || !net_rank) {
        free(c), free(m), free(pairs), free(net_rank);
        return sf_error(SF_E_NOMEM, "network communicator: out of memory");
    }
    memcpy(net_rank, ranks, (size_t)size * sizeof *net_rank);
    pthread_mutex_init(&m->lock, NULL);
    m->net = net, m->base = channel_base, m->options = options, m->user = user, m->pairs = pairs;
    m->net_rank = net_rank;
    *c = (sf_comm){.ops = &net_ops, .impl = m, .rank = rank, .size = size, .be = NULL, .timeout_ms = timeout_ms};
    *out = c;
    return SF_OK;
}

int sf_comm_net_create(sf_net *net, int rank, int size, uint32_t channel_base, sf_comm_net_options_fn options,
                       void *user, int timeout_ms, sf_comm **out)
{
    if (out) *out = NULL;
    if (size < 1 || rank < 0 || rank >= size)
        return sf_error(SF_E_INVAL, "network communicator: rank %d of %d", rank, size);
    int *ranks = malloc((size_t)size * sizeof *ranks);
    if (!ranks) return sf_error(SF_E_NOMEM, "network communicator: out of memory");
    for (int r = 0; r < size; r++) ranks[r] = r;
    int rc = sf_comm_net_create_group(net, ranks, size, rank, channel_base, options, user, timeout_ms, out);
    free(ranks);
    return rc;
}
