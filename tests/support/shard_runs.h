/* Runs of a pipeline in push mode with options added to its block stages, for the head-parallel
 * tests (test_heads, test_gpu_heads): the same tokens in the same chunks, so that two runs see
 * the same packets; optionally saved midway and restored into a fresh graph. */
#ifndef SEQFLOW_TEST_SHARD_RUNS_H
#define SEQFLOW_TEST_SHARD_RUNS_H

#include "seqflow/seqflow.h"

#define SHARD_MAX_STREAMS 3

/* Committed rows of each stream by position (NaN where nothing came), and the last provisional
 * packet of stream 0. */
typedef struct shard_outputs {
    float *x[SHARD_MAX_STREAMS];
    float *provisional;
    size_t prov_pos, prov_n;
} shard_outputs;

typedef struct shard_scenario {
    const char *pipeline; /* each "block" in it gets the run's block options */
    int streams;
    size_t tokens;   /* per stream */
    size_t flush_at; /* stream 0 is flushed after this many tokens (0: never) */
} shard_scenario;

/* The device the graphs run on. */
typedef struct shard_device {
    const char *name;       /* "cpu" or "cuda" */
    sf_precision precision;
    const char *settings;   /* backend settings, NULL for the defaults */
} shard_device;

/* Random token ids (seeded) for every stream of sc; freed with shard_tokens_free. */
uint32_t **shard_tokens(const sf_model *m, const shard_scenario *sc, uint64_t seed);
void shard_tokens_free(uint32_t **tokens);

/* A graph of sc's pipeline on dev with `extra` added to every block stage; NULL on failure
 * (reported as a failed check). */
sf_graph *shard_graph(const sf_model *m, const shard_device *dev, const shard_scenario *sc, const char *extra);

/* Runs sc with block options `extra` into *o (freed with shard_outputs_free, also on failure).
 * split > 0: saved after `split` tokens of each stream, restored into a new graph with block
 * options extra_after, which runs the rest. Returns SF_OK or the failing call's status. */
int shard_run(const sf_model *m, const shard_device *dev, const shard_scenario *sc, const char *extra,
              uint32_t *const *tokens, shard_outputs *o, size_t split, const char *extra_after);
void shard_outputs_free(shard_outputs *o);

/* The largest relative error (L2) of got against want over the streams and the flushed rows;
 * a flush that differs in its rows is a failed check. */
double shard_worst_error(const char *name, const char *label, const shard_outputs *got, const shard_outputs *want,
                         const shard_scenario *sc, size_t dim);

#endif
