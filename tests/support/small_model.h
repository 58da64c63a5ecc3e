/* The small models and single-threaded graphs the block-state and streaming tests run through. */
#ifndef SEQFLOW_TEST_SMALL_MODEL_H
#define SEQFLOW_TEST_SMALL_MODEL_H

#include "seqflow/seqflow.h"

/* Defaults, then D=32, H=2, d=16, MLP 64, 2 summary tokens, with the given layers, segment and
 * global tokens; branches are left to the caller (sf_branches_parse). */
void check_small_model_config(sf_model_config *cfg, int layers, int segment, int global_tokens);

/* A model shape of the GPU tests (test_gpu_pipeline, test_gpu_checkpoint). */
typedef struct check_model_variant {
    const char *name, *branches;
    int dim, heads, head_dim, layers, causal, mlp, global, summary, final_norm, segment;
    sf_memory_kind memory;
} check_model_variant;

/* A random model of v's shape (vocabulary 50) from seed into *out: SF_OK, or the error of the
 * branch parse or the model's creation. The caller frees it with sf_model_free. */
int check_variant_model(const check_model_variant *v, uint64_t seed, sf_model **out);

/* A one-thread graph over m holding the parsed pipeline; NULL (the parse error printed) on
 * failure. The caller frees it with sf_graph_free; m must outlive it. */
sf_graph *check_graph(const sf_model *m, const char *pipeline);

#endif
