#include "pipeline/graph_internal.h"
#include "stages/stages.h"

const sf_stage_class *const sf_builtin_stages[] = {
    &sf_source_stage, &sf_segment_stage, &sf_embed_stage, &sf_block_stage,
    &sf_norm_stage,   &sf_sink_stage,    NULL};
