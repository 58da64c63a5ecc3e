/* The links around a stream-parallel group (pipeline/distributed.h): a ROUTER on the upstream
 * rank sends each stream to one replica, a MERGER on the downstream rank (the same process)
 * gives the replicas' packets back in the order the router took them. They share a record of
 * which replica got each packet (the "order"), so the merger never guesses. */
#ifndef SEQFLOW_PIPELINE_ROUTE_LINK_H
#define SEQFLOW_PIPELINE_ROUTE_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/buffer.h"
#include "pipeline/link.h"

typedef struct sf_route_order sf_route_order;

/* The shared record, referenced by one router and one merger (each releases it on destroy;
 * a caller that ends up creating only one of them releases the other reference). */
sf_route_order *sf_route_order_create(void);
void sf_route_order_release(sf_route_order *order);

/* A router over k sending links subs[0..k) (taken, destroyed with the router; on failure too),
 * slot j being the replica on ranks[j] (for messages). `group_index`: the index of the group's
 * first stage (the checkpoint entries' index). Each stream goes to the slot with the fewest
 * open streams (ties: the lowest slot) when its first packet comes and leaves the table after
 * its FINAL packet. A checkpoint marker's state is kept in the order record with the router's
 * table appended ("@router" entry); each replica gets a fresh, empty marker. NULL when out of
 * memory. */
sf_link *sf_router_link_create(sf_route_order *order, sf_link **subs, const int *ranks, int k, int group_index);
/* Restores the router's table from an "@router" entry's state. */
int sf_router_restore(sf_link *router, const uint8_t *data, size_t len);

/* A merger over k receiving links subs[0..k) (taken as above) in the router's slots. A marker
 * leaves as one: the state the router kept, then an "@group" entry (at group_index) holding
 * each replica's states. NULL when out of memory. */
sf_link *sf_merger_link_create(sf_route_order *order, sf_link **subs, const int *ranks, int k, int group_index);

/* Checkpoint entries (the sf_graph_save layout): u32 index, u32 name length, name, u64 state
 * length, state. Appends one. */
int sf_route_entry_append(sf_buffer *out, uint32_t index, const char *name, const void *state, size_t len);
/* Reads the entry at data[*at..len): sets the fields (pointers into data), advances *at. 0 at
 * the end; SF_E_STATE when truncated; 1 for an entry. */
int sf_route_entry_next(const uint8_t *data, size_t len, size_t *at, uint32_t *index, const char **name,
                        uint32_t *name_len, const uint8_t **state, uint64_t *state_len);

#endif
