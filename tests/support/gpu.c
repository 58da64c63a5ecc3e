#include "support/gpu.h"

#ifdef SEQFLOW_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

int check_have_gpu(void)
{
#ifdef SEQFLOW_HAVE_CUDA
    return sf_cuda_device_count() > 0;
#else
    return 0;
#endif
}
