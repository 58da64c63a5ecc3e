/* The host side of a wait for another rank or the device: a monotonic clock in milliseconds and
 * a short sleep, for the polling loops of the communicators (comm_nccl.cu, comm_exchange.cu). */
#ifndef SEQFLOW_KERNELS_CUDA_HOST_WAIT_H
#define SEQFLOW_KERNELS_CUDA_HOST_WAIT_H

#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static inline double sf_host_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Sleeps about `us` microseconds. Linux lets a sleep end late by the thread's timer slack (50 us
 * by default): a wait polling every 20 us would then see the device's or a peer's event up to
 * 70 us after it came, and the device idles that long at every segment's end (the ranks wait
 * for their segment there). So the slack is 1 us for the sleep, then put back as it was. */
static inline void sf_host_pause_us(long us)
{
    struct timespec t = {0, us * 1000};
#ifdef __linux__
    const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    nanosleep(&t, NULL);
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
#else
    nanosleep(&t, NULL);
#endif
}

#endif
