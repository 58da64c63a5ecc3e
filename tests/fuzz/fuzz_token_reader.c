/* Fuzzes the token readers (stages/token_reader.h). Input: byte 0 picks the format, byte 1
 * seeds the chunk splits, the rest is the token stream. The stream is decoded twice, whole and
 * in random chunks, each feed into a buffer of exactly the documented size (len tokens; one
 * for finish) so that ASan catches any write past it. Chunking must not change anything: the
 * same ids, or the same error with the same message (offsets are absolute). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/error.h"
#include "stages/token_reader.h"

#include "tests/fuzz/fuzz_support.h"

typedef struct decoded {
    int rc;
    char message[512];
    uint32_t *ids;
    size_t n, cap;
} decoded;

static uint64_t next_random(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void append(decoded *d, const uint32_t *ids, size_t n)
{
    if (d->n + n > d->cap) {
        d->cap = (d->n + n) * 2 + 16;
        d->ids = realloc(d->ids, d->cap * sizeof *d->ids);
        FUZZ_CHECK(d->ids);
    }
    if (n) memcpy(d->ids + d->n, ids, n * sizeof *ids);
    d->n += n;
}

/* Feeds data in chunks (one chunk when seed is 0) and finishes. */
static void decode(sf_token_format format, const uint8_t *data, size_t len, uint64_t seed,
                   decoded *d)
{
    sf_token_reader r = {.format = format};
    memset(d, 0, sizeof *d);
    sf_clear_error();
    size_t at = 0;
    while (at < len || len == 0) {
        size_t take = len - at;
        if (seed && take) take = 1 + (size_t)(next_random(&seed) % (take < 9 ? take : 9));
        /* Exactly the documented room, on the heap so that an overrun is reported. */
        uint32_t *out = malloc((take ? take : 1) * sizeof *out);
        FUZZ_CHECK(out);
        size_t n = 0;
        d->rc = sf_token_reader_feed(&r, data + at, take, out, &n);
        FUZZ_CHECK(n <= take);
        append(d, out, n);
        free(out);
        at += take;
        if (d->rc != SF_OK || len == 0) break;
    }
    if (d->rc == SF_OK) {
        uint32_t *out = malloc(sizeof *out);
        FUZZ_CHECK(out);
        size_t n = 0;
        d->rc = sf_token_reader_finish(&r, out, &n);
        FUZZ_CHECK(n <= 1);
        append(d, out, n);
        free(out);
    }
    FUZZ_CHECK(d->rc == SF_OK || d->rc == SF_E_INPUT);
    if (d->rc != SF_OK) snprintf(d->message, sizeof d->message, "%s", sf_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const sf_token_format formats[] = {SF_TOKENS_BYTES, SF_TOKENS_U32, SF_TOKENS_TEXT};
    sf_token_format format = formats[data[0] % 3];
    uint64_t seed = (uint64_t)data[1] + 1;
    data += 2;
    size -= 2;

    decoded whole, chunked;
    decode(format, data, size, 0, &whole);
    decode(format, data, size, seed, &chunked);
    FUZZ_CHECK(whole.rc == chunked.rc);
    FUZZ_CHECK(strcmp(whole.message, chunked.message) == 0);
    if (whole.rc == SF_OK) {
        FUZZ_CHECK(whole.n == chunked.n);
        FUZZ_CHECK(whole.n == 0 || memcmp(whole.ids, chunked.ids, whole.n * sizeof *whole.ids) == 0);
        if (format == SF_TOKENS_BYTES) {
            FUZZ_CHECK(whole.n == size);
            for (size_t i = 0; i < size; i++) FUZZ_CHECK(whole.ids[i] == data[i]);
        } else if (format == SF_TOKENS_U32) {
            FUZZ_CHECK(size % 4 == 0 && whole.n == size / 4);
            for (size_t i = 0; i < whole.n; i++) {
                uint32_t v;
                memcpy(&v, data + 4 * i, 4); /* x86-64: little-endian, as the format */
                FUZZ_CHECK(whole.ids[i] == v);
            }
        } else {
            /* Every whitespace-separated word is one id, in order. */
            size_t k = 0, i = 0;
            while (i < size) {
                if (memchr(" \t\n\r\f\v", data[i], 6)) {
                    i++;
                    continue;
                }
                uint64_t v = 0;
                for (; i < size && !memchr(" \t\n\r\f\v", data[i], 6); i++) {
                    FUZZ_CHECK(data[i] >= '0' && data[i] <= '9');
                    v = v * 10 + (uint64_t)(data[i] - '0');
                    FUZZ_CHECK(v <= UINT32_MAX);
                }
                FUZZ_CHECK(k < whole.n && whole.ids[k] == v);
                k++;
            }
            FUZZ_CHECK(k == whole.n);
        }
    } else if (format == SF_TOKENS_U32) {
        FUZZ_CHECK(size % 4 != 0);
    }
    free(whole.ids);
    free(chunked.ids);
    return 0;
}
