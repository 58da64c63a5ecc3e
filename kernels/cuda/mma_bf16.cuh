/* The bf16 tensor-core step every mma.sync kernel uses (attention and memory): m16n8k16 with
 * float32 accumulators, and the packing of two floats into one bf16x2 operand register.
 * Header-only, device code. */
#ifndef SEQFLOW_KERNELS_CUDA_MMA_BF16_CUH
#define SEQFLOW_KERNELS_CUDA_MMA_BF16_CUH

#include <stdint.h>
#include <cuda_bf16.h>

/* lo in the low half: the lower k (or column) of a fragment's pair */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&p);
}

/* c += a b for one m16n8k16 step (fragment layouts: PTX ISA, "mma.m16n8k16") */
__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
