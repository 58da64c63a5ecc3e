/* Checkpoint/resume of threaded graphs. A marker packet travels the chain behind the data the
 * source emitted before it (Chandy-Lamport over FIFO links): each stage thread, on popping it,
 * has processed exactly what came before and nothing after, so appending that stage's state
 * gives one consistent cut of the whole graph. The last stage writes the cut as a checkpoint
 * file (state/checkpoint.h). Payload layout, little-endian:
 *   "SFCK", u32 version, u64 seq, u32 fingerprint length, fingerprint (stages, options and
 *   model configuration as text), u64 state length, state (sf_graph_save layout). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state/checkpoint.h"
#include "pipeline/graph_internal.h"

#define PAYLOAD_MAGIC "SFCK"
#define PAYLOAD_VERSION 1u
/* A checkpoint larger than this is treated as damaged rather than allocated. */
#define MAX_CHECKPOINT_BYTES ((size_t)1 << 36)

int sf_graph_set_checkpoint(sf_graph *g, const sf_graph_checkpoint_options *opts)
{
    if (!g || !opts || !opts->dir || !*opts->dir) return sf_error(SF_E_INVAL, "sf_graph_set_checkpoint: no directory");
    if (g->started) return sf_error(SF_E_INVAL, "checkpoints must be set up before the graph runs");
    if (opts->every == 0) return sf_error(SF_E_INVAL, "checkpoint interval must be at least one token");
    if (opts->keep < 0 || opts->keep > 1000) return sf_error(SF_E_INVAL, "keep=%d is outside 0..1000", opts->keep);
    if (opts->codec < SF_CODEC_RAW || opts->codec > SF_CODEC_ZSTD) return sf_error(SF_E_INVAL, "unknown checkpoint codec %d", opts->codec);
    sf_graph_checkpointing *cp = calloc(1, sizeof *cp);
    char *dir = strdup(opts->dir);
    if (!cp || !dir) {
        free(cp);
        free(dir);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    sf_graph_checkpoint_free(g);
    cp->opts = *opts;
    cp->lock_fd = -1;
    cp->dir = dir;
    cp->opts.dir = dir;
    if (cp->opts.keep == 0) cp->opts.keep = 3;
    g->checkpoint = cp;
    return SF_OK;
}

void sf_graph_checkpoint_free(sf_graph *g)
{
    if (!g || !g->checkpoint) return;
    sf_checkpoint_unlock(g->checkpoint->lock_fd);
    free(g->checkpoint->dir);
    free(g->checkpoint->loaded);
    free(g->checkpoint);
    g->checkpoint = NULL;
}

uint64_t sf_graph_checkpoint_resumed(const sf_graph *g) { return g && g->checkpoint ? g->checkpoint->resumed_seq : 0; }
uint64_t sf_graph_checkpoint_written(const sf_graph *g) { return g && g->checkpoint ? g->checkpoint->written_seq : 0; }

static void report(sf_graph_checkpointing *cp, const char *line)
{
    if (cp->opts.report) cp->opts.report(cp->opts.user, line);
    else fprintf(stderr, "seqflow: %s\n", line);
}

static void report_trampoline(void *user, const char *line) { report(user, line); }

/* What must match between the run that wrote a checkpoint and the one resuming from it. */
static int fingerprint(const sf_graph *g, sf_buffer *out)
{
    char text[1024];
    int rc = SF_OK;
    if (g->model) {
        const sf_model_config *c = sf_model_get_config(g->model);
        char branches[256];
        sf_branches_format(c, branches, sizeof branches);
        snprintf(text, sizeof text, "model D=%d H=%d d=%d V=%d L=%d N=%d branches=%s causal=%d memory=%d G=%d S=%d eps=%.9g F=%d fn=%d\n",
                 c->dim, c->heads, c->head_dim, c->vocab, c->layers, c->segment, branches, c->causal, (int)c->memory,
                 c->global_tokens, c->summary_tokens, (double)c->norm_eps, c->mlp_hidden, c->final_norm);
        rc = sf_buffer_append(out, text, strlen(text));
    }
    for (int i = 0; i < g->n_stages && rc == SF_OK; i++) {
        const sf_stage *st = g->stages[i];
        rc = sf_buffer_append(out, st->cls->name, strlen(st->cls->name));
        for (int o = 0; o < st->n_options && rc == SF_OK; o++) {
            const char *v = st->options[o].value ? st->options[o].value : "(unset)";
            snprintf(text, sizeof text, " %s=", st->options[o].option->name);
            rc = sf_buffer_append(out, text, strlen(text));
            if (rc == SF_OK) rc = sf_buffer_append(out, v, strlen(v));
        }
        if (rc == SF_OK) rc = sf_buffer_append(out, "\n", 1);
    }
    return rc;
}

static int parse_payload(sf_graph *g, const uint8_t *p, size_t len, uint64_t seq)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    uint32_t version, fp_len;
    uint64_t stored_seq, state_len;
    if (len < 20 || memcmp(p, PAYLOAD_MAGIC, 4) != 0) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " has no seqflow graph state", seq);
    memcpy(&version, p + 4, 4);
    memcpy(&stored_seq, p + 8, 8);
    memcpy(&fp_len, p + 16, 4);
    if (version != PAYLOAD_VERSION) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " has version %u (this build reads %u)", seq, version, PAYLOAD_VERSION);
    if (stored_seq != seq || fp_len > len - 20 || len - 20 - fp_len < 8)
        return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " is inconsistent", seq);
    sf_buffer mine = {0};
    int rc = fingerprint(g, &mine);
    if (rc == SF_OK && (mine.len != fp_len || memcmp(mine.data, p + 20, fp_len) != 0))
        rc = sf_error(SF_E_STATE, "checkpoint %" PRIu64 " in '%s' was written by a different pipeline, input, output or model configuration; "
                      "resume with the same arguments (or start without --resume)", seq, cp->dir);
    sf_buffer_release(&mine);
    if (rc != SF_OK) return rc;
    size_t at = 20 + fp_len;
    memcpy(&state_len, p + at, 8);
    at += 8;
    if (state_len != len - at) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " is inconsistent", seq);
    cp->loaded = malloc(state_len ? (size_t)state_len : 1);
    if (!cp->loaded) return sf_error(SF_E_NOMEM, "out of memory");
    memcpy(cp->loaded, p + at, (size_t)state_len);
    cp->loaded_len = (size_t)state_len;
    return SF_OK;
}

int sf_graph_checkpoint_prepare(sf_graph *g)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    int rc = sf_checkpoint_dir_prepare(cp->dir);
    /* held until the graph is freed, so that no second run reads or clears the directory
     * while this one writes it */
    if (rc == SF_OK && cp->lock_fd < 0) rc = sf_checkpoint_lock(cp->dir, &cp->lock_fd);
    if (rc != SF_OK) return rc;
    cp->next_seq = 1;
    if (cp->opts.resume) {
        uint64_t seq;
        uint8_t *payload;
        size_t len;
        rc = sf_checkpoint_load_newest(cp->dir, MAX_CHECKPOINT_BYTES, report_trampoline, cp, &seq, &payload, &len);
        if (rc != SF_OK) return rc;
        if (payload) {
            rc = parse_payload(g, payload, len, seq);
            free(payload);
            if (rc != SF_OK) return rc;
            cp->resuming = 1;
            cp->resumed_seq = seq;
            cp->next_seq = seq + 1;
            return SF_OK;
        }
        char line[4200];
        snprintf(line, sizeof line, "no checkpoint in '%s'; starting from the beginning", cp->dir);
        report(cp, line);
    }
    return sf_checkpoint_clear(cp->dir);
}

int sf_graph_checkpoint_restore_stages(sf_graph *g)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    if (!cp->resuming) return SF_OK;
    int rc = sf_graph_restore_stages(g, cp->loaded, cp->loaded_len);
    free(cp->loaded);
    cp->loaded = NULL;
    cp->loaded_len = 0;
    if (rc != SF_OK) return sf_error(rc, "cannot resume from checkpoint %" PRIu64 ": %s", cp->resumed_seq, sf_last_error());
    return SF_OK;
}

static int write_checkpoint(sf_graph *g, const uint8_t *state, size_t state_len)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    uint64_t seq = cp->next_seq;
    sf_buffer payload = {0}, fp = {0};
    uint32_t version = PAYLOAD_VERSION, fp_len;
    uint64_t len64 = state_len;
    int rc = fingerprint(g, &fp);
    fp_len = (uint32_t)fp.len;
    if (rc == SF_OK) rc = sf_buffer_append(&payload, PAYLOAD_MAGIC, 4);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &version, 4);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &seq, 8);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &fp_len, 4);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, fp.data, fp.len);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &len64, 8);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, state, state_len);
    if (rc == SF_OK) rc = sf_checkpoint_write(cp->dir, seq, payload.data, payload.len, (sf_codec)cp->opts.codec, cp->opts.keep);
    sf_buffer_release(&payload);
    sf_buffer_release(&fp);
    if (rc != SF_OK) return rc;
    cp->written_seq = seq;
    cp->next_seq = seq + 1;
    return SF_OK;
}

int sf_graph_checkpoint_pass(sf_stage *st, sf_packet *p)
{
    sf_graph *g = st->graph;
    sf_buffer b = {p->state, p->state_len, p->state_cap};
    int rc = sf_graph_save_stage(st, &b);
    p->state = b.data;
    p->state_len = b.len;
    p->state_cap = b.cap;
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    if (st->out) return st->out->ops->push(st->out, p);
    rc = write_checkpoint(g, p->state, p->state_len);
    sf_packet_free(p);
    return rc;
}

int sf_stage_emit_checkpoint(sf_stage *st)
{
    sf_graph *g = st->graph;
    if (!g->checkpoint || g->push_mode) return sf_error(SF_E_INVAL, "checkpoints are off (or the graph runs in push mode)");
    sf_packet *p = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    return sf_graph_checkpoint_pass(st, p);
}
