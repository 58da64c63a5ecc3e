#include "seqflow/packet.h"
#include "seqflow/error.h"

#include <stdlib.h>
#include <string.h>

sf_packet *sf_packet_new(sf_packet_kind kind, size_t cap_tokens, size_t cap_x)
{
    sf_packet *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    if (sf_packet_reserve(p, cap_tokens, cap_x) != SF_OK) {
        sf_packet_free(p);
        return NULL;
    }
    return p;
}

int sf_packet_reserve(sf_packet *p, size_t cap_tokens, size_t cap_x)
{
    if (cap_tokens > p->cap_tokens) {
        if (cap_tokens > SIZE_MAX / sizeof(uint32_t)) return sf_error(SF_E_NOMEM, "packet too large");
        uint32_t *t = realloc(p->tokens, cap_tokens * sizeof *t);
        if (!t) return sf_error(SF_E_NOMEM, "out of memory for %zu tokens", cap_tokens);
        p->tokens = t;
        p->cap_tokens = cap_tokens;
    }
    if (cap_x > p->cap_x) {
        if (cap_x > SIZE_MAX / sizeof(float)) return sf_error(SF_E_NOMEM, "packet too large");
        float *x = realloc(p->x, cap_x * sizeof *x);
        if (!x) return sf_error(SF_E_NOMEM, "out of memory for %zu activations", cap_x);
        p->x = x;
        p->cap_x = cap_x;
    }
    return SF_OK;
}

void sf_packet_free(sf_packet *p)
{
    if (!p) return;
    free(p->tokens);
    free(p->x);
    free(p->state);
    free(p);
}
