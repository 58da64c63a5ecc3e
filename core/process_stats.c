#include "core/process_stats.h"

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

size_t sf_resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages_total = 0, pages_resident = 0;
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &pages_total, &pages_resident) != 2) pages_resident = 0;
    fclose(f);
    return (size_t)pages_resident * (size_t)sysconf(_SC_PAGESIZE);
}

size_t sf_peak_resident_bytes(void)
{
    struct rusage usage;
    if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
    return (size_t)usage.ru_maxrss * 1024; /* Linux reports KiB */
}

double sf_monotonic_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
