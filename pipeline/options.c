/* Stage options: "key=value" words checked against the class's option table, so a typo in a
 * pipeline string fails when the graph is built rather than being silently ignored. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pipeline/graph_internal.h"

static int parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = 1, 1;
        if (strcasecmp(s, no[i]) == 0) return *out = 0, 1;
    }
    return 0;
}

static int parse_int(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) return 0;
    *out = v;
    return 1;
}

static int parse_float(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* an underflow (ERANGE with a result near zero) is a valid, tiny number */
    if ((errno && !(errno == ERANGE && fabs(v) <= DBL_MIN)) || end == s || *end || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

static int check_value(const sf_stage *st, const sf_option *opt, const char *value)
{
    long long i;
    double f;
    int b;
    int ok = 1;
    const char *want = "";
    switch (opt->type) {
    case SF_OPT_INT: ok = parse_int(value, &i), want = "an integer"; break;
    case SF_OPT_FLOAT: ok = parse_float(value, &f), want = "a number"; break;
    case SF_OPT_BOOL: ok = parse_bool(value, &b), want = "a boolean (1/0, true/false)"; break;
    case SF_OPT_STRING: break;
    }
    if (!ok)
        return sf_error(SF_E_OPTION, "stage '%s': option %s=%s is not %s", st->cls->name,
                        opt->name, value, want);
    return SF_OK;
}

static void append_known_options(const sf_stage_class *cls, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    if (!cls->options || !cls->options[0].name) {
        snprintf(buf, size, "it takes no options");
        return;
    }
    used += (size_t)snprintf(buf, size, "known:");
    for (const sf_option *o = cls->options; o->name && used < size; o++)
        used += (size_t)snprintf(buf + used, size - used, " %s", o->name);
}

/* Copies the next word of *cursor into a new string; quotes ('...' or "...") may enclose
 * spaces. Returns NULL at the end of the text. */
static char *next_word(const char **cursor, int *err)
{
    const char *s = *cursor;
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    if (!*s) return NULL;
    size_t cap = strlen(s) + 1, n = 0;
    char *word = malloc(cap);
    if (!word) return *err = SF_E_NOMEM, NULL;
    char quote = 0;
    while (*s && (quote || (*s != ' ' && *s != '\t' && *s != '\n'))) {
        if (!quote && (*s == '\'' || *s == '"')) quote = *s;
        else if (quote && *s == quote) quote = 0;
        else word[n++] = *s;
        s++;
    }
    word[n] = '\0';
    if (quote) {
        free(word);
        *err = sf_error(SF_E_PARSE, "unterminated quote in options");
        return NULL;
    }
    *cursor = s;
    return word;
}

int sf_stage_options_parse(sf_stage *st, const char *text)
{
    const sf_stage_class *cls = st->cls;
    int n = 0;
    if (cls->options)
        while (cls->options[n].name) n++;
    st->options = calloc((size_t)(n ? n : 1), sizeof *st->options);
    if (!st->options) return sf_error(SF_E_NOMEM, "out of memory");
    st->n_options = n;
    for (int i = 0; i < n; i++) {
        st->options[i].option = &cls->options[i];
        if (cls->options[i].default_value) {
            st->options[i].value = strdup(cls->options[i].default_value);
            if (!st->options[i].value) return sf_error(SF_E_NOMEM, "out of memory");
        }
    }
    if (!text) return SF_OK;
    const char *cursor = text;
    int err = SF_OK;
    char *word;
    while ((word = next_word(&cursor, &err))) {
        char *eq = strchr(word, '=');
        if (!eq || eq == word) {
            err = sf_error(SF_E_OPTION, "stage '%s': expected key=value, got '%s'", cls->name, word);
            free(word);
            return err;
        }
        *eq = '\0';
        int found = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(cls->options[i].name, word) == 0) found = i;
        if (found < 0) {
            char known[256];
            append_known_options(cls, known, sizeof known);
            err = sf_error(SF_E_OPTION, "stage '%s': unknown option '%s' (%s)", cls->name, word, known);
            free(word);
            return err;
        }
        int rc = check_value(st, &cls->options[found], eq + 1);
        if (rc == SF_OK) {
            free(st->options[found].value);
            st->options[found].value = strdup(eq + 1);
            if (!st->options[found].value) rc = sf_error(SF_E_NOMEM, "out of memory");
        }
        free(word);
        if (rc != SF_OK) return rc;
    }
    return err;
}

void sf_stage_options_free(sf_stage *st)
{
    for (int i = 0; i < st->n_options; i++) free(st->options[i].value);
    free(st->options);
    st->options = NULL;
    st->n_options = 0;
}

const char *sf_stage_option(const sf_stage *st, const char *name)
{
    for (int i = 0; i < st->n_options; i++)
        if (strcmp(st->options[i].option->name, name) == 0) return st->options[i].value;
    return NULL;
}

long long sf_stage_option_int(const sf_stage *st, const char *name, long long fallback)
{
    const char *v = sf_stage_option(st, name);
    long long out;
    return v && parse_int(v, &out) ? out : fallback;
}

double sf_stage_option_float(const sf_stage *st, const char *name, double fallback)
{
    const char *v = sf_stage_option(st, name);
    double out;
    return v && parse_float(v, &out) ? out : fallback;
}

int sf_stage_option_bool(const sf_stage *st, const char *name, int fallback)
{
    const char *v = sf_stage_option(st, name);
    int out;
    return v && parse_bool(v, &out) ? out : fallback;
}
