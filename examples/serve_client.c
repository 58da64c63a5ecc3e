/* A client of `seqflow serve` (docs/SERVE.md), over libzmq alone: streams a file's bytes as one
 * stream's tokens and writes the committed hidden-state rows (raw float32, [tokens, D]) or
 * prints their count and a checksum.
 *
 *   serve_client [-k SERVER_PUBLIC_KEY -s CLIENT_SECRET_KEY_FILE] [-o OUT] [-i STREAM]
 *                [-R SECONDS] [-r TOKENS_PER_SECOND] [-m] ENDPOINT [FILE]
 *
 * Without -k the connection is plaintext (a server started with --plaintext). FILE defaults to
 * standard input. Flow control: it opens with a credit of 4 and grants one more for each ROWS
 * (acknowledging the rows it has, protocol version 3: a ROWS may come in several frames,
 * joined on receipt); it keeps (tokens pushed) - (rows
 * received) within the server's window, and sends PING while it waits so that a slow server
 * never takes it for gone. -r paces the input (for demonstrations and tests).
 *
 * Resume: where the server keeps checkpoints (it sends DURABLE right after OPENED), it keeps the
 * tokens the server has not made durable yet (DURABLE tells how far a checkpoint holds the
 * stream). When the connection drops (the server was killed or restarted,
 * which a socket monitor reports at once) it reconnects with a fresh socket, backing off from
 * 0.1 s to 2 s between tries, for at most -R seconds (default 30), and sends RESUME with the
 * rows it has; the server answers the position to push from, it pushes its kept tokens from
 * there and drops the rows it had already received: the output holds every row once, as an
 * uninterrupted run writes it. A stream the server had not checkpointed yet (RESUME answered
 * UNKNOWN) is opened afresh and pushed from 0, when this client still holds every token.
 *
 * -m (a server on this host): the rows come through a shared-memory region (protocol version
 * 4, docs/SERVE.md "Rows through shared memory"): MAP, then the region the server names is
 * mapped read-only and ATTACHed; each ROWS_AT's rows are read where they lie and RELEASEd. A
 * region that cannot be opened leaves the rows on the socket; after a reconnection it asks again. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zmq.h>

enum { OPEN = 1, PUSH = 2, CLOSE = 4, CREDIT = 5, PING = 6, RESUME = 7, MAP = 8, ATTACH = 9, RELEASE = 10 };
enum { OPENED = 16, ROWS = 17, CLOSED = 18, ERROR = 19, PONG = 20, DURABLE = 21, MAPPED = 22, ROWS_AT = 23 };
enum { E_UNKNOWN = 10 };
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

/* protocol version 3: RESUME, DURABLE, CREDIT's acknowledgement, ROWS in frames; 4 (-m): and
 * the shared-memory region */
static int version = 3;

/* The shared-memory region (-m), mapped read-only; base NULL: none. */
static const uint8_t *region;
static uint64_t region_size;

/* MAPPED's region: mapped (the previous one, of a dropped connection, unmapped) and ATTACHed. */
static void map_region(void *sock, const uint8_t *name, size_t name_len, uint64_t size);

/* Sends a message: the header, then `len` payload bytes. */
static int send_msg(void *sock, int type, uint64_t stream, uint64_t a, uint64_t b, const void *payload, size_t len)
{
    uint8_t *m = malloc(HEADER + len);
    if (!m) return -1;
    memcpy(m, "SFS1", 4);
    m[4] = (uint8_t)version;
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

/* Receives one whole message into *buf (grown as needed): its frames one after the other (in
 * protocol version 3 a ROWS may come in several). Returns its length, or -1. */
static long recv_msg(void *sock, uint8_t **buf, size_t *cap)
{
    size_t len = 0;
    int more = 1;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, sock, 0) < 0) {
            zmq_msg_close(&f);
            return -1;
        }
        const size_t size = zmq_msg_size(&f);
        if (len + size > *cap) {
            size_t want = *cap * 2 > len + size ? *cap * 2 : len + size;
            uint8_t *grown = realloc(*buf, want);
            if (!grown) {
                zmq_msg_close(&f);
                return -1;
            }
            *buf = grown, *cap = want;
        }
        memcpy(*buf + len, zmq_msg_data(&f), size);
        len += size;
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    return (long)len;
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

static void map_region(void *sock, const uint8_t *name, size_t name_len, uint64_t size)
{
    char path[80];
    snprintf(path, sizeof path, "%.*s", (int)(name_len < 64 ? name_len : 64), (const char *)name);
    if (region) munmap((void *)region, (size_t)region_size);
    region = NULL;
    const int fd = shm_open(path, O_RDONLY, 0);
    void *base = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (base == MAP_FAILED) { /* another host, another user: the rows stay on the socket */
        fprintf(stderr, "serve_client: the server's region %s cannot be mapped: rows over the socket\n", path);
        return;
    }
    region = base, region_size = size;
    send_msg(sock, ATTACH, 0, size, 0, NULL, 0);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The connection: a DEALER and a monitor that reports its disconnection. */
typedef struct conn {
    void *ctx, *sock, *monitor;
    const char *endpoint, *server_key;
    char secret[64], public_key[41];
    int generation;
} conn;

static int conn_open(conn *c)
{
    int zero = 0;
    c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (c->server_key) {
        zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, c->server_key, 40);
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, c->public_key, 40);
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, c->secret, 40);
    }
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://serve-client-monitor-%d", c->generation++);
    if (zmq_socket_monitor(c->sock, addr, ZMQ_EVENT_DISCONNECTED) == 0) {
        c->monitor = zmq_socket(c->ctx, ZMQ_PAIR);
        zmq_connect(c->monitor, addr);
    }
    if (zmq_connect(c->sock, c->endpoint) != 0) {
        fprintf(stderr, "serve_client: %s: %s\n", c->endpoint, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

static void conn_close(conn *c)
{
    if (c->monitor) zmq_close(c->monitor);
    if (c->sock) zmq_close(c->sock);
    c->monitor = c->sock = NULL;
}

/* A fresh socket that could send RESUME, within `deadline`; -1 when the server stayed away. */
static int reconnect(conn *c, uint64_t stream, uint64_t received, double deadline)
{
    double backoff = 0.1;
    for (;;) {
        conn_close(c);
        if (conn_open(c) != 0) return -1;
        int ms = (int)(backoff * 1000); /* a DEALER sends once it is connected */
        zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
        int rc = send_msg(c->sock, RESUME, stream, 4, received, NULL, 0);
        ms = -1;
        zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
        if (rc == 0) return 0;
        if (now_s() + backoff > deadline) return -1;
        backoff = backoff * 2 > 2 ? 2 : backoff * 2;
    }
}

int main(int argc, char **argv)
{
    const char *secret_file = NULL, *out_path = NULL, *in_path = NULL;
    conn cn = {0};
    uint64_t stream = 1;
    double resume_timeout = 30, rate = 0;
    int shm = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-k") == 0 && i + 1 < argc) cn.server_key = argv[++i];
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) secret_file = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out_path = argv[++i];
        else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc) stream = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-R") == 0 && i + 1 < argc) resume_timeout = strtod(argv[++i], NULL);
        else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) rate = strtod(argv[++i], NULL);
        else if (strcmp(argv[i], "-m") == 0)
            shm = 1, version = 4;
        else if (!cn.endpoint) cn.endpoint = argv[i];
        else if (!in_path) in_path = argv[i];
        else cn.endpoint = NULL, i = argc;
    }
    if (!cn.endpoint || (!cn.server_key != !secret_file) || !(resume_timeout >= 0) || !(rate >= 0)) {
        fprintf(stderr,
                "usage: serve_client [-k SERVER_PUBLIC_KEY -s SECRET_KEY_FILE] [-o OUT] [-i STREAM] [-R SECONDS]\n"
                "                    [-r TOKENS_PER_SECOND] [-m] ENDPOINT [FILE]\n");
        return 2;
    }
    FILE *in = in_path ? fopen(in_path, "rb") : stdin, *out = out_path ? fopen(out_path, "wb") : NULL;
    if (!in || (out_path && !out)) {
        perror(in ? out_path : in_path);
        return 1;
    }
    if (cn.server_key) {
        FILE *k = fopen(secret_file, "r");
        if (!k || !fgets(cn.secret, sizeof cn.secret, k)) {
            perror(secret_file);
            return 1;
        }
        fclose(k);
        cn.secret[strcspn(cn.secret, " \t\r\n")] = '\0';
        if (strlen(cn.server_key) != 40 || strlen(cn.secret) != 40 || zmq_curve_public(cn.public_key, cn.secret) != 0) {
            fprintf(stderr, "serve_client: keys are 40 Z85 characters\n");
            return 2;
        }
    }
    cn.ctx = zmq_ctx_new();
    if (conn_open(&cn) != 0) return 1;
    if (shm) send_msg(cn.sock, MAP, 0, 0, 0, NULL, 0);
    send_msg(cn.sock, OPEN, stream, 4, 0, NULL, 0);
    /* kept: the input's bytes from `base` (the durable position) to `have` (read so far) */
    uint64_t base = 0, have = 0, pushed = 0, received = 0, window = 0;
    size_t kept_cap = 1 << 16;
    uint8_t *kept = malloc(kept_cap);
    double sum = 0, started = now_s();
    int input_done = 0, close_sent = 0, closed = 0, status = 0, resuming = 0;
    double heard = now_s(), pinged = 0; /* the server's last message; this client's last PING */
    int resumable = 0; /* 1: DURABLE came (the server checkpoints); -1: ROWS came first (it does not) */
    size_t buf_size = 1 << 20;
    uint8_t *buf = malloc(buf_size), payload[4 * CHUNK];
    while (!closed && !status && buf && kept) {
        /* read ahead as -r allows; push while the window allows: the server holds at most
         * `window` tokens not computed */
        while (window && !resuming && pushed - received + CHUNK <= window) {
            if (pushed == have && !input_done) {
                size_t want = CHUNK;
                if (rate > 0) {
                    double allowed = rate * (now_s() - started) - (double)have;
                    want = allowed < 1 ? 0 : allowed < CHUNK ? (size_t)allowed : CHUNK;
                    if (!want) break;
                }
                if (have - base + want > kept_cap) {
                    while (have - base + want > kept_cap) kept_cap *= 2;
                    uint8_t *grown = realloc(kept, kept_cap);
                    if (!grown) {
                        status = 1;
                        break;
                    }
                    kept = grown;
                }
                size_t n = fread(kept + (have - base), 1, want, in);
                have += n;
                if (n < want) input_done = 1;
            }
            size_t n = have - pushed > CHUNK ? CHUNK : (size_t)(have - pushed);
            if (!n) break;
            for (size_t t = 0; t < n; t++) memset(payload + 4 * t + 1, 0, 3), payload[4 * t] = kept[pushed - base + t];
            send_msg(cn.sock, PUSH, stream, pushed, n, payload, 4 * n);
            pushed += n;
            if (resumable < 0) { /* a server without checkpoints: nothing to keep */
                memmove(kept, kept + (pushed - base), (size_t)(have - pushed));
                base = pushed;
            }
        }
        if (window && !resuming && input_done && pushed == have && !close_sent) {
            send_msg(cn.sock, CLOSE, stream, 0, 0, NULL, 0);
            close_sent = 1;
        }
        zmq_pollitem_t it[2] = {{cn.sock, 0, ZMQ_POLLIN, 0}, {cn.monitor, 0, ZMQ_POLLIN, 0}};
        int paced = rate > 0 && !input_done;
        int ready = zmq_poll(it, cn.monitor ? 2 : 1, paced ? 10 : 1000);
        if (cn.monitor && (it[1].revents & ZMQ_POLLIN)) { /* the server went away: resume */
            zmq_msg_t ev;
            for (int more = 1; more;) {
                zmq_msg_init(&ev);
                zmq_msg_recv(&ev, cn.monitor, 0);
                more = zmq_msg_more(&ev);
                zmq_msg_close(&ev);
            }
            if (resumable < 0) {
                fprintf(stderr, "serve_client: the connection to %s dropped; the server keeps no checkpoints\n", cn.endpoint);
                status = 1;
                break;
            }
            if (reconnect(&cn, stream, received, now_s() + resume_timeout) != 0) {
                fprintf(stderr, "serve_client: the server at %s stayed away for %g s\n", cn.endpoint, resume_timeout);
                status = 1;
                break;
            }
            resuming = 1, window = 0, heard = now_s();
            if (shm) send_msg(cn.sock, MAP, 0, 0, 0, NULL, 0); /* the old region was the old server's */
            continue;
        }
        if (ready <= 0 || !(it[0].revents & ZMQ_POLLIN)) {
            /* paced or not: a client whose window is full waits for rows like any other */
            const double t = now_s();
            if (t - heard >= 60) {
                fprintf(stderr, "serve_client: no answer from %s for 60 s\n", cn.endpoint);
                status = 1;
            }
            if (t - heard >= 1 && t - pinged >= 1) { /* keeps this client alive while it waits */
                send_msg(cn.sock, PING, 0, 0, 0, NULL, 0);
                pinged = t;
            }
            continue;
        }
        heard = now_s();
        long len = recv_msg(cn.sock, &buf, &buf_size);
        if (len < HEADER || memcmp(buf, "SFS1", 4) != 0) {
            fprintf(stderr, "serve_client: a malformed reply\n");
            status = 1;
            break;
        }
        uint64_t a = get64(buf + 16), b = get64(buf + 24);
        const float *rows = NULL;
        const uint8_t *packet = buf + HEADER; /* a ROWS's wire packet: here, or in the region */
        size_t packet_len = (size_t)len - HEADER, width = 0;
        uint32_t flags = 0;
        long n;
        switch (buf[5]) {
        case OPENED:
            if (a < base || a > have) {
                fprintf(stderr, "serve_client: the server resumes at %llu; this client holds %llu..%llu\n",
                        (unsigned long long)a, (unsigned long long)base, (unsigned long long)have);
                status = 1;
                break;
            }
            if (resuming)
                fprintf(stderr, "serve_client: stream %llu resumed at position %llu (%llu rows received)\n",
                        (unsigned long long)stream, (unsigned long long)a, (unsigned long long)received);
            window = b, pushed = a, resuming = 0, close_sent = 0; /* CLOSE again: it may be lost */
            break;
        case DURABLE:
            resumable = 1; /* the server checkpoints this stream (DURABLE follows OPENED) */
            if (a > base && a <= pushed) { /* the server's checkpoint holds them: drop */
                memmove(kept, kept + (a - base), (size_t)(have - a));
                base = a;
            }
            break;
        case MAPPED: map_region(cn.sock, buf + HEADER, (size_t)len - HEADER, a); break;
        case ROWS_AT: /* the rows lie in the region: read there, then released */
            packet_len = (size_t)get64(buf + HEADER + 8);
            packet = region && get64(buf + HEADER) % region_size + packet_len <= region_size
                         ? region + get64(buf + HEADER) % region_size
                         : NULL;
            if (!packet || len != HEADER + 16) {
                fprintf(stderr, "serve_client: a ROWS_AT outside the region\n");
                status = 1;
                break;
            }
            /* fall through */
        case ROWS:
            if (!resumable) resumable = -1; /* rows before any DURABLE: no checkpoints */
            n = rows_of(packet, packet_len, &rows, &width, &flags);
            if (n < 0 || (uint64_t)n != b || (!(flags & 2) && a > received)) {
                fprintf(stderr, "serve_client: rows out of order or malformed\n");
                status = 1;
                break;
            }
            if (!(flags & 2) && a + b > received) { /* new rows: those before `received` came before a resume */
                size_t skip = (size_t)(received - a);
                rows += skip * width, n -= (long)skip;
                for (size_t i = 0; i < (size_t)n * width; i++) sum += rows[i];
                if (out && n && fwrite(rows, sizeof(float) * width, (size_t)n, out) != (size_t)n) status = 1;
                received += (uint64_t)n;
            } /* provisional rows (a FLUSH): this client sends none */
            send_msg(cn.sock, CREDIT, stream, 1, received, NULL, 0);
            if (buf[5] == ROWS_AT) send_msg(cn.sock, RELEASE, 0, get64(buf + HEADER) + packet_len, 0, NULL, 0);
            break;
        case CLOSED: closed = 1; break;
        case PONG: break;
        case ERROR:
            if (a == E_UNKNOWN && resuming && base == 0) { /* not checkpointed yet: start over */
                fprintf(stderr, "serve_client: stream %llu was not checkpointed yet: opened again from 0\n",
                        (unsigned long long)stream);
                send_msg(cn.sock, OPEN, stream, 4, 0, NULL, 0);
                break;
            }
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
    free(kept);
    if (region) munmap((void *)region, (size_t)region_size);
    conn_close(&cn);
    zmq_ctx_term(cn.ctx);
    return status;
}
