/* expf that the compiler can vectorize (glibc's expf is a library call it will not): Cody-Waite
 * range reduction x = k ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r. Relative
 * error below 2e-7 on [-87, 88]; returns 0 below -87 (so exp(-inf) = 0, as softmax needs). */
#ifndef SEQFLOW_KERNELS_CPU_FAST_EXP_H
#define SEQFLOW_KERNELS_CPU_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float sf_fast_expf(float x)
{
    const float lo = -87.0f, hi = 88.0f;
    float clamped = x < lo ? lo : (x > hi ? hi : x);
    float kf = __builtin_roundf(clamped * 1.44269504088896341f);
    float r = clamped - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (4.16666716e-2f + r * (8.33307914e-3f + r * 1.38896e-3f)))));
    int32_t bits = ((int32_t)kf + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x < lo ? 0.0f : y;
}

#endif
