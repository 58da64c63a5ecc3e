/* Whether the GPU tests can run here, and what they share. */
#ifndef SEQFLOW_TEST_GPU_H
#define SEQFLOW_TEST_GPU_H

#include <stddef.h>

#include "seqflow/backend.h"

/* 1 in a CUDA build with at least one visible device; 0 otherwise (the test then skips). */
int check_have_gpu(void);
/* The visible CUDA devices (0 without CUDA). */
int check_gpu_count(void);
/* 1 when GPU a can reach GPU b's memory (peer access, e.g. NVLink); 0 otherwise or without CUDA. */
int check_gpu_peer(int a, int b);

/* count bf16 elements of backend memory d, widened to float on the host (malloc'd: the caller
 * frees it); a failed download is a check failure. */
float *check_bf16_download(sf_backend *be, const void *d, size_t count);

#endif
