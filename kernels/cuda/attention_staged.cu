/* The staged attention kernel's product instance and what every workspace kernel shares: the
 * bf16 K/V pre-pass, the workspace's layout and checks, the block size and the heaviest-first
 * order (attention_staging.h). The kernel itself, and why it stages: attention_staged.cuh. It
 * runs wherever the wgmma kernel does not (another device, d = 32 or 128) with a workspace:
 * 4 warps of 16 query rows, 64 keys a tile (32 at d = 128) double-buffered, 3 blocks a
 * multiprocessor (168 registers; 2 at d = 128), which measured fastest of the portable shapes
 * (bench/lab/README.md). */
#include <math.h>
#include <stdint.h>
#include <algorithm>
#include <cuda_bf16.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_staged.cuh"
#include "kernels/cuda/attention_staging.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/error.h"

/* ---- pre-pass: float32 [rows, ld] -> bf16 [heads][rows][D] ------------------------------ */
/* STREAM: read K/V as evict-first (ld.global.cs), so that the float32 inputs, read once, do not
 * push the bf16 copies the main kernel re-reads out of L2. */
template <int D, bool STREAM>
__global__ void stage_kv(int rows, int heads, int ld, const float *k, const float *v, __nv_bfloat16 *kb,
                         __nv_bfloat16 *vb)
{
    sf_wait_prior_grid(); /* launched early: sf_cuda_launch_early */
    const size_t total = (size_t)rows * heads * (D / 8);
    for (size_t f = (size_t)blockIdx.x * blockDim.x + threadIdx.x; f < total; f += (size_t)gridDim.x * blockDim.x) {
        const int c8 = (int)(f % (D / 8));
        const size_t rh = f / (D / 8);
        const int h = (int)(rh % heads);
        const size_t i = rh / heads;
        const size_t src = i * ld + (size_t)h * D + c8 * 8, dst = ((size_t)h * rows + i) * D + c8 * 8;
        const float4 *ks = reinterpret_cast<const float4 *>(k + src), *vs = reinterpret_cast<const float4 *>(v + src);
        const float4 a = STREAM ? __ldcs(ks) : __ldg(ks), b = STREAM ? __ldcs(ks + 1) : __ldg(ks + 1);
        const float4 c = STREAM ? __ldcs(vs) : __ldg(vs), d = STREAM ? __ldcs(vs + 1) : __ldg(vs + 1);
        *reinterpret_cast<uint4 *>(kb + dst) =
            make_uint4(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w), pack_bf16x2(b.x, b.y), pack_bf16x2(b.z, b.w));
        *reinterpret_cast<uint4 *>(vb + dst) =
            make_uint4(pack_bf16x2(c.x, c.y), pack_bf16x2(c.z, c.w), pack_bf16x2(d.x, d.y), pack_bf16x2(d.z, d.w));
    }
}

/* ---- host side -------------------------------------------------------------------------- */

static size_t round_up_256(size_t x) { return (x + 255) & ~(size_t)255; }

size_t att_kv_bytes(int rows, int heads, int d) { return round_up_256((size_t)rows * heads * d * 2); }

size_t att_workspace_need(int rows, int g, int heads, int d)
{
    return 2 * att_kv_bytes(rows, heads, d) + 2 * att_kv_bytes(g, heads, d);
}

extern "C" size_t sf_cuda_attention_workspace_bytes(const sf_attention_desc *desc)
{
    const int rows = desc->segment > desc->n ? desc->segment : desc->n;
    const int g = desc->n_global > 0 ? desc->n_global : 0;
    return att_workspace_need(rows, g, desc->heads, desc->head_dim);
}

int att_check_ws_launch(const sf_attention_desc *desc, const void *workspace, size_t workspace_bytes,
                        att_branches *br)
{
    int rc = att_fill_branches(desc, br);
    if (rc) return rc;
    if (desc->n_global > 0 && (!desc->gk || !desc->gv))
        return sf_error(SF_E_INVAL, "cuda attention: %d global tokens but no gk/gv", desc->n_global);
    const size_t need =
        att_workspace_need(desc->n, desc->n_global > 0 ? desc->n_global : 0, desc->heads, desc->head_dim);
    if (!workspace || workspace_bytes < need || ((uintptr_t)workspace & 255))
        return sf_error(SF_E_INVAL, "cuda attention: workspace %p of %zu bytes, need %zu bytes 256-byte aligned",
                        workspace, workspace_bytes, need);
    return SF_OK;
}

/* Query-key pairs a block of positions [P, Pend) attends to (offset 0 stands for every head):
 * the schedule's cost estimate. */
static double block_pairs(const sf_attention_desc *d, const att_branches &br, int P, int Pend)
{
    double pairs = (double)(Pend - P) * d->n_global;
    for (int b = 0; b < br.count; b++) {
        const int r = br.dilation[b], win = br.window[b] / r, nd = (d->n + r - 1) / r;
        const int xb = std::min((Pend + r - 1) / r, nd);
        for (int x = P / r; x < xb;) {
            const int ws = x / win * win, e = std::min(xb, ws + win);
            if (d->causal)
                pairs += 0.5 * (double)(x - ws + 1 + e - ws) * (e - x);
            else
                pairs += (double)(e - x) * (std::min(ws + win, nd) - ws);
            x = e;
        }
    }
    return pairs;
}

void att_heaviest_first(const sf_attention_desc *d, const att_branches &br, int T, int nblocks, att_order *ord)
{
    ord->count = 0;
    if (nblocks > SF_ATT_ORDER_MAX) return;
    double cost[SF_ATT_ORDER_MAX];
    for (int i = 0; i < nblocks; i++) {
        cost[i] = block_pairs(d, br, i * T, std::min(i * T + T, d->n));
        ord->block[i] = (unsigned short)i;
    }
    std::stable_sort(ord->block, ord->block + nblocks,
                     [&](unsigned short a, unsigned short b) { return cost[a] > cost[b]; });
    ord->count = nblocks;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int D>
static void stage_inputs(int rows, int heads, int ld, const float *k, const float *v, __nv_bfloat16 *kb,
                         __nv_bfloat16 *vb, bool streaming, cudaStream_t stream)
{
    const size_t total = (size_t)rows * heads * (D / 8);
    if (total == 0) return;
    const unsigned grid = (unsigned)std::min<size_t>((total + 255) / 256, 8192);
    /* the streaming form serves the wgmma kernel alone, d = 64 and 128: d = 32 reads the plain way */
    if constexpr (D >= 64) {
        if (streaming) {
            sf_cuda_launch_early(stage_kv<D, true>, grid, 256, 0, stream, rows, heads, ld, k, v, kb, vb);
            return;
        }
    }
        sf_cuda_launch_early(stage_kv<D, false>, grid, 256, 0, stream, rows, heads, ld, k, v, kb, vb);
}

int att_check_staged_inputs(const sf_attention_desc *desc, const float *q, const float *k, const float *v)
{
    const int G = desc->n_global;
    if (desc->ld % 4 || (G > 0 && desc->global_ld % 4) || !aligned16(k) || !aligned16(v) || !aligned16(q) ||
        (G > 0 && (!aligned16(desc->gk) || !aligned16(desc->gv))))
        return sf_error(SF_E_UNSUPPORTED,
                        "cuda attention: q/k/v need 16-byte alignment and row strides a multiple of 4 floats (ld %d)",
                        desc->ld);
    return SF_OK;
}

int att_block_positions(const att_branches &br, int bm, long *T)
{
    long lcm = 1;
    int rmax = 1;
    for (int b = 0; b < br.count; b++) {
        lcm = lcm / att_gcd((int)lcm, br.dilation[b]) * br.dilation[b];
        if (lcm > (1 << 20)) return sf_error(SF_E_UNSUPPORTED, "cuda attention: dilations too varied");
        if (br.dilation[b] > rmax) rmax = br.dilation[b];
    }
    *T = ((long)bm * rmax + lcm - 1) / lcm * lcm;
    if (*T > 8192 && lcm <= 8192) *T = (8192 / lcm) * lcm;
    return SF_OK;
}

int att_stage_workspace(const sf_attention_desc *desc, const float *k, const float *v, unsigned char *ws,
                        att_staged *staged, cudaStream_t stream, bool streaming)
{
    const int H = desc->heads, n = desc->n, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    __nv_bfloat16 *kb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *vb = reinterpret_cast<__nv_bfloat16 *>(ws + att_kv_bytes(n, H, D));
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * att_kv_bytes(n, H, D));
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + 2 * att_kv_bytes(n, H, D) + att_kv_bytes(G, H, D));
    switch (D) {
    case 32:
        stage_inputs<32>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<32>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    case 64:
        stage_inputs<64>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<64>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    case 128:
        stage_inputs<128>(n, H, desc->ld, k, v, kb, vb, streaming, stream);
        if (G > 0) stage_inputs<128>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
        break;
    default: return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)", D);
    }
    staged->kb = kb, staged->vb = vb, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = (size_t)n * D, staged->krow = D;
    return SF_OK;
}

int att_stage_globals(const sf_attention_desc *desc, const __nv_bfloat16 *k, const __nv_bfloat16 *v, unsigned char *ws,
                      att_staged *staged, cudaStream_t stream, bool streaming)
{
    const int H = desc->heads, G = desc->n_global > 0 ? desc->n_global : 0, D = desc->head_dim;
    if (D != 64 && D != 128)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: bf16 K/V read in place for d = 64 and 128, not %d", D);
    __nv_bfloat16 *gkb = reinterpret_cast<__nv_bfloat16 *>(ws);
    __nv_bfloat16 *gvb = reinterpret_cast<__nv_bfloat16 *>(ws + att_kv_bytes(G, H, D));
    if (G > 0 && D == 64) stage_inputs<64>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
    if (G > 0 && D == 128) stage_inputs<128>(G, H, desc->global_ld, desc->gk, desc->gv, gkb, gvb, streaming, stream);
    staged->kb = k, staged->vb = v, staged->gkb = gkb, staged->gvb = gvb;
    staged->khead = D, staged->krow = (size_t)desc->ld;
    return SF_OK;
}

extern "C" int sf_cuda_attention_staged(const sf_attention_desc *desc, const float *q, const float *k, const float *v,
                                        float *out, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (desc->qkv_type != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "cuda attention (staged): reads float32 q/k/v only");
    if (desc->n <= 0) return SF_OK;
    att_branches br;
    int rc = att_check_ws_launch(desc, workspace, workspace_bytes, &br);
    if (rc) return rc;
    unsigned char *ws = static_cast<unsigned char *>(workspace);
    switch (desc->head_dim) {
    /* resident blocks of 4 warps a multiprocessor: 3 leave 168 registers a thread (2 at d = 128) */
    case 32: rc = launch_staged<32, 4, 1, 64, 2, 3>(desc, br, q, k, v, out, ws, stream); break;
    case 64: rc = launch_staged<64, 4, 1, 64, 2, 3>(desc, br, q, k, v, out, ws, stream); break;
    case 128: rc = launch_staged<128, 4, 1, 32, 2, 2>(desc, br, q, k, v, out, ws, stream); break;
    default:
        return sf_error(SF_E_UNSUPPORTED, "cuda attention: head width %d not built (32, 64, 128 are)",
                        desc->head_dim);
    }
    if (rc) return rc;
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return sf_error(SF_E_BACKEND, "cuda attention launch: %s", cudaGetErrorString(err));
    return SF_OK;
}
