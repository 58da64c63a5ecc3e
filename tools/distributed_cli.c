/* `seqflow worker` (one rank of a distributed run) and `seqflow launch` (N local workers with a
 * generated topology). A worker: finds its rank (the launcher's environment or --rank/--world),
 * reads the topology and its key, builds the same graph as every other rank, joins rank 0's
 * rendezvous (which checks that everyone runs the same thing and hands each its share of a
 * checkpoint on --resume), connects its links and runs its stages. Rank 0 is the driver: it
 * reads the input, writes the output and the checkpoints. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/comm_net.h"
#include "pipeline/distributed.h"
#include "pipeline/launcher.h"
#include "pipeline/net.h"
#include "pipeline/rendezvous.h"
#include "pipeline/topology.h"
#include "tools/distributed_cli.h"
#include "tools/run_common.h"
#include "tools/sequence_cli.h"

extern char **environ;

static void worker_usage(FILE *f)
{
    fputs("usage: seqflow worker [worker options] [run options] [PIPELINE]\n"
          "\n"
          "One rank of a distributed run. Every rank is given the same run options and pipeline\n"
          "(the pipeline's placements, `@R` or `@R1,R2,...`, say which ranks run each stage; no\n"
          "placement is rank 0). Rank 0 is the driver: it reads the input, writes the output and\n"
          "the checkpoints; the others run their stages. The run options are `seqflow run`'s\n"
          "(seqflow --help).\n"
          "\n"
          "worker options:\n"
          "      --topology FILE     the job's topology (docs/DISTRIBUTED.md): ranks, endpoints,\n"
          "                          keys, link options; its pipeline is used when none is given\n"
          "      --key FILE          this rank's secret CURVE key (mode 0600); '{rank}' in FILE is\n"
          "                          replaced by the rank (one command line for every rank)\n"
          "      --connect ENDPOINT  instead of --topology (ranks other than 0): ask rank 0's\n"
          "                          rendezvous at ENDPOINT (default: MASTER_ADDR:MASTER_PORT) for\n"
          "                          the topology; the rank comes from --rank or the launcher\n"
          "      --server-key KEY    with --connect under CURVE: rank 0's public key (40 Z85\n"
          "                          characters, the topology's); this rank proves itself with\n"
          "                          --key, whose public half the topology must list for it.\n"
          "                          Without it the job must be plaintext\n"
          "      --rank R --world N  this rank and the job's size (default: the launcher's\n"
          "                          environment: torchrun, Open MPI, PMIx, Slurm, a Kubernetes\n"
          "                          indexed Job; MASTER_ADDR/MASTER_PORT replace the topology's\n"
          "                          rendezvous)\n"
          "      --local-rank R      this rank's index on its machine (default: the launcher's)\n"
          "      --rejoin-timeout S  with --checkpoint: how long the driver waits for a lost rank to\n"
          "                          come back (default 60; 0: the job ends at once, as without\n"
          "                          --checkpoint). Every rank must be given the same value\n"
          "\n"
          "sequence parallelism (one long stream over every rank; docs/DISTRIBUTED.md):\n"
          "      --sequence MODE     scan (every rank at once, the state at each chunk's start\n"
          "                          from a scan; within 1e-5 of one process) or handoff (each\n"
          "                          rank passes the exact state on; bit for bit)\n"
          "      --chunks K[,K...]   segments a rank takes per round: one number for every rank,\n"
          "                          or one per rank (default 16)\n"
          "      --balance           after each round, split the next in proportion to each\n"
          "                          rank's measured speed (the round's total stays)\n"
          "      --federation        scan: only global tokens cross between datacenters, each\n"
          "                          keeping its own memory (approximate)\n"
          "  The input (-i FILE, bytes or u32) is read and the output (-o FILE, raw or .npy)\n"
          "  written by every rank at its chunks' places: both on a shared folder (or '{rank}'\n"
          "  in -o for a file per rank, each holding its own rows).\n"
          "\n"
          "A rank that dies or stops answering (no heartbeat within the topology's timeout_ms,\n"
          "3000 by default) fails the job: the driver exits 1 naming the rank, its host and the\n"
          "last committed segment, and removes its unfinished output. With --checkpoint, the\n"
          "driver first waits up to --rejoin-timeout seconds for a process to claim the lost rank\n"
          "at the rendezvous (its launcher starting it again: seqflow launch --restart, a Slurm\n"
          "restart loop, Kubernetes' restartPolicy: OnFailure), under the same checks and keys as\n"
          "a first join; the other workers wait there too. Then every rank rolls back to the newest\n"
          "checkpoint and the job goes on, its output the uninterrupted run's. Only workers come\n"
          "back: when the driver (rank 0) dies, or the rank does not come back in time, the job\n"
          "ends, and the same command with --resume goes on from the newest checkpoint.\n"
          "\n"
          "Unless -q is given, every rank ends with a `network:` line: the packets and bytes it\n"
          "sent and received over its links.\n",
          f);
}

/* ---- seqflow worker ------------------------------------------------------------------------ */

typedef struct worker {
    run_ctx run;
    const char *topology_path, *key_path;
    int rank, world, local_rank;
    sf_topology *topology;
    sf_net *net;
    /* this rank's keys: the network reads them whenever it connects, until sf_net_free */
    char secret[SF_Z85_KEY_LEN + 1], public_key[SF_Z85_KEY_LEN + 1];
    const uint8_t *resume_state; /* driver: the loaded checkpoint's state (owned by the graph) */
    size_t resume_len;
    seq_args seq;                /* --sequence: a sequence-parallel job (tools/sequence_cli.c) */
    sf_buffer seq_resume;        /* rank 0 of one, with --resume: the saved state handed out */
    int rejoin_s;                /* --rejoin-timeout (seconds; 0: a lost rank ends the job) */
    char lost[1024];             /* driver: why the last attempt failed, when a rank was lost and
                                    the job waits for it to rejoin ("" otherwise) */
    sf_rendezvous_config rv;     /* the rendezvous, every attempt's; borrows the fields below */
    const char **rv_keys, **rv_endpoints;
    sf_launch_info launch;       /* the launcher's view (its rendezvous address, torchrun's) */
    const char *connect;         /* --connect: rank 0's rendezvous, the topology asked from it */
    const char *server_key;      /* --server-key: rank 0's public key (Z85); none: plaintext */
    char connect_at[300];        /* the rendezvous the topology came from ("": from a file) */
    char *topology_text;         /* driver: the topology file's text, for ranks that ask */
    size_t topology_len;
} worker;

#define DEFAULT_REJOIN_SECONDS 60

/* Takes the worker options out of argv (in place); the rest are run options. 0 to go on, else
 * the exit status (-1: help). */
static int worker_options(int *argc, char **argv, worker *w)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *arg = argv[i];
        const char **text = NULL;
        int *number = NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            worker_usage(stdout);
            return -1;
        }
        int taken = seq_parse_option(*argc, argv, &i, &w->seq);
        if (taken < 0) return 2;
        if (taken) continue;
        if (strcmp(arg, "--topology") == 0) text = &w->topology_path;
        else if (strcmp(arg, "--connect") == 0) text = &w->connect;
        else if (strcmp(arg, "--server-key") == 0) text = &w->server_key;
        else if (strcmp(arg, "--key") == 0) text = &w->key_path;
        else if (strcmp(arg, "--rank") == 0) number = &w->rank;
        else if (strcmp(arg, "--world") == 0) number = &w->world;
        else if (strcmp(arg, "--local-rank") == 0) number = &w->local_rank;
        else if (strcmp(arg, "--rejoin-timeout") == 0) number = &w->rejoin_s;
        if (!text && !number) {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc) {
            fprintf(stderr, "seqflow: %s needs a value\n", arg);
            return 2;
        }
        const char *value = argv[++i];
        long long v;
        if (text) *text = value;
        else if (!parse_int_arg(arg, value, 0, number == &w->rejoin_s ? 86400 : SF_DIST_MAX_RANKS, &v)) return 2;
        else *number = (int)v;
    }
    *argc = out;
    argv[out] = NULL;
    return 0;
}

/* The rendezvous payload of `rank`: a byte (1: resume) then its share of the checkpoint. */
static int payload_of(void *user, int rank, sf_buffer *out)
{
    worker *w = user;
    if (w->seq.on) { /* every rank restores the one round state */
        uint8_t resume = w->seq_resume.len > 0;
        int rc = sf_buffer_append(out, &resume, 1);
        return rc == SF_OK ? sf_buffer_append(out, w->seq_resume.data, w->seq_resume.len) : rc;
    }
    uint8_t resume = w->resume_state != NULL;
    int rc = sf_buffer_append(out, &resume, 1);
    if (rc == SF_OK && resume && rank != 0)
        rc = sf_dist_rank_state(w->run.graph, w->resume_state, w->resume_len, rank, out);
    return rc;
}

/* The options the topology gives the links between this rank and peer (sf_comm_net_options_fn). */
static int topology_link_options(void *user, int peer, sf_link_options *o)
{
    worker *w = user;
    sf_topology_link t;
    int rc = sf_topology_link_options(w->topology, w->rank, peer, &t);
    if (rc != SF_OK) return rc;
    *o = sf_link_options_default();
    o->codec = t.codec;
    o->level = t.level;
    o->quant = t.quant;
    o->group = t.group;
    o->shuffle = t.shuffle;
    o->error_feedback = t.error_feedback ? 1 : -1;
    o->window_packets = t.window_packets;
    o->window_bytes = t.window_bytes;
    return SF_OK;
}

static int net_link(void *user, int peer, uint32_t channel, int direction, sf_link **out)
{
    worker *w = user;
    sf_link_options o;
    int rc = topology_link_options(w, peer, &o);
    if (rc != SF_OK) return rc;
    return sf_net_link_create(w->net, peer, channel, direction == SF_DIST_SEND ? SF_NET_SEND : SF_NET_RECV, &o, out);
}

/* A block's head ranks that are processes (head_ranks=): their communicator over this rank's
 * sf_net; its collectives are lossless whatever the topology's links quantize. */
static int net_comm(void *user, const int *ranks, int n, int index, uint32_t channel_base, int timeout_ms,
                    sf_comm **out)
{
    worker *w = user;
    return sf_comm_net_create_group(w->net, ranks, n, index, channel_base, topology_link_options, w, timeout_ms, out);
}

/* The rank that went silent, if one did: a failure elsewhere often reaches the driver first as
 * an abort from the rank that noticed, so the driver waits (at most the heartbeat timeout) for
 * its own verdict on any peer it has not heard from lately. A rank that said goodbye (it closed
 * its network: it finished its part, or stopped after its abort) is not one of them. Of the
 * peers it has given up on, the one silent longest went first: a rank that noticed the death and
 * hangs falls silent later, and may be given up on too while the driver waits. A peer not given
 * up on yet but silent longer than that one is waited for. -1 when none. `others` gets the
 * other ranks given up on ("; also given up on: rank 1, silent for 1518 ms"), or "". */
static int silent_peer(worker *w, int64_t *silent_ms, char *others, size_t size)
{
    const int timeout = sf_topology_timeout_ms(w->topology), heartbeat = sf_topology_heartbeat_ms(w->topology);
    for (int waited = 0;; waited += 50) {
        int failed = -1;
        int64_t failed_ms = -1, suspect_ms = -1; /* the longest silence of either kind */
        for (int r = 1; r < w->world; r++) {
            sf_net_peer_status st;
            if (!sf_dist_peer_used(w->run.graph, r) || sf_net_peer_status_get(w->net, r, &st) != SF_OK || st.left)
                continue;
            if (st.failed && (failed < 0 || st.silent_ms > failed_ms)) failed = r, failed_ms = st.silent_ms;
            if (!st.failed && st.silent_ms > 2 * heartbeat && st.silent_ms > suspect_ms) suspect_ms = st.silent_ms;
        }
        if ((failed >= 0 && suspect_ms <= failed_ms) || suspect_ms < 0 || waited > timeout) {
            *silent_ms = failed_ms;
            size_t used = 0;
            others[0] = 0;
            for (int r = 1; r < w->world && failed >= 0; r++) {
                sf_net_peer_status st;
                if (r == failed || !sf_dist_peer_used(w->run.graph, r) || sf_net_peer_status_get(w->net, r, &st) != SF_OK ||
                    !st.failed || st.left || used >= size)
                    continue;
                used += (size_t)snprintf(others + used, size - used, "%s rank %d, silent for %lld ms",
                                         used ? "," : "; also given up on:", r, (long long)st.silent_ms);
            }
            return failed;
        }
        struct timespec nap = {0, 50 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* Whether this rank takes part in a rollback after a failed run: with --checkpoint and a
 * rejoin timeout, on a graph (not --sequence), not stopped by a signal. */
static int rejoin_on(const worker *w)
{
    return w->run.a.checkpoint_dir && w->rejoin_s > 0 && !w->seq.on && !run_stop_signal();
}

/* The driver's message for a failed run: the rank that stopped answering (when one did), the
 * graph's error otherwise, then where the output got to. */
static void driver_message(run_ctx *c, char *message, size_t size)
{
    worker *w = c->user;
    int64_t silent_ms = 0;
    char others[256] = "";
    const int r = w->net ? silent_peer(w, &silent_ms, others, sizeof others) : -1;
    size_t used = strlen(message);
    if (r >= 0) {
        const sf_topology_rank *t = sf_topology_rank_get(w->topology, r);
        used = (size_t)snprintf(message, size, "rank %d (host %s) stopped answering (silent for %lld ms%s)", r,
                                t && t->host ? t->host : "?", (long long)silent_ms, others);
    }
    /* lost on the network: a rank that died or hangs, seen here or by a neighbour whose abort
     * reached us (the driver has no link with every rank) */
    const int lost = r >= 0 || c->run_rc == SF_E_PEER || c->run_rc == SF_E_CLOSED;
    if (used >= size) used = size - 1;
    const size_t head = used;
    uint64_t stream, segment;
    if (used < size && sf_dist_last_committed(c->graph, &stream, &segment))
        used += (size_t)snprintf(message + used, size - used, "; last committed segment %" PRIu64 " of stream %" PRIu64,
                                 segment, stream);
    else if (used < size)
        used += (size_t)snprintf(message + used, size - used, "; no segment committed");
    if (used >= size) used = size - 1;
    uint64_t written = sf_graph_checkpoint_written(c->graph), resumed = sf_graph_checkpoint_resumed(c->graph);
    const uint64_t newest = written ? written : resumed;
    if (lost && rejoin_on(w)) {
        /* the job goes on if the rank comes back (worker_run), else this is the final word: where
         * the output got to (the rank that is missing, the rendezvous names then) */
        int n = snprintf(w->lost, sizeof w->lost, "%s", message + head + 2);
        if (newest && n >= 0 && (size_t)n < sizeof w->lost)
            snprintf(w->lost + n, sizeof w->lost - (size_t)n, "; checkpoint %" PRIu64 " holds it: rerun with --resume", newest);
        if (used < size)
            snprintf(message + used, size - used, "; waiting up to %d s (--rejoin-timeout) for every rank to come back "
                     "to the rendezvous, then rolling back to %s", w->rejoin_s, newest ? "the newest checkpoint" : "the beginning");
        return;
    }
    if (used < size && newest)
        snprintf(message + used, size - used, "; checkpoint %" PRIu64 " holds it: rerun with --resume", newest);
}

/* One attempt at the job: the plan, the rendezvous (attempt > 0: a rejoin, every rank rolling
 * back to the driver's newest checkpoint), the network, the run. Returns the exit status;
 * *ran is set once the graph ran (a failure before that is never retried). */
static int worker_attempt(worker *w, int attempt, const char *label, const char *seq_text, int *ran)
{
    run_ctx *c = &w->run;
    int rc = SF_OK;
    *ran = 0;
    if (!w->seq.on) {
        if (attempt > 0) {
            /* the roll-back: a new graph, restored as --resume would (the driver loads the
             * newest checkpoint, the sink cuts its OUT.partial back to it) */
            c->a.resume = 1;
            int status = run_make_graph(c);
            if (status) return status;
        }
        rc = sf_dist_plan(c->graph, w->world, w->rank);
        if (rc != SF_OK) {
            fprintf(stderr, "%s: %s\n", label, sf_last_error());
            return exit_status_of(rc);
        }
        w->resume_state = NULL;
        w->resume_len = 0;
        if (w->rank == 0 && (rc = sf_dist_checkpoint_load(c->graph, &w->resume_state, &w->resume_len)) != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            return 1;
        }
    }
    const int plaintext = sf_topology_get_security(w->topology) == SF_SECURITY_PLAINTEXT;
    sf_rendezvous_config rv = w->rv;
    if (attempt > 0) {
        /* the driver waits --rejoin-timeout for every rank; the others also wait for the driver
         * to see the failure (up to twice its heartbeat timeout) and start serving */
        const int timeout = sf_topology_timeout_ms(w->topology);
        rv.timeout_ms = w->rank == 0 ? w->rejoin_s * 1000 : w->rejoin_s * 1000 + 2 * timeout + 5000;
    }
    const sf_topology_rank *self = sf_topology_rank_get(w->topology, w->rank);
    const sf_model_config *cfg = sf_model_get_config(c->model);
    char options[256];
    snprintf(options, sizeof options, "device=%s precision=%d rejoin=%d", c->opts.device, (int)c->opts.precision,
             c->a.checkpoint_dir && !w->seq.on ? w->rejoin_s : 0);
    sf_hello hello = {.rank = w->rank, .world = w->world, .version = SEQFLOW_VERSION_STRING,
                      .model_hash = sf_model_weights_hash(c->model), .config_hash = sf_hash_model_config(cfg),
                      .pipeline_hash = sf_hash_text(w->seq.on ? seq_text : c->pipeline),
                      .options_hash = sf_hash_text(options),
                      .endpoint = self->endpoint, .host = self->host};
    sf_rendezvous_result *result = NULL;
    rc = w->rank == 0 ? sf_rendezvous_serve(&rv, &hello, payload_of, w, &result) : sf_rendezvous_join(&rv, &hello, &result);
    if (rc != SF_OK && attempt > 0 && w->rank == 0) {
        fprintf(stderr, "seqflow: a lost rank did not come back within --rejoin-timeout %d s (%s); %s\n", w->rejoin_s,
                sf_last_error(), w->lost);
        return 1;
    }
    if (rc != SF_OK && attempt > 0) {
        fprintf(stderr, "%s: could not rejoin the job (%s); the driver's message says why; with --checkpoint, rerun "
                        "every rank with --resume\n", label, sf_last_error());
        return 1;
    }
    if (rc == SF_OK && attempt > 0 && w->rank == 0) {
        uint64_t resumed = sf_graph_checkpoint_resumed(c->graph);
        if (resumed)
            fprintf(stderr, "seqflow: every rank is back (attempt %d); rolling back to checkpoint %" PRIu64 "\n", attempt + 1,
                    resumed);
        else
            fprintf(stderr, "seqflow: every rank is back (attempt %d); no checkpoint yet: starting again from the beginning\n",
                    attempt + 1);
    }
    w->lost[0] = '\0'; /* whatever was lost is back */
    if (rc == SF_OK && !w->seq.on && w->rank != 0 && result->payload_len > 0 && result->payload[0] == 1)
        rc = sf_dist_set_state(c->graph, result->payload + 1, result->payload_len - 1);
    if (rc == SF_OK && w->seq.on && w->rank != 0 && result->payload_len > 1 && result->payload[0] == 1)
        rc = sf_buffer_append(&w->seq_resume, result->payload + 1, result->payload_len - 1);
    sf_rendezvous_result_free(result);
    /* the network: every other rank a peer */
    sf_net_peer *peers = rc == SF_OK ? calloc((size_t)w->world, sizeof *peers) : NULL;
    int n_peers = 0;
    for (int r = 0; rc == SF_OK && peers && r < w->world; r++) {
        const sf_topology_rank *t = sf_topology_rank_get(w->topology, r);
        if (r != w->rank) peers[n_peers++] = (sf_net_peer){r, t->endpoint, plaintext ? NULL : t->public_key, t->host};
    }
    if (rc == SF_OK && !peers) rc = sf_error(SF_E_NOMEM, "out of memory");
    sf_net_options no = {.rank = w->rank, .bind = self->bind ? self->bind : self->endpoint,
                         .secret_key = plaintext ? NULL : w->secret, .public_key = plaintext ? NULL : w->public_key,
                         .plaintext = plaintext, .peers = peers,
                         .n_peers = n_peers, .heartbeat_ms = sf_topology_heartbeat_ms(w->topology),
                         .timeout_ms = sf_topology_timeout_ms(w->topology),
                         .connect_timeout_ms = sf_topology_connect_timeout_ms(w->topology),
                         .linger_ms = sf_topology_linger_ms(w->topology)};
    if (rc == SF_OK) rc = sf_net_create(&no, &w->net);
    free(peers);
    if (rc == SF_OK && !w->seq.on) {
        sf_dist_links links = {net_link, w, net_comm};
        rc = sf_dist_connect(c->graph, &links);
    }
    if (rc != SF_OK) {
        fprintf(stderr, "%s: %s\n", label, sf_last_error());
        return rc == SF_E_PARSE ? 2 : 1;
    }
    *ran = 1;
    return w->seq.on ? seq_run(c, &w->seq, w->net, w->topology, w->rank, w->world, w->seq_resume.data, w->seq_resume.len,
                               label)
                     : run_execute(c);
}

/* Everything after the options were read: returns the exit status. */
static int worker_run(worker *w)
{
    run_ctx *c = &w->run;
    static char label[48]; /* lives as long as the run's messages */
    snprintf(label, sizeof label, "seqflow[rank %d]", w->rank);
    const int quiet = c->a.quiet; /* what the user asked: the other ranks' runs are quiet */
    if (w->rank != 0) {
        c->label = label;
        c->a.quiet = 1;
        c->a.progress = 0;
    } else {
        snprintf(label, sizeof label, "seqflow");
        c->failure_message = driver_message;
        c->user = w;
    }
    int status = 0, rc = SF_OK;
    char seq_text[512] = "";
    if (w->seq.on) {
        /* no graph: every rank reads and writes its own chunks */
        seq_describe(&w->seq, seq_text, sizeof seq_text);
        if ((status = seq_check(c, &w->seq, w->world))) return status;
        if ((rc = run_make_model(&c->a, &c->model)) != SF_OK) {
            fprintf(stderr, "%s: %s\n", label, sf_last_error());
            return exit_status_of(rc);
        }
        if (w->rank == 0 && c->a.resume && c->a.checkpoint_dir &&
            (rc = seq_load_resume(c->a.checkpoint_dir, &w->seq_resume)) != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            return 1;
        }
    } else if ((status = run_prepare(c, w->rank == 0))) {
        return status;
    }
    /* keys and the rendezvous */
    const int plaintext = sf_topology_get_security(w->topology) == SF_SECURITY_PLAINTEXT;
    if (!plaintext) {
        char path[4096];
        run_rank_path(w->key_path, w->rank, path, sizeof path);
        if ((rc = sf_topology_read_key(path, w->secret)) != SF_OK) {
            fprintf(stderr, "%s: %s\n", label, sf_last_error());
            return 1;
        }
    }
    w->rv_keys = calloc((size_t)w->world, sizeof *w->rv_keys);
    w->rv_endpoints = calloc((size_t)w->world, sizeof *w->rv_endpoints);
    rc = w->rv_keys && w->rv_endpoints
             ? sf_rendezvous_config_from_topology(w->topology, w->rank, w->secret, w->public_key, w->rv_keys,
                                                  w->rv_endpoints, &w->rv)
             : sf_error(SF_E_NOMEM, "out of memory");
    sf_launch_overrides ov = {w->rank, w->world, w->local_rank, w->world};
    if (rc == SF_OK && sf_launcher_resolve((const char *const *)environ, &ov, &w->launch) == SF_OK && w->launch.rendezvous[0])
        w->rv.endpoint = w->launch.rendezvous; /* torchrun's MASTER_ADDR:MASTER_PORT */
    if (w->connect_at[0]) w->rv.endpoint = w->connect_at;
    if (rc == SF_OK && w->rank == 0) { /* for the ranks that ask for it (--connect) */
        w->rv.topology_text = w->topology_text;
        w->rv.topology_len = w->topology_len;
    }
    if (rc != SF_OK) {
        fprintf(stderr, "%s: %s\n", label, sf_last_error());
        return 1;
    }
    for (int attempt = 0;; attempt++) {
        int ran = 0;
        status = worker_attempt(w, attempt, label, seq_text, &ran);
        if (!quiet && w->net) { /* what crossed the network: the links' encodings at work */
            sf_net_stats st;
            sf_net_stats_get(w->net, &st);
            fprintf(stderr,
                    "%s: network: sent %" PRIu64 " packets (%" PRIu64 " bytes), received %" PRIu64 " packets (%" PRIu64
                    " bytes); messages %" PRIu64 " bytes out, %" PRIu64 " bytes in\n",
                    label, st.packets_sent, st.packet_bytes_sent, st.packets_received, st.packet_bytes_received,
                    st.bytes_sent, st.bytes_received);
        }
        /* a roll-back needs a run that failed on the network (a rank lost, or a neighbour's
         * abort): a failure of this rank's own (a full disk) would come back every time */
        const int again = status == 1 && ran && rejoin_on(w) &&
                          (w->rank != 0 ? c->run_rc == SF_E_PEER || c->run_rc == SF_E_CLOSED : w->lost[0] != 0);
        if (!again) break;
        if (w->rank != 0)
            fprintf(stderr, "%s: rejoining the job at the rendezvous (--rejoin-timeout %d s)\n", label, w->rejoin_s);
        /* every link and socket of this attempt goes before the next one binds the same endpoints */
        sf_graph_free(c->graph);
        c->graph = NULL;
        sf_net_free(w->net);
        w->net = NULL;
    }
    return status;
}

/* Head parallelism from the topology: a rank whose "devices" lists two or more of the run's
 * kind (["cuda:0", "cuda:1"] for -d cuda, ["cpu:0", "cpu:1"] for a CPU run) splits the heads of
 * its block stages over them, as --gpus N / --cpu-ranks N would (those, given, win). Devices of
 * the other kind are left alone, as a single device is. 0, or 2 with the message printed. */
static int place_heads(run_args *ra, const sf_topology_rank *self, int rank)
{
    if (!self || self->n_devices < 2 || ra->heads_of) return 0;
    const int cuda = ra->device && strcmp(ra->device, "cuda") == 0;
    int matching = 0;
    size_t used = 0;
    for (int i = 0; i < self->n_devices; i++) {
        const char *d = self->devices[i];
        if (cuda && strncmp(d, "cuda:", 5) == 0) {
            matching++;
            int n = snprintf(ra->heads_devices + used, sizeof ra->heads_devices - used, "%s%s", used ? "," : "", d + 5);
            if (n < 0 || (size_t)n >= sizeof ra->heads_devices - used) {
                fprintf(stderr, "seqflow: rank %d: too many devices in the topology\n", rank);
                return 2;
            }
            used += (size_t)n;
        } else if (!cuda && (strcmp(d, "cpu") == 0 || strncmp(d, "cpu:", 4) == 0)) {
            matching++;
        }
    }
    if (matching == 0) {
        ra->heads_devices[0] = 0;
        return 0;
    }
    if (matching != self->n_devices) {
        fprintf(stderr, "seqflow: rank %d: its topology devices mix kinds; head parallelism over them needs every one "
                        "to be %s\n",
                rank, cuda ? "\"cuda:N\"" : "\"cpu\" or \"cpu:N\"");
        return 2;
    }
    if (cuda && ra->device_index_set) {
        fprintf(stderr, "seqflow: rank %d: -d cuda:N and a topology listing %d GPUs for it; give one of them\n", rank,
                matching);
        return 2;
    }
    ra->heads_of = matching;
    ra->heads_on_gpus = cuda;
    return 0;
}

/* The whole file at path, NUL-terminated, into *text and *len. */
static int read_text(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return sf_error(SF_E_IO, "cannot read '%s': %s", path, strerror(errno));
    sf_buffer b = {0};
    char chunk[65536];
    size_t n;
    int rc = SF_OK;
    while (rc == SF_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0) rc = sf_buffer_append(&b, chunk, n);
    if (rc == SF_OK && ferror(f)) rc = sf_error(SF_E_IO, "cannot read '%s': %s", path, strerror(errno));
    if (rc == SF_OK && b.len > SF_TOPOLOGY_MAX_BYTES)
        rc = sf_error(SF_E_PARSE, "%s: larger than %u bytes", path, (unsigned)SF_TOPOLOGY_MAX_BYTES);
    if (rc == SF_OK) rc = sf_buffer_append(&b, "", 1);
    fclose(f);
    if (rc != SF_OK) return sf_buffer_release(&b), rc;
    *text = (char *)b.data;
    *len = b.len - 1;
    return SF_OK;
}

/* A worker without --topology: rank 0's rendezvous (--connect, else the launcher's
 * MASTER_ADDR:MASTER_PORT) hands it the topology, asked for over this rank's key (--key)
 * against rank 0's (--server-key; none: a plaintext job). 0, or the exit status with the
 * message printed. */
static int fetch_topology(worker *w)
{
    sf_launch_info info;
    int rc = sf_launcher_detect((const char *const *)environ, &info);
    if (rc != SF_OK) return fprintf(stderr, "seqflow: %s\n", sf_last_error()), 2;
    const char *at = w->connect ? w->connect : info.rendezvous[0] ? info.rendezvous : NULL;
    const int rank = w->rank >= 0 ? w->rank : info.rank;
    if (!at) {
        fprintf(stderr, "seqflow: worker needs --topology FILE, or --connect ENDPOINT (rank 0's rendezvous, which hands "
                        "the topology out; or MASTER_ADDR and MASTER_PORT)\n");
        return 2;
    }
    if (rank < 1) {
        fprintf(stderr, "seqflow: a worker that asks rank 0 for the topology needs its rank, 1 or more (--rank R or the "
                        "launcher's variables); rank 0 reads the topology file\n");
        return 2;
    }
    snprintf(w->connect_at, sizeof w->connect_at, "%s", at);
    sf_rendezvous_config c = {.endpoint = w->connect_at, .plaintext = !w->server_key};
    if (w->server_key) {
        if (!w->key_path) return fprintf(stderr, "seqflow: rank %d needs its secret key: --key FILE\n", rank), 2;
        char path[4096];
        run_rank_path(w->key_path, rank, path, sizeof path);
        if ((rc = sf_topology_read_key(path, w->secret)) == SF_OK) rc = sf_curve_public_key(w->secret, w->public_key);
        if (rc == SF_OK && strlen(w->server_key) != SF_Z85_KEY_LEN)
            rc = sf_error(SF_E_INVAL, "--server-key: expected rank 0's public key, %d Z85 characters", SF_Z85_KEY_LEN);
        c.server_public_key = w->server_key;
        c.secret_key = w->secret;
        c.public_key = w->public_key;
        if (rc != SF_OK) return fprintf(stderr, "seqflow: %s\n", sf_last_error()), 2;
    }
    char *text = NULL;
    size_t len = 0;
    rc = sf_rendezvous_fetch_topology(&c, rank, &text, &len);
    if (rc == SF_OK) rc = sf_topology_parse(text, len, "the topology from rank 0", &w->topology);
    free(text);
    if (rc != SF_OK) return fprintf(stderr, "seqflow[rank %d]: %s\n", rank, sf_last_error()), 1;
    return 0;
}

int cmd_worker(int argc, char **argv)
{
    worker w = {.rank = -1, .world = -1, .local_rank = -1, .rejoin_s = DEFAULT_REJOIN_SECONDS};
    int status = worker_options(&argc, argv, &w);
    if (status) return status < 0 ? 0 : status;
    int rc = SF_OK;
    if (!w.topology_path) {
        if ((status = fetch_topology(&w))) return status;
    } else if ((rc = read_text(w.topology_path, &w.topology_text, &w.topology_len)) != SF_OK ||
               (rc = sf_topology_parse(w.topology_text, w.topology_len, w.topology_path, &w.topology)) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        free(w.topology_text);
        return 2;
    }
    sf_launch_overrides ov = {w.rank, w.world, w.local_rank, sf_topology_world(w.topology)};
    sf_launch_info info;
    if ((rc = sf_launcher_resolve((const char *const *)environ, &ov, &info)) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        sf_topology_free(w.topology);
        free(w.topology_text);
        return 2;
    }
    w.rank = info.rank;
    w.world = info.world;
    w.local_rank = info.local_rank;
    if (sf_topology_get_security(w.topology) != SF_SECURITY_PLAINTEXT && !w.key_path) {
        fprintf(stderr, "seqflow: rank %d needs its secret key: --key FILE\n", w.rank);
        sf_topology_free(w.topology);
        free(w.topology_text);
        return 2;
    }
    status = run_parse(argc, argv, &w.run, worker_usage);
    run_args *ra = &w.run.a;
    if (status == 0) status = place_heads(ra, sf_topology_rank_get(w.topology, w.rank), w.rank);
    if (status == 0 && ra->device && strcmp(ra->device, "cuda") == 0 && !ra->device_index_set) {
        /* one GPU a rank on a node: the topology's "devices" of this rank, else its local rank */
        const sf_topology_rank *self = sf_topology_rank_get(w.topology, w.rank);
        const char *dev = self && self->n_devices ? self->devices[0] : NULL;
        if (dev && strncmp(dev, "cuda:", 5) == 0) ra->device_index = atoi(dev + 5);
        else if (w.local_rank >= 0) ra->device_index = w.local_rank;
    }
    if (status == 0 && !w.run.a.pipeline && sf_topology_pipeline(w.topology)) w.run.body = sf_topology_pipeline(w.topology);
    if (status == 0) status = worker_run(&w);
    run_ctx_free(&w.run); /* the links first: they belong to the network */
    sf_buffer_release(&w.seq_resume);
    sf_net_free(w.net);
    free(w.rv_keys);
    free(w.rv_endpoints);
    free(w.topology_text);
    memset(w.secret, 0, sizeof w.secret);
    sf_topology_free(w.topology);
    return status < 0 ? 0 : status;
}
