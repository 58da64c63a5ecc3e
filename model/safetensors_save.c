/* Writing a model as a float32 safetensors file that sf_model_load reads back bit for bit. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "model/model_internal.h"
#include "seqflow/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct text_buffer {
    char *data;
    size_t len, cap;
    int failed;
} text_buffer;

static void append(text_buffer *tb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void append(text_buffer *tb, const char *fmt, ...)
{
    if (tb->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(tb->data ? tb->data + tb->len : NULL, tb->data ? tb->cap - tb->len : 0,
                          fmt, ap);
        va_end(ap);
        if (k < 0) {
            tb->failed = 1;
            return;
        }
        if (tb->data && (size_t)k < tb->cap - tb->len) {
            tb->len += (size_t)k;
            return;
        }
        size_t cap = tb->cap ? tb->cap : 4096;
        while (cap - tb->len <= (size_t)k) cap *= 2;
        char *grown = realloc(tb->data, cap);
        if (!grown) {
            tb->failed = 1;
            return;
        }
        tb->data = grown;
        tb->cap = cap;
    }
}


static int compare_slot_names(const void *a, const void *b)
{
    return strcmp((*(const sf_tensor_slot *const *)a)->name,
                  (*(const sf_tensor_slot *const *)b)->name);
}

/* safetensors writers emit tensors sorted by name; doing the same makes files reproducible. */
static const sf_tensor_slot *const *sort_slots_by_name(const sf_model *m)
{
    const sf_tensor_slot **order = malloc(m->n_slots * sizeof *order);
    if (!order) return NULL;
    for (size_t i = 0; i < m->n_slots; i++) order[i] = &m->slots[i];
    qsort(order, m->n_slots, sizeof *order, compare_slot_names);
    return order;
}

static const char *memory_word(sf_memory_kind kind)
{
    return kind == SF_MEMORY_NONE ? "none" : kind == SF_MEMORY_LINEAR ? "linear" : "delta";
}

static void build_header(const sf_model *m, const sf_tensor_slot *const *order, text_buffer *tb)
{
    const sf_model_config *c = &m->cfg;
    char branches[SF_MAX_BRANCHES * 24];
    sf_branches_format(c, branches, sizeof branches);
    /* %.9g gives back the same float after strtod, so norm_eps survives the round trip. */
    append(tb,
           "{\"__metadata__\":{\"seqflow.branches\":\"%s\",\"seqflow.causal\":\"%d\","
           "\"seqflow.dim\":\"%d\",\"seqflow.global_tokens\":\"%d\",\"seqflow.head_dim\":\"%d\","
           "\"seqflow.heads\":\"%d\",\"seqflow.layers\":\"%d\",\"seqflow.memory\":\"%s\","
           "\"seqflow.norm_eps\":\"%.9g\",\"seqflow.segment\":\"%d\","
           "\"seqflow.summary_tokens\":\"%d\",\"seqflow.vocab\":\"%d\"}",
           branches, c->causal, c->dim, c->global_tokens, c->head_dim, c->heads, c->layers,
           memory_word(c->memory), (double)c->norm_eps, c->segment, c->summary_tokens, c->vocab);
    unsigned long long offset = 0;
    for (size_t i = 0; i < m->n_slots; i++) {
        const sf_tensor_slot *s = order[i];
        unsigned long long bytes = (unsigned long long)s->count * 4u;
        if (s->rank == 2)
            append(tb, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                   s->name, (long long)s->shape[0], (long long)s->shape[1], offset, offset + bytes);
        else
            append(tb, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                   s->name, (long long)s->shape[0], offset, offset + bytes);
        offset += bytes;
    }
    append(tb, "}");
    /* The data buffer then starts 8-byte aligned, as the safetensors format recommends. */
    while (!tb->failed && (tb->len % 8) != 0) append(tb, " ");
}

static int write_all(FILE *f, const sf_model *m, const sf_tensor_slot *const *order,
                     const text_buffer *header)
{
    unsigned char len_bytes[8];
    unsigned long long n = header->len;
    for (int i = 0; i < 8; i++) len_bytes[i] = (unsigned char)(n >> (8 * i));
    if (fwrite(len_bytes, 1, 8, f) != 8 || fwrite(header->data, 1, header->len, f) != header->len)
        return 0;
    enum { CHUNK = 4096 };
    unsigned char buf[CHUNK * 4];
    for (size_t t = 0; t < m->n_slots; t++) {
        const sf_tensor_slot *s = order[t];
        for (size_t done = 0; done < s->count;) {
            size_t k = s->count - done < CHUNK ? s->count - done : CHUNK;
            for (size_t i = 0; i < k; i++) {
                uint32_t bits;
                memcpy(&bits, &s->data[done + i], sizeof bits);
                for (int b = 0; b < 4; b++) buf[4 * i + (size_t)b] = (unsigned char)(bits >> (8 * b));
            }
            if (fwrite(buf, 4, k, f) != k) return 0;
            done += k;
        }
    }
    return 1;
}

int sf_model_save(const sf_model *model, const char *path)
{
    if (!model || !path) return sf_error(SF_E_INVAL, "sf_model_save: NULL argument");
    const sf_tensor_slot *const *order = sort_slots_by_name(model);
    text_buffer header = {0};
    if (order) build_header(model, order, &header);
    if (!order || header.failed) {
        free((void *)order);
        free(header.data);
        return sf_error(SF_E_NOMEM, "%s: out of memory building the safetensors header", path);
    }

    /* A temporary file renamed into place: a failed save never leaves a half-written model
     * where a later load would find it. */
    size_t path_len = strlen(path);
    char *tmp = malloc(path_len + 16);
    int rc = SF_OK;
    if (!tmp) {
        rc = sf_error(SF_E_NOMEM, "%s: out of memory", path);
        goto done;
    }
    snprintf(tmp, path_len + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = sf_error(SF_E_IO, "%s: cannot create a temporary file: %s", path, strerror(errno));
        goto done;
    }
    (void)fchmod(fd, 0644); /* mkstemp's 0600 would make saved models private by accident */
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        rc = sf_error(SF_E_IO, "%s: cannot open the temporary file: %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        goto done;
    }
    int ok = write_all(f, model, order, &header);
    int saved_errno = errno;
    if (ok && fflush(f) != 0) ok = 0, saved_errno = errno;
    if (ok && fsync(fileno(f)) != 0) ok = 0, saved_errno = errno;
    if (fclose(f) != 0 && ok) ok = 0, saved_errno = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, saved_errno = errno;
    if (!ok) {
        unlink(tmp);
        rc = sf_error(SF_E_IO, "%s: cannot write the model: %s", path, strerror(saved_errno));
    }
done:
    free(tmp);
    free((void *)order);
    free(header.data);
    return rc;
}
