/* Opt-in per-op profile of the CUDA backend: with SEQFLOW_CUDA_PROFILE=1 in the environment the
 * backend's op table is wrapped so that every op is timed with CUDA events (device time) and a
 * host clock (wall time), summed per op kind and printed on stderr when the backend is
 * destroyed. Off (the default) the plain table is used: no cost at all. */
#ifndef SEQFLOW_KERNELS_CUDA_PROFILE_H
#define SEQFLOW_KERNELS_CUDA_PROFILE_H

#include "seqflow/backend.h"

/* Non-zero when SEQFLOW_CUDA_PROFILE asks for the profile. */
int sf_cuda_profile_wanted(void);
/* Wraps be's ops (a freshly initialized cuda backend); the profile is freed by ops->destroy. */
int sf_cuda_profile_attach(sf_backend *be);

#endif
