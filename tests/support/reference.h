/* A plain float64 implementation of SPEC.md, written for clarity, not speed: dense loops with
 * explicit masks. Tests compare every backend and layout against it. */
#ifndef SEQFLOW_TEST_REFERENCE_H
#define SEQFLOW_TEST_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/model.h"

typedef struct ref_state ref_state; /* one stream: M, z per layer and head; global FIFOs */

ref_state *ref_state_new(const sf_model *m);
void ref_state_free(ref_state *s);

/* One segment of n tokens (n <= N) through embedding, every block and the final norm; out is
 * [n, D]. commit advances memory and global tokens (a completed segment or the stream's end);
 * commit = 0 is a flush. Returns 0. */
int ref_segment(const sf_model *m, ref_state *s, const uint32_t *tokens, int n, int commit, double *out);

/* A whole stream cut into segments of N, the last one partial and committed; out [n, D]. */
int ref_stream(const sf_model *m, const uint32_t *tokens, size_t n_tokens, double *out);

#endif
