/* Quantizers of compress/: round trips within the documented bounds for every kind, the
 * NaN/Inf policy, size validation, and error feedback keeping a long stream's running sum
 * within one message's rounding of the exact sum (SPEC 7). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/quantize.h"
#include "seqflow/error.h"
#include "support/check.h"

static const char *const kind_names[] = {"f32", "bf16", "int8", "int4", "fp8"};

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 round-to-nearest-even computed in double from the definition (8 significant bits,
 * subnormal step 2^-133), independent of the bit trick in quantize.c. */
static float ref_bf16(float x)
{
    if (isnan(x) || isinf(x)) return x;
    double a = fabs((double)x);
    double ulp = a >= 0x1p-126 ? ldexp(1.0, ilogb(a) - 7) : 0x1p-133;
    float r = (float)(nearbyint(a / ulp) * ulp); /* 2^128 becomes Inf, as RNE overflow does */
    return (float)copysign((double)r, (double)x);
}

/* One round trip; every element must be within the bound the API reports for its own group
 * (per element for f32/bf16), f32 bit-exact, bf16 equal to ref_bf16. Returns 1 if all held. */
static int round_trip(sf_quant_kind kind, int group, const float *x, size_t n, const char *what)
{
    sf_quant_params p = {kind, group};
    size_t need = sf_quant_encoded_size(&p, n);
    uint8_t *buf = malloc(need ? need : 1), *buf2 = malloc(need ? need : 1);
    float *y = malloc((n ? n : 1) * sizeof *y);
    int ok = 1;
    int rc = sf_quantize(&p, x, n, buf, need);
    int rc2 = sf_quantize(&p, x, n, buf2, need);
    if (rc || rc2 || (need && memcmp(buf, buf2, need))) ok = 0;
    if (!rc && sf_dequantize(&p, buf, need, y, n)) ok = 0;
    if (!ok) {
        CHECKF(0, "%s %s group %d n %zu: rc %d (%s)", kind_names[kind], what, group, n, rc, sf_last_error());
        goto done;
    }
    double worst = 0.0, global = sf_quant_error_bound(&p, x, n);
    for (size_t i = 0; i < n && ok; i++) {
        double err = fabs((double)y[i] - (double)x[i]), b;
        if (kind == SF_QUANT_F32) {
            if (bits_of(y[i]) != bits_of(x[i])) ok = 0;
            b = 0.0;
        } else if (kind == SF_QUANT_BF16) {
            if (bits_of(y[i]) != bits_of(ref_bf16(x[i]))) ok = 0;
            b = sf_quant_error_bound(&p, x + i, 1);
        } else {
            size_t g0 = i - i % (size_t)group, len = n - g0 < (size_t)group ? n - g0 : (size_t)group;
            b = sf_quant_error_bound(&p, x + g0, len);
        }
        if (!(err <= b) || !(b <= global)) ok = 0;
        if (!ok)
            CHECKF(0, "%s %s group %d n %zu: x[%zu] = %.9g -> %.9g, err %.3g, bound %.3g (max %.3g)",
                   kind_names[kind], what, group, n, i, (double)x[i], (double)y[i], err, b, global);
        if (b > 0 && err / b > worst) worst = err / b;
    }
    if (ok) CHECK(ok);
done:
    free(buf);
    free(buf2);
    free(y);
    return ok;
}

typedef enum { D_NORMAL, D_ZERO, D_CONST, D_NEG_CONST, D_HUGE, D_TINY, D_SUBNORMAL, D_MIXED, D_EXTREME } dataset;
static const char *const dataset_names[] = {"normal", "zeros", "constant", "negative constant", "huge 1e30",
                                            "tiny 1e-30", "float32 subnormal", "mixed magnitudes", "near FLT_MAX"};

static void fill(float *x, size_t n, dataset d, check_rng *rng)
{
    for (size_t i = 0; i < n; i++) {
        double g = check_rng_normal(rng);
        switch (d) {
        case D_NORMAL: x[i] = (float)g; break;
        case D_ZERO: x[i] = (i & 1) ? -0.0f : 0.0f; break;
        case D_CONST: x[i] = 3.25f; break;
        case D_NEG_CONST: x[i] = -1e-3f; break;
        case D_HUGE: x[i] = (float)(g * 1e30); break;
        case D_TINY: x[i] = (float)(g * 1e-30); break;
        case D_SUBNORMAL: x[i] = (float)(g * 1e-42); break;
        case D_MIXED: x[i] = (float)(g * pow(10.0, 40.0 * check_rng_uniform(rng) - 20.0)); break;
        case D_EXTREME: x[i] = (i % 3 == 0) ? ((i & 1) ? -FLT_MAX : FLT_MAX) : (float)(g * 1e38); break;
        }
    }
}

static void test_round_trips(void)
{
    static const size_t ns[] = {0, 1, 2, 3, 15, 63, 64, 65, 999, 1000};
    static const int g_int8[] = {1, 7, 64, 1000}, g_int4[] = {2, 16, 64, 1000}, g_fp8[] = {1, 64, 333};
    check_rng rng = {42};
    float *x = malloc(1000 * sizeof *x);
    int failures = 0, trips = 0;
    for (int d = D_NORMAL; d <= D_EXTREME; d++) {
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            size_t n = ns[k];
            fill(x, n, (dataset)d, &rng);
            for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++) {
                const int *gs = kind == SF_QUANT_INT8 ? g_int8 : kind == SF_QUANT_INT4 ? g_int4 : g_fp8;
                size_t ng = kind == SF_QUANT_INT8 ? 4 : kind == SF_QUANT_INT4 ? 4 : kind == SF_QUANT_FP8_E4M3 ? 3 : 1;
                for (size_t gi = 0; gi < ng; gi++) {
                    int group = kind <= SF_QUANT_BF16 ? 1 : gs[gi];
                    /* bf16 of FLT_MAX is Inf by IEEE rounding: checked separately below */
                    if (kind == SF_QUANT_BF16 && d == D_EXTREME) continue;
                    trips++;
                    failures += !round_trip((sf_quant_kind)kind, group, x, n, dataset_names[d]);
                }
            }
        }
    }
    printf("round trips: %d, failed %d\n", trips, failures);

    /* Sizes and the little-endian layout. */
    sf_quant_params p8 = {SF_QUANT_INT8, 64}, p4 = {SF_QUANT_INT4, 16}, pf = {SF_QUANT_FP8_E4M3, 64},
                    pb = {SF_QUANT_BF16, 1}, p32 = {SF_QUANT_F32, 1};
    CHECK(sf_quant_encoded_size(&p8, 65) == 65 + 8);
    CHECK(sf_quant_encoded_size(&p4, 33) == 17 + 12);
    CHECK(sf_quant_encoded_size(&pf, 64) == 64 + 4);
    CHECK(sf_quant_encoded_size(&pb, 5) == 10);
    CHECK(sf_quant_encoded_size(&p32, 5) == 20);
    CHECK(sf_quant_encoded_size(&p8, SIZE_MAX) == 0);
    float one = 1.0f, v8[2] = {-127.0f, 63.5f}, v4[2] = {-7.0f, 3.5f};
    uint8_t b[16];
    CHECK_OK(sf_quantize(&p32, &one, 1, b, 4));
    CHECK(b[0] == 0 && b[1] == 0 && b[2] == 0x80 && b[3] == 0x3F);
    CHECK_OK(sf_quantize(&p8, v8, 2, b, 6)); /* scale 1.0f first, then -127 and 63.5 -> 64 (ties even) */
    CHECK(b[0] == 0 && b[1] == 0 && b[2] == 0x80 && b[3] == 0x3F);
    CHECK((int8_t)b[4] == -127 && (int8_t)b[5] == 64);
    CHECK_OK(sf_quantize(&p4, v4, 2, b, 5)); /* -7 in the low nibble, 3.5 -> 4 in the high one */
    CHECK(b[4] == (0x9 | 0x4 << 4));
    float e4[3] = {448.0f, -0.001953125f, 1.0f}; /* max, -(smallest subnormal), 1 = 0x38 */
    sf_quant_params pf3 = {SF_QUANT_FP8_E4M3, 3};
    CHECK_OK(sf_quantize(&pf3, e4, 3, b, 7));
    CHECK(b[4] == 0x7E && b[5] == 0x81 && b[6] == 0x38);

    /* bf16 overflow: a finite value above the largest bf16 rounds to Inf and the bound says so. */
    float big[2] = {FLT_MAX, -3.3962e38f}, bigy[2];
    CHECK_OK(sf_quantize(&pb, big, 2, b, 4));
    CHECK_OK(sf_dequantize(&pb, b, 4, bigy, 2));
    CHECK(isinf(bigy[0]) && bigy[0] > 0 && isinf(bigy[1]) && bigy[1] < 0);
    CHECK(isinf(sf_quant_error_bound(&pb, big, 2)));
    free(x);
}

static void test_nonfinite(void)
{
    float x[16];
    for (int i = 0; i < 16; i++) x[i] = (float)i - 7.5f;
    const float specials[4] = {NAN, INFINITY, -INFINITY, from_bits(0x7F800001u) /* signalling NaN */};
    for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++) {
        sf_quant_params p = {(sf_quant_kind)kind, 4};
        size_t need = sf_quant_encoded_size(&p, 16);
        uint8_t buf[64];
        float y[16];
        for (int s = 0; s < 4; s++) {
            float z[16];
            memcpy(z, x, sizeof z);
            z[9] = specials[s];
            int rc = sf_quantize(&p, z, 16, buf, need);
            if (kind == SF_QUANT_F32 || kind == SF_QUANT_BF16) {
                CHECK_OK(rc);
                CHECK_OK(sf_dequantize(&p, buf, need, y, 16));
                if (kind == SF_QUANT_F32)
                    CHECKF(bits_of(y[9]) == bits_of(z[9]), "%s special %d", kind_names[kind], s);
                else if (isnan(z[9]))
                    CHECKF(isnan(y[9]), "bf16 NaN %d kept a NaN", s);
                else
                    CHECKF(y[9] == z[9], "bf16 Inf kept");
                CHECK(y[3] == z[3]);
                CHECKF(isfinite(sf_quant_error_bound(&p, z, 16)), "%s bound ignores non-finite", kind_names[kind]);
            } else {
                CHECKF(rc == SF_E_INVAL, "%s special %d: rc %d", kind_names[kind], s, rc);
                CHECKF(strstr(sf_last_error(), "index 9") != NULL, "%s: message '%s'", kind_names[kind], sf_last_error());
                CHECK(isnan(sf_quant_error_bound(&p, z, 16)));
            }
            /* Feedback refuses non-finite values for every kind and leaves its residual alone. */
            sf_quant_feedback f;
            CHECK_OK(sf_quant_feedback_init(&f, 16));
            CHECK_OK(sf_quantize_with_feedback(&p, &f, x, 16, buf, need));
            float saved[16];
            memcpy(saved, f.residual, sizeof saved);
            rc = sf_quantize_with_feedback(&p, &f, z, 16, buf, need);
            CHECKF(rc == SF_E_INVAL && strstr(sf_last_error(), "x[9]"), "%s feedback special %d: rc %d '%s'",
                   kind_names[kind], s, rc, sf_last_error());
            CHECK(memcmp(saved, f.residual, sizeof saved) == 0);
            sf_quant_feedback_release(&f);
            sf_quant_feedback_release(&f);
        }
    }
    sf_quant_feedback_release(NULL);
    /* bf16 feedback refuses a value its rounding would send to Inf. */
    sf_quant_params pb = {SF_QUANT_BF16, 1};
    sf_quant_feedback f;
    float big = FLT_MAX;
    uint8_t b2[2];
    CHECK_OK(sf_quant_feedback_init(&f, 1));
    CHECK(sf_quantize_with_feedback(&pb, &f, &big, 1, b2, 2) == SF_E_INVAL);
    sf_quant_feedback_release(&f);
}

static void test_validation(void)
{
    float x[65], y[65];
    for (int i = 0; i < 65; i++) x[i] = (float)i * 0.25f - 8.0f;
    uint8_t buf[512];
    for (int kind = SF_QUANT_F32; kind <= SF_QUANT_FP8_E4M3; kind++) {
        sf_quant_params p = {(sf_quant_kind)kind, 16};
        size_t need = sf_quant_encoded_size(&p, 65);
        CHECK(need > 0 && need <= sizeof buf);
        memset(buf, 0xAB, sizeof buf);
        CHECKF(sf_quantize(&p, x, 65, buf, need - 1) == SF_E_INVAL, "%s short out", kind_names[kind]);
        CHECK(buf[0] == 0xAB && buf[need - 2] == 0xAB);
        CHECK(strlen(sf_last_error()) > 0);
        CHECK_OK(sf_quantize(&p, x, 65, buf, need + 7)); /* a larger out is fine */
        CHECKF(sf_dequantize(&p, buf, need - 1, y, 65) == SF_E_INVAL, "%s short in", kind_names[kind]);
        CHECKF(sf_dequantize(&p, buf, need + 1, y, 65) == SF_E_INVAL, "%s long in", kind_names[kind]);
        CHECK_OK(sf_dequantize(&p, buf, need, y, 65));
        CHECK(sf_quantize(&p, NULL, 65, buf, need) == SF_E_INVAL);
        CHECK(sf_quantize(&p, x, 65, NULL, need) == SF_E_INVAL);
        CHECK_OK(sf_quantize(&p, NULL, 0, NULL, 0));
        CHECK_OK(sf_dequantize(&p, NULL, 0, NULL, 0));
        CHECK(sf_quant_error_bound(&p, x, 0) == 0.0);

        sf_quant_params g0 = {(sf_quant_kind)kind, 0}, gneg = {(sf_quant_kind)kind, -4};
        CHECK(sf_quantize(&g0, x, 65, buf, sizeof buf) == SF_E_INVAL);
        CHECK(sf_dequantize(&g0, buf, need, y, 65) == SF_E_INVAL);
        CHECK(sf_quantize(&gneg, x, 65, buf, sizeof buf) == SF_E_INVAL);
        CHECK(sf_quant_encoded_size(&g0, 65) == 0);
        CHECK(isnan(sf_quant_error_bound(&g0, x, 65)));
        sf_quant_feedback f;
        CHECK_OK(sf_quant_feedback_init(&f, 64));
        CHECK(sf_quantize_with_feedback(&p, &f, x, 65, buf, sizeof buf) == SF_E_INVAL); /* n mismatch */
        CHECK(sf_quantize_with_feedback(&p, &f, x, 64, buf, sf_quant_encoded_size(&p, 64) - 1) == SF_E_INVAL);
        sf_quant_feedback_release(&f);
    }
    sf_quant_params odd = {SF_QUANT_INT4, 3}, bad = {(sf_quant_kind)9, 16};
    CHECK(sf_quantize(&odd, x, 65, buf, sizeof buf) == SF_E_INVAL);
    CHECK(strstr(sf_last_error(), "even") != NULL);
    CHECK(sf_dequantize(&odd, buf, 100, y, 65) == SF_E_INVAL);
    CHECK(sf_quant_encoded_size(&odd, 65) == 0);
    CHECK(sf_quantize(&bad, x, 65, buf, sizeof buf) == SF_E_INVAL);
    CHECK(sf_quantize(NULL, x, 65, buf, sizeof buf) == SF_E_INVAL);
    CHECK(sf_quant_feedback_init(NULL, 4) == SF_E_INVAL);

    /* Corrupt encodings: negative or NaN scale, an fp8 NaN code. */
    sf_quant_params p8 = {SF_QUANT_INT8, 64}, pf = {SF_QUANT_FP8_E4M3, 64};
    size_t need = sf_quant_encoded_size(&p8, 65);
    CHECK_OK(sf_quantize(&p8, x, 65, buf, need));
    buf[7] |= 0x80; /* sign of the second scale */
    CHECK(sf_dequantize(&p8, buf, need, y, 65) == SF_E_INVAL);
    CHECK(strstr(sf_last_error(), "group 1") != NULL);
    buf[7] = 0x7F, buf[6] = 0xC0; /* NaN */
    CHECK(sf_dequantize(&p8, buf, need, y, 65) == SF_E_INVAL);
    CHECK_OK(sf_quantize(&pf, x, 65, buf, need));
    buf[8 + 10] = 0xFF;
    CHECK(sf_dequantize(&pf, buf, need, y, 65) == SF_E_INVAL);
    CHECK(strstr(sf_last_error(), "index 10") != NULL);
}

/* Float32 slack on top of the last message's bound: each message adds one rounding of the new
 * residual, <= 2^-24 |residual| <= 2^-24 bound, unbiased under round-to-nearest-even, so after
 * K = 1e5 messages it is a random walk of typical size sqrt(K) * 2^-24 ~ 2e-5 of the bound
 * (the worst case, all roundings one way, is K * 2^-24 ~ 6e-3). 1e-3 leaves 50x headroom over
 * the typical drift, which the test also prints. The double sums add <= 1e-7 of the bound. */
#define FEEDBACK_SLACK 1e-3

static void test_feedback(sf_quant_kind kind, int group)
{
    enum { N = 64, MESSAGES = 100000 };
    sf_quant_params p = {kind, group};
    size_t need = sf_quant_encoded_size(&p, N);
    uint8_t *buf = malloc(need), *buf2 = malloc(need);
    float x[N], v[N], d[N], d2[N];
    double sx[N] = {0}, sd[N] = {0}, sd2[N] = {0};
    double worst_ratio = 0.0, worst_fb = 0.0, worst_nofb = 0.0, worst_drift = 0.0;
    long violations = 0;
    check_rng rng = {1000u + (unsigned)kind};
    sf_quant_feedback f;
    CHECK_OK(sf_quant_feedback_init(&f, N));
    int rc = SF_OK;
    for (long m = 0; m < MESSAGES && rc == SF_OK; m++) {
        for (int i = 0; i < N; i++) {
            x[i] = (float)check_rng_normal(&rng);
            v[i] = x[i] + f.residual[i]; /* what the quantizer sees, same float32 add */
        }
        double bound = sf_quant_error_bound(&p, v, N);
        rc = sf_quantize_with_feedback(&p, &f, x, N, buf, need);
        if (!rc) rc = sf_dequantize(&p, buf, need, d, N);
        if (!rc) rc = sf_quantize(&p, x, N, buf2, need);
        if (!rc) rc = sf_dequantize(&p, buf2, need, d2, N);
        for (int i = 0; i < N && !rc; i++) {
            sx[i] += x[i];
            sd[i] += d[i];
            sd2[i] += d2[i];
            double err = fabs(sd[i] - sx[i]), drift = fabs(sd[i] - sx[i] + f.residual[i]);
            if (err > bound * (1.0 + FEEDBACK_SLACK)) violations++;
            if (err / bound > worst_ratio) worst_ratio = err / bound;
            if (drift / bound > worst_drift) worst_drift = drift / bound;
            if (err > worst_fb) worst_fb = err;
            if (fabs(sd2[i] - sx[i]) > worst_nofb) worst_nofb = fabs(sd2[i] - sx[i]);
        }
    }
    CHECKF(rc == SF_OK, "%s feedback: rc %d (%s)", kind_names[kind], rc, sf_last_error());
    CHECKF(violations == 0, "%s group %d: %ld element-messages beyond bound*(1+%g), worst err/bound %.6f",
           kind_names[kind], group, violations, FEEDBACK_SLACK, worst_ratio);
    CHECK(worst_nofb > worst_fb);
    printf("feedback %-4s group %2d: %d messages x %d: max |sum err| %.3e (max err/last bound %.6f, "
           "float32 drift <= %.2e of bound); without feedback max |sum err| %.3e\n",
           kind_names[kind], group, MESSAGES, N, worst_fb, worst_ratio, worst_drift, worst_nofb);
    sf_quant_feedback_release(&f);
    free(buf);
    free(buf2);
}

int main(void)
{
    test_round_trips();
    test_nonfinite();
    test_validation();
    test_feedback(SF_QUANT_INT8, 64);
    test_feedback(SF_QUANT_INT4, 16);
    test_feedback(SF_QUANT_FP8_E4M3, 64);
    return check_finish("test_quantize");
}
