/* What the seqflow command prints besides the hidden states: log levels, the progress line,
 * the output-size check before a run, the run summary as JSON (--stats-json), and `info` and
 * `stages` as JSON. Used by tools/seqflow.c only. Nothing here allocates what it returns:
 * text goes to the FILE given, or into the caller's buffer. */
#ifndef SEQFLOW_TOOLS_CLI_OUTPUT_H
#define SEQFLOW_TOOLS_CLI_OUTPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "seqflow/seqflow.h"

/* Message levels, from -q (error) to -v (debug); info is the default. */
typedef enum cli_log_level { CLI_LOG_ERROR = 0, CLI_LOG_WARNING = 1, CLI_LOG_INFO = 2, CLI_LOG_DEBUG = 3 } cli_log_level;

/* The level messages are printed at (default CLI_LOG_INFO). Set once, while parsing options. */
void cli_set_log_level(cli_log_level level);
cli_log_level cli_get_log_level(void);

/* Parses error, warning, info or debug (also quiet = error, verbose = debug). Returns 1, or 0
 * for anything else. */
int cli_parse_log_level(const char *text, cli_log_level *out);

/* --log-level's argument: sets the level and returns 1, or prints why it is wrong and returns 0. */
int cli_log_level_option(const char *text);

/* Prints "seqflow: [warning: ]MESSAGE\n" on stderr when level is at or below the current one. */
void cli_log(cli_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Tokens a source will read, when that is known before the run: the size of a regular input
 * file for format bytes (one token a byte) or u32 (four bytes a token), summed over the files
 * of a ','-separated list, the built-in text's length when input is NULL. 0 when unknown
 * (standard input, a pipe, format text, a file that is not there). */
uint64_t cli_input_tokens(const char *input, const char *format);

/* The progress line (no newline): tokens, tokens/s, resident memory, and with total > 0 the
 * percent done and the time left at the rate so far. */
void cli_format_progress(char *buf, size_t size, uint64_t tokens, uint64_t total, double elapsed, size_t resident);

/* Checks the expected size of the output file before a run: expected_bytes written to the
 * file `out`. Warns (at warning level) when it is more than the free space of out's file
 * system, or when it is at least 1 GiB and 64 times the input (input_bytes, 0 when unknown).
 * Refuses, printing why and returning 2, when max_output > 0 and expected_bytes exceeds it.
 * Returns 0 to go on. */
int cli_check_output_size(const char *out, uint64_t expected_bytes, uint64_t input_bytes, uint64_t max_output);

/* cli_check_output_size for a run of the seqflow command: the output is written to a file when
 * out is given and the sink format is not digest or null; it holds input_tokens rows of dim
 * values of out_dtype ("bf16": 2 bytes, else 4); the input holds input_tokens bytes, or 4 times
 * as many for format "u32". Nothing is checked when input_tokens is 0 (unknown). Returns 0 to
 * go on, or the exit status 2. */
int cli_check_run_output(const char *out, const char *sink_format, const char *out_dtype, const char *format, int dim,
                         uint64_t input_tokens, long long max_output);

/* The run summary of --stats-json, written to path ("-": stdout) as one JSON object. */
typedef struct cli_run_stats {
    uint64_t tokens;
    double seconds;
    size_t peak_resident_bytes;
    const char *device;
    const char *pipeline; /* the pipeline that ran, source and sink included */
    const sf_model_config *model;
    int status; /* the exit status of the run */
    const sf_graph *graph; /* its stages' statistics (sf_graph_stage_stats); NULL: none */
    double steady_tokens_per_second; /* tools/steady_rate.h; 0: not measured */
} cli_run_stats;

/* Returns SF_OK, or SF_E_IO / SF_E_NOMEM with the message set and printed on stderr. */
int cli_write_stats_json(const char *path, const cli_run_stats *stats);

/* `seqflow stages --json`: an array of {name, help, options: [{name, type, default, min, max,
 * unit, choices, env, help}]}; absent fields are left out (min/max: when the option has a range). */
int cli_print_stages_json(FILE *f);

/* `seqflow info --json`: the model's configuration as one object; model_path NULL for the
 * built-in model. */
int cli_print_info_json(FILE *f, const char *model_path, const sf_model_config *cfg);

/* The prose forms of `seqflow stages` (a line a stage, then one an option with its type,
 * default and range) and `seqflow info` (a line a field). */
void cli_print_stages_text(FILE *f);
int cli_print_info_text(FILE *f, const char *model_path, const sf_model_config *cfg); /* SF_OK or SF_E_IO */

#endif
