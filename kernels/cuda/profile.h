/* Opt-in per-op profile of the CUDA backend: with the setting profile=1 (docs/CUDA.md) the
 * backend's op table and its extensions are wrapped so that every op is timed with CUDA events
 * (device time) and a host clock (wall time), summed per op kind and printed on stderr when
 * the backend is destroyed. Off (the default) the plain tables are used: no cost at all. */
#ifndef SEQFLOW_KERNELS_CUDA_PROFILE_H
#define SEQFLOW_KERNELS_CUDA_PROFILE_H

#include "seqflow/backend.h"

/* Wraps be's ops (a freshly initialized cuda backend); the profile is freed by ops->destroy. */
int sf_cuda_profile_attach(sf_backend *be);

#endif
