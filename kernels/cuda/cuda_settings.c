/* Parsing of the CUDA backend's settings (cuda_settings.h). Plain C: it launches nothing. */
#include "kernels/cuda/cuda_settings.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seqflow/error.h"

/* One key: its name, environment variable, the field it fills and the words it takes, in the
 * order of their values (0, 1, ...). */
typedef struct setting {
    const char *key;
    const char *env;
    size_t offset;
    const char *const *values;
} setting;

static const char *const off_on[] = {"0", "1", NULL};
static const char *const qkv_values[] = {"f32", "bf16", NULL};
static const char *const gemm_values[] = {"fastest", "gemmex", "lt", NULL};
static const char *const memory_values[] = {"auto", "tiled", "fma", "mma", NULL};
static const char *const fp8_scale_values[] = {"auto", "epilogue", NULL};
static const char *const fp8_accum_values[] = {"exact", "fast", NULL};
static const char *const nccl_ctas_values[] = {"auto", "2", "4", "8", "16", "32", NULL};

#define FIELD(f) offsetof(sf_cuda_settings, f)
static const setting settings[] = {
    {"qkv", "SEQFLOW_CUDA_QKV", FIELD(qkv_bf16), qkv_values},
    {"gemm", "SEQFLOW_CUDA_GEMM", FIELD(gemm), gemm_values},
    {"memory", "SEQFLOW_CUDA_MEMORY", FIELD(memory), memory_values},
    {"memory_bf16", "SEQFLOW_CUDA_MEMORY_BF16", FIELD(memory_bf16), off_on},
    {"attention_mix", "SEQFLOW_CUDA_ATTENTION_MIX", FIELD(attention_mix), off_on},
    {"gate_up", "SEQFLOW_CUDA_GATE_UP", FIELD(gate_up), off_on},
    {"normed_sums", "SEQFLOW_CUDA_NORMED_SUMS", FIELD(normed_sums), off_on},
    {"side_queue", "SEQFLOW_CUDA_SIDE_QUEUE", FIELD(side_queue), off_on},
    {"early_launch", "SEQFLOW_CUDA_PDL", FIELD(early_launch), off_on},
    {"upload_unordered", "SEQFLOW_CUDA_UPLOAD_UNORDERED", FIELD(upload_unordered), off_on},
    {"pinned_packets", "SEQFLOW_PINNED_PACKETS", FIELD(pinned_packets), off_on},
    {"profile", "SEQFLOW_CUDA_PROFILE", FIELD(profile), off_on},
    {"device_rows", "SEQFLOW_DEVICE_ROWS", FIELD(device_rows), off_on},
    {"warmup", "SEQFLOW_CUDA_WARMUP", FIELD(warmup), off_on},
    {"fp8_scale", "SEQFLOW_CUDA_FP8_SCALE", FIELD(fp8_scale), fp8_scale_values},
    {"fp8_accum", "SEQFLOW_CUDA_FP8_ACCUM", FIELD(fp8_accum), fp8_accum_values},
    {"fp8_blocks", "SEQFLOW_CUDA_FP8_BLOCKS", FIELD(fp8_blocks), off_on},
    {"nccl_ctas", "SEQFLOW_NCCL_CTAS", FIELD(nccl_ctas), nccl_ctas_values},
    {"plan_cache", "SEQFLOW_CUDA_PLAN_CACHE", FIELD(plan_cache), off_on},
};
#define N_SETTINGS (int)(sizeof settings / sizeof settings[0])

void sf_cuda_settings_defaults(sf_cuda_settings *out)
{
    memset(out, 0, sizeof *out);
    out->qkv_bf16 = 1;
    out->gemm = SF_CUDA_GEMM_FASTEST;
    out->memory = SF_CUDA_MEMORY_AUTO;
    out->memory_bf16 = 1;
    out->attention_mix = 1;
    out->gate_up = 1;
    out->normed_sums = 1;
    out->side_queue = 1;
    out->early_launch = 1;
    out->upload_unordered = 1;
    out->pinned_packets = 1;
    out->profile = 0;
    out->device_rows = 1;
    /* first-use costs at start-up (sf_graph_prepare, or the graph's start): the first segment
     * then takes its steady time (bench/RESULTS.md, cold start) */
    out->warmup = 1;
    out->fp8_scale = SF_CUDA_FP8_SCALE_AUTO;
    out->fp8_accum = 0;
    out->fp8_blocks = 1;
    out->nccl_ctas = 0;
    /* timing a shape's candidates took about 100 ms of the reference model's start-up */
    out->plan_cache = 1;
}

/* The plan cache's folder (cuda_settings.h, cache_dir) into out; "" when no variable names one. */
static void cache_dir(char *out, size_t size)
{
    const char *own = getenv("SEQFLOW_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = 0;
    if (own && *own) n = snprintf(out, size, "%s", own);
    else if (xdg && *xdg) n = snprintf(out, size, "%s/seqflow", xdg);
    else if (home && *home) n = snprintf(out, size, "%s/.cache/seqflow", home);
    else *out = 0;
    if (n < 0 || (size_t)n >= size) *out = 0; /* too long to be a folder we would write into */
}

int sf_cuda_settings_nccl_ctas(const sf_cuda_settings *s)
{
    return s->nccl_ctas > 0 ? atoi(nccl_ctas_values[s->nccl_ctas]) : 0;
}

/* Sets s's field (an int: a flag or an enum's value) from value (len bytes); `from` names the
 * source in the error. */
static int assign(const setting *s, sf_cuda_settings *out, const char *value, size_t len, const char *from)
{
    for (int i = 0; s->values[i]; i++)
        if (strlen(s->values[i]) == len && strncmp(s->values[i], value, len) == 0) {
            *(int *)((char *)out + s->offset) = i;
            return SF_OK;
        }
    char allowed[64] = "";
    for (int i = 0; s->values[i]; i++) {
        if (i) strncat(allowed, "|", sizeof allowed - strlen(allowed) - 1);
        strncat(allowed, s->values[i], sizeof allowed - strlen(allowed) - 1);
    }
    return sf_error(SF_E_OPTION, "cuda setting %s: bad value '%.*s' (%s; takes %s)", s->key, (int)len, value, from,
                    allowed);
}

int sf_cuda_settings_parse(const char *text, sf_cuda_settings *out)
{
    sf_cuda_settings_defaults(out);
    /* the string first, into its own copy, so that a key it gives never reads the environment */
    sf_cuda_settings from_text;
    int given[N_SETTINGS] = {0};
    const char *p = text ? text : "";
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (len == 0) return sf_error(SF_E_OPTION, "cuda settings: empty entry in '%s'", text);
        if (!eq) return sf_error(SF_E_OPTION, "cuda setting '%.*s': expected key=value", (int)len, p);
        const size_t key_len = (size_t)(eq - p);
        int found = -1;
        for (int i = 0; i < N_SETTINGS && found < 0; i++)
            if (strlen(settings[i].key) == key_len && strncmp(settings[i].key, p, key_len) == 0) found = i;
        if (found < 0) return sf_error(SF_E_OPTION, "cuda settings: unknown key '%.*s'", (int)key_len, p);
        if (given[found]) return sf_error(SF_E_OPTION, "cuda setting %s: given twice", settings[found].key);
        given[found] = 1;
        int rc = assign(&settings[found], &from_text, eq + 1, len - key_len - 1, "settings");
        if (rc != SF_OK) return rc;
        p += len;
        if (*p == ',') p++;
        if (end && !*p) return sf_error(SF_E_OPTION, "cuda settings: empty entry in '%s'", text);
    }
    for (int i = 0; i < N_SETTINGS; i++) {
        const size_t at = settings[i].offset;
        if (given[i]) {
            memcpy((char *)out + at, (const char *)&from_text + at, sizeof(int));
            continue;
        }
        const char *env = getenv(settings[i].env);
        if (!env || !*env) continue;
        int rc = assign(&settings[i], out, env, strlen(env), settings[i].env);
        if (rc != SF_OK) return rc;
    }
    cache_dir(out->cache_dir, sizeof out->cache_dir);
    return SF_OK;
}
