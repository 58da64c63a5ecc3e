/* The seqflow binary end to end: the default run, output files, Ctrl-C, and every bad input of
 * the core issue ending in one line on stderr, a non-zero exit and no output file. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "seqflow/seqflow.h"
#include "support/check.h"
#include "support/files.h"
#include "support/spawn.h"

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void write_all(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

/* A copy of a safetensors file whose JSON header went through `mutate`. */
typedef void (*header_mutation)(cJSON *header);
static void write_mutated(const char *src, const char *dst, header_mutation mutate)
{
    size_t len;
    unsigned char *file = check_read_file(src, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | file[i];
    char *json = strndup((const char *)file + 8, (size_t)hlen);
    cJSON *header = cJSON_Parse(json);
    mutate(header);
    char *text = cJSON_PrintUnformatted(header);
    uint64_t new_len = strlen(text);
    FILE *f = fopen(dst, "wb");
    for (int i = 0; i < 8; i++) fputc((int)(new_len >> (8 * i)) & 0xff, f);
    fwrite(text, 1, new_len, f);
    fwrite(file + 8 + hlen, 1, len - 8 - hlen, f);
    fclose(f);
    free(text);
    cJSON_Delete(header);
    free(json);
    free(file);
}

static void drop_q(cJSON *h) { cJSON_DeleteItemFromObject(h, "blocks.0.attn.q.weight"); }
static void misshape_k(cJSON *h)
{
    cJSON *shape = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "blocks.0.attn.k.weight"), "shape");
    cJSON_SetNumberValue(cJSON_GetArrayItem(shape, 0), 8);
    cJSON_SetNumberValue(cJSON_GetArrayItem(shape, 1), cJSON_GetArrayItem(shape, 1)->valuedouble * 4);
}
static void unknown_dtype(cJSON *h)
{
    cJSON *t = cJSON_GetObjectItem(h, "blocks.0.attn.v.weight");
    cJSON_ReplaceItemInObject(t, "dtype", cJSON_CreateString("F64"));
}
static void offsets_out_of_range(cJSON *h)
{
    cJSON *off = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "embed.weight"), "data_offsets");
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 0), 1e12);
    cJSON_SetNumberValue(cJSON_GetArrayItem(off, 1), 1e12 + 4);
}
static void offsets_overlap(cJSON *h)
{
    /* point the gate at the start of the q weights: same size class not needed, bytes overlap */
    cJSON *q = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "blocks.0.attn.q.weight"), "data_offsets");
    cJSON *g = cJSON_GetObjectItem(cJSON_GetObjectItem(h, "blocks.0.attn.gate"), "data_offsets");
    double begin = cJSON_GetArrayItem(q, 0)->valuedouble;
    double size = cJSON_GetArrayItem(g, 1)->valuedouble - cJSON_GetArrayItem(g, 0)->valuedouble;
    cJSON_SetNumberValue(cJSON_GetArrayItem(g, 0), begin);
    cJSON_SetNumberValue(cJSON_GetArrayItem(g, 1), begin + size);
}
static void inconsistent_metadata(cJSON *h)
{
    cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
    cJSON_ReplaceItemInObject(meta, "seqflow.heads", cJSON_CreateString("3"));
}

/* Runs the binary and checks the failure contract. */
static void expect_failure(const char *what, const char *const *argv, const void *in, size_t in_len,
                           const char *mentions, const char *out_path)
{
    spawn_result r;
    CHECK(spawn_run(argv, in, in_len, &r) == 0);
    CHECKF(r.exit_code != 0 && r.exit_code < 128, "%s: exit code %d", what, r.exit_code);
    CHECKF(r.err_lines == 1, "%s: %d lines on stderr: %s", what, r.err_lines, r.err);
    CHECKF(strstr(r.err, mentions) != NULL, "%s: stderr does not mention '%s': %s", what, mentions, r.err);
    CHECKF(strncmp(r.err, "seqflow: ", 9) == 0, "%s: %s", what, r.err);
    if (out_path) CHECKF(file_size(out_path) < 0, "%s: output %s was written", what, out_path);
}

int main(void)
{
    if (!spawn_binary()) return check_skip("SEQFLOW_BIN is not set");
    spawn_result r;

    /* the default run: built-in model on built-in text, a digest and a summary */
    CHECK(spawn_run((const char *[]){"seqflow", "run", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "default run: %s", r.err);
    CHECK(strstr(r.out, "digest: rows=") != NULL);
    CHECK(strstr(r.err, "tokens/s") != NULL);
    CHECK(spawn_run((const char *[]){"seqflow", "--help", NULL}, NULL, 0, &r) == 0);
    CHECK(r.exit_code == 0 && strstr(r.out, "--branches") && strstr(r.out, "--out"));
    CHECK(spawn_run((const char *[]){"seqflow", "stages", NULL}, NULL, 0, &r) == 0);
    CHECK(r.exit_code == 0 && strstr(r.out, "segment") && strstr(r.out, "max_streams"));
    /* each option with its default, range and unit, or its choices, from the stage's table */
    CHECKF(strstr(r.out, "chunk=INT") && strstr(r.out, "bytes read per packet (default 65536, 1..67108864 bytes)"), "%s", r.out);
    CHECK(strstr(r.out, "state_budget=INT") && strstr(r.out, "(default 0, >= 0 bytes)"));
    CHECK(strstr(r.out, "dtype=f32|bf16") && strstr(r.out, "format=auto|raw|npy|digest|null"));
    CHECK(strstr(r.out, "defer_commit=INT") && strstr(r.out, "(default 2, 0..2)") && !strstr(r.out, "lanes="));

    /* --out: raw float32 and .npy with [tokens, D] */
    const char *text = "hello seqflow, hello streams";
    size_t n = strlen(text);
    const char *raw = check_tmp_path("out.f32"), *npy = check_tmp_path("out.npy");
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "-o", raw, "-q", NULL}, text, n, &r) == 0);
    CHECKF(r.exit_code == 0, "%s", r.err);
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    CHECK(file_size(raw) == (long)(n * (size_t)cfg.dim * 4));
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "-o", npy, "-q", NULL}, text, n, &r) == 0);
    size_t npy_len, raw_len;
    unsigned char *npy_bytes = check_read_file(npy, &npy_len), *raw_bytes = check_read_file(raw, &raw_len);
    CHECK(npy_bytes && memcmp(npy_bytes, "\x93NUMPY", 6) == 0);
    char shape[64];
    snprintf(shape, sizeof shape, "'shape': (%zu, %d)", n, cfg.dim);
    CHECK(npy_bytes && strstr((const char *)npy_bytes + 10, shape) != NULL);
    CHECK(npy_len == raw_len + 128 && memcmp(npy_bytes + 128, raw_bytes, raw_len) == 0);
    free(npy_bytes);

    /* an empty input gives an empty [0, D] array */
    const char *empty = check_tmp_path("empty.npy");
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "-o", empty, "-q", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "%s", r.err);
    size_t empty_len;
    unsigned char *empty_bytes = check_read_file(empty, &empty_len);
    snprintf(shape, sizeof shape, "'shape': (0, %d)", cfg.dim);
    CHECK(empty_bytes && empty_len == 128 && strstr((const char *)empty_bytes + 10, shape) != NULL);
    free(empty_bytes);

    /* the binary's output equals the library driven in push mode */
    sf_model *m;
    CHECK_OK(sf_model_create_random(&cfg, SF_DEFAULT_SEED, &m));
    sf_graph *g;
    CHECK_OK(sf_graph_create(m, NULL, &g));
    CHECK_OK(sf_graph_parse(g, "segment ! embed ! block ! norm"));
    uint32_t tokens[64];
    for (size_t i = 0; i < n; i++) tokens[i] = (unsigned char)text[i];
    CHECK_OK(sf_graph_push(g, 0, tokens, n));
    CHECK_OK(sf_graph_end(g, 0));
    size_t at = 0;
    int same = 1;
    for (sf_packet *p; (p = sf_graph_pull(g)); sf_packet_free(p)) {
        size_t bytes = p->n * p->width * 4;
        same &= at + bytes <= raw_len && memcmp(raw_bytes + at, p->x, bytes) == 0;
        at += bytes;
    }
    CHECK(same && at == raw_len);
    sf_graph_free(g);

    /* --out-dtype bf16: two bytes a value, each the float32 output rounded to nearest even
     * (raw and .npy, whose header names uint16); its digest over the bf16 bytes */
    const char *raw16 = check_tmp_path("out.bf16"), *npy16 = check_tmp_path("out16.npy");
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "-o", raw16, "--out-dtype", "bf16", "-q", NULL}, text, n,
                    &r) == 0);
    CHECKF(r.exit_code == 0, "%s", r.err);
    size_t raw16_len;
    unsigned char *raw16_bytes = check_read_file(raw16, &raw16_len);
    CHECK(raw16_bytes && raw16_len * 2 == raw_len);
    size_t mismatched = 0;
    for (size_t i = 0; raw16_bytes && i < raw_len / 4 && raw16_len * 2 == raw_len; i++) {
        float value;
        uint16_t got;
        memcpy(&value, raw_bytes + 4 * i, 4);
        memcpy(&got, raw16_bytes + 2 * i, 2);
        mismatched += got != check_bf16_bits(value);
    }
    CHECKF(mismatched == 0, "%zu bf16 values are not the float32 output rounded to nearest even", mismatched);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "-o", npy16, "--out-dtype", "bf16", "-q", NULL}, text, n,
                    &r) == 0);
    unsigned char *npy16_bytes = check_read_file(npy16, &npy_len);
    snprintf(shape, sizeof shape, "'shape': (%zu, %d)", n, cfg.dim);
    CHECK(npy16_bytes && strstr((const char *)npy16_bytes + 10, "'descr': '<u2'") && strstr((const char *)npy16_bytes + 10, shape));
    CHECK(npy16_bytes && raw16_bytes && npy_len == raw16_len + 128 && memcmp(npy16_bytes + 128, raw16_bytes, raw16_len) == 0);
    free(npy16_bytes);
    free(raw16_bytes);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-i", "-", "--out-dtype", "bf16", "-q", NULL}, text, n, &r) == 0);
    CHECK(r.exit_code == 0 && strstr(r.out, "digest: rows=") && strstr(r.out, "dtype=bf16"));
    expect_failure("--out-dtype without a norm",
                   (const char *[]){"seqflow", "run", "-i", "-", "--out-dtype", "bf16", "segment ! embed ! block", NULL}, text,
                   n, "norm stage", NULL);
    expect_failure("--out-dtype beside the norm's own", (const char *[]){"seqflow", "run", "-i", "-", "--out-dtype", "bf16",
                                                                       "segment ! embed ! block ! norm dtype=f32", NULL},
                   text, n, "own dtype", NULL);
    expect_failure("--out-dtype unknown", (const char *[]){"seqflow", "run", "--out-dtype", "f16", NULL}, NULL, 0, "f32 or bf16",
                   NULL);
    expect_failure("bf16 rows into a block",
                   (const char *[]){"seqflow", "run", "-i", "-", "segment ! embed ! norm dtype=bf16 ! block", NULL}, text, n,
                   "bf16", NULL);
    /* fp8 products are the GPU's: refused on the cpu, and named */
    expect_failure("--precision fp8 on cpu", (const char *[]){"seqflow", "run", "-i", "-", "--precision", "fp8", NULL},
                   text, n, "needs -d cuda", NULL);
    expect_failure("--precision unknown", (const char *[]){"seqflow", "run", "--precision", "fp4", NULL}, NULL, 0,
                   "bf16, fp8 or f32", NULL);
    /* the cpu backend has no settings: one given is refused by name, not ignored */
    expect_failure("--backend-settings on cpu",
                   (const char *[]){"seqflow", "run", "-i", "-", "--backend-settings", "gemm=lt", NULL}, text, n,
                   "no setting 'gemm'", NULL);
    free(raw_bytes);

    /* Ctrl-C: reading a stdin that never ends, SIGINT flushes what was read and exits 130 */
    const char *ctrlc_out = check_tmp_path("ctrlc.f32"), *ctrlc_err = check_tmp_path("ctrlc.err");
    int fd;
    int pid = spawn_start((const char *[]){"seqflow", "run", "-i", "-", "-o", ctrlc_out, "--no-progress",
                                           "--segment", "64", "--branches", "64:1", NULL},
                          &fd, ctrlc_err);
    CHECK(pid > 0);
    char chunk[100];
    memset(chunk, 'a', sizeof chunk);
    CHECK(write(fd, chunk, sizeof chunk) == (ssize_t)sizeof chunk);
    /* the sink's temporary file appears once the graph runs (after the handler is installed);
     * then give the source time to read what was written */
    char partial[600];
    snprintf(partial, sizeof partial, "%s.partial-%d", ctrlc_out, pid);
    struct timespec tick = {0, 10 * 1000 * 1000}, pause = {0, 300 * 1000 * 1000};
    for (int waited = 0; waited < 3000 && file_size(partial) < 0; waited++) nanosleep(&tick, NULL);
    CHECKF(file_size(partial) >= 0, "the interrupted run never started its sink");
    nanosleep(&pause, NULL);
    kill(pid, SIGINT);
    nanosleep(&pause, NULL);
    close(fd); /* a source blocked in read() sees the end once the writer goes */
    int code = spawn_wait(pid);
    CHECKF(code == 130, "interrupted run exited %d", code);
    CHECKF(file_size(ctrlc_out) == (long)(100 * (size_t)cfg.dim * 4), "interrupted output holds %ld bytes",
           file_size(ctrlc_out));

    /* ---- bad inputs ---- */
    const char *out = check_tmp_path("never.f32");
    const char *good = check_tmp_path("good.safetensors");
    sf_model_config small = cfg;
    small.dim = 16, small.heads = 2, small.head_dim = 8, small.layers = 1, small.segment = 32;
    small.n_branches = 1, small.branches[0] = (sf_branch){32, 1}, small.mlp_hidden = 0;
    sf_model *sm;
    CHECK_OK(sf_model_create_random(&small, 3, &sm));
    CHECK_OK(sf_model_save(sm, good));
    sf_model_free(sm);
    CHECK(spawn_run((const char *[]){"seqflow", "run", "-m", good, "-q", NULL}, NULL, 0, &r) == 0);
    CHECKF(r.exit_code == 0, "a saved model runs: %s", r.err);

    size_t good_len;
    unsigned char *good_bytes = check_read_file(good, &good_len);
    const char *bad = check_tmp_path("bad.safetensors");
    write_all(bad, good_bytes, good_len / 2);
    expect_failure("truncated model", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, bad, out);
    unsigned char header_len[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, '{', '}'};
    write_all(bad, header_len, sizeof header_len);
    expect_failure("bad header length", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "header", out);
    unsigned char bad_json[] = {9, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'a', '"', ':', '[', '1', ',', '}'};
    write_all(bad, bad_json, sizeof bad_json);
    expect_failure("bad JSON", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "JSON", out);
    write_mutated(good, bad, drop_q);
    expect_failure("missing tensor", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "blocks.0.attn.q.weight", out);
    write_mutated(good, bad, misshape_k);
    expect_failure("misshapen tensor", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "blocks.0.attn.k.weight", out);
    write_mutated(good, bad, unknown_dtype);
    expect_failure("unknown dtype", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "F64", out);
    write_mutated(good, bad, offsets_out_of_range);
    expect_failure("offsets out of range", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "embed.weight", out);
    write_mutated(good, bad, offsets_overlap);
    expect_failure("overlapping offsets", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "overlap", out);
    write_mutated(good, bad, inconsistent_metadata);
    expect_failure("inconsistent metadata", (const char *[]){"seqflow", "run", "-m", bad, "-o", out, NULL}, NULL, 0, "heads", out);
    free(good_bytes);

    expect_failure("window does not divide the segment",
                   (const char *[]){"seqflow", "run", "--branches", "100:1", "-o", out, NULL}, NULL, 0, "divide", out);
    expect_failure("dilation does not divide the window",
                   (const char *[]){"seqflow", "run", "--branches", "64:3", "-o", out, NULL}, NULL, 0, "divide", out);
    expect_failure("token outside the vocabulary",
                   (const char *[]){"seqflow", "run", "-i", "-", "-f", "text", "-o", out, NULL}, "1 2 300 4", 9, "300", out);
    expect_failure("u32 length", (const char *[]){"seqflow", "run", "-i", "-", "-f", "u32", "-o", out, NULL},
                   "\1\0\0\0\2\0", 6, "multiple of 4", out);
    expect_failure("unknown stage", (const char *[]){"seqflow", "run", "segment ! embed ! frobnicate", "-o", out, NULL},
                   NULL, 0, "frobnicate", out);
    expect_failure("unknown option", (const char *[]){"seqflow", "run", "segment ! embed ! block speed=11", "-o", out, NULL},
                   NULL, 0, "speed", out);
    expect_failure("unwritable output", (const char *[]){"seqflow", "run", "-o", "/nonexistent-dir/x.f32", NULL}, NULL, 0,
                   "/nonexistent-dir/x.f32", NULL);
    expect_failure("missing input file", (const char *[]){"seqflow", "run", "-i", "/nonexistent-input", "-o", out, NULL},
                   NULL, 0, "/nonexistent-input", out);
    sf_model_free(m);
    return check_finish("test_cli");
}
