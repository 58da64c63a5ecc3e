/* What `seqflow run` and `seqflow worker` share: the run options, the checks made before any
 * work, the model, the pipeline text the options make (source and sink added), the graph, and
 * running it with signals, progress and the summary line (tools/run_common.c). */
#ifndef SEQFLOW_TOOLS_RUN_COMMON_H
#define SEQFLOW_TOOLS_RUN_COMMON_H

#include <stdio.h>

#include "seqflow/seqflow.h"

#define DEFAULT_PIPELINE "segment ! embed ! block ! norm"

typedef struct run_args {
    const char *model_path, *input, *format, *out, *sink_format, *device, *pipeline;
    const char *out_dtype;       /* --out-dtype: f32 or bf16 (validated), NULL = f32 */
    int threads, queue_depth, progress, quiet; /* progress 2: asked for; quiet: below info level */
    int json; const char *stats_json; long long max_output; /* --json (info), --stats-json, --max-output (0: none) */
    const char *checkpoint_dir;  /* --checkpoint */
    long long checkpoint_every;  /* --checkpoint-every (segments), 0 = default */
    int resume;                  /* --resume */
    long long state_budget;      /* --state-budget (bytes, split over the block stages), 0 = none */
    const char *spill_dir;       /* --spill-dir */
    const char *state_quant;     /* --state-quant KIND (validated), NULL = lossless */
    long long state_group;       /* its :GROUP, 0 = the block stage's default */
    const char *state_codec;     /* --state-codec (validated), NULL = the default */
    const char *checkpoint_codec; /* --checkpoint-codec (validated), NULL = raw */
    sf_precision precision;      /* --precision, AUTO when not given */
    const char *backend_settings; /* --backend-settings KEY=V[,KEY=V], NULL = the defaults */
    int heads_of, heads_on_gpus; /* --gpus N / --cpu-ranks N: head-parallel blocks, 0 = off */
    char heads_devices[256];     /* a worker's topology devices as block devices= ("0,1"), "" = none */
    int device_index, device_index_set; /* -d cuda:N: N (set: given so); else 0, or a worker's own:
                                    its topology devices' first "cuda:N", else its local rank */
    uint64_t seed;
    sf_model_config cfg;         /* defaults, then the user's overrides */
    unsigned overrides;          /* which fields of cfg the user set */
} run_args;

enum { OV_DIM = 1, OV_HEADS = 2, OV_HEAD_DIM = 4, OV_LAYERS = 8, OV_MLP = 16, OV_SEGMENT = 32,
       OV_BRANCHES = 64, OV_CAUSAL = 128, OV_MEMORY = 256, OV_GLOBAL = 512, OV_SUMMARY = 1024,
       OV_EPS = 2048, OV_VOCAB = 4096, OV_FINAL_NORM = 8192 };

/* A run being set up: the options, then what run_prepare made (owned; run_ctx_free). */
typedef struct run_ctx {
    run_args a;
    sf_model *model;
    char *pipeline;              /* the full pipeline text: source, the user's stages, sink */
    sf_graph *graph;
    sf_graph_options opts;
    const char *body;            /* the user's pipeline (a.pipeline or DEFAULT_PIPELINE) */
    /* Optional: rewrites the message of a failed run (message holds the graph's, size bytes),
     * e.g. to name the rank that failed and the last checkpoint. */
    void (*failure_message)(struct run_ctx *c, char *message, size_t size);
    void *user;
    const char *label;           /* starts every message line; NULL = "seqflow" */
    int driver;                  /* run_prepare's: this process writes the output */
    int run_rc;                  /* run_execute's: what sf_graph_run returned */
    int push;                    /* set before run_prepare: a push-mode graph (seqflow serve):
                                    no source or sink added, a pipeline with either refused */
} run_ctx;

/* Parses argv (argv[0] is the command's name) into c->a; usage(stdout) for --help. Returns 0 to
 * go on, -1 after --help (exit 0), or the exit status 2 with the message printed. */
int run_parse(int argc, char **argv, run_ctx *c, void (*usage)(FILE *f));
/* After run_parse: the checks made before any work (driver: the output, the input, the
 * pipeline; `driver` 0 skips the file checks a worker cannot make), the model, the pipeline
 * text and the graph (parsed, checkpoints set on the driver). Returns 0 or the exit status, the
 * message printed. */
int run_prepare(run_ctx *c, int driver);
/* After run_prepare: c->graph made again from the same pipeline text and options (the one
 * there freed first: its links before whatever they belong to), checkpoints set on the driver
 * as c->a says (a worker rolling back sets c->a.resume first). 0 or the exit status, the
 * message printed. */
int run_make_graph(run_ctx *c);
/* Runs c->graph with the stop signals handled and the progress line and summary (unless
 * quiet) printed; returns the exit status. */
int run_execute(run_ctx *c);
void run_ctx_free(run_ctx *c);
/* The first stopping signal (SIGINT, SIGTERM, SIGHUP) run_execute's handlers took, 0 for none. */
int run_stop_signal(void);
/* handler for SIGINT, SIGTERM and SIGHUP: the signals that stop a run, a server or a launch */
void run_catch_stop_signals(void (*handler)(int));
/* Loads the model file or builds the built-in one, applying the user's overrides. */
int run_make_model(run_args *a, sf_model **out);
/* The exit status of an error code: 2 for what the user asked for (a pipeline, an option), 1
 * for the rest. */
int exit_status_of(int rc);
/* path with every "{rank}" replaced by rank into out (size bytes, truncated to fit): one command
 * line for every rank of a job (key files, per-rank outputs). */
void run_rank_path(const char *path, int rank, char *out, size_t size);
/* Parses a decimal integer in lo..hi, printing "seqflow: NAME expects ..." otherwise. */
int parse_int_arg(const char *name, const char *s, long long lo, long long hi, long long *out);

#endif
