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

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef struct sf_graph sf_graph;

typedef struct sf_graph_options {
    const char *device;     /* backend name, default "cpu" */
    int device_index;       /* GPU ordinal */
    int queue_depth;        /* packets per link, default 4 */
    int threads;            /* CPU compute threads, 0 = all cores */
    sf_precision precision; /* AUTO (0): bf16 on a GPU, f32 on the CPU; see backend.h */
    /* The backend's own settings, "key=value,key=value" (NULL or "": defaults), passed to
     * sf_backend_create_opts; borrowed, read only by sf_graph_create. */
    const char *backend_settings;
} sf_graph_options;

/* Creates an empty graph. model may be NULL for graphs whose stages need none. opts may be
 * NULL for the defaults. The caller owns *out (sf_graph_free). */
int sf_graph_create(const sf_model *model, const sf_graph_options *opts, sf_graph **out);
void sf_graph_free(sf_graph *g);

/* Limits of one graph: stages, and bytes of pipeline text for sf_graph_parse. Far above any
 * real pipeline; they keep a runaway generated one from allocating stage after stage. */
#define SF_GRAPH_MAX_STAGES 256
#define SF_GRAPH_MAX_PIPELINE_BYTES 65536

/* Appends one stage. options is "key=value key=value" (may be NULL). On success *out (when
 * out is non-NULL) is the graph-owned instance. Fails with SF_E_STAGE / SF_E_OPTION, or
 * SF_E_INVAL when the graph already has SF_GRAPH_MAX_STAGES stages. */
int sf_graph_add(sf_graph *g, const char *stage, const char *options, sf_stage **out);
int sf_graph_add_class(sf_graph *g, const sf_stage_class *cls, const char *options,
                       sf_stage **out);

/* Appends the stages of a textual pipeline, e.g.
 *   "source path=in.txt format=text ! segment ! embed ! block ! norm ! sink out=h.npy"
 * Errors name the offending stage or option (SF_E_PARSE, SF_E_STAGE, SF_E_OPTION), and are
 * found before any stage is added when the text is empty, longer than
 * SF_GRAPH_MAX_PIPELINE_BYTES or has more than SF_GRAPH_MAX_STAGES stages. Once the stages are
 * added, a source anywhere but first or a stage that ends the pipeline (stage.h, terminal: the
 * sink) anywhere but last is SF_E_PARSE naming its position (1 = the first stage of the text);
 * the stages stay in the graph. */
int sf_graph_parse(sf_graph *g, const char *pipeline);

/* Sets the graph up for push mode now instead of at the first sf_graph_push: every stage's
 * init runs here (a block uploads and converts its weights, reserves its scratch; on the CUDA
 * backend with the setting warmup=1 it also runs one made-up segment, so that the first real
 * segment finds its kernels loaded, its product plans chosen and its buffers allocated).
 * Optional: a graph that is not prepared does this at its first push, and that push pays for
 * it. Returns SF_OK (also when already prepared), the first stage's init error, or SF_E_INVAL
 * for a graph that sf_graph_run started (threads set themselves up). */
int sf_graph_prepare(sf_graph *g);

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

/* Checkpoint/resume for threaded runs (docs/FORMATS.md, "Checkpoints": what a checkpoint
 * holds). Every `every` tokens the source injects a marker; each stage adds its state as the
 * marker passes (so the states are consistent along the chain) and the last stage writes the
 * checkpoint atomically
 * into dir (temp file, fsync, rename, fsync of dir), keeping the newest `keep`.
 * With resume, sf_graph_run first loads the newest valid checkpoint of dir (each damaged one is
 * reported through `report` and skipped; all damaged is an error) and restores every stage from
 * it; when dir holds none the run starts from the beginning. Without resume, checkpoints left in
 * dir are deleted when the run starts. A resume is refused (SF_E_STATE, naming the first
 * difference) when the model (configuration or weights), backend, pipeline, stage options or the
 * input consumed so far differ from the run that wrote the checkpoint. dir is locked for one
 * run at a time (a second fails at once naming the holder's PID) until sf_graph_free. */
typedef struct sf_graph_checkpoint_options {
    const char *dir;       /* created when missing; copied */
    uint64_t every;        /* tokens between checkpoints (> 0) */
    int keep;              /* checkpoints kept (0 = 3) */
    int resume;            /* continue from the newest valid checkpoint */
    int codec;             /* checkpoint frames: 0 raw, 1 LZ4, 2 zstd (compress/frame.h sf_codec) */
    /* One line per event worth telling (a damaged checkpoint, starting fresh); NULL prints
     * "seqflow: LINE" on stderr. Called from the thread of sf_graph_run. */
    void (*report)(void *user, const char *line);
    void *user;
} sf_graph_checkpoint_options;

/* Before sf_graph_run. The graph keeps a copy of opts (and of dir). */
int sf_graph_set_checkpoint(sf_graph *g, const sf_graph_checkpoint_options *opts);
/* Sequence number of the checkpoint the run resumed from (0: started fresh) and of the last
 * one written (0: none). */
uint64_t sf_graph_checkpoint_resumed(const sf_graph *g);
uint64_t sf_graph_checkpoint_written(const sf_graph *g);
/* Non-zero after sf_graph_run found that the checkpoint to resume from was written after the
 * end of the input: the run had finished. sf_graph_run reports that, restores the stages and
 * runs them on no input (a sink puts its output in place again). */
int sf_graph_checkpoint_finished(const sf_graph *g);

/* Tokens that left the last stage so far (for progress reports); thread-safe. */
uint64_t sf_graph_tokens_out(const sf_graph *g);

/* What stage i did in sf_graph_run (threaded): the packets it processed and the seconds its
 * thread spent in them (process and flush, its waits on its links excluded), so the busiest
 * stage, the pipeline's bottleneck, is the one closest to the run's wall time. Zero for a stage
 * of another process. Read after sf_graph_run returns. SF_E_INVAL for a bad index. */
typedef struct sf_stage_stats {
    uint64_t packets;
    double busy_seconds;
} sf_stage_stats;
int sf_graph_stage_stats(const sf_graph *g, int i, sf_stage_stats *out);

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
