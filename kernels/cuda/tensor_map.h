/* Tensor maps for the bulk tensor copy engine (TMA), encoded on the host. The driver's encoder
 * is looked up once through the runtime (cudaGetDriverEntryPointByVersion), so nothing links
 * against libcuda itself. */
#ifndef SEQFLOW_KERNELS_CUDA_TENSOR_MAP_H
#define SEQFLOW_KERNELS_CUDA_TENSOR_MAP_H

#include <cuda.h>
#include <cuda_bf16.h>

/* `map` describes the row-major bf16 matrix at `base` ([rows, cols], `ld` elements between rows)
 * read or written in boxes of box_rows x 64 columns (128 bytes) with the 128-byte swizzle: the
 * layout sw128_offset (attention_wgmma.cuh) and the wgmma descriptors assume. Returns SF_OK, or
 * SF_E_UNSUPPORTED when the driver has no encoder or refuses the shape (base not 16-byte
 * aligned, ld * 2 not a multiple of 16, box_rows over 256). */
int sf_cuda_tensor_map_bf16_sw128(CUtensorMap *map, const __nv_bfloat16 *base, long long rows, long long cols,
                                  long long ld, int box_rows);
/* The same for a float32 matrix: boxes of box_rows x 32 columns (128 bytes); ld * 4 a multiple
 * of 16; and for a matrix of bytes (FP8 e4m3): boxes of box_rows x 128 columns, ld a multiple of
 * 16. */
int sf_cuda_tensor_map_f32_sw128(CUtensorMap *map, const float *base, long long rows, long long cols, long long ld,
                                 int box_rows);
int sf_cuda_tensor_map_u8_sw128(CUtensorMap *map, const unsigned char *base, long long rows, long long cols,
                                long long ld, int box_rows);

#endif
