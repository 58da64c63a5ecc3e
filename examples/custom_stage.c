/* A custom stage written against the public headers only: "rownorm" replaces each hidden
 * state by its L2-normalized form (e.g. before a cosine-similarity search). It is registered
 * under a name, used in a textual pipeline, and driven in push mode from C. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <seqflow/seqflow.h>

static const sf_option rownorm_options[] = {
    {.name = "scale", .type = SF_OPT_FLOAT, .default_value = "1.0", .min = 0, .max = INFINITY,
     .help = "length of every output row"},
    {0}};

/* Takes ownership of p and passes it on. Hidden-state rows are float32 (p->x) unless a
 * `norm dtype=bf16` sits upstream, which sends bf16 bit patterns (p->x_bf16, p->x NULL,
 * p->dtype SF_DTYPE_BF16): a stage that computes on rows belongs before such a norm. */
static int rownorm_process(sf_stage *st, sf_packet *p)
{
    if (p->kind == SF_PACKET_HIDDEN) {
        if (p->dtype != SF_DTYPE_F32) {
            sf_packet_free(p); /* the stage owns p, also when it fails */
            return sf_error(SF_E_INVAL, "rownorm computes on float32 rows; put it before `norm dtype=bf16`");
        }
        double scale = sf_stage_option_float(st, "scale");
        for (size_t i = 0; i < p->n; i++) {
            float *row = p->x + i * p->width;
            double sq = 0;
            for (size_t j = 0; j < p->width; j++) sq += (double)row[j] * row[j];
            float f = sq > 0 ? (float)(scale / sqrt(sq)) : 0.0f;
            for (size_t j = 0; j < p->width; j++) row[j] *= f;
        }
    }
    return sf_stage_emit(st, p); /* ownership passes downstream */
}

static const sf_stage_class rownorm_stage = {
    .name = "rownorm",
    .help = "L2-normalize every hidden state",
    .options = rownorm_options,
    .process = rownorm_process,
};

int main(void)
{
    sf_model *model = NULL;
    sf_graph *graph = NULL;
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    int rc = sf_model_create_random(&cfg, SF_DEFAULT_SEED, &model);
    if (rc == SF_OK) rc = sf_register_stage(&rownorm_stage);
    if (rc == SF_OK) rc = sf_graph_create(model, NULL, &graph);
    if (rc == SF_OK) rc = sf_graph_parse(graph, "segment ! embed ! block ! norm ! rownorm scale=2");
    const char *text = "custom stages see the same packets as built-in ones";
    uint32_t tokens[64];
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) tokens[i] = (unsigned char)text[i];
    if (rc == SF_OK) rc = sf_graph_push(graph, 0, tokens, n);
    if (rc == SF_OK) rc = sf_graph_end(graph, 0); /* the partial segment completes */
    size_t rows = 0;
    int ok = rc == SF_OK;
    for (sf_packet *p; (p = sf_graph_pull(graph)); sf_packet_free(p)) {
        for (size_t i = 0; i < p->n; i++) {
            double sq = 0;
            for (size_t j = 0; j < p->width; j++) sq += (double)p->x[i * p->width + j] * p->x[i * p->width + j];
            if (fabs(sqrt(sq) - 2.0) > 1e-4) ok = 0;
        }
        rows += p->n;
    }
    if (rc != SF_OK) fprintf(stderr, "custom_stage: %s\n", sf_last_error());
    printf("custom_stage: %zu rows of length 2 out of %zu tokens: %s\n", rows, n, ok && rows == n ? "ok" : "FAILED");
    sf_graph_free(graph);
    sf_model_free(model);
    return ok && rows == n ? 0 : 1;
}
