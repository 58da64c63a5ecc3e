/* The textual pipeline form: stages separated by '!', each a name followed by key=value
 * options, as in GStreamer's gst-launch. '!' inside quotes is part of a value. */
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int add_element(sf_graph *g, const char *begin, size_t len, int position)
{
    while (len && is_blank(*begin)) begin++, len--;
    while (len && is_blank(begin[len - 1])) len--;
    if (len == 0) return sf_error(SF_E_PARSE, "empty stage at position %d of the pipeline", position);
    char *text = strndup(begin, len);
    if (!text) return sf_error(SF_E_NOMEM, "out of memory");
    char *options = text + strcspn(text, " \t\n\r");
    if (*options) *options++ = '\0';
    int rc = sf_graph_add(g, text, options, NULL);
    free(text);
    return rc;
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
            int rc = add_element(g, start, (size_t)(s - start), position++);
            if (rc != SF_OK) return rc;
            if (!*s) break;
            start = s + 1;
        }
    }
    if (quote) return sf_error(SF_E_PARSE, "unterminated quote in the pipeline");
    return check_order(g, first);
}
