/* segment: cuts each stream into segments of N tokens at positions 0, N, 2N, ... (SPEC 1).
 * A FLUSH emits the pending partial segment provisionally; the end of a stream emits it as
 * the final (committing) segment, followed by nothing else for that stream. */
#include <stdlib.h>
#include <string.h>

#include "seqflow/stage.h"
#include "stages/stages.h"
#include "stages/stream_table.h"

typedef struct pending {
    uint64_t segment; /* index of the segment being filled */
    size_t n;
    uint32_t tokens[];
} pending;

typedef struct segmenter {
    size_t length;
    sf_stream_table streams;
} segmenter;

static const sf_option segment_options[] = {
    {.name = "length", .type = SF_OPT_INT, .default_value = "0", .min = 0, .max = 1 << 24, .unit = "tokens",
     .help = "segment length N; 0 takes the model's"},
    {.name = "max_streams", .type = SF_OPT_INT, .default_value = "1024", .min = 1, .max = 1 << 20, .unit = "streams",
     .help = "streams that may be open at once"},
    {0}};

static void *pending_create(void *ctx, uint64_t stream)
{
    segmenter *s = ctx;
    (void)stream;
    pending *p = calloc(1, sizeof *p + s->length * sizeof(uint32_t));
    if (!p) sf_error(SF_E_NOMEM, "out of memory");
    return p;
}

static void pending_destroy(void *ctx, void *state)
{
    (void)ctx;
    free(state);
}

static int segment_init(sf_stage *st)
{
    segmenter *s = calloc(1, sizeof *s);
    if (!s) return sf_error(SF_E_NOMEM, "out of memory");
    sf_stage_set_priv(st, s);
    long long length = sf_stage_option_int(st, "length");
    const sf_model *m = sf_stage_model(st);
    /* a model's segment is within the option's range (model/config.c caps it the same) */
    if (length == 0 && m) length = sf_model_get_config(m)->segment;
    if (length == 0) return sf_error(SF_E_OPTION, "segment length=0 takes the model's, and the graph has none: give length=");
    s->length = (size_t)length;
    sf_stream_table_init(&s->streams, (int)sf_stage_option_int(st, "max_streams"), pending_create, pending_destroy, s);
    return SF_OK;
}

static int emit_segment(sf_stage *st, segmenter *s, uint64_t stream, pending *p, uint32_t flags)
{
    sf_packet *out = sf_packet_new(SF_PACKET_SEGMENT, p->n ? p->n : 1, 0);
    if (!out) return sf_error(SF_E_NOMEM, "out of memory");
    out->stream = stream;
    out->segment = p->segment;
    out->position = p->segment * s->length;
    out->n = p->n;
    out->flags = flags;
    if (p->n) memcpy(out->tokens, p->tokens, p->n * sizeof *p->tokens);
    return sf_stage_emit(st, out);
}

static int segment_process(sf_stage *st, sf_packet *in)
{
    segmenter *s = sf_stage_priv(st);
    int rc = SF_OK;
    if (in->kind != SF_PACKET_TOKENS && in->kind != SF_PACKET_FLUSH) {
        sf_packet_free(in);
        return sf_error(SF_E_INVAL, "segment takes token packets");
    }
    pending *p = sf_stream_table_get(&s->streams, in->stream);
    if (!p) {
        sf_packet_free(in);
        return SF_E_NOMEM;
    }
    for (size_t i = 0; i < in->n && rc == SF_OK;) {
        size_t take = s->length - p->n;
        if (take > in->n - i) take = in->n - i;
        memcpy(p->tokens + p->n, in->tokens + i, take * sizeof *p->tokens);
        p->n += take;
        i += take;
        if (p->n == s->length) {
            rc = emit_segment(st, s, in->stream, p, 0);
            p->segment++;
            p->n = 0;
        }
    }
    if (rc == SF_OK && in->kind == SF_PACKET_FLUSH && p->n)
        rc = emit_segment(st, s, in->stream, p, SF_PACKET_PROVISIONAL);
    if (rc == SF_OK && (in->flags & SF_PACKET_FINAL)) {
        rc = emit_segment(st, s, in->stream, p, SF_PACKET_FINAL);
        sf_stream_table_remove(&s->streams, in->stream);
    }
    sf_packet_free(in);
    return rc;
}

/* State: u32 count, then per stream u64 id, u64 segment, u64 n, n x u32 tokens. */
static int segment_save(sf_stage *st, sf_buffer *out)
{
    segmenter *s = sf_stage_priv(st);
    uint32_t count = (uint32_t)s->streams.count;
    int rc = sf_buffer_append(out, &count, sizeof count);
    for (int i = 0; i < s->streams.count && rc == SF_OK; i++) {
        pending *p = s->streams.states[i];
        uint64_t head[3] = {s->streams.ids[i], p->segment, p->n};
        rc = sf_buffer_append(out, head, sizeof head);
        if (rc == SF_OK) rc = sf_buffer_append(out, p->tokens, p->n * sizeof *p->tokens);
    }
    return rc;
}

static int segment_restore(sf_stage *st, const uint8_t *data, size_t len)
{
    segmenter *s = sf_stage_priv(st);
    uint32_t count;
    if (len < 4) return sf_error(SF_E_STATE, "segment state is truncated");
    memcpy(&count, data, 4);
    size_t at = 4;
    sf_stream_table_clear(&s->streams);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t head[3];
        if (len - at < sizeof head) return sf_error(SF_E_STATE, "segment state is truncated");
        memcpy(head, data + at, sizeof head);
        at += sizeof head;
        if (head[2] >= s->length || (len - at) / 4 < head[2])
            return sf_error(SF_E_STATE, "segment state of stream %llu is invalid", (unsigned long long)head[0]);
        pending *p = sf_stream_table_get(&s->streams, head[0]);
        if (!p) return SF_E_NOMEM;
        p->segment = head[1];
        p->n = (size_t)head[2];
        memcpy(p->tokens, data + at, p->n * 4);
        at += p->n * 4;
    }
    return at == len ? SF_OK : sf_error(SF_E_STATE, "segment state has trailing bytes");
}

static void segment_free(sf_stage *st)
{
    segmenter *s = sf_stage_priv(st);
    if (!s) return;
    sf_stream_table_clear(&s->streams);
    free(s);
}

const sf_stage_class sf_segment_stage = {
    .name = "segment",
    .help = "cut token streams into segments of N (partial segments on flush and at the end)",
    .options = segment_options,
    .init = segment_init,
    .process = segment_process,
    .save = segment_save,
    .restore = segment_restore,
    .free = segment_free,
};
