/* Network links (pipeline/net.h) between two sf_net in one process, over TCP loopback and
 * ipc: order and identity of every kind of packet, a lossy link with error feedback,
 * back-pressure by credit, CURVE refusals, a silent peer (a frozen I/O thread, and a child
 * process stopped with SIGSTOP), reconnection through a proxy that cuts the connection, and
 * malformed messages from a raw socket, lost acknowledgements, and a peer that says goodbye. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "compress/quantize.h"
#include "pipeline/net.h"
#include "pipeline/net_internal.h"
#include "pipeline/wire.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/tcp_proxy.h"

static char pub[3][41], sec[3][41];

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

typedef struct pair {
    char ep[2][128];  /* where each binds */
    char via[2][128]; /* where the other connects to reach it */
    sf_net *net[2];
} pair;

static void endpoints(pair *p, int ipc)
{
    memset(p, 0, sizeof *p);
    for (int i = 0; i < 2; i++) {
        if (ipc) snprintf(p->ep[i], sizeof p->ep[i], "ipc://%s", check_tmp_path(i ? "net-b.sock" : "net-a.sock"));
        else snprintf(p->ep[i], sizeof p->ep[i], "tcp://127.0.0.1:%d", check_free_port());
        strcpy(p->via[i], p->ep[i]);
    }
}

/* Rank i of the pair; key_of_other: which key pair it believes the other rank has. */
static int make_net(pair *p, int i, int plaintext, int key_of_other, int timeout_ms, sf_net **out)
{
    sf_net_peer peer = {1 - i, p->via[1 - i], plaintext ? NULL : pub[key_of_other], "loopback"};
    sf_net_options o = {0};
    o.rank = i, o.bind = p->ep[i];
    o.secret_key = plaintext ? NULL : sec[i], o.public_key = plaintext ? NULL : pub[i];
    o.plaintext = plaintext;
    o.peers = &peer, o.n_peers = 1;
    o.heartbeat_ms = 100, o.timeout_ms = timeout_ms, o.connect_timeout_ms = 2000, o.linger_ms = 200;
    return sf_net_create(&o, out);
}

static int make_pair(pair *p, int ipc, int plaintext, int timeout_ms)
{
    endpoints(p, ipc);
    int rc = make_net(p, 0, plaintext, 1, timeout_ms, &p->net[0]);
    if (rc == SF_OK) rc = make_net(p, 1, plaintext, 0, timeout_ms, &p->net[1]);
    return rc;
}

static void free_pair(pair *p)
{
    sf_net_free(p->net[0]);
    sf_net_free(p->net[1]);
    p->net[0] = p->net[1] = NULL;
}

/* Packet i of a test stream: cycles through tokens-only, f32 and bf16 rows, checkpoint
 * markers with state, flushes; the last one is FINAL. */
static sf_packet *numbered(int i, int last, size_t rows, size_t width)
{
    check_rng r = {(uint64_t)i * 7919 + 1};
    sf_packet *p;
    const int kind = i % 5;
    if (kind == 0) {
        p = sf_packet_new(SF_PACKET_SEGMENT, rows, 0);
        p->n = rows;
        for (size_t k = 0; k < rows; k++) p->tokens[k] = (uint32_t)check_rng_next(&r);
    } else if (kind == 1 || kind == 2) {
        p = sf_packet_new(SF_PACKET_HIDDEN, rows, rows * width);
        p->n = rows, p->width = width;
        for (size_t k = 0; k < rows; k++) p->tokens[k] = (uint32_t)k;
        check_fill_normal(&r, p->x, rows * width, 2.0);
        if (kind == 2) sf_packet_to_bf16(p);
    } else if (kind == 3) {
        p = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0);
        p->state_len = p->state_cap = 100 + (size_t)i;
        p->state = malloc(p->state_len);
        for (size_t k = 0; k < p->state_len; k++) p->state[k] = (uint8_t)check_rng_next(&r);
    } else {
        p = sf_packet_new(SF_PACKET_FLUSH, 0, 0);
    }
    p->segment = (uint64_t)i, p->stream = 3, p->position = (uint64_t)i * rows;
    if (last) p->flags |= SF_PACKET_FINAL;
    return p;
}

static int same(const sf_packet *a, const sf_packet *b)
{
    if (!a || !b) return 0;
    if (a->kind != b->kind || a->flags != b->flags || a->stream != b->stream || a->segment != b->segment ||
        a->position != b->position || a->n != b->n || a->width != b->width || a->state_len != b->state_len)
        return 0;
    if (a->tokens && a->n && (!b->tokens || memcmp(a->tokens, b->tokens, a->n * 4))) return 0;
    if (a->n && a->width && (a->dtype != b->dtype || memcmp(sf_packet_rows(a), sf_packet_rows(b), sf_packet_row_bytes(a))))
        return 0;
    return !a->state_len || memcmp(a->state, b->state, a->state_len) == 0;
}

typedef struct producer {
    sf_link *link;
    int count, close_at_end;
    size_t rows, width;
    int pushed, rc;
} producer;

static void *produce(void *arg)
{
    producer *pr = arg;
    for (int i = 0; i < pr->count; i++) {
        pr->rc = pr->link->ops->push(pr->link, numbered(i, i == pr->count - 1, pr->rows, pr->width));
        if (pr->rc != SF_OK) break;
        __atomic_add_fetch(&pr->pushed, 1, __ATOMIC_SEQ_CST);
    }
    if (pr->close_at_end) pr->link->ops->close(pr->link);
    return NULL;
}

/* Pops everything, checking each packet against numbered(); returns how many matched in order. */
static int consume(sf_link *in, int count, size_t rows, size_t width, tcp_proxy *cut, const int *cut_at)
{
    int good = 0, i = 0, c = 0;
    sf_packet *p;
    while ((p = in->ops->pop(in)) != NULL) {
        sf_packet *want = numbered(i, i == count - 1, rows, width);
        good += same(want, p);
        sf_packet_free(want);
        sf_packet_free(p);
        i++;
        if (cut && cut_at[c] && i == cut_at[c]) tcp_proxy_cut(cut), c++;
    }
    return good == i ? good : -good - 1;
}

/* 200 packets through one link with codec/shuffle; returns the packet bytes the sender sent. */
static uint64_t roundtrip(int ipc, int plaintext, sf_codec codec, int shuffle)
{
    pair p;
    CHECK_OK(make_pair(&p, ipc, plaintext, 3000));
    if (!p.net[0] || !p.net[1]) return free_pair(&p), 0;
    sf_link_options o = sf_link_options_default();
    o.window_packets = 4;
    o.codec = codec, o.shuffle = shuffle;
    sf_link *out = NULL, *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 5, SF_NET_SEND, &o, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 5, SF_NET_RECV, &o, &in));
    CHECK(sf_net_link_create(p.net[1], 0, 5, SF_NET_RECV, &o, &(sf_link *){NULL}) == SF_E_INVAL);
    producer pr = {out, 200, 1, 33, 19, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, produce, &pr);
    int got = consume(in, pr.count, pr.rows, pr.width, NULL, NULL);
    pthread_join(t, NULL);
    CHECKF(got == pr.count, "%s%s %s%s: %d of %d packets identical and in order", ipc ? "ipc" : "tcp",
           plaintext ? " plaintext" : "", sf_codec_name(codec), shuffle ? " shuffle" : "", got, pr.count);
    CHECK_OK(sf_net_link_error(in));
    CHECK_OK(sf_net_link_error(out));
    if (ipc) { /* the receiving half goes first: its last acknowledgement must still reach the sender */
        sf_link_destroy(in);
        sf_link_destroy(out);
    } else {
        sf_link_destroy(out);
        sf_link_destroy(in);
    }
    sf_net_stats st;
    sf_net_stats_get(p.net[0], &st);
    free_pair(&p);
    return st.packet_bytes_sent;
}

static void lossy_link(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 0, 0, 3000));
    sf_link_options o = sf_link_options_default();
    o.codec = SF_CODEC_LZ4, o.quant = SF_QUANT_INT8;
    sf_link *out = NULL, *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 9, SF_NET_SEND, &o, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 9, SF_NET_RECV, &o, &in));
    const size_t n = 32, w = 64, count = n * w;
    sf_quant_params qp = {SF_QUANT_INT8, (int)w};
    sf_quant_feedback fb;
    sf_quant_feedback_init(&fb, count);
    uint8_t *enc = malloc(sf_quant_encoded_size(&qp, count));
    float *expect = malloc(count * sizeof *expect);
    check_rng r = {5};
    int exact = 0, within = 0;
    for (int s = 0; s < 8; s++) {
        sf_packet *x = sf_packet_new(SF_PACKET_HIDDEN, 0, count);
        x->n = n, x->width = w, x->stream = 4, x->segment = (uint64_t)s;
        check_fill_normal(&r, x->x, count, 1.5);
        double bound = sf_quant_error_bound(&qp, x->x, count);
        float *v = malloc(count * sizeof *v);
        for (size_t i = 0; i < count; i++) v[i] = x->x[i] + fb.residual[i];
        const double bound_v = sf_quant_error_bound(&qp, v, count);
        double res_max = 0;
        for (size_t i = 0; i < count; i++) res_max = res_max > fabsf(fb.residual[i]) ? res_max : fabsf(fb.residual[i]);
        sf_quantize_with_feedback(&qp, &fb, x->x, count, enc, sf_quant_encoded_size(&qp, count));
        sf_dequantize(&qp, enc, sf_quant_encoded_size(&qp, count), expect, count);
        memcpy(v, x->x, count * sizeof *v);
        CHECK_OK(out->ops->push(out, x));
        sf_packet *y = in->ops->pop(in);
        CHECK(y != NULL);
        if (!y) break;
        exact += memcmp(y->x, expect, count * sizeof *expect) == 0;
        double worst = 0;
        for (size_t i = 0; i < count; i++) worst = worst > fabs(y->x[i] - v[i]) ? worst : fabs(y->x[i] - v[i]);
        within += worst <= bound_v + res_max + 1e-6;
        (void)bound;
        free(v);
        sf_packet_free(y);
    }
    CHECKF(exact == 8, "%d of 8 int8+lz4 packets as the quantizer with feedback decodes them", exact);
    CHECKF(within == 8, "%d of 8 int8+lz4 packets within the quantizer's bound plus the carried residual", within);
    out->ops->close(out);
    CHECK(in->ops->pop(in) == NULL);
    CHECK_OK(sf_net_link_error(in));
    sf_link_destroy(out);
    sf_link_destroy(in);
    sf_quant_feedback_release(&fb);
    free(enc), free(expect);
    free_pair(&p);
}

static void back_pressure(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 1, 1, 3000));
    for (int by_bytes = 0; by_bytes < 2 && p.net[0] && p.net[1]; by_bytes++) {
        sf_link_options o = sf_link_options_default();
        o.window_packets = by_bytes ? 100 : 4;
        o.window_bytes = by_bytes ? (size_t)3 << 20 : 0;
        sf_link *out = NULL, *in = NULL;
        CHECK_OK(sf_net_link_create(p.net[0], 1, 20 + by_bytes, SF_NET_SEND, &o, &out));
        CHECK_OK(sf_net_link_create(p.net[1], 0, 20 + by_bytes, SF_NET_RECV, &o, &in));
        if (!out || !in) break;
        /* kind 1 packets of 1 MiB of rows each: the producer sends only i % 5 == 1 ones */
        producer pr = {out, 12, 1, 1024, 256, 0, 0};
        pthread_t t;
        const size_t rss0 = check_rss_bytes();
        pthread_create(&t, NULL, produce, &pr);
        usleep(500000);
        const int pushed = __atomic_load_n(&pr.pushed, __ATOMIC_SEQ_CST);
        const size_t grown = check_rss_bytes() - rss0;
        /* the byte window: pushes go on while the encoded bytes stay within 3 MiB */
        int fit = 0;
        for (size_t sum = 0; by_bytes; fit++) {
            sf_packet *x = numbered(fit, 0, pr.rows, pr.width);
            sf_buffer b = {0};
            sf_wire_encode(x, NULL, NULL, &b);
            sum += b.len;
            sf_buffer_release(&b), sf_packet_free(x);
            if (sum > o.window_bytes) break;
        }
        CHECKF(by_bytes ? pushed == fit : pushed == 4, "%s window: %d pushed while nobody pops", by_bytes ? "byte" : "packet", pushed);
        CHECKF(grown < (size_t)40 << 20, "memory grew by %zu bytes with a full window", grown);
        int got = consume(in, pr.count, pr.rows, pr.width, NULL, NULL);
        pthread_join(t, NULL);
        CHECKF(got == pr.count, "after the stall, %d of %d", got, pr.count);
        sf_link_destroy(out);
        sf_link_destroy(in);
    }
    free_pair(&p);
}

/* A link whose half must fail with SF_E_PEER within `limit` seconds, its message mentioning `what`. */
static void expect_peer_failure(sf_link *l, int recv, double limit, const char *what, const char *label)
{
    const double t0 = now_s();
    int rc = SF_OK;
    while (now_s() - t0 < limit + 2) {
        if (recv) {
            sf_packet *x = l->ops->pop(l);
            sf_packet_free(x);
            if (!x) break;
        } else {
            if ((rc = sf_net_link_error(l)) != SF_OK) break;
            usleep(10000);
        }
    }
    const double took = now_s() - t0;
    rc = sf_net_link_error(l);
    CHECKF(rc == SF_E_PEER, "%s: error %d (%s)", label, rc, sf_last_error());
    CHECKF(strstr(sf_last_error(), what) != NULL, "%s: message '%s' lacks '%s'", label, sf_last_error(), what);
    CHECKF(took <= limit, "%s: took %.2f s (limit %.2f)", label, took, limit);
}

static void curve_refusals(void)
{
    /* rank 1 believes rank 0's key is key 2: rank 0's connection is refused */
    pair p;
    endpoints(&p, 0);
    CHECK_OK(make_net(&p, 0, 0, 1, 3000, &p.net[0]));
    CHECK_OK(make_net(&p, 1, 0, 2, 3000, &p.net[1]));
    sf_link *out = NULL, *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 1, SF_NET_SEND, NULL, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 1, SF_NET_RECV, NULL, &in));
    CHECK_OK(out->ops->push(out, numbered(1, 0, 4, 4)));
    expect_peer_failure(out, 0, 2.0, "refused", "wrong public key");
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);

    /* a plaintext rank 0 against a rank 1 that requires CURVE */
    endpoints(&p, 0);
    CHECK_OK(make_net(&p, 0, 1, 1, 3000, &p.net[0]));
    CHECK_OK(make_net(&p, 1, 0, 0, 3000, &p.net[1]));
    CHECK_OK(sf_net_link_create(p.net[0], 1, 1, SF_NET_SEND, NULL, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 1, SF_NET_RECV, NULL, &in));
    expect_peer_failure(out, 0, 2.5, "rank 1", "plaintext against CURVE (sender)");
    expect_peer_failure(in, 1, 2.5, "rank 0", "plaintext against CURVE (receiver)");
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);

    /* nobody at the endpoint: not reached within connect_timeout_ms (2 s here) */
    endpoints(&p, 0);
    CHECK_OK(make_net(&p, 0, 0, 1, 3000, &p.net[0]));
    CHECK_OK(sf_net_link_create(p.net[0], 1, 1, SF_NET_SEND, NULL, &out));
    expect_peer_failure(out, 0, 2.6, p.via[1], "unreachable endpoint");
    sf_link_destroy(out);
    free_pair(&p);
}

/* A link on `channel` from rank `from` of the pair to the other (out: its sending half, in: its
 * receiving half), with one packet pushed across and popped: each rank has heard the other.
 * Returns 0 when a half could not be made. */
static int link_across(pair *p, int from, uint32_t channel, sf_link **out, sf_link **in)
{
    *out = *in = NULL;
    CHECK_OK(sf_net_link_create(p->net[from], 1 - from, channel, SF_NET_SEND, NULL, out));
    CHECK_OK(sf_net_link_create(p->net[1 - from], from, channel, SF_NET_RECV, NULL, in));
    if (!*out || !*in) return 0;
    CHECK_OK((*out)->ops->push(*out, numbered(1, 0, 4, 4)));
    sf_packet *x = (*in)->ops->pop(*in);
    CHECK(x != NULL);
    sf_packet_free(x);
    return 1;
}

static void frozen_peer(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 0, 0, 600));
    sf_link *out, *in;
    if (p.net[1]) sf_net_progress(p.net[1], 77);
    if (!link_across(&p, 0, 2, &out, &in)) {
        free_pair(&p);
        return;
    }
    usleep(300000);
    sf_net_peer_status st;
    CHECK_OK(sf_net_peer_status_get(p.net[0], 1, &st));
    CHECKF(st.connected && st.progress == 77 && st.silent_ms >= 0 && st.silent_ms < 300, "peer status: connected %d progress %llu silent %lld",
           st.connected, (unsigned long long)st.progress, (long long)st.silent_ms);
    sf_net_test_freeze(p.net[1], 1);
    expect_peer_failure(out, 0, 0.6 + 0.5, "rank 1 (host loopback) stopped answering", "frozen peer");
    CHECK(out->ops->push(out, numbered(2, 0, 4, 4)) == SF_E_PEER);
    sf_net_test_freeze(p.net[1], 0);
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);
}

/* A peer that closes its network says goodbye: its silence past the timeout is no failure
 * (the frozen one above, as silent, is one), and a new process of that rank is heard again. */
static void goodbye(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 0, 0, 600));
    sf_link *out, *in;
    if (!link_across(&p, 1, 4, &out, &in)) {
        free_pair(&p);
        return;
    }
    out->ops->close(out);
    CHECK(in->ops->pop(in) == NULL);
    sf_link_destroy(out);
    sf_net_peer_status st = {0};
    /* the goodbye is best effort: it needs rank 1's control connection up (it is, in any process
     * that lived a heartbeat or two; this one may be younger) */
    for (const double t0 = now_s(); now_s() - t0 < 3 && (sf_net_peer_status_get(p.net[1], 0, &st), !st.connected);)
        usleep(10000);
    CHECK(st.connected);
    sf_net_free(p.net[1]);
    p.net[1] = NULL;
    usleep(1200000); /* twice the timeout */
    CHECK_OK(sf_net_peer_status_get(p.net[0], 1, &st));
    CHECKF(st.left && !st.failed && st.silent_ms > 600, "after the goodbye: left %d failed %d silent %lld ms", st.left,
           st.failed, (long long)st.silent_ms);
    sf_link_destroy(in);
    /* the rank's next process: heard, so no longer taken for gone */
    CHECK_OK(make_net(&p, 1, 0, 0, 600, &p.net[1]));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 5, SF_NET_SEND, NULL, &out));
    for (const double t0 = now_s(); now_s() - t0 < 3 && (sf_net_peer_status_get(p.net[0], 1, &st), st.left);)
        usleep(10000);
    CHECKF(!st.left && !st.failed && st.silent_ms < 600, "the new process: left %d failed %d silent %lld ms", st.left,
           st.failed, (long long)st.silent_ms);
    CHECK_OK(sf_net_link_create(p.net[0], 1, 5, SF_NET_RECV, NULL, &in));
    CHECK_OK(out->ops->push(out, numbered(0, 1, 4, 4)));
    out->ops->close(out);
    sf_packet *x = in->ops->pop(in);
    if (x != NULL) CHECK(in->ops->pop(in) == NULL);
    CHECK(x != NULL);
    sf_packet_free(x);
    sf_link_destroy(in);
    /* it leaves without making the link this side waits on: that link fails after the timeout */
    CHECK_OK(sf_net_link_create(p.net[0], 1, 6, SF_NET_RECV, NULL, &in));
    sf_link_destroy(out);
    sf_net_free(p.net[1]);
    p.net[1] = NULL;
    expect_peer_failure(in, 1, 0.6 + 0.5, "rank 1 (host loopback) left", "a link its process never made");
    sf_link_destroy(in);
    free_pair(&p);
}

/* A process that drops its links as it ends (its error) and closes its network at once: the
 * aborts still reach the peer, ahead of the goodbye, so the peer's link fails with the reason
 * at once, not as a link left unfinished after the timeout. Every other round the I/O thread
 * is frozen first, so that it is stopped before a tick could send them. */
static void abort_then_leave(void)
{
    for (int round = 0; round < 8; round++) {
        pair p;
        CHECK_OK(make_pair(&p, 0, 0, 600));
        sf_link *out, *in;
        if (!link_across(&p, 0, 40, &out, &in)) {
            free_pair(&p);
            break;
        }
        if (round % 2) sf_net_test_freeze(p.net[1], 1), usleep(30000); /* past its next loop */
        sf_net_link_abort_why(in, "the stage failed");
        sf_link_destroy(in);
        sf_net_free(p.net[1]);
        p.net[1] = NULL;
        const double t0 = now_s();
        int rc = SF_OK;
        while (rc == SF_OK && now_s() - t0 < 2) {
            rc = out->ops->push(out, numbered(1, 0, 4, 4));
            if (rc == SF_OK) usleep(5000);
        }
        const double took = now_s() - t0;
        CHECKF(rc == SF_E_CLOSED && strstr(sf_last_error(), "aborted by rank 1") &&
                   strstr(sf_last_error(), "the stage failed") && took < 0.5,
               "round %d: the sender after its peer aborted and left: %d '%s' after %.2f s", round, rc, sf_last_error(),
               took);
        sf_link_destroy(out);
        free_pair(&p);
    }
}

/* A child process sends, then is stopped with SIGSTOP: the parent's pop ends with SF_E_PEER. */
static void stopped_child(void)
{
    pair p;
    endpoints(&p, 1);
    pid_t pid = fork();
    if (pid == 0) {
        sf_net *n = NULL;
        sf_link *out = NULL;
        if (make_net(&p, 1, 0, 0, 600, &n) != SF_OK || sf_net_link_create(n, 0, 3, SF_NET_SEND, NULL, &out) != SF_OK) _exit(1);
        for (int i = 0; i < 3; i++) out->ops->push(out, numbered(i, 0, 8, 8));
        sleep(30);
        _exit(0);
    }
    CHECK_OK(make_net(&p, 0, 0, 1, 600, &p.net[0]));
    sf_link *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 3, SF_NET_RECV, NULL, &in));
    if (!in) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        free_pair(&p);
        return;
    }
    int got = 0;
    for (int i = 0; i < 3; i++) {
        sf_packet *x = in->ops->pop(in);
        sf_packet *want = numbered(i, 0, 8, 8);
        got += same(want, x);
        sf_packet_free(x), sf_packet_free(want);
    }
    CHECKF(got == 3, "%d of 3 packets from the child", got);
    kill(pid, SIGSTOP);
    expect_peer_failure(in, 1, 0.6 + 0.5, "rank 1 (host loopback) stopped answering", "stopped child");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    sf_link_destroy(in);
    free_pair(&p);
}

static void reconnect(void)
{
    pair p;
    endpoints(&p, 0);
    int port = 0;
    sscanf(p.ep[1], "tcp://127.0.0.1:%d", &port);
    tcp_proxy *proxy = NULL;
    CHECK(tcp_proxy_start("127.0.0.1", port, NULL, &proxy) == 0);
    snprintf(p.via[1], sizeof p.via[1], "tcp://127.0.0.1:%d", tcp_proxy_port(proxy));
    CHECK_OK(make_net(&p, 0, 0, 1, 3000, &p.net[0]));
    CHECK_OK(make_net(&p, 1, 0, 0, 3000, &p.net[1]));
    sf_link *out = NULL, *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 4, SF_NET_SEND, NULL, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 4, SF_NET_RECV, NULL, &in));
    producer pr = {out, 400, 1, 64, 128, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, produce, &pr);
    static const int cut_at[] = {40, 150, 151, 300, 0};
    int got = consume(in, pr.count, pr.rows, pr.width, proxy, cut_at);
    pthread_join(t, NULL);
    CHECKF(got == pr.count, "across 4 cuts: %d of %d packets identical, in order, once", got, pr.count);
    CHECK_OK(sf_net_link_error(in));
    CHECKF(tcp_proxy_accepted(proxy) >= 3, "%d connections through the proxy", tcp_proxy_accepted(proxy));
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);
    tcp_proxy_stop(proxy);
}

/* A slow path (1 MB/s through the proxy) with 1.5 MiB of packets queued on it: longer to drain
 * than the 600 ms timeout, yet heartbeats travel on their own connection and nothing fails. */
static void slow_path(void)
{
    pair p;
    endpoints(&p, 0);
    int port = 0;
    sscanf(p.ep[1], "tcp://127.0.0.1:%d", &port);
    tcp_proxy *proxy = NULL;
    tcp_proxy_options po = {.delay_ms = 20, .rate = 1e6};
    CHECK(tcp_proxy_start("127.0.0.1", port, &po, &proxy) == 0);
    snprintf(p.via[1], sizeof p.via[1], "tcp://127.0.0.1:%d", tcp_proxy_port(proxy));
    CHECK_OK(make_net(&p, 0, 0, 1, 600, &p.net[0]));
    CHECK_OK(make_net(&p, 1, 0, 0, 600, &p.net[1]));
    sf_link_options o = sf_link_options_default();
    o.window_packets = 4;
    sf_link *out = NULL, *in = NULL;
    CHECK_OK(sf_net_link_create(p.net[0], 1, 8, SF_NET_SEND, &o, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 8, SF_NET_RECV, &o, &in));
    /* packet 1 is 1 MiB of f32 rows (a second on this path: no message completes meanwhile), 2 half that */
    producer pr = {out, 3, 1, 1024, 256, 0, 0};
    pthread_t t;
    const double t0 = now_s();
    pthread_create(&t, NULL, produce, &pr);
    int got = consume(in, pr.count, pr.rows, pr.width, NULL, NULL);
    pthread_join(t, NULL);
    const double took = now_s() - t0;
    CHECKF(got == pr.count, "slow path: %d of %d (%s)", got, pr.count, sf_net_link_error(in) ? sf_last_error() : "");
    CHECKF(took > 0.6, "slow path took %.2f s: the proxy did not slow it", took);
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);
    tcp_proxy_stop(proxy);
}

/* abort() on either half reaches the other; a one-way partition (the proxy cut and refusing
 * on the path from rank 0 to rank 1 only) fails both halves. */
static void aborts(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 1, 0, 3000));
    sf_link *out = NULL, *in = NULL;
    for (int side = 0; side < 2 && p.net[0] && p.net[1]; side++) {
        if (!link_across(&p, 0, 30 + side, &out, &in)) break;
        if (side == 0) {
            out->ops->abort(out);
            CHECK(in->ops->pop(in) == NULL);
            CHECKF(sf_net_link_error(in) == SF_E_CLOSED && strstr(sf_last_error(), "aborted by rank 0"), "receiver after the sender's abort: %s",
                   sf_last_error());
        } else {
            in->ops->abort(in);
            int rc = SF_OK;
            for (int k = 0; k < 200 && rc == SF_OK; k++) {
                rc = out->ops->push(out, numbered(1, 0, 4, 4));
                if (rc == SF_OK) usleep(5000);
            }
            CHECKF(rc == SF_E_CLOSED && strstr(sf_last_error(), "aborted by rank 1"), "sender after the receiver's abort: %d %s", rc,
                   sf_last_error());
        }
        sf_link_destroy(out);
        sf_link_destroy(in);
    }
    free_pair(&p);

    endpoints(&p, 0);
    int port = 0;
    sscanf(p.ep[1], "tcp://127.0.0.1:%d", &port);
    tcp_proxy *proxy = NULL;
    CHECK(tcp_proxy_start("127.0.0.1", port, NULL, &proxy) == 0);
    snprintf(p.via[1], sizeof p.via[1], "tcp://127.0.0.1:%d", tcp_proxy_port(proxy));
    CHECK_OK(make_net(&p, 0, 0, 1, 600, &p.net[0]));
    CHECK_OK(make_net(&p, 1, 0, 0, 600, &p.net[1]));
    CHECK_OK(sf_net_link_create(p.net[0], 1, 32, SF_NET_SEND, NULL, &out));
    CHECK_OK(sf_net_link_create(p.net[1], 0, 32, SF_NET_RECV, NULL, &in));
    CHECK_OK(out->ops->push(out, numbered(1, 0, 4, 4)));
    sf_packet_free(in->ops->pop(in));
    tcp_proxy_set_drop(proxy, 1);
    tcp_proxy_cut(proxy);
    expect_peer_failure(in, 1, 0.6 + 0.5, "rank 0 (host loopback) stopped answering", "partitioned sender");
    const double t0 = now_s();
    while (sf_net_link_error(out) == SF_OK && now_s() - t0 < 2) usleep(10000);
    CHECKF(sf_net_link_error(out) != SF_OK && strstr(sf_last_error(), "stopped answering"), "the partitioned sender learns: %s",
           sf_last_error());
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);
    tcp_proxy_stop(proxy);
}

/* Raw messages to a plaintext rank 1 posing as rank 0. */
static void send_raw(void *s, const net_env *e, const void *payload, size_t len, int corrupt_env)
{
    uint8_t env[ENV_SIZE];
    net_env_pack(e, env);
    if (corrupt_env) env[20] ^= 1;
    zmq_send(s, env, ENV_SIZE, payload ? ZMQ_SNDMORE : 0);
    if (payload) zmq_send(s, payload, len, 0);
}

static void malformed(void)
{
    for (int which = 0; which < 3; which++) {
        pair p;
        endpoints(&p, 1);
        CHECK_OK(make_net(&p, 1, 1, 0, 3000, &p.net[1]));
        sf_link *in = NULL;
        CHECK_OK(sf_net_link_create(p.net[1], 0, 6, SF_NET_RECV, NULL, &in));
        if (!in) {
            free_pair(&p);
            return;
        }
        void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
        zmq_connect(s, p.ep[1]);
        net_env hb = {MSG_HEARTBEAT, 0, 0, 0, 0, 0, 0, 0};
        send_raw(s, &hb, NULL, 0, 0);
        net_env e = {MSG_DATA, 0, 0, 6, 1, 0, 0, 0};
        uint8_t junk[100];
        memset(junk, 0xAB, sizeof junk);
        if (which == 0) send_raw(s, &e, junk, sizeof junk, 0); /* a packet that is not one */
        if (which == 1) send_raw(s, &e, junk, sizeof junk, 1); /* a corrupt envelope */
        if (which == 2) e.seq = 100, send_raw(s, &e, junk, sizeof junk, 0), e.seq = 1; /* dropped: a gap */
        if (which == 2) { /* then beyond the credit granted */
            for (uint64_t k = 1; k <= 9; k++) e.seq = k, send_raw(s, &e, junk, sizeof junk, 0);
        }
        /* the overrun is seen by the I/O thread: look before popping (a pop would grant credit) */
        for (int k = 0; which == 2 && k < 200 && sf_net_link_error(in) == SF_OK; k++) usleep(10000);
        sf_packet *x = in->ops->pop(in);
        CHECK(x == NULL);
        sf_packet_free(x);
        int rc = sf_net_link_error(in);
        static const int want[] = {SF_E_FRAME, SF_E_PEER, SF_E_PEER};
        static const char *what[] = {"malformed packet 1", "checksum", "beyond the credit"};
        CHECKF(rc == want[which] && strstr(sf_last_error(), what[which]), "malformed %d: %d (%s)", which, rc, sf_last_error());
        zmq_close(s);
        zmq_ctx_term(ctx);
        sf_link_destroy(in);
        free_pair(&p);
    }
}

/* Waits up to `limit` seconds for a packet on `in`; returns it, or NULL when none came. */
static sf_packet *pop_within(sf_link *in, double limit)
{
    const double t0 = now_s();
    while (!in->ops->ready(in) && now_s() - t0 < limit) usleep(2000);
    return in->ops->ready(in) ? in->ops->pop(in) : NULL;
}

typedef struct one_push {
    sf_link *link;
    sf_packet *packet;
    int rc, done;
} one_push;

static void *push_one(void *arg)
{
    one_push *o = arg;
    o->rc = o->link->ops->push(o->link, o->packet);
    __atomic_store_n(&o->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Lost acknowledgements must not stall a window: the receiver repeats its cumulative ACK with
 * its heartbeats (every 100 ms here). (1) The first grant reaches the sending process before
 * its sending half exists (it is dropped there). (2) Every ACK of a window of one, the one
 * that reopens it included, is discarded on the way. */
static void lost_acks(void)
{
    pair p;
    CHECK_OK(make_pair(&p, 1, 1, 3000));
    if (!p.net[0] || !p.net[1]) return free_pair(&p);
    sf_link_options o = sf_link_options_default();
    o.window_packets = 1;
    sf_link *out = NULL, *in = NULL;
    /* (1) the receiving half first; its grant arrives while rank 0 has no link to apply it to */
    CHECK_OK(sf_net_link_create(p.net[1], 0, 7, SF_NET_RECV, &o, &in));
    sf_net_peer_status st = {0};
    for (const double t0 = now_s(); now_s() - t0 < 3 && (sf_net_peer_status_get(p.net[0], 1, &st), st.silent_ms < 0);)
        usleep(2000);
    CHECKF(st.silent_ms >= 0, "rank 0 never heard from rank 1");
    usleep(250000); /* (not a whole number of heartbeats: the repeat is not due at once) */
    CHECK_OK(sf_net_link_create(p.net[0], 1, 7, SF_NET_SEND, &o, &out));
    if (!out || !in) return free_pair(&p);
    double t0 = now_s();
    CHECK_OK(out->ops->push(out, numbered(0, 0, 3, 8)));
    sf_packet *x = pop_within(in, 5), *want = numbered(0, 0, 3, 8);
    CHECKF(same(x, want), "a grant sent before the sending half existed: no packet after %.1f s", now_s() - t0);
    printf("test_net: lost first grant healed in %.3f s\n", now_s() - t0);
    const int healed = x != NULL;
    sf_packet_free(x), sf_packet_free(want);
    if (!healed) { /* the window of one is full: the next push would block forever */
        out->ops->abort(out);
        sf_link_destroy(out);
        sf_link_destroy(in);
        return free_pair(&p);
    }

    /* (2) the pop that reopens the window of one is acknowledged while every ACK is dropped */
    CHECK_OK(out->ops->push(out, numbered(1, 0, 3, 8)));
    sf_net_test_drop_acks(p.net[1], 1);
    x = pop_within(in, 5), want = numbered(1, 0, 3, 8);
    CHECK(same(x, want));
    sf_packet_free(x), sf_packet_free(want);
    usleep(300000); /* several heartbeats: their repeated ACKs are dropped too */
    sf_net_test_drop_acks(p.net[1], 0);
    one_push op = {out, numbered(2, 1, 3, 8), -1, 0};
    pthread_t t;
    pthread_create(&t, NULL, push_one, &op);
    t0 = now_s();
    while (!__atomic_load_n(&op.done, __ATOMIC_SEQ_CST) && now_s() - t0 < 5) usleep(2000);
    const int done = __atomic_load_n(&op.done, __ATOMIC_SEQ_CST);
    CHECKF(done, "the window stayed shut %.1f s after its acknowledgement was lost", now_s() - t0);
    if (done) printf("test_net: lost acknowledgement healed in %.3f s\n", now_s() - t0);
    if (!done) out->ops->abort(out); /* releases the blocked push */
    pthread_join(t, NULL);
    if (done) {
        CHECK_OK(op.rc);
        x = pop_within(in, 5), want = numbered(2, 1, 3, 8);
        CHECK(same(x, want));
        sf_packet_free(x), sf_packet_free(want);
        out->ops->close(out);
        CHECK(in->ops->pop(in) == NULL);
        CHECK_OK(sf_net_link_error(in));
    }
    sf_link_destroy(out);
    sf_link_destroy(in);
    free_pair(&p);
}

static void roundtrips(void)
{
    roundtrip(0, 0, SF_CODEC_RAW, 0);
    roundtrip(1, 0, SF_CODEC_RAW, 0);
    roundtrip(1, 1, SF_CODEC_RAW, 0);
    /* the link's shuffle reaches the wire: the same packets under zstd take fewer bytes shuffled
     * (the float rows' exponent bytes line up), and come back identical */
    const uint64_t plain = roundtrip(1, 1, SF_CODEC_ZSTD, 0), shuffled = roundtrip(1, 1, SF_CODEC_ZSTD, 1);
    CHECKF(shuffled > 0 && shuffled < plain, "zstd link: %llu packet bytes shuffled, %llu without",
           (unsigned long long)shuffled, (unsigned long long)plain);
    sf_link_options bad = sf_link_options_default();
    bad.shuffle = 2;
    pair p;
    CHECK_OK(make_pair(&p, 1, 1, 3000));
    sf_link *l = NULL;
    if (p.net[0]) CHECK(sf_net_link_create(p.net[0], 1, 6, SF_NET_SEND, &bad, &l) == SF_E_INVAL && l == NULL);
    free_pair(&p);
}

/* Arguments: names of the parts to run (default: all). */
int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*run)(void);
    } parts[] = {{"child", stopped_child},        {"roundtrip", roundtrips}, {"lossy", lossy_link},
                 {"backpressure", back_pressure}, {"curve", curve_refusals}, {"frozen", frozen_peer},
                 {"reconnect", reconnect},        {"slow", slow_path},       {"aborts", aborts},
                 {"malformed", malformed},        {"lostacks", lost_acks},   {"goodbye", goodbye},
                 {"abortleave", abort_then_leave}};
    for (int i = 0; i < 3; i++) CHECK_OK(sf_net_keypair(pub[i], sec[i]));
    alarm(120); /* a hang (a destroy waiting for an acknowledgement that never comes) fails */
    /* the child part first: the fork happens before this process has any thread */
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        int run = argc < 2;
        for (int a = 1; a < argc; a++) run |= strcmp(argv[a], parts[k].name) == 0;
        if (!run) continue;
        const double t0 = now_s();
        parts[k].run();
        printf("test_net: %s %.1f s\n", parts[k].name, now_s() - t0);
    }
    return check_finish("test_net");
}
