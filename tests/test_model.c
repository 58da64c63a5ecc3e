/* The built-in random model, and safetensors loading/saving, including one refused file for
 * every way a model file can be broken (the configuration alone: test_model_config.c). */
#include "seqflow/error.h"
#include "seqflow/model.h"
#include "support/check.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------------------------- */

static void expect_refused_at(int line, const char *path, int code, const char *needle,
                              const char *needle2)
{
    sf_model *m = (sf_model *)1;
    sf_clear_error();
    int rc = sf_model_load(path, &m);
    const char *msg = sf_last_error();
    check_report(rc == code, __FILE__, line, "load refused with the expected code",
                 "rc %d, expected %d (%s)", rc, code, msg);
    check_report(m == NULL, __FILE__, line, "out is NULL after a refusal", NULL);
    check_report(strstr(msg, needle) != NULL, __FILE__, line, "message names the culprit",
                 "\"%s\" lacks \"%s\"", msg, needle);
    if (needle2)
        check_report(strstr(msg, needle2) != NULL, __FILE__, line, "message explains",
                     "\"%s\" lacks \"%s\"", msg, needle2);
    check_report(strchr(msg, '\n') == NULL, __FILE__, line, "message is one line", "%s", msg);
    if (rc == SF_OK) sf_model_free(m);
}
#define EXPECT_REFUSED(path, code, needle, needle2) \
    expect_refused_at(__LINE__, path, code, needle, needle2)

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
    *n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    return buf;
}

/* A safetensors file held as editable JSON plus its data buffer. */
typedef struct st_file {
    cJSON *header;
    unsigned char *data;
    size_t data_len;
} st_file;

static int st_read(const char *path, st_file *st)
{
    size_t n;
    unsigned char *bytes = read_bytes(path, &n);
    if (!bytes || n < 8) return free(bytes), 0;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = (len << 8) | bytes[i];
    st->header = cJSON_ParseWithLength((const char *)bytes + 8, (size_t)len);
    st->data_len = n - 8 - (size_t)len;
    st->data = malloc(st->data_len + 1);
    memcpy(st->data, bytes + 8 + len, st->data_len);
    free(bytes);
    return st->header != NULL;
}

/* Writes header text with an explicit length field, so tests can also lie about the length. */
static void write_raw(const char *path, const char *header, uint64_t claimed_len,
                      const unsigned char *data, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    unsigned char len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)(claimed_len >> (8 * i));
    fwrite(len_bytes, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (data_len) fwrite(data, 1, data_len, f);
    fclose(f);
}

static void st_write(const char *path, const st_file *st)
{
    char *text = cJSON_PrintUnformatted(st->header);
    write_raw(path, text, strlen(text), st->data, st->data_len);
    free(text);
}

static void st_free(st_file *st)
{
    cJSON_Delete(st->header);
    free(st->data);
}

static cJSON *tensor(st_file *st, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(st->header, name);
}

static void set_ints(cJSON *entry, const char *field, int n, const double *values)
{
    cJSON *array = cJSON_CreateDoubleArray(values, n);
    cJSON_ReplaceItemInObjectCaseSensitive(entry, field, array);
}

static void set_meta(st_file *st, const char *key, const char *value)
{
    cJSON *meta = tensor(st, "__metadata__");
    if (value) {
        if (cJSON_GetObjectItemCaseSensitive(meta, key))
            cJSON_ReplaceItemInObjectCaseSensitive(meta, key, cJSON_CreateString(value));
        else
            cJSON_AddStringToObject(meta, key, value);
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(meta, key);
    }
}

/* The tiny model every bad-file test starts from: all tensor kinds present. */
static void tiny_config(sf_model_config *cfg)
{
    sf_model_config_default(cfg);
    cfg->dim = 4;
    cfg->heads = 2;
    cfg->head_dim = 2;
    cfg->vocab = 8;
    cfg->layers = 1;
    cfg->segment = 8;
    CHECK_OK(sf_branches_parse("4:1,8:2", cfg));
    cfg->global_tokens = 2;
    cfg->summary_tokens = 2;
    cfg->mlp_hidden = 3;
    cfg->final_norm = 1;
}

static char good_path[512];

static void tiny_file(st_file *st)
{
    memset(st, 0, sizeof *st);
    CHECK(st_read(good_path, st));
}

static int same_weights(const sf_model *a, const sf_model *b)
{
    const sf_model_config *c = sf_model_get_config(a);
    size_t D = (size_t)c->dim, HD = (size_t)c->heads * (size_t)c->head_dim, F = (size_t)c->mlp_hidden;
    if (memcmp(sf_model_embedding(a), sf_model_embedding(b), (size_t)c->vocab * D * 4)) return 0;
    if ((sf_model_final_norm(a) == NULL) != (sf_model_final_norm(b) == NULL)) return 0;
    if (sf_model_final_norm(a) && memcmp(sf_model_final_norm(a), sf_model_final_norm(b), D * 4))
        return 0;
    for (int l = 0; l < c->layers; l++) {
        const sf_block_weights *x = sf_model_block(a, l), *y = sf_model_block(b, l);
        if (memcmp(x->attn_norm, y->attn_norm, D * 4) || memcmp(x->wq, y->wq, HD * D * 4) ||
            memcmp(x->wk, y->wk, HD * D * 4) || memcmp(x->wv, y->wv, HD * D * 4) ||
            memcmp(x->wo, y->wo, HD * D * 4) || memcmp(x->gate, y->gate, (size_t)c->heads * 4))
            return 0;
        if ((x->w1 == NULL) != (y->w1 == NULL)) return 0;
        if (x->w1 && (memcmp(x->mlp_norm, y->mlp_norm, D * 4) || memcmp(x->w1, y->w1, F * D * 4) ||
                      memcmp(x->w3, y->w3, F * D * 4) || memcmp(x->w2, y->w2, F * D * 4)))
            return 0;
    }
    return 1;
}

static int same_config(const sf_model_config *a, const sf_model_config *b)
{
    char ba[256], bb[256];
    sf_branches_format(a, ba, sizeof ba);
    sf_branches_format(b, bb, sizeof bb);
    return a->dim == b->dim && a->heads == b->heads && a->head_dim == b->head_dim &&
           a->vocab == b->vocab && a->layers == b->layers && a->segment == b->segment &&
           strcmp(ba, bb) == 0 && a->causal == b->causal && a->memory == b->memory &&
           a->global_tokens == b->global_tokens && a->summary_tokens == b->summary_tokens &&
           memcmp(&a->norm_eps, &b->norm_eps, sizeof a->norm_eps) == 0 &&
           a->mlp_hidden == b->mlp_hidden && a->final_norm == b->final_norm;
}

/* ---- random models ----------------------------------------------------------------------- */

static uint64_t hash_model(const sf_model *m)
{
    const sf_model_config *c = sf_model_get_config(m);
    uint64_t h = 1469598103934665603ull;
    const float *e = sf_model_embedding(m);
    size_t n = (size_t)c->vocab * (size_t)c->dim;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &e[i], 4);
        h = (h ^ bits) * 1099511628211ull;
    }
    const sf_block_weights *b = sf_model_block(m, c->layers - 1);
    size_t sizes[] = {(size_t)c->dim, (size_t)c->dim * 128, (size_t)c->heads,
                      (size_t)c->mlp_hidden * (size_t)c->dim};
    const float *parts[] = {b->attn_norm, b->wo, b->gate, b->w2};
    for (int p = 0; p < 4; p++)
        for (size_t i = 0; i < sizes[p]; i++) {
            uint32_t bits;
            memcpy(&bits, &parts[p][i], 4);
            h = (h ^ bits) * 1099511628211ull;
        }
    return h;
}

static void test_random_model(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    sf_model *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &a));
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &b));
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED + 1, &c));
    if (!a || !b || !c) goto done;
    CHECK(same_weights(a, b));
    CHECK(!same_weights(a, c));
    CHECK(same_config(sf_model_get_config(a), &cfg));
    /* Pinned so that a change to the generator (which changes every default run's output) is
     * deliberate; update the constant together with any such change. */
    uint64_t h = hash_model(a);
    CHECKF(h == 0xbc1202c95f3a4e2dull, "default model hash %016llx", (unsigned long long)h);

    const float *embed = sf_model_embedding(a);
    double sum = 0, sq = 0;
    size_t n = 256 * 128;
    for (size_t i = 0; i < n; i++) sum += embed[i], sq += (double)embed[i] * embed[i];
    double mean = sum / n, sd = sqrt(sq / n - mean * mean);
    CHECKF(fabs(mean) < 0.02 && fabs(sd - 1.0) < 0.02, "embedding mean %g sd %g", mean, sd);
    const sf_block_weights *blk = sf_model_block(a, 1);
    float bound_d = (float)(1.0 / sqrt(128.0)), bound_f = (float)(1.0 / sqrt(256.0));
    int in_range = 1;
    float max_q = 0;
    for (size_t i = 0; i < 128 * 128; i++) {
        in_range &= fabsf(blk->wq[i]) <= bound_d && fabsf(blk->wo[i]) <= bound_d;
        if (fabsf(blk->wq[i]) > max_q) max_q = fabsf(blk->wq[i]);
    }
    for (size_t i = 0; i < 128 * 256; i++) in_range &= fabsf(blk->w2[i]) <= bound_f;
    for (int i = 0; i < 128; i++)
        in_range &= fabsf(blk->attn_norm[i] - 1.0f) <= 0.1f && fabsf(blk->mlp_norm[i] - 1.0f) <= 0.1f;
    for (int i = 0; i < 4; i++) in_range &= fabsf(blk->gate[i]) <= 2.0f;
    CHECK(in_range);
    CHECK(max_q > 0.9f * bound_d); /* spread over the whole range, not stuck near zero */
    CHECK(sf_model_final_norm(a) != NULL && sf_model_block(a, 2) == NULL && sf_model_block(a, -1) == NULL);

    /* Reconfigure: new settings, same weights, nothing shared. */
    sf_model_config other = cfg;
    other.segment = 512;
    CHECK_OK(sf_branches_parse("512:1", &other));
    other.memory = SF_MEMORY_LINEAR;
    sf_model *r = NULL;
    CHECK_OK(sf_model_reconfigure(a, &other, &r));
    if (r) {
        CHECK(same_weights(a, r));
        CHECK(sf_model_get_config(r)->segment == 512 && sf_model_get_config(r)->memory == SF_MEMORY_LINEAR);
        CHECK(sf_model_embedding(r) != sf_model_embedding(a));
    }
    sf_model_free(r);
    other.dim = 64;
    r = (sf_model *)1;
    CHECK(sf_model_reconfigure(a, &other, &r) == SF_E_CONFIG && r == NULL);
    CHECKF(strstr(sf_last_error(), "dim") != NULL, "%s", sf_last_error());
    other = cfg;
    other.segment = 100;
    CHECK(sf_model_reconfigure(a, &other, &r) == SF_E_CONFIG && r == NULL);

    cfg.dim = -1;
    CHECK(sf_model_create_random(&cfg, 1, &r) == SF_E_CONFIG && r == NULL);
done:
    sf_model_free(a);
    sf_model_free(b);
    sf_model_free(c);
    sf_model_free(NULL);
}

/* ---- save / load ------------------------------------------------------------------------- */

static void round_trip(const sf_model_config *cfg, const char *name)
{
    char path[512], path2[520];
    snprintf(path, sizeof path, "%s", check_tmp_path(name));
    snprintf(path2, sizeof path2, "%s.again", path);
    sf_model *m = NULL, *back = NULL;
    CHECK_OK(sf_model_create_random(cfg, 42, &m));
    CHECK_OK(sf_model_save(m, path));
    CHECK_OK(sf_model_load(path, &back));
    if (m && back) {
        CHECK(same_config(sf_model_get_config(m), sf_model_get_config(back)));
        CHECK(same_weights(m, back));
        CHECK_OK(sf_model_save(back, path2));
        size_t n1 = 0, n2 = 0;
        unsigned char *f1 = read_bytes(path, &n1), *f2 = read_bytes(path2, &n2);
        CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0); /* saving is deterministic */
        uint64_t header_len = 0;
        for (int i = 7; f1 && i >= 0; i--) header_len = (header_len << 8) | f1[i];
        CHECK(header_len % 8 == 0);
        free(f1);
        free(f2);
    }
    sf_model_free(m);
    sf_model_free(back);
    unlink(path);
    unlink(path2);
}

static void test_round_trip(void)
{
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    round_trip(&cfg, "default.safetensors");
    cfg.mlp_hidden = 0;
    cfg.final_norm = 0;
    cfg.causal = 0;
    cfg.memory = SF_MEMORY_NONE;
    cfg.global_tokens = 0;
    cfg.summary_tokens = 0;
    cfg.norm_eps = 1.2345679e-5f;
    cfg.layers = 3;
    cfg.vocab = 1000;
    cfg.head_dim = 16;
    round_trip(&cfg, "plain.safetensors");

    /* A save that cannot happen leaves nothing behind and says why. */
    sf_model *m = NULL;
    sf_model_config_default(&cfg);
    CHECK_OK(sf_model_create_random(&cfg, 1, &m));
    CHECK(sf_model_save(m, "/nonexistent-dir/x.safetensors") == SF_E_IO);
    CHECK(strstr(sf_last_error(), "/nonexistent-dir/x.safetensors") != NULL);
    sf_model_free(m);
}

static float half_reference(uint16_t h)
{
    int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
    float v;
    if (exponent == 0) v = ldexpf((float)mantissa, -24);
    else if (exponent == 31) v = mantissa ? NAN : INFINITY;
    else v = ldexpf(1.0f + mantissa / 1024.0f, exponent - 15);
    return sign ? -v : v;
}

/* Writes a tiny model whose embed.weight is re-encoded in a 16-bit dtype (32 values), appended
 * at the end of the data buffer. */
static const char *write_half_file(int bfloat, const uint16_t *values)
{
    st_file st;
    tiny_file(&st);
    size_t at = st.data_len;
    st.data = realloc(st.data, st.data_len + 64);
    for (int i = 0; i < 32; i++) {
        st.data[at + 2 * (size_t)i] = (unsigned char)(values[i] & 0xff);
        st.data[at + 2 * (size_t)i + 1] = (unsigned char)(values[i] >> 8);
    }
    st.data_len += 64;
    cJSON *e = tensor(&st, "embed.weight");
    cJSON_ReplaceItemInObjectCaseSensitive(e, "dtype", cJSON_CreateString(bfloat ? "BF16" : "F16"));
    double offs[2] = {(double)at, (double)at + 64};
    set_ints(e, "data_offsets", 2, offs);
    const char *path = check_tmp_path(bfloat ? "bf16.safetensors" : "f16.safetensors");
    st_write(path, &st);
    st_free(&st);
    return path;
}

/* Every 16-bit encoding converts exactly. Finite values are loaded and compared; infinities
 * and NaNs are refused at load (weights must be finite), and the refusal says which of the
 * two the value converted to, at which element. */
static void test_half_types(void)
{
    static const uint16_t halves[32] = {
        0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x0200,
        0x0400, 0x7c00, 0xfc00, 0x7e00, 0x3555, 0x3c01, 0x1234, 0x5678, 0x0abc, 0x8abc,
        0x4248, 0xb800, 0x2e66, 0x6400, 0x0010, 0x83ff, 0x7c01, 0x7fff, 0x3bff, 0x0401,
        0x4000, 0x4200};
    static const uint16_t bfloats[32] = {
        0x3f80, 0xc020, 0x0001, 0x8001, 0x7f80, 0xff80, 0x7fc0, 0x4049, 0x0000, 0x8000,
        0x007f, 0x0080, 0x7f7f, 0xff7f, 0x3e80, 0x4120, 0x1234, 0x5678, 0x9abc, 0x3f81,
        0x4000, 0x4040, 0x4080, 0xbf80, 0x3c00, 0x3a00, 0x7f81, 0x0100, 0x4b00, 0x4f00,
        0x5f00, 0x2000};
    for (int pass = 0; pass < 2; pass++) {
        const uint16_t *values = pass == 0 ? halves : bfloats;
        float want[32];
        uint16_t finite[32];
        for (int i = 0; i < 32; i++) {
            if (pass == 0) {
                want[i] = half_reference(values[i]);
            } else {
                uint32_t bits = (uint32_t)values[i] << 16;
                memcpy(&want[i], &bits, 4);
            }
            finite[i] = isfinite(want[i]) ? values[i] : 0x0000;
        }
        /* each non-finite encoding alone in an otherwise finite tensor */
        int refusals = 0;
        for (int i = 0; i < 32; i++) {
            if (isfinite(want[i])) continue;
            uint16_t one[32];
            memcpy(one, finite, sizeof one);
            one[i] = values[i];
            char what[64];
            snprintf(what, sizeof what, "element %d is %s", i, isnan(want[i]) ? "NaN" : "infinite");
            EXPECT_REFUSED(write_half_file(pass, one), SF_E_MODEL, "embed.weight", what);
            refusals++;
        }
        CHECK(refusals == (pass == 0 ? 5 : 4));
        const char *path = write_half_file(pass, finite);
        sf_model *m = NULL;
        CHECK_OK(sf_model_load(path, &m));
        if (!m) continue;
        const float *embed = sf_model_embedding(m);
        int exact = 1;
        for (int i = 0; i < 32; i++) {
            if (!isfinite(want[i])) continue;
            float got = embed[i];
            int ok = got == want[i] && signbit(got) == signbit(want[i]);
            if (!ok) {
                CHECKF(0, "%s value %d (0x%04x): got %a, want %a", pass ? "BF16" : "F16", i,
                       values[i], (double)got, (double)want[i]);
                exact = 0;
            }
        }
        CHECK(exact);
        /* Spot checks written out by hand, independent of half_reference. */
        if (pass == 0)
            CHECK(embed[2] == 1.0f && embed[3] == -2.0f && embed[4] == 65504.0f &&
                  embed[6] == 0x1p-24f && embed[8] == 0x3ffp-24f && isinf(want[11]) &&
                  want[12] < 0 && isinf(want[12]) && isnan(want[13]));
        else
            CHECK(embed[0] == 1.0f && embed[1] == -2.5f && embed[2] == 0x1p-133f &&
                  embed[7] == 3.140625f && isinf(want[4]) && isnan(want[6]));
        sf_model_free(m);
        unlink(path);
    }
}

/* ---- refused files: one case per rule ---------------------------------------------------- */

static void test_unreadable_and_truncated(void)
{
    EXPECT_REFUSED("/nonexistent-dir/model.safetensors", SF_E_IO, "/nonexistent-dir/model.safetensors", NULL);
    size_t n = 0;
    unsigned char *bytes = read_bytes(good_path, &n);
    CHECK(bytes && n > 100);
    if (!bytes) return;
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | bytes[i];
    const char *path = check_tmp_path("truncated.safetensors");
    size_t cuts[] = {0, 3, 7};
    for (int k = 0; k < 3; k++) {
        write_bytes(path, bytes, cuts[k]);
        EXPECT_REFUSED(path, SF_E_MODEL, "shorter than the 8-byte", NULL);
    }
    write_bytes(path, bytes, 8 + (size_t)header_len / 2);
    EXPECT_REFUSED(path, SF_E_MODEL, "header length", "past the end");
    write_bytes(path, bytes, 8 + (size_t)header_len);
    EXPECT_REFUSED(path, SF_E_MODEL, "tensor ", "data buffer");
    /* The tensor cut off is the last one stored: final_norm.weight, the name sorted last. */
    write_bytes(path, bytes, n - 1);
    EXPECT_REFUSED(path, SF_E_MODEL, "final_norm.weight", "run past");
    free(bytes);
    unlink(path);
}

static void test_bad_header(void)
{
    const char *path = check_tmp_path("header.safetensors");
    unsigned char pad[64] = {0};
    write_raw(path, "{}", 0, pad, sizeof pad);
    EXPECT_REFUSED(path, SF_E_MODEL, "header length is 0", NULL);
    write_raw(path, "{}", 1ull << 40, pad, sizeof pad);
    EXPECT_REFUSED(path, SF_E_MODEL, "header length 1099511627776", "limit");
    write_raw(path, "{}", 200, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "header length 200", "past the end");
    write_raw(path, "{\"embed.weight\": {\"dtype\": ", 27, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "not valid JSON", NULL);
    write_raw(path, "{} {}", 5, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "not valid JSON", NULL);
    write_raw(path, "[1, 2, 3]", 9, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "not an object", NULL);
    write_raw(path, "{\"__metadata__\": [1]}", 21, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "__metadata__", NULL);
    write_raw(path, "{\"__metadata__\": {\"seqflow.dim\": 4}}", 36, NULL, 0);
    EXPECT_REFUSED(path, SF_E_MODEL, "seqflow.dim", "not a string");
    unlink(path);
}

typedef void (*mutation)(st_file *st);

static void refuse_mutated(int line, const char *what, mutation mutate, int code,
                           const char *needle, const char *needle2)
{
    st_file st;
    tiny_file(&st);
    mutate(&st);
    char path[512];
    snprintf(path, sizeof path, "%s", check_tmp_path(what));
    st_write(path, &st);
    st_free(&st);
    expect_refused_at(line, path, code, needle, needle2);
    unlink(path);
}
#define REFUSE(mutate, code, needle, needle2) \
    refuse_mutated(__LINE__, #mutate, mutate, code, needle, needle2)

static void drop_k(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(st->header, "blocks.0.attn.k.weight"); }
static void drop_embed(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(st->header, "embed.weight"); }
static void transpose_w2(st_file *st)
{
    double shape[2] = {3, 4};
    set_ints(tensor(st, "blocks.0.mlp.w2.weight"), "shape", 2, shape);
}
static void f64_dtype(st_file *st)
{
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(st, "blocks.0.attn.gate"), "dtype", cJSON_CreateString("F64"));
}
static void dtype_number(st_file *st)
{
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(st, "blocks.0.attn.gate"), "dtype", cJSON_CreateNumber(4));
}
static void no_dtype(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(tensor(st, "blocks.0.attn.v.weight"), "dtype"); }
static void no_shape(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(tensor(st, "blocks.0.attn.v.weight"), "shape"); }
static void no_offsets(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(tensor(st, "blocks.0.attn.v.weight"), "data_offsets"); }
static void shape_string(st_file *st)
{
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(st, "final_norm.weight"), "shape", cJSON_CreateString("[4]"));
}
static void entry_not_object(st_file *st)
{
    cJSON_ReplaceItemInObjectCaseSensitive(st->header, "final_norm.weight", cJSON_CreateNumber(1));
}
static void negative_dim(st_file *st)
{
    double shape[2] = {-4, -4};
    set_ints(tensor(st, "blocks.0.attn.q.weight"), "shape", 2, shape);
}
static void fractional_offset(st_file *st)
{
    cJSON *e = tensor(st, "blocks.0.attn.gate");
    cJSON *offsets = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    double begin = cJSON_GetArrayItem(offsets, 0)->valuedouble;
    double v[2] = {begin + 0.5, begin + 8.5};
    set_ints(e, "data_offsets", 2, v);
}
static void three_offsets(st_file *st)
{
    double v[3] = {0, 8, 16};
    set_ints(tensor(st, "blocks.0.attn.gate"), "data_offsets", 3, v);
}
static void reversed_offsets(st_file *st)
{
    double v[2] = {16, 8};
    set_ints(tensor(st, "blocks.0.attn.gate"), "data_offsets", 2, v);
}
static void offsets_beyond(st_file *st)
{
    double v[2] = {(double)st->data_len, (double)st->data_len + 8};
    set_ints(tensor(st, "blocks.0.attn.gate"), "data_offsets", 2, v);
}
static void size_mismatch(st_file *st)
{
    double shape[1] = {3};
    set_ints(tensor(st, "final_norm.weight"), "shape", 1, shape);
}
static void overlapping(st_file *st)
{
    /* k now reads q's bytes: same size, same place. */
    cJSON *q = cJSON_GetObjectItemCaseSensitive(tensor(st, "blocks.0.attn.q.weight"), "data_offsets");
    cJSON_ReplaceItemInObjectCaseSensitive(tensor(st, "blocks.0.attn.k.weight"), "data_offsets",
                                           cJSON_Duplicate(q, 1));
}
static void extra_tensor(st_file *st)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "dtype", "F32");
    double shape[1] = {0}, offsets[2] = {0, 0};
    cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, 1));
    cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offsets, 2));
    cJSON_AddItemToObject(st->header, "blocks.0.attn.rope", e);
}
static void partial_mlp(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(st->header, "blocks.0.mlp.w3.weight"); }
static void only_mlp_norm(st_file *st)
{
    cJSON_DeleteItemFromObjectCaseSensitive(st->header, "blocks.0.mlp.w1.weight");
    cJSON_DeleteItemFromObjectCaseSensitive(st->header, "blocks.0.mlp.w2.weight");
    cJSON_DeleteItemFromObjectCaseSensitive(st->header, "blocks.0.mlp.w3.weight");
}
static void huge_claims(st_file *st)
{
    cJSON_DeleteItemFromObjectCaseSensitive(st->header, "embed.weight");
    set_meta(st, "seqflow.vocab", "67108864");
    set_meta(st, "seqflow.dim", "65536");
}
static void newline_name(st_file *st)
{
    cJSON *e = cJSON_Duplicate(tensor(st, "final_norm.weight"), 1);
    double offsets[2] = {0, 0}, shape[1] = {0};
    set_ints(e, "data_offsets", 2, offsets);
    set_ints(e, "shape", 1, shape);
    cJSON_AddItemToObject(st->header, "evil\nname", e);
}
static void no_segment(st_file *st) { set_meta(st, "seqflow.segment", NULL); }
static void no_branches(st_file *st) { set_meta(st, "seqflow.branches", NULL); }
static void no_metadata(st_file *st) { cJSON_DeleteItemFromObjectCaseSensitive(st->header, "__metadata__"); }
static void heads_word(st_file *st) { set_meta(st, "seqflow.heads", "two"); }
static void dim_trailing(st_file *st) { set_meta(st, "seqflow.dim", "4 "); }
static void memory_word(st_file *st) { set_meta(st, "seqflow.memory", "fast"); }
static void eps_word(st_file *st) { set_meta(st, "seqflow.norm_eps", "tiny"); }
static void causal_two(st_file *st) { set_meta(st, "seqflow.causal", "2"); }
static void branches_word(st_file *st) { set_meta(st, "seqflow.branches", "4:1,eight"); }
static void misspelt_key(st_file *st) { set_meta(st, "seqflow.sumary_tokens", "2"); }
static void vocab_mismatch(st_file *st) { set_meta(st, "seqflow.vocab", "9"); }
static void dim_mismatch(st_file *st) { set_meta(st, "seqflow.dim", "8"); }
static void heads_mismatch(st_file *st) { set_meta(st, "seqflow.heads", "1"); }
static void head_dim_mismatch(st_file *st) { set_meta(st, "seqflow.head_dim", "4"); }
static void layers_more(st_file *st) { set_meta(st, "seqflow.layers", "2"); }
static void layers_fewer(st_file *st) { set_meta(st, "seqflow.layers", "0"); }
static void window_bad(st_file *st) { set_meta(st, "seqflow.branches", "3:1"); }
static void summary_bad(st_file *st) { set_meta(st, "seqflow.summary_tokens", "9"); }
static void eps_zero(st_file *st) { set_meta(st, "seqflow.norm_eps", "0"); }
static void eps_tiny(st_file *st) { set_meta(st, "seqflow.norm_eps", "1e-320"); }

static void test_bad_tensors(void)
{
    REFUSE(drop_k, SF_E_MODEL, "blocks.0.attn.k.weight", "missing");
    REFUSE(drop_embed, SF_E_MODEL, "embed.weight", "missing");
    REFUSE(transpose_w2, SF_E_MODEL, "blocks.0.mlp.w2.weight", "expected shape [4, 3], got [3, 4]");
    REFUSE(f64_dtype, SF_E_MODEL, "blocks.0.attn.gate", "unknown dtype \"F64\"");
    REFUSE(dtype_number, SF_E_MODEL, "blocks.0.attn.gate", "dtype is not a string");
    REFUSE(no_dtype, SF_E_MODEL, "blocks.0.attn.v.weight", "no dtype");
    REFUSE(no_shape, SF_E_MODEL, "blocks.0.attn.v.weight", "no shape");
    REFUSE(no_offsets, SF_E_MODEL, "blocks.0.attn.v.weight", "no data_offsets");
    REFUSE(shape_string, SF_E_MODEL, "final_norm.weight", "shape is not an array");
    REFUSE(entry_not_object, SF_E_MODEL, "final_norm.weight", "not an object");
    REFUSE(negative_dim, SF_E_MODEL, "blocks.0.attn.q.weight", "not a non-negative integer");
    REFUSE(fractional_offset, SF_E_MODEL, "blocks.0.attn.gate", "data_offsets");
    REFUSE(three_offsets, SF_E_MODEL, "blocks.0.attn.gate", "two integers");
    REFUSE(reversed_offsets, SF_E_MODEL, "blocks.0.attn.gate", "end before");
    REFUSE(offsets_beyond, SF_E_MODEL, "blocks.0.attn.gate", "run past");
    REFUSE(size_mismatch, SF_E_MODEL, "final_norm.weight", "need 12");
    REFUSE(overlapping, SF_E_MODEL, "blocks.0.attn.k.weight", "blocks.0.attn.q.weight");
    REFUSE(extra_tensor, SF_E_MODEL, "unexpected tensor blocks.0.attn.rope", NULL);
    /* 16 TB of claimed weights: refused for the missing tensor, before any allocation. */
    REFUSE(huge_claims, SF_E_MODEL, "tensor embed.weight is missing", NULL);
    REFUSE(newline_name, SF_E_MODEL, "unexpected tensor evil?name", NULL);
    REFUSE(partial_mlp, SF_E_MODEL, "blocks.0.mlp.w3.weight", "all or none");
    REFUSE(only_mlp_norm, SF_E_MODEL, "blocks.0.mlp.w1.weight", "blocks.0.mlp_norm.weight");
}

static void test_bad_metadata(void)
{
    REFUSE(no_segment, SF_E_MODEL, "seqflow.segment", "missing");
    REFUSE(no_branches, SF_E_MODEL, "seqflow.branches", "missing");
    REFUSE(no_metadata, SF_E_MODEL, "seqflow.dim", "missing");
    REFUSE(heads_word, SF_E_MODEL, "seqflow.heads", "\"two\" is not an integer");
    REFUSE(dim_trailing, SF_E_MODEL, "seqflow.dim", "not an integer");
    REFUSE(memory_word, SF_E_MODEL, "seqflow.memory", "\"fast\"");
    REFUSE(eps_word, SF_E_MODEL, "seqflow.norm_eps", "not a number");
    REFUSE(causal_two, SF_E_MODEL, "seqflow.causal", "0 or 1");
    REFUSE(branches_word, SF_E_MODEL, "seqflow.branches", "4:1,eight");
    REFUSE(misspelt_key, SF_E_MODEL, "seqflow.sumary_tokens", "not a seqflow setting");
    REFUSE(vocab_mismatch, SF_E_CONFIG, "seqflow.vocab is 9", "embed.weight has 8 rows");
    REFUSE(dim_mismatch, SF_E_CONFIG, "seqflow.dim is 8", "embed.weight");
    REFUSE(heads_mismatch, SF_E_CONFIG, "seqflow.heads is 1", "blocks.0.attn.gate");
    REFUSE(head_dim_mismatch, SF_E_CONFIG, "seqflow.heads*seqflow.head_dim", "blocks.0.attn.q.weight");
    REFUSE(layers_more, SF_E_CONFIG, "seqflow.layers is 2", "block 1");
    REFUSE(layers_fewer, SF_E_CONFIG, "seqflow.layers is 0", "blocks.0.");
    REFUSE(window_bad, SF_E_CONFIG, "window 3", "does not divide the segment length 8");
    REFUSE(summary_bad, SF_E_CONFIG, "summary_tokens", "9");
    REFUSE(eps_zero, SF_E_CONFIG, "norm_eps", "positive");

    /* Defaults of the optional keys, and keys of other tools left alone. */
    st_file st;
    tiny_file(&st);
    const char *optional[] = {"seqflow.causal", "seqflow.memory", "seqflow.global_tokens",
                              "seqflow.summary_tokens", "seqflow.norm_eps"};
    for (int i = 0; i < 5; i++) set_meta(&st, optional[i], NULL);
    set_meta(&st, "format", "pt");
    const char *path = check_tmp_path("defaults.safetensors");
    st_write(path, &st);
    st_free(&st);
    sf_model *m = NULL;
    CHECK_OK(sf_model_load(path, &m));
    if (m) {
        const sf_model_config *c = sf_model_get_config(m);
        CHECK(c->causal == 1 && c->memory == SF_MEMORY_DELTA && c->global_tokens == 0 &&
              c->summary_tokens == 0 && c->norm_eps == 1e-6f && c->mlp_hidden == 3 &&
              c->final_norm == 1);
    }
    sf_model_free(m);

    /* a valid but tiny epsilon (below the smallest double even) is a number: it loads as the
     * smallest positive float */
    tiny_file(&st);
    eps_tiny(&st);
    st_write(path, &st);
    st_free(&st);
    m = NULL;
    CHECKF(sf_model_load(path, &m) == SF_OK, "tiny norm_eps: %s", sf_last_error());
    CHECK(m && sf_model_get_config(m)->norm_eps > 0.0f);
    sf_model_free(m);
    unlink(path);
}

/* A NaN or infinity anywhere in the weights is refused at load, naming the tensor and the
 * element: the first tensor in the data buffer and one in the middle of a block. */
static void test_non_finite_weights(void)
{
    static const struct {
        const char *name;
        uint32_t bits;
        size_t element;
        const char *what;
    } cases[] = {
        {"embed.weight", 0x7fc00000u, 3, "element 3 is NaN"},
        {"blocks.0.attn.q.weight", 0x7f800000u, 5, "element 5 is infinite"},
        {"blocks.0.attn.q.weight", 0xff800000u, 0, "element 0 is infinite"},
    };
    const char *path = check_tmp_path("non-finite.safetensors");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        st_file st = {0};
        CHECK(st_read(good_path, &st));
        cJSON *entry = tensor(&st, cases[c].name);
        CHECKF(entry != NULL, "no tensor %s", cases[c].name);
        if (!entry) {
            st_free(&st);
            continue;
        }
        cJSON *offsets = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
        size_t at = (size_t)cJSON_GetArrayItem(offsets, 0)->valuedouble + cases[c].element * 4;
        CHECK(at + 4 <= st.data_len);
        for (int i = 0; i < 4; i++) st.data[at + i] = (unsigned char)(cases[c].bits >> (8 * i));
        st_write(path, &st);
        st_free(&st);
        EXPECT_REFUSED(path, SF_E_MODEL, cases[c].name, cases[c].what);
    }
    unlink(path);
}

/* Random corruption of a good file: every outcome must be a clean load or a clean refusal. */
static void test_corruption(void)
{
    size_t n = 0;
    unsigned char *good = read_bytes(good_path, &n);
    CHECK(good != NULL && n > 8);
    if (!good) return;
    unsigned char *bad = malloc(n);
    const char *path = check_tmp_path("corrupt.safetensors");
    check_rng rng = {12345};
    int refused = 0, loaded = 0, clean = 1;
    for (int trial = 0; trial < 400; trial++) {
        memcpy(bad, good, n);
        size_t header_end = 8 + (size_t)good[0] + ((size_t)good[1] << 8);
        int flips = 1 + (int)(check_rng_next(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            /* Mostly the header, where the parser's decisions are. */
            size_t at = (size_t)(check_rng_next(&rng) % (trial % 4 ? header_end : n));
            bad[at] = (unsigned char)check_rng_next(&rng);
        }
        size_t len = trial % 5 == 0 ? (size_t)(check_rng_next(&rng) % n) : n;
        write_bytes(path, bad, len);
        sf_model *m = NULL;
        sf_clear_error();
        int rc = sf_model_load(path, &m);
        if (rc == SF_OK) {
            loaded++;
            clean &= m != NULL;
        } else {
            refused++;
            clean &= m == NULL && rc < 0 && sf_last_error()[0] != '\0' &&
                     strchr(sf_last_error(), '\n') == NULL;
        }
        sf_model_free(m);
    }
    CHECK(clean);
    CHECKF(refused > 300, "%d refused, %d loaded", refused, loaded);
    free(bad);
    free(good);
    unlink(path);
}

int main(void)
{
    test_random_model();
    test_round_trip();

    sf_model_config cfg;
    tiny_config(&cfg);
    sf_model *tiny = NULL;
    snprintf(good_path, sizeof good_path, "%s", check_tmp_path("tiny.safetensors"));
    CHECK_OK(sf_model_create_random(&cfg, 7, &tiny));
    CHECK_OK(sf_model_save(tiny, good_path));
    sf_model *back = NULL;
    CHECK_OK(sf_model_load(good_path, &back));
    CHECK(back && same_weights(tiny, back));
    sf_model_free(back);
    sf_model_free(tiny);

    test_half_types();
    test_unreadable_and_truncated();
    test_bad_header();
    test_bad_tensors();
    test_bad_metadata();
    test_corruption();
    test_non_finite_weights();
    unlink(good_path);
    return check_finish("test_model");
}
