/* `seqflow worker --sequence` (tools/sequence_cli.h): this rank's chunks of the input through
 * stages/block_seq.h, its rows written in place into the shared output file. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/comm.h"
#include "pipeline/comm_net.h"
#include "state/file_io.h"
#include "stages/block_seq.h"
#include "stages/stages.h"
#include "tools/cli_output.h"
#include "tools/sequence_cli.h"
#include "core/process_stats.h"

#define SEQ_CHANNELS 0x5E000000u /* the exchange's channels, far above the graph's stage indices */
#define SEQ_STATE_FILE "sequence.state"

int seq_parse_option(int argc, char **argv, int *i, seq_args *s)
{
    const char *arg = argv[*i];
    if (strcmp(arg, "--federation") == 0 || strcmp(arg, "--balance") == 0) {
        *(arg[2] == 'f' ? &s->federation : &s->balance) = 1;
        return 1;
    }
    if (strcmp(arg, "--sequence") != 0 && strcmp(arg, "--chunks") != 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "seqflow: %s needs a value\n", arg);
        return -2;
    }
    const char *value = argv[++*i];
    if (strcmp(arg, "--sequence") == 0) {
        s->on = 1;
        if (strcmp(value, "scan") == 0) s->handoff = 0;
        else if (strcmp(value, "handoff") == 0) s->handoff = 1;
        else {
            fprintf(stderr, "seqflow: --sequence expects scan or handoff, not '%s'\n", value);
            return -2;
        }
        return 1;
    }
    s->n_chunks = 0;
    for (const char *p = value; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1 << 20 || (*end && *end != ',') || s->n_chunks == SEQ_MAX_RANKS) {
            fprintf(stderr, "seqflow: --chunks expects segments per round, one number or one per rank "
                            "(e.g. 16 or 8,16,16), not '%s'\n", value);
            return -2;
        }
        s->chunks[s->n_chunks++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return 1;
}

void seq_describe(const seq_args *s, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "sequence %s%s%s chunks", s->handoff ? "handoff" : "scan",
                                   s->federation ? " federation" : "", s->balance ? " balance" : "");
    for (int i = 0; i < s->n_chunks && used < size; i++) used += (size_t)snprintf(buf + used, size - used, " %d", s->chunks[i]);
}

int seq_load_resume(const char *dir, sf_buffer *out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, SEQ_STATE_FILE);
    uint8_t *data = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return SF_OK;
    int rc = sf_read_file_alloc(path, (size_t)1 << 34, &data, &len);
    if (rc == SF_OK) rc = sf_buffer_append(out, data, len);
    free(data);
    return rc;
}

/* The input's format: 1 (bytes) or 4 (u32) bytes a token; 0 for another */
static int token_bytes(const char *format)
{
    if (!format || strcmp(format, "bytes") == 0) return 1;
    return strcmp(format, "u32") == 0 ? 4 : 0;
}

static int is_npy(const run_args *a)
{
    if (a->sink_format && strcmp(a->sink_format, "npy") == 0) return 1;
    if (a->sink_format && strcmp(a->sink_format, "auto") != 0) return 0;
    const size_t n = strlen(a->out);
    return n >= 4 && strcmp(a->out + n - 4, ".npy") == 0;
}

int seq_check(const run_ctx *c, const seq_args *s, int world)
{
    const run_args *a = &c->a;
    struct stat st;
    if (!a->input || strcmp(a->input, "-") == 0 || stat(a->input, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "seqflow: --sequence reads its chunks from a file (-i FILE, a regular file on every rank): "
                        "'%s' is not one\n", a->input ? a->input : "-");
        return 2;
    }
    if (!token_bytes(a->format)) {
        fprintf(stderr, "seqflow: --sequence takes input in bytes or u32 (a token's place in the file must be "
                        "known), not %s\n", a->format);
        return 2;
    }
    if (!a->out || strcmp(a->out, "-") == 0 ||
        (a->sink_format && strcmp(a->sink_format, "raw") && strcmp(a->sink_format, "npy") && strcmp(a->sink_format, "auto"))) {
        fprintf(stderr, "seqflow: --sequence writes each rank's rows in place: give -o FILE (raw or .npy)\n");
        return 2;
    }
    if (a->out_dtype && strcmp(a->out_dtype, "f32") != 0) {
        fprintf(stderr, "seqflow: --sequence writes float32 rows (--out-dtype f32)\n");
        return 2;
    }
    if (a->pipeline && strcmp(a->pipeline, DEFAULT_PIPELINE) != 0) {
        fprintf(stderr, "seqflow: --sequence runs the model's own pipeline (%s); drop the pipeline text\n",
                DEFAULT_PIPELINE);
        return 2;
    }
    if (a->device && strcmp(a->device, "cpu") != 0) {
        fprintf(stderr, "seqflow: --sequence runs on the cpu backend for now (not %s)\n", a->device);
        return 2;
    }
    if (s->n_chunks > 1 && s->n_chunks != world) {
        fprintf(stderr, "seqflow: --chunks lists %d ranks; the job has %d\n", s->n_chunks, world);
        return 2;
    }
    return 0;
}

typedef struct seq_file_io {
    int in_fd, out_fd, token_bytes;
    uint64_t header, row_bytes, tokens;
    const run_ctx *c;
    sf_comm *comm;
    sf_seq *seq;
    const seq_args *s;
    int rank, world, saver;
    uint64_t every, rounds_done;
    const char *label;
    double start;
    const sf_topology *topology;
    int *chunk; /* the plan's split, as the next round will have it */
} seq_file_io;

static int read_tokens(void *user, uint64_t pos, size_t n, uint32_t *ids)
{
    seq_file_io *f = user;
    const size_t bytes = n * (size_t)f->token_bytes;
    uint8_t *buf = f->token_bytes == 4 ? (uint8_t *)ids : malloc(bytes);
    if (!buf) return sf_error(SF_E_NOMEM, "out of memory");
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(f->in_fd, buf + got, bytes - got, (off_t)(pos * (uint64_t)f->token_bytes + got));
        if (r <= 0) {
            if (buf != (uint8_t *)ids) free(buf);
            return sf_error(SF_E_IO, "reading tokens %" PRIu64 "..%" PRIu64 " of '%s' failed: %s", pos, pos + n,
                            f->c->a.input, r == 0 ? "the file is shorter than it was" : strerror(errno));
        }
        got += (size_t)r;
    }
    if (f->token_bytes == 1) {
        for (size_t i = n; i-- > 0;) ids[i] = buf[i];
        free(buf);
    }
    return SF_OK;
}

static int write_rows(void *user, uint64_t pos, size_t n, const float *rows)
{
    seq_file_io *f = user;
    const size_t bytes = n * f->row_bytes;
    const uint8_t *p = (const uint8_t *)rows;
    for (size_t done = 0; done < bytes;) {
        ssize_t w = pwrite(f->out_fd, p + done, bytes - done, (off_t)(f->header + pos * f->row_bytes + done));
        if (w <= 0) return sf_error(SF_E_IO, "writing output '%s' failed: %s", f->c->a.out, strerror(errno));
        done += (size_t)w;
    }
    return SF_OK;
}

/* After each round: progress on rank 0; every `every` rounds (and the last) a checkpoint: once
 * every rank has written the round's rows (a collective), the rank holding the state writes it. */
static int round_done(void *user, uint64_t round, uint64_t rounds)
{
    seq_file_io *f = user;
    f->rounds_done = round + 1;
    if (f->rank == 0 && f->c->a.progress) {
        char line[160];
        cli_format_progress(line, sizeof line, (round + 1) * f->tokens / rounds, f->tokens,
                            sf_monotonic_seconds() - f->start, sf_resident_bytes());
        fprintf(stderr, "\r%s", line);
    }
    const char *dir = f->c->a.checkpoint_dir;
    if (!dir || ((round + 1) % f->every && round + 1 != rounds)) return SF_OK;
    float one = 1;
    int rc = sf_comm_all_reduce(f->comm, &one, 1, SF_DTYPE_F32);
    if (rc != SF_OK || f->rank != f->saver) return rc;
    sf_buffer b = {0};
    const uint64_t next = round + 1;
    const uint32_t ranks = (uint32_t)f->world;
    rc = sf_buffer_append(&b, &next, sizeof next);
    if (rc == SF_OK) rc = sf_buffer_append(&b, &ranks, sizeof ranks);
    if (rc == SF_OK) rc = sf_buffer_append(&b, f->chunk, (size_t)f->world * sizeof *f->chunk);
    if (rc == SF_OK) rc = sf_seq_state_save(f->seq, &b);
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, SEQ_STATE_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (rc == SF_OK) rc = sf_write_file_atomic(path, tmp, b.data, b.len, 0600, 1);
    sf_buffer_release(&b);
    return rc;
}

static int link_options(void *user, int peer, sf_link_options *o)
{
    /* the exchange's messages are exact (stages/block_seq.c quantizes what it may itself): the
     * topology's codec, byte shuffle (lossless: the float32 maps compress under lz4/zstd) and
     * window for the pair, never its quantization */
    seq_file_io *f = user;
    sf_topology_link t;
    int rc = sf_topology_link_options(f->topology, f->rank, peer, &t);
    *o = sf_link_options_default();
    if (rc != SF_OK) return rc;
    o->codec = t.codec, o->level = t.level, o->shuffle = t.shuffle;
    o->window_packets = t.window_packets, o->window_bytes = t.window_bytes;
    return SF_OK;
}

int seq_run(run_ctx *c, const seq_args *s, sf_net *net, const sf_topology *topology, int rank, int world,
            const uint8_t *resume, size_t resume_len, const char *label)
{
    const sf_model_config *cfg = sf_model_get_config(c->model);
    seq_file_io f = {.in_fd = -1, .out_fd = -1, .c = c, .s = s, .rank = rank, .world = world, .label = label,
                     .topology = topology};
    f.token_bytes = token_bytes(c->a.format);
    f.row_bytes = (uint64_t)cfg->dim * sizeof(float);
    f.every = c->a.checkpoint_every > 0 ? (uint64_t)c->a.checkpoint_every : 1;
    f.saver = s->handoff ? world - 1 : 0;
    f.start = sf_monotonic_seconds();
    int chunk[SEQ_MAX_RANKS], groups[SEQ_MAX_RANKS];
    /* the split: --chunks, else the topology's "chunk" of each rank, else 16 */
    for (int r = 0; r < world; r++) {
        const int from_topology = sf_topology_rank_get(topology, r)->chunk;
        chunk[r] = s->n_chunks > 1 ? s->chunks[r] : s->n_chunks ? s->chunks[0] : from_topology ? from_topology : 16;
    }
    /* the datacenters, in rank order; the tier between them from the topology's link options */
    sf_seq_options so = {.exchange = s->handoff ? SF_SEQ_HANDOFF : SF_SEQ_SCAN, .group_of = groups,
                         .federation = s->federation, .threads = c->a.threads > 0 ? c->a.threads : 1};
    int rc = SF_OK, dc = 0, gateway = 0;
    for (int r = 0; r < world && rc == SF_OK; r++) {
        const sf_topology_rank *t = sf_topology_rank_get(topology, r);
        if (r > 0 && t->datacenter != sf_topology_rank_get(topology, r - 1)->datacenter) dc++;
        groups[r] = dc;
        if (r > 0 && groups[r] == groups[r - 1] && t->datacenter != sf_topology_rank_get(topology, r - 1)->datacenter)
            rc = sf_error(SF_E_INVAL, "sequence parallelism: the datacenters must hold consecutive ranks");
        if (r > 0 && groups[r] != groups[r - 1]) {
            /* the tier: the quantization of the link between the two datacenters' gateways */
            sf_topology_link l;
            if (sf_topology_link_options(topology, gateway, r, &l) == SF_OK && l.quant != SF_QUANT_F32)
                so.tier = (sf_quant_params){l.quant, l.group > 0 ? l.group : 64};
            gateway = r;
        }
    }
    for (int r = 1; r < world && rc == SF_OK; r++)
        for (int q = 0; q < r; q++)
            if (sf_topology_rank_get(topology, q)->datacenter == sf_topology_rank_get(topology, r)->datacenter &&
                groups[q] != groups[r])
                rc = sf_error(SF_E_INVAL, "sequence parallelism: datacenter of rank %d holds ranks that are not "
                              "consecutive", r);
    /* input and output */
    struct stat st;
    f.in_fd = open(c->a.input, O_RDONLY | O_CLOEXEC);
    if (rc == SF_OK && (f.in_fd < 0 || fstat(f.in_fd, &st) != 0))
        rc = sf_error(SF_E_IO, "cannot open input '%s': %s", c->a.input, strerror(errno));
    if (rc == SF_OK) f.tokens = (uint64_t)st.st_size / (uint64_t)f.token_bytes;
    f.header = is_npy(&c->a) ? SF_NPY_HEADER_BYTES : 0;
    uint64_t first_round = 0;
    sf_backend *be = NULL;
    sf_comm *comm = NULL;
    sf_seq *seq = NULL;
    if (rc == SF_OK && c->a.checkpoint_dir && rank == f.saver && mkdir(c->a.checkpoint_dir, 0700) != 0 && errno != EEXIST)
        rc = sf_error(SF_E_IO, "cannot create the checkpoint folder '%s': %s", c->a.checkpoint_dir, strerror(errno));
    if (rc == SF_OK) rc = sf_backend_create_opts("cpu", &(sf_backend_options){.threads = so.threads}, &be);
    if (rc == SF_OK) rc = sf_comm_net_create(net, rank, world, SEQ_CHANNELS, link_options, &f,
                                             86400000, &comm);
    f.comm = comm;
    if (rc == SF_OK) rc = sf_seq_create(c->model, be, comm, &so, &seq);
    f.seq = seq;
    /* a resume: the round to start at, the split it had, the state (round_done's layout) */
    if (rc == SF_OK && resume && resume_len > 0) {
        uint32_t ranks = 0;
        if (resume_len >= 12) memcpy(&first_round, resume, 8), memcpy(&ranks, resume + 8, 4);
        const size_t head = 12 + (size_t)ranks * sizeof(int);
        if (resume_len < 12 || ranks != (uint32_t)world || resume_len < head)
            rc = sf_error(SF_E_STATE, "the saved sequence state is for %u ranks (or damaged); the job has %d", ranks,
                          world);
        if (rc == SF_OK) memcpy(chunk, resume + 12, (size_t)world * sizeof(int));
        if (rc == SF_OK) rc = sf_seq_state_restore(seq, resume + head, resume_len - head);
    }
    /* rank 0 makes the output (a resume keeps what is there), then every rank opens it; with
     * {rank} in its name every rank makes its own */
    char out[4096];
    run_rank_path(c->a.out, rank, out, sizeof out);
    const int own_file = strstr(c->a.out, "{rank}") != NULL;
    if (rc == SF_OK && (rank == 0 || own_file)) {
        const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (first_round ? 0 : O_TRUNC);
        f.out_fd = open(out, flags, 0644);
        if (f.out_fd < 0) rc = sf_error(SF_E_IO, "cannot create output '%s': %s", c->a.out, strerror(errno));
        const uint64_t size = f.header + f.tokens * f.row_bytes;
        if (rc == SF_OK && ftruncate(f.out_fd, (off_t)size) != 0)
            rc = sf_error(SF_E_IO, "cannot size output '%s' to %" PRIu64 " bytes: %s", c->a.out, size, strerror(errno));
        if (rc == SF_OK && f.header) { /* the sink's header: the same file as a one-process run */
            char header[SF_NPY_HEADER_BYTES];
            sf_npy_header(header, f.tokens, (size_t)cfg->dim, 4);
            if (pwrite(f.out_fd, header, sizeof header, 0) != (ssize_t)sizeof header)
                rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", c->a.out, strerror(errno));
        }
    }
    float one = 1;
    if (rc == SF_OK) rc = sf_comm_all_reduce(comm, &one, 1, SF_DTYPE_F32); /* the output exists */
    if (rc == SF_OK && rank != 0 && !own_file && (f.out_fd = open(out, O_WRONLY | O_CLOEXEC)) < 0)
        rc = sf_error(SF_E_IO, "cannot open output '%s' (every rank writes its rows into it: a shared folder, or "
                      "'{rank}' in the name for a file per rank): %s", c->a.out, strerror(errno));
    f.chunk = chunk;
    sf_seq_plan plan = {f.tokens, cfg->segment, world, chunk, s->balance};
    sf_seq_io io = {read_tokens, write_rows, round_done, &f};
    if (rc == SF_OK) rc = sf_seq_run(seq, c->model, &plan, first_round, &io);
    if (rc == SF_OK && fsync(f.out_fd) != 0) rc = sf_error(SF_E_IO, "writing output '%s' failed: %s", c->a.out, strerror(errno));
    if (rc == SF_OK && rank == 0) rc = sf_comm_all_reduce(comm, &one, 1, SF_DTYPE_F32); /* all written */
    else if (rc == SF_OK) rc = sf_comm_all_reduce(comm, &one, 1, SF_DTYPE_F32);
    const double elapsed = sf_monotonic_seconds() - f.start;
    int status = 0;
    if (rc != SF_OK) {
        fprintf(stderr, "%s%s: %s\n", rank == 0 && c->a.progress ? "\n" : "", label, sf_last_error());
        status = exit_status_of(rc);
    } else if (!c->a.quiet || rank == 0) {
        sf_seq_stats ss;
        sf_seq_stats_get(seq, &ss);
        uint64_t per = 0;
        for (int r = 0; r < world; r++) per += (uint64_t)chunk[r];
        const uint64_t skipped = first_round * per * (uint64_t)cfg->segment;
        const uint64_t done = f.tokens > skipped ? f.tokens - skipped : 0;
        if (rank == 0 && c->a.progress) fputc('\n', stderr);
        if (!c->a.quiet)
            fprintf(stderr,
                    "%s: %" PRIu64 " tokens in %.3f s (%.0f tokens/s) over %d ranks (%s); exchange: %" PRIu64
                    " bytes out, %" PRIu64 " in (across datacenters %" PRIu64 " out, %" PRIu64 " in); waited %.3f s "
                    "(blocked on ranks before %.3f s, after %.3f s), computed %.3f s\n",
                    label, done, elapsed, elapsed > 0 ? done / elapsed : 0, world, s->handoff ? "hand-off" : "scan",
                    ss.sent_within + ss.sent_across, ss.received_within + ss.received_across, ss.sent_across,
                    ss.received_across, ss.exchange_s, ss.blocked_before_s, ss.blocked_after_s, ss.compute_s);
    }
    if (f.in_fd >= 0) close(f.in_fd);
    if (f.out_fd >= 0) close(f.out_fd);
    /* a failed run leaves no output that looks complete, unless a checkpoint can finish it */
    if (status && (rank == 0 || own_file) && !c->a.checkpoint_dir) unlink(out);
    sf_seq_free(seq);
    sf_comm_free(comm);
    sf_backend_free(be);
    return status;
}
