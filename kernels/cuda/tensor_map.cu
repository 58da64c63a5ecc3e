#include "kernels/cuda/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "seqflow/error.h"

static PFN_cuTensorMapEncodeTiled_v12000 encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            p = nullptr;
        cudaGetLastError();
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

static int tensor_map_sw128(CUtensorMap *map, CUtensorMapDataType type, int elem_bytes, const void *base,
                            long long rows, long long cols, long long ld, int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
    if (!encode) return sf_error(SF_E_UNSUPPORTED, "tensor map: the driver has no cuTensorMapEncodeTiled");
    if (((uintptr_t)base & 15) || (ld * elem_bytes) % 16 || rows <= 0 || cols <= 0 || box_rows <= 0 || box_rows > 256)
        return sf_error(SF_E_UNSUPPORTED, "tensor map: %lld x %lld (ld %lld) at %p in boxes of %d rows", rows, cols, ld,
                        base, box_rows);
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * elem_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)(128 / elem_bytes), (cuuint32_t)box_rows};
    const cuuint32_t step[2] = {1, 1};
    CUresult r = encode(map, type, 2, (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return sf_error(SF_E_UNSUPPORTED, "tensor map: cuTensorMapEncodeTiled refused %lld x %lld (error %d)", rows,
                        cols, (int)r);
    return SF_OK;
}

int sf_cuda_tensor_map_bf16_sw128(CUtensorMap *map, const __nv_bfloat16 *base, long long rows, long long cols,
                                  long long ld, int box_rows)
{
    return tensor_map_sw128(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, rows, cols, ld, box_rows);
}

int sf_cuda_tensor_map_f32_sw128(CUtensorMap *map, const float *base, long long rows, long long cols, long long ld,
                                 int box_rows)
{
    return tensor_map_sw128(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, rows, cols, ld, box_rows);
}

int sf_cuda_tensor_map_u8_sw128(CUtensorMap *map, const unsigned char *base, long long rows, long long cols,
                                long long ld, int box_rows)
{
    return tensor_map_sw128(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, base, rows, cols, ld, box_rows);
}
