/* Replies sent without a copy (serve_internal.h, serve_send_*). A segment's ROWS are 32 MiB of
 * float32 for the reference model; zmq_send copied each into a fresh allocation, which on
 * Linux is a fresh mapping: a copy and a page fault per 4 KiB, per segment, on the server's one
 * thread. Instead the encoded buffer itself becomes the message (zmq_msg_init_data), and when
 * ZeroMQ's I/O thread has written it (or dropped it), it comes back here, to be the buffer the
 * next reply is encoded into: after the first few replies no allocation and no copy. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "pipeline/serve_internal.h"

#define POOL_BUFFERS 8 /* kept for reuse; more in flight are freed when they come back */

struct serve_send_pool {
    pthread_mutex_t lock;
    sf_buffer free[POOL_BUFFERS];
    int n;
};

/* What travels with a message: its pool and the buffer's capacity. */
typedef struct owned {
    serve_send_pool *pool;
    sf_buffer buf;
} owned;

serve_send_pool *serve_send_pool_create(void)
{
    serve_send_pool *p = calloc(1, sizeof *p);
    if (p) pthread_mutex_init(&p->lock, NULL);
    return p;
}

void serve_send_pool_free(serve_send_pool *p)
{
    if (!p) return;
    for (int i = 0; i < p->n; i++) sf_buffer_release(&p->free[i]);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ZeroMQ's free function: on its I/O thread once the message is written, or where it is closed. */
static void give_back(void *data, void *hint)
{
    owned *o = hint;
    (void)data;
    serve_send_pool *p = o->pool;
    pthread_mutex_lock(&p->lock);
    if (p->n < POOL_BUFFERS) p->free[p->n++] = o->buf, o->buf.data = NULL;
    pthread_mutex_unlock(&p->lock);
    sf_buffer_release(&o->buf);
    free(o);
}

void serve_send_take(serve_send_pool *p, sf_buffer *out)
{
    if (out->cap || !p) return;
    pthread_mutex_lock(&p->lock);
    if (p->n) *out = p->free[--p->n];
    pthread_mutex_unlock(&p->lock);
    out->len = 0;
}

int serve_send_owned(void *socket, serve_send_pool *p, sf_buffer *out, int flags)
{
    owned *o = p ? malloc(sizeof *o) : NULL;
    zmq_msg_t msg;
    int rc;
    if (o) {
        o->pool = p, o->buf = *out;
        memset(out, 0, sizeof *out);
        if (zmq_msg_init_data(&msg, o->buf.data, o->buf.len, give_back, o) != 0) { /* never for a non-NULL data */
            *out = o->buf;
            free(o);
            return zmq_send(socket, out->data, out->len, flags) < 0 ? -1 : 0;
        }
        rc = zmq_msg_send(&msg, socket, flags);
        if (rc < 0) zmq_msg_close(&msg); /* gives the buffer back */
        serve_send_take(p, out);
        return rc < 0 ? -1 : 0;
    }
    return zmq_send(socket, out->data, out->len, flags) < 0 ? -1 : 0;
}
