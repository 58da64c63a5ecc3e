/* The opt-in per-op profile of the CUDA backend (setting profile=1, see profile.h).
 * Every op of the table runs between two events on the compute stream and is waited for, so
 * the device time of each op is its own (no overlap with the next); the host time is the wall
 * time of the call, waits included. Both are summed per op kind and printed at destroy.
 * This serializes host and device: profile to see where time goes, not to time the whole. */
#include "kernels/backend_ext.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    OP_UPLOAD, OP_DOWNLOAD, OP_COPY, OP_ZERO, OP_SYNC, OP_MATMUL, OP_RMSNORM, OP_EMBED, OP_SWIGLU,
    OP_ATTENTION, OP_MEMORY_MIX, OP_MEMORY_UPDATE, OP_SUMMARY, OP_QKV, OP_FFN, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {"upload", "download", "copy", "zero", "sync", "matmul",
                                               "rmsnorm", "embed", "swiglu", "attention", "memory_mix",
                                               "memory_update", "summary", "qkv", "ffn"};

struct sf_cuda_profile {
    pthread_mutex_t lock; /* one op at a time between the events */
    cudaEvent_t start, end;
    long calls[OP_COUNT];
    double device_ms[OP_COUNT], host_ms[OP_COUNT];
    double max_ms[OP_COUNT]; /* the slowest single call: one-off costs (first-call loading, scratch growth) show here */
    double host_t0;
};

static const sf_backend_ops *inner;     /* the unprofiled table (there is one) */
static const sf_backend_ext *inner_ext; /* and its extensions */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static sf_cuda_profile *begin(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    sf_cuda_profile *p = c->profile;
    pthread_mutex_lock(&p->lock);
    cudaSetDevice(c->device);
    p->host_t0 = now_ms();
    cudaEventRecord(p->start, c->stream);
    return p;
}

static int end(sf_backend *be, sf_cuda_profile *p, int op, int rc)
{
    sf_cuda *c = sf_cuda_of(be);
    float ms = 0;
    if (cudaEventRecord(p->end, c->stream) == cudaSuccess && cudaEventSynchronize(p->end) == cudaSuccess)
        cudaEventElapsedTime(&ms, p->start, p->end);
    p->calls[op]++;
    p->device_ms[op] += ms;
    if (ms > p->max_ms[op]) p->max_ms[op] = ms;
    p->host_ms[op] += now_ms() - p->host_t0;
    pthread_mutex_unlock(&p->lock);
    return rc;
}

#define PROFILED(op, call)                     \
    do {                                       \
        sf_cuda_profile *p_ = begin(be);       \
        return end(be, p_, op, inner->call);   \
    } while (0)
#define PROFILED_EXT(op, call)                   \
    do {                                         \
        sf_cuda_profile *p_ = begin(be);         \
        return end(be, p_, op, inner_ext->call); \
    } while (0)

static int p_upload(sf_backend *be, void *dst, const void *src, size_t bytes) { PROFILED(OP_UPLOAD, upload(be, dst, src, bytes)); }
static int p_download(sf_backend *be, void *dst, const void *src, size_t bytes) { PROFILED(OP_DOWNLOAD, download(be, dst, src, bytes)); }
static int p_upload_unordered(sf_backend *be, void *dst, const void *src, size_t bytes)
{
    PROFILED_EXT(OP_UPLOAD, upload_unordered(be, dst, src, bytes));
}
static int p_copy(sf_backend *be, void *dst, const void *src, size_t bytes) { PROFILED(OP_COPY, copy(be, dst, src, bytes)); }
static int p_zero(sf_backend *be, void *dst, size_t bytes) { PROFILED(OP_ZERO, zero(be, dst, bytes)); }
static int p_sync(sf_backend *be) { PROFILED(OP_SYNC, sync(be)); }
static int p_matmul(sf_backend *be, int n, int in, int out, const float *x, int ldx, const float *w, float *y, int ldy,
                    int acc)
{
    PROFILED(OP_MATMUL, matmul(be, n, in, out, x, ldx, w, y, ldy, acc));
}
static int p_rmsnorm(sf_backend *be, int n, int dim, const float *x, const float *w, float eps, float *y)
{
    PROFILED(OP_RMSNORM, rmsnorm(be, n, dim, x, w, eps, y));
}
static int p_rmsnorm_typed(sf_backend *be, int n, int dim, const float *x, const float *w, float eps, sf_dtype otype,
                           void *y)
{
    PROFILED_EXT(OP_RMSNORM, rmsnorm_typed(be, n, dim, x, w, eps, otype, y));
}
static int p_embed(sf_backend *be, int n, int dim, const uint32_t *tokens, const float *table, float *y)
{
    PROFILED(OP_EMBED, embed(be, n, dim, tokens, table, y));
}
static int p_swiglu(sf_backend *be, int n, int f, float *a, const float *b) { PROFILED(OP_SWIGLU, swiglu(be, n, f, a, b)); }
static int p_attention(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                       float *out)
{
    PROFILED(OP_ATTENTION, attention(be, desc, q, k, v, out));
}
static int p_memory_mix(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q, const float *M,
                        const float *z, const float *gate, float *a)
{
    PROFILED(OP_MEMORY_MIX, memory_mix(be, n, heads, d, ld, qtype, q, M, z, gate, a));
}
static int p_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                           const void *k, const void *v, float *M, float *z)
{
    PROFILED(OP_MEMORY_UPDATE, memory_update(be, kind, n, heads, d, ld, kvtype, k, v, M, z));
}
static int p_summary(sf_backend *be, int n, int segment, int s, int width, int ld, sf_dtype kvtype, const void *k,
                     const void *v, float *sk, float *sv, int *count)
{
    PROFILED(OP_SUMMARY, summary(be, n, segment, s, width, ld, kvtype, k, v, sk, sv, count));
}

static int p_memory_mix_to(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                           const float *M, const float *z, const float *gate, float *a, sf_dtype otype, void *out)
{
    PROFILED_EXT(OP_MEMORY_MIX, memory_mix_to(be, n, heads, d, ld, qtype, q, M, z, gate, a, otype, out));
}
static int p_matmul_typed(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx,
                          const float *w, sf_dtype ytype, void *y, int ldy, int acc)
{
    PROFILED_EXT(OP_MATMUL, matmul_typed(be, n, in, out, xtype, x, ldx, w, ytype, y, ldy, acc));
}

static int p_attention_mix(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                           float *a, const float *M, const float *z, const float *gate, sf_dtype otype, void *out)
{
    PROFILED_EXT(OP_ATTENTION, attention_mix(be, desc, q, k, v, a, M, z, gate, otype, out));
}
static int p_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
                 const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v, float *u)
{
    PROFILED_EXT(OP_QKV, qkv(be, n, dim, width, x, norm, eps, wq, wk, wv, type, q, k, v, u));
}
static int p_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
                 const float *w3, const float *w2, float *u, float *h1, float *h3)
{
    PROFILED_EXT(OP_FFN, ffn(be, n, dim, hidden, x, norm, eps, w1, w3, w2, u, h1, h3));
}

static void p_destroy(sf_backend *be)
{
    sf_cuda *c = be->impl ? sf_cuda_of(be) : NULL;
    sf_cuda_profile *p = c ? c->profile : NULL;
    if (p) {
        double dev = 0, host = 0;
        for (int i = 0; i < OP_COUNT; i++) dev += p->device_ms[i], host += p->host_ms[i];
        fprintf(stderr, "seqflow CUDA profile (each op waited for; device = between events, host = wall):\n"
                        "  %-14s %8s %12s %12s %10s %12s\n", "op", "calls", "device ms", "host ms", "device %",
                "max call ms");
        for (int i = 0; i < OP_COUNT; i++)
            if (p->calls[i])
                fprintf(stderr, "  %-14s %8ld %12.2f %12.2f %9.1f%% %12.3f\n", op_names[i], p->calls[i], p->device_ms[i],
                        p->host_ms[i], dev > 0 ? 100 * p->device_ms[i] / dev : 0, p->max_ms[i]);
        fprintf(stderr, "  %-14s %8s %12.2f %12.2f\n", "total", "", dev, host);
        cudaEventDestroy(p->start);
        cudaEventDestroy(p->end);
        pthread_mutex_destroy(&p->lock);
        free(p);
        c->profile = NULL;
    }
    inner->destroy(be);
}

static sf_backend_ops profiled;
static sf_backend_ext profiled_ext;

int sf_cuda_profile_attach(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    sf_cuda_profile *p = (sf_cuda_profile *)calloc(1, sizeof *p);
    if (!p) return sf_error(SF_E_NOMEM, "out of memory");
    pthread_mutex_init(&p->lock, NULL);
    int rc = sf_cuda_status(cudaEventCreate(&p->start), "profile event");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreate(&p->end), "profile event");
    if (rc != SF_OK) {
        pthread_mutex_destroy(&p->lock);
        free(p);
        return rc;
    }
    if (!inner) {
        inner = be->ops;
        inner_ext = inner->ext;
        profiled = *inner;
        profiled_ext = *inner_ext;
        profiled.ext = &profiled_ext;
        profiled.upload = p_upload, profiled.download = p_download, profiled.copy = p_copy, profiled.zero = p_zero;
        profiled.sync = p_sync, profiled.matmul = p_matmul, profiled.rmsnorm = p_rmsnorm, profiled.embed = p_embed;
        profiled.swiglu = p_swiglu, profiled.attention = p_attention, profiled.memory_mix = p_memory_mix;
        profiled.memory_update = p_memory_update, profiled.summary = p_summary, profiled.destroy = p_destroy;
        if (inner_ext->attention_mix) profiled_ext.attention_mix = p_attention_mix;
        if (inner_ext->ffn) profiled_ext.ffn = p_ffn;
        if (inner_ext->qkv) profiled_ext.qkv = p_qkv;
        if (inner_ext->memory_mix_to) profiled_ext.memory_mix_to = p_memory_mix_to;
        if (inner_ext->matmul_typed) profiled_ext.matmul_typed = p_matmul_typed;
        if (inner_ext->rmsnorm_typed) profiled_ext.rmsnorm_typed = p_rmsnorm_typed;
        if (inner_ext->upload_unordered) profiled_ext.upload_unordered = p_upload_unordered;
    }
    c->profile = p;
    be->ops = &profiled;
    return SF_OK;
}
