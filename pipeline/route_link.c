/* Router and merger links of a stream-parallel group (route_link.h). The order record is the
 * heart of exactness: the router appends the replica slot of every packet before pushing it,
 * the merger pops from exactly that slot next, so packets leave the group in the order they
 * entered it whatever the replicas' speeds. Markers are recorded once (with the state gathered
 * upstream) and joined from every replica. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/route_link.h"
#include "seqflow/error.h"

#define MARKER (-1)

typedef struct order_item {
    int slot;          /* replica slot, or MARKER */
    uint32_t flags;    /* a marker's flags */
    uint8_t *state;    /* a marker's upstream state and the router's entry (owned) */
    size_t state_len;
} order_item;

struct sf_route_order {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    order_item *items;
    size_t head, count, cap;
    int closed, aborted, refs;
};

sf_route_order *sf_route_order_create(void)
{
    sf_route_order *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->wake, NULL);
    o->refs = 2;
    return o;
}

void sf_route_order_release(sf_route_order *o)
{
    if (!o) return;
    pthread_mutex_lock(&o->lock);
    int last = --o->refs == 0;
    pthread_mutex_unlock(&o->lock);
    if (!last) return;
    for (size_t i = 0; i < o->count; i++) free(o->items[(o->head + i) % o->cap].state);
    free(o->items);
    pthread_mutex_destroy(&o->lock);
    pthread_cond_destroy(&o->wake);
    free(o);
}

/* Takes item.state. */
static int order_put(sf_route_order *o, order_item item)
{
    pthread_mutex_lock(&o->lock);
    if (o->aborted) {
        pthread_mutex_unlock(&o->lock);
        free(item.state);
        return sf_error(SF_E_CLOSED, "link aborted");
    }
    if (o->count == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        order_item *items = malloc(cap * sizeof *items);
        if (!items) {
            pthread_mutex_unlock(&o->lock);
            free(item.state);
            return sf_error(SF_E_NOMEM, "out of memory");
        }
        for (size_t i = 0; i < o->count; i++) items[i] = o->items[(o->head + i) % o->cap];
        free(o->items);
        o->items = items;
        o->head = 0;
        o->cap = cap;
    }
    o->items[(o->head + o->count) % o->cap] = item;
    o->count++;
    pthread_cond_broadcast(&o->wake);
    pthread_mutex_unlock(&o->lock);
    return SF_OK;
}

/* Blocks for the next item: 1 with *item, 0 at the end (closed and drained, or aborted). */
static int order_get(sf_route_order *o, order_item *item)
{
    pthread_mutex_lock(&o->lock);
    while (o->count == 0 && !o->closed && !o->aborted) pthread_cond_wait(&o->wake, &o->lock);
    int got = o->count > 0 && !o->aborted;
    if (got) {
        *item = o->items[o->head];
        o->head = (o->head + 1) % o->cap;
        o->count--;
    }
    pthread_mutex_unlock(&o->lock);
    return got;
}

static void order_end(sf_route_order *o, int abort)
{
    pthread_mutex_lock(&o->lock);
    if (abort) o->aborted = 1;
    else o->closed = 1;
    pthread_cond_broadcast(&o->wake);
    pthread_mutex_unlock(&o->lock);
}

/* ---- checkpoint entries ------------------------------------------------------------------ */

int sf_route_entry_append(sf_buffer *out, uint32_t index, const char *name, const void *state, size_t len)
{
    uint32_t name_len = (uint32_t)strlen(name);
    uint64_t len64 = len;
    int rc = sf_buffer_append(out, &index, 4);
    if (rc == SF_OK) rc = sf_buffer_append(out, &name_len, 4);
    if (rc == SF_OK) rc = sf_buffer_append(out, name, name_len);
    if (rc == SF_OK) rc = sf_buffer_append(out, &len64, 8);
    if (rc == SF_OK && len) rc = sf_buffer_append(out, state, len);
    return rc;
}

int sf_route_entry_next(const uint8_t *data, size_t len, size_t *at, uint32_t *index, const char **name,
                        uint32_t *name_len, const uint8_t **state, uint64_t *state_len)
{
    if (*at == len) return 0;
    if (len - *at < 8) return sf_error(SF_E_STATE, "checkpoint state is truncated");
    memcpy(index, data + *at, 4);
    memcpy(name_len, data + *at + 4, 4);
    *at += 8;
    if (len - *at < (size_t)*name_len + 8) return sf_error(SF_E_STATE, "checkpoint state is truncated");
    *name = (const char *)data + *at;
    *at += *name_len;
    memcpy(state_len, data + *at, 8);
    *at += 8;
    if (*state_len > len - *at) return sf_error(SF_E_STATE, "checkpoint state is truncated");
    *state = data + *at;
    *at += (size_t)*state_len;
    return 1;
}

/* ---- router ------------------------------------------------------------------------------ */

typedef struct router {
    sf_link base;
    sf_route_order *order;
    sf_link **subs;
    int k, group_index;
    int *open;          /* open streams per slot */
    uint64_t *ids;      /* the table: stream ids and their slots, n entries */
    int *slots;
    size_t n, cap;
} router;

static int router_find(const router *r, uint64_t stream)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->ids[i] == stream) return (int)i;
    return -1;
}

static int router_add(router *r, uint64_t stream, int slot)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        uint64_t *ids = realloc(r->ids, cap * sizeof *ids);
        if (!ids) return sf_error(SF_E_NOMEM, "out of memory");
        r->ids = ids;
        int *slots = realloc(r->slots, cap * sizeof *slots);
        if (!slots) return sf_error(SF_E_NOMEM, "out of memory");
        r->slots = slots;
        r->cap = cap;
    }
    r->ids[r->n] = stream;
    r->slots[r->n] = slot;
    r->n++;
    r->open[slot]++;
    return SF_OK;
}

static int router_marker(router *r, sf_packet *p)
{
    sf_buffer kept = {p->state, p->state_len, p->state_cap};
    p->state = NULL;
    p->state_len = p->state_cap = 0;
    const uint32_t flags = p->flags;
    sf_packet_free(p);
    sf_buffer table = {0};
    uint32_t count = (uint32_t)r->n;
    int rc = sf_buffer_append(&table, &count, 4);
    for (size_t i = 0; i < r->n && rc == SF_OK; i++) {
        uint32_t slot = (uint32_t)r->slots[i];
        rc = sf_buffer_append(&table, &r->ids[i], 8);
        if (rc == SF_OK) rc = sf_buffer_append(&table, &slot, 4);
    }
    if (rc == SF_OK) rc = sf_route_entry_append(&kept, (uint32_t)r->group_index, "@router", table.data, table.len);
    sf_buffer_release(&table);
    if (rc != SF_OK) {
        sf_buffer_release(&kept);
        return rc;
    }
    rc = order_put(r->order, (order_item){MARKER, flags, kept.data, kept.len});
    for (int j = 0; j < r->k && rc == SF_OK; j++) {
        sf_packet *m = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0);
        if (!m) return sf_error(SF_E_NOMEM, "out of memory");
        m->flags = flags;
        rc = r->subs[j]->ops->push(r->subs[j], m);
    }
    return rc;
}

static int router_push(sf_link *l, sf_packet *p)
{
    router *r = (router *)l;
    if (p->kind == SF_PACKET_CHECKPOINT) return router_marker(r, p);
    int at = router_find(r, p->stream), rc = SF_OK;
    if (at < 0) {
        int best = 0;
        for (int j = 1; j < r->k; j++)
            if (r->open[j] < r->open[best]) best = j;
        rc = router_add(r, p->stream, best);
        at = (int)r->n - 1;
    }
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    const int slot = r->slots[at];
    if (p->flags & SF_PACKET_FINAL) { /* the stream ends: its slot takes new ones again */
        r->open[slot]--;
        r->n--;
        r->ids[at] = r->ids[r->n];
        r->slots[at] = r->slots[r->n];
    }
    rc = order_put(r->order, (order_item){slot, 0, NULL, 0});
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    return r->subs[slot]->ops->push(r->subs[slot], p);
}

static sf_packet *router_pop(sf_link *l) { (void)l; return NULL; }
static int router_ready(sf_link *l) { (void)l; return 1; }

static void router_close(sf_link *l)
{
    router *r = (router *)l;
    order_end(r->order, 0);
    for (int j = 0; j < r->k; j++) r->subs[j]->ops->close(r->subs[j]);
}

static void router_abort(sf_link *l)
{
    router *r = (router *)l;
    order_end(r->order, 1);
    for (int j = 0; j < r->k; j++) r->subs[j]->ops->abort(r->subs[j]);
}

static void router_destroy(sf_link *l)
{
    router *r = (router *)l;
    for (int j = 0; j < r->k; j++) sf_link_destroy(r->subs[j]);
    sf_route_order_release(r->order);
    free(r->subs);
    free(r->open);
    free(r->ids);
    free(r->slots);
    free(r);
}

static const sf_link_ops router_ops = {router_push, router_pop, router_ready, router_close, router_abort, router_destroy,
                                       NULL};

sf_link *sf_router_link_create(sf_route_order *order, sf_link **subs, const int *ranks, int k, int group_index)
{
    (void)ranks;
    router *r = calloc(1, sizeof *r);
    sf_link **own = calloc((size_t)k, sizeof *own);
    int *open = calloc((size_t)k, sizeof *open);
    if (!r || !own || !open) {
        for (int j = 0; j < k; j++) sf_link_destroy(subs[j]);
        sf_route_order_release(order);
        free(r);
        free(own);
        free(open);
        return NULL;
    }
    memcpy(own, subs, (size_t)k * sizeof *own);
    r->base.ops = &router_ops;
    r->order = order;
    r->subs = own;
    r->k = k;
    r->open = open;
    r->group_index = group_index;
    return &r->base;
}

int sf_router_restore(sf_link *l, const uint8_t *data, size_t len)
{
    router *r = (router *)l;
    uint32_t count;
    if (len < 4) return sf_error(SF_E_STATE, "the router's state is truncated");
    memcpy(&count, data, 4);
    if ((len - 4) / 12 != count || (len - 4) % 12) return sf_error(SF_E_STATE, "the router's state is inconsistent");
    r->n = 0;
    memset(r->open, 0, (size_t)r->k * sizeof *r->open);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t id;
        uint32_t slot;
        memcpy(&id, data + 4 + 12 * (size_t)i, 8);
        memcpy(&slot, data + 12 + 12 * (size_t)i, 4);
        if (slot >= (uint32_t)r->k)
            return sf_error(SF_E_STATE, "the checkpoint routes stream %llu to replica %u of %d: was it written with "
                            "another placement?", (unsigned long long)id, slot, r->k);
        int rc = router_add(r, id, (int)slot);
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}

/* ---- merger ------------------------------------------------------------------------------ */

typedef struct merger {
    sf_link base;
    sf_route_order *order;
    sf_link **subs;
    int *ranks;
    int k, group_index;
    pthread_mutex_t lock;
    int error;                 /* why pop ended early, SF_OK for a clean end */
    char message[512];
} merger;

static sf_packet *merger_fail(merger *m, int code, const char *message)
{
    pthread_mutex_lock(&m->lock);
    if (m->error == SF_OK) {
        m->error = code;
        snprintf(m->message, sizeof m->message, "%s", message);
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* The replica of slot j ended where the record says a packet comes: its link's own reason, or
 * an early end. */
static sf_packet *replica_ended(merger *m, int j)
{
    sf_link *s = m->subs[j];
    int rc = s->ops->status ? s->ops->status(s) : SF_OK;
    if (rc == SF_OK) rc = sf_error(SF_E_CLOSED, "the replica on rank %d ended before its packets did", m->ranks[j]);
    return merger_fail(m, rc, sf_last_error());
}

static sf_packet *merger_join(merger *m, order_item *item)
{
    sf_buffer state = {item->state, item->state_len, item->state_len};
    sf_buffer group = {0};
    uint32_t k = (uint32_t)m->k;
    int rc = sf_buffer_append(&group, &k, 4);
    sf_packet *out = NULL;
    for (int j = 0; j < m->k; j++) {
        sf_packet *p = m->subs[j]->ops->pop(m->subs[j]);
        if (!p) {
            sf_buffer_release(&state);
            sf_buffer_release(&group);
            return replica_ended(m, j);
        }
        if (p->kind != SF_PACKET_CHECKPOINT) {
            sf_packet_free(p);
            sf_buffer_release(&state);
            sf_buffer_release(&group);
            sf_error(SF_E_STATE, "the replica on rank %d sent a packet where its checkpoint marker belongs "
                                 "(a replicated stage must emit one packet per packet in)", m->ranks[j]);
            return merger_fail(m, SF_E_STATE, sf_last_error());
        }
        uint32_t rank = (uint32_t)m->ranks[j];
        uint64_t len = p->state_len;
        if (rc == SF_OK) rc = sf_buffer_append(&group, &rank, 4);
        if (rc == SF_OK) rc = sf_buffer_append(&group, &len, 8);
        if (rc == SF_OK && len) rc = sf_buffer_append(&group, p->state, p->state_len);
        sf_packet_free(p);
    }
    if (rc == SF_OK) rc = sf_route_entry_append(&state, (uint32_t)m->group_index, "@group", group.data, group.len);
    sf_buffer_release(&group);
    if (rc == SF_OK && !(out = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0))) rc = sf_error(SF_E_NOMEM, "out of memory");
    if (rc != SF_OK) {
        sf_buffer_release(&state);
        return merger_fail(m, rc, sf_last_error());
    }
    out->flags = item->flags;
    out->state = state.data;
    out->state_len = state.len;
    out->state_cap = state.cap;
    return out;
}

static sf_packet *merger_pop(sf_link *l)
{
    merger *m = (merger *)l;
    order_item item;
    if (!order_get(m->order, &item)) return NULL;
    if (item.slot == MARKER) return merger_join(m, &item);
    sf_packet *p = m->subs[item.slot]->ops->pop(m->subs[item.slot]);
    if (!p) return replica_ended(m, item.slot);
    if (p->kind == SF_PACKET_CHECKPOINT) {
        sf_packet_free(p);
        sf_error(SF_E_STATE, "the replica on rank %d sent its checkpoint marker early (a replicated stage must "
                             "emit one packet per packet in)", m->ranks[item.slot]);
        return merger_fail(m, SF_E_STATE, sf_last_error());
    }
    return p;
}

static int merger_ready(sf_link *l)
{
    merger *m = (merger *)l;
    sf_route_order *o = m->order;
    pthread_mutex_lock(&o->lock);
    int ready = o->count == 0 ? o->closed || o->aborted : -1;
    int slot = o->count ? o->items[o->head].slot : 0;
    pthread_mutex_unlock(&o->lock);
    if (ready >= 0) return ready;
    if (slot != MARKER) return m->subs[slot]->ops->ready(m->subs[slot]);
    for (int j = 0; j < m->k; j++)
        if (!m->subs[j]->ops->ready(m->subs[j])) return 0;
    return 1;
}

static void merger_close(sf_link *l) { (void)l; /* the producers close their own links */ }

static void merger_abort(sf_link *l)
{
    merger *m = (merger *)l;
    order_end(m->order, 1);
    for (int j = 0; j < m->k; j++) m->subs[j]->ops->abort(m->subs[j]);
}

static int merger_status(sf_link *l)
{
    merger *m = (merger *)l;
    pthread_mutex_lock(&m->lock);
    int rc = m->error;
    char message[512];
    memcpy(message, m->message, sizeof message);
    pthread_mutex_unlock(&m->lock);
    if (rc != SF_OK) return sf_error(rc, "%s", message);
    pthread_mutex_lock(&m->order->lock);
    int aborted = m->order->aborted;
    pthread_mutex_unlock(&m->order->lock);
    return aborted ? sf_error(SF_E_CLOSED, "link aborted") : SF_OK;
}

static void merger_destroy(sf_link *l)
{
    merger *m = (merger *)l;
    for (int j = 0; j < m->k; j++) sf_link_destroy(m->subs[j]);
    sf_route_order_release(m->order);
    pthread_mutex_destroy(&m->lock);
    free(m->subs);
    free(m->ranks);
    free(m);
}

static int merger_push(sf_link *l, sf_packet *p)
{
    (void)l;
    sf_packet_free(p);
    return sf_error(SF_E_INVAL, "a merger link only receives");
}

static const sf_link_ops merger_ops = {merger_push, merger_pop, merger_ready, merger_close, merger_abort,
                                       merger_destroy, merger_status};

sf_link *sf_merger_link_create(sf_route_order *order, sf_link **subs, const int *ranks, int k, int group_index)
{
    merger *m = calloc(1, sizeof *m);
    sf_link **own = calloc((size_t)k, sizeof *own);
    int *own_ranks = calloc((size_t)k, sizeof *own_ranks);
    if (!m || !own || !own_ranks) {
        for (int j = 0; j < k; j++) sf_link_destroy(subs[j]);
        sf_route_order_release(order);
        free(m);
        free(own);
        free(own_ranks);
        return NULL;
    }
    memcpy(own, subs, (size_t)k * sizeof *own);
    memcpy(own_ranks, ranks, (size_t)k * sizeof *own_ranks);
    m->base.ops = &merger_ops;
    m->order = order;
    m->subs = own;
    m->ranks = own_ranks;
    m->k = k;
    m->group_index = group_index;
    pthread_mutex_init(&m->lock, NULL);
    return &m->base;
}
