/* Placement suffixes in the pipeline text (`block layers=0-1 @1`, `@1,2`): stored on the stage,
 * validated with messages naming the stage, and refused by a single-process run unless every
 * placement is rank 0. */
#include <stdlib.h>
#include <string.h>

#include "pipeline/graph_internal.h"
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

/* The placement of stage i as "r,r,..." ("" for none). */
static const char *placement_of(const sf_graph *g, int i)
{
    static char buf[128];
    const int *ranks;
    int n = sf_stage_placement(sf_graph_stage(g, i), &ranks);
    buf[0] = '\0';
    for (int k = 0; k < n; k++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%d", k ? "," : "", ranks[k]);
    return buf;
}

static void check_stored(const sf_model *m)
{
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed @0 ! block layers=0-1 @1 ! block layers=2-3 @2, 3 ,4 ! norm @12"));
    CHECK(sf_graph_size(g) == 5);
    CHECK(strcmp(placement_of(g, 0), "") == 0);
    CHECK(strcmp(placement_of(g, 1), "0") == 0);
    CHECK(strcmp(placement_of(g, 2), "1") == 0);
    CHECK(strcmp(placement_of(g, 3), "2,3,4") == 0);
    CHECK(strcmp(placement_of(g, 4), "12") == 0);
    /* the placement is not an option: the options before it are intact */
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 2), "layers"), "0-1") == 0);
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 3), "layers"), "2-3") == 0);
    CHECK(sf_graph_first_remote_stage(g) == 2);
    const int *ranks = (const int *)1;
    CHECK(sf_stage_placement(sf_graph_stage(g, 0), &ranks) == 0 && ranks == NULL);
    sf_graph_free(g);

    /* '@' inside a quoted value or in the middle of a word is not a placement */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source path='/tmp/a @1' ! segment ! sink out=x@2.npy"));
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 0), "path"), "/tmp/a @1") == 0);
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 2), "out"), "x@2.npy") == 0);
    CHECK(strcmp(placement_of(g, 0), "") == 0 && strcmp(placement_of(g, 2), "") == 0);
    CHECK(sf_graph_first_remote_stage(g) == -1);
    sf_graph_free(g);
}

static void check_refused(const sf_model *m)
{
    /* '@' without ranks names the stage and the byte where it stands */
    CHECK(parse_fails(m, "segment ! block @", SF_E_PARSE, "stage 2 of the pipeline: '@' at byte 16 must be followed by ranks"));
    CHECK(parse_fails(m, "segment ! block @ ! norm", SF_E_PARSE, "stage 2 of the pipeline: '@' at byte 16"));
    CHECK(parse_fails(m, "segment @-1", SF_E_PARSE, "'-1' is not a rank"));
    CHECK(parse_fails(m, "segment @x", SF_E_PARSE, "'x' is not a rank"));
    CHECK(parse_fails(m, "segment @1.5", SF_E_PARSE, "unexpected '.'"));
    CHECK(parse_fails(m, "segment @99999999999", SF_E_PARSE, "'99999999999' is not a rank (an integer 0..1048575)"));
    CHECK(parse_fails(m, "segment @1,", SF_E_PARSE, "ends with ','"));
    CHECK(parse_fails(m, "segment @1,,2", SF_E_PARSE, "',' is not a rank"));
    CHECK(parse_fails(m, "segment ! block @1,2,1", SF_E_PARSE, "stage 2 of the pipeline: placement '@1,2,1' lists rank 1 twice"));
    CHECK(parse_fails(m, "segment ! block @1 layers=0-1", SF_E_PARSE, "unexpected 'l' after placement ranks"));
    CHECK(parse_fails(m, "segment ! @1", SF_E_PARSE, "stage 2 of the pipeline starts with a placement"));
    /* a failed stage leaves nothing behind (no leak under ASan) */
    CHECK(parse_fails(m, "segment ! bogus @1", SF_E_STAGE, "bogus"));
    CHECK(parse_fails(m, "segment ! block batch=99 @1", SF_E_OPTION, "batch=99"));
}

/* One process runs placed stages only when every placement is rank 0. */
static void check_single_process(const sf_model *m)
{
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed @0 ! block @0 ! norm"));
    uint32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_OK(sf_graph_push(g, 0, tokens, 8));
    sf_graph_free(g);

    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block layers=0-1 @0,1 ! norm"));
    CHECK(sf_graph_push(g, 0, tokens, 8) == SF_E_UNSUPPORTED);
    CHECKF(strstr(sf_last_error(), "stage 3 (block) is placed on rank 1: run it with `seqflow launch` or `seqflow worker`"),
           "%s", sf_last_error());
    sf_graph_free(g);

    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source path=/dev/null ! segment ! embed ! block ! norm @2 ! sink format=null"));
    CHECK(sf_graph_run(g) == SF_E_UNSUPPORTED);
    CHECKF(strstr(sf_graph_error(g), "stage 5 (norm) is placed on rank 2"), "%s", sf_graph_error(g));
    sf_graph_free(g);
}

int main(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, 1, &m));
    check_stored(m);
    check_refused(m);
    check_single_process(m);
    sf_model_free(m);
    return check_finish("test_placement");
}
