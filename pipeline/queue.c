/* The in-process link: a bounded ring of packets guarded by one mutex and two condition
 * variables. Back-pressure is the point: a fast producer blocks instead of buffering an
 * unbounded stream. */
#include <pthread.h>
#include <stdlib.h>

#include "pipeline/link.h"
#include "seqflow/error.h"

typedef struct queue_link {
    sf_link base;
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    sf_packet **ring;
    int depth, head, count;
    int closed, aborted;
} queue_link;

static int queue_push(sf_link *l, sf_packet *p)
{
    queue_link *q = (queue_link *)l;
    pthread_mutex_lock(&q->lock);
    while (q->count == q->depth && !q->aborted) pthread_cond_wait(&q->not_full, &q->lock);
    if (q->aborted || q->closed) {
        pthread_mutex_unlock(&q->lock);
        sf_packet_free(p);
        return SF_E_CLOSED;
    }
    q->ring[(q->head + q->count) % q->depth] = p;
    q->count++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return SF_OK;
}

static sf_packet *queue_pop(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    sf_packet *p = NULL;
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->closed && !q->aborted) pthread_cond_wait(&q->not_empty, &q->lock);
    if (q->count > 0 && !q->aborted) {
        p = q->ring[q->head];
        q->head = (q->head + 1) % q->depth;
        q->count--;
        pthread_cond_signal(&q->not_full);
    }
    pthread_mutex_unlock(&q->lock);
    return p;
}

static int queue_ready(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    pthread_mutex_lock(&q->lock);
    const int ready = q->count > 0 || q->closed || q->aborted;
    pthread_mutex_unlock(&q->lock);
    return ready;
}

static void queue_close(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->lock);
}

static void queue_abort(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    pthread_mutex_lock(&q->lock);
    q->aborted = 1;
    while (q->count > 0) {
        sf_packet_free(q->ring[q->head]);
        q->head = (q->head + 1) % q->depth;
        q->count--;
    }
    pthread_cond_broadcast(&q->not_empty);
    pthread_cond_broadcast(&q->not_full);
    pthread_mutex_unlock(&q->lock);
}

static void queue_destroy(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    queue_abort(l);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    free(q->ring);
    free(q);
}

/* A queue is aborted only by a failure that the graph has recorded already. */
static int queue_status(sf_link *l)
{
    queue_link *q = (queue_link *)l;
    pthread_mutex_lock(&q->lock);
    const int aborted = q->aborted;
    pthread_mutex_unlock(&q->lock);
    return aborted ? sf_error(SF_E_CLOSED, "link aborted") : SF_OK;
}

static const sf_link_ops queue_ops = {queue_push, queue_pop, queue_ready, queue_close, queue_abort, queue_destroy,
                                      queue_status};

sf_link *sf_queue_link_create(int depth)
{
    if (depth < 1) depth = 1;
    queue_link *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->ring = calloc((size_t)depth, sizeof *q->ring);
    if (!q->ring) {
        free(q);
        return NULL;
    }
    q->base.ops = &queue_ops;
    q->depth = depth;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    return &q->base;
}
