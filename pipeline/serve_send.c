/* Replies handed to ZeroMQ without a copy, under a budget of bytes in flight (serve_internal.h,
 * serve_send_*).
 *
 * Why without a copy: a segment's ROWS are 32 MiB of float32 for the reference model, and
 * zmq_send copied each into a fresh allocation (on Linux a fresh mapping: a copy and a page
 * fault per 4 KiB) on the server's one thread. Instead the encoded buffer itself becomes the
 * message (zmq_msg_init_data); when ZeroMQ's I/O thread has written it, or dropped it with its
 * connection, ZeroMQ calls written() below, which gives the buffer back to a small pool for the
 * next reply to be encoded into.
 *
 * Why a budget: without the copy the loop outran the I/O thread, and gigabytes of replies
 * queued behind it (up to streams x credit x 32 MiB); heartbeats and control replies waited
 * behind them past the heartbeat timeout, ZeroMQ dropped connections and their streams hung
 * (bench/RESULTS.md, "Runs 44 - 49"). Every ROWS handed over is counted here until written()
 * returns it, and the loop computes nothing more while the count is at the budget
 * (serve_send_full): what waits inside ZeroMQ stays under the budget plus one step's replies.
 * Each client's messages are also counted in its flow, so that the loop can hold a client that
 * does not read to its share of the budget while the others go on.
 *
 * Threads: everything here is the loop's except written(), which runs on a ZeroMQ I/O thread
 * (or the loop's, where a send fails or a socket closes): the counts are atomic, the pool is
 * under a mutex, a flow is freed by the last of its client and its messages, and a loop that
 * waits for bytes to drain (serve_send_arm) is woken by a byte on a pipe it polls, so that it
 * goes on at once rather than at its next poll timeout. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "pipeline/serve_internal.h"

#define POOL_BUFFERS 8 /* kept for reuse; more coming back are freed */

struct serve_flow {
    _Atomic uint64_t bytes;     /* the client's bytes in flight */
    atomic_int refs;            /* its client's and each of its messages' in flight */
};

struct serve_send {
    _Atomic uint64_t in_flight; /* bytes handed to ZeroMQ, not yet written or dropped */
    atomic_int armed;           /* the loop waits for bytes to drain: the next written() wakes it */
    uint64_t budget;
    uint64_t peak;              /* the largest in_flight right after a hand-over (loop thread) */
    uint64_t messages, bytes;   /* handed over, in all (loop thread) */
    int wake[2];                /* a pipe: written() writes a byte to wake an armed loop */
    pthread_mutex_t lock;       /* the pool's */
    sf_buffer pool[POOL_BUFFERS];
    int n;
    uint64_t pooled;            /* the pooled buffers' last lengths: about the pages they hold */
};

/* What travels with a message: its sender, its client's flow, and either the encoded message
 * (buf) or its head (buf) and the packet whose rows follow it (packet, rows, rows_len). */
typedef struct owned {
    serve_send *send;
    serve_flow *flow;
    sf_buffer buf;
    sf_packet *packet;
    const uint8_t *rows;
    size_t rows_len;
    uint64_t len;      /* the bytes counted: the whole message */
    atomic_int frames; /* not yet written or dropped: the last one gives the buffers back */
} owned;

serve_flow *serve_flow_create(void)
{
    serve_flow *f = malloc(sizeof *f);
    if (!f) return NULL;
    atomic_init(&f->bytes, 0);
    atomic_init(&f->refs, 1);
    return f;
}

void serve_flow_release(serve_flow *f)
{
    if (f && atomic_fetch_sub(&f->refs, 1) == 1) free(f);
}

uint64_t serve_flow_bytes(const serve_flow *f) { return f ? atomic_load(&f->bytes) : 0; }

serve_send *serve_send_create(uint64_t budget)
{
    serve_send *p = calloc(1, sizeof *p);
    if (!p) {
        sf_error(SF_E_NOMEM, "out of memory");
        return NULL;
    }
    p->budget = budget;
    atomic_init(&p->in_flight, 0);
    atomic_init(&p->armed, 0);
    p->wake[0] = p->wake[1] = -1;
    if (pipe(p->wake) != 0 || fcntl(p->wake[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(p->wake[1], F_SETFL, O_NONBLOCK) != 0 ||
        fcntl(p->wake[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(p->wake[1], F_SETFD, FD_CLOEXEC) != 0) {
        sf_error(SF_E_IO, "serve: cannot make the send budget's pipe: %s", strerror(errno));
        if (p->wake[0] >= 0) close(p->wake[0]), close(p->wake[1]);
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    return p;
}

void serve_send_free(serve_send *p)
{
    if (!p) return;
    for (int i = 0; i < p->n; i++) sf_buffer_release(&p->pool[i]);
    pthread_mutex_destroy(&p->lock);
    close(p->wake[0]);
    close(p->wake[1]);
    free(p);
}

/* ZeroMQ's free function: on its I/O thread once the message is written, or wherever the
 * message is closed unsent (a failed send, a dropped connection, the socket's close). */
static void written(void *data, void *hint)
{
    owned *o = hint;
    (void)data;
    if (atomic_fetch_sub(&o->frames, 1) != 1) return; /* the message's other frames are not done */
    serve_send *p = o->send;
    const uint64_t len = o->len;
    pthread_mutex_lock(&p->lock);
    if (!o->packet && p->n < POOL_BUFFERS && p->pooled + len <= p->budget) {
        p->pool[p->n++] = o->buf;
        p->pooled += len;
        o->buf.data = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    free(o->buf.data);
    sf_packet_free(o->packet); /* its rows buffer goes back to the packets' cache */
    /* after the buffer is back: a loop that wakes finds it in the pool */
    if (o->flow) {
        atomic_fetch_sub(&o->flow->bytes, len);
        serve_flow_release(o->flow);
    }
    atomic_fetch_sub(&p->in_flight, len);
    free(o);
    if (atomic_exchange(&p->armed, 0)) {
        ssize_t n = write(p->wake[1], "", 1); /* a full pipe: a wake-up is pending anyway */
        (void)n;
    }
}

void serve_send_take(serve_send *p, sf_buffer *out)
{
    if (out->cap || !p) return;
    pthread_mutex_lock(&p->lock);
    if (p->n) {
        *out = p->pool[--p->n];
        p->pooled -= out->len;
    }
    pthread_mutex_unlock(&p->lock);
    out->len = 0;
}

/* Hands o's message to ZeroMQ as the frames after the routing id, counted until written() has
 * run for every frame: the encoded message as one frame or frames of at most `frame` bytes; or
 * the head as one frame and the packet's rows in frames of at most `frame` bytes. Every
 * frame's message is made before the id frame is sent, so that running out of memory never
 * leaves a lone id frame on the socket. o is ZeroMQ's, or freed, either way. */
static int hand_over(void *socket, serve_send *p, const uint8_t *id, size_t id_len, owned *o, size_t frame, int flags)
{
    const size_t body = o->packet ? o->rows_len : o->buf.len;
    const uint8_t *data = o->packet ? o->rows : o->buf.data;
    const size_t pieces = frame && body > frame ? (body + frame - 1) / frame : 1, n = pieces + (o->packet != NULL);
    const size_t step = pieces == 1 ? body : frame;
    zmq_msg_t one, *msgs = n == 1 ? &one : malloc(n * sizeof *msgs);
    o->send = p;
    o->len = o->packet ? o->buf.len + o->rows_len : o->buf.len;
    atomic_init(&o->frames, (int)n);
    if (o->flow) {
        atomic_fetch_add(&o->flow->refs, 1);
        atomic_fetch_add(&o->flow->bytes, o->len);
    }
    const uint64_t now = atomic_fetch_add(&p->in_flight, o->len) + o->len;
    if (now > p->peak) p->peak = now;
    p->messages++;
    p->bytes += o->len;
    size_t made = 0;
    if (msgs && o->packet && zmq_msg_init_data(&msgs[made], o->buf.data, o->buf.len, written, o) == 0) made++;
    while (msgs && made < n && (made || !o->packet)) {
        const size_t at = (made - (o->packet != NULL)) * step, size = body - at < step ? body - at : step;
        if (zmq_msg_init_data(&msgs[made], (void *)(data + at), size, written, o) != 0) break;
        made++;
    }
    if (made < n) {                                         /* out of memory: nothing is sent */
        for (size_t i = made; i < n; i++) written(NULL, o); /* the frames never made */
        for (size_t i = 0; i < made; i++) zmq_msg_close(&msgs[i]);
        if (msgs != &one) free(msgs);
        errno = ENOMEM;
        return -1;
    }
    size_t sent = 0;
    if (zmq_send(socket, id, id_len, ZMQ_SNDMORE | flags) >= 0)
        while (sent < n && zmq_msg_send(&msgs[sent], socket, (sent + 1 < n ? ZMQ_SNDMORE : 0) | flags) >= 0) sent++;
    const int e = errno;
    for (size_t i = sent; i < n; i++) zmq_msg_close(&msgs[i]); /* unsent: ZeroMQ calls written() now */
    if (msgs != &one) free(msgs);
    errno = e;
    return sent == n ? 0 : -1;
}

/* A fresh owned for a message going to flow's client; NULL (errno ENOMEM) when out of memory. */
static owned *owned_new(serve_flow *flow)
{
    owned *o = calloc(1, sizeof *o);
    if (!o)
        errno = ENOMEM;
    else
        o->flow = flow;
    return o;
}

int serve_send_owned(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len, sf_buffer *out,
                     size_t frame, int flags)
{
    owned *o = owned_new(flow);
    int rc = -1;
    if (o) {
        o->buf = *out;
        memset(out, 0, sizeof *out);
        rc = hand_over(socket, p, id, id_len, o, frame, flags);
    }
    serve_send_take(p, out);
    return rc;
}

int serve_send_copy(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len,
                    const uint8_t *data, size_t len, int version, size_t frame, int flags)
{
    owned *o = owned_new(flow);
    if (!o) return -1;
    if (sf_buffer_append(&o->buf, data, len) != SF_OK) {
        free(o);
        errno = ENOMEM;
        return -1;
    }
    if (len > 4) o->buf.data[4] = (uint8_t)version;
    return hand_over(socket, p, id, id_len, o, frame, flags);
}

int serve_send_packet(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len,
                      const uint8_t *head, size_t head_len, sf_packet *packet, const void *rows, size_t rows_len,
                      size_t frame, int flags)
{
    owned *o = owned_new(flow);
    if (!o || sf_buffer_append(&o->buf, head, head_len) != SF_OK) {
        free(o);
        sf_packet_free(packet);
        errno = ENOMEM;
        return -1;
    }
    o->packet = packet, o->rows = rows, o->rows_len = rows_len;
    return hand_over(socket, p, id, id_len, o, frame, flags);
}

int serve_send_full(const serve_send *p, uint64_t extra) { return atomic_load(&p->in_flight) + extra >= p->budget; }

int serve_send_wake_fd(const serve_send *p) { return p->wake[0]; }

void serve_send_arm(serve_send *p, int waiting)
{
    atomic_store(&p->armed, waiting);
    if (waiting) return;
    char bytes[64];
    while (read(p->wake[0], bytes, sizeof bytes) > 0) {}
}

void serve_send_counters(const serve_send *p, serve_send_stats *out)
{
    out->in_flight = atomic_load(&p->in_flight);
    out->budget = p->budget;
    out->peak = p->peak;
    out->messages = p->messages;
    out->bytes = p->bytes;
}
