/* The split sums' add-and-norm kernel (kernels/cuda/elementwise.cu, add_parts_norm_kernel) with its
 * normed rows sent to the other GPU by the copy engine of the multiprocessor (TMA bulk stores)
 * instead of the threads' own stores: a warp writes each normed row into shared memory (two
 * buffers a warp) and one lane hands the row to cp.async.bulk, so the threads go on to the next
 * row while the link takes the bytes. The local normed rows and the float32 rows are stored as
 * in the product's kernel, which this one equals bit for bit (lab_kernels.h). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "bench/lab/lab_kernels.h"

namespace {

constexpr int VECS = 8; /* float4 a lane a row: rows up to 1024 wide */

__device__ inline uint2 pack4(float4 v)
{
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi));
}

struct row_in {
    float4 x[VECS];
    uint2 part[2][VECS];
};

__device__ inline void load_row(row_in &in, const float *row, const __nv_bfloat16 *p0, const __nv_bfloat16 *p1,
                                size_t r, int dim, int lane)
{
#pragma unroll
    for (int p = 0; p < VECS; p++) {
        const int j = 4 * (lane + 32 * p);
        if (j >= dim) continue;
        in.part[0][p] = *reinterpret_cast<const uint2 *>(p0 + r * dim + j);
        in.part[1][p] = *reinterpret_cast<const uint2 *>(p1 + r * dim + j);
        in.x[p] = *reinterpret_cast<const float4 *>(row + j);
    }
}

__global__ void add_norm_bulk_kernel(int n, int dim, float *rows, const __nv_bfloat16 *p0, const __nv_bfloat16 *p1,
                                     const float *weight, float eps, __nv_bfloat16 *u, __nv_bfloat16 *peer)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const size_t row_bytes = (size_t)dim * 2;
    unsigned char *bufs = smem + (size_t)warp * 2 * row_bytes;
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    size_t r = (size_t)blockIdx.x * (blockDim.x / 32) + warp;
    if (r >= (size_t)n) return;
    row_in in;
    load_row(in, rows + r * dim, p0, p1, r, dim, lane);
    for (int count = 0;; count++) {
        float *row = rows + r * dim;
        float4 v[VECS];
        double ss = 0;
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            const int j = 4 * (lane + 32 * p);
            if (j < dim) {
                float s[4];
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const uint2 raw = in.part[q][p];
                    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
                    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
                    s[0] = q ? s[0] + lo.x : lo.x, s[1] = q ? s[1] + lo.y : lo.y;
                    s[2] = q ? s[2] + hi.x : hi.x, s[3] = q ? s[3] + hi.y : hi.y;
                }
                v[p] = in.x[p];
                v[p].x += s[0], v[p].y += s[1], v[p].z += s[2], v[p].w += s[3];
            } else {
                v[p] = make_float4(0, 0, 0, 0);
            }
            ss += (double)v[p].x * v[p].x + (double)v[p].y * v[p].y + (double)v[p].z * v[p].z + (double)v[p].w * v[p].w;
        }
        const size_t next = r + warps;
        if (next < (size_t)n) load_row(in, rows + next * dim, p0, p1, next, dim, lane);
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            const int j = 4 * (lane + 32 * p);
            if (j < dim) *reinterpret_cast<float4 *>(row + j) = v[p];
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rs = (float)(1.0 / sqrt(ss / dim + (double)eps));
        /* the buffer of two rows ago must have been read by its bulk store */
        if (count >= 2) {
            if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            __syncwarp();
        }
        unsigned char *buf = bufs + (size_t)(count & 1) * row_bytes;
#pragma unroll
        for (int p = 0; p < VECS; p++) {
            const int j = 4 * (lane + 32 * p);
            if (j >= dim) continue;
            const float4 w = *reinterpret_cast<const float4 *>(weight + j);
            const uint2 o =
                pack4(make_float4(v[p].x * rs * w.x, v[p].y * rs * w.y, v[p].z * rs * w.z, v[p].w * rs * w.w));
            *reinterpret_cast<uint2 *>(u + r * dim + j) = o;
            *reinterpret_cast<uint2 *>(buf + (size_t)j * 2) = o;
        }
        /* the threads' shared-memory writes before the copy engine's reads of them */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane == 0) {
            const unsigned src = (unsigned)__cvta_generic_to_shared(buf);
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(peer + r * dim), "r"(src),
                         "r"((unsigned)row_bytes)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
        if (next >= (size_t)n) break;
        r = next;
    }
    if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

} // namespace

int sf_lab_add_norm_bulk_usable(int dim) { return dim > 0 && dim % 128 == 0 && dim <= 4 * 32 * VECS; }

int sf_lab_add_norm_bulk(const __nv_bfloat16 *p0, const __nv_bfloat16 *p1, int n, int dim, float *rows,
                         const float *weight, float eps, __nv_bfloat16 *u, __nv_bfloat16 *peer, int rows_per_warp,
                         int warps_per_block, cudaStream_t stream)
{
    if (!sf_lab_add_norm_bulk_usable(dim) || rows_per_warp < 1 || warps_per_block < 1 || warps_per_block > 32)
        return -1;
    if (n <= 0) return 0;
    const size_t smem = (size_t)warps_per_block * 2 * dim * 2;
    if (smem > 48 * 1024 && cudaFuncSetAttribute(add_norm_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem) != cudaSuccess)
        return -1;
    const long long per_block = (long long)warps_per_block * rows_per_warp;
    const unsigned grid = (unsigned)((n + per_block - 1) / per_block);
    add_norm_bulk_kernel<<<grid, warps_per_block * 32, smem, stream>>>(n, dim, rows, p0, p1, weight, eps, u, peer);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
