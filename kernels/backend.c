/* Backend selection by name. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/error.h"
#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

static const char *const backend_names[] = {
    "cpu",
#ifdef SEQFLOW_HAVE_CUDA
    "cuda",
#endif
    NULL};

const char *const *sf_backend_names(void) { return backend_names; }

int sf_backend_create(const char *name, int device, sf_backend **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_backend_create: out is NULL");
    *out = NULL;
    if (!name) name = "cpu";
    if (strcmp(name, "cuda") == 0) {
#ifdef SEQFLOW_HAVE_CUDA
        if (sf_cuda_device_count() <= device)
            return sf_error(SF_E_BACKEND, "device cuda:%d: no such GPU (%d found)", device, sf_cuda_device_count());
        return sf_error(SF_E_BACKEND, "device cuda: the CUDA kernels are not in this version yet (CPU only)");
#else
        return sf_error(SF_E_BACKEND, "device cuda: this build has no CUDA backend (nvcc was not found)");
#endif
    }
    if (strcmp(name, "cpu") != 0) {
        return sf_error(SF_E_BACKEND, "unknown device '%s' (available: cpu%s)", name,
#ifdef SEQFLOW_HAVE_CUDA
                        ", cuda"
#else
                        ""
#endif
        );
    }
    sf_backend *be = calloc(1, sizeof *be);
    if (!be) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = sf_cpu_backend_init(be);
    if (rc != SF_OK) {
        free(be);
        return rc;
    }
    *out = be;
    return SF_OK;
}

void sf_backend_free(sf_backend *be)
{
    if (!be) return;
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    free(be);
}
