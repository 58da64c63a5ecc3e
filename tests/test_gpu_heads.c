/* Head-parallel blocks on GPUs with the NCCL communicator (block heads_of=R, one GPU a rank):
 *  - the communicator on one GPU (one rank): all-reduce, all-gather, broadcast, wait and fence
 *    leave the data as they should;
 *  - a rank that never joins: rank 0 of 2 alone ends with SF_E_COMM naming it within the
 *    timeout (3 s), never hangs;
 *  - heads_of=1 (the sharded code path, NCCL with one rank), also with overlap=4 (all-reduces on
 *    the communicator's stream), against the unsharded run on the same GPU, on small models of the
 *    GPU pipeline tests' kinds, f32, bf16 and fp8 (on GPUs that have it): within 1e-5 (f32), the
 *    bf16 tolerance 2e-2 and 5e-2 (fp8); a save and restore on heads_of=1 continues as the
 *    uninterrupted run;
 * with two GPUs or more, also:
 *  - heads_of=2 (its default overlap, and in bf16 also overlap=1 and 3, reduce=nccl, reduce=f32)
 *    against the unsharded run on one GPU (f32 1e-5, bf16 2e-2, fp8 5e-2), save and restore on 2 ranks
 *    against the uninterrupted run (1e-5, and whether byte-identical);
 *  - the parts' sum (reduce_add) on two GPUs with two sums in flight: by the copy engines bit
 *    for bit the host's float32 sums in rank order, through NCCL within bf16 rounding; every
 *    rank's rows identical;
 *  - a rank failing mid-stream (inject_failure=) ends the run with SF_E_COMM naming it, well
 *    within the timeout;
 *  - two ranks over the communicator where rank 1 aborts without telling rank 0 (no shared flag):
 *    rank 0's wait ends with SF_E_COMM by its timeout.
 * Without a GPU this prints "skipped: no GPU" and exits 77; without NCCL in the build, likewise
 * with that reason. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/comm.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"
#include "support/shard_runs.h"
#include "support/small_model.h"

#define SAME_F32 1e-5
#define TOL_BF16 2e-2
/* precision fp8 sharded against unsharded: where a rank's share of Wo's and W2's inputs is whole
 * blocks of 128 (fp8_blocks) both quantize alike; elsewhere each rank's share takes its own
 * channel scales, a different rounding of the same weights (each run lands within about 1e-2 of
 * the CPU's float32 in test_gpu_pipeline) */
#define TOL_FP8 5e-2

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the communicator ---------------------------------------------------------------------- */

static void check_one_rank(void)
{
    sf_backend *be = NULL;
    CHECK_OK(sf_backend_create("cuda", 0, &be));
    if (!be) return;
    unsigned char id[SF_COMM_NCCL_ID_BYTES];
    CHECK_OK(sf_comm_nccl_unique_id(id));
    sf_comm *c = NULL;
    CHECK_OK(sf_comm_nccl_create(be, id, 0, 1, 10000, &c));
    if (c) {
        float host[8], back[16];
        for (int i = 0; i < 8; i++) host[i] = (float)i + 0.5f;
        float *dev = be->ops->alloc(be, 16 * sizeof(float));
        CHECK_OK(be->ops->upload(be, dev, host, 8 * sizeof(float)));
        CHECK_OK(sf_comm_all_reduce(c, dev, 8, SF_DTYPE_F32));
        CHECK_OK(sf_comm_broadcast(c, dev, 8, SF_DTYPE_F32, 0));
        CHECK_OK(sf_comm_all_gather(c, dev, dev + 8, 8, SF_DTYPE_F32));
        CHECK_OK(sf_comm_fence(c));
        CHECK_OK(sf_comm_fence(c));
        CHECK_OK(sf_comm_wait(c));
        CHECK_OK(be->ops->download(be, back, dev, 16 * sizeof(float)));
        int same = 1;
        for (int i = 0; i < 16; i++) same &= back[i] == host[i % 8];
        CHECKF(same, "one-rank NCCL: the data changed (%g %g ... %g)", back[0], back[1], back[15]);
        be->ops->free(be, dev);
        sf_comm_free(c);
    }
    /* rank 0 of 2 alone: the other never joins */
    CHECK_OK(sf_comm_nccl_unique_id(id));
    c = NULL;
    const double start = now_ms();
    const int rc = sf_comm_nccl_create(be, id, 0, 2, 3000, &c);
    const double ms = now_ms() - start;
    CHECKF(rc == SF_E_COMM && !c && strstr(sf_last_error(), "never joined"), "a rank that never joins: %d (%s)", rc,
           sf_last_error());
    CHECKF(ms >= 2900 && ms < 15000, "a rank that never joins: ended after %.0f ms with a 3000 ms timeout", ms);
    printf("  NCCL, a rank that never joins: %.0f ms: %s\n", ms, sf_last_error());
    sf_comm_free(c);
    sf_backend_free(be);
}

typedef struct abort_job {
    int rank, rc;
    const unsigned char *id;
    double ms;
} abort_job;

/* Rank 1 aborts after two all-reduces without a flag rank 0 watches: rank 0 learns only from
 * its own timeout. */
static void *abort_main(void *arg)
{
    abort_job *j = arg;
    sf_backend *be = NULL;
    j->rc = sf_backend_create("cuda", j->rank, &be);
    sf_comm *c = NULL;
    if (j->rc == SF_OK) j->rc = sf_comm_nccl_create(be, j->id, j->rank, 2, 3000, &c);
    float *dev = be && j->rc == SF_OK ? be->ops->alloc(be, 1 << 20) : NULL;
    if (j->rc == SF_OK && dev) j->rc = be->ops->zero(be, dev, 1 << 20);
    const double start = now_ms();
    for (int i = 0; i < 50 && j->rc == SF_OK; i++) {
        if (j->rank == 1 && i == 2) {
            sf_comm_abort(c, "test: rank 1 stops");
            break;
        }
        j->rc = sf_comm_all_reduce(c, dev, (1 << 20) / sizeof(float), SF_DTYPE_F32);
        if (j->rc == SF_OK) j->rc = sf_comm_wait(c);
    }
    j->ms = now_ms() - start;
    if (be) be->ops->free(be, dev);
    sf_comm_free(c);
    sf_backend_free(be);
    return NULL;
}

static void check_abort_two_gpus(void)
{
    unsigned char id[SF_COMM_NCCL_ID_BYTES];
    CHECK_OK(sf_comm_nccl_unique_id(id));
    abort_job jobs[2] = {{0, 0, id, 0}, {1, 0, id, 0}};
    pthread_t t[2];
    for (int r = 0; r < 2; r++) pthread_create(&t[r], NULL, abort_main, &jobs[r]);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    CHECKF(jobs[0].rc == SF_E_COMM, "rank 0 after rank 1 aborted: %d", jobs[0].rc);
    CHECKF(jobs[0].ms < 15000, "rank 0 took %.0f ms to give up (timeout 3000 ms)", jobs[0].ms);
    printf("  NCCL, rank 1 aborts unannounced: rank 0 ended with %d after %.0f ms\n", jobs[0].rc, jobs[0].ms);
}

/* reduce_add on two GPUs (threads of this process), as the block issues it with overlap=2: two
 * chunks' sums in flight, the first chunk's rows summed twice. With the copy engines (allow 1,
 * where the GPUs have peer access) every rank's rows must be, bit for bit, the float32 sums the
 * host makes in rank order; through NCCL's bf16 all-reduce (allow 0), within its rounding. */
#define RA_ROWS 3000 /* elements a chunk: not a multiple of 8 in the tail chunk below */

typedef struct reduce_job {
    int rank, allow, copies, rc;
    const unsigned char *id;
    float rows[2 * RA_ROWS + 5]; /* the rows after the sums */
} reduce_job;

/* the parts of op k (0, 1, 2) of rank r, and the rows before */
static float ra_part(int r, int k, size_t i) { return (float)((int)((i * 7 + r * 13 + k * 5) % 97) - 48) / 64.0f; }
static float ra_row(size_t i) { return (float)((int)(i % 41) - 20) * 0.25f; }

static void *reduce_main(void *arg)
{
    reduce_job *j = arg;
    const size_t n0 = RA_ROWS, n1 = RA_ROWS + 5, total = n0 + n1;
    sf_backend *be = NULL;
    sf_comm *c = NULL;
    j->rc = sf_backend_create("cuda", j->rank, &be);
    if (j->rc == SF_OK) j->rc = sf_comm_nccl_create(be, j->id, j->rank, 2, 10000, &c);
    if (j->rc == SF_OK) j->rc = sf_comm_reduce_add_reserve(c, total, SF_DTYPE_BF16, j->allow, &j->copies);
    float *x = j->rc == SF_OK ? be->ops->alloc(be, total * sizeof(float)) : NULL;
    uint16_t *part = j->rc == SF_OK ? be->ops->alloc(be, total * 2) : NULL;
    uint16_t *host = malloc(total * 2);
    for (size_t i = 0; i < total; i++) j->rows[i] = ra_row(i);
    if (j->rc == SF_OK) j->rc = be->ops->upload(be, x, j->rows, total * sizeof(float));
    /* ops: 0 = rows [0, n0), 1 = rows [n0, total), 2 = rows [0, n0) again */
    const size_t off[3] = {0, n0, 0}, cnt[3] = {n0, n1, n0};
    int ticket[3] = {0};
    for (int k = 0; k < 3 && j->rc == SF_OK; k++) {
        for (size_t i = 0; i < cnt[k]; i++) host[i] = check_bf16_bits(ra_part(j->rank, k, off[k] + i));
        if (k == 2) j->rc = sf_comm_reduce_add_end(c, ticket[0], x + off[0], part + off[0], cnt[0], SF_DTYPE_BF16);
        if (j->rc == SF_OK) j->rc = be->ops->upload(be, part + off[k], host, cnt[k] * 2);
        if (j->rc == SF_OK) j->rc = sf_comm_reduce_add_start(c, part + off[k], cnt[k], SF_DTYPE_BF16, &ticket[k]);
    }
    for (int k = 1; k < 3 && j->rc == SF_OK; k++)
        j->rc = sf_comm_reduce_add_end(c, ticket[k], x + off[k], part + off[k], cnt[k], SF_DTYPE_BF16);
    if (j->rc == SF_OK) j->rc = sf_comm_wait(c);
    if (j->rc == SF_OK) j->rc = be->ops->download(be, j->rows, x, total * sizeof(float));
    free(host);
    if (be) be->ops->free(be, x), be->ops->free(be, part);
    sf_comm_free(c);
    sf_backend_free(be);
    return NULL;
}

static void check_reduce_add_two_gpus(void)
{
    const size_t n0 = RA_ROWS, total = 2 * RA_ROWS + 5;
    float *want = malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) {
        want[i] = ra_row(i);
        for (int k = 0; k < 3; k++) {
            if ((k == 1) != (i >= n0)) continue; /* ops 0 and 2 cover [0, n0), op 1 the rest */
            float s = check_bf16_float(check_bf16_bits(ra_part(0, k, i))); /* summed from rank 0's part */
            s += check_bf16_float(check_bf16_bits(ra_part(1, k, i)));
            want[i] += s;
        }
    }
    const int peer = check_gpu_peer(0, 1);
    for (int allow = 1; allow >= 0; allow--) {
        unsigned char id[SF_COMM_NCCL_ID_BYTES];
        CHECK_OK(sf_comm_nccl_unique_id(id));
        reduce_job *jobs = calloc(2, sizeof *jobs);
        pthread_t t[2];
        for (int r = 0; r < 2; r++) {
            jobs[r].rank = r, jobs[r].allow = allow, jobs[r].id = id;
            pthread_create(&t[r], NULL, reduce_main, &jobs[r]);
        }
        for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
        for (int r = 0; r < 2; r++)
            CHECKF(jobs[r].rc == SF_OK, "reduce_add (allow %d), rank %d: %d (%s)", allow, r, jobs[r].rc,
                   sf_last_error());
        CHECKF(jobs[0].copies == (allow && peer) && jobs[1].copies == jobs[0].copies,
               "reduce_add (allow %d): copies %d and %d, peer access %d", allow, jobs[0].copies, jobs[1].copies, peer);
        CHECKF(memcmp(jobs[0].rows, jobs[1].rows, total * sizeof(float)) == 0, "reduce_add (allow %d): ranks differ",
               allow);
        double worst = 0;
        for (size_t i = 0; i < total; i++) {
            const double d = fabs((double)jobs[0].rows[i] - want[i]) / (fabs(want[i]) + 1.0);
            if (d > worst) worst = d;
        }
        if (jobs[0].copies)
            CHECKF(worst == 0, "reduce_add by copies: %.3g from the host's float32 sums", worst);
        else
            CHECKF(worst <= 1e-2, "reduce_add by NCCL: %.3g from the host's float32 sums (bf16 sums)", worst);
        printf("  reduce_add on 2 GPUs, %s: %.2e from the host's sums, ranks identical\n",
               jobs[0].copies ? "copy engines" : "NCCL all-reduce", worst);
        free(jobs);
    }
    free(want);
}

/* ---- the pipeline --------------------------------------------------------------------------- */

/* Whether this GPU takes precision fp8 (compute capability 8.9 and up): asked once. */
static int fp8_here(void)
{
    static int known = -1;
    if (known < 0) {
        sf_backend *be = NULL;
        sf_backend_options opts = {.precision = SF_PRECISION_FP8};
        known = sf_backend_create_opts("cuda", &opts, &be) == SF_OK;
        sf_backend_free(be);
        if (!known) printf("  fp8 not run: %s\n", sf_last_error());
    }
    return known;
}

static void compare(const char *name, const sf_model *m, const shard_scenario *sc, uint64_t seed, int gpus)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim;
    uint32_t **tokens = shard_tokens(m, sc, seed);
    static const struct {
        sf_precision p;
        const char *label;
        double tol;
    } modes[] = {
        {SF_PRECISION_F32, "f32", SAME_F32}, {SF_PRECISION_BF16, "bf16", TOL_BF16}, {SF_PRECISION_FP8, "fp8", TOL_FP8}};
    for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
        if (modes[mi].p == SF_PRECISION_FP8 && !fp8_here()) continue;
        /* cuBLAS's own algorithm choice: the Lt plans are timed per graph and could differ */
        const shard_device gpu = {"cuda", modes[mi].p, "gemm=gemmex"};
        shard_outputs want;
        if (shard_run(m, &gpu, sc, "", tokens, &want, 0, NULL) != SF_OK) {
            shard_outputs_free(&want);
            continue;
        }
        /* overlap=K: the all-reduces on the communicator's own stream, joined chunk by chunk
         * (two ranks on GPUs chunk in 2 by default, in 1 where NCCL sums bf16 parts). In bf16
         * the ranks' parts are summed in bf16 by default, by the copy engines where the GPUs
         * have peer access; reduce=nccl sums them by NCCL's all-reduce; reduce=f32 sums float32
         * rows as f32 does. */
        static const struct {
            int ranks;
            const char *more;
        } runs[] = {{1, ""},           {1, " overlap=4"},   {2, ""},           {2, " overlap=1"},
                    {2, " overlap=3"}, {2, " reduce=nccl"}, {2, " reduce=f32"}};
        for (size_t ri = 0; ri < sizeof runs / sizeof *runs; ri++) {
            const int R = runs[ri].ranks;
            /* overlap in bf16 only, the mode it is for (time: each run starts its own ranks) */
            if (R > gpus || c->heads % R || c->mlp_hidden % R) continue;
            if (*runs[ri].more && modes[mi].p != SF_PRECISION_BF16) continue;
            char extra[96], label[48];
            snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=30000%s", R, runs[ri].more);
            snprintf(label, sizeof label, "%s R=%d%s", modes[mi].label, R, runs[ri].more);
            shard_outputs got;
            if (shard_run(m, &gpu, sc, extra, tokens, &got, 0, NULL) == SF_OK) {
                const double err = shard_worst_error(name, label, &got, &want, sc, D);
                CHECKF(err <= modes[mi].tol, "%s [%s] against unsharded on one GPU: relative error %.3g", name, label, err);
                printf("  %-44s %-20s vs unsharded GPU %.2e\n", name, label, err);
            }
            shard_outputs_free(&got);
        }
        shard_outputs_free(&want);
    }
    shard_tokens_free(tokens);
}

/* Saved and restored on R ranks against the uninterrupted R-rank run (f32). */
static void check_resume(const sf_model *m, int R)
{
    const size_t N = (size_t)sf_model_get_config(m)->segment, D = (size_t)sf_model_get_config(m)->dim;
    shard_scenario sc = {"segment ! embed ! block ! norm", 2, 3 * N + 9, 0};
    uint32_t **tokens = shard_tokens(m, &sc, 77);
    const shard_device gpu = {"cuda", SF_PRECISION_F32, "gemm=gemmex"};
    char extra[64];
    snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=30000", R);
    shard_outputs whole, resumed;
    if (shard_run(m, &gpu, &sc, extra, tokens, &whole, 0, NULL) == SF_OK &&
        shard_run(m, &gpu, &sc, extra, tokens, &resumed, N + N / 2, extra) == SF_OK) {
        const double err = shard_worst_error("resume", extra, &resumed, &whole, &sc, D);
        int exact = 1;
        for (int s = 0; s < sc.streams; s++) exact &= memcmp(resumed.x[s], whole.x[s], sc.tokens * D * sizeof(float)) == 0;
        CHECKF(err <= SAME_F32, "saved and restored on %d ranks: relative error %.3g against an uninterrupted run", R,
               err);
        printf("  save and restore on %d rank(s), f32: %.2e against uninterrupted (%s)\n", R, err,
               exact ? "byte-identical" : "not byte-identical");
    }
    shard_outputs_free(&whole), shard_outputs_free(&resumed);
    shard_tokens_free(tokens);
}

/* The last of two ranks fails after 2 segments: SF_E_COMM naming it, within the timeout. */
static void check_rank_failure(const sf_model *m)
{
    const size_t N = (size_t)sf_model_get_config(m)->segment;
    shard_scenario sc = {"segment ! embed ! block ! norm", 1, 8 * N, 0};
    uint32_t **tokens = shard_tokens(m, &sc, 5);
    const shard_device gpu = {"cuda", SF_PRECISION_BF16, NULL};
    sf_graph *g = shard_graph(m, &gpu, &sc, "heads_of=2 comm_timeout=10000 inject_failure=2");
    const double start = now_ms();
    int rc = SF_OK;
    for (size_t at = 0; g && at < sc.tokens && rc == SF_OK; at += N) {
        rc = sf_graph_push(g, 0, tokens[0] + at, N);
        for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        }
    }
    if (g && rc == SF_OK) rc = sf_graph_end(g, 0);
    const double ms = now_ms() - start;
    CHECKF(rc == SF_E_COMM && strstr(sf_last_error(), "rank 1 of 2 failed"),
           "rank 1 of 2 failing after 2 segments: %d (%s)", rc, sf_last_error());
    CHECKF(ms < 10000, "the failure took %.0f ms to end the run (timeout 10000 ms)", ms);
    printf("  2 GPUs, rank 1 fails after 2 segments: ended in %.0f ms: %s\n", ms, sf_last_error());
    sf_graph_free(g);
    shard_tokens_free(tokens);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    if (!sf_comm_nccl_available()) return check_skip("this build has no NCCL");
    const int gpus = check_gpu_count();
    printf("  %d GPU(s) visible\n", gpus);
    check_one_rank();
    static const check_model_variant variants[] = {
        {"3 branches causal delta", "8:1,16:2,32:4", 32, 4, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"linear memory, globals, 2 layers, MLP", "8:1,32:2", 24, 4, 8, 2, 1, 40, 6, 2, 1, 32, SF_MEMORY_LINEAR},
        {"no memory, globals 4/4, MLP", "16:1,32:4", 16, 4, 4, 2, 1, 24, 4, 4, 0, 32, SF_MEMORY_NONE},
        {"uncovered heads with globals, non-causal", "32:4", 24, 4, 8, 2, 0, 32, 5, 3, 1, 32, SF_MEMORY_DELTA},
        {"d=32 (bf16 kernel), delta, globals, MLP", "32:1,64:2,128:4", 96, 4, 32, 2, 1, 128, 8, 2, 1, 128,
         SF_MEMORY_DELTA},
        /* on an H100 the bf16 q/k/v path: attention reads K/V in place */
        {"d=64, causal delta, globals, MLP", "64:1,128:2,256:4", 128, 2, 64, 2, 1, 256, 16, 4, 1, 256, SF_MEMORY_DELTA},
        /* the attention's d = 128 form, one head a rank */
        {"d=128, causal delta, globals, MLP", "128:1,256:2,512:4", 256, 2, 128, 2, 1, 512, 16, 4, 1, 512,
         SF_MEMORY_DELTA},
    };
    sf_model *keep = NULL;
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        sf_model *m = NULL;
        CHECK_OK(check_variant_model(v, 1000 + i, &m));
        if (!m) continue;
        const size_t N = (size_t)v->segment;
        shard_scenario one = {"segment ! embed ! block ! norm", 1, 3 * N + 19, N + N / 2 + 1};
        compare(v->name, m, &one, i, gpus);
        if (i == 5) {
            shard_scenario split = {"segment ! embed ! block layers=0 ! block layers=1 ! norm", 1, 2 * N + 3, 0};
            compare("  same, one stage per layer", m, &split, i, gpus);
            shard_scenario batched = {"segment ! embed ! block batch=3 ! norm", 3, 3 * N + 5, 0};
            compare("  three streams, block batch=3", m, &batched, 200 + i, gpus);
        }
        if (i == 5) {
            keep = m;
            continue;
        }
        sf_model_free(m);
    }
    if (keep) {
        check_resume(keep, 1);
        if (gpus >= 2) {
            check_resume(keep, 2);
            check_rank_failure(keep);
        }
    }
    sf_model_free(keep);
    if (gpus >= 2)
        check_abort_two_gpus(), check_reduce_add_two_gpus();
    else printf("  one GPU: the two-rank checks are skipped (they need two GPUs)\n");
    return check_finish("test_gpu_heads");
}
