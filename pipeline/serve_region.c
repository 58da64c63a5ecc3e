/* A client's shared-memory region (serve_internal.h, serve_region_*; docs/SERVE.md, "Rows
 * through shared memory"): a POSIX shared-memory object that the server makes, maps writable
 * and uses as a ring of ROWS, and that a client on the same host maps read-only.
 *
 * Why: over a socket every byte of a reply is copied by the kernel twice (into the socket,
 * out of it) and by the I/O threads' bookkeeping; a float32 segment of the reference model is
 * 32 MiB, and at a GPU's rate ZeroMQ over ipc carries fewer rows than the pipeline makes. Through
 * the region a reply's rows are copied once, by the checksum threads that compute their CRC
 * anyway, and only a 48-byte ROWS_AT crosses the socket.
 *
 * Safety: the server makes the object itself (O_EXCL, mode 0600, a random name), so it never
 * writes into memory a client named; the object's pages are allocated in full at once
 * (posix_fallocate), so a full /dev/shm refuses the MAP instead of killing the server with
 * SIGBUS at a later write; the name is unlinked once the client attached (or when the client
 * is forgotten), so nothing is left behind once both sides unmap it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "pipeline/serve_internal.h"

#define REGION_ALIGN 64 /* each message starts on a cache line */

struct serve_region {
    char name[SF_SERVE_MAX_NAME + 1];
    int named;    /* the name still exists: unlinked at attach or free */
    int attached; /* the client mapped it: ROWS may go there */
    uint8_t *base;
    uint64_t size;
    uint64_t head;    /* where the next message goes (region position) */
    uint64_t sent;    /* the end of the last message announced to the client */
    uint64_t tail;    /* the client released everything before this */
    uint64_t largest; /* the largest message placed so far */
};

int serve_region_create(uint64_t size, serve_region **out)
{
    *out = NULL;
    serve_region *r = calloc(1, sizeof *r);
    if (!r) return sf_error(SF_E_NOMEM, "shared memory: no memory");
    uint8_t rnd[8] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        free(r);
        return sf_error(SF_E_IO, "shared memory: getrandom: %s", strerror(errno));
    }
    static unsigned counter;
    snprintf(r->name, sizeof r->name, "/seqflow-%ld-%u-%02x%02x%02x%02x%02x%02x%02x%02x", (long)getpid(), counter++,
             rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    const int fd = shm_open(r->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int e = errno;
        free(r);
        return sf_error(SF_E_IO, "shared memory: shm_open: %s", strerror(e));
    }
    r->named = 1;
    /* every page now: a /dev/shm without room says so here, not with SIGBUS at a write */
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc == 0) {
        r->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (r->base == MAP_FAILED) rc = errno, r->base = NULL;
    }
    close(fd);
    if (rc != 0) {
        serve_region_free(r);
        return sf_error(rc == ENOSPC || rc == ENOMEM || rc == EFBIG ? SF_E_NOMEM : SF_E_IO,
                        "shared memory: %llu bytes: %s", (unsigned long long)size, strerror(rc));
    }
    r->size = size;
    *out = r;
    return SF_OK;
}

void serve_region_free(serve_region *r)
{
    if (!r) return;
    if (r->named) shm_unlink(r->name);
    if (r->base) munmap(r->base, (size_t)r->size);
    free(r);
}

serve_region *serve_client_region(const serve_client *c)
{
    return c->version >= 4 && c->region && c->region->attached ? c->region : NULL;
}

void serve_region_attach(serve_region *r)
{
    if (r->named) shm_unlink(r->name);
    r->named = 0;
    r->attached = 1;
}

/* The offset of region position pos. */
static uint64_t offset_of(const serve_region *r, uint64_t pos) { return pos % r->size; }

/* Where a message of len bytes would go: at head, or at the start of the next round when it
 * would not fit before the region's end. */
static uint64_t placement(const serve_region *r, uint64_t len)
{
    const uint64_t off = offset_of(r, r->head);
    return off + len <= r->size ? r->head : r->head + (r->size - off);
}

int serve_region_reserve(serve_region *r, uint64_t len, uint64_t *pos)
{
    if (!r || len > r->size) return 0;
    const uint64_t at = placement(r, len);
    if (at + len - r->tail > r->size) return 0; /* the client still reads what lies there */
    *pos = at;
    r->head = (at + len + REGION_ALIGN - 1) & ~(uint64_t)(REGION_ALIGN - 1);
    if (len > r->largest) r->largest = len;
    return 1;
}

uint8_t *serve_region_at(const serve_region *r, uint64_t pos) { return r->base + offset_of(r, pos); }

void serve_region_sent(serve_region *r, uint64_t end)
{
    if (end > r->sent) r->sent = end;
}

int serve_region_has_room(const serve_region *r)
{
    if (!r) return 1;
    if (!r->largest) return r->head - r->tail < r->size;
    return placement(r, r->largest) + r->largest - r->tail <= r->size;
}

int serve_region_release(serve_region *r, uint64_t pos)
{
    if (pos > r->sent) return 0;
    if (pos > r->tail) r->tail = pos;
    /* all read and nothing reserved: the next message starts at the region's beginning. Else a
     * message of more than half the region could find the room on either side of the old head
     * too small for ever, though nothing is in use. */
    if (r->tail == r->sent && r->head == ((r->sent + REGION_ALIGN - 1) & ~(uint64_t)(REGION_ALIGN - 1)))
        r->head = r->tail = r->sent = (r->head + r->size - 1) / r->size * r->size;
    return 1;
}

uint64_t serve_region_in_use(const serve_region *r) { return r && r->sent > r->tail ? r->sent - r->tail : 0; }

void serve_region_cancel(serve_region *r, uint64_t pos)
{
    if (r && pos < r->head && pos >= r->sent) r->head = pos;
}

void serve_region_message(sf_serve *s, serve_client *c, const sf_serve_msg *m)
{
    serve_region *r = c->region;
    switch (m->type) {
    case SF_SERVE_MAP: {
        if (r) {
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION, "this client has a region already (%llu bytes)",
                              (unsigned long long)r->size);
            return;
        }
        if (!s->shm_budget) {
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION,
                              "this server makes no shared-memory regions (--shm-budget 0)");
            return;
        }
        const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t want = m->a ? m->a : s->region_default;
        if (want < SERVE_REGION_MIN) want = SERVE_REGION_MIN;
        if (want % page) want = want > UINT64_MAX - page ? UINT64_MAX : want - want % page + page; /* whole pages */
        if (want > s->shm_budget - s->shm_bytes) {
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION,
                              "a region of %llu bytes: %llu of the server's --shm-budget of %llu are left",
                              (unsigned long long)want, (unsigned long long)(s->shm_budget - s->shm_bytes),
                              (unsigned long long)s->shm_budget);
            return;
        }
        if (serve_region_create(want, &c->region) != SF_OK) {
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION, "%s", sf_last_error());
            return;
        }
        s->shm_bytes += want;
        uint8_t msg[SF_SERVE_HEADER_SIZE + SF_SERVE_MAX_NAME];
        const size_t n = strlen(c->region->name);
        sf_serve_header(msg, SF_SERVE_MAPPED, 0, want, n);
        memcpy(msg + SF_SERVE_HEADER_SIZE, c->region->name, n);
        serve_reply(s, c, msg, SF_SERVE_HEADER_SIZE + n);
        return;
    }
    case SF_SERVE_ATTACH:
        if (!r || m->a != r->size) {
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION, "ATTACH of %llu bytes: this client's region (MAP) has %llu",
                              (unsigned long long)m->a, (unsigned long long)(r ? r->size : 0));
            return;
        }
        serve_region_attach(r);
        return;
    case SF_SERVE_RELEASE:
        if (!r || !r->attached || !serve_region_release(r, m->a))
            serve_reply_error(s, c, 0, SF_SERVE_E_REGION, "RELEASE of %llu: the region holds rows up to %llu",
                              (unsigned long long)m->a, (unsigned long long)(r ? r->sent : 0));
        return;
    default: return;
    }
}

void serve_region_drop(sf_serve *s, serve_client *c)
{
    if (!c->region) return;
    s->shm_bytes -= c->region->size;
    serve_region_free(c->region);
    c->region = NULL;
}
