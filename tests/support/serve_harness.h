/* Servers of the built-in model on a thread, and clients of them over ZeroMQ, for the tests
 * of `seqflow serve` (tests/test_serve_*.c): reference rows from a graph of the same model, a
 * stream pushed a PUSH a segment, its ROWS (and ROWS_AT) checked in order against them. */
#ifndef SEQFLOW_TEST_SERVE_HARNESS_H
#define SEQFLOW_TEST_SERVE_HARNESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

#define PIPELINE "segment ! embed ! norm"
#define MAX_SEGS 64

extern void *serve_test_ctx; /* the clients' ZeroMQ context: the test makes it */

typedef struct server {
    sf_model *model;
    sf_graph *graph;
    sf_serve *serve;
    pthread_t thread;
    int rc, port, seg;
    char endpoint[256];
} server;

typedef struct tstream {
    uint64_t id;
    int segs, got, closed, bad;
    int region_rows; /* of its ROWS, those that came as ROWS_AT */
    uint32_t *tokens;
    uint64_t ref[MAX_SEGS]; /* hash of each segment's rows in one-process push mode */
} tstream;

/* A client's shared-memory region (protocol version 4), mapped read-only. */
typedef struct client_region {
    char name[SF_SERVE_MAX_NAME + 1];
    const uint8_t *base;
    uint64_t size;
    uint64_t seen; /* the end of the last ROWS_AT taken */
    int hold;      /* 1: client_take_region RELEASEs nothing */
} client_region;

/* The built-in model's embedding and norm at D = dim, N = seg; a server with that budget (and
 * checkpoints in ckpt, unless NULL), or with the options so (bind, http, plaintext and
 * io_threads set here), listening on ipc at the test's path sock. 0 when it could not start. */
int server_start(server *v, int dim, int seg, uint64_t budget, double idle_s, const char *sock, const char *ckpt);
int server_start_with(server *v, int dim, int seg, sf_serve_options so, const char *sock);
void server_stop(server *v);
/* A metric's value from GET /metrics (served by the server's loop, between its steps); -1 when
 * it cannot be read. name may carry labels: seqflow_serve_shm_bytes{kind="made"}. */
double server_metric(const server *v, const char *name);

void client_send(void *d, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len);
/* A DEALER connected to endpoint; stuck: its I/O thread stops reading once one message waits. */
void *client_dealer(const char *endpoint, int stuck);
/* MAP of bytes, the region opened read-only (not yet ATTACHed): 1, or 0 with the server's
 * ERROR text (if any) in error. */
int client_map(void *d, uint64_t bytes, client_region *r, char *error, size_t error_size);
void client_unmap(client_region *r);

/* Random tokens and the hash of each segment's rows through a graph of the server's model. */
void tstream_make(const server *v, tstream *t, uint64_t id, int segs, check_rng *rng);
/* Segments [from, to) as one PUSH each, then CLOSE unless keep_open. */
void tstream_push_range(void *d, const server *v, const tstream *t, int from, int to, int keep_open);
/* OPEN with credit, every segment as one PUSH, CLOSE unless keep_open. */
void tstream_push(void *d, const server *v, const tstream *t, int credit, int keep_open);
/* Takes the messages waiting on d for its streams: each ROWS (or ROWS_AT, its packet read in
 * r, then RELEASEd unless r->hold) checked against the reference (in order, exact) and answered
 * with CREDIT 1 (acknowledging no row: a resumable stream's server keeps them all). Returns the
 * longest message seen. */
size_t client_take(void *d, tstream *ts, int n, const server *v);
size_t client_take_region(void *d, client_region *r, tstream *ts, int n, const server *v);
void clients_wait(void **socks, int n, long ms);

#endif
