/* The CPU backend: host memory, OpenBLAS products and OpenMP parallel loops. */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "seqflow/error.h"

int sf_cpu_threads(const sf_backend *be)
{
    int t = be && be->threads > 0 ? be->threads : omp_get_max_threads();
    return t > 0 ? t : 1;
}

static void *cpu_alloc(sf_backend *be, size_t bytes)
{
    (void)be;
    /* 64-byte alignment for vector loads; aligned_alloc wants a multiple of the alignment */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void cpu_free(sf_backend *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static int cpu_copy(sf_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return SF_OK;
}

static int cpu_zero(sf_backend *be, void *dst, size_t bytes)
{
    (void)be;
    if (bytes) memset(dst, 0, bytes);
    return SF_OK;
}

static int cpu_sync(sf_backend *be)
{
    (void)be;
    return SF_OK;
}

static void cpu_destroy(sf_backend *be) { (void)be; }

/* The CPU computes in float32 only (no qkv_type op): a bf16 activation is refused rather
 * than widened, so that a caller's wrong type shows at once. */
static int f32_only(sf_dtype type, const char *op)
{
    if (type == SF_DTYPE_F32) return SF_OK;
    return sf_error(SF_E_UNSUPPORTED, "cpu %s: activations must be float32 (SF_DTYPE_F32), not type %d", op, (int)type);
}

static int cpu_attention(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                         float *out)
{
    int rc = f32_only(desc->qkv_type, "attention");
    return rc != SF_OK ? rc : sf_cpu_attention(be, desc, q, k, v, out);
}

static int cpu_memory_mix(sf_backend *be, int n, int heads, int d, int ld, sf_dtype qtype, const void *q,
                          const float *M, const float *z, const float *gate, float *a)
{
    int rc = f32_only(qtype, "memory_mix");
    return rc != SF_OK ? rc : sf_cpu_memory_mix(be, n, heads, d, ld, q, M, z, gate, a);
}

static int cpu_memory_update(sf_backend *be, sf_memory_kind kind, int n, int heads, int d, int ld, sf_dtype kvtype,
                             const void *k, const void *v, float *M, float *z)
{
    int rc = f32_only(kvtype, "memory_update");
    return rc != SF_OK ? rc : sf_cpu_memory_update(be, kind, n, heads, d, ld, k, v, M, z);
}

static int cpu_summary(sf_backend *be, int n, int segment, int summary_tokens, int width, int ld, sf_dtype kvtype,
                       const void *k, const void *v, float *sk, float *sv, int *count)
{
    int rc = f32_only(kvtype, "summary");
    return rc != SF_OK ? rc : sf_cpu_summary(be, n, segment, summary_tokens, width, ld, k, v, sk, sv, count);
}

/* Every core op, on float32 activations only (f32_only above refuses the rest). */
static int cpu_supports_op(sf_backend *be, sf_op op, sf_dtype type)
{
    (void)be;
    return (int)op >= 0 && (int)op < SF_OP_COUNT && type == SF_DTYPE_F32;
}

/* Core ops only (ext NULL): the stages' fused steps are the compositions of kernels/backend.c,
 * which is what the CPU computed before there were fused forms. */
const sf_backend_ops sf_cpu_backend_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .matmul = sf_cpu_matmul,
    .rmsnorm = sf_cpu_rmsnorm,
    .embed = sf_cpu_embed,
    .swiglu = sf_cpu_swiglu,
    .attention = cpu_attention,
    .memory_mix = cpu_memory_mix,
    .memory_update = cpu_memory_update,
    .summary = cpu_summary,
    .destroy = cpu_destroy,
    .supports_op = cpu_supports_op,
    .ext = NULL,
};

static void blas_single_thread(void) { openblas_set_num_threads(1); }

int sf_cpu_backend_init(sf_backend *be)
{
    /* seqflow parallelizes with OpenMP itself (rows of a product, heads of attention) and
     * stage threads run concurrently; OpenBLAS's own threads on top would oversubscribe. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, blas_single_thread);
    be->ops = &sf_cpu_backend_ops;
    be->impl = NULL;
    return SF_OK;
}
