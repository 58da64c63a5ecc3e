/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of frames. The build
 * targets x86-64-v3, which has SSE4.2's crc32 instruction: 8 bytes per instruction, fast enough
 * that checksumming never shows next to the codecs. The bitwise loop only keeps the file
 * building for a target without it. */
#include <stdint.h>
#include <string.h>

#include "compress/frame.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>

uint32_t sf_crc32c(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t c = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8); /* aligned by the loop above; memcpy keeps it well defined */
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

#else

uint32_t sf_crc32c(uint32_t crc, const void *data, size_t len)
{
    const uint8_t *p = data;
    uint32_t c = ~crc;
    while (len--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

#endif
