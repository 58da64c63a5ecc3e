/* `seqflow serve` under many concurrent streams (docs/SERVE.md), against the same streams in one
 * `seqflow run` process:
 *
 *   bench_serve --seqflow PATH [--streams N] [--clients C] [--segments S] [--segment N] [--load F]
 *               [--latency-segments L] [--checkpoint SECONDS] [--send-budget BYTES] [--io-threads N]
 *               [--frame-bytes BYTES] [--shm-budget BYTES] [--client-io-threads N] [--protocol 2|3|4]
 *               [--shm BYTES]
 *               [-- server and run options, e.g. --layers 1]
 *
 * --send-budget, --io-threads, --frame-bytes and --shm-budget go to the server alone (`seqflow
 * serve`'s options of those names, docs/SERVE.md); from its summary, the peak of reply
 * bytes in flight, the time its loop waited for that budget and the loop's time in the pipeline,
 * in encoding replies and in handing them over are printed (send_peak_mib, send_wait_s,
 * loop_graph_s, loop_encode_s, loop_handover_s; -1 from a server that does not report them).
 * --checkpoint S starts the server with `--checkpoint DIR --checkpoint-every S` (docs/SERVE.md,
 * "Restarts"): it then keeps every ROWS until acknowledged and writes a checkpoint of every
 * stream every S seconds; the checkpoints written, their time (snapshot to file landed) and the
 * server loop's pause for them (from its summary line), and the newest one's size are printed. The
 * client speaks protocol version 2 either way and acknowledges the rows it has with each CREDIT.
 * It starts `PATH serve --bind ipc://... --plaintext` (with the options after --), connects C
 * DEALER sockets (default min(N, 64); the N streams are spread over them) on one ZeroMQ context
 * of --client-io-threads I/O threads (default: the server's, the larger of min(4, cores) and
 * min(8, cores / 2): the C clients stand for as many client processes), speaks protocol version 3 (a ROWS may come
 * in frames of --frame-bytes; `--protocol 2` stands for an older client, which the server
 * answers with each ROWS encoded whole into one frame) and measures:
 *  - throughput: every stream opens, pushes S segments of random byte tokens (one PUSH per
 *    segment, credit 8) and closes; aggregate committed rows per second from the first OPEN to
 *    the last CLOSED;
 *  - the same N streams through `PATH run -i f1 -i f2 ... --sink-format null` (one process, the
 *    same options): its time from --stats-json (the graph's, without the process's start-up,
 *    which is printed too) and tokens per second;
 *  - latency at F (default 0.5) of the measured throughput: each stream pushes one whole segment
 *    at a time at a fixed interval (phases spread evenly), L segments each (default 4); for each
 *    segment, from its PUSH sent to its ROWS received; p50, p99, worst.
 * --segment N: the tokens of a segment (one PUSH), the model's N (default 256, the built-in
 * model's; 8192 for bench_gpu_pipeline's reference model).
 * --shm BYTES: each client socket MAPs a shared-memory region of BYTES (0: the server's default,
 * two segments of float32 rows and 1 MiB; docs/SERVE.md, "Rows through shared memory"), speaks
 * protocol version 4 and takes its ROWS_AT there: it checks each packet's magic and row count in
 * place and RELEASEs it (a client that uses the rows where they lie). Without --shm: no region.
 * A phase that receives nothing for 60 s ends the benchmark with an error (exit 1).
 * Output: readable lines and one RESULT line of key=value. The server and this process share
 * the machine's cores. */
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "pipeline/serve.h"
#include "pipeline/serve_proto.h"

extern char **environ;

/* the messages are the server's own (pipeline/serve_proto.h); headers are read in place, as a
 * ROWS message longer than the receive buffer arrives cut to it */
#define HEADER SF_SERVE_HEADER_SIZE
/* tokens a segment: the model's N (--segment; 256 is the built-in model's) */
static int seg_tokens = 256;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint8_t *msg; /* HEADER + 4 seg_tokens bytes */
/* --protocol: 2 stands for an older client (ROWS in one frame); 3 by default, 4 with --shm */
static int protocol = 3;

/* a client socket's shared-memory region (--shm), mapped read-only; NULL: none */
typedef struct region {
    const uint8_t *base;
    uint64_t size;
} region;
static region *regions;
static uint64_t shm_rows; /* ROWS_AT taken */

static void send_msg(void *sock, sf_serve_type type, uint64_t stream, uint64_t a, uint64_t b, const uint32_t *tokens)
{
    sf_serve_header_version(msg, protocol, type, stream, a, b);
    size_t len = HEADER;
    if (tokens) {
        for (uint64_t i = 0; i < b; i++)
            msg[HEADER + 4 * i] = (uint8_t)tokens[i], msg[HEADER + 4 * i + 1] = msg[HEADER + 4 * i + 2] = msg[HEADER + 4 * i + 3] = 0;
        len += 4 * b;
    }
    if (zmq_send(sock, msg, len, 0) < 0) {
        fprintf(stderr, "bench_serve: send: %s\n", zmq_strerror(zmq_errno()));
        exit(1);
    }
}

/* The tokens of stream s, segment k: random bytes, the same in both runs. */
static void segment_tokens(uint64_t s, uint64_t k, uint32_t *out)
{
    uint64_t x = (s + 1) * 0x9E3779B97F4A7C15ull ^ (k + 1) * 0xD1B54A32D192ED03ull;
    for (int i = 0; i < seg_tokens; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        out[i] = (uint32_t)(x >> 56);
    }
}

typedef struct stream_state {
    uint64_t pushed_segments, rows, closed;
    double sent_at, next_at;
} stream_state;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A ROWS_AT on client socket c: its packet's envelope checked in place (magic, position, row
 * count: a client that uses the rows where they lie), then RELEASEd. */
static void take_region_rows(void *sock, int c, const uint8_t *buf, long len)
{
    const uint64_t s = get64(buf + 8), a = get64(buf + 16), b = get64(buf + 24);
    const uint64_t pos = get64(buf + HEADER), n = get64(buf + HEADER + 8);
    const uint8_t *packet = regions[c].base ? regions[c].base + pos % regions[c].size : NULL;
    if (!packet || len != HEADER + 16 || memcmp(packet, "SFW1", 4) != 0 || get64(packet + 32) != a ||
        get64(packet + 40) != b) {
        fprintf(stderr, "bench_serve: stream %llu: a ROWS_AT that is not its rows\n", (unsigned long long)s);
        exit(1);
    }
    send_msg(sock, SF_SERVE_RELEASE, 0, pos + n, 0, NULL);
    shm_rows++;
}

/* Receives every message waiting on the sockets (waiting up to wait_ms for the first). Counts
 * rows and closes; stores latencies when lat is given. Returns messages taken. */
static int drain(void **socks, int nclients, zmq_pollitem_t *items, stream_state *st, long wait_ms, double *lat,
                 size_t *nlat, uint64_t *closed, uint8_t *buf, size_t buf_size)
{
    if (zmq_poll(items, nclients, wait_ms) <= 0) return 0;
    int taken = 0;
    for (int c = 0; c < nclients; c++) {
        if (!(items[c].revents & ZMQ_POLLIN)) continue;
        for (;;) {
            long len = sf_serve_recv(socks[c], buf, buf_size, ZMQ_DONTWAIT);
            if (len < 0) break;
            taken++;
            if (len < HEADER) exit(1);
            uint64_t s = get64(buf + 8), a = get64(buf + 16), b = get64(buf + 24);
            switch (buf[5]) {
            case SF_SERVE_ROWS_AT: take_region_rows(socks[c], c, buf, len); /* fall through */
            case SF_SERVE_ROWS:
                st[s].rows += b;
                send_msg(socks[c], SF_SERVE_CREDIT, s, 1, st[s].rows, NULL);
                if (lat && b) lat[(*nlat)++] = now_s() - st[s].sent_at;
                break;
            case SF_SERVE_CLOSED: st[s].closed = 1, (*closed)++; break;
            case SF_SERVE_ERROR:
                fprintf(stderr, "bench_serve: stream %llu: %.*s\n", (unsigned long long)s, (int)b, buf + HEADER);
                exit(1);
            default: (void)a; break;
            }
        }
    }
    return taken;
}

/* A phase that receives nothing for this long is stuck (a client the server dropped waits for
 * replies that never come): the benchmark says so and stops instead of waiting forever. */
#define STALL_SECONDS 60.0

static char serve_err[64]; /* the server's log */

static void check_stall(double last_progress, const char *phase, pid_t server)
{
    if (now_s() - last_progress < STALL_SECONDS) return;
    fprintf(stderr, "bench_serve: the %s phase received nothing for %.0f s: a client was dropped or the server "
                    "stopped; the server's log (%s) ends:\n",
            phase, STALL_SECONDS, serve_err);
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "tail -n 20 %s >&2", serve_err);
    if (system(cmd) != 0) fprintf(stderr, "bench_serve: cannot read %s\n", serve_err);
    exit(1);
}

/* MAP, then the region opened read-only and ATTACHed: its ROWS come as ROWS_AT from here. */
static void map_region(void *sock, uint64_t bytes, region *r)
{
    uint8_t reply[HEADER + SF_SERVE_MAX_TEXT + 1];
    send_msg(sock, SF_SERVE_MAP, 0, bytes, 0, NULL);
    const long len = sf_serve_recv(sock, reply, sizeof reply - 1, 0);
    if (len < HEADER || reply[5] != SF_SERVE_MAPPED || len != HEADER + (long)get64(reply + 24)) {
        fprintf(stderr, "bench_serve: MAP: %.*s\n", len > HEADER ? (int)(len - HEADER) : 0,
                (const char *)reply + HEADER);
        exit(1);
    }
    reply[len] = '\0';
    r->size = get64(reply + 16);
    const int fd = shm_open((const char *)reply + HEADER, O_RDONLY, 0);
    void *base = fd < 0 ? MAP_FAILED : mmap(NULL, (size_t)r->size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (fd >= 0) close(fd);
    if (base == MAP_FAILED) {
        perror("bench_serve: the region");
        exit(1);
    }
    r->base = base;
    send_msg(sock, SF_SERVE_ATTACH, 0, r->size, 0, NULL);
}

int main(int argc, char **argv)
{
    const char *seqflow = NULL;
    int nstreams = 64, nclients = 0, segments = 4, lat_segments = 4;
    double load = 0.5, checkpoint = 0;
    const char *send_budget = NULL, *io_threads = NULL, *frame_bytes = NULL, *shm_budget = NULL;
    int client_io = 0;
    long long shm = -1; /* --shm: bytes of each client's region, -1: none */
    int extra = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) { extra = i + 1; break; }
        if (i + 1 >= argc) break;
        if (strcmp(argv[i], "--seqflow") == 0) seqflow = argv[++i];
        else if (strcmp(argv[i], "--streams") == 0) nstreams = atoi(argv[++i]);
        else if (strcmp(argv[i], "--clients") == 0) nclients = atoi(argv[++i]);
        else if (strcmp(argv[i], "--segments") == 0) segments = atoi(argv[++i]);
        else if (strcmp(argv[i], "--load") == 0) load = atof(argv[++i]);
        else if (strcmp(argv[i], "--latency-segments") == 0) lat_segments = atoi(argv[++i]);
        else if (strcmp(argv[i], "--segment") == 0) seg_tokens = atoi(argv[++i]);
        else if (strcmp(argv[i], "--checkpoint") == 0) checkpoint = atof(argv[++i]);
        else if (strcmp(argv[i], "--send-budget") == 0) send_budget = argv[++i];
        else if (strcmp(argv[i], "--io-threads") == 0) io_threads = argv[++i];
        else if (strcmp(argv[i], "--frame-bytes") == 0) frame_bytes = argv[++i];
        else if (strcmp(argv[i], "--shm-budget") == 0) shm_budget = argv[++i];
        else if (strcmp(argv[i], "--client-io-threads") == 0) client_io = atoi(argv[++i]);
        else if (strcmp(argv[i], "--protocol") == 0) protocol = atoi(argv[++i]);
        else if (strcmp(argv[i], "--shm") == 0)
            shm = atoll(argv[++i]);
    }
    if (shm >= 0) protocol = 4;
    if (!seqflow || nstreams < 1 || segments < 1 || seg_tokens < 1 || seg_tokens > (1 << 20) || protocol < 2 ||
        protocol > SF_SERVE_VERSION) {
        fprintf(stderr,
                "usage: bench_serve --seqflow PATH [--streams N] [--clients C] [--segments S] [--segment N] [--load F] "
                "[--latency-segments L] [--checkpoint SECONDS] [--send-budget BYTES] [--io-threads N] "
                "[--frame-bytes BYTES] [--shm-budget BYTES] [--client-io-threads N] [--protocol 2|3|4] [--shm BYTES] "
                        "[-- options]\n");
        return 2;
    }
    if (nclients <= 0) nclients = nstreams < 64 ? nstreams : 64;
    if (nclients > nstreams) nclients = nstreams;
    int nextra = argc - extra;

    char dir[] = "/tmp/sfbenchXXXXXX", endpoint[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(endpoint, sizeof endpoint, "ipc://%s/s", dir);
    /* the server */
    char **sargv = calloc((size_t)nextra + 24, sizeof *sargv);
    int k = 0;
    sargv[k++] = (char *)seqflow, sargv[k++] = "serve", sargv[k++] = "--bind", sargv[k++] = endpoint;
    sargv[k++] = "--plaintext";
    /* its log goes to a file (serve.err): the summary says the checkpoints' time and the
     * replies' peak in flight, and a stalled run prints the log's end */
    /* the throughput phase pushes all of a stream's segments at once: the server's window
     * (tokens a stream may hold not yet computed, default 65536) must take them */
    char window[32];
    const long long need = (long long)segments * seg_tokens;
    if (need > 65536) {
        if (need > (1 << 24)) {
            fprintf(stderr, "bench_serve: %lld tokens a stream exceed the server's largest window (%d)\n", need, 1 << 24);
            return 2;
        }
        snprintf(window, sizeof window, "%lld", need);
        sargv[k++] = "--window", sargv[k++] = window;
    }
    char ckpt_dir[64], every[32];
    snprintf(serve_err, sizeof serve_err, "%s/serve.err", dir);
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", dir);
    snprintf(every, sizeof every, "%g", checkpoint);
    if (checkpoint > 0)
        sargv[k++] = "--checkpoint", sargv[k++] = ckpt_dir, sargv[k++] = "--checkpoint-every", sargv[k++] = every;
    if (send_budget) sargv[k++] = "--send-budget", sargv[k++] = (char *)send_budget;
    if (io_threads) sargv[k++] = "--io-threads", sargv[k++] = (char *)io_threads;
    if (frame_bytes) sargv[k++] = "--frame-bytes", sargv[k++] = (char *)frame_bytes;
    if (shm_budget) sargv[k++] = "--shm-budget", sargv[k++] = (char *)shm_budget;
    for (int i = 0; i < nextra; i++) sargv[k++] = argv[extra + i];
    pid_t server;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, serve_err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (posix_spawn(&server, seqflow, &fa, NULL, sargv, environ) != 0) return 1;
    posix_spawn_file_actions_destroy(&fa);
    char sock_path[80];
    snprintf(sock_path, sizeof sock_path, "%s/s", dir);
    for (int i = 0; i < 200 && access(sock_path, F_OK) != 0; i++) usleep(20000);

    void *ctx = zmq_ctx_new();
    if (client_io <= 0) client_io = sf_serve_default_io_threads(); /* the server's default */
    if (zmq_ctx_set(ctx, ZMQ_IO_THREADS, client_io) != 0) return 1;
    void **socks = calloc((size_t)nclients, sizeof *socks);
    zmq_pollitem_t *items = calloc((size_t)nclients, sizeof *items);
    for (int c = 0; c < nclients; c++) {
        socks[c] = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(socks[c], ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_connect(socks[c], endpoint) != 0) return 1;
        items[c] = (zmq_pollitem_t){socks[c], 0, ZMQ_POLLIN, 0};
    }
    stream_state *st = calloc((size_t)nstreams, sizeof *st);
    /* a longer message is cut to this (sf_serve_recv): only the header and an error's text are read */
    size_t buf_size = 1 << 22;
    uint8_t *buf = malloc(buf_size);
    msg = malloc(HEADER + 4 * (size_t)seg_tokens);
    uint32_t *tokens = malloc(sizeof *tokens * (size_t)seg_tokens);
    if (!msg || !tokens) return 1;
    regions = calloc((size_t)nclients, sizeof *regions);
    for (int c = 0; shm >= 0 && c < nclients; c++) map_region(socks[c], (uint64_t)shm, &regions[c]);
    uint64_t closed = 0, total = (uint64_t)nstreams * (uint64_t)segments * seg_tokens;

    /* throughput: everything pushed at once (the window holds it), credit 8 a stream */
    double t0 = now_s();
    for (int s = 0; s < nstreams; s++) {
        void *sock = socks[s % nclients];
        send_msg(sock, SF_SERVE_OPEN, (uint64_t)s, 8, 0, NULL);
        for (int g = 0; g < segments; g++) {
            segment_tokens((uint64_t)s, (uint64_t)g, tokens);
            send_msg(sock, SF_SERVE_PUSH, (uint64_t)s, (uint64_t)g * seg_tokens, seg_tokens, tokens);
        }
        send_msg(sock, SF_SERVE_CLOSE, (uint64_t)s, 0, 0, NULL);
    }
    for (double last = now_s(); closed < (uint64_t)nstreams;) {
        if (drain(socks, nclients, items, st, 1000, NULL, NULL, &closed, buf, buf_size) > 0) last = now_s();
        check_stall(last, "throughput", server);
    }
    double serve_s = now_s() - t0;
    uint64_t rows = 0;
    for (int s = 0; s < nstreams; s++) rows += st[s].rows;
    if (rows != total) {
        fprintf(stderr, "bench_serve: %llu rows for %llu tokens\n", (unsigned long long)rows, (unsigned long long)total);
        return 1;
    }
    double serve_rate = (double)total / serve_s;
    printf("serve: %d streams over %d clients, %d segments each: %llu tokens in %.3f s, %.0f tokens/s\n", nstreams,
           nclients, segments, (unsigned long long)total, serve_s, serve_rate);

    /* latency at `load` of that rate: one segment per stream every `interval` seconds */
    double interval = (double)nstreams * seg_tokens / (load * serve_rate);
    size_t cap = (size_t)nstreams * (size_t)lat_segments, nlat = 0;
    double *lat = malloc(cap * sizeof *lat);
    memset(st, 0, (size_t)nstreams * sizeof *st);
    closed = 0;
    uint64_t base = (uint64_t)nstreams; /* fresh stream ids */
    t0 = now_s();
    for (int s = 0; s < nstreams; s++) {
        send_msg(socks[s % nclients], SF_SERVE_OPEN, base + (uint64_t)s, 8, 0, NULL);
        st[s].next_at = t0 + 0.2 + interval * s / nstreams;
    }
    stream_state *lst = st; /* indexed by stream id - base below */
    for (double last = now_s();; check_stall(last, "latency", server)) {
        double t = now_s(), next = 1e300;
        int busy = 0;
        for (int s = 0; s < nstreams; s++) {
            stream_state *x = &lst[s];
            if (x->pushed_segments >= (uint64_t)lat_segments) continue;
            busy = 1;
            if (x->next_at <= t) {
                segment_tokens(base + (uint64_t)s, x->pushed_segments, tokens);
                x->sent_at = now_s();
                send_msg(socks[s % nclients], SF_SERVE_PUSH, base + (uint64_t)s, x->pushed_segments * seg_tokens, seg_tokens, tokens);
                x->pushed_segments++;
                x->next_at += interval;
                last = now_s(); /* a wait between pushes is no stall */
            }
            if (x->pushed_segments < (uint64_t)lat_segments && x->next_at < next) next = x->next_at;
        }
        uint64_t got = 0;
        for (int s = 0; s < nstreams; s++) got += lst[s].rows;
        if (!busy && got >= (uint64_t)nstreams * (uint64_t)lat_segments * seg_tokens) break;
        long wait_ms = busy ? (long)((next - now_s()) * 1000) : 1000;
        if (wait_ms < 0) wait_ms = 0;
        /* rows arrive indexed by their stream id: shift to this phase's array */
        int n = 0;
        if (zmq_poll(items, nclients, wait_ms) > 0) {
            for (int c = 0; c < nclients; c++) {
                if (!(items[c].revents & ZMQ_POLLIN)) continue;
                for (long len; (len = sf_serve_recv(socks[c], buf, buf_size, ZMQ_DONTWAIT)) >= 0;) {
                    n++;
                    last = now_s();
                    uint64_t s = get64(buf + 8) - base, b = get64(buf + 24);
                    if (buf[5] == SF_SERVE_ROWS_AT) take_region_rows(socks[c], c, buf, len);
                    if (buf[5] == SF_SERVE_ROWS || buf[5] == SF_SERVE_ROWS_AT) {
                        lst[s].rows += b;
                        send_msg(socks[c], SF_SERVE_CREDIT, base + s, 1, lst[s].rows, NULL);
                        if (b && nlat < cap) lat[nlat++] = now_s() - lst[s].sent_at;
                    } else if (buf[5] == SF_SERVE_ERROR) {
                        fprintf(stderr, "bench_serve: %.*s\n", (int)b, buf + HEADER);
                        return 1;
                    }
                }
            }
        }
    }
    double lat_s = now_s() - t0;
    qsort(lat, nlat, sizeof *lat, cmp_double);
    double p50 = nlat ? lat[(size_t)(0.5 * (double)(nlat - 1))] : 0, p99 = nlat ? lat[(size_t)(0.99 * (double)(nlat - 1))] : 0,
           worst = nlat ? lat[nlat - 1] : 0;
    printf("latency at %.0f%% load (a segment per stream every %.3f s, %zu segments in %.1f s): p50 %.2f ms, "
           "p99 %.2f ms, worst %.2f ms\n",
           load * 100, interval, nlat, lat_s, p50 * 1e3, p99 * 1e3, worst * 1e3);
    for (int c = 0; c < nclients; c++) zmq_close(socks[c]);
    zmq_ctx_term(ctx);
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    /* from the server's summary: the replies' peak in flight and its wait for the send budget;
     * the checkpoints' time, and the loop's pause for them (the whole of it where the server
     * says nothing of a pause: it wrote on its loop) */
    double send_peak_mib = -1, send_wait_s = -1, ckpt_s = 0, ckpt_pause_s = -1, graph_s_loop = -1, encode_s = -1,
           handover_s = -1;
    FILE *e = fopen(serve_err, "r");
    char line[512];
    while (e && fgets(line, sizeof line, e)) {
        /* the server's push-mode profile, when SEQFLOW_PROFILE=1 asked for one (docs/CUDA.md) */
        if (strstr(line, "seqflow profile") || strncmp(line, "  stage ", 8) == 0 || strstr(line, "device rows to host"))
            printf("server profile: %s", line);
        const char *w = strstr(line, "checkpoint(s) written in ");
        if (w) ckpt_s = strtod(w + strlen("checkpoint(s) written in "), NULL);
        const char *q = strstr(line, "the loop paused ");
        if (q) ckpt_pause_s = strtod(q + strlen("the loop paused "), NULL);
        const char *r = strstr(line, "replies: at most ");
        if (r) send_peak_mib = strtod(r + strlen("replies: at most "), NULL);
        const char *b = strstr(line, "the loop waited ");
        if (b) send_wait_s = strtod(b + strlen("the loop waited "), NULL);
        const char *lt = strstr(line, "the loop's time: ");
        if (lt && sscanf(lt, "the loop's time: %lf s in the pipeline, %lf s encoding replies, %lf s handing", &graph_s_loop,
                         &encode_s, &handover_s) != 3)
            graph_s_loop = encode_s = handover_s = -1;
    }
    if (ckpt_pause_s < 0) ckpt_pause_s = ckpt_s;
    if (e) fclose(e);
    unlink(serve_err);
    printf("server: at most %.1f MiB of replies in flight; its loop waited %.3f s for the send budget "
           "(or the clients' regions)\n",
           send_peak_mib, send_wait_s);
    printf("server: its loop's time: %.3f s in the pipeline, %.3f s encoding replies, %.3f s handing them over\n",
           graph_s_loop, encode_s, handover_s);
    if (shm >= 0) printf("client: %llu ROWS taken through shared memory\n", (unsigned long long)shm_rows);
    /* the checkpoints: the newest one's number (one per write) and size, then away with them */
    unsigned long long ckpt_seq = 0, ckpt_bytes = 0;
    if (checkpoint > 0) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "ls %s | sed -n 's/^ckpt-0*\\([0-9]*\\)\\.sqf$/\\1/p' | sort -n | tail -n 1", ckpt_dir);
        FILE *p = popen(cmd, "r");
        if (p && fscanf(p, "%llu", &ckpt_seq) != 1) ckpt_seq = 0;
        if (p) pclose(p);
        char path[128];
        snprintf(path, sizeof path, "%s/ckpt-%020llu.sqf", ckpt_dir, ckpt_seq);
        FILE *f = fopen(path, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            ckpt_bytes = (unsigned long long)ftell(f);
            fclose(f);
        }
        printf("checkpoints: every %g s, %llu written in %.3f s (%.2f ms each; the loop paused %.3f s, %.2f ms each), the "
               "last (at the stop: the latency phase's streams) %llu bytes\n",
               checkpoint, ckpt_seq, ckpt_s, ckpt_seq ? 1e3 * ckpt_s / (double)ckpt_seq : 0.0, ckpt_pause_s,
               ckpt_seq ? 1e3 * ckpt_pause_s / (double)ckpt_seq : 0.0, ckpt_bytes);
        snprintf(cmd, sizeof cmd, "rm -rf %s", ckpt_dir);
        if (system(cmd) != 0) fprintf(stderr, "bench_serve: cannot remove %s\n", ckpt_dir);
    }

    /* the same streams in one `seqflow run` process */
    char **rargv = calloc((size_t)nextra + 2 * (size_t)nstreams + 8, sizeof *rargv);
    char **paths = calloc((size_t)nstreams, sizeof *paths);
    k = 0;
    rargv[k++] = (char *)seqflow, rargv[k++] = "run", rargv[k++] = "-q", rargv[k++] = "--sink-format";
    rargv[k++] = "null";
    char stats[96];
    snprintf(stats, sizeof stats, "%s/stats.json", dir);
    rargv[k++] = "--stats-json", rargv[k++] = stats;
    for (int s = 0; s < nstreams; s++) {
        if (asprintf(&paths[s], "%s/in%d", dir, s) < 0) return 1;
        FILE *f = fopen(paths[s], "wb");
        uint8_t *bytes = malloc((size_t)seg_tokens);
        if (!bytes) return 1;
        for (int g = 0; g < segments; g++) {
            segment_tokens((uint64_t)s, (uint64_t)g, tokens);
            for (int i = 0; i < seg_tokens; i++) bytes[i] = (uint8_t)tokens[i];
            fwrite(bytes, 1, seg_tokens, f);
        }
        free(bytes);
        fclose(f);
        rargv[k++] = "-i", rargv[k++] = paths[s];
    }
    for (int i = 0; i < nextra; i++) rargv[k++] = argv[extra + i];
    pid_t run;
    t0 = now_s();
    if (posix_spawn(&run, seqflow, NULL, NULL, rargv, environ) != 0) return 1;
    int status = 0;
    waitpid(run, &status, 0);
    double run_s = now_s() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "bench_serve: seqflow run failed\n");
        return 1;
    }
    /* the run's own time (--stats-json "seconds": the graph, without the process's start-up) */
    double graph_s = run_s;
    FILE *f = fopen(stats, "r");
    if (f) {
        char text[4096];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        const char *p = strstr(text, "\"seconds\":");
        if (p) graph_s = strtod(p + 10, NULL);
        fclose(f);
        unlink(stats);
    }
    double run_rate = (double)total / graph_s;
    printf("run:   the same streams in one process: %.3f s (%.3f s with start-up), %.0f tokens/s; serve/run %.2f\n",
           graph_s, run_s, run_rate, serve_rate / run_rate);
    printf("RESULT streams=%d clients=%d segments=%d tokens=%llu serve_s=%.4f serve_tps=%.0f run_s=%.4f run_tps=%.0f "
           "run_wall_s=%.4f ratio=%.3f load=%.2f lat_n=%zu p50_ms=%.3f p99_ms=%.3f worst_ms=%.3f checkpoint_s=%g "
           "checkpoints=%llu ckpt_total_s=%.4f ckpt_pause_s=%.4f ckpt_bytes=%llu send_peak_mib=%.1f send_wait_s=%.3f "
           "frame_bytes=%s client_io_threads=%d protocol=%d loop_graph_s=%.3f loop_encode_s=%.3f loop_handover_s=%.3f "
           "shm=%lld shm_rows=%llu\n",
           nstreams, nclients, segments, (unsigned long long)total, serve_s, serve_rate, graph_s, run_rate, run_s,
           serve_rate / run_rate, load, nlat, p50 * 1e3, p99 * 1e3, worst * 1e3, checkpoint, ckpt_seq, ckpt_s,
           ckpt_pause_s, ckpt_bytes, send_peak_mib, send_wait_s, frame_bytes ? frame_bytes : "default", client_io,
           protocol, graph_s_loop, encode_s, handover_s, shm, (unsigned long long)shm_rows);
    for (int s = 0; s < nstreams; s++) unlink(paths[s]), free(paths[s]);
    unlink(sock_path);
    rmdir(dir);
    for (int c = 0; c < nclients; c++)
        if (regions[c].base) munmap((void *)regions[c].base, (size_t)regions[c].size);
    free(regions);
    free(paths), free(rargv), free(sargv), free(lat), free(st), free(buf), free(socks), free(items);
    return 0;
}
