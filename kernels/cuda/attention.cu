/* sf_cuda_attention: which attention kernel runs (cuda_attention.h lists them). By compute
 * capability, head width, q/k/v type, the branches and whether there is a workspace; nothing
 * else, so that a shape runs the same kernel, and gives the same bits, every time. */
#include <stdint.h>

#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

/* bf16 q/k/v read in place (the caller checked the wgmma kernel runs here): the ping-pong kernel
 * where it is preferred and can map q/k/v, else the wgmma kernel; `mix` NULL or fused. */
static int bf16_in_place(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *out,
                         const sf_cuda_attention_mix *mix, void *workspace, size_t workspace_bytes, cudaStream_t stream,
                         const sf_cuda_device_info *dev)
{
    if (sf_cuda_attention_pingpong_preferred(desc, dev)) {
        const int rc = sf_cuda_attention_pingpong(desc, q, k, v, out, mix, workspace, workspace_bytes, stream);
        if (rc != SF_E_UNSUPPORTED) return rc;
        sf_clear_error();
    }
    return sf_cuda_attention_wgmma(desc, q, k, v, out, mix, workspace, workspace_bytes, stream);
}

extern "C" int sf_cuda_attention(const sf_attention_desc *desc, const void *q, const void *k, const void *v, float *out,
                                 void *workspace, size_t workspace_bytes, cudaStream_t stream,
                                 const sf_cuda_device_info *dev)
{
    if (desc->qkv_type != SF_DTYPE_F32 && desc->qkv_type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda attention: q/k/v of unknown type %d", (int)desc->qkv_type);
    if (desc->n <= 0) return SF_OK;
    const bool wgmma = sf_cuda_attention_wgmma_usable(desc, dev) != 0;
    if (desc->qkv_type == SF_DTYPE_BF16) {
        /* only the Hopper kernels read bf16 in place; the caller widens them for the others */
        if (!wgmma || !workspace)
            return sf_error(SF_E_UNSUPPORTED,
                            "cuda attention: bf16 q/k/v are read by the Hopper kernels only (compute capability 9.0, "
                            "d = 64 or 128, a workspace)");
        return bf16_in_place(desc, q, k, v, out, NULL, workspace, workspace_bytes, stream, dev);
    }
    const float *qf = static_cast<const float *>(q), *kf = static_cast<const float *>(k),
                *vf = static_cast<const float *>(v);
    int rc;
    if (!workspace)
        rc = sf_cuda_attention_convert(desc, qf, kf, vf, out, stream);
    else if (wgmma)
        rc = sf_cuda_attention_wgmma(desc, q, k, v, out, NULL, workspace, workspace_bytes, stream);
    else
        rc = sf_cuda_attention_staged(desc, qf, kf, vf, out, workspace, workspace_bytes, stream);
    if (rc != SF_E_UNSUPPORTED) return rc;
    /* shapes the tensor-core kernels were not built for (head widths other than 32/64/128, odd
     * strides) still run, in float32: slower, never less exact */
    sf_clear_error();
    return sf_cuda_attention_f32(desc, qf, kf, vf, out, stream);
}

extern "C" int sf_cuda_attention_with_mix(const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                                          float *a, const sf_cuda_attention_mix *mix, void *workspace,
                                          size_t workspace_bytes, cudaStream_t stream, const sf_cuda_device_info *dev)
{
    if (desc->qkv_type != SF_DTYPE_BF16 || !mix || !mix->out || desc->n <= 0 || desc->head_dim != 64 ||
        !sf_cuda_attention_wgmma_usable(desc, dev) || ((uintptr_t)mix->out | (uintptr_t)a) % 16)
        return SF_E_UNSUPPORTED; /* not an error: the caller runs the attention and the mix */
    return bf16_in_place(desc, q, k, v, a, mix, workspace, workspace_bytes, stream, dev);
}
