/* Graph construction, stage instances, push mode and state save/restore. The threaded
 * executor lives in scheduler.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "pipeline/graph_internal.h"
#include "core/process_stats.h"
#include "stages/head_procs.h"

int sf_graph_create(const sf_model *model, const sf_graph_options *opts, sf_graph **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_graph_create: out is NULL");
    *out = NULL;
    sf_graph *g = calloc(1, sizeof *g);
    if (!g) return sf_error(SF_E_NOMEM, "out of memory");
    if (opts) g->opts = *opts;
    if (!g->opts.device) g->opts.device = "cpu";
    if (g->opts.queue_depth <= 0) g->opts.queue_depth = 4;
    g->model = model;
    pthread_mutex_init(&g->error_lock, NULL);
    atomic_init(&g->tokens_out, 0);
    const sf_backend_options bopts = {.device = g->opts.device_index,
                                      .precision = g->opts.precision,
                                      .threads = g->opts.threads,
                                      .settings = g->opts.backend_settings};
    int rc = sf_backend_create_opts(g->opts.device, &bopts, &g->backend);
    /* the settings string is the caller's: not kept beyond this call */
    g->opts.backend_settings = NULL;
    if (rc != SF_OK) {
        sf_graph_free(g);
        return rc;
    }
    g->profile = sf_graph_profile_wanted();
    *out = g;
    return SF_OK;
}

static void stage_free(sf_stage *st)
{
    if (!st) return;
    if (st->initialized && st->cls->free) st->cls->free(st);
    sf_dist_heads_free(st->heads);
    sf_stage_options_free(st);
    free(st->ranks);
    free(st);
}

static void print_profile(const sf_graph *g)
{
    if (!g->profile || !g->push_mode) return;
    fprintf(stderr, "seqflow profile (push mode, host seconds in each stage alone):\n");
    for (int i = 0; i < g->n_stages && i < SF_GRAPH_PROFILE_STAGES; i++)
        fprintf(stderr, "  stage %d %-10s %6ld calls %9.3f s\n", i, g->stages[i]->cls->name, g->profile_calls[i],
                g->profile_seconds[i]);
    fprintf(stderr, "  device rows to host   %9.3f s\n", g->profile_to_host);
}

void sf_graph_free(sf_graph *g)
{
    if (!g) return;
    print_profile(g);
    /* links first: packets still in them may hold loans from a stage's pool */
    for (int i = 0; i < g->n_links; i++) sf_link_destroy(g->links[i]);
    free(g->links);
    sf_dist_part_free(g->dist);
    for (int i = 0; i < g->n_stages; i++) stage_free(g->stages[i]);
    free(g->stages);
    while (g->outputs.count) {
        sf_packet_free(g->outputs.items[g->outputs.head]);
        g->outputs.head = (g->outputs.head + 1) % g->outputs.cap;
        g->outputs.count--;
    }
    free(g->outputs.items);
    sf_graph_checkpoint_free(g);
    sf_backend_free(g->backend);
    pthread_mutex_destroy(&g->error_lock);
    free(g);
}

int sf_graph_add_class(sf_graph *g, const sf_stage_class *cls, const char *options,
                       sf_stage **out)
{
    if (!g || !cls) return sf_error(SF_E_INVAL, "sf_graph_add_class: NULL argument");
    if (g->started) return sf_error(SF_E_INVAL, "stages cannot be added to a started graph");
    if (g->n_stages >= SF_GRAPH_MAX_STAGES)
        return sf_error(SF_E_INVAL, "a graph holds at most %d stages", SF_GRAPH_MAX_STAGES);
    if (g->n_stages == g->cap_stages) {
        int cap = g->cap_stages ? 2 * g->cap_stages : 8;
        sf_stage **s = realloc(g->stages, (size_t)cap * sizeof *s);
        if (!s) return sf_error(SF_E_NOMEM, "out of memory");
        g->stages = s;
        g->cap_stages = cap;
    }
    sf_stage *st = calloc(1, sizeof *st);
    if (!st) return sf_error(SF_E_NOMEM, "out of memory");
    st->cls = cls;
    st->graph = g;
    st->index = g->n_stages;
    int rc = sf_stage_options_parse(st, options);
    if (rc != SF_OK) {
        stage_free(st);
        return rc;
    }
    g->stages[g->n_stages++] = st;
    if (out) *out = st;
    return SF_OK;
}

int sf_graph_add(sf_graph *g, const char *stage, const char *options, sf_stage **out)
{
    const sf_stage_class *cls = sf_find_stage(stage);
    if (!cls) return sf_error(SF_E_STAGE, "unknown stage '%s' (see `seqflow stages`)", stage ? stage : "(null)");
    return sf_graph_add_class(g, cls, options, out);
}

int sf_graph_size(const sf_graph *g) { return g ? g->n_stages : 0; }

sf_stage *sf_graph_stage(const sf_graph *g, int i)
{
    return g && i >= 0 && i < g->n_stages ? g->stages[i] : NULL;
}

const char *sf_graph_error(const sf_graph *g) { return g ? g->error_message : ""; }

int sf_graph_stage_stats(const sf_graph *g, int i, sf_stage_stats *out)
{
    if (!g || !out || i < 0 || i >= g->n_stages) return sf_error(SF_E_INVAL, "sf_graph_stage_stats: no stage %d", i);
    *out = g->stages[i]->stats;
    return SF_OK;
}

uint64_t sf_graph_tokens_out(const sf_graph *g)
{
    return g ? (uint64_t)atomic_load(&((sf_graph *)g)->tokens_out) : 0;
}

void sf_graph_interrupt(sf_graph *g)
{
    if (g) g->interrupted = 1;
}

int sf_graph_fail(sf_graph *g, int code, const char *stage_name, const char *message)
{
    pthread_mutex_lock(&g->error_lock);
    if (g->error_code == SF_OK) {
        g->error_code = code;
        if (stage_name)
            snprintf(g->error_message, sizeof g->error_message, "%s: %s", stage_name,
                     message && *message ? message : sf_strerror(code));
        else
            snprintf(g->error_message, sizeof g->error_message, "%s",
                     message && *message ? message : sf_strerror(code));
    }
    pthread_mutex_unlock(&g->error_lock);
    return code;
}

int sf_graph_own_link(sf_graph *g, sf_link *l)
{
    if (!l) return sf_error(SF_E_NOMEM, "out of memory");
    if (g->n_links == g->cap_links) {
        int cap = g->cap_links ? 2 * g->cap_links : 8;
        sf_link **links = realloc(g->links, (size_t)cap * sizeof *links);
        if (!links) {
            sf_link_destroy(l);
            return sf_error(SF_E_NOMEM, "out of memory");
        }
        g->links = links;
        g->cap_links = cap;
    }
    g->links[g->n_links++] = l;
    return SF_OK;
}

int sf_graph_start(sf_graph *g, int threaded)
{
    if (g->started) return SF_OK;
    if (g->n_stages == 0) return sf_error(SF_E_INVAL, "the graph has no stages");
    /* a distributed part (g->dist) runs its own stages and links to the rest */
    int remote = g->dist ? -1 : sf_graph_first_remote_stage(g);
    if (remote >= 0) {
        const int *ranks;
        int n = sf_stage_placement(g->stages[remote], &ranks);
        int other = ranks[0] != 0 || n == 1 ? ranks[0] : ranks[1];
        return sf_error(SF_E_UNSUPPORTED,
                        "stage %d (%s) is placed on rank %d: run it with `seqflow launch` or `seqflow worker`",
                        remote + 1, g->stages[remote]->cls->name, other);
    }
    for (int i = 0; i < g->n_stages; i++) {
        sf_stage *st = g->stages[i];
        if (i > 0 && st->cls->generate && !st->cls->process)
            return sf_error(SF_E_PARSE, "source stage '%s' can only come first", st->cls->name);
        if (i + 1 < g->n_stages && st->cls->terminal)
            return sf_error(SF_E_PARSE, "stage %d (%s) ends the pipeline and can only come last", i + 1, st->cls->name);
        if (i == 0 && threaded && !st->cls->generate)
            return sf_error(SF_E_PARSE, "a pipeline that runs on its own starts with a source, not '%s'",
                            st->cls->name);
        if (!threaded && st->cls->generate && !st->cls->process)
            return sf_error(SF_E_PARSE, "push mode feeds tokens itself; remove source '%s'", st->cls->name);
    }
    /* stages that were initialized stay so (sf_graph_free frees them): never run init twice */
    if (g->start_failed) return sf_error(SF_E_INVAL, "the graph failed to start; free it and make another");
    for (int i = 0; i < g->n_stages; i++) {
        sf_stage *st = g->stages[i];
        if (st->remote) continue; /* another process of a distributed run initializes it */
        sf_clear_error();
        int rc = st->cls->init ? st->cls->init(st) : SF_OK;
        st->initialized = 1; /* free() runs even after a failed init, on whatever init set up */
        if (rc != SF_OK) g->start_failed = 1;
        if (rc != SF_OK) return sf_error(rc, "%s: %s", st->cls->name, *sf_last_error() ? sf_last_error() : sf_strerror(rc));
        if (threaded && i + 1 < g->n_stages && !g->dist) { /* a distributed part has its links */
            sf_link *q = sf_queue_link_create(g->opts.queue_depth);
            if ((rc = sf_graph_own_link(g, q)) != SF_OK) {
                g->start_failed = 1;
                return rc;
            }
            st->out = q;
            g->stages[i + 1]->in = q;
        }
    }
    g->started = 1;
    g->push_mode = !threaded;
    return SF_OK;
}

int sf_graph_prepare(sf_graph *g)
{
    if (!g) return sf_error(SF_E_INVAL, "sf_graph_prepare: NULL graph");
    if (g->started && !g->push_mode) return sf_error(SF_E_INVAL, "this graph runs on threads (sf_graph_run); it takes no pushes");
    return sf_graph_start(g, 0);
}

/* ---- stage accessors ---------------------------------------------------------------------- */

void *sf_stage_priv(const sf_stage *st) { return st->priv; }
void sf_stage_set_priv(sf_stage *st, void *priv) { st->priv = priv; }
const sf_model *sf_stage_model(const sf_stage *st) { return st->graph->model; }
sf_backend *sf_stage_backend(const sf_stage *st) { return st->graph->backend; }
const char *sf_stage_name(const sf_stage *st) { return st->cls->name; }
int sf_stage_interrupted(const sf_stage *st) { return st->graph->interrupted != 0; }
uint64_t sf_stage_checkpoint_every(const sf_stage *st)
{
    return st->graph->checkpoint && !st->graph->push_mode ? st->graph->checkpoint->opts.every : 0;
}
int sf_stage_resuming(const sf_stage *st) { return st->graph->checkpoint && st->graph->checkpoint->resuming; }
int sf_stage_outputs_on_device(const sf_stage *st)
{
    return st->graph->device_outputs && st->graph->push_mode && st->index == st->graph->n_stages - 1;
}
void sf_graph_set_device_outputs(sf_graph *g, int on) { g->device_outputs = on; }
sf_head_procs *sf_stage_head_procs(const sf_stage *st) { return st->heads; }

void sf_graph_count_output(sf_graph *g, const sf_packet *p)
{
    if (p->kind == SF_PACKET_HIDDEN && !(p->flags & SF_PACKET_PROVISIONAL)) {
        atomic_fetch_add(&g->tokens_out, p->n);
        if (p->n) {
            atomic_store(&g->last_stream, p->stream);
            atomic_store(&g->last_segment, p->segment + 1);
        }
    }
}

static int fifo_push(sf_packet_fifo *f, sf_packet *p)
{
    if (f->count == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 16;
        sf_packet **items = malloc(cap * sizeof *items);
        if (!items) return sf_error(SF_E_NOMEM, "out of memory");
        for (size_t i = 0; i < f->count; i++) items[i] = f->items[(f->head + i) % f->cap];
        free(f->items);
        f->items = items;
        f->head = 0;
        f->cap = cap;
    }
    f->items[(f->head + f->count) % f->cap] = p;
    f->count++;
    return SF_OK;
}

/* Device rows stay on the device only for stages that take them (stage.h, device_rows);
 * whatever leaves the graph is a host packet, unless its caller takes device rows
 * (sf_graph_set_device_outputs). Frees p on failure. */
static int rows_for(sf_graph *g, int to, sf_packet *p)
{
    if (!p->dev || (to < g->n_stages && g->stages[to]->cls->device_rows)) return SF_OK;
    /* outputs the caller brings to the host itself (sf_graph_set_device_outputs): scanned here */
    const int keep = to >= g->n_stages && g->device_outputs && g->push_mode;
    double t0 = g->profile ? sf_monotonic_seconds() : 0;
    /* with checks ON, rows brought to the host are scanned where they are first (a hit is then
     * named from the host copy) */
    int found = 0;
    sf_rows_check chk = {0};
    const int scan = p->kind == SF_PACKET_HIDDEN
                         ? sf_be_check_rows_begin(g->backend, p->dev, SF_DTYPE_F32, p->n * p->width, &chk)
                         : SF_OK;
    int rc = keep ? SF_OK : sf_packet_to_host(p);
    const int ended = scan == SF_OK ? sf_be_check_rows_end(g->backend, &chk, &found) : SF_OK;
    if (rc == SF_OK && found && keep) rc = sf_packet_to_host(p); /* to name the value */
    if (rc == SF_OK) rc = scan != SF_OK ? scan : ended;
    if (rc == SF_OK && found) rc = sf_packet_check_finite(p, "in the rows brought to the host");
    if (g->profile && g->push_mode) g->profile_to_host += sf_monotonic_seconds() - t0; /* one thread */
    if (rc != SF_OK) sf_packet_free(p);
    return rc;
}

static int process_timed(sf_graph *g, int to, sf_packet *p)
{
    sf_stage *next = g->stages[to];
    if (!g->profile || to >= SF_GRAPH_PROFILE_STAGES) return next->cls->process(next, p);
    double outer = g->profile_nested, t0 = sf_monotonic_seconds();
    g->profile_nested = 0;
    int rc = next->cls->process(next, p);
    double inclusive = sf_monotonic_seconds() - t0;
    g->profile_seconds[to] += inclusive - g->profile_nested;
    g->profile_calls[to]++;
    g->profile_nested = outer + inclusive;
    return rc;
}

int sf_graph_deliver(sf_graph *g, int to, sf_packet *p)
{
    int rc = rows_for(g, to, p);
    if (rc != SF_OK) return rc;
    if (to >= g->n_stages) {
        sf_graph_count_output(g, p);
        rc = fifo_push(&g->outputs, p);
        if (rc != SF_OK) sf_packet_free(p);
        return rc;
    }
    return process_timed(g, to, p);
}

int sf_stage_emit(sf_stage *st, sf_packet *p)
{
    if (!p) return sf_error(SF_E_INVAL, "sf_stage_emit: NULL packet");
    sf_graph *g = st->graph;
    if (g->push_mode) return sf_graph_deliver(g, st->index + 1, p);
    if (!st->out) { /* the last stage of a threaded graph: nothing downstream */
        sf_packet_free(p);
        return SF_OK;
    }
    int rc = rows_for(g, st->index + 1, p);
    if (rc != SF_OK) return rc;
    /* a push that waits for room downstream is not this stage's work (sf_graph_stage_stats) */
    const double t0 = sf_monotonic_seconds();
    rc = st->out->ops->push(st->out, p);
    st->stats.busy_seconds -= sf_monotonic_seconds() - t0;
    return rc;
}

/* ---- push mode ---------------------------------------------------------------------------- */

static int push_packet(sf_graph *g, sf_packet *p)
{
    int rc = sf_graph_start(g, 0);
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    if (!g->push_mode) {
        sf_packet_free(p);
        return sf_error(SF_E_INVAL, "this graph runs on threads (sf_graph_run); it takes no pushes");
    }
    if (g->error_code != SF_OK) {
        sf_packet_free(p);
        return sf_error(g->error_code, "%s", g->error_message);
    }
    sf_clear_error();
    rc = sf_graph_deliver(g, 0, p);
    /* nothing more comes until the caller's next push: what a stage holds back goes on now,
     * in stage order, so that what the first emits reaches the next stage before its turn */
    for (int i = 0; i < g->n_stages && rc == SF_OK; i++)
        if (g->stages[i]->cls->idle) rc = g->stages[i]->cls->idle(g->stages[i]);
    if (rc != SF_OK) sf_graph_fail(g, rc, NULL, sf_last_error());
    return rc;
}

int sf_graph_push(sf_graph *g, uint64_t stream, const uint32_t *tokens, size_t n)
{
    if (!g || (!tokens && n)) return sf_error(SF_E_INVAL, "sf_graph_push: NULL argument");
    sf_packet *p = sf_packet_new(SF_PACKET_TOKENS, n, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    p->stream = stream;
    p->n = n;
    if (n) memcpy(p->tokens, tokens, n * sizeof *tokens);
    return push_packet(g, p);
}

int sf_graph_flush(sf_graph *g, uint64_t stream)
{
    if (!g) return sf_error(SF_E_INVAL, "sf_graph_flush: NULL graph");
    sf_packet *p = sf_packet_new(SF_PACKET_FLUSH, 0, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    p->stream = stream;
    return push_packet(g, p);
}

int sf_graph_end(sf_graph *g, uint64_t stream)
{
    if (!g) return sf_error(SF_E_INVAL, "sf_graph_end: NULL graph");
    sf_packet *p = sf_packet_new(SF_PACKET_TOKENS, 0, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    p->stream = stream;
    p->flags = SF_PACKET_FINAL;
    return push_packet(g, p);
}

sf_packet *sf_graph_pull(sf_graph *g)
{
    if (!g || g->outputs.count == 0) return NULL;
    sf_packet *p = g->outputs.items[g->outputs.head];
    g->outputs.head = (g->outputs.head + 1) % g->outputs.cap;
    g->outputs.count--;
    return p;
}

/* ---- state -------------------------------------------------------------------------------- */

/* Blob: for each stateful stage, in graph order: u32 index, u32 name length, name,
 * u64 state length, state. Restore checks that the names line up. */
int sf_graph_save_stage(sf_stage *st, sf_buffer *out)
{
    if (!st->cls->save) return SF_OK;
    sf_buffer state = {0};
    int rc = st->cls->save(st, &state);
    uint32_t index = (uint32_t)st->index, name_len = (uint32_t)strlen(st->cls->name);
    uint64_t len = state.len;
    if (rc == SF_OK) rc = sf_buffer_append(out, &index, sizeof index);
    if (rc == SF_OK) rc = sf_buffer_append(out, &name_len, sizeof name_len);
    if (rc == SF_OK) rc = sf_buffer_append(out, st->cls->name, name_len);
    if (rc == SF_OK) rc = sf_buffer_append(out, &len, sizeof len);
    if (rc == SF_OK && state.len) rc = sf_buffer_append(out, state.data, state.len);
    sf_buffer_release(&state);
    return rc;
}

int sf_graph_save(sf_graph *g, sf_buffer *out)
{
    if (!g || !out) return sf_error(SF_E_INVAL, "sf_graph_save: NULL argument");
    int rc = sf_graph_start(g, 0);
    if (rc != SF_OK) return rc;
    for (int i = 0; i < g->n_stages && rc == SF_OK; i++) rc = sf_graph_save_stage(g->stages[i], out);
    return rc;
}

int sf_graph_restore_stages(sf_graph *g, const uint8_t *data, size_t len)
{
    size_t at = 0;
    for (int i = 0; i < g->n_stages; i++) {
        sf_stage *st = g->stages[i];
        if (!st->cls->save) continue;
        uint32_t index, name_len;
        uint64_t state_len;
        if (len - at < 8) return sf_error(SF_E_STATE, "state ends before stage %d (%s)", i, st->cls->name);
        memcpy(&index, data + at, 4);
        memcpy(&name_len, data + at + 4, 4);
        at += 8;
        if (index != (uint32_t)i || name_len != strlen(st->cls->name) || len - at < name_len ||
            memcmp(data + at, st->cls->name, name_len) != 0)
            return sf_error(SF_E_STATE, "state does not match stage %d (%s)", i, st->cls->name);
        at += name_len;
        if (len - at < 8) return sf_error(SF_E_STATE, "state of stage %s is truncated", st->cls->name);
        memcpy(&state_len, data + at, 8);
        at += 8;
        if (state_len > len - at) return sf_error(SF_E_STATE, "state of stage %s is truncated", st->cls->name);
        if (!st->cls->restore)
            return sf_error(SF_E_STATE, "stage %s saves state but cannot restore it", st->cls->name);
        int rc = st->cls->restore(st, data + at, (size_t)state_len);
        if (rc != SF_OK) return rc;
        at += (size_t)state_len;
    }
    if (at != len) return sf_error(SF_E_STATE, "%zu bytes of state left over", len - at);
    return SF_OK;
}

int sf_graph_restore(sf_graph *g, const uint8_t *data, size_t len)
{
    if (!g || (!data && len)) return sf_error(SF_E_INVAL, "sf_graph_restore: NULL argument");
    int rc = sf_graph_start(g, 0);
    if (rc != SF_OK) return rc;
    return sf_graph_restore_stages(g, data, len);
}
