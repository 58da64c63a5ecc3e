/* Model files (SPEC section 6): loading and saving safetensors. The loader trusts nothing in
 * the file: every number is range-checked against the file's real size before it is used, and
 * every refusal names the tensor or metadata key at fault. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "model/model_internal.h"
#include "seqflow/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_HEADER_BYTES (100u * 1000u * 1000u)
#define MAX_RANK 8
/* JSON numbers are doubles; above 2^53 they no longer name one integer. */
#define MAX_JSON_INTEGER 9007199254740992.0
#define IO_CHUNK_BYTES (1u << 16)

typedef enum dtype { DT_F32, DT_F16, DT_BF16 } dtype;
static const char *const dtype_names[] = {"F32", "F16", "BF16"};
static const size_t dtype_sizes[] = {4, 2, 2};

typedef struct tensor_entry {
    const char *name; /* owned by the parsed JSON */
    dtype type;
    int rank;
    int64_t shape[MAX_RANK];
    uint64_t begin, end; /* relative to the data buffer */
    const sf_tensor_slot *slot; /* the model tensor it fills, once matched */
} tensor_entry;

typedef struct loader {
    const char *path;
    FILE *file;
    uint64_t file_size;
    uint64_t header_len;
    uint64_t data_len;
    char *header_text;
    cJSON *json;
    const cJSON *metadata; /* NULL when the file has none */
    tensor_entry *entries; /* sorted by name once parsed */
    size_t n_entries;
} loader;

/* Every refusal carries the file name, so that a pipeline of several models says which. */
static int fail(const loader *ld, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int fail(const loader *ld, int code, const char *fmt, ...)
{
    char message[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    /* Names come from the file; a newline in one must not break the one-line message. */
    for (char *c = message; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return sf_error(code, "%s: %s", ld->path, message);
}

static int compare_entry_names(const void *a, const void *b)
{
    return strcmp(((const tensor_entry *)a)->name, ((const tensor_entry *)b)->name);
}

static tensor_entry *find_entry(const loader *ld, const char *name)
{
    tensor_entry key = {0};
    key.name = name;
    return bsearch(&key, ld->entries, ld->n_entries, sizeof key, compare_entry_names);
}

static void format_shape(char *buf, size_t size, int rank, const int64_t *shape)
{
    size_t used = 0;
    int k = snprintf(buf, size, "[");
    if (k > 0) used = (size_t)k;
    for (int i = 0; i < rank && used < size; i++) {
        k = snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (k < 0) return;
        used += (size_t)k;
    }
    if (used < size) snprintf(buf + used, size - used, "]");
}

static int read_exact(FILE *f, void *buf, size_t n)
{
    return fread(buf, 1, n, f) == n;
}

static int open_and_read_header(loader *ld)
{
    ld->file = fopen(ld->path, "rb");
    if (!ld->file) return fail(ld, SF_E_IO, "cannot open model file: %s", strerror(errno));
    struct stat st;
    if (fstat(fileno(ld->file), &st) != 0)
        return fail(ld, SF_E_IO, "cannot stat model file: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail(ld, SF_E_IO, "model file is not a regular file");
    ld->file_size = (uint64_t)st.st_size;
    if (ld->file_size < 8)
        return fail(ld, SF_E_MODEL,
                    "file is %llu bytes, shorter than the 8-byte safetensors header length",
                    (unsigned long long)ld->file_size);
    unsigned char len_bytes[8];
    if (!read_exact(ld->file, len_bytes, 8))
        return fail(ld, SF_E_IO, "cannot read the header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len_bytes[i];
    if (n == 0) return fail(ld, SF_E_MODEL, "header length is 0; a safetensors header is JSON");
    if (n > MAX_HEADER_BYTES)
        return fail(ld, SF_E_MODEL, "header length %llu is over the %u-byte limit",
                    (unsigned long long)n, MAX_HEADER_BYTES);
    if (n > ld->file_size - 8)
        return fail(ld, SF_E_MODEL, "header length %llu runs past the end of the %llu-byte file",
                    (unsigned long long)n, (unsigned long long)ld->file_size);
    ld->header_len = n;
    ld->data_len = ld->file_size - 8 - n;
    ld->header_text = malloc((size_t)n + 1);
    if (!ld->header_text) return fail(ld, SF_E_NOMEM, "out of memory reading the header");
    if (!read_exact(ld->file, ld->header_text, (size_t)n))
        return fail(ld, SF_E_IO, "cannot read the %llu-byte header", (unsigned long long)n);
    ld->header_text[n] = '\0';
    /* The length includes our terminating NUL so that cJSON can insist the JSON ends there
     * (after the padding spaces): trailing bytes mean a corrupt or foreign header. */
    const char *parse_end = NULL;
    ld->json = cJSON_ParseWithLengthOpts(ld->header_text, (size_t)n + 1, &parse_end, 1);
    if (!ld->json) {
        long offset = parse_end && parse_end >= ld->header_text && parse_end <= ld->header_text + n
                          ? (long)(parse_end - ld->header_text)
                          : -1;
        return fail(ld, SF_E_MODEL, "header is not valid JSON (near byte %ld)", offset);
    }
    if (!cJSON_IsObject(ld->json)) return fail(ld, SF_E_MODEL, "header JSON is not an object");
    return SF_OK;
}

/* A non-negative integer that a JSON double represents exactly. */
static int json_to_u64(const cJSON *item, uint64_t *value)
{
    if (!cJSON_IsNumber(item)) return 0;
    double v = item->valuedouble;
    if (!(v >= 0.0) || v > MAX_JSON_INTEGER || v != floor(v)) return 0;
    *value = (uint64_t)v;
    return 1;
}

static int parse_dtype(const loader *ld, const char *name, const cJSON *item, dtype *out)
{
    if (!cJSON_IsString(item))
        return fail(ld, SF_E_MODEL, "tensor %s: dtype is not a string", name);
    for (int t = 0; t < 3; t++)
        if (strcmp(item->valuestring, dtype_names[t]) == 0) {
            *out = (dtype)t;
            return SF_OK;
        }
    return fail(ld, SF_E_MODEL, "tensor %s: unknown dtype \"%.32s\" (F32, F16 or BF16 expected)",
                name, item->valuestring);
}

static int parse_entry(const loader *ld, const cJSON *item, tensor_entry *e)
{
    const char *name = item->string;
    e->name = name;
    if (!cJSON_IsObject(item)) return fail(ld, SF_E_MODEL, "tensor %s: entry is not an object", name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!dt) return fail(ld, SF_E_MODEL, "tensor %s: no dtype", name);
    if (!shape) return fail(ld, SF_E_MODEL, "tensor %s: no shape", name);
    if (!offsets) return fail(ld, SF_E_MODEL, "tensor %s: no data_offsets", name);
    int rc = parse_dtype(ld, name, dt, &e->type);
    if (rc != SF_OK) return rc;

    if (!cJSON_IsArray(shape)) return fail(ld, SF_E_MODEL, "tensor %s: shape is not an array", name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > MAX_RANK)
        return fail(ld, SF_E_MODEL, "tensor %s: shape has %d dimensions, more than %d", name,
                    rank, MAX_RANK);
    e->rank = rank;
    uint64_t elements = 1;
    int i = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next, i++) {
        uint64_t v;
        if (!json_to_u64(dim, &v) || v > INT64_MAX)
            return fail(ld, SF_E_MODEL,
                        "tensor %s: shape dimension %d is not a non-negative integer", name, i);
        e->shape[i] = (int64_t)v;
        if (v != 0 && elements > UINT64_MAX / v)
            return fail(ld, SF_E_MODEL, "tensor %s: shape overflows a 64-bit element count", name);
        elements *= v;
    }

    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
        return fail(ld, SF_E_MODEL, "tensor %s: data_offsets is not an array of two integers",
                    name);
    if (!json_to_u64(offsets->child, &e->begin) || !json_to_u64(offsets->child->next, &e->end))
        return fail(ld, SF_E_MODEL, "tensor %s: data_offsets are not non-negative integers", name);
    if (e->end < e->begin)
        return fail(ld, SF_E_MODEL, "tensor %s: data_offsets [%llu, %llu] end before they begin",
                    name, (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > ld->data_len)
        return fail(ld, SF_E_MODEL,
                    "tensor %s: data_offsets [%llu, %llu] run past the %llu-byte data buffer", name,
                    (unsigned long long)e->begin, (unsigned long long)e->end,
                    (unsigned long long)ld->data_len);
    size_t elem_size = dtype_sizes[e->type];
    if (elements > UINT64_MAX / elem_size || elements * elem_size != e->end - e->begin)
        return fail(ld, SF_E_MODEL,
                    "tensor %s: %llu bytes in data_offsets but shape and dtype %s need %llu%s",
                    name, (unsigned long long)(e->end - e->begin), dtype_names[e->type],
                    (unsigned long long)(elements * elem_size),
                    elements > UINT64_MAX / elem_size ? " (overflow)" : "");
    return SF_OK;
}

static int compare_entry_begin(const void *a, const void *b)
{
    const tensor_entry *x = *(tensor_entry *const *)a, *y = *(tensor_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int check_no_overlap(const loader *ld)
{
    tensor_entry **by_begin = malloc((ld->n_entries ? ld->n_entries : 1) * sizeof *by_begin);
    if (!by_begin) return fail(ld, SF_E_NOMEM, "out of memory checking tensor offsets");
    size_t n = 0;
    for (size_t i = 0; i < ld->n_entries; i++)
        if (ld->entries[i].end > ld->entries[i].begin) by_begin[n++] = &ld->entries[i];
    qsort(by_begin, n, sizeof *by_begin, compare_entry_begin);
    const tensor_entry *furthest = NULL;
    int rc = SF_OK;
    for (size_t i = 0; i < n && rc == SF_OK; i++) {
        if (furthest && by_begin[i]->begin < furthest->end)
            rc = fail(ld, SF_E_MODEL, "tensors %s and %s overlap in the data buffer",
                      furthest->name, by_begin[i]->name);
        if (!furthest || by_begin[i]->end > furthest->end) furthest = by_begin[i];
    }
    free(by_begin);
    return rc;
}

static int parse_entries(loader *ld)
{
    size_t count = 0;
    for (const cJSON *item = ld->json->child; item; item = item->next) {
        if (!item->string) return fail(ld, SF_E_MODEL, "header has a nameless entry");
        if (strcmp(item->string, "__metadata__") == 0) {
            if (ld->metadata) return fail(ld, SF_E_MODEL, "__metadata__ appears twice");
            if (!cJSON_IsObject(item))
                return fail(ld, SF_E_MODEL, "__metadata__ is not an object");
            for (const cJSON *kv = item->child; kv; kv = kv->next)
                if (!cJSON_IsString(kv))
                    return fail(ld, SF_E_MODEL, "metadata key %s: value is not a string",
                                kv->string ? kv->string : "(nameless)");
            ld->metadata = item;
        } else {
            count++;
        }
    }
    ld->entries = calloc(count ? count : 1, sizeof *ld->entries);
    if (!ld->entries) return fail(ld, SF_E_NOMEM, "out of memory for %zu tensor entries", count);
    for (const cJSON *item = ld->json->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) continue;
        int rc = parse_entry(ld, item, &ld->entries[ld->n_entries]);
        if (rc != SF_OK) return rc;
        ld->n_entries++;
    }
    qsort(ld->entries, ld->n_entries, sizeof *ld->entries, compare_entry_names);
    for (size_t i = 1; i < ld->n_entries; i++)
        if (strcmp(ld->entries[i - 1].name, ld->entries[i].name) == 0)
            return fail(ld, SF_E_MODEL, "tensor %s appears twice in the header", ld->entries[i].name);
    return check_no_overlap(ld);
}

/* ---- metadata -> config ------------------------------------------------------------------ */

static const char *const known_keys[] = {
    "seqflow.dim",    "seqflow.heads",  "seqflow.head_dim",      "seqflow.vocab",
    "seqflow.layers", "seqflow.segment", "seqflow.branches",     "seqflow.causal",
    "seqflow.memory", "seqflow.global_tokens", "seqflow.summary_tokens", "seqflow.norm_eps",
};

static const char *metadata_value(const loader *ld, const char *key)
{
    const cJSON *item =
        ld->metadata ? cJSON_GetObjectItemCaseSensitive(ld->metadata, key) : NULL;
    return item ? item->valuestring : NULL;
}

/* Decimal digits with an optional '-', nothing else: "12 " or "0x10" are refused. */
static int parse_int_text(const char *text, int *value)
{
    const char *p = text;
    int negative = (*p == '-');
    if (negative) p++;
    if (*p < '0' || *p > '9') return 0;
    long long v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > INT_MAX) return 0;
    }
    if (*p != '\0') return 0;
    *value = (int)(negative ? -v : v);
    return 1;
}

static int metadata_int(const loader *ld, const char *key, int required, int fallback, int *out)
{
    const char *text = metadata_value(ld, key);
    if (!text) {
        if (required) return fail(ld, SF_E_MODEL, "metadata key %s is missing", key);
        *out = fallback;
        return SF_OK;
    }
    if (!parse_int_text(text, out))
        return fail(ld, SF_E_MODEL, "metadata key %s: \"%.40s\" is not an integer", key, text);
    return SF_OK;
}

static int config_from_metadata(const loader *ld, sf_model_config *cfg)
{
    if (ld->metadata)
        for (const cJSON *kv = ld->metadata->child; kv; kv = kv->next) {
            if (strncmp(kv->string, "seqflow.", 8) != 0) continue; /* other tools' keys */
            size_t k = 0;
            while (k < sizeof known_keys / sizeof known_keys[0] && strcmp(kv->string, known_keys[k]))
                k++;
            /* A misspelt key would otherwise fall back to a default without a word. */
            if (k == sizeof known_keys / sizeof known_keys[0])
                return fail(ld, SF_E_MODEL, "metadata key %s is not a seqflow setting", kv->string);
        }
    memset(cfg, 0, sizeof *cfg);
    int rc;
    if ((rc = metadata_int(ld, "seqflow.dim", 1, 0, &cfg->dim)) ||
        (rc = metadata_int(ld, "seqflow.heads", 1, 0, &cfg->heads)) ||
        (rc = metadata_int(ld, "seqflow.head_dim", 1, 0, &cfg->head_dim)) ||
        (rc = metadata_int(ld, "seqflow.vocab", 1, 0, &cfg->vocab)) ||
        (rc = metadata_int(ld, "seqflow.layers", 1, 0, &cfg->layers)) ||
        (rc = metadata_int(ld, "seqflow.segment", 1, 0, &cfg->segment)))
        return rc;
    const char *branches = metadata_value(ld, "seqflow.branches");
    if (!branches) return fail(ld, SF_E_MODEL, "metadata key seqflow.branches is missing");
    if (sf_branches_parse(branches, cfg) != SF_OK)
        return fail(ld, SF_E_MODEL, "metadata key seqflow.branches: \"%.60s\" is not w:r,w:r,...",
                    branches);
    if ((rc = metadata_int(ld, "seqflow.causal", 0, 1, &cfg->causal)) ||
        (rc = metadata_int(ld, "seqflow.global_tokens", 0, 0, &cfg->global_tokens)) ||
        (rc = metadata_int(ld, "seqflow.summary_tokens", 0, 0, &cfg->summary_tokens)))
        return rc;
    if (cfg->causal != 0 && cfg->causal != 1)
        return fail(ld, SF_E_MODEL, "metadata key seqflow.causal: \"%d\" is not 0 or 1", cfg->causal);
    const char *memory = metadata_value(ld, "seqflow.memory");
    if (!memory || strcmp(memory, "delta") == 0) cfg->memory = SF_MEMORY_DELTA;
    else if (strcmp(memory, "linear") == 0) cfg->memory = SF_MEMORY_LINEAR;
    else if (strcmp(memory, "none") == 0) cfg->memory = SF_MEMORY_NONE;
    else
        return fail(ld, SF_E_MODEL,
                    "metadata key seqflow.memory: \"%.40s\" is not delta, linear or none", memory);
    const char *eps = metadata_value(ld, "seqflow.norm_eps");
    cfg->norm_eps = 1e-6f;
    if (eps) {
        char *end;
        errno = 0;
        double v = strtod(eps, &end);
        /* underflow (ERANGE with a tiny result) is a valid number: it counts as the smallest
         * positive float, the nearest epsilon a float can hold */
        if (eps[0] == '\0' || (eps[0] != '-' && eps[0] != '.' && (eps[0] < '0' || eps[0] > '9')) ||
            *end != '\0' || !isfinite(v) || (errno == ERANGE && fabs(v) > DBL_MIN))
            return fail(ld, SF_E_MODEL, "metadata key seqflow.norm_eps: \"%.40s\" is not a number",
                        eps);
        cfg->norm_eps = (float)v;
        if (eps[0] != '-' && cfg->norm_eps == 0.0f && (v > 0 || errno == ERANGE)) cfg->norm_eps = FLT_TRUE_MIN;
    }
    return SF_OK;
}

/* Sizes that only the tensors carry (F, final norm), then the metadata's sizes against the
 * tensors' shapes: a disagreement there is a config error, reported by key, not a shape error. */
static int derive_and_cross_check(const loader *ld, sf_model_config *cfg)
{
    const tensor_entry *w1 = find_entry(ld, "blocks.0.mlp.w1.weight");
    cfg->mlp_hidden = 0;
    if (w1) {
        if (w1->rank != 2 || w1->shape[0] < 1 || w1->shape[0] > INT_MAX) {
            char got[96];
            format_shape(got, sizeof got, w1->rank, w1->shape);
            return fail(ld, SF_E_MODEL, "tensor blocks.0.mlp.w1.weight: expected shape [F, %d] "
                        "with F > 0, got %s", cfg->dim, got);
        }
        cfg->mlp_hidden = (int)w1->shape[0];
    }
    cfg->final_norm = find_entry(ld, "final_norm.weight") != NULL;

    const tensor_entry *e = find_entry(ld, "embed.weight");
    if (e && e->rank == 2 && e->shape[0] != cfg->vocab)
        return fail(ld, SF_E_CONFIG, "metadata seqflow.vocab is %d but embed.weight has %lld rows",
                    cfg->vocab, (long long)e->shape[0]);
    if (e && e->rank == 2 && e->shape[1] != cfg->dim)
        return fail(ld, SF_E_CONFIG,
                    "metadata seqflow.dim is %d but embed.weight has %lld columns", cfg->dim,
                    (long long)e->shape[1]);
    e = find_entry(ld, "blocks.0.attn.gate");
    if (e && e->rank == 1 && e->shape[0] != cfg->heads)
        return fail(ld, SF_E_CONFIG,
                    "metadata seqflow.heads is %d but blocks.0.attn.gate has %lld entries",
                    cfg->heads, (long long)e->shape[0]);
    e = find_entry(ld, "blocks.0.attn.q.weight");
    if (e && e->rank == 2 && e->shape[0] != (int64_t)cfg->heads * cfg->head_dim)
        return fail(ld, SF_E_CONFIG,
                    "metadata seqflow.heads*seqflow.head_dim is %lld but blocks.0.attn.q.weight "
                    "has %lld rows",
                    (long long)cfg->heads * cfg->head_dim, (long long)e->shape[0]);

    long last_block = -1;
    const char *last_name = NULL;
    for (size_t i = 0; i < ld->n_entries; i++) {
        const char *name = ld->entries[i].name;
        if (strncmp(name, "blocks.", 7) != 0 || name[7] < '0' || name[7] > '9') continue;
        char *end;
        long index = strtol(name + 7, &end, 10);
        if (*end == '.' && index > last_block) {
            last_block = index;
            last_name = name;
        }
    }
    if (last_block >= cfg->layers)
        return fail(ld, SF_E_CONFIG, "metadata seqflow.layers is %d but the file has tensor %s",
                    cfg->layers, last_name);
    if (last_block + 1 < cfg->layers && cfg->layers > 0)
        return fail(ld, SF_E_CONFIG,
                    "metadata seqflow.layers is %d but the file has no tensors of block %ld",
                    cfg->layers, last_block + 1);

    int rc = sf_model_config_validate(cfg);
    if (rc != SF_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", sf_last_error());
        return fail(ld, rc, "seqflow metadata: %s", why);
    }
    return SF_OK;
}

/* The MLP is optional as a whole; a file with part of it is broken, not MLP-free. */
static int check_mlp_all_or_none(const loader *ld, const sf_model_config *cfg)
{
    static const char *const parts[] = {"mlp_norm.weight", "mlp.w1.weight", "mlp.w3.weight",
                                        "mlp.w2.weight"};
    char name[64], missing[64] = "", present[64] = "";
    for (int l = 0; l < cfg->layers; l++)
        for (int k = 0; k < 4; k++) {
            snprintf(name, sizeof name, "blocks.%d.%s", l, parts[k]);
            char *slot = find_entry(ld, name) ? present : missing;
            if (!slot[0]) snprintf(slot, 64, "%s", name);
        }
    if (missing[0] && present[0])
        return fail(ld, SF_E_MODEL, "MLP tensors must be all or none: %s is missing but %s is present",
                    missing, present);
    return SF_OK;
}

static int match_slots(loader *ld, sf_model *m)
{
    for (size_t s = 0; s < m->n_slots; s++) {
        const sf_tensor_slot *slot = &m->slots[s];
        tensor_entry *e = find_entry(ld, slot->name);
        if (!e) return fail(ld, SF_E_MODEL, "tensor %s is missing", slot->name);
        int same = e->rank == slot->rank;
        for (int i = 0; same && i < slot->rank; i++) same = e->shape[i] == slot->shape[i];
        if (!same) {
            char want[96], got[96];
            format_shape(want, sizeof want, slot->rank, slot->shape);
            format_shape(got, sizeof got, e->rank, e->shape);
            return fail(ld, SF_E_MODEL, "tensor %s: expected shape %s, got %s", slot->name, want, got);
        }
        e->slot = slot;
    }
    for (size_t i = 0; i < ld->n_entries; i++)
        if (!ld->entries[i].slot)
            return fail(ld, SF_E_MODEL, "unexpected tensor %s (not a seqflow model tensor)",
                        ld->entries[i].name);
    return SF_OK;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13); /* inf, or NaN keeping its payload */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {
        /* Subnormal half: every one is a normal float once the leading 1 is shifted up. */
        uint32_t e = 113;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float bfloat_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Index of the first NaN or infinity in x[0..n), or n when there is none. The loop reads the
 * exponent bits without branching so that it vectorizes: the scan costs about what reading
 * the weights from memory costs, small next to reading them from the file. */
static size_t first_non_finite(const float *x, size_t n)
{
    const size_t block = 4096;
    for (size_t at = 0; at < n; at += block) {
        size_t end = n - at < block ? n : at + block;
        uint32_t bad = 0;
        for (size_t i = at; i < end; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], sizeof bits);
            bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
        }
        if (!bad) continue;
        for (size_t i = at; i < end; i++)
            if (!isfinite(x[i])) return i;
    }
    return n;
}

static int read_tensor(const loader *ld, const tensor_entry *e, unsigned char *buf)
{
    if (fseeko(ld->file, (off_t)(8 + ld->header_len + e->begin), SEEK_SET) != 0)
        return fail(ld, SF_E_IO, "tensor %s: cannot seek to its data", e->name);
    size_t elem_size = dtype_sizes[e->type];
    size_t per_chunk = IO_CHUNK_BYTES / elem_size;
    float *dst = e->slot->data;
    for (size_t done = 0; done < e->slot->count;) {
        size_t n = e->slot->count - done < per_chunk ? e->slot->count - done : per_chunk;
        /* The file may have shrunk since fstat; a short read is an error, not zeros. */
        if (!read_exact(ld->file, buf, n * elem_size))
            return fail(ld, SF_E_IO, "tensor %s: file ended while reading its data", e->name);
        for (size_t i = 0; i < n; i++) {
            const unsigned char *p = buf + i * elem_size;
            if (e->type == DT_F32) {
                uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                (uint32_t)p[3] << 24;
                memcpy(&dst[done + i], &bits, sizeof bits);
            } else {
                uint16_t bits = (uint16_t)(p[0] | p[1] << 8);
                dst[done + i] = e->type == DT_F16 ? half_to_float(bits) : bfloat_to_float(bits);
            }
        }
        /* A NaN or infinity in a weight turns every row it touches non-finite; refusing the
         * file here names the tensor, which no later symptom could. */
        size_t bad = first_non_finite(dst + done, n);
        if (bad < n)
            return fail(ld, SF_E_MODEL, "tensor %s: element %zu is %s; weights must be finite numbers", e->name,
                        done + bad, isnan(dst[done + bad]) ? "NaN" : "infinite");
        done += n;
    }
    return SF_OK;
}

int sf_model_load(const char *path, sf_model **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_model_load: out is NULL");
    *out = NULL;
    if (!path) return sf_error(SF_E_INVAL, "sf_model_load: path is NULL");
    loader ld = {0};
    ld.path = path;
    sf_model *m = NULL;
    sf_model_config cfg;
    unsigned char *buf = NULL;
    int rc = open_and_read_header(&ld);
    if (rc == SF_OK) rc = parse_entries(&ld);
    if (rc == SF_OK) rc = config_from_metadata(&ld, &cfg);
    if (rc == SF_OK) rc = derive_and_cross_check(&ld, &cfg);
    if (rc == SF_OK) rc = check_mlp_all_or_none(&ld, &cfg);
    if (rc == SF_OK) rc = sf_model_internal_layout(&cfg, &m);
    /* Weights are allocated only once every tensor has been found in the file, so the
     * allocation is bounded by the file's real size, not by what its metadata claims. */
    if (rc == SF_OK) rc = match_slots(&ld, m);
    if (rc == SF_OK) rc = sf_model_internal_allocate_weights(m);
    if (rc == SF_OK && !(buf = malloc(IO_CHUNK_BYTES)))
        rc = fail(&ld, SF_E_NOMEM, "out of memory reading tensors");
    for (size_t i = 0; rc == SF_OK && i < ld.n_entries; i++) rc = read_tensor(&ld, &ld.entries[i], buf);
    free(buf);
    free(ld.entries);
    cJSON_Delete(ld.json);
    free(ld.header_text);
    if (ld.file) fclose(ld.file);
    if (rc != SF_OK) {
        sf_model_free(m);
        return rc;
    }
    *out = m;
    return SF_OK;
}
