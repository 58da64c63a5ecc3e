/* A growable byte buffer, what stages save their state into (sf_stage_class.save) and frames
 * are written to. The buffer owns data; sf_buffer_release frees it (NULL accepted). */
#ifndef SEQFLOW_BUFFER_H
#define SEQFLOW_BUFFER_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef struct sf_buffer {
    uint8_t *data;
    size_t len, cap;
} sf_buffer;

/* Appends len bytes (data may be NULL when len is 0); SF_E_NOMEM leaves the buffer as it was. */
int sf_buffer_append(sf_buffer *b, const void *data, size_t len);
/* Frees data and zeroes the struct. */
void sf_buffer_release(sf_buffer *b);

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
