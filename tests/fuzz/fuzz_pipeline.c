/* Fuzzes the textual pipeline form (sf_graph_parse, pipeline/parse.c) and stage options
 * (pipeline/options.c). Input: the pipeline text (up to its first NUL). Stages are only added,
 * never initialized, so no file is opened. Besides the built-in stages, a stage "fuzzopts"
 * with one option of every type (ranged numbers, a choice) is registered, since no built-in
 * takes floats. A pipeline that parses must have one stage per unquoted '!' plus one, and every
 * option value it accepted must read back through the typed reader within the row's range or
 * choices, and every placement (`@R1,R2`) must hold distinct ranks in 0..SF_GRAPH_MAX_RANK. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"
#include "seqflow/error.h"
#include "seqflow/graph.h"
#include "seqflow/stage.h"

#include "tests/fuzz/fuzz_support.h"

static int fuzzopts_process(sf_stage *st, sf_packet *in)
{
    (void)st;
    (void)in;
    return SF_OK;
}

static const sf_option fuzzopts_options[] = {
    {.name = "i", .type = SF_OPT_INT, .default_value = "7", .min = -1000, .max = 1000, .help = "an integer"},
    {.name = "f", .type = SF_OPT_FLOAT, .default_value = "0.5", .min = -1, .max = INFINITY, .help = "a number"},
    {.name = "b", .type = SF_OPT_BOOL, .default_value = "true", .help = "a boolean"},
    {.name = "s", .type = SF_OPT_STRING, .help = "a string without a default"},
    {.name = "c", .type = SF_OPT_STRING, .default_value = "x", .choices = "x|yy|zzz", .help = "a choice"},
    {0},
};

static const sf_stage_class fuzzopts_class = {
    .name = "fuzzopts",
    .help = "every option type, for the pipeline fuzzer",
    .options = fuzzopts_options,
    .process = fuzzopts_process,
};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    FUZZ_CHECK(sf_register_stage(&fuzzopts_class) == SF_OK);
    return 0;
}

/* Stages the parser must produce: '!' outside quotes separates them. */
static int expected_stages(const char *text)
{
    int n = 1;
    char quote = 0;
    for (const char *s = text; *s; s++) {
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

static int in_range(const sf_option *opt, double v)
{
    return opt->min == opt->max || (v >= opt->min && v <= opt->max);
}

/* Every value the graph kept passed the table's check: the typed reader returns it, within the
 * row's range, and a choice is one of the row's. */
static void check_options(const sf_stage *st)
{
    for (int i = 0; i < st->n_options; i++) {
        const sf_option *opt = st->options[i].option;
        const char *value = sf_stage_option(st, opt->name);
        FUZZ_CHECK(value == st->options[i].value);
        if (!value) {
            FUZZ_CHECK(opt->default_value == NULL);
            continue;
        }
        char *end = NULL;
        switch (opt->type) {
        case SF_OPT_INT: {
            long long a = sf_stage_option_int(st, opt->name);
            FUZZ_CHECK(a == strtoll(value, &end, 10) && end != value && !*end && in_range(opt, (double)a));
            break;
        }
        case SF_OPT_FLOAT: {
            double a = sf_stage_option_float(st, opt->name);
            FUZZ_CHECK(isfinite(a) && a == strtod(value, &end) && end != value && !*end && in_range(opt, a));
            break;
        }
        case SF_OPT_BOOL: {
            int a = sf_stage_option_bool(st, opt->name);
            FUZZ_CHECK(a == 0 || a == 1);
            break;
        }
        case SF_OPT_STRING:
            if (opt->choices) {
                const char *at = strstr(opt->choices, value);
                size_t n = strlen(value);
                FUZZ_CHECK(n && at && (at == opt->choices || at[-1] == '|') && (at[n] == '|' || !at[n]));
            }
            break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    FUZZ_CHECK(text);
    memcpy(text, data, size);
    text[size] = '\0';

    sf_graph *g = NULL;
    FUZZ_CHECK(sf_graph_create(NULL, NULL, &g) == SF_OK);
    sf_clear_error();
    int rc = sf_graph_parse(g, text);
    FUZZ_CHECK(rc == SF_OK || rc == SF_E_PARSE || rc == SF_E_STAGE || rc == SF_E_OPTION);
    if (rc == SF_OK) {
        FUZZ_CHECK(sf_graph_size(g) == expected_stages(text));
        for (int i = 0; i < sf_graph_size(g); i++) {
            check_options(sf_graph_stage(g, i));
            const int *ranks;
            int n = sf_stage_placement(sf_graph_stage(g, i), &ranks);
            for (int a = 0; a < n; a++) {
                FUZZ_CHECK(ranks[a] >= 0 && ranks[a] <= SF_GRAPH_MAX_RANK);
                for (int b = 0; b < a; b++) FUZZ_CHECK(ranks[a] != ranks[b]);
            }
        }
    } else {
        FUZZ_CHECK(sf_last_error()[0] != '\0');
    }
    sf_graph_free(g);
    free(text);
    return 0;
}
