#include "stages/token_reader.h"

#include <string.h>

#include "seqflow/error.h"

int sf_token_format_parse(const char *name, sf_token_format *out)
{
    if (name && strcmp(name, "bytes") == 0) return *out = SF_TOKENS_BYTES, SF_OK;
    if (name && strcmp(name, "u32") == 0) return *out = SF_TOKENS_U32, SF_OK;
    if (name && strcmp(name, "text") == 0) return *out = SF_TOKENS_TEXT, SF_OK;
    return sf_error(SF_E_OPTION, "unknown input format '%s' (bytes, u32, text)", name ? name : "");
}

static int is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Parses one decimal id of at most 10 digits. */
static int text_id(const sf_token_reader *r, const uint8_t *digits, size_t len, uint64_t at,
                   uint32_t *id)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            return sf_error(SF_E_INPUT, "text input: '%c' at byte %llu is not a digit or space",
                            digits[i] >= 32 && digits[i] < 127 ? digits[i] : '?',
                            (unsigned long long)(at + i));
        v = v * 10 + (uint64_t)(digits[i] - '0');
    }
    if (len > 10 || v > UINT32_MAX)
        return sf_error(SF_E_INPUT, "text input: the id at byte %llu does not fit in 32 bits",
                        (unsigned long long)at);
    (void)r;
    *id = (uint32_t)v;
    return SF_OK;
}

static int feed_text(sf_token_reader *r, const uint8_t *b, size_t len, uint32_t *out, size_t *n)
{
    size_t i = 0;
    while (i < len) {
        if (is_space(b[i])) {
            if (r->carry_len) {
                uint32_t id = 0;
                int rc = text_id(r, r->carry, r->carry_len, r->offset + i - r->carry_len - r->carry_zeros, &id);
                if (rc != SF_OK) return rc;
                out[(*n)++] = id;
                r->carry_len = 0;
                r->carry_zeros = 0;
            }
            i++;
            continue;
        }
        if (r->carry_len == sizeof r->carry)
            return sf_error(SF_E_INPUT, "text input: the id at byte %llu does not fit in 32 bits",
                            (unsigned long long)(r->offset + i - r->carry_len - r->carry_zeros));
        if (b[i] < '0' || b[i] > '9')
            return sf_error(SF_E_INPUT, "text input: '%c' at byte %llu is not a digit or space",
                            b[i] >= 32 && b[i] < 127 ? b[i] : '?', (unsigned long long)(r->offset + i));
        if (r->carry_len == 1 && r->carry[0] == '0') { /* a leading zero: 007 is 7, not octal */
            r->carry_len = 0;
            r->carry_zeros++;
        }
        r->carry[r->carry_len++] = b[i++];
    }
    return SF_OK;
}

int sf_token_reader_feed(sf_token_reader *r, const uint8_t *bytes, size_t len, uint32_t *out,
                         size_t *n_out)
{
    int rc = SF_OK;
    switch (r->format) {
    case SF_TOKENS_BYTES:
        for (size_t i = 0; i < len; i++) out[(*n_out)++] = bytes[i];
        break;
    case SF_TOKENS_U32: {
        size_t i = 0;
        while (i < len) {
            r->carry[r->carry_len++] = bytes[i++];
            if (r->carry_len == 4) {
                out[(*n_out)++] = (uint32_t)r->carry[0] | (uint32_t)r->carry[1] << 8 |
                                  (uint32_t)r->carry[2] << 16 | (uint32_t)r->carry[3] << 24;
                r->carry_len = 0;
            }
        }
        break;
    }
    case SF_TOKENS_TEXT: rc = feed_text(r, bytes, len, out, n_out); break;
    }
    r->offset += len;
    return rc;
}

int sf_token_reader_finish(sf_token_reader *r, uint32_t *out, size_t *n_out)
{
    if (r->format == SF_TOKENS_U32 && r->carry_len)
        return sf_error(SF_E_INPUT,
                        "u32 input is %llu bytes long, not a multiple of 4 (the last %zu bytes are a partial id)",
                        (unsigned long long)r->offset, r->carry_len);
    if (r->format == SF_TOKENS_TEXT && r->carry_len) {
        uint32_t id = 0;
        int rc = text_id(r, r->carry, r->carry_len, r->offset - r->carry_len - r->carry_zeros, &id);
        if (rc != SF_OK) return rc;
        out[(*n_out)++] = id;
        r->carry_len = 0;
        r->carry_zeros = 0;
    }
    return SF_OK;
}
