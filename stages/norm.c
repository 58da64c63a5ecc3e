/* norm: the model's final RMSNorm (SPEC 2, "after the last block"); a pass-through when the
 * model has no final_norm. Packets live in host memory whatever the graph's device, so this
 * runs the CPU kernel directly rather than a device op. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/stage.h"
#include "stages/stages.h"

static int norm_init(sf_stage *st)
{
    if (!sf_stage_model(st)) return sf_error(SF_E_INVAL, "norm needs a model");
    return SF_OK;
}

static int norm_process(sf_stage *st, sf_packet *in)
{
    const sf_model *m = sf_stage_model(st);
    const float *w = sf_model_final_norm(m);
    if (in->kind == SF_PACKET_HIDDEN && w && in->n) {
        int rc = sf_cpu_rmsnorm(NULL, (int)in->n, (int)in->width, in->x, w, sf_model_get_config(m)->norm_eps,
                                in->x);
        if (rc != SF_OK) {
            sf_packet_free(in);
            return rc;
        }
    }
    return sf_stage_emit(st, in);
}

const sf_stage_class sf_norm_stage = {
    .name = "norm",
    .help = "apply the model's final RMSNorm (pass-through without one)",
    .init = norm_init,
    .process = norm_process,
};
