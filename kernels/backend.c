/* Backend selection by name: "cpu" always; "cuda" is listed when the build has CUDA, but its
 * kernels are not written yet, so creating it fails with SF_E_BACKEND. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_backend.h"
#include "seqflow/error.h"

static const char *const backend_names[] = {
    "cpu",
#ifdef SEQFLOW_HAVE_CUDA
    "cuda",
#endif
    NULL};

const char *const *sf_backend_names(void) { return backend_names; }

int sf_backend_create(const char *name, int device, sf_backend **out)
{
    (void)device; /* no backend with several devices yet */
    if (!out) return sf_error(SF_E_INVAL, "sf_backend_create: out is NULL");
    *out = NULL;
    if (!name) name = "cpu";
    if (strcmp(name, "cuda") == 0)
        return sf_error(SF_E_BACKEND, "the CUDA backend is not implemented yet in this build");
    if (strcmp(name, "cpu") != 0) {
        char avail[64] = "";
        size_t used = 0;
        for (int i = 0; backend_names[i] && used < sizeof avail; i++) {
            int w = snprintf(avail + used, sizeof avail - used, "%s%s", i ? ", " : "", backend_names[i]);
            if (w < 0) break;
            used += (size_t)w;
        }
        return sf_error(SF_E_BACKEND, "unknown device '%s' (available: %s)", name, avail);
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
