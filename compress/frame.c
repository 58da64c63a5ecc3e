/* Frames (SPEC section 8): header layout and validation order are stated in compress/frame.h.
 * The decoder trusts nothing in a header until its checksum, every value and every size
 * relation has been checked, so that a hostile or damaged frame costs at most max_bytes of
 * memory and a clear error. */
#include "compress/frame.h"

#include <limits.h>
#include <lz4.h>
#include <lz4hc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "compress/shuffle.h"
#include "seqflow/error.h"

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_KIND = 6,
    OFF_DTYPE = 8,
    OFF_CODEC = 9,
    OFF_QUANT = 10,
    OFF_NDIM = 11,
    OFF_GROUP = 12,
    OFF_SHAPE = 16,
    OFF_STREAM = 48,
    OFF_SEGMENT = 56,
    OFF_ENCODED = 64,
    OFF_PAYLOAD = 72,
    OFF_FLAGS = 80,
    OFF_HEADER_CRC = 84,
    OFF_PAYLOAD_CRC = 88,
    OFF_RESERVED = 92
};

#define ZSTD_LEVEL_MAX 19

/* Byte shifts keep the wire little-endian whatever the host. */
static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

size_t sf_frame_dtype_size(sf_frame_dtype dtype)
{
    switch (dtype) {
    case SF_FRAME_U8: return 1;
    case SF_FRAME_U32: return 4;
    case SF_FRAME_F32: return 4;
    }
    return 0;
}

const char *sf_codec_name(sf_codec codec)
{
    switch (codec) {
    case SF_CODEC_RAW: return "raw";
    case SF_CODEC_LZ4: return "lz4";
    case SF_CODEC_ZSTD: return "zstd";
    }
    return "unknown";
}

int sf_codec_parse(const char *text, sf_codec *out)
{
    if (!out) return sf_error(SF_E_INVAL, "codec: no output given");
    static const sf_codec all[] = {SF_CODEC_RAW, SF_CODEC_LZ4, SF_CODEC_ZSTD};
    for (size_t i = 0; text && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(text, sf_codec_name(all[i])) == 0) {
            *out = all[i];
            return SF_OK;
        }
    return sf_error(SF_E_INVAL, "codec '%s' unknown (expected raw, lz4 or zstd)", text ? text : "(null)");
}

static int quant_uses_group(int kind)
{
    return kind == SF_QUANT_INT8 || kind == SF_QUANT_INT4 || kind == SF_QUANT_FP8_E4M3;
}

/* The parameters handed to the quantizer: f32 and bf16 ignore the group but the quantizer
 * still wants it >= 1. */
static sf_quant_params quant_normalized(sf_quant_params q)
{
    if (!quant_uses_group(q.kind)) q.group = 1;
    return q;
}

/* Encoded bytes for n values (lossless: the values themselves). 0 = invalid for n > 0. */
static uint64_t encoded_size_for(sf_frame_dtype dtype, const sf_quant_params *q, uint64_t n, uint64_t value_bytes)
{
    if (n == 0) return 0;
    if (dtype != SF_FRAME_F32 || q->kind == SF_QUANT_F32) return value_bytes;
    return sf_quant_encoded_size(q, (size_t)n);
}

/* Bytes of one encoded value, the element the shuffle regroups by: 4 for lossless f32 and u32,
 * 2 for bf16 codes, 1 (nothing to shuffle) for u8 and the int8/int4/fp8 layouts of scales
 * followed by codes. */
static size_t shuffle_width(sf_frame_dtype dtype, sf_quant_kind quant)
{
    if (dtype == SF_FRAME_F32) return quant == SF_QUANT_F32 ? 4 : quant == SF_QUANT_BF16 ? 2 : 1;
    return sf_frame_dtype_size(dtype);
}

/* Whether a frame of these fields is shuffled when asked: only a codec gains from it, and only
 * values of more than one byte have byte positions to regroup. */
static int shuffle_applies(sf_frame_dtype dtype, sf_quant_kind quant, sf_codec codec, uint64_t n)
{
    return codec != SF_CODEC_RAW && n && shuffle_width(dtype, quant) > 1;
}

/* The largest payload codec makes of encoded bytes (> 0); 0 when the codec cannot carry that
 * many. Encoder and decoder share it so that they agree on which sizes are possible. */
static size_t codec_bound(sf_codec codec, uint64_t encoded)
{
    switch (codec) {
    case SF_CODEC_RAW: return (size_t)encoded;
    case SF_CODEC_LZ4:
        return encoded > LZ4_MAX_INPUT_SIZE ? 0 : (size_t)LZ4_compressBound((int)encoded);
    case SF_CODEC_ZSTD: {
        size_t bound = ZSTD_compressBound((size_t)encoded);
        return ZSTD_isError(bound) ? 0 : bound;
    }
    }
    return 0;
}

static int buffer_reserve(sf_buffer *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len) return sf_error(SF_E_NOMEM, "frame: output buffer too large");
    size_t need = b->len + extra;
    if (need <= b->cap) return SF_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) return sf_error(SF_E_NOMEM, "frame: out of memory reserving %zu bytes", need);
    b->data = d;
    b->cap = cap;
    return SF_OK;
}

/* ---- encoding ------------------------------------------------------------------------------ */

static int check_desc(const sf_frame_desc *d, uint64_t *n_out)
{
    if (d->kind < SF_FRAME_TOKENS || d->kind > SF_FRAME_BLOB)
        return sf_error(SF_E_INVAL, "frame encode: kind %d unknown", (int)d->kind);
    if (!sf_frame_dtype_size(d->dtype)) return sf_error(SF_E_INVAL, "frame encode: dtype %d unknown", (int)d->dtype);
    if (d->ndim < 0 || d->ndim > SF_FRAME_MAX_DIMS)
        return sf_error(SF_E_INVAL, "frame encode: ndim %d outside 0..%d", d->ndim, SF_FRAME_MAX_DIMS);
    uint64_t n = d->ndim ? 1 : 0;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] == 0) return sf_error(SF_E_INVAL, "frame encode: shape[%d] is 0", i);
        if (n > UINT64_MAX / d->shape[i]) return sf_error(SF_E_INVAL, "frame encode: shape overflows");
        n *= d->shape[i];
    }
    switch (d->codec) {
    case SF_CODEC_RAW: break;
    case SF_CODEC_LZ4:
        if (d->level < 0 || d->level > LZ4HC_CLEVEL_MAX)
            return sf_error(SF_E_INVAL, "frame encode: lz4 level %d outside 0..%d", d->level, LZ4HC_CLEVEL_MAX);
        break;
    case SF_CODEC_ZSTD:
        if (d->level < 0 || d->level > ZSTD_LEVEL_MAX)
            return sf_error(SF_E_INVAL, "frame encode: zstd level %d outside 0..%d", d->level, ZSTD_LEVEL_MAX);
        break;
    default: return sf_error(SF_E_INVAL, "frame encode: codec %d unknown", (int)d->codec);
    }
    if (d->quant.kind < SF_QUANT_F32 || d->quant.kind > SF_QUANT_FP8_E4M3)
        return sf_error(SF_E_INVAL, "frame encode: quantization %d unknown", (int)d->quant.kind);
    if (d->dtype != SF_FRAME_F32 && d->quant.kind != SF_QUANT_F32)
        return sf_error(SF_E_INVAL, "frame encode: quantization applies to dtype f32 only");
    if (quant_uses_group(d->quant.kind) &&
        (d->quant.group < 1 || (d->quant.kind == SF_QUANT_INT4 && d->quant.group % 2)))
        return sf_error(SF_E_INVAL, "frame encode: quantization group %d invalid (>= 1, even for int4)",
                        d->quant.group);
    if (d->shuffle != 0 && d->shuffle != 1)
        return sf_error(SF_E_INVAL, "frame encode: shuffle %d is neither 0 nor 1", d->shuffle);
    *n_out = n;
    return SF_OK;
}

/* The 96-byte header (SF_FRAME_HEADER_SIZE) of a frame whose payload has been made. */
static void put_header(uint8_t *header, const sf_frame_desc *desc, sf_quant_params q, uint64_t encoded,
                       size_t payload_bytes, int shuffled, uint32_t payload_crc)
{
    memset(header, 0, SF_FRAME_HEADER_SIZE);
    memcpy(header + OFF_MAGIC, SF_FRAME_MAGIC, 4);
    put_u16(header + OFF_VERSION, SF_FRAME_VERSION);
    put_u16(header + OFF_KIND, (uint16_t)desc->kind);
    header[OFF_DTYPE] = (uint8_t)desc->dtype;
    header[OFF_CODEC] = (uint8_t)desc->codec;
    header[OFF_QUANT] = (uint8_t)q.kind;
    header[OFF_NDIM] = (uint8_t)desc->ndim;
    put_u32(header + OFF_GROUP, quant_uses_group(q.kind) ? (uint32_t)q.group : 0);
    for (int i = 0; i < desc->ndim; i++) put_u64(header + OFF_SHAPE + 8 * i, desc->shape[i]);
    put_u64(header + OFF_STREAM, desc->stream);
    put_u64(header + OFF_SEGMENT, desc->segment);
    put_u64(header + OFF_ENCODED, encoded);
    put_u64(header + OFF_PAYLOAD, payload_bytes);
    put_u32(header + OFF_FLAGS, shuffled ? SF_FRAME_SHUFFLED : 0);
    put_u32(header + OFF_PAYLOAD_CRC, payload_crc);
    put_u32(header + OFF_HEADER_CRC, sf_crc32c(0, header, OFF_HEADER_CRC));
}

int sf_frame_encode(const sf_frame_desc *desc, const void *data, size_t data_bytes,
                    sf_quant_feedback *feedback, sf_buffer *out)
{
    if (!desc || !out) return sf_error(SF_E_INVAL, "frame encode: desc and out are required");
    uint64_t n = 0;
    int rc = check_desc(desc, &n);
    if (rc) return rc;
    size_t dsize = sf_frame_dtype_size(desc->dtype);
    if (n > SIZE_MAX / dsize) return sf_error(SF_E_INVAL, "frame encode: shape too large");
    size_t value_bytes = (size_t)n * dsize;
    if (data_bytes != value_bytes)
        return sf_error(SF_E_INVAL, "frame encode: %zu data bytes for a shape of %zu bytes", data_bytes, value_bytes);
    if (!data && value_bytes) return sf_error(SF_E_INVAL, "frame encode: no data");

    sf_quant_params q = quant_normalized(desc->quant);
    int lossy = desc->dtype == SF_FRAME_F32 && q.kind != SF_QUANT_F32;
    int quantize = desc->dtype == SF_FRAME_F32 && n && (lossy || feedback);
    if (feedback && desc->dtype != SF_FRAME_F32)
        return sf_error(SF_E_INVAL, "frame encode: error feedback needs dtype f32");
    if (feedback && (feedback->n != n || (n && !feedback->residual)))
        return sf_error(SF_E_INVAL, "frame encode: feedback holds %zu values, the frame %llu", feedback->n,
                        (unsigned long long)n);
    uint64_t encoded = encoded_size_for(desc->dtype, &q, n, value_bytes);
    if (n && !encoded) return sf_error(SF_E_INVAL, "frame encode: quantized size does not fit");

    size_t bound = n ? codec_bound(desc->codec, encoded) : 0;
    if (n && !bound)
        return sf_error(SF_E_INVAL, "frame encode: %llu bytes are more than %s carries",
                        (unsigned long long)encoded, sf_codec_name(desc->codec));
    if (bound > SIZE_MAX - SF_FRAME_HEADER_SIZE) return sf_error(SF_E_NOMEM, "frame encode: too large");
    if ((rc = buffer_reserve(out, SF_FRAME_HEADER_SIZE + bound))) return rc;
    uint8_t *header = out->data + out->len, *payload = header + SF_FRAME_HEADER_SIZE;

    /* Quantizing is the only step that can fail on the data, so it runs before anything is
     * committed; the codecs cannot fail into a buffer of their bound. The codec's input is the
     * data, or the quantized codes, or either shuffled: one scratch holds whichever is not
     * already in place (a shuffled frame quantizes into the payload area, which the bound
     * makes large enough, then shuffles into the scratch). */
    const int shuffled = desc->shuffle && shuffle_applies(desc->dtype, q.kind, desc->codec, n);
    const uint8_t *enc = data;
    uint8_t *scratch = NULL;
    if ((quantize && desc->codec != SF_CODEC_RAW) || shuffled) {
        if (!(scratch = malloc((size_t)encoded)))
            return sf_error(SF_E_NOMEM, "frame encode: out of memory (%llu bytes)", (unsigned long long)encoded);
    }
    if (quantize) {
        uint8_t *qdst = desc->codec == SF_CODEC_RAW || shuffled ? payload : scratch;
        rc = feedback ? sf_quantize_with_feedback(&q, feedback, data, (size_t)n, qdst, (size_t)encoded)
                      : sf_quantize(&q, data, (size_t)n, qdst, (size_t)encoded);
        if (rc) {
            free(scratch);
            return rc;
        }
        enc = qdst;
    }
    if (shuffled) {
        sf_byte_shuffle(enc, scratch, (size_t)encoded, shuffle_width(desc->dtype, q.kind));
        enc = scratch;
    }

    size_t payload_bytes = 0;
    if (n) {
        switch (desc->codec) {
        case SF_CODEC_RAW:
            if (enc != payload) memcpy(payload, enc, (size_t)encoded);
            payload_bytes = (size_t)encoded;
            break;
        case SF_CODEC_LZ4: {
            int r = desc->level <= 1
                        ? LZ4_compress_fast((const char *)enc, (char *)payload, (int)encoded, (int)bound, 1)
                        : LZ4_compress_HC((const char *)enc, (char *)payload, (int)encoded, (int)bound, desc->level);
            if (r <= 0) rc = sf_error(SF_E_INVAL, "frame encode: lz4 compression failed");
            payload_bytes = r > 0 ? (size_t)r : 0;
            break;
        }
        case SF_CODEC_ZSTD: {
            size_t r = ZSTD_compress(payload, bound, enc, (size_t)encoded, desc->level ? desc->level : 3);
            if (ZSTD_isError(r)) rc = sf_error(SF_E_INVAL, "frame encode: zstd: %s", ZSTD_getErrorName(r));
            else payload_bytes = r;
            break;
        }
        }
    }
    free(scratch);
    if (rc) return rc;

    put_header(header, desc, q, encoded, payload_bytes, shuffled, sf_crc32c(0, payload, payload_bytes));
    out->len += SF_FRAME_HEADER_SIZE + payload_bytes;
    return SF_OK;
}

void sf_frame_header_set_payload_crc(uint8_t *header, uint32_t crc)
{
    put_u32(header + OFF_PAYLOAD_CRC, crc);
    put_u32(header + OFF_HEADER_CRC, sf_crc32c(0, header, OFF_HEADER_CRC));
}

int sf_frame_encode_header(const sf_frame_desc *desc, size_t data_bytes, sf_buffer *out)
{
    if (!desc || !out) return sf_error(SF_E_INVAL, "frame encode: desc and out are required");
    uint64_t n = 0;
    int rc = check_desc(desc, &n);
    if (rc) return rc;
    const sf_quant_params q = quant_normalized(desc->quant);
    const size_t dsize = sf_frame_dtype_size(desc->dtype);
    if (desc->codec != SF_CODEC_RAW || (desc->dtype == SF_FRAME_F32 && q.kind != SF_QUANT_F32) ||
        (desc->shuffle && shuffle_applies(desc->dtype, q.kind, desc->codec, n)))
        return sf_error(SF_E_INVAL, "frame encode: a header alone is for raw, unquantized, unshuffled frames");
    if (n > SIZE_MAX / dsize || data_bytes != (size_t)n * dsize)
        return sf_error(SF_E_INVAL, "frame encode: %zu data bytes for a shape of %llu values", data_bytes,
                        (unsigned long long)n);
    if ((rc = buffer_reserve(out, SF_FRAME_HEADER_SIZE))) return rc;
    put_header(out->data + out->len, desc, q, data_bytes, data_bytes, 0, 0); /* the payload's CRC: the caller's */
    out->len += SF_FRAME_HEADER_SIZE;
    return SF_OK;
}

/* ---- decoding ------------------------------------------------------------------------------ */

static int parse_header(const uint8_t *b, size_t len, size_t max_bytes, sf_frame_header *h)
{
    if (!b || len < SF_FRAME_HEADER_SIZE)
        return sf_error(SF_E_FRAME_TRUNCATED, "frame: %zu bytes, shorter than the %d-byte header", b ? len : 0,
                        SF_FRAME_HEADER_SIZE);
    if (memcmp(b + OFF_MAGIC, SF_FRAME_MAGIC, 4) != 0)
        return sf_error(SF_E_FRAME, "frame: magic is not \"%s\" (not a seqflow frame)", SF_FRAME_MAGIC);
    uint32_t stored = get_u32(b + OFF_HEADER_CRC), computed = sf_crc32c(0, b, OFF_HEADER_CRC);
    if (stored != computed)
        return sf_error(SF_E_FRAME, "frame: header checksum 0x%08x does not match the header (0x%08x)",
                        (unsigned)stored, (unsigned)computed);
    unsigned version = get_u16(b + OFF_VERSION);
    if (version != SF_FRAME_VERSION)
        return sf_error(SF_E_FRAME_VERSION, "frame: version %u is %s (this build reads version %d)", version,
                        version > SF_FRAME_VERSION ? "newer than supported" : "unknown", SF_FRAME_VERSION);
    unsigned kind = get_u16(b + OFF_KIND), dtype = b[OFF_DTYPE], codec = b[OFF_CODEC], quant = b[OFF_QUANT];
    unsigned ndim = b[OFF_NDIM];
    uint32_t group = get_u32(b + OFF_GROUP);
    if (kind < SF_FRAME_TOKENS || kind > SF_FRAME_BLOB) return sf_error(SF_E_FRAME, "frame: kind %u unknown", kind);
    if (!sf_frame_dtype_size((sf_frame_dtype)dtype)) return sf_error(SF_E_FRAME, "frame: dtype %u unknown", dtype);
    if (codec > SF_CODEC_ZSTD) return sf_error(SF_E_FRAME, "frame: codec %u unknown", codec);
    if (quant > SF_QUANT_FP8_E4M3) return sf_error(SF_E_FRAME, "frame: quantization %u unknown", quant);
    if (quant != SF_QUANT_F32 && dtype != SF_FRAME_F32)
        return sf_error(SF_E_FRAME, "frame: quantization %u on dtype %u (only f32 is quantized)", quant, dtype);
    if (ndim > SF_FRAME_MAX_DIMS) return sf_error(SF_E_FRAME, "frame: ndim %u above %d", ndim, SF_FRAME_MAX_DIMS);
    if (quant_uses_group((int)quant)) {
        if (group < 1 || group > INT_MAX || (quant == SF_QUANT_INT4 && group % 2))
            return sf_error(SF_E_FRAME, "frame: quantization group %u invalid", (unsigned)group);
    } else if (group != 0) {
        return sf_error(SF_E_FRAME, "frame: quantization group %u must be 0 without scales", (unsigned)group);
    }
    uint32_t flags = get_u32(b + OFF_FLAGS);
    if (flags & ~SF_FRAME_SHUFFLED)
        return sf_error(SF_E_FRAME, "frame: flags 0x%08x has unknown bits (only 0x%x, shuffled, is defined)",
                        (unsigned)flags, SF_FRAME_SHUFFLED);
    /* ndim 0 is the one empty shape (a used dimension is >= 1, checked below). */
    if ((flags & SF_FRAME_SHUFFLED) &&
        !shuffle_applies((sf_frame_dtype)dtype, (sf_quant_kind)quant, (sf_codec)codec, ndim))
        return sf_error(SF_E_FRAME, "frame: shuffle flag on a frame that is never shuffled (%s codec, %zu-byte values%s)",
                        sf_codec_name((sf_codec)codec), shuffle_width((sf_frame_dtype)dtype, (sf_quant_kind)quant),
                        ndim ? "" : ", empty");
    if (get_u32(b + OFF_RESERVED) != 0) return sf_error(SF_E_FRAME, "frame: reserved bytes 92..95 not 0");

    uint64_t n = ndim ? 1 : 0;
    for (unsigned i = 0; i < SF_FRAME_MAX_DIMS; i++) {
        uint64_t s = get_u64(b + OFF_SHAPE + 8 * i);
        h->shape[i] = s;
        if (i >= ndim) {
            if (s != 0) return sf_error(SF_E_FRAME, "frame: shape[%u] = %llu beyond ndim %u", i, (unsigned long long)s, ndim);
            continue;
        }
        if (s == 0) return sf_error(SF_E_FRAME, "frame: shape[%u] is 0", i);
        if (n > UINT64_MAX / s) return sf_error(SF_E_FRAME, "frame: shape overflows 64 bits");
        n *= s;
    }
    size_t dsize = sf_frame_dtype_size((sf_frame_dtype)dtype);
    if (n > UINT64_MAX / dsize || n * dsize > SIZE_MAX)
        return sf_error(SF_E_FRAME, "frame: shape of %llu values overflows the size", (unsigned long long)n);
    uint64_t value_bytes = n * dsize;
    sf_quant_params q = {(sf_quant_kind)quant, quant_uses_group((int)quant) ? (int)group : 1};
    uint64_t expected = encoded_size_for((sf_frame_dtype)dtype, &q, n, value_bytes);
    if (n && !expected) return sf_error(SF_E_FRAME, "frame: quantized size of the shape overflows");
    uint64_t encoded = get_u64(b + OFF_ENCODED), payload = get_u64(b + OFF_PAYLOAD);
    if (encoded != expected)
        return sf_error(SF_E_FRAME, "frame: encoded bytes %llu, the shape and quantization give %llu",
                        (unsigned long long)encoded, (unsigned long long)expected);

    if (value_bytes > max_bytes)
        return sf_error(SF_E_FRAME_TOO_LARGE, "frame: decoded size %llu bytes exceeds the limit of %zu",
                        (unsigned long long)value_bytes, max_bytes);
    if (encoded > max_bytes)
        return sf_error(SF_E_FRAME_TOO_LARGE, "frame: encoded bytes %llu exceed the limit of %zu",
                        (unsigned long long)encoded, max_bytes);
    if (payload > max_bytes)
        return sf_error(SF_E_FRAME_TOO_LARGE, "frame: payload bytes %llu exceed the limit of %zu",
                        (unsigned long long)payload, max_bytes);

    /* Sizes are now within max_bytes (a size_t), so the casts below are exact. */
    if (encoded == 0 && payload != 0)
        return sf_error(SF_E_FRAME, "frame: payload bytes %llu for an empty frame", (unsigned long long)payload);
    if (encoded) {
        size_t bound = codec_bound((sf_codec)codec, encoded);
        if (!bound)
            return sf_error(SF_E_FRAME, "frame: encoded bytes %llu are more than %s carries",
                            (unsigned long long)encoded, sf_codec_name((sf_codec)codec));
        if (payload == 0 || payload > bound || (codec == SF_CODEC_RAW && payload != encoded))
            return sf_error(SF_E_FRAME, "frame: payload bytes %llu impossible for %llu encoded bytes under %s",
                            (unsigned long long)payload, (unsigned long long)encoded,
                            sf_codec_name((sf_codec)codec));
    }
    if (payload > SIZE_MAX - SF_FRAME_HEADER_SIZE) return sf_error(SF_E_FRAME, "frame: payload bytes overflow");

    h->version = (uint16_t)version;
    h->kind = (sf_frame_kind)kind;
    h->dtype = (sf_frame_dtype)dtype;
    h->codec = (sf_codec)codec;
    h->quant = q;
    h->ndim = (int)ndim;
    h->stream = get_u64(b + OFF_STREAM);
    h->segment = get_u64(b + OFF_SEGMENT);
    h->encoded_bytes = encoded;
    h->payload_bytes = payload;
    h->value_bytes = (size_t)value_bytes;
    h->shuffled = (flags & SF_FRAME_SHUFFLED) != 0;
    return SF_OK;
}

int sf_frame_peek(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h)
{
    sf_frame_header local;
    return parse_header(buf, len, max_bytes, h ? h : &local);
}

/* Header, presence of the whole payload and its checksum: everything short of running the
 * codec. */
static int validate_frame(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h)
{
    int rc = parse_header(buf, len, max_bytes, h);
    if (rc) return rc;
    size_t have = len - SF_FRAME_HEADER_SIZE;
    if (have < h->payload_bytes)
        return sf_error(SF_E_FRAME_TRUNCATED, "frame: payload truncated (%zu of %llu bytes present)", have,
                        (unsigned long long)h->payload_bytes);
    const uint8_t *payload = buf + SF_FRAME_HEADER_SIZE;
    uint32_t stored = get_u32(buf + OFF_PAYLOAD_CRC), computed = sf_crc32c(0, payload, (size_t)h->payload_bytes);
    if (stored != computed)
        return sf_error(SF_E_FRAME, "frame: payload checksum 0x%08x does not match the payload (0x%08x)",
                        (unsigned)stored, (unsigned)computed);
    return SF_OK;
}

/* Runs the codec into out (exactly encoded bytes). */
static int run_codec(const sf_frame_header *h, const uint8_t *payload, uint8_t *out)
{
    size_t encoded = (size_t)h->encoded_bytes, payload_bytes = (size_t)h->payload_bytes;
    switch (h->codec) {
    case SF_CODEC_RAW: memcpy(out, payload, encoded); return SF_OK;
    case SF_CODEC_LZ4: {
        int r = LZ4_decompress_safe((const char *)payload, (char *)out, (int)payload_bytes, (int)encoded);
        if (r < 0 || (size_t)r != encoded)
            return sf_error(SF_E_FRAME, "frame: lz4 payload is corrupt (decoded %d of %zu bytes)", r, encoded);
        return SF_OK;
    }
    case SF_CODEC_ZSTD: {
        size_t r = ZSTD_decompress(out, encoded, payload, payload_bytes);
        if (ZSTD_isError(r)) return sf_error(SF_E_FRAME, "frame: zstd payload is corrupt (%s)", ZSTD_getErrorName(r));
        if (r != encoded) return sf_error(SF_E_FRAME, "frame: zstd payload decoded to %zu of %zu bytes", r, encoded);
        return SF_OK;
    }
    }
    return sf_error(SF_E_FRAME, "frame: codec %d unknown", (int)h->codec);
}

/* Codec, unshuffle and dequantizer, as the header asks. Paths other than a plain lossless
 * frame go through one scratch of encoded_bytes (checked against max_bytes with the header, so
 * the allocation is bounded by the caller): the codec's output, unshuffled into dst when
 * lossless, dequantized into dst when quantized. A shuffled quantized frame is bf16 (the only
 * quantization with 2-byte values, see shuffle_width), whose 2n code bytes fit in the 4n bytes
 * of dst: the codec writes them there, they are unshuffled into the scratch and dequantized
 * from it into dst. */
static int decode_payload(const sf_frame_header *h, const uint8_t *payload, void *dst)
{
    if (!h->encoded_bytes) return SF_OK;
    const size_t encoded = (size_t)h->encoded_bytes, width = shuffle_width(h->dtype, h->quant.kind);
    const int lossy = h->dtype == SF_FRAME_F32 && h->quant.kind != SF_QUANT_F32;
    if (!lossy && !h->shuffled) return run_codec(h, payload, dst);

    const uint8_t *enc = payload; /* a raw frame is never shuffled: its codes are the payload */
    uint8_t *scratch = NULL;
    if (h->codec != SF_CODEC_RAW) {
        if (!(scratch = malloc(encoded)))
            return sf_error(SF_E_NOMEM, "frame: out of memory (%zu bytes)", encoded);
        const int via_dst = lossy && h->shuffled;
        int rc = run_codec(h, payload, via_dst ? dst : scratch);
        if (rc == SF_OK && h->shuffled) {
            if (via_dst) sf_byte_unshuffle(dst, scratch, encoded, width);
            else sf_byte_unshuffle(scratch, dst, encoded, width);
        }
        if (rc || !lossy) {
            free(scratch);
            return rc;
        }
        enc = scratch;
    }
    int rc = sf_dequantize(&h->quant, enc, encoded, dst, h->value_bytes / sizeof(float));
    free(scratch);
    if (rc) {
        char why[256];
        snprintf(why, sizeof why, "%s", sf_last_error());
        return sf_error(SF_E_FRAME, "frame: quantized payload invalid: %s", why);
    }
    return SF_OK;
}

int sf_frame_decode_into(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h,
                         void *dst, size_t dst_size, size_t *used)
{
    sf_frame_header local;
    if (!h) h = &local;
    int rc = validate_frame(buf, len, max_bytes, h);
    if (rc) return rc;
    if (dst_size < h->value_bytes || (!dst && h->value_bytes))
        return sf_error(SF_E_INVAL, "frame: destination holds %zu bytes, the frame %zu", dst ? dst_size : 0,
                        h->value_bytes);
    if ((rc = decode_payload(h, buf + SF_FRAME_HEADER_SIZE, dst))) return rc;
    if (used) *used = SF_FRAME_HEADER_SIZE + (size_t)h->payload_bytes;
    return SF_OK;
}

int sf_frame_decode(const uint8_t *buf, size_t len, size_t max_bytes, sf_frame_header *h, void **out, size_t *used)
{
    if (!out) return sf_error(SF_E_INVAL, "frame decode: no output pointer");
    *out = NULL;
    sf_frame_header local;
    if (!h) h = &local;
    int rc = validate_frame(buf, len, max_bytes, h);
    if (rc) return rc;
    void *values = malloc(h->value_bytes ? h->value_bytes : 1);
    if (!values) return sf_error(SF_E_NOMEM, "frame: out of memory (%zu bytes)", h->value_bytes);
    if ((rc = decode_payload(h, buf + SF_FRAME_HEADER_SIZE, values))) {
        free(values);
        return rc;
    }
    if (used) *used = SF_FRAME_HEADER_SIZE + (size_t)h->payload_bytes;
    *out = values;
    return SF_OK;
}
