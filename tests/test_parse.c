/* The textual pipeline form and stage options: every failure names the stage or option. */
#include <math.h>
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

/* A class whose table has a float with a range, a bool and a choice, as a custom stage's. */
static int pass_process(sf_stage *st, sf_packet *in) { return sf_stage_emit(st, in); }

static const sf_option typed_options[] = {
    {.name = "gain", .type = SF_OPT_FLOAT, .default_value = "0.5", .min = 0, .max = 2, .unit = "x", .help = "a factor"},
    {.name = "above", .type = SF_OPT_FLOAT, .min = 1, .max = INFINITY, .help = "no default, at least 1"},
    {.name = "loud", .type = SF_OPT_BOOL, .default_value = "no", .help = "a switch"},
    {.name = "mode", .type = SF_OPT_STRING, .default_value = "b", .choices = "a|b|cc", .help = "a choice"},
    {0}};
static const sf_stage_class typed_class = {.name = "typed", .options = typed_options, .process = pass_process};

/* A default its own row refuses: a bug in the class, reported when the pipeline is parsed. */
static const sf_option broken_options[] = {
    {.name = "n", .type = SF_OPT_INT, .default_value = "0", .min = 1, .max = 9, .help = "default out of range"},
    {0}};
static const sf_stage_class broken_class = {.name = "broken", .options = broken_options, .process = pass_process};

static int range_is(const sf_option *opt, const char *want)
{
    char buf[128];
    const char *got = sf_option_format_range(opt, buf, sizeof buf);
    if (strcmp(got, want) != 0) fprintf(stderr, "  range of %s: '%s', expected '%s'\n", opt->name, got, want);
    return strcmp(got, want) == 0;
}

/* Every value is checked against its table row when the pipeline is parsed (range, choices,
 * type), the message naming stage, option, value and what is accepted, and unset options read
 * as the table's default. */
static void check_option_table(const sf_model *m)
{
    /* out of range, with the range and its unit */
    CHECK(parse_fails(m, "segment max_streams=0", SF_E_OPTION, "stage 'segment': option max_streams=0 is outside 1..1048576 streams"));
    CHECK(parse_fails(m, "source chunk=67108865", SF_E_OPTION, "chunk=67108865 is outside 1..67108864 bytes"));
    CHECK(parse_fails(m, "segment length=-1", SF_E_OPTION, "length=-1 is outside 0..16777216 tokens"));
    CHECK(parse_fails(m, "embed device_rows=0", SF_E_OPTION, "device_rows=0 is outside 1..1024 buffers"));
    CHECK(parse_fails(m, "block batch=17", SF_E_OPTION, "batch=17 is outside 1..16"));
    CHECK(parse_fails(m, "block state_budget=-5", SF_E_OPTION, "state_budget=-5 must be >= 0 bytes"));
    CHECK(parse_fails(m, "block state_group=0", SF_E_OPTION, "state_group=0"));
    CHECK(parse_fails(m, "block defer_commit=3", SF_E_OPTION, "defer_commit=3 is outside 0..2"));
    CHECK(parse_fails(m, "block lanes=2", SF_E_OPTION, "lanes"));
    /* a choice outside the row's list */
    CHECK(parse_fails(m, "norm dtype=f16", SF_E_OPTION, "stage 'norm': option dtype=f16 is not one of f32|bf16"));
    CHECK(parse_fails(m, "sink format=csv", SF_E_OPTION, "format=csv is not one of auto|raw|npy|digest|null"));
    CHECK(parse_fails(m, "source format=utf8", SF_E_OPTION, "bytes|u32|text"));
    CHECK(parse_fails(m, "block state_quant=int9", SF_E_OPTION, "state_quant=int9"));
    CHECK(parse_fails(m, "block state_codec=gzip", SF_E_OPTION, "state_codec=gzip"));
    CHECK(parse_fails(m, "norm dtype=", SF_E_OPTION, "dtype="));
    CHECK(parse_fails(m, "norm dtype=f32|bf16", SF_E_OPTION, "dtype=f32|bf16"));

    /* the ends of a range and every choice are accepted */
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source chunk=1 stream=-3 ! segment length=16777216 max_streams=1048576 ! embed device_rows=1024 ! "
                               "block batch=16 state_budget=0 defer_commit=0 state_quant=fp8_e4m3 state_codec=raw ! "
                               "norm dtype=bf16 ! sink format=null"));
    CHECK(sf_stage_option_int(sf_graph_stage(g, 0), "chunk") == 1);
    CHECK(sf_stage_option_int(sf_graph_stage(g, 0), "stream") == -3); /* no range: any integer, as before */
    CHECK(sf_stage_option_int(sf_graph_stage(g, 1), "length") == 1 << 24);
    CHECK(sf_stage_option_int(sf_graph_stage(g, 3), "defer_commit") == 0 && sf_stage_option_given(sf_graph_stage(g, 3), "defer_commit"));
    sf_graph_free(g);

    /* unset options read as the table's defaults */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source ! segment ! embed ! block ! norm ! sink"));
    const sf_stage *src = sf_graph_stage(g, 0), *seg = sf_graph_stage(g, 1), *emb = sf_graph_stage(g, 2),
                   *blk = sf_graph_stage(g, 3), *nrm = sf_graph_stage(g, 4), *snk = sf_graph_stage(g, 5);
    CHECK(strcmp(sf_stage_option(src, "path"), "-") == 0 && strcmp(sf_stage_option(src, "format"), "bytes") == 0);
    CHECK(sf_stage_option_int(src, "chunk") == 65536 && sf_stage_option_int(src, "stream") == 0);
    CHECK(sf_stage_option_int(seg, "length") == 0 && sf_stage_option_int(seg, "max_streams") == 1024);
    CHECK(sf_stage_option_int(emb, "device_rows") == 12);
    CHECK(strcmp(sf_stage_option(blk, "layers"), "all") == 0 && sf_stage_option_int(blk, "max_streams") == 1024);
    CHECK(sf_stage_option_int(blk, "state_budget") == 0 && sf_stage_option(blk, "spill") == NULL);
    CHECK(sf_stage_option_bool(blk, "spill_sync") == 0 && strcmp(sf_stage_option(blk, "state_quant"), "f32") == 0);
    CHECK(sf_stage_option_int(blk, "state_group") == 64 && strcmp(sf_stage_option(blk, "state_codec"), "zstd") == 0);
    CHECK(sf_stage_option_int(blk, "batch") == 1 && sf_stage_option_int(blk, "defer_commit") == 2);
    CHECK(!sf_stage_option_given(blk, "defer_commit"));
    CHECK(strcmp(sf_stage_option(nrm, "dtype"), "f32") == 0);
    CHECK(sf_stage_option(snk, "out") == NULL && strcmp(sf_stage_option(snk, "format"), "auto") == 0);
    /* a name the table lacks, or a reader of another type, reads 0 */
    CHECK(sf_stage_option(blk, "lanes") == NULL && sf_stage_option_int(blk, "lanes") == 0);
    CHECK(sf_stage_option_int(blk, "layers") == 0 && sf_stage_option_bool(blk, "max_streams") == 0);
    sf_graph_free(g);

    /* a custom class: float ranges, booleans, choices; and a default the row refuses */
    CHECK_OK(sf_register_stage(&typed_class));
    CHECK_OK(sf_register_stage(&broken_class));
    CHECK(parse_fails(m, "typed gain=2.5", SF_E_OPTION, "stage 'typed': option gain=2.5 is outside 0..2 x"));
    CHECK(parse_fails(m, "typed gain=-0.1", SF_E_OPTION, "gain=-0.1 is outside"));
    CHECK(parse_fails(m, "typed gain=nan", SF_E_OPTION, "gain=nan is not a number"));
    CHECK(parse_fails(m, "typed above=0.5", SF_E_OPTION, "above=0.5 must be >= 1"));
    CHECK(parse_fails(m, "typed loud=maybe", SF_E_OPTION, "loud=maybe is not a boolean"));
    CHECK(parse_fails(m, "typed mode=c", SF_E_OPTION, "mode=c is not one of a|b|cc"));
    CHECK(parse_fails(m, "broken", SF_E_OPTION, "stage 'broken': the default of option n=0 is outside 1..9"));
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "typed ! typed gain=2 above=1e9 loud=on mode=cc"));
    CHECK(sf_stage_option_float(sf_graph_stage(g, 0), "gain") == 0.5 && sf_stage_option_float(sf_graph_stage(g, 0), "above") == 0.0);
    CHECK(sf_stage_option(sf_graph_stage(g, 0), "above") == NULL && !sf_stage_option_bool(sf_graph_stage(g, 0), "loud"));
    CHECK(strcmp(sf_stage_option(sf_graph_stage(g, 0), "mode"), "b") == 0);
    CHECK(sf_stage_option_float(sf_graph_stage(g, 1), "gain") == 2.0 && sf_stage_option_float(sf_graph_stage(g, 1), "above") == 1e9);
    CHECK(sf_stage_option_bool(sf_graph_stage(g, 1), "loud") == 1 && strcmp(sf_stage_option(sf_graph_stage(g, 1), "mode"), "cc") == 0);
    sf_graph_free(g);

    /* what `seqflow stages` shows beside each option */
    CHECK(range_is(&typed_options[0], "0..2 x"));
    CHECK(range_is(&typed_options[1], ">= 1"));
    CHECK(range_is(&typed_options[2], ""));
    CHECK(range_is(&typed_options[3], "a|b|cc"));
    CHECK(range_is(&broken_options[0], "1..9"));
    CHECK(range_is(&(sf_option){.name = "t", .type = SF_OPT_INT, .min = -INFINITY, .max = 5, .unit = "rows"}, "<= 5 rows"));
    CHECK(range_is(&(sf_option){.name = "t", .type = SF_OPT_INT, .min = 3, .max = 3}, "")); /* min == max: no range */
    char tiny[4];
    CHECK(strcmp(sf_option_format_range(&typed_options[0], tiny, sizeof tiny), "0..") == 0); /* cut, terminated */
}
static const sf_option eps_options[] = {
    {.name = "eps", .type = SF_OPT_FLOAT, .default_value = "1e-6", .help = "a number"}, {0}};
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
    CHECK(sf_stage_option_int(sf_graph_stage(g, 0), "chunk") == 65536); /* default */
    CHECK(!sf_stage_option_given(sf_graph_stage(g, 0), "chunk") && sf_stage_option_given(sf_graph_stage(g, 0), "format"));
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
    check_option_table(m);
    /* ... and semantic checks at start */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block layers=7"));
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_OPTION);
    CHECKF(strstr(sf_last_error(), "layers=7") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    /* defer_commit takes 0, 1 or 2 (with no side queue, as on the CPU, every one runs in order);
     * its table row refuses 3 when the pipeline is parsed */
    CHECK(parse_fails(m, "segment ! embed ! block defer_commit=3", SF_E_OPTION, "defer_commit=3"));
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block defer_commit=0"));
    CHECK_OK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1));
    sf_graph_free(g);
    /* its row names SEQFLOW_BLOCK_DEFER_COMMIT as the default: read when the stage is created,
     * checked as a given value, and a value in the pipeline wins over it */
    setenv("SEQFLOW_BLOCK_DEFER_COMMIT", "1", 1);
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! block defer_commit=0"));
    CHECK(sf_stage_option_int(sf_graph_stage(g, 2), "defer_commit") == 1);
    CHECK(!sf_stage_option_given(sf_graph_stage(g, 2), "defer_commit"));
    CHECK(sf_stage_option_int(sf_graph_stage(g, 3), "defer_commit") == 0);
    sf_graph_free(g);
    setenv("SEQFLOW_BLOCK_DEFER_COMMIT", "7", 1);
    CHECK(parse_fails(m, "segment ! embed ! block", SF_E_OPTION, "SEQFLOW_BLOCK_DEFER_COMMIT sets option defer_commit=7"));
    CHECK_OK(sf_graph_create(m, NULL, &g)); /* given: the bad variable is not read */
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block defer_commit=2"));
    sf_graph_free(g);
    setenv("SEQFLOW_BLOCK_DEFER_COMMIT", "", 1); /* empty: unset */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block"));
    CHECK(sf_stage_option_int(sf_graph_stage(g, 2), "defer_commit") == 2);
    sf_graph_free(g);
    unsetenv("SEQFLOW_BLOCK_DEFER_COMMIT");
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
    /* sf_graph_prepare sets the stages up before the first push: twice is harmless, and the
     * rows are those of a graph that set up at its first push */
    {
        const size_t n = (size_t)cfg.segment * 2 + 3;
        uint32_t *tokens = malloc(n * sizeof *tokens);
        for (size_t i = 0; i < n; i++) tokens[i] = (uint32_t)(i * 7 % (size_t)cfg.vocab);
        float *rows[2] = {NULL, NULL};
        size_t got[2] = {0, 0};
        for (int prepared = 0; prepared < 2; prepared++) {
            rows[prepared] = calloc(n * (size_t)cfg.dim, sizeof(float));
            CHECK_OK(sf_graph_create(m, NULL, &g));
            CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
            if (prepared) {
                CHECK_OK(sf_graph_prepare(g));
                CHECK_OK(sf_graph_prepare(g));
            }
            CHECK_OK(sf_graph_push(g, 0, tokens, n));
            CHECK_OK(sf_graph_end(g, 0));
            for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
                if (p->kind != SF_PACKET_HIDDEN || (p->flags & SF_PACKET_PROVISIONAL) || !p->x) continue;
                CHECK(p->position + p->n <= n && p->width == (size_t)cfg.dim);
                if (p->position + p->n > n || p->width != (size_t)cfg.dim) continue;
                memcpy(rows[prepared] + p->position * p->width, p->x, p->n * p->width * sizeof(float));
                got[prepared] += p->n;
            }
            sf_graph_free(g);
        }
        CHECKF(got[0] == n && got[1] == n, "rows out: %zu unprepared, %zu prepared, of %zu", got[0], got[1], n);
        CHECK(memcmp(rows[0], rows[1], n * (size_t)cfg.dim * sizeof(float)) == 0);
        free(rows[0]), free(rows[1]), free(tokens);
    }
    /* a stage whose set-up fails: the error at prepare, and the graph never starts again (its
     * stages are not set up twice) */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block layers=99 ! norm"));
    CHECK(sf_graph_prepare(g) == SF_E_OPTION);
    CHECKF(strstr(sf_last_error(), "layers=99") != NULL, "%s", sf_last_error());
    CHECK(sf_graph_push(g, 0, (const uint32_t[]){1}, 1) == SF_E_INVAL);
    CHECKF(strstr(sf_last_error(), "failed to start") != NULL, "%s", sf_last_error());
    sf_graph_free(g);
    /* a graph that ran on threads takes no prepare */
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "source path=@builtin ! segment ! sink format=null"));
    CHECK_OK(sf_graph_run(g));
    CHECK(sf_graph_prepare(g) == SF_E_INVAL);
    sf_graph_free(g);
    CHECK(sf_graph_prepare(NULL) == SF_E_INVAL);
    /* a valid but tiny number (it underflows a double) is a number, not "not a number" */
    CHECK_OK(sf_register_stage(&eps_class));
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECKF(sf_graph_parse(g, "test_eps eps=1e-320") == SF_OK, "%s", sf_last_error());
    CHECK(sf_stage_option_float(sf_graph_stage(g, 0), "eps") < 1e-300);
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
