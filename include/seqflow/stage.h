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

#include "seqflow/export.h"

#ifdef __cplusplus
extern "C" {
#endif
SF_API_BEGIN

typedef struct sf_stage sf_stage;

typedef enum sf_option_type {
    SF_OPT_INT = 1,
    SF_OPT_FLOAT = 2,
    SF_OPT_BOOL = 3,
    SF_OPT_STRING = 4
} sf_option_type;

/* One row of a class's option table (as FFmpeg's AVOption): everything about an option lives
 * here, and the graph checks every value against it when the pipeline is parsed (the values
 * given and the defaults, so that a broken table fails there too), so init() reads options
 * without repeating a default or a range check; only checks that relate options to each other
 * or to the model stay in init(). Write rows with designated initializers
 * ({.name = "chunk", .type = SF_OPT_INT, .default_value = "65536", .min = 1, .max = 1 << 26,
 * .unit = "bytes", .help = "..."}) and end the table with {0}. help stays fourth so that older
 * rows written as {name, type, default, help} keep their meaning: no range, any text. */
typedef struct sf_option {
    const char *name;
    sf_option_type type;
    const char *default_value; /* NULL: no default (the option is then unset) */
    const char *help;          /* one line: what the option does */
    /* SF_OPT_INT, SF_OPT_FLOAT: inclusive range of accepted values, either end may be
     * -INFINITY / INFINITY; min == max (e.g. both left 0): any value. */
    double min, max;
    /* SF_OPT_STRING: the accepted values separated by '|' ("f32|bf16"), compared exactly;
     * NULL: any text. */
    const char *choices;
    /* What a number counts ("tokens", "bytes"), shown with the range; NULL: a plain number. */
    const char *unit;
    /* An environment variable whose value, when set and not empty, replaces default_value: read
     * when the stage is created and checked as a given value would be (a bad one fails the
     * parse, naming the variable). A value given in the pipeline always wins. NULL: none. */
    const char *env;
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
    /* Non-zero: the stage ends the pipeline, consuming its input and emitting nothing (the
     * sink). Anywhere but last it would swallow what the later stages wait for, so the graph
     * refuses that (sf_graph_parse, sf_graph_run). */
    int terminal;
} sf_stage_class;

/* Options, as given in the pipeline, else the table's default. Values were checked against the
 * option's row (type, range, choices) when the graph was built, so the typed readers below
 * cannot fail: they return the value, or 0 for an option that is neither given nor defaulted
 * (and for a name the table lacks, or of another type). The returned string lives as long as
 * the stage. */
const char *sf_stage_option(const sf_stage *st, const char *name); /* NULL when unset */
long long sf_stage_option_int(const sf_stage *st, const char *name);
double sf_stage_option_float(const sf_stage *st, const char *name);
int sf_stage_option_bool(const sf_stage *st, const char *name);
/* Non-zero when the pipeline gave the option (rather than the table's default applying): for a
 * default that comes from elsewhere, e.g. the environment, which an explicit value overrides. */
int sf_stage_option_given(const sf_stage *st, const char *name);
/* Writes what the option accepts into buf (size bytes, terminated when size > 0, cut to fit):
 * "MIN..MAX UNIT", ">= MIN UNIT" or "<= MAX UNIT" for a ranged number, "A|B|C" for a choice,
 * else the unit alone or "". What `seqflow stages` and error messages show. Returns buf. */
const char *sf_option_format_range(const sf_option *opt, char *buf, size_t size);

/* The stage's private state pointer (set in init, freed by the class's free). */
void *sf_stage_priv(const sf_stage *st);
void sf_stage_set_priv(sf_stage *st, void *priv);

/* What the graph gives every stage. */
const sf_model *sf_stage_model(const sf_stage *st);
sf_backend *sf_stage_backend(const sf_stage *st);
const char *sf_stage_name(const sf_stage *st);
/* Non-zero once the graph was interrupted: sources stop reading and end their stream. */
int sf_stage_interrupted(const sf_stage *st);
/* Non-zero for the last stage of a graph whose caller takes its outputs' rows still on the
 * device or on their way (a packet's `dev`, with a copy begun by sf_packet_to_host_start or
 * not; the caller brings them over with sf_packet_to_host, on any thread): such a stage may
 * leave them so. Experimental: `seqflow serve` asks for it. */
int sf_stage_outputs_on_device(const sf_stage *st);

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

SF_API_END
#ifdef __cplusplus
}
#endif
#endif
