/* The textual pipeline form and stage options: every failure names the stage or option. */
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
    CHECK(parse_fails(m, "", SF_E_PARSE, "empty stage"));

    /* bad values of typed options are caught when the graph is built */
    CHECK(parse_fails(m, "block max_streams=1.5", SF_E_OPTION, "max_streams"));
    /* ... and semantic checks at start */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block layers=7"));
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_OPTION);
    CHECKF(strstr(sf_last_error(), "layers=7") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    /* defer_commit takes 0, 1 or 2 (with no side queue, as on the CPU, every one runs in order) */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block defer_commit=3"));
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_OPTION);
    CHECKF(strstr(sf_last_error(), "defer_commit=3") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block defer_commit=0"));
    CHECK_OK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1));
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
