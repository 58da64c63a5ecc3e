/* Links carry packets from one stage to the next. The default is a bounded in-process queue
 * with blocking back-pressure; a network transport (pipeline/net.h), the router and merger of
 * a stream-parallel group (pipeline/distributed.h) implement the same calls. */
#ifndef SEQFLOW_PIPELINE_LINK_H
#define SEQFLOW_PIPELINE_LINK_H

#include "seqflow/packet.h"

typedef struct sf_link sf_link;

typedef struct sf_link_ops {
    /* Blocks while full. Takes ownership of p; SF_E_CLOSED once aborted. */
    int (*push)(sf_link *l, sf_packet *p);
    /* Blocks while empty. Returns NULL at the end (closed and drained, or aborted). */
    sf_packet *(*pop)(sf_link *l);
    /* Non-zero when pop would return at once (a packet waits, or the end is reached). */
    int (*ready)(sf_link *l);
    /* The producer is done: pop drains what is left, then returns NULL. */
    void (*close)(sf_link *l);
    /* Tear down now: pending packets are dropped, push fails, pop returns NULL. */
    void (*abort)(sf_link *l);
    void (*destroy)(sf_link *l);
    /* Why pop returned NULL: SF_OK for a clean end (the producer closed the link), else the
     * error that aborted it, its message set with sf_error on the calling thread (a network
     * half: the peer died or went silent, SF_E_PEER; an abort from this side: SF_E_CLOSED).
     * The scheduler asks after every NULL pop, so that a link cut short never passes for the
     * end of the input. May be NULL: every end is clean. */
    int (*status)(sf_link *l);
} sf_link_ops;

struct sf_link {
    const sf_link_ops *ops;
};

/* A bounded queue of `depth` packets (depth >= 1). NULL when out of memory. */
sf_link *sf_queue_link_create(int depth);

static inline void sf_link_destroy(sf_link *l)
{
    if (l) l->ops->destroy(l);
}

#endif
