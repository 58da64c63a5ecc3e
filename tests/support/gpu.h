/* Whether the GPU tests can run here. */
#ifndef SEQFLOW_TEST_GPU_H
#define SEQFLOW_TEST_GPU_H

/* 1 in a CUDA build with at least one visible device; 0 otherwise (the test then skips). */
int check_have_gpu(void);

#endif
