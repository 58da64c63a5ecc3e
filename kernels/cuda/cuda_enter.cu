/* Entering the CUDA backend (cuda_backend.h, sf_cuda_enter and sf_cuda_leave): its lock, taken
 * in turn by the threads that share it; the device, which is per host thread; the side queue's
 * stream of the thread, swapped in for the main one while the thread is on it. */
#include <sched.h>

#include "kernels/cuda/cuda_backend.h"

/* The stream this thread issues to (side_begin .. side_end), if any, and the backend it
 * belongs to. */
static thread_local sf_cuda *stream_owner;
static thread_local sf_cuda_stream *stream_of_thread;

void sf_cuda_set_thread_stream(sf_cuda *c, sf_cuda_stream *s)
{
    stream_owner = s ? c : NULL;
    stream_of_thread = s;
}

sf_cuda_stream *sf_cuda_thread_stream(const sf_cuda *c) { return stream_owner == c ? stream_of_thread : NULL; }

int sf_cuda_thread_on_side(void) { return stream_owner != NULL; }

/* The early_launch setting of the backend this thread last entered: the kernels launched
 * through sf_cuda_launch_early read it there, since their entry points (the attention
 * kernels among them) take a stream, not the backend. Kernels called outside any backend
 * (benchmarks of one kernel) launch early, the default. */
static thread_local int early_launch_of_thread = 1;

int sf_cuda_early_launch(void) { return early_launch_of_thread; }

/* Exchanges the main stream, scratch, cuBLAS workspace and widened copies with q's (under the
 * lock). cublasSetStream drops the handle's workspace, so it is set again right after. */
static int swap_stream(sf_cuda *c, sf_cuda_stream *q)
{
    sf_cuda_stream main_q = {c->stream,  c->scratch,      c->scratch_bytes, c->blas_workspace, c->blas_workspace_bytes,
                             c->widened, c->widened_bytes};
    c->stream = q->stream, c->scratch = q->scratch, c->scratch_bytes = q->scratch_bytes;
    c->blas_workspace = q->blas_workspace, c->blas_workspace_bytes = q->blas_workspace_bytes;
    c->widened = q->widened, c->widened_bytes = q->widened_bytes;
    *q = main_q;
    c->swapped = c->swapped ? NULL : q;
    int rc = sf_cublas_status(cublasSetStream(c->blas, c->stream), "cublasSetStream");
    if (rc == SF_OK)
        rc = sf_cublas_status(cublasSetWorkspace(c->blas, c->blas_workspace, c->blas_workspace_bytes),
                              "cublasSetWorkspace");
    return rc;
}

/* The backends this thread is inside (sf_cuda_enter), and how deep: an op composed of others
 * enters again, without a turn of its own. */
#define HELD_MAX 4
static thread_local struct {
    sf_cuda *c;
    int depth;
} held[HELD_MAX];

/* Threads enter in the order they asked (a ticket each): the lock alone is not fair, and a
 * stage thread issuing a segment's hundred launches would take it back again and again while
 * another thread's one call (the final norm's download, which records where it starts) waited
 * behind the whole segment. */
static int take_turn(sf_cuda *c)
{
    int free_slot = -1;
    for (int i = 0; i < HELD_MAX; i++) {
        if (held[i].c == c) return held[i].depth++, 0;
        if (!held[i].c && free_slot < 0) free_slot = i;
    }
    const unsigned long long t = __atomic_fetch_add(&c->tickets, 1, __ATOMIC_RELAXED);
    for (unsigned spins = 0; __atomic_load_n(&c->serving, __ATOMIC_ACQUIRE) != t; spins++)
        if (spins > 64) sched_yield();
    if (free_slot >= 0)
        held[free_slot].c = c, held[free_slot].depth = 1;
    else
        __atomic_fetch_add(&c->serving, 1, __ATOMIC_RELEASE); /* too many held: the lock alone */
    return 1;
}

static void end_turn(sf_cuda *c)
{
    for (int i = 0; i < HELD_MAX; i++)
        if (held[i].c == c && --held[i].depth == 0) {
            held[i].c = NULL;
            __atomic_fetch_add(&c->serving, 1, __ATOMIC_RELEASE);
        }
}

int sf_cuda_enter(sf_cuda *c)
{
    take_turn(c);
    pthread_mutex_lock(&c->lock);
    /* the current device is per host thread, and stage threads come and go */
    int rc = sf_cuda_status(cudaSetDevice(c->device), "cudaSetDevice");
    early_launch_of_thread = c->settings.early_launch;
    if (rc == SF_OK && stream_owner == c) rc = swap_stream(c, stream_of_thread);
    if (rc != SF_OK) {
        if (c->swapped) swap_stream(c, c->swapped);
        pthread_mutex_unlock(&c->lock);
        end_turn(c);
    }
    return rc;
}

void sf_cuda_leave(sf_cuda *c)
{
    if (c->swapped) swap_stream(c, c->swapped);
    pthread_mutex_unlock(&c->lock);
    end_turn(c);
}
