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

#endif
