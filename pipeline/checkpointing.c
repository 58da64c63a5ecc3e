/* Checkpoint/resume of threaded graphs. A marker packet travels the chain behind the data the
 * source emitted before it (Chandy-Lamport over FIFO links): each stage thread, on popping it,
 * has processed exactly what came before and nothing after, so appending that stage's state
 * gives one consistent cut of the whole graph. The last stage writes the cut as a checkpoint
 * file (state/checkpoint.h). Payload layout, little-endian (docs/FORMATS.md):
 *   "SFCK", u32 version (2), u64 seq, u32 flags (bit 0: written after the end of the input, a
 *   finished run), u32 fingerprint length, fingerprint (model configuration and weights hash,
 *   backend, stages and options as text lines), u64 state length, state (sf_graph_save
 *   layout). The directory is locked (state/checkpoint.h) from prepare until the graph is
 *   freed. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state/checkpoint.h"
#include "pipeline/graph_internal.h"

#define PAYLOAD_MAGIC "SFCK"
#define PAYLOAD_VERSION 2u
#define PAYLOAD_HEADER 24u /* magic, version, seq, flags, fingerprint length */
#define FLAG_FINISHED 1u
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

/* What must match between the run that wrote a checkpoint and the one resuming from it, one
 * line per item so that a mismatch can be named: the model (configuration, then a hash of its
 * weights, which tells model files and built-in seeds apart), the backend and precision (their
 * numbers differ), then each stage with its options (the input, pipeline and output format).
 * The thread count is not in it: results do not depend on it. */
int sf_graph_fingerprint(const sf_graph *g, uint64_t weights_hash, sf_buffer *out)
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
        snprintf(text, sizeof text, "weights xxh3=%016" PRIx64 "\n", weights_hash);
        if (rc == SF_OK) rc = sf_buffer_append(out, text, strlen(text));
    }
    /* the backend's resolved precision: AUTO and F32 are the same thing on the CPU */
    const char *device = g->backend ? g->backend->ops->name : g->opts.device ? g->opts.device : "cpu";
    sf_precision precision = g->backend ? g->backend->precision : g->opts.precision;
    snprintf(text, sizeof text, "backend %s precision=%s\n", device,
             precision == SF_PRECISION_BF16  ? "bf16"
             : precision == SF_PRECISION_FP8 ? "fp8"
             : precision == SF_PRECISION_F32 ? "f32"
                                             : "auto");
    if (rc == SF_OK) rc = sf_buffer_append(out, text, strlen(text));
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

/* Line `*at` of text[0..len): sets *line and *line_len, advances *at; 0 past the end. */
static int next_line(const char *text, size_t len, size_t *at, const char **line, size_t *line_len)
{
    if (*at >= len) return 0;
    const char *end = memchr(text + *at, '\n', len - *at);
    *line = text + *at;
    *line_len = end ? (size_t)(end - *line) : len - *at;
    *at += *line_len + 1;
    return 1;
}

/* Names the first item where the checkpoint's fingerprint and this run's differ. */
static int fingerprint_mismatch(const char *dir, uint64_t seq, const char *theirs, size_t theirs_len, const char *mine,
                                size_t mine_len, const char *hint)
{
    size_t a = 0, b = 0;
    const char *la = "", *lb = "";
    size_t na = 0, nb = 0;
    int ha, hb;
    for (;;) {
        ha = next_line(theirs, theirs_len, &a, &la, &na), hb = next_line(mine, mine_len, &b, &lb, &nb);
        if (!ha) la = "(nothing)", na = strlen(la);
        if (!hb) lb = "(nothing)", nb = strlen(lb);
        if (!ha && !hb) break; /* equal after all: not reached when the texts differ */
        if (na != nb || memcmp(la, lb, na) != 0) break;
    }
    /* a line starts with what it describes: model, weights, backend or a stage's name */
    const char *name = hb ? lb : la;
    size_t name_max = hb ? nb : na, name_len = 0;
    while (name_len < name_max && name_len < 32 && name[name_len] != ' ') name_len++;
#define IS(word) (name_len == strlen(word) && memcmp(name, word, name_len) == 0)
    const char *what = IS("model")     ? "model configuration"
                       : IS("weights") ? "model (its weights differ: another model file or seed)"
                       : IS("backend") ? "backend or precision"
                                       : NULL;
#undef IS
    char stage[64];
    if (!what) {
        snprintf(stage, sizeof stage, "%.*s stage (pipeline, input or output)", (int)name_len, name);
        what = stage;
    }
    return sf_error(SF_E_STATE,
                    "checkpoint %" PRIu64 " in '%s' was written with a different %s: it has '%.*s', this run '%.*s'; %s",
                    seq, dir, what, (int)(na > 300 ? 300 : na), la, (int)(nb > 300 ? 300 : nb), lb, hint);
}

int sf_graph_fingerprint_check(const sf_graph *g, uint64_t weights_hash, const char *dir, uint64_t seq,
                               const uint8_t *theirs, size_t theirs_len, const char *hint)
{
    sf_buffer mine = {0};
    int rc = sf_graph_fingerprint(g, weights_hash, &mine);
    if (rc == SF_OK && (mine.len != theirs_len || memcmp(mine.data, theirs, theirs_len) != 0))
        rc = fingerprint_mismatch(dir, seq, (const char *)theirs, theirs_len, (const char *)mine.data, mine.len, hint);
    sf_buffer_release(&mine);
    return rc;
}

static int parse_payload(sf_graph *g, const uint8_t *p, size_t len, uint64_t seq)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    uint32_t version, flags, fp_len;
    uint64_t stored_seq, state_len;
    if (len < 8 || memcmp(p, PAYLOAD_MAGIC, 4) != 0) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " has no seqflow graph state", seq);
    memcpy(&version, p + 4, 4);
    if (version != PAYLOAD_VERSION) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " has version %u (this build reads %u)", seq, version, PAYLOAD_VERSION);
    if (len < PAYLOAD_HEADER) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " is inconsistent", seq);
    memcpy(&stored_seq, p + 8, 8);
    memcpy(&flags, p + 16, 4);
    memcpy(&fp_len, p + 20, 4);
    if (stored_seq != seq || fp_len > len - PAYLOAD_HEADER || len - PAYLOAD_HEADER - fp_len < 8 || (flags & ~FLAG_FINISHED))
        return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " is inconsistent", seq);
    int rc = sf_graph_fingerprint_check(g, cp->weights_hash, cp->dir, seq, p + PAYLOAD_HEADER, fp_len,
                                        "resume with the same arguments (or start without --resume)");
    if (rc != SF_OK) return rc;
    size_t at = PAYLOAD_HEADER + fp_len;
    memcpy(&state_len, p + at, 8);
    at += 8;
    if (state_len != len - at) return sf_error(SF_E_STATE, "checkpoint %" PRIu64 " is inconsistent", seq);
    cp->finished = (flags & FLAG_FINISHED) != 0;
    cp->loaded = malloc(state_len ? (size_t)state_len : 1);
    if (!cp->loaded) return sf_error(SF_E_NOMEM, "out of memory");
    memcpy(cp->loaded, p + at, (size_t)state_len);
    cp->loaded_len = (size_t)state_len;
    return SF_OK;
}

int sf_graph_checkpoint_prepare(sf_graph *g)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    if (cp->prepared) return SF_OK; /* a distributed driver loads before the rendezvous */
    cp->prepared = 1;
    int rc = sf_checkpoint_dir_prepare(cp->dir);
    /* held until the graph is freed, so that no second run reads or clears the directory
     * while this one writes it */
    if (rc == SF_OK && cp->lock_fd < 0) rc = sf_checkpoint_lock(cp->dir, &cp->lock_fd);
    if (rc != SF_OK) return rc;
    cp->next_seq = 1;
    cp->finished = 0;
    cp->weights_hash = sf_model_weights_hash(g->model); /* once: the model does not change */
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
            cp->resumed_seq = seq;
            cp->next_seq = seq + 1;
            if (cp->finished) {
                /* still restored and run: nothing is computed, but the sink puts the output in
                 * place again (a kill may have landed between this checkpoint and the rename) */
                char line[4200];
                snprintf(line, sizeof line,
                         "the run checkpointed in '%s' had finished (checkpoint %" PRIu64 " follows the end of its "
                         "input): nothing to resume; the output is complete",
                         cp->dir, seq);
                report(cp, line);
            }
            cp->resuming = 1;
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
    /* a distributed run's checkpoint holds every rank's states: this process restores its own */
    int rc = g->dist ? sf_dist_restore(g, cp->loaded, cp->loaded_len) : sf_graph_restore_stages(g, cp->loaded, cp->loaded_len);
    free(cp->loaded);
    cp->loaded = NULL;
    cp->loaded_len = 0;
    if (rc != SF_OK) return sf_error(rc, "cannot resume from checkpoint %" PRIu64 ": %s", cp->resumed_seq, sf_last_error());
    return SF_OK;
}

static int write_checkpoint(sf_graph *g, const uint8_t *state, size_t state_len, int finished)
{
    sf_graph_checkpointing *cp = g->checkpoint;
    uint64_t seq = cp->next_seq;
    sf_buffer payload = {0}, fp = {0};
    uint32_t version = PAYLOAD_VERSION, flags = finished ? FLAG_FINISHED : 0, fp_len;
    uint64_t len64 = state_len;
    int rc = sf_graph_fingerprint(g, cp->weights_hash, &fp);
    fp_len = (uint32_t)fp.len;
    if (rc == SF_OK) rc = sf_buffer_append(&payload, PAYLOAD_MAGIC, 4);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &version, 4);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &seq, 8);
    if (rc == SF_OK) rc = sf_buffer_append(&payload, &flags, 4);
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
    rc = write_checkpoint(g, p->state, p->state_len, (p->flags & SF_PACKET_FINAL) != 0);
    sf_packet_free(p);
    return rc;
}

static int emit_marker(sf_stage *st, int final)
{
    sf_graph *g = st->graph;
    if (!g->checkpoint || g->push_mode) return sf_error(SF_E_INVAL, "checkpoints are off (or the graph runs in push mode)");
    sf_packet *p = sf_packet_new(SF_PACKET_CHECKPOINT, 0, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    /* on a marker, FINAL means "after the end of the input": the checkpoint records that */
    if (final) p->flags |= SF_PACKET_FINAL;
    return sf_graph_checkpoint_pass(st, p);
}

int sf_stage_emit_checkpoint(sf_stage *st) { return emit_marker(st, 0); }
int sf_stage_emit_final_checkpoint(sf_stage *st) { return emit_marker(st, 1); }

int sf_graph_checkpoint_finished(const sf_graph *g) { return g && g->checkpoint && g->checkpoint->finished; }
