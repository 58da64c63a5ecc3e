/* Head ranks that are processes (stages/head_procs.h): the units of work rank 0 hands its
 * followers, as packets on the work links, and a follower's side of them. The rows and the
 * collectives go over the head ranks' communicator, as between threads (stages/block_shard.c).
 *
 * A unit of work on the wire: a packet of kind FLUSH (no rows) whose state part holds, little-
 * endian: u32 "SFHW", u8 op, u8 count, u8 commit, u8 final, u32 n, u64 the unit's number (1, 2,
 * ... checked by the follower), count x u64 stream ids, then a RESTORE's state (the rest). A
 * SAVE's state comes back over the communicator (exact messages to rank 0: its length as a u64
 * in four bf16 values, then its bytes as bf16 values, the last one padded). A follower that
 * fails (a RESTORE included) aborts the communicator with its reason, which ends rank 0's next
 * collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/byte_order.h"
#include "kernels/comm.h"
#include "stages/block_shard.h"
#include "stages/head_procs.h"

#define WORK_MAGIC 0x57484653u /* "SFHW" */
#define WORK_HEAD 20           /* bytes before the stream ids */

int sf_head_ranks_parse(const char *text, int *ranks, int max, int *n)
{
    *n = 0;
    const char *p = text ? text : "";
    while (*p) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1 << 20 || (*end && *end != ','))
            return sf_error(SF_E_OPTION, "head_ranks=%s: expected ranks (integers >= 0) separated by commas", text);
        if (*n == max) return sf_error(SF_E_OPTION, "head_ranks=%s: more than %d ranks", text, max);
        for (int j = 0; j < *n; j++)
            if (ranks[j] == (int)v) return sf_error(SF_E_OPTION, "head_ranks=%s lists rank %ld twice", text, v);
        ranks[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return sf_error(SF_E_OPTION, "head_ranks=%s ends with ','", text);
    }
    if (*n == 0) return sf_error(SF_E_OPTION, "head_ranks= is empty: list the job's ranks, e.g. head_ranks=0,1");
    return SF_OK;
}

int sf_block_procs_plan(sf_stage *st, sf_head_procs *h, int *ranks, int *rank)
{
    const char *text = sf_stage_option(st, "head_ranks");
    *rank = 0;
    if (!text) return SF_OK;
    if (!h)
        return sf_error(SF_E_UNSUPPORTED, "head_ranks=%s splits the heads over processes of a distributed run: run it "
                                          "with `seqflow launch` or `seqflow worker` (in one process: heads_of=)",
                        text);
    if (*ranks && *ranks != h->size)
        return sf_error(SF_E_OPTION, "heads_of=%d and head_ranks=%s (%d ranks) disagree", *ranks, text, h->size);
    const sf_backend *be = sf_stage_backend(st);
    if (strcmp(be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "head_ranks=%s: head ranks as processes run on the cpu backend; on %s, "
                                          "split the heads over the devices of one process (heads_of= devices=)",
                        text, be->ops->name);
    *ranks = h->size;
    *rank = h->index;
    return SF_OK;
}

int sf_block_procs_join(block *b)
{
    b->comm = b->procs->comm; /* borrowed: the graph frees it */
    return sf_block_comm_warmup(b);
}

/* The unit's bytes into out (RESTORE's data after them). */
static int work_bytes(const block_work *w, uint64_t unit, const uint8_t *data, size_t len, sf_buffer *out)
{
    int rc = sf_buffer_put_le(out, WORK_MAGIC, 4);
    const uint8_t flags[4] = {(uint8_t)w->op, (uint8_t)w->count, (uint8_t)(w->commit != 0), (uint8_t)(w->final != 0)};
    if (rc == SF_OK) rc = sf_buffer_append(out, flags, sizeof flags);
    if (rc == SF_OK) rc = sf_buffer_put_le(out, (uint32_t)w->n, 4);
    if (rc == SF_OK) rc = sf_buffer_put_le(out, unit, 8);
    for (int i = 0; i < w->count && rc == SF_OK; i++) rc = sf_buffer_put_le(out, w->streams[i], 8);
    if (rc == SF_OK && len) rc = sf_buffer_append(out, data, len);
    return rc;
}

int sf_block_procs_send(block *b, const block_work *w, const uint8_t *const *data, const size_t *len)
{
    sf_head_procs *h = b->procs;
    const uint64_t unit = ++b->procs_units;
    int rc = SF_OK;
    for (int k = 1; k < h->size && rc == SF_OK; k++) {
        sf_buffer bytes = {0};
        rc = work_bytes(w, unit, data ? data[k] : NULL, len ? len[k] : 0, &bytes);
        sf_packet *p = rc == SF_OK ? sf_packet_new(SF_PACKET_FLUSH, 0, 0) : NULL;
        if (rc == SF_OK && !p) rc = sf_error(SF_E_NOMEM, "out of memory");
        if (rc != SF_OK) {
            sf_buffer_release(&bytes);
            break;
        }
        p->stream = w->count ? w->streams[0] : 0;
        p->segment = unit;
        p->state = bytes.data, p->state_len = bytes.len, p->state_cap = bytes.cap;
        rc = h->push(h->links, k, p);
        if (rc != SF_OK)
            rc = sf_error(rc, "head rank %d of %d (job rank %d) takes no more work: %s", k, h->size, h->ranks[k],
                          sf_last_error());
    }
    return rc;
}

/* A length and that many bytes, as exact bf16 messages (bf16 values are never quantized). */
static int send_bytes(sf_comm *c, int peer, const uint8_t *data, size_t len)
{
    uint8_t head[8];
    sf_le_store(head, len, 8);
    int rc = sf_comm_send_tagged(c, head, 4, SF_DTYPE_BF16, peer, 0, 1);
    if (rc != SF_OK || !len) return rc;
    const size_t count = (len + 1) / 2;
    uint8_t *padded = malloc(2 * count);
    if (!padded) return sf_error(SF_E_NOMEM, "out of memory for %zu bytes of state", len);
    memcpy(padded, data, len);
    if (len % 2) padded[len] = 0;
    rc = sf_comm_send_tagged(c, padded, count, SF_DTYPE_BF16, peer, 0, 1);
    free(padded);
    return rc;
}

int sf_block_procs_gather(block *b, int k, sf_buffer *out)
{
    uint8_t head[8];
    int rc = sf_comm_recv_tagged(b->comm, head, 4, SF_DTYPE_BF16, k, 1);
    if (rc != SF_OK) return rc;
    const uint64_t len = sf_le_load(head, 8);
    if (len > (uint64_t)1 << 40)
        return sf_error(SF_E_STATE, "head-parallel rank %d sent a state of %llu bytes", k, (unsigned long long)len);
    const size_t count = (size_t)(len + 1) / 2;
    uint8_t *data = malloc(2 * count + 1);
    if (!data) return sf_error(SF_E_NOMEM, "out of memory for %llu bytes of state", (unsigned long long)len);
    if (count) rc = sf_comm_recv_tagged(b->comm, data, count, SF_DTYPE_BF16, k, 1);
    if (rc == SF_OK) rc = sf_buffer_append(out, data, (size_t)len);
    free(data);
    return rc;
}

/* One unit of work from p's bytes into *w (RESTORE: w->data points into p). */
static int work_parse(block *b, const sf_packet *p, block_work *w)
{
    sf_byte_reader r = {p->state, p->state_len, 0, 0};
    const uint32_t magic = (uint32_t)sf_byte_le(&r, 4);
    const uint8_t *flags = sf_byte_take(&r, 4);
    const uint32_t n = (uint32_t)sf_byte_le(&r, 4);
    const uint64_t unit = sf_byte_le(&r, 8);
    if (r.bad || magic != WORK_MAGIC || p->kind != SF_PACKET_FLUSH)
        return sf_error(SF_E_PEER, "head-parallel rank %d: its input is not work from rank 0 (kind %d, %zu bytes)",
                        b->rank, (int)p->kind, p->state_len);
    if (unit != b->procs_units + 1)
        return sf_error(SF_E_PEER, "head-parallel rank %d: unit of work %llu, %llu expected", b->rank,
                        (unsigned long long)unit, (unsigned long long)(b->procs_units + 1));
    *w = (block_work){.op = flags[0], .count = flags[1], .commit = flags[2], .final = flags[3], .n = (int)n};
    if (w->op > SF_BLOCK_WORK_QUIT || w->count > SF_BLOCK_MAX_BATCH || w->n < 0 || w->n > b->cfg->segment ||
        (w->op == SF_BLOCK_WORK_FORWARD && w->count < 1))
        return sf_error(SF_E_PEER, "head-parallel rank %d: a malformed unit of work (op %d, %d streams of %d rows)",
                        b->rank, w->op, w->count, w->n);
    for (int i = 0; i < w->count; i++) w->streams[i] = sf_byte_le(&r, 8);
    if (r.bad) return sf_error(SF_E_PEER, "head-parallel rank %d: a unit of work is truncated", b->rank);
    w->data = p->state + r.at, w->len = p->state_len - r.at;
    b->procs_units = unit;
    return SF_OK;
}

int sf_block_procs_follow(block *b, sf_packet *p)
{
    sf_head_procs *h = b->procs;
    block_work w;
    sf_buffer state = {0};
    int rc = work_parse(b, p, &w);
    if (rc == SF_OK && w.op == SF_BLOCK_WORK_SAVE) w.out = &state;
    if (rc == SF_OK) rc = sf_block_follow(b, &w);
    if (rc == SF_OK && w.op == SF_BLOCK_WORK_SAVE) rc = send_bytes(b->comm, 0, state.data, state.len);
    sf_buffer_release(&state);
    sf_packet_free(p);
    if (rc != SF_OK) {
        /* rank 0 and the others may be waiting in a collective for this rank: they end now, with
         * this reason, instead of at their timeout */
        char why[480];
        snprintf(why, sizeof why, "head rank %d of %d (job rank %d) failed: %s", h->index, h->size, h->ranks[h->index],
                 sf_last_error());
        sf_comm_abort(b->comm, why);
        if (__atomic_load_n(&b->comm->lost_peer, __ATOMIC_ACQUIRE)) rc = SF_E_PEER; /* the job may roll back */
        sf_error(rc, "%s", why);
    }
    return rc;
}
