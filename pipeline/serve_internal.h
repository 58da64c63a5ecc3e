/* The server's state, shared by pipeline/serve.c (clients, streams, the graph loop) and
 * pipeline/serve_http.c (/health, /metrics). Internal: only those two files include it. */
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

typedef struct serve_client {
    uint8_t id[SERVE_MAX_ID];
    size_t id_len;
    double last_active;  /* the later of its last message and our last reply */
    int gone;            /* a send found it disconnected */
    int n_streams;
} serve_client;

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
    sf_buffer out;       /* the message being sent */
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
};

/* serve_http.c */
int serve_http_open(sf_serve *s, const char *endpoint);
void serve_http_close(sf_serve *s);
void serve_http_poll(sf_serve *s);
void serve_observe_latency(sf_serve *s, double seconds);
void serve_update_rate(sf_serve *s, double now);

#endif
