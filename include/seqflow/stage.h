/* Stages. A stage class is a static const struct (like an AVFilter or a GstElementFactory):
 * a name, an option table and callbacks. The graph creates one instance (sf_stage) per use of
 * the class and calls the callbacks from one thread at a time for that instance.
 *
 * Ownership: process() takes ownership of its input packet and must either emit it on or free
 * it; sf_stage_emit() takes ownership of the packet it is given, also on failure. */
#ifndef SEQFLOW_STAGE_H
#define SEQFLOW_STAGE_H

#include <stddef.h>
#include <stdint.h>
#include "seqflow/buffer.h"
#include "seqflow/error.h"
#include "seqflow/model.h"
#include "seqflow/packet.h"
#include "seqflow/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_stage sf_stage;

typedef enum sf_option_type {
    SF_OPT_INT = 1,
    SF_OPT_FLOAT = 2,
    SF_OPT_BOOL = 3,
    SF_OPT_STRING = 4
} sf_option_type;

typedef struct sf_option {
    const char *name;
    sf_option_type type;
    const char *default_value; /* NULL: no default (the option is then unset) */
    const char *help;
} sf_option;


typedef struct sf_stage_class {
    const char *name;
    const char *help;           /* one line */
    const sf_option *options;   /* terminated by an entry with name == NULL; may be NULL */
    /* Sources have generate and no process: it is called until it returns 0 (done) or < 0.
     * Each call should emit a bounded amount of data. */
    int (*init)(sf_stage *st);
    int (*process)(sf_stage *st, sf_packet *in);
    int (*generate)(sf_stage *st);
    /* End of all input: emit anything held back. May be NULL. */
    int (*flush)(sf_stage *st);
    /* Serialize / restore the stage's complete state (every stream). May be NULL when the
     * stage holds no state. restore is called after init. */
    int (*save)(sf_stage *st, sf_buffer *out);
    int (*restore)(sf_stage *st, const uint8_t *data, size_t len);
    /* Called once for every instance whose init was called, also when init failed: it must
     * release whatever init managed to set up (priv may be NULL). May be NULL. */
    void (*free)(sf_stage *st);
    /* Non-zero: process() also takes packets whose rows live on the graph's backend (packet.h,
     * dev). Other stages are handed host packets: the graph downloads the rows first. */
    int device_rows;
    /* No input is waiting: emit what is held back only to overlap its work with the next
     * packet's (e.g. device work still in flight), so that a slow or interactive input never
     * waits for the next one. Called in threaded runs before the stage blocks for input, and
     * in push mode after each push has gone through the graph. May be NULL. */
    int (*idle)(sf_stage *st);
} sf_stage_class;

/* Options, as given in the pipeline (or the class default). Values are validated against the
 * option type when the graph is built. The returned string lives as long as the stage. */
const char *sf_stage_option(const sf_stage *st, const char *name); /* NULL when unset */
long long sf_stage_option_int(const sf_stage *st, const char *name, long long fallback);
double sf_stage_option_float(const sf_stage *st, const char *name, double fallback);
int sf_stage_option_bool(const sf_stage *st, const char *name, int fallback);

/* The stage's private state pointer (set in init, freed by the class's free). */
void *sf_stage_priv(const sf_stage *st);
void sf_stage_set_priv(sf_stage *st, void *priv);

/* What the graph gives every stage. */
const sf_model *sf_stage_model(const sf_stage *st);
sf_backend *sf_stage_backend(const sf_stage *st);
const char *sf_stage_name(const sf_stage *st);
/* Non-zero once the graph was interrupted: sources stop reading and end their stream. */
int sf_stage_interrupted(const sf_stage *st);

/* Checkpoints (sf_graph_set_checkpoint). Tokens between checkpoints, 0 when they are off. */
uint64_t sf_stage_checkpoint_every(const sf_stage *st);
/* Non-zero when the graph resumes from a checkpoint: restore() follows init(), so init must not
 * discard what the checkpoint refers to (e.g. a sink's partial output). */
int sf_stage_resuming(const sf_stage *st);
/* Sources: injects a checkpoint marker after what was emitted so far. The source's own save()
 * goes into it first; every later stage adds its state as the marker passes, and the graph
 * writes the checkpoint when it leaves the last stage. Threaded runs only. */
int sf_stage_emit_checkpoint(sf_stage *st);
/* The same, after the stage's FINAL packet: the checkpoint records a finished run, and a later
 * resume from it says so instead of running. */
int sf_stage_emit_final_checkpoint(sf_stage *st);

/* Hands a packet downstream. Blocks while the downstream queue is full (back-pressure).
 * Returns SF_E_CLOSED when the graph is shutting down. Takes ownership of p in every case. */
int sf_stage_emit(sf_stage *st, sf_packet *p);

/* Adds a class to the registry used by the textual pipeline form (built-ins are always
 * there). The class must outlive every graph that uses it. SF_E_INVAL on a duplicate name. */
int sf_register_stage(const sf_stage_class *cls);
/* Looks a class up by name; NULL when unknown. */
const sf_stage_class *sf_find_stage(const char *name);
/* Calls fn for every registered class, built-ins first. */
void sf_foreach_stage(void (*fn)(const sf_stage_class *cls, void *user), void *user);

#ifdef __cplusplus
}
#endif
#endif
