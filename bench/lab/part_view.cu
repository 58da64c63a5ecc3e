#include "bench/lab/part_view.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdlib.h>

#include "seqflow/error.h"

#define MAX_VIEW_RANKS 8
#define MAX_VIEW_SLOTS 8

namespace {

struct driver {
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    bool ok;
};

void *entry(const char *name)
{
    void *p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(name, &p, 10020, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
        p = nullptr;
    cudaGetLastError();
    return p;
}

const driver &drv()
{
    static const driver d = [] {
        driver x;
        x.granularity = (PFN_cuMemGetAllocationGranularity_v10020)entry("cuMemGetAllocationGranularity");
        x.create = (PFN_cuMemCreate_v10020)entry("cuMemCreate");
        x.release = (PFN_cuMemRelease_v10020)entry("cuMemRelease");
        x.reserve = (PFN_cuMemAddressReserve_v10020)entry("cuMemAddressReserve");
        x.address_free = (PFN_cuMemAddressFree_v10020)entry("cuMemAddressFree");
        x.map = (PFN_cuMemMap_v10020)entry("cuMemMap");
        x.unmap = (PFN_cuMemUnmap_v10020)entry("cuMemUnmap");
        x.set_access = (PFN_cuMemSetAccess_v10020)entry("cuMemSetAccess");
        x.ok =
            x.granularity && x.create && x.release && x.reserve && x.address_free && x.map && x.unmap && x.set_access;
        return x;
    }();
    return d;
}

CUmemAllocationProp on_device(int device)
{
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

} // namespace

struct sf_cuda_part_views {
    int ranks, slots;
    size_t slice_bytes;
    CUdeviceptr base[MAX_VIEW_SLOTS][MAX_VIEW_RANKS];                                 /* 0: not reserved */
    CUmemGenericAllocationHandle mem[MAX_VIEW_SLOTS][MAX_VIEW_RANKS][MAX_VIEW_RANKS]; /* [slot][writer][owner] */
    bool made[MAX_VIEW_SLOTS][MAX_VIEW_RANKS][MAX_VIEW_RANKS], mapped[MAX_VIEW_SLOTS][MAX_VIEW_RANKS][MAX_VIEW_RANKS];
};

int sf_cuda_part_views_granularity(const int *devices, int ranks, size_t *bytes)
{
    *bytes = 0;
    const driver &d = drv();
    if (!d.ok) return sf_error(SF_E_UNSUPPORTED, "part views: the driver has no virtual memory management");
    if (ranks < 1 || ranks > MAX_VIEW_RANKS) return sf_error(SF_E_INVAL, "part views: %d ranks", ranks);
    size_t most = 0;
    for (int r = 0; r < ranks; r++) {
        for (int p = 0; p < ranks; p++) {
            int can = 0;
            if (p != r && (cudaDeviceCanAccessPeer(&can, devices[p], devices[r]) != cudaSuccess || !can)) {
                cudaGetLastError();
                return sf_error(SF_E_UNSUPPORTED, "part views: GPU %d cannot reach GPU %d", devices[p], devices[r]);
            }
        }
        const CUmemAllocationProp prop = on_device(devices[r]);
        size_t g = 0;
        if (d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
            return sf_error(SF_E_UNSUPPORTED, "part views: no granularity for GPU %d", devices[r]);
        if (g > most) most = g;
    }
    *bytes = most;
    return SF_OK;
}

void sf_cuda_part_views_free(sf_cuda_part_views *v)
{
    if (!v) return;
    const driver &d = drv();
    const size_t span = (size_t)v->ranks * v->slice_bytes;
    for (int s = 0; s < v->slots; s++)
        for (int p = 0; p < v->ranks; p++) {
            for (int r = 0; r < v->ranks; r++) {
                if (v->mapped[s][p][r]) d.unmap(v->base[s][p] + (size_t)r * v->slice_bytes, v->slice_bytes);
                if (v->made[s][p][r]) d.release(v->mem[s][p][r]);
            }
            if (v->base[s][p]) d.address_free(v->base[s][p], span);
        }
    free(v);
}

int sf_cuda_part_views_create(const int *devices, int ranks, int slots, size_t slice_bytes, sf_cuda_part_views **out)
{
    *out = NULL;
    size_t g = 0;
    int rc = sf_cuda_part_views_granularity(devices, ranks, &g);
    if (rc != SF_OK) return rc;
    if (slots < 1 || slots > MAX_VIEW_SLOTS || !slice_bytes || slice_bytes % g)
        return sf_error(SF_E_INVAL, "part views: %d slots of slices of %zu bytes (granularity %zu)", slots, slice_bytes,
                        g);
    /* the driver calls below want a current context: the runtime's of the first device */
    if (cudaSetDevice(devices[0]) != cudaSuccess || cudaFree(0) != cudaSuccess) {
        cudaGetLastError();
        return sf_error(SF_E_UNSUPPORTED, "part views: GPU %d unavailable", devices[0]);
    }
    sf_cuda_part_views *v = (sf_cuda_part_views *)calloc(1, sizeof *v);
    if (!v) return sf_error(SF_E_NOMEM, "part views");
    v->ranks = ranks, v->slots = slots, v->slice_bytes = slice_bytes;
    const driver &d = drv();
    const size_t span = (size_t)ranks * slice_bytes;
    CUmemAccessDesc access[MAX_VIEW_RANKS];
    for (int r = 0; r < ranks; r++) {
        access[r].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access[r].location.id = devices[r];
        access[r].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    const char *what = NULL;
    CUresult e = CUDA_SUCCESS;
    for (int s = 0; s < slots && !what; s++)
        for (int p = 0; p < ranks && !what; p++) {
            if ((e = d.reserve(&v->base[s][p], span, g, 0, 0)) != CUDA_SUCCESS) {
                v->base[s][p] = 0, what = "reserving addresses";
                break;
            }
            for (int r = 0; r < ranks && !what; r++) {
                const CUmemAllocationProp prop = on_device(devices[r]);
                if ((e = d.create(&v->mem[s][p][r], slice_bytes, &prop, 0)) != CUDA_SUCCESS) {
                    what = "allocating";
                    break;
                }
                v->made[s][p][r] = true;
                if ((e = d.map(v->base[s][p] + (size_t)r * slice_bytes, slice_bytes, 0, v->mem[s][p][r], 0)) !=
                    CUDA_SUCCESS) {
                    what = "mapping";
                    break;
                }
                v->mapped[s][p][r] = true;
            }
            if (!what && (e = d.set_access(v->base[s][p], span, access, (size_t)ranks)) != CUDA_SUCCESS)
                what = "granting access";
        }
    if (what) {
        sf_cuda_part_views_free(v);
        return sf_error(e == CUDA_ERROR_OUT_OF_MEMORY ? SF_E_NOMEM : SF_E_UNSUPPORTED,
                        "part views: %s failed (driver error %d)", what, (int)e);
    }
    *out = v;
    return SF_OK;
}

void *sf_cuda_part_view(const sf_cuda_part_views *v, int rank, int slot) { return (void *)v->base[slot][rank]; }

size_t sf_cuda_part_views_slice_bytes(const sf_cuda_part_views *v) { return v->slice_bytes; }
