/* The built-in stage classes (see `seqflow stages`). */
#ifndef SEQFLOW_STAGES_STAGES_H
#define SEQFLOW_STAGES_STAGES_H

#include <stddef.h>
#include <stdint.h>

#include "seqflow/stage.h"

extern const sf_stage_class sf_source_stage;
extern const sf_stage_class sf_segment_stage;
extern const sf_stage_class sf_embed_stage;
extern const sf_stage_class sf_block_stage;
extern const sf_stage_class sf_norm_stage;
extern const sf_stage_class sf_sink_stage;

/* Removes the temporary output (FILE.partial-PID) of every sink that has not finished, for a
 * program that leaves at once on a signal instead of waiting for its stages. Async-signal-safe
 * (atomics and unlink only); the sinks' own cleanup then finds nothing to remove. Checkpointed
 * partial outputs (FILE.partial) are kept: a resume continues them. */
void sf_sink_discard_partials(void);

/* The .npy header the sink writes (format 1.0, padded to SF_NPY_HEADER_BYTES): rows x width
 * little-endian float32 (elem_bytes 4) or uint16 (2, bf16 bit patterns), C order. For writers
 * that place rows themselves (sequence parallelism) and must give the sink's very bytes. */
#define SF_NPY_HEADER_BYTES 128
void sf_npy_header(char out[SF_NPY_HEADER_BYTES], uint64_t rows, size_t width, int elem_bytes);

#endif
