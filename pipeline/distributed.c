/* One rank's part of a distributed graph (distributed.h): which stages run here, the links
 * between them and to the other ranks, and the checkpoint state each rank restores. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm.h"
#include "pipeline/distributed.h"
#include "pipeline/graph_internal.h"
#include "pipeline/route_link.h"
#include "stages/head_procs.h"

typedef struct dist_group {
    int first, last;              /* stage indices */
    int k, ranks[SF_DIST_MAX_REPLICAS];
    int hub;                      /* the rank of the stages before and after it (router, merger) */
    sf_link *router;              /* on the hub: borrowed from the graph's links */
} dist_group;

typedef struct sf_dist_part {
    int world, rank, n;
    sf_dist_placement *pl;        /* [n], normalized: n >= 1, ranks sorted */
    sf_dist_placement *heads;     /* [n]: a block's head_ranks= in their order (head rank 0, the
                                     stage's owner, first), n 0 for a stage without */
    int *group;                   /* [n]: group of each stage, -1 for a single-rank stage */
    dist_group *groups;
    int n_groups;
    uint8_t *given;               /* a worker's share of a checkpoint (sf_dist_set_state) */
    size_t given_len;
    int has_given;
    int connected;
} sf_dist_part;

void sf_dist_part_free(struct sf_dist_part *part)
{
    if (!part) return;
    free(part->pl);
    free(part->heads);
    free(part->group);
    free(part->groups);
    free(part->given);
    free(part);
}

/* ---- the plan ----------------------------------------------------------------------------- */

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int on_rank(const sf_dist_placement *pl, int rank)
{
    for (int j = 0; j < pl->n; j++)
        if (pl->ranks[j] == rank) return 1;
    return 0;
}

static int same_ranks(const sf_dist_placement *a, const sf_dist_placement *b)
{
    return a->n == b->n && memcmp(a->ranks, b->ranks, (size_t)a->n * sizeof a->ranks[0]) == 0;
}

/* Stages that emit exactly one packet per packet in, in order: the ones a group may hold. */
static int replicable(const sf_stage *st, char *why, size_t size)
{
    const char *name = st->cls->name;
    if (strcmp(name, "block") == 0 && sf_stage_option_int(st, "batch") > 1) {
        snprintf(why, size, "block batch=%lld holds segments back for other streams, which a replica may never get; "
                 "use batch=1 in a replicated group", sf_stage_option_int(st, "batch"));
        return 0;
    }
    if (strcmp(name, "embed") == 0 || strcmp(name, "block") == 0 || strcmp(name, "norm") == 0) return 1;
    snprintf(why, size, "a replicated stage must emit one packet per packet in (embed, block, norm); %s does not", name);
    return 0;
}

/* Stage i's head_ranks= (a block's heads over processes) into part->heads[i], checked against
 * the job and the stage's placement, which it sets when the text has none: the stage runs on
 * its first head rank. */
static int plan_heads(sf_dist_part *part, const sf_graph *g, int i)
{
    const sf_stage *st = g->stages[i];
    sf_dist_placement *h = &part->heads[i], *pl = &part->pl[i];
    const char *text = strcmp(st->cls->name, "block") == 0 ? sf_stage_option(st, "head_ranks") : NULL;
    h->n = 0;
    if (!text) return SF_OK;
    int rc = sf_head_ranks_parse(text, h->ranks, SF_DIST_MAX_REPLICAS, &h->n);
    if (rc != SF_OK) return sf_error(SF_E_PARSE, "stage %d (%s): %s", i, st->cls->name, sf_last_error());
    for (int j = 0; j < h->n; j++)
        if (h->ranks[j] >= part->world)
            return sf_error(SF_E_PARSE, "stage %d (%s): head_ranks=%s names rank %d, but the job has %d ranks (0..%d)", i,
                            st->cls->name, text, h->ranks[j], part->world, part->world - 1);
    if (pl->n == 0) {
        pl->n = 1, pl->ranks[0] = h->ranks[0];
    } else if (pl->n != 1 || pl->ranks[0] != h->ranks[0]) {
        return sf_error(SF_E_PARSE, "stage %d (%s): head_ranks=%s runs the stage on its first rank, %d; the placement "
                                    "says otherwise (drop it, or write @%d)",
                        i, st->cls->name, text, h->ranks[0], h->ranks[0]);
    }
    return SF_OK;
}

/* This rank's head rank in stage i's group of head ranks, -1 when it has none there. */
static int head_index(const sf_dist_part *part, int i, int rank)
{
    for (int j = 0; j < part->heads[i].n; j++)
        if (part->heads[i].ranks[j] == rank) return j;
    return -1;
}

/* Whether rank runs stage i: where it is placed, or as one of its following head ranks. */
static int runs_here(const sf_dist_part *part, int i, int rank)
{
    return on_rank(&part->pl[i], rank) || head_index(part, i, rank) > 0;
}

static int plan(sf_dist_part *part, const sf_graph *g)
{
    const int n = part->n;
    for (int i = 0; i < n; i++) {
        sf_dist_placement *pl = &part->pl[i];
        const int *ranks = NULL;
        pl->n = sf_stage_placement(g->stages[i], &ranks);
        if (pl->n > SF_DIST_MAX_REPLICAS)
            return sf_error(SF_E_PARSE, "stage %d (%s) is replicated over %d ranks; at most %d", i, g->stages[i]->cls->name,
                            pl->n, SF_DIST_MAX_REPLICAS);
        if (pl->n) memcpy(pl->ranks, ranks, (size_t)pl->n * sizeof *ranks);
        int rc = plan_heads(part, g, i);
        if (rc != SF_OK) return rc;
        if (pl->n == 0) pl->n = 1, pl->ranks[0] = 0;
        qsort(pl->ranks, (size_t)pl->n, sizeof pl->ranks[0], cmp_int);
        for (int j = 0; j < pl->n; j++) {
            if (pl->ranks[j] >= part->world)
                return sf_error(SF_E_PARSE, "stage %d (%s) is placed on rank %d, but the job has %d ranks (0..%d)", i,
                                g->stages[i]->cls->name, pl->ranks[j], part->world, part->world - 1);
            if (j && pl->ranks[j] == pl->ranks[j - 1])
                return sf_error(SF_E_PARSE, "stage %d (%s) names rank %d twice", i, g->stages[i]->cls->name, pl->ranks[j]);
        }
        part->group[i] = -1;
    }
    if (part->pl[0].n != 1 || part->pl[0].ranks[0] != 0 || part->pl[n - 1].n != 1 || part->pl[n - 1].ranks[0] != 0)
        return sf_error(SF_E_PARSE, "the first and the last stage (%s, %s) run on rank 0, the driver", g->stages[0]->cls->name,
                        g->stages[n - 1]->cls->name);
    for (int i = 1; i < n - 1; i++) {
        if (part->pl[i].n < 2) continue;
        if (i > 1 && part->group[i - 1] >= 0 && same_ranks(&part->pl[i], &part->pl[i - 1])) {
            part->group[i] = part->group[i - 1];
            part->groups[part->group[i]].last = i;
        } else {
            if (part->group[i - 1] >= 0)
                return sf_error(SF_E_PARSE, "stage %d (%s) follows another replicated group directly; put a stage on one "
                                "rank between them (it routes the streams)", i, g->stages[i]->cls->name);
            dist_group *grp = &part->groups[part->n_groups];
            part->group[i] = part->n_groups++;
            grp->first = grp->last = i;
            grp->k = part->pl[i].n;
            memcpy(grp->ranks, part->pl[i].ranks, sizeof grp->ranks);
            grp->hub = part->pl[i - 1].ranks[0];
        }
        char why[256];
        if (!replicable(g->stages[i], why, sizeof why))
            return sf_error(SF_E_PARSE, "stage %d (%s) is replicated: %s", i, g->stages[i]->cls->name, why);
    }
    for (int gi = 0; gi < part->n_groups; gi++) {
        const dist_group *grp = &part->groups[gi];
        const sf_dist_placement *after = &part->pl[grp->last + 1];
        if (after->n != 1 || after->ranks[0] != grp->hub)
            return sf_error(SF_E_PARSE, "the replicated stages %d..%d take their streams from rank %d, so the stage after "
                            "them (%d, %s) must run there too (it puts the streams back in order)",
                            grp->first, grp->last, grp->hub, grp->last + 1, g->stages[grp->last + 1]->cls->name);
    }
    return SF_OK;
}

static int rank_of_single(const sf_dist_part *part, int i) { return part->pl[i].ranks[0]; }

static int cross(sf_graph *g, const sf_dist_links *links, int peer, uint32_t channel, int direction, sf_link **out)
{
    *out = NULL;
    int rc = links->create(links->user, peer, channel, direction, out);
    if (rc == SF_OK && !*out) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc != SF_OK) return rc;
    return sf_graph_own_link(g, *out);
}

/* ---- head ranks as processes (stages/head_procs.h) ------------------------------------------ */

/* Channels of stage i's head ranks: the work links, and the three of its communicator
 * (pipeline/comm_net.h), far above the graph's links (stage indices) and the sequence exchange's
 * (0x5E000000). */
#define HEADS_WORK_CHANNEL 0x48000000u
#define HEADS_COMM_CHANNEL 0x49000000u
#define HEADS_DEFAULT_TIMEOUT_MS 120000

typedef struct heads_links {
    sf_head_procs pub; /* first: a stage's heads pointer is the allocation (sf_dist_heads_free) */
    int ranks[SF_DIST_MAX_REPLICAS];
    sf_link *work[SF_DIST_MAX_REPLICAS]; /* the owner's sending halves ([0] unused; the graph's) */
    int closed;
} heads_links;

static int heads_push(void *links, int k, sf_packet *p)
{
    heads_links *h = links;
    if (k < 1 || k >= h->pub.size || !h->work[k]) {
        sf_packet_free(p);
        return sf_error(SF_E_INVAL, "no work link to head rank %d", k);
    }
    int rc = h->work[k]->ops->push(h->work[k], p);
    if (rc != SF_OK && h->work[k]->ops->status) { /* the follower's reason, when it gave one */
        int why = h->work[k]->ops->status(h->work[k]);
        if (why != SF_OK) rc = why;
    }
    return rc;
}

static void heads_close(void *links)
{
    heads_links *h = links;
    if (h->closed) return;
    h->closed = 1;
    for (int k = 1; k < h->pub.size; k++)
        if (h->work[k]) h->work[k]->ops->close(h->work[k]);
}

void sf_dist_heads_free(struct sf_head_procs *heads)
{
    if (!heads) return;
    sf_comm_free(heads->comm);
    free(heads);
}

/* Stage i's head ranks on this rank, head rank `head` of them: the communicator, and the work
 * links (the owner's to each follower; a follower's from the owner, its input). */
static int make_heads(sf_graph *g, sf_dist_part *part, const sf_dist_links *links, int i, int head)
{
    sf_stage *st = g->stages[i];
    const sf_dist_placement *hr = &part->heads[i];
    if (!links->comm)
        return sf_error(SF_E_UNSUPPORTED, "stage %d (%s): head_ranks= needs a communicator between the ranks, which "
                                          "this run's links do not make", i, st->cls->name);
    heads_links *h = calloc(1, sizeof *h);
    if (!h) return sf_error(SF_E_NOMEM, "out of memory");
    memcpy(h->ranks, hr->ranks, (size_t)hr->n * sizeof *h->ranks);
    h->pub = (sf_head_procs){.index = head, .size = hr->n, .ranks = h->ranks, .push = heads_push, .close = heads_close,
                             .links = h};
    st->heads = &h->pub; /* the stage frees it (sf_dist_heads_free) */
    long long timeout = sf_stage_option_int(st, "comm_timeout");
    int rc = links->comm(links->user, hr->ranks, hr->n, head, HEADS_COMM_CHANNEL + 4u * (uint32_t)i,
                         timeout > 0 ? (int)timeout : HEADS_DEFAULT_TIMEOUT_MS, &h->pub.comm);
    if (rc == SF_OK && !h->pub.comm) rc = sf_error(SF_E_NOMEM, "out of memory");
    const uint32_t work = HEADS_WORK_CHANNEL + (uint32_t)i;
    if (head > 0 && rc == SF_OK) return cross(g, links, hr->ranks[0], work, SF_DIST_RECV, &st->in);
    for (int k = 1; k < hr->n && rc == SF_OK; k++) rc = cross(g, links, hr->ranks[k], work, SF_DIST_SEND, &h->work[k]);
    return rc;
}

/* The links of this rank (see distributed.h). Local queues between a stage here and the next
 * one here are made when the producer is visited and picked up by the consumer. */
static int make_links(sf_graph *g, sf_dist_part *part, const sf_dist_links *links)
{
    const int n = part->n, me = part->rank, depth = g->opts.queue_depth;
    sf_link **merge_local = calloc((size_t)n, sizeof *merge_local); /* a replica here -> merger here */
    sf_route_order **orders = calloc((size_t)part->n_groups + 1, sizeof *orders);
    int rc = merge_local && orders ? SF_OK : sf_error(SF_E_NOMEM, "out of memory");
    for (int i = 0; i < n && rc == SF_OK; i++) {
        sf_stage *st = g->stages[i];
        const int head = head_index(part, i, me);
        if (head >= 0) rc = make_heads(g, part, links, i, head);
        if (rc != SF_OK || !on_rank(&part->pl[i], me)) continue; /* a following head rank: its input is its work */
        const int gi = part->group[i];
        /* the input, unless a local producer gave it */
        if (i > 0 && !st->in) {
            const int gp = part->group[i - 1];
            if (gi >= 0 && gp == gi) {
                rc = sf_error(SF_E_INVAL, "internal: stage %d has no input", i);
            } else if (gi >= 0) { /* first of a group, the hub elsewhere */
                rc = cross(g, links, part->groups[gi].hub, (uint32_t)i, SF_DIST_RECV, &st->in);
            } else if (gp >= 0) { /* after a group: the merger */
                const dist_group *grp = &part->groups[gp];
                sf_link *subs[SF_DIST_MAX_REPLICAS] = {0};
                for (int j = 0; j < grp->k && rc == SF_OK; j++) {
                    if (grp->ranks[j] == me) subs[j] = merge_local[i];
                    else rc = links->create(links->user, grp->ranks[j], (uint32_t)i, SF_DIST_RECV, &subs[j]);
                    if (rc == SF_OK && !subs[j]) rc = sf_error(SF_E_NOMEM, "out of memory");
                }
                if (rc != SF_OK) {
                    for (int j = 0; j < grp->k; j++)
                        if (subs[j] != merge_local[i]) sf_link_destroy(subs[j]);
                    break;
                }
                merge_local[i] = NULL; /* the merger owns it now */
                sf_route_order *order = orders[gp];
                orders[gp] = NULL;
                st->in = sf_merger_link_create(order, subs, grp->ranks, grp->k, grp->first);
                rc = sf_graph_own_link(g, st->in);
            } else {
                rc = cross(g, links, rank_of_single(part, i - 1), (uint32_t)i, SF_DIST_RECV, &st->in);
            }
            if (rc != SF_OK) break;
        }
        if (i == n - 1) continue;
        /* the output */
        const int gn = part->group[i + 1];
        sf_stage *next = g->stages[i + 1];
        if (gn >= 0 && gn != gi) { /* into a group: the router */
            dist_group *grp = &part->groups[gn];
            sf_link *subs[SF_DIST_MAX_REPLICAS] = {0};
            for (int j = 0; j < grp->k && rc == SF_OK; j++) {
                if (grp->ranks[j] == me) {
                    subs[j] = sf_queue_link_create(depth);
                    next->in = subs[j];
                } else {
                    rc = links->create(links->user, grp->ranks[j], (uint32_t)(i + 1), SF_DIST_SEND, &subs[j]);
                }
                if (rc == SF_OK && !subs[j]) rc = sf_error(SF_E_NOMEM, "out of memory");
            }
            if (rc == SF_OK && !(orders[gn] = sf_route_order_create())) rc = sf_error(SF_E_NOMEM, "out of memory");
            if (rc != SF_OK) {
                for (int j = 0; j < grp->k; j++) sf_link_destroy(subs[j]);
                next->in = NULL;
                break;
            }
            st->out = grp->router = sf_router_link_create(orders[gn], subs, grp->ranks, grp->k, grp->first);
            rc = sf_graph_own_link(g, st->out);
        } else if (gi >= 0 && gn == gi) { /* inside a group: this replica's queue */
            rc = sf_graph_own_link(g, st->out = next->in = sf_queue_link_create(depth));
        } else if (gi >= 0) { /* out of a group, to the merger on the hub */
            const int hub = part->groups[gi].hub;
            if (hub == me) rc = (st->out = merge_local[i + 1] = sf_queue_link_create(depth)) ? SF_OK : sf_error(SF_E_NOMEM, "out of memory");
            else rc = cross(g, links, hub, (uint32_t)(i + 1), SF_DIST_SEND, &st->out);
        } else if (rank_of_single(part, i + 1) == me) {
            rc = sf_graph_own_link(g, st->out = next->in = sf_queue_link_create(depth));
        } else {
            rc = cross(g, links, rank_of_single(part, i + 1), (uint32_t)(i + 1), SF_DIST_SEND, &st->out);
        }
    }
    if (merge_local)
        for (int i = 0; i < n; i++) sf_link_destroy(merge_local[i]);
    if (orders)
        for (int gi = 0; gi < part->n_groups; gi++) {
            /* a router whose merger was never made (a failure): both references go */
            if (orders[gi]) sf_route_order_release(orders[gi]);
        }
    free(merge_local);
    free(orders);
    return rc;
}

int sf_dist_plan(sf_graph *g, int world, int rank)
{
    if (!g) return sf_error(SF_E_INVAL, "sf_dist_plan: NULL graph");
    if (g->started || g->dist) return sf_error(SF_E_INVAL, "sf_dist_plan: the graph is started or planned already");
    if (world < 1 || world > SF_DIST_MAX_RANKS || rank < 0 || rank >= world)
        return sf_error(SF_E_INVAL, "rank %d of %d ranks is outside 0..%d", rank, world, SF_DIST_MAX_RANKS - 1);
    if (g->n_stages < 2) return sf_error(SF_E_PARSE, "a distributed pipeline has a source and a sink at least");
    sf_dist_part *part = calloc(1, sizeof *part);
    if (!part) return sf_error(SF_E_NOMEM, "out of memory");
    part->world = world;
    part->rank = rank;
    part->n = g->n_stages;
    part->pl = calloc((size_t)part->n, sizeof *part->pl);
    part->heads = calloc((size_t)part->n, sizeof *part->heads);
    part->group = calloc((size_t)part->n, sizeof *part->group);
    part->groups = calloc((size_t)part->n, sizeof *part->groups);
    if (!part->pl || !part->heads || !part->group || !part->groups) {
        sf_dist_part_free(part);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    int rc = plan(part, g);
    if (rc != SF_OK) {
        sf_dist_part_free(part);
        return rc;
    }
    g->dist = part; /* from here the graph frees it */
    for (int i = 0; i < part->n; i++) g->stages[i]->remote = !runs_here(part, i, rank);
    return SF_OK;
}

int sf_dist_connect(sf_graph *g, const sf_dist_links *links)
{
    if (!g || !g->dist || !links || !links->create) return sf_error(SF_E_INVAL, "sf_dist_connect: no plan or no links");
    if (g->dist->connected) return sf_error(SF_E_INVAL, "sf_dist_connect: connected already");
    g->dist->connected = 1;
    return make_links(g, g->dist, links);
}

int sf_dist_build(sf_graph *g, int world, int rank, const sf_dist_links *links)
{
    int rc = sf_dist_plan(g, world, rank);
    return rc == SF_OK ? sf_dist_connect(g, links) : rc;
}

int sf_dist_peer_used(const sf_graph *g, int peer)
{
    if (!g || !g->dist || peer < 0 || peer >= g->dist->world) return 0;
    for (int i = 0; i < g->dist->n; i++)
        if (runs_here(g->dist, i, peer)) return 1;
    return 0;
}

int sf_dist_is_local(const sf_graph *g, int i)
{
    if (!g || i < 0 || i >= g->n_stages) return 0;
    return !g->dist || runs_here(g->dist, i, g->dist->rank);
}

/* ---- checkpoint states -------------------------------------------------------------------- */

static int name_is(const char *name, uint32_t len, const char *what)
{
    return len == strlen(what) && memcmp(name, what, len) == 0;
}

/* Restores one stage entry into the local stage `index`. */
static int restore_stage(sf_graph *g, uint32_t index, const char *name, uint32_t name_len, const uint8_t *state,
                         uint64_t state_len, int *restored)
{
    sf_stage *st = g->stages[index];
    if (!name_is(name, name_len, st->cls->name))
        return sf_error(SF_E_STATE, "state does not match stage %u (%s)", index, st->cls->name);
    if (!st->cls->restore) return sf_error(SF_E_STATE, "stage %s saves state but cannot restore it", st->cls->name);
    int rc = st->cls->restore(st, state, (size_t)state_len);
    if (rc == SF_OK) restored[index]++;
    return rc;
}

/* Walks the entries of data[0..len) as seen from `rank`: with `out`, appends the entries that
 * rank restores (its share); without, restores them into g's local stages (g's rank).
 * `inside`: the group whose replica's entries these are, -1 at the top level. */
static int walk(sf_graph *g, const uint8_t *data, size_t len, int rank, sf_buffer *out, int *restored, int inside)
{
    const sf_dist_part *part = g->dist;
    size_t at = 0;
    uint32_t index, name_len;
    const char *name;
    const uint8_t *state;
    uint64_t state_len;
    int more;
    while ((more = sf_route_entry_next(data, len, &at, &index, &name, &name_len, &state, &state_len)) == 1) {
        if (index >= (uint32_t)part->n) return sf_error(SF_E_STATE, "the checkpoint names stage %u of %d", index, part->n);
        const int gi = part->group[index];
        const int is_router = name_is(name, name_len, "@router"), is_group = name_is(name, name_len, "@group");
        if (inside >= 0) { /* a replica's own stages */
            if (is_router || is_group || gi != inside)
                return sf_error(SF_E_STATE, "a replicated group's state names stage %u outside it", index);
            int rc = restore_stage(g, index, name, name_len, state, state_len, restored);
            if (rc != SF_OK) return rc;
            continue;
        }
        if ((is_router || is_group) && (gi < 0 || part->groups[gi].first != (int)index))
            return sf_error(SF_E_STATE, "the checkpoint has a replicated group at stage %u, this pipeline none: was it "
                            "written with another placement?", index);
        if (!is_router && !is_group && gi >= 0)
            return sf_error(SF_E_STATE, "the checkpoint has stage %u on one rank, this pipeline replicates it: was it "
                            "written with another placement?", index);
        int rc = SF_OK;
        if (is_router) {
            const dist_group *grp = &part->groups[gi];
            if (grp->hub != rank) continue;
            if (out) rc = sf_route_entry_append(out, index, "@router", state, (size_t)state_len);
            else if (!grp->router) rc = sf_error(SF_E_STATE, "internal: no router for stage %u", index);
            else rc = sf_router_restore(grp->router, state, (size_t)state_len);
            if (rc == SF_OK && !out) restored[part->n]++;
        } else if (is_group) {
            uint32_t k;
            if (state_len < 4) return sf_error(SF_E_STATE, "a replicated group's state is truncated");
            memcpy(&k, state, 4);
            size_t p = 4;
            for (uint32_t j = 0; j < k && rc == SF_OK; j++) {
                uint32_t r;
                uint64_t sub_len;
                if (state_len - p < 12) return sf_error(SF_E_STATE, "a replicated group's state is truncated");
                memcpy(&r, state + p, 4);
                memcpy(&sub_len, state + p + 4, 8);
                p += 12;
                if (sub_len > state_len - p) return sf_error(SF_E_STATE, "a replicated group's state is truncated");
                if ((int)r == rank) {
                    if (out) {
                        uint32_t one = 1;
                        sf_buffer group = {0};
                        rc = sf_buffer_append(&group, &one, 4);
                        if (rc == SF_OK) rc = sf_buffer_append(&group, state + p - 12, 12 + (size_t)sub_len);
                        if (rc == SF_OK) rc = sf_route_entry_append(out, index, "@group", group.data, group.len);
                        sf_buffer_release(&group);
                    } else {
                        rc = walk(g, state + p, (size_t)sub_len, rank, NULL, restored, gi);
                    }
                }
                p += (size_t)sub_len;
            }
        } else if (on_rank(&part->pl[index], rank)) {
            if (out) rc = sf_route_entry_append(out, index, g->stages[index]->cls->name, state, (size_t)state_len);
            else rc = restore_stage(g, index, name, name_len, state, state_len, restored);
        }
        if (rc != SF_OK) return rc;
    }
    return more;
}

int sf_dist_restore(sf_graph *g, const uint8_t *data, size_t len)
{
    sf_dist_part *part = g->dist;
    int *restored = calloc((size_t)part->n + 1, sizeof *restored); /* [n]: routers */
    if (!restored) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = walk(g, data, len, part->rank, NULL, restored, -1);
    for (int i = 0; i < part->n && rc == SF_OK; i++) {
        const sf_stage *st = g->stages[i];
        if (st->remote || !st->cls->save || (st->heads && st->heads->index > 0)) continue; /* its owner restores it */
        if (restored[i] != 1)
            rc = sf_error(SF_E_STATE, "the checkpoint holds %s state for stage %d (%s) on rank %d: was it written with "
                          "another placement?", restored[i] ? "more than one" : "no", i, st->cls->name, part->rank);
    }
    free(restored);
    return rc;
}

int sf_dist_rank_state(const sf_graph *g, const uint8_t *data, size_t len, int rank, sf_buffer *out)
{
    if (!g || !g->dist || !out || (!data && len)) return sf_error(SF_E_INVAL, "sf_dist_rank_state: NULL argument");
    if (rank < 0 || rank >= g->dist->world) return sf_error(SF_E_INVAL, "rank %d outside the job", rank);
    return walk((sf_graph *)g, data, len, rank, out, NULL, -1);
}

int sf_dist_set_state(sf_graph *g, const uint8_t *data, size_t len)
{
    if (!g || !g->dist || (!data && len)) return sf_error(SF_E_INVAL, "sf_dist_set_state: NULL argument");
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return sf_error(SF_E_NOMEM, "out of memory");
    if (len) memcpy(copy, data, len);
    free(g->dist->given);
    g->dist->given = copy;
    g->dist->given_len = len;
    g->dist->has_given = 1;
    return SF_OK;
}

int sf_dist_restore_given(sf_graph *g)
{
    sf_dist_part *part = g->dist;
    if (!part->has_given) return SF_OK;
    int rc = sf_dist_restore(g, part->given, part->given_len);
    free(part->given);
    part->given = NULL;
    part->has_given = 0;
    return rc == SF_OK ? SF_OK : sf_error(rc, "cannot resume rank %d: %s", part->rank, sf_last_error());
}

int sf_dist_checkpoint_load(sf_graph *g, const uint8_t **data, size_t *len)
{
    if (!g || !data || !len) return sf_error(SF_E_INVAL, "sf_dist_checkpoint_load: NULL argument");
    *data = NULL;
    *len = 0;
    if (!g->checkpoint) return SF_OK;
    int rc = sf_graph_checkpoint_prepare(g);
    if (rc != SF_OK) return rc;
    if (g->checkpoint->resuming) {
        *data = g->checkpoint->loaded;
        *len = g->checkpoint->loaded_len;
    }
    return SF_OK;
}

/* ---- the in-process exchange -------------------------------------------------------------- */

typedef struct exchange_link exchange_link;

typedef struct exchange_queue {
    int sender, receiver;
    uint32_t channel;
    sf_link *queue;
    int aborted_by;             /* the rank that aborted it, -1 while open */
    uint64_t pushed, fail_after; /* fail_after 0: never */
    exchange_link *halves[2];
} exchange_queue;

struct exchange_link {
    sf_link base;
    sf_dist_exchange *x;
    exchange_queue *q;
    int self;
};

typedef struct exchange_rank {
    sf_dist_exchange *x;
    int rank;
} exchange_rank;

/* The host communicators of one stage's head ranks (threads of this process), made when the
 * first of them asks, each taken by its rank. */
typedef struct exchange_comms {
    uint32_t base;
    int n;
    sf_comm **comms;
    struct exchange_comms *next;
} exchange_comms;

struct sf_dist_exchange {
    pthread_mutex_t lock;
    int world, depth;
    exchange_rank *ranks;
    exchange_queue **queues;
    int n, cap;
    exchange_comms *comms;
};

static int xl_status(sf_link *l);

static int xl_push(sf_link *l, sf_packet *p)
{
    exchange_link *e = (exchange_link *)l;
    pthread_mutex_lock(&e->x->lock);
    const int fail = e->q->fail_after && ++e->q->pushed > e->q->fail_after;
    pthread_mutex_unlock(&e->x->lock);
    if (fail) {
        sf_packet_free(p);
        l->ops->abort(l);
        return sf_error(SF_E_IO, "injected failure on the link from rank %d to rank %d", e->q->sender, e->q->receiver);
    }
    int rc = e->q->queue->ops->push(e->q->queue, p);
    if (rc != SF_OK) { /* the peer's reason, as a network half gives it */
        int why = xl_status(l);
        if (why != SF_OK) return why;
    }
    return rc;
}

static sf_packet *xl_pop(sf_link *l) { exchange_link *e = (exchange_link *)l; return e->q->queue->ops->pop(e->q->queue); }
static int xl_ready(sf_link *l) { exchange_link *e = (exchange_link *)l; return e->q->queue->ops->ready(e->q->queue); }
static void xl_close(sf_link *l) { exchange_link *e = (exchange_link *)l; e->q->queue->ops->close(e->q->queue); }

static void xl_abort(sf_link *l)
{
    exchange_link *e = (exchange_link *)l;
    pthread_mutex_lock(&e->x->lock);
    if (e->q->aborted_by < 0) e->q->aborted_by = e->self;
    pthread_mutex_unlock(&e->x->lock);
    e->q->queue->ops->abort(e->q->queue);
}

static int xl_status(sf_link *l)
{
    exchange_link *e = (exchange_link *)l;
    pthread_mutex_lock(&e->x->lock);
    const int by = e->q->aborted_by;
    pthread_mutex_unlock(&e->x->lock);
    if (by < 0) return SF_OK;
    if (by == e->self) return sf_error(SF_E_CLOSED, "link aborted");
    return sf_error(SF_E_CLOSED, "rank %d stopped (its link to rank %d on channel %u was cut)", by,
                    e->self == e->q->sender ? e->q->receiver : e->q->sender, e->q->channel);
}

/* The exchange owns the queues; a half only lets go of its side. */
static void xl_destroy(sf_link *l)
{
    exchange_link *e = (exchange_link *)l;
    pthread_mutex_lock(&e->x->lock);
    for (int h = 0; h < 2; h++)
        if (e->q->halves[h] == e) e->q->halves[h] = NULL;
    pthread_mutex_unlock(&e->x->lock);
    free(e);
}

static const sf_link_ops exchange_ops = {xl_push, xl_pop, xl_ready, xl_close, xl_abort, xl_destroy, xl_status};

/* The queue of (sender, receiver, channel), made by whichever half comes first. */
static exchange_queue *exchange_find(sf_dist_exchange *x, int sender, int receiver, uint32_t channel)
{
    for (int i = 0; i < x->n; i++)
        if (x->queues[i]->sender == sender && x->queues[i]->receiver == receiver && x->queues[i]->channel == channel)
            return x->queues[i];
    if (x->n == x->cap) {
        int cap = x->cap ? 2 * x->cap : 16;
        exchange_queue **q = realloc(x->queues, (size_t)cap * sizeof *q);
        if (!q) return NULL;
        x->queues = q;
        x->cap = cap;
    }
    exchange_queue *q = calloc(1, sizeof *q);
    if (!q || !(q->queue = sf_queue_link_create(x->depth))) {
        free(q);
        return NULL;
    }
    q->sender = sender;
    q->receiver = receiver;
    q->channel = channel;
    q->aborted_by = -1;
    x->queues[x->n++] = q;
    return q;
}

static int exchange_create(void *user, int peer, uint32_t channel, int direction, sf_link **out)
{
    exchange_rank *r = user;
    sf_dist_exchange *x = r->x;
    *out = NULL;
    if (peer < 0 || peer >= x->world || peer == r->rank) return sf_error(SF_E_INVAL, "no rank %d to link to", peer);
    exchange_link *e = calloc(1, sizeof *e);
    if (!e) return sf_error(SF_E_NOMEM, "out of memory");
    pthread_mutex_lock(&x->lock);
    const int send = direction == SF_DIST_SEND;
    exchange_queue *q = exchange_find(x, send ? r->rank : peer, send ? peer : r->rank, channel);
    int rc = !q ? sf_error(SF_E_NOMEM, "out of memory")
             : q->halves[send ? 0 : 1] ? sf_error(SF_E_INVAL, "the link %d -> %d on channel %u has that half already",
                                                    q->sender, q->receiver, channel)
                                       : SF_OK;
    if (rc == SF_OK) q->halves[send ? 0 : 1] = e;
    pthread_mutex_unlock(&x->lock);
    if (rc != SF_OK) {
        free(e);
        return rc;
    }
    e->base.ops = &exchange_ops;
    e->x = x;
    e->q = q;
    e->self = r->rank;
    *out = &e->base;
    return SF_OK;
}

static int exchange_comm(void *user, const int *ranks, int n, int index, uint32_t channel_base, int timeout_ms,
                         sf_comm **out)
{
    exchange_rank *r = user;
    sf_dist_exchange *x = r->x;
    *out = NULL;
    pthread_mutex_lock(&x->lock);
    exchange_comms *c = x->comms;
    while (c && c->base != channel_base) c = c->next;
    int rc = SF_OK;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c && !(c->comms = calloc((size_t)n, sizeof *c->comms))) free(c), c = NULL;
        rc = c ? sf_comm_host_create(n, NULL, timeout_ms, c->comms) : sf_error(SF_E_NOMEM, "out of memory");
        if (rc == SF_OK) {
            c->base = channel_base, c->n = n, c->next = x->comms;
            x->comms = c;
        } else if (c) {
            free(c->comms), free(c);
            c = NULL;
        }
    }
    if (rc == SF_OK && (c->n != n || index < 0 || index >= n || !c->comms[index]))
        rc = sf_error(SF_E_INVAL, "head ranks on channel %u: rank %d of %d asked twice or of another size", channel_base,
                      index, n);
    if (rc == SF_OK) *out = c->comms[index], c->comms[index] = NULL;
    pthread_mutex_unlock(&x->lock);
    (void)ranks;
    return rc;
}

int sf_dist_exchange_create(int world, int depth, sf_dist_exchange **out)
{
    *out = NULL;
    if (world < 1 || world > SF_DIST_MAX_RANKS) return sf_error(SF_E_INVAL, "world %d outside 1..%d", world, SF_DIST_MAX_RANKS);
    sf_dist_exchange *x = calloc(1, sizeof *x);
    if (!x || !(x->ranks = calloc((size_t)world, sizeof *x->ranks))) {
        free(x);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    pthread_mutex_init(&x->lock, NULL);
    x->world = world;
    x->depth = depth < 1 ? 4 : depth;
    for (int r = 0; r < world; r++) x->ranks[r] = (exchange_rank){x, r};
    *out = x;
    return SF_OK;
}

void sf_dist_exchange_free(sf_dist_exchange *x)
{
    if (!x) return;
    for (int i = 0; i < x->n; i++) {
        sf_link_destroy(x->queues[i]->queue);
        free(x->queues[i]);
    }
    free(x->queues);
    free(x->ranks);
    for (exchange_comms *c = x->comms, *next; c; c = next) {
        next = c->next;
        for (int r = 0; r < c->n; r++) sf_comm_free(c->comms[r]);
        free(c->comms);
        free(c);
    }
    pthread_mutex_destroy(&x->lock);
    free(x);
}

sf_dist_links sf_dist_exchange_links(sf_dist_exchange *x, int rank)
{
    return (sf_dist_links){exchange_create, &x->ranks[rank], exchange_comm};
}

void sf_dist_exchange_fail_after(sf_dist_exchange *x, int sender, uint32_t channel, uint64_t packets)
{
    pthread_mutex_lock(&x->lock);
    for (int receiver = 0; receiver < x->world; receiver++) {
        exchange_queue *q = exchange_find(x, sender, receiver, channel);
        if (q) q->fail_after = packets;
    }
    pthread_mutex_unlock(&x->lock);
}

int sf_dist_last_committed(const sf_graph *g, uint64_t *stream, uint64_t *segment)
{
    uint64_t plus1 = g ? (uint64_t)atomic_load(&((sf_graph *)g)->last_segment) : 0;
    if (!plus1) return 0;
    *segment = plus1 - 1;
    *stream = (uint64_t)atomic_load(&((sf_graph *)g)->last_stream);
    return 1;
}
