/* Head-parallel blocks on CPU ranks (threads, the host communicator) against the unsharded
 * pipeline: block heads_of=R for R = 1, 2, 4 on small models covering what the GPU pipeline tests
 * cover (memory delta, linear and none, global tokens, MLP on and off, causal and not, heads a
 * branch leaves uncovered, H*d != D, several layers, one stage a layer, a provisional flush, two
 * interleaved streams, three streams batched) must agree within 1e-5 (relative, L2) in float32;
 * R = 1 bit for bit; also with overlap= (the rows after attention in chunks) and in a threaded
 * run (a thread a stage). Also: a save on R ranks restored on R ranks continues as an uninterrupted
 * run, a restore on another number of ranks (or unsharded) is refused naming both; H or F
 * not divisible by R is refused naming them; the host communicator's collectives give
 * rank-ordered sums, a segment's first rows composed reach every rank (and the missing bf16
 * norm is refused), and a rank that never joins or aborts ends the others with SF_E_COMM
 * within the timeout. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/comm.h"
#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/shard_runs.h"
#include "support/small_model.h"

#define TOL 1e-5

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static const shard_device cpu = {"cpu", SF_PRECISION_F32, NULL};

static void compare(const char *name, const sf_model *m, const shard_scenario *sc, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim;
    uint32_t **tokens = shard_tokens(m, sc, seed);
    shard_outputs want;
    if (shard_run(m, &cpu, sc, "", tokens, &want, 0, NULL) == SF_OK) {
        /* overlap=K: the rows after attention in K chunks (the host communicator's all-reduces
         * are synchronous, so this checks the chunks' arithmetic and bookkeeping) */
        static const struct {
            int ranks;
            const char *more;
        } runs[] = {{1, ""}, {2, ""}, {4, ""}, {1, " overlap=4"}, {2, " overlap=3"}};
        for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
            const int R = runs[i].ranks;
            if (c->heads % R || c->mlp_hidden % R) continue;
            char extra[96], label[32];
            snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=20000%s", R, runs[i].more);
            snprintf(label, sizeof label, "R=%d%s", R, runs[i].more);
            shard_outputs got;
            if (shard_run(m, &cpu, sc, extra, tokens, &got, 0, NULL) == SF_OK) {
                const double err = shard_worst_error(name, label, &got, &want, sc, D);
                CHECKF(err <= TOL, "%s [%s]: relative error %.3g", name, label, err);
                if (R == 1 && !*runs[i].more)
                    CHECKF(err == 0, "%s [R=1]: not bit for bit the unsharded rows (%.3g)", name, err);
                printf("  %-46s %-15s rel err %.2e\n", name, label, err);
            }
            shard_outputs_free(&got);
        }
        shard_outputs_free(&want);
    }
    shard_tokens_free(tokens);
}

/* Saved on 2 ranks after part of the input and restored on 2: the rows of an uninterrupted
 * run; restored on 4 ranks or unsharded, or an unsharded save restored on 2: refused. */
static void check_resume(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim, N = (size_t)c->segment;
    shard_scenario sc = {"segment ! embed ! block ! norm", 2, 3 * N + 9, 0};
    uint32_t **tokens = shard_tokens(m, &sc, 77);
    shard_outputs whole, resumed, refused;
    if (shard_run(m, &cpu, &sc, "heads_of=2", tokens, &whole, 0, NULL) == SF_OK &&
        shard_run(m, &cpu, &sc, "heads_of=2", tokens, &resumed, N + N / 2, "heads_of=2") == SF_OK) {
        const double err = shard_worst_error("resume", "R=2", &resumed, &whole, &sc, D);
        CHECKF(err == 0, "saved and restored on 2 ranks: relative error %.3g against an uninterrupted run", err);
        printf("  %-46s R=2   resumed vs uninterrupted %.2e\n", "save on 2 ranks, restore on 2", err);
    }
    shard_outputs_free(&whole), shard_outputs_free(&resumed);
    static const struct {
        const char *before, *after, *words;
    } refusals[] = {{"heads_of=2", "heads_of=4", "saved by 2 head-parallel ranks"},
                    {"heads_of=2", "", "saved by 2 head-parallel ranks"},
                    {"", "heads_of=2", "saved without head parallelism"}};
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        const int rc = shard_run(m, &cpu, &sc, refusals[i].before, tokens, &refused, N, refusals[i].after);
        CHECKF(rc == SF_E_STATE && strstr(sf_last_error(), refusals[i].words),
               "saved with '%s', restored with '%s': %d (%s)", refusals[i].before, refusals[i].after, rc,
               sf_last_error());
        shard_outputs_free(&refused);
    }
    shard_tokens_free(tokens);
}

/* heads_of that does not divide H or F, and with a state budget: refused at parse time. */
static void check_refusals(const sf_model *m)
{
    static const struct {
        const char *block, *words;
    } cases[] = {{"block heads_of=3", "4 heads do not split over 3 ranks"},
                 {"block heads_of=8", "4 heads do not split over 8 ranks"},
                 {"block heads_of=2 state_budget=100000", "state_budget is not supported"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sf_graph_options opts = {.device = "cpu", .threads = 1};
        sf_graph *g = NULL;
        CHECK_OK(sf_graph_create(m, &opts, &g));
        char pipeline[128];
        snprintf(pipeline, sizeof pipeline, "segment ! embed ! %s ! norm", cases[i].block);
        const uint32_t token = 1;
        int rc = g ? sf_graph_parse(g, pipeline) : SF_E_INVAL;
        if (rc == SF_OK) rc = sf_graph_push(g, 0, &token, 1); /* the stages start here */
        CHECKF(rc == SF_E_OPTION && strstr(sf_last_error(), cases[i].words), "'%s': %d (%s)", pipeline, rc,
               sf_last_error());
        sf_graph_free(g);
    }
}

/* Threaded runs (sf_graph_run: a thread per stage, a source reading a file ahead of the block,
 * a sink writing raw rows) with heads_of=2 and overlap=2 against the unsharded one: 1e-5. */
static void check_threaded(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t tokens = 9 * (size_t)c->segment + 7, D = (size_t)c->dim;
    const char *input = check_tmp_path("heads_input.txt");
    FILE *f = fopen(input, "w");
    check_rng r = {99};
    for (size_t i = 0; f && i < tokens; i++) fprintf(f, "%llu ", (unsigned long long)(check_rng_next(&r) % (uint64_t)c->vocab));
    if (f) fclose(f);
    float *rows[2] = {NULL, NULL};
    static const char *const blocks[2] = {"block", "block heads_of=2 overlap=2 comm_timeout=20000"};
    for (int k = 0; k < 2; k++) {
        const char *out = check_tmp_path(k ? "heads_sharded.f32" : "heads_plain.f32");
        char pipeline[512];
        snprintf(pipeline, sizeof pipeline, "source path=%s format=text chunk=97 ! segment ! embed ! %s ! norm ! sink out=%s",
                 input, blocks[k], out);
        sf_graph_options opts = {.device = "cpu", .threads = 1};
        sf_graph *g = NULL;
        int rc = sf_graph_create(m, &opts, &g);
        if (rc == SF_OK) rc = sf_graph_parse(g, pipeline);
        if (rc == SF_OK) rc = sf_graph_run(g);
        CHECKF(rc == SF_OK, "threaded '%s': %s", blocks[k], g ? sf_graph_error(g) : sf_last_error());
        sf_graph_free(g);
        rows[k] = calloc(tokens * D, sizeof(float));
        FILE *in = fopen(out, "rb");
        const size_t got = in ? fread(rows[k], sizeof(float), tokens * D, in) : 0;
        if (in) fclose(in);
        CHECKF(got == tokens * D, "threaded '%s': %zu values, want %zu", blocks[k], got, tokens * D);
    }
    const double err = check_rel_err_f32(rows[1], rows[0], tokens * D);
    CHECKF(err <= TOL, "threaded heads_of=2 overlap=2 against unsharded: relative error %.3g", err);
    printf("  %-46s %-15s rel err %.2e\n", "threaded (a thread a stage, file in and out)", "R=2 overlap=2", err);
    free(rows[0]), free(rows[1]);
}

/* A rank that fails mid-stream (block inject_failure=): the run ends at once with SF_E_COMM
 * naming that rank, far within the timeout. */
static void check_rank_failure(const sf_model *m)
{
    const size_t N = (size_t)sf_model_get_config(m)->segment;
    shard_scenario sc = {"segment ! embed ! block ! norm", 1, 6 * N, 0};
    uint32_t **tokens = shard_tokens(m, &sc, 5);
    for (int R = 2; R <= 4; R *= 2) {
        char extra[96], words[64];
        snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=20000 inject_failure=2", R);
        snprintf(words, sizeof words, "rank %d of %d failed", R - 1, R);
        sf_graph *g = shard_graph(m, &cpu, &sc, extra);
        const double start = now_ms();
        int rc = SF_OK;
        for (size_t at = 0; g && at < sc.tokens && rc == SF_OK; at += N) {
            rc = sf_graph_push(g, 0, tokens[0] + at, N);
            for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
            }
        }
        const double ms = now_ms() - start;
        CHECKF(rc == SF_E_COMM && strstr(sf_last_error(), words) && strstr(sf_last_error(), "injected"),
               "R=%d, the last rank failing after 2 segments: %d (%s)", R, rc, sf_last_error());
        CHECKF(ms < 5000, "R=%d: the failure took %.0f ms to end the run", R, ms);
        printf("  R=%d, last rank fails after 2 segments: ended in %.0f ms: %s\n", R, ms, sf_last_error());
        sf_graph_free(g);
    }
    shard_tokens_free(tokens);
}

/* ---- the host communicator on its own --------------------------------------------------------- */

typedef struct comm_job {
    sf_comm *comm;
    int mode; /* 0 collectives, 1 abort after two all-reduces, 2 never join */
    int rc;
    double ms;
    float sum[5];
    float gathered[4 * 2];
    uint16_t bf[3];
    float got;
    int first_rc, bad_rc; /* first_rows composed (no bf16 norm here), and with -1 rows */
    float first_x[4];     /* the rows after it: rank 0's */
} comm_job;

static void *comm_main(void *arg)
{
    comm_job *j = arg;
    sf_comm *c = j->comm;
    const double start = now_ms();
    j->rc = SF_OK;
    if (j->mode == 2) return NULL; /* never joins */
    for (int round = 0; round < 6 && j->rc == SF_OK; round++) {
        if (j->mode == 1 && round == 2) {
            sf_comm_abort(c, "test abort");
            j->rc = SF_E_COMM;
            break;
        }
        /* rank r contributes 1e8 for r = 0, then 1, ...: the sum in rank order keeps (1e8 + 1) + 2 + ... = what it
         * is whatever order the threads come in */
        for (int i = 0; i < 5; i++) j->sum[i] = c->rank == 0 ? 1e8f : (float)(c->rank + i);
        j->rc = sf_comm_all_reduce(c, j->sum, 5, SF_DTYPE_F32);
        float mine[2] = {(float)c->rank, (float)(10 * c->rank)};
        if (j->rc == SF_OK) j->rc = sf_comm_all_gather(c, mine, j->gathered, 2, SF_DTYPE_F32);
        const int root = c->size > 1 ? 1 : 0;
        j->got = c->rank == root ? 42.0f : 0.0f;
        if (j->rc == SF_OK) j->rc = sf_comm_broadcast(c, &j->got, 1, SF_DTYPE_F32, root);
        for (int i = 0; i < 3; i++) j->bf[i] = 0x3f80; /* 1.0 in bf16 */
        if (j->rc == SF_OK) j->rc = sf_comm_all_reduce(c, j->bf, 3, SF_DTYPE_BF16);
        if (j->rc == SF_OK && c->size > 1) {
            /* a ring: send to the next, receive from the previous (sends do not wait) */
            float out = (float)c->rank, in = -1;
            j->rc = sf_comm_send(c, &out, 1, SF_DTYPE_F32, (c->rank + 1) % c->size);
            if (j->rc == SF_OK) j->rc = sf_comm_recv(c, &in, 1, SF_DTYPE_F32, (c->rank + c->size - 1) % c->size);
            if (j->rc == SF_OK && in != (float)((c->rank + c->size - 1) % c->size)) j->rc = SF_E_INVAL;
        }
    }
    if (j->rc == SF_OK && j->mode == 0) {
        /* a segment's first rows, composed: rank 0's rows broadcast, then the backend's bf16 norm,
         * which plain host memory has not: every rank gets the rows and the refusal */
        float x[4];
        for (int i = 0; i < 4; i++) x[i] = c->rank == 0 ? (float)(i + 1) : -1.0f;
        uint16_t u[4] = {0};
        j->bad_rc = sf_comm_first_rows(c, -1, 4, x, NULL, 1e-6f, u);
        j->first_rc = sf_comm_first_rows(c, 1, 4, x, NULL, 1e-6f, u);
        memcpy(j->first_x, x, sizeof x);
    }
    j->ms = now_ms() - start;
    return NULL;
}

static void run_comm(int size, int timeout_ms, const int *modes, comm_job *jobs)
{
    sf_comm *comms[8] = {0};
    CHECK_OK(sf_comm_host_create(size, NULL, timeout_ms, comms));
    pthread_t t[8];
    for (int r = 0; r < size; r++) {
        jobs[r] = (comm_job){.comm = comms[r], .mode = modes ? modes[r] : 0};
        pthread_create(&t[r], NULL, comm_main, &jobs[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < size; r++) sf_comm_free(comms[r]);
}

static void check_host_comm(void)
{
    comm_job jobs[8];
    for (int size = 1; size <= 4; size *= 2) {
        run_comm(size, 5000, NULL, jobs);
        for (int r = 0; r < size; r++) {
            CHECKF(jobs[r].rc == SF_OK, "host comm of %d, rank %d: %d (%s)", size, r, jobs[r].rc, sf_last_error());
            for (int i = 0; i < 5; i++) {
                float want = 1e8f;
                for (int q = 1; q < size; q++) want += (float)(q + i);
                CHECKF(jobs[r].sum[i] == want, "host comm of %d, rank %d: sum[%d] %.9g, want %.9g (rank order)", size, r,
                       i, jobs[r].sum[i], want);
            }
            for (int q = 0; q < size; q++)
                CHECKF(jobs[r].gathered[2 * q] == (float)q && jobs[r].gathered[2 * q + 1] == (float)(10 * q),
                       "host comm of %d, rank %d: gathered part %d is %g %g", size, r, q, jobs[r].gathered[2 * q],
                       jobs[r].gathered[2 * q + 1]);
            CHECKF(jobs[r].got == 42.0f, "broadcast: rank %d of %d got %g", r, size, jobs[r].got);
            const uint16_t want_bf = (uint16_t)(size == 1 ? 0x3f80 : size == 2 ? 0x4000 : 0x4080);
            CHECKF(jobs[r].bf[0] == want_bf, "host comm of %d: bf16 sum of ones 0x%04x, want 0x%04x", size, jobs[r].bf[0],
                   want_bf);
            CHECKF(jobs[r].bad_rc == SF_E_INVAL, "first_rows of -1 rows: %d", jobs[r].bad_rc);
            CHECKF(jobs[r].first_rc == SF_E_UNSUPPORTED, "first_rows on host memory (no bf16 norm): %d",
                   jobs[r].first_rc);
            for (int i = 0; i < 4; i++)
                CHECKF(jobs[r].first_x[i] == (float)(i + 1), "first_rows: rank %d of %d row[%d] %g, want rank 0's %d",
                       r, size, i, jobs[r].first_x[i], i + 1);
        }
    }
    /* rank 2 aborts after two rounds: the others fail at once with its reason */
    const int abort_modes[4] = {0, 0, 1, 0};
    run_comm(4, 20000, abort_modes, jobs);
    double noticed = 0;
    for (int r = 0; r < 4; r++) {
        if (jobs[r].ms > noticed) noticed = jobs[r].ms;
        CHECKF(jobs[r].rc == SF_E_COMM, "rank %d after rank 2 aborted: %d", r, jobs[r].rc);
        CHECKF(jobs[r].ms < 5000, "rank %d took %.0f ms to notice the abort", r, jobs[r].ms);
    }
    /* rank 1 never joins: the others time out (1 s) with SF_E_COMM */
    const int absent_modes[2] = {0, 2};
    double start = now_ms();
    run_comm(2, 1000, absent_modes, jobs);
    CHECKF(jobs[0].rc == SF_E_COMM && jobs[0].ms >= 900 && now_ms() - start < 10000,
           "a rank that never joins: rank 0 ended with %d after %.0f ms", jobs[0].rc, jobs[0].ms);
    printf("  host communicator: sums in rank order, abort noticed in %.0f ms, absent rank timed out after %.0f ms\n",
           noticed, jobs[0].ms);
}

int main(void)
{
    check_host_comm();
    static const check_model_variant variants[] = {
        {"3 branches causal delta", "8:1,16:2,32:4", 32, 4, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"3 branches non-causal delta", "8:1,16:2,32:4", 32, 4, 8, 1, 0, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"linear memory, globals, 2 layers, MLP", "8:1,32:2", 24, 4, 8, 2, 1, 40, 6, 2, 1, 32, SF_MEMORY_LINEAR},
        {"no memory, globals 4/4, MLP", "16:1,32:4", 16, 4, 4, 2, 1, 24, 4, 4, 0, 32, SF_MEMORY_NONE},
        {"uncovered heads (16:2)", "16:2", 24, 4, 8, 1, 1, 0, 0, 0, 1, 32, SF_MEMORY_DELTA},
        {"uncovered heads with globals, non-causal", "32:4", 24, 4, 8, 2, 0, 32, 5, 3, 1, 32, SF_MEMORY_DELTA},
        {"H*d != D, delta, globals, 3 layers", "8:1,16:2,32:4", 20, 4, 12, 3, 1, 28, 8, 4, 1, 32, SF_MEMORY_DELTA},
        {"d=32, delta, globals, MLP", "32:1,64:2,128:4", 64, 4, 32, 2, 1, 128, 8, 2, 1, 128, SF_MEMORY_DELTA},
    };
    sf_model *resume_model = NULL;
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        sf_model *m = NULL;
        CHECK_OK(check_variant_model(v, 1000 + i, &m));
        if (!m) continue;
        const size_t N = (size_t)v->segment;
        shard_scenario one = {"segment ! embed ! block ! norm", 1, 3 * N + 19, N + N / 2 + 1};
        compare(v->name, m, &one, i);
        if (v->layers > 1) {
            shard_scenario split = {v->layers == 2 ? "segment ! embed ! block layers=0 ! block layers=1 ! norm"
                                             : "segment ! embed ! block layers=0 ! block layers=1-2 ! norm",
                              1, 2 * N + 3, 0};
            compare("  same, one stage per layer", m, &split, i);
        }
        if (i == 2 || i == 7) {
            shard_scenario two = {"segment ! embed ! block ! norm", 2, 2 * N + 5, 0};
            compare("  two interleaved streams", m, &two, 100 + i);
            shard_scenario batched = {"segment ! embed ! block batch=3 ! norm", 3, 3 * N + 5, 0};
            compare("  three streams, block batch=3", m, &batched, 200 + i);
        }
        if (i == 2) {
            resume_model = m;
            continue;
        }
        sf_model_free(m);
    }
    if (resume_model) {
        check_resume(resume_model);
        check_refusals(resume_model);
        check_rank_failure(resume_model);
        check_threaded(resume_model);
    }
    sf_model_free(resume_model);
    return check_finish("test_heads");
}
