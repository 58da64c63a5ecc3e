/* Marks (backend_ext.h, mark_start and mark_wait): events behind the stream of the thread that
 * issues, with which a stage bounds how far it runs ahead of the device. */
#include "kernels/cuda/cuda_backend.h"

int sf_cuda_marks_create(sf_cuda *c)
{
    int rc = SF_OK;
    for (int i = 0; i < SF_CUDA_MARKS && rc == SF_OK; i++)
        rc = sf_cuda_status(cudaEventCreateWithFlags(&c->marks[i], cudaEventDisableTiming), "event");
    return rc;
}

void sf_cuda_marks_destroy(sf_cuda *c)
{
    for (int i = 0; i < SF_CUDA_MARKS; i++)
        if (c->marks[i]) cudaEventDestroy(c->marks[i]);
}

/* An event behind this thread's stream, on a free slot; the slot is the ticket. The wait
 * synchronizes outside the lock, so that other stage threads keep issuing meanwhile. */
int sf_cuda_mark_start(sf_backend *be, void **ticket)
{
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    int slot = -1;
    for (int i = 0; i < SF_CUDA_MARKS && slot < 0; i++)
        if (!c->mark_busy[i]) slot = i;
    if (slot < 0) {
        sf_cuda_leave(c);
        return SF_E_UNSUPPORTED;
    }
    rc = sf_cuda_status(cudaEventRecord(c->marks[slot], c->stream), "mark");
    if (rc == SF_OK) c->mark_busy[slot] = 1;
    sf_cuda_leave(c);
    if (rc == SF_OK) *ticket = &c->marks[slot];
    return rc;
}

int sf_cuda_mark_wait(sf_backend *be, void *ticket)
{
    sf_cuda *c = sf_cuda_of(be);
    cudaEvent_t *mark = (cudaEvent_t *)ticket;
    const int slot = (int)(mark - c->marks);
    if (slot < 0 || slot >= SF_CUDA_MARKS) return sf_error(SF_E_INVAL, "cuda mark_wait: not a mark of this backend");
    int rc = sf_cuda_status(cudaEventSynchronize(*mark), "mark (synchronize)");
    pthread_mutex_lock(&c->lock);
    c->mark_busy[slot] = 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}
