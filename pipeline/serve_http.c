/* `seqflow serve`'s HTTP side: GET /health and GET /metrics (Prometheus text format 0.0.4) over
 * a ZeroMQ STREAM socket, HTTP/1.0 style: one request a connection, answered, then closed; and
 * the counters of sf_serve_get_stats. */
#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "core/process_stats.h"
#include "pipeline/serve_internal.h"

/* Upper bounds of the latency histogram's buckets, seconds (+Inf is implied). */
static const double bucket_le[SERVE_LATENCY_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                        0.1,    0.25,  0.5,    1,     2.5,  5,    10};

void serve_observe_latency(sf_serve *s, double seconds)
{
    if (seconds < 0) seconds = 0;
    s->latency_count++;
    s->latency_sum += seconds;
    for (int i = 0; i < SERVE_LATENCY_BUCKETS; i++)
        if (seconds <= bucket_le[i]) s->latency_bucket[i]++;
}

/* tokens/s out over the last second or more */
void serve_update_rate(sf_serve *s, double now)
{
    if (now - s->rate_t < 1.0) return;
    s->rate = (double)(s->tokens_out - s->rate_tokens) / (now - s->rate_t);
    s->rate_tokens = s->tokens_out;
    s->rate_t = now;
}

int serve_http_open(sf_serve *s, const char *endpoint)
{
    s->http = zmq_socket(s->ctx, ZMQ_STREAM);
    if (!s->http) return sf_error(SF_E_IO, "serve: cannot make the HTTP socket: %s", zmq_strerror(errno));
    int zero = 0;
    zmq_setsockopt(s->http, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(s->http, endpoint) != 0)
        return sf_error(SF_E_IO, "serve: cannot listen for HTTP on %s: %s", endpoint, zmq_strerror(errno));
    return SF_OK;
}

void serve_http_close(sf_serve *s)
{
    if (s->http) zmq_close(s->http);
    s->http = NULL;
}

static int appendf(sf_buffer *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int appendf(sf_buffer *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return SF_E_INVAL;
    return sf_buffer_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

int sf_serve_metrics(sf_serve *s, sf_buffer *out)
{
    uint32_t waiting = 0, active = 0;
    uint64_t pending = 0;
    for (uint32_t i = 0; i < s->n_streams; i++) {
        const serve_stream *st = s->streams[i];
        pending += st->tok_len;
        if (st->tok_len || st->n_flush || st->closing) {
            if (st->credit > 0) active++;
            else waiting++;
        }
    }
    int rc = SF_OK;
#define M(...) if (rc == SF_OK) rc = appendf(out, __VA_ARGS__)
    M("# HELP seqflow_serve_tokens_in_total Tokens taken from clients.\n# TYPE seqflow_serve_tokens_in_total counter\n");
    M("seqflow_serve_tokens_in_total %" PRIu64 "\n", s->tokens_in);
    M("# HELP seqflow_serve_tokens_out_total Committed hidden-state rows sent to clients.\n# TYPE seqflow_serve_tokens_out_total counter\n");
    M("seqflow_serve_tokens_out_total %" PRIu64 "\n", s->tokens_out);
    M("# HELP seqflow_serve_provisional_rows_total Rows sent for a FLUSH (they come again, committed).\n# TYPE seqflow_serve_provisional_rows_total counter\n");
    M("seqflow_serve_provisional_rows_total %" PRIu64 "\n", s->provisional_out);
    M("# HELP seqflow_serve_tokens_per_second Rows sent per second over the last second.\n# TYPE seqflow_serve_tokens_per_second gauge\n");
    M("seqflow_serve_tokens_per_second %.1f\n", s->rate);
    M("# HELP seqflow_serve_replies_total ROWS messages sent.\n# TYPE seqflow_serve_replies_total counter\n");
    M("seqflow_serve_replies_total %" PRIu64 "\n", s->replies);
    M("# HELP seqflow_serve_messages_in_total Messages taken from clients.\n# TYPE seqflow_serve_messages_in_total counter\n");
    M("seqflow_serve_messages_in_total %" PRIu64 "\n", s->messages_in);
    M("# HELP seqflow_serve_errors_total ERROR messages sent.\n# TYPE seqflow_serve_errors_total counter\n");
    M("seqflow_serve_errors_total %" PRIu64 "\n", s->errors_sent);
    M("# HELP seqflow_serve_refused_total Connections whose CURVE key ZAP refused.\n# TYPE seqflow_serve_refused_total counter\n");
    M("seqflow_serve_refused_total %" PRIu64 "\n", s->refused);
    M("# HELP seqflow_serve_open_streams Streams open.\n# TYPE seqflow_serve_open_streams gauge\n");
    M("seqflow_serve_open_streams %u\n", s->n_streams);
    M("# HELP seqflow_serve_streams Open streams by state: computing (work and credit), waiting_credit (work, no "
      "credit), idle (nothing taken to compute).\n# TYPE seqflow_serve_streams gauge\n");
    M("seqflow_serve_streams{state=\"computing\"} %u\n", active);
    M("seqflow_serve_streams{state=\"waiting_credit\"} %u\n", waiting);
    M("seqflow_serve_streams{state=\"idle\"} %u\n", s->n_streams - active - waiting);
    M("# HELP seqflow_serve_clients Clients known (with a stream or recently heard).\n# TYPE seqflow_serve_clients gauge\n");
    M("seqflow_serve_clients %u\n", s->n_clients);
    M("# HELP seqflow_serve_pending_tokens Tokens taken and not yet computed, all streams.\n# TYPE seqflow_serve_pending_tokens gauge\n");
    M("seqflow_serve_pending_tokens %" PRIu64 "\n", pending);
    M("# HELP seqflow_serve_streams_total Streams by how they ended (opened counts every one).\n# TYPE seqflow_serve_streams_total counter\n");
    M("seqflow_serve_streams_total{event=\"opened\"} %" PRIu64 "\n", s->streams_opened);
    M("seqflow_serve_streams_total{event=\"closed\"} %" PRIu64 "\n", s->streams_closed);
    M("seqflow_serve_streams_total{event=\"expired\"} %" PRIu64 "\n", s->streams_expired);
    serve_send_stats ss;
    serve_send_counters(s->send, &ss);
    double waited = s->send_wait_sum + (s->send_wait_since ? sf_monotonic_seconds() - s->send_wait_since : 0);
    M("# HELP seqflow_serve_send_budget_bytes ROWS bytes that may wait in ZeroMQ, not yet written (--send-budget).\n"
      "# TYPE seqflow_serve_send_budget_bytes gauge\n");
    M("seqflow_serve_send_budget_bytes %" PRIu64 "\n", ss.budget);
    M("# HELP seqflow_serve_send_bytes_in_flight ROWS bytes handed to ZeroMQ and not yet written by its I/O threads.\n"
      "# TYPE seqflow_serve_send_bytes_in_flight gauge\n");
    M("seqflow_serve_send_bytes_in_flight %" PRIu64 "\n", ss.in_flight);
    M("# HELP seqflow_serve_send_bytes_in_flight_peak The most ROWS bytes in flight at once since the start.\n"
      "# TYPE seqflow_serve_send_bytes_in_flight_peak gauge\n");
    M("seqflow_serve_send_bytes_in_flight_peak %" PRIu64 "\n", ss.peak);
    M("# HELP seqflow_serve_send_bytes_total ROWS bytes handed to ZeroMQ.\n# TYPE seqflow_serve_send_bytes_total counter\n");
    M("seqflow_serve_send_bytes_total %" PRIu64 "\n", ss.bytes);
    M("# HELP seqflow_serve_send_budget_wait_seconds_total Seconds the loop had work but waited for the send budget "
      "(or a client's region).\n"
      "# TYPE seqflow_serve_send_budget_wait_seconds_total counter\n");
    M("seqflow_serve_send_budget_wait_seconds_total %.6f\n", waited);
    M("# HELP seqflow_serve_loop_seconds_total The loop's time: in the pipeline (graph), encoding ROWS (encode), "
      "handing them to ZeroMQ (handover).\n# TYPE seqflow_serve_loop_seconds_total counter\n");
    M("seqflow_serve_loop_seconds_total{part=\"graph\"} %.6f\n", s->graph_sum);
    M("seqflow_serve_loop_seconds_total{part=\"encode\"} %.6f\n", s->encode_sum);
    M("seqflow_serve_loop_seconds_total{part=\"handover\"} %.6f\n", s->handover_sum);
    M("# HELP seqflow_serve_io_threads ZeroMQ I/O threads (--io-threads).\n# TYPE seqflow_serve_io_threads gauge\n");
    M("seqflow_serve_io_threads %d\n", s->o.io_threads);
    M("# HELP seqflow_serve_frame_bytes Largest frame of a ROWS to a protocol-3 client (--frame-bytes).\n"
      "# TYPE seqflow_serve_frame_bytes gauge\n");
    M("seqflow_serve_frame_bytes %" PRIu64 "\n", s->o.frame_bytes);
    M("# HELP seqflow_serve_segment_latency_seconds From the PUSH (or FLUSH) that completed a segment to its ROWS "
      "leaving.\n# TYPE seqflow_serve_segment_latency_seconds histogram\n");
    for (int i = 0; i < SERVE_LATENCY_BUCKETS; i++)
        M("seqflow_serve_segment_latency_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", bucket_le[i], s->latency_bucket[i]);
    M("seqflow_serve_segment_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", s->latency_count);
    M("seqflow_serve_segment_latency_seconds_sum %.9f\n", s->latency_sum);
    M("seqflow_serve_segment_latency_seconds_count %" PRIu64 "\n", s->latency_count);
    if (s->ckpt_dir) {
        M("# HELP seqflow_serve_checkpoints_total Checkpoints written (--checkpoint), and failed.\n"
          "# TYPE seqflow_serve_checkpoints_total counter\n");
        M("seqflow_serve_checkpoints_total{result=\"written\"} %" PRIu64 "\n", s->ckpt_written);
        M("seqflow_serve_checkpoints_total{result=\"failed\"} %" PRIu64 "\n", s->ckpt_failed);
        M("# HELP seqflow_serve_checkpoint_seconds_total Seconds from each checkpoint's snapshot to its file landing "
          "(the loop serves on while the writer thread writes).\n# TYPE seqflow_serve_checkpoint_seconds_total counter\n");
        M("seqflow_serve_checkpoint_seconds_total %.6f\n", s->ckpt_seconds_sum);
        M("# HELP seqflow_serve_checkpoint_pause_seconds_total Seconds the loop paused for checkpoints' snapshots "
          "(nothing is computed meanwhile).\n# TYPE seqflow_serve_checkpoint_pause_seconds_total counter\n");
        M("seqflow_serve_checkpoint_pause_seconds_total %.6f\n", s->ckpt_pause_sum);
        M("# HELP seqflow_serve_checkpoint_bytes Size of the last checkpoint's payload.\n"
          "# TYPE seqflow_serve_checkpoint_bytes gauge\n");
        M("seqflow_serve_checkpoint_bytes %" PRIu64 "\n", s->ckpt_bytes);
        M("# HELP seqflow_serve_streams_resumed_total Streams restored from a checkpoint and resumed by a client.\n"
          "# TYPE seqflow_serve_streams_resumed_total counter\n");
        M("seqflow_serve_streams_resumed_total %" PRIu64 "\n", s->streams_resumed);
    }
    uint64_t regions = 0, in_use = 0;
    for (uint32_t i = 0; i < s->n_clients; i++)
        if (s->clients[i]->region) regions++, in_use += serve_region_in_use(s->clients[i]->region);
    M("# HELP seqflow_serve_shm_regions Clients' shared-memory regions (MAP) now.\n"
      "# TYPE seqflow_serve_shm_regions gauge\nseqflow_serve_shm_regions %" PRIu64 "\n",
      regions);
    M("# HELP seqflow_serve_shm_bytes Bytes of shared memory: the regions made, the rows in them not yet released, "
      "the budget (--shm-budget).\n# TYPE seqflow_serve_shm_bytes gauge\n");
    M("seqflow_serve_shm_bytes{kind=\"made\"} %" PRIu64 "\n", s->shm_bytes);
    M("seqflow_serve_shm_bytes{kind=\"in_use\"} %" PRIu64 "\n", in_use);
    M("seqflow_serve_shm_bytes{kind=\"budget\"} %" PRIu64 "\n", s->shm_budget);
    M("# HELP seqflow_serve_shm_rows_total ROWS placed in clients' regions (ROWS_AT sent).\n"
      "# TYPE seqflow_serve_shm_rows_total counter\nseqflow_serve_shm_rows_total %" PRIu64 "\n",
      s->shm_messages);
    M("# HELP seqflow_serve_uptime_seconds Seconds since the server started.\n# TYPE seqflow_serve_uptime_seconds gauge\n");
    M("seqflow_serve_uptime_seconds %.3f\n", sf_monotonic_seconds() - s->started);
#undef M
    return rc;
}

static void http_send(sf_serve *s, serve_http_conn *c, const char *status, const char *type, const void *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, type, len);
    sf_buffer b = {0};
    if (sf_buffer_append(&b, head, (size_t)n) == SF_OK && (!len || sf_buffer_append(&b, body, len) == SF_OK)) {
        zmq_send(s->http, c->id, c->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(s->http, b.data, b.len, ZMQ_DONTWAIT);
    }
    sf_buffer_release(&b);
    /* an empty message closes the connection */
    zmq_send(s->http, c->id, c->id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s->http, "", 0, ZMQ_DONTWAIT);
    c->used = 0;
}

static void http_answer(sf_serve *s, serve_http_conn *c)
{
    s->http_requests++;
    char method[8] = "", path[64] = "";
    if (sscanf(c->req, "%7s %63s", method, path) != 2) {
        http_send(s, c, "400 Bad Request", "text/plain", "bad request\n", 12);
        return;
    }
    char *q = strchr(path, '?');
    if (q) *q = '\0';
    if (strcmp(method, "GET") != 0) {
        http_send(s, c, "405 Method Not Allowed", "text/plain", "GET only\n", 9);
        return;
    }
    if (strcmp(path, "/health") == 0) {
        char body[640];
        int n = s->failed ? snprintf(body, sizeof body, "{\"status\":\"failed\",\"error\":\"%.400s\"}\n", s->failure)
                          : snprintf(body, sizeof body, "{\"status\":\"ok\",\"streams\":%u,\"clients\":%u}\n",
                                     s->n_streams, s->n_clients);
        for (char *p = body + 28; s->failed && *p && p < body + n - 3; p++) /* keep the JSON valid */
            if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '\'';
        http_send(s, c, s->failed ? "503 Service Unavailable" : "200 OK", "application/json", body, (size_t)n);
    } else if (strcmp(path, "/metrics") == 0) {
        sf_buffer b = {0};
        if (sf_serve_metrics(s, &b) == SF_OK)
            http_send(s, c, "200 OK", "text/plain; version=0.0.4", b.data, b.len);
        else
            http_send(s, c, "500 Internal Server Error", "text/plain", "out of memory\n", 14);
        sf_buffer_release(&b);
    } else {
        http_send(s, c, "404 Not Found", "text/plain", "/health or /metrics\n", 20);
    }
}

void serve_http_poll(sf_serve *s)
{
    for (int budget = 64; budget > 0; budget--) {
        zmq_msg_t id, data;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, s->http, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        zmq_msg_init(&data);
        if (!zmq_msg_more(&id) || zmq_msg_recv(&data, s->http, 0) < 0 || zmq_msg_size(&id) > SERVE_MAX_ID) {
            zmq_msg_close(&data);
            zmq_msg_close(&id);
            continue;
        }
        size_t id_len = zmq_msg_size(&id), len = zmq_msg_size(&data);
        serve_http_conn *c = NULL, *free_slot = NULL;
        for (int i = 0; i < SERVE_HTTP_CONNS && !c; i++) {
            serve_http_conn *k = &s->conns[i];
            if (k->used && k->id_len == id_len && memcmp(k->id, zmq_msg_data(&id), id_len) == 0) c = k;
            else if (!k->used && !free_slot) free_slot = k;
        }
        if (len == 0) { /* a connection opened or closed */
            if (c) c->used = 0;
        } else {
            if (!c && free_slot) {
                c = free_slot;
                c->used = 1;
                c->len = 0;
                c->id_len = id_len;
                memcpy(c->id, zmq_msg_data(&id), id_len);
            }
            if (!c) { /* too many at once: close this one */
                zmq_send(s->http, zmq_msg_data(&id), id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
                zmq_send(s->http, "", 0, ZMQ_DONTWAIT);
            } else if (c->len + len >= sizeof c->req) {
                http_send(s, c, "431 Request Header Fields Too Large", "text/plain", "request too large\n", 18);
            } else {
                memcpy(c->req + c->len, zmq_msg_data(&data), len);
                c->len += len;
                c->req[c->len] = '\0';
                if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) http_answer(s, c);
            }
        }
        zmq_msg_close(&data);
        zmq_msg_close(&id);
    }
}

/* ---- counters (sf_serve_get_stats) -------------------------------------------------------- */

void sf_serve_get_stats(const sf_serve *s, sf_serve_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s) return;
    out->tokens_in = s->tokens_in;
    out->tokens_out = s->tokens_out;
    out->messages_in = s->messages_in;
    out->errors_sent = s->errors_sent;
    out->streams_opened = s->streams_opened;
    out->streams_closed = s->streams_closed;
    out->streams_expired = s->streams_expired;
    out->refused = s->refused;
    out->checkpoints = s->ckpt_written;
    out->checkpoint_seconds = s->ckpt_seconds_sum;
    out->checkpoint_pause_seconds = s->ckpt_pause_sum;
    out->checkpoint_failures = s->ckpt_failed;
    out->streams_restored = s->streams_restored;
    out->streams_resumed = s->streams_resumed;
    out->streams = s->n_streams;
    out->clients = s->n_clients;
    serve_send_stats ss;
    serve_send_counters(s->send, &ss);
    out->send_budget = ss.budget;
    out->send_in_flight = ss.in_flight;
    out->send_peak = ss.peak;
    out->send_wait_seconds = s->send_wait_sum;
    out->shm_budget = s->shm_budget;
    out->shm_bytes = s->shm_bytes;
    out->shm_messages = s->shm_messages;
    out->graph_seconds = s->graph_sum;
    out->encode_seconds = s->encode_sum;
    out->handover_seconds = s->handover_sum;
}
