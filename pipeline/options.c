/* Stage options: "key=value" words checked against the class's option table (name, type, range
 * or choices: check_value), so a typo or an out-of-range value in a pipeline string fails when
 * the graph is built, naming what is accepted, rather than being ignored or found by one stage's
 * init; the table's defaults fill in what the pipeline leaves out. This file is also where the
 * pipeline reads the environment, and only here: the option rows' environment defaults and the
 * graph's SEQFLOW_PROFILE. */
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

/* Whether value is one of the '|'-separated choices. */
static int is_choice(const char *choices, const char *value)
{
    size_t len = strlen(value);
    for (const char *c = choices;;) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        if (n == len && strncmp(c, value, n) == 0) return 1;
        if (!bar) return 0;
        c = bar + 1;
    }
}

static int has_range(const sf_option *opt)
{
    return (opt->type == SF_OPT_INT || opt->type == SF_OPT_FLOAT) && opt->min != opt->max;
}

const char *sf_option_format_range(const sf_option *opt, char *buf, size_t size)
{
    if (!size) return buf;
    buf[0] = '\0';
    const char *unit = opt->unit ? opt->unit : "";
    const char *space = *unit ? " " : "";
    if (has_range(opt)) {
        if (isinf(opt->max) && isinf(opt->min)) snprintf(buf, size, "any%s%s", space, unit);
        else if (isinf(opt->max)) snprintf(buf, size, ">= %.15g%s%s", opt->min, space, unit);
        else if (isinf(opt->min)) snprintf(buf, size, "<= %.15g%s%s", opt->max, space, unit);
        else snprintf(buf, size, "%.15g..%.15g%s%s", opt->min, opt->max, space, unit);
    } else if (opt->type == SF_OPT_STRING && opt->choices) {
        snprintf(buf, size, "%s", opt->choices);
    } else {
        snprintf(buf, size, "%s", unit);
    }
    return buf;
}

/* The one check of an option value against its row: type, then range or choices. The message
 * names the stage, the option, the value and what is accepted. */
static int check_value(const sf_stage_class *cls, const sf_option *opt, const char *value, const char *what)
{
    long long i = 0;
    double f = 0;
    int b, ok = 1;
    const char *want = "";
    switch (opt->type) {
    case SF_OPT_INT: ok = parse_int(value, &i), f = (double)i, want = "an integer"; break;
    case SF_OPT_FLOAT: ok = parse_float(value, &f), want = "a number"; break;
    case SF_OPT_BOOL: ok = parse_bool(value, &b), want = "a boolean (1/0, true/false)"; break;
    case SF_OPT_STRING: break;
    default:
        return sf_error(SF_E_OPTION, "stage '%s': option %s has no known type (%d)", cls->name, opt->name,
                        (int)opt->type);
    }
    if (!ok)
        return sf_error(SF_E_OPTION, "stage '%s': %s %s=%s is not %s", cls->name, what, opt->name, value, want);
    char range[128];
    if (has_range(opt) && (f < opt->min || f > opt->max))
        return sf_error(SF_E_OPTION, "stage '%s': %s %s=%s %s %s", cls->name, what, opt->name, value,
                        isinf(opt->min) || isinf(opt->max) ? "must be" : "is outside",
                        sf_option_format_range(opt, range, sizeof range));
    if (opt->type == SF_OPT_STRING && opt->choices && !is_choice(opt->choices, value))
        return sf_error(SF_E_OPTION, "stage '%s': %s %s=%s is not one of %s", cls->name, what, opt->name, value,
                        opt->choices);
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

static int parse_given(sf_stage *st, const char *text);

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
        const sf_option *row = &cls->options[i];
        st->options[i].option = row;
        if (row->default_value) {
            /* a default the row itself refuses is a bug in the class: say so at once */
            int rc = check_value(cls, row, row->default_value, "the default of option");
            if (rc != SF_OK) return rc;
        }
        if (row->default_value) {
            st->options[i].value = strdup(row->default_value);
            if (!st->options[i].value) return sf_error(SF_E_NOMEM, "out of memory");
        }
    }
    int rc = text ? parse_given(st, text) : SF_OK;
    /* the environment's defaults, read here only, once per stage, for options the pipeline did
     * not give (a given value wins and its variable is never read) */
    for (int i = 0; rc == SF_OK && i < n; i++) {
        const sf_option *row = &cls->options[i];
        const char *env = row->env && !st->options[i].given ? getenv(row->env) : NULL;
        if (!env || !*env) continue;
        char what[96];
        snprintf(what, sizeof what, "%s sets option", row->env);
        rc = check_value(cls, row, env, what);
        if (rc != SF_OK) break;
        free(st->options[i].value);
        st->options[i].value = strdup(env);
        if (!st->options[i].value) rc = sf_error(SF_E_NOMEM, "out of memory");
    }
    return rc;
}

/* Reads the pipeline's key=value words into st's options (checked against their rows). */
static int parse_given(sf_stage *st, const char *text)
{
    const sf_stage_class *cls = st->cls;
    const int n = st->n_options;
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
        int rc = check_value(cls, &cls->options[found], eq + 1, "option");
        if (rc == SF_OK) {
            free(st->options[found].value);
            st->options[found].value = strdup(eq + 1);
            st->options[found].given = 1;
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

static const sf_option_value *find_value(const sf_stage *st, const char *name)
{
    for (int i = 0; i < st->n_options; i++)
        if (strcmp(st->options[i].option->name, name) == 0) return &st->options[i];
    return NULL;
}

const char *sf_stage_option(const sf_stage *st, const char *name)
{
    const sf_option_value *v = find_value(st, name);
    return v ? v->value : NULL;
}

int sf_stage_option_given(const sf_stage *st, const char *name)
{
    const sf_option_value *v = find_value(st, name);
    return v && v->given;
}

/* The typed readers parse again what check_value accepted, so they cannot fail on a value of
 * the right type; the value of an option of another type reads as 0. */
long long sf_stage_option_int(const sf_stage *st, const char *name)
{
    const sf_option_value *v = find_value(st, name);
    long long out;
    return v && v->value && v->option->type == SF_OPT_INT && parse_int(v->value, &out) ? out : 0;
}

double sf_stage_option_float(const sf_stage *st, const char *name)
{
    const sf_option_value *v = find_value(st, name);
    double out;
    return v && v->value && v->option->type == SF_OPT_FLOAT && parse_float(v->value, &out) ? out : 0.0;
}

int sf_stage_option_bool(const sf_stage *st, const char *name)
{
    const sf_option_value *v = find_value(st, name);
    int out;
    return v && v->value && v->option->type == SF_OPT_BOOL && parse_bool(v->value, &out) ? out : 0;
}

int sf_graph_profile_wanted(void)
{
    const char *profile = getenv("SEQFLOW_PROFILE");
    return profile && *profile && strcmp(profile, "0") != 0;
}
