/* Internal layout of graphs and stage instances, shared by the files of pipeline/. */
#ifndef SEQFLOW_PIPELINE_GRAPH_INTERNAL_H
#define SEQFLOW_PIPELINE_GRAPH_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "seqflow/graph.h"
#include "pipeline/link.h"

typedef struct sf_option_value {
    const sf_option *option;
    char *value; /* NULL when unset */
} sf_option_value;

struct sf_stage {
    const sf_stage_class *cls;
    sf_graph *graph;
    int index;
    sf_option_value *options;
    int n_options;
    void *priv;
    sf_link *out;      /* link to the next stage; NULL for the last stage */
    int initialized;
};

typedef struct sf_packet_fifo {
    sf_packet **items;
    size_t head, count, cap;
} sf_packet_fifo;

struct sf_graph {
    const sf_model *model;
    sf_backend *backend;
    sf_graph_options opts;
    sf_stage **stages;
    int n_stages, cap_stages;
    int started;                  /* stages initialized, links made */
    int push_mode;                /* driven by sf_graph_push */
    volatile sig_atomic_t interrupted;
    atomic_uint_fast64_t tokens_out;
    pthread_mutex_t error_lock;
    int error_code;
    char error_message[512];
    sf_packet_fifo outputs;       /* push mode: what left the last stage */
};

/* Records the first failure of the graph (thread-safe); returns code. */
int sf_graph_fail(sf_graph *g, int code, const char *stage_name, const char *message);

/* Initializes every stage (once) and, for threaded runs, the links between them. */
int sf_graph_start(sf_graph *g, int threaded);

/* Delivers a packet to stage index `to` (push mode) or to the output FIFO past the end. */
int sf_graph_deliver(sf_graph *g, int to, sf_packet *p);

/* Counts the committed rows of p in tokens_out (progress reports). */
void sf_graph_count_output(sf_graph *g, const sf_packet *p);

/* Options of a stage instance: "k=v k=v" validated against the class table. */
int sf_stage_options_parse(sf_stage *st, const char *text);
void sf_stage_options_free(sf_stage *st);

/* Built-in classes, in registry order. */
extern const sf_stage_class *const sf_builtin_stages[];

#endif
