/* Packet buffers (core/packet.c): large activation buffers come from the installed host
 * allocator (a GPU backend's page-locked memory) and go back to the allocator that made them,
 * through the reuse cache; growing a packet keeps its contents across the small/large line;
 * device rows come over at once or through a copy begun early (sf_packet_to_host_start) and
 * waited for by sf_packet_to_host or sf_packet_free. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"

static int allocs, frees;
static size_t live_bytes;
#define MAX_LIVE 64
static void *live[MAX_LIVE];
static size_t live_size[MAX_LIVE];

static size_t refuse_above = (size_t)-1; /* counting_alloc fails for larger requests */

static void *counting_alloc(size_t bytes)
{
    if (bytes > refuse_above) return NULL;
    void *p = malloc(bytes);
    for (int i = 0; i < MAX_LIVE && p; i++)
        if (!live[i]) {
            live[i] = p, live_size[i] = bytes, live_bytes += bytes, allocs++;
            return p;
        }
    free(p);
    return NULL;
}

static void counting_free(void *p)
{
    if (!p) return;
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] == p) {
            live_bytes -= live_size[i], live[i] = NULL, frees++;
            free(p);
            return;
        }
    CHECKF(0, "counting_free got %p, which counting_alloc never returned", p);
}

static int owned_by_allocator(const void *x)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live[i] && (const char *)x >= (const char *)live[i] && (const char *)x < (const char *)live[i] + live_size[i])
            return 1;
    return 0;
}

/* sf_packet_to_bf16 rounds in place to nearest even (ties to even, +-Inf kept, NaN stays
 * NaN, overflow to Inf), sets the flag once, and halves sf_packet_row_bytes. */
static void bf16_rows(void)
{
    const float in[] = {1.0f, -2.5f, 1.00390625f /* 1 + 2^-8: a tie, to even (1.0) */,
                        1.01171875f /* 1 + 3*2^-8: a tie, to even (1 + 2^-6) */, 3.0e38f, 3.4e38f,
                        INFINITY, -0.0f, NAN, 1e-40f /* subnormal */};
    const uint16_t want[] = {0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F62, 0x7F80, 0x7F80, 0x8000, 0, 0x0001};
    const size_t count = sizeof in / sizeof in[0];
    sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, count);
    CHECK(p != NULL);
    if (!p) return;
    memcpy(p->x, in, sizeof in);
    p->n = 2, p->width = count / 2;
    CHECK(sf_packet_row_bytes(p) == count * 4);
    CHECK_OK(sf_packet_to_bf16(p));
    CHECK(p->dtype == SF_DTYPE_BF16 && p->x == NULL && p->x_bf16 != NULL && sf_packet_row_bytes(p) == count * 2);
    const uint16_t *got = p->x_bf16;
    for (size_t i = 0; i < count; i++) {
        if (i == 8) CHECKF((got[i] & 0x7F80) == 0x7F80 && (got[i] & 0x7F), "NaN became %#x", got[i]);
        else CHECKF(got[i] == want[i], "value %zu (%g): bf16 %#x, expected %#x", i, (double)in[i], got[i], want[i]);
    }
    uint16_t before[sizeof in / sizeof in[0]];
    memcpy(before, got, sizeof before);
    CHECK_OK(sf_packet_to_bf16(p)); /* already bf16: untouched */
    CHECK(memcmp(before, p->x_bf16, sizeof before) == 0);
    sf_packet_free(p);
}

/* ---- device rows: a pretend pool whose copies "run" until waited for --------------------- */

static int starts, waits, releases, start_answer = SF_OK;

static int fake_download(void *pool, void *host, const float *dev, size_t bytes)
{
    (void)pool;
    memcpy(host, dev, bytes);
    return SF_OK;
}

static void fake_release(void *pool, float *dev)
{
    (void)pool, (void)dev;
    releases++;
}

static int fake_start(void *pool, void *host, const float *dev, size_t bytes, void **ticket)
{
    (void)pool;
    if (start_answer != SF_OK) return start_answer;
    memcpy(host, dev, bytes); /* the copy lands before the wait: what a wait guarantees */
    starts++;
    *ticket = &starts;
    return SF_OK;
}

static int fake_wait(void *pool, void *ticket)
{
    (void)pool;
    waits += ticket == &starts;
    return SF_OK;
}

static void device_rows(void)
{
    static const sf_packet_device sync_only = {fake_download, fake_release, NULL, NULL};
    static const sf_packet_device with_start = {fake_download, fake_release, fake_start, fake_wait};
    float dev[6 * 4];
    for (int i = 0; i < 24; i++) dev[i] = (float)i * 0.5f;
    const sf_packet_device *kinds[] = {&with_start, &with_start, &sync_only, &with_start};
    for (int k = 0; k < 4; k++) {
        starts = waits = releases = 0;
        start_answer = k == 3 ? SF_E_UNSUPPORTED : SF_OK; /* a pool that cannot now: brought over at once */
        sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, 0);
        p->n = 6, p->width = 4;
        p->dev = dev, p->dev_ops = kinds[k], p->dev_pool = NULL;
        CHECK_OK(sf_packet_to_host_start(p));
        const int began = k < 2;
        CHECKF((p->dev_ticket != NULL) == began && (p->dev != NULL) == began && releases == !began,
               "case %d: a copy under way %d, dev kept %d, released %d", k, p->dev_ticket != NULL, p->dev != NULL,
               releases);
        if (k == 1) { /* freed while its copy is under way: waited for, then released */
            sf_packet_free(p);
            CHECK(waits == 1 && releases == 1);
            continue;
        }
        CHECK_OK(sf_packet_to_host(p));
        CHECK(p->dev == NULL && p->dev_ticket == NULL && releases == 1 && waits == began);
        CHECK(p->x && memcmp(p->x, dev, sizeof dev) == 0);
        CHECK_OK(sf_packet_to_host(p)); /* nothing left to do */
        CHECK(releases == 1 && waits == began);
        sf_packet_free(p);
    }
}

int main(void)
{
    bf16_rows();
    const size_t big = (size_t)1 << 20; /* floats: 4 MiB, a large buffer */
    /* before any allocator: a large buffer from malloc, freed to the cache after install below */
    sf_packet *early = sf_packet_new(SF_PACKET_HIDDEN, 0, big + 5);
    CHECK(early != NULL);
    if (early) early->x[big + 4] = 1.5f;

    static const sf_host_allocator counting = {counting_alloc, counting_free};
    sf_packet_set_host_allocator(&counting);
    static const sf_host_allocator other = {malloc, free};
    sf_packet_set_host_allocator(&other); /* the first one stays */

    /* small buffers stay on the heap, however often they grow */
    sf_packet *p = sf_packet_new(SF_PACKET_HIDDEN, 0, 100);
    CHECK(p != NULL);
    for (int i = 0; i < 100; i++) p->x[i] = (float)i;
    CHECK(allocs == 0);
    /* growing past the line: a large buffer from the allocator, contents kept */
    CHECK_OK(sf_packet_reserve(p, 0, 3 * big));
    CHECK(allocs == 1 && owned_by_allocator(p->x));
    CHECKF(((uintptr_t)p->x & 15) == 0, "large buffer %p is not 16-byte aligned", (void *)p->x);
    int kept = 1;
    for (int i = 0; i < 100; i++) kept &= p->x[i] == (float)i;
    CHECKF(kept, "growing a packet lost its contents");
    p->x[3 * big - 1] = 7.0f;
    /* and again, large to larger: contents kept, the old buffer goes to the cache, not freed */
    CHECK_OK(sf_packet_reserve(p, 0, 4 * big));
    CHECK(allocs == 2 && owned_by_allocator(p->x) && p->x[3 * big - 1] == 7.0f && p->x[99] == 99.0f);
    CHECK(frees == 0);
    /* a new packet of 3*big takes the cached buffer: no allocation */
    sf_packet *q = sf_packet_new(SF_PACKET_HIDDEN, 0, 3 * big);
    CHECK(q != NULL && allocs == 2 && owned_by_allocator(q->x));
    sf_packet_free(q);
    sf_packet_free(p);
    /* the early malloc'd buffer is reused too, and its free goes to free(), not counting_free */
    sf_packet_free(early);
    /* fill the cache far past its bounds: every buffer beyond them goes back to its allocator */
    enum { MANY = 64 }; /* past the cache's 48 slots */
    sf_packet *many[MANY];
    int made = 0;
    for (int i = 0; i < MANY; i++) {
        many[i] = sf_packet_new(SF_PACKET_HIDDEN, 0, 2 * big); /* 8 MiB each */
        made += many[i] != NULL;
    }
    CHECK(made == MANY);
    int peak_allocs = allocs;
    for (int i = 0; i < MANY; i++) sf_packet_free(many[i]);
    CHECKF(frees > 0, "no buffer went back to the allocator (allocs %d, frees %d)", allocs, frees);
    CHECKF(live_bytes <= ((size_t)3 << 29) + ((size_t)1 << 26),
           "the cache keeps %zu bytes alive, over its 1.5 GiB bound", live_bytes);
    /* the cache still serves: one more packet of that size allocates nothing */
    sf_packet *again = sf_packet_new(SF_PACKET_HIDDEN, 0, 2 * big);
    CHECK(again != NULL && allocs == peak_allocs);
    sf_packet_free(again);
    /* the allocator refusing (page-locked memory ran out) falls back to the heap, not to an error */
    refuse_above = 0;
    int before = allocs;
    sf_packet *fallback = sf_packet_new(SF_PACKET_HIDDEN, 0, 16 * big); /* larger than anything cached */
    CHECK(fallback != NULL && allocs == before && !owned_by_allocator(fallback->x));
    if (fallback) fallback->x[16 * big - 1] = 3.0f;
    sf_packet_free(fallback); /* goes to free(), which counting_free would report */
    device_rows();
    return check_finish("test_packet");
}
