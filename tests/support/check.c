#include "support/check.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/process_stats.h"
#include "seqflow/error.h"

/* Atomic: tests that run ranks as threads check from several threads at once, and a failure
 * counted by a plain increment could be lost in a race. */
static atomic_int check_failures;
static atomic_int check_passes;

void check_report(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
{
    if (ok) {
        atomic_fetch_add(&check_passes, 1);
        return;
    }
    atomic_fetch_add(&check_failures, 1);
    fprintf(stderr, "FAIL %s:%d: %s", file, line, expr);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
}

int check_finish(const char *name)
{
    const int passes = atomic_load(&check_passes), failures = atomic_load(&check_failures);
    printf("%s: %d passed, %d failed\n", name, passes, failures);
    return failures ? 1 : 0;
}

int check_skip(const char *why)
{
    printf("skipped: %s\n", why);
    return 77;
}

uint64_t check_rng_next(check_rng *r)
{
    /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double check_rng_uniform(check_rng *r) { return (double)(check_rng_next(r) >> 11) * 0x1.0p-53; }

double check_rng_normal(check_rng *r)
{
    double u1 = check_rng_uniform(r), u2 = check_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void check_fill_normal(check_rng *r, float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(check_rng_normal(r) * scale);
}

uint16_t check_bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float check_bf16_float(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

double check_rel_err_f32_f64(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-150);
}

double check_rel_err_f32(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-150);
}

const char *check_tmp_path(const char *name)
{
    static char slots[8][512];
    static int next;
    const char *dir = getenv("SEQFLOW_TEST_TMP");
    if (!dir || !*dir) dir = "/tmp";
    char *p = slots[next++ & 7];
    snprintf(p, sizeof slots[0], "%s/%d-%s", dir, (int)getpid(), name);
    return p;
}

size_t check_rss_bytes(void) { return sf_resident_bytes(); }

int check_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}
