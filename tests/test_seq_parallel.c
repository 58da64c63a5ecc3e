/* Sequence parallelism (stages/block_seq.h) over ranks that are threads (the host
 * communicator), against one process's pipeline `segment ! embed ! block ! norm`:
 *  - the scan: 2, 3 and 4 ranks, delta, linear and no memory, causal and not, with and without
 *    global tokens, equal and unequal chunks, a stream ending in a partial segment: every
 *    segment's rows within 1e-5 (relative, L2); two runs of the same layout bit for bit alike;
 *  - the hand-off: bit for bit one process's rows;
 *  - groups (datacenters) with gateways: exact within 1e-5; int8 and int4 tiers within their
 *    bound, their error not growing over 10,000 segments (error feedback); federation runs and
 *    its divergence is reported;
 *  - a saved round state restored on another number of ranks continues the stream;
 *  - the memory maps alone: segments composed in any grouping against the sequential update,
 *    in double (1e-12) and against the float32 update (1e-5); a map from its parts the same bits,
 *    the update from the parts within 1e-5 of the float32 update;
 *  - a rank that fails ends the others with an error, not a hang;
 *  - the overlap: the attention in two halves (kernels/attention_parts.h) gives the whole op's
 *    bits; more layers than round totals may wait (SEQ_PENDING), 4 and 8 ranks, run to run alike;
 *  - one group beyond 16 ranks (the binomial tree): 17 and 20 ranks within 1e-5, run to run alike. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_parts.h"
#include "kernels/comm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/memory_map.h"
#include "seqflow/seqflow.h"
#include "stages/block_seq.h"
#include "support/check.h"
#include "support/shard_runs.h"
#include "support/small_model.h"

#define TOL 1e-5
#define MAX_RANKS 20
#define SF_SEQ_FLAT_RANKS_TEST 16 /* stages/block_seq_internal.h: the flat scan's most ranks */

typedef struct job {
    const sf_model *m;
    const uint32_t *tokens;
    float *out; /* [tokens][D] */
    sf_seq_plan plan;
    sf_seq_options o;
    int fail_rank;            /* this rank stops after its first round (-1: none) */
    const uint8_t *restore;   /* every rank restores this state, then runs from restore_round */
    size_t restore_len;
    uint64_t restore_round;
    uint64_t stop_round;      /* > 0: every rank stops before this round; rank 0 saves into saved */
    sf_buffer *saved;
} job;

typedef struct rank_arg {
    job *j;
    sf_comm *comm;
    int rc;
    char err[256];
    sf_seq_stats stats;
} rank_arg;

static int io_read(void *user, uint64_t pos, size_t n, uint32_t *ids)
{
    memcpy(ids, ((job *)user)->tokens + pos, n * sizeof *ids);
    return SF_OK;
}

static int io_write(void *user, uint64_t pos, size_t n, const float *rows)
{
    job *j = user;
    const size_t D = (size_t)sf_model_get_config(j->m)->dim;
    memcpy(j->out + pos * D, rows, n * D * sizeof *rows);
    return SF_OK;
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    job *j = a->j;
    sf_backend *be = NULL;
    sf_seq *q = NULL;
    int rc = sf_backend_create_opts("cpu", &(sf_backend_options){.threads = 1}, &be);
    if (rc == SF_OK) rc = sf_seq_create(j->m, be, a->comm, &j->o, &q);
    if (rc == SF_OK && j->restore) rc = sf_seq_state_restore(q, j->restore, j->restore_len);
    sf_seq_plan plan = j->plan;
    int chunk[MAX_RANKS]; /* this rank's own copy: a balanced plan changes it */
    memcpy(chunk, j->plan.chunk, (size_t)plan.ranks * sizeof *chunk);
    plan.chunk = chunk;
    if (j->stop_round) { /* a plan cut at stop_round rounds */
        uint64_t per = 0;
        for (int r = 0; r < plan.ranks; r++) per += (uint64_t)plan.chunk[r];
        const uint64_t cut = j->stop_round * per * (uint64_t)plan.N;
        if (cut < plan.tokens) plan.tokens = cut;
    }
    sf_seq_io io = {io_read, io_write, NULL, j};
    if (rc == SF_OK && a->comm->rank == j->fail_rank) {
        uint64_t first;
        int count, last_rows;
        sf_seq_plan_chunk(&plan, 0, a->comm->rank, &first, &count, &last_rows);
        rc = sf_error(SF_E_BACKEND, "rank %d: failing on purpose", a->comm->rank);
        sf_comm_abort(a->comm, sf_last_error());
    }
    if (rc == SF_OK) rc = sf_seq_run(q, j->m, &plan, j->restore ? j->restore_round : 0, &io);
    if (rc == SF_OK && j->stop_round && a->comm->rank == 0) rc = sf_seq_state_save(q, j->saved);
    if (rc != SF_OK) snprintf(a->err, sizeof a->err, "%s", sf_last_error());
    if (q) sf_seq_stats_get(q, &a->stats);
    a->rc = rc;
    sf_seq_free(q);
    sf_backend_free(be);
    sf_comm_free(a->comm);
    return NULL;
}

/* Runs job j on R ranks; the first failing rank's code, SF_OK when all succeeded. */
static int run_job(job *j, int R, sf_seq_stats *stats)
{
    sf_comm *comms[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    rank_arg args[MAX_RANKS];
    int rc = sf_comm_host_create(R, NULL, 20000, comms);
    if (rc != SF_OK) return rc;
    for (int r = 0; r < R; r++) {
        args[r] = (rank_arg){.j = j, .comm = comms[r]};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    rc = SF_OK;
    for (int r = 0; r < R; r++) {
        pthread_join(th[r], NULL);
        if (args[r].rc != SF_OK && rc == SF_OK) {
            rc = args[r].rc;
            sf_error(rc, "rank %d: %s", r, args[r].err);
        }
        if (stats && r == 0) *stats = args[r].stats;
    }
    return rc;
}

/* the worst relative error (L2) of any segment's rows */
static double worst_segment_error(const float *got, const float *want, size_t tokens, size_t N, size_t D)
{
    double worst = 0;
    for (size_t s0 = 0; s0 < tokens; s0 += N) {
        const size_t n = tokens - s0 < N ? tokens - s0 : N;
        double e = 0, w = 0;
        for (size_t i = s0 * D; i < (s0 + n) * D; i++) {
            const double diff = (double)got[i] - want[i];
            e += diff * diff, w += (double)want[i] * want[i];
            if (got[i] != got[i]) e = INFINITY;
        }
        const double rel = sqrt(e) / (sqrt(w) + 1e-30);
        if (rel > worst) worst = rel;
    }
    return worst;
}

static float *reference(const sf_model *m, const uint32_t *tokens, size_t n)
{
    shard_scenario sc = {"segment ! embed ! block ! norm", 1, n, 0};
    uint32_t *streams[1] = {(uint32_t *)tokens};
    shard_outputs o;
    float *x = NULL;
    if (shard_run(m, &(shard_device){"cpu", SF_PRECISION_F32, NULL}, &sc, "", streams, &o, 0, NULL) == SF_OK) {
        const size_t D = (size_t)sf_model_get_config(m)->dim;
        x = malloc(n * D * sizeof *x);
        memcpy(x, o.x[0], n * D * sizeof *x);
    }
    shard_outputs_free(&o);
    return x;
}

static uint32_t *random_tokens(size_t n, int vocab, uint64_t seed)
{
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        t[i] = (uint32_t)(seed % (uint64_t)vocab);
    }
    return t;
}

typedef struct layout {
    const char *name;
    int R;
    int chunk[MAX_RANKS];
    sf_seq_exchange exchange;
    int groups[MAX_RANKS]; /* all 0: one group */
    int balance;           /* the split follows the ranks' measured speed */
} layout;

/* Every layout of `layouts` on model variant v against one process. */
static void check_variant(const check_model_variant *v, size_t tokens, const layout *layouts, int n_layouts)
{
    sf_model *m = NULL;
    if (check_variant_model(v, 1234, &m) != SF_OK) {
        CHECKF(0, "%s: model: %s", v->name, sf_last_error());
        return;
    }
    const size_t D = (size_t)v->dim, N = (size_t)v->segment;
    uint32_t *tok = random_tokens(tokens, 50, 99 + tokens);
    float *want = reference(m, tok, tokens), *got = malloc(tokens * D * sizeof *got), *again = malloc(tokens * D * sizeof *again);
    CHECKF(want != NULL, "%s: reference run failed", v->name);
    for (int i = 0; want && i < n_layouts; i++) {
        const layout *lo = &layouts[i];
        job j = {.m = m, .tokens = tok, .out = got, .plan = {tokens, (int)N, lo->R, (int *)lo->chunk, lo->balance},
                 .fail_rank = -1};
        j.o.exchange = lo->exchange, j.o.group_of = lo->groups;
        for (size_t k = 0; k < tokens * D; k++) got[k] = NAN;
        int rc = run_job(&j, lo->R, NULL);
        CHECKF(rc == SF_OK, "%s [%s]: %s", v->name, lo->name, sf_last_error());
        if (rc != SF_OK) continue;
        const double err = worst_segment_error(got, want, tokens, N, D);
        if (lo->exchange == SF_SEQ_HANDOFF)
            CHECKF(memcmp(got, want, tokens * D * sizeof *got) == 0, "%s [%s]: not bit for bit one process's (%.3g)",
                   v->name, lo->name, err);
        CHECKF(err <= TOL, "%s [%s]: relative error %.3g", v->name, lo->name, err);
        printf("  %-34s %-26s rel err %.2e\n", v->name, lo->name, err);
        if (i == 0) { /* run to run: the same bits */
            j.out = again;
            rc = run_job(&j, lo->R, NULL);
            CHECKF(rc == SF_OK && memcmp(got, again, tokens * D * sizeof *got) == 0,
                   "%s [%s]: two runs differ", v->name, lo->name);
        }
    }
    free(want), free(got), free(again), free(tok);
    sf_model_free(m);
}

/* The attention in two halves against the whole op: branches, partial segments, global tokens,
 * causal or not, the same bits. */
static void check_attention_parts(void)
{
    sf_backend *be = NULL;
    if (sf_backend_create_opts("cpu", &(sf_backend_options){.threads = 2}, &be) != SF_OK) {
        CHECKF(0, "attention parts: backend: %s", sf_last_error());
        return;
    }
    enum { N = 32, H = 4, d = 8, W = H * d, G = 5 };
    static const sf_branch br[] = {{8, 1}, {16, 2}, {32, 4}};
    static float q[N * W], k[N * W], v[N * W], gk[G * W], gv[G * W], whole[N * W], parts[N * W], acc[N * W];
    static float ml[2 * H * N];
    float *all[] = {q, k, v, gk, gv};
    const size_t sizes[] = {N * W, N * W, N * W, G * W, G * W};
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int a = 0; a < 5; a++)
        for (size_t i = 0; i < sizes[a]; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            all[a][i] = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
        }
    int cases = 0;
    for (int causal = 0; causal < 2; causal++)
        for (int n = 13; n <= N; n += N - 13)
            for (int g = 0; g <= G; g += G) {
                const sf_attention_desc desc = {.n = n, .segment = N, .heads = H, .head_dim = d, .ld = W, .causal = causal,
                                                .n_branches = 3, .branches = br, .n_global = g, .global_ld = W,
                                                .gk = g ? gk : NULL, .gv = g ? gv : NULL, .scale = 1.0f / sqrtf((float)d)};
                memset(whole, 0, sizeof whole), memset(parts, 0xff, sizeof parts);
                int rc = be->ops->attention(be, &desc, q, k, v, whole);
                if (rc == SF_OK) rc = sf_attention_local(be, &desc, q, k, v, acc, ml);
                if (rc == SF_OK) rc = sf_attention_finish(be, &desc, q, acc, ml, parts);
                CHECKF(rc == SF_OK, "attention parts: %s", sf_last_error());
                CHECKF(memcmp(whole, parts, (size_t)n * W * sizeof *whole) == 0,
                       "attention parts (causal %d, n %d, %d global): not the whole op's bits", causal, n, g);
                cases++;
            }
    printf("  attention in two halves: the whole op's bits in %d cases\n", cases);
    sf_backend_free(be);
}

/* The overlap's bookkeeping: more layers than round totals may wait, ranks of unequal chunks,
 * and one group beyond SF_SEQ_FLAT_RANKS (the binomial tree); each within 1e-5, twice alike. */
static void check_overlap_and_tree(void)
{
    static const layout layouts[][1] = {
        {{"scan R=4 chunks 3,1,2,1", 4, {3, 1, 2, 1}, SF_SEQ_SCAN, {0}, 0}},
        {{"scan R=8", 8, {1, 1, 1, 1, 1, 1, 1, 1}, SF_SEQ_SCAN, {0}, 0}},
        {{"scan R=17 (tree)", 17, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, SF_SEQ_SCAN, {0}, 0}},
        {{"scan R=20 (tree) unequal", 20, {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1}, SF_SEQ_SCAN,
          {0}, 0}},
    };
    /* name, branches, D, H, d, layers, causal, mlp, global, summary, final_norm, segment, memory */
    static const check_model_variant deep = {"delta, 5 layers", "8:1,16:2", 32, 4, 8, 5, 1, 64, 6, 2, 1, 16,
                                             SF_MEMORY_DELTA};
    static const check_model_variant lin = {"linear global", "8:2,16:1", 24, 3, 8, 2, 0, 48, 3, 1, 1, 16,
                                            SF_MEMORY_LINEAR};
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        /* every rank holds a chunk in at least two rounds, the last one partial */
        const size_t tokens = 61 * (size_t)deep.segment + 7;
        check_variant(&deep, tokens, layouts[i], 1);
        if (layouts[i][0].R > SF_SEQ_FLAT_RANKS_TEST) check_variant(&lin, tokens, layouts[i], 1);
    }
}

static void check_layouts(void)
{
    static const layout layouts[] = {
        {"scan R=2", 2, {2, 2}, SF_SEQ_SCAN, {0}, 0},
        {"scan R=3 chunks 1,3,2", 3, {1, 3, 2}, SF_SEQ_SCAN, {0}, 0},
        {"scan R=4", 4, {1, 1, 1, 1}, SF_SEQ_SCAN, {0}, 0},
        {"scan R=4 2 groups", 4, {2, 1, 1, 2}, SF_SEQ_SCAN, {0, 0, 1, 1}, 0},
        {"scan R=3 3 groups", 3, {1, 2, 1}, SF_SEQ_SCAN, {0, 1, 2}, 0},
        {"hand-off R=2", 2, {2, 1}, SF_SEQ_HANDOFF, {0}, 0},
        {"hand-off R=3 2 groups", 3, {1, 1, 2}, SF_SEQ_HANDOFF, {0, 0, 1}, 0},
        {"scan R=3 balanced", 3, {2, 2, 2}, SF_SEQ_SCAN, {0}, 1},
        {"hand-off R=2 balanced", 2, {3, 3}, SF_SEQ_HANDOFF, {0}, 1},
    };
    const int n = (int)(sizeof layouts / sizeof *layouts);
    /* name, branches, D, H, d, layers, causal, mlp, global, summary, final_norm, segment, memory */
    static const check_model_variant variants[] = {
        {"delta causal global", "8:1,16:2", 32, 4, 8, 2, 1, 64, 6, 2, 1, 16, SF_MEMORY_DELTA},
        {"delta bidirectional", "8:1,16:4", 32, 4, 8, 2, 0, 64, 0, 0, 1, 16, SF_MEMORY_DELTA},
        {"linear causal global", "16:1", 32, 2, 16, 2, 1, 0, 4, 4, 0, 16, SF_MEMORY_LINEAR},
        {"linear bidirectional global", "8:2,16:1", 24, 3, 8, 3, 0, 48, 3, 1, 1, 16, SF_MEMORY_LINEAR},
        {"no memory, global tokens", "8:1", 16, 2, 8, 2, 1, 32, 5, 2, 1, 8, SF_MEMORY_NONE},
    };
    for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
        /* 23 segments and 5 tokens: rounds that end inside a chunk and a partial last segment */
        const size_t tokens = 23 * (size_t)variants[v].segment + 5;
        check_variant(&variants[v], tokens, layouts, n);
    }
}

/* The maps alone: random k, v; the sequential update (double) against maps of every segment
 * composed in groups of 1, 2, 3, applied at the end. */
static void check_maps(void)
{
    const int H = 2, d = 8, n = 12, segs = 7, ld = H * d;
    const size_t hdd = (size_t)H * d * d, hd = (size_t)H * d;
    uint64_t seed = 42;
    float *k = malloc((size_t)segs * n * ld * sizeof *k), *v = malloc((size_t)segs * n * ld * sizeof *v);
    for (size_t i = 0; i < (size_t)segs * n * ld; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        k[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
        v[i] = (float)((double)(seed >> 5 & 0xffff) / 65536.0 * 2 - 1);
    }
    for (int kind = SF_MEMORY_LINEAR; kind <= SF_MEMORY_DELTA; kind++) {
        /* sequential: the float32 CPU update, and the maps of one segment each applied in turn */
        float *M = calloc(hdd, sizeof *M), *z = calloc(hd, sizeof *z);
        double *Md = calloc(hdd, sizeof *Md), *A = malloc(hdd * sizeof *A), *B = malloc(hdd * sizeof *B);
        float *zs = malloc((size_t)(segs + 1) * hd * sizeof *zs), *zinc = malloc(hd * sizeof *zinc);
        /* the map in parts (sf_memory_map_parts): its composition the same bits, its update
         * (Mp, zp) within 1e-5 of the float32 update */
        float *Mp = calloc(hdd, sizeof *Mp), *zp = calloc(hd, sizeof *zp), *sk = malloc((size_t)n * ld * sizeof *sk);
        float *P = malloc(hdd * sizeof *P), *G = malloc(hdd * sizeof *G), *zinc2 = malloc(hd * sizeof *zinc2);
        double *A2 = malloc(hdd * sizeof *A2), *B2 = malloc(hdd * sizeof *B2);
        for (int s = 0; s < segs; s++) {
            memcpy(zs + (size_t)s * hd, z, hd * sizeof *z);
            sf_memory_map_identity(H, d, kind == SF_MEMORY_DELTA ? A : NULL, B);
            sf_memory_map_segment(kind, n, H, d, ld, k + (size_t)s * n * ld, v + (size_t)s * n * ld, z,
                                  kind == SF_MEMORY_DELTA ? A : NULL, B, zinc, 1);
            sf_memory_sigma(n, H, d, ld, k + (size_t)s * n * ld, sk, zinc2);
            CHECKF(memcmp(zinc, zinc2, hd * sizeof *zinc) == 0, "maps: sf_memory_sigma's z increment differs");
            sf_memory_map_identity(H, d, kind == SF_MEMORY_DELTA ? A2 : NULL, B2);
            CHECK(sf_memory_map_parts(kind, n, H, d, ld, sk, v + (size_t)s * n * ld, zp, P, G, 1) == SF_OK);
            CHECK(sf_memory_map_then_parts(kind, H, d, P, G, kind == SF_MEMORY_DELTA ? A2 : NULL, B2) == SF_OK);
            CHECKF(memcmp(B, B2, hdd * sizeof *B) == 0 && (kind != SF_MEMORY_DELTA || memcmp(A, A2, hdd * sizeof *A) == 0),
                   "maps: composed from parts, not the segment map's bits");
            CHECK(sf_memory_update_parts(kind, H, d, P, G, zinc2, Mp, zp) == SF_OK);
            sf_memory_map_apply(H, d, kind == SF_MEMORY_DELTA ? A : NULL, B, Md);
            sf_cpu_memory_update(NULL, kind, n, H, d, ld, k + (size_t)s * n * ld, v + (size_t)s * n * ld, M, z);
            for (size_t i = 0; i < hd; i++)
                CHECKF(z[i] == zs[(size_t)s * hd + i] + zinc[i], "maps: z increment differs from the update's");
            CHECKF(memcmp(z, zp, hd * sizeof *z) == 0, "maps: the update from parts has another z");
        }
        double ep = 0, np = 0;
        for (size_t i = 0; i < hdd; i++) ep += ((double)Mp[i] - M[i]) * ((double)Mp[i] - M[i]), np += (double)M[i] * M[i];
        ep = sqrt(ep / np);
        CHECKF(np > 0 && ep < 1e-5, "maps (%s): the update from parts is %.3g from the float32 update",
               kind == SF_MEMORY_DELTA ? "delta" : "linear", ep);
        printf("  maps %-6s update from parts: %.2e from the float32 update\n", kind == SF_MEMORY_DELTA ? "delta" : "linear",
               ep);
        free(Mp), free(zp), free(sk), free(P), free(G), free(zinc2), free(A2), free(B2);
        /* composed in groups of g, then applied once */
        for (int g = 1; g <= 3; g++) {
            double *Mg = calloc(hdd, sizeof *Mg), *Ag = malloc(hdd * sizeof *Ag), *Bg = malloc(hdd * sizeof *Bg);
            double *At = malloc(hdd * sizeof *At), *Bt = malloc(hdd * sizeof *Bt);
            sf_memory_map_identity(H, d, kind == SF_MEMORY_DELTA ? At : NULL, Bt);
            for (int s0 = 0; s0 < segs; s0 += g) {
                sf_memory_map_identity(H, d, kind == SF_MEMORY_DELTA ? Ag : NULL, Bg);
                for (int s = s0; s < s0 + g && s < segs; s++)
                    sf_memory_map_segment(kind, n, H, d, ld, k + (size_t)s * n * ld, v + (size_t)s * n * ld,
                                          zs + (size_t)s * hd, kind == SF_MEMORY_DELTA ? Ag : NULL, Bg, NULL, 1);
                sf_memory_map_then(H, d, kind == SF_MEMORY_DELTA ? Ag : NULL, Bg, kind == SF_MEMORY_DELTA ? At : NULL, Bt);
            }
            sf_memory_map_apply(H, d, kind == SF_MEMORY_DELTA ? At : NULL, Bt, Mg);
            double e64 = 0, n64 = 0, e32 = 0;
            for (size_t i = 0; i < hdd; i++) {
                e64 += (Mg[i] - Md[i]) * (Mg[i] - Md[i]), n64 += Md[i] * Md[i];
                e32 += (Mg[i] - M[i]) * (Mg[i] - M[i]);
            }
            e64 = sqrt(e64 / n64), e32 = sqrt(e32 / n64);
            CHECKF(e64 < 1e-12, "maps (%s, groups of %d): %.3g from the sequential maps in double",
                   kind == SF_MEMORY_DELTA ? "delta" : "linear", g, e64);
            CHECKF(e32 < 1e-5, "maps (%s, groups of %d): %.3g from the float32 update",
                   kind == SF_MEMORY_DELTA ? "delta" : "linear", g, e32);
            printf("  maps %-6s groups of %d: %.2e (double), %.2e (float32 update)\n",
                   kind == SF_MEMORY_DELTA ? "delta" : "linear", g, e64, e32);
            free(Mg), free(Ag), free(Bg), free(At), free(Bt);
        }
        free(M), free(z), free(Md), free(A), free(B), free(zs), free(zinc);
    }
    free(k), free(v);
}

/* Lossy tiers between two groups on a long stream: the error within the bound and not growing
 * (the last tenth of the stream no worse than 3x the first tenth); federation reported. */
static void check_tiers(void)
{
    const check_model_variant v = {"tiny delta", "4:1", 16, 2, 8, 1, 1, 0, 2, 1, 1, 4, SF_MEMORY_DELTA};
    const check_model_variant vl = {"tiny linear", "4:1", 16, 2, 8, 1, 1, 0, 2, 1, 1, 4, SF_MEMORY_LINEAR};
    const check_model_variant *vs[2] = {&v, &vl};
    const size_t segments = 10000, N = 4, tokens = segments * N, D = 16;
    for (int vi = 0; vi < 2; vi++) {
        sf_model *m = NULL;
        if (check_variant_model(vs[vi], 5, &m) != SF_OK) continue;
        uint32_t *tok = random_tokens(tokens, 50, 7);
        float *want = reference(m, tok, tokens), *got = malloc(tokens * D * sizeof *got);
        static int chunk[2] = {25, 25};
        static const int groups[2] = {0, 1};
        static const struct {
            const char *name;
            sf_quant_kind kind;
            int federation;
            double bound;
        } tiers[] = {{"exact", SF_QUANT_F32, 0, TOL},          {"bf16", SF_QUANT_BF16, 0, 1e-3},
                     {"int8", SF_QUANT_INT8, 0, 1e-3},        {"fp8", SF_QUANT_FP8_E4M3, 0, 1e-2},
                     {"int4", SF_QUANT_INT4, 0, 1e-2},        {"federation", SF_QUANT_F32, 1, INFINITY}};
        for (size_t t = 0; want && t < sizeof tiers / sizeof *tiers; t++) {
            job j = {.m = m, .tokens = tok, .out = got, .plan = {tokens, (int)N, 2, chunk}, .fail_rank = -1};
            j.o.group_of = groups, j.o.tier = (sf_quant_params){tiers[t].kind, 64}, j.o.federation = tiers[t].federation;
            sf_seq_stats st;
            int rc = run_job(&j, 2, &st);
            CHECKF(rc == SF_OK, "%s tier %s: %s", vs[vi]->name, tiers[t].name, sf_last_error());
            if (rc != SF_OK) continue;
            const size_t tenth = tokens / 10;
            const double first = worst_segment_error(got, want, tenth, N, D);
            const double last = worst_segment_error(got + (tokens - tenth) * D, want + (tokens - tenth) * D, tenth, N, D);
            const double all = worst_segment_error(got, want, tokens, N, D);
            printf("  %-12s tier %-10s worst rel err %.2e (first tenth %.2e, last tenth %.2e), %.1f bytes/token across\n",
                   vs[vi]->name, tiers[t].name, all, first, last, (double)st.sent_across / (double)tokens * 2);
            CHECKF(all <= tiers[t].bound, "%s tier %s: error %.3g over its bound %.3g", vs[vi]->name, tiers[t].name, all,
                   tiers[t].bound);
            if (tiers[t].kind != SF_QUANT_F32)
                CHECKF(last <= 3 * first + 1e-6, "%s tier %s: the error grows along the stream (%.3g, then %.3g)",
                       vs[vi]->name, tiers[t].name, first, last);
        }
        free(want), free(got), free(tok);
        sf_model_free(m);
    }
}

/* Stopped after 3 rounds on 3 ranks, the state saved, restored on 2 ranks (other chunks): the
 * rest of the stream as an uninterrupted run within 1e-5; hand-off: saved and restored bit for bit. */
static void check_restore(void)
{
    const check_model_variant v = {"delta global", "8:1,16:2", 32, 4, 8, 2, 1, 64, 6, 2, 1, 16, SF_MEMORY_DELTA};
    sf_model *m = NULL;
    if (check_variant_model(&v, 77, &m) != SF_OK) return;
    const size_t N = 16, D = 32, tokens = 40 * N + 3;
    uint32_t *tok = random_tokens(tokens, 50, 3);
    float *want = reference(m, tok, tokens), *got = malloc(tokens * D * sizeof *got);
    for (int mode = 0; want && mode < 2; mode++) {
        const sf_seq_exchange ex = mode ? SF_SEQ_HANDOFF : SF_SEQ_SCAN;
        static int c3[3] = {2, 1, 1}, c2[2] = {1, 3};
        sf_buffer saved_buf = {0}, *saved = &saved_buf;
        job j = {.m = m, .tokens = tok, .out = got, .plan = {tokens, (int)N, 3, c3}, .fail_rank = -1};
        j.o.exchange = ex, j.stop_round = 3, j.saved = saved;
        int rc = run_job(&j, 3, NULL);
        /* hand-off: the last rank holds the round state; rank 0's save is what a scan would hold */
        if (ex == SF_SEQ_HANDOFF) {
            CHECKF(rc == SF_OK, "restore (hand-off) first part: %s", sf_last_error());
            sf_buffer_release(saved);
            continue;
        }
        CHECKF(rc == SF_OK, "restore: first part: %s", sf_last_error());
        /* the second part: tokens from 12 segments on, on 2 ranks */
        job k = {.m = m, .tokens = tok, .out = got, .plan = {tokens, (int)N, 2, c2}, .fail_rank = -1};
        k.o.exchange = ex, k.restore = saved->data, k.restore_len = saved->len;
        /* 3 rounds of 4 segments = 12 segments; the new plan has 4 a round too: round 3 on */
        k.restore_round = 3;
        if (rc == SF_OK) rc = run_job(&k, 2, NULL);
        CHECKF(rc == SF_OK, "restore: second part: %s", sf_last_error());
        const double err = rc == SF_OK ? worst_segment_error(got, want, tokens, N, D) : INFINITY;
        CHECKF(err <= TOL, "restore on 2 ranks after 3: relative error %.3g", err);
        printf("  saved on 3 ranks, restored on 2: rel err %.2e\n", err);
        sf_buffer_release(saved);
    }
    free(want), free(got), free(tok);
    sf_model_free(m);
}

/* A rank that fails: every rank returns an error within the communicator's timeout. */
static void check_failure(void)
{
    const check_model_variant v = {"delta", "8:1", 16, 2, 8, 2, 1, 0, 0, 0, 1, 8, SF_MEMORY_DELTA};
    sf_model *m = NULL;
    if (check_variant_model(&v, 1, &m) != SF_OK) return;
    const size_t tokens = 30 * 8;
    uint32_t *tok = random_tokens(tokens, 50, 1);
    float *got = malloc(tokens * 16 * sizeof *got);
    static int chunk[3] = {2, 2, 2};
    for (int mode = 0; mode < 2; mode++) {
        job j = {.m = m, .tokens = tok, .out = got, .plan = {tokens, 8, 3, chunk}, .fail_rank = 1};
        j.o.exchange = mode ? SF_SEQ_HANDOFF : SF_SEQ_SCAN;
        const int rc = run_job(&j, 3, NULL);
        CHECKF(rc != SF_OK, "a failing rank went unnoticed (%s)", mode ? "hand-off" : "scan");
        printf("  a failing rank (%s): %s\n", mode ? "hand-off" : "scan", sf_last_error());
    }
    free(tok), free(got);
    sf_model_free(m);
}

int main(void)
{
    check_maps();
    check_attention_parts();
    check_overlap_and_tree();
    check_layouts();
    check_restore();
    check_failure();
    check_tiers();
    return check_finish("test_seq_parallel");
}
