/* Byte shuffle (compress/shuffle.h). One pass over the bytes; the width-2 and width-4 loops
 * read one element and write one byte into each of the planes, a pattern GCC and Clang turn
 * into vector permutes at -O2/-O3. */
#include "compress/shuffle.h"

#include <stdint.h>
#include <string.h>

static void shuffle2(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    uint8_t *restrict d0 = d, *restrict d1 = d + n;
    for (size_t i = 0; i < n; i++) {
        d0[i] = s[2 * i];
        d1[i] = s[2 * i + 1];
    }
}

static void unshuffle2(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    const uint8_t *restrict s0 = s, *restrict s1 = s + n;
    for (size_t i = 0; i < n; i++) {
        d[2 * i] = s0[i];
        d[2 * i + 1] = s1[i];
    }
}

static void shuffle4(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    uint8_t *restrict d0 = d, *restrict d1 = d + n, *restrict d2 = d + 2 * n, *restrict d3 = d + 3 * n;
    for (size_t i = 0; i < n; i++) {
        d0[i] = s[4 * i];
        d1[i] = s[4 * i + 1];
        d2[i] = s[4 * i + 2];
        d3[i] = s[4 * i + 3];
    }
}

static void unshuffle4(const uint8_t *restrict s, uint8_t *restrict d, size_t n)
{
    const uint8_t *restrict s0 = s, *restrict s1 = s + n, *restrict s2 = s + 2 * n, *restrict s3 = s + 3 * n;
    for (size_t i = 0; i < n; i++) {
        d[4 * i] = s0[i];
        d[4 * i + 1] = s1[i];
        d[4 * i + 2] = s2[i];
        d[4 * i + 3] = s3[i];
    }
}

void sf_byte_shuffle(const void *src, void *dst, size_t len, size_t width)
{
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (width <= 1 || len < width) {
        if (len) memcpy(d, s, len);
        return;
    }
    size_t n = len / width, whole = n * width;
    if (width == 2) shuffle2(s, d, n);
    else if (width == 4) shuffle4(s, d, n);
    else
        for (size_t b = 0; b < width; b++)
            for (size_t i = 0; i < n; i++) d[b * n + i] = s[i * width + b];
    if (len > whole) memcpy(d + whole, s + whole, len - whole);
}

void sf_byte_unshuffle(const void *src, void *dst, size_t len, size_t width)
{
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (width <= 1 || len < width) {
        if (len) memcpy(d, s, len);
        return;
    }
    size_t n = len / width, whole = n * width;
    if (width == 2) unshuffle2(s, d, n);
    else if (width == 4) unshuffle4(s, d, n);
    else
        for (size_t b = 0; b < width; b++)
            for (size_t i = 0; i < n; i++) d[i * width + b] = s[b * n + i];
    if (len > whole) memcpy(d + whole, s + whole, len - whole);
}
