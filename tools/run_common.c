/* What `seqflow run` and `seqflow worker` share (run_common.h). */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compress/frame.h"
#include "core/process_stats.h"
#include "kernels/cpu/vector_rows.h"
#include "stages/stages.h"
#include "tools/cli_output.h"
#include "tools/run_common.h"
#include "tools/steady_rate.h"

static void (*usage_fn)(FILE *f);


/* Seconds SIGTERM and SIGHUP leave the run to flush what was read before it is abandoned:
 * an output pipe nobody reads, or a slow device call, must not keep a stopped run alive.
 * usage() and the README say 3. */
#define STOP_GRACE_SECONDS 3

static sf_graph *volatile running_graph;
static volatile sig_atomic_t stop_signal; /* the first stopping signal, 0 before */
static sem_t stop_posted;                 /* posted by SIGTERM/SIGHUP, or when the run ends */
static sem_t run_ended;                   /* posted when sf_graph_run returned */

/* Leaves at once: the unfinished outputs removed, 128 + sig. Async-signal-safe. */
static void leave_now(int sig, const char *why)
{
    sf_sink_discard_partials();
    static const char prefix[] = "seqflow: ";
    static const char suffix[] = "; unfinished output removed\n";
    if (write(STDERR_FILENO, prefix, sizeof prefix - 1) < 0 || write(STDERR_FILENO, why, strlen(why)) < 0 ||
        write(STDERR_FILENO, suffix, sizeof suffix - 1) < 0) {
        /* nothing left to tell it with */
    }
    _exit(128 + sig);
}

/* SIGINT, SIGTERM, SIGHUP: the first stops reading and lets the run flush what was read (on
 * SIGTERM and SIGHUP for STOP_GRACE_SECONDS at most, see stop_watchdog); a second one of any
 * of them leaves at once. */
static void on_stop_signal(int sig)
{
    if (stop_signal) leave_now(sig, "stopped again");
    stop_signal = sig;
    if (running_graph) sf_graph_interrupt(running_graph);
    if (sig != SIGINT) sem_post(&stop_posted);
}

/* Waits for a SIGTERM/SIGHUP (or the end of the run); after one, gives the run
 * STOP_GRACE_SECONDS to finish and leaves without it otherwise. */
static void *stop_watchdog(void *arg)
{
    (void)arg;
    while (sem_wait(&stop_posted) != 0) {}
    if (!stop_signal) return NULL; /* the run ended */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += STOP_GRACE_SECONDS;
    while (sem_timedwait(&run_ended, &until) != 0)
        if (errno == ETIMEDOUT) leave_now(stop_signal, "the run did not stop in time");
    return NULL;
}

int parse_int_arg(const char *name, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "seqflow: %s expects an integer in %lld..%lld, got '%s'\n", name, lo, hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_memory_kind(const char *s, sf_memory_kind *out)
{
    if (strcmp(s, "delta") == 0) return *out = SF_MEMORY_DELTA, 1;
    if (strcmp(s, "linear") == 0) return *out = SF_MEMORY_LINEAR, 1;
    if (strcmp(s, "none") == 0) return *out = SF_MEMORY_NONE, 1;
    fprintf(stderr, "seqflow: --memory expects delta, linear or none, got '%s'\n", s);
    return 0;
}

static int parse_codec(const char *name, const char *s)
{
    sf_codec codec;
    if (sf_codec_parse(s, &codec) == SF_OK) return 1;
    fprintf(stderr, "seqflow: %s expects raw, lz4 or zstd, got '%s'\n", name, s);
    return 0;
}

/* KIND or KIND:GROUP; sets a->state_quant (the kind alone) and a->state_group. */
static int parse_state_quant(const char *s, run_args *a)
{
    static char kind[16];
    const char *colon = strchr(s, ':');
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    sf_quant_kind parsed;
    if (len < sizeof kind) memcpy(kind, s, len), kind[len] = 0;
    if (len >= sizeof kind || sf_quant_kind_parse(kind, &parsed) != SF_OK) {
        fprintf(stderr, "seqflow: --state-quant expects f32, bf16, int8, int4 or fp8 (int8/int4/fp8 may add :GROUP), got '%s'\n", s);
        return 0;
    }
    a->state_quant = kind;
    a->state_group = 0;
    if (!colon) return 1;
    if (parsed == SF_QUANT_F32 || parsed == SF_QUANT_BF16) {
        fprintf(stderr, "seqflow: --state-quant %s takes no group size (only int8, int4 and fp8 do), got '%s'\n", kind, s);
        return 0;
    }
    if (!parse_int_arg("--state-quant GROUP", colon + 1, 1, 1 << 24, &a->state_group)) return 0;
    if (parsed == SF_QUANT_INT4 && a->state_group % 2) {
        fprintf(stderr, "seqflow: --state-quant int4 needs an even group size, got %lld\n", a->state_group);
        return 0;
    }
    return 1;
}

/* -i may repeat: each input is a stream of its own (the source's path=a,b,...), so a name
 * holding ',' cannot be one of them. */
static int add_input(run_args *a, const char *path)
{
    if (!*path || strchr(path, ',')) {
        fprintf(stderr, "seqflow: --input '%s': %s\n", path, *path ? "a name with ',' cannot be an input" : "empty name");
        return 0;
    }
    if (!a->input) {
        a->input = path;
        return 1;
    }
    static char *joined; /* lives as long as the run's arguments */
    const size_t len = strlen(a->input) + strlen(path) + 2;
    char *more = malloc(len);
    if (!more) {
        fprintf(stderr, "seqflow: out of memory\n");
        return 0;
    }
    snprintf(more, len, "%s,%s", a->input, path);
    free(joined);
    a->input = joined = more;
    return 1;
}

/* Returns 0 to go on, or the exit status. */
static int parse_args(int argc, char **argv, run_args *a)
{
    enum { O_SINK_FORMAT = 1000, O_QUEUE, O_PROGRESS, O_NO_PROGRESS, O_SEGMENT, O_BRANCHES, O_CAUSAL,
           O_MEMORY, O_GLOBAL, O_SUMMARY, O_EPS, O_DIM, O_HEADS, O_HEAD_DIM, O_LAYERS, O_MLP, O_VOCAB,
           O_FINAL_NORM, O_SEED, O_CHECKPOINT, O_CHECKPOINT_EVERY, O_RESUME, O_PRECISION,
           O_STATE_BUDGET, O_SPILL_DIR, O_STATE_QUANT, O_STATE_CODEC, O_CHECKPOINT_CODEC, O_OUT_DTYPE,
           O_BACKEND_SETTINGS, O_CHECK_FINITE, O_LOG_LEVEL, O_STATS_JSON, O_MAX_OUTPUT, O_JSON, O_GPUS, O_RANKS };
    static const struct option long_options[] = {
        {"model", required_argument, 0, 'm'},     {"input", required_argument, 0, 'i'},
        {"format", required_argument, 0, 'f'},    {"out", required_argument, 0, 'o'},
        {"sink-format", required_argument, 0, O_SINK_FORMAT},
        {"out-dtype", required_argument, 0, O_OUT_DTYPE},
        {"device", required_argument, 0, 'd'},    {"threads", required_argument, 0, 't'},
        {"queue-depth", required_argument, 0, O_QUEUE},
        {"progress", no_argument, 0, O_PROGRESS}, {"no-progress", no_argument, 0, O_NO_PROGRESS},
        {"quiet", no_argument, 0, 'q'},           {"help", no_argument, 0, 'h'},
        {"segment", required_argument, 0, O_SEGMENT}, {"branches", required_argument, 0, O_BRANCHES},
        {"causal", required_argument, 0, O_CAUSAL},   {"memory", required_argument, 0, O_MEMORY},
        {"global-tokens", required_argument, 0, O_GLOBAL},
        {"summary-tokens", required_argument, 0, O_SUMMARY},
        {"norm-eps", required_argument, 0, O_EPS},    {"dim", required_argument, 0, O_DIM},
        {"heads", required_argument, 0, O_HEADS},     {"head-dim", required_argument, 0, O_HEAD_DIM},
        {"layers", required_argument, 0, O_LAYERS},   {"mlp", required_argument, 0, O_MLP},
        {"vocab", required_argument, 0, O_VOCAB},     {"final-norm", required_argument, 0, O_FINAL_NORM},
        {"seed", required_argument, 0, O_SEED},
        {"checkpoint", required_argument, 0, O_CHECKPOINT},
        {"checkpoint-every", required_argument, 0, O_CHECKPOINT_EVERY},
        {"resume", no_argument, 0, O_RESUME},         {"precision", required_argument, 0, O_PRECISION},
        {"state-budget", required_argument, 0, O_STATE_BUDGET},
        {"spill-dir", required_argument, 0, O_SPILL_DIR},
        {"state-quant", required_argument, 0, O_STATE_QUANT},
        {"state-codec", required_argument, 0, O_STATE_CODEC},
        {"checkpoint-codec", required_argument, 0, O_CHECKPOINT_CODEC},
        {"backend-settings", required_argument, 0, O_BACKEND_SETTINGS},
        {"check-finite", required_argument, 0, O_CHECK_FINITE},
        {"verbose", no_argument, 0, 'v'},          {"log-level", required_argument, 0, O_LOG_LEVEL},
        {"stats-json", required_argument, 0, O_STATS_JSON},
        {"max-output", required_argument, 0, O_MAX_OUTPUT}, {"json", no_argument, 0, O_JSON},
        {"gpus", required_argument, 0, O_GPUS},       {"cpu-ranks", required_argument, 0, O_RANKS},
        {0, 0, 0, 0}};
    long long v;
    int c;
    while ((c = getopt_long(argc, argv, "m:i:f:o:d:t:qvh", long_options, NULL)) != -1) {
        switch (c) {
        case 'm': a->model_path = optarg; break;
        case 'i':
            if (!add_input(a, optarg)) return 2;
            break;
        case 'f': a->format = optarg; break;
        case 'o': a->out = optarg; break;
        case O_SINK_FORMAT: a->sink_format = optarg; break;
        case O_OUT_DTYPE:
            if (strcmp(optarg, "f32") != 0 && strcmp(optarg, "bf16") != 0) {
                fprintf(stderr, "seqflow: --out-dtype expects f32 or bf16, got '%s'\n", optarg);
                return 2;
            }
            a->out_dtype = optarg;
            break;
        case 'd':
            /* "cuda:N": GPU N; the name alone is GPU 0, or a worker's own (cmd_worker) */
            if (strncmp(optarg, "cuda:", 5) == 0) {
                if (!parse_int_arg("-d cuda:N", optarg + 5, 0, 1023, &v)) return 2;
                a->device = "cuda", a->device_index = (int)v, a->device_index_set = 1;
            } else {
                a->device = optarg;
            }
            break;
        case 't': if (!parse_int_arg("--threads", optarg, 0, 1024, &v)) return 2; a->threads = (int)v; break;
        case O_QUEUE: if (!parse_int_arg("--queue-depth", optarg, 1, 1024, &v)) return 2; a->queue_depth = (int)v; break;
        case O_PROGRESS: a->progress = 2; break;
        case O_NO_PROGRESS: a->progress = 0; break;
        case 'q': cli_set_log_level(CLI_LOG_ERROR); break;
        case 'v': cli_set_log_level(CLI_LOG_DEBUG); break;
        case O_LOG_LEVEL: if (!cli_log_level_option(optarg)) return 2; break;
        case O_STATS_JSON: a->stats_json = optarg; break;
        case O_MAX_OUTPUT: if (!parse_int_arg("--max-output", optarg, 1, INT64_MAX, &v)) return 2; a->max_output = v; break;
        case O_JSON: a->json = 1; break;
        case O_GPUS:
        case O_RANKS:
            /* head-parallel blocks: heads_of= on every block stage (append_body) */
            if (!parse_int_arg(c == O_GPUS ? "--gpus" : "--cpu-ranks", optarg, 1, 256, &v)) return 2;
            a->heads_of = (int)v, a->heads_on_gpus = c == O_GPUS;
            break;
        case 'h': usage_fn(stdout); return -1;
        case O_SEGMENT: if (!parse_int_arg("--segment", optarg, 1, 1 << 24, &v)) return 2; a->cfg.segment = (int)v; a->overrides |= OV_SEGMENT; break;
        case O_BRANCHES:
            if (sf_branches_parse(optarg, &a->cfg) != SF_OK) {
                fprintf(stderr, "seqflow: --branches: %s\n", sf_last_error());
                return 2;
            }
            a->overrides |= OV_BRANCHES;
            break;
        case O_CAUSAL: if (!parse_int_arg("--causal", optarg, 0, 1, &v)) return 2; a->cfg.causal = (int)v; a->overrides |= OV_CAUSAL; break;
        case O_MEMORY: if (!parse_memory_kind(optarg, &a->cfg.memory)) return 2; a->overrides |= OV_MEMORY; break;
        case O_GLOBAL: if (!parse_int_arg("--global-tokens", optarg, 0, 1 << 20, &v)) return 2; a->cfg.global_tokens = (int)v; a->overrides |= OV_GLOBAL; break;
        case O_SUMMARY: if (!parse_int_arg("--summary-tokens", optarg, 0, 1 << 24, &v)) return 2; a->cfg.summary_tokens = (int)v; a->overrides |= OV_SUMMARY; break;
        case O_EPS: {
            char *end;
            errno = 0;
            double e = strtod(optarg, &end);
            /* an underflow is still a valid positive number (ERANGE with a tiny result) */
            if (end == optarg || *end || !(e > 0) || !isfinite(e) || (errno == ERANGE && e > DBL_MIN)) {
                fprintf(stderr, "seqflow: --norm-eps expects a positive number, got '%s'\n", optarg);
                return 2;
            }
            /* below the smallest float it is the smallest float, not 0 */
            a->cfg.norm_eps = (float)e > 0.0f ? (float)e : FLT_TRUE_MIN;
            a->overrides |= OV_EPS;
            break;
        }
        case O_DIM: if (!parse_int_arg("--dim", optarg, 1, 65536, &v)) return 2; a->cfg.dim = (int)v; a->overrides |= OV_DIM; break;
        case O_HEADS: if (!parse_int_arg("--heads", optarg, 1, 4096, &v)) return 2; a->cfg.heads = (int)v; a->overrides |= OV_HEADS; break;
        case O_HEAD_DIM: if (!parse_int_arg("--head-dim", optarg, 1, 4096, &v)) return 2; a->cfg.head_dim = (int)v; a->overrides |= OV_HEAD_DIM; break;
        case O_LAYERS: if (!parse_int_arg("--layers", optarg, 1, 4096, &v)) return 2; a->cfg.layers = (int)v; a->overrides |= OV_LAYERS; break;
        case O_MLP: if (!parse_int_arg("--mlp", optarg, 0, 1 << 20, &v)) return 2; a->cfg.mlp_hidden = (int)v; a->overrides |= OV_MLP; break;
        case O_VOCAB: if (!parse_int_arg("--vocab", optarg, 1, 1 << 26, &v)) return 2; a->cfg.vocab = (int)v; a->overrides |= OV_VOCAB; break;
        case O_FINAL_NORM: if (!parse_int_arg("--final-norm", optarg, 0, 1, &v)) return 2; a->cfg.final_norm = (int)v; a->overrides |= OV_FINAL_NORM; break;
        case O_SEED: if (!parse_int_arg("--seed", optarg, 0, INT64_MAX, &v)) return 2; a->seed = (uint64_t)v; break;
        case O_CHECK_FINITE:
            if (strcmp(optarg, "auto") == 0) v = SF_CHECK_FINITE_ON;
            else if (!parse_int_arg("--check-finite", optarg, 0, 1, &v)) return 2;
            sf_set_check_finite((sf_check_finite_mode)v);
            break;
        case O_CHECKPOINT: a->checkpoint_dir = optarg; break;
        case O_CHECKPOINT_EVERY: if (!parse_int_arg("--checkpoint-every", optarg, 1, 1LL << 40, &v)) return 2; a->checkpoint_every = v; break;
        case O_RESUME: a->resume = 1; break;
        case O_STATE_BUDGET: if (!parse_int_arg("--state-budget", optarg, 1, INT64_MAX, &v)) return 2; a->state_budget = v; break;
        case O_SPILL_DIR: a->spill_dir = optarg; break;
        case O_STATE_QUANT: if (!parse_state_quant(optarg, a)) return 2; break;
        case O_STATE_CODEC:
            if (!parse_codec("--state-codec", optarg)) return 2;
            a->state_codec = optarg;
            break;
        case O_CHECKPOINT_CODEC:
            if (!parse_codec("--checkpoint-codec", optarg)) return 2;
            a->checkpoint_codec = optarg;
            break;
        case O_BACKEND_SETTINGS: a->backend_settings = optarg; break;
        case O_PRECISION:
            if (strcmp(optarg, "bf16") == 0) a->precision = SF_PRECISION_BF16;
            else if (strcmp(optarg, "f32") == 0) a->precision = SF_PRECISION_F32;
            else if (strcmp(optarg, "fp8") == 0) a->precision = SF_PRECISION_FP8;
            else {
                fprintf(stderr, "seqflow: --precision expects bf16, fp8 or f32, got '%s'\n", optarg);
                return 2;
            }
            break;
        default: fputs("Try 'seqflow --help'.\n", stderr); return 2;
        }
    }
    a->quiet = cli_get_log_level() < CLI_LOG_INFO;
    if (optind < argc) a->pipeline = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "seqflow: unexpected argument '%s' (quote the pipeline as one argument)\n", argv[optind]);
        return 2;
    }
    if ((a->spill_dir || a->state_quant || a->state_codec) && !a->state_budget) {
        fprintf(stderr, "seqflow: --spill-dir, --state-quant and --state-codec need --state-budget BYTES\n");
        return 2;
    }
    if ((a->resume || a->checkpoint_every || a->checkpoint_codec) && !a->checkpoint_dir) {
        fprintf(stderr, "seqflow: --resume, --checkpoint-every and --checkpoint-codec need --checkpoint DIR\n");
        return 2;
    }
    if (a->heads_of && (a->device && strcmp(a->device, "cuda") == 0) != a->heads_on_gpus) {
        fprintf(stderr, "seqflow: %s\n", a->heads_on_gpus ? "--gpus needs -d cuda" : "--cpu-ranks is for -d cpu (cuda: --gpus)");
        return 2;
    }
    if (a->precision == SF_PRECISION_FP8 && (!a->device || strcmp(a->device, "cuda") != 0)) {
        fprintf(stderr, "seqflow: --precision fp8 needs -d cuda (FP8 products run on the GPU only)\n");
        return 2;
    }
    return 0;
}

/* Refuses, before any work, outputs that cannot be written and inputs that cannot be resumed;
 * what is found here would otherwise fail only after the whole input was processed (a rename
 * onto a directory) or mid-run. Returns 0 or the exit status 2, with the message printed. */
static int check_output(const char *out)
{
    if (!out || strcmp(out, "-") == 0) return 0;
    if (!*out) {
        fprintf(stderr, "seqflow: -o needs a file name ('-' is standard output)\n");
        return 2;
    }
    const char *slash = strrchr(out, '/');
    const char *base = slash ? slash + 1 : out;
    struct stat sb;
    if (strlen(base) > NAME_MAX) {
        fprintf(stderr, "seqflow: output name '%.40s...' has %zu bytes, more than NAME_MAX (%d)\n", base, strlen(base), NAME_MAX);
        return 2;
    }
    if (!*base || (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "seqflow: output '%s' is a directory; give a file name\n", out);
        return 2;
    }
    if (slash) {
        size_t dir_len = slash == out ? 1 : (size_t)(slash - out);
        char *dir = strndup(out, dir_len);
        int missing = dir && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode));
        if (missing) fprintf(stderr, "seqflow: cannot write output '%s': directory '%s' does not exist\n", out, dir);
        free(dir);
        if (missing) return 2;
    }
    return 0;
}

static int check_resumable_one(const char *input)
{
    if (strcmp(input, "@builtin") == 0) return 0;
    struct stat sb;
    int is_stdin = strcmp(input, "-") == 0;
    if ((is_stdin ? fstat(STDIN_FILENO, &sb) : stat(input, &sb)) != 0) return 0; /* reported when opened */
    if (S_ISREG(sb.st_mode) || S_ISBLK(sb.st_mode)) return 0;
    fprintf(stderr, "seqflow: --checkpoint needs an input it can seek on resume; %s is a %s: give the input as a file\n",
            is_stdin ? "standard input" : input, S_ISFIFO(sb.st_mode) ? "pipe or FIFO" : S_ISSOCK(sb.st_mode) ? "socket" : "terminal or device");
    return 2;
}

/* A checkpointed run is resumed by seeking its inputs (one, or several separated by ','): a FIFO,
 * a pipe or a terminal cannot be. */
static int check_resumable_input(const char *inputs)
{
    if (!inputs) return 0;
    char *list = strdup(inputs);
    if (!list) return 0; /* reported when opened */
    int status = 0;
    for (char *save = NULL, *one = strtok_r(list, ",", &save); one && !status; one = strtok_r(NULL, ",", &save))
        status = check_resumable_one(one);
    free(list);
    return status;
}

/* Errors in what the user asked for (a pipeline, a stage option) are usage errors, the rest
 * (files, the model, the input, writing) runtime errors. */
int exit_status_of(int rc)
{
    return rc == SF_E_PARSE || rc == SF_E_STAGE || rc == SF_E_OPTION ? 2 : 1;
}

/* Loads the model file or builds the built-in one, applying the user's overrides. */
int run_make_model(run_args *a, sf_model **out)
{
    *out = NULL;
    if (!a->model_path) {
        if (sf_model_config_validate(&a->cfg) != SF_OK) return SF_E_CONFIG;
        return sf_model_create_random(&a->cfg, a->seed, out);
    }
    const unsigned weight_shaping = OV_DIM | OV_HEADS | OV_HEAD_DIM | OV_LAYERS | OV_MLP | OV_VOCAB | OV_FINAL_NORM;
    if (a->overrides & weight_shaping)
        return sf_error(SF_E_CONFIG, "--dim/--heads/--head-dim/--layers/--mlp/--vocab/--final-norm apply to the built-in model only; %s fixes them",
                        a->model_path);
    sf_model *loaded;
    int rc = sf_model_load(a->model_path, &loaded);
    if (rc != SF_OK) return rc;
    if (!(a->overrides & ~weight_shaping)) {
        *out = loaded;
        return SF_OK;
    }
    sf_model_config cfg = *sf_model_get_config(loaded);
    if (a->overrides & OV_SEGMENT) cfg.segment = a->cfg.segment;
    if (a->overrides & OV_BRANCHES) {
        cfg.n_branches = a->cfg.n_branches;
        memcpy(cfg.branches, a->cfg.branches, sizeof cfg.branches);
    }
    if (a->overrides & OV_CAUSAL) cfg.causal = a->cfg.causal;
    if (a->overrides & OV_MEMORY) cfg.memory = a->cfg.memory;
    if (a->overrides & OV_GLOBAL) cfg.global_tokens = a->cfg.global_tokens;
    if (a->overrides & OV_SUMMARY) cfg.summary_tokens = a->cfg.summary_tokens;
    if (a->overrides & OV_EPS) cfg.norm_eps = a->cfg.norm_eps;
    rc = sf_model_reconfigure(loaded, &cfg, out);
    sf_model_free(loaded);
    return rc;
}

static int starts_with_stage(const char *pipeline, const char *stage)
{
    while (*pipeline == ' ') pipeline++;
    size_t n = strlen(stage);
    return strncmp(pipeline, stage, n) == 0 && (pipeline[n] == ' ' || pipeline[n] == '!' || !pipeline[n]);
}

static int ends_with_stage(const char *pipeline, const char *stage)
{
    const char *last = strrchr(pipeline, '!');
    return starts_with_stage(last ? last + 1 : pipeline, stage);
}

/* Appends `key='value'` with the value quoted so paths with spaces survive the parser. */
static void append_option(char *buf, size_t size, const char *key, const char *value)
{
    size_t used = strlen(buf);
    snprintf(buf + used, size - used, " %s='%s'", key, value);
}

/* The end of the stage starting at p: its unquoted '!' or the end of the string. */
static const char *stage_end(const char *p)
{
    char quote = 0;
    for (; *p; p++) {
        if (quote) {
            if (*p == quote) quote = 0;
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
        } else if (*p == '!') {
            break;
        }
    }
    return p;
}

/* The placement suffix of the stage p..stop (an unquoted '@' starting a word), or stop. */
static const char *placement_start(const char *p, const char *stop)
{
    char quote = 0;
    for (const char *s = p; s < stop; s++) {
        if (quote) {
            if (*s == quote) quote = 0;
        } else if (*s == '\'' || *s == '"') {
            quote = *s;
        } else if (*s == '@' && (s == p || *(s - 1) == ' ' || *(s - 1) == '\t' || *(s - 1) == '\n')) {
            return s;
        }
    }
    return stop;
}

static int count_stages(const char *body, const char *stage)
{
    int n = 0;
    for (const char *p = body;; p++) {
        n += starts_with_stage(p, stage);
        p = stage_end(p);
        if (!*p) return n;
    }
}

/* Appends body to buf, giving every block stage its share of --state-budget and the
 * --spill-dir (buf has room: see state_option_bytes). 0 after a usage error. */
static int append_body(char *buf, size_t size, const char *body, const run_args *a)
{
    int blocks = a->state_budget ? count_stages(body, "block") : 0;
    if (a->state_budget && (blocks == 0 || a->state_budget / blocks == 0)) {
        fprintf(stderr, "seqflow: --state-budget needs a block stage and at least a byte for each\n");
        return 0;
    }
    if (a->out_dtype && count_stages(body, "norm") == 0) {
        fprintf(stderr, "seqflow: --out-dtype needs a norm stage in the pipeline (it sends the hidden states out)\n");
        return 0;
    }
    for (const char *p = body;;) {
        const char *stage_stop = stage_end(p);
        /* options go before a placement suffix (`@1,2`), which ends the stage */
        const char *end = placement_start(p, stage_stop);
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%.*s", (int)(end - p), p);
        if (a->heads_of && starts_with_stage(p, "block")) {
            if (strstr(buf + used, "heads_of=")) {
                fprintf(stderr, "seqflow: a block of the pipeline sets its own heads_of=; drop --%s\n",
                        a->heads_on_gpus ? "gpus" : "cpu-ranks");
                return 0;
            }
            char n[16];
            snprintf(n, sizeof n, "%d", a->heads_of);
            append_option(buf, size, "heads_of", n);
            if (a->heads_devices[0]) append_option(buf, size, "devices", a->heads_devices);
            strcat(buf, " ");
        }
        if (blocks && starts_with_stage(p, "block")) {
            char budget[32];
            snprintf(budget, sizeof budget, "%lld", a->state_budget / blocks);
            append_option(buf, size, "state_budget", budget);
            if (a->spill_dir) append_option(buf, size, "spill", a->spill_dir);
            if (a->state_quant) append_option(buf, size, "state_quant", a->state_quant);
            if (a->state_group) {
                snprintf(budget, sizeof budget, "%lld", a->state_group);
                append_option(buf, size, "state_group", budget);
            }
            if (a->state_codec) append_option(buf, size, "state_codec", a->state_codec);
            strcat(buf, " ");
        }
        if (a->out_dtype && starts_with_stage(p, "norm")) {
            if (strstr(buf + used, "dtype=")) {
                fprintf(stderr, "seqflow: the pipeline's norm sets its own dtype; drop --out-dtype\n");
                return 0;
            }
            append_option(buf, size, "dtype", a->out_dtype);
            strcat(buf, " ");
        }
        if (end < stage_stop) {
            used = strlen(buf);
            snprintf(buf + used, size - used, " %.*s", (int)(stage_stop - end), end);
        }
        if (!*stage_stop) return 1;
        strcat(buf, "!");
        p = stage_stop + 1;
    }
}


/* The length of the segments the pipeline cuts: its segment stage's length= (0 or unset: the
 * model's), so that checkpoint markers fall on that stage's segment boundaries. */
static int checkpoint_segment_length(const sf_graph *g, const sf_model_config *cfg, long long *out)
{
    *out = 0;
    for (int i = 0; i < sf_graph_size(g); i++) {
        sf_stage *st = sf_graph_stage(g, i);
        if (strcmp(sf_stage_name(st), "segment") != 0) continue;
        long long length = sf_stage_option_int(st, "length");
        if (length <= 0) length = cfg->segment;
        if (*out && *out != length)
            return sf_error(SF_E_UNSUPPORTED, "--checkpoint: the pipeline's segment stages cut segments of %lld and %lld tokens; "
                            "checkpoints need one segment length", *out, length);
        *out = length;
    }
    if (!*out) *out = cfg->segment;
    return SF_OK;
}

/* The segment length of the user's pipeline text (its segment stage's, else the model's). */
static long long pipeline_segment_length(const char *body, const sf_model_config *cfg)
{
    long long length = cfg->segment;
    sf_graph *g = NULL;
    if (sf_graph_create(NULL, NULL, &g) == SF_OK && sf_graph_parse(g, body) == SF_OK &&
        checkpoint_segment_length(g, cfg, &length) != SF_OK)
        length = cfg->segment; /* several lengths: reported by --checkpoint, if given */
    sf_graph_free(g);
    return length;
}

/* Parses the user's pipeline on its own, before the model is loaded and before the CLI adds
 * its source and sink, so that a bad pipeline is a usage error whose positions count the
 * user's stages; its own source and sink get the checks of --input and --out. Returns 0 or 2. */
static int check_pipeline(const char *body, int checkpointing)
{
    sf_graph *g = NULL;
    if (sf_graph_create(NULL, NULL, &g) != SF_OK) return 0; /* reported again by the real graph */
    int status = 0;
    if (sf_graph_parse(g, body) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        status = 2;
    }
    int n = sf_graph_size(g);
    if (!status && n > 0 && strcmp(sf_stage_name(sf_graph_stage(g, 0)), "source") == 0 && checkpointing)
        status = check_resumable_input(sf_stage_option(sf_graph_stage(g, 0), "path"));
    if (!status && n > 0 && strcmp(sf_stage_name(sf_graph_stage(g, n - 1)), "sink") == 0)
        status = check_output(sf_stage_option(sf_graph_stage(g, n - 1), "out"));
    sf_graph_free(g);
    return status;
}

typedef struct progress {
    sf_graph *graph;
    double start;
    uint64_t total; /* tokens the input holds, 0 when unknown */
    volatile int stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int printed;
} progress;

static void *progress_thread(void *arg)
{
    progress *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&p->wake, &p->lock, &until);
        if (p->stop) break;
        double elapsed = sf_monotonic_seconds() - p->start;
        uint64_t tokens = sf_graph_tokens_out(p->graph);
        char line[256];
        cli_format_progress(line, sizeof line, tokens, p->total, elapsed, sf_resident_bytes());
        fprintf(stderr, "\rseqflow: %s   ", line);
        p->printed = 1;
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int run_parse(int argc, char **argv, run_ctx *c, void (*usage)(FILE *f))
{
    run_args *a = &c->a;
    usage_fn = usage;
    sf_model_config_default(&a->cfg);
    a->seed = SF_DEFAULT_SEED;
    a->progress = isatty(STDERR_FILENO);
    int status = parse_args(argc, argv, a);
    if (a->progress == 1 && a->quiet) a->progress = 0;
    c->body = a->pipeline ? a->pipeline : DEFAULT_PIPELINE;
    return status;
}

/* The pipeline text: a source unless the user's starts with one, the user's stages with the
 * options that go to them, a sink unless it ends with one. 0 or the exit status 2. */
static int compose(run_ctx *c)
{
    const run_args *a = &c->a;
    const char *body = c->body;
    size_t size = strlen(body) + 4096 + (a->input ? strlen(a->input) : 0) + (a->out ? strlen(a->out) : 0);
    if (a->state_budget) size += (size_t)count_stages(body, "block") * (160 + (a->spill_dir ? strlen(a->spill_dir) : 0));
    if (a->out_dtype) size += (size_t)count_stages(body, "norm") * 32;
    if (a->heads_of) size += (size_t)count_stages(body, "block") * (48 + strlen(a->heads_devices));
    char *pipeline = c->pipeline = calloc(1, size);
    if (!pipeline) {
        fprintf(stderr, "seqflow: out of memory\n");
        return 1;
    }
    if (c->push) { /* the caller pushes and pulls: the user's stages alone */
        if (starts_with_stage(body, "source") || ends_with_stage(body, "sink") || a->input || a->format || a->out ||
            a->sink_format) {
            fprintf(stderr, "seqflow: a served pipeline has no source or sink (and takes no --input/--out)\n");
            return 2;
        }
        return append_body(pipeline, size, body, a) ? 0 : 2;
    }
    if (!starts_with_stage(body, "source")) {
        strcpy(pipeline, "source");
        append_option(pipeline, size, "path", a->input ? a->input : "@builtin");
        append_option(pipeline, size, "format", a->format ? a->format : "bytes");
        if (a->input && strchr(a->input, ',')) {
            /* several inputs take turns of one segment each: the segments then leave in the same
             * order whatever the chunk size and the checkpoint interval */
            char turn[32];
            snprintf(turn, sizeof turn, "%lld", pipeline_segment_length(body, sf_model_get_config(c->model)));
            append_option(pipeline, size, "turn", turn);
        }
        strcat(pipeline, " ! ");
    } else if (a->input || a->format) {
        fprintf(stderr, "seqflow: the pipeline has its own source; drop --input/--format\n");
        return 2;
    }
    if (!append_body(pipeline, size, body, a)) return 2;
    if (!ends_with_stage(body, "sink")) {
        strcat(pipeline, " ! sink");
        if (a->out) append_option(pipeline, size, "out", a->out);
        if (a->sink_format) append_option(pipeline, size, "format", a->sink_format);
    } else if (a->out || a->sink_format) {
        fprintf(stderr, "seqflow: the pipeline has its own sink; drop --out/--sink-format\n");
        return 2;
    }
    return 0;
}

int run_prepare(run_ctx *c, int driver)
{
    run_args *a = &c->a;
    int status;
    c->driver = driver;
    if (driver && (status = check_output(a->out)) != 0) return status;
    if (driver && a->checkpoint_dir && (status = check_resumable_input(a->input)) != 0) return status;
    if ((status = check_pipeline(c->body, driver && a->checkpoint_dir != NULL)) != 0) return status;
    if (run_make_model(a, &c->model) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        return 1;
    }
    const sf_model_config *cfg = sf_model_get_config(c->model);
    long uncovered = sf_model_config_uncovered(cfg);
    if (uncovered > 0)
        cli_log(CLI_LOG_WARNING, "the branches leave %ld of %ld (head, position) pairs of a segment uncovered; "
                        "those rows attend only to global tokens and memory\n",
                uncovered, (long)cfg->heads * cfg->segment);
    if ((status = compose(c)) != 0) return status;
    c->opts = (sf_graph_options){.device = a->device ? a->device : "cpu", .device_index = a->device_index,
                                 .threads = a->threads,
                                 .queue_depth = a->queue_depth, .precision = a->precision,
                                 .backend_settings = a->backend_settings};
    return run_make_graph(c);
}

int run_make_graph(run_ctx *c)
{
    run_args *a = &c->a;
    const int driver = c->driver;
    const sf_model_config *cfg = sf_model_get_config(c->model);
    sf_graph_free(c->graph);
    c->graph = NULL;
    int rc = sf_graph_create(c->model, &c->opts, &c->graph);
    if (rc == SF_OK) rc = sf_graph_parse(c->graph, c->pipeline);
    if (rc == SF_OK && a->checkpoint_dir && driver) {
        long long segments = a->checkpoint_every ? a->checkpoint_every : 16, length = 0;
        rc = checkpoint_segment_length(c->graph, cfg, &length);
        sf_codec codec = SF_CODEC_RAW;
        if (a->checkpoint_codec) sf_codec_parse(a->checkpoint_codec, &codec); /* validated by parse_codec */
        /* a product past 2^64 tokens means "only at the end", not a wrapped-around interval */
        uint64_t every = length && (uint64_t)segments > UINT64_MAX / (uint64_t)length ? UINT64_MAX
                                                                                      : (uint64_t)segments * (uint64_t)length;
        sf_graph_checkpoint_options ck = {.dir = a->checkpoint_dir, .every = every, .resume = a->resume, .codec = codec};
        if (rc == SF_OK) rc = sf_graph_set_checkpoint(c->graph, &ck);
    }
    if (rc != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        return exit_status_of(rc);
    }
    return 0;
}

void run_ctx_free(run_ctx *c)
{
    sf_graph_free(c->graph);
    free(c->pipeline);
    sf_model_free(c->model);
    c->graph = NULL;
    c->pipeline = NULL;
    c->model = NULL;
}

int run_execute(run_ctx *c)
{
    sf_graph *graph = c->graph;
    const sf_model_config *cfg = sf_model_get_config(c->model);
    int status = 0, rc;
    /* the source is the CLI's own unless the pipeline brought one: then its input is unknown here;
     * only the driver (which writes the output) checks its size */
    const uint64_t input_tokens = starts_with_stage(c->body, "source") ? 0 : cli_input_tokens(c->a.input, c->a.format);
    cli_log(CLI_LOG_DEBUG, "pipeline: %s; device %s; CPU kernels %s; %" PRIu64 " input tokens (0: unknown)", c->pipeline,
            c->opts.device, sf_cpu_kernels_name(sf_cpu_kernels()), input_tokens);
    if (c->driver && (status = cli_check_run_output(c->a.out, c->a.sink_format, c->a.out_dtype, c->a.format, cfg->dim,
                                                    input_tokens, c->a.max_output)))
        return status;
    /* no SA_RESTART: a blocking call of the thread that takes the signal returns, and the
     * stages look at the interrupt flag */
    sem_init(&stop_posted, 0, 0);
    sem_init(&run_ended, 0, 0);
    pthread_t watchdog;
    int have_watchdog = pthread_create(&watchdog, NULL, stop_watchdog, NULL) == 0;
    running_graph = graph;
    run_catch_stop_signals(on_stop_signal);

    progress prog = {.graph = graph, .start = sf_monotonic_seconds(), .total = input_tokens};
    pthread_t prog_thread;
    int have_progress = 0;
    if (c->a.progress) {
        pthread_mutex_init(&prog.lock, NULL);
        pthread_cond_init(&prog.wake, NULL);
        have_progress = pthread_create(&prog_thread, NULL, progress_thread, &prog) == 0;
    }
    steady_rate *steady = c->a.stats_json ? steady_rate_start(graph) : NULL;
    rc = c->run_rc = sf_graph_run(graph);
    const double steady_tokens_per_second = steady_rate_stop(steady);
    sem_post(&run_ended);
    if (have_watchdog) {
        sem_post(&stop_posted);
        pthread_join(watchdog, NULL);
    }
    /* the handlers stay installed: the semaphores are static, so a late signal still finds
     * them (and leaves at once if it is a second one) */
    double elapsed = sf_monotonic_seconds() - prog.start;
    if (have_progress) {
        pthread_mutex_lock(&prog.lock);
        prog.stop = 1;
        pthread_cond_signal(&prog.wake);
        pthread_mutex_unlock(&prog.lock);
        pthread_join(prog_thread, NULL);
        if (prog.printed) fputc('\n', stderr);
    }
    running_graph = NULL;

    uint64_t tokens = sf_graph_tokens_out(graph);
    if (rc != SF_OK && rc != SF_E_INTERRUPTED) {
        char message[1024];
        snprintf(message, sizeof message, "%s", sf_graph_error(graph));
        if (c->failure_message) c->failure_message(c, message, sizeof message);
        fprintf(stderr, "%s: %s\n", c->label ? c->label : "seqflow", message);
        /* a run that failed because a signal cut a call short still ends as stopped by it */
        status = stop_signal ? 128 + stop_signal : exit_status_of(rc);
    } else {
        /* a resumed finished run computes nothing: the graph said so, a "0 tokens" line would mislead */
        if (!c->a.quiet && !sf_graph_checkpoint_finished(graph)) {
            char branches[256];
            sf_branches_format(cfg, branches, sizeof branches);
            fprintf(stderr,
                    "seqflow: %" PRIu64 " tokens in %.3f s (%.0f tokens/s) on %s; model D=%d H=%d d=%d L=%d N=%d "
                    "branches %s memory %s; peak resident %.1f MiB\n",
                    tokens, elapsed, elapsed > 0 ? tokens / elapsed : 0.0, c->opts.device, cfg->dim, cfg->heads,
                    cfg->head_dim, cfg->layers, cfg->segment, branches,
                    cfg->memory == SF_MEMORY_DELTA ? "delta" : cfg->memory == SF_MEMORY_LINEAR ? "linear" : "none",
                    sf_peak_resident_bytes() / 1048576.0);
        }
        if (rc == SF_E_INTERRUPTED) {
            fprintf(stderr, "seqflow: interrupted; output flushed\n");
            status = 128 + (stop_signal ? stop_signal : SIGINT);
        }
    }
    cli_run_stats stats = {.tokens = tokens,
                           .seconds = elapsed,
                           .peak_resident_bytes = sf_peak_resident_bytes(),
                           .device = c->opts.device,
                           .pipeline = c->pipeline,
                           .model = cfg,
                           .status = status,
                           .graph = graph,
                           .steady_tokens_per_second = steady_tokens_per_second};
    if (c->a.stats_json && cli_write_stats_json(c->a.stats_json, &stats) != SF_OK && !status) status = 1;
    return status;
}

void run_catch_stop_signals(void (*handler)(int))
{
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int run_stop_signal(void) { return stop_signal; }

void run_rank_path(const char *path, int rank, char *out, size_t size)
{
    size_t used = 0;
    if (size) out[0] = '\0';
    for (const char *p = path; *p && used + 1 < size;) {
        if (strncmp(p, "{rank}", 6) == 0) {
            used += (size_t)snprintf(out + used, size - used, "%d", rank);
            p += 6;
        } else {
            out[used++] = *p++;
            out[used] = '\0';
        }
    }
}
