#include "stages/stream_table.h"

#include <stdlib.h>

#include "seqflow/error.h"

void sf_stream_table_init(sf_stream_table *t, int max, void *(*create)(void *, uint64_t),
                          void (*destroy)(void *, void *), void *ctx)
{
    t->ids = NULL;
    t->states = NULL;
    t->count = 0;
    t->max = max;
    t->create = create;
    t->destroy = destroy;
    t->ctx = ctx;
}

static int index_of(const sf_stream_table *t, uint64_t stream)
{
    for (int i = 0; i < t->count; i++)
        if (t->ids[i] == stream) return i;
    return -1;
}

void *sf_stream_table_find(const sf_stream_table *t, uint64_t stream)
{
    int i = index_of(t, stream);
    return i < 0 ? NULL : t->states[i];
}

void *sf_stream_table_get(sf_stream_table *t, uint64_t stream)
{
    int i = index_of(t, stream);
    if (i >= 0) return t->states[i];
    if (t->count == t->max) {
        sf_error(SF_E_NOMEM, "more than %d streams open at once (raise max_streams)", t->max);
        return NULL;
    }
    if (!t->ids) {
        t->ids = calloc((size_t)t->max, sizeof *t->ids);
        t->states = calloc((size_t)t->max, sizeof *t->states);
        if (!t->ids || !t->states) {
            sf_error(SF_E_NOMEM, "out of memory");
            return NULL;
        }
    }
    void *state = t->create(t->ctx, stream);
    if (!state) return NULL;
    t->ids[t->count] = stream;
    t->states[t->count] = state;
    t->count++;
    return state;
}

void sf_stream_table_remove(sf_stream_table *t, uint64_t stream)
{
    int i = index_of(t, stream);
    if (i < 0) return;
    t->destroy(t->ctx, t->states[i]);
    t->count--;
    t->ids[i] = t->ids[t->count];
    t->states[i] = t->states[t->count];
}

void sf_stream_table_clear(sf_stream_table *t)
{
    for (int i = 0; i < t->count; i++) t->destroy(t->ctx, t->states[i]);
    free(t->ids);
    free(t->states);
    t->ids = NULL;
    t->states = NULL;
    t->count = 0;
}
