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
    int given;   /* set by the pipeline text, not the table's default */
} sf_option_value;

struct sf_stage {
    const sf_stage_class *cls;
    sf_graph *graph;
    int index;
    sf_option_value *options;
    int n_options;
    void *priv;
    sf_link *out;      /* link to the next stage; NULL for the last stage (borrowed: g->links) */
    sf_link *in;       /* link from the previous stage; NULL for the first (borrowed) */
    int initialized;
    int remote;        /* runs in another process of a distributed run: not initialized here */
    int *ranks;        /* placement (`@1,2` in the pipeline text): the ranks that run this
                          stage, several = replicated (stream parallel); NULL = rank 0 */
    int n_ranks;
    /* block head_ranks= in a distributed run (stages/head_procs.h): this process's part of the
     * stage's head ranks (pipeline/distributed.c), NULL otherwise; freed with the stage */
    struct sf_head_procs *heads;
    sf_stage_stats stats; /* its thread's (sf_graph_stage_stats) */
};

#define SF_GRAPH_PROFILE_STAGES 32

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
    int start_failed;             /* a stage's init failed: the graph cannot start again */
    int push_mode;                /* driven by sf_graph_push */
    int device_outputs;           /* outputs may keep device rows (sf_graph_set_device_outputs) */
    volatile sig_atomic_t interrupted;
    atomic_uint_fast64_t tokens_out;
    /* the last committed segment that left the last stage (segment + 1, 0: none) and its
     * stream: named when a distributed run fails */
    atomic_uint_fast64_t last_segment, last_stream;
    pthread_mutex_t error_lock;
    int error_code;
    char error_message[512];
    sf_packet_fifo outputs;       /* push mode: what left the last stage */
    struct sf_graph_checkpointing *checkpoint; /* NULL when checkpoints are off */
    /* Threaded runs: every link the graph owns (queues, network halves, router and merger
     * links of a distributed run), aborted together on a failure and destroyed at free. */
    sf_link **links;
    int n_links, cap_links;
    struct sf_dist_part *dist;    /* this process's part of a distributed run, else NULL */
    /* SEQFLOW_PROFILE=1, push mode: seconds spent in each stage's process() alone (the stages
     * it delivers to subtracted) and in bringing device rows to the host; printed at free */
    int profile;
    double profile_nested;
    double profile_seconds[SF_GRAPH_PROFILE_STAGES], profile_to_host;
    long profile_calls[SF_GRAPH_PROFILE_STAGES];
};

/* Checkpoint state of a graph (pipeline/checkpointing.c). */
typedef struct sf_graph_checkpointing {
    sf_graph_checkpoint_options opts;
    char *dir;
    int resuming;                 /* a checkpoint was loaded: stages restore after init */
    uint8_t *loaded;              /* the loaded checkpoint's stage states (until restored) */
    size_t loaded_len;
    uint64_t resumed_seq, next_seq, written_seq;
    int lock_fd;                  /* the directory's lock (state/checkpoint.h), -1 when not held */
    int finished;                 /* the checkpoint resumed from records a finished run */
    int prepared;                 /* sf_graph_checkpoint_prepare ran */
    uint64_t weights_hash;        /* sf_model_weights_hash, taken once in prepare */
} sf_graph_checkpointing;

/* Called by sf_graph_run: before init, loads the newest checkpoint (resume) or clears the
 * directory; after init, restores the stages. */
int sf_graph_checkpoint_prepare(sf_graph *g);
int sf_graph_checkpoint_restore_stages(sf_graph *g);
/* The scheduler hands every marker to this: adds st's state, then forwards it or, past the
 * last stage, writes the checkpoint. Takes ownership of p. */
int sf_graph_checkpoint_pass(sf_stage *st, sf_packet *p);
void sf_graph_checkpoint_free(sf_graph *g);
/* What must match between the process that wrote a checkpoint and one that loads it (model
 * configuration, the weights' hash, backend and precision, each stage and its options), as text
 * lines appended to out; and the check of a stored one against this graph: SF_E_STATE naming
 * the first item that differs (in directory dir, checkpoint seq), followed by `hint`. */
int sf_graph_fingerprint(const sf_graph *g, uint64_t weights_hash, sf_buffer *out);
int sf_graph_fingerprint_check(const sf_graph *g, uint64_t weights_hash, const char *dir, uint64_t seq,
                               const uint8_t *theirs, size_t theirs_len, const char *hint);
/* The stage states of data[0..len) (sf_graph_save layout) into the started graph's stages. */
int sf_graph_restore_stages(sf_graph *g, const uint8_t *data, size_t len);
/* Appends one stage's entry (index, name, state) in the sf_graph_save layout. */
int sf_graph_save_stage(sf_stage *st, sf_buffer *out);

/* Distributed runs (pipeline/distributed.c). Frees a part (NULL accepted). */
struct sf_dist_part;
void sf_dist_part_free(struct sf_dist_part *part);
/* Restores the local stages from a checkpoint's state in the distributed layout (every rank's
 * states, or one rank's share of them: sf_dist_rank_state). */
int sf_dist_restore(sf_graph *g, const uint8_t *data, size_t len);
/* Restores the share handed to this process by sf_dist_set_state; SF_OK when none was. */
int sf_dist_restore_given(sf_graph *g);
/* Frees a stage's head ranks (NULL accepted) and their communicator, after the stage's free. */
struct sf_head_procs;
void sf_dist_heads_free(struct sf_head_procs *heads);

/* Records the first failure of the graph (thread-safe); returns code. */
int sf_graph_fail(sf_graph *g, int code, const char *stage_name, const char *message);

/* Initializes every stage (once) and, for threaded runs, the links between them. In a
 * distributed run (g->dist) only the local stages are initialized and the links are the ones
 * pipeline/distributed.c made. */
int sf_graph_start(sf_graph *g, int threaded);
/* Hands l to the graph (destroyed by sf_graph_free, aborted by a failure); l is destroyed
 * when the list cannot grow. */
int sf_graph_own_link(sf_graph *g, sf_link *l);
/* Aborts every link of the graph (a failure: no thread stays blocked). */
void sf_graph_abort_links(sf_graph *g);

/* Delivers a packet to stage index `to` (push mode) or to the output FIFO past the end. */
int sf_graph_deliver(sf_graph *g, int to, sf_packet *p);

/* Counts the committed rows of p in tokens_out (progress reports). */
void sf_graph_count_output(sf_graph *g, const sf_packet *p);

#define SF_GRAPH_MAX_RANK 1048575 /* the largest rank a placement may name */
/* The ranks stage st is placed on: returns their count and points *ranks (when not NULL) at
 * them (owned by the stage); 0 and NULL for a stage without a placement, which runs on rank 0. */
int sf_stage_placement(const sf_stage *st, const int **ranks);
/* The first stage of g placed on a rank other than 0 alone, or -1: sf_graph_start (so
 * sf_graph_run and push mode) refuses a graph with such a stage; a distributed run builds each
 * rank's part as a graph of its own, without placements. */
int sf_graph_first_remote_stage(const sf_graph *g);

/* Options of a stage instance: "k=v k=v" validated against the class table. */
int sf_stage_options_parse(sf_stage *st, const char *text);
void sf_stage_options_free(sf_stage *st);
/* SEQFLOW_PROFILE set to anything but "" or "0" (options.c, which reads the environment for the
 * whole pipeline layer): each stage's host time in push mode. Read by sf_graph_create. */
/* Push mode: the packets sf_graph_pull returns may keep their rows on the device (p->dev; the
 * caller brings them to the host with sf_packet_to_host, on any thread, or frees them), and the
 * last stage may leave them there (sf_stage_outputs_on_device). */
void sf_graph_set_device_outputs(sf_graph *g, int on);
int sf_graph_profile_wanted(void);

/* Built-in classes, in registry order. */
extern const sf_stage_class *const sf_builtin_stages[];

#endif
