/* The seqflow command-line program. */
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
#include "seqflow/seqflow.h"
#include "stages/stages.h"
#include "tools/cli_output.h"

#define DEFAULT_PIPELINE "segment ! embed ! block ! norm"

typedef struct run_args {
    const char *model_path, *input, *format, *out, *sink_format, *device, *pipeline;
    const char *out_dtype;       /* --out-dtype: f32 or bf16 (validated), NULL = f32 */
    int threads, queue_depth, progress, quiet; /* progress 2: asked for; quiet: below info level */
    int json; const char *stats_json; long long max_output; /* --json (info), --stats-json, --max-output (0: none) */
    const char *checkpoint_dir;  /* --checkpoint */
    long long checkpoint_every;  /* --checkpoint-every (segments), 0 = default */
    int resume;                  /* --resume */
    long long state_budget;      /* --state-budget (bytes, split over the block stages), 0 = none */
    const char *spill_dir;       /* --spill-dir */
    const char *state_quant;     /* --state-quant KIND (validated), NULL = lossless */
    long long state_group;       /* its :GROUP, 0 = the block stage's default */
    const char *state_codec;     /* --state-codec (validated), NULL = the default */
    const char *checkpoint_codec; /* --checkpoint-codec (validated), NULL = raw */
    sf_precision precision;      /* --precision, AUTO when not given */
    const char *backend_settings; /* --backend-settings KEY=V[,KEY=V], NULL = the defaults */
    uint64_t seed;
    int heads_of, heads_on_gpus; /* --gpus N / --ranks N: head-parallel blocks, 0 = off */
    sf_model_config cfg;         /* defaults, then the user's overrides */
    unsigned overrides;          /* which fields of cfg the user set */
} run_args;

enum { OV_DIM = 1, OV_HEADS = 2, OV_HEAD_DIM = 4, OV_LAYERS = 8, OV_MLP = 16, OV_SEGMENT = 32,
       OV_BRANCHES = 64, OV_CAUSAL = 128, OV_MEMORY = 256, OV_GLOBAL = 512, OV_SUMMARY = 1024,
       OV_EPS = 2048, OV_VOCAB = 4096, OV_FINAL_NORM = 8192 };

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

static void usage(FILE *f)
{
    fputs(
        "usage: seqflow run [options] [PIPELINE]\n"
        "       seqflow stages [--json] list the stages and their options\n"
        "       seqflow info [--json] [--model FILE] [model options]   print a model's configuration\n"
        "       seqflow --help | --version\n"
        "\n"
        "`seqflow run` with no arguments runs the built-in default model on built-in text and\n"
        "prints a digest of the hidden states.\n"
        "\n"
        "PIPELINE is a textual stage chain, default \"" DEFAULT_PIPELINE "\".\n"
        "A source is put in front unless the pipeline starts with one (from --input/--format),\n"
        "and a sink is put at the end unless it ends with one (from --out/--sink-format).\n"
        "\n"
        "input and output:\n"
        "  -m, --model FILE        safetensors model (default: the built-in model)\n"
        "  -i, --input FILE        token input; '-' is standard input (default: built-in text);\n"
        "                          repeat for several streams: input k is stream k, the inputs read\n"
        "                          in turn, one 64 KiB chunk each, and the output holds every\n"
        "                          stream's segments in the order they leave the pipeline\n"
        "  -f, --format FMT        bytes (one token per byte, default), u32 (little-endian\n"
        "                          uint32 ids) or text (whitespace-separated decimal ids)\n"
        "  -o, --out FILE          write the final hidden states, [tokens, D] float32 row-major\n"
        "                          in stream order; FILE.npy writes NumPy; '-' is stdout\n"
        "      --sink-format FMT   raw, npy, digest, null or auto (default auto)\n"
        "      --out-dtype T       f32 (default) or bf16: the hidden states sent out as bf16\n"
        "                          (half the bytes; .npy holds them as uint16 bit patterns);\n"
        "                          on cuda the download from the GPU halves too\n"
        "execution:\n"
        "  -d, --device NAME       cpu (default) or cuda (when built with CUDA and a GPU is present)\n"
        "      --precision P       bf16, fp8 (cuda only) or f32 products (default: bf16 on cuda, f32 on cpu)\n"
        "      --gpus N            split every block's heads over N GPUs (-d cuda; NCCL between them)\n"
        "      --ranks N           the same over N CPU ranks (threads), for -d cpu\n"
        "      --backend-settings KEY=V[,KEY=V]\n"
        "                          the device backend's own settings (cuda: docs/CUDA.md); each wins\n"
        "                          over its environment default; cpu has none\n"
        "  -t, --threads N         CPU compute threads (default: all cores; the output does not\n"
        "                          depend on it)\n"
        "      --check-finite 1|0  stop with an error at the first NaN or infinity in the hidden\n"
        "                          rows, naming layer, stream and position: 1 (default; also auto)\n"
        "                          checks rows computed on the CPU after every layer and a GPU's rows\n"
        "                          on the GPU as they leave it (under 1% of the rate); 0 none\n"
        "      --queue-depth N     packets buffered between stages (default 4)\n"
        "      --progress          report tokens, tokens/s, memory (and % and time left when the\n"
        "                          input size is known) every second (default: stderr a terminal)\n"
        "      --no-progress       never report progress\n"
        "  -q, --quiet             errors only (--log-level error): no summary, no warnings\n"
        "  -v, --verbose           also debug messages (--log-level debug)\n"
        "      --log-level L       error, warning, info (default) or debug\n"
        "      --stats-json FILE   the run summary as JSON; --max-output BYTES: refuse a larger output\n"
        "checkpoints:\n"
        "      --checkpoint DIR    save every stream's state and the input position in DIR\n"
        "                          at segment boundaries (atomically; the newest 3 are kept)\n"
        "      --checkpoint-every N  segments between checkpoints (default 16; segments of the\n"
        "                          pipeline's segment stage, whose length= may differ from the model's)\n"
        "      --checkpoint-codec C  raw (default), lz4 or zstd compression of checkpoint files\n"
        "      --resume            continue from the newest valid checkpoint in DIR (a damaged\n"
        "                          one is reported and the previous used; none: start fresh);\n"
        "                          needs the same arguments, a file input and a file output\n"
        "state budget:\n"
        "      --state-budget BYTES  memory for the streams' state (split evenly over the block\n"
        "                          stages); idle streams are compressed, then spilled (default:\n"
        "                          unbounded, every stream stays live)\n"
        "      --spill-dir DIR     where state beyond --state-budget goes, one file per stream\n"
        "                          (without it, running out of budget is an error)\n"
        "      --state-quant Q[:G]  how idle state is stored: f32 (lossless, default), or lossy\n"
        "                          bf16, int8, int4, fp8 with G values per scale (default 64)\n"
        "      --state-codec C     zstd (default), lz4 or raw compression of idle state\n"
        "model options (override the file's metadata or the built-in defaults):\n"
        "      --segment N         segment length N\n"
        "      --branches LIST     dilated branches window:dilation,... e.g. 64:1,128:2,256:4\n"
        "      --causal 0|1        causal attention inside windows\n"
        "      --memory KIND       delta, linear or none\n"
        "      --global-tokens G   global-token FIFO length per block (0 = off)\n"
        "      --summary-tokens S  summary tokens appended per segment\n"
        "      --norm-eps E        RMSNorm epsilon\n"
        "built-in model only (sizes of the weights it generates):\n"
        "      --dim D  --heads H  --head-dim d  --layers L  --mlp F (0 = no MLP)\n"
        "      --vocab V  --final-norm 0|1  --seed S\n"
        "\n"
        "Outputs: a regular FILE (or a new one) is written as FILE.partial-PID and renamed when\n"
        "the run succeeds; a symlink is followed; a device, FIFO or socket is written in place.\n"
        "\n"
        "Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP stop reading; what was read is flushed and\n"
        "written out. SIGTERM and SIGHUP allow that 3 seconds (an output nobody reads, a slow\n"
        "GPU call), then leave without it. A second signal leaves at once. Leaving early removes\n"
        "FILE.partial-PID.\n"
        "\n"
        "Exit status:\n"
        "  0        success\n"
        "  1        runtime error: a file, the model or the input is bad, or writing failed\n"
        "           (one line on stderr)\n"
        "  2        usage error, refused before any work: an unknown or bad option, a bad\n"
        "           pipeline, an output that cannot be written (\"\", a directory, a missing\n"
        "           directory, a name over NAME_MAX), a FIFO or pipe input with --checkpoint\n"
        "  128+N    stopped by signal N: 130 SIGINT, 143 SIGTERM, 129 SIGHUP\n",
        f);
}

static int parse_int_arg(const char *name, const char *s, long long lo, long long hi, long long *out)
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

/* Returns 0 to go on, or the exit status. */
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
        {"gpus", required_argument, 0, O_GPUS},       {"ranks", required_argument, 0, O_RANKS},
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
        case 'd': a->device = optarg; break;
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
        case 'h': usage(stdout); return -1;
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
        case O_GPUS:
        case O_RANKS:
            /* head-parallel blocks: heads_of= on every block stage (append_body) */
            if (!parse_int_arg(c == O_GPUS ? "--gpus" : "--ranks", optarg, 1, 256, &v)) return 2;
            a->heads_of = (int)v, a->heads_on_gpus = c == O_GPUS;
            break;
        default: fputs("Try 'seqflow --help'.\n", stderr); return 2;
        }
    }
    a->quiet = cli_get_log_level() < CLI_LOG_INFO;
    if (a->heads_of) {
        const int cuda = a->device && strcmp(a->device, "cuda") == 0;
        if (cuda != a->heads_on_gpus) {
            fprintf(stderr, "seqflow: %s\n", a->heads_on_gpus ? "--gpus needs -d cuda" : "--ranks is for -d cpu (cuda: --gpus)");
            return 2;
        }
    }
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
static int exit_status_of(int rc)
{
    return rc == SF_E_PARSE || rc == SF_E_STAGE || rc == SF_E_OPTION ? 2 : 1;
}

/* Loads the model file or builds the built-in one, applying the user's overrides. */
static int make_model(run_args *a, sf_model **out)
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
        const char *end = stage_end(p);
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%.*s", (int)(end - p), p);
        if (a->heads_of && starts_with_stage(p, "block")) {
            if (strstr(buf + used, "heads_of=")) {
                fprintf(stderr, "seqflow: a block of the pipeline sets its own heads_of=; drop --%s\n",
                        a->heads_on_gpus ? "gpus" : "ranks");
                return 0;
            }
            char n[16];
            snprintf(n, sizeof n, "%d", a->heads_of);
            append_option(buf, size, "heads_of", n);
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
        if (!*end) return 1;
        strcat(buf, "!");
        p = end + 1;
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

static int cmd_run(int argc, char **argv)
{
    run_args a = {0};
    sf_model_config_default(&a.cfg);
    a.seed = SF_DEFAULT_SEED;
    a.progress = isatty(STDERR_FILENO);
    int status = parse_args(argc, argv, &a);
    if (status) return status < 0 ? 0 : status;
    if (a.progress == 1 && a.quiet) a.progress = 0;
    if ((status = check_output(a.out)) != 0) return status;
    if (a.checkpoint_dir && (status = check_resumable_input(a.input)) != 0) return status;
    if ((status = check_pipeline(a.pipeline ? a.pipeline : DEFAULT_PIPELINE, a.checkpoint_dir != NULL)) != 0)
        return status;

    sf_model *model = NULL;
    if (make_model(&a, &model) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        return 1;
    }
    const sf_model_config *cfg = sf_model_get_config(model);
    long uncovered = sf_model_config_uncovered(cfg);
    if (uncovered > 0)
        cli_log(CLI_LOG_WARNING, "the branches leave %ld of %ld (head, position) pairs of a segment uncovered; "
                        "those rows attend only to global tokens and memory\n",
                uncovered, (long)cfg->heads * cfg->segment);

    const char *body = a.pipeline ? a.pipeline : DEFAULT_PIPELINE;
    size_t size = strlen(body) + 4096 + (a.input ? strlen(a.input) : 0) + (a.out ? strlen(a.out) : 0);
    if (a.state_budget) size += (size_t)count_stages(body, "block") * (160 + (a.spill_dir ? strlen(a.spill_dir) : 0));
    if (a.heads_of) size += (size_t)count_stages(body, "block") * 32;
    if (a.out_dtype) size += (size_t)count_stages(body, "norm") * 32;
    char *pipeline = calloc(1, size);
    if (!pipeline) {
        fprintf(stderr, "seqflow: out of memory\n");
        sf_model_free(model);
        return 1;
    }
    if (!starts_with_stage(body, "source")) {
        strcpy(pipeline, "source");
        append_option(pipeline, size, "path", a.input ? a.input : "@builtin");
        append_option(pipeline, size, "format", a.format ? a.format : "bytes");
        if (a.input && strchr(a.input, ',')) {
            /* several inputs take turns of one segment each: the segments then leave in the same
             * order whatever the chunk size and the checkpoint interval */
            char turn[32];
            snprintf(turn, sizeof turn, "%lld", pipeline_segment_length(body, cfg));
            append_option(pipeline, size, "turn", turn);
        }
        strcat(pipeline, " ! ");
    } else if (a.input || a.format) {
        fprintf(stderr, "seqflow: the pipeline has its own source; drop --input/--format\n");
        free(pipeline);
        sf_model_free(model);
        return 2;
    }
    if (!append_body(pipeline, size, body, &a)) {
        free(pipeline);
        sf_model_free(model);
        return 2;
    }
    if (!ends_with_stage(body, "sink")) {
        strcat(pipeline, " ! sink");
        if (a.out) append_option(pipeline, size, "out", a.out);
        if (a.sink_format) append_option(pipeline, size, "format", a.sink_format);
    } else if (a.out || a.sink_format) {
        fprintf(stderr, "seqflow: the pipeline has its own sink; drop --out/--sink-format\n");
        free(pipeline);
        sf_model_free(model);
        return 2;
    }

    sf_graph_options opts = {.device = a.device ? a.device : "cpu", .threads = a.threads,
                             .queue_depth = a.queue_depth, .precision = a.precision,
                             .backend_settings = a.backend_settings};
    sf_graph *graph = NULL;
    int rc = sf_graph_create(model, &opts, &graph);
    if (rc == SF_OK) rc = sf_graph_parse(graph, pipeline);
    if (rc == SF_OK && a.checkpoint_dir) {
        long long segments = a.checkpoint_every ? a.checkpoint_every : 16, length = 0;
        rc = checkpoint_segment_length(graph, cfg, &length);
        sf_codec codec = SF_CODEC_RAW;
        if (a.checkpoint_codec) sf_codec_parse(a.checkpoint_codec, &codec); /* validated by parse_codec */
        /* a product past 2^64 tokens means "only at the end", not a wrapped-around interval */
        uint64_t every = length && (uint64_t)segments > UINT64_MAX / (uint64_t)length ? UINT64_MAX
                                                                                      : (uint64_t)segments * (uint64_t)length;
        sf_graph_checkpoint_options ck = {.dir = a.checkpoint_dir, .every = every, .resume = a.resume, .codec = codec};
        if (rc == SF_OK) rc = sf_graph_set_checkpoint(graph, &ck);
    }
    if (rc != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        sf_graph_free(graph);
        free(pipeline);
        sf_model_free(model);
        return exit_status_of(rc);
    }

    /* no SA_RESTART: a blocking call of the thread that takes the signal returns, and the
     * stages look at the interrupt flag */
    sem_init(&stop_posted, 0, 0);
    sem_init(&run_ended, 0, 0);
    pthread_t watchdog;
    int have_watchdog = pthread_create(&watchdog, NULL, stop_watchdog, NULL) == 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    running_graph = graph;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    /* the source is the CLI's own unless the pipeline brought one: then its input is unknown here */
    const uint64_t input_tokens = starts_with_stage(body, "source") ? 0 : cli_input_tokens(a.input, a.format);
    cli_log(CLI_LOG_DEBUG, "pipeline: %s; device %s; %" PRIu64 " input tokens (0: unknown)", pipeline, opts.device, input_tokens);
    if ((status = cli_check_run_output(a.out, a.sink_format, a.out_dtype, a.format, cfg->dim, input_tokens, a.max_output))) {
        sf_graph_free(graph);
        free(pipeline);
        sf_model_free(model);
        return status;
    }
    progress prog = {.graph = graph, .start = sf_monotonic_seconds(), .total = input_tokens};
    pthread_t prog_thread;
    int have_progress = 0;
    if (a.progress) {
        pthread_mutex_init(&prog.lock, NULL);
        pthread_cond_init(&prog.wake, NULL);
        have_progress = pthread_create(&prog_thread, NULL, progress_thread, &prog) == 0;
    }
    rc = sf_graph_run(graph);
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
        fprintf(stderr, "seqflow: %s\n", sf_graph_error(graph));
        /* a run that failed because a signal cut a call short still ends as stopped by it */
        status = stop_signal ? 128 + stop_signal : exit_status_of(rc);
    } else {
        /* a resumed finished run computes nothing: the graph said so, a "0 tokens" line would mislead */
        if (!a.quiet && !sf_graph_checkpoint_finished(graph)) {
            char branches[256];
            sf_branches_format(cfg, branches, sizeof branches);
            fprintf(stderr,
                    "seqflow: %" PRIu64 " tokens in %.3f s (%.0f tokens/s) on %s; model D=%d H=%d d=%d L=%d N=%d "
                    "branches %s memory %s; peak resident %.1f MiB\n",
                    tokens, elapsed, elapsed > 0 ? tokens / elapsed : 0.0, opts.device, cfg->dim, cfg->heads,
                    cfg->head_dim, cfg->layers, cfg->segment, branches,
                    cfg->memory == SF_MEMORY_DELTA ? "delta" : cfg->memory == SF_MEMORY_LINEAR ? "linear" : "none",
                    sf_peak_resident_bytes() / 1048576.0);
        }
        if (rc == SF_E_INTERRUPTED) {
            fprintf(stderr, "seqflow: interrupted; output flushed\n");
            status = 128 + (stop_signal ? stop_signal : SIGINT);
        }
    }
    cli_run_stats stats = {.tokens = tokens, .seconds = elapsed, .peak_resident_bytes = sf_peak_resident_bytes(),
                           .device = opts.device, .pipeline = pipeline, .model = cfg, .status = status};
    if (a.stats_json && cli_write_stats_json(a.stats_json, &stats) != SF_OK && !status) status = 1;
    sf_graph_free(graph);
    free(pipeline);
    sf_model_free(model);
    return status;
}

static int cmd_info(int argc, char **argv)
{
    run_args a = {0};
    sf_model_config_default(&a.cfg);
    a.seed = SF_DEFAULT_SEED;
    int status = parse_args(argc, argv, &a);
    if (status) return status < 0 ? 0 : status;
    sf_model *model;
    if (make_model(&a, &model) != SF_OK) {
        fprintf(stderr, "seqflow: %s\n", sf_last_error());
        return 1;
    }
    const sf_model_config *c = sf_model_get_config(model);
    int rc = a.json ? cli_print_info_json(stdout, a.model_path, c) : cli_print_info_text(stdout, a.model_path, c);
    if (rc != SF_OK) fprintf(stderr, "seqflow: %s\n", sf_last_error());
    sf_model_free(model);
    return rc == SF_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* a closed output pipe is a write error (EPIPE, exit 1), not a silent death by SIGPIPE */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("seqflow %s (backends:", SEQFLOW_VERSION_STRING);
        for (const char *const *n = sf_backend_names(); *n; n++) printf(" %s", *n);
        printf(")\n");
        return 0;
    }
    if (strcmp(argv[1], "run") == 0) return cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "info") == 0) return cmd_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "stages") == 0) {
        if (argc > 2 && strcmp(argv[2], "--json") == 0) return cli_print_stages_json(stdout) == SF_OK ? 0 : 1;
        cli_print_stages_text(stdout);
        return 0;
    }
    fprintf(stderr, "seqflow: unknown command '%s'\nTry 'seqflow --help'.\n", argv[1]);
    return 2;
}
