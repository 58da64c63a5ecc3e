/* sf_cuda_attention_f32: dilated local attention in float32 (SPEC 3 and 5), meant to be simple
 * and exactly checkable rather than fast (the bf16 tensor-core kernel is the fast path).
 *
 * One warp owns one (query row i, head h). It walks every part that row takes part in (each
 * branch whose dilation offset selects i, then the global tokens) 32 keys at a time, one key
 * per lane, with one online softmax over all of them: merging per-part softmaxes by their
 * log-sum-exp is the same as one softmax over the concatenated keys (a key reached by two
 * branches counts twice), so no per-part state is needed. Lane L accumulates output
 * components L, L+32, ... A row in no part gets 0. Nothing is allocated. */
#include "kernels/cuda/cuda_attention.h"
#include "seqflow/error.h"

#include <math.h>

#define WARPS 4              /* query rows per block */
#define MAX_COMPONENTS 8     /* head_dim <= 32 * MAX_COMPONENTS */

typedef struct attn_params {
    int n, heads, d, ld, causal, n_branches, head_offset;
    int window[SF_MAX_BRANCHES], dilation[SF_MAX_BRANCHES];
    int n_global, global_ld;
    const float *gk, *gv;
    float scale;
} attn_params;

__device__ static inline float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ static inline float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ static void attention_f32_kernel(attn_params p, const float *q, const float *k, const float *v,
                                            float *out)
{
    extern __shared__ float q_shared[]; /* [WARPS][d], scaled query of each warp's row */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i = blockIdx.x * WARPS + warp, h = blockIdx.y, d = p.d;
    if (i >= p.n) return; /* whole warp leaves; the block has no barrier */
    float *qw = q_shared + warp * d;
    for (int e = lane; e < d; e += 32) qw[e] = q[(size_t)i * p.ld + (size_t)h * d + e] * p.scale;
    __syncwarp();
    float m = -INFINITY, l = 0;
    float acc[MAX_COMPONENTS];
#pragma unroll
    for (int c = 0; c < MAX_COMPONENTS; c++) acc[c] = 0;

    for (int part = 0; part <= p.n_branches; part++) {
        const float *kb, *vb;
        long first, step, row_ld, count;
        if (part < p.n_branches) {
            const int w = p.window[part], r = p.dilation[part], o = (p.head_offset + h) % r, start = i / w * w;
            if ((i - start) % r != o) continue;
            long end = start + w < p.n ? start + w : p.n;
            if (p.causal && end > i + 1) end = i + 1;
            first = start + o, step = r, row_ld = p.ld;
            count = end > first ? (end - first + r - 1) / r : 0;
            kb = k + (size_t)h * d, vb = v + (size_t)h * d;
        } else {
            if (p.n_global <= 0) continue;
            first = 0, step = 1, row_ld = p.global_ld, count = p.n_global;
            kb = p.gk + (size_t)h * d, vb = p.gv + (size_t)h * d;
        }
        for (long t0 = 0; t0 < count; t0 += 32) {
            const long t = t0 + lane;
            float s = -INFINITY;
            if (t < count) {
                const float *kr = kb + (size_t)(first + t * step) * row_ld;
                float dot = 0;
                for (int e = 0; e < d; e++) dot += qw[e] * kr[e];
                s = dot;
            }
            const float m_new = fmaxf(m, warp_max(s)); /* finite: lane 0's key is valid */
            const float corr = expf(m - m_new);
            const float prob = t < count ? expf(s - m_new) : 0.0f;
            l = l * corr + warp_sum(prob);
            m = m_new;
#pragma unroll
            for (int c = 0; c < MAX_COMPONENTS; c++) acc[c] *= corr;
            const int keys = count - t0 < 32 ? (int)(count - t0) : 32;
            for (int kk = 0; kk < keys; kk++) {
                const float pk = __shfl_sync(0xffffffffu, prob, kk);
                const float *vr = vb + (size_t)(first + (t0 + kk) * step) * row_ld;
#pragma unroll
                for (int c = 0; c < MAX_COMPONENTS; c++)
                    if (lane + 32 * c < d) acc[c] += pk * vr[lane + 32 * c];
            }
        }
    }
    const float inv = l > 0 ? 1.0f / l : 0.0f;
    float *dst = out + (size_t)i * p.ld + (size_t)h * d;
#pragma unroll
    for (int c = 0; c < MAX_COMPONENTS; c++)
        if (lane + 32 * c < d) dst[lane + 32 * c] = acc[c] * inv;
}

extern "C" int sf_cuda_attention_f32(const sf_attention_desc *desc, const float *q, const float *k,
                                     const float *v, float *out, cudaStream_t stream)
{
    if (desc->n <= 0 || desc->heads <= 0) return SF_OK;
    if (desc->qkv_type != SF_DTYPE_F32) return sf_error(SF_E_UNSUPPORTED, "CUDA f32 attention reads float32 q/k/v only");
    if (desc->head_dim <= 0 || desc->head_dim > 32 * MAX_COMPONENTS)
        return sf_error(SF_E_UNSUPPORTED, "CUDA f32 attention takes head_dim 1..%d, not %d", 32 * MAX_COMPONENTS,
                        desc->head_dim);
    if (desc->n_branches < 0 || desc->n_branches > SF_MAX_BRANCHES)
        return sf_error(SF_E_INVAL, "CUDA f32 attention: %d branches (at most %d)", desc->n_branches, SF_MAX_BRANCHES);
    if (desc->n_global > 0 && (!desc->gk || !desc->gv))
        return sf_error(SF_E_INVAL, "CUDA f32 attention: %d global tokens without gk/gv", desc->n_global);
    attn_params p = {};
    p.n = desc->n, p.heads = desc->heads, p.d = desc->head_dim, p.ld = desc->ld, p.causal = desc->causal;
    p.n_branches = desc->n_branches, p.head_offset = desc->head_offset;
    for (int b = 0; b < desc->n_branches; b++) {
        if (desc->branches[b].window <= 0 || desc->branches[b].dilation <= 0)
            return sf_error(SF_E_INVAL, "CUDA f32 attention: branch %d has window %d, dilation %d", b,
                            desc->branches[b].window, desc->branches[b].dilation);
        p.window[b] = desc->branches[b].window, p.dilation[b] = desc->branches[b].dilation;
    }
    p.n_global = desc->n_global > 0 ? desc->n_global : 0, p.global_ld = desc->global_ld;
    p.gk = desc->gk, p.gv = desc->gv, p.scale = desc->scale;
    dim3 grid((unsigned)((desc->n + WARPS - 1) / WARPS), (unsigned)desc->heads);
    attention_f32_kernel<<<grid, 32 * WARPS, (size_t)WARPS * desc->head_dim * sizeof(float), stream>>>(p, q, k, v,
                                                                                                      out);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "CUDA: f32 attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
