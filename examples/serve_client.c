/* A client of `seqflow serve` (docs/SERVE.md), over libzmq alone: streams a file's bytes as one
 * stream's tokens and writes the committed hidden-state rows (raw float32, [tokens, D]) or
 * prints their count and a checksum.
 *
 *   serve_client [-k SERVER_PUBLIC_KEY -s CLIENT_SECRET_KEY_FILE] [-o OUT] [-i STREAM] ENDPOINT [FILE]
 *
 * Without -k the connection is plaintext (a server started with --plaintext). FILE defaults to
 * standard input. Flow control: it opens with a credit of 4 and grants one more for each ROWS;
 * it keeps (tokens pushed) - (rows received) within the server's window, and sends PING while it
 * waits so that a slow server never takes it for gone. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

enum { OPEN = 1, PUSH = 2, CLOSE = 4, CREDIT = 5, PING = 6, OPENED = 16, ROWS = 17, CLOSED = 18, ERROR = 19, PONG = 20 };
#define HEADER 32
#define WIRE_ENVELOPE 64
#define FRAME_HEADER 96
#define CHUNK 4096

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

/* Sends a message: the header, then `len` payload bytes. */
static int send_msg(void *sock, int type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len)
{
    uint8_t *m = malloc(HEADER + len);
    if (!m) return -1;
    memcpy(m, "SFS1", 4);
    m[4] = 1;
    m[5] = (uint8_t)type;
    m[6] = m[7] = 0;
    put64(m + 8, stream);
    put64(m + 16, a);
    put64(m + 24, b);
    if (len) memcpy(m + HEADER, payload, len);
    int rc = zmq_send(sock, m, HEADER + len, 0) < 0 ? -1 : 0;
    free(m);
    return rc;
}

/* The float32 rows of a ROWS payload: the wire envelope, then one raw HIDDEN frame. Returns the
 * number of rows (their count and width checked against the envelope), or -1. */
static long rows_of(const uint8_t *p, size_t len, const float **rows, size_t *width, uint32_t *flags)
{
    if (len < WIRE_ENVELOPE || memcmp(p, "SFW1", 4) != 0) return -1;
    uint64_t n = get64(p + 40);
    *width = (size_t)get64(p + 48);
    *flags = (uint32_t)p[8] | (uint32_t)p[9] << 8;
    if (n == 0) return 0;
    const uint8_t *f = p + WIRE_ENVELOPE;
    if (p[6] != 0 || len < WIRE_ENVELOPE + FRAME_HEADER || memcmp(f, "SQF1", 4) != 0 || f[9] != 0 || f[10] != 0)
        return -1; /* f32 rows, raw codec, not quantized: what the server sends */
    uint64_t payload = get64(f + 72);
    if (payload != n * *width * 4 || len - WIRE_ENVELOPE - FRAME_HEADER != payload) return -1;
    *rows = (const float *)(f + FRAME_HEADER);
    return (long)n;
}

int main(int argc, char **argv)
{
    const char *server_key = NULL, *secret_file = NULL, *out_path = NULL, *endpoint = NULL, *in_path = NULL;
    uint64_t stream = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-k") == 0 && i + 1 < argc) server_key = argv[++i];
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) secret_file = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out_path = argv[++i];
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc) stream = strtoull(argv[++i], NULL, 10);
        else if (!endpoint) endpoint = argv[i];
        else if (!in_path) in_path = argv[i];
        else endpoint = NULL, i = argc;
    }
    if (!endpoint || (!server_key != !secret_file)) {
        fprintf(stderr, "usage: serve_client [-k SERVER_PUBLIC_KEY -s SECRET_KEY_FILE] [-o OUT] [-i STREAM] ENDPOINT [FILE]\n");
        return 2;
    }
    FILE *in = in_path ? fopen(in_path, "rb") : stdin, *out = out_path ? fopen(out_path, "wb") : NULL;
    if (!in || (out_path && !out)) {
        perror(in ? out_path : in_path);
        return 1;
    }
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    if (server_key) {
        char secret[64] = "", public_key[41];
        FILE *k = fopen(secret_file, "r");
        if (!k || !fgets(secret, sizeof secret, k)) {
            perror(secret_file);
            return 1;
        }
        fclose(k);
        secret[strcspn(secret, " \t\r\n")] = '\0';
        if (strlen(server_key) != 40 || strlen(secret) != 40 || zmq_curve_public(public_key, secret) != 0) {
            fprintf(stderr, "serve_client: keys are 40 Z85 characters\n");
            return 2;
        }
        zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_key, 40);
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, public_key, 40);
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret, 40);
    }
    if (zmq_connect(sock, endpoint) != 0) {
        fprintf(stderr, "serve_client: %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        return 1;
    }
    send_msg(sock, OPEN, stream, 4, 0, NULL, 0);
    uint64_t pushed = 0, received = 0, window = 0;
    double sum = 0;
    int input_done = 0, closed = 0, status = 0, silent_ms = 0;
    size_t buf_size = 1 << 24;
    uint8_t *buf = malloc(buf_size), chunk[CHUNK], payload[4 * CHUNK];
    while (!closed && !status && buf) {
        /* push while the window allows: the server holds at most `window` tokens not computed */
        while (window && !input_done && pushed - received + CHUNK <= window) {
            size_t n = fread(chunk, 1, CHUNK, in);
            for (size_t t = 0; t < n; t++) memset(payload + 4 * t + 1, 0, 3), payload[4 * t] = chunk[t];
            if (n) send_msg(sock, PUSH, stream, pushed, n, payload, 4 * n);
            pushed += n;
            if (n < CHUNK) {
                input_done = 1;
                send_msg(sock, CLOSE, stream, 0, 0, NULL, 0);
            }
        }
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 1000) <= 0) {
            if ((silent_ms += 1000) >= 60000) {
                fprintf(stderr, "serve_client: no answer from %s for 60 s\n", endpoint);
                status = 1;
            }
            send_msg(sock, PING, 0, 0, 0, NULL, 0); /* keeps this client alive while it waits */
            continue;
        }
        silent_ms = 0;
        int len = zmq_recv(sock, buf, buf_size, 0);
        if (len < HEADER || (size_t)len > buf_size || memcmp(buf, "SFS1", 4) != 0) {
            fprintf(stderr, "serve_client: a malformed reply\n");
            status = 1;
            break;
        }
        uint64_t a = get64(buf + 16), b = get64(buf + 24);
        const float *rows = NULL;
        size_t width = 0;
        uint32_t flags = 0;
        long n;
        switch (buf[5]) {
        case OPENED: window = b; pushed = a; break;
        case ROWS:
            send_msg(sock, CREDIT, stream, 1, 0, NULL, 0);
            n = rows_of(buf + HEADER, (size_t)len - HEADER, &rows, &width, &flags);
            if (n < 0 || (uint64_t)n != b || (!(flags & 2) && a != received)) {
                fprintf(stderr, "serve_client: rows out of order or malformed\n");
                status = 1;
                break;
            }
            if (flags & 2) break; /* provisional rows (a FLUSH): this client sends none */
            for (size_t i = 0; i < (size_t)n * width; i++) sum += rows[i];
            if (out && n && fwrite(rows, sizeof(float) * width, (size_t)n, out) != (size_t)n) status = 1;
            received += (uint64_t)n;
            break;
        case CLOSED: closed = 1; break;
        case PONG: break;
        case ERROR:
            fprintf(stderr, "serve_client: server: %.*s\n", (int)(len - HEADER), (const char *)buf + HEADER);
            status = 1;
            break;
        default: break;
        }
    }
    if (!status) printf("stream %llu: %llu tokens, %llu rows, sum %.6e\n", (unsigned long long)stream,
                        (unsigned long long)pushed, (unsigned long long)received, sum);
    if (out && fclose(out) != 0) status = 1;
    if (in != stdin) fclose(in);
    free(buf);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return status;
}
