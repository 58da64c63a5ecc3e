/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of frames. Every frame
 * that crosses a link or lands on disk is checksummed twice per hop (written, then checked), so
 * its speed is a link's speed: on x86-64 with SSE4.2 (every x86-64 CPU since 2008) the crc32
 * instruction, picked at run time so that a portable build uses it too, over three interleaved
 * streams (the instruction's latency is 3 cycles, its throughput 1: about 20 GB/s); elsewhere a
 * slicing-by-8 table (about 1-2 GB/s). */
#include <stdint.h>
#include <string.h>
#include <omp.h>

#include "compress/frame.h"

/* ---- portable: slicing-by-8 ------------------------------------------------------------------ */
static uint32_t table[8][256];

static void make_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_table(uint32_t c, const uint8_t *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo), hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
            table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^ table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return c;
}

/* ---- x86-64: the crc32 instruction ----------------------------------------------------------- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

#define CRC_BLOCK 4096 /* bytes of each of the three streams per round */

/* The CRC state after CRC_BLOCK zero bytes is linear in the state before: one table per byte
 * of the state (made once from the slow byte-by-byte shift). */
static uint32_t shift_table[4][256];

static uint32_t shift_slow(uint32_t c, size_t bytes)
{
    while (bytes--) c = (c >> 8) ^ table[0][c & 0xff];
    return c;
}

static void make_shift_table(void)
{
    for (int k = 0; k < 4; k++)
        for (uint32_t v = 0; v < 256; v++) shift_table[k][v] = shift_slow(v << (8 * k), CRC_BLOCK);
}

static uint32_t shift_block(uint32_t c)
{
    return shift_table[0][c & 0xff] ^ shift_table[1][(c >> 8) & 0xff] ^ shift_table[2][(c >> 16) & 0xff] ^
           shift_table[3][c >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c32, const uint8_t *p, size_t len)
{
    uint64_t c = c32;
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    /* three independent streams of CRC_BLOCK bytes, joined by shifting the first two over the
     * bytes that follow them */
    while (len >= 3 * CRC_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const uint8_t *q = p + CRC_BLOCK, *r = p + 2 * CRC_BLOCK;
        for (size_t i = 0; i < CRC_BLOCK; i += 8) {
            uint64_t a, b, d;
            memcpy(&a, p + i, 8);
            memcpy(&b, q + i, 8);
            memcpy(&d, r + i, 8);
            c = _mm_crc32_u64(c, a);
            c1 = _mm_crc32_u64(c1, b);
            c2 = _mm_crc32_u64(c2, d);
        }
        c = shift_block((uint32_t)c) ^ (uint32_t)c1;
        c = shift_block((uint32_t)c) ^ (uint32_t)c2;
        p += 3 * CRC_BLOCK;
        len -= 3 * CRC_BLOCK;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t c, const uint8_t *p, size_t len);

static crc_fn pick(void)
{
    make_table();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        make_shift_table();
        return crc_sse42;
    }
#endif
    return crc_table;
}

uint32_t sf_crc32c(uint32_t crc, const void *data, size_t len)
{
    /* chosen once; a race of two first calls picks the same function twice */
    static crc_fn fn;
    crc_fn f = __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
    if (!f) {
        f = pick();
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
    }
    return ~f(~crc, (const uint8_t *)data, len);
}

/* ---- joining CRCs of consecutive pieces ---------------------------------------------------- */

#define POLY 0x82F63B78u

/* a * b modulo the polynomial, in the reflected bit order (bit 31 is x^0) */
static uint32_t mul_mod(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) product ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return product;
}

/* x^(8 n) modulo the polynomial: n zero bytes' worth of shifting, by squaring */
static uint32_t shift_bytes(size_t n)
{
    uint32_t result = 1u << 31, power = 1u << 23; /* x^0; x^8 */
    for (; n; n >>= 1) {
        if (n & 1) result = mul_mod(power, result);
        power = mul_mod(power, power);
    }
    return result;
}

uint32_t sf_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b)
{
    /* the pre- and post-inversions cancel: crc(A B) = crc(A) x^(8 |B|) + crc(B) */
    return mul_mod(shift_bytes(len_b), crc_a) ^ crc_b;
}

#define PARALLEL_PIECE ((size_t)1 << 20) /* below this a thread's start costs more than it saves */

/* Copies len bytes from src to dst (when dst is not NULL) and gives their CRC: in blocks that
 * stay in the cache between the copy and the CRC, so that the bytes are read from memory once. */
static uint32_t crc_copy(uint32_t crc, void *dst, const void *src, size_t len)
{
    if (!dst) return sf_crc32c(crc, src, len);
    const size_t block = (size_t)64 << 10;
    for (size_t at = 0; at < len; at += block) {
        const size_t n = len - at < block ? len - at : block;
        memcpy((uint8_t *)dst + at, (const uint8_t *)src + at, n);
        crc = sf_crc32c(crc, (const uint8_t *)dst + at, n);
    }
    return crc;
}

uint32_t sf_crc32c_parallel_copy(uint32_t crc, void *dst, const void *src, size_t len, int threads)
{
    size_t pieces = len / PARALLEL_PIECE;
    if (pieces > (size_t)threads) pieces = (size_t)threads;
    if (pieces > 64) pieces = 64;
    if (pieces < 2) return crc_copy(crc, dst, src, len);
    const uint8_t *p = src;
    const size_t step = (len / pieces + 63) & ~(size_t)63;
    uint32_t part[64];
#pragma omp parallel for num_threads((int)pieces) schedule(static, 1)
    for (size_t i = 0; i < pieces; i++) {
        const size_t at = i * step, n = i + 1 < pieces ? step : len - at;
        part[i] = crc_copy(0, dst ? (uint8_t *)dst + at : NULL, p + at, n);
    }
    for (size_t i = 0; i < pieces; i++) crc = sf_crc32c_combine(crc, part[i], i + 1 < pieces ? step : len - i * step);
    return crc;
}

uint32_t sf_crc32c_parallel(uint32_t crc, const void *data, size_t len, int threads)
{
    return sf_crc32c_parallel_copy(crc, NULL, data, len, threads);
}
