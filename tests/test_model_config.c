/* Model configuration: the defaults, the branch list's text form, validation of every field
 * (each refusal naming it), and the positions no branch covers. */
#include <math.h>
#include <string.h>

#include "seqflow/error.h"
#include "seqflow/model.h"
#include "support/check.h"

/* ---- configuration ----------------------------------------------------------------------- */

static void test_default_config(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    CHECK_OK(sf_model_config_validate(&cfg));
    CHECK(cfg.dim == 128 && cfg.heads == 4 && cfg.head_dim == 32 && cfg.vocab == 256);
    CHECK(cfg.layers == 2 && cfg.segment == 256 && cfg.mlp_hidden == 256 && cfg.final_norm == 1);
    CHECK(cfg.memory == SF_MEMORY_DELTA && cfg.global_tokens == 16 && cfg.summary_tokens == 4);
    char buf[128];
    sf_branches_format(&cfg, buf, sizeof buf);
    CHECKF(strcmp(buf, "64:1,128:2,256:4") == 0, "%s", buf);
}

static void test_branches_text(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    CHECK_OK(sf_branches_parse("2048:1,4096:2,8192:4", &cfg));
    CHECK(cfg.n_branches == 3 && cfg.branches[2].window == 8192 && cfg.branches[2].dilation == 4);
    char buf[256];
    sf_branches_format(&cfg, buf, sizeof buf);
    CHECKF(strcmp(buf, "2048:1,4096:2,8192:4") == 0, "%s", buf);
    char tiny[6];
    sf_branches_format(&cfg, tiny, sizeof tiny);
    CHECK(strlen(tiny) == 5 && strncmp(tiny, "2048:", 5) == 0);

    const char *bad[] = {"64", "64:0", "a:b", "64:1,", "", ":1", "64:1;128:2", " 64:1", "0:1",
                         "64:1,,128:2", "99999999999:1", "-64:1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = sf_branches_parse(bad[i], &cfg);
        CHECKF(rc == SF_E_CONFIG, "\"%s\" gave %d", bad[i], rc);
        CHECKF(strstr(sf_last_error(), "branch") != NULL, "%s", sf_last_error());
    }
    /* A refused list leaves the old one in place. */
    CHECK(cfg.n_branches == 3 && cfg.branches[0].window == 2048);

    char many[512] = "";
    for (int b = 0; b < SF_MAX_BRANCHES; b++) strcat(many, b ? ",8:1" : "8:1");
    CHECK_OK(sf_branches_parse(many, &cfg));
    CHECK(cfg.n_branches == SF_MAX_BRANCHES);
    strcat(many, ",8:1");
    CHECK(sf_branches_parse(many, &cfg) == SF_E_CONFIG);
    CHECKF(strstr(sf_last_error(), "more than 16") != NULL, "%s", sf_last_error());
}

static void expect_invalid(int line, const sf_model_config *cfg, const char *needle)
{
    int rc = sf_model_config_validate(cfg);
    check_report(rc == SF_E_CONFIG, __FILE__, line, "config refused", "rc %d", rc);
    check_report(strstr(sf_last_error(), needle) != NULL, __FILE__, line, "message names it",
                 "\"%s\" lacks \"%s\"", sf_last_error(), needle);
}

static void test_validation(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    CHECK_OK(sf_branches_parse("64:1,96:2", &cfg));
    expect_invalid(__LINE__, &cfg, "branch 2 (window 96): window does not divide the segment length 256");
    CHECK_OK(sf_branches_parse("64:1,128:3", &cfg));
    expect_invalid(__LINE__, &cfg, "dilation 3 does not divide the window");

    sf_model_config_default(&cfg);
    cfg.dim = 0;
    expect_invalid(__LINE__, &cfg, "dim is 0");
    sf_model_config_default(&cfg);
    cfg.heads = 70000;
    expect_invalid(__LINE__, &cfg, "heads");
    sf_model_config_default(&cfg);
    cfg.heads = 4096, cfg.head_dim = 4096;
    expect_invalid(__LINE__, &cfg, "heads*head_dim");
    sf_model_config_default(&cfg);
    cfg.summary_tokens = 257;
    expect_invalid(__LINE__, &cfg, "summary_tokens");
    sf_model_config_default(&cfg);
    cfg.global_tokens = -1;
    expect_invalid(__LINE__, &cfg, "global_tokens");
    sf_model_config_default(&cfg);
    cfg.norm_eps = 0.0f;
    expect_invalid(__LINE__, &cfg, "norm_eps");
    cfg.norm_eps = INFINITY;
    expect_invalid(__LINE__, &cfg, "norm_eps");
    sf_model_config_default(&cfg);
    cfg.n_branches = 0;
    expect_invalid(__LINE__, &cfg, "branches");
    sf_model_config_default(&cfg);
    cfg.layers = 5000;
    expect_invalid(__LINE__, &cfg, "layers");

    /* Legal corners: no global tokens with summaries, summaries without global tokens. */
    sf_model_config_default(&cfg);
    cfg.global_tokens = 0;
    CHECK_OK(sf_model_config_validate(&cfg));
    cfg.global_tokens = 8, cfg.summary_tokens = 0;
    CHECK_OK(sf_model_config_validate(&cfg));
    cfg.mlp_hidden = 0, cfg.final_norm = 0, cfg.memory = SF_MEMORY_NONE, cfg.causal = 0;
    CHECK_OK(sf_model_config_validate(&cfg));
}

static long brute_uncovered(const sf_model_config *cfg)
{
    long count = 0;
    for (int h = 0; h < cfg->heads; h++)
        for (int i = 0; i < cfg->segment; i++) {
            int covered = 0;
            for (int b = 0; b < cfg->n_branches; b++) {
                int r = cfg->branches[b].dilation;
                covered |= (i % r) == (h % r);
            }
            count += !covered;
        }
    return count;
}

static void test_uncovered(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    CHECK(sf_model_config_uncovered(&cfg) == 0);
    CHECK_OK(sf_branches_parse("64:2", &cfg));
    /* Head h sees only positions i = h mod 2: half of the 4*256 pairs are uncovered. */
    CHECKF(sf_model_config_uncovered(&cfg) == 512, "%ld", sf_model_config_uncovered(&cfg));
    const char *lists[] = {"64:4,128:8", "256:4,128:2", "32:8,64:16,256:256", "256:3"};
    int heads[] = {4, 3, 5, 7};
    for (size_t k = 0; k < 4; k++) {
        sf_model_config_default(&cfg);
        if (k == 3) {
            cfg.segment = 768;
            CHECK_OK(sf_branches_parse("256:4,768:3", &cfg));
        } else {
            CHECK_OK(sf_branches_parse(lists[k], &cfg));
        }
        cfg.heads = heads[k];
        long fast = sf_model_config_uncovered(&cfg), slow = brute_uncovered(&cfg);
        CHECKF(fast == slow, "%s: %ld vs brute force %ld", lists[k], fast, slow);
        CHECK(slow > 0);
    }
}

int main(void)
{
    test_default_config();
    test_branches_text();
    test_validation();
    test_uncovered();
    return check_finish("test_model_config");
}
