/* Messages, progress, output-size checks and JSON of the seqflow command (cli_output.h). */
#include "tools/cli_output.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "stages/builtin_text.h"

static cli_log_level log_level = CLI_LOG_INFO;

void cli_set_log_level(cli_log_level level) { log_level = level; }
cli_log_level cli_get_log_level(void) { return log_level; }

int cli_parse_log_level(const char *text, cli_log_level *out)
{
    static const struct {
        const char *name;
        cli_log_level level;
    } names[] = {{"error", CLI_LOG_ERROR},  {"quiet", CLI_LOG_ERROR}, {"warning", CLI_LOG_WARNING},
                 {"info", CLI_LOG_INFO},    {"debug", CLI_LOG_DEBUG}, {"verbose", CLI_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(text, names[i].name) == 0) return *out = names[i].level, 1;
    return 0;
}

int cli_log_level_option(const char *text)
{
    cli_log_level level;
    if (!cli_parse_log_level(text, &level)) {
        fprintf(stderr, "seqflow: --log-level expects error, warning, info or debug, got '%s'\n", text);
        return 0;
    }
    cli_set_log_level(level);
    return 1;
}

void cli_log(cli_log_level level, const char *fmt, ...)
{
    if (level > log_level) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* one write per message, so that lines of two threads do not interleave */
    fprintf(stderr, "seqflow: %s%s\n", level == CLI_LOG_WARNING ? "warning: " : level == CLI_LOG_DEBUG ? "debug: " : "",
            line);
}

/* One input of the list: its tokens, 0 when unknown. */
static uint64_t one_input_tokens(const char *input, const char *fmt)
{
    if (strcmp(input, "@builtin") == 0) return strcmp(fmt, "bytes") == 0 ? sf_builtin_text_length() : 0;
    struct stat sb;
    if (strcmp(input, "-") == 0 || stat(input, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    if (strcmp(fmt, "bytes") == 0) return (uint64_t)sb.st_size;
    if (strcmp(fmt, "u32") == 0) return (uint64_t)sb.st_size / 4;
    return 0; /* text: the count of ids is not known before reading them */
}

uint64_t cli_input_tokens(const char *input, const char *format)
{
    const char *fmt = format ? format : "bytes";
    if (!input) return one_input_tokens("@builtin", fmt);
    uint64_t total = 0;
    for (const char *p = input;;) {
        const size_t len = strcspn(p, ",");
        char path[4096];
        if (len >= sizeof path) return 0;
        memcpy(path, p, len);
        path[len] = 0;
        const uint64_t n = one_input_tokens(path, fmt);
        if (!n) return 0; /* one unknown input: the total is unknown */
        total += n;
        if (!p[len]) return total;
        p += len + 1;
    }
}

/* "1h02m", "3m05s", "12s" */
static void format_duration(char *buf, size_t size, double seconds)
{
    long s = seconds < 0 ? 0 : seconds > 1e9 ? 999999999L : (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, size, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(buf, size, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, size, "%lds", s);
}

void cli_format_progress(char *buf, size_t size, uint64_t tokens, uint64_t total, double elapsed, size_t resident)
{
    const double rate = elapsed > 0 ? tokens / elapsed : 0.0;
    int used = snprintf(buf, size, "%" PRIu64 " tokens, %.0f tokens/s, %.1f MiB resident", tokens, rate,
                        resident / 1048576.0);
    if (total == 0 || used < 0 || (size_t)used >= size) return;
    /* the output may hold more rows than the input tokens (summary rows): never past 100% */
    const uint64_t done = tokens < total ? tokens : total;
    char eta[32] = "?";
    if (rate > 0) format_duration(eta, sizeof eta, (double)(total - done) / rate);
    snprintf(buf + used, size - (size_t)used, ", %.1f%% of %" PRIu64 ", %s left", 100.0 * (double)done / (double)total,
             total, eta);
}

static void format_bytes(char *buf, size_t size, double bytes)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (bytes >= 1024 && u < 5) bytes /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

int cli_check_output_size(const char *out, uint64_t expected_bytes, uint64_t input_bytes, uint64_t max_output)
{
    char expected[32];
    format_bytes(expected, sizeof expected, (double)expected_bytes);
    if (max_output && expected_bytes > max_output) {
        char limit[32];
        format_bytes(limit, sizeof limit, (double)max_output);
        fprintf(stderr, "seqflow: the output would be about %s, more than --max-output %s; nothing was written\n",
                expected, limit);
        return 2;
    }
    if (!out || strcmp(out, "-") == 0 || expected_bytes == 0) return 0;
    /* the output's file system: the file's directory */
    char dir[4096];
    const char *slash = strrchr(out, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == out ? 1 : (int)(slash - out), out);
    struct statvfs fs;
    struct stat sb;
    /* a device or FIFO takes what is written without keeping it */
    if (stat(out, &sb) == 0 && !S_ISREG(sb.st_mode)) return 0;
    if (statvfs(dir, &fs) == 0) {
        const uint64_t free_bytes = (uint64_t)fs.f_bavail * (uint64_t)fs.f_frsize;
        if (expected_bytes > free_bytes) {
            char avail[32];
            format_bytes(avail, sizeof avail, (double)free_bytes);
            cli_log(CLI_LOG_WARNING, "the output '%s' will be about %s, more than the %s free on its file system",
                    out, expected, avail);
            return 0;
        }
    }
    if (expected_bytes >= (1ULL << 30) && input_bytes && expected_bytes / input_bytes >= 64) {
        char in[32];
        format_bytes(in, sizeof in, (double)input_bytes);
        cli_log(CLI_LOG_WARNING, "%s of input become about %s of output ('%s'): every token is a row of D numbers",
                in, expected, out);
    }
    return 0;
}

int cli_check_run_output(const char *out, const char *sink_format, const char *out_dtype, const char *format, int dim,
                         uint64_t input_tokens, long long max_output)
{
    const int writes = out && (!sink_format || (strcmp(sink_format, "digest") && strcmp(sink_format, "null")));
    if (!writes || !input_tokens) return 0;
    const uint64_t row_bytes = (uint64_t)dim * (out_dtype && strcmp(out_dtype, "bf16") == 0 ? 2 : 4);
    const uint64_t input_bytes = format && strcmp(format, "u32") == 0 ? input_tokens * 4 : input_tokens;
    return cli_check_output_size(out, input_tokens * row_bytes, input_bytes, max_output > 0 ? (uint64_t)max_output : 0);
}

static cJSON *model_json(const sf_model_config *c)
{
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddNumberToObject(m, "dim", c->dim);
    cJSON_AddNumberToObject(m, "heads", c->heads);
    cJSON_AddNumberToObject(m, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(m, "vocab", c->vocab);
    cJSON_AddNumberToObject(m, "layers", c->layers);
    cJSON_AddNumberToObject(m, "segment", c->segment);
    cJSON *branches = cJSON_AddArrayToObject(m, "branches");
    for (int i = 0; branches && i < c->n_branches; i++) {
        cJSON *b = cJSON_CreateObject();
        if (!b) break;
        cJSON_AddNumberToObject(b, "window", c->branches[i].window);
        cJSON_AddNumberToObject(b, "dilation", c->branches[i].dilation);
        cJSON_AddItemToArray(branches, b);
    }
    cJSON_AddBoolToObject(m, "causal", c->causal);
    cJSON_AddStringToObject(m, "memory", c->memory == SF_MEMORY_DELTA    ? "delta"
                                         : c->memory == SF_MEMORY_LINEAR ? "linear"
                                                                         : "none");
    cJSON_AddNumberToObject(m, "global_tokens", c->global_tokens);
    cJSON_AddNumberToObject(m, "summary_tokens", c->summary_tokens);
    char eps[32]; /* the float as written, not its double expansion (1e-06, not 9.99999997e-07) */
    snprintf(eps, sizeof eps, "%.7g", (double)c->norm_eps);
    cJSON_AddNumberToObject(m, "norm_eps", strtod(eps, NULL));
    cJSON_AddNumberToObject(m, "mlp_hidden", c->mlp_hidden);
    cJSON_AddBoolToObject(m, "final_norm", c->final_norm);
    return m;
}

/* Prints and frees root; SF_E_NOMEM when it or its text could not be built. */
static int print_json(FILE *f, cJSON *root)
{
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return sf_error(SF_E_NOMEM, "out of memory building JSON");
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    free(text);
    return ok ? SF_OK : sf_error(SF_E_IO, "writing JSON failed");
}

static int write_stats_json(const char *path, const cli_run_stats *s)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return sf_error(SF_E_NOMEM, "out of memory building JSON");
    cJSON_AddNumberToObject(root, "tokens", (double)s->tokens);
    cJSON_AddNumberToObject(root, "seconds", s->seconds);
    cJSON_AddNumberToObject(root, "tokens_per_second", s->seconds > 0 ? (double)s->tokens / s->seconds : 0.0);
    cJSON_AddNumberToObject(root, "steady_tokens_per_second", s->steady_tokens_per_second);
    cJSON_AddNumberToObject(root, "peak_resident_bytes", (double)s->peak_resident_bytes);
    cJSON_AddStringToObject(root, "device", s->device ? s->device : "cpu");
    if (s->pipeline) cJSON_AddStringToObject(root, "pipeline", s->pipeline);
    cJSON_AddNumberToObject(root, "exit_status", s->status);
    if (s->model) cJSON_AddItemToObject(root, "model", model_json(s->model));
    cJSON *stages = cJSON_AddArrayToObject(root, "stages");
    for (int i = 0; stages && s->graph && i < sf_graph_size(s->graph); i++) {
        sf_stage_stats st;
        cJSON *o = cJSON_CreateObject();
        if (!o || sf_graph_stage_stats(s->graph, i, &st) != SF_OK) {
            cJSON_Delete(o);
            break;
        }
        cJSON_AddStringToObject(o, "name", sf_stage_name(sf_graph_stage(s->graph, i)));
        cJSON_AddNumberToObject(o, "packets", (double)st.packets);
        /* a wait on a link measured across a clock tick can leave a hair below zero */
        cJSON_AddNumberToObject(o, "busy_seconds", st.busy_seconds > 0 ? st.busy_seconds : 0.0);
        cJSON_AddItemToArray(stages, o);
    }
    if (strcmp(path, "-") == 0) return print_json(stdout, root);
    FILE *f = fopen(path, "w");
    if (!f) {
        cJSON_Delete(root);
        return sf_error(SF_E_IO, "--stats-json: cannot write '%s': %s", path, strerror(errno));
    }
    int rc = print_json(f, root);
    if (fclose(f) != 0 && rc == SF_OK) rc = sf_error(SF_E_IO, "--stats-json: writing '%s' failed", path);
    return rc;
}

int cli_write_stats_json(const char *path, const cli_run_stats *s)
{
    int rc = write_stats_json(path, s);
    if (rc != SF_OK) fprintf(stderr, "seqflow: %s\n", sf_last_error());
    return rc;
}

static const char *option_type_name(sf_option_type t)
{
    return t == SF_OPT_INT ? "int" : t == SF_OPT_FLOAT ? "float" : t == SF_OPT_BOOL ? "bool" : "string";
}

/* A range end: JSON has no infinity, so an open end is left out. */
static void add_bound(cJSON *o, const char *key, double v)
{
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
}

static void add_stage(const sf_stage_class *cls, void *user)
{
    cJSON *array = user;
    cJSON *s = cJSON_CreateObject();
    if (!s) return;
    cJSON_AddStringToObject(s, "name", cls->name);
    if (cls->help) cJSON_AddStringToObject(s, "help", cls->help);
    cJSON *options = cJSON_AddArrayToObject(s, "options");
    for (const sf_option *o = cls->options; options && o && o->name; o++) {
        cJSON *j = cJSON_CreateObject();
        if (!j) break;
        cJSON_AddStringToObject(j, "name", o->name);
        cJSON_AddStringToObject(j, "type", option_type_name(o->type));
        if (o->default_value) cJSON_AddStringToObject(j, "default", o->default_value);
        if ((o->type == SF_OPT_INT || o->type == SF_OPT_FLOAT) && o->min != o->max) {
            add_bound(j, "min", o->min);
            add_bound(j, "max", o->max);
        }
        if (o->unit) cJSON_AddStringToObject(j, "unit", o->unit);
        if (o->type == SF_OPT_STRING && o->choices) {
            cJSON *choices = cJSON_AddArrayToObject(j, "choices");
            for (const char *p = o->choices; choices && *p;) {
                size_t n = strcspn(p, "|");
                char value[128];
                snprintf(value, sizeof value, "%.*s", (int)n, p);
                cJSON_AddItemToArray(choices, cJSON_CreateString(value));
                p += n + (p[n] == '|');
            }
        }
        if (o->env) cJSON_AddStringToObject(j, "env", o->env);
        if (o->help) cJSON_AddStringToObject(j, "help", o->help);
        cJSON_AddItemToArray(options, j);
    }
    cJSON_AddItemToArray(array, s);
}

int cli_print_stages_json(FILE *f)
{
    cJSON *root = cJSON_CreateArray();
    if (!root) return sf_error(SF_E_NOMEM, "out of memory building JSON");
    sf_foreach_stage(add_stage, root);
    return print_json(f, root);
}

int cli_print_info_json(FILE *f, const char *model_path, const sf_model_config *cfg)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return sf_error(SF_E_NOMEM, "out of memory building JSON");
    if (model_path) cJSON_AddStringToObject(root, "model", model_path);
    else cJSON_AddNullToObject(root, "model");
    cJSON_AddItemToObject(root, "config", model_json(cfg));
    cJSON_AddNumberToObject(root, "uncovered_pairs", (double)sf_model_config_uncovered(cfg));
    cJSON_AddNumberToObject(root, "pairs", (double)cfg->heads * cfg->segment);
    cJSON_AddStringToObject(root, "version", SEQFLOW_VERSION_STRING);
    return print_json(f, root);
}

/* One line a stage, then one an option: KEY=TYPE (or KEY=A|B|C for a choice), its help, and its
 * default, range and environment default from the class's table, which is what the graph checks
 * values against. */
static void print_stage(const sf_stage_class *cls, void *user)
{
    FILE *f = user;
    fprintf(f, "%-10s %s\n", cls->name, cls->help ? cls->help : "");
    for (const sf_option *o = cls->options; o && o->name; o++) {
        char key[96], range[128];
        const char *type = o->type == SF_OPT_INT ? "INT" : o->type == SF_OPT_FLOAT ? "NUMBER" : o->type == SF_OPT_BOOL ? "BOOL" : "TEXT";
        sf_option_format_range(o, range, sizeof range);
        const int choice = o->type == SF_OPT_STRING && o->choices;
        snprintf(key, sizeof key, "%s=%s", o->name, choice ? o->choices : type);
        fprintf(f, "    %-22s %s", key, o->help ? o->help : "");
        if (o->default_value) fprintf(f, " (default %s%s%s)", o->default_value, !choice && *range ? ", " : "", choice ? "" : range);
        else if (!choice && *range) fprintf(f, " (%s)", range);
        if (o->env) fprintf(f, " [environment default: %s]", o->env);
        fprintf(f, "\n");
    }
}

void cli_print_stages_text(FILE *f) { sf_foreach_stage(print_stage, f); }

int cli_print_info_text(FILE *f, const char *model_path, const sf_model_config *c)
{
    char branches[256];
    sf_branches_format(c, branches, sizeof branches);
    fprintf(f, "model      %s\n", model_path ? model_path : "(built-in)");
    fprintf(f, "dim        %d\nheads      %d\nhead_dim   %d\nvocab      %d\nlayers     %d\nsegment    %d\n", c->dim,
            c->heads, c->head_dim, c->vocab, c->layers, c->segment);
    fprintf(f, "branches   %s\ncausal     %d\nmemory     %s\nglobal     %d\nsummary    %d\nnorm_eps   %g\nmlp        %d\nfinal_norm %d\n",
            branches, c->causal,
            c->memory == SF_MEMORY_DELTA ? "delta" : c->memory == SF_MEMORY_LINEAR ? "linear" : "none",
            c->global_tokens, c->summary_tokens, (double)c->norm_eps, c->mlp_hidden, c->final_norm);
    long uncovered = sf_model_config_uncovered(c);
    fprintf(f, "uncovered  %ld of %ld (head, position) pairs\n", uncovered, (long)c->heads * c->segment);
    return ferror(f) ? sf_error(SF_E_IO, "writing the configuration failed") : SF_OK;
}
