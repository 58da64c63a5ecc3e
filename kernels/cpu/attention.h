/* Dilated local attention on the CPU, and the count of its useful FLOPs. */
#ifndef SEQFLOW_KERNELS_CPU_ATTENTION_H
#define SEQFLOW_KERNELS_CPU_ATTENTION_H

#include "seqflow/backend.h"

/* 4*d FLOPs for every (query, key) pair actually attended (QK^T and PV, causal masking
 * counted exactly), over all heads, branches and the global tokens. */
double sf_attention_useful_flops(const sf_attention_desc *desc);

#endif
