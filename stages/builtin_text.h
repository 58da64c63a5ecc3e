#ifndef SEQFLOW_STAGES_BUILTIN_TEXT_H
#define SEQFLOW_STAGES_BUILTIN_TEXT_H
/* The built-in sample input: declared in the public seqflow/model.h (sf_builtin_text,
 * sf_builtin_text_length), so that bindings can train and test on the same text. */
#include "seqflow/model.h"
#endif
