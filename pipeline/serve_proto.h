/* The `seqflow serve` protocol (docs/SERVE.md): the messages between a server's ROUTER socket
 * and its clients' DEALER sockets, one ZeroMQ frame each.
 *
 * Every message starts with a fixed 32-byte little-endian header:
 *   off size field
 *     0    4 magic "SFS1"
 *     4    1 version (SF_SERVE_VERSION_MIN..SF_SERVE_VERSION)
 *     5    1 type (sf_serve_type)
 *     6    2 reserved, 0
 *     8    8 stream (the client's stream id; 0 where the type has none)
 *    16    8 a      (per type: a position, a credit, an error code, a cookie)
 *    24    8 b      (per type: a count)
 * then a payload whose length the type fixes:
 *   OPEN    a = initial credit (reply messages), b = 0;     no payload
 *   PUSH    a = position of the first token, b = n (>= 1);   n little-endian uint32 ids
 *   FLUSH, CLOSE                                              no payload (a = b = 0)
 *   CREDIT  a = reply messages granted (>= 1), b = 0 in version 1; in version 2 b = the
 *           committed rows the client has received (its next expected row position): the
 *           acknowledgement that lets a checkpointing server drop the rows it keeps for a
 *           resume;                                           no payload
 *   PING    a = cookie (echoed by PONG), b = 0;              no payload
 *   RESUME  (version 2) a = initial credit, b = committed rows the client has received;
 *           no payload. Answered by OPENED (a = the position to push from), then the kept
 *           ROWS from about b on (the client drops rows before b)
 *   MAP     (version 4) a = bytes the client would like its shared-memory region to have (0:
 *           the server's default), b = 0; no payload. Answered by MAPPED, or ERROR
 *   ATTACH  (version 4) a = the region's bytes (MAPPED's a), b = 0; no payload: the client
 *           has mapped the region; from here on the server may place its ROWS there
 *   RELEASE (version 4) a = region position the client is done with everything before, b = 0;
 *           no payload
 *   OPENED  a = next position, b = the stream's window in tokens; no payload
 *   ROWS    a = position of the first row, b = rows;          one wire packet (pipeline/wire.h)
 *   MAPPED  (version 4) a = the region's bytes, b = name bytes (1..SF_SERVE_MAX_NAME); the
 *           region's POSIX shared-memory name ("/seqflow-...")
 *   ROWS_AT (version 4) a = position of the first row, b = rows; 16 bytes: the region position
 *           (u64) and length (u64) of the ROWS's wire packet in the client's region
 *   CLOSED  a = tokens the stream took in all, b = 0;         no payload
 *   ERROR   a = error code (sf_serve_error), b = text bytes (<= SF_SERVE_MAX_TEXT); the text
 *   PONG    a = the PING's cookie;                            no payload
 *   DURABLE (version 2) a = the stream's durable position: a checkpoint holds its state up to
 *           there, so the client may drop the tokens before it; b = 0; no payload
 * Versions: a server takes all four; types 7 (RESUME) and 21 (DURABLE) and CREDIT's b exist
 * from version 2 (a version-1 message with them is malformed); version 3 is version 2 whose
 * ROWS may come in several frames; version 4 adds the shared-memory region (MAP, ATTACH,
 * RELEASE, MAPPED, ROWS_AT). A server answers a client in the version of that client's last
 * message. Region positions count the bytes the server has placed in the region since it was
 * made: a message at position p of length n lies at offset p mod the region's size and never
 * wraps (the server skips to the next round instead).
 * Decoding checks the magic, version, type, reserved bytes and that the payload length is
 * exactly what the header says (a PUSH's n is bounded by the caller's max_tokens before any
 * arithmetic on it); it never allocates: a decoded message points into the caller's bytes. */
#ifndef SEQFLOW_PIPELINE_SERVE_PROTO_H
#define SEQFLOW_PIPELINE_SERVE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/buffer.h"

#define SF_SERVE_MAGIC "SFS1"
#define SF_SERVE_VERSION 4     /* the newest version, what sf_serve_encode writes */
#define SF_SERVE_VERSION_MIN 1 /* the oldest version decoded */
#define SF_SERVE_HEADER_SIZE 32
#define SF_SERVE_MAX_TEXT 512
#define SF_SERVE_MAX_NAME 64     /* bytes of a region's name (MAPPED) */
#define SF_SERVE_ROWS_AT_SIZE 16 /* ROWS_AT's payload: region position, length */

typedef enum sf_serve_type {
    /* client to server */
    SF_SERVE_OPEN = 1,
    SF_SERVE_PUSH = 2,
    SF_SERVE_FLUSH = 3,
    SF_SERVE_CLOSE = 4,
    SF_SERVE_CREDIT = 5,
    SF_SERVE_PING = 6,
    SF_SERVE_RESUME = 7,   /* version 2 */
    SF_SERVE_MAP = 8,      /* version 4 */
    SF_SERVE_ATTACH = 9,   /* version 4 */
    SF_SERVE_RELEASE = 10, /* version 4 */
    /* server to client */
    SF_SERVE_OPENED = 16,
    SF_SERVE_ROWS = 17,
    SF_SERVE_CLOSED = 18,
    SF_SERVE_ERROR = 19,
    SF_SERVE_PONG = 20,
    SF_SERVE_DURABLE = 21, /* version 2 */
    SF_SERVE_MAPPED = 22,  /* version 4 */
    SF_SERVE_ROWS_AT = 23  /* version 4 */
} sf_serve_type;

/* ERROR's codes (the `a` field). */
typedef enum sf_serve_error {
    SF_SERVE_E_MALFORMED = 1, /* the message does not decode (bad magic, length, type, ...) */
    SF_SERVE_E_TYPE = 2,      /* a type the server does not take from a client */
    SF_SERVE_E_NOT_OPEN = 3,  /* the stream is not open for this client (or is closing) */
    SF_SERVE_E_BUSY = 4,      /* another client has the stream open */
    SF_SERVE_E_POSITION = 5,  /* PUSH's position is not the stream's next one */
    SF_SERVE_E_WINDOW = 6,    /* the PUSH would hold more than the window; nothing taken */
    SF_SERVE_E_LIMIT = 7,     /* too many streams, clients or pending flushes */
    SF_SERVE_E_TOKEN = 8,     /* a token id outside the model's vocabulary; nothing taken */
    SF_SERVE_E_INTERNAL = 9,  /* the pipeline failed: the server stops serving */
    SF_SERVE_E_UNKNOWN = 10,  /* RESUME of a stream this server holds no state of */
    SF_SERVE_E_GAP = 11,      /* RESUME: rows the client lacks are no longer held */
    SF_SERVE_E_REGION = 12    /* MAP, ATTACH, RELEASE: no region to be had, or not that one */
} sf_serve_error;

typedef struct sf_serve_msg {
    int version; /* SF_SERVE_VERSION_MIN..SF_SERVE_VERSION */
    sf_serve_type type;
    uint64_t stream, a, b;
    const uint8_t *payload; /* points into the decoded bytes; NULL when there is none */
    size_t payload_len;
} sf_serve_msg;

/* Decodes one message of exactly len bytes. max_tokens bounds a PUSH's n (and max 0 refuses
 * every PUSH). Returns SF_OK, or SF_E_FRAME with a message naming the field (what the server
 * sends back in ERROR); m is then unspecified. Server-to-client types decode too. */
int sf_serve_decode(const uint8_t *buf, size_t len, uint64_t max_tokens, sf_serve_msg *m);

/* Writes the 32-byte header (for any type) into out: of SF_SERVE_VERSION, or of `version`. */
void sf_serve_header(uint8_t out[SF_SERVE_HEADER_SIZE], sf_serve_type type, uint64_t stream, uint64_t a,
                     uint64_t b);
void sf_serve_header_version(uint8_t out[SF_SERVE_HEADER_SIZE], int version, sf_serve_type type, uint64_t stream,
                             uint64_t a, uint64_t b);

/* Appends a whole message (header then payload_len bytes of payload) to out, of
 * SF_SERVE_VERSION or of `version`. SF_OK or SF_E_NOMEM (out unchanged). */
int sf_serve_encode(sf_buffer *out, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b,
                    const void *payload, size_t payload_len);
int sf_serve_encode_version(sf_buffer *out, int version, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b,
                            const void *payload, size_t payload_len);

/* Receives one whole message from a ZeroMQ socket: every frame of it (a version-3 ROWS may
 * come in several), concatenated into buf, at most size bytes. flags (0 or ZMQ_DONTWAIT) apply
 * to the first frame; the others of a multipart message are there with it. Returns the
 * message's whole length (cut to size where longer, as zmq_recv cuts), or -1 with zmq_errno()
 * set when nothing came. */
long sf_serve_recv(void *socket, void *buf, size_t size, int flags);

/* A type's name ("OPEN", ...; "?" when unknown). */
const char *sf_serve_type_name(int type);

#endif
