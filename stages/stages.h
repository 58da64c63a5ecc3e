/* The built-in stage classes (see `seqflow stages`). */
#ifndef SEQFLOW_STAGES_STAGES_H
#define SEQFLOW_STAGES_STAGES_H

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

#endif
