/* Token readers: every format, ids split across chunk boundaries, and malformed input. */
#include <string.h>

#include "seqflow/seqflow.h"
#include "stages/token_reader.h"
#include "support/check.h"

/* Feeds `text` in chunks of `chunk` bytes. */
static int decode(sf_token_format format, const uint8_t *bytes, size_t len, size_t chunk, uint32_t *out,
                  size_t *n)
{
    sf_token_reader r = {.format = format};
    *n = 0;
    for (size_t at = 0; at < len; at += chunk) {
        size_t take = len - at < chunk ? len - at : chunk;
        int rc = sf_token_reader_feed(&r, bytes + at, take, out, n);
        if (rc != SF_OK) return rc;
    }
    return sf_token_reader_finish(&r, out, n);
}

int main(void)
{
    uint32_t out[64];
    size_t n;
    sf_token_format f;
    CHECK_OK(sf_token_format_parse("u32", &f));
    CHECK(f == SF_TOKENS_U32);
    CHECK(sf_token_format_parse("utf8", &f) == SF_E_OPTION);

    const uint8_t hi[] = {'h', 'i', 0xff};
    CHECK_OK(decode(SF_TOKENS_BYTES, hi, 3, 2, out, &n));
    CHECK(n == 3 && out[0] == 'h' && out[2] == 255);

    const uint8_t le[] = {1, 0, 0, 0, 0x78, 0x56, 0x34, 0x12, 0xff, 0xff, 0xff, 0xff};
    for (size_t chunk = 1; chunk <= 12; chunk++) {
        CHECK_OK(decode(SF_TOKENS_U32, le, sizeof le, chunk, out, &n));
        CHECK(n == 3 && out[0] == 1 && out[1] == 0x12345678u && out[2] == 0xffffffffu);
    }
    CHECK(decode(SF_TOKENS_U32, le, 7, 3, out, &n) == SF_E_INPUT);
    CHECKF(strstr(sf_last_error(), "multiple of 4") != NULL, "%s", sf_last_error());

    const char *text = "  12 7\n\t4294967295 0 99";
    for (size_t chunk = 1; chunk <= strlen(text); chunk++) {
        CHECK_OK(decode(SF_TOKENS_TEXT, (const uint8_t *)text, strlen(text), chunk, out, &n));
        CHECK(n == 5 && out[0] == 12 && out[1] == 7 && out[2] == 4294967295u && out[3] == 0 && out[4] == 99);
    }
    CHECK(decode(SF_TOKENS_TEXT, (const uint8_t *)"1 2x 3", 6, 4, out, &n) == SF_E_INPUT);
    CHECKF(strstr(sf_last_error(), "byte 3") != NULL, "%s", sf_last_error());
    CHECK(decode(SF_TOKENS_TEXT, (const uint8_t *)"4294967296", 10, 3, out, &n) == SF_E_INPUT);
    CHECK(decode(SF_TOKENS_TEXT, (const uint8_t *)"123456789012345678901", 21, 5, out, &n) == SF_E_INPUT);
    CHECK(decode(SF_TOKENS_TEXT, (const uint8_t *)"-1", 2, 1, out, &n) == SF_E_INPUT);
    CHECK_OK(decode(SF_TOKENS_TEXT, (const uint8_t *)"", 0, 1, out, &n));
    CHECK(n == 0);

    /* leading zeros are decimal, however many, split anywhere: 0000...0042 is 42, 010 is 10 */
    const char *zeros = "0000000000000000000000000042 010 0 000 04294967295";
    for (size_t chunk = 1; chunk <= strlen(zeros); chunk++) {
        CHECK_OK(decode(SF_TOKENS_TEXT, (const uint8_t *)zeros, strlen(zeros), chunk, out, &n));
        CHECK(n == 5 && out[0] == 42 && out[1] == 10 && out[2] == 0 && out[3] == 0 && out[4] == 4294967295u);
    }
    /* an id too large after its zeros is still refused, at the byte where it starts */
    CHECK(decode(SF_TOKENS_TEXT, (const uint8_t *)"7 0004294967296", 15, 4, out, &n) == SF_E_INPUT);
    CHECKF(strstr(sf_last_error(), "byte 2 ") != NULL, "%s", sf_last_error());
    return check_finish("test_token_reader");
}
