/* embed: x = embed.weight[token] for every token of a segment (SPEC 2). This is where token ids
 * meet the vocabulary, so an out-of-range id is refused here with its stream position.
 * On a GPU graph the table lives on the device and the rows are gathered there into a pooled
 * device buffer (packet.h, dev): only the token ids (4 bytes a row) cross the bus, and the
 * rows stay on the device until the final norm. When the pool is dry (every buffer still in
 * flight downstream) the packet takes the host path, which is slower but the same.
 * Each pool buffer keeps its segment's token ids after its rows. No op issued before the lend
 * touches them (a buffer goes back to the pool once its rows were downloaded, which waits for
 * the work that read them, or once its packet was dropped), so the upload need not wait for the
 * device work queued ahead of it (upload_unordered): the next segment's ids cross the bus while
 * this one's layers run, instead of after them. */
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/stage.h"
#include "stages/device_rows.h"
#include "stages/stages.h"

typedef struct embed {
    sf_backend *be;
    sf_device_rows *pool; /* NULL: the host path */
    float *table;         /* [vocab, dim] on the device */
    size_t rows;          /* rows a pool buffer holds: the model's segment */
    size_t dim;
} embed;

/* The default covers `embed ! block ! norm` at the default queue depth: two links of 4 packets
 * plus one packet inside each of the three stages, and one spare. */
static const sf_option embed_options[] = {
    {.name = "device_rows", .type = SF_OPT_INT, .default_value = "12", .min = 1, .max = 1024, .unit = "buffers",
     .help = "GPU graphs: device buffers of rows in flight at once (a packet finding none free takes the host path)"},
    {0}};

static int embed_init(sf_stage *st)
{
    const sf_model *m = sf_stage_model(st);
    if (!m) return sf_error(SF_E_INVAL, "embed needs a model");
    sf_backend *be = sf_stage_backend(st);
    if (!sf_be_device_rows(be)) return SF_OK;
    embed *e = calloc(1, sizeof *e);
    if (!e) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, e);
    e->be = be;
    const sf_model_config *cfg = sf_model_get_config(m);
    const long long buffers = sf_stage_option_int(st, "device_rows");
    e->rows = (size_t)cfg->segment;
    e->dim = (size_t)cfg->dim;
    size_t table_bytes = (size_t)cfg->vocab * cfg->dim * sizeof(float);
    e->table = be->ops->alloc(be, table_bytes);
    if (!e->table) return sf_error(SF_E_NOMEM, "no device memory for the embedding table");
    int rc = be->ops->upload(be, e->table, sf_model_embedding(m), table_bytes);
    /* rows, then the token ids (uint32, as many as rows) */
    if (rc == SF_OK) rc = sf_device_rows_create(be, (int)buffers, e->rows * e->dim + e->rows, &e->pool);
    return rc;
}

static void embed_free(sf_stage *st)
{
    embed *e = sf_stage_priv(st);
    if (!e) return;
    sf_device_rows_free(e->pool);
    e->be->ops->free(e->be, e->table);
    free(e);
}

/* The rows of `in` gathered on the device: 1 when done, 0 when no buffer was free. */
static int embed_on_device(embed *e, sf_packet *in, int dim, int *rc)
{
    /* a `segment length=` longer than the model's does not fit a pool buffer: host path (the
     * block stage then refuses it with a message, as on the CPU) */
    if (!e || !e->pool || in->n == 0 || in->n > e->rows || !sf_device_rows_lend(e->pool, in)) return 0;
    uint32_t *tokens = (uint32_t *)(in->dev + e->rows * e->dim);
    const size_t bytes = in->n * sizeof(uint32_t);
    *rc = sf_be_upload_unordered(e->be, tokens, in->tokens, bytes);
    if (*rc == SF_OK) *rc = e->be->ops->embed(e->be, (int)in->n, dim, tokens, e->table, in->dev);
    return 1;
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
    int rc = SF_OK;
    if (!embed_on_device(sf_stage_priv(st), in, (int)dim, &rc)) {
        rc = sf_packet_reserve(in, 0, in->n * dim);
        if (rc == SF_OK) {
            const float *table = sf_model_embedding(m);
            for (size_t i = 0; i < in->n; i++)
                memcpy(in->x + i * dim, table + (size_t)in->tokens[i] * dim, dim * sizeof(float));
        }
    }
    if (rc != SF_OK) {
        sf_packet_free(in);
        return rc;
    }
    in->kind = SF_PACKET_HIDDEN;
    in->width = dim;
    return sf_stage_emit(st, in);
}

const sf_stage_class sf_embed_stage = {
    .name = "embed",
    .help = "look token ids up in the embedding table",
    .options = embed_options,
    .init = embed_init,
    .process = embed_process,
    .free = embed_free,
};
