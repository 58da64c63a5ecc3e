#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>
#include <stdio.h>

#include "seqflow/error.h"

extern "C" int sf_cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return count;
}

extern "C" void sf_cuda_device_describe(int index, char *buf, unsigned long size)
{
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, index);
    if (err != cudaSuccess) {
        snprintf(buf, size, "no CUDA device %d: %s", index, cudaGetErrorString(err));
        return;
    }
    snprintf(buf, size, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
             prop.totalGlobalMem / 1073741824.0);
}

extern "C" int sf_cuda_device_info_get(int index, sf_cuda_device_info *info)
{
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
        const cudaError_t err = cudaGetLastError(); /* must not linger as the next launch's error */
        return sf_error(SF_E_BACKEND, "cuda device %d: %s", index, cudaGetErrorString(err));
    }
    info->device = index, info->major = major, info->minor = minor;
    return SF_OK;
}
