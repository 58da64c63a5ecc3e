/* Token readers: turn a byte stream in one of the input formats into token ids, chunk by
 * chunk, keeping what straddles a chunk boundary. Used by the source stage and the fuzzers. */
#ifndef SEQFLOW_STAGES_TOKEN_READER_H
#define SEQFLOW_STAGES_TOKEN_READER_H

#include <stddef.h>
#include <stdint.h>

typedef enum sf_token_format {
    SF_TOKENS_BYTES = 0, /* one token per byte (the byte-level vocabulary) */
    SF_TOKENS_U32 = 1,   /* little-endian uint32 ids */
    SF_TOKENS_TEXT = 2   /* whitespace-separated decimal ids */
} sf_token_format;

typedef struct sf_token_reader {
    sf_token_format format;
    uint64_t offset;     /* bytes consumed so far, for error messages */
    uint8_t carry[16];   /* an unfinished id from the previous chunk */
    size_t carry_len;
    size_t carry_zeros;  /* text: leading zeros of that id, dropped (ids are decimal) */
} sf_token_reader;

/* Parses "bytes", "u32" or "text". SF_E_OPTION on anything else. */
int sf_token_format_parse(const char *name, sf_token_format *out);

/* Decodes bytes[0..len) into out (room for at least len tokens), appending to *n_out.
 * SF_E_INPUT on a malformed id (naming its byte offset). */
int sf_token_reader_feed(sf_token_reader *r, const uint8_t *bytes, size_t len, uint32_t *out,
                         size_t *n_out);
/* End of input: decodes what is carried. SF_E_INPUT when a uint32 input's length was not a
 * multiple of 4. */
int sf_token_reader_finish(sf_token_reader *r, uint32_t *out, size_t *n_out);

#endif
