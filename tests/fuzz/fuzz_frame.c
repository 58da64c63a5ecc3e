/* Fuzzes the frame decoder (compress/frame.h). Input: byte 0 picks the mode, byte 1 the
 * caller's size limit, the rest is the body.
 *   mode 0: the body is a frame, decoded as it is;
 *   mode 1: the same, with both checksums recomputed first, so that mutations reach the size
 *           checks, the codecs and the dequantizers instead of stopping at a CRC;
 *   mode 2: the body describes a frame (kind, dtype, codec, level, quantization, shape, shuffle) and its
 *           values; it is encoded, then decoded, which must give the values back (exactly when
 *           lossless, within sf_quant_error_bound when quantized).
 * Whatever decodes must respect the limit, agree with sf_frame_peek and sf_frame_decode_into
 * (into a heap buffer of exactly value_bytes), report used = header + payload, and fail as
 * truncated when one payload byte is missing. A lossless raw frame must be canonical: encoding
 * its values again gives the same bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "compress/quantize.h"
#include "seqflow/error.h"

#include "tests/fuzz/fuzz_support.h"

static const size_t limits[] = {0, 1, 4, 64, 1024, 1u << 16, 1u << 20, SIZE_MAX};

static int is_frame_error(int rc)
{
    return rc == SF_E_FRAME || rc == SF_E_FRAME_TRUNCATED || rc == SF_E_FRAME_VERSION ||
           rc == SF_E_FRAME_TOO_LARGE;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int same_header(const sf_frame_header *a, const sf_frame_header *b)
{
    int same = a->version == b->version && a->kind == b->kind && a->dtype == b->dtype &&
               a->codec == b->codec && a->quant.kind == b->quant.kind &&
               a->quant.group == b->quant.group && a->ndim == b->ndim && a->stream == b->stream &&
               a->segment == b->segment && a->encoded_bytes == b->encoded_bytes &&
               a->payload_bytes == b->payload_bytes && a->value_bytes == b->value_bytes &&
               a->shuffled == b->shuffled;
    for (int i = 0; i < SF_FRAME_MAX_DIMS; i++) same = same && a->shape[i] == b->shape[i];
    return same;
}

/* Decodes buf every way and checks that the ways agree. Returns the values (malloc'd) or NULL
 * when the frame was refused. */
static void *decode_checked(const uint8_t *buf, size_t len, size_t limit, sf_frame_header *h)
{
    void *values = NULL;
    size_t used = 0;
    sf_clear_error();
    int rc = sf_frame_decode(buf, len, limit, h, &values, &used);
    if (rc != SF_OK) {
        FUZZ_CHECK(is_frame_error(rc) || rc == SF_E_NOMEM);
        FUZZ_CHECK(values == NULL);
        FUZZ_CHECK(sf_last_error()[0] != '\0');
        return NULL;
    }
    FUZZ_CHECK(values != NULL);
    FUZZ_CHECK(h->value_bytes <= limit && h->payload_bytes <= limit && h->encoded_bytes <= limit);
    FUZZ_CHECK(used == SF_FRAME_HEADER_SIZE + h->payload_bytes && used <= len);
    size_t count = 1;
    for (int i = 0; i < h->ndim; i++) count *= (size_t)h->shape[i];
    FUZZ_CHECK(h->value_bytes == (h->ndim ? count * sf_frame_dtype_size(h->dtype) : 0));

    sf_frame_header peeked;
    FUZZ_CHECK(sf_frame_peek(buf, SF_FRAME_HEADER_SIZE, limit, &peeked) == SF_OK);
    FUZZ_CHECK(same_header(h, &peeked));

    sf_frame_header into;
    uint8_t *dst = malloc(h->value_bytes ? h->value_bytes : 1);
    FUZZ_CHECK(dst);
    size_t used_into = 0;
    FUZZ_CHECK(sf_frame_decode_into(buf, len, limit, &into, dst, h->value_bytes, &used_into) == SF_OK);
    FUZZ_CHECK(same_header(h, &into) && used_into == used);
    FUZZ_CHECK(h->value_bytes == 0 || memcmp(dst, values, h->value_bytes) == 0);
    free(dst);

    if (h->payload_bytes) {
        void *short_values = NULL;
        sf_frame_header short_h;
        FUZZ_CHECK(sf_frame_decode(buf, used - 1, limit, &short_h, &short_values, NULL) ==
                   SF_E_FRAME_TRUNCATED);
        FUZZ_CHECK(short_values == NULL);
    }

    /* A lossless raw frame has one valid encoding: its values encode to the same bytes. */
    if (h->codec == SF_CODEC_RAW && h->quant.kind == SF_QUANT_F32) {
        sf_frame_desc d = {.kind = h->kind, .dtype = h->dtype, .ndim = h->ndim,
                           .stream = h->stream, .segment = h->segment, .codec = SF_CODEC_RAW,
                           .quant = h->quant};
        memcpy(d.shape, h->shape, sizeof d.shape);
        sf_buffer again = {0};
        FUZZ_CHECK(sf_frame_encode(&d, values, h->value_bytes, NULL, &again) == SF_OK);
        FUZZ_CHECK(again.len == used && memcmp(again.data, buf, used) == 0);
        sf_buffer_release(&again);
    }
    return values;
}

/* Mode 1: makes both checksums right, so that the decoder gets past them. */
static void fix_checksums(uint8_t *frame, size_t len)
{
    if (len < SF_FRAME_HEADER_SIZE) return;
    uint64_t payload = get_u64(frame + 72);
    size_t have = len - SF_FRAME_HEADER_SIZE;
    if (payload <= have)
        put_u32(frame + 88, sf_crc32c(0, frame + SF_FRAME_HEADER_SIZE, (size_t)payload));
    put_u32(frame + 84, sf_crc32c(0, frame, 84));
}

/* Mode 2: a frame description from the first bytes, values from the rest. */
static void encode_and_decode(const uint8_t *data, size_t size, size_t limit)
{
    if (size < 8) return;
    sf_frame_desc d = {0};
    d.kind = (sf_frame_kind)(1 + data[0] % 5);
    d.dtype = (sf_frame_dtype)(1 + data[1] % 3);
    d.codec = (sf_codec)(data[2] % 3);
    d.level = d.codec == SF_CODEC_LZ4 ? data[3] % 13 : d.codec == SF_CODEC_ZSTD ? data[3] % 6 : 0;
    d.quant.kind = d.dtype == SF_FRAME_F32 ? (sf_quant_kind)(data[4] % 5) : SF_QUANT_F32;
    d.quant.group = 1 + data[5] % 32;
    if (d.quant.kind == SF_QUANT_INT4 && d.quant.group % 2) d.quant.group++;
    if (d.quant.kind == SF_QUANT_F32 || d.quant.kind == SF_QUANT_BF16) d.quant.group = 1;
    d.ndim = data[6] % 4;
    d.shuffle = (data[6] >> 2) & 1;
    d.stream = data[7];
    d.segment = (uint64_t)data[7] << 40;
    data += 8;
    size -= 8;
    size_t dsize = sf_frame_dtype_size(d.dtype), rest = 1;
    for (int i = 1; i < d.ndim; i++) {
        d.shape[i] = 1 + (size > (size_t)i ? data[size - i] % 3 : 0);
        rest *= d.shape[i];
    }
    if (d.ndim) {
        d.shape[0] = size / (dsize * rest);
        if (d.shape[0] == 0) return;
    }
    size_t value_bytes = d.ndim ? (size_t)d.shape[0] * rest * dsize : 0;
    /* The values are copied so that floats are aligned. */
    uint8_t *values = malloc(value_bytes ? value_bytes : 1);
    FUZZ_CHECK(values);
    memcpy(values, data, value_bytes);

    /* Frames are appended to what the buffer holds, at any alignment. */
    sf_buffer frame = {0};
    size_t prefix = d.stream % 4;
    FUZZ_CHECK(sf_buffer_append(&frame, "seq", prefix) == SF_OK);
    sf_clear_error();
    int rc = sf_frame_encode(&d, values, value_bytes, NULL, &frame);
    if (rc != SF_OK) {
        /* Only a quantizer refusing a non-finite value may stop a valid description. */
        FUZZ_CHECK(rc == SF_E_INVAL && d.quant.kind >= SF_QUANT_INT8);
        FUZZ_CHECK(frame.len == prefix);
        free(values);
        sf_buffer_release(&frame);
        return;
    }
    sf_frame_header h;
    const uint8_t *start = frame.data + prefix;
    size_t frame_len = frame.len - prefix;
    void *decoded = decode_checked(start, frame_len, limit, &h);
    if (!decoded) {
        FUZZ_CHECK(sf_last_error()[0] != '\0');
        /* A frame that we just encoded can only be refused for the limit. */
        void *again = NULL;
        FUZZ_CHECK(sf_frame_decode(start, frame_len, SIZE_MAX, &h, &again, NULL) == SF_OK);
        FUZZ_CHECK(h.value_bytes > limit || h.payload_bytes > limit || h.encoded_bytes > limit);
        decoded = again;
    }
    FUZZ_CHECK(h.kind == d.kind && h.dtype == d.dtype && h.codec == d.codec &&
               h.quant.kind == d.quant.kind && h.ndim == d.ndim && h.stream == d.stream &&
               h.segment == d.segment && h.value_bytes == value_bytes);
    /* shuffled exactly where compress/frame.h says a request applies */
    size_t width = d.dtype == SF_FRAME_F32 ? (d.quant.kind == SF_QUANT_F32 ? 4 : d.quant.kind == SF_QUANT_BF16 ? 2 : 1)
                                           : sf_frame_dtype_size(d.dtype);
    FUZZ_CHECK(h.shuffled == (d.shuffle && d.codec != SF_CODEC_RAW && width > 1 && value_bytes > 0));
    if (d.quant.kind == SF_QUANT_F32) {
        FUZZ_CHECK(value_bytes == 0 || memcmp(decoded, values, value_bytes) == 0);
    } else {
        size_t n = value_bytes / sizeof(float);
        const float *x = (const float *)values, *y = decoded;
        double bound = sf_quant_error_bound(&d.quant, x, n);
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(x[i])) {
                FUZZ_CHECK(d.quant.kind == SF_QUANT_BF16);
                FUZZ_CHECK(isnan(x[i]) ? isnan(y[i]) : y[i] == x[i]);
                continue;
            }
            FUZZ_CHECK(fabs((double)y[i] - (double)x[i]) <= bound);
        }
    }
    free(decoded);
    free(values);
    sf_buffer_release(&frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int mode = data[0] % 3;
    size_t limit = limits[data[1] % (sizeof limits / sizeof limits[0])];
    data += 2;
    size -= 2;
    if (mode == 2) {
        encode_and_decode(data, size, limit);
        return 0;
    }
    /* A heap copy ending exactly at the input's end, so that any read past it is reported;
     * frames follow each other in a stream, so the copy starts at any alignment. */
    size_t shift = (data[-1] >> 3) & 3;
    uint8_t *block = malloc(shift + size + 1);
    FUZZ_CHECK(block);
    uint8_t *frame = block + shift;
    memcpy(frame, data, size);
    if (mode == 1) fix_checksums(frame, size);
    sf_frame_header h;
    free(decode_checked(frame, size, limit, &h));
    free(block);
    return 0;
}
