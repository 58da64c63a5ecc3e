/* `seqflow serve`'s server (pipeline/serve.h): clients, streams, credit, the graph loop. The
 * HTTP side, the metrics and the counters are in pipeline/serve_http.c, the replies' way into
 * ZeroMQ and the send budget in pipeline/serve_send.c. */
#include "pipeline/serve.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "core/process_stats.h"
#include "pipeline/graph_internal.h"
#include "pipeline/serve_internal.h"
#include "pipeline/wire.h"
#include "pipeline/zap.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

static void set_int(void *sock, int option, int value) { zmq_setsockopt(sock, option, &value, sizeof value); }

/* ---- ZAP (RFC 27): the admitted clients' keys, or anyone under plaintext ------------------ */

/* An admitted client's key, or anyone under plaintext. */
static int zap_decide(void *user, const sf_zap_request *r, char *user_id, size_t size)
{
    sf_serve *s = user;
    (void)user_id, (void)size;
    if (r->key && !s->o.plaintext) {
        for (int i = 0; i < s->n_keys; i++)
            if (memcmp(s->keys[i], r->key, 32) == 0) return 1;
        return 0;
    }
    return strcmp(r->mechanism, "NULL") == 0 && s->o.plaintext;
}

static void on_zap(sf_serve *s) { s->refused += (uint64_t)sf_zap_answer(s->zap, zap_decide, s, "key not admitted"); }

/* ---- clients and streams ------------------------------------------------------------------ */

static serve_client *find_client(sf_serve *s, const uint8_t *id, size_t len)
{
    for (uint32_t i = 0; i < s->n_clients; i++)
        if (s->clients[i]->id_len == len && memcmp(s->clients[i]->id, id, len) == 0) return s->clients[i];
    return NULL;
}

static serve_stream *find_stream(sf_serve *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->n_streams; i++)
        if (s->streams[i]->id == id) return s->streams[i];
    return NULL;
}

void serve_stream_free(serve_stream *st)
{
    if (!st) return;
    for (int k = 0; k < st->n_kept; k++) free(st->kept[k].msg);
    free(st->kept);
    free(st->tok);
    free(st);
}

static void remove_stream(sf_serve *s, serve_stream *st)
{
    for (uint32_t i = 0; i < s->n_streams; i++)
        if (s->streams[i] == st) {
            s->streams[i] = s->streams[--s->n_streams];
            break;
        }
    if (st->owner) st->owner->n_streams--;
    serve_stream_free(st);
    s->ckpt_dirty = 1;
}

static void remove_client(sf_serve *s, serve_client *c)
{
    if (s->pending.active && s->pending.client == c) serve_reply_flush(s);
    for (uint32_t i = 0; i < s->n_clients; i++)
        if (s->clients[i] == c) {
            s->clients[i] = s->clients[--s->n_clients];
            break;
        }
    serve_flow_release(c->flow); /* its messages still in flight hold it until written */
    serve_region_drop(s, c);
    free(c);
}

/* The stream named by a message, when c owns it and it takes more (not closing). */
static serve_stream *owned_stream(sf_serve *s, serve_client *c, const sf_serve_msg *m)
{
    serve_stream *st = find_stream(s, m->stream);
    if (!st || st->owner != c || st->closing) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_NOT_OPEN, "%s: stream %llu is not open for this client%s",
                          sf_serve_type_name(m->type), (unsigned long long)m->stream,
                          st && st->closing ? " (closing)" : "");
        return NULL;
    }
    return st;
}

static void on_open(sf_serve *s, serve_client *c, const sf_serve_msg *m)
{
    serve_stream *st = find_stream(s, m->stream);
    if (st && st->owner != c) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_BUSY, "OPEN: stream %llu is open for another client%s",
                          (unsigned long long)m->stream,
                          st->owner ? "" : " (restored from a checkpoint, it awaits its client's RESUME)");
        return;
    }
    if (st && st->closing) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_NOT_OPEN, "OPEN: stream %llu is closing",
                          (unsigned long long)m->stream);
        return;
    }
    if (!st) {
        if (s->n_streams >= s->o.max_streams) {
            serve_reply_error(s, c, m->stream, SF_SERVE_E_LIMIT, "OPEN: the server holds its maximum of %u streams",
                              s->o.max_streams);
            return;
        }
        st = calloc(1, sizeof *st);
        if (!st) {
            serve_reply_error(s, c, m->stream, SF_SERVE_E_LIMIT, "OPEN: out of memory");
            return;
        }
        st->id = m->stream;
        st->owner = c;
        st->resumable = s->ckpt_dir && m->version >= 2;
        c->n_streams++;
        s->streams[s->n_streams++] = st;
        s->streams_opened++;
        s->ckpt_dirty = 1;
    }
    st->credit += (int64_t)(m->a > s->o.max_credit ? s->o.max_credit : m->a);
    if (st->credit > (int64_t)s->o.max_credit) st->credit = s->o.max_credit;
    serve_reply_simple(s, c, SF_SERVE_OPENED, st->id, st->next_pos, s->o.window);
    /* a resumable stream's client learns it here: it keeps its tokens until DURABLE says */
    if (st->resumable) serve_reply_simple(s, c, SF_SERVE_DURABLE, st->id, st->durable, 0);
}

/* RESUME: a client takes a stream over again (after a restart of the server, from a checkpoint,
 * or after its own connection broke) and gets the rows it lacks that were already computed. */
static void on_resume(sf_serve *s, serve_client *c, const sf_serve_msg *m)
{
    serve_stream *st = find_stream(s, m->stream);
    unsigned long long id = (unsigned long long)m->stream;
    if (!s->ckpt_dir) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_UNKNOWN,
                          "RESUME: this server keeps no checkpoints (started without --checkpoint)");
        return;
    }
    if (!st || !st->resumable) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_UNKNOWN, "RESUME: the server holds no state of stream %llu (%s)",
                          id,
                          st ? "opened with protocol version 1"
                             : "never opened, closed, expired, or opened after the last checkpoint");
        return;
    }
    /* the rows it can send again start at the oldest kept one, else at the next to compute */
    uint64_t first = st->n_kept ? st->kept[0].pos : st->rows_sent;
    if (m->b < first || m->b < st->acked) {
        serve_reply_error(
            s, c, m->stream, SF_SERVE_E_GAP,
            "RESUME: stream %llu's rows before %llu were acknowledged and are no longer held; the client has %llu", id,
            (unsigned long long)(first > st->acked ? first : st->acked), (unsigned long long)m->b);
        return;
    }
    if (st->owner != c) {
        if (st->owner) st->owner->n_streams--;
        st->owner = c;
        c->n_streams++;
    }
    if (st->orphan_since) s->streams_resumed++;
    st->orphan_since = 0;
    st->abandoned = 0;
    /* after a restart the client may hold rows computed after the checkpoint: they come again
     * (it drops them), and until then the acknowledgement stays within the rows sent */
    st->acked = m->b < st->rows_sent ? m->b : st->rows_sent;
    serve_drop_acked(st, m->b);
    /* the old connection's credit went with it */
    st->credit = (int64_t)(m->a > s->o.max_credit ? s->o.max_credit : m->a);
    serve_reply_simple(s, c, SF_SERVE_OPENED, st->id, st->next_pos, s->o.window);
    if (st->durable) serve_reply_simple(s, c, SF_SERVE_DURABLE, st->id, st->durable, 0);
    st->durable_told = st->durable;
    st->unsent = st->n_kept; /* sent again as the send budget lets them go (resend_kept) */
    serve_log(s, "stream %llu resumed at position %llu (the client has %llu rows; %d kept to send again)", id,
              (unsigned long long)st->next_pos, (unsigned long long)m->b, st->n_kept);
}

/* Remembers when the tokens up to `end` arrived (for the push-to-reply latency); when the
 * ring is full the newest entry covers the new tokens too (their latency then reads a bit
 * short, never long). */
static void note_arrival(serve_stream *st, uint64_t end, double t)
{
    if (st->n_arr == SERVE_ARRIVALS) {
        st->arr[(st->arr_head + st->n_arr - 1) % SERVE_ARRIVALS].end = end;
        return;
    }
    int k = (st->arr_head + st->n_arr++) % SERVE_ARRIVALS;
    st->arr[k].end = end;
    st->arr[k].t = t;
}

/* When the token at position `pos` arrived; drops the entries wholly before `upto`. */
static double arrival_of(serve_stream *st, uint64_t pos, uint64_t upto)
{
    double t = 0;
    for (int i = 0; i < st->n_arr; i++) {
        const serve_arrival *a = &st->arr[(st->arr_head + i) % SERVE_ARRIVALS];
        if (a->end > pos) {
            t = a->t;
            break;
        }
    }
    while (st->n_arr && st->arr[st->arr_head].end <= upto) {
        st->arr_head = (st->arr_head + 1) % SERVE_ARRIVALS;
        st->n_arr--;
    }
    return t;
}

static void on_push(sf_serve *s, serve_client *c, const sf_serve_msg *m)
{
    serve_stream *st = owned_stream(s, c, m);
    if (!st) return;
    if (m->a != st->next_pos) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_POSITION,
                          "PUSH at position %llu: stream %llu takes position %llu next", (unsigned long long)m->a,
                          (unsigned long long)m->stream, (unsigned long long)st->next_pos);
        return;
    }
    size_t n = (size_t)m->b; /* decode bounded it by the window */
    if (st->tok_len + n > s->o.window) {
        serve_reply_error(s, c, m->stream, SF_SERVE_E_WINDOW,
                          "PUSH of %zu tokens: stream %llu holds %zu not yet computed, its window is %u", n,
                          (unsigned long long)m->stream, st->tok_len, s->o.window);
        return;
    }
    const uint8_t *p = m->payload;
    for (size_t i = 0; i < n; i++) {
        uint32_t t = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                     (uint32_t)p[4 * i + 3] << 24;
        if (t >= (uint32_t)s->vocab) {
            serve_reply_error(s, c, m->stream, SF_SERVE_E_TOKEN,
                              "PUSH: token %u at position %llu is outside the vocabulary (%d ids)", t,
                              (unsigned long long)(m->a + i), s->vocab);
            return;
        }
    }
    if (st->tok_head + st->tok_len + n > st->tok_cap) {
        if (st->tok_head) { /* slide the pending tokens to the front before growing */
            memmove(st->tok, st->tok + st->tok_head, st->tok_len * sizeof *st->tok);
            st->tok_head = 0;
        }
        if (st->tok_len + n > st->tok_cap) {
            size_t cap = st->tok_cap ? st->tok_cap : 1024;
            while (cap < st->tok_len + n) cap *= 2;
            if (cap > s->o.window) cap = s->o.window;
            uint32_t *grown = realloc(st->tok, cap * sizeof *grown);
            if (!grown) {
                serve_reply_error(s, c, m->stream, SF_SERVE_E_LIMIT, "PUSH: out of memory");
                return;
            }
            st->tok = grown;
            st->tok_cap = cap;
        }
    }
    uint32_t *dst = st->tok + st->tok_head + st->tok_len;
    for (size_t i = 0; i < n; i++)
        dst[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
    st->tok_len += n;
    st->next_pos += n;
    s->tokens_in += n;
    note_arrival(st, st->next_pos, sf_monotonic_seconds());
}

static void on_message(sf_serve *s, serve_client *c, const uint8_t *buf, size_t len)
{
    sf_serve_msg m;
    s->messages_in++;
    if (len > 4 && buf[4] >= SF_SERVE_VERSION_MIN && buf[4] <= SF_SERVE_VERSION) c->version = buf[4];
    if (sf_serve_decode(buf, len, s->o.window, &m) != SF_OK) {
        uint64_t stream = 0;
        for (int i = 7; len >= 16 && i >= 0; i--) stream = stream << 8 | buf[8 + i];
        serve_reply_error(s, c, stream, SF_SERVE_E_MALFORMED, "%s", sf_last_error());
        return;
    }
    serve_stream *st;
    switch (m.type) {
    case SF_SERVE_OPEN: on_open(s, c, &m); break;
    case SF_SERVE_RESUME: on_resume(s, c, &m); break;
    case SF_SERVE_PUSH: on_push(s, c, &m); break;
    case SF_SERVE_FLUSH:
        if (!(st = owned_stream(s, c, &m))) break;
        if (st->n_flush == SERVE_MAX_FLUSHES) {
            serve_reply_error(s, c, m.stream, SF_SERVE_E_LIMIT, "FLUSH: stream %llu has %d flushes pending already",
                              (unsigned long long)m.stream, SERVE_MAX_FLUSHES);
            break;
        }
        st->flush_at[st->n_flush] = st->next_pos;
        st->flush_t[st->n_flush++] = sf_monotonic_seconds();
        break;
    case SF_SERVE_CLOSE:
        st = find_stream(s, m.stream);
        if (st && st->owner == c && st->closing) break; /* again, after a RESUME: it stands */
        if (!(st = owned_stream(s, c, &m))) break;
        st->closing = 1;
        break;
    case SF_SERVE_CREDIT:
        /* a closing stream still needs credit for its last rows; credit for a stream that is
         * not (or no longer) this client's is dropped without a word: it races with CLOSED */
        st = find_stream(s, m.stream);
        if (!st || st->owner != c) break;
        st->credit += (int64_t)(m.a > s->o.max_credit ? s->o.max_credit : m.a);
        if (st->credit > (int64_t)s->o.max_credit) st->credit = s->o.max_credit;
        if (m.b > st->acked && m.b <= st->rows_sent) { /* version 2: the rows it has */
            st->acked = m.b;
            serve_drop_acked(st, m.b);
        }
        break;
    case SF_SERVE_PING: serve_reply_simple(s, c, SF_SERVE_PONG, m.stream, m.a, 0); break;
    case SF_SERVE_MAP:
    case SF_SERVE_ATTACH:
    case SF_SERVE_RELEASE: serve_region_message(s, c, &m); break;
    default:
        serve_reply_error(s, c, m.stream, SF_SERVE_E_TYPE, "a client does not send %s (type %d)",
                          sf_serve_type_name(m.type), m.type);
    }
}

/* Takes every message waiting on the ROUTER (at most `budget`). */
static void on_router(sf_serve *s, int budget)
{
    while (budget-- > 0) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, s->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        int frames = 1, ok = zmq_msg_more(&id);
        zmq_msg_init(&body);
        if (ok && zmq_msg_recv(&body, s->router, 0) < 0) ok = 0;
        int more = ok && zmq_msg_more(&body);
        while (more) { /* a message of more than one frame: drain it, then refuse it */
            zmq_msg_t extra;
            zmq_msg_init(&extra);
            more = zmq_msg_recv(&extra, s->router, 0) >= 0 && zmq_msg_more(&extra);
            zmq_msg_close(&extra);
            frames++;
        }
        size_t id_len = zmq_msg_size(&id);
        serve_client *c = ok && id_len <= SERVE_MAX_ID ? find_client(s, zmq_msg_data(&id), id_len) : NULL;
        if (ok && !c && id_len <= SERVE_MAX_ID && s->n_clients < s->o.max_clients && (c = calloc(1, sizeof *c))) {
            memcpy(c->id, zmq_msg_data(&id), id_len);
            c->id_len = id_len;
            c->version = SF_SERVE_VERSION;
            if ((c->flow = serve_flow_create())) s->clients[s->n_clients++] = c;
            else free(c), c = NULL;
        }
        if (c) {
            c->last_active = sf_monotonic_seconds();
            c->gone = 0;
            if (frames > 1) {
                s->messages_in++;
                serve_reply_error(s, c, 0, SF_SERVE_E_MALFORMED, "a message is one frame, not %d", frames + 1);
            } else {
                on_message(s, c, zmq_msg_data(&body), zmq_msg_size(&body));
            }
        } else if (ok && id_len <= SERVE_MAX_ID) { /* no room for another client: say so, keep nothing */
            serve_client tmp = {.id_len = id_len, .version = SF_SERVE_VERSION};
            memcpy(tmp.id, zmq_msg_data(&id), id_len);
            serve_reply_error(s, &tmp, 0, SF_SERVE_E_LIMIT, "the server has its maximum of %u clients",
                              s->o.max_clients);
        }
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}

/* ---- the graph ---------------------------------------------------------------------------- */

int serve_fail(sf_serve *s, int rc)
{
    snprintf(s->failure, sizeof s->failure, "%s", sf_last_error());
    s->failed = rc;
    serve_log(s, "the pipeline failed: %s", s->failure);
    for (uint32_t i = 0; i < s->n_clients; i++)
        if (s->clients[i]->n_streams)
            serve_reply_error(s, s->clients[i], 0, SF_SERVE_E_INTERNAL, "the pipeline failed: %s", s->failure);
    return rc;
}

/* Sends what left the graph to the streams' owners; t0 (when > 0) is when the input that
 * completed it arrived. */
static int dispatch(sf_serve *s, double t0)
{
    for (sf_packet *p; (p = sf_graph_pull(s->graph)); sf_packet_free(p)) {
        serve_stream *st = find_stream(s, p->stream);
        if (!st || st->abandoned) continue;
        /* a resumable stream's rows are kept even while its client is away: it resumes */
        if (!st->resumable && (!st->owner || st->owner->gone)) continue;
        const double t_encode = sf_monotonic_seconds();
        s->out.len = 0;
        uint32_t *tokens = p->tokens; /* the client has its tokens: only the rows travel */
        p->tokens = NULL;
        /* a version-3 client takes the rows without a copy: only the head is encoded, and the
         * packet goes with the message (a resumable stream keeps whole copies anyway) */
        const int direct = !st->resumable && st->owner && !st->owner->gone && st->owner->version >= 3;
        const void *rows = NULL;
        size_t rows_len = 0;
        /* rows on their way from the device (sf_graph_set_device_outputs): the checksum thread
         * waits for a direct reply's beside the next step; any other's are waited for now */
        int rc = p->dev && direct ? sf_packet_reserve(p, 0, p->n * p->width) : SF_OK;
        if (rc == SF_OK) rc = sf_serve_encode(&s->out, SF_SERVE_ROWS, st->id, p->position, p->n, NULL, 0);
        if (rc == SF_OK && direct && sf_wire_encode_head(p, &s->out, &rows, &rows_len) != SF_OK)
            rows = NULL; /* a packet of another shape (or no memory for the head): encoded whole */
        if (rc == SF_OK && !rows && p->dev) rc = sf_packet_to_host(p);
        if (rc == SF_OK && !rows) rc = sf_wire_encode(p, &s->wire, NULL, &s->out);
        p->tokens = tokens;
        if (rc != SF_OK) {
            sf_packet_free(p);
            return serve_fail(s, rc);
        }
        int queued = 0; /* behind kept rows not yet sent again: sent after them, in order */
        if (!(p->flags & SF_PACKET_PROVISIONAL)) {
            st->rows_sent = p->position + p->n;
            /* kept until acknowledged: a RESUME sends it again, a checkpoint saves it */
            if (st->resumable && (rc = serve_keep(st, p->position, p->n, s->out.data, s->out.len)) != SF_OK) {
                sf_packet_free(p);
                return serve_fail(s, rc);
            }
            if (st->resumable && st->unsent) queued = ++st->unsent;
        }
        const double t_handover = sf_monotonic_seconds();
        s->encode_sum += t_handover - t_encode;
        const size_t n = p->n;
        const int provisional = (p->flags & SF_PACKET_PROVISIONAL) != 0;
        if (queued) {
            s->tokens_out += n;
            continue;
        }
        if (rows) { /* its CRC on the checksum thread while the loop goes on */
            rc = serve_reply_defer(s, st->owner, p, rows, rows_len, t0);
            p = NULL; /* the pending reply's now */
            if (rc != SF_OK) return serve_fail(s, rc);
        } else {
            serve_reply_rows(s, st->owner, NULL);
            if (t0 > 0) serve_observe_latency(s, sf_monotonic_seconds() - t0);
        }
        s->handover_sum += sf_monotonic_seconds() - t_handover;
        st->credit--;
        if (provisional)
            s->provisional_out += n; /* they come again */
        else
            s->tokens_out += n;
        s->replies++;
    }
    return SF_OK;
}

/* One step of a stream: a flush due, up to one segment of its tokens, or its end. Returns 1
 * when it did something, 0 when it waits (no credit, nothing to do), or a negative error. */
static int can_step(const sf_serve *s, const serve_stream *st)
{
    /* a resumable stream also waits while max_credit of its ROWS are unacknowledged: that
     * bounds what the server keeps for it */
    return st->credit > 0 && st->owner && !st->unsent && (!st->resumable || st->n_kept < (int)s->o.max_credit);
}

/* Room under the send budget for another reply to c: in all, and within c's share (a client
 * that does not read holds at most its share while the others go on); and in c's region, where
 * its rows go there. */
static int has_room(const sf_serve *s, const serve_client *c)
{
    return !serve_send_full(s->send, serve_reply_pending_bytes(s, NULL)) &&
           serve_flow_bytes(c->flow) + serve_reply_pending_bytes(s, c) < s->send_share &&
           serve_region_has_room(serve_client_region(c));
}

/* Whether a stream has a step to take once the budget has room (or rows to send again). */
static int wants_step(const sf_serve *s, const serve_stream *st)
{
    return (can_step(s, st) && (st->tok_len || st->n_flush || st->closing)) || (st->unsent && st->owner && !st->owner->gone);
}

/* Each client's share of the send budget: the budget over the clients that have rows in
 * flight or a step to take, and at most half of it, so that a client that stops reading (its
 * rows stay in flight) never holds all of it: the others go on in the other half. */
static void update_share(sf_serve *s)
{
    uint32_t sharing = 0;
    for (uint32_t i = 0; i < s->n_clients; i++)
        s->clients[i]->sharing =
            serve_flow_bytes(s->clients[i]->flow) + serve_reply_pending_bytes(s, s->clients[i]) > 0;
    for (uint32_t i = 0; i < s->n_streams; i++)
        if (s->streams[i]->owner && wants_step(s, s->streams[i])) s->streams[i]->owner->sharing = 1;
    for (uint32_t i = 0; i < s->n_clients; i++) sharing += (uint32_t)s->clients[i]->sharing;
    s->send_share = s->o.send_budget / (sharing > 2 ? sharing : 2);
}

/* Sends kept ROWS again to the clients that RESUMEd their streams, oldest first, while the send
 * budget has room; each costs its credit (the credit may go below 0). */
static void resend_kept(sf_serve *s)
{
    for (uint32_t i = 0; i < s->n_streams && !serve_send_full(s->send, serve_reply_pending_bytes(s, NULL)); i++) {
        serve_stream *st = s->streams[i];
        if (!st->owner || st->owner->gone) continue;
        while (st->unsent > 0 && !st->owner->gone && has_room(s, st->owner)) {
            serve_reply_rows(s, st->owner, &st->kept[st->n_kept - st->unsent]);
            st->unsent--;
            st->credit--;
            s->replies++;
        }
    }
}

static int step(sf_serve *s, serve_stream *st)
{
    if (!can_step(s, st) || !has_room(s, st->owner)) return 0;
    int rc;
    if (st->n_flush && st->flush_at[0] == st->fed) {
        double t0 = st->flush_t[0];
        memmove(st->flush_at, st->flush_at + 1, (size_t)(st->n_flush - 1) * sizeof *st->flush_at);
        memmove(st->flush_t, st->flush_t + 1, (size_t)(st->n_flush - 1) * sizeof *st->flush_t);
        st->n_flush--;
        const double t_graph = sf_monotonic_seconds();
        if ((rc = sf_graph_flush(s->graph, st->id)) != SF_OK) return serve_fail(s, rc);
        s->graph_sum += sf_monotonic_seconds() - t_graph;
        rc = dispatch(s, t0);
        return rc == SF_OK ? 1 : rc;
    }
    if (st->tok_len) {
        uint64_t n = st->n_flush ? st->flush_at[0] - st->fed : st->tok_len;
        uint64_t to_boundary = s->segment - st->fed % s->segment;
        if (n > to_boundary) n = to_boundary;
        double t0 = arrival_of(st, st->fed + n - 1, st->fed + n);
        const double t_graph = sf_monotonic_seconds();
        if ((rc = sf_graph_push(s->graph, st->id, st->tok + st->tok_head, (size_t)n)) != SF_OK) return serve_fail(s, rc);
        s->graph_sum += sf_monotonic_seconds() - t_graph;
        st->tok_head += (size_t)n;
        st->tok_len -= (size_t)n;
        st->fed += n;
        s->ckpt_dirty = 1;
        if (!st->tok_len) st->tok_head = 0;
        rc = dispatch(s, t0);
        return rc == SF_OK ? 1 : rc;
    }
    if (st->closing) {
        const double t_graph = sf_monotonic_seconds();
        if ((rc = sf_graph_end(s->graph, st->id)) != SF_OK) return serve_fail(s, rc);
        s->graph_sum += sf_monotonic_seconds() - t_graph;
        if ((rc = dispatch(s, 0)) != SF_OK) return rc;
        serve_reply_simple(s, st->owner, SF_SERVE_CLOSED, st->id, st->fed, 0);
        s->streams_closed++;
        remove_stream(s, st);
        return 1;
    }
    return 0;
}

/* Ends the streams of clients inactive for idle_timeout (state freed, rows discarded) and
 * forgets those clients. */
static int expire(sf_serve *s, double now)
{
    for (uint32_t i = 0; i < s->n_clients;) {
        serve_client *c = s->clients[i];
        if (now - c->last_active <= s->o.idle_timeout) {
            i++;
            continue;
        }
        int ended = 0;
        for (uint32_t k = 0; k < s->n_streams;) {
            serve_stream *st = s->streams[k];
            if (st->owner != c) {
                k++;
                continue;
            }
            st->abandoned = 1;
            if (st->fed) { /* the graph holds its state: end it there */
                int rc = sf_graph_end(s->graph, st->id);
                if (rc == SF_OK) rc = dispatch(s, 0);
                if (rc != SF_OK) return rc == s->failed ? rc : serve_fail(s, rc);
            }
            remove_stream(s, st);
            s->streams_expired++;
            ended++;
        }
        if (ended)
            serve_log(s, "a client idle for %.1f s: its %d stream(s) ended and freed", now - c->last_active, ended);
        remove_client(s, c);
    }
    /* streams restored from a checkpoint that no client resumed within the timeout */
    for (uint32_t k = 0; k < s->n_streams;) {
        serve_stream *st = s->streams[k];
        if (st->owner || now - st->orphan_since <= s->o.idle_timeout) {
            k++;
            continue;
        }
        st->abandoned = 1;
        int rc = st->fed ? sf_graph_end(s->graph, st->id) : SF_OK;
        if (rc == SF_OK) rc = dispatch(s, 0);
        if (rc != SF_OK) return rc == s->failed ? rc : serve_fail(s, rc);
        serve_log(s, "stream %llu, restored from a checkpoint, was not resumed within %.1f s: ended and freed",
                  (unsigned long long)st->id, s->o.idle_timeout);
        remove_stream(s, st);
        s->streams_expired++;
    }
    return SF_OK;
}

/* Takes a snapshot of every stream now (between steps, so that each stream's state covers
 * exactly its fed tokens) and hands it to the writer thread; the loop pauses only for this.
 * Called only while the writer is idle. The interval runs from the previous checkpoint's end
 * (its file landed, or its failure), as when the loop wrote them itself: one write at a time,
 * and the writer's share of the cores stays what it was. */
static int checkpoint_start(sf_serve *s)
{
    double t0 = sf_monotonic_seconds();
    int rc = serve_ckpt_save_state(s);
    /* a save lets waiting batches run: their rows leave (and are kept) before the streams'
     * part of the snapshot */
    if (rc == SF_OK) rc = dispatch(s, 0);
    else rc = serve_fail(s, rc);
    if (rc != SF_OK) return rc;
    rc = serve_ckpt_submit(s);
    double t1 = sf_monotonic_seconds();
    s->ckpt_pause_sum += t1 - t0;
    if (rc != SF_OK) {
        s->ckpt_last = t1;
        serve_log(s, "checkpoint %llu not written (%s); the streams stay durable up to checkpoint %llu",
                  (unsigned long long)s->ckpt_seq + 1, sf_last_error(), (unsigned long long)s->ckpt_seq);
        return SF_OK;
    }
    s->ckpt_dirty = 0;
    return SF_OK;
}

/* Takes a write the writer finished: once its file landed (and only then), tells each client
 * how far its stream is durable. A failed write is logged and the server goes on (its streams
 * stay durable up to the last one written; the next checkpoint tries again). */
static void checkpoint_collect(sf_serve *s)
{
    int rc = serve_ckpt_collect(s);
    if (rc == 0) return;
    s->ckpt_last = sf_monotonic_seconds();
    if (rc < 0) {
        serve_log(s, "checkpoint %llu not written (%s); the streams stay durable up to checkpoint %llu",
                  (unsigned long long)s->ckpt_seq + 1, sf_last_error(), (unsigned long long)s->ckpt_seq);
        s->ckpt_dirty = 1;
        return;
    }
    for (uint32_t i = 0; i < s->n_streams; i++) {
        serve_stream *st = s->streams[i];
        if (!st->resumable || !st->owner || st->owner->version < 2 || st->durable == st->durable_told) continue;
        serve_reply_simple(s, st->owner, SF_SERVE_DURABLE, st->id, st->durable, 0);
        st->durable_told = st->durable;
    }
}

/* ---- create, run, free -------------------------------------------------------------------- */

uint64_t sf_serve_default_shm_budget(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t quarter = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 4 : SF_SERVE_SHM_BUDGET_DEFAULT;
    return quarter < SF_SERVE_SHM_BUDGET_DEFAULT ? quarter : SF_SERVE_SHM_BUDGET_DEFAULT;
}

int sf_serve_default_io_threads(void)
{
    const long cores = sysconf(_SC_NPROCESSORS_ONLN), few = cores < 4 ? cores : 4, half = cores / 2 < 8 ? cores / 2 : 8;
    return few < 1 ? 1 : (int)(few > half ? few : half);
}

int sf_serve_create(sf_graph *graph, const sf_model_config *cfg, const sf_serve_options *opts, sf_serve **out)
{
    if (!graph || !cfg || !opts || !out || !opts->bind) return sf_error(SF_E_INVAL, "sf_serve_create: NULL argument");
    *out = NULL;
    if (!opts->plaintext && (!opts->secret_key || strlen(opts->secret_key) != 40))
        return sf_error(SF_E_INVAL, "serve: CURVE needs the server's secret key (40 Z85 characters)");
    if (!opts->plaintext && !zmq_has("curve")) return sf_error(SF_E_UNSUPPORTED, "libzmq was built without CURVE");
    sf_serve *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    s->graph = graph;
    /* a GPU graph's final rows come to the host beside the next segment's computation, and the
     * checksum thread waits for them (serve_crc.c) */
    sf_graph_set_device_outputs(graph, 1);
    s->o = *opts;
    s->o.http = NULL;
    s->o.bind = NULL;
    s->o.secret_key = NULL;
    s->o.client_keys = NULL;
    if (!s->o.idle_timeout) s->o.idle_timeout = 30;
    if (!s->o.window) s->o.window = 65536;
    if (!s->o.max_credit) s->o.max_credit = 256;
    if (!s->o.max_streams) s->o.max_streams = 65536;
    if (!s->o.max_clients) s->o.max_clients = 4096;
    if (!s->o.heartbeat_ms) s->o.heartbeat_ms = 1000;
    if (!s->o.send_budget) {
        const uint64_t rows =
            (uint64_t)cfg->segment * (uint64_t)cfg->dim * sizeof(float) * SF_SERVE_SEND_BUDGET_SEGMENTS;
        s->o.send_budget = rows > SF_SERVE_SEND_BUDGET_DEFAULT ? rows : SF_SERVE_SEND_BUDGET_DEFAULT;
    }
    if (!s->o.frame_bytes) s->o.frame_bytes = SF_SERVE_FRAME_BYTES_DEFAULT;
    s->shm_budget = s->o.no_shm ? 0 : s->o.shm_budget ? s->o.shm_budget : sf_serve_default_shm_budget();
    s->region_default = 2 * (uint64_t)cfg->segment * (uint64_t)cfg->dim * sizeof(float) + (1u << 20);
    if (s->o.io_threads <= 0) s->o.io_threads = sf_serve_default_io_threads();
    s->vocab = cfg->vocab;
    s->segment = cfg->segment > 0 ? (uint64_t)cfg->segment : 1;
    s->started = sf_monotonic_seconds();
    s->rate_t = s->started;
    s->ckpt_lock = -1;
    s->ckpt_last = s->started;
    s->o.checkpoint_dir = NULL;
    if (!(s->o.checkpoint_every > 0)) s->o.checkpoint_every = 1;
    int rc = SF_OK;
    s->streams = calloc(s->o.max_streams, sizeof *s->streams);
    s->clients = calloc(s->o.max_clients, sizeof *s->clients);
    if (!s->streams || !s->clients) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc == SF_OK && !(s->send = serve_send_create(s->o.send_budget))) rc = SF_E_NOMEM;
    if (rc == SF_OK && !(s->crc = serve_crc_create(s->o.io_threads)))
        rc = sf_error(SF_E_NOMEM, "serve: cannot start the checksum thread");
    if (rc == SF_OK && !opts->plaintext) {
        s->n_keys = opts->n_client_keys;
        s->keys = calloc((size_t)(s->n_keys ? s->n_keys : 1), sizeof *s->keys);
        if (!s->keys) rc = sf_error(SF_E_NOMEM, "out of memory");
        for (int i = 0; rc == SF_OK && i < s->n_keys; i++)
            if (!opts->client_keys[i] || strlen(opts->client_keys[i]) != 40 || !zmq_z85_decode(s->keys[i], opts->client_keys[i]))
                rc = sf_error(SF_E_INVAL, "serve: client key %d is not a 40-character Z85 key", i + 1);
    }
    /* set up before the socket is bound: the first client's stream does not pay for it */
    if (rc == SF_OK) rc = sf_graph_prepare(graph);
    /* before the socket is bound: a client that connects finds its streams restored */
    if (rc == SF_OK && opts->checkpoint_dir) rc = serve_ckpt_open(s, opts->checkpoint_dir);
    if (rc == SF_OK && !(s->ctx = zmq_ctx_new())) rc = sf_error(SF_E_IO, "cannot make a ZeroMQ context: %s", zmq_strerror(errno));
    /* before any socket: each connection is then served by the least busy of them */
    if (rc == SF_OK && zmq_ctx_set(s->ctx, ZMQ_IO_THREADS, s->o.io_threads) != 0)
        rc = sf_error(SF_E_INVAL, "serve: %d ZeroMQ I/O threads: %s", s->o.io_threads, zmq_strerror(errno));
    if (rc == SF_OK) {
        /* the ZAP handler must exist before the ROUTER accepts anyone: without one libzmq
         * admits every CURVE client */
        s->zap = zmq_socket(s->ctx, ZMQ_REP);
        s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
        if (!s->zap || !s->router || zmq_bind(s->zap, ZAP_ENDPOINT) != 0)
            rc = sf_error(SF_E_IO, "cannot start the ZAP handler: %s", zmq_strerror(errno));
    }
    if (rc == SF_OK) {
        set_int(s->router, ZMQ_LINGER, 0);
        set_int(s->router, ZMQ_ROUTER_MANDATORY, 1);
        /* no limit in messages: credit bounds what waits for each client, the send budget what
         * waits for all of them; a limit would drop (or refuse) a control reply instead */
        set_int(s->router, ZMQ_SNDHWM, 0);
        set_int(s->router, ZMQ_RCVHWM, 10000);
        set_int(s->router, ZMQ_HEARTBEAT_IVL, s->o.heartbeat_ms);
        set_int(s->router, ZMQ_HEARTBEAT_TIMEOUT, 3 * s->o.heartbeat_ms);
        set_int(s->router, ZMQ_HEARTBEAT_TTL, 3 * s->o.heartbeat_ms);
        /* twice a full PUSH: a PUSH somewhat over the window is answered with ERROR, only a
         * message beyond this drops the connection (libzmq never allocates it) */
        int64_t max_msg = SF_SERVE_HEADER_SIZE + 8 * (int64_t)s->o.window;
        zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
        zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "seqflow-serve", 13);
        if (!opts->plaintext) {
            set_int(s->router, ZMQ_CURVE_SERVER, 1);
            zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, opts->secret_key, 40);
        }
        if (zmq_bind(s->router, opts->bind) != 0) rc = sf_error(SF_E_IO, "serve: cannot listen on %s: %s", opts->bind, zmq_strerror(errno));
    }
    if (rc == SF_OK && opts->http) rc = serve_http_open(s, opts->http);
    if (rc != SF_OK) {
        sf_serve_free(s);
        return rc;
    }
    *out = s;
    return SF_OK;
}

void sf_serve_free(sf_serve *s)
{
    if (!s) return;
    if (s->pending.active) { /* a run that ended without sending it: its CRC job ends first */
        uint32_t crc;
        serve_crc_wait(s->crc, &crc);
        sf_packet_free(s->pending.packet);
    }
    serve_crc_free(s->crc);
    sf_buffer_release(&s->pending.head);
    for (uint32_t i = 0; i < s->n_streams; i++) serve_stream_free(s->streams[i]);
    serve_ckpt_close(s);
    for (uint32_t i = 0; i < s->n_clients; i++) {
        serve_flow_release(s->clients[i]->flow);
        serve_region_drop(s, s->clients[i]);
        free(s->clients[i]);
    }
    serve_http_close(s);
    if (s->router) {
        set_int(s->router, ZMQ_LINGER, 200); /* a last ERROR still leaves */
        zmq_close(s->router);
    }
    if (s->zap) zmq_close(s->zap);
    if (s->ctx) zmq_ctx_term(s->ctx);
    if (s->keys) memset(s->keys, 0, (size_t)s->n_keys * sizeof *s->keys);
    free(s->keys);
    free(s->streams);
    free(s->clients);
    sf_buffer_release(&s->out);
    serve_send_free(s->send); /* after zmq_ctx_term: every message gave its buffer back */
    free(s);
}

int sf_serve_endpoint(const sf_serve *s, int which, char *buf, size_t size)
{
    void *sock = !s ? NULL : which == 0 ? s->router : which == 1 ? s->http : NULL;
    if (!sock || !buf || !size) return sf_error(SF_E_INVAL, "sf_serve_endpoint: no such socket");
    size_t len = size;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return sf_error(SF_E_IO, "%s", zmq_strerror(errno));
    return SF_OK;
}

void sf_serve_stop(sf_serve *s)
{
    if (s) s->stop = 1;
}

int sf_serve_run(sf_serve *s)
{
    if (!s) return sf_error(SF_E_INVAL, "sf_serve_run: NULL server");
    double last_expire = 0;
    uint32_t cursor = 0;
    while (!s->stop && !s->failed) {
        /* work waits while the replies in flight are at the send budget (or its client's
         * share): armed first, the poll below wakes when ZeroMQ has written one more */
        serve_send_arm(s->send, 1);
        update_share(s);
        int busy = 0, waiting = 0;
        for (uint32_t i = 0; i < s->n_streams && !busy && !s->failed; i++) {
            const serve_stream *st = s->streams[i];
            if (!wants_step(s, st)) continue;
            if (has_room(s, st->owner)) busy = 1;
            else waiting = 1;
        }
        if (busy) serve_send_arm(s->send, 0);
        double t = sf_monotonic_seconds();
        if (waiting && !busy && !s->send_wait_since) s->send_wait_since = t;
        if (s->send_wait_since && (busy || !waiting)) s->send_wait_sum += t - s->send_wait_since, s->send_wait_since = 0;
        zmq_pollitem_t items[5] = {{s->router, 0, ZMQ_POLLIN, 0}, {s->zap, 0, ZMQ_POLLIN, 0},
                                   {NULL, serve_send_wake_fd(s->send), ZMQ_POLLIN, 0},
                                   {NULL, serve_ckpt_wake_fd(s), ZMQ_POLLIN, 0}, {s->http, 0, ZMQ_POLLIN, 0}};
        int n_items = s->writer ? 4 : 3;
        if (s->http) items[n_items++] = items[4];
        if (!busy) serve_reply_flush(s); /* nothing to overlap it with */
        int n = zmq_poll(items, n_items, busy ? 0 : 100);
        if (n < 0 && errno != EINTR) return sf_error(SF_E_IO, "serve: poll: %s", zmq_strerror(errno));
        if (n > 0 && (items[2].revents & ZMQ_POLLIN)) serve_send_arm(s->send, 0);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN)) on_zap(s);
        if (n > 0 && (items[0].revents & ZMQ_POLLIN)) on_router(s, 1024);
        if (n > 0 && s->http && (items[n_items - 1].revents & ZMQ_POLLIN)) serve_http_poll(s);
        if (n > 0 && s->writer && (items[3].revents & ZMQ_POLLIN)) checkpoint_collect(s);
        resend_kept(s);
        /* one step of every stream that can move, starting where the last round stopped, so
         * that no stream waits behind another's backlog; a round cut short by the send budget, or
         * after SERVE_ROUND_SLICE seconds of steps (what clients sent meanwhile, a RELEASE or
         * CREDIT, is then taken at once), goes on from the first stream it did not reach */
        uint32_t count = s->n_streams, k = 0;
        const double round_t0 = sf_monotonic_seconds();
        for (; k < count && !s->failed && s->n_streams && !serve_send_full(s->send, serve_reply_pending_bytes(s, NULL));
             k++) {
            uint32_t i = (cursor + k) % s->n_streams;
            int rc = step(s, s->streams[i]);
            if (rc < 0) break;
            if (rc > 0 && sf_monotonic_seconds() - round_t0 >= SERVE_ROUND_SLICE) {
                k++;
                break;
            }
        }
        if (s->n_streams) cursor = (cursor + (k < count ? k : 1)) % s->n_streams;
        double now = sf_monotonic_seconds();
        if (now - last_expire >= 0.1) {
            last_expire = now;
            if (!s->failed) expire(s, now);
            serve_update_rate(s, now);
        }
        if (s->writer && s->ckpt_dirty && !s->failed && now - s->ckpt_last >= s->o.checkpoint_every && !serve_ckpt_busy(s))
            checkpoint_start(s);
    }
    serve_reply_flush(s);
    /* stopped: the write in flight lands, then a last checkpoint, so that a restart resumes
     * every stream where it stands */
    if (s->writer) {
        serve_ckpt_wait(s);
        checkpoint_collect(s);
        if (s->ckpt_dirty && !s->failed && checkpoint_start(s) == SF_OK && serve_ckpt_busy(s)) {
            serve_ckpt_wait(s);
            checkpoint_collect(s);
        }
    }
    return s->failed ? s->failed : SF_OK;
}
