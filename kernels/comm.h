/* Communicators: collectives among the R ranks of one job (the head-parallel blocks of
 * stages/block_shard.c split a block's heads over them). A communicator is one rank's handle:
 * every rank calls the same collectives in the same order with the same counts.
 *
 * A communicator is a table of operations (sf_comm_ops), as a backend is, so that another
 * transport is one more implementation. Three exist:
 *   - host (kernels/comm_host.c): the ranks are threads of one process, buffers are host
 *     memory (the CPU backend's). Shared memory and a barrier; sums are taken in rank order
 *     0, 1, ..., R-1 whatever the timing, so results are reproducible bit for bit.
 *   - NCCL (kernels/cuda/comm_nccl.cu): one GPU a rank, buffers are that GPU's memory (its
 *     CUDA backend's), operations issued on the backend's compute stream in order with its
 *     other ops. Joined non-blocking and polled against the timeout, then split into a
 *     blocking communicator for the collectives (NCCL starts a thread for each collective of
 *     a non-blocking one); on a timeout, an error, a peer's failure in this process
 *     (sf_comm_watch) or sf_comm_abort both are aborted (ncclCommAbort), so that no call
 *     hangs.
 *   - network (pipeline/comm_net.h): the ranks are processes joined by an sf_net's links, buffers
 *     are host memory; tagged messages over lossy links keep their error feedback per tag.
 *
 * Errors: SF_E_COMM with a message naming the operation, the rank and the cause ("timed out
 * after 2000 ms waiting for rank 1", "rank 1 aborted: ..."). After a failure every later
 * operation fails at once. Buffers are borrowed: backend memory of the communicator's backend
 * (host memory for the host communicator). */
#ifndef SEQFLOW_KERNELS_COMM_H
#define SEQFLOW_KERNELS_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/backend.h"
#include "seqflow/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_comm sf_comm;

#define SF_COMM_TICKETS 32 /* all_reduce_start tickets that may be unjoined at once */
#define SF_COMM_COPIES_IN_FLIGHT 3 /* reduce_add sums in flight at once where the copy engines sum */

/* Every operation returns SF_OK or SF_E_COMM (SF_E_INVAL for a bad argument). Counts are
 * elements of `type` (float32 or bf16; bf16 sums are taken in float32 and rounded once). */
typedef struct sf_comm_ops {
    const char *name;
    /* buf = the sum over the ranks of every rank's buf, in place. */
    int (*all_reduce)(sf_comm *c, void *buf, size_t count, sf_dtype type);
    /* recv[r * count ...] = rank r's send[0 .. count), for every r (recv holds size * count). */
    int (*all_gather)(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type);
    /* buf = root's buf on every rank. */
    int (*broadcast)(sf_comm *c, void *buf, size_t count, sf_dtype type, int root);
    /* Point to point: send's count elements to peer's matching recv. A send does not wait for
     * the receiver (host: copied; NCCL: issued on the stream), so two ranks may send to each
     * other first and receive after (NCCL: inside group_begin/group_end). */
    int (*send)(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer);
    int (*recv)(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer);
    /* Brackets point-to-point calls issued together (ncclGroupStart/End); host: nothing. */
    int (*group_begin)(sf_comm *c);
    int (*group_end)(sf_comm *c);
    /* all_reduce beside the backend's stream: it starts after the ops issued so far and runs
     * while the ops issued after it proceed (NCCL: on a stream of its own); join(ticket) makes
     * the ops issued after the join wait for it. Each start is joined before the next wait,
     * fence or SF_COMM_TICKETS more starts. Host: done at once, join does nothing. */
    int (*all_reduce_start)(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket);
    int (*join)(sf_comm *c, int ticket);
    /* Waits until every operation issued so far has finished (host: they have). */
    int (*wait)(sf_comm *c);
    /* Marks what has been issued so far and waits for the mark set by the previous fence:
     * a caller fencing once a unit of work (a segment) stays at most one unit ahead of the
     * device, and learns of a failure within one unit, without waiting for the work just
     * issued. */
    int (*fence)(sf_comm *c);
    /* Ends this rank's part: the other ranks' pending and later operations fail (host: at
     * once; NCCL: at their next poll in this process, by their timeout in others). */
    void (*abort)(sf_comm *c, const char *why);
    void (*destroy)(sf_comm *c);
    /* Optional (NULL: send/recv above, tag ignored): a send carrying a tag, for transports that
     * encode what they carry. The tag names the kind of message (e.g. one kind of state of one
     * layer): a lossy transport keeps its error feedback per tag, so the rounding of one message
     * is carried into the next message of the same tag only. exact != 0 asks for lossless
     * delivery whatever the transport's encoding (sizes, counters, anything not a value). The
     * receiver passes the same exact flag. Point-to-point order is per (peer, exact). */
    int (*send_tagged)(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer, uint64_t tag, int exact);
    int (*recv_tagged)(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer, int exact);
    /* Optional (NULL: never known): 1 when peer's next point-to-point message on the (exact)
     * link has arrived, so that a receive of it would not wait (or the communicator failed, so
     * that the receive would fail at once), 0 when it may wait. Never waits. For a caller that
     * has other work to do while a message travels. */
    int (*probe)(sf_comm *c, int peer, int exact);
    /* Optional (NULL: composed from all_reduce_start and join, with the backend's add): the
     * head-parallel parts' sum added to the rows. reduce_add_reserve, called by every rank at
     * set-up with the largest count it will pass (allow_copies 0: the composed form always), may
     * set up a faster transport (*copies 1: the copy engines; the same on every rank);
     * reduce_add_start starts, after the ops issued so far, summing every rank's part (count
     * elements of type); reduce_add_end(ticket) makes the ops issued after it wait for that sum
     * and adds it to x (count float32 elements), in rank order, so that every rank gets the same
     * bits. part must not change before the end, and its contents after it are undefined (the
     * composed form leaves the sum there). Starts are ended in their order, each before
     * the next wait or fence; at most SF_COMM_COPIES_IN_FLIGHT in flight with copies,
     * SF_COMM_TICKETS without. */
    int (*reduce_add_reserve)(sf_comm *c, size_t count, sf_dtype type, int allow_copies, int *copies);
    int (*reduce_add_start)(sf_comm *c, const void *part, size_t count, sf_dtype type, int *ticket);
    int (*reduce_add_end)(sf_comm *c, int ticket, float *x, const void *part, size_t count, sf_dtype type);
    /* Optional (NULL: composed from reduce_add and the backend's rmsnorm_typed, never split):
     * reduce_add for ranks whose products take normed rows (sf_be_normed_type), each sum over
     * `rows` rows of dim columns followed by the rows' norm.
     * reduce_norm_reserve, every rank at set-up: rows, the most rows one sum covers; x and u,
     * this rank's whole buffers of rows (float32) and of normed rows (bf16), laid out alike on
     * every rank, which the other ranks may write; *split 1 (the same on every rank) when each
     * rank adds and norms only its slice of each sum's rows (sf_comm_slice). Called again with
     * another x (this rank's rows moved; the same layout), it takes that x for the sums started
     * after it.
     * reduce_norm_start: reduce_add_start of part [rows, dim].
     * reduce_norm_end: x (rows of this rank's x) += the parts' sum, then with norm non-NULL u
     * (the same rows of this rank's u) = rmsnorm(x; norm, eps) rounded to bf16 on every rank.
     * Split, a rank adds and norms its slice and hands its normed rows to the others, so its
     * x holds the sum in its slices only; without a norm (a segment's last sum) the slices of
     * the sum are copied into rank 0's x instead, which then holds all of it.
     * reduce_norm_join: the ops issued after it wait for sum `ticket`'s rows from the other
     * ranks (split; nothing otherwise): ends may run ahead of their joins, so that a rank adds
     * the next sum while the last one's normed rows travel. Every end is joined, in order,
     * before the next wait or fence, and before SF_COMM_COPIES_IN_FLIGHT more starts. */
    int (*reduce_norm_reserve)(sf_comm *c, int rows, int dim, sf_dtype type, float *x, void *u, int allow_copies,
                               int *split);
    int (*reduce_norm_start)(sf_comm *c, const void *part, int rows, int dim, sf_dtype type, int *ticket);
    int (*reduce_norm_end)(sf_comm *c, int ticket, float *x, const void *part, int rows, int dim, sf_dtype type,
                           const float *norm, float eps, void *u);
    int (*reduce_norm_join)(sf_comm *c, int ticket);
    /* Optional (NULL: a broadcast of x, then every rank's norm): the rows a segment of
     * reduce_norm sums starts from, rank 0's. On every rank u = rmsnorm(rank 0's x; norm, eps) in
     * bf16 for all `rows` rows of dim columns, and x = rank 0's x: where the sums are split,
     * rank 0 norms alone and the others receive its normed rows (the ops issued after the call
     * wait for them) and its x, which only the next reduce_norm_end waits for, before its add.
     * x and u are the buffers given to reduce_norm_reserve (or the rows it took last). */
    int (*first_rows)(sf_comm *c, int rows, int dim, float *x, const float *norm, float eps, void *u);
    /* Optional (NULL: wait): ends a unit of work (a segment), after which the caller may block
     * on the device without looking (a download, a free). A wait where an op issued since the
     * last wait could leave the device waiting on a rank that fails (an NCCL kernel waits for
     * every peer); a fence where none could: the copy engines' sums make the device wait only
     * for parts the peers' hosts have already issued (comm_exchange.h), which finish whatever
     * becomes of those ranks later. A rank then issues the next unit while the device still
     * runs this one's tail, instead of idling between units for its host. */
    int (*end_unit)(sf_comm *c);
} sf_comm_ops;

struct sf_comm {
    const sf_comm_ops *ops;
    void *impl;
    int rank, size;
    sf_backend *be;              /* whose memory and stream the buffers and operations use */
    int timeout_ms;              /* how long one wait for the other ranks may take */
    const int *stop;             /* sf_comm_watch: non-zero ends every wait with SF_E_COMM (read
                                    with __atomic_load_n, written likewise) */
    int lost_peer;               /* set (atomically) by a transport whose failure was a peer it
                                    lost (dead or silent: the network's verdict), so that a
                                    distributed job may roll back rather than end */
};

/* The operations through the table (each checks its arguments first). */
int sf_comm_all_reduce(sf_comm *c, void *buf, size_t count, sf_dtype type);
int sf_comm_all_gather(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type);
int sf_comm_broadcast(sf_comm *c, void *buf, size_t count, sf_dtype type, int root);
int sf_comm_send(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer);
int sf_comm_recv(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer);
/* send/recv with a tag and an exactness flag (sf_comm_ops.send_tagged); plain send/recv where
 * the transport has no such op. */
int sf_comm_send_tagged(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer, uint64_t tag, int exact);
int sf_comm_recv_tagged(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer, int exact);
/* The probe (sf_comm_ops.probe): 1 when a receive from peer would not wait, 0 when it may (or
 * the transport cannot tell); SF_E_INVAL for a bad peer. */
int sf_comm_probe(sf_comm *c, int peer, int exact);
int sf_comm_all_reduce_start(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket);
int sf_comm_join(sf_comm *c, int ticket);
/* The parts' sum added to x (sf_comm_ops.reduce_add_*); composed where the transport has none:
 * all_reduce_start of part (which then holds the sum), join and the backend's add_typed
 * (SF_E_UNSUPPORTED on a backend without it: the CPU's, whose ranks sum float32 rows). */
int sf_comm_reduce_add_reserve(sf_comm *c, size_t count, sf_dtype type, int allow_copies, int *copies);
int sf_comm_reduce_add_start(sf_comm *c, void *part, size_t count, sf_dtype type, int *ticket);
int sf_comm_reduce_add_end(sf_comm *c, int ticket, float *x, void *part, size_t count, sf_dtype type);
/* The parts' sum added to the rows, then their norm (sf_comm_ops.reduce_norm_*). */
int sf_comm_reduce_norm_reserve(sf_comm *c, int rows, int dim, sf_dtype type, float *x, void *u, int allow_copies,
                                int *split);
int sf_comm_reduce_norm_start(sf_comm *c, void *part, int rows, int dim, sf_dtype type, int *ticket);
int sf_comm_reduce_norm_end(sf_comm *c, int ticket, float *x, void *part, int rows, int dim, sf_dtype type,
                            const float *norm, float eps, void *u);
int sf_comm_reduce_norm_join(sf_comm *c, int ticket);
/* A segment's first rows from rank 0, normed (sf_comm_ops.first_rows). */
int sf_comm_first_rows(sf_comm *c, int rows, int dim, float *x, const float *norm, float eps, void *u);
/* Rank r's slice of `rows` rows split over `size` ranks: rows [*first, *first + *count), the
 * slices in rank order, sizes differing by at most one. */
static inline void sf_comm_slice(int rows, int size, int rank, int *first, int *count)
{
    *first = (int)((long long)rows * rank / size);
    *count = (int)((long long)rows * (rank + 1) / size) - *first;
}
int sf_comm_group_begin(sf_comm *c);
int sf_comm_group_end(sf_comm *c);
int sf_comm_wait(sf_comm *c);
int sf_comm_fence(sf_comm *c);
/* The end of a unit of work (sf_comm_ops.end_unit): a wait or a fence, as the ops issued since
 * the last wait require. */
int sf_comm_end_unit(sf_comm *c);
void sf_comm_abort(sf_comm *c, const char *why);
/* Destroys the communicator (NULL accepted): after a wait where the ranks are healthy, an abort
 * where they are not, so that it never hangs. */
void sf_comm_free(sf_comm *c);
/* An in-process flag (e.g. a group of ranks' "someone failed") that ends this communicator's
 * waits when it becomes non-zero: the flag must outlive the communicator. NULL: none. */
void sf_comm_watch(sf_comm *c, const int *stop);

/* ---- host: ranks as threads of one process ------------------------------------------------ */

/* Creates the `size` communicators of one group into comms[0 .. size), one for each rank
 * (thread), all on backend be (a CPU backend: buffers are host memory; be may be NULL for
 * plain host memory). Each is freed with sf_comm_free by its own thread, in any order; the
 * shared state goes with the last. timeout_ms: how long a rank waits in a collective for the
 * others (> 0). */
int sf_comm_host_create(int size, sf_backend *be, int timeout_ms, sf_comm **comms);

/* ---- NCCL: one GPU a rank (a CUDA build with NCCL; SF_E_UNSUPPORTED otherwise) ------------ */

#define SF_COMM_NCCL_ID_BYTES 128

/* Whether this build has the NCCL communicator. */
int sf_comm_nccl_available(void);
/* A new unique id into buf (SF_COMM_NCCL_ID_BYTES bytes) for the ranks' sf_comm_nccl_create:
 * the caller hands the same bytes to every rank (threads: memory; processes: the rendezvous). */
int sf_comm_nccl_unique_id(void *buf);
/* This rank's communicator on be (a "cuda" backend; its device is the rank's GPU), joining the
 * `size` ranks of id. Waits up to timeout_ms for every rank to join: SF_E_COMM naming the
 * rank, the size and the time otherwise (and nothing left allocated). The caller owns *out. */
int sf_comm_nccl_create(sf_backend *be, const void *id, int rank, int size, int timeout_ms, sf_comm **out);

/* sf_comm_nccl_create that also gives up (SF_E_COMM) when *stop becomes non-zero while the
 * ranks join, and then watches it (sf_comm_watch): for ranks that are threads of one process,
 * where one failing before it joins would leave the others waiting out the timeout. */
int sf_comm_nccl_create_watched(sf_backend *be, const void *id, int rank, int size, int timeout_ms, const int *stop,
                                sf_comm **out);

/* The GPU ordinal of a "cuda" backend; -1 for any other. */
int sf_comm_backend_device(sf_backend *be);
/* The UUID of a "cuda" backend's GPU into uuid (16 bytes): the same GPU gives the same bytes in
 * every process, whatever CUDA_VISIBLE_DEVICES numbers it (so that ranks that are processes can
 * tell that two of them would share one). SF_E_UNSUPPORTED for any other backend. */
int sf_comm_backend_gpu_uuid(sf_backend *be, unsigned char uuid[16]);

#ifdef __cplusplus
}
#endif
#endif
