/* norm: the model's final RMSNorm (SPEC 2, "after the last block"); a pass-through when the
 * model has no final_norm. Host packets take the CPU kernel. Packets whose rows are still on
 * the device (packet.h, dev: a GPU graph) are normalized there and then brought to the host in
 * one download (pinned staging), so what leaves this stage is a host packet.
 * dtype=bf16 sends the hidden states out as bf16 (packet.h, dtype SF_DTYPE_BF16): on a GPU the norm
 * writes them in bf16 on the device, so the download carries half the bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/stage.h"
#include "stages/device_rows.h"
#include "stages/stages.h"

typedef struct norm {
    sf_backend *be;   /* NULL: host packets only */
    float *weight;    /* [dim] on the device, NULL without a final norm or device rows */
    int bf16;         /* dtype=bf16 */
    void *rows_bf16;  /* device rows converted for the download (dtype=bf16 on a device) */
    size_t rows_bf16_bytes;
    int host_round;   /* the backend has no bf16 norm (sf_be_rmsnorm_typed): round on the host */
} norm;

static const sf_option norm_options[] = {
    {.name = "dtype", .type = SF_OPT_STRING, .default_value = "f32", .choices = "f32|bf16",
     .help = "element type of the hidden states it sends out: f32, or bf16 (half the bytes, rounded to nearest even; "
             "on a GPU made on the device, so the download halves too)"},
    {0}};

/* Device memory for n rows of bf16: sized at init for a model segment; grown only for a longer
 * segment (a segment stage's length= above the model's), so never per segment. */
static int reserve_rows_bf16(norm *nm, size_t bytes)
{
    if (bytes <= nm->rows_bf16_bytes) return SF_OK;
    nm->be->ops->free(nm->be, nm->rows_bf16);
    nm->rows_bf16_bytes = 0;
    nm->rows_bf16 = nm->be->ops->alloc(nm->be, bytes);
    if (!nm->rows_bf16) return sf_error(SF_E_NOMEM, "no device memory for %zu bytes of bf16 output rows", bytes);
    nm->rows_bf16_bytes = bytes;
    return SF_OK;
}

static int norm_init(sf_stage *st)
{
    const sf_model *m = sf_stage_model(st);
    if (!m) return sf_error(SF_E_INVAL, "norm needs a model");
    const char *dtype = sf_stage_option(st, "dtype");
    norm *nm = calloc(1, sizeof *nm);
    if (!nm) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, nm);
    nm->bf16 = strcmp(dtype, "bf16") == 0;
    sf_backend *be = sf_stage_backend(st);
    const float *w = sf_model_final_norm(m);
    if (!sf_be_device_rows(be)) return SF_OK;
    nm->be = be;
    const sf_model_config *cfg = sf_model_get_config(m);
    if (w) {
        size_t bytes = (size_t)cfg->dim * sizeof(float);
        nm->weight = be->ops->alloc(be, bytes);
        if (!nm->weight) return sf_error(SF_E_NOMEM, "no device memory for the final norm");
        int rc = be->ops->upload(be, nm->weight, w, bytes);
        if (rc != SF_OK) return rc;
    }
    if (nm->bf16 && nm->weight) return reserve_rows_bf16(nm, (size_t)cfg->segment * cfg->dim * sizeof(uint16_t));
    return SF_OK;
}

static void norm_free(sf_stage *st)
{
    norm *nm = sf_stage_priv(st);
    if (!nm) return;
    if (nm->be) {
        nm->be->ops->free(nm->be, nm->weight);
        nm->be->ops->free(nm->be, nm->rows_bf16);
    }
    free(nm);
}

/* Brings the rows (device rows, or bf16 ones in rows_bf16 when non-NULL) to the host packet. The
 * rows of a GPU run leave the graph here, mostly: with checks ON they are scanned where they are,
 * by a scan issued ahead of the download (so that the download's own wait covers it), and a hit is
 * named by stream and position from the host copy. */
static int to_host_checked(norm *nm, sf_packet *in, const void *rows_bf16)
{
    int found = 0;
    sf_rows_check chk = {0};
    const size_t count = in->n * in->width;
    const int scan = !nm->be ? SF_OK
                     : rows_bf16 ? sf_be_check_rows_begin(nm->be, rows_bf16, SF_DTYPE_BF16, count, &chk)
                                 : sf_be_check_rows_begin(nm->be, in->dev, SF_DTYPE_F32, count, &chk);
    int rc = rows_bf16 ? sf_packet_to_host_bf16(in, rows_bf16) : nm->bf16 ? sf_packet_to_bf16(in) : sf_packet_to_host(in);
    const int ended = scan == SF_OK && nm->be ? sf_be_check_rows_end(nm->be, &chk, &found) : SF_OK;
    if (rc == SF_OK) rc = scan != SF_OK ? scan : ended;
    if (rc == SF_OK && found) rc = sf_packet_check_finite(in, "in the rows of the final norm");
    return rc;
}

/* Device rows, normalized on the device, to a host packet of nm's dtype; with keep, float32
 * rows are left coming over (sf_packet_to_host_start) for the graph's caller
 * (sf_stage_outputs_on_device), which waits for them. */
static int device_rows_out(norm *nm, sf_packet *in, const float *w, float eps, int keep)
{
    sf_backend *be = nm->be;
    if (keep && nm->bf16) keep = 0; /* bf16 rows are made in a buffer of the stage's: brought over now */
    if (!w || !in->n) return keep ? sf_packet_to_host_start(in) : to_host_checked(nm, in, NULL);
    if (!be || !nm->weight) {
        sf_packet_to_host(in); /* returns the rows to their pool */
        return sf_error(SF_E_INVAL, "device rows on a graph without a device final norm");
    }
    if (nm->bf16 && !nm->host_round) {
        int rc = reserve_rows_bf16(nm, in->n * in->width * sizeof(uint16_t));
        if (rc == SF_OK)
            rc = sf_be_rmsnorm_typed(be, (int)in->n, (int)in->width, in->dev, nm->weight, eps, SF_DTYPE_BF16,
                                     nm->rows_bf16);
        if (rc == SF_OK) return to_host_checked(nm, in, nm->rows_bf16);
        /* a backend without a bf16 norm says so before it touches anything: from now on the
         * float32 norm below, rounded on the host */
        nm->host_round = rc == SF_E_UNSUPPORTED;
        if (!nm->host_round) {
            sf_packet_to_host(in);
            return rc;
        }
    }
    int rc = be->ops->rmsnorm(be, (int)in->n, (int)in->width, in->dev, nm->weight, eps, in->dev);
    if (rc != SF_OK) {
        sf_packet_to_host(in);
        return rc;
    }
    /* kept: their copy to the host begins now, beside the next segment's work; the graph scans
     * them as they leave, the caller waits for them (sf_packet_to_host) */
    return keep ? sf_packet_to_host_start(in) : to_host_checked(nm, in, NULL);
}

static int norm_process(sf_stage *st, sf_packet *in)
{
    const sf_model *m = sf_stage_model(st);
    const float *w = sf_model_final_norm(m);
    const float eps = sf_model_get_config(m)->norm_eps;
    norm *nm = sf_stage_priv(st);
    int rc = SF_OK;
    if (in->dtype != SF_DTYPE_F32) {
        rc = sf_error(SF_E_INVAL, "its input rows are bf16 already (a norm with dtype=bf16 ahead of it); "
                                  "only a sink takes bf16 rows");
    } else if (in->dev) {
        rc = device_rows_out(nm, in, w, eps, sf_stage_outputs_on_device(st));
    } else if (in->kind == SF_PACKET_HIDDEN) {
        /* the stage's backend carries the run's thread count (-t): with none, OpenMP would take
         * every core the process may use, whatever the run asked for */
        if (w && in->n) rc = sf_cpu_rmsnorm(sf_stage_backend(st), (int)in->n, (int)in->width, in->x, w, eps, in->x);
        if (rc == SF_OK && nm->bf16) rc = sf_packet_to_bf16(in);
    }
    if (rc != SF_OK) {
        sf_packet_free(in);
        return rc;
    }
    return sf_stage_emit(st, in);
}

const sf_stage_class sf_norm_stage = {
    .name = "norm",
    .help = "apply the model's final RMSNorm (pass-through without one); dtype=bf16 sends bf16 rows out",
    .options = norm_options,
    .init = norm_init,
    .process = norm_process,
    .free = norm_free,
    .device_rows = 1,
};
