/* source: reads token ids from one or several inputs (files, standard input or the built-in
 * text) and emits them in chunks. Input k of `path=a,b,...` is stream `stream`+k; several inputs
 * are read in turn, one chunk each, so that the order of the packets depends on the inputs alone
 * (never on timing): a run spread over processes emits them in the same order as one process.
 * Each stream ends (a FINAL packet) at the end of its input, every stream when the graph is
 * interrupted. With checkpoints on, reads of each input stop at every multiple of the interval
 * (exactly, for bytes and u32 input; at the next chunk end for text) and, once every input that
 * has not ended is there, a checkpoint marker follows; the saved state is, per input, its byte
 * offset and the reader's carry, so a resume seeks each input and goes on. The state also holds
 * an XXH3 hash of the bytes consumed so far: a resume hashes the same prefix of its input again
 * and refuses an input that changed there, instead of mixing old state with new tokens. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "seqflow/stage.h"
#include "stages/builtin_text.h"
#include "stages/stages.h"
#include "stages/token_reader.h"

/* Inputs one source reads (path=a,b,...): streams beyond this belong in separate sources or
 * processes. */
#define SOURCE_MAX_INPUTS 1024

typedef struct source_input {
    int fd;
    int owns_fd;
    const uint8_t *builtin; /* when reading the built-in text */
    size_t builtin_len, builtin_at;
    sf_token_reader reader;
    uint64_t stream, position;
    char *path;
    int done;
    uint64_t consumed;        /* input bytes read so far (the resume offset) */
    uint64_t next_checkpoint; /* position of the next marker (0 = not computed yet) */
    XXH3_state_t *hash;       /* of the bytes consumed so far */
} source_input;

typedef struct source {
    source_input *in;
    int n_inputs, next; /* next: the input whose turn it is */
    uint8_t *bytes;
    size_t chunk;
    uint64_t turn;      /* tokens an input reads in its turn (0: one chunk) */
    int done;           /* every input has ended */
} source;

static const sf_option source_options[] = {
    {.name = "path", .type = SF_OPT_STRING, .default_value = "-",
     .help = "file to read; '-' is standard input, '@builtin' the built-in text; several inputs separated by "
             "',' are read in turn, one chunk each, input k as stream stream+k"},
    {.name = "format", .type = SF_OPT_STRING, .default_value = "bytes", .choices = "bytes|u32|text",
     .help = "bytes (one token per byte), u32 (little-endian uint32) or text (decimal ids)"},
    {.name = "chunk", .type = SF_OPT_INT, .default_value = "65536", .min = 1, .max = 1 << 26, .unit = "bytes",
     .help = "bytes read per packet"},
    {.name = "stream", .type = SF_OPT_INT, .default_value = "0", .help = "stream id given to the tokens (of the first input)"},
    {.name = "turn", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = 1 << 30, .unit = "tokens",
     .help = "with several inputs, tokens each reads in its turn (0: one chunk); a multiple of the segment length "
             "makes the order of the segments the same whatever the chunk and checkpoint interval (bytes and u32 "
             "input)"},
    {0}};

static const char *input_name(const source_input *in)
{
    return in->builtin ? "@builtin" : strcmp(in->path, "-") == 0 ? "standard input" : in->path;
}

static int open_input(sf_stage *st, source_input *in)
{
    in->hash = XXH3_createState();
    if (!in->hash) return sf_error(SF_E_NOMEM, "out of memory");
    XXH3_64bits_reset(in->hash);
    if (strcmp(in->path, "@builtin") == 0) {
        in->builtin = (const uint8_t *)sf_builtin_text();
        in->builtin_len = sf_builtin_text_length();
    } else if (strcmp(in->path, "-") == 0) {
        in->fd = STDIN_FILENO;
    } else {
        /* opening a FIFO waits for its writer; a signal handled meanwhile (without SA_RESTART)
         * is no reason to fail, an interrupt of the run is */
        do in->fd = open(in->path, O_RDONLY | O_CLOEXEC);
        while (in->fd < 0 && errno == EINTR && !sf_stage_interrupted(st));
        if (in->fd < 0) return sf_error(SF_E_IO, "cannot open input '%s': %s", in->path, strerror(errno));
        in->owns_fd = 1;
    }
    return SF_OK;
}

static int source_init(sf_stage *st)
{
    source *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, s);
    sf_token_format format;
    int rc = sf_token_format_parse(sf_stage_option(st, "format"), &format);
    if (rc != SF_OK) return rc;
    s->chunk = (size_t)sf_stage_option_int(st, "chunk");
    s->turn = (uint64_t)sf_stage_option_int(st, "turn");
    const uint64_t stream = (uint64_t)sf_stage_option_int(st, "stream");
    const char *paths = sf_stage_option(st, "path");
    int n = 1;
    for (const char *c = paths; *c; c++) n += *c == ',';
    if (n > SOURCE_MAX_INPUTS) return sf_error(SF_E_INVAL, "source: %d inputs, at most %d", n, SOURCE_MAX_INPUTS);
    s->in = calloc((size_t)n, sizeof *s->in);
    s->bytes = malloc(s->chunk);
    if (!s->in || !s->bytes) return sf_error(SF_E_NOMEM, "out of memory");
    s->n_inputs = n;
    const char *at = paths;
    for (int k = 0; k < n; k++) {
        const size_t len = strcspn(at, ",");
        source_input *in = &s->in[k];
        in->fd = -1;
        in->reader.format = format;
        in->stream = stream + (uint64_t)k;
        in->path = strndup(at, len);
        if (!in->path) return sf_error(SF_E_NOMEM, "out of memory");
        if (len == 0) return sf_error(SF_E_INVAL, "source: input %d of path= is empty", k + 1);
        for (int j = 0; j < k; j++)
            if (strcmp(s->in[j].path, in->path) == 0 && strcmp(in->path, "@builtin") != 0)
                return sf_error(SF_E_INVAL, "source: input '%s' is given twice", in->path);
        if ((rc = open_input(st, in)) != SF_OK) return rc;
        at += len + (at[len] == ',');
    }
    return SF_OK;
}

static size_t read_bytes(sf_stage *st, source *s, source_input *in, size_t limit, int *err)
{
    if (in->builtin) {
        size_t n = in->builtin_len - in->builtin_at;
        if (n > limit) n = limit;
        memcpy(s->bytes, in->builtin + in->builtin_at, n);
        in->builtin_at += n;
        return n;
    }
    /* poll with a timeout so an interrupt is seen even while a pipe or terminal is idle and the
     * signal was delivered to another thread */
    struct pollfd pfd = {.fd = in->fd, .events = POLLIN};
    for (;;) {
        if (sf_stage_interrupted(st)) return 0;
        int ready = poll(&pfd, 1, 100);
        if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
        ssize_t n = read(in->fd, s->bytes, limit);
        if (n >= 0) return (size_t)n;
        if (errno == EINTR || errno == EAGAIN) continue;
        *err = sf_error(SF_E_IO, "reading '%s' failed: %s", in->path, strerror(errno));
        return 0;
    }
}

/* Whether input `in` waits for the checkpoint marker: it reached its next multiple of the
 * interval (inputs that ended never wait). */
static int at_boundary(const source_input *in, uint64_t every)
{
    return every && !in->done && in->next_checkpoint && in->position >= in->next_checkpoint;
}

/* Bytes of input `in` that hold at most `tokens` more tokens, capped at limit (text: limit, as
 * its token count per byte is unknown). */
static size_t bytes_for(const source_input *in, uint64_t tokens, size_t limit)
{
    const uint64_t bytes = in->reader.format == SF_TOKENS_BYTES ? tokens
                           : in->reader.format == SF_TOKENS_U32 ? tokens * 4 - in->reader.carry_len
                                                                 : limit;
    return bytes < limit ? (size_t)bytes : limit;
}

/* One chunk of input `in`: a TOKENS packet, FINAL at its end (or at an interrupt). Reads stop at
 * the next checkpoint boundary and the end of the input's turn. */
static int read_chunk(sf_stage *st, source *s, source_input *in, uint64_t every)
{
    size_t limit = s->chunk;
    if (every) {
        if (!in->next_checkpoint) in->next_checkpoint = (in->position / every + 1) * every;
        limit = bytes_for(in, in->next_checkpoint - in->position, limit); /* >= 1 token */
    }
    if (s->turn && s->n_inputs > 1 && in->reader.format != SF_TOKENS_TEXT) limit = bytes_for(in, s->turn - in->position % s->turn, limit);
    int err = SF_OK;
    size_t got = sf_stage_interrupted(st) ? 0 : read_bytes(st, s, in, limit, &err);
    if (err != SF_OK) return err;
    in->consumed += got;
    if (got) XXH3_64bits_update(in->hash, s->bytes, got);
    sf_packet *p = sf_packet_new(SF_PACKET_TOKENS, got + 1, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    p->stream = in->stream;
    p->position = in->position;
    size_t n = 0;
    int rc = sf_token_reader_feed(&in->reader, s->bytes, got, p->tokens, &n);
    if (rc == SF_OK && got == 0) {
        rc = sf_token_reader_finish(&in->reader, p->tokens, &n);
        p->flags |= SF_PACKET_FINAL;
        in->done = 1;
    }
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    p->n = n;
    in->position += n;
    return sf_stage_emit(st, p);
}

static int source_generate(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (s->done) return 0;
    const uint64_t every = sf_stage_checkpoint_every(st);
    /* the next input in turn that neither ended nor waits for the marker */
    int k = -1;
    for (int i = 0; i < s->n_inputs && k < 0; i++) {
        const int j = (s->next + i) % s->n_inputs;
        if (!s->in[j].done && !at_boundary(&s->in[j], every)) k = j;
    }
    int rc = SF_OK;
    if (k >= 0) {
        source_input *in = &s->in[k];
        rc = read_chunk(st, s, in, every);
        if (rc != SF_OK) return rc;
        /* the turn passes on after a chunk, or after `turn` tokens, or at the input's end */
        s->next = !s->turn || in->reader.format == SF_TOKENS_TEXT || in->done || in->position % s->turn == 0 || at_boundary(in, every) ? (k + 1) % s->n_inputs : k;
    }
    int live = 0, waiting = 0;
    for (int i = 0; i < s->n_inputs; i++) {
        live += !s->in[i].done;
        waiting += at_boundary(&s->in[i], every);
    }
    s->done = live == 0;
    const int interrupted = sf_stage_interrupted(st);
    /* every input still going is at its boundary: the marker, then each goes on to the next one.
     * The marker after the last FINAL packet records a finished run; an interrupted one gets
     * none, so that a resume goes on from the last marker instead of from the cut-short end */
    if (every && ((live && waiting == live) || (s->done && !interrupted))) {
        for (int i = 0; i < s->n_inputs; i++)
            if (at_boundary(&s->in[i], every)) s->in[i].next_checkpoint = (s->in[i].position / every + 1) * every;
        s->next = 0; /* where a resume from this marker starts too */
        rc = s->done ? sf_stage_emit_final_checkpoint(st) : sf_stage_emit_checkpoint(st);
        if (rc != SF_OK) return rc;
    }
    return s->done ? 0 : 1;
}

/* State, per input in order: u64 stream, position, consumed bytes, reader offset; u32 carry
 * length, u32 done; 16 carry bytes; u64 XXH3 of the consumed bytes. */
typedef struct source_state {
    uint64_t stream, position, consumed, reader_offset;
    uint32_t carry_len, done;
    uint8_t carry[16];
    uint64_t input_hash;
} source_state;

static int source_save(sf_stage *st, sf_buffer *out)
{
    source *s = sf_stage_priv(st);
    for (int k = 0; k < s->n_inputs; k++) {
        const source_input *in = &s->in[k];
        source_state v = {in->stream, in->position, in->consumed, in->reader.offset, (uint32_t)in->reader.carry_len,
                          (uint32_t)in->done, {0}, XXH3_64bits_digest(in->hash)};
        memcpy(v.carry, in->reader.carry, sizeof v.carry);
        int rc = sf_buffer_append(out, &v, sizeof v);
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}

/* Hashes the first `bytes` bytes of the input into in->hash (reset first): what a run that
 * consumed them would have hashed. Reads with pread, so the file offset is left alone. */
static int rehash_prefix(source *s, source_input *in, uint64_t bytes)
{
    XXH3_64bits_reset(in->hash);
    if (in->builtin) {
        XXH3_64bits_update(in->hash, in->builtin, (size_t)bytes);
        return SF_OK;
    }
    for (uint64_t at = 0; at < bytes;) {
        size_t want = bytes - at < s->chunk ? (size_t)(bytes - at) : s->chunk;
        ssize_t n = pread(in->fd, s->bytes, want, (off_t)at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return sf_error(SF_E_UNSUPPORTED, "input '%s' cannot be resumed: its first %llu bytes cannot be read again (%s); give the input as a file",
                            input_name(in), (unsigned long long)bytes, strerror(errno));
        if (n == 0)
            return sf_error(SF_E_STATE, "input '%s' has %llu bytes, fewer than the %llu read before the checkpoint", in->path,
                            (unsigned long long)at, (unsigned long long)bytes);
        XXH3_64bits_update(in->hash, s->bytes, (size_t)n);
        at += (uint64_t)n;
    }
    return SF_OK;
}

static int restore_input(source *s, source_input *in, const source_state *v)
{
    if (v->stream != in->stream || v->carry_len > sizeof v->carry || v->done > 1)
        return sf_error(SF_E_STATE, "source state does not match this source (stream %llu)", (unsigned long long)in->stream);
    if (in->builtin) {
        if (v->consumed > in->builtin_len) return sf_error(SF_E_STATE, "the built-in text is shorter than the checkpoint's offset");
        in->builtin_at = (size_t)v->consumed;
    } else if (!v->done) { /* a finished input needs no seek (it may be a pipe) */
        struct stat sb;
        if (fstat(in->fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < v->consumed)
            return sf_error(SF_E_STATE, "input '%s' has %lld bytes, fewer than the %llu read before the checkpoint",
                            in->path, (long long)sb.st_size, (unsigned long long)v->consumed);
        if (lseek(in->fd, (off_t)v->consumed, SEEK_SET) < 0)
            return sf_error(SF_E_UNSUPPORTED, "input '%s' cannot be resumed: it is not seekable (%s); give the input as a file",
                            input_name(in), strerror(errno));
    }
    if (!v->done) {
        /* the state continues only the input it was computed from */
        int rc = rehash_prefix(s, in, v->consumed);
        if (rc != SF_OK) return rc;
        if (XXH3_64bits_digest(in->hash) != v->input_hash)
            return sf_error(SF_E_STATE,
                            "input '%s' changed: its first %llu bytes, read before the checkpoint, are not the same any "
                            "more (XXH3 %016llx, the checkpoint has %016llx); resume with the same input (or start "
                            "without --resume)",
                            input_name(in), (unsigned long long)v->consumed,
                            (unsigned long long)XXH3_64bits_digest(in->hash), (unsigned long long)v->input_hash);
    }
    in->position = v->position;
    in->consumed = v->consumed;
    in->reader.offset = v->reader_offset;
    in->reader.carry_len = v->carry_len;
    memcpy(in->reader.carry, v->carry, sizeof v->carry);
    in->done = (int)v->done;
    in->next_checkpoint = 0;
    return SF_OK;
}

static int source_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    source *s = sf_stage_priv(st);
    const size_t want = (size_t)s->n_inputs * sizeof(source_state);
    if (len != want)
        return sf_error(SF_E_STATE, "source state has %zu bytes, expected %zu (%d input%s)", len, want, s->n_inputs,
                        s->n_inputs == 1 ? "" : "s");
    int live = 0;
    for (int k = 0; k < s->n_inputs; k++) {
        source_state v;
        memcpy(&v, data + (size_t)k * sizeof v, sizeof v);
        int rc = restore_input(s, &s->in[k], &v);
        if (rc != SF_OK) return rc;
        live += !s->in[k].done;
    }
    s->done = live == 0;
    s->next = 0;
    return SF_OK;
}

static void source_free(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (!s) return;
    for (int k = 0; s->in && k < s->n_inputs; k++) {
        if (s->in[k].owns_fd) close(s->in[k].fd);
        XXH3_freeState(s->in[k].hash);
        free(s->in[k].path);
    }
    free(s->in);
    free(s->bytes);
    free(s);
}

const sf_stage_class sf_source_stage = {
    .name = "source",
    .help = "read token ids from files, standard input or the built-in text (several inputs: one stream each)",
    .options = source_options,
    .init = source_init,
    .generate = source_generate,
    .save = source_save,
    .restore = source_restore,
    .free = source_free,
};
