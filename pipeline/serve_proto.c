/* The `seqflow serve` messages (pipeline/serve_proto.h). */
#include "pipeline/serve_proto.h"

#include <errno.h>
#include <string.h>
#include <zmq.h>

#include "seqflow/error.h"

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

long sf_serve_recv(void *socket, void *buf, size_t size, int flags)
{
    size_t total = 0;
    int more = 1;
    for (int first = 1; more; first = 0) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, socket, first ? flags : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (first) {
                errno = e;
                return -1;
            }
            break; /* the socket closed in the middle of a message: what came */
        }
        const size_t len = zmq_msg_size(&m);
        if (total < size) memcpy((uint8_t *)buf + total, zmq_msg_data(&m), len < size - total ? len : size - total);
        total += len;
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return (long)total;
}

const char *sf_serve_type_name(int type)
{
    switch (type) {
    case SF_SERVE_OPEN: return "OPEN";
    case SF_SERVE_PUSH: return "PUSH";
    case SF_SERVE_FLUSH: return "FLUSH";
    case SF_SERVE_CLOSE: return "CLOSE";
    case SF_SERVE_CREDIT: return "CREDIT";
    case SF_SERVE_PING: return "PING";
    case SF_SERVE_OPENED: return "OPENED";
    case SF_SERVE_ROWS: return "ROWS";
    case SF_SERVE_CLOSED: return "CLOSED";
    case SF_SERVE_ERROR: return "ERROR";
    case SF_SERVE_PONG: return "PONG";
    case SF_SERVE_RESUME: return "RESUME";
    case SF_SERVE_DURABLE: return "DURABLE";
    case SF_SERVE_MAP: return "MAP";
    case SF_SERVE_ATTACH: return "ATTACH";
    case SF_SERVE_RELEASE: return "RELEASE";
    case SF_SERVE_MAPPED: return "MAPPED";
    case SF_SERVE_ROWS_AT: return "ROWS_AT";
    default: return "?";
    }
}

void sf_serve_header_version(uint8_t out[SF_SERVE_HEADER_SIZE], int version, sf_serve_type type, uint64_t stream,
                             uint64_t a, uint64_t b)
{
    memcpy(out, SF_SERVE_MAGIC, 4);
    out[4] = (uint8_t)version;
    out[5] = (uint8_t)type;
    out[6] = out[7] = 0;
    put64(out + 8, stream);
    put64(out + 16, a);
    put64(out + 24, b);
}

void sf_serve_header(uint8_t out[SF_SERVE_HEADER_SIZE], sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b)
{
    sf_serve_header_version(out, SF_SERVE_VERSION, type, stream, a, b);
}

int sf_serve_encode(sf_buffer *out, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const void *payload,
                    size_t payload_len)
{
    return sf_serve_encode_version(out, SF_SERVE_VERSION, type, stream, a, b, payload, payload_len);
}

int sf_serve_encode_version(sf_buffer *out, int version, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b,
                            const void *payload, size_t payload_len)
{
    uint8_t h[SF_SERVE_HEADER_SIZE];
    sf_serve_header_version(h, version, type, stream, a, b);
    size_t before = out->len;
    int rc = sf_buffer_append(out, h, sizeof h);
    if (rc == SF_OK && payload_len) rc = sf_buffer_append(out, payload, payload_len);
    if (rc != SF_OK) out->len = before;
    return rc;
}

int sf_serve_decode(const uint8_t *buf, size_t len, uint64_t max_tokens, sf_serve_msg *m)
{
    if (!buf || !m) return sf_error(SF_E_INVAL, "sf_serve_decode: NULL argument");
    if (len < SF_SERVE_HEADER_SIZE)
        return sf_error(SF_E_FRAME, "message of %zu bytes is shorter than the %d-byte header", len, SF_SERVE_HEADER_SIZE);
    if (memcmp(buf, SF_SERVE_MAGIC, 4) != 0) return sf_error(SF_E_FRAME, "bad magic (not SFS1)");
    if (buf[4] < SF_SERVE_VERSION_MIN || buf[4] > SF_SERVE_VERSION)
        return sf_error(SF_E_FRAME, "protocol version %u (this server speaks %d to %d)", buf[4], SF_SERVE_VERSION_MIN,
                        SF_SERVE_VERSION);
    if (buf[6] || buf[7]) return sf_error(SF_E_FRAME, "reserved header bytes are not 0");
    m->version = buf[4];
    m->type = (sf_serve_type)buf[5];
    m->stream = get64(buf + 8);
    m->a = get64(buf + 16);
    m->b = get64(buf + 24);
    size_t rest = len - SF_SERVE_HEADER_SIZE;
    m->payload = rest ? buf + SF_SERVE_HEADER_SIZE : NULL;
    m->payload_len = rest;
    const char *name = sf_serve_type_name(buf[5]);
    switch (m->type) {
    case SF_SERVE_PUSH:
        if (m->b == 0) return sf_error(SF_E_FRAME, "PUSH of 0 tokens");
        if (m->b > max_tokens)
            return sf_error(SF_E_FRAME, "PUSH of %llu tokens: at most %llu in one message", (unsigned long long)m->b,
                            (unsigned long long)max_tokens);
        if (rest != m->b * 4)
            return sf_error(SF_E_FRAME, "PUSH of %llu tokens carries %zu payload bytes, not %llu",
                            (unsigned long long)m->b, rest, (unsigned long long)m->b * 4);
        return SF_OK;
    case SF_SERVE_ROWS:
        if (rest == 0) return sf_error(SF_E_FRAME, "ROWS without a packet");
        return SF_OK;
    case SF_SERVE_ERROR:
        if (m->b > SF_SERVE_MAX_TEXT || rest != m->b)
            return sf_error(SF_E_FRAME, "ERROR text of %zu bytes (header: %llu, at most %d)", rest,
                            (unsigned long long)m->b, SF_SERVE_MAX_TEXT);
        return SF_OK;
    case SF_SERVE_CREDIT:
        if (m->a == 0) return sf_error(SF_E_FRAME, "CREDIT of 0");
        if (m->version >= 2) break; /* b: the rows received */
        /* fall through */
    case SF_SERVE_OPEN:
    case SF_SERVE_PING:
    case SF_SERVE_OPENED:
    case SF_SERVE_PONG:
    case SF_SERVE_CLOSED:
        if (m->type != SF_SERVE_OPENED && m->b) return sf_error(SF_E_FRAME, "%s with b = %llu (must be 0)", name, (unsigned long long)m->b);
        break;
    case SF_SERVE_RESUME:
        if (m->version < 2) return sf_error(SF_E_FRAME, "RESUME needs protocol version 2 (the message says %d)", m->version);
        break;
    case SF_SERVE_DURABLE:
        if (m->version < 2) return sf_error(SF_E_FRAME, "DURABLE needs protocol version 2 (the message says %d)", m->version);
        if (m->b) return sf_error(SF_E_FRAME, "DURABLE with b = %llu (must be 0)", (unsigned long long)m->b);
        break;
    case SF_SERVE_MAP:
    case SF_SERVE_ATTACH:
    case SF_SERVE_RELEASE:
    case SF_SERVE_MAPPED:
    case SF_SERVE_ROWS_AT:
        if (m->version < 4)
            return sf_error(SF_E_FRAME, "%s needs protocol version 4 (the message says %d)", name, m->version);
        if (m->type == SF_SERVE_MAPPED) {
            if (m->b == 0 || m->b > SF_SERVE_MAX_NAME || rest != m->b)
                return sf_error(SF_E_FRAME, "MAPPED name of %zu bytes (header: %llu, 1 to %d)", rest,
                                (unsigned long long)m->b, SF_SERVE_MAX_NAME);
            return SF_OK;
        }
        if (m->type == SF_SERVE_ROWS_AT) {
            if (rest != SF_SERVE_ROWS_AT_SIZE)
                return sf_error(SF_E_FRAME, "ROWS_AT carries %zu payload bytes, not %d", rest, SF_SERVE_ROWS_AT_SIZE);
            return SF_OK;
        }
        if (m->b) return sf_error(SF_E_FRAME, "%s with b = %llu (must be 0)", name, (unsigned long long)m->b);
        if (m->type == SF_SERVE_ATTACH && m->a == 0) return sf_error(SF_E_FRAME, "ATTACH of a region of 0 bytes");
        break;
    case SF_SERVE_FLUSH:
    case SF_SERVE_CLOSE:
        if (m->a || m->b) return sf_error(SF_E_FRAME, "%s with a or b set (must be 0)", name);
        break;
    default:
        return sf_error(SF_E_FRAME, "unknown message type %u", buf[5]);
    }
    if (rest) return sf_error(SF_E_FRAME, "%s carries %zu payload bytes (it has none)", name, rest);
    return SF_OK;
}
