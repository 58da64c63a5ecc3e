/* A bounded pool of device buffers for the rows of hidden-state packets (packet.h, dev), so
 * that on a GPU graph activations stay on the device from embed to the final norm. The
 * buffers are allocated once when the pool is made: nothing is allocated per segment and
 * device memory stays flat. When every buffer is lent the caller keeps the host path.
 *
 * Ownership: the creator holds one reference and every lent buffer one more; the pool and its
 * buffers are freed when the last goes (a packet may be freed after the stage that made it,
 * e.g. from a link queue, but always before the graph frees its backend). */
#ifndef SEQFLOW_STAGES_DEVICE_ROWS_H
#define SEQFLOW_STAGES_DEVICE_ROWS_H

#include "seqflow/backend.h"
#include "seqflow/packet.h"

typedef struct sf_device_rows sf_device_rows;

/* count buffers of `floats` floats each on be. SF_E_NOMEM when the device has no room. */
int sf_device_rows_create(sf_backend *be, int count, size_t floats, sf_device_rows **out);
/* Drops the creator's reference (NULL accepted). */
void sf_device_rows_free(sf_device_rows *pool);

/* Lends a buffer to p (sets p->dev, dev_ops, dev_pool): 1, or 0 when none is free. */
int sf_device_rows_lend(sf_device_rows *pool, sf_packet *p);

#endif
