/* Programmatic dependent launch for the backend's own kernels. In the pipeline most of them
 * follow a cuBLAS product in their stream (the norms after W2 and O, SwiGLU after W1|W3, the
 * attention and its global-token staging after Q/K/V), and each boundary left the GPU idle for
 * 3-5 us (bench/RESULTS.md, run 13: the kernel timeline). Launched early, a kernel's blocks
 * are placed while the product ahead of it drains; each such kernel first waits in
 * sf_wait_prior_grid for that grid to finish and its writes to be visible, so it reads
 * exactly what it read before. The backend's setting early_launch=0 launches them the plain way. */
#ifndef SEQFLOW_KERNELS_CUDA_LAUNCH_EARLY_CUH
#define SEQFLOW_KERNELS_CUDA_LAUNCH_EARLY_CUH

#include <cuda_runtime.h>

/* The first statement touching device memory in every kernel sf_cuda_launch_early launches: a
 * no-op when the kernel was launched the plain way. */
__device__ __forceinline__ void sf_wait_prior_grid()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The early_launch setting of the backend whose op this thread is issuing (sf_cuda_enter sets
 * it, cuda_backend.cu); 1 on a thread that never entered one. */
int sf_cuda_early_launch(void);

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
 * `early`: the kernel may start before the kernel ahead of it in the stream has finished.
 * Returns the launch's error. */
template <class... Params, class... Args>
static inline cudaError_t sf_cuda_launch_programmatic(bool early, void (*kernel)(Params...), dim3 grid, dim3 block,
                                                      size_t smem, cudaStream_t stream, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = early ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* The same, early unless the backend's early_launch setting is 0 (see above). */
template <class... Params, class... Args>
static inline cudaError_t sf_cuda_launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                               cudaStream_t stream, Args &&...args)
{
    return sf_cuda_launch_programmatic(sf_cuda_early_launch() != 0, kernel, grid, block, smem, stream,
                                       static_cast<Args &&>(args)...);
}

#endif
