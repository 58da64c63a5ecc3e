/* A communicator (kernels/comm.h) whose ranks are processes joined by network links
 * (pipeline/net.h): for the state exchanges of sequence parallelism (memory maps, global-token
 * summaries, hand-offs) between ranks that may sit in different datacenters, over links that
 * may be lossy (quantized with error feedback).
 *
 * Ranks: the sf_net's ranks. Rank r's communicator lives in the process whose sf_net has rank
 * r, and every other rank 0 .. size-1 must be one of that sf_net's peers.
 *
 * Links: made on first use, per peer, so that a rank connects only to the peers it talks to.
 * Each use of a peer makes a pair of halves (send + receive) on one channel:
 *   channel_base     "data":  the options the callback gives for that peer (lossless f32 by
 *                             default; e.g. int8 + lz4 with error feedback across datacenters);
 *   channel_base + 1 "exact": the same codec, level and window, quantization f32 (lossless);
 *   channel_base + 2 "coll":  likewise lossless, for the collectives alone, so that they never
 *                             mix with point-to-point messages (as in the host communicator).
 * The graph's links use small channels (stage indices): pass a high base, e.g. 0x5E000000,
 * and a distinct one for each communicator on the same sf_net, one made after another was
 * freed included (a late control message of the old links would reach the new ones).
 *
 * Messages: each is one packet (seqflow/packet.h) of kind HIDDEN, one row of `count` values
 * (float32 or bf16), whose stream is the message's tag and whose segment numbers the messages
 * of each (peer, link) from 1, checked by the receiver.
 *   - send/recv: the data link, tag 0.
 *   - send_tagged/recv_tagged (sf_comm_send_tagged): exact == 0 the data link, exact != 0 the
 *     exact one. A lossy data link keeps its error feedback per tag: the rounding of one
 *     message is carried into the next message of the same tag and the same count (a message
 *     of another count starts afresh), so the running sum of what one tag delivered stays
 *     within one message's rounding of the sum of what was sent. Each tag used holds one
 *     residual of `count` floats on the sending side for the life of the communicator. bf16
 *     values travel as their bit patterns, never quantized: lossless on every link. On a lossy
 *     data link every value must be finite (SF_E_INVAL otherwise, nothing sent).
 *   - probe (sf_comm_probe): whether the next message from a peer on a link has arrived (the
 *     receiving half's sf_net_link_wait with no wait; a failed communicator answers 1, so that
 *     the receive reports it).
 *   - Order is per (peer, link): a receiver takes the messages of one peer on one link in the
 *     order they were sent; exact and inexact messages (and collectives) are independent.
 *     (Code meant for any communicator keeps one order per peer: the host and NCCL ones fall
 *     back to plain send/recv, in one order.)
 *   - A send does not wait for the receiver unless window_packets messages to that peer on
 *     that link are still untaken (then at most timeout_ms, after which the communicator
 *     fails): two ranks may send to each other first and receive after.
 * Collectives (all_reduce, all_gather, broadcast) are sends and receives on the coll links:
 * all_reduce and all_gather gather at rank 0, which sums in rank order 0, 1, ..., R-1 (bf16: in
 * float32, rounded once, as the host communicator does) and sends the result to every rank;
 * broadcast sends from the root to each rank. The results are bit-identical on every rank,
 * whatever the data links' encoding. Every rank calls the same collectives in the same order
 * with the same counts (a mismatch fails with SF_E_COMM naming both). all_reduce_start does
 * the reduction at once (join does nothing); group_begin/group_end, wait and fence do nothing.
 *
 * Errors and failures (SF_E_COMM, "<op> on rank R of S ...: <cause>"): a receive waits at most
 * timeout_ms ("nothing from rank 2 within 2000 ms"); ends early when the link fails (the net's
 * message follows: a peer dead or silent, "rank 2 (host h) stopped answering ...", which also
 * sets the communicator's lost_peer, or aborted, "aborted by rank 2: ..."), when the peer closed its communicator, when the watched flag
 * (sf_comm_watch) becomes non-zero, or after sf_comm_abort. A message out of order, of another
 * count or type, or of another collective fails too. The first failure aborts every link of
 * the communicator, so that the peers' waits end at once with this rank's reason, and every
 * later operation fails at once repeating it. A bad argument is SF_E_INVAL and fails nothing.
 *
 * Ownership and threads: the communicator borrows the sf_net, which must outlive it
 * (sf_comm_free before sf_net_free). Buffers are host memory (be is NULL). One thread uses a
 * communicator (the one that frees it); sf_comm_abort may come from any thread until
 * sf_comm_free begins. Other users of the sf_net (the graph's links) may go on meanwhile; a
 * peer declared dead by the sf_net fails them and this communicator alike. sf_comm_free
 * closes the sending halves and waits, at most timeout_ms in all, until the peers acknowledged
 * everything (a dead peer ends that wait within the net's timeout), aborts what is left and
 * destroys every half: it never hangs. */
#ifndef SEQFLOW_PIPELINE_COMM_NET_H
#define SEQFLOW_PIPELINE_COMM_NET_H

#include <stdint.h>

#include "kernels/comm.h"
#include "pipeline/net.h"

/* The data link's options for `peer` (its sf_net rank) into *out, which holds sf_link_options_default() on
 * entry (set only what differs; the exact and coll links take its codec, level and window).
 * SF_OK or an SF_E_* code with its message (the operation that needed the link then fails
 * with SF_E_COMM quoting it). Called on the communicator's thread each time a pair of links
 * to peer is made (at most three times a peer). */
typedef int (*sf_comm_net_options_fn)(void *user, int peer, sf_link_options *out);

/* Rank `rank` of `size` over net (whose own rank is `rank`; ranks 0 .. size-1 but this one
 * must be its peers): links on channels channel_base .. channel_base + 2 (see above), the data
 * links' options from options(user, peer) (NULL: the defaults, lossless). timeout_ms (> 0): how
 * long a receive, or a send waiting for credit, may wait. *out is the caller's (sf_comm_free).
 * SF_E_INVAL for bad arguments (a rank that is not a peer of net, a channel_base above
 * UINT32_MAX - 2), SF_E_NOMEM. Makes no link. */
int sf_comm_net_create(sf_net *net, int rank, int size, uint32_t channel_base, sf_comm_net_options_fn options,
                       void *user, int timeout_ms, sf_comm **out);

/* The same over some of the net's ranks (head-parallel blocks whose ranks are processes of a
 * distributed run: stages/head_procs.h): the communicator's rank r is the process whose sf_net
 * has rank ranks[r] (ranks: `size` distinct sf_net ranks, copied), this one is rank `rank` (so
 * ranks[rank] is net's own rank and every other one a peer of net). Messages name the
 * communicator's ranks; a dead peer's, from the net, names its sf_net rank. */
int sf_comm_net_create_group(sf_net *net, const int *ranks, int size, int rank, uint32_t channel_base,
                             sf_comm_net_options_fn options, void *user, int timeout_ms, sf_comm **out);

#endif
