/* Models: configuration and weights of the SPEC model (SPEC sections 2-6).
 * A model is immutable once created and may be shared by any number of graphs and threads.
 * All weights are held as float32 in host memory, in PyTorch Linear layout ([out, in]). */
#ifndef SEQFLOW_MODEL_H
#define SEQFLOW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

#define SF_MAX_BRANCHES 16

typedef enum sf_memory_kind {
    SF_MEMORY_NONE = 0,
    SF_MEMORY_LINEAR = 1,
    SF_MEMORY_DELTA = 2
} sf_memory_kind;

typedef struct sf_branch {
    int window;   /* w_b: divides the segment length */
    int dilation; /* r_b: divides the window */
} sf_branch;

typedef struct sf_model_config {
    int dim;        /* D */
    int heads;      /* H */
    int head_dim;   /* d */
    int vocab;
    int layers;     /* L */
    int segment;    /* N */
    int n_branches;
    sf_branch branches[SF_MAX_BRANCHES];
    int causal;     /* 1 causal, 0 bidirectional within the window */
    sf_memory_kind memory;
    int global_tokens;  /* G, 0 = off */
    int summary_tokens; /* S, divides nothing in particular; chunk j = [j*N/S, (j+1)*N/S) */
    float norm_eps;
    int mlp_hidden;     /* F, 0 = no MLP */
    int final_norm;     /* 1 when final_norm.weight is present */
} sf_model_config;

/* Weights of one block; pointers into the model, valid for the model's lifetime.
 * mlp_* are NULL when the model has no MLP. */
typedef struct sf_block_weights {
    const float *attn_norm;      /* [D] */
    const float *wq, *wk, *wv;   /* [H*d, D] */
    const float *wo;             /* [D, H*d] */
    const float *gate;           /* [H] (pre-sigmoid) */
    const float *mlp_norm;       /* [D] */
    const float *w1, *w3;        /* [F, D] */
    const float *w2;             /* [D, F] */
} sf_block_weights;

typedef struct sf_model sf_model;

/* The defaults of the built-in model (byte vocabulary). */
void sf_model_config_default(sf_model_config *cfg);

/* Checks every SPEC constraint (positive sizes, branch windows dividing the segment, dilations
 * dividing windows, summary tokens <= segment, ...). Returns SF_OK or SF_E_CONFIG with
 * sf_last_error() naming the problem. */
int sf_model_config_validate(const sf_model_config *cfg);

/* Parses "2048:1,4096:2" into cfg->branches / cfg->n_branches. SF_E_CONFIG on bad syntax. */
int sf_branches_parse(const char *text, sf_model_config *cfg);
/* Writes the "w:r,w:r" form into buf (always NUL-terminated). */
void sf_branches_format(const sf_model_config *cfg, char *buf, size_t size);

/* Number of (head, position) pairs of a full segment that no branch covers. The binary warns
 * once when this is non-zero; such configs are legal. */
long sf_model_config_uncovered(const sf_model_config *cfg);

/* Loads a safetensors model (SPEC section 6). On success *out owns a new model that the caller
 * frees with sf_model_free. On failure *out is NULL and sf_last_error() names the tensor or key.
 * Only the header's bound is trusted after validation; the file is never over-read. */
int sf_model_load(const char *path, sf_model **out);

/* Creates a model with weights drawn from a fixed-seed generator (the built-in default model
 * when cfg is the default config and seed is SF_DEFAULT_SEED). cfg is validated and copied. */
#define SF_DEFAULT_SEED 0x5EC0F1017ull
int sf_model_create_random(const sf_model_config *cfg, uint64_t seed, sf_model **out);

/* The built-in sample input of `seqflow run` (a few paragraphs of English, one token per
 * byte): static storage, never freed; sf_builtin_text_length bytes, NUL-terminated. */
const char *sf_builtin_text(void);
size_t sf_builtin_text_length(void);

/* Writes a model as a float32 safetensors file with seqflow metadata. */
int sf_model_save(const sf_model *model, const char *path);

/* Returns a new model sharing nothing with src whose non-weight settings (segment, branches,
 * causal, memory, global/summary tokens, norm_eps) are taken from cfg; the weight-shaping
 * sizes of cfg must equal src's. *out is owned by the caller. */
int sf_model_reconfigure(const sf_model *src, const sf_model_config *cfg, sf_model **out);

/* Frees a model; NULL is accepted. */
void sf_model_free(sf_model *model);

/* Accessors; the returned pointers live as long as the model. */
const sf_model_config *sf_model_get_config(const sf_model *model);
const float *sf_model_embedding(const sf_model *model);  /* [vocab, D] */
/* XXH3 (64-bit) of every weight, in the model's tensor order: two models with equal hashes and
 * equal configurations compute the same thing (checkpoints use it to refuse a resume with
 * another model file or seed). Reads all weights, at memory speed; 0 for NULL. */
uint64_t sf_model_weights_hash(const sf_model *model);
const float *sf_model_final_norm(const sf_model *model); /* [D] or NULL */
const sf_block_weights *sf_model_block(const sf_model *model, int layer);

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
