/* Head-parallel blocks on CPU ranks (threads, the host communicator) against the unsharded
 * pipeline: block heads_of=R for R = 1, 2, 4 on small models covering what the GPU pipeline tests
 * cover (memory delta, linear and none, global tokens, MLP on and off, causal and not, heads a
 * branch leaves uncovered, H*d != D, several layers, one stage a layer, a provisional flush, two
 * interleaved streams, three streams batched) must agree within 1e-5 (relative, L2) in float32;
 * R = 1 bit for bit. Also: a save on R ranks restored on R ranks continues as an uninterrupted
 * run, a restore on another number of ranks (or unsharded) is refused naming both; H or F
 * not divisible by R is refused naming them; the host communicator's collectives give
 * rank-ordered sums, and a rank that never joins or aborts ends the others with SF_E_COMM
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
#include "support/small_model.h"

#define TOL 1e-5
#define MAX_STREAMS 3

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct outputs {
    float *x[MAX_STREAMS];
    float *provisional;
    size_t prov_pos, prov_n;
} outputs;

typedef struct scenario {
    const char *pipeline; /* with %s where the block options go */
    int streams;
    size_t tokens;   /* per stream */
    size_t flush_at; /* stream 0 is flushed after this many tokens (0: never) */
} scenario;

static void collect(sf_graph *g, outputs *o, size_t tokens, int dim)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->stream >= MAX_STREAMS || p->n == 0) continue;
        const size_t bytes = p->n * (size_t)dim * sizeof(float);
        if (p->flags & SF_PACKET_PROVISIONAL) {
            if (p->stream != 0) continue;
            free(o->provisional);
            o->provisional = malloc(bytes);
            memcpy(o->provisional, p->x, bytes);
            o->prov_pos = p->position, o->prov_n = p->n;
            continue;
        }
        if (p->position + p->n <= tokens) memcpy(o->x[p->stream] + p->position * (size_t)dim, p->x, bytes);
    }
}

static void outputs_free(outputs *o)
{
    for (int s = 0; s < MAX_STREAMS; s++) free(o->x[s]);
    free(o->provisional);
    memset(o, 0, sizeof *o);
}

/* The pipeline with every "block" given `extra` options. */
static void with_options(const char *pipeline, const char *extra, char *out, size_t size)
{
    size_t used = 0;
    out[0] = 0;
    for (const char *p = pipeline; *p && used + 1 < size;) {
        const char *hit = strstr(p, "block");
        const size_t take = hit ? (size_t)(hit - p) + 5 : strlen(p);
        used += (size_t)snprintf(out + used, size - used, "%.*s%s%s", (int)take, p, hit && *extra ? " " : "",
                                 hit ? extra : "");
        p += take;
    }
}

/* Runs tokens [from, to) of every stream through g (in a fixed chunking). */
static void push_range(sf_graph *g, const scenario *sc, uint32_t *const *tokens, size_t from, size_t to, outputs *o,
                       int dim, int *flushed)
{
    for (size_t at = from, step = 7; at < to; at += step, step = step * 3 % 41 + 1) {
        size_t take = to - at < step ? to - at : step;
        for (int s = sc->streams - 1; s >= 0; s--) CHECK_OK(sf_graph_push(g, (uint64_t)s, tokens[s] + at, take));
        if (sc->flush_at && !*flushed && at + take >= sc->flush_at) {
            CHECK_OK(sf_graph_flush(g, 0));
            *flushed = 1;
        }
        collect(g, o, sc->tokens, dim);
    }
}

static sf_graph *make_graph(const sf_model *m, const scenario *sc, const char *extra)
{
    sf_graph_options opts = {.device = "cpu", .threads = 1};
    sf_graph *g = NULL;
    if (sf_graph_create(m, &opts, &g) != SF_OK) return NULL;
    char pipeline[512];
    with_options(sc->pipeline, extra, pipeline, sizeof pipeline);
    int rc = sf_graph_parse(g, pipeline);
    CHECKF(rc == SF_OK, "parse '%s': %s", pipeline, sf_last_error());
    if (rc != SF_OK) {
        sf_graph_free(g);
        return NULL;
    }
    return g;
}

static void outputs_alloc(outputs *o, const scenario *sc, size_t D)
{
    memset(o, 0, sizeof *o);
    for (int s = 0; s < sc->streams; s++) {
        o->x[s] = malloc(sc->tokens * D * sizeof(float));
        for (size_t i = 0; i < sc->tokens * D; i++) o->x[s][i] = NAN;
    }
}

/* The scenario with block options `extra`; with split > 0 the graph is saved after `split`
 * tokens and a new one (block options `extra_after`) restored from it runs the rest. */
static int run(const sf_model *m, const scenario *sc, const char *extra, uint32_t *const *tokens, outputs *o,
               size_t split, const char *extra_after)
{
    const size_t D = (size_t)sf_model_get_config(m)->dim;
    outputs_alloc(o, sc, D);
    sf_graph *g = make_graph(m, sc, extra);
    if (!g) return SF_E_INVAL;
    int flushed = 0;
    push_range(g, sc, tokens, 0, split ? split : sc->tokens, o, (int)D, &flushed);
    if (split) {
        sf_buffer state = {0};
        CHECK_OK(sf_graph_save(g, &state));
        collect(g, o, sc->tokens, (int)D);
        sf_graph_free(g);
        g = make_graph(m, sc, extra_after);
        int rc = g ? sf_graph_restore(g, state.data, state.len) : SF_E_INVAL;
        sf_buffer_release(&state);
        if (rc != SF_OK) {
            sf_graph_free(g);
            return rc;
        }
        push_range(g, sc, tokens, split, sc->tokens, o, (int)D, &flushed);
    }
    for (int s = 0; s < sc->streams; s++) CHECK_OK(sf_graph_end(g, (uint64_t)s));
    collect(g, o, sc->tokens, (int)D);
    sf_graph_free(g);
    return SF_OK;
}

static uint32_t **make_tokens(const sf_model *m, const scenario *sc, uint64_t seed)
{
    uint32_t **t = calloc(MAX_STREAMS, sizeof *t);
    check_rng r = {seed};
    for (int s = 0; s < sc->streams; s++) {
        t[s] = malloc(sc->tokens * sizeof(uint32_t));
        for (size_t i = 0; i < sc->tokens; i++)
            t[s][i] = (uint32_t)(check_rng_next(&r) % (uint64_t)sf_model_get_config(m)->vocab);
    }
    return t;
}

static void free_tokens(uint32_t **t)
{
    for (int s = 0; s < MAX_STREAMS; s++) free(t[s]);
    free(t);
}

/* The worst relative error of got against want over every stream (and the flushed rows). */
static double worst_error(const char *name, const char *label, const outputs *got, const outputs *want,
                          const scenario *sc, size_t D)
{
    double worst = 0;
    for (int s = 0; s < sc->streams; s++) {
        double err = check_rel_err_f32(got->x[s], want->x[s], sc->tokens * D);
        if (!(err <= worst)) worst = err;
    }
    if (sc->flush_at) {
        int same = got->provisional && want->provisional && got->prov_pos == want->prov_pos && got->prov_n == want->prov_n;
        CHECKF(same, "%s [%s]: the flush emitted different rows than unsharded", name, label);
        if (same) {
            double err = check_rel_err_f32(got->provisional, want->provisional, got->prov_n * D);
            if (!(err <= worst)) worst = err;
        }
    }
    return worst;
}

static void compare(const char *name, const sf_model *m, const scenario *sc, uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim;
    uint32_t **tokens = make_tokens(m, sc, seed);
    outputs want;
    if (run(m, sc, "", tokens, &want, 0, NULL) == SF_OK) {
        static const int ranks[] = {1, 2, 4};
        for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
            const int R = ranks[i];
            if (c->heads % R || c->mlp_hidden % R) continue;
            char extra[64], label[32];
            snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=20000", R);
            snprintf(label, sizeof label, "R=%d", R);
            outputs got;
            if (run(m, sc, extra, tokens, &got, 0, NULL) == SF_OK) {
                const double err = worst_error(name, label, &got, &want, sc, D);
                CHECKF(err <= TOL, "%s [%s]: relative error %.3g", name, label, err);
                if (R == 1) CHECKF(err == 0, "%s [R=1]: not bit for bit the unsharded rows (%.3g)", name, err);
                printf("  %-46s %-5s rel err %.2e\n", name, label, err);
            }
            outputs_free(&got);
        }
        outputs_free(&want);
    }
    free_tokens(tokens);
}

/* Saved on 2 ranks after part of the input and restored on 2: the rows of an uninterrupted
 * run; restored on 4 ranks or unsharded, or an unsharded save restored on 2: refused. */
static void check_resume(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t D = (size_t)c->dim, N = (size_t)c->segment;
    scenario sc = {"segment ! embed ! block ! norm", 2, 3 * N + 9, 0};
    uint32_t **tokens = make_tokens(m, &sc, 77);
    outputs whole, resumed, refused;
    if (run(m, &sc, "heads_of=2", tokens, &whole, 0, NULL) == SF_OK &&
        run(m, &sc, "heads_of=2", tokens, &resumed, N + N / 2, "heads_of=2") == SF_OK) {
        const double err = worst_error("resume", "R=2", &resumed, &whole, &sc, D);
        CHECKF(err == 0, "saved and restored on 2 ranks: relative error %.3g against an uninterrupted run", err);
        printf("  %-46s R=2   resumed vs uninterrupted %.2e\n", "save on 2 ranks, restore on 2", err);
    }
    outputs_free(&whole), outputs_free(&resumed);
    static const struct {
        const char *before, *after, *words;
    } refusals[] = {{"heads_of=2", "heads_of=4", "saved by 2 head-parallel ranks"},
                    {"heads_of=2", "", "saved by 2 head-parallel ranks"},
                    {"", "heads_of=2", "saved without head parallelism"}};
    for (size_t i = 0; i < sizeof refusals / sizeof *refusals; i++) {
        const int rc = run(m, &sc, refusals[i].before, tokens, &refused, N, refusals[i].after);
        CHECKF(rc == SF_E_STATE && strstr(sf_last_error(), refusals[i].words),
               "saved with '%s', restored with '%s': %d (%s)", refusals[i].before, refusals[i].after, rc,
               sf_last_error());
        outputs_free(&refused);
    }
    free_tokens(tokens);
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

/* A rank that fails mid-stream (block inject_failure=): the run ends at once with SF_E_COMM
 * naming that rank, far within the timeout. */
static void check_rank_failure(const sf_model *m)
{
    const size_t N = (size_t)sf_model_get_config(m)->segment;
    scenario sc = {"segment ! embed ! block ! norm", 1, 6 * N, 0};
    uint32_t **tokens = make_tokens(m, &sc, 5);
    for (int R = 2; R <= 4; R *= 2) {
        char extra[96], words[64];
        snprintf(extra, sizeof extra, "heads_of=%d comm_timeout=20000 inject_failure=2", R);
        snprintf(words, sizeof words, "rank %d of %d failed", R - 1, R);
        sf_graph *g = make_graph(m, &sc, extra);
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
    free_tokens(tokens);
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
        scenario one = {"segment ! embed ! block ! norm", 1, 3 * N + 19, N + N / 2 + 1};
        compare(v->name, m, &one, i);
        if (v->layers > 1) {
            scenario split = {v->layers == 2 ? "segment ! embed ! block layers=0 ! block layers=1 ! norm"
                                             : "segment ! embed ! block layers=0 ! block layers=1-2 ! norm",
                              1, 2 * N + 3, 0};
            compare("  same, one stage per layer", m, &split, i);
        }
        if (i == 2 || i == 7) {
            scenario two = {"segment ! embed ! block ! norm", 2, 2 * N + 5, 0};
            compare("  two interleaved streams", m, &two, 100 + i);
            scenario batched = {"segment ! embed ! block batch=3 ! norm", 3, 3 * N + 5, 0};
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
    }
    sf_model_free(resume_model);
    return check_finish("test_heads");
}
