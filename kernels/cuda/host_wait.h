/* The host side of a wait for another rank or the device: a monotonic clock in milliseconds and
 * a short sleep, for the polling loops of the communicators (comm_nccl.cu, comm_exchange.cu). */
#ifndef SEQFLOW_KERNELS_CUDA_HOST_WAIT_H
#define SEQFLOW_KERNELS_CUDA_HOST_WAIT_H

#include <time.h>

static inline double sf_host_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static inline void sf_host_pause_us(long us)
{
    struct timespec t = {0, us * 1000};
    nanosleep(&t, NULL);
}

#endif
