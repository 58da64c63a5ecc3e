/* Head-parallel blocks (stages/block_shard.h): the plan of a rank's part, its weights, and the
 * other ranks' threads, which do what rank 0 hands them (sf_block_follow in block.c). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm.h"
#include "stages/block_shard.h"
#include "stages/head_procs.h"

#define SHARD_QUEUE 32
/* The first word of a sharded state: larger than any stream count (max_streams <= 2^20), so
 * that an unsharded block's state never starts with it */
#define SHARD_MAGIC 0x53484431u /* "1DHS" */

typedef struct follower {
    block b;
    struct block_shard *shard;
    sf_backend *be; /* owned */
    int device;
    pthread_t thread;
    int started;
    block_work queue[SHARD_QUEUE];
    int head, queued;
    unsigned long done; /* units of work finished */
    int result;         /* the last unit's status */
} follower;

struct block_shard {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int ranks, ready, quit;
    follower *f;         /* [ranks]; f[0] unused (rank 0 is the stage) */
    unsigned long sent;  /* units of work handed to each follower */
    int failed;          /* any rank failed (read by the communicators' waits: sf_comm_watch) */
    int failed_rank;
    char why[480];
    const sf_model *model;
    int timeout_ms;
    unsigned char nccl_id[SF_COMM_NCCL_ID_BYTES];
    sf_comm **host_comms; /* [ranks] for cpu ranks, each taken by its rank */
};

int sf_block_shard_plan(block *b, int rank, int ranks)
{
    const sf_model_config *c = b->cfg;
    if (ranks < 1) ranks = 1;
    if (c->heads % ranks)
        return sf_error(SF_E_OPTION, "heads_of=%d: the model's %d heads do not split over %d ranks (H must be a multiple "
                                     "of the ranks)",
                        ranks, c->heads, ranks);
    if (c->mlp_hidden % ranks)
        return sf_error(SF_E_OPTION, "heads_of=%d: the MLP's width F=%d does not split over %d ranks", ranks,
                        c->mlp_hidden, ranks);
    b->rank = rank, b->ranks = ranks;
    b->heads = c->heads / ranks, b->head0 = rank * b->heads;
    b->hidden = c->mlp_hidden / ranks;
    b->width = b->heads * c->head_dim;
    return SF_OK;
}

/* cols columns from column `first` of each of the rows of w ([rows, ld]), uploaded as [rows, cols]. */
static float *upload_columns(block *b, const float *w, size_t rows, size_t ld, size_t first, size_t cols, int *rc)
{
    if (*rc != SF_OK) return NULL;
    if (first == 0 && cols == ld) return sf_block_upload(b, w, rows * cols, rc);
    float *tmp = malloc(rows * cols * sizeof *tmp + 1);
    if (!tmp) {
        *rc = sf_error(SF_E_NOMEM, "out of memory");
        return NULL;
    }
    for (size_t r = 0; r < rows; r++) memcpy(tmp + r * cols, w + r * ld + first, cols * sizeof *tmp);
    float *dev = sf_block_upload(b, tmp, rows * cols, rc);
    free(tmp);
    return dev;
}

int sf_block_load_weights(block *b, const sf_model *m)
{
    const sf_model_config *c = b->cfg;
    const size_t D = (size_t)c->dim, W = (size_t)b->width, F = (size_t)b->hidden, HD = (size_t)c->heads * c->head_dim;
    const size_t row0 = (size_t)b->head0 * c->head_dim, f0 = (size_t)b->rank * F;
    b->weights = calloc((size_t)b->count, sizeof *b->weights);
    if (!b->weights) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = SF_OK;
    for (int l = 0; l < b->count && rc == SF_OK; l++) {
        const sf_block_weights *src = sf_model_block(m, b->first + l);
        layer_weights *w = &b->weights[l];
        w->attn_norm = sf_block_upload(b, src->attn_norm, D, &rc);
        /* this rank's heads: rows of Wq, Wk, Wv, columns of Wo */
        w->wq = sf_block_upload(b, src->wq + row0 * D, W * D, &rc);
        w->wk = sf_block_upload(b, src->wk + row0 * D, W * D, &rc);
        w->wv = sf_block_upload(b, src->wv + row0 * D, W * D, &rc);
        w->wo = upload_columns(b, src->wo, D, HD, row0, W, &rc);
        w->gate = sf_block_upload(b, src->gate + b->head0, (size_t)b->heads, &rc);
        if (F) {
            /* its MLP columns: rows of W1 and W3, columns of W2 */
            w->mlp_norm = sf_block_upload(b, src->mlp_norm, D, &rc);
            w->w1 = sf_block_upload(b, src->w1 + f0 * D, F * D, &rc);
            w->w3 = sf_block_upload(b, src->w3 + f0 * D, F * D, &rc);
            w->w2 = upload_columns(b, src->w2, D, (size_t)c->mlp_hidden, f0, F, &rc);
        }
    }
    return rc;
}

/* ---- failures -------------------------------------------------------------------------------- */

/* Records rank's failure (the first one wins) and wakes everyone. */
static void shard_fail(struct block_shard *s, int rank, const char *why)
{
    pthread_mutex_lock(&s->lock);
    if (!s->failed) {
        s->failed_rank = rank;
        snprintf(s->why, sizeof s->why, "%s", why && *why ? why : "failed");
        __atomic_store_n(&s->failed, 1, __ATOMIC_RELEASE);
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static int failed_error(struct block_shard *s)
{
    return sf_error(SF_E_COMM, "head-parallel rank %d of %d failed: %s", s->failed_rank, s->ranks, s->why);
}

int sf_block_shard_check(block *b, int rc)
{
    struct block_shard *s = b->shard;
    if (rc == SF_OK || !s) return rc;
    if (b->procs) { /* the followers (other processes) may wait for rank 0: they end now, with this reason */
        char why[480];
        const char *msg = sf_last_error();
        /* a head rank's own failure names it: the last one named is nearest the cause */
        const char *origin = NULL;
        for (const char *at = msg; (at = strstr(at, "head rank ")); at++) origin = at;
        if (origin)
            snprintf(why, sizeof why, "%s", origin);
        else
            snprintf(why, sizeof why, "head rank 0 of %d (job rank %d): %s", b->procs->size, b->procs->ranks[0], msg);
        /* a link cut because this process failed elsewhere: the graph aborts the communicator
         * with that failure, which is what the others should hear */
        if (b->comm && b->comm != b->procs->comm) sf_comm_abort(b->comm, why); /* NCCL: the stage's own */
        if (rc != SF_E_CLOSED) sf_comm_abort(b->procs->comm, why);
        /* a head rank lost to the network is the job's to roll back (as a lost link is) */
        if (__atomic_load_n(&b->procs->comm->lost_peer, __ATOMIC_ACQUIRE)) rc = SF_E_PEER;
        sf_error(rc, "%s", why);
        return rc;
    }
    pthread_mutex_lock(&s->lock);
    const int other = s->failed && s->failed_rank != 0;
    pthread_mutex_unlock(&s->lock);
    if (other) return failed_error(s);
    char why[400];
    snprintf(why, sizeof why, "%s", sf_last_error());
    shard_fail(s, 0, why);
    sf_comm_abort(b->comm, why);
    sf_error(rc, "%s", why); /* this thread's message, as it was */
    return rc;
}

/* ---- the other ranks ------------------------------------------------------------------------- */

/* Every rank's first collectives, at set-up: NCCL connects its ranks at the first operation of
 * each kind, which may answer "in progress" for a while; done here, no segment waits for it,
 * and a rank that cannot reach the others fails now. */
int sf_block_comm_warmup(block *b)
{
    const size_t D = (size_t)b->cfg->dim, rows = (size_t)b->cfg->segment * b->batch;
    /* the all-reduce also counts the ranks that can take normed sums (act.un): all of them or
     * none take them (a backend setting may differ between the ranks) */
    const float can_norm = b->act.un ? 1.0f : 0.0f;
    float ranks_normed = 0;
    int rc = b->be->ops->zero(b->be, b->x, D * sizeof(float));
    if (rc == SF_OK) rc = b->be->ops->upload(b->be, b->x, &can_norm, sizeof can_norm);
    if (rc == SF_OK) rc = sf_comm_all_reduce(b->comm, b->x, D, SF_DTYPE_F32);
    if (rc == SF_OK) rc = b->be->ops->download(b->be, &ranks_normed, b->x, sizeof ranks_normed);
    const int normed = rc == SF_OK && b->act.un && ranks_normed == (float)b->ranks;
    if (rc == SF_OK) rc = sf_comm_broadcast(b->comm, b->x, D, SF_DTYPE_F32, 0);
    /* bf16 parts: the sums' transport set up for a whole segment's rows, and one sum through
     * it. overlap=K keeps K sums in flight (one a chunk), which copies allow up to a bound. */
    int copies = 0;
    const int allow = !b->reduce_nccl && b->overlap <= SF_COMM_COPIES_IN_FLIGHT;
    if (rc == SF_OK && b->act.part && !normed) {
        int ticket = 0;
        rc = sf_comm_reduce_add_reserve(b->comm, rows * D, b->part_type, allow, &copies);
        if (rc == SF_OK) rc = b->be->ops->zero(b->be, b->act.part, D * 2);
        if (rc == SF_OK) rc = sf_comm_reduce_add_start(b->comm, b->act.part, D, b->part_type, &ticket);
        if (rc == SF_OK) rc = sf_comm_reduce_add_end(b->comm, ticket, b->x, b->act.part, D, b->part_type);
    } else if (rc == SF_OK && b->act.part) { /* normed sums (stages/block_sums.c) */
        int ticket = 0;
        rc = sf_comm_reduce_norm_reserve(b->comm, (int)rows, (int)D, b->part_type, b->x, b->act.un, allow, &b->split);
        copies = b->split;
        if (rc == SF_OK) rc = b->be->ops->zero(b->be, b->act.part, D * 2);
        if (rc == SF_OK) rc = sf_comm_reduce_norm_start(b->comm, b->act.part, 1, (int)D, b->part_type, &ticket);
        if (rc == SF_OK)
            rc = sf_comm_reduce_norm_end(b->comm, ticket, b->x, b->act.part, 1, (int)D, b->part_type,
                                         b->weights[0].attn_norm, b->cfg->norm_eps, b->act.un);
        if (rc == SF_OK) rc = sf_comm_reduce_norm_join(b->comm, ticket);
        b->normed = rc == SF_OK;
    }
    /* overlap=0, on two H100s (bench/RESULTS.md): float32 rows by NCCL, two chunks 1-3% faster
     * than one, four slower; bf16 parts by NCCL, one chunk 7% faster than two (its kernels take
     * multiprocessors from the chunk beside them); by the copy engines, two chunks 6-7% faster than
     * one. Every rank chooses alike: the same options, the same answer from the reserve (the
     * followers copy rank 0's overlap=, which stays as given). */
    const int gpus = b->ranks >= 2 && strcmp(b->be->ops->name, "cuda") == 0;
    b->chunks = b->overlap ? b->overlap : !gpus ? 1 : copies || !b->act.part ? 2 : 1;
    return rc == SF_OK ? sf_comm_wait(b->comm) : rc;
}

/* What a follower thread builds before taking work: its backend, part, weights, buffers and
 * communicator (the same steps as rank 0's block_init). */
static int follower_setup(follower *f, const block *lead, int rank)
{
    struct block_shard *s = f->shard;
    block *b = &f->b;
    int rc;
    const int cuda = strcmp(lead->be->ops->name, "cuda") == 0;
    if (cuda) {
        const sf_backend_options o = {.device = f->device, .precision = lead->be->precision};
        rc = sf_backend_create_opts("cuda", &o, &f->be);
    } else {
        const sf_backend_options o = {.threads = lead->be->threads};
        rc = sf_backend_create_opts(lead->be->ops->name, &o, &f->be);
    }
    if (rc != SF_OK) return rc;
    b->cfg = lead->cfg, b->be = f->be;
    b->first = lead->first, b->count = lead->count;
    b->batch = lead->batch, b->defer_commit = lead->defer_commit, b->inject_failure = lead->inject_failure;
    b->overlap = lead->overlap, b->reduce_f32 = lead->reduce_f32, b->reduce_nccl = lead->reduce_nccl;
    b->check_finite = SF_CHECK_FINITE_OFF; /* rank 0 checks the rows, which are the same here */
    b->host_rows = lead->host_rows;
    sf_stream_table_init(&b->streams, lead->streams.max, sf_block_stream_create, sf_block_stream_release, b);
    rc = sf_block_shard_plan(b, rank, s->ranks);
    if (rc == SF_OK) rc = sf_block_setup(b, s->model);
    if (rc != SF_OK) return rc;
    if (cuda) {
        rc = sf_comm_nccl_create_watched(f->be, s->nccl_id, rank, s->ranks, s->timeout_ms, &s->failed, &b->comm);
    } else {
        b->comm = s->host_comms[rank];
        s->host_comms[rank] = NULL;
    }
    if (rc == SF_OK) sf_comm_watch(b->comm, &s->failed);
    return rc == SF_OK ? sf_block_comm_warmup(b) : rc;
}

static void *follower_main(void *arg)
{
    follower *f = arg;
    struct block_shard *s = f->shard;
    const int rank = (int)(f - s->f);
    int rc = follower_setup(f, &s->f[0].b, rank);
    char why[400];
    if (rc != SF_OK) {
        if (f->device >= 0) snprintf(why, sizeof why, "GPU %d: %s", f->device, sf_last_error());
        else snprintf(why, sizeof why, "%s", sf_last_error());
        shard_fail(s, rank, why);
    }
    pthread_mutex_lock(&s->lock);
    s->ready++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    while (rc == SF_OK) {
        pthread_mutex_lock(&s->lock);
        while (!f->queued && !s->quit && !s->failed) pthread_cond_wait(&s->cond, &s->lock);
        if (s->failed || !f->queued) { /* failed, or quit with nothing left: no more work */
            pthread_mutex_unlock(&s->lock);
            break;
        }
        block_work w = f->queue[f->head];
        f->head = (f->head + 1) % SHARD_QUEUE, f->queued--;
        pthread_cond_broadcast(&s->cond); /* room in the queue */
        pthread_mutex_unlock(&s->lock);
        if (w.op == SF_BLOCK_WORK_QUIT) break;
        rc = sf_block_follow(&f->b, &w);
        if (rc != SF_OK) {
            snprintf(why, sizeof why, "%s", sf_last_error());
            shard_fail(s, rank, why);
            sf_comm_abort(f->b.comm, why);
        }
        pthread_mutex_lock(&s->lock);
        f->done++, f->result = rc;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
    /* what is left of a failed group ends here too: abort wakes the ranks waiting on this one */
    if (__atomic_load_n(&s->failed, __ATOMIC_ACQUIRE) && f->b.comm) sf_comm_abort(f->b.comm, "the group stopped");
    sf_comm_free(f->b.comm);
    f->b.comm = NULL;
    if (f->b.be) sf_block_release(&f->b);
    sf_backend_free(f->be);
    f->be = NULL;
    return NULL;
}

/* Hands w to every follower (waiting for room in a queue; processes: onto their work links). */
static int send_work(block *b, const block_work *w)
{
    struct block_shard *s = b->shard;
    if (b->procs) return sf_block_procs_send(b, w, NULL, NULL);
    int rc = SF_OK;
    pthread_mutex_lock(&s->lock);
    for (int r = 1; r < s->ranks && rc == SF_OK; r++) {
        follower *f = &s->f[r];
        while (f->queued == SHARD_QUEUE && !s->failed) pthread_cond_wait(&s->cond, &s->lock);
        if (s->failed) break;
        f->queue[(f->head + f->queued) % SHARD_QUEUE] = *w;
        f->queued++;
    }
    const int failed = s->failed;
    if (!failed) s->sent++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return failed ? failed_error(s) : rc;
}

/* Waits until every follower finished the units handed so far; the first bad status. */
static int wait_done(struct block_shard *s)
{
    pthread_mutex_lock(&s->lock);
    int rc = SF_OK;
    for (int r = 1; r < s->ranks; r++) {
        while (s->f[r].done < s->sent && !s->failed) pthread_cond_wait(&s->cond, &s->lock);
        if (!s->failed && s->f[r].result != SF_OK) rc = s->f[r].result;
    }
    const int failed = s->failed;
    pthread_mutex_unlock(&s->lock);
    return failed ? failed_error(s) : rc;
}

/* devices= ("0,1,...", one a rank) into dev, else the graph's GPU and the next ones. */
static int rank_devices(sf_stage *st, const block *b, int ranks, int *dev)
{
    const char *text = sf_stage_option(st, "devices");
    const int first = sf_comm_backend_device(b->be);
    if (!text || !*text) {
        for (int r = 0; r < ranks; r++) dev[r] = first + r;
    } else {
        const char *p = text;
        for (int r = 0; r < ranks; r++) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > 1024 || (*end && *end != ',') || (r + 1 < ranks && *end != ','))
                return sf_error(SF_E_OPTION, "devices=%s: expected %d GPU ordinals separated by commas", text, ranks);
            dev[r] = (int)v;
            p = end + 1;
            if (r + 1 == ranks && *end) return sf_error(SF_E_OPTION, "devices=%s: more than heads_of=%d GPUs", text, ranks);
        }
        if (dev[0] != first)
            return sf_error(SF_E_OPTION, "devices=%s: rank 0 runs on the graph's GPU %d", text, first);
    }
    for (int r = 0; r < ranks; r++)
        for (int q = 0; q < r; q++)
            if (dev[q] == dev[r])
                return sf_error(SF_E_OPTION, "heads_of=%d: ranks %d and %d would share GPU %d (one GPU a rank)", ranks, q,
                                r, dev[r]);
    return SF_OK;
}

int sf_block_shard_start(sf_stage *st, block *b, int ranks)
{
    const int cuda = strcmp(b->be->ops->name, "cuda") == 0;
    if (!cuda && strcmp(b->be->ops->name, "cpu") != 0)
        return sf_error(SF_E_UNSUPPORTED, "heads_of: the %s backend has no communicator (cpu and cuda do)",
                        b->be->ops->name);
    if (cuda && !sf_comm_nccl_available())
        return sf_error(SF_E_UNSUPPORTED, "heads_of=%d on cuda needs NCCL, which this build does not have", ranks);
    struct block_shard *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->ranks = ranks;
    if (b->procs) { /* the other ranks are processes, whose stages set themselves up */
        b->shard = s;
        return sf_block_procs_join(st, b); /* the graph's communicator, or on cuda an NCCL one */
    }
    s->model = sf_stage_model(st);
    s->timeout_ms = (int)sf_stage_option_int(st, "comm_timeout");
    s->f = calloc((size_t)ranks, sizeof *s->f);
    b->shard = s;
    if (!s->f) return sf_error(SF_E_NOMEM, "out of memory");
    s->f[0].b = *b; /* the followers read rank 0's settings from here (a copy, never used otherwise) */
    int dev[256] = {0};
    int rc = cuda ? rank_devices(st, b, ranks, dev) : SF_OK;
    if (rc == SF_OK && cuda) rc = sf_comm_nccl_unique_id(s->nccl_id);
    if (rc == SF_OK && !cuda) {
        s->host_comms = calloc((size_t)ranks, sizeof *s->host_comms);
        rc = s->host_comms ? sf_comm_host_create(ranks, b->be, s->timeout_ms, s->host_comms)
                           : sf_error(SF_E_NOMEM, "out of memory");
    }
    for (int r = 1; r < ranks && rc == SF_OK; r++) {
        follower *f = &s->f[r];
        f->shard = s;
        f->device = cuda ? dev[r] : -1;
        if (pthread_create(&f->thread, NULL, follower_main, f) != 0) {
            rc = sf_error(SF_E_NOMEM, "heads_of=%d: cannot start the thread of rank %d", ranks, r);
            break;
        }
        f->started = 1;
    }
    /* rank 0's own communicator, while the others join theirs */
    if (rc == SF_OK && cuda)
        rc = sf_comm_nccl_create_watched(b->be, s->nccl_id, 0, ranks, s->timeout_ms, &s->failed, &b->comm);
    if (rc == SF_OK && !cuda) b->comm = s->host_comms[0], s->host_comms[0] = NULL;
    if (rc == SF_OK) sf_comm_watch(b->comm, &s->failed);
    if (rc == SF_OK) rc = sf_block_comm_warmup(b);
    if (rc != SF_OK) {
        char why[400];
        snprintf(why, sizeof why, "%s", sf_last_error());
        shard_fail(s, 0, why);
    }
    /* every rank set up (or failed) before the first segment */
    pthread_mutex_lock(&s->lock);
    int started = 0;
    for (int r = 1; r < ranks; r++) started += s->f[r].started;
    while (s->ready < started) pthread_cond_wait(&s->cond, &s->lock);
    const int failed = s->failed, first = s->failed_rank;
    pthread_mutex_unlock(&s->lock);
    if (failed && first != 0) return failed_error(s);
    if (failed) return sf_error(rc ? rc : SF_E_COMM, "heads_of=%d: %s", ranks, s->why);
    return SF_OK;
}

int sf_block_shard_forward(block *b, const uint64_t *streams, int count, int n, int commit, int final)
{
    block_work w = {.op = SF_BLOCK_WORK_FORWARD, .count = count, .n = n, .commit = commit, .final = final};
    memcpy(w.streams, streams, (size_t)count * sizeof *streams);
    return send_work(b, &w);
}

int sf_block_shard_flush(block *b)
{
    const block_work w = {.op = SF_BLOCK_WORK_FLUSH};
    return send_work(b, &w);
}

void sf_block_shard_end(block *b)
{
    if (b->shard && b->procs) b->procs->close(b->procs->links);
}

static int save_parts(struct block_shard *s, sf_buffer *parts, int rc, sf_buffer *out);

/* Layout: u32 SHARD_MAGIC, u32 ranks, then for each rank in order a u64 length and that rank's
 * state (stages/block_state.c's layout for its heads). */
int sf_block_shard_save(block *b, sf_buffer *out)
{
    struct block_shard *s = b->shard;
    sf_buffer *parts = calloc((size_t)s->ranks, sizeof *parts);
    if (!parts) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = SF_OK;
    if (b->procs) { /* the others' states come back over the communicator */
        const block_work w = {.op = SF_BLOCK_WORK_SAVE};
        rc = sf_block_procs_send(b, &w, NULL, NULL);
        if (rc == SF_OK) rc = sf_comm_wait(b->comm);
        if (rc == SF_OK) rc = sf_block_state_save(b, &parts[0]);
        for (int r = 1; r < s->ranks && rc == SF_OK; r++) rc = sf_block_procs_gather(b, r, &parts[r]);
        return save_parts(s, parts, rc, out);
    }
    pthread_mutex_lock(&s->lock);
    /* each follower's own output buffer: the work is the same but for where it goes */
    for (int r = 1; r < s->ranks; r++) {
        follower *f = &s->f[r];
        while (f->queued == SHARD_QUEUE && !s->failed) pthread_cond_wait(&s->cond, &s->lock);
        if (s->failed) break;
        f->queue[(f->head + f->queued) % SHARD_QUEUE] = (block_work){.op = SF_BLOCK_WORK_SAVE, .out = &parts[r]};
        f->queued++;
    }
    if (s->failed) rc = failed_error(s);
    else s->sent++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (rc == SF_OK) rc = sf_comm_wait(b->comm);
    if (rc == SF_OK) rc = sf_block_state_save(b, &parts[0]);
    const int waited = wait_done(s);
    if (rc == SF_OK) rc = waited;
    return save_parts(s, parts, rc, out);
}

/* The layout below from every rank's state (parts, freed here) when rc is SF_OK. */
static int save_parts(struct block_shard *s, sf_buffer *parts, int rc, sf_buffer *out)
{
    const uint32_t head[2] = {SHARD_MAGIC, (uint32_t)s->ranks};
    if (rc == SF_OK) rc = sf_buffer_append(out, head, sizeof head);
    for (int r = 0; r < s->ranks && rc == SF_OK; r++) {
        const uint64_t len = parts[r].len;
        rc = sf_buffer_append(out, &len, sizeof len);
        if (rc == SF_OK) rc = sf_buffer_append(out, parts[r].data, parts[r].len);
    }
    for (int r = 0; r < s->ranks; r++) sf_buffer_release(&parts[r]);
    free(parts);
    return rc;
}

int sf_block_shard_refuse(const block *b, const uint8_t *data, size_t len)
{
    uint32_t head[2];
    if (len < sizeof head) return SF_OK;
    memcpy(head, data, sizeof head);
    if (head[0] != SHARD_MAGIC) return SF_OK;
    return sf_error(SF_E_STATE, "block state was saved by %u head-parallel ranks (heads_of=%u); this block runs "
                                "unsharded: resume with the same heads_of",
                    head[1], head[1]);
}

int sf_block_shard_restore(block *b, const uint8_t *data, size_t len)
{
    struct block_shard *s = b->shard;
    uint32_t head[2] = {0, 0};
    if (len >= sizeof head) memcpy(head, data, sizeof head);
    if (head[0] != SHARD_MAGIC)
        return sf_error(SF_E_STATE, "block state was saved without head parallelism; this block runs heads_of=%d: "
                                    "resume with the number of ranks it was saved with",
                        s->ranks);
    if (head[1] != (uint32_t)s->ranks)
        return sf_error(SF_E_STATE, "block state was saved by %u head-parallel ranks; this block runs heads_of=%d: "
                                    "resume on the same number of ranks",
                        head[1], s->ranks);
    const uint8_t *part[256];
    size_t part_len[256];
    size_t at = sizeof head;
    for (int r = 0; r < s->ranks; r++) {
        uint64_t n;
        if (len - at < sizeof n) return sf_error(SF_E_STATE, "block state is truncated (rank %d of %d)", r, s->ranks);
        memcpy(&n, data + at, sizeof n);
        at += sizeof n;
        if (n > len - at) return sf_error(SF_E_STATE, "block state is truncated (rank %d of %d)", r, s->ranks);
        part[r] = data + at, part_len[r] = (size_t)n;
        at += (size_t)n;
    }
    if (at != len) return sf_error(SF_E_STATE, "block state has %zu bytes past its %d ranks", len - at, s->ranks);
    int rc = SF_OK;
    if (b->procs) { /* each follower's part travels with its unit of work */
        const block_work w = {.op = SF_BLOCK_WORK_RESTORE};
        /* no waiting for the followers here: every process restores before its stages' threads
         * start, and a follower restores in its thread, so two processes each holding another's
         * follower would wait for each other. A follower that cannot restore aborts the
         * communicator with the reason, which rank 0's next collective reports. */
        rc = sf_block_procs_send(b, &w, part, part_len);
        return rc == SF_OK ? sf_block_state_restore(b, part[0], part_len[0]) : rc;
    }
    pthread_mutex_lock(&s->lock);
    for (int r = 1; r < s->ranks; r++) {
        follower *f = &s->f[r];
        while (f->queued == SHARD_QUEUE && !s->failed) pthread_cond_wait(&s->cond, &s->lock);
        if (s->failed) break;
        f->queue[(f->head + f->queued) % SHARD_QUEUE] =
            (block_work){.op = SF_BLOCK_WORK_RESTORE, .data = part[r], .len = part_len[r]};
        f->queued++;
    }
    if (s->failed) rc = failed_error(s);
    else s->sent++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (rc == SF_OK) rc = sf_block_state_restore(b, part[0], part_len[0]);
    const int waited = wait_done(s); /* the followers read data: it must outlive their restore */
    return rc == SF_OK ? waited : rc;
}

void sf_block_shard_stop(block *b)
{
    struct block_shard *s = b->shard;
    if (!s) return;
    if (b->procs) { /* nothing runs here for the other ranks: the graph ends their work links */
        free(s->f);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        b->shard = NULL;
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->quit = 1;
    for (int r = 1; r < s->ranks; r++) {
        follower *f = &s->f[r];
        if (f->queued < SHARD_QUEUE) f->queue[(f->head + f->queued++) % SHARD_QUEUE] = (block_work){.op = SF_BLOCK_WORK_QUIT};
    }
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    /* rank 0's communicator ends beside the others' (NCCL tears the ranks of a process down
     * together) */
    sf_comm_free(b->comm);
    b->comm = NULL;
    for (int r = 1; r < s->ranks; r++)
        if (s->f[r].started) pthread_join(s->f[r].thread, NULL);
    for (int r = 0; s->host_comms && r < s->ranks; r++) sf_comm_free(s->host_comms[r]);
    free(s->host_comms);
    free(s->f);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
    b->shard = NULL;
}
