/* The server's state, shared by pipeline/serve.c (clients, streams, the graph loop),
 * pipeline/serve_checkpoint.c (the checkpoints streams resume from), pipeline/serve_http.c
 * (/health, /metrics, the counters), pipeline/serve_reply.c (the replies, in order),
 * pipeline/serve_send.c (replies without a copy, the send budget) and pipeline/serve_crc.c (the
 * checksum thread). Internal: only those files include it. */
#ifndef SEQFLOW_PIPELINE_SERVE_INTERNAL_H
#define SEQFLOW_PIPELINE_SERVE_INTERNAL_H

#include <signal.h>
#include <stdint.h>

#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"
#include "pipeline/wire.h"

#define SERVE_MAX_ID 255       /* a ZeroMQ routing id's longest */
#define SERVE_MAX_FLUSHES 16   /* FLUSHes pending per stream */
#define SERVE_ARRIVALS 32      /* arrival times kept per stream, for the latency */
#define SERVE_HTTP_CONNS 32    /* HTTP connections served at once */
#define SERVE_HTTP_REQUEST 4096 /* bytes of one HTTP request */
#define SERVE_LATENCY_BUCKETS 14
#define SERVE_REGION_MIN (64ull << 10) /* bytes of the smallest region a MAP gets */
#define SERVE_ROUND_SLICE 0.005        /* seconds of steps before the loop takes clients' messages again */

typedef struct serve_client {
    uint8_t id[SERVE_MAX_ID];
    size_t id_len;
    double last_active;  /* the later of its last message and our last reply */
    int gone;            /* a send found it disconnected */
    int n_streams;
    int version;         /* the protocol version of its last message: replies use it */
    struct serve_flow *flow; /* its replies in flight (serve_send.c) */
    int sharing;         /* it has replies in flight or a step to take (the loop's share count) */
    struct serve_region *region; /* its shared-memory region (MAP), NULL: none */
} serve_client;

/* A committed ROWS message sent to a resumable stream's client and not yet acknowledged (CREDIT's
 * b): sent again on RESUME, and saved with the stream's checkpointed state. */
typedef struct serve_kept {
    uint64_t pos, end;   /* the rows' positions [pos, end) */
    uint8_t *msg;        /* the whole message, header included (malloc'd) */
    size_t len;
} serve_kept;

typedef struct serve_arrival {
    uint64_t end;        /* tokens before this position had arrived by t */
    double t;
} serve_arrival;

typedef struct serve_stream {
    uint64_t id;
    serve_client *owner;
    uint64_t next_pos;   /* tokens taken (the position its next PUSH must start at) */
    uint64_t fed;        /* tokens handed to the graph */
    uint32_t *tok;       /* tokens taken, not yet fed: tok[tok_head .. tok_head + tok_len) */
    size_t tok_head, tok_len, tok_cap;
    int64_t credit;      /* reply messages the client allows (may dip below 0 by one) */
    uint64_t flush_at[SERVE_MAX_FLUSHES]; /* positions of the pending FLUSHes, in order */
    double flush_t[SERVE_MAX_FLUSHES];
    int n_flush;
    int closing;         /* CLOSE taken: ends once every token was fed */
    int abandoned;       /* its client expired: rows are discarded */
    serve_arrival arr[SERVE_ARRIVALS];
    int arr_head, n_arr;
    /* resume (a checkpointing server, a stream opened by a version-2 client) */
    int resumable;
    uint64_t rows_sent;  /* committed rows sent: the next committed row's position */
    uint64_t acked;      /* committed rows its client has received (CREDIT's b, RESUME's b) */
    uint64_t durable;    /* tokens the newest checkpoint holds the state of */
    uint64_t durable_told; /* the last DURABLE sent */
    serve_kept *kept;    /* sent, not acknowledged, in order */
    int n_kept, cap_kept;
    int unsent;          /* the last `unsent` of kept are still to be sent to its client (after a
                            RESUME, as the send budget lets them go); it computes nothing until 0 */
    uint64_t snap_job;   /* the checkpoint snapshot that last held it (serve_ckpt_submit's job) */
    uint64_t snap_fed;   /* its fed position in that snapshot: durable once that file lands */
    double orphan_since; /* restored from a checkpoint and not yet resumed: since when (else 0) */
} serve_stream;

typedef struct serve_http_conn {
    uint8_t id[SERVE_MAX_ID];
    size_t id_len;
    char req[SERVE_HTTP_REQUEST];
    size_t len;
    int used;
} serve_http_conn;

struct sf_serve {
    sf_serve_options o;  /* strings not kept: NULL */
    sf_graph *graph;
    int vocab;
    uint64_t segment;
    void *ctx, *router, *zap, *http;
    uint8_t (*keys)[32];
    int n_keys;
    serve_client **clients;
    uint32_t n_clients;
    serve_stream **streams;
    uint32_t n_streams;
    sf_wire_options wire; /* raw f32, lossless */
    sf_buffer out;       /* the ROWS being encoded (its buffer then goes to ZeroMQ: serve_send.c) */
    struct serve_send *send; /* replies in flight under the send budget (serve_send.c) */
    struct serve_crc *crc;   /* the checksum thread (serve_crc.c) */
    /* The last reply without a copy, its rows' CRC still being computed by the checksum
     * thread: sent by serve.c's send_pending before anything else goes out, before a client
     * is forgotten and before the loop waits. */
    struct {
        int active;
        struct serve_client *client;
        sf_packet *packet; /* ZeroMQ's once sent */
        const void *rows;
        size_t rows_len;
        sf_buffer head; /* the ROWS's head, its frame header last (the CRC goes there) */
        double t0;      /* when the input that completed it arrived (0: not observed) */
        int in_region;  /* its rows are being copied into its client's region, at: */
        uint64_t region_pos;
    } pending;
    uint64_t shm_budget;     /* bytes of all regions together; 0: no regions */
    uint64_t region_default; /* bytes of a region a MAP of 0 gets */
    uint64_t shm_bytes;      /* of regions made now */
    uint64_t shm_messages;   /* ROWS_AT sent, in all */
    uint64_t send_share;  /* each client's share of the budget, this round */
    double send_wait_since; /* when the loop began waiting for the send budget (0: not waiting) */
    double send_wait_sum;   /* seconds waited for it, in all */
    /* the loop's seconds in the pipeline (push, flush, end: the computation), encoding ROWS
     * and handing them to ZeroMQ, in all: where a segment's time goes */
    double graph_sum, encode_sum, handover_sum;
    volatile sig_atomic_t stop;
    int failed;          /* the graph's error code once it failed */
    char failure[512];
    /* metrics */
    uint64_t tokens_in, tokens_out, provisional_out, messages_in, errors_sent, replies, refused;
    uint64_t streams_opened, streams_closed, streams_expired, http_requests;
    uint64_t latency_count, latency_bucket[SERVE_LATENCY_BUCKETS];
    double latency_sum, started;
    double rate, rate_t;
    uint64_t rate_tokens;
    serve_http_conn conns[SERVE_HTTP_CONNS];
    /* checkpoints (pipeline/serve_checkpoint.c); ckpt_dir NULL: none */
    char *ckpt_dir;
    int ckpt_lock;       /* the directory's lock file, -1 when not held */
    uint64_t ckpt_seq;   /* the newest checkpoint's number (loaded or written) */
    uint64_t weights_hash;
    double ckpt_last;    /* when the last checkpoint's write ended (or the server started) */
    int ckpt_dirty;      /* something a checkpoint holds changed since the last snapshot */
    sf_buffer ckpt_fp;   /* the graph's fingerprint, what every checkpoint names */
    struct serve_writer *writer; /* the thread that writes checkpoints; NULL: none */
    uint64_t ckpt_written, ckpt_failed, ckpt_bytes, streams_resumed, streams_restored;
    double ckpt_seconds, ckpt_seconds_sum; /* snapshot to file landed: the last, in all */
    double ckpt_pause_sum; /* of which the loop's pause (the snapshot), in all */
};

/* serve.c */
void serve_stream_free(serve_stream *st);
/* The pipeline failed with rc: every client with an open stream gets ERROR INTERNAL and the
 * server stops serving. Returns rc. */
int serve_fail(sf_serve *s, int rc);

/* serve_reply.c: the replies (the loop's thread). */
void serve_log(sf_serve *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One message to c in c's version (its byte 4 set); a client no longer connected is marked gone. */
void serve_reply(sf_serve *s, serve_client *c, uint8_t *msg, size_t len);
void serve_reply_simple(sf_serve *s, serve_client *c, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b);
void serve_reply_error(sf_serve *s, serve_client *c, uint64_t stream, sf_serve_error code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A ROWS to c without a copy: a kept copy (kept), or s->out whole. */
void serve_reply_rows(sf_serve *s, serve_client *c, const serve_kept *kept);
/* Makes s->out's head and packet's rows the pending reply of c, its CRC started on the checksum
 * thread (the one pending before it is sent first); the packet goes with it. SF_OK or
 * SF_E_NOMEM (the packet freed). */
int serve_reply_defer(sf_serve *s, serve_client *c, sf_packet *p, const void *rows, size_t rows_len, double t0);
/* Sends the pending reply, if any, once its CRC is there. */
void serve_reply_flush(sf_serve *s);
/* The pending reply's bytes (to c, or to anyone for NULL). */
uint64_t serve_reply_pending_bytes(const sf_serve *s, const serve_client *c);

/* serve_checkpoint.c */
/* Locks dir (created when missing), loads its newest valid checkpoint (each damaged newer one
 * logged and skipped; all damaged, or written for another model or pipeline: SF_E_STATE naming
 * why), restores the graph's states and the streams (unowned, awaiting RESUME; a stream that
 * cannot be resumed is ended in the graph). An empty dir: nothing to load. */
int serve_ckpt_open(sf_serve *s, const char *dir);
/* Checkpoints are written in two halves, so that the loop pauses only for what must be
 * consistent (docs/SERVE.md, "Restarts"):
 *  - on the loop's thread, between steps and only while serve_ckpt_busy is 0:
 *    serve_ckpt_save_state appends the payload's head and the graph's state (sf_graph_save;
 *    its waiting batches' rows are then to be dispatched by the caller, so that they are kept),
 *    then serve_ckpt_submit appends every stream's position, counters and kept rows, marks each
 *    stream with the snapshot (snap_job, snap_fed) and hands the bytes to the writer thread;
 *  - on the writer thread: the checksummed frame, the temp file, fsync, rename, fsync of the
 *    directory and the pruning to the newest two (state/checkpoint.h).
 * serve_ckpt_collect (loop thread) takes a finished write: 1 when it landed (ckpt_seq is then
 * its number and every stream it held is durable up to its snap_fed: the caller sends DURABLE),
 * a negative code when it failed (the message set; ckpt_failed counted), 0 when none finished.
 * serve_ckpt_wake_fd is readable once a write finished (for the loop's poll); serve_ckpt_wait
 * blocks until the writer is idle. One write is in flight at most. */
int serve_ckpt_busy(const sf_serve *s);
int serve_ckpt_save_state(sf_serve *s);
int serve_ckpt_submit(sf_serve *s);
int serve_ckpt_collect(sf_serve *s);
int serve_ckpt_wake_fd(const sf_serve *s);
void serve_ckpt_wait(sf_serve *s);
/* Joins the writer (after the write in flight, if any), frees what checkpoints held, unlocks. */
void serve_ckpt_close(sf_serve *s);
/* Keeps a copy of a committed ROWS message of a resumable stream; drops those its client has. */
int serve_keep(serve_stream *st, uint64_t pos, uint64_t n, const uint8_t *msg, size_t len);
void serve_drop_acked(serve_stream *st, uint64_t acked);

/* serve_send.c: ROWS handed to ZeroMQ without a copy, and the budget of bytes in flight.
 * Loop thread only, except where said. */
typedef struct serve_send serve_send;
/* A client's bytes in flight. Created with the client (one reference, the client's); each of
 * its messages in flight holds another, so it outlives a client forgotten while they drain. */
typedef struct serve_flow serve_flow;
serve_flow *serve_flow_create(void);  /* NULL: out of memory */
void serve_flow_release(serve_flow *f); /* the client's reference; NULL accepted */
uint64_t serve_flow_bytes(const serve_flow *f); /* 0 for NULL */
typedef struct serve_send_stats {
    uint64_t in_flight, budget, peak, messages, bytes; /* peak: the most in flight at once */
} serve_send_stats;
/* The pool, its counters and its wake-up pipe; NULL with the message set on failure. */
serve_send *serve_send_create(uint64_t budget);
/* Only once no message is in flight any more (after zmq_ctx_term); NULL accepted. */
void serve_send_free(serve_send *p);
/* An empty *out (no buffer) gets a pooled buffer, if one came back; len 0 either way. */
void serve_send_take(serve_send *p, sf_buffer *out);
/* Sends the routing id, then out's bytes, on the ROUTER socket (zmq_send's flags) without
 * copying them: as one frame, or (frame > 0) as one multipart message of frames of at most
 * frame bytes (protocol version 3). The buffer goes with the message and counts as in flight,
 * in all and in flow (NULL: in all only), until ZeroMQ has written or dropped every frame; *out
 * is left with a pooled buffer or none. 0, or -1 with errno set as zmq_send sets it (the client
 * is then to be taken for gone: a message may have been sent in part). */
int serve_send_owned(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len, sf_buffer *out,
                     size_t frame, int flags);
/* The same for a copy of data (the caller keeps data), its byte 4 (the protocol version) set. */
int serve_send_copy(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len,
                    const uint8_t *data, size_t len, int version, size_t frame, int flags);
/* The same for a message of head (copied) followed by a packet's rows (rows, rows_len: inside
 * the packet), the rows in frames of at most frame bytes after a frame of the head: the packet
 * goes with the message and is freed when ZeroMQ has written or dropped it (on failure too). */
int serve_send_packet(void *socket, serve_send *p, serve_flow *flow, const uint8_t *id, size_t id_len,
                      const uint8_t *head, size_t head_len, sf_packet *packet, const void *rows, size_t rows_len,
                      size_t frame, int flags);
/* serve_crc.c: the checksum thread. One job at a time: serve_crc_wait gives the CRC-32C of the
 * data of the last serve_crc_start (computed on `threads` threads), which must stay alive until
 * then, copied on the way to dst unless dst is NULL; a packet given with its rows still on the
 * device (the data: its reserved host rows) is brought to the host first. SF_OK, or the
 * download's error (no CRC then). */
typedef struct serve_crc serve_crc;
serve_crc *serve_crc_create(int threads); /* NULL: no memory or no thread */
void serve_crc_free(serve_crc *c);        /* no job running; NULL accepted */
void serve_crc_start(serve_crc *c, sf_packet *packet, const void *data, size_t len, void *dst);
int serve_crc_wait(serve_crc *c, uint32_t *crc);
/* 1 while the bytes in flight, and extra bytes about to be, are at or over the budget (any
 * thread may have lowered them). */
int serve_send_full(const serve_send *p, uint64_t extra);
/* The loop's wake-up: serve_send_arm(p, 1) before it decides to wait for bytes to drain makes
 * the next message written (or dropped) make serve_send_wake_fd readable, for its poll;
 * serve_send_arm(p, 0) disarms it and empties the pipe. */
int serve_send_wake_fd(const serve_send *p);
void serve_send_arm(serve_send *p, int waiting);
void serve_send_counters(const serve_send *p, serve_send_stats *out);

/* serve_http.c */
int serve_http_open(sf_serve *s, const char *endpoint);
void serve_http_close(sf_serve *s);
void serve_http_poll(sf_serve *s);
void serve_observe_latency(sf_serve *s, double seconds);
void serve_update_rate(sf_serve *s, double now);

/* serve_region.c: a client's shared-memory region, a ring of ROWS (loop thread). */
typedef struct serve_region serve_region;
/* Makes and maps a region of size bytes under a fresh name. SF_OK, SF_E_NOMEM (no room, in
 * memory or /dev/shm) or SF_E_IO, with the message set. */
int serve_region_create(uint64_t size, serve_region **out);
void serve_region_free(serve_region *r); /* unmaps it, unlinks its name if still there; NULL accepted */
/* The region c's ROWS go to: its region once attached, while c speaks version 4; else NULL. */
serve_region *serve_client_region(const serve_client *c);
void serve_region_attach(serve_region *r);        /* the client mapped it: its name goes */
/* Takes len bytes at the head for a message (1, *pos its region position), or 0 for a NULL
 * region, or when the client still reads where they would go. */
int serve_region_reserve(serve_region *r, uint64_t len, uint64_t *pos);
uint8_t *serve_region_at(const serve_region *r, uint64_t pos);
void serve_region_sent(serve_region *r, uint64_t end);   /* a message ending at end was announced */
int serve_region_has_room(const serve_region *r);        /* for the largest message yet; 1 for NULL */
int serve_region_release(serve_region *r, uint64_t pos); /* 0: pos is beyond what was announced */
uint64_t serve_region_in_use(const serve_region *r);     /* announced, not released; 0 for NULL */
/* Gives back the message reserved at pos, the last one, never announced. */
void serve_region_cancel(serve_region *r, uint64_t pos);
/* MAP, ATTACH and RELEASE from c. */
void serve_region_message(sf_serve *s, serve_client *c, const sf_serve_msg *m);
/* Frees c's region (the client is forgotten). */
void serve_region_drop(sf_serve *s, serve_client *c);

#endif
