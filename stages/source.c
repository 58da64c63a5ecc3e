/* source: reads token ids from a file, standard input or the built-in text and emits them in
 * chunks. The stream ends (a FINAL packet) at end of input or when the graph is interrupted.
 * With checkpoints on, reads stop at every multiple of the interval (exactly, for bytes and u32
 * input; at the next chunk end for text) and a checkpoint marker follows; the saved state is the
 * input byte offset and the reader's carry, so a resume seeks the input and goes on. The state
 * also holds an XXH3 hash of the bytes consumed so far: a resume hashes the same prefix of its
 * input again and refuses an input that changed there, instead of mixing old state with new
 * tokens. */
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

typedef struct source {
    int fd;
    int owns_fd;
    const uint8_t *builtin; /* when reading the built-in text */
    size_t builtin_len, builtin_at;
    uint8_t *bytes;
    size_t chunk;
    sf_token_reader reader;
    uint64_t stream, position;
    uint64_t streams, span;  /* the input dealt to `streams` streams, span tokens in turn */
    const char *path;
    int done;
    uint64_t consumed;       /* input bytes read so far (the resume offset) */
    uint64_t next_checkpoint; /* position of the next marker (0 = not computed yet) */
    XXH3_state_t *hash;       /* of the bytes consumed so far */
} source;

static const sf_option source_options[] = {
    {.name = "path", .type = SF_OPT_STRING, .default_value = "-",
     .help = "file to read; '-' is standard input, '@builtin' the built-in text"},
    {.name = "format", .type = SF_OPT_STRING, .default_value = "bytes", .choices = "bytes|u32|text",
     .help = "bytes (one token per byte), u32 (little-endian uint32) or text (decimal ids)"},
    {.name = "chunk", .type = SF_OPT_INT, .default_value = "65536", .min = 1, .max = 1 << 26, .unit = "bytes",
     .help = "bytes read per packet"},
    {.name = "stream", .type = SF_OPT_INT, .default_value = "0", .help = "stream id given to the tokens"},
    {.name = "streams", .type = SF_OPT_INT, .default_value = "1", .min = 1, .max = 1 << 20,
     .help = "deal the input to this many streams (ids stream, stream+1, ...), span tokens at a time"},
    {.name = "span", .type = SF_OPT_INT, .default_value = "4096", .min = 1, .max = 1LL << 40, .unit = "tokens",
     .help = "tokens of the input a stream takes in turn when streams > 1"},
    {0}};

static int source_init(sf_stage *st)
{
    source *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, s);
    int rc = sf_token_format_parse(sf_stage_option(st, "format"), &s->reader.format);
    if (rc != SF_OK) return rc;
    s->chunk = (size_t)sf_stage_option_int(st, "chunk");
    s->stream = (uint64_t)sf_stage_option_int(st, "stream");
    s->streams = (uint64_t)sf_stage_option_int(st, "streams");
    s->span = (uint64_t)sf_stage_option_int(st, "span");
    s->path = sf_stage_option(st, "path");
    s->bytes = malloc(s->chunk);
    s->hash = XXH3_createState();
    if (!s->bytes || !s->hash) return sf_error(SF_E_NOMEM, "out of memory");
    XXH3_64bits_reset(s->hash);
    if (strcmp(s->path, "@builtin") == 0) {
        s->builtin = (const uint8_t *)sf_builtin_text();
        s->builtin_len = sf_builtin_text_length();
    } else if (strcmp(s->path, "-") == 0) {
        s->fd = STDIN_FILENO;
    } else {
        /* opening a FIFO waits for its writer; a signal handled meanwhile (without SA_RESTART)
         * is no reason to fail, an interrupt of the run is */
        do s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
        while (s->fd < 0 && errno == EINTR && !sf_stage_interrupted(st));
        if (s->fd < 0) return sf_error(SF_E_IO, "cannot open input '%s': %s", s->path, strerror(errno));
        s->owns_fd = 1;
    }
    return SF_OK;
}

static size_t read_bytes(sf_stage *st, source *s, size_t limit, int *err)
{
    if (s->builtin) {
        size_t n = s->builtin_len - s->builtin_at;
        if (n > limit) n = limit;
        memcpy(s->bytes, s->builtin + s->builtin_at, n);
        s->builtin_at += n;
        return n;
    }
    /* poll with a timeout so an interrupt is seen even while a pipe or terminal is idle and the
     * signal was delivered to another thread */
    struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
    for (;;) {
        if (sf_stage_interrupted(st)) return 0;
        int ready = poll(&pfd, 1, 100);
        if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
        ssize_t n = read(s->fd, s->bytes, limit);
        if (n >= 0) return (size_t)n;
        if (errno == EINTR || errno == EAGAIN) continue;
        *err = sf_error(SF_E_IO, "reading '%s' failed: %s", s->path, strerror(errno));
        return 0;
    }
}

/* Where the input's token `at` goes with several streams: spans of s->span tokens in turn. */
static uint64_t stream_position(const source *s, uint64_t at, uint64_t *stream)
{
    const uint64_t span = at / s->span, round = span / s->streams;
    *stream = s->stream + span % s->streams;
    return round * s->span + at % s->span;
}

/* Cuts p (the input's tokens from s->position) at span boundaries into one packet per piece,
 * each for its stream; a FINAL p ends every stream. Takes ownership of p. */
static int deal(sf_stage *st, source *s, sf_packet *p)
{
    int rc = SF_OK;
    for (size_t i = 0; i < p->n && rc == SF_OK;) {
        const uint64_t at = s->position + i;
        size_t take = (size_t)(s->span - at % s->span);
        if (take > p->n - i) take = p->n - i;
        sf_packet *q = sf_packet_new(SF_PACKET_TOKENS, take, 0);
        if (!q) rc = sf_error(SF_E_NOMEM, "out of memory");
        if (rc != SF_OK) break;
        q->position = stream_position(s, at, &q->stream);
        q->n = take;
        memcpy(q->tokens, p->tokens + i, take * sizeof *q->tokens);
        rc = sf_stage_emit(st, q);
        i += take;
    }
    for (uint64_t k = 0; k < s->streams && rc == SF_OK && (p->flags & SF_PACKET_FINAL); k++) {
        sf_packet *q = sf_packet_new(SF_PACKET_TOKENS, 0, 0);
        if (!q) rc = sf_error(SF_E_NOMEM, "out of memory");
        if (rc != SF_OK) break;
        q->stream = s->stream + k;
        q->flags = SF_PACKET_FINAL;
        rc = sf_stage_emit(st, q);
    }
    sf_packet_free(p);
    return rc;
}

static int source_generate(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (s->done) return 0;
    uint64_t every = sf_stage_checkpoint_every(st);
    size_t limit = s->chunk;
    if (every) {
        if (!s->next_checkpoint) s->next_checkpoint = (s->position / every + 1) * every;
        uint64_t left = s->next_checkpoint - s->position; /* tokens to the next marker, >= 1 */
        uint64_t bytes = s->reader.format == SF_TOKENS_BYTES ? left
                         : s->reader.format == SF_TOKENS_U32 ? left * 4 - s->reader.carry_len
                                                              : limit;
        if (bytes < limit) limit = (size_t)bytes;
    }
    int err = SF_OK;
    size_t got = sf_stage_interrupted(st) ? 0 : read_bytes(st, s, limit, &err);
    if (err != SF_OK) return err;
    s->consumed += got;
    if (got) XXH3_64bits_update(s->hash, s->bytes, got);
    int interrupted = got == 0 && sf_stage_interrupted(st);
    sf_packet *p = sf_packet_new(SF_PACKET_TOKENS, got + 1, 0);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    p->stream = s->stream;
    p->position = s->position;
    size_t n = 0;
    int rc = sf_token_reader_feed(&s->reader, s->bytes, got, p->tokens, &n);
    if (rc == SF_OK && got == 0) {
        rc = sf_token_reader_finish(&s->reader, p->tokens, &n);
        p->flags |= SF_PACKET_FINAL;
        s->done = 1;
    }
    if (rc != SF_OK) {
        sf_packet_free(p);
        return rc;
    }
    p->n = n;
    rc = s->streams > 1 ? deal(st, s, p) : sf_stage_emit(st, p);
    s->position += n;
    if (rc != SF_OK) return rc;
    /* the marker after the FINAL packet records a finished run; an interrupted one gets none,
     * so that a resume goes on from the last marker instead of from the cut-short end */
    if (every && ((!s->done && s->position >= s->next_checkpoint) || (s->done && !interrupted))) {
        s->next_checkpoint = (s->position / every + 1) * every;
        rc = s->done ? sf_stage_emit_final_checkpoint(st) : sf_stage_emit_checkpoint(st);
        if (rc != SF_OK) return rc;
    }
    return s->done ? 0 : 1;
}

/* State: u64 stream, position, consumed bytes, reader offset; u32 carry length, u32 done;
 * 16 carry bytes; u64 XXH3 of the consumed bytes. */
typedef struct source_state {
    uint64_t stream, position, consumed, reader_offset;
    uint32_t carry_len, done;
    uint8_t carry[16];
    uint64_t input_hash;
} source_state;

static int source_save(sf_stage *st, sf_buffer *out)
{
    source *s = sf_stage_priv(st);
    source_state v = {s->stream, s->position, s->consumed, s->reader.offset, (uint32_t)s->reader.carry_len,
                      (uint32_t)s->done, {0}, XXH3_64bits_digest(s->hash)};
    memcpy(v.carry, s->reader.carry, sizeof v.carry);
    return sf_buffer_append(out, &v, sizeof v);
}

/* Hashes the first `bytes` bytes of the input into s->hash (reset first): what a run that
 * consumed them would have hashed. Reads with pread, so the file offset is left alone. */
static int rehash_prefix(source *s, uint64_t bytes)
{
    XXH3_64bits_reset(s->hash);
    if (s->builtin) {
        XXH3_64bits_update(s->hash, s->builtin, (size_t)bytes);
        return SF_OK;
    }
    for (uint64_t at = 0; at < bytes;) {
        size_t want = bytes - at < s->chunk ? (size_t)(bytes - at) : s->chunk;
        ssize_t n = pread(s->fd, s->bytes, want, (off_t)at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return sf_error(SF_E_UNSUPPORTED, "input '%s' cannot be resumed: its first %llu bytes cannot be read again (%s); give the input as a file",
                            strcmp(s->path, "-") == 0 ? "standard input" : s->path, (unsigned long long)bytes, strerror(errno));
        if (n == 0)
            return sf_error(SF_E_STATE, "input '%s' has %llu bytes, fewer than the %llu read before the checkpoint", s->path,
                            (unsigned long long)at, (unsigned long long)bytes);
        XXH3_64bits_update(s->hash, s->bytes, (size_t)n);
        at += (uint64_t)n;
    }
    return SF_OK;
}

static int source_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    source *s = sf_stage_priv(st);
    source_state v;
    if (len != sizeof v) return sf_error(SF_E_STATE, "source state has %zu bytes, expected %zu", len, sizeof v);
    memcpy(&v, data, sizeof v);
    if (v.stream != s->stream || v.carry_len > sizeof v.carry || v.done > 1)
        return sf_error(SF_E_STATE, "source state does not match this source (stream %llu)", (unsigned long long)s->stream);
    if (s->builtin) {
        if (v.consumed > s->builtin_len) return sf_error(SF_E_STATE, "the built-in text is shorter than the checkpoint's offset");
        s->builtin_at = (size_t)v.consumed;
    } else if (!v.done) { /* a finished input needs no seek (it may be a pipe) */
        struct stat sb;
        if (fstat(s->fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < v.consumed)
            return sf_error(SF_E_STATE, "input '%s' has %lld bytes, fewer than the %llu read before the checkpoint",
                            s->path, (long long)sb.st_size, (unsigned long long)v.consumed);
        if (lseek(s->fd, (off_t)v.consumed, SEEK_SET) < 0)
            return sf_error(SF_E_UNSUPPORTED, "input '%s' cannot be resumed: it is not seekable (%s); give the input as a file",
                            strcmp(s->path, "-") == 0 ? "standard input" : s->path, strerror(errno));
    }
    if (!v.done) {
        /* the state continues only the input it was computed from */
        int rc = rehash_prefix(s, v.consumed);
        if (rc != SF_OK) return rc;
        if (XXH3_64bits_digest(s->hash) != v.input_hash)
            return sf_error(SF_E_STATE,
                            "input '%s' changed: its first %llu bytes, read before the checkpoint, are not the same any "
                            "more (XXH3 %016llx, the checkpoint has %016llx); resume with the same input (or start "
                            "without --resume)",
                            s->builtin ? "@builtin" : strcmp(s->path, "-") == 0 ? "standard input" : s->path,
                            (unsigned long long)v.consumed, (unsigned long long)XXH3_64bits_digest(s->hash),
                            (unsigned long long)v.input_hash);
    }
    s->position = v.position;
    s->consumed = v.consumed;
    s->reader.offset = v.reader_offset;
    s->reader.carry_len = v.carry_len;
    memcpy(s->reader.carry, v.carry, sizeof v.carry);
    s->done = (int)v.done;
    s->next_checkpoint = 0;
    return SF_OK;
}

static void source_free(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (!s) return;
    if (s->owns_fd) close(s->fd);
    XXH3_freeState(s->hash);
    free(s->bytes);
    free(s);
}

const sf_stage_class sf_source_stage = {
    .name = "source",
    .help = "read token ids from a file, standard input or the built-in text",
    .options = source_options,
    .init = source_init,
    .generate = source_generate,
    .save = source_save,
    .restore = source_restore,
    .free = source_free,
};
