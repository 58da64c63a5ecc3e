/* Lab record, not built: lanes, further compute streams that ran consecutive segments side by
 * side behind the old backend interface's lanes/lane_* ops (no shipped configuration turned
 * them on). The interface, the sf_cuda fields they used (lane, lane_start/done/mark) and the
 * block stage's calls are gone from the product; bringing them back means restoring those
 * from git history (the commit that moved this file). Kept as the record of the ordering. */
/* The CUDA backend's lanes (seqflow/backend.h, ops lanes .. lane_wait): compute queues beside
 * the main one, each a stream with its own scratch and cuBLAS workspace, ordered against the
 * main queue and each other by events recorded under the backend's lock. The block stage runs
 * consecutive segments on alternate lanes, so that on the device one segment's first layers fill
 * the other's idle tails (bench/RESULTS.md, run 14). */
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/profile.h"

#include <stdlib.h>
#include <string.h>

/* cuBLAS's workspace on Hopper, as the main queue's (cuda_backend.cu) */
#define LANE_BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

static int create_lane(sf_cuda *c, int i)
{
    /* a lane runs what the main queue runs: its scratch as large, and grown with it (reserve) */
    int rc = sf_cuda_queue_create(c, &c->lane[i], c->scratch_bytes, LANE_BLAS_WORKSPACE_BYTES);
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(&c->lane_start[i], cudaEventDisableTiming), "event");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(&c->lane_done[i], cudaEventDisableTiming), "event");
    for (int m = 0; m < SF_BACKEND_LANE_MARKS && rc == SF_OK; m++)
        rc = sf_cuda_status(cudaEventCreateWithFlags(&c->lane_mark[i][m], cudaEventDisableTiming), "event");
    return rc;
}

/* None while the per-op profile is on (it times each op alone on the main stream), or with
 * SEQFLOW_CUDA_LANES=0. */
int sf_cuda_lanes(sf_backend *be, int want)
{
    sf_cuda *c = sf_cuda_of(be);
    const char *mode = getenv("SEQFLOW_CUDA_LANES");
    if ((mode && strcmp(mode, "0") == 0) || sf_cuda_profile_wanted()) return 0;
    if (want > SF_BACKEND_LANES) want = SF_BACKEND_LANES;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    while (c->n_lanes < want && rc == SF_OK) {
        rc = create_lane(c, c->n_lanes);
        if (rc == SF_OK) c->n_lanes++;
    }
    const int have = c->n_lanes;
    sf_cuda_leave(c);
    /* a lane that could not be made leaves the ones before it usable */
    if (rc != SF_OK && have == 0) return rc;
    if (rc != SF_OK) sf_clear_error();
    return have;
}

int sf_cuda_lane_begin(sf_backend *be, int lane)
{
    sf_cuda *c = sf_cuda_of(be);
    if (lane < 0 || lane >= c->n_lanes) return sf_error(SF_E_INVAL, "lane_begin: lane %d of %d", lane, c->n_lanes);
    if (sf_cuda_thread_queue(c)) return sf_error(SF_E_INVAL, "lane_begin: this thread is already on a lane or the side");
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(c->lane_start[lane], c->stream), "lane_begin (record)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaStreamWaitEvent(c->lane[lane].stream, c->lane_start[lane], 0), "lane_begin (wait)");
    sf_cuda_leave(c);
    if (rc == SF_OK) sf_cuda_set_thread_queue(c, &c->lane[lane]);
    return rc;
}

/* The lane this thread is on, or -1. */
static int current_lane(sf_cuda *c)
{
    sf_cuda_queue *q = sf_cuda_thread_queue(c);
    for (int i = 0; i < c->n_lanes; i++)
        if (q == &c->lane[i]) return i;
    return -1;
}

int sf_cuda_lane_end(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (current_lane(c) >= 0) sf_cuda_set_thread_queue(c, NULL);
    return SF_OK;
}

int sf_cuda_lane_join(sf_backend *be, int lane)
{
    sf_cuda *c = sf_cuda_of(be);
    if (lane < 0 || lane >= c->n_lanes) return sf_error(SF_E_INVAL, "lane_join: lane %d of %d", lane, c->n_lanes);
    if (current_lane(c) >= 0) return sf_error(SF_E_INVAL, "lane_join: called from a lane (lane_end first)");
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    /* recorded and waited for under one hold of the lock: the lane holds exactly what was issued
     * to it before this call */
    rc = sf_cuda_status(cudaEventRecord(c->lane_done[lane], c->lane[lane].stream), "lane_join (record)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(c->stream, c->lane_done[lane], 0), "lane_join (wait)");
    sf_cuda_leave(c);
    return rc;
}

int sf_cuda_lane_signal(sf_backend *be, int mark)
{
    sf_cuda *c = sf_cuda_of(be);
    const int lane = current_lane(c);
    if (lane < 0) return sf_error(SF_E_INVAL, "lane_signal: this thread is not on a lane");
    if (mark < 0 || mark >= SF_BACKEND_LANE_MARKS) return sf_error(SF_E_INVAL, "lane_signal: mark %d", mark);
    int rc = sf_cuda_enter(c); /* on the lane: c->stream is its stream */
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(c->lane_mark[lane][mark], c->stream), "lane_signal");
    sf_cuda_leave(c);
    return rc;
}

int sf_cuda_lane_wait(sf_backend *be, int lane, int mark)
{
    sf_cuda *c = sf_cuda_of(be);
    if (current_lane(c) < 0) return sf_error(SF_E_INVAL, "lane_wait: this thread is not on a lane");
    if (lane < 0 || lane >= c->n_lanes || mark < 0 || mark >= SF_BACKEND_LANE_MARKS)
        return sf_error(SF_E_INVAL, "lane_wait: lane %d mark %d", lane, mark);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    /* an event never recorded is complete: the wait is then a no-op, as the op promises */
    rc = sf_cuda_status(cudaStreamWaitEvent(c->stream, c->lane_mark[lane][mark], 0), "lane_wait");
    sf_cuda_leave(c);
    return rc;
}

void sf_cuda_lanes_release(sf_cuda *c)
{
    for (int i = 0; i < SF_BACKEND_LANES; i++) {
        sf_cuda_queue_release(c, &c->lane[i]);
        if (c->lane_start[i]) cudaEventDestroy(c->lane_start[i]);
        if (c->lane_done[i]) cudaEventDestroy(c->lane_done[i]);
        for (int m = 0; m < SF_BACKEND_LANE_MARKS; m++)
            if (c->lane_mark[i][m]) cudaEventDestroy(c->lane_mark[i][m]);
    }
    c->n_lanes = 0;
}
