#include "seqflow/packet.h"
#include "seqflow/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Large activation buffers are kept for reuse when packets are freed: a segment's rows are
 * tens of MiB, which malloc serves with fresh mappings, and first-touching those pages cost
 * more than the GPU's whole compute of a segment (issue 3). A few are kept: the cache holds at
 * most CACHE_SLOTS buffers of at most CACHE_MAX_FLOATS each, 1 GiB in all (the process's, until
 * it exits). */
#define CACHE_MIN_FLOATS ((size_t)1 << 18) /* 1 MiB */
#define CACHE_MAX_FLOATS ((size_t)1 << 26) /* 256 MiB: larger buffers go back to malloc */
#define CACHE_SLOTS 4
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static float *cache_x[CACHE_SLOTS];
static size_t cache_cap[CACHE_SLOTS];

/* A cached buffer of at least cap floats (the smallest that fits), or NULL. */
static float *cache_take(size_t cap, size_t *got)
{
    if (cap < CACHE_MIN_FLOATS) return NULL;
    float *x = NULL;
    pthread_mutex_lock(&cache_lock);
    int best = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache_x[i] && cache_cap[i] >= cap && (best < 0 || cache_cap[i] < cache_cap[best])) best = i;
    if (best >= 0) x = cache_x[best], *got = cache_cap[best], cache_x[best] = NULL;
    pthread_mutex_unlock(&cache_lock);
    return x;
}

/* Keeps x for reuse, or frees it when the cache is full (or x is small). */
static void cache_give(float *x, size_t cap)
{
    if (x && cap >= CACHE_MIN_FLOATS && cap <= CACHE_MAX_FLOATS) {
        pthread_mutex_lock(&cache_lock);
        for (int i = 0; i < CACHE_SLOTS && x; i++)
            if (!cache_x[i]) cache_x[i] = x, cache_cap[i] = cap, x = NULL;
        pthread_mutex_unlock(&cache_lock);
    }
    free(x);
}

sf_packet *sf_packet_new(sf_packet_kind kind, size_t cap_tokens, size_t cap_x)
{
    sf_packet *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    if (sf_packet_reserve(p, cap_tokens, cap_x) != SF_OK) {
        sf_packet_free(p);
        return NULL;
    }
    return p;
}

int sf_packet_reserve(sf_packet *p, size_t cap_tokens, size_t cap_x)
{
    if (cap_tokens > p->cap_tokens) {
        if (cap_tokens > SIZE_MAX / sizeof(uint32_t)) return sf_error(SF_E_NOMEM, "packet too large");
        uint32_t *t = realloc(p->tokens, cap_tokens * sizeof *t);
        if (!t) return sf_error(SF_E_NOMEM, "out of memory for %zu tokens", cap_tokens);
        p->tokens = t;
        p->cap_tokens = cap_tokens;
    }
    if (cap_x > p->cap_x) {
        if (cap_x > SIZE_MAX / sizeof(float)) return sf_error(SF_E_NOMEM, "packet too large");
        size_t cached = 0;
        float *x = p->cap_x == 0 ? cache_take(cap_x, &cached) : NULL;
        if (x) {
            p->x = x;
            p->cap_x = cached;
            return SF_OK;
        }
        x = realloc(p->x, cap_x * sizeof *x);
        if (!x) return sf_error(SF_E_NOMEM, "out of memory for %zu activations", cap_x);
        p->x = x;
        p->cap_x = cap_x;
    }
    return SF_OK;
}

static void release_device_rows(sf_packet *p)
{
    if (p->dev && p->dev_ops) p->dev_ops->release(p->dev_pool, p->dev);
    p->dev = NULL, p->dev_ops = NULL, p->dev_pool = NULL;
}

int sf_packet_to_host(sf_packet *p)
{
    if (!p || !p->dev) return SF_OK;
    size_t count = p->n * p->width;
    int rc = sf_packet_reserve(p, 0, count);
    if (rc == SF_OK && count) rc = p->dev_ops->download(p->dev_pool, p->x, p->dev, count * sizeof(float));
    release_device_rows(p);
    return rc;
}

void sf_packet_free(sf_packet *p)
{
    if (!p) return;
    release_device_rows(p);
    free(p->tokens);
    cache_give(p->x, p->cap_x);
    free(p->state);
    free(p);
}
