/* What libzmq alone carries between two sockets of one host, by the size of the frames a large
 * message is cut into: the transport under `seqflow serve`'s ROWS (docs/SERVE.md, "Frames").
 *
 *   bench_zmq_frames [--bytes B] [--messages N] [--endpoint ENDPOINT] [--streams S] [FRAME ...]
 *
 * S pairs of DEALER sockets (default 1), each pair with its own sender thread, all senders on
 * one context and all receivers on another (each of S I/O threads, as the server and a client
 * process have their own). Each sender sends N messages (default 40) of B bytes (default 32 MiB
 * and 128 bytes: a float32 segment of the reference model with its headers) from one buffer
 * without a copy, as a multipart message of frames of at most FRAME bytes (0: one frame); each
 * receiver takes every frame and copies it into one buffer of the whole message, as a client
 * does. FRAME defaults to 0 1048576 4194304 16777216. The endpoint (default ipc:///tmp/...)
 * gets the pair's number appended. Output: a line a FRAME with GB/s (all pairs together, from
 * the first message's arrival to the last), then RESULT lines of key=value. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct pair {
    void *tx, *rx;
    size_t bytes, frame;
    int messages;
    uint8_t *data;
    double first, last; /* the receiver's: first message whole, last message whole */
    int ok;
} pair;

static void no_free(void *data, void *hint) { (void)data, (void)hint; }

static void *sender(void *arg)
{
    pair *p = arg;
    const size_t frame = p->frame ? p->frame : p->bytes;
    for (int m = 0; m < p->messages; m++)
        for (size_t at = 0; at < p->bytes; at += frame) {
            const size_t size = p->bytes - at < frame ? p->bytes - at : frame;
            zmq_msg_t f;
            zmq_msg_init_data(&f, p->data + at, size, no_free, NULL);
            if (zmq_msg_send(&f, p->tx, at + size < p->bytes ? ZMQ_SNDMORE : 0) < 0) {
                zmq_msg_close(&f);
                return NULL;
            }
        }
    return NULL;
}

static void *receiver(void *arg)
{
    pair *p = arg;
    uint8_t *whole = malloc(p->bytes);
    p->ok = whole != NULL;
    for (int m = 0; m < p->messages && p->ok; m++) {
        size_t len = 0;
        for (int more = 1; more;) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, p->rx, 0) < 0) {
                p->ok = 0;
                zmq_msg_close(&f);
                break;
            }
            const size_t size = zmq_msg_size(&f);
            if (len + size <= p->bytes) memcpy(whole + len, zmq_msg_data(&f), size);
            len += size;
            more = zmq_msg_more(&f);
            zmq_msg_close(&f);
        }
        if (len != p->bytes) p->ok = 0;
        p->last = now_s();
        if (m == 0) p->first = p->last;
    }
    free(whole);
    return NULL;
}

int main(int argc, char **argv)
{
    size_t bytes = (32u << 20) + 128;
    int messages = 40, streams = 1, nframes = 0;
    char endpoint[200];
    snprintf(endpoint, sizeof endpoint, "ipc:///tmp/bench_zmq_frames.%d", (int)getpid());
    size_t frames[32];
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--bytes") == 0) bytes = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--messages") == 0) messages = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--streams") == 0) streams = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--endpoint") == 0) snprintf(endpoint, sizeof endpoint, "%s", argv[++i]);
        else if (argv[i][0] != '-' && nframes < 32) frames[nframes++] = strtoull(argv[i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_zmq_frames [--bytes B] [--messages N] [--endpoint E] [--streams S] [FRAME ...]\n");
            return 2;
        }
    }
    if (!nframes) frames[0] = 0, frames[1] = 1 << 20, frames[2] = 4 << 20, frames[3] = 16 << 20, nframes = 4;
    if (bytes < 1 || messages < 2 || streams < 1 || streams > 64) return 2;
    uint8_t *data = malloc(bytes);
    if (!data) return 1;
    memset(data, 7, bytes);
    int status = 0;
    for (int k = 0; k < nframes; k++) {
        void *ctx_tx = zmq_ctx_new(), *ctx_rx = zmq_ctx_new();
        zmq_ctx_set(ctx_tx, ZMQ_IO_THREADS, streams);
        zmq_ctx_set(ctx_rx, ZMQ_IO_THREADS, streams);
        pair *ps = calloc((size_t)streams, sizeof *ps);
        pthread_t *th = calloc(2 * (size_t)streams, sizeof *th);
        for (int s = 0; s < streams; s++) {
            pair *p = &ps[s];
            char ep[220];
            snprintf(ep, sizeof ep, "%s.%d", endpoint, s);
            int zero = 0;
            p->tx = zmq_socket(ctx_tx, ZMQ_DEALER), p->rx = zmq_socket(ctx_rx, ZMQ_DEALER);
            zmq_setsockopt(p->tx, ZMQ_SNDHWM, &zero, sizeof zero);
            zmq_setsockopt(p->rx, ZMQ_RCVHWM, &zero, sizeof zero);
            zmq_setsockopt(p->tx, ZMQ_LINGER, &zero, sizeof zero);
            zmq_setsockopt(p->rx, ZMQ_LINGER, &zero, sizeof zero);
            if (zmq_bind(p->tx, ep) != 0 || zmq_connect(p->rx, ep) != 0) {
                fprintf(stderr, "bench_zmq_frames: %s: %s\n", ep, zmq_strerror(zmq_errno()));
                return 1;
            }
            p->bytes = bytes, p->frame = frames[k], p->messages = messages, p->data = data;
        }
        for (int s = 0; s < streams; s++) {
            pthread_create(&th[2 * s], NULL, receiver, &ps[s]);
            pthread_create(&th[2 * s + 1], NULL, sender, &ps[s]);
        }
        for (int s = 0; s < 2 * streams; s++) pthread_join(th[s], NULL);
        double first = 1e300, last = 0;
        int ok = 1;
        for (int s = 0; s < streams; s++) {
            ok &= ps[s].ok;
            if (ps[s].first < first) first = ps[s].first;
            if (ps[s].last > last) last = ps[s].last;
            zmq_close(ps[s].tx), zmq_close(ps[s].rx);
        }
        /* from the first message whole to the last: the messages after the first */
        const double gbs = ok ? (double)bytes * (messages - 1) * streams / (last - first) / 1e9 : 0;
        printf("frames of %zu bytes (0: one frame), %d x %zu-byte messages on %d connection(s): %.2f GB/s%s\n",
               frames[k], messages, bytes, streams, gbs, ok ? "" : " (FAILED)");
        printf("RESULT frame=%zu bytes=%zu messages=%d streams=%d gbs=%.3f ok=%d\n", frames[k], bytes, messages, streams,
               gbs, ok);
        status |= !ok;
        free(ps), free(th);
        zmq_ctx_term(ctx_tx), zmq_ctx_term(ctx_rx);
    }
    free(data);
    return status;
}
