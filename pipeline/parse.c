/* The textual pipeline form: stages separated by '!', each a name followed by key=value
 * options, as in GStreamer's gst-launch. '!' inside quotes is part of a value. A stage may end
 * with a placement, `@R` or `@R1,R2,...`: the ranks of a distributed run that run it. */
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The placement suffix of one stage's text, `@R` or `@R1,R2,...` (blanks allowed around the
 * commas): an unquoted '@' that starts a word. Returns its offset in text[0..len), or len when
 * there is none. */
static size_t find_placement(const char *text, size_t len)
{
    char quote = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (quote) {
            if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (c == '@' && (i == 0 || is_blank(text[i - 1]))) {
            return i;
        }
    }
    return len;
}

/* Parses the ranks after '@' (text[0..len), the '@' excluded) into a new array. Ranks are
 * decimal integers >= 0, each at most once; `offset` is the '@''s byte offset in the pipeline
 * text, for messages. */
static int parse_placement(const char *text, size_t len, int position, size_t offset, int **out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    size_t commas = 0;
    for (size_t i = 0; i < len; i++) commas += text[i] == ',';
    size_t i = 0;
    while (i < len && is_blank(text[i])) i++;
    if (i == len)
        return sf_error(SF_E_PARSE, "stage %d of the pipeline: '@' at byte %zu must be followed by ranks, e.g. @1 or @1,2",
                        position, offset);
    int *ranks = malloc((commas + 1) * sizeof *ranks);
    if (!ranks) return sf_error(SF_E_NOMEM, "out of memory");
    int n = 0;
    for (;;) {
        while (i < len && is_blank(text[i])) i++;
        size_t start = i;
        long value = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9' && value <= SF_GRAPH_MAX_RANK)
            value = value * 10 + (text[i++] - '0');
        if (i == start || value > SF_GRAPH_MAX_RANK || (i < len && text[i] >= '0' && text[i] <= '9')) {
            size_t word = strcspn(text + start, ", \t\n\r");
            if (word > len - start) word = len - start;
            if (word == 0) word = len - start < 1 ? len - start : 1;
            free(ranks);
            if (i == start && start == len)
                return sf_error(SF_E_PARSE, "stage %d of the pipeline: placement '@%.*s' ends with ',': expected a rank",
                                position, (int)len, text);
            return sf_error(SF_E_PARSE,
                            "stage %d of the pipeline: placement '@%.*s': '%.*s' is not a rank (an integer 0..%d)",
                            position, (int)len, text, (int)word, text + start, SF_GRAPH_MAX_RANK);
        }
        for (int k = 0; k < n; k++)
            if (ranks[k] == (int)value) {
                free(ranks);
                return sf_error(SF_E_PARSE, "stage %d of the pipeline: placement '@%.*s' lists rank %ld twice", position,
                                (int)len, text, value);
            }
        ranks[n++] = (int)value;
        while (i < len && is_blank(text[i])) i++;
        if (i == len) break;
        if (text[i] != ',') {
            free(ranks);
            return sf_error(SF_E_PARSE,
                            "stage %d of the pipeline: unexpected '%c' after placement ranks (a placement '@R' or '@R1,R2' ends the stage)",
                            position, text[i]);
        }
        i++;
    }
    *out = ranks;
    *n_out = n;
    return SF_OK;
}

static int add_element(sf_graph *g, const char *begin, size_t len, int position, size_t offset)
{
    while (len && is_blank(*begin)) begin++, len--, offset++;
    while (len && is_blank(begin[len - 1])) len--;
    if (len == 0) return sf_error(SF_E_PARSE, "empty stage at position %d of the pipeline", position);
    size_t at = find_placement(begin, len);
    int *ranks = NULL, n_ranks = 0;
    if (at < len) {
        if (at == 0)
            return sf_error(SF_E_PARSE, "stage %d of the pipeline starts with a placement: the stage name comes first",
                            position);
        int rc = parse_placement(begin + at + 1, len - at - 1, position, offset + at, &ranks, &n_ranks);
        if (rc != SF_OK) return rc;
        len = at;
        while (len && is_blank(begin[len - 1])) len--;
    }
    char *text = strndup(begin, len);
    if (!text) {
        free(ranks);
        return sf_error(SF_E_NOMEM, "out of memory");
    }
    char *options = text + strcspn(text, " \t\n\r");
    if (*options) *options++ = '\0';
    sf_stage *st = NULL;
    int rc = sf_graph_add(g, text, options, &st);
    free(text);
    if (rc != SF_OK) {
        free(ranks);
        return rc;
    }
    st->ranks = ranks;
    st->n_ranks = n_ranks;
    return SF_OK;
}

/* Stages in the text: one more than its unquoted '!'. Counted before any is added, so that a
 * runaway pipeline fails without building anything. */
static int count_stages(const char *pipeline)
{
    int n = 1;
    char quote = 0;
    for (const char *s = pipeline; *s; s++) {
        if (quote) {
            if (*s == quote) quote = 0;
        } else if (*s == '\'' || *s == '"') {
            quote = *s;
        } else if (*s == '!') {
            n++;
        }
    }
    return n;
}

/* A source reads the input and a terminal stage (the sink) swallows it: anywhere else they
 * would leave the stages before or after them without data, and the run would end with no
 * rows instead of an error. Positions count the stages of this text from 1. */
static int check_order(const sf_graph *g, int first)
{
    for (int i = first; i < g->n_stages; i++) {
        const sf_stage_class *cls = g->stages[i]->cls;
        if (i > 0 && cls->generate && !cls->process)
            return sf_error(SF_E_PARSE, "stage %d of the pipeline (%s) reads the input and can only come first",
                            i - first + 1, cls->name);
        if (i + 1 < g->n_stages && cls->terminal)
            return sf_error(SF_E_PARSE, "stage %d of the pipeline (%s) writes the output and can only come last",
                            i - first + 1, cls->name);
    }
    return SF_OK;
}

int sf_graph_parse(sf_graph *g, const char *pipeline)
{
    if (!g || !pipeline) return sf_error(SF_E_INVAL, "sf_graph_parse: NULL argument");
    size_t length = strnlen(pipeline, SF_GRAPH_MAX_PIPELINE_BYTES + 1);
    if (length > SF_GRAPH_MAX_PIPELINE_BYTES)
        return sf_error(SF_E_PARSE, "the pipeline text is longer than %d bytes", SF_GRAPH_MAX_PIPELINE_BYTES);
    const char *p = pipeline;
    while (is_blank(*p)) p++;
    if (!*p) return sf_error(SF_E_PARSE, "empty pipeline");
    int stages = count_stages(pipeline);
    if (stages > SF_GRAPH_MAX_STAGES - g->n_stages)
        return sf_error(SF_E_PARSE, "the pipeline has %d stages; a graph holds at most %d", stages + g->n_stages,
                        SF_GRAPH_MAX_STAGES);
    const int first = g->n_stages;
    const char *start = pipeline;
    char quote = 0;
    int position = 1;
    for (const char *s = pipeline;; s++) {
        if (*s && quote) {
            if (*s == quote) quote = 0;
            continue;
        }
        if (*s == '\'' || *s == '"') {
            quote = *s;
            continue;
        }
        if (*s == '!' || *s == '\0') {
            int rc = add_element(g, start, (size_t)(s - start), position++, (size_t)(start - pipeline));
            if (rc != SF_OK) return rc;
            if (!*s) break;
            start = s + 1;
        }
    }
    if (quote) return sf_error(SF_E_PARSE, "unterminated quote in the pipeline");
    return check_order(g, first);
}

int sf_stage_placement(const sf_stage *st, const int **ranks)
{
    if (ranks) *ranks = st && st->n_ranks ? st->ranks : NULL;
    return st ? st->n_ranks : 0;
}

int sf_graph_first_remote_stage(const sf_graph *g)
{
    for (int i = 0; g && i < g->n_stages; i++) {
        const sf_stage *st = g->stages[i];
        if (st->n_ranks > 1 || (st->n_ranks == 1 && st->ranks[0] != 0)) return i;
    }
    return -1;
}
