/* The state store (state/): 10,000 streams of a small model's state under a budget smaller
 * than their raw size come back bit for bit; the accounted peak never passes the budget;
 * entries move hot -> compressed -> spilled in least-recently-used order; lossy modes stay
 * within the quantizer's bound; removing streams deletes their files; damaged spill files and
 * budgets too small for one stream fail cleanly.
 * SEQFLOW_STATE_STORE_STREAMS overrides the stream count (for slow sanitizer runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state/state_store.h"
#include "seqflow/error.h"
#include "support/check.h"
#include "support/files.h"

/* A small model: 1 layer, H=2, d=16, G=4 global tokens, D=32, segments of 8 tokens. */
enum { L = 1, H = 2, HD = 16, G = 4, D = 32, SEG = 8 };
enum { M_N = L * H * HD * HD, Z_N = L * H * HD, G_N = L * G * H * HD, P_MAX = SEG * D };

typedef struct model_state {
    float M[M_N], z[Z_N], gk[G_N], gv[G_N], part[P_MAX];
    uint32_t meta[2 * L + 2]; /* g_count, g_head per layer, partial length, segment index */
} model_state;

static int part_len(uint64_t id) { return (int)(id % (SEG + 1)); }

/* Distinct, realistic values per (stream, version): M and z accumulated from a few tokens'
 * phi(k)^T v as the compressive memory does, a partly filled global FIFO, a partial segment. */
static void fill(model_state *s, uint64_t id, uint32_t version)
{
    memset(s, 0, sizeof *s);
    check_rng r = {id * 0x9e3779b97f4a7c15ULL + version * 0x632be59bd9b4e5fULL + 1};
    int tokens = 2 + (int)(id % 3);
    for (int t = 0; t < tokens; t++) {
        for (int h = 0; h < L * H; h++) {
            float phi[HD], v[HD];
            for (int i = 0; i < HD; i++) {
                double k = 0.5 * check_rng_normal(&r);
                phi[i] = (float)(k > 0 ? k + 1.0 : exp(k));
                v[i] = (float)check_rng_normal(&r);
            }
            for (int i = 0; i < HD; i++) {
                s->z[h * HD + i] += phi[i];
                for (int j = 0; j < HD; j++) s->M[(h * HD + i) * HD + j] += phi[i] * v[j];
            }
        }
    }
    int count = (int)(id % (G + 1));
    for (int i = 0; i < count * H * HD; i++) {
        s->gk[i] = (float)(0.7 * check_rng_normal(&r));
        s->gv[i] = (float)(0.7 * check_rng_normal(&r));
    }
    for (int i = 0; i < part_len(id) * D; i++) s->part[i] = (float)check_rng_normal(&r);
    s->meta[0] = (uint32_t)count;
    s->meta[1] = (uint32_t)(id % G);
    s->meta[2] = (uint32_t)part_len(id);
    s->meta[3] = version + (uint32_t)(id >> 3);
}

static int spans_of(model_state *s, uint64_t id, sf_state_span *sp)
{
    sp[0] = (sf_state_span){s->M, M_N};
    sp[1] = (sf_state_span){s->z, Z_N};
    sp[2] = (sf_state_span){s->gk, G_N};
    sp[3] = (sf_state_span){s->gv, G_N};
    sp[4] = (sf_state_span){s->part, (size_t)part_len(id) * D};
    return 5;
}

static size_t raw_bytes(uint64_t id)
{
    return (M_N + Z_N + 2 * G_N + (size_t)part_len(id) * D) * sizeof(float) +
           sizeof(((model_state *)0)->meta);
}

static int put_state(sf_state_store *st, uint64_t id, uint32_t version)
{
    model_state s;
    sf_state_span sp[5];
    fill(&s, id, version);
    return sf_state_store_put(st, id, sp, spans_of(&s, id, sp), s.meta, sizeof s.meta);
}

/* 1 when the store gives back exactly (bit for bit) what fill(id, version) produced. */
static int state_exact(sf_state_store *st, uint64_t id, uint32_t version)
{
    model_state want, got;
    sf_state_span sp[5];
    fill(&want, id, version);
    memset(&got, 0xAB, sizeof got);
    size_t meta_bytes = 0;
    int n = spans_of(&got, id, sp);
    int rc = sf_state_store_get(st, id, sp, n, got.meta, sizeof got.meta, &meta_bytes);
    if (rc != SF_OK) {
        fprintf(stderr, "get %llu: %s\n", (unsigned long long)id, sf_last_error());
        return 0;
    }
    size_t pn = (size_t)part_len(id) * D * sizeof(float);
    return meta_bytes == sizeof want.meta && !memcmp(want.M, got.M, sizeof want.M) &&
           !memcmp(want.z, got.z, sizeof want.z) && !memcmp(want.gk, got.gk, sizeof want.gk) &&
           !memcmp(want.gv, got.gv, sizeof want.gv) && !memcmp(want.part, got.part, pn) &&
           !memcmp(want.meta, got.meta, sizeof want.meta);
}

/* The directory a store spills into: the one holding stream's spill file ("" when it has none). */
static const char *spill_dir_of(sf_state_store *st, uint64_t stream, char *buf, size_t size)
{
    const char *p = sf_state_store_spill_path(st, stream);
    const char *slash = p ? strrchr(p, '/') : NULL;
    snprintf(buf, size, "%.*s", slash ? (int)(slash - p) : 0, p ? p : "");
    return buf;
}

/* A store whose budget holds about six streams, so that 60 of them spill into dir. */
static sf_state_store *create_spilling_store(const char *dir, int fsync)
{
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = 6 * raw_bytes(9) + 64 * 1024;
    cfg.spill_dir = dir;
    cfg.fsync = fsync;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    return st;
}

/* A failed allocation must come back as NULL under AddressSanitizer too, as it does without
 * (test_scratch_failure). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static void test_many_streams(void)
{
    const char *env = getenv("SEQFLOW_STATE_STORE_STREAMS");
    int n = env && atoi(env) > 0 ? atoi(env) : 10000;
    size_t raw_total = 0;
    for (int i = 0; i < n; i++) raw_total += raw_bytes((uint64_t)i * 7919u + 3);

    const char *dir = check_tmp_path("state-spill");
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = raw_total / 2;
    if (cfg.budget_bytes < 64 * raw_bytes(9)) cfg.budget_bytes = 64 * raw_bytes(9);
    cfg.spill_dir = dir;
    /* thousands of fsyncs would take a minute on a busy disk; test_damaged_spill covers the
     * fsync path, and a spill needs no durability beyond the process */
    cfg.fsync = 0;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;

    int failed = 0;
    for (int i = 0; i < n; i++) failed += put_state(st, (uint64_t)i * 7919u + 3, 0) != SF_OK;
    CHECKF(failed == 0, "%d puts failed (%s)", failed, sf_last_error());
    sf_state_store_stats s;
    sf_state_store_get_stats(st, &s);
    CHECKF(s.streams == (size_t)n, "%zu streams", s.streams);
    CHECK(s.hot > 0 && s.compressed > 0 && s.spilled > 0);
    CHECK(s.hot + s.compressed + s.spilled == s.streams);
    CHECK(s.raw_bytes == raw_total);
    CHECKF(s.peak_bytes <= cfg.budget_bytes, "peak %zu > budget %zu", s.peak_bytes,
           cfg.budget_bytes);
    char sub[1024] = "";
    for (int i = 0; i < n && !sub[0]; i++) spill_dir_of(st, (uint64_t)i * 7919u + 3, sub, sizeof sub);
    CHECK(s.bytes_on_disk > 0 && check_count_files(sub, NULL) == (int)s.spilled);
    printf("%d streams, %zu raw bytes, budget %zu: %zu hot, %zu compressed, %zu spilled; "
           "%zu bytes in memory (peak %zu), %zu on disk\n",
           n, raw_total, cfg.budget_bytes, s.hot, s.compressed, s.spilled, s.bytes_in_memory,
           s.peak_bytes, s.bytes_on_disk);

    int wrong = 0;
    for (int i = n - 1; i >= 0; i--) wrong += !state_exact(st, (uint64_t)i * 7919u + 3, 0);
    CHECKF(wrong == 0, "%d of %d streams came back different", wrong, n);

    /* new versions of every 5th stream replace the old ones wherever those were */
    failed = 0;
    for (int i = 0; i < n; i += 5) failed += put_state(st, (uint64_t)i * 7919u + 3, 1) != SF_OK;
    CHECKF(failed == 0, "%d re-puts failed (%s)", failed, sf_last_error());
    wrong = 0;
    for (int i = 0; i < n; i++) wrong += !state_exact(st, (uint64_t)i * 7919u + 3, i % 5 == 0);
    CHECKF(wrong == 0, "%d streams wrong after updates", wrong);

    /* streams that end are removed, and their files with them */
    char removed_path[1024] = "";
    for (int i = 1; i < n; i += 2) {
        uint64_t id = (uint64_t)i * 7919u + 3;
        const char *p = sf_state_store_spill_path(st, id);
        if (p && !removed_path[0]) snprintf(removed_path, sizeof removed_path, "%s", p);
        CHECK_OK(sf_state_store_remove(st, id));
    }
    sf_state_store_get_stats(st, &s);
    CHECK(s.streams == (size_t)(n - n / 2));
    CHECK(removed_path[0] && !check_path_exists(removed_path));
    CHECKF(check_count_files(sub, NULL) == (int)s.spilled, "%d files, %zu spilled",
           check_count_files(sub, NULL), s.spilled);
    CHECK(s.peak_bytes <= cfg.budget_bytes);
    sf_state_store_free(st);
    CHECKF(check_count_files(dir, NULL) == 0, "%d spill files left after free",
           check_count_files(dir, NULL));
    CHECK(!check_path_exists(sub));
    rmdir(dir);
}

/* Tiers follow recency: the oldest hot entry is compressed first and the oldest compressed one
 * spilled first; a get makes an entry the most recently used of its tier. */
static void test_lru(void)
{
    const char *dir = check_tmp_path("state-lru");
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    uint64_t id0 = 9; /* streams of the same size: id % 9 == 0 */
    size_t one = raw_bytes(id0);
    cfg.budget_bytes = 80 * one;
    cfg.hot_bytes = 8 * one;
    cfg.spill_dir = dir;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;
    enum { N = 200 };
    for (uint64_t i = 0; i < N; i++) CHECK_OK(put_state(st, 9 * (i + 1), 0));
    sf_state_store_stats s;
    sf_state_store_get_stats(st, &s);
    CHECK(s.hot == 8 && s.compressed > 0 && s.spilled > 0);
    int monotone = 1;
    for (uint64_t i = 1; i < N; i++)
        monotone &= sf_state_store_tier(st, 9 * (i + 1)) <= sf_state_store_tier(st, 9 * i);
    CHECKF(monotone, "older streams must be in colder tiers");

    /* the oldest hot and oldest compressed entries, touched, outlive their successors */
    uint64_t oldest_hot = 0, oldest_cold = 0;
    for (uint64_t i = N; i >= 1; i--) {
        int t = sf_state_store_tier(st, 9 * i);
        if (t == SF_STATE_HOT) oldest_hot = 9 * i;
        if (t == SF_STATE_COMPRESSED) oldest_cold = 9 * i;
    }
    CHECK(oldest_hot && oldest_cold);
    CHECK(state_exact(st, oldest_hot, 0));
    CHECK(state_exact(st, oldest_cold, 0));
    uint64_t next_hot = oldest_hot + 9, next_cold = oldest_cold + 9, id = 9 * (N + 1);
    while (sf_state_store_tier(st, next_hot) == SF_STATE_HOT) CHECK_OK(put_state(st, id += 9, 0));
    CHECK(sf_state_store_tier(st, oldest_hot) == SF_STATE_HOT);
    while (sf_state_store_tier(st, next_cold) == SF_STATE_COMPRESSED)
        CHECK_OK(put_state(st, id += 9, 0));
    CHECK(sf_state_store_tier(st, oldest_cold) == SF_STATE_COMPRESSED);
    CHECK(sf_state_store_tier(st, 12345) == SF_E_INVAL);
    sf_state_store_get_stats(st, &s);
    CHECK(s.peak_bytes <= cfg.budget_bytes);
    sf_state_store_free(st);
    CHECK(check_count_files(dir, NULL) == 0);
    rmdir(dir);
}

static void test_lossy(sf_quant_kind kind, int group)
{
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = 64u << 20;
    cfg.hot_bytes = 1; /* everything but the newest entry is compressed */
    cfg.quant = (sf_quant_params){kind, group};
    cfg.codec = SF_CODEC_LZ4;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;
    enum { N = 50 };
    for (uint64_t id = 1; id <= N; id++) CHECK_OK(put_state(st, id, 0));
    /* a NaN makes the quantizers refuse; that stream is kept losslessly instead */
    model_state nan_state;
    sf_state_span sp[5];
    fill(&nan_state, 4242, 0);
    nan_state.M[3] = NAN;
    nan_state.z[1] = INFINITY;
    CHECK_OK(sf_state_store_put(st, 4242, sp, spans_of(&nan_state, 4242, sp), nan_state.meta,
                                sizeof nan_state.meta));
    CHECK_OK(put_state(st, N + 1, 0));
    sf_state_store_stats s;
    sf_state_store_get_stats(st, &s);
    CHECK(s.compressed == N + 1 && s.hot == 1);

    int outside = 0, meta_wrong = 0;
    double worst = 0;
    for (uint64_t id = 1; id <= N; id++) {
        model_state want, got;
        fill(&want, id, 0);
        int n = spans_of(&got, id, sp);
        CHECK_OK(sf_state_store_get(st, id, sp, n, got.meta, sizeof got.meta, NULL));
        /* the stored region is the spans laid end to end */
        size_t total = M_N + Z_N + 2 * G_N + (size_t)part_len(id) * D;
        float *a = malloc(total * sizeof(float)), *b = malloc(total * sizeof(float));
        size_t at = 0;
        model_state *ss[2] = {&want, &got};
        float *dst[2] = {a, b};
        for (int k = 0; k < 2; k++) {
            sf_state_span q[5];
            int m = spans_of(ss[k], id, q);
            at = 0;
            for (int j = 0; j < m; j++) {
                memcpy(dst[k] + at, q[j].data, q[j].count * sizeof(float));
                at += q[j].count;
            }
        }
        double bound = sf_quant_error_bound(&cfg.quant, a, total);
        for (size_t i = 0; i < total; i++) {
            double e = fabs((double)a[i] - (double)b[i]);
            if (!(e <= bound)) outside++;
            if (bound > 0 && e / bound > worst) worst = e / bound;
        }
        meta_wrong += memcmp(want.meta, got.meta, sizeof want.meta) != 0;
        free(a);
        free(b);
    }
    CHECKF(outside == 0, "quant %d group %d: %d values outside the bound", (int)kind, group,
           outside);
    CHECK(meta_wrong == 0);
    CHECK(worst > 0); /* it really was lossy */
    model_state back;
    int n = spans_of(&back, 4242, sp);
    CHECK_OK(sf_state_store_get(st, 4242, sp, n, back.meta, sizeof back.meta, NULL));
    if (kind == SF_QUANT_BF16) { /* bf16 carries NaN and Inf itself */
        CHECK(isnan(back.M[3]) && isinf(back.z[1]) && back.z[1] > 0);
    } else {
        CHECK(memcmp(&back.M, &nan_state.M, sizeof back.M) == 0);
        CHECK(memcmp(&back.z, &nan_state.z, sizeof back.z) == 0);
    }
    sf_state_store_free(st);
}

static void test_damaged_spill(void)
{
    const char *dir = check_tmp_path("state-damage");
    sf_state_store *st = create_spilling_store(dir, 1); /* the fsync path, once */
    if (!st) return;
    for (uint64_t id = 1; id <= 60; id++) CHECK_OK(put_state(st, id, 0));
    CHECK(sf_state_store_tier(st, 1) == SF_STATE_SPILLED);
    CHECK(sf_state_store_tier(st, 2) == SF_STATE_SPILLED);
    CHECK(sf_state_store_tier(st, 3) == SF_STATE_SPILLED);
    CHECK(state_exact(st, 1, 0));

    /* a flipped payload bit */
    char path[1024];
    snprintf(path, sizeof path, "%s", sf_state_store_spill_path(st, 1));
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 200, SEEK_SET);
        int c = fgetc(f);
        fseek(f, 200, SEEK_SET);
        fputc(c ^ 0x10, f);
        fclose(f);
    }
    model_state got;
    sf_state_span sp[5];
    int n = spans_of(&got, 1, sp);
    int rc = sf_state_store_get(st, 1, sp, n, got.meta, sizeof got.meta, NULL);
    CHECKF(rc == SF_E_FRAME, "flipped bit: rc %d (%s)", rc, sf_last_error());
    CHECK(strstr(sf_last_error(), "spill file") != NULL);

    /* a truncated file, and one that is gone */
    snprintf(path, sizeof path, "%s", sf_state_store_spill_path(st, 2));
    CHECK(truncate(path, 100) == 0);
    n = spans_of(&got, 2, sp);
    rc = sf_state_store_get(st, 2, sp, n, got.meta, sizeof got.meta, NULL);
    CHECKF(rc == SF_E_FRAME_TRUNCATED, "truncated: rc %d (%s)", rc, sf_last_error());
    snprintf(path, sizeof path, "%s", sf_state_store_spill_path(st, 3));
    CHECK(unlink(path) == 0);
    n = spans_of(&got, 3, sp);
    rc = sf_state_store_get(st, 3, sp, n, got.meta, sizeof got.meta, NULL);
    CHECKF(rc == SF_E_IO, "missing: rc %d (%s)", rc, sf_last_error());

    /* the rest of the store is unharmed and the damaged streams can be removed */
    int wrong = 0;
    for (uint64_t id = 4; id <= 60; id++) wrong += !state_exact(st, id, 0);
    CHECK(wrong == 0);
    /* a size mismatch is the caller's error, not damage */
    n = spans_of(&got, 4, sp);
    sp[0].count--;
    CHECK(sf_state_store_get(st, 4, sp, n, got.meta, sizeof got.meta, NULL) == SF_E_INVAL);
    for (uint64_t id = 1; id <= 3; id++) CHECK_OK(sf_state_store_remove(st, id));
    CHECK(!sf_state_store_contains(st, 1) && sf_state_store_contains(st, 4));
    sf_state_store_free(st);
    CHECK(check_count_files(dir, NULL) == 0);
    rmdir(dir);
}

static void test_small_budgets(void)
{
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    sf_state_store *st = NULL;
    cfg.budget_bytes = 64; /* below the store's own records */
    CHECK(sf_state_store_create(&cfg, &st) == SF_E_BUDGET && st == NULL);
    cfg.budget_bytes = 0;
    CHECK(sf_state_store_create(&cfg, &st) == SF_E_INVAL);
    cfg.budget_bytes = 4096;
    cfg.quant = (sf_quant_params){SF_QUANT_INT4, 3}; /* int4 needs an even group */
    CHECK(sf_state_store_create(&cfg, &st) == SF_E_INVAL);
    cfg.quant = (sf_quant_params){SF_QUANT_F32, 1};

    /* one stream larger than the whole budget, with and without a spill directory */
    const char *dir = check_tmp_path("state-small");
    for (int spill = 0; spill < 2; spill++) {
        cfg.budget_bytes = raw_bytes(9) / 2;
        cfg.spill_dir = spill ? dir : NULL;
        CHECK_OK(sf_state_store_create(&cfg, &st));
        if (!st) continue;
        int rc = put_state(st, 9, 0);
        CHECKF(rc == SF_E_BUDGET, "rc %d", rc);
        CHECK(strstr(sf_last_error(), "budget") != NULL);
        CHECK(!sf_state_store_contains(st, 9));
        sf_state_store_stats s;
        sf_state_store_get_stats(st, &s);
        CHECK(s.streams == 0 && s.peak_bytes <= cfg.budget_bytes);
        sf_state_store_free(st);
    }
    rmdir(dir);

    /* no spill directory: puts fail once memory is full, and a failed put changes nothing */
    cfg.spill_dir = NULL;
    cfg.budget_bytes = 12 * raw_bytes(9);
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;
    uint64_t id = 9;
    int rc;
    while ((rc = put_state(st, id, 0)) == SF_OK) id += 9;
    CHECKF(rc == SF_E_BUDGET, "rc %d", rc);
    CHECK(strstr(sf_last_error(), "no spill directory") != NULL);
    sf_state_store_stats s;
    sf_state_store_get_stats(st, &s);
    CHECK(s.compressed > 0 && s.spilled == 0);
    CHECK(!sf_state_store_contains(st, id));
    /* a bigger replacement for a stored stream that cannot fit keeps the old state */
    model_state big;
    fill(&big, 9, 7);
    float *huge = calloc(16 * M_N, sizeof(float));
    sf_state_span sp[2] = {{big.M, M_N}, {huge, 16 * M_N}};
    CHECK(sf_state_store_put(st, 9, sp, 2, big.meta, sizeof big.meta) == SF_E_BUDGET);
    free(huge);
    int wrong = 0;
    for (uint64_t k = 9; k < id; k += 9) wrong += !state_exact(st, k, 0);
    CHECK(wrong == 0);
    sf_state_store_get_stats(st, &s);
    CHECK(s.peak_bytes <= cfg.budget_bytes);
    CHECK(sf_state_store_get(st, 5, NULL, 0, NULL, 0, NULL) == SF_E_INVAL);
    CHECK_OK(sf_state_store_remove(st, 5)); /* unknown: a no-op */
    sf_state_store_free(st);
}

/* int8 and fp8 with group 1 take 5 bytes a value, more than the floats themselves: a spilled
 * stream read back with several spans must still decode exactly what was put (its frames, read
 * into the scratch, must not overlap the region they are decoded into). */
static void test_wide_frames(sf_quant_kind kind)
{
    const char *dir = check_tmp_path("state-wide");
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = 120000;
    cfg.quant = (sf_quant_params){kind, 1};
    cfg.codec = SF_CODEC_RAW;
    cfg.spill_dir = dir;
    cfg.fsync = 0;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;
    enum { N = 4096, STREAMS = 40 };
    float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    for (uint64_t id = 1; id <= STREAMS; id++) {
        check_rng r = {id * 0x9e3779b97f4a7c15ULL};
        check_fill_normal(&r, want, N, 100.0);
        sf_state_span one = {want, N};
        CHECK_OK(sf_state_store_put(st, id, &one, 1, NULL, 0));
    }
    CHECK(sf_state_store_tier(st, 1) == SF_STATE_SPILLED);
    int outside = 0;
    for (uint64_t id = 1; id <= STREAMS; id++) {
        check_rng r = {id * 0x9e3779b97f4a7c15ULL};
        check_fill_normal(&r, want, N, 100.0);
        memset(got, 0, N * sizeof(float));
        sf_state_span two[2] = {{got, N / 3}, {got + N / 3, N - N / 3}};
        CHECK_OK(sf_state_store_get(st, id, two, 2, NULL, 0, NULL));
        double bound = sf_quant_error_bound(&cfg.quant, want, N);
        for (int i = 0; i < N; i++) outside += !(fabs((double)want[i] - (double)got[i]) <= bound);
    }
    CHECKF(outside == 0, "quant %d group 1: %d values outside the bound", (int)kind, outside);
    free(want);
    free(got);
    sf_state_store_free(st);
    rmdir(dir);
}

/* A stream with no floats and no metadata has no spill file; it still comes back when spilled. */
static void test_empty_spilled(void)
{
    const char *dir = check_tmp_path("state-empty");
    sf_state_store *st = create_spilling_store(dir, 0);
    if (!st) return;
    CHECK_OK(sf_state_store_put(st, 1000, NULL, 0, NULL, 0));
    for (uint64_t id = 1; id <= 60; id++) CHECK_OK(put_state(st, id, 0));
    CHECK(sf_state_store_tier(st, 1000) == SF_STATE_SPILLED);
    size_t meta_bytes = 99;
    int rc = sf_state_store_get(st, 1000, NULL, 0, NULL, 0, &meta_bytes);
    CHECKF(rc == SF_OK && meta_bytes == 0, "empty spilled stream: rc %d (%s)", rc, sf_last_error());
    CHECK_OK(sf_state_store_take(st, 1000, NULL, 0, NULL, 0, NULL));
    CHECK(!sf_state_store_contains(st, 1000) && state_exact(st, 60, 0));
    sf_state_store_free(st);
    rmdir(dir);
}

/* A put whose larger scratch cannot be allocated fails with SF_E_NOMEM and leaves the other
 * streams readable (the old scratch is kept). */
static void test_scratch_failure(void)
{
    sf_state_store_config cfg;
    sf_state_store_config_default(&cfg);
    cfg.budget_bytes = SIZE_MAX / 2; /* the budget lets the allocation be tried */
    cfg.hot_bytes = 1;
    sf_state_store *st = NULL;
    CHECK_OK(sf_state_store_create(&cfg, &st));
    if (!st) return;
    for (uint64_t id = 1; id <= 4; id++) CHECK_OK(put_state(st, id, 0));
    CHECK(sf_state_store_tier(st, 1) == SF_STATE_COMPRESSED);
    float one = 1;
    /* never read: the scratch for 2^56 floats is allocated (and fails) before the data is copied */
    sf_state_span huge = {&one, (size_t)1 << 56};
    int rc = sf_state_store_put(st, 99, &huge, 1, NULL, 0);
    CHECKF(rc == SF_E_NOMEM, "huge put: rc %d (%s)", rc, sf_last_error());
    CHECK(!sf_state_store_contains(st, 99));
    int wrong = 0;
    for (uint64_t id = 1; id <= 4; id++) wrong += !state_exact(st, id, 0);
    CHECK(wrong == 0);
    sf_state_store_free(st);
}

/* Each store spills into a subdirectory of its own (sf-state-XXXXXX), so that two stores, or
 * two processes whose pids coincide, sharing a spill directory never read each other's files;
 * free removes it. */
static void test_spill_subdirectory(void)
{
    const char *dir = check_tmp_path("state-subdir");
    sf_state_store *a = create_spilling_store(dir, 0), *b = create_spilling_store(dir, 0);
    if (!a || !b) {
        sf_state_store_free(a);
        sf_state_store_free(b);
        return;
    }
    for (uint64_t id = 1; id <= 60; id++) {
        CHECK_OK(put_state(a, id, 0));
        CHECK_OK(put_state(b, id, 1));
    }
    char da[1024], db[1024];
    spill_dir_of(a, 1, da, sizeof da);
    spill_dir_of(b, 1, db, sizeof db);
    size_t len = strlen(dir);
    CHECKF(strncmp(da, dir, len) == 0 && da[len] == '/' && strncmp(da + len + 1, "sf-state-", 9) == 0,
           "spill directory %s is not a sf-state- subdirectory of %s", da, dir);
    CHECKF(strcmp(da, db) != 0, "two stores spill into the same directory %s", da);
    CHECK(state_exact(a, 1, 0) && state_exact(b, 1, 1));
    sf_state_store_free(a);
    CHECK(da[0] && !check_path_exists(da) && check_path_exists(db));
    CHECK(state_exact(b, 2, 1));
    sf_state_store_free(b);
    CHECK(check_count_files(dir, NULL) == 0);
    rmdir(dir);
}

int main(void)
{
    test_small_budgets();
    test_lru();
    test_lossy(SF_QUANT_INT8, 32);
    test_lossy(SF_QUANT_INT4, 16);
    test_lossy(SF_QUANT_FP8_E4M3, 64);
    test_lossy(SF_QUANT_BF16, 1);
    test_damaged_spill();
    test_wide_frames(SF_QUANT_INT8);
    test_wide_frames(SF_QUANT_FP8_E4M3);
    test_empty_spilled();
    test_scratch_failure();
    test_spill_subdirectory();
    test_many_streams();
    return check_finish("test_state_store");
}
