/* The pool of device row buffers (see device_rows.h). A mutex guards the free list: in a
 * threaded graph buffers are lent by embed's thread and returned by whichever thread frees the
 * packet. */
#include "stages/device_rows.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "seqflow/error.h"

struct sf_device_rows {
    sf_backend *be;
    pthread_mutex_t lock;
    int refs;    /* the creator's and one per lent buffer */
    int count;
    int n_free;
    float **all;  /* [count] */
    float **free; /* [n_free] */
};

static void destroy(sf_device_rows *pool)
{
    for (int i = 0; i < pool->count; i++) pool->be->ops->free(pool->be, pool->all[i]);
    pthread_mutex_destroy(&pool->lock);
    free(pool->all);
    free(pool->free);
    free(pool);
}

/* Drops one reference; the last one frees everything. */
static void unref(sf_device_rows *pool)
{
    pthread_mutex_lock(&pool->lock);
    int last = --pool->refs == 0;
    pthread_mutex_unlock(&pool->lock);
    if (last) destroy(pool);
}

int sf_device_rows_create(sf_backend *be, int count, size_t floats, sf_device_rows **out)
{
    *out = NULL;
    sf_device_rows *pool = calloc(1, sizeof *pool);
    if (!pool) return sf_error(SF_E_NOMEM, "out of memory");
    pool->be = be;
    pool->refs = 1;
    pthread_mutex_init(&pool->lock, NULL);
    pool->all = calloc((size_t)count, sizeof *pool->all);
    pool->free = calloc((size_t)count, sizeof *pool->free);
    if (!pool->all || !pool->free) {
        destroy(pool);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < count; i++) {
        float *buf = be->ops->alloc(be, floats * sizeof(float));
        if (!buf) {
            destroy(pool);
            return sf_error(SF_E_NOMEM, "no device memory for %d row buffers of %zu floats", count, floats);
        }
        pool->all[pool->count++] = buf;
        pool->free[pool->n_free++] = buf;
    }
    *out = pool;
    return SF_OK;
}

void sf_device_rows_free(sf_device_rows *pool)
{
    if (pool) unref(pool);
}

static int download(void *ctx, void *host, const float *dev, size_t bytes)
{
    sf_device_rows *pool = ctx;
    return pool->be->ops->download(pool->be, host, dev, bytes);
}

static int download_start(void *ctx, void *host, const float *dev, size_t bytes, void **ticket)
{
    sf_device_rows *pool = ctx;
    return sf_be_download_start(pool->be, host, dev, bytes, ticket);
}

static int download_wait(void *ctx, void *ticket)
{
    sf_device_rows *pool = ctx;
    return sf_be_download_wait(pool->be, ticket);
}

static void release(void *ctx, float *dev)
{
    sf_device_rows *pool = ctx;
    pthread_mutex_lock(&pool->lock);
    pool->free[pool->n_free++] = dev;
    pthread_mutex_unlock(&pool->lock);
    unref(pool);
}

static const sf_packet_device pool_ops = {download, release, download_start, download_wait};

int sf_device_rows_lend(sf_device_rows *pool, sf_packet *p)
{
    pthread_mutex_lock(&pool->lock);
    float *buf = pool->n_free ? pool->free[--pool->n_free] : NULL;
    if (buf) pool->refs++;
    pthread_mutex_unlock(&pool->lock);
    if (!buf) return 0;
    p->dev = buf, p->dev_ops = &pool_ops, p->dev_pool = pool;
    return 1;
}
