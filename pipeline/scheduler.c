/* The threaded executor: one thread per stage, bounded queues between them. End of input
 * travels as a closed link; an error anywhere aborts every link so no thread stays blocked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/process_stats.h"
#include "kernels/comm.h"
#include "pipeline/graph_internal.h"
#include "pipeline/net.h"
#include "stages/head_procs.h"

#define WHY_TRAVELS 150

void sf_graph_abort_links(sf_graph *g)
{
    /* A failure of this process's own (not an abort that reached it) travels with the aborts of
     * its network links, so that the other ranks, the driver among them, say what failed where
     * instead of only that a link was cut. */
    char why[sizeof g->error_message] = "", failed[sizeof g->error_message];
    pthread_mutex_lock(&g->error_lock);
    if (g->error_code != SF_OK && g->error_code != SF_E_CLOSED) memcpy(why, g->error_message, sizeof why);
    snprintf(failed, sizeof failed, "%s", g->error_message[0] ? g->error_message : "the process's run failed");
    pthread_mutex_unlock(&g->error_lock);
    /* head ranks in other processes may wait in a collective for this one (stages/head_procs.h):
     * they end now, with this process's reason, not at their timeout */
    for (int i = 0; i < g->n_stages; i++)
        if (g->stages[i]->heads) {
            __atomic_store_n(&g->stages[i]->heads->stop, 1, __ATOMIC_RELEASE); /* the stage's NCCL one */
            sf_comm_abort(g->stages[i]->heads->comm, failed);
        }
    /* an abort carries at most 200 bytes of text, the link's own words included: cut at a word */
    if (strlen(why) > WHY_TRAVELS) {
        char *cut = why + WHY_TRAVELS - 4;
        while (cut > why && *cut != ' ') cut--;
        strcpy(cut, " ...");
    }
    for (int i = 0; i < g->n_links; i++) {
        if (*why) sf_net_link_abort_why(g->links[i], why); /* nothing for other kinds of links */
        g->links[i]->ops->abort(g->links[i]);
    }
}

static void stage_failed(sf_stage *st, int rc)
{
    sf_graph *g = st->graph;
    const char *msg = sf_last_error();
    if (rc == SF_E_CLOSED && g->error_code != SF_OK) return; /* fallout of an earlier failure */
    sf_graph_fail(g, rc, st->cls->name, msg);
    sf_graph_abort_links(g);
}

static void *stage_thread(void *arg)
{
    sf_stage *st = arg;
    sf_graph *g = st->graph;
    sf_link *in = st->in; /* a queue, a network half or a merger (distributed.c) */
    int last = st->index == g->n_stages - 1;
    int rc = SF_OK;
    sf_clear_error();
    if (st->cls->generate) {
        for (;;) {
            const double t0 = sf_monotonic_seconds();
            rc = st->cls->generate(st);
            st->stats.busy_seconds += sf_monotonic_seconds() - t0;
            st->stats.packets++;
            if (rc <= 0) break;
        }
        if (rc > 0) rc = SF_OK;
    } else {
        sf_packet *p;
        for (;;) {
            if (st->cls->idle && !in->ops->ready(in) && (rc = st->cls->idle(st)) != SF_OK) break;
            if (!(p = in->ops->pop(in))) {
                /* a link cut short (a dead peer) must not pass for the end of the input */
                if (in->ops->status) rc = in->ops->status(in);
                break;
            }
            if (p->kind == SF_PACKET_CHECKPOINT) { /* never seen by process() */
                rc = sf_graph_checkpoint_pass(st, p);
                if (rc != SF_OK) break;
                continue;
            }
            if (last) sf_graph_count_output(g, p);
            const double t0 = sf_monotonic_seconds();
            rc = st->cls->process(st, p);
            st->stats.busy_seconds += sf_monotonic_seconds() - t0;
            st->stats.packets++;
            if (rc != SF_OK) break;
        }
        if (rc == SF_OK && g->error_code != SF_OK) rc = SF_E_CLOSED; /* aborted upstream */
    }
    if (rc == SF_OK && st->cls->flush) {
        const double t0 = sf_monotonic_seconds();
        rc = st->cls->flush(st);
        st->stats.busy_seconds += sf_monotonic_seconds() - t0;
    }
    if (rc != SF_OK) {
        stage_failed(st, rc);
        if (in) in->ops->abort(in); /* unblock the producer */
    }
    if (st->out) st->out->ops->close(st->out);
    return NULL;
}

int sf_graph_run(sf_graph *g)
{
    if (!g) return sf_error(SF_E_INVAL, "sf_graph_run: NULL graph");
    if (g->started) return sf_error(SF_E_INVAL, "a graph runs once");
    int rc = g->checkpoint ? sf_graph_checkpoint_prepare(g) : SF_OK;
    if (rc == SF_OK) rc = sf_graph_start(g, 1);
    if (rc == SF_OK && g->checkpoint) rc = sf_graph_checkpoint_restore_stages(g);
    if (rc == SF_OK && g->dist) rc = sf_dist_restore_given(g); /* a worker's share of a checkpoint */
    if (rc != SF_OK) {
        sf_graph_fail(g, rc, NULL, sf_last_error());
        return rc;
    }
    pthread_t *threads = calloc((size_t)g->n_stages, sizeof *threads);
    if (!threads) return sf_error(SF_E_NOMEM, "out of memory");
    int started = 0;
    for (int i = 0; i < g->n_stages; i++) {
        if (g->stages[i]->remote) continue; /* another process runs it */
        if (pthread_create(&threads[started], NULL, stage_thread, g->stages[i]) != 0) {
            sf_graph_fail(g, SF_E_NOMEM, NULL, "could not start a stage thread");
            sf_graph_abort_links(g);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    free(threads);
    if (g->error_code != SF_OK) return sf_error(g->error_code, "%s", g->error_message);
    if (g->interrupted) return sf_error(SF_E_INTERRUPTED, "interrupted; output flushed");
    return SF_OK;
}
