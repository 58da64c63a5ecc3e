/* Head-parallel parts exchanged by the copy engines (comm_exchange.cu): the NCCL communicator's
 * reduce_add where every rank of the communicator is a thread of this process on its own GPU,
 * each pair with peer access (NVLink). Each rank copies its part into every other rank's inbox
 * with cudaMemcpyPeerAsync, beside its compute stream, and each adds all parts to its rows in
 * rank order. The copy engines move the bytes, so the products issued beside an exchange keep
 * every multiprocessor: an NCCL all-reduce runs on some of them. Internal to the CUDA module. */
#ifndef SEQFLOW_KERNELS_CUDA_COMM_EXCHANGE_H
#define SEQFLOW_KERNELS_CUDA_COMM_EXCHANGE_H

#include <stddef.h>
#include <cuda_runtime.h>

#include "kernels/comm.h"

typedef struct sf_exchange sf_exchange;

/* Registers rank `rank` of the communicator with unique id `id` (SF_COMM_NCCL_ID_BYTES) in this
 * process: ranks of one id that are all threads of this process find each other. *out: this
 * rank's handle (released by sf_exchange_leave). */
int sf_exchange_join(const void *id, sf_comm *c, sf_exchange **out);
/* Leaves the group; frees this rank's inboxes and events (its device's work must be done or
 * abandoned). NULL accepted. */
void sf_exchange_leave(sf_exchange *x);
/* Every rank, at set-up (a collective on the host, bounded by the communicator's timeout and
 * watch flag): with allow 1, every rank of the id in this process and every pair of their GPUs
 * with peer access, sets up inboxes for parts of up to `bytes`; *usable says whether the
 * exchange runs (the same answer on every rank), else the caller sums by NCCL. */
int sf_exchange_reserve(sf_exchange *x, size_t bytes, int allow, int *usable);
/* reduce_add_start and reduce_add_end (kernels/comm.h) through the copy engines; `stream` is the
 * backend's compute stream, `side` a stream of the communicator's own, both on this rank's GPU,
 * and the caller holds the backend's lock. */
int sf_exchange_start(sf_exchange *x, cudaStream_t stream, cudaStream_t side, const void *part, size_t bytes,
                      int *ticket);
int sf_exchange_end(sf_exchange *x, cudaStream_t stream, int ticket, float *rows, const void *part, size_t count,
                    int bf16);
/* Split sums (kernels/comm.h, reduce_norm): every rank, after reserve said usable, registers
 * this rank's whole buffer of rows (float32) and of normed rows (bf16), laid out alike on every
 * rank; again when its rows move (the same normed rows), before its next start. start_split
 * copies to each peer its slice (sf_comm_slice) of the part ([rows, dim] bf16); end_split adds
 * the parts' slices to this rank's slice of rows, norms them into normed (norm non-NULL) and,
 * in the same kernel, into every peer's normed rows (peer access), or without a norm copies
 * the slice of rows into rank 0's; rows and normed point at the sum's first row. join_split
 * makes `stream` wait for what the others wrote of that op. Split and whole sums share the op
 * order and slots; split ends are joined in order, each before SF_COMM_COPIES_IN_FLIGHT more
 * starts. */
int sf_exchange_register(sf_exchange *x, float *rows, void *normed);
int sf_exchange_start_split(sf_exchange *x, cudaStream_t stream, cudaStream_t side, const void *part, int rows, int dim,
                            int *ticket);
int sf_exchange_end_split(sf_exchange *x, cudaStream_t stream, int ticket, float *rows, const void *part, int nrows,
                          int dim, const float *norm, float eps, void *normed);
int sf_exchange_join_split(sf_exchange *x, cudaStream_t stream, int ticket);
/* A segment's first rows (kernels/comm.h, first_rows) where the sums are split, each rank after
 * it registered its buffers: rank 0 marks its rows and normed rows made by the ops on `stream`;
 * every other rank copies them into its own buffers (the copy engines), `stream` waiting for
 * the normed rows, its next end_split and start for the rows. own_rows and own_normed: this
 * rank's registered buffers (checked). */
int sf_exchange_first_rows(sf_exchange *x, cudaStream_t stream, int rows, int dim, const float *own_rows,
                           const void *own_normed);
/* Ends every rank's host waits of the group at once (a rank failed). */
void sf_exchange_abort(sf_exchange *x);

#endif
