/* Element types of activations: what a packet's rows and the backend's attention inputs hold. */
#ifndef SEQFLOW_DTYPE_H
#define SEQFLOW_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sf_dtype {
    SF_DTYPE_F32 = 0, /* IEEE float32 */
    SF_DTYPE_BF16 = 1 /* bfloat16: the upper half of a float32, row-major like float32 (n*ld*2 bytes) */
} sf_dtype;

/* Bytes of one element. */
static inline size_t sf_dtype_size(sf_dtype t) { return t == SF_DTYPE_BF16 ? 2 : 4; }

#ifdef __cplusplus
}
#endif
#endif
