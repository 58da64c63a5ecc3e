/* The convert attention kernel's product instance (the kernel: attention_convert.cuh): what runs
 * when the caller gave no workspace. 4 warps of 16 query rows, 64 keys a tile (32 at d = 128). */
#include "kernels/cuda/attention_convert.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

extern "C" int sf_cuda_attention_convert(const sf_attention_desc *desc, const float *q, const float *k, const float *v,
                                         float *out, cudaStream_t stream)
{
    if (desc->qkv_type != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention (convert): reads float32 q/k/v only");
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_fill_branches(desc, &br);
    if (rc) return rc;
    if (desc->n_global > 0 && (!desc->gk || !desc->gv))
        return sf_error(SF_E_INVAL, "cuda attention: %d global tokens but no gk/gv", desc->n_global);
    switch (desc->head_dim) {
    case 32: rc = launch_fused<32, 4, 64>(desc, br, q, k, v, out, stream); break;
    case 64: rc = launch_fused<64, 4, 64>(desc, br, q, k, v, out, stream); break;
    case 128: rc = launch_fused<128, 4, 32>(desc, br, q, k, v, out, stream); break;
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)", desc->head_dim);
    }
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
