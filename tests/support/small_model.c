#include "support/small_model.h"

#include <stdio.h>

void check_small_model_config(sf_model_config *cfg, int layers, int segment, int global_tokens)
{
    sf_model_config_default(cfg);
    cfg->dim = 32, cfg->heads = 2, cfg->head_dim = 16, cfg->layers = layers, cfg->segment = segment;
    cfg->mlp_hidden = 64, cfg->global_tokens = global_tokens, cfg->summary_tokens = 2;
}

int check_variant_model(const check_model_variant *v, uint64_t seed, sf_model **out)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    cfg.dim = v->dim, cfg.heads = v->heads, cfg.head_dim = v->head_dim, cfg.layers = v->layers;
    cfg.vocab = 50, cfg.segment = v->segment, cfg.causal = v->causal, cfg.memory = v->memory;
    cfg.mlp_hidden = v->mlp, cfg.global_tokens = v->global, cfg.summary_tokens = v->summary;
    cfg.final_norm = v->final_norm;
    *out = NULL;
    int rc = sf_branches_parse(v->branches, &cfg);
    return rc == SF_OK ? sf_model_create_random(&cfg, seed, out) : rc;
}

sf_graph *check_graph(const sf_model *m, const char *pipeline)
{
    sf_graph *g = NULL;
    if (sf_graph_create(m, &(sf_graph_options){.threads = 1}, &g) != SF_OK) return NULL;
    if (sf_graph_parse(g, pipeline) != SF_OK) {
        fprintf(stderr, "%s: %s\n", pipeline, sf_last_error());
        sf_graph_free(g);
        return NULL;
    }
    return g;
}
