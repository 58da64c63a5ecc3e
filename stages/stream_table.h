/* Per-stream state of a stage: independent streams never share state (SPEC 1), so every
 * stateful stage keeps one entry per open stream, created on its first packet and dropped
 * when the stream ends. The number of open streams is bounded. */
#ifndef SEQFLOW_STAGES_STREAM_TABLE_H
#define SEQFLOW_STAGES_STREAM_TABLE_H

#include <stdint.h>

typedef struct sf_stream_table {
    uint64_t *ids;
    void **states;
    int count, max;
    void *(*create)(void *ctx, uint64_t stream);
    void (*destroy)(void *ctx, void *state);
    void *ctx;
} sf_stream_table;

void sf_stream_table_init(sf_stream_table *t, int max, void *(*create)(void *, uint64_t),
                          void (*destroy)(void *, void *), void *ctx);
/* The stream's state, created when absent. NULL with sf_last_error set when the table is
 * full or creation failed. */
void *sf_stream_table_get(sf_stream_table *t, uint64_t stream);
/* The stream's state or NULL, without creating it. */
void *sf_stream_table_find(const sf_stream_table *t, uint64_t stream);
void sf_stream_table_remove(sf_stream_table *t, uint64_t stream);
void sf_stream_table_clear(sf_stream_table *t);

#endif
