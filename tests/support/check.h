/* A small test harness shared by every test program: CHECK records a failure with its
 * location and goes on (from any thread); a program ends with check_finish(), which prints the
 * counts and returns the exit status ctest reads (77 = skipped). */
#ifndef SEQFLOW_TEST_CHECK_H
#define SEQFLOW_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

void check_report(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

#define CHECK(cond) check_report(!!(cond), __FILE__, __LINE__, #cond, NULL)
#define CHECKF(cond, ...) check_report(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
#define CHECK_OK(expr)                                                                          \
    do {                                                                                        \
        int check_rc_ = (expr);                                                                 \
        check_report(check_rc_ == 0, __FILE__, __LINE__, #expr, "returned %d (%s)", check_rc_, \
                     sf_last_error());                                                          \
    } while (0)

/* Prints "<name>: N passed, N failed" and returns the process exit status. */
int check_finish(const char *name);
/* Prints "skipped: <why>" and returns 77 (ctest's SKIP_RETURN_CODE). */
int check_skip(const char *why);

/* Deterministic random numbers for tests. */
typedef struct check_rng { uint64_t s; } check_rng;
uint64_t check_rng_next(check_rng *r);
double check_rng_uniform(check_rng *r); /* [0, 1) */
double check_rng_normal(check_rng *r);
/* x[i] = scale * a standard normal draw, for i < n. */
void check_fill_normal(check_rng *r, float *x, size_t n, double scale);

/* bfloat16: the bits of x rounded to nearest even (a NaN stays a NaN), as the GPU and the
 * library round; and a bf16's value widened exactly. */
uint16_t check_bf16_bits(float x);
float check_bf16_float(uint16_t b);

/* ||a - b||_2 / max(||b||_2, tiny) over n values. */
double check_rel_err_f32_f64(const float *a, const double *b, size_t n);
double check_rel_err_f32(const float *a, const float *b, size_t n);

/* A fresh path under the test temporary folder ($SEQFLOW_TEST_TMP or /tmp). Static buffer
 * rotated over 8 slots. */
const char *check_tmp_path(const char *name);

/* Resident set size of this process in bytes (from /proc/self/statm). */
size_t check_rss_bytes(void);

/* A TCP port on 127.0.0.1 free at the time of the call (the kernel's pick), -1 on failure. */
int check_free_port(void);

#endif
