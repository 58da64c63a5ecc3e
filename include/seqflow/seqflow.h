/* seqflow: a streaming pipeline framework for unbounded token sequences.
 * Include this one header for the whole public API. */
#ifndef SEQFLOW_SEQFLOW_H
#define SEQFLOW_SEQFLOW_H

#define SEQFLOW_VERSION_MAJOR 0
#define SEQFLOW_VERSION_MINOR 1
#define SEQFLOW_VERSION_PATCH 0
#define SEQFLOW_VERSION_STRING "0.1.0"

#include "seqflow/export.h"
#include "seqflow/error.h"
#include "seqflow/model.h"
#include "seqflow/packet.h"
#include "seqflow/backend.h"
#include "seqflow/stage.h"
#include "seqflow/graph.h"

#endif
