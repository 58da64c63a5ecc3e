#include "seqflow/packet.h"
#include "seqflow/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Large activation buffers are kept for reuse when packets are freed: a segment's rows are
 * tens of MiB, which malloc serves with fresh mappings, and first-touching those pages cost
 * more than the GPU's whole compute of a segment; page-locked buffers (a GPU
 * backend's allocator) cost even more to make and to free. A few are kept: the cache holds at
 * most CACHE_SLOTS buffers of at most CACHE_MAX_FLOATS each and CACHE_MAX_TOTAL floats in all
 * (1.5 GiB, the process's, until it exits). A threaded GPU graph has up to a link's depth of
 * host packets in flight between its last stage and the sink, and `seqflow serve` hands its
 * packets' rows to ZeroMQ without a copy, holding up to its send budget's worth (32 segments
 * by default) until written, so the slots cover both; a miss costs a page-locked allocation
 * (milliseconds) and, once the cache is full, a page-locked free. */
#define CACHE_MIN_FLOATS ((size_t)1 << 18) /* 1 MiB */
#define CACHE_MAX_FLOATS ((size_t)1 << 26) /* 256 MiB: larger buffers go back to their allocator */
#define CACHE_MAX_TOTAL ((size_t)3 << 27)  /* 1.5 GiB */
#define CACHE_SLOTS 48
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static float *cache_x[CACHE_SLOTS];
static size_t cache_cap[CACHE_SLOTS];

/* Large buffers: malloc, or the installed allocator (page-locked memory of a GPU backend).
 * Each large buffer remembers its allocator's free in a 64-byte header (so the buffer keeps
 * the allocation's alignment), so buffers made before an allocator was installed, or on the
 * heap after it refused, are freed right. */
static sf_host_allocator large_alloc;

typedef struct large_header {
    void (*free)(void *ptr);
    char pad[64 - sizeof(void (*)(void *))];
} large_header;

void sf_packet_set_host_allocator(const sf_host_allocator *allocator)
{
    if (!allocator || !allocator->alloc || !allocator->free) return;
    pthread_mutex_lock(&cache_lock);
    if (!large_alloc.alloc) large_alloc = *allocator;
    pthread_mutex_unlock(&cache_lock);
}

static float *large_new(size_t cap)
{
    size_t bytes = sizeof(large_header) + cap * sizeof(float);
    pthread_mutex_lock(&cache_lock);
    sf_host_allocator a = large_alloc;
    pthread_mutex_unlock(&cache_lock);
    large_header *h = a.alloc ? a.alloc(bytes) : NULL;
    void (*release)(void *) = a.free;
    if (!h) { /* no allocator, or it ran out (page-locked memory is scarcer): the plain heap */
        h = malloc(bytes);
        release = free;
    }
    if (!h) return NULL;
    h->free = release;
    return (float *)(h + 1);
}

static void large_free(float *x)
{
    if (!x) return;
    large_header *h = (large_header *)x - 1;
    h->free(h);
}

/* A cached buffer of at least cap floats (the smallest that fits), or NULL. */
static float *cache_take(size_t cap, size_t *got)
{
    float *x = NULL;
    pthread_mutex_lock(&cache_lock);
    int best = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache_x[i] && cache_cap[i] >= cap && (best < 0 || cache_cap[i] < cache_cap[best])) best = i;
    if (best >= 0) x = cache_x[best], *got = cache_cap[best], cache_x[best] = NULL;
    pthread_mutex_unlock(&cache_lock);
    return x;
}

/* Keeps a large buffer for reuse, or frees it when the cache is full. */
static void cache_give(float *x, size_t cap)
{
    if (x && cap <= CACHE_MAX_FLOATS) {
        pthread_mutex_lock(&cache_lock);
        size_t total = cap;
        for (int i = 0; i < CACHE_SLOTS; i++) total += cache_x[i] ? cache_cap[i] : 0;
        for (int i = 0; i < CACHE_SLOTS && x && total <= CACHE_MAX_TOTAL; i++)
            if (!cache_x[i]) cache_x[i] = x, cache_cap[i] = cap, x = NULL;
        pthread_mutex_unlock(&cache_lock);
    }
    large_free(x);
}

/* Packet activations: small ones on the plain heap, large ones through the cache. */
static int is_large(size_t cap) { return cap >= CACHE_MIN_FLOATS; }

static void x_free(float *x, size_t cap)
{
    if (is_large(cap)) cache_give(x, cap);
    else free(x);
}

/* The one buffer behind x or x_bf16. */
static float *rows_buffer(const sf_packet *p) { return p->x ? p->x : (float *)p->x_bf16; }

/* Points x or x_bf16 (the other NULL) at buf, as dtype says. */
static void set_rows(sf_packet *p, sf_dtype dtype, float *buf)
{
    p->dtype = dtype;
    p->x = dtype == SF_DTYPE_F32 ? buf : NULL;
    p->x_bf16 = dtype == SF_DTYPE_BF16 ? (uint16_t *)buf : NULL;
}

/* float32 to bfloat16, rounded to nearest even; NaN stays a (quiet) NaN. */
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
        if (cap_x > (SIZE_MAX - sizeof(large_header)) / sizeof(float)) return sf_error(SF_E_NOMEM, "packet too large");
        float *old = rows_buffer(p), *x;
        size_t got = cap_x;
        if (!is_large(cap_x)) {
            x = realloc(old, cap_x * sizeof *x);
            if (!x) return sf_error(SF_E_NOMEM, "out of memory for %zu activations", cap_x);
        } else {
            x = cache_take(cap_x, &got);
            if (!x) x = large_new(cap_x);
            if (!x) return sf_error(SF_E_NOMEM, "out of memory for %zu activations", cap_x);
            if (p->cap_x) memcpy(x, old, p->cap_x * sizeof *x);
            x_free(old, p->cap_x);
        }
        set_rows(p, p->dtype, x);
        p->cap_x = got;
    }
    return SF_OK;
}

/* Waits for a copy under way (its result), then returns dev to its pool. */
static int release_device_rows(sf_packet *p)
{
    int rc = SF_OK;
    if (p->dev_ticket) rc = p->dev_ops->download_wait(p->dev_pool, p->dev_ticket);
    p->dev_ticket = NULL;
    if (p->dev && p->dev_ops) p->dev_ops->release(p->dev_pool, p->dev);
    p->dev = NULL, p->dev_ops = NULL, p->dev_pool = NULL;
    return rc;
}

int sf_packet_to_host(sf_packet *p)
{
    if (!p || !p->dev) return SF_OK;
    if (p->dev_ticket) return release_device_rows(p); /* the copy began: its end */
    size_t count = p->n * p->width;
    int rc = sf_packet_reserve(p, 0, count);
    if (rc == SF_OK && count) rc = p->dev_ops->download(p->dev_pool, p->x, p->dev, count * sizeof(float));
    release_device_rows(p);
    return rc;
}

int sf_packet_to_host_start(sf_packet *p)
{
    if (!p || !p->dev || p->dev_ticket) return SF_OK;
    const size_t count = p->n * p->width;
    if (!count || !p->dev_ops->download_start) return sf_packet_to_host(p);
    int rc = sf_packet_reserve(p, 0, count);
    if (rc != SF_OK) {
        release_device_rows(p);
        return rc;
    }
    void *ticket = NULL;
    rc = p->dev_ops->download_start(p->dev_pool, p->x, p->dev, count * sizeof(float), &ticket);
    if (rc == SF_E_UNSUPPORTED) return sf_packet_to_host(p);
    if (rc != SF_OK) {
        release_device_rows(p);
        return rc;
    }
    p->dev_ticket = ticket;
    return SF_OK;
}

static atomic_int check_finite_mode = SF_CHECK_FINITE_ON;

int sf_set_check_finite(sf_check_finite_mode mode)
{
    if (mode != SF_CHECK_FINITE_OFF && mode != SF_CHECK_FINITE_ON && mode != SF_CHECK_FINITE_HOST)
        return sf_error(SF_E_INVAL, "sf_set_check_finite: unknown mode %d", (int)mode);
    atomic_store(&check_finite_mode, (int)mode);
    return SF_OK;
}

sf_check_finite_mode sf_check_finite(void) { return (sf_check_finite_mode)atomic_load(&check_finite_mode); }

int sf_packet_check_finite(const sf_packet *p, const char *where)
{
    const void *rows = sf_packet_rows(p);
    const size_t count = p->n * p->width;
    if (!rows || !count) return SF_OK;
    size_t i = sf_first_non_finite(rows, p->dtype, count);
    if (i == count) return SF_OK;
    float value;
    if (p->dtype == SF_DTYPE_BF16) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)rows + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        memcpy(&value, &bits, 4);
    } else {
        memcpy(&value, (const unsigned char *)rows + 4 * i, 4);
    }
    return sf_error(SF_E_NONFINITE,
                    "non-finite value (%s) %s: stream %llu, position %llu, column %zu; the weights or the input "
                    "overflow float32",
                    value != value ? "NaN" : value > 0 ? "+inf" : "-inf", where, (unsigned long long)p->stream,
                    (unsigned long long)(p->position + i / p->width), i % p->width);
}

int sf_packet_to_bf16(sf_packet *p)
{
    if (!p) return sf_error(SF_E_INVAL, "sf_packet_to_bf16: NULL packet");
    if (p->dtype == SF_DTYPE_BF16) return SF_OK;
    int rc = sf_packet_to_host(p);
    if (rc != SF_OK) return rc;
    const size_t count = p->n * p->width;
    /* in place: value i is read before element i of the half-size array, which lies at or
     * below it, is written */
    float *x = p->x;
    uint16_t *out = (uint16_t *)x;
    for (size_t i = 0; i < count; i++) out[i] = sf_bf16_round(x[i]);
    set_rows(p, SF_DTYPE_BF16, x);
    return SF_OK;
}

int sf_packet_to_host_bf16(sf_packet *p, const void *dev_bf16)
{
    if (!p || !p->dev || !dev_bf16) {
        if (p) release_device_rows(p);
        return sf_error(SF_E_INVAL, "sf_packet_to_host_bf16: no device rows");
    }
    size_t count = p->n * p->width;
    int rc = sf_packet_reserve(p, 0, (count + 1) / 2);
    float *buf = rows_buffer(p);
    if (rc == SF_OK && count) rc = p->dev_ops->download(p->dev_pool, buf, (const float *)dev_bf16, count * sizeof(uint16_t));
    release_device_rows(p);
    if (rc == SF_OK) set_rows(p, SF_DTYPE_BF16, buf);
    return rc;
}

size_t sf_packet_row_bytes(const sf_packet *p)
{
    return p->n * p->width * sf_dtype_size(p->dtype);
}

void sf_packet_free(sf_packet *p)
{
    if (!p) return;
    release_device_rows(p);
    free(p->tokens);
    x_free(rows_buffer(p), p->cap_x);
    free(p->state);
    free(p);
}
