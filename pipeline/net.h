/* The network transport: links (pipeline/link.h) whose two halves live in different processes,
 * over ZeroMQ (libzmq). One sf_net per process owns a ZeroMQ context and one background I/O
 * thread, which owns every socket:
 *   - a ROUTER bound on this process's endpoint (options.bind): everything that arrives;
 *   - two DEALERs per peer, connected to the peer's endpoint: everything this process sends,
 *     packets on one, heartbeats, acknowledgements with credit and aborts on the other (so
 *     that these never wait behind megabytes of packets on a slow path);
 *   - a ZAP handler (inproc://zeromq.zap.01) admitting only the peers' CURVE public keys.
 * Stage threads never touch a socket: a link's push encodes the packet (pipeline/wire.h) on
 * the calling thread and hands it to the I/O thread through the link's bounded window; pop
 * decodes on the calling thread. The protocol (sequence numbers, acknowledgements, credit,
 * heartbeats, CURVE/ZAP) is described in docs/DISTRIBUTED.md, section "Links".
 *
 * Guarantees:
 *   - in order, nothing lost or duplicated across reconnects (a TCP reset): the sender keeps
 *     every packet until the receiver acknowledged it and resends after a reconnect; the
 *     receiver drops what it already has by sequence number;
 *   - bounded memory: a sending half holds at most window_packets packets / window_bytes bytes
 *     not yet consumed by the receiving stage (push blocks beyond that), a receiving half at
 *     most its window; ZeroMQ's own queues are capped (high-water marks);
 *   - a lost acknowledgement never stalls a window: receivers repeat their (cumulative) ACKs
 *     with every heartbeat, so one is late by at most heartbeat_ms;
 *   - a peer that stays silent for timeout_ms (dead, stopped, partitioned), or is never reached
 *     within connect_timeout_ms, or refuses our key, aborts every link to and from it with
 *     SF_E_PEER and a message naming its rank, host and how long it was silent (the peer is
 *     told too, best effort, so that a one-way partition stops both sides); a failed peer stays
 *     failed for the life of the sf_net;
 *   - anything malformed, forged or corrupt from the network aborts the link concerned with an
 *     SF_E_* code (SF_E_PEER for the protocol, SF_E_FRAME* for a packet's bytes), never a crash.
 *
 * Threads: sf_net_create/free from one thread; sf_net_link_create/sf_link_destroy from any
 * thread (under the sf_net's lock; each half destroyed once, by one thread); a sending half's
 * push/close and sf_net_link_wait from one thread; a receiving half's pop/ready and
 * sf_net_link_wait from one thread; the two halves' abort, sf_net_link_abort_why,
 * sf_net_link_error, sf_net_progress and sf_net_peer_status from any thread. */
#ifndef SEQFLOW_PIPELINE_NET_H
#define SEQFLOW_PIPELINE_NET_H

#include <stddef.h>
#include <stdint.h>

#include "compress/frame.h"
#include "compress/quantize.h"
#include "pipeline/link.h"

typedef struct sf_net sf_net; /* one per process: a ZeroMQ context, one I/O thread */

typedef struct sf_net_peer {   /* what a process knows about one rank */
    int rank;
    const char *endpoint;      /* "tcp://host:port" or "ipc:///path": where we connect to it */
    const char *public_key;    /* Z85, 40 characters; NULL when plaintext */
    const char *host;          /* for messages (NULL: taken from the endpoint) */
} sf_net_peer;

typedef struct sf_net_options {
    int rank;                  /* this process (0 .. 2^31-1) */
    const char *bind;          /* this process's endpoint, where its ROUTER binds (its peers[] entry) */
    const char *secret_key, *public_key; /* this process's CURVE keys (Z85); NULL only with plaintext */
    int plaintext;             /* 1 only where the topology says so: no CURVE; the ZAP handler then
                                  admits NULL-mechanism connections from the peers' addresses
                                  (loopback and ipc included) and nothing else */
    const sf_net_peer *peers; int n_peers; /* every other rank it may talk to (keys allowed by ZAP);
                                  copied by sf_net_create */
    int heartbeat_ms;          /* application and ZMTP heartbeat interval; 0 = default 500 */
    int timeout_ms;            /* a peer silent this long is dead; 0 = default 3000 */
    int connect_timeout_ms;    /* a peer never reached this long is dead; 0 = default 10000 */
    int linger_ms;             /* ZMQ_LINGER: how long sf_net_free may wait; 0 = default 1000 */
    size_t max_message_bytes;  /* largest message accepted (ZMQ_MAXMSGSIZE, and the decoder's
                                  limit on a packet's decoded bytes); 0 = default 1 GiB */
} sf_net_options;

typedef struct sf_link_options { /* one link's encoding and flow control (both halves should agree) */
    sf_codec codec; int level;   /* compress/frame.h; default raw */
    sf_quant_kind quant; int group; /* rows' quantization; default f32 = lossless; group 0 = the
                                     row width */
    int shuffle;                 /* 1 = byte-shuffle before LZ4/zstd (sf_wire_options.shuffle);
                                    0 = off (the default); only the sending half uses it */
    int error_feedback;          /* lossy quantization only: carry each stream's rounding error
                                    into its next packet of the same size; 0 or 1 = on (the
                                    default), -1 = off */
    int window_packets;          /* credit window in packets; 0 = default 8 */
    size_t window_bytes;         /* credit window in encoded bytes; 0 = default 256 MiB (a
                                    single larger packet still passes, alone) */
} sf_link_options;

/* Defaults: raw codec, f32 (lossless), no shuffle, error feedback on, 8 packets, 256 MiB. */
sf_link_options sf_link_options_default(void);

/* Creates the context, binds the ROUTER (failing with SF_E_IO naming the endpoint), starts the
 * ZAP handler and the I/O thread. Peers are connected when the first link to or from them is
 * made (or when they first send). SF_E_INVAL for missing keys without plaintext or bad keys. */
int sf_net_create(const sf_net_options *o, sf_net **out);
/* Stops the I/O thread and closes every socket (waits at most linger_ms for unsent bytes).
 * Every link must have been destroyed first. NULL accepted. */
void sf_net_free(sf_net *n);

enum { SF_NET_SEND = 1, SF_NET_RECV = 2 };

/* A link half. SF_NET_SEND: push/close/abort send to `peer`'s `channel` (pop/ready are not
 * for it: pop returns NULL, ready 1). SF_NET_RECV: pop/ready deliver what `peer` sends on
 * `channel` (push is refused with SF_E_INVAL). At most one half per (peer, channel, direction).
 * o NULL = defaults. Owned by the caller (sf_link_destroy), destroyed before sf_net_free.
 * Destroying a closed sending half waits until the peer acknowledged everything (or the link
 * failed: a dead peer is detected within timeout_ms); destroying a half neither closed nor
 * drained aborts it (the peer sees the abort).
 * End and failure: pop returns NULL after a close() of the sending half once everything before
 * it was popped (sf_net_link_error then SF_OK), or at once when the link failed: aborted by
 * either side, a dead peer, a malformed message (sf_net_link_error says which). A sending
 * half's push returns that error (SF_E_CLOSED when aborted by the peer). */
int sf_net_link_create(sf_net *n, int peer, uint32_t channel, int direction,
                       const sf_link_options *o, sf_link **out);

/* SF_OK while the link is healthy or ended normally; otherwise its error code, and the
 * message (naming the peer and the cause) is set as this thread's sf_last_error(). For links
 * made by sf_net_link_create only. */
int sf_net_link_error(sf_link *l);

/* Bounded waits, for callers that must never block for ever (the network communicator,
 * pipeline/comm_net.h). `stop` (NULL: none) is a flag looked at every 20 ms while waiting
 * (read with __atomic_load_n): non-zero ends the wait as a timeout does.
 *
 * push on a sending half whose wait for credit lasts at most timeout_ms (>= 0): when the time
 * runs out, or *stop is set, the packet was already encoded (a lossy stream's residual took its
 * rounding), so the half is aborted (the peer sees it) and SF_E_CLOSED returned with a message
 * saying so. Otherwise as push. Takes ownership of p. */
int sf_net_link_push_within(sf_link *l, sf_packet *p, int timeout_ms, const int *stop);
/* Waits at most timeout_ms (0: only looks) until a receiving half's pop would return at once (a
 * packet waits, the end came, or the half failed), or a sending half holds nothing
 * unacknowledged (everything pushed, and the end after a close, reached the peer) or failed.
 * 1 when so, 0 when the time ran out or *stop was set. Any link (1 for one not made by
 * sf_net_link_create). */
int sf_net_link_wait(sf_link *l, int timeout_ms, const int *stop);
/* abort() with a reason: the half fails with SF_E_CLOSED and the peer's half with "aborted by
 * rank R: ... why" (at most 200 bytes of it travel). Any thread. */
void sf_net_link_abort_why(sf_link *l, const char *why);

/* The counter this process reports in its heartbeats (e.g. segments done). */
void sf_net_progress(sf_net *n, uint64_t count);

typedef struct sf_net_peer_status {
    int active;           /* a link to or from it exists or existed, or it sent something */
    int connected;        /* our connection to it completed its handshake and is up */
    int failed;           /* SF_E_PEER recorded for it (its links are aborted) */
    int left;             /* it said goodbye (its process closed its network): silence since
                             is not held against it */
    uint64_t progress;    /* the counter of its last heartbeat */
    int64_t silent_ms;    /* since anything was last heard from it (-1: never) */
} sf_net_peer_status;
/* What this process knows of `peer`; SF_E_INVAL for a rank not in peers[]. */
int sf_net_peer_status_get(sf_net *n, int peer, sf_net_peer_status *out);

typedef struct sf_net_stats {      /* what this process's sf_net moved, since sf_net_create */
    uint64_t packets_sent;         /* DATA messages handed to ZeroMQ (resends included) */
    uint64_t packet_bytes_sent;    /* their packets' encoded bytes (pipeline/wire.h) */
    uint64_t packets_received;     /* DATA messages that arrived (duplicates included) */
    uint64_t packet_bytes_received;
    uint64_t bytes_sent, bytes_received; /* every message, envelopes and control traffic
                                      included (not ZeroMQ's framing, CURVE or TCP) */
} sf_net_stats;
/* The counters so far; any thread. */
void sf_net_stats_get(sf_net *n, sf_net_stats *out);

/* A fresh CURVE key pair, Z85 text (40 characters + NUL each). SF_E_UNSUPPORTED when libzmq
 * was built without CURVE. */
int sf_net_keypair(char public_key[41], char secret_key[41]);

/* Tests only: while frozen the I/O thread stops doing anything (no heartbeats, no traffic),
 * as if the process were stopped, while ZeroMQ's own threads keep the connections up. */
void sf_net_test_freeze(sf_net *n, int frozen);

/* Tests only: while on, every acknowledgement this process would send is discarded as if it
 * had been sent (a lost ACK); the periodic refresh (docs/DISTRIBUTED.md, "Credit") must heal
 * the window once it is off again. */
void sf_net_test_drop_acks(sf_net *n, int on);

#endif
