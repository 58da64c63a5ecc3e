#include "tools/steady_rate.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "core/process_stats.h"

#define SAMPLES                                                                                                        \
    4096 /* kept; when full, every other one goes and the interval doubles (past a                                     \
            second after about 35 minutes) */

typedef struct sample {
    double t;
    uint64_t tokens;
} sample;

struct steady_rate {
    const sf_graph *graph;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on CLOCK_MONOTONIC: stop wakes the sampler at once */
    int stop;            /* under lock */
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
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        take(r);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        long long ns = until.tv_nsec + (long long)r->interval_us * 1000;
        until.tv_sec += (time_t)(ns / 1000000000), until.tv_nsec = (long)(ns % 1000000000);
        while (!r->stop && pthread_cond_timedwait(&r->wake, &r->lock, &until) == 0) {
        }
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

steady_rate *steady_rate_start(const sf_graph *g)
{
    steady_rate *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->graph = g;
    r->interval_us = 1000;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&r->lock, NULL);
    if (pthread_create(&r->thread, NULL, sampler, r) != 0) {
        pthread_cond_destroy(&r->wake);
        pthread_mutex_destroy(&r->lock);
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
    pthread_mutex_lock(&r->lock);
    r->stop = 1;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    take(r); /* the final count */
    const uint64_t total = r->s[r->n - 1].tokens;
    const sample *a = reached(r, total / 4 > 0 ? total / 4 : 1), *b = reached(r, total - total / 4);
    double rate = 0;
    if (a && b && b->tokens > a->tokens && b->t > a->t) rate = (double)(b->tokens - a->tokens) / (b->t - a->t);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return rate;
}
