#include "support/gpu.h"

#include <stdint.h>
#include <stdlib.h>

#include "seqflow/error.h"
#include "support/check.h"

#ifdef SEQFLOW_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "kernels/cuda/cuda_device.h"
#endif

int check_gpu_count(void)
{
#ifdef SEQFLOW_HAVE_CUDA
    return sf_cuda_device_count();
#else
    return 0;
#endif
}

int check_have_gpu(void) { return check_gpu_count() > 0; }

int check_gpu_peer(int a, int b)
{
    int can = 0;
#ifdef SEQFLOW_HAVE_CUDA
    if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) can = 0;
    cudaGetLastError();
#else
    (void)a, (void)b;
#endif
    return can;
}

float *check_bf16_download(sf_backend *be, const void *d, size_t count)
{
    uint16_t *bits = malloc(count * 2 + 2);
    float *h = malloc(count * sizeof *h + 4);
    CHECK_OK(be->ops->download(be, bits, d, count * 2));
    for (size_t i = 0; i < count; i++) h[i] = check_bf16_float(bits[i]);
    free(bits);
    return h;
}
