/* Frames: the one self-describing unit that crosses a process boundary or lands on disk
 * (SPEC section 8): segments, hidden states, per-stream state and checkpoints.
 *
 * Layout (little-endian, SF_FRAME_HEADER_SIZE = 96 bytes, then payload_bytes of payload):
 *   off size field
 *     0    4 magic "SQF1"
 *     4    2 version (SF_FRAME_VERSION)
 *     6    2 kind (sf_frame_kind)
 *     8    1 dtype (sf_frame_dtype) of the decoded values
 *     9    1 codec (sf_codec)
 *    10    1 quantization (sf_quant_kind; SF_QUANT_F32 = none; only for dtype F32)
 *    11    1 ndim (0..4)
 *    12    4 quantization group (0 when not quantized)
 *    16   32 shape[4] (u64; unused dimensions 0, used ones >= 1; product * dtype size =
 *            decoded bytes)
 *    48    8 stream id
 *    56    8 segment index
 *    64    8 encoded bytes (after quantization, before the codec)
 *    72    8 payload bytes (after the codec: what follows the header)
 *    80    4 flags: bit 0 SF_FRAME_SHUFFLED (see below); every other bit must be 0
 *    84    4 header checksum: CRC-32C of bytes [0, 84)
 *    88    4 payload checksum: CRC-32C of the payload
 *    92    4 reserved, must be 0
 * The header has its own checksum so that a corrupt length is caught before anything is
 * allocated; the payload checksum catches flipped payload bits before the codec runs.
 * Conventions (one valid encoding per content): ndim 0 is an empty frame (no values, encoded
 * and payload bytes 0 whatever the codec); the group field is 0 for f32 and bf16, which have no
 * scales (a decoded header then reports quant.group = 1, valid for compress/quantize.h); an
 * LZ4 payload is one LZ4 block, a zstd payload one zstd frame.
 *
 * Byte shuffle (flag SF_FRAME_SHUFFLED, asked for with sf_frame_desc.shuffle): the encoded
 * bytes are regrouped by byte position within each encoded value (compress/shuffle.h) before
 * the codec, and regrouped back after it. The value's width is that of the encoded bytes: 4 for
 * lossless f32 and for u32, 2 for bf16 quantization; u8 and the 1-byte quantizations (int8,
 * int4, fp8, whose scales and codes are not one array of equal elements) have nothing to
 * shuffle. The shuffle only helps a codec, so it is applied, and the flag set, exactly when
 * asked for, the codec is LZ4 or zstd, the width is 2 or 4 and the frame is not empty;
 * otherwise the request is ignored and the frame is the one without it (a raw frame's payload
 * stays the plain values). The decoder refuses the flag anywhere else, so that each content
 * still has one valid encoding. Frames without the flag are exactly those of earlier builds
 * (same version); a build that predates the flag refuses a shuffled frame by its flags.
 *
 * Decoding validates in this order and refuses with a message naming the field: buffer
 * shorter than a header (SF_E_FRAME_TRUNCATED), magic, header checksum, version (newer or
 * unknown: SF_E_FRAME_VERSION), kind/dtype/codec/quantization/ndim/flags values (an unknown
 * flag bit, or the shuffle flag where it does not apply, is SF_E_FRAME), shape
 * consistency (no overflow; encoded bytes equal what the quantizer produces for the shape),
 * the caller's size limit on decoded and encoded bytes (SF_E_FRAME_TOO_LARGE), payload
 * shorter than payload_bytes (SF_E_FRAME_TRUNCATED), payload checksum, then the codec (its
 * output must be exactly encoded bytes) and the dequantizer. All are SF_E_FRAME* codes (see
 * seqflow/error.h); nothing is allocated before the header has passed every check, and never
 * more than the caller's limit. Memory: sf_frame_decode allocates the values (value_bytes);
 * a quantized or shuffled frame under LZ4 or zstd also needs one scratch of encoded_bytes,
 * freed before returning; each of these is <= max_bytes. (A shuffled bf16 frame uses the
 * destination as working space for the codec's output before the dequantizer fills it.) */
#ifndef SEQFLOW_COMPRESS_FRAME_H
#define SEQFLOW_COMPRESS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "compress/quantize.h"
#include "seqflow/buffer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_FRAME_MAGIC "SQF1"
#define SF_FRAME_VERSION 1
#define SF_FRAME_HEADER_SIZE 96
#define SF_FRAME_MAX_DIMS 4
#define SF_FRAME_SHUFFLED 1u /* header flags bit 0: the payload was byte-shuffled before the codec */

typedef enum sf_frame_kind {
    SF_FRAME_TOKENS = 1,     /* a segment's token ids (u32) */
    SF_FRAME_HIDDEN = 2,     /* hidden states [n, D] */
    SF_FRAME_STATE = 3,      /* one stream's state (memory, global tokens, partial segment) */
    SF_FRAME_CHECKPOINT = 4, /* a whole checkpoint (graph state + input position) */
    SF_FRAME_BLOB = 5        /* opaque bytes (u8) */
} sf_frame_kind;

typedef enum sf_frame_dtype { SF_FRAME_U8 = 1, SF_FRAME_U32 = 2, SF_FRAME_F32 = 3 } sf_frame_dtype;

typedef enum sf_codec { SF_CODEC_RAW = 0, SF_CODEC_LZ4 = 1, SF_CODEC_ZSTD = 2 } sf_codec;

/* What to encode. level: LZ4 1 = fast (default), 2..12 = LZ4-HC level; zstd 1..19
 * (0 = 3). quant applies to dtype F32 only (kind F32 = lossless). shuffle: 1 = byte-shuffle
 * the encoded values before LZ4/zstd where that applies (see above; ignored otherwise), 0 =
 * never (the default; other values are SF_E_INVAL). */
typedef struct sf_frame_desc {
    sf_frame_kind kind;
    sf_frame_dtype dtype;
    int ndim;
    uint64_t shape[SF_FRAME_MAX_DIMS];
    uint64_t stream, segment;
    sf_codec codec;
    int level;
    sf_quant_params quant;
    int shuffle;
} sf_frame_desc;

/* A decoded header (host byte order). */
typedef struct sf_frame_header {
    uint16_t version;
    sf_frame_kind kind;
    sf_frame_dtype dtype;
    sf_codec codec;
    sf_quant_params quant;
    int ndim;
    uint64_t shape[SF_FRAME_MAX_DIMS];
    uint64_t stream, segment;
    uint64_t encoded_bytes, payload_bytes;
    size_t value_bytes; /* decoded bytes: product(shape) * dtype size */
    int shuffled;       /* 1 when the flag SF_FRAME_SHUFFLED is set */
} sf_frame_header;

/* Bytes of one value of dtype (1 or 4); 0 for an unknown dtype. */
size_t sf_frame_dtype_size(sf_frame_dtype dtype);
/* "raw", "lz4", "zstd"; and back (SF_E_INVAL naming the text). */
const char *sf_codec_name(sf_codec codec);
int sf_codec_parse(const char *text, sf_codec *out);

/* Appends one frame holding data (product(shape) values of dtype, data_bytes must match) to
 * out. feedback, when not NULL, turns on error feedback for a lossy quantization (its n must
 * be the value count). Fails with SF_E_INVAL for an inconsistent desc, SF_E_NOMEM, or a
 * quantizer/codec error; out is then unchanged (its length is restored). Feedback on a
 * lossless f32 frame is applied too (it sends x + residual, as sf_quantize_with_feedback does,
 * and so refuses non-finite values); feedback on a u8/u32 frame is SF_E_INVAL. */
int sf_frame_encode(const sf_frame_desc *desc, const void *data, size_t data_bytes,
                    sf_quant_feedback *feedback, sf_buffer *out);

/* Appends only the header of the frame sf_frame_encode would make of data_bytes of data, where
 * that frame's payload is the data as it is (codec raw, unquantized): the frame is the header
 * followed by the data, which the caller sends without copying it. The payload's CRC is left 0
 * for the caller to set (sf_crc32c, sf_frame_header_set_payload_crc) before the frame goes
 * anywhere. SF_E_INVAL for a desc of any other codec or quantization, or an inconsistent one;
 * out unchanged then. */
int sf_frame_encode_header(const sf_frame_desc *desc, size_t data_bytes, sf_buffer *out);
/* Sets the payload CRC of an encoded frame header (SF_FRAME_HEADER_SIZE bytes) and seals the
 * header again (its own CRC). */
void sf_frame_header_set_payload_crc(uint8_t *header, uint32_t crc);

/* Validates the header at buf (len bytes available, at least the header; the payload need not
 * be there yet) against max_bytes (a bound on both decoded and payload bytes) and fills *h.
 * For stream readers: read the header, peek, then read h->payload_bytes more. */
int sf_frame_peek(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h);

/* Decodes the frame at buf[0..len) (len may exceed the frame; *used receives the frame's total
 * size when not NULL) into dst, which must hold h.value_bytes (dst_size >= that). Validates
 * everything first; dst is written only after that, by the codec and dequantizer (a damaged
 * compressed stream found by the codec can leave dst partly written). */
int sf_frame_decode_into(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h,
                         void *dst, size_t dst_size, size_t *used);

/* As sf_frame_decode_into, allocating the values (*out, malloc'd, owned by the caller who
 * frees it with free(); at most max_bytes). */
int sf_frame_decode(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h,
                    void **out, size_t *used);

/* CRC-32C (Castagnoli) of data, continuing from crc (start with 0). */
uint32_t sf_crc32c(uint32_t crc, const void *data, size_t len);
/* The CRC of A followed by B, from crc_a = sf_crc32c(0, A), crc_b = sf_crc32c(0, B) and B's
 * length. */
uint32_t sf_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);
/* sf_crc32c over up to `threads` pieces at once (OpenMP threads; pieces of at least 1 MiB, so
 * that small data stays on the caller's thread): the same value. */
uint32_t sf_crc32c_parallel(uint32_t crc, const void *data, size_t len, int threads);
/* As sf_crc32c_parallel, copying src to dst (which must not overlap it) on the way when dst is
 * not NULL: each piece is checksummed while it is still in the cache from its copy. */
uint32_t sf_crc32c_parallel_copy(uint32_t crc, void *dst, const void *src, size_t len, int threads);

#ifdef __cplusplus
}
#endif
#endif
