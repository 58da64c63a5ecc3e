/* The lab's variants of the staged kernel (kernels/cuda/attention_staged.cuh: bf16 K/V staged by
 * the pre-pass, mma.sync), 4-8, the overlapped pre-pass of the wgmma variants 43-44, and the
 * lab's entry sf_lab_attention_variant, which sends each variant number to its family. 6 is the
 * product's shape (sf_cuda_attention_staged); bench/lab/ATTENTION_NOTES.md says what each
 * measured. */
#include <math.h>
#include <stdint.h>
#include <algorithm>
#include <cuda_bf16.h>

#include "bench/lab/attention/attention_lab.cuh"
#include "bench/lab/attention/attention_variants.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staged.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* ---- the overlapped pre-pass ------------------------------------------------------------ */

/* The overlapped pre-pass (att_stage_workspace_overlapped): block c stages chunk c of
 * SF_ATT_CHUNK_ROWS rows, sequence chunks last first, then the globals', and raises ready[chunk]. */
template <int D>
__global__ void __launch_bounds__(256) stage_kv_flagged(int rows, int grows, int heads, int ld, int gld, const float *k,
                                                        const float *v, const float *gk, const float *gv,
                                                        __nv_bfloat16 *kb, __nv_bfloat16 *vb, __nv_bfloat16 *gkb,
                                                        __nv_bfloat16 *gvb, unsigned *ready)
{
    /* every block of this grid is running or done once all have passed this point, and none waits
     * on anything, so the main kernel's blocks, which wait on these flags, cannot starve it */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int nch = (rows + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    const bool glob = (int)blockIdx.x >= nch;
    const int chunk = glob ? (int)blockIdx.x - nch : nch - 1 - (int)blockIdx.x;
    const int all = glob ? grows : rows, stride = glob ? gld : ld, r0 = chunk * SF_ATT_CHUNK_ROWS;
    const float *ksrc = glob ? gk : k, *vsrc = glob ? gv : v;
    __nv_bfloat16 *kdst = glob ? gkb : kb, *vdst = glob ? gvb : vb;
    const int units = min(SF_ATT_CHUNK_ROWS, all - r0) * heads * (D / 8);
    /* UNROLL units' loads before their stores: the inputs may alias nothing here, but the
     * compiler cannot know, and one unit's loads in flight a thread leave DRAM idle */
    constexpr int UNROLL = 2;
    for (int f0 = threadIdx.x; f0 < units; f0 += UNROLL * blockDim.x) {
        float4 a[UNROLL][4];
        size_t dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int f = f0 + u * blockDim.x;
            dst[u] = ~(size_t)0;
            if (f < units) {
                const int c8 = f % (D / 8), rh = f / (D / 8), h = rh % heads, i = r0 + rh / heads;
                const size_t src = (size_t)i * stride + (size_t)h * D + c8 * 8;
                dst[u] = ((size_t)h * all + i) * D + c8 * 8;
                const float4 *ks = reinterpret_cast<const float4 *>(ksrc + src), *vs = reinterpret_cast<const float4 *>(vsrc + src);
                a[u][0] = __ldcs(ks), a[u][1] = __ldcs(ks + 1), a[u][2] = __ldcs(vs), a[u][3] = __ldcs(vs + 1);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (dst[u] == ~(size_t)0) continue;
            const float4 *x = a[u];
            *reinterpret_cast<uint4 *>(kdst + dst[u]) =
                make_uint4(pack_bf16x2(x[0].x, x[0].y), pack_bf16x2(x[0].z, x[0].w), pack_bf16x2(x[1].x, x[1].y), pack_bf16x2(x[1].z, x[1].w));
            *reinterpret_cast<uint4 *>(vdst + dst[u]) =
                make_uint4(pack_bf16x2(x[2].x, x[2].y), pack_bf16x2(x[2].z, x[2].w), pack_bf16x2(x[3].x, x[3].y), pack_bf16x2(x[3].z, x[3].w));
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], 1;" ::"l"(ready + (glob ? nch : 0) + chunk) : "memory");
    }
}

size_t lab_ready_bytes(int rows, int g)
{
    const size_t chunks = (size_t)(rows + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS +
                          (size_t)(g + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    return (chunks * sizeof(unsigned) + 255) & ~(size_t)255;
}

extern "C" size_t sf_lab_attention_workspace_bytes(const sf_attention_desc *desc)
{
    const int rows = desc->segment > desc->n ? desc->segment : desc->n;
    const int g = desc->n_global > 0 ? desc->n_global : 0;
    return sf_cuda_attention_workspace_bytes(desc) + lab_ready_bytes(rows, g);
}

int att_stage_workspace_overlapped(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                                   lab_staged *staged, cudaStream_t stream)
{
    const int H = desc->heads, n = desc->n, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    if (D != 64) return sf_error(SF_E_UNSUPPORTED, "cuda attention: overlapped pre-pass built for d = 64, not %d", D);
    __nv_bfloat16 *kb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *vb = reinterpret_cast<__nv_bfloat16 *>(ws + att_kv_bytes(n, H, D));
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * att_kv_bytes(n, H, D));
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * att_kv_bytes(n, H, D) + att_kv_bytes(G, H, D));
    unsigned *ready = reinterpret_cast<unsigned *>(ws + 2 * att_kv_bytes(n, H, D) + 2 * att_kv_bytes(G, H, D));
    const int nch = (n + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS, gch = (G + SF_ATT_CHUNK_ROWS - 1) / SF_ATT_CHUNK_ROWS;
    cudaError_t err = cudaMemsetAsync(ready, 0, lab_ready_bytes(n, G), stream);
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention: clearing ready flags: %s", cudaGetErrorString(err));
    if (nch + gch > 0)
        stage_kv_flagged<64><<<nch + gch, 256, 0, stream>>>(n, G, H, desc->ld, desc->global_ld, k, v, desc->gk, desc->gv,
                                                            kb, vb, gkb, gvb, ready);
    staged->kb = kb, staged->vb = vb, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = (size_t)n * D, staged->krow = D;
    staged->ready = ready, staged->nchunks = nch;
    return SF_OK;
}

/* ---- the staged variants ---------------------------------------------------------------- */

template <int D>
static int launch_ws_variant(int variant, const sf_attention_desc *desc, const att_branches &br, const float *q,
                             const float *k, const float *v, float *out, unsigned char *ws, cudaStream_t stream)
{
    constexpr int BN = D >= 128 ? 32 : 64;
    /* resident blocks of 4 warps a multiprocessor: 4 caps registers at 128 */
    constexpr int MINB4 = D >= 128 ? 2 : 4;
    switch (variant) {
    case 4: return launch_staged<D, 4, 1, BN, 2, MINB4>(desc, br, q, k, v, out, ws, stream);
    case 5: return launch_staged<D, 4, 1, BN, 3, MINB4>(desc, br, q, k, v, out, ws, stream);
    /* 32 rows a warp: 2 warps keep a block at 64 rows (T, and so the causal balance, unchanged) */
    case 7: return launch_staged<D, 2, 2, BN, 2, 4>(desc, br, q, k, v, out, ws, stream);
    case 8: return launch_staged<D, 4, 2, BN, 2, 2>(desc, br, q, k, v, out, ws, stream);
    default: return sf_error(SF_E_INVAL, "cuda attention: no variant %d", variant);
    }
}

/* ---- the lab's entry -------------------------------------------------------------------- */

extern "C" int sf_lab_attention_variant(int variant, const sf_attention_desc *desc, const void *qp, const void *kp,
                                        const void *vp, float *out, void *workspace, size_t workspace_bytes,
                                        cudaStream_t stream)
{
    const bool bf16_in = desc->qkv_type == SF_DTYPE_BF16;
    if (bf16_in && !(variant >= SF_LAB_ATTENTION_FIRST_WGMMA_VARIANT && att_wgmma_usable(desc)))
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: bf16 q/k/v are read by the wgmma kernels (an H100, d = 64)");
    if (desc->qkv_type != SF_DTYPE_F32 && !bf16_in)
        return sf_error(SF_E_INVAL, "cuda attention: q/k/v of unknown type %d", (int)desc->qkv_type);
    const float *q = static_cast<const float *>(qp), *k = static_cast<const float *>(kp), *v = static_cast<const float *>(vp);
    if (variant < 0 || variant >= SF_LAB_ATTENTION_VARIANTS)
        return sf_error(SF_E_INVAL, "cuda attention: no variant %d", variant);
    if (variant < SF_LAB_ATTENTION_FIRST_WS_VARIANT) return lab_attention_fused(variant, desc, q, k, v, out, stream);
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    unsigned char *ws = static_cast<unsigned char *>(workspace);
    if (variant >= SF_LAB_ATTENTION_FIRST_WGMMA_VARIANT) {
        /* Hopper-only kernels, d = 64: elsewhere the product's portable kernel computes the same */
        if (att_wgmma_usable(desc)) {
            const int G = desc->n_global > 0 ? desc->n_global : 0;
            if ((variant == 43 || variant == 44) &&
                workspace_bytes < att_workspace_need(desc->n, G, desc->heads, desc->head_dim) +
                                      lab_ready_bytes(desc->n, G))
                return sf_error(SF_E_INVAL, "cuda attention: variant %d needs sf_lab_attention_workspace_bytes",
                                variant);
            if (bf16_in)
                rc = att_wgmma_launch_bf16(variant, desc, br, static_cast<const __nv_bfloat16 *>(qp),
                                           static_cast<const __nv_bfloat16 *>(kp), static_cast<const __nv_bfloat16 *>(vp),
                                           out, ws, stream);
            else
                rc = att_wgmma_launch(variant, desc, br, q, k, v, out, ws, stream);
            if (rc) return rc;
            cudaError_t err = cudaGetLastError();
            if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
            return SF_OK;
        }
        variant = SF_LAB_ATTENTION_STAGED;
    }
    if (variant == SF_LAB_ATTENTION_STAGED)
        return sf_cuda_attention_staged(desc, q, k, v, out, workspace, workspace_bytes, stream);
    switch (desc->head_dim) {
    case 32: rc = launch_ws_variant<32>(variant, desc, br, q, k, v, out, ws, stream); break;
    case 64: rc = launch_ws_variant<64>(variant, desc, br, q, k, v, out, ws, stream); break;
    case 128: rc = launch_ws_variant<128>(variant, desc, br, q, k, v, out, ws, stream); break;
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)",
                        desc->head_dim);
    }
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
