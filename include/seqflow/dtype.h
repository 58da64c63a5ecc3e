/* Element types of activations: what a packet's rows and the backend's attention inputs hold. */
#ifndef SEQFLOW_DTYPE_H
#define SEQFLOW_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef enum sf_dtype {
    SF_DTYPE_F32 = 0, /* IEEE float32 */
    SF_DTYPE_BF16 = 1 /* bfloat16: the upper half of a float32, row-major like float32 (n*ld*2 bytes) */
} sf_dtype;

/* Bytes of one element. */
static inline size_t sf_dtype_size(sf_dtype t) { return t == SF_DTYPE_BF16 ? 2 : 4; }

/* v rounded to bfloat16, to nearest even (a NaN stays a NaN, quiet): the one rounding every
 * bf16 value on the host goes through (packets' rows, quantized state). */
static inline uint16_t sf_bf16_round(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Index of the first NaN or infinity among the n values of type t at x, or n when all are
 * finite. Blocks are tested with a branch-free OR of the exponent bits, which the compiler
 * vectorizes: the all-finite case costs about one pass over the memory. */
static inline size_t sf_first_non_finite(const void *x, sf_dtype t, size_t n)
{
    const size_t block = 1024;
    const unsigned char *bytes = (const unsigned char *)x;
    for (size_t at = 0; at < n; at += block) {
        const size_t end = n - at < block ? n : at + block;
        uint32_t bad = 0;
        if (t == SF_DTYPE_BF16) {
            for (size_t i = at; i < end; i++) {
                uint16_t v;
                memcpy(&v, bytes + 2 * i, 2);
                bad |= (uint32_t)((v & 0x7f80u) == 0x7f80u);
            }
        } else {
            for (size_t i = at; i < end; i++) {
                uint32_t v;
                memcpy(&v, bytes + 4 * i, 4);
                bad |= (uint32_t)((v & 0x7f800000u) == 0x7f800000u);
            }
        }
        if (!bad) continue;
        for (size_t i = at; i < end; i++) {
            uint32_t v = 0;
            if (t == SF_DTYPE_BF16) {
                uint16_t h;
                memcpy(&h, bytes + 2 * i, 2);
                v = (uint32_t)h << 16;
            } else {
                memcpy(&v, bytes + 4 * i, 4);
            }
            if ((v & 0x7f800000u) == 0x7f800000u) return i;
        }
    }
    return n;
}

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
