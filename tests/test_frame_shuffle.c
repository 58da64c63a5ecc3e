/* The byte shuffle (compress/shuffle.h) and shuffled frames (compress/frame.h): the layout
 * against its definition for every width and length (incomplete last elements included), frame
 * round trips of f32, bf16-quantized and u32 values of odd and even counts under LZ4 and zstd
 * (the codec's input checked to be exactly the shuffled bytes), the cases where a request is
 * ignored (raw, 1-byte values, empty frames) leaving the frame byte-identical, and a decoder that
 * refuses unknown flag bits and the shuffle flag where it never applies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "compress/frame.h"
#include "compress/shuffle.h"
#include "seqflow/error.h"
#include "support/check.h"

#define LIMIT ((size_t)1 << 24)
#define OFF_FLAGS 80

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void reseal(uint8_t *f) { put_u32(f + 84, sf_crc32c(0, f, 84)); }

/* Exactly len bytes in their own allocation, so that ASan catches any read past them. */
static uint8_t *dup_bytes(const uint8_t *p, size_t len)
{
    uint8_t *d = malloc(len ? len : 1);
    if (len) memcpy(d, p, len);
    return d;
}

static int encode(sf_frame_dtype dtype, uint64_t rows, uint64_t cols, sf_codec codec, int level, sf_quant_kind quant,
                  int shuffle, const void *data, size_t bytes, sf_buffer *out)
{
    sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = dtype, .ndim = rows ? 2 : 0, .shape = {rows, rows ? cols : 0},
                       .stream = 3, .segment = 9, .codec = codec, .level = level,
                       .quant = {quant, quant == SF_QUANT_INT4 ? 2 : 4}, .shuffle = shuffle};
    return sf_frame_encode(&d, data, bytes, NULL, out);
}

/* ---- the filter itself --------------------------------------------------------------------- */

static void test_layout(void)
{
    const uint8_t src[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint8_t dst[8], back[8];
    static const uint8_t by4[8] = {0, 4, 1, 5, 2, 6, 3, 7}, by2[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    sf_byte_shuffle(src, dst, 8, 4);
    CHECK(memcmp(dst, by4, 8) == 0);
    sf_byte_shuffle(src, dst, 8, 2);
    CHECK(memcmp(dst, by2, 8) == 0);
    /* 7 bytes of width 2: three elements, the odd last byte stays where it is */
    static const uint8_t by2_7[7] = {0, 2, 4, 1, 3, 5, 6};
    sf_byte_shuffle(src, dst, 7, 2);
    CHECK(memcmp(dst, by2_7, 7) == 0);

    /* Every width 1..9 and length 0..70 against the definition, and the inverse. */
    enum { MAX = 70 };
    uint8_t in[MAX], sh[MAX], un[MAX];
    check_rng r = {99};
    int wrong = 0;
    for (size_t width = 0; width <= 9; width++)
        for (size_t len = 0; len <= MAX; len++) {
            for (size_t i = 0; i < len; i++) in[i] = (uint8_t)check_rng_next(&r);
            memset(sh, 0xEE, sizeof sh);
            sf_byte_shuffle(in, sh, len, width);
            size_t w = width ? width : 1, n = len / w;
            for (size_t i = 0; i < n * w; i++) wrong += sh[(i % w) * n + i / w] != in[i];
            for (size_t i = n * w; i < len; i++) wrong += sh[i] != in[i];
            for (size_t i = len; i < MAX; i++) wrong += sh[i] != 0xEE; /* nothing past len */
            memset(un, 0xEE, sizeof un);
            sf_byte_unshuffle(sh, un, len, width);
            wrong += memcmp(un, in, len) != 0;
            for (size_t i = len; i < MAX; i++) wrong += un[i] != 0xEE;
        }
    CHECKF(wrong == 0, "%d shuffled or unshuffled bytes differ from the definition", wrong);
    sf_byte_shuffle(NULL, NULL, 0, 4); /* nothing to do, nothing touched */
    sf_byte_unshuffle(src, back, 8, 4);
    sf_byte_shuffle(back, dst, 8, 4);
    CHECK(memcmp(dst, src, 8) == 0);
}

/* ---- round trips --------------------------------------------------------------------------- */

/* The codec's output of a frame's payload (what the encoder compressed). */
static uint8_t *codec_input(const uint8_t *frame, sf_codec codec, size_t encoded)
{
    uint8_t *out = malloc(encoded);
    size_t payload = (size_t)frame[72] | (size_t)frame[73] << 8 | (size_t)frame[74] << 16 | (size_t)frame[75] << 24;
    if (codec == SF_CODEC_LZ4) {
        int r = LZ4_decompress_safe((const char *)frame + 96, (char *)out, (int)payload, (int)encoded);
        CHECK(r == (int)encoded);
    } else {
        size_t r = ZSTD_decompress(out, encoded, frame + 96, payload);
        CHECK(r == encoded);
    }
    return out;
}

typedef struct {
    sf_codec codec;
    int level;
} codec_case;
static const codec_case codecs[] = {{SF_CODEC_LZ4, 0}, {SF_CODEC_LZ4, 9}, {SF_CODEC_ZSTD, 0}, {SF_CODEC_ZSTD, 19}};

/* rows x cols values of dtype/quant, shuffled and not: the shuffled frame carries the flag, its
 * codec input is the shuffle of the unshuffled frame's codec input, and both decode the same. */
static void round_trip(sf_frame_dtype dtype, sf_quant_kind quant, uint64_t rows, uint64_t cols, check_rng *r)
{
    size_t n = (size_t)(rows * cols), vsize = 4; /* u32 or f32 values */
    size_t width = dtype == SF_FRAME_U32 || quant == SF_QUANT_F32 ? 4 : 2, encoded = n * width;
    void *x = malloc(n * vsize);
    if (dtype == SF_FRAME_U32)
        for (size_t i = 0; i < n; i++) ((uint32_t *)x)[i] = (uint32_t)(check_rng_next(r) % 50257);
    else
        for (size_t i = 0; i < n; i++) ((float *)x)[i] = (float)(0.3 * sin(0.01 * (double)i) + 0.01 * check_rng_normal(r));
    for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
        sf_buffer plain = {0}, shuf = {0};
        CHECK_OK(encode(dtype, rows, cols, codecs[c].codec, codecs[c].level, quant, 0, x, n * vsize, &plain));
        CHECK_OK(sf_buffer_append(&shuf, "pre", 3)); /* frames append after what is there */
        CHECK_OK(encode(dtype, rows, cols, codecs[c].codec, codecs[c].level, quant, 1, x, n * vsize, &shuf));
        if (plain.len < SF_FRAME_HEADER_SIZE || shuf.len < 3 + SF_FRAME_HEADER_SIZE) {
            sf_buffer_release(&plain), sf_buffer_release(&shuf);
            continue;
        }
        const uint8_t *f = shuf.data + 3;
        size_t len = shuf.len - 3;
        CHECK(get_u32(plain.data + OFF_FLAGS) == 0 && get_u32(f + OFF_FLAGS) == SF_FRAME_SHUFFLED);

        uint8_t *in_plain = codec_input(plain.data, codecs[c].codec, encoded);
        uint8_t *in_shuf = codec_input(f, codecs[c].codec, encoded);
        uint8_t *want = malloc(encoded);
        sf_byte_shuffle(in_plain, want, encoded, width);
        CHECKF(memcmp(in_shuf, want, encoded) == 0, "%llu x %llu, width %zu, %s/%d: codec input is not the shuffle",
               (unsigned long long)rows, (unsigned long long)cols, width, sf_codec_name(codecs[c].codec),
               codecs[c].level);
        free(in_plain), free(in_shuf), free(want);

        sf_frame_header h;
        size_t used = 0;
        void *expect = NULL, *got = malloc(n * vsize);
        CHECK_OK(sf_frame_decode(plain.data, plain.len, LIMIT, NULL, &expect, NULL));
        uint8_t *copy = dup_bytes(f, len);
        memset(got, 0xA5, n * vsize);
        CHECK_OK(sf_frame_decode_into(copy, len, LIMIT, &h, got, n * vsize, &used));
        CHECK(used == len && h.shuffled == 1 && h.codec == codecs[c].codec && h.encoded_bytes == encoded);
        CHECK(h.shape[0] == rows && h.shape[1] == cols && h.value_bytes == n * vsize);
        CHECKF(expect && memcmp(got, expect, n * vsize) == 0, "%llu x %llu %s: shuffled frame decodes differently",
               (unsigned long long)rows, (unsigned long long)cols, sf_codec_name(codecs[c].codec));
        if (quant == SF_QUANT_F32) CHECK(memcmp(got, x, n * vsize) == 0); /* lossless: bit-exact */
        void *alloc = NULL;
        CHECK_OK(sf_frame_decode(copy, len, LIMIT, NULL, &alloc, NULL));
        CHECK(alloc && memcmp(alloc, expect, n * vsize) == 0);
        free(alloc), free(expect), free(got), free(copy);
        sf_buffer_release(&plain), sf_buffer_release(&shuf);
    }
    free(x);
}

static void test_round_trips(void)
{
    check_rng r = {7};
    static const uint64_t shapes[][2] = {{1, 1}, {1, 3}, {3, 5}, {7, 9}, {1, 63}, {2, 64}, {13, 77}, {1, 4097}, {64, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        round_trip(SF_FRAME_F32, SF_QUANT_F32, shapes[s][0], shapes[s][1], &r);
        round_trip(SF_FRAME_F32, SF_QUANT_BF16, shapes[s][0], shapes[s][1], &r);
        round_trip(SF_FRAME_U32, SF_QUANT_F32, shapes[s][0], shapes[s][1], &r);
    }
    /* NaN, Inf and signed zeros survive the shuffle bit for bit */
    float odd[5] = {NAN, -INFINITY, -0.0f, 1e-42f, 3.0f};
    sf_buffer b = {0};
    CHECK_OK(encode(SF_FRAME_F32, 1, 5, SF_CODEC_ZSTD, 1, SF_QUANT_F32, 1, odd, sizeof odd, &b));
    float back[5];
    CHECK_OK(sf_frame_decode_into(b.data, b.len, LIMIT, NULL, back, sizeof back, NULL));
    CHECK(memcmp(back, odd, sizeof odd) == 0);
    sf_buffer_release(&b);
}

/* Error feedback quantizes into the payload area before the shuffle: the same values come out,
 * and the residual moves the same way, as without the shuffle. */
static void test_feedback(void)
{
    enum { N = 301 };
    sf_quant_feedback a, s;
    CHECK_OK(sf_quant_feedback_init(&a, N));
    CHECK_OK(sf_quant_feedback_init(&s, N));
    check_rng r = {11};
    float x[N], ya[N], ys[N];
    int same = 0;
    for (int m = 0; m < 20; m++) {
        for (int i = 0; i < N; i++) x[i] = (float)check_rng_normal(&r);
        sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 1, .shape = {N},
                           .codec = SF_CODEC_LZ4, .quant = {SF_QUANT_BF16, 1}};
        sf_buffer ba = {0}, bs = {0};
        CHECK_OK(sf_frame_encode(&d, x, sizeof x, &a, &ba));
        d.shuffle = 1;
        CHECK_OK(sf_frame_encode(&d, x, sizeof x, &s, &bs));
        CHECK_OK(sf_frame_decode_into(ba.data, ba.len, LIMIT, NULL, ya, sizeof ya, NULL));
        CHECK_OK(sf_frame_decode_into(bs.data, bs.len, LIMIT, NULL, ys, sizeof ys, NULL));
        same += memcmp(ya, ys, sizeof ya) == 0 && memcmp(a.residual, s.residual, sizeof x) == 0;
        sf_buffer_release(&ba), sf_buffer_release(&bs);
    }
    CHECKF(same == 20, "%d of 20 bf16 messages with feedback alike with and without the shuffle", same);
    sf_quant_feedback_release(&a);
    sf_quant_feedback_release(&s);
}

/* Where the shuffle does not apply the request changes nothing: the frame is byte-identical. */
static void test_ignored(void)
{
    float x[24];
    for (int i = 0; i < 24; i++) x[i] = (float)i * 0.25f - 2.0f;
    static const struct {
        sf_frame_dtype dtype;
        sf_codec codec;
        sf_quant_kind quant;
        uint64_t rows;
        const char *why;
    } cases[] = {
        {SF_FRAME_F32, SF_CODEC_RAW, SF_QUANT_F32, 4, "raw f32"},   {SF_FRAME_F32, SF_CODEC_RAW, SF_QUANT_BF16, 4, "raw bf16"},
        {SF_FRAME_U32, SF_CODEC_RAW, SF_QUANT_F32, 4, "raw u32"},   {SF_FRAME_U8, SF_CODEC_LZ4, SF_QUANT_F32, 4, "u8"},
        {SF_FRAME_F32, SF_CODEC_ZSTD, SF_QUANT_INT8, 4, "int8"},    {SF_FRAME_F32, SF_CODEC_LZ4, SF_QUANT_INT4, 4, "int4"},
        {SF_FRAME_F32, SF_CODEC_ZSTD, SF_QUANT_FP8_E4M3, 4, "fp8"}, {SF_FRAME_F32, SF_CODEC_ZSTD, SF_QUANT_F32, 0, "empty"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t bytes = cases[k].rows ? (cases[k].dtype == SF_FRAME_U8 ? 24 : sizeof x) : 0;
        sf_buffer off = {0}, on = {0};
        CHECK_OK(encode(cases[k].dtype, cases[k].rows, 6, cases[k].codec, 0, cases[k].quant, 0, bytes ? x : NULL,
                        bytes, &off));
        CHECK_OK(encode(cases[k].dtype, cases[k].rows, 6, cases[k].codec, 0, cases[k].quant, 1, bytes ? x : NULL,
                        bytes, &on));
        CHECKF(off.len == on.len && memcmp(off.data, on.data, off.len) == 0, "%s: shuffle changed the frame",
               cases[k].why);
        sf_frame_header h;
        CHECK(sf_frame_peek(on.data, on.len, LIMIT, &h) == SF_OK && h.shuffled == 0);
        sf_buffer_release(&off), sf_buffer_release(&on);
    }
    /* shuffle is 0 or 1; anything else is refused and leaves the buffer alone */
    sf_buffer b = {0};
    CHECK_OK(sf_buffer_append(&b, "ab", 2));
    CHECK(encode(SF_FRAME_F32, 4, 6, SF_CODEC_LZ4, 0, SF_QUANT_F32, 2, x, sizeof x, &b) == SF_E_INVAL && b.len == 2);
    CHECK(encode(SF_FRAME_F32, 4, 6, SF_CODEC_RAW, 0, SF_QUANT_F32, -1, x, sizeof x, &b) == SF_E_INVAL && b.len == 2);
    CHECK(strstr(sf_last_error(), "shuffle") != NULL);
    sf_buffer_release(&b);
}

/* What shuffling is for: a smooth float32 field compresses much better shuffled. */
static void test_helps(void)
{
    enum { N = 16384 };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++) x[i] = (float)(sin(0.002 * i) * cos(0.0007 * i) + 1.5);
    for (int codec = SF_CODEC_LZ4; codec <= SF_CODEC_ZSTD; codec++) {
        sf_buffer off = {0}, on = {0};
        CHECK_OK(encode(SF_FRAME_F32, 128, 128, (sf_codec)codec, 0, SF_QUANT_F32, 0, x, N * sizeof *x, &off));
        CHECK_OK(encode(SF_FRAME_F32, 128, 128, (sf_codec)codec, 0, SF_QUANT_F32, 1, x, N * sizeof *x, &on));
        CHECKF(on.len * 5 < off.len * 4, "%s: shuffled %zu bytes, plain %zu", sf_codec_name((sf_codec)codec), on.len,
               off.len);
        sf_buffer_release(&off), sf_buffer_release(&on);
    }
    free(x);
}

/* ---- the header's flags ---------------------------------------------------------------------- */

static int verdict(const uint8_t *f, size_t len)
{
    uint8_t *copy = dup_bytes(f, len);
    sf_clear_error();
    void *out = NULL;
    int rc = sf_frame_decode(copy, len, LIMIT, NULL, &out, NULL);
    if (rc) CHECKF(sf_last_error()[0] && !strchr(sf_last_error(), '\n') && out == NULL, "rc %d", rc);
    free(out);
    free(copy);
    return rc;
}

/* The frame with its flags replaced and the header resealed: the decoder's answer. */
static int with_flags(const sf_buffer *b, uint32_t flags)
{
    uint8_t *f = dup_bytes(b->data, b->len);
    put_u32(f + OFF_FLAGS, flags);
    reseal(f);
    int rc = verdict(f, b->len);
    sf_frame_header h;
    int peek = sf_frame_peek(f, b->len, LIMIT, &h); /* flags are the header's: peek answers alike */
    CHECKF(peek == rc, "peek %d, decode %d", peek, rc);
    free(f);
    return rc;
}

static void test_flags(void)
{
    float x[30];
    for (int i = 0; i < 30; i++) x[i] = (float)i / 7.0f;
    sf_buffer shuf = {0}, plain = {0};
    CHECK_OK(encode(SF_FRAME_F32, 5, 6, SF_CODEC_LZ4, 0, SF_QUANT_F32, 1, x, sizeof x, &shuf));
    CHECK_OK(encode(SF_FRAME_F32, 5, 6, SF_CODEC_LZ4, 0, SF_QUANT_F32, 0, x, sizeof x, &plain));
    CHECK(verdict(shuf.data, shuf.len) == SF_OK);
    /* unknown bits, alone or beside the shuffle bit, are refused by the header check */
    static const uint32_t unknown[] = {2, 3, 0x80u, 0x100u, 0x80000000u, 0x80000001u, 0xFFFFFFFFu};
    for (size_t k = 0; k < sizeof unknown / sizeof unknown[0]; k++) {
        CHECKF(with_flags(&shuf, unknown[k]) == SF_E_FRAME, "flags 0x%x accepted", (unsigned)unknown[k]);
        CHECK(strstr(sf_last_error(), "flags") != NULL);
        CHECKF(with_flags(&plain, unknown[k]) == SF_E_FRAME, "flags 0x%x accepted", (unsigned)unknown[k]);
    }
    /* the flag decides how the payload is read: cleared, the same payload decodes to other values */
    uint8_t *f = dup_bytes(shuf.data, shuf.len);
    put_u32(f + OFF_FLAGS, 0);
    reseal(f);
    float y[30];
    CHECK_OK(sf_frame_decode_into(f, shuf.len, LIMIT, NULL, y, sizeof y, NULL));
    CHECK(memcmp(x, y, sizeof x) != 0);
    free(f);
    sf_buffer_release(&shuf), sf_buffer_release(&plain);

    /* the shuffle flag where the encoder never sets it: raw, 1-byte values, an empty frame */
    static const struct {
        sf_frame_dtype dtype;
        sf_codec codec;
        sf_quant_kind quant;
        uint64_t rows;
        const char *why;
    } never[] = {
        {SF_FRAME_F32, SF_CODEC_RAW, SF_QUANT_F32, 5, "raw f32"}, {SF_FRAME_U32, SF_CODEC_RAW, SF_QUANT_F32, 5, "raw u32"},
        {SF_FRAME_U8, SF_CODEC_ZSTD, SF_QUANT_F32, 5, "u8"},      {SF_FRAME_F32, SF_CODEC_LZ4, SF_QUANT_INT8, 5, "int8"},
        {SF_FRAME_F32, SF_CODEC_ZSTD, SF_QUANT_INT4, 5, "int4"},  {SF_FRAME_F32, SF_CODEC_LZ4, SF_QUANT_FP8_E4M3, 5, "fp8"},
        {SF_FRAME_F32, SF_CODEC_ZSTD, SF_QUANT_F32, 0, "empty"},
    };
    for (size_t k = 0; k < sizeof never / sizeof never[0]; k++) {
        sf_buffer b = {0};
        size_t bytes = never[k].rows ? (never[k].dtype == SF_FRAME_U8 ? 30 : sizeof x) : 0;
        CHECK_OK(encode(never[k].dtype, never[k].rows, 6, never[k].codec, 0, never[k].quant, 1, bytes ? x : NULL,
                        bytes, &b));
        CHECK(verdict(b.data, b.len) == SF_OK);
        int rc = with_flags(&b, SF_FRAME_SHUFFLED);
        CHECKF(rc == SF_E_FRAME && strstr(sf_last_error(), "shuffle"), "%s: shuffle flag gives %d (%s)", never[k].why, rc,
               sf_last_error());
        sf_buffer_release(&b);
    }
}

/* A shuffled frame damaged anywhere is refused, never a crash (under ASan: no stray read). */
static void test_damage(void)
{
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i * 1.5f;
    for (int quant = SF_QUANT_F32; quant <= SF_QUANT_BF16; quant++)
        for (int codec = SF_CODEC_LZ4; codec <= SF_CODEC_ZSTD; codec++) {
            sf_buffer b = {0};
            CHECK_OK(encode(SF_FRAME_F32, 3, 4, (sf_codec)codec, 0, (sf_quant_kind)quant, 1, x, sizeof x, &b));
            int bad = 0;
            for (size_t cut = 0; cut < b.len; cut++) bad += verdict(b.data, cut) != SF_E_FRAME_TRUNCATED;
            for (size_t bit = 0; bit < (b.len - SF_FRAME_HEADER_SIZE) * 8; bit++) {
                uint8_t *f = dup_bytes(b.data, b.len);
                f[SF_FRAME_HEADER_SIZE + bit / 8] ^= (uint8_t)(1u << (bit % 8));
                bad += verdict(f, b.len) != SF_E_FRAME;
                /* past a resealed payload checksum: decoded or refused, nothing else */
                put_u32(f + 88, sf_crc32c(0, f + SF_FRAME_HEADER_SIZE, b.len - SF_FRAME_HEADER_SIZE));
                reseal(f);
                int rc = verdict(f, b.len);
                bad += rc != SF_OK && rc != SF_E_FRAME;
                free(f);
            }
            CHECKF(bad == 0, "%s %s: %d damaged shuffled frames not refused as expected", quant ? "bf16" : "f32",
                   sf_codec_name((sf_codec)codec), bad);
            sf_buffer_release(&b);
        }
}

int main(void)
{
    test_layout();
    test_round_trips();
    test_feedback();
    test_ignored();
    test_helps();
    test_flags();
    test_damage();
    return check_finish("test_frame_shuffle");
}
