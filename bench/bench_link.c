/* Network link throughput and round trip (pipeline/net.h) against raw ZeroMQ of the same
 * message size, in one process: two sf_net (ranks 0 and 1) over TCP loopback or ipc.
 *   link: a producer thread pushes `count` HIDDEN packets of rows x dim float32 (one reference
 *         model segment: 8192 x 1024, 32 MiB) on a raw-codec, lossless link; the main thread
 *         pops (and so decodes) them all. Round trip: a packet to rank 1 and back on a second
 *         link, one at a time.
 *   raw:  PUSH/PULL of messages of the same encoded size (zmq_send copies the bytes in, as the
 *         link's encoder does); round trip over a DEALER pair.
 * Usage: bench_link [-n count] [-r rows] [-d dim] [-t tcp|ipc] [--curve] [-w window] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "pipeline/net.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static void endpoint(char *out, size_t size, const char *transport, int which)
{
    if (strcmp(transport, "ipc") == 0) snprintf(out, size, "ipc:///tmp/bench-link-%d-%d.sock", (int)getpid(), which);
    else snprintf(out, size, "tcp://127.0.0.1:%d", free_port());
}

static size_t rows = 8192, dim = 1024;

static sf_packet *segment(uint64_t i)
{
    sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, rows, rows * dim);
    p->n = rows, p->width = dim, p->segment = i, p->stream = 1;
    memset(p->tokens, 0, rows * 4);
    /* rows: whatever the reused buffer holds; the raw codec does not look at values */
    return p;
}

typedef struct producer {
    sf_link *link;
    int count;
} producer;

static void *produce(void *arg)
{
    producer *pr = arg;
    for (int i = 0; i < pr->count; i++)
        if (pr->link->ops->push(pr->link, segment((uint64_t)i)) != SF_OK) break;
    pr->link->ops->close(pr->link);
    return NULL;
}

typedef struct raw_sender {
    void *ctx;
    const char *ep;
    size_t bytes;
    int count, curve;
    const char *server_pub, *pub, *sec;
    const void *data;
} raw_sender;

static void *raw_send(void *arg)
{
    raw_sender *r = arg;
    void *s = zmq_socket(r->ctx, ZMQ_PUSH);
    int hwm = 8;
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (r->curve) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, r->server_pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, r->pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, r->sec, 40);
    }
    zmq_connect(s, r->ep);
    for (int i = 0; i < r->count; i++) zmq_send(s, r->data, r->bytes, 0);
    zmq_close(s);
    return NULL;
}

int main(int argc, char **argv)
{
    int count = 32, curve = 0, window = 8;
    const char *transport = "tcp";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) rows = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-d") && i + 1 < argc) dim = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) transport = argv[++i];
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--curve")) curve = 1;
        else {
            fprintf(stderr, "usage: bench_link [-n count] [-r rows] [-d dim] [-t tcp|ipc] [--curve] [-w window]\n");
            return 2;
        }
    }
    char pub[2][41], sec[2][41], ep[2][128];
    for (int i = 0; i < 2; i++) {
        sf_net_keypair(pub[i], sec[i]);
        endpoint(ep[i], sizeof ep[i], transport, i);
    }
    /* the encoded size of one segment: what raw ZeroMQ sends too */
    sf_buffer enc = {0};
    sf_packet *probe = segment(0);
    memset(probe->x, 0, rows * dim * 4);
    sf_wire_encode(probe, NULL, NULL, &enc);
    sf_packet_free(probe);
    const size_t bytes = enc.len;

    sf_net *net[2];
    for (int i = 0; i < 2; i++) {
        sf_net_peer peer = {1 - i, ep[1 - i], curve ? pub[1 - i] : NULL, NULL};
        sf_net_options o = {0};
        o.rank = i, o.bind = ep[i], o.plaintext = !curve;
        o.secret_key = curve ? sec[i] : NULL, o.public_key = curve ? pub[i] : NULL;
        o.peers = &peer, o.n_peers = 1;
        if (sf_net_create(&o, &net[i]) != SF_OK) {
            fprintf(stderr, "bench_link: %s\n", sf_last_error());
            return 1;
        }
    }
    sf_link_options lo = sf_link_options_default();
    lo.window_packets = window;
    sf_link *out, *in, *back_out, *back_in;
    sf_net_link_create(net[0], 1, 1, SF_NET_SEND, &lo, &out);
    sf_net_link_create(net[1], 0, 1, SF_NET_RECV, &lo, &in);
    sf_net_link_create(net[1], 0, 2, SF_NET_SEND, &lo, &back_out);
    sf_net_link_create(net[0], 1, 2, SF_NET_RECV, &lo, &back_in);

    /* warm up (connections, buffers), then throughput */
    for (int i = 0; i < 2; i++) {
        out->ops->push(out, segment(0));
        sf_packet_free(in->ops->pop(in));
    }
    producer pr = {out, count};
    pthread_t t;
    double t0 = now_s();
    pthread_create(&t, NULL, produce, &pr);
    int got = 0;
    sf_packet *p;
    while ((p = in->ops->pop(in)) != NULL) got++, sf_packet_free(p);
    double link_s = now_s() - t0;
    pthread_join(t, NULL);
    if (sf_net_link_error(in) != SF_OK || got != count) fprintf(stderr, "bench_link: link delivered %d of %d: %s\n", got, count, sf_last_error());

    /* round trips on a fresh pair of links (the first one is closed): one segment, and one
     * packet of a single token */
    double rtt[2] = {0, 0};
    const int trips = 10;
    sf_link_destroy(out);
    sf_link_destroy(in);
    sf_net_link_create(net[0], 1, 3, SF_NET_SEND, &lo, &out);
    sf_net_link_create(net[1], 0, 3, SF_NET_RECV, &lo, &in);
    for (int small = 0; small < 2; small++) {
        t0 = now_s();
        for (int i = 0; i < trips; i++) {
            sf_packet *x = small ? sf_packet_new(SF_PACKET_SEGMENT, 1, 0) : segment((uint64_t)i);
            if (small) x->n = 1, x->tokens[0] = 1;
            out->ops->push(out, x);
            back_out->ops->push(back_out, in->ops->pop(in));
            sf_packet_free(back_in->ops->pop(back_in));
        }
        rtt[small] = (now_s() - t0) / trips;
    }
    out->ops->close(out);
    back_out->ops->close(back_out);
    sf_link_destroy(out), sf_link_destroy(in), sf_link_destroy(back_out), sf_link_destroy(back_in);
    sf_net_free(net[0]);
    sf_net_free(net[1]);

    /* raw ZeroMQ: PUSH/PULL of the same bytes, then a DEALER round trip */
    void *ctx = zmq_ctx_new();
    char rep[128];
    endpoint(rep, sizeof rep, transport, 2);
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    int hwm = 8;
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (curve) {
        int one = 1;
        zmq_setsockopt(pull, ZMQ_CURVE_SERVER, &one, sizeof one);
        zmq_setsockopt(pull, ZMQ_CURVE_SECRETKEY, sec[1], 40);
    }
    zmq_bind(pull, rep);
    raw_sender rs = {ctx, rep, bytes, count + 2, curve, pub[1], pub[0], sec[0], enc.data};
    pthread_create(&t, NULL, raw_send, &rs);
    zmq_msg_t m;
    zmq_msg_init(&m);
    for (int i = 0; i < 2; i++) zmq_msg_recv(&m, pull, 0);
    t0 = now_s();
    for (int i = 0; i < count; i++) zmq_msg_recv(&m, pull, 0);
    double raw_s = now_s() - t0;
    pthread_join(t, NULL);
    zmq_close(pull);
    /* round trip: PAIR sockets, each message copied in both ways like the link's */
    double raw_rtt[2] = {0, 0};
    void *a = zmq_socket(ctx, ZMQ_PAIR), *b = zmq_socket(ctx, ZMQ_PAIR);
    char pep[128];
    endpoint(pep, sizeof pep, transport, 3);
    zmq_bind(b, pep);
    zmq_connect(a, pep);
    for (int small = 0; small < 2; small++) {
        const size_t len = small ? 64 + 96 + 4 : bytes;
        t0 = now_s();
        for (int i = 0; i < trips; i++) {
            zmq_send(a, enc.data, len, 0);
            zmq_msg_recv(&m, b, 0);
            zmq_send(b, zmq_msg_data(&m), zmq_msg_size(&m), 0);
            zmq_msg_recv(&m, a, 0);
        }
        raw_rtt[small] = (now_s() - t0) / trips;
    }
    zmq_msg_close(&m);
    zmq_close(a), zmq_close(b);
    zmq_ctx_term(ctx);
    sf_buffer_release(&enc);

    const double mb = (double)bytes * count / 1e6;
    printf("bench_link: %s%s, %d packets of %zu x %zu f32 (%zu bytes encoded), window %d\n", transport,
           curve ? " CURVE" : " plaintext", count, rows, dim, bytes, window);
    printf("  link: %8.1f packets/s %9.1f MB/s   round trip %8.3f ms (segment) %7.3f ms (1 token)\n", count / link_s,
           mb / link_s, rtt[0] * 1e3, rtt[1] * 1e3);
    printf("  raw:  %8.1f packets/s %9.1f MB/s   round trip %8.3f ms (segment) %7.3f ms (small)\n", count / raw_s,
           mb / raw_s, raw_rtt[0] * 1e3, raw_rtt[1] * 1e3);
    printf("  link/raw throughput: %.0f%%\n", 100.0 * raw_s / link_s);
    return 0;
}
