/* The CPU backend: host memory, OpenBLAS products (single-threaded BLAS, parallelized by our own
 * OpenMP loops) and hand-vectorized attention. kernels/backend.c creates it by name. */
#ifndef SEQFLOW_KERNELS_CPU_BACKEND_H
#define SEQFLOW_KERNELS_CPU_BACKEND_H

#include "seqflow/backend.h"

/* The op table of the CPU backend: every core op, float32 activations only, no extensions
 * (ext NULL: kernels/backend.c composes the fused steps from these ops). */
extern const sf_backend_ops sf_cpu_backend_ops;

/* Fills *be (ops, impl = NULL); keeps be->threads as set by the caller (0 = every OpenMP
 * thread, omp_get_max_threads()). Sets OpenBLAS to one thread, once. Returns SF_OK. */
int sf_cpu_backend_init(sf_backend *be);

#endif
