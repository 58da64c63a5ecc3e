/* What net.c (the context, the I/O thread, peers, ZAP) and net_link.c (the link halves and
 * their protocol) share. Not installed; pipeline/net.h is the interface.
 *
 * Locking: one mutex per sf_net (lock) guards every field below that both the I/O thread and
 * stage threads touch: peers' status, the link list, every link's state. Sockets belong to
 * the I/O thread alone. Stage threads wait on their link's condition variable (with lock) and
 * wake the I/O thread through an eventfd. */
#ifndef SEQFLOW_PIPELINE_NET_INTERNAL_H
#define SEQFLOW_PIPELINE_NET_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <zmq.h>

#include "pipeline/net.h"
#include "pipeline/wire.h"

/* The envelope: the first frame of every message (little-endian, ENV_SIZE bytes).
 *   0 4 magic "SFN1"   4 1 version   5 1 type   6 2 flags (ENV_NACK)   8 4 sender's rank
 *  12 4 channel       16 8 seq      24 8 a      32 8 b      40 4 c      44 4 CRC-32C of [0,44) */
#define ENV_SIZE 48
#define ENV_MAGIC "SFN1"
#define ENV_VERSION 1
enum {
    MSG_DATA = 1,          /* seq; second frame: the packet (pipeline/wire.h) */
    MSG_END = 2,           /* seq: the sending half was closed after seq - 1 */
    MSG_ACK = 3,           /* seq = all up to it received; a = popped, b = popped bytes, c = window */
    MSG_HEARTBEAT = 4,     /* a = the sender's progress counter */
    MSG_ABORT_TO_RECV = 5, /* from a sending half; a = its error code; optional text frame */
    MSG_ABORT_TO_SEND = 6, /* from a receiving half; likewise */
    MSG_BYE = 7            /* the sender's network is closing: its silence from now on is no failure */
};
enum { ENV_NACK = 1 }; /* ACK: the receiver dropped seq + 1 .. for a gap: please go back */
#define ABORT_TEXT_MAX 200

typedef struct net_env {
    int type, flags;
    uint32_t rank, channel;
    uint64_t seq, a, b;
    uint32_t c;
} net_env;

void net_env_pack(const net_env *e, uint8_t out[ENV_SIZE]);
/* SF_OK or SF_E_PEER naming what is wrong. */
int net_env_parse(const uint8_t *buf, size_t len, net_env *e);

typedef struct net_peer {
    int rank;
    char *endpoint, *host;
    char public_key[41];
    uint8_t key_bin[32];
    int has_key;
    /* Two connections to it (I/O thread only): DATA carries packets and end-of-stream (in
     * sequence), CONTROL carries heartbeats, acknowledgements and aborts, so that these never
     * wait behind megabytes of packets queued for a slow path */
    void *dealer[2], *monitor[2];
    int blocked[2];            /* that dealer refused a send (EAGAIN): wait for POLLOUT */
    int up[2];                 /* that connection's handshake completed and it is up */
    int handshakes[2];         /* handshakes completed on that dealer (I/O thread only) */
    int64_t next_heartbeat_ms; /* I/O */
    /* under lock */
    int want_active, active, connected, ever_connected, failed;
    int left;                            /* it said BYE (a new process of that rank clears it) */
    int64_t activated_ms, last_heard_ms; /* -1: never */
    uint64_t progress;
    uint8_t rid[16];           /* ROUTER routing id of its last valid message (plaintext: who sent
                                  a message too broken to say) */
    size_t rid_len;
} net_peer;

typedef struct net_ctrl { /* a control message that outlives its link: an abort, a last ACK */
    struct net_ctrl *next;
    int peer;
    net_env e;
    char text[ABORT_TEXT_MAX]; /* aborts: the reason, sent as a second frame */
} net_ctrl;

typedef struct net_link net_link;

struct sf_net {
    sf_net_options o;
    net_peer *peers;
    int n_peers;
    char *bind;
    uint8_t secret_bin[32];
    char **allowed_addr; int n_allowed; /* plaintext: peers' addresses */
    void *ctx, *router, *zap;
    int wake_fd;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    int stop, frozen;
    int drop_acks; /* sf_net_test_drop_acks */
    net_link *links;
    net_ctrl *ctrl, **ctrl_tail;
    uint64_t progress;
    sf_net_stats stats;         /* under lock */
    size_t max_bytes;
    zmq_pollitem_t *poll_items; /* the I/O thread's */
    int *poll_peer;
};

int64_t net_now_ms(void);
void net_wake(sf_net *n);
/* Under lock: queue an abort message for a peer. */
void net_queue_abort(sf_net *n, int peer, int type, uint32_t channel, int code, const char *text);
/* Under lock: queue an ACK for a peer (a receiving half's last, sent after it is gone). */
void net_queue_ack(sf_net *n, int peer, const net_env *e);
/* Under lock: every link to/from peer fails with code and message. */
void net_fail_peer(sf_net *n, int peer, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
enum { NET_DATA = 0, NET_CONTROL = 1 };
/* Under lock (it counts into stats): sends one message on the peer's dealer `which` without
 * waiting: 0 sent, 1 would block, <0 error. payload may be NULL; it is moved (zmq_msg_send)
 * when sent. */
int net_send(sf_net *n, net_peer *p, int which, const net_env *e, zmq_msg_t *payload);

/* Under lock: one message that arrived on the ROUTER (routing id, envelope, optional payload,
 * extra = it had more parts than any message has; authenticated = the rank of its CURVE key,
 * -1 without CURVE). Validates, attributes and dispatches it; what is wrong fails the peer or
 * the link. Also the entry point of the fuzz target for a receiver's message handling. */
void net_deliver(sf_net *n, int authenticated, const void *rid, size_t rid_len, const void *env, size_t env_len,
                 zmq_msg_t *payload, int has_payload, int extra);

/* An sf_net with its peers and links but no sockets and no I/O thread: messages reach it only
 * through net_deliver and nothing is sent (for the fuzz target). Free with sf_net_free. */
int net_create_detached(const sf_net_options *o, sf_net **out);

/* net_link.c, for the I/O thread (under lock). */
void net_link_on_message(sf_net *n, int peer, const net_env *e, zmq_msg_t *payload, int has_payload);
/* Sends what the peer's links have ready (acknowledgements on CONTROL, packets on DATA). */
void net_link_flush(sf_net *n, int peer);
/* After connection `which` to the peer (re)connected: resend what it may have lost. */
void net_link_rewind(sf_net *n, int peer, int which);
/* Marks every live receiving half from that peer to send its ACK again (with each heartbeat):
 * ACKs are cumulative, so repeating one is harmless, and a lost one cannot stall a window. */
void net_link_refresh(sf_net *n, int peer);
/* Fails one link (first failure wins); tell = also send an abort to the peer. */
void net_link_fail(net_link *l, int code, int tell, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
int net_link_peer(const net_link *l);
int net_link_direction(const net_link *l);
uint32_t net_link_channel(const net_link *l);
net_link *net_link_next(const net_link *l);
/* Neither failed nor at its end (send: closed and all acknowledged; receive: END arrived). */
int net_link_unfinished(const net_link *l);

#endif
