/* source: reads token ids from a file, standard input or the built-in text and emits them in
 * chunks. The stream ends (a FINAL packet) at end of input or when the graph is interrupted. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const char *path;
    int done;
} source;

static const sf_option source_options[] = {
    {"path", SF_OPT_STRING, "-", "file to read; '-' is standard input, '@builtin' the built-in text"},
    {"format", SF_OPT_STRING, "bytes", "bytes (one token per byte), u32 (little-endian uint32) or text (decimal ids)"},
    {"chunk", SF_OPT_INT, "65536", "bytes read per packet"},
    {"stream", SF_OPT_INT, "0", "stream id given to the tokens"},
    {NULL, 0, NULL, NULL}};

static int source_init(sf_stage *st)
{
    source *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, s);
    int rc = sf_token_format_parse(sf_stage_option(st, "format"), &s->reader.format);
    if (rc != SF_OK) return rc;
    long long chunk = sf_stage_option_int(st, "chunk", 65536);
    if (chunk < 1 || chunk > (1 << 26)) return sf_error(SF_E_OPTION, "chunk=%lld is outside 1..%d", chunk, 1 << 26);
    s->chunk = (size_t)chunk;
    s->stream = (uint64_t)sf_stage_option_int(st, "stream", 0);
    s->path = sf_stage_option(st, "path");
    s->bytes = malloc(s->chunk);
    if (!s->bytes) return sf_error(SF_E_NOMEM, "out of memory");
    if (strcmp(s->path, "@builtin") == 0) {
        s->builtin = (const uint8_t *)sf_builtin_text();
        s->builtin_len = sf_builtin_text_length();
    } else if (strcmp(s->path, "-") == 0) {
        s->fd = STDIN_FILENO;
    } else {
        s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
        if (s->fd < 0) return sf_error(SF_E_IO, "cannot open input '%s': %s", s->path, strerror(errno));
        s->owns_fd = 1;
    }
    return SF_OK;
}

static size_t read_bytes(sf_stage *st, source *s, int *err)
{
    if (s->builtin) {
        size_t n = s->builtin_len - s->builtin_at;
        if (n > s->chunk) n = s->chunk;
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
        ssize_t n = read(s->fd, s->bytes, s->chunk);
        if (n >= 0) return (size_t)n;
        if (errno == EINTR || errno == EAGAIN) continue;
        *err = sf_error(SF_E_IO, "reading '%s' failed: %s", s->path, strerror(errno));
        return 0;
    }
}

static int source_generate(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (s->done) return 0;
    int err = SF_OK;
    size_t got = sf_stage_interrupted(st) ? 0 : read_bytes(st, s, &err);
    if (err != SF_OK) return err;
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
    s->position += n;
    rc = sf_stage_emit(st, p);
    if (rc != SF_OK) return rc;
    return s->done ? 0 : 1;
}

static void source_free(sf_stage *st)
{
    source *s = sf_stage_priv(st);
    if (!s) return;
    if (s->owns_fd) close(s->fd);
    free(s->bytes);
    free(s);
}

const sf_stage_class sf_source_stage = {
    .name = "source",
    .help = "read token ids from a file, standard input or the built-in text",
    .options = source_options,
    .init = source_init,
    .generate = source_generate,
    .free = source_free,
};
