/* `seqflow serve`'s checkpoints (pipeline/serve_internal.h): the graph's state and every
 * stream's position, saved between steps so that streams survive a restart.
 *
 * A checkpoint is one file of state/checkpoint.h (a frame of kind CHECKPOINT: checksums over
 * header and payload, written to a temp file, fsync'ed, renamed, the directory fsync'ed). Its
 * payload, little-endian:
 *   "SFSV", u32 version (1), u64 seq, u32 fingerprint length, fingerprint (the graph's: model,
 *   weights hash, backend, stages; pipeline/graph_internal.h), u64 state length, state
 *   (sf_graph_save's blob), u32 streams, then per stream:
 *     u64 id, u64 fed (tokens its state holds), u64 rows_sent, u64 acked, u32 flags (bit 0:
 *     resumable), u32 kept, then per kept ROWS: u64 pos, u64 end, u64 length, the message.
 * The graph's state covers every stream; a stream that cannot be resumed (opened by a
 * version-1 client) is ended in the graph when loaded.
 *
 * The loop's thread builds the payload (the snapshot: between steps, so that each stream's
 * state covers exactly its fed tokens); a writer thread, started with the server, makes the
 * file of it, so that the loop goes on serving while the file is written and fsync'ed. One
 * payload buffer is reused: the loop fills it only while the writer is idle. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/byte_order.h"
#include "core/process_stats.h"
#include "pipeline/graph_internal.h"
#include "pipeline/serve_internal.h"
#include "state/checkpoint.h"

#define SV_MAGIC "SFSV"
#define SV_VERSION 1u
#define SV_KEEP 2
#define SV_FLAG_RESUMABLE 1u
/* A checkpoint larger than this is treated as damaged rather than allocated. */
#define SV_MAX_BYTES ((size_t)1 << 36)

int serve_keep(serve_stream *st, uint64_t pos, uint64_t n, const uint8_t *msg, size_t len)
{
    if (st->n_kept == st->cap_kept) {
        int cap = st->cap_kept ? 2 * st->cap_kept : 8;
        serve_kept *grown = realloc(st->kept, (size_t)cap * sizeof *grown);
        if (!grown) return sf_error(SF_E_NOMEM, "out of memory");
        st->kept = grown;
        st->cap_kept = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return sf_error(SF_E_NOMEM, "out of memory");
    memcpy(copy, msg, len);
    st->kept[st->n_kept++] = (serve_kept){pos, pos + n, copy, len};
    return SF_OK;
}

void serve_drop_acked(serve_stream *st, uint64_t acked)
{
    int k = 0;
    while (k < st->n_kept && st->kept[k].end <= acked) free(st->kept[k++].msg);
    if (!k) return;
    memmove(st->kept, st->kept + k, (size_t)(st->n_kept - k) * sizeof *st->kept);
    st->n_kept -= k;
    if (st->unsent > st->n_kept) st->unsent = st->n_kept; /* rows the client has need not go again */
}

static int put(sf_buffer *b, const void *p, size_t n) { return sf_buffer_append(b, p, n); }
/* little-endian whatever the host: a checkpoint may be restored on another machine */
static int put32(sf_buffer *b, uint32_t v) { return sf_buffer_put_le(b, v, 4); }
static int put64(sf_buffer *b, uint64_t v) { return sf_buffer_put_le(b, v, 8); }

/* ---- writing: a snapshot on the loop's thread, the file on the writer's -------------------- */

enum { W_IDLE, W_QUEUED, W_DONE };

typedef struct serve_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;          /* W_*: IDLE and DONE: the loop owns the fields below; QUEUED: the writer */
    int quit;
    int wake[2];        /* a pipe: the writer writes a byte when a write finished */
    sf_buffer payload;  /* the snapshot; kept between checkpoints (its pages stay mapped) */
    uint64_t seq, job;  /* the checkpoint's number; the snapshot's (never reused) */
    int rc;             /* the write's result, and its message */
    char error[512];
    double t0;          /* when the snapshot began */
    size_t state_at;    /* where the state's length goes in payload */
} serve_writer;

static void *writer_main(void *arg)
{
    sf_serve *s = arg;
    serve_writer *w = s->writer;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->state != W_QUEUED && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->state != W_QUEUED) break; /* quit, nothing queued */
        pthread_mutex_unlock(&w->mu);
        if (s->o.checkpoint_writing) s->o.checkpoint_writing(s->o.user, w->seq);
        int rc = sf_checkpoint_write(s->ckpt_dir, w->seq, w->payload.data, w->payload.len, SF_CODEC_RAW, SV_KEEP);
        pthread_mutex_lock(&w->mu);
        w->rc = rc;
        if (rc != SF_OK) snprintf(w->error, sizeof w->error, "%s", sf_last_error());
        w->state = W_DONE;
        pthread_cond_broadcast(&w->cv);
        ssize_t n = write(w->wake[1], "", 1); /* full pipe: a wake-up is pending anyway */
        (void)n;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The writer thread and its wake-up pipe (serve_ckpt_open, once the checkpoint loaded). */
static int writer_start(sf_serve *s)
{
    serve_writer *w = calloc(1, sizeof *w);
    if (!w) return sf_error(SF_E_NOMEM, "out of memory");
    w->wake[0] = w->wake[1] = -1;
    if (pipe(w->wake) != 0 || fcntl(w->wake[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(w->wake[1], F_SETFL, O_NONBLOCK) != 0 ||
        fcntl(w->wake[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(w->wake[1], F_SETFD, FD_CLOEXEC) != 0) {
        int rc = sf_error(SF_E_IO, "serve: cannot make the checkpoint writer's pipe: %s", strerror(errno));
        if (w->wake[0] >= 0) close(w->wake[0]), close(w->wake[1]);
        free(w);
        return rc;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    s->writer = w;
    int err = pthread_create(&w->thread, NULL, writer_main, s);
    if (err) {
        s->writer = NULL;
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        close(w->wake[0]);
        close(w->wake[1]);
        free(w);
        return sf_error(SF_E_IO, "serve: cannot start the checkpoint writer: %s", strerror(err));
    }
    return SF_OK;
}

int serve_ckpt_busy(const sf_serve *s)
{
    serve_writer *w = s->writer;
    if (!w) return 1;
    pthread_mutex_lock(&w->mu);
    int busy = w->state != W_IDLE;
    pthread_mutex_unlock(&w->mu);
    return busy;
}

int serve_ckpt_wake_fd(const sf_serve *s) { return s->writer ? s->writer->wake[0] : -1; }

int serve_ckpt_save_state(sf_serve *s)
{
    serve_writer *w = s->writer; /* idle: the loop owns it */
    w->t0 = sf_monotonic_seconds();
    w->seq = s->ckpt_seq + 1;
    sf_buffer *b = &w->payload;
    b->len = 0;
    int rc = put(b, SV_MAGIC, 4);
    if (rc == SF_OK) rc = put32(b, SV_VERSION);
    if (rc == SF_OK) rc = put64(b, w->seq);
    if (rc == SF_OK) rc = put32(b, (uint32_t)s->ckpt_fp.len);
    if (rc == SF_OK) rc = put(b, s->ckpt_fp.data, s->ckpt_fp.len);
    w->state_at = b->len;
    if (rc == SF_OK) rc = put64(b, 0); /* the state's length, once known */
    /* straight into the payload: one copy of the state, not two */
    if (rc == SF_OK) rc = sf_graph_save(s->graph, b);
    if (rc == SF_OK) {
        uint64_t state_len = b->len - w->state_at - 8;
        sf_le_store(b->data + w->state_at, state_len, 8);
    }
    return rc;
}

int serve_ckpt_submit(sf_serve *s)
{
    serve_writer *w = s->writer;
    sf_buffer *b = &w->payload;
    int rc = put32(b, s->n_streams);
    for (uint32_t i = 0; i < s->n_streams && rc == SF_OK; i++) {
        const serve_stream *st = s->streams[i];
        rc = put64(b, st->id);
        if (rc == SF_OK) rc = put64(b, st->fed);
        if (rc == SF_OK) rc = put64(b, st->rows_sent);
        if (rc == SF_OK) rc = put64(b, st->acked);
        if (rc == SF_OK) rc = put32(b, st->resumable && !st->abandoned ? SV_FLAG_RESUMABLE : 0);
        if (rc == SF_OK) rc = put32(b, (uint32_t)st->n_kept);
        for (int k = 0; k < st->n_kept && rc == SF_OK; k++) {
            rc = put64(b, st->kept[k].pos);
            if (rc == SF_OK) rc = put64(b, st->kept[k].end);
            if (rc == SF_OK) rc = put64(b, st->kept[k].len);
            if (rc == SF_OK) rc = put(b, st->kept[k].msg, st->kept[k].len);
        }
    }
    if (rc != SF_OK) {
        s->ckpt_failed++;
        return rc;
    }
    /* each stream learns its durable position from this snapshot once its file landed; a
     * stream opened after it, or closed and opened again, is not this one */
    uint64_t job = ++w->job;
    for (uint32_t i = 0; i < s->n_streams; i++) {
        s->streams[i]->snap_job = job;
        s->streams[i]->snap_fed = s->streams[i]->fed;
    }
    pthread_mutex_lock(&w->mu);
    w->state = W_QUEUED;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return SF_OK;
}

int serve_ckpt_collect(sf_serve *s)
{
    serve_writer *w = s->writer;
    if (!w) return 0;
    char drain[64];
    while (read(w->wake[0], drain, sizeof drain) > 0) {}
    pthread_mutex_lock(&w->mu);
    int done = w->state == W_DONE;
    if (done) w->state = W_IDLE; /* the writer touches nothing more of it */
    pthread_mutex_unlock(&w->mu);
    if (!done) return 0;
    s->ckpt_seconds = sf_monotonic_seconds() - w->t0;
    s->ckpt_seconds_sum += s->ckpt_seconds;
    if (w->rc != SF_OK) {
        s->ckpt_failed++;
        return sf_error(w->rc, "%s", w->error);
    }
    s->ckpt_seq = w->seq;
    s->ckpt_written++;
    s->ckpt_bytes = w->payload.len;
    for (uint32_t i = 0; i < s->n_streams; i++) {
        serve_stream *st = s->streams[i];
        if (st->snap_job == w->job && st->snap_fed > st->durable) st->durable = st->snap_fed;
    }
    return 1;
}

void serve_ckpt_wait(sf_serve *s)
{
    serve_writer *w = s->writer;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    while (w->state == W_QUEUED) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* ---- loading ------------------------------------------------------------------------------- */

static uint32_t get32(sf_byte_reader *r) { return (uint32_t)sf_byte_le(r, 4); }
static uint64_t get64(sf_byte_reader *r) { return sf_byte_le(r, 8); }

static void report(void *user, const char *line)
{
    sf_serve *s = user;
    if (s->o.log) s->o.log(s->o.user, line);
}

/* The streams of a checkpoint's payload into the server (r is past the graph's state). */
static int load_streams(sf_serve *s, sf_byte_reader *r, uint64_t seq)
{
    uint32_t n = get32(r);
    if (!r->bad && n > s->o.max_streams)
        return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' holds %u streams; --max-streams is %u", seq, s->ckpt_dir, n,
                        s->o.max_streams);
    double now = sf_monotonic_seconds();
    for (uint32_t i = 0; i < n && !r->bad; i++) {
        serve_stream *st = calloc(1, sizeof *st);
        if (!st) return sf_error(SF_E_NOMEM, "out of memory");
        s->streams[s->n_streams++] = st; /* freed with the server from here on */
        st->id = get64(r);
        st->fed = st->next_pos = st->durable = st->durable_told = get64(r);
        st->rows_sent = get64(r);
        st->acked = get64(r);
        uint32_t flags = get32(r), kept = get32(r);
        st->resumable = (flags & SV_FLAG_RESUMABLE) != 0;
        st->orphan_since = now;
        if ((flags & ~SV_FLAG_RESUMABLE) || st->rows_sent > st->fed || st->acked > st->rows_sent || kept > (1u << 20))
            r->bad = 1;
        for (uint32_t k = 0; k < kept && !r->bad; k++) {
            uint64_t pos = get64(r), end = get64(r), len = get64(r);
            const uint8_t *msg = sf_byte_take(r, len > r->n ? r->n + 1 : (size_t)len);
            if (!msg || end < pos || end > st->rows_sent || len < SF_SERVE_HEADER_SIZE) r->bad = 1;
            else if (serve_keep(st, pos, end - pos, msg, (size_t)len) != SF_OK) return SF_E_NOMEM;
        }
        for (uint32_t k = 0; k + 1 < s->n_streams && !r->bad; k++)
            if (s->streams[k]->id == st->id) r->bad = 1;
    }
    if (r->bad || r->at != r->n) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' is inconsistent", seq, s->ckpt_dir);
    /* streams no client can resume leave the graph now */
    for (uint32_t i = 0; i < s->n_streams;) {
        serve_stream *st = s->streams[i];
        if (st->resumable) {
            i++;
            continue;
        }
        int rc = st->fed ? sf_graph_end(s->graph, st->id) : SF_OK;
        for (sf_packet *p; (p = sf_graph_pull(s->graph));) sf_packet_free(p);
        if (rc != SF_OK) return rc;
        s->streams[i] = s->streams[--s->n_streams];
        serve_stream_free(st);
    }
    s->streams_restored = s->n_streams;
    return SF_OK;
}

int serve_ckpt_open(sf_serve *s, const char *dir)
{
    s->ckpt_lock = -1;
    if (!(s->ckpt_dir = strdup(dir))) return sf_error(SF_E_NOMEM, "out of memory");
    int rc = sf_checkpoint_dir_prepare(dir);
    if (rc == SF_OK) rc = sf_checkpoint_lock(dir, &s->ckpt_lock);
    /* started before the fingerprint: it names the backend's resolved precision */
    if (rc == SF_OK) rc = sf_graph_start(s->graph, 0);
    if (rc != SF_OK) return rc;
    s->weights_hash = sf_model_weights_hash(s->graph->model);
    if ((rc = sf_graph_fingerprint(s->graph, s->weights_hash, &s->ckpt_fp)) != SF_OK) return rc;
    uint64_t seq;
    uint8_t *payload;
    size_t len;
    rc = sf_checkpoint_load_newest(dir, SV_MAX_BYTES, report, s, &seq, &payload, &len);
    if (rc != SF_OK) return sf_error(rc, "%s (the server refuses to start on it: move it away to start afresh)", sf_last_error());
    if (!payload) return writer_start(s);
    sf_byte_reader r = {payload, len, 0, 0};
    const uint8_t *magic = sf_byte_take(&r, 4);
    uint32_t version = get32(&r);
    uint64_t stored = get64(&r);
    uint32_t fp_len = get32(&r);
    const uint8_t *fp = sf_byte_take(&r, fp_len);
    if (!magic || memcmp(magic, SV_MAGIC, 4) != 0)
        rc = sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' is not a seqflow serve checkpoint", seq, dir);
    else if (version != SV_VERSION)
        rc = sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' has version %u (this build reads %u)", seq, dir, version, SV_VERSION);
    else if (r.bad || stored != seq)
        rc = sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' is inconsistent", seq, dir);
    else
        rc = sf_graph_fingerprint_check(s->graph, s->weights_hash, dir, seq, fp, fp_len,
                                        "start the server with the same model and pipeline (or another --checkpoint directory)");
    uint64_t state_len = rc == SF_OK ? get64(&r) : 0;
    const uint8_t *state = rc == SF_OK ? sf_byte_take(&r, state_len > len ? len + 1 : (size_t)state_len) : NULL;
    if (rc == SF_OK && !state) rc = sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' is inconsistent", seq, dir);
    if (rc == SF_OK) {
        rc = sf_graph_restore(s->graph, state, (size_t)state_len);
        if (rc != SF_OK) rc = sf_error(rc, "cannot restore checkpoint %" PRIu64 " in '%s': %s", seq, dir, sf_last_error());
    }
    if (rc == SF_OK) rc = load_streams(s, &r, seq);
    free(payload);
    if (rc != SF_OK) return rc;
    s->ckpt_seq = seq;
    char line[600];
    snprintf(line, sizeof line, "checkpoint %" PRIu64 " of '%s' loaded: %u stream(s) await their clients' RESUME", seq, dir,
             s->n_streams);
    report(s, line);
    return writer_start(s);
}

void serve_ckpt_close(sf_serve *s)
{
    serve_writer *w = s->writer;
    if (w) {
        pthread_mutex_lock(&w->mu);
        w->quit = 1; /* after the write queued, if any */
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        close(w->wake[0]);
        close(w->wake[1]);
        sf_buffer_release(&w->payload);
        free(w);
        s->writer = NULL;
    }
    sf_buffer_release(&s->ckpt_fp);
    sf_checkpoint_unlock(s->ckpt_lock);
    s->ckpt_lock = -1;
    free(s->ckpt_dir);
    s->ckpt_dir = NULL;
}
