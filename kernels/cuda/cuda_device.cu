#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime.h>
#include <stdio.h>

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
