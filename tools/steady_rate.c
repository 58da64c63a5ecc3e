#include "tools/steady_rate.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "core/process_stats.h"

#define SAMPLES 4096 /* kept; when full, every other one goes and the interval doubles */

typedef struct sample {
    double t;
    uint64_t tokens;
} sample;

struct steady_rate {
    const sf_graph *graph;
    pthread_t thread;
    int stop; /* atomic */
    int n;
    long interval_us;
    sample s[SAMPLES];
};

static void take(steady_rate *r)
{
    if (r->n == SAMPLES) {
        for (int i = 0; i < SAMPLES / 2; i++) r->s[i] = r->s[2 * i];
        r->n = SAMPLES / 2;
        r->interval_us *= 2;
    }
    /* the count first: a packet counted is out by the time the clock is read */
    const uint64_t tokens = sf_graph_tokens_out(r->graph);
    r->s[r->n++] = (sample){sf_monotonic_seconds(), tokens};
}

static void *sampler(void *arg)
{
    steady_rate *r = arg;
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        take(r);
        const struct timespec pause = {0, r->interval_us * 1000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

steady_rate *steady_rate_start(const sf_graph *g)
{
    steady_rate *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->graph = g;
    r->interval_us = 1000;
    if (pthread_create(&r->thread, NULL, sampler, r) != 0) {
        free(r);
        return NULL;
    }
    return r;
}

/* the first sample whose count reached `at` */
static const sample *reached(const steady_rate *r, uint64_t at)
{
    for (int i = 0; i < r->n; i++)
        if (r->s[i].tokens >= at) return &r->s[i];
    return NULL;
}

double steady_rate_stop(steady_rate *r)
{
    if (!r) return 0;
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    pthread_join(r->thread, NULL);
    take(r); /* the final count */
    const uint64_t total = r->s[r->n - 1].tokens;
    const sample *a = reached(r, total / 4 > 0 ? total / 4 : 1), *b = reached(r, total - total / 4);
    double rate = 0;
    if (a && b && b->tokens > a->tokens && b->t > a->t) rate = (double)(b->tokens - a->tokens) / (b->t - a->t);
    free(r);
    return rate;
}
