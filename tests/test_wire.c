/* The packet wire format (pipeline/wire.h): every kind of packet comes back identical, lossy
 * rows within the quantizer's bound with error feedback carried per stream and dropped at
 * FINAL, every truncation or flipped byte is refused with an SF_E_FRAME* code, the shuffle
 * option marks exactly the frames whose values it regroups, and a head encoded without the rows
 * is the whole encoding's start. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "compress/quantize.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"
#include "support/check.h"

static sf_packet *sample(int which, check_rng *r)
{
    sf_packet *p = NULL;
    size_t n = 5, w = 7;
    switch (which) {
    case 0: /* tokens only */
        p = sf_packet_new(SF_PACKET_SEGMENT, n, 0);
        p->n = n;
        for (size_t i = 0; i < n; i++) p->tokens[i] = (uint32_t)check_rng_next(r);
        break;
    case 1: /* f32 rows with tokens */
        p = sf_packet_new(SF_PACKET_HIDDEN, n, n * w);
        p->n = n, p->width = w;
        for (size_t i = 0; i < n; i++) p->tokens[i] = (uint32_t)i;
        check_fill_normal(r, p->x, n * w, 3.0);
        break;
    case 2: /* bf16 rows */
        p = sf_packet_new(SF_PACKET_HIDDEN, 0, n * w);
        p->n = n, p->width = w;
        check_fill_normal(r, p->x, n * w, 3.0);
        sf_packet_to_bf16(p);
        break;
    case 3: /* a checkpoint marker with state */
        p = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0);
        p->state = malloc(300);
        p->state_len = p->state_cap = 300;
        for (int i = 0; i < 300; i++) p->state[i] = (uint8_t)check_rng_next(r);
        break;
    default: /* a final empty packet */
        p = sf_packet_new(SF_PACKET_FLUSH, 0, 0);
        break;
    }
    p->flags = which == 4 ? SF_PACKET_FINAL : (uint32_t)which;
    p->stream = 1000 + (uint64_t)which, p->segment = 7, p->position = 7 * 64;
    return p;
}

static int same(const sf_packet *a, const sf_packet *b)
{
    if (a->kind != b->kind || a->flags != b->flags || a->stream != b->stream || a->segment != b->segment ||
        a->position != b->position || a->n != b->n || a->width != b->width || a->state_len != b->state_len)
        return 0;
    if ((a->tokens != NULL) != (b->tokens != NULL) && a->n) return 0;
    if (a->tokens && a->n && memcmp(a->tokens, b->tokens, a->n * 4)) return 0;
    if (a->n && a->width && (a->dtype != b->dtype || memcmp(sf_packet_rows(a), sf_packet_rows(b), sf_packet_row_bytes(a))))
        return 0;
    return !a->state_len || memcmp(a->state, b->state, a->state_len) == 0;
}

static int is_frame_error(int rc)
{
    return rc == SF_E_FRAME || rc == SF_E_FRAME_TRUNCATED || rc == SF_E_FRAME_VERSION || rc == SF_E_FRAME_TOO_LARGE;
}

int main(void)
{
    check_rng r = {42};
    const sf_codec codecs[] = {SF_CODEC_RAW, SF_CODEC_LZ4, SF_CODEC_ZSTD};
    for (int c = 0; c < 3; c++)
        for (int which = 0; which < 5; which++) {
            sf_packet *p = sample(which, &r);
            sf_wire_options o = {codecs[c], 0, SF_QUANT_F32, 0, 0};
            sf_buffer b = {0};
            CHECK_OK(sf_wire_encode(p, &o, NULL, &b));
            sf_packet *q = NULL;
            CHECK_OK(sf_wire_decode(b.data, b.len, 1 << 20, &q));
            CHECKF(q && same(p, q), "codec %d packet %d differs", c, which);
            sf_packet_free(q);
            /* every truncation and (for the raw codec) every flipped byte is refused */
            int bad = 0;
            for (size_t len = 0; len < b.len; len++) {
                int rc = sf_wire_decode(b.data, len, 1 << 20, &q);
                bad += !is_frame_error(rc) || q != NULL;
            }
            CHECKF(bad == 0, "%d truncations of packet %d accepted", bad, which);
            if (c == 0) {
                bad = 0;
                for (size_t i = 0; i < b.len; i++) {
                    b.data[i] ^= 0x10;
                    int rc = sf_wire_decode(b.data, b.len, 1 << 20, &q);
                    bad += rc == SF_OK || q != NULL;
                    sf_packet_free(q);
                    b.data[i] ^= 0x10;
                }
                CHECKF(bad == 0, "%d flipped bytes of packet %d accepted", bad, which);
                /* a trailing byte and a limit below the packet's size */
                CHECK_OK(sf_buffer_append(&b, "x", 1));
                CHECK(sf_wire_decode(b.data, b.len, 1 << 20, &q) == SF_E_FRAME);
                if (which == 1) CHECK(sf_wire_decode(b.data, b.len - 1, 16, &q) == SF_E_FRAME_TOO_LARGE);
            }
            sf_buffer_release(&b);
            sf_packet_free(p);
        }

    /* the head alone (the rows sent as they are, without a copy): with the rows' CRC set in it
     * (computed on one or four threads), head + rows is the raw, lossless encoding byte for
     * byte, for f32 and bf16 rows; packets with tokens or state are refused */
    for (int which = 0; which < 5; which++) {
        sf_packet *p = sample(which, &r);
        if (which == 1) free(p->tokens), p->tokens = NULL, p->cap_tokens = 0; /* rows alone */
        for (int threads = 1; threads <= 4; threads += 3) {
            sf_buffer whole = {0}, head = {0};
            const void *rows = NULL;
            size_t rows_len = 0;
            int rc = sf_wire_encode_head(p, &head, &rows, &rows_len);
            if (which == 1 || which == 2) {
                CHECK_OK(rc);
                sf_frame_header_set_payload_crc(head.data + head.len - SF_FRAME_HEADER_SIZE,
                                                sf_crc32c_parallel(0, rows, rows_len, threads));
                CHECK_OK(sf_wire_encode(p, NULL, NULL, &whole));
                CHECK(rows == sf_packet_rows(p) && rows_len == sf_packet_row_bytes(p));
                CHECKF(head.len + rows_len == whole.len && memcmp(head.data, whole.data, head.len) == 0 &&
                           memcmp(whole.data + head.len, rows, rows_len) == 0,
                       "packet %d: head and rows differ from the whole encoding", which);
            } else {
                CHECK(rc == SF_E_UNSUPPORTED && head.len == 0);
            }
            sf_buffer_release(&whole);
            sf_buffer_release(&head);
        }
        sf_packet_free(p);
    }
    /* rows of 2 MiB: their CRC on four threads is the one-thread CRC */
    {
        sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, (size_t)1 << 19);
        p->n = 512, p->width = 1024, p->stream = 3;
        check_fill_normal(&r, p->x, p->n * p->width, 1.0);
        sf_buffer whole = {0}, head = {0};
        const void *rows = NULL;
        size_t rows_len = 0;
        CHECK_OK(sf_wire_encode_head(p, &head, &rows, &rows_len));
        sf_frame_header_set_payload_crc(head.data + head.len - SF_FRAME_HEADER_SIZE,
                                        sf_crc32c_parallel(0, rows, rows_len, 4));
        CHECK_OK(sf_wire_encode(p, NULL, NULL, &whole));
        CHECK(head.len + rows_len == whole.len && memcmp(head.data, whole.data, head.len) == 0);
        sf_buffer_release(&whole);
        sf_buffer_release(&head);
        sf_packet_free(p);
    }

    /* int8 + lz4 with error feedback: each packet decodes as the quantizer with the stream's
     * residual says, and the running sum stays within one message's bound of the exact one */
    {
        const size_t n = 16, w = 48, count = n * w;
        sf_wire_feedback *fb = NULL;
        CHECK_OK(sf_wire_feedback_create(&fb));
        sf_wire_options o = {SF_CODEC_LZ4, 0, SF_QUANT_INT8, 0, 0};
        sf_quant_params qp = {SF_QUANT_INT8, (int)w};
        sf_quant_feedback mine;
        CHECK_OK(sf_quant_feedback_init(&mine, count));
        double *sum_x = calloc(count, sizeof *sum_x), *sum_y = calloc(count, sizeof *sum_y);
        float *expect = malloc(count * sizeof *expect);
        uint8_t *enc = malloc(sf_quant_encoded_size(&qp, count));
        int mismatches = 0;
        double worst = 0, bound = 0;
        for (int s = 0; s < 6; s++) {
            sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, count);
            p->n = n, p->width = w, p->stream = 9, p->segment = (uint64_t)s;
            p->flags = s == 5 ? SF_PACKET_FINAL : 0;
            check_fill_normal(&r, p->x, count, 1.0);
            float *v = malloc(count * sizeof *v);
            for (size_t i = 0; i < count; i++) v[i] = p->x[i] + mine.residual[i];
            bound = sf_quant_error_bound(&qp, v, count);
            free(v);
            CHECK_OK(sf_quantize_with_feedback(&qp, &mine, p->x, count, enc, sf_quant_encoded_size(&qp, count)));
            CHECK_OK(sf_dequantize(&qp, enc, sf_quant_encoded_size(&qp, count), expect, count));
            sf_buffer b = {0};
            CHECK_OK(sf_wire_encode(p, &o, fb, &b));
            size_t held = 0;
            CHECK(sf_wire_feedback_streams(fb, &held) == (s == 5 ? 0u : 1u));
            CHECK(held == (s == 5 ? 0 : count * sizeof(float)));
            sf_packet *q = NULL;
            CHECK_OK(sf_wire_decode(b.data, b.len, 1 << 20, &q));
            if (q) {
                mismatches += memcmp(q->x, expect, count * sizeof(float)) != 0;
                for (size_t i = 0; i < count; i++) sum_x[i] += p->x[i], sum_y[i] += q->x[i];
            }
            sf_packet_free(q);
            sf_packet_free(p);
            sf_buffer_release(&b);
        }
        for (size_t i = 0; i < count; i++) worst = fmax(worst, fabs(sum_x[i] - sum_y[i]));
        CHECKF(mismatches == 0, "%d packets differ from the quantizer with feedback", mismatches);
        CHECKF(worst <= bound * 1.01 + 1e-6, "running sum off by %g (bound %g)", worst, bound);
        sf_quant_feedback_release(&mine);
        sf_wire_feedback_free(fb);
        free(sum_x), free(sum_y), free(expect), free(enc);
    }

    /* shuffle on: every packet comes back identical (bf16-quantized rows as without it), the
     * frames of 4- and 2-byte values carry the shuffle flag and the others do not; under raw
     * the option changes no byte */
    for (int c = 0; c < 3; c++)
        for (int which = 0; which < 5; which++)
            for (int quant = SF_QUANT_F32; quant <= SF_QUANT_BF16; quant++) {
                sf_packet *p = sample(which, &r);
                sf_wire_options on = {codecs[c], 0, (sf_quant_kind)quant, 0, 1}, off = on;
                off.shuffle = 0;
                sf_buffer b = {0}, plain = {0};
                CHECK_OK(sf_wire_encode(p, &on, NULL, &b));
                CHECK_OK(sf_wire_encode(p, &off, NULL, &plain));
                sf_packet *q = NULL, *q_plain = NULL;
                CHECK_OK(sf_wire_decode(b.data, b.len, 1 << 20, &q));
                CHECK_OK(sf_wire_decode(plain.data, plain.len, 1 << 20, &q_plain));
                CHECKF(q && q_plain && same(q_plain, q), "shuffle: codec %d quant %d packet %d differs", c, quant, which);
                if (quant == SF_QUANT_F32) CHECKF(q && same(p, q), "shuffle: codec %d packet %d differs", c, which);
                if (c == 0) CHECK(b.len == plain.len && memcmp(b.data, plain.data, b.len) == 0);
                /* walk the frames: tokens (u32) and f32 rows are shuffled, bf16 rows (u8) and
                 * state (u8) are not */
                int wrong = 0, flagged = 0;
                for (size_t off_at = SF_WIRE_HEADER_SIZE; off_at + SF_FRAME_HEADER_SIZE <= b.len;) {
                    sf_frame_header h;
                    if (sf_frame_peek(b.data + off_at, b.len - off_at, 1 << 20, &h) != SF_OK) {
                        wrong++;
                        break;
                    }
                    const int want = c != 0 && (h.dtype == SF_FRAME_U32 || h.dtype == SF_FRAME_F32);
                    wrong += h.shuffled != want;
                    flagged += h.shuffled;
                    off_at += SF_FRAME_HEADER_SIZE + (size_t)h.payload_bytes;
                }
                const int expect_flagged = c == 0 ? 0 : which == 0 ? 1 : which == 1 ? 2 : 0;
                CHECKF(wrong == 0 && flagged == expect_flagged, "codec %d packet %d: %d frames shuffled, %d wrong", c,
                       which, flagged, wrong);
                sf_packet_free(q), sf_packet_free(q_plain);
                sf_buffer_release(&b), sf_buffer_release(&plain);
                sf_packet_free(p);
            }

    /* a header whose sizes claim far more than the limit is refused before any allocation */
    {
        sf_packet *p = sample(1, &r);
        sf_buffer b = {0};
        CHECK_OK(sf_wire_encode(p, NULL, NULL, &b));
        sf_packet *q = NULL;
        CHECK(sf_wire_decode(b.data, b.len, 64, &q) == SF_E_FRAME_TOO_LARGE && q == NULL);
        sf_buffer_release(&b);
        sf_packet_free(p);
    }
    return check_finish("test_wire");
}
