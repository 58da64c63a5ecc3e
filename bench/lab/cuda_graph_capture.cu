/* Lab record, not built: CUDA graph capture of the block stage's layers, as it ran behind the
 * old backend interface's graph_begin/graph_end (off by default; measured 3% slower than plain
 * launches with early launch on, bench/RESULTS.md). The interface it plugged into, the sf_cuda
 * fields it used (capturing, graphs) and the block stage's calls are gone from the product;
 * bringing it back means restoring those from git history (the commit that moved this file).
 * Kept as the record of how capture with the side queue's events was made to work. */
/* The CUDA backend's graphs (seqflow/backend.h, ops graph_begin and graph_end): a caller's
 * sequence of ops (the block stage's layers of one segment) is recorded by stream capture
 * and run as one CUDA graph, whose kernels the device starts back to back instead of one
 * stream launch at a time. Each key keeps its executable graph; the next sequence of that key
 * updates it in place (cudaGraphExecUpdate: same nodes, new arguments) and a new one is made
 * only when the sequence changed shape (e.g. the global-token copies wrap around the FIFO).
 *
 * Recording holds the backend's lock from graph_begin to graph_end: another thread's op
 * issued to the main stream in between would otherwise land inside the graph. The lock is
 * recursive, so the recording thread's own ops take it as usual. The side queue joins the
 * recording through its events; a join that would wait on a side_done recorded before the
 * recording began waits on nothing, since graph_begin ordered the main stream after it, and
 * graph_end records side_done again outside the graph (a record made inside a graph cannot
 * be waited on from outside it).
 *
 * SEQFLOW_CUDA_GRAPHS=0 or 1 turns graphs off or on (read at each graph_begin). */
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/profile.h"

#include <stdlib.h>
#include <string.h>

/* Whether graphs are used where SEQFLOW_CUDA_GRAPHS does not say. */
#define GRAPHS_BY_DEFAULT 0

static unsigned long long graphs_launched, graphs_instantiated;

void sf_cuda_graph_counts(unsigned long long *launched, unsigned long long *instantiated)
{
    if (launched) *launched = __atomic_load_n(&graphs_launched, __ATOMIC_RELAXED);
    if (instantiated) *instantiated = __atomic_load_n(&graphs_instantiated, __ATOMIC_RELAXED);
}

static int graphs_wanted(void)
{
    const char *mode = getenv("SEQFLOW_CUDA_GRAPHS");
    if (mode && *mode) return strcmp(mode, "0") != 0;
    return GRAPHS_BY_DEFAULT;
}

static sf_cuda_graph *graph_of(sf_cuda *c, const void *key)
{
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) return &c->graphs[i];
    return NULL;
}

int sf_cuda_wait_side_done(sf_cuda *c, const char *what)
{
    if (c->capturing && !c->side_done_captured) return SF_OK;
    return sf_cuda_status(cudaStreamWaitEvent(c->stream, c->side_done, 0), what);
}

int sf_cuda_graph_begin(sf_backend *be, const void *key)
{
    sf_cuda *c = sf_cuda_of(be);
    /* the per-op profile times each op alone; lanes order their work by events recorded
     * outside any graph; a thread on a side queue or lane records nothing of the main one */
    if (!key || !graphs_wanted() || c->profile || c->n_lanes || sf_cuda_thread_queue(c)) return 0;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    if (c->capturing) {
        sf_cuda_leave(c);
        return sf_error(SF_E_INVAL, "graph_begin: a graph is already being recorded");
    }
    if (!graph_of(c, key)) {
        if (c->n_graphs == SF_CUDA_GRAPHS) {
            sf_cuda_leave(c);
            return 0;
        }
        c->graphs[c->n_graphs++] = (sf_cuda_graph){key, NULL};
    }
    /* everything given to the side queue so far comes first: the recording cannot wait on it */
    if (c->side.stream) rc = sf_cuda_status(cudaStreamWaitEvent(c->stream, c->side_done, 0), "graph_begin (side)");
    c->join_at_product = 0;
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "graph_begin");
    if (rc != SF_OK) {
        sf_cuda_leave(c);
        return rc;
    }
    c->capturing = 1, c->side_done_captured = 0;
    return 1; /* the lock stays held until graph_end */
}

/* Runs g as key's graph: its kept executable updated to g, or a new one. */
static int launch(sf_cuda *c, sf_cuda_graph *kept, cudaGraph_t g)
{
    if (kept->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(kept->exec, g, &info) != cudaSuccess) {
            cudaGetLastError(); /* not an error: the sequence changed shape */
            /* a launch of it still in flight finishes first; the driver frees it after */
            cudaGraphExecDestroy(kept->exec);
            kept->exec = NULL;
        }
    }
    if (!kept->exec) {
        int rc = sf_cuda_status(cudaGraphInstantiate(&kept->exec, g, 0), "graph (instantiate)");
        if (rc != SF_OK) {
            kept->exec = NULL;
            return rc;
        }
        __atomic_fetch_add(&graphs_instantiated, 1, __ATOMIC_RELAXED);
    }
    int rc = sf_cuda_status(cudaGraphLaunch(kept->exec, c->stream), "graph (launch)");
    if (rc == SF_OK) __atomic_fetch_add(&graphs_launched, 1, __ATOMIC_RELAXED);
    return rc;
}

int sf_cuda_graph_end(sf_backend *be, const void *key, int issue)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!c->capturing) return sf_error(SF_E_INVAL, "graph_end: no graph is being recorded");
    sf_cuda_graph *kept = graph_of(c, key);
    cudaGraph_t g = NULL;
    const cudaError_t ended = cudaStreamEndCapture(c->stream, &g);
    c->capturing = 0;
    int rc = SF_OK;
    if (!issue) /* the caller's error stands; a recording it left unfinished is dropped too */
        cudaGetLastError();
    else if (ended != cudaSuccess)
        rc = sf_cuda_status(ended, "graph_end (an op could not be recorded)");
    else if (!kept)
        rc = sf_error(SF_E_INVAL, "graph_end: key differs from graph_begin's");
    else
        rc = launch(c, kept, g);
    if (g) cudaGraphDestroy(g);
    /* side_done was last recorded into the graph, if at all, and no wait outside it may use
     * such a record: recorded again here, on the main stream, where everything the side was
     * given so far (before graph_begin, or inside the graph) is ordered before this point */
    if (c->side.stream) {
        const int recorded = sf_cuda_status(cudaEventRecord(c->side_done, c->stream), "graph_end (side)");
        if (rc == SF_OK) rc = recorded;
    }
    sf_cuda_leave(c); /* graph_begin's hold */
    return rc;
}

void sf_cuda_graphs_release(sf_cuda *c)
{
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    c->n_graphs = 0;
}
