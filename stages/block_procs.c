/* Head ranks that are processes (stages/head_procs.h): the units of work rank 0 hands its
 * followers, as packets on the work links, and a follower's side of them. The rows and the
 * collectives go over the head ranks' communicator, as between threads (stages/block_shard.c):
 * on cpu the network one the graph gives (h->comm); on cuda an NCCL one each head rank makes at
 * init (the stage's, in b->comm) from an id head rank 0 sends over the network one, after every
 * rank checked that no two of them share a GPU. The network one carries the saved states (host
 * memory) on either backend, and a failure aborts both.
 *
 * A unit of work on the wire: a packet of kind FLUSH (no rows) whose state part holds, little-
 * endian: u32 "SFHW", u8 op, u8 count, u8 commit, u8 final, u32 n, u64 the unit's number (1, 2,
 * ... checked by the follower), count x u64 stream ids, then a RESTORE's state (the rest). A
 * SAVE's state (and on cuda the NCCL id) goes over the network communicator as exact messages:
 * its length as a u64 in four bf16 values, then its bytes as bf16 values, the last one padded.
 * A follower that fails (a RESTORE included) aborts the communicators with its reason, which
 * ends rank 0's next collective. */
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
    const int cuda = strcmp(be->ops->name, "cuda") == 0;
    if (cuda && !sf_comm_nccl_available())
        return sf_error(SF_E_UNSUPPORTED, "head_ranks=%s on cuda needs NCCL, which this build does not have (build "
                                          "with CUDA and NCCL, or run the head ranks on -d cpu)",
                        text);
    if (!cuda && strcmp(be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "head_ranks=%s: head ranks as processes run on the cpu and cuda backends, "
                                          "not on %s",
                        text, be->ops->name);
    *ranks = h->size;
    *rank = h->index;
    return SF_OK;
}

static int send_bytes(sf_comm *c, int peer, const uint8_t *data, size_t len);
static int recv_bytes(sf_comm *c, int peer, sf_buffer *out);

/* Refuses, on every head rank alike, two head ranks on one GPU (NCCL takes one rank a GPU):
 * each rank's GPU UUID (the same bytes in every process, whatever CUDA_VISIBLE_DEVICES numbers
 * it) and ordinal gathered over the network communicator. */
static int check_gpus(block *b)
{
    sf_head_procs *h = b->procs;
    enum { WORDS = 12 }; /* 16 bytes of UUID, the ordinal as 4 bytes, 4 bytes of padding: bf16 words */
    uint8_t mine[2 * WORDS] = {0};
    int rc = sf_comm_backend_gpu_uuid(b->be, mine);
    if (rc != SF_OK) return rc;
    sf_le_store(mine + 16, (uint32_t)sf_comm_backend_device(b->be), 4);
    uint8_t *all = calloc((size_t)h->size, sizeof mine);
    if (!all) return sf_error(SF_E_NOMEM, "out of memory");
    rc = sf_comm_all_gather(h->comm, mine, all, WORDS, SF_DTYPE_BF16);
    for (int r = 1; r < h->size && rc == SF_OK; r++)
        for (int q = 0; q < r && rc == SF_OK; q++)
            if (memcmp(all + q * sizeof mine, all + r * sizeof mine, 16) == 0)
                rc = sf_error(SF_E_OPTION, "head ranks %d and %d (job ranks %d and %d) are on one GPU (cuda:%u of "
                                           "job rank %d): NCCL takes one GPU a rank; give each process its own "
                                           "(-d cuda without an index takes the topology's devices, else the local "
                                           "rank's GPU; or -d cuda:N on each)",
                              q, r, h->ranks[q], h->ranks[r], (unsigned)sf_le_load(all + q * sizeof mine + 16, 4),
                              h->ranks[q]);
    free(all);
    return rc;
}

/* On cuda: the head ranks' NCCL communicator into b->comm (the stage's), from the id head rank
 * 0 makes and sends every follower over the network communicator. */
static int join_nccl(sf_stage *st, block *b)
{
    sf_head_procs *h = b->procs;
    const int timeout_ms = (int)sf_stage_option_int(st, "comm_timeout");
    uint8_t id[SF_COMM_NCCL_ID_BYTES] = {0};
    int rc = check_gpus(b);
    if (rc == SF_OK && h->index == 0) {
        rc = sf_comm_nccl_unique_id(id);
        for (int k = 1; k < h->size && rc == SF_OK; k++) rc = send_bytes(h->comm, k, id, sizeof id);
    } else if (rc == SF_OK) {
        sf_buffer got = {0};
        rc = recv_bytes(h->comm, 0, &got);
        if (rc == SF_OK && got.len != sizeof id)
            rc = sf_error(SF_E_PEER, "head rank %d: an NCCL id of %zu bytes from head rank 0, %zu expected", h->index,
                          got.len, sizeof id);
        if (rc == SF_OK) memcpy(id, got.data, sizeof id);
        sf_buffer_release(&got);
    }
    sf_comm *nccl = NULL;
    /* the graph raises h->stop when this process fails elsewhere: the join and every later wait end */
    if (rc == SF_OK) rc = sf_comm_nccl_create_watched(b->be, id, h->index, h->size, timeout_ms, &h->stop, &nccl);
    if (rc != SF_OK) {
        char why[480];
        snprintf(why, sizeof why, "head rank %d of %d (job rank %d) on GPU %d: %s", h->index, h->size,
                 h->ranks[h->index], sf_comm_backend_device(b->be), sf_last_error());
        sf_comm_abort(h->comm, why); /* the others, waiting for this rank, end with its reason */
        return sf_error(rc, "%s", why);
    }
    b->comm = nccl; /* the stage's: block_free frees it */
    return SF_OK;
}

int sf_block_procs_join(sf_stage *st, block *b)
{
    sf_head_procs *h = b->procs;
    int rc = SF_OK;
    if (strcmp(b->be->ops->name, "cuda") == 0) rc = join_nccl(st, b);
    else b->comm = h->comm; /* borrowed: the graph frees it */
    return rc == SF_OK ? sf_block_comm_warmup(b) : rc;
}

void sf_block_procs_abort(block *b, const char *why)
{
    sf_head_procs *h = b->procs;
    if (b->comm && b->comm != h->comm) sf_comm_abort(b->comm, why);
    sf_comm_abort(h->comm, why);
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

/* What send_bytes sent, appended to out. */
static int recv_bytes(sf_comm *c, int peer, sf_buffer *out)
{
    uint8_t head[8];
    int rc = sf_comm_recv_tagged(c, head, 4, SF_DTYPE_BF16, peer, 1);
    if (rc != SF_OK) return rc;
    const uint64_t len = sf_le_load(head, 8);
    if (len > (uint64_t)1 << 40)
        return sf_error(SF_E_STATE, "head-parallel rank %d sent a message of %llu bytes", peer, (unsigned long long)len);
    const size_t count = (size_t)(len + 1) / 2;
    uint8_t *data = malloc(2 * count + 1);
    if (!data) return sf_error(SF_E_NOMEM, "out of memory for %llu bytes", (unsigned long long)len);
    if (count) rc = sf_comm_recv_tagged(c, data, count, SF_DTYPE_BF16, peer, 1);
    if (rc == SF_OK) rc = sf_buffer_append(out, data, (size_t)len);
    free(data);
    return rc;
}

int sf_block_procs_gather(block *b, int k, sf_buffer *out)
{
    return recv_bytes(b->procs->comm, k, out); /* host memory: the network communicator, on cuda too */
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
    if (rc == SF_OK && w.op == SF_BLOCK_WORK_SAVE) rc = send_bytes(h->comm, 0, state.data, state.len);
    sf_buffer_release(&state);
    sf_packet_free(p);
    if (rc != SF_OK) {
        /* rank 0 and the others may be waiting in a collective for this rank: they end now, with
         * this reason, instead of at their timeout */
        char why[480];
        snprintf(why, sizeof why, "head rank %d of %d (job rank %d) failed: %s", h->index, h->size, h->ranks[h->index],
                 sf_last_error());
        sf_block_procs_abort(b, why);
        if (__atomic_load_n(&h->comm->lost_peer, __ATOMIC_ACQUIRE)) rc = SF_E_PEER; /* the job may roll back */
        sf_error(rc, "%s", why);
    }
    return rc;
}
