/* Shared between the files of model/: the model's layout and its list of tensors, so that
 * creation, loading and saving agree on names, shapes and where each weight lives. */
#ifndef SEQFLOW_MODEL_INTERNAL_H
#define SEQFLOW_MODEL_INTERNAL_H

#include "seqflow/model.h"

#include <stddef.h>
#include <stdint.h>

typedef enum sf_tensor_kind {
    SF_TENSOR_EMBED,  /* [vocab, D] */
    SF_TENSOR_NORM,   /* [D] RMSNorm weight */
    SF_TENSOR_LINEAR, /* [out, in] */
    SF_TENSOR_GATE    /* [H] pre-sigmoid gate */
} sf_tensor_kind;

/* One tensor of the SPEC section 6 table. Names are at most "blocks.4095.attn.o.weight". */
typedef struct sf_tensor_slot {
    char name[48];
    int rank;
    int64_t shape[2];
    size_t count;
    size_t offset; /* in floats from the arena's start */
    float *data;   /* into the model's arena; NULL until the weights are allocated */
    sf_tensor_kind kind;
} sf_tensor_slot;

struct sf_model {
    sf_model_config cfg;
    float *arena; /* every weight, in slot order */
    size_t arena_floats;
    float *embed;
    float *final_norm;
    sf_block_weights *blocks;
    sf_tensor_slot *slots;
    size_t n_slots;
};

/* Validates cfg and creates a model with its slots laid out but no weights yet, so that a
 * loader can check a file's tensors before allocating what its header claims. */
int sf_model_internal_layout(const sf_model_config *cfg, sf_model **out);
/* Allocates the zeroed weights of a laid-out model and points the slots and blocks at them. */
int sf_model_internal_allocate_weights(sf_model *m);
/* Both of the above. */
int sf_model_internal_alloc(const sf_model_config *cfg, sf_model **out);

#endif
