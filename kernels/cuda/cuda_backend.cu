/* The CUDA backend's op tables, buffers, lock, settings and lifetime (see cuda_backend.h). */
#include "kernels/backend_ext.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_early.cuh"
#include "seqflow/packet.h"
#include "kernels/cuda/profile.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* cuBLAS wants 32 MiB of workspace on Hopper; handing it ours keeps it from allocating its own
 * on first use, which would land in the middle of a stream. */
#define BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

int sf_cuda_hopper_kernel_fits(const void *kernel, int smem_bytes)
{
    int dev = 0, major = 0, minor = 0, sms = 0;
    cudaFuncAttributes fa;
    const bool ok = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    major == 9 && minor == 0 &&
                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                    cudaFuncGetAttributes(&fa, kernel) == cudaSuccess &&
                    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) ==
                        cudaSuccess;
    cudaGetLastError(); /* a missing image must not linger as the next launch's error */
    return ok ? sms : 0;
}

int sf_cuda_hopper_known(int *known, const void *kernel, int smem_bytes)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!known[dev]) {
        const int sms = sf_cuda_hopper_kernel_fits(kernel, smem_bytes);
        known[dev] = sms > 0 ? sms : -1;
    }
    return known[dev] > 0 ? known[dev] : 0;
}

int sf_cublas_status(cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_SUCCESS) return SF_OK;
    return sf_error(SF_E_BACKEND, "cuBLAS: %s: %s", what, cublasGetStatusString(st));
}

/* The stream this thread issues to (side_begin .. side_end), if any, and the backend it
 * belongs to. */
static thread_local sf_cuda *stream_owner;
static thread_local sf_cuda_stream *stream_of_thread;

void sf_cuda_set_thread_stream(sf_cuda *c, sf_cuda_stream *s)
{
    stream_owner = s ? c : NULL;
    stream_of_thread = s;
}

sf_cuda_stream *sf_cuda_thread_stream(const sf_cuda *c) { return stream_owner == c ? stream_of_thread : NULL; }

/* The early_launch setting of the backend this thread last entered: the kernels launched
 * through sf_cuda_launch_early read it there, since their entry points (the attention
 * kernels among them) take a stream, not the backend. Kernels called outside any backend
 * (benchmarks of one kernel) launch early, the default. */
static thread_local int early_launch_of_thread = 1;

int sf_cuda_early_launch(void) { return early_launch_of_thread; }

/* Exchanges the main stream, scratch, cuBLAS workspace and widened copies with q's (under the
 * lock). cublasSetStream drops the handle's workspace, so it is set again right after. */
static int swap_stream(sf_cuda *c, sf_cuda_stream *q)
{
    sf_cuda_stream main_q = {c->stream,  c->scratch,      c->scratch_bytes, c->blas_workspace, c->blas_workspace_bytes,
                             c->widened, c->widened_bytes};
    c->stream = q->stream, c->scratch = q->scratch, c->scratch_bytes = q->scratch_bytes;
    c->blas_workspace = q->blas_workspace, c->blas_workspace_bytes = q->blas_workspace_bytes;
    c->widened = q->widened, c->widened_bytes = q->widened_bytes;
    *q = main_q;
    c->swapped = c->swapped ? NULL : q;
    int rc = sf_cublas_status(cublasSetStream(c->blas, c->stream), "cublasSetStream");
    if (rc == SF_OK)
        rc = sf_cublas_status(cublasSetWorkspace(c->blas, c->blas_workspace, c->blas_workspace_bytes),
                              "cublasSetWorkspace");
    return rc;
}

int sf_cuda_enter(sf_cuda *c)
{
    pthread_mutex_lock(&c->lock);
    /* the current device is per host thread, and stage threads come and go */
    int rc = sf_cuda_status(cudaSetDevice(c->device), "cudaSetDevice");
    early_launch_of_thread = c->settings.early_launch;
    if (rc == SF_OK && stream_owner == c) rc = swap_stream(c, stream_of_thread);
    if (rc != SF_OK) {
        if (c->swapped) swap_stream(c, c->swapped);
        pthread_mutex_unlock(&c->lock);
    }
    return rc;
}

void sf_cuda_leave(sf_cuda *c)
{
    if (c->swapped) swap_stream(c, c->swapped);
    pthread_mutex_unlock(&c->lock);
}

static void count_bytes(sf_cuda *c, size_t add, size_t sub)
{
    c->allocated = c->allocated + add - sub;
    if (c->allocated > c->peak) c->peak = c->allocated;
}

int sf_cuda_malloc_counted(sf_cuda *c, void **ptr, size_t bytes)
{
    *ptr = NULL;
    int rc = sf_cuda_status(cudaMalloc(ptr, bytes ? bytes : 1), "cudaMalloc");
    if (rc != SF_OK) {
        *ptr = NULL;
        return rc;
    }
    count_bytes(c, bytes, 0);
    return SF_OK;
}

void sf_cuda_free_counted(sf_cuda *c, void *ptr, size_t bytes)
{
    if (!ptr) return;
    cudaFree(ptr);
    count_bytes(c, 0, bytes);
}

static int grow_scratch(sf_cuda *c, void **scratch, size_t *have, size_t bytes)
{
    if (bytes <= *have) return SF_OK;
    /* cudaFree waits for the device, so no launch still reads the old scratch */
    sf_cuda_free_counted(c, *scratch, *have);
    *scratch = NULL, *have = 0;
    int rc = sf_cuda_malloc_counted(c, scratch, bytes);
    if (rc == SF_OK) *have = bytes;
    return rc;
}

int sf_cuda_scratch(sf_cuda *c, size_t bytes) { return grow_scratch(c, &c->scratch, &c->scratch_bytes, bytes); }
int sf_cuda_widened(sf_cuda *c, size_t bytes) { return grow_scratch(c, &c->widened, &c->widened_bytes, bytes); }

int sf_cuda_stream_create(sf_cuda *c, sf_cuda_stream *q, size_t scratch_bytes, size_t blas_workspace_bytes)
{
    int rc = sf_cuda_status(cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking), "stream");
    if (rc == SF_OK) rc = grow_scratch(c, &q->scratch, &q->scratch_bytes, scratch_bytes);
    if (rc == SF_OK) rc = grow_scratch(c, &q->blas_workspace, &q->blas_workspace_bytes, blas_workspace_bytes);
    return rc;
}

void sf_cuda_stream_release(sf_cuda *c, sf_cuda_stream *q)
{
    if (q->stream) cudaStreamSynchronize(q->stream);
    sf_cuda_free_counted(c, q->scratch, q->scratch_bytes);
    sf_cuda_free_counted(c, q->blas_workspace, q->blas_workspace_bytes);
    sf_cuda_free_counted(c, q->widened, q->widened_bytes);
    if (q->stream) cudaStreamDestroy(q->stream);
    memset(q, 0, sizeof *q);
}

static void *cuda_alloc(sf_backend *be, size_t bytes)
{
    sf_cuda *c = sf_cuda_of(be);
    if (sf_cuda_enter(c) != SF_OK) return NULL;
    void *ptr = NULL;
    if (c->n_allocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        sf_cuda_alloc *grown = (sf_cuda_alloc *)realloc(c->allocs, (size_t)cap * sizeof *grown);
        if (!grown) {
            sf_error(SF_E_NOMEM, "out of memory");
            sf_cuda_leave(c);
            return NULL;
        }
        c->allocs = grown, c->cap_allocs = cap;
    }
    if (sf_cuda_malloc_counted(c, &ptr, bytes) == SF_OK) {
        c->allocs[c->n_allocs].ptr = ptr;
        c->allocs[c->n_allocs].bytes = bytes;
        c->n_allocs++;
    }
    sf_cuda_leave(c);
    return ptr;
}

static void cuda_free(sf_backend *be, void *ptr)
{
    if (!ptr) return;
    sf_cuda *c = sf_cuda_of(be);
    if (sf_cuda_enter(c) != SF_OK) return;
    sf_cuda_drop_weight(c, ptr);
    for (int i = c->n_allocs - 1; i >= 0; i--) {
        if (c->allocs[i].ptr != ptr) continue;
        sf_cuda_free_counted(c, ptr, c->allocs[i].bytes);
        c->allocs[i] = c->allocs[--c->n_allocs];
        break;
    }
    sf_cuda_leave(c);
}

static int slot_fit(sf_cuda *c, sf_cuda_staging *slot, size_t bytes);

/* Uploads and downloads of up to the reserved size go through pinned, double-buffered staging
 * on their own streams: the host never blocks on the compute stream to upload, and a download
 * waits only for the work issued before it, not for what other stage threads queued since.
 * Larger or unreserved transfers (weights at init) are plain pageable copies on the compute
 * stream. Either way the copy is ordered after earlier ops and before later ones. */
static int upload(sf_backend *be, void *dst, const void *host_src, size_t bytes, int after_earlier)
{
    if (!bytes) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    sf_cuda_staging *slot = &c->up[c->up_next];
    if (bytes > c->staging_limit) {
        /* from pageable memory this returns once the source is staged, so the caller may reuse it */
        rc = sf_cuda_status(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream), "upload");
        sf_cuda_leave(c);
        return rc;
    }
    c->up_next = (c->up_next + 1) % SF_CUDA_STAGING_SLOTS;
    /* the slot's previous upload must have left it before it is overwritten */
    if (slot->pending) rc = sf_cuda_status(cudaEventSynchronize(slot->done), "upload (staging)");
    slot->pending = 0;
    if (rc == SF_OK) rc = slot_fit(c, slot, bytes);
    if (rc == SF_OK) {
        memcpy(slot->host, host_src, bytes);
        if (after_earlier) rc = sf_cuda_status(cudaEventRecord(slot->ready, c->stream), "upload (order)");
    }
    if (rc == SF_OK && after_earlier)
        rc = sf_cuda_status(cudaStreamWaitEvent(c->copy_in, slot->ready, 0), "upload (order)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaMemcpyAsync(dst, slot->host, bytes, cudaMemcpyHostToDevice, c->copy_in), "upload");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(slot->done, c->copy_in), "upload (order)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(c->stream, slot->done, 0), "upload (order)");
    slot->pending = 1;
    sf_cuda_leave(c);
    return rc;
}

static int cuda_upload(sf_backend *be, void *dst, const void *host_src, size_t bytes)
{
    return upload(be, dst, host_src, bytes, 1);
}

/* The copy stream does not wait for the compute stream: the copy overlaps the work queued
 * ahead of it (the token ids of the next segment during this one's layers). */
static int cuda_upload_unordered(sf_backend *be, void *dst, const void *host_src, size_t bytes)
{
    return upload(be, dst, host_src, bytes, !sf_cuda_of(be)->settings.upload_unordered);
}

static int is_pinned(const void *host)
{
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeHost;
}

/* Issues the copy of bytes of src into dst on the copy queue, after everything issued so far on
 * the compute queue, marking its end with slot->done (under the lock). */
static int copy_out(sf_cuda *c, sf_cuda_staging *slot, void *dst, const void *src, size_t bytes)
{
    int rc = sf_cuda_status(cudaEventRecord(slot->ready, c->stream), "download (order)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(c->copy_out, slot->ready, 0), "download (order)");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->copy_out), "download");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(slot->done, c->copy_out), "download (order)");
    return rc;
}

/* A download that returns at once (backend_ext.h, download_start): page-locked destinations
 * only, on a free transfer slot; the copy runs on the copy queue after everything issued so
 * far, beside the work issued next. The slot is the ticket, held until download_wait. */
static int cuda_download_start(sf_backend *be, void *host_dst, const void *src, size_t bytes, void **ticket)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!bytes || !is_pinned(host_dst)) return SF_E_UNSUPPORTED;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    sf_cuda_staging *slot = NULL;
    for (int i = 0; i < SF_CUDA_STAGING_SLOTS && !slot; i++)
        if (!c->down[i].busy) slot = &c->down[i];
    if (!slot) {
        sf_cuda_leave(c);
        return SF_E_UNSUPPORTED;
    }
    slot->busy = 1;
    rc = copy_out(c, slot, host_dst, src, bytes);
    if (rc != SF_OK) slot->busy = 0;
    sf_cuda_leave(c);
    if (rc == SF_OK) *ticket = slot;
    return rc;
}

static int cuda_download_wait(sf_backend *be, void *ticket)
{
    sf_cuda *c = sf_cuda_of(be);
    sf_cuda_staging *slot = (sf_cuda_staging *)ticket;
    int rc = sf_cuda_status(cudaEventSynchronize(slot->done), "download (synchronize)");
    pthread_mutex_lock(&c->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int cuda_download(sf_backend *be, void *host_dst, const void *src, size_t bytes)
{
    if (!bytes) return SF_OK;
    /* page-locked destinations (packets from the allocator installed at init) take the copy
     * straight from the device, on the copy queue */
    void *ticket = NULL;
    int rc = cuda_download_start(be, host_dst, src, bytes, &ticket);
    if (rc == SF_OK) return cuda_download_wait(be, ticket);
    if (rc != SF_E_UNSUPPORTED) return rc;
    sf_cuda *c = sf_cuda_of(be);
    if ((rc = sf_cuda_enter(c)) != SF_OK) return rc;
    sf_cuda_staging *slot = NULL;
    for (int i = 0; i < SF_CUDA_STAGING_SLOTS && !slot; i++)
        if (!c->down[i].busy && bytes <= c->staging_limit) slot = &c->down[i];
    if (!slot) {
        rc = sf_cuda_status(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download");
        cudaStream_t issued_on = c->stream; /* read under the lock: a side thread swaps it */
        sf_cuda_leave(c);
        /* waiting outside the lock lets other stage threads keep issuing work meanwhile */
        if (rc == SF_OK) rc = sf_cuda_status(cudaStreamSynchronize(issued_on), "download (synchronize)");
        return rc;
    }
    slot->busy = 1;
    /* pageable destinations (or page-locked ones that found every slot busy a moment ago) go
     * through the slot's staging and one host memcpy */
    rc = slot_fit(c, slot, bytes);
    if (rc == SF_OK) rc = copy_out(c, slot, slot->host, src, bytes);
    sf_cuda_leave(c);
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventSynchronize(slot->done), "download (synchronize)");
    if (rc == SF_OK) memcpy(host_dst, slot->host, bytes);
    pthread_mutex_lock(&c->lock);
    slot->busy = 0;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Pinned staging (host memory: not in the device byte count). reserve sets how large a
 * transfer may be staged; a slot's buffer is made at the first transfer that needs it, to the
 * next power of two from 1 MiB: page-locking costs about 0.5 ms per MiB, and with device rows and
 * page-locked packets the default path stages only token ids, so most of it would never be used.
 * With warmup=1 the warm-up segment makes what the first segments need. */
#define STAGING_MAX_BYTES ((size_t)64 << 20) /* per slot; 4 slots */
#define STAGING_MIN_BYTES ((size_t)1 << 20)

/* Under the lock, on a slot no transfer is using. */
static int slot_fit(sf_cuda *c, sf_cuda_staging *slot, size_t bytes)
{
    if (slot->bytes >= bytes) return SF_OK;
    size_t size = STAGING_MIN_BYTES;
    while (size < bytes) size *= 2;
    if (size > c->staging_limit) size = c->staging_limit;
    cudaFreeHost(slot->host);
    slot->host = NULL, slot->bytes = 0;
    int rc = sf_cuda_status(cudaHostAlloc(&slot->host, size, cudaHostAllocDefault), "pinned staging");
    if (rc != SF_OK) {
        slot->host = NULL;
        return rc;
    }
    slot->bytes = size;
    return SF_OK;
}

static void reserve_staging(sf_cuda *c, size_t bytes)
{
    if (bytes > c->staging_limit) c->staging_limit = bytes;
}

static int cuda_copy(sf_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy");
    sf_cuda_leave(c);
    return rc;
}

static int cuda_zero(sf_backend *be, void *dst, size_t bytes)
{
    if (!bytes) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaMemsetAsync(dst, 0, bytes, c->stream), "zero");
    sf_cuda_leave(c);
    return rc;
}

static int cuda_sync(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    /* the handles are read under the lock (a side thread's op swaps them inside it); the
     * waits happen outside it, so other stage threads keep issuing work meanwhile */
    pthread_mutex_lock(&c->lock);
    cudaStream_t main_stream = c->stream, side_stream = c->side.stream;
    c->join_at_product = 0; /* everything issued so far is waited for below */
    pthread_mutex_unlock(&c->lock);
    int rc = sf_cuda_status(cudaSetDevice(c->device), "cudaSetDevice");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamSynchronize(main_stream), "synchronize");
    if (rc == SF_OK && side_stream) rc = sf_cuda_status(cudaStreamSynchronize(side_stream), "synchronize (side)");
    return rc;
}

/* The side queue (kernels/backend_ext.h), on a stream of its own. begin and end mark the
 * boundaries with events under the lock, so another thread's work cannot slip between the
 * record and the wait. When disabled all four do nothing and every op stays on the one stream,
 * in the order issued. */
static int cuda_side_begin(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!c->side.stream || sf_cuda_thread_stream(c) == &c->side) return SF_OK;
    if (stream_owner) return sf_error(SF_E_INVAL, "side_begin: this thread is on another backend's side queue");
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(c->side_start, c->stream), "side_begin (record)");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamWaitEvent(c->side.stream, c->side_start, 0), "side_begin (wait)");
    sf_cuda_leave(c);
    if (rc == SF_OK) sf_cuda_set_thread_stream(c, &c->side);
    return rc;
}

static int cuda_side_end(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (sf_cuda_thread_stream(c) != &c->side) return SF_OK;
    int rc = sf_cuda_enter(c); /* on the side: c->stream is the side stream here */
    sf_cuda_set_thread_stream(c, NULL);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_status(cudaEventRecord(c->side_done, c->stream), "side_end (record)");
    sf_cuda_leave(c);
    return rc;
}

static int cuda_side_join(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!c->side.stream) return SF_OK;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    c->join_at_product = 0; /* this wait covers what that one would have */
    /* side_done was last recorded at the latest side_end of any thread: waiting on it covers
     * every side op issued before, since the side stream runs them in order */
    rc = sf_cuda_status(cudaStreamWaitEvent(c->stream, c->side_done, 0), "side_join (wait)");
    sf_cuda_leave(c);
    return rc;
}

/* The wait itself is issued by sf_cuda_join_at_product, from the product paths. */
static int cuda_side_join_before_product(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!c->side.stream) return SF_OK;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    c->join_at_product = 1;
    sf_cuda_leave(c);
    return SF_OK;
}

int sf_cuda_join_at_product(sf_cuda *c)
{
    if (!c->join_at_product || c->swapped) return SF_OK;
    c->join_at_product = 0;
    return sf_cuda_status(cudaStreamWaitEvent(c->stream, c->side_done, 0), "side_join (before a product)");
}

/* float32 copies of bf16 q, k, v ([n, ld] each) in c->widened, for the kernels that read float32
 * only; *wide gets a float32 desc and the three copies. The copies take the same values, so the
 * result is what those kernels give on float32 inputs of these values. */
static int widen_qkv(sf_cuda *c, const sf_attention_desc *desc, const void *const in[3], sf_attention_desc *wide,
                     const float *out[3])
{
    const size_t count = (size_t)(desc->n - 1) * desc->ld + (size_t)desc->heads * desc->head_dim;
    const size_t each = (count * sizeof(float) + 255) & ~(size_t)255;
    int grown = sf_cuda_widened(c, 3 * each);
    if (grown != SF_OK) return grown;
    for (int i = 0; i < 3; i++) {
        float *dst = (float *)((unsigned char *)c->widened + i * each);
        int rc = sf_cuda_bf16_to_f32((const __nv_bfloat16 *)in[i], count, dst, c->stream);
        if (rc != SF_OK) return rc;
        out[i] = dst;
    }
    *wide = *desc;
    wide->qkv_type = SF_DTYPE_F32;
    return SF_OK;
}

static int cuda_attention(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k, const void *v,
                          float *out)
{
    if (desc->n <= 0) return SF_OK;
    if (desc->qkv_type != SF_DTYPE_F32 && desc->qkv_type != SF_DTYPE_BF16)
        return sf_error(SF_E_INVAL, "cuda attention: q/k/v of unknown type %d", (int)desc->qkv_type);
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = SF_E_UNSUPPORTED;
    /* the scratch (reserve) holds the bf16 K/V staging of the fast kernels; without it the slower
     * kernel that converts in its inner loop runs */
    void *ws = sf_cuda_attention_workspace_bytes(desc) <= c->scratch_bytes ? c->scratch : NULL;
    /* bf16 q/k/v (qkv's output on an H100): the wgmma kernel reads them in place */
    if (desc->qkv_type == SF_DTYPE_BF16 && c->precision == SF_PRECISION_BF16)
        rc = sf_cuda_attention(desc, q, k, v, out, ws, c->scratch_bytes, c->stream, &c->info);
    sf_attention_desc wide;
    const float *f[3] = {(const float *)q, (const float *)k, (const float *)v};
    if (desc->qkv_type == SF_DTYPE_BF16 && rc == SF_E_UNSUPPORTED) {
        sf_clear_error();
        const void *in[3] = {q, k, v};
        rc = widen_qkv(c, desc, in, &wide, f);
        if (rc == SF_OK) desc = &wide, rc = SF_E_UNSUPPORTED;
    }
    /* float32 q/k/v: sf_cuda_attention picks the kernel, the float32 one for shapes the
     * tensor-core kernels were not built for */
    if (rc == SF_E_UNSUPPORTED && c->precision == SF_PRECISION_BF16)
        rc = sf_cuda_attention(desc, f[0], f[1], f[2], out, ws, c->scratch_bytes, c->stream, &c->info);
    else if (rc == SF_E_UNSUPPORTED)
        rc = sf_cuda_attention_f32(desc, f[0], f[1], f[2], out, c->stream);
    sf_cuda_leave(c);
    return rc;
}

static int cuda_reserve(sf_backend *be, int rows, int width, int heads, int head_dim)
{
    if (rows <= 0 || width <= 0) return SF_OK;
    sf_cuda *c = sf_cuda_of(be);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    /* the largest users: float32 delta targets [rows, width] (bf16 activations take half), and
     * attention's bf16 K and V of [rows, width], each part 256-byte aligned (hence the slack);
     * and the memory update's delta target beside its partial sums */
    size_t bytes = (size_t)rows * (size_t)width * sizeof(float) + 4096;
    size_t update = heads > 0 && head_dim > 0 ? sf_cuda_memory_update_scratch_bytes(rows, heads, head_dim) : 0;
    if (update > bytes) bytes = update;
    if (heads > 0 && head_dim > 0) {
        /* attention's own formula, all rows as segment rows (the caller's rows include the
         * global tokens; + 4096 covers the alignment of staging them apart) */
        sf_attention_desc whole = {};
        whole.n = whole.segment = rows, whole.heads = heads, whole.head_dim = head_dim;
        size_t attention = sf_cuda_attention_workspace_bytes(&whole) + 4096;
        if (attention > bytes) bytes = attention;
    }
    rc = sf_cuda_scratch(c, bytes);
    /* the side queue runs the memory updates (and the summaries, which need no scratch) */
    if (rc == SF_OK && c->side.stream) rc = grow_scratch(c, &c->side.scratch, &c->side.scratch_bytes, update);
    /* a block stage moves [segment, D] activations in and out (width >= D covers them); with
     * device rows and page-locked packets no activation goes through staging at all, so it is
     * capped: a larger copy is a plain one, slower but never wrong */
    size_t staging = (size_t)rows * (size_t)width * sizeof(float);
    if (rc == SF_OK) reserve_staging(c, staging < STAGING_MAX_BYTES ? staging : STAGING_MAX_BYTES);
    sf_cuda_leave(c);
    return rc;
}

static void release(sf_cuda *c)
{
    sf_cuda_plan_cache_close(c);
    cudaSetDevice(c->device);
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (int i = 0; i < c->n_weights; i++)
        if (c->weights[i].owned) cudaFree(c->weights[i].mem);
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i].ptr);
    sf_cuda_stream_release(c, &c->side);
    cudaFree(c->scratch);
    cudaFree(c->widened);
    cudaFree(c->blas_workspace);
    if (c->finite_flags) cudaFreeHost(c->finite_flags);
    for (int i = 0; i < SF_CUDA_FINITE_FLAGS; i++)
        if (c->finite_done[i]) cudaEventDestroy(c->finite_done[i]);
    if (c->side_start) cudaEventDestroy(c->side_start);
    if (c->side_done) cudaEventDestroy(c->side_done);
    if (c->blas) cublasDestroy(c->blas);
    for (int i = 0; i < SF_CUDA_STAGING_SLOTS; i++) {
        sf_cuda_staging *slots[2] = {&c->up[i], &c->down[i]};
        for (int j = 0; j < 2; j++) {
            if (slots[j]->pending) cudaEventSynchronize(slots[j]->done);
            cudaFreeHost(slots[j]->host);
            if (slots[j]->ready) cudaEventDestroy(slots[j]->ready);
            if (slots[j]->done) cudaEventDestroy(slots[j]->done);
        }
    }
    if (c->copy_in) cudaStreamDestroy(c->copy_in);
    if (c->copy_out) cudaStreamDestroy(c->copy_out);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->weights);
    free(c->allocs);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* The mix fused into the attention kernel where it runs (bf16 q/k/v read in place, d = 64, an
 * H100, the memory's stream kernels chosen: sf_cuda_memory_stream_usable), else the two ops.
 * Setting attention_mix=0 keeps them apart (A/B timing, tests). */
static int cuda_attention_mix(sf_backend *be, const sf_attention_desc *desc, const void *q, const void *k,
                              const void *v, float *a, const float *M, const float *z, const float *gate,
                              sf_dtype otype, void *out)
{
    sf_cuda *c = sf_cuda_of(be);
    int rc = SF_E_UNSUPPORTED;
    if (c->settings.attention_mix && otype == SF_DTYPE_BF16 && desc->qkv_type == SF_DTYPE_BF16 && desc->n > 0 &&
        sf_cuda_memory_stream_usable(be, desc->head_dim, desc->ld) &&
        sf_cuda_attention_workspace_bytes(desc) <= c->scratch_bytes) {
        rc = sf_cuda_enter(c);
        if (rc != SF_OK) return rc;
        const sf_cuda_attention_mix mix = {M, z, gate, out};
        rc = sf_cuda_attention_with_mix(desc, q, k, v, a, &mix, c->scratch, c->scratch_bytes, c->stream, &c->info);
        sf_cuda_leave(c);
    }
    if (rc != SF_E_UNSUPPORTED) return rc;
    sf_clear_error();
    rc = cuda_attention(be, desc, q, k, v, a);
    return rc != SF_OK ? rc
                       : sf_cuda_memory_mix_to(be, desc->n, desc->heads, desc->head_dim, desc->ld, desc->qkv_type, q, M,
                                               z, gate, a, otype, out);
}

/* bf16 q, k, v where the default attention kernel reads them in place (compute capability 9.0,
 * d = 64 or 128, precision bf16); setting qkv=f32 keeps them float32 (for A/B timing and tests). */
static sf_dtype cuda_qkv_type(sf_backend *be, int head_dim)
{
    const sf_cuda *c = sf_cuda_of(be);
    return c->bf16_in_place && (head_dim == 64 || head_dim == 128) ? SF_DTYPE_BF16 : SF_DTYPE_F32;
}

static void cuda_destroy(sf_backend *be)
{
    if (!be->impl) return;
    release(sf_cuda_of(be));
    be->impl = NULL;
}

/* Which core ops take bf16 activations: attention, memory_mix, memory_update and summary read
 * bf16 q/k/v in place on the devices where qkv_type hands them bf16 (bf16_in_place; qkv_type
 * adds the head width). Elsewhere their kernels would take bf16 only through a conversion, so
 * the answer is no and callers pass float32. */
static int cuda_supports_op(sf_backend *be, sf_op op, sf_dtype type)
{
    if (type == SF_DTYPE_F32) return op >= 0 && op < SF_OP_COUNT;
    if (type != SF_DTYPE_BF16) return 0;
    switch (op) {
    case SF_OP_ATTENTION:
    case SF_OP_MEMORY_MIX:
    case SF_OP_MEMORY_UPDATE:
    case SF_OP_SUMMARY: return sf_cuda_of(be)->bf16_in_place;
    default: return 0;
    }
}

/* ext part_type: products that round their operands to bf16 (precision bf16, fp8) hand their
 * head-parallel parts to the all-reduce in bf16 as well; float32 keeps float32 */
static sf_dtype cuda_part_type(sf_backend *be)
{
    return sf_cuda_of(be)->precision == SF_PRECISION_BF16 ? SF_DTYPE_BF16 : SF_DTYPE_F32;
}

static int cuda_device_rows(sf_backend *be) { return sf_cuda_of(be)->settings.device_rows; }

/* ext warmup (setting warmup=1): the kernels the stages' warm-up segment does not launch are
 * loaded here; that segment (stages/block.c) brings the rest, the product plans and cuBLAS's
 * own kernels. */
static int cuda_warmup(sf_backend *be)
{
    sf_cuda *c = sf_cuda_of(be);
    if (!c->settings.warmup) return 0;
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    rc = sf_cuda_elementwise_load();
    sf_cuda_leave(c);
    return rc == SF_OK ? 1 : rc;
}

static const sf_backend_ext cuda_ext = {
    .prepare_weight_group = sf_cuda_prepare_weight_group,
    .reserve = cuda_reserve,
    .qkv_type = cuda_qkv_type,
    .qkv = sf_cuda_qkv,
    .ffn = sf_cuda_ffn,
    .ffn_h1_floats = sf_cuda_ffn_h1_floats,
    .ffn_partial = sf_cuda_ffn_partial,
    .attention_mix = cuda_attention_mix,
    .memory_mix_to = sf_cuda_memory_mix_to,
    .matmul_typed = sf_cuda_matmul_typed,
    .rmsnorm_typed = sf_cuda_rmsnorm_typed,
    .part_type = cuda_part_type,
    .add_typed = sf_cuda_add_typed,
    .normed_type = sf_cuda_normed_type,
    .qkv_from = sf_cuda_qkv_from,
    .ffn_partial_from = sf_cuda_ffn_partial_from,
    .upload_unordered = cuda_upload_unordered,
    .side_begin = cuda_side_begin,
    .side_end = cuda_side_end,
    .side_join = cuda_side_join,
    .side_join_before_product = cuda_side_join_before_product,
    .non_finite_begin = sf_cuda_non_finite_begin,
    .non_finite_end = sf_cuda_non_finite_end,
    .device_rows = cuda_device_rows,
    .warmup = cuda_warmup,
    .download_start = cuda_download_start,
    .download_wait = cuda_download_wait,
};

static const sf_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .sync = cuda_sync,
    .matmul = sf_cuda_matmul,
    .rmsnorm = sf_cuda_rmsnorm,
    .embed = sf_cuda_embed,
    .swiglu = sf_cuda_swiglu,
    .attention = cuda_attention,
    .memory_mix = sf_cuda_memory_mix,
    .memory_update = sf_cuda_memory_update,
    .summary = sf_cuda_summary,
    .destroy = cuda_destroy,
    .supports_op = cuda_supports_op,
    .ext = &cuda_ext,
};

/* Page-locked packet buffers (seqflow/packet.h): outputs come down straight into them. */
static void *pinned_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void pinned_free(void *p)
{
    if (p) cudaFreeHost(p);
}

static const sf_host_allocator pinned_packets = {pinned_alloc, pinned_free};

/* cuBLAS workspace of the side queue: its products (none in the block stage today) must not
 * share the main stream's, and fall back to algorithms that need less when it is too small. */
#define SIDE_BLAS_WORKSPACE_BYTES ((size_t)4 << 20)

/* The side queue's stream, unless side_queue=0 or the per-op profile is on (it times each op
 * alone on the main stream). Stream priorities were tried (side lowest or highest) and were
 * slower than equal ones (bench/RESULTS.md). */
static int create_side_queue(sf_cuda *c)
{
    if (!c->settings.side_queue || c->settings.profile) return SF_OK;
    int rc = sf_cuda_stream_create(c, &c->side, 0, SIDE_BLAS_WORKSPACE_BYTES);
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(&c->side_start, cudaEventDisableTiming), "event");
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventCreateWithFlags(&c->side_done, cudaEventDisableTiming), "event");
    /* until the first side_end, joining must not wait on a never-recorded event: record it now */
    if (rc == SF_OK) rc = sf_cuda_status(cudaEventRecord(c->side_done, c->side.stream), "event");
    return rc;
}

/* Why the runtime found no GPU, in the user's terms. The runtime reports a missing driver as
 * "CUDA driver version is insufficient", which sends a CPU-only user off to upgrade a driver
 * that is not there: whether libcuda.so.1 loads tells the two apart. */
static int no_gpu_error(cudaError_t err)
{
    if (err == cudaErrorInsufficientDriver) {
        void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!driver)
            return sf_error(SF_E_BACKEND, "device 'cuda': no NVIDIA driver is installed (libcuda.so.1 cannot be "
                                          "loaded); use -d cpu");
        dlclose(driver);
        int driver_version = 0, runtime_version = 0;
        cudaDriverGetVersion(&driver_version);
        cudaRuntimeGetVersion(&runtime_version);
        cudaGetLastError();
        return sf_error(SF_E_BACKEND, "device 'cuda': the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d "
                                      "seqflow was built with; update the driver or use -d cpu",
                        driver_version / 1000, driver_version % 1000 / 10, runtime_version / 1000,
                        runtime_version % 1000 / 10);
    }
    if (err == cudaErrorNoDevice)
        return sf_error(SF_E_BACKEND, "device 'cuda': the NVIDIA driver is installed but sees no GPU; use -d cpu");
    return sf_error(SF_E_BACKEND, "device 'cuda': no usable GPU (%s)", cudaGetErrorString(err));
}

extern "C" int sf_cuda_backend_init(sf_backend *be, int device, const char *settings)
{
    sf_cuda_settings parsed;
    int rc = sf_cuda_settings_parse(settings, &parsed);
    if (rc != SF_OK) return rc;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return no_gpu_error(err);
    }
    if (count == 0) return sf_error(SF_E_BACKEND, "device 'cuda': no GPU found; use -d cpu");
    if (device < 0 || device >= count)
        return sf_error(SF_E_BACKEND, "device 'cuda': GPU %d does not exist (%d present)", device, count);
    sf_cuda *c = (sf_cuda *)calloc(1, sizeof *c);
    if (!c) return sf_error(SF_E_NOMEM, "out of memory");
    c->device = device;
    c->info.device = device; /* compute capability unknown (0.0): the portable kernels */
    if (sf_cuda_device_info_get(device, &c->info) != SF_OK) sf_clear_error();
    c->settings = parsed;
    /* fp8 is bf16 everywhere but the products that have FP8 weight copies */
    c->fp8 = be->precision == SF_PRECISION_FP8;
    c->precision = be->precision == SF_PRECISION_BF16 || c->fp8 ? SF_PRECISION_BF16 : SF_PRECISION_F32;
    /* recursive: an op composed of others may hold it while they take it again */
    pthread_mutexattr_t recursive;
    pthread_mutexattr_init(&recursive);
    pthread_mutexattr_settype(&recursive, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->lock, &recursive);
    pthread_mutexattr_destroy(&recursive);
    rc = sf_cuda_status(cudaSetDevice(device), "cudaSetDevice");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamCreateWithFlags(&c->copy_in, cudaStreamNonBlocking), "stream");
    if (rc == SF_OK) rc = sf_cuda_status(cudaStreamCreateWithFlags(&c->copy_out, cudaStreamNonBlocking), "stream");
    for (int i = 0; i < SF_CUDA_STAGING_SLOTS && rc == SF_OK; i++) {
        sf_cuda_staging *slots[2] = {&c->up[i], &c->down[i]};
        for (int j = 0; j < 2 && rc == SF_OK; j++) {
            rc = sf_cuda_status(cudaEventCreateWithFlags(&slots[j]->ready, cudaEventDisableTiming), "event");
            if (rc == SF_OK)
                rc = sf_cuda_status(cudaEventCreateWithFlags(&slots[j]->done, cudaEventDisableTiming), "event");
        }
    }
    if (rc == SF_OK) rc = sf_cublas_status(cublasCreate(&c->blas), "cublasCreate");
    if (rc == SF_OK) rc = sf_cublas_status(cublasSetStream(c->blas, c->stream), "cublasSetStream");
    /* DEFAULT math never rounds float32 products to TF32 (that takes TF32_TENSOR_OP_MATH) */
    if (rc == SF_OK) rc = sf_cublas_status(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    if (rc == SF_OK) rc = sf_cuda_malloc_counted(c, &c->blas_workspace, BLAS_WORKSPACE_BYTES);
    if (rc == SF_OK) {
        c->blas_workspace_bytes = BLAS_WORKSPACE_BYTES;
        rc = sf_cublas_status(cublasSetWorkspace(c->blas, c->blas_workspace, BLAS_WORKSPACE_BYTES),
                              "cublasSetWorkspace");
    }
    if (rc == SF_OK) rc = create_side_queue(c);
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaHostAlloc((void **)&c->finite_flags, SF_CUDA_FINITE_FLAGS * sizeof(int), cudaHostAllocMapped),
                            "page-locked flags");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaHostGetDevicePointer((void **)&c->finite_flags_dev, c->finite_flags, 0), "mapped flags");
    for (int i = 0; i < SF_CUDA_FINITE_FLAGS && rc == SF_OK; i++)
        rc = sf_cuda_status(cudaEventCreateWithFlags(&c->finite_done[i], cudaEventDisableTiming), "event");
    int major = 0, minor = 0;
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "attribute");
    if (rc == SF_OK)
        rc = sf_cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "attribute");
    c->bf16_in_place = c->precision == SF_PRECISION_BF16 && c->settings.qkv_bf16 && major == 9 && minor == 0;
    c->info.major = major, c->info.minor = minor;
    if (rc == SF_OK && c->fp8) rc = sf_cuda_fp8_init(c);
    if (rc != SF_OK) {
        release(c);
        return rc;
    }
    be->ops = &cuda_ops;
    be->impl = c;
    /* pinned_packets=0 keeps packets in pageable memory (downloads then go through the staging
     * copy): for comparing the two in benchmarks */
    if (c->settings.pinned_packets) sf_packet_set_host_allocator(&pinned_packets);
    be->precision = c->fp8 ? SF_PRECISION_FP8 : c->precision;
    /* a profile that cannot start leaves the backend unprofiled, never broken */
    if (c->settings.profile && sf_cuda_profile_attach(be) != SF_OK) sf_clear_error();
    return SF_OK;
}

extern "C" int sf_cuda_backend_memory(const sf_backend *be, sf_cuda_memory *out)
{
    if (!be || !out || strcmp(be->ops->name, "cuda") != 0) return sf_error(SF_E_INVAL, "sf_cuda_backend_memory: not a cuda backend");
    sf_cuda *c = (sf_cuda *)be->impl;
    memset(out, 0, sizeof *out);
    int rc = sf_cuda_enter(c);
    if (rc != SF_OK) return rc;
    out->allocated = c->allocated;
    out->peak = c->peak;
    rc = sf_cuda_status(cudaMemGetInfo(&out->device_free, &out->device_total), "cudaMemGetInfo");
    sf_cuda_leave(c);
    return rc;
}
