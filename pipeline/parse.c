/* The textual pipeline form: stages separated by '!', each a name followed by key=value
 * options, as in GStreamer's gst-launch. '!' inside quotes is part of a value. */
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"

static int add_element(sf_graph *g, const char *begin, size_t len, int position)
{
    while (len && (*begin == ' ' || *begin == '\t' || *begin == '\n')) begin++, len--;
    while (len && (begin[len - 1] == ' ' || begin[len - 1] == '\t' || begin[len - 1] == '\n')) len--;
    if (len == 0) return sf_error(SF_E_PARSE, "empty stage at position %d of the pipeline", position);
    char *text = strndup(begin, len);
    if (!text) return sf_error(SF_E_NOMEM, "out of memory");
    char *options = text + strcspn(text, " \t\n");
    if (*options) *options++ = '\0';
    int rc = sf_graph_add(g, text, options, NULL);
    free(text);
    return rc;
}

int sf_graph_parse(sf_graph *g, const char *pipeline)
{
    if (!g || !pipeline) return sf_error(SF_E_INVAL, "sf_graph_parse: NULL argument");
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
    return SF_OK;
}
