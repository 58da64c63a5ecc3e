/* The model object: one float32 arena holding every weight, its tensor slots, the accessors,
 * random initialisation (the built-in model) and reconfiguration. */
#include "model/model_internal.h"
#include "seqflow/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static int add_size(size_t *acc, size_t a, size_t b)
{
    size_t product;
    if (b != 0 && a > SIZE_MAX / b) return 0;
    product = a * b;
    if (*acc > SIZE_MAX - product) return 0;
    *acc += product;
    return 1;
}

static void set_slot(sf_tensor_slot *slot, sf_tensor_kind kind, int64_t d0, int64_t d1,
                     const char *fmt, int layer)
{
    snprintf(slot->name, sizeof slot->name, fmt, layer);
    slot->kind = kind;
    slot->rank = d1 ? 2 : 1;
    slot->shape[0] = d0;
    slot->shape[1] = d1;
    slot->count = d1 ? (size_t)d0 * (size_t)d1 : (size_t)d0;
}

/* Lays the tensors out in the arena, in slot order; with arena NULL only the offsets. */
static void place_weights(sf_model *m, float *arena)
{
    const sf_model_config *cfg = &m->cfg;
    const int64_t D = cfg->dim, H = cfg->heads, HD = (int64_t)cfg->heads * cfg->head_dim;
    const int64_t F = cfg->mlp_hidden;
    sf_tensor_slot *s = m->slots;
    size_t offset = 0;
#define PLACE(ptr, kind, d0, d1, fmt, layer)                  \
    do {                                                      \
        set_slot(s, kind, d0, d1, fmt, layer);                \
        s->offset = offset;                                   \
        s->data = arena ? arena + offset : NULL;              \
        (ptr) = s->data;                                      \
        offset += s->count;                                   \
        s++;                                                  \
    } while (0)
    PLACE(m->embed, SF_TENSOR_EMBED, cfg->vocab, D, "embed.weight", 0);
    for (int l = 0; l < cfg->layers; l++) {
        sf_block_weights *bw = &m->blocks[l];
        PLACE(bw->attn_norm, SF_TENSOR_NORM, D, 0, "blocks.%d.attn_norm.weight", l);
        PLACE(bw->wq, SF_TENSOR_LINEAR, HD, D, "blocks.%d.attn.q.weight", l);
        PLACE(bw->wk, SF_TENSOR_LINEAR, HD, D, "blocks.%d.attn.k.weight", l);
        PLACE(bw->wv, SF_TENSOR_LINEAR, HD, D, "blocks.%d.attn.v.weight", l);
        PLACE(bw->wo, SF_TENSOR_LINEAR, D, HD, "blocks.%d.attn.o.weight", l);
        PLACE(bw->gate, SF_TENSOR_GATE, H, 0, "blocks.%d.attn.gate", l);
        if (F > 0) {
            PLACE(bw->mlp_norm, SF_TENSOR_NORM, D, 0, "blocks.%d.mlp_norm.weight", l);
            PLACE(bw->w1, SF_TENSOR_LINEAR, F, D, "blocks.%d.mlp.w1.weight", l);
            PLACE(bw->w3, SF_TENSOR_LINEAR, F, D, "blocks.%d.mlp.w3.weight", l);
            PLACE(bw->w2, SF_TENSOR_LINEAR, D, F, "blocks.%d.mlp.w2.weight", l);
        }
    }
    if (cfg->final_norm) PLACE(m->final_norm, SF_TENSOR_NORM, D, 0, "final_norm.weight", 0);
#undef PLACE
    m->n_slots = (size_t)(s - m->slots);
}

int sf_model_internal_layout(const sf_model_config *cfg, sf_model **out)
{
    *out = NULL;
    int rc = sf_model_config_validate(cfg);
    if (rc != SF_OK) return rc;

    const size_t D = (size_t)cfg->dim, H = (size_t)cfg->heads, F = (size_t)cfg->mlp_hidden;
    const size_t HD = H * (size_t)cfg->head_dim, L = (size_t)cfg->layers;
    const int has_mlp = cfg->mlp_hidden > 0;

    size_t per_layer = 0, total = 0;
    int ok = add_size(&per_layer, 1, D) && add_size(&per_layer, 4 * HD, D) &&
             add_size(&per_layer, 1, H);
    if (ok && has_mlp) ok = add_size(&per_layer, 1, D) && add_size(&per_layer, 3 * F, D);
    ok = ok && add_size(&total, (size_t)cfg->vocab, D) && add_size(&total, L, per_layer) &&
         add_size(&total, cfg->final_norm ? 1 : 0, D);
    if (!ok || total > SIZE_MAX / sizeof(float))
        return sf_error(SF_E_NOMEM, "model weights do not fit in memory (size overflow)");

    sf_model *m = calloc(1, sizeof *m);
    if (!m) return sf_error(SF_E_NOMEM, "out of memory allocating a model");
    m->cfg = *cfg;
    m->arena_floats = total;
    m->blocks = calloc(L, sizeof *m->blocks);
    m->slots = calloc(1 + L * (has_mlp ? 10 : 6) + (cfg->final_norm ? 1 : 0), sizeof *m->slots);
    if (!m->blocks || !m->slots) {
        sf_model_free(m);
        return sf_error(SF_E_NOMEM, "out of memory allocating a model");
    }
    place_weights(m, NULL);
    *out = m;
    return SF_OK;
}

int sf_model_internal_allocate_weights(sf_model *m)
{
    m->arena = calloc(m->arena_floats, sizeof(float));
    if (!m->arena)
        return sf_error(SF_E_NOMEM, "out of memory allocating %zu model weights", m->arena_floats);
    place_weights(m, m->arena);
    return SF_OK;
}

int sf_model_internal_alloc(const sf_model_config *cfg, sf_model **out)
{
    int rc = sf_model_internal_layout(cfg, out);
    if (rc == SF_OK && (rc = sf_model_internal_allocate_weights(*out)) != SF_OK) {
        sf_model_free(*out);
        *out = NULL;
    }
    return rc;
}

void sf_model_free(sf_model *model)
{
    if (!model) return;
    free(model->arena);
    free(model->blocks);
    free(model->slots);
    free(model);
}

const sf_model_config *sf_model_get_config(const sf_model *model)
{
    return model ? &model->cfg : NULL;
}

const float *sf_model_embedding(const sf_model *model) { return model ? model->embed : NULL; }

uint64_t sf_model_weights_hash(const sf_model *model)
{
    if (!model || !model->arena) return 0;
    return XXH3_64bits(model->arena, model->arena_floats * sizeof *model->arena);
}

const float *sf_model_final_norm(const sf_model *model)
{
    return model ? model->final_norm : NULL;
}

const sf_block_weights *sf_model_block(const sf_model *model, int layer)
{
    if (!model || layer < 0 || layer >= model->cfg.layers) return NULL;
    return &model->blocks[layer];
}

/* splitmix64: tiny, well mixed, and defined purely by integer arithmetic, so the built-in
 * model is the same bit for bit on every machine and compiler. */
typedef struct weight_rng {
    uint64_t state;
} weight_rng;

static uint64_t rng_next(weight_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), exact: 53 random bits scaled by a power of two. */
static double rng_symmetric(weight_rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1p-52 - 1.0;
}

/* Irwin-Hall (sum of 12 uniforms on [0,1) minus 6): mean 0, variance 1. Unlike Box-Muller it
 * needs no log/cos, whose last bit differs between math libraries. */
static double rng_normalish(weight_rng *r)
{
    double sum = 0.0;
    for (int k = 0; k < 12; k++) sum += (double)(rng_next(r) >> 11) * 0x1p-53;
    return sum - 6.0;
}

/* The product goes through a volatile so that no compiler fuses it with the addition into an
 * FMA, which would round differently and change the built-in model between builds. */
static float scaled_plus(double offset, double scale, double value)
{
    volatile double product = scale * value;
    return (float)(offset + product);
}

int sf_model_create_random(const sf_model_config *cfg, uint64_t seed, sf_model **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_model_create_random: out is NULL");
    *out = NULL;
    sf_model *m;
    int rc = sf_model_internal_alloc(cfg, &m);
    if (rc != SF_OK) return rc;
    weight_rng rng = {seed};
    for (size_t t = 0; t < m->n_slots; t++) {
        sf_tensor_slot *s = &m->slots[t];
        switch (s->kind) {
        case SF_TENSOR_EMBED:
            for (size_t i = 0; i < s->count; i++) s->data[i] = (float)rng_normalish(&rng);
            break;
        case SF_TENSOR_NORM:
            for (size_t i = 0; i < s->count; i++)
                s->data[i] = scaled_plus(1.0, 0.1, rng_symmetric(&rng));
            break;
        case SF_TENSOR_LINEAR: {
            double bound = 1.0 / sqrt((double)s->shape[1]);
            for (size_t i = 0; i < s->count; i++)
                s->data[i] = scaled_plus(0.0, bound, rng_symmetric(&rng));
            break;
        }
        case SF_TENSOR_GATE:
            for (size_t i = 0; i < s->count; i++) s->data[i] = (float)(2.0 * rng_symmetric(&rng));
            break;
        }
    }
    *out = m;
    return SF_OK;
}

int sf_model_reconfigure(const sf_model *src, const sf_model_config *cfg, sf_model **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_model_reconfigure: out is NULL");
    *out = NULL;
    if (!src || !cfg) return sf_error(SF_E_INVAL, "sf_model_reconfigure: NULL argument");
    const sf_model_config *have = &src->cfg;
    static const struct {
        const char *name;
        size_t offset;
    } shaping[] = {
        {"dim", offsetof(sf_model_config, dim)},
        {"heads", offsetof(sf_model_config, heads)},
        {"head_dim", offsetof(sf_model_config, head_dim)},
        {"vocab", offsetof(sf_model_config, vocab)},
        {"layers", offsetof(sf_model_config, layers)},
        {"mlp_hidden", offsetof(sf_model_config, mlp_hidden)},
        {"final_norm", offsetof(sf_model_config, final_norm)},
    };
    for (size_t k = 0; k < sizeof shaping / sizeof shaping[0]; k++) {
        int want, got;
        memcpy(&want, (const char *)cfg + shaping[k].offset, sizeof want);
        memcpy(&got, (const char *)have + shaping[k].offset, sizeof got);
        if (want != got)
            return sf_error(SF_E_CONFIG,
                            "cannot reconfigure: %s is %d in the model's weights but %d in the "
                            "new config",
                            shaping[k].name, got, want);
    }
    sf_model *m;
    int rc = sf_model_internal_alloc(cfg, &m);
    if (rc != SF_OK) return rc;
    /* Same weight-shaping sizes means the same arena layout. */
    memcpy(m->arena, src->arena, src->arena_floats * sizeof(float));
    *out = m;
    return SF_OK;
}
