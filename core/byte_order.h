/* Little-endian integers in byte strings, and a bounds-checked reader over one: the wire forms
 * of messages and files that cross machines (the rendezvous, the server's checkpoints) are
 * little-endian whatever the host. Internal (not installed). */
#ifndef SEQFLOW_CORE_BYTE_ORDER_H
#define SEQFLOW_CORE_BYTE_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/buffer.h"

/* v's low `bytes` bytes (1..8) at p, least significant first. */
static inline void sf_le_store(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t sf_le_load(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Appends v as `bytes` little-endian bytes; sf_buffer_append's status. */
static inline int sf_buffer_put_le(sf_buffer *b, uint64_t v, int bytes)
{
    uint8_t x[8];
    sf_le_store(x, v, bytes);
    return sf_buffer_append(b, x, (size_t)bytes);
}

/* Reads p[0..n) front to back; a read past the end sets bad, returns NULL or zero, and every
 * later read fails too, so a decoder checks bad once at its end. */
typedef struct sf_byte_reader {
    const uint8_t *p;
    size_t n, at;
    int bad;
} sf_byte_reader;

static inline const uint8_t *sf_byte_take(sf_byte_reader *r, size_t n)
{
    if (r->bad || r->n - r->at < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->at;
    r->at += n;
    return p;
}

static inline uint64_t sf_byte_le(sf_byte_reader *r, int bytes)
{
    const uint8_t *p = sf_byte_take(r, (size_t)bytes);
    return p ? sf_le_load(p, bytes) : 0;
}

#endif
