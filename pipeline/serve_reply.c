/* How `seqflow serve`'s replies leave (serve_internal.h, serve_reply_*): every message to a
 * client in that client's protocol version and in order; ROWS without a copy under the send
 * budget (serve_send.c); and the pending reply, whose rows' CRC the checksum thread
 * (serve_crc.c) computes while the loop runs its next step: it goes out before anything else
 * is sent, before its client is forgotten and before the loop waits. A version-4 client with an
 * attached region (serve_region.c) gets its ROWS placed there and a ROWS_AT saying where,
 * whenever the region has room; otherwise through the socket. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "compress/frame.h"
#include "core/process_stats.h"
#include "pipeline/serve_internal.h"

void serve_log(sf_serve *s, const char *fmt, ...)
{
    if (!s->o.log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->o.log(s->o.user, line);
}

/* After a send to c (rc < 0: it failed): a client no longer connected is marked gone, else it
 * was active now. */
static void sent(sf_serve *s, serve_client *c, int rc)
{
    if (rc >= 0) {
        c->last_active = sf_monotonic_seconds();
        return;
    }
    serve_log(s, "a client is no longer connected (%s); its streams expire after %.0f s idle", zmq_strerror(errno),
              s->o.idle_timeout);
    c->gone = 1;
}

/* Sends one message to a client, in the client's protocol version (the header's byte 4 is
 * set to it); a client no longer connected is marked gone. */
void serve_reply(sf_serve *s, serve_client *c, uint8_t *msg, size_t len)
{
    serve_reply_flush(s); /* whatever goes out goes after it: a client's messages stay in order */
    if (!c || c->gone) return;
    msg[4] = (uint8_t)c->version;
    int rc = zmq_send(s->router, c->id, c->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0) rc = zmq_send(s->router, msg, len, ZMQ_DONTWAIT);
    sent(s, c, rc);
}

/* Tells c where in its region the wire packet of the ROWS whose 32-byte header is rows_header
 * lies: a ROWS_AT of the same stream, position and rows. */
static void announce(sf_serve *s, serve_client *c, const uint8_t *rows_header, uint64_t pos, uint64_t len)
{
    uint8_t msg[SF_SERVE_HEADER_SIZE + SF_SERVE_ROWS_AT_SIZE];
    memcpy(msg, rows_header, SF_SERVE_HEADER_SIZE);
    msg[5] = SF_SERVE_ROWS_AT;
    for (int i = 0; i < 8; i++) {
        msg[SF_SERVE_HEADER_SIZE + i] = (uint8_t)(pos >> 8 * i);
        msg[SF_SERVE_HEADER_SIZE + 8 + i] = (uint8_t)(len >> 8 * i);
    }
    serve_region_sent(c->region, pos + len);
    s->shm_messages++;
    serve_reply(s, c, msg, sizeof msg);
}

/* A ROWS to a client, without a copy into ZeroMQ and counted under the send budget
 * (serve_send.c): a kept copy when kept is given, else s->out, which is left empty or with a
 * pooled buffer. Into the client's region instead where it has room. */
void serve_reply_rows(sf_serve *s, serve_client *c, const serve_kept *kept)
{
    serve_reply_flush(s);
    if (!c || c->gone) return;
    const uint8_t *msg = kept ? kept->msg : s->out.data;
    const size_t len = kept ? kept->len : s->out.len;
    uint64_t pos;
    if (serve_region_reserve(serve_client_region(c), len - SF_SERVE_HEADER_SIZE, &pos)) {
        memcpy(serve_region_at(c->region, pos), msg + SF_SERVE_HEADER_SIZE, len - SF_SERVE_HEADER_SIZE);
        if (!kept) s->out.len = 0;
        announce(s, c, msg, pos, len - SF_SERVE_HEADER_SIZE);
        return;
    }
    const size_t frame = c->version >= 3 ? (size_t)s->o.frame_bytes : 0; /* older clients: one frame */
    int rc;
    if (kept) {
        rc = serve_send_copy(s->router, s->send, c->flow, c->id, c->id_len, kept->msg, kept->len, c->version, frame,
                             ZMQ_DONTWAIT);
    } else {
        s->out.data[4] = (uint8_t)c->version;
        rc = serve_send_owned(s->router, s->send, c->flow, c->id, c->id_len, &s->out, frame, ZMQ_DONTWAIT);
    }
    sent(s, c, rc);
}

/* Sends the pending reply once the checksum thread has its rows' CRC (serve_internal.h). */
void serve_reply_flush(sf_serve *s)
{
    if (!s->pending.active) return;
    const double t = sf_monotonic_seconds();
    s->pending.active = 0;
    sf_buffer *head = &s->pending.head;
    uint32_t crc = 0;
    const int rc = serve_crc_wait(s->crc, &crc);
    sf_frame_header_set_payload_crc(head->data + head->len - SF_FRAME_HEADER_SIZE, crc);
    serve_client *c = s->pending.client;
    if (rc != SF_OK) { /* its rows never reached the host */
        if (s->pending.in_region) serve_region_cancel(c->region, s->pending.region_pos);
        sf_packet_free(s->pending.packet);
        s->pending.packet = NULL;
        head->len = 0;
        serve_fail(s, rc);
        return;
    }
    if (s->pending.in_region) { /* the rows are in c's region: the head goes before them */
        sf_packet_free(s->pending.packet);
        const size_t head_len = head->len - SF_SERVE_HEADER_SIZE;
        if (c->gone) {
            serve_region_cancel(c->region, s->pending.region_pos);
        } else {
            memcpy(serve_region_at(c->region, s->pending.region_pos), head->data + SF_SERVE_HEADER_SIZE, head_len);
            announce(s, c, head->data, s->pending.region_pos, head_len + s->pending.rows_len);
        }
    } else if (!c || c->gone)
        sf_packet_free(s->pending.packet);
    else
        sent(s, c,
             serve_send_packet(s->router, s->send, c->flow, c->id, c->id_len, head->data, head->len, s->pending.packet,
                               s->pending.rows, s->pending.rows_len, (size_t)s->o.frame_bytes, ZMQ_DONTWAIT));
    s->pending.packet = NULL;
    head->len = 0;
    if (s->pending.t0 > 0) serve_observe_latency(s, sf_monotonic_seconds() - s->pending.t0);
    s->handover_sum += sf_monotonic_seconds() - t;
}

/* The pending reply's bytes (to c, or to anyone for NULL): counted as in flight already where
 * the loop decides whether there is room for another step. */
uint64_t serve_reply_pending_bytes(const sf_serve *s, const serve_client *c)
{
    return s->pending.active && !s->pending.in_region && (!c || s->pending.client == c)
               ? s->pending.head.len + s->pending.rows_len
               : 0;
}

/* Makes the ROWS whose head is in s->out, of a version-3 client, the pending reply: its rows'
 * CRC is computed on the checksum thread while the loop goes on (after the one pending before
 * it is sent). The packet goes with it. */
int serve_reply_defer(sf_serve *s, serve_client *c, sf_packet *p, const void *rows, size_t rows_len, double t0)
{
    serve_reply_flush(s);
    s->pending.head.len = 0;
    s->out.data[4] = (uint8_t)c->version;
    int rc = sf_buffer_append(&s->pending.head, s->out.data, s->out.len);
    s->out.len = 0;
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    /* into c's region on the checksum thread's way, where there is room */
    const size_t head_len = s->pending.head.len - SF_SERVE_HEADER_SIZE;
    s->pending.in_region = serve_region_reserve(serve_client_region(c), head_len + rows_len, &s->pending.region_pos);
    serve_crc_start(s->crc, p, rows, rows_len,
                    s->pending.in_region ? serve_region_at(c->region, s->pending.region_pos) + head_len : NULL);
    s->pending.active = 1;
    s->pending.client = c;
    s->pending.packet = p;
    s->pending.rows = rows, s->pending.rows_len = rows_len;
    s->pending.t0 = t0;
    return SF_OK;
}

void serve_reply_simple(sf_serve *s, serve_client *c, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b)
{
    uint8_t h[SF_SERVE_HEADER_SIZE];
    sf_serve_header(h, type, stream, a, b);
    serve_reply(s, c, h, sizeof h);
}

void serve_reply_error(sf_serve *s, serve_client *c, uint64_t stream, sf_serve_error code, const char *fmt, ...)
{
    uint8_t msg[SF_SERVE_HEADER_SIZE + SF_SERVE_MAX_TEXT + 1];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf((char *)msg + SF_SERVE_HEADER_SIZE, SF_SERVE_MAX_TEXT + 1, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n > SF_SERVE_MAX_TEXT ? SF_SERVE_MAX_TEXT : (size_t)n;
    sf_serve_header(msg, SF_SERVE_ERROR, stream, (uint64_t)code, len);
    s->errors_sent++;
    serve_reply(s, c, msg, SF_SERVE_HEADER_SIZE + len);
}
