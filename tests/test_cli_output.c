/* What the seqflow command prints besides the hidden states: `stages --json` and `info --json`
 * as data that matches the prose forms, --stats-json, the log levels (-q, -v, --log-level),
 * the progress line's percent and time left, and the output-size check (--max-output). */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/gpu.h"
#include "support/spawn.h"
#include "tools/cli_output.h"

static cJSON *run_json(const char *const *argv, spawn_result *r)
{
    if (spawn_run(argv, NULL, 0, r) != 0) return NULL;
    return cJSON_Parse(r->out);
}

static int is_one_of(const char *s, const char *const *names)
{
    for (; *names; names++)
        if (s && strcmp(s, *names) == 0) return 1;
    return 0;
}

/* Every stage of the prose listing is in the JSON, with the options the class table has. */
static void test_stages_json(void)
{
    static spawn_result r, text;
    cJSON *root = run_json((const char *[]){"seqflow", "stages", "--json", NULL}, &r);
    CHECKF(r.exit_code == 0, "exit %d: %s", r.exit_code, r.err);
    CHECKF(cJSON_IsArray(root), "not a JSON array: %.200s", r.out);
    CHECK(spawn_run((const char *[]){"seqflow", "stages", NULL}, NULL, 0, &text) == 0);
    int stages = 0;
    static const char *const types[] = {"int", "float", "bool", "string", NULL};
    const cJSON *stage;
    cJSON_ArrayForEach(stage, root)
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(stage, "name"));
        CHECK(name && *name);
        const sf_stage_class *cls = sf_find_stage(name);
        CHECKF(cls != NULL, "stage %s is not registered", name);
        /* the prose listing starts the stage's line with its name */
        char line[64];
        snprintf(line, sizeof line, "\n%s ", name);
        CHECKF(strncmp(text.out, line + 1, strlen(line) - 1) == 0 || strstr(text.out, line), "%s not in `stages`", name);
        const cJSON *options = cJSON_GetObjectItem(stage, "options");
        CHECK(cJSON_IsArray(options));
        int n = 0;
        const cJSON *o;
        cJSON_ArrayForEach(o, options)
        {
            const char *oname = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
            const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
            CHECKF(is_one_of(type, types), "%s.%s: type %s", name, oname ? oname : "?", type ? type : "(none)");
            CHECK(cls && cls->options && cls->options[n].name && oname && strcmp(cls->options[n].name, oname) == 0);
            const cJSON *def = cJSON_GetObjectItem(o, "default");
            if (cls && cls->options && cls->options[n].name)
                CHECK(cls->options[n].default_value ? cJSON_IsString(def) && strcmp(def->valuestring, cls->options[n].default_value) == 0
                                                    : def == NULL);
            const cJSON *min = cJSON_GetObjectItem(o, "min"), *max = cJSON_GetObjectItem(o, "max");
            if (min && max) CHECK(cJSON_IsNumber(min) && cJSON_IsNumber(max) && min->valuedouble <= max->valuedouble);
            n++;
        }
        int table = 0;
        for (const sf_option *t = cls ? cls->options : NULL; t && t->name; t++) table++;
        CHECKF(n == table, "%s: %d options in JSON, %d in the table", name, n, table);
        stages++;
    }
    CHECK(stages >= 5);
    /* a known row: segment's length is an integer with a range */
    const cJSON *seg = NULL;
    cJSON_ArrayForEach(stage, root) if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(stage, "name")), "source") == 0) seg = stage;
    CHECK(seg != NULL);
    if (seg) {
        const cJSON *fmt = cJSON_GetArrayItem(cJSON_GetObjectItem(seg, "options"), 1);
        const cJSON *choices = cJSON_GetObjectItem(fmt, "choices");
        CHECK(cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 3);
        CHECK(strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(choices, 1)), "u32") == 0);
    }
    cJSON_Delete(root);
}

static void test_info_json(void)
{
    static spawn_result r;
    cJSON *root = run_json((const char *[]){"seqflow", "info", "--json", "--dim", "64", "--branches", "32:1,64:2", NULL}, &r);
    CHECKF(r.exit_code == 0 && root, "exit %d: %s %.200s", r.exit_code, r.err, r.out);
    const cJSON *cfg = cJSON_GetObjectItem(root, "config");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(root, "model")));
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(cfg, "dim")) == 64);
    const cJSON *branches = cJSON_GetObjectItem(cfg, "branches");
    CHECK(cJSON_GetArraySize(branches) == 2);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(branches, 1), "dilation")) == 2);
    CHECK(cJSON_IsString(cJSON_GetObjectItem(cfg, "memory")));
    CHECK(cJSON_IsBool(cJSON_GetObjectItem(cfg, "causal")));
    sf_model_config def;
    sf_model_config_default(&def);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(cfg, "layers")) == def.layers);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "version")), SEQFLOW_VERSION_STRING) == 0);
    cJSON_Delete(root);
}

/* --stats-json agrees with the digest's row count; the log levels decide what stderr shows. */
static void test_stats_and_levels(void)
{
    static spawn_result r;
    const char *stats = check_tmp_path("cli_output_stats.json");
    unlink(stats);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-q", "--stats-json", stats, NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 0, "-q: exit %d, stderr '%s'", r.exit_code, r.err);
    size_t len = 0;
    char *text = (char *)check_read_file(stats, &len);
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    CHECKF(root != NULL, "stats file not JSON: %.200s", text ? text : "(missing)");
    const char *rows = strstr(r.out, "rows=");
    CHECK(rows && (double)atol(rows + 5) == cJSON_GetNumberValue(cJSON_GetObjectItem(root, "tokens")));
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "seconds")) > 0);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "tokens_per_second")) > 0);
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(root, "steady_tokens_per_second")) &&
          cJSON_GetNumberValue(cJSON_GetObjectItem(root, "steady_tokens_per_second")) >= 0);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "peak_resident_bytes")) > 1e6);
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "exit_status")) == 0);
    CHECK(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "device")), "cpu") == 0);
    cJSON_Delete(root);
    free(text);

    CHECK(spawn_run((const char *[]){"seqflow", "run", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 1 && strstr(r.err, "tokens in"), "info: '%s'", r.err);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "--log-level", "warning", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 0, "warning: '%s'", r.err);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-v", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && strstr(r.err, "debug: pipeline: source") && strstr(r.err, "tokens in"), "-v: '%s'", r.err);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-v", "-q", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 0, "-v -q: the last wins: '%s'", r.err);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "--log-level", "loud", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 2 && r.err_lines == 1 && strstr(r.err, "--log-level"), "bad level: %d '%s'", r.exit_code, r.err);
}

/* A run of many segments has a steady rate of the order of its overall rate (not below half of
 * it: the overall rate includes the start-up and the drain, the steady one leaves them out). */
static void test_steady_rate(void)
{
    static spawn_result r;
    const char *stats = check_tmp_path("cli_output_steady.json");
    enum { BYTES = 1 << 16 };
    char *text = malloc(BYTES);
    for (int i = 0; i < BYTES; i++) text[i] = (char)('a' + (i * 7) % 26);
    unlink(stats);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-q", "-i", "-", "--segment", "64", "--branches", "32:1,64:2",
                                     "--sink-format", "null", "--stats-json", stats, NULL},
                    text, BYTES, &r) == 0);
    free(text);
    CHECKF(r.exit_code == 0, "exit %d: %s", r.exit_code, r.err);
    size_t len = 0;
    char *json = (char *)check_read_file(stats, &len);
    cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
    CHECKF(root != NULL, "stats file not JSON: %.200s", json ? json : "(missing)");
    const double overall = cJSON_GetNumberValue(cJSON_GetObjectItem(root, "tokens_per_second"));
    const double steady = cJSON_GetNumberValue(cJSON_GetObjectItem(root, "steady_tokens_per_second"));
    CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "tokens")) == BYTES);
    CHECKF(steady > 0.5 * overall && steady < 20 * overall, "steady %.0f tokens/s, overall %.0f", steady, overall);
    cJSON_Delete(root);
    free(json);
}

/* An output larger than --max-output is refused before any work, and nothing is written. */
static void test_max_output(void)
{
    static spawn_result r;
    const char *in = check_tmp_path("cli_output_in.txt");
    const char *out = check_tmp_path("cli_output_out.npy");
    FILE *f = fopen(in, "wb");
    CHECK(f != NULL);
    for (int i = 0; f && i < 1000; i++) fputc('a' + i % 26, f);
    if (f) fclose(f);
    unlink(out);
    /* 1000 tokens of D=128 float32 rows: 512000 bytes */
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", in, "-o", out, "--max-output", "500000", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 2 && strstr(r.err, "--max-output") && r.err_lines == 1, "exit %d '%s'", r.exit_code, r.err);
    CHECK(!check_path_exists(out));
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-q", "-i", in, "-o", out, "--max-output", "600000", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0 && r.err_lines == 0, "exit %d '%s'", r.exit_code, r.err);
    struct stat sb;
    CHECK(stat(out, &sb) == 0 && sb.st_size > 512000 && sb.st_size < 600000);
    unlink(out);
    unlink(in);
}

/* The progress line and the size warnings, called directly. */
static void test_progress_and_warnings(void)
{
    char line[256];
    cli_format_progress(line, sizeof line, 250, 1000, 10.0, 3 << 20);
    CHECKF(strstr(line, "250 tokens, 25 tokens/s, 3.0 MiB resident, 25.0% of 1000, 30s left"), "%s", line);
    cli_format_progress(line, sizeof line, 250, 0, 10.0, 3 << 20);
    CHECKF(!strchr(line, '%') && !strstr(line, "left"), "unknown total: %s", line);
    cli_format_progress(line, sizeof line, 3000, 1000, 1.0, 0);
    CHECKF(strstr(line, "100.0% of 1000, 0s left"), "past the end: %s", line);
    cli_format_progress(line, sizeof line, 100, 1000000, 1.0, 0);
    CHECKF(strstr(line, "0.0% of 1000000, 2h46m left"), "hours: %s", line); /* 9999 s */

    /* capture stderr to see the warnings */
    const char *log = check_tmp_path("cli_output_stderr.txt");
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDERR_FILENO);
    const char *out = check_tmp_path("cli_output_huge.npy");
    int huge = cli_check_output_size(out, UINT64_MAX / 2, 1000, 0);          /* more than any disk */
    int ratio = cli_check_output_size(out, 2ULL << 30, 1ULL << 20, 0);        /* 1 MiB in, 2 GiB out */
    cli_set_log_level(CLI_LOG_ERROR);
    int quiet = cli_check_output_size(out, UINT64_MAX / 2, 1000, 0);
    cli_set_log_level(CLI_LOG_INFO);
    int small = cli_check_output_size(out, 1 << 20, 1 << 16, 0);
    int refused = cli_check_output_size(out, 1 << 20, 1 << 16, 1000);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    CHECK(huge == 0 && ratio == 0 && quiet == 0 && small == 0 && refused == 2);
    size_t len;
    char *read = (char *)check_read_file(log, &len);
    const char *said = read ? read : "";
    CHECKF(strstr(said, "warning: the output") && strstr(said, "free on its file system"), "%s", said);
    CHECKF(strstr(said, "1.0 MiB of input become about 2.0 GiB of output"), "%s", said);
    int warnings = 0;
    for (const char *p = said; (p = strstr(p, "warning:")) != NULL; p++) warnings++;
    CHECKF(warnings == 2, "%d warnings (-q must silence them): %s", warnings, said);
    CHECKF(strstr(said, "more than --max-output"), "%s", said);
    free(read);
    unlink(log);

    cli_log_level level;
    CHECK(cli_parse_log_level("debug", &level) && level == CLI_LOG_DEBUG);
    CHECK(cli_parse_log_level("error", &level) && level == CLI_LOG_ERROR);
    CHECK(!cli_parse_log_level("Debug", &level));
}

/* Without a usable GPU, -d cuda fails at once with one line that says why and what to use. */
static void test_cuda_without_gpu(void)
{
    if (check_have_gpu()) return;
    static spawn_result r;
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-q", "-d", "cuda", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 1 && r.err_lines == 1 && strstr(r.err, "device 'cuda'") && strstr(r.err, "use -d cpu"),
           "exit %d: %s", r.exit_code, r.err);
#ifdef SEQFLOW_HAVE_CUDA
    /* a CUDA build: the reason is the machine's (no driver, an old driver, no GPU), not the build */
    CHECKF(!strstr(r.err, "has no CUDA backend") && !strstr(r.err, "driver version is insufficient"), "%s", r.err);
#else
    CHECKF(strstr(r.err, "has no CUDA backend"), "%s", r.err);
#endif
}

int main(void)
{
    test_progress_and_warnings();
    if (!spawn_binary()) return check_skip("SEQFLOW_BIN is not set");
    test_stages_json();
    test_info_json();
    test_stats_and_levels();
    test_steady_rate();
    test_max_output();
    test_cuda_without_gpu();
    return check_finish("test_cli_output");
}
