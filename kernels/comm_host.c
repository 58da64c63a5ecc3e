/* The communicator's wrappers (kernels/comm.h) and its host implementation: ranks are threads
 * of one process sharing a group (pointers posted in shared slots, a barrier with a timeout).
 * A collective is two barriers: after the first every rank's buffer is posted; each rank then
 * works on its own slice of the elements (sums taken in rank order, so that the result does
 * not depend on which thread came first) and writes it into every rank's buffer; after the
 * second all are done and the buffers may change again. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend_ext.h"
#include "kernels/comm.h"
#include "seqflow/error.h"

/* ---- the wrappers ---------------------------------------------------------------------- */

static int check_type(const sf_comm *c, const char *op, sf_dtype type)
{
    if (!c) return sf_error(SF_E_INVAL, "%s: no communicator", op);
    if (type != SF_DTYPE_F32 && type != SF_DTYPE_BF16) return sf_error(SF_E_INVAL, "%s: unknown type %d", op, (int)type);
    return SF_OK;
}

static int check_peer(const sf_comm *c, const char *op, int peer)
{
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return sf_error(SF_E_INVAL, "%s: rank %d of %d names peer %d", op, c->rank, c->size, peer);
    return SF_OK;
}

int sf_comm_all_reduce(sf_comm *c, void *buf, size_t count, sf_dtype type)
{
    int rc = check_type(c, "all_reduce", type);
    return rc == SF_OK ? c->ops->all_reduce(c, buf, count, type) : rc;
}

int sf_comm_all_gather(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type)
{
    int rc = check_type(c, "all_gather", type);
    return rc == SF_OK ? c->ops->all_gather(c, send, recv, count, type) : rc;
}

int sf_comm_broadcast(sf_comm *c, void *buf, size_t count, sf_dtype type, int root)
{
    int rc = check_type(c, "broadcast", type);
    if (rc == SF_OK && (root < 0 || root >= c->size))
        rc = sf_error(SF_E_INVAL, "broadcast: root %d of %d ranks", root, c->size);
    return rc == SF_OK ? c->ops->broadcast(c, buf, count, type, root) : rc;
}

int sf_comm_send(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer)
{
    int rc = check_type(c, "send", type);
    if (rc == SF_OK) rc = check_peer(c, "send", peer);
    return rc == SF_OK ? c->ops->send(c, buf, count, type, peer) : rc;
}

int sf_comm_recv(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer)
{
    int rc = check_type(c, "recv", type);
    if (rc == SF_OK) rc = check_peer(c, "recv", peer);
    return rc == SF_OK ? c->ops->recv(c, buf, count, type, peer) : rc;
}

int sf_comm_send_tagged(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer, uint64_t tag, int exact)
{
    int rc = check_type(c, "send", type);
    if (rc == SF_OK) rc = check_peer(c, "send", peer);
    if (rc != SF_OK) return rc;
    return c->ops->send_tagged ? c->ops->send_tagged(c, buf, count, type, peer, tag, exact)
                               : c->ops->send(c, buf, count, type, peer);
}

int sf_comm_recv_tagged(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer, int exact)
{
    int rc = check_type(c, "recv", type);
    if (rc == SF_OK) rc = check_peer(c, "recv", peer);
    if (rc != SF_OK) return rc;
    return c->ops->recv_tagged ? c->ops->recv_tagged(c, buf, count, type, peer, exact)
                               : c->ops->recv(c, buf, count, type, peer);
}

int sf_comm_probe(sf_comm *c, int peer, int exact)
{
    int rc = check_peer(c, "probe", peer);
    if (rc != SF_OK) return rc;
    return c->ops->probe ? c->ops->probe(c, peer, exact) : 0;
}

int sf_comm_all_reduce_start(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket)
{
    int rc = check_type(c, "all_reduce", type);
    return rc == SF_OK ? c->ops->all_reduce_start(c, buf, count, type, ticket) : rc;
}

int sf_comm_join(sf_comm *c, int ticket)
{
    if (ticket < 0 || ticket >= SF_COMM_TICKETS) return sf_error(SF_E_INVAL, "join: ticket %d", ticket);
    return c->ops->join(c, ticket);
}

int sf_comm_reduce_add_reserve(sf_comm *c, size_t count, sf_dtype type, int allow_copies, int *copies)
{
    int rc = check_type(c, "reduce_add", type);
    *copies = 0;
    if (rc != SF_OK || !c->ops->reduce_add_reserve) return rc;
    return c->ops->reduce_add_reserve(c, count, type, allow_copies, copies);
}

int sf_comm_reduce_add_start(sf_comm *c, void *part, size_t count, sf_dtype type, int *ticket)
{
    int rc = check_type(c, "reduce_add", type);
    if (rc != SF_OK) return rc;
    if (c->ops->reduce_add_start) return c->ops->reduce_add_start(c, part, count, type, ticket);
    return c->ops->all_reduce_start(c, part, count, type, ticket);
}

int sf_comm_reduce_add_end(sf_comm *c, int ticket, float *x, void *part, size_t count, sf_dtype type)
{
    if (c->ops->reduce_add_end) return c->ops->reduce_add_end(c, ticket, x, part, count, type);
    int rc = sf_comm_join(c, ticket);
    return rc == SF_OK ? sf_be_add_typed(c->be, count, x, type, part) : rc;
}

int sf_comm_reduce_norm_reserve(sf_comm *c, int rows, int dim, sf_dtype type, float *x, void *u, int allow_copies,
                                int *split)
{
    int copies = 0;
    *split = 0;
    if (rows < 0 || dim <= 0) return sf_error(SF_E_INVAL, "reduce_norm_reserve: %d rows of %d", rows, dim);
    if (c->ops->reduce_norm_reserve) {
        int rc = check_type(c, "reduce_norm", type);
        return rc == SF_OK ? c->ops->reduce_norm_reserve(c, rows, dim, type, x, u, allow_copies, split) : rc;
    }
    return sf_comm_reduce_add_reserve(c, (size_t)rows * dim, type, allow_copies, &copies);
}

int sf_comm_reduce_norm_start(sf_comm *c, void *part, int rows, int dim, sf_dtype type, int *ticket)
{
    if (c->ops->reduce_norm_start) {
        int rc = check_type(c, "reduce_norm", type);
        return rc == SF_OK ? c->ops->reduce_norm_start(c, part, rows, dim, type, ticket) : rc;
    }
    return sf_comm_reduce_add_start(c, part, (size_t)rows * dim, type, ticket);
}

int sf_comm_reduce_norm_end(sf_comm *c, int ticket, float *x, void *part, int rows, int dim, sf_dtype type,
                            const float *norm, float eps, void *u)
{
    if (c->ops->reduce_norm_end) return c->ops->reduce_norm_end(c, ticket, x, part, rows, dim, type, norm, eps, u);
    int rc = sf_comm_reduce_add_end(c, ticket, x, part, (size_t)rows * dim, type);
    if (rc == SF_OK && norm) rc = sf_be_rmsnorm_typed(c->be, rows, dim, x, norm, eps, SF_DTYPE_BF16, u);
    if (rc == SF_E_UNSUPPORTED) rc = sf_error(SF_E_UNSUPPORTED, "reduce_norm: the backend has no bf16 norm");
    return rc;
}

int sf_comm_reduce_norm_join(sf_comm *c, int ticket)
{
    return c->ops->reduce_norm_join ? c->ops->reduce_norm_join(c, ticket) : SF_OK;
}

int sf_comm_first_rows(sf_comm *c, int rows, int dim, float *x, const float *norm, float eps, void *u)
{
    if (rows < 0 || dim <= 0) return sf_error(SF_E_INVAL, "first_rows: %d rows of %d", rows, dim);
    if (c->ops->first_rows) return c->ops->first_rows(c, rows, dim, x, norm, eps, u);
    int rc = sf_comm_broadcast(c, x, (size_t)rows * dim, SF_DTYPE_F32, 0);
    if (rc == SF_OK) rc = sf_be_rmsnorm_typed(c->be, rows, dim, x, norm, eps, SF_DTYPE_BF16, u);
    if (rc == SF_E_UNSUPPORTED) rc = sf_error(SF_E_UNSUPPORTED, "first_rows: the backend has no bf16 norm");
    return rc;
}

int sf_comm_group_begin(sf_comm *c) { return c->ops->group_begin(c); }
int sf_comm_group_end(sf_comm *c) { return c->ops->group_end(c); }
int sf_comm_wait(sf_comm *c) { return c->ops->wait(c); }
int sf_comm_fence(sf_comm *c) { return c->ops->fence(c); }
int sf_comm_end_unit(sf_comm *c) { return c->ops->end_unit ? c->ops->end_unit(c) : c->ops->wait(c); }

void sf_comm_abort(sf_comm *c, const char *why)
{
    if (c) c->ops->abort(c, why);
}

void sf_comm_free(sf_comm *c)
{
    if (c) c->ops->destroy(c);
}

void sf_comm_watch(sf_comm *c, const int *stop) { c->stop = stop; }

/* ---- host ---------------------------------------------------------------------------------- */

static float bf16_value(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

typedef struct host_msg {
    struct host_msg *next;
    size_t bytes;
    unsigned char data[];
} host_msg;

typedef struct host_group {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int size, refs;
    int arrived;            /* ranks at the current barrier */
    unsigned long gen;      /* barriers completed */
    int aborted;            /* 1 + the rank that aborted, 0 none */
    char why[200];
    void **ptr;             /* [size] buffers posted for the current collective */
    const void **cptr;      /* [size] send buffers (all_gather) */
    size_t *count;          /* [size] their counts */
    int *root;              /* [size] broadcast roots, to check they agree */
    host_msg **mail;        /* [size * size]: mail[dst * size + src], FIFO of messages */
} host_group;

typedef struct host_comm {
    host_group *g;
    int failed; /* this rank saw a failure: later operations fail at once */
} host_comm;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* The absolute CLOCK_REALTIME time for pthread_cond_timedwait, `ms` from now (at most a slice of
 * 50 ms, so that the watch flag is looked at while waiting). */
static struct timespec deadline_in(double ms)
{
    if (ms > 50) ms = 50;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = t.tv_nsec + (long long)(ms * 1e6);
    t.tv_sec += ns / 1000000000LL;
    t.tv_nsec = ns % 1000000000LL;
    return t;
}

static int stopped(const sf_comm *c) { return c->stop && __atomic_load_n(c->stop, __ATOMIC_ACQUIRE); }

/* The error of a failed group, under the lock. */
static int group_error(sf_comm *c, const char *op)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    h->failed = 1;
    if (g->aborted)
        return sf_error(SF_E_COMM, "%s on rank %d of %d: rank %d aborted: %s", op, c->rank, c->size, g->aborted - 1,
                        g->why);
    return sf_error(SF_E_COMM, "%s on rank %d of %d: stopped, another rank of the group failed", op, c->rank, c->size);
}

static void abort_locked(sf_comm *c, const char *why)
{
    host_group *g = ((host_comm *)c->impl)->g;
    if (!g->aborted) {
        g->aborted = c->rank + 1;
        snprintf(g->why, sizeof g->why, "%s", why && *why ? why : "aborted");
    }
    pthread_cond_broadcast(&g->cond);
}

/* The group's barrier, with the timeout and the failure checks. Under the lock. */
static int barrier_locked(sf_comm *c, const char *op)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    if (h->failed || g->aborted || stopped(c)) return group_error(c, op);
    const unsigned long gen = g->gen;
    if (++g->arrived == g->size) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cond);
        return SF_OK;
    }
    const double start = now_ms();
    while (g->gen == gen) {
        if (g->aborted || stopped(c)) return group_error(c, op);
        const double left = c->timeout_ms - (now_ms() - start);
        if (left <= 0) {
            const int waiting = g->arrived;
            char why[160];
            snprintf(why, sizeof why, "rank %d timed out after %d ms in %s with %d of %d ranks arrived", c->rank,
                     c->timeout_ms, op, waiting, g->size);
            abort_locked(c, why);
            h->failed = 1;
            return sf_error(SF_E_COMM, "%s on rank %d of %d: timed out after %d ms waiting for the other ranks (%d of %d "
                                       "arrived); a rank never joined or stopped",
                            op, c->rank, c->size, c->timeout_ms, waiting, g->size);
        }
        struct timespec t = deadline_in(left);
        pthread_cond_timedwait(&g->cond, &g->lock, &t);
    }
    return SF_OK;
}

static int barrier(sf_comm *c, const char *op)
{
    host_group *g = ((host_comm *)c->impl)->g;
    pthread_mutex_lock(&g->lock);
    int rc = barrier_locked(c, op);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* Posts this rank's buffer and count, then the first barrier; checks that all counts agree. */
static int post(sf_comm *c, const char *op, void *buf, const void *cbuf, size_t count, int root)
{
    host_group *g = ((host_comm *)c->impl)->g;
    pthread_mutex_lock(&g->lock);
    g->ptr[c->rank] = buf, g->cptr[c->rank] = cbuf, g->count[c->rank] = count, g->root[c->rank] = root;
    int rc = barrier_locked(c, op);
    for (int r = 0; r < g->size && rc == SF_OK; r++)
        if (g->count[r] != count || g->root[r] != root)
            rc = sf_error(SF_E_COMM, "%s: rank %d passed %zu elements (root %d), rank %d %zu (root %d)", op, c->rank,
                          count, root, r, g->count[r], g->root[r]);
    pthread_mutex_unlock(&g->lock);
    return rc;
}

/* This rank's slice [*lo, *hi) of count elements. */
static void slice(const sf_comm *c, size_t count, size_t *lo, size_t *hi)
{
    const size_t per = (count + (size_t)c->size - 1) / (size_t)c->size;
    *lo = per * (size_t)c->rank;
    if (*lo > count) *lo = count;
    *hi = *lo + per > count ? count : *lo + per;
}

static int host_all_reduce(sf_comm *c, void *buf, size_t count, sf_dtype type)
{
    host_group *g = ((host_comm *)c->impl)->g;
    int rc = post(c, "all_reduce", buf, NULL, count, 0);
    if (rc != SF_OK) return rc;
    size_t lo, hi;
    slice(c, count, &lo, &hi);
    const int R = g->size;
    if (type == SF_DTYPE_F32) {
        for (size_t i = lo; i < hi; i++) {
            float s = ((float *)g->ptr[0])[i];
            for (int r = 1; r < R; r++) s += ((float *)g->ptr[r])[i];
            for (int r = 0; r < R; r++) ((float *)g->ptr[r])[i] = s;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            float s = bf16_value(((uint16_t *)g->ptr[0])[i]);
            for (int r = 1; r < R; r++) s += bf16_value(((uint16_t *)g->ptr[r])[i]);
            const uint16_t b = sf_bf16_round(s);
            for (int r = 0; r < R; r++) ((uint16_t *)g->ptr[r])[i] = b;
        }
    }
    return barrier(c, "all_reduce");
}

static int host_all_gather(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type)
{
    host_group *g = ((host_comm *)c->impl)->g;
    int rc = post(c, "all_gather", recv, send, count, 0);
    if (rc != SF_OK) return rc;
    const size_t bytes = count * sf_dtype_size(type);
    for (int r = 0; r < g->size; r++) memcpy((unsigned char *)recv + (size_t)r * bytes, g->cptr[r], bytes);
    return barrier(c, "all_gather");
}

static int host_broadcast(sf_comm *c, void *buf, size_t count, sf_dtype type, int root)
{
    host_group *g = ((host_comm *)c->impl)->g;
    int rc = post(c, "broadcast", buf, NULL, count, root);
    if (rc != SF_OK) return rc;
    if (c->rank != root && buf != g->ptr[root]) memcpy(buf, g->ptr[root], count * sf_dtype_size(type));
    return barrier(c, "broadcast");
}

static int host_send(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    const size_t bytes = count * sf_dtype_size(type);
    host_msg *m = malloc(sizeof *m + bytes);
    if (!m) return sf_error(SF_E_NOMEM, "send: out of memory for %zu bytes", bytes);
    m->next = NULL, m->bytes = bytes;
    memcpy(m->data, buf, bytes);
    pthread_mutex_lock(&g->lock);
    int rc = SF_OK;
    if (h->failed || g->aborted || stopped(c)) {
        rc = group_error(c, "send");
        free(m);
    } else {
        host_msg **tail = &g->mail[(size_t)peer * g->size + c->rank];
        while (*tail) tail = &(*tail)->next;
        *tail = m;
        pthread_cond_broadcast(&g->cond);
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int host_recv(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    const size_t bytes = count * sf_dtype_size(type);
    host_msg **box = &g->mail[(size_t)c->rank * g->size + peer];
    const double start = now_ms();
    int rc = SF_OK;
    pthread_mutex_lock(&g->lock);
    while (!*box && rc == SF_OK) {
        if (h->failed || g->aborted || stopped(c)) {
            rc = group_error(c, "recv");
            break;
        }
        const double left = c->timeout_ms - (now_ms() - start);
        if (left <= 0) {
            char why[160];
            snprintf(why, sizeof why, "rank %d timed out after %d ms receiving from rank %d", c->rank, c->timeout_ms, peer);
            abort_locked(c, why);
            h->failed = 1;
            rc = sf_error(SF_E_COMM, "recv on rank %d of %d: nothing from rank %d within %d ms", c->rank, c->size, peer,
                          c->timeout_ms);
            break;
        }
        struct timespec t = deadline_in(left);
        pthread_cond_timedwait(&g->cond, &g->lock, &t);
    }
    host_msg *m = rc == SF_OK ? *box : NULL;
    if (m) *box = m->next;
    pthread_mutex_unlock(&g->lock);
    if (!m) return rc;
    if (m->bytes != bytes)
        rc = sf_error(SF_E_COMM, "recv on rank %d: rank %d sent %zu bytes, %zu expected", c->rank, peer, m->bytes, bytes);
    else
        memcpy(buf, m->data, bytes);
    free(m);
    return rc;
}

static int host_probe(sf_comm *c, int peer, int exact)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    pthread_mutex_lock(&g->lock);
    const int ready = g->mail[(size_t)c->rank * g->size + peer] != NULL || h->failed || g->aborted || stopped(c);
    pthread_mutex_unlock(&g->lock);
    return ready;
}

static int host_nothing(sf_comm *c)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    pthread_mutex_lock(&g->lock);
    int rc = h->failed || g->aborted || stopped(c) ? group_error(c, "wait") : SF_OK;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int host_group_op(sf_comm *c) { return SF_OK; }

static int host_all_reduce_start(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket)
{
    *ticket = 0;
    return host_all_reduce(c, buf, count, type);
}

static int host_join(sf_comm *c, int ticket) { return SF_OK; }

static void host_abort(sf_comm *c, const char *why)
{
    host_comm *h = c->impl;
    pthread_mutex_lock(&h->g->lock);
    abort_locked(c, why);
    h->failed = 1;
    pthread_mutex_unlock(&h->g->lock);
}

static void group_free(host_group *g)
{
    for (int i = 0; g->mail && i < g->size * g->size; i++)
        for (host_msg *m = g->mail[i], *next; m; m = next) next = m->next, free(m);
    free(g->mail), free(g->ptr), free(g->cptr), free(g->count), free(g->root);
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

static void host_destroy(sf_comm *c)
{
    host_comm *h = c->impl;
    host_group *g = h->g;
    pthread_mutex_lock(&g->lock);
    const int last = --g->refs == 0;
    pthread_mutex_unlock(&g->lock);
    if (last) group_free(g);
    free(h);
    free(c);
}

static const sf_comm_ops host_ops = {
    .name = "host",
    .all_reduce = host_all_reduce,
    .all_gather = host_all_gather,
    .broadcast = host_broadcast,
    .send = host_send,
    .recv = host_recv,
    .group_begin = host_group_op,
    .group_end = host_group_op,
    .all_reduce_start = host_all_reduce_start,
    .join = host_join,
    .wait = host_nothing,
    .fence = host_nothing,
    .abort = host_abort,
    .destroy = host_destroy,
    .probe = host_probe,
};

int sf_comm_host_create(int size, sf_backend *be, int timeout_ms, sf_comm **comms)
{
    if (size < 1 || size > 4096) return sf_error(SF_E_INVAL, "host communicator: %d ranks (1 to 4096)", size);
    if (timeout_ms <= 0) return sf_error(SF_E_INVAL, "host communicator: timeout %d ms", timeout_ms);
    if (be && be->ops && strcmp(be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "host communicator: the %s backend's memory is not host memory (use NCCL)",
                        be->ops->name);
    host_group *g = calloc(1, sizeof *g);
    if (!g) return sf_error(SF_E_NOMEM, "out of memory");
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->size = size;
    g->ptr = calloc((size_t)size, sizeof *g->ptr);
    g->cptr = calloc((size_t)size, sizeof *g->cptr);
    g->count = calloc((size_t)size, sizeof *g->count);
    g->root = calloc((size_t)size, sizeof *g->root);
    g->mail = calloc((size_t)size * size, sizeof *g->mail);
    int rc = g->ptr && g->cptr && g->count && g->root && g->mail ? SF_OK : sf_error(SF_E_NOMEM, "out of memory");
    for (int r = 0; r < size; r++) comms[r] = NULL;
    for (int r = 0; r < size && rc == SF_OK; r++) {
        sf_comm *c = calloc(1, sizeof *c);
        host_comm *h = calloc(1, sizeof *h);
        if (!c || !h) {
            free(c), free(h);
            rc = sf_error(SF_E_NOMEM, "out of memory");
            break;
        }
        h->g = g;
        *c = (sf_comm){.ops = &host_ops, .impl = h, .rank = r, .size = size, .be = be, .timeout_ms = timeout_ms};
        g->refs++;
        comms[r] = c;
    }
    if (rc != SF_OK) {
        const int had = g->refs;
        for (int r = 0; r < size; r++) {
            if (comms[r]) free(comms[r]->impl), free(comms[r]);
            comms[r] = NULL;
        }
        (void)had;
        group_free(g);
    }
    return rc;
}

/* ---- NCCL: in the CUDA backend module (kernels/cuda/comm_nccl.cu), reached through it ---------- */
typedef int (*nccl_available_fn)(void);
typedef int (*nccl_unique_id_fn)(void *buf);
typedef int (*nccl_create_fn)(sf_backend *be, const void *id, int rank, int size, int timeout_ms, const int *stop,
                              sf_comm **out);
typedef int (*backend_device_fn)(sf_backend *be);
typedef int (*backend_uuid_fn)(sf_backend *be, unsigned char *uuid);

static void *module_fn(const char *name) { return sf_cuda_module_symbol(name); }

int sf_comm_nccl_available(void)
{
    nccl_available_fn f = (nccl_available_fn)(uintptr_t)module_fn("sf_cuda_comm_nccl_available");
    return f ? f() : 0;
}

int sf_comm_nccl_unique_id(void *buf)
{
    nccl_unique_id_fn f = (nccl_unique_id_fn)(uintptr_t)module_fn("sf_cuda_comm_nccl_unique_id");
    if (!f) return sf_error(SF_E_UNSUPPORTED, "this build has no NCCL (it needs CUDA and NCCL at build time)");
    return f(buf);
}

int sf_comm_nccl_create(sf_backend *be, const void *id, int rank, int size, int timeout_ms, sf_comm **out)
{
    return sf_comm_nccl_create_watched(be, id, rank, size, timeout_ms, NULL, out);
}

int sf_comm_nccl_create_watched(sf_backend *be, const void *id, int rank, int size, int timeout_ms, const int *stop,
                                sf_comm **out)
{
    nccl_create_fn f = (nccl_create_fn)(uintptr_t)module_fn("sf_cuda_comm_nccl_create_watched");
    if (!f) {
        if (out) *out = NULL;
        return sf_error(SF_E_UNSUPPORTED, "this build has no NCCL (it needs CUDA and NCCL at build time)");
    }
    return f(be, id, rank, size, timeout_ms, stop, out);
}

int sf_comm_backend_device(sf_backend *be)
{
    if (!be || !be->ops || strcmp(be->ops->name, "cuda") != 0) return -1;
    backend_device_fn f = (backend_device_fn)(uintptr_t)module_fn("sf_cuda_comm_backend_device");
    return f ? f(be) : -1;
}

int sf_comm_backend_gpu_uuid(sf_backend *be, unsigned char uuid[16])
{
    backend_uuid_fn f = (backend_uuid_fn)(uintptr_t)module_fn("sf_cuda_comm_backend_uuid");
    if (!f || sf_comm_backend_device(be) < 0)
        return sf_error(SF_E_UNSUPPORTED, "a GPU's UUID: the backend is not cuda");
    return f(be, uuid);
}
