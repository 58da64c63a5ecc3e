/* norm: the model's final RMSNorm (SPEC 2, "after the last block"); a pass-through when the
 * model has no final_norm. Host packets take the CPU kernel. Packets whose rows are still on
 * the device (packet.h, dev: a GPU graph) are normalized there in place and then brought to
 * the host in one download (pinned staging), so what leaves this stage is a host packet. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/stage.h"
#include "stages/device_rows.h"
#include "stages/stages.h"

typedef struct norm {
    sf_backend *be;
    float *weight; /* [dim] on the device, NULL without a final norm */
} norm;

static int norm_init(sf_stage *st)
{
    const sf_model *m = sf_stage_model(st);
    if (!m) return sf_error(SF_E_INVAL, "norm needs a model");
    sf_backend *be = sf_stage_backend(st);
    const float *w = sf_model_final_norm(m);
    if (!w || !sf_device_rows_wanted(be)) return SF_OK;
    norm *nm = calloc(1, sizeof *nm);
    if (!nm) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, nm);
    nm->be = be;
    size_t bytes = (size_t)sf_model_get_config(m)->dim * sizeof(float);
    nm->weight = be->ops->alloc(be, bytes);
    if (!nm->weight) return sf_error(SF_E_NOMEM, "no device memory for the final norm");
    return be->ops->upload(be, nm->weight, w, bytes);
}

static void norm_free(sf_stage *st)
{
    norm *nm = sf_stage_priv(st);
    if (!nm) return;
    nm->be->ops->free(nm->be, nm->weight);
    free(nm);
}

static int norm_process(sf_stage *st, sf_packet *in)
{
    const sf_model *m = sf_stage_model(st);
    const float *w = sf_model_final_norm(m);
    const float eps = sf_model_get_config(m)->norm_eps;
    norm *nm = sf_stage_priv(st);
    int rc = SF_OK;
    if (in->dev) {
        /* device rows: only a GPU graph lends them, and its init made nm when there is a weight */
        if (w && in->n && nm)
            rc = nm->be->ops->rmsnorm(nm->be, (int)in->n, (int)in->width, in->dev, nm->weight, eps, in->dev);
        else if (w && in->n)
            rc = sf_error(SF_E_INVAL, "norm: device rows on a graph without a device final norm");
        if (rc == SF_OK) rc = sf_packet_to_host(in);
    } else if (in->kind == SF_PACKET_HIDDEN && w && in->n) {
        rc = sf_cpu_rmsnorm(NULL, (int)in->n, (int)in->width, in->x, w, eps, in->x);
    }
    if (rc != SF_OK) {
        sf_packet_free(in);
        return rc;
    }
    return sf_stage_emit(st, in);
}

const sf_stage_class sf_norm_stage = {
    .name = "norm",
    .help = "apply the model's final RMSNorm (pass-through without one)",
    .init = norm_init,
    .process = norm_process,
    .free = norm_free,
    .device_rows = 1,
};
