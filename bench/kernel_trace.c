/* A CUPTI injection library that writes every kernel's device start and end (ns), stream and
 * name to a CSV file, for bench/timeline_summary.py: where a run's wall time goes between
 * kernels, and what ran beside what, with the real clocks and the real concurrency (ncu
 * serializes kernels; Nsight Systems is not on the GPU machine). Memory copies go to the same
 * file, named "[memcpy KIND BYTES]" (KIND HtoD, DtoH, DtoD, PtoP between GPUs, or other), so that the summary can
 * tell how busy the copies between host and device kept the bus. With SEQFLOW_TRACE_API=1 the
 * runtime API calls that took SEQFLOW_TRACE_API_US (20) microseconds or more go there too, as
 * "[api NAME]" with the calling thread in the stream column: which host waits stood beside the
 * device's idle gaps. Used by bench/gpu_timeline.sh:
 *
 *   SEQFLOW_TRACE_OUT=trace.csv CUDA_INJECTION64_PATH=build/bench/libsf_kernel_trace.so prog ...
 *
 * CUDA loads the library and calls InitializeInjection at its own initialization; the records
 * are flushed and written at exit. Tracing costs each launch a little host time. The last
 * column is the device of a kernel or copy (empty for host calls): one process driving several
 * GPUs writes them all to one file, and the summary's --device picks one. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_BUFFER_BYTES (8u << 20)

static FILE *trace_file;
static unsigned long long api_min_ns = 20000;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    while (trace_file && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
            const char *kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                               : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                                : "other";
            fprintf(trace_file, "%llu,%llu,%u,[memcpy %s %llu],%u\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, kind, (unsigned long long)m->bytes, m->deviceId);
            continue;
        }
        if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) { /* between GPUs (head-parallel parts) */
            const CUpti_ActivityMemcpyPtoP4 *m = (const CUpti_ActivityMemcpyPtoP4 *)record;
            fprintf(trace_file, "%llu,%llu,%u,[memcpy PtoP %llu],%u\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes, m->deviceId);
            continue;
        }
        if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)record;
            if (a->end - a->start < api_min_ns) continue;
            const char *name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
            fprintf(trace_file, "%llu,%llu,%u,[api %s],\n", (unsigned long long)a->start, (unsigned long long)a->end,
                    a->threadId, name);
            continue;
        }
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
        fprintf(trace_file, "%llu,%llu,%u,%s,%u\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->streamId, k->name ? k->name : "?", k->deviceId);
    }
    free(buffer);
}

static void flush_at_exit(void)
{
    cuptiActivityFlushAll(1);
    if (trace_file) fclose(trace_file);
    trace_file = NULL;
}

/* the entry point CUDA looks up in an injection library */
int InitializeInjection(void);

int InitializeInjection(void)
{
    const char *path = getenv("SEQFLOW_TRACE_OUT");
    trace_file = fopen(path ? path : "kernel_trace.csv", "w");
    if (!trace_file) return 0;
    fprintf(trace_file, "start,end,stream,name,device\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI would not start\n");
        return 0;
    }
    const char *api = getenv("SEQFLOW_TRACE_API");
    if (api && strcmp(api, "1") == 0) {
        const char *us = getenv("SEQFLOW_TRACE_API_US");
        if (us) api_min_ns = strtoull(us, NULL, 10) * 1000ull;
        if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
            fprintf(stderr, "kernel_trace: CUPTI would not trace the runtime API\n");
    }
    atexit(flush_at_exit);
    return 1;
}
