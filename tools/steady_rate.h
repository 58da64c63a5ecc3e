/* The steady output rate of a run, for --stats-json: a thread samples the graph's output count
 * and the clock while the graph runs, and the rate is taken between the moments the output
 * reached a quarter and three quarters of its final count, so neither the start-up (model
 * loading, first-use costs, the pipeline filling) nor the drain at the end weighs in: what a
 * long stream would see. */
#ifndef SEQFLOW_TOOLS_STEADY_RATE_H
#define SEQFLOW_TOOLS_STEADY_RATE_H

#include "seqflow/graph.h"

typedef struct steady_rate steady_rate;

/* Starts sampling g (which must outlive steady_rate_stop). NULL when the thread could not
 * start: steady_rate_stop(NULL) then reports 0. */
steady_rate *steady_rate_start(const sf_graph *g);

/* Stops and frees the sampler (NULL: nothing) and returns the tokens a second between a quarter
 * and three quarters of the output, or 0 when the output grew in fewer than two steps there (a
 * run of a few packets). */
double steady_rate_stop(steady_rate *s);

#endif
