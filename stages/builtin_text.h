#ifndef SEQFLOW_STAGES_BUILTIN_TEXT_H
#define SEQFLOW_STAGES_BUILTIN_TEXT_H
#include <stddef.h>
/* The built-in sample input (static storage). */
const char *sf_builtin_text(void);
size_t sf_builtin_text_length(void);
#endif
