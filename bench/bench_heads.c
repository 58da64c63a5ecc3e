/* Head-parallel blocks against the plain block stage, on GPUs (or CPU ranks):
 *
 *   bench_heads [--preset reference|small] [--segments S] [--warmup W] [--reps K] [--gpus G]
 *               [--device cuda|cpu] [--overlap K]
 *
 * The model of bench/gpu_bench.sh (reference: D=1024 H=16 d=64 N=8192, branches
 * 2048:1,4096:2,8192:4, causal, delta memory, 256 global tokens, 8 summary tokens, 4 layers,
 * SwiGLU 4096, final norm; random weights, seed 1) over S segments of random tokens through
 * `segment ! embed ! block ! norm` in push mode, timed after W warm-up segments, for:
 *   plain  - block (today's path)
 *   R=1    - block heads_of=1 overlap=1 (the sharded path with a one-rank communicator: its overhead)
 *   R=2..G - block heads_of=R overlap=1 over R GPUs (when that many are visible and R divides H and F)
 * each also with overlap=K (default 2: the rows after attention in K chunks, each chunk's
 * sum beside the next chunk's work), and, on GPUs with R >= 2, the ways of summing the ranks'
 * parts: the default (bf16 parts, by the copy engines where the GPUs have peer access),
 * reduce=nccl (bf16 parts by NCCL's all-reduce, overlap=1 only) and reduce=f32 (float32 rows by
 * NCCL's all-reduce), and the default with the CUDA setting normed_sums=0 (every rank adds
 * whole sums and the products norm, against the sums that norm the rows split over the ranks)
 * repeated K times in turns (plain, R=1, R=2, plain, ...) so that drift hits every one alike;
 * the median of each is reported. Then the communicator alone: an all-reduce of one segment's
 * rows ([N, D] float32, what each layer reduces twice with reduce=f32; and in bf16) on R ranks,
 * its mean time. Memory: bytes in use on each GPU (cudaMemGetInfo, whole device), the most seen
 * after any segment.
 * Prints one RESULT line per measurement for scripts. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/process_stats.h"
#include "kernels/comm.h"
#include "seqflow/seqflow.h"

#ifdef SEQFLOW_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "kernels/cuda/cuda_device.h"
#endif

#define MAX_GPUS 8
#define MAX_REPS 16
#define MAX_CONF 12

static void die(const char *what)
{
    fprintf(stderr, "bench_heads: %s: %s\n", what, sf_last_error());
    exit(1);
}

static int gpu_count(void)
{
#ifdef SEQFLOW_HAVE_CUDA
    return sf_cuda_device_count();
#else
    return 0;
#endif
}

/* MiB in use on GPU dev (whole device), -1 where unknown. */
static double used_mib(int dev)
{
#ifdef SEQFLOW_HAVE_CUDA
    int was = 0;
    size_t free_b = 0, total = 0;
    cudaGetDevice(&was);
    if (cudaSetDevice(dev) != cudaSuccess || cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        cudaGetLastError();
        cudaSetDevice(was);
        return -1;
    }
    cudaSetDevice(was);
    return (double)(total - free_b) / 1048576.0;
#else
    (void)dev;
    return -1;
#endif
}

static void preset(const char *name, sf_model_config *c)
{
    sf_model_config_default(c);
    if (strcmp(name, "small") == 0) return;
    if (strcmp(name, "reference") != 0) {
        fprintf(stderr, "bench_heads: unknown preset '%s' (reference, small)\n", name);
        exit(2);
    }
    c->vocab = 256, c->dim = 1024, c->heads = 16, c->head_dim = 64, c->segment = 8192;
    c->causal = 1, c->memory = SF_MEMORY_DELTA, c->global_tokens = 256, c->summary_tokens = 8;
    c->layers = 4, c->mlp_hidden = 4096, c->final_norm = 1;
    if (sf_branches_parse("2048:1,4096:2,8192:4", c) != SF_OK) die("branches");
}

typedef struct run_result {
    double tokens_per_s;
    double mib[MAX_GPUS]; /* most in use on each GPU after a segment */
} run_result;

static run_result run_once(const sf_model *m, const char *device, const char *block, const uint32_t *tokens,
                           int segments, int warmup, int gpus)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment;
    /* "STAGE|SETTINGS": the block stage STAGE with the backend settings SETTINGS */
    char stage[128], settings[64] = "";
    snprintf(stage, sizeof stage, "%s", block);
    char *bar = strchr(stage, '|');
    if (bar) *bar = 0, snprintf(settings, sizeof settings, "%s", bar + 1);
    sf_graph_options opts = {.device = device, .backend_settings = settings[0] ? settings : NULL};
    sf_graph *g = NULL;
    if (sf_graph_create(m, &opts, &g) != SF_OK) die("graph");
    char pipeline[256];
    snprintf(pipeline, sizeof pipeline, "segment ! embed ! %s ! norm", stage);
    if (sf_graph_parse(g, pipeline) != SF_OK) die(pipeline);
    run_result r = {0};
    for (int d = 0; d < MAX_GPUS; d++) r.mib[d] = -1;
    double t0 = sf_monotonic_seconds();
    size_t rows = 0, rows0 = 0;
    for (int s = 0; s < segments; s++) {
        if (s == warmup) t0 = sf_monotonic_seconds(), rows0 = rows;
        if (sf_graph_push(g, 0, tokens + (size_t)s * N, N) != SF_OK) die(pipeline);
        for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) rows += p->kind == SF_PACKET_HIDDEN ? p->n : 0;
        for (int d = 0; d < gpus && d < MAX_GPUS; d++) {
            const double u = used_mib(d);
            if (u > r.mib[d]) r.mib[d] = u;
        }
    }
    if (sf_graph_end(g, 0) != SF_OK) die(pipeline);
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) rows += p->kind == SF_PACKET_HIDDEN ? p->n : 0;
    const double seconds = sf_monotonic_seconds() - t0;
    r.tokens_per_s = (double)(rows - rows0) / seconds;
    sf_graph_free(g);
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the all-reduce alone ----------------------------------------------------------------- */

typedef struct ar_job {
    int rank, ranks, reps;
    size_t count;
    sf_dtype type;
    const unsigned char *id;
    const char *device;
    sf_comm **host; /* cpu: the group's communicators */
    double ms;
    int rc;
} ar_job;

static void *ar_main(void *arg)
{
    ar_job *j = arg;
    sf_backend *be = NULL;
    const int cuda = strcmp(j->device, "cuda") == 0;
    j->rc = sf_backend_create(j->device, cuda ? j->rank : 0, &be);
    sf_comm *c = NULL;
    if (j->rc == SF_OK && cuda) j->rc = sf_comm_nccl_create(be, j->id, j->rank, j->ranks, 60000, &c);
    if (j->rc == SF_OK && !cuda) c = j->host[j->rank];
    const size_t bytes = j->count * (j->type == SF_DTYPE_BF16 ? 2 : sizeof(float));
    float *buf = j->rc == SF_OK ? be->ops->alloc(be, bytes) : NULL;
    if (j->rc == SF_OK && !buf) j->rc = SF_E_NOMEM;
    if (j->rc == SF_OK) j->rc = be->ops->zero(be, buf, bytes);
    for (int i = 0; i < 5 && j->rc == SF_OK; i++) j->rc = sf_comm_all_reduce(c, buf, j->count, j->type);
    if (j->rc == SF_OK) j->rc = sf_comm_wait(c);
    const double t0 = sf_monotonic_seconds();
    for (int i = 0; i < j->reps && j->rc == SF_OK; i++) j->rc = sf_comm_all_reduce(c, buf, j->count, j->type);
    if (j->rc == SF_OK) j->rc = sf_comm_wait(c);
    j->ms = 1e3 * (sf_monotonic_seconds() - t0) / j->reps;
    if (j->rc != SF_OK) fprintf(stderr, "bench_heads: all-reduce on rank %d: %s\n", j->rank, sf_last_error());
    if (be) be->ops->free(be, buf);
    sf_comm_free(c);
    sf_backend_free(be);
    return NULL;
}

static double all_reduce_ms(const char *device, int ranks, size_t count, sf_dtype type)
{
    unsigned char id[SF_COMM_NCCL_ID_BYTES];
    sf_comm *host[MAX_GPUS] = {0};
    if (strcmp(device, "cuda") == 0) {
        if (sf_comm_nccl_unique_id(id) != SF_OK) die("NCCL id");
    } else if (sf_comm_host_create(ranks, NULL, 60000, host) != SF_OK) {
        die("host communicator");
    }
    ar_job jobs[MAX_GPUS];
    pthread_t t[MAX_GPUS];
    for (int r = 0; r < ranks; r++) {
        jobs[r] = (ar_job){.rank = r, .ranks = ranks, .reps = 20, .count = count, .id = id, .device = device};
        jobs[r].type = type, jobs[r].host = host;
        pthread_create(&t[r], NULL, ar_main, &jobs[r]);
    }
    double worst = 0;
    for (int r = 0; r < ranks; r++) {
        pthread_join(t[r], NULL);
        if (jobs[r].rc != SF_OK) return -1;
        if (jobs[r].ms > worst) worst = jobs[r].ms;
    }
    return worst;
}

int main(int argc, char **argv)
{
    const char *preset_name = "reference", *device = NULL;
    int segments = 16, warmup = 3, reps = 3, max_gpus = MAX_GPUS, overlap = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--preset") == 0) preset_name = argv[i + 1];
        else if (strcmp(argv[i], "--segments") == 0) segments = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--warmup") == 0) warmup = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--gpus") == 0) max_gpus = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--device") == 0) device = argv[i + 1];
        else if (strcmp(argv[i], "--overlap") == 0) overlap = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_heads [--preset reference|small] [--segments S] [--warmup W] [--reps K] "
                            "[--gpus G] [--device cuda|cpu] [--overlap K]\n");
            return 2;
        }
    }
    if (argc % 2 == 0) {
        fprintf(stderr, "bench_heads: an option without its value\n");
        return 2;
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    if (warmup < 1 || warmup >= segments) {
        fprintf(stderr, "bench_heads: need 1 <= warm-up < segments\n");
        return 2;
    }
    int gpus = gpu_count();
    if (!device) device = gpus > 0 ? "cuda" : "cpu";
    const int cuda = strcmp(device, "cuda") == 0;
    if (cuda && !sf_comm_nccl_available()) {
        fprintf(stderr, "bench_heads: this build has no NCCL\n");
        return 77;
    }
    if (!cuda) gpus = 0;
    sf_model_config cfg;
    preset(preset_name, &cfg);
    sf_model *m = NULL;
    if (sf_model_create_random(&cfg, 1, &m) != SF_OK) die("model");
    const size_t N = (size_t)cfg.segment;
    uint32_t *tokens = malloc((size_t)segments * N * sizeof *tokens);
    unsigned long long s = 12345;
    for (size_t i = 0; i < (size_t)segments * N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (uint32_t)((s >> 33) % (unsigned)cfg.vocab);
    }
    /* the configurations: plain, then heads_of = 1, 2, 4, ... up to the GPUs (cpu: up to 4) */
    char blocks[MAX_CONF][64];
    int ranks_of[MAX_CONF], n_conf = 0;
    snprintf(blocks[n_conf], sizeof blocks[0], "block"), ranks_of[n_conf++] = 0;
    const int most = cuda ? (gpus < max_gpus ? gpus : max_gpus) : (max_gpus < 4 ? max_gpus : 4);
    for (int R = 1; R <= most && n_conf + 6 <= MAX_CONF; R *= 2) {
        if (cfg.heads % R || cfg.mlp_hidden % R) continue;
        /* the sums beside the next chunk's work (overlap=); on GPUs the ways of summing */
        static const char *const reduces[] = {"", " reduce=nccl", " reduce=f32"};
        for (int w = 0; w < (cuda && R >= 2 ? 3 : 1); w++) {
            snprintf(blocks[n_conf], sizeof blocks[0], "block heads_of=%d overlap=1%s", R, reduces[w]);
            ranks_of[n_conf++] = R;
            if (w == 1) continue; /* NCCL's bf16 sums chunked: measured slower than unchunked */
            snprintf(blocks[n_conf], sizeof blocks[0], "block heads_of=%d overlap=%d%s", R, overlap, reduces[w]);
            ranks_of[n_conf++] = R;
            if (w || !cuda || R < 2) continue;
            /* the sums without the norm: every rank adds whole sums, the products norm */
            snprintf(blocks[n_conf], sizeof blocks[0], "block heads_of=%d overlap=%d|normed_sums=0", R, overlap);
            ranks_of[n_conf++] = R;
        }
    }
    printf("bench_heads: %s model (D=%d H=%d d=%d N=%d, %d layers, F=%d) on %s, %d GPU(s) visible; %d segments, %d "
           "warm-up, %d reps\n",
           preset_name, cfg.dim, cfg.heads, cfg.head_dim, cfg.segment, cfg.layers, cfg.mlp_hidden, device, gpus,
           segments, warmup, reps);
    double tps[MAX_CONF][MAX_REPS];
    run_result last[MAX_CONF];
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < n_conf; i++) {
            last[i] = run_once(m, device, blocks[i], tokens, segments, warmup, ranks_of[i] > 1 ? ranks_of[i] : gpus ? 1 : 0);
            tps[i][k] = last[i].tokens_per_s;
            fprintf(stderr, "  rep %d %-18s %.0f tokens/s\n", k + 1, blocks[i], tps[i][k]);
        }
    double med[MAX_CONF];
    for (int i = 0; i < n_conf; i++) med[i] = median(tps[i], reps);
    const size_t reduce_count = N * (size_t)cfg.dim;
    const int reductions = cfg.mlp_hidden ? 2 : 1;
    printf("%-20s %14s %10s %12s %14s  %s\n", "configuration", "tokens/s", "vs plain", "vs R=1", "all-reduce ms",
           "MiB in use per GPU");
    double r1 = 0, ar_of_ranks = 0;
    for (int i = n_conf - 1; i >= 0; i--)
        if (ranks_of[i] == 1) r1 = med[i]; /* the first heads_of=1, without overlap */
    for (int i = 0; i < n_conf; i++) {
        const int R = ranks_of[i];
        /* the all-reduce alone: measured once a rank count */
        if (R >= 1 && ranks_of[i - 1] != R) ar_of_ranks = all_reduce_ms(device, R, reduce_count, SF_DTYPE_F32);
        const double ar = R >= 1 ? ar_of_ranks : 0;
        char mem[160] = "";
        for (int d = 0; d < (R > 1 ? R : 1) && cuda; d++) {
            size_t used = strlen(mem);
            snprintf(mem + used, sizeof mem - used, "%s%.0f", d ? " / " : "", last[i].mib[d]);
        }
        printf("%-20s %14.0f %9.3fx %11.3fx %14.3f  %s\n", blocks[i], med[i], med[i] / med[0], r1 > 0 ? med[i] / r1 : 0,
               ar, mem);
        printf("RESULT config=%s ranks=%d overlap=%d reduce=%s tokens_per_s=%.1f vs_plain=%.4f vs_r1=%.4f "
               "all_reduce_ms=%.4f all_reduce_ms_per_layer=%.4f mib_gpu0=%.0f mib_gpu1=%.0f\n",
               R ? "heads_of" : "plain", R, strstr(blocks[i], "overlap=") ? atoi(strstr(blocks[i], "overlap=") + 8) : 1,
               strstr(blocks[i], "reduce=f32")      ? "f32"
               : strstr(blocks[i], "reduce=nccl")   ? "nccl"
               : strstr(blocks[i], "normed_sums=0") ? "auto-rows"
                                                    : "auto",
               med[i], med[i] / med[0], r1 > 0 ? med[i] / r1 : 0, ar, ar * reductions, last[i].mib[0], last[i].mib[1]);
    }
    if (r1 > 0)
        printf("overhead of the sharded path with one rank: %.2f%% (target <= 3%%)\n", 100.0 * (1.0 - r1 / med[0]));
    /* a small all-reduce's time is the cost of issuing one (host and launch), not of moving data */
    for (int R = 2; R <= most; R *= 2) {
        printf("all-reduce of 1024 floats on %d ranks: %.4f ms\n", R, all_reduce_ms(device, R, 1024, SF_DTYPE_F32));
        /* what a layer's parts take in bf16 (reduce=auto in precision bf16) */
        if (cuda)
            printf("all-reduce of [%zu, %d] bf16 on %d ranks: %.4f ms\n", N, cfg.dim, R,
                   all_reduce_ms(device, R, reduce_count, SF_DTYPE_BF16));
    }
    free(tokens);
    sf_model_free(m);
    return 0;
}
