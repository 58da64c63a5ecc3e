/* What the CUDA runtime can see. Built only when nvcc is present (SEQFLOW_HAVE_CUDA). */
#ifndef SEQFLOW_KERNELS_CUDA_DEVICE_H
#define SEQFLOW_KERNELS_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no GPU or no driver. */
int sf_cuda_device_count(void);
/* One line naming device `index` (or the reason there is none) into buf. */
void sf_cuda_device_describe(int index, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif
