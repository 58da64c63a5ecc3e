/* Frames of compress/frame.h: round trips for every dtype x codec x quantization on random and
 * adversarial data (decoded values bit-equal to the quantizer's own round trip and within its
 * documented bound), error feedback through frames, and a decoder that rejects every kind of
 * damage with the right code and a one-line message: each header field changed, payload bits
 * flipped, truncation at every offset, oversized lengths, a newer version. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "compress/frame.h"
#include "seqflow/error.h"
#include "support/check.h"

static const char *const quant_names[] = {"f32", "bf16", "int8", "int4", "fp8"};
#define LIMIT ((size_t)1 << 24)

typedef struct {
    sf_codec codec;
    int level;
} codec_case;
static const codec_case codecs[] = {{SF_CODEC_RAW, 0},  {SF_CODEC_LZ4, 0},  {SF_CODEC_LZ4, 1}, {SF_CODEC_LZ4, 9},
                                    {SF_CODEC_ZSTD, 0}, {SF_CODEC_ZSTD, 1}, {SF_CODEC_ZSTD, 19}};
#define N_CODECS (sizeof codecs / sizeof codecs[0])

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
/* Re-seals a header after a deliberate change, so that the check behind the checksum runs. */
static void reseal(uint8_t *f) { put_u32(f + 84, sf_crc32c(0, f, 84)); }
static void reseal_payload(uint8_t *f, size_t payload)
{
    put_u32(f + 88, sf_crc32c(0, f + 96, payload));
    reseal(f);
}

/* Exactly len bytes in their own allocation, so that ASan catches any read past them. */
static uint8_t *dup_bytes(const uint8_t *p, size_t len)
{
    uint8_t *d = malloc(len ? len : 1);
    if (len) memcpy(d, p, len);
    return d;
}

/* The decoder's verdict on f[0..len), with the message checked to be one non-empty line. */
static int verdict(const uint8_t *f, size_t len, size_t limit)
{
    uint8_t *copy = dup_bytes(f, len);
    sf_clear_error();
    sf_frame_header h;
    void *out = NULL;
    int rc = sf_frame_decode(copy, len, limit, &h, &out, NULL);
    if (rc) {
        const char *msg = sf_last_error();
        CHECKF(msg[0] && !strchr(msg, '\n'), "message '%s' for rc %d", msg, rc);
        CHECK(out == NULL);
    }
    free(out);
    free(copy);
    return rc;
}

static int encode_simple(sf_frame_kind kind, sf_frame_dtype dtype, int ndim, const uint64_t *shape, sf_codec codec,
                         int level, sf_quant_params q, const void *data, size_t bytes, sf_buffer *out)
{
    sf_frame_desc d = {.kind = kind, .dtype = dtype, .ndim = ndim, .stream = 77, .segment = 5,
                       .codec = codec, .level = level, .quant = q};
    for (int i = 0; i < ndim; i++) d.shape[i] = shape[i];
    return sf_frame_encode(&d, data, bytes, NULL, out);
}

/* ---- round trips --------------------------------------------------------------------------- */

typedef enum { D_NORMAL, D_ZEROS, D_CONST, D_HUGE, D_TINY, D_SUBNORMAL, D_MIXED, D_EXTREME, D_COUNT } dataset;
static const char *const dataset_names[] = {"normal", "zeros",  "constant", "huge",
                                            "tiny",   "subnormal", "mixed", "extreme"};

static void fill(float *x, size_t n, dataset d, check_rng *rng)
{
    for (size_t i = 0; i < n; i++) {
        double g = check_rng_normal(rng);
        switch (d) {
        case D_NORMAL: x[i] = (float)g; break;
        case D_ZEROS: x[i] = (i % 3) ? 0.0f : -0.0f; break;
        case D_CONST: x[i] = -2.75f; break;
        case D_HUGE: x[i] = (float)(g * 1e37); break;
        case D_TINY: x[i] = (float)(g * 1e-36); break;
        case D_SUBNORMAL: x[i] = (float)(g * 1e-42); break;
        case D_MIXED: x[i] = (float)(g * pow(10.0, (double)(i % 13) - 6.0)); break;
        case D_EXTREME: x[i] = (i % 2) ? FLT_MAX : -FLT_MIN; break;
        default: x[i] = 0.0f;
        }
    }
}

/* One frame of x (rows x cols) through every codec; the values must decode bit-equal to
 * sf_dequantize(sf_quantize(x)) and lie within the bound of their own group. */
static void round_trip_f32(sf_quant_params q, const float *x, uint64_t rows, uint64_t cols, const char *what)
{
    size_t n = (size_t)(rows * cols);
    sf_quant_params qn = q;
    if (q.kind == SF_QUANT_F32 || q.kind == SF_QUANT_BF16) qn.group = 1;
    size_t enc = sf_quant_encoded_size(&qn, n);
    uint8_t *direct = malloc(enc);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    CHECK_OK(sf_quantize(&qn, x, n, direct, enc));
    CHECK_OK(sf_dequantize(&qn, direct, enc, want, n));
    for (size_t c = 0; c < N_CODECS; c++) {
        sf_buffer buf = {0};
        CHECK_OK(sf_buffer_append(&buf, "prefix", 6)); /* frames append; the prefix stays */
        uint64_t shape[2] = {rows, cols};
        int rc = encode_simple(SF_FRAME_HIDDEN, SF_FRAME_F32, 2, shape, codecs[c].codec, codecs[c].level, q, x,
                               n * sizeof(float), &buf);
        CHECKF(rc == 0, "%s %s group %d %s/%d: encode %d (%s)", quant_names[q.kind], what, q.group,
               sf_codec_name(codecs[c].codec), codecs[c].level, rc, sf_last_error());
        if (rc) {
            sf_buffer_release(&buf);
            continue;
        }
        CHECK(memcmp(buf.data, "prefix", 6) == 0);
        sf_frame_header h;
        size_t used = 0;
        memset(got, 0xA5, n * sizeof *got);
        rc = sf_frame_decode_into(buf.data + 6, buf.len - 6, LIMIT, &h, got, n * sizeof *got, &used);
        CHECKF(rc == 0, "%s %s %s: decode %d (%s)", quant_names[q.kind], what, sf_codec_name(codecs[c].codec), rc,
               sf_last_error());
        if (rc) {
            sf_buffer_release(&buf);
            continue;
        }
        CHECK(used == buf.len - 6);
        CHECK(h.kind == SF_FRAME_HIDDEN && h.dtype == SF_FRAME_F32 && h.codec == codecs[c].codec);
        CHECK(h.ndim == 2 && h.shape[0] == rows && h.shape[1] == cols && h.shape[2] == 0 && h.shape[3] == 0);
        CHECK(h.stream == 77 && h.segment == 5 && h.version == SF_FRAME_VERSION);
        CHECK(h.quant.kind == q.kind && h.quant.group == qn.group);
        CHECK(h.value_bytes == n * sizeof(float) && h.encoded_bytes == enc);
        CHECKF(memcmp(got, want, n * sizeof *got) == 0, "%s %s %s: frame differs from the quantizer",
               quant_names[q.kind], what, sf_codec_name(codecs[c].codec));
        /* The same through the allocating decoder. */
        void *values = NULL;
        CHECK_OK(sf_frame_decode(buf.data + 6, buf.len - 6, LIMIT, NULL, &values, NULL));
        CHECK(values && memcmp(values, want, n * sizeof *got) == 0);
        free(values);
        sf_buffer_release(&buf);
    }
    /* Bounds from compress/quantize.h, each group against its own stored scale. */
    size_t group = (q.kind == SF_QUANT_F32 || q.kind == SF_QUANT_BF16) ? 1 : (size_t)q.group;
    int within = 1;
    for (size_t s = 0; s < n && within; s += group) {
        size_t len = n - s < group ? n - s : group;
        double b = sf_quant_error_bound(&qn, x + s, len);
        for (size_t i = s; i < s + len; i++)
            if (!(fabs((double)want[i] - (double)x[i]) <= b)) within = 0;
    }
    CHECKF(within, "%s %s group %d: a value is outside sf_quant_error_bound", quant_names[q.kind], what, q.group);
    if (q.kind == SF_QUANT_F32) CHECK(memcmp(want, x, n * sizeof *x) == 0);
    free(direct);
    free(want);
    free(got);
}

static void test_float_round_trips(void)
{
    check_rng rng = {0x5eedf4a3e5ull};
    static const uint64_t shapes[][2] = {{7, 48}, {1, 15}, {3, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        uint64_t rows = shapes[s][0], cols = shapes[s][1];
        size_t n = (size_t)(rows * cols);
        float *x = malloc(n * sizeof *x);
        for (int d = 0; d < D_COUNT; d++) {
            fill(x, n, (dataset)d, &rng);
            for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++) {
                const int groups[] = {(int)cols /* per row */, 32, 2, (int)n};
                for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
                    if (kind == SF_QUANT_INT4 && groups[g] % 2) continue;
                    if ((kind == SF_QUANT_F32 || kind == SF_QUANT_BF16) && g) continue; /* no groups */
                    if (d == D_EXTREME && kind == SF_QUANT_BF16) continue; /* FLT_MAX rounds to Inf */
                    sf_quant_params q = {(sf_quant_kind)kind, groups[g]};
                    round_trip_f32(q, x, rows, cols, dataset_names[d]);
                }
            }
        }
        free(x);
    }
}

static void test_lossless_round_trips(void)
{
    check_rng rng = {42};
    enum { N = 3000 };
    uint8_t *bytes = malloc(N);
    uint32_t *ids = malloc(N * sizeof *ids);
    for (int pattern = 0; pattern < 3; pattern++) {
        for (size_t i = 0; i < N; i++) {
            uint64_t r = check_rng_next(&rng);
            bytes[i] = pattern == 0 ? (uint8_t)r : pattern == 1 ? 0 : (uint8_t)(i % 7);
            ids[i] = pattern == 0 ? (uint32_t)r : pattern == 1 ? 0xFFFFFFFFu : (uint32_t)(i % 50257);
        }
        for (size_t c = 0; c < N_CODECS; c++) {
            sf_buffer buf = {0};
            uint64_t n = N;
            sf_quant_params none = {SF_QUANT_F32, 0};
            CHECK_OK(encode_simple(SF_FRAME_BLOB, SF_FRAME_U8, 1, &n, codecs[c].codec, codecs[c].level, none,
                                   bytes, N, &buf));
            size_t first = buf.len;
            uint64_t shape2[2] = {N / 3, 3};
            CHECK_OK(encode_simple(SF_FRAME_TOKENS, SF_FRAME_U32, 2, shape2, codecs[c].codec, codecs[c].level, none,
                                   ids, N * sizeof *ids, &buf));
            /* Two frames back to back: used walks from one to the next. */
            sf_frame_header h;
            void *v = NULL;
            size_t used = 0;
            CHECK_OK(sf_frame_decode(buf.data, buf.len, LIMIT, &h, &v, &used));
            CHECK(used == first && h.dtype == SF_FRAME_U8 && h.kind == SF_FRAME_BLOB && h.value_bytes == N);
            CHECK(v && memcmp(v, bytes, N) == 0);
            free(v);
            v = NULL;
            CHECK_OK(sf_frame_decode(buf.data + used, buf.len - used, LIMIT, &h, &v, &used));
            CHECK(used == buf.len - first && h.dtype == SF_FRAME_U32 && h.value_bytes == N * sizeof *ids);
            CHECK(v && memcmp(v, ids, N * sizeof *ids) == 0);
            free(v);
            if (pattern == 1 && codecs[c].codec != SF_CODEC_RAW) CHECK(buf.len < N / 4); /* zeros compress */
            sf_buffer_release(&buf);
        }
    }
    /* An empty frame (ndim 0) under every codec carries no payload. */
    for (size_t c = 0; c < N_CODECS; c++) {
        sf_buffer buf = {0};
        sf_quant_params q = {SF_QUANT_INT8, 16};
        CHECK_OK(encode_simple(SF_FRAME_STATE, SF_FRAME_F32, 0, NULL, codecs[c].codec, codecs[c].level, q, NULL, 0,
                               &buf));
        CHECK(buf.len == SF_FRAME_HEADER_SIZE);
        sf_frame_header h;
        void *v = NULL;
        CHECK_OK(sf_frame_decode(buf.data, buf.len, 0, &h, &v, NULL));
        CHECK(v != NULL && h.value_bytes == 0 && h.ndim == 0 && h.payload_bytes == 0);
        free(v);
        CHECK_OK(sf_frame_decode_into(buf.data, buf.len, 0, &h, NULL, 0, NULL));
        sf_buffer_release(&buf);
    }
    free(bytes);
    free(ids);
}

/* f32 carries NaN and Inf bit for bit, bf16 keeps them NaN/Inf, the scaled kinds refuse them
 * and leave the output untouched. */
static void test_nonfinite(void)
{
    float x[8] = {1.0f, NAN, -INFINITY, INFINITY, -0.0f, 3.5f, -NAN, 2.0f};
    uint32_t payload_nan = 0x7fa12345u; /* a signalling NaN with a payload */
    memcpy(&x[7], &payload_nan, 4);
    uint64_t shape[1] = {8};
    for (size_t c = 0; c < N_CODECS; c++) {
        sf_buffer buf = {0};
        sf_quant_params q = {SF_QUANT_F32, 0};
        CHECK_OK(encode_simple(SF_FRAME_HIDDEN, SF_FRAME_F32, 1, shape, codecs[c].codec, codecs[c].level, q, x,
                               sizeof x, &buf));
        float y[8];
        CHECK_OK(sf_frame_decode_into(buf.data, buf.len, LIMIT, NULL, y, sizeof y, NULL));
        CHECK(memcmp(x, y, sizeof x) == 0);
        sf_buffer_release(&buf);

        q.kind = SF_QUANT_BF16;
        CHECK_OK(encode_simple(SF_FRAME_HIDDEN, SF_FRAME_F32, 1, shape, codecs[c].codec, codecs[c].level, q, x,
                               sizeof x, &buf));
        CHECK_OK(sf_frame_decode_into(buf.data, buf.len, LIMIT, NULL, y, sizeof y, NULL));
        CHECK(y[0] == 1.0f && isnan(y[1]) && y[2] == -INFINITY && y[3] == INFINITY && isnan(y[6]) && isnan(y[7]));
        CHECK(y[4] == 0.0f && signbit(y[4]) && y[5] == 3.5f);
        sf_buffer_release(&buf);

        for (int kind = SF_QUANT_INT8; kind <= SF_QUANT_FP8_E4M3; kind++) {
            sf_quant_params qs = {(sf_quant_kind)kind, 2};
            CHECK_OK(sf_buffer_append(&buf, "keep", 4));
            int rc = encode_simple(SF_FRAME_HIDDEN, SF_FRAME_F32, 1, shape, codecs[c].codec, codecs[c].level, qs,
                                   x, sizeof x, &buf);
            CHECKF(rc == SF_E_INVAL && buf.len == 4, "%s refuses NaN: rc %d len %zu", quant_names[kind], rc,
                   buf.len);
            CHECK(sf_last_error()[0] != 0);
            sf_buffer_release(&buf);
        }
    }
}

/* Error feedback through frames: what the receiver decodes is exactly what the quantizer's
 * feedback form sends, and the running sum stays within the last message's bound of the
 * exact sum. */
static void test_feedback(sf_quant_kind kind, int group)
{
    enum { N = 64, MESSAGES = 3000 };
    sf_quant_params q = {kind, group};
    sf_quant_feedback via_frame, direct;
    CHECK_OK(sf_quant_feedback_init(&via_frame, N));
    CHECK_OK(sf_quant_feedback_init(&direct, N));
    size_t enc = sf_quant_encoded_size(&q, N);
    uint8_t *codes = malloc(enc);
    double exact[N] = {0}, received[N] = {0}, abs_sum = 0.0;
    float x[N], y[N], z[N], v[N];
    check_rng rng = {1234u + (uint64_t)kind};
    int same = 1;
    sf_buffer buf = {0};
    for (int m = 0; m < MESSAGES; m++) {
        for (int i = 0; i < N; i++) {
            x[i] = (float)(check_rng_normal(&rng) * 0.01 + 0.003);
            exact[i] += x[i];
            abs_sum += fabs(x[i]);
            v[i] = x[i] + via_frame.residual[i]; /* what the last message carries, for its bound */
        }
        sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 1, .shape = {N},
                           .codec = m % 2 ? SF_CODEC_LZ4 : SF_CODEC_ZSTD, .quant = q, .segment = (uint64_t)m};
        buf.len = 0;
        int rc = sf_frame_encode(&d, x, sizeof x, &via_frame, &buf);
        if (rc == 0) rc = sf_frame_decode_into(buf.data, buf.len, LIMIT, NULL, y, sizeof y, NULL);
        if (rc == 0) rc = sf_quantize_with_feedback(&q, &direct, x, N, codes, enc);
        if (rc == 0) rc = sf_dequantize(&q, codes, enc, z, N);
        if (rc || memcmp(y, z, sizeof y)) {
            same = 0;
            CHECKF(0, "%s message %d: rc %d (%s) or frame differs from the direct path", quant_names[kind], m, rc,
                   sf_last_error());
            break;
        }
        for (int i = 0; i < N; i++) received[i] += y[i];
    }
    if (same) {
        double bound = sf_quant_error_bound(&q, v, N), worst = 0.0;
        for (int i = 0; i < N; i++) worst = fmax(worst, fabs(exact[i] - received[i]));
        /* 2^-20 of the summed magnitudes covers the float32 rounding of the residuals. */
        CHECKF(worst <= bound + 0x1p-20 * abs_sum / N, "%s feedback drift %g > bound %g", quant_names[kind], worst,
               bound);
        CHECK(memcmp(via_frame.residual, direct.residual, N * sizeof(float)) == 0);
    }
    /* A refused message leaves the output and the residual as they were. */
    float saved[N];
    memcpy(saved, via_frame.residual, sizeof saved);
    x[3] = NAN;
    sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 1, .shape = {N}, .quant = q};
    buf.len = 0;
    CHECK(sf_frame_encode(&d, x, sizeof x, &via_frame, &buf) == SF_E_INVAL && buf.len == 0);
    CHECK(memcmp(saved, via_frame.residual, sizeof saved) == 0);
    /* A residual of the wrong size is refused. */
    d.shape[0] = N / 2;
    CHECK(sf_frame_encode(&d, x, sizeof x / 2, &via_frame, &buf) == SF_E_INVAL && buf.len == 0);
    sf_buffer_release(&buf);
    free(codes);
    sf_quant_feedback_release(&via_frame);
    sf_quant_feedback_release(&direct);
}

/* ---- damage -------------------------------------------------------------------------------- */

typedef struct {
    const char *field;
    size_t off, width;
    uint64_t value;
    int expect;
} patch;

static void apply(uint8_t *f, const patch *p)
{
    if (p->width == 1) f[p->off] = (uint8_t)p->value;
    else if (p->width == 2) put_u16(f + p->off, (uint16_t)p->value);
    else if (p->width == 4) put_u32(f + p->off, (uint32_t)p->value);
    else put_u64(f + p->off, p->value);
}

/* A small int8 frame (2 x 8, group 4) under codec. */
static void small_frame(sf_codec codec, sf_buffer *buf, float *x)
{
    for (int i = 0; i < 16; i++) x[i] = (float)sin(i * 0.7) * (float)(i + 1);
    uint64_t shape[2] = {2, 8};
    sf_quant_params q = {SF_QUANT_INT8, 4};
    buf->len = 0;
    CHECK_OK(encode_simple(SF_FRAME_HIDDEN, SF_FRAME_F32, 2, shape, codec, 0, q, x, 16 * sizeof(float), buf));
}

static void test_header_fields(sf_codec codec)
{
    sf_buffer buf = {0};
    float x[16];
    small_frame(codec, &buf, x);
    size_t len = buf.len, payload = len - SF_FRAME_HEADER_SIZE;
    CHECK(verdict(buf.data, len, LIMIT) == SF_OK);

    /* Without resealing, any change to the header is caught: by the checksum, or (for the two
     * checksums and the reserved tail) by their own checks. */
    for (size_t off = 0; off < SF_FRAME_HEADER_SIZE; off++) {
        uint8_t *f = dup_bytes(buf.data, len);
        f[off] ^= 0x10;
        int rc = verdict(f, len, LIMIT);
        CHECKF(rc == SF_E_FRAME, "header byte %zu changed: rc %d", off, rc);
        free(f);
    }

    /* Resealed, each field's own check answers with its own code. */
    const patch patches[] = {
        {"version newer", 4, 2, SF_FRAME_VERSION + 1, SF_E_FRAME_VERSION},
        {"version max", 4, 2, 0xFFFF, SF_E_FRAME_VERSION},
        {"version 0", 4, 2, 0, SF_E_FRAME_VERSION},
        {"kind 0", 6, 2, 0, SF_E_FRAME},
        {"kind 6", 6, 2, 6, SF_E_FRAME},
        {"dtype 0", 8, 1, 0, SF_E_FRAME},
        {"dtype 4", 8, 1, 4, SF_E_FRAME},
        {"dtype u8 with int8", 8, 1, SF_FRAME_U8, SF_E_FRAME},
        {"codec 3", 9, 1, 3, SF_E_FRAME},
        {"codec other", 9, 1, codec == SF_CODEC_ZSTD ? SF_CODEC_LZ4 : SF_CODEC_ZSTD, SF_E_FRAME},
        {"quant 5", 10, 1, 5, SF_E_FRAME},
        {"quant int4", 10, 1, SF_QUANT_INT4, SF_E_FRAME},
        {"quant f32 with group", 10, 1, SF_QUANT_F32, SF_E_FRAME},
        {"ndim 5", 11, 1, 5, SF_E_FRAME},
        {"ndim 1 (shape[1] beyond)", 11, 1, 1, SF_E_FRAME},
        {"ndim 3 (shape[2] 0)", 11, 1, 3, SF_E_FRAME},
        {"group 0", 12, 4, 0, SF_E_FRAME},
        {"group 8", 12, 4, 8, SF_E_FRAME},
        {"group huge", 12, 4, 0x80000000u, SF_E_FRAME},
        {"shape[0] 3", 16, 8, 3, SF_E_FRAME},
        {"shape[0] 0", 16, 8, 0, SF_E_FRAME},
        {"shape[0] 2^63", 16, 8, (uint64_t)1 << 63, SF_E_FRAME},
        {"shape[3] set", 40, 8, 1, SF_E_FRAME},
        {"encoded +1", 64, 8, 0, SF_E_FRAME}, /* value set below */
        {"encoded huge", 64, 8, UINT64_MAX, SF_E_FRAME},
        {"payload +1", 72, 8, 0, SF_E_FRAME_TRUNCATED},
        {"payload -1", 72, 8, 0, SF_E_FRAME},
        {"payload huge", 72, 8, (uint64_t)1 << 62, SF_E_FRAME_TOO_LARGE},
        {"payload max", 72, 8, UINT64_MAX, SF_E_FRAME_TOO_LARGE},
        {"flags", 80, 4, 1, SF_E_FRAME},
        {"payload checksum", 88, 4, 0, SF_E_FRAME},
        {"reserved", 92, 4, 0x01000000u, SF_E_FRAME},
    };
    uint64_t encoded = get_u64(buf.data + 64), pay = get_u64(buf.data + 72);
    for (size_t i = 0; i < sizeof patches / sizeof patches[0]; i++) {
        patch p = patches[i];
        if (!strcmp(p.field, "encoded +1")) p.value = encoded + 1;
        if (!strcmp(p.field, "payload +1")) p.value = pay + 1;
        if (!strcmp(p.field, "payload -1")) p.value = pay - 1;
        if (!strcmp(p.field, "payload checksum")) p.value = ~sf_crc32c(0, buf.data + 96, payload);
        if (codec == SF_CODEC_RAW && !strcmp(p.field, "payload +1")) p.expect = SF_E_FRAME; /* raw: == encoded */
        uint8_t *f = dup_bytes(buf.data, len);
        apply(f, &p);
        reseal(f);
        int rc = verdict(f, len, LIMIT);
        CHECKF(rc == p.expect, "%s %s: rc %d, expected %d (%s)", sf_codec_name(codec), p.field, rc, p.expect,
               sf_last_error());
        sf_frame_header h;
        if (p.expect != SF_E_FRAME_TRUNCATED && p.expect != SF_E_FRAME && strcmp(p.field, "payload checksum"))
            CHECK(sf_frame_peek(f, len, LIMIT, &h) == p.expect); /* peek answers the same */
        free(f);
    }

    /* Stream id and segment index carry no constraint: resealed changes decode and report. */
    uint8_t *f = dup_bytes(buf.data, len);
    put_u64(f + 48, 0xDEADBEEFull);
    put_u64(f + 56, 123456789ull);
    reseal(f);
    sf_frame_header h;
    CHECK_OK(sf_frame_peek(f, len, LIMIT, &h));
    CHECK(h.stream == 0xDEADBEEFull && h.segment == 123456789ull);
    free(f);

    /* A consistent header larger than the caller allows is refused before anything else. */
    f = dup_bytes(buf.data, len);
    put_u64(f + 16, (uint64_t)1 << 20); /* 2^23 values (32 MiB), int8 group 4: 2^24 encoded */
    put_u64(f + 64, (uint64_t)1 << 24);
    put_u64(f + 72, (uint64_t)1 << 24);
    reseal(f);
    CHECK(verdict(f, len, LIMIT) == SF_E_FRAME_TOO_LARGE);
    CHECK(verdict(f, len, (size_t)1 << 26) == SF_E_FRAME_TRUNCATED); /* allowed, but not there */
    free(f);
    /* The limit itself: the exact decoded size passes, one byte less does not. */
    CHECK(verdict(buf.data, len, 16 * sizeof(float)) == SF_OK);
    CHECK(verdict(buf.data, len, 16 * sizeof(float) - 1) == SF_E_FRAME_TOO_LARGE);
    /* Shorter than a header, and a destination too small. */
    CHECK(sf_frame_peek(buf.data, SF_FRAME_HEADER_SIZE - 1, LIMIT, &h) == SF_E_FRAME_TRUNCATED);
    CHECK_OK(sf_frame_peek(buf.data, SF_FRAME_HEADER_SIZE, LIMIT, &h)); /* payload need not be there */
    float y[16];
    CHECK(sf_frame_decode_into(buf.data, len, LIMIT, &h, y, sizeof y - 1, NULL) == SF_E_INVAL);
    void *none = &h;
    CHECK(sf_frame_decode(NULL, 0, LIMIT, &h, &none, NULL) == SF_E_FRAME_TRUNCATED && none == NULL);
    sf_buffer_release(&buf);
}

static void test_payload_damage(sf_codec codec)
{
    sf_buffer buf = {0};
    float x[16];
    small_frame(codec, &buf, x);
    size_t len = buf.len, payload = len - SF_FRAME_HEADER_SIZE;
    int bad = 0, codec_checked = 0;
    for (size_t bit = 0; bit < payload * 8; bit++) {
        uint8_t *f = dup_bytes(buf.data, len);
        f[SF_FRAME_HEADER_SIZE + bit / 8] ^= (uint8_t)(1u << (bit % 8));
        if (verdict(f, len, LIMIT) != SF_E_FRAME) bad++;
        /* Past a resealed checksum the codec and dequantizer must still never crash: they
         * either decode something or refuse with SF_E_FRAME. */
        reseal_payload(f, payload);
        int rc = verdict(f, len, LIMIT);
        if (rc != SF_OK && rc != SF_E_FRAME) bad++;
        codec_checked += rc == SF_E_FRAME;
        free(f);
    }
    CHECKF(bad == 0, "%s: %d payload bit flips not rejected as SF_E_FRAME", sf_codec_name(codec), bad);
    /* Scale bytes set to NaN (raw) or a broken compressed stream must be caught downstream. */
    if (codec == SF_CODEC_RAW) CHECK(codec_checked > 0);

    /* Truncation at every offset: a fresh allocation of exactly that many bytes each time. */
    int wrong = 0;
    for (size_t cut = 0; cut < len; cut++) {
        if (verdict(buf.data, cut, LIMIT) != SF_E_FRAME_TRUNCATED) wrong++;
        uint8_t *f = dup_bytes(buf.data, cut);
        float y[16];
        if (sf_frame_decode_into(f, cut, LIMIT, NULL, y, sizeof y, NULL) != SF_E_FRAME_TRUNCATED) wrong++;
        sf_frame_header h;
        int peek = sf_frame_peek(f, cut, LIMIT, &h);
        if (peek != (cut < SF_FRAME_HEADER_SIZE ? SF_E_FRAME_TRUNCATED : SF_OK)) wrong++;
        free(f);
    }
    CHECKF(wrong == 0, "%s: %d truncations not reported as SF_E_FRAME_TRUNCATED", sf_codec_name(codec), wrong);
    sf_buffer_release(&buf);
}

/* Well-formed codec streams that decode to a different size than the header claims. */
static void test_codec_size_lies(void)
{
    uint8_t plain[200], packed[512];
    for (int i = 0; i < 200; i++) plain[i] = (uint8_t)(i % 5);
    int lz = LZ4_compress_default((const char *)plain, (char *)packed, 200, (int)sizeof packed);
    size_t zs = ZSTD_compress(packed + 256, 256, plain, 200, 3);
    CHECK(lz > 0 && !ZSTD_isError(zs));
    const uint64_t claims[] = {100, 300};
    for (int codec = SF_CODEC_LZ4; codec <= SF_CODEC_ZSTD; codec++) {
        for (size_t k = 0; k < 2; k++) {
            const uint8_t *src = codec == SF_CODEC_LZ4 ? packed : packed + 256;
            size_t src_len = codec == SF_CODEC_LZ4 ? (size_t)lz : zs;
            uint8_t f[SF_FRAME_HEADER_SIZE + 512] = {0};
            memcpy(f, SF_FRAME_MAGIC, 4);
            put_u16(f + 4, SF_FRAME_VERSION);
            put_u16(f + 6, SF_FRAME_BLOB);
            f[8] = SF_FRAME_U8;
            f[9] = (uint8_t)codec;
            f[11] = 1;
            put_u64(f + 16, claims[k]);
            put_u64(f + 64, claims[k]);
            put_u64(f + 72, src_len);
            memcpy(f + 96, src, src_len);
            reseal_payload(f, src_len);
            int rc = verdict(f, 96 + src_len, LIMIT);
            CHECKF(rc == SF_E_FRAME, "%s stream of 200 bytes claimed as %llu: rc %d", sf_codec_name((sf_codec)codec),
                   (unsigned long long)claims[k], rc);
            /* The honest claim decodes. */
            put_u64(f + 16, 200);
            put_u64(f + 64, 200);
            reseal(f);
            void *v = NULL;
            CHECK_OK(sf_frame_decode(f, 96 + src_len, LIMIT, NULL, &v, NULL));
            CHECK(v && memcmp(v, plain, 200) == 0);
            free(v);
        }
    }
}

static void test_encode_validation(void)
{
    float x[8] = {0};
    sf_buffer buf = {0};
    CHECK_OK(sf_buffer_append(&buf, "xy", 2));
    const sf_frame_desc good = {.kind = SF_FRAME_HIDDEN, .dtype = SF_FRAME_F32, .ndim = 1, .shape = {8},
                                .codec = SF_CODEC_LZ4, .quant = {SF_QUANT_INT4, 4}};
    sf_frame_desc d;
#define REFUSE(change, bytes)                                                                                    \
    do {                                                                                                         \
        d = good;                                                                                                \
        change;                                                                                                  \
        int rc_ = sf_frame_encode(&d, x, bytes, NULL, &buf);                                                     \
        CHECKF(rc_ == SF_E_INVAL && buf.len == 2 && sf_last_error()[0], "%s: rc %d", #change, rc_);              \
    } while (0)
    REFUSE((void)0, sizeof x - 4);
    REFUSE(d.kind = (sf_frame_kind)0, sizeof x);
    REFUSE(d.dtype = (sf_frame_dtype)9, sizeof x);
    REFUSE(d.ndim = 5, sizeof x);
    REFUSE(d.ndim = -1, sizeof x);
    REFUSE((d.ndim = 2, d.shape[1] = 0), sizeof x);
    REFUSE(d.codec = (sf_codec)7, sizeof x);
    REFUSE(d.level = 13, sizeof x);
    REFUSE((d.codec = SF_CODEC_ZSTD, d.level = 20), sizeof x);
    REFUSE(d.level = -1, sizeof x);
    REFUSE(d.quant.group = 3, sizeof x);
    REFUSE(d.quant.group = 0, sizeof x);
    REFUSE(d.quant.kind = (sf_quant_kind)9, sizeof x);
    REFUSE(d.dtype = SF_FRAME_U32, sizeof x);
    REFUSE((d.dtype = SF_FRAME_U8, d.quant.kind = SF_QUANT_F32, d.shape[0] = 31), sizeof x);
#undef REFUSE
    CHECK(sf_frame_encode(NULL, x, sizeof x, NULL, &buf) == SF_E_INVAL);
    CHECK(sf_frame_encode(&good, NULL, sizeof x, NULL, &buf) == SF_E_INVAL && buf.len == 2);
    /* Feedback on integer data is refused. */
    sf_quant_feedback fb;
    CHECK_OK(sf_quant_feedback_init(&fb, 32));
    d = good;
    d.dtype = SF_FRAME_U8, d.quant.kind = SF_QUANT_F32, d.shape[0] = 32;
    CHECK(sf_frame_encode(&d, x, sizeof x, &fb, &buf) == SF_E_INVAL && buf.len == 2);
    sf_quant_feedback_release(&fb);
    CHECK_OK(sf_frame_encode(&good, x, sizeof x, NULL, &buf));
    sf_buffer_release(&buf);

    sf_codec c;
    CHECK_OK(sf_codec_parse("zstd", &c));
    CHECK(c == SF_CODEC_ZSTD);
    CHECK_OK(sf_codec_parse("lz4", &c));
    CHECK(c == SF_CODEC_LZ4 && !strcmp(sf_codec_name(SF_CODEC_RAW), "raw"));
    CHECK(sf_codec_parse("gzip", &c) == SF_E_INVAL && strstr(sf_last_error(), "gzip"));
    CHECK(sf_frame_dtype_size(SF_FRAME_U8) == 1 && sf_frame_dtype_size(SF_FRAME_F32) == 4 && sf_frame_dtype_size((sf_frame_dtype)0) == 0);
}

static void test_crc32c(void)
{
    /* The standard check value of CRC-32C. */
    CHECK(sf_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(sf_crc32c(0, NULL, 0) == 0);
    uint8_t data[301];
    for (int i = 0; i < 301; i++) data[i] = (uint8_t)(i * 37 + 11);
    /* Continuation and unaligned starts agree with one pass. */
    uint32_t whole = sf_crc32c(0, data + 1, 300);
    for (size_t split = 0; split <= 300; split += 13)
        CHECK(sf_crc32c(sf_crc32c(0, data + 1, split), data + 1 + split, 300 - split) == whole);
    /* Lengths around the interleaved path's blocks (3 x 4096 bytes) against the bitwise
     * definition, at every alignment. */
    enum { BIG = 3 * 4096 * 2 + 64 };
    uint8_t *big = malloc(BIG);
    for (int i = 0; i < BIG; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    static const size_t lens[] = {7, 8, 4095, 12287, 12288, 12289, 24576, BIG - 8};
    for (int off = 0; off < 8; off++)
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            uint32_t c = ~7u;
            for (size_t i = 0; i < lens[k]; i++) {
                c ^= big[off + i];
                for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
            }
            CHECKF(sf_crc32c(7, big + off, lens[k]) == ~c, "crc32c of %zu bytes at offset %d", lens[k], off);
        }
    free(big);
    /* Joining the CRCs of two pieces gives the CRC of both, empty pieces included. */
    for (size_t split = 0; split <= 300; split += 13)
        CHECK(sf_crc32c_combine(sf_crc32c(0, data + 1, split), sf_crc32c(0, data + 1 + split, 300 - split),
                                300 - split) == whole);
    CHECK(sf_crc32c_combine(whole, 0, 0) == whole && sf_crc32c_combine(0, whole, 300) == whole);
    /* In pieces on several threads: the one-pass value, for lengths that split unevenly and
     * with a CRC to continue from. */
    const size_t huge = (size_t)5 << 20;
    uint8_t *h = malloc(huge + 3);
    for (size_t i = 0; i < huge + 3; i++) h[i] = (uint8_t)(i * 2654435761u >> 17);
    static const size_t hlens[] = {((size_t)1 << 20) - 1, (size_t)2 << 20, ((size_t)5 << 20) + 3};
    for (size_t k = 0; k < sizeof hlens / sizeof *hlens; k++)
        for (int t = 1; t <= 8; t += 3) {
            CHECKF(sf_crc32c_parallel(0, h, hlens[k], t) == sf_crc32c(0, h, hlens[k]), "%zu bytes on %d threads",
                   hlens[k], t);
            CHECK(sf_crc32c_parallel(99, h, hlens[k], t) == sf_crc32c(99, h, hlens[k]));
        }
    free(h);
}

int main(void)
{
    test_crc32c();
    test_float_round_trips();
    test_lossless_round_trips();
    test_nonfinite();
    for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++)
        test_feedback((sf_quant_kind)kind, kind == SF_QUANT_INT4 ? 16 : 32);
    test_encode_validation();
    test_codec_size_lies();
    for (int codec = SF_CODEC_RAW; codec <= SF_CODEC_ZSTD; codec++) {
        test_header_fields((sf_codec)codec);
        test_payload_damage((sf_codec)codec);
    }
    return check_finish("test_frame");
}
