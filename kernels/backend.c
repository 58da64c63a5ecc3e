/* Backend selection by name: "cpu" always; "cuda" when the build has CUDA (creating it fails
 * with SF_E_BACKEND when no GPU is usable). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_backend.h"
#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
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
    return sf_backend_create_ex(name, device, SF_PRECISION_AUTO, out);
}

int sf_backend_create_ex(const char *name, int device, sf_precision precision, sf_backend **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_backend_create: out is NULL");
    *out = NULL;
    if (!name) name = "cpu";
    if (precision != SF_PRECISION_AUTO && precision != SF_PRECISION_F32 && precision != SF_PRECISION_BF16)
        return sf_error(SF_E_INVAL, "sf_backend_create: unknown precision %d", (int)precision);
    int is_cuda = strcmp(name, "cuda") == 0;
#ifndef SEQFLOW_HAVE_CUDA
    if (is_cuda)
        return sf_error(SF_E_BACKEND, "device 'cuda': this build has no CUDA backend (nvcc was not found at build time)");
#endif
    if (!is_cuda && strcmp(name, "cpu") != 0) {
        char avail[64] = "";
        size_t used = 0;
        for (int i = 0; backend_names[i] && used < sizeof avail; i++) {
            int w = snprintf(avail + used, sizeof avail - used, "%s%s", i ? ", " : "", backend_names[i]);
            if (w < 0) break;
            used += (size_t)w;
        }
        return sf_error(SF_E_BACKEND, "unknown device '%s' (available: %s)", name, avail);
    }
    if (!is_cuda && precision == SF_PRECISION_BF16)
        return sf_error(SF_E_UNSUPPORTED, "precision bf16 needs a GPU device; the cpu backend computes in f32");
    sf_backend *be = calloc(1, sizeof *be);
    if (!be) return sf_error(SF_E_NOMEM, "out of memory");
    int rc;
#ifdef SEQFLOW_HAVE_CUDA
    if (is_cuda) {
        be->precision = precision == SF_PRECISION_AUTO ? SF_PRECISION_BF16 : precision;
        rc = sf_cuda_backend_init(be, device);
    } else
#endif
    {
        (void)device; /* the CPU backend has one device */
        be->precision = SF_PRECISION_F32;
        rc = sf_cpu_backend_init(be);
    }
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
