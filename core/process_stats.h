/* What a long run reports about itself: the process's resident memory and a monotonic clock.
 * Shared by the binary's progress line, the benchmarks and the memory tests. */
#ifndef SEQFLOW_PIPELINE_PROCESS_STATS_H
#define SEQFLOW_PIPELINE_PROCESS_STATS_H

#include <stddef.h>

/* Resident set size in bytes (Linux /proc/self/statm); 0 when unavailable. */
size_t sf_resident_bytes(void);
/* The largest resident set size the process has had, in bytes; 0 when unavailable. */
size_t sf_peak_resident_bytes(void);
/* Seconds on a monotonic clock. */
double sf_monotonic_seconds(void);

#endif
