/* Distributed runs: one graph spread over several processes ("ranks"), each running only its
 * own stages (docs/DISTRIBUTED.md, "Distributed runs").
 *
 * Every rank parses the same pipeline into a graph of its own; a placement per stage says
 * where it runs: one rank (`@R`; no suffix is rank 0, the driver) or several (`@R1,R2,...`:
 * the stage is replicated, stream-parallel). sf_dist_build then marks the other ranks' stages
 * remote (never initialized here, no thread) and makes this rank's links:
 *  - between two stages of this rank: a queue link, as in a single-process run;
 *  - between stages of different ranks: a sending half on the producer's rank and a receiving
 *    half on the consumer's, from the caller's link factory (the network: pipeline/net.h; in
 *    one process: sf_dist_exchange below). Channel = index of the consuming stage;
 *  - into a replicated group (a run of consecutive stages with the same set of ranks): a
 *    ROUTER link on the upstream rank. Each stream goes to one replica, chosen when its first
 *    packet comes: the replica with the fewest open streams, ties to the lowest rank (so the
 *    choice is the same in every run). Checkpoint markers go to every replica;
 *  - out of the group: a MERGER link on the downstream rank, which must be the router's (they
 *    share the record of which replica got each packet), pops from the replicas in exactly the
 *    order the router pushed. So the packets leave the group in the order they entered it and
 *    the output is the single-process one, byte for byte. The merger joins the replicas'
 *    markers into one.
 * A replicated stage must emit exactly one packet per packet in: embed, block (batch=1) and
 * norm qualify; others are refused. The first and the last stage (source, sink) run on rank 0.
 *
 * Head ranks as processes (`block head_ranks=R0,R1,...`, stages/head_procs.h): the stage runs on
 * R0 (its placement, which the text may omit, must be @R0) and in follower mode on R1, ...: each
 * follower's input is a work link from R0 (channel 0x48000000 + the stage's index), and the
 * head ranks share a communicator from the factory's comm (channels 0x49000000 + 4 x the
 * index). A follower's stage state is saved and restored by R0 (it gathers every head rank's).
 *
 * Checkpoints: the marker crosses the ranks with the states gathered so far; the driver's last
 * stage writes it (pipeline/checkpointing.c). Its state is the single-process layout
 * (sf_graph_save) with two more kinds of entries at the index of a group's first stage:
 * "@router" (the stream -> replica table: u32 count, then per stream u64 id, u32 replica slot)
 * and "@group" (u32 replicas, then per replica u32 rank, u64 length, that replica's entries).
 * On resume the driver loads the checkpoint (sf_dist_checkpoint_load), cuts each rank's share
 * (sf_dist_rank_state) and hands it over (the rendezvous); each worker restores it after init
 * (sf_dist_set_state). */
#ifndef SEQFLOW_PIPELINE_DISTRIBUTED_H
#define SEQFLOW_PIPELINE_DISTRIBUTED_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/buffer.h"
#include "seqflow/graph.h"
#include "pipeline/link.h"

#define SF_DIST_MAX_RANKS 1024   /* ranks of one job */
#define SF_DIST_MAX_REPLICAS 64  /* ranks of one replicated group */

/* Where a stage runs: n ranks (n > 1: replicated over them), sorted. */
typedef struct sf_dist_placement {
    int n;
    int ranks[SF_DIST_MAX_REPLICAS];
} sf_dist_placement;

enum { SF_DIST_SEND = 1, SF_DIST_RECV = 2 };

/* Makes the halves of links between ranks. create(user, peer, channel, direction, out):
 * SF_DIST_SEND: *out's push/close/abort deliver to rank `peer` on `channel`; SF_DIST_RECV:
 * *out's pop/ready/status give what `peer` sends on `channel`. The graph owns *out (destroyed
 * by sf_graph_free, which must come before whatever the factory's links depend on). */
struct sf_comm;
typedef struct sf_dist_links {
    int (*create)(void *user, int peer, uint32_t channel, int direction, sf_link **out);
    void *user;
    /* Optional (NULL: head_ranks= is refused): the communicator (kernels/comm.h) of a block's
     * head ranks that are processes (stages/head_procs.h): its rank r is the job's rank
     * ranks[r] (n of them), this process is rank `index`; channels channel_base ..
     * channel_base + 2 are its own; timeout_ms bounds every wait. *out is the caller's (the
     * stage takes it). Called by sf_dist_connect on every head rank of such a stage. */
    int (*comm)(void *user, const int *ranks, int n, int index, uint32_t channel_base, int timeout_ms,
                struct sf_comm **out);
} sf_dist_links;

/* Makes g (parsed, not started) this rank's part of the job: each stage where its placement
 * says (sf_stage_placement: the pipeline text's suffix), `world` ranks, this process `rank`,
 * cross-rank links from `links`.
 * Refuses (SF_E_PARSE, naming the stage) a rank outside 0..world-1, a source or sink off rank
 * 0, a replicated stage that may emit more or fewer packets than it takes, two adjacent groups,
 * and a group whose upstream and downstream stages are on different ranks. Call before
 * sf_graph_set_checkpoint's run (sf_graph_run), once. */
int sf_dist_build(sf_graph *g, int world, int rank, const sf_dist_links *links);
/* sf_dist_build in two steps: the plan (the checks, which stages are local: enough for
 * sf_dist_checkpoint_load and sf_dist_rank_state), then the links (once the peers are known). */
int sf_dist_plan(sf_graph *g, int world, int rank);
int sf_dist_connect(sf_graph *g, const sf_dist_links *links);
/* Non-zero when rank `peer` runs at least one stage of the planned graph g. */
int sf_dist_peer_used(const sf_graph *g, int peer);

/* Non-zero when stage i runs on this rank (also for graphs that are not distributed). */
int sf_dist_is_local(const sf_graph *g, int i);

/* Driver, with sf_graph_set_checkpoint(resume) set: loads the newest checkpoint now (before the
 * workers start) and points *data, *len at its state (owned by the graph, valid until the run
 * restores it); *data NULL when there is none (a fresh start). */
int sf_dist_checkpoint_load(sf_graph *g, const uint8_t **data, size_t *len);
/* The share of a checkpoint's state (data, len: every rank's) that `rank` restores, appended
 * to out (possibly nothing). g: any rank's built graph. */
int sf_dist_rank_state(const sf_graph *g, const uint8_t *data, size_t len, int rank, sf_buffer *out);
/* Worker: the share this rank restores after init (copied); before sf_graph_run. */
int sf_dist_set_state(sf_graph *g, const uint8_t *data, size_t len);

/* The last committed segment that left the driver's last stage (the output) and its stream:
 * 1 with them set, 0 when none has. Thread-safe; for the message of a failed run. */
int sf_dist_last_committed(const sf_graph *g, uint64_t *stream, uint64_t *segment);

/* An in-process exchange: links between "ranks" that are graphs of one process (tests, and a
 * placed pipeline run in one process). Each (sender, receiver, channel) is one queue of
 * `depth` packets shared by its two halves. An abort on either side aborts the queue; the
 * other side's status then reports the peer's failure. Head ranks (head_ranks=) share the host
 * communicator (threads of one process). Free after every graph that used it. */
typedef struct sf_dist_exchange sf_dist_exchange;
int sf_dist_exchange_create(int world, int depth, sf_dist_exchange **out);
void sf_dist_exchange_free(sf_dist_exchange *x);
/* The link factory of rank `rank` (borrowed from x). */
sf_dist_links sf_dist_exchange_links(sf_dist_exchange *x, int rank);
/* Fault injection for tests: the push after `packets` packets on the channel from `sender`
 * fails (SF_E_IO "injected failure") and aborts that link, as a dead process would. */
void sf_dist_exchange_fail_after(sf_dist_exchange *x, int sender, uint32_t channel, uint64_t packets);

#endif
