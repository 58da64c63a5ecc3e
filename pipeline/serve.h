/* A server that holds one pipeline in push mode and many streams, for clients over ZeroMQ
 * (`seqflow serve`; the protocol: pipeline/serve_proto.h and docs/SERVE.md).
 *
 * One thread (the caller of sf_serve_run) owns everything: the ROUTER socket clients' DEALERs
 * connect to, the ZAP handler, the optional HTTP socket (/health, /metrics) and the graph, which
 * it drives with sf_graph_push / sf_graph_flush / sf_graph_end and whose packets it pulls and
 * sends as ROWS (without a copy: ZeroMQ's `io_threads` I/O threads write them and give their
 * buffers back, pipeline/serve_send.c). Streams are named by their client (a uint64 id, one
 * namespace per server: a stream open by one client is BUSY for the others) and are the graph's
 * stream ids.
 *
 * Bounds (what a client cannot make the server hold beyond):
 *   - per stream at most `window` tokens taken but not yet computed (a PUSH beyond: ERROR WINDOW,
 *     nothing taken), at most 16 pending FLUSHes;
 *   - per stream a credit of at most `max_credit` reply messages: the server computes a
 *     stream's next segment only while its credit is positive, one segment at a time, each
 *     ROWS sent costing one; so the replies queued for a client that reads nothing stay under
 *     max_credit (+1 where a pipeline's segment length is shorter than the model's) per stream;
 *   - server-wide, the ROWS handed to ZeroMQ and not yet written (they go without a copy: the
 *     buffer a reply is encoded into becomes the message) stay under `send_budget` bytes plus
 *     what one step releases (one segment's ROWS; a batching block's batch): at the budget the
 *     loop computes nothing more until ZeroMQ's I/O threads have written enough. Control
 *     replies (OPENED, PONG, CLOSED, ERROR, DURABLE; at most 544 bytes) are sent regardless, so
 *     they wait at most behind the budget's bytes of a client's queue;
 *   - at most `max_streams` streams and `max_clients` clients; one message at most
 *     32 + 8 * window bytes (ZMQ_MAXMSGSIZE: a larger one drops that connection; a PUSH of more
 *     than `window` tokens below that gets ERROR MALFORMED).
 * Idle policy: a client's activity is the later of its last message and the server's last
 * reply to it. A client inactive for `idle_timeout` seconds (it died, its connection dropped,
 * or it waits without sending PING) is gone: each of its streams is ended in the graph (its
 * state freed, the final rows discarded) and forgotten; no other stream is affected.
 *
 * Restarts: with a checkpoint directory the server saves the graph's state and every stream's
 * position there, atomically, at most every checkpoint_every seconds (the loop only takes a
 * snapshot in memory; a writer thread writes, fsyncs and renames the file), tells each client
 * how far its stream is durable (DURABLE, once that file has landed), keeps each committed ROWS
 * until its client acknowledges it, and on start loads what the directory holds: a client
 * RESUMEs its stream, re-sends the tokens from the durable position and gets the rows it lacks,
 * so that it sees every row once.
 *
 * Ownership: the server borrows the graph (which must be a push-mode graph without source or
 * sink, and must outlive it) and the model configuration; it copies the options' strings. */
#ifndef SEQFLOW_PIPELINE_SERVE_H
#define SEQFLOW_PIPELINE_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/seqflow.h"

typedef struct sf_serve sf_serve;

#define SF_SERVE_SEND_BUDGET_DEFAULT (256ull << 20) /* bytes, the least default */
#define SF_SERVE_SEND_BUDGET_SEGMENTS 32            /* the default budget holds this many float32 segments */
#define SF_SERVE_FRAME_BYTES_DEFAULT (1ull << 20)   /* bytes */
#define SF_SERVE_SHM_BUDGET_DEFAULT (8ull << 30)    /* bytes, the most default */

/* The default of sf_serve_options.io_threads: the larger of min(4, the online cores) and
 * min(8, half of them). */
int sf_serve_default_io_threads(void);
/* The default of sf_serve_options.shm_budget: the less of 8 GiB and a quarter of the
 * machine's memory. */
uint64_t sf_serve_default_shm_budget(void);

typedef struct sf_serve_options {
    const char *bind;              /* the clients' endpoint, "tcp://HOST:PORT" or "ipc://PATH" */
    const char *http;              /* the HTTP endpoint ("tcp://HOST:PORT"), NULL = none */
    int plaintext;                 /* 1: no CURVE (clients admitted without keys) */
    const char *secret_key;        /* the server's CURVE secret key, Z85 (not under plaintext) */
    const char *const *client_keys; /* the admitted clients' CURVE public keys (Z85) */
    int n_client_keys;
    double idle_timeout;           /* seconds; 0 = 30 */
    uint32_t window;               /* tokens per stream; 0 = 65536 */
    uint32_t max_credit;           /* reply messages per stream; 0 = 256 */
    uint32_t max_streams;          /* 0 = 65536 */
    uint32_t max_clients;          /* 0 = 4096 */
    int heartbeat_ms;              /* ZMTP heartbeats on the ROUTER; 0 = 1000 */
    /* Bytes of ROWS handed to ZeroMQ and not yet written by its I/O threads, server-wide: at
     * this many the server computes nothing more until they drain. 0 = 32 segments of float32
     * rows (N x D x 4 bytes each; 1 GiB for D = 1024, N = 8192), at least 256 MiB: the rows of
     * that many replies are written at once, over as many connections. */
    uint64_t send_budget;
    /* ZeroMQ I/O threads, also the threads that checksum a reply's rows; 0 =
     * sf_serve_default_io_threads() */
    int io_threads;
    /* A ROWS to a version-3 client goes in frames of at most this many bytes (one multipart
     * message): a receiver then allocates frames, not one block the size of a segment's rows,
     * which glibc maps afresh (a page fault every 4 KiB) past 32 MiB. 0 = 1 MiB. */
    uint64_t frame_bytes;
    /* Shared-memory regions (docs/SERVE.md, "Rows through shared memory"): a version-4 client
     * on the same host may MAP one and take its ROWS there, copied once instead of through
     * the socket. The bytes of all clients' regions together: 0 =
     * sf_serve_default_shm_budget(); no_shm = 1: none (every MAP is refused). A MAP of 0
     * bytes gets two segments of float32 rows and 1 MiB. */
    uint64_t shm_budget;
    int no_shm;
    /* Checkpoints (docs/SERVE.md, "Restarts"): NULL = none. Otherwise the directory (created
     * when missing, locked while the server runs) whose newest valid checkpoint sf_serve_create
     * loads, and where the server writes one every checkpoint_every seconds (0 = 1) while
     * streams move, and at sf_serve_run's return. Streams opened by version-2 (or 3) clients then
     * survive a restart: their clients RESUME them. */
    const char *checkpoint_dir;
    double checkpoint_every;
    /* Called on the checkpoint writer thread before each write, with its number (tests hold a
     * write with it, or move the directory away to make one fail); NULL = none. */
    void (*checkpoint_writing)(void *user, uint64_t seq);
    /* One line for each event worth telling (a client gone, a stream expired); NULL = none.
     * Called from sf_serve_run's thread. */
    void (*log)(void *user, const char *line);
    void *user;
} sf_serve_options;

/* Binds the sockets (so that clients can connect once this returns). The model configuration
 * gives the vocabulary (a PUSH with an id outside it is refused before the graph sees it) and
 * the segment length (the unit the server computes per step). Fails with SF_E_INVAL (options),
 * SF_E_IO (a socket, an endpoint), SF_E_UNSUPPORTED (libzmq without CURVE) or SF_E_NOMEM. */
int sf_serve_create(sf_graph *graph, const sf_model_config *cfg, const sf_serve_options *opts, sf_serve **out);
void sf_serve_free(sf_serve *s);

/* The endpoint a socket is bound to (a "tcp://H:*" bind resolved to its port): which 0 = the
 * clients', 1 = the HTTP one. SF_E_INVAL when there is none. */
int sf_serve_endpoint(const sf_serve *s, int which, char *buf, size_t size);

/* Serves until sf_serve_stop. Returns SF_OK, or the pipeline's error (every client with an
 * open stream was sent ERROR INTERNAL). */
int sf_serve_run(sf_serve *s);
/* Makes sf_serve_run return within about 100 ms. Async-signal-safe; any thread. */
void sf_serve_stop(sf_serve *s);

/* Counters, for tests and the summary line. */
typedef struct sf_serve_stats {
    uint64_t tokens_in, tokens_out, messages_in, errors_sent, streams_opened, streams_closed,
        streams_expired, refused; /* refused: connections ZAP turned away */
    uint64_t checkpoints, checkpoint_failures, streams_restored, streams_resumed;
    double checkpoint_seconds; /* from each snapshot to its file landing, in all */
    double checkpoint_pause_seconds; /* of which the loop paused for the snapshots */
    uint32_t streams, clients;
    uint64_t send_budget, send_in_flight, send_peak; /* bytes: the budget, in flight now, at most */
    double send_wait_seconds; /* the loop waited this long for the budget (or regions' room), in all */
    uint64_t shm_budget, shm_bytes, shm_messages; /* regions: bytes allowed, made now; ROWS_AT sent */
    /* the loop's seconds, in all, in the pipeline (push, flush and end of streams: where it
     * computes), in encoding ROWS (and keeping copies for resumes), in handing them to ZeroMQ */
    double graph_seconds, encode_seconds, handover_seconds;
} sf_serve_stats; /* tokens_out: committed rows (FLUSH's provisional rows not counted) */
void sf_serve_get_stats(const sf_serve *s, sf_serve_stats *out);

/* The Prometheus text of /metrics (appended to out). SF_OK or SF_E_NOMEM. */
int sf_serve_metrics(sf_serve *s, sf_buffer *out);

#endif
