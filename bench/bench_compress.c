/* Frame compression on real state and activations: runs the built-in default model over the
 * built-in text (or --input FILE, bytes as tokens, split into --streams streams) in push mode,
 * takes every stream's block state from sf_graph_save (M, z, global keys and values) and the
 * output hidden states, and for each quantizer x codec reports the ratio against raw float32,
 * the relative error ||x - x'|| / ||x|| and encode / decode GB/s of float32 input on one thread
 * (best of --repeat).
 *
 *   bench_compress [--input FILE] [--streams S] [--repeat N] [--max-hidden-rows R] [--quick] [--shuffle]
 *
 * --shuffle byte-shuffles every frame before its codec (compress/frame.h; it changes only the
 * lossless f32 and bf16 cells under LZ4/zstd).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/frame.h"
#include "seqflow/error.h"
#include "seqflow/graph.h"
#include "seqflow/model.h"
#include "seqflow/packet.h"
#include "stages/builtin_text.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *name;
    float *x;
    size_t rows, cols; /* cols = the natural row: head_dim for M and z, D for the rest */
} tensor;

static int append_floats(tensor *t, const float *src, size_t n)
{
    float *x = realloc(t->x, (t->rows * t->cols + n) * sizeof *x);
    if (!x) return -1;
    memcpy(x + t->rows * t->cols, src, n * sizeof *x);
    t->x = x;
    t->rows += n / t->cols;
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            char *b = realloc(buf, cap = cap ? cap * 2 : 1 << 16);
            if (!b) break;
            buf = b;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got);
    fclose(f);
    *len = n;
    return buf;
}

/* Splits sf_graph_save's blob into the block stage's state (format above block_save in
 * stages/block.c): u32 streams, first, count; per stream u64 id, M, z, g_count, g_head, gk, gv. */
static int collect_state(const uint8_t *blob, size_t len, const sf_model_config *c, tensor *M, tensor *z, tensor *g)
{
    size_t at = 0;
    while (len - at >= 8) {
        uint32_t name_len;
        uint64_t state_len;
        memcpy(&name_len, blob + at + 4, 4);
        at += 8;
        if (len - at < (size_t)name_len + 8) return -1;
        int is_block = name_len == 5 && memcmp(blob + at, "block", 5) == 0;
        at += name_len;
        memcpy(&state_len, blob + at, 8);
        at += 8;
        if (state_len > len - at) return -1;
        if (is_block) {
            const uint8_t *s = blob + at;
            uint32_t head[3];
            memcpy(head, s, sizeof head);
            size_t count = head[2], W = (size_t)c->heads * c->head_dim;
            size_t nM = count * c->heads * c->head_dim * c->head_dim, nz = count * c->heads * c->head_dim;
            size_t ng = count * c->global_tokens * W;
            size_t per = 8 + (nM + nz + 2 * ng) * sizeof(float) + 2 * count * sizeof(int);
            if (state_len != sizeof head + head[0] * per) return -1;
            for (size_t i = 0; i < head[0]; i++) {
                const uint8_t *p = s + sizeof head + i * per + 8;
                float *tmp = malloc((nM + nz + 2 * ng) * sizeof *tmp);
                if (!tmp) return -1;
                memcpy(tmp, p, (nM + nz) * sizeof(float));
                memcpy(tmp + nM + nz, p + (nM + nz) * sizeof(float) + 2 * count * sizeof(int), 2 * ng * sizeof(float));
                int rc = append_floats(M, tmp, nM) | append_floats(z, tmp + nM, nz) |
                         append_floats(g, tmp + nM + nz, 2 * ng);
                free(tmp);
                if (rc) return -1;
            }
        }
        at += (size_t)state_len;
    }
    return 0;
}

typedef struct {
    const char *name;
    sf_codec codec;
    int level;
} codec_case;

typedef struct {
    const char *name;
    sf_quant_kind kind;
    int group; /* 0 = per row */
} quant_case;

static void bench_one(const tensor *t, const quant_case *qc, const codec_case *cc, int repeat, int shuffle,
                      sf_buffer *buf, float *y)
{
    size_t n = t->rows * t->cols;
    sf_frame_desc d = {.kind = SF_FRAME_STATE, .dtype = SF_FRAME_F32, .ndim = 2, .shape = {t->rows, t->cols},
                       .codec = cc->codec, .level = cc->level,
                       .quant = {qc->kind, qc->group ? qc->group : (int)t->cols}, .shuffle = shuffle};
    double best_enc = INFINITY, best_dec = INFINITY, spent = 0;
    int reps = cc->codec == SF_CODEC_ZSTD && cc->level >= 10 ? 1 : repeat;
    for (int r = 0; r < reps && (r == 0 || spent < 2.0); r++) {
        buf->len = 0;
        double t0 = now();
        int rc = sf_frame_encode(&d, t->x, n * sizeof(float), NULL, buf);
        double t1 = now();
        if (rc == 0) rc = sf_frame_decode_into(buf->data, buf->len, (size_t)1 << 34, NULL, y, n * sizeof *y, NULL);
        double t2 = now();
        if (rc) {
            printf("%-8s %-9s %-8s failed: %s\n", t->name, qc->name, cc->name, sf_last_error());
            return;
        }
        best_enc = fmin(best_enc, t1 - t0);
        best_dec = fmin(best_dec, t2 - t1);
        spent += t2 - t0;
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)t->x[i] - (double)y[i];
        num += e * e;
        den += (double)t->x[i] * (double)t->x[i];
    }
    double bytes = (double)n * sizeof(float);
    printf("%-8s %-9s %-8s %9zu %7.2fx %10.3g %8.3f %8.3f\n", t->name, qc->name, cc->name, buf->len,
           bytes / (double)buf->len, den > 0 ? sqrt(num / den) : sqrt(num), bytes / best_enc / 1e9,
           bytes / best_dec / 1e9);
}

int main(int argc, char **argv)
{
    const char *input = NULL;
    int streams = 0, repeat = 5, quick = 0, shuffle = 0;
    long max_hidden_rows = 8192;
    static const struct option longopts[] = {{"input", required_argument, 0, 'i'},
                                             {"streams", required_argument, 0, 's'},
                                             {"repeat", required_argument, 0, 'r'},
                                             {"max-hidden-rows", required_argument, 0, 'm'},
                                             {"quick", no_argument, 0, 'q'},
                                             {"shuffle", no_argument, 0, 'S'},
                                             {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "i:s:r:m:qS", longopts, NULL)) != -1;) {
        switch (o) {
        case 'i': input = optarg; break;
        case 's': streams = atoi(optarg); break;
        case 'r': repeat = atoi(optarg); break;
        case 'm': max_hidden_rows = atol(optarg); break;
        case 'q': quick = 1; break;
        case 'S': shuffle = 1; break;
        default:
            fprintf(stderr, "usage: bench_compress [--input FILE] [--streams S] [--repeat N] "
                            "[--max-hidden-rows R] [--quick] [--shuffle]\n");
            return 2;
        }
    }
    if (repeat < 1) repeat = 1;

    size_t text_len = sf_builtin_text_length();
    char *owned = NULL;
    const char *text = sf_builtin_text();
    if (input) {
        if (!(owned = read_file(input, &text_len))) {
            fprintf(stderr, "bench_compress: cannot read %s\n", input);
            return 1;
        }
        text = owned;
    }
    sf_model_config cfg;
    sf_model_config_default(&cfg);
    /* Each stream gets at least two segments, so that its memory has absorbed real text. */
    if (streams <= 0) streams = (int)(text_len / (2 * (size_t)cfg.segment));
    if (streams < 1) streams = 1;
    if (streams > 64) streams = 64;

    sf_model *model = NULL;
    sf_graph *g = NULL;
    sf_graph_options gopts = {.threads = 1};
    int rc = sf_model_create_random(&cfg, SF_DEFAULT_SEED, &model);
    if (rc == 0) rc = sf_graph_create(model, &gopts, &g);
    if (rc == 0) rc = sf_graph_parse(g, "segment ! embed ! block ! norm");
    tensor M = {"state.M", NULL, 0, (size_t)cfg.head_dim}, z = {"state.z", NULL, 0, (size_t)cfg.head_dim};
    tensor gl = {"state.g", NULL, 0, (size_t)cfg.heads * cfg.head_dim}, hid = {"hidden", NULL, 0, (size_t)cfg.dim};
    size_t per = text_len / (size_t)streams;
    uint32_t *tokens = malloc((per + 1) * sizeof *tokens);
    for (int s = 0; s < streams && rc == 0 && tokens; s++) {
        for (size_t i = 0; i < per; i++) tokens[i] = (unsigned char)text[(size_t)s * per + i];
        rc = sf_graph_push(g, (uint64_t)s, tokens, per);
    }
    /* State after the pushed text (before end, which completes and commits partial segments). */
    sf_buffer blob = {0};
    if (rc == 0) rc = sf_graph_save(g, &blob);
    if (rc == 0 && collect_state(blob.data, blob.len, &cfg, &M, &z, &gl))
        rc = sf_error(SF_E_STATE, "block state does not have the expected layout");
    for (int s = 0; s < streams && rc == 0; s++) rc = sf_graph_end(g, (uint64_t)s);
    for (sf_packet *p; rc == 0 && (p = sf_graph_pull(g)); sf_packet_free(p))
        if (p->x && p->width == hid.cols && (long)hid.rows < max_hidden_rows) {
            size_t rows = p->n;
            if ((long)(hid.rows + rows) > max_hidden_rows) rows = (size_t)(max_hidden_rows - (long)hid.rows);
            if (append_floats(&hid, p->x, rows * p->width)) rc = SF_E_NOMEM;
        }
    if (rc || !tokens || !M.rows || !hid.rows) {
        fprintf(stderr, "bench_compress: %s\n", rc ? sf_last_error() : "no state or hidden states collected");
        return 1;
    }

    static const codec_case codecs[] = {{"raw", SF_CODEC_RAW, 0},   {"lz4", SF_CODEC_LZ4, 1},
                                        {"lz4-hc9", SF_CODEC_LZ4, 9}, {"zstd-1", SF_CODEC_ZSTD, 1},
                                        {"zstd-3", SF_CODEC_ZSTD, 3}, {"zstd-19", SF_CODEC_ZSTD, 19}};
    static const quant_case quants[] = {{"f32", SF_QUANT_F32, 1},     {"bf16", SF_QUANT_BF16, 1},
                                        {"int8/32", SF_QUANT_INT8, 32}, {"int8/64", SF_QUANT_INT8, 64},
                                        {"int8/row", SF_QUANT_INT8, 0}, {"int4/32", SF_QUANT_INT4, 32},
                                        {"int4/64", SF_QUANT_INT4, 64}, {"int4/row", SF_QUANT_INT4, 0},
                                        {"fp8/32", SF_QUANT_FP8_E4M3, 32}, {"fp8/64", SF_QUANT_FP8_E4M3, 64},
                                        {"fp8/row", SF_QUANT_FP8_E4M3, 0}};
    tensor *tensors[] = {&M, &z, &gl, &hid};
    printf("bench_compress: default model (D=%d, H=%d, d=%d, L=%d, G=%d), %s (%zu bytes), %d streams of %zu tokens\n",
           cfg.dim, cfg.heads, cfg.head_dim, cfg.layers, cfg.global_tokens, input ? input : "built-in text",
           text_len, streams, per);
    for (size_t t = 0; t < 4; t++)
        printf("  %-8s %zu x %zu floats (%.2f MB)\n", tensors[t]->name, tensors[t]->rows, tensors[t]->cols,
               (double)(tensors[t]->rows * tensors[t]->cols * 4) / 1e6);
    printf("one thread, best of %d (zstd-19: 1); GB/s of float32 input (1e9 bytes)%s\n", repeat,
           shuffle ? "; byte shuffle on" : "");
    printf("%-8s %-9s %-8s %9s %8s %10s %8s %8s\n", "tensor", "quant", "codec", "bytes", "ratio", "rel.err",
           "enc GB/s", "dec GB/s");
    sf_buffer buf = {0};
    for (size_t t = 0; t < 4; t++) {
        size_t n = tensors[t]->rows * tensors[t]->cols;
        float *y = malloc(n * sizeof *y);
        for (size_t q = 0; q < sizeof quants / sizeof quants[0]; q++)
            for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
                if (quick && (codecs[c].level == 19 || quants[q].group == 32)) continue;
                bench_one(tensors[t], &quants[q], &codecs[c], repeat, shuffle, &buf, y);
            }
        free(y);
    }
    sf_buffer_release(&buf);
    sf_buffer_release(&blob);
    for (size_t t = 0; t < 4; t++) free(tensors[t]->x);
    free(tokens);
    free(owned);
    sf_graph_free(g);
    sf_model_free(model);
    return 0;
}
