/* Fuzzes a receiving process's handling of network messages (pipeline/net.c, net_link.c):
 * fuzzed messages go through net_deliver, the code every message from the ROUTER takes, into
 * an sf_net (made without sockets or I/O thread, so that runs are deterministic and ZeroMQ's
 * threads allocate nothing behind the leak checker's back) that has a receiving half
 * (channel 1) and a sending half with packets pushed (channel 2) with a plaintext peer, rank 1. After each message the receiving half is popped
 * as far as it is ready, so that accepted packets are decoded too.
 * Input: a sequence of messages, each
 *   1 byte  flags: 1 = recompute the envelope's checksum, 2 = force magic and version,
 *           4 = the payload is a valid packet (a small HIDDEN one) with byte [next] flipped
 *           when flag 8, 16 = no payload frame
 *   48 bytes envelope (missing bytes are 0), 2 bytes payload length (little-endian), payload.
 * Whatever arrives, nothing may crash or leak, a pop returns a packet or NULL, and a link's
 * error, once set, is one of the SF_E_* codes. The sf_net is made again once its peer or a
 * link failed (a failure is final). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/net_internal.h"
#include "pipeline/wire.h"
#include "seqflow/error.h"
#include "seqflow/packet.h"

#include "tests/fuzz/fuzz_support.h"

static sf_net *net;
static sf_link *in, *out;
static char bind_ep[128], peer_ep[128];
static sf_buffer valid;

static void teardown(void)
{
    sf_link_destroy(in);
    sf_link_destroy(out);
    sf_net_free(net);
    in = out = NULL, net = NULL;
}

static void setup(void)
{
    snprintf(bind_ep, sizeof bind_ep, "ipc:///nonexistent/fuzz-rank-0");
    snprintf(peer_ep, sizeof peer_ep, "ipc:///nonexistent/fuzz-rank-1");
    sf_net_peer peer = {1, peer_ep, NULL, "fuzz"};
    sf_net_options o = {0};
    o.rank = 0, o.bind = bind_ep, o.plaintext = 1, o.peers = &peer, o.n_peers = 1;
    o.heartbeat_ms = 1000, o.timeout_ms = 1 << 30, o.connect_timeout_ms = 1 << 30, o.linger_ms = 1;
    o.max_message_bytes = 1 << 20;
    FUZZ_CHECK(net_create_detached(&o, &net) == SF_OK);
    sf_link_options lo = sf_link_options_default();
    lo.window_packets = 4;
    FUZZ_CHECK(sf_net_link_create(net, 1, 1, SF_NET_RECV, &lo, &in) == SF_OK);
    FUZZ_CHECK(sf_net_link_create(net, 1, 2, SF_NET_SEND, &lo, &out) == SF_OK);
    for (int i = 0; i < 2; i++) {
        sf_packet *p = sf_packet_new(SF_PACKET_SEGMENT, 3, 0);
        p->n = 3;
        FUZZ_CHECK(out->ops->push(out, p) == SF_OK);
    }
    static int registered;
    if (!registered) registered = 1, atexit(teardown); /* the last sf_net goes before the leak check */
    if (!valid.len) {
        sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 2, 6);
        p->n = 2, p->width = 3, p->stream = 5;
        for (int i = 0; i < 6; i++) p->x[i] = (float)i;
        p->tokens[0] = 1, p->tokens[1] = 2;
        FUZZ_CHECK(sf_wire_encode(p, NULL, NULL, &valid) == SF_OK);
        sf_packet_free(p);
    }
}

static int known(int rc)
{
    return rc == SF_OK || rc == SF_E_PEER || rc == SF_E_CLOSED || rc == SF_E_FRAME || rc == SF_E_FRAME_TRUNCATED ||
           rc == SF_E_FRAME_VERSION || rc == SF_E_FRAME_TOO_LARGE || rc == SF_E_NOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!net) setup();
    size_t at = 0;
    for (int count = 0; count < 16 && at < size; count++) {
        const uint8_t flags = data[at++];
        uint8_t env[ENV_SIZE] = {0};
        size_t take = size - at < ENV_SIZE ? size - at : ENV_SIZE;
        memcpy(env, data + at, take);
        at += take;
        size_t len = 0;
        if (at + 2 <= size) len = (size_t)data[at] | (size_t)data[at + 1] << 8, at += 2;
        if (len > size - at) len = size - at;
        const uint8_t *body = data + at;
        at += len;
        if (flags & 2) memcpy(env, ENV_MAGIC, 4), env[4] = ENV_VERSION;
        if (flags & 1) {
            uint32_t c = sf_crc32c(0, env, 44);
            for (int i = 0; i < 4; i++) env[44 + i] = (uint8_t)(c >> (8 * i));
        }
        zmq_msg_t payload;
        const int has_payload = !(flags & 16);
        if (flags & 4) {
            zmq_msg_init_size(&payload, valid.len);
            memcpy(zmq_msg_data(&payload), valid.data, valid.len);
            if ((flags & 8) && len) ((uint8_t *)zmq_msg_data(&payload))[body[0] % valid.len] ^= (uint8_t)(len | 1);
        } else {
            zmq_msg_init_size(&payload, len);
            if (len) memcpy(zmq_msg_data(&payload), body, len);
        }
        pthread_mutex_lock(&net->lock);
        net_deliver(net, -1, "fuzz", 4, env, ENV_SIZE, &payload, has_payload, 0);
        pthread_mutex_unlock(&net->lock);
        zmq_msg_close(&payload);
        while (in->ops->ready(in)) {
            sf_packet *p = in->ops->pop(in);
            if (!p) break;
            FUZZ_CHECK(p->n <= (1 << 20));
            sf_packet_free(p);
        }
    }
    const int rin = sf_net_link_error(in), rout = sf_net_link_error(out);
    FUZZ_CHECK(known(rin) && known(rout));
    sf_net_peer_status st;
    FUZZ_CHECK(sf_net_peer_status_get(net, 1, &st) == SF_OK);
    if (rin != SF_OK || rout != SF_OK || st.failed) teardown();
    return 0;
}
