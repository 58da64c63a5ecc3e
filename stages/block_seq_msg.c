/* Sequence parallelism's messages (stages/block_seq_internal.h): a rank's part of a layer's
 * state, how parts combine, and their wire form. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/frame.h"
#include "kernels/memory_map.h"
#include "stages/block_seq_internal.h"

double seq_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* ---- messages ---------------------------------------------------------------------------- */

int seq_msg_alloc(const sf_seq *q, seq_msg *m)
{
    memset(m, 0, sizeof *m);
    m->z = calloc(q->hd, sizeof *m->z);
    m->B = calloc(q->hdd ? q->hdd : 1, sizeof *m->B);
    if (q->kind == SF_MEMORY_DELTA) m->A = calloc(q->hdd, sizeof *m->A);
    if (q->G) {
        m->tk = calloc((size_t)q->G * q->W, sizeof *m->tk);
        m->tv = calloc((size_t)q->G * q->W, sizeof *m->tv);
    }
    if (!m->z || !m->B || (q->kind == SF_MEMORY_DELTA && !m->A) || (q->G && (!m->tk || !m->tv)))
        return sf_error(SF_E_NOMEM, "out of memory for the sequence-parallel exchange");
    return SF_OK;
}

void seq_msg_free(seq_msg *m)
{
    free(m->z), free(m->B), free(m->A), free(m->tk), free(m->tv);
    memset(m, 0, sizeof *m);
}

void seq_msg_identity(const sf_seq *q, seq_msg *m)
{
    memset(m->z, 0, q->hd * sizeof *m->z);
    sf_memory_map_identity(q->H, q->d, m->A, m->B);
    m->cnt = 0;
}

/* tokens (tk, tv, cnt) <- the last G of (tokens, count more from k, v) */
void seq_tail_append(const sf_seq *q, float *tk, float *tv, int *cnt, const float *k, const float *v, int count)
{
    const size_t row = (size_t)q->W;
    if (count >= q->G) {
        memcpy(tk, k + (size_t)(count - q->G) * row, (size_t)q->G * row * sizeof *tk);
        memcpy(tv, v + (size_t)(count - q->G) * row, (size_t)q->G * row * sizeof *tv);
        *cnt = q->G;
        return;
    }
    const int keep = *cnt + count > q->G ? q->G - count : *cnt, drop = *cnt - keep;
    memmove(tk, tk + (size_t)drop * row, (size_t)keep * row * sizeof *tk);
    memmove(tv, tv + (size_t)drop * row, (size_t)keep * row * sizeof *tv);
    memcpy(tk + (size_t)keep * row, k, (size_t)count * row * sizeof *tk);
    memcpy(tv + (size_t)keep * row, v, (size_t)count * row * sizeof *tv);
    *cnt = keep + count;
}

/* a <- a then b, for the given parts */
int seq_msg_then(const sf_seq *q, seq_msg *a, const seq_msg *b, int parts)
{
    if (parts & PART_Z)
        for (size_t i = 0; i < q->hd; i++) a->z[i] += b->z[i];
    if ((parts & PART_TAIL) && q->G) seq_tail_append(q, a->tk, a->tv, &a->cnt, b->tk, b->tv, b->cnt);
    if (!(parts & PART_B)) return SF_OK;
    return sf_memory_map_then(q->H, q->d, (parts & PART_A) ? b->A : NULL, b->B, (parts & PART_A) ? a->A : NULL, a->B);
}

void seq_msg_copy(const sf_seq *q, seq_msg *dst, const seq_msg *src)
{
    memcpy(dst->z, src->z, q->hd * sizeof *dst->z);
    memcpy(dst->B, src->B, q->hdd * sizeof *dst->B);
    if (dst->A) memcpy(dst->A, src->A, q->hdd * sizeof *dst->A);
    if (q->G) {
        memcpy(dst->tk, src->tk, (size_t)src->cnt * q->W * sizeof *dst->tk);
        memcpy(dst->tv, src->tv, (size_t)src->cnt * q->W * sizeof *dst->tv);
    }
    dst->cnt = src->cnt;
}

/* The wire form: a header of 4 uint32 (magic, parts, tokens, hash), z as float32, the tokens'
 * k then v as float32, then A and B, each as float32 or, with quant (between gateways), in the
 * tier's encoding (compress/quantize.h; B with error feedback fb). */
static int ensure_wire(sf_seq *q, size_t bytes)
{
    if (bytes <= q->wire_cap) return SF_OK;
    uint8_t *w = realloc(q->wire, bytes);
    if (!w) return sf_error(SF_E_NOMEM, "out of memory for a %zu-byte exchange message", bytes);
    q->wire = w, q->wire_cap = bytes;
    return SF_OK;
}

static size_t map_bytes(const sf_seq *q, const sf_quant_params *quant)
{
    return quant && quant->kind != SF_QUANT_F32 ? sf_quant_encoded_size(quant, q->hdd) : q->hdd * sizeof(float);
}

static size_t msg_bytes(const sf_seq *q, const seq_msg *m, int parts, const sf_quant_params *quant)
{
    size_t n = 16;
    if (parts & PART_Z) n += q->hd * sizeof(float);
    if (parts & PART_TAIL) n += 2 * (size_t)m->cnt * q->W * sizeof(float);
    if (parts & PART_A) n += map_bytes(q, quant);
    if (parts & PART_B) n += map_bytes(q, quant);
    return n;
}

/* A map part on the wire: B as it is, A as A - I (is_a), whose entries are all small, so that
 * a scale per group and float32 both keep what A does to M rather than the identity's 1s. */
static int put_map(sf_seq *q, const double *src, int is_a, uint8_t *out, const sf_quant_params *quant,
                   sf_quant_feedback *fb)
{
    float *f = malloc(q->hdd * sizeof *f);
    if (!f) return sf_error(SF_E_NOMEM, "out of memory");
    const size_t diag = (size_t)q->d + 1;
    for (size_t i = 0; i < q->hdd; i++) f[i] = (float)(src[i] - (is_a && i % ((size_t)q->d * q->d) % diag == 0));
    int rc = SF_OK;
    if (quant && quant->kind != SF_QUANT_F32)
        rc = fb ? sf_quantize_with_feedback(quant, fb, f, q->hdd, out, map_bytes(q, quant))
                : sf_quantize(quant, f, q->hdd, out, map_bytes(q, quant));
    else
        memcpy(out, f, q->hdd * sizeof *f);
    free(f);
    return rc;
}

static int get_map(const sf_seq *q, const uint8_t *in, double *dst, int is_a, const sf_quant_params *quant)
{
    const size_t diag = (size_t)q->d + 1;
    float *f = malloc(q->hdd * sizeof *f);
    if (!f) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = SF_OK;
    if (quant && quant->kind != SF_QUANT_F32) rc = sf_dequantize(quant, in, map_bytes(q, quant), f, q->hdd);
    else memcpy(f, in, q->hdd * sizeof *f);
    for (size_t i = 0; rc == SF_OK && i < q->hdd; i++)
        dst[i] = (double)f[i] + (is_a && i % ((size_t)q->d * q->d) % diag == 0);
    free(f);
    return rc;
}

int seq_msg_encode(sf_seq *q, const seq_msg *m, int parts, uint32_t hash, const sf_quant_params *quant,
                      sf_quant_feedback *fb, size_t *len)
{
    const size_t bytes = msg_bytes(q, m, parts, quant);
    int rc = ensure_wire(q, bytes);
    if (rc != SF_OK) return rc;
    uint32_t head[4] = {MSG_MAGIC, (uint32_t)parts, (uint32_t)m->cnt, hash};
    uint8_t *p = q->wire;
    memcpy(p, head, sizeof head), p += sizeof head;
    if (parts & PART_Z)
        for (size_t i = 0; i < q->hd; i++, p += sizeof(float)) {
            float f = (float)m->z[i];
            memcpy(p, &f, sizeof f);
        }
    if ((parts & PART_TAIL) && m->cnt) {
        const size_t t = (size_t)m->cnt * q->W * sizeof(float);
        memcpy(p, m->tk, t), p += t;
        memcpy(p, m->tv, t), p += t;
    }
    if (rc == SF_OK && (parts & PART_A)) rc = put_map(q, m->A, 1, p, quant, fb ? fb + 1 : NULL), p += map_bytes(q, quant);
    if (rc == SF_OK && (parts & PART_B)) rc = put_map(q, m->B, 0, p, quant, fb), p += map_bytes(q, quant);
    *len = bytes;
    return rc;
}

/* m <- the message in q->wire (len bytes); parts it lacks are left as the identity */
int seq_msg_decode(const sf_seq *q, size_t len, seq_msg *m, uint32_t *hash, const sf_quant_params *quant)
{
    uint32_t head[4];
    if (len < sizeof head) return sf_error(SF_E_COMM, "sequence exchange: a message of %zu bytes", len);
    memcpy(head, q->wire, sizeof head);
    const int parts = (int)head[1];
    if (head[0] != MSG_MAGIC || head[2] > (uint32_t)q->G || (parts & ~15))
        return sf_error(SF_E_COMM, "sequence exchange: malformed message (magic %08x, %u tokens)", head[0], head[2]);
    seq_msg_identity(q, m);
    m->cnt = (int)head[2];
    if (hash) *hash = head[3];
    if (len != msg_bytes(q, m, parts, quant))
        return sf_error(SF_E_COMM, "sequence exchange: a message of %zu bytes, %zu expected (do the ranks agree on the "
                        "model and the tier?)", len, msg_bytes(q, m, parts, quant));
    const uint8_t *p = q->wire + sizeof head;
    if (parts & PART_Z)
        for (size_t i = 0; i < q->hd; i++, p += sizeof(float)) {
            float f;
            memcpy(&f, p, sizeof f);
            m->z[i] = f;
        }
    if ((parts & PART_TAIL) && m->cnt) {
        const size_t t = (size_t)m->cnt * q->W * sizeof(float);
        memcpy(m->tk, p, t), p += t;
        memcpy(m->tv, p, t), p += t;
    }
    int rc = SF_OK;
    if ((parts & PART_A) && m->A) rc = get_map(q, p, m->A, 1, quant), p += map_bytes(q, quant);
    if (rc == SF_OK && (parts & PART_B)) rc = get_map(q, p, m->B, 0, quant);
    return rc;
}

/* The wire's bytes travel as float32 elements of exact messages: a length first, then the
 * bytes padded to whole elements. */
int seq_wire_send(sf_seq *q, int peer, size_t len, int across)
{
    float head;
    uint32_t n = (uint32_t)len;
    memcpy(&head, &n, sizeof head);
    int rc = sf_comm_send_tagged(q->comm, &head, 1, SF_DTYPE_F32, peer, 0, 1);
    const size_t elems = (len + 3) / 4;
    if (rc == SF_OK) rc = ensure_wire(q, elems * 4);
    if (rc == SF_OK) memset(q->wire + len, 0, elems * 4 - len);
    if (rc == SF_OK) rc = sf_comm_send_tagged(q->comm, q->wire, elems, SF_DTYPE_F32, peer, 0, 1);
    if (across) q->stats.sent_across += elems * 4 + 4;
    else q->stats.sent_within += elems * 4 + 4;
    return rc;
}

int seq_wire_recv(sf_seq *q, int peer, size_t *len, int across)
{
    *len = 0;
    float head;
    const double t0 = seq_now_s();
    int rc = sf_comm_recv_tagged(q->comm, &head, 1, SF_DTYPE_F32, peer, 1);
    *(peer < q->rank ? &q->stats.blocked_before_s : &q->stats.blocked_after_s) += seq_now_s() - t0;
    if (rc != SF_OK) return rc;
    uint32_t n;
    memcpy(&n, &head, sizeof n);
    if (n > (1u << 30)) return sf_error(SF_E_COMM, "sequence exchange: rank %d announced %u bytes", peer, n);
    const size_t elems = (n + 3) / 4;
    rc = ensure_wire(q, elems * 4 + 4);
    if (rc == SF_OK) rc = sf_comm_recv_tagged(q->comm, q->wire, elems, SF_DTYPE_F32, peer, 1);
    *len = n;
    if (across) q->stats.received_across += elems * 4 + 4;
    else q->stats.received_within += elems * 4 + 4;
    return rc;
}

int seq_send_msg(sf_seq *q, int peer, const seq_msg *m, int parts, uint32_t hash, const sf_quant_params *quant,
                    sf_quant_feedback *fb)
{
    size_t len;
    int rc = seq_msg_encode(q, m, parts, hash, quant, fb, &len);
    return rc == SF_OK ? seq_wire_send(q, peer, len, q->group_of[peer] != q->group_of[q->rank]) : rc;
}

int seq_recv_msg(sf_seq *q, int peer, seq_msg *m, uint32_t *hash, const sf_quant_params *quant)
{
    size_t len;
    int rc = seq_wire_recv(q, peer, &len, q->group_of[peer] != q->group_of[q->rank]);
    return rc == SF_OK ? seq_msg_decode(q, len, m, hash, quant) : rc;
}

/* m <- what m becomes on the wire (float32, or the tier's encoding): every rank uses only that,
 * its own part included, so that all hold the same bits */
int seq_msg_canon(sf_seq *q, seq_msg *m, int parts, const sf_quant_params *quant, sf_quant_feedback *fb)
{
    size_t len;
    int rc = seq_msg_encode(q, m, parts, 0, quant, fb, &len);
    return rc == SF_OK ? seq_msg_decode(q, len, m, NULL, quant) : rc;
}
