/* Packets to bytes and back, for links that cross a process boundary (pipeline/net.h).
 *
 * A packet on the wire is a fixed 64-byte little-endian envelope followed by up to three
 * SPEC-8 frames (compress/frame.h), in this order, each present only when its bit is set in
 * `parts`:
 *   off size field
 *     0    4 magic "SFW1"
 *     4    1 version (SF_WIRE_VERSION)
 *     5    1 packet kind (sf_packet_kind, 1..5)
 *     6    1 rows' dtype: 0 f32, 1 bf16 (sf_dtype; 0 when there are no rows)
 *     7    1 parts: 1 tokens, 2 rows, 4 state
 *     8    4 packet flags (FINAL, PROVISIONAL, ...: carried as they are)
 *    12    4 reserved, 0
 *    16    8 stream
 *    24    8 segment
 *    32    8 position
 *    40    8 n (rows / tokens)
 *    48    8 width
 *    56    4 reserved, 0
 *    60    4 CRC-32C of bytes [0, 60)
 *   tokens: a TOKENS frame, u32, shape [n], the link's codec (and shuffle);
 *   rows:   f32 rows: a HIDDEN frame, f32, shape [n, width], the link's codec, quantization and
 *           shuffle (decoded back to f32); bf16 rows: a HIDDEN frame of u8, shape [n, 2 * width] (the
 *           bit patterns; never quantized again), the link's codec;
 *   state:  a BLOB frame, u8, shape [state_len], the link's codec (checkpoint markers).
 * Every frame's stream and segment fields repeat the envelope's; the message ends exactly
 * after the last frame. Decoding checks all of it (a mismatch, a missing or extra part, a
 * trailing byte is SF_E_FRAME) and allocates nothing before the envelope and each frame's
 * header passed, never more than the caller's limit per part.
 *
 * Error feedback (compress/quantize.h) for lossy links is kept per stream in an
 * sf_wire_feedback: a packet's f32 rows are sent as rows + the stream's residual when the
 * residual has the same size (a packet of another size starts from zero); provisional packets
 * (their rows come again) are sent without it; a FINAL packet drops its stream's residual, so
 * that memory follows the streams alive. */
#ifndef SEQFLOW_PIPELINE_WIRE_H
#define SEQFLOW_PIPELINE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "compress/frame.h"
#include "compress/quantize.h"
#include "seqflow/buffer.h"
#include "seqflow/packet.h"

#define SF_WIRE_MAGIC "SFW1"
#define SF_WIRE_VERSION 1
#define SF_WIRE_HEADER_SIZE 64

typedef struct sf_wire_options {
    sf_codec codec;
    int level;             /* the codec's level (compress/frame.h) */
    sf_quant_kind quant;   /* f32 rows only; SF_QUANT_F32 = lossless */
    int group;             /* 0 = the row width (rounded up to even for int4) */
    int shuffle;           /* 1 = byte-shuffle each frame before LZ4/zstd where its values have
                              2 or 4 bytes (compress/frame.h: f32 rows, bf16-quantized rows, token
                              ids; not bf16 rows, which travel as u8); 0 = off, the default */
} sf_wire_options;

typedef struct sf_wire_feedback sf_wire_feedback;

/* An empty residual store (SF_E_NOMEM). Free with sf_wire_feedback_free (NULL accepted). */
int sf_wire_feedback_create(sf_wire_feedback **out);
void sf_wire_feedback_free(sf_wire_feedback *f);
/* Streams with a residual held, and the bytes those residuals take. */
size_t sf_wire_feedback_streams(const sf_wire_feedback *f, size_t *bytes);

/* Appends p's encoding to out (out unchanged on failure). p must have host rows (p->dev NULL:
 * SF_E_INVAL otherwise). feedback NULL = none; it is used only for lossy quantization of f32
 * rows. Fails with SF_E_INVAL (a non-finite value under int8/int4/fp8 or with feedback), or
 * SF_E_NOMEM. */
int sf_wire_encode(const sf_packet *p, const sf_wire_options *o, sf_wire_feedback *feedback,
                   sf_buffer *out);

/* For a packet of rows alone (no tokens, no state) on a raw, lossless link: appends everything
 * of sf_wire_encode's bytes up to the rows themselves (envelope and the rows frame's header) to
 * out, and points *rows, *rows_len at the packet's rows, whose bytes end the encoding as they
 * are: the caller sends them without a copy (and keeps p alive until they are sent). The rows'
 * CRC is left to the caller, who computes it (sf_crc32c) and sets it with
 * sf_frame_header_set_payload_crc on the frame header, the last SF_FRAME_HEADER_SIZE bytes
 * appended. A packet whose rows are still on the device (p->dev) is taken too, its host rows
 * reserved (sf_packet_reserve): *rows points at them, to be filled (sf_packet_to_host) before
 * anything reads them. SF_E_UNSUPPORTED for any other packet (encode it whole), SF_E_INVAL or
 * SF_E_NOMEM; out unchanged on failure. */
int sf_wire_encode_head(const sf_packet *p, sf_buffer *out, const void **rows, size_t *rows_len);

/* Decodes exactly len bytes into a new packet (*out, the caller's: sf_packet_free). max_bytes
 * bounds each part's decoded and encoded bytes (SF_E_FRAME_TOO_LARGE beyond it). Errors are
 * SF_E_FRAME* (naming the field) or SF_E_NOMEM; *out is then NULL. */
int sf_wire_decode(const uint8_t *buf, size_t len, size_t max_bytes, sf_packet **out);

#endif
