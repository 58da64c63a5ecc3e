/* Backend selection by name: "cpu" always; "cuda" when the build has CUDA (creating it fails
 * with SF_E_BACKEND when no GPU is usable). The CUDA backend lives in a module,
 * libseqflow-cuda.so.0, loaded here the first time a "cuda" backend is created, so that the
 * library itself needs no CUDA library. Also the sf_be_* functions of kernels/backend_ext.h:
 * the one place where stages' fused steps are composed from core ops. */
#ifdef SEQFLOW_HAVE_CUDA
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_ext.h"
#include "kernels/cpu/cpu_backend.h"
#include "seqflow/error.h"
#include "seqflow/packet.h"

static const char *const backend_names[] = {
    "cpu",
#ifdef SEQFLOW_HAVE_CUDA
    "cuda",
#endif
    NULL};

const char *const *sf_backend_names(void) { return backend_names; }

int sf_backend_create(const char *name, int device, sf_backend **out)
{
    return sf_backend_create_ex(name, device, SF_PRECISION_AUTO, out);
}

int sf_backend_create_ex(const char *name, int device, sf_precision precision, sf_backend **out)
{
    const sf_backend_options opts = {.device = device, .precision = precision};
    return sf_backend_create_opts(name, &opts, out);
}

/* The CPU backend has no settings: the first key of a non-empty settings string is refused by
 * name, so that a setting meant for another device does not pass silently. */
static int cpu_settings(const char *settings)
{
    if (!settings) return SF_OK;
    while (*settings == ',' || *settings == ' ') settings++;
    if (!*settings) return SF_OK;
    const size_t len = strcspn(settings, "=,");
    return sf_error(SF_E_OPTION, "cpu backend has no setting '%.*s'", (int)len, settings);
}

#ifdef SEQFLOW_HAVE_CUDA
/* kernels/cuda/cuda_backend.h: the module's one entry point */
typedef int (*cuda_init_fn)(sf_backend *be, int device, const char *settings);

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static cuda_init_fn cuda_init;        /* NULL when the module could not be loaded */
static void *cuda_module;             /* its handle (dlsym), NULL likewise */
static char cuda_load_error[512];     /* why, for every later attempt too */

/* Loads the module (never unloaded: backends keep pointers into it). Tries, in order: the
 * folder of the library or program holding this code and of the running program (a build
 * tree, or lib/ of an install), the install's libdir relative to each (bin/seqflow -> lib/),
 * then the name alone (the loader's
 * search: LD_LIBRARY_PATH, the cache, the system folders). The first dlopen error is kept: it
 * names the missing CUDA library when the module is there but the CUDA runtime is not. */
static void load_cuda_module(void)
{
    /* the folders: the object holding this code (dladdr: libseqflow.so, or the program, whose
     * name may come without a folder) and the running program (/proc/self/exe) */
    char dirs[2][4096] = {"", ""};
    Dl_info info;
    if (dladdr((void *)load_cuda_module, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        snprintf(dirs[0], sizeof dirs[0], "%s", info.dli_fname);
    ssize_t len = readlink("/proc/self/exe", dirs[1], sizeof dirs[1] - 1);
    dirs[1][len > 0 ? len : 0] = 0;
    char paths[5][4200];
    int n = 0;
    for (int d = 0; d < 2; d++) {
        char *slash = strrchr(dirs[d], '/');
        if (!slash) continue;
        *slash = 0;
        snprintf(paths[n++], sizeof paths[0], "%.4000s/%s", dirs[d], SEQFLOW_CUDA_MODULE);
        snprintf(paths[n++], sizeof paths[0], "%.4000s/%s/%s", dirs[d], SEQFLOW_BIN_TO_LIB, SEQFLOW_CUDA_MODULE);
    }
    snprintf(paths[n++], sizeof paths[0], "%s", SEQFLOW_CUDA_MODULE);
    for (int i = 0; i < n; i++) {
        /* a path that is not there says nothing; the module found but not loadable does */
        const int exists = !strchr(paths[i], '/') || access(paths[i], F_OK) == 0;
        if (!exists) continue;
        void *module = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!module) {
            const char *why = dlerror();
            if (!*cuda_load_error) snprintf(cuda_load_error, sizeof cuda_load_error, "%.500s", why ? why : "dlopen failed");
            continue;
        }
        cuda_init = (cuda_init_fn)(uintptr_t)dlsym(module, "sf_cuda_backend_init");
        if (cuda_init) {
            cuda_module = module;
            return;
        }
        snprintf(cuda_load_error, sizeof cuda_load_error, "%.400s has no sf_cuda_backend_init", paths[i]);
    }
}

void *sf_cuda_module_symbol(const char *name)
{
    pthread_once(&cuda_once, load_cuda_module);
    return cuda_module ? dlsym(cuda_module, name) : NULL;
}

static int cuda_backend_init(sf_backend *be, int device, const char *settings)
{
    pthread_once(&cuda_once, load_cuda_module);
    if (!cuda_init)
        return sf_error(SF_E_BACKEND, "device 'cuda': the CUDA backend (%s) cannot be loaded: %s; use -d cpu",
                        SEQFLOW_CUDA_MODULE, *cuda_load_error ? cuda_load_error : "not found");
    return cuda_init(be, device, settings);
}
#else
void *sf_cuda_module_symbol(const char *name)
{
    (void)name;
    return NULL;
}
#endif

int sf_backend_create_opts(const char *name, const sf_backend_options *opts, sf_backend **out)
{
    if (!out) return sf_error(SF_E_INVAL, "sf_backend_create: out is NULL");
    *out = NULL;
    const sf_backend_options defaults = {0};
    if (!opts) opts = &defaults;
    if (!name) name = "cpu";
    const sf_precision precision = opts->precision;
    if (precision != SF_PRECISION_AUTO && precision != SF_PRECISION_F32 && precision != SF_PRECISION_BF16 &&
        precision != SF_PRECISION_FP8)
        return sf_error(SF_E_INVAL, "sf_backend_create: unknown precision %d", (int)precision);
    int is_cuda = strcmp(name, "cuda") == 0;
#ifndef SEQFLOW_HAVE_CUDA
    if (is_cuda)
        return sf_error(SF_E_BACKEND, "device 'cuda': this build has no CUDA backend (built without nvcc or with SEQFLOW_CUDA=OFF); use -d cpu");
#endif
    if (!is_cuda && strcmp(name, "cpu") != 0) {
        char avail[64] = "";
        size_t used = 0;
        for (int i = 0; backend_names[i] && used < sizeof avail; i++) {
            int w = snprintf(avail + used, sizeof avail - used, "%s%s", i ? ", " : "", backend_names[i]);
            if (w < 0) break;
            used += (size_t)w;
        }
        return sf_error(SF_E_BACKEND, "unknown device '%s' (available: %s)", name, avail);
    }
    if (!is_cuda && precision == SF_PRECISION_BF16)
        return sf_error(SF_E_UNSUPPORTED, "precision bf16 needs a GPU device; the cpu backend computes in f32");
    if (!is_cuda && precision == SF_PRECISION_FP8)
        return sf_error(SF_E_UNSUPPORTED, "precision fp8 needs the cuda device; the cpu backend computes in f32");
    if (!is_cuda) {
        int rc = cpu_settings(opts->settings);
        if (rc != SF_OK) return rc;
    }
    sf_backend *be = calloc(1, sizeof *be);
    if (!be) return sf_error(SF_E_NOMEM, "out of memory");
    be->threads = opts->threads;
    int rc;
#ifdef SEQFLOW_HAVE_CUDA
    if (is_cuda) {
        be->precision = precision == SF_PRECISION_AUTO ? SF_PRECISION_BF16 : precision;
        rc = cuda_backend_init(be, opts->device, opts->settings);
    } else
#endif
    {
        /* the CPU backend has one device */
        be->precision = SF_PRECISION_F32;
        rc = sf_cpu_backend_init(be);
    }
    if (rc != SF_OK) {
        free(be);
        return rc;
    }
    *out = be;
    return SF_OK;
}

void sf_backend_free(sf_backend *be)
{
    if (!be) return;
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    free(be);
}

/* ---- the internal extensions (kernels/backend_ext.h) --------------------------------------
 * Each function uses the backend's slot where it has one and composes the core ops otherwise.
 * The compositions are the CPU's arithmetic, in the order the block stage always issued it, so
 * that the CPU's output does not depend on whether a step is fused. */

static const sf_backend_ext *ext_of(const sf_backend *be) { return be && be->ops ? be->ops->ext : NULL; }

/* Whether be runs op on activations of type (NULL supports_op: float32 only). */
static int supports(sf_backend *be, sf_op op, sf_dtype type)
{
    if (type == SF_DTYPE_F32) return 1;
    return be->ops->supports_op && be->ops->supports_op(be, op, type);
}

int sf_be_has_side_queue(const sf_backend *be)
{
    const sf_backend_ext *x = ext_of(be);
    return x && x->side_begin && x->side_end && x->side_join;
}

int sf_be_prepare_weights(sf_backend *be, int count, const float *const *w, int out, int in)
{
    const sf_backend_ext *x = ext_of(be);
    return x && x->prepare_weight_group ? x->prepare_weight_group(be, count, w, out, in) : SF_OK;
}

int sf_be_reserve(sf_backend *be, int rows, int width, int heads, int head_dim)
{
    const sf_backend_ext *x = ext_of(be);
    return x && x->reserve ? x->reserve(be, rows, width, heads, head_dim) : SF_OK;
}

sf_dtype sf_be_qkv_type(sf_backend *be, int head_dim)
{
    const sf_backend_ext *x = ext_of(be);
    if (!x || !x->qkv || !x->qkv_type) return SF_DTYPE_F32;
    const sf_dtype t = x->qkv_type(be, head_dim);
    /* every op that reads q, k or v must take the type, or the composed float32 path is used */
    const sf_op readers[] = {SF_OP_ATTENTION, SF_OP_MEMORY_MIX, SF_OP_MEMORY_UPDATE, SF_OP_SUMMARY};
    for (size_t i = 0; i < sizeof readers / sizeof *readers; i++)
        if (!supports(be, readers[i], t)) return SF_DTYPE_F32;
    return t;
}

sf_dtype sf_be_mix_type(sf_backend *be, sf_dtype qkv_type, int has_memory)
{
    const sf_backend_ext *x = ext_of(be);
    if (qkv_type == SF_DTYPE_BF16 && has_memory && x && x->memory_mix_to && x->matmul_typed) return SF_DTYPE_BF16;
    return SF_DTYPE_F32;
}

int sf_be_qkv(sf_backend *be, int n, int dim, int width, const float *x, const float *norm, float eps,
              const float *wq, const float *wk, const float *wv, sf_dtype type, void *q, void *k, void *v, float *u)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->qkv) return e->qkv(be, n, dim, width, x, norm, eps, wq, wk, wv, type, q, k, v, u);
    if (type != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "%s backend: qkv writes float32 only, not type %d", be->ops->name, (int)type);
    int rc = be->ops->rmsnorm(be, n, dim, x, norm, eps, u);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, width, u, dim, wq, q, width, 0);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, width, u, dim, wk, k, width, 0);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, width, u, dim, wv, v, width, 0);
    return rc;
}

int sf_be_attention_mix(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                        float *a, const float *M, const float *z, const float *gate, sf_dtype otype, void *out)
{
    const sf_backend_ext *x = ext_of(be);
    /* the fused form only where the mix hands on another type: float32 goes through a anyway */
    if (M && otype != SF_DTYPE_F32 && x && x->attention_mix)
        return x->attention_mix(be, desc, q, k, v, a, M, z, gate, otype, out);
    if (otype == SF_DTYPE_F32 && out != a)
        return sf_error(SF_E_INVAL, "attention_mix: a float32 result goes to a itself");
    if (otype != SF_DTYPE_F32 && !(M && x && x->memory_mix_to))
        return sf_error(SF_E_UNSUPPORTED, "%s backend: attention_mix writes float32 only, not type %d", be->ops->name,
                        (int)otype);
    int rc = be->ops->attention(be, desc, q, k, v, a);
    if (rc != SF_OK || !M) return rc;
    const int n = desc->n, H = desc->heads, d = desc->head_dim, ld = desc->ld;
    if (otype != SF_DTYPE_F32) return x->memory_mix_to(be, n, H, d, ld, desc->qkv_type, q, M, z, gate, a, otype, out);
    return be->ops->memory_mix(be, n, H, d, ld, desc->qkv_type, q, M, z, gate, a);
}

int sf_be_matmul_typed(sf_backend *be, int n, int in, int out, sf_dtype xtype, const void *x, int ldx, const float *w,
                       sf_dtype ytype, void *y, int ldy, int accumulate)
{
    if (xtype == SF_DTYPE_F32 && ytype == SF_DTYPE_F32)
        return be->ops->matmul(be, n, in, out, x, ldx, w, y, ldy, accumulate);
    const sf_backend_ext *e = ext_of(be);
    if (e && e->matmul_typed) return e->matmul_typed(be, n, in, out, xtype, x, ldx, w, ytype, y, ldy, accumulate);
    return sf_error(SF_E_UNSUPPORTED, "%s backend: matmul takes and writes float32 only, not types %d, %d",
                    be->ops->name, (int)xtype, (int)ytype);
}

size_t sf_be_ffn_h1_floats(sf_backend *be, int n, int dim, int hidden)
{
    const sf_backend_ext *x = ext_of(be);
    if (x && x->ffn && x->ffn_h1_floats) return x->ffn_h1_floats(be, n, dim, hidden);
    return (size_t)n * (size_t)hidden;
}

int sf_be_ffn(sf_backend *be, int n, int dim, int hidden, float *x, const float *norm, float eps, const float *w1,
              const float *w3, const float *w2, float *u, float *h1, float *h3)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->ffn) return e->ffn(be, n, dim, hidden, x, norm, eps, w1, w3, w2, u, h1, h3);
    int rc = be->ops->rmsnorm(be, n, dim, x, norm, eps, u);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, hidden, u, dim, w1, h1, hidden, 0);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, hidden, u, dim, w3, h3, hidden, 0);
    if (rc == SF_OK) rc = be->ops->swiglu(be, n, hidden, h1, h3);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, hidden, dim, h1, hidden, w2, x, dim, 1);
    return rc;
}

int sf_be_ffn_partial(sf_backend *be, int n, int dim, int hidden, const float *x, const float *norm, float eps,
                      const float *w1, const float *w3, const float *w2, float *u, float *h1, float *h3, sf_dtype ytype,
                      void *y)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->ffn_partial) return e->ffn_partial(be, n, dim, hidden, x, norm, eps, w1, w3, w2, u, h1, h3, ytype, y);
    if (ytype != SF_DTYPE_F32)
        return sf_error(SF_E_UNSUPPORTED, "%s backend: ffn writes float32 only, not type %d", be->ops->name,
                        (int)ytype);
    int rc = be->ops->rmsnorm(be, n, dim, x, norm, eps, u);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, hidden, u, dim, w1, h1, hidden, 0);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, dim, hidden, u, dim, w3, h3, hidden, 0);
    if (rc == SF_OK) rc = be->ops->swiglu(be, n, hidden, h1, h3);
    if (rc == SF_OK) rc = be->ops->matmul(be, n, hidden, dim, h1, hidden, w2, y, dim, 0);
    return rc;
}

sf_dtype sf_be_part_type(sf_backend *be)
{
    const sf_backend_ext *e = ext_of(be);
    if (!e || !e->part_type || !e->matmul_typed || !e->ffn_partial || !e->add_typed) return SF_DTYPE_F32;
    return e->part_type(be);
}

int sf_be_add_typed(sf_backend *be, size_t count, float *x, sf_dtype ytype, const void *y)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->add_typed) return e->add_typed(be, count, x, ytype, y);
    return sf_error(SF_E_UNSUPPORTED, "%s backend: no add of typed rows", be->ops->name);
}

sf_dtype sf_be_normed_type(sf_backend *be)
{
    const sf_backend_ext *e = ext_of(be);
    if (!e || !e->normed_type || !e->qkv_from || !e->ffn_partial_from) return SF_DTYPE_F32;
    return e->normed_type(be) == SF_DTYPE_BF16 ? SF_DTYPE_BF16 : SF_DTYPE_F32;
}

int sf_be_qkv_from(sf_backend *be, int n, int dim, int width, const void *u, const float *wq, const float *wk,
                   const float *wv, sf_dtype type, void *q, void *k, void *v)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->qkv_from) return e->qkv_from(be, n, dim, width, u, wq, wk, wv, type, q, k, v);
    return sf_error(SF_E_UNSUPPORTED, "%s backend: no products from normed rows", be->ops->name);
}

int sf_be_ffn_partial_from(sf_backend *be, int n, int dim, int hidden, const void *u, const float *w1, const float *w3,
                           const float *w2, float *h1, float *h3, sf_dtype ytype, void *y)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->ffn_partial_from) return e->ffn_partial_from(be, n, dim, hidden, u, w1, w3, w2, h1, h3, ytype, y);
    return sf_error(SF_E_UNSUPPORTED, "%s backend: no products from normed rows", be->ops->name);
}

int sf_be_rmsnorm_typed(sf_backend *be, int n, int dim, const float *x, const float *weight, float eps,
                        sf_dtype otype, void *y)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->rmsnorm_typed) return e->rmsnorm_typed(be, n, dim, x, weight, eps, otype, y);
    /* an expected answer, not a failure: the caller rounds on the host (sf_last_error untouched) */
    return SF_E_UNSUPPORTED;
}

int sf_be_any_non_finite(sf_backend *be, const void *x, sf_dtype type, size_t count, int *found)
{
    const sf_backend_ext *e = ext_of(be);
    *found = 0;
    if (!e || !e->non_finite_begin || !e->non_finite_end) return SF_E_UNSUPPORTED; /* sf_last_error untouched */
    int ticket = 0;
    int rc = e->non_finite_begin(be, x, type, count, &ticket);
    return rc == SF_OK ? e->non_finite_end(be, ticket, found) : rc;
}

int sf_be_check_rows_begin(sf_backend *be, const void *rows, sf_dtype type, size_t count, sf_rows_check *chk)
{
    chk->state = 0;
    chk->ticket = 0;
    if (sf_check_finite() != SF_CHECK_FINITE_ON || !count) return SF_OK;
    const sf_backend_ext *e = ext_of(be);
    if (!e || !e->non_finite_begin || !e->non_finite_end) {
        chk->state = 2;
        return SF_OK;
    }
    int rc = e->non_finite_begin(be, rows, type, count, &chk->ticket);
    if (rc == SF_OK) chk->state = 1;
    return rc;
}

int sf_be_download_start(sf_backend *be, void *host_dst, const void *src, size_t bytes, void **ticket)
{
    const sf_backend_ext *e = ext_of(be);
    if (!e || !e->download_start || !e->download_wait) return SF_E_UNSUPPORTED;
    return e->download_start(be, host_dst, src, bytes, ticket);
}

int sf_be_download_wait(sf_backend *be, void *ticket) { return ext_of(be)->download_wait(be, ticket); }

int sf_be_check_rows_end(sf_backend *be, sf_rows_check *chk, int *scan_host)
{
    *scan_host = chk->state == 2;
    if (chk->state != 1) return SF_OK;
    chk->state = 0;
    return ext_of(be)->non_finite_end(be, chk->ticket, scan_host);
}

int sf_be_warmup(sf_backend *be)
{
    const sf_backend_ext *e = ext_of(be);
    return e && e->warmup ? e->warmup(be) : 0;
}

int sf_be_device_rows(sf_backend *be)
{
    if (!be || strcmp(be->ops->name, "cpu") == 0) return 0;
    const sf_backend_ext *e = ext_of(be);
    return e && e->device_rows ? e->device_rows(be) : 1;
}

int sf_be_upload_unordered(sf_backend *be, void *dst, const void *host_src, size_t bytes)
{
    const sf_backend_ext *e = ext_of(be);
    if (e && e->upload_unordered) return e->upload_unordered(be, dst, host_src, bytes);
    return be->ops->upload(be, dst, host_src, bytes);
}

int sf_be_side_begin(sf_backend *be)
{
    return sf_be_has_side_queue(be) ? be->ops->ext->side_begin(be) : SF_OK;
}

int sf_be_side_end(sf_backend *be)
{
    return sf_be_has_side_queue(be) ? be->ops->ext->side_end(be) : SF_OK;
}

int sf_be_side_join(sf_backend *be)
{
    return sf_be_has_side_queue(be) ? be->ops->ext->side_join(be) : SF_OK;
}

int sf_be_side_join_before_product(sf_backend *be)
{
    if (!sf_be_has_side_queue(be)) return SF_OK;
    const sf_backend_ext *e = be->ops->ext;
    return e->side_join_before_product ? e->side_join_before_product(be) : e->side_join(be);
}
