/* Head-parallel parts exchanged by the copy engines and peer access (comm_exchange.h).
 *
 * Op k of a rank (its k-th start, ended in the same order) uses inbox slot k % SLOTS. Rank r's
 * start(k) copies its part, on the communicator's side stream once the compute stream has made
 * it, into slot k % SLOTS, row r, of every peer's inbox, then records delivered[slot] and
 * publishes k + 1 as its count of deliveries. Rank r's end(k) makes its compute stream wait for
 * every peer's delivered[slot] of op k (and its own: the part may be rewritten after the end),
 * adds all the parts to its rows, records consumed[slot] and publishes k + 1 as its count of
 * consumptions. Before rank r copies op k into a peer's slot, its side stream waits for that
 * peer's consumed[slot] of op k - SLOTS: the slot is free again.
 *
 * An event is waited for only once the host has seen it recorded (the published counts), and is
 * not recorded again before every wait on it has been issued: a peer records delivered[slot]
 * for op k + SLOTS only after waiting for this rank's consumed[slot] of op k, which this rank
 * records after issuing its wait on the peer's delivered[slot] of op k; the same holds the other
 * way. A rank's host waits for its peers' counts spin, then sleep, and end with SF_E_COMM on
 * the communicator's watch flag, an abort of the group, or its timeout.
 *
 * So a rank must end op k before it starts op k + SLOTS (the block's chunks: at most SLOTS sums
 * in flight); the start of k + SLOTS would otherwise wait for a peer's end of k that the peer
 * issues only after its own start of k + SLOTS. sf_exchange_start refuses it.
 *
 * Split ops (reduce_norm): start copies each peer only its slice of the part; end adds and norms
 * this rank's slice, its kernel also storing the normed rows into every peer's registered
 * buffer (or, without a norm, a copy on the gather stream takes the rows to rank 0), records
 * gathered[slot] after that and publishes k + 1 as its count of slices sent; join makes the
 * compute stream wait for every peer's gathered[slot] of op k, and only then publishes the
 * consumption. Ends may run ahead of joins; a start of k + SLOTS waits for the peers' joins of
 * op k, which come after their waits on this rank's gathered[slot] of op k, so gathered too is
 * recorded again only after every wait on it was issued.
 *
 * A segment's first rows (first_rows, split sums only): rank 0 norms them and marks them made;
 * every other rank copies the normed rows into its registered buffer on its compute stream,
 * then the rows on its gather stream, and its first split end waits for the rows, its first
 * start too (rank 0's add must not change the rows before they are copied). The copy engines
 * carry it, so rank 0's multiprocessors go straight on to the segment's products, and the
 * others wait only for the normed rows, half the bytes of the float32 rows a broadcast would
 * send first. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/comm_exchange.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/host_wait.h"

#define SLOTS SF_COMM_COPIES_IN_FLIGHT
#define MAX_RANKS SF_CUDA_ADD_PARTS_MAX /* one sum adds every rank's part */

typedef struct group group;

struct sf_exchange {
    group *g;
    sf_comm *c; /* rank, size, timeout and watch flag */
    int device;
    size_t capacity;      /* bytes a part may have (0 until reserved) */
    unsigned char *inbox; /* [SLOTS][size][capacity] on this rank's GPU */
    cudaEvent_t delivered[SLOTS], consumed[SLOTS], ready;
    long long started, ended, joined; /* ops started, ended and joined by this rank (a whole
                                         sum's end joins it; a split sum's join comes after) */
    /* split sums (sf_exchange_register): this rank's whole rows and normed rows, which the
     * others write their slices into, and the stream and events of those copies */
    float *rows_base;
    unsigned char *normed_base;
    cudaStream_t gather;
    cudaEvent_t gathered[SLOTS];
    int normed_op[SLOTS]; /* whether the split op of a slot, ended and not yet joined, normed */
    /* a segment's first rows (sf_exchange_first_rows): rank 0's mark that its rows and normed
     * rows are made (rows_ready, and the rows' address then, first_rows_at), and each other
     * rank's marks that it has copied them in (normed_in, rows_in) */
    cudaEvent_t rows_ready, normed_in, rows_in;
    const float *first_rows_at;
    long long firsts;          /* first_rows calls by this rank */
    int rows_owed, parts_owed; /* another rank's: its next split end, and its next start, wait for
                                  rows_in first */
};

struct group {
    unsigned char id[SF_COMM_NCCL_ID_BYTES];
    int size, joined, refs;
    sf_exchange *member[MAX_RANKS];
    /* reserve's rendezvous: votes (1 usable, -1 not) and arrivals */
    int vote[MAX_RANKS], arrived;
    long long delivered[MAX_RANKS], consumed[MAX_RANKS]; /* counts published by each rank */
    long long gathered[MAX_RANKS];                       /* split sums: slices copied out */
    long long firsts_made, firsts_taken[MAX_RANKS];      /* first rows: rank 0's, the others' */
    int aborted;
    group *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static group *registry;

/* Waits until *count >= want (another rank's published count): SF_OK, or SF_E_COMM on an
 * abort of the group, the watch flag or the timeout. */
static int wait_count(sf_exchange *x, const long long *count, long long want, int peer, const char *what)
{
    const double start = sf_host_now_ms();
    for (long spins = 0; __atomic_load_n(count, __ATOMIC_ACQUIRE) < want; spins++) {
        const char *why = NULL;
        if (__atomic_load_n(&x->g->aborted, __ATOMIC_ACQUIRE))
            why = "the exchange was aborted";
        else if (x->c->stop && __atomic_load_n(x->c->stop, __ATOMIC_ACQUIRE))
            why = "stopped: another rank of this process failed";
        else if (sf_host_now_ms() - start > x->c->timeout_ms)
            why = "timed out";
        if (why)
            return sf_error(SF_E_COMM, "exchange on rank %d of %d: waiting for rank %d's %s of op %lld: %s", x->c->rank,
                            x->c->size, peer, what, want - 1, why);
        if (spins > 1000) sf_host_pause_us(spins > 20000 ? 100 : 5);
    }
    return SF_OK;
}

static int wait_rows_owed(sf_exchange *x, cudaStream_t stream);

int sf_exchange_join(const void *id, sf_comm *c, sf_exchange **out)
{
    *out = NULL;
    if (c->size < 2 || c->size > MAX_RANKS) return SF_OK; /* nothing to exchange, or too many for one op */
    sf_exchange *x = new sf_exchange();
    x->c = c, x->device = sf_cuda_of(c->be)->device;
    pthread_mutex_lock(&registry_lock);
    group *g = registry;
    while (g && (g->size != c->size || memcmp(g->id, id, SF_COMM_NCCL_ID_BYTES) != 0)) g = g->next;
    if (!g) {
        g = new group();
        memcpy(g->id, id, SF_COMM_NCCL_ID_BYTES);
        g->size = c->size, g->next = registry, registry = g;
    }
    if (g->member[c->rank]) { /* the same rank twice in this process: not ours to exchange */
        pthread_mutex_unlock(&registry_lock);
        delete x;
        return SF_OK;
    }
    g->member[c->rank] = x, g->joined++, g->refs++;
    x->g = g;
    pthread_mutex_unlock(&registry_lock);
    *out = x;
    return SF_OK;
}

static void free_member(sf_exchange *x)
{
    cudaSetDevice(x->device);
    for (int s = 0; s < SLOTS; s++) {
        if (x->delivered[s]) cudaEventDestroy(x->delivered[s]);
        if (x->consumed[s]) cudaEventDestroy(x->consumed[s]);
    }
    if (x->ready) cudaEventDestroy(x->ready);
    for (int s = 0; s < SLOTS; s++)
        if (x->gathered[s]) cudaEventDestroy(x->gathered[s]);
    cudaEvent_t first_events[] = {x->rows_ready, x->normed_in, x->rows_in};
    for (cudaEvent_t e : first_events)
        if (e) cudaEventDestroy(e);
    if (x->gather) cudaStreamDestroy(x->gather);
    if (x->inbox) cudaFree(x->inbox);
    cudaGetLastError();
    delete x;
}

void sf_exchange_leave(sf_exchange *x)
{
    if (!x) return;
    /* the last rank out frees every rank's inbox and events: a peer that failed may still
     * have waits on them in its queues until then */
    int was = -1;
    cudaGetDevice(&was);
    pthread_mutex_lock(&registry_lock);
    group *g = x->g;
    if (--g->refs == 0) {
        for (group **p = &registry; *p; p = &(*p)->next)
            if (*p == g) {
                *p = g->next;
                break;
            }
        for (int r = 0; r < g->size; r++)
            if (g->member[r]) free_member(g->member[r]);
        delete g;
    }
    pthread_mutex_unlock(&registry_lock);
    if (was >= 0) cudaSetDevice(was);
}

void sf_exchange_abort(sf_exchange *x)
{
    if (x) __atomic_store_n(&x->g->aborted, 1, __ATOMIC_RELEASE);
}

/* This rank's part of the set-up: peer access to every other rank's GPU, the inbox, the
 * events. 1 when all of it is there. */
static int prepare(sf_exchange *x, size_t bytes)
{
    group *g = x->g;
    if (cudaSetDevice(x->device) != cudaSuccess) return 0;
    for (int p = 0; p < g->size; p++) {
        if (p == x->c->rank) continue;
        const int peer = g->member[p]->device;
        int can = 0;
        if (peer == x->device || cudaDeviceCanAccessPeer(&can, x->device, peer) != cudaSuccess || !can) return 0;
        const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) return 0;
        cudaGetLastError(); /* "already enabled" must not linger */
    }
    if (cudaMalloc(&x->inbox, (size_t)SLOTS * g->size * bytes) != cudaSuccess) return 0;
    for (int s = 0; s < SLOTS; s++)
        if (cudaEventCreateWithFlags(&x->delivered[s], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&x->consumed[s], cudaEventDisableTiming) != cudaSuccess)
            return 0;
    if (cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming) != cudaSuccess) return 0;
    x->capacity = bytes;
    return 1;
}

int sf_exchange_reserve(sf_exchange *x, size_t bytes, int allow, int *usable)
{
    *usable = 0;
    if (!x) return SF_OK;
    group *g = x->g;
    if (x->capacity) { /* reserved before: the same answer, if the parts still fit */
        *usable = bytes <= x->capacity;
        return SF_OK;
    }
    /* ranks in other processes (head ranks that are processes) never complete the group here,
     * and in every process alike; the threads of one process all joined it before NCCL let
     * any of them through creation */
    pthread_mutex_lock(&registry_lock);
    const int complete = g->joined == g->size;
    pthread_mutex_unlock(&registry_lock);
    if (!complete) return SF_OK;
    const int ok = allow && bytes > 0 && prepare(x, bytes);
    cudaGetLastError();
    __atomic_store_n(&g->vote[x->c->rank], ok ? 1 : -1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&g->arrived, 1, __ATOMIC_ACQ_REL);
    const double start = sf_host_now_ms();
    while (__atomic_load_n(&g->arrived, __ATOMIC_ACQUIRE) < g->size) {
        const char *why = NULL;
        if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE))
            why = "the exchange was aborted";
        else if (x->c->stop && __atomic_load_n(x->c->stop, __ATOMIC_ACQUIRE))
            why = "stopped: another rank of this process failed";
        else if (sf_host_now_ms() - start > x->c->timeout_ms)
            why = "timed out";
        if (why) return sf_error(SF_E_COMM, "exchange on rank %d of %d: setting up: %s", x->c->rank, x->c->size, why);
        sf_host_pause_us(50);
    }
    int all = 1;
    for (int r = 0; r < g->size; r++) all &= __atomic_load_n(&g->vote[r], __ATOMIC_ACQUIRE) > 0;
    *usable = all;
    if (!all) x->capacity = 0; /* the inbox stays allocated until the group ends; never used */
    return SF_OK;
}

/* Op k's copies of the part to every peer: to peer p `bytes` from part + offset(p) (split: the
 * peer's slice of the rows; else all of it, offset 0). */
static int start_copies(sf_exchange *x, cudaStream_t stream, cudaStream_t side, const unsigned char *part, size_t bytes,
                        int rows, size_t row_bytes, int *ticket)
{
    group *g = x->g;
    const int rank = x->c->rank;
    const long long k = x->started;
    if (bytes > x->capacity)
        return sf_error(SF_E_INVAL, "exchange: a part of %zu bytes, reserved for %zu", bytes, x->capacity);
    if (k - x->joined >= SLOTS)
        return sf_error(SF_E_INVAL, "exchange: %d exchanges already in flight (end and join one first)", SLOTS);
    const int slot = (int)(k % SLOTS);
    int rc = sf_cuda_status(cudaEventRecord(x->ready, stream), "exchange (part ready)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(side, x->ready, 0), "exchange (part ready)");
    if (rc == SF_OK && x->parts_owed) { /* the peers add to rows this rank copies in: not before */
        x->parts_owed = 0;
        rc = sf_cuda_status(cudaStreamWaitEvent(side, x->rows_in, 0), "exchange (rows in)");
    }
    for (int p = 0; p < g->size && rc == SF_OK; p++) {
        if (p == rank) continue;
        sf_exchange *peer = g->member[p];
        if (k >= SLOTS) { /* the peer's slot is free once it ended op k - SLOTS */
            rc = wait_count(x, &g->consumed[p], k - SLOTS + 1, p, "end");
            if (rc == SF_OK)
                rc = sf_cuda_status(cudaStreamWaitEvent(side, peer->consumed[slot], 0), "exchange (slot free)");
        }
        unsigned char *dst = peer->inbox + ((size_t)slot * g->size + rank) * peer->capacity;
        const unsigned char *src = part;
        size_t n = bytes;
        if (rows >= 0) { /* split: the peer's slice */
            int first, count;
            sf_comm_slice(rows, g->size, p, &first, &count);
            src += (size_t)first * row_bytes, n = (size_t)count * row_bytes;
        }
        if (rc == SF_OK && n)
            rc = sf_cuda_status(cudaMemcpyPeerAsync(dst, peer->device, src, x->device, n, side), "exchange copy");
    }
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->delivered[slot], side), "exchange (delivered)");
    if (rc != SF_OK) return rc;
    x->started = k + 1;
    __atomic_store_n(&g->delivered[rank], k + 1, __ATOMIC_RELEASE);
    *ticket = (int)(k % SF_COMM_TICKETS);
    return SF_OK;
}

int sf_exchange_start(sf_exchange *x, cudaStream_t stream, cudaStream_t side, const void *part, size_t bytes,
                      int *ticket)
{
    return start_copies(x, stream, side, (const unsigned char *)part, bytes, -1, 0, ticket);
}

int sf_exchange_start_split(sf_exchange *x, cudaStream_t stream, cudaStream_t side, const void *part, int rows, int dim,
                            int *ticket)
{
    if (!x->rows_base) return sf_error(SF_E_INVAL, "exchange: a split sum before the rows were registered");
    const size_t row_bytes = (size_t)dim * 2;
    int first, count;
    sf_comm_slice(rows, x->g->size, x->g->size - 1, &first, &count); /* the last slice is the largest */
    return start_copies(x, stream, side, (const unsigned char *)part, (size_t)count * row_bytes, rows, row_bytes,
                        ticket);
}

/* Op k's parts in rank order into ps (this rank's `own`, the others' in this inbox), `stream`
 * made to wait for the peers' copies into the inbox and this rank's own out of its part. */
static int wait_parts(sf_exchange *x, cudaStream_t stream, long long k, const void *own, const void **ps)
{
    group *g = x->g;
    const int rank = x->c->rank, slot = (int)(k % SLOTS);
    int rc = SF_OK;
    for (int p = 0; p < g->size && rc == SF_OK; p++) {
        if (p != rank) rc = wait_count(x, &g->delivered[p], k + 1, p, "part");
        if (rc == SF_OK)
            rc = sf_cuda_status(cudaStreamWaitEvent(stream, g->member[p]->delivered[slot], 0), "exchange (wait)");
        ps[p] = p == rank ? own : (const void *)(x->inbox + ((size_t)slot * g->size + p) * x->capacity);
    }
    return rc;
}

int sf_exchange_end(sf_exchange *x, cudaStream_t stream, int ticket, float *rows, const void *part, size_t count,
                    int bf16)
{
    group *g = x->g;
    const int rank = x->c->rank;
    const long long k = x->ended;
    if (k >= x->started || k != x->joined || ticket != (int)(k % SF_COMM_TICKETS))
        return sf_error(SF_E_INVAL, "exchange: end of ticket %d out of order", ticket);
    const int slot = (int)(k % SLOTS);
    const void *ps[MAX_RANKS];
    int rc = wait_parts(x, stream, k, part, ps);
    if (rc != SF_OK) return rc;
    /* in rank order: every rank gets the same bits */
    rc = sf_cuda_add_parts(ps, g->size, count, rows, bf16, stream);
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->consumed[slot], stream), "exchange (consumed)");
    if (rc != SF_OK) return rc;
    x->ended = x->joined = k + 1;
    __atomic_store_n(&g->consumed[rank], k + 1, __ATOMIC_RELEASE);
    return SF_OK;
}

int sf_exchange_register(sf_exchange *x, float *rows, void *normed)
{
    if (!x || !x->capacity) return sf_error(SF_E_INVAL, "exchange: rows registered without a reserved exchange");
    if (x->rows_base) { /* registered before: the normed rows stay, the rows may move */
        if (x->normed_base != normed) return sf_error(SF_E_INVAL, "exchange: other normed rows registered");
        __atomic_store_n(&x->rows_base, rows, __ATOMIC_RELEASE);
        return SF_OK;
    }
    int rc = sf_cuda_status(cudaSetDevice(x->device), "exchange (device)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaStreamCreateWithFlags(&x->gather, cudaStreamNonBlocking), "exchange stream");
    for (int s = 0; s < SLOTS && rc == SF_OK; s++)
        rc = sf_cuda_status(cudaEventCreateWithFlags(&x->gathered[s], cudaEventDisableTiming), "exchange events");
    cudaEvent_t *first_events[] = {&x->rows_ready, &x->normed_in, &x->rows_in};
    for (cudaEvent_t *e : first_events)
        if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "exchange events");
    if (rc != SF_OK) return rc;
    /* published before the peers' first split op reads them: their ops start after every
     * rank's set-up returned (the block's warm-up is a collective) */
    __atomic_store_n(&x->normed_base, (unsigned char *)normed, __ATOMIC_RELEASE);
    __atomic_store_n(&x->rows_base, rows, __ATOMIC_RELEASE);
    return SF_OK;
}

/* Copies this rank's slice of op k's rows (after the add on `stream`) into rank 0's rows on the
 * gather stream, then publishes the copy (the segment's last sums). */
static int rows_to_root(sf_exchange *x, long long k, int first, int count, int dim, const float *rows)
{
    group *g = x->g;
    const int rank = x->c->rank, slot = (int)(k % SLOTS);
    int rc = sf_cuda_status(cudaStreamWaitEvent(x->gather, x->consumed[slot], 0), "exchange (slice ready)");
    if (rc == SF_OK && rank != 0 && count) {
        sf_exchange *root = g->member[0];
        const float *root_rows = __atomic_load_n(&root->rows_base, __ATOMIC_ACQUIRE);
        if (!root_rows) return sf_error(SF_E_INVAL, "exchange: rank 0 registered no rows");
        const size_t at = (size_t)(rows - x->rows_base) + (size_t)first * dim;
        rc = sf_cuda_status(cudaMemcpyPeerAsync((void *)(root_rows + at), root->device, rows + (size_t)first * dim,
                                                x->device, (size_t)count * dim * sizeof(float), x->gather),
                            "exchange copy (rows)");
    }
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->gathered[slot], x->gather), "exchange (gathered)");
    if (rc == SF_OK) __atomic_store_n(&g->gathered[rank], k + 1, __ATOMIC_RELEASE);
    return rc;
}

int sf_exchange_end_split(sf_exchange *x, cudaStream_t stream, int ticket, float *rows, const void *part, int nrows,
                          int dim, const float *norm, float eps, void *normed)
{
    group *g = x->g;
    const int rank = x->c->rank;
    const long long k = x->ended;
    if (k >= x->started || ticket != (int)(k % SF_COMM_TICKETS))
        return sf_error(SF_E_INVAL, "exchange: end of ticket %d out of order", ticket);
    const int slot = (int)(k % SLOTS);
    int first, count;
    sf_comm_slice(nrows, g->size, rank, &first, &count);
    const void *ps[MAX_RANKS];
    int rc = wait_parts(x, stream, k, (const unsigned char *)part + (size_t)first * dim * 2, ps);
    if (rc == SF_OK) rc = wait_rows_owed(x, stream);
    unsigned char *u = norm ? (unsigned char *)normed : NULL;
    /* with a norm, the kernel writes this rank's normed slice into every peer's normed rows as
     * well (peer access): they have it when the kernel ends, with no copy to start and wait for */
    __nv_bfloat16 *also[MAX_RANKS];
    int n_also = 0;
    for (int p = 0; p < g->size && rc == SF_OK && u; p++) {
        if (p == rank) continue;
        unsigned char *peer_normed = __atomic_load_n(&g->member[p]->normed_base, __ATOMIC_ACQUIRE);
        if (!peer_normed) return sf_error(SF_E_INVAL, "exchange: rank %d registered no rows", p);
        also[n_also++] = (__nv_bfloat16 *)(peer_normed + (size_t)(u - x->normed_base) + (size_t)first * dim * 2);
    }
    /* in rank order: the same bits as every rank adding all rows */
    if (rc == SF_OK && count)
        rc = sf_cuda_add_parts_norm(ps, g->size, count, dim, rows + (size_t)first * dim, norm, eps,
                                    u ? (__nv_bfloat16 *)(u + (size_t)first * dim * 2) : NULL, also, n_also, stream);
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->consumed[slot], stream), "exchange (consumed)");
    if (rc == SF_OK && u) { /* the normed slice is with the peers once the kernel ended */
        rc = sf_cuda_status(cudaEventRecord(x->gathered[slot], stream), "exchange (gathered)");
        if (rc == SF_OK) __atomic_store_n(&g->gathered[rank], k + 1, __ATOMIC_RELEASE);
    } else if (rc == SF_OK) {
        rc = rows_to_root(x, k, first, count, dim, rows);
    }
    if (rc != SF_OK) return rc;
    x->ended = k + 1;
    x->normed_op[slot] = norm != NULL;
    return SF_OK;
}

int sf_exchange_join_split(sf_exchange *x, cudaStream_t stream, int ticket)
{
    group *g = x->g;
    const int rank = x->c->rank;
    const long long k = x->joined;
    if (k >= x->ended || ticket != (int)(k % SF_COMM_TICKETS))
        return sf_error(SF_E_INVAL, "exchange: join of ticket %d out of order", ticket);
    const int slot = (int)(k % SLOTS), normed = x->normed_op[slot];
    int rc = SF_OK;
    /* every peer's normed slice (its add and norm kernel, which wrote it here); or, without a
     * norm, every slice's rows (rank 0 reads them, and each rank's next write of its rows must
     * follow its own copy out) */
    for (int p = 0; p < g->size && rc == SF_OK; p++) {
        if (normed && p == rank) continue;
        rc = wait_count(x, &g->gathered[p], k + 1, p, "slice");
        if (rc == SF_OK)
            rc = sf_cuda_status(cudaStreamWaitEvent(stream, g->member[p]->gathered[slot], 0), "exchange (wait slice)");
    }
    if (rc != SF_OK) return rc;
    /* published last: a peer re-records its events of this slot only after it (see above) */
    x->joined = k + 1;
    __atomic_store_n(&g->consumed[rank], k + 1, __ATOMIC_RELEASE);
    return SF_OK;
}

/* A non-root rank's wait for its copy of the segment's first rows, owed since first_rows to
 * the first split end (whose add reads them). */
static int wait_rows_owed(sf_exchange *x, cudaStream_t stream)
{
    if (!x->rows_owed) return SF_OK;
    x->rows_owed = 0;
    return sf_cuda_status(cudaStreamWaitEvent(stream, x->rows_in, 0), "exchange (wait rows)");
}

/* Rank 0, segment k: marks its rows and normed rows made (rows_ready) and publishes k + 1. Its
 * host waits for nothing but the others' waits on segment k - 1's mark (issued long before: the
 * rank waits for the end of each segment), so it goes straight on to the segment's products. */
static int mark_first_rows(sf_exchange *x, cudaStream_t stream, long long k)
{
    group *g = x->g;
    int rc = SF_OK;
    for (int p = 1; p < g->size && rc == SF_OK; p++) rc = wait_count(x, &g->firsts_taken[p], k, p, "first rows");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->rows_ready, stream), "exchange (rows ready)");
    if (rc != SF_OK) return rc;
    __atomic_store_n(&x->first_rows_at, x->rows_base, __ATOMIC_RELEASE);
    __atomic_store_n(&g->firsts_made, k + 1, __ATOMIC_RELEASE);
    return SF_OK;
}

/* Another rank, segment k: once rank 0 marked them, copies rank 0's normed rows in on `stream`
 * (the products after it wait for them), then its rows on the gather stream (after every op
 * so far on `stream`: this rank's previous segment is done with its rows), owed to the next
 * split end and start. Rank 0 changes neither before this rank's parts of the segment reach it
 * (they follow the copies), and marks again only after this rank published its waits on the
 * mark (firsts_taken). */
static int take_first_rows(sf_exchange *x, cudaStream_t stream, long long k, int rows, int dim)
{
    group *g = x->g;
    sf_exchange *root = g->member[0];
    int rc = wait_rows_owed(x, stream); /* a segment without a split end or start (none in the block) */
    x->parts_owed = 0;
    if (rc == SF_OK) rc = wait_count(x, &g->firsts_made, k + 1, 0, "first rows");
    if (rc != SF_OK) return rc;
    const float *root_rows = __atomic_load_n(&root->first_rows_at, __ATOMIC_ACQUIRE);
    rc = sf_cuda_status(cudaStreamWaitEvent(stream, root->rows_ready, 0), "exchange (wait first rows)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaMemcpyPeerAsync(x->normed_base, x->device, root->normed_base, root->device,
                                                (size_t)rows * dim * 2, stream),
                            "exchange copy (first normed rows)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->normed_in, stream), "exchange (normed rows in)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(x->gather, x->normed_in, 0), "exchange (normed rows in)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaMemcpyPeerAsync(x->rows_base, x->device, root_rows, root->device,
                                                (size_t)rows * dim * sizeof(float), x->gather),
                            "exchange copy (first rows)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(x->rows_in, x->gather), "exchange (rows in)");
    if (rc != SF_OK) return rc;
    x->rows_owed = x->parts_owed = 1;
    __atomic_store_n(&g->firsts_taken[x->c->rank], k + 1, __ATOMIC_RELEASE);
    return SF_OK;
}

int sf_exchange_first_rows(sf_exchange *x, cudaStream_t stream, int rows, int dim, const float *own_rows,
                           const void *own_normed)
{
    if (!x->rows_base || !x->normed_base)
        return sf_error(SF_E_INVAL, "exchange: first rows before the rows were registered");
    if (own_rows != x->rows_base || own_normed != x->normed_base)
        return sf_error(SF_E_INVAL, "exchange: first rows in other buffers than the registered ones");
    const long long k = x->firsts;
    const int rc = x->c->rank == 0 ? mark_first_rows(x, stream, k) : take_first_rows(x, stream, k, rows, dim);
    if (rc == SF_OK) x->firsts = k + 1;
    return rc;
}
