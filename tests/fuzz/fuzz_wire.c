/* Fuzzes what a receiving rank does with bytes from the network: the message envelope
 * (pipeline/net_internal.h) and the packet decoder (pipeline/wire.h). Input: byte 0 picks the
 * mode, byte 1 the decoder's size limit, the rest is the body.
 *   mode 0: the body is a packet, decoded as it is;
 *   mode 1: the same with the envelope's checksum recomputed, so that mutations reach the
 *           frames behind it;
 *   mode 2: the body's first 48 bytes are a message envelope (checksum recomputed), parsed;
 *           the rest is a packet, as in mode 1.
 * A packet that decodes must respect the limit and survive a round trip: encoded again (raw,
 * lossless) and decoded, it gives the same packet, and one byte less is refused. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compress/frame.h"
#include "pipeline/net_internal.h"
#include "pipeline/wire.h"
#include "seqflow/error.h"

#include "tests/fuzz/fuzz_support.h"

static const size_t limits[] = {0, 64, 1024, 1u << 16, 1u << 20, 16u << 20};

static int is_error(int rc)
{
    return rc == SF_E_FRAME || rc == SF_E_FRAME_TRUNCATED || rc == SF_E_FRAME_VERSION || rc == SF_E_FRAME_TOO_LARGE ||
           rc == SF_E_NOMEM;
}

static void fix_crc(uint8_t *b, size_t len, size_t at)
{
    if (len < at + 4) return;
    uint32_t c = sf_crc32c(0, b, at);
    for (int i = 0; i < 4; i++) b[at + i] = (uint8_t)(c >> (8 * i));
}

static int same(const sf_packet *a, const sf_packet *b)
{
    if (a->kind != b->kind || a->flags != b->flags || a->stream != b->stream || a->segment != b->segment ||
        a->position != b->position || a->n != b->n || a->width != b->width || a->state_len != b->state_len ||
        a->dtype != b->dtype)
        return 0;
    if ((a->tokens == NULL) != (b->tokens == NULL)) return 0;
    if (a->tokens && memcmp(a->tokens, b->tokens, a->n * 4)) return 0;
    if (sf_packet_rows(a) && memcmp(sf_packet_rows(a), sf_packet_rows(b), sf_packet_row_bytes(a))) return 0;
    return !a->state_len || memcmp(a->state, b->state, a->state_len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const int mode = data[0] % 3;
    const size_t limit = limits[data[1] % (sizeof limits / sizeof limits[0])];
    size_t len = size - 2;
    uint8_t *body = malloc(len ? len : 1);
    memcpy(body, data + 2, len);
    uint8_t *packet = body;
    if (mode == 2) {
        fix_crc(body, len, 44);
        net_env e;
        int rc = net_env_parse(body, len < ENV_SIZE ? len : ENV_SIZE, &e);
        FUZZ_CHECK(rc == SF_OK || rc == SF_E_PEER);
        if (rc == SF_OK) FUZZ_CHECK(e.type >= MSG_DATA && e.type <= MSG_BYE && len >= ENV_SIZE);
        if (len < ENV_SIZE) {
            free(body);
            return 0;
        }
        packet += ENV_SIZE, len -= ENV_SIZE;
    }
    if (mode >= 1) fix_crc(packet, len, 60);
    sf_packet *p = NULL;
    int rc = sf_wire_decode(packet, len, limit, &p);
    FUZZ_CHECK(rc == SF_OK ? p != NULL : (p == NULL && is_error(rc)));
    if (p) {
        FUZZ_CHECK(p->n * 4 <= limit || !p->tokens);
        FUZZ_CHECK(sf_packet_row_bytes(p) <= limit || !sf_packet_rows(p));
        FUZZ_CHECK(p->state_len <= limit);
        sf_buffer b = {0};
        FUZZ_CHECK(sf_wire_encode(p, NULL, NULL, &b) == SF_OK);
        sf_packet *q = NULL;
        FUZZ_CHECK(sf_wire_decode(b.data, b.len, limit, &q) == SF_OK && same(p, q));
        sf_packet_free(q);
        FUZZ_CHECK(sf_wire_decode(b.data, b.len - 1, limit, &q) != SF_OK && q == NULL);
        sf_buffer_release(&b);
        sf_packet_free(p);
    }
    free(body);
    return 0;
}
