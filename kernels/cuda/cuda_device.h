/* What the CUDA runtime can see. Built only when nvcc is present (SEQFLOW_HAVE_CUDA). */
#ifndef SEQFLOW_KERNELS_CUDA_DEVICE_H
#define SEQFLOW_KERNELS_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* What kernels are picked by: a device's index and compute capability. */
typedef struct sf_cuda_device_info {
    int device;       /* CUDA device index */
    int major, minor; /* compute capability */
} sf_cuda_device_info;

/* Fills *info for device `index`. SF_E_BACKEND (sf_last_error set, the runtime's error cleared)
 * when the runtime cannot tell. */
int sf_cuda_device_info_get(int index, sf_cuda_device_info *info);

/* Number of usable CUDA devices; 0 when there is no GPU or no driver. */
int sf_cuda_device_count(void);
/* One line naming device `index` (or the reason there is none) into buf. */
void sf_cuda_device_describe(int index, char *buf, unsigned long size);

#ifdef __cplusplus
}
#endif
#endif
