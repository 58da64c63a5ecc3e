/* The textual pipeline form and stage options: every failure names the stage or option. */
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"

static int parse_fails(const sf_model *m, const char *text, int want, const char *mentions)
{
    sf_graph *g;
    if (sf_graph_create(m, NULL, &g) != SF_OK) return 0;
    int rc = sf_graph_parse(g, text);
    int ok = rc == want && strstr(sf_last_error(), mentions) != NULL;
    if (!ok) fprintf(stderr, "  '%s' -> %d '%s'\n", text, rc, sf_last_error());
    sf_graph_free(g);
    return ok;
}

static int pass_process(sf_stage *st, sf_packet *in)
{
    (void)st;
    sf_packet_free(in);
    return SF_OK;
}
static const sf_option eps_options[] = {{"eps", SF_OPT_FLOAT, "1e-6", "a number"}, {NULL, 0, NULL, NULL}};
static const sf_stage_class eps_class = {.name = "test_eps", .help = "a float option", .options = eps_options,
                                         .process = pass_process};

int main(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, 1, &m));

    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source path='/tmp/a b.txt' format=text ! segment ! embed ! block layers=0-1 ! norm ! sink out=x.npy"));
    CHECK(sf_graph_size(g) == 6);
    CHECK(strcmp(sf_stage_name(sf_graph_stage(g, 0)), "source") == 0);
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 0), "path"), "/tmp/a b.txt") == 0);
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 0), "format"), "text") == 0);
    CHECK(sf_stage_option_int(sf_graph_stage(g, 0), "chunk", -1) == 65536); /* default */
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 3), "layers"), "0-1") == 0);
    CHECK(sf_stage_option(sf_graph_stage(g, 5), "out") != NULL);
    CHECK(sf_graph_stage(g, 6) == NULL);
    sf_graph_free(g);

    CHECK(parse_fails(m, "segment ! bogus ! sink", SF_E_STAGE, "bogus"));
    CHECK(parse_fails(m, "segment size=3", SF_E_OPTION, "size"));
    CHECK(parse_fails(m, "segment length=abc", SF_E_OPTION, "length=abc"));
    CHECK(parse_fails(m, "segment ! ! sink", SF_E_PARSE, "empty stage"));
    CHECK(parse_fails(m, "segment lengthX", SF_E_OPTION, "key=value"));
    CHECK(parse_fails(m, "source path='unterminated", SF_E_PARSE, "quote"));
    /* an empty text is an empty pipeline, not an empty first stage */
    CHECK(parse_fails(m, "", SF_E_PARSE, "empty pipeline"));
    CHECK(parse_fails(m, " \t\n", SF_E_PARSE, "empty pipeline"));

    /* a sink or a source in the middle would swallow or starve the rest: refused when parsed,
     * naming the stage's position in the text */
    CHECK(parse_fails(m, "segment ! embed ! sink ! block ! norm", SF_E_PARSE, "stage 3 of the pipeline (sink)"));
    CHECK(parse_fails(m, "sink format=null ! segment", SF_E_PARSE, "stage 1 of the pipeline (sink)"));
    CHECK(parse_fails(m, "segment ! source path=x ! embed", SF_E_PARSE, "stage 2 of the pipeline (source)"));
    CHECK(parse_fails(m, "source ! segment ! sink ! sink", SF_E_PARSE, "stage 3 of the pipeline (sink)"));
    /* a runaway pipeline fails on its size, before a stage is built */
    {
        size_t stages = SF_GRAPH_MAX_STAGES + 1, len = stages * 10 + 1;
        char *many = calloc(1, len);
        for (size_t i = 0; i < stages; i++) strcat(many, i ? " ! norm" : "norm");
        CHECK(parse_fails(m, many, SF_E_PARSE, "at most 256"));
        many[strlen(many) - strlen(" ! norm")] = '\0'; /* exactly the limit parses */
        CHECK_OK(sf_graph_create(m, NULL, &g));
        CHECK_OK(sf_graph_parse(g, many));
        CHECK(sf_graph_size(g) == SF_GRAPH_MAX_STAGES);
        CHECK(sf_graph_add(g, "norm", NULL, NULL) == SF_E_INVAL);
        CHECK(sf_graph_size(g) == SF_GRAPH_MAX_STAGES);
        sf_graph_free(g);
        free(many);
        char *longtext = malloc(SF_GRAPH_MAX_PIPELINE_BYTES + 2);
        memset(longtext, ' ', SF_GRAPH_MAX_PIPELINE_BYTES + 1);
        memcpy(longtext, "segment", 7);
        longtext[SF_GRAPH_MAX_PIPELINE_BYTES + 1] = '\0';
        CHECK(parse_fails(m, longtext, SF_E_PARSE, "longer than 65536 bytes"));
        free(longtext);
    }

    /* bad values of typed options are caught when the graph is built */
    CHECK(parse_fails(m, "block max_streams=1.5", SF_E_OPTION, "max_streams"));
    /* ... and semantic checks at start */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block layers=7"));
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_OPTION);
    CHECKF(strstr(sf_last_error(), "layers=7") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    /* a source in push mode, and a threaded graph without one, are refused */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source ! segment"));
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_PARSE);
    sf_graph_free(g);
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! sink format=null"));
    CHECK(sf_graph_run(g) == SF_E_PARSE);
    sf_graph_free(g);
    /* stages added one by one are checked when the graph starts */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_add(g, "source", "path=@builtin", NULL));
    CHECK_OK(sf_graph_add(g, "sink", "format=null", NULL));
    CHECK_OK(sf_graph_add(g, "segment", NULL, NULL));
    CHECK(sf_graph_run(g) == SF_E_PARSE);
    CHECKF(strstr(sf_last_error(), "stage 2 (sink)") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    /* a valid but tiny number (it underflows a double) is a number, not "not a number" */
    CHECK_OK(sf_register_stage(&eps_class));
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECKF(sf_graph_parse(g, "test_eps eps=1e-320") == SF_OK, "%s", sf_last_error());
    CHECK(sf_stage_option_float(sf_graph_stage(g, 0), "eps", 1.0) < 1e-300);
    sf_graph_free(g);
    CHECK(parse_fails(m, "test_eps eps=1e999", SF_E_OPTION, "eps=1e999"));
    /* unknown device */
    CHECK(sf_graph_create(m, &(sf_graph_options){.device = "tpu"}, &g) == SF_E_BACKEND);
    CHECK(g == NULL);

    /* sf_strerror covers every code */
    for (int code = 0; code >= SF_E_STATE; code--) CHECK(strcmp(sf_strerror(code), "unknown error") != 0);
    CHECK(strcmp(sf_strerror(-999), "unknown error") == 0);
    sf_model_free(m);
    sf_graph_free(NULL);
    sf_model_free(NULL);
    return check_finish("test_parse");
}
