/* The checksum thread of `seqflow serve` (serve_internal.h, serve_crc_*): the CRC of a reply's
 * rows, computed while the loop goes on.
 *
 * Why: a reply sent without a copy still needs its rows' CRC in its head (SPEC 8), 32 MiB of
 * float32 rows a reference-model segment, about 1 ms on the loop even on several threads. The
 * loop hands the rows here and runs the next step meanwhile (the pipeline: the GPU computes the
 * next segment); the reply goes out when the loop next sends anything, or before it waits.
 * Rows a GPU graph is still bringing over (its copy begun by the final norm, beside the next
 * segment's computation, as `seqflow run`'s norm thread overlaps it) are waited for here first.
 * For a client with a shared-memory region the rows are copied into it here, each piece while
 * its CRC is computed (serve_region.c): the one copy those rows take on the server.
 * One job at a time: the loop takes a job's CRC before it starts another. */
#include <pthread.h>
#include <stdlib.h>

#include "compress/frame.h"
#include "pipeline/serve_internal.h"

struct serve_crc {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake, done_cond;
    sf_packet *packet; /* rows still on the device: brought over first */
    const void *data;
    void *dst; /* where the rows are copied on the way (a client's region), NULL: nowhere */
    size_t len;
    int threads;
    int queued, done, quit;
    uint32_t crc;
    int rc;
};

static void *crc_main(void *arg)
{
    serve_crc *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->queued && !c->quit) pthread_cond_wait(&c->wake, &c->lock);
        if (c->quit) break;
        sf_packet *packet = c->packet;
        const void *data = c->data;
        void *dst = c->dst;
        const size_t len = c->len;
        pthread_mutex_unlock(&c->lock);
        const int rc = packet && packet->dev ? sf_packet_to_host(packet) : SF_OK;
        const uint32_t crc = rc == SF_OK ? sf_crc32c_parallel_copy(0, dst, data, len, c->threads) : 0;
        pthread_mutex_lock(&c->lock);
        c->crc = crc;
        c->rc = rc;
        c->queued = 0;
        c->done = 1;
        pthread_cond_signal(&c->done_cond);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

serve_crc *serve_crc_create(int threads)
{
    serve_crc *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->threads = threads < 1 ? 1 : threads;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    pthread_cond_init(&c->done_cond, NULL);
    if (pthread_create(&c->thread, NULL, crc_main, c) != 0) {
        pthread_cond_destroy(&c->wake);
        pthread_cond_destroy(&c->done_cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return NULL;
    }
    return c;
}

void serve_crc_free(serve_crc *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->quit = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->done_cond);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void serve_crc_start(serve_crc *c, sf_packet *packet, const void *data, size_t len, void *dst)
{
    pthread_mutex_lock(&c->lock);
    c->packet = packet, c->data = data, c->len = len, c->dst = dst;
    c->queued = 1, c->done = 0;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
}

int serve_crc_wait(serve_crc *c, uint32_t *crc)
{
    pthread_mutex_lock(&c->lock);
    while (!c->done) pthread_cond_wait(&c->done_cond, &c->lock);
    c->done = 0;
    *crc = c->crc;
    const int rc = c->rc;
    pthread_mutex_unlock(&c->lock);
    return rc;
}
