/* `seqflow serve`: one pipeline, many streams, clients over ZeroMQ (pipeline/serve.h,
 * docs/SERVE.md). Options of its own, then the run options of `seqflow run` (model, device,
 * threads, pipeline), whose graph it builds without source or sink. */
#include "tools/serve_cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/serve.h"
#include "pipeline/topology.h"
#include "tools/cli_output.h"
#include "tools/run_common.h"

#define SERVE_MAX_CLIENT_KEYS 65536

static void serve_usage(FILE *f)
{
    fputs("usage: seqflow serve --bind ENDPOINT (--key FILE --clients FILE | --plaintext) [serve options]\n"
          "                     [run options] [PIPELINE]\n"
          "\n"
          "Holds one pipeline (default \"" DEFAULT_PIPELINE "\", without source or sink) and\n"
          "serves many independent streams to clients over ZeroMQ (DEALER sockets; the protocol is\n"
          "docs/SERVE.md; examples/serve_client.c and seqflow.Client are clients). Rows are\n"
          "computed exactly as `seqflow run` computes them for the same tokens.\n"
          "\n"
          "serve options:\n"
          "  --bind ENDPOINT       where clients connect: tcp://HOST:PORT or ipc://PATH\n"
          "  --key FILE            the server's CURVE secret key (Z85; the file must be mode 0600)\n"
          "  --clients FILE        the admitted clients' CURVE public keys, one Z85 key a line ('# '\n"
          "                        starts a comment line); ZAP refuses every other client\n"
          "  --plaintext           no CURVE: anyone who reaches ENDPOINT is served (ipc, a trusted\n"
          "                        network); refused together with --key/--clients\n"
          "  --http ENDPOINT       GET /health and /metrics (Prometheus) on tcp://HOST:PORT\n"
          "  --idle-timeout S      a client silent this long (no message, no reply to it) is gone:\n"
          "                        its streams are ended and freed (default 30)\n"
          "  --window N            tokens per stream taken but not yet computed (default 65536);\n"
          "                        also bounds one PUSH\n"
          "  --max-credit N        reply messages a stream's client may grant ahead (default 256)\n"
          "  --max-streams N       open streams at most (default 65536)\n"
          "  --send-budget BYTES   rows handed to ZeroMQ and not yet written, all clients together,\n"
          "                        65536..1099511627776 (default: 32 segments of float32 rows, at least\n"
          "                        268435456, 256 MiB; 1 GiB for D=1024, N=8192): at the budget the\n"
          "                        server computes nothing more until they drain (a slow client slows\n"
          "                        the server instead of filling its memory)\n"
          "  --io-threads N        ZeroMQ I/O threads writing the replies, 1..64 (default: the larger of\n"
          "                        min(4, cores) and min(8, cores / 2)); a client's connection is served\n"
          "                        by one of them; as many threads checksum a reply's rows\n"
          "  --frame-bytes BYTES   a ROWS to a protocol-3 client goes in frames of at most this many\n"
          "                        bytes, 4096..1099511627776 (default 1048576, 1 MiB); a size over\n"
          "                        the largest ROWS sends one frame, as to older clients\n"
          "  --shm-budget BYTES    shared memory for clients on this host, all their regions together,\n"
          "                        0..17592186044416 (default: the less of 8 GiB and a quarter of the\n"
          "                        memory; 0: none): a protocol-4 client may MAP a region and take its\n"
          "                        rows there, copied once instead of through the socket\n"
          "  --checkpoint DIR      streams survive a restart: the graph's state and every stream's\n"
          "                        position are saved atomically into DIR (created when missing,\n"
          "                        locked while the server runs), and on start the newest valid\n"
          "                        checkpoint there is loaded; clients RESUME their streams\n"
          "                        (protocol version 2). A damaged or foreign checkpoint is refused\n"
          "  --checkpoint-every S  seconds between checkpoints while streams move, 0.01..3600\n"
          "                        (default 1); one is also written when the server stops\n"
          "run options (as for `seqflow run`; --help of run lists them): -m/--model, -d/--device,\n"
          "  --precision, -t/--threads, --check-finite, -q/-v/--log-level, the model options\n"
          "  (--segment, --branches, ...) and the built-in model's sizes (--dim, --layers, ...).\n"
          "\n"
          "SIGINT, SIGTERM and SIGHUP stop the server (exit 0 after a signal, printing a summary).\n"
          "Exit status: 0 stopped by a signal, 1 runtime error (a socket, the model, the pipeline\n"
          "failed), 2 usage error.\n",
          f);
}

typedef struct serve_args {
    const char *bind, *key, *clients, *http, *checkpoint;
    int plaintext;
    long long window, max_credit, max_streams, send_budget, io_threads, frame_bytes;
    long long shm_budget;            /* -1: the server's default */
    double idle_s, checkpoint_every; /* seconds, 0 = the server's default */
} serve_args;

/* Takes the serve options out of argv, leaving argv[0] and the run options. */
static int serve_options(int *argc, char **argv, serve_args *s)
{
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            serve_usage(stdout);
            return -1;
        }
        if (strcmp(arg, "--plaintext") == 0) {
            s->plaintext = 1;
            continue;
        }
        const char **text = NULL;
        long long *number = NULL, lo = 1, hi = 0;
        double *seconds = NULL, least = 0; /* seconds: fractions allowed, from `least` */
        if (strcmp(arg, "--bind") == 0) text = &s->bind;
        else if (strcmp(arg, "--key") == 0) text = &s->key;
        else if (strcmp(arg, "--clients") == 0) text = &s->clients;
        else if (strcmp(arg, "--http") == 0) text = &s->http;
        else if (strcmp(arg, "--checkpoint") == 0) text = &s->checkpoint;
        else if (strcmp(arg, "--checkpoint-every") == 0) seconds = &s->checkpoint_every, least = 0.01, hi = 3600;
        else if (strcmp(arg, "--idle-timeout") == 0) seconds = &s->idle_s, least = 0.05, hi = 86400;
        else if (strcmp(arg, "--window") == 0) number = &s->window, lo = 16, hi = 1 << 24;
        else if (strcmp(arg, "--max-credit") == 0) number = &s->max_credit, hi = 1 << 20;
        else if (strcmp(arg, "--max-streams") == 0) number = &s->max_streams, hi = 1 << 20;
        else if (strcmp(arg, "--send-budget") == 0) number = &s->send_budget, lo = 1 << 16, hi = 1ll << 40;
        else if (strcmp(arg, "--io-threads") == 0) number = &s->io_threads, hi = 64;
        else if (strcmp(arg, "--frame-bytes") == 0) number = &s->frame_bytes, lo = 4096, hi = 1ll << 40;
        else if (strcmp(arg, "--shm-budget") == 0)
            number = &s->shm_budget, lo = 0, hi = 1ll << 44;
        if (!text && !number && !seconds) {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc) {
            fprintf(stderr, "seqflow: %s needs a value\n", arg);
            return 2;
        }
        const char *value = argv[++i];
        if (text) {
            *text = value;
        } else if (seconds) {
            char *end;
            errno = 0;
            double v = strtod(value, &end);
            if (errno || end == value || *end || !(v >= least && v <= (double)hi)) {
                fprintf(stderr, "seqflow: %s expects seconds in %g..%lld, not '%s'\n", arg, least, hi, value);
                return 2;
            }
            *seconds = v;
        } else if (!parse_int_arg(arg, value, lo, hi, number)) {
            return 2;
        }
    }
    *argc = out;
    argv[out] = NULL;
    return 0;
}

/* The admitted keys: one Z85 key a line, blank lines and '#' comments skipped. */
static int read_client_keys(const char *path, char ***keys, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return sf_error(SF_E_IO, "--clients %s: %s", path, strerror(errno));
    char line[256];
    int rc = SF_OK, lineno = 0, cap = 0;
    while (rc == SF_OK && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line, *e;
        while (*p == ' ' || *p == '\t') p++;
        /* '#' is a Z85 character: a comment is '#' then a blank or the line's end */
        if (p[0] == '#' && (p[1] == ' ' || p[1] == '\t' || p[1] == '\n' || p[1] == '\r' || p[1] == '\0')) continue;
        for (e = p; *e && *e != '\n' && *e != '\r' && *e != ' ' && *e != '\t'; e++) {}
        if (e == p) continue;
        *e = '\0';
        char what[300];
        snprintf(what, sizeof what, "--clients %s line %d", path, lineno);
        if ((rc = sf_z85_key_check(p, what)) != SF_OK) break;
        if (*n == SERVE_MAX_CLIENT_KEYS) {
            rc = sf_error(SF_E_INVAL, "--clients %s: more than %d keys", path, SERVE_MAX_CLIENT_KEYS);
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(*keys, (size_t)cap * sizeof *grown);
            if (!grown) {
                rc = sf_error(SF_E_NOMEM, "out of memory");
                break;
            }
            *keys = grown;
        }
        if (!((*keys)[*n] = strdup(p))) rc = sf_error(SF_E_NOMEM, "out of memory");
        else (*n)++;
    }
    if (rc == SF_OK && ferror(f)) rc = sf_error(SF_E_IO, "--clients %s: read error", path);
    fclose(f);
    if (rc == SF_OK && *n == 0) rc = sf_error(SF_E_INVAL, "--clients %s holds no key: nobody could connect", path);
    return rc;
}

static sf_serve *running;
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
    sf_serve_stop(running);
}

static void log_line(void *user, const char *line)
{
    (void)user;
    cli_log(CLI_LOG_INFO, "%s", line);
}

int cmd_serve(int argc, char **argv)
{
    serve_args sa = {.shm_budget = -1};
    int status = serve_options(&argc, argv, &sa);
    if (status) return status < 0 ? 0 : status;
    if (!sa.bind) {
        fprintf(stderr, "seqflow: serve needs --bind ENDPOINT (tcp://HOST:PORT or ipc://PATH)\n");
        return 2;
    }
    if (sa.plaintext && (sa.key || sa.clients)) {
        fprintf(stderr, "seqflow: --plaintext takes no --key or --clients\n");
        return 2;
    }
    if (!sa.plaintext && (!sa.key || !sa.clients)) {
        fprintf(stderr, "seqflow: serve is CURVE-encrypted: give --key FILE and --clients FILE (or --plaintext)\n");
        return 2;
    }
    run_ctx c = {0};
    c.push = 1;
    status = run_parse(argc, argv, &c, serve_usage);
    if (status) return status < 0 ? 0 : status;
    if (c.a.checkpoint_dir || c.a.resume || c.a.stats_json || c.a.progress == 2) {
        fprintf(stderr, "seqflow: serve takes no --resume (it loads its --checkpoint directory by itself), "
                        "--checkpoint-codec, --stats-json or --progress\n");
        return 2;
    }
    if (sa.checkpoint_every > 0 && !sa.checkpoint) {
        fprintf(stderr, "seqflow: --checkpoint-every needs --checkpoint DIR\n");
        return 2;
    }
    char secret[SF_Z85_KEY_LEN + 1] = "", **keys = NULL;
    int n_keys = 0, rc = SF_OK;
    if (!sa.plaintext) {
        rc = sf_topology_read_key(sa.key, secret);
        if (rc == SF_OK) rc = read_client_keys(sa.clients, &keys, &n_keys);
        if (rc != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            status = 2;
        }
    }
    if (!status) status = run_prepare(&c, 0);
    sf_serve *s = NULL;
    if (!status) {
        sf_serve_options o = {.bind = sa.bind,
                              .http = sa.http,
                              .plaintext = sa.plaintext,
                              .secret_key = sa.plaintext ? NULL : secret,
                              .client_keys = (const char *const *)keys,
                              .n_client_keys = n_keys,
                              .idle_timeout = sa.idle_s,
                              .window = (uint32_t)sa.window,
                              .max_credit = (uint32_t)sa.max_credit,
                              .max_streams = (uint32_t)sa.max_streams,
                              .send_budget = (uint64_t)sa.send_budget,
                              .io_threads = (int)sa.io_threads,
                              .frame_bytes = (uint64_t)sa.frame_bytes,
                              .shm_budget = sa.shm_budget > 0 ? (uint64_t)sa.shm_budget : 0,
                              .no_shm = sa.shm_budget == 0,
                              .checkpoint_dir = sa.checkpoint,
                              .checkpoint_every = sa.checkpoint_every,
                              .log = log_line};
        rc = sf_serve_create(c.graph, sf_model_get_config(c.model), &o, &s);
        if (rc != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            status = rc == SF_E_INVAL ? 2 : 1;
        }
    }
    memset(secret, 0, sizeof secret);
    if (!status) {
        char endpoint[256] = "", http[256] = "";
        sf_serve_endpoint(s, 0, endpoint, sizeof endpoint);
        if (sa.http) sf_serve_endpoint(s, 1, http, sizeof http);
        cli_log(CLI_LOG_INFO, "serving \"%s\" on %s%s%s%s", c.pipeline, endpoint, sa.plaintext ? " (plaintext)" : " (CURVE)",
                sa.http ? "; HTTP on " : "", http);
        running = s;
        run_catch_stop_signals(on_signal);
        rc = sf_serve_run(s);
        sf_serve_stats st;
        sf_serve_get_stats(s, &st);
        if (rc != SF_OK) {
            fprintf(stderr, "seqflow: %s\n", sf_last_error());
            status = 1;
        }
        cli_log(CLI_LOG_INFO, "served %llu tokens in, %llu rows out; %llu streams opened, %llu closed, %llu expired%s%s",
                (unsigned long long)st.tokens_in, (unsigned long long)st.tokens_out,
                (unsigned long long)st.streams_opened, (unsigned long long)st.streams_closed,
                (unsigned long long)st.streams_expired, sa.checkpoint ? "; checkpoints kept" : "",
                stop_signal ? "; stopped by a signal" : "");
        cli_log(CLI_LOG_INFO,
                "replies: at most %.1f MiB in flight (the send budget: %.1f MiB); the loop waited %.3f s "
                "for the budget (or clients' regions)",
                (double)st.send_peak / (1 << 20), (double)st.send_budget / (1 << 20), st.send_wait_seconds);
        if (st.shm_messages)
            cli_log(CLI_LOG_INFO, "%llu ROWS through clients' shared-memory regions",
                    (unsigned long long)st.shm_messages);
        cli_log(CLI_LOG_INFO, "the loop's time: %.3f s in the pipeline, %.3f s encoding replies, %.3f s handing them to "
                "ZeroMQ", st.graph_seconds, st.encode_seconds, st.handover_seconds);
        if (sa.checkpoint)
            cli_log(CLI_LOG_INFO, "%llu checkpoint(s) written in %.3f s, the loop paused %.3f s for them (%llu failed); "
                    "%llu stream(s) restored, %llu resumed",
                    (unsigned long long)st.checkpoints, st.checkpoint_seconds, st.checkpoint_pause_seconds,
                    (unsigned long long)st.checkpoint_failures,
                    (unsigned long long)st.streams_restored, (unsigned long long)st.streams_resumed);
        running = NULL;
    }
    sf_serve_free(s);
    for (int i = 0; i < n_keys; i++) free(keys[i]);
    free(keys);
    run_ctx_free(&c);
    return status;
}
