/* Part views: one contiguous range of addresses whose slices live on different GPUs.
 *
 * The head-parallel ranks' split sums (comm_exchange.cu) send each rank only its slice of every
 * other rank's part. With a view, a rank's product writes its whole part into one range whose
 * slice r is memory of rank r's GPU: the product's own stores carry each slice to the rank that
 * adds it, over the GPUs' link, and no copy follows. The driver's virtual memory management
 * (cuMemCreate, cuMemMap) builds the views; its entry points are looked up once through the
 * runtime, as tensor_map.h does, so nothing links against libcuda itself.
 *
 * A set of views serves `ranks` GPUs and `slots` parts in flight a rank: view (p, s) is rank p's
 * part of slot s, `ranks` x slice_bytes long, its slice r on devices[r]. Every device may read
 * and write every view. slice_bytes must be a multiple of the granularity of every device
 * (sf_cuda_part_views_granularity: 2 MiB on an H100).
 *
 * Lab only: bench_cuda_part_view measured a product writing through a view slower, in
 * multiprocessor time, than the product here plus the copy (bench/lab/README.md). */
#ifndef SEQFLOW_BENCH_LAB_PART_VIEW_H
#define SEQFLOW_BENCH_LAB_PART_VIEW_H

#include <stddef.h>

typedef struct sf_cuda_part_views sf_cuda_part_views;

/* The largest of the devices' minimum granularities for such memory, in *bytes. Returns SF_OK,
 * or SF_E_UNSUPPORTED when the driver offers no virtual memory management or a device does not
 * take part (no peer access between two of them). */
int sf_cuda_part_views_granularity(const int *devices, int ranks, size_t *bytes);

/* Creates the views (ownership: the caller's, freed by sf_cuda_part_views_free). Returns SF_OK,
 * SF_E_INVAL (slice_bytes not a multiple of the granularity, ranks or slots out of range),
 * SF_E_UNSUPPORTED (no virtual memory management) or SF_E_NOMEM. */
int sf_cuda_part_views_create(const int *devices, int ranks, int slots, size_t slice_bytes, sf_cuda_part_views **out);

/* Frees the views and their memory (NULL: nothing). The devices must be done with them. */
void sf_cuda_part_views_free(sf_cuda_part_views *v);

/* The start of view (rank, slot); its slice r begins slice_bytes x r further. */
void *sf_cuda_part_view(const sf_cuda_part_views *v, int rank, int slot);

/* The bytes of a slice. */
size_t sf_cuda_part_views_slice_bytes(const sf_cuda_part_views *v);

#endif
