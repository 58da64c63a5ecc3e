/* Byte shuffle: the filter Blosc and HDF5 call "shuffle". It regroups an array of fixed-size
 * elements by byte position, so that byte 0 of every element comes first, then byte 1 of
 * every element, and so on. Float32 state is noisy in its low mantissa bytes but nearly
 * constant in its sign/exponent byte; after the shuffle that byte forms one long, repetitive
 * run, which LZ4 and zstd find where they found nothing in the interleaved bytes. Frames
 * (compress/frame.h) apply it before the codec when asked to.
 *
 * Layout: for len bytes of elements of `width` bytes, n = len / width whole elements,
 *   dst[b * n + i] = src[i * width + b]   for b < width, i < n,
 * followed by the len % width bytes of an incomplete last element, copied as they are (as
 * Blosc does). sf_byte_unshuffle is its exact inverse. width 0 or 1 is a plain copy.
 *
 * Both are plain loops (no allocation, no failure); src and dst must not overlap. Widths 2
 * and 4 (bf16, float32, u32) have their own loops, which the compiler vectorizes; any other
 * width uses the generic one. */
#ifndef SEQFLOW_COMPRESS_SHUFFLE_H
#define SEQFLOW_COMPRESS_SHUFFLE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void sf_byte_shuffle(const void *src, void *dst, size_t len, size_t width);
void sf_byte_unshuffle(const void *src, void *dst, size_t len, size_t width);

#ifdef __cplusplus
}
#endif
#endif
