/* embed: x = embed.weight[token] for every token of a segment (SPEC 2). This is where token ids
 * meet the vocabulary, so an out-of-range id is refused here with its stream position. */
#include <string.h>

#include "seqflow/stage.h"
#include "stages/stages.h"

static int embed_init(sf_stage *st)
{
    if (!sf_stage_model(st)) return sf_error(SF_E_INVAL, "embed needs a model");
    return SF_OK;
}

static int embed_process(sf_stage *st, sf_packet *in)
{
    const sf_model *m = sf_stage_model(st);
    const sf_model_config *cfg = sf_model_get_config(m);
    if (in->kind != SF_PACKET_SEGMENT) {
        sf_packet_free(in);
        return sf_error(SF_E_INVAL, "embed takes segments (put 'segment' before it)");
    }
    const size_t dim = (size_t)cfg->dim;
    for (size_t i = 0; i < in->n; i++) {
        if (in->tokens[i] >= (uint32_t)cfg->vocab) {
            int rc = sf_error(SF_E_TOKEN, "token id %u at position %llu of stream %llu is outside the vocabulary (%d ids)",
                              in->tokens[i], (unsigned long long)(in->position + i),
                              (unsigned long long)in->stream, cfg->vocab);
            sf_packet_free(in);
            return rc;
        }
    }
    int rc = sf_packet_reserve(in, 0, in->n * dim);
    if (rc != SF_OK) {
        sf_packet_free(in);
        return rc;
    }
    const float *table = sf_model_embedding(m);
    for (size_t i = 0; i < in->n; i++)
        memcpy(in->x + i * dim, table + (size_t)in->tokens[i] * dim, dim * sizeof(float));
    in->kind = SF_PACKET_HIDDEN;
    in->width = dim;
    return sf_stage_emit(st, in);
}

const sf_stage_class sf_embed_stage = {
    .name = "embed",
    .help = "look token ids up in the embedding table",
    .init = embed_init,
    .process = embed_process,
};
