/* Graphs: a chain of stage instances joined by links (bounded queues by default).
 *
 * Two ways to drive a graph:
 *  - sf_graph_run(): every stage runs on its own thread; links are bounded queues with
 *    blocking back-pressure. The chain starts with a source stage and normally ends with a sink.
 *  - sf_graph_push() / sf_graph_pull(): the caller feeds token chunks into a graph without a
 *    source and pulls the packets that leave its last stage; stages run on the caller's thread.
 *
 * Ownership: a graph borrows its model (which must outlive it) and owns its stages,
 * backend and queues. */
#ifndef SEQFLOW_GRAPH_H
#define SEQFLOW_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include "seqflow/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_graph sf_graph;

typedef struct sf_graph_options {
    const char *device;     /* backend name, default "cpu" */
    int device_index;       /* GPU ordinal */
    int queue_depth;        /* packets per link, default 4 */
    int threads;            /* CPU compute threads, 0 = all cores */
} sf_graph_options;

/* Creates an empty graph. model may be NULL for graphs whose stages need none. opts may be
 * NULL for the defaults. The caller owns *out (sf_graph_free). */
int sf_graph_create(const sf_model *model, const sf_graph_options *opts, sf_graph **out);
void sf_graph_free(sf_graph *g);

/* Appends one stage. options is "key=value key=value" (may be NULL). On success *out (when
 * out is non-NULL) is the graph-owned instance. Fails with SF_E_STAGE / SF_E_OPTION. */
int sf_graph_add(sf_graph *g, const char *stage, const char *options, sf_stage **out);
int sf_graph_add_class(sf_graph *g, const sf_stage_class *cls, const char *options,
                       sf_stage **out);

/* Appends the stages of a textual pipeline, e.g.
 *   "source path=in.txt format=text ! segment ! embed ! block ! norm ! sink out=h.npy"
 * Errors name the offending stage or option (SF_E_PARSE, SF_E_STAGE, SF_E_OPTION). */
int sf_graph_parse(sf_graph *g, const char *pipeline);

/* Number of stages and the i-th stage. */
int sf_graph_size(const sf_graph *g);
sf_stage *sf_graph_stage(const sf_graph *g, int i);

/* Runs the graph on threads until every stage has finished. Returns SF_OK, the first error
 * of any stage, or SF_E_INTERRUPTED after sf_graph_interrupt (the pipeline still flushed). */
int sf_graph_run(sf_graph *g);

/* Asks a running graph to stop reading input, flush and finish. Async-signal-safe. */
void sf_graph_interrupt(sf_graph *g);

/* The message of the first failure (or "" when none). Valid until the graph is freed. */
const char *sf_graph_error(const sf_graph *g);

/* Push mode (graph without a source). Tokens are copied. */
int sf_graph_push(sf_graph *g, uint64_t stream, const uint32_t *tokens, size_t n);
/* Emits the stream's pending partial segment provisionally (state is not committed). */
int sf_graph_flush(sf_graph *g, uint64_t stream);
/* Ends the stream: its partial segment is completed and committed. */
int sf_graph_end(sf_graph *g, uint64_t stream);
/* Takes the oldest packet that left the last stage, or NULL when none is waiting.
 * The caller owns the packet (sf_packet_free). */
sf_packet *sf_graph_pull(sf_graph *g);

/* State of every stateful stage, as one blob (for checkpoints); and back. restore must be
 * called on a graph built from the same pipeline and model. */
int sf_graph_save(sf_graph *g, sf_buffer *out);
int sf_graph_restore(sf_graph *g, const uint8_t *data, size_t len);

/* Tokens that left the last stage so far (for progress reports); thread-safe. */
uint64_t sf_graph_tokens_out(const sf_graph *g);

#ifdef __cplusplus
}
#endif
#endif
