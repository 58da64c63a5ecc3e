/* A pipeline's saved state (sf_graph_save / sf_graph_restore) on the CUDA backend, mid-stream.
 *
 * Where the backend has a side queue, block issues a layer's commit (memory update, global-token
 * push) late: during the next layer, and the last layer's possibly only with the next segment, a
 * save, a restore or the end of a stream. Nothing in a segment's output depends on its own
 * commit, so a save that forgot a waiting one would lose a segment of the last layer's memory
 * and no output comparison would notice until after a restore. Hence, for three small models
 * (test_gpu_pipeline's d=64 one, which takes the bf16 in-place path on an H100; 4 layers with an
 * MLP, delta memory and global tokens; 2 layers of linear memory), in f32 and bf16, and three
 * scripts (one stream; two interleaved; a stream that ends and a new one that reuses its state):
 *  - each save on the GPU holds what the CPU's holds after the same tokens: the same streams
 *    (none that ended), ring counters and segment positions exactly, and M, z and the global
 *    keys and values of every layer to 1e-4 (f32) / 2e-2 (bf16), layer by layer;
 *  - between consecutive CPU saves the last layer's M moves by far more than that tolerance, so
 *    a save one segment behind cannot pass;
 *  - saving changes nothing that follows (the saving run against one without saves);
 *  - the state restored into a fresh graph, and into a graph that has just run (a commit may
 *    wait there), continues as the uninterrupted run does (1e-5 / 2e-2) and as the CPU does,
 *    and its later saves equal the saving run's.
 * Without a GPU this prints "skipped: no GPU" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/gpu.h"
#include "support/small_model.h"

#define TOL_F32 1e-4  /* GPU against CPU */
#define TOL_BF16 2e-2
#define SAME_F32 1e-5 /* GPU against GPU: a resumed or saving run against an uninterrupted one */
#define SAME_BF16 2e-2
/* How many bf16 tolerances the last layer's M must move between consecutive saves */
#define MOVE_FACTOR 10.0
#define MAX_STREAMS 3
#define MAX_STEPS 32
#define MAX_SAVES 4

static const char *const device_under_test = "cuda";

/* ---- scripts ------------------------------------------------------------------------------ */

typedef enum step_kind { STEP_SEGMENT, STEP_HALF, STEP_END, STEP_SAVE } step_kind;

typedef struct step {
    step_kind kind;
    int stream;
} step;

typedef struct script {
    const char *name;
    step steps[MAX_STEPS];
    int n_steps;
    int save_step[MAX_SAVES]; /* step index of each save */
    int n_saves;
    int resume_save;            /* the save that resumed runs restore */
    size_t tokens[MAX_STREAMS]; /* what each stream takes over the whole script */
} script;

/* Words: segK (a full segment of stream K), halfK (half a segment), endK (sf_graph_end), save,
 * resume (a save that the resumed runs restore, then play what follows). */
static int parse_script(const char *name, const char *text, size_t N, script *sc)
{
    memset(sc, 0, sizeof *sc);
    sc->name = name;
    sc->resume_save = -1;
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        int len = (int)strcspn(p, " "), stream = -1;
        step st = {STEP_SAVE, -1};
        if (sscanf(p, "seg%d", &stream) == 1) st.kind = STEP_SEGMENT;
        else if (sscanf(p, "half%d", &stream) == 1) st.kind = STEP_HALF;
        else if (sscanf(p, "end%d", &stream) == 1) st.kind = STEP_END;
        else if (!(len == 4 && !strncmp(p, "save", 4)) && !(len == 6 && !strncmp(p, "resume", 6))) return -1;
        if (st.kind != STEP_SAVE && (stream < 0 || stream >= MAX_STREAMS)) return -1;
        if (sc->n_steps == MAX_STEPS) return -1;
        st.stream = stream;
        if (st.kind == STEP_SAVE) {
            if (sc->n_saves == MAX_SAVES) return -1;
            if (p[0] == 'r') sc->resume_save = sc->n_saves;
            sc->save_step[sc->n_saves++] = sc->n_steps;
        }
        if (st.kind == STEP_SEGMENT) sc->tokens[stream] += N;
        if (st.kind == STEP_HALF) sc->tokens[stream] += N / 2;
        sc->steps[sc->n_steps++] = st;
        p += len;
    }
    return sc->resume_save >= 0 ? 0 : -1;
}

/* Each stream's position before step `at`. */
static void positions_before(const script *sc, int at, size_t N, size_t *pos)
{
    memset(pos, 0, MAX_STREAMS * sizeof *pos);
    for (int i = 0; i < at; i++) {
        if (sc->steps[i].kind == STEP_SEGMENT) pos[sc->steps[i].stream] += N;
        if (sc->steps[i].kind == STEP_HALF) pos[sc->steps[i].stream] += N / 2;
    }
}

/* Whether `stream` has taken tokens and not ended before step `at`: what a save there holds. */
static int live_before(const script *sc, int at, int stream)
{
    int live = 0;
    for (int i = 0; i < at; i++) {
        if (sc->steps[i].stream != stream) continue;
        live = sc->steps[i].kind != STEP_END;
    }
    return live;
}

/* ---- running a script --------------------------------------------------------------------- */

typedef struct run {
    float *x[MAX_STREAMS];      /* committed rows by position; NaN where none arrived */
    sf_buffer saves[MAX_SAVES]; /* by save ordinal; empty where the run took none */
} run;

static void run_init(run *r, const script *sc, size_t D)
{
    memset(r, 0, sizeof *r);
    for (int s = 0; s < MAX_STREAMS; s++) {
        size_t n = sc->tokens[s] * D;
        r->x[s] = malloc((n ? n : 1) * sizeof(float));
        for (size_t i = 0; i < n; i++) r->x[s][i] = NAN;
    }
}

static void run_free(run *r)
{
    for (int s = 0; s < MAX_STREAMS; s++) free(r->x[s]);
    for (int i = 0; i < MAX_SAVES; i++) sf_buffer_release(&r->saves[i]);
}

static sf_graph *new_graph(const sf_model *m, const char *device, sf_precision precision)
{
    sf_graph_options opts = {.device = device, .precision = precision};
    sf_graph *g = NULL;
    int rc = sf_graph_create(m, &opts, &g);
    CHECKF(rc == SF_OK, "graph on %s: %s", device, sf_last_error());
    if (rc != SF_OK) return NULL;
    rc = sf_graph_parse(g, "segment ! embed ! block ! norm");
    CHECKF(rc == SF_OK, "pipeline on %s: %s", device, sf_last_error());
    if (rc != SF_OK) {
        sf_graph_free(g);
        return NULL;
    }
    return g;
}

static void collect(sf_graph *g, run *r, const script *sc, size_t D)
{
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        if (p->kind != SF_PACKET_HIDDEN || p->n == 0 || (p->flags & SF_PACKET_PROVISIONAL)) continue;
        const int fits = p->stream < MAX_STREAMS && p->width == D && p->position + p->n <= sc->tokens[p->stream];
        CHECKF(fits, "%s: a packet of stream %llu at %llu (%zu rows) that the script never fed", sc->name,
               (unsigned long long)p->stream, (unsigned long long)p->position, p->n);
        if (fits) memcpy(r->x[p->stream] + p->position * D, p->x, p->n * D * sizeof(float));
    }
}

/* Plays steps [from, end) of the script into g, pulling every output after each step; takes
 * the script's saves when take_saves is set. The chunks are uneven so that the segment stage
 * assembles segments from pieces. */
static void play(sf_graph *g, const script *sc, int from, uint32_t *const *tokens, size_t N, size_t D, int take_saves,
                 run *r)
{
    size_t pos[MAX_STREAMS];
    positions_before(sc, from, N, pos);
    for (int i = from, save = 0; i < sc->n_steps; i++) {
        const step *st = &sc->steps[i];
        while (save < sc->n_saves && sc->save_step[save] < i) save++;
        if (st->kind == STEP_SEGMENT || st->kind == STEP_HALF) {
            size_t n = st->kind == STEP_SEGMENT ? N : N / 2, first = n / 3 + 1;
            const uint32_t *t = tokens[st->stream] + pos[st->stream];
            CHECK_OK(sf_graph_push(g, (uint64_t)st->stream, t, first));
            CHECK_OK(sf_graph_push(g, (uint64_t)st->stream, t + first, n - first));
            pos[st->stream] += n;
        } else if (st->kind == STEP_END) {
            CHECK_OK(sf_graph_end(g, (uint64_t)st->stream));
        } else if (take_saves) {
            int rc = sf_graph_save(g, &r->saves[save]);
            CHECKF(rc == SF_OK, "%s: save %d: %s", sc->name, save, sf_last_error());
        }
        collect(g, r, sc, D);
    }
}

/* ---- saved states (pipeline/graph.c sf_graph_save, stages/segment.c, stages/block.c) ------ */

typedef struct saved_stream {
    uint64_t id;
    float *M, *z, *gk, *gv;    /* [layers][H][d][d], [layers][H][d], [layers][G][H*d] twice */
    int32_t *g_count, *g_head; /* [layers] */
} saved_stream;

typedef struct saved_segment {
    uint64_t id, segment, pending;
} saved_segment;

typedef struct saved_state {
    uint32_t first, layers;
    int n_block, n_segment;
    saved_stream block[MAX_STREAMS];
    saved_segment segment[MAX_STREAMS];
} saved_state;

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static int take(reader *r, void *dst, size_t n)
{
    if (r->left < n) return 0;
    if (dst) memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return 1;
}

/* Copies, since the blob's floats sit at whatever offset the stage names leave them. */
static float *take_floats(reader *r, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (f && !take(r, f, n * sizeof *f)) {
        free(f);
        return NULL;
    }
    return f;
}

static void saved_state_free(saved_state *s)
{
    for (int i = 0; i < s->n_block; i++) {
        saved_stream *b = &s->block[i];
        free(b->M), free(b->z), free(b->gk), free(b->gv), free(b->g_count), free(b->g_head);
    }
    memset(s, 0, sizeof *s);
}

static int parse_segment_state(reader *r, saved_state *s)
{
    uint32_t count;
    if (!take(r, &count, 4) || count > MAX_STREAMS) return 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t head[3];
        if (!take(r, head, sizeof head) || head[2] > r->left / 4 || !take(r, NULL, head[2] * 4)) return 0;
        s->segment[s->n_segment++] = (saved_segment){head[0], head[1], head[2]};
    }
    return r->left == 0;
}

static int parse_block_state(reader *r, saved_state *s, const sf_model_config *c)
{
    uint32_t head[3];
    if (!take(r, head, sizeof head) || head[0] > MAX_STREAMS) return 0;
    s->first = head[1], s->layers = head[2];
    const size_t L = head[2], H = (size_t)c->heads, d = (size_t)c->head_dim;
    const size_t nM = L * H * d * d, nz = L * H * d, ng = L * (size_t)c->global_tokens * H * d;
    for (uint32_t i = 0; i < head[0]; i++) {
        saved_stream *b = &s->block[s->n_block++];
        if (!take(r, &b->id, 8)) return 0;
        b->M = take_floats(r, nM);
        b->z = take_floats(r, nz);
        b->g_count = malloc(L * sizeof(int32_t) + 1), b->g_head = malloc(L * sizeof(int32_t) + 1);
        if (!b->M || !b->z || !b->g_count || !b->g_head) return 0;
        if (!take(r, b->g_count, L * sizeof(int32_t)) || !take(r, b->g_head, L * sizeof(int32_t))) return 0;
        b->gk = take_floats(r, ng);
        b->gv = take_floats(r, ng);
        if (!b->gk || !b->gv) return 0;
    }
    return r->left == 0;
}

/* The graph blob: per stateful stage u32 index, u32 name length, name, u64 length, state. */
static int parse_state(const char *label, const sf_buffer *blob, const sf_model_config *c, saved_state *s)
{
    memset(s, 0, sizeof *s);
    reader r = {blob->data, blob->len};
    int seen_segment = 0, seen_block = 0, ok = blob->len > 0;
    while (ok && r.left > 0) {
        uint32_t index, name_len;
        uint64_t len;
        char name[16] = {0};
        ok = take(&r, &index, 4) && take(&r, &name_len, 4) && name_len < sizeof name && take(&r, name, name_len) &&
             take(&r, &len, 8) && len <= r.left;
        if (!ok) break;
        reader part = {r.p, (size_t)len};
        take(&r, NULL, (size_t)len);
        if (!strcmp(name, "segment") && !seen_segment) ok = seen_segment = parse_segment_state(&part, s);
        else if (!strcmp(name, "block") && !seen_block) ok = seen_block = parse_block_state(&part, s, c);
        else ok = 0;
    }
    ok = ok && seen_segment && seen_block;
    CHECKF(ok, "%s: the saved state (%zu bytes) is not segment and block state of the documented layout", label,
           blob->len);
    if (!ok) saved_state_free(s);
    return ok;
}

static const saved_stream *find_block(const saved_state *s, uint64_t id)
{
    for (int i = 0; i < s->n_block; i++)
        if (s->block[i].id == id) return &s->block[i];
    return NULL;
}

static const saved_segment *find_segment(const saved_state *s, uint64_t id)
{
    for (int i = 0; i < s->n_segment; i++)
        if (s->segment[i].id == id) return &s->segment[i];
    return NULL;
}

/* A save holds exactly the streams that were fed and had not ended, in both stages. */
static void check_live_streams(const char *label, const saved_state *s, const script *sc, int save)
{
    for (int id = 0; id < MAX_STREAMS; id++) {
        const int live = live_before(sc, sc->save_step[save], id);
        const int in_block = find_block(s, (uint64_t)id) != NULL, in_segment = find_segment(s, (uint64_t)id) != NULL;
        CHECKF(in_block == live && in_segment == live,
               "%s save %d: stream %d is %s, but the block state %s it and the segment state %s it", label, save, id,
               live ? "live" : "ended or unseen", in_block ? "holds" : "lacks", in_segment ? "holds" : "lacks");
    }
}

/* got against want: the same streams, ring counters and segment positions exactly; M, z and
 * the global keys and values of each layer to tol. Returns the worst relative error. */
static double compare_states(const char *label, const saved_state *got, const saved_state *want,
                             const sf_model_config *c, double tol)
{
    CHECKF(got->first == want->first && got->layers == want->layers && got->n_block == want->n_block &&
               got->n_segment == want->n_segment,
           "%s: layers %u+%u and %d/%d streams (block/segment), want %u+%u and %d/%d", label, got->first, got->layers,
           got->n_block, got->n_segment, want->first, want->layers, want->n_block, want->n_segment);
    for (int i = 0; i < want->n_segment; i++) {
        const saved_segment *w = &want->segment[i], *g = find_segment(got, w->id);
        CHECKF(g && g->segment == w->segment && g->pending == w->pending,
               "%s: segment stage, stream %llu: segment %lld with %lld pending, want %llu with %llu", label,
               (unsigned long long)w->id, g ? (long long)g->segment : -1LL, g ? (long long)g->pending : -1LL,
               (unsigned long long)w->segment, (unsigned long long)w->pending);
    }
    if (got->layers != want->layers) return INFINITY;
    const size_t H = (size_t)c->heads, d = (size_t)c->head_dim, gw = (size_t)c->global_tokens * H * d;
    const size_t sizes[4] = {H * d * d, H * d, gw, gw};
    static const char *const parts[4] = {"M", "z", "global keys", "global values"};
    double worst = 0;
    for (int i = 0; i < want->n_block; i++) {
        const saved_stream *w = &want->block[i], *g = find_block(got, w->id);
        CHECKF(g != NULL, "%s: stream %llu missing from the block state", label, (unsigned long long)w->id);
        if (!g) continue;
        uint32_t differs = 0;
        while (differs < want->layers && g->g_count[differs] == w->g_count[differs] &&
               g->g_head[differs] == w->g_head[differs])
            differs++;
        const uint32_t at = differs < want->layers ? differs : 0; /* the message's arguments are always read */
        CHECKF(differs == want->layers,
               "%s: stream %llu layer %u: global-token ring count %d head %d, want count %d head %d", label,
               (unsigned long long)w->id, want->first + at, g->g_count[at], g->g_head[at], w->g_count[at],
               w->g_head[at]);
        const float *gp[4] = {g->M, g->z, g->gk, g->gv}, *wp[4] = {w->M, w->z, w->gk, w->gv};
        for (uint32_t l = 0; l < want->layers; l++)
            for (int p = 0; p < 4; p++) {
                if (!sizes[p]) continue;
                double err = check_rel_err_f32(gp[p] + l * sizes[p], wp[p] + l * sizes[p], sizes[p]);
                CHECKF(err <= tol, "%s: stream %llu layer %u: %s relative error %.3g (tolerance %.0e)", label,
                       (unsigned long long)w->id, want->first + l, parts[p], err, tol);
                if (!(err <= worst)) worst = err;
            }
    }
    return worst;
}

/* Every stream that two consecutive saves share advanced between them (the scripts are written
 * so): its last layer's M must have moved well beyond the loosest tolerance, or a save that
 * missed the latest segment's update of that layer would pass. Returns the smallest move. */
static double check_memory_moves(const char *label, const saved_state *earlier, const saved_state *later,
                                 const sf_model_config *c)
{
    const size_t hdd = (size_t)c->heads * c->head_dim * c->head_dim, last = later->layers - 1;
    double least = INFINITY;
    for (int i = 0; i < later->n_block; i++) {
        const saved_stream *now = &later->block[i], *before = find_block(earlier, now->id);
        if (!before || later->layers == 0) continue;
        double moved = check_rel_err_f32(before->M + last * hdd, now->M + last * hdd, hdd);
        CHECKF(moved >= MOVE_FACTOR * TOL_BF16,
               "%s: stream %llu: the last layer's M moved only %.3g between saves; a save missing a segment of it "
               "would pass the %.0e tolerance",
               label, (unsigned long long)now->id, moved, TOL_BF16);
        if (moved < least) least = moved;
    }
    return least;
}

/* ---- comparisons of outputs --------------------------------------------------------------- */

/* Rows [from[s], end of script) of every stream; returns the worst relative error. */
static double compare_rows(const char *label, const run *got, const run *want, const script *sc, const size_t *from,
                           size_t D, double tol)
{
    double worst = 0;
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (sc->tokens[s] <= from[s]) continue;
        const size_t n = (sc->tokens[s] - from[s]) * D;
        double err = check_rel_err_f32(got->x[s] + from[s] * D, want->x[s] + from[s] * D, n);
        CHECKF(err <= tol, "%s: stream %d rows %zu..%zu: relative error %.3g (tolerance %.0e)", label, s, from[s],
               sc->tokens[s], err, tol);
        if (!(err <= worst)) worst = err;
    }
    return worst;
}

/* ---- one model, one script, one precision on the GPU -------------------------------------- */

typedef struct reference {
    run cpu;
    saved_state states[MAX_SAVES];
} reference;

/* A run resumed from the saving run's resume state, in g: its rows against the uninterrupted
 * run and the CPU, its later saves against the saving run's and the CPU's. Returns the worst
 * row error against the uninterrupted run. */
static double check_resumed(const char *label, sf_graph *g, const sf_model *m, const script *sc,
                            uint32_t *const *tokens, const run *saving, const run *straight, const reference *ref,
                            double tol, double same)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment, D = (size_t)c->dim;
    const sf_buffer *blob = &saving->saves[sc->resume_save];
    int rc = sf_graph_restore(g, blob->data, blob->len);
    CHECKF(rc == SF_OK, "%s: restore: %s", label, sf_last_error());
    if (rc != SF_OK) return INFINITY;
    run resumed;
    run_init(&resumed, sc, D);
    const int from = sc->save_step[sc->resume_save] + 1;
    play(g, sc, from, tokens, N, D, 1, &resumed);
    size_t pos[MAX_STREAMS];
    positions_before(sc, from, N, pos);
    char what[256];
    snprintf(what, sizeof what, "%s, against the uninterrupted run", label);
    const double worst = compare_rows(what, &resumed, straight, sc, pos, D, same);
    snprintf(what, sizeof what, "%s, against the CPU", label);
    compare_rows(what, &resumed, &ref->cpu, sc, pos, D, tol);
    for (int i = sc->resume_save + 1; i < sc->n_saves; i++) {
        saved_state got, want;
        snprintf(what, sizeof what, "%s save %d", label, i);
        if (!parse_state(what, &resumed.saves[i], c, &got)) continue;
        check_live_streams(label, &got, sc, i);
        if (parse_state(what, &saving->saves[i], c, &want)) {
            snprintf(what, sizeof what, "%s save %d against the saving run's", label, i);
            compare_states(what, &got, &want, c, same);
            saved_state_free(&want);
        }
        snprintf(what, sizeof what, "%s save %d against the CPU's", label, i);
        compare_states(what, &got, &ref->states[i], c, tol);
        saved_state_free(&got);
    }
    run_free(&resumed);
    return worst;
}

static void check_on_gpu(const char *model_name, const sf_model *m, const script *sc, uint32_t *const *tokens,
                         const reference *ref, sf_precision precision)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment, D = (size_t)c->dim;
    const int bf16 = precision == SF_PRECISION_BF16;
    const double tol = bf16 ? TOL_BF16 : TOL_F32, same = bf16 ? SAME_BF16 : SAME_F32;
    char label[160], what[256];
    snprintf(label, sizeof label, "%s, %s [%s]", model_name, sc->name, bf16 ? "bf16" : "f32");

    run saving, straight;
    run_init(&saving, sc, D);
    run_init(&straight, sc, D);
    sf_graph *g = new_graph(m, device_under_test, precision);
    if (g) play(g, sc, 0, tokens, N, D, 1, &saving);
    sf_graph_free(g);
    /* kept after its run for a restore into a used graph: its last commit may still wait */
    sf_graph *used = new_graph(m, device_under_test, precision);
    if (used) play(used, sc, 0, tokens, N, D, 0, &straight);

    double state_err = 0;
    for (int i = 0; i < sc->n_saves; i++) {
        saved_state got;
        snprintf(what, sizeof what, "%s save %d", label, i);
        if (!parse_state(what, &saving.saves[i], c, &got)) continue;
        check_live_streams(label, &got, sc, i);
        double err = compare_states(what, &got, &ref->states[i], c, tol);
        if (!(err <= state_err)) state_err = err;
        saved_state_free(&got);
    }
    const size_t from_start[MAX_STREAMS] = {0};
    snprintf(what, sizeof what, "%s, saving run against the uninterrupted one", label);
    const double saving_err = compare_rows(what, &saving, &straight, sc, from_start, D, same);
    snprintf(what, sizeof what, "%s, against the CPU", label);
    const double cpu_err = compare_rows(what, &straight, &ref->cpu, sc, from_start, D, tol);

    double fresh_err = INFINITY, reused_err = INFINITY;
    sf_graph *fresh = new_graph(m, device_under_test, precision);
    snprintf(what, sizeof what, "%s, restored into a fresh graph", label);
    if (fresh) fresh_err = check_resumed(what, fresh, m, sc, tokens, &saving, &straight, ref, tol, same);
    sf_graph_free(fresh);
    snprintf(what, sizeof what, "%s, restored into a used graph", label);
    if (used) reused_err = check_resumed(what, used, m, sc, tokens, &saving, &straight, ref, tol, same);
    sf_graph_free(used);

    printf("  %-52s state %.2e  rows: vs CPU %.2e, saving %.2e, restored %.2e / %.2e\n", label, state_err, cpu_err,
           saving_err, fresh_err, reused_err);
    run_free(&saving);
    run_free(&straight);
}

/* ---- models and scripts ------------------------------------------------------------------- */

static void check_script(const char *model_name, const sf_model *m, const char *script_name, const char *text,
                         uint64_t seed)
{
    const sf_model_config *c = sf_model_get_config(m);
    const size_t N = (size_t)c->segment, D = (size_t)c->dim;
    script sc;
    int parsed = parse_script(script_name, text, N, &sc);
    CHECKF(parsed == 0, "script \"%s\" does not parse", text);
    if (parsed != 0) return;
    uint32_t *tokens[MAX_STREAMS];
    check_rng rng = {seed};
    for (int s = 0; s < MAX_STREAMS; s++) {
        tokens[s] = malloc((sc.tokens[s] ? sc.tokens[s] : 1) * sizeof(uint32_t));
        for (size_t i = 0; i < sc.tokens[s]; i++) tokens[s][i] = (uint32_t)(check_rng_next(&rng) % (uint64_t)c->vocab);
    }
    reference ref;
    memset(&ref, 0, sizeof ref);
    run_init(&ref.cpu, &sc, D);
    sf_graph *g = new_graph(m, "cpu", SF_PRECISION_F32);
    if (g) play(g, &sc, 0, tokens, N, D, 1, &ref.cpu);
    sf_graph_free(g);
    char label[160];
    snprintf(label, sizeof label, "%s, %s [CPU]", model_name, sc.name);
    int parsed_all = 1;
    for (int i = 0; i < sc.n_saves; i++) {
        char what[200];
        snprintf(what, sizeof what, "%s save %d", label, i);
        if (!parse_state(what, &ref.cpu.saves[i], c, &ref.states[i])) {
            parsed_all = 0;
            continue;
        }
        check_live_streams(label, &ref.states[i], &sc, i);
    }
    double least_move = INFINITY;
    for (int i = 1; i < sc.n_saves && parsed_all; i++) {
        double moved = check_memory_moves(label, &ref.states[i - 1], &ref.states[i], c);
        if (moved < least_move) least_move = moved;
    }
    printf("  %-52s last layer's M moves >= %.3g between saves\n", label, least_move);
    if (parsed_all) {
        check_on_gpu(model_name, m, &sc, tokens, &ref, SF_PRECISION_F32);
        check_on_gpu(model_name, m, &sc, tokens, &ref, SF_PRECISION_BF16);
    }
    for (int i = 0; i < sc.n_saves; i++) saved_state_free(&ref.states[i]);
    run_free(&ref.cpu);
    for (int s = 0; s < MAX_STREAMS; s++) free(tokens[s]);
}

int main(void)
{
    if (!check_have_gpu()) return check_skip("no GPU");
    static const check_model_variant variants[] = {
        /* test_gpu_pipeline's last: on an H100, bf16 q/k/v read in place */
        {"d=64, causal delta, globals, MLP", "64:1,128:2,256:4", 128, 2, 64, 2, 1, 256, 16, 4, 1, 256,
         SF_MEMORY_DELTA},
        {"4 layers, d=32, delta, globals, MLP", "32:1,64:2,128:4", 64, 2, 32, 4, 1, 128, 8, 2, 1, 128,
         SF_MEMORY_DELTA},
        {"2 layers, linear, non-causal, globals, MLP", "16:1,64:4", 48, 3, 16, 2, 0, 96, 6, 3, 0, 64,
         SF_MEMORY_LINEAR},
    };
    /* k = 3 segments before the resume save, 2 after; every stream two consecutive saves share
     * advances between them (check_memory_moves); stream 2 starts after stream 1 ended, so it
     * takes over the state block kept of stream 1 */
    static const struct {
        const char *name, *text;
    } scripts[] = {
        {"one stream", "seg0 seg0 save seg0 resume seg0 seg0 save"},
        {"two interleaved streams", "seg0 seg1 seg0 seg1 save seg0 seg1 resume seg0 seg1 seg0 seg1 save"},
        {"a stream ends, another starts",
         "seg0 seg1 seg0 seg1 save half1 end1 seg2 seg0 resume seg2 seg0 seg2 seg0 save end0 end2 save"},
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        const check_model_variant *v = &variants[i];
        sf_model *m = NULL;
        CHECK_OK(check_variant_model(v, 3000 + i, &m));
        if (!m) continue;
        for (size_t k = 0; k < sizeof scripts / sizeof *scripts; k++)
            check_script(v->name, m, scripts[k].name, scripts[k].text, 10 * i + k);
        sf_model_free(m);
    }
    return check_finish("test_gpu_checkpoint");
}
