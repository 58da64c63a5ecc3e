/* Fuzzes the `seqflow serve` message decoder (pipeline/serve_proto.h), what the server does
 * first with every client's bytes, and the ROWS payload a client decodes (pipeline/wire.h).
 * Input: byte 0 picks the PUSH bound (max_tokens), the rest is one message (of protocol version
 * 1 to 4: RESUME, DURABLE and CREDIT's acknowledgement from 2, the shared-memory region's
 * MAP, ATTACH, RELEASE, MAPPED and ROWS_AT from 4).
 * A message that decodes must respect the bound (a PUSH carries exactly 4 n bytes, n within
 * it), point into the input, re-encode to the same bytes, and be refused one byte short
 * (except a ROWS, whose payload is opaque to this layer, while it keeps a byte). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/serve_proto.h"
#include "pipeline/wire.h"
#include "seqflow/error.h"

#include "tests/fuzz/fuzz_support.h"

static const uint64_t bounds[] = {0, 1, 16, 4096, 65536, UINT64_MAX / 8};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint64_t max_tokens = bounds[data[0] % (sizeof bounds / sizeof bounds[0])];
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    sf_serve_msg m;
    int rc = sf_serve_decode(msg, len, max_tokens, &m);
    if (rc != SF_OK) {
        FUZZ_CHECK(rc == SF_E_FRAME);
        return 0;
    }
    FUZZ_CHECK(len >= SF_SERVE_HEADER_SIZE);
    FUZZ_CHECK(m.payload_len == len - SF_SERVE_HEADER_SIZE);
    FUZZ_CHECK(m.payload_len == 0 || m.payload == msg + SF_SERVE_HEADER_SIZE);
    if (m.type == SF_SERVE_PUSH) FUZZ_CHECK(m.b >= 1 && m.b <= max_tokens && m.payload_len == m.b * 4);
    if (m.type == SF_SERVE_ERROR) FUZZ_CHECK(m.b <= SF_SERVE_MAX_TEXT && m.payload_len == m.b);
    sf_buffer again = {0};
    FUZZ_CHECK(m.version >= SF_SERVE_VERSION_MIN && m.version <= SF_SERVE_VERSION && m.version == msg[4]);
    /* the version-2 types and fields are refused in a version-1 message */
    if (m.version < 2) FUZZ_CHECK(m.type != SF_SERVE_RESUME && m.type != SF_SERVE_DURABLE && (m.type != SF_SERVE_CREDIT || m.b == 0));
    if (m.type == SF_SERVE_RESUME || m.type == SF_SERVE_DURABLE) FUZZ_CHECK(m.payload_len == 0);
    if (m.type == SF_SERVE_DURABLE) FUZZ_CHECK(m.b == 0);
    const int region = m.type == SF_SERVE_MAP || m.type == SF_SERVE_ATTACH || m.type == SF_SERVE_RELEASE ||
                       m.type == SF_SERVE_MAPPED || m.type == SF_SERVE_ROWS_AT;
    if (region) FUZZ_CHECK(m.version >= 4);
    if (m.type == SF_SERVE_MAPPED) FUZZ_CHECK(m.b >= 1 && m.b <= SF_SERVE_MAX_NAME && m.payload_len == m.b);
    if (m.type == SF_SERVE_ROWS_AT) FUZZ_CHECK(m.payload_len == SF_SERVE_ROWS_AT_SIZE);
    if (m.type == SF_SERVE_MAP || m.type == SF_SERVE_ATTACH || m.type == SF_SERVE_RELEASE)
        FUZZ_CHECK(m.payload_len == 0 && m.b == 0 && (m.type != SF_SERVE_ATTACH || m.a > 0));
    FUZZ_CHECK(sf_serve_encode_version(&again, m.version, m.type, m.stream, m.a, m.b, m.payload, m.payload_len) == SF_OK);
    FUZZ_CHECK(again.len == len && memcmp(again.data, msg, len) == 0);
    sf_buffer_release(&again);
    if (m.type != SF_SERVE_ROWS || m.payload_len == 1) {
        sf_serve_msg shorter;
        FUZZ_CHECK(sf_serve_decode(msg, len - 1, max_tokens, &shorter) == SF_E_FRAME);
    }
    if (m.type == SF_SERVE_ROWS) { /* what a client does with it */
        sf_packet *p = NULL;
        rc = sf_wire_decode(m.payload, m.payload_len, 1u << 20, &p);
        FUZZ_CHECK((rc == SF_OK) == (p != NULL));
        sf_packet_free(p);
    }
    return 0;
}
