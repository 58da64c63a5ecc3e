#include "seqflow/buffer.h"
#include "seqflow/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int sf_buffer_append(sf_buffer *b, const void *data, size_t len)
{
    if (len > SIZE_MAX - b->len) return sf_error(SF_E_NOMEM, "buffer too large");
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len) cap = cap > SIZE_MAX / 2 ? b->len + len : cap * 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) return sf_error(SF_E_NOMEM, "out of memory");
        b->data = d;
        b->cap = cap;
    }
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    return SF_OK;
}

void sf_buffer_release(sf_buffer *b)
{
    if (!b) return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
