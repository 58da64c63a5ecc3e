/* The NCCL communicator (kernels/comm.h): one rank a GPU, operations issued on the rank's CUDA
 * backend's compute stream under its lock, so that they sit in order between its other ops.
 *
 * The communicator is non-blocking (config.blocking = 0): creation and any call that answers
 * ncclInProgress are polled with ncclCommGetAsyncError, never waited for blindly. A collective
 * whose peer never comes keeps its kernel spinning on the GPU: wait and fence poll an event
 * behind it (cudaEventQuery), the communicator's asynchronous error and the watch flag, and past
 * the timeout abort the communicator (ncclCommAbort ends the spinning kernel), so that the
 * caller gets SF_E_COMM instead of a hang. Built only with NCCL (SEQFLOW_HAVE_NCCL). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/comm.h"
#include "kernels/cuda/comm_exchange.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/host_wait.h"

extern "C" int sf_cuda_comm_backend_device(sf_backend *be)
{
    if (!be || !be->ops || strcmp(be->ops->name, "cuda") != 0) return -1;
    return sf_cuda_of(be)->device;
}

extern "C" int sf_cuda_comm_backend_uuid(sf_backend *be, unsigned char *uuid)
{
    const int device = sf_cuda_comm_backend_device(be);
    if (device < 0) return sf_error(SF_E_UNSUPPORTED, "a GPU's UUID: the backend is not cuda");
    cudaDeviceProp p;
    int rc = sf_cuda_status(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    if (rc == SF_OK) memcpy(uuid, p.uuid.bytes, 16);
    return rc;
}

#ifdef SEQFLOW_HAVE_NCCL
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) <= SF_COMM_NCCL_ID_BYTES, "ncclUniqueId larger than SF_COMM_NCCL_ID_BYTES");

typedef struct nccl_comm {
    ncclComm_t comm;   /* the collectives' communicator: blocking (see split_blocking) */
    ncclComm_t parent; /* the non-blocking one it was split from; NULL where the split was not made */
    /* all_reduce_start: its own stream, and per ticket an event where it may start (on the
     * backend's stream) and one where it is done (on this stream) */
    cudaStream_t side;
    cudaEvent_t start[SF_COMM_TICKETS], done[SF_COMM_TICKETS];
    int next_ticket;
    int failed;            /* aborted or broken: every later call fails at once */
    char why[200];         /* what broke it */
    cudaEvent_t mark[2];   /* fence: the mark set last (cur) and the one before */
    int cur, marks;        /* index of the last mark, marks set so far (0, 1, 2+) */
    sf_exchange *exchange; /* the ranks as threads of this process (comm_exchange.h), or NULL */
    int copies;            /* reduce_add through the exchange's copy engines (reserved) */
    int split;             /* reduce_norm split over the ranks by the exchange (registered) */
    long kernels;          /* NCCL calls issued since the last wait: each may leave the device
                              waiting for a peer (end_unit) */
} nccl_comm;

static int stopped(const sf_comm *c) { return c->stop && __atomic_load_n(c->stop, __ATOMIC_ACQUIRE); }

/* Aborts the NCCL communicator once (ncclCommAbort frees it) and records why. */
static void break_comm(sf_comm *c, const char *why)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (n->failed) return;
    n->failed = 1;
    snprintf(n->why, sizeof n->why, "%s", why);
    sf_exchange_abort(n->exchange);
    cudaSetDevice(sf_cuda_of(c->be)->device);
    if (n->comm) ncclCommAbort(n->comm);
    if (n->parent && n->parent != n->comm) ncclCommAbort(n->parent);
    n->comm = n->parent = NULL;
}

static int failed_error(sf_comm *c, const char *op)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    return sf_error(SF_E_COMM, "NCCL %s on rank %d of %d: the communicator was aborted earlier: %s", op, c->rank, c->size,
                    n->why);
}

/* Polls the communicator until it leaves ncclInProgress: SF_OK, or SF_E_COMM (aborted) on an
 * error, the watch flag or the timeout. */
static int settle_on(sf_comm *c, ncclComm_t comm, ncclResult_t first, const char *op)
{
    ncclResult_t st = first;
    const double start = sf_host_now_ms();
    char why[200];
    /* A non-blocking communicator may answer "in progress" for a call that is only moments
     * from issued: a spin first, then short sleeps, then long ones (a connection being set
     * up). A fixed sleep would add its length to the host time of every such collective, and
     * the device waits for the host where a segment ends in a wait (sf_comm_wait). */
    for (long spins = 0; st == ncclInProgress; spins++) {
        if (stopped(c)) {
            snprintf(why, sizeof why, "%s stopped: another rank of this process failed", op);
            break;
        }
        if (sf_host_now_ms() - start > c->timeout_ms) {
            snprintf(why, sizeof why, "%s timed out after %d ms (a rank never joined or stopped answering)", op,
                     c->timeout_ms);
            break;
        }
        if (spins > 200) sf_host_pause_us(spins > 2000 ? 100 : 10);
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) st = ncclInternalError;
    }
    if (st == ncclSuccess) return SF_OK;
    if (st != ncclInProgress)
        snprintf(why, sizeof why, "%s failed: %s (%s)", op, ncclGetErrorString(st), ncclGetLastError(comm));
    break_comm(c, why);
    return sf_error(SF_E_COMM, "NCCL rank %d of %d: %s", c->rank, c->size, why);
}

static int settle(sf_comm *c, ncclResult_t first, const char *op)
{
    return settle_on(c, ((nccl_comm *)c->impl)->comm, first, op);
}

static ncclDataType_t nccl_type(sf_dtype t) { return t == SF_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32; }

/* Enters the backend (its lock, device and this thread's stream), or fails for a broken comm. */
static int enter(sf_comm *c, const char *op, sf_cuda **cuda)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (n->failed) return failed_error(c, op);
    if (stopped(c)) {
        break_comm(c, "stopped: another rank of this process failed");
        return failed_error(c, op);
    }
    *cuda = sf_cuda_of(c->be);
    return sf_cuda_enter(*cuda);
}

/* Issues one NCCL call on the backend's stream and settles it. */
#define ISSUE(c, op, call)                                                                                             \
    do {                                                                                                               \
        sf_cuda *cu_;                                                                                                  \
        int rc_ = enter(c, op, &cu_);                                                                                  \
        if (rc_ != SF_OK) return rc_;                                                                                  \
        cudaStream_t stream = cu_->stream;                                                                             \
        ncclComm_t comm = ((nccl_comm *)(c)->impl)->comm;                                                              \
        ncclResult_t st_ = (call);                                                                                     \
        (void)stream, (void)comm;                                                                                      \
        sf_cuda_leave(cu_);                                                                                            \
        ((nccl_comm *)(c)->impl)->kernels++;                                                                           \
        return settle(c, st_, op);                                                                                     \
    } while (0)

static int nccl_all_reduce(sf_comm *c, void *buf, size_t count, sf_dtype type)
{
    ISSUE(c, "all_reduce", ncclAllReduce(buf, buf, count, nccl_type(type), ncclSum, comm, stream));
}

static int nccl_all_gather(sf_comm *c, const void *send, void *recv, size_t count, sf_dtype type)
{
    ISSUE(c, "all_gather", ncclAllGather(send, recv, count, nccl_type(type), comm, stream));
}

static int nccl_broadcast(sf_comm *c, void *buf, size_t count, sf_dtype type, int root)
{
    ISSUE(c, "broadcast", ncclBroadcast(buf, buf, count, nccl_type(type), root, comm, stream));
}

static int nccl_send(sf_comm *c, const void *buf, size_t count, sf_dtype type, int peer)
{
    ISSUE(c, "send", ncclSend(buf, count, nccl_type(type), peer, comm, stream));
}

static int nccl_recv(sf_comm *c, void *buf, size_t count, sf_dtype type, int peer)
{
    ISSUE(c, "recv", ncclRecv(buf, count, nccl_type(type), peer, comm, stream));
}

/* The all-reduce on the communicator's own stream, after what the backend's stream has issued;
 * NCCL keeps a communicator's operations in the order issued whatever their streams. */
static int nccl_all_reduce_start(sf_comm *c, void *buf, size_t count, sf_dtype type, int *ticket)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    sf_cuda *cu;
    int rc = enter(c, "all_reduce_start", &cu);
    if (rc != SF_OK) return rc;
    const int t = n->next_ticket;
    n->next_ticket = (t + 1) % SF_COMM_TICKETS;
    rc = sf_cuda_status(cudaEventRecord(n->start[t], cu->stream), "all_reduce_start (order)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(n->side, n->start[t], 0), "all_reduce_start (order)");
    ncclResult_t st = ncclSuccess;
    if (rc == SF_OK) st = ncclAllReduce(buf, buf, count, nccl_type(type), ncclSum, n->comm, n->side);
    if (rc == SF_OK) n->kernels++;
    sf_cuda_leave(cu);
    if (rc != SF_OK) return rc;
    /* the kernel is on the stream only once the call has settled: the mark goes behind it then */
    rc = settle(c, st, "all_reduce_start");
    if (rc == SF_OK) rc = enter(c, "all_reduce_start", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(n->done[t], n->side), "all_reduce_start (done)");
    sf_cuda_leave(cu);
    *ticket = t;
    return rc;
}

static int nccl_join(sf_comm *c, int ticket)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    sf_cuda *cu;
    int rc = enter(c, "join", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaStreamWaitEvent(cu->stream, n->done[ticket], 0), "join");
    sf_cuda_leave(cu);
    return rc;
}

/* reduce_add (kernels/comm.h): through the copy engines where every rank is a thread of this
 * process with peer access to the others (comm_exchange.h), else an all-reduce of the parts
 * and the backend's add. */
static int nccl_reduce_add_reserve(sf_comm *c, size_t count, sf_dtype type, int allow_copies, int *copies)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (n->failed) return failed_error(c, "reduce_add_reserve");
    cudaSetDevice(sf_cuda_of(c->be)->device);
    int rc =
        sf_exchange_reserve(n->exchange, count * (type == SF_DTYPE_BF16 ? 2 : sizeof(float)), allow_copies, &n->copies);
    *copies = n->copies;
    return rc;
}

static int nccl_reduce_add_start(sf_comm *c, const void *part, size_t count, sf_dtype type, int *ticket)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->copies) return nccl_all_reduce_start(c, (void *)part, count, type, ticket);
    sf_cuda *cu;
    int rc = enter(c, "reduce_add_start", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_exchange_start(n->exchange, cu->stream, n->side, part, count * (type == SF_DTYPE_BF16 ? 2 : sizeof(float)),
                           ticket);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

static int nccl_reduce_add_end(sf_comm *c, int ticket, float *x, const void *part, size_t count, sf_dtype type)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->copies) {
        int rc = nccl_join(c, ticket);
        return rc == SF_OK ? sf_cuda_add_typed(c->be, count, x, type, part) : rc;
    }
    sf_cuda *cu;
    int rc = enter(c, "reduce_add_end", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_exchange_end(n->exchange, cu->stream, ticket, x, part, count, type == SF_DTYPE_BF16);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

/* reduce_norm (kernels/comm.h): split over the ranks by the exchange where reduce_add runs on
 * the copy engines and the parts are bf16; else reduce_add, then the norm (in one pass where
 * NCCL summed bf16 parts). */
static int nccl_reduce_norm_reserve(sf_comm *c, int rows, int dim, sf_dtype type, float *x, void *u, int allow_copies,
                                    int *split)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    int copies = 0;
    *split = 0;
    if (n->split) { /* again: this rank's rows moved */
        *split = 1;
        return sf_exchange_register(n->exchange, x, u);
    }
    int rc = nccl_reduce_add_reserve(c, (size_t)rows * dim, type, allow_copies, &copies);
    if (rc == SF_OK && copies && type == SF_DTYPE_BF16) {
        rc = sf_exchange_register(n->exchange, x, u);
        n->split = *split = rc == SF_OK;
    }
    return rc;
}

static int nccl_reduce_norm_start(sf_comm *c, const void *part, int rows, int dim, sf_dtype type, int *ticket)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->split) return nccl_reduce_add_start(c, part, (size_t)rows * dim, type, ticket);
    sf_cuda *cu;
    int rc = enter(c, "reduce_norm_start", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_exchange_start_split(n->exchange, cu->stream, n->side, part, rows, dim, ticket);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

static int nccl_reduce_norm_end(sf_comm *c, int ticket, float *x, const void *part, int rows, int dim, sf_dtype type,
                                const float *norm, float eps, void *u)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->split && (n->copies || type != SF_DTYPE_BF16 || !norm)) {
        int rc = nccl_reduce_add_end(c, ticket, x, part, (size_t)rows * dim, type);
        if (rc == SF_OK && norm) rc = sf_cuda_rmsnorm_typed(c->be, rows, dim, x, norm, eps, SF_DTYPE_BF16, u);
        return rc;
    }
    int rc = n->split ? SF_OK : nccl_join(c, ticket);
    sf_cuda *cu;
    if (rc == SF_OK) rc = enter(c, "reduce_norm_end", &cu);
    if (rc != SF_OK) return rc;
    if (n->split)
        rc = sf_exchange_end_split(n->exchange, cu->stream, ticket, x, part, rows, dim, norm, eps, u);
    else /* NCCL left the sum in part */
        rc = sf_cuda_add_parts_norm(&part, 1, rows, dim, x, norm, eps, (__nv_bfloat16 *)u, NULL, 0, cu->stream);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

static int nccl_reduce_norm_join(sf_comm *c, int ticket)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->split) return SF_OK;
    sf_cuda *cu;
    int rc = enter(c, "reduce_norm_join", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_exchange_join_split(n->exchange, cu->stream, ticket);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

/* first_rows (kernels/comm.h): rank 0 norms, the exchange copies, where the sums are split;
 * else a broadcast of the rows and every rank's norm: the composed form of kernels/comm_host.c,
 * written again here because this module sees only the exported API, not that function. */
static int nccl_first_rows(sf_comm *c, int rows, int dim, float *x, const float *norm, float eps, void *u)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->split) { /* every rank norms the rows rank 0 broadcast */
        int rc = nccl_broadcast(c, x, (size_t)rows * dim, SF_DTYPE_F32, 0);
        return rc == SF_OK ? sf_cuda_rmsnorm_typed(c->be, rows, dim, x, norm, eps, SF_DTYPE_BF16, u) : rc;
    }
    /* split: rank 0 norms alone, the others copy its normed rows in */
    int rc = c->rank == 0 ? sf_cuda_rmsnorm_typed(c->be, rows, dim, x, norm, eps, SF_DTYPE_BF16, u) : SF_OK;
    sf_cuda *cu;
    if (rc == SF_OK) rc = enter(c, "first_rows", &cu);
    if (rc != SF_OK) return rc;
    rc = sf_exchange_first_rows(n->exchange, cu->stream, rows, dim, x, u);
    sf_cuda_leave(cu);
    if (rc == SF_E_COMM) break_comm(c, sf_last_error());
    return rc;
}

static int nccl_group_begin(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (n->failed) return failed_error(c, "group_begin");
    ncclResult_t st = ncclGroupStart();
    return st == ncclSuccess ? SF_OK : sf_error(SF_E_COMM, "NCCL group_begin: %s", ncclGetErrorString(st));
}

static int nccl_group_end(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (n->failed) {
        ncclGroupEnd();
        return failed_error(c, "group_end");
    }
    return settle(c, ncclGroupEnd(), "group_end");
}

/* Waits for event ev (recorded behind this rank's operations), polling for failures. */
static int wait_event(sf_comm *c, cudaEvent_t ev, const char *op)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    const double start = sf_host_now_ms();
    char why[200];
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return SF_OK;
        if (e != cudaErrorNotReady) {
            snprintf(why, sizeof why, "%s: CUDA: %s", op, cudaGetErrorString(e));
            break;
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            snprintf(why, sizeof why, "%s: %s (%s)", op, ncclGetErrorString(st), ncclGetLastError(n->comm));
            break;
        }
        if (stopped(c)) {
            snprintf(why, sizeof why, "%s stopped: another rank of this process failed", op);
            break;
        }
        if (sf_host_now_ms() - start > c->timeout_ms) {
            snprintf(why, sizeof why, "%s timed out after %d ms: a collective waited for a rank that never came", op,
                     c->timeout_ms);
            break;
        }
        /* a spin first (the usual wait is short), then sleeps */
        if (spins > 200) sf_host_pause_us(spins > 2000 ? 200 : 20);
    }
    break_comm(c, why);
    return sf_error(SF_E_COMM, "NCCL rank %d of %d: %s", c->rank, c->size, why);
}

static int record(sf_comm *c, cudaEvent_t ev, const char *op)
{
    sf_cuda *cu;
    int rc = enter(c, op, &cu);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(ev, cu->stream), "event record");
    sf_cuda_leave(cu);
    return rc;
}

static int nccl_wait(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    const int i = n->marks ? !n->cur : 0; /* the slot not holding the last fence's mark */
    int rc = record(c, n->mark[i], "wait");
    if (rc == SF_OK) rc = wait_event(c, n->mark[i], "wait");
    if (rc == SF_OK) n->kernels = 0; /* one thread issues: all of them were before the mark */
    return rc;
}

static int nccl_fence(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    /* marks alternate between the two events: the one recorded now and the previous fence's,
     * which is the one waited for (the slot reused now held the mark before that, waited for
     * by the previous fence) */
    const int next = n->marks ? !n->cur : 0;
    int rc = record(c, n->mark[next], "fence");
    if (rc != SF_OK) return rc;
    n->cur = next;
    n->marks++;
    return n->marks >= 2 ? wait_event(c, n->mark[!next], "fence") : SF_OK;
}

/* end_unit (kernels/comm.h): the copy engines' sums and first rows wait on the device only for
 * what the peers' hosts have issued (comm_exchange.cu's counts); an NCCL kernel may wait for a
 * peer that never comes, which only the polled wait ends. */
static int nccl_end_unit(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    return n->kernels ? nccl_wait(c) : nccl_fence(c);
}

static void nccl_abort(sf_comm *c, const char *why)
{
    char text[200];
    snprintf(text, sizeof text, "aborted by rank %d: %s", c->rank, why && *why ? why : "abort");
    break_comm(c, text);
}

static void nccl_destroy(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    if (!n->failed && n->comm) {
        /* a healthy end: everything issued finished, then the communicator's own teardown; a
         * failure on the way aborts instead */
        if (nccl_wait(c) == SF_OK) {
            cudaSetDevice(sf_cuda_of(c->be)->device);
            ncclResult_t st = ncclCommFinalize(n->comm);
            if (settle(c, st, "finalize") == SF_OK && n->comm) {
                ncclCommDestroy(n->comm);
                n->comm = n->parent == n->comm ? NULL : n->parent;
            }
            if (n->comm && n->comm == n->parent) { /* the split's parent, idle since the split */
                st = ncclCommFinalize(n->comm);
                if (settle(c, st, "finalize") == SF_OK && n->comm) ncclCommDestroy(n->comm);
                n->comm = n->parent = NULL;
            }
        }
    }
    break_comm(c, "destroyed"); /* aborts what is left, if anything */
    cudaSetDevice(sf_cuda_of(c->be)->device);
    for (int i = 0; i < 2; i++)
        if (n->mark[i]) cudaEventDestroy(n->mark[i]);
    for (int i = 0; i < SF_COMM_TICKETS; i++) {
        if (n->start[i]) cudaEventDestroy(n->start[i]);
        if (n->done[i]) cudaEventDestroy(n->done[i]);
    }
    if (n->side) cudaStreamDestroy(n->side);
    sf_exchange_leave(n->exchange);
    delete n;
    delete c;
}

static const sf_comm_ops nccl_ops = {
    "nccl",
    nccl_all_reduce,
    nccl_all_gather,
    nccl_broadcast,
    nccl_send,
    nccl_recv,
    nccl_group_begin,
    nccl_group_end,
    nccl_all_reduce_start,
    nccl_join,
    nccl_wait,
    nccl_fence,
    nccl_abort,
    nccl_destroy,
    NULL,
    NULL,
    NULL,
    nccl_reduce_add_reserve,
    nccl_reduce_add_start,
    nccl_reduce_add_end,
    nccl_reduce_norm_reserve,
    nccl_reduce_norm_start,
    nccl_reduce_norm_end,
    nccl_reduce_norm_join,
    nccl_first_rows,
    nccl_end_unit,
};

extern "C" int sf_cuda_comm_nccl_available(void) { return 1; }

extern "C" int sf_cuda_comm_nccl_unique_id(void *buf)
{
    if (!buf) return sf_error(SF_E_INVAL, "sf_comm_nccl_unique_id: buf is NULL");
    ncclUniqueId id;
    ncclResult_t st = ncclGetUniqueId(&id);
    if (st != ncclSuccess)
        return sf_error(SF_E_COMM, "NCCL: ncclGetUniqueId failed: %s (%s)", ncclGetErrorString(st), ncclGetLastError(NULL));
    memset(buf, 0, SF_COMM_NCCL_ID_BYTES);
    memcpy(buf, &id, sizeof id);
    return SF_OK;
}

/* ---- the blocking communicator the collectives run on ----------------------------------------
 *
 * A non-blocking communicator hands every collective to a thread that NCCL creates for it and
 * answers "in progress": about 0.16 ms of host time a collective on an H100 host, more than an
 * all-reduce of a segment's rows takes on NVLink. So the communicator is created non-blocking
 * (a rank that never joins ends in a timeout, not a hang), then split into a blocking one
 * with the same ranks, whose collectives are enqueued by the calling thread. The split runs
 * on a thread of ours, waited for against the timeout and the watch flag; past them the
 * parent is aborted, which aborts the split (NCCL ties a child's set-up to its parent's abort
 * flag). Once made, nothing in a blocking collective waits on the host for a peer: the
 * kernels wait on the device, and wait_event's polling and abort still bound every wait. */

typedef struct split_job {
    ncclComm_t parent, child; /* child: written by NCCL when the split completes */
    int rank, device, max_ctas;
    ncclResult_t st;
    int done, cancel; /* atomic */
} split_job;

static void *split_main(void *arg)
{
    split_job *j = (split_job *)arg;
    cudaSetDevice(j->device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    /* fewer thread blocks a collective leave more of the GPU to the work beside it (overlap=) */
    if (j->max_ctas > 0) config.maxCTAs = j->max_ctas;
    ncclResult_t st = ncclCommSplit(j->parent, 0, j->rank, &j->child, &config);
    /* NCCL leaves the child NULL until the split completes, which may be after the call
     * returns (a non-blocking parent): wait for it, then for its set-up; the parent's state
     * tells of a failure before the child exists */
    while (st == ncclSuccess || st == ncclInProgress) {
        ncclComm_t child = __atomic_load_n(&j->child, __ATOMIC_ACQUIRE);
        ncclResult_t now = ncclInProgress;
        if (child) {
            if (ncclCommGetAsyncError(child, &now) != ncclSuccess) now = ncclInternalError;
            if (now != ncclInProgress) {
                st = now;
                break;
            }
        } else if (ncclCommGetAsyncError(j->parent, &now) != ncclSuccess ||
                   (now != ncclSuccess && now != ncclInProgress)) {
            st = now == ncclSuccess ? ncclInternalError : now;
            break;
        }
        if (__atomic_load_n(&j->cancel, __ATOMIC_ACQUIRE)) {
            st = ncclInProgress;
            break;
        }
        sf_host_pause_us(50);
    }
    j->st = st;
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int join_within(pthread_t thread, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    return pthread_timedjoin_np(thread, NULL, &until);
}

static int split_blocking(sf_comm *c)
{
    nccl_comm *n = (nccl_comm *)c->impl;
    split_job *j = new split_job();
    j->parent = n->comm, j->rank = c->rank, j->device = sf_cuda_of(c->be)->device, j->st = ncclInProgress;
    j->max_ctas = sf_cuda_settings_nccl_ctas(&sf_cuda_of(c->be)->settings);
    pthread_t thread;
    if (pthread_create(&thread, NULL, split_main, j) != 0) {
        delete j;
        return sf_error(SF_E_COMM, "NCCL rank %d of %d: could not start the split's thread", c->rank, c->size);
    }
    const double start = sf_host_now_ms();
    const char *why = NULL;
    while (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE)) {
        if (stopped(c)) why = "stopped while splitting: another rank of this process failed";
        else if (sf_host_now_ms() - start > c->timeout_ms)
            why = "the split was not complete within the timeout: a rank stopped";
        if (why) break;
        sf_host_pause_us(100);
    }
    if (why) {
        /* the thread stops polling at once; one still inside NCCL's split is ended by the
         * parent's abort (aborted only after the thread stopped polling it, or gave up on it);
         * a thread that even then does not return is left */
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELEASE);
        int joined = join_within(thread, 1) == 0;
        ncclCommAbort(n->comm);
        n->comm = NULL;
        if (!joined) joined = join_within(thread, 5) == 0;
        if (joined && j->child) ncclCommAbort(j->child);
        if (!joined) pthread_detach(thread);
        /* j is left allocated: an aborted split may still write the child's handle into it */
        n->failed = 1;
        snprintf(n->why, sizeof n->why, "%s", why);
        return sf_error(SF_E_COMM, "NCCL rank %d of %d: %s", c->rank, c->size, why);
    }
    pthread_join(thread, NULL);
    const ncclResult_t st = j->st;
    ncclComm_t child = j->child;
    delete j;
    if (st != ncclSuccess) {
        if (child) ncclCommAbort(child);
        return sf_error(SF_E_COMM, "NCCL rank %d of %d: splitting a blocking communicator failed: %s (%s)", c->rank,
                        c->size, ncclGetErrorString(st), ncclGetLastError(n->comm));
    }
    n->parent = n->comm;
    n->comm = child;
    return SF_OK;
}

extern "C" int sf_cuda_comm_nccl_create_watched(sf_backend *be, const void *id, int rank, int size, int timeout_ms,
                                           const int *stop, sf_comm **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_comm_nccl_create: out is NULL");
    *out = NULL;
    if (sf_cuda_comm_backend_device(be) < 0) return sf_error(SF_E_INVAL, "NCCL communicator: needs a cuda backend");
    if (!id || size < 1 || rank < 0 || rank >= size || timeout_ms <= 0)
        return sf_error(SF_E_INVAL, "NCCL communicator: rank %d of %d, timeout %d ms", rank, size, timeout_ms);
    sf_cuda *cu = sf_cuda_of(be);
    sf_comm *c = new sf_comm();
    nccl_comm *n = new nccl_comm();
    *c = sf_comm{&nccl_ops, n, rank, size, be, timeout_ms, stop};
    int rc = sf_cuda_status(cudaSetDevice(cu->device), "cudaSetDevice");
    for (int i = 0; i < 2 && rc == SF_OK; i++)
        rc = sf_cuda_status(cudaEventCreateWithFlags(&n->mark[i], cudaEventDisableTiming), "event create");
    for (int i = 0; i < SF_COMM_TICKETS && rc == SF_OK; i++) {
        rc = sf_cuda_status(cudaEventCreateWithFlags(&n->start[i], cudaEventDisableTiming), "event create");
        if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(&n->done[i], cudaEventDisableTiming), "event create");
    }
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamCreateWithFlags(&n->side, cudaStreamNonBlocking), "stream create");
    if (rc != SF_OK) {
        n->failed = 1;
        nccl_destroy(c);
        return rc;
    }
    /* before NCCL's init: a thread of this process that gets through creation finds every other
     * rank of this process already in the exchange's group */
    rc = sf_exchange_join(id, c, &n->exchange);
    if (rc != SF_OK) {
        n->failed = 1;
        nccl_destroy(c);
        return rc;
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t st = ncclCommInitRankConfig(&n->comm, size, uid, rank, &config);
    if (st != ncclSuccess && st != ncclInProgress) {
        rc = sf_error(SF_E_COMM, "NCCL rank %d of %d on GPU %d: ncclCommInitRankConfig failed: %s (%s)", rank, size,
                      cu->device, ncclGetErrorString(st), ncclGetLastError(NULL));
        if (!n->comm) n->failed = 1;
        nccl_destroy(c);
        return rc;
    }
    /* every rank must join within the timeout: a missing one leaves the others in progress */
    const double start = sf_host_now_ms();
    while (st == ncclInProgress && sf_host_now_ms() - start <= timeout_ms && !stopped(c)) {
        sf_host_pause_us(500);
        if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess) st = ncclInternalError;
    }
    if (st != ncclSuccess) {
        if (st == ncclInProgress && stopped(c))
            rc = sf_error(SF_E_COMM, "NCCL rank %d of %d on GPU %d: stopped while joining: another rank of this "
                                     "process failed",
                          rank, size, cu->device);
        else if (st == ncclInProgress)
            rc = sf_error(SF_E_COMM, "NCCL rank %d of %d on GPU %d: the communicator was not complete after %d ms: "
                                     "a rank never joined",
                          rank, size, cu->device, timeout_ms);
        else
            rc = sf_error(SF_E_COMM, "NCCL rank %d of %d on GPU %d: joining failed: %s (%s)", rank, size, cu->device,
                          ncclGetErrorString(st), ncclGetLastError(n->comm));
        char why[64];
        snprintf(why, sizeof why, "creation failed");
        break_comm(c, why);
        nccl_destroy(c);
        return rc;
    }
    rc = split_blocking(c);
    if (rc != SF_OK) {
        nccl_destroy(c);
        return rc;
    }
    *out = c;
    return SF_OK;
}
#endif /* SEQFLOW_HAVE_NCCL */
