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
#include "tools/distributed_cli.h"
#include "tools/run_common.h"
#include "tools/serve_cli.h"

static void usage(FILE *f)
{
    fputs(
        "usage: seqflow run [options] [PIPELINE]\n"
        "       seqflow launch -n N [launch options] -- [run options] [PIPELINE]\n"
        "       seqflow worker [worker options] [run options] [PIPELINE]\n"
        "                               a run over several processes (seqflow launch --help)\n"
        "       seqflow serve --bind ENDPOINT [serve options] [run options] [PIPELINE]\n"
        "                               one pipeline, many streams, clients over ZeroMQ\n"
        "                               (seqflow serve --help)\n"
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
        "      --cpu-ranks N       the same over N CPU ranks (threads), for -d cpu\n"
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

static int cmd_run(int argc, char **argv)
{
    run_ctx c = {0};
    int status = run_parse(argc, argv, &c, usage);
    if (status) return status < 0 ? 0 : status;
    status = run_prepare(&c, 1);
    if (status == 0) status = run_execute(&c);
    run_ctx_free(&c);
    return status;
}

static int cmd_info(int argc, char **argv)
{
    run_ctx ctx = {0};
    int status = run_parse(argc, argv, &ctx, usage);
    if (status) return status < 0 ? 0 : status;
    run_args a = ctx.a;
    sf_model *model;
    if (run_make_model(&a, &model) != SF_OK) {
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
    if (strcmp(argv[1], "worker") == 0) return cmd_worker(argc - 1, argv + 1);
    if (strcmp(argv[1], "serve") == 0) return cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "launch") == 0) return cmd_launch(argc - 1, argv + 1);
    if (strcmp(argv[1], "stages") == 0) {
        if (argc > 2 && strcmp(argv[2], "--json") == 0) return cli_print_stages_json(stdout) == SF_OK ? 0 : 1;
        cli_print_stages_text(stdout);
        return 0;
    }
    fprintf(stderr, "seqflow: unknown command '%s'\nTry 'seqflow --help'.\n", argv[1]);
    return 2;
}
