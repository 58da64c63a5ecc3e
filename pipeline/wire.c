/* Packets <-> bytes (pipeline/wire.h): an envelope and SPEC-8 frames. */
#include "pipeline/wire.h"

#include <stdlib.h>
#include <string.h>

#include "seqflow/error.h"

enum { PART_TOKENS = 1, PART_ROWS = 2, PART_STATE = 4 };

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
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

/* ---- error feedback: one residual per stream ------------------------------------------- */

typedef struct fb_entry {
    uint64_t stream;
    sf_quant_feedback fb;
} fb_entry;

struct sf_wire_feedback {
    fb_entry *e;
    size_t n, cap;
};

int sf_wire_feedback_create(sf_wire_feedback **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? SF_OK : sf_error(SF_E_NOMEM, "wire: out of memory for error feedback");
}

void sf_wire_feedback_free(sf_wire_feedback *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) sf_quant_feedback_release(&f->e[i].fb);
    free(f->e);
    free(f);
}

size_t sf_wire_feedback_streams(const sf_wire_feedback *f, size_t *bytes)
{
    size_t total = 0;
    for (size_t i = 0; f && i < f->n; i++) total += f->e[i].fb.n * sizeof(float);
    if (bytes) *bytes = total;
    return f ? f->n : 0;
}

static void fb_drop(sf_wire_feedback *f, uint64_t stream)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->e[i].stream == stream) {
            sf_quant_feedback_release(&f->e[i].fb);
            f->e[i] = f->e[--f->n];
            return;
        }
}

/* The stream's residual of `count` values (zeroed when new or of another size). */
static int fb_get(sf_wire_feedback *f, uint64_t stream, size_t count, sf_quant_feedback **out)
{
    fb_entry *e = NULL;
    for (size_t i = 0; i < f->n; i++)
        if (f->e[i].stream == stream) e = &f->e[i];
    if (!e) {
        if (f->n == f->cap) {
            size_t cap = f->cap ? 2 * f->cap : 4;
            fb_entry *grown = realloc(f->e, cap * sizeof *grown);
            if (!grown) return sf_error(SF_E_NOMEM, "wire: out of memory for error feedback");
            f->e = grown, f->cap = cap;
        }
        e = &f->e[f->n++];
        memset(e, 0, sizeof *e);
        e->stream = stream;
    }
    if (e->fb.n != count) {
        sf_quant_feedback_release(&e->fb);
        int rc = sf_quant_feedback_init(&e->fb, count);
        if (rc != SF_OK) {
            fb_drop(f, stream);
            return rc;
        }
    }
    *out = &e->fb;
    return SF_OK;
}

/* ---- encoding -------------------------------------------------------------------------- */

static int frame(sf_buffer *out, const sf_packet *p, const sf_wire_options *o, sf_frame_kind kind,
                 sf_frame_dtype dtype, int ndim, uint64_t d0, uint64_t d1, const void *data, size_t bytes,
                 sf_quant_params quant, sf_quant_feedback *fb)
{
    sf_frame_desc d = {0};
    d.kind = kind, d.dtype = dtype, d.ndim = ndim;
    d.shape[0] = d0, d.shape[1] = d1;
    d.stream = p->stream, d.segment = p->segment;
    d.codec = o->codec, d.level = o->level;
    d.quant = quant;
    d.shuffle = o->shuffle;
    return sf_frame_encode(&d, data, bytes, fb, out);
}

/* The 64-byte envelope of p with these parts. */
static void envelope(const sf_packet *p, unsigned parts, uint8_t h[SF_WIRE_HEADER_SIZE])
{
    memset(h, 0, SF_WIRE_HEADER_SIZE);
    memcpy(h, SF_WIRE_MAGIC, 4);
    h[4] = SF_WIRE_VERSION;
    h[5] = (uint8_t)p->kind;
    h[6] = (parts & PART_ROWS) ? (uint8_t)p->dtype : 0;
    h[7] = (uint8_t)parts;
    put_u32(h + 8, p->flags);
    put_u64(h + 16, p->stream);
    put_u64(h + 24, p->segment);
    put_u64(h + 32, p->position);
    put_u64(h + 40, p->n);
    put_u64(h + 48, p->width);
    put_u32(h + 60, sf_crc32c(0, h, 60));
}

int sf_wire_encode_head(const sf_packet *p, sf_buffer *out, const void **rows, size_t *rows_len)
{
    if (!p || !out || !rows || !rows_len) return sf_error(SF_E_INVAL, "wire: NULL argument");
    const size_t count = p->n * p->width;
    const void *x = sf_packet_rows(p);
    if ((p->n && p->tokens) || (p->state && p->state_len) || !count || !x ||
        count / p->width != p->n || (p->dev && p->cap_x < count) ||
        p->kind < SF_PACKET_TOKENS || p->kind > SF_PACKET_CHECKPOINT)
        return sf_error(SF_E_UNSUPPORTED, "wire: only a packet of host rows alone is encoded without its rows");
    const int bf16 = p->dtype == SF_DTYPE_BF16;
    const size_t bytes = count * (bf16 ? 2 : 4);
    uint8_t h[SF_WIRE_HEADER_SIZE];
    envelope(p, PART_ROWS, h);
    const size_t start = out->len;
    sf_frame_desc d = {0};
    d.kind = SF_FRAME_HIDDEN, d.dtype = bf16 ? SF_FRAME_U8 : SF_FRAME_F32, d.ndim = 2;
    d.shape[0] = p->n, d.shape[1] = bf16 ? 2 * p->width : p->width;
    d.stream = p->stream, d.segment = p->segment;
    d.codec = SF_CODEC_RAW;
    d.quant = (sf_quant_params){SF_QUANT_F32, (int)(p->width < 1u << 30 ? p->width : 1u << 30)};
    int rc = sf_buffer_append(out, h, sizeof h);
    if (rc == SF_OK) rc = sf_frame_encode_header(&d, bytes, out);
    if (rc != SF_OK) {
        out->len = start;
        return rc;
    }
    *rows = x, *rows_len = bytes;
    return SF_OK;
}

int sf_wire_encode(const sf_packet *p, const sf_wire_options *o, sf_wire_feedback *feedback,
                   sf_buffer *out)
{
    static const sf_wire_options raw = {SF_CODEC_RAW, 0, SF_QUANT_F32, 0, 0};
    if (!o) o = &raw;
    if (!p || !out) return sf_error(SF_E_INVAL, "wire: NULL packet or buffer");
    if (p->dev) return sf_error(SF_E_INVAL, "wire: packet rows are on a device");
    if (p->kind < SF_PACKET_TOKENS || p->kind > SF_PACKET_CHECKPOINT)
        return sf_error(SF_E_INVAL, "wire: packet kind %d unknown", (int)p->kind);
    const size_t count = p->n * p->width;
    const void *rows = sf_packet_rows(p);
    unsigned parts = 0;
    if (p->n && p->tokens) parts |= PART_TOKENS;
    if (count && rows) parts |= PART_ROWS;
    if (p->state && p->state_len) parts |= PART_STATE;
    if (p->n && p->width && count / p->width != p->n) return sf_error(SF_E_INVAL, "wire: packet too large");

    const size_t start = out->len;
    uint8_t h[SF_WIRE_HEADER_SIZE];
    envelope(p, parts, h);
    int rc = sf_buffer_append(out, h, sizeof h);
    const sf_quant_params none = {SF_QUANT_F32, 1};
    if (rc == SF_OK && (parts & PART_TOKENS))
        rc = frame(out, p, o, SF_FRAME_TOKENS, SF_FRAME_U32, 1, p->n, 0, p->tokens, p->n * 4, none, NULL);
    if (rc == SF_OK && (parts & PART_ROWS)) {
        if (p->dtype == SF_DTYPE_BF16) {
            rc = frame(out, p, o, SF_FRAME_HIDDEN, SF_FRAME_U8, 2, p->n, 2 * p->width, rows, count * 2, none, NULL);
        } else {
            sf_quant_params q = {o->quant, o->group > 0 ? o->group : (int)(p->width < 1u << 30 ? p->width : 1u << 30)};
            if (q.kind == SF_QUANT_INT4 && (q.group & 1)) q.group++;
            sf_quant_feedback *fb = NULL;
            const int lossy = q.kind != SF_QUANT_F32;
            if (feedback && lossy && !(p->flags & SF_PACKET_PROVISIONAL)) rc = fb_get(feedback, p->stream, count, &fb);
            if (rc == SF_OK)
                rc = frame(out, p, o, SF_FRAME_HIDDEN, SF_FRAME_F32, 2, p->n, p->width, rows, count * 4, q, fb);
        }
    }
    if (rc == SF_OK && (parts & PART_STATE))
        rc = frame(out, p, o, SF_FRAME_BLOB, SF_FRAME_U8, 1, p->state_len, 0, p->state, p->state_len, none, NULL);
    if (rc != SF_OK) {
        out->len = start;
        return rc;
    }
    if (feedback && (p->flags & SF_PACKET_FINAL)) fb_drop(feedback, p->stream);
    return SF_OK;
}

/* ---- decoding -------------------------------------------------------------------------- */

/* Checks the frame at buf[*off..len) against what the envelope promises and decodes it into
 * dst (exactly want_bytes). */
static int part(const uint8_t *buf, size_t len, size_t *off, size_t max_bytes, const char *what,
                sf_frame_kind kind, sf_frame_dtype dtype, int ndim, uint64_t d0, uint64_t d1,
                uint64_t stream, uint64_t segment, void *dst, size_t want_bytes)
{
    sf_frame_header fh;
    const uint8_t *at = buf + *off;
    size_t left = len - *off;
    int rc = sf_frame_peek(at, left, max_bytes, &fh);
    if (rc != SF_OK) return sf_error(rc, "wire: %s frame: %s", what, sf_last_error());
    if (fh.kind != kind || fh.dtype != dtype || fh.ndim != ndim || fh.shape[0] != d0 ||
        (ndim > 1 && fh.shape[1] != d1) || fh.value_bytes != want_bytes)
        return sf_error(SF_E_FRAME, "wire: %s frame's kind, type or shape disagrees with the packet", what);
    if (fh.stream != stream || fh.segment != segment)
        return sf_error(SF_E_FRAME, "wire: %s frame's stream or segment disagrees with the packet", what);
    size_t used = 0;
    rc = sf_frame_decode_into(at, left, max_bytes, &fh, dst, want_bytes, &used);
    if (rc != SF_OK) return sf_error(rc, "wire: %s frame: %s", what, sf_last_error());
    *off += used;
    return SF_OK;
}

int sf_wire_decode(const uint8_t *buf, size_t len, size_t max_bytes, sf_packet **out)
{
    *out = NULL;
    if (!buf || len < SF_WIRE_HEADER_SIZE)
        return sf_error(SF_E_FRAME_TRUNCATED, "wire: %zu bytes, shorter than a packet envelope", len);
    if (memcmp(buf, SF_WIRE_MAGIC, 4) != 0) return sf_error(SF_E_FRAME, "wire: bad magic");
    if (get_u32(buf + 60) != sf_crc32c(0, buf, 60)) return sf_error(SF_E_FRAME, "wire: envelope checksum mismatch");
    if (buf[4] != SF_WIRE_VERSION) return sf_error(SF_E_FRAME_VERSION, "wire: version %u unknown", buf[4]);
    const unsigned kind = buf[5], dtype = buf[6], parts = buf[7];
    if (kind < SF_PACKET_TOKENS || kind > SF_PACKET_CHECKPOINT) return sf_error(SF_E_FRAME, "wire: packet kind %u unknown", kind);
    if (parts & ~7u) return sf_error(SF_E_FRAME, "wire: parts 0x%x unknown", parts);
    if (dtype > SF_DTYPE_BF16 || (dtype && !(parts & PART_ROWS))) return sf_error(SF_E_FRAME, "wire: rows' type %u invalid", dtype);
    if (get_u32(buf + 12) || get_u32(buf + 56)) return sf_error(SF_E_FRAME, "wire: reserved field not 0");
    const uint64_t stream = get_u64(buf + 16), segment = get_u64(buf + 24), position = get_u64(buf + 32);
    const uint64_t n = get_u64(buf + 40), width = get_u64(buf + 48);
    const size_t esize = dtype == SF_DTYPE_BF16 ? 2 : 4;
    if (n > max_bytes / 4 || (width && n > max_bytes / esize / width))
        return sf_error(SF_E_FRAME_TOO_LARGE, "wire: %llu x %llu rows exceed the limit of %zu bytes",
                        (unsigned long long)n, (unsigned long long)width, max_bytes);
    if ((parts & PART_TOKENS) && !n) return sf_error(SF_E_FRAME, "wire: tokens part with n = 0");
    if ((parts & PART_ROWS) && (n == 0 || width == 0)) return sf_error(SF_E_FRAME, "wire: rows part with no rows");
    const size_t count = (size_t)(n * width);
    size_t off = SF_WIRE_HEADER_SIZE;

    /* the state's size comes from its frame's header: peek it before allocating anything */
    size_t state_len = 0;
    sf_frame_header sh;
    size_t state_off = off;
    for (unsigned bit = PART_TOKENS; bit < PART_STATE; bit <<= 1) {
        if (!(parts & bit)) continue;
        if (len - state_off < SF_FRAME_HEADER_SIZE) return sf_error(SF_E_FRAME_TRUNCATED, "wire: packet ends inside a frame");
        int rc = sf_frame_peek(buf + state_off, len - state_off, max_bytes, &sh);
        if (rc != SF_OK) return sf_error(rc, "wire: %s frame: %s", bit == PART_TOKENS ? "tokens" : "rows", sf_last_error());
        if (sh.payload_bytes > len - state_off - SF_FRAME_HEADER_SIZE) return sf_error(SF_E_FRAME_TRUNCATED, "wire: packet ends inside a frame");
        state_off += SF_FRAME_HEADER_SIZE + (size_t)sh.payload_bytes;
    }
    if (parts & PART_STATE) {
        int rc = sf_frame_peek(buf + state_off, len - state_off, max_bytes, &sh);
        if (rc != SF_OK) return sf_error(rc, "wire: state frame: %s", sf_last_error());
        if (sh.ndim != 1 || !sh.value_bytes) return sf_error(SF_E_FRAME, "wire: state frame's shape invalid");
        state_len = sh.value_bytes;
    }

    sf_packet *p = sf_packet_new((sf_packet_kind)kind, (parts & PART_TOKENS) ? (size_t)n : 0,
                                 (parts & PART_ROWS) ? (count * esize + 3) / 4 : 0);
    if (!p) return sf_error(SF_E_NOMEM, "wire: out of memory for a packet of %llu rows", (unsigned long long)n);
    p->flags = get_u32(buf + 8);
    p->stream = stream, p->segment = segment, p->position = position;
    p->n = (size_t)n, p->width = (size_t)width;
    int rc = SF_OK;
    if (parts & PART_TOKENS)
        rc = part(buf, len, &off, max_bytes, "tokens", SF_FRAME_TOKENS, SF_FRAME_U32, 1, n, 0, stream, segment,
                  p->tokens, (size_t)n * 4);
    if (rc == SF_OK && (parts & PART_ROWS)) {
        if (dtype == SF_DTYPE_BF16) {
            p->x_bf16 = (uint16_t *)p->x, p->x = NULL, p->dtype = SF_DTYPE_BF16;
            rc = part(buf, len, &off, max_bytes, "rows", SF_FRAME_HIDDEN, SF_FRAME_U8, 2, n, 2 * width, stream, segment,
                      p->x_bf16, count * 2);
        } else {
            rc = part(buf, len, &off, max_bytes, "rows", SF_FRAME_HIDDEN, SF_FRAME_F32, 2, n, width, stream, segment, p->x,
                      count * 4);
        }
    }
    if (rc == SF_OK && (parts & PART_STATE)) {
        p->state = malloc(state_len);
        if (!p->state) rc = sf_error(SF_E_NOMEM, "wire: out of memory for %zu bytes of state", state_len);
        else p->state_len = p->state_cap = state_len;
        if (rc == SF_OK)
            rc = part(buf, len, &off, max_bytes, "state", SF_FRAME_BLOB, SF_FRAME_U8, 1, state_len, 0, stream, segment,
                      p->state, state_len);
    }
    if (rc == SF_OK && off != len) rc = sf_error(SF_E_FRAME, "wire: %zu bytes after the packet's last frame", len - off);
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    *out = p;
    return SF_OK;
}
