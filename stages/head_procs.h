/* Head ranks that are processes: a block stage whose heads are split over ranks of a
 * distributed run (`block head_ranks=1,2`; docs/HEADS.md, "Head ranks as processes")
 * rather than over threads of one process. Not a public header.
 *
 * The stage runs on the first rank listed (head rank 0, the owner): it reads the packets and
 * emits them, as any stage. Every other rank listed (a follower) runs the same stage in follower
 * mode: its input is a link from the owner carrying units of work (block_work, serialized:
 * stages/block_shard.c), and it emits nothing. The rows and the collectives go over a
 * communicator of the head ranks (kernels/comm.h; pipeline/comm_net.h over the network), as
 * they go over the host communicator between threads; on the cuda backend over an NCCL
 * communicator the stage makes at init from an id head rank 0 sends over that one (which then
 * carries only the saved states and the set-up).
 *
 * pipeline/distributed.c makes this for each such stage on each of its head ranks (the
 * communicator from the run's link factory, the owner's work links to every follower); the
 * stage finds it with sf_stage_head_procs. */
#ifndef SEQFLOW_STAGES_HEAD_PROCS_H
#define SEQFLOW_STAGES_HEAD_PROCS_H

#include "seqflow/packet.h"
#include "seqflow/stage.h"

#define SF_HEAD_PROCS_MAX 256 /* head ranks of one stage (heads_of's largest value) */

struct sf_comm;

typedef struct sf_head_procs {
    int index;        /* this process's head rank: 0 the owner, 1 .. size-1 a follower */
    int size;         /* head ranks (the stage's heads_of) */
    const int *ranks; /* [size]: the job's rank of each head rank */
    /* The head ranks' communicator (rank `index` of `size`), the graph's: the stage borrows it
     * from init to free; the graph aborts it when the process's run fails elsewhere (so that the
     * other head ranks' waits end at once, with the reason) and frees it after the stage. */
    struct sf_comm *comm;
    /* Raised (atomically, to 1) by the graph just before it aborts comm: a stage whose
     * collectives run on a communicator of its own (on GPUs: NCCL, made from an id sent over
     * comm) watches it (sf_comm_watch), so that its waits end too. */
    int stop;
    /* The owner's ends of the work links, one a follower. push hands follower k (1 .. size-1) a
     * packet, taking it also on failure; it blocks while the link's window is full, and fails
     * (the link's error: the follower died, or aborted) once the link failed. close ends every
     * work link: the followers' stages then see the end of their input. Both only while the
     * graph runs (the graph destroys the links before it frees its stages). */
    int (*push)(void *links, int k, sf_packet *p);
    void (*close)(void *links);
    void *links;
} sf_head_procs;

/* What the graph gives a block stage whose head ranks are processes: NULL in any other run
 * (one process; a stage without head_ranks=). Borrowed: lives as long as the graph. Implemented
 * by the graph (pipeline/graph.c). */
sf_head_procs *sf_stage_head_procs(const sf_stage *st);

/* head_ranks= ("R0,R1,...": ranks >= 0, each once, separated by commas) into ranks[0 .. *n),
 * at most max of them. SF_E_OPTION naming the text when it is empty, malformed, repeats a rank
 * or lists more than max. */
int sf_head_ranks_parse(const char *text, int *ranks, int max, int *n);

#endif
